//! The exec child's process: started (spawned by the slot, or forked by the queue's
//! language zygote), fed a batch and read, signalled, and ended in order.
//!
//! A spawned child is started from the slot's handler thread (which lives as long as the
//! slot, and PDEATHSIG follows the spawning thread) in a process group of its own, which
//! the slot's cancel and stop signals go to, so what the child started stops with it. It
//! inherits neither `GAFFER_REDIS` nor the slot's report socket (close-on-exec in the
//! slot).
//!
//! A slot that ends in order (stopped, scaled down, recycled) ends its child in order
//! first, through `Handler::close`: end of input, [`EXIT_GRACE`], SIGTERM, 2 s, SIGKILL to
//! its group, waited for before the slot exits (at most the slot's close wait, and not
//! while a batch is still in the handler). A forked slot's handler is then forgotten, not
//! dropped.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::config::{KILL_AFTER_TERM, Start};
use crate::host::fork::START_ENV;
use crate::host::handler::SlotContext;

use super::Exec;
use super::forked::{ForkError, Forked, Streams};
use super::protocol::{ReplyError, ReplyStatus, Request, parse_reply};
use super::stop::{StopLine, StopWriter, watch_stop};

/// Longest stderr line logged as one event; a longer one is logged in pieces.
pub(super) const MAX_LOG_LINE: usize = 64 << 10;

/// How long a child has to exit after its stdin closes at the slot's orderly end, before
/// it gets SIGTERM (then SIGKILL [`KILL_AFTER_TERM`] later).
pub const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Longest wait at the slot's orderly end for its children's stderr to be logged to the
/// end (a process the child left in the background may hold it open).
pub(super) const STDERR_FLUSH: Duration = Duration::from_secs(1);

/// A started child and our ends of its pipes.
#[derive(Debug)]
pub(super) struct Running {
    pub(super) process: Proc,
    pub(super) stdin: File,
    pub(super) stdout: BufReader<File>,
}

/// The child's process: the slot's own (`start = "spawn"`), or forked by the queue's
/// language zygote (`start = "fork"`), which reaps it.
#[derive(Debug)]
pub(super) enum Proc {
    Spawned(Child),
    Forked(Forked),
}

impl Proc {
    pub(super) fn id(&self) -> u32 {
        match self {
            Proc::Spawned(child) => child.id(),
            Proc::Forked(forked) => forked.pid(),
        }
    }

    /// Whether the child ends within `wait` (`Duration::MAX`: until it does); a spawned
    /// one is not reaped, so its pid, and its group's id, stay its own.
    pub(super) fn exited_within(&self, wait: Duration) -> bool {
        match self {
            Proc::Spawned(child) => exited_within(child.id(), wait),
            Proc::Forked(forked) => forked.exited_within(wait),
        }
    }

    /// Its status text if it has ended (a forked child's exit status is its zygote's).
    pub(super) fn ended(&mut self) -> io::Result<Option<String>> {
        match self {
            Proc::Spawned(child) => Ok(child.try_wait()?.map(|s| s.to_string())),
            Proc::Forked(forked) => Ok((!forked.is_alive()).then(|| "ended".to_string())),
        }
    }

    /// Sends `sig` to its process group.
    pub(super) fn signal(&self, sig: Signal) {
        match self {
            Proc::Spawned(child) => signal(child.id(), sig),
            Proc::Forked(forked) => forked.signal(sig),
        }
    }

    /// Sends `sig` to what is left of its group once it has ended (what it started). A
    /// spawned child is not reaped yet, so its group's id is still its own; a forked one's
    /// zygote reaped it, and the id stays the group's only while the group has a member
    /// (the kernel reuses no pid that names a live group), so the signal goes out at once,
    /// leaving only the moment between its last member's end and a new process of that
    /// pid making a group of its own.
    pub(super) fn signal_group_left(&self, sig: Signal) {
        signal(self.id(), sig);
    }

    /// Waits for its end and reaps it if it is the slot's; its status text.
    pub(super) fn reap(&mut self) -> io::Result<String> {
        match self {
            Proc::Spawned(child) => child.wait().map(|s| s.to_string()),
            Proc::Forked(forked) => {
                forked.exited_within(Duration::MAX);
                Ok("ended".to_string())
            }
        }
    }

    /// What a watcher thread holds to signal it while the handler thread reads its reply.
    pub(super) fn signaller(&self) -> io::Result<Signaller> {
        match self {
            Proc::Spawned(child) => Ok(Signaller::Group(child.id())),
            Proc::Forked(forked) => forked.try_clone().map(Signaller::Forked),
        }
    }
}

/// A child's process group, as a thread other than the handler's signals it.
pub(super) enum Signaller {
    /// A spawned child's group, by its id (the child's pid, not reaped meanwhile).
    Group(u32),
    /// A forked child, signalled while it lives.
    Forked(Forked),
}

impl Signaller {
    pub(super) fn pid(&self) -> u32 {
        match self {
            Signaller::Group(pid) => *pid,
            Signaller::Forked(forked) => forked.pid(),
        }
    }

    pub(super) fn signal(&self, sig: Signal) {
        match self {
            Signaller::Group(pid) => signal(*pid, sig),
            Signaller::Forked(forked) => forked.signal(sig),
        }
    }
}

/// Why a batch could not be exchanged with the child: after any of these the child is no
/// longer trusted to be in step and is restarted.
#[derive(Debug, thiserror::Error)]
pub(super) enum ChildError {
    /// The configured command is empty (config validation forbids it; kept for safety).
    #[error("the command is empty")]
    EmptyCommand,
    /// The program could not be started.
    #[error("cannot start {command:?}: {source}")]
    Start {
        /// The command as configured.
        command: Vec<String>,
        /// What the OS said.
        source: io::Error,
    },
    /// The thread that forwards the child's stderr could not be started.
    #[error("cannot start the stderr thread for {pid}: {source}")]
    StderrThread {
        /// The child, killed again.
        pid: u32,
        /// What the OS said.
        source: io::Error,
    },
    /// The request could not be encoded.
    #[error("cannot encode: {0}")]
    Encode(serde_json::Error),
    /// Writing the request failed.
    #[error("cannot write to the child: {0}")]
    Write(io::Error),
    /// Reading the reply failed.
    #[error("cannot read from the child: {0}")]
    Read(io::Error),
    /// Stdout closed before a reply.
    #[error("the child closed its stdout without replying")]
    ClosedBeforeReply,
    /// Stdout closed inside a reply.
    #[error("the child closed its stdout in the middle of a reply")]
    ClosedInReply,
    /// The reply was too long or not a reply.
    #[error(transparent)]
    Reply(#[from] ReplyError),
    /// The child could not be forked (`start = "fork"`).
    #[error(transparent)]
    Fork(#[from] ForkError),
}

impl Exec {
    /// Starts the child: spawned (`start = "spawn"`) or forked by the queue's language
    /// zygote (`start = "fork"`); its stderr forwarded to the slot's log by a thread.
    pub(super) fn spawn(&mut self, ctx: &SlotContext) -> Result<Running, ChildError> {
        let (
            process,
            Streams {
                stdin,
                stdout,
                stderr,
            },
        ) = match self.start {
            Start::Spawn => self.spawn_command(ctx)?,
            Start::Fork => {
                let line = ctx.fork_line.as_deref().ok_or(ForkError::NoLine)?;
                let env = [
                    ("GAFFER_QUEUE", ctx.queue.name.clone()),
                    ("GAFFER_SLOT", ctx.slot.to_string()),
                ];
                let env = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                let (forked, streams) = Forked::start(line, env)?;
                (Proc::Forked(forked), streams)
            }
        };
        let pid = process.id();
        let (queue, slot) = (ctx.queue.name.clone(), ctx.slot);
        // The log the slot's thread writes to, which a thread does not inherit.
        let log = tracing::dispatcher::get_default(|d| d.clone());
        let (read_to_end, open) = mpsc::channel::<()>();
        let forwarder = std::thread::Builder::new()
            .name(format!("exec-stderr-{pid}"))
            .spawn(move || {
                let _read_to_end = read_to_end;
                tracing::dispatcher::with_default(&log, || {
                    forward_stderr(stderr, &queue, slot, pid)
                })
            });
        if let Err(source) = forwarder {
            let mut process = process;
            process.signal(Signal::SIGKILL);
            let _ = process.reap();
            return Err(ChildError::StderrThread { pid, source });
        }
        self.stderr_open
            .retain(|rx| matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)));
        self.stderr_open.push(open);
        if let Proc::Forked(_) = process {
            self.outside = ctx.outside().clone();
            self.outside.set(pid);
        }
        tracing::info!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot, pid,
            command = ?self.command, start = self.start.name(), "exec child started");
        Ok(Running {
            process,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    /// Spawns the command as the slot's own child. It is spawned from the calling
    /// thread, which must be the one the slot keeps for its handler all its life:
    /// PDEATHSIG fires when the spawning *thread* exits, not the process, so a child
    /// started from a short-lived thread would be killed with that thread.
    pub(super) fn spawn_command(&self, ctx: &SlotContext) -> Result<(Proc, Streams), ChildError> {
        let (program, args) = self.command.split_first().ok_or(ChildError::EmptyCommand)?;
        let parent = std::process::id();
        let mut cmd = Command::new(program);
        cmd.args(args)
            // A URL given to gaffer in its environment may hold the Redis password: a
            // handler, which may run as another user, gets none of it.
            .env_remove("GAFFER_REDIS")
            .env(START_ENV, Start::Spawn.name())
            .env("GAFFER_QUEUE", &ctx.queue.name)
            .env("GAFFER_SLOT", ctx.slot.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own, which every signal the slot sends it goes to: a command
            // that starts its worker as a subprocess (`sh -c '…; …'`) has it stopped
            // too, where a signal to the child alone left it running, holding the reply
            // pipe (a cancel that never ended, a long task run twice).
            .process_group(0);
        // SAFETY: prctl and getppid are async-signal-safe and touch no memory of the
        // parent; the errors built here do not allocate.
        unsafe {
            cmd.pre_exec(move || {
                // The child must not outlive a slot killed by the watchdog or the OOM
                // killer, which run no destructors.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                    return Err(io::Error::last_os_error());
                }
                // The slot may have died between fork and prctl: then nothing would ever
                // send the signal.
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut process = cmd.spawn().map_err(|source| ChildError::Start {
            command: self.command.clone(),
            source,
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) else {
            unreachable!("all three streams are piped");
        };
        let file = |fd: std::os::fd::OwnedFd| File::from(fd);
        let streams = Streams {
            stdin: file(stdin.into()),
            stdout: file(stdout.into()),
            stderr: file(stderr.into()),
        };
        Ok((Proc::Spawned(process), streams))
    }

    /// Kills and reaps the child, if any, so that none is left behind as a zombie or an
    /// orphan still holding the slot's resources.
    pub(super) fn stop(&mut self) {
        let Some(mut running) = self.child.take() else {
            return;
        };
        let pid = running.process.id();
        self.outside.set(0);
        running.process.signal(Signal::SIGKILL);
        match running.process.reap() {
            Ok(status) => {
                tracing::debug!(target: "gaffer::exec", pid, %status, "exec child stopped")
            }
            Err(e) => tracing::warn!(target: "gaffer::exec", pid, "cannot reap exec child: {e}"),
        }
    }

    /// The running child, started anew if there is none or the last one has exited.
    pub(super) fn running(&mut self, ctx: &SlotContext) -> Result<&mut Running, ChildError> {
        if let Some(running) = &mut self.child {
            match running.process.ended() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name,
                        slot = ctx.slot, pid = running.process.id(), %status,
                        "exec child exited between batches; restarting it");
                    self.child = None;
                }
                Err(e) => {
                    tracing::warn!(target: "gaffer::exec", pid = running.process.id(),
                        "cannot check exec child: {e}; restarting it");
                    self.stop();
                }
            }
        }
        if self.child.is_none() {
            self.child = Some(self.spawn(ctx)?);
        }
        Ok(self.child.as_mut().expect("started just above"))
    }

    /// Sends a batch queue's batch and reads the reply (any error means the child can no
    /// longer be trusted to be in step with us), passing the slot's stop to the child as
    /// the stop line while the child has the batch ([`StopWriter`]).
    pub(super) fn exchange_stoppable(
        &mut self,
        ctx: &SlotContext,
        request: &Request<'_>,
    ) -> Result<(Vec<Option<ReplyStatus>>, StopLine), ChildError> {
        // Taken out while the exchange borrows `self`, and put back after it.
        let writer = self
            .stop_writer
            .take()
            .unwrap_or_else(|| StopWriter::start(ctx));
        let r = self.send(ctx, request).and_then(|()| {
            let stdin = self
                .child
                .as_ref()
                .map(|r| r.stdin.as_fd().try_clone_to_owned());
            match stdin {
                Some(Ok(stdin)) => writer.batch_sent(ctx, File::from(stdin)),
                Some(Err(e)) => tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name,
                    slot = ctx.slot, "cannot keep the child's stdin for a stop line: {e}"),
                None => {}
            }
            self.receive(request)
        });
        let line = writer.batch_over();
        self.stop_writer = Some(writer);
        r.map(|statuses| (statuses, line))
    }

    /// Writes the batch line to the child (started first if need be).
    pub(super) fn send(
        &mut self,
        ctx: &SlotContext,
        request: &Request<'_>,
    ) -> Result<(), ChildError> {
        self.running(ctx)?;
        self.send_started(request)
    }

    /// Writes the batch line to the child as it is, not reaped nor replaced if it exited
    /// (the write then fails): a watcher holding its pid must never signal another
    /// process that reused it.
    pub(super) fn send_started(&mut self, request: &Request<'_>) -> Result<(), ChildError> {
        let running = self.child.as_mut().ok_or(ChildError::ClosedBeforeReply)?;
        // Compact JSON escapes control characters inside strings, so this is one line.
        let mut line = serde_json::to_vec(request).map_err(ChildError::Encode)?;
        line.push(b'\n');
        running
            .stdin
            .write_all(&line)
            .and_then(|()| running.stdin.flush())
            .map_err(ChildError::Write)
    }

    /// Reads the child's reply to `request`.
    pub(super) fn receive(
        &mut self,
        request: &Request<'_>,
    ) -> Result<Vec<Option<ReplyStatus>>, ChildError> {
        let max_reply = self.max_reply;
        let running = self.child.as_mut().ok_or(ChildError::ClosedBeforeReply)?;
        // Bounded, so a child that writes without end (no newline) costs at most
        // `max_reply` bytes before it is called out of step and restarted.
        let mut reply = Vec::new();
        (&mut running.stdout)
            .take(max_reply as u64 + 1)
            .read_until(b'\n', &mut reply)
            .map_err(ChildError::Read)?;
        if reply.last() != Some(&b'\n') {
            return Err(if reply.len() > max_reply {
                ReplyError::TooLong(max_reply).into()
            } else if reply.is_empty() {
                ChildError::ClosedBeforeReply
            } else {
                ChildError::ClosedInReply
            });
        }
        // More than the reply line already read: stdout carries replies only, and a
        // line left over would be read as the next batch's reply.
        let leftover = !running.stdout.buffer().is_empty();
        let pid = running.process.id();
        let ids: Vec<&str> = request.batch.iter().map(|t| t.id).collect();
        let statuses = parse_reply(&reply, &ids)?;
        if leftover {
            tracing::warn!(target: "gaffer::exec", pid,
                "the exec child wrote more than its reply line on stdout (log to stderr instead); restarting it");
            // (stopped once the exchange is over: a long task's watcher may still hold
            // the child's pid until then)
            self.restart_after_reply = true;
        }
        Ok(statuses)
    }

    /// Sends a long queue's task and reads the reply, while a watcher thread stops
    /// the child when the slot asks ([`watch_stop`]): the handler thread is blocked
    /// reading the reply meanwhile, so the cancel line and the signals come from another.
    pub(super) fn exchange_long(
        &mut self,
        ctx: &SlotContext,
        request: &Request<'_>,
    ) -> Result<Vec<Option<ReplyStatus>>, ChildError> {
        let running = self.running(ctx)?;
        let pid = running.process.id();
        let stdin = running.stdin.as_fd().try_clone_to_owned().map(File::from);
        let signaller = running.process.signaller();
        let id = request.batch.first().map_or("", |t| t.id);
        let done = AtomicBool::new(false);
        let done_flag = &done;
        std::thread::scope(|scope| {
            let watcher = match (stdin, signaller) {
                (Ok(stdin), Ok(signaller)) => std::thread::Builder::new()
                    .name(format!("exec-stop-{pid}"))
                    .spawn_scoped(scope, move || {
                        watch_stop(ctx, id, &signaller, stdin, done_flag)
                    })
                    .map(drop),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            if let Err(e) = watcher {
                tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot, pid,
                    "cannot watch the long task for a cancel: {e}; it runs until it returns");
            }
            // (the child `pid` names, which the watcher may signal)
            let r = self
                .send_started(request)
                .and_then(|()| self.receive(request));
            done.store(true, Ordering::Release);
            ctx.cancel.wake();
            r
        })
    }

    /// The child's pid, to watch it being replaced and reaped.
    #[cfg(test)]
    pub(super) fn child_pid(&self) -> Option<u32> {
        self.child.as_ref().map(|r| r.process.id())
    }
}

impl Exec {
    /// Ends the child as a program reading requests expects at the slot's orderly end:
    /// its stdin closes (end of input), it has [`EXIT_GRACE`] to exit, then SIGTERM and
    /// [`KILL_AFTER_TERM`], then SIGKILL. Whatever it started in its group is killed
    /// once it exited, before it is reaped (the group's id is its pid until then).
    pub(super) fn close_child(&mut self) {
        // The stop writer's copy of stdin would keep the end of input from the child.
        self.stop_writer = None;
        let Some(Running {
            mut process,
            stdin,
            mut stdout,
        }) = self.child.take()
        else {
            self.await_stderr();
            return;
        };
        drop(stdin);
        self.outside.set(0);
        // Read to its end and dropped: a child that writes at the end of its input must
        // neither die of SIGPIPE nor block on a full pipe for it.
        let _ = std::thread::Builder::new()
            .name("exec-stdout-drain".into())
            .spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let pid = process.id();
        let mut how = "exited at the end of its input";
        let mut exited = process.exited_within(EXIT_GRACE);
        for (sig, wait) in [
            (Signal::SIGTERM, KILL_AFTER_TERM),
            (Signal::SIGKILL, Duration::MAX),
        ] {
            if exited {
                break;
            }
            tracing::info!(target: "gaffer::exec", pid, signal = %sig,
                "the exec child has not exited since its input ended");
            process.signal(sig);
            how = if sig == Signal::SIGTERM {
                "stopped by SIGTERM"
            } else {
                "killed"
            };
            exited = process.exited_within(wait);
        }
        process.signal_group_left(Signal::SIGKILL);
        match process.reap() {
            Ok(status) => {
                tracing::debug!(target: "gaffer::exec", pid, %status, how, "exec child ended")
            }
            Err(e) => tracing::warn!(target: "gaffer::exec", pid, "cannot reap exec child: {e}"),
        }
        self.await_stderr();
    }

    /// Waits until every child's stderr is logged to its end, [`STDERR_FLUSH`] at most.
    pub(super) fn await_stderr(&mut self) {
        let deadline = Instant::now() + STDERR_FLUSH;
        for open in self.stderr_open.drain(..) {
            let left = deadline.saturating_duration_since(Instant::now());
            // (nothing is ever sent: the end is the sender's drop)
            if open.recv_timeout(left) == Err(mpsc::RecvTimeoutError::Timeout) {
                tracing::debug!(target: "gaffer::exec",
                    "an exec child's stderr is still open at the slot's end; not waiting for it");
            }
        }
    }
}

/// Whether the child `pid` exits within `wait` (it is not reaped: its pid, and so its
/// group's id, stay its own). An error asking counts as exited: there is no child to wait
/// for.
pub(super) fn exited_within(pid: u32, wait: Duration) -> bool {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    let deadline = Instant::now().checked_add(wait);
    // Polled: a child's exit comes as SIGCHLD, which belongs to the slot's runtime.
    let mut pause = Duration::from_millis(1);
    loop {
        match waitid(Id::Pid(Pid::from_raw(pid as i32)), flags) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(_) | Err(_) => return true,
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Sends `sig` to the child's process group (the child and what it started); one that
/// is already gone needs nothing. The group's id is the child's pid, which cannot have
/// been reused while the child is not reaped (this slot reaps it).
pub(super) fn signal(pid: u32, sig: Signal) {
    if let Err(e) = kill(Pid::from_raw(-(pid as i32)), sig) {
        tracing::debug!(target: "gaffer::exec", pid, "cannot send {sig}: {e}");
    }
}

/// Copies the child's stderr to the slot's log, a line per event; ends when the child's
/// stderr closes.
pub(super) fn forward_stderr(stderr: impl Read, queue: &str, slot: u32, pid: u32) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_LOG_LINE as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                tracing::info!(target: "gaffer::exec", queue, slot, pid, "{text}");
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(target: "gaffer::exec", queue, slot, pid,
                    "cannot read the child's stderr: {e}");
                return;
            }
        }
    }
}
