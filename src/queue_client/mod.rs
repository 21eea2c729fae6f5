//! The leased-task queue on Redis: what producers enqueue and slots take and settle.
//!
//! Each operation is one Lua script, so it is atomic and costs one round trip whatever
//! the batch size. Time is Redis's own (`TIME` inside the scripts): clients with skewed
//! clocks still agree on leases and due times. A queue's keys share one hash tag, so
//! queues spread over a Redis Cluster. The storage layout is described in
//! `docs/ARCHITECTURE.md`.
//!
//! Guarantees: a task is handed to one taker at a time while its lease is valid; a lease
//! is identified by a token, and a settle carrying a token that is no longer the task's
//! is rejected and counted as stale; an expired lease returns the task to the ready set
//! on the next take (counted as an attempt) or dead-letters it past `max_attempts`.

mod conn;
mod outage;
mod record;
mod scripts;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt};
use redis::Value;
use serde::Serialize;

use crate::config::{Dedup, Intake};
use conn::Target;
pub use conn::{ConnectOptions, RedisConn, Waiter, pubsub, redacted};
pub use outage::OutageLog;
pub use record::{
    FreezeResult, HistoryEntry, ListPage, ListQuery, MAX_LIST_LIMIT, RecordMemory, RecordState,
    TaskRecord, rfc3339,
};
use scripts::{Keys, SCRIPTS};

pub use crate::config::{DEFAULT_MAX_PAYLOAD, MAX_BATCH};
/// Longest task id accepted, in bytes.
pub const MAX_ID_LEN: usize = 256;
/// Longest a task may be put off, by an enqueue's `delay` or `at` or a retry's delay: a
/// task parked for centuries is lost in all but name, and millisecond scores past this
/// stay exact in Redis's doubles.
pub const MAX_DELAY: Duration = Duration::from_secs(366 * 24 * 3600);
/// The history note of a dead letter put back in the queue.
const REQUEUE_NOTE: &str = "requeued from the dead letters";
/// Expired leases and due delayed tasks moved per take; bounds the time one script runs.
const HOUSEKEEPING_LIMIT: usize = 1000;
/// Tasks per enqueue script call, and how many calls are in flight at once.
const ENQUEUE_CHUNK: usize = 1000;
const ENQUEUE_CHUNK_BYTES: usize = 8 * 1024 * 1024;
const ENQUEUE_WINDOW: usize = 8;

/// Errors of queue operations. Redis errors keep their kind so callers can tell a
/// connection problem (retry later) from a refused request (do not retry).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Redis could not be reached or failed a command.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Connecting failed (bad URL, refused, timed out).
    #[error("cannot connect to redis at {0}")]
    Connect(String),
    /// The payload is larger than the queue allows.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes of queue {queue}")]
    PayloadTooLarge {
        /// Queue name.
        queue: String,
        /// Payload size in bytes.
        size: usize,
        /// The queue's limit in bytes.
        limit: u64,
    },
    /// A request the queue refuses: bad id, batch size, queue name, priority.
    #[error("{0}")]
    Invalid(String),
    /// Redis answered something the scripts never return: a bug or a foreign key.
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
    /// The queue's intake is closed: nothing was enqueued.
    #[error("the intake of queue {queue} is closed: it accepts no new tasks")]
    IntakeClosed {
        /// Queue name.
        queue: String,
    },
}

impl QueueError {
    /// True when the error says Redis is unreachable, slow or not ready yet (loading its
    /// data after a restart, a cluster failing over), so retrying later may work.
    pub fn is_transient(&self) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        match self {
            QueueError::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    // The driver's own word for "wait and retry": a server loading its AOF
                    // or RDB answers LOADING until it has read every key.
                    || matches!(
                        e.kind(),
                        ErrorKind::Server(
                            ServerErrorKind::BusyLoading
                                | ServerErrorKind::TryAgain
                                | ServerErrorKind::MasterDown
                                | ServerErrorKind::ClusterDown
                        )
                    )
            }
            QueueError::Connect(_) => true,
            _ => false,
        }
    }
}

/// Whether JSON text nests brackets deeper than `limit`, by a scan of brackets outside
/// strings: cheap, and run before any parser recurses into untrusted input (payloads in a
/// slot, request bodies in the api).
pub fn json_deeper_than(bytes: &[u8], limit: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Checks a queue name: it becomes part of Redis keys and their hash tag.
pub fn validate_queue_name(name: &str) -> Result<(), QueueError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(QueueError::Invalid(format!(
            "queue name {name:?} is invalid: use 1 to 128 letters, digits, '_', '-' or '.'"
        )))
    }
}

/// A connection to the queues of one namespace.
#[derive(Clone)]
pub struct QueueClient {
    conn: RedisConn,
    target: Target,
    namespace: Arc<str>,
}

impl QueueClient {
    /// Connects to the Redis at `url` (a single server or any node of a Redis Cluster).
    pub async fn connect(
        url: &str,
        namespace: &str,
        opts: &ConnectOptions,
    ) -> Result<Self, QueueError> {
        let (conn, target) = conn::connect(url, opts).await?;
        Ok(QueueClient {
            conn,
            target,
            namespace: namespace.into(),
        })
    }

    /// Like [`connect`](Self::connect), but waits out a Redis that is unreachable or not
    /// ready yet, backing off from 100 ms to 5 s, with a warning on the first failure and
    /// about every minute after. Errors that waiting cannot fix (a bad URL, a wrong
    /// password) return at once. For daemons, which must come up in whatever order hosts
    /// and services start, and ride out an outage that began before they did; drop the
    /// future to give up.
    pub async fn connect_patiently(
        url: &str,
        namespace: &str,
        opts: &ConnectOptions,
    ) -> Result<Self, QueueError> {
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut warned: Option<std::time::Instant> = None;
        loop {
            match Self::connect(url, namespace, opts).await {
                Ok(client) => {
                    if warned.is_some() {
                        tracing::info!(redis = %redacted(url), "redis reachable");
                    }
                    return Ok(client);
                }
                Err(e) if e.is_transient() => {
                    if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                        tracing::warn!(redis = %redacted(url), error = %e,
                            "redis unreachable; waiting for it");
                        warned = Some(std::time::Instant::now());
                    }
                    backoff.pause().await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A handle on one queue with default limits.
    pub fn queue(&self, name: &str) -> Result<Queue, QueueError> {
        self.queue_with(name, QueueLimits::default())
    }

    /// A handle on one queue with the limits of its config.
    pub fn queue_with(&self, name: &str, limits: QueueLimits) -> Result<Queue, QueueError> {
        validate_queue_name(name)?;
        Ok(Queue {
            conn: self.conn.clone(),
            keys: Arc::new(Keys::new(&self.namespace, name)),
            name: name.into(),
            limits,
            worker: None,
        })
    }

    /// A dedicated connection for blocking waits; one per concurrent taker.
    pub fn waiter(&self) -> Waiter {
        Waiter::new(self.target.clone())
    }

    /// The shared connection, for commands outside the queue API.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// The key namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}

/// Per-queue limits and defaults, normally from the queue's config.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// Largest payload accepted, in bytes.
    pub max_payload: u64,
    /// Attempts before a task is dead-lettered, when the task does not say; 0 = no limit.
    pub max_attempts: u32,
    /// Whether enqueue creates a record per task.
    pub track: bool,
    /// How long a record lives after its task ended.
    pub history_ttl: Duration,
    /// Largest result kept, in bytes; a larger one fails the task.
    pub max_result: u64,
    /// Whether a finished task's live record deduplicates its id.
    pub dedup: Dedup,
    /// The config's intake, which applies while no run-time switch is set.
    pub intake: Intake,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            max_payload: DEFAULT_MAX_PAYLOAD,
            max_attempts: 5,
            track: true,
            history_ttl: crate::config::DEFAULT_HISTORY_TTL,
            max_result: crate::config::DEFAULT_MAX_RESULT,
            dedup: Dedup::Active,
            intake: Intake::Open,
        }
    }
}

impl From<&crate::config::QueueConfig> for QueueLimits {
    fn from(q: &crate::config::QueueConfig) -> Self {
        QueueLimits {
            max_payload: q.max_payload,
            max_attempts: q.max_attempts,
            track: q.track,
            history_ttl: q.history_ttl,
            max_result: q.max_result,
            dedup: q.dedup,
            intake: q.intake,
        }
    }
}

/// A task to enqueue.
#[derive(Debug, Clone, Default)]
pub struct NewTask {
    /// Opaque payload; JSON by convention.
    pub payload: Vec<u8>,
    /// Dedup key: while a task with this id is pending or leased, enqueueing it again
    /// returns the existing one. Generated (`#N`) when absent.
    pub id: Option<String>,
    /// Higher is taken first.
    pub priority: i32,
    /// Not due before this much time from now.
    pub delay: Duration,
    /// Not due before this moment; wins over `delay`.
    pub at: Option<SystemTime>,
    /// Overrides the queue's max_attempts.
    pub max_attempts: Option<u32>,
    /// Who submits it, as its record shows: an API key's name, `cli`, `schedule:NAME`.
    pub submitted_by: Option<String>,
}

impl NewTask {
    /// A task with this payload and every option at its default.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        NewTask {
            payload: payload.into(),
            ..Default::default()
        }
    }

    /// Sets the dedup id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the delay.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets the due time.
    pub fn at(mut self, at: SystemTime) -> Self {
        self.at = Some(at);
        self
    }

    /// Sets max_attempts for this task.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// Sets who submits it.
    pub fn submitted_by(mut self, by: impl Into<String>) -> Self {
        self.submitted_by = Some(by.into());
        self
    }
}

/// What an enqueue did with one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Enqueued {
    /// The task's id (generated or given).
    pub id: String,
    /// False when a task with the same id already existed (pending, leased or dead; or
    /// with `dedup = "record"`, finished while its record lives).
    pub created: bool,
    /// The new task's state: waiting, or cancelled when the queue's intake cancels new
    /// tasks; `None` for an existing task (look its record up).
    pub state: Option<RecordState>,
}

/// One leased task.
#[derive(Debug, Clone)]
pub struct LeasedTask {
    /// Task id.
    pub id: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The payload as enqueued.
    pub payload: Vec<u8>,
    /// The lease token every settle of this task must carry.
    pub token: u64,
}

/// The result of one take.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Leased tasks, highest priority first.
    pub tasks: Vec<LeasedTask>,
    /// Redis's clock when the batch was taken (ms since the epoch).
    pub now_ms: i64,
    /// When the leases expire (ms since the epoch, Redis's clock); 0 when empty.
    pub expires_ms: i64,
    /// When empty: how soon a delayed task becomes due or a lease expires.
    pub next_hint: Option<Duration>,
}

/// How to settle one leased task.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// Done: delete it.
    Ack,
    /// Done with a result (JSON text), kept in the task's record. A result over the
    /// queue's `max_result` fails the task instead, naming the limit.
    AckWithResult {
        /// The handler's result as JSON text.
        result: String,
    },
    /// Try again after `delay`, optionally at another priority; `reason` becomes its last
    /// error. Past max_attempts it is dead-lettered instead.
    Retry {
        /// Delay before it is due again.
        delay: Duration,
        /// New priority, if any.
        priority: Option<i32>,
        /// Why, kept as the last error.
        reason: String,
    },
    /// Give up: move it to the dead letters with this reason.
    Fail {
        /// Why; shown with the dead letter.
        reason: String,
    },
    /// Keep it leased for this long from now.
    Extend {
        /// New lease length, counted from now.
        lease: Duration,
    },
}

/// One settle request: which lease, and what to do with it.
#[derive(Debug, Clone)]
pub struct SettleOp {
    /// Task id.
    pub id: String,
    /// The attempt the lease was handed out for.
    pub attempt: u32,
    /// The token of the lease being settled.
    pub token: u64,
    /// What to do.
    pub action: Settle,
}

impl SettleOp {
    /// A settle of `task` with `action`.
    pub fn new(task: &LeasedTask, action: Settle) -> Self {
        SettleOp {
            id: task.id.clone(),
            attempt: task.attempt,
            token: task.token,
            action,
        }
    }
}

/// What happened to one settle request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleResult {
    /// Applied.
    Done,
    /// Rejected: the lease expired and the task was reclaimed, re-leased, settled or
    /// cancelled. Nothing was changed.
    Stale,
    /// A retry past max_attempts, or a result over `max_result`: the task went to the
    /// dead letters.
    DeadLettered,
}

/// A queue's counts and monotonic counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    /// Due and waiting.
    pub ready: u64,
    /// Not yet due.
    pub delayed: u64,
    /// Handed out (including expired leases not yet reclaimed).
    pub leased: u64,
    /// Dead letters.
    pub dead: u64,
    /// Held by an operator (freeze) until thawed.
    pub frozen: u64,
    /// Tasks created by enqueue.
    pub enqueued_total: u64,
    /// Tasks acked.
    pub acked_total: u64,
    /// Retries accepted.
    pub retried_total: u64,
    /// Tasks dead-lettered.
    pub dead_total: u64,
    /// Settles rejected as stale.
    pub stale_total: u64,
    /// Leases that expired and were reclaimed.
    pub expired_total: u64,
    /// Dead letters requeued.
    pub requeued_total: u64,
    /// Dead letters purged.
    pub purged_total: u64,
    /// Tasks cancelled by id.
    pub cancelled_total: u64,
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Due, waiting to be taken.
    Ready,
    /// Not yet due.
    Delayed,
    /// Handed out under a lease.
    Leased,
    /// In the dead letters.
    Dead,
    /// Held by an operator until thawed.
    Frozen,
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TaskState::Ready => "ready",
            TaskState::Delayed => "delayed",
            TaskState::Leased => "leased",
            TaskState::Dead => "dead",
            TaskState::Frozen => "frozen",
        })
    }
}

/// Everything known about one task.
#[derive(Debug, Clone, Serialize)]
pub struct TaskInfo {
    /// Task id.
    pub id: String,
    /// Where it is.
    pub state: TaskState,
    /// Priority.
    pub priority: i32,
    /// Attempts so far.
    pub attempts: u32,
    /// Its max_attempts (0 = no limit).
    pub max_attempts: u32,
    /// When it was enqueued (ms since the epoch).
    pub enqueued_ms: i64,
    /// Due time (delayed), lease expiry (leased) or time of death (dead), in ms.
    pub at_ms: i64,
    /// Last error, if any.
    pub last_error: Option<String>,
    /// Lease token while leased.
    pub lease_token: Option<u64>,
    /// The payload.
    #[serde(skip)]
    pub payload: Vec<u8>,
}

/// A dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct DeadTask {
    /// Task id.
    pub id: String,
    /// When it died (ms since the epoch).
    pub died_ms: i64,
    /// Attempts made.
    pub attempts: u32,
    /// Its last error.
    pub error: String,
    /// Priority it had.
    pub priority: i32,
    /// The payload.
    #[serde(skip)]
    pub payload: Vec<u8>,
}

/// A handle on one queue: cheap to clone, safe to share between tasks.
#[derive(Clone)]
pub struct Queue {
    conn: RedisConn,
    keys: Arc<Keys>,
    name: Arc<str>,
    limits: QueueLimits,
    worker: Option<Arc<Worker>>,
}

/// Who takes and settles, as task records show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// The host's name.
    pub host: String,
    /// The slot's number on its host.
    pub slot: u32,
}

impl Queue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue's limits.
    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    /// The same queue, taking and settling as `worker`: the records of the tasks it takes
    /// name its host and slot.
    pub fn with_worker(mut self, worker: Worker) -> Self {
        self.worker = Some(Arc::new(worker));
        self
    }

    fn worker_args(&self) -> (&str, String) {
        match &self.worker {
            Some(w) => (&w.host, w.slot.to_string()),
            None => ("", String::new()),
        }
    }

    fn ttl_arg(&self) -> u64 {
        record::ttl_ms(self.limits.history_ttl)
    }

    fn invocation<'a>(&self, script: &'a redis::Script) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        for k in &self.keys.all {
            inv.key(k);
        }
        inv
    }

    fn check(&self, task: &NewTask) -> Result<(), QueueError> {
        if task.payload.len() as u64 > self.limits.max_payload {
            return Err(QueueError::PayloadTooLarge {
                queue: self.name.to_string(),
                size: task.payload.len(),
                limit: self.limits.max_payload,
            });
        }
        if let Some(id) = &task.id {
            if id.is_empty() || id.len() > MAX_ID_LEN {
                return Err(QueueError::Invalid(format!(
                    "task id must be 1 to {MAX_ID_LEN} bytes, got {}",
                    id.len()
                )));
            }
            if id.starts_with('#') {
                return Err(QueueError::Invalid(format!(
                    "task id {id:?} is invalid: ids starting with '#' are reserved for generated ids"
                )));
            }
        }
        let off = match task.at {
            Some(at) => at.duration_since(SystemTime::now()).unwrap_or_default(),
            None => task.delay,
        };
        if off > MAX_DELAY {
            return Err(QueueError::Invalid(format!(
                "task due in {:.1} days exceeds the limit of {} days",
                off.as_secs_f64() / 86_400.0,
                MAX_DELAY.as_secs() / 86_400
            )));
        }
        Ok(())
    }

    /// Enqueues one task.
    pub async fn enqueue(&self, task: NewTask) -> Result<Enqueued, QueueError> {
        let mut out = self.enqueue_many(std::slice::from_ref(&task)).await?;
        out.pop()
            .ok_or_else(|| QueueError::Protocol("enqueue returned nothing".into()))
    }

    /// Enqueues many tasks: one script call per chunk, chunks pipelined on the connection.
    /// Every task is checked before any is sent, so a refused task enqueues nothing.
    pub async fn enqueue_many(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, QueueError> {
        for t in tasks {
            self.check(t)?;
        }
        // A script call shares its options, so chunks also end where the options change.
        let mut chunks: Vec<&[NewTask]> = Vec::new();
        let mut start = 0;
        let mut bytes = 0;
        for (i, t) in tasks.iter().enumerate() {
            if i > start
                && (i - start >= ENQUEUE_CHUNK
                    || bytes + t.payload.len() > ENQUEUE_CHUNK_BYTES
                    || !same_options(&tasks[start], t))
            {
                chunks.push(&tasks[start..i]);
                start = i;
                bytes = 0;
            }
            bytes += t.payload.len();
        }
        if start < tasks.len() {
            chunks.push(&tasks[start..]);
        }
        let Some((first, rest)) = chunks.split_first() else {
            return Ok(Vec::new());
        };
        // The first call goes alone: it loads the script if Redis lacks it. Pipelined calls
        // that all met NOSCRIPT would retry in any order and break FIFO between chunks.
        let mut out = self.enqueue_chunk(first).await?;
        // The futures are built first: a stream that maps borrowed chunks in a closure
        // makes a future that is not `Send` for every lifetime, which a server that
        // spawns its handlers cannot use.
        let calls: Vec<_> = rest.iter().map(|chunk| self.enqueue_chunk(chunk)).collect();
        let results: Vec<Vec<Enqueued>> = futures::stream::iter(calls)
            .buffered(ENQUEUE_WINDOW)
            .try_collect()
            .await?;
        out.extend(results.into_iter().flatten());
        Ok(out)
    }

    async fn enqueue_chunk(&self, chunk: &[NewTask]) -> Result<Vec<Enqueued>, QueueError> {
        let first = &chunk[0];
        let at_ms = first
            .at
            .map(|at| millis_since_epoch(at).max(1))
            .unwrap_or(0);
        // A delay is passed as such: the script adds Redis's clock, not ours.
        let delay_ms = if first.at.is_some() {
            0
        } else {
            first.delay.as_millis() as u64
        };
        let mut inv = self.invocation(&SCRIPTS.enqueue);
        inv.arg(chunk.len())
            .arg(first.priority)
            .arg(delay_ms)
            .arg(at_ms)
            .arg(first.max_attempts.unwrap_or(self.limits.max_attempts));
        let placeholder = if first.id.is_some() { "ip" } else { "p" };
        inv.arg(placeholder)
            .arg(if self.limits.track { "1" } else { "0" })
            .arg(first.submitted_by.as_deref().unwrap_or(""))
            .arg(match self.limits.dedup {
                Dedup::Active => "a",
                Dedup::Record => "r",
            })
            .arg(self.limits.intake.as_str())
            .arg(self.ttl_arg());
        match first.id {
            None => {
                for t in chunk {
                    inv.arg(&t.payload[..]);
                }
            }
            Some(_) => {
                for t in chunk {
                    inv.arg(t.id.as_deref().unwrap_or_default())
                        .arg(&t.payload[..]);
                }
            }
        }
        let mut conn = self.conn.clone();
        let (base, flags): (i64, Vec<u8>) = inv.invoke_async(&mut conn).await?;
        if base < 0 {
            return Err(QueueError::IntakeClosed {
                queue: self.name.to_string(),
            });
        }
        let base = base as u64;
        if flags.len() != chunk.len() {
            return Err(QueueError::Protocol(format!(
                "enqueue of {} tasks returned {} flags",
                chunk.len(),
                flags.len()
            )));
        }
        Ok(chunk
            .iter()
            .zip(flags)
            .enumerate()
            .map(|(i, (t, flag))| Enqueued {
                id: t
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("#{}", base + i as u64 + 1)),
                created: flag != b'0',
                state: match flag {
                    b'1' => Some(RecordState::Waiting),
                    b'x' => Some(RecordState::Cancelled),
                    _ => None,
                },
            })
            .collect())
    }

    /// Atomically leases up to `n` due tasks for `lease`, highest priority first and FIFO
    /// within a priority. Expired leases and due delayed tasks are brought back first.
    pub async fn take(&self, n: usize, lease: Duration) -> Result<Batch, QueueError> {
        if n == 0 || n > MAX_BATCH {
            return Err(QueueError::Invalid(format!(
                "batch size must be 1 to {MAX_BATCH}, got {n}"
            )));
        }
        let lease_ms = lease.as_millis();
        if lease_ms == 0 {
            return Err(QueueError::Invalid("lease must be at least 1ms".into()));
        }
        let mut inv = self.invocation(&SCRIPTS.take);
        let (host, slot) = self.worker_args();
        inv.arg(n)
            .arg(lease_ms as u64)
            .arg(HOUSEKEEPING_LIMIT.max(n))
            .arg(host)
            .arg(slot)
            .arg(self.ttl_arg());
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        if reply.len() < 3 || !(reply.len() - 3).is_multiple_of(3) {
            return Err(QueueError::Protocol(format!(
                "take returned {} values",
                reply.len()
            )));
        }
        let now_ms = int(&reply[0])?;
        let token = int(&reply[1])? as u64;
        if token == 0 {
            let hint = int(&reply[2])?;
            return Ok(Batch {
                tasks: Vec::new(),
                now_ms,
                expires_ms: 0,
                next_hint: (hint >= 0).then(|| Duration::from_millis(hint as u64)),
            });
        }
        let expires_ms = int(&reply[2])?;
        let mut tasks = Vec::with_capacity((reply.len() - 3) / 3);
        let mut it = reply.into_iter().skip(3);
        while let (Some(id), Some(att), Some(payload)) = (it.next(), it.next(), it.next()) {
            tasks.push(LeasedTask {
                id: string(&id)?,
                attempt: int(&att)? as u32,
                payload: match payload {
                    Value::BulkString(b) => b,
                    _ => Vec::new(),
                },
                token,
            });
        }
        Ok(Batch {
            tasks,
            now_ms,
            expires_ms,
            next_hint: None,
        })
    }

    /// Like [`take`](Self::take), but when nothing is due waits up to `max_wait` for an
    /// enqueue (woken through `waiter`, no polling) or for the next delayed task or lease
    /// expiry. Returns an empty batch when `max_wait` passes.
    pub async fn take_wait(
        &self,
        waiter: &mut Waiter,
        n: usize,
        lease: Duration,
        max_wait: Duration,
    ) -> Result<Batch, QueueError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            let batch = self.take(n, lease).await?;
            let now = tokio::time::Instant::now();
            if !batch.tasks.is_empty() || now >= deadline {
                return Ok(batch);
            }
            let mut wait = deadline - now;
            if let Some(hint) = batch.next_hint {
                wait = wait.min(hint + Duration::from_millis(1));
            }
            if let Err(e) = waiter.wait(self.keys.wake(), wait).await {
                // The next take reports the outage; pausing here keeps a broken waiter
                // from turning this loop into a busy one.
                tracing::debug!(queue = %self.name, error = %e, "wake-up wait failed");
                tokio::time::sleep(wait.min(Duration::from_millis(500))).await;
            }
        }
    }

    /// Waits up to `timeout` for an enqueue to this queue (or a wake-up from another
    /// taker's take); true when woken. For takers that run their own loop around
    /// [`take`](Self::take) and must stay cancellable while idle.
    pub async fn wait(&self, waiter: &mut Waiter, timeout: Duration) -> Result<bool, QueueError> {
        waiter.wait(self.keys.wake(), timeout).await
    }

    /// Settles leased tasks in one round trip. Each result says whether it was applied or
    /// rejected as stale.
    pub async fn settle(&self, ops: &[SettleOp]) -> Result<Vec<SettleResult>, QueueError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let checked = self.check_results(ops);
        let ops = checked.as_deref().unwrap_or(ops);
        // Acks go first as (id, token) pairs, those of first attempts before the rest (only
        // later attempts have state to clean up); other ops follow with all their arguments.
        let is_ack = |i: &usize| ops[*i].action == Settle::Ack;
        let first: Vec<usize> = (0..ops.len())
            .filter(|i| is_ack(i) && ops[*i].attempt <= 1)
            .collect();
        let later: Vec<usize> = (0..ops.len())
            .filter(|i| is_ack(i) && ops[*i].attempt > 1)
            .collect();
        let others: Vec<usize> = (0..ops.len()).filter(|i| !is_ack(i)).collect();
        let mut inv = self.invocation(&SCRIPTS.settle);
        let (host, slot) = self.worker_args();
        inv.arg(first.len())
            .arg(later.len())
            .arg(host)
            .arg(slot)
            .arg(self.ttl_arg());
        for &i in &first {
            inv.arg(&ops[i].id).arg(ops[i].token);
        }
        // Later attempts carry their attempt: the record's done entry names it.
        for &i in &later {
            inv.arg(&ops[i].id).arg(ops[i].token).arg(ops[i].attempt);
        }
        for &i in &others {
            let op = &ops[i];
            inv.arg(match op.action {
                Settle::Ack => unreachable!("acks are sent above"),
                Settle::Extend { .. } => "e",
                Settle::Retry { .. } => "r",
                Settle::Fail { .. } => "f",
                Settle::AckWithResult { .. } => "d",
            })
            .arg(&op.id)
            .arg(op.token)
            .arg(op.attempt);
            match &op.action {
                Settle::Ack => {}
                Settle::Extend { lease } => {
                    inv.arg(lease.as_millis().max(1) as u64).arg("").arg("");
                }
                Settle::Retry {
                    delay,
                    priority,
                    reason,
                } => {
                    // Clamped, not refused: refusing would leave the task leased.
                    inv.arg((*delay).min(MAX_DELAY).as_millis() as u64)
                        .arg(priority.map(|p| p.to_string()).unwrap_or_default())
                        .arg(reason);
                }
                Settle::Fail { reason } => {
                    inv.arg(reason).arg("").arg("");
                }
                Settle::AckWithResult { result } => {
                    inv.arg(result).arg("").arg("");
                }
            }
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = inv.invoke_async(&mut conn).await?;
        if reply.len() != ops.len() {
            return Err(QueueError::Protocol(format!(
                "settle of {} returned {} results",
                ops.len(),
                reply.len()
            )));
        }
        let mut out = vec![SettleResult::Stale; ops.len()];
        for (&i, r) in first.iter().chain(&later).chain(&others).zip(reply) {
            out[i] = match r {
                1 => SettleResult::Done,
                2 => SettleResult::DeadLettered,
                _ => SettleResult::Stale,
            };
        }
        Ok(out)
    }

    /// The ops with every result over `max_result` turned into a fail naming the limit
    /// (never cut: a cut result would be a wrong one); `None` when all fit.
    fn check_results(&self, ops: &[SettleOp]) -> Option<Vec<SettleOp>> {
        let limit = self.limits.max_result;
        let too_big = |op: &SettleOp| matches!(&op.action, Settle::AckWithResult { result } if result.len() as u64 > limit);
        if !ops.iter().any(too_big) {
            return None;
        }
        Some(
            ops.iter()
                .map(|op| match &op.action {
                    Settle::AckWithResult { result } if too_big(op) => SettleOp {
                        action: Settle::Fail {
                            reason: format!(
                                "result of {} bytes exceeds max_result {} bytes of queue {}",
                                result.len(),
                                limit,
                                self.name
                            ),
                        },
                        ..op.clone()
                    },
                    _ => op.clone(),
                })
                .collect(),
        )
    }

    /// Acks leased tasks (one round trip).
    pub async fn ack(&self, tasks: &[LeasedTask]) -> Result<Vec<SettleResult>, QueueError> {
        let ops: Vec<SettleOp> = tasks
            .iter()
            .map(|t| SettleOp::new(t, Settle::Ack))
            .collect();
        self.settle(&ops).await
    }

    /// Extends the leases of tasks still being worked on (one round trip).
    pub async fn extend(
        &self,
        tasks: &[LeasedTask],
        lease: Duration,
    ) -> Result<Vec<SettleResult>, QueueError> {
        let ops: Vec<SettleOp> = tasks
            .iter()
            .map(|t| SettleOp::new(t, Settle::Extend { lease }))
            .collect();
        self.settle(&ops).await
    }

    /// Counts and counters.
    pub async fn stats(&self) -> Result<QueueStats, QueueError> {
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self
            .invocation(&SCRIPTS.stats)
            .invoke_async(&mut conn)
            .await?;
        if reply.len() < 5 {
            return Err(QueueError::Protocol("stats returned too little".into()));
        }
        let mut s = QueueStats {
            ready: int(&reply[0])? as u64,
            delayed: int(&reply[1])? as u64,
            leased: int(&reply[2])? as u64,
            dead: int(&reply[3])? as u64,
            frozen: int(&reply[4])? as u64,
            ..Default::default()
        };
        for pair in reply[5..].chunks(2) {
            let [field, value] = pair else { break };
            let value: u64 = string(value)?.parse().unwrap_or(0);
            match string(field)?.as_str() {
                "enqueued" => s.enqueued_total = value,
                "acked" => s.acked_total = value,
                "retried" => s.retried_total = value,
                "dead" => s.dead_total = value,
                "stale" => s.stale_total = value,
                "expired" => s.expired_total = value,
                "requeued" => s.requeued_total = value,
                "purged" => s.purged_total = value,
                "cancelled" => s.cancelled_total = value,
                _ => {}
            }
        }
        Ok(s)
    }

    /// Dead letters, oldest first.
    pub async fn dead(&self, offset: usize, limit: usize) -> Result<Vec<DeadTask>, QueueError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut inv = self.invocation(&SCRIPTS.dead_list);
        inv.arg(offset).arg(limit);
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        reply
            .chunks(6)
            .map(|row| {
                let meta = Meta::parse(&string(&row[5])?);
                Ok(DeadTask {
                    id: string(&row[0])?,
                    died_ms: int(&row[1])?,
                    attempts: int(&row[2])? as u32,
                    payload: bytes(&row[3]),
                    error: string(&row[4])?,
                    priority: meta.map(|m| m.priority).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Puts dead letters back in the ready set with their attempts reset: the given ids,
    /// or all of them (in chunks, so Redis is never blocked for long). Returns how many.
    pub async fn requeue_dead(&self, ids: Option<&[String]>) -> Result<u64, QueueError> {
        self.dead_move("requeue", ids).await
    }

    /// Deletes dead letters: the given ids, or all of them. Returns how many.
    pub async fn purge_dead(&self, ids: Option<&[String]>) -> Result<u64, QueueError> {
        self.dead_move("purge", ids).await
    }

    async fn dead_move(&self, action: &str, ids: Option<&[String]>) -> Result<u64, QueueError> {
        let mut total = 0u64;
        let mut conn = self.conn.clone();
        match ids {
            Some(ids) => {
                for chunk in ids.chunks(HOUSEKEEPING_LIMIT) {
                    let mut inv = self.invocation(&SCRIPTS.dead_move);
                    inv.arg(action).arg(chunk.len()).arg(REQUEUE_NOTE);
                    for id in chunk {
                        inv.arg(id);
                    }
                    total += inv.invoke_async::<u64>(&mut conn).await?;
                }
            }
            None => loop {
                let mut inv = self.invocation(&SCRIPTS.dead_move);
                inv.arg(action).arg(HOUSEKEEPING_LIMIT).arg(REQUEUE_NOTE);
                let n: u64 = inv.invoke_async(&mut conn).await?;
                total += n;
                if n == 0 {
                    break;
                }
            },
        }
        Ok(total)
    }

    /// Deletes the whole queue: every task in every state, and its counters. For tests,
    /// benchmarks and decommissioning a queue type.
    pub async fn delete_all(&self) -> Result<(), QueueError> {
        let mut conn = self.conn.clone();
        self.invocation(&SCRIPTS.drop)
            .invoke_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Looks a task up by id.
    pub async fn find(&self, id: &str) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, None).await
    }

    /// Removes a task by id, whatever its state, and returns what it was. A leased task's
    /// holder will find its settle rejected as stale. Its record says cancelled.
    pub async fn cancel(&self, id: &str) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, Some("cancelled")).await
    }

    /// Like [`cancel`](Self::cancel), with `note` (who cancelled, why) in the record's
    /// history.
    pub async fn cancel_with(&self, id: &str, note: &str) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, Some(note)).await
    }

    async fn find_or_cancel(
        &self,
        id: &str,
        cancel: Option<&str>,
    ) -> Result<Option<TaskInfo>, QueueError> {
        let mut inv = self.invocation(&SCRIPTS.find);
        inv.arg(id)
            .arg(if cancel.is_some() { "1" } else { "0" })
            .arg(cancel.unwrap_or(""))
            .arg(self.ttl_arg());
        let mut conn = self.conn.clone();
        let reply: Option<Vec<Value>> = inv.invoke_async(&mut conn).await?;
        let Some(r) = reply else { return Ok(None) };
        if r.len() != 7 {
            return Err(QueueError::Protocol(format!(
                "find returned {} values",
                r.len()
            )));
        }
        let state = match string(&r[0])?.as_str() {
            "ready" => TaskState::Ready,
            "delayed" => TaskState::Delayed,
            "leased" => TaskState::Leased,
            "dead" => TaskState::Dead,
            "frozen" => TaskState::Frozen,
            other => return Err(QueueError::Protocol(format!("unknown state {other:?}"))),
        };
        let meta = Meta::parse(&string(&r[2])?)
            .ok_or_else(|| QueueError::Protocol("malformed task meta".into()))?;
        let err = string(&r[5])?;
        let tok = string(&r[6])?;
        Ok(Some(TaskInfo {
            id: id.to_string(),
            state,
            priority: meta.priority,
            attempts: int(&r[3])? as u32,
            max_attempts: meta.max_attempts,
            enqueued_ms: meta.enqueued_ms,
            at_ms: int(&r[1])?,
            last_error: (!err.is_empty()).then_some(err),
            lease_token: tok.parse().ok(),
            payload: bytes(&r[4]),
        }))
    }
}

/// The static part of a task's record (`meta` hash), as the scripts pack it.
struct Meta {
    priority: i32,
    max_attempts: u32,
    enqueued_ms: i64,
}

impl Meta {
    fn parse(s: &str) -> Option<Meta> {
        let mut it = s.split(':');
        let priority = it.next()?.parse().ok()?;
        let max_attempts = it.next()?.parse().ok()?;
        let enqueued_ms = it.next()?.parse().ok()?;
        Some(Meta {
            priority,
            max_attempts,
            enqueued_ms,
        })
    }
}

/// Whether two tasks can share one enqueue call: same options, and ids given for both or
/// for neither (the script has a faster path when every id is generated).
fn same_options(a: &NewTask, b: &NewTask) -> bool {
    (
        a.priority,
        a.delay,
        a.at,
        a.max_attempts,
        a.id.is_some(),
        &a.submitted_by,
    ) == (
        b.priority,
        b.delay,
        b.at,
        b.max_attempts,
        b.id.is_some(),
        &b.submitted_by,
    )
}

fn millis_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn int(v: &Value) -> Result<i64, QueueError> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| QueueError::Protocol("expected an integer".into())),
        other => Err(QueueError::Protocol(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}

fn string(v: &Value) -> Result<String, QueueError> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        Value::Nil => Ok(String::new()),
        other => Err(QueueError::Protocol(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        _ => Vec::new(),
    }
}
