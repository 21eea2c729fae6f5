//! From text to a checked [`Config`]: parse once with spans, deserialize each table on its
//! own, then check meanings, collecting every problem on the way.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use super::error::{Collector, Diagnostics};
use super::raw::{
    HANDLER_KEYS, Human, RawApi, RawApiKey, RawCluster, RawManager, RawMaster, RawQueue, RawRetry,
    RawSchedule, RawSystem, S, Size,
};
use super::values::{self, Rate, WorkPeriod};
use super::{
    ApiConfig, ApiKey, Backoff, ClusterConfig, Config, CpuScheduling, DEFAULT_LONG_LEASE,
    DEFAULT_TIMEOUT_GRACE, Dedup, Handler, Intake, KeyQueues, LongAtWindowEnd, MAX_BATCH,
    MAX_LONG_LEASE, MIN_LONG_LEASE, ManagerConfig, MasterConfig, QueueConfig, QueueKind,
    RetryPolicy, Schedule, Start, SystemConfig,
};

const TOP_KEYS: [&str; 7] = [
    "cluster",
    "manager",
    "master",
    "queues",
    "systems",
    "schedules",
    "api",
];

const DEDUP_NAMES: [&str; 2] = ["active", "record"];

/// Redis refuses larger values: bounds `max_payload`, `max_result` and `[api].max_body`.
const MAX_PAYLOAD_LIMIT: u64 = 512 << 20;
/// Smallest `[api].max_body` (docs/API.md: 1KiB to 512MiB).
const MIN_MAX_BODY: u64 = 1 << 10;
/// Shortest `[manager].tick`.
const MIN_TICK: Duration = Duration::from_millis(100);
/// Shortest `[manager].heartbeat_timeout`: two of a master's reports (one a second).
const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest `[api].read_timeout`: a client slower than that is no client.
const MAX_READ_TIMEOUT: Duration = Duration::from_secs(600);
/// Most `[api].max_listings_per_key` (docs/API.md).
const MAX_LISTINGS_PER_KEY: i64 = 1000;
/// Longest `[api].max_wait` (docs/API.md: at most 1h).
const MAX_MAX_WAIT: Duration = Duration::from_secs(3600);

/// Checks config text whole: every problem is collected, and a config comes back only
/// when there is none. `custom` names the handlers the binary registers beside gaffer's own.
pub(crate) fn parse(source: &str, origin: &str, custom: &[String]) -> Result<Config, Diagnostics> {
    let mut c = Collector::new(source, origin);
    let Some(root) = syntax(&mut c, source) else {
        return Err(c.finish());
    };
    let root = root.get_ref();
    unknown_top_keys(&mut c, root);

    let declared_queues = declared_names(root, "queues");
    let declared_systems = declared_names(root, "systems");

    let cluster = section::<RawCluster>(&mut c, root, "cluster")
        .map(|raw| cluster(&mut c, raw))
        .unwrap_or_default();
    let manager = section::<RawManager>(&mut c, root, "manager")
        .map(|raw| manager(&mut c, raw))
        .unwrap_or_default();
    let master = section::<RawMaster>(&mut c, root, "master")
        .map(|raw| master(&mut c, raw))
        .unwrap_or_default();
    let mut queues = queues(&mut c, root, &declared_systems, custom);
    let systems = systems(&mut c, root);
    bind_systems(&mut queues, &systems);
    let schedules = schedules(&mut c, root, &declared_queues);
    let api = api(&mut c, root, &declared_queues);
    super::routes::routes(&mut c, root, &mut queues);

    if !c.is_empty() {
        return Err(c.finish());
    }
    Ok(Config {
        origin: origin.to_owned(),
        cluster,
        manager,
        master,
        queues,
        systems,
        schedules,
        api,
    })
}

/// The document's tree with spans; `None` (with the error collected) when it is not TOML,
/// since nothing else can be checked then.
fn syntax<'i>(c: &mut Collector, source: &'i str) -> Option<Spanned<DeTable<'i>>> {
    match DeTable::parse(source) {
        Ok(root) => Some(root),
        Err(e) => {
            let span = e.span().unwrap_or(0..0);
            c.error(span, "", format!("syntax error: {}", e.message()));
            None
        }
    }
}

fn unknown_top_keys(c: &mut Collector, root: &DeTable) {
    for (key, _) in root.iter() {
        if !TOP_KEYS.contains(&key.get_ref().as_ref()) {
            c.error(
                key.span(),
                &join("", key.get_ref()),
                unknown_key(key.get_ref(), &TOP_KEYS),
            );
        }
    }
}

/// Every `[queues.NAME]`, each checked on its own so one broken queue hides no other.
fn queues(
    c: &mut Collector,
    root: &DeTable,
    systems: &BTreeSet<String>,
    custom: &[String],
) -> BTreeMap<String, QueueConfig> {
    let mut queues = BTreeMap::new();
    let Some(table) = find(root, "queues").and_then(|v| table_of(c, v, "queues")) else {
        return queues;
    };
    for (name, value) in table.iter() {
        let name_text: &str = name.get_ref();
        let path = join("queues", name_text);
        if !values::is_valid_name(name_text) {
            c.error(
                name.span(),
                &path,
                "invalid queue name, use 1 to 128 characters from A-Z a-z 0-9 _ . - \
                 (it becomes part of Redis keys)",
            );
        }
        let Some(qtable) = table_of(c, value, &path) else {
            continue;
        };
        let Some(raw) = deserialize::<RawQueue>(c, value, &path) else {
            continue;
        };
        let ctx = QueueCtx {
            name: name_text,
            path: &path,
            span: value.span(),
            table: qtable,
            systems,
            custom,
        };
        queues.insert(name_text.to_owned(), queue(c, ctx, raw));
    }
    queues
}

/// Every `[systems.NAME]`, each checked on its own.
fn systems(c: &mut Collector, root: &DeTable) -> BTreeMap<String, SystemConfig> {
    let mut systems = BTreeMap::new();
    let Some(table) = find(root, "systems").and_then(|v| table_of(c, v, "systems")) else {
        return systems;
    };
    for (name, value) in table.iter() {
        let name_text: &str = name.get_ref();
        let path = join("systems", name_text);
        if !values::is_valid_name(name_text) {
            c.error(
                name.span(),
                &path,
                "invalid system name, use 1 to 128 characters from A-Z a-z 0-9 _ . -",
            );
        }
        if table_of(c, value, &path).is_none() {
            continue;
        }
        if let Some(raw) = deserialize::<RawSystem>(c, value, &path) {
            systems.insert(name_text.to_owned(), system(c, name_text, &path, raw));
        }
    }
    systems
}

/// Every `[[schedules]]`, in file order, each under a name no other has.
fn schedules(c: &mut Collector, root: &DeTable, queues: &BTreeSet<String>) -> Vec<Schedule> {
    let Some(value) = find(root, "schedules") else {
        return Vec::new();
    };
    let DeValue::Array(items) = value.get_ref() else {
        c.error(
            value.span(),
            "schedules",
            format!(
                "expected an array of tables written as [[schedules]], found {}",
                value.get_ref().type_str()
            ),
        );
        return Vec::new();
    };
    let mut schedules = Vec::new();
    let mut names = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("schedules[{i}]");
        if table_of(c, item, &path).is_none() {
            continue;
        }
        let Some(raw) = deserialize::<RawSchedule>(c, item, &path) else {
            continue;
        };
        if let Some(name) = schedule_name(c, &path, i, &raw) {
            names.push(name);
        }
        if let Some(s) = schedule(c, &path, i, item.span(), raw, queues) {
            schedules.push(s);
        }
    }
    unique_schedule_names(c, &names);
    schedules
}

/// A schedule's name as [`schedule_name`] reads it: its text, where it is written (`None`:
/// the default `QUEUE.N`), and its entry's index.
struct ScheduleName {
    text: String,
    span: Option<Range<usize>>,
    index: usize,
}

/// The name of `schedules[index]`: its `name`, checked, or the default `QUEUE.N`; `None`
/// when it has neither (no valid name, or no queue to name it after).
fn schedule_name(
    c: &mut Collector,
    path: &str,
    index: usize,
    raw: &RawSchedule,
) -> Option<ScheduleName> {
    match &raw.name {
        Some(name) if values::is_valid_name(name.get_ref()) => Some(ScheduleName {
            text: name.get_ref().clone(),
            span: Some(name.span()),
            index,
        }),
        Some(name) => {
            c.error(
                name.span(),
                &join(path, "name"),
                "invalid schedule name, use 1 to 128 characters from A-Z a-z 0-9 _ . -",
            );
            None
        }
        None => raw.queue.as_ref().map(|q| ScheduleName {
            text: crate::schedule::default_name(q.get_ref(), index),
            span: None,
            index,
        }),
    }
}

/// Refuses a name two schedules share, at the written one (the later, when both are).
fn unique_schedule_names(c: &mut Collector, names: &[ScheduleName]) {
    let mut seen: BTreeMap<&str, &ScheduleName> = BTreeMap::new();
    for n in names {
        let Some(first) = seen.get(n.text.as_str()).copied() else {
            seen.insert(&n.text, n);
            continue;
        };
        let (at, other) = if n.span.is_some() {
            (n, first)
        } else {
            (first, n)
        };
        let Some(span) = at.span.clone() else {
            continue; // (two default names never meet: each holds its own index)
        };
        let why = if other.span.is_some() {
            format!("schedules[{}] has it already", other.index)
        } else {
            format!(
                "it is the name of schedules[{}], which has none of its own (QUEUE.N)",
                other.index
            )
        };
        c.error(
            span,
            &format!("schedules[{}].name", at.index),
            format!("duplicate schedule name `{}`: {why}", n.text),
        );
    }
}
// ---------------------------------------------------------------------------------------
// Sections

fn cluster(c: &mut Collector, raw: RawCluster) -> ClusterConfig {
    let mut out = ClusterConfig::default();
    if let Some(url) = raw.redis {
        if let Err(m) = values::check_redis_url(url.get_ref()) {
            c.error(url.span(), "cluster.redis", m);
        }
        out.redis = Some(url.into_inner());
    }
    if let Some(ns) = raw.namespace {
        if !values::is_valid_name(ns.get_ref()) {
            c.error(
                ns.span(),
                "cluster.namespace",
                format!(
                    "invalid namespace `{}`, use 1 to 128 characters from A-Z a-z 0-9 _ . -",
                    ns.get_ref()
                ),
            );
        }
        out.namespace = ns.into_inner();
    }
    if let Some(file) = raw.redis_password_file {
        if file.get_ref().trim().is_empty() {
            c.error(
                file.span(),
                "cluster.redis_password_file",
                "must not be empty",
            );
        }
        out.redis_password_file = Some(PathBuf::from(file.into_inner()));
    }
    let tls = [raw.redis_ca_file, raw.redis_cert_file, raw.redis_key_file];
    cluster_tls(c, tls, &mut out);
    out.wait_replicas = int(
        c,
        "cluster",
        "wait_replicas",
        raw.wait_replicas,
        out.wait_replicas,
        0,
        u32::MAX.into(),
    );
    let ceiling = (
        super::MAX_WAIT_TIMEOUT,
        "5s: a write's WAIT holds its connection, and every call behind it, that long",
    );
    out.wait_timeout = duration_at_most(
        c,
        ("cluster", "wait_timeout"),
        raw.wait_timeout,
        out.wait_timeout,
        ceiling,
    );
    out
}

/// The TLS files of `[cluster]`: paths only (read when connecting, as the password file),
/// a client certificate with its key or neither, and a URL that can carry TLS.
fn cluster_tls(c: &mut Collector, files: [S<String>; 3], out: &mut ClusterConfig) {
    let [ca, cert, key] = files;
    let keys = [
        ("cluster.redis_ca_file", &ca),
        ("cluster.redis_cert_file", &cert),
        ("cluster.redis_key_file", &key),
    ];
    for (key, file) in keys {
        if let Some(f) = file
            && f.get_ref().trim().is_empty()
        {
            c.error(f.span(), key, "must not be empty");
        }
    }
    match (&cert, &key) {
        (Some(cert), None) => c.error(
            cert.span(),
            "cluster.redis_cert_file",
            "a client certificate needs its key: set cluster.redis_key_file too, or neither",
        ),
        (None, Some(key)) => c.error(
            key.span(),
            "cluster.redis_key_file",
            "a client key needs its certificate: set cluster.redis_cert_file too, or neither",
        ),
        _ => {}
    }
    let plain_url = out
        .redis
        .as_deref()
        .is_some_and(|u| !crate::queue_client::uses_tls(u));
    if plain_url
        && let Some((name, f)) = keys
            .iter()
            .find_map(|(name, f)| f.as_ref().map(|f| (*name, f)))
    {
        c.error(
            f.span(),
            name,
            "these TLS files need a rediss:// url in cluster.redis",
        );
    }
    let path = |f: S<String>| f.map(|f| PathBuf::from(f.into_inner()));
    out.redis_ca_file = path(ca);
    out.redis_cert_file = path(cert);
    out.redis_key_file = path(key);
}

fn manager(c: &mut Collector, raw: RawManager) -> ManagerConfig {
    let d = ManagerConfig::default();
    let timezone = raw
        .timezone
        .map_or(Some(d.timezone), |tz| timezone(c, "manager.timezone", &tz))
        .unwrap_or(d.timezone);
    let tick = duration_at_least(
        c,
        ("manager", "tick"),
        raw.tick,
        d.tick,
        (MIN_TICK, "each tick reads every queue's stats"),
    );
    let heartbeat_timeout = duration_at_least(
        c,
        ("manager", "heartbeat_timeout"),
        raw.heartbeat_timeout,
        d.heartbeat_timeout,
        (
            MIN_HEARTBEAT_TIMEOUT,
            "masters report every second, so a shorter timeout declares live hosts dead",
        ),
    );
    let forget_hosts_after = forget_hosts_after(c, raw.forget_hosts_after, heartbeat_timeout);
    ManagerConfig {
        http: listen_addr(c, "manager.http", raw.http, d.http),
        tick,
        timezone,
        heartbeat_timeout,
        forget_hosts_after,
    }
}

/// `[manager].forget_hosts_after`: longer than the heartbeat timeout, or a host would be
/// forgotten before it counts as dead.
fn forget_hosts_after(
    c: &mut Collector,
    raw: S<Human<Duration>>,
    heartbeat_timeout: Duration,
) -> Duration {
    // (a heartbeat timeout of a day or more moves the default past it)
    let default = ManagerConfig::default()
        .forget_hosts_after
        .max(heartbeat_timeout.saturating_mul(2));
    duration_checked(c, ("manager", "forget_hosts_after"), raw, default, |got| {
        (got <= heartbeat_timeout).then(|| {
            format!(
                "must be longer than heartbeat_timeout ({}), got {}: a host is forgotten only once it is dead",
                humantime::format_duration(heartbeat_timeout),
                humantime::format_duration(got)
            )
        })
    })
}

/// An `IP:PORT` to listen on; `default` (with an error collected) when it is not one.
fn listen_addr(
    c: &mut Collector,
    key: &str,
    raw: S<String>,
    default: std::net::SocketAddr,
) -> std::net::SocketAddr {
    let Some(addr) = raw else {
        return default;
    };
    addr.get_ref().parse().unwrap_or_else(|_| {
        c.error(
            addr.span(),
            key,
            format!(
                "invalid listen address `{}`, expected IP:PORT like \"127.0.0.1:{}\"",
                addr.get_ref(),
                default.port()
            ),
        );
        default
    })
}

fn master(c: &mut Collector, raw: RawMaster) -> MasterConfig {
    let d = MasterConfig::default();
    let http = listen_addr(c, "master.http", raw.http, d.http);
    MasterConfig {
        memory_reserve: size(
            c,
            "master",
            "memory_reserve",
            raw.memory_reserve,
            d.memory_reserve,
            Zero::Allowed,
        ),
        slot_estimate: size(
            c,
            "master",
            "slot_estimate",
            raw.slot_estimate,
            d.slot_estimate,
            Zero::Refused,
        ),
        drain_timeout: duration(
            c,
            "master",
            "drain_timeout",
            raw.drain_timeout,
            d.drain_timeout,
            Zero::Allowed,
        ),
        http,
        max_slots: raw
            .max_slots
            .map(|v| int(c, "master", "max_slots", Some(v), 0u32, 1, u32::MAX.into())),
    }
}

struct QueueCtx<'a> {
    name: &'a str,
    path: &'a str,
    span: Range<usize>,
    table: &'a DeTable<'a>,
    systems: &'a BTreeSet<String>,
    custom: &'a [String],
}

/// One `[queues.NAME]` table, step by step; each step collects its own problems and keeps
/// the default where a value is wrong, so checking goes on.
fn queue(c: &mut Collector, q: QueueCtx, raw: RawQueue) -> QueueConfig {
    let handler = handler(c, &q, &raw);
    let mut out = QueueConfig::new(q.name, handler);
    slots(c, &q, &raw, &mut out);
    timing(c, q.path, &raw, &mut out);
    limits(c, &q, &raw, &mut out);
    records(c, q.path, &raw, &mut out);
    prefetch(c, q.path, &raw, &mut out);
    ordered(c, q.path, &raw, &mut out);
    long_kind(c, &q, &raw, &mut out);
    timeout(c, q.path, &raw, &mut out);
    out
}

/// `timeout`: a batch queue's time limit per task, refused on a long queue (whose tasks
/// run until cancelled, under their own rules) and above `max_batch_time` (whose watchdog
/// would kill the slot first). With it, `cancel_grace` is the exec child's time between
/// the cancel line and SIGTERM, [`DEFAULT_TIMEOUT_GRACE`] unless written.
fn timeout(c: &mut Collector, path: &str, raw: &RawQueue, out: &mut QueueConfig) {
    let Some(t) = &raw.timeout else { return };
    let at = join(path, "timeout");
    if out.is_long() {
        c.error(
            t.span(),
            &at,
            "timeout does not apply to kind = \"long\": a long task runs until it returns or is cancelled (`gaffer tasks cancel`), within its work periods",
        );
        return;
    }
    let limit = duration(
        c,
        path,
        "timeout",
        Some(t.clone()),
        Duration::ZERO,
        Zero::Refused,
    );
    if limit.is_zero() {
        return;
    }
    if limit > out.max_batch_time {
        c.error(
            t.span(),
            &at,
            format!(
                "timeout ({}) exceeds max_batch_time ({}): the watchdog would kill the slot before the task's time is up",
                humantime::format_duration(limit),
                humantime::format_duration(out.max_batch_time)
            ),
        );
        return;
    }
    out.timeout = Some(limit);
    out.cancel_grace = duration(
        c,
        path,
        "cancel_grace",
        raw.cancel_grace.clone(),
        DEFAULT_TIMEOUT_GRACE,
        Zero::Allowed,
    );
}

/// `ordered`: one task at a time, so refused with a batch of more than one task, with
/// `prefetch` (which would lease the next task while the head runs) or with a retry
/// priority (a retry keeps its place at the head).
fn ordered(c: &mut Collector, path: &str, raw: &RawQueue, out: &mut QueueConfig) {
    let Some(o) = &raw.ordered else { return };
    out.ordered = *o.get_ref();
    if !out.ordered {
        return;
    }
    let written = raw.batch_size.as_ref().map(|b| *b.get_ref());
    if written.is_none() {
        // One at a time is what an ordered queue means: its default batch.
        out.batch_size = 1;
    } else if out.batch_size != 1 && written == Some(i64::from(out.batch_size)) {
        // (a batch_size that was itself refused is reported once, as that)
        c.error(
            o.span(),
            &join(path, "ordered"),
            format!(
                "ordered = true needs batch_size = 1, got {}: an ordered queue runs one task at a time",
                out.batch_size
            ),
        );
    }
    if out.prefetch {
        c.error(
            o.span(),
            &join(path, "ordered"),
            "ordered = true cannot be combined with prefetch = true: a prefetched task would be leased while the one before it runs",
        );
    }
    if out.retry.priority.is_some() {
        c.error(
            o.span(),
            &join(path, "ordered"),
            "ordered = true cannot be combined with retry.priority: an ordered queue has one order, creation, and a retry keeps its place at the head",
        );
    }
}

/// Copies each queue's system settings a slot enforces at take time (its `rate` and
/// configured `paused`) into the queue, so a slot needs nothing but its queue's config.
fn bind_systems(
    queues: &mut BTreeMap<String, QueueConfig>,
    systems: &BTreeMap<String, SystemConfig>,
) {
    // One bucket per system: it saves up to the largest batch of any of its queues.
    let mut bursts: BTreeMap<String, u32> = BTreeMap::new();
    for q in queues.values() {
        if let Some(name) = &q.system {
            let b = bursts.entry(name.clone()).or_default();
            *b = (*b).max(q.batch_size);
        }
    }
    for q in queues.values_mut() {
        let Some(name) = &q.system else { continue };
        if let Some(s) = systems.get(name) {
            q.system_rate = s.rate;
            q.system_paused = s.paused;
            if s.rate.is_some() {
                q.system_burst = bursts.get(name).copied().unwrap_or(q.batch_size);
            }
        }
    }
}

/// `kind`, `cancel_grace` and `max_per_host`: a long queue runs one task per slot
/// (`batch_size` 1, no `prefetch`) under a lease of whole seconds between
/// [`MIN_LONG_LEASE`] and [`MAX_LONG_LEASE`] that its slots renew every second; the two
/// other keys only mean something for such a queue.
fn long_kind(c: &mut Collector, q: &QueueCtx, raw: &RawQueue, out: &mut QueueConfig) {
    let path = q.path;
    let mut kind_known = true;
    if raw.kind.is_some() {
        match one_of(
            c,
            path,
            "kind",
            &raw.kind,
            &QueueKind::NAMES,
            QueueKind::parse,
        ) {
            Some(kind) => out.kind = kind,
            None => kind_known = false,
        }
    }
    out.cancel_grace = duration(
        c,
        path,
        "cancel_grace",
        raw.cancel_grace.clone(),
        out.cancel_grace,
        Zero::Allowed,
    );
    out.max_per_host = raw
        .max_per_host
        .clone()
        .map(|v| int(c, path, "max_per_host", Some(v), 1, 1, i64::from(u32::MAX)));
    // (after an unknown kind, which was meant is not known: its keys are not errors too)
    if !out.is_long() && kind_known {
        // (a batch queue's cancel_grace goes with its timeout: see `timeout`)
        let grace = raw.cancel_grace.as_ref().filter(|_| raw.timeout.is_none());
        for (key, span) in [
            ("cancel_grace", grace.map(Spanned::span)),
            ("max_per_host", raw.max_per_host.as_ref().map(Spanned::span)),
            (
                "work_periods_long",
                raw.work_periods_long.as_ref().map(Spanned::span),
            ),
        ] {
            if let Some(span) = span {
                c.error(
                    span,
                    &join(path, key),
                    if key == "cancel_grace" {
                        "cancel_grace only applies to kind = \"long\" or with a timeout".into()
                    } else {
                        format!("{key} only applies to kind = \"long\"")
                    },
                );
            }
        }
        return;
    }
    long_batch_and_prefetch(c, path, raw, out);
    long_lease(c, path, raw, out);
    if let Some(v) = one_of(
        c,
        path,
        "work_periods_long",
        &raw.work_periods_long,
        &LongAtWindowEnd::NAMES,
        LongAtWindowEnd::parse,
    ) {
        out.work_periods_long = v;
    }
}

/// A long queue's slot runs one task: `batch_size` is 1 (the default for such a queue),
/// and `prefetch` would lease a task that waits while another runs for hours.
fn long_batch_and_prefetch(c: &mut Collector, path: &str, raw: &RawQueue, out: &mut QueueConfig) {
    match &raw.batch_size {
        Some(b) if *b.get_ref() != 1 => c.error(
            b.span(),
            &join(path, "batch_size"),
            format!(
                "kind = \"long\" runs one task per slot: batch_size must be 1, not {}",
                b.get_ref()
            ),
        ),
        _ => out.batch_size = 1,
    }
    if let Some(p) = raw.prefetch.as_ref().filter(|p| *p.get_ref()) {
        c.error(
            p.span(),
            &join(path, "prefetch"),
            "kind = \"long\" refuses prefetch = true: a prefetched task would wait leased while another runs until cancelled",
        );
    }
}

/// A long queue's lease: whole seconds in [`MIN_LONG_LEASE`]..=[`MAX_LONG_LEASE`],
/// [`DEFAULT_LONG_LEASE`] when not given.
fn long_lease(c: &mut Collector, path: &str, raw: &RawQueue, out: &mut QueueConfig) {
    let Some(l) = &raw.lease else {
        out.lease = DEFAULT_LONG_LEASE;
        return;
    };
    let Ok(lease) = &l.get_ref().0 else { return };
    let fmt = |d: Duration| humantime::format_duration(d).to_string();
    if lease.subsec_nanos() != 0 || *lease < MIN_LONG_LEASE || *lease > MAX_LONG_LEASE {
        c.error(
            l.span(),
            &join(path, "lease"),
            format!(
                "kind = \"long\" needs a lease of whole seconds from {} to {}, not {}: its slots renew it every second and stop their task a second before it could run out, and a dead host's tasks wait that long to start elsewhere",
                fmt(MIN_LONG_LEASE),
                fmt(MAX_LONG_LEASE),
                fmt(*lease)
            ),
        );
        out.lease = DEFAULT_LONG_LEASE;
    }
}

/// `prefetch`: refused where a batch may run longer than a lease (`max_batch_time` over
/// `lease`), since the prefetched batch's lease runs while the batch before it is handled.
fn prefetch(c: &mut Collector, path: &str, raw: &RawQueue, out: &mut QueueConfig) {
    let Some(p) = &raw.prefetch else { return };
    out.prefetch = *p.get_ref();
    if out.prefetch && out.max_batch_time > out.lease {
        c.error(
            p.span(),
            &join(path, "prefetch"),
            format!(
                "prefetch = true needs max_batch_time ({}) at most lease ({}): a prefetched batch's lease runs while the batch before it is handled",
                humantime::format_duration(out.max_batch_time),
                humantime::format_duration(out.lease)
            ),
        );
    }
}

/// `handler` and the keys that belong to one handler: what runs in the queue's slots.
fn handler(c: &mut Collector, q: &QueueCtx, raw: &RawQueue) -> Handler {
    let name = handler_name(c, q, raw);
    misplaced_handler_keys(c, q, raw, name);
    match name {
        Some(Handler::EXEC) => Handler::Exec {
            command: command(c, q.path, q.span.clone(), raw),
            start: start(c, q.path, raw),
        },
        Some(name) => Handler::with_options(name, handler_options(c, q.path, name, raw)),
        // Any handler will do: the queue has an error, so no config is returned.
        None => Handler::named(Handler::NOOP),
    }
}

/// The settings a named handler reads back in `preload`. A built-in one's are queue-level
/// keys, checked here so that their errors name file:line:col like every other; a
/// handler of the team's binary gets its `options` table as written.
fn handler_options(c: &mut Collector, path: &str, name: &str, raw: &RawQueue) -> Value {
    match name {
        Handler::FLAKY => json!({ "fail_rate": fail_rate(c, path, raw) }),
        Handler::MEMHOG => {
            let grow = raw.grow_per_task.clone();
            json!({ "grow_per_task": size(c, path, "grow_per_task", grow, 4 << 20, Zero::Allowed) })
        }
        Handler::PRELOAD_DEMO => {
            let preload = raw.preload.clone();
            json!({ "preload": size(c, path, "preload", preload, 512 << 20, Zero::Allowed) })
        }
        name if Handler::is_builtin(name) => json!({}),
        _ => raw
            .options
            .as_ref()
            .map_or_else(|| json!({}), |o| o.get_ref().clone()),
    }
}

/// The handler's name when it is a known one (built in or registered by the binary).
fn handler_name<'r>(c: &mut Collector, q: &QueueCtx, raw: &'r RawQueue) -> Option<&'r str> {
    let mut known: Vec<&str> = Handler::NAMES.to_vec();
    known.extend(q.custom.iter().map(String::as_str));
    match &raw.handler {
        None => {
            c.error(
                q.span.clone(),
                q.path,
                format!(
                    "missing required key `handler`, one of {}",
                    backticked(&known)
                ),
            );
            None
        }
        Some(h) if known.contains(&h.get_ref().as_str()) => Some(h.get_ref().as_str()),
        Some(h) => {
            c.error(
                h.span(),
                &join(q.path, "handler"),
                format!(
                    "unknown handler `{}`, expected one of {}",
                    h.get_ref(),
                    backticked(&known)
                ),
            );
            None
        }
    }
}

/// `options` with a built-in handler, and keys of another handler than the queue's. An
/// unknown or missing handler has its own error, so nothing is misplaced then.
fn misplaced_handler_keys(
    c: &mut Collector,
    q: &QueueCtx,
    raw: &RawQueue,
    handler_name: Option<&str>,
) {
    let Some(hname) = handler_name else {
        return;
    };
    let path = q.path;
    if let Some(options) = &raw.options
        && Handler::is_builtin(hname)
    {
        let span = key_span(q.table, "options").unwrap_or(options.span());
        c.error(
            span,
            &join(path, "options"),
            "`options` is only valid with a handler built into your own binary",
        );
    }

    let present = [
        raw.command.as_ref().map(Spanned::span),
        raw.start.as_ref().map(Spanned::span),
        raw.fail_rate.as_ref().map(Spanned::span),
        raw.grow_per_task.as_ref().map(Spanned::span),
        raw.preload.as_ref().map(Spanned::span),
    ];
    for ((key, owner), value_span) in HANDLER_KEYS.iter().zip(present) {
        if let Some(value_span) = value_span
            && *owner != hname
        {
            let span = key_span(q.table, key).unwrap_or(value_span);
            c.error(
                span,
                &join(path, key),
                format!("`{key}` is only valid with handler = \"{owner}\""),
            );
        }
    }
}

fn fail_rate(c: &mut Collector, path: &str, raw: &RawQueue) -> f64 {
    let Some(r) = &raw.fail_rate else {
        return 0.1;
    };
    let v = *r.get_ref();
    if !(0.0..=1.0).contains(&v) {
        c.error(
            r.span(),
            &join(path, "fail_rate"),
            format!("must be between 0 and 1, found {v}"),
        );
    }
    v
}

/// `priority`, `min_slots`, `max_slots` and `batch_size`: how the queue gets slots and
/// feeds them.
fn slots(c: &mut Collector, q: &QueueCtx, raw: &RawQueue, out: &mut QueueConfig) {
    let path = q.path;
    let max = i64::from(u32::MAX);
    out.priority = int(
        c,
        path,
        "priority",
        raw.priority.clone(),
        out.priority,
        i32::MIN.into(),
        i32::MAX.into(),
    );
    out.min_slots = int(
        c,
        path,
        "min_slots",
        raw.min_slots.clone(),
        out.min_slots,
        0,
        max,
    );
    out.max_slots = int(
        c,
        path,
        "max_slots",
        raw.max_slots.clone(),
        out.max_slots,
        1,
        max,
    );
    out.batch_size = int(
        c,
        path,
        "batch_size",
        raw.batch_size.clone(),
        out.batch_size,
        1,
        MAX_BATCH as i64,
    );

    let (min_slots, max_slots) = (out.min_slots, out.max_slots);
    let in_range =
        |v: &S<i64>, min: i64| v.as_ref().is_none_or(|v| (min..=max).contains(v.get_ref()));
    // Compare only values that are valid themselves, so one mistake gives one error.
    if min_slots > max_slots && in_range(&raw.min_slots, 0) && in_range(&raw.max_slots, 1) {
        let (span, key) = match (&raw.min_slots, &raw.max_slots) {
            (Some(min), _) => (min.span(), "min_slots"),
            (None, Some(max)) => (max.span(), "max_slots"),
            (None, None) => (q.span.clone(), "min_slots"),
        };
        let max_note = if raw.max_slots.is_none() {
            ", the default"
        } else {
            ""
        };
        c.error(
            span,
            &join(path, key),
            format!("min_slots ({min_slots}) is greater than max_slots ({max_slots}{max_note})"),
        );
    }
}

/// `lease`, `max_attempts`, `retry`, `max_batch_time` and `work_periods`: when tasks run
/// and how long they may take.
fn timing(c: &mut Collector, path: &str, raw: &RawQueue, out: &mut QueueConfig) {
    out.lease = duration(
        c,
        path,
        "lease",
        raw.lease.clone(),
        out.lease,
        Zero::Refused,
    );
    out.max_attempts = int(
        c,
        path,
        "max_attempts",
        raw.max_attempts.clone(),
        out.max_attempts,
        // (0: no limit, as the API's max_attempts)
        0,
        u32::MAX.into(),
    );
    if let Some(r) = &raw.retry {
        out.retry = retry(c, &join(path, "retry"), r.get_ref().clone());
    }
    out.max_batch_time = duration(
        c,
        path,
        "max_batch_time",
        raw.max_batch_time.clone(),
        out.max_batch_time,
        Zero::Refused,
    );
    if let Some(periods) = &raw.work_periods {
        out.work_periods = work_periods(c, path, periods);
    }
}

/// A `work_periods` list (a queue's or a system's), each item parsed.
fn work_periods(
    c: &mut Collector,
    path: &str,
    periods: &Spanned<Vec<Spanned<String>>>,
) -> Vec<WorkPeriod> {
    periods
        .get_ref()
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p.get_ref().parse::<WorkPeriod>() {
            Ok(wp) => Some(wp),
            Err(m) => {
                c.error(p.span(), &format!("{}[{i}]", join(path, "work_periods")), m);
                None
            }
        })
        .collect()
}

/// `system`, `max_payload`, `private_dirty_limit`, `user` and `cpu_scheduling`: what the
/// queue's tasks and slots may use.
fn limits(c: &mut Collector, q: &QueueCtx, raw: &RawQueue, out: &mut QueueConfig) {
    let path = q.path;
    out.system = raw.system.as_ref().map(|s| {
        if !q.systems.contains(s.get_ref()) {
            c.error(
                s.span(),
                &join(path, "system"),
                format!(
                    "unknown system `{0}`, no [systems.{0}] table is defined",
                    s.get_ref()
                ),
            );
        }
        s.get_ref().clone()
    });

    out.max_payload = size(
        c,
        path,
        "max_payload",
        raw.max_payload.clone(),
        out.max_payload,
        Zero::Refused,
    );
    if out.max_payload > MAX_PAYLOAD_LIMIT
        && let Some(v) = &raw.max_payload
    {
        c.error(
            v.span(),
            &join(path, "max_payload"),
            "must be at most 512MiB: Redis refuses larger values",
        );
    }

    out.private_dirty_limit = raw
        .private_dirty_limit
        .clone()
        .map(|v| size(c, path, "private_dirty_limit", Some(v), 0, Zero::Refused));

    out.user = raw.user.as_ref().map(|u| {
        let name = u.get_ref();
        if name.is_empty()
            || name
                .chars()
                .any(|ch| ch.is_whitespace() || ch.is_control() || ch == ':' || ch == '/')
        {
            c.error(
                u.span(),
                &join(path, "user"),
                "invalid user name, expected a system account like \"gaffer-worker\"",
            );
        }
        name.clone()
    });

    if let Some(policy) = one_of(
        c,
        path,
        "cpu_scheduling",
        &raw.cpu_scheduling,
        &CpuScheduling::NAMES,
        CpuScheduling::parse,
    ) {
        out.cpu_scheduling = policy;
    }
}

/// `track`, `history_ttl`, `max_result`, `dedup` and `intake`: what the task service keeps
/// of the queue's tasks and whether it takes new ones.
fn records(c: &mut Collector, path: &str, raw: &RawQueue, out: &mut QueueConfig) {
    if let Some(track) = &raw.track {
        out.track = *track.get_ref();
    }
    out.history_ttl = duration(
        c,
        path,
        "history_ttl",
        raw.history_ttl.clone(),
        out.history_ttl,
        Zero::Refused,
    );
    out.max_result = size(
        c,
        path,
        "max_result",
        raw.max_result.clone(),
        out.max_result,
        Zero::Refused,
    );
    if out.max_result > MAX_PAYLOAD_LIMIT
        && let Some(v) = &raw.max_result
    {
        c.error(
            v.span(),
            &join(path, "max_result"),
            "must be at most 512MiB: Redis refuses larger values",
        );
    }

    if let Some(d) = &raw.dedup {
        match d.get_ref().as_str() {
            "active" => out.dedup = Dedup::Active,
            "record" if !out.track => c.error(
                d.span(),
                &join(path, "dedup"),
                "dedup = \"record\" needs track = true: an untracked queue keeps no record to \
                 deduplicate against",
            ),
            "record" => out.dedup = Dedup::Record,
            other => c.error(
                d.span(),
                &join(path, "dedup"),
                format!(
                    "unknown dedup `{other}`, expected {}",
                    backticked(&DEDUP_NAMES)
                ),
            ),
        }
    }

    if let Some(intake) = one_of(
        c,
        path,
        "intake",
        &raw.intake,
        &Intake::NAMES,
        Intake::parse,
    ) {
        out.intake = intake;
    }
}

fn command(c: &mut Collector, path: &str, table_span: Range<usize>, raw: &RawQueue) -> Vec<String> {
    let key = join(path, "command");
    let Some(cmd) = &raw.command else {
        let span = raw.handler.as_ref().map_or(table_span, Spanned::span);
        c.error(
            span,
            path,
            "missing required key `command`: handler = \"exec\" needs the program and its \
             arguments, like command = [\"python3\", \"worker.py\"]",
        );
        return Vec::new();
    };
    if cmd.get_ref().is_empty() {
        c.error(
            cmd.span(),
            &key,
            "must not be empty, give the program and its arguments like [\"python3\", \"worker.py\"]",
        );
    }
    for (i, arg) in cmd.get_ref().iter().enumerate() {
        if arg.get_ref().is_empty() {
            c.error(
                arg.span(),
                &format!("{key}[{i}]"),
                "must not be an empty string",
            );
        }
    }
    cmd.get_ref().iter().map(|a| a.get_ref().clone()).collect()
}

/// `start` of an exec queue: `spawn` (the default) or `fork`.
fn start(c: &mut Collector, path: &str, raw: &RawQueue) -> Start {
    one_of(c, path, "start", &raw.start, &Start::NAMES, Start::parse).unwrap_or_default()
}

/// `[queues.X.retry]`: `backoff`, `base` and `max`, or `intervals`; and `priority`.
fn retry(c: &mut Collector, path: &str, raw: RawRetry) -> RetryPolicy {
    let d = RetryPolicy::default();
    let priority = raw.priority.clone().map(|p| {
        int(
            c,
            path,
            "priority",
            Some(p),
            0i32,
            i32::MIN.into(),
            i32::MAX.into(),
        )
    });
    let intervals = raw
        .intervals
        .clone()
        .map(|list| retry_intervals(c, path, &raw, list))
        .unwrap_or_default();
    let backoff = match &raw.backoff {
        None => d.backoff,
        Some(b) => match b.get_ref().as_str() {
            "fixed" => Backoff::Fixed,
            "linear" => Backoff::Linear,
            "exponential" => Backoff::Exponential,
            other => {
                c.error(
                    b.span(),
                    &join(path, "backoff"),
                    format!(
                        "unknown backoff `{other}`, expected `fixed`, `linear` or `exponential`"
                    ),
                );
                d.backoff
            }
        },
    };
    let base_span = raw.base.as_ref().map(Spanned::span);
    let max_span = raw.max.as_ref().map(Spanned::span);
    let base = duration(c, path, "base", raw.base, d.base, Zero::Allowed);
    let max = duration(c, path, "max", raw.max, d.max, Zero::Allowed);
    // The defaults are in order, so a reversed pair always has a written value to blame.
    if max < base
        && let Some((span, key)) = max_span
            .map(|s| (s, "max"))
            .or(base_span.map(|s| (s, "base")))
    {
        c.error(
            span,
            &join(path, key),
            format!(
                "retry max ({}) is shorter than base ({})",
                humantime::format_duration(max),
                humantime::format_duration(base)
            ),
        );
    }
    RetryPolicy {
        backoff,
        base,
        max,
        intervals,
        priority,
    }
}

/// `retry.intervals`: at least one delay, each as `base` takes them, and none of
/// `backoff`, `base` and `max` beside it (they would be ignored).
fn retry_intervals(
    c: &mut Collector,
    path: &str,
    raw: &RawRetry,
    list: Spanned<Vec<Spanned<Human<Duration>>>>,
) -> Vec<Duration> {
    let key = join(path, "intervals");
    let written = [
        ("backoff", raw.backoff.is_some()),
        ("base", raw.base.is_some()),
    ]
    .into_iter()
    .chain([("max", raw.max.is_some())])
    .filter_map(|(k, w)| w.then_some(k))
    .collect::<Vec<_>>();
    if !written.is_empty() {
        c.error(
            list.span(),
            &key,
            format!(
                "intervals replaces backoff, base and max: remove {}",
                written.join(", ")
            ),
        );
    }
    let span = list.span();
    let items = list.into_inner();
    if items.is_empty() {
        c.error(
            span,
            &key,
            "must list at least one delay, e.g. [\"1m\", \"5m\", \"1h\"]",
        );
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let at = format!("{key}[{i}]");
            duration_at(c, &at, Some(item), Duration::ZERO, Zero::Allowed)
        })
        .collect()
}

fn system(c: &mut Collector, name: &str, path: &str, raw: RawSystem) -> SystemConfig {
    let rate = raw.rate.and_then(|r| match r.get_ref().parse::<Rate>() {
        Ok(rate) => Some(rate),
        Err(m) => {
            c.error(r.span(), &join(path, "rate"), m);
            None
        }
    });
    SystemConfig {
        name: name.to_owned(),
        max_concurrency: raw.max_concurrency.map(|v| {
            int(
                c,
                path,
                "max_concurrency",
                Some(v),
                0u32,
                1,
                u32::MAX.into(),
            )
        }),
        rate,
        paused: raw.paused.is_some_and(Spanned::into_inner),
        work_periods: raw
            .work_periods
            .map(|p| work_periods(c, path, &p))
            .unwrap_or_default(),
    }
}

fn schedule(
    c: &mut Collector,
    path: &str,
    index: usize,
    span: Range<usize>,
    raw: RawSchedule,
    queues: &BTreeSet<String>,
) -> Option<Schedule> {
    let found = c.count();
    let queue = match raw.queue {
        None => {
            c.error(span.clone(), path, "missing required key `queue`");
            None
        }
        Some(q) if !queues.contains(q.get_ref()) => {
            c.error(q.span(), &join(path, "queue"), unknown_queue(q.get_ref()));
            None
        }
        Some(q) => Some(q.into_inner()),
    };
    let rule = schedule_rule(c, path, span, raw.cron, raw.every);
    let timezone = raw
        .timezone
        .and_then(|tz| timezone(c, &join(path, "timezone"), &tz));
    let until_ms = raw.until.and_then(|u| until(c, &join(path, "until"), &u));
    let mut payload = raw
        .payload
        .map_or_else(|| serde_json::json!({}), Spanned::into_inner);
    unwrap_datetimes(&mut payload);
    if c.count() > found {
        return None;
    }
    let queue = queue?;
    let named = raw.name.is_some();
    Some(Schedule {
        name: raw.name.map_or_else(
            || crate::schedule::default_name(&queue, index),
            Spanned::into_inner,
        ),
        queue,
        rule: rule?,
        timezone,
        until_ms,
        payload: payload.to_string(),
        origin: crate::schedule::Origin::Config { index, named },
    })
}

/// A schedule's rule: exactly one of `cron` and `every` (at least a second).
fn schedule_rule(
    c: &mut Collector,
    path: &str,
    span: Range<usize>,
    cron: S<String>,
    every: S<Human<Duration>>,
) -> Option<crate::schedule::Rule> {
    use crate::schedule::Rule;
    match (cron, every) {
        (None, None) => {
            c.error(
                span,
                path,
                "missing required key `cron` or `every`: a cron expression like \"0 3 * * *\", or a period like \"30s\"",
            );
            None
        }
        (Some(_), Some(every)) => {
            c.error(
                every.span(),
                &join(path, "every"),
                "give cron or every, not both",
            );
            None
        }
        (Some(text), None) => match Rule::cron(text.get_ref()) {
            Ok(rule) => Some(rule),
            Err(m) => {
                c.error(text.span(), &join(path, "cron"), m);
                None
            }
        },
        (None, Some(every)) => {
            let at = join(path, "every");
            let checked = match &every.get_ref().0 {
                Err(m) => Err(m.clone()),
                Ok(d) => Rule::every_period(*d),
            };
            checked.map_err(|m| c.error(every.span(), &at, m)).ok()
        }
    }
}

/// An IANA time zone, or `None` with the error collected.
fn timezone(c: &mut Collector, at: &str, tz: &Spanned<String>) -> Option<chrono_tz::Tz> {
    match tz.get_ref().parse::<chrono_tz::Tz>() {
        Ok(tz) => Some(tz),
        Err(_) => {
            c.error(
                tz.span(),
                at,
                format!(
                    "unknown time zone `{}`, expected an IANA name like \"Europe/Moscow\" or \"UTC\"",
                    tz.get_ref()
                ),
            );
            None
        }
    }
}

/// An RFC 3339 moment (a TOML offset date-time, or a string) as Unix ms.
fn until(c: &mut Collector, at: &str, value: &Spanned<toml::Value>) -> Option<i64> {
    let text = match value.get_ref() {
        toml::Value::String(s) => s.clone(),
        toml::Value::Datetime(d) => d.to_string(),
        other => {
            c.error(
                value.span(),
                at,
                format!(
                    "expected an RFC 3339 time like 2026-12-31T00:00:00Z, found {}",
                    other.type_str()
                ),
            );
            return None;
        }
    };
    match chrono::DateTime::parse_from_rfc3339(&text) {
        Ok(t) => Some(t.timestamp_millis()),
        // (chrono's reasons, like "premature end of input", say little about a time)
        Err(_) => {
            c.error(
                value.span(),
                at,
                format!(
                    "invalid time `{text}`, expected an RFC 3339 time with its offset like 2026-12-31T00:00:00Z"
                ),
            );
            None
        }
    }
}

/// toml hands datetimes to serde as a private one-key map; a payload wants the text.
fn unwrap_datetimes(value: &mut serde_json::Value) {
    const DATETIME_KEY: &str = "$__toml_private_datetime";
    match value {
        serde_json::Value::Object(map) => {
            if map.len() == 1
                && let Some(serde_json::Value::String(s)) = map.get(DATETIME_KEY)
            {
                *value = serde_json::Value::String(s.clone());
                return;
            }
            map.values_mut().for_each(unwrap_datetimes);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(unwrap_datetimes),
        _ => {}
    }
}

/// `[api]` and its `[api.keys.NAME]` tables.
fn api(c: &mut Collector, root: &DeTable, queues: &BTreeSet<String>) -> ApiConfig {
    let d = ApiConfig::default();
    let Some(value) = find(root, "api") else {
        return d;
    };
    let Some(table) = table_of(c, value, "api") else {
        return d;
    };
    let keys = api_keys(c, table, queues);
    let console = super::console::console(c, table, &declared_names(table, "keys"));
    let Some(raw) = deserialize::<RawApi>(c, value, "api") else {
        return ApiConfig { keys, console, ..d };
    };

    let listen = listen_addr(c, "api.listen", raw.listen.clone(), d.listen);
    if !listen.ip().is_loopback()
        && !declares_keys(table)
        && let Some(written) = &raw.listen
    {
        c.error(
            written.span(),
            "api.listen",
            format!(
                "`{listen}` is not a loopback address, declare at least one [api.keys.NAME] \
                 to serve it"
            ),
        );
    }

    let max_body = size(
        c,
        "api",
        "max_body",
        raw.max_body.clone(),
        d.max_body,
        Zero::Allowed,
    );
    if !(MIN_MAX_BODY..=MAX_PAYLOAD_LIMIT).contains(&max_body)
        && let Some(v) = &raw.max_body
    {
        c.error(v.span(), "api.max_body", "must be between 1KiB and 512MiB");
    }

    let max_wait = duration_at_most(
        c,
        ("api", "max_wait"),
        raw.max_wait.clone(),
        d.max_wait,
        (MAX_MAX_WAIT, "1h"),
    );
    let read_timeout = duration_at_most(
        c,
        ("api", "read_timeout"),
        raw.read_timeout.clone(),
        d.read_timeout,
        (MAX_READ_TIMEOUT, "10m"),
    );
    let max_connections_per_peer = int(
        c,
        "api",
        "max_connections_per_peer",
        raw.max_connections_per_peer.clone(),
        d.max_connections_per_peer,
        0,
        1 << 20,
    );
    let auth_timeout = duration_at_most(
        c,
        ("api", "auth_timeout"),
        raw.auth_timeout.clone(),
        d.auth_timeout,
        (MAX_READ_TIMEOUT, "10m"),
    );
    let max_listings_per_key = int(
        c,
        "api",
        "max_listings_per_key",
        raw.max_listings_per_key.clone(),
        d.max_listings_per_key,
        1,
        MAX_LISTINGS_PER_KEY,
    );

    ApiConfig {
        listen,
        max_body,
        max_wait,
        read_timeout,
        max_connections_per_peer,
        auth_timeout,
        max_listings_per_key,
        keys,
        console,
    }
}

/// Whether `[api]` declares a key, valid or not, so a broken key does not also make the
/// listen address an error.
fn declares_keys(api: &DeTable) -> bool {
    match find(api, "keys").map(Spanned::get_ref) {
        None => false,
        Some(DeValue::Table(t)) => !t.is_empty(),
        Some(_) => true,
    }
}

/// What records show as `submitted_by` for tasks the CLI submitted, so no API key may be
/// named so.
pub const RESERVED_SUBMITTER: &str = "cli";

/// Every `[api.keys.NAME]`, read in file order so a repeated token is blamed on the later
/// key.
fn api_keys(
    c: &mut Collector,
    api: &DeTable,
    queues: &BTreeSet<String>,
) -> BTreeMap<String, ApiKey> {
    let mut keys = BTreeMap::new();
    let Some(table) = find(api, "keys").and_then(|v| table_of(c, v, "api.keys")) else {
        return keys;
    };
    let mut entries: Vec<_> = table.iter().collect();
    entries.sort_by_key(|(name, _)| name.span().start);
    let mut tokens: BTreeMap<[u8; 32], String> = BTreeMap::new();
    for (name, value) in entries {
        let name_text: &str = name.get_ref();
        let path = join("api.keys", name_text);
        if !values::is_valid_name(name_text) {
            c.error(
                name.span(),
                &path,
                "invalid key name, use 1 to 128 characters from A-Z a-z 0-9 _ . -",
            );
        } else if name_text == RESERVED_SUBMITTER {
            // A key's name is what records show as submitted_by: this one would pass the
            // key's tasks off as the operator's.
            c.error(
                name.span(),
                &path,
                "key name `cli` is reserved: records show it for tasks submitted with the CLI",
            );
        }
        if table_of(c, value, &path).is_none() {
            continue;
        }
        let Some(raw) = deserialize::<RawApiKey>(c, value, &path) else {
            continue;
        };
        let admin = raw.admin.is_some_and(Spanned::into_inner);
        let token = key_token(
            c,
            &path,
            value.span(),
            raw.token_sha256,
            &mut tokens,
            name_text,
        );
        let allowed = key_queues(c, &path, value.span(), raw.queues, admin, queues);
        if let (Some(token_sha256), Some(queues)) = (token, allowed) {
            let key = ApiKey {
                name: name_text.to_owned(),
                token_sha256,
                queues,
                admin,
            };
            keys.insert(name_text.to_owned(), key);
        }
    }
    keys
}

/// `token_sha256`: required, 64 hex digits, not shared with an earlier key (`seen` maps
/// each token to the key that has it).
fn key_token(
    c: &mut Collector,
    path: &str,
    table_span: Range<usize>,
    raw: S<String>,
    seen: &mut BTreeMap<[u8; 32], String>,
    name: &str,
) -> Option<[u8; 32]> {
    const HOW: &str = "`gaffer api hash-token` prints it for a token on stdin";
    let Some(text) = raw else {
        c.error(
            table_span,
            path,
            format!(
                "missing required key `token_sha256`, the token's SHA-256 as 64 hex digits: {HOW}"
            ),
        );
        return None;
    };
    let key = join(path, "token_sha256");
    let token = match decode_sha256(text.get_ref()) {
        Ok(token) => token,
        Err(found) => {
            c.error(
                text.span(),
                &key,
                format!("expected the token's SHA-256 as 64 hex digits, found {found}: {HOW}"),
            );
            return None;
        }
    };
    if let Some(first) = seen.get(&token) {
        c.error(
            text.span(),
            &key,
            format!("same token as key `{first}`, give each key its own token"),
        );
        return None;
    }
    seen.insert(token, name.to_owned());
    Some(token)
}

/// A SHA-256 written as 64 hex digits, either case. The problem is described without the
/// text itself: a token pasted here by mistake must not reach logs.
fn decode_sha256(text: &str) -> Result<[u8; 32], String> {
    let count = text.chars().count();
    if count != 64 {
        let plural = if count == 1 { "" } else { "s" };
        return Err(format!("{count} character{plural}"));
    }
    let mut out = [0u8; 32];
    for (i, ch) in text.chars().enumerate() {
        let Some(digit) = ch.to_digit(16) else {
            return Err(format!(
                "a character that is not a hex digit at position {}",
                i + 1
            ));
        };
        let shift = if i % 2 == 0 { 4 } else { 0 };
        out[i / 2] |= (digit as u8) << shift;
    }
    Ok(out)
}

/// `queues`: `["*"]` for every queue, else declared queue names; absent only on an admin
/// key, which may use every queue.
fn key_queues(
    c: &mut Collector,
    path: &str,
    table_span: Range<usize>,
    raw: S<Vec<Spanned<String>>>,
    admin: bool,
    declared: &BTreeSet<String>,
) -> Option<KeyQueues> {
    let Some(list) = raw else {
        if admin {
            return Some(KeyQueues::All);
        }
        c.error(
            table_span,
            path,
            "missing required key `queues`, the queues the key may use like [\"resize_photo\"] \
             or [\"*\"] for every queue (or admin = true)",
        );
        return None;
    };
    let key = join(path, "queues");
    if list.get_ref().is_empty() && !admin {
        c.error(
            list.span(),
            &key,
            "must not be empty, list the queues the key may use or [\"*\"] for every queue",
        );
        return None;
    }
    let is_star = |entry: &Spanned<String>| entry.get_ref() == "*";
    let star = list.get_ref().iter().any(is_star);
    let named = list.get_ref().iter().any(|e| !is_star(e));
    if star && !named {
        return Some(KeyQueues::All);
    }
    let mut names = BTreeSet::new();
    let mut ok = true;
    for (i, entry) in list.get_ref().iter().enumerate() {
        let problem = if is_star(entry) {
            Some(String::from(
                "`*` means every queue and cannot be listed with queue names",
            ))
        } else if !declared.contains(entry.get_ref()) {
            Some(unknown_queue(entry.get_ref()))
        } else {
            None
        };
        match problem {
            Some(m) => {
                c.error(entry.span(), &format!("{key}[{i}]"), m);
                ok = false;
            }
            None => {
                names.insert(entry.get_ref().clone());
            }
        }
    }
    ok.then_some(KeyQueues::Only(names))
}

pub(super) fn unknown_queue(name: &str) -> String {
    format!("unknown queue `{name}`, no [queues.{name}] table is defined")
}

// ---------------------------------------------------------------------------------------
// Field helpers: each reports its own problem and returns the default so checking goes on.

/// Whether a duration or size may be zero: a tick, lease or limit may not, a reserve or a
/// retry delay may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Zero {
    /// Zero is a valid value.
    Allowed,
    /// Zero is an error: "must be greater than zero".
    Refused,
}

fn duration(
    c: &mut Collector,
    path: &str,
    key: &str,
    value: S<Human<Duration>>,
    default: Duration,
    zero: Zero,
) -> Duration {
    duration_at(c, &join(path, key), value, default, zero)
}

/// [`duration`] at the dotted key `at`, written out (a list's item, `key[i]`).
fn duration_at(
    c: &mut Collector,
    at: &str,
    value: S<Human<Duration>>,
    default: Duration,
    zero: Zero,
) -> Duration {
    let Some(value) = value else { return default };
    match &value.get_ref().0 {
        Err(m) => {
            c.error(value.span(), at, m.clone());
            default
        }
        Ok(d) if zero == Zero::Refused && d.is_zero() => {
            c.error(value.span(), at, "must be greater than zero");
            default
        }
        // (every duration reaches Redis, the scripts and the slots as whole milliseconds:
        // 500us would be a lease of 0 ms)
        Ok(d) if d.subsec_nanos() % 1_000_000 != 0 => {
            c.error(
                value.span(),
                at,
                format!(
                    "must be a whole number of milliseconds, got {}: gaffer keeps time in milliseconds",
                    humantime::format_duration(*d)
                ),
            );
            default
        }
        Ok(d) => *d,
    }
}

/// A duration (refused at zero) that, when written, must pass `check`, which returns
/// what is wrong with it.
pub(super) fn duration_checked(
    c: &mut Collector,
    (path, key): (&str, &str),
    raw: S<Human<Duration>>,
    default: Duration,
    check: impl FnOnce(Duration) -> Option<String>,
) -> Duration {
    // (a value that does not parse has its error already)
    let span = raw
        .as_ref()
        .filter(|v| v.get_ref().0.is_ok())
        .map(|v| v.span());
    let got = duration(c, path, key, raw, default, Zero::Refused);
    if let Some(span) = span
        && let Some(wrong) = check(got)
    {
        c.error(span, &join(path, key), wrong);
    }
    got
}

/// A duration (refused at zero) that must be at most `ceiling.0`, written `ceiling.1`.
fn duration_at_most(
    c: &mut Collector,
    at: (&str, &str),
    raw: S<Human<Duration>>,
    default: Duration,
    ceiling: (Duration, &str),
) -> Duration {
    duration_checked(c, at, raw, default, |got| {
        (got > ceiling.0).then(|| format!("must be at most {}", ceiling.1))
    })
}

/// A duration (refused at zero) that must be at least `floor.0`: `floor.1` says why.
fn duration_at_least(
    c: &mut Collector,
    at: (&str, &str),
    raw: S<Human<Duration>>,
    default: Duration,
    floor: (Duration, &str),
) -> Duration {
    duration_checked(c, at, raw, default, |got| {
        (got < floor.0).then(|| {
            format!(
                "must be at least {}, got {}: {}",
                humantime::format_duration(floor.0),
                humantime::format_duration(got),
                floor.1
            )
        })
    })
}

fn size(
    c: &mut Collector,
    path: &str,
    key: &str,
    value: S<Human<Size>>,
    default: u64,
    zero: Zero,
) -> u64 {
    let Some(value) = value else { return default };
    match &value.get_ref().0 {
        Err(m) => {
            c.error(value.span(), &join(path, key), m.clone());
            default
        }
        Ok(Size(0)) if zero == Zero::Refused => {
            c.error(value.span(), &join(path, key), "must be greater than zero");
            default
        }
        Ok(Size(n)) => *n,
    }
}

pub(super) fn int<T: TryFrom<i64> + Copy>(
    c: &mut Collector,
    path: &str,
    key: &str,
    value: S<i64>,
    default: T,
    min: i64,
    max: i64,
) -> T {
    let Some(value) = value else { return default };
    let v = *value.get_ref();
    let problem = if v < min && min == 1 {
        Some(format!("must be greater than zero, found {v}"))
    } else if v < min {
        Some(format!("must be at least {min}, found {v}"))
    } else if v > max {
        Some(format!("must be at most {max}, found {v}"))
    } else {
        None
    };
    match (problem, T::try_from(v)) {
        (None, Ok(t)) => t,
        (problem, _) => {
            let m = problem.unwrap_or_else(|| format!("out of range: {v}"));
            c.error(value.span(), &join(path, key), m);
            default
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tree helpers

pub(super) fn find<'a, 'i>(table: &'a DeTable<'i>, key: &str) -> Option<&'a Spanned<DeValue<'i>>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref() == key)
        .map(|(_, v)| v)
}

fn key_span(table: &DeTable, key: &str) -> Option<Range<usize>> {
    table
        .iter()
        .find(|(k, _)| k.get_ref() == key)
        .map(|(k, _)| k.span())
}

/// Names declared under a top-level table, valid or not, so references to a table that
/// has its own errors do not add a second, misleading "unknown" error.
fn declared_names(root: &DeTable, key: &str) -> BTreeSet<String> {
    match find(root, key).map(Spanned::get_ref) {
        Some(DeValue::Table(t)) => t.iter().map(|(k, _)| k.get_ref().to_string()).collect(),
        _ => BTreeSet::new(),
    }
}

pub(super) fn table_of<'a, 'i>(
    c: &mut Collector,
    value: &'a Spanned<DeValue<'i>>,
    path: &str,
) -> Option<&'a DeTable<'i>> {
    match value.get_ref() {
        DeValue::Table(t) => Some(t),
        other => {
            c.error(
                value.span(),
                path,
                format!("expected a table, found {}", other.type_str()),
            );
            None
        }
    }
}

fn section<T: DeserializeOwned>(c: &mut Collector, root: &DeTable, key: &str) -> Option<T> {
    let value = find(root, key)?;
    table_of(c, value, key)?;
    deserialize(c, value, key)
}

/// A table read into its raw struct. Serde stops at the first key it refuses (unknown,
/// or of the wrong type), so that key is reported, taken out, and the rest read again,
/// until the rest reads: every refused key of a table is reported at once. A table with
/// a refused key is then not checked for meaning (`None`): its checks across keys (a
/// `kind` for `cancel_grace`, `admin` for `queues`, `min_slots` against `max_slots`)
/// would judge the others against a default in place of what was written.
pub(super) fn deserialize<T: DeserializeOwned>(
    c: &mut Collector,
    value: &Spanned<DeValue>,
    path: &str,
) -> Option<T> {
    let mut value = value.clone();
    let mut refused = false;
    loop {
        let e = match T::deserialize(ValueDeserializer::from(value.clone())) {
            Ok(t) => return (!refused).then_some(t),
            Err(e) => e,
        };
        refused = true;
        let span = e.span().unwrap_or_else(|| value.span());
        let key = locate(value.get_ref(), path, span.start).unwrap_or_else(|| path.to_owned());
        c.error(span.clone(), &key, humanize(e.message()));
        let DeValue::Table(table) = value.get_mut() else {
            return None;
        };
        // (the key of this table the refused one is, or is inside)
        let (k, _) = table
            .iter()
            .find(|(k, v)| k.span().contains(&span.start) || v.span().contains(&span.start))?;
        let k = k.clone();
        table.remove(&k);
    }
}

/// The deepest key path whose key or value covers a byte offset. Tables opened with a
/// `[header]` have the header as their span, so children are searched first.
fn locate(value: &DeValue, path: &str, pos: usize) -> Option<String> {
    match value {
        DeValue::Table(t) => t.iter().find_map(|(k, v)| {
            let p = join(path, k.get_ref());
            locate(v.get_ref(), &p, pos)
                .or_else(|| (k.span().contains(&pos) || v.span().contains(&pos)).then_some(p))
        }),
        DeValue::Array(items) => items.iter().enumerate().find_map(|(i, v)| {
            let p = format!("{path}[{i}]");
            locate(v.get_ref(), &p, pos).or_else(|| v.span().contains(&pos).then_some(p))
        }),
        _ => None,
    }
}

/// Appends a key to a dotted path, quoting it when it is not a bare TOML key so that
/// `queues."a.b"` stays unambiguous.
pub(crate) fn join(path: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let key = if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    };
    if path.is_empty() {
        key
    } else {
        format!("{path}.{key}")
    }
}

/// The value of `path.key`, one of `names`, as `parse` reads it; an error naming the
/// choices when it is none of them, and `None` then or when the key is absent.
fn one_of<T>(
    c: &mut Collector,
    path: &str,
    key: &str,
    raw: &S<String>,
    names: &[&str],
    parse: impl Fn(&str) -> Option<T>,
) -> Option<T> {
    let text = raw.as_ref()?;
    let value = parse(text.get_ref());
    if value.is_none() {
        c.error(
            text.span(),
            &join(path, key),
            format!(
                "unknown {key} `{}`, expected {}",
                text.get_ref(),
                backticked(names)
            ),
        );
    }
    value
}

fn backticked(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

fn unknown_key(key: &str, known: &[&str]) -> String {
    let closest = known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, k)| *d <= 2 && *d < k.len().max(key.len()) / 2 + 1)
        .min();
    match closest {
        Some((_, k)) => format!("unknown key `{key}`, did you mean `{k}`?"),
        None if known.is_empty() => format!("unknown key `{key}`, this table takes no keys"),
        None => format!("unknown key `{key}`, expected one of {}", backticked(known)),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

/// Rewrites serde's messages in the vocabulary of a TOML file.
fn humanize(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((field, tail)) = rest.split_once('`')
    {
        let known: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
        return unknown_key(field, &known);
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        return format!("missing required key `{}", rest);
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        return format!("unknown value `{rest}");
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.rsplit_once(", expected ")
        {
            return format!(
                "expected {}, found {}",
                expected_text(expected),
                found_text(found)
            );
        }
    }
    message.to_owned()
}

fn expected_text(expected: &str) -> &str {
    match expected {
        "i64" | "i32" | "u32" | "u64" => "an integer",
        "f64" => "a number",
        "a sequence" => "an array",
        e if e.starts_with("struct ") => "a table",
        e => e,
    }
}

fn found_text(found: &str) -> String {
    found
        .replacen("floating point", "float", 1)
        .replacen("sequence", "array", 1)
        .replacen("map", "table", 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_quotes_non_bare_keys() {
        assert_eq!(join("", "queues"), "queues");
        assert_eq!(join("queues", "resize_photo"), "queues.resize_photo");
        assert_eq!(join("queues", "a.b"), "queues.\"a.b\"");
        assert_eq!(join("queues", "has space"), "queues.\"has space\"");
    }

    #[test]
    fn humanize_messages() {
        assert_eq!(
            humanize("invalid type: integer `3`, expected a string"),
            "expected a string, found integer `3`"
        );
        assert_eq!(
            humanize("invalid type: string \"3\", expected i64"),
            "expected an integer, found string \"3\""
        );
        assert_eq!(
            humanize("unknown field `min_slot`, expected one of `handler`, `min_slots`"),
            "unknown key `min_slot`, did you mean `min_slots`?"
        );
        assert_eq!(
            humanize("unknown field `bogus`, expected `base`"),
            "unknown key `bogus`, expected one of `base`"
        );
        assert_eq!(
            humanize("unknown variant `linear`, expected `fixed` or `exponential`"),
            "unknown value `linear`, expected `fixed` or `exponential`"
        );
    }

    #[test]
    fn distance() {
        assert_eq!(edit_distance("lease", "lese"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
