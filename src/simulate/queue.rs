//! One simulated queue: its backlog, its slots (starting, working, stopping), the batches
//! they hold, and the figures of its report.
//!
//! The slot model is the real one, not a fluid share: a working slot takes a whole batch
//! (up to `batch_size` tasks, all leased at once) and handles its tasks one after the
//! other at the queue's mean task time; the master learns of the batch's tasks and busy
//! time when it is done. A slot asked to stop while it holds a batch stops as a real one
//! does (`src/slot`): it finishes the task in hand, and when that is done it settles what
//! it handled and gives the untouched rest back to the head of the ready tasks, where
//! they keep their place and their arrival times (so their waits go on counting from
//! there). Its place is free for a new slot at once, as the master's plan counts it. A
//! started slot works only after the trace's `slot_start`. A handler stops early
//! ([`StopAt::Task`]) as gaffer's built-in, exec and well-behaved Rust handlers do, unless
//! the trace lists its queue in `whole_batch` ([`StopAt::Batch`]: an exec child that
//! ignores the stop line, a Rust handler that never looks at `SlotContext::should_stop`),
//! whose stopped slots finish their whole batch and give nothing back.
//!
//! A batch keeps its tasks' arrival times, at most `batch_size` per slot; when a stopped
//! slot gives tasks back, the waits the take counted for them are taken back.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use crate::manager::window::{Backlog, WorkCounters};

/// Waits below this many 10 ms buckets (a minute) are counted in a dense table; longer
/// ones, rare where it matters, in a tree.
const DENSE_BUCKETS: usize = 6_000;

/// Where a slot asked to stop in the middle of a batch stops: what its queue's handler
/// does with the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StopAt {
    /// After the task in hand; the untouched rest of the batch goes back.
    Task,
    /// After the whole batch (a handler that ignores the stop); nothing goes back.
    Batch,
}

/// Tasks that arrived together, waiting first-in first-out (or held together in a batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Arrivals {
    /// When they were enqueued (simulated ms).
    at_ms: u64,
    /// How many are still waiting (or held).
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
#[derive(Debug, Clone)]
struct Slot {
    /// When it was started: the youngest stop first.
    born_ms: u64,
    /// Its batch, if it holds one.
    batch: Option<Batch>,
    /// When the tasks of its batch arrived, in the order it handles them: at most
    /// `batch_size` runs, kept so that the tasks a stop leaves untouched go back with
    /// their own arrival times.
    held: Vec<Arrivals>,
    /// Asked to stop: it finishes the task in hand, gives the rest back, then leaves (or,
    /// for [`StopAt::Batch`], finishes its batch, then leaves).
    stopping: bool,
}

/// A batch a slot holds: leased until it ends (the busy heap knows when).
#[derive(Debug, Clone, Copy)]
struct Batch {
    /// Tells this batch's end in the busy heap from ends that no longer hold (a batch
    /// cut short by a stop, a slot whose index was reused).
    id: u64,
    /// When the slot took it, µs.
    taken_us: u64,
    /// Tasks in it.
    tasks: u32,
    /// Tasks handled when it ends: all of them, or fewer once a stop cut it short.
    handled: u32,
    /// Handling time of each, µs.
    task_us: u64,
}

impl Batch {
    /// When it ends: its last handled task is done, µs.
    fn ends_us(&self) -> u64 {
        self.taken_us + u64::from(self.handled) * self.task_us
    }

    /// The tasks handled if the slot is asked to stop at `at_us`: those done by then and
    /// the one in hand, none started after it. A stop between two tasks starts no more.
    fn handled_if_stopped(&self, at_us: u64) -> u32 {
        let started = at_us.saturating_sub(self.taken_us).div_ceil(self.task_us);
        started.min(u64::from(self.handled)) as u32
    }
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
    /// Where its stopped busy slots stop.
    stop_at: StopAt,
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
    /// Slots holding a batch, by when it ends: (µs, slot index, batch id). An entry whose
    /// batch is gone or ends at another time is stale and skipped.
    busy: BinaryHeap<Reverse<(u64, usize, u64)>>,
    /// The id of the next batch taken.
    next_batch: u64,
    /// Working slots that are not stopping.
    running: u32,
    /// Slots that finish the task in hand (or their batch) before they leave.
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
    /// An idle queue whose slots take `batch_size` tasks at once and, asked to stop while
    /// busy, stop at `stop_at`.
    pub fn new(batch_size: u32, stop_at: StopAt) -> Self {
        Self {
            batch_size: batch_size.max(1),
            stop_at,
            backlog: VecDeque::new(),
            backlog_total: 0,
            held_total: 0,
            slots: Vec::new(),
            vacant: Vec::new(),
            idle: Vec::new(),
            busy: BinaryHeap::new(),
            next_batch: 0,
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
    /// (they finish the task in hand), the youngest first.
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
        self.stop_busy(drop, now_ms * 1000);
        SlotChange {
            started: 0,
            stopped,
        }
    }

    /// Up to `n` idle slots leave, the youngest first; how many did.
    fn stop_idle(&mut self, n: u32) -> u32 {
        let slots = &self.slots;
        let born = |i: &usize| slots[*i].as_ref().map_or(0, |s| s.born_ms);
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

    /// `n` busy slots, the youngest first, are asked to stop at `now_us`: each finishes
    /// the task in hand (or its batch, for [`StopAt::Batch`]), then leaves.
    fn stop_busy(&mut self, n: u32, now_us: u64) {
        for _ in 0..n {
            let youngest = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.as_ref().filter(|s| !s.stopping).map(|s| (s.born_ms, i)))
                .max();
            let Some((_, i)) = youngest else {
                return;
            };
            if let Some(s) = self.slots[i].as_mut() {
                s.stopping = true;
            }
            if self.stop_at == StopAt::Task {
                self.cut(i, now_us);
            }
            self.running -= 1;
            self.stopping += 1;
        }
    }

    /// Slot `i`'s batch, the slot asked to stop at `now_us`, ends with the task in hand:
    /// its end moves up to that task's, a new entry in the busy heap (the old one goes
    /// stale, as its time no longer matches).
    fn cut(&mut self, i: usize, now_us: u64) {
        let Some(b) = self.slots[i].as_mut().and_then(|s| s.batch.as_mut()) else {
            return;
        };
        let handled = b.handled_if_stopped(now_us);
        if handled == b.handled {
            return;
        }
        b.handled = handled;
        self.busy.push(Reverse((b.ends_us(), i, b.id)));
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
                    held: Vec::new(),
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
    /// ones end theirs (and take the next, or leave if stopping); returns the busy
    /// seconds of the batches ended.
    #[inline]
    pub fn handle(&mut self, now_ms: u64, step_ms: u64) -> f64 {
        let (now_us, end_us) = (now_ms * 1000, (now_ms + step_ms) * 1000);
        while self.backlog_total > 0 {
            let Some(i) = self.idle.pop() else { break };
            self.take(i, now_us);
        }
        let mut busy = 0.0;
        while let Some(&Reverse((done_us, i, id))) = self.busy.peek() {
            if done_us >= end_us {
                break;
            }
            self.busy.pop();
            if !self.ends_now(i, id, done_us) {
                continue;
            }
            busy += self.finish(i);
            let stopping = self.slots[i].as_ref().is_some_and(|s| s.stopping);
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

    /// Whether the busy heap's entry (`i`, `id`, `at_us`) is the end of the batch slot
    /// `i` holds now, not a stale one.
    fn ends_now(&self, i: usize, id: u64, at_us: u64) -> bool {
        let batch = self.slots[i].as_ref().and_then(|s| s.batch.as_ref());
        batch.is_some_and(|b| b.id == id && b.ends_us() == at_us)
    }

    /// Slot `i`'s batch ends: the master counts the tasks it handled, and those a stop
    /// left untouched go back; returns its busy seconds.
    fn finish(&mut self, i: usize) -> f64 {
        let Some(slot) = self.slots[i].as_mut() else {
            return 0.0;
        };
        let Some(b) = slot.batch.take() else {
            return 0.0;
        };
        let held = std::mem::take(&mut slot.held);
        self.held_total -= u64::from(b.tasks);
        let busy = (u64::from(b.handled) * b.task_us) as f64 / 1e6;
        self.work.processed += u64::from(b.handled);
        self.work.busy_seconds += busy;
        if b.handled < b.tasks {
            self.give_back(&b, &held);
        }
        if let Some(slot) = self.slots[i].as_mut() {
            // Kept for its next batch: a slot's runs allocate once.
            slot.held = held;
        }
        busy
    }

    /// The tasks of `b` past those it handled go back to the head of the ready tasks,
    /// in arrival order, with their arrival times (`held`); the waits counted for them
    /// when they were taken are taken back, since they never started.
    fn give_back(&mut self, b: &Batch, held: &[Arrivals]) {
        let mut position = 0u64;
        for run in held {
            let first = u64::from(b.handled).max(position);
            let end = position + run.count;
            if first < end {
                for p in first..end {
                    let start_us = b.taken_us + p * b.task_us;
                    self.uncount_wait((start_us / 1000).saturating_sub(run.at_ms));
                }
                self.put_back(Arrivals {
                    at_ms: run.at_ms,
                    count: end - first,
                });
            }
            position = end;
        }
    }

    /// Tasks given back join the ready ones in arrival order: ahead of any that arrived
    /// at the same time or later, which every task still ready did, as batches take the
    /// oldest first.
    fn put_back(&mut self, run: Arrivals) {
        let at = self.backlog.partition_point(|a| a.at_ms < run.at_ms);
        self.backlog.insert(at, run);
        self.backlog_total += run.count;
    }

    /// Slot `i` takes a batch of the oldest tasks at `at_us`; each starts when the one
    /// before it is done, which is its wait (taken back if a stop leaves it untouched).
    fn take(&mut self, i: usize, at_us: u64) {
        let tasks = u64::from(self.batch_size).min(self.backlog_total);
        let task_us = (self.task_seconds * 1e6).round().max(1.0) as u64;
        self.backlog_total -= tasks;
        self.held_total += tasks;
        let mut held = self.slots[i]
            .as_mut()
            .map(|s| std::mem::take(&mut s.held))
            .unwrap_or_default();
        held.clear();
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
            held.push(Arrivals { at_ms, count: k });
            for _ in 0..k {
                self.count_wait((start_us / 1000).saturating_sub(at_ms));
                start_us += task_us;
            }
        }
        let batch = Batch {
            id: self.next_batch,
            taken_us: at_us,
            tasks: tasks as u32,
            handled: tasks as u32,
            task_us,
        };
        self.next_batch += 1;
        self.busy.push(Reverse((batch.ends_us(), i, batch.id)));
        if let Some(s) = self.slots[i].as_mut() {
            s.batch = Some(batch);
            s.held = held;
        }
    }

    #[inline]
    fn count_wait(&mut self, wait_ms: u64) {
        let bucket = wait_ms / 10;
        match self.waits.get_mut(bucket as usize) {
            Some(n) => *n += 1,
            None => *self.long_waits.entry(bucket).or_default() += 1,
        }
    }

    /// Takes back a wait [`count_wait`](Self::count_wait) counted for a task that did not
    /// start then after all.
    fn uncount_wait(&mut self, wait_ms: u64) {
        let bucket = wait_ms / 10;
        if let Some(n) = self.waits.get_mut(bucket as usize) {
            *n -= 1;
        } else if let Some(n) = self.long_waits.get_mut(&bucket) {
            *n -= 1;
            if *n == 0 {
                self.long_waits.remove(&bucket);
            }
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
        let mut q = QueueSim::new(5, StopAt::Task);
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

    /// Every wait counted, as (wait ms, tasks).
    fn waits(q: &QueueSim) -> Vec<(u64, u64)> {
        q.buckets().map(|(b, n)| (b * 10, n)).collect()
    }

    /// No task lost or counted twice: arrived = done + ready + held, the ready ones in
    /// arrival order, and a wait counted for every task that started.
    fn assert_conserved(q: &QueueSim) {
        assert_eq!(
            q.arrived,
            q.work.processed + q.left(),
            "arrived = done + left"
        );
        let ready: u64 = q.backlog.iter().map(|a| a.count).sum();
        assert_eq!(ready, q.backlog_total, "the backlog's runs add up");
        let mut pairs = q.backlog.iter().zip(q.backlog.iter().skip(1));
        assert!(
            pairs.all(|(a, b)| a.at_ms <= b.at_ms),
            "ready tasks in arrival order, given-back ones too"
        );
        let held: u64 = q
            .slots
            .iter()
            .flatten()
            .filter_map(|s| s.batch)
            .map(|b| u64::from(b.tasks))
            .sum();
        assert_eq!(held, q.held_total, "the batches add up");
        let counted: u64 = q.buckets().map(|(_, n)| n).sum();
        assert_eq!(
            counted,
            q.arrived - q.backlog_total,
            "a wait per task taken"
        );
    }

    /// One slot holding a batch of ten 1 s tasks that arrived at 0, 20 and 40 ms (3, 3
    /// and 4 of them), taken at 100 ms; five more tasks arrive at 3 s.
    fn one_busy_slot() -> QueueSim {
        one_busy_slot_stopping_at(StopAt::Task)
    }

    /// [`one_busy_slot`] of a queue whose handler stops at `stop_at`.
    fn one_busy_slot_stopping_at(stop_at: StopAt) -> QueueSim {
        let mut q = QueueSim::new(10, stop_at);
        q.set_slots(1, 0, 100);
        q.arrive(0, 3, 1.0);
        q.arrive(20, 3, 1.0);
        q.arrive(40, 4, 1.0);
        run(&mut q, 0, 3_000);
        q.arrive(3_000, 5, 1.0);
        assert_eq!((q.held_total, q.backlog_total), (10, 5));
        q
    }

    #[test]
    fn a_stopped_slot_finishes_the_task_in_hand_and_gives_the_rest_back() {
        let mut q = one_busy_slot();
        // At 3.5 s the slot is 3.4 s into its batch: task k = 3 is in hand.
        q.set_slots(0, 3_500, 0);
        assert_eq!((q.slots(), q.stopping), (0, 1));
        run(&mut q, 3_500, 600);
        // Task 3 ends at 4.1 s: nothing is settled or given back before.
        assert_eq!((q.work.processed, q.held_total, q.stopping), (0, 10, 1));
        assert_conserved(&q);
        run(&mut q, 4_100, 100);
        // It leaves at the end of task k: k + 1 = 4 done, N - k - 1 = 6 back, ahead of
        // the later arrivals, with their own arrival times.
        assert_eq!((q.work.processed, q.held_total, q.stopping), (4, 0, 0));
        assert_eq!(q.work.busy_seconds, 4.0);
        let back = [(20, 2), (40, 4), (3_000, 5)].map(|(at_ms, count)| Arrivals { at_ms, count });
        assert_eq!(q.backlog.iter().copied().collect::<Vec<_>>(), back);
        assert_eq!(q.backlog_total, 11);
        assert_conserved(&q);
        // Only the four that started have waits; the six given back wait on from their
        // arrival: a new slot takes them at 5 s.
        assert_eq!(waits(&q), [(100, 1), (1_100, 1), (2_100, 1), (3_080, 1)]);
        q.set_slots(1, 5_000, 0);
        run(&mut q, 5_000, 100);
        // The six given back first, then four of the five that arrived at 3 s.
        let w: Vec<u64> = waits(&q).into_iter().map(|(w, _)| w).collect();
        let started = [100, 1_100, 2_100, 3_080, 4_980, 5_980, 6_960, 7_960, 8_000];
        assert_eq!(
            w,
            [&started[..], &[8_960, 9_000, 9_960, 10_000, 11_000]].concat()
        );
        run(&mut q, 5_100, 20_000);
        assert_eq!(q.work.processed, 15);
        assert_eq!(q.left(), 0);
        assert_conserved(&q);
    }

    #[test]
    fn an_idle_slot_stops_before_a_busy_one() {
        let mut q = QueueSim::new(10, StopAt::Task);
        q.set_slots(2, 0, 0);
        q.arrive(0, 10, 1.0);
        run(&mut q, 0, 1_000);
        // One slot holds all 10 tasks, the other is idle: the idle one leaves, the busy
        // one is not even asked.
        assert_eq!(q.set_slots(1, 1_000, 0).stopped, 1);
        assert_eq!((q.slots(), q.stopping, q.idle.len()), (1, 0, 0));
        run(&mut q, 1_000, 10_000);
        assert_eq!((q.work.processed, q.left()), (10, 0));
        assert_conserved(&q);
    }

    #[test]
    fn a_slot_stopped_between_two_tasks_starts_no_more() {
        let mut q = one_busy_slot();
        // 3 s into the batch exactly: task 2 just ended, task 3 not started.
        q.set_slots(0, 3_100, 0);
        run(&mut q, 3_100, 100);
        assert_eq!((q.work.processed, q.stopping, q.backlog_total), (3, 0, 12));
        assert_eq!(
            q.backlog.front().copied(),
            Some(Arrivals {
                at_ms: 20,
                count: 3
            })
        );
        assert_conserved(&q);
    }

    #[test]
    fn a_slot_stopped_in_its_batch_s_last_task_gives_nothing_back() {
        let mut q = one_busy_slot();
        run(&mut q, 3_000, 6_500);
        // 9.4 s into the batch: its last task is in hand; it ends with the batch.
        q.set_slots(0, 9_500, 0);
        run(&mut q, 9_500, 600);
        assert_eq!((q.work.processed, q.stopping), (0, 1));
        run(&mut q, 10_100, 100);
        assert_eq!((q.work.processed, q.stopping, q.backlog_total), (10, 0, 5));
        assert_conserved(&q);
    }

    #[test]
    fn a_slot_stopped_while_starting_never_takes() {
        let mut q = QueueSim::new(10, StopAt::Task);
        q.set_slots(1, 0, 500);
        q.arrive(0, 5, 1.0);
        run(&mut q, 0, 200);
        assert_eq!(q.set_slots(0, 200, 500).stopped, 1);
        run(&mut q, 200, 1_000);
        assert_eq!(
            (q.slots(), q.stopping, q.work.processed, q.backlog_total),
            (0, 0, 0, 5)
        );
        assert_conserved(&q);
    }

    #[test]
    fn a_cut_batch_s_old_end_never_ends_a_later_batch() {
        // A batch of ten 1 s tasks taken at 0 would end at 10 s; stopped at 0.5 s it ends
        // at 1 s and its slot leaves. A new slot, at the same index, takes the nine given
        // back and one more, of 0.89 s, at 1.1 s: they end at 10 s too, where the old end,
        // stale now, must not end them before their own does (or a second time).
        let mut q = QueueSim::new(10, StopAt::Task);
        q.set_slots(1, 0, 0);
        q.arrive(0, 10, 1.0);
        run(&mut q, 0, 500);
        q.set_slots(0, 500, 0);
        run(&mut q, 500, 600);
        assert_eq!((q.work.processed, q.backlog_total, q.stopping), (1, 9, 0));
        q.arrive(1_050, 1, 0.89);
        q.set_slots(1, 1_100, 0);
        run(&mut q, 1_100, 100);
        assert_eq!(q.slots.len(), 1, "the index is reused");
        run(&mut q, 1_200, 15_000);
        assert_eq!((q.work.processed, q.left(), q.idle.len()), (11, 0, 1));
        assert!(
            (q.work.busy_seconds - 9.9).abs() < 1e-9,
            "{}",
            q.work.busy_seconds
        );
        assert_conserved(&q);
    }

    #[test]
    fn a_stopped_slot_of_a_whole_batch_queue_finishes_its_batch_and_gives_nothing_back() {
        let mut q = one_busy_slot_stopping_at(StopAt::Batch);
        // At 3.5 s task 3 is in hand, but the handler ignores the stop: the slot's place
        // is free at once, and it works on.
        assert_eq!(q.set_slots(0, 3_500, 0).stopped, 1);
        assert_eq!((q.slots(), q.stopping), (0, 1));
        run(&mut q, 3_500, 6_600);
        // The batch ends at 10.1 s: until then nothing is settled or given back.
        assert_eq!((q.work.processed, q.held_total, q.stopping), (0, 10, 1));
        assert_conserved(&q);
        run(&mut q, 10_100, 100);
        // It leaves at the batch's end with all ten done; only the later arrivals wait.
        assert_eq!((q.work.processed, q.held_total, q.stopping), (10, 0, 0));
        assert_eq!(q.work.busy_seconds, 10.0);
        let later = [Arrivals {
            at_ms: 3_000,
            count: 5,
        }];
        assert_eq!(q.backlog.iter().copied().collect::<Vec<_>>(), later);
        assert_conserved(&q);
        // Every task of the batch started, each in its turn: no wait taken back.
        let w: Vec<u64> = waits(&q).into_iter().map(|(w, _)| w).collect();
        let turns = [
            100, 1_100, 2_100, 3_080, 4_080, 5_080, 6_060, 7_060, 8_060, 9_060,
        ];
        assert_eq!(w, turns);
        q.set_slots(1, 10_200, 0);
        run(&mut q, 10_200, 10_000);
        assert_eq!((q.work.processed, q.left()), (15, 0));
        assert_conserved(&q);
    }

    #[test]
    fn a_whole_batch_queue_s_idle_slot_still_leaves_at_once() {
        let mut q = QueueSim::new(10, StopAt::Batch);
        q.set_slots(2, 0, 0);
        q.arrive(0, 10, 1.0);
        run(&mut q, 0, 1_000);
        assert_eq!(q.set_slots(1, 1_000, 0).stopped, 1);
        assert_eq!((q.slots(), q.stopping, q.idle.len()), (1, 0, 0));
        // Stopping the busy one too: it holds its batch to the end, at 10 s.
        q.set_slots(0, 1_000, 0);
        run(&mut q, 1_000, 9_000);
        assert_eq!((q.work.processed, q.stopping), (0, 1));
        run(&mut q, 10_000, 100);
        assert_eq!((q.work.processed, q.stopping, q.left()), (10, 0, 0));
        assert_conserved(&q);
    }

    #[test]
    fn no_task_is_lost_whatever_the_slots_do() {
        let (processed, cut_short, _) = churn(StopAt::Task);
        assert!(processed > 1_000, "{processed}");
        assert!(cut_short > 0, "some batches were cut short by a stop");
    }

    #[test]
    fn no_task_is_lost_when_stopped_slots_finish_their_batches() {
        let (processed, cut_short, stopping) = churn(StopAt::Batch);
        assert!(processed > 1_000, "{processed}");
        assert!(stopping > 0, "some busy slots were stopped");
        assert_eq!(cut_short, 0, "a whole-batch queue's batches are never cut");
    }

    /// Ten simulated minutes of random slot changes and arrivals on a queue whose handler
    /// stops at `stop_at`, conservation checked at every step; the tasks done, the steps
    /// a slot held a batch cut short by a stop, the steps a stopped slot worked on.
    fn churn(stop_at: StopAt) -> (u64, usize, u32) {
        let mut rng = crate::simulate::rng::Rng(16);
        let mut q = QueueSim::new(7, stop_at);
        let mut cut_short = 0;
        let mut stopping = 0;
        for t in (0..600_000).step_by(100) {
            if t % 2_000 == 0 {
                q.set_slots((rng.poisson(3.0) as u32).min(8), t, 300);
            }
            q.arrive(t + 50, rng.poisson(2.0), 0.37);
            q.start_ready(t);
            q.live(0.1);
            q.handle(t, 100);
            assert_conserved(&q);
            stopping += q.stopping;
            cut_short += q
                .slots
                .iter()
                .flatten()
                .filter_map(|s| s.batch)
                .filter(|b| b.handled < b.tasks)
                .count();
        }
        (q.work.processed, cut_short, stopping)
    }

    #[test]
    fn a_started_slot_works_after_its_start() {
        let mut q = QueueSim::new(1, StopAt::Task);
        q.set_slots(1, 0, 500);
        q.arrive(0, 1, 0.01);
        run(&mut q, 0, 1_000);
        assert_eq!(q.max_wait(), 500);
    }
}
