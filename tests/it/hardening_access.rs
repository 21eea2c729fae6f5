//! What a limited api key may learn and touch (issue 40, items 2, 3 and 5): a chain it
//! may not see costs what an unknown one costs and reads as one, and a large chain is
//! read a page at a time; keys that share a queue do not share its ids; and a queue
//! outside a key's list answers alike whether it exists or not. A real api instance on
//! a real redis-server, over real HTTP.

use std::net::SocketAddr;

use gaffer::api::{ApiOptions, hash_token};
use gaffer::config::Config;
use gaffer::queue_client::{NewTask, Queue, QueueLimits, TaskChain};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::harness::TestRedis;

/// Two limited keys sharing queue emails, one limited to reports, and an admin key.
const A: &str = "a-token";
const B: &str = "b-token";
const R: &str = "r-token";
const OPS: &str = "ops-token";

fn config() -> Config {
    let text = format!(
        r#"
[queues.emails]
handler = "noop"

[queues.reports]
handler = "noop"

[queues.secret]
handler = "noop"

[queues.fetch]
handler = "noop"
next = [{{ queue = "parse" }}]

[queues.parse]
handler = "noop"

[api.keys.a]
token_sha256 = "{a}"
queues = ["emails"]

[api.keys.b]
token_sha256 = "{b}"
queues = ["emails"]

[api.keys.r]
token_sha256 = "{r}"
queues = ["reports"]

[api.keys.ops]
token_sha256 = "{ops}"
admin = true
"#,
        a = hash_token(A),
        b = hash_token(B),
        r = hash_token(R),
        ops = hash_token(OPS),
    );
    let mut config = gaffer::config::parse(&text, "hardening-access.toml").unwrap();
    config.cluster.namespace = "test".into();
    config
}

/// An api instance over a fresh Redis.
struct Svc {
    redis: TestRedis,
    addr: SocketAddr,
    config: Config,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Svc {
    async fn start() -> Svc {
        let redis = TestRedis::start();
        let config = config();
        let mut opts = ApiOptions::new(config.clone(), redis.url());
        opts.listen = Some("127.0.0.1:0".parse().unwrap());
        let stop = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(gaffer::api::run(opts, stop.clone(), Some(tx)));
        let addr = rx.await.expect("the api binds");
        Svc {
            redis,
            addr,
            config,
            stop,
            task,
        }
    }

    /// One exchange: status and body as JSON.
    async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&str>,
    ) -> (u16, Value) {
        let (status, body) = crate::api::request(
            self.addr,
            method,
            path,
            Some(token),
            body.map(str::as_bytes),
        )
        .await;
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// One exchange as sent on the wire: the whole answer, its `date` header left out
    /// (the only part that may differ between two identical answers).
    async fn raw(&self, method: &str, path: &str, token: &str, body: &str) -> String {
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Authorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        String::from_utf8(raw)
            .unwrap()
            .split("\r\n")
            .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
            .collect::<Vec<_>>()
            .join("\r\n")
    }

    fn queue(&self, name: &str, client: &gaffer::queue_client::QueueClient) -> Queue {
        client
            .queue_with(name, QueueLimits::from(&self.config.queues[name]))
            .unwrap()
    }

    /// Every command Redis has run, its scripts' commands included (`INFO
    /// commandstats`), less the INFO calls that read it: read on one connection, so no
    /// connection's handshake counts.
    async fn commands_run(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .unwrap();
        info.lines()
            .filter(|l| !l.starts_with("cmdstat_info:"))
            .filter_map(|l| l.split("calls=").nth(1))
            .filter_map(|v| v.split(',').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Every key in Redis with its serialized value.
    async fn dump(&self) -> std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        crate::api::dump(&self.redis).await
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// A chain of key a on queue emails: its global task `big` and `n - 1` follow-ups,
/// enqueued as a slot makes them. Returns the chain's id.
async fn big_chain(s: &Svc, n: usize) -> String {
    let (st, body) = s
        .call(
            "POST",
            "/v1/queues/emails/tasks",
            A,
            Some(r#"{"payload": 1, "id": "big", "chain": true}"#),
        )
        .await;
    assert_eq!(st, 202, "{body}");
    let chain = body["chain"].as_str().expect("the chain's id").to_string();
    let client = s.redis.client().await;
    let kids: Vec<NewTask> = (1..n)
        .map(|i| {
            NewTask::new("{}")
                .id(format!("{chain}~{i}"))
                .chain(TaskChain::FollowUp(chain.clone()))
        })
        .collect();
    s.queue("emails", &client)
        .enqueue_many(&kids)
        .await
        .unwrap();
    chain
}

/// A chain a key may not see answers exactly as an unknown id does, and costs Redis no
/// more: it is decided from the global task before the chain is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_a_key_may_not_see_costs_and_reads_as_an_unknown_one() {
    let s = Svc::start().await;
    let big = big_chain(&s, 3000).await;
    let (st, page) = s
        .call("GET", &format!("/v1/chains/{big}?limit=1"), A, None)
        .await;
    assert_eq!((st, page["tasks"][0]["id"].clone()), (200, json!("big")));
    let mut conn = s.redis.raw().await;
    // (b shares the queue but did not submit the chain; r may not use its queue)
    for token in [B, R] {
        let before = Svc::commands_run(&mut conn).await;
        let foreign = s.raw("GET", &format!("/v1/chains/{big}"), token, "").await;
        let cost = Svc::commands_run(&mut conn).await - before;
        // (the global task's id by its number and its record, and room for the api's own
        // config poll)
        assert!(cost <= 20, "a foreign chain's view ran {cost} commands");
        let bog = "~cemailz.1";
        let unknown = s.raw("GET", &format!("/v1/chains/{bog}"), token, "").await;
        assert!(foreign.starts_with("HTTP/1.1 404"), "{foreign}");
        assert!(
            foreign.ends_with(&format!(r#"{{"error":"no chain {big}"}}"#)),
            "{foreign}"
        );
        assert_eq!(foreign.replace(&big, bog), unknown);
    }
    s.stop().await;
}

/// The owner reads a large chain a page at a time: the pages hold every task once, in
/// the chain's order, and only the last says the state, which counts every page's tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_pages_cover_a_large_chain_exactly() {
    let s = Svc::start().await;
    let big = big_chain(&s, 2501).await;
    // (a task on the first page cancelled: only the last page can say so, from the cursor)
    let (st, _) = s
        .call(
            "DELETE",
            &format!("/v1/queues/emails/tasks/{big}~7"),
            OPS,
            None,
        )
        .await;
    assert_eq!(st, 200);
    let whole = gaffer::chain::read(
        &s.redis.client().await,
        &gaffer::chain::ChainTargets::from_config(&s.config),
        &big,
    )
    .await
    .unwrap()
    .unwrap();
    let expected: Vec<String> = whole.tasks.iter().map(|t| t.member.id.clone()).collect();
    assert_eq!(expected.len(), 2501);
    for (limit, pages) in [(None, 6), (Some(1000), 3)] {
        let mut ids = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen_pages = 0;
        loop {
            let mut path = format!("/v1/chains/{big}?");
            if let Some(l) = limit {
                path.push_str(&format!("limit={l}&"));
            }
            if let Some(c) = &cursor {
                path.push_str(&format!("cursor={c}"));
            }
            let (st, page) = s.call("GET", &path, A, None).await;
            assert_eq!(st, 200, "{page}");
            seen_pages += 1;
            let tasks = page["tasks"].as_array().unwrap();
            assert!(tasks.len() <= limit.unwrap_or(500), "{}", tasks.len());
            ids.extend(tasks.iter().map(|t| t["id"].as_str().unwrap().to_string()));
            match page["next_cursor"].as_str() {
                Some(c) => {
                    assert_eq!(page["state"], Value::Null, "only the last page says");
                    cursor = Some(c.to_string());
                }
                None => {
                    assert_eq!(page["state"], "cancelled", "every page's tasks count");
                    break;
                }
            }
        }
        assert_eq!(seen_pages, pages);
        assert_eq!(ids, expected, "every task once, in the chain's order");
    }
    let (st, page) = s
        .call(
            "GET",
            &format!("/v1/chains/{big}?limit=1000&cursor=x"),
            A,
            None,
        )
        .await;
    assert_eq!(
        (st, page),
        (
            400,
            json!({"error": "cursor \"x\" is not one this api returned"})
        )
    );
    let (st, page) = s
        .call("GET", &format!("/v1/chains/{big}?limit=1001"), A, None)
        .await;
    assert_eq!(
        (st, page),
        (
            400,
            json!({"error": "limit must be a number from 1 to 1000, got \"1001\""})
        )
    );
    s.stop().await;
}

/// Keys that share a queue do not share its ids: another key's id is refused (409,
/// naming neither that key nor the task's state), so no key joins another's task, replaces
/// its ended one or learns its state; the key's own resend dedups as before, and an admin
/// key does what it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_share_a_queue_do_not_share_its_ids() {
    let s = Svc::start().await;
    let submit = |token: &'static str, body: &'static str| {
        s.call("POST", "/v1/queues/emails/tasks", token, Some(body))
    };
    let taken = |id: &str| json!({"error": format!("id {id} is taken in queue emails")});
    assert_eq!(
        submit(B, r#"{"payload": "b", "id": "invoice-42"}"#).await.0,
        202
    );
    // a submits its invoice-42 after b: not deduplicated onto b's payload
    let before = s.dump().await;
    for body in [
        r#"{"payload": "a", "id": "invoice-42"}"#,
        r#"{"payload": "a", "id": "invoice-42", "wait": "1s"}"#,
        r#"{"payload": "a", "id": "invoice-42", "chain": true}"#,
        r#"{"tasks": [{"payload": "a", "id": "a-1"}, {"payload": "a", "id": "invoice-42"}]}"#,
    ] {
        assert_eq!(submit(A, body).await, (409, taken("invoice-42")), "{body}");
    }
    assert_eq!(s.dump().await, before, "the refusals changed nothing");
    // a's ended task: b can neither replace its record nor learn that it ended
    assert_eq!(
        submit(A, r#"{"payload": "a", "id": "done-1"}"#).await.0,
        202
    );
    let (st, rec) = s
        .call("DELETE", "/v1/queues/emails/tasks/done-1", A, None)
        .await;
    assert_eq!((st, rec["state"].clone()), (200, json!("cancelled")));
    assert_eq!(
        submit(B, r#"{"payload": "b", "id": "done-1"}"#).await,
        (409, taken("done-1"))
    );
    let (st, rec) = s
        .call("GET", "/v1/queues/emails/tasks/done-1", A, None)
        .await;
    assert_eq!(
        (st, rec["state"].clone(), rec["submitted_by"].clone()),
        (200, json!("cancelled"), json!("a"))
    );
    // the owner's resend dedups as before, and so does an admin key's
    for token in [B, OPS] {
        assert_eq!(
            submit(token, r#"{"payload": "again", "id": "invoice-42"}"#).await,
            (
                202,
                json!({"id": "invoice-42", "queue": "emails", "state": "waiting", "created": false})
            )
        );
    }
    let (st, rec) = s
        .call("GET", "/v1/queues/emails/tasks/invoice-42", B, None)
        .await;
    assert_eq!((st, rec["submitted_by"].clone()), (200, json!("b")));
    s.stop().await;
}

/// A limited key cannot tell a queue outside its list from a queue that does not exist,
/// on any route that takes a queue; an admin key still can. And a chain submit refused
/// for a name another queue's task holds names neither that task nor its queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_key_cannot_tell_forbidden_queues_from_unknown_ones() {
    let s = Svc::start().await;
    let routes: [(&str, &str, &str); 9] = [
        ("POST", "/v1/queues/Q/tasks", r#"{"payload": 1}"#),
        ("GET", "/v1/queues/Q/tasks", ""),
        ("GET", "/v1/queues/Q/tasks/t1", ""),
        ("DELETE", "/v1/queues/Q/tasks/t1", ""),
        ("POST", "/v1/queues/Q/tasks/t1/freeze", ""),
        ("POST", "/v1/queues/Q/tasks/t1/thaw", ""),
        ("POST", "/v1/queues/Q/pause", ""),
        ("POST", "/v1/queues/Q/resume", ""),
        ("POST", "/v1/queues/Q/intake", r#"{"intake": "closed"}"#),
    ];
    let (st, _) = s
        .call(
            "POST",
            "/v1/queues/secret/tasks",
            OPS,
            Some(r#"{"payload": 1, "id": "t1"}"#),
        )
        .await;
    assert_eq!(st, 202);
    let before = s.dump().await;
    for (method, path, body) in routes {
        // (names of one length: the answers may differ only where they echo the name)
        let forbidden = s.raw(method, &path.replace('Q', "secret"), A, body).await;
        let unknown = s.raw(method, &path.replace('Q', "ghosts"), A, body).await;
        assert!(forbidden.contains(" 403 "), "{method} {path}: {forbidden}");
        assert_eq!(
            forbidden.replace("secret", "ghosts"),
            unknown,
            "{method} {path}"
        );
    }
    assert_eq!(s.dump().await, before, "the refusals changed nothing");
    let (st, body) = s
        .call(
            "POST",
            "/v1/queues/ghosts/tasks",
            OPS,
            Some(r#"{"payload": 1}"#),
        )
        .await;
    assert_eq!((st, body), (404, json!({"error": "unknown queue ghosts"})));

    // A chain's id names its own queue, never another's: the same global id in another
    // queue starts a chain of that queue, and tells nothing of the first.
    let (st, theirs) = s
        .call(
            "POST",
            "/v1/queues/reports/tasks",
            R,
            Some(r#"{"payload": 1, "id": "c1", "chain": true}"#),
        )
        .await;
    assert_eq!(st, 202, "{theirs}");
    let body = json!({"payload": 1, "id": "c1", "chain": true}).to_string();
    let (st, ours) = s
        .call("POST", "/v1/queues/emails/tasks", A, Some(&body))
        .await;
    assert_eq!(st, 202, "{ours}");
    let chain = |v: &Value| v["chain"].as_str().unwrap_or_default().to_string();
    assert!(chain(&theirs).starts_with("~creports."), "{theirs}");
    assert!(chain(&ours).starts_with("~cemails."), "{ours}");
    s.stop().await;
}
