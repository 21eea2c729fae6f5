//! Task ids as they enter and as operators see them (issue 40, items 4 and 12): ids with
//! control characters are refused wherever an id enters, what Redis already holds of
//! them (written before the check, as an older build could) reaches the terminal escaped,
//! and generated ids go into a URL as they are, in a form no client id may take.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::Duration;

use gaffer::api::{ApiOptions, hash_token};
use gaffer::queue_client::{NewTask, QueueClient, Settle, SettleOp, Worker};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::request;
use crate::harness::TestRedis;

const OPS: &str = "ops-token";

/// An id an older build accepted: an OSC window title, a bell, a screen clear.
const EVIL_ID: &str = "inv\u{1b}]0;pwned\u{7}\u{1b}[2J-1";
/// The same as the terminal is shown it.
const EVIL_ID_SHOWN: &str = "inv\\x1b]0;pwned\\x07\\x1b[2J-1";

fn config_text() -> String {
    format!(
        r#"
[cluster]
namespace = "test"

[queues.emails]
handler = "noop"
max_attempts = 1

[api.keys.ops]
token_sha256 = "{ops}"
admin = true
"#,
        ops = hash_token(OPS)
    )
}

/// A running api over `redis`, with the config of [`config_text`].
struct Api {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Api {
    async fn start(redis: &TestRedis) -> Api {
        let config = gaffer::config::parse(&config_text(), "ids-test.toml").unwrap();
        let mut opts = ApiOptions::new(config, redis.url());
        opts.listen = Some("127.0.0.1:0".parse().unwrap());
        let stop = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(gaffer::api::run(opts, stop.clone(), Some(tx)));
        let addr = rx.await.expect("the api binds");
        Api { addr, stop, task }
    }

    async fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, body) =
            request(self.addr, method, path, Some(OPS), body.map(str::as_bytes)).await;
        let json = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
        (status, json)
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Gives the waiting task `from` (priority 0, submitted `by`) of `queue` the id `to` in
/// Redis itself, past every check: what an older build wrote when it took any id. A task
/// still delayed (kept from a running slot while it is renamed) is made due at once, and
/// an idle taker woken.
pub(crate) async fn rename_waiting_task(
    client: &QueueClient,
    queue: &str,
    (from, to): (&str, &str),
    by: Option<&str>,
) {
    let k = |suffix: &str| format!("{}:{{{queue}}}:{suffix}", client.namespace());
    let script = redis::Script::new(
        r"
        local from, to = ARGV[1], ARGV[2]
        for _, h in ipairs({KEYS[1], KEYS[2]}) do
          local v = redis.call('HGET', h, from)
          if v then redis.call('HSET', h, to, v); redis.call('HDEL', h, from) end
        end
        local at = redis.call('LPOS', KEYS[3], from)
        if at then
          redis.call('LSET', KEYS[3], at, to)
        elseif redis.call('ZREM', KEYS[7], from) == 1 then
          -- due now, waking an idle taker as an enqueue does
          redis.call('ZADD', KEYS[7], 0, to)
          redis.call('RPUSH', KEYS[9], '1')
        else
          return 0
        end
        if redis.call('EXISTS', KEYS[4]) == 1 then redis.call('RENAME', KEYS[4], KEYS[5]) end
        for _, z in ipairs({KEYS[6], KEYS[8]}) do
          local seq = redis.call('ZSCORE', z, from)
          if seq then redis.call('ZREM', z, from); redis.call('ZADD', z, seq, to) end
        end
        return 1
        ",
    );
    let moved: i64 = script
        .key(k("payload"))
        .key(k("meta"))
        .key(k("ready:0"))
        .key(k(&format!("r:{from}")))
        .key(k(&format!("r:{to}")))
        .key(k("idx"))
        .key(k("delayed"))
        .key(k(&format!("idx:{}", by.unwrap_or_default())))
        .key(k("wake"))
        .arg(from)
        .arg(to)
        .invoke_async(&mut client.connection())
        .await
        .unwrap();
    assert_eq!(
        moved, 1,
        "task {from:?} waits in {queue}'s priority 0, or is delayed"
    );
}

/// `gaffer ARGS` with the test config against `redis`.
fn gaffer(redis: &TestRedis, dir: &tempfile::TempDir, args: &[&str]) -> Output {
    let config = dir.path().join("config.toml");
    std::fs::write(&config, config_text()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&config)
        .arg("--redis")
        .arg(redis.url())
        .args(args)
        .output()
        .unwrap()
}

/// The first character a terminal would take as a command or an invisible reordering:
/// C0 but the line break, DEL, C1, a bidi override.
fn raw_control(text: &str) -> Option<char> {
    text.chars()
        .find(|&c| (c.is_control() && c != '\n') || c == '\u{202e}')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_holding_control_characters_are_refused_where_ids_enter() {
    let redis = TestRedis::start();
    let api = Api::start(&redis).await;
    for id in [EVIL_ID, "nul\u{0}", "del\u{7f}", "c1\u{9b}2J", "tab\tid"] {
        let body = json!({"payload": 1, "id": id}).to_string();
        let (status, doc) = api
            .call("POST", "/v1/queues/emails/tasks", Some(&body))
            .await;
        assert_eq!(status, 400, "{id:?}: {doc}");
        let error = doc["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("control character") && error.contains("C0, DEL or C1"),
            "{id:?}: {doc}"
        );
        // In a bulk submit, one such id refuses the whole body.
        let body = json!({"tasks": [{"payload": 1, "id": "fine"}, {"payload": 2, "id": id}]});
        let (status, doc) = api
            .call("POST", "/v1/queues/emails/tasks", Some(&body.to_string()))
            .await;
        assert_eq!(status, 400, "{id:?}: {doc}");
        assert!(
            doc["error"]
                .as_str()
                .unwrap_or_default()
                .contains("control character")
        );
    }
    let (status, doc) = api.call("GET", "/v1/queues/emails/tasks/fine", None).await;
    assert_eq!(status, 404, "nothing of a refused bulk was enqueued: {doc}");

    let dir = tempfile::tempdir().unwrap();
    let out = gaffer(
        &redis,
        &dir,
        &["push", "emails", "--payload", "{}", "--id", EVIL_ID],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("control character"), "{stderr}");
    assert_eq!(
        raw_control(&stderr),
        None,
        "the refusal quotes the id escaped: {stderr:?}"
    );
    let stats = redis
        .client()
        .await
        .queue("emails")
        .unwrap()
        .stats()
        .await
        .unwrap();
    assert_eq!(stats.enqueued_total, 0);
    api.stop().await;
}

/// A dead letter whose id, error, host and payload hold control characters, written as an
/// older build could have: `tasks list`, `tasks show` and `tasks dead` print each escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_shows_control_characters_of_old_records_escaped() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let q = client.queue("emails").unwrap();
    q.enqueue(NewTask::new(&b"raw\x1b[2Jpayload\x9b"[..]).id("placeholder"))
        .await
        .unwrap();
    rename_waiting_task(&client, "emails", ("placeholder", EVIL_ID), None).await;
    let w = q.clone().with_worker(Worker {
        host: "h\u{1b}[31m1".into(),
        slot: 2,
    });
    let b = w.take(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    assert_eq!(b.tasks[0].id, EVIL_ID);
    let fail = Settle::Fail {
        reason: "boom\u{1b}]0;t\u{7}\u{9b}2J \u{202e}gnp.exe".into(),
    };
    w.settle(&[SettleOp::new(&b.tasks[0], fail)]).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut shown = Vec::new();
    for args in [
        &["tasks", "list", "emails"][..],
        &["tasks", "show", "emails", EVIL_ID],
        &["tasks", "dead", "emails"],
    ] {
        let out = gaffer(&redis, &dir, args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            raw_control(&stdout),
            None,
            "{args:?} printed raw: {stdout:?}"
        );
        assert!(stdout.contains(EVIL_ID_SHOWN), "{args:?}: {stdout}");
        assert!(stdout.contains("boom\\x1b]0;t\\x07"), "{args:?}: {stdout}");
        shown.push(stdout);
    }
    let [_, show, dead] = &shown[..] else {
        unreachable!()
    };
    assert!(show.contains("h\\x1b[31m1/2"), "the history's host: {show}");
    assert!(show.contains("\\u{202e}gnp.exe"), "{show}");
    assert!(
        dead.contains("raw\\x1b[2Jpayload"),
        "the payload's preview: {dead}"
    );
}

/// A task submitted without an id gets one made of URL-unreserved characters only: the
/// id the submit answered goes into the task's URL as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_ids_go_into_a_url_as_they_are() {
    let redis = TestRedis::start();
    let api = Api::start(&redis).await;
    let (status, one) = api
        .call("POST", "/v1/queues/emails/tasks", Some(r#"{"payload": 1}"#))
        .await;
    assert_eq!(status, 202, "{one}");
    let bulk = r#"{"tasks": [{"payload": 2}, {"payload": 3}]}"#;
    let (status, many) = api
        .call("POST", "/v1/queues/emails/tasks", Some(bulk))
        .await;
    assert_eq!(status, 202, "{many}");
    let mut ids = vec![one["id"].as_str().unwrap().to_string()];
    for t in many["tasks"].as_array().unwrap() {
        ids.push(t["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        let unreserved = |c: char| c.is_ascii_alphanumeric() || "-._~".contains(c);
        assert!(id.chars().all(unreserved), "{id:?}");
        assert!(id.starts_with("~g"), "{id:?}");
        let (status, doc) = api
            .call("GET", &format!("/v1/queues/emails/tasks/{id}"), None)
            .await;
        assert_eq!(status, 200, "{id}: {doc}");
        assert_eq!(doc["id"], id.as_str(), "the task, not a listing: {doc}");
    }
    assert_eq!(ids.len(), 3);
    assert!(ids[0] != ids[1] && ids[1] != ids[2]);
    api.stop().await;
}

/// No client id may take the generated form (`~g…`), as none could take the form before
/// it (`#…`); tasks generated as `#N` by an older build are still viewed and cancelled
/// with `%23N`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_forms_are_reserved_and_old_generated_ids_keep_working() {
    let redis = TestRedis::start();
    let api = Api::start(&redis).await;
    for id in ["~g7", "~gadget", "#9"] {
        let body = json!({"payload": 1, "id": id}).to_string();
        let (status, doc) = api
            .call("POST", "/v1/queues/emails/tasks", Some(&body))
            .await;
        assert_eq!(status, 400, "{id}: {doc}");
        assert!(
            doc["error"]
                .as_str()
                .unwrap_or_default()
                .contains("are reserved for generated ids"),
            "{id}: {doc}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = gaffer(
        &redis,
        &dir,
        &["push", "emails", "--payload", "{}", "--id", "~g1"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reserved for generated ids"));
    // `~` elsewhere in a client id is fine.
    let (status, doc) = api
        .call(
            "POST",
            "/v1/queues/emails/tasks",
            Some(r#"{"payload": 1, "id": "a~g1"}"#),
        )
        .await;
    assert_eq!(status, 202, "{doc}");

    let client = redis.client().await;
    let q = client.queue("emails").unwrap();
    for (placeholder, old) in [("old-5", "#5"), ("old-6", "#6")] {
        q.enqueue(NewTask::new("{}").id(placeholder)).await.unwrap();
        rename_waiting_task(&client, "emails", (placeholder, old), None).await;
    }
    let (status, doc) = api.call("GET", "/v1/queues/emails/tasks/%235", None).await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(
        (doc["id"].as_str(), doc["state"].as_str()),
        (Some("#5"), Some("waiting"))
    );
    let (status, doc) = api
        .call("DELETE", "/v1/queues/emails/tasks/%236", None)
        .await;
    assert_eq!(status, 200, "{doc}");
    let (status, doc) = api.call("GET", "/v1/queues/emails/tasks/%236", None).await;
    assert_eq!(
        (status, doc["state"].as_str()),
        (200, Some("cancelled")),
        "{doc}"
    );
    // A new generated id does not take an old one's place: the counter goes on.
    let (status, doc) = api
        .call("POST", "/v1/queues/emails/tasks", Some(r#"{"payload": 1}"#))
        .await;
    assert_eq!(status, 202, "{doc}");
    assert!(doc["id"].as_str().unwrap().starts_with("~g"), "{doc}");
    api.stop().await;
}
