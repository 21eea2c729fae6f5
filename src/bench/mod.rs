//! `gaffer bench`: the queue's throughput and wake-up latency on the configured Redis,
//! each figure beside a bare Lua loop measured in the same run against the same Redis,
//! because these machines are shared and noisy and only ratios travel.
//!
//! The bare loop is the least a leased queue can do (a FIFO list, a lease sorted set, a
//! payload hash, no priorities, dedup, attempts or tokens), so the ratio says what
//! gaffer's guarantees cost. It runs two ways: one loop per taker, each waiting for its
//! reply before the next call (the shape of a slot's loop), and K loops in flight per
//! taker's connection, at the K that gives the best figure: the strongest reference this
//! Redis gives, which end-to-end figures (`--e2e`) are held against.

pub mod api;
pub mod e2e;

use std::time::{Duration, Instant};

use redis::Script;
use serde::Serialize;

use crate::queue_client::{
    ConnectOptions, NewTask, Queue, QueueClient, QueueError, QueueLimits, RedisConn, Settle,
    SettleOp,
};

/// What to measure and how much.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Redis URL.
    pub url: String,
    /// Connection settings (password).
    pub connect: ConnectOptions,
    /// Key namespace; bench queues are named `bench.PID.*` inside it and deleted after.
    pub namespace: String,
    /// Tasks per batch-100 run; batch 10 uses half, batch 1 a tenth.
    pub tasks: usize,
    /// Payload size of each task.
    pub payload_bytes: usize,
    /// Wake-up latency samples.
    pub wake_samples: usize,
    /// Batch sizes to measure take+ack at.
    pub batches: Vec<usize>,
    /// Numbers of concurrent takers to measure take+ack with.
    pub takers: Vec<usize>,
    /// Alternating rounds per figure; each side reports its median.
    pub rounds: usize,
    /// Cancelled to stop early (Ctrl-C): the bench then deletes what it made and returns
    /// [`interrupted`].
    pub stop: tokio_util::sync::CancellationToken,
}

/// The error of a bench stopped through its `stop` token, after its cleanup.
pub fn interrupted() -> anyhow::Error {
    anyhow::anyhow!("interrupted: the bench's queues and keys were deleted")
}

/// `work`, unless `stop` is cancelled first: then [`interrupted`], `work` dropped (the
/// caller's cleanup runs next).
pub(crate) async fn unless_stopped<T>(
    stop: &tokio_util::sync::CancellationToken,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::select! {
        r = work => r,
        () = stop.cancelled() => Err(interrupted()),
    }
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            url: String::new(),
            connect: ConnectOptions::default(),
            namespace: "gaffer".into(),
            tasks: 100_000,
            payload_bytes: 16,
            wake_samples: 500,
            batches: vec![1, 10, 100],
            takers: vec![1, 2],
            rounds: 3,
            stop: tokio_util::sync::CancellationToken::new(),
        }
    }
}

/// One throughput figure, with the bare loop's beside it.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// gaffer, tasks per second.
    pub gaffer_per_s: f64,
    /// The bare Lua loop, tasks per second.
    pub bare_per_s: f64,
    /// gaffer / bare.
    pub ratio: f64,
    /// Tasks moved in each measurement.
    pub tasks: usize,
}

/// Take+ack at one batch size and number of takers.
#[derive(Debug, Clone, Serialize)]
pub struct TakeAck {
    /// Tasks per take.
    pub batch: usize,
    /// Concurrent takers, each with its own connection (as slots have).
    pub takers: usize,
    /// The figures.
    #[serde(flatten)]
    pub throughput: Throughput,
}

/// Take+ack beside the strong bare loop (K loops in flight per taker, best K).
#[derive(Debug, Clone, Serialize)]
pub struct StrongRow {
    /// Tasks per take.
    pub batch: usize,
    /// Takers, each with its own connection.
    pub takers: usize,
    /// gaffer's take+ack (one loop per taker, two round trips per batch), tasks per second.
    pub gaffer_per_s: f64,
    /// gaffer's loop as a slot now runs it: settle of one batch and take of the next in
    /// one call (`Queue::settle_take`), one round trip per batch; tasks per second.
    pub combined_per_s: f64,
    /// The strong bare loop, tasks per second (median over rounds of each round's best K).
    pub strong_bare_per_s: f64,
    /// The K most rounds found best.
    pub k: usize,
    /// gaffer's take+ack / strong bare.
    pub ratio: f64,
    /// gaffer's settle+take / strong bare.
    pub combined_ratio: f64,
}

/// Enqueue-to-start latency of an idle taker.
#[derive(Debug, Clone, Serialize)]
pub struct WakeLatency {
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
    /// Samples taken.
    pub samples: usize,
}

/// What keeping a record per task costs, each figure tracked beside untracked in the same
/// run (`gaffer_per_s` is the tracked queue, `bare_per_s` the untracked one).
#[derive(Debug, Clone, Serialize)]
pub struct RecordCost {
    /// Bulk enqueue, tracked / untracked.
    pub enqueue: Throughput,
    /// Take+ack at batch 100 with two takers (as two slots), tracked / untracked.
    pub take_ack: Throughput,
    /// Redis memory of one finished task's record (`MEMORY USAGE`, no payload, a
    /// three-entry history), bytes.
    pub record_bytes: u64,
    /// The record's share of the listing and expiry indexes (`MEMORY USAGE` / entries).
    pub index_bytes_per_task: f64,
}

/// Everything `gaffer bench` measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Bulk enqueue (pipelined script calls of 1,000 tasks).
    pub enqueue: Throughput,
    /// Take+ack, one row per batch size × takers.
    pub take_ack: Vec<TakeAck>,
    /// Take+ack at batch 10 and over with the most takers, beside the strong bare loop.
    pub strong_bare: Vec<StrongRow>,
    /// Idle wake-up.
    pub wakeup: WakeLatency,
    /// What task records cost: the same work with `track = true` beside `track = false`.
    pub records: RecordCost,
    /// Payload bytes per task.
    pub payload_bytes: usize,
    /// Alternating rounds behind each throughput figure (each side's median).
    pub rounds: usize,
}

#[derive(Clone)]
struct Bare {
    conn: RedisConn,
    ready: String,
    leased: String,
    payload: String,
    seq: String,
    enqueue: Script,
    take: Script,
    ack: Script,
}

impl Bare {
    fn new(conn: RedisConn, namespace: &str, name: &str) -> Self {
        let k = |s: &str| format!("{namespace}:{{{name}}}:{s}");
        Bare {
            conn,
            ready: k("ready"),
            leased: k("leased"),
            payload: k("payload"),
            seq: k("seq"),
            enqueue: Script::new(include_str!("bare_enqueue.lua")),
            take: Script::new(include_str!("bare_take.lua")),
            ack: Script::new(include_str!("bare_ack.lua")),
        }
    }

    async fn fill(&self, n: usize, payload: &[u8]) -> Result<(), QueueError> {
        use futures::{StreamExt, TryStreamExt};
        let chunks: Vec<usize> = (0..n).step_by(1000).map(|i| (n - i).min(1000)).collect();
        futures::stream::iter(chunks)
            .map(|len| {
                let mut conn = self.conn.clone();
                let mut inv = self.enqueue.prepare_invoke();
                inv.key(&self.payload).key(&self.ready).key(&self.seq);
                for _ in 0..len {
                    inv.arg(payload);
                }
                async move { inv.invoke_async::<i64>(&mut conn).await }
            })
            .buffered(8)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }

    async fn drain(&self, conn: &mut RedisConn, batch: usize) -> Result<usize, QueueError> {
        let mut done = 0;
        loop {
            let (ids, _payloads): (Vec<Vec<u8>>, Vec<Vec<u8>>) = self
                .take
                .key(&self.ready)
                .key(&self.leased)
                .key(&self.payload)
                .arg(batch)
                .arg(30_000)
                .invoke_async(conn)
                .await?;
            if ids.is_empty() {
                return Ok(done);
            }
            let mut inv = self.ack.prepare_invoke();
            inv.key(&self.leased).key(&self.payload);
            for id in &ids {
                inv.arg(id);
            }
            done += inv.invoke_async::<usize>(conn).await?;
        }
    }

    async fn delete(&self) -> Result<(), QueueError> {
        let mut conn = self.conn.clone();
        redis::cmd("DEL")
            .arg(&self.ready)
            .arg(&self.leased)
            .arg(&self.payload)
            .arg(&self.seq)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }
}

/// How a gaffer taker loops.
#[derive(Debug, Clone, Copy)]
enum Loop {
    /// take, then ack: two round trips per batch.
    TakeAck,
    /// settle of one batch with the take of the next (`settle_take`): one round trip per
    /// batch, as a slot runs.
    SettleTake,
}

async fn drain(q: &Queue, batch: usize, how: Loop) -> Result<usize, QueueError> {
    let lease = Duration::from_secs(30);
    let mut done = 0;
    let mut b = q.take(batch, lease).await?;
    while !b.tasks.is_empty() {
        done += b.tasks.len();
        b = match how {
            Loop::TakeAck => {
                q.ack(&b.tasks).await?;
                q.take(batch, lease).await?
            }
            Loop::SettleTake => {
                let ops: Vec<SettleOp> = b
                    .tasks
                    .iter()
                    .map(|t| SettleOp::new(t, Settle::Ack))
                    .collect();
                q.settle_take(&ops, batch, lease).await?.1
            }
        };
    }
    Ok(done)
}

/// Drains `q` with one taker per client (each with its own connection, as slots have),
/// all at once; returns how many tasks they moved.
async fn drain_with<'a>(
    clients: impl Iterator<Item = &'a QueueClient>,
    q: &Queue,
    batch: usize,
    how: Loop,
) -> anyhow::Result<usize> {
    let mut handles = Vec::new();
    for c in clients {
        let q = c.queue_with(q.name(), q.limits())?;
        handles.push(tokio::spawn(async move { drain(&q, batch, how).await }));
    }
    let mut moved = 0;
    for h in handles {
        moved += h.await??;
    }
    Ok(moved)
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

fn per_s(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

fn throughput(n: usize, gaffer: Duration, bare: Duration) -> Throughput {
    let g = per_s(n, gaffer);
    let b = per_s(n, bare);
    Throughput {
        gaffer_per_s: g,
        bare_per_s: b,
        ratio: g / b,
        tasks: n,
    }
}

/// Runs every measurement; `progress` is told what runs now (for a progress line).
pub async fn run(
    opts: &BenchOptions,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<BenchReport> {
    let prefix = format!("bench.{}", std::process::id());
    let main = QueueClient::connect(&opts.url, &opts.namespace, &opts.connect).await?;
    let limits = QueueLimits {
        max_payload: opts.payload_bytes.max(1) as u64,
        max_attempts: 0,
        // The queue machinery alone, as the bare loop it is compared with keeps no record.
        track: false,
        ..QueueLimits::default()
    };
    let payload = vec![b'x'; opts.payload_bytes];
    let q = main.queue_with(&format!("{prefix}.q"), limits)?;
    let bare = Bare::new(
        main.connection(),
        &opts.namespace,
        &format!("{prefix}.bare"),
    );
    let result = unless_stopped(
        &opts.stop,
        measure(opts, &q, &bare, &payload, &mut progress),
    )
    .await;
    // Clean up whatever happened; a failed bench must not leave its tasks behind.
    let _ = q.delete_all().await;
    let _ = bare.delete().await;
    result
}

/// Every figure in turn, against `q` and the bare loop.
async fn measure(
    opts: &BenchOptions,
    q: &Queue,
    bare: &Bare,
    payload: &[u8],
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<BenchReport> {
    let rounds = opts.rounds.max(1);
    let tasks: Vec<NewTask> = (0..opts.tasks)
        .map(|_| NewTask::new(payload.to_vec()))
        .collect();
    let enqueue = bulk_enqueue(opts, q, bare, &tasks, payload, progress).await?;
    let clients = connect_takers(opts).await?;
    let take_ack = take_ack_rows(opts, q, bare, &clients, &tasks, payload, progress).await?;
    let strong_bare = strong_rows(opts, &take_ack, q, bare, &clients, payload, progress).await?;
    let wakeup = wake_latency(opts, q, payload, progress).await?;
    let records = record_cost(opts, q, &clients, payload, progress).await?;
    Ok(BenchReport {
        enqueue,
        take_ack,
        strong_bare,
        wakeup,
        records,
        payload_bytes: opts.payload_bytes,
        rounds,
    })
}

/// Bulk enqueue of `tasks`, gaffer beside the bare loop.
async fn bulk_enqueue(
    opts: &BenchOptions,
    q: &Queue,
    bare: &Bare,
    tasks: &[NewTask],
    payload: &[u8],
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<Throughput> {
    let n = tasks.len();
    let rounds = opts.rounds.max(1);
    // gaffer and the bare loop alternate, round after round, and each side keeps its
    // median: a burst of noise then hits both sides or neither.
    let (mut g, mut b) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        progress(&format!(
            "bulk enqueue of {n} tasks, round {round}/{rounds}"
        ));
        let t = Instant::now();
        q.enqueue_many(tasks).await?;
        g.push(t.elapsed());
        q.delete_all().await?;
        let t = Instant::now();
        bare.fill(n, payload).await?;
        b.push(t.elapsed());
        bare.delete().await?;
    }
    Ok(throughput(n, median(g), median(b)))
}

/// One client per taker of the largest number measured: each taker has its own
/// connection, as each slot does.
async fn connect_takers(opts: &BenchOptions) -> anyhow::Result<Vec<QueueClient>> {
    let mut clients = Vec::new();
    for _ in 0..opts.takers.iter().copied().max().unwrap_or(1) {
        clients.push(QueueClient::connect(&opts.url, &opts.namespace, &opts.connect).await?);
    }
    Ok(clients)
}

/// Take+ack for every batch size × number of takers, each row from the tasks of
/// `tasks` its batch size moves (fewer for small batches, which are slow).
async fn take_ack_rows(
    opts: &BenchOptions,
    q: &Queue,
    bare: &Bare,
    clients: &[QueueClient],
    tasks: &[NewTask],
    payload: &[u8],
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<Vec<TakeAck>> {
    let n = tasks.len();
    let rounds = opts.rounds.max(1);
    let mut take_ack = Vec::new();
    for &batch in &opts.batches {
        let count = match batch {
            1 => n / 10,
            2..=10 => n / 2,
            _ => n,
        }
        .clamp(batch, n.max(batch));
        let count_tasks = &tasks[..count.min(n)];
        let count = count_tasks.len();
        for &takers in &opts.takers {
            let (mut g, mut b) = (Vec::new(), Vec::new());
            for round in 1..=rounds {
                progress(&format!(
                    "take+ack, batch {batch}, {takers} taker(s), {count} tasks, round {round}/{rounds}"
                ));
                q.enqueue_many(count_tasks).await?;
                let t = Instant::now();
                let moved =
                    drain_with(clients.iter().take(takers), q, batch, Loop::TakeAck).await?;
                g.push(t.elapsed());
                anyhow::ensure!(moved == count, "gaffer drained {moved} of {count}");

                bare.fill(count, payload).await?;
                let t = Instant::now();
                let moved = bare_drain_with(clients.iter().take(takers), bare, batch).await?;
                b.push(t.elapsed());
                anyhow::ensure!(moved == count, "bare loop drained {moved} of {count}");
                bare.delete().await?;
            }
            take_ack.push(TakeAck {
                batch,
                takers,
                throughput: throughput(count, median(g), median(b)),
            });
        }
    }
    Ok(take_ack)
}

/// The strong bare loop for each take+ack row at batch 10 and over with the most takers,
/// its rounds' median beside the row's gaffer figure (measured minutes before, on the
/// same Redis: a ratio across a few seconds rather than alternating rounds).
async fn strong_rows(
    opts: &BenchOptions,
    rows: &[TakeAck],
    q: &Queue,
    bare: &Bare,
    clients: &[QueueClient],
    payload: &[u8],
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<Vec<StrongRow>> {
    let rounds = opts.rounds.max(1);
    let most = clients.len();
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.batch >= 10 && r.takers == most) {
        let n = r.throughput.tasks;
        let (mut rates, mut ks, mut combined) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=rounds {
            progress(&format!(
                "settle+take in one call, batch {}, {most} takers, round {round}/{rounds}",
                r.batch
            ));
            let tasks: Vec<NewTask> = (0..n).map(|_| NewTask::new(payload.to_vec())).collect();
            q.enqueue_many(&tasks).await?;
            let t = Instant::now();
            let moved = drain_with(clients.iter(), q, r.batch, Loop::SettleTake).await?;
            combined.push(per_s(n, t.elapsed()));
            anyhow::ensure!(moved == n, "gaffer (settle+take) drained {moved} of {n}");
            progress(&format!(
                "bare loop, K in flight per taker, batch {}, {most} takers, round {round}/{rounds}",
                r.batch
            ));
            let s = strong_bare(clients, bare, r.batch, r.throughput.tasks, payload).await?;
            rates.push(s.per_s);
            ks.push(s.k);
        }
        ks.sort_unstable();
        let strong = median_f64(&rates);
        let combined = median_f64(&combined);
        out.push(StrongRow {
            batch: r.batch,
            takers: most,
            gaffer_per_s: r.throughput.gaffer_per_s,
            combined_per_s: combined,
            strong_bare_per_s: strong,
            k: ks[ks.len() / 2],
            ratio: r.throughput.gaffer_per_s / strong,
            combined_ratio: combined / strong,
        });
    }
    Ok(out)
}

/// [`drain_with`] for the bare loop: one taker per client, all at once.
async fn bare_drain_with<'a>(
    clients: impl Iterator<Item = &'a QueueClient>,
    bare: &Bare,
    batch: usize,
) -> anyhow::Result<usize> {
    bare_drain_k(clients, bare, batch, 1).await
}

/// The K values tried for the strong bare loop: loops in flight per taker's connection.
const STRONG_KS: [usize; 5] = [1, 2, 4, 8, 16];

/// The strong bare loop's best figure and the K that gave it.
#[derive(Debug, Clone, Copy)]
struct StrongBare {
    /// Tasks per second at the best K.
    per_s: f64,
    /// Loops in flight per taker at that figure.
    k: usize,
    /// Redis's CPU per task at that figure (µs, user and system): what the ratio of two
    /// Redis-bound figures comes down to.
    redis_us_per_task: f64,
}

/// Redis's CPU seconds so far (user and system), from `INFO cpu` (also read by the
/// `settle_take_cost` example).
pub async fn redis_cpu_s(conn: &mut crate::queue_client::RedisConn) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    Ok(info
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_user" || *k == "used_cpu_sys")
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum())
}

/// The bare loop with K loops in flight on each taker's connection, for every K of
/// [`STRONG_KS`] (each draining `n` tasks it filled first); the best.
async fn strong_bare(
    clients: &[QueueClient],
    bare: &Bare,
    batch: usize,
    n: usize,
    payload: &[u8],
) -> anyhow::Result<StrongBare> {
    let mut best = StrongBare {
        per_s: 0.0,
        k: 1,
        redis_us_per_task: 0.0,
    };
    let mut conn = bare.conn.clone();
    for k in STRONG_KS {
        bare.fill(n, payload).await?;
        let cpu = redis_cpu_s(&mut conn).await?;
        let t = Instant::now();
        let moved = bare_drain_k(clients, bare, batch, k).await?;
        let rate = per_s(n, t.elapsed());
        let redis_us_per_task = (redis_cpu_s(&mut conn).await? - cpu) * 1e6 / n.max(1) as f64;
        tracing::debug!(
            k,
            batch,
            per_s = rate as u64,
            redis_us_per_task,
            "strong bare loop"
        );
        bare.delete().await?;
        anyhow::ensure!(
            moved == n,
            "bare loop ({k} in flight) drained {moved} of {n}"
        );
        if rate > best.per_s {
            best = StrongBare {
                per_s: rate,
                k,
                redis_us_per_task,
            };
        }
    }
    Ok(best)
}

/// [`bare_drain_with`] with `k` loops at once on each client's connection (their calls
/// pipelined on its socket).
async fn bare_drain_k<'a>(
    clients: impl IntoIterator<Item = &'a QueueClient>,
    bare: &Bare,
    batch: usize,
    k: usize,
) -> anyhow::Result<usize> {
    let mut handles = Vec::new();
    for c in clients {
        for _ in 0..k {
            let b = Bare {
                conn: c.connection(),
                ..bare.clone()
            };
            handles.push(tokio::spawn(async move {
                let mut conn = b.conn.clone();
                b.drain(&mut conn, batch).await
            }));
        }
    }
    let mut moved = 0;
    for h in handles {
        moved += h.await??;
    }
    Ok(moved)
}

/// The median of rates.
fn median_f64(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The same queue work with records and without, alternating rounds; then the memory of
/// finished records.
async fn record_cost(
    opts: &BenchOptions,
    untracked: &Queue,
    clients: &[QueueClient],
    payload: &[u8],
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<RecordCost> {
    let n = opts.tasks;
    let rounds = opts.rounds.max(1);
    let tracked_limits = QueueLimits {
        track: true,
        ..untracked.limits()
    };
    let tracked_name = format!("{}.tracked", untracked.name());
    let tracked = clients[0].queue_with(&tracked_name, tracked_limits)?;
    let tasks: Vec<NewTask> = (0..n).map(|_| NewTask::new(payload.to_vec())).collect();
    let result = async {
        let (mut t_enq, mut u_enq, mut t_ta, mut u_ta) = (vec![], vec![], vec![], vec![]);
        for round in 1..=rounds {
            progress(&format!(
                "records: tracked beside untracked, round {round}/{rounds}"
            ));
            for (q, enq, ta) in [
                (&tracked, &mut t_enq, &mut t_ta),
                (untracked, &mut u_enq, &mut u_ta),
            ] {
                let t = Instant::now();
                q.enqueue_many(&tasks).await?;
                enq.push(t.elapsed());
                let t = Instant::now();
                let moved = drain_with(clients.iter().take(2), q, 100, Loop::TakeAck).await?;
                ta.push(t.elapsed());
                anyhow::ensure!(moved == n, "drained {moved} of {n}");
                q.delete_all().await?;
            }
        }
        let (record_bytes, index_bytes_per_task) = record_memory(&tracked).await?;
        Ok(RecordCost {
            enqueue: throughput(n, median(t_enq), median(u_enq)),
            take_ack: throughput(n, median(t_ta), median(u_ta)),
            record_bytes,
            index_bytes_per_task,
        })
    }
    .await;
    let _ = tracked.delete_all().await;
    result
}

/// Memory of a finished task's record (empty payload, three history entries: waiting,
/// running, done) and of its index entry, over 1,000 such tasks.
async fn record_memory(q: &Queue) -> anyhow::Result<(u64, f64)> {
    const N: usize = 1000;
    let tasks: Vec<NewTask> = (0..N).map(|_| NewTask::new(Vec::new())).collect();
    let made = q.enqueue_many(&tasks).await?;
    loop {
        let b = q.take(N, Duration::from_secs(30)).await?;
        if b.tasks.is_empty() {
            break;
        }
        q.ack(&b.tasks).await?;
    }
    let m = q.record_memory(&made[N / 2].id).await?;
    anyhow::ensure!(m.record_bytes > 0, "the finished task has no record");
    q.delete_all().await?;
    let per = |bytes: u64, n: u64| bytes as f64 / n.max(1) as f64;
    Ok((
        m.record_bytes,
        per(m.index_bytes, m.index_entries) + per(m.expiry_bytes, m.expiry_entries),
    ))
}

async fn wake_latency(
    opts: &BenchOptions,
    q: &Queue,
    payload: &[u8],
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<WakeLatency> {
    let taker_client = QueueClient::connect(&opts.url, &opts.namespace, &opts.connect).await?;
    let tq = taker_client.queue_with(q.name(), q.limits())?;
    let mut waiter = taker_client.waiter();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let taker = tokio::spawn(async move {
        loop {
            let b = tq
                .take_wait(
                    &mut waiter,
                    1,
                    Duration::from_secs(30),
                    Duration::from_secs(5),
                )
                .await?;
            if !b.tasks.is_empty() {
                let _ = tx.send(Instant::now());
                tq.ack(&b.tasks).await?;
            }
        }
        #[allow(unreachable_code)]
        Ok::<(), QueueError>(())
    });
    let mut samples = Vec::with_capacity(opts.wake_samples);
    for i in 0..opts.wake_samples {
        if i % 50 == 0 {
            progress(&format!("idle wake-up latency: {i}/{}", opts.wake_samples));
        }
        // Let the taker finish its ack and block again, so every sample starts idle.
        tokio::time::sleep(Duration::from_millis(3)).await;
        let sent = Instant::now();
        q.enqueue(NewTask::new(payload.to_vec())).await?;
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .map_err(|_| anyhow::anyhow!("an idle taker was not woken within 10 s"))?
            .ok_or_else(|| anyhow::anyhow!("the taker stopped"))?;
        samples.push(got.duration_since(sent).as_secs_f64() * 1000.0);
    }
    taker.abort();
    samples.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if samples.is_empty() {
            0.0
        } else {
            samples[((samples.len() - 1) as f64 * p).round() as usize]
        }
    };
    Ok(WakeLatency {
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        max_ms: samples.last().copied().unwrap_or(0.0),
        samples: samples.len(),
    })
}

/// One throughput line of the table: name, both sides per second, their ratio.
fn row(out: &mut String, name: String, t: &Throughput) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "{:<34} {:>12.0} {:>12.0} {:>7.2}",
        name, t.gaffer_per_s, t.bare_per_s, t.ratio
    );
}

impl BenchReport {
    /// The report as an aligned table.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<34} {:>12} {:>12} {:>7}",
            "measurement", "gaffer/s", "bare lua/s", "ratio"
        );
        let _ = writeln!(
            out,
            "(each figure: median of {} alternating rounds; payload {} bytes)",
            self.rounds, self.payload_bytes
        );
        row(
            &mut out,
            format!("bulk enqueue ({} tasks)", self.enqueue.tasks),
            &self.enqueue,
        );
        for r in &self.take_ack {
            row(
                &mut out,
                format!("take+ack batch {:>3}, {} taker(s)", r.batch, r.takers),
                &r.throughput,
            );
        }
        for r in &self.strong_bare {
            let _ = writeln!(
                out,
                "{:<34} {:>12.0} {:>12.0} {:>7.2}  (bare: {} loops in flight per taker)",
                format!("take+ack batch {:>3}, strong bare", r.batch),
                r.gaffer_per_s,
                r.strong_bare_per_s,
                r.ratio,
                r.k
            );
            let _ = writeln!(
                out,
                "{:<34} {:>12.0} {:>12.0} {:>7.2}",
                format!("settle+take batch {:>3}, strong bare", r.batch),
                r.combined_per_s,
                r.strong_bare_per_s,
                r.combined_ratio,
            );
        }
        let _ = writeln!(
            out,
            "idle wake-up (enqueue to start)    p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples)",
            self.wakeup.p50_ms, self.wakeup.p99_ms, self.wakeup.max_ms, self.wakeup.samples
        );
        let _ = writeln!(
            out,
            "{:<34} {:>12} {:>12} {:>7}",
            "task records", "tracked/s", "untracked/s", "ratio"
        );
        let r = &self.records;
        row(
            &mut out,
            format!("bulk enqueue ({} tasks)", r.enqueue.tasks),
            &r.enqueue,
        );
        row(
            &mut out,
            "take+ack batch 100, 2 taker(s)".into(),
            &r.take_ack,
        );
        let _ = writeln!(
            out,
            "record of a finished task          {} bytes, indexes {:.0} bytes per task (MEMORY USAGE)",
            r.record_bytes, r.index_bytes_per_task
        );
        out
    }
}
