//! The task service against careless clients and a failing Redis (issue 40): HEAD and the
//! forms of the bearer scheme, repeated query parameters, a past `at`, a 413 that reaches
//! a client still sending, connections per peer and without a token, a submit that
//! succeeded whatever happens to its wait, an enqueue whose outcome is unknown, and a
//! record lost while a request waited. A real api instance over a real Redis.

use std::net::SocketAddr;
use std::time::Duration;

use gaffer::api::ApiOptions;
use gaffer::config::Config;
use gaffer::queue_client::ConnectOptions;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::api::{OPS, SHOP, config_text, request, test_config};
use crate::harness::{TestRedis, eventually};

/// Bounds every exchange, so a broken server fails the test instead of hanging it.
const LIMIT: Duration = Duration::from_secs(30);

/// An api instance over `redis` with `[api]` lines added and Redis commands timing out
/// after `response_timeout`.
async fn start(
    redis: &TestRedis,
    api_lines: &str,
    response_timeout: Duration,
) -> (SocketAddr, CancellationToken, Config) {
    let text = config_text("").replace("[api]\n", &format!("[api]\n{api_lines}\n"));
    let config = test_config(&text);
    let mut opts = ApiOptions::new(config.clone(), redis.url());
    opts.listen = Some("127.0.0.1:0".parse().unwrap());
    opts.connect = ConnectOptions {
        response_timeout,
        ..redis.options()
    };
    let stop = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(gaffer::api::run(opts, stop.clone(), Some(tx)));
    (rx.await.expect("the api binds"), stop, config)
}

/// Sends `raw` (a whole request) on a fresh connection and reads the answer to its end.
async fn exchange(addr: SocketAddr, raw: &[u8]) -> String {
    let run = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(raw).await.unwrap();
        let mut out = Vec::new();
        stream.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    };
    tokio::time::timeout(LIMIT, run).await.expect("an answer")
}

fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_bearer_forms_repeated_parameters_and_a_past_at() {
    let redis = TestRedis::start();
    let (addr, stop, _) = start(&redis, "", Duration::from_secs(10)).await;

    // HEAD, as load balancers ask: the status and headers of GET, no body.
    let answer = exchange(
        addr,
        b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(answer.ends_with("\r\n\r\n"), "no body: {answer:?}");
    let answer = exchange(
        addr,
        b"PUT /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 405, "{answer}");
    assert!(
        answer.to_lowercase().contains("allow: get, head"),
        "{answer}"
    );

    // The scheme in any case (RFC 9110); a header with the scheme alone is the empty token.
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let raw = format!(
            "GET /v1/queues HTTP/1.1\r\nHost: x\r\nAuthorization: {scheme} {OPS}\r\nConnection: close\r\n\r\n"
        );
        let answer = exchange(addr, raw.as_bytes()).await;
        assert_eq!(status_of(&answer), 200, "{scheme}: {answer}");
    }
    let answer = exchange(
        addr,
        b"GET /v1/queues HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 401, "{answer}");
    assert!(
        answer.contains(r#"{"error":"empty bearer token"}"#),
        "{answer}"
    );

    // A parameter given twice is refused, not read last-wins.
    let (status, body) = request(
        addr,
        "GET",
        "/v1/queues/emails/tasks?state=failed&limit=5&state=done",
        Some(SHOP),
        None,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        json_of(&body)["error"],
        "query parameter \"state\" given more than once: give each at most once"
    );

    // A past `at` means now: the record's due_at is not before its creation.
    let (status, body) = request(
        addr,
        "POST",
        "/v1/queues/emails/tasks",
        Some(SHOP),
        Some(br#"{"payload": 1, "id": "past", "at": "2001-01-01T00:00:00Z"}"#),
    )
    .await;
    assert_eq!(status, 202, "{}", json_of(&body));
    let (_, body) = request(
        addr,
        "GET",
        "/v1/queues/emails/tasks/past",
        Some(SHOP),
        None,
    )
    .await;
    let rec = json_of(&body);
    let at =
        |field: &str| chrono::DateTime::parse_from_rfc3339(rec[field].as_str().unwrap()).unwrap();
    assert!(at("due_at") >= at("created_at"), "{rec}");
    assert_eq!(rec["state"], "waiting", "{rec}");
    stop.cancel();
}

/// A client that sends its whole body before it reads, as Python's urllib does: the 413
/// must reach it, not a connection reset that drops the answer.
async fn send_whole_then_read(addr: SocketAddr, head: &str, body: &[u8]) -> Result<String, String> {
    let run = async {
        let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        stream
            .write_all(body)
            .await
            .map_err(|e| format!("sending: {e}"))?;
        let mut out = Vec::new();
        stream
            .read_to_end(&mut out)
            .await
            .map_err(|e| format!("reading: {e}"))?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(LIMIT, run).await.expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_still_sending_an_over_limit_body_receives_the_413() {
    let redis = TestRedis::start();
    let (addr, stop, _) = start(&redis, "", Duration::from_secs(10)).await;
    // 3 MiB against the tests' 2 KiB max_body: far more than a socket buffer holds.
    let body = vec![b' '; 3 << 20];
    for round in 0..5 {
        let head = format!(
            "POST /v1/queues/emails/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SHOP}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let answer = send_whole_then_read(addr, &head, &body).await;
        let answer = answer.unwrap_or_else(|e| panic!("round {round}, declared length: {e}"));
        assert_eq!(status_of(&answer), 413, "{answer}");
        assert!(answer.contains("([api].max_body)"), "{answer}");
        // The same sent chunked, with no length to refuse it by beforehand.
        let head = format!(
            "POST /v1/queues/emails/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SHOP}\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        let mut chunked = format!("{:x}\r\n", body.len()).into_bytes();
        chunked.extend_from_slice(&body);
        chunked.extend_from_slice(b"\r\n0\r\n\r\n");
        let answer = send_whole_then_read(addr, &head, &chunked).await;
        let answer = answer.unwrap_or_else(|e| panic!("round {round}, chunked: {e}"));
        assert_eq!(status_of(&answer), 413, "{answer}");
    }
    // A client that waits for 100 Continue gets the 413 at once, having sent nothing.
    let head = format!(
        "POST /v1/queues/emails/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SHOP}\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let answer = exchange(addr, head.as_bytes()).await;
    assert_eq!(status_of(&answer), 413, "{answer}");
    stop.cancel();
}

/// Opens a connection and makes one authenticated keep-alive request on it.
async fn authenticated_connection(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    assert_eq!(keep_alive_get(&mut stream, Some(OPS)).await, 200);
    stream
}

/// One keep-alive `GET /v1/queues` on `stream`: its status.
async fn keep_alive_get(stream: &mut TcpStream, token: Option<&str>) -> u16 {
    let mut raw = "GET /v1/queues HTTP/1.1\r\nHost: x\r\n".to_string();
    if let Some(t) = token {
        raw.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    raw.push_str("\r\n");
    let run = async {
        stream.write_all(raw.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            if stream.read(&mut b).await.unwrap() == 0 {
                return 0;
            }
            head.push(b[0]);
        }
        let text = String::from_utf8_lossy(&head).to_lowercase();
        let len: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).await.unwrap();
        status_of(&text)
    };
    tokio::time::timeout(LIMIT, run).await.expect("an answer")
}

/// Whether the server closed `stream`: reads until the end, within the limit.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(LIMIT, stream.read_to_end(&mut rest)).await,
        Ok(Ok(_)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_may_hold_only_its_share_of_connections() {
    let redis = TestRedis::start();
    let (addr, stop, _) = start(
        &redis,
        "max_connections_per_peer = 3",
        Duration::from_secs(10),
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(authenticated_connection(addr).await);
    }
    let answer = exchange(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status_of(&answer), 429, "{answer}");
    assert!(
        answer.contains(
            "too many connections from this address: the limit is 3 ([api].max_connections_per_peer)"
        ),
        "{answer}"
    );
    // The held connections still serve; once one closes, a new one is served again.
    assert_eq!(keep_alive_get(&mut held[0], Some(OPS)).await, 200);
    drop(held.pop());
    eventually(LIMIT, "a connection is served once one closed", || async {
        let answer = exchange(
            addr,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        status_of(&answer) == 200
    })
    .await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_an_authenticated_request_is_closed_after_auth_timeout() {
    let redis = TestRedis::start();
    let (addr, stop, _) = start(
        &redis,
        "auth_timeout = \"1s\"\nread_timeout = \"5m\"",
        Duration::from_secs(10),
    )
    .await;
    // Opened first, authenticated: it stays past the deadline the others are closed at.
    let mut authed = authenticated_connection(addr).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut refused = TcpStream::connect(addr).await.unwrap();
    assert_eq!(keep_alive_get(&mut refused, Some("wrong")).await, 401);
    assert!(
        closed_by_server(&mut silent).await,
        "a silent connection is closed"
    );
    assert!(
        closed_by_server(&mut refused).await,
        "one with only refused requests too"
    );
    assert_eq!(keep_alive_get(&mut authed, Some(OPS)).await, 200);
    stop.cancel();
}

/// A sync submit of task `id` to emails with a wait of 10 s, sent from its own task, once
/// it waits (its id is in the queue's watch set).
async fn waiting_sync_submit(
    addr: SocketAddr,
    redis: &TestRedis,
    id: &'static str,
) -> tokio::task::JoinHandle<(u16, Vec<u8>)> {
    let body = format!(r#"{{"payload": 1, "id": "{id}", "wait": "10s"}}"#);
    let waiting = tokio::spawn(async move {
        let path = "/v1/queues/emails/tasks";
        request(addr, "POST", path, Some(SHOP), Some(body.as_bytes())).await
    });
    let raw = redis.raw().await;
    eventually(LIMIT, "the request waits", || {
        let mut raw = raw.clone();
        async move {
            redis::cmd("SISMEMBER")
                .arg("test:{emails}:watch")
                .arg(id)
                .query_async::<bool>(&mut raw)
                .await
                .unwrap_or(false)
        }
    })
    .await;
    waiting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_whose_outcome_is_unknown_says_so_and_an_enqueued_one_answers_202() {
    let redis = TestRedis::start();
    let (addr, stop, _) = start(&redis, "", Duration::from_secs(1)).await;
    let submit = |body: &'static str| async move {
        let (status, body) = request(
            addr,
            "POST",
            "/v1/queues/emails/tasks",
            Some(SHOP),
            Some(body.as_bytes()),
        )
        .await;
        (status, json_of(&body))
    };

    // Redis frozen under the enqueue: the command was sent, so nobody knows whether it ran.
    redis
        .server
        .signal(nix::sys::signal::Signal::SIGSTOP)
        .unwrap();
    let (status, body) = submit(r#"{"payload": 1, "id": "frozen-1"}"#).await;
    redis
        .server
        .signal(nix::sys::signal::Signal::SIGCONT)
        .unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["outcome"], "unknown", "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("retry with the same id"),
        "{body}"
    );
    // It ran once Redis resumed: the retry the answer asks for finds it, once.
    eventually(LIMIT, "the retry is answered", || async {
        let (status, body) = submit(r#"{"payload": 1, "id": "frozen-1"}"#).await;
        status == 202 && body["created"] == false
    })
    .await;

    // A sync submit whose wait fails after the enqueue: 202 with the id, never a 503.
    let waiting = waiting_sync_submit(addr, &redis, "waits").await;
    redis
        .server
        .signal(nix::sys::signal::Signal::SIGSTOP)
        .unwrap();
    let answered = tokio::time::timeout(LIMIT, waiting).await;
    redis
        .server
        .signal(nix::sys::signal::Signal::SIGCONT)
        .unwrap();
    let (status, body) = answered.expect("an answer").unwrap();
    let body = json_of(&body);
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["id"], "waits", "{body}");
    assert_eq!(body["created"], true, "{body}");
    assert!(
        body["wait_error"]
            .as_str()
            .unwrap()
            .starts_with("redis unreachable"),
        "{body}"
    );
    eventually(LIMIT, "the task is there once Redis resumed", || async {
        let (status, body) = request(
            addr,
            "GET",
            "/v1/queues/emails/tasks/waits",
            Some(SHOP),
            None,
        )
        .await;
        status == 200 && json_of(&body)["state"] == "waiting"
    })
    .await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_lost_during_a_wait_is_said_to_be_lost() {
    let mut redis = TestRedis::start();
    let (addr, stop, _) = start(&redis, "", Duration::from_secs(2)).await;
    let waiting = waiting_sync_submit(addr, &redis, "lost").await;
    // Restarted without its data (no AOF, no RDB): the record is gone.
    redis.server.restart().unwrap();
    let (status, body) = tokio::time::timeout(LIMIT, waiting)
        .await
        .expect("an answer")
        .unwrap();
    let body = json_of(&body);
    assert_eq!(status, 404, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.starts_with("task lost of queue emails has no record any more: redis lost it"),
        "{body}"
    );
    assert!(!error.contains("track = false"), "{body}");
    stop.cancel();
}
