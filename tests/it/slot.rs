//! A slot run in-process (no fork) with handlers written for the test: the slot loop's
//! own guarantees, apart from the master.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use gaffer::config::{Handler as HandlerConfig, QueueConfig, RetryPolicy};
use gaffer::queue_client::{NewTask, QueueLimits, RecordState};
use gaffer::slot::builtin::Sleep;
use gaffer::slot::{
    EXIT_STOPPED, Handler, HandlerError, Outcome, SlotContext, SlotEvent, SlotSpec, Task, run_slot,
};
use tokio_util::sync::CancellationToken;

use crate::harness::{TestRedis, eventually};

/// Panics on the first attempt of any batch holding a task whose payload is `panic`.
struct PanicsOnce;

impl Handler for PanicsOnce {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Ok(PanicsOnce)
    }

    fn handle(&mut self, _: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        if batch
            .iter()
            .any(|t| t.payload == b"panic" && t.attempt == 1)
        {
            panic!("boom on purpose");
        }
        vec![Outcome::done(); batch.len()]
    }
}

fn spec(redis: &TestRedis, queue: QueueConfig, report: UnixDatagram) -> SlotSpec {
    crate::harness::slot_spec(redis, queue, 7, report)
}

/// A slot of `cfg` with `handler`, run in a thread as the master's zygote would start it:
/// the thread, the other end of the socket it reports on, and the token that stops it.
fn spawn_slot(
    redis: &TestRedis,
    cfg: QueueConfig,
    handler: Box<dyn Handler>,
) -> (
    std::thread::JoinHandle<i32>,
    UnixDatagram,
    CancellationToken,
) {
    let (report, events) = UnixDatagram::pair().unwrap();
    let stop = CancellationToken::new();
    let thread = {
        let (spec, stop) = (spec(redis, cfg, report), stop.clone());
        std::thread::spawn(move || run_slot(spec, handler, Some(stop)))
    };
    (thread, events, stop)
}

/// A slot with the `PanicsOnce` handler, run in a thread as the master's zygote would
/// start it, with the socket the master hears it on.
struct PanickySlot {
    thread: std::thread::JoinHandle<i32>,
    events: UnixDatagram,
    stop: CancellationToken,
}

impl PanickySlot {
    fn start(redis: &TestRedis, cfg: QueueConfig) -> Self {
        let (thread, events, stop) = spawn_slot(redis, cfg, Box::new(PanicsOnce));
        PanickySlot {
            thread,
            events,
            stop,
        }
    }

    /// Stops the slot, checks that it exits as stopped, and returns every event it sent.
    fn stop(self) -> Vec<SlotEvent> {
        self.stop.cancel();
        assert_eq!(self.thread.join().unwrap(), EXIT_STOPPED);
        self.events.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        let mut heard = Vec::new();
        while let Ok(n) = self.events.recv(&mut buf) {
            heard.push(serde_json::from_slice(&buf[..n]).unwrap());
        }
        heard
    }
}

#[tokio::test]
async fn a_panic_fails_only_its_batch_and_the_slot_survives() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue("p").unwrap();
    let mut cfg = QueueConfig::new("p", HandlerConfig::named(HandlerConfig::NOOP));
    cfg.batch_size = 2;
    cfg.retry = RetryPolicy {
        base: Duration::from_millis(10),
        max: Duration::from_millis(10),
        ..RetryPolicy::default()
    };
    // The panicking batch first, then an ordinary one.
    q.enqueue_many(&[NewTask::new("panic"), NewTask::new("x")])
        .await
        .unwrap();
    let slot = PanickySlot::start(&redis, cfg);
    eventually(Duration::from_secs(20), "both tasks done", || async {
        q.stats().await.unwrap().acked_total == 2
    })
    .await;
    q.enqueue(NewTask::new("y")).await.unwrap();
    eventually(Duration::from_secs(20), "a later task done", || async {
        q.stats().await.unwrap().acked_total == 3
    })
    .await;
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.retried_total, stats.dead), (2, 0), "{stats:?}");
    // The master heard of every batch, the failed one included.
    let mut done = Vec::new();
    for e in slot.stop() {
        if let SlotEvent::BatchDone { tasks, failed, .. } = e {
            done.push((tasks, failed));
        }
    }
    assert_eq!(done.first(), Some(&(2, 2)), "{done:?}");
    assert_eq!(done.iter().map(|d| d.0).sum::<u32>(), 5, "{done:?}");
}

/// Fails at init: the slot exits with the fatal code instead of taking tasks it could
/// not handle.
struct NoInit;

impl Handler for NoInit {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Ok(NoInit)
    }

    fn init(&mut self, _: &SlotContext) -> Result<(), HandlerError> {
        Err(HandlerError::new("no database"))
    }

    fn handle(&mut self, _: &SlotContext, _: &[Task]) -> Vec<Outcome> {
        unreachable!("never initialised")
    }
}

#[tokio::test]
async fn a_failed_init_exits_fatal_and_takes_nothing() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue("i").unwrap();
    q.enqueue(NewTask::new("x")).await.unwrap();
    let (report, _events) = UnixDatagram::pair().unwrap();
    let cfg = QueueConfig::new("i", HandlerConfig::named(HandlerConfig::NOOP));
    let spec = spec(&redis, cfg, report);
    let code = tokio::task::spawn_blocking(move || run_slot(spec, Box::new(NoInit), None))
        .await
        .unwrap();
    assert_eq!(code, gaffer::slot::EXIT_FATAL);
    assert_eq!(q.stats().await.unwrap().ready, 1);
}

/// Acknowledges everything and tells the test which tasks it was given.
struct Records(std::sync::mpsc::Sender<String>);

impl Handler for Records {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Err(HandlerError::new("built by the test"))
    }

    fn handle(&mut self, _: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        for t in batch {
            let _ = self.0.send(t.id.clone());
        }
        vec![Outcome::done(); batch.len()]
    }
}

/// The dead letters of `q` as (id, error), oldest first.
async fn dead_letters(q: &gaffer::queue_client::Queue) -> Vec<(String, String)> {
    let mut dead: Vec<_> = q.dead(0, 100).await.unwrap();
    dead.sort_by_key(|d| d.died_ms);
    dead.into_iter().map(|d| (d.id, d.error)).collect()
}

#[tokio::test]
async fn an_oversized_payload_is_dead_lettered_before_the_handler_and_the_slot_goes_on() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    // The producer's limit is larger than the slot's: another client, or a limit lowered
    // in the config since.
    let limits = QueueLimits {
        max_payload: 8 << 20,
        ..QueueLimits::default()
    };
    let q = client.queue_with("o", limits).unwrap();
    let mut cfg = QueueConfig::new("o", HandlerConfig::named(HandlerConfig::NOOP));
    cfg.batch_size = 3;
    cfg.max_payload = 1 << 20;
    let big = vec![b'x'; 2 << 20];
    q.enqueue_many(&[
        NewTask::new("{}").id("a"),
        NewTask::new(big.clone()).id("big"),
        NewTask::new("{}").id("c"),
    ])
    .await
    .unwrap();
    let (report, _events) = UnixDatagram::pair().unwrap();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    let stop = CancellationToken::new();
    let slot = {
        let (spec, stop) = (spec(&redis, cfg, report), stop.clone());
        std::thread::spawn(move || run_slot(spec, Box::new(Records(seen_tx)), Some(stop)))
    };
    eventually(Duration::from_secs(20), "the batch settled", || async {
        let s = q.stats().await.unwrap();
        s.acked_total == 2 && s.dead == 1
    })
    .await;
    let reason = "payload of 2.0 MiB exceeds max_payload 1.0 MiB".to_owned();
    assert_eq!(dead_letters(&q).await, vec![("big".into(), reason.clone())]);

    // A batch refused whole: nothing reaches the handler, and the slot goes on.
    q.enqueue(NewTask::new(big).id("big2")).await.unwrap();
    eventually(Duration::from_secs(20), "the second one dead", || async {
        q.stats().await.unwrap().dead == 2
    })
    .await;
    q.enqueue(NewTask::new("{}").id("d")).await.unwrap();
    eventually(Duration::from_secs(20), "a later task done", || async {
        q.stats().await.unwrap().acked_total == 3
    })
    .await;
    assert_eq!(dead_letters(&q).await[1], ("big2".into(), reason));
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
    let seen: Vec<String> = seen.try_iter().collect();
    assert_eq!(seen, ["a", "c", "d"]);
}

#[tokio::test]
async fn a_deeply_nested_payload_is_dead_lettered_by_a_json_handler_and_the_slot_goes_on() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue("n").unwrap();
    let mut cfg = QueueConfig::new("n", HandlerConfig::named(HandlerConfig::SLEEP));
    cfg.batch_size = 3;
    // Deep enough to overflow a recursive parser's stack if it got that far.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    q.enqueue_many(&[
        NewTask::new(r#"{"ms":1}"#).id("a"),
        NewTask::new(deep).id("deep"),
        NewTask::new("{}").id("c"),
    ])
    .await
    .unwrap();
    let (report, _events) = UnixDatagram::pair().unwrap();
    let stop = CancellationToken::new();
    let slot = {
        let (spec, stop) = (spec(&redis, cfg, report), stop.clone());
        std::thread::spawn(move || run_slot(spec, Box::new(Sleep), Some(stop)))
    };
    eventually(Duration::from_secs(20), "the batch settled", || async {
        let s = q.stats().await.unwrap();
        s.acked_total == 2 && s.dead == 1
    })
    .await;
    assert_eq!(
        dead_letters(&q).await,
        vec![(
            "deep".into(),
            "sleep: payload nested deeper than 64 levels".into()
        )]
    );
    q.enqueue(NewTask::new("{}").id("d")).await.unwrap();
    eventually(Duration::from_secs(20), "a later task done", || async {
        q.stats().await.unwrap().acked_total == 3
    })
    .await;
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
}

/// Returns the payload's "n" doubled as its result.
struct Doubles;

impl Handler for Doubles {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Ok(Doubles)
    }

    fn handle(&mut self, _: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        batch
            .iter()
            .map(|t| {
                let n = t.json().ok().and_then(|v| v["n"].as_i64()).unwrap_or(0);
                Outcome::done_with(serde_json::json!({ "double": n * 2 }))
            })
            .collect()
    }
}

/// Runs a slot of `cfg` with `handler` until `id`'s record has ended, then stops it, and
/// returns the record.
async fn run_until_ended(
    redis: &TestRedis,
    cfg: QueueConfig,
    handler: Box<dyn Handler>,
    id: &str,
) -> gaffer::queue_client::TaskRecord {
    let client = redis.client().await;
    let q = client.queue(&cfg.name).unwrap();
    let (report, _events) = UnixDatagram::pair().unwrap();
    let stop = CancellationToken::new();
    let slot = {
        let (spec, stop) = (spec(redis, cfg, report), stop.clone());
        std::thread::spawn(move || run_slot(spec, handler, Some(stop)))
    };
    let rec = crate::harness::poll_some(Duration::from_secs(20), "the task's end", || {
        let q = q.clone();
        async move { q.record(id).await.unwrap().filter(|r| r.state.is_end()) }
    })
    .await;
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
    rec
}

#[tokio::test]
async fn a_rust_handlers_result_lands_in_the_record_with_host_and_slot() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue("r").unwrap();
    q.enqueue(NewTask::new(r#"{"n":21}"#).id("t"))
        .await
        .unwrap();
    let cfg = QueueConfig::new("r", HandlerConfig::named(HandlerConfig::NOOP));
    let rec = run_until_ended(&redis, cfg, Box::new(Doubles), "t").await;
    assert_eq!(rec.state, gaffer::queue_client::RecordState::Done);
    assert_eq!(rec.result, Some(serde_json::json!({"double": 42})));
    let ran = &rec.history.unwrap()[1];
    assert_eq!(
        (ran.host.as_deref(), ran.slot),
        (Some("test-host"), Some(7))
    );
}

#[tokio::test]
async fn an_exec_childs_result_lands_in_the_record_and_an_oversized_one_fails_the_task() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue("x").unwrap();
    q.enqueue_many(&[
        NewTask::new(r#"{"size":3}"#).id("small"),
        NewTask::new(r#"{"size":300}"#).id("big"),
    ])
    .await
    .unwrap();
    // A child that answers every task with a result of "x" × the payload's size.
    let script = r#"
import json, sys
for line in sys.stdin:
    batch = json.loads(line)["batch"]
    out = [{"id": t["id"], "status": "ok", "result": {"s": "x" * t["payload"]["size"]}} for t in batch]
    print(json.dumps({"results": out}), flush=True)
"#;
    let mut cfg = QueueConfig::new(
        "x",
        HandlerConfig::exec(vec!["python3".into(), "-c".into(), script.into()]),
    );
    cfg.batch_size = 2;
    cfg.max_result = 100;
    let handler = gaffer::slot::Registry::builtin().preload(&cfg).unwrap();
    let rec = run_until_ended(&redis, cfg, handler, "big").await;
    assert_eq!(rec.state, gaffer::queue_client::RecordState::Failed);
    assert!(
        rec.error
            .as_deref()
            .unwrap()
            .contains("exceeds max_result 100 bytes"),
        "{:?}",
        rec.error
    );
    let small = q.record("small").await.unwrap().unwrap();
    assert_eq!(small.result, Some(serde_json::json!({"s": "xxx"})));
}

/// The (id, attempt) of every task a handler was handed, in order.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, u32)>>>;

/// Records every task it is handed and holds the batch until the test lets it go, so a
/// test can act while the slot is busy (and, with `prefetch`, holds a batch ahead).
struct Gate {
    seen: Seen,
    open: std::sync::mpsc::Receiver<()>,
}

impl Gate {
    fn new() -> (Gate, Seen, std::sync::mpsc::Sender<()>) {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, open) = std::sync::mpsc::channel();
        (
            Gate {
                seen: seen.clone(),
                open,
            },
            seen,
            tx,
        )
    }
}

impl Handler for Gate {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Ok(Gate::new().0)
    }

    fn handle(&mut self, _: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        self.seen
            .lock()
            .unwrap()
            .extend(batch.iter().map(|t| (t.id.clone(), t.attempt)));
        // A test that dropped its sender lets every later batch through.
        let _ = self.open.recv();
        vec![Outcome::done(); batch.len()]
    }
}

/// A prefetching queue of batch 1 with the given lease.
fn prefetching(name: &str, lease: Duration) -> QueueConfig {
    let mut cfg = QueueConfig::new(name, HandlerConfig::named(HandlerConfig::NOOP));
    cfg.batch_size = 1;
    cfg.prefetch = true;
    cfg.lease = lease;
    cfg.max_batch_time = lease;
    cfg
}

/// A queue of batches of 2, not prefetched, with the given lease.
fn batches_of_two(name: &str, lease: Duration) -> QueueConfig {
    let mut cfg = prefetching(name, lease);
    cfg.batch_size = 2;
    cfg.prefetch = false;
    cfg
}

/// A slot of `cfg` whose handler is a [`Gate`], run in a thread as the master's zygote
/// would start it.
struct GatedSlot {
    seen: Seen,
    open: std::sync::mpsc::Sender<()>,
    stop: CancellationToken,
    slot: std::thread::JoinHandle<i32>,
    /// The slot's report socket's other end, kept open while the slot runs.
    _events: UnixDatagram,
}

impl GatedSlot {
    fn start(redis: &TestRedis, cfg: QueueConfig) -> GatedSlot {
        let (gate, seen, open) = Gate::new();
        let (slot, _events, stop) = spawn_slot(redis, cfg, Box::new(gate));
        GatedSlot {
            seen,
            open,
            stop,
            slot,
            _events,
        }
    }
}

/// A prefetching slot (batch 1) on a queue of tasks a and b: a held in the handler by the
/// gate, b taken ahead.
struct Prefetched {
    q: gaffer::queue_client::Queue,
    gated: GatedSlot,
}

impl Prefetched {
    async fn start(redis: &TestRedis, name: &str, lease: Duration) -> Prefetched {
        let q = redis.client().await.queue(name).unwrap();
        q.enqueue_many(&[NewTask::new("1").id("a"), NewTask::new("2").id("b")])
            .await
            .unwrap();
        let gated = GatedSlot::start(redis, prefetching(name, lease));
        eventually(
            Duration::from_secs(20),
            "a in the handler, b prefetched",
            || async {
                gated.seen.lock().unwrap().len() == 1 && q.stats().await.unwrap().leased == 2
            },
        )
        .await;
        Prefetched { q, gated }
    }
}

#[tokio::test]
async fn a_prefetched_batch_goes_back_on_sigterm_without_an_attempt_counted() {
    let redis = TestRedis::start();
    let Prefetched {
        q,
        gated:
            GatedSlot {
                seen,
                open,
                stop,
                slot,
                _events,
            },
    } = Prefetched::start(&redis, "pf", Duration::from_secs(30)).await;
    stop.cancel();
    open.send(()).unwrap();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);

    assert_eq!(*seen.lock().unwrap(), [("a".to_string(), 1)]);
    let s = q.stats().await.unwrap();
    assert_eq!((s.acked_total, s.leased, s.ready), (1, 0, 1), "{s:?}");
    let info = q.find("b").await.unwrap().unwrap();
    assert_eq!(info.attempts, 0, "giving back counts no attempt");
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    assert_eq!((b.tasks[0].id.as_str(), b.tasks[0].attempt), ("b", 1));
    // The take handed back never ran: the history shows only the take that did.
    let history = q.record("b").await.unwrap().unwrap().history.unwrap();
    let entries: Vec<_> = history.iter().map(|e| (e.state, e.attempt)).collect();
    assert_eq!(
        entries,
        [(RecordState::Waiting, 0), (RecordState::Running, 1)],
        "{history:?}"
    );
}

#[tokio::test]
async fn a_prefetched_batch_whose_lease_ran_out_is_not_handled() {
    let redis = TestRedis::start();
    // The batch in the handler has its lease extended; the one prefetched has not.
    let Prefetched {
        q,
        gated:
            GatedSlot {
                seen,
                open,
                stop,
                slot,
                _events,
            },
    } = Prefetched::start(&redis, "pl", Duration::from_millis(300)).await;
    // b's lease runs out while a is still handled, and another taker reclaims it.
    let ours = crate::harness::poll_some(Duration::from_secs(10), "b reclaimed", || {
        let q = q.clone();
        async move {
            let b = q.take(1, Duration::from_secs(30)).await.unwrap();
            (!b.tasks.is_empty()).then_some(b)
        }
    })
    .await;
    assert_eq!((ours.tasks[0].id.as_str(), ours.tasks[0].attempt), ("b", 2));
    drop(open);
    eventually(Duration::from_secs(20), "a acked", || async {
        q.stats().await.unwrap().acked_total == 1
    })
    .await;
    // The slot goes on with new work; b never reached its handler, and our lease on it
    // is intact.
    q.enqueue(NewTask::new("3").id("c")).await.unwrap();
    eventually(Duration::from_secs(20), "c acked", || async {
        q.stats().await.unwrap().acked_total == 2
    })
    .await;
    assert_eq!(
        *seen.lock().unwrap(),
        [("a".to_string(), 1), ("c".to_string(), 1)]
    );
    assert_eq!(
        q.ack(&ours.tasks).await.unwrap(),
        vec![gaffer::queue_client::SettleResult::Done]
    );
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
}

/// `n` tasks `t0000`, `t0001`, … enqueued on `q` in that order, their ids returned.
async fn numbered(q: &gaffer::queue_client::Queue, n: usize) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|i| format!("t{i:04}")).collect();
    for chunk in ids.chunks(500) {
        let tasks: Vec<NewTask> = chunk.iter().map(|id| NewTask::new("x").id(id)).collect();
        q.enqueue_many(&tasks).await.unwrap();
    }
    ids
}

/// A slot of a prefetching queue of batches of 10, its handler a [`Gate`].
fn prefetching_by_ten(redis: &TestRedis, name: &str) -> GatedSlot {
    let mut cfg = prefetching(name, Duration::from_secs(30));
    cfg.batch_size = 10;
    GatedSlot::start(redis, cfg)
}

/// A prefetching slot settles each batch and takes the batch after next in one call, so
/// with a quick handler it keeps two calls in flight: one script call per batch (a
/// separate take while the handler works and a settle alone would make two), and the
/// batches still reach the handler in the order they were taken.
#[tokio::test]
async fn a_prefetching_slot_makes_one_call_per_batch_and_keeps_the_order() {
    let redis = TestRedis::start();
    let q = redis.client().await.queue("one").unwrap();
    let ids = numbered(&q, 1000).await;
    let before = crate::harness::script_calls(redis.raw().await).await;
    let GatedSlot {
        seen,
        open,
        stop,
        slot,
        _events,
    } = prefetching_by_ten(&redis, "one");
    drop(open);
    // (polled in memory: a stats call would count as a script call)
    eventually(Duration::from_secs(30), "every task handled", || async {
        seen.lock().unwrap().len() == ids.len()
    })
    .await;
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
    let calls = crate::harness::script_calls(redis.raw().await).await - before;
    // 100 settles, each with a take; the first take, the one sent ahead with it, and the
    // takes that found the queue empty.
    assert!(
        (100..=106).contains(&calls),
        "{calls} script calls for 100 batches"
    );
    let s = q.stats().await.unwrap();
    assert_eq!((s.acked_total, s.leased, s.ready), (1000, 0, 0), "{s:?}");
    let handed: Vec<(String, u32)> = ids.iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(*seen.lock().unwrap(), handed);
}

/// A prefetching slot stopped in the middle of a quick drain, its calls held by a pause of
/// Redis's writes (two in flight: the one it waits for and the next), settles every batch
/// its handler ran and gives back every batch its calls took ahead, the latest first: what
/// is left is the rest of the queue in its order, with no attempt counted and nothing
/// leased.
#[tokio::test]
async fn a_prefetching_slot_stopped_mid_drain_gives_back_what_it_took_ahead_in_order() {
    let redis = TestRedis::start();
    let q = redis.client().await.queue("mid").unwrap();
    let ids = numbered(&q, 3000).await;
    let GatedSlot {
        seen,
        open,
        stop,
        slot,
        _events,
    } = prefetching_by_ten(&redis, "mid");
    drop(open);
    eventually(Duration::from_secs(30), "some batches handled", || async {
        seen.lock().unwrap().len() >= 500
    })
    .await;
    let mut raw = redis.raw().await;
    pause_writes_until_a_call_is_held(&redis, &mut raw).await;
    stop.cancel();
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() < ids.len(), "the drain ended before the stop");
    let handed: Vec<(String, u32)> = ids[..seen.len()].iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(
        seen, handed,
        "the handler got a prefix of the queue, each task once"
    );
    let s = q.stats().await.unwrap();
    let left = (ids.len() - seen.len()) as u64;
    assert_eq!(
        (s.acked_total, s.leased, s.ready),
        (seen.len() as u64, 0, left),
        "{s:?}"
    );
    let rest = q.take(ids.len(), Duration::from_secs(30)).await.unwrap();
    let rest: Vec<(String, u32)> = rest
        .tasks
        .iter()
        .map(|t| (t.id.clone(), t.attempt))
        .collect();
    let expected: Vec<(String, u32)> = ids[seen.len()..].iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(rest, expected, "the rest, in order, no attempt counted");
}

/// A prefetching slot whose Redis is killed in the middle of a quick drain (calls in
/// flight fail, settles are retried alone, takes back off) and restarted from its AOF
/// goes on: every task is handled and acked, nothing stays leased.
#[tokio::test]
async fn a_prefetching_slot_rides_out_a_redis_restart_mid_drain_and_loses_nothing() {
    let mut redis = TestRedis::with_aof();
    let q = redis.client().await.queue("rr").unwrap();
    let ids = numbered(&q, 3000).await;
    // (a take Redis applied before it died, its answer lost, waits out this lease)
    let mut cfg = prefetching("rr", Duration::from_secs(2));
    cfg.batch_size = 10;
    let GatedSlot {
        seen,
        open,
        stop,
        slot,
        _events,
    } = GatedSlot::start(&redis, cfg);
    drop(open);
    eventually(Duration::from_secs(30), "some batches handled", || async {
        seen.lock().unwrap().len() >= 500
    })
    .await;
    redis.server.kill();
    redis.server.restart().unwrap();
    let q = redis.client().await.queue("rr").unwrap();
    eventually(Duration::from_secs(60), "every task acked", || async {
        q.stats()
            .await
            .is_ok_and(|s| (s.acked_total, s.leased, s.ready) == (3000, 0, 0))
    })
    .await;
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
    let handled: std::collections::BTreeSet<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(
        handled,
        ids.into_iter().collect(),
        "every task reached the handler"
    );
}

/// A task of a batch cancelled while its handler runs is extended no more: its lease is
/// gone, and asking again counted a stale settle at every tick. The extension that finds
/// it gone and its settle are stale once each; the rest of the batch is extended and
/// acked as usual.
#[tokio::test]
async fn a_task_cancelled_mid_batch_is_not_extended_again() {
    let redis = TestRedis::start();
    let q = redis.client().await.queue("ext").unwrap();
    q.enqueue_many(&[NewTask::new("1").id("a"), NewTask::new("2").id("b")])
        .await
        .unwrap();
    let GatedSlot {
        seen,
        open,
        stop,
        slot,
        _events,
    } = GatedSlot::start(&redis, batches_of_two("ext", Duration::from_millis(300)));
    eventually(
        Duration::from_secs(20),
        "a and b in the handler",
        || async { seen.lock().unwrap().len() == 2 },
    )
    .await;
    q.cancel("a").await.unwrap();
    // b's lease is extended every 100 ms: wait for three extensions after the cancel.
    let expiries = std::sync::Mutex::new(Vec::new());
    eventually(Duration::from_secs(20), "three extensions of b", || async {
        let at = q.find("b").await.unwrap().unwrap().at_ms;
        let mut seen = expiries.lock().unwrap();
        if seen.last() != Some(&at) {
            seen.push(at);
        }
        seen.len() > 3
    })
    .await;
    drop(open);
    eventually(Duration::from_secs(20), "b acked", || async {
        q.stats().await.unwrap().acked_total == 1
    })
    .await;
    let s = q.stats().await.unwrap();
    // (the first extension after the cancel finds a's lease gone, the settle once more)
    assert_eq!(s.stale_total, 2, "one extension of a and its settle: {s:?}");
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
}

/// Pauses the writes of `redis` (for 30 s at most, through `raw`) and waits until a
/// client's script call is held by the pause.
async fn pause_writes_until_a_call_is_held(
    redis: &TestRedis,
    raw: &mut redis::aio::MultiplexedConnection,
) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query_async(raw)
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "a script call held", || async {
        a_call_is_held(&mut redis.raw().await, "fcall").await
    })
    .await;
}

/// Whether a client of `raw`'s server waits, blocked, in a call of `command` (a take
/// held by `CLIENT PAUSE`, an idle slot's wait for a wake-up).
async fn a_call_is_held(raw: &mut redis::aio::MultiplexedConnection, command: &str) -> bool {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(raw)
        .await
        .unwrap();
    list.lines()
        .any(|l| l.contains(" flags=b ") && l.contains(&format!(" cmd={command} ")))
}

/// A slot asked to stop while its take is in flight gives the batch that take leased back
/// unstarted, with no attempt counted, rather than handing it to its handler only to ask
/// it to stop at once.
#[tokio::test]
async fn a_batch_taken_while_the_slot_was_asked_to_stop_goes_back_unstarted() {
    let redis = TestRedis::start();
    let q = redis.client().await.queue("tk").unwrap();
    let mut raw = redis.raw().await;
    // Due in a moment, enqueued before the slot starts; once the slot waits for that
    // moment (its wake-ups spent), writes pause, so the take it makes then is held.
    let delay = Duration::from_secs(1);
    q.enqueue_many(&[
        NewTask::new("1").id("a").delay(delay),
        NewTask::new("2").id("b").delay(delay),
    ])
    .await
    .unwrap();
    let GatedSlot {
        seen,
        open,
        stop,
        slot,
        _events,
    } = GatedSlot::start(&redis, batches_of_two("tk", Duration::from_secs(30)));
    drop(open);
    eventually(Duration::from_secs(20), "the slot waiting", || async {
        a_call_is_held(&mut redis.raw().await, "blpop").await
    })
    .await;
    pause_writes_until_a_call_is_held(&redis, &mut raw).await;
    // (a read: scripts wait out the pause)
    let due: i64 = redis::cmd("ZSCORE")
        .arg("test:{tk}:delayed")
        .arg("b")
        .query_async(&mut raw)
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "the tasks due", || async {
        let (s, us): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut redis.raw().await)
            .await
            .unwrap();
        s * 1000 + us / 1000 > due
    })
    .await;
    stop.cancel();
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased, s.acked_total), (2, 0, 0), "{s:?}");
    for id in ["a", "b"] {
        assert_eq!(q.find(id).await.unwrap().unwrap().attempts, 0, "{id}");
    }
}

/// In a slot's steady state the end of one batch and the start of the next, taken with
/// its settle, travel in one datagram: the master hears of every batch's start once,
/// from a `BatchStarted` or from the `next` of the batch before. Batch ends that follow
/// the last datagram closely are summed into one (`slot/run/report.rs`), so the master
/// may hear of several batches at once, but of each exactly once.
#[tokio::test]
async fn batch_ends_tell_every_batch_once_and_carry_the_next_start() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue("d").unwrap();
    let mut cfg = QueueConfig::new("d", HandlerConfig::named(HandlerConfig::NOOP));
    cfg.batch_size = 10;
    let tasks: Vec<NewTask> = (0..25).map(|i| NewTask::new(format!("{i}"))).collect();
    q.enqueue_many(&tasks).await.unwrap();
    let slot = PanickySlot::start(&redis, cfg);
    eventually(Duration::from_secs(20), "all 25 done", || async {
        q.stats().await.unwrap().acked_total == 25
    })
    .await;
    let mut got = Vec::new();
    let (mut batches, mut done) = (0, 0);
    for e in slot.stop() {
        match e {
            SlotEvent::BatchStarted { tasks, .. } => got.push(format!("started {tasks}")),
            SlotEvent::BatchDone {
                batches: b,
                tasks,
                next,
                ..
            } => {
                batches += b;
                done += tasks;
                got.push(format!("next {next:?}"));
            }
            _ => {}
        }
    }
    assert_eq!((batches, done), (3, 25), "{got:?}");
    assert_eq!(got.first().map(String::as_str), Some("started 10"));
    assert_eq!(got.last().map(String::as_str), Some("next None"));
    // one datagram per batch at most, and no other start than the first
    assert!(got.len() <= 4, "{got:?}");
    assert_eq!(got.iter().filter(|g| g.starts_with("started")).count(), 1);
}

/// Says "closed" when closed and "dropped" when dropped, and panics in `close` when told.
struct Closes {
    said: std::sync::mpsc::Sender<&'static str>,
    panic_in_close: bool,
}

impl Handler for Closes {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Err(HandlerError::new("built by the test"))
    }

    fn handle(&mut self, _: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        vec![Outcome::done(); batch.len()]
    }

    fn close(&mut self) {
        let _ = self.said.send("closed");
        assert!(!self.panic_in_close, "close panics");
    }
}

impl Drop for Closes {
    fn drop(&mut self) {
        let _ = self.said.send("dropped");
    }
}

#[tokio::test]
async fn a_handler_is_closed_when_its_slot_ends_and_a_panic_there_is_contained() {
    for panic_in_close in [false, true] {
        let redis = TestRedis::start();
        let q = redis.client().await.queue("c").unwrap();
        q.enqueue(NewTask::new("{}")).await.unwrap();
        let cfg = QueueConfig::new("c", HandlerConfig::named(HandlerConfig::NOOP));
        let (report, _events) = UnixDatagram::pair().unwrap();
        let (said, heard) = std::sync::mpsc::channel();
        let handler = Closes {
            said,
            panic_in_close,
        };
        let stop = CancellationToken::new();
        let slot = {
            let (spec, stop) = (spec(&redis, cfg, report), stop.clone());
            std::thread::spawn(move || run_slot(spec, Box::new(handler), Some(stop)))
        };
        eventually(Duration::from_secs(20), "the task done", || async {
            q.stats().await.unwrap().acked_total == 1
        })
        .await;
        stop.cancel();
        assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
        // Closed before the slot returned, then dropped (a slot in another process's
        // thread drops its handler; a forked one only closes it).
        let heard: Vec<_> = heard.try_iter().collect();
        assert_eq!(
            heard,
            ["closed", "dropped"],
            "panic_in_close: {panic_in_close}"
        );
    }
}
