//! Batch leases (lua/lib/blocks.lua): a take of first attempts leases its tasks as one batch,
//! a whole batch's ack removes it in one step, and everything else (an ack in parts or
//! out of order, a retry, a cancel, a release, an expiry) splits it into per-task leases
//! first. Each case checks the queue's contract holds on both forms, on a single server
//! and on the 3-master cluster.

use std::time::Duration;

use gaffer::queue_client::{
    NewTask, Queue, QueueClient, QueueLimits, RecordState, Settle, SettleOp, SettleResult,
    TaskState, Worker,
};

use crate::harness::{TestRedis, poll_some};

crate::harness::on_both!(
    a_whole_batch_ack_settles_every_task,
    acks_in_parts_and_out_of_order_are_fenced_per_task,
    a_retry_in_a_batch_leaves_the_other_acks_applied,
    an_expired_batch_comes_back_and_its_holder_is_stale,
    a_released_batch_comes_back_in_take_order_at_the_same_attempt,
    a_cancelled_task_of_a_batch_is_stale_for_its_holder,
    ids_holding_a_separator_are_leased_one_by_one,
    a_batched_task_shows_running_in_its_record_and_list,
    many_expired_batches_all_come_back_over_bounded_takes,
);

fn tracked() -> QueueLimits {
    QueueLimits {
        max_attempts: 5,
        ..Default::default()
    }
}

async fn fill(q: &Queue, n: usize) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|i| format!("t{i:03}")).collect();
    let tasks: Vec<NewTask> = ids.iter().map(|id| NewTask::new("{}").id(id)).collect();
    q.enqueue_many(&tasks).await.unwrap();
    ids
}

fn all(r: SettleResult, n: usize) -> Vec<SettleResult> {
    vec![r; n]
}

async fn a_whole_batch_ack_settles_every_task(client: QueueClient, name: &str) {
    let q = client.queue_with(name, tracked()).unwrap();
    fill(&q, 50).await;
    let b = q.take(50, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 50);
    assert!(b.tasks.iter().all(|t| t.attempt == 1));
    let s = q.stats().await.unwrap();
    assert_eq!(
        (s.ready, s.leased),
        (0, 50),
        "a batch lease counts its tasks"
    );
    assert_eq!(
        q.find("t007").await.unwrap().unwrap().state,
        TaskState::Leased
    );
    assert_eq!(q.ack(&b.tasks).await.unwrap(), all(SettleResult::Done, 50));
    let s = q.stats().await.unwrap();
    assert_eq!((s.leased, s.acked_total, s.stale_total), (0, 50, 0));
    assert!(q.find("t007").await.unwrap().is_none());
    // Acked again: the batch is gone, so every op is stale and nothing changes.
    assert_eq!(q.ack(&b.tasks).await.unwrap(), all(SettleResult::Stale, 50));
    let s = q.stats().await.unwrap();
    assert_eq!((s.leased, s.acked_total, s.stale_total), (0, 50, 50));
}

async fn acks_in_parts_and_out_of_order_are_fenced_per_task(client: QueueClient, name: &str) {
    let q = client.queue_with(name, tracked()).unwrap();
    fill(&q, 20).await;
    let b = q.take(20, Duration::from_secs(30)).await.unwrap();
    let mut reversed: Vec<_> = b.tasks[..10].to_vec();
    reversed.reverse();
    assert_eq!(q.ack(&reversed).await.unwrap(), all(SettleResult::Done, 10));
    assert_eq!(q.stats().await.unwrap().leased, 10);
    // The whole batch again: the first half was settled, the rest is still held.
    let mut want = all(SettleResult::Stale, 10);
    want.extend(all(SettleResult::Done, 10));
    assert_eq!(q.ack(&b.tasks).await.unwrap(), want);
    let s = q.stats().await.unwrap();
    assert_eq!((s.leased, s.acked_total, s.stale_total), (0, 20, 10));
}

async fn a_retry_in_a_batch_leaves_the_other_acks_applied(client: QueueClient, name: &str) {
    let q = client.queue_with(name, tracked()).unwrap();
    fill(&q, 10).await;
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    let ops = crate::harness::retry_one_ack_rest(&b.tasks, "t004");
    assert_eq!(q.settle(&ops).await.unwrap(), all(SettleResult::Done, 10));
    let again = q.take(10, Duration::from_secs(30)).await.unwrap();
    let got: Vec<_> = again
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.attempt))
        .collect();
    assert_eq!(got, [("t004", 2)]);
    let rec = q.record("t004").await.unwrap().unwrap();
    let states: Vec<_> = rec.history.unwrap().iter().map(|e| e.state).collect();
    assert_eq!(
        states,
        [
            RecordState::Waiting,
            RecordState::Running,
            RecordState::Waiting,
            RecordState::Running
        ]
    );
    let done = q.record("t003").await.unwrap().unwrap();
    assert_eq!(done.state, RecordState::Done);
    assert_eq!(
        q.ack(&again.tasks).await.unwrap(),
        all(SettleResult::Done, 1)
    );
    assert_eq!(q.stats().await.unwrap().leased, 0);
}

async fn an_expired_batch_comes_back_and_its_holder_is_stale(client: QueueClient, name: &str) {
    let q = client.queue_with(name, tracked()).unwrap();
    let ids = fill(&q, 3).await;
    let first = q.take(3, Duration::from_millis(100)).await.unwrap();
    assert_eq!(first.tasks.len(), 3);
    let second = poll_some(
        Duration::from_secs(5),
        "the batch back after its lease",
        || {
            let q = q.clone();
            async move {
                let b = q.take(10, Duration::from_secs(30)).await.unwrap();
                (!b.tasks.is_empty()).then_some(b)
            }
        },
    )
    .await;
    let got: Vec<_> = second
        .tasks
        .iter()
        .map(|t| (t.id.clone(), t.attempt))
        .collect();
    let want: Vec<_> = ids.iter().map(|id| (id.clone(), 2)).collect();
    assert_eq!(
        got, want,
        "back in lease order (here the take order), one attempt counted"
    );
    assert_eq!(
        q.ack(&first.tasks).await.unwrap(),
        all(SettleResult::Stale, 3)
    );
    assert_eq!(
        q.stats().await.unwrap().leased,
        3,
        "the new leases untouched"
    );
    assert_eq!(
        q.ack(&second.tasks).await.unwrap(),
        all(SettleResult::Done, 3)
    );
    let s = q.stats().await.unwrap();
    assert_eq!((s.leased, s.expired_total, s.acked_total), (0, 3, 3));
}

async fn a_released_batch_comes_back_in_take_order_at_the_same_attempt(
    client: QueueClient,
    name: &str,
) {
    let q = client.queue_with(name, tracked()).unwrap();
    let ids = fill(&q, 5).await;
    let b = q.take(5, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        q.release(&b.tasks).await.unwrap(),
        all(SettleResult::Done, 5)
    );
    assert_eq!(q.stats().await.unwrap().leased, 0);
    let again = q.take(5, Duration::from_secs(30)).await.unwrap();
    let got: Vec<_> = again
        .tasks
        .iter()
        .map(|t| (t.id.clone(), t.attempt))
        .collect();
    let want: Vec<_> = ids.iter().map(|id| (id.clone(), 1)).collect();
    assert_eq!(got, want);
    // The released batch's holder can settle nothing more.
    assert_eq!(q.ack(&b.tasks).await.unwrap(), all(SettleResult::Stale, 5));
    assert_eq!(
        q.ack(&again.tasks).await.unwrap(),
        all(SettleResult::Done, 5)
    );
}

async fn a_cancelled_task_of_a_batch_is_stale_for_its_holder(client: QueueClient, name: &str) {
    let q = client.queue_with(name, tracked()).unwrap();
    fill(&q, 4).await;
    let b = q.take(4, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        q.cancel("t002").await.unwrap().unwrap().state,
        TaskState::Leased
    );
    assert_eq!(q.stats().await.unwrap().leased, 3);
    let r = q.ack(&b.tasks).await.unwrap();
    assert_eq!(
        r,
        [
            SettleResult::Done,
            SettleResult::Done,
            SettleResult::Stale,
            SettleResult::Done
        ]
    );
    let rec = q.record("t002").await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Cancelled);
    let s = q.stats().await.unwrap();
    assert_eq!((s.leased, s.acked_total, s.cancelled_total), (0, 3, 1));
}

/// (Such an id is refused at enqueue now; one an older build accepted is written as it was.)
async fn ids_holding_a_separator_are_leased_one_by_one(client: QueueClient, name: &str) {
    let q = client.queue_with(name, tracked()).unwrap();
    for (odd, plain) in [("a\u{1f}b", "c"), ("d\u{1e}e", "f")] {
        q.enqueue(NewTask::new("{}").id("a-b")).await.unwrap();
        crate::hardening_ids::rename_waiting_task(&client, name, ("a-b", odd), None).await;
        q.enqueue(NewTask::new("{}").id(plain)).await.unwrap();
        let b = q.take(2, Duration::from_secs(30)).await.unwrap();
        assert_eq!(b.tasks.len(), 2);
        assert_eq!(q.stats().await.unwrap().leased, 2);
        let info = q.find(odd).await.unwrap().unwrap();
        assert_eq!(info.state, TaskState::Leased, "{odd:?}");
        // One at a time: a batch lease would be split here, into the wrong ids.
        for t in &b.tasks {
            let acked = q.ack(std::slice::from_ref(t)).await.unwrap();
            assert_eq!(acked, [SettleResult::Done], "{:?}", t.id);
        }
        assert_eq!(q.stats().await.unwrap().leased, 0);
    }
}

async fn a_batched_task_shows_running_in_its_record_and_list(client: QueueClient, name: &str) {
    let q = client.queue_with(name, tracked()).unwrap();
    fill(&q, 3).await;
    let w = q.clone().with_worker(Worker {
        host: "h9".into(),
        slot: 4,
    });
    let b = w.take(3, Duration::from_secs(30)).await.unwrap();
    let rec = q.record("t001").await.unwrap().unwrap();
    assert_eq!((rec.state, rec.attempt), (RecordState::Running, 1));
    let last = rec.history.unwrap().last().unwrap().clone();
    assert_eq!(
        (last.state, last.host.as_deref(), last.slot),
        (RecordState::Running, Some("h9"), Some(4))
    );
    let page = q
        .list(&gaffer::queue_client::ListQuery {
            state: Some(RecordState::Running),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.tasks.len(), 3, "{page:?}");
    assert_eq!(w.ack(&b.tasks).await.unwrap(), all(SettleResult::Done, 3));
    let rec = q.record("t001").await.unwrap().unwrap();
    let h: Vec<_> = rec
        .history
        .unwrap()
        .iter()
        .map(|e| (e.state, e.host.clone(), e.slot))
        .collect();
    assert_eq!(
        h,
        [
            (RecordState::Waiting, None, None),
            (RecordState::Running, Some("h9".into()), Some(4)),
            (RecordState::Done, Some("h9".into()), Some(4)),
        ]
    );
}

async fn many_expired_batches_all_come_back_over_bounded_takes(client: QueueClient, name: &str) {
    let q = client.queue_with(name, tracked()).unwrap();
    let ids = fill(&q, 1500).await;
    let mut first = Vec::new();
    for _ in 0..15 {
        let b = q.take(100, Duration::from_millis(100)).await.unwrap();
        assert_eq!(b.tasks.len(), 100);
        first.extend(b.tasks);
    }
    // Once every lease ran out, takes bring the tasks back: each exactly once, at its
    // second attempt, however many batches expired together.
    let mut back: Vec<(String, u32)> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while back.len() < ids.len() && std::time::Instant::now() < deadline {
        let b = q.take(1000, Duration::from_secs(30)).await.unwrap();
        back.extend(b.tasks.iter().map(|t| (t.id.clone(), t.attempt)));
        if !b.tasks.is_empty() {
            assert_eq!(
                q.ack(&b.tasks).await.unwrap(),
                all(SettleResult::Done, b.tasks.len())
            );
        }
    }
    back.sort();
    let mut want: Vec<(String, u32)> = ids.iter().map(|id| (id.clone(), 2)).collect();
    want.sort();
    assert!(back == want, "{} back, {} enqueued", back.len(), want.len());
    assert_eq!(q.ack(&first).await.unwrap(), all(SettleResult::Stale, 1500));
    let s = q.stats().await.unwrap();
    assert_eq!((s.leased, s.expired_total, s.acked_total), (0, 1500, 1500));
}

/// The layout behind the cases above, on one server: a take of first attempts makes one
/// batch lease and no per-task one; its whole ack leaves none of its keys behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_lease_and_its_ack_leaves_no_key() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue_with("layout", tracked()).unwrap();
    fill(&q, 30).await;
    let mut raw = redis.raw().await;
    let key = |k: &str| format!("test:{{layout}}:{k}");
    let b = q.take(30, Duration::from_secs(30)).await.unwrap();
    let zcard = |k: String| redis::cmd("ZCARD").arg(k).clone();
    let per_task: u64 = zcard(key("leased")).query_async(&mut raw).await.unwrap();
    let batches: u64 = zcard(key("leased:b")).query_async(&mut raw).await.unwrap();
    assert_eq!((per_task, batches), (0, 1));
    let run_keys: Vec<String> = redis::cmd("KEYS")
        .arg(key("leased:run:*"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        run_keys.is_empty(),
        "no running entry per task: {run_keys:?}"
    );
    q.ack(&b.tasks).await.unwrap();
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(key("leased*"))
        .query_async(&mut raw)
        .await
        .unwrap();
    let counted: Option<i64> = redis::cmd("GET")
        .arg(key("leased:bn"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        left.iter().all(|k| k == &key("leased:bn")) && counted.unwrap_or(0) == 0,
        "{left:?} {counted:?}"
    );
}

/// Every key of queue `name` (on one server) as `DUMP` returns it.
async fn dump_queue(
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
) -> Vec<(String, Vec<u8>)> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("test:{{{name}}}:*"))
        .query_async(conn)
        .await
        .unwrap();
    let mut out = Vec::new();
    for k in keys {
        let v: Vec<u8> = redis::cmd("DUMP").arg(&k).query_async(conn).await.unwrap();
        out.push((k, v));
    }
    out
}

/// A take Redis acknowledged and then lost (a restart that had not written it, a failover
/// to a replica that had not received it: here the queue's keys put back as they were
/// before it) never hands its lease token to the next taker: the lost take's holder is
/// then stale, not settling the new holder's lease.
#[tokio::test]
async fn a_take_redis_lost_never_gives_its_token_to_the_next_taker() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let name = "lost_take";
    let q = client.queue_with(name, tracked()).unwrap();
    fill(&q, 2).await;
    let before = dump_queue(&mut conn, name).await;
    let lost = q.take(2, Duration::from_secs(30)).await.unwrap();
    assert_eq!(lost.tasks.len(), 2);
    // Redis loses the take: every key of the queue back as it was.
    let now: Vec<String> = redis::cmd("KEYS")
        .arg(format!("test:{{{name}}}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&now)
        .query_async(&mut conn)
        .await
        .unwrap();
    for (k, v) in &before {
        let _: () = redis::cmd("RESTORE")
            .arg(k)
            .arg(0)
            .arg(v)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let again = q.take(2, Duration::from_secs(30)).await.unwrap();
    assert_eq!(again.tasks.len(), 2, "the tasks are back");
    assert_ne!(again.tasks[0].token, lost.tasks[0].token, "a new token");
    let acks = |b: &gaffer::queue_client::Batch| {
        b.tasks
            .iter()
            .map(|t| SettleOp::new(t, Settle::Ack))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        q.settle(&acks(&lost)).await.unwrap(),
        all(SettleResult::Stale, 2),
        "the lost take's holder settles nothing"
    );
    assert_eq!(
        q.settle(&acks(&again)).await.unwrap(),
        all(SettleResult::Done, 2)
    );
}

/// A lease whose task is gone (its payload deleted under it) comes back as nothing and
/// leaves no attempt count behind, which nothing would ever delete.
#[tokio::test]
async fn an_expired_lease_whose_task_is_gone_leaves_no_attempt_count() {
    let redis = TestRedis::start();
    let q = redis.client().await.queue_with("gone", tracked()).unwrap();
    fill(&q, 1).await;
    let mut raw = redis.raw().await;
    // (a batch lease of one: split into its task's lease, then reclaimed, once expired)
    let b = q.take(1, Duration::from_millis(1)).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    let _: () = redis::cmd("HDEL")
        .arg("test:{gone}:payload")
        .arg(&b.tasks[0].id)
        .query_async(&mut raw)
        .await
        .unwrap();
    poll_some(Duration::from_secs(10), "the lease expired", || async {
        let _ = q.take(1, Duration::from_secs(30)).await.unwrap();
        (q.stats().await.unwrap().expired_total == 1).then_some(())
    })
    .await;
    let counted: bool = redis::cmd("HEXISTS")
        .arg("test:{gone}:att")
        .arg(&b.tasks[0].id)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!counted, "an attempt count left behind");
}
