//! The master's side of its zygotes ([`super::zygote`] is the zygote process itself):
//! starting one, reading its events, restarting it with back-off when it dies, retiring
//! old generations once their slots are gone.
//!
//! A new generation also starts when a handler's source file that a language zygote loaded
//! changes (`replace_zygote_if_code_changed`, every 3 s), and is rolled over like a config
//! change: the old zygote's slots stop once the new one is ready.
//!
//! The master spawns the zygote from its only thread, since PDEATHSIG follows the spawning
//! thread; the zygote and every slot set PDEATHSIG=SIGKILL (a slot only after switching to
//! its queue's `user`, since a change of credentials clears it) and re-check their parent
//! after setting it (ARCHITECTURE.md, invariant 14).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram as StdDatagram;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::mpsc;

use super::plan::{SlotState, ZygoteView};
use super::slots::signal_pid;
use super::supervisor::{Event, Master};
use super::telemetry::SlotStarted;
use super::zygote::{MASTER_PID_ENV, REPORT_FD_ENV, ZygoteEvent, ZygoteInit};
use crate::backoff::Backoff;
use crate::config::{Config, QueueConfig};

/// The first pause before restarting a zygote that died; it doubles while it keeps dying.
const ZYGOTE_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause before restarting a zygote that died (1, 2, 4, 8, 16 s).
const MAX_ZYGOTE_BACKOFF: Duration = Duration::from_secs(16);
/// How often the handlers' source files are looked at for a deploy.
const CODE_CHECK: Duration = Duration::from_secs(3);
/// The pause before trying again when a zygote could not even be started.
const ZYGOTE_START_RETRY: Duration = Duration::from_secs(30);

/// One zygote process.
pub(super) struct ZygoteProc {
    /// The process; killed if dropped.
    pub(super) child: Child,
    /// Its requests pipe; closed to retire it (it exits once its slots are gone).
    pub(super) stdin: Option<ChildStdin>,
    /// Its pid (0 if unknown), replaced by the one it reports when ready.
    pub(super) pid: u32,
    /// It has preloaded and takes spawn requests.
    pub(super) ready: bool,
    /// Queues whose handler preloaded.
    pub(super) preloaded: BTreeSet<String>,
    /// The queue configs it preloaded, to see whether a new config needs a new zygote.
    pub(super) queues: BTreeMap<String, QueueConfig>,
    /// The source files its handlers loaded, with their modification times when it said
    /// it was ready: a change calls for a new zygote, as a new config does.
    pub(super) watch: Vec<(PathBuf, Option<SystemTime>)>,
}

/// The zygotes: the current one, which new slots come from, and older ones retiring.
pub(super) struct Zygotes {
    /// Running zygotes by generation.
    pub(super) procs: BTreeMap<u64, ZygoteProc>,
    /// The current generation (0 before the first start); slots of any other are rolled
    /// over once its zygote is ready.
    pub(super) generation: u64,
    /// Pauses before restarting after the current zygote died, doubling while it keeps
    /// dying; reset when one gets ready.
    pub(super) restart_backoff: Backoff,
    /// When to start a new zygote, after the current one died or failed to start.
    pub(super) restart_at: Option<Instant>,
    /// When the handlers' source files were last looked at ([`CODE_CHECK`] apart).
    code_checked: Instant,
    /// Where the zygotes' output lines go: into the loop's events.
    events: mpsc::UnboundedSender<Event>,
    /// The slots' end of the report socket, inherited by every zygote and so every slot.
    report_peer: StdDatagram,
}

impl Zygotes {
    pub(super) fn new(events: mpsc::UnboundedSender<Event>, report_peer: StdDatagram) -> Self {
        Zygotes {
            procs: BTreeMap::new(),
            generation: 0,
            restart_backoff: Backoff::new(ZYGOTE_BACKOFF, MAX_ZYGOTE_BACKOFF),
            restart_at: None,
            code_checked: Instant::now(),
            events,
            report_peer,
        }
    }

    /// The zygote of the current generation, if it runs.
    pub(super) fn current(&self) -> Option<&ZygoteProc> {
        self.procs.get(&self.generation)
    }

    /// The current zygote as the plan sees it (not ready when there is none).
    pub(super) fn view(&self) -> ZygoteView {
        let z = self.current();
        ZygoteView {
            generation: self.generation,
            ready: z.is_some_and(|z| z.ready),
            accepts: z.is_some_and(|z| z.stdin.is_some()),
            preloaded: z.map(|z| z.preloaded.clone()).unwrap_or_default(),
        }
    }

    /// Closes every zygote's stdin and waits for it to exit, killing one that does not.
    pub(super) async fn wait_all(&mut self) {
        for (generation, z) in &mut self.procs {
            z.stdin = None;
            match tokio::time::timeout(Duration::from_secs(5), z.child.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(generation, "zygote did not exit; killing it");
                    let _ = z.child.kill().await;
                }
            }
        }
    }

    /// Starts the zygote binary with the report socket and its pdeathsig.
    fn spawn_process(&self, exe: &std::path::Path) -> anyhow::Result<Child> {
        let peer_fd = self.report_peer.as_raw_fd();
        let mut cmd = tokio::process::Command::new(exe);
        cmd.arg("__zygote")
            .env(REPORT_FD_ENV, peer_fd.to_string())
            .env(MASTER_PID_ENV, std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // Dies with the master, even on SIGKILL. Tied to this (main) thread.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Its own process group: a Ctrl-C on the terminal reaches the master only,
                // which then drains the slots in order.
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The slots' report socket survives exec into the zygote and its forks.
                if libc::fcntl(peer_fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn()
            .with_context(|| format!("starting the zygote {}", exe.display()))
    }

    /// Turns the zygote's output lines into loop events, and its end into
    /// [`Event::ZygoteGone`].
    fn forward_events(&self, generation: u64, stdout: ChildStdout) {
        let tx = self.events.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<ZygoteEvent>(&line) {
                    Ok(ev) => {
                        let _ = tx.send(Event::Zygote(generation, ev));
                    }
                    Err(e) => tracing::warn!(error = %e, line, "unreadable zygote event"),
                }
            }
            let _ = tx.send(Event::ZygoteGone(generation));
        });
    }
}

impl Master {
    /// The queues of `cfg` this binary has handlers for: what a zygote preloads.
    pub(super) fn supported_queues(&self, cfg: &Config) -> BTreeMap<String, QueueConfig> {
        cfg.queues
            .iter()
            .filter(|(_, q)| self.opts.registry.supports(q))
            .map(|(n, q)| (n.clone(), q.clone()))
            .collect()
    }

    /// Starts a zygote of a new generation with the current config; its slots replace
    /// the older generation's once it is ready.
    pub(super) async fn start_zygote(&mut self) -> anyhow::Result<()> {
        self.zygotes.generation += 1;
        let generation = self.zygotes.generation;
        let queues = self.supported_queues(&self.opts.config);
        let mut child = self.zygotes.spawn_process(&self.opts.zygote_exe)?;
        let pid = child.id().unwrap_or(0);
        let mut stdin = child.stdin.take().context("zygote stdin")?;
        let stdout = child.stdout.take().context("zygote stdout")?;
        let init = ZygoteInit {
            config: self.opts.config_source.clone(),
            origin: self.opts.config.origin.clone(),
            queues: queues.keys().cloned().collect(),
            redis_url: self.opts.redis_url.clone(),
            password: self.opts.connect.password.clone(),
            tls: self.opts.connect.tls.clone(),
            host: self.opts.host.clone(),
            durability: self.opts.connect.durability,
        };
        let mut line = serde_json::to_vec(&init)?;
        line.push(b'\n');
        stdin
            .write_all(&line)
            .await
            .context("writing to the zygote")?;
        self.zygotes.forward_events(generation, stdout);
        tracing::info!(generation, pid, queues = queues.len(), "zygote started");
        self.zygotes.procs.insert(
            generation,
            ZygoteProc {
                child,
                stdin: Some(stdin),
                pid,
                ready: false,
                preloaded: BTreeSet::new(),
                queues,
                watch: Vec::new(),
            },
        );
        Ok(())
    }

    /// Replaces the current zygote (its slots roll over to the new one, as after a config
    /// change) when a source file its handlers loaded has changed since: a deploy of an
    /// exec handler's code takes effect without a restart of the master.
    pub(super) async fn replace_zygote_if_code_changed(&mut self) {
        // (a Python handler with its libraries may name hundreds of files: a stat of each
        // every few seconds is plenty for a deploy)
        if self.zygotes.code_checked.elapsed() < CODE_CHECK {
            return;
        }
        self.zygotes.code_checked = Instant::now();
        let Some(z) = self.zygotes.current().filter(|z| z.ready) else {
            return;
        };
        let Some((path, _)) = z.watch.iter().find(|(path, then)| modified(path) != *then) else {
            return;
        };
        tracing::info!(file = %path.display(), "a handler's source file changed; replacing the zygote");
        if let Err(e) = self.start_zygote().await {
            tracing::error!(error = %e, "starting the new zygote failed");
            self.zygotes.restart_at = Some(Instant::now() + Duration::from_secs(1));
        }
        self.retire_idle_zygotes();
    }

    /// Starts the zygote again once its restart pause has passed.
    pub(super) async fn restart_zygote_if_due(&mut self) {
        if let Some(at) = self.zygotes.restart_at
            && Instant::now() >= at
            && !self.stopping
        {
            self.zygotes.restart_at = None;
            if let Err(e) = self.start_zygote().await {
                tracing::error!(error = %e, "restarting the zygote failed");
                // Counts as a death: the next pause after one is longer.
                let _ = self.zygotes.restart_backoff.next();
                self.zygotes.restart_at = Some(Instant::now() + ZYGOTE_START_RETRY);
            }
        }
    }

    pub(super) async fn zygote_event(&mut self, generation: u64, ev: ZygoteEvent) {
        match ev {
            ZygoteEvent::Ready {
                pid,
                preloaded,
                failed,
                watch,
            } => {
                for (queue, error) in &failed {
                    tracing::error!(
                        generation,
                        queue,
                        error,
                        "preload failed; no slots for this queue"
                    );
                }
                if let Some(z) = self.zygotes.procs.get_mut(&generation) {
                    z.ready = true;
                    z.pid = pid;
                    z.preloaded = preloaded.into_iter().collect();
                    z.watch = with_times(watch);
                }
                self.zygotes.restart_backoff.reset();
                tracing::info!(generation, pid, "zygote ready");
                self.reconcile().await;
            }
            ZygoteEvent::Watch { files } => {
                if let Some(z) = self.zygotes.procs.get_mut(&generation) {
                    z.watch = with_times(files);
                }
            }
            ZygoteEvent::Spawned { slot, pid } => {
                if let Some(s) = self.slots.procs.get_mut(&slot) {
                    s.pid = Some(pid);
                    if s.state == SlotState::Spawning {
                        s.state = SlotState::Starting;
                    } else if s.state == SlotState::Stopping {
                        signal_pid(pid, Signal::SIGTERM);
                    }
                    SlotStarted {
                        queue: &s.queue,
                        slot,
                        pid,
                    }
                    .emit();
                }
            }
            ZygoteEvent::SpawnFailed { slot, error } => {
                if let Some(s) = self.slots.procs.remove(&slot) {
                    tracing::error!(queue = %s.queue, slot, error, "slot could not be forked");
                    self.slots.crashed(&s.queue);
                }
            }
            ZygoteEvent::Exited {
                slot,
                pid,
                code,
                signal,
            } => self.slot_exited(slot, pid, code, signal).await,
        }
    }

    /// A zygote's output ended: it exited, and its slots with it. The current one is
    /// restarted after a pause.
    pub(super) fn zygote_gone(&mut self, generation: u64) {
        let Some(mut z) = self.zygotes.procs.remove(&generation) else {
            return;
        };
        let status = z.child.try_wait().ok().flatten();
        // Its slots died with it (PDEATHSIG); they will never be reported.
        self.slots.orphaned(generation);
        if generation == self.zygotes.generation && !self.stopping {
            let delay = self.zygotes.restart_backoff.next();
            tracing::error!(generation, ?status, restart_in = ?delay, "zygote exited");
            self.zygotes.restart_at = Some(Instant::now() + delay);
        } else {
            tracing::info!(generation, ?status, "retired zygote exited");
        }
    }

    /// Closes the stdin of old zygotes that have no slots left: they exit by themselves.
    /// Draining, the current one retires too.
    pub(super) fn retire_idle_zygotes(&mut self) {
        let current = self.zygotes.generation;
        for (&generation, z) in &mut self.zygotes.procs {
            let busy = self
                .slots
                .procs
                .values()
                .any(|s| s.generation == generation);
            if (generation != current || self.stopping) && !busy && z.stdin.is_some() {
                z.stdin = None;
            }
        }
    }
}

/// Each of `files` with its modification time now, to be told changed later.
fn with_times(files: Vec<PathBuf>) -> Vec<(PathBuf, Option<SystemTime>)> {
    files
        .into_iter()
        .map(|p| {
            let t = modified(&p);
            (p, t)
        })
        .collect()
}

/// A file's modification time, none when it cannot be read (a file that comes back counts
/// as a change too).
fn modified(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}
