//! A batch queue's `timeout`: a task over it is stopped at once (an exec child told, then
//! signalled; a Rust handler's task cancelled) and retried with the note "timed out after
//! …", while the other tasks of its batch are settled as usual.

use std::path::Path;
use std::time::{Duration, SystemTime};

use gaffer::queue_client::{NewTask, Queue, RecordState};

use crate::harness::{eventually, poll_some};
use crate::host::TestMaster;

/// `tasks` enqueued in one call (so one take hands them out together); their ids.
async fn enqueued_ids(q: &Queue, tasks: &[NewTask]) -> Vec<String> {
    let made = q.enqueue_many(tasks).await.unwrap();
    made.into_iter().map(|e| e.id).collect()
}

/// A task's history as (state, moment, note).
async fn history(q: &Queue, id: &str) -> Vec<(RecordState, SystemTime, String)> {
    let r = q.record(id).await.unwrap().expect("a record");
    r.history
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let at = humantime::parse_rfc3339(&e.at).expect("an RFC 3339 time");
            (e.state, at, e.note.unwrap_or_default())
        })
        .collect()
}

/// How long the first attempt of `id` ran before it went back to wait, and the note it
/// went back with.
async fn first_attempt(q: &Queue, id: &str) -> (Duration, String) {
    poll_some(
        Duration::from_secs(20),
        "the first attempt over",
        || async {
            let h = history(q, id).await;
            let start = h.iter().find(|e| e.0 == RecordState::Running)?.1;
            let back = h
                .iter()
                .find(|e| e.0 == RecordState::Waiting && e.1 >= start && e.2.contains("timed"))?;
            Some((back.1.duration_since(start).unwrap(), back.2.clone()))
        },
    )
    .await
}

/// Tasks `ids` done, each at its first attempt.
async fn done_first_time(q: &Queue, ids: &[String]) {
    eventually(Duration::from_secs(20), "the batch-mates done", || async {
        let mut all = true;
        for id in ids {
            let r = q.record(id).await.unwrap();
            all &= r.is_some_and(|r| r.state == RecordState::Done && r.attempt == 1);
        }
        all
    })
    .await;
}

#[tokio::test]
async fn an_exec_task_over_its_timeout_is_stopped_and_retried_and_its_batch_mates_finish() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/exec_handler.py");
    let queue = format!(
        "[queues.t]\nhandler = \"exec\"\ncommand = [\"python3\", \"{}\"]\nbatch_size = 3\n\
         timeout = \"2s\"\nlease = \"10m\"\n",
        script.display()
    );
    let m = TestMaster::start(&queue, &[("t", 1)]).await;
    let q = m.queue("t");
    // One take hands the slot all three: the slow one between two quick ones.
    let tasks = [
        r#"{"action":"ok"}"#,
        r#"{"action":"sleep","ms":30000}"#,
        r#"{"action":"sleep","ms":10}"#,
    ]
    .map(|p| NewTask::new(p).max_attempts(2));
    let ids = enqueued_ids(&q, &tasks).await;
    // Stopped and back in the queue within 3 s of its start (a 10-minute lease would
    // have held it for 10 minutes), the history saying why.
    let (ran, note) = first_attempt(&q, &ids[1]).await;
    assert_eq!(note, "timed out after 2s");
    assert!(
        ran >= Duration::from_secs(2) && ran < Duration::from_secs(3),
        "stopped {ran:?} after its start"
    );
    done_first_time(&q, &[ids[0].clone(), ids[2].clone()]).await;
    // Its second attempt times out too: it fails for good, saying why.
    eventually(Duration::from_secs(20), "the slow task dead", || async {
        q.stats().await.unwrap().dead == 1
    })
    .await;
    let r = q.record(&ids[1]).await.unwrap().unwrap();
    assert_eq!((r.state, r.attempt), (RecordState::Failed, 2));
    assert!(
        r.error
            .as_deref()
            .unwrap_or_default()
            .contains("timed out after 2s"),
        "{:?}",
        r.error
    );
}

#[tokio::test]
async fn a_rust_handlers_task_over_its_timeout_is_cancelled_and_retried() {
    let queue = "[queues.s]\nhandler = \"sleep\"\nbatch_size = 2\ntimeout = \"500ms\"\n";
    let m = TestMaster::start(queue, &[("s", 1)]).await;
    let q = m.queue("s");
    let tasks = [r#"{"ms":30000}"#, r#"{"ms":10}"#].map(|p| NewTask::new(p).max_attempts(3));
    let ids = enqueued_ids(&q, &tasks).await;
    let (ran, note) = first_attempt(&q, &ids[0]).await;
    assert_eq!(note, "timed out after 500ms");
    assert!(
        ran >= Duration::from_millis(500) && ran < Duration::from_millis(1500),
        "cancelled {ran:?} after its start"
    );
    done_first_time(&q, &ids[1..]).await;
}

#[tokio::test]
async fn a_submit_may_shorten_its_queues_timeout_and_no_more() {
    use crate::api::{OPS, request, start_api, test_config};
    let tables = "[queues.s]\nhandler = \"sleep\"\ntimeout = \"10s\"\n\
                  [queues.plain]\nhandler = \"sleep\"\n";
    let m = TestMaster::start(tables, &[("s", 1)]).await;
    let api_text = format!(
        "[cluster]\nredis = \"{}\"\n{tables}[api.keys.ops]\ntoken_sha256 = \"{}\"\nadmin = true\n",
        m.redis.url(),
        gaffer::api::hash_token(OPS)
    );
    let (addr, stop, _api) = start_api(test_config(&api_text), m.redis.url()).await;
    let submit = |queue: &'static str, body: &'static str| async move {
        let path = format!("/v1/queues/{queue}/tasks");
        let (status, body) = request(addr, "POST", &path, Some(OPS), Some(body.as_bytes())).await;
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    let (status, body) = submit("s", r#"{"payload": {"ms": 1}, "timeout": "1m"}"#).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("timeout 1m exceeds the limit of 10s ([queues.s].timeout)"),
        "{body}"
    );
    let (status, body) = submit("plain", r#"{"payload": {"ms": 1}, "timeout": "1s"}"#).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("queue plain has no timeout"), "{body}");
    let (status, body) = submit(
        "s",
        r#"{"tasks": [{"payload": {"ms": 1}}, {"payload": {"ms": 1}, "timeout": "0s"}]}"#,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("tasks[1]: timeout must be greater than zero"),
        "{body}"
    );

    // Within it: the task's own limit is the one its slot holds it to.
    let (status, body) = submit(
        "s",
        r#"{"payload": {"ms": 30000}, "timeout": "700ms", "max_attempts": 2}"#,
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let q = m.queue("s");
    let (ran, note) = first_attempt(&q, &id).await;
    assert_eq!(note, "timed out after 700ms");
    assert!(
        ran < Duration::from_secs(2),
        "stopped {ran:?} after its start"
    );
    stop.cancel();

    // `gaffer push --timeout` holds to the same rule, as bad usage.
    let push = |queue: &str, limit: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--config")
            .arg(&m.config)
            .args(["push", queue, "--payload", "{}", "--timeout", limit])
            .output()
            .unwrap()
    };
    let out = push("s", "1m");
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("timeout 1m exceeds the limit of 10s ([queues.s].timeout)"),
        "{said}"
    );
    assert_eq!(push("plain", "1s").status.code(), Some(2));
    assert!(push("s", "5s").status.success());
}
