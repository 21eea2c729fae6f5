//! One simulated queue: its backlog, its slots (starting, working, stopping), the batches
//! they hold, and the figures of its report.
//!
//! The slot model is the real one, not a fluid share: a working slot takes a whole batch
//! (up to `batch_size` tasks, all leased at once) and handles its tasks one after the
//! other at the queue's mean task time; the master learns of the batch's tasks and busy
//! time when it is done. A slot asked to stop while it holds a batch finishes that batch
//! first (its place is free for a new slot at once, as the master's plan counts it), and
//! a started slot works only after the trace's `slot_start`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use crate::manager::window::{Backlog, WorkCounters};

/// Waits below this many 10 ms buckets (a minute) are counted in a dense table; longer
/// ones, rare where it matters, in a tree.
const DENSE_BUCKETS: usize = 6_000;

/// Tasks that arrived together, waiting first-in first-out.
#[derive(Debug, Clone, Copy)]
struct Arrivals {
    /// When they were enqueued (simulated ms).
    at_ms: u64,
    /// How many are still waiting.
    count: u64,
}

/// Slots started together, working from `ready_ms` on.
#[derive(Debug, Clone, Copy)]
struct Starting {
    /// Fork to first take done (simulated ms).
    ready_ms: u64,
    /// When they were started, for the order surplus slots stop in.
    born_ms: u64,
    /// How many are still starting.
    count: u32,
}

/// A slot that works: idle, or holding a batch.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// When it was started: the youngest stop first.
    born_ms: u64,
    /// Its batch, if it holds one.
    batch: Option<Batch>,
    /// Asked to stop: it finishes its batch, then leaves.
    stopping: bool,
}

/// A batch a slot holds: leased until it is done (when, the busy heap knows).
#[derive(Debug, Clone, Copy)]
struct Batch {
    /// Tasks in it.
    tasks: u32,
    /// Handling time of each, µs.
    task_us: u64,
}

/// What setting a queue's slots did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct SlotChange {
    /// Slots started.
    pub started: u32,
    /// Slots stopped.
    pub stopped: u32,
}

/// One queue of the simulated cluster.
#[derive(Debug)]
pub(super) struct QueueSim {
    /// Tasks a slot takes at once.
    batch_size: u32,
    backlog: VecDeque<Arrivals>,
    /// Σ of `backlog`'s counts: tasks ready.
    backlog_total: u64,
    /// Tasks in batches that slots hold: leased.
    held_total: u64,
    /// Working slots, by index; `None` where a slot left (its index is reused).
    slots: Vec<Option<Slot>>,
    /// Indices of `slots` that are free for reuse.
    vacant: Vec<usize>,
    /// Working slots without a batch (never stopping ones: those leave at once).
    idle: Vec<usize>,
    /// Slots holding a batch, by when it is done.
    busy: BinaryHeap<Reverse<(u64, usize)>>,
    /// Working slots that are not stopping.
    running: u32,
    /// Slots that finish a batch before they leave.
    stopping: u32,
    /// Slots still starting, oldest first.
    starting: VecDeque<Starting>,
    /// Mean handling time of the load arriving now.
    task_seconds: f64,
    /// Tasks that arrived: the queue's own counter (`enqueued_total`).
    pub arrived: u64,
    /// What its slots did, as a master counts it (a batch when it is done).
    pub work: WorkCounters,
    /// Waits (enqueue to start) in 10 ms buckets below [`DENSE_BUCKETS`] → tasks.
    waits: Vec<u64>,
    /// Longer waits: bucket → tasks.
    long_waits: BTreeMap<u64, u64>,
    /// Σ slots over the steps, for the mean.
    pub slot_steps: u64,
    /// Σ |change| of its slots.
    pub slot_changes: u64,
    /// Largest backlog seen (ready and leased).
    pub max_backlog: u64,
}

impl QueueSim {
    /// An idle queue whose slots take `batch_size` tasks at once.
    pub fn new(batch_size: u32) -> Self {
        Self {
            batch_size: batch_size.max(1),
            backlog: VecDeque::new(),
            backlog_total: 0,
            held_total: 0,
            slots: Vec::new(),
            vacant: Vec::new(),
            idle: Vec::new(),
            busy: BinaryHeap::new(),
            running: 0,
            stopping: 0,
            starting: VecDeque::new(),
            task_seconds: 0.0,
            arrived: 0,
            work: WorkCounters::default(),
            waits: vec![0; DENSE_BUCKETS],
            long_waits: BTreeMap::new(),
            slot_steps: 0,
            slot_changes: 0,
            max_backlog: 0,
        }
    }

    /// Slots the map gives it: working or starting, stopping ones not counted.
    #[inline]
    pub fn slots(&self) -> u32 {
        self.running + self.starting.iter().map(|s| s.count).sum::<u32>()
    }

    /// Tasks ready: what a queue-length rule sees.
    pub fn ready(&self) -> u64 {
        self.backlog_total
    }

    /// Tasks ready or in a batch.
    pub fn left(&self) -> u64 {
        self.backlog_total + self.held_total
    }

    /// The backlog as the manager reads it: tasks in batches slots hold are leased, the
    /// rest ready.
    pub fn split_backlog(&self) -> Backlog {
        Backlog {
            ready: self.backlog_total,
            leased: self.held_total,
        }
    }

    /// Sets the queue's slots to `n` at `now_ms`; new ones work after `start_ms`. Surplus
    /// stops as a master stops it: idle slots first, then starting ones, busy ones last
    /// (they finish their batch), the youngest first.
    pub fn set_slots(&mut self, n: u32, now_ms: u64, start_ms: u64) -> SlotChange {
        let cur = self.slots();
        if n > cur {
            self.starting.push_back(Starting {
                ready_ms: now_ms + start_ms,
                born_ms: now_ms,
                count: n - cur,
            });
            self.slot_changes += u64::from(n - cur);
            return SlotChange {
                started: n - cur,
                stopped: 0,
            };
        }
        let stopped = cur - n;
        self.slot_changes += u64::from(stopped);
        let mut drop = stopped;
        drop -= self.stop_idle(drop);
        drop -= self.stop_starting(drop);
        self.stop_busy(drop);
        SlotChange {
            started: 0,
            stopped,
        }
    }

    /// Up to `n` idle slots leave, the youngest first; how many did.
    fn stop_idle(&mut self, n: u32) -> u32 {
        let slots = &self.slots;
        let born = |i: &usize| slots[*i].map_or(0, |s| s.born_ms);
        self.idle.sort_by_key(born);
        let k = (n as usize).min(self.idle.len());
        for _ in 0..k {
            let i = self.idle.pop().expect("k <= idle");
            self.slots[i] = None;
            self.vacant.push(i);
        }
        self.running -= k as u32;
        k as u32
    }

    /// Up to `n` starting slots are called off, the youngest first; how many were.
    fn stop_starting(&mut self, n: u32) -> u32 {
        let mut left = n;
        while left > 0 {
            let Some(last) = self.starting.back_mut() else {
                break;
            };
            let d = last.count.min(left);
            last.count -= d;
            left -= d;
            if last.count == 0 {
                self.starting.pop_back();
            }
        }
        n - left
    }

    /// `n` busy slots, the youngest first, finish their batch and leave.
    fn stop_busy(&mut self, n: u32) {
        for _ in 0..n {
            let youngest = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.filter(|s| !s.stopping).map(|s| (s.born_ms, i)))
                .max();
            let Some((_, i)) = youngest else {
                return;
            };
            if let Some(s) = self.slots[i].as_mut() {
                s.stopping = true;
            }
            self.running -= 1;
            self.stopping += 1;
        }
    }

    /// `n` tasks arrive at `at_ms`, with a mean handling time of `task_seconds`.
    #[inline]
    pub fn arrive(&mut self, at_ms: u64, n: u64, task_seconds: f64) {
        self.task_seconds = task_seconds;
        if n > 0 {
            self.backlog.push_back(Arrivals { at_ms, count: n });
            self.backlog_total += n;
            self.arrived += n;
        }
    }

    /// Slots whose start is done by `now_ms` work (idle) from now on.
    #[inline]
    pub fn start_ready(&mut self, now_ms: u64) {
        while self.starting.front().is_some_and(|s| s.ready_ms <= now_ms) {
            let s = self.starting.pop_front().expect("checked");
            for _ in 0..s.count {
                let slot = Slot {
                    born_ms: s.born_ms,
                    batch: None,
                    stopping: false,
                };
                let i = match self.vacant.pop() {
                    Some(i) => {
                        self.slots[i] = Some(slot);
                        i
                    }
                    None => {
                        self.slots.push(Some(slot));
                        self.slots.len() - 1
                    }
                };
                self.idle.push(i);
            }
            self.running += s.count;
        }
    }

    /// Its slots, stopping ones too, live `dt` seconds; returns the slot-seconds.
    #[inline]
    pub fn live(&mut self, dt: f64) -> f64 {
        let slots = self.slots() + self.stopping;
        self.work.slot_lifetime_seconds += f64::from(slots) * dt;
        self.slot_steps += u64::from(slots);
        f64::from(slots) * dt
    }

    /// Its slots work the step from `now_ms` for `step_ms`: idle ones take batches, busy
    /// ones finish theirs (and take the next, or leave if stopping); returns the busy
    /// seconds of the batches done.
    #[inline]
    pub fn handle(&mut self, now_ms: u64, step_ms: u64) -> f64 {
        let (now_us, end_us) = (now_ms * 1000, (now_ms + step_ms) * 1000);
        while self.backlog_total > 0 {
            let Some(i) = self.idle.pop() else { break };
            self.take(i, now_us);
        }
        let mut busy = 0.0;
        while let Some(&Reverse((done_us, i))) = self.busy.peek() {
            if done_us >= end_us {
                break;
            }
            self.busy.pop();
            busy += self.finish(i);
            let stopping = self.slots[i].is_some_and(|s| s.stopping);
            if stopping {
                self.slots[i] = None;
                self.vacant.push(i);
                self.stopping -= 1;
            } else if self.backlog_total > 0 {
                self.take(i, done_us);
            } else {
                self.idle.push(i);
            }
        }
        self.max_backlog = self.max_backlog.max(self.backlog_total + self.held_total);
        busy
    }

    /// Slot `i`'s batch is done: the master counts it; returns its busy seconds.
    fn finish(&mut self, i: usize) -> f64 {
        let Some(b) = self.slots[i].as_mut().and_then(|s| s.batch.take()) else {
            return 0.0;
        };
        self.held_total -= u64::from(b.tasks);
        let busy = (u64::from(b.tasks) * b.task_us) as f64 / 1e6;
        self.work.processed += u64::from(b.tasks);
        self.work.busy_seconds += busy;
        busy
    }

    /// Slot `i` takes a batch of the oldest tasks at `at_us`; each starts when the one
    /// before it is done, which is its wait.
    fn take(&mut self, i: usize, at_us: u64) {
        let tasks = u64::from(self.batch_size).min(self.backlog_total);
        let task_us = (self.task_seconds * 1e6).round().max(1.0) as u64;
        self.backlog_total -= tasks;
        self.held_total += tasks;
        let mut start_us = at_us;
        let mut n = tasks;
        while n > 0 {
            let front = self.backlog.front_mut().expect("n <= backlog_total");
            let (at_ms, k) = (front.at_ms, front.count.min(n));
            front.count -= k;
            if front.count == 0 {
                self.backlog.pop_front();
            }
            n -= k;
            for _ in 0..k {
                self.count_wait((start_us / 1000).saturating_sub(at_ms));
                start_us += task_us;
            }
        }
        let done_us = at_us + tasks * task_us;
        if let Some(s) = self.slots[i].as_mut() {
            s.batch = Some(Batch {
                tasks: tasks as u32,
                task_us,
            });
        }
        self.busy.push(Reverse((done_us, i)));
    }

    #[inline]
    fn count_wait(&mut self, wait_ms: u64) {
        let bucket = wait_ms / 10;
        match self.waits.get_mut(bucket as usize) {
            Some(n) => *n += 1,
            None => *self.long_waits.entry(bucket).or_default() += 1,
        }
    }

    /// Every bucket with its tasks, shortest waits first.
    fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let dense = self
            .waits
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(b, n)| (b as u64, *n));
        dense.chain(self.long_waits.iter().map(|(b, n)| (*b, *n)))
    }

    /// The wait below which share `q` of the tasks started, ms.
    pub fn percentile(&self, q: f64) -> u64 {
        let total: u64 = self.buckets().map(|(_, n)| n).sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bucket, n) in self.buckets() {
            seen += n;
            if seen >= rank {
                return bucket * 10;
            }
        }
        0
    }

    /// The longest wait, ms.
    pub fn max_wait(&self) -> u64 {
        self.buckets().last().map_or(0, |(b, _)| b * 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `q` for `ms` in 100 ms steps from `from_ms`.
    fn run(q: &mut QueueSim, from_ms: u64, ms: u64) {
        for t in (from_ms..from_ms + ms).step_by(100) {
            q.start_ready(t);
            q.live(0.1);
            q.handle(t, 100);
        }
    }

    #[test]
    fn a_slot_takes_a_whole_batch_and_its_tasks_wait_their_turn() {
        let mut q = QueueSim::new(5);
        q.set_slots(1, 0, 0);
        q.arrive(0, 8, 1.0);
        run(&mut q, 0, 100);
        // One batch of 5 taken whole: leased, the other 3 ready.
        assert_eq!(
            q.split_backlog(),
            Backlog {
                ready: 3,
                leased: 5
            }
        );
        run(&mut q, 100, 10_000);
        assert_eq!(q.work.processed, 8);
        // The 5th task of the first batch started after 4 s, the last after 7 s.
        assert_eq!(q.percentile(0.5), 3_000);
        assert_eq!(q.max_wait(), 7_000);
    }

    #[test]
    fn a_stopped_slot_finishes_its_batch_before_it_leaves() {
        let mut q = QueueSim::new(10);
        q.set_slots(2, 0, 0);
        q.arrive(0, 10, 1.0);
        run(&mut q, 0, 1_000);
        // One slot holds all 10 tasks, the other is idle: the idle one stops first.
        assert_eq!(q.set_slots(1, 1_000, 0).stopped, 1);
        assert_eq!((q.slots(), q.stopping), (1, 0));
        // The busy one is asked to stop: it no longer counts, but works on.
        q.set_slots(0, 1_000, 0);
        assert_eq!((q.slots(), q.stopping), (0, 1));
        run(&mut q, 1_000, 5_000);
        assert_eq!((q.work.processed, q.stopping), (0, 1));
        run(&mut q, 6_000, 5_000);
        assert_eq!((q.work.processed, q.stopping), (10, 0));
        assert_eq!(q.split_backlog(), Backlog::default());
    }

    #[test]
    fn a_started_slot_works_after_its_start() {
        let mut q = QueueSim::new(1);
        q.set_slots(1, 0, 500);
        q.arrive(0, 1, 0.01);
        run(&mut q, 0, 1_000);
        assert_eq!(q.max_wait(), 500);
    }
}
