//! `gaffer simulate`: the real balancer in a deterministic discrete-time simulation of a
//! cluster, beside the rules it has to beat (`hpa`: KEDA's queue-length autoscaling;
//! `static`: every queue at its minimum).
//!
//! Time advances in steps of [`STEP`]. Arrivals are Poisson per step (seeded); slots
//! work as real ones do, under every policy: a whole batch per take, its tasks one after
//! another at the mean task time (a task waits its turn in the batch), a stopped slot
//! finishing the task in hand and giving the untouched rest of its batch back to the head
//! of the queue (or, for a queue the trace lists in `whole_batch`, whose handler ignores
//! the stop, finishing its whole batch), a new slot working after the trace's `slot_start`. Waits (enqueue to
//! start) go into a histogram with 10 ms resolution. All three policies place slots
//! with the balancer's placement, so they differ only in how many slots each queue gets,
//! and when. `gaffer` decides on the manager's own statistics window
//! ([`crate::manager::window`]), fed the simulated counters.
//!
//! `cluster.rs` is the simulated cluster and its steps, `queue.rs` one queue (backlog,
//! slots and their batches, work, waits), `recorded.rs` a trace from the manager's load
//! rings (`gaffer trace record`), `rng.rs` the seeded randomness.

mod cluster;
mod queue;
pub mod recorded;
mod rng;
pub mod trace;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::config::Config;
use cluster::SimCluster;
pub use trace::{Trace, TraceError};

/// Simulated time per step.
pub const STEP: Duration = Duration::from_millis(100);
/// KEDA/HPA sync period and scale-down stabilisation.
const HPA_SYNC: Duration = Duration::from_secs(15);
const HPA_STABILISATION: Duration = Duration::from_secs(300);

/// Which rule decides the slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// gaffer's balancer, every manager tick.
    Gaffer,
    /// The Kubernetes HPA rule that KEDA drives from queue length.
    Hpa,
    /// Every queue at `min_slots`.
    Static,
}

/// Per queue figures of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueueReport {
    /// Tasks that arrived.
    pub arrived: u64,
    /// Tasks handled.
    pub done: u64,
    /// Median wait from enqueue to start, ms.
    pub wait_p50_ms: u64,
    /// 99th percentile wait, ms.
    pub wait_p99_ms: u64,
    /// Longest wait, ms.
    pub wait_max_ms: u64,
    /// Largest backlog seen.
    pub max_backlog: u64,
    /// Slots averaged over the run.
    pub mean_slots: f64,
    /// Σ |change| of the queue's slots over all decisions.
    pub slot_changes: u64,
    /// Tasks still ready or in a batch when the trace ends: arrived = done + this.
    pub left_at_end: u64,
}

/// The report of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The rule that decided.
    pub policy: Policy,
    /// Simulated seconds.
    pub duration_seconds: f64,
    /// The trace's seed.
    pub seed: u64,
    /// Per queue of the config.
    pub queues: BTreeMap<String, QueueReport>,
    /// Slots that left one queue for another in the same decision.
    pub slot_moves: u64,
    /// Slots started.
    pub slot_starts: u64,
    /// Busy slot-seconds / slot-seconds.
    pub mean_utilisation: f64,
}

/// Why a trace cannot run against a config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimulateError {
    /// A load segment names a queue the config does not have.
    #[error("the trace loads queue `{queue}`, which is not in the config")]
    UnknownQueue {
        /// The queue the trace names.
        queue: String,
    },
    /// Another key of the trace names a queue the config does not have (`whole_batch`).
    #[error(transparent)]
    Trace(#[from] TraceError),
}

/// Runs `trace` against the queues of `config` under `policy`.
pub fn run(config: &Config, trace: &Trace, policy: Policy) -> Result<Report, SimulateError> {
    for l in &trace.load {
        if !config.queues.contains_key(&l.queue) {
            return Err(SimulateError::UnknownQueue {
                queue: l.queue.clone(),
            });
        }
    }
    trace.check_whole_batch(|q| config.queues.contains_key(q))?;
    Ok(SimCluster::new(config, trace, policy).run())
}

impl Report {
    /// The report as a table for people.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "policy {:?}, {:.0} s simulated, seed {}",
            self.policy, self.duration_seconds, self.seed
        );
        let _ = writeln!(
            s,
            "{:<20} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
            "queue", "arrived", "done", "p50 ms", "p99 ms", "max ms", "backlog", "slots", "changes"
        );
        for (q, r) in &self.queues {
            let _ = writeln!(
                s,
                "{:<20} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8.1} {:>8}",
                q,
                r.arrived,
                r.done,
                r.wait_p50_ms,
                r.wait_p99_ms,
                r.wait_max_ms,
                r.max_backlog,
                r.mean_slots,
                r.slot_changes
            );
        }
        let _ = writeln!(
            s,
            "slot moves {}, slot starts {}, mean utilisation {:.1} %",
            self.slot_moves,
            self.slot_starts,
            self.mean_utilisation * 100.0
        );
        s
    }
}
