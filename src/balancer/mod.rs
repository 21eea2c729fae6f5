//! Pure slot decisions: (config, queue statistics, current map, hosts, time) → new map,
//! with a record of why for every queue.
//!
//! No I/O, no clock, no randomness: the same [`Input`] always gives the same [`Output`].
//! The manager, the simulator and the property tests all stand on that.
//!
//! The steps:
//! 1. `want::wanted`: per queue, demand from the window's statistics, the hysteresis band
//!    of its priority, min/max, work periods and pauses;
//! 2. system caps: queues sharing an external system share its `max_concurrency`;
//! 3. `Balancer::grant`: under scarcity, long queues' running tasks first (a busy long
//!    slot is never taken for another queue), then minimums in priority order, then the
//!    rest by priority;
//! 4. `place::place`: the new map built from the current one, so slots keep their type; a
//!    type's slots spread over hosts; dead and draining hosts and hosts without the
//!    handler get none; no host above its capacity.
//!
//! They run on indices: queues in the config's (name) order, hosts in name order, maps as
//! dense queue × host counts. Names are looked up only where an [`Input`] comes in and an
//! [`Output`] goes out; [`decide`] does both around one decision, and a [`Balancer`] keeps
//! the tables between decisions for a caller that makes many (the simulator).
//!
//! Under scarcity, hysteresis holds are released from the lowest priority up, only as far
//! as needed. `tests.rs` holds the snapshot cases and the proptests (the invariants on any
//! input, and a decided map that is stable).

mod place;
mod want;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, DefaultHasher};

use serde::Serialize;

use crate::config::{Config, QueueConfig, SystemConfig};

pub use want::{LoadFigures, arrival_rate, drain_seconds, load_figures};

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
    /// Length of the latest tick (the window's last interval), seconds; 0 when unknown.
    pub recent_seconds: f64,
    /// Tasks enqueued during the latest tick: a surge shows here a window before the
    /// average catches up.
    pub recent_arrived: u64,
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

/// One decision's input in index form, for [`Balancer::decide`]: queues in the config's
/// (name) order, hosts in the order given to [`Balancer::set_hosts`].
#[derive(Debug, Clone, Copy)]
pub struct IndexedInput<'a> {
    /// Per queue; an idle queue has a default window.
    pub stats: &'a [QueueWindow],
    /// The map in force: slots of queue `q` on host `h` at `q * hosts + h`.
    pub current: &'a [u32],
    /// Now, for work periods (read in the config's time zone).
    pub now: chrono::DateTime<chrono::Utc>,
    /// Per queue: paused by an operator.
    pub paused: &'a [bool],
}

/// The balancer's tables for one config, kept between decisions.
///
/// [`decide`] builds one for each call. A caller that decides often on one config (the
/// simulator: 43,200 decisions in a simulated day) keeps one instead, so names are
/// looked up once and each decision runs on indices in buffers it reuses. The new map
/// stays in index form ([`Balancer::map`]) until someone asks for names.
#[derive(Debug)]
pub struct Balancer<'c> {
    config: &'c Config,
    /// The config's queue names, in its order.
    names: Vec<&'c str>,
    /// Per queue, in the config's order.
    queues: Vec<QueueInfo<'c>>,
    /// Queue indices in scarcity order: priority high to low, then name.
    order: Vec<usize>,
    /// Distinct handlers of the config's queues.
    handlers: usize,
    /// `max_concurrency` of each system that has one.
    caps: Vec<u32>,
    hosts: HostTables,
    decisions: Vec<Decision>,
    targets: Vec<u32>,
    placed: Vec<u32>,
    /// Per queue, slots granted and placed before any queue's growth, like `min_slots`:
    /// a long queue's running tasks on the slots it has (held until the tasks end).
    floor: Vec<u32>,
    /// The new map, queue-major like [`IndexedInput::current`].
    map: Vec<u32>,
    scratch: Scratch,
}

/// What the steps read of a queue's config, resolved to indices once.
#[derive(Debug)]
struct QueueInfo<'c> {
    config: &'c QueueConfig,
    handler: usize,
    /// Its external system, if the config has it.
    system: Option<&'c SystemConfig>,
    /// Into `Balancer::caps`.
    cap: Option<usize>,
    /// The hysteresis band of its priority.
    band: (f64, f64),
    /// Seconds its priority gives a backlog to drain.
    drain_seconds: f64,
}

/// The hosts of the index form, from [`Balancer::set_hosts`].
#[derive(Debug, Default)]
struct HostTables {
    capacity: Vec<u32>,
    usable: Vec<bool>,
    /// `can[k * hosts + h]`: host `h` is usable and runs handler `k`.
    can: Vec<bool>,
    /// Usable hosts, specialised (fewest handlers) first, then by name: general ones stay
    /// free for the queues that need them.
    by_use: Vec<usize>,
    /// Per handler, the positions in `by_use` of the hosts that run it.
    eligible: Vec<Vec<usize>>,
}

/// Buffers reused between decisions.
#[derive(Debug, Default)]
struct Scratch {
    free: Vec<u32>,
    room: Vec<u64>,
    cursor: Vec<usize>,
    left: Vec<u32>,
    capped: Vec<bool>,
    used: Vec<u32>,
    shed: Vec<usize>,
    surplus: Vec<(u32, std::cmp::Reverse<usize>)>,
    growth: Vec<(u32, u64)>,
}

impl<'c> Balancer<'c> {
    /// Tables for `config`, with no hosts yet.
    pub fn new(config: &'c Config) -> Self {
        let mut handler_ix: BTreeMap<&str, usize> = BTreeMap::new();
        for q in config.queues.values() {
            let next = handler_ix.len();
            handler_ix.entry(q.handler.name()).or_insert(next);
        }
        let capped: Vec<(&str, u32)> = config
            .systems
            .iter()
            .filter_map(|(name, s)| s.max_concurrency.map(|c| (name.as_str(), c)))
            .collect();
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
        let queues: Vec<QueueInfo> = config
            .queues
            .values()
            .map(|q| QueueInfo {
                config: q,
                handler: handler_ix[q.handler.name()],
                system: q.system.as_ref().and_then(|s| config.systems.get(s)),
                cap: q
                    .system
                    .as_deref()
                    .and_then(|s| capped.iter().position(|(name, _)| *name == s)),
                band: want::band(rank(q.priority)),
                drain_seconds: want::drain_seconds(rank(q.priority)),
            })
            .collect();
        let mut order: Vec<usize> = (0..queues.len()).collect();
        order.sort_by_key(|&q| (std::cmp::Reverse(queues[q].config.priority), q));
        let decisions = queues
            .iter()
            .map(|_| Decision {
                current: 0,
                demand: 0,
                wanted: 0,
                placed: 0,
                load: None,
                reasons: Vec::new(),
            })
            .collect();
        Balancer {
            config,
            names: config.queues.keys().map(String::as_str).collect(),
            order,
            handlers: handler_ix.len(),
            caps: capped.iter().map(|c| c.1).collect(),
            hosts: HostTables::default(),
            decisions,
            targets: vec![0; queues.len()],
            placed: vec![0; queues.len()],
            floor: vec![0; queues.len()],
            map: Vec::new(),
            scratch: Scratch::default(),
            queues,
        }
    }

    /// Sets the hosts every later decision sees, in the order of the index form; ties
    /// between hosts break by that order, so give them sorted by name to match
    /// [`decide`].
    pub fn set_hosts<'h>(&mut self, hosts: impl IntoIterator<Item = &'h HostState>) {
        let hosts: Vec<&HostState> = hosts.into_iter().collect();
        let t = &mut self.hosts;
        let nh = hosts.len();
        // Placement packs a host index into 32 bits.
        assert!(u32::try_from(nh).is_ok(), "at most 2^32 - 1 hosts");
        t.capacity.clear();
        t.capacity.extend(hosts.iter().map(|h| h.capacity));
        t.usable.clear();
        t.usable.extend(hosts.iter().map(|h| h.usable()));
        let mut handler_names = vec![""; self.handlers];
        for q in &self.queues {
            handler_names[q.handler] = q.config.handler.name();
        }
        t.can.clear();
        for handler in &handler_names {
            t.can.extend(
                hosts
                    .iter()
                    .map(|h| h.usable() && h.handlers.contains(*handler)),
            );
        }
        t.by_use.clear();
        t.by_use.extend((0..nh).filter(|&h| t.usable[h]));
        t.by_use.sort_by_key(|&h| (hosts[h].handlers.len(), h));
        t.eligible.resize_with(self.handlers, Vec::new);
        for (k, eligible) in t.eligible.iter_mut().enumerate() {
            eligible.clear();
            eligible.extend((0..t.by_use.len()).filter(|&i| t.can[k * nh + t.by_use[i]]));
        }
    }

    /// The number of hosts set.
    pub fn host_count(&self) -> usize {
        self.hosts.capacity.len()
    }

    /// One decision, as [`decide`] makes it; the result is in [`Balancer::map`] and
    /// [`Balancer::decisions`].
    pub fn decide(&mut self, input: &IndexedInput) {
        self.check_map(input.current);
        want::wanted(self, input);
        self.grant();
        place::place(self, input.current);
        self.finish();
    }

    /// Places `wanted` slots per queue (in the config's order) from `current`, as
    /// [`place_wanted`] does; the result is in [`Balancer::map`].
    pub fn place_wanted(&mut self, current: &[u32], wanted: &[u32]) {
        self.check_map(current);
        let nh = self.host_count();
        self.floor.iter_mut().for_each(|f| *f = 0);
        for (q, d) in self.decisions.iter_mut().enumerate() {
            let w = wanted[q].min(self.queues[q].config.max_slots);
            d.current = current[q * nh..(q + 1) * nh].iter().sum();
            d.demand = w;
            d.wanted = w;
            d.placed = 0;
            d.load = None;
            d.reasons.clear();
        }
        self.grant();
        place::place(self, current);
        self.finish();
    }

    /// The new map of the last decision: slots of queue `q` on host `h` at
    /// `q * hosts + h`.
    pub fn map(&self) -> &[u32] {
        &self.map
    }

    /// The verdicts of the last decision, per queue in the config's order.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// `map` in index form, for the hosts set from `hosts`; hosts and queues the tables
    /// do not know are left out.
    fn index_map(&self, hosts: &BTreeMap<String, HostState>, map: &Placement) -> Vec<u32> {
        let (nh, nq) = (self.host_count(), self.names.len());
        let mut out = vec![0; nq * nh];
        // A hash per entry rather than a dozen string comparisons down a tree: a map at
        // the target scale (BENCHMARKS.md) has 100,000 entries. The hasher has fixed keys, and nothing
        // depends on the table's order.
        let index: HashMap<&str, usize, BuildHasherDefault<DefaultHasher>> = self
            .names
            .iter()
            .enumerate()
            .map(|(q, name)| (*name, q))
            .collect();
        // Hosts are sorted on both sides: a merge.
        let mut rows = map.iter().peekable();
        for (h, name) in hosts.keys().enumerate() {
            while rows.next_if(|(n, _)| *n < name).is_some() {}
            let Some((_, queues)) = rows.next_if(|(n, _)| *n == name) else {
                continue;
            };
            for (queue, &n) in queues {
                if let Some(&q) = index.get(queue.as_str()) {
                    out[q * nh + h] = n;
                }
            }
        }
        out
    }

    /// The last decision's map by name, for the hosts set from `hosts`; hosts and queues
    /// with zero slots are left out.
    fn placement(&self, hosts: &BTreeMap<String, HostState>) -> Placement {
        let nh = self.host_count();
        let mut rows: Vec<Vec<(String, u32)>> = vec![Vec::new(); nh];
        for (q, name) in self.names.iter().enumerate() {
            for (h, &n) in self.map[q * nh..(q + 1) * nh].iter().enumerate() {
                if n > 0 {
                    rows[h].push(((*name).to_string(), n));
                }
            }
        }
        hosts
            .keys()
            .zip(rows)
            .filter(|(_, row)| !row.is_empty())
            .map(|(host, row)| (host.clone(), row.into_iter().collect()))
            .collect()
    }

    fn check_map(&self, map: &[u32]) {
        assert_eq!(
            map.len(),
            self.names.len() * self.host_count(),
            "a map in index form has a count per queue and host"
        );
    }

    /// Records what was placed, and why less than granted.
    fn finish(&mut self) {
        for (q, d) in self.decisions.iter_mut().enumerate() {
            d.placed = self.placed[q];
            if d.placed < self.targets[q] {
                let short = self.targets[q] - d.placed;
                d.reasons.push(Reason::Unplaced { short });
            }
        }
    }

    /// Grants every queue its wanted slots if the usable hosts can hold them all;
    /// otherwise minimums first in priority order, then the rest by priority. Sets the
    /// targets.
    fn grant(&mut self) {
        let nh = self.host_count();
        let Balancer {
            queues,
            order,
            caps,
            hosts,
            decisions,
            targets,
            floor,
            scratch: s,
            ..
        } = self;
        s.free.clear();
        s.free
            .extend(hosts.by_use.iter().map(|&h| hosts.capacity[h]));
        // Per handler, the room left on the hosts that run it, kept up to date as slots
        // are granted rather than summed for each queue.
        s.room.clear();
        s.room.extend(
            hosts
                .eligible
                .iter()
                .map(|e| e.iter().map(|&i| u64::from(s.free[i])).sum::<u64>()),
        );
        let pool: u64 = s.free.iter().map(|&c| u64::from(c)).sum();
        for &q in order.iter() {
            let d = &mut decisions[q];
            if d.wanted > 0 && s.room[queues[q].handler] == 0 {
                d.reasons.push(Reason::NoHostCanRun);
                d.wanted = 0;
            }
        }
        release_holds(queues, order, decisions, pool);
        // A queue is granted only room that hosts running its handler still have.
        // Queues sharing an external system share its concurrency, in the same order.
        s.left.clear();
        s.left.extend_from_slice(caps);
        s.capped.clear();
        s.capped.resize(queues.len(), false);
        // Per handler, hosts before this position in its list are full: free only falls.
        s.cursor.clear();
        s.cursor.resize(hosts.eligible.len(), 0);
        targets.clear();
        targets.resize(queues.len(), 0);
        for pass in Pass::ALL {
            for &q in order.iter() {
                let info = &queues[q];
                let goal = pass.goal(decisions[q].wanted, info.config.min_slots, floor[q]);
                let k = info.handler;
                let t = &mut targets[q];
                let mut add = u64::from(goal.saturating_sub(*t)).min(s.room[k]) as u32;
                if let Some(c) = info.cap {
                    let left = &mut s.left[c];
                    if *left < add {
                        s.capped[q] = true;
                        add = *left;
                    }
                    *left -= add;
                }
                *t += add;
                let mut need = add;
                let eligible = &hosts.eligible[k];
                for &i in &eligible[s.cursor[k]..] {
                    if need == 0 {
                        break;
                    }
                    let take = s.free[i].min(need);
                    if take == 0 {
                        continue;
                    }
                    s.free[i] -= take;
                    need -= take;
                    let h = hosts.by_use[i];
                    for (j, room) in s.room.iter_mut().enumerate() {
                        if hosts.can[j * nh + h] {
                            *room -= u64::from(take);
                        }
                    }
                }
                while s.cursor[k] < eligible.len() && s.free[eligible[s.cursor[k]]] == 0 {
                    s.cursor[k] += 1;
                }
            }
        }
        for (q, d) in decisions.iter_mut().enumerate() {
            let t = targets[q];
            if s.capped[q] {
                // The system's share is a limit like max_slots: what the queue may want.
                let system = queues[q].config.system.clone().unwrap_or_default();
                d.reasons.push(Reason::CappedBySystem { system });
                d.wanted = t;
            }
            if t < d.wanted {
                d.reasons.push(Reason::Scarcity {
                    short: d.wanted - t,
                });
            }
        }
    }
}

/// The passes in which capacity is granted and slots placed, each filling every queue
/// (in priority order) up to its goal for the pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    /// A long queue's running tasks keep their slots before anything else: a busy long
    /// slot is never taken for another queue (its master would not stop it anyway).
    Floors,
    /// Up to `min_slots` (and the floor).
    Minimums,
    /// The whole target.
    Targets,
}

impl Pass {
    /// Every pass, in order.
    pub(super) const ALL: [Pass; 3] = [Pass::Floors, Pass::Minimums, Pass::Targets];

    /// What a queue that wants `full` holds after this pass.
    pub(super) fn goal(self, full: u32, min_slots: u32, floor: u32) -> u32 {
        match self {
            Pass::Floors => full.min(floor),
            Pass::Minimums => full.min(min_slots.max(floor)),
            Pass::Targets => full,
        }
    }
}

/// Hysteresis must not hold idle slots while other queues are short of capacity: under
/// scarcity, queues held above their demand fall back towards it, the lowest priorities
/// first, until what all queues want fits `pool` (a higher priority keeps its hold while
/// lower ones can give).
fn release_holds(queues: &[QueueInfo], order: &[usize], decisions: &mut [Decision], pool: u64) {
    let total_wanted: u64 = decisions.iter().map(|d| u64::from(d.wanted)).sum();
    let mut excess = total_wanted.saturating_sub(pool);
    for &q in order.iter().rev() {
        if excess == 0 {
            break;
        }
        let (d, c) = (&mut decisions[q], queues[q].config);
        let floor = d.demand.clamp(c.min_slots, c.max_slots);
        if d.reasons.contains(&Reason::HysteresisHold) && d.wanted > floor {
            let give = u64::from(d.wanted - floor).min(excess);
            d.wanted -= give as u32;
            excess -= give;
            d.reasons.push(Reason::Released);
        }
    }
}

/// One balancer decision.
pub fn decide(input: &Input) -> Output {
    let mut b = Balancer::new(input.config);
    b.set_hosts(input.hosts.values());
    let current = b.index_map(input.hosts, input.current);
    let stats: Vec<QueueWindow> = b
        .names
        .iter()
        .map(|q| input.stats.get(*q).cloned().unwrap_or_default())
        .collect();
    let paused: Vec<bool> = b.names.iter().map(|q| input.paused.contains(*q)).collect();
    b.decide(&IndexedInput {
        stats: &stats,
        current: &current,
        now: input.now,
        paused: &paused,
    });
    let map = b.placement(input.hosts);
    let decisions = b
        .names
        .iter()
        .map(|q| (*q).to_string())
        .zip(b.decisions)
        .collect();
    Output { map, decisions }
}

/// Places slots for wanted counts decided by some other rule (the simulator's `hpa` and
/// `static` policies), with the same scarcity order and placement as [`decide`], so the
/// rules compare on how many slots they want alone.
pub fn place_wanted(input: &Input, wanted: &BTreeMap<String, u32>) -> Placement {
    let mut b = Balancer::new(input.config);
    b.set_hosts(input.hosts.values());
    let current = b.index_map(input.hosts, input.current);
    let wanted: Vec<u32> = b
        .names
        .iter()
        .map(|q| wanted.get(*q).copied().unwrap_or(0))
        .collect();
    b.place_wanted(&current, &wanted);
    b.placement(input.hosts)
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
