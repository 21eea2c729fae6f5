//! How many slots each queue wants: demand from its statistics, then the hysteresis band
//! of its priority, then its limits.

use std::collections::BTreeMap;

use chrono::{Datelike, Timelike};

use super::{Decision, Input, QueueWindow, Reason};
use crate::config::QueueConfig;

/// Share of a slot's time the balancer plans to keep busy; the rest absorbs bursts.
pub const TARGET_UTILISATION: f64 = 0.8;
/// A backlog should be worked off within about this many seconds.
pub const DRAIN_SECONDS: f64 = 60.0;

/// The figures demand is computed from, for one queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadFigures {
    /// Mean handling time per task, seconds (None before anything was handled).
    pub mean_task_seconds: Option<f64>,
    /// Slot-seconds of work the queue needs per second, backlog included.
    pub demand_slots: f64,
    /// (busy + backlog × mean task time) / slot lifetime.
    pub load: Option<f64>,
}

/// Demand and load of a queue from its window.
pub fn load_figures(q: &QueueConfig, w: &QueueWindow) -> LoadFigures {
    let mean = (w.processed > 0).then(|| w.busy_seconds / w.processed as f64);
    let backlog = (w.ready + w.leased) as f64;
    let window = w.window_seconds.max(1e-9);
    let demand_slots = match mean {
        Some(mean) => {
            let arrivals = w.arrived as f64 / window * mean;
            let busy = w.busy_seconds / window;
            // A leased batch holds a slot whatever the averages say.
            let in_flight = (w.leased as f64 / f64::from(q.batch_size.max(1))).ceil();
            arrivals.max(busy).max(in_flight) + w.ready as f64 * mean / DRAIN_SECONDS
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

/// The hysteresis band of a priority rank (0 = lowest priority of the cluster, 1 =
/// highest): (grow when demand exceeds current by this share, shrink when it is below
/// by this share). High priority grows eagerly and shrinks reluctantly.
pub fn band(rank: f64) -> (f64, f64) {
    (0.25 * (1.0 - rank), 0.2 + 0.4 * rank)
}

/// Per queue: demand, hysteresis, min/max, work periods and pauses. System caps are
/// applied when capacity is granted, so a queue that cannot be placed leaves its share
/// to the others.
pub fn wanted(input: &Input) -> BTreeMap<String, Decision> {
    let config = input.config;
    // Slots on dead or draining hosts are gone or going: they do not count as running.
    let mut current: BTreeMap<&str, u32> = BTreeMap::new();
    for (h, qs) in input.current {
        if input.hosts.get(h).is_some_and(|h| h.usable()) {
            for (q, &n) in qs {
                *current.entry(q.as_str()).or_default() += n;
            }
        }
    }
    let local = input.now.with_timezone(&config.manager.timezone);
    let (weekday, minute) = (local.weekday(), (local.hour() * 60 + local.minute()) as u16);

    let mut priorities: Vec<i32> = config.queues.values().map(|q| q.priority).collect();
    priorities.sort_unstable();
    priorities.dedup();
    let rank = |p: i32| -> f64 {
        if priorities.len() < 2 {
            return 0.5;
        }
        let i = priorities.iter().position(|&x| x == p).unwrap_or(0);
        i as f64 / (priorities.len() - 1) as f64
    };

    let idle = QueueWindow::default();
    let mut out = BTreeMap::new();
    for (name, q) in &config.queues {
        let w = input.stats.get(name).unwrap_or(&idle);
        let cur = current.get(name.as_str()).copied().unwrap_or(0);
        let figures = load_figures(q, w);
        let demand = (figures.demand_slots / TARGET_UTILISATION - 1e-9)
            .ceil()
            .max(0.0);
        let demand = if demand > f64::from(u32::MAX) {
            u32::MAX
        } else {
            demand as u32
        };
        let mut reasons = Vec::new();
        let system = q.system.as_ref().and_then(|s| config.systems.get(s));
        let wanted = if input.paused.contains(name) {
            reasons.push(Reason::Paused);
            0
        } else if let Some(sys) = system.filter(|s| s.paused) {
            reasons.push(Reason::SystemPaused {
                system: sys.name.clone(),
            });
            0
        } else if !q.is_working_at(weekday, minute) {
            reasons.push(Reason::OutsideWorkPeriod);
            0
        } else {
            let (up, down) = band(rank(q.priority));
            let held = if demand > cur {
                if cur == 0 || f64::from(demand) > f64::from(cur) * (1.0 + up) {
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
            if held < q.min_slots {
                reasons.push(Reason::AtMin);
                q.min_slots
            } else if held > q.max_slots {
                reasons.push(Reason::AtMax);
                q.max_slots
            } else {
                held
            }
        };
        out.insert(
            name.clone(),
            Decision {
                current: cur,
                demand,
                wanted,
                placed: 0,
                load: figures.load,
                reasons,
            },
        );
    }

    out
}
