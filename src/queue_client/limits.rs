//! The queue's limits (each defined once: here, or in config where config checks it too),
//! and the per-queue limits a handle carries.

use std::time::Duration;

use crate::config::{Dedup, Intake, QueueKind};

// Defined in config, which validates them too; the queue enforces them on every call.
pub use crate::config::{DEFAULT_MAX_PAYLOAD, MAX_BATCH};
/// Longest task id accepted, in bytes.
pub const MAX_ID_LEN: usize = 256;
/// Longest a task may be put off, by an enqueue's `delay` or `at` or a retry's delay: a
/// task parked for centuries is lost in all but name, and millisecond scores past this
/// stay exact in Redis's doubles.
pub const MAX_DELAY: Duration = Duration::from_secs(366 * 24 * 3600);
/// Expired leases and due delayed tasks moved per take; bounds the time one script runs.
pub(super) const HOUSEKEEPING_LIMIT: usize = 1000;

/// Largest page a listing returns.
pub const MAX_LIST_LIMIT: usize = 1000;

/// Per-queue limits and defaults, normally from the queue's config.
#[derive(Debug, Clone)]
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
    /// One task at a time in creation order (`ordered = true`).
    pub ordered: bool,
    /// The external system the queue's takes answer to, if any.
    pub system: Option<SystemLimits>,
    /// Batch or long tasks: a running long task is asked to stop when cancelled.
    pub kind: QueueKind,
    /// The queue's `next` routes make follow-ups of every task that is done: each of its
    /// tasks is enqueued as the global task of a chain of its own, which its record names
    /// from the start (a follow-up's enqueue then neither reads nor rewrites it).
    pub starts_chains: bool,
    /// The queue has `on = "failed"` routes: a task whose lease runs out at its last
    /// attempt is handed out once more, past its max_attempts, so that a slot fails it
    /// with its failed routes (a take cannot make follow-ups) instead of it being
    /// dead-lettered there.
    pub failed_routes: bool,
    /// A slot's follow-ups to this queue are enqueued as packets, one per call, where
    /// the queue takes them (tracked batch queues that are not ordered; see
    /// `lua/lib/blocks.lua`, "Packets"). Every configured queue has it; off by default, so
    /// that a queue made in code keeps the one-by-one layout unless it asks.
    pub packets: bool,
}

/// What a queue's takes owe its external system: the run-time switch is read beside the
/// queue, these are the config's values.
#[derive(Debug, Clone, PartialEq)]
pub struct SystemLimits {
    /// The system's name.
    pub name: std::sync::Arc<str>,
    /// Tasks per second of all its queues together, cluster-wide.
    pub rate: Option<f64>,
    /// The config's `paused`: the state while no run-time switch is set.
    pub paused: bool,
    /// The most tokens its rate bucket saves up (the largest batch of its queues).
    pub burst: usize,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            max_payload: DEFAULT_MAX_PAYLOAD,
            max_attempts: crate::config::DEFAULT_MAX_ATTEMPTS,
            track: true,
            history_ttl: crate::config::DEFAULT_HISTORY_TTL,
            max_result: crate::config::DEFAULT_MAX_RESULT,
            dedup: Dedup::Active,
            intake: Intake::Open,
            ordered: false,
            system: None,
            kind: QueueKind::Batch,
            starts_chains: false,
            failed_routes: false,
            packets: false,
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
            ordered: q.ordered,
            system: q.system.as_ref().map(|name| SystemLimits {
                name: name.as_str().into(),
                rate: q.system_rate.map(|r| r.per_second),
                paused: q.system_paused,
                burst: q.system_burst as usize,
            }),
            kind: q.kind,
            starts_chains: q.next.iter().any(|r| r.on == crate::config::RouteOn::Done),
            failed_routes: q
                .next
                .iter()
                .any(|r| r.on == crate::config::RouteOn::Failed),
            packets: true,
        }
    }
}
