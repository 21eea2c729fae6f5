//! The task service's HTTP API (docs/API.md): a real api instance on a
//! loopback port, a real redis-server, real slots run in-process, over real HTTP. Every
//! status is checked with its body, and refused requests are checked to leave Redis as
//! it was.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use gaffer::api::{ApiOptions, hash_token};
use gaffer::config::Config;
use gaffer::slot::{EXIT_STOPPED, SlotSpec, run_slot};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::harness::{TestRedis, eventually};

pub(crate) const SHOP: &str = "shop-token";
pub(crate) const OPS: &str = "ops-token";

pub(crate) fn config_text(extra: &str) -> String {
    format!(
        r#"
[queues.emails]
handler = "noop"
max_payload = "1KiB"
max_attempts = 2
retry = {{ backoff = "fixed", base = "10ms", max = "10ms" }}

[queues.reports]
handler = "noop"

[queues.bulk]
handler = "noop"
track = false

[api]
max_body = "2KiB"
max_wait = "10s"

[api.keys.shop]
token_sha256 = "{shop}"
queues = ["emails", "bulk"]

[api.keys.ops]
token_sha256 = "{ops}"
admin = true
{extra}
"#,
        shop = hash_token(SHOP),
        ops = hash_token(OPS),
    )
}

/// `text` parsed, in the tests' namespace.
pub(crate) fn test_config(text: &str) -> Config {
    let mut config = gaffer::config::parse(text, "api-test.toml").unwrap();
    config.cluster.namespace = "test".into();
    config
}

/// An api instance on a free port of 127.0.0.1: its address, its stop, its task.
pub(crate) async fn start_api(
    config: Config,
    redis_url: String,
) -> (
    SocketAddr,
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let mut opts = ApiOptions::new(config, redis_url);
    opts.listen = Some("127.0.0.1:0".parse().unwrap());
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(gaffer::api::run(opts, stop.clone(), Some(tx)));
    let addr = rx.await.expect("the api binds");
    (addr, stop, task)
}

/// A submit to `queue` that may wait, sent from its own task: its status and body.
fn submit_in_background(
    addr: SocketAddr,
    queue: &str,
    token: &'static str,
    body: impl Into<String>,
) -> tokio::task::JoinHandle<(u16, Vec<u8>)> {
    let path = format!("/v1/queues/{queue}/tasks");
    let body = body.into();
    tokio::spawn(
        async move { request(addr, "POST", &path, Some(token), Some(body.as_bytes())).await },
    )
}

/// A running api instance over a fresh Redis.
struct Service {
    redis: TestRedis,
    addr: SocketAddr,
    config: Config,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Service {
    async fn start() -> Service {
        let redis = TestRedis::start();
        let config = test_config(&config_text(""));
        let (addr, stop, task) = start_api(config.clone(), redis.url()).await;
        Service {
            redis,
            addr,
            config,
            stop,
            task,
        }
    }

    /// POSTs `body` to queue emails' tasks with `token`.
    async fn submit(&self, token: &str, body: &str) -> (u16, Value) {
        self.call("POST", "/v1/queues/emails/tasks", Some(token), Some(body))
            .await
    }

    /// POSTs an empty body to `path` with `token`: the control endpoints.
    async fn post(&self, path: &str, token: &str) -> (u16, Value) {
        self.call("POST", path, Some(token), Some("")).await
    }

    /// GETs `path` with `token`.
    async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call("GET", path, Some(token), None).await
    }

    /// A sync submit of task `id` to emails with a wait of 10 s, sent from its own task,
    /// once it waits (its id is in the queue's watch set, lua/lib/records.lua).
    async fn waiting_submit(&self, id: &'static str) -> tokio::task::JoinHandle<(u16, Vec<u8>)> {
        let body = format!(r#"{{"payload": 1, "id": "{id}", "wait": "10s"}}"#);
        let waiting = submit_in_background(self.addr, "emails", SHOP, body);
        eventually(Duration::from_secs(10), "the request waits", || async {
            self.is_member("test:{emails}:watch", id).await
        })
        .await;
        waiting
    }

    /// Whether `member` is in the Redis set `key`.
    async fn is_member(&self, key: &str, member: &str) -> bool {
        redis::cmd("SISMEMBER")
            .arg(key)
            .arg(member)
            .query_async(&mut self.redis.raw().await)
            .await
            .unwrap()
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Value) {
        let (status, body) = request(self.addr, method, path, token, body.map(str::as_bytes)).await;
        let json = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
        (status, json)
    }

    /// Runs one slot of `queue` in this process until the returned token is cancelled.
    fn slot(&self, queue: &str) -> (CancellationToken, std::thread::JoinHandle<i32>) {
        let cfg = self.config.queues[queue].clone();
        let handler = gaffer::slot::Registry::builtin().preload(&cfg).unwrap();
        let (report, _events) = UnixDatagram::pair().unwrap();
        let spec = SlotSpec {
            queue: cfg,
            slot: 1,
            redis_url: self.redis.url(),
            namespace: "test".into(),
            connect: Default::default(),
            report: Some(report),
            host: "api-test".into(),
            chains: Default::default(),
            fork_line: None,
        };
        let stop = CancellationToken::new();
        let token = stop.clone();
        (
            stop,
            std::thread::spawn(move || run_slot(spec, handler, Some(token))),
        )
    }

    /// Every key in Redis with its serialized value: equal before and after means a
    /// request changed nothing.
    async fn dump(&self) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        dump(&self.redis).await
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Every key in Redis with its serialized value: equal before and after means a request
/// changed nothing.
pub(crate) async fn dump(redis: &TestRedis) -> BTreeMap<Vec<u8>, Option<Vec<u8>>> {
    let mut conn = redis.raw().await;
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    for k in keys {
        let v: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        out.insert(k, v);
    }
    out
}

/// One HTTP/1.1 exchange on a fresh connection; returns status and body.
pub(crate) async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
) -> (u16, Vec<u8>) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(b) = &bearer {
        headers.push(("Authorization", b.as_str()));
    }
    let reply = exchange(addr, None, method, path, &headers, body.unwrap_or_default()).await;
    (reply.status, reply.body)
}

/// An HTTP answer: its status, headers (names in lower case) and body (de-chunked).
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

/// One HTTP/1.1 exchange on a fresh connection, from the local address `from` when
/// given.
pub(crate) async fn exchange(
    addr: SocketAddr,
    from: Option<IpAddr>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let exchange = async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        if let Some(local) = from {
            socket.bind(SocketAddr::new(local, 0)).unwrap();
        }
        let mut stream = socket.connect(addr).await.unwrap();
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .expect("an answer");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"))
    {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n =
            usize::from_str_radix(std::str::from_utf8(&b[..line_end]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[line_end + 2..line_end + 2 + n]);
        b = &b[line_end + 4 + n..];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_view_list_cancel_freeze_and_thaw() {
    let s = Service::start().await;
    let (st, body) = s
        .submit(
            SHOP,
            r#"{"payload": {"to": "a@b"}, "id": "m1", "delay": "1h"}"#,
        )
        .await;
    assert_eq!(
        (st, body.clone()),
        (
            202,
            json!({"id": "m1", "queue": "emails", "state": "waiting", "created": true})
        )
    );
    // The same id again: a dedup hit names the existing task.
    let (st, body) = s.submit(SHOP, r#"{"payload": 1, "id": "m1"}"#).await;
    assert_eq!(
        (st, body),
        (
            202,
            json!({"id": "m1", "queue": "emails", "state": "waiting", "created": false})
        )
    );

    let (st, rec) = s.get("/v1/queues/emails/tasks/m1", SHOP).await;
    assert_eq!(st, 200);
    assert_eq!(
        (rec["state"].clone(), rec["submitted_by"].clone()),
        (json!("waiting"), json!("shop"))
    );
    assert_eq!(rec["history"].as_array().unwrap().len(), 1);

    let (st, rec) = s.post("/v1/queues/emails/tasks/m1/freeze", SHOP).await;
    assert_eq!((st, rec["state"].clone()), (200, json!("frozen")));
    assert_eq!(rec["history"][1]["note"], json!("frozen by key shop"));
    let (st, rec) = s.post("/v1/queues/emails/tasks/m1/thaw", SHOP).await;
    assert_eq!((st, rec["state"].clone()), (200, json!("waiting")));

    let (st, rec) = s
        .call("DELETE", "/v1/queues/emails/tasks/m1", Some(SHOP), None)
        .await;
    assert_eq!(
        (st, rec["state"].clone()),
        (200, json!("cancelled")),
        "{rec}"
    );
    assert_eq!(
        rec["history"].as_array().unwrap().last().unwrap()["note"],
        json!("cancelled by key shop")
    );
    // Cancelling again says what it is.
    let (st, rec) = s
        .call("DELETE", "/v1/queues/emails/tasks/m1", Some(SHOP), None)
        .await;
    assert_eq!((st, rec["state"].clone()), (200, json!("cancelled")));
    // Thawing a cancelled task is a conflict.
    let (st, body) = s.post("/v1/queues/emails/tasks/m1/thaw", SHOP).await;
    assert_eq!(
        (st, body),
        (
            409,
            json!({"error": "task m1 is cancelled: only a waiting task can be frozen, and only a frozen one thawed"})
        )
    );

    // Bulk, then list newest first, by page, and by state.
    let (st, body) = s.submit(SHOP, r#"{"tasks": [{"payload": 1, "id": "b1"}, {"payload": 2, "id": "b2"}, {"payload": 3, "id": "b3"}]}"#).await;
    assert_eq!(st, 202);
    assert_eq!(task_ids(&body), ["b1", "b2", "b3"]);
    let (st, page) = s.get("/v1/queues/emails/tasks?limit=2", SHOP).await;
    assert_eq!(st, 200);
    assert_eq!(task_ids(&page), ["b3", "b2"]);
    assert!(
        page["tasks"][0].get("history").is_none(),
        "listings carry no history"
    );
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, page) = s
        .get(
            &format!("/v1/queues/emails/tasks?limit=2&cursor={cursor}"),
            SHOP,
        )
        .await;
    assert_eq!(task_ids(&page), ["b1", "m1"]);
    assert_eq!(page["next_cursor"], Value::Null);
    let (_, page) = s.get("/v1/queues/emails/tasks?state=cancelled", SHOP).await;
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_admin_key_sees_only_what_it_submitted() {
    let s = Service::start().await;
    s.submit(OPS, r#"{"payload": 1, "id": "theirs"}"#).await;
    s.submit(SHOP, r#"{"payload": 1, "id": "mine"}"#).await;
    let (_, page) = s.get("/v1/queues/emails/tasks", SHOP).await;
    assert_eq!(task_ids(&page), ["mine"]);
    let (st, body) = s.get("/v1/queues/emails/tasks/theirs", SHOP).await;
    assert_eq!(
        (st, body),
        (404, json!({"error": "no task theirs in queue emails"}))
    );
    let (_, page) = s.get("/v1/queues/emails/tasks", OPS).await;
    assert_eq!(
        page["tasks"].as_array().unwrap().len(),
        2,
        "an admin key sees every task"
    );
    // A submit under another key's id, sync or not, is refused: neither that task's record
    // nor its state (tests/it/hardening_access.rs has the rest of that rule).
    let (st, body) = s
        .submit(SHOP, r#"{"payload": 1, "id": "theirs", "wait": "1s"}"#)
        .await;
    assert_eq!(
        (st, body),
        (409, json!({"error": "id theirs is taken in queue emails"}))
    );
    // An id one key's ended task had, used again by another key: the first key's listing
    // no longer shows it.
    let (st, _) = s
        .call("DELETE", "/v1/queues/emails/tasks/mine", Some(SHOP), None)
        .await;
    assert_eq!(st, 200);
    s.submit(OPS, r#"{"payload": 2, "id": "mine"}"#).await;
    let (_, page) = s.get("/v1/queues/emails/tasks", SHOP).await;
    assert_eq!(task_ids(&page), Vec::<&str>::new());
    // (and its index holds it no more: not only hidden from it)
    let left: Option<f64> = redis::cmd("ZSCORE")
        .arg("test:{emails}:idx:shop")
        .arg("mine")
        .query_async(&mut s.redis.raw().await)
        .await
        .unwrap();
    assert_eq!(left, None);
    let (_, page) = s.get("/v1/queues/emails/tasks", OPS).await;
    assert_eq!(task_ids(&page), ["mine", "theirs"]);
    s.stop().await;
}

/// The ids of a listing or a bulk submit's answer, in order.
fn task_ids(page: &Value) -> Vec<&str> {
    page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect()
}

/// method, path, token, body, the status and the error expected.
type Refusal<'a> = (
    &'a str,
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
    u16,
    &'a str,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_names_what_and_changes_nothing() {
    let s = Service::start().await;
    s.submit(SHOP, r#"{"payload": 1, "id": "x"}"#).await;
    let before = s.dump().await;
    let big_payload = format!(r#"{{"payload": "{}"}}"#, "x".repeat(1500));
    let big_body = format!(r#"{{"payload": "{}"}}"#, "x".repeat(3000));
    let big_chain = format!(
        r#"{{"payload": "{}", "id": "c9", "chain": true}}"#,
        "x".repeat(1500)
    );
    let cases: Vec<Refusal> = vec![
        (
            "POST",
            "/v1/queues/emails/tasks",
            None,
            Some(r#"{"payload": 1}"#),
            401,
            "missing token: send Authorization: Bearer TOKEN",
        ),
        (
            "POST",
            "/v1/queues/emails/tasks",
            Some("wrong"),
            Some(r#"{"payload": 1}"#),
            401,
            "unknown token",
        ),
        (
            "GET",
            "/v1/queues/emails/tasks/x",
            Some("wrong"),
            None,
            401,
            "unknown token",
        ),
        (
            "POST",
            "/v1/queues/reports/tasks",
            Some(SHOP),
            Some(r#"{"payload": 1}"#),
            403,
            "key shop may not use queue reports",
        ),
        (
            "POST",
            "/v1/queues/emails/pause",
            Some(SHOP),
            Some(""),
            403,
            "key shop is not an admin key: this endpoint needs admin = true",
        ),
        (
            "POST",
            "/v1/hosts/h1/drain",
            Some(SHOP),
            Some(""),
            403,
            "key shop is not an admin key: this endpoint needs admin = true",
        ),
        (
            "POST",
            "/v1/queues/nope/tasks",
            Some(OPS),
            Some(r#"{"payload": 1}"#),
            404,
            "unknown queue nope",
        ),
        (
            "GET",
            "/v1/queues/emails/tasks/nope",
            Some(SHOP),
            None,
            404,
            "no task nope in queue emails",
        ),
        ("GET", "/v1/chains/c1", Some(SHOP), None, 404, "no chain c1"),
        (
            "GET",
            "/v2/everything",
            Some(SHOP),
            None,
            404,
            "no such endpoint GET /v2/everything",
        ),
        (
            "POST",
            "/v1/queues/emails/tasks",
            Some(SHOP),
            Some("{"),
            400,
            "body is not valid JSON: EOF while parsing an object at line 1 column 1",
        ),
        (
            "POST",
            "/v1/queues/emails/tasks",
            Some(SHOP),
            Some(r#"{"payload": 1, "colour": 2}"#),
            400,
            "bad task: unknown field `colour`, expected one of `payload`, `id`, `priority`, `delay`, `at`, `max_attempts`, `timeout`, `wait`, `chain`",
        ),
        (
            "POST",
            "/v1/queues/emails/tasks",
            Some(SHOP),
            Some(r#"{"payload": 1, "delay": "soon"}"#),
            400,
            "bad delay \"soon\": expected number at 0; write a duration like \"30s\" or \"5m\"",
        ),
        (
            "GET",
            "/v1/queues/emails/tasks?state=lost",
            Some(SHOP),
            None,
            400,
            "unknown state \"lost\": expected one of waiting, running, done, failed, cancelled, frozen, cancelling",
        ),
        (
            "GET",
            "/v1/queues/emails/tasks?limit=0",
            Some(SHOP),
            None,
            400,
            "limit must be a number from 1 to 1000, got \"0\"",
        ),
        (
            "POST",
            "/v1/queues/emails/tasks",
            Some(SHOP),
            Some(&big_payload),
            413,
            "payload of 1502 bytes exceeds the limit of 1024 bytes of queue emails",
        ),
        (
            "POST",
            "/v1/queues/emails/tasks",
            Some(SHOP),
            Some(&big_body),
            413,
            "request body exceeds the limit of 2.0 KiB ([api].max_body)",
        ),
        // (a chain's global task is claimed before its enqueue: not when it is refused)
        (
            "POST",
            "/v1/queues/emails/tasks",
            Some(SHOP),
            Some(&big_chain),
            413,
            "payload of 1502 bytes exceeds the limit of 1024 bytes of queue emails",
        ),
        (
            "PUT",
            "/v1/queues/emails/tasks",
            Some(SHOP),
            Some(""),
            405,
            "PUT is not allowed on /v1/queues/emails/tasks: use GET, HEAD, POST",
        ),
        (
            "POST",
            "/v1/queues/bulk/tasks",
            Some(SHOP),
            Some(r#"{"payload": 1, "wait": "1s"}"#),
            400,
            "wait needs a record to follow, and queue bulk keeps none (track = false)",
        ),
    ];
    for (method, path, token, body, status, error) in cases {
        let (st, got) = s.call(method, path, token, body).await;
        assert_eq!(
            (st, got),
            (status, json!({ "error": error })),
            "{method} {path}"
        );
    }
    assert_eq!(s.dump().await, before, "refused requests changed nothing");

    // A closed intake: 409, nothing recorded.
    let (st, body) = s
        .call(
            "POST",
            "/v1/queues/emails/intake",
            Some(OPS),
            Some(r#"{"intake": "closed"}"#),
        )
        .await;
    assert_eq!(
        (st, body),
        (
            200,
            json!({"queue": "emails", "intake": "closed", "switched": true})
        )
    );
    let before = s.dump().await;
    for body in [
        r#"{"payload": 1}"#,
        r#"{"payload": 1, "id": "c10", "chain": true}"#,
    ] {
        let (st, body) = s.submit(SHOP, body).await;
        assert_eq!(
            (st, body),
            (
                409,
                json!({"error": "the intake of queue emails is closed: it accepts no new tasks"})
            )
        );
    }
    assert_eq!(s.dump().await, before);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_submit_is_woken_by_the_end_not_by_polling() {
    let s = Service::start().await;
    let waiting = s.waiting_submit("sync").await;
    // While it waits, the api sends Redis nothing: count what the server processes over
    // a while, less our own two INFO calls.
    let before = s.redis.commands_processed().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = s.redis.commands_processed().await - before;
    assert!(during <= 1, "{during} commands while a request waited");
    // A slot handles the task: the request answers 200 with the whole record.
    let (stop, slot) = s.slot("emails");
    let (st, body) = waiting.await.unwrap();
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
    let rec: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((st, rec["state"].clone()), (200, json!("done")));
    assert_eq!(rec["history"].as_array().unwrap().len(), 3);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_answers_202_and_the_task_goes_on() {
    let s = Service::start().await;
    let (st, rec) = s
        .submit(SHOP, r#"{"payload": 1, "id": "slow", "wait": "200ms"}"#)
        .await;
    assert_eq!(
        (st, rec["state"].clone(), rec["id"].clone()),
        (202, json!("waiting"), json!("slow"))
    );
    let (stop, slot) = s.slot("emails");
    eventually(Duration::from_secs(10), "the task ends anyway", || async {
        s.get("/v1/queues/emails/tasks/slow", SHOP).await.1["state"] == json!("done")
    })
    .await;
    stop.cancel();
    slot.join().unwrap();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_health_metrics_and_an_outage() {
    let mut s = Service::start().await;
    let (st, body) = s.call("GET", "/healthz", None, None).await;
    assert_eq!((st, body), (200, json!({"status": "ok"})));
    let (st, body) = s.post("/v1/queues/emails/pause", OPS).await;
    assert_eq!(
        (st, body),
        (200, json!({"queue": "emails", "paused": true}))
    );
    let (st, body) = s.post("/v1/hosts/h9/drain", OPS).await;
    assert_eq!((st, body), (200, json!({"host": "h9", "draining": true})));
    assert!(s.is_member("test:{cluster}:paused", "emails").await);
    let (st, queues) = s.get("/v1/queues", SHOP).await;
    assert_eq!(st, 200);
    assert!(queues["emails"]["ready"].is_number(), "{queues}");
    assert!(
        queues.get("reports").is_none(),
        "shop may not use reports: {queues}"
    );
    let (_, all) = s.get("/v1/queues", OPS).await;
    assert!(
        all["reports"].is_object(),
        "an admin key sees every queue: {all}"
    );
    let (st, _) = s.call("GET", "/metrics", None, None).await;
    assert_eq!(st, 401, "metrics need a token too");
    let (st, body) = request(s.addr, "GET", "/metrics", Some(OPS), None).await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(st, 200);
    assert!(
        text.contains("gaffer_api_requests_total{route=\"queues\",status=\"2xx\"}"),
        "{text}"
    );
    assert!(text.contains("gaffer_api_request_seconds"), "{text}");

    // Redis gone: 503 with the reason, and the api stays up.
    s.redis.server.kill();
    for (st, body) in [
        s.call("GET", "/healthz", None, None).await,
        s.submit(SHOP, r#"{"payload": 1}"#).await,
    ] {
        assert_eq!(st, 503, "{body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("redis unreachable"),
            "{body}"
        );
    }
    s.redis.server.restart().unwrap();
    eventually(Duration::from_secs(20), "healthy again", || async {
        s.call("GET", "/healthz", None, None).await.0 == 200
    })
    .await;
    s.stop().await;
}

/// `GET /status` names the Redis node the instance talks to, behind a token like
/// `/metrics` (any key), and reads nothing from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_status_names_its_redis_node() {
    let s = Service::start().await;
    let (st, _) = s.call("GET", "/status", None, None).await;
    assert_eq!(st, 401, "/status needs a token");
    let (st, status) = s.get("/status", SHOP).await;
    assert_eq!(st, 200, "{status}");
    assert_eq!(
        status["redis"],
        json!({
            "topology": "single",
            "node": format!("127.0.0.1:{}", s.redis.server.port()),
            "failovers": 0,
            "last_failover": null,
        })
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_address_without_keys_is_refused() {
    let redis = TestRedis::start();
    let config = gaffer::config::parse("[queues.q]\nhandler = \"noop\"\n", "t.toml").unwrap();
    let mut opts = ApiOptions::new(config, redis.url());
    opts.listen = Some("0.0.0.0:0".parse().unwrap());
    let err = gaffer::api::run(opts, CancellationToken::new(), None)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "api address 0.0.0.0:0 is not a loopback address; declare at least one [api.keys.NAME] to serve it"
    );
}

/// Keys rotate without a restart: a config published with `gaffer config apply` is
/// adopted within a few seconds, the new token works and a removed one stops working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_config_rotates_keys_without_a_restart() {
    let s = Service::start().await;
    let new_key = format!(
        "\n[api.keys.shop2]\ntoken_sha256 = \"{}\"\nqueues = [\"emails\"]\n",
        hash_token("new-token")
    );
    // The published text names namespace "test", like the running instance.
    let text = format!("[cluster]\nnamespace = \"test\"\n{}", config_text(&new_key));
    let client = s.redis.client().await;
    let keys = gaffer::cluster::Keys::new("test");
    gaffer::cluster::publish_config(&mut client.connection(), &keys, &text)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(15),
        "the new key is adopted",
        || async {
            s.call("GET", "/v1/queues/emails/tasks", Some("new-token"), None)
                .await
                .0
                == 200
        },
    )
    .await;
    let (st, _) = s.get("/v1/queues/emails/tasks", SHOP).await;
    assert_eq!(st, 200, "the old key stays while the config keeps it");
    // The next config drops shop: its token stops working.
    let without_shop = text.replace(
        &format!(
            "[api.keys.shop]\ntoken_sha256 = \"{}\"\nqueues = [\"emails\", \"bulk\"]\n",
            hash_token(SHOP)
        ),
        "",
    );
    assert_ne!(without_shop, text);
    gaffer::cluster::publish_config(&mut client.connection(), &keys, &without_shop)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(15),
        "the removed key is refused",
        || async { s.get("/v1/queues/emails/tasks", SHOP).await.0 == 401 },
    )
    .await;
    s.stop().await;
}

/// On a Redis Cluster the end of a task is published by the script on the queue's node
/// and reaches the api's subscription on another: a sync submit is woken there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_submit_is_woken_on_a_redis_cluster() {
    let url = crate::harness::shared_cluster_url();
    let text = format!(
        "[queues.cluster_api_sync]\nhandler = \"noop\"\n\n[api.keys.ops]\ntoken_sha256 = \"{}\"\nadmin = true\n",
        hash_token(OPS)
    );
    let (addr, stop, task) = start_api(test_config(&text), url.clone()).await;
    let waiting = submit_in_background(
        addr,
        "cluster_api_sync",
        OPS,
        r#"{"payload": 1, "id": "sync", "wait": "20s"}"#,
    );
    let client = crate::harness::shared_cluster_client().await;
    let q = client.queue("cluster_api_sync").unwrap();
    eventually(Duration::from_secs(10), "the request waits", || async {
        redis::cmd("SISMEMBER")
            .arg("test:{cluster_api_sync}:watch")
            .arg("sync")
            .query_async::<bool>(&mut client.connection())
            .await
            .unwrap()
    })
    .await;
    let b = q.take(1, Duration::from_secs(30)).await.unwrap();
    q.ack(&b.tasks).await.unwrap();
    let (st, body) = waiting.await.unwrap();
    let rec: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((st, rec["state"].clone()), (200, json!("done")), "{rec}");
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// A client that sends its request's head or body too slowly, or keeps a connection idle,
/// is cut off after `[api].read_timeout`: the stalled head's connection is closed, the
/// stalled body's answered 408 naming the limit, the idle keep-alive connection closed
/// after its answer. Without the timeout each would hold its connection for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_cut_off_after_the_read_timeout() {
    let redis = TestRedis::start();
    let text = config_text("").replace(
        "max_wait = \"10s\"",
        "max_wait = \"10s\"\nread_timeout = \"1s\"",
    );
    let (addr, stop, task) = start_api(test_config(&text), redis.url()).await;
    let open = |first: String| async move {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(first.as_bytes()).await.unwrap();
        conn
    };
    let head = open("GET /healthz HTTP/1.1\r\nHost: t\r\n".into()).await;
    let body = open(format!(
        "POST /v1/queues/emails/tasks HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {SHOP}\r\n\
         Content-Length: 100\r\n\r\n{{\"payload\""
    ))
    .await;
    let idle = open(format!(
        "GET /healthz HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {OPS}\r\n\r\n"
    ))
    .await;
    // Everything the server sends until it closes the connection.
    let until_closed = |mut conn: TcpStream| async move {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut got))
            .await
            .expect("the server closes the connection")
            .unwrap();
        String::from_utf8_lossy(&got).into_owned()
    };
    let (head, body, idle) =
        tokio::join!(until_closed(head), until_closed(body), until_closed(idle));
    assert!(!head.starts_with("HTTP/1.1 2"), "{head}");
    assert!(body.starts_with("HTTP/1.1 408"), "{body}");
    assert!(body.to_lowercase().contains("connection: close"), "{body}");
    assert!(
        body.contains("the request body did not arrive within 1s ([api].read_timeout)"),
        "{body}"
    );
    assert!(idle.starts_with("HTTP/1.1 200"), "{idle}");
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// A queue that keeps no records (`track = false`): an admin key still sees, freezes,
/// thaws and cancels its tasks from what the queue holds (`{id, queue, state}`); any other
/// key, whose ownership no record can show, gets 404 as for a task it cannot see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_key_sees_freezes_and_cancels_tasks_of_an_untracked_queue() {
    let s = Service::start().await;
    let path = "/v1/queues/bulk/tasks";
    let (st, body) = s
        .call(
            "POST",
            path,
            Some(SHOP),
            Some(r#"{"payload": 1, "id": "u1"}"#),
        )
        .await;
    assert_eq!(st, 202, "{body}");
    let task = "/v1/queues/bulk/tasks/u1";
    let (st, body) = s.get(task, SHOP).await;
    assert_eq!(st, 404, "{body}");
    let answer = |state: &str| json!({"id": "u1", "queue": "bulk", "state": state});
    assert_eq!(s.get(task, OPS).await, (200, answer("waiting")));
    assert_eq!(
        s.post(&format!("{task}/freeze"), OPS).await,
        (200, answer("frozen"))
    );
    let (st, body) = s.post(&format!("{task}/freeze"), OPS).await;
    assert_eq!(st, 200, "freezing twice is harmless: {body}");
    assert_eq!(
        s.post(&format!("{task}/thaw"), OPS).await,
        (200, answer("waiting"))
    );
    let (st, body) = s.post(&format!("{task}/thaw"), OPS).await;
    assert_eq!(st, 200, "thawing twice is harmless: {body}");
    assert_eq!(
        s.call("DELETE", task, Some(OPS), None).await,
        (200, answer("cancelled"))
    );
    let (st, body) = s.get(task, OPS).await;
    assert_eq!(st, 404, "{body}");
    let (st, body) = s.call("DELETE", task, Some(OPS), None).await;
    assert_eq!(st, 404, "{body}");
    // A dead letter has ended (it failed): a cancel leaves it, to be requeued.
    let bulk = s.redis.client().await.queue("bulk").unwrap();
    bulk.enqueue(gaffer::queue_client::NewTask::new("2").id("u2"))
        .await
        .unwrap();
    let taken = bulk.take(1, Duration::from_secs(30)).await.unwrap();
    let fail = gaffer::queue_client::Settle::Fail {
        reason: "bad".into(),
    };
    bulk.settle(&[gaffer::queue_client::SettleOp::new(&taken.tasks[0], fail)])
        .await
        .unwrap();
    let dead = "/v1/queues/bulk/tasks/u2";
    let failed = json!({"id": "u2", "queue": "bulk", "state": "failed"});
    assert_eq!(s.call("DELETE", dead, Some(OPS), None).await, (200, failed));
    assert_eq!(bulk.stats().await.unwrap().dead, 1, "the dead letter stays");
    s.stop().await;
}

/// A body refused by its declared length is answered 413 at once, before any of it is
/// read, with `Connection: close`, and the connection closed: the client learns to stop
/// sending rather than meet a reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_before_it_is_sent_and_the_connection_closed() {
    let s = Service::start().await;
    let mut conn = TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "POST /v1/queues/emails/tasks HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {SHOP}\r\n\
         Content-Length: 10000000\r\nExpect: 100-continue\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut got))
        .await
        .expect("the server answers and closes")
        .unwrap();
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(!got.contains("100 Continue"), "{got}");
    assert!(got.to_lowercase().contains("connection: close"), "{got}");
    assert!(
        got.contains("request body exceeds the limit of 2.0 KiB ([api].max_body)"),
        "{got}"
    );
    s.stop().await;
}

/// Stopping the instance answers a sync submit that waits at once, with its record as it
/// stands (202: not ended), rather than cutting the connection or holding the stop for
/// the whole wait; the task itself stays in Redis to be looked up later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_answers_a_waiting_sync_submit_at_once() {
    let s = Service::start().await;
    let waiting = s.waiting_submit("held").await;
    let client = s.redis.client().await;
    s.stop.cancel();
    let (st, body) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("answered within the stop's grace, not at the wait's end")
        .unwrap();
    let rec: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((st, rec["state"].clone()), (202, json!("waiting")), "{rec}");
    s.task.await.unwrap().unwrap();
    let q = client.queue("emails").unwrap();
    assert_eq!(q.stats().await.unwrap().ready, 1, "the task stays");
}

/// An api serves at most three quarters of its descriptor limit's connections at once
/// (`http::max_connections`), so its own (Redis, files) never run out: one connection
/// more is held in the listen backlog, unanswered, until one closes, then served.
#[tokio::test]
async fn connections_past_the_cap_wait_until_one_closes() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    use std::os::unix::process::CommandExt;
    // A soft limit of 100 descriptors: 75 connections at once.
    const CAP: usize = 75;
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let port = gaffer::redis_server::free_port().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n[queues.a]\nhandler = \"noop\"\n\n\
             [api]\nlisten = \"127.0.0.1:{port}\"\n",
            redis.url()
        ),
    )
    .unwrap();
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"));
    cmd.arg("--config")
        .arg(&config)
        .arg("api")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("api.log")).unwrap());
    // SAFETY: setrlimit is a system call: async-signal-safe, no allocation.
    unsafe {
        cmd.pre_exec(move || {
            setrlimit(Resource::RLIMIT_NOFILE, 100, hard).map_err(std::io::Error::from)
        });
    }
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _api = Killed(cmd.spawn().unwrap());
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    eventually(Duration::from_secs(20), "the api answering", || async {
        TcpStream::connect(addr).await.is_ok()
    })
    .await;
    // Each connection sends one request and keeps the connection (keep-alive): those
    // served stay open, idle, until the test ends.
    let mut conns = Vec::new();
    for _ in 0..=CAP {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        conns.push((c, false));
    }
    async fn answered(conns: &mut [(TcpStream, bool)]) -> usize {
        let mut buf = [0u8; 512];
        for (c, done) in conns.iter_mut().filter(|(_, done)| !*done) {
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(5), c.read(&mut buf)).await
            {
                assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
                *done = true;
            }
        }
        conns.iter().filter(|(_, done)| *done).count()
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while answered(&mut conns).await < CAP {
        assert!(
            std::time::Instant::now() < deadline,
            "the first {CAP} not all served"
        );
    }
    // Room for the one past the cap to be served, were there no cap.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(answered(&mut conns).await, CAP, "served past the cap");
    let log = std::fs::read_to_string(dir.path().join("api.log")).unwrap();
    assert!(log.contains("http connections at their limit"), "{log}");
    // One closes: the one held is served.
    let served = conns.iter().position(|(_, done)| *done).unwrap();
    drop(conns.remove(served));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while answered(&mut conns).await < CAP {
        assert!(
            std::time::Instant::now() < deadline,
            "the held one never served"
        );
    }
}
