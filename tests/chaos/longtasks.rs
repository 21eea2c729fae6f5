//! The long-tasks profile (`scripts/chaos long-tasks`): the same cluster and faults as
//! the batch profiles, but its queue is `kind = "long"` and its handler
//! (`long_handler.py`) runs each task until it is cancelled, logging its start (with host
//! and slot), a beat every 200 ms, the cancel line and its stop. A driver adds tasks and
//! cancels some over the whole fault phase, as an operator would. Then, after a settle
//! window (lease + two ticks + a slot start, and room for a loaded machine), the oracle:
//!
//! - **lost = 0**: every task not cancelled runs (its record says running, and the run
//!   its record names, host and slot, is alive and beating); every cancelled one is
//!   cancelled in its record and runs nowhere;
//! - **overlaps = 0**: no task ever ran in two places at once, by the handler's recorded
//!   times: a run lasts from its start to its stop line, or, killed, to its last beat plus
//!   one beat (a frozen process does no work). The smallest gap between one run's end and
//!   the next run's start is reported: the timing argument of docs/OPERATIONS.md ("Long
//!   tasks") says a slot that could not renew stops its task a second before its lease
//!   could pass to another.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gaffer::config::{LONG_RENEW_EVERY, QueueKind};
use gaffer::queue_client::{
    ConnectOptions, NewTask, Queue, QueueClient, QueueLimits, RecordState, TaskRecord,
};
use serde::Serialize;

use crate::cluster::{Cluster, MAX_ATTEMPTS, NAMESPACE, QUEUE, Shape, Workload};
use crate::faults::{Fault, FaultKind};
use crate::oracle::now_ms;
use crate::redis::Topology;
use crate::rng::Rng;
use crate::{Args, procs};

/// How often the handler beats while a task runs (`BEAT` in long_handler.py).
const BEAT: Duration = Duration::from_millis(200);
/// Tasks added before the faults begin.
const INITIAL: usize = 8;
/// The driver keeps between this many tasks alive (added, not cancelled)…
const MIN_LIVE: usize = 5;
/// …and this many.
const MAX_LIVE: usize = 10;
/// How long a slot takes to start on a loaded machine, at most: part of the settle
/// window, with the lease and two ticks.
const SLOT_START: Duration = Duration::from_secs(20);

/// The cluster of the profile: 3 masters, up to [`MAX_LIVE`] + 2 long slots, at most 6
/// per host so that two hosts can hold every task while the third is down.
pub fn shape(redis: Topology) -> Shape {
    Shape {
        masters: 3,
        managers: 2,
        redis,
        slots: MAX_LIVE as u32 + 2,
        batch_size: 1,
        lease_ms: 5000,
        workload: Workload::Long {
            cancel_grace_ms: 1000,
            max_per_host: 6,
        },
        wait_replicas: 0,
    }
}

/// One change the driver made, once Redis answered it.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// The task.
    pub id: String,
    /// `add` or `cancel`.
    pub what: &'static str,
    /// When Redis answered (Unix ms).
    pub at_ms: u64,
    /// Calls it took (more than one: an earlier one failed without an answer).
    pub calls: u32,
    /// For a cancel: the state the task was found in (None: it had ended).
    pub found: Option<String>,
}

/// Adds and cancels tasks until `stop` is set: [`INITIAL`] at once, then one change
/// about every `1 / rate` seconds, keeping [`MIN_LIVE`]..=[`MAX_LIVE`] alive. A quarter of
/// the tasks ignore their cancel line (their slot sends SIGTERM after `cancel_grace`).
/// Every call is retried until Redis answers (an add with the same id, which dedups; a
/// cancel again, which changes nothing more).
pub async fn drive(queue: Queue, rate: f64, seed: u64, stop: Arc<AtomicBool>) -> Vec<Change> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let mut live: Vec<String> = Vec::new();
    let mut next = 0u32;
    let every = Duration::from_secs_f64(1.0 / rate);
    while !stop.load(Ordering::Relaxed) {
        let add = live.len() < MIN_LIVE
            || (live.len() < MAX_LIVE && (next as usize) < INITIAL)
            || (live.len() < MAX_LIVE && rng.range(0, 2) == 0);
        if add {
            next += 1;
            let id = format!("L{next:04}");
            let payload = if rng.range(0, 4) == 0 {
                r#"{"on_cancel":"ignore"}"#
            } else {
                "{}"
            };
            out.push(add_task(&queue, &id, payload).await);
            live.push(id);
        } else {
            let i = rng.range(0, live.len() as u64) as usize;
            let id = live.swap_remove(i);
            out.push(cancel_task(&queue, &id).await);
        }
        if out.len() >= INITIAL {
            tokio::time::sleep(every).await;
        }
    }
    out
}

async fn add_task(queue: &Queue, id: &str, payload: &str) -> Change {
    let task = [NewTask::new(payload.to_owned()).id(id)];
    let mut calls = 0;
    loop {
        calls += 1;
        match queue.enqueue_many(&task).await {
            Ok(_) => break,
            Err(e) => {
                eprintln!("chaos: driver: adding {id} failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    Change {
        id: id.to_owned(),
        what: "add",
        at_ms: now_ms(),
        calls,
        found: None,
    }
}

async fn cancel_task(queue: &Queue, id: &str) -> Change {
    let mut calls = 0;
    let found = loop {
        calls += 1;
        match queue.cancel_with(id, "cancelled by chaos").await {
            Ok(info) => break info.map(|i| i.state.to_string()),
            Err(e) => {
                eprintln!("chaos: driver: cancelling {id} failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    Change {
        id: id.to_owned(),
        what: "cancel",
        at_ms: now_ms(),
        calls,
        found,
    }
}

/// One run of a task in one exec child, from the handler's log.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// Its host and slot number.
    pub host: String,
    /// Its slot's number on the host.
    pub slot: String,
    /// The exec child.
    pub pid: u32,
    /// When it started (Unix s).
    pub start: f64,
    /// Its last beat (Unix s).
    pub last_beat: f64,
    /// When it stopped on its own after a cancel (Unix s), if it did.
    pub stop: Option<f64>,
}

impl Run {
    /// Whether it still runs: it has not stopped on its own and its exec child lives (a
    /// child outlives the runs that stop on their own, and takes the slot's next task;
    /// one that was killed is replaced).
    fn live(&self, alive: &dyn Fn(u32) -> bool) -> bool {
        self.stop.is_none() && alive(self.pid)
    }

    /// The latest moment it can have done any work: its stop, else a beat after its last
    /// beat (it was killed).
    fn end(&self) -> f64 {
        self.stop
            .unwrap_or(self.last_beat + BEAT.as_secs_f64())
            .max(self.start)
    }
}

/// Every task's runs from the handler's log, by start time; and the unreadable lines.
pub fn read_runs(path: &Path) -> (BTreeMap<String, Vec<Run>>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs: BTreeMap<(String, u32), Run> = BTreeMap::new();
    let mut bad = Vec::new();
    for line in text.lines() {
        if read_line(line, &mut runs).is_none() {
            bad.push(line.to_owned());
        }
    }
    let mut out: BTreeMap<String, Vec<Run>> = BTreeMap::new();
    for ((id, _), r) in runs {
        out.entry(id).or_default().push(r);
    }
    for r in out.values_mut() {
        r.sort_by(|a, b| a.start.total_cmp(&b.start));
    }
    (out, bad)
}

fn read_line(line: &str, runs: &mut BTreeMap<(String, u32), Run>) -> Option<()> {
    let f: Vec<&str> = line.split(' ').collect();
    match f.as_slice() {
        ["start", id, host, slot, pid, t] => {
            let t: f64 = t.parse().ok()?;
            runs.insert(
                (id.to_string(), pid.parse().ok()?),
                Run {
                    host: host.to_string(),
                    slot: slot.to_string(),
                    pid: pid.parse().ok()?,
                    start: t,
                    last_beat: t,
                    stop: None,
                },
            );
        }
        [what @ ("beat" | "cancel" | "stop"), id, pid, t] => {
            let t: f64 = t.parse().ok()?;
            let run = runs.get_mut(&(id.to_string(), pid.parse().ok()?))?;
            run.last_beat = run.last_beat.max(t);
            if *what == "stop" {
                run.stop = Some(t);
            }
        }
        _ => return None,
    }
    Some(())
}

/// Two runs of one task that overlapped.
#[derive(Debug, Clone, Serialize)]
pub struct Overlap {
    /// The task.
    pub id: String,
    /// The earlier run.
    pub first: Run,
    /// The run that started before it ended.
    pub second: Run,
}

/// What the oracle found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verdict {
    /// Tasks added.
    pub added: usize,
    /// Tasks whose cancel Redis answered.
    pub cancelled: usize,
    /// Tasks not cancelled and running where their record says at the end.
    pub running: usize,
    /// Tasks not where they should be at the end, each with why.
    pub lost: Vec<String>,
    /// Runs of one task that overlapped.
    pub overlaps: Vec<Overlap>,
    /// Runs in all.
    pub runs: usize,
    /// Runs after a task's first (a fault moved or restarted it).
    pub restarts: usize,
    /// The smallest gap from one run's end to the next run of the same task (ms).
    pub min_handover_gap_ms: Option<i64>,
    /// Runs ended by a signal: killed by a fault, stopped at once by a slot that lost its
    /// lease, or past `cancel_grace` after ignoring the cancel line.
    pub killed: usize,
}

/// Judges the end state: `records` holds every added task's record, `alive` says
/// whether an exec child still runs.
pub fn judge(
    changes: &[Change],
    runs: &BTreeMap<String, Vec<Run>>,
    records: &HashMap<String, Option<TaskRecord>>,
    alive: &dyn Fn(u32) -> bool,
) -> Verdict {
    let cancelled: BTreeSet<&str> = changes
        .iter()
        .filter(|c| c.what == "cancel")
        .map(|c| c.id.as_str())
        .collect();
    let added: Vec<&str> = changes
        .iter()
        .filter(|c| c.what == "add")
        .map(|c| c.id.as_str())
        .collect();
    let mut v = Verdict {
        added: added.len(),
        cancelled: cancelled.len(),
        ..Verdict::default()
    };
    let none = Vec::new();
    for id in &added {
        let r = runs.get(*id).unwrap_or(&none);
        let rec = records.get(*id).cloned().flatten();
        let wrong = if cancelled.contains(id) {
            wrong_cancelled(rec.as_ref(), r, alive)
        } else {
            wrong_running(rec.as_ref(), r, alive)
        };
        match wrong {
            Some(why) => v.lost.push(format!("{id}: {why}")),
            None if !cancelled.contains(id) => v.running += 1,
            None => {}
        }
    }
    for (id, r) in runs {
        v.runs += r.len();
        v.restarts += r.len().saturating_sub(1);
        v.killed += r
            .iter()
            .filter(|r| r.stop.is_none() && !alive(r.pid))
            .count();
        check_overlaps(id, r, alive, &mut v);
    }
    v
}

/// Why a task not cancelled is not running as it should: its record running, naming the
/// host and slot of a live run.
fn wrong_running(
    rec: Option<&TaskRecord>,
    runs: &[Run],
    alive: &dyn Fn(u32) -> bool,
) -> Option<String> {
    let Some(rec) = rec else {
        return Some("no record".into());
    };
    if rec.state != RecordState::Running {
        return Some(format!("record says {}, not running", rec.state));
    }
    let live: Vec<&Run> = runs.iter().filter(|r| r.live(alive)).collect();
    let [run] = live.as_slice() else {
        return Some(format!("{} live runs, not one", live.len()));
    };
    let last = rec.history.as_ref().and_then(|h| h.last());
    let named = last.map(|h| {
        (
            h.host.clone().unwrap_or_default(),
            h.slot.map(|s| s.to_string()).unwrap_or_default(),
        )
    });
    if named != Some((run.host.clone(), run.slot.clone())) {
        return Some(format!(
            "record names {named:?}, the live run is on {}/{}",
            run.host, run.slot
        ));
    }
    None
}

/// Why a cancelled task is not as it should be: cancelled in its record, running nowhere.
fn wrong_cancelled(
    rec: Option<&TaskRecord>,
    runs: &[Run],
    alive: &dyn Fn(u32) -> bool,
) -> Option<String> {
    if let Some(r) = runs.iter().find(|r| r.live(alive)) {
        return Some(format!("cancelled, yet runs on {}/{}", r.host, r.slot));
    }
    match rec {
        None => Some("cancelled, but no record".into()),
        Some(rec) if rec.state != RecordState::Cancelled => {
            Some(format!("cancelled, but its record says {}", rec.state))
        }
        Some(_) => None,
    }
}

fn check_overlaps(id: &str, runs: &[Run], alive: &dyn Fn(u32) -> bool, v: &mut Verdict) {
    for (i, a) in runs.iter().enumerate() {
        let end = if a.live(alive) {
            f64::INFINITY
        } else {
            a.end()
        };
        for b in &runs[i + 1..] {
            if b.start < end {
                v.overlaps.push(Overlap {
                    id: id.to_owned(),
                    first: a.clone(),
                    second: b.clone(),
                });
            }
        }
        if let Some(b) = runs.get(i + 1)
            && end.is_finite()
        {
            let gap = ((b.start - end) * 1000.0).round() as i64;
            v.min_handover_gap_ms = Some(v.min_handover_gap_ms.map_or(gap, |m| m.min(gap)));
        }
    }
}

/// Everything a long-tasks run found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The profile run.
    pub profile: String,
    /// The seed of the schedule and the driver.
    pub seed: u64,
    /// The command that repeats this run.
    pub command: String,
    /// The cluster's shape.
    pub shape: Shape,
    /// Per fault kind: times injected and problems found.
    pub fault_table: BTreeMap<FaultKind, (usize, usize)>,
    /// Every fault in order.
    pub faults: Vec<Fault>,
    /// Every add and cancel, in order.
    pub changes: Vec<Change>,
    /// The oracle's counts.
    pub verdict: Verdict,
    /// Seconds from the end of the faults until every task was where it should be.
    pub settle_seconds: f64,
    /// Seconds the whole run took.
    pub seconds: f64,
    /// Processes of the run still alive after the shutdown.
    pub leftovers: Vec<String>,
    /// Everything that failed the run.
    pub problems: Vec<String>,
    /// lost = 0, overlaps = 0, every kind injected, no problem, nothing left.
    pub passed: bool,
}

impl Report {
    fn new(args: &Args) -> Self {
        Report {
            profile: args.profile.name.clone(),
            seed: args.seed,
            command: args.command(),
            shape: shape(args.redis),
            fault_table: BTreeMap::new(),
            faults: Vec::new(),
            changes: Vec::new(),
            verdict: Verdict::default(),
            settle_seconds: 0.0,
            seconds: 0.0,
            leftovers: Vec::new(),
            problems: Vec::new(),
            passed: false,
        }
    }

    fn finish(&mut self) {
        for kind in FaultKind::LONG {
            self.fault_table.insert(kind, (0, 0));
        }
        for f in &self.faults {
            let row = self.fault_table.entry(f.kind).or_default();
            row.0 += usize::from(f.injected);
            row.1 += f.problems.len();
            for p in &f.problems {
                self.problems
                    .push(format!("{} ({}): {p}", f.kind.label(), f.target));
            }
        }
        let missing: Vec<&str> = self
            .fault_table
            .iter()
            .filter(|(_, row)| row.0 == 0)
            .map(|(k, _)| k.label())
            .collect();
        if !missing.is_empty() {
            self.problems
                .push(format!("never injected: {}", missing.join(", ")));
        }
        let v = &self.verdict;
        self.passed = v.added > 0
            && v.lost.is_empty()
            && v.overlaps.is_empty()
            && self.leftovers.is_empty()
            && self.problems.is_empty();
    }

    /// The report as text.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let v = &self.verdict;
        let _ = writeln!(
            s,
            "\ngaffer chaos: profile {}, seed {}, {:.0} s ({})",
            self.profile, self.seed, self.seconds, self.command
        );
        let _ = writeln!(
            s,
            "cluster: {} masters, {} managers, Redis {}, a long queue of up to {} slots, lease {} ms\n",
            self.shape.masters,
            self.shape.managers,
            self.shape.redis.name(),
            self.shape.slots,
            self.shape.lease_ms
        );
        let _ = writeln!(s, "{:<39} {:>8} {:>8}", "fault", "injected", "problems");
        for (kind, (n, p)) in &self.fault_table {
            let _ = writeln!(s, "{:<39} {n:>8} {p:>8}", kind.label());
        }
        let _ = writeln!(
            s,
            "\ntasks added {}, cancelled {}, running at the end {}; lost {}, overlaps {}",
            v.added,
            v.cancelled,
            v.running,
            v.lost.len(),
            v.overlaps.len()
        );
        let _ = writeln!(
            s,
            "runs {} ({} restarts after faults), {} ended by a signal, smallest \
             handover gap {} ms; settled {:.1} s after the faults; processes left behind: {}",
            v.runs,
            v.restarts,
            v.killed,
            v.min_handover_gap_ms
                .map_or("-".to_string(), |g| g.to_string()),
            self.settle_seconds,
            self.leftovers.len()
        );
        for l in &v.lost {
            let _ = writeln!(s, "LOST: {l}");
        }
        for o in v.overlaps.iter().take(10) {
            let _ = writeln!(s, "OVERLAP {}: {:?} and {:?}", o.id, o.first, o.second);
        }
        for l in &self.leftovers {
            let _ = writeln!(s, "  left behind: {l}");
        }
        for p in &self.problems {
            let _ = writeln!(s, "PROBLEM: {p}");
        }
        let _ = writeln!(s, "\n{}", if self.passed { "PASSED" } else { "FAILED" });
        s
    }
}

/// Runs the profile: the cluster, the driver and the faults, the settle window, the
/// oracle, the shutdown.
pub fn run(args: &Args, dir: &Path) -> Report {
    let started = Instant::now();
    let mut report = Report::new(args);
    // The oracle must catch what it claims to before its verdict counts.
    for f in selftest() {
        report
            .problems
            .push(format!("the long oracle's self-test: {f}"));
    }
    eprintln!(
        "chaos: profile {} seed {} in {}",
        args.profile.name,
        args.seed,
        dir.display()
    );
    let mut c = match Cluster::start(dir, shape(args.redis)) {
        Ok(c) => c,
        Err(e) => {
            report.problems.push(format!("starting the cluster: {e}"));
            return report;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let driver = start_driver(&c, args, stop.clone());
    let mut rng = Rng::new(args.seed);
    report.faults = crate::schedule(&mut c, &args.profile, &mut rng, &FaultKind::LONG);
    stop.store(true, Ordering::Relaxed);
    report.changes = match driver.join() {
        Ok(Ok(changes)) => changes,
        Ok(Err(e)) => {
            report.problems.push(format!("driver: {e}"));
            Vec::new()
        }
        Err(_) => {
            report.problems.push("the driver panicked".into());
            Vec::new()
        }
    };
    eprintln!(
        "chaos: faults over, {} changes; settling",
        report.changes.len()
    );
    let settling = Instant::now();
    report.verdict = settle(&mut c, &report.changes, &mut report.problems);
    report.settle_seconds = settling.elapsed().as_secs_f64();
    let (problems, leftovers) = crate::wind_down(&mut c);
    report.problems.extend(problems);
    report.leftovers = leftovers;
    report.seconds = started.elapsed().as_secs_f64();
    report.finish();
    report
}

/// The driver on its own thread and runtime, with its own connection (default, patient
/// timeouts) and the queue opened as a long one.
fn start_driver(
    c: &Cluster,
    args: &Args,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Vec<Change>, String>> {
    let url = c.redis.url();
    let rate = args.profile.rate;
    let seed = args.seed ^ 0x10_9e57;
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let client = QueueClient::connect(&url, NAMESPACE, &ConnectOptions::default())
                .await
                .map_err(|e| e.to_string())?;
            let queue = client
                .queue_with(QUEUE, long_limits())
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(drive(queue, rate, seed, stop).await)
        })
    })
}

fn long_limits() -> QueueLimits {
    QueueLimits {
        max_attempts: MAX_ATTEMPTS,
        kind: QueueKind::Long,
        ..QueueLimits::default()
    }
}

/// Waits until every task is where it should be, or the settle window is over, and
/// judges then.
fn settle(c: &mut Cluster, changes: &[Change], problems: &mut Vec<String>) -> Verdict {
    let window = c.shape.lease() + LONG_RENEW_EVERY * 2 + SLOT_START;
    let deadline = Instant::now() + window;
    loop {
        c.idle(Duration::from_millis(500));
        let last = Instant::now() >= deadline;
        match judge_now(c, changes) {
            Ok((v, bad)) if last || v.lost.is_empty() => {
                if !bad.is_empty() {
                    problems.push(format!(
                        "{} unreadable handler lines: {:?}",
                        bad.len(),
                        &bad[..bad.len().min(5)]
                    ));
                }
                return v;
            }
            Err(e) if last => {
                problems.push(e);
                return Verdict::default();
            }
            _ => {}
        }
    }
}

/// Reads every added task's record and the handler's log, and judges; returns the
/// verdict and the handler's unreadable lines.
fn judge_now(c: &Cluster, changes: &[Change]) -> Result<(Verdict, Vec<String>), String> {
    let ids: Vec<&str> = changes
        .iter()
        .filter(|ch| ch.what == "add")
        .map(|ch| ch.id.as_str())
        .collect();
    let queue = c.queue(QUEUE).clone();
    let records = c.call(Duration::from_secs(30), async move {
        let reads = ids.iter().map(|id| queue.record(id));
        futures::future::try_join_all(reads).await
    });
    let records = records.ok_or("could not read the tasks' records")?;
    let records: HashMap<String, Option<TaskRecord>> = changes
        .iter()
        .filter(|ch| ch.what == "add")
        .map(|ch| ch.id.clone())
        .zip(records)
        .collect();
    let (runs, bad) = read_runs(&c.record);
    let v = judge(changes, &runs, &records, &|pid| !procs::gone(pid));
    Ok((v, bad))
}

/// Checks the oracle against end states built to break it; returns what it missed.
pub fn selftest() -> Vec<String> {
    use gaffer::queue_client::HistoryEntry;
    let change = |id: &str, what| Change {
        id: id.into(),
        what,
        at_ms: 0,
        calls: 1,
        found: None,
    };
    let run = |slot: &str, pid, start, last_beat, stop| Run {
        host: "h1".into(),
        slot: slot.into(),
        pid,
        start,
        last_beat,
        stop,
    };
    let record = |id: &str, state, slot| TaskRecord {
        id: id.into(),
        queue: QUEUE.into(),
        state,
        priority: 0,
        attempt: 1,
        max_attempts: MAX_ATTEMPTS,
        created_at: String::new(),
        due_at: String::new(),
        updated_at: String::new(),
        submitted_by: None,
        error: None,
        result: None,
        chain: None,
        history: Some(vec![HistoryEntry {
            state,
            at: String::new(),
            attempt: 1,
            host: Some("h1".into()),
            slot: Some(slot),
            note: None,
            count: None,
        }]),
    };
    let changes = [
        change("a", "add"),
        change("b", "add"),
        change("b", "cancel"),
    ];
    // a: killed at 10.0 (last beat), run again at 10.1 on slot 2, which lives (pid 3).
    // b: cancelled, its record says so, but its child (pid 4) still runs it.
    let mut runs = BTreeMap::new();
    runs.insert(
        "a".to_string(),
        vec![run("1", 1, 0.0, 10.0, None), run("2", 3, 10.1, 20.0, None)],
    );
    runs.insert("b".to_string(), vec![run("3", 4, 0.0, 20.0, None)]);
    let mut records = HashMap::new();
    records.insert("a".to_string(), Some(record("a", RecordState::Running, 2)));
    records.insert(
        "b".to_string(),
        Some(record("b", RecordState::Cancelled, 3)),
    );
    let alive = |pid: u32| pid >= 3;
    let mut missed = Vec::new();
    let v = judge(&changes, &runs, &records, &alive);
    if v.overlaps.len() != 1 || v.overlaps[0].id != "a" {
        missed.push(format!("a run 0.1 s after a killed one's last beat: {v:?}"));
    }
    if v.lost.len() != 1 || !v.lost[0].starts_with("b:") {
        missed.push(format!("a cancelled task still running: {v:?}"));
    }
    // The same end state, told right: a's second run starts a second later, b stopped.
    runs.get_mut("a").unwrap()[1].start = 11.0;
    runs.get_mut("b").unwrap()[0].stop = Some(5.0);
    let v = judge(&changes, &runs, &records, &alive);
    if !v.overlaps.is_empty() || !v.lost.is_empty() || v.running != 1 {
        missed.push(format!("a clean end state judged wrong: {v:?}"));
    }
    if v.min_handover_gap_ms != Some(800) {
        missed.push(format!(
            "handover gap {:?}, not 800 ms",
            v.min_handover_gap_ms
        ));
    }
    // a's record names another slot than the one its live run is on.
    records.insert("a".to_string(), Some(record("a", RecordState::Running, 1)));
    if judge(&changes, &runs, &records, &alive).lost.is_empty() {
        missed.push("a record naming the wrong slot passed".into());
    }
    missed
}
