//! Preemption at task granularity (issue 16): a slot asked to stop finishes the task in
//! hand and gives the untouched rest of its batch back at once, no attempt counted. A
//! real manager and master move slots from a low-priority queue of long batches to a
//! high-priority queue that fills; slots run in-process show the handler's side: a Rust
//! handler's prefix, an exec child's reply after the stop line, a child that ignores it.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gaffer::cluster::{self, Keys};
use gaffer::config::{Handler as HandlerConfig, QueueConfig, RetryPolicy};
use gaffer::queue_client::{NewTask, Queue, RecordState, TaskRecord};
use gaffer::redis_server::free_port;
use gaffer::slot::{
    EXIT_STOPPED, Handler, HandlerError, Outcome, Registry, SlotContext, SlotEvent, SlotSpec, Task,
    run_slot,
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::harness::{ANY_LOAD, TestRedis, eventually, poll_some};
use crate::host::{http_get, slots};

/// How long each low-priority task runs.
const TASK: Duration = Duration::from_millis(200);
/// The master's tick: how late after a map it may act on it.
const MASTER_TICK: Duration = Duration::from_secs(1);

/// The state, attempt and slot of each history entry.
fn history(r: &TaskRecord) -> Vec<(RecordState, u32, Option<u32>)> {
    r.history
        .iter()
        .flatten()
        .map(|h| (h.state, h.attempt, h.slot))
        .collect()
}

/// Milliseconds since the epoch of a record's RFC 3339 time.
fn ms(at: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(at)
        .unwrap_or_else(|e| panic!("{at}: {e}"))
        .timestamp_millis()
}

/// Redis's clock in ms: the clock every record time comes from.
async fn redis_now_ms(redis: &TestRedis) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut redis.raw().await)
        .await
        .unwrap();
    s * 1000 + us / 1000
}

/// Every record of `ids` in `q`.
async fn records(q: &Queue, ids: &[String]) -> Vec<TaskRecord> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        out.push(q.record(id).await.unwrap().expect("the task has a record"));
    }
    out
}

/// A manager and one master (at most four slots) on one Redis, as processes.
struct Cluster {
    redis: TestRedis,
    dir: tempfile::TempDir,
    config: PathBuf,
    procs: Vec<Child>,
    http: u16,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Cluster {
    fn start(queues: &str) -> Cluster {
        let redis = TestRedis::start();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        let http = free_port().unwrap();
        let text = format!(
            "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n\
             [manager]\ntick = \"500ms\"\n\n\
             [master]\ndrain_timeout = \"5s\"\nmemory_reserve = \"64MiB\"\nmax_slots = 4\n\
             http = \"127.0.0.1:{http}\"\n\n{queues}",
            redis.url()
        );
        std::fs::write(&config, text).unwrap();
        let mut c = Cluster {
            redis,
            dir,
            config,
            procs: Vec::new(),
            http,
        };
        c.spawn(&["master", "--host", "h1"], "master.log", None);
        let manager_http = format!("127.0.0.1:{}", free_port().unwrap());
        c.spawn(
            &["manager"],
            "manager.log",
            Some(("GAFFER_MANAGER_HTTP", manager_http)),
        );
        c
    }

    fn spawn(&mut self, args: &[&str], log: &str, env: Option<(&str, String)>) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gaffer"));
        cmd.arg("--config")
            .arg(&self.config)
            .args(args)
            .env("GAFFER_LOG", "info")
            .env(ANY_LOAD.0, ANY_LOAD.1)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join(log)).unwrap());
        self.procs.push(cmd.spawn().unwrap());
    }

    /// The master's slots as (slot, queue, state).
    fn slots(&self) -> Vec<(u32, String, String)> {
        let status = http_get(self.http, "/status")
            .and_then(|b| serde_json::from_str::<Value>(&b).ok())
            .unwrap_or(Value::Null);
        slots(&status)
            .iter()
            .map(|s| {
                (
                    s["slot"].as_u64().unwrap_or(0) as u32,
                    s["queue"].as_str().unwrap_or("").to_owned(),
                    s["state"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }
}

const QUEUES: &str = r#"
[queues.low]
handler = "sleep"
priority = 1
max_slots = 4
batch_size = 100
lease = "5m"
max_batch_time = "5m"

[queues.high]
handler = "sleep"
priority = 10
max_slots = 4
batch_size = 1
"#;

#[tokio::test]
async fn a_filling_high_priority_queue_takes_slots_within_a_task_and_a_tick() {
    let c = Cluster::start(QUEUES);
    let client = c.redis.client().await;
    let low = client.queue("low").unwrap();
    let high = client.queue("high").unwrap();
    let low_ids: Vec<String> = (0..400).map(|i| format!("low-{i:03}")).collect();
    let payload = format!(r#"{{"ms":{}}}"#, TASK.as_millis());
    let tasks: Vec<NewTask> = low_ids
        .iter()
        .map(|id| NewTask::new(payload.clone()).id(id))
        .collect();
    low.enqueue_many(&tasks).await.unwrap();

    // Four slots, each holding a batch of 100 tasks of 200 ms: 20 s of work apiece.
    eventually(
        Duration::from_secs(60),
        "four low slots busy with 400 tasks",
        || async {
            low.stats().await.unwrap().leased == 400
                && c.slots()
                    .iter()
                    .filter(|s| s.1 == "low" && s.2 == "busy")
                    .count()
                    == 4
        },
    )
    .await;
    let low_slots: BTreeSet<u32> = c.slots().iter().map(|s| s.0).collect();

    let high_ids: Vec<String> = (0..40).map(|i| format!("high-{i:02}")).collect();
    let tasks: Vec<NewTask> = high_ids
        .iter()
        .map(|id| NewTask::new(r#"{"ms":20}"#).id(id))
        .collect();
    high.enqueue_many(&tasks).await.unwrap();

    // The stop is ordered when the manager publishes a map giving the high queue slots
    // (taken from the low queue: the host has four); the master acts on it at its next
    // tick. Seen by Redis's clock no earlier than it was written.
    let conn = client.connection();
    let ordered = poll_some(Duration::from_secs(60), "a map with high slots", || {
        let mut conn = conn.clone();
        let redis = &c.redis;
        async move {
            let map = cluster::read_map(&mut conn, &Keys::new("test"))
                .await
                .ok()??;
            let high_slots = map.for_host("h1").get("high").copied().unwrap_or(0);
            if high_slots == 0 {
                return None;
            }
            Some(redis_now_ms(redis).await)
        }
    })
    .await;
    eventually(Duration::from_secs(60), "every high task done", || async {
        high.stats().await.unwrap().acked_total == 40
    })
    .await;
    let high_done = redis_now_ms(&c.redis).await;

    // The low queue gets its slots back and every low task ends, each run exactly once.
    eventually(Duration::from_secs(120), "every low task done", || async {
        low.stats().await.unwrap().acked_total == 400
    })
    .await;
    let s = low.stats().await.unwrap();
    assert_eq!(
        (s.retried_total, s.expired_total, s.dead),
        (0, 0, 0),
        "{s:?}"
    );
    let lows = records(&low, &low_ids).await;
    let mut last_end: BTreeMap<u32, i64> = BTreeMap::new();
    let mut ran_on: BTreeMap<u32, usize> = BTreeMap::new();
    for r in &lows {
        // A take handed back leaves no trace: one run, at attempt 1, on one slot.
        let h = history(r);
        let slot = h[1].2.expect("the run names its slot");
        assert_eq!(
            h,
            [
                (RecordState::Waiting, 0, None),
                (RecordState::Running, 1, Some(slot)),
                (RecordState::Done, 1, Some(slot)),
            ],
            "{}: {:?}",
            r.id,
            r.history
        );
        // A batch's tasks are settled together when the handler returns: the end of
        // its last one is when the slot let go of the batch.
        let end = ms(&r.history.as_ref().unwrap()[2].at);
        let last = last_end.entry(slot).or_insert(end);
        *last = (*last).max(end);
        *ran_on.entry(slot).or_default() += 1;
    }
    // The first four slots each held 100 tasks (20 s of work); those that were stopped
    // let go of theirs while the high queue ran.
    let stopped: Vec<u32> = low_slots
        .iter()
        .copied()
        .filter(|s| last_end.get(s).is_some_and(|&end| end < high_done))
        .collect();
    assert!(!stopped.is_empty(), "no low slot was stopped: {last_end:?}");
    let bound = (TASK + MASTER_TICK).as_millis() as i64;
    for slot in &stopped {
        let let_go = last_end[slot] - ordered;
        assert!(ran_on[slot] < 100, "slot {slot} ran its whole batch");
        assert!(
            let_go <= bound,
            "slot {slot} let go of its batch {let_go} ms after the map took it, over one task and a tick"
        );
    }
    // The first high task started within a task and a tick of the map, plus a slot's
    // start: not the 20 s of a whole batch.
    let highs = records(&high, &high_ids).await;
    let first_high = highs
        .iter()
        .map(|r| ms(&r.history.as_ref().unwrap()[1].at))
        .min()
        .unwrap();
    assert!(
        first_high - ordered <= bound + MASTER_TICK.as_millis() as i64,
        "the first high task started {} ms after the map",
        first_high - ordered
    );
    println!(
        "stopped {stopped:?}: let go {:?} ms after the map, having run {:?} tasks; first high task {} ms after it",
        stopped
            .iter()
            .map(|s| last_end[s] - ordered)
            .collect::<Vec<_>>(),
        stopped.iter().map(|s| ran_on[s]).collect::<Vec<_>>(),
        first_high - ordered
    );
}

fn spec(redis: &TestRedis, queue: QueueConfig, report: UnixDatagram) -> SlotSpec {
    crate::harness::slot_spec(redis, queue, 3, report)
}

/// A slot run in-process on a queue of `ids`, with a stop the test holds.
struct InProcess {
    q: Queue,
    stop: CancellationToken,
    slot: std::thread::JoinHandle<i32>,
    events: UnixDatagram,
}

impl InProcess {
    async fn start(
        redis: &TestRedis,
        cfg: QueueConfig,
        handler: Box<dyn Handler>,
        tasks: &[(&str, &str)],
    ) -> InProcess {
        let q = redis.client().await.queue(&cfg.name).unwrap();
        let new: Vec<NewTask> = tasks
            .iter()
            .map(|(id, payload)| NewTask::new(*payload).id(*id))
            .collect();
        q.enqueue_many(&new).await.unwrap();
        let (report, events) = UnixDatagram::pair().unwrap();
        let stop = CancellationToken::new();
        let slot = {
            let (spec, stop) = (spec(redis, cfg, report), stop.clone());
            std::thread::spawn(move || run_slot(spec, handler, Some(stop)))
        };
        InProcess {
            q,
            stop,
            slot,
            events,
        }
    }

    /// Stops the slot and waits for its exit; returns the `tasks` of its batches done.
    fn stop(self) -> (Queue, Vec<u32>) {
        self.stop.cancel();
        assert_eq!(self.slot.join().unwrap(), EXIT_STOPPED);
        self.events.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        let mut done = Vec::new();
        while let Ok(n) = self.events.recv(&mut buf) {
            if let Ok(SlotEvent::BatchDone { tasks, .. }) = serde_json::from_slice(&buf[..n]) {
                done.push(tasks);
            }
        }
        (self.q, done)
    }
}

/// The given-back tasks: waiting, never run (the history has only the enqueue), and
/// the next take hands them out in their order at attempt 1.
async fn given_back(q: &Queue, ids: &[&str]) {
    for id in ids {
        let r = q.record(id).await.unwrap().unwrap();
        assert_eq!(r.state, RecordState::Waiting, "{id}");
        assert_eq!(history(&r), [(RecordState::Waiting, 0, None)], "{id}");
    }
    let s = q.stats().await.unwrap();
    assert_eq!(
        (s.ready as usize, s.leased, s.retried_total),
        (ids.len(), 0, 0),
        "{s:?}"
    );
    let b = q.take(100, Duration::from_secs(30)).await.unwrap();
    let taken: Vec<(&str, u32)> = b.tasks.iter().map(|t| (t.id.as_str(), t.attempt)).collect();
    let want: Vec<(&str, u32)> = ids.iter().map(|id| (*id, 1)).collect();
    assert_eq!(
        taken, want,
        "given back in their order, at the attempt they had"
    );
}

/// Tells the test each task it starts; the first one runs until the slot asks to stop.
/// Checks the stop between tasks, as a handler that can stop early does.
struct StopsBetweenTasks(std::sync::mpsc::Sender<String>);

impl Handler for StopsBetweenTasks {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Err(HandlerError::new("built by the test"))
    }

    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        let mut out = Vec::new();
        for (i, t) in batch.iter().enumerate() {
            if ctx.should_stop() {
                break;
            }
            let _ = self.0.send(t.id.clone());
            if i == 0 {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                while !ctx.should_stop() && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            out.push(Outcome::done());
        }
        out
    }
}

#[tokio::test]
async fn a_rust_handler_returns_a_prefix_and_the_rest_goes_back_unstarted() {
    let redis = TestRedis::start();
    let mut cfg = QueueConfig::new("rp", HandlerConfig::named(HandlerConfig::NOOP));
    cfg.batch_size = 5;
    let (tx, started) = std::sync::mpsc::channel();
    let tasks = [
        ("a", "{}"),
        ("b", "{}"),
        ("c", "{}"),
        ("d", "{}"),
        ("e", "{}"),
    ];
    let slot = InProcess::start(&redis, cfg, Box::new(StopsBetweenTasks(tx)), &tasks).await;
    let first = tokio::task::spawn_blocking(move || {
        let first = started.recv_timeout(Duration::from_secs(20)).unwrap();
        (first, started)
    });
    let (first, started) = first.await.unwrap();
    assert_eq!(first, "a");
    let (q, done) = slot.stop();
    assert_eq!(
        started.try_iter().count(),
        0,
        "nothing started after the stop"
    );
    assert_eq!(done, [1], "the batch reports the one task it settled");
    let a = q.record("a").await.unwrap().unwrap();
    assert_eq!(
        history(&a),
        [
            (RecordState::Waiting, 0, None),
            (RecordState::Running, 1, Some(3)),
            (RecordState::Done, 1, Some(3)),
        ]
    );
    given_back(&q, &["b", "c", "d", "e"]).await;
}

#[tokio::test]
async fn with_a_batch_taken_ahead_both_go_back_in_the_order_they_were_taken() {
    let redis = TestRedis::start();
    let mut cfg = QueueConfig::new("pa", HandlerConfig::named(HandlerConfig::NOOP));
    cfg.batch_size = 2;
    cfg.prefetch = true;
    let (tx, started) = std::sync::mpsc::channel();
    let tasks = [("a", "{}"), ("b", "{}"), ("c", "{}"), ("d", "{}")];
    let slot = InProcess::start(&redis, cfg, Box::new(StopsBetweenTasks(tx)), &tasks).await;
    let q = slot.q.clone();
    // a in the handler, b behind it in the batch, c and d taken ahead.
    eventually(
        Duration::from_secs(20),
        "a started, c and d taken ahead",
        || async { q.stats().await.unwrap().leased == 4 },
    )
    .await;
    let first = tokio::task::spawn_blocking(move || started.recv_timeout(Duration::from_secs(20)));
    assert_eq!(first.await.unwrap().unwrap(), "a");
    let (q, done) = slot.stop();
    assert_eq!(done, [1]);
    given_back(&q, &["b", "c", "d"]).await;
}

/// Returns one outcome fewer than its batch, never looking at the stop.
struct ShortByOne;

impl Handler for ShortByOne {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Ok(ShortByOne)
    }

    fn handle(&mut self, _: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        vec![Outcome::done(); batch.len() - 1]
    }
}

#[tokio::test]
async fn without_a_stop_a_short_vector_still_fails_the_missing_tasks() {
    let redis = TestRedis::start();
    let mut cfg = QueueConfig::new("sv", HandlerConfig::named(HandlerConfig::NOOP));
    cfg.batch_size = 2;
    cfg.retry = RetryPolicy {
        base: Duration::from_secs(600),
        max: Duration::from_secs(600),
        ..RetryPolicy::default()
    };
    let slot = InProcess::start(
        &redis,
        cfg,
        Box::new(ShortByOne),
        &[("a", "{}"), ("b", "{}")],
    )
    .await;
    let q = slot.q.clone();
    eventually(Duration::from_secs(20), "the batch settled", || async {
        let s = q.stats().await.unwrap();
        s.acked_total == 1 && s.retried_total == 1
    })
    .await;
    let b = q.record("b").await.unwrap().unwrap();
    assert_eq!(
        b.error.as_deref(),
        Some("handler returned 1 outcomes for a batch of 2")
    );
    slot.stop();
}

/// An exec queue `name` whose child is `command`.
fn exec_queue(name: &str, command: Vec<String>, batch: u32) -> QueueConfig {
    let mut cfg = QueueConfig::new(name, HandlerConfig::exec(command));
    cfg.batch_size = batch;
    cfg
}

/// The lines of the example handler's record file (`GAFFER_EXEC_RECORD`): one per task
/// it started.
fn started_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn an_exec_child_answers_the_tasks_it_finished_after_the_stop_line() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("started");
    // The shipped example, which looks for the stop line between tasks.
    let command = vec![
        "env".into(),
        format!("GAFFER_EXEC_RECORD={}", record.display()),
        "python3".into(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/exec_handler.py").into(),
    ];
    let ids: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    let payload = format!(r#"{{"action":"sleep","ms":{}}}"#, TASK.as_millis());
    let tasks: Vec<(&str, &str)> = ids
        .iter()
        .map(|id| (id.as_str(), payload.as_str()))
        .collect();
    let cfg = exec_queue("xs", command, 10);
    let handler = Registry::builtin().preload(&cfg).unwrap();
    let slot = InProcess::start(&redis, cfg, handler, &tasks).await;
    poll_some(
        Duration::from_secs(20),
        "the child started a task",
        || async { (!started_lines(&record).is_empty()).then_some(()) },
    )
    .await;
    let (q, done) = slot.stop();
    let ran = started_lines(&record).len();
    assert!(ran < 10, "the child ran the whole batch");
    assert_eq!(
        done,
        [ran as u32],
        "the batch settled only what the child started"
    );
    let s = q.stats().await.unwrap();
    assert_eq!((s.acked_total as usize, s.retried_total), (ran, 0), "{s:?}");
    for id in &ids[..ran] {
        let r = q.record(id).await.unwrap().unwrap();
        assert_eq!(r.state, RecordState::Done, "{id}");
    }
    let rest: Vec<&str> = ids[ran..].iter().map(String::as_str).collect();
    given_back(&q, &rest).await;
}

#[tokio::test]
async fn an_exec_child_that_ignores_the_stop_line_has_its_whole_batch_settled() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("has-batch");
    // Takes its time over the batch, never reads the stop line, answers every task.
    let script = format!(
        r#"
import json, sys, time
for line in sys.stdin:
    msg = json.loads(line)
    if "batch" not in msg:
        continue
    open({:?}, "w").close()
    time.sleep(0.5)
    print(json.dumps({{"results": [{{"id": t["id"], "status": "ok"}} for t in msg["batch"]]}}), flush=True)
"#,
        marker.display().to_string()
    );
    let command = vec!["python3".into(), "-c".into(), script];
    let tasks = [("a", "{}"), ("b", "{}"), ("c", "{}")];
    let cfg = exec_queue("xi", command, 3);
    let handler = Registry::builtin().preload(&cfg).unwrap();
    let slot = InProcess::start(&redis, cfg, handler, &tasks).await;
    poll_some(
        Duration::from_secs(20),
        "the child has the batch",
        || async { marker.exists().then_some(()) },
    )
    .await;
    let (q, done) = slot.stop();
    assert_eq!(done, [3]);
    let s = q.stats().await.unwrap();
    assert_eq!((s.acked_total, s.ready, s.leased), (3, 0, 0), "{s:?}");
}

/// An exec child in Python that answers every task ok, and at the end of its input (or at
/// SIGTERM, when `hold_on` keeps it past the end of its input) writes what ended it to the
/// file `marker` and exits.
fn closing_child(marker: &Path, hold_on: bool) -> Vec<String> {
    let script = r#"
import json, signal, sys, time
marker, hold_on = sys.argv[1], sys.argv[2] == "1"
def ended(how):
    with open(marker, "w") as f:
        f.write(how)
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda *_: ended("terminated"))
for line in sys.stdin:
    req = json.loads(line)
    if "batch" in req:
        out = [{"id": t["id"], "status": "ok"} for t in req["batch"]]
        print(json.dumps({"results": out}), flush=True)
while hold_on:
    time.sleep(1)
ended("end of input")
"#;
    vec![
        "python3".into(),
        "-c".into(),
        script.into(),
        marker.display().to_string(),
        if hold_on { "1" } else { "0" }.into(),
    ]
}

/// Runs a slot of `command` over two tasks, stops it once they are done, and returns
/// what the child wrote to its marker file by the time the slot had exited.
async fn exec_child_end(command: impl FnOnce(&Path) -> Vec<String>) -> String {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ended");
    let cfg = exec_queue("closing", command(&marker), 10);
    let handler = Registry::builtin().preload(&cfg).unwrap();
    let slot = InProcess::start(&redis, cfg, handler, &[("a", "1"), ("b", "2")]).await;
    poll_some(Duration::from_secs(30), "both tasks done", || async {
        let s = slot.q.stats().await.unwrap();
        (s.acked_total == 2).then_some(())
    })
    .await;
    slot.stop();
    std::fs::read_to_string(&marker).unwrap_or_default()
}

#[tokio::test]
async fn an_exec_child_reads_the_end_of_its_input_when_its_slot_stops() {
    let how = exec_child_end(|m| closing_child(m, false)).await;
    assert_eq!(
        how, "end of input",
        "the child was killed before it could end"
    );
}

#[tokio::test]
async fn an_exec_child_past_the_end_of_its_input_gets_sigterm() {
    let how = exec_child_end(|m| closing_child(m, true)).await;
    assert_eq!(how, "terminated", "the child got no SIGTERM before SIGKILL");
}
