//! The api under load (issue 40, items 6 and 8): a listing's work per Redis call is
//! bounded and a key's concurrent listings are limited; a resent bulk and a `chain: true`
//! bulk go in a few batched calls, not one round trip per task. Redis's own counters
//! cannot tell the commands a client sent from those its scripts ran, so the api talks to
//! Redis through a [`Tap`], a proxy that counts what it sends (and can hold it).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gaffer::api::hash_token;
use gaffer::config::Config;
use gaffer::queue_client::{LIST_CALL_BUDGET, NewTask, Queue, QueueLimits};
use gaffer::redis_server::RedisServerOptions;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::api::{request, start_api};
use crate::harness::{TestRedis, eventually, gaffer_ok, script_calls};

const OPS: &str = "ops-token";
const SHOP: &str = "shop-token";

/// A TCP proxy in front of Redis: it counts the commands its clients send, by name, and
/// holds them (forwards nothing) while closed.
struct Tap {
    addr: SocketAddr,
    sent: Arc<Mutex<BTreeMap<String, u64>>>,
    open: watch::Sender<bool>,
}

impl Tap {
    async fn start(redis: SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = Arc::new(Mutex::new(BTreeMap::new()));
        let (open, _) = watch::channel(true);
        let (counts, gate) = (sent.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(redis).await.unwrap();
                tokio::spawn(relay(client, server, counts.clone(), gate.subscribe()));
            }
        });
        Tap { addr, sent, open }
    }

    fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Commands sent so far: all of them, and those named `name`.
    fn sent(&self, name: &str) -> (u64, u64) {
        let sent = self.sent.lock().unwrap();
        (sent.values().sum(), sent.get(name).copied().unwrap_or(0))
    }

    fn hold(&self, closed: bool) {
        self.open.send_replace(!closed);
    }
}

/// One connection through the tap: replies go back as they come; each command is counted
/// when it arrives (held or not) and forwarded once the tap is open.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    sent: Arc<Mutex<BTreeMap<String, u64>>>,
    mut open: watch::Receiver<bool>,
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    let (bytes, mut to_send) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(b) = to_send.recv().await {
            if open.wait_for(|open| *open).await.is_err() || to_server.write_all(&b).await.is_err()
            {
                return;
            }
        }
    });
    let (mut pending, mut chunk) = (Vec::new(), vec![0u8; 64 * 1024]);
    loop {
        let n = match from_client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&chunk[..n]);
        for name in whole_commands(&mut pending) {
            *sent.lock().unwrap().entry(name).or_default() += 1;
        }
        if bytes.send(chunk[..n].to_vec()).is_err() {
            return;
        }
    }
}

/// The names of the whole commands at the front of `buf` (RESP arrays of bulk strings, as
/// clients send them), which are taken out of it; a command cut short stays.
fn whole_commands(buf: &mut Vec<u8>) -> Vec<String> {
    let (mut names, mut at) = (Vec::new(), 0);
    while let Some((name, used)) = one_command(&buf[at..]) {
        names.push(name);
        at += used;
    }
    buf.drain(..at);
    names
}

fn one_command(b: &[u8]) -> Option<(String, usize)> {
    // A number after a type byte, up to CRLF: its value and the bytes it took.
    let number = |b: &[u8]| -> Option<(usize, usize)> {
        let end = b.windows(2).position(|w| w == b"\r\n")?;
        Some((std::str::from_utf8(&b[1..end]).ok()?.parse().ok()?, end + 2))
    };
    assert_eq!(b.first().copied().unwrap_or(b'*'), b'*', "a RESP array");
    let (n, mut at) = number(b)?;
    let mut name = String::new();
    for i in 0..n {
        let (len, used) = number(&b[at..])?;
        at += used;
        if b.len() < at + len + 2 {
            return None;
        }
        if i == 0 {
            name = String::from_utf8_lossy(&b[at..at + len]).to_uppercase();
        }
        at += len + 2;
    }
    Some((name, at))
}

/// A plain Redis (the tap reads its bytes), an api in front of it through a tap, and a
/// queue handle straight to Redis to set the scene.
struct Rig {
    redis: TestRedis,
    tap: Tap,
    addr: SocketAddr,
    queue: Queue,
    _stop: tokio_util::sync::DropGuard,
}

impl Rig {
    async fn start() -> Rig {
        let redis = TestRedis::with(RedisServerOptions::default());
        let tap = Tap::start(SocketAddr::from(([127, 0, 0, 1], redis.server.port()))).await;
        let config = config(&redis);
        let (addr, stop, _task) = start_api(config.clone(), tap.url()).await;
        let client = redis.client().await;
        let queue = client
            .queue_with("q", QueueLimits::from(&config.queues["q"]))
            .unwrap();
        Rig {
            redis,
            tap,
            addr,
            queue,
            _stop: stop.drop_guard(),
        }
    }

    async fn call(&self, method: &str, path: &str, token: &str, body: Option<&Value>) -> Value {
        let body = body.map(|b| b.to_string());
        let (status, raw) = request(
            self.addr,
            method,
            path,
            Some(token),
            body.as_deref().map(str::as_bytes),
        )
        .await;
        let json: Value = serde_json::from_slice(&raw).unwrap();
        assert!(
            (200..300).contains(&status),
            "{method} {path}: {status} {json}"
        );
        json
    }

    async fn script_calls(&self) -> u64 {
        script_calls(self.redis.raw().await).await
    }
}

fn config_text(redis: &TestRedis) -> String {
    format!(
        r#"
[cluster]
redis = "{url}"
namespace = "test"

[queues.q]
handler = "noop"

[api]
max_listings_per_key = 2

[api.keys.ops]
token_sha256 = "{ops}"
admin = true

[api.keys.shop]
token_sha256 = "{shop}"
queues = ["q"]
"#,
        url = redis.url(),
        ops = hash_token(OPS),
        shop = hash_token(SHOP),
    )
}

fn config(redis: &TestRedis) -> Config {
    gaffer::config::parse(&config_text(redis), "hardening-load.toml").unwrap()
}

/// Every page of a listing from `path` (a query without `cursor`): the pages' ids, each
/// page checked for no id seen before.
async fn pages(rig: &Rig, path: &str) -> Vec<Vec<String>> {
    let (mut out, mut seen, mut cursor) = (Vec::new(), BTreeSet::new(), None::<String>);
    loop {
        let at = cursor.map_or(String::new(), |c| format!("&cursor={c}"));
        let page = rig.call("GET", &format!("{path}{at}"), OPS, None).await;
        let ids: Vec<String> = page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_string())
            .collect();
        for id in &ids {
            assert!(seen.insert(id.clone()), "{id} listed twice");
        }
        out.push(ids);
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
    }
}

/// A filter that matches none of 10,000 records goes through them in calls of at most
/// [`LIST_CALL_BUDGET`] entries and pages of at most `limit` (one call of 5,000 held
/// Redis for 25 to 50 ms); following the cursors finds exactly the records of a state
/// mixed in among them; a short page with a cursor goes on; the CLI fills its `--limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_listing_goes_in_bounded_calls_and_finds_exactly_its_tasks() {
    let rig = Rig::start().await;
    let tasks: Vec<NewTask> = (0..10_000)
        .map(|i| NewTask::new("{}").id(format!("t{i}")))
        .collect();
    rig.queue.enqueue_many(&tasks).await.unwrap();
    let frozen: BTreeSet<String> = (0..10_000).step_by(97).map(|i| format!("t{i}")).collect();
    for id in &frozen {
        rig.queue.freeze(id, "held by the test").await.unwrap();
    }

    let calls = rig.script_calls().await;
    let none = pages(&rig, "/v1/queues/q/tasks?state=failed&limit=1000").await;
    let calls = rig.script_calls().await - calls;
    assert!(none.iter().all(Vec::is_empty), "no task has failed");
    // Each page looks at no more than its limit, each call at no more than the budget.
    assert!(none.len() >= 10, "{} pages for 10,000 entries", none.len());
    let least = 10_000_u64.div_ceil(LIST_CALL_BUDGET as u64);
    assert!(calls >= least, "{calls} script calls for 10,000 entries");

    let held = pages(&rig, "/v1/queues/q/tasks?state=frozen&limit=50").await;
    let found: BTreeSet<String> = held.iter().flatten().cloned().collect();
    assert_eq!(found, frozen);
    assert!(
        held.iter().rev().skip(1).any(|p| p.len() < 50),
        "some page before the last came back short, with a cursor"
    );
    // Without a filter a page is full: its calls go on up to its limit.
    let all = rig
        .call("GET", "/v1/queues/q/tasks?limit=1000", OPS, None)
        .await;
    assert_eq!(all["tasks"].as_array().unwrap().len(), 1000);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config_text(&rig.redis)).unwrap();
    let out = gaffer_ok(
        &path,
        &["tasks", "list", "q", "--state", "frozen", "--limit", "200"],
    );
    let listed: BTreeSet<String> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert_eq!(listed, frozen, "{out}");
}

/// A key's listings past `[api].max_listings_per_key` are refused with 429 at once, while
/// its listings are held inside Redis calls (the tap holds them); another key's are not;
/// and once they answer the key lists again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_past_a_keys_limit_are_refused_with_429() {
    let rig = Rig::start().await;
    let list = |token: &'static str| {
        let addr = rig.addr;
        tokio::spawn(async move {
            request(
                addr,
                "GET",
                "/v1/queues/q/tasks?state=failed",
                Some(token),
                None,
            )
            .await
        })
    };
    let (_, before) = rig.tap.sent("FCALL_RO");
    rig.tap.hold(true);
    let held = [list(SHOP), list(SHOP)];
    eventually(
        Duration::from_secs(10),
        "two listings in Redis calls",
        || async { rig.tap.sent("FCALL_RO").1 >= before + 2 },
    )
    .await;
    let (status, body) = request(rig.addr, "GET", "/v1/queues/q/tasks", Some(SHOP), None).await;
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 429, "{body}");
    assert_eq!(
        body,
        json!({"error": "key shop already has 2 listings under way, the limit of \
                         [api].max_listings_per_key: retry once one has answered"})
    );
    // (another key's listing is let in: it reaches Redis)
    let other = list(OPS);
    eventually(
        Duration::from_secs(10),
        "the other key's listing in Redis",
        || async { rig.tap.sent("FCALL_RO").1 >= before + 3 },
    )
    .await;
    rig.tap.hold(false);
    for listing in held.into_iter().chain([other]) {
        assert_eq!(listing.await.unwrap().0, 200);
    }
    rig.call("GET", "/v1/queues/q/tasks", SHOP, None).await;
}

/// A resent bulk of 1,000 tasks answers every dedup hit's state, and a bulk of 1,000
/// `chain: true` tasks claims every chain, each in a few calls: 1,000 in turn before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_bulk_and_a_chain_bulk_go_in_a_few_calls() {
    let rig = Rig::start().await;
    let bulk = |prefix: &str, chain: bool| {
        let tasks: Vec<Value> = (0..1000)
            .map(|i| json!({"payload": i, "id": format!("{prefix}{i}"), "chain": chain}))
            .collect();
        json!({ "tasks": tasks })
    };
    let first = rig
        .call("POST", "/v1/queues/q/tasks", SHOP, Some(&bulk("b", false)))
        .await;
    assert!(
        first["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["created"] == true)
    );
    // Some are running, some frozen by the time they are sent again.
    let taken = rig.queue.take(10, Duration::from_secs(60)).await.unwrap();
    let running: BTreeSet<String> = taken.tasks.iter().map(|t| t.id.clone()).collect();
    for i in (500..1000).step_by(50) {
        rig.queue.freeze(&format!("b{i}"), "held").await.unwrap();
    }

    let sent = |rig: &Rig| rig.tap.sent("").0;
    let (commands, calls) = (sent(&rig), rig.script_calls().await);
    let again = rig
        .call("POST", "/v1/queues/q/tasks", SHOP, Some(&bulk("b", false)))
        .await;
    let (commands, calls) = (sent(&rig) - commands, rig.script_calls().await - calls);
    assert!(
        commands < 50 && calls < 50,
        "{commands} commands, {calls} script calls"
    );
    for (i, t) in again["tasks"].as_array().unwrap().iter().enumerate() {
        let id = format!("b{i}");
        let state = match () {
            () if running.contains(&id) => "running",
            () if i >= 500 && i % 50 == 0 => "frozen",
            () => "waiting",
        };
        assert_eq!(
            t,
            &json!({"id": id, "queue": "q", "state": state, "created": false})
        );
    }

    let mut minted = Vec::new();
    for round in ["new", "resent"] {
        let (commands, calls) = (sent(&rig), rig.script_calls().await);
        let chains = rig
            .call("POST", "/v1/queues/q/tasks", SHOP, Some(&bulk("c", true)))
            .await;
        let (commands, calls) = (sent(&rig) - commands, rig.script_calls().await - calls);
        assert!(
            commands < 50 && calls < 50,
            "{round}: {commands} commands, {calls} script calls"
        );
        let created = round == "new";
        let tasks = chains["tasks"].as_array().unwrap();
        assert!(
            tasks
                .iter()
                .all(|t| t["created"] == created && t["state"] == "waiting"),
            "{round}: {chains}"
        );
        if created {
            minted = tasks
                .iter()
                .map(|t| t["chain"].as_str().unwrap_or_default().to_string())
                .collect();
        }
    }
    let distinct: std::collections::BTreeSet<&String> = minted.iter().collect();
    assert_eq!(distinct.len(), 1000, "every task starts a chain of its own");
    assert!(minted.iter().all(|c| c.starts_with("~cq.")), "{minted:?}");
    for i in [0, 499, 999] {
        let view = rig
            .call("GET", &format!("/v1/chains/{}", minted[i]), SHOP, None)
            .await;
        assert_eq!(view["tasks"][0]["id"], format!("c{i}"), "{view}");
    }
}
