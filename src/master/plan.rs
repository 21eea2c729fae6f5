//! Which slots to stop and which to start: the master's reconcile decision.
//!
//! A pure function of what the master runs, what the map wants of this host, the host's
//! capacity, the zygote and the queues' crash back-off, with the time as a value, so every
//! case can be tested as data. The master gathers a [`PlanInput`], calls [`plan`] and
//! applies the [`Plan`]: signals to the slots it stops, requests to the zygote for the
//! ones it starts.
//!
//! The rules, in order:
//! - once the current zygote is ready, every slot of an older one stops (rolled over onto
//!   the new one: stopped gracefully, restarted from it);
//! - a queue's slots beyond what it wants stop, idle ones first, then those still
//!   starting, busy ones last, and the youngest first within each;
//! - a busy slot of a long queue (`kind = "long"`) never stops, for a roll-over or a
//!   surplus: its task runs until it returns or is cancelled; such a slot is retired
//!   instead (`RETIRE_SIGNAL`: it exits once its task ended, taking no other, so a new
//!   map or config reaches it even under a backlog that would keep it busy; a drain, or
//!   a shut window of a queue that hands its tasks back, still stops it, retiring or
//!   not);
//! - slots are started only from a ready zygote that takes requests and preloaded the
//!   queue, for queues not backing off after crashes, highest priority first, until the
//!   host holds `capacity` slots (stopping ones not counted); capacity never stops a slot.
//!
//! `plan/tests.rs` holds the snapshot cases and a proptest over any input (never over
//! capacity, stopped and retired make exactly the surplus, the order above).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde::Serialize;

/// Where a slot is in its life, as the master sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum SlotState {
    /// Asked of the zygote, no pid yet.
    Spawning,
    /// Forked, connecting and initialising.
    Starting,
    /// Waiting for tasks.
    Idle,
    /// Inside a batch.
    Busy,
    /// Sent SIGTERM; finishing the task in hand.
    Stopping,
}

impl SlotState {
    /// Surplus slots stop in this order: idle ones lose nothing, starting ones lose their
    /// start, busy ones would finish a batch first.
    fn stop_rank(self) -> u8 {
        match self {
            SlotState::Idle => 0,
            SlotState::Spawning | SlotState::Starting => 1,
            SlotState::Busy | SlotState::Stopping => 2,
        }
    }
}

/// One slot the master tracks, as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SlotView {
    /// The queue it serves.
    pub queue: String,
    /// The generation of the zygote it was forked from.
    pub generation: u64,
    /// Where it is in its life.
    pub state: SlotState,
    /// When the master asked for it: the youngest surplus slot stops first.
    pub spawned_at: Instant,
    /// Asked to retire by an earlier plan: it exits once its task ended, so it is none of
    /// the slots its queue keeps.
    pub retiring: bool,
}

/// What this host is to run of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Want {
    /// Slots the map gives this host.
    pub slots: u32,
    /// The queue's priority: scarce capacity goes to the highest first.
    pub priority: i32,
    /// Crash back-off: no slot of this queue starts before then.
    pub not_before: Option<Instant>,
}

/// The current zygote, the one new slots come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ZygoteView {
    /// Its generation; slots of any other are rolled over once it is ready.
    pub generation: u64,
    /// It has preloaded (false while it starts, and when there is none).
    pub ready: bool,
    /// It takes spawn requests (false once retired by a drain).
    pub accepts: bool,
    /// Queues whose handler it preloaded: it can start slots for these only.
    pub preloaded: BTreeSet<String>,
}

/// Everything one plan is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PlanInput {
    /// The time of the decision.
    pub now: Instant,
    /// Every slot the master tracks, by its number, stopping ones included.
    pub slots: BTreeMap<u32, SlotView>,
    /// What the map wants of this host, by queue; a queue absent here wants no slot.
    pub wanted: BTreeMap<String, Want>,
    /// Slots the host can hold; `None` before the first measurement (no limit).
    pub capacity: Option<u32>,
    /// The current zygote.
    pub zygote: ZygoteView,
    /// Queues of kind long whose busy slots are kept: a busy slot of one holds a task
    /// that runs until cancelled. Empty while the host drains, so a drain stops them.
    pub long: BTreeSet<String>,
}

/// What to do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// Slots to stop (SIGTERM: finish the task in hand, give the rest back), by number: each queue in name order, its
    /// older generation first, then its surplus in stop order.
    pub stop: Vec<u32>,
    /// Busy slots of long queues the plan would stop if it could (an older generation's,
    /// or beyond what their queue wants): asked to exit once their task ended.
    pub retire: Vec<u32>,
    /// Queues to start one slot for each, in the order to ask the zygote.
    pub spawn: Vec<String>,
}

/// Decides which slots stop and which start; see the module's rules.
pub(super) fn plan(input: &PlanInput) -> Plan {
    let Surplus {
        stop,
        retire,
        kept,
        running,
    } = surplus(input);
    let spawn = spawns(input, &kept, running);
    Plan {
        stop,
        retire,
        spawn,
    }
}

/// What the plan takes away: the slots to stop, those to retire, and what is left.
struct Surplus<'a> {
    stop: Vec<u32>,
    retire: Vec<u32>,
    /// How many slots each queue keeps that go on (retiring ones not counted: the queue
    /// has their places back at once, within the host's capacity).
    kept: BTreeMap<&'a str, usize>,
    /// Slots that keep running for now, retiring ones included: stopping slots free
    /// their place, retiring ones only once their task ended.
    running: usize,
}

/// The slots to stop or retire, and how many each queue keeps running.
fn surplus(input: &PlanInput) -> Surplus<'_> {
    let mut by_queue: BTreeMap<&str, Vec<(u32, &SlotView)>> = BTreeMap::new();
    for (&n, s) in &input.slots {
        if s.state != SlotState::Stopping {
            by_queue.entry(&s.queue).or_default().push((n, s));
        }
    }
    let roll_over = input.zygote.ready;
    let current = input.zygote.generation;
    let mut stop = Vec::new();
    let mut retire = BTreeSet::new();
    let mut kept = BTreeMap::new();
    let mut running_total = 0;
    for (queue, mut slots) in by_queue {
        let long = input.long.contains(queue);
        let pinned = |s: &SlotView| long && s.state == SlotState::Busy;
        // Old slots busy with a long task retire, and those retired before stay so:
        // they still hold their place on the host, but not one of those the queue wants.
        // Unless the queue's long tasks are no longer kept (the host drains, or its window
        // shut and it hands them back): then a retiring slot stops too, or nothing would
        // end its task but a cancel.
        for &(n, s) in slots.iter() {
            let old = roll_over && s.generation != current;
            if long && s.retiring || old && pinned(s) {
                retire.insert(n);
                running_total += 1;
            } else if old || s.retiring {
                stop.push(n);
            }
        }
        slots.retain(|&(n, s)| {
            !(retire.contains(&n) || s.retiring || roll_over && s.generation != current)
        });
        // Stable: equal ranks and ages keep slot-number order. Pinned slots are busy, so
        // they sort last and only the others can make up the surplus; the pinned ones
        // beyond it retire, youngest first.
        slots.sort_by_key(|(_, s)| (s.state.stop_rank(), Reverse(s.spawned_at)));
        let want = input.wanted.get(queue).map_or(0, |w| w.slots) as usize;
        let stoppable = slots.iter().filter(|(_, s)| !pinned(s)).count();
        let excess = slots.len().saturating_sub(want);
        let surplus = excess.min(stoppable);
        stop.extend(slots.drain(..surplus).map(|(n, _)| n));
        retire.extend(slots.iter().take(excess - surplus).map(|&(n, _)| n));
        running_total += slots.len();
        kept.insert(queue, slots.len() - (excess - surplus));
    }
    Surplus {
        stop,
        retire: retire.into_iter().collect(),
        kept,
        running: running_total,
    }
}

/// The slots to start, given how many each queue keeps and the host's total.
fn spawns(input: &PlanInput, kept: &BTreeMap<&str, usize>, mut total: usize) -> Vec<String> {
    let zygote = &input.zygote;
    if !zygote.ready || !zygote.accepts {
        return Vec::new();
    }
    let capacity = input.capacity.unwrap_or(u32::MAX) as usize;
    let mut order: Vec<(&String, &Want)> = input.wanted.iter().collect();
    // Stable: equal priorities keep name order.
    order.sort_by_key(|(_, w)| Reverse(w.priority));
    let mut spawn = Vec::new();
    for (queue, want) in order {
        if !zygote.preloaded.contains(queue) || want.not_before.is_some_and(|t| input.now < t) {
            continue;
        }
        let have = kept.get(queue.as_str()).copied().unwrap_or(0);
        for _ in have..want.slots as usize {
            if total >= capacity {
                break;
            }
            total += 1;
            spawn.push(queue.clone());
        }
    }
    spawn
}

#[cfg(test)]
mod tests;
