//! Pure slot decisions: (config, queue statistics, current map, hosts, time) → new map,
//! with a record of why for every queue.
//!
//! No I/O, no clock, no randomness: the same [`Input`] always gives the same [`Output`].
//! The manager, the simulator and the property tests all stand on that.
//!
//! The steps, each a function below:
//! 1. [`wanted`]: per queue, demand from the window's statistics, the hysteresis band of
//!    its priority, min/max, work periods and pauses;
//! 2. system caps: queues sharing an external system share its `max_concurrency`;
//! 3. [`grant`]: under scarcity, minimums first in priority order, then the rest by
//!    priority;
//! 4. [`place`]: the new map built from the current one, so slots keep their type; a
//!    type's slots spread over hosts; dead and draining hosts and hosts without the
//!    handler get none; no host above its capacity.

mod place;
mod want;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::config::Config;

pub use place::place;
pub use want::{LoadFigures, load_figures, wanted};

/// Slots per host and queue: host → queue → slots.
pub type Placement = BTreeMap<String, BTreeMap<String, u32>>;

/// A queue's statistics over the manager's window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueueWindow {
    /// Length of the window in seconds.
    pub window_seconds: f64,
    /// Tasks ready and due now.
    pub ready: u64,
    /// Tasks leased now: work in flight, which queue length alone hides.
    pub leased: u64,
    /// Tasks enqueued during the window.
    pub arrived: u64,
    /// Tasks handled during the window.
    pub processed: u64,
    /// Seconds slots spent inside handlers during the window.
    pub busy_seconds: f64,
    /// Seconds slots of this queue lived during the window.
    pub slot_lifetime_seconds: f64,
}

/// What the balancer knows of a host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostState {
    /// Slots the host can hold.
    pub capacity: u32,
    /// Handler names the host can run.
    pub handlers: BTreeSet<String>,
    /// Heartbeat within the timeout.
    pub alive: bool,
    /// Stopping: gets no slots.
    pub draining: bool,
}

impl HostState {
    /// Whether the host may receive slots at all.
    pub fn usable(&self) -> bool {
        self.alive && !self.draining
    }
}

/// Everything a decision depends on.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// Queues, systems, the time zone.
    pub config: &'a Config,
    /// Per queue; a queue without statistics counts as idle.
    pub stats: &'a BTreeMap<String, QueueWindow>,
    /// The map in force.
    pub current: &'a Placement,
    /// Every known host, dead ones included.
    pub hosts: &'a BTreeMap<String, HostState>,
    /// Now, for work periods (read in the config's time zone).
    pub now: chrono::DateTime<chrono::Utc>,
    /// Queues an operator paused.
    pub paused: &'a BTreeSet<String>,
}

/// Why a queue got the slots it got.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum Reason {
    /// Demand moved, but less than the queue's hysteresis band: no change.
    HysteresisHold,
    /// Demand above the current slots by more than the band.
    Grow,
    /// Demand below the current slots by more than the band.
    Shrink,
    /// Raised to `min_slots`.
    AtMin,
    /// Held at `max_slots`.
    AtMax,
    /// Its external system's `max_concurrency` is shared by its queues.
    CappedBySystem {
        /// The system.
        system: String,
    },
    /// The cluster lacks capacity for all of it; lower priorities give first.
    Scarcity {
        /// Slots wanted but not granted.
        short: u32,
    },
    /// Outside every one of its work periods.
    OutsideWorkPeriod,
    /// Paused by an operator.
    Paused,
    /// Its external system is paused.
    SystemPaused {
        /// The system.
        system: String,
    },
    /// No live host runs its handler.
    NoHostCanRun,
    /// Held above demand by hysteresis, but given back because other queues are short.
    Released,
    /// Granted, but the hosts that run its handler are full.
    Unplaced {
        /// Slots granted but not placed.
        short: u32,
    },
}

/// The balancer's verdict on one queue.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Slots in the current map.
    pub current: u32,
    /// Slots the statistics ask for, before hysteresis and limits.
    pub demand: u32,
    /// After hysteresis, min/max, work periods, pauses and system caps.
    pub wanted: u32,
    /// In the new map (less than `wanted` under scarcity).
    pub placed: u32,
    /// (busy + backlog × mean task time) / slot lifetime; over 1 means demand exceeds
    /// slots. None without slot lifetime in the window.
    pub load: Option<f64>,
    /// Why, in order of application.
    pub reasons: Vec<Reason>,
}

/// The new map and the reasons for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Output {
    /// Host → queue → slots; hosts and queues with zero slots are left out.
    pub map: Placement,
    /// Per queue of the config.
    pub decisions: BTreeMap<String, Decision>,
}

/// One balancer decision.
pub fn decide(input: &Input) -> Output {
    let mut decisions = wanted(input);
    let targets = grant(input, &mut decisions);
    let map = place(input, &targets);
    let placed = totals(&map);
    for (q, d) in &mut decisions {
        d.placed = placed.get(q).copied().unwrap_or(0);
        if d.placed < targets.get(q).copied().unwrap_or(0) {
            let short = targets[q] - d.placed;
            d.reasons.push(Reason::Unplaced { short });
        }
    }
    Output { map, decisions }
}

/// Places slots for wanted counts decided by some other rule (the simulator's `hpa` and
/// `static` policies), with the same scarcity order and placement as [`decide`], so the
/// rules compare on how many slots they want alone.
pub fn place_wanted(input: &Input, wanted: &BTreeMap<String, u32>) -> Placement {
    let current = totals(input.current);
    let mut decisions: BTreeMap<String, Decision> = input
        .config
        .queues
        .iter()
        .map(|(q, c)| {
            let w = wanted.get(q).copied().unwrap_or(0).min(c.max_slots);
            let d = Decision {
                current: current.get(q).copied().unwrap_or(0),
                demand: w,
                wanted: w,
                placed: 0,
                load: None,
                reasons: Vec::new(),
            };
            (q.clone(), d)
        })
        .collect();
    let targets = grant(input, &mut decisions);
    place(input, &targets)
}

/// Slots currently placed for each queue.
pub fn totals(map: &Placement) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for queues in map.values() {
        for (q, &n) in queues {
            *out.entry(q.clone()).or_default() += n;
        }
    }
    out
}

/// Queues in scarcity order: priority high to low, then name.
fn by_priority(config: &Config) -> Vec<&str> {
    let mut qs: Vec<&str> = config.queues.keys().map(String::as_str).collect();
    qs.sort_by_key(|q| (std::cmp::Reverse(config.queues[*q].priority), *q));
    qs
}

/// Grants every queue its wanted slots if the usable hosts can hold them all; otherwise
/// minimums first in priority order, then the rest by priority. Returns the targets.
pub fn grant(input: &Input, decisions: &mut BTreeMap<String, Decision>) -> BTreeMap<String, u32> {
    let config = input.config;
    // Per handler, the usable hosts that run it (as indices into `hosts_by_use`).
    let mut hosts_by_use: Vec<&str> = input
        .hosts
        .iter()
        .filter(|(_, h)| h.usable())
        .map(|(n, _)| n.as_str())
        .collect();
    // Specialised hosts (fewest handlers) first: general ones stay free for the queues
    // that need them.
    hosts_by_use.sort_by_key(|h| (input.hosts[*h].handlers.len(), *h));
    let mut free: Vec<u32> = hosts_by_use
        .iter()
        .map(|h| input.hosts[*h].capacity)
        .collect();
    let mut runs: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for q in config.queues.values() {
        let handler = q.handler.name();
        runs.entry(handler).or_insert_with(|| {
            (0..hosts_by_use.len())
                .filter(|&i| input.hosts[hosts_by_use[i]].handlers.contains(handler))
                .collect()
        });
    }
    let runnable: BTreeMap<&str, u64> = runs
        .iter()
        .map(|(handler, hosts)| (*handler, hosts.iter().map(|&i| u64::from(free[i])).sum()))
        .collect();
    let runnable = |q: &str| runnable[config.queues[q].handler.name()];
    let pool: u64 = input
        .hosts
        .values()
        .filter(|h| h.usable())
        .map(|h| u64::from(h.capacity))
        .sum();
    let order = by_priority(config);
    let mut targets: BTreeMap<String, u32> = BTreeMap::new();
    for q in &order {
        let d = decisions.get_mut(*q).expect("a decision per queue");
        if d.wanted > 0 && runnable(q) == 0 {
            d.reasons.push(Reason::NoHostCanRun);
            d.wanted = 0;
        }
        targets.insert((*q).to_string(), 0);
    }
    // Hysteresis must not hold idle slots while other queues are short of capacity:
    // under scarcity, a queue held above its demand falls back to it.
    let total_wanted: u64 = decisions.values().map(|d| u64::from(d.wanted)).sum();
    if total_wanted > pool {
        for (q, d) in decisions.iter_mut() {
            let c = &config.queues[q];
            let floor = d.demand.clamp(c.min_slots, c.max_slots);
            if d.reasons.contains(&Reason::HysteresisHold) && d.wanted > floor {
                d.wanted = floor;
                d.reasons.push(Reason::Released);
            }
        }
    }
    // A queue is granted only room that hosts running its handler still have.
    // Queues sharing an external system share its concurrency, in the same order.
    let mut system_left: BTreeMap<&str, u32> = config
        .systems
        .iter()
        .filter_map(|(name, s)| s.max_concurrency.map(|c| (name.as_str(), c)))
        .collect();
    let mut capped: BTreeSet<&str> = BTreeSet::new();
    // Per queue in scarcity order, everything the passes read, so they do no lookups
    // by name (a simulated day makes tens of thousands of decisions).
    let plan: Vec<(u32, u32, &[usize], Option<&str>)> = order
        .iter()
        .map(|q| {
            let c = &config.queues[*q];
            (
                decisions[*q].wanted,
                c.min_slots,
                runs[c.handler.name()].as_slice(),
                c.system.as_deref(),
            )
        })
        .collect();
    let mut granted = vec![0u32; order.len()];
    for pass_min in [true, false] {
        for (k, &(wanted, min, eligible, system)) in plan.iter().enumerate() {
            let goal = if pass_min { wanted.min(min) } else { wanted };
            let t = &mut granted[k];
            let room: u64 = eligible.iter().map(|&i| u64::from(free[i])).sum();
            let mut add = u64::from(goal.saturating_sub(*t)).min(room) as u32;
            if let Some(left) = system.and_then(|s| system_left.get_mut(s)) {
                if *left < add {
                    capped.insert(order[k]);
                    add = *left;
                }
                *left -= add;
            }
            *t += add;
            let mut need = add;
            for &i in eligible {
                if need == 0 {
                    break;
                }
                let take = free[i].min(need);
                free[i] -= take;
                need -= take;
            }
        }
    }
    for (k, q) in order.iter().enumerate() {
        *targets.get_mut(*q).expect("inserted above") = granted[k];
    }
    for (q, d) in decisions.iter_mut() {
        let t = targets[q];
        if capped.contains(q.as_str()) {
            // The system's share is a limit like max_slots: what the queue may want.
            let system = config.queues[q].system.clone().unwrap_or_default();
            d.reasons.push(Reason::CappedBySystem { system });
            d.wanted = t;
        }
        if t < d.wanted {
            d.reasons.push(Reason::Scarcity {
                short: d.wanted - t,
            });
        }
    }
    targets
}
