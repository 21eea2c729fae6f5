//! The manager's typed events: each logs and counts in one place. The manager is also
//! where cluster-wide queue figures are exported (it reads them every tick anyway), so a
//! Prometheus scrape of the active manager shows every queue's backlog and decision.
//! Labels are bounded: queue names, host states and fixed outcomes.

use std::collections::BTreeMap;
use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::balancer::Decision;
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
    gauge!("gaffer_manager_map_version").set(0.0);
    gauge!("gaffer_cluster_slots_mapped").set(0.0);
}

pub(crate) fn leadership(id: &str, leading: bool, epoch: u64) {
    tracing::info!(id, leading, epoch, "leadership changed");
    counter!("gaffer_manager_leadership_changes_total").increment(1);
    gauge!("gaffer_manager_leader").set(if leading { 1.0 } else { 0.0 });
    gauge!("gaffer_manager_epoch").set(epoch as f64);
}

pub(crate) fn tick_done(took: Duration) {
    counter!("gaffer_manager_ticks_total").increment(1);
    histogram!("gaffer_manager_tick_seconds").record(took.as_secs_f64());
}

pub(crate) fn tick_failed(what: &'static str, error: &anyhow::Error) {
    tracing::warn!(what, error = %format!("{error:#}"), "tick failed");
    counter!("gaffer_manager_tick_errors_total", "step" => what).increment(1);
}

pub(crate) fn map_written(version: u64, epoch: u64, slots: u32) {
    tracing::info!(version, epoch, slots, "published a new slot map");
    counter!("gaffer_manager_map_writes_total").increment(1);
    gauge!("gaffer_manager_map_version").set(version as f64);
    gauge!("gaffer_cluster_slots_mapped").set(f64::from(slots));
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

pub(crate) fn schedule_fired(queue: &str, cron: &str, fire_ms: i64, id: &str) {
    tracing::info!(queue, cron, fire_ms, id, "schedule fired");
    counter!("gaffer_schedule_fires_total", "queue" => queue.to_owned()).increment(1);
}

/// Hosts by state, as the manager sees them this tick.
pub(crate) fn hosts(alive: usize, draining: usize, dead: usize) {
    gauge!("gaffer_cluster_hosts", "state" => "alive").set(alive as f64);
    gauge!("gaffer_cluster_hosts", "state" => "draining").set(draining as f64);
    gauge!("gaffer_cluster_hosts", "state" => "dead").set(dead as f64);
}

/// Every queue's backlog, counters and the balancer's verdict.
pub(crate) fn queues(stats: &BTreeMap<String, QueueStats>, decisions: &BTreeMap<String, Decision>) {
    for (q, s) in stats {
        let l = || [("queue", q.clone())];
        gauge!("gaffer_queue_ready", &l()).set(s.ready as f64);
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
