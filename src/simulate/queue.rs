//! One simulated queue: its backlog, its slots (running and starting), the work they do,
//! and the figures of its report.

use std::collections::{BTreeMap, VecDeque};

use crate::manager::window::{Backlog, WorkCounters};

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
    /// How many are still starting.
    count: u32,
}

/// What setting a queue's slots did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct SlotChange {
    /// Slots started.
    pub started: u32,
    /// Slots stopped.
    pub stopped: u32,
}

#[derive(Debug, Default)]
pub(super) struct QueueSim {
    backlog: VecDeque<Arrivals>,
    /// Σ of `backlog`'s counts.
    backlog_total: u64,
    /// Slots that work.
    active: u32,
    /// Slots still starting, oldest first.
    starting: VecDeque<Starting>,
    /// Handling capacity left over from the last step (less than one task).
    carry: f64,
    /// Mean handling time of the load arriving now.
    task_seconds: f64,
    /// Tasks that arrived: the queue's own counter (`enqueued_total`).
    pub arrived: u64,
    /// What its slots did, as a master counts it.
    pub work: WorkCounters,
    /// Waits (enqueue to start) in 10 ms buckets → tasks.
    waits: BTreeMap<u64, u64>,
    /// Σ slots over the steps, for the mean.
    pub slot_steps: u64,
    /// Σ |change| of its slots.
    pub slot_changes: u64,
    /// Largest backlog seen.
    pub max_backlog: u64,
}

impl QueueSim {
    /// Slots running or starting.
    #[inline]
    pub fn slots(&self) -> u32 {
        self.active + self.starting.iter().map(|s| s.count).sum::<u32>()
    }

    /// Tasks waiting or in work.
    pub fn backlog(&self) -> u64 {
        self.backlog_total
    }

    /// The backlog as the manager reads it: what its working slots hold (a batch each) is
    /// leased, the rest ready.
    pub fn split_backlog(&self, batch_size: u32) -> Backlog {
        let leased = self
            .backlog_total
            .min(u64::from(self.active) * u64::from(batch_size));
        Backlog {
            ready: self.backlog_total - leased,
            leased,
        }
    }

    /// Sets the queue's slots to `n` at `now_ms`; new ones work after `start_ms`.
    pub fn set_slots(&mut self, n: u32, now_ms: u64, start_ms: u64) -> SlotChange {
        let cur = self.slots();
        if n > cur {
            self.starting.push_back(Starting {
                ready_ms: now_ms + start_ms,
                count: n - cur,
            });
            self.slot_changes += u64::from(n - cur);
            return SlotChange {
                started: n - cur,
                stopped: 0,
            };
        }
        let mut drop = cur - n;
        self.slot_changes += u64::from(drop);
        let stopped = drop;
        // Slots still starting go first: they hold no work.
        while drop > 0 {
            let Some(last) = self.starting.back_mut() else {
                break;
            };
            let d = last.count.min(drop);
            last.count -= d;
            drop -= d;
            if last.count == 0 {
                self.starting.pop_back();
            }
        }
        self.active -= drop.min(self.active);
        SlotChange {
            started: 0,
            stopped,
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

    /// Slots whose start is done by `now_ms` work from now on.
    #[inline]
    pub fn start_ready(&mut self, now_ms: u64) {
        while self.starting.front().is_some_and(|s| s.ready_ms <= now_ms) {
            self.active += self.starting.pop_front().expect("checked").count;
        }
    }

    /// Its slots live `dt` seconds; returns the slot-seconds.
    #[inline]
    pub fn live(&mut self, dt: f64) -> f64 {
        let slots = self.slots();
        self.work.slot_lifetime_seconds += f64::from(slots) * dt;
        self.slot_steps += u64::from(slots);
        f64::from(slots) * dt
    }

    /// Its working slots handle the backlog for `dt` seconds at `now_ms`, oldest tasks
    /// first; returns the busy seconds.
    #[inline]
    pub fn handle(&mut self, now_ms: u64, dt: f64) -> f64 {
        let mut busy = 0.0;
        if self.task_seconds > 0.0 && self.active > 0 {
            let capacity = f64::from(self.active) * dt / self.task_seconds + self.carry;
            // `as` truncates and saturates (negatives and NaN to 0): floor without a
            // libm call per queue and step.
            let handled = (capacity as u64).min(self.backlog_total);
            self.carry = if handled == self.backlog_total {
                0.0
            } else {
                (capacity - handled as f64).min(1.0)
            };
            self.take(now_ms, handled);
            self.work.processed += handled;
            busy = handled as f64 * self.task_seconds;
            self.work.busy_seconds += busy;
        }
        self.max_backlog = self.max_backlog.max(self.backlog_total);
        busy
    }

    /// Starts the `n` oldest tasks at `now_ms`, keeping their waits.
    #[inline]
    fn take(&mut self, now_ms: u64, mut n: u64) {
        self.backlog_total -= n;
        while n > 0 {
            let front = self.backlog.front_mut().expect("n <= backlog_total");
            let k = front.count.min(n);
            let wait = now_ms.saturating_sub(front.at_ms);
            *self.waits.entry(wait / 10).or_default() += k;
            front.count -= k;
            n -= k;
            if front.count == 0 {
                self.backlog.pop_front();
            }
        }
    }

    /// The wait below which share `q` of the tasks started, ms.
    pub fn percentile(&self, q: f64) -> u64 {
        let total: u64 = self.waits.values().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (&bucket, &n) in &self.waits {
            seen += n;
            if seen >= rank {
                return bucket * 10;
            }
        }
        0
    }

    /// The longest wait, ms.
    pub fn max_wait(&self) -> u64 {
        self.waits.keys().next_back().map_or(0, |b| b * 10)
    }
}
