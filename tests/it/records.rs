//! Task records and their history (docs/API.md, "The task record"), against a real redis-server
//! and, for the same cases, a real 3-master Redis Cluster. Each history is a snapshot of
//! the record's JSON (the API's record) with its times masked.

use std::collections::HashSet;
use std::time::Duration;

use gaffer::config::{Dedup, Intake};
use gaffer::queue_client::{
    FreezeResult, ListQuery, NewTask, Queue, QueueClient, QueueError, QueueLimits, RecordState,
    Settle, SettleOp, SettleResult, TaskRecord, TaskState, Worker,
};

use crate::harness::{TestRedis, eventually};

crate::harness::on_both!(
    history_done_first_time,
    history_retried_twice_then_done,
    history_failed_for_good,
    history_lease_expired_then_done_elsewhere,
    history_cancelled_while_delayed,
    history_frozen_then_thawed,
    results_are_kept_and_oversized_ones_fail,
    records_expire_after_history_ttl,
    an_id_enqueued_again_outlives_its_old_records_expiry,
    untracked_queue_writes_no_record,
    tasks_from_before_tracking_get_no_record,
    intake_closed_refuses_and_cancel_records,
    dedup_record_keeps_a_finished_id,
    dedup_record_lets_go_of_ids_whose_records_are_due,
    an_owned_cancel_or_hold_acts_only_on_its_owners_task,
    listing_pages_by_cursor_filters_and_submitters,
    a_task_retried_without_end_keeps_a_bounded_record,
    a_listing_page_ends_early_past_its_bytes,
);

/// A listing page holds about 4 MiB of records at most: past it, the page ends early and
/// its cursor goes on to the rest (before, `limit = 1000` on tasks with large results made
/// a reply of the limit times the result, built whole in Redis's memory).
async fn a_listing_page_ends_early_past_its_bytes(client: QueueClient, name: &str) {
    let q = client
        .queue_with(
            name,
            QueueLimits {
                max_result: 2 << 20,
                ..limits()
            },
        )
        .unwrap();
    let tasks: Vec<NewTask> = (0..5)
        .map(|i| NewTask::new("{}").id(format!("r{i}")))
        .collect();
    q.enqueue_many(&tasks).await.unwrap();
    let b = q.take(5, Duration::from_secs(30)).await.unwrap();
    let result = format!(r#"{{"blob":"{}"}}"#, "x".repeat(1_500_000));
    let ops: Vec<_> = b
        .tasks
        .iter()
        .map(|t| {
            SettleOp::new(
                t,
                Settle::AckWithResult {
                    result: result.clone(),
                },
            )
        })
        .collect();
    q.settle(&ops).await.unwrap();
    let mut query = ListQuery {
        state: None,
        submitted_by: None,
        cursor: None,
        limit: 10,
    };
    let first = q.list(&query).await.unwrap();
    let ids = |p: &gaffer::queue_client::ListPage| -> Vec<String> {
        p.tasks.iter().map(|t| t.id.clone()).collect()
    };
    assert_eq!(
        ids(&first),
        ["r4", "r3", "r2"],
        "4.5 MB: the third passes 4 MiB"
    );
    query.cursor = first.next_cursor.clone();
    assert!(query.cursor.is_some(), "the page goes on");
    let second = q.list(&query).await.unwrap();
    assert_eq!(ids(&second), ["r1", "r0"]);
    assert_eq!(second.next_cursor, None);
}

/// A task retried without end (`max_attempts = 0`) with a long error each time keeps a
/// record of bounded size: its history keeps its first entry and its newest 99, and a note
/// or error is cut at 4 KiB, saying how much was left out. (Before, every attempt added
/// its whole error, for as long as the task was retried, to a record that never expires.)
async fn a_task_retried_without_end_keeps_a_bounded_record(client: QueueClient, name: &str) {
    let limits = QueueLimits {
        max_attempts: 0,
        ..Default::default()
    };
    let q = client.queue_with(name, limits).unwrap();
    q.enqueue(NewTask::new("{}").id("again")).await.unwrap();
    // (a multi-byte character across the cut: the record stays UTF-8)
    let long = format!("{}é{}", "x".repeat(4095), "y".repeat(100_000));
    for attempt in 1..=80u32 {
        let b = q.take(1, Duration::from_secs(60)).await.unwrap();
        assert_eq!(b.tasks[0].attempt, attempt);
        let reason = if attempt == 80 {
            long.clone()
        } else {
            format!("try {attempt}")
        };
        let retry = Settle::Retry {
            delay: Duration::ZERO,
            priority: None,
            reason,
        };
        settle_one(&q, &b.tasks[0], retry).await;
    }
    let rec = record(&q, "again").await;
    let history = rec.history.as_deref().expect("a history");
    assert_eq!(history.len(), 100, "{:?}", history.first());
    assert_eq!(history[0].state, RecordState::Waiting);
    assert_eq!(history[0].attempt, 0, "the first entry stays");
    let last = history.last().unwrap();
    assert_eq!((last.state, last.attempt), (RecordState::Waiting, 80));
    let note = last.note.as_deref().unwrap();
    let kept = "x".repeat(4095);
    assert_eq!(note, format!("{kept} ... (100002 bytes more)"));
    assert_eq!(rec.error.as_deref(), Some(note));
    let before = &history[history.len() - 3];
    assert_eq!(before.note.as_deref(), Some("try 79"));
}

fn limits() -> QueueLimits {
    QueueLimits {
        max_attempts: 3,
        ..Default::default()
    }
}

fn on(q: &Queue, host: &str, slot: u32) -> Queue {
    q.clone().with_worker(Worker {
        host: host.into(),
        slot,
    })
}

/// The record as the API shows it, with every time replaced, so a snapshot holds only
/// what does not change from run to run.
fn masked(rec: &TaskRecord) -> serde_json::Value {
    let mut v = serde_json::to_value(rec).unwrap();
    let obj = v.as_object_mut().unwrap();
    for k in ["created_at", "due_at", "updated_at"] {
        if obj.get(k).is_some_and(|t| t.is_string()) {
            obj.insert(k.into(), "<time>".into());
        }
    }
    obj.insert("queue".into(), "<queue>".into());
    if let Some(h) = obj.get_mut("history").and_then(|h| h.as_array_mut()) {
        for e in h {
            e["at"] = "<time>".into();
        }
    }
    v
}

async fn record(q: &Queue, id: &str) -> TaskRecord {
    q.record(id).await.unwrap().expect("a record")
}

/// The ids of the first page (up to 10) of the queue's records, in `state` when given.
async fn listed(q: &Queue, state: Option<RecordState>) -> Vec<String> {
    let page = q
        .list(&ListQuery {
            state,
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    page.tasks.into_iter().map(|t| t.id).collect()
}

async fn take_one(q: &Queue) -> gaffer::queue_client::LeasedTask {
    let b = q.take(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 1, "one task to take");
    b.tasks.into_iter().next().unwrap()
}

async fn settle_one(
    q: &Queue,
    t: &gaffer::queue_client::LeasedTask,
    action: Settle,
) -> SettleResult {
    q.settle(&[SettleOp::new(t, action)]).await.unwrap()[0]
}

async fn history_done_first_time(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits()).unwrap();
    q.enqueue(NewTask::new("{}").id("t1").submitted_by("shop"))
        .await
        .unwrap();
    assert_eq!(record(&q, "t1").await.state, RecordState::Waiting);
    let w = on(&q, "h1", 3);
    let t = take_one(&w).await;
    // While the slot holds it, readers see the running entry the take wrote beside the
    // record: state, attempt, update time and the slot that runs it.
    let running = record(&q, "t1").await;
    assert_eq!(running.state, RecordState::Running);
    assert_eq!(running.attempt, 1);
    let last = running.history.as_ref().unwrap().last().unwrap().clone();
    assert_eq!(
        (last.state, last.attempt, last.host.as_deref(), last.slot),
        (RecordState::Running, 1, Some("h1"), Some(3))
    );
    assert_eq!(running.updated_at, last.at);
    assert_eq!(listed(&q, Some(RecordState::Running)).await, ["t1"]);
    assert_eq!(settle_one(&w, &t, Settle::Ack).await, SettleResult::Done);
    insta::assert_json_snapshot!("done_first_time", masked(&record(&q, "t1").await));
}

/// A retry due at once, at the same priority, for `reason`.
fn retry_now(reason: String) -> Settle {
    Settle::Retry {
        delay: Duration::ZERO,
        priority: None,
        reason,
    }
}

async fn history_retried_twice_then_done(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits()).unwrap();
    q.enqueue(NewTask::new("{}").id("t1")).await.unwrap();
    let w = on(&q, "h1", 1);
    for n in 1..=2 {
        let t = take_one(&w).await;
        let retry = retry_now(format!("partner answered 503 (try {n})"));
        assert_eq!(settle_one(&w, &t, retry).await, SettleResult::Done);
    }
    let t = take_one(&w).await;
    assert_eq!(t.attempt, 3);
    settle_one(&w, &t, Settle::Ack).await;
    insta::assert_json_snapshot!("retried_twice_then_done", masked(&record(&q, "t1").await));
}

async fn history_failed_for_good(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits()).unwrap();
    q.enqueue(NewTask::new("{}").id("t1")).await.unwrap();
    let w = on(&q, "h2", 7);
    for n in 1..=3 {
        let t = take_one(&w).await;
        let retry = retry_now(format!("error {n}"));
        let want = if n < 3 {
            SettleResult::Done
        } else {
            SettleResult::DeadLettered
        };
        assert_eq!(settle_one(&w, &t, retry).await, want);
    }
    let rec = record(&q, "t1").await;
    assert_eq!(rec.state, RecordState::Failed);
    let notes: Vec<_> = rec
        .history
        .as_ref()
        .unwrap()
        .iter()
        .filter_map(|e| e.note.clone())
        .collect();
    assert!(
        notes.iter().any(|n| n == "error 1") && notes.iter().any(|n| n == "error 2"),
        "{notes:?}"
    );
    insta::assert_json_snapshot!("failed_for_good", masked(&rec));
}

async fn history_lease_expired_then_done_elsewhere(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits()).unwrap();
    q.enqueue(NewTask::new("{}").id("t1")).await.unwrap();
    let dead_slot = on(&q, "h1", 1);
    let b = dead_slot.take(1, Duration::from_millis(50)).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    // The slot holding it dies: nobody settles, the lease runs out, another slot takes it.
    let other = on(&q, "h2", 4);
    let t = crate::harness::poll_some(Duration::from_secs(10), "the expired lease", || {
        let other = other.clone();
        async move {
            other
                .take(1, Duration::from_secs(30))
                .await
                .unwrap()
                .tasks
                .pop()
        }
    })
    .await;
    assert_eq!(t.attempt, 2);
    settle_one(&other, &t, Settle::Ack).await;
    insta::assert_json_snapshot!("lease_expired_then_done", masked(&record(&q, "t1").await));
}

async fn history_cancelled_while_delayed(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits()).unwrap();
    q.enqueue(NewTask::new("{}").id("t1").delay(Duration::from_secs(600)))
        .await
        .unwrap();
    let info = q
        .cancel_with("t1", "cancelled by key shop")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, TaskState::Delayed);
    let rec = record(&q, "t1").await;
    assert_eq!(rec.state, RecordState::Cancelled);
    insta::assert_json_snapshot!("cancelled_while_delayed", masked(&rec));
}

async fn history_frozen_then_thawed(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits()).unwrap();
    q.enqueue(NewTask::new("{}").id("t1")).await.unwrap();
    assert_eq!(
        q.freeze("t1", "frozen by cli").await.unwrap(),
        FreezeResult::Done
    );
    assert_eq!(
        q.find("t1").await.unwrap().unwrap().state,
        TaskState::Frozen
    );
    assert_eq!(q.stats().await.unwrap().frozen, 1);
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert!(b.tasks.is_empty(), "a frozen task is not taken");
    assert_eq!(q.freeze("nope", "x").await.unwrap(), FreezeResult::Unknown);
    // Each step: freeze (true) or thaw, its note; a repeat is done and changes nothing.
    for (freeze, note) in [
        (false, "thawed by cli"),
        (false, "again"),
        (true, "frozen by cli"),
        (true, "again"),
        (false, "thawed by cli"),
    ] {
        let result = if freeze {
            q.freeze("t1", note).await
        } else {
            q.thaw("t1", note).await
        };
        assert_eq!(result.unwrap(), FreezeResult::Done, "{freeze} {note}");
    }
    let w = on(&q, "h1", 2);
    let t = take_one(&w).await;
    assert_eq!(
        q.freeze("t1", "too late").await.unwrap(),
        FreezeResult::NotApplicable
    );
    settle_one(&w, &t, Settle::Ack).await;
    insta::assert_json_snapshot!("frozen_then_thawed", masked(&record(&q, "t1").await));
}

async fn results_are_kept_and_oversized_ones_fail(client: QueueClient, name: &str) {
    let q = client
        .queue_with(
            name,
            QueueLimits {
                max_result: 64,
                ..limits()
            },
        )
        .unwrap();
    q.enqueue_many(&[NewTask::new("{}").id("small"), NewTask::new("{}").id("big")])
        .await
        .unwrap();
    let b = q.take(2, Duration::from_secs(30)).await.unwrap();
    let ops: Vec<_> = b
        .tasks
        .iter()
        .map(|t| {
            let result = if t.id == "small" {
                r#"{"rows":3}"#.to_string()
            } else {
                format!(r#"{{"blob":"{}"}}"#, "x".repeat(100))
            };
            SettleOp::new(t, Settle::AckWithResult { result })
        })
        .collect();
    q.settle(&ops).await.unwrap();
    let small = record(&q, "small").await;
    assert_eq!(small.state, RecordState::Done);
    assert_eq!(small.result, Some(serde_json::json!({"rows": 3})));
    let big = record(&q, "big").await;
    assert_eq!(big.state, RecordState::Failed);
    assert_eq!(big.result, None);
    assert_eq!(
        big.error.as_deref(),
        Some(format!("result of 111 bytes exceeds max_result 64 bytes of queue {name}").as_str())
    );
}

/// A queue whose records go 300 ms after their task ended, with tasks `ids` enqueued
/// and the first `done` of them taken and acked together.
async fn short_lived_records(client: QueueClient, name: &str, ids: &[&str], done: usize) -> Queue {
    let q = client
        .queue_with(
            name,
            QueueLimits {
                history_ttl: Duration::from_millis(300),
                ..limits()
            },
        )
        .unwrap();
    let tasks: Vec<_> = ids.iter().map(|id| NewTask::new("{}").id(*id)).collect();
    q.enqueue_many(&tasks).await.unwrap();
    let b = q.take(done, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), done);
    q.ack(&b.tasks).await.unwrap();
    q
}

async fn records_expire_after_history_ttl(client: QueueClient, name: &str) {
    let q = short_lived_records(client, name, &["done", "waits"], 1).await;
    eventually(Duration::from_secs(10), "the ended record expires", || {
        let q = q.clone();
        async move { q.record("done").await.unwrap().is_none() }
    })
    .await;
    // A task that has not ended keeps its record however long it waits.
    assert_eq!(record(&q, "waits").await.state, RecordState::Waiting);
    // The listing drops index entries of expired records.
    assert_eq!(listed(&q, None).await, ["waits"]);
}

/// A task acked in a batch is expired through its batch's list, not an entry of its own:
/// a new task under the same id must outlive that list's moment.
async fn an_id_enqueued_again_outlives_its_old_records_expiry(client: QueueClient, name: &str) {
    let q = short_lived_records(client, name, &["again", "other"], 2).await;
    q.enqueue(NewTask::new("{}").id("again")).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the other ended record expires",
        || {
            let q = q.clone();
            async move { q.record("other").await.unwrap().is_none() }
        },
    )
    .await;
    let again = record(&q, "again").await;
    assert_eq!(again.state, RecordState::Waiting);
    assert_eq!(again.history.unwrap().len(), 1);
}

fn untracked_queue(client: &QueueClient, name: &str) -> Queue {
    client
        .queue_with(
            name,
            QueueLimits {
                track: false,
                ..limits()
            },
        )
        .unwrap()
}

/// A queue that starts tracking keeps no half records of the tasks enqueued before.
async fn tasks_from_before_tracking_get_no_record(client: QueueClient, name: &str) {
    let untracked = untracked_queue(&client, name);
    untracked
        .enqueue(NewTask::new("{}").id("old"))
        .await
        .unwrap();
    let q = client.queue_with(name, limits()).unwrap();
    q.enqueue(NewTask::new("{}").id("new")).await.unwrap();
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 2);
    q.ack(&b.tasks).await.unwrap();
    assert_eq!(q.record("old").await.unwrap(), None);
    assert_eq!(record(&q, "new").await.state, RecordState::Done);
}

async fn untracked_queue_writes_no_record(client: QueueClient, name: &str) {
    let q = untracked_queue(&client, name);
    let made = q.enqueue(NewTask::new("{}").id("t1")).await.unwrap();
    assert!(made.created);
    assert!(q.record("t1").await.unwrap().is_none());
    let b = q.take(1, Duration::from_secs(30)).await.unwrap();
    q.ack(&b.tasks).await.unwrap();
    assert!(q.record("t1").await.unwrap().is_none());
    assert!(listed(&q, None).await.is_empty());
}

async fn intake_closed_refuses_and_cancel_records(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits()).unwrap();
    q.set_intake(Some(Intake::Closed)).await.unwrap();
    assert_eq!(q.intake().await.unwrap(), Intake::Closed);
    let err = q.enqueue(NewTask::new("{}").id("t1")).await.unwrap_err();
    assert!(matches!(err, QueueError::IntakeClosed { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!("the intake of queue {name} is closed: it accepts no new tasks")
    );
    assert!(q.find("t1").await.unwrap().is_none());
    assert!(q.record("t1").await.unwrap().is_none());
    assert_eq!(q.stats().await.unwrap().enqueued_total, 0);

    // A dead letter, which a new task under its id supersedes (below, while the intake
    // cancels).
    q.set_intake(None).await.unwrap();
    q.enqueue(NewTask::new("{}").id("d1")).await.unwrap();
    let b = q.take(1, Duration::from_secs(30)).await.unwrap();
    let failed = Settle::Fail {
        reason: "bad".into(),
    };
    settle_one(&q, &b.tasks[0], failed).await;
    assert_eq!(q.find("d1").await.unwrap().unwrap().state, TaskState::Dead);

    q.set_intake(Some(Intake::Cancel)).await.unwrap();
    let made = q.enqueue(NewTask::new("{}").id("t2")).await.unwrap();
    assert_eq!(
        (made.created, made.state),
        (true, Some(RecordState::Cancelled))
    );
    assert!(q.find("t2").await.unwrap().is_none(), "nothing to run");
    let rec = record(&q, "t2").await;
    assert_eq!(rec.state, RecordState::Cancelled);
    assert_eq!(
        rec.history.unwrap()[0].note.as_deref(),
        Some("cancelled on arrival: the intake of the queue is cancel")
    );

    // The dead letter's id: recorded as cancelled, and nothing of the dead letter left
    // behind to hold the id once the intake opens again.
    let made = q.enqueue(NewTask::new("{}").id("d1")).await.unwrap();
    assert_eq!(
        (made.created, made.state),
        (true, Some(RecordState::Cancelled))
    );
    assert!(q.find("d1").await.unwrap().is_none(), "nothing left of d1");

    // Dropping the switch returns to the config's value.
    q.set_intake(None).await.unwrap();
    assert_eq!(q.intake().await.unwrap(), Intake::Open);
    let made = q.enqueue(NewTask::new("{}").id("d1")).await.unwrap();
    assert_eq!(
        (made.created, made.state),
        (true, Some(RecordState::Waiting))
    );
    assert_eq!(q.find("d1").await.unwrap().unwrap().state, TaskState::Ready);
    let made = q.enqueue(NewTask::new("{}").id("t3")).await.unwrap();
    assert_eq!(made.state, Some(RecordState::Waiting));
    // The config's own value applies while no switch is set.
    let closed = client
        .queue_with(
            name,
            QueueLimits {
                intake: Intake::Closed,
                ..limits()
            },
        )
        .unwrap();
    assert!(closed.enqueue(NewTask::new("{}")).await.is_err());
}

async fn dedup_record_keeps_a_finished_id(client: QueueClient, name: &str) {
    for (dedup, again) in [(Dedup::Active, true), (Dedup::Record, false)] {
        let q = client
            .queue_with(
                &format!("{name}.{dedup:?}"),
                QueueLimits { dedup, ..limits() },
            )
            .unwrap();
        q.enqueue(NewTask::new("{}").id("once")).await.unwrap();
        let b = q.take(1, Duration::from_secs(30)).await.unwrap();
        q.ack(&b.tasks).await.unwrap();
        let made = q.enqueue(NewTask::new("{}").id("once")).await.unwrap();
        assert_eq!(made.created, again, "{dedup:?}");
        let rec = record(&q, "once").await;
        let want = if again {
            RecordState::Waiting
        } else {
            RecordState::Done
        };
        assert_eq!(rec.state, want, "{dedup:?}");
    }
}

/// Records that ended together (acks of a batch split in two calls: one expiry list per
/// call) and whose time is up, more of them than an enqueue sweeps first: none of their
/// ids still counts as taken for `dedup = "record"`, as none is shown to readers.
async fn dedup_record_lets_go_of_ids_whose_records_are_due(client: QueueClient, name: &str) {
    let q = client
        .queue_with(
            name,
            QueueLimits {
                dedup: Dedup::Record,
                history_ttl: Duration::from_millis(200),
                ..limits()
            },
        )
        .unwrap();
    let tasks = |_| -> Vec<NewTask> {
        (0..150)
            .map(|i| NewTask::new("{}").id(format!("r{i}")))
            .collect()
    };
    q.enqueue_many(&tasks(())).await.unwrap();
    let b = q.take(150, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 150);
    let (first, second) = b.tasks.split_at(75);
    q.ack(first).await.unwrap();
    q.ack(second).await.unwrap();
    eventually(
        Duration::from_secs(10),
        "the records' time is up",
        || async { q.record("r149").await.unwrap().is_none() },
    )
    .await;
    let made = q.enqueue_many(&tasks(())).await.unwrap();
    let kept: Vec<&str> = made
        .iter()
        .filter(|m| !m.created)
        .map(|m| m.id.as_str())
        .collect();
    assert_eq!(
        kept,
        Vec::<&str>::new(),
        "ids held by records no reader shows"
    );
}

/// A cancel, freeze or thaw on behalf of the task's submitter (as the api checked it) does
/// nothing once the id holds another submitter's task, in the same step.
async fn an_owned_cancel_or_hold_acts_only_on_its_owners_task(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits()).unwrap();
    q.enqueue(NewTask::new("{}").id("t1").submitted_by("shop"))
        .await
        .unwrap();
    assert!(
        q.cancel_owned("t1", "by ops", "ops")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        q.hold_owned("t1", true, "by ops", "ops").await.unwrap(),
        FreezeResult::Unknown
    );
    assert_eq!(record(&q, "t1").await.state, RecordState::Waiting);
    assert_eq!(
        q.hold_owned("t1", true, "by shop", "shop").await.unwrap(),
        FreezeResult::Done
    );
    assert_eq!(
        q.hold_owned("t1", false, "by ops", "ops").await.unwrap(),
        FreezeResult::Unknown
    );
    assert_eq!(record(&q, "t1").await.state, RecordState::Frozen);
    assert_eq!(
        q.hold_owned("t1", false, "by shop", "shop").await.unwrap(),
        FreezeResult::Done
    );
    assert!(
        q.cancel_owned("t1", "by shop", "shop")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(record(&q, "t1").await.state, RecordState::Cancelled);
    // A task that failed after the api looked at it (a dead letter now) has ended: the
    // owner's cancel leaves it failed and its dead letter there, to be requeued.
    q.enqueue(NewTask::new("{}").id("t2").submitted_by("shop"))
        .await
        .unwrap();
    let b = q.take(1, Duration::from_secs(30)).await.unwrap();
    let fail = Settle::Fail {
        reason: "bad".into(),
    };
    q.settle(&[SettleOp::new(&b.tasks[0], fail)]).await.unwrap();
    let info = q.cancel_owned("t2", "by shop", "shop").await.unwrap();
    assert_eq!(info.map(|i| i.state), Some(TaskState::Dead));
    assert_eq!(record(&q, "t2").await.state, RecordState::Failed);
    assert_eq!(q.stats().await.unwrap().dead, 1);
}

async fn listing_pages_by_cursor_filters_and_submitters(client: QueueClient, name: &str) {
    let q = client.queue_with(name, limits()).unwrap();
    let shop: Vec<NewTask> = (0..30)
        .map(|i| NewTask::new("{}").id(format!("s{i}")).submitted_by("shop"))
        .collect();
    let ops: Vec<NewTask> = (0..20)
        .map(|i| NewTask::new("{}").id(format!("o{i}")).submitted_by("ops"))
        .collect();
    q.enqueue_many(&shop).await.unwrap();
    q.enqueue_many(&ops).await.unwrap();
    // Ten of shop's tasks end.
    let b = q.take(10, Duration::from_secs(30)).await.unwrap();
    q.ack(&b.tasks).await.unwrap();

    let all = collect(
        &q,
        ListQuery {
            limit: 7,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(all.len(), 50);
    assert_eq!(all[0], "o19", "newest first");
    assert_eq!(all[49], "s0");
    let mine = collect(
        &q,
        ListQuery {
            limit: 4,
            submitted_by: Some("shop".into()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(mine.len(), 30);
    assert!(mine.iter().all(|id| id.starts_with('s')));
    let done = collect(
        &q,
        ListQuery {
            limit: 3,
            state: Some(RecordState::Done),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(done.len(), 10);
    let bad = q
        .list(&ListQuery {
            limit: 3,
            cursor: Some("garbage".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("cursor"), "{bad}");
}

/// Every id of a listing, page by page, asserting none comes twice.
async fn collect(q: &Queue, mut query: ListQuery) -> Vec<String> {
    let mut ids = Vec::new();
    let mut seen = HashSet::new();
    loop {
        let page = q.list(&query).await.unwrap();
        for t in &page.tasks {
            assert!(t.history.is_none(), "listings carry no history");
            assert!(seen.insert(t.id.clone()), "{} twice", t.id);
            ids.push(t.id.clone());
        }
        match page.next_cursor {
            Some(c) => query.cursor = Some(c),
            None => return ids,
        }
    }
}

/// 10,000 tasks listed in pages of 100 while 1,000 more are enqueued and 1,000 acked: no
/// id twice, and none of the tasks that existed throughout is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_under_churn_misses_nothing_and_repeats_nothing() {
    let redis = crate::harness::TestRedis::start();
    let client = redis.client().await;
    let q = client.queue_with("churn", limits()).unwrap();
    let first: Vec<NewTask> = (0..10_000)
        .map(|i| NewTask::new("{}").id(format!("a{i}")))
        .collect();
    q.enqueue_many(&first).await.unwrap();
    // Interleaved with the listing on one task: enqueue_many's future borrows its input.
    let churn = async {
        for round in 0..10 {
            let more: Vec<NewTask> = (0..100)
                .map(|i| NewTask::new("{}").id(format!("b{round}.{i}")))
                .collect();
            q.enqueue_many(&more).await.unwrap();
            let b = q.take(100, Duration::from_secs(60)).await.unwrap();
            q.ack(&b.tasks).await.unwrap();
            tokio::task::yield_now().await;
        }
    };
    let (ids, ()) = tokio::join!(
        collect(
            &q,
            ListQuery {
                limit: 100,
                ..Default::default()
            }
        ),
        churn
    );
    let seen: HashSet<&str> = ids.iter().map(String::as_str).collect();
    // Acked tasks keep their records (done), so every one of the first 10,000 existed
    // throughout.
    for i in 0..10_000 {
        assert!(seen.contains(format!("a{i}").as_str()), "a{i} missed");
    }
}

/// The ack of a whole batch lease writes nothing to its tasks' records: their end is kept
/// once for the run of their records' numbers (`exp:b:r`), and readers show it as the
/// record's own. A new task under one of the ids is not read as done by the old run and
/// outlives it; the rest go with the run, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_batch_ends_in_one_entry_and_goes_with_its_records() {
    let redis = crate::harness::TestRedis::start();
    let client = redis.client().await;
    let mut raw = redis.raw().await;
    let q = client
        .queue_with(
            "whole",
            QueueLimits {
                history_ttl: Duration::from_millis(500),
                ..limits()
            },
        )
        .unwrap();
    let tasks: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|id| NewTask::new("{}").id(*id))
        .collect();
    q.enqueue_many(&tasks).await.unwrap();
    // numbered after them, taken before them: the batch's numbers are two runs
    q.enqueue(NewTask::new("{}").id("hi").priority(9))
        .await
        .unwrap();
    let w = on(&q, "h2", 5);
    let b = w.take(4, Duration::from_secs(30)).await.unwrap();
    let taken: Vec<_> = b.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(taken, ["hi", "a", "b", "c"]);
    w.ack(&b.tasks).await.unwrap();
    let stored: String = redis::cmd("GET")
        .arg("test:{whole}:r:b")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        !stored.contains("done"),
        "the ack wrote the record: {stored:?}"
    );
    let runs: Vec<String> = redis::cmd("ZRANGE")
        .arg("test:{whole}:exp:b")
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(record(&q, "hi").await.state, RecordState::Done);
    let done = record(&q, "b").await;
    assert_eq!((done.state, done.attempt), (RecordState::Done, 1));
    let history: Vec<_> = done
        .history
        .unwrap()
        .iter()
        .map(|e| (e.state, e.attempt, e.host.clone(), e.slot))
        .collect();
    assert_eq!(
        history,
        [
            (RecordState::Waiting, 0, None, None),
            (RecordState::Running, 1, Some("h2".into()), Some(5)),
            (RecordState::Done, 1, Some("h2".into()), Some(5)),
        ]
    );
    assert_eq!(
        listed(&q, Some(RecordState::Done)).await,
        ["hi", "c", "b", "a"]
    );
    // "a" again: a new task, not done by the old batch.
    assert!(q.enqueue(NewTask::new("{}").id("a")).await.unwrap().created);
    assert_eq!(record(&q, "a").await.state, RecordState::Waiting);
    eventually(
        Duration::from_secs(10),
        "the batch's records expire",
        || {
            let q = q.clone();
            async move { q.record("b").await.unwrap().is_none() }
        },
    )
    .await;
    q.housekeep(1000).await.unwrap();
    assert!(q.record("c").await.unwrap().is_none());
    assert!(q.record("hi").await.unwrap().is_none());
    assert_eq!(record(&q, "a").await.state, RecordState::Waiting);
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("test:{whole}:exp*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(left.is_empty(), "the run {runs:?} left {left:?}");
    q.delete_all().await.unwrap();
    let all: Vec<String> = redis::cmd("KEYS")
        .arg("test:{whole}:*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(all.is_empty(), "{all:?}");
}

/// A whole batch acked without record numbers (an older client), or with numbers that
/// are not its tasks' count of distinct ones, still ends every record: the ack writes
/// each one, as before the numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_batch_without_good_numbers_writes_each_record() {
    let redis = crate::harness::TestRedis::start();
    let client = redis.client().await;
    let mut raw = redis.raw().await;
    let q = client.queue_with("nonum", limits()).unwrap();
    for (round, seqs) in [[None, None], [Some(1), Some(1)]].into_iter().enumerate() {
        let tasks: Vec<_> = ["x", "y"]
            .iter()
            .map(|id| NewTask::new("{}").id(format!("{id}{round}")))
            .collect();
        q.enqueue_many(&tasks).await.unwrap();
        let b = q.take(2, Duration::from_secs(30)).await.unwrap();
        assert_eq!(b.tasks.len(), 2);
        let ops: Vec<SettleOp> = b
            .tasks
            .iter()
            .zip(seqs)
            .map(|(t, seq)| SettleOp {
                seq,
                ..SettleOp::new(t, Settle::Ack)
            })
            .collect();
        let done = q.settle(&ops).await.unwrap();
        assert_eq!(done, [SettleResult::Done, SettleResult::Done]);
        for t in &b.tasks {
            assert_eq!(record(&q, &t.id).await.state, RecordState::Done, "{seqs:?}");
        }
    }
    let runs: i64 = redis::cmd("EXISTS")
        .arg("test:{nonum}:exp:b:r")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(runs, 0, "no run was written");
}

/// Two lists of records that ended at one moment but were made with different
/// `history_ttl`s (slots of an old and a new config acking in the same millisecond): the
/// shorter one falling due hides none of the longer one's records.
#[tokio::test]
async fn a_shorter_history_ttl_at_the_same_moment_hides_no_longer_lived_record() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let mut raw = redis.raw().await;
    let long = client.queue_with("ttls", limits()).unwrap();
    let short = client
        .queue_with(
            "ttls",
            QueueLimits {
                history_ttl: Duration::from_millis(1),
                ..limits()
            },
        )
        .unwrap();
    let redis_ms = || async {
        let (s, us): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut redis.raw().await)
            .await
            .unwrap();
        s * 1000 + us / 1000
    };
    // Each ends through a list (an ack of part of a batch), one per TTL, the short one a
    // millisecond or more before the long one (at one moment, the short one's record
    // would rightly stay as long as the long one's).
    for (q, ids) in [(&short, ["gone", "g2"]), (&long, ["keep", "k2"])] {
        for id in ids {
            q.enqueue(NewTask::new("{}").id(id)).await.unwrap();
        }
        let b = q.take(2, Duration::from_secs(30)).await.unwrap();
        assert_eq!(q.ack(&b.tasks[..1]).await.unwrap(), [SettleResult::Done]);
        let acked = redis_ms().await;
        eventually(Duration::from_secs(10), "the next millisecond", || async {
            redis_ms().await > acked
        })
        .await;
    }
    let lists: Vec<String> = redis::cmd("ZRANGE")
        .arg("test:{ttls}:exp:b")
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let week = week_list(&lists);
    // The short TTL's list of keep's moment, as a slot of that config would have made it
    // acking in the same millisecond: due at once.
    let (exp, ttl) = week.split_once(':').unwrap();
    let moment: u64 = exp.parse::<u64>().unwrap() - ttl.parse::<u64>().unwrap();
    let member = format!("{}:1", moment + 1);
    let _: () = redis::cmd("ZADD")
        .arg("test:{ttls}:exp:b")
        .arg(moment + 1)
        .arg(&member)
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(format!("test:{{ttls}}:exp:b:{member}"))
        .arg("other")
        .query_async(&mut raw)
        .await
        .unwrap();
    // (a read at the moment itself would find that list not due yet either)
    eventually(Duration::from_secs(10), "the short list due", || async {
        redis_ms().await > moment + 1
    })
    .await;
    let kept = long.record("keep").await.unwrap();
    assert_eq!(kept.map(|r| r.state), Some(RecordState::Done));
    // (the short TTL's own record falls due, and is not shown)
    eventually(Duration::from_secs(10), "gone's record due", || async {
        short.record("gone").await.unwrap().is_none()
    })
    .await;
}

/// The member of the lists' zset made with the default TTL (a week) among `lists`.
fn week_list(lists: &[String]) -> &str {
    let week = gaffer::config::DEFAULT_HISTORY_TTL.as_millis().to_string();
    lists
        .iter()
        .find(|m| m.ends_with(&format!(":{week}")))
        .expect("a list of the default TTL")
}
