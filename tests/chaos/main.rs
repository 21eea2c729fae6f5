//! gaffer's fault suite: a real cluster on this machine (Redis with AOF, two managers,
//! three masters with distinct host names, slots running the exec handler), a producer
//! that records every task it enqueues, faults on a seeded schedule, then a drain and the
//! no-loss oracle: lost, unexpected and duplicated tasks, each duplicate with its cause,
//! and every task's record in Redis (state and history) against the handler's record and
//! the fault log, take by take.
//!
//! Run it with `scripts/chaos short` (CI, under 3 minutes) or `scripts/chaos long` (30
//! minutes, by hand). It is a test target with `test = false` and its own `main`, so a
//! plain `cargo test` never runs it; name it to run it:
//!
//! ```sh
//! cargo test --test chaos -- short [--seed N] [--report PATH]
//! ```
//!
//! `cargo test --test chaos -- selftest` only checks the record oracle against histories
//! built to break it, and the long-tasks oracle against end states built so (every run
//! does that first too).
//!
//! `cargo test --test chaos -- long-tasks` runs the long-tasks profile (`longtasks.rs`):
//! a `kind = "long"` queue whose tasks run until cancelled, under the same faults and a
//! whole host frozen; its oracle is lost = 0 and overlaps = 0.
//!
//! Exit status 0 when nothing was lost, nothing unexpected was handled, every duplicate
//! has a cause, every record agrees, no role crashed or spun and no process was left
//! behind; 1 otherwise.
//!
//! The files: `cluster.rs` (Redis with AOF, managers and masters as processes, all with
//! PDEATHSIG and a marker variable), `procs.rs`, `faults.rs` (each fault injected and
//! checked), `oracle.rs` (the producer, the handler's record, the verdict and its causes),
//! `records.rs` (the record check), `report.rs`, `longtasks.rs` with `long_handler.py` (the
//! long-tasks profile: its oracle is lost = 0 and overlaps = 0 by the handler's recorded
//! times). Figures are in `docs/RELIABILITY.md`; the regressions it found are pinned in
//! `tests/it/outage.rs`.
//!
//! What it proves (ARCHITECTURE.md, invariant 24). Under kill -9 of slots, masters and
//! Redis (AOF, `appendfsync always`) and SIGSTOP of slots, the leading manager and Redis,
//! every acknowledged enqueue is acked exactly as often as it was created, nothing is
//! handled that was not enqueued, and every second run of a task is explained by a fault
//! that killed its slot or let its lease expire. Every task's record ends `done` with a
//! history that accounts for every take: each handler run has its own `running` entry
//! naming the slot that ran it, and any other take was cut short by a fault on its slot,
//! its master or Redis and ended by a lease expiry (a take handed back unstarted, or a
//! batch taken ahead when the slot was stopped, recycled or outlived its lease, counts no
//! attempt and leaves no entry, its running entry being still in `leased:run:ID`; a long
//! task a stop hands back unfinished keeps its `running` entry, followed by a `waiting` one
//! that says why, at the attempts it used before). Roles wait Redis out (a starting daemon
//! too) without exiting or spinning, slots survive an outage and keep settling past their
//! lease, the manager does not judge heartbeats over its own blind spell, and killed trees
//! leave no process. A master sent SIGTERM during a Redis outage exits within its drain
//! bound, leaves no process, and its leases come back once Redis does (invariant 30).

mod cluster;
mod faults;
mod longtasks;
mod oracle;
mod procs;
mod records;
mod report;
mod rng;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gaffer::queue_client::{ConnectOptions, QueueClient, QueueLimits, TaskRecord, TaskState};

use cluster::{Cluster, MARKER, MAX_ATTEMPTS, NAMESPACE, QUEUE, Shape, Workload};
use faults::{Fault, FaultKind};
use rng::Rng;

/// How long and how hard a run is.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Profile {
    /// `short`, `long` or `long-tasks`.
    pub name: String,
    /// How long faults are injected (the producer runs as long).
    pub faults_for: Duration,
    /// Pause between two faults, in ms (uniform).
    pub gap_ms: (u64, u64),
    /// Tasks enqueued per second (`long-tasks`: long tasks added or cancelled).
    pub rate: f64,
    /// How long the queue may take to drain once faults and producer stop.
    pub drain_limit: Duration,
}

impl Profile {
    fn named(name: &str) -> Option<Profile> {
        match name {
            "short" => Some(Profile {
                name: name.into(),
                faults_for: Duration::from_secs(125),
                gap_ms: (3000, 6000),
                rate: 12.0,
                drain_limit: Duration::from_secs(40),
            }),
            "long" => Some(Profile {
                name: name.into(),
                faults_for: Duration::from_secs(28 * 60),
                gap_ms: (4000, 15000),
                rate: 12.0,
                drain_limit: Duration::from_secs(120),
            }),
            // Long tasks (longtasks.rs): every fault kind once and the extra slot
            // faults, a change (add or cancel) about every 3 s; no drain.
            "long-tasks" => Some(Profile {
                name: name.into(),
                faults_for: Duration::from_secs(110),
                gap_ms: (2000, 4000),
                rate: 0.35,
                drain_limit: Duration::ZERO,
            }),
            _ => None,
        }
    }
}

struct Args {
    profile: Profile,
    seed: u64,
    report: Option<PathBuf>,
}

fn args() -> Result<Args, String> {
    let mut profile = None;
    let mut seed = None;
    let mut report = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seed" => {
                let v = it.next().ok_or("--seed needs a value")?;
                seed = Some(v.parse().map_err(|_| format!("bad seed {v:?}"))?);
            }
            "--report" => report = Some(PathBuf::from(it.next().ok_or("--report needs a path")?)),
            // Flags cargo's test runner may pass along (--nocapture, --quiet, …).
            s if s.starts_with('-') => {}
            s => {
                profile = Some(
                    Profile::named(s)
                        .ok_or(format!("unknown profile {s:?}: short, long or long-tasks"))?,
                )
            }
        }
    }
    Ok(Args {
        profile: profile.unwrap_or_else(|| Profile::named("short").expect("built in")),
        seed: seed.unwrap_or_else(|| oracle::now_ms() % 1_000_000),
        report,
    })
}

fn main() -> ExitCode {
    // `selftest`: only check the record oracle against histories built to break it.
    if std::env::args().skip(1).any(|a| a == "selftest") {
        let mut failed = records::selftest();
        failed.extend(longtasks::selftest());
        for f in &failed {
            eprintln!("chaos: oracle self-test: {f}");
        }
        println!(
            "record oracle self-test: {}",
            if failed.is_empty() { "ok" } else { "FAILED" }
        );
        return if failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "chaos/{}-{}-{}",
        args.profile.name,
        args.seed,
        oracle::now_ms() / 1000
    ));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("chaos: creating {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    // Every process of the run inherits this, so the final scan finds any left behind.
    // SAFETY: no other thread exists yet.
    unsafe { std::env::set_var(MARKER, &dir) };
    let (text, json, passed) = if args.profile.name == "long-tasks" {
        let report = longtasks::run(&args, &dir);
        let json = serde_json::to_string_pretty(&report).expect("report serialises");
        (report.table(), json, report.passed)
    } else {
        let report = run(&args, &dir);
        let json = serde_json::to_string_pretty(&report).expect("report serialises");
        (report.table(), json, report.passed)
    };
    println!("{text}");
    let _ = std::fs::write(dir.join("report.json"), &json);
    let _ = std::fs::write(dir.join("report.txt"), &text);
    if let Some(path) = &args.report
        && let Err(e) = std::fs::write(path, &json)
    {
        eprintln!("chaos: writing {}: {e}", path.display());
    }
    println!("run directory: {}", dir.display());
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run(args: &Args, dir: &std::path::Path) -> report::Report {
    let started = Instant::now();
    let shape = Shape {
        masters: 3,
        managers: 2,
        slots: 6,
        batch_size: 4,
        lease_ms: 5000,
        workload: Workload::Batch,
    };
    let mut report = report::Report::new(&args.profile, args.seed, shape.clone());
    // The record oracle must catch what it claims to before its verdict counts.
    for f in records::selftest() {
        report
            .problems
            .push(format!("the record oracle's self-test: {f}"));
    }
    eprintln!(
        "chaos: profile {} seed {} in {}",
        args.profile.name,
        args.seed,
        dir.display()
    );
    let mut c = match Cluster::start(dir, shape) {
        Ok(c) => c,
        Err(e) => {
            report.problems.push(format!("starting the cluster: {e}"));
            return report;
        }
    };
    eprintln!(
        "chaos: cluster up after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The producer has its own connection with the default (patient) timeouts, as a
    // real one would.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let url = c.redis.url();
        let stop = stop.clone();
        let rate = args.profile.rate;
        let seed = args.seed;
        // Its own thread and runtime: it spawns no process, so PDEATHSIG is not at stake.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let client = QueueClient::connect(&url, NAMESPACE, &ConnectOptions::default())
                    .await
                    .map_err(|e| e.to_string())?;
                // The queue's limits as its config sets them: tracked, with the default
                // history_ttl, and max_attempts (which enqueue stores with each task).
                let limits = QueueLimits {
                    max_attempts: MAX_ATTEMPTS,
                    ..QueueLimits::default()
                };
                let queue = client
                    .queue_with(QUEUE, limits)
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(oracle::produce(queue, rate, seed ^ 0x5eed, stop).await)
            })
        })
    };

    let mut rng = Rng::new(args.seed);
    let faults = schedule(&mut c, &args.profile, &mut rng, &FaultKind::ALL);
    stop.store(true, Ordering::Relaxed);
    let enqueued = match producer.join() {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => {
            report.problems.push(format!("producer: {e}"));
            Vec::new()
        }
        Err(_) => {
            report.problems.push("the producer panicked".into());
            Vec::new()
        }
    };
    eprintln!(
        "chaos: faults over, {} tasks enqueued; draining",
        enqueued.len()
    );

    // The cluster heals by itself: every slot the map asks for runs again.
    let healing = Instant::now();
    loop {
        let running = c.running_slots();
        if running >= c.shape.slots as usize {
            break;
        }
        if healing.elapsed() > Duration::from_secs(30) {
            report.problems.push(format!(
                "only {running} of {} slots running 30 s after the last fault",
                c.shape.slots
            ));
            break;
        }
        c.idle(Duration::from_millis(250));
    }

    // Drain: every task acked (or dead), nothing ready, delayed or leased.
    let drain = Instant::now();
    let mut drained = false;
    while drain.elapsed() < args.profile.drain_limit {
        c.idle(Duration::from_millis(500));
        if let Some(s) = c.stats()
            && s.ready + s.delayed + s.leased == 0
        {
            drained = true;
            break;
        }
    }
    report.drain_seconds = drain.elapsed().as_secs_f64();
    if !drained {
        report.problems.push(format!(
            "the queue did not drain within {:?}: {:?}",
            args.profile.drain_limit,
            c.stats()
        ));
    }
    report.queue_stats = c.stats();

    let states = final_states(&c, &enqueued);
    let (handled, bad) = oracle::read_handled(&c.record);
    if !bad.is_empty() {
        report.problems.push(format!(
            "{} unreadable handler records: {:?}",
            bad.len(),
            &bad[..bad.len().min(5)]
        ));
    }
    match states {
        Some(states) => {
            report.verdict = oracle::judge(&enqueued, &handled, &states, &faults, c.shape.lease())
        }
        None => report
            .problems
            .push("could not read the tasks' final states from Redis".into()),
    }

    // Every task's record: done, and its history telling the handler's and the fault
    // log's story, take by take.
    let read = Instant::now();
    match final_records(&c, &enqueued) {
        Some((recs, expiries)) => {
            let places = c.places();
            let hosts = c.masters.iter().map(|m| m.name.clone()).collect();
            report.verdict.records = records::check(&records::Inputs {
                enqueued: &enqueued,
                handled: &handled,
                records: &recs,
                expiries: &expiries,
                faults: &faults,
                places: &places,
                hosts: &hosts,
                max_attempts: MAX_ATTEMPTS,
                history_ttl: QueueLimits::default().history_ttl,
            });
            report.records_seconds = read.elapsed().as_secs_f64();
            dump_records(&dir.join("records.txt"), &enqueued, &recs);
        }
        None => report
            .problems
            .push("could not read the tasks' records from Redis".into()),
    }

    // Redis's own counters must tell the same story: one creation and one ack per task
    // (plus the re-creations an unanswered enqueue can cause).
    if let Some(q) = &report.queue_stats {
        let v = &report.verdict;
        let recreated = v
            .by_cause
            .get(&oracle::Cause::EnqueueRetried)
            .copied()
            .unwrap_or(0);
        let tasks = (v.enqueued + recreated) as u64;
        if q.enqueued_total != tasks || q.acked_total != (v.acked + recreated) as u64 {
            report.problems.push(format!(
                "the queue's counters disagree with the oracle: enqueued {} acked {} for {} \
                 tasks enqueued and {} acked ({recreated} created twice)",
                q.enqueued_total, q.acked_total, v.enqueued, v.acked
            ));
        }
        // Every reclaimed lease is in a record (a re-created task's record holds only its
        // last life), and so is every retry.
        let r = &v.records;
        let all_read = r.checked == v.enqueued;
        if all_read
            && (r.lease_expiries > q.expired_total
                || r.retries > q.retried_total
                || (recreated == 0
                    && (r.lease_expiries != q.expired_total || r.retries != q.retried_total)))
        {
            report.problems.push(format!(
                "the records disagree with the queue's counters: {} lease expiries and {} \
                 retries in the records, {} and {} counted ({recreated} created twice)",
                r.lease_expiries, r.retries, q.expired_total, q.retried_total
            ));
        }
    }

    // Epochs of the map must never go back down: a fenced manager wrote nothing.
    if c.epochs.windows(2).any(|w| w[1] < w[0]) {
        report.problems.push(format!(
            "the map's epoch went back down (a stale manager wrote): {:?}",
            c.epochs
        ));
    }
    report.epochs = c.epochs.clone();
    let (problems, leftovers) = wind_down(&mut c);
    report.problems.extend(problems);
    report.leftovers = leftovers;
    report.faults = faults;
    report.seconds = started.elapsed().as_secs_f64();
    report.finish();
    report
}

/// The end of a run: the cluster's own problems, a check that the leftover scan sees
/// every live process, the shutdown, and whatever is still alive after it (killed).
/// Returns the problems and the leftovers.
fn wind_down(c: &mut Cluster) -> (Vec<String>, Vec<String>) {
    let mut problems = std::mem::take(&mut c.problems);
    let mut leftovers = Vec::new();
    // The scan for leftovers must see every live process of the run, or an empty result
    // after the shutdown would prove nothing.
    let visible: std::collections::BTreeSet<u32> = c.leftovers().iter().map(|l| l.0).collect();
    let live: Vec<(u32, String)> = c
        .tree()
        .into_iter()
        .chain(c.redis.pid().map(|p| (p, "redis-server".to_string())))
        .collect();
    for (pid, name) in &live {
        if !visible.contains(pid) && !procs::gone(*pid) {
            problems.push(format!("the leftover scan does not see {pid} ({name})"));
        }
    }
    problems.extend(c.shutdown());
    // Give reparented stragglers a moment to be killed by PDEATHSIG before counting.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = c.leftovers();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left = c.leftovers();
    }
    for (pid, cmd) in &left {
        let _ = procs::signal(*pid, nix::sys::signal::Signal::SIGKILL);
        leftovers.push(format!("{pid} {cmd}"));
    }
    (problems, leftovers)
}

/// Injects faults until the profile's time is up: every kind of `kinds` once in a
/// shuffled round, plus extra slot kills and freezes, round after round.
fn schedule(c: &mut Cluster, profile: &Profile, rng: &mut Rng, kinds: &[FaultKind]) -> Vec<Fault> {
    let end = Instant::now() + profile.faults_for;
    let mut out = Vec::new();
    let mut round: Vec<FaultKind> = Vec::new();
    loop {
        if round.is_empty() {
            // Faults are taken from the back: every kind once first, each in a random
            // order, then the extra slot faults, so a short phase cannot run out of time
            // before a kind was injected at all.
            let mut every = kinds.to_vec();
            rng.shuffle(&mut every);
            round = vec![
                FaultKind::SlotKill,
                FaultKind::SlotKill,
                FaultKind::SlotStop,
            ];
            rng.shuffle(&mut round);
            round.extend(every);
        }
        let gap = Duration::from_millis(rng.range(profile.gap_ms.0, profile.gap_ms.1));
        let kind = round[round.len() - 1];
        if Instant::now() + gap + kind.estimate(c.shape.lease()) > end {
            // Not enough time left for this one: a shorter one may still fit.
            if let Some(i) = round
                .iter()
                .position(|k| Instant::now() + gap + k.estimate(c.shape.lease()) <= end)
            {
                let last = round.len() - 1;
                round.swap(i, last);
                continue;
            }
            break;
        }
        round.pop();
        c.idle(gap);
        let f = faults::inject(c, kind, rng);
        eprintln!(
            "chaos: {:>6.1} s  {:<39} {} {}{}",
            (profile.faults_for.as_secs_f64()
                - end.saturating_duration_since(Instant::now()).as_secs_f64()),
            kind.label(),
            f.target,
            f.notes.join("; "),
            if f.problems.is_empty() {
                String::new()
            } else {
                format!(" PROBLEMS: {}", f.problems.join("; "))
            }
        );
        out.push(f);
    }
    c.idle(Duration::from_secs(1));
    out
}

/// Each task's record, by id (None: it has none).
type Records = HashMap<String, Option<TaskRecord>>;
/// When each task's record is due to go, by id (Unix ms; None: never).
type Expiries = HashMap<String, Option<i64>>;

/// Every enqueued task's record (None: it has none) and when it is due to go, read in
/// concurrent chunks (the records) and pipelines (the expiries).
fn final_records(c: &Cluster, enqueued: &[oracle::Enqueued]) -> Option<(Records, Expiries)> {
    let mut recs = HashMap::with_capacity(enqueued.len());
    for chunk in enqueued.chunks(500) {
        let found = c.call(Duration::from_secs(30), async {
            let reads = chunk.iter().map(|e| c.queue.record(&e.id));
            futures::future::try_join_all(reads).await
        })?;
        for (e, r) in chunk.iter().zip(found) {
            recs.insert(e.id.clone(), r);
        }
    }
    let ids: Vec<String> = enqueued.iter().map(|e| e.id.clone()).collect();
    let expiries = c.record_expiries(&ids)?;
    Some((recs, ids.into_iter().zip(expiries).collect()))
}

/// Writes the histories of the tasks taken more than once, for reading after a run.
fn dump_records(path: &std::path::Path, enqueued: &[oracle::Enqueued], recs: &Records) {
    let mut out = String::new();
    for e in enqueued {
        let Some(Some(r)) = recs.get(&e.id) else {
            continue;
        };
        let h = r.history.as_deref().unwrap_or_default();
        if h.len() <= 3 {
            continue;
        }
        out.push_str(&format!("{} {} attempt {}\n", r.id, r.state, r.attempt));
        for en in h {
            out.push_str(&format!(
                "  {} {} attempt {} {}/{} {}{}\n",
                en.at,
                en.state,
                en.attempt,
                en.host.as_deref().unwrap_or("-"),
                en.slot.map_or("-".into(), |s| s.to_string()),
                en.note.as_deref().unwrap_or(""),
                en.count.map_or(String::new(), |n| format!(" ×{n}"))
            ));
        }
    }
    let _ = std::fs::write(path, out);
}

/// Where every enqueued task is now (None: gone), read in concurrent chunks.
fn final_states(
    c: &Cluster,
    enqueued: &[oracle::Enqueued],
) -> Option<HashMap<String, Option<TaskState>>> {
    let mut out = HashMap::with_capacity(enqueued.len());
    for chunk in enqueued.chunks(200) {
        let found = c.call(Duration::from_secs(30), async {
            let finds = chunk.iter().map(|e| c.queue.find(&e.id));
            futures::future::try_join_all(finds).await
        })?;
        for (e, info) in chunk.iter().zip(found) {
            out.insert(e.id.clone(), info.map(|i| i.state));
        }
    }
    Some(out)
}
