//! How many slots each queue wants: demand from its statistics, then the hysteresis band
//! of its priority, then its limits.
//!
//! The details that matter: growth is measured on demand before it is rounded to whole
//! slots, so a queue near a whole number of slots has a dead zone; arrivals come from the
//! latest tick when it jumped clear of the window's average (a surge met within one tick,
//! the window guarding the way down); a backlog is drained within a horizon of its
//! priority, 5 s at the top, 5 min at the bottom; an ordered queue gets at most one slot.

use super::{Balancer, Decision, IndexedInput, QueueWindow, Reason};
use crate::config::QueueConfig;

/// Share of a slot's time the balancer plans to keep busy; the rest absorbs bursts.
pub const TARGET_UTILISATION: f64 = 0.8;
/// The highest priority of a cluster works a backlog off within about this many seconds…
pub const DRAIN_FASTEST_SECONDS: f64 = 5.0;
/// …and the lowest within about this many; priorities between lie on a geometric scale.
pub const DRAIN_SLOWEST_SECONDS: f64 = 300.0;
/// The latest tick's arrivals count as a surge only when they exceed what the window's
/// average predicts for the tick by this factor…
pub const SURGE_FACTOR: f64 = 2.0;
/// …and by this many standard deviations of a Poisson count, so that noise on a quiet
/// queue does not pass for a surge. (At 1.2 and 3, a queue of 5 tasks/s of 2 s saw a
/// false surge every ten minutes in the simulation, each moving a dozen slots there and
/// back: 898 slot changes in `steady` against 124.)
pub const SURGE_SIGMAS: f64 = 4.0;

/// The figures demand is computed from, for one queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadFigures {
    /// Mean handling time per task, seconds (None before anything was handled).
    pub mean_task_seconds: Option<f64>,
    /// Slots the queue needs: slot-seconds of work per second with headroom for bursts
    /// (at `TARGET_UTILISATION`), backlog included, and at least one per batch in flight.
    pub demand_slots: f64,
    /// (busy + backlog × mean task time) / slot lifetime.
    pub load: Option<f64>,
}

/// The arrival rate (tasks per second) demand plans for: the latest tick's when it jumped
/// clear of the window's average, so a surge is met within one tick; the window's average
/// otherwise, so on the way down the window still guards against flapping.
pub fn arrival_rate(w: &QueueWindow) -> f64 {
    let average = w.arrived as f64 / w.window_seconds.max(1e-9);
    if w.recent_seconds <= 0.0 {
        return average;
    }
    let expected = average * w.recent_seconds;
    let seen = w.recent_arrived as f64;
    let surge =
        seen > expected * SURGE_FACTOR && seen > expected + SURGE_SIGMAS * expected.max(1.0).sqrt();
    if surge {
        seen / w.recent_seconds
    } else {
        average
    }
}

/// Seconds a queue of priority rank `rank` (0 = lowest of the cluster, 1 = highest) gives
/// its backlog to drain: seconds at the top, minutes at the bottom.
pub fn drain_seconds(rank: f64) -> f64 {
    let rank = rank.clamp(0.0, 1.0);
    DRAIN_FASTEST_SECONDS * (DRAIN_SLOWEST_SECONDS / DRAIN_FASTEST_SECONDS).powf(1.0 - rank)
}

/// Demand and load of a queue from its window, its backlog drained within
/// `drain_seconds` (see [`drain_seconds`]).
pub fn load_figures(q: &QueueConfig, w: &QueueWindow, drain_seconds: f64) -> LoadFigures {
    let mean = (w.processed > 0).then(|| w.busy_seconds / w.processed as f64);
    let backlog = (w.ready + w.leased) as f64;
    let window = w.window_seconds.max(1e-9);
    let demand_slots = match mean {
        Some(mean) => {
            let arrivals = arrival_rate(w) * mean;
            let busy = w.busy_seconds / window;
            // A leased batch holds a slot whatever the averages say. It needs that slot,
            // not headroom on top: dividing it by the target utilisation made one batch in
            // flight ask for two slots, and a queue of fast tasks flapped between one and
            // two as batches came and went.
            let in_flight = (w.leased as f64 / f64::from(q.batch_size.max(1))).ceil();
            (arrivals.max(busy) / TARGET_UTILISATION).max(in_flight)
                + w.ready as f64 * mean / drain_seconds.max(1e-9) / TARGET_UTILISATION
        }
        // Nothing handled yet: one slot per waiting batch is all we can say; the next
        // windows will know the task time.
        None => (backlog / f64::from(q.batch_size.max(1))).ceil(),
    };
    let load = (w.slot_lifetime_seconds > 0.0)
        .then(|| (w.busy_seconds + backlog * mean.unwrap_or(0.0)) / w.slot_lifetime_seconds);
    LoadFigures {
        mean_task_seconds: mean,
        demand_slots,
        load,
    }
}

/// A long queue's demand: a slot per task waiting or running, whatever rates say (its
/// tasks run until they return or are cancelled).
fn long_demand(w: &QueueWindow) -> f64 {
    (w.ready + w.leased) as f64
}

/// The hysteresis band of a priority rank (0 = lowest priority of the cluster, 1 =
/// highest): (grow when demand exceeds current by this share, shrink when it is below
/// by this share). High priority grows eagerly and shrinks reluctantly.
pub fn band(rank: f64) -> (f64, f64) {
    (0.25 * (1.0 - rank), 0.2 + 0.4 * rank)
}

/// Per queue: demand, hysteresis, min/max, work periods and pauses, into the
/// balancer's decisions. System caps are applied when capacity is granted, so a queue
/// that cannot be placed leaves its share to the others.
pub(super) fn wanted(b: &mut Balancer, input: &IndexedInput) {
    let nh = b.host_count();
    let (weekday, minute) = b.config.local_minute(input.now);
    let usable = &b.hosts.usable;
    for (qi, (info, d)) in b.queues.iter().zip(&mut b.decisions).enumerate() {
        let q = info.config;
        let w = &input.stats[qi];
        // Slots on dead or draining hosts are gone or going: they do not count as running.
        let cur: u32 = input.current[qi * nh..(qi + 1) * nh]
            .iter()
            .zip(usable)
            .filter(|(_, u)| **u)
            .map(|(n, _)| *n)
            .sum();
        let figures = load_figures(q, w, info.drain_seconds);
        let demand = if q.is_long() {
            long_demand(w)
        } else {
            (figures.demand_slots - 1e-9).ceil().max(0.0)
        };
        let demand = if demand > f64::from(u32::MAX) {
            u32::MAX
        } else {
            demand as u32
        };
        let working = b.config.queue_works_at(q, weekday, minute);
        // A long queue's running tasks hold their slots (those that still stand: on a
        // usable host that runs the handler, as placing keeps them): granted before
        // anything else. Tasks of a dead host have none; they grow like any.
        b.floor[qi] = if q.is_long() {
            let runs = &b.hosts.can[info.handler * nh..(info.handler + 1) * nh];
            let standing: u32 = input.current[qi * nh..(qi + 1) * nh]
                .iter()
                .zip(usable)
                .zip(runs)
                .filter(|((_, u), r)| **u && **r)
                .map(|((n, _), _)| *n)
                .sum();
            u32::try_from(w.leased)
                .unwrap_or(u32::MAX)
                .min(standing)
                .min(q.max_slots)
        } else {
            0
        };
        let mut reasons = std::mem::take(&mut d.reasons);
        reasons.clear();
        let wanted = if input.paused[qi] {
            reasons.push(Reason::Paused);
            0
        } else if let Some(sys) = info.system.filter(|s| s.paused) {
            reasons.push(Reason::SystemPaused {
                system: sys.name.clone(),
            });
            0
        } else if !working {
            reasons.push(Reason::OutsideWorkPeriod);
            0
        } else {
            let (up, down) = if q.is_long() {
                // One slot per task, no more and no less: a long task's slot is never
                // idle surplus, and a waiting one has nothing to wait for.
                (0.0, 0.0)
            } else {
                info.band
            };
            // The band to grow is measured on demand before it is rounded up to whole
            // slots: rounded, a queue near one slot grew as soon as demand passed 1.0
            // and shrank as soon as it fell back (no dead zone at all), and window
            // noise moved a slot each way every few ticks.
            let unrounded = if q.is_long() {
                f64::from(demand)
            } else {
                figures.demand_slots
            };
            let held = if demand > cur {
                if cur == 0 || unrounded > f64::from(cur) * (1.0 + up) {
                    reasons.push(Reason::Grow);
                    demand
                } else {
                    reasons.push(Reason::HysteresisHold);
                    cur
                }
            } else if demand < cur {
                if f64::from(demand) < f64::from(cur) * (1.0 - down)
                    || demand == 0 && w.ready + w.leased == 0 && w.arrived == 0
                {
                    reasons.push(Reason::Shrink);
                    demand
                } else {
                    reasons.push(Reason::HysteresisHold);
                    cur
                }
            } else {
                cur
            };
            let (min, max) = slot_bounds(q);
            if held < min {
                reasons.push(Reason::AtMin);
                min
            } else if held > max {
                reasons.push(Reason::AtMax);
                max
            } else {
                held
            }
        };
        *d = Decision {
            current: cur,
            demand,
            wanted,
            placed: 0,
            load: figures.load,
            reasons,
        };
    }
}

/// A queue's min and max slots: an ordered queue runs one task at a time, so it gets at
/// most one slot whatever its config says.
fn slot_bounds(q: &crate::config::QueueConfig) -> (u32, u32) {
    if q.ordered {
        (q.min_slots.min(1), q.max_slots.min(1))
    } else {
        (q.min_slots, q.max_slots)
    }
}
