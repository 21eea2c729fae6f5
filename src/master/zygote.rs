//! The zygote: the only process of gaffer that forks.
//!
//! The master starts it by re-executing its own binary (`gaffer __zygote`), so no async
//! runtime or thread ever exists in it. It preloads the handlers of the host's queues
//! once, then forks slots on the master's request; each slot inherits the preloaded data
//! copy-on-write. It reaps its children and reports every exit.
//!
//! It speaks JSON lines: requests on stdin ([`ZygoteInit`] first, then [`ZygoteRequest`]s),
//! events on stdout ([`ZygoteEvent`]). End of stdin means "retire": spawn nothing more,
//! exit once the last child is gone. It dies with the master (PDEATHSIG), and its slots
//! die with it.
//!
//! Only it forks, and only while single-threaded (ARCHITECTURE.md, invariant 12): it counts
//! `/proc/self/task` before every fork and refuses if it is not 1. It blocks signals and
//! reads them from a signalfd, which is not a handler. It is the one master file that names
//! `slot`: its forked child becomes a slot through `slot::slot_main`.
//!
//! The lines: the master sends `ZygoteInit` (the config text) then `Spawn{queue, slot}`;
//! the zygote answers `Ready`, `Spawned`, `SpawnFailed`, `Exited{code|signal}`, and
//! `Watch{files}` when a language zygote started again names its source files anew.
//!
//! Nothing outlives its slot (ARCHITECTURE.md, invariant 14). A slot killed outright takes
//! only its exec child (PDEATHSIG does not reach the child's own subprocesses), so the
//! zygote is a child subreaper: what a dead slot's child left comes to it, and after every
//! exit it reaps it kills the process groups of its children that are not slots, unless a
//! group's leader still runs under a live slot (a live task's background process) or the
//! group is the slots' own (`end_orphans`, once more before a retiring zygote exits).
//!
//! For `start = "fork"` queues it relays each slot's fork line to the queue's language
//! zygote (`crate::host::fork`) and keeps each slot's child by pid and pidfd: it kills
//! the child's group when the slot is reaped (a slot killed outright takes no such child
//! with it) and spares it from `end_orphans` when a dead language zygote left it to the
//! zygote.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixDatagram, UnixStream};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid};
use serde::{Deserialize, Serialize};

use super::language::Languages;
use crate::config::{self, Config};
use crate::host::handler::{Handler, Registry};
use crate::host::proto::{EXIT_FATAL, SlotSpec};
use crate::queue_client::{ConnectOptions, Durability, TlsFiles};
// The one place the master's side names `slot`: the forked child becomes a slot.
use crate::slot::slot_main;

/// The environment variable carrying the slot report socket's descriptor number.
pub const REPORT_FD_ENV: &str = "GAFFER_ZYGOTE_REPORT_FD";
/// The environment variable carrying the master's pid, to detect an early orphaning.
pub const MASTER_PID_ENV: &str = "GAFFER_ZYGOTE_MASTER_PID";

/// The first line the master writes: everything the zygote needs to preload and to
/// start slots.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ZygoteInit {
    /// The config text, parsed again here so the zygote needs no file of its own.
    pub config: String,
    /// Where the config came from, for messages.
    pub origin: String,
    /// Queues whose handlers to preload; slots can be started for these only.
    pub queues: Vec<String>,
    /// The Redis URL slots connect to.
    pub redis_url: String,
    /// The Redis password, when it comes from a file.
    pub password: Option<String>,
    /// The `[cluster]` TLS files as the master read them.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// The host's name, as task records show where an attempt ran.
    #[serde(default)]
    pub host: String,
    /// How the slots' writes are confirmed on replicas (`[cluster] wait_replicas`), as
    /// the master connects.
    #[serde(default)]
    pub durability: Durability,
}

/// A request from the master.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ZygoteRequest {
    /// Fork a slot for `queue` numbered `slot`.
    Spawn {
        /// Queue the slot serves; one of the preloaded ones.
        queue: String,
        /// The master's number for it.
        slot: u32,
    },
}

/// What the zygote tells the master.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum ZygoteEvent {
    /// Preloading finished; slots may be requested.
    Ready {
        /// The zygote's pid.
        pid: u32,
        /// Queues whose handler preloaded.
        preloaded: Vec<String>,
        /// Queues whose preload failed, with the error; their slots cannot start.
        failed: BTreeMap<String, String>,
        /// Source files the handlers loaded (the language zygotes of `start = "fork"`
        /// queues say which): a change to one of them calls for a new zygote.
        #[serde(default)]
        watch: Vec<std::path::PathBuf>,
    },
    /// A slot was forked.
    Spawned {
        /// The master's number for it.
        slot: u32,
        /// Its pid.
        pid: u32,
    },
    /// A slot could not be forked.
    SpawnFailed {
        /// The master's number for it.
        slot: u32,
        /// Why.
        error: String,
    },
    /// A language zygote became ready again (started anew): the source files every
    /// language zygote loaded now, replacing those of `Ready`.
    Watch {
        /// As in [`ZygoteEvent::Ready`].
        files: Vec<std::path::PathBuf>,
    },
    /// A slot exited and was reaped.
    Exited {
        /// The master's number for it.
        slot: u32,
        /// Its pid.
        pid: u32,
        /// Exit code, when it exited.
        code: Option<i32>,
        /// Signal number, when a signal killed it.
        signal: Option<i32>,
    },
}

/// Entry point of `gaffer __zygote`; never returns. Must be called before anything starts
/// a thread.
pub fn main(registry: &Registry) -> ! {
    let code = match run(registry) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "zygote failed");
            1
        }
    };
    std::process::exit(code)
}

fn run(registry: &Registry) -> anyhow::Result<()> {
    // The master sets PDEATHSIG between its fork and our exec; if it died before that,
    // we were reparented and nothing would ever kill us, so check who our parent is.
    set_pdeathsig()?;
    let master: Option<i32> = std::env::var(MASTER_PID_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    if master.is_some_and(|pid| nix::unistd::getppid().as_raw() != pid) {
        anyhow::bail!("the master exited before the zygote started");
    }
    // The processes a dead slot's handler left (a subprocess of its exec command) come
    // to us rather than to init, so that `reap` can end them.
    nix::sys::prctl::set_child_subreaper(true)?;
    // (what slots of this host's zygotes before this one left, killed mid-start)
    crate::host::fork::sweep_fifo_dirs(&std::env::temp_dir());
    let report_fd: Option<i32> = std::env::var(REPORT_FD_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    // Inherited across our forks (slots keep it), but never across an exec: a language
    // zygote's handler must not be able to send the master a slot's events.
    if let Some(fd) = report_fd {
        // SAFETY: the master handed this descriptor over for the zygote's life.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )?;
    }

    let mut input = Input::default();
    let stdin = std::io::stdin();
    let init_line = loop {
        if let Some(line) = input.next_line() {
            break line;
        }
        if !input.fill(stdin.as_fd())? {
            anyhow::bail!("stdin closed before the init line");
        }
    };
    let init: ZygoteInit = serde_json::from_slice(&init_line)?;
    let cfg = config::parse_with(&init.config, &init.origin, &registry.custom_names())?;

    let (mut preloaded, failed) = preload_all(registry, &cfg, &init.queues);
    // (after the Rust handlers' preload, so that none of them inherits a language
    // zygote's pipes)
    let mut languages = Languages::start(&cfg, &init.queues);
    emit(&ZygoteEvent::Ready {
        pid: std::process::id(),
        preloaded: preloaded.keys().cloned().collect(),
        failed,
        watch: languages.watched(),
    })?;

    // SIGCHLD through a descriptor, so one poll waits for requests and exits alike.
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&chld), None)?;
    let sigfd = SignalFd::with_flags(&chld, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;

    let ctx = ForkCtx {
        cfg: &cfg,
        init: &init,
        report_fd,
        sigfd: sigfd.as_fd().as_raw_fd(),
    };
    serve(&ctx, &mut preloaded, &mut languages, &mut input, &sigfd)
}

/// Handlers preloaded by queue, and the queues whose preload failed with the error.
type Preloaded = (BTreeMap<String, Box<dyn Handler>>, BTreeMap<String, String>);

/// Preloads the handler of each of `queues`.
fn preload_all(registry: &Registry, cfg: &Config, queues: &[String]) -> Preloaded {
    let mut preloaded: BTreeMap<String, Box<dyn Handler>> = BTreeMap::new();
    let mut failed = BTreeMap::new();
    for name in queues {
        let Some(q) = cfg.queues.get(name) else {
            failed.insert(name.clone(), "not in the config".to_string());
            continue;
        };
        let started = std::time::Instant::now();
        match registry.preload(q) {
            Ok(h) => {
                tracing::info!(queue = %name, handler = q.handler.name(),
                    ms = started.elapsed().as_millis() as u64, "preloaded");
                preloaded.insert(name.clone(), h);
            }
            Err(e) => {
                tracing::error!(queue = %name, error = %e, "preload failed");
                failed.insert(name.clone(), e.to_string());
            }
        }
    }
    (preloaded, failed)
}

/// Forks slots on request and reaps them until stdin ends and the last child is gone.
fn serve(
    ctx: &ForkCtx,
    preloaded: &mut BTreeMap<String, Box<dyn Handler>>,
    languages: &mut Languages,
    input: &mut Input,
    sigfd: &SignalFd,
) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut children: BTreeMap<i32, u32> = BTreeMap::new();
    let mut retiring = false;
    loop {
        while let Some(line) = input.next_line() {
            match serde_json::from_slice::<ZygoteRequest>(&line) {
                Ok(ZygoteRequest::Spawn { queue, slot }) => {
                    let ev = spawn(ctx, preloaded, languages, &queue, slot);
                    if let ZygoteEvent::Spawned { pid, .. } = ev {
                        children.insert(pid as i32, slot);
                    }
                    emit(&ev)?;
                }
                Err(e) => tracing::error!(error = %e, "zygote: unreadable request"),
            }
        }
        reap(&mut children, languages)?;
        if retiring && children.is_empty() {
            end_orphans_before_exit();
            return Ok(());
        }
        let mut fds = vec![
            libc::pollfd {
                fd: sigfd.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // (a negative descriptor is skipped: a retiring zygote reads no more)
                fd: if retiring {
                    -1
                } else {
                    stdin.as_fd().as_raw_fd()
                },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        fds.extend(languages.poll_fds());
        let timeout = languages
            .timeout()
            .map_or(-1, |t| t.as_millis().min(60_000) as i32);
        // SAFETY: poll(2) over descriptors this process holds open for the call.
        if unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e.into());
        }
        let stdin_ready = fds[1].revents != 0;
        // Drain the signal queue; reap() above collects every exited child anyway.
        while let Ok(Some(_)) = sigfd.read_signal() {}
        languages.after_poll();
        if languages.take_ready_news() {
            emit(&ZygoteEvent::Watch {
                files: languages.watched(),
            })?;
        }
        if stdin_ready && !input.fill(stdin.as_fd())? {
            retiring = true;
            languages.retire();
        }
    }
}

struct ForkCtx<'a> {
    cfg: &'a Config,
    init: &'a ZygoteInit,
    report_fd: Option<i32>,
    sigfd: i32,
}

fn spawn(
    ctx: &ForkCtx,
    preloaded: &mut BTreeMap<String, Box<dyn Handler>>,
    languages: &mut Languages,
    queue: &str,
    slot: u32,
) -> ZygoteEvent {
    let failed = |error: String| ZygoteEvent::SpawnFailed { slot, error };
    let (Some(q), true) = (ctx.cfg.queues.get(queue), preloaded.contains_key(queue)) else {
        return failed(format!("queue `{queue}` is not preloaded in this zygote"));
    };
    match thread_count() {
        Ok(1) => {}
        Ok(n) => return failed(format!("zygote has {n} threads, refusing to fork")),
        Err(e) => return failed(format!("reading /proc/self/task: {e}")),
    }
    // A `start = "fork"` queue's slot asks for its child on a line of its own.
    let line = if languages.has(queue) {
        match UnixStream::pair() {
            Ok(pair) => Some(pair),
            Err(e) => return failed(format!("making the fork line: {e}")),
        }
    } else {
        None
    };
    let zygote = getpid();
    // SAFETY: the zygote is single-threaded (checked just above), so the child gets a
    // consistent copy of the whole process, allocator locks included.
    match unsafe { fork() } {
        Err(e) => failed(format!("fork: {e}")),
        Ok(ForkResult::Parent { child }) => {
            if let Some((ours, _theirs)) = line {
                languages.add_line(slot, queue, ours);
            }
            ZygoteEvent::Spawned {
                slot,
                pid: child.as_raw() as u32,
            }
        }
        Ok(ForkResult::Child) => {
            let line = line.map(|(ours, theirs)| {
                drop(ours);
                theirs
            });
            // The other slots' lines and the language zygotes' pipes are not this slot's.
            let keep = line.as_ref().map(|l| l.as_raw_fd());
            for fd in languages.fds_for_child_to_close(keep) {
                // SAFETY: closing our copies; the structures naming them are never
                // used in this process again (forgotten in child_main).
                drop(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            let code = child_main(ctx, preloaded, q.clone(), slot, zygote, line);
            std::process::exit(code)
        }
    }
}

/// Runs in the forked child: becomes a slot.
fn child_main(
    ctx: &ForkCtx,
    preloaded: &mut BTreeMap<String, Box<dyn Handler>>,
    queue: config::QueueConfig,
    slot: u32,
    zygote: Pid,
    fork_line: Option<UnixStream>,
) -> i32 {
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // SAFETY: closing our copy of the zygote's signalfd; nothing else uses it here.
    drop(unsafe { OwnedFd::from_raw_fd(ctx.sigfd) });
    // stdin and stdout are the zygote's pipes to the master: a slot must never read the
    // master's requests or write into its event stream.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup2_stdin(null.as_fd());
    }
    // SAFETY: fd 2 stays open for the process's life.
    let stderr = unsafe { BorrowedFd::borrow_raw(2) };
    let _ = nix::unistd::dup2_stdout(stderr);
    if let Some(user) = &queue.user
        && let Err(e) = switch_user(user)
    {
        eprintln!("slot {slot}: switching to user {user}: {e}");
        return EXIT_FATAL;
    }
    // After the user switch: a change of credentials clears PDEATHSIG.
    if let Err(e) = set_pdeathsig() {
        eprintln!("slot {slot}: prctl(PR_SET_PDEATHSIG): {e}");
        return EXIT_FATAL;
    }
    // The zygote may have died between fork and prctl; then nobody would kill us.
    if nix::unistd::getppid() != zygote {
        return EXIT_FATAL;
    }
    // Before the runtime and the handler thread exist: they inherit it.
    if let Err(e) = super::sched::set_cpu_scheduling(queue.cpu_scheduling) {
        eprintln!("slot {slot}: setting its cpu_scheduling: {e}");
    }
    let Some(handler) = preloaded.remove(&queue.name) else {
        return EXIT_FATAL;
    };
    // The other queues' handlers stay untouched: freeing them would only dirty pages.
    std::mem::forget(std::mem::take(preloaded));
    // SAFETY: the descriptor was handed to the zygote for exactly this use and is not
    // owned by anything else in this process.
    let report = ctx
        .report_fd
        .map(|fd| unsafe { UnixDatagram::from_raw_fd(fd) });
    // The master cleared close-on-exec for the zygote to inherit it; an exec handler (or
    // anything it starts) must not, or it could send the master this slot's events.
    if let Some(r) = &report
        && let Err(e) = nix::fcntl::fcntl(
            r,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
    {
        eprintln!("slot {slot}: setting close-on-exec on the report socket: {e}");
        return EXIT_FATAL;
    }
    let connect = ConnectOptions {
        password: ctx.init.password.clone(),
        tls: ctx.init.tls.clone(),
        durability: ctx.init.durability,
        ..ConnectOptions::default()
    };
    slot_main(
        SlotSpec {
            queue,
            slot,
            redis_url: ctx.init.redis_url.clone(),
            namespace: ctx.cfg.cluster.namespace.clone(),
            connect,
            report,
            host: ctx.init.host.clone(),
            chains: std::sync::Arc::new(crate::chain::ChainTargets::from_config(ctx.cfg)),
            fork_line,
        },
        handler,
    )
}

fn switch_user(name: &str) -> anyhow::Result<()> {
    use nix::unistd::{User, setgid, setgroups, setuid};
    let user = User::from_name(name)?.ok_or_else(|| anyhow::anyhow!("no such user"))?;
    setgroups(&[user.gid])?;
    setgid(user.gid)?;
    setuid(user.uid)?;
    Ok(())
}

/// Reaps every child that exited: slots, reported to the master, and orphans (see
/// [`end_orphans`]), which are ended too after anything exited.
fn reap(children: &mut BTreeMap<i32, u32>, languages: &mut Languages) -> anyhow::Result<()> {
    let mut any = false;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => {
                exited(children, languages, pid, Some(code), None)?;
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                exited(children, languages, pid, None, Some(sig as i32))?;
            }
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => break,
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        any = true;
    }
    if any {
        end_orphans(children, &languages.live_children());
        crate::host::fork::sweep_fifo_dirs(&std::env::temp_dir());
    }
    Ok(())
}

/// Kills what a dead slot's handler left: the zygote forks only slots, so any other
/// child is a process adopted here (the zygote is a child subreaper) because its parent
/// died. A slot killed outright (the watchdog, a deadline, the OOM killer: no destructors
/// run) takes its exec child with it (PDEATHSIG), but the command's own subprocesses
/// (`sh -c 'python3 w.py; …'`) would run on, a long task's worker twice once its task
/// runs again. An orphan is killed with its process group once that group's leader (the
/// exec child) is gone or orphaned too: a live slot's command may leave a process of
/// its own behind on purpose (`(sidecar &)`), which stays while its task runs. A group
/// the zygote shares (a Rust handler's subprocess, in the slots' group) is left alone:
/// which slot it served cannot be told. Each kill makes another exit, and the reap after
/// it looks again, so processes adopted in turn are found too.
fn end_orphans(children: &BTreeMap<i32, u32>, forked: &BTreeSet<i32>) {
    end_orphans_with(children, forked, false);
}

/// [`end_orphans`]; `last` (no slot left) kills those in the zygote's own group too, by
/// pid, since none of them can be a live slot's. Returns whether it found any orphan.
fn end_orphans_with(children: &BTreeMap<i32, u32>, forked: &BTreeSet<i32>, last: bool) -> bool {
    let me = nix::unistd::getpid().as_raw();
    let my_group = nix::unistd::getpgrp().as_raw();
    let Ok(all) = procfs::process::all_processes() else {
        return false;
    };
    let stats: Vec<procfs::process::Stat> = all.filter_map(|p| p.ok()?.stat().ok()).collect();
    let parent_of = |pid: i32| stats.iter().find(|s| s.pid == pid).map(|s| s.ppid);
    let mut groups = BTreeSet::new();
    let mut any = false;
    for s in stats
        .iter()
        .filter(|s| s.ppid == me && !children.contains_key(&s.pid))
    {
        any = true;
        if last && s.pgrp == my_group && s.state != 'Z' {
            let _ = nix::sys::signal::kill(Pid::from_raw(s.pid), Signal::SIGKILL);
            continue;
        }
        // (the leader alive under its slot, or a slot itself: the group is a live task's)
        if s.pgrp <= 1
            || s.pgrp == my_group
            || children.contains_key(&s.pgrp)
            || forked.contains(&s.pgrp)
            || parent_of(s.pgrp).is_some_and(|p| p != me)
        {
            continue;
        }
        if s.state != 'Z' {
            tracing::warn!(pid = s.pid, group = s.pgrp, command = %s.comm,
                "killing a process a dead slot's handler left behind");
        }
        groups.insert(s.pgrp);
    }
    for g in groups {
        if let Err(e) = nix::sys::signal::killpg(Pid::from_raw(g), Signal::SIGKILL)
            && e != nix::errno::Errno::ESRCH
        {
            tracing::warn!(group = g, error = %e, "cannot kill a dead slot's processes");
        }
    }
    any
}

/// A retiring zygote's last step: what its slots' handlers left is ended and reaped, so
/// none is handed to init when it exits. Bounded: a process it cannot kill (another
/// user's, under a zygote that is not root) does not keep it alive.
fn end_orphans_before_exit() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let none = BTreeMap::new();
    while std::time::Instant::now() < deadline && end_orphans_with(&none, &BTreeSet::new(), true) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Err(nix::errno::Errno::ECHILD) => return,
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn exited(
    children: &mut BTreeMap<i32, u32>,
    languages: &mut Languages,
    pid: Pid,
    code: Option<i32>,
    signal: Option<i32>,
) -> anyhow::Result<()> {
    let Some(slot) = children.remove(&pid.as_raw()) else {
        let status = match (code, signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => format!("signal {sig}"),
            (None, None) => "ended".to_string(),
        };
        languages.exited(pid.as_raw(), &status);
        return Ok(());
    };
    languages.slot_ended(slot);
    {
        emit(&ZygoteEvent::Exited {
            slot,
            pid: pid.as_raw() as u32,
            code,
            signal,
        })?;
    }
    Ok(())
}

fn emit(ev: &ZygoteEvent) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(ev)?;
    line.push(b'\n');
    let mut out = std::io::stdout().lock();
    out.write_all(&line)?;
    out.flush()?;
    Ok(())
}

/// Asks the kernel to SIGKILL this process when its parent (thread) exits.
pub(crate) fn set_pdeathsig() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Threads of this process, from `/proc/self/task`.
pub fn thread_count() -> std::io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Bytes read from a descriptor not yet split into lines: stdin (the master's requests)
/// and, in [`super::language`], a language zygote's stdout and stderr and the slots' fork
/// lines. Raw reads (no `BufReader`) so that poll() on the descriptor tells the truth
/// about what is left to read.
#[derive(Default)]
pub(super) struct Input {
    buf: Vec<u8>,
}

impl Input {
    /// The next complete line, taken out without its newline.
    pub(super) fn next_line(&mut self) -> Option<Vec<u8>> {
        let end = self.buf.iter().position(|&b| b == b'\n')?;
        let mut line: Vec<u8> = self.buf.drain(..=end).collect();
        line.pop();
        Some(line)
    }

    /// What is left that is not a whole line (a process's last words without a newline).
    pub(super) fn rest(&self) -> &[u8] {
        &self.buf
    }

    /// Reads once (blocking on a blocking descriptor); false at end of input.
    fn fill(&mut self, fd: BorrowedFd) -> std::io::Result<bool> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match read_into(fd, &mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads all a non-blocking descriptor holds now; false once it has ended and nothing
    /// was read (a read error counts as something to look at, not as the end).
    pub(super) fn fill_available(&mut self, fd: BorrowedFd) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        let mut any = false;
        loop {
            match read_into(fd, &mut chunk) {
                Ok(0) => return any,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    any = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }
}

/// One read(2) of `fd` into `chunk`.
fn read_into(fd: BorrowedFd, chunk: &mut [u8]) -> std::io::Result<usize> {
    let mut file = std::mem::ManuallyDrop::new(
        // SAFETY: borrowed for one read; ManuallyDrop keeps the descriptor open.
        unsafe { std::fs::File::from_raw_fd(fd.as_raw_fd()) },
    );
    file.read(chunk)
}
