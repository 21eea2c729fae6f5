//! Ordered queues: one task at a time in creation order, across slots and hosts, a retry
//! keeping its place at the head; refused with a batch or prefetch, and priorities refused.

use std::process::Command;
use std::time::Duration;

use gaffer::queue_client::{NewTask, Settle, SettleOp};

use crate::harness::eventually;
use crate::systems::Rig;

/// An exec handler: each task (payload `{"n": N}`) is retried at random (with a short
/// delay, or none) a third of the time; otherwise its N is appended to the file in
/// `RUN_LOG` and it is acked.
const RUNS: &str = r#"
import json, os, random, sys
log = os.environ["RUN_LOG"]
for line in sys.stdin:
    out = []
    for t in json.loads(line)["batch"]:
        if random.random() < 0.33:
            out.append({"id": t["id"], "status": "retry", "delay_ms": random.choice([0, 0, 20, 50])})
        else:
            with open(log, "a") as f:
                f.write("%d\n" % t["payload"]["n"])
            out.append({"id": t["id"], "status": "ok"})
    sys.stdout.write(json.dumps({"results": out}) + "\n")
    sys.stdout.flush()
"#;

#[tokio::test]
async fn two_hundred_tasks_run_in_creation_order_across_four_hosts_with_random_retries() {
    const N: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("runs.py");
    std::fs::write(&script, RUNS).unwrap();
    let log = dir.path().join("runs.log");
    let tables = format!(
        "[queues.steps]\nhandler = \"exec\"\ncommand = [\"env\", \"RUN_LOG={}\", \"python3\", \"{}\"]\n\
         ordered = true\nbatch_size = 1\nmax_attempts = 100\n",
        log.display(),
        script.display()
    );
    let mut rig = Rig::start(&tables).await;
    let q = rig.queue("steps");
    let tasks: Vec<NewTask> = (0..N)
        .map(|n| NewTask::new(format!("{{\"n\":{n}}}").into_bytes()))
        .collect();
    q.enqueue_many(&tasks).await.unwrap();
    // One slot on each of four hosts: the map, not the balancer, gives them, so the queue
    // alone keeps the order.
    rig.masters(&[
        ("h1", "steps", 1),
        ("h2", "steps", 1),
        ("h3", "steps", 1),
        ("h4", "steps", 1),
    ])
    .await;
    eventually(Duration::from_secs(120), "200 tasks acked", || async {
        q.stats().await.unwrap().acked_total == N as u64
    })
    .await;
    let runs: Vec<usize> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let mut first = Vec::new();
    for n in runs {
        if !first.contains(&n) {
            first.push(n);
        }
    }
    assert_eq!(first, (0..N).collect::<Vec<_>>());
    let stats = q.stats().await.unwrap();
    assert!(
        stats.retried_total > 0,
        "some tasks were retried: {stats:?}"
    );
}

#[tokio::test]
async fn a_retry_with_a_delay_holds_the_queue_until_due_and_stays_at_the_head() {
    let rig =
        Rig::start("[queues.steps]\nhandler = \"noop\"\nordered = true\nbatch_size = 1\n").await;
    let q = rig.queue("steps");
    let ids: Vec<String> = q
        .enqueue_many(
            &(0..3)
                .map(|_| NewTask::new(b"{}".to_vec()))
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    let lease = Duration::from_secs(60);
    // One at a time, whatever the batch asked for, and nothing while it is leased.
    let a = q.take(10, lease).await.unwrap();
    assert_eq!(a.tasks.len(), 1);
    assert_eq!(a.tasks[0].id, ids[0]);
    assert!(q.take(10, lease).await.unwrap().tasks.is_empty());
    // Retried with a delay: nothing behind it is taken until it is due, then it comes first.
    let retry = Settle::Retry {
        delay: Duration::from_millis(300),
        priority: None,
        reason: "later".into(),
    };
    q.settle(&[SettleOp::new(&a.tasks[0], retry)])
        .await
        .unwrap();
    let held = q.take(10, lease).await.unwrap();
    assert!(held.tasks.is_empty(), "the head is not due yet");
    assert!(
        held.next_hint
            .is_some_and(|h| h <= Duration::from_millis(300))
    );
    let again = crate::harness::poll_some(Duration::from_secs(10), "the head due", || async {
        let b = q.take(10, lease).await.unwrap();
        (!b.tasks.is_empty()).then_some(b)
    })
    .await;
    assert_eq!(again.tasks[0].id, ids[0]);
    assert_eq!(again.tasks[0].attempt, 2);
    q.ack(&again.tasks).await.unwrap();
    assert_eq!(q.take(10, lease).await.unwrap().tasks[0].id, ids[1]);
}

/// Tasks an operator puts back (a dead letter requeued, a frozen task thawed) were created
/// before what waits: they go first.
#[tokio::test]
async fn a_requeued_or_thawed_task_goes_before_those_created_after_it() {
    let rig =
        Rig::start("[queues.steps]\nhandler = \"noop\"\nordered = true\nbatch_size = 1\n").await;
    let q = rig.queue("steps");
    let made = q
        .enqueue_many(&(0..4).map(|_| NewTask::new("{}")).collect::<Vec<_>>())
        .await
        .unwrap();
    let ids: Vec<String> = made.into_iter().map(|e| e.id).collect();
    let lease = Duration::from_secs(60);
    let next = || async { q.take(1, lease).await.unwrap().tasks.remove(0) };
    let a = next().await;
    assert_eq!(a.id, ids[0]);
    let fail = Settle::Fail {
        reason: "bad".into(),
    };
    q.settle(&[SettleOp::new(&a, fail)]).await.unwrap();
    // (given twice: moved once)
    let twice = [ids[0].clone(), ids[0].clone()];
    assert_eq!(q.requeue_dead(Some(&twice)).await.unwrap(), 1);
    assert_eq!(q.stats().await.unwrap().ready, 4);
    let a = next().await;
    assert_eq!(a.id, ids[0], "the requeued task first");
    q.ack(&[a]).await.unwrap();

    q.freeze(&ids[1], "hold").await.unwrap();
    let c = next().await;
    assert_eq!(c.id, ids[2]);
    q.thaw(&ids[1], "go").await.unwrap();
    q.ack(&[c]).await.unwrap();
    let b = next().await;
    assert_eq!(b.id, ids[1], "the thawed task before the one after it");
    q.ack(&[b]).await.unwrap();

    // One created after the first waiting goes back behind it, not ahead.
    let later = q
        .enqueue_many(&[NewTask::new("{}"), NewTask::new("{}")])
        .await
        .unwrap();
    let (e, f) = (later[0].id.clone(), later[1].id.clone());
    q.freeze(&f, "hold").await.unwrap();
    q.thaw(&f, "go").await.unwrap();
    for want in [&ids[3], &e, &f] {
        let t = next().await;
        assert_eq!(&t.id, want);
        q.ack(&[t]).await.unwrap();
    }

    // Behind an older task that came back to the front (given back), ahead of newer ones.
    let made = q
        .enqueue_many(&(0..3).map(|_| NewTask::new("{}")).collect::<Vec<_>>())
        .await
        .unwrap();
    let xyz: Vec<String> = made.into_iter().map(|e| e.id).collect();
    q.freeze(&xyz[1], "hold").await.unwrap();
    let x = next().await;
    q.release(&[x]).await.unwrap();
    q.thaw(&xyz[1], "go").await.unwrap();
    for want in &xyz {
        let t = next().await;
        assert_eq!(&t.id, want);
        q.ack(&[t]).await.unwrap();
    }
}

/// The end of an ordered queue's task wakes a taker: another slot waiting for the lease
/// to end (as slots change hands) takes the next task then, not at the lease's expiry.
#[tokio::test]
async fn an_ordered_tasks_end_wakes_a_taker() {
    let rig =
        Rig::start("[queues.steps]\nhandler = \"noop\"\nordered = true\nbatch_size = 1\n").await;
    let q = rig.queue("steps");
    q.enqueue_many(&[NewTask::new("{}"), NewTask::new("{}")])
        .await
        .unwrap();
    let a = q.take(1, Duration::from_secs(60)).await.unwrap();
    let mut raw = rig.redis.raw().await;
    let wake = "test:{steps}:wake";
    let _: () = redis::cmd("DEL")
        .arg(wake)
        .query_async(&mut raw)
        .await
        .unwrap();
    q.ack(&a.tasks).await.unwrap();
    let tokens: u64 = redis::cmd("LLEN")
        .arg(wake)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(tokens, 1);
}

/// More dead letters than one call moves (1,000) requeued at once keep their order at the
/// front of an ordered queue: oldest first, before the tasks that waited.
/// `n` tasks of the ordered queue `steps` on `rig`, all dead, in the order they died.
async fn dead_letters(rig: &Rig, n: usize) -> Vec<String> {
    let tasks: Vec<NewTask> = (0..n).map(|_| NewTask::new("{}")).collect();
    rig.queue("steps").enqueue_many(&tasks).await.unwrap();
    // (failed a batch at a time through a handle that does not hold to the order: the
    // same keys, quicker than one at a time)
    let plain = rig
        .client
        .queue_with("steps", gaffer::queue_client::QueueLimits::default())
        .unwrap();
    loop {
        let batch = plain.take(100, Duration::from_secs(60)).await.unwrap();
        if batch.tasks.is_empty() {
            break;
        }
        let fail = || Settle::Fail {
            reason: "bad".into(),
        };
        let ops: Vec<SettleOp> = batch
            .tasks
            .iter()
            .map(|t| SettleOp::new(t, fail()))
            .collect();
        plain.settle(&ops).await.unwrap();
    }
    rig.queue("steps")
        .dead(0, 2 * n)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect()
}

const STEPS: &str = "[queues.steps]\nhandler = \"noop\"\nordered = true\nbatch_size = 1\n";

/// More dead letters than one call moves (1,000) requeued at once keep their order at the
/// front of an ordered queue: oldest first, before the tasks that waited.
#[tokio::test]
async fn dead_letters_requeued_in_chunks_keep_their_order() {
    let rig = Rig::start(STEPS).await;
    let q = rig.queue("steps");
    let died = dead_letters(&rig, 1_050).await;
    let waiting = q.enqueue(NewTask::new("{}")).await.unwrap().id;
    assert_eq!(died.len(), 1_050);
    // (read in calls of 1,000: one from an offset lines up with the whole)
    let tail: Vec<String> = q
        .dead(999, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(tail, died[999..]);
    assert_eq!(q.requeue_dead(None).await.unwrap(), 1_050);
    let mut raw = rig.redis.raw().await;
    let ready: Vec<String> = redis::cmd("LRANGE")
        .arg("test:{steps}:ready:0")
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let mut want = died;
    want.push(waiting);
    assert!(
        ready == want,
        "the ready list is not the dead letters' order, then the waiting one"
    );
}

/// A take while dead letters go back to the front in chunks (the newest chunk first)
/// waits for the last chunk: the first task it gets is the oldest, then the rest in
/// order. Both ways: all those dead, and given ids.
#[tokio::test]
async fn a_take_during_a_requeue_in_chunks_waits_for_the_oldest() {
    let rig = Rig::start(STEPS).await;
    let q = rig.queue("steps");
    for given in [false, true] {
        let died = dead_letters(&rig, 2_500).await;
        assert_eq!(died.len(), 2_500);
        let requeue = {
            let (q, died) = (q.clone(), died.clone());
            tokio::spawn(async move {
                match given {
                    true => q.requeue_dead(Some(&died)).await,
                    false => q.requeue_dead(None).await,
                }
            })
        };
        // Takes as fast as they come, between the requeue's chunks too.
        let mut first = Vec::new();
        while first.len() < 3 {
            let b = q.take(1, Duration::from_secs(60)).await.unwrap();
            if let Some(t) = b.tasks.first() {
                first.push(t.id.clone());
                q.ack(&b.tasks).await.unwrap();
            }
        }
        assert_eq!(requeue.await.unwrap().unwrap(), 2_500);
        assert_eq!(first, died[..3], "given ids: {given}");
        // (the rest run too: nothing is left held)
        let mut left = 2_500 - 3;
        while left > 0 {
            let b = q.take(1, Duration::from_secs(60)).await.unwrap();
            left -= b.tasks.len();
            q.ack(&b.tasks).await.unwrap();
        }
    }
}

#[tokio::test]
async fn a_priority_or_a_delay_is_refused_on_an_ordered_queue() {
    let rig =
        Rig::start("[queues.steps]\nhandler = \"noop\"\nordered = true\nbatch_size = 1\n").await;
    let q = rig.queue("steps");
    let plain = || NewTask::new(b"{}".to_vec());
    let at = std::time::SystemTime::now() + Duration::from_secs(5);
    for (task, refused) in [
        (plain().priority(5), "priority 5 refused"),
        (plain().delay(Duration::from_millis(10)), "delay refused"),
        (plain().at(at), "delay refused"),
    ] {
        // (one refused task enqueues none of its call)
        let err = q.enqueue_many(&[plain(), task]).await.unwrap_err();
        assert!(err.to_string().contains(refused), "{err}");
        assert!(err.to_string().contains("queue steps is ordered"), "{err}");
    }
    assert_eq!(q.stats().await.unwrap().ready, 0);
}

#[test]
fn ordered_with_a_batch_or_prefetch_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[queues.steps]\nhandler = \"noop\"\nbatch_size = 5\nordered = true\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&path)
        .args(["config", "check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "bad.toml:4:11: queues.steps.ordered: ordered = true needs batch_size = 1, got 5"
        ),
        "{err}"
    );
    std::fs::write(
        &path,
        "[queues.steps]\nhandler = \"noop\"\nprefetch = true\nordered = true\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&path)
        .args(["config", "check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml:4:11: queues.steps.ordered: ordered = true cannot be combined with prefetch = true"),
        "{err}"
    );
}

#[tokio::test]
async fn an_expired_lease_keeps_its_place_at_the_head() {
    let rig =
        Rig::start("[queues.steps]\nhandler = \"noop\"\nordered = true\nbatch_size = 1\n").await;
    let q = rig.queue("steps");
    let tasks: Vec<NewTask> = (0..3).map(|_| NewTask::new(b"{}".to_vec())).collect();
    let ids: Vec<String> = q
        .enqueue_many(&tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    // Taken and never settled, as by a slot killed mid-task.
    let lost = q.take(1, Duration::from_millis(200)).await.unwrap();
    assert_eq!(lost.tasks[0].id, ids[0]);
    let again = crate::harness::poll_some(Duration::from_secs(10), "the lease expired", || async {
        let b = q.take(1, Duration::from_secs(60)).await.unwrap();
        (!b.tasks.is_empty()).then_some(b)
    })
    .await;
    assert_eq!(
        (again.tasks[0].id.as_str(), again.tasks[0].attempt),
        (ids[0].as_str(), 2)
    );
}

/// What holds an ordered queue, taken away by an operator, wakes a taker as a task's end
/// does: a cancel of the running task, a freeze or a cancel of a retried head not yet due.
/// (Before, the queue's idle takers slept on the hold's hint, up to 30 s.)
#[tokio::test]
async fn an_ordered_queues_hold_removed_by_an_operator_wakes_a_taker() {
    let rig =
        Rig::start("[queues.steps]\nhandler = \"noop\"\nordered = true\nbatch_size = 1\n").await;
    let q = rig.queue("steps");
    for id in ["a", "b", "c"] {
        q.enqueue(NewTask::new("{}").id(id)).await.unwrap();
    }
    let mut raw = rig.redis.raw().await;
    let a = q.take(1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(a.tasks[0].id, "a");
    wake_tokens(&mut raw).await;
    q.cancel("a").await.unwrap().expect("a was running");
    assert_eq!(wake_tokens(&mut raw).await, 1, "a running task cancelled");
    let b = q.take(1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(b.tasks[0].id, "b");
    let retry = Settle::Retry {
        delay: Duration::from_secs(600),
        priority: None,
        reason: "later".into(),
    };
    q.settle(&[SettleOp::new(&b.tasks[0], retry)])
        .await
        .unwrap();
    wake_tokens(&mut raw).await;
    q.freeze("b", "held").await.unwrap();
    assert_eq!(wake_tokens(&mut raw).await, 1, "a retried head frozen");
    // Thawed before it is due, it holds the queue again; cancelled, it frees it.
    q.thaw("b", "back").await.unwrap();
    assert!(
        q.take(1, Duration::from_secs(60))
            .await
            .unwrap()
            .tasks
            .is_empty()
    );
    wake_tokens(&mut raw).await;
    q.cancel("b").await.unwrap().expect("b was waiting");
    assert_eq!(wake_tokens(&mut raw).await, 1, "a retried head cancelled");
    let c = q.take(1, Duration::from_secs(60)).await.unwrap();
    assert_eq!(c.tasks[0].id, "c", "nothing holds the queue");
}

/// The wake-up tokens queue `steps` holds, which it then forgets.
async fn wake_tokens(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    let wake = "test:{steps}:wake";
    let n: u64 = redis::cmd("LLEN").arg(wake).query_async(raw).await.unwrap();
    let _: () = redis::cmd("DEL").arg(wake).query_async(raw).await.unwrap();
    n
}
