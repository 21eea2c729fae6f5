//! The master's typed events: each logs and counts in one place, so the log and
//! `/metrics` never disagree. Labels are bounded: queue names and fixed reasons, never a
//! task id or a pid.

use std::time::Duration;

use metrics::{counter, gauge};

use crate::cluster::{Bound, HostReport};
use crate::host::proto::StartDelays;

/// Why a slot ended, as counted in `gaffer_slot_exits_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Asked to stop and did (exit 0).
    Stopped,
    /// Recycled on memory (exit 75); restarted at once.
    Recycled,
    /// Any other exit; restarted with back-off when it repeats.
    Crashed,
    /// Killed by the watchdog.
    Hung,
}

impl Exit {
    fn label(self) -> &'static str {
        match self {
            Exit::Stopped => "stopped",
            Exit::Recycled => "recycled",
            Exit::Crashed => "crashed",
            Exit::Hung => "hung",
        }
    }
}

/// Registers every per-queue series at zero, so dashboards show 0 for a queue that has
/// not yet had a slot exit or a batch, instead of no data.
pub(crate) fn queues_known<'a>(queues: impl Iterator<Item = &'a String>) {
    for q in queues {
        let l = || [("queue", q.clone())];
        counter!("gaffer_slot_starts_total", &l()).increment(0);
        for exit in [Exit::Stopped, Exit::Recycled, Exit::Crashed, Exit::Hung] {
            counter!("gaffer_slot_exits_total", "queue" => q.clone(), "reason" => exit.label())
                .increment(0);
        }
        counter!("gaffer_tasks_processed_total", &l()).increment(0);
        counter!("gaffer_tasks_failed_total", &l()).increment(0);
        counter!("gaffer_batches_total", &l()).increment(0);
        counter!("gaffer_settle_stale_total", &l()).increment(0);
    }
}

/// A slot forked by the zygote, as logged and counted.
pub(crate) struct SlotStarted<'a> {
    /// The queue it serves.
    pub(crate) queue: &'a str,
    /// The master's number for it.
    pub(crate) slot: u32,
    /// Its pid.
    pub(crate) pid: u32,
}

impl SlotStarted<'_> {
    /// Logs and counts it.
    pub(crate) fn emit(&self) {
        let SlotStarted { queue, slot, pid } = *self;
        tracing::debug!(queue, slot, pid, "slot started");
        counter!("gaffer_slot_starts_total", "queue" => queue.to_owned()).increment(1);
    }
}

/// One slot's end, as logged and counted.
pub(crate) struct SlotExit<'a> {
    /// The queue it served.
    pub(crate) queue: &'a str,
    /// The master's number for it.
    pub(crate) slot: u32,
    /// Its pid.
    pub(crate) pid: u32,
    /// Exit code, when it exited.
    pub(crate) code: Option<i32>,
    /// Signal number, when a signal killed it.
    pub(crate) signal: Option<i32>,
    /// How the master reads its end.
    pub(crate) exit: Exit,
    /// From the spawn request to the exit.
    pub(crate) lived: Duration,
    /// The reason the slot gave before exiting, if it could.
    pub(crate) reason: Option<&'a str>,
}

impl SlotExit<'_> {
    /// Logs and counts it.
    pub(crate) fn emit(&self) {
        let e = self;
        let (reason, exit) = (e.reason.unwrap_or(""), e.exit.label());
        match e.exit {
            Exit::Stopped | Exit::Recycled => tracing::info!(queue = e.queue, slot = e.slot,
                pid = e.pid, code = ?e.code, signal = ?e.signal, exit, lived = ?e.lived, reason,
                "slot exited"),
            Exit::Crashed | Exit::Hung => tracing::warn!(queue = e.queue, slot = e.slot,
                pid = e.pid, code = ?e.code, signal = ?e.signal, exit, lived = ?e.lived, reason,
                "slot exited"),
        }
        counter!("gaffer_slot_exits_total", "queue" => e.queue.to_owned(), "reason" => exit)
            .increment(1);
    }
}

/// A batch a slot settled, or several in a row summed, as counted (not logged: there may
/// be thousands a second).
pub(crate) struct BatchDone<'a> {
    /// The queue it came from.
    pub(crate) queue: &'a str,
    /// How many batches this stands for.
    pub(crate) batches: u32,
    /// Tasks in it.
    pub(crate) tasks: u32,
    /// Of those, failed (retried or dead).
    pub(crate) failed: u32,
    /// Time in the handler.
    pub(crate) busy_ms: u64,
    /// Settles refused as stale (the lease had passed to another slot).
    pub(crate) stale: u32,
    /// Its first attempts' enqueue-to-start delays.
    pub(crate) start_delays: &'a StartDelays,
}

impl BatchDone<'_> {
    /// Counts it.
    pub(crate) fn emit(&self) {
        let BatchDone {
            queue,
            batches,
            tasks,
            failed,
            busy_ms,
            stale,
            start_delays,
        } = *self;
        let q = queue.to_owned();
        counter!("gaffer_tasks_processed_total", "queue" => q.clone()).increment(u64::from(tasks));
        counter!("gaffer_tasks_failed_total", "queue" => q.clone()).increment(u64::from(failed));
        counter!("gaffer_batches_total", "queue" => q.clone()).increment(u64::from(batches));
        counter!("gaffer_settle_stale_total", "queue" => q).increment(u64::from(stale));
        // Batches summed by their slot (each ended within REPORT_HOLD of the one before,
        // so each was that short) count at their mean time: the histogram's count and sum
        // stay exact, and its buckets above REPORT_HOLD too.
        let n = batches.max(1);
        metrics::histogram!("gaffer_batch_seconds", "queue" => queue.to_owned())
            .record_many(busy_ms as f64 / 1000.0 / f64::from(n), n as usize);
        if !start_delays.is_empty() {
            let h =
                metrics::histogram!("gaffer_task_start_delay_seconds", "queue" => queue.to_owned());
            for (mean, n) in start_delays.means() {
                h.record_many(mean, n);
            }
        }
    }
}

/// The host's report as gauges: what `/metrics` shows of it.
pub(crate) fn host_gauges(r: &HostReport) {
    gauge!("gaffer_master_capacity_slots").set(f64::from(r.capacity));
    gauge!("gaffer_master_slots").set(f64::from(r.slots));
    gauge!("gaffer_master_pss_bytes").set(r.pss_bytes as f64);
    gauge!("gaffer_master_mem_available_bytes").set(r.mem_available_bytes as f64);
    gauge!("gaffer_master_memory_budget_bytes").set(r.memory_budget_bytes as f64);
    gauge!("gaffer_master_load1").set(r.load1);
    if let Some(p) = r.cpu_pressure {
        gauge!("gaffer_master_cpu_pressure_percent").set(p);
    }
    let overloaded = r.capacity_bound == Some(Bound::Load);
    gauge!("gaffer_master_cpu_overloaded").set(if overloaded { 1.0 } else { 0.0 });
    gauge!("gaffer_master_draining").set(if r.draining { 1.0 } else { 0.0 });
    for (q, qr) in &r.queues {
        gauge!("gaffer_queue_slots", "queue" => q.clone()).set(f64::from(qr.slots));
        gauge!("gaffer_queue_slots_wanted", "queue" => q.clone()).set(f64::from(qr.wanted));
        gauge!("gaffer_queue_pss_bytes", "queue" => q.clone()).set(qr.pss_bytes as f64);
        // A float total kept by the master; a gauge because counters take integers.
        gauge!("gaffer_handler_busy_seconds_total", "queue" => q.clone())
            .set(qr.busy_seconds_total);
    }
}
