//! The queue contract (README, "Queue semantics in one paragraph"), against a real redis-server and,
//! for the same cases, a real 3-master Redis Cluster.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gaffer::queue_client::{
    LeasedTask, MAX_DELAY, NewTask, QueueClient, QueueError, QueueLimits, Settle, SettleOp,
    SettleResult, TaskState,
};

use crate::harness::{self, TestRedis, eventually, poll_some};

crate::harness::on_both!(
    concurrent_takers_ack_every_task_exactly_once,
    expired_lease_reappears_and_old_token_is_stale,
    priority_first_then_fifo,
    delayed_tasks_are_not_handed_out_early,
    a_take_skips_the_housekeeping_only_while_quiet_and_tasks_are_ready,
    lateness_counts_from_when_each_task_came_due,
    dedup_id_returns_existing_until_acked,
    retry_with_delay_and_priority,
    fail_goes_to_dead_letters_with_reason,
    max_attempts_through_lease_expiry_dead_letters,
    extend_keeps_a_task_invisible,
    idle_taker_wakes_on_enqueue,
    find_and_cancel_by_id,
    oversized_payload_is_refused_and_nothing_enqueued,
    delays_past_the_limit_are_refused_or_clamped,
    bulk_enqueue_keeps_order_and_counts,
    mixed_settle_keeps_result_order,
    leased_tasks_found_by_exact_id,
    settle_take_rejects_a_stale_token_and_takes_the_next_batch,
    settle_take_settles_before_it_takes,
    a_take_that_empties_the_queue_spends_its_wake_ups,
    a_sweep_of_all_dead_letters_takes_only_those_dead_when_it_began,
);

fn limits(max_attempts: u32) -> QueueLimits {
    QueueLimits {
        max_attempts,
        ..Default::default()
    }
}

/// One lease as a taker saw it, on Redis's clock.
#[derive(Debug, Clone)]
struct Lease {
    taker: usize,
    from_ms: i64,
    until_ms: i64,
}

async fn concurrent_takers_ack_every_task_exactly_once(client: QueueClient, name: &str) {
    const TASKS: usize = 20_000;
    const TAKERS: usize = 8;
    let q = client.queue_with(name, limits(0)).unwrap();
    let tasks: Vec<NewTask> = (0..TASKS)
        .map(|i| NewTask::new(format!("{{\"n\":{i}}}")))
        .collect();
    let made = q.enqueue_many(&tasks).await.unwrap();
    assert_eq!(made.iter().filter(|e| e.created).count(), TASKS);

    let leases: Arc<Mutex<HashMap<String, Vec<Lease>>>> = Default::default();
    let acks: Arc<Mutex<HashMap<String, usize>>> = Default::default();
    let mut handles = Vec::new();
    for taker in 0..TAKERS {
        let q = q.clone();
        let leases = leases.clone();
        let acks = acks.clone();
        handles.push(tokio::spawn(async move {
            let mut batches = 0usize;
            loop {
                let batch = q.take(25, Duration::from_millis(250)).await.unwrap();
                if batch.tasks.is_empty() {
                    // Leases that lapsed come back on a later take; stop when none are out.
                    if q.stats().await.unwrap().leased == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                batches += 1;
                {
                    let mut l = leases.lock().unwrap();
                    for t in &batch.tasks {
                        l.entry(t.id.clone()).or_default().push(Lease {
                            taker,
                            from_ms: batch.now_ms,
                            until_ms: batch.expires_ms,
                        });
                    }
                }
                // Now and then an even taker stalls past its lease until another has
                // reclaimed some leased task, so late acks must be refused. The odd takers
                // never stall: they keep taking (and so reclaiming) while anything is
                // leased, which makes the lapse certain rather than a matter of timing.
                if taker % 2 == 0 && batches % 40 == 7 {
                    let expired = q.stats().await.unwrap().expired_total;
                    let deadline = std::time::Instant::now() + Duration::from_secs(20);
                    while q.stats().await.unwrap().expired_total == expired
                        && std::time::Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                let results = q.ack(&batch.tasks).await.unwrap();
                let mut a = acks.lock().unwrap();
                for (t, r) in batch.tasks.iter().zip(results) {
                    if r == SettleResult::Done {
                        *a.entry(t.id.clone()).or_default() += 1;
                    }
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let acks = std::mem::take(&mut *acks.lock().unwrap());
    assert_eq!(acks.len(), TASKS, "every task acked");
    let twice: Vec<_> = acks.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "tasks acked more than once: {twice:?}");
    let leases = std::mem::take(&mut *leases.lock().unwrap());
    for (id, ls) in leases.iter() {
        let mut ls = ls.clone();
        ls.sort_by_key(|l| l.from_ms);
        for w in ls.windows(2) {
            assert!(
                w[1].from_ms >= w[0].until_ms,
                "task {id} handed to taker {} while taker {}'s lease was valid: {w:?}",
                w[1].taker,
                w[0].taker
            );
        }
    }
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased, s.dead), (0, 0, 0));
    assert_eq!(s.acked_total, TASKS as u64);
    assert_eq!(s.enqueued_total, TASKS as u64);
    assert!(s.expired_total > 0, "the stalls made some leases lapse");
}

async fn expired_lease_reappears_and_old_token_is_stale(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits(5)).unwrap();
    q.enqueue(NewTask::new("x").id("t1")).await.unwrap();
    let first = q.take(10, Duration::from_millis(100)).await.unwrap();
    assert_eq!(first.tasks.len(), 1);
    assert_eq!(first.tasks[0].attempt, 1);
    assert!(
        q.take(10, Duration::from_secs(1))
            .await
            .unwrap()
            .tasks
            .is_empty()
    );

    let second = poll_some(Duration::from_secs(5), "task back after its lease", || {
        let q = q.clone();
        async move {
            let b = q.take(10, Duration::from_secs(30)).await.unwrap();
            (!b.tasks.is_empty()).then_some(b)
        }
    })
    .await;
    assert_eq!(second.tasks[0].id, "t1");
    assert_eq!(second.tasks[0].attempt, 2);
    assert_ne!(second.tasks[0].token, first.tasks[0].token);

    // The first holder wakes up late: every kind of settle it tries is refused.
    for action in [
        Settle::Ack,
        Settle::Fail {
            reason: "late".into(),
        },
        Settle::Extend {
            lease: Duration::from_secs(60),
        },
    ] {
        let r = q
            .settle(&[SettleOp::new(&first.tasks[0], action)])
            .await
            .unwrap();
        assert_eq!(r, vec![SettleResult::Stale]);
    }
    let info = q.find("t1").await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Leased);
    assert_eq!(info.lease_token, Some(second.tasks[0].token));
    assert_eq!(info.at_ms, second.expires_ms, "the new lease is untouched");
    assert_eq!(
        info.last_error.as_deref(),
        Some("lease expired on attempt 1")
    );
    let s = q.stats().await.unwrap();
    assert_eq!((s.stale_total, s.expired_total), (3, 1));
    assert_eq!(
        q.ack(&second.tasks).await.unwrap(),
        vec![SettleResult::Done]
    );
    assert!(q.find("t1").await.unwrap().is_none());
}

async fn priority_first_then_fifo(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    let plan = [
        ("a", 0),
        ("b", 5),
        ("c", 0),
        ("d", 5),
        ("e", -3),
        ("f", 10),
        ("g", 0),
    ];
    for (id, p) in plan {
        q.enqueue(NewTask::new(id).id(id).priority(p))
            .await
            .unwrap();
    }
    let mut order = Vec::new();
    for _ in 0..4 {
        let b = q.take(2, Duration::from_secs(30)).await.unwrap();
        order.extend(b.tasks.into_iter().map(|t| t.id));
    }
    assert_eq!(order, ["f", "b", "d", "a", "c", "g", "e"]);
}

/// Redis's clock, ms.
async fn redis_now_ms(client: &QueueClient) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut client.connection())
        .await
        .unwrap();
    s * 1000 + us / 1000
}

/// Waits until delayed task `id` of `q` is due by Redis's clock.
async fn until_due(client: &QueueClient, q: &gaffer::queue_client::Queue, id: &str) {
    let due = q.find(id).await.unwrap().unwrap().at_ms;
    eventually(Duration::from_secs(5), "the delayed task due", || async {
        redis_now_ms(client).await > due
    })
    .await;
}

/// A take's housekeeping (expired records and leases, delayed tasks come due) is skipped
/// only while the last look found nothing to do less than its quiet time ago (K_CONF
/// `quiet`, set here far ahead) *and* tasks are ready: a delayed task come due then stays
/// delayed. A take that finds nothing ready looks anyway, and so does one past the quiet
/// time; a look that found nothing sets the quiet time again.
async fn a_take_skips_the_housekeeping_only_while_quiet_and_tasks_are_ready(
    client: QueueClient,
    name: &str,
) {
    let q = client.queue(name).unwrap();
    let conf = format!("{}:{{{name}}}:conf", client.namespace());
    let quiet = |until: i64| {
        let (client, conf) = (client.clone(), conf.clone());
        async move {
            let _: () = redis::cmd("HSET")
                .arg(&conf)
                .arg("quiet")
                .arg(until)
                .query_async(&mut client.connection())
                .await
                .unwrap();
        }
    };
    let lease = Duration::from_secs(30);
    q.enqueue_many(&[NewTask::new("1").id("a"), NewTask::new("2").id("b")])
        .await
        .unwrap();
    q.enqueue(
        NewTask::new("3")
            .id("later")
            .delay(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    until_due(&client, &q, "later").await;
    // Quiet, tasks ready: the take hands out a, and later stays delayed.
    quiet(redis_now_ms(&client).await + 60_000).await;
    let b = q.take(1, lease).await.unwrap();
    assert_eq!(b.tasks[0].id, "a");
    // (stats count a due task as ready: it is still in the delayed set)
    let still: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("{}:{{{name}}}:delayed", client.namespace()))
        .arg("later")
        .query_async(&mut client.connection())
        .await
        .unwrap();
    assert!(still.is_some(), "the look was skipped");
    // Past the quiet time: the take looks, and later joins the back.
    quiet(0).await;
    let b = q.take(10, lease).await.unwrap();
    let ids: Vec<&str> = b.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["b", "later"]);
    // A look that finds nothing to do sets the quiet time.
    let empty = q.take(10, lease).await.unwrap();
    assert!(empty.tasks.is_empty());
    let set: Option<i64> = redis::cmd("HGET")
        .arg(&conf)
        .arg("quiet")
        .query_async(&mut client.connection())
        .await
        .unwrap();
    assert!(
        set.is_some_and(|t| t > empty.now_ms),
        "a look that found nothing to do: {set:?}"
    );
    // Quiet, nothing ready: the take looks anyway.
    q.enqueue(
        NewTask::new("4")
            .id("late2")
            .delay(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    until_due(&client, &q, "late2").await;
    quiet(redis_now_ms(&client).await + 60_000).await;
    let b = q.take(10, lease).await.unwrap();
    let ids: Vec<&str> = b.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["late2"]);
}

async fn delayed_tasks_are_not_handed_out_early(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    q.enqueue(
        NewTask::new("later")
            .id("later")
            .delay(Duration::from_millis(400)),
    )
    .await
    .unwrap();
    q.enqueue(NewTask::new("now").id("now")).await.unwrap();
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        b.tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["now"]
    );
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.delayed, s.leased), (0, 1, 1));
    let empty = q.take(10, Duration::from_secs(30)).await.unwrap();
    let hint = empty.next_hint.expect("a hint for the delayed task");
    assert!(hint <= Duration::from_millis(400), "{hint:?}");
    let enqueued = q.find("later").await.unwrap().unwrap().enqueued_ms;
    let got = poll_some(Duration::from_secs(5), "delayed task due", || {
        let q = q.clone();
        async move {
            let b = q.take(10, Duration::from_secs(30)).await.unwrap();
            (!b.tasks.is_empty()).then_some(b)
        }
    })
    .await;
    assert_eq!(got.tasks[0].id, "later");
    assert!(
        got.now_ms - enqueued >= 400,
        "handed out {} ms after enqueue",
        got.now_ms - enqueued
    );
}

async fn dedup_id_returns_existing_until_acked(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    let first = q.enqueue(NewTask::new("v1").id("job-7")).await.unwrap();
    assert!(first.created);
    let again = q.enqueue(NewTask::new("v2").id("job-7")).await.unwrap();
    assert_eq!((again.id.as_str(), again.created), ("job-7", false));
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    assert_eq!(b.tasks[0].payload, b"v1", "the existing task, not a copy");
    let leased = q.enqueue(NewTask::new("v3").id("job-7")).await.unwrap();
    assert!(!leased.created, "a leased task blocks its id too");
    q.ack(&b.tasks).await.unwrap();
    let fresh = q.enqueue(NewTask::new("v4").id("job-7")).await.unwrap();
    assert!(fresh.created, "free again once acked");
    // Within one bulk call, the first of two equal ids wins.
    let bulk = q
        .enqueue_many(&[NewTask::new("x").id("dup"), NewTask::new("y").id("dup")])
        .await
        .unwrap();
    assert_eq!(
        bulk.iter().map(|e| e.created).collect::<Vec<_>>(),
        [true, false]
    );
    assert_eq!(q.stats().await.unwrap().ready, 2);
}

async fn retry_with_delay_and_priority(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    q.enqueue(NewTask::new("r").id("r")).await.unwrap();
    q.enqueue(NewTask::new("other").id("other").priority(5))
        .await
        .unwrap();
    let b = q.take(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks[0].id, "other");
    let b2 = q.take(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b2.tasks[0].id, "r");
    let r = q
        .settle(&[SettleOp::new(
            &b2.tasks[0],
            Settle::Retry {
                delay: Duration::from_millis(300),
                priority: Some(9),
                reason: "partner busy".into(),
            },
        )])
        .await
        .unwrap();
    assert_eq!(r, vec![SettleResult::Done]);
    let info = q.find("r").await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Delayed);
    assert_eq!(info.priority, 9);
    assert_eq!(info.last_error.as_deref(), Some("partner busy"));
    assert!(
        q.take(1, Duration::from_secs(30))
            .await
            .unwrap()
            .tasks
            .is_empty()
    );
    q.enqueue(NewTask::new("low").id("low").priority(1))
        .await
        .unwrap();
    // Once due, its new priority puts it ahead of the newer, lower-priority task.
    let seen: Vec<(String, u32)> = poll_some(Duration::from_secs(5), "retried task due", || {
        let q = q.clone();
        async move {
            let info = q.find("r").await.unwrap().unwrap();
            if info.state != TaskState::Ready {
                return None;
            }
            let b = q.take(2, Duration::from_secs(30)).await.unwrap();
            Some(b.tasks.iter().map(|t| (t.id.clone(), t.attempt)).collect())
        }
    })
    .await;
    assert_eq!(seen, [("r".to_string(), 2), ("low".to_string(), 1)]);
    assert_eq!(q.stats().await.unwrap().retried_total, 1);
}

/// The ids of `q`'s first 100 dead letters, oldest first.
async fn dead_ids(q: &gaffer::queue_client::Queue) -> Vec<String> {
    q.dead(0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect()
}

/// `n` dead letters in `q`, ids `PREFIX0`…, each failed with `reason(id)`.
async fn dead_letters(
    q: &gaffer::queue_client::Queue,
    prefix: &str,
    n: usize,
    reason: impl Fn(&str) -> String,
) {
    for i in 0..n {
        q.enqueue(NewTask::new(format!("p{i}")).id(format!("{prefix}{i}")))
            .await
            .unwrap();
    }
    let b = q.take(n, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), n);
    harness::fail_all(q, &b.tasks, reason).await;
}

async fn fail_goes_to_dead_letters_with_reason(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    dead_letters(&q, "f", 3, |id| format!("bad input in {id}")).await;
    let dead = q.dead(0, 10).await.unwrap();
    assert_eq!(dead.len(), 3);
    assert_eq!(dead[0].error, format!("bad input in {}", dead[0].id));
    assert_eq!(dead[0].attempts, 1);
    let s = q.stats().await.unwrap();
    assert_eq!((s.dead, s.dead_total, s.leased), (3, 3, 0));

    assert_eq!(q.requeue_dead(Some(&["f1".to_string()])).await.unwrap(), 1);
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    assert_eq!((b.tasks[0].id.as_str(), b.tasks[0].attempt), ("f1", 1));
    assert_eq!(q.purge_dead(None).await.unwrap(), 2);
    let s = q.stats().await.unwrap();
    assert_eq!((s.dead, s.requeued_total, s.purged_total), (0, 1, 2));
    assert!(q.find("f0").await.unwrap().is_none());
}

/// `requeue` and `purge` of all dead letters take those dead when they began, not those
/// that die while they run: a handler that fails at once would feed a requeue for ever
/// (each task back with its attempts reset), and a purge would delete dead letters no one
/// had seen. One dead letter here dies "later" (its death moved a minute ahead).
async fn a_sweep_of_all_dead_letters_takes_only_those_dead_when_it_began(
    client: QueueClient,
    name: &str,
) {
    let q = client.queue(name).unwrap();
    dead_letters(&q, "d", 4, |_| "bad".to_string()).await;
    let later = |id: &'static str| {
        let mut conn = client.connection();
        let key = format!("test:{{{name}}}:dead");
        async move {
            let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
            let n: u64 = redis::cmd("ZADD")
                .arg(&key)
                .arg("XX")
                .arg("CH")
                .arg((secs + 60) * 1000)
                .arg(id)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(n, 1, "{id} is a dead letter");
        }
    };
    later("d3").await;
    assert_eq!(q.requeue_dead(None).await.unwrap(), 3);
    assert_eq!(dead_ids(&q).await, ["d3"]);
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    harness::fail_all(&q, &b.tasks, |_| "bad again".to_string()).await;
    later("d0").await;
    assert_eq!(
        q.purge_dead(None).await.unwrap(),
        2,
        "d1 and d2, not d0 or d3"
    );
    let mut dead = dead_ids(&q).await;
    dead.sort();
    assert_eq!(dead, ["d0", "d3"]);
}

async fn max_attempts_through_lease_expiry_dead_letters(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits(2)).unwrap();
    q.enqueue(NewTask::new("p").id("m")).await.unwrap();
    let lease = Duration::from_millis(50);
    assert_eq!(q.take(1, lease).await.unwrap().tasks[0].attempt, 1);
    eventually(Duration::from_secs(5), "second attempt", || {
        let q = q.clone();
        async move { !q.take(1, lease).await.unwrap().tasks.is_empty() }
    })
    .await;
    eventually(
        Duration::from_secs(5),
        "dead after the second lease expired",
        || {
            let q = q.clone();
            async move {
                assert!(
                    q.take(1, lease).await.unwrap().tasks.is_empty(),
                    "no third attempt"
                );
                q.stats().await.unwrap().dead == 1
            }
        },
    )
    .await;
    let dead = q.dead(0, 10).await.unwrap();
    assert_eq!(dead[0].id, "m");
    assert_eq!(dead[0].attempts, 2);
    assert_eq!(
        dead[0].error,
        "lease expired on attempt 2 of 2 (max_attempts reached)"
    );
    // A retry past max_attempts dead-letters too, and says so.
    let q2 = client
        .queue_with(&format!("{name}_retry"), limits(1))
        .unwrap();
    q2.enqueue(NewTask::new("p").id("n")).await.unwrap();
    let b = q2.take(1, Duration::from_secs(30)).await.unwrap();
    let r = q2
        .settle(&[SettleOp::new(
            &b.tasks[0],
            Settle::Retry {
                delay: Duration::ZERO,
                priority: None,
                reason: "timeout".into(),
            },
        )])
        .await
        .unwrap();
    assert_eq!(r, vec![SettleResult::DeadLettered]);
    assert_eq!(
        q2.dead(0, 1).await.unwrap()[0].error,
        "attempt 1 of 1 failed (max_attempts reached): timeout"
    );
}

async fn extend_keeps_a_task_invisible(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    q.enqueue(NewTask::new("long").id("e")).await.unwrap();
    let b = q.take(1, Duration::from_millis(300)).await.unwrap();
    let original_expiry = b.expires_ms;
    let r = q.extend(&b.tasks, Duration::from_secs(30)).await.unwrap();
    assert_eq!(r, vec![SettleResult::Done]);
    // Wait on Redis's clock until the original lease is well past.
    eventually(Duration::from_secs(5), "original lease over", || {
        let q = q.clone();
        async move {
            let b = q.take(1, Duration::from_secs(30)).await.unwrap();
            assert!(
                b.tasks.is_empty(),
                "handed out while its extended lease was valid"
            );
            b.now_ms > original_expiry + 200
        }
    })
    .await;
    assert_eq!(q.ack(&b.tasks).await.unwrap(), vec![SettleResult::Done]);
    assert_eq!(q.stats().await.unwrap().expired_total, 0);
}

async fn idle_taker_wakes_on_enqueue(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    let mut waiter = client.waiter();
    let poll = Duration::from_secs(20);
    let taker = {
        let q = q.clone();
        tokio::spawn(async move {
            let b = q
                .take_wait(&mut waiter, 10, Duration::from_secs(30), poll)
                .await
                .unwrap();
            (b, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!taker.is_finished(), "returned without a task");
    let sent = Instant::now();
    q.enqueue(NewTask::new("wake").id("w")).await.unwrap();
    let (batch, woke) = taker.await.unwrap();
    assert_eq!(batch.tasks[0].id, "w");
    assert!(
        woke - sent < poll / 4,
        "woke after {:?}, not long before its poll timeout of {poll:?}",
        woke - sent
    );
}

/// Wake-ups pushed for tasks that are all taken are spent: left listed, each would send an
/// idle taker on an empty take (a queue fed a batch at a time paid one per task).
async fn a_take_that_empties_the_queue_spends_its_wake_ups(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    let mut waiter = client.waiter();
    let tasks: Vec<NewTask> = (0..30).map(|i| NewTask::new(format!("{i}"))).collect();
    q.enqueue_many(&tasks).await.unwrap();
    let lease = Duration::from_secs(30);
    assert_eq!(q.take(10, lease).await.unwrap().tasks.len(), 10);
    // Tasks still wait: their wake-ups stay for idle takers.
    let short = Duration::from_millis(300);
    assert!(
        q.wait(&mut waiter, short).await.unwrap(),
        "woken while tasks wait"
    );
    assert_eq!(q.take(100, lease).await.unwrap().tasks.len(), 20);
    assert!(
        !q.wait(&mut waiter, short).await.unwrap(),
        "an idle taker woken with nothing ready"
    );
}

async fn find_and_cancel_by_id(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    q.enqueue(NewTask::new("{\"a\":1}").id("c1").priority(3))
        .await
        .unwrap();
    q.enqueue(NewTask::new("b").id("c2").delay(Duration::from_secs(60)))
        .await
        .unwrap();
    q.enqueue(NewTask::new("c").id("c3")).await.unwrap();
    let info = q.find("c1").await.unwrap().unwrap();
    assert_eq!(
        (info.state, info.priority, info.attempts),
        (TaskState::Ready, 3, 0)
    );
    assert_eq!(info.payload, b"{\"a\":1}");
    assert_eq!(
        q.find("c2").await.unwrap().unwrap().state,
        TaskState::Delayed
    );
    assert!(q.find("nope").await.unwrap().is_none());

    assert_eq!(
        q.cancel("c2").await.unwrap().unwrap().state,
        TaskState::Delayed
    );
    assert_eq!(
        q.cancel("c1").await.unwrap().unwrap().state,
        TaskState::Ready
    );
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 1, "cancelled tasks are never handed out");
    assert_eq!(
        q.cancel("c3").await.unwrap().unwrap().state,
        TaskState::Leased
    );
    assert_eq!(q.ack(&b.tasks).await.unwrap(), vec![SettleResult::Stale]);
    let s = q.stats().await.unwrap();
    assert_eq!(
        (s.ready, s.delayed, s.leased, s.cancelled_total),
        (0, 0, 0, 3)
    );
}

async fn oversized_payload_is_refused_and_nothing_enqueued(client: QueueClient, name: &str) {
    let q = client
        .queue_with(
            name,
            QueueLimits {
                max_payload: 1024,
                max_attempts: 5,
                ..Default::default()
            },
        )
        .unwrap();
    let batch = vec![NewTask::new(vec![b'x'; 10]), NewTask::new(vec![b'x'; 2000])];
    let err = q.enqueue_many(&batch).await.unwrap_err();
    assert!(matches!(
        err,
        QueueError::PayloadTooLarge {
            size: 2000,
            limit: 1024,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        format!("payload of 2000 bytes exceeds the limit of 1024 bytes of queue {name}")
    );
    assert_eq!(q.stats().await.unwrap().enqueued_total, 0);
    let reserved = q.enqueue(NewTask::new("x").id("#1")).await.unwrap_err();
    assert!(reserved.to_string().contains("reserved"), "{reserved}");
    assert!(q.take(0, Duration::from_secs(1)).await.is_err());
}

async fn delays_past_the_limit_are_refused_or_clamped(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    let day = Duration::from_secs(86_400);
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let far = q
        .enqueue(NewTask::new("x").id("far").delay(400 * day))
        .await
        .unwrap_err();
    assert_eq!(
        far.to_string(),
        "task due in 400.0 days exceeds the limit of 366 days"
    );
    let at = std::time::SystemTime::now() + 1000 * day;
    let far_at = q
        .enqueue(NewTask::new("x").id("far-at").at(at))
        .await
        .unwrap_err();
    assert!(
        far_at.to_string().contains("exceeds the limit of 366 days"),
        "{far_at}"
    );
    assert!(q.find("far").await.unwrap().is_none());
    assert!(q.find("far-at").await.unwrap().is_none());
    assert_eq!(q.stats().await.unwrap().enqueued_total, 0);
    // A year is within it.
    q.enqueue(NewTask::new("x").id("year").delay(365 * day))
        .await
        .unwrap();
    let info = q.find("year").await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Delayed);
    assert!(info.at_ms > now_ms() + 364 * 86_400_000, "{info:?}");
    // A handler's retry is clamped rather than refused: refusing would strand the lease.
    q.enqueue(NewTask::new("r").id("r")).await.unwrap();
    let b = q.take(1, Duration::from_secs(30)).await.unwrap();
    let before = now_ms();
    let r = q
        .settle(&[SettleOp::new(
            &b.tasks[0],
            Settle::Retry {
                delay: Duration::MAX,
                priority: None,
                reason: "see you never".into(),
            },
        )])
        .await
        .unwrap();
    assert_eq!(r, vec![SettleResult::Done]);
    let info = q.find("r").await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Delayed);
    let limit_ms = MAX_DELAY.as_millis() as i64;
    assert!(
        info.at_ms >= before + limit_ms && info.at_ms <= now_ms() + limit_ms,
        "due {} ms from now",
        info.at_ms - before
    );
}

async fn bulk_enqueue_keeps_order_and_counts(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    // More than one script chunk, so chunks are pipelined.
    let tasks: Vec<NewTask> = (0..2500).map(|i| NewTask::new(i.to_string())).collect();
    let made = q.enqueue_many(&tasks).await.unwrap();
    assert_eq!(made.len(), 2500);
    let mut seen = Vec::new();
    loop {
        let b = q.take(1000, Duration::from_secs(30)).await.unwrap();
        if b.tasks.is_empty() {
            break;
        }
        seen.extend(
            b.tasks
                .iter()
                .map(|t| String::from_utf8(t.payload.clone()).unwrap()),
        );
        q.ack(&b.tasks).await.unwrap();
    }
    assert_eq!(seen.len(), 2500);
    let out_of_order = seen.iter().enumerate().find(|(i, p)| **p != i.to_string());
    assert_eq!(
        out_of_order, None,
        "FIFO across chunks: first task out of place"
    );

    // Generated and given ids in one call go in separate script calls, still in order.
    let mixed = [
        NewTask::new("g1"),
        NewTask::new("i1").id("given"),
        NewTask::new("g2"),
    ];
    let made = q.enqueue_many(&mixed).await.unwrap();
    assert_eq!(made[1].id, "given");
    assert!(made[0].id.starts_with("~g") && made[2].id.starts_with("~g"));
    assert_ne!(made[0].id, made[2].id);
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    let order: Vec<_> = b.tasks.iter().map(|t| t.id.clone()).collect();
    assert_eq!(order, made.iter().map(|e| e.id.clone()).collect::<Vec<_>>());
}

async fn leased_tasks_found_by_exact_id(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    // Ids that a careless glob or a split on ':' would confuse with each other.
    let ids = ["a:b", "b", "x*", "x[1]?", "\\y"];
    for id in ids {
        q.enqueue(NewTask::new(id).id(id)).await.unwrap();
    }
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), ids.len());
    for t in &b.tasks {
        let info = q.find(&t.id).await.unwrap().unwrap();
        assert_eq!(info.state, TaskState::Leased, "{}", t.id);
        assert_eq!(info.lease_token, Some(t.token));
        assert_eq!(info.attempts, 1);
    }
    assert_eq!(
        q.cancel("b").await.unwrap().unwrap().state,
        TaskState::Leased
    );
    assert_eq!(
        q.cancel("x*").await.unwrap().unwrap().state,
        TaskState::Leased
    );
    let results = q.ack(&b.tasks).await.unwrap();
    let acked: Vec<_> = b
        .tasks
        .iter()
        .zip(results)
        .filter(|(_, r)| *r == SettleResult::Done)
        .map(|(t, _)| t.id.as_str())
        .collect();
    assert_eq!(
        acked,
        ["a:b", "x[1]?", "\\y"],
        "only the cancelled ones are stale"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_taker_does_not_poll() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = harness::queue(&client, "idle");
    let mut waiter = client.waiter();
    let taker = tokio::spawn(async move {
        q.take_wait(
            &mut waiter,
            10,
            Duration::from_secs(30),
            Duration::from_secs(5),
        )
        .await
        .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = redis.commands_processed().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = redis.commands_processed().await;
    // The INFO call itself counts as one command.
    assert!(
        after - before <= 2,
        "{} commands during an idle second",
        after - before
    );
    assert!(!taker.is_finished());
    taker.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_enqueues_survive_sigkill_with_aof() {
    let mut redis = TestRedis::with_aof();
    let client = redis.client().await;
    let q = client.queue("durable").unwrap();
    let tasks: Vec<NewTask> = (0..500)
        .map(|i| NewTask::new(format!("{i}")).id(format!("d{i}")))
        .collect();
    q.enqueue_many(&tasks).await.unwrap();
    let taken = q.take(10, Duration::from_secs(60)).await.unwrap();
    q.ack(&taken.tasks[..5]).await.unwrap();

    redis.server.kill();
    // While Redis is down calls fail, promptly, without panicking.
    for _ in 0..3 {
        let started = Instant::now();
        let err = q.stats().await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "a call hung while redis was down"
        );
    }
    redis.server.restart().unwrap();
    let s = poll_some(
        Duration::from_secs(20),
        "calls succeed after restart",
        || {
            let q = q.clone();
            async move { q.stats().await.ok() }
        },
    )
    .await;
    assert_eq!((s.ready, s.leased, s.acked_total), (490, 5, 5));
    for i in 0..500 {
        let found = q.find(&format!("d{i}")).await.unwrap();
        assert_eq!(found.is_some(), i >= 5, "task d{i}");
    }
    // The old leases still hold their tokens; the holder can finish its batch.
    assert!(
        q.ack(&taken.tasks[5..])
            .await
            .unwrap()
            .iter()
            .all(|r| *r == SettleResult::Done)
    );
}

async fn mixed_settle_keeps_result_order(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    for id in ["m1", "m2", "m3", "m4"] {
        q.enqueue(NewTask::new(id).id(id)).await.unwrap();
    }
    let b = q.take(4, Duration::from_secs(30)).await.unwrap();
    let t = |id: &str| b.tasks.iter().find(|t| t.id == id).unwrap().clone();
    let mut forged = t("m4");
    forged.token += 1000;
    let ops = vec![
        SettleOp::new(
            &t("m1"),
            Settle::Fail {
                reason: "no".into(),
            },
        ),
        SettleOp::new(&t("m2"), Settle::Ack),
        SettleOp::new(&forged, Settle::Ack),
        SettleOp::new(
            &t("m3"),
            Settle::Retry {
                delay: Duration::ZERO,
                priority: None,
                reason: String::new(),
            },
        ),
        SettleOp::new(
            &t("m4"),
            Settle::Extend {
                lease: Duration::from_secs(60),
            },
        ),
        SettleOp::new(
            &t("m2"),
            Settle::Fail {
                reason: "twice".into(),
            },
        ),
    ];
    let r = q.settle(&ops).await.unwrap();
    use SettleResult::*;
    assert_eq!(r, [Done, Done, Stale, Done, Done, Stale]);
    assert_eq!(q.find("m1").await.unwrap().unwrap().state, TaskState::Dead);
    assert!(q.find("m2").await.unwrap().is_none());
    assert_eq!(q.find("m3").await.unwrap().unwrap().state, TaskState::Ready);
    assert_eq!(
        q.find("m4").await.unwrap().unwrap().state,
        TaskState::Leased
    );
    assert_eq!(q.stats().await.unwrap().stale_total, 2);
}

/// The combined call of a slot's steady state fences its settle exactly as a settle alone
/// does: the late holder's ack is refused, the new lease untouched, and the take half still
/// hands out the next batch.
async fn settle_take_rejects_a_stale_token_and_takes_the_next_batch(
    client: QueueClient,
    name: &str,
) {
    let q = client.queue_with(name, limits(5)).unwrap();
    q.enqueue(NewTask::new("x").id("t1")).await.unwrap();
    let first = q.take(10, Duration::from_millis(100)).await.unwrap();
    assert_eq!(first.tasks.len(), 1);
    let second = poll_some(Duration::from_secs(5), "task back after its lease", || {
        let q = q.clone();
        async move {
            let b = q.take(10, Duration::from_secs(30)).await.unwrap();
            (!b.tasks.is_empty()).then_some(b)
        }
    })
    .await;
    assert_ne!(second.tasks[0].token, first.tasks[0].token);
    q.enqueue_many(&[NewTask::new("y").id("t2"), NewTask::new("z").id("t3")])
        .await
        .unwrap();

    let (results, next) = q
        .settle_take(
            &[SettleOp::new(&first.tasks[0], Settle::Ack)],
            10,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(results, vec![SettleResult::Stale]);
    let ids: Vec<&str> = next.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["t2", "t3"], "the take half hands out the next batch");
    assert!(next.tasks.iter().all(|t| t.attempt == 1));
    assert_ne!(next.tasks[0].token, second.tasks[0].token);

    let info = q.find("t1").await.unwrap().unwrap();
    assert_eq!(info.state, TaskState::Leased);
    assert_eq!(info.lease_token, Some(second.tasks[0].token));
    assert_eq!(info.at_ms, second.expires_ms, "the new lease is untouched");
    assert_eq!(q.stats().await.unwrap().stale_total, 1);

    // The current holders settle through the same call; nothing is left to take.
    let mut ops: Vec<SettleOp> = next
        .tasks
        .iter()
        .map(|t| SettleOp::new(t, Settle::Ack))
        .collect();
    ops.push(SettleOp::new(&second.tasks[0], Settle::Ack));
    let (results, empty) = q
        .settle_take(&ops, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(results, vec![SettleResult::Done; 3]);
    assert!(empty.tasks.is_empty());
    let s = q.stats().await.unwrap();
    assert_eq!((s.acked_total, s.leased, s.ready), (3, 0, 0));
}

/// The settle half runs first: a task retried without delay is ready again for the take
/// half of the same call, as its next attempt.
async fn settle_take_settles_before_it_takes(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits(5)).unwrap();
    q.enqueue(NewTask::new("x").id("again")).await.unwrap();
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    let retry = Settle::Retry {
        delay: Duration::ZERO,
        priority: None,
        reason: "once more".into(),
    };
    let (results, next) = q
        .settle_take(
            &[SettleOp::new(&b.tasks[0], retry)],
            10,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(results, vec![SettleResult::Done]);
    assert_eq!(next.tasks.len(), 1);
    assert_eq!(next.tasks[0].id, "again");
    assert_eq!(next.tasks[0].attempt, 2);
    assert!(matches!(
        q.settle_take(&[], 10, Duration::from_secs(30)).await,
        Err(QueueError::Invalid(_))
    ));
}

/// A queue its takers keep nearly empty still holds its tasks in a hash table (the hash's
/// pinned field, `lua/lib/tasks.lua`), not a listpack whose every lookup scans the hash; the
/// pin is no task: an empty id finds nothing, and the counts ignore it. A task's meta is in
/// its one field: no meta hash is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nearly_empty_queue_keeps_its_hashes_as_hash_tables() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue_with("pin", QueueLimits::default()).unwrap();
    let mut raw = redis.raw().await;
    for round in 0..3 {
        let tasks: Vec<NewTask> = (0..10)
            .map(|i| NewTask::new("{}").id(format!("r{round}t{i}")))
            .collect();
        q.enqueue_many(&tasks).await.unwrap();
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg("test:{pin}:payload")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(encoding, "hashtable", "after round {round}");
        assert!(
            !exists(&mut raw, "test:{pin}:meta").await,
            "no meta hash after round {round}"
        );
        let s = q.stats().await.unwrap();
        assert_eq!((s.ready, s.leased), (10, 0), "round {round}");
        let b = q.take(10, Duration::from_secs(30)).await.unwrap();
        assert_eq!(b.tasks.len(), 10);
        assert!(b.tasks.iter().all(|t| t.payload == b"{}"));
        q.ack(&b.tasks).await.unwrap();
    }
    assert!(q.find("").await.unwrap().is_none());
    assert!(q.cancel("").await.unwrap().is_none());
    assert_eq!(
        q.freeze("", "x").await.unwrap(),
        gaffer::queue_client::FreezeResult::Unknown
    );
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 30));
}

/// Tasks written by a gaffer before a task's meta moved into its payload's field (a bare
/// payload, the meta in a hash of its own, pinned) are refused until `migrate_step` has
/// moved them (`gaffer migrate`), then found, taken, retried at a new priority and acked
/// like the rest, side by side with new ones; the meta hash is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_the_layout_before_run_beside_new_ones() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue_with("old", QueueLimits::default()).unwrap();
    let mut raw = redis.raw().await;
    // As the older gaffer left them: two ready tasks at priority 0, max_attempts 4.
    let pin = "-".repeat(80);
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg("test:{old}:payload")
        .arg(&["o1", "old one", "o2", "old two", "", &pin])
        .cmd("HSET")
        .arg("test:{old}:meta")
        .arg(&["o1", "0:4:1000", "o2", "0:4:2000", "", &pin])
        .cmd("RPUSH")
        .arg("test:{old}:ready:0")
        .arg(&["o1", "o2"])
        .cmd("ZADD")
        .arg("test:{old}:ready")
        .arg(0)
        .arg(0)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(matches!(
        q.enqueue(NewTask::new("new one").id("n1")).await,
        Err(gaffer::queue_client::QueueError::Layout { found: 1, .. })
    ));
    while q.migrate_step(1).await.unwrap() != gaffer::queue_client::MigrateStep::Done {}
    assert!(
        !exists(&mut raw, "test:{old}:meta").await,
        "the meta hash is gone"
    );
    q.enqueue(NewTask::new("new one").id("n1")).await.unwrap();
    let old = q.find("o2").await.unwrap().unwrap();
    assert_eq!(
        (old.payload.as_slice(), old.max_attempts, old.enqueued_ms),
        (&b"old two"[..], 4, 2000)
    );
    let new = q.find("n1").await.unwrap().unwrap();
    assert_eq!(new.payload, b"new one");

    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    let got: Vec<(&str, &[u8])> = b
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.payload.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            ("o1", &b"old one"[..]),
            ("o2", &b"old two"[..]),
            ("n1", &b"new one"[..])
        ]
    );
    // o2 and n1 come back at priority 5, ahead of a new task at 0.
    let again = |t: &LeasedTask| {
        SettleOp::new(
            t,
            Settle::Retry {
                delay: Duration::ZERO,
                priority: Some(5),
                reason: "again".into(),
            },
        )
    };
    let r = q
        .settle(&[
            SettleOp::new(&b.tasks[0], Settle::Ack),
            again(&b.tasks[1]),
            again(&b.tasks[2]),
        ])
        .await
        .unwrap();
    assert_eq!(r, vec![SettleResult::Done; 3]);
    q.enqueue(NewTask::new("later").id("n2")).await.unwrap();
    let (o2, n1) = (
        q.find("o2").await.unwrap().unwrap(),
        q.find("n1").await.unwrap().unwrap(),
    );
    assert_eq!((o2.priority, o2.max_attempts, o2.enqueued_ms), (5, 4, 2000));
    assert_eq!((n1.priority, n1.payload.as_slice()), (5, &b"new one"[..]));

    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    let got: Vec<(&str, u32, &[u8])> = b
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.attempt, t.payload.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            ("o2", 2, &b"old two"[..]),
            ("n1", 2, &b"new one"[..]),
            ("n2", 1, &b"later"[..])
        ]
    );
    q.ack(&b.tasks).await.unwrap();
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 4));
}

/// Whether `key` exists on the server.
async fn exists(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(raw)
        .await
        .unwrap()
        == 1
}

/// The queue's Lua is one library of functions, loaded by the first call that finds it
/// missing (here a server never used, then one whose functions were flushed, as a restart
/// without persistence leaves it): the call goes on, and nothing is lost. A function that
/// only reads is flagged so (`no-writes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_function_library_is_loaded_by_the_call_that_finds_it_missing() {
    let redis = TestRedis::start();
    let mut raw = redis.raw().await;
    let q = redis.client().await.queue("lib").unwrap();
    q.enqueue(NewTask::new("one").id("a")).await.unwrap();
    let libraries = function_list(&mut raw).await;
    assert_eq!(libraries.len(), 1, "{libraries:?}");
    let (name, functions) = &libraries[0];
    assert!(name.starts_with("gaffer_"), "{name}");
    let flags = |f: &str| {
        functions
            .iter()
            .find(|(n, _)| n.starts_with(&format!("gaffer_{f}_")))
            .map(|(_, flags)| flags.clone())
    };
    assert_eq!(flags("take"), Some(vec![]));
    assert_eq!(flags("stats"), Some(vec!["no-writes".to_string()]));
    assert_eq!(flags("migrate_forms"), Some(vec![]));

    let () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    q.enqueue(NewTask::new("two").id("b")).await.unwrap();
    assert_eq!(q.stats().await.unwrap().ready, 2);
    assert_eq!(function_list(&mut raw).await.len(), 1);
}

/// `FUNCTION LIST`: each library's name and its functions' names and flags.
async fn function_list(
    raw: &mut redis::aio::MultiplexedConnection,
) -> Vec<(String, Vec<(String, Vec<String>)>)> {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("not text: {other:?}"),
    };
    // (RESP2: each library and each function is a flat list of field and value)
    let field = |v: &Value, name: &str| -> Value {
        let Value::Array(items) = v else {
            panic!("not a list: {v:?}")
        };
        let is_name = |i: &Value| matches!(i, Value::BulkString(b) if b == name.as_bytes());
        let at = items.iter().position(is_name).unwrap();
        items[at + 1].clone()
    };
    let list = |v: Value| match v {
        Value::Array(items) | Value::Set(items) => items,
        other => panic!("not a list: {other:?}"),
    };
    let libraries: Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(raw)
        .await
        .unwrap();
    list(libraries)
        .iter()
        .map(|lib| {
            let functions = list(field(lib, "functions"))
                .iter()
                .map(|f| {
                    let flags = list(field(f, "flags")).iter().map(text).collect();
                    (text(&field(f, "name")), flags)
                })
                .collect();
            (text(&field(lib, "library_name")), functions)
        })
        .collect()
}

/// The queue's lateness (`oldest_due_age_ms`) after waiting `at_least` ms, by its stats.
async fn lateness_past(q: &gaffer::queue_client::Queue, at_least: u64) -> u64 {
    poll_some(Duration::from_secs(10), "the lateness to grow", || async {
        let s = q.stats().await.unwrap();
        (s.oldest_due_age_ms >= at_least).then_some(s.oldest_due_age_ms)
    })
    .await
}

async fn lateness_counts_from_when_each_task_came_due(client: QueueClient, name: &str) {
    let q = client.queue(name).unwrap();
    let due_key = format!("{}:{{{name}}}:ready:due", client.namespace());
    let dues_kept = || async {
        let n: i64 = redis::cmd("EXISTS")
            .arg(&due_key)
            .query_async(&mut client.connection())
            .await
            .unwrap();
        n == 1
    };
    // Nothing waits: not late at all.
    assert_eq!(q.stats().await.unwrap().oldest_due_age_ms, 0);

    // A task enqueued now counts from its enqueue.
    let enqueued = Instant::now();
    q.enqueue(NewTask::new("a").id("a")).await.unwrap();
    let late = lateness_past(&q, 300).await;
    assert!(late <= enqueued.elapsed().as_millis() as u64 + 50, "{late}");

    // One enqueued with a delay is not late before its time, and counts from its due time
    // after: while it sits in `delayed` and once a take moved it to its list.
    let b_enqueued = Instant::now();
    q.enqueue(
        NewTask::new("b")
            .id("b")
            .delay(Duration::from_millis(800))
            .priority(5),
    )
    .await
    .unwrap();
    // (a's age still dominates; b's own shows once a is gone)
    let first = q.take(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(first.tasks[0].id, "a");
    let s = q.stats().await.unwrap();
    if b_enqueued.elapsed() < Duration::from_millis(700) {
        assert_eq!((s.delayed, s.oldest_due_age_ms), (1, 0), "{s:?}");
    }
    let late = lateness_past(&q, 200).await;
    assert!(
        late + 700 <= b_enqueued.elapsed().as_millis() as u64,
        "b counts from its due time, not its enqueue: {late}"
    );
    q.reclaim().await.unwrap();
    assert!(dues_kept().await, "a moved task keeps its due time");
    let late = lateness_past(&q, 400).await;
    assert!(
        late + 700 <= b_enqueued.elapsed().as_millis() as u64,
        "b still counts from its due time once ready: {late}"
    );

    // b taken and acked; a, retried without delay, counts from its retry, not from its
    // enqueue long before.
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    q.settle(&[SettleOp::new(&b.tasks[0], Settle::Ack)])
        .await
        .unwrap();
    assert_eq!(q.stats().await.unwrap().oldest_due_age_ms, 0);
    let retried = Instant::now();
    q.settle(&[SettleOp::new(
        &first.tasks[0],
        Settle::Retry {
            delay: Duration::ZERO,
            priority: Some(9),
            reason: "again".into(),
        },
    )])
    .await
    .unwrap();
    let late = lateness_past(&q, 300).await;
    assert!(
        late <= retried.elapsed().as_millis() as u64 + 50
            && late + 500 < enqueued.elapsed().as_millis() as u64,
        "a's due time is {late} ms ago: since its retry, not its enqueue"
    );

    // Everything taken and acked: not late, and no due time is left behind.
    let rest = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(rest.tasks[0].id, "a");
    q.settle(&[SettleOp::new(&rest.tasks[0], Settle::Ack)])
        .await
        .unwrap();
    let s = q.stats().await.unwrap();
    assert_eq!(
        (s.ready, s.delayed, s.oldest_due_age_ms),
        (0, 0, 0),
        "{s:?}"
    );
    assert!(!dues_kept().await, "the due times went with their tasks");
}
