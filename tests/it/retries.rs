//! Retries as the queue's `retry` table shapes them, through a real master's exec slot:
//! delays from `intervals` (the last repeating) and a `priority` that puts a retried task
//! ahead of the waiting backlog.

use std::path::Path;
use std::time::{Duration, SystemTime};

use gaffer::queue_client::{NewTask, Queue, RecordState};

use crate::harness::eventually;
use crate::host::{TestMaster, enqueue};

/// The queue `r`: the shipped exec handler, one task per take, four attempts, retried
/// after 1 s, then 3 s (and 3 s again) at priority 1000.
fn retry_queue() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/exec_handler.py");
    format!(
        "[queues.r]\nhandler = \"exec\"\ncommand = [\"python3\", \"{}\"]\nbatch_size = 1\n\
         max_attempts = 4\nretry = {{ intervals = [\"1s\", \"3s\"], priority = 1000 }}\n",
        script.display()
    )
}

/// The moments of task `id`'s history entries in `state`, in order.
async fn moments(q: &Queue, id: &str, state: RecordState) -> Vec<SystemTime> {
    let r = q.record(id).await.unwrap().expect("a record");
    r.history
        .unwrap_or_default()
        .iter()
        .filter(|e| e.state == state)
        .map(|e| humantime::parse_rfc3339(&e.at).expect("an RFC 3339 time"))
        .collect()
}

#[tokio::test]
async fn a_failing_task_is_retried_at_its_intervals_ahead_of_the_backlog() {
    let m = TestMaster::start(&retry_queue(), &[("r", 1)]).await;
    let q = m.queue("r");
    let failing = NewTask::new(r#"{"action":"fail","error":"down"}"#).max_attempts(4);
    let failing = q.enqueue_many(&[failing]).await.unwrap().remove(0).id;
    // A backlog of 60 × 250 ms at priority 0: 15 s of work for the one slot, longer than
    // the failing task's 1 + 3 + 3 s of retries. Without the retry priority each retry
    // would wait behind what is left of it.
    let backlog = 60;
    enqueue(
        &q,
        (0..backlog).map(|_| r#"{"action":"sleep","ms":250}"#.to_string()),
    )
    .await;
    eventually(Duration::from_secs(30), "the failing task dead", || async {
        q.stats().await.unwrap().dead == 1
    })
    .await;
    let acked = q.stats().await.unwrap().acked_total;
    // Each retry's wait: from the failed attempt's end (its waiting entry) to the next
    // start, at least the interval and at most one backlog task and a take more.
    let retried = moments(&q, &failing, RecordState::Waiting).await;
    let starts = moments(&q, &failing, RecordState::Running).await;
    assert_eq!(starts.len(), 4, "four attempts: {starts:?}");
    let waits: Vec<Duration> = retried[1..]
        .iter()
        .zip(&starts[1..])
        .map(|(r, s)| s.duration_since(*r).unwrap())
        .collect();
    assert!(
        acked < backlog,
        "the backlog ({acked} of {backlog} done) did not wait for the retries (waits {waits:?})"
    );
    let wanted = [1, 3, 3].map(Duration::from_secs);
    assert_eq!(waits.len(), wanted.len(), "{waits:?}");
    for (wait, want) in waits.iter().zip(wanted) {
        assert!(
            *wait >= want && *wait < want + Duration::from_millis(1000),
            "waits {waits:?}, wanted about {wanted:?}"
        );
    }
    let r = q.record(&failing).await.unwrap().unwrap();
    assert_eq!((r.state, r.attempt), (RecordState::Failed, 4));
}
