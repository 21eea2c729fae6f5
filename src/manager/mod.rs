//! The manager: one active per cluster. Every tick it renews its leadership lease, reads
//! the masters' reports and the queues' statistics, asks the balancer for a new map and
//! writes it under its fencing epoch; it also fires schedules and adopts configs
//! published with `gaffer config apply`.
//!
//! It knows nothing of masters or slots beyond the reports they leave in Redis.
//!
//! A tick, in order: the lease; config adoption (`cluster::changed_config`); a leader's
//! registration of its config's queue names it has not added yet (`Keys::queues`, what
//! finds a queue once removed from the config); every queue's counters, read 64 at once
//! over the one connection; a standby's sample into its window (reads only: a standby
//! writes nothing); the reports of hosts silent past
//! `forget_hosts_after`, deleted (fenced, compare-and-delete); the balancer, with systems
//! switched at run time counted as paused and each queue's copy of its system's switch kept
//! in line with the config; the map; the load ring; the schedules. It stops only on its
//! shutdown token, which `gaffer manager` cancels on SIGTERM/SIGINT, and its stop cuts
//! short a pending lease renewal or config read and bounds its step-down.
//!
//! A new leader decides on load it has seen (ARCHITECTURE.md, invariant 19): a leader whose
//! window holds fewer than two samples keeps the current map, rewritten under its epoch,
//! rather than read every queue as idle.
//!
//! The schedules (`schedules.rs`): the config's and the ones stored through the api, each
//! fired once per due moment across managers (invariant 20), by a fenced claim.

mod heartbeats;
mod lease;
pub mod ring;
mod schedules;
mod telemetry;
pub mod window;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::balancer::{self, HostState, Input};
use crate::cluster::{self, HostReport, Keys, SlotMap};
use crate::config::Config;
use crate::queue_client::{
    ConnectOptions, OutageLog, QueueClient, QueueLimits, QueueStats, RedisConn,
};

use heartbeats::Blind;
pub use lease::{FireClaim, Leadership};
use telemetry::{Step, TickFailed};
pub use window::StatsWindow;

/// Expired task records deleted per queue and tick, at most: bounds one script's time.
const HOUSEKEEP_PER_TICK: usize = 1000;

/// Epochs a master may report and a leader raise its own past: far beyond any count of
/// leader changes, and exact in a Lua number.
const MAX_EPOCH: u64 = 1 << 40;

/// Queues whose statistics a tick reads at once (each a script call or two in flight).
const QUEUES_AT_ONCE: usize = 64;

/// `d` in whole milliseconds (saturating).
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether reading the queues' statistics also deletes their expired records: the leader
/// does, a standby only reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Housekeep {
    Yes,
    No,
}

/// Everything a manager needs; built by `gaffer manager` or by a test.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// The validated config (replaced when one is published).
    pub config: Config,
    /// The text of the file `config` came from; the leader shows it as the config in force
    /// ([`Keys::config_in_force`]) while none is published. None shows nothing (tests).
    pub file_source: Option<String>,
    /// Redis to meet the cluster in.
    pub redis_url: String,
    /// Password and timeouts for Redis.
    pub connect: ConnectOptions,
    /// Unique per manager process: host name and pid.
    pub id: String,
    /// Handler names beyond the built-in ones, to read published configs.
    pub custom_handlers: Vec<String>,
    /// How far back statistics are averaged.
    pub window: Duration,
    /// Where to serve `/metrics` and `/status`; None serves nothing (tests in-process).
    pub http: Option<std::net::SocketAddr>,
    /// The period of the load rings `gaffer trace record` reads ([`ring`]).
    pub trace_period: Duration,
}

impl ManagerOptions {
    /// Options with the defaults for everything but what must be given.
    pub fn new(config: Config, redis_url: String, id: String) -> Self {
        Self {
            config,
            file_source: None,
            redis_url,
            connect: ConnectOptions::default(),
            id,
            custom_handlers: Vec::new(),
            window: StatsWindow::DEFAULT_LENGTH,
            http: None,
            trace_period: ring::DEFAULT_PERIOD,
        }
    }

    /// How long the lease lasts without renewal: three ticks, at least 3 s, so one slow
    /// tick does not hand leadership over.
    pub fn lease_ttl(&self) -> Duration {
        (self.config.manager.tick * 3).max(Duration::from_secs(3))
    }
}

/// How long a stopping manager waits to release its lease.
const STEP_DOWN_WAIT: Duration = Duration::from_secs(2);

/// Runs the manager until `shutdown` is cancelled (the binary's edge cancels it on SIGTERM
/// or SIGINT); then it releases the lease so a standby takes over at once.
pub async fn run(opts: ManagerOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Bind before anything starts, so a port in use fails the start, not a tick later.
    let listener = bind_http(opts.http).await?;
    // Redis may be down when pacemaker starts us: wait for it rather than exit, which would
    // only count as a failure of the resource on this node.
    let ns = &opts.config.cluster.namespace;
    let connect = QueueClient::connect_or_stop(&opts.redis_url, ns, &opts.connect, &shutdown);
    let Some(client) = connect.await? else {
        return Ok(());
    };
    let keys = Keys::new(&opts.config.cluster.namespace);
    let status = Arc::new(Mutex::new(
        serde_json::json!({"id": opts.id, "leading": false}),
    ));
    let http = listener.map(|listener| HttpServer::start(listener, status.clone(), &client));
    let mut m = Manager {
        status,
        leadership: Leadership::new(keys.clone(), opts.id.clone(), opts.lease_ttl()),
        conn: client.connection(),
        window: StatsWindow::new(opts.window),
        recorder: ring::Recorder::new(opts.trace_period),
        ring_keys: ring::RingKeys::new(&opts.config.cluster.namespace),
        blind: Blind::default(),
        heartbeats: heartbeats::Heartbeats::default(),
        verdicts: BTreeMap::new(),
        outage: OutageLog::default(),
        clock: Instant::now(),
        config_seen: cluster::ConfigSeen::default(),
        config_source: None,
        config_shown: None,
        leading: false,
        registered: BTreeSet::new(),
        firing: schedules::Firing::default(),
        keys,
        client,
        opts,
    };
    m.tick_until(&shutdown).await;
    m.step_down().await;
    if let Some(http) = http {
        http.stop().await;
    }
    tracing::info!(id = %m.opts.id, "manager stopped");
    Ok(())
}

/// The listener for `/metrics` and `/status`, when the options name an address.
async fn bind_http(
    addr: Option<std::net::SocketAddr>,
) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding [manager].http {addr}"))?;
    Ok(Some(listener))
}

/// The manager's `/metrics` and `/status`, served until [`HttpServer::stop`].
struct HttpServer {
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    shutdown: CancellationToken,
}

impl HttpServer {
    /// Serves on `listener`; `/status` shows the document the ticks rewrite, with the
    /// Redis node `client` talks to as of the request.
    fn start(
        listener: tokio::net::TcpListener,
        status: Arc<Mutex<serde_json::Value>>,
        client: &QueueClient,
    ) -> Self {
        let shutdown = CancellationToken::new();
        let metrics = crate::http::install_metrics();
        let task = tokio::spawn(crate::http::serve(
            listener,
            crate::http::Routes {
                metrics: Some(metrics),
                status: crate::http::status_with_redis(status, client.clone()),
            },
            shutdown.clone(),
        ));
        HttpServer { task, shutdown }
    }

    /// Stops serving and waits until the server is gone.
    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

struct Manager {
    opts: ManagerOptions,
    /// The `/status` document, rewritten every tick.
    status: Arc<Mutex<serde_json::Value>>,
    keys: Keys,
    client: QueueClient,
    conn: RedisConn,
    leadership: Leadership,
    /// Statistics of the last [`ManagerOptions::window`], on [`Manager::clock`].
    window: StatsWindow,
    /// Cuts the same samples into the periods of the load rings.
    recorder: ring::Recorder,
    ring_keys: ring::RingKeys,
    /// The published config read last: one with another text is adopted.
    config_seen: cluster::ConfigSeen,
    /// The text and version of the published config in force, once one was adopted.
    config_source: Option<(String, u64)>,
    /// The lease epoch and the published version (None: the file) last shown as in
    /// force: a new lease (another leadership, or one taken again after Redis lost its
    /// data, and the record with it) shows it again.
    config_shown: Option<(u64, Option<u64>)>,
    leading: bool,
    /// Queue names this leadership has added to the registry (`Keys::queues`); emptied
    /// when leadership goes, so a leader registers its config's names again (Redis may
    /// have lost them with the lease).
    registered: BTreeSet<String>,
    /// What the schedules' firing has warned about.
    firing: schedules::Firing,
    /// When this manager last went without Redis, to judge heartbeats fairly after it.
    blind: Blind,
    /// How long each host has been silent, on this manager's clock.
    heartbeats: heartbeats::Heartbeats,
    /// Whether this manager last judged each host alive, to log a change of verdict once.
    verdicts: BTreeMap<String, bool>,
    /// Redis outages, logged as spells.
    outage: OutageLog,
    /// Origin of [`Manager::monotonic_ms`] and of the window's time.
    clock: Instant,
}

/// The hosts alive and their capacity, for the load ring.
fn hosts_now(hosts: &BTreeMap<String, HostState>) -> ring::HostsNow {
    let alive = hosts.values().filter(|h| h.alive);
    ring::HostsNow {
        alive: u32::try_from(alive.clone().count()).unwrap_or(u32::MAX),
        capacity: alive.map(|h| u64::from(h.capacity)).sum(),
    }
}

impl Manager {
    /// Ticks every `[manager].tick` until `shutdown`.
    async fn tick_until(&mut self, shutdown: &CancellationToken) {
        let every = |first: Duration, period| {
            let start = tokio::time::Instant::now() + first;
            let mut tick = tokio::time::interval_at(start, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        };
        let mut period = self.opts.config.manager.tick;
        let mut tick = every(Duration::ZERO, period);
        telemetry::started(&self.opts.id);
        loop {
            tokio::select! {
                _ = tick.tick() => self.tick(shutdown).await,
                () = shutdown.cancelled() => break,
            }
            // A published config may have changed the tick. The next one comes within the
            // shorter of the two periods: this tick renewed the lease for three of the
            // old ones, and a longer new period would let it run out before the renewal
            // that makes it three of the new.
            let new = self.opts.config.manager.tick;
            if new != period {
                tick = every(period.min(new), new);
                period = new;
            }
        }
    }

    /// Releases the lease if this manager leads, so a standby takes over at once rather
    /// than after the lease runs out.
    async fn step_down(&mut self) {
        if !self.leading {
            return;
        }
        // Bounded: a stop must not wait out an outage; the lease then simply runs out.
        let release = self.leadership.release(&mut self.conn);
        match tokio::time::timeout(STEP_DOWN_WAIT, release).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease failed"),
            Err(_) => {
                tracing::warn!(waited = ?STEP_DOWN_WAIT, "releasing the lease failed: redis did not answer")
            }
        }
    }

    /// This manager's write was fenced off: another manager leads now.
    fn fenced_off(&mut self) {
        telemetry::fenced(&self.opts.id);
        self.leading = false;
    }

    /// Milliseconds since the manager started, on a clock no one can set.
    fn monotonic_ms(&self) -> u64 {
        ms(self.clock.elapsed())
    }

    /// One tick; a stop request cuts short its first two steps, the lease renewal and
    /// the config read, which change nothing until they answer (during an outage they
    /// wait out the response timeout, and the stop with them).
    async fn tick(&mut self, shutdown: &CancellationToken) {
        let started = Instant::now();
        let was = self.leading;
        let renewed = tokio::select! {
            r = self.leadership.renew(&mut self.conn) => r,
            () = shutdown.cancelled() => return,
        };
        self.leading = match renewed {
            Ok(l) => {
                self.outage.answered();
                let m = &self.opts.config.manager;
                let (tick, timeout) = (ms(m.tick), ms(m.heartbeat_timeout));
                self.blind.reached(self.monotonic_ms(), tick, timeout);
                l
            }
            Err(e) => {
                self.outage.failed("renewing the lease failed", &e);
                false
            }
        };
        if self.leading != was {
            telemetry::LeadershipChanged {
                id: &self.opts.id,
                leading: self.leading,
                epoch: self.leadership.epoch(),
            }
            .emit();
        }
        tokio::select! {
            () = self.adopt_published_config() => {}
            () = shutdown.cancelled() => return,
        }
        if !self.leading {
            self.registered.clear();
            // A standby keeps its window warm, so that taking over decides on the load it
            // has seen rather than on none. Not while Redis does not answer (the outage
            // log said so once); and a stop cuts it short, as it writes nothing.
            if self.outage.is_out() {
                // (nothing to read)
            } else if let Some(Err(error)) = tokio::select! {
                r = self.observe() => Some(r),
                () = shutdown.cancelled() => None,
            } {
                TickFailed {
                    step: Step::Observe,
                    error: &error,
                }
                .emit();
            }
        } else {
            self.register_queues().await;
            self.show_config_in_force().await;
            if let Err(error) = self.decide().await {
                TickFailed {
                    step: Step::Decide,
                    error: &error,
                }
                .emit();
            }
            if let Err(error) = self.fire_schedules().await {
                TickFailed {
                    step: Step::Schedules,
                    error: &error,
                }
                .emit();
            }
        }
        telemetry::tick_done(started.elapsed());
        if let Ok(mut s) = self.status.lock() {
            *s = serde_json::json!({
                "id": self.opts.id,
                "leading": self.leading,
                "epoch": self.leadership.epoch(),
                "config_version": self.config_seen.version,
                "queues": self.opts.config.queues.len(),
                "tick_ms": cluster::now_ms(),
            });
        }
    }

    /// Redis holds a config published before the one in force (it failed over to a
    /// replica that lagged): a leader publishes the one in force again, under its first
    /// publish time, so every role (one started since too) runs it, not the older one.
    async fn republish_config(&mut self) {
        let Some((source, _)) = self.config_source.clone() else {
            return;
        };
        if self.leadership.epoch() == 0 {
            return; // the leader does it
        }
        let published_us = self.config_seen.published_us;
        match self
            .leadership
            .republish_config(&mut self.conn, &source, published_us)
            .await
        {
            Ok(true) => tracing::warn!(
                published_us,
                "redis held an older config than the one in force; published the one in force again"
            ),
            Ok(false) => self.fenced_off(),
            Err(e) => self
                .outage
                .failed("publishing the config in force again failed", &e),
        }
    }

    async fn adopt_published_config(&mut self) {
        let read = cluster::changed_config(
            &mut self.conn,
            &self.keys,
            &self.config_seen,
            &self.opts.custom_handlers,
        )
        .await;
        let published = match read {
            Ok(read) if read.behind => {
                self.republish_config().await;
                return;
            }
            Ok(read) => {
                self.config_seen = read.seen;
                read.changed
            }
            Err(e) => {
                self.outage
                    .failed("reading the published config failed", &e);
                return;
            }
        };
        let Some(published) = published else { return };
        let version = published.version;
        match published.config {
            Ok(cfg) => {
                tracing::info!(
                    version,
                    queues = cfg.queues.len(),
                    "adopting the published config"
                );
                if cfg.manager.http != self.opts.config.manager.http {
                    tracing::warn!(
                        version,
                        "[manager].http changed in the published config: it applies at the manager's next start"
                    );
                }
                self.opts.config = cfg;
                self.config_source = Some((published.source, version));
                self.firing.config_changed();
                // (three ticks of the new tick: see lease_ttl)
                self.leadership.set_ttl(self.opts.lease_ttl());
            }
            Err(e) => {
                tracing::error!(version, error = %e, "cannot adopt the published config")
            }
        }
    }

    /// Records the config this leader runs for the readers that show it (the console's
    /// queue page): the published one once adopted, else this manager's file. Once per
    /// lease epoch and change; a failure is logged and the next tick tries again.
    async fn show_config_in_force(&mut self) {
        let (source, origin, version) = match (&self.config_source, &self.opts.file_source) {
            (Some((source, version)), _) => (source, "published", Some(*version)),
            (None, Some(source)) => (source, "file", None),
            (None, None) => return,
        };
        let shown = Some((self.leadership.epoch(), version));
        if self.config_shown == shown {
            return;
        }
        let written = self
            .leadership
            .show_config(&mut self.conn, source, origin, version)
            .await;
        match written {
            Ok(true) => self.config_shown = shown,
            Ok(false) => self.fenced_off(),
            Err(e) => self
                .outage
                .failed("recording the config in force failed", &e),
        }
    }

    /// Adds the config's queue names this leadership has not registered yet to the
    /// registry of every name a config has named, so a queue later removed from the
    /// config is still found (retired) by `stats` and `tasks`. A failure is logged and
    /// the next tick tries again; it holds back nothing else.
    async fn register_queues(&mut self) {
        let new: Vec<String> = self
            .opts
            .config
            .queues
            .keys()
            .filter(|q| !self.registered.contains(*q))
            .cloned()
            .collect();
        if new.is_empty() {
            return;
        }
        match cluster::register_queues(&mut self.conn, &self.keys, &new).await {
            Ok(()) => self.registered.extend(new),
            Err(e) => self.outage.failed(
                "registering the config's queue names failed; the next tick tries again",
                &e,
            ),
        }
    }

    /// Reads the cluster, asks the balancer, and publishes its decisions and (when it
    /// changed, or this epoch has not written it yet) the new map.
    async fn decide(&mut self) -> anyhow::Result<()> {
        let now_ms = cluster::now_ms();
        let mut reports = cluster::read_hosts(&mut self.conn, &self.keys).await?;
        self.heartbeats
            .observe(&reports, self.monotonic_ms(), now_ms);
        if !self.forget_silent_hosts(&mut reports).await? {
            return Ok(());
        }
        let current = cluster::read_map(&mut self.conn, &self.keys).await?;
        if !self
            .epoch_above_the_masters(&reports, current.as_ref())
            .await?
        {
            return Ok(());
        }
        let paused: BTreeSet<String> = self.conn.smembers(self.keys.paused()).await?;
        let draining: BTreeSet<String> = self.conn.smembers(self.keys.draining()).await?;
        let hosts = self.host_states(&reports, &draining);
        self.log_verdicts(&hosts);
        let queue_stats = self.queue_stats(Housekeep::Yes).await?;
        let sample = self.sample(&queue_stats, &reports);
        let period = self.recorder.observe(&sample, now_ms, hosts_now(&hosts));
        let stats = self.windows(sample, &queue_stats);
        if !self.window.has_rates() {
            return self.hold(current).await;
        }
        let current = current.unwrap_or_default();
        let now = chrono::DateTime::from_timestamp_millis(now_ms as i64).unwrap_or_default();
        // A system paused or disabled at run time counts as paused in the config.
        let switches = self.client.read_switches().await?;
        let reconciled = self
            .client
            .reconcile_system_switches(&self.opts.config, &switches)
            .await?;
        let switched = crate::queue_client::with_switches(&self.opts.config, &switches.states);
        let out = balancer::decide(&Input {
            config: switched.as_ref().unwrap_or(&self.opts.config),
            stats: &stats,
            current: &current.hosts,
            hosts: &hosts,
            now,
            paused: &paused,
        });
        telemetry::queues(&queue_stats, &out.decisions, &self.opts.config);
        telemetry::HostCounts::of(&hosts).emit();
        let decisions = serde_json::to_string(&out.decisions)?;
        let liveness: BTreeMap<&str, bool> =
            hosts.iter().map(|(h, s)| (h.as_str(), s.alive)).collect();
        let liveness = serde_json::to_string(&liveness)?;
        if !self
            .leadership
            .write_decisions(&mut self.conn, &decisions, &liveness)
            .await?
        {
            self.fenced_off();
            return Ok(());
        }
        if out.map != current.hosts || current.epoch != self.leadership.epoch() {
            self.write_map(out.map).await?;
        }
        if let Some(period) = period {
            ring::write(&mut self.conn, &self.ring_keys, &period).await?;
        }
        // Last, bounded, and its failure only logged: the sweep never holds back the map.
        if let Err(e) = self
            .client
            .sweep_disabled(&self.opts.config, &switches, &reconciled)
            .await
        {
            tracing::warn!(error = %e, "cancelling what waits under a disabled system failed; next tick tries again");
        }
        Ok(())
    }

    /// The balancer's view of each reporting host now: alive while it has been silent
    /// (see [`heartbeats`]) no longer than [`Manager::allowed_silence_ms`].
    fn host_states(
        &self,
        reports: &BTreeMap<String, HostReport>,
        draining: &BTreeSet<String>,
    ) -> BTreeMap<String, HostState> {
        let mono = self.monotonic_ms();
        let allowed = self.allowed_silence_ms(mono);
        reports
            .iter()
            .map(|(name, r)| {
                (
                    name.clone(),
                    HostState {
                        capacity: r.capacity,
                        handlers: r.handlers.iter().cloned().collect(),
                        alive: self
                            .heartbeats
                            .silent_ms(name, mono)
                            .is_some_and(|s| s <= allowed),
                        draining: r.draining || draining.contains(name),
                    },
                )
            })
            .collect()
    }

    /// How long a host may be silent at `mono` and count as alive: the heartbeat timeout,
    /// plus the grace after an outage of our own.
    fn allowed_silence_ms(&self, mono: u64) -> u64 {
        ms(self.opts.config.manager.heartbeat_timeout).saturating_add(self.blind.tolerance_ms(mono))
    }

    /// Logs each host whose verdict changed since this manager last judged it (and one
    /// first judged dead), so an operator can tell why slots moved.
    fn log_verdicts(&mut self, hosts: &BTreeMap<String, HostState>) {
        let mono = self.monotonic_ms();
        self.verdicts.retain(|h, _| hosts.contains_key(h));
        for (host, state) in hosts {
            let was = self.verdicts.insert(host.clone(), state.alive);
            if was == Some(state.alive) || (was.is_none() && state.alive) {
                continue;
            }
            telemetry::HostJudged {
                host,
                alive: state.alive,
                silent_ms: self.heartbeats.silent_ms(host, mono),
                allowed_ms: self.allowed_silence_ms(mono),
            }
            .emit();
        }
    }

    /// Raises this leader's epoch past every epoch a master reports having seen, should
    /// one be as high: the epoch counter restarted (Redis lost its data, or was replaced),
    /// and those masters would ignore every map of this leader. Likewise when a master
    /// runs a map of this epoch newer than the `stored` one: Redis lost the newer map (a
    /// failover to a lagging replica), and masters ignore older maps of an epoch; under a
    /// new epoch the next map is newer than anything they read. False when fenced off.
    async fn epoch_above_the_masters(
        &mut self,
        reports: &BTreeMap<String, HostReport>,
        stored: Option<&SlotMap>,
    ) -> anyhow::Result<bool> {
        let was = self.leadership.epoch();
        // An epoch no leader change could reach (a corrupt report) is not followed.
        let seen = reports
            .values()
            .map(|r| r.map_epoch)
            .filter(|&e| e < MAX_EPOCH)
            .max()
            .unwrap_or(0);
        let stored_version = stored.filter(|m| m.epoch == was).map_or(0, |m| m.version);
        let lost_map = reports
            .values()
            .any(|r| r.map_epoch == was && r.map_version > stored_version);
        if seen < was || (seen == was && !lost_map) {
            return Ok(true);
        }
        if !self.leadership.raise_epoch(&mut self.conn, seen).await? {
            self.fenced_off();
            return Ok(false);
        }
        telemetry::EpochRaised {
            lost_map: seen == was,
            was,
            seen,
            epoch: self.leadership.epoch(),
        }
        .emit();
        Ok(true)
    }

    /// Deletes the reports of hosts silent past `[manager].forget_hosts_after` (fenced,
    /// and only a report still as silent when deleted: a master that came back keeps its
    /// new one) and leaves them out of `reports`. False when fenced off.
    async fn forget_silent_hosts(
        &mut self,
        reports: &mut BTreeMap<String, HostReport>,
    ) -> anyhow::Result<bool> {
        let mono = self.monotonic_ms();
        let after = ms(self.opts.config.manager.forget_hosts_after)
            .saturating_add(self.blind.tolerance_ms(mono));
        // Watched past a heartbeat timeout first: at first sight a report's age is only
        // what the wall clocks say, and a host whose clock runs far behind would be
        // forgotten the moment it is seen, again at each report.
        let watch = ms(self.opts.config.manager.heartbeat_timeout);
        let candidates: Vec<(String, u64)> = reports
            .keys()
            .filter(|h| self.heartbeats.watched_ms(h, mono) > watch)
            .filter_map(|h| Some((h.clone(), self.heartbeats.silent_ms(h, mono)?)))
            .filter(|(_, silent)| *silent > after)
            .collect();
        for (host, silent_ms) in candidates {
            let raw: Option<String> = self.conn.hget(self.keys.hosts(), &host).await?;
            let report = raw
                .as_deref()
                .and_then(|j| serde_json::from_str::<HostReport>(j).ok());
            let (Some(raw), Some(report)) = (raw.as_deref(), report) else {
                continue;
            };
            // (a report that changed since is a master that came back)
            if !self.heartbeats.is_last_seen(&report) {
                continue;
            }
            match self
                .leadership
                .forget_host(&mut self.conn, &host, raw)
                .await?
            {
                None => {
                    self.fenced_off();
                    return Ok(false);
                }
                Some(true) => {
                    telemetry::HostForgotten {
                        host: &host,
                        silent_ms,
                    }
                    .emit();
                    reports.remove(&host);
                }
                Some(false) => {}
            }
        }
        Ok(true)
    }

    /// A standby's tick: the cluster's counters into the window, nothing written.
    async fn observe(&mut self) -> anyhow::Result<()> {
        let reports = cluster::read_hosts(&mut self.conn, &self.keys).await?;
        self.heartbeats
            .observe(&reports, self.monotonic_ms(), cluster::now_ms());
        let queue_stats = self.queue_stats(Housekeep::No).await?;
        let sample = self.sample(&queue_stats, &reports);
        self.window.record(sample);
        Ok(())
    }

    /// A leader whose window holds no rates yet (it started this tick) keeps the map as it
    /// is, written under its own epoch, rather than deciding on no load: every queue would
    /// read as idle, and a busy one lose its slots for a tick.
    async fn hold(&mut self, current: Option<SlotMap>) -> anyhow::Result<()> {
        tracing::info!(
            epoch = self.leadership.epoch(),
            "holding the map until the load window spans a tick"
        );
        // (no map yet: nothing to hold, and no older leader's map to fence)
        if let Some(current) = current
            && current.epoch != self.leadership.epoch()
        {
            self.write_map(current.hosts).await?;
        }
        Ok(())
    }

    /// Every configured queue's statistics; with [`Housekeep::Yes`] each queue's expired
    /// records go on the way.
    async fn queue_stats(
        &self,
        housekeep: Housekeep,
    ) -> anyhow::Result<BTreeMap<String, QueueStats>> {
        use futures::StreamExt;
        // Many queues at once over the one connection, which pipelines them: one after
        // the other, a tick cost a round trip or two per queue, and a thousand queues a
        // second across a network.
        futures::stream::iter(&self.opts.config.queues)
            .map(|(name, q)| {
                let queue = self.client.queue_with(name, QueueLimits::from(q));
                async move {
                    let queue = queue?;
                    let stats = match queue.stats().await {
                        // (a queue waiting for `gaffer migrate` must not stop the tick: it
                        // counts as empty, and its slots wait out the refusal)
                        Err(crate::queue_client::QueueError::Layout { .. }) => {
                            return anyhow::Ok((name.clone(), QueueStats::default()));
                        }
                        other => other?,
                    };
                    if housekeep == Housekeep::Yes {
                        // Records whose history_ttl ran out go even where no slot takes.
                        queue.housekeep(HOUSEKEEP_PER_TICK).await?;
                    }
                    anyhow::Ok((name.clone(), stats))
                }
            })
            .buffer_unordered(QUEUES_AT_ONCE)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// This tick's counters, in the order of `queue_stats`.
    fn sample(
        &self,
        queue_stats: &BTreeMap<String, QueueStats>,
        reports: &BTreeMap<String, HostReport>,
    ) -> window::Sample {
        let names: Arc<[String]> = queue_stats.keys().cloned().collect();
        window::Sample::from_reports(self.clock.elapsed(), names, queue_stats, reports)
    }

    /// Records this tick's `sample` in the window and reads each queue's window back.
    fn windows(
        &mut self,
        sample: window::Sample,
        queue_stats: &BTreeMap<String, QueueStats>,
    ) -> BTreeMap<String, balancer::QueueWindow> {
        // In the order of `queue_stats`, which the backlog follows.
        let names = sample.queues.clone();
        self.window.record(sample);
        let backlog: Vec<window::Backlog> = queue_stats.values().map(Into::into).collect();
        names
            .iter()
            .cloned()
            .zip(self.window.read(&backlog))
            .collect()
    }

    /// Writes `hosts` as the new map under this manager's epoch; a fenced write means
    /// another manager leads now.
    async fn write_map(
        &mut self,
        hosts: BTreeMap<String, BTreeMap<String, u32>>,
    ) -> anyhow::Result<()> {
        let map = SlotMap {
            epoch: self.leadership.epoch(),
            version: 0,
            hosts,
        };
        match self.leadership.write_map(&mut self.conn, &map).await? {
            Some(version) => {
                let slots: u32 = map.hosts.values().flat_map(|q| q.values()).sum();
                telemetry::MapWritten {
                    version,
                    epoch: map.epoch,
                    slots,
                }
                .emit();
            }
            None => {
                self.fenced_off();
            }
        }
        Ok(())
    }
}
