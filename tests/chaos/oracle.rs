//! The no-loss oracle (Jepsen's total-queue check): the producer records every task it
//! enqueues, the exec handler records every task it receives, Redis says where each task
//! ended; from the three, every task is counted as acked, lost, dead, unexpected or
//! duplicated, and every duplicate is explained by a fault or the run fails. The tasks'
//! records are checked against the same sources in `records.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gaffer::queue_client::{NewTask, Queue, TaskState};
use serde::Serialize;

use crate::faults::{Fault, FaultKind};
use crate::rng::Rng;

/// One task the producer got acknowledged by Redis (or a follow-up a chain must have
/// made, `chains.rs`).
#[derive(Debug, Clone, Serialize)]
pub struct Enqueued {
    /// Its queue.
    pub queue: String,
    /// Its id, unique across the run's queues.
    pub id: String,
    /// When Redis acknowledged it (Unix ms).
    pub acked_ms: u64,
    /// Calls it took: more than one means an earlier call failed without an answer,
    /// so Redis may or may not have applied it.
    pub calls: u32,
    /// Redis said a task with this id already existed. Ids are unique, so that is only
    /// right after an unanswered call that Redis had applied.
    pub existed: bool,
    /// The chain its enqueue answered it starts (a chain's global task the call created),
    /// or for a follow-up, the chain it is in.
    pub chain: Option<String>,
}

/// What the producer sends to a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Make {
    /// Plain tasks (`tNNNNNNN`) that sleep.
    Plain,
    /// Global tasks of chains (`cNNNNNNN`), to a queue whose route starts a chain of each
    /// (`chains.rs`).
    Chains,
}

impl Make {
    /// The next task: its id from `n`, its payload from `rng`.
    fn task(self, n: u64, rng: &mut Rng) -> NewTask {
        match self {
            Make::Plain => {
                let ms = rng.range(20, 400);
                NewTask::new(format!(r#"{{"action":"sleep","ms":{ms}}}"#)).id(format!("t{n:07}"))
            }
            Make::Chains => {
                let id = format!("c{n:07}");
                NewTask::new(crate::chains::payload(&id, rng)).id(id)
            }
        }
    }
}

/// Runs the producer until `stop` is set: `rate` tasks per second of what `make` makes,
/// with unique ids and payloads that make the exec handler sleep, so batches are in
/// flight when faults hit. A failed enqueue is retried with the same ids (the dedup id
/// makes that safe) until Redis acknowledges it, however long that takes, so every id
/// sent is accounted for.
pub async fn produce(
    queue: Queue,
    make: Make,
    rate: f64,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Vec<Enqueued> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let step = Duration::from_millis(200);
    let per_step = rate * step.as_secs_f64();
    let mut owed = 0.0;
    let mut next = 0u64;
    let mut tick = tokio::time::interval(step);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        owed += per_step;
        let n = owed.floor() as usize;
        owed -= n as f64;
        if n == 0 {
            continue;
        }
        let tasks: Vec<NewTask> = (0..n)
            .map(|_| {
                next += 1;
                make.task(next, &mut rng)
            })
            .collect();
        let mut calls = 0u32;
        let mut pause = Duration::from_millis(100);
        let results = loop {
            calls += 1;
            match queue.enqueue_many(&tasks).await {
                Ok(r) => break r,
                Err(e) => {
                    eprintln!(
                        "chaos: producer ({}): enqueue failed ({e}); retrying the same ids",
                        queue.name()
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        };
        let acked_ms = now_ms();
        for r in results {
            out.push(Enqueued {
                queue: queue.name().to_string(),
                existed: !r.created,
                id: r.id,
                acked_ms,
                calls,
                chain: r.chain,
            });
        }
    }
    out
}

/// One task as the exec handler received it (a line of its `GAFFER_EXEC_RECORD` file).
#[derive(Debug, Clone, Serialize)]
pub struct Handled {
    /// Its queue.
    pub queue: String,
    /// Task id.
    pub id: String,
    /// The attempt the queue handed it out as.
    pub attempt: u32,
    /// The slot (the exec child's parent).
    pub slot_pid: u32,
    /// When the handler received it (Unix ms).
    pub t_ms: u64,
}

/// Reads the handler's record: `queue id attempt slot_pid child_pid t_ms` per line.
/// Returns the records and the lines that could not be read.
pub fn read_handled(path: &Path) -> (Vec<Handled>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let parsed = (f.len() == 6)
            .then(|| {
                Some(Handled {
                    queue: f[0].to_string(),
                    id: f[1].to_string(),
                    attempt: f[2].parse().ok()?,
                    slot_pid: f[3].parse().ok()?,
                    t_ms: f[5].parse().ok()?,
                })
            })
            .flatten();
        match parsed {
            Some(h) => out.push(h),
            None => bad.push(line.to_string()),
        }
    }
    out.sort_by_key(|h| h.t_ms);
    (out, bad)
}

/// Why a task was handled more than once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Its slot was killed (kill -9) before settling; the lease expired.
    SlotKilled,
    /// Its master was killed, and the slot with it; the lease expired.
    MasterKilled,
    /// Its slot was stopped past the lease; the lease expired, another slot took it,
    /// and the late settle was rejected as stale.
    SlotStopped,
    /// Redis was frozen (SIGSTOP) past the lease: the lease expired on Redis's clock.
    RedisStopped,
    /// Redis was killed and restarted while the lease ran: the settle could not reach it
    /// before the lease expired.
    RedisKilled,
    /// A master was stopped while Redis was down: its slots could not settle before they
    /// were killed at its drain timeout, and the leases expired.
    MasterStoppedInOutage,
    /// The producer's enqueue failed without an answer after Redis had applied it, the
    /// task was done, and the retry created it again (dedup holds only while a task is
    /// pending or leased).
    EnqueueRetried,
    /// The primary was killed and a replica took its place (the failover profile): the
    /// lease expired while no primary answered, or the ack was lost with the old primary
    /// (written there, not yet sent to the replica), so the task ran again.
    Failover,
    /// The same attempt handled twice across a failover: the take that handed it out was
    /// lost with the old primary, so the new one handed the task out again as the same
    /// attempt.
    FailoverLostTake,
}

impl Cause {
    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            Cause::SlotKilled => "slot killed (kill -9 slot)",
            Cause::MasterKilled => "slot killed (kill -9 master)",
            Cause::SlotStopped => "lease expired (slot SIGSTOPped)",
            Cause::RedisStopped => "lease expired (Redis SIGSTOPped)",
            Cause::RedisKilled => "lease expired (Redis killed)",
            Cause::MasterStoppedInOutage => "lease expired (master SIGTERMed, Redis down)",
            Cause::EnqueueRetried => "enqueue retried after an unanswered call",
            Cause::Failover => "failover (lease expired, or ack lost)",
            Cause::FailoverLostTake => "failover (take lost: same attempt again)",
        }
    }
}

/// A task handled more than once, and why each extra handling happened.
#[derive(Debug, Clone, Serialize)]
pub struct Duplicate {
    /// Task id.
    pub id: String,
    /// Every handling, in time order.
    pub handled: Vec<Handled>,
    /// One cause per extra handling; None where no fault explains it.
    pub causes: Vec<Option<Cause>>,
}

/// What the oracle found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    /// Tasks to account for: those Redis acknowledged, and the follow-ups their chains
    /// must have made.
    pub enqueued: usize,
    /// Enqueued tasks that were handled and are gone from the queue.
    pub acked: usize,
    /// Enqueued tasks never acked: still in the queue after the drain, or gone without
    /// ever being handled.
    pub lost: Vec<String>,
    /// Tasks handled that were never enqueued (`QUEUE/ID`): no such id, or its id in
    /// another queue.
    pub unexpected: Vec<String>,
    /// Enqueued tasks in the dead letters (none expected: the handler never fails and
    /// `max_attempts` is high).
    pub dead: Vec<String>,
    /// Handlings in the record (every attempt).
    pub handlings: usize,
    /// Tasks handled more than once.
    pub duplicates: Vec<Duplicate>,
    /// Extra handlings per cause.
    pub by_cause: BTreeMap<Cause, usize>,
    /// Extra handlings no fault explains.
    pub unexplained: usize,
    /// Extra handlings per fault (index in the fault log).
    pub by_fault: BTreeMap<usize, usize>,
    /// Ids Redis said existed on their first enqueue: the dedup id matched a task that
    /// was never enqueued before.
    pub phantom_existing: Vec<String>,
    /// Handled tasks by the attempt they were handled as.
    pub attempts: BTreeMap<u32, usize>,
    /// What the tasks' records say, and where they disagree (see `records.rs`).
    pub records: crate::records::RecordVerdict,
}

/// Counts outcomes. `states` holds every enqueued id's state in Redis after the drain
/// (None: gone, which for a handled task means acked).
pub fn judge(
    enqueued: &[Enqueued],
    handled: &[Handled],
    states: &HashMap<String, Option<TaskState>>,
    faults: &[Fault],
    lease: Duration,
) -> Verdict {
    let mut v = Verdict {
        enqueued: enqueued.len(),
        handlings: handled.len(),
        ..Verdict::default()
    };
    let mut by_id: HashMap<&str, Vec<&Handled>> = HashMap::new();
    for h in handled {
        by_id.entry(&h.id).or_default().push(h);
        *v.attempts.entry(h.attempt).or_default() += 1;
    }
    let sent: HashMap<&str, &Enqueued> = enqueued.iter().map(|e| (e.id.as_str(), e)).collect();
    v.phantom_existing = enqueued
        .iter()
        .filter(|e| e.existed && e.calls == 1)
        .map(|e| e.id.clone())
        .collect();
    for e in enqueued {
        let was_handled = by_id.contains_key(e.id.as_str());
        match states.get(&e.id).copied().flatten() {
            None if was_handled => v.acked += 1,
            Some(TaskState::Dead) => v.dead.push(e.id.clone()),
            _ => v.lost.push(e.id.clone()),
        }
    }
    let unexpected: BTreeSet<String> = handled
        .iter()
        .filter(|h| sent.get(h.id.as_str()).is_none_or(|e| e.queue != h.queue))
        .map(|h| format!("{}/{}", h.queue, h.id))
        .collect();
    v.unexpected = unexpected.into_iter().collect();
    let mut dups: Vec<(&str, &Vec<&Handled>)> = by_id
        .iter()
        .filter(|(_, hs)| hs.len() > 1)
        .map(|(id, hs)| (*id, hs))
        .collect();
    dups.sort_by_key(|(id, _)| *id);
    for (id, hs) in dups {
        let found: Vec<Option<(Cause, Option<usize>)>> = hs
            .windows(2)
            .map(|w| cause(w[0], w[1], sent.get(id).copied(), faults, lease))
            .collect();
        for c in &found {
            match c {
                Some((c, fault)) => {
                    *v.by_cause.entry(*c).or_default() += 1;
                    if let Some(i) = fault {
                        *v.by_fault.entry(*i).or_default() += 1;
                    }
                }
                None => v.unexplained += 1,
            }
        }
        let causes = found.into_iter().map(|c| c.map(|(c, _)| c)).collect();
        v.duplicates.push(Duplicate {
            id: id.to_string(),
            handled: hs.iter().map(|h| (*h).clone()).collect(),
            causes,
        });
    }
    v
}

/// Why `first` was not the last handling of its task, given that `next` followed: the
/// fault that stopped its slot from settling, or made its lease expire (with its index in
/// `faults`).
fn cause(
    first: &Handled,
    next: &Handled,
    sent: Option<&Enqueued>,
    faults: &[Fault],
    lease: Duration,
) -> Option<(Cause, Option<usize>)> {
    // The exec child records each task of a batch as it reaches it, so a slot can be
    // frozen or killed slightly before a record of its batch is written.
    let slack = 2_000;
    let (from, to) = (first.t_ms, next.t_ms);
    let overlaps = |f: &Fault, before: u64| f.start_ms <= to && f.end_ms + before >= from;
    // A Redis outage can strand a lease taken up to a lease before the handling.
    let before = lease.as_millis() as u64 + slack;
    let failover = || {
        faults
            .iter()
            .position(|f| f.kind == FaultKind::Failover && f.injected && overlaps(f, before))
    };
    // The same attempt handed out twice: only a take lost with a failed-over primary.
    if next.attempt <= first.attempt
        && let Some(i) = failover()
    {
        return Some((Cause::FailoverLostTake, Some(i)));
    }
    // A handling as attempt 1 after another one means the task was created twice.
    if next.attempt == 1 {
        return sent
            .filter(|e| e.calls > 1)
            .map(|_| (Cause::EnqueueRetried, None));
    }
    let own = |f: &Fault| f.pids.contains(&first.slot_pid);
    let found = |kind: FaultKind, pid_specific: bool, before: u64| {
        faults
            .iter()
            .position(|f| f.kind == kind && overlaps(f, before) && (!pid_specific || own(f)))
    };
    [
        (FaultKind::SlotKill, true, slack, Cause::SlotKilled),
        (FaultKind::MasterKill, true, slack, Cause::MasterKilled),
        (FaultKind::SlotStop, true, slack, Cause::SlotStopped),
        (FaultKind::RedisStop, false, before, Cause::RedisStopped),
        (FaultKind::RedisKill, false, before, Cause::RedisKilled),
        (
            FaultKind::MasterTermInOutage,
            false,
            before,
            Cause::MasterStoppedInOutage,
        ),
        (FaultKind::Failover, false, before, Cause::Failover),
    ]
    .into_iter()
    .find_map(|(kind, own, before, cause)| found(kind, own, before).map(|i| (cause, Some(i))))
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
