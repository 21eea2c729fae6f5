//! One consistent-enough read of everything an operator looks at: every queue's counters,
//! limits, intake and last decision, every host's report, the slot map and the manager's lease,
//! and the retired queues (named by a config once, not by this one) that still hold data.
//! `gaffer stats` prints one; `gaffer top` keeps a short history of them. It reads only
//! Redis, so it works while the manager is down (the lease then shows as absent).
//!
//! [`stats_json`] is the `gaffer stats --json` contract: `stats` prints it, the api's `GET
//! /v1/queues` serves its queues, `top` keeps a history of it. Keys are added, never
//! renamed.

use std::collections::{BTreeMap, BTreeSet};

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{HostReport, Keys, SlotMap, now_ms};
use crate::config::{Config, Intake, QueueConfig, QueueKind};
use crate::queue_client::{
    ListQuery, Queue, QueueClient, QueueError, QueueLimits, QueueStats, RecordState, RedisConn,
    RedisNode, SystemState, Topology, system_states,
};

/// The manager's last verdict on a queue, as written to `NS:{cluster}:decisions`
/// (`balancer::Decision`, read back without depending on the balancer).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DecisionView {
    /// Slots in the map the decision started from.
    #[serde(default)]
    pub current: u32,
    /// Slots the statistics asked for.
    #[serde(default)]
    pub demand: u32,
    /// After hysteresis and limits.
    #[serde(default)]
    pub wanted: u32,
    /// In the new map.
    #[serde(default)]
    pub placed: u32,
    /// Demand over slots; over 1 means the queue needs more.
    #[serde(default)]
    pub load: Option<f64>,
    /// Why, each `{"reason": "...", ...}`.
    #[serde(default)]
    pub reasons: Vec<serde_json::Value>,
}

impl DecisionView {
    /// The reasons as short words ("grow", "scarcity short=3"), for tables.
    pub fn reason_text(&self) -> String {
        self.reasons
            .iter()
            .map(|r| {
                let name = r.get("reason").and_then(|v| v.as_str()).unwrap_or("?");
                let extra: Vec<String> = r
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| *k != "reason")
                    .map(|(k, v)| match v.as_str() {
                        Some(s) => format!("{k}={s}"),
                        None => format!("{k}={v}"),
                    })
                    .collect();
                if extra.is_empty() {
                    name.to_string()
                } else {
                    format!("{name} {}", extra.join(" "))
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One queue: its limits from the config, its counters, and the cluster's view of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueView {
    /// Priority from the config (higher first under scarcity).
    pub priority: i32,
    /// `min_slots` from the config.
    pub min_slots: u32,
    /// `max_slots` from the config.
    pub max_slots: u32,
    /// The queue's counters and sizes.
    pub stats: QueueStats,
    /// Slots running now, summed over live hosts' reports.
    pub slots: u32,
    /// Slots in the published map.
    pub mapped: u32,
    /// The manager's last decision, if it made one.
    pub decision: Option<DecisionView>,
    /// Paused by an operator.
    pub paused: bool,
    /// Whether it accepts new tasks now: the run-time switch (`gaffer intake`) when one
    /// is set, else the config's `intake`.
    #[serde(serialize_with = "intake_name")]
    pub intake: Intake,
    /// `track` from the config: each task keeps a record with its history.
    pub track: bool,
    /// Summed over live hosts: tasks handled by slots (monotonic per master).
    pub processed_total: u64,
    /// Summed over live hosts: tasks that failed in a handler.
    pub failed_total: u64,
    /// Summed over live hosts: seconds slots spent in handlers.
    pub busy_seconds_total: f64,
    /// Summed over live hosts: slots recycled for memory.
    pub recycles_total: u64,
    /// Summed over live hosts: slots that crashed.
    pub crashes_total: u64,
    /// The newest slot crash any live host reports, with that host's name.
    pub last_crash: Option<(String, crate::cluster::LastCrash)>,
    /// Why the queue is not served as the map asks: its layout refused by this gaffer's
    /// scripts (`gaffer migrate` not run yet; its counters then read 0), or by a live
    /// host's master (a layout newer than its own; the host named).
    pub refused: Option<String>,
    /// Batch or long tasks (`kind`), from the config.
    #[serde(skip)]
    pub kind: QueueKind,
    /// A long queue's running tasks, at most [`MAX_LONG_SHOWN`], newest first; empty for
    /// a batch queue.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub long_running: Vec<LongRunning>,
}

/// Most running tasks of one long queue the snapshot reads (a record each).
pub const MAX_LONG_SHOWN: usize = 50;

/// Listing pages the snapshot reads to find a long queue's running tasks: as many
/// records as one call of the listing looked at before its calls were bounded (5,000).
const LONG_SCAN_PAGES: usize = 40;

/// One running task of a long queue, for the dashboard.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LongRunning {
    /// The task's id.
    pub id: String,
    /// The host of the slot that runs it.
    pub host: String,
    /// That slot's number on its host.
    pub slot: Option<u32>,
    /// When its current attempt started (ms since the epoch).
    pub since_ms: u64,
}

fn intake_name<S: serde::Serializer>(intake: &Intake, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(intake.as_str())
}

/// A host's state as the dashboard shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    /// Reporting within the heartbeat timeout.
    Alive,
    /// Alive, and draining (by SIGTERM or `gaffer drain`).
    Draining,
    /// Silent past the heartbeat timeout.
    Dead,
}

impl HostState {
    /// Lower-case name, as in `stats`.
    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Alive => "alive",
            HostState::Draining => "draining",
            HostState::Dead => "dead",
        }
    }
}

/// One host: its last report and what that means now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostView {
    /// Alive, draining or dead.
    pub state: HostState,
    /// Marked for draining by an operator (`gaffer drain`).
    pub drain_requested: bool,
    /// The master's last report.
    pub report: HostReport,
}

/// Who leads, as the lease key says.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ManagerView {
    /// The lease holder's id (host and pid); None when no manager holds the lease.
    pub holder: Option<String>,
    /// The holder's fencing epoch.
    pub epoch: Option<u64>,
    /// Milliseconds left on the lease.
    pub lease_ttl_ms: Option<u64>,
    /// The epoch of the writer of the published map.
    pub map_epoch: Option<u64>,
    /// The published map's version.
    pub map_version: Option<u64>,
}

impl ManagerView {
    /// No manager holds the lease: the map and decisions shown are its last ones.
    pub fn stale(&self) -> bool {
        self.holder.is_none()
    }
}

/// Everything read in one pass.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// Wall-clock ms when the read began.
    pub at_ms: u64,
    /// Per queue of the config, by name.
    pub queues: BTreeMap<String, QueueView>,
    /// Per host that ever reported and has not deregistered.
    pub hosts: BTreeMap<String, HostView>,
    /// The published slot map.
    pub map: Option<SlotMap>,
    /// The manager's lease.
    pub manager: ManagerView,
    /// Per external system of the config, by name.
    pub systems: BTreeMap<String, SystemView>,
    /// Hosts marked for draining (`gaffer drain`) that no master reports as: a mark made
    /// ahead of a host's start, or a misspelt name, which stays until `--cancel`.
    pub drain_marked_unknown: Vec<String>,
    /// Queues a config named once but the config in force does not, that still hold data
    /// ([`RetiredView::holds_data`]), by name.
    pub retired: BTreeMap<String, RetiredView>,
}

/// A retired queue: in the registry of names configs have named (`Keys::queues`), not in
/// the config in force. Nothing takes from it; its data stays until `gaffer queues retire`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RetiredView {
    /// Its counts and counters (zero when `refused`).
    pub stats: QueueStats,
    /// Whether it keeps task records: a listing finds one.
    pub records: bool,
    /// Why its data cannot be read: a layout this gaffer's scripts refuse (`gaffer migrate
    /// NAME` moves it on).
    pub refused: Option<String>,
}

impl RetiredView {
    /// Whether the queue holds anything an operator may want: a task in any state, a
    /// record, or data this gaffer cannot read. Counters alone (a drained queue's) are not.
    pub fn holds_data(&self) -> bool {
        let s = &self.stats;
        s.ready + s.delayed + s.leased + s.dead + s.frozen > 0
            || self.records
            || self.refused.is_some()
    }
}

/// The names in the registry of queues configs have named that `cfg` does not name: the
/// retired queues, whether or not they hold data.
pub async fn retired_names(
    client: &QueueClient,
    cfg: &Config,
) -> Result<BTreeSet<String>, QueueError> {
    let keys = Keys::new(&cfg.cluster.namespace);
    let mut names = super::registered_queues(&mut client.connection(), &keys).await?;
    names.retain(|n| !cfg.queues.contains_key(n));
    Ok(names)
}

/// What a queue holds: its counts, whether it keeps records, or why this gaffer cannot
/// read it. A retired queue is read with default limits (its config is gone).
pub async fn read_holdings(queue: &Queue) -> Result<RetiredView, QueueError> {
    let stats = match queue.stats().await {
        Err(e @ QueueError::Layout { .. }) => {
            return Ok(RetiredView {
                refused: Some(e.to_string()),
                ..RetiredView::default()
            });
        }
        other => other?,
    };
    let page = queue
        .list(&ListQuery {
            limit: 1,
            ..ListQuery::default()
        })
        .await?;
    Ok(RetiredView {
        stats,
        // (a page without a record but with a cursor passed over records whose time is
        // up, which stay until a sweep no one runs for a retired queue)
        records: !page.tasks.is_empty() || page.next_cursor.is_some(),
        refused: None,
    })
}

/// The retired queues that hold data, each read with default limits.
async fn read_retired(
    client: &QueueClient,
    cfg: &Config,
) -> Result<BTreeMap<String, RetiredView>, QueueError> {
    let names = retired_names(client, cfg).await?;
    let reads = names.into_iter().map(|name| async move {
        let view = read_holdings(&client.queue(&name)?).await?;
        Ok::<_, QueueError>((name, view))
    });
    Ok(futures::future::try_join_all(reads)
        .await?
        .into_iter()
        .filter(|(_, v)| v.holds_data())
        .collect())
}

/// One external system: its state (run-time switch or config), its queues and caps, and
/// what of them is in use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SystemView {
    /// Active, paused or disabled.
    pub state: SystemState,
    /// Whether the state is a run-time switch (`gaffer system`) rather than the config's.
    pub switched: bool,
    /// Its queues, by name.
    pub queues: Vec<String>,
    /// `max_concurrency` from the config: slots of all its queues together.
    pub max_concurrency: Option<u32>,
    /// `rate` from the config, tasks per second.
    pub rate_per_second: Option<f64>,
    /// Slots of its queues running now (live hosts' reports).
    pub slots: u32,
    /// Tasks its rate bucket let start so far (monotonic; 0 without a rate): the rate in
    /// use is its change over time.
    pub started_total: u64,
}

/// Which of the config's queues a read covers.
#[derive(Clone, Copy)]
pub enum Scope<'a> {
    /// Every queue, the systems and the retired queues: what `stats` and `top` show.
    All,
    /// Only the queues this says yes to, the systems they belong to (each naming only
    /// them) and no retired queue: what an api key limited to some queues sees, read
    /// without the cost of the others.
    Only(&'a (dyn Fn(&str) -> bool + Sync)),
}

impl Scope<'_> {
    fn covers(&self, queue: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Only(keep) => keep(queue),
        }
    }
}

/// Reads a snapshot of the cluster that `cfg` describes.
pub async fn read(client: &QueueClient, cfg: &Config) -> Result<Snapshot, QueueError> {
    read_scoped(client, cfg, Scope::All).await
}

/// Reads a snapshot of the cluster that `cfg` describes, of the queues `scope` covers
/// (the hosts, the map and the lease whole). The queues are read together, each one's
/// calls on the multiplexed connection beside the others', so a read of many queues
/// takes a few round trips rather than one per queue.
pub async fn read_scoped(
    client: &QueueClient,
    cfg: &Config,
    scope: Scope<'_>,
) -> Result<Snapshot, QueueError> {
    let at_ms = now_ms();
    let keys = Keys::new(&cfg.cluster.namespace);
    let mut conn = client.connection();
    let reports = super::read_hosts(&mut conn, &keys).await?;
    let map = super::read_map(&mut conn, &keys).await?;
    let decisions = read_decisions(&mut conn, &keys).await?;
    let paused: BTreeSet<String> = conn.smembers(keys.paused()).await?;
    let draining: BTreeSet<String> = conn.smembers(keys.draining()).await?;
    let manager = read_manager(&mut conn, &keys, map.as_ref()).await?;
    let timeout_ms = u64::try_from(cfg.manager.heartbeat_timeout.as_millis()).unwrap_or(u64::MAX);
    // The leader's verdicts while one leads (it times silence on its own clock, see
    // `manager/heartbeats.rs`); the report's age by ours otherwise, and for a host it has
    // not judged yet.
    let verdicts: BTreeMap<String, bool> = match manager.holder {
        Some(_) => {
            let raw: Option<String> = conn.get(keys.liveness()).await?;
            raw.and_then(|r| serde_json::from_str(&r).ok())
                .unwrap_or_default()
        }
        None => BTreeMap::new(),
    };
    let judge = Judge {
        verdicts: &verdicts,
        at_ms,
        timeout_ms,
    };
    let hosts = host_views(reports, &draining, &judge);
    let drain_marked_unknown = draining
        .iter()
        .filter(|h| !hosts.contains_key(*h))
        .cloned()
        .collect();
    let cluster = ClusterView {
        map: map.as_ref(),
        decisions: &decisions,
        paused: &paused,
        hosts: &hosts,
    };
    let reads = cfg
        .queues
        .iter()
        .filter(|(name, _)| scope.covers(name))
        .map(|(name, qc)| async {
            Ok::<_, QueueError>((name.clone(), read_queue(client, name, qc, &cluster).await?))
        });
    let queues: BTreeMap<String, QueueView> = futures::future::try_join_all(reads)
        .await?
        .into_iter()
        .collect();
    let systems = read_systems(client, cfg, &queues, scope).await?;
    let retired = match scope {
        Scope::All => read_retired(client, cfg).await?,
        Scope::Only(_) => BTreeMap::new(),
    };
    Ok(Snapshot {
        at_ms,
        queues,
        hosts,
        map,
        manager,
        systems,
        drain_marked_unknown,
        retired,
    })
}

/// Every system of the config with its switch, its queues' slots and its bucket's count;
/// within a scope, the systems of its queues, each naming only those.
async fn read_systems(
    client: &QueueClient,
    cfg: &Config,
    queues: &BTreeMap<String, QueueView>,
    scope: Scope<'_>,
) -> Result<BTreeMap<String, SystemView>, QueueError> {
    let switches = client.system_switches().await?;
    let states = system_states(cfg, &switches);
    let mut out = BTreeMap::new();
    for (name, sys) in &cfg.systems {
        let members: Vec<String> = cfg
            .queues
            .values()
            .filter(|q| q.system.as_deref() == Some(name.as_str()) && scope.covers(&q.name))
            .map(|q| q.name.clone())
            .collect();
        if members.is_empty() && matches!(scope, Scope::Only(_)) {
            continue;
        }
        let slots = members
            .iter()
            .filter_map(|q| queues.get(q))
            .map(|q| q.slots)
            .sum();
        let started_total = if sys.rate.is_some() {
            client.system_granted(name).await?
        } else {
            0
        };
        let view = SystemView {
            state: states.get(name).copied().unwrap_or(SystemState::Active),
            switched: switches.contains_key(name),
            queues: members,
            max_concurrency: sys.max_concurrency,
            rate_per_second: sys.rate.map(|r| r.per_second),
            slots,
            started_total,
        };
        out.insert(name.clone(), view);
    }
    Ok(out)
}

/// The manager's last decisions; none when it wrote none or they do not parse.
async fn read_decisions(
    conn: &mut RedisConn,
    keys: &Keys,
) -> Result<BTreeMap<String, DecisionView>, QueueError> {
    let raw: Option<String> = conn.get(keys.decisions()).await?;
    Ok(raw
        .and_then(|r| serde_json::from_str(&r).ok())
        .unwrap_or_default())
}

/// Who holds the lease, for how long yet, and who wrote `map`.
async fn read_manager(
    conn: &mut RedisConn,
    keys: &Keys,
    map: Option<&SlotMap>,
) -> Result<ManagerView, QueueError> {
    let (lease, ttl): (Option<String>, i64) = redis::pipe()
        .get(keys.lease())
        .cmd("PTTL")
        .arg(keys.lease())
        .query_async(conn)
        .await?;
    let (holder, epoch) = match lease.as_deref().and_then(|l| l.rsplit_once(':')) {
        Some((id, epoch)) => (Some(id.to_string()), epoch.parse().ok()),
        None => (None, None),
    };
    Ok(ManagerView {
        holder,
        epoch,
        lease_ttl_ms: u64::try_from(ttl).ok(),
        map_epoch: map.map(|m| m.epoch),
        map_version: map.map(|m| m.version),
    })
}

/// How a host is judged alive or dead.
struct Judge<'a> {
    /// The leading manager's verdicts, by host.
    verdicts: &'a BTreeMap<String, bool>,
    /// Now, for a host without a verdict: dead once its report is older than `timeout_ms`.
    at_ms: u64,
    timeout_ms: u64,
}

impl Judge<'_> {
    fn alive(&self, name: &str, report: &HostReport) -> bool {
        match self.verdicts.get(name) {
            Some(&alive) => alive,
            None => self.at_ms.saturating_sub(report.ts_ms) <= self.timeout_ms,
        }
    }
}

/// Every host's report and what it means.
fn host_views(
    reports: BTreeMap<String, HostReport>,
    draining: &BTreeSet<String>,
    judge: &Judge<'_>,
) -> BTreeMap<String, HostView> {
    reports
        .into_iter()
        .map(|(name, report)| {
            let state = if !judge.alive(&name, &report) {
                HostState::Dead
            } else if report.draining {
                HostState::Draining
            } else {
                HostState::Alive
            };
            let view = HostView {
                state,
                drain_requested: draining.contains(&name),
                report,
            };
            (name, view)
        })
        .collect()
}

/// What a queue's view takes from the cluster beside its own keys.
struct ClusterView<'a> {
    map: Option<&'a SlotMap>,
    decisions: &'a BTreeMap<String, DecisionView>,
    paused: &'a BTreeSet<String>,
    hosts: &'a BTreeMap<String, HostView>,
}

/// One queue: its config, its counters and intake from Redis, and the cluster's view of
/// it, with the figures of live hosts summed.
async fn read_queue(
    client: &QueueClient,
    name: &str,
    qc: &QueueConfig,
    cluster: &ClusterView<'_>,
) -> Result<QueueView, QueueError> {
    let queue = client.queue_with(name, QueueLimits::from(qc))?;
    // Both requests go out together on the multiplexed connection: one round trip.
    let (stats, intake) = futures::join!(queue.stats(), queue.intake());
    let intake = intake?;
    let (stats, mut refused) = match stats {
        Err(e @ QueueError::Layout { .. }) => (QueueStats::default(), Some(e.to_string())),
        other => (other?, None),
    };
    for (host, h) in cluster
        .hosts
        .iter()
        .filter(|(_, h)| h.state != HostState::Dead)
    {
        if let Some(reason) = h.report.queues.get(name).and_then(|r| r.refused.as_ref()) {
            refused.get_or_insert_with(|| format!("host {host}: {reason}"));
        }
    }
    let mut view = QueueView {
        priority: qc.priority,
        min_slots: qc.min_slots,
        max_slots: qc.max_slots,
        stats,
        slots: 0,
        mapped: cluster
            .map
            .map_or(0, |m| m.hosts.values().filter_map(|q| q.get(name)).sum()),
        decision: cluster.decisions.get(name).cloned(),
        paused: cluster.paused.contains(name),
        intake,
        track: qc.track,
        processed_total: 0,
        failed_total: 0,
        busy_seconds_total: 0.0,
        recycles_total: 0,
        crashes_total: 0,
        last_crash: None,
        refused,
        kind: qc.kind,
        long_running: Vec::new(),
    };
    if qc.is_long() && qc.track {
        view.long_running = read_long_running(&queue).await?;
    }
    for h in cluster
        .hosts
        .values()
        .filter(|h| h.state != HostState::Dead)
    {
        if let Some(r) = h.report.queues.get(name) {
            view.slots += r.slots;
            view.processed_total += r.processed_total;
            view.failed_total += r.failed_total;
            view.busy_seconds_total += r.busy_seconds_total;
            view.recycles_total += r.recycles_total;
            view.crashes_total += r.crashes_total;
            if let Some(crash) = &r.last_crash
                && view
                    .last_crash
                    .as_ref()
                    .is_none_or(|(_, newest)| crash.at_ms > newest.at_ms)
            {
                view.last_crash = Some((h.report.host.clone(), crash.clone()));
            }
        }
    }
    Ok(view)
}

/// A long queue's running tasks from their records: the listing finds them, each record's
/// running entry says where and since when. The reads go out together.
async fn read_long_running(queue: &Queue) -> Result<Vec<LongRunning>, QueueError> {
    let mut query = ListQuery {
        state: Some(RecordState::Running),
        limit: MAX_LONG_SHOWN,
        ..ListQuery::default()
    };
    let mut page = queue.list(&query).await?;
    // A page looks at a bounded number of records (`Queue::list`): running tasks behind
    // many ended ones are found on the next pages, as far as LONG_SCAN_PAGES of them.
    for _ in 1..LONG_SCAN_PAGES {
        if page.tasks.len() >= MAX_LONG_SHOWN {
            break;
        }
        let Some(cursor) = page.next_cursor.take() else {
            break;
        };
        query.cursor = Some(cursor);
        query.limit = MAX_LONG_SHOWN - page.tasks.len();
        let more = queue.list(&query).await?;
        page.tasks.extend(more.tasks);
        page.next_cursor = more.next_cursor;
    }
    let records =
        futures::future::try_join_all(page.tasks.iter().map(|t| queue.record(&t.id))).await?;
    Ok(records
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let run = r.history.as_ref()?.last()?.clone();
            let since_ms = chrono::DateTime::parse_from_rfc3339(&run.at)
                .map_or(0, |t| t.timestamp_millis().max(0) as u64);
            Some(LongRunning {
                id: r.id,
                host: run.host.unwrap_or_default(),
                slot: run.slot,
                since_ms,
            })
        })
        .collect())
}

/// The `stats --json` document (a contract: keys are added, never renamed); the api's
/// `GET /v1/queues` is its `queues` part.
pub fn stats_json(snap: &Snapshot) -> serde_json::Value {
    let qs: serde_json::Map<String, serde_json::Value> = snap
        .queues
        .iter()
        .map(|(name, q)| {
            let d = q.decision.as_ref();
            let mut entry = counts_json(&q.stats);
            entry.extend(object(json!({
                    "slots": q.slots,
                    "mapped": q.mapped,
                    "wanted": d.map(|d| d.wanted),
                    "load": d.and_then(|d| d.load),
                    "reasons": d.map(|d| d.reasons.clone()),
                    "paused": q.paused,
                    "intake": q.intake.as_str(), "track": q.track, "kind": q.kind.as_str(),
                    "priority": q.priority, "min_slots": q.min_slots, "max_slots": q.max_slots,
                    "processed_total": q.processed_total, "failed_total": q.failed_total,
                    "busy_seconds_total": q.busy_seconds_total,
                    "recycles_total": q.recycles_total, "crashes_total": q.crashes_total,
                    "last_crash": q.last_crash.as_ref().map(|(host, c)| json!({
                        "host": host, "reason": c.reason, "at_ms": c.at_ms,
                    })),
                    "refused": q.refused,
            })));
            (name.clone(), serde_json::Value::Object(entry))
        })
        .collect();
    let hosts: serde_json::Map<String, serde_json::Value> = snap
        .hosts
        .iter()
        .map(|(name, h)| {
            let r = &h.report;
            (
                name.clone(),
                json!({
                    "alive": h.state != HostState::Dead, "state": h.state.as_str(),
                    "draining": r.draining, "drain_requested": h.drain_requested,
                    "capacity": r.capacity, "slots": r.slots, "pss_bytes": r.pss_bytes,
                    "mem_available_bytes": r.mem_available_bytes,
                    "memory_budget_bytes": r.memory_budget_bytes, "load1": r.load1,
                    "cpus": r.cpus, "cpu_pressure": r.cpu_pressure,
                    "capacity_bound": r.capacity_bound, "handlers": r.handlers, "map_version": r.map_version, "map_epoch": r.map_epoch,
                    "last_seen_ms": r.ts_ms,
                    "queues": r.queues.iter().map(|(q, qr)| (q.clone(), json!(qr.slots)))
                        .collect::<serde_json::Map<_, _>>(),
                    // (beside "queues", whose values are slot counts and stay so)
                    "queue_pss_bytes": r.queues.iter().map(|(q, qr)| (q.clone(), json!(qr.pss_bytes)))
                        .collect::<serde_json::Map<_, _>>(),
                    // (the published map's slots for the host, which "queues" may not
                    // match yet)
                    "mapped": snap.map.as_ref().and_then(|m| m.hosts.get(name))
                        .map(|qs| json!(qs)).unwrap_or_else(|| json!({})),
                    // null in a report of a master from before it
                    "redis": r.redis,
                }),
            )
        })
        .collect();
    let m = &snap.manager;
    json!({
        "at_ms": snap.at_ms,
        "queues": qs,
        "hosts": hosts,
        "systems": systems_json(snap),
        "retired": retired_json(snap),
        "drain_marked_unknown_hosts": snap.drain_marked_unknown,
        "manager": {
            "epoch": m.map_epoch,
            "map_version": m.map_version,
            "leader": m.holder,
            "lease_epoch": m.epoch,
            "lease_ttl_ms": m.lease_ttl_ms,
            "stale": m.stale(),
        },
    })
}

/// `stats --json`'s `systems`: per system its state, queues, caps and use.
fn systems_json(snap: &Snapshot) -> serde_json::Value {
    let systems: serde_json::Map<String, serde_json::Value> = snap
        .systems
        .iter()
        .map(|(name, s)| {
            (
                name.clone(),
                json!({
                    "state": s.state.as_str(), "switched": s.switched, "queues": s.queues,
                    "max_concurrency": s.max_concurrency, "rate": s.rate_per_second,
                    "slots": s.slots, "started_total": s.started_total,
                }),
            )
        })
        .collect();
    serde_json::Value::Object(systems)
}

/// A span of `ms` milliseconds as a table shows it: `4.2s`, `37s`, `12m05s`, `3h20m`.
pub fn age_text(ms: u64) -> String {
    let s = ms / 1000;
    if ms < 10_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    }
}

/// The Redis node a role talks to, in words: `10.0.0.5:6379`, with the topology when it
/// is not one server, and the failovers when there were some, the last one's age as of
/// `now_ms` (`10.0.0.6:6379 (sentinel) · 2 failovers, the last 2m05s ago`).
pub fn redis_text(r: &RedisNode, now_ms: u64) -> String {
    let mut text = crate::printable::printable(&r.node).into_owned();
    if r.node.is_empty() {
        text.push('?');
    }
    if r.topology != Topology::Single {
        text.push_str(&format!(" ({})", r.topology.as_str()));
    }
    match (r.failovers, r.last_failover_ms()) {
        (0, _) => {}
        (1, Some(at)) => text.push_str(&format!(
            " · 1 failover {} ago",
            age_text(now_ms.saturating_sub(at))
        )),
        (n, Some(at)) => text.push_str(&format!(
            " · {n} failovers, the last {} ago",
            age_text(now_ms.saturating_sub(at))
        )),
        (1, None) => text.push_str(" · 1 failover"),
        (n, None) => text.push_str(&format!(" · {n} failovers")),
    }
    text
}

/// How late a queue is, as its tables show it: its oldest due task's age, `-` when none
/// waits.
pub fn late_text(oldest_due_age_ms: u64) -> String {
    if oldest_due_age_ms == 0 {
        "-".into()
    } else {
        age_text(oldest_due_age_ms)
    }
}

/// `stats --json`'s `retired`: per retired queue holding data, [`holdings_json`].
fn retired_json(snap: &Snapshot) -> serde_json::Value {
    let retired: serde_json::Map<String, serde_json::Value> = snap
        .retired
        .iter()
        .map(|(name, r)| (name.clone(), holdings_json(r)))
        .collect();
    serde_json::Value::Object(retired)
}

/// What a queue holds as JSON: its counts under the keys a configured queue's entry in
/// `stats --json` gives them, whether it keeps records, and why it cannot be read if it
/// cannot.
pub fn holdings_json(r: &RetiredView) -> serde_json::Value {
    let mut entry = counts_json(&r.stats);
    entry.extend(object(json!({"records": r.records, "refused": r.refused})));
    serde_json::Value::Object(entry)
}

/// A queue's own counts and counters, under the keys every queue entry of `stats --json`
/// gives them (a configured queue's and a retired one's alike).
fn counts_json(s: &QueueStats) -> serde_json::Map<String, serde_json::Value> {
    object(json!({
        "ready": s.ready, "delayed": s.delayed, "leased": s.leased, "dead": s.dead,
        "frozen": s.frozen, "oldest_due_age_ms": s.oldest_due_age_ms,
        "enqueued_total": s.enqueued_total, "acked_total": s.acked_total,
        "retried_total": s.retried_total, "dead_total": s.dead_total,
        "stale_total": s.stale_total, "expired_total": s.expired_total,
    }))
}

/// The fields of a `json!` object literal.
fn object(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}
