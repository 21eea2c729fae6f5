//! `gaffer trace record` end to end: a real manager and master on one redis-server run a
//! load the test pushes at a known rate; the trace recorded from the manager's rings
//! gives that rate back, and `gaffer simulate` reads it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gaffer::queue_client::NewTask;
use gaffer::redis_server::free_port;
use gaffer::simulate::trace::{self, Trace};

use crate::harness::{ANY_LOAD, TestRedis, poll_some};

/// Processes killed on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The load the test pushes: `RATE` tasks/s of `sleep` 20 ms, for `SECONDS`.
const RATE: u64 = 100;
const SECONDS: u64 = 8;
const TASK_MS: u64 = 20;

fn gaffer(config: &Path, dir: &Path, args: &[&str], log: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gaffer"));
    cmd.arg("--config")
        .arg(config)
        .args(args)
        .env("GAFFER_LOG", "info")
        .env(ANY_LOAD.0, ANY_LOAD.1)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(log)).unwrap());
    cmd
}

/// Records a trace of the last hour into `out`; the parsed trace, once one was written.
fn record(config: &Path, out: &PathBuf) -> Option<Trace> {
    let status = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(config)
        .args(["trace", "record", "--hours", "1", "-o"])
        .arg(out)
        .output()
        .unwrap();
    if !status.status.success() {
        return None;
    }
    let text = std::fs::read_to_string(out).unwrap();
    Some(trace::parse(&text, &out.display().to_string()).unwrap())
}

/// Tasks a trace's segments of `queue` bring: Σ rate × length.
fn recorded_tasks(t: &Trace, queue: &str) -> f64 {
    t.load
        .iter()
        .filter(|l| l.queue == queue)
        .map(|l| l.rate * (l.to - l.from).as_secs_f64())
        .sum()
}

#[tokio::test]
async fn a_recorded_trace_gives_back_the_load_that_was_pushed() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n\
             [manager]\ntick = \"200ms\"\nheartbeat_timeout = \"2s\"\n\n\
             [queues.work]\nhandler = \"sleep\"\nmin_slots = 4\nmax_slots = 4\nbatch_size = 5\n",
            redis.url()
        ),
    )
    .unwrap();
    let mut procs = Procs(Vec::new());
    let http = format!("127.0.0.1:{}", free_port().unwrap());
    procs.0.push(
        gaffer(&config, dir.path(), &["manager"], "manager.log")
            .env("GAFFER_MANAGER_HTTP", http)
            .env("GAFFER_TRACE_PERIOD", "1s")
            .spawn()
            .unwrap(),
    );
    let http = format!("127.0.0.1:{}", free_port().unwrap());
    procs.0.push(
        gaffer(
            &config,
            dir.path(),
            &["master", "--host", "h1"],
            "master.log",
        )
        .env("GAFFER_MASTER_HTTP", http)
        .spawn()
        .unwrap(),
    );

    // The manager counts from its first period on: push once it has written one.
    let out = dir.path().join("recorded.toml");
    poll_some(
        Duration::from_secs(60),
        "a first recorded period",
        || async { record(&config, &out) },
    )
    .await;

    // The load: RATE per second in tenths, paced by the clock (a burst catches up after
    // a slow push, so the count per second holds on a loaded machine).
    let q = client.queue("work").unwrap();
    let payload = format!("{{\"ms\":{TASK_MS}}}");
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut pushed = 0;
    for _ in 0..SECONDS * 10 {
        pace.tick().await;
        let tasks: Vec<NewTask> = (0..RATE / 10)
            .map(|_| NewTask::new(payload.as_bytes()))
            .collect();
        q.enqueue_many(&tasks).await.unwrap();
        pushed += tasks.len() as u64;
    }
    let took = started.elapsed().as_secs_f64();
    let rate = pushed as f64 / took;

    // Recorded once every task handled is in a period the manager wrote.
    let t = poll_some(
        Duration::from_secs(60),
        "a recorded trace with every pushed task handled",
        || async {
            let t = record(&config, &out)?;
            (recorded_tasks(&t, "work").round() as u64 >= pushed).then_some(t)
        },
    )
    .await;
    assert!(
        (recorded_tasks(&t, "work") - pushed as f64).abs() < 1.0,
        "{} tasks recorded, {pushed} pushed",
        recorded_tasks(&t, "work")
    );
    // The periods wholly inside the push (not its first or last second) show its rate.
    let segments: Vec<_> = t.load.iter().filter(|l| l.queue == "work").collect();
    let inner = &segments[1..segments.len().saturating_sub(1)];
    let (from, to) = (inner[0].from, inner[inner.len() - 1].to);
    let tasks: f64 = inner
        .iter()
        .map(|l| l.rate * (l.to - l.from).as_secs_f64())
        .sum();
    let measured = tasks / (to - from).as_secs_f64();
    assert!(
        (measured - rate).abs() <= rate * 0.1,
        "recorded {measured:.1} tasks/s, pushed {rate:.1}/s"
    );
    // The mean task time is the handler's 20 ms (and some).
    let handled: Vec<f64> = segments
        .iter()
        .map(|l| l.task_time.as_secs_f64() * 1000.0)
        .collect();
    let mean = handled.iter().sum::<f64>() / handled.len() as f64;
    assert!(
        (TASK_MS as f64..=TASK_MS as f64 * 1.25).contains(&mean),
        "mean task time {mean:.1} ms"
    );
    assert_eq!(t.hosts.count, 1);

    // And simulate reads it, against this config and another side by side.
    let other = dir.path().join("other.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&other, text.replace("max_slots = 4", "max_slots = 8")).unwrap();
    let sim = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&config)
        .arg("simulate")
        .arg(&out)
        .arg("--compare")
        .arg(&other)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stderr)
    );
    let both: serde_json::Value = serde_json::from_slice(&sim.stdout).unwrap();
    for side in ["config", "compare"] {
        let arrived = both[side]["report"]["queues"]["work"]["arrived"]
            .as_u64()
            .unwrap();
        assert!(
            arrived.abs_diff(pushed) <= pushed / 10,
            "{side}: {arrived} simulated arrivals, {pushed} pushed"
        );
    }
    assert_eq!(
        both["compare"]["path"].as_str(),
        Some(other.display().to_string().as_str())
    );
}
