//! `gaffer bench --e2e`: the whole path a task takes, measured as a new user would: a
//! real manager and a real master (child processes of this binary, as `gaffer up` runs
//! them) with N no-op slots drain a backlog pushed beforehand, timed from the first ack
//! to the last. Beside it, in the same run against the same Redis, the bare Lua loop
//! both ways: one loop per taker (as `gaffer bench` has always compared) and K loops in
//! flight per taker (the strongest bare figure this machine gives).
//!
//! Each round starts a fresh master after the backlog is queued, so the forks and the
//! first tick are outside the timed span; the manager stays up for the whole run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tokio::process::{Child, Command};

use super::{Bare, BenchOptions, StrongBare, median_f64, per_s, redis_cpu_s, strong_bare};
use crate::queue_client::{NewTask, QueueClient, QueueLimits};

/// Longest one drain may take before the bench gives up on it.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// How often the acked counter is read while a drain runs: one HGET, far below the noise.
const POLL_EVERY: Duration = Duration::from_millis(2);
/// The bench queue's name inside its own namespace.
const QUEUE: &str = "noop";

/// What `gaffer bench --e2e` runs.
#[derive(Debug, Clone)]
pub struct E2eOptions {
    /// Redis, connection settings, tasks, payload size and rounds.
    pub base: BenchOptions,
    /// This binary, to start the manager and the master with.
    pub exe: PathBuf,
    /// No-op slots the master runs.
    pub slots: u32,
    /// Batch sizes to measure, one row each.
    pub batches: Vec<usize>,
    /// Whether the queue's slots prefetch (`prefetch = true`, with `lease` and
    /// `max_batch_time` of 30 s so the config accepts it).
    pub prefetch: Prefetch,
    /// Whether the queue keeps a record per task (`track`).
    pub track: bool,
}

/// Whether the bench queue's slots keep a take in flight while the handler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Prefetch {
    /// The default: one call per batch, settle and next take together.
    Off,
    /// `prefetch = true`.
    On,
}

/// One batch size's figures, each the median of the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct E2eRow {
    /// Tasks per take.
    pub batch: usize,
    /// Slots (end to end) and takers (bare loops).
    pub slots: u32,
    /// Tasks drained per round.
    pub tasks: usize,
    /// End to end through manager, master and slots, first ack to last, tasks/s.
    pub e2e_per_s: f64,
    /// The bare loop, one loop per taker, tasks/s.
    pub bare_per_s: f64,
    /// The bare loop with K loops in flight per taker, at its best K, tasks/s.
    pub strong_bare_per_s: f64,
    /// The K that gave the strong figure.
    pub strong_k: usize,
    /// e2e / bare.
    pub ratio_bare: f64,
    /// e2e / strong bare: the figure issue 15's target is about.
    pub ratio_strong: f64,
    /// Redis CPU (user + sys, `INFO cpu`) per task while the cluster drained, µs: the
    /// scripts' work, the slots' idle takes and the bench's own counter reads.
    pub e2e_redis_us_per_task: f64,
    /// CPU per task of the master's process tree (the master and its slots) from the
    /// first ack to the last, µs: what gaffer's own side spends beside Redis, on the
    /// same cores.
    pub e2e_gaffer_us_per_task: f64,
    /// Redis CPU per task while the single bare loop drained, µs.
    pub bare_redis_us_per_task: f64,
    /// Redis CPU per task while the strong bare loop drained at its best K, µs: where
    /// both are Redis-bound, ratio_strong comes to this over e2e_redis_us_per_task.
    pub strong_redis_us_per_task: f64,
    /// Each round's end-to-end figure, in order.
    pub e2e_rounds: Vec<f64>,
    /// Each round's strong bare figure, in order.
    pub strong_rounds: Vec<f64>,
}

/// Everything `gaffer bench --e2e` measured.
#[derive(Debug, Clone, Serialize)]
pub struct E2eReport {
    /// One row per batch size.
    pub rows: Vec<E2eRow>,
    /// Payload bytes per task.
    pub payload_bytes: usize,
    /// Rounds behind each figure.
    pub rounds: usize,
    /// The 1-minute load average when the run started (the machine is shared).
    pub load_at_start: f64,
    /// Whether the slots prefetched.
    pub prefetch: Prefetch,
    /// Whether the queue kept a record per task.
    pub track: bool,
}

/// The manager (for the run) and the files the roles read and write.
struct Cluster {
    dir: tempfile::TempDir,
    config: PathBuf,
    manager: Child,
    exe: PathBuf,
    url: String,
}

impl Cluster {
    /// Writes a config with one no-op queue of `slots` slots at `batch`, in a namespace of
    /// its own, and starts the manager.
    fn start(opts: &E2eOptions, namespace: &str, batch: usize) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("creating the bench's temp dir")?;
        let config = dir.path().join("bench.toml");
        let password_line = match &opts.base.connect.password {
            Some(p) => {
                let file = dir.path().join("redis-password");
                std::fs::write(&file, p).context("writing the redis password file")?;
                format!("redis_password_file = {:?}\n", file.display().to_string())
            }
            None => String::new(),
        };
        // (the roles confirm their writes as the bench's own client does)
        let durability = opts.base.connect.durability;
        let wait_lines = format!(
            "wait_replicas = {}\nwait_timeout = \"{}ms\"\n",
            durability.wait_replicas,
            durability.wait_timeout.as_millis()
        );
        let (slots, track) = (opts.slots, opts.track);
        let prefetch = match opts.prefetch {
            Prefetch::Off => "",
            Prefetch::On => "prefetch = true\nlease = \"30s\"\nmax_batch_time = \"30s\"\n",
        };
        let text = format!(
            "[cluster]\nnamespace = \"{namespace}\"\n{password_line}{wait_lines}\n\
             [manager]\ntick = \"500ms\"\nhttp = \"127.0.0.1:0\"\n\n\
             [master]\nhttp = \"127.0.0.1:0\"\n\n\
             [queues.{QUEUE}]\nhandler = \"noop\"\nmin_slots = {slots}\nmax_slots = {slots}\n\
             batch_size = {batch}\ntrack = {track}\nmax_payload = \"1MiB\"\n{prefetch}"
        );
        std::fs::write(&config, text).context("writing the bench's config")?;
        let mut cluster = Cluster {
            manager: spawn_role(&opts.exe, &config, &opts.base.url, dir.path(), "manager")?,
            dir,
            config,
            exe: opts.exe.clone(),
            url: opts.base.url.clone(),
        };
        cluster.check_alive()?;
        Ok(cluster)
    }

    /// A master for one round.
    fn start_master(&self) -> anyhow::Result<Child> {
        spawn_role(
            &self.exe,
            &self.config,
            &self.url,
            self.dir.path(),
            "master",
        )
    }

    /// Fails with the manager's log when it has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.manager.try_wait()? {
            anyhow::bail!(
                "the bench's manager exited ({status}): {}",
                log_tail(&self.dir.path().join("manager.log"))
            );
        }
        Ok(())
    }
}

/// Starts `gaffer --config CONFIG ROLE` with its log in `dir`, killed if this process
/// goes away first.
fn spawn_role(
    exe: &Path,
    config: &Path,
    url: &str,
    dir: &Path,
    role: &str,
) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join(format!("{role}.log")))
        .with_context(|| format!("creating the {role}'s log"))?;
    Command::new(exe)
        .arg("--config")
        .arg(config)
        .arg(role)
        .env("GAFFER_REDIS", url)
        .env("GAFFER_HOST", format!("bench-{}", std::process::id()))
        // The bench shares its machine with the load it makes: a master must take its
        // slots however high the load average climbs.
        .env("GAFFER_MAX_LOAD_PER_CPU", "1000")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the bench's {role} ({})", exe.display()))
}

/// The last lines of a role's log, for an error.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// Stops a child with SIGTERM (a master drains its slots) and waits for it.
async fn stop(mut child: Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// The 1-minute load average, or 0 when unreadable.
fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Runs every batch size's rounds; `progress` is told what runs now.
pub async fn run(opts: &E2eOptions, mut progress: impl FnMut(&str)) -> anyhow::Result<E2eReport> {
    let load_at_start = load1();
    let mut rows = Vec::new();
    for &batch in &opts.batches {
        rows.push(row(opts, batch, &mut progress).await?);
    }
    Ok(E2eReport {
        rows,
        payload_bytes: opts.base.payload_bytes,
        rounds: opts.base.rounds.max(1),
        load_at_start,
        prefetch: opts.prefetch,
        track: opts.track,
    })
}

/// One batch size: a cluster of its own, then rounds in which the end-to-end drain, the
/// single bare loop and the strong bare loop alternate.
async fn row(
    opts: &E2eOptions,
    batch: usize,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<E2eRow> {
    let namespace = format!("{}.bench-e2e.{}", opts.base.namespace, std::process::id());
    let client = QueueClient::connect(&opts.base.url, &namespace, &opts.base.connect).await?;
    let limits = QueueLimits {
        track: opts.track,
        ..QueueLimits::default()
    };
    let q = client.queue_with(QUEUE, limits)?;
    let bare = Bare::new(client.connection(), &namespace, "bare");
    let mut takers = Vec::new();
    for _ in 0..opts.slots.max(1) {
        takers.push(QueueClient::connect(&opts.base.url, &namespace, &opts.base.connect).await?);
    }
    let counter = Counter {
        conn: client.connection(),
        key: format!("{namespace}:{{{QUEUE}}}:stats"),
    };
    let mut cluster = Cluster::start(opts, &namespace, batch)?;
    let sides = Sides {
        q: &q,
        bare: &bare,
        takers: &takers,
        counter: &counter,
    };
    let result = super::unless_stopped(
        &opts.base.stop,
        rounds(opts, batch, &mut cluster, &sides, progress),
    )
    .await;
    stop(cluster.manager).await;
    let _ = q.delete_all().await;
    let _ = bare.delete().await;
    let _ = clear_namespace(&client, &namespace).await;
    result
}

/// What one row's rounds work on.
struct Sides<'a> {
    /// The cluster's queue, filled before each round.
    q: &'a crate::queue_client::Queue,
    /// The bare loop's keys.
    bare: &'a Bare,
    /// One connection per bare taker, as many as the slots.
    takers: &'a [QueueClient],
    /// The cluster queue's acked counter.
    counter: &'a Counter,
}

/// The rounds of one row, and the row from their medians.
async fn rounds(
    opts: &E2eOptions,
    batch: usize,
    cluster: &mut Cluster,
    sides: &Sides<'_>,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<E2eRow> {
    let Sides {
        q,
        bare,
        takers,
        counter,
    } = *sides;
    let n = opts.base.tasks;
    let payload = vec![b'x'; opts.base.payload_bytes];
    let tasks: Vec<NewTask> = (0..n).map(|_| NewTask::new(payload.clone())).collect();
    let rounds = opts.base.rounds.max(1);
    let (mut e2e, mut single, mut strong) = (Vec::new(), Vec::new(), Vec::new());
    let mut best_k = Vec::new();
    let (mut e2e_cpu, mut bare_cpu, mut strong_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let mut gaffer_cpu = Vec::new();
    for round in 1..=rounds {
        progress(&format!(
            "e2e, batch {batch}, {} slots, {n} tasks, round {round}/{rounds}",
            opts.slots
        ));
        q.enqueue_many(&tasks).await?;
        let cpu = redis_cpu_s(&mut counter.conn.clone()).await?;
        let master = cluster.start_master()?;
        let timed = time_drain(counter, n, master.id()).await;
        e2e_cpu.push(per_task_us(
            redis_cpu_s(&mut counter.conn.clone()).await? - cpu,
            n,
        ));
        stop(master).await;
        cluster.check_alive()?;
        let (rate, tree_us) = timed?;
        e2e.push(rate);
        gaffer_cpu.push(tree_us);

        progress(&format!("bare loop, batch {batch}, round {round}/{rounds}"));
        bare.fill(n, &payload).await?;
        let cpu = redis_cpu_s(&mut counter.conn.clone()).await?;
        let t = Instant::now();
        let moved = super::bare_drain_with(takers.iter(), bare, batch).await?;
        anyhow::ensure!(moved == n, "bare loop drained {moved} of {n}");
        single.push(per_s(n, t.elapsed()));
        bare_cpu.push(per_task_us(
            redis_cpu_s(&mut counter.conn.clone()).await? - cpu,
            n,
        ));
        bare.delete().await?;

        progress(&format!(
            "bare loop, K in flight per taker, batch {batch}, round {round}/{rounds}"
        ));
        let StrongBare {
            per_s,
            k,
            redis_us_per_task,
        } = strong_bare(takers, bare, batch, n, &payload).await?;
        strong.push(per_s);
        strong_cpu.push(redis_us_per_task);
        best_k.push(k);
    }
    let (e, s, st) = (median_f64(&e2e), median_f64(&single), median_f64(&strong));
    best_k.sort_unstable();
    Ok(E2eRow {
        batch,
        slots: opts.slots,
        tasks: n,
        e2e_per_s: e,
        bare_per_s: s,
        strong_bare_per_s: st,
        strong_k: best_k[best_k.len() / 2],
        ratio_bare: e / s,
        ratio_strong: e / st,
        e2e_redis_us_per_task: median_f64(&e2e_cpu),
        e2e_gaffer_us_per_task: median_f64(&gaffer_cpu),
        bare_redis_us_per_task: median_f64(&bare_cpu),
        strong_redis_us_per_task: median_f64(&strong_cpu),
        e2e_rounds: e2e,
        strong_rounds: strong,
    })
}

/// Waits until all `n` tasks are acked (the queue's `acked` counter, from what it was
/// when called); the rate from the first ack to the last, and the CPU per task (µs) of
/// the process tree of `master` over the same span.
async fn time_drain(
    counter: &Counter,
    n: usize,
    master: Option<u32>,
) -> anyhow::Result<(f64, f64)> {
    let base = acked_total(counter).await?;
    let deadline = Instant::now() + DRAIN_LIMIT;
    let mut first: Option<(Instant, u64, f64)> = None;
    let tree_cpu = || master.map_or(0.0, tree_cpu_s);
    loop {
        let acked = acked_total(counter).await? - base;
        let now = Instant::now();
        if acked > 0 && first.is_none() {
            first = Some((now, acked, tree_cpu()));
        }
        if acked >= n as u64 {
            let (t0, a0, cpu0) = first.unwrap_or((now, 0, 0.0));
            // The first poll that saw acks already missed some: count from there.
            let tasks = (acked - a0).max(1);
            let rate = tasks as f64 / now.duration_since(t0).as_secs_f64().max(1e-9);
            return Ok((rate, per_task_us(tree_cpu() - cpu0, tasks as usize)));
        }
        anyhow::ensure!(
            now < deadline,
            "the master drained {acked} of {n} tasks in {} s",
            DRAIN_LIMIT.as_secs()
        );
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// CPU seconds (user + system) spent so far by `root` and its descendants alive now.
fn tree_cpu_s(root: u32) -> f64 {
    let Ok(tree) = crate::host::sysinfo::ProcTree::read() else {
        return 0.0;
    };
    let ticks = procfs::ticks_per_second() as f64;
    std::iter::once(root)
        .chain(tree.descendants(root))
        .filter_map(|pid| procfs::process::Process::new(pid as i32).ok()?.stat().ok())
        .map(|s| (s.utime + s.stime) as f64 / ticks)
        .sum()
}

/// Where a queue counts its acks (the stats hash of `queue_client`'s key layout).
struct Counter {
    conn: crate::queue_client::RedisConn,
    key: String,
}

/// The queue's `acked` counter: one HGET, lighter than the stats script, since it runs
/// every [`POLL_EVERY`] beside the work it times.
async fn acked_total(counter: &Counter) -> anyhow::Result<u64> {
    let mut conn = counter.conn.clone();
    let v: Option<u64> = redis::cmd("HGET")
        .arg(&counter.key)
        .arg("acked")
        .query_async(&mut conn)
        .await?;
    Ok(v.unwrap_or(0))
}

/// CPU seconds spent on `n` tasks, as µs per task.
fn per_task_us(cpu_s: f64, n: usize) -> f64 {
    cpu_s * 1e6 / n.max(1) as f64
}

/// Deletes what the bench's cluster left in its namespace (hosts, map, config).
async fn clear_namespace(client: &QueueClient, namespace: &str) -> anyhow::Result<()> {
    let mut conn = client.connection();
    let pattern = format!("{namespace}:*");
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            redis::cmd("DEL")
                .arg(&keys)
                .query_async::<()>(&mut conn)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

impl E2eReport {
    /// The report as an aligned table.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<30} {:>10} {:>10} {:>6} {:>12} {:>4} {:>6}",
            "end to end (first ack to last)",
            "gaffer/s",
            "bare/s",
            "ratio",
            "strong bare/s",
            "K",
            "ratio"
        );
        let _ = writeln!(
            out,
            "(each figure: median of {} rounds; payload {} bytes; load average {:.2} at the start; prefetch {}; records {})",
            self.rounds,
            self.payload_bytes,
            self.load_at_start,
            match self.prefetch {
                Prefetch::Off => "off",
                Prefetch::On => "on",
            },
            if self.track { "on" } else { "off" }
        );
        let mut cpu = String::new();
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{:<30} {:>10.0} {:>10.0} {:>6.2} {:>12.0} {:>4} {:>6.2}",
                format!("batch {:>3}, {} slots, {} tasks", r.batch, r.slots, r.tasks),
                r.e2e_per_s,
                r.bare_per_s,
                r.ratio_bare,
                r.strong_bare_per_s,
                r.strong_k,
                r.ratio_strong
            );
            let _ = writeln!(
                cpu,
                "batch {:>3}: Redis CPU per task {:.2} µs end to end (the master and its slots \
                 {:.2} µs), {:.2} µs bare loop, {:.2} µs strong bare loop",
                r.batch,
                r.e2e_redis_us_per_task,
                r.e2e_gaffer_us_per_task,
                r.bare_redis_us_per_task,
                r.strong_redis_us_per_task
            );
        }
        out.push_str(&cpu);
        out
    }
}
