//! The master's loop and the state it owns: zygotes, slots, counters.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram as StdDatagram;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixDatagram;
use tokio::process::{Child, ChildStdin};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::capacity::{self, Capacity, CapacityInput};
use super::telemetry::{self, Exit};
use super::zygote::{MASTER_PID_ENV, REPORT_FD_ENV, ZygoteEvent, ZygoteInit, ZygoteRequest};
use super::{MasterOptions, sysinfo};
use crate::cluster::{self, HostReport, Keys, QueueReport, SlotMap};
use crate::config::{Config, QueueConfig};
use crate::queue_client::{OutageLog, QueueClient, RedisConn};
use crate::slot::{EXIT_RECYCLE, EXIT_STOPPED, SlotEvent};

/// Longest pause before restarting a queue's slots after repeated crashes.
const MAX_CRASH_BACKOFF: Duration = Duration::from_secs(60);
/// Longest pause before restarting a zygote that died.
const MAX_ZYGOTE_BACKOFF: Duration = Duration::from_secs(30);
/// How stale `/status` may get behind slot and zygote events.
const STATUS_REFRESH: Duration = Duration::from_millis(20);

/// Everything the loop reacts to.
enum Event {
    /// Measure, reconcile, watchdog, report.
    Tick,
    /// A line from a zygote.
    Zygote(u64, ZygoteEvent),
    /// A zygote's stdout closed: it exited.
    ZygoteGone(u64),
    /// A datagram from a slot.
    Slot(SlotEvent),
    /// SIGTERM, SIGINT or the caller's token: drain and stop.
    Shutdown,
    /// SIGHUP: re-read the config file.
    Reload,
    /// Slot or zygote events changed the state since `/status` was last rebuilt.
    RefreshStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum SlotState {
    /// Asked of the zygote, no pid yet.
    Spawning,
    /// Forked, connecting and initialising.
    Starting,
    /// Waiting for tasks.
    Idle,
    /// Inside a batch.
    Busy,
    /// Sent SIGTERM; finishing its batch.
    Stopping,
}

struct SlotProc {
    queue: String,
    generation: u64,
    pid: Option<u32>,
    state: SlotState,
    spawned_at: Instant,
    last_progress: Instant,
    stop_deadline: Option<Instant>,
    hung: bool,
    batches: u64,
    exit_reason: Option<String>,
    /// From the spawn request to the slot's first take (fork, runtime, Redis, init).
    ready_after: Option<Duration>,
}

struct ZygoteProc {
    child: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    ready: bool,
    preloaded: BTreeSet<String>,
    /// The queue configs it preloaded, to see whether a new config needs a new zygote.
    queues: BTreeMap<String, QueueConfig>,
}

#[derive(Default)]
struct QueueState {
    report: QueueReport,
    consecutive_crashes: u32,
    next_start: Option<Instant>,
    stale_total: u64,
}

/// The status document `/status` serves.
#[derive(Serialize)]
struct Status<'a> {
    host: &'a HostReport,
    capacity: &'a Option<Capacity>,
    zygote_pids: Vec<u32>,
    slots: Vec<SlotStatus<'a>>,
}

#[derive(Serialize)]
struct SlotStatus<'a> {
    slot: u32,
    queue: &'a str,
    pid: Option<u32>,
    state: SlotState,
    generation: u64,
    batches: u64,
    age_seconds: f64,
    /// Spawn request to first take, in ms; null until the slot is ready.
    ready_ms: Option<f64>,
}

struct Master {
    opts: MasterOptions,
    cfg: Config,
    keys: Keys,
    conn: RedisConn,
    events: mpsc::UnboundedSender<Event>,
    report_peer: StdDatagram,
    zygotes: BTreeMap<u64, ZygoteProc>,
    generation: u64,
    zygote_failures: u32,
    zygote_restart_at: Option<Instant>,
    slots: BTreeMap<u32, SlotProc>,
    next_slot: u32,
    queues: BTreeMap<String, QueueState>,
    map: Option<SlotMap>,
    max_epoch: u64,
    /// Redis outages, logged as spells.
    outage: OutageLog,
    draining: bool,
    /// `gaffer drain HOST`: no slots here, but the master stays up and reporting.
    drained: bool,
    /// Version of the config adopted from `gaffer config apply` (0: the file's).
    config_version: u64,
    drain_started: Option<Instant>,
    capacity: Option<Capacity>,
    last_report: HostReport,
    started_ms: u64,
    status: Arc<Mutex<serde_json::Value>>,
}

/// Runs the master until `shutdown` is cancelled or SIGTERM/SIGINT arrives, then drains:
/// slots finish their batch within `drain_timeout`, the host is deregistered.
pub async fn run(opts: MasterOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Bind before anything starts, so a port in use fails the start, not a tick later.
    let listener = tokio::net::TcpListener::bind(opts.config.master.http)
        .await
        .with_context(|| format!("binding [master].http {}", opts.config.master.http))?;
    let metrics = crate::http::install_metrics();
    // Installed before the wait for Redis, so a stop or reload meanwhile is not fatal.
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;
    // A host may boot before Redis is back: wait for it rather than exit.
    let connect = QueueClient::connect_patiently(
        &opts.redis_url,
        &opts.config.cluster.namespace,
        &opts.connect,
    );
    let client = tokio::select! {
        r = connect => r.with_context(|| {
            format!(
                "connecting to {}",
                crate::queue_client::redacted(&opts.redis_url)
            )
        })?,
        _ = sigterm.recv() => return Ok(()),
        _ = sigint.recv() => return Ok(()),
        () = shutdown.cancelled() => return Ok(()),
    };

    let (report_sock, report_peer) = StdDatagram::pair().context("creating the slot socket")?;
    report_sock.set_nonblocking(true)?;
    let report_sock = UnixDatagram::from_std(report_sock)?;
    let (tx, mut rx) = mpsc::unbounded_channel();

    let status = Arc::new(Mutex::new(serde_json::json!({})));
    let http_status = status.clone();
    let http_shutdown = CancellationToken::new();
    let http = tokio::spawn(crate::http::serve(
        listener,
        crate::http::Routes {
            metrics: Some(metrics),
            status: Arc::new(move || http_status.lock().map(|s| s.clone()).unwrap_or_default()),
        },
        http_shutdown.clone(),
    ));

    let mut m = Master {
        keys: Keys::new(&opts.config.cluster.namespace),
        cfg: opts.config.clone(),
        conn: client.connection(),
        events: tx,
        report_peer,
        zygotes: BTreeMap::new(),
        generation: 0,
        zygote_failures: 0,
        zygote_restart_at: None,
        slots: BTreeMap::new(),
        next_slot: 1,
        queues: BTreeMap::new(),
        map: None,
        max_epoch: 0,
        outage: OutageLog::default(),
        draining: false,
        drained: false,
        config_version: 0,
        drain_started: None,
        capacity: None,
        last_report: HostReport::default(),
        started_ms: cluster::now_ms(),
        status,
        opts,
    };
    tracing::info!(host = %m.opts.host, http = %m.cfg.master.http, queues = m.cfg.queues.len(), "master starting");
    telemetry::queues_known(m.cfg.queues.keys());
    m.start_zygote().await?;

    let mut tick = tokio::time::interval(m.opts.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let watchdog = sd_notify::watchdog_enabled();
    let mut notified_ready = false;
    let mut buf = vec![0u8; 64 * 1024];
    let mut shutdowns = 0u32;
    // /status follows events within this delay instead of waiting for the next tick,
    // without rebuilding the document for every datagram of a busy host.
    let mut refresh_at: Option<tokio::time::Instant> = None;

    loop {
        let event = tokio::select! {
            _ = tick.tick() => Event::Tick,
            Some(ev) = rx.recv() => ev,
            r = report_sock.recv(&mut buf) => match r {
                Ok(n) => match serde_json::from_slice(&buf[..n]) {
                    Ok(ev) => Event::Slot(ev),
                    Err(e) => { tracing::warn!(error = %e, "unreadable slot report"); continue; }
                },
                Err(e) => { tracing::warn!(error = %e, "slot socket"); continue; }
            },
            _ = sigterm.recv() => Event::Shutdown,
            _ = sigint.recv() => Event::Shutdown,
            () = shutdown.cancelled(), if !m.draining => Event::Shutdown,
            _ = sighup.recv() => Event::Reload,
            () = sleep_until(refresh_at), if refresh_at.is_some() => Event::RefreshStatus,
        };
        if matches!(
            event,
            Event::Slot(_) | Event::Zygote(..) | Event::ZygoteGone(_)
        ) && refresh_at.is_none()
        {
            refresh_at = Some(tokio::time::Instant::now() + STATUS_REFRESH);
        }
        match event {
            Event::RefreshStatus => {
                refresh_at = None;
                let report = m.host_report();
                m.publish_status(&report);
            }
            Event::Tick => {
                refresh_at = None;
                m.tick().await;
                if !notified_ready && m.zygotes.get(&m.generation).is_some_and(|z| z.ready) {
                    notified_ready = true;
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
                }
                if watchdog.is_some() {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                }
            }
            Event::Zygote(generation, ev) => m.zygote_event(generation, ev).await,
            Event::ZygoteGone(generation) => m.zygote_gone(generation),
            Event::Slot(ev) => m.slot_event(ev),
            Event::Reload => m.reload().await,
            Event::Shutdown => {
                shutdowns += 1;
                if shutdowns == 1 {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                    m.start_drain().await;
                } else {
                    tracing::warn!("second stop request: killing slots now");
                    m.kill_all();
                }
            }
        }
        if m.draining && m.slots.is_empty() {
            break;
        }
    }

    m.finish().await;
    http_shutdown.cancel();
    let _ = http.await;
    tracing::info!(host = %m.opts.host, "master stopped");
    Ok(())
}

impl Master {
    async fn start_zygote(&mut self) -> anyhow::Result<()> {
        self.generation += 1;
        let generation = self.generation;
        let queues: BTreeMap<String, QueueConfig> = self
            .cfg
            .queues
            .iter()
            .filter(|(_, q)| self.opts.registry.supports(q))
            .map(|(n, q)| (n.clone(), q.clone()))
            .collect();
        let peer_fd = self.report_peer.as_raw_fd();
        let mut cmd = tokio::process::Command::new(&self.opts.zygote_exe);
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
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting the zygote {}", self.opts.zygote_exe.display()))?;
        let pid = child.id().unwrap_or(0);
        let mut stdin = child.stdin.take().context("zygote stdin")?;
        let stdout = child.stdout.take().context("zygote stdout")?;
        let init = ZygoteInit {
            config: self.opts.config_source.clone(),
            origin: self.cfg.origin.clone(),
            queues: queues.keys().cloned().collect(),
            redis_url: self.opts.redis_url.clone(),
            password: self.opts.connect.password.clone(),
            host: self.opts.host.clone(),
        };
        let mut line = serde_json::to_vec(&init)?;
        line.push(b'\n');
        stdin
            .write_all(&line)
            .await
            .context("writing to the zygote")?;
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
        tracing::info!(generation, pid, queues = queues.len(), "zygote started");
        self.zygotes.insert(
            generation,
            ZygoteProc {
                child,
                stdin: Some(stdin),
                pid,
                ready: false,
                preloaded: BTreeSet::new(),
                queues,
            },
        );
        Ok(())
    }

    async fn zygote_event(&mut self, generation: u64, ev: ZygoteEvent) {
        match ev {
            ZygoteEvent::Ready {
                pid,
                preloaded,
                failed,
            } => {
                for (queue, error) in &failed {
                    tracing::error!(
                        generation,
                        queue,
                        error,
                        "preload failed; no slots for this queue"
                    );
                }
                if let Some(z) = self.zygotes.get_mut(&generation) {
                    z.ready = true;
                    z.pid = pid;
                    z.preloaded = preloaded.into_iter().collect();
                }
                self.zygote_failures = 0;
                tracing::info!(generation, pid, "zygote ready");
                self.reconcile().await;
            }
            ZygoteEvent::Spawned { slot, pid } => {
                if let Some(s) = self.slots.get_mut(&slot) {
                    s.pid = Some(pid);
                    if s.state == SlotState::Spawning {
                        s.state = SlotState::Starting;
                    } else if s.state == SlotState::Stopping {
                        signal_pid(pid, Signal::SIGTERM);
                    }
                    telemetry::slot_started(&s.queue, slot, pid);
                }
            }
            ZygoteEvent::SpawnFailed { slot, error } => {
                if let Some(s) = self.slots.remove(&slot) {
                    tracing::error!(queue = %s.queue, slot, error, "slot could not be forked");
                    self.crashed(&s.queue);
                }
            }
            ZygoteEvent::Exited {
                slot,
                pid,
                code,
                signal,
            } => {
                let Some(s) = self.slots.remove(&slot) else {
                    return;
                };
                let lived = s.spawned_at.elapsed();
                let q = self.queues.entry(s.queue.clone()).or_default();
                q.report.slot_lifetime_seconds_total += lived.as_secs_f64();
                let exit = if s.hung {
                    Exit::Hung
                } else if code == Some(EXIT_RECYCLE) {
                    q.report.recycles_total += 1;
                    Exit::Recycled
                } else if s.state == SlotState::Stopping || code == Some(EXIT_STOPPED) {
                    Exit::Stopped
                } else {
                    Exit::Crashed
                };
                telemetry::slot_exited(
                    &s.queue,
                    slot,
                    pid,
                    code,
                    signal,
                    exit,
                    lived,
                    s.exit_reason.as_deref(),
                );
                if exit == Exit::Crashed {
                    self.crashed(&s.queue);
                }
                self.retire_idle_zygotes();
                self.reconcile().await;
            }
        }
    }

    fn crashed(&mut self, queue: &str) {
        let q = self.queues.entry(queue.to_owned()).or_default();
        q.report.crashes_total += 1;
        q.consecutive_crashes += 1;
        // The first crash restarts at once; repeats back off, doubling.
        if q.consecutive_crashes > 1 {
            let exp = (q.consecutive_crashes - 2).min(16);
            let delay = (Duration::from_millis(500) * 2u32.pow(exp)).min(MAX_CRASH_BACKOFF);
            q.next_start = Some(Instant::now() + delay);
            tracing::warn!(queue, crashes = q.consecutive_crashes, delay = ?delay, "slots keep crashing; backing off");
        }
    }

    fn zygote_gone(&mut self, generation: u64) {
        let Some(mut z) = self.zygotes.remove(&generation) else {
            return;
        };
        let status = z.child.try_wait().ok().flatten();
        // Its slots died with it (PDEATHSIG); they will never be reported.
        let orphans: Vec<u32> = self
            .slots
            .iter()
            .filter(|(_, s)| s.generation == generation)
            .map(|(&n, _)| n)
            .collect();
        for n in orphans {
            if let Some(s) = self.slots.remove(&n) {
                // Normally gone already; make sure, since nobody will reap it otherwise.
                if let Some(pid) = s.pid {
                    signal_pid(pid, Signal::SIGKILL);
                }
                if s.state != SlotState::Stopping {
                    self.crashed(&s.queue);
                }
            }
        }
        if generation == self.generation && !self.draining {
            self.zygote_failures += 1;
            let delay = (Duration::from_secs(1) * 2u32.pow(self.zygote_failures.min(5) - 1))
                .min(MAX_ZYGOTE_BACKOFF);
            tracing::error!(generation, ?status, restart_in = ?delay, "zygote exited");
            self.zygote_restart_at = Some(Instant::now() + delay);
        } else {
            tracing::info!(generation, ?status, "retired zygote exited");
        }
    }

    /// Closes the stdin of old zygotes that have no slots left: they exit by themselves.
    fn retire_idle_zygotes(&mut self) {
        for (&generation, z) in &mut self.zygotes {
            let busy = self.slots.values().any(|s| s.generation == generation);
            if (generation != self.generation || self.draining) && !busy && z.stdin.is_some() {
                z.stdin = None;
            }
        }
    }

    fn slot_event(&mut self, ev: SlotEvent) {
        let pid = ev.pid();
        let (slot, now) = match &ev {
            SlotEvent::Ready { slot, .. }
            | SlotEvent::BatchStarted { slot, .. }
            | SlotEvent::Progress { slot, .. }
            | SlotEvent::BatchDone { slot, .. }
            | SlotEvent::Exiting { slot, .. } => (*slot, Instant::now()),
        };
        let Some(s) = self.slots.get_mut(&slot) else {
            return;
        };
        if s.pid.is_some_and(|p| p != pid) {
            return;
        }
        s.last_progress = now;
        let stopping = s.state == SlotState::Stopping;
        match ev {
            SlotEvent::Ready { .. } => {
                s.ready_after = Some(now - s.spawned_at);
                if !stopping {
                    s.state = SlotState::Idle;
                }
            }
            SlotEvent::BatchStarted { .. } if !stopping => s.state = SlotState::Busy,
            SlotEvent::BatchDone {
                tasks,
                failed,
                busy_ms,
                stale,
                ..
            } => {
                if !stopping {
                    s.state = SlotState::Idle;
                }
                s.batches += 1;
                let queue = s.queue.clone();
                let q = self.queues.entry(queue.clone()).or_default();
                q.report.processed_total += u64::from(tasks);
                q.report.failed_total += u64::from(failed);
                q.report.batches_total += 1;
                q.report.busy_seconds_total += busy_ms as f64 / 1000.0;
                q.stale_total += u64::from(stale);
                q.consecutive_crashes = 0;
                q.next_start = None;
                telemetry::batch_done(&queue, tasks, failed, busy_ms, stale);
            }
            SlotEvent::Exiting { reason, .. } => s.exit_reason = Some(reason),
            _ => {}
        }
    }

    async fn tick(&mut self) {
        if let Some(at) = self.zygote_restart_at
            && Instant::now() >= at
            && !self.draining
        {
            self.zygote_restart_at = None;
            if let Err(e) = self.start_zygote().await {
                tracing::error!(error = %e, "restarting the zygote failed");
                self.zygote_failures += 1;
                self.zygote_restart_at = Some(Instant::now() + MAX_ZYGOTE_BACKOFF);
            }
        }
        self.read_map().await;
        self.read_cluster_state().await;
        self.measure();
        self.watchdog();
        self.reconcile().await;
        self.report().await;
    }

    async fn read_map(&mut self) {
        let read = cluster::read_map(&mut self.conn, &self.keys).await;
        if read.is_ok() {
            self.outage.answered();
        }
        match read {
            Ok(Some(map)) if map.epoch < self.max_epoch => {
                tracing::warn!(
                    epoch = map.epoch,
                    highest = self.max_epoch,
                    "ignoring a slot map from a stale manager"
                );
            }
            Ok(Some(map)) => {
                if self
                    .map
                    .as_ref()
                    .is_none_or(|m| m.version != map.version || m.epoch != map.epoch)
                {
                    tracing::info!(
                        epoch = map.epoch,
                        version = map.version,
                        slots = map.for_host(&self.opts.host).values().sum::<u32>(),
                        "new slot map"
                    );
                }
                self.max_epoch = map.epoch;
                self.map = Some(map);
            }
            Ok(None) => {}
            Err(e) => self.outage.failed("reading the slot map failed", &e),
        }
    }

    /// Operator requests that reach the master through Redis: a drain of this host, a
    /// config published with `gaffer config apply`.
    async fn read_cluster_state(&mut self) {
        use redis::AsyncCommands;
        match self
            .conn
            .sismember::<_, _, bool>(self.keys.draining(), &self.opts.host)
            .await
        {
            Ok(drained) if drained != self.drained => {
                tracing::info!(host = %self.opts.host, drained, "operator drain changed");
                self.drained = drained;
            }
            Ok(_) => {}
            Err(e) => self
                .outage
                .failed("reading the drain set failed", &e.into()),
        }
        let custom = self.opts.registry.custom_names();
        match cluster::newer_config(&mut self.conn, &self.keys, self.config_version, &custom).await
        {
            Ok(Some((version, parsed))) => {
                // Marked seen either way: a config this binary refuses stays refused.
                self.config_version = version;
                match parsed {
                    Ok((cfg, source)) => {
                        tracing::info!(version, "adopting the published config");
                        self.adopt(cfg, source).await;
                    }
                    Err(e) => {
                        tracing::error!(version, error = %e, "cannot adopt the published config");
                    }
                }
            }
            Ok(None) => {}
            Err(e) => self
                .outage
                .failed("reading the published config failed", &e),
        }
    }

    fn pids(&self) -> Vec<u32> {
        let mut pids = vec![std::process::id()];
        pids.extend(self.zygotes.values().map(|z| z.pid).filter(|&p| p != 0));
        pids.extend(self.slots.values().filter_map(|s| s.pid));
        pids
    }

    fn measure(&mut self) {
        let pss_total: u64 = self
            .pids()
            .into_iter()
            .filter_map(|pid| match sysinfo::pss(pid) {
                Ok(pss) => Some(pss),
                // A slot that just exited has no smaps_rollup: normal, and gone next tick.
                Err(sysinfo::SysinfoError::Read { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    None
                }
                Err(e) => {
                    // Anything else (no CAP_SYS_PTRACE over a slot of another user) leaves
                    // that slot out of the budget for as long as it lasts: say so, once.
                    static WARNED: std::sync::atomic::AtomicBool =
                        std::sync::atomic::AtomicBool::new(false);
                    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::warn!(pid, error = %e, "cannot measure a slot's PSS; the memory budget leaves it out");
                    }
                    None
                }
            })
            .sum();
        let (limit, usage) = sysinfo::cgroup_memory()
            .ok()
            .flatten()
            .map_or((None, None), |(l, u)| (Some(l), Some(u)));
        let input = CapacityInput {
            pss_total,
            slots: self.slots.values().filter(|s| s.pid.is_some()).count() as u32,
            mem_available: sysinfo::mem_available().unwrap_or(0),
            cgroup_limit: limit,
            cgroup_usage: usage,
            reserve: self.cfg.master.memory_reserve,
            slot_estimate: self.cfg.master.slot_estimate,
            load1: sysinfo::load1().unwrap_or(0.0),
            cpus: sysinfo::cpus().unwrap_or(1),
            max_load_per_cpu: self.opts.max_load_per_cpu,
            max_slots: self.cfg.master.max_slots,
        };
        let cap = capacity::capacity(&input);
        self.last_report.pss_bytes = pss_total;
        self.last_report.mem_available_bytes = cap.available;
        self.last_report.memory_budget_bytes = cap.budget;
        self.last_report.load1 = input.load1;
        self.last_report.cpus = input.cpus;
        self.last_report.capacity = cap.slots;
        self.capacity = Some(cap);
    }

    fn watchdog(&mut self) {
        let now = Instant::now();
        for (&n, s) in &mut self.slots {
            let Some(pid) = s.pid else { continue };
            let limit = self
                .cfg
                .queues
                .get(&s.queue)
                .map_or(Duration::from_secs(600), |q| q.max_batch_time);
            match s.state {
                SlotState::Busy | SlotState::Starting
                    if !s.hung && now - s.last_progress > limit =>
                {
                    s.hung = true;
                    let q = self.queues.entry(s.queue.clone()).or_default();
                    q.report.hung_total += 1;
                    tracing::warn!(queue = %s.queue, slot = n, pid, state = ?s.state,
                        silent = ?(now - s.last_progress), max_batch_time = ?limit,
                        "slot hung; killing it");
                    signal_pid(pid, Signal::SIGKILL);
                }
                SlotState::Stopping if s.stop_deadline.is_some_and(|d| now >= d) => {
                    tracing::warn!(queue = %s.queue, slot = n, pid, "slot did not stop in time; killing it");
                    s.stop_deadline = None;
                    signal_pid(pid, Signal::SIGKILL);
                }
                _ => {}
            }
        }
    }

    /// This host's wanted slots per queue: the map's part, limited to queues this host
    /// can run.
    fn wanted(&self) -> BTreeMap<String, u32> {
        if self.draining || self.drained {
            return BTreeMap::new();
        }
        let Some(map) = &self.map else {
            return BTreeMap::new();
        };
        map.for_host(&self.opts.host)
            .into_iter()
            .filter(|(q, n)| {
                *n > 0
                    && self
                        .cfg
                        .queues
                        .get(q)
                        .is_some_and(|c| self.opts.registry.supports(c))
            })
            .collect()
    }

    async fn reconcile(&mut self) {
        let wanted = self.wanted();
        let now = Instant::now();

        // Surplus first, so capacity frees up: idle slots go before busy ones, the
        // youngest before the oldest. Once a new zygote is ready, the slots of older ones
        // are rolled over onto it (stopped gracefully, restarted from the new one).
        let new_ready = self.zygotes.get(&self.generation).is_some_and(|z| z.ready);
        let mut running: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (&n, s) in &self.slots {
            if s.state != SlotState::Stopping {
                running.entry(s.queue.clone()).or_default().push(n);
            }
        }
        let mut stop = Vec::new();
        for (queue, slots) in &mut running {
            let want = wanted.get(queue).copied().unwrap_or(0) as usize;
            if new_ready {
                stop.extend(
                    slots
                        .iter()
                        .filter(|n| self.slots[n].generation != self.generation),
                );
                slots.retain(|n| self.slots[n].generation == self.generation);
            }
            slots.sort_by_key(|n| {
                let s = &self.slots[n];
                let rank = match s.state {
                    SlotState::Idle => 0,
                    SlotState::Spawning | SlotState::Starting => 1,
                    SlotState::Busy | SlotState::Stopping => 2,
                };
                (rank, std::cmp::Reverse(s.spawned_at))
            });
            let surplus = slots.len().saturating_sub(want);
            stop.extend(slots.drain(..surplus));
        }
        let drain_timeout = self.cfg.master.drain_timeout;
        for n in stop {
            if let Some(s) = self.slots.get_mut(&n) {
                s.state = SlotState::Stopping;
                s.stop_deadline = Some(now + drain_timeout);
                if let Some(pid) = s.pid {
                    signal_pid(pid, Signal::SIGTERM);
                }
            }
        }

        let Some(zygote) = self.zygotes.get(&self.generation) else {
            return;
        };
        if !zygote.ready || zygote.stdin.is_none() {
            return;
        }
        let capacity = self.capacity.as_ref().map_or(u32::MAX, |c| c.slots) as usize;
        let mut total = self
            .slots
            .values()
            .filter(|s| s.state != SlotState::Stopping)
            .count();
        let mut order: Vec<(&String, &u32)> = wanted.iter().collect();
        order.sort_by_key(|(q, _)| {
            std::cmp::Reverse(self.cfg.queues.get(*q).map_or(0, |c| c.priority))
        });
        let mut requests = Vec::new();
        for (queue, &want) in order {
            if !zygote.preloaded.contains(queue) {
                continue;
            }
            let state = self.queues.get(queue);
            if state.and_then(|q| q.next_start).is_some_and(|t| now < t) {
                continue;
            }
            let have = running.get(queue).map_or(0, Vec::len);
            for _ in have..want as usize {
                if total >= capacity {
                    break;
                }
                total += 1;
                requests.push(queue.clone());
            }
        }
        for queue in requests {
            let slot = self.next_slot;
            self.next_slot = self.next_slot.wrapping_add(1).max(1);
            let req = ZygoteRequest::Spawn {
                queue: queue.clone(),
                slot,
            };
            let Ok(mut line) = serde_json::to_vec(&req) else {
                continue;
            };
            line.push(b'\n');
            let Some(stdin) = self
                .zygotes
                .get_mut(&self.generation)
                .and_then(|z| z.stdin.as_mut())
            else {
                return;
            };
            if let Err(e) = stdin.write_all(&line).await {
                tracing::error!(error = %e, "writing to the zygote failed");
                return;
            }
            self.slots.insert(
                slot,
                SlotProc {
                    queue,
                    generation: self.generation,
                    pid: None,
                    state: SlotState::Spawning,
                    spawned_at: now,
                    last_progress: now,
                    stop_deadline: None,
                    hung: false,
                    batches: 0,
                    exit_reason: None,
                    ready_after: None,
                },
            );
        }
    }

    fn host_report(&mut self) -> HostReport {
        let now = Instant::now();
        let wanted = self.wanted();
        let mut queues: BTreeMap<String, QueueReport> = BTreeMap::new();
        for (name, q) in &self.queues {
            queues.insert(name.clone(), q.report.clone());
        }
        for s in self.slots.values() {
            let r = queues.entry(s.queue.clone()).or_default();
            if s.state != SlotState::Stopping {
                r.slots += 1;
            }
            // Running slots count their life so far, so load is right before they exit.
            r.slot_lifetime_seconds_total += (now - s.spawned_at).as_secs_f64();
        }
        for (name, &n) in &wanted {
            queues.entry(name.clone()).or_default().wanted = n;
        }
        let mut r = self.last_report.clone();
        r.host = self.opts.host.clone();
        r.pid = std::process::id();
        r.started_ms = self.started_ms;
        r.ts_ms = cluster::now_ms();
        r.draining = self.draining || self.drained;
        r.slots = self.slots.len() as u32;
        r.handlers = self.opts.registry.names();
        r.map_version = self.map.as_ref().map_or(0, |m| m.version);
        r.queues = queues;
        r
    }

    async fn report(&mut self) {
        let report = self.host_report();
        telemetry::host_gauges(&report);
        self.publish_status(&report);
        match cluster::publish_host(&mut self.conn, &self.keys, &report).await {
            Ok(()) => self.outage.answered(),
            Err(e) => self.outage.failed("publishing the host report failed", &e),
        }
        self.last_report = report;
    }

    fn publish_status(&self, report: &HostReport) {
        let now = Instant::now();
        let status = Status {
            host: report,
            capacity: &self.capacity,
            zygote_pids: self.zygotes.values().map(|z| z.pid).collect(),
            slots: self
                .slots
                .iter()
                .map(|(&slot, s)| SlotStatus {
                    slot,
                    queue: &s.queue,
                    pid: s.pid,
                    state: s.state,
                    generation: s.generation,
                    batches: s.batches,
                    age_seconds: (now - s.spawned_at).as_secs_f64(),
                    ready_ms: s.ready_after.map(|d| d.as_secs_f64() * 1000.0),
                })
                .collect(),
        };
        if let (Ok(v), Ok(mut slot)) = (serde_json::to_value(&status), self.status.lock()) {
            *slot = v;
        }
    }

    async fn reload(&mut self) {
        let Some(path) = self.opts.config_path.clone() else {
            tracing::warn!("SIGHUP: no config file to re-read");
            return;
        };
        let source = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "SIGHUP: cannot read the config; keeping the old one");
                return;
            }
        };
        let origin = path.display().to_string();
        match crate::config::parse_with(&source, &origin, &self.opts.registry.custom_names()) {
            Ok(cfg) => self.adopt(cfg, source).await,
            Err(e) => tracing::error!(error = %e, "SIGHUP: invalid config; keeping the old one"),
        }
    }

    /// Takes a new config. Queue changes need a new zygote (it holds the queue configs
    /// and the preloaded data); the old one's slots are rolled over and it retires.
    async fn adopt(&mut self, cfg: Config, source: String) {
        let supported: BTreeMap<String, QueueConfig> = cfg
            .queues
            .iter()
            .filter(|(_, q)| self.opts.registry.supports(q))
            .map(|(n, q)| (n.clone(), q.clone()))
            .collect();
        let same = self
            .zygotes
            .get(&self.generation)
            .is_some_and(|z| z.queues == supported);
        telemetry::queues_known(cfg.queues.keys());
        self.cfg = cfg.clone();
        self.opts.config = cfg;
        self.opts.config_source = source;
        if same {
            tracing::info!("config reloaded; queues unchanged");
            return;
        }
        tracing::info!("config reloaded; queues changed, replacing the zygote");
        if let Err(e) = self.start_zygote().await {
            tracing::error!(error = %e, "starting the new zygote failed");
            self.zygote_restart_at = Some(Instant::now() + Duration::from_secs(1));
        }
        self.retire_idle_zygotes();
    }

    async fn start_drain(&mut self) {
        self.draining = true;
        self.drain_started = Some(Instant::now());
        tracing::info!(host = %self.opts.host, slots = self.slots.len(),
            drain_timeout = ?self.cfg.master.drain_timeout, "draining");
        self.reconcile().await;
        self.retire_idle_zygotes();
        self.report().await;
    }

    fn kill_all(&mut self) {
        for s in self.slots.values_mut() {
            if let Some(pid) = s.pid {
                signal_pid(pid, Signal::SIGKILL);
            }
            s.state = SlotState::Stopping;
        }
    }

    async fn finish(&mut self) {
        self.retire_idle_zygotes();
        for (generation, z) in &mut self.zygotes {
            z.stdin = None;
            match tokio::time::timeout(Duration::from_secs(5), z.child.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(generation, "zygote did not exit; killing it");
                    let _ = z.child.kill().await;
                }
            }
        }
        if let Err(e) = cluster::deregister_host(&mut self.conn, &self.keys, &self.opts.host).await
        {
            tracing::warn!(error = %e, "deregistering the host failed");
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn signal_pid(pid: u32, sig: Signal) {
    if pid > 1 {
        match kill(Pid::from_raw(pid as i32), sig) {
            // Already gone: its exit is on its way to us.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            // EPERM: a slot of another user without CAP_KILL; it will not stop.
            Err(e) => tracing::warn!(pid, signal = %sig, error = %e, "cannot signal a slot"),
        }
    }
}
