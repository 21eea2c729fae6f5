//! `gaffer bench api`: the task service's figures, against an api instance this process
//! starts on loopback over the configured Redis: single submits over keep-alive
//! connections beside the library's own enqueue at the same concurrency (same run, so
//! the ratio is what HTTP, JSON and the key check cost), bulk submits, latency at a fixed
//! request rate, and how soon a sync submit answers after its task ended.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiOptions, admin_key, hash_token, new_token};
use crate::config::{Config, Handler, QueueConfig};
use crate::queue_client::{ConnectOptions, NewTask, Queue, QueueClient, QueueLimits};

/// What to measure and how long.
#[derive(Debug, Clone)]
pub struct ApiBenchOptions {
    /// Redis URL.
    pub url: String,
    /// Connection settings (password).
    pub connect: ConnectOptions,
    /// Key namespace; the bench queue is `bench-api.PID` inside it, deleted after.
    pub namespace: String,
    /// How long each throughput figure runs.
    pub seconds: f64,
    /// Keep-alive connections (and library callers) sending at once.
    pub connections: usize,
    /// Tasks per bulk submit.
    pub bulk: usize,
    /// Requests per second of the fixed-rate latency figure.
    pub rate: f64,
    /// Sync submits whose wake-up is timed.
    pub wait_samples: usize,
    /// Cancelled to stop early (Ctrl-C): the bench deletes its queue and stops its api
    /// instance first (see `bench::interrupted`).
    pub stop: tokio_util::sync::CancellationToken,
}

impl Default for ApiBenchOptions {
    fn default() -> Self {
        Self {
            url: String::new(),
            connect: ConnectOptions::default(),
            namespace: "gaffer".into(),
            seconds: 5.0,
            connections: 32,
            bulk: 1000,
            rate: 1000.0,
            wait_samples: 300,
            stop: tokio_util::sync::CancellationToken::new(),
        }
    }
}

/// Requests of one kind: how many per second, and how long each took.
#[derive(Debug, Clone, Serialize)]
pub struct Latencies {
    /// Requests (or calls) per second.
    pub per_s: f64,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Requests measured.
    pub requests: usize,
}

/// Everything `gaffer bench api` measured.
#[derive(Debug, Clone, Serialize)]
pub struct ApiBenchReport {
    /// Single submits over keep-alive connections.
    pub single: Latencies,
    /// The library's `enqueue` at the same concurrency, same run: the reference.
    pub library: Latencies,
    /// single / library.
    pub ratio: f64,
    /// Bulk submits (`{"tasks": [...]}`).
    pub bulk: Latencies,
    /// Tasks per bulk submit.
    pub bulk_size: usize,
    /// Tasks per second through bulk submits.
    pub bulk_tasks_per_s: f64,
    /// Single submits sent at a fixed rate (latency counted from when each was due).
    pub paced: Latencies,
    /// From the task's end (its ack returned) to the sync submit's answer.
    pub wake: Latencies,
    /// Connections used.
    pub connections: usize,
}

/// Runs every measurement; `progress` is told what runs now.
pub async fn run(
    opts: &ApiBenchOptions,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<ApiBenchReport> {
    let queue_name = format!("bench-api.{}", std::process::id());
    let mut config = Config::default();
    config.cluster.namespace = opts.namespace.clone();
    // (every sender is on loopback: the per-client cap would cut `--connections` past it)
    config.api.max_connections_per_peer = 0;
    config.queues.insert(
        queue_name.clone(),
        QueueConfig::new(queue_name.clone(), Handler::named(Handler::NOOP)),
    );
    let token = new_token()?;
    let mut api_opts = ApiOptions::new(config.clone(), opts.url.clone());
    api_opts.connect = opts.connect.clone();
    api_opts.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    api_opts.extra_keys = vec![admin_key("bench", &hash_token(&token))?];
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(crate::api::run(api_opts, stop.clone(), Some(tx)));
    let addr = rx.await?;
    let client = QueueClient::connect(&opts.url, &opts.namespace, &opts.connect).await?;
    let queue = client.queue_with(&queue_name, QueueLimits::from(&config.queues[&queue_name]))?;
    let target = Target {
        addr,
        token,
        path: format!("/v1/queues/{queue_name}/tasks"),
    };
    let result =
        super::unless_stopped(&opts.stop, measure(opts, &target, &queue, &mut progress)).await;
    let _ = queue.delete_all().await;
    stop.cancel();
    server.await??;
    result
}

async fn measure(
    opts: &ApiBenchOptions,
    target: &Target,
    queue: &Queue,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<ApiBenchReport> {
    let run_for = Duration::from_secs_f64(opts.seconds);
    let single_body = Bytes::from_static(br#"{"payload": {"n": 1}}"#);
    progress("single submits over keep-alive connections");
    let single = closed_loop(target, opts.connections, run_for, single_body.clone()).await?;
    queue.delete_all().await?;
    progress("the library's enqueue, same concurrency");
    let library = library_loop(queue, opts.connections, run_for).await?;
    queue.delete_all().await?;
    progress("bulk submits");
    let bulk_body = Bytes::from(format!(
        r#"{{"tasks": [{}]}}"#,
        vec![r#"{"payload": 1}"#; opts.bulk].join(",")
    ));
    let bulk = closed_loop(target, opts.connections.min(4), run_for, bulk_body).await?;
    queue.delete_all().await?;
    progress("single submits at a fixed rate");
    let paced = paced(target, opts, run_for, single_body).await?;
    queue.delete_all().await?;
    progress("sync submits woken by their task's end");
    let wake = wake(target, queue, opts.wait_samples).await?;
    Ok(ApiBenchReport {
        ratio: single.per_s / library.per_s.max(1e-9),
        bulk_tasks_per_s: bulk.per_s * opts.bulk as f64,
        bulk_size: opts.bulk,
        single,
        library,
        bulk,
        paced,
        wake,
        connections: opts.connections,
    })
}

/// Where and as whom requests go.
struct Target {
    addr: SocketAddr,
    token: String,
    path: String,
}

impl Target {
    /// A keep-alive HTTP/1 connection to the api.
    async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let stream = tokio::net::TcpStream::connect(self.addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(sender)
    }

    /// One submit; fails unless the api answers 2xx.
    async fn submit(
        &self,
        sender: &mut SendRequest<Full<Bytes>>,
        body: Bytes,
    ) -> anyhow::Result<()> {
        sender.ready().await?;
        let request = hyper::Request::post(&self.path)
            .header("host", "bench")
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::ensure!(
            status.is_success(),
            "the api answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
        Ok(())
    }
}

/// `connections` senders, each sending the next request when the last was answered.
async fn closed_loop(
    target: &Target,
    connections: usize,
    run_for: Duration,
    body: Bytes,
) -> anyhow::Result<Latencies> {
    let started = Instant::now();
    let deadline = started + run_for;
    let mut senders = Vec::new();
    for _ in 0..connections {
        senders.push(target.connect().await?);
    }
    let runs = senders.into_iter().map(|mut sender| {
        let body = body.clone();
        async move {
            // The sender is borrowed by each call, so this loop cannot be timed_until's.
            let mut took = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                target.submit(&mut sender, body.clone()).await?;
                took.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(took)
        }
    });
    let all = futures::future::try_join_all(runs).await?.concat();
    Ok(latencies(all, started.elapsed()))
}

/// The library's enqueue, `callers` at once, as the reference for single submits.
async fn library_loop(
    queue: &Queue,
    callers: usize,
    run_for: Duration,
) -> anyhow::Result<Latencies> {
    let started = Instant::now();
    let deadline = started + run_for;
    let runs = (0..callers).map(|_| {
        timed_until(deadline, || async {
            queue.enqueue(NewTask::new(r#"{"n":1}"#)).await?;
            Ok(())
        })
    });
    let all = futures::future::try_join_all(runs).await?.concat();
    Ok(latencies(all, started.elapsed()))
}

/// Calls `call` again and again until `deadline`, timing each call.
async fn timed_until<F, Fut>(deadline: Instant, mut call: F) -> anyhow::Result<Vec<Duration>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut took = Vec::new();
    while Instant::now() < deadline {
        let t = Instant::now();
        call().await?;
        took.push(t.elapsed());
    }
    Ok(took)
}

/// Requests due at a fixed rate, spread over the connections; each latency counts from
/// when its request was due, so a stall shows in the figure instead of thinning the load.
async fn paced(
    target: &Target,
    opts: &ApiBenchOptions,
    run_for: Duration,
    body: Bytes,
) -> anyhow::Result<Latencies> {
    let n = (opts.rate * run_for.as_secs_f64()).max(1.0) as usize;
    let connections = opts.connections.max(1);
    let mut senders = Vec::new();
    for _ in 0..connections {
        senders.push(target.connect().await?);
    }
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let interval = Duration::from_secs_f64(1.0 / opts.rate);
    let runs = senders.into_iter().enumerate().map(|(c, mut sender)| {
        let body = body.clone();
        async move {
            let mut took = Vec::new();
            for i in (c..n).step_by(connections) {
                let due = start + interval * i as u32;
                tokio::time::sleep_until(due).await;
                target.submit(&mut sender, body.clone()).await?;
                took.push(due.elapsed());
            }
            Ok::<_, anyhow::Error>(took)
        }
    });
    let began = Instant::now();
    let all: Vec<Duration> = futures::future::try_join_all(runs)
        .await?
        .into_iter()
        .flatten()
        .collect();
    Ok(latencies(all, began.elapsed()))
}

/// Sync submits, one at a time, while a taker acks each task the moment it takes it:
/// the time from the ack's return to the submit's answer.
async fn wake(target: &Target, queue: &Queue, samples: usize) -> anyhow::Result<Latencies> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let taker_queue = queue.clone();
    let taker = tokio::spawn(async move {
        loop {
            let b = taker_queue.take(1, Duration::from_secs(30)).await?;
            if b.tasks.is_empty() {
                tokio::time::sleep(Duration::from_micros(200)).await;
                continue;
            }
            taker_queue.ack(&b.tasks).await?;
            let _ = tx.send(Instant::now());
        }
        #[allow(unreachable_code)]
        Ok::<(), crate::queue_client::QueueError>(())
    });
    let mut sender = target.connect().await?;
    let started = Instant::now();
    let mut took = Vec::with_capacity(samples);
    for i in 0..samples {
        let body = Bytes::from(format!(r#"{{"payload": 1, "id": "w{i}", "wait": "10s"}}"#));
        target.submit(&mut sender, body).await?;
        let answered = Instant::now();
        let ended = rx
            .recv()
            .await
            .ok_or_else(|| anyhow::anyhow!("the taker stopped"))?;
        took.push(answered.saturating_duration_since(ended));
    }
    taker.abort();
    Ok(latencies(took, started.elapsed()))
}

fn latencies(mut took: Vec<Duration>, elapsed: Duration) -> Latencies {
    took.sort();
    let pct = |p: f64| {
        took.get(((took.len().saturating_sub(1)) as f64 * p).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Latencies {
        per_s: took.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        requests: took.len(),
    }
}

impl ApiBenchReport {
    /// The report as an aligned table.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<44} {:>10} {:>9} {:>9}",
            "measurement", "per s", "p50 ms", "p99 ms"
        );
        let mut row = |name: String, l: &Latencies| {
            let _ = writeln!(
                out,
                "{:<44} {:>10.0} {:>9.2} {:>9.2}",
                name, l.per_s, l.p50_ms, l.p99_ms
            );
        };
        let c = self.connections;
        row(
            format!("single submit, {c} keep-alive connections"),
            &self.single,
        );
        row(
            format!("library enqueue, {c} callers (reference)"),
            &self.library,
        );
        row(
            format!("bulk submit of {} tasks (requests)", self.bulk_size),
            &self.bulk,
        );
        row(
            format!("single submit at {:.0}/s (from due time)", self.paced.per_s),
            &self.paced,
        );
        row("sync submit: task end to answer".into(), &self.wake);
        let _ = writeln!(
            out,
            "single submit / library enqueue: {:.2}; bulk: {:.0} tasks/s",
            self.ratio, self.bulk_tasks_per_s
        );
        out
    }
}
