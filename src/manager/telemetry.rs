//! The manager's typed events: each logs and counts in one place. The manager is also
//! where cluster-wide queue figures are exported (it reads them every tick anyway), so a
//! Prometheus scrape of the active manager shows every queue's backlog and decision.
//! Labels are bounded: queue names, host states and fixed outcomes.

use std::collections::BTreeMap;
use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::balancer::{Decision, HostState};
use crate::config::Config;
use crate::queue_client::QueueStats;

/// Registers the manager's series at zero, so dashboards show 0 rather than "no data"
/// before the first event of a kind.
pub(crate) fn started(id: &str) {
    tracing::info!(id, "manager starting");
    gauge!("gaffer_manager_leader").set(0.0);
    gauge!("gaffer_manager_epoch").set(0.0);
    counter!("gaffer_manager_leadership_changes_total").absolute(0);
    counter!("gaffer_manager_ticks_total").absolute(0);
    counter!("gaffer_manager_tick_errors_total").absolute(0);
    counter!("gaffer_manager_map_writes_total").absolute(0);
    counter!("gaffer_manager_fenced_total").absolute(0);
    counter!("gaffer_manager_hosts_forgotten_total").absolute(0);
    for verdict in ["alive", "dead"] {
        counter!("gaffer_manager_host_verdicts_total", "verdict" => verdict).absolute(0);
    }
    gauge!("gaffer_manager_map_version").set(0.0);
    gauge!("gaffer_cluster_slots_mapped").set(0.0);
}

/// This manager took or lost leadership.
pub(crate) struct LeadershipChanged<'a> {
    /// The manager's id.
    pub(crate) id: &'a str,
    /// Whether it leads now.
    pub(crate) leading: bool,
    /// The lease's fencing epoch.
    pub(crate) epoch: u64,
}

impl LeadershipChanged<'_> {
    /// Logs and counts the change.
    pub(crate) fn emit(&self) {
        let Self { id, leading, epoch } = *self;
        tracing::info!(id, leading, epoch, "leadership changed");
        counter!("gaffer_manager_leadership_changes_total").increment(1);
        gauge!("gaffer_manager_leader").set(if leading { 1.0 } else { 0.0 });
        gauge!("gaffer_manager_epoch").set(epoch as f64);
    }
}

/// The leader raised its epoch past one a master had seen: the epoch counter restarted, or
/// Redis lost a map this leader wrote.
pub(crate) struct EpochRaised {
    /// Why: a master ran a map of this epoch newer than the one Redis holds.
    pub(crate) lost_map: bool,
    /// The leader's epoch before.
    pub(crate) was: u64,
    /// The highest epoch a master reported.
    pub(crate) seen: u64,
    /// The leader's epoch now.
    pub(crate) epoch: u64,
}

impl EpochRaised {
    /// Logs it and sets the epoch gauge.
    pub(crate) fn emit(&self) {
        let Self {
            lost_map,
            was,
            seen,
            epoch,
        } = *self;
        if lost_map {
            tracing::warn!(
                was,
                epoch,
                "a master runs a newer map of this epoch than redis holds (did redis fail over to a lagging replica?); raised the epoch and writes the map anew"
            );
        } else {
            tracing::warn!(
                was,
                seen,
                epoch,
                "a master has seen a higher epoch than this leader's (the epoch counter restarted: did redis lose its data?); raised past it"
            );
        }
        gauge!("gaffer_manager_epoch").set(epoch as f64);
    }
}

pub(crate) fn tick_done(took: Duration) {
    counter!("gaffer_manager_ticks_total").increment(1);
    histogram!("gaffer_manager_tick_seconds").record(took.as_secs_f64());
}

/// The step of a tick that can fail on its own, as counted in
/// `gaffer_manager_tick_errors_total{step}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Reading the cluster, deciding and writing the map.
    Decide,
    /// Firing the schedules.
    Schedules,
    /// A standby reading the cluster's counters into its window.
    Observe,
}

impl Step {
    fn label(self) -> &'static str {
        match self {
            Step::Decide => "decide",
            Step::Schedules => "schedules",
            Step::Observe => "observe",
        }
    }
}

/// A step of a tick failed; the next tick tries again.
pub(crate) struct TickFailed<'a> {
    /// Which step.
    pub(crate) step: Step,
    /// Why.
    pub(crate) error: &'a anyhow::Error,
}

impl TickFailed<'_> {
    /// Logs and counts the failure.
    pub(crate) fn emit(&self) {
        let what = self.step.label();
        tracing::warn!(what, error = %format!("{:#}", self.error), "tick failed");
        counter!("gaffer_manager_tick_errors_total", "step" => what).increment(1);
    }
}

/// A new slot map went out under this manager's epoch.
pub(crate) struct MapWritten {
    /// The map's version.
    pub(crate) version: u64,
    /// The fencing epoch it was written under.
    pub(crate) epoch: u64,
    /// Slots it places, over every host and queue.
    pub(crate) slots: u32,
}

impl MapWritten {
    /// Logs the write and sets the map's gauges.
    pub(crate) fn emit(&self) {
        let Self {
            version,
            epoch,
            slots,
        } = *self;
        tracing::info!(version, epoch, slots, "published a new slot map");
        counter!("gaffer_manager_map_writes_total").increment(1);
        gauge!("gaffer_manager_map_version").set(version as f64);
        gauge!("gaffer_cluster_slots_mapped").set(f64::from(slots));
    }
}

pub(crate) fn fenced(id: &str) {
    tracing::warn!(id, "fenced off: another manager leads now");
    counter!("gaffer_manager_fenced_total").increment(1);
    gauge!("gaffer_manager_leader").set(0.0);
}

/// A schedule of `queue` exists: its fire counter shows 0 until it fires.
pub(crate) fn schedule_known(queue: &str) {
    counter!("gaffer_schedule_fires_total", "queue" => queue.to_owned()).increment(0);
}

/// A schedule enqueued its task for one fire time.
pub(crate) struct ScheduleFired<'a> {
    /// The schedule's name (a log field only: users name stored schedules, so no label).
    pub(crate) schedule: &'a str,
    /// The queue it fills.
    pub(crate) queue: &'a str,
    /// The fire time, ms since the epoch.
    pub(crate) fire_ms: i64,
    /// The task's id.
    pub(crate) id: &'a str,
}

impl ScheduleFired<'_> {
    /// Logs and counts the fire.
    pub(crate) fn emit(&self) {
        let Self {
            schedule,
            queue,
            fire_ms,
            id,
        } = *self;
        tracing::info!(schedule, queue, fire_ms, id, "schedule fired");
        counter!("gaffer_schedule_fires_total", "queue" => queue.to_owned()).increment(1);
    }
}

/// `n` due moments of a schedule were not enqueued: `reason` is `paused`, `queue_gone` or
/// `refused` (its queue's intake).
pub(crate) fn fires_skipped(reason: &'static str, n: usize) {
    counter!("gaffer_schedule_fires_skipped_total", "reason" => reason).increment(n as u64);
}

/// A host silent past `[manager].forget_hosts_after` was forgotten: its report deleted.
pub(crate) struct HostForgotten<'a> {
    /// The host's name.
    pub(crate) host: &'a str,
    /// How long it had been silent, ms.
    pub(crate) silent_ms: u64,
}

impl HostForgotten<'_> {
    /// Logs and counts it.
    pub(crate) fn emit(&self) {
        let silent = humantime::format_duration(std::time::Duration::from_millis(
            self.silent_ms / 1000 * 1000,
        ));
        tracing::info!(host = self.host, silent = %silent, "forgot a host silent past forget_hosts_after");
        counter!("gaffer_manager_hosts_forgotten_total").increment(1);
    }
}

/// The leader's verdict on a host changed (or a host was dead when first judged): the
/// reason slots move off a host, or back onto it.
pub(crate) struct HostJudged<'a> {
    /// The host's name.
    pub(crate) host: &'a str,
    /// The new verdict.
    pub(crate) alive: bool,
    /// How long its report had not changed, ms (None: never seen).
    pub(crate) silent_ms: Option<u64>,
    /// How long it may be silent and live: the heartbeat timeout, plus the grace after an
    /// outage of the manager's own, ms.
    pub(crate) allowed_ms: u64,
}

impl HostJudged<'_> {
    /// Logs and counts it: a death as a warning, a return as info.
    pub(crate) fn emit(&self) {
        let Self {
            host,
            alive,
            silent_ms,
            allowed_ms,
        } = *self;
        let verdict = if alive { "alive" } else { "dead" };
        if alive {
            tracing::info!(
                host,
                silent_ms,
                allowed_ms,
                "host alive again: its report changed"
            );
        } else {
            tracing::warn!(
                host,
                silent_ms,
                allowed_ms,
                "host judged dead: its report has not changed for longer than allowed; its slots go elsewhere"
            );
        }
        counter!("gaffer_manager_host_verdicts_total", "verdict" => verdict).increment(1);
    }
}

/// Hosts by state, as the manager sees them this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostCounts {
    /// Alive and taking slots.
    pub(crate) alive: usize,
    /// Alive and draining.
    pub(crate) draining: usize,
    /// Silent past the heartbeat timeout.
    pub(crate) dead: usize,
}

impl HostCounts {
    /// Counts `hosts` by state.
    pub(crate) fn of(hosts: &BTreeMap<String, HostState>) -> Self {
        HostCounts {
            alive: hosts.values().filter(|h| h.alive && !h.draining).count(),
            draining: hosts.values().filter(|h| h.alive && h.draining).count(),
            dead: hosts.values().filter(|h| !h.alive).count(),
        }
    }

    /// Sets the host gauges.
    pub(crate) fn emit(&self) {
        gauge!("gaffer_cluster_hosts", "state" => "alive").set(self.alive as f64);
        gauge!("gaffer_cluster_hosts", "state" => "draining").set(self.draining as f64);
        gauge!("gaffer_cluster_hosts", "state" => "dead").set(self.dead as f64);
    }
}

/// Every queue's backlog, lateness, counters, priority and the balancer's verdict.
pub(crate) fn queues(
    stats: &BTreeMap<String, QueueStats>,
    decisions: &BTreeMap<String, Decision>,
    config: &Config,
) {
    for (q, s) in stats {
        let l = || [("queue", q.clone())];
        gauge!("gaffer_queue_ready", &l()).set(s.ready as f64);
        gauge!("gaffer_queue_oldest_due_age_seconds", &l())
            .set(s.oldest_due_age_ms as f64 / 1000.0);
        // The config's priority, so alert rules can hold important queues to tighter
        // lateness bounds (dashboards/alerts.yml) without a label on every series.
        if let Some(c) = config.queues.get(q) {
            gauge!("gaffer_queue_priority", &l()).set(f64::from(c.priority));
        }
        gauge!("gaffer_queue_delayed", &l()).set(s.delayed as f64);
        gauge!("gaffer_queue_leased", &l()).set(s.leased as f64);
        gauge!("gaffer_queue_dead", &l()).set(s.dead as f64);
        // The queue's own monotonic counters, mirrored: rate() works across managers.
        counter!("gaffer_queue_enqueued_total", &l()).absolute(s.enqueued_total);
        counter!("gaffer_queue_acked_total", &l()).absolute(s.acked_total);
        counter!("gaffer_queue_retried_total", &l()).absolute(s.retried_total);
        counter!("gaffer_queue_dead_lettered_total", &l()).absolute(s.dead_total);
        counter!("gaffer_queue_stale_settles_total", &l()).absolute(s.stale_total);
        counter!("gaffer_queue_expired_leases_total", &l()).absolute(s.expired_total);
        if let Some(d) = decisions.get(q) {
            gauge!("gaffer_balancer_demand_slots", &l()).set(f64::from(d.demand));
            gauge!("gaffer_balancer_wanted_slots", &l()).set(f64::from(d.wanted));
            gauge!("gaffer_balancer_placed_slots", &l()).set(f64::from(d.placed));
            // No figure without slot lifetime in the window: 0 then, not a stale value.
            gauge!("gaffer_balancer_load", &l()).set(d.load.unwrap_or(0.0));
        }
    }
}
