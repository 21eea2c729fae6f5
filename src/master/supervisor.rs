//! The master's loop and the state it owns, in named parts: its Redis link, what the
//! cluster asks of it, its zygotes ([`super::zygotes`]), its slots ([`super::slots`]),
//! what it measures and reports ([`super::report`]).
//!
//! The loop is one biased `select!`: stop, hurry, zygote events, slot datagrams, then the
//! tick, so a tick that waited on Redis never holds exits back. The slots' datagrams are
//! read every [`REPORTS_EVERY`] (sooner after a full read) and before every other event,
//! never woken by each: what a slot said before it exited is read before its exit.
//!
//! `Master` is in named parts: `redis`, `orders` from the cluster (an operator's drain is
//! `orders.drain_requested`), `zygotes`, `slots`, `reporting`, `stopping`. Every tick (1 s)
//! it publishes its host report and reads the map, the operator's drain set and any config
//! published with `config apply` (`RedisLink::fetch_orders`, cut short by a stop, then
//! `apply_orders`). A config reload comes as the edge's `Reload`.
//!
//! A stop honours `drain_timeout` whatever Redis does (ARCHITECTURE.md, invariant 30): a
//! stopping master follows no map and reads nothing, each Redis call waits at most
//! [`STOPPING_REDIS_WAIT`], a stop cuts short the tick in progress, and `hurry` (a second
//! request) kills the slots.

use std::os::unix::net::UnixDatagram as StdDatagram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::MasterOptions;
use super::report::Reporting;
use super::slots::Slots;
use super::telemetry;
use super::zygote::ZygoteEvent;
use super::zygotes::Zygotes;
use crate::cluster::{self, Keys, SlotMap};
use crate::config::Config;
use crate::queue_client::{OutageLog, QueueClient, QueueError, RedisConn};

/// How often the slots' datagrams are read. They are read on a tick, not as they arrive:
/// a master woken by each one cost a busy slot a twentieth of its time in the kernel's
/// wake-ups, and the master as much again.
const REPORTS_EVERY: Duration = Duration::from_millis(10);
/// The read after one that found at least [`REPORTS_BUSY`] datagrams comes this soon: the
/// slots share one socket, whose send buffer holds about 280 datagrams (Linux's default
/// 208 KiB), and one sent to a full socket is dropped (the protocol is best effort), so a
/// host of fast batch-of-one slots is read often enough to lose none.
const REPORTS_SOON: Duration = Duration::from_millis(1);
/// See [`REPORTS_SOON`].
const REPORTS_BUSY: usize = 32;
/// How stale `/status` may get behind slot and zygote events.
const STATUS_REFRESH: Duration = Duration::from_millis(20);
/// How long a stopping master waits on one Redis call (the draining report, the
/// deregistration). One loop owns everything, so a call that waits out an outage holds
/// back the slots' exits and the kills after `drain_timeout`: stopping, Redis is best
/// effort.
pub(super) const STOPPING_REDIS_WAIT: Duration = Duration::from_secs(1);

/// Everything the loop reacts to.
pub(super) enum Event {
    /// Measure, reconcile, watchdog, report.
    Tick,
    /// A line from a zygote.
    Zygote(u64, ZygoteEvent),
    /// A zygote's stdout closed: it exited.
    ZygoteGone(u64),
    /// Time to read the slots' datagrams.
    ReportsTick,
    /// The caller's shutdown token: drain and stop.
    Stop,
    /// A second stop request: kill the slots now.
    Hurry,
    /// A reload request (SIGHUP at the edge): re-read the config file.
    Reload,
    /// Slot or zygote events changed the state since `/status` was last rebuilt.
    RefreshStatus,
}

/// The master's state; one loop owns it all.
pub(super) struct Master {
    /// What the master was started with; `config` and `config_source` follow every config
    /// adopted since (SIGHUP, `gaffer config apply`).
    pub(super) opts: MasterOptions,
    /// Redis: the connection, the keys, outages.
    pub(super) redis: RedisLink,
    /// What the cluster asks of this host: the map, an operator drain, a published config.
    pub(super) orders: Orders,
    /// The zygotes: the current one and those retiring.
    pub(super) zygotes: Zygotes,
    /// The slots, and what is counted per queue.
    pub(super) slots: Slots,
    /// Queues of a newer layout than this master's, which it runs no slot for.
    pub(super) layouts: super::layouts::Layouts,
    /// What is measured and reported.
    pub(super) reporting: Reporting,
    /// Stopping (the caller's shutdown token): no slot is wanted any more, and the loop
    /// ends once the last one is gone. Not to be confused with an operator's drain
    /// ([`Orders::drain_requested`]), after which the master stays up.
    pub(super) stopping: bool,
}

/// The master's way into Redis.
pub(super) struct RedisLink {
    /// The connection every read and report goes through.
    pub(super) conn: RedisConn,
    /// The client it came from: which Redis node it talks to.
    pub(super) client: QueueClient,
    /// The cluster's keys in this namespace.
    pub(super) keys: Keys,
    /// Redis outages, logged as spells.
    pub(super) outage: OutageLog,
}

/// One tick's reads of what the cluster asks, each with its own outcome.
struct Fetched {
    /// The slot map.
    map: Result<Option<SlotMap>, QueueError>,
    /// Whether an operator drains this host.
    drained: Result<bool, QueueError>,
    /// The published config, and whether its text is another than the one read last.
    published: Result<cluster::ConfigRead, QueueError>,
}

impl RedisLink {
    /// Reads the map, the operator's drain set and the published config (compared with
    /// `config_seen`); changes nothing, so a caller may drop it half done.
    async fn fetch_orders(
        &mut self,
        host: &str,
        config_seen: &cluster::ConfigSeen,
        custom: &[String],
    ) -> Fetched {
        use redis::AsyncCommands;
        let map = cluster::read_map(&mut self.conn, &self.keys).await;
        let drained = self
            .conn
            .sismember::<_, _, bool>(self.keys.draining(), host)
            .await
            .map_err(QueueError::from);
        let published =
            cluster::changed_config(&mut self.conn, &self.keys, config_seen, custom).await;
        Fetched {
            map,
            drained,
            published,
        }
    }
}

/// What the cluster asks of this host, as last read from Redis.
pub(super) struct Orders {
    /// The newest slot map read; this host's part of it is what the slots follow.
    pub(super) map: Option<SlotMap>,
    /// The highest manager epoch seen: a map of a lower one is a stale manager's, and one
    /// of this epoch older than `map` was lost by Redis (ARCHITECTURE.md, invariant 19).
    pub(super) max_epoch: u64,
    /// `gaffer drain HOST`: no slots here, but the master stays up and reporting.
    pub(super) drain_requested: bool,
    /// The config published with `gaffer config apply` that was read last, adopted or
    /// not: one with another text is adopted, whatever its version.
    pub(super) config_seen: cluster::ConfigSeen,
    /// Whether the config running is a published one (else the file's).
    pub(super) runs_published: bool,
}

/// The loop's own bookkeeping, beside the master's state.
struct LoopState {
    /// systemd watches this service: ping it every tick.
    watchdog: bool,
    /// systemd was told the master is ready (once the first zygote is).
    notified_ready: bool,
    /// When to rebuild `/status` after events. It follows events within
    /// [`STATUS_REFRESH`] instead of waiting for the next tick, without rebuilding the
    /// document for every datagram of a busy host.
    refresh_at: Option<tokio::time::Instant>,
    /// The slots were killed on a second stop request; once is enough.
    hurried: bool,
}

/// Runs the master until `shutdown` is cancelled, then drains: slots finish the task in hand (the rest of their batch goes back)
/// within `drain_timeout` (or at once after `opts.hurry`), the host is deregistered.
pub async fn run(opts: MasterOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Bind before anything starts, so a port in use fails the start, not a tick later.
    let listener = tokio::net::TcpListener::bind(opts.config.master.http)
        .await
        .with_context(|| format!("binding [master].http {}", opts.config.master.http))?;
    let metrics = crate::http::install_metrics();
    // A host may boot before Redis is back: wait for it.
    let ns = &opts.config.cluster.namespace;
    let connect = QueueClient::connect_or_stop(&opts.redis_url, ns, &opts.connect, &shutdown);
    let Some(client) = connect.await? else {
        return Ok(());
    };
    crate::queue_client::check_settle_commands(&client).await?;

    let (report_sock, report_peer) = StdDatagram::pair().context("creating the slot socket")?;
    report_sock.set_nonblocking(true)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let status = Arc::new(Mutex::new(serde_json::json!({})));
    let (http, http_shutdown) = serve_http(listener, metrics, status.clone(), client.clone());

    let mut m = Master::new(opts, &client, tx, report_peer, status);
    let cfg = &m.opts.config;
    tracing::info!(host = %m.opts.host, http = %cfg.master.http, queues = cfg.queues.len(), "master starting");
    telemetry::queues_known(cfg.queues.keys());
    m.start_zygote().await?;
    event_loop(&mut m, rx, report_sock, &shutdown).await;

    m.finish().await;
    http_shutdown.cancel();
    let _ = http.await;
    tracing::info!(host = %m.opts.host, "master stopped");
    Ok(())
}

/// Serves `/metrics` and `/status` until the returned token is cancelled. `/status` is
/// the document the ticks rewrite, with the Redis node `client` talks to as of the
/// request.
fn serve_http(
    listener: tokio::net::TcpListener,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    status: Arc<Mutex<serde_json::Value>>,
    client: QueueClient,
) -> (JoinHandle<std::io::Result<()>>, CancellationToken) {
    let http_shutdown = CancellationToken::new();
    let http = tokio::spawn(crate::http::serve(
        listener,
        crate::http::Routes {
            metrics: Some(metrics),
            status: crate::http::status_with_redis(status, client),
        },
        http_shutdown.clone(),
    ));
    (http, http_shutdown)
}

/// The loop: one event at a time, until a drain has seen the last slot go.
async fn event_loop(
    m: &mut Master,
    mut rx: mpsc::UnboundedReceiver<Event>,
    report_sock: StdDatagram,
    shutdown: &CancellationToken,
) {
    let mut tick = tokio::time::interval(m.opts.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_read = tokio::time::Instant::now() + REPORTS_EVERY;
    let mut reports = Reports {
        sock: report_sock,
        buf: vec![0u8; 64 * 1024],
    };
    let mut lp = LoopState {
        watchdog: sd_notify::watchdog_enabled().is_some(),
        notified_ready: false,
        refresh_at: None,
        hurried: false,
    };
    let (hurry, reload) = (m.opts.hurry.clone(), m.opts.reload.clone());
    loop {
        // In order, not at random: a tick that waited on Redis (up to a second each while
        // stopping, longer otherwise) finds the next one due at once, and at random it would
        // win over every branch listed after it, holding slot exits back by many seconds.
        // The tick is due once a second, so it cannot starve what comes after it.
        let event = tokio::select! {
            biased;
            () = shutdown.cancelled(), if !m.stopping => Event::Stop,
            () = hurry.cancelled(), if !lp.hurried => Event::Hurry,
            Some(ev) = rx.recv() => ev,
            _ = tick.tick() => Event::Tick,
            () = tokio::time::sleep_until(next_read) => Event::ReportsTick,
            () = reload.requested() => Event::Reload,
            () = sleep_until(lp.refresh_at), if lp.refresh_at.is_some() => Event::RefreshStatus,
        };
        // What a slot said before it exited is read before its exit, and what it last
        // said before the watchdog judges it.
        if !matches!(event, Event::Stop | Event::Hurry | Event::RefreshStatus) {
            let read = reports.read(m);
            let now = tokio::time::Instant::now();
            next_read = now
                + if read >= REPORTS_BUSY {
                    REPORTS_SOON
                } else {
                    REPORTS_EVERY
                };
            if read > 0 && lp.refresh_at.is_none() {
                lp.refresh_at = Some(now + STATUS_REFRESH);
            }
        }
        m.handle(event, &mut lp, shutdown).await;
        if m.stopping && m.slots.procs.is_empty() {
            break;
        }
    }
}

/// The master's end of the slots' socket (non-blocking).
struct Reports {
    sock: StdDatagram,
    buf: Vec<u8>,
}

impl Reports {
    /// Hands every datagram waiting to the master; returns how many.
    fn read(&mut self, m: &mut Master) -> usize {
        let mut n = 0;
        loop {
            match self.sock.recv(&mut self.buf) {
                Ok(len) => match serde_json::from_slice(&self.buf[..len]) {
                    Ok(ev) => {
                        m.slot_event(ev);
                        n += 1;
                    }
                    Err(e) => tracing::warn!(error = %e, "unreadable slot report"),
                },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "slot socket");
                    return n;
                }
            }
        }
    }
}

impl Master {
    fn new(
        opts: MasterOptions,
        client: &QueueClient,
        events: mpsc::UnboundedSender<Event>,
        report_peer: StdDatagram,
        status: Arc<Mutex<serde_json::Value>>,
    ) -> Master {
        Master {
            redis: RedisLink {
                conn: client.connection(),
                client: client.clone(),
                keys: Keys::new(&opts.config.cluster.namespace),
                outage: OutageLog::default(),
            },
            orders: Orders {
                map: None,
                max_epoch: 0,
                drain_requested: false,
                config_seen: cluster::ConfigSeen::default(),
                runs_published: false,
            },
            zygotes: Zygotes::new(events, report_peer),
            slots: Slots::new(),
            layouts: Default::default(),
            reporting: Reporting::new(status),
            stopping: false,
            opts,
        }
    }

    /// Reacts to one event; `stop` is the caller's shutdown token, which cuts a tick's
    /// reads of Redis short.
    async fn handle(&mut self, event: Event, lp: &mut LoopState, stop: &CancellationToken) {
        if matches!(event, Event::Zygote(..) | Event::ZygoteGone(_)) && lp.refresh_at.is_none() {
            lp.refresh_at = Some(tokio::time::Instant::now() + STATUS_REFRESH);
        }
        match event {
            Event::RefreshStatus => {
                lp.refresh_at = None;
                let report = self.host_report();
                self.publish_status(&report);
            }
            Event::Tick => {
                lp.refresh_at = None;
                self.tick(stop).await;
                if !lp.notified_ready && self.zygotes.current().is_some_and(|z| z.ready) {
                    lp.notified_ready = true;
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
                }
                if lp.watchdog {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                }
            }
            Event::Zygote(generation, ev) => self.zygote_event(generation, ev).await,
            Event::ZygoteGone(generation) => self.zygote_gone(generation),
            // (read by the loop before every event)
            Event::ReportsTick => {}
            Event::Reload => self.reload().await,
            Event::Stop => {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                self.start_drain().await;
            }
            Event::Hurry => {
                lp.hurried = true;
                tracing::warn!("second stop request: killing slots now");
                self.slots.kill_all();
            }
        }
    }

    async fn tick(&mut self, stop: &CancellationToken) {
        self.restart_zygote_if_due().await;
        if !self.stopping {
            self.replace_zygote_if_code_changed().await;
        }
        // A stopping master follows no map and adopts no config. A stop request cuts the
        // reads short: during an outage each call waits out its retries, and the drain must
        // not start seconds late. Reads only, so dropping them half done loses nothing.
        if !self.stopping {
            let custom = self.opts.registry.custom_names();
            let fetch = self
                .redis
                .fetch_orders(&self.opts.host, &self.orders.config_seen, &custom);
            let fetched = tokio::select! {
                f = fetch => Some(f),
                () = stop.cancelled() => None,
            };
            if let Some(fetched) = fetched {
                self.apply_orders(fetched).await;
            }
        }
        self.measure();
        self.slots.watchdog(&self.opts.config, Instant::now());
        let mapped = self
            .orders
            .map
            .as_ref()
            .map(|m| m.for_host(&self.opts.host));
        let queues = mapped.into_iter().flatten().filter(|(_, n)| *n > 0);
        let ns = &self.opts.config.cluster.namespace;
        let check =
            self.layouts
                .check(&self.redis.conn, ns, queues.map(|(q, _)| q), Instant::now());
        tokio::select! {
            () = check => {}
            () = stop.cancelled() => {}
        }
        self.reconcile().await;
        // The report waits on Redis up to its response timeout (10 s with Redis frozen): a
        // stop cuts it short too, or the drain and its kill would start that much late
        // (found by the fault suite); the draining report follows at once.
        tokio::select! {
            () = self.report() => {}
            () = stop.cancelled() => {}
        }
    }

    /// Takes what [`RedisLink::fetch_orders`] read: the map, an operator's drain, a
    /// published config.
    async fn apply_orders(&mut self, fetched: Fetched) {
        self.apply_map(fetched.map);
        let redis = &mut self.redis;
        match fetched.drained {
            Ok(drained) if drained != self.orders.drain_requested => {
                tracing::info!(host = %self.opts.host, drained, "operator drain changed");
                self.orders.drain_requested = drained;
            }
            Ok(_) => {}
            Err(e) => redis.outage.failed("reading the drain set failed", &e),
        }
        match fetched.published {
            Ok(read) => {
                self.orders.config_seen = read.seen;
                if let Some(published) = read.changed {
                    self.adopt_published(published).await;
                }
            }
            Err(e) => redis
                .outage
                .failed("reading the published config failed", &e),
        }
    }

    /// Takes a published config whose text is new to this master.
    async fn adopt_published(&mut self, published: cluster::Published) {
        let version = published.version;
        match published.config {
            Ok(cfg) => {
                tracing::info!(version, "adopting the published config");
                self.orders.runs_published = true;
                self.adopt(cfg, published.source).await;
            }
            Err(e) => {
                tracing::error!(version, error = %e, "cannot adopt the published config");
            }
        }
    }

    fn apply_map(&mut self, read: Result<Option<SlotMap>, QueueError>) {
        if read.is_ok() {
            self.redis.outage.answered();
        }
        let orders = &mut self.orders;
        match read {
            Ok(Some(map)) if map.epoch < orders.max_epoch => {
                tracing::warn!(
                    epoch = map.epoch,
                    highest = orders.max_epoch,
                    "ignoring a slot map from a stale manager"
                );
            }
            // The same leader's map, older than one already read: Redis went back in time
            // (a replica that had not received the newer one was promoted). The leader
            // sees the version this host reports and writes past it.
            Ok(Some(map))
                if orders
                    .map
                    .as_ref()
                    .is_some_and(|m| m.epoch == map.epoch && map.version < m.version) =>
            {
                tracing::warn!(
                    epoch = map.epoch,
                    version = map.version,
                    newest = orders.map.as_ref().map_or(0, |m| m.version),
                    "ignoring a slot map older than one already read (did redis fail over to a lagging replica?)"
                );
            }
            Ok(Some(map)) => {
                if orders
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
                orders.max_epoch = map.epoch;
                orders.map = Some(map);
            }
            Ok(None) => {}
            Err(e) => self.redis.outage.failed("reading the slot map failed", &e),
        }
    }

    async fn reload(&mut self) {
        let Some(path) = self.opts.config_path.clone() else {
            tracing::warn!("SIGHUP: no config file to re-read");
            return;
        };
        // The published config is the cluster's: a file read on one host would run that
        // host apart from the manager and the api (and publishing the same text again would
        // not even bring it back, its text being the one this master last read).
        // (one this host could not adopt, a handler it lacks, leaves it on its file, which
        // a SIGHUP may still re-read)
        if self.orders.runs_published {
            tracing::warn!(
                version = self.orders.config_seen.version,
                path = %path.display(),
                "SIGHUP: a published config is in force; the file is not read (publish it with `gaffer config apply`)"
            );
            return;
        }
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
        let supported = self.supported_queues(&cfg);
        let same = self
            .zygotes
            .current()
            .is_some_and(|z| z.queues == supported);
        telemetry::queues_known(cfg.queues.keys());
        self.opts.config = cfg;
        self.opts.config_source = source;
        if same {
            tracing::info!("config reloaded; queues unchanged");
            return;
        }
        tracing::info!("config reloaded; queues changed, replacing the zygote");
        if let Err(e) = self.start_zygote().await {
            tracing::error!(error = %e, "starting the new zygote failed");
            self.zygotes.restart_at = Some(Instant::now() + Duration::from_secs(1));
        }
        self.retire_idle_zygotes();
    }

    async fn start_drain(&mut self) {
        self.stopping = true;
        tracing::info!(host = %self.opts.host, slots = self.slots.procs.len(),
            drain_timeout = ?self.opts.config.master.drain_timeout, "draining");
        self.reconcile().await;
        self.retire_idle_zygotes();
        self.report().await;
    }

    async fn finish(&mut self) {
        self.retire_idle_zygotes();
        self.zygotes.wait_all().await;
        let redis = &mut self.redis;
        let deregister = cluster::deregister_host(&mut redis.conn, &redis.keys, &self.opts.host);
        match tokio::time::timeout(STOPPING_REDIS_WAIT, deregister).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "deregistering the host failed"),
            // The manager judges the host dead by its silent heartbeat instead.
            Err(_) => {
                tracing::warn!(waited = ?STOPPING_REDIS_WAIT, "deregistering the host failed: redis did not answer")
            }
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
