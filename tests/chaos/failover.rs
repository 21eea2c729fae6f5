//! The failover profile (`scripts/chaos failover --redis sentinel|cluster-replicas
//! [--wait-replicas N]`): the batch profiles' cluster of roles, producer and running
//! slots on Redis with replicas (`redis.rs`): a Sentinel group (a primary, a replica and
//! three Sentinels) or a Redis Cluster of three masters with a replica each. After a
//! warm-up, the primary serving the run's first queue is killed (kill -9) under load, and
//! a replica takes its place; the harness measures how long until work flows again,
//! restarts the killed node (it comes back as a replica) and waits until it is one in
//! sync, then does it all once more (the second kill hits the new primary). Then the
//! producer stops, the queues drain, and the batch profiles' oracle counts what the
//! failovers cost.
//!
//! `--freeze` freezes the primary (SIGSTOP) instead of killing it and wakes it (SIGCONT)
//! once a replica has taken its place: a primary cut off from the Sentinels or the
//! cluster but not from every client, which comes back stale and may take writes until it
//! is made a replica (Sentinel waits some seconds before it does; a cluster node learns at
//! once). A kill -9 on one machine loses next to nothing: Redis writes the replication
//! stream in the same pass as the replies, and the kernel delivers what was written
//! after the process died.
//!
//! A failover can lose what the old primary acknowledged and had not yet sent its
//! replica: with `wait_replicas = 0` that is expected, so the oracle counts it rather
//! than failing the run: **lost** (acknowledged enqueues gone), **run twice** (tasks
//! handled again: a lease that expired while no primary answered, an ack lost with the
//! primary, or a take lost with it, which hands the same attempt out twice), **records
//! wrong** (histories that miss what the handler did, near a failover) and the queues'
//! counters that disagree. The verdict: work must resume within the topology's failover
//! time + 5 s after each kill ([`bound`]); with `wait_replicas` ≥ 1, lost must be 0; with 0,
//! lost tasks are counted and printed prominently but do not fail the run. Everything
//! else the batch profiles check still fails it (an unexplained duplicate, a record
//! wrong far from any failover, a role crashed, a process left behind, a failover that
//! Redis made without a kill).
//!
//! "Work flows again" is the first ack, after the kill, of a task of a queue the killed
//! primary served (its `done` entry in the task's record, on Redis's clock, read after
//! the drain); the first take after the kill and the moment the harness's own client saw
//! the queue's `acked_total` grow are reported beside it, and so is when Redis named the
//! new primary (Sentinel's `get-master-addr-by-name`, or the seed node's `CLUSTER
//! NODES`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use gaffer::queue_client::{RecordState, TaskRecord};
use serde::Serialize;

use crate::cluster::Cluster;
use crate::faults::{Fault, FaultKind};
use crate::oracle::{Cause, Enqueued, now_ms};
use crate::records::RecordMismatch;
use crate::redis::{DOWN_AFTER, FAILOVER_TIMEOUT, NODE_TIMEOUT, Topology};
use nix::sys::signal::Signal;

/// Kills of a primary per run.
const KILLS: usize = 2;
/// Load before the first kill.
const WARM_UP: Duration = Duration::from_secs(15);
/// Load between a killed node's return and the next kill (Sentinel refuses to fail the
/// same group over again within twice its failover timeout, 6 s here, of the last).
const BETWEEN: Duration = Duration::from_secs(10);
/// Load after the last return, before the producer stops.
const TAIL: Duration = Duration::from_secs(8);
/// What the acceptance bound allows beyond the topology's own failover time.
const SLACK: Duration = Duration::from_secs(5);
/// How long the harness watches for work to flow after a kill, beyond the bound, before
/// it restarts the killed node all the same.
const WATCH_PAST_BOUND: Duration = Duration::from_secs(15);
/// How long a restarted node may take to be a replica in sync, seen as one.
const REJOIN_LIMIT: Duration = Duration::from_secs(60);
/// How far from a failover (before its kill, after its end) a record mismatch is put down
/// to it: a lease, and the time a batch takes to be handled and settled.
const NEAR: Duration = Duration::from_secs(10);

/// The topology's failover time and the acceptance bound on resuming work (that time +
/// 5 s), with how it is made up.
pub fn bound(topology: Topology) -> (Duration, String) {
    match topology {
        Topology::Sentinel => (
            DOWN_AFTER + FAILOVER_TIMEOUT + SLACK,
            format!(
                "down-after {} ms + failover-timeout {} ms + {} s",
                DOWN_AFTER.as_millis(),
                FAILOVER_TIMEOUT.as_millis(),
                SLACK.as_secs()
            ),
        ),
        _ => {
            // A replica starts its election within 500 ms + 0–500 ms of seeing its master
            // failed (rank 0: the only replica), and the election may take twice the node
            // timeout, at least 2 s (`cluster.c`'s auth timeout).
            let delay = Duration::from_millis(1000);
            let election = (NODE_TIMEOUT * 2).max(Duration::from_secs(2));
            (
                NODE_TIMEOUT + delay + election + SLACK,
                format!(
                    "node-timeout {} ms + election delay {} ms + election {} ms + {} s",
                    NODE_TIMEOUT.as_millis(),
                    delay.as_millis(),
                    election.as_millis(),
                    SLACK.as_secs()
                ),
            )
        }
    }
}

/// One kill of a primary and what followed, in seconds from the kill.
#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    /// 1 for the first kill, 2 for the second.
    pub n: usize,
    /// The node killed, with its pid.
    pub killed: String,
    /// The replica that took its place (as Redis named it).
    pub promoted: Option<String>,
    /// The queues the killed primary served.
    pub queues: Vec<String>,
    /// When it was killed (Unix ms).
    pub kill_ms: u64,
    /// When Redis declared the failover done, by its log (Sentinel's `+switch-master`,
    /// the promoted replica's `Failover election won`).
    pub declared_s: Option<f64>,
    /// When the harness, polling every 50 ms or so, found the new primary named where
    /// the roles ask (a Sentinel, or the seed node's view of the cluster).
    pub named_s: Option<f64>,
    /// When the harness's own client saw the queues' `acked_total` grow again.
    pub seen_flowing_s: Option<f64>,
    /// The first take of a task of those queues after the kill (its record's running
    /// entry).
    pub first_take_s: Option<f64>,
    /// The first ack of a task of those queues after the kill (its record's done entry):
    /// work flows again.
    pub resumed_s: Option<f64>,
    /// When the killed node, restarted, was a replica in sync, seen as one by whoever
    /// decides the next failover.
    pub rejoined_s: Option<f64>,
    /// What was seen on the way.
    pub notes: Vec<String>,
}

/// What the failovers cost, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// `sentinel` or `cluster-replicas`.
    pub topology: String,
    /// The roles' `[cluster] wait_replicas`.
    pub wait_replicas: u32,
    /// `--freeze`: the primary frozen (SIGSTOP) instead of killed, woken (SIGCONT) once
    /// a replica has taken its place: a primary cut off, which comes back stale.
    pub freeze: bool,
    /// How long work may take to flow again after a kill, in seconds.
    pub bound_s: f64,
    /// What the bound is made of.
    pub bound: String,
    /// Each kill.
    pub failovers: Vec<Failover>,
    /// When Redis logged a failover (Unix ms; Sentinel's `+switch-master`, a cluster's
    /// `Failover election won`): one per kill, or something failed over on its own.
    pub failovers_logged: Vec<u64>,
    /// Acknowledged tasks lost (the oracle's lost).
    pub lost: usize,
    /// Tasks handled more than once.
    pub run_twice: usize,
    /// Their extra handlings put down to a failover: a lease expired while no primary
    /// answered, or an ack lost with the primary.
    pub again_after_failover: usize,
    /// Extra handlings as the same attempt: a take lost with the primary.
    pub same_attempt_again: usize,
    /// Records that disagree with the handler near a failover (lost writes).
    pub records_wrong: Vec<RecordMismatch>,
    /// What the chain check found wrong (a failover's lost writes can break a chain).
    pub chains_wrong: Vec<String>,
    /// Where the queues' counters disagree with the oracle (their increments lost with
    /// the writes).
    pub counters_wrong: Vec<String>,
}

impl Figures {
    /// Empty figures for a run on `topology` with `wait_replicas`.
    pub fn new(topology: Topology, wait_replicas: u32, freeze: bool) -> Self {
        let (b, text) = bound(topology);
        Figures {
            topology: topology.name().into(),
            wait_replicas,
            freeze,
            bound_s: b.as_secs_f64(),
            bound: text,
            failovers: Vec::new(),
            failovers_logged: Vec::new(),
            lost: 0,
            run_twice: 0,
            again_after_failover: 0,
            same_attempt_again: 0,
            records_wrong: Vec::new(),
            chains_wrong: Vec::new(),
            counters_wrong: Vec::new(),
        }
    }

    /// Whether a lost task fails the run: only when the roles wait for a replica.
    pub fn lost_fails(&self) -> bool {
        self.wait_replicas > 0
    }
}

/// The fault phase: warm-up, then [`KILLS`] failovers, each followed by the killed
/// node's return and more load. Returns the fault log (one `Failover` fault per kill)
/// and fills `fig.failovers`.
pub fn phase(c: &mut Cluster, fig: &mut Figures, started: Instant) -> Vec<Fault> {
    let mut faults = Vec::new();
    c.idle(WARM_UP);
    for n in 1..=KILLS {
        let (f, one) = fail_over(c, n, fig.bound_s, fig.freeze);
        eprintln!(
            "chaos: {:>6.1} s  failover #{n}: {} → {}; named after {}, acks seen after {}, \
             back as a replica after {}{}",
            started.elapsed().as_secs_f64(),
            one.killed,
            one.promoted.as_deref().unwrap_or("none"),
            secs(one.named_s),
            secs(one.seen_flowing_s),
            secs(one.rejoined_s),
            if f.problems.is_empty() {
                String::new()
            } else {
                format!(" PROBLEMS: {}", f.problems.join("; "))
            }
        );
        faults.push(f);
        fig.failovers.push(one);
        c.idle(if n < KILLS { BETWEEN } else { TAIL });
    }
    fig.failovers_logged = c.redis.failovers_logged();
    // Each kill's failover: the first Redis logged after it.
    for one in &mut fig.failovers {
        one.declared_s = fig
            .failovers_logged
            .iter()
            .find(|&&t| t >= one.kill_ms)
            .map(|&t| (t - one.kill_ms) as f64 / 1000.0);
    }
    faults
}

/// `1.2 s`, or `never`.
fn secs(s: Option<f64>) -> String {
    s.map_or("never".into(), |s| format!("{s:.1} s"))
}

/// The acked counters of `queues`, summed, when Redis answers within 300 ms (so that
/// the watch after a kill polls often).
fn acked(c: &Cluster, queues: &[String]) -> Option<u64> {
    let mut sum = 0;
    for q in queues {
        sum += c
            .call(Duration::from_millis(300), c.queue(q).stats())?
            .acked_total;
    }
    Some(sum)
}

/// One failover: kill -9 the primary of the run's first queue (or freeze it), watch until
/// Redis names another and acks flow again (or the bound and [`WATCH_PAST_BOUND`] pass),
/// restart the killed node (or wake it) and wait until it is a replica in sync. The fault
/// lasts until then: a node back as a stale primary (a woken one, or a Sentinel group's
/// restarted as configured) may take writes that are lost when it becomes a replica.
fn fail_over(c: &mut Cluster, n: usize, bound_s: f64, freeze: bool) -> (Fault, Failover) {
    let mut f = Fault::new(FaultKind::Failover);
    let mut one = Failover {
        n,
        killed: String::new(),
        promoted: None,
        queues: Vec::new(),
        kill_ms: 0,
        declared_s: None,
        named_s: None,
        seen_flowing_s: None,
        first_take_s: None,
        resumed_s: None,
        rejoined_s: None,
        notes: Vec::new(),
    };
    let Some(target) = c.redis.primary() else {
        f.injected = false;
        f.problems
            .push("no primary of the run's first queue to kill".into());
        return (f, one);
    };
    let Some(pid) = c.redis.pid(target) else {
        f.injected = false;
        f.problems
            .push(format!("{} is not running", c.redis.name(target)));
        return (f, one);
    };
    let queued: BTreeSet<&str> = c.shape.queues().iter().map(|(q, _)| *q).collect();
    let served = c.redis.serving(target);
    one.queues = served
        .iter()
        .filter(|t| queued.contains(t.as_str()))
        .cloned()
        .collect();
    one.killed = format!(
        "{} ({pid}; primary of {})",
        c.redis.name(target),
        served.join(" ")
    );
    f.target = one.killed.clone();
    f.pids.insert(pid);
    let before = acked(c, &one.queues);
    let start = Instant::now();
    if freeze {
        if let Err(e) = c.redis.signal(target, Signal::SIGSTOP) {
            f.problems.push(e);
            f.injected = false;
            return (f, one);
        }
    } else {
        c.redis.kill(target);
    }
    f.start_ms = now_ms();
    one.kill_ms = f.start_ms;
    // Watch: who Redis names, and whether the harness's client sees acks again.
    let deadline = start + Duration::from_secs_f64(bound_s) + WATCH_PAST_BOUND;
    let mut promoted = None;
    let mut low = before;
    while Instant::now() < deadline && (promoted.is_none() || one.seen_flowing_s.is_none()) {
        if promoted.is_none()
            && let Some(p) = c.redis.primary().filter(|&p| p != target)
        {
            promoted = Some(p);
            one.named_s = Some(start.elapsed().as_secs_f64());
            one.promoted = Some(c.redis.name(p));
        }
        if one.seen_flowing_s.is_none()
            && let Some(now) = acked(c, &one.queues)
        {
            // (the new primary may have lost acks: its count can start below the old one's)
            match low {
                Some(l) if now > l => one.seen_flowing_s = Some(start.elapsed().as_secs_f64()),
                Some(l) if now < l => low = Some(now),
                Some(_) => {}
                None => low = Some(now),
            }
        }
        c.check_roles();
        std::thread::sleep(Duration::from_millis(50));
    }
    let back_up = |c: &mut Cluster| {
        if freeze {
            c.redis.signal(target, Signal::SIGCONT)
        } else {
            c.redis.restart(target)
        }
    };
    let Some(now) = promoted else {
        f.problems.push(format!(
            "Redis named no new primary within {:.0} s of the kill",
            start.elapsed().as_secs_f64()
        ));
        if let Err(e) = back_up(c) {
            f.problems.push(e);
        }
        f.end_ms = now_ms();
        return (f, one);
    };
    if let Err(e) = back_up(c) {
        f.problems.push(e);
        f.end_ms = now_ms();
        return (f, one);
    }
    one.notes.push(format!(
        "{} {:.1} s after the kill",
        if freeze { "woken" } else { "restarted" },
        start.elapsed().as_secs_f64()
    ));
    let back = Instant::now();
    loop {
        if c.redis.rejoined(target, now) {
            one.rejoined_s = Some(start.elapsed().as_secs_f64());
            break;
        }
        if back.elapsed() > REJOIN_LIMIT {
            f.problems.push(format!(
                "{} was not a replica of {} in sync within {REJOIN_LIMIT:?} of its restart",
                c.redis.name(target),
                c.redis.name(now)
            ));
            break;
        }
        c.idle(Duration::from_millis(200));
    }
    f.end_ms = now_ms();
    (f, one)
}

/// After the drain: when work flowed again after each kill, from the tasks' records
/// (the first take and the first ack, on Redis's clock, of a task of a queue the killed
/// primary served); and the oracle's counts of what the failovers cost.
pub fn measure(
    fig: &mut Figures,
    all: &[Enqueued],
    recs: &HashMap<String, Option<TaskRecord>>,
    verdict: &crate::oracle::Verdict,
) {
    let queue_of: HashMap<&str, &str> = all
        .iter()
        .map(|e| (e.id.as_str(), e.queue.as_str()))
        .collect();
    for one in &mut fig.failovers {
        let mut take: Option<i64> = None;
        let mut ack: Option<i64> = None;
        for (id, r) in recs {
            let (Some(q), Some(r)) = (queue_of.get(id.as_str()), r) else {
                continue;
            };
            if !one.queues.iter().any(|x| x == q) {
                continue;
            }
            for h in r.history.iter().flatten() {
                let Some(at) = ms(&h.at) else { continue };
                if at <= one.kill_ms as i64 {
                    continue;
                }
                let slot = match h.state {
                    RecordState::Running => &mut take,
                    RecordState::Done => &mut ack,
                    _ => continue,
                };
                *slot = Some(slot.map_or(at, |t| t.min(at)));
            }
        }
        let since = |t: Option<i64>| t.map(|t| (t - one.kill_ms as i64) as f64 / 1000.0);
        one.first_take_s = since(take);
        one.resumed_s = since(ack);
    }
    fig.lost = verdict.lost.len();
    fig.run_twice = verdict.duplicates.len();
    fig.again_after_failover = verdict.by_cause.get(&Cause::Failover).copied().unwrap_or(0);
    fig.same_attempt_again = verdict
        .by_cause
        .get(&Cause::FailoverLostTake)
        .copied()
        .unwrap_or(0);
}

/// The failovers' verdict beyond the oracle's: work resumed within the bound after each
/// kill, and Redis failed over once per kill and never on its own. Returns the problems.
pub fn judge(fig: &Figures) -> Vec<String> {
    let mut out = Vec::new();
    for one in &fig.failovers {
        match one.resumed_s {
            Some(s) if s <= fig.bound_s => {}
            Some(s) => out.push(format!(
                "failover #{}: work resumed {s:.1} s after the kill, past the bound of {:.0} s \
                 ({})",
                one.n, fig.bound_s, fig.bound
            )),
            None => out.push(format!(
                "failover #{}: no task of {} was acked after the kill",
                one.n,
                one.queues.join(", ")
            )),
        }
    }
    if fig.failovers.len() != KILLS {
        out.push(format!(
            "{} of {KILLS} failovers were made",
            fig.failovers.len()
        ));
    }
    if fig.failovers_logged.len() != fig.failovers.len() {
        out.push(format!(
            "Redis logged {} failovers for {} kills: something failed over on its own \
             (a node too slow for its timeout?), or a kill was not failed over",
            fig.failovers_logged.len(),
            fig.failovers.len()
        ));
    }
    out
}

/// Moves the record mismatches near a failover (from [`NEAR`] before its kill to
/// [`NEAR`] after its end, by the task's enqueue, any handler run or any history entry)
/// out of `mismatches` into `fig.records_wrong`: lost writes, counted, not failing the run.
/// The others stay, and fail it.
pub fn attribute_records(
    fig: &mut Figures,
    mismatches: &mut Vec<RecordMismatch>,
    all: &[Enqueued],
    recs: &HashMap<String, Option<TaskRecord>>,
    faults: &[Fault],
) {
    let windows: Vec<(i64, i64)> = faults
        .iter()
        .filter(|f| f.kind == FaultKind::Failover && f.injected)
        .map(|f| {
            let near = NEAR.as_millis() as i64;
            (f.start_ms as i64 - near, f.end_ms as i64 + near)
        })
        .collect();
    let near = |t: i64| windows.iter().any(|&(a, b)| (a..=b).contains(&t));
    let acked: BTreeMap<&str, u64> = all.iter().map(|e| (e.id.as_str(), e.acked_ms)).collect();
    let (theirs, rest): (Vec<_>, Vec<_>) = std::mem::take(mismatches).into_iter().partition(|m| {
        acked.get(m.id.as_str()).is_some_and(|&t| near(t as i64))
            || m.handled.iter().any(|h| near(h.t_ms as i64))
            || recs.get(&m.id).and_then(Option::as_ref).is_some_and(|r| {
                r.history
                    .iter()
                    .flatten()
                    .any(|h| ms(&h.at).is_some_and(near))
            })
    });
    fig.records_wrong = theirs;
    *mismatches = rest;
}

/// An RFC 3339 time in Unix ms.
fn ms(rfc3339: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// Redis alone, without roles (`cargo test --test chaos -- failover-redis --redis
/// sentinel|cluster-replicas`): the topology started, its primary killed and the killed
/// node restarted, [`KILLS`] times, as the profile does; prints when Redis logged and
/// named each failover and when the node was back as a replica. A check of the
/// harness's reading of Redis, and Redis's own failover time to set beside the
/// profile's. Returns whether every failover was made and every node came back.
pub fn redis_only(dir: &std::path::Path, topology: Topology) -> bool {
    let tags = [crate::cluster::QUEUE, "cluster"];
    let mut redis = match crate::redis::Redis::start(dir, topology, &tags) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("chaos: starting Redis: {e}");
            return false;
        }
    };
    let mut ok = true;
    for n in 1..=KILLS {
        let Some(target) = redis.primary() else {
            eprintln!("chaos: no primary");
            return false;
        };
        let start = Instant::now();
        let kill_ms = now_ms();
        redis.kill(target);
        let mut named = None;
        while named.is_none() && start.elapsed() < Duration::from_secs(30) {
            named = redis.primary().filter(|&p| p != target);
            std::thread::sleep(Duration::from_millis(20));
        }
        let named_s = start.elapsed().as_secs_f64();
        let Some(now) = named else {
            eprintln!("chaos: #{n}: no new primary within 30 s");
            return false;
        };
        if let Err(e) = redis.restart(target) {
            eprintln!("chaos: {e}");
            return false;
        }
        while !redis.rejoined(target, now) && start.elapsed() < REJOIN_LIMIT {
            std::thread::sleep(Duration::from_millis(50));
        }
        let back = redis.rejoined(target, now);
        ok &= back;
        let logged = redis
            .failovers_logged()
            .into_iter()
            .find(|&t| t >= kill_ms)
            .map(|t| (t - kill_ms) as f64 / 1000.0);
        println!(
            "failover #{n}: {} killed, {} promoted; logged after {}, named after \
             {named_s:.1} s, back as a replica {} after {:.1} s",
            redis.name(target),
            redis.name(now),
            secs(logged),
            if back { "in sync" } else { "NOT" },
            start.elapsed().as_secs_f64()
        );
        if n < KILLS {
            // Sentinel fails a group over again only twice its failover timeout after
            // the last.
            std::thread::sleep(2 * FAILOVER_TIMEOUT);
        }
    }
    let logged = redis.failovers_logged().len();
    println!("failovers logged: {logged} for {KILLS} kills");
    redis.stop(Duration::from_secs(5));
    ok && logged == KILLS
}
