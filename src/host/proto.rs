//! What a slot and its master say to each other: the [`SlotSpec`] the zygote hands a
//! forked slot, the [`SlotEvent`] datagrams a slot sends its master, and the exit codes
//! the master reads its end by.
//!
//! Neutral ground: the master (and its zygote) and the slots import it, and it imports
//! neither. Public as `gaffer::slot::{SlotSpec, SlotEvent, EXIT_…}`.
//!
//! The slot events are one datagram each on a socketpair whose other end the master hands
//! to the zygote, and through it to every slot: `Ready`, `BatchStarted`, `Progress`,
//! `BatchDone{tasks, failed, busy_ms, stale, next?, start_delays?}`, `Idle`, `Outside{outside}`,
//! `Exiting`. Best effort: a slot never blocks on a send, and a datagram the socket cannot
//! take is lost. A `BatchDone` whose `next` is set also starts the batch its settle took
//! (no `BatchStarted` for it), so the steady state costs one datagram per batch; `Idle`
//! says such a batch went back unstarted.
//!
//! `Outside` names the slot's process outside its own tree (`SlotContext::outside`: a
//! `start = "fork"` exec child, which is its language zygote's child, not the slot's), or
//! null once there is none. The slot sends it after init, between batches when it changed,
//! and every 30 s while it is set, so a dropped datagram heals; the master counts that
//! process's tree as the slot's memory.
//!
//! The protocol is internal to one binary: a new event is added as a new `ev` tag with
//! fields that have defaults, and the master drops (with a warning) a datagram it cannot
//! read rather than failing. Exit codes: [`EXIT_STOPPED`] (asked to stop), [`EXIT_RECYCLE`]
//! (restart at once), [`EXIT_FATAL`]; anything else is a crash.

use std::os::unix::net::UnixDatagram;

use serde::{Deserialize, Serialize};

use crate::config::QueueConfig;
use crate::queue_client::ConnectOptions;

/// Exit code of a slot that was asked to stop (SIGTERM) and did.
pub const EXIT_STOPPED: i32 = 0;
/// Exit code of a slot that recycled itself because its Private_Dirty passed the limit;
/// the master restarts it at once (EX_TEMPFAIL).
pub const EXIT_RECYCLE: i32 = 75;
/// Exit code of a slot that could not start or hit an unrecoverable error (EX_SOFTWARE).
pub const EXIT_FATAL: i32 = 70;

/// The signal a master sends a slot busy with a long task that it would stop if it could
/// (one of an older zygote's, or beyond what the map wants of its queue): finish the task
/// in hand, then exit ([`EXIT_STOPPED`]) instead of taking another. SIGTERM would hand
/// the task back (a drain); this lets it end by itself.
pub const RETIRE_SIGNAL: i32 = libc::SIGUSR1;

/// What a slot needs to run, handed over by the zygote in the forked child.
#[derive(Debug)]
pub struct SlotSpec {
    /// The queue it serves.
    pub queue: QueueConfig,
    /// The master's number for it.
    pub slot: u32,
    /// Redis to connect to (after the fork: never a connection inherited from the parent).
    pub redis_url: String,
    /// Key namespace.
    pub namespace: String,
    /// Password and timeouts.
    pub connect: ConnectOptions,
    /// Where to send [`SlotEvent`]s for the master; none outside a master.
    pub report: Option<UnixDatagram>,
    /// The host's name, as task records show where an attempt ran.
    pub host: String,
    /// The queues follow-ups may go to (every queue of the config).
    pub chains: std::sync::Arc<crate::chain::ChainTargets>,
    /// The slot's end of its fork line, for a `start = "fork"` exec queue's slot: how its
    /// handler asks the queue's language zygote for a child (the fork line: README, "Handlers").
    pub fork_line: Option<std::os::unix::net::UnixStream>,
}

/// What a slot tells its master, one datagram each (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum SlotEvent {
    /// Connected and initialised; about to take its first batch.
    Ready {
        /// The master's number for the slot.
        slot: u32,
        /// Its pid.
        pid: u32,
    },
    /// A batch was taken and handed to the handler.
    BatchStarted {
        /// The master's number for the slot.
        slot: u32,
        /// Its pid.
        pid: u32,
        /// Tasks in the batch.
        tasks: u32,
    },
    /// The handler says it is still working (a long batch).
    Progress {
        /// The master's number for the slot.
        slot: u32,
        /// Its pid.
        pid: u32,
    },
    /// A batch was handled and settled; or several in a row, summed (the slot holds
    /// batch ends that follow a datagram closely, and sends them as one).
    BatchDone {
        /// The master's number for the slot.
        slot: u32,
        /// Its pid.
        pid: u32,
        /// How many batches this stands for (absent: one).
        #[serde(default = "one_batch", skip_serializing_if = "is_one_batch")]
        batches: u32,
        /// Tasks settled: the batch, less the unstarted rest a stop gave back.
        tasks: u32,
        /// Tasks whose outcome was not done.
        failed: u32,
        /// Time inside the handler, in ms.
        busy_ms: u64,
        /// Settles refused because the lease had moved on.
        stale: u32,
        /// Tasks of the next batch, already in hand (taken with this one's settle) and
        /// handed to the handler next: this datagram then stands for that batch's
        /// [`SlotEvent::BatchStarted`] too, one datagram per batch in a slot's steady state
        /// instead of two (sending two was 7 % of a no-op slot's time).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<u32>,
        /// How long the batch's first attempts waited from their enqueue to their start,
        /// counted into `START_DELAY_BUCKETS`.
        #[serde(default, skip_serializing_if = "StartDelays::is_empty")]
        start_delays: StartDelays,
    },
    /// The batch a [`SlotEvent::BatchDone`] said was next went back to the queue unstarted
    /// (its lease ran out before the handler was free): the slot is idle.
    Idle {
        /// The master's number for the slot.
        slot: u32,
        /// Its pid.
        pid: u32,
    },
    /// The slot's process outside its own process tree changed
    /// ([`crate::host::handler::SlotContext::outside`]: a `start = "fork"` exec child,
    /// which its language zygote forked, not the slot): the master counts that process's
    /// tree as the slot's memory. Sent after init and between batches when it changed,
    /// and again now and then while it is set (a datagram may be dropped).
    Outside {
        /// The master's number for the slot.
        slot: u32,
        /// Its pid.
        pid: u32,
        /// The outside process; none any more when null.
        outside: Option<u32>,
    },
    /// About to exit, and why.
    Exiting {
        /// The master's number for the slot.
        slot: u32,
        /// Its pid.
        pid: u32,
        /// The exit code it is about to return.
        code: i32,
        /// Why, for the master's log.
        reason: String,
    },
}

fn one_batch() -> u32 {
    1
}

fn is_one_batch(n: &u32) -> bool {
    *n == 1
}

impl SlotEvent {
    /// Adds the batch end `later` into this one, when both are [`SlotEvent::BatchDone`]s:
    /// counts and times summed, `later`'s next batch. Anything else is left as it is.
    pub fn absorb(&mut self, later: &SlotEvent) {
        if let (
            SlotEvent::BatchDone {
                batches,
                tasks,
                failed,
                busy_ms,
                stale,
                next,
                start_delays,
                ..
            },
            SlotEvent::BatchDone {
                batches: b,
                tasks: t,
                failed: f,
                busy_ms: ms,
                stale: s,
                next: n,
                start_delays: d,
                ..
            },
        ) = (self, later)
        {
            *batches += b;
            *tasks += t;
            *failed += f;
            *busy_ms += ms;
            *stale += s;
            *next = *n;
            start_delays.add(d);
        }
    }

    /// The pid of the slot that sent it.
    pub fn pid(&self) -> u32 {
        match self {
            SlotEvent::Ready { pid, .. }
            | SlotEvent::BatchStarted { pid, .. }
            | SlotEvent::Progress { pid, .. }
            | SlotEvent::BatchDone { pid, .. }
            | SlotEvent::Idle { pid, .. }
            | SlotEvent::Outside { pid, .. }
            | SlotEvent::Exiting { pid, .. } => *pid,
        }
    }

    /// The master's number of the slot that sent it.
    pub fn slot(&self) -> u32 {
        match self {
            SlotEvent::Ready { slot, .. }
            | SlotEvent::BatchStarted { slot, .. }
            | SlotEvent::Progress { slot, .. }
            | SlotEvent::BatchDone { slot, .. }
            | SlotEvent::Idle { slot, .. }
            | SlotEvent::Outside { slot, .. }
            | SlotEvent::Exiting { slot, .. } => *slot,
        }
    }
}

/// The upper bounds (seconds) of the buckets of the enqueue-to-start histogram
/// (`gaffer_task_start_delay_seconds`): from "at once" to "an hour late", so an alert on
/// "started within 15 minutes" reads a bucket's count rather than an estimate.
pub const START_DELAY_BUCKETS: [f64; 16] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0,
    7200.0,
];

/// Enqueue-to-start delays of a batch's tasks, as per-bucket counts and sums (only the
/// buckets that have any): a datagram stays a few bytes whatever the batch's size, and
/// the master's histogram gets each bucket's count and the exact total of the delays
/// (each bucket recorded as its count times its mean, which lies inside the bucket).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartDelays(pub Vec<(u8, u32, u64)>);

impl StartDelays {
    /// Whether no delay was counted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Counts one delay of `ms` milliseconds (past the last bound: in the last bucket's
    /// place after it, Prometheus's `+Inf`).
    pub fn count(&mut self, ms: u64) {
        let secs = ms as f64 / 1000.0;
        let bucket = START_DELAY_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(START_DELAY_BUCKETS.len()) as u8;
        self.add_to(bucket, 1, ms);
    }

    /// Adds `other`'s counts and sums to these.
    pub fn add(&mut self, other: &StartDelays) {
        for &(bucket, n, sum) in &other.0 {
            self.add_to(bucket, n, sum);
        }
    }

    /// Adds `n` delays summing to `sum` ms to `bucket`.
    fn add_to(&mut self, bucket: u8, n: u32, sum: u64) {
        match self.0.iter_mut().find(|(b, _, _)| *b == bucket) {
            Some((_, count, total)) => {
                *count += n;
                *total += sum;
            }
            None => self.0.push((bucket, n, sum)),
        }
    }

    /// Each counted bucket as (the mean delay in seconds, how many).
    pub fn means(&self) -> impl Iterator<Item = (f64, usize)> + '_ {
        self.0
            .iter()
            .filter(|(_, n, _)| *n > 0)
            .map(|&(_, n, sum)| (sum as f64 / 1000.0 / f64::from(n), n as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_delays_added_are_the_counts_and_sums_of_both() {
        let (mut a, mut b) = (StartDelays::default(), StartDelays::default());
        a.count(3);
        b.count(4);
        b.count(20);
        a.add(&b);
        assert_eq!(a.0, vec![(0, 2, 7), (1, 1, 20)]);
    }

    #[test]
    fn a_batch_done_that_names_no_count_of_batches_stands_for_one() {
        let line =
            r#"{"ev":"batch_done","slot":1,"pid":2,"tasks":3,"failed":0,"busy_ms":1,"stale":0}"#;
        let ev: SlotEvent = serde_json::from_str(line).expect("a batch end");
        assert!(matches!(ev, SlotEvent::BatchDone { batches: 1, .. }));
        assert_eq!(serde_json::to_string(&ev).expect("json"), line);
        let SlotEvent::BatchDone { tasks, .. } = ev else {
            unreachable!()
        };
        let two = SlotEvent::BatchDone {
            slot: 1,
            pid: 2,
            batches: 2,
            tasks,
            failed: 0,
            busy_ms: 1,
            stale: 0,
            next: None,
            start_delays: StartDelays::default(),
        };
        let back: SlotEvent =
            serde_json::from_str(&serde_json::to_string(&two).expect("json")).expect("parse");
        assert_eq!(back, two);
    }

    #[test]
    fn start_delays_keep_each_buckets_count_and_sum() {
        let mut d = StartDelays::default();
        for ms in [3, 4, 20, 2_000, 5_000_000, 9_000_000] {
            d.count(ms);
        }
        // 3 and 4 ms in the first bucket, 20 ms in the second, 2 s in "≤ 2.5 s", 5000 s
        // in "≤ 7200 s", 9000 s past every bound
        assert_eq!(
            d.0,
            vec![
                (0, 2, 7),
                (1, 1, 20),
                (6, 1, 2_000),
                (15, 1, 5_000_000),
                (16, 1, 9_000_000)
            ]
        );
        let means: Vec<(f64, usize)> = d.means().collect();
        assert_eq!(means[0], (0.0035, 2));
        // every mean falls in its own bucket, so the histogram's counts are exact
        for ((b, _, _), (mean, _)) in d.0.iter().zip(&means) {
            let hi = START_DELAY_BUCKETS
                .get(*b as usize)
                .copied()
                .unwrap_or(f64::INFINITY);
            let lo = if *b == 0 {
                0.0
            } else {
                START_DELAY_BUCKETS[*b as usize - 1]
            };
            assert!(*mean > lo && *mean <= hi, "{mean} outside ({lo}, {hi}]");
        }
        let text = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<StartDelays>(&text).unwrap(), d);
    }

    #[test]
    fn the_outside_event_reads_back_and_names_its_slot() {
        let ev = SlotEvent::Outside {
            slot: 3,
            pid: 40,
            outside: Some(41),
        };
        let text = serde_json::to_string(&ev).unwrap();
        assert_eq!(text, r#"{"ev":"outside","slot":3,"pid":40,"outside":41}"#);
        assert_eq!(serde_json::from_str::<SlotEvent>(&text).unwrap(), ev);
        assert_eq!((ev.slot(), ev.pid()), (3, 40));
        let gone: SlotEvent =
            serde_json::from_str(r#"{"ev":"outside","slot":3,"pid":40,"outside":null}"#).unwrap();
        assert_eq!(
            gone,
            SlotEvent::Outside {
                slot: 3,
                pid: 40,
                outside: None
            }
        );
        // The events a slot sent before this one existed read as they did.
        let done: SlotEvent = serde_json::from_str(
            r#"{"ev":"batch_done","slot":1,"pid":2,"tasks":3,"failed":0,"busy_ms":5,"stale":0}"#,
        )
        .unwrap();
        assert_eq!(done.slot(), 1);
    }
}
