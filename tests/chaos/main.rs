//! gaffer's fault suite: a real cluster on this machine (Redis with AOF, two managers,
//! three masters with distinct host names, slots running the exec handler), a producer
//! that records every task it enqueues, faults on a seeded schedule, then a drain and the
//! no-loss oracle: lost, unexpected and duplicated tasks, each duplicate with its cause,
//! every task's record in Redis (state and history) against the handler's record and the
//! fault log, take by take, and every chain whole.
//!
//! Run it with `scripts/chaos short` (CI, under 3 minutes) or `scripts/chaos long` (30
//! minutes, by hand). It is a test target with `test = false` and its own `main`, so a
//! plain `cargo test` never runs it; name it to run it:
//!
//! ```sh
//! cargo test --test chaos -- short [--seed N] [--report PATH] \
//!     [--redis single|cluster] [--workload mixed|plain|chains]
//! cargo test --test chaos -- failover --redis sentinel|cluster-replicas \
//!     [--wait-replicas N] [--freeze] [--seed N] [--report PATH] [--workload …]
//! ```
//!
//! **Topology** (`--redis`): `single` (the default) is one redis-server; `cluster` is a
//! Redis Cluster of three masters without replicas (`redis.rs`), every node with AOF and
//! `appendfsync always`, the roles given one node's URL. The run's queues and the roles'
//! keys hash to different nodes, so a chain's tasks live on three; a Redis fault hits one
//! node, picked by the seed (killed and restarted from its AOF and `nodes.conf`, or
//! frozen), which a cluster with full coverage required turns into an outage of every
//! node once the others mark it failed. Nothing fails over there: the failover profile's
//! two topologies do, `sentinel` (a primary and a replica, each with AOF, under three
//! Sentinels; the roles given a `redis+sentinel://` URL) and `cluster-replicas` (a Redis
//! Cluster of three masters with a replica each; the roles given a master outside the
//! failed shard), for the failover profile only.
//!
//! **Failover** (`failover.rs`, by hand, 1–2 minutes): the batch cluster and load; after
//! a warm-up the primary serving the queue `chaos` is killed (kill -9; `--freeze`:
//! SIGSTOP, woken once a replica took its place), the time until work flows again is
//! measured (the first ack after the kill, from the records), the node comes back as a
//! replica; twice. Then the drain and the same oracle, whose failover-made losses (lost,
//! run twice, records wrong, counters) are counted as the failovers' cost. It fails when
//! work does not resume within the topology's failover time + 5 s, when a task is lost
//! with `--wait-replicas` ≥ 1 (the roles' `[cluster] wait_replicas`, left out at 0), or
//! on any check of the batch profiles that no failover explains.
//! `cargo test --test chaos -- failover-redis --redis sentinel|cluster-replicas` fails
//! Redis over alone, without roles.
//!
//! **Workload** (`--workload`, the batch profiles): `mixed` (the default) sends plain
//! tasks (12 a second) to the queue `chaos` and starts chains (1.5 a second) on the queue
//! `chain`, whose route and handler make three follow-ups of each on the queue `step`, in
//! two steps and with a fan-out (`chains.rs`); `plain` sends plain tasks alone, as the
//! suite did before chains, `chains` chains alone. Every task of a chain goes through the
//! same oracle as a plain one; the chain check adds that each chain has exactly its
//! follow-ups (made once), its reader lists them and says done, and every chain id has the
//! form `~cchain.N` on either topology.
//!
//! `cargo test --test chaos -- selftest` only checks the record oracle against histories
//! built to break it, the chain check against chains built so, and the long-tasks oracle
//! against end states built so (every run does the first two first too).
//!
//! `cargo test --test chaos -- long-tasks` runs the long-tasks profile (`longtasks.rs`):
//! a `kind = "long"` queue whose tasks run until cancelled, under the same faults and a
//! whole host frozen; its oracle is lost = 0 and overlaps = 0. `--redis` applies to it
//! too; `--workload` does not.
//!
//! Exit status 0 when nothing was lost, nothing unexpected was handled, every duplicate
//! has a cause, every record agrees, every chain is whole, no role crashed or spun and no
//! process was left behind; 1 otherwise; 2 for a bad command line.
//!
//! The files: `cluster.rs` (the roles as processes, all with PDEATHSIG and a marker
//! variable, and the queues' config), `redis.rs` (one server, a cluster's nodes, a
//! Sentinel group, with AOF), `failover.rs` (the failover profile), `procs.rs`, `faults.rs` (each fault injected and checked), `oracle.rs` (the
//! producer, the handler's record, the verdict and its causes), `records.rs` (the record
//! check), `chains.rs` (the chain workload and its check), `report.rs`, `longtasks.rs`
//! with `long_handler.py` (the long-tasks profile: its oracle is lost = 0 and overlaps = 0
//! by the handler's recorded times). Figures are in `docs/RELIABILITY.md`; the
//! regressions it found are pinned in `tests/it/outage.rs`.
//!
//! What it proves (ARCHITECTURE.md, invariants 24, 32 and 37). Under kill -9 of slots,
//! masters and Redis (AOF, `appendfsync always`; a node of a cluster) and SIGSTOP of
//! slots, the leading manager and Redis, every acknowledged enqueue is acked exactly as
//! often as it was created, nothing is handled that was not enqueued, and every second
//! run of a task is explained by a fault that killed its slot or let its lease expire.
//! Every chain's follow-ups are made once each, none lost, each run as a task is, and its
//! members are listed as its id says. Every task's record ends `done` with a
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

mod chains;
mod cluster;
mod failover;
mod faults;
mod longtasks;
mod oracle;
mod procs;
mod records;
mod redis;
mod report;
mod rng;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gaffer::queue_client::{
    ConnectOptions, Durability, QueueClient, QueueLimits, TaskRecord, TaskState,
};

use chains::{CHAIN_QUEUE, ChainCase};
use cluster::{Cluster, MARKER, MAX_ATTEMPTS, NAMESPACE, QUEUE, Shape, Workload};
use faults::{Fault, FaultKind};
use oracle::{Enqueued, Make};
use redis::Topology;
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
    /// Plain tasks enqueued per second (`long-tasks`: long tasks added or cancelled).
    pub rate: f64,
    /// Chains started per second (four tasks each, `chains.rs`).
    pub chain_rate: f64,
    /// How long the queues may take to drain once faults and producer stop.
    pub drain_limit: Duration,
}

impl Profile {
    /// The profile `name` names, at its default rates.
    fn named(name: &str) -> Option<Profile> {
        match name {
            "short" => Some(Profile {
                name: name.into(),
                faults_for: Duration::from_secs(125),
                gap_ms: (3000, 6000),
                rate: 12.0,
                chain_rate: 1.5,
                drain_limit: Duration::from_secs(40),
            }),
            "long" => Some(Profile {
                name: name.into(),
                faults_for: Duration::from_secs(28 * 60),
                gap_ms: (4000, 15000),
                rate: 12.0,
                chain_rate: 1.5,
                drain_limit: Duration::from_secs(120),
            }),
            // Long tasks (longtasks.rs): every fault kind once and the extra slot
            // faults, a change (add or cancel) about every 3 s; no drain.
            "long-tasks" => Some(Profile {
                name: name.into(),
                faults_for: Duration::from_secs(110),
                gap_ms: (2000, 4000),
                rate: 0.35,
                chain_rate: 0.0,
                drain_limit: Duration::ZERO,
            }),
            // Failovers (failover.rs): two kills of the primary under the short profile's
            // load; the fault phase is its own (warm-up, kills, returns).
            "failover" => Some(Profile {
                name: name.into(),
                faults_for: Duration::from_secs(15),
                gap_ms: (0, 0),
                rate: 12.0,
                chain_rate: 1.5,
                drain_limit: Duration::from_secs(60),
            }),
            _ => None,
        }
    }
}

/// What the batch profiles' producer sends: `--workload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// Plain tasks and chains side by side (the default).
    Mixed,
    /// Plain tasks only (the suite as it was before chains).
    Plain,
    /// Chains only.
    Chains,
}

impl Mix {
    /// The workload `--workload NAME` names.
    fn named(name: &str) -> Option<Mix> {
        match name {
            "mixed" => Some(Mix::Mixed),
            "plain" => Some(Mix::Plain),
            "chains" => Some(Mix::Chains),
            _ => None,
        }
    }

    /// The name `--workload` takes.
    fn name(self) -> &'static str {
        match self {
            Mix::Mixed => "mixed",
            Mix::Plain => "plain",
            Mix::Chains => "chains",
        }
    }
}

/// The command line: a profile, its seed, where the report goes, the Redis topology and
/// (batch profiles) the workload.
pub struct Args {
    profile: Profile,
    seed: u64,
    report: Option<PathBuf>,
    redis: Topology,
    mix: Mix,
    /// The roles' `[cluster] wait_replicas` (the failover profile).
    wait_replicas: u32,
    /// The failover profile freezes the primary instead of killing it.
    freeze: bool,
}

impl Args {
    /// The command that repeats the run.
    pub fn command(&self) -> String {
        let mut out = format!("scripts/chaos {} --seed {}", self.profile.name, self.seed);
        if self.redis != Topology::Single {
            out += &format!(" --redis {}", self.redis.name());
        }
        if self.mix != Mix::Mixed {
            out += &format!(" --workload {}", self.mix.name());
        }
        if self.profile.name == "failover" {
            out += &format!(" --wait-replicas {}", self.wait_replicas);
        }
        if self.freeze {
            out += " --freeze";
        }
        out
    }
}

/// What the command line takes.
const USAGE: &str = "short, long, long-tasks or failover [--seed N] [--report PATH] \
                     [--redis single|cluster|sentinel|cluster-replicas] \
                     [--workload mixed|plain|chains] [--wait-replicas N] [--freeze]";

/// Reads the command line; the profile's rates follow the workload asked for.
fn args() -> Result<Args, String> {
    let mut profile = None;
    let mut seed = None;
    let mut report = None;
    let mut redis = Topology::Single;
    let mut mix = None;
    let mut wait_replicas = None;
    let mut freeze = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |what: &str| it.next().ok_or(format!("{a} needs {what}"));
        match a.as_str() {
            "--seed" => {
                let v = value("a value")?;
                seed = Some(v.parse().map_err(|_| format!("bad seed {v:?}"))?);
            }
            "--report" => report = Some(PathBuf::from(value("a path")?)),
            "--redis" => {
                let names = "single, cluster, sentinel or cluster-replicas";
                let v = value(names)?;
                redis = Topology::named(&v).ok_or(format!("--redis {v:?}: {names}"))?;
            }
            "--freeze" => freeze = true,
            "--wait-replicas" => {
                let v = value("a number of replicas")?;
                wait_replicas = Some(
                    v.parse()
                        .map_err(|_| format!("bad --wait-replicas {v:?}"))?,
                );
            }
            "--workload" => {
                let v = value("mixed, plain or chains")?;
                mix = Some(
                    Mix::named(&v).ok_or(format!("--workload {v:?}: mixed, plain or chains"))?,
                );
            }
            // Flags cargo's test runner may pass along (--nocapture, --quiet, …).
            s if s.starts_with('-') => {}
            // (Redis alone, main)
            "failover-redis" => profile = Profile::named("failover"),
            s => {
                profile = Some(Profile::named(s).ok_or(format!("unknown profile {s:?}: {USAGE}"))?)
            }
        }
    }
    let mut profile = profile.unwrap_or_else(|| Profile::named("short").expect("built in"));
    if profile.name == "long-tasks" && mix.is_some() {
        return Err("--workload is for short and long: long-tasks runs long tasks".into());
    }
    let failover = profile.name == "failover";
    if failover != redis.fails_over() {
        return Err(if failover {
            "failover needs --redis sentinel or --redis cluster-replicas".into()
        } else {
            format!("--redis {} is for the failover profile", redis.name())
        });
    }
    if !failover && (wait_replicas.is_some() || freeze) {
        return Err("--wait-replicas and --freeze are for the failover profile".into());
    }
    let mix = mix.unwrap_or(Mix::Mixed);
    match mix {
        Mix::Mixed => {}
        Mix::Plain => profile.chain_rate = 0.0,
        Mix::Chains => profile.rate = 0.0,
    }
    Ok(Args {
        profile,
        seed: seed.unwrap_or_else(|| oracle::now_ms() % 1_000_000),
        report,
        redis,
        mix,
        wait_replicas: wait_replicas.unwrap_or(0),
        freeze,
    })
}

/// Runs the self-tests alone, or a profile: its report printed and written, its exit
/// status its verdict.
fn main() -> ExitCode {
    // `selftest`: only check the record oracle against histories built to break it.
    if std::env::args().skip(1).any(|a| a == "selftest") {
        let mut failed = records::selftest();
        failed.extend(longtasks::selftest());
        failed.extend(chains::selftest());
        for f in &failed {
            eprintln!("chaos: oracle self-test: {f}");
        }
        println!(
            "oracle self-tests (records, chains, long tasks): {}",
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
    if std::env::args().skip(1).any(|a| a == "failover-redis") {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "chaos/failover-redis-{}-{}",
            args.redis.name(),
            oracle::now_ms() / 1000
        ));
        return if failover::redis_only(&dir, args.redis) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let topology = match args.redis {
        Topology::Single => String::new(),
        t => format!(
            "{}{}{}-",
            t.name(),
            if args.wait_replicas > 0 {
                format!("-w{}", args.wait_replicas)
            } else {
                String::new()
            },
            if args.freeze { "-freeze" } else { "" }
        ),
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "chaos/{}-{topology}{}-{}",
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

/// The batch profiles' cluster: 3 masters, 2 managers, batches of 4 with a 5 s lease;
/// the plain queue's 6 slots and the chain workload's 5, as the workload asks.
fn batch_shape(args: &Args) -> Shape {
    Shape {
        masters: 3,
        managers: 2,
        redis: args.redis,
        slots: 6,
        batch_size: 4,
        lease_ms: 5000,
        workload: Workload::Batch {
            plain: args.profile.rate > 0.0,
            chains: args.profile.chain_rate > 0.0,
        },
        wait_replicas: args.wait_replicas,
    }
}

/// A batch profile: the cluster, the producer and the faults, the heal and the drain,
/// the oracle, the shutdown.
fn run(args: &Args, dir: &Path) -> report::Report {
    let started = Instant::now();
    let shape = batch_shape(args);
    let mut report = report::Report::new(&args.profile, args.seed, args.command(), shape.clone());
    let mut failover = (args.profile.name == "failover")
        .then(|| failover::Figures::new(args.redis, args.wait_replicas, args.freeze));
    if failover.is_some() {
        report.kinds = vec![FaultKind::Failover];
    }
    // The record and chain oracles must catch what they claim to before their verdict
    // counts.
    for f in records::selftest() {
        report
            .problems
            .push(format!("the record oracle's self-test: {f}"));
    }
    for f in chains::selftest() {
        report
            .problems
            .push(format!("the chain oracle's self-test: {f}"));
    }
    eprintln!(
        "chaos: profile {} seed {} on Redis {} in {}",
        args.profile.name,
        args.seed,
        args.redis.name(),
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
    let stop = Arc::new(AtomicBool::new(false));
    let producer = start_producer(&c, args, stop.clone());
    let mut rng = Rng::new(args.seed);
    let faults = match &mut failover {
        Some(fig) => failover::phase(&mut c, fig, started),
        None => schedule(&mut c, &args.profile, &mut rng, &FaultKind::ALL),
    };
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
    heal_and_drain(&mut c, &args.profile, &mut report);
    let mut chain_problems = Vec::new();
    let (all, recs) = judge_all(&c, enqueued, &faults, &mut report, &mut chain_problems);
    report.tasks_by_queue = tasks_by_queue(&all);
    let disagree = counters_agree(&report, &all);
    // A failover's lost writes break records, chains and counters: its cost, counted.
    match &mut failover {
        Some(fig) => {
            failover::measure(fig, &all, &recs, &report.verdict);
            failover::attribute_records(
                fig,
                &mut report.verdict.records.mismatches,
                &all,
                &recs,
                &faults,
            );
            fig.chains_wrong.extend(chain_problems);
            fig.counters_wrong.extend(disagree);
        }
        None => {
            report.problems.extend(chain_problems);
            report.problems.extend(disagree);
        }
    }
    report.failover = failover;
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
    slots_rode_it_out(&c, &faults, &mut report.problems);
    report.faults = faults;
    report.seconds = started.elapsed().as_secs_f64();
    report.finish();
    report
}

/// The producer on its own thread and runtime, with its own connection and the default
/// (patient) timeouts, as a real one would have: plain tasks and chains side by side, as
/// the profile's rates ask, each queue opened with the limits its config gives (the
/// chain queue's route makes each of its tasks the global task of a chain). It spawns
/// no process, so PDEATHSIG is not at stake.
fn start_producer(
    c: &Cluster,
    args: &Args,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Vec<Enqueued>, String>> {
    let url = c.redis.url();
    // The producer's enqueues are confirmed as the roles' writes are: an acknowledged
    // task is one `wait_replicas` replicas had.
    let opts = ConnectOptions {
        durability: Durability {
            wait_replicas: c.shape.wait_replicas,
            ..Durability::default()
        },
        ..ConnectOptions::default()
    };
    let p = &args.profile;
    let plan: Vec<(&str, QueueLimits, Make, f64, u64)> = [
        (QUEUE, Make::Plain, p.rate, args.seed ^ 0x5eed),
        (CHAIN_QUEUE, Make::Chains, p.chain_rate, args.seed ^ 0xc4a1),
    ]
    .into_iter()
    .filter(|(_, _, rate, _)| *rate > 0.0)
    .map(|(q, make, rate, seed)| (q, c.limits(q), make, rate, seed))
    .collect();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let client = QueueClient::connect(&url, NAMESPACE, &opts)
                .await
                .map_err(|e| e.to_string())?;
            let mut runs = Vec::new();
            for (name, limits, make, rate, seed) in plan {
                let queue = client.queue_with(name, limits).map_err(|e| e.to_string())?;
                runs.push(oracle::produce(queue, make, rate, seed, stop.clone()));
            }
            Ok(futures::future::join_all(runs).await.concat())
        })
    })
}

/// Waits until the cluster has healed (every slot the map asks for runs again) and the
/// queues have drained (every task acked or dead: nothing ready, delayed or leased in any
/// queue), each within its limit; records the drain's time and the queues' counters.
fn heal_and_drain(c: &mut Cluster, profile: &Profile, report: &mut report::Report) {
    let healing = Instant::now();
    loop {
        let running = c.running_slots();
        if running >= c.shape.min_slots() as usize {
            break;
        }
        if healing.elapsed() > Duration::from_secs(30) {
            report.problems.push(format!(
                "only {running} of {} slots running 30 s after the last fault",
                c.shape.min_slots()
            ));
            break;
        }
        c.idle(Duration::from_millis(250));
    }
    let drain = Instant::now();
    let mut drained = false;
    while drain.elapsed() < profile.drain_limit {
        c.idle(Duration::from_millis(500));
        if let Some(s) = c.stats()
            && s.values().all(|s| s.ready + s.delayed + s.leased == 0)
        {
            drained = true;
            break;
        }
    }
    report.drain_seconds = drain.elapsed().as_secs_f64();
    if !drained {
        report.problems.push(format!(
            "the queues did not drain within {:?}: {:?}",
            profile.drain_limit,
            c.stats()
        ));
    }
    report.queue_stats = c.stats().unwrap_or_default();
}

/// The oracles, once the queues have drained: the chains the run must have made and
/// their follow-ups (which join the tasks to account for), every task's final state and
/// record against the handler's record and the fault log, and every chain whole (what
/// the chain check finds goes to `chain_problems`). Returns every task accounted for,
/// with its record.
fn judge_all(
    c: &Cluster,
    enqueued: Vec<Enqueued>,
    faults: &[Fault],
    report: &mut report::Report,
    chain_problems: &mut Vec<String>,
) -> (Vec<Enqueued>, Records) {
    let (handled, bad) = oracle::read_handled(&c.record);
    if !bad.is_empty() {
        report.problems.push(format!(
            "{} unreadable handler records: {:?}",
            bad.len(),
            &bad[..bad.len().min(5)]
        ));
    }
    let read = Instant::now();
    let Some((mut recs, mut expiries)) = final_records(c, &enqueued) else {
        report
            .problems
            .push("could not read the tasks' records from Redis".into());
        return (enqueued, Records::new());
    };
    let mut all = enqueued;
    if c.shape.chains() {
        report.chains = Some(follow_chains(
            c,
            &handled,
            &mut all,
            &mut recs,
            &mut expiries,
            chain_problems,
        ));
    }
    let mut ids = std::collections::BTreeSet::new();
    if let Some(e) = all.iter().find(|e| !ids.insert(e.id.as_str())) {
        report.problems.push(format!(
            "id {} is accounted for twice: the oracle keys tasks by id",
            e.id
        ));
    }
    match final_states(c, &all) {
        Some(states) => {
            report.verdict = oracle::judge(&all, &handled, &states, faults, c.shape.lease())
        }
        None => report
            .problems
            .push("could not read the tasks' final states from Redis".into()),
    }
    // Every task's record: done, and its history telling the handler's and the fault
    // log's story, take by take.
    let places = c.places();
    let hosts = c.masters.iter().map(|m| m.name.clone()).collect();
    report.verdict.records = records::check(&records::Inputs {
        enqueued: &all,
        handled: &handled,
        records: &recs,
        expiries: &expiries,
        faults,
        places: &places,
        hosts: &hosts,
        max_attempts: MAX_ATTEMPTS,
        history_ttl: QueueLimits::default().history_ttl,
    });
    report.records_seconds = read.elapsed().as_secs_f64();
    dump_records(&c.dir.join("records.txt"), &all, &recs);
    (all, recs)
}

/// The chains the run must have made (`chains.rs`): their follow-ups join `all`, the
/// tasks to account for, with their records and expiries; then every chain is checked
/// whole. Returns the chain check's verdict.
fn follow_chains(
    c: &Cluster,
    handled: &[oracle::Handled],
    all: &mut Vec<Enqueued>,
    recs: &mut Records,
    expiries: &mut Expiries,
    problems: &mut Vec<String>,
) -> chains::ChainVerdict {
    let (cases, found) = chains::cases(c, all, recs, handled);
    problems.extend(found);
    let follow: Vec<Enqueued> = cases.iter().flat_map(ChainCase::follow_ups).collect();
    match final_records(c, &follow) {
        Some((r, e)) => {
            recs.extend(r);
            expiries.extend(e);
        }
        None => problems.push("could not read the follow-ups' records from Redis".into()),
    }
    all.extend(follow);
    let answers: HashMap<String, String> = all
        .iter()
        .filter(|e| e.queue == CHAIN_QUEUE)
        .filter_map(|e| Some((e.id.clone(), e.chain.clone()?)))
        .collect();
    chains::check(c, &cases, recs, &answers)
}

/// Redis's own counters must tell the same story, queue by queue: one creation and one
/// ack per task accounted for there (plus the re-creations an unanswered enqueue can
/// cause; a follow-up is never created twice, invariant 32); and across the queues every
/// reclaimed lease and every retry is in a record. Returns where they disagree.
fn counters_agree(report: &report::Report, all: &[Enqueued]) -> Vec<String> {
    let v = &report.verdict;
    let queue_of: HashMap<&str, &str> = all
        .iter()
        .map(|e| (e.id.as_str(), e.queue.as_str()))
        .collect();
    let mut per: BTreeMap<&str, [u64; 3]> = BTreeMap::new(); // tasks, not acked, re-created
    for e in all {
        per.entry(&e.queue).or_default()[0] += 1;
    }
    for id in v.lost.iter().chain(&v.dead) {
        per.entry(queue_of[id.as_str()]).or_default()[1] += 1;
    }
    for d in &v.duplicates {
        let again = d.causes.iter().flatten();
        let n = again
            .filter(|c| **c == oracle::Cause::EnqueueRetried)
            .count();
        per.entry(queue_of.get(d.id.as_str()).copied().unwrap_or("?"))
            .or_default()[2] += n as u64;
    }
    let mut problems = Vec::new();
    for (queue, [tasks, not_acked, again]) in &per {
        let Some(q) = report.queue_stats.get(*queue) else {
            problems.push(format!("no counters of queue {queue}"));
            continue;
        };
        let acked = tasks - not_acked;
        if q.enqueued_total != tasks + again || q.acked_total != acked + again {
            problems.push(format!(
                "queue {queue}'s counters disagree with the oracle: enqueued {} acked {} for \
                 {tasks} tasks accounted for and {acked} acked ({again} created twice)",
                q.enqueued_total, q.acked_total
            ));
        }
    }
    // Every reclaimed lease is in a record (a re-created task's record holds only its
    // last life), and so is every retry.
    let recreated: u64 = per.values().map(|p| p[2]).sum();
    let expired: u64 = report.queue_stats.values().map(|q| q.expired_total).sum();
    let retried: u64 = report.queue_stats.values().map(|q| q.retried_total).sum();
    let r = &v.records;
    if r.checked == v.enqueued
        && (r.lease_expiries > expired
            || r.retries > retried
            || (recreated == 0 && (r.lease_expiries != expired || r.retries != retried)))
    {
        problems.push(format!(
            "the records disagree with the queues' counters: {} lease expiries and {} \
             retries in the records, {expired} and {retried} counted ({recreated} created \
             twice)",
            r.lease_expiries, r.retries
        ));
    }
    problems
}

/// Tasks accounted for per queue.
fn tasks_by_queue(all: &[Enqueued]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for e in all {
        *out.entry(e.queue.clone()).or_default() += 1;
    }
    out
}

/// No slot exited with an error of its own over the whole run (`Cluster::slot_errors`).
/// The masters' logs must show the slots the faults killed, or the check reads them
/// wrong.
fn slots_rode_it_out(c: &Cluster, faults: &[Fault], problems: &mut Vec<String>) {
    let (exits, errors) = c.slot_errors();
    // (a slot killed alone is logged by its master; one killed with its master is not)
    let killed = faults
        .iter()
        .any(|f| f.injected && f.kind == FaultKind::SlotKill);
    if killed && exits == 0 {
        problems.push(
            "the masters' logs show no slot exit, though slots were killed: the check of \
             slot exits cannot read them"
                .into(),
        );
    }
    for e in errors {
        problems.push(format!("a slot exited on an error of its own: {e}"));
    }
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
    let live: Vec<(u32, String)> = c.tree().into_iter().chain(c.redis.pids()).collect();
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

/// Every task's record (None: it has none) and when it is due to go, read in concurrent
/// chunks (the records) and pipelines per queue (the expiries).
fn final_records(c: &Cluster, enqueued: &[oracle::Enqueued]) -> Option<(Records, Expiries)> {
    let mut recs = HashMap::with_capacity(enqueued.len());
    for chunk in enqueued.chunks(500) {
        let found = c.call(Duration::from_secs(30), async {
            let reads = chunk.iter().map(|e| c.queue(&e.queue).record(&e.id));
            futures::future::try_join_all(reads).await
        })?;
        for (e, r) in chunk.iter().zip(found) {
            recs.insert(e.id.clone(), r);
        }
    }
    let mut by_queue: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for e in enqueued {
        by_queue.entry(&e.queue).or_default().push(e.id.clone());
    }
    let mut expiries = HashMap::with_capacity(enqueued.len());
    for (queue, ids) in by_queue {
        let due = c.record_expiries(queue, &ids)?;
        expiries.extend(ids.into_iter().zip(due));
    }
    Some((recs, expiries))
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
            let finds = chunk.iter().map(|e| c.queue(&e.queue).find(&e.id));
            futures::future::try_join_all(finds).await
        })?;
        for (e, info) in chunk.iter().zip(found) {
            out.insert(e.id.clone(), info.map(|i| i.state));
        }
    }
    Some(out)
}
