//! Language zygotes, kept by gaffer's zygote: for each `start = "fork"` exec queue, the
//! queue's `command` started once as a zygote of its own language (README, "Handlers":
//! the fork protocol), which loads the handler's code and data once and forks each slot's
//! child from that, copy-on-write.
//!
//! Runs inside gaffer's zygote (single-threaded, no runtime): everything here is
//! non-blocking descriptors polled by the zygote's one loop. A slot asks on its fork line
//! ([`crate::host::fork`]); the request is relayed to its queue's language zygote, whose
//! answer goes back on the line. A language zygote that dies is started again (its
//! forked children run on: they are the slots'); one that cannot start answers its slots'
//! requests with why, its log's last lines included, so they fail and their master backs
//! off as for any crashing slot, each new slot starting it again once the pause since
//! its last failure has passed: no spin, and a fixed handler is picked up.
//!
//! The mechanics: a language zygote is started (as the queue's `user`, with PDEATHSIG and
//! `GAFFER_START=fork`) after the Rust handlers' preload, and waited for ([`READY_WAIT`])
//! before gaffer's zygote says it is ready; one not ready by then is killed later and
//! counts as a failed start. Requests are written as its pipe takes them (non-blocking,
//! polled for POLLOUT); its stderr is logged and kept as a tail. One that ends after it was
//! ready is started again, at once if it had lived `STEADY`, else after a growing pause.
//! One that fails to start answers every request with why (its stderr's tail), logged once
//! per distinct reason. The source files its ready line names go into the zygote's `Ready`
//! (`watch`), or a `Watch` when it is started again. Lines are read with the zygote's
//! `Input`.
//!
//! Its children are its slots' (ARCHITECTURE.md, invariant 40): a language zygote never
//! waits for, signals or outlives-by-design its children (SIGCHLD ignored, so the kernel
//! reaps them). A request whose slot died before it was answered is dropped, or its child
//! killed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{ErrorKind, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde::Deserialize;

use super::zygote::Input;
use crate::backoff::Backoff;
use crate::config::{Config, Handler as HandlerConfig, Start};
use crate::host::fork::{
    ForkAnswer, ForkAsk, ForkOutcome, START_ENV, pidfd_ended, pidfd_kill, pidfd_open,
    set_nonblocking,
};

/// How many of a language zygote's last stderr lines a failed start reports.
const TAIL_LINES: usize = 12;

/// Longest wait at the zygote's start for its language zygotes' readiness, before it says
/// it is ready anyway (slots of a queue whose language zygote is not ready yet wait).
pub(super) const READY_WAIT: Duration = Duration::from_secs(120);

/// How long a ready language zygote must have lived for its end to be started again at
/// once; one that ends sooner failed, and is waited out.
const STEADY: Duration = Duration::from_secs(10);

/// Pauses between starts of a language zygote that keeps failing.
const RESTART: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));

/// Every language zygote of gaffer's zygote, and its slots' fork lines.
#[derive(Default)]
pub(super) struct Languages {
    by_queue: BTreeMap<String, Language>,
    lines: BTreeMap<u32, SlotLine>,
}

/// One queue's language zygote.
struct Language {
    queue: String,
    command: Vec<String>,
    user: Option<String>,
    /// The queue's `cpu_scheduling`, which its children inherit from it.
    cpu_scheduling: crate::config::CpuScheduling,
    running: Option<Running>,
    /// Why the last start failed, while it stands (until the next start).
    failed: Option<String>,
    /// The last failure logged: the same again is not logged again.
    said: Option<String>,
    /// No start before this, after a failure.
    not_before: Option<Instant>,
    /// When to start it again after a ready one ended (requests wait for it meanwhile).
    restart_at: Option<Instant>,
    restart: Backoff,
    /// Requests waiting for it to be ready: (slot, seq, request).
    waiting: VecDeque<(u32, ForkAsk)>,
    /// Requests sent to it, by id: (slot, seq).
    sent: BTreeMap<u64, (u32, u64)>,
    /// The id of the last request sent to it (ids are its own: one per language zygote).
    next_id: u64,
    /// The source files its ready line named.
    watched: Vec<PathBuf>,
    /// It became ready since the master was last told the files to watch.
    ready_news: bool,
}

/// A started language zygote.
struct Running {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: ChildStderr,
    out: Input,
    err: Input,
    tail: VecDeque<String>,
    ready: bool,
    started: Instant,
    /// Killed for not being ready within [`READY_WAIT`].
    killed_unready: bool,
    /// Requests not yet taken by its stdin's pipe.
    to_write: Vec<u8>,
}

impl Running {
    /// Writes what its stdin's pipe takes now (non-blocking); a broken pipe drops the
    /// rest: its end, reaped soon, fails the requests sent.
    fn write_queued(&mut self) {
        while !self.to_write.is_empty() {
            match self.stdin.write(&self.to_write) {
                Ok(n) => {
                    self.to_write.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.to_write.clear();
                    return;
                }
            }
        }
    }
}

/// A slot's fork line, as gaffer's zygote holds it.
struct SlotLine {
    queue: String,
    stream: UnixStream,
    buf: Input,
    /// The child last forked for it: its pid and a pidfd (to end it with its slot).
    child: Option<(u32, OwnedFd)>,
}

/// What a language zygote writes on its stdout.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Said {
    Ready {
        #[serde(default)]
        files: Vec<PathBuf>,
    },
    Forked {
        id: u64,
        pid: u32,
    },
    Failed {
        id: Option<u64>,
        error: String,
    },
}

impl Languages {
    /// Starts the language zygote of each of `queues` configured `start = "fork"`, and
    /// waits [`READY_WAIT`] at most for them to be ready or to fail.
    pub(super) fn start(cfg: &Config, queues: &[String]) -> Languages {
        let mut me = Languages::default();
        for name in queues {
            let Some(q) = cfg.queues.get(name) else {
                continue;
            };
            if let HandlerConfig::Exec {
                command,
                start: Start::Fork,
            } = &q.handler
            {
                let mut language = Language {
                    queue: name.clone(),
                    command: command.clone(),
                    user: q.user.clone(),
                    cpu_scheduling: q.cpu_scheduling,
                    running: None,
                    failed: None,
                    said: None,
                    not_before: None,
                    restart_at: None,
                    restart: RESTART,
                    waiting: VecDeque::new(),
                    sent: BTreeMap::new(),
                    next_id: 0,
                    watched: Vec::new(),
                    ready_news: false,
                };
                language.launch();
                me.by_queue.insert(name.clone(), language);
            }
        }
        me.await_ready();
        // (what they loaded goes into the zygote's own `Ready`)
        me.take_ready_news();
        me
    }

    /// Whether a language zygote became ready (started again) since the last call: the
    /// master must be told the files to watch anew.
    pub(super) fn take_ready_news(&mut self) -> bool {
        let mut any = false;
        for language in self.by_queue.values_mut() {
            any |= std::mem::take(&mut language.ready_news);
        }
        any
    }

    /// Polls until every language zygote is ready or failed, [`READY_WAIT`] at most.
    fn await_ready(&mut self) {
        let deadline = Instant::now() + READY_WAIT;
        while Instant::now() < deadline
            && self
                .by_queue
                .values()
                .any(|l| l.running.as_ref().is_some_and(|r| !r.ready))
        {
            let mut fds: Vec<libc::pollfd> = self.poll_fds();
            // SAFETY: a plain poll(2) over descriptors this process holds open.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
            fds.clear();
            self.after_poll();
            self.reap_own();
        }
    }

    /// Whether `queue` is one whose slots fork from a language zygote.
    pub(super) fn has(&self, queue: &str) -> bool {
        self.by_queue.contains_key(queue)
    }

    /// The source files the language zygotes loaded, to be watched for changes.
    pub(super) fn watched(&self) -> Vec<PathBuf> {
        self.by_queue
            .values()
            .flat_map(|l| l.watched.iter().cloned())
            .collect()
    }

    /// A new slot of `queue`, forked just now: its fork line's other end.
    pub(super) fn add_line(&mut self, slot: u32, queue: &str, ours: UnixStream) {
        if let Err(e) = ours.set_nonblocking(true) {
            tracing::warn!(slot, error = %e, "cannot make a fork line non-blocking");
        }
        self.lines.insert(
            slot,
            SlotLine {
                queue: queue.to_string(),
                stream: ours,
                buf: Input::default(),
                child: None,
            },
        );
    }

    /// A slot ended: its child ends with it (the slot may have been killed outright, and
    /// nobody else would end its child), and its line closes.
    pub(super) fn slot_ended(&mut self, slot: u32) {
        // (a request it made is not relayed any more: its child would wait for a reader
        // of its FIFOs forever)
        for language in self.by_queue.values_mut() {
            language.waiting.retain(|(s, _)| *s != slot);
        }
        let Some(line) = self.lines.remove(&slot) else {
            return;
        };
        if let Some((pid, pidfd)) = line.child
            && alive(&pidfd)
        {
            tracing::info!(slot, pid, queue = %line.queue, "ending the forked child of an ended slot");
            pidfd_kill(pid, pidfd.as_fd(), Signal::SIGKILL);
        }
    }

    /// The forked children of live slots: processes gaffer's zygote may have adopted (their
    /// language zygote died) that are not a dead slot's leftovers.
    pub(super) fn live_children(&self) -> BTreeSet<i32> {
        self.lines
            .values()
            .filter_map(|l| l.child.as_ref())
            .map(|(pid, _)| *pid as i32)
            .collect()
    }

    /// The descriptors a forked slot must close: everything here but its own line.
    pub(super) fn fds_for_child_to_close(&self, keep: Option<RawFd>) -> Vec<RawFd> {
        let mut fds = Vec::new();
        for l in self.by_queue.values() {
            if let Some(r) = &l.running {
                fds.extend([
                    r.stdin.as_raw_fd(),
                    r.stdout.as_raw_fd(),
                    r.stderr.as_raw_fd(),
                ]);
            }
        }
        for line in self.lines.values() {
            fds.push(line.stream.as_raw_fd());
            if let Some((_, pidfd)) = &line.child {
                fds.push(pidfd.as_raw_fd());
            }
        }
        fds.retain(|&fd| Some(fd) != keep);
        fds
    }

    /// Descriptors to poll: each language zygote's stdout and stderr, each fork line.
    pub(super) fn poll_fds(&self) -> Vec<libc::pollfd> {
        let pollfd = |fd: RawFd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds = Vec::new();
        for l in self.by_queue.values() {
            if let Some(r) = &l.running {
                fds.push(pollfd(r.stdout.as_raw_fd()));
                if !r.to_write.is_empty() {
                    fds.push(libc::pollfd {
                        fd: r.stdin.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    });
                }
                fds.push(pollfd(r.stderr.as_raw_fd()));
            }
        }
        fds.extend(self.lines.values().map(|l| pollfd(l.stream.as_raw_fd())));
        fds
    }

    /// How long the zygote's loop may sleep: until the next due restart or readiness
    /// deadline, if any.
    pub(super) fn timeout(&self) -> Option<Duration> {
        let now = Instant::now();
        let restarts = self
            .by_queue
            .values()
            .filter(|l| l.running.is_none())
            .filter_map(|l| l.restart_at);
        let deadlines = self
            .by_queue
            .values()
            .filter_map(|l| l.running.as_ref())
            .filter(|r| !r.ready && !r.killed_unready)
            .map(|r| r.started + READY_WAIT);
        restarts
            .chain(deadlines)
            .map(|t| t.saturating_duration_since(now))
            .min()
    }

    /// Reads whatever is there (all descriptors are non-blocking) and acts on it.
    pub(super) fn after_poll(&mut self) {
        for language in self.by_queue.values_mut() {
            if let Some(r) = &mut language.running {
                r.write_queued();
            }
            language.read_stderr();
            for said in language.read_stdout() {
                language.heard(said, &mut self.lines);
            }
        }
        let slots: Vec<u32> = self.lines.keys().copied().collect();
        for slot in slots {
            self.read_line(slot);
        }
        for language in self.by_queue.values_mut() {
            if let Some(r) = &mut language.running {
                // One that hangs in its import would hold its slots' requests for ever.
                if !r.ready && !r.killed_unready && r.started.elapsed() >= READY_WAIT {
                    r.killed_unready = true;
                    let _ = r.child.kill();
                }
                continue;
            }
            if language.restart_at.is_some_and(|t| Instant::now() >= t) {
                language.launch();
            } else if !language.waiting.is_empty() {
                language.launch_if_due(&mut self.lines);
            }
        }
    }

    /// A child of gaffer's zygote exited: a language zygote's end is handled here (true);
    /// anything else is not one of ours (false).
    pub(super) fn exited(&mut self, pid: i32, status: &str) -> bool {
        let Some(language) = self.by_queue.values_mut().find(|l| {
            l.running
                .as_ref()
                .is_some_and(|r| r.child.id() as i32 == pid)
        }) else {
            return false;
        };
        language.ended(status, &mut self.lines);
        true
    }

    /// Reaps language zygotes while the zygote waits for them at its start (its own reap
    /// loop runs only once it serves).
    fn reap_own(&mut self) {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        let pids: Vec<i32> = self
            .by_queue
            .values()
            .filter_map(|l| l.running.as_ref().map(|r| r.child.id() as i32))
            .collect();
        for pid in pids {
            let status = match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => format!("exit code {code}"),
                Ok(WaitStatus::Signaled(_, sig, _)) => format!("signal {sig}"),
                _ => continue,
            };
            self.exited(pid, &status);
        }
    }

    /// Reads a slot's fork line: a request is relayed (or answered at once when its
    /// language zygote cannot serve); the line's end is the slot's (its exit is reaped
    /// elsewhere).
    fn read_line(&mut self, slot: u32) {
        let Some(line) = self.lines.get_mut(&slot) else {
            return;
        };
        if !line.buf.fill_available(line.stream.as_fd()) {
            return;
        }
        let queue = line.queue.clone();
        while let Some(text) = line.buf.next_line() {
            let ask: ForkAsk = match serde_json::from_slice(&text) {
                Ok(ask) => ask,
                Err(e) => {
                    tracing::warn!(slot, error = %e, "an unreadable fork request");
                    continue;
                }
            };
            let Some(language) = self.by_queue.get_mut(&queue) else {
                answer(
                    line,
                    ask.seq,
                    ForkOutcome::Failed("no language zygote for this queue".into()),
                );
                continue;
            };
            language.waiting.push_back((slot, ask));
        }
        if let Some(language) = self.by_queue.get_mut(&queue) {
            language.relay(&mut self.lines);
        }
    }

    /// Retiring: each language zygote's input ends, and it exits.
    pub(super) fn retire(&mut self) {
        for language in self.by_queue.values_mut() {
            // (its input closes with it; it is reaped with the zygote's other children)
            drop(language.running.take());
        }
    }
}

impl Language {
    /// Starts the command as this queue's language zygote.
    fn launch(&mut self) {
        self.failed = None;
        self.restart_at = None;
        match self.spawn() {
            Ok(running) => {
                tracing::info!(queue = %self.queue, pid = running.child.id(),
                    command = ?self.command, "language zygote started");
                self.running = Some(running);
            }
            Err(e) => self.start_failed(format!("cannot start {:?}: {e}", self.command)),
        }
    }

    fn spawn(&self) -> std::io::Result<Running> {
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| std::io::Error::other("the command is empty"))?;
        let parent = std::process::id();
        let user = match &self.user {
            Some(name) => Some(
                nix::unistd::User::from_name(name)?
                    .ok_or_else(|| std::io::Error::other(format!("no such user {name}")))?,
            ),
            None => None,
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_remove("GAFFER_REDIS")
            .env_remove(super::zygote::REPORT_FD_ENV)
            .env_remove(super::zygote::MASTER_PID_ENV)
            .env(START_ENV, Start::Fork.name())
            .env("GAFFER_QUEUE", &self.queue)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let cpu_scheduling = self.cpu_scheduling;
        // SAFETY: only async-signal-safe calls (setgroups, setgid, setuid, prctl,
        // getppid, sched_setscheduler) between fork and exec; nothing is allocated.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(u) = &user {
                    let groups = [u.gid.as_raw()];
                    if libc::setgroups(1, groups.as_ptr()) == -1
                        || libc::setgid(u.gid.as_raw()) == -1
                        || libc::setuid(u.uid.as_raw()) == -1
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // After the user switch, which clears it: it dies with gaffer's zygote.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                // (what it forks inherits it; a refusal leaves the policy it had)
                let _ = super::sched::set_cpu_scheduling(cpu_scheduling);
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("all three streams are piped");
        };
        for fd in [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()] {
            set_nonblocking(fd, true)?;
        }
        Ok(Running {
            child,
            stdin,
            stdout,
            stderr,
            out: Input::default(),
            err: Input::default(),
            tail: VecDeque::new(),
            ready: false,
            started: Instant::now(),
            killed_unready: false,
            to_write: Vec::new(),
        })
    }

    /// Starts it again if its pause since the last failure is over; else the requests
    /// waiting for it are answered with that failure. A restart already scheduled (a
    /// ready one ended) is waited for instead.
    fn launch_if_due(&mut self, lines: &mut BTreeMap<u32, SlotLine>) {
        if self.restart_at.is_some() {
            return;
        }
        if self.not_before.is_some_and(|t| Instant::now() < t) {
            if let Some(why) = self.failed.clone() {
                self.answer_waiting(lines, &why);
            }
            return;
        }
        self.launch();
    }

    /// Its stderr, logged line by line and kept as the tail a failed start reports.
    fn read_stderr(&mut self) {
        let Some(r) = &mut self.running else { return };
        r.err.fill_available(r.stderr.as_fd());
        while let Some(line) = r.err.next_line() {
            let text = String::from_utf8_lossy(&line).trim_end().to_string();
            tracing::info!(target: "gaffer::exec", queue = %self.queue, zygote = true, "{text}");
            if r.tail.len() == TAIL_LINES {
                r.tail.pop_front();
            }
            r.tail.push_back(text);
        }
    }

    /// Its stdout's complete lines, read.
    fn read_stdout(&mut self) -> Vec<Said> {
        let Some(r) = &mut self.running else {
            return Vec::new();
        };
        r.out.fill_available(r.stdout.as_fd());
        let mut said = Vec::new();
        while let Some(line) = r.out.next_line() {
            match serde_json::from_slice(&line) {
                Ok(s) => said.push(s),
                Err(e) => tracing::warn!(queue = %self.queue, error = %e,
                    line = %String::from_utf8_lossy(&line), "the language zygote said something unreadable"),
            }
        }
        said
    }

    /// Acts on one line of its stdout.
    fn heard(&mut self, said: Said, lines: &mut BTreeMap<u32, SlotLine>) {
        match said {
            Said::Ready { files } => {
                if let Some(r) = &mut self.running {
                    r.ready = true;
                    tracing::info!(queue = %self.queue, pid = r.child.id(),
                        ms = r.started.elapsed().as_millis() as u64, files = files.len(),
                        "language zygote ready");
                }
                self.watched = files;
                // (the restart pause is reset only by a zygote that lived STEADY: one
                // that dies soon after each start is waited out longer and longer)
                self.said = None;
                self.ready_news = true;
                self.relay(lines);
            }
            Said::Forked { id, pid } => {
                let pidfd = pidfd_open(pid);
                match self.sent.remove(&id) {
                    Some((slot, seq)) if lines.contains_key(&slot) => {
                        let line = lines.get_mut(&slot).expect("checked just above");
                        match pidfd {
                            Ok(pidfd) => line.child = Some((pid, pidfd)),
                            Err(e) => tracing::debug!(slot, pid, error = %e,
                                "the forked child ended at once"),
                        }
                        answer(line, seq, ForkOutcome::Forked(pid));
                    }
                    // Its slot is gone (or the answer is not one we asked for): nobody
                    // will ever open its FIFOs' other ends.
                    _ => {
                        if let Ok(pidfd) = pidfd {
                            pidfd_kill(pid, pidfd.as_fd(), Signal::SIGKILL);
                        }
                    }
                }
            }
            Said::Failed { id, error } => {
                if let Some((slot, seq)) = id.and_then(|id| self.sent.remove(&id))
                    && let Some(line) = lines.get_mut(&slot)
                {
                    answer(line, seq, ForkOutcome::Failed(error));
                } else {
                    tracing::warn!(queue = %self.queue, error, "the language zygote refused a request");
                }
            }
        }
    }

    /// Sends the waiting requests to a ready zygote.
    fn relay(&mut self, lines: &mut BTreeMap<u32, SlotLine>) {
        if self.running.is_none() && !self.waiting.is_empty() {
            self.launch_if_due(lines);
        }
        let Some(r) = self.running.as_mut().filter(|r| r.ready) else {
            return;
        };
        while let Some((slot, ask)) = self.waiting.pop_front() {
            if !lines.contains_key(&slot) {
                continue;
            }
            self.next_id += 1;
            let request = serde_json::json!({ "fork": {
                "id": self.next_id,
                "stdin": ask.stdin,
                "stdout": ask.stdout,
                "stderr": ask.stderr,
                "env": ask.env,
            }});
            let mut text = request.to_string().into_bytes();
            text.push(b'\n');
            // (queued, and written as its pipe takes it: a language zygote that stopped
            // reading must not stop gaffer's zygote, which serves every queue)
            r.to_write.extend_from_slice(&text);
            self.sent.insert(self.next_id, (slot, ask.seq));
        }
        r.write_queued();
    }

    /// Its process ended (`status`): before it was ready, a failed start, answered to
    /// every request with its log's tail; after, it is started again at once for the
    /// requests to come (those it had been sent fail: their children may or may not
    /// exist, and a slot asks again).
    fn ended(&mut self, status: &str, lines: &mut BTreeMap<u32, SlotLine>) {
        // (its answers still in the pipe first: a child it forked is its slot's)
        self.read_stderr();
        for said in self.read_stdout() {
            self.heard(said, lines);
        }
        let Some(r) = self.running.take() else { return };
        let mut tail: Vec<String> = r.tail.into_iter().collect();
        tail.extend(
            String::from_utf8_lossy(r.err.rest())
                .lines()
                .map(str::to_string),
        );
        let sent: Vec<(u32, u64)> = std::mem::take(&mut self.sent).into_values().collect();
        for (slot, seq) in sent {
            if let Some(line) = lines.get_mut(&slot) {
                answer(
                    line,
                    seq,
                    ForkOutcome::Failed(format!(
                        "the language zygote ended ({status}) while forking"
                    )),
                );
            }
        }
        if r.ready {
            // Started again soon, whatever happened: the slots' next children come from
            // it. One that lived long gets no pause; one that keeps ending, longer ones.
            if r.started.elapsed() >= STEADY {
                self.restart.reset();
            }
            let pause = self.restart.next();
            tracing::warn!(queue = %self.queue, pid = r.child.id(), status,
                restart_in = %humantime::format_duration(pause),
                "language zygote ended; starting it again (its forked children run on)");
            self.restart_at = Some(Instant::now() + pause);
            return;
        }
        let tail = tail[tail.len().saturating_sub(TAIL_LINES)..].join("\n");
        let when = if r.ready {
            "soon after it was ready".to_string()
        } else if r.killed_unready {
            format!(
                "when it was killed for not being ready within {}",
                humantime::format_duration(READY_WAIT)
            )
        } else {
            "before it was ready".to_string()
        };
        self.start_failed(format!(
            "the handler's zygote {:?} exited ({status}) {when}; its last lines:\n{tail}",
            self.command
        ));
        self.answer_waiting(lines, &self.failed.clone().unwrap_or_default());
    }

    /// A start failed: said once per distinct reason, and waited out before the next.
    fn start_failed(&mut self, why: String) {
        let pause = self.restart.next();
        self.not_before = Some(Instant::now() + pause);
        if self.said.as_deref() != Some(why.as_str()) {
            tracing::error!(queue = %self.queue, error = %why,
                retry_after = %humantime::format_duration(pause), "language zygote failed to start");
        } else {
            tracing::debug!(queue = %self.queue, "language zygote failed to start again the same way");
        }
        self.said = Some(why.clone());
        self.failed = Some(why);
        self.running = None;
    }

    fn answer_waiting(&mut self, lines: &mut BTreeMap<u32, SlotLine>, why: &str) {
        for (slot, ask) in self.waiting.drain(..) {
            if let Some(line) = lines.get_mut(&slot) {
                answer(line, ask.seq, ForkOutcome::Failed(why.to_string()));
            }
        }
    }
}

/// Writes an answer on a slot's line (a slot that is gone has nobody to read it).
fn answer(line: &mut SlotLine, seq: u64, outcome: ForkOutcome) {
    let mut text = serde_json::to_vec(&ForkAnswer { seq, outcome }).unwrap_or_default();
    text.push(b'\n');
    // (the line is non-blocking; an answer of a few bytes fits its buffer, the slot
    // reading one answer per request)
    if let Err(e) = line.stream.write_all(&text)
        && e.kind() != ErrorKind::BrokenPipe
    {
        tracing::debug!(queue = %line.queue, error = %e, "cannot answer a fork request");
    }
}

/// Whether the process a pidfd names still runs.
fn alive(pidfd: &OwnedFd) -> bool {
    !pidfd_ended(pidfd.as_fd(), Some(Duration::ZERO))
}
