//! The cluster config: one TOML file describing queues, external systems and schedules,
//! shared by every role.
//!
//! Loading never stops at the first mistake: the document is parsed once with spans, each
//! section, queue, system and schedule is deserialized on its own (a key serde refuses
//! is reported and taken out, and the rest of its table read again for the others), and
//! then the values of the tables serde read whole are checked for meaning. Every problem found is returned together as [`Diagnostics`], each
//! naming `file:line:col` and the key, so `gaffer config check` fixes a file in one pass.
//!
//! Beside the model: `routes.rs` (the `next` routes, checked across queues once every queue
//! is known), `handler.rs` (a queue's handler: `Exec { command }` or `Named { name, options
//! }`; a built-in's queue-level keys are checked here and handed to it in `options`), and
//! the limits the queue client shares (`MAX_BATCH`, `DEFAULT_MAX_PAYLOAD`, re-exported as
//! `queue_client::…`). Commands load and validate the config before anything else: a bad
//! config exits 2 with every error, before any connection is opened (ARCHITECTURE.md,
//! invariant 9).

mod console;
mod error;
mod handler;
mod raw;
mod routes;
mod validate;
mod values;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use console::{Cidr, ConsoleConfig};
pub use error::{ConfigError, Diagnostic, Diagnostics};
// The simulator's trace files locate their errors as configs do.
/// A `[[schedules]]` entry: the definition the config and the api's stored schedules share.
pub use crate::schedule::Schedule;
pub(crate) use error::line_col;
pub use handler::{Handler, Start};
pub use validate::RESERVED_SUBMITTER;
pub use values::{
    Rate, WorkPeriod, check_redis_url, is_valid_name, parse_cron, parse_duration, parse_size,
};

/// Reads and checks a config file; the path as given is used in messages.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, &[])
}

/// Checks config text; `origin` names it in messages (a file name, or e.g. `redis` when the
/// text came from `config apply`).
pub fn parse(source: &str, origin: &str) -> Result<Config, ConfigError> {
    parse_with(source, origin, &[])
}

/// Like [`parse`], also accepting `handler = "NAME"` for each name in `custom`: the
/// handlers a team's own binary registers beside the built-in ones.
pub fn parse_with(source: &str, origin: &str, custom: &[String]) -> Result<Config, ConfigError> {
    validate::parse(source, origin, custom).map_err(ConfigError::Invalid)
}

/// Like [`load`], with the custom handler names of [`parse_with`].
pub fn load_with(path: &Path, custom: &[String]) -> Result<Config, ConfigError> {
    let source = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_with(&source, &path.display().to_string(), custom)
}

/// A checked config: every value is in range and every reference resolves, so the roles
/// can use it without re-validating.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the config came from, for summaries and logs.
    pub origin: String,
    /// How to reach Redis, where every role meets.
    pub cluster: ClusterConfig,
    /// Settings of the single active manager.
    pub manager: ManagerConfig,
    /// Settings shared by every host's master.
    pub master: MasterConfig,
    /// Queue types by name; sorted so every role iterates them in the same order.
    pub queues: BTreeMap<String, QueueConfig>,
    /// External systems by name, shared limits for the queues that call them.
    pub systems: BTreeMap<String, SystemConfig>,
    /// Periodic tasks, in file order.
    pub schedules: Vec<Schedule>,
    /// The task service's HTTP role (`gaffer api`).
    pub api: ApiConfig,
}

impl Default for Config {
    /// An empty cluster with every default, for `gaffer up` without a file and for tests.
    fn default() -> Self {
        Self {
            origin: String::from("<default>"),
            cluster: ClusterConfig::default(),
            manager: ManagerConfig::default(),
            master: MasterConfig::default(),
            queues: BTreeMap::new(),
            systems: BTreeMap::new(),
            schedules: Vec::new(),
            api: ApiConfig::default(),
        }
    }
}

impl Config {
    /// The weekday and minute of the day `now` is in the manager's time zone, as work
    /// periods are read.
    pub fn local_minute(&self, now: chrono::DateTime<chrono::Utc>) -> (chrono::Weekday, u16) {
        use chrono::{Datelike, Timelike};
        let local = now.with_timezone(&self.manager.timezone);
        (local.weekday(), (local.hour() * 60 + local.minute()) as u16)
    }

    /// Whether long queue `q`'s running tasks are to be stopped and handed back at `now`:
    /// it says `work_periods_long = "hand_back"` and its window (or its system's) is shut.
    pub fn hands_back_at(&self, q: &QueueConfig, now: chrono::DateTime<chrono::Utc>) -> bool {
        let (weekday, minute) = self.local_minute(now);
        q.is_long()
            && q.work_periods_long == LongAtWindowEnd::HandBack
            && !self.queue_works_at(q, weekday, minute)
    }

    /// Whether queue `q` may run at a local time: inside its own work periods and its
    /// system's.
    pub fn queue_works_at(&self, q: &QueueConfig, weekday: chrono::Weekday, minute: u16) -> bool {
        q.is_working_at(weekday, minute)
            && q.system
                .as_ref()
                .and_then(|s| self.systems.get(s))
                .is_none_or(|s| s.is_working_at(weekday, minute))
    }

    /// The one line `gaffer config check` prints on success, e.g.
    /// `ok: 4 queues, 1 system, 2 schedules (config.toml)`.
    pub fn summary(&self) -> String {
        let n = |count: usize, word: &str| {
            format!("{count} {word}{}", if count == 1 { "" } else { "s" })
        };
        format!(
            "ok: {}, {}, {} ({})",
            n(self.queues.len(), "queue"),
            n(self.systems.len(), "system"),
            n(self.schedules.len(), "schedule"),
            self.origin
        )
    }
}

/// Where Redis is and how the cluster's keys are named in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `redis://`, `rediss://` or `redis+unix://` URL; `None` lets `gaffer up` start a local
    /// redis-server. May carry a password, so never log it as is.
    pub redis: Option<String>,
    /// Prefix of every key, so several clusters can share one Redis.
    pub namespace: String,
    /// File holding the Redis password, kept out of the config so the config can be shared.
    /// A relative path is taken relative to the working directory.
    pub redis_password_file: Option<PathBuf>,
    /// PEM bundle of the CAs a `rediss://` server's certificate must chain to, instead of
    /// the system roots (a private CA).
    pub redis_ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) for servers that require one; set with
    /// `redis_key_file` or not at all.
    pub redis_cert_file: Option<PathBuf>,
    /// PEM private key of `redis_cert_file`.
    pub redis_key_file: Option<PathBuf>,
    /// Replicas that must acknowledge a write (enqueue, settle, a record's change) before
    /// it reports success; 0: none (Redis's asynchronous replication alone).
    pub wait_replicas: u32,
    /// How long a write waits for `wait_replicas` before it fails as not confirmed.
    pub wait_timeout: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            redis: None,
            namespace: String::from("gaffer"),
            redis_password_file: None,
            redis_ca_file: None,
            redis_cert_file: None,
            redis_key_file: None,
            wait_replicas: 0,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }
}

/// Settings of the manager's decision loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConfig {
    /// How often the slot map is recomputed; always greater than zero.
    pub tick: Duration,
    /// Zone in which work periods and schedules are read.
    pub timezone: chrono_tz::Tz,
    /// A host silent for this long is dead and its slots are placed elsewhere.
    pub heartbeat_timeout: Duration,
    /// A host silent for this long is forgotten: its report leaves `stats` and `top`.
    /// Always longer than `heartbeat_timeout`: by default 24h, or twice the timeout when
    /// that is longer.
    pub forget_hosts_after: Duration,
    /// Where the manager serves `/metrics` and `/status`; loopback by default.
    pub http: SocketAddr,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            tick: Duration::from_secs(2),
            timezone: chrono_tz::UTC,
            heartbeat_timeout: Duration::from_secs(10),
            forget_hosts_after: Duration::from_secs(24 * 3600),
            http: SocketAddr::from((Ipv4Addr::LOCALHOST, 9465)),
        }
    }
}

/// Settings shared by every host's master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterConfig {
    /// Bytes of memory left to the rest of the host when sizing it.
    pub memory_reserve: u64,
    /// Assumed PSS of one slot before any slot has run; always greater than zero.
    pub slot_estimate: u64,
    /// How long a draining host lets slots finish the task in hand (the rest of a batch goes back) before killing them.
    pub drain_timeout: Duration,
    /// Where `/metrics` and `/status` are served; loopback by default.
    pub http: SocketAddr,
    /// Upper bound of slots on any one host, whatever its memory says; greater than zero.
    pub max_slots: Option<u32>,
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            memory_reserve: 512 << 20,
            slot_estimate: 64 << 20,
            drain_timeout: Duration::from_secs(60),
            http: SocketAddr::from((Ipv4Addr::LOCALHOST, 9464)),
            max_slots: None,
        }
    }
}

/// One queue type: what handles its tasks and how many slots it may get.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// The table name; also part of the queue's Redis keys, so limited to `[A-Za-z0-9_.-]`.
    pub name: String,
    /// What runs in the queue's slots.
    pub handler: Handler,
    /// Higher gets slots first under scarcity, grows eagerly and shrinks reluctantly.
    pub priority: i32,
    /// Slots kept even when idle, so a task starts the instant it arrives.
    pub min_slots: u32,
    /// Upper bound; always at least 1 and at least `min_slots`.
    pub max_slots: u32,
    /// Tasks taken per round trip, 1..=10000.
    pub batch_size: u32,
    /// How long a taken task stays invisible before another slot may take it.
    pub lease: Duration,
    /// Attempts before a task goes to the dead letters; 0: no limit.
    pub max_attempts: u32,
    /// Delay before a failed task is tried again.
    pub retry: RetryPolicy,
    /// A slot whose Private_Dirty exceeds this recycles itself (exit 75).
    pub private_dirty_limit: Option<u64>,
    /// A slot silent for longer is hung and killed.
    pub max_batch_time: Duration,
    /// Windows in which the queue may run; empty means always.
    pub work_periods: Vec<WorkPeriod>,
    /// The external system whose limits this queue shares; names a key of
    /// [`Config::systems`].
    pub system: Option<String>,
    /// Largest payload accepted at enqueue, 1 byte..=512MiB.
    pub max_payload: u64,
    /// Account the slots switch to after the fork, so handlers cannot touch master files.
    pub user: Option<String>,
    /// Whether each task keeps a record with its history (`track = false` keeps the bare
    /// queue for very high volumes).
    pub track: bool,
    /// How long a task's record lives after the task ended; greater than zero.
    pub history_ttl: Duration,
    /// Largest result a handler may return, in bytes; a larger one fails the task.
    pub max_result: u64,
    /// How long a task's id deduplicates new tasks with the same id.
    pub dedup: Dedup,
    /// Whether the queue accepts new tasks; the run-time switch (`gaffer intake`) wins
    /// over this while it is set.
    pub intake: Intake,
    /// Whether a slot keeps its next take in flight while its handler runs, so the next
    /// batch is in hand when the handler finishes: each settle takes the batch after
    /// next, and the slot does not wait for it (up to two calls in flight). A batch taken
    /// ahead waits at most while one other batch is handled; its lease runs from its take.
    pub prefetch: bool,
    /// One task at a time in creation order, across slots and hosts; a retry keeps its
    /// place at the head. Needs `batch_size = 1` and no `prefetch`.
    pub ordered: bool,
    /// Its system's `rate` (tasks per second, cluster-wide), copied from
    /// [`Config::systems`] when the config is validated, so a slot enforces it at take time.
    pub system_rate: Option<Rate>,
    /// Its system's configured `paused`: the state its takes start from while no run-time
    /// switch (`gaffer system NAME …`) is set.
    pub system_paused: bool,
    /// The most rate tokens its system's bucket saves up: the largest `batch_size` of the
    /// system's queues (0 when the system has no `rate`). One bucket for the whole system,
    /// so a queue of small batches must not cut another's saved tokens down to its own.
    pub system_burst: u32,
    /// Batch tasks that end by themselves, or long-running ones (a watcher, a consumer)
    /// that run until they return or are cancelled, one per slot.
    pub kind: QueueKind,
    /// How long an exec child has to stop a cancelled long task, or a batch task over
    /// its [`timeout`](Self::timeout), after the cancel line before it gets SIGTERM (then
    /// SIGKILL [`KILL_AFTER_TERM`] later).
    pub cancel_grace: Duration,
    /// A batch queue's time limit per task: a task over it is stopped (its handler told,
    /// an exec child then signalled) and retried with the note "timed out after …". Its
    /// slots then hand their handler one task at a time. `None`: no limit but
    /// `max_batch_time`'s watchdog.
    pub timeout: Option<Duration>,
    /// Most slots of this queue on one host (long queues); `None`: no bound but the
    /// host's capacity.
    pub max_per_host: Option<u32>,
    /// What a long queue's running tasks do when its work period (or its system's) ends.
    pub work_periods_long: LongAtWindowEnd,
    /// The Linux scheduling policy of its slots and their handlers' processes.
    pub cpu_scheduling: CpuScheduling,
    /// Follow-up routes: where a task of this queue leads when it is done or has failed
    /// for good (`next = [{ queue = "…", on = "done" | "failed" }]`).
    pub next: Vec<Route>,
}

/// One follow-up route of a queue: a task that ends `on` this way creates a task on
/// `queue`, the next step of its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The queue the follow-up goes to.
    pub queue: String,
    /// Which end of the parent leads there.
    pub on: RouteOn,
}

/// Which end of a task a [`Route`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteOn {
    /// Done: the follow-up's payload is the parent's result (`null` without one).
    Done,
    /// Failed for good (rejected, or its last attempt failed): the follow-up's payload is
    /// `{"task", "queue", "error", "payload"}` of the parent.
    Failed,
}

impl QueueConfig {
    /// A queue with every default, for code and tests that build configs without a file.
    pub fn new(name: impl Into<String>, handler: Handler) -> Self {
        Self {
            name: name.into(),
            handler,
            priority: 0,
            min_slots: 0,
            max_slots: 16,
            batch_size: 10,
            lease: Duration::from_secs(5 * 60),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            retry: RetryPolicy::default(),
            private_dirty_limit: None,
            max_batch_time: Duration::from_secs(10 * 60),
            work_periods: Vec::new(),
            system: None,
            max_payload: DEFAULT_MAX_PAYLOAD,
            user: None,
            track: true,
            history_ttl: DEFAULT_HISTORY_TTL,
            max_result: DEFAULT_MAX_RESULT,
            dedup: Dedup::Active,
            intake: Intake::Open,
            prefetch: false,
            ordered: false,
            system_rate: None,
            system_paused: false,
            system_burst: 0,
            next: Vec::new(),
            kind: QueueKind::Batch,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            timeout: None,
            max_per_host: None,
            work_periods_long: LongAtWindowEnd::Finish,
            cpu_scheduling: CpuScheduling::Batch,
        }
    }

    /// Whether the queue runs long tasks (`kind = "long"`).
    pub fn is_long(&self) -> bool {
        self.kind == QueueKind::Long
    }

    /// Whether the queue may run at a local time by its own work periods (its system's are
    /// [`Config::queue_works_at`]'s too); a queue without work periods always may.
    pub fn is_working_at(&self, weekday: chrono::Weekday, minute_of_day: u16) -> bool {
        WorkPeriod::any_contains(&self.work_periods, weekday, minute_of_day)
    }
}

/// What a long queue's running tasks do when its work period, or its system's, ends
/// (`work_periods_long`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LongAtWindowEnd {
    /// Run to their end; no task starts until the window opens again. The default: a
    /// long task is often a job that cannot resume where it stopped, and one started
    /// inside the window is let finish.
    #[default]
    Finish,
    /// Stopped and handed back at the window's end, to start again in the next one.
    HandBack,
}

impl LongAtWindowEnd {
    /// The config's words, in order.
    pub const NAMES: [&str; 2] = ["finish", "hand_back"];

    /// From the config's word.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "finish" => Some(LongAtWindowEnd::Finish),
            "hand_back" => Some(LongAtWindowEnd::HandBack),
            _ => None,
        }
    }
}

/// How long a record is kept after its task ended, when the queue does not say.
pub const DEFAULT_HISTORY_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest result kept in a record, when the queue does not say.
pub const DEFAULT_MAX_RESULT: u64 = 64 * 1024;
/// Largest JSON nesting of a payload a handler parses (`Task::json`) or the api accepts;
/// deeper payloads are refused, not parsed.
pub const MAX_JSON_DEPTH: usize = 64;
/// Attempts before a task is dead-lettered, when neither the task nor its queue says.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// Largest payload accepted at enqueue, when the queue does not say.
pub const DEFAULT_MAX_PAYLOAD: u64 = 1 << 20;
/// Largest batch one take or enqueue call accepts, and so the largest `batch_size`.
/// Defined here, where the queue client reads its other defaults too, because the config
/// depends on no other part of gaffer.
pub const MAX_BATCH: usize = 10_000;
/// `[cluster] wait_timeout` when not set: how long a write waits for `wait_replicas`.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest `[cluster] wait_timeout`: a `WAIT` holds its connection, and every call queued
/// behind it, that long, and must end well within the connection's response timeout (10 s).
pub const MAX_WAIT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a queue's tasks are: `kind = "batch" | "long"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueKind {
    /// Tasks that end by themselves, taken in batches (the default).
    #[default]
    Batch,
    /// Tasks that run until they return or are cancelled, one per slot, their lease
    /// renewed while they run.
    Long,
}

impl QueueKind {
    /// Every value as written in the config.
    pub const NAMES: [&'static str; 2] = ["batch", "long"];

    /// The value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueKind::Batch => "batch",
            QueueKind::Long => "long",
        }
    }

    /// Parses a value as written; `None` for anything else.
    pub fn parse(s: &str) -> Option<QueueKind> {
        match s {
            "batch" => Some(QueueKind::Batch),
            "long" => Some(QueueKind::Long),
            _ => None,
        }
    }
}

/// How long an exec child has to stop a cancelled long task before SIGTERM, when the
/// queue does not say.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(10);

/// A batch queue's `cancel_grace` when it has a `timeout`: a task over its time limit is
/// meant to stop at once, so its exec child gets SIGTERM soon after the cancel line.
pub const DEFAULT_TIMEOUT_GRACE: Duration = Duration::from_millis(500);
/// How long after SIGTERM a cancelled long task's exec child gets SIGKILL.
pub const KILL_AFTER_TERM: Duration = Duration::from_secs(2);
/// Shortest lease of a long queue: its slots renew every [`LONG_RENEW_EVERY`] and stop
/// their task [`LONG_STOP_MARGIN`] before a lease they could not renew runs out, so a
/// lease this long leaves three renewals before that.
pub const MIN_LONG_LEASE: Duration = Duration::from_secs(5);
/// Longest lease of a long queue: a dead host's tasks start elsewhere only once their
/// leases ran out, so a longer one would leave them down for more than ten minutes.
pub const MAX_LONG_LEASE: Duration = Duration::from_secs(600);
/// A long queue's lease when the queue does not say.
pub const DEFAULT_LONG_LEASE: Duration = Duration::from_secs(30);
/// How often a slot renews its long task's lease and looks for a cancel (a tick).
pub const LONG_RENEW_EVERY: Duration = Duration::from_secs(1);
/// How long before its lease runs out by its own clock a slot that could not renew
/// stops its long task, so it is gone before another slot can take it.
pub const LONG_STOP_MARGIN: Duration = Duration::from_secs(1);

/// How long a task id deduplicates: `dedup = "active" | "record"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dedup {
    /// While a task with the id is waiting, running or dead-lettered (the queue's own rule).
    #[default]
    Active,
    /// Also while the record of a finished task with the id lives (`history_ttl`).
    Record,
}

/// The Linux scheduling policy a queue's slots run under: `cpu_scheduling = "batch" |
/// "normal"`.
///
/// Slots are throughput work. Under `SCHED_BATCH` they keep their fair share of the CPU,
/// but a slot that wakes up (a reply from Redis, its handler's answer) waits for the
/// running process's turn to end instead of preempting it, so the latency-bound
/// processes beside them (Redis on the same host, the master, `gaffer api`) keep their
/// core. On a host with idle cores nothing changes: a woken slot runs at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuScheduling {
    /// `SCHED_BATCH`: no preemption on wake-up.
    #[default]
    Batch,
    /// `SCHED_OTHER`, as any process: for a queue whose tasks must start within a
    /// millisecond on a loaded host.
    Normal,
}

impl CpuScheduling {
    /// Every value as written in the config.
    pub const NAMES: [&'static str; 2] = ["batch", "normal"];

    /// Parses a value as written; `None` for anything else.
    pub fn parse(s: &str) -> Option<CpuScheduling> {
        match s {
            "batch" => Some(CpuScheduling::Batch),
            "normal" => Some(CpuScheduling::Normal),
            _ => None,
        }
    }
}

/// Whether a queue accepts new tasks: `intake = "open" | "closed" | "cancel"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Intake {
    /// New tasks are enqueued.
    #[default]
    Open,
    /// New tasks are refused (the API answers 409); nothing is recorded.
    Closed,
    /// New tasks are recorded as cancelled at once, with a note, and never run.
    Cancel,
}

impl Intake {
    /// Every value as written in the config and on the command line.
    pub const NAMES: [&'static str; 3] = ["open", "closed", "cancel"];

    /// The value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Intake::Open => "open",
            Intake::Closed => "closed",
            Intake::Cancel => "cancel",
        }
    }

    /// Parses a value as written; `None` for anything else.
    pub fn parse(s: &str) -> Option<Intake> {
        match s {
            "open" => Some(Intake::Open),
            "closed" => Some(Intake::Closed),
            "cancel" => Some(Intake::Cancel),
            _ => None,
        }
    }
}

/// Settings of the task service's HTTP role, `[api]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// Where `gaffer api` listens; loopback by default. A non-loopback address needs at
    /// least one key.
    pub listen: SocketAddr,
    /// Largest request body accepted, in bytes.
    pub max_body: u64,
    /// Longest a submit may wait for its task (`"wait"`).
    pub max_wait: Duration,
    /// How long a client may take to send a request's head (and a keep-alive connection
    /// may stay idle), and then its body: a slow or stalled client is cut off.
    pub read_timeout: Duration,
    /// The most connections one peer address may hold at once (0: no limit); more are
    /// answered 429 and closed.
    pub max_connections_per_peer: usize,
    /// How long a connection may go without an authenticated request before it is closed
    /// (once no request of it is in flight).
    pub auth_timeout: Duration,
    /// Listings one key may have under way at once, per api instance: each holds Redis
    /// for a few bounded script calls, and a key looping on them must not take it whole.
    pub max_listings_per_key: usize,
    /// API keys by name; the name is what records show as `submitted_by`.
    pub keys: BTreeMap<String, ApiKey>,
    /// The web console at `/ui/` and its settings; `None`: `console = false`, no console.
    pub console: Option<ConsoleConfig>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 9480)),
            max_body: 4 << 20,
            max_wait: Duration::from_secs(60),
            read_timeout: crate::http::HEADER_READ_TIMEOUT,
            max_connections_per_peer: 256,
            auth_timeout: Duration::from_secs(10),
            max_listings_per_key: 4,
            keys: BTreeMap::new(),
            console: Some(ConsoleConfig::default()),
        }
    }
}

/// One API key, `[api.keys.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// The table name.
    pub name: String,
    /// SHA-256 of the token; the token itself is never stored.
    pub token_sha256: [u8; 32],
    /// Queues the key may use.
    pub queues: KeyQueues,
    /// Every queue, and the admin endpoints.
    pub admin: bool,
}

/// The queues an API key may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyQueues {
    /// `["*"]`: every queue.
    All,
    /// These queues, each a key of [`Config::queues`].
    Only(std::collections::BTreeSet<String>),
}

impl ApiKey {
    /// Whether the key may submit to and read `queue`.
    pub fn allows(&self, queue: &str) -> bool {
        self.admin
            || match &self.queues {
                KeyQueues::All => true,
                KeyQueues::Only(names) => names.contains(queue),
            }
    }
}

/// How long a task waits before its next attempt, and at what priority it comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Whether the delay grows with the attempt count.
    pub backoff: Backoff,
    /// Delay after the first failure.
    pub base: Duration,
    /// Cap on the delay; never below `base`.
    pub max: Duration,
    /// The delays after the first, second, … failure, the last repeating; when given,
    /// `backoff`, `base` and `max` are not (the config refuses both).
    pub intervals: Vec<Duration>,
    /// The priority a retried task comes back at (`None`: its own), unless its handler
    /// gives one.
    pub priority: Option<i32>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            backoff: Backoff::Exponential,
            base: Duration::from_secs(10),
            max: Duration::from_secs(3600),
            intervals: Vec::new(),
            priority: None,
        }
    }
}

impl RetryPolicy {
    /// Delay before the attempt after `attempt` failed ones (1 = first failure), capped at
    /// `max`; kept here so every role computes it the same way.
    pub fn delay(&self, attempt: u32) -> Duration {
        let failed = attempt.max(1);
        if let Some(last) = self.intervals.last() {
            let i = usize::try_from(failed - 1).unwrap_or(usize::MAX);
            return *self.intervals.get(i).unwrap_or(last);
        }
        match self.backoff {
            Backoff::Fixed => self.base.min(self.max),
            Backoff::Linear => self.base.saturating_mul(failed).min(self.max),
            Backoff::Exponential => {
                let factor = 2u32.saturating_pow((failed - 1).min(31));
                self.base.saturating_mul(factor).min(self.max)
            }
        }
    }
}

/// Shape of the retry delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    /// Always `base`.
    Fixed,
    /// `base` times the failed attempts, up to `max`.
    Linear,
    /// `base` doubled per failed attempt, up to `max`.
    Exponential,
}

/// An outside service several queues call, with limits that hold across all of them.
#[derive(Debug, Clone, PartialEq)]
pub struct SystemConfig {
    /// The table name.
    pub name: String,
    /// Slots of all its queues together, cluster-wide; greater than zero.
    pub max_concurrency: Option<u32>,
    /// Tasks per second of all its queues together, cluster-wide.
    pub rate: Option<Rate>,
    /// When true its queues take nothing and tasks wait, e.g. during the partner's outage.
    pub paused: bool,
    /// When its queues may run, on top of their own (empty: always).
    pub work_periods: Vec<WorkPeriod>,
}

impl QueueConfig {
    /// Why a task of this queue cannot have `own` as its time limit, if it cannot: one
    /// longer than the queue's `timeout`, or any on a queue without one, whose slots hand
    /// their handler whole batches and watch no task's time. The api and `gaffer push`
    /// refuse such a task with these words.
    pub fn task_timeout_refusal(&self, own: Duration) -> Option<String> {
        let name = &self.name;
        match self.timeout {
            None => Some(format!(
                "queue {name} has no timeout, so no task of it can have one: a task's timeout may only shorten its queue's ([queues.{name}].timeout)"
            )),
            Some(limit) if own > limit => Some(format!(
                "timeout {} exceeds the limit of {} ([queues.{name}].timeout)",
                humantime::format_duration(own),
                humantime::format_duration(limit)
            )),
            Some(_) if own.is_zero() => Some("timeout must be greater than zero".into()),
            Some(_) => None,
        }
    }
}

impl SystemConfig {
    /// Whether its queues may run at a local time, as far as the system says.
    pub fn is_working_at(&self, weekday: chrono::Weekday, minute_of_day: u16) -> bool {
        WorkPeriod::any_contains(&self.work_periods, weekday, minute_of_day)
    }
}

#[cfg(test)]
mod tests;
