//! Schedules end to end: stored through a real `gaffer api` process and fired by real
//! `gaffer manager` processes on one redis-server, across a failover; the key rules of the
//! schedule endpoints; `gaffer schedules` listing, pausing, resuming and deleting.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gaffer::api::hash_token;
use gaffer::cluster::{self, Keys};
use gaffer::queue_client::{ListQuery, NewTask, Queue};
use gaffer::redis_server::free_port;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::api::{OPS, SHOP, config_text, dump, request, start_api, test_config};
use crate::harness::{TestRedis, eventually, poll_some};
use crate::manager::{Cluster, signal};

/// A key limited to queue `tick`, and an admin key, for a cluster's config.
fn keys_tables() -> String {
    format!(
        "[api.keys.shop]\ntoken_sha256 = \"{}\"\nqueues = [\"tick\"]\n\n\
         [api.keys.ops]\ntoken_sha256 = \"{}\"\nadmin = true\n",
        hash_token(SHOP),
        hash_token(OPS)
    )
}

/// Starts `gaffer api` for cluster `c` on a free port; returns its address once it
/// answers `/healthz`.
async fn api_process(c: &mut Cluster) -> SocketAddr {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port().unwrap())
        .parse()
        .unwrap();
    let child = c
        .gaffer(&["api", "--listen", &addr.to_string()], "api.log")
        .spawn()
        .unwrap();
    c.procs.0.push(child);
    poll_some(Duration::from_secs(20), "the api answers", || async {
        let connect = tokio::net::TcpStream::connect(addr).await;
        match connect {
            Ok(_) => {
                let (status, _) = request(addr, "GET", "/healthz", None, None).await;
                (status == 200).then_some(())
            }
            Err(_) => None,
        }
    })
    .await;
    addr
}

async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Value,
) -> (u16, Value) {
    let body = (!body.is_null()).then(|| body.to_string());
    let (status, raw) = request(
        addr,
        method,
        path,
        Some(token),
        body.as_deref().map(str::as_bytes),
    )
    .await;
    let value = if raw.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&raw).unwrap_or_else(|_| json!(String::from_utf8_lossy(&raw)))
    };
    (status, value)
}

/// The fire moments (ms) of schedule `name` among `ids`, in order.
fn fire_moments(ids: &[String], name: &str) -> Vec<i64> {
    let prefix = format!("schedule:{name}:");
    let mut ms: Vec<i64> = ids
        .iter()
        .filter_map(|id| id.strip_prefix(&prefix)?.parse().ok())
        .collect();
    ms.sort_unstable();
    ms
}

/// The ids of every task `q` has a record of (nothing takes from it in these tests).
async fn record_ids(q: &Queue) -> Vec<String> {
    let mut ids = Vec::new();
    let mut query = ListQuery {
        limit: 1000,
        ..ListQuery::default()
    };
    loop {
        let page = q.list(&query).await.unwrap();
        ids.extend(page.tasks.into_iter().map(|t| t.id));
        match page.next_cursor {
            Some(c) => query.cursor = Some(c),
            None => return ids,
        }
    }
}

/// The acceptance test of stored schedules: one made through the api `every = "2s"` fires
/// exactly once per period while the leading manager is SIGSTOPped and the other takes
/// over (no moment skipped, none twice), and deleting it stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_schedule_fires_once_per_period_across_a_failover_and_stops_when_deleted() {
    let mut c = Cluster::start(&format!(
        "[queues.tick]\nhandler = \"noop\"\n\n{}",
        keys_tables()
    ))
    .await;
    let m1 = c.manager(1);
    let m2 = c.manager(2);
    let api = api_process(&mut c).await;
    let body = json!({"name": "beat", "queue": "tick", "every": "2s", "payload": {"n": 1}});
    let (status, made) = call(api, "POST", "/v1/schedules", SHOP, body).await;
    assert_eq!(status, 201, "{made}");
    let created_ms = made["created_ms"].as_i64().unwrap();
    assert_eq!(made["owner"], "shop");
    assert_eq!(made["next_fire_ms"], created_ms + 2000);
    let q = c.client.queue("tick").unwrap();
    let fires = || async { q.stats().await.unwrap().enqueued_total };
    eventually(Duration::from_secs(20), "two fires", || async {
        fires().await >= 2
    })
    .await;
    let leader = c.leader(m1, m2).await;
    signal(c.pid(leader), Signal::SIGSTOP);
    let stopped_at = fires().await;
    // The lease (3 s) runs out, the standby takes over and catches up.
    eventually(
        Duration::from_secs(30),
        "fires from the standby",
        || async { fires().await >= stopped_at + 4 },
    )
    .await;
    assert_ne!(c.leader(m1, m2).await, leader, "the standby leads");
    signal(c.pid(leader), Signal::SIGCONT);
    let resumed_at = fires().await;
    eventually(
        Duration::from_secs(20),
        "fires with both running",
        || async { fires().await >= resumed_at + 2 },
    )
    .await;
    let (status, _) = call(api, "DELETE", "/v1/schedules/beat", SHOP, Value::Null).await;
    assert_eq!(status, 204);
    let deleted_ms = cluster::now_ms() as i64;
    let at_delete = fires().await;
    // Three periods with nothing more: the absence of fires, bounded.
    let quiet = Instant::now() + Duration::from_secs(6);
    while Instant::now() < quiet {
        assert!(fires().await <= at_delete + 1, "fires after the delete");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ids = record_ids(&q).await;
    assert_eq!(
        ids.len() as u64,
        fires().await,
        "every enqueue is a distinct task"
    );
    let moments = fire_moments(&ids, "beat");
    assert_eq!(moments.len(), ids.len(), "{ids:?}");
    assert!(moments.len() >= 8, "{moments:?}");
    let distinct: BTreeSet<i64> = moments.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        moments.len(),
        "a moment fired twice: {moments:?}"
    );
    assert_eq!(
        (moments[0] - created_ms) % 2000,
        0,
        "moments at whole periods from the creation"
    );
    for pair in moments.windows(2) {
        assert_eq!(pair[1] - pair[0], 2000, "a moment skipped: {moments:?}");
    }
    let last = *moments.last().unwrap();
    assert!(
        last <= deleted_ms,
        "a moment after the delete: {last} > {deleted_ms}"
    );
    assert!(
        last > deleted_ms - 4000,
        "fires stopped before the delete: {last}, deleted at {deleted_ms}"
    );
    let rec = q.record(&ids[0]).await.unwrap().expect("a record");
    assert_eq!(rec.submitted_by.as_deref(), Some("schedule:beat"));
    let claims: Vec<String> = redis::cmd("HKEYS")
        .arg(Keys::new("test").schedules())
        .query_async(&mut c.client.connection())
        .await
        .unwrap();
    assert!(
        !claims.iter().any(|f| f.starts_with("name:beat")),
        "the claim state goes with the schedule: {claims:?}"
    );
}

/// A limited key stores schedules only on its queues and sees, gets and deletes only its
/// own; names are one namespace, and a limited key is not told who holds one. Every
/// refusal names what was wrong and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_key_sees_and_deletes_only_its_own_schedules() {
    const LAB: &str = "lab-token";
    let redis = TestRedis::start();
    let extra = format!(
        "[api.keys.lab]\ntoken_sha256 = \"{}\"\nqueues = [\"emails\"]\n\n\
         [[schedules]]\nname = \"nightly\"\nqueue = \"reports\"\ncron = \"0 3 * * *\"\n",
        hash_token(LAB)
    );
    let config = test_config(&config_text(&extra));
    let (addr, stop, task) = start_api(config, redis.url()).await;
    let body = json!({"name": "shop-beat", "queue": "emails", "every": "1h", "payload": {"a": 1}});
    let (status, made) = call(addr, "POST", "/v1/schedules", SHOP, body.clone()).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["source"], "api");
    assert_eq!(made["state"], "active");
    assert_eq!(made["every"], "1h");
    assert_eq!(made["timezone"], "UTC");
    assert_eq!(made["payload"], json!({"a": 1}));

    let before = dump(&redis).await;
    let refusals = [
        (
            LAB,
            "GET",
            "/v1/schedules/shop-beat",
            Value::Null,
            404,
            "no schedule shop-beat",
        ),
        (
            LAB,
            "DELETE",
            "/v1/schedules/shop-beat",
            Value::Null,
            404,
            "no schedule shop-beat",
        ),
        (
            LAB,
            "GET",
            "/v1/schedules/nightly",
            Value::Null,
            404,
            "no schedule nightly",
        ),
        (
            LAB,
            "POST",
            "/v1/schedules",
            body.clone(),
            409,
            "schedule name shop-beat is taken: choose another",
        ),
        (
            OPS,
            "POST",
            "/v1/schedules",
            body.clone(),
            409,
            "schedule shop-beat exists, made by shop: choose another name",
        ),
        (
            SHOP,
            "POST",
            "/v1/schedules",
            json!({"name": "nightly", "queue": "emails", "every": "1h", "payload": {}}),
            409,
            "schedule name nightly is taken: choose another",
        ),
        (
            SHOP,
            "POST",
            "/v1/schedules",
            json!({"name": "r", "queue": "reports", "every": "1h", "payload": {}}),
            403,
            "key shop may not use queue reports",
        ),
        (
            SHOP,
            "POST",
            "/v1/schedules",
            json!({"name": "r", "queue": "emails", "every": "10ms", "payload": {}}),
            400,
            "every 10ms is shorter than the limit of 1s",
        ),
        (
            SHOP,
            "POST",
            "/v1/schedules",
            json!({"name": "r", "queue": "emails", "every": "1h", "payload": "x".repeat(1100)}),
            413,
            "payload of 1102 bytes exceeds the limit of 1024 bytes of queue emails",
        ),
        (
            OPS,
            "DELETE",
            "/v1/schedules/nightly",
            Value::Null,
            409,
            "schedule nightly is defined in the config: remove its [[schedules]] entry and apply the config",
        ),
    ];
    for (token, method, path, body, want, message) in refusals {
        let (status, got) = call(addr, method, path, token, body).await;
        assert_eq!(
            (status, got["error"].as_str()),
            (want, Some(message)),
            "{method} {path}"
        );
    }
    assert_eq!(dump(&redis).await, before, "a refusal changed redis");

    let (status, listed) = call(addr, "GET", "/v1/schedules", LAB, Value::Null).await;
    assert_eq!((status, listed), (200, json!({"schedules": []})));
    let (_, listed) = call(addr, "GET", "/v1/schedules", SHOP, Value::Null).await;
    let names: Vec<&str> = listed["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["shop-beat"]);
    let (_, listed) = call(addr, "GET", "/v1/schedules", OPS, Value::Null).await;
    let all = listed["schedules"].as_array().unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(
        (&all[0]["name"], &all[0]["source"], &all[0]["owner"]),
        (&json!("nightly"), &json!("config"), &json!("config"))
    );
    assert!(all[0]["next_fire_ms"].as_i64().is_some());

    // A fire of shop's schedule is shop's to see, as a task it submitted; a task under
    // the name from before the schedule was made (another key's schedule of that name,
    // since deleted) is not.
    let created_ms = made["created_ms"].as_i64().unwrap();
    let emails = redis.client().await.queue("emails").unwrap();
    for ms in [created_ms + 3_600_000, created_ms - 3_600_000] {
        let task = NewTask::new(b"{}".to_vec())
            .id(format!("schedule:shop-beat:{ms}"))
            .submitted_by("schedule:shop-beat");
        emails.enqueue(task).await.unwrap();
    }
    let fire = |ms: i64| format!("/v1/queues/emails/tasks/schedule:shop-beat:{ms}");
    let (status, rec) = call(
        addr,
        "GET",
        &fire(created_ms + 3_600_000),
        SHOP,
        Value::Null,
    )
    .await;
    assert_eq!(
        (status, &rec["submitted_by"]),
        (200, &json!("schedule:shop-beat"))
    );
    let (status, _) = call(addr, "GET", &fire(created_ms + 3_600_000), LAB, Value::Null).await;
    assert_eq!(status, 404, "another key's schedule's fire");
    let (status, _) = call(
        addr,
        "GET",
        &fire(created_ms - 3_600_000),
        SHOP,
        Value::Null,
    )
    .await;
    assert_eq!(status, 404, "a fire from before the schedule was made");

    let (status, _) = call(addr, "DELETE", "/v1/schedules/shop-beat", SHOP, Value::Null).await;
    assert_eq!(status, 204);
    let (status, _) = call(addr, "GET", "/v1/schedules/shop-beat", SHOP, Value::Null).await;
    assert_eq!(status, 404);
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// `gaffer schedules` lists the config's and the stored schedules with their next fire;
/// `pause` stops a schedule's fires (the moments skipped are not made up) and `resume`
/// starts them again; `delete` removes a stored one and refuses a config one; an unknown
/// name is bad usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_through_the_cli_stop_and_restart_fires() {
    let mut c = Cluster::start(&format!(
        "[queues.tick]\nhandler = \"noop\"\n\n{}\n\
         [[schedules]]\nname = \"cfg\"\nqueue = \"tick\"\nevery = \"1s\"\npayload = {{}}\n",
        keys_tables()
    ))
    .await;
    c.manager(1);
    let api = api_process(&mut c).await;
    let body = json!({"name": "hourly", "queue": "tick", "cron": "0 * * * *", "payload": {}});
    let (status, made) = call(api, "POST", "/v1/schedules", OPS, body).await;
    assert_eq!(status, 201, "{made}");
    let q = c.client.queue("tick").unwrap();
    let moments = || async { fire_moments(&record_ids(&q).await, "cfg") };
    eventually(Duration::from_secs(20), "two fires of cfg", || async {
        moments().await.len() >= 2
    })
    .await;

    assert_eq!(
        c.cli(&["schedules", "pause", "cfg"]).trim(),
        "schedule cfg paused"
    );
    let paused_ms = cluster::now_ms() as i64;
    let listed: Value = serde_json::from_str(&c.cli(&["schedules", "--json"])).unwrap();
    let list = listed["schedules"].as_array().unwrap();
    let by_name = |name: &str| list.iter().find(|s| s["name"] == name).unwrap().clone();
    let (cfg, hourly) = (by_name("cfg"), by_name("hourly"));
    assert_eq!(
        (&cfg["state"], &cfg["source"]),
        (&json!("paused"), &json!("config"))
    );
    assert_eq!(cfg["next_fire_ms"], Value::Null);
    assert!(cfg["last_fire_ms"].as_i64().is_some());
    assert_eq!(
        (&hourly["state"], &hourly["source"]),
        (&json!("active"), &json!("api"))
    );
    let next = hourly["next_fire_ms"].as_i64().unwrap();
    assert!(next > paused_ms && next % 3_600_000 == 0, "{hourly}");
    let table = c.cli(&["schedules"]);
    assert!(
        table.contains("cfg") && table.contains("every 1s") && table.contains("paused"),
        "{table}"
    );

    // Three seconds paused: no moment after the pause fires.
    let quiet = Instant::now() + Duration::from_secs(3);
    while Instant::now() < quiet {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let during = moments().await;
    assert!(
        during.iter().all(|&ms| ms <= paused_ms),
        "fired while paused: {during:?} (paused at {paused_ms})"
    );
    assert_eq!(
        c.cli(&["schedules", "resume", "cfg"]).trim(),
        "schedule cfg resumed"
    );
    let resumed_ms = cluster::now_ms() as i64;
    eventually(
        Duration::from_secs(20),
        "fires after the resume",
        || async { moments().await.last().is_some_and(|&ms| ms > resumed_ms) },
    )
    .await;
    let after = moments().await;
    assert!(
        !after
            .iter()
            .any(|&ms| ms > paused_ms + 1000 && ms < resumed_ms - 1000),
        "moments skipped while paused were made up: {after:?}"
    );

    let refused = |args: &[&str]| {
        let out = c.gaffer(args, "cli.log").output().unwrap();
        (out.status.code(), c.log("cli.log"))
    };
    let (code, said) = refused(&["schedules", "pause", "nope"]);
    assert_eq!(code, Some(2));
    assert!(said.contains("no schedule nope"), "{said}");
    let (code, said) = refused(&["schedules", "delete", "cfg"]);
    assert_eq!(code, Some(2));
    assert!(said.contains("defined in the config"), "{said}");
    // A config taking a stored schedule's name is not published: one name, one schedule.
    c.write_config(&format!(
        "[queues.tick]\nhandler = \"noop\"\n\n{}\n\
         [[schedules]]\nname = \"hourly\"\nqueue = \"tick\"\nevery = \"1m\"\n",
        keys_tables()
    ));
    let (code, said) = refused(&["config", "apply"]);
    assert_eq!(code, Some(2));
    assert!(
        said.contains("[[schedules]] named hourly already stored through the api"),
        "{said}"
    );
    let out = c.cli(&["schedules", "delete", "hourly"]);
    assert!(out.starts_with("schedule hourly deleted"), "{out}");
    let listed: Value = serde_json::from_str(&c.cli(&["schedules", "--json"])).unwrap();
    assert_eq!(listed["schedules"].as_array().unwrap().len(), 1);
}
