//! The endpoints the web console reads and acts through (docs/API.md): `GET /v1/cluster`,
//! `GET /v1/queues/{queue}`, `GET /v1/tasks/{id}`, the dead letters (listing, requeue,
//! purge) and the retry of a failed task; a real api instance over real HTTP on a real
//! redis-server, with an admin key and two keys limited to some queues. Refusals are
//! checked with their message and, where they could write, to leave Redis as it was.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use gaffer::api::hash_token;
use gaffer::cluster::{HostReport, Keys, QueueReport, SlotMap};
use gaffer::config::Config;
use gaffer::queue_client::{Queue, Settle, SettleOp};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::api::{dump, request, start_api, test_config};
use crate::harness::TestRedis;

const SHOP: &str = "shop-token";
const RIVAL: &str = "rival-token";
const OPS: &str = "ops-token";

/// Three queues in one external system and one outside it; `bulk` keeps no records.
/// `shop` may use emails and bulk, `rival` emails only, `ops` is admin.
fn config_text() -> String {
    format!(
        r#"
[cluster]
namespace = "test"

[systems.partner]
max_concurrency = 4

[systems.mailer]
max_concurrency = 2

[queues.emails]
handler = "exec"
command = ["/bin/cat", "--secret-flag"]
max_attempts = 1
system = "mailer"

[queues.reports]
handler = "noop"
system = "partner"

[queues.bulk]
handler = "noop"
track = false
max_attempts = 1

[api.keys.shop]
token_sha256 = "{shop}"
queues = ["emails", "bulk"]

[api.keys.rival]
token_sha256 = "{rival}"
queues = ["emails"]

[api.keys.ops]
token_sha256 = "{ops}"
admin = true
"#,
        shop = hash_token(SHOP),
        rival = hash_token(RIVAL),
        ops = hash_token(OPS),
    )
}

/// A running api over a fresh Redis.
struct Console {
    redis: TestRedis,
    addr: SocketAddr,
    config: Config,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Console {
    async fn start() -> Console {
        let redis = TestRedis::start();
        let config = test_config(&config_text());
        let (addr, stop, task) = start_api(config.clone(), redis.url()).await;
        Console {
            redis,
            addr,
            config,
            stop,
            task,
        }
    }

    async fn call(&self, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
        let body = (!body.is_empty()).then_some(body.as_bytes());
        let (status, raw) = request(self.addr, method, path, Some(token), body).await;
        let json = serde_json::from_slice(&raw)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into()));
        (status, json)
    }

    async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call("GET", path, token, "").await
    }

    async fn post(&self, path: &str, token: &str, body: &str) -> (u16, Value) {
        self.call("POST", path, token, body).await
    }

    /// Submits task `id` to `queue` as `token`'s key, asserting it was created.
    async fn submit(&self, queue: &str, token: &str, id: &str) {
        let body = format!(r#"{{"payload": {{"n": "{id}"}}, "id": "{id}"}}"#);
        let (st, body) = self
            .post(&format!("/v1/queues/{queue}/tasks"), token, &body)
            .await;
        assert_eq!((st, body["created"].clone()), (202, json!(true)), "{body}");
    }

    /// The queue as the config has it, through the test's own client.
    async fn queue(&self, name: &str) -> Queue {
        let limits = gaffer::queue_client::QueueLimits::from(&self.config.queues[name]);
        let client = self.redis.client().await;
        client.queue_with(name, limits).unwrap()
    }

    /// Takes every waiting task of `queue` and fails it: with one attempt each, they
    /// become dead letters. Returns their ids.
    async fn fail_waiting(&self, queue: &str) -> Vec<String> {
        let q = self.queue(queue).await;
        let batch = q.take(100, Duration::from_secs(60)).await.unwrap();
        let ops: Vec<_> = batch
            .tasks
            .iter()
            .map(|t| {
                let why = format!("{} broke", t.id);
                SettleOp::new(t, Settle::Fail { reason: why })
            })
            .collect();
        q.settle(&ops).await.unwrap();
        batch.tasks.iter().map(|t| t.id.clone()).collect()
    }

    /// Writes a live host's report with `slots` per queue, and a map giving it `mapped`.
    async fn host(&self, name: &str, slots: &[(&str, u32)], mapped: &[(&str, u32)]) {
        let report = HostReport {
            host: name.into(),
            pid: 1,
            ts_ms: gaffer::cluster::now_ms(),
            capacity: 8,
            slots: slots.iter().map(|(_, n)| n).sum(),
            pss_bytes: 4 << 20,
            memory_budget_bytes: 1 << 30,
            queues: slots
                .iter()
                .map(|(q, n)| {
                    let r = QueueReport {
                        slots: *n,
                        ..Default::default()
                    };
                    (q.to_string(), r)
                })
                .collect(),
            ..Default::default()
        };
        let keys = Keys::new("test");
        let mut conn = self.redis.raw().await;
        let () = redis::cmd("HSET")
            .arg(keys.hosts())
            .arg(name)
            .arg(serde_json::to_string(&report).unwrap())
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut client_conn = self.redis.client().await.connection();
        let mut map = gaffer::cluster::read_map(&mut client_conn, &keys)
            .await
            .unwrap()
            .unwrap_or(SlotMap {
                epoch: 1,
                version: 0,
                hosts: Default::default(),
            });
        map.version += 1;
        map.hosts.insert(
            name.into(),
            mapped.iter().map(|(q, n)| (q.to_string(), *n)).collect(),
        );
        gaffer::cluster::write_map_unfenced(&mut client_conn, &keys, &map)
            .await
            .unwrap();
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Calls of gaffer's functions `redis` has run.
async fn calls(redis: &TestRedis) -> u64 {
    crate::harness::script_calls(redis.raw().await).await
}

/// The keys of a JSON object.
fn names(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_is_whole_for_an_admin_and_cut_to_its_queues_for_a_limited_key() {
    let c = Console::start().await;
    c.submit("emails", SHOP, "e1").await;
    c.submit("reports", OPS, "r1").await;
    c.host(
        "h1",
        &[("emails", 2), ("reports", 1)],
        &[("emails", 2), ("reports", 2)],
    )
    .await;
    c.host("h2", &[("reports", 3)], &[("reports", 3)]).await;

    let (st, all) = c.get("/v1/cluster", OPS).await;
    assert_eq!(st, 200, "{all}");
    assert_eq!(names(&all["queues"]), set(&["bulk", "emails", "reports"]));
    assert_eq!(all["queues"]["emails"]["ready"], json!(1), "{all}");
    assert_eq!(all["queues"]["emails"]["intake"], json!("open"), "{all}");
    assert_eq!(all["queues"]["bulk"]["track"], json!(false), "{all}");
    assert_eq!(all["queues"]["reports"]["kind"], json!("batch"), "{all}");
    assert!(all["at_ms"].as_u64().unwrap() > 0, "{all}");
    assert_eq!(names(&all["hosts"]), set(&["h1", "h2"]));
    let h1 = &all["hosts"]["h1"];
    assert_eq!(h1["queues"], json!({"emails": 2, "reports": 1}), "{h1}");
    assert_eq!(h1["mapped"], json!({"emails": 2, "reports": 2}), "{h1}");
    assert_eq!(h1["pss_bytes"], json!(4 << 20), "{h1}");
    assert_eq!(names(&all["systems"]), set(&["mailer", "partner"]));
    assert_eq!(all["systems"]["partner"]["queues"], json!(["reports"]));
    assert_eq!(all["systems"]["partner"]["slots"], json!(4), "{all}");
    assert!(all["manager"]["stale"].as_bool().unwrap(), "{all}");
    assert!(all["manager"].get("map_version").is_some(), "{all}");

    // shop: its queues, the hosts that run them with those queues only, its systems.
    let (st, mine) = c.get("/v1/cluster", SHOP).await;
    assert_eq!(st, 200, "{mine}");
    assert_eq!(names(&mine["queues"]), set(&["bulk", "emails"]));
    assert_eq!(mine["queues"]["emails"]["ready"], json!(1), "{mine}");
    assert_eq!(
        names(&mine["hosts"]),
        set(&["h1"]),
        "h2 runs none of its queues"
    );
    assert_eq!(
        mine["hosts"]["h1"],
        json!({"alive": true, "state": "alive", "draining": false,
               "queues": {"emails": 2}, "mapped": {"emails": 2},
               "queue_pss_bytes": {"emails": 0}})
    );
    assert_eq!(names(&mine["systems"]), set(&["mailer"]));
    assert_eq!(mine["systems"]["mailer"]["queues"], json!(["emails"]));
    assert_eq!(mine["manager"], json!({"stale": true}));
    assert_eq!(mine["retired"], json!({}));
    assert_eq!(mine["drain_marked_unknown_hosts"], json!([]));
    let text = mine.to_string();
    assert!(!text.contains("reports") && !text.contains("h2"), "{text}");

    let (st, body) = c.call("DELETE", "/v1/cluster", OPS, "").await;
    assert_eq!(st, 405, "{body}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_queue_shows_its_figures_where_it_runs_and_its_published_table() {
    let c = Console::start().await;
    c.submit("emails", SHOP, "e1").await;
    c.host("h1", &[("emails", 1)], &[("emails", 2)]).await;

    let (st, q) = c.get("/v1/queues/emails", SHOP).await;
    assert_eq!(st, 200, "{q}");
    assert_eq!(
        (
            &q["name"],
            &q["ready"],
            &q["intake"],
            &q["paused"],
            &q["system"]
        ),
        (
            &json!("emails"),
            &json!(1),
            &json!("open"),
            &json!(false),
            &json!("mailer")
        ),
        "{q}"
    );
    assert_eq!(
        q["hosts"],
        json!({"h1": {"slots": 1, "mapped": 2, "state": "alive"}})
    );
    assert_eq!(
        (&q["config"], &q["config_version"]),
        (&json!(null), &json!(null))
    );
    // Its figures are those of `GET /v1/queues`.
    let (_, all) = c.get("/v1/queues", SHOP).await;
    for field in ["ready", "delayed", "dead", "intake", "paused", "max_slots"] {
        assert_eq!(q[field], all["emails"][field], "{field}");
    }

    // Published: the table as written, and a limited key's without how the handler runs.
    let keys = Keys::new("test");
    let mut conn = c.redis.client().await.connection();
    gaffer::cluster::publish_config(&mut conn, &keys, &config_text())
        .await
        .unwrap();
    let (st, q) = c.get("/v1/queues/emails", OPS).await;
    assert_eq!(st, 200, "{q}");
    assert_eq!(
        (&q["config_version"], &q["config_origin"]),
        (&json!(1), &json!("published")),
        "{q}"
    );
    assert_eq!(
        q["config"],
        json!({"handler": "exec", "command": ["/bin/cat", "--secret-flag"],
               "max_attempts": 1, "system": "mailer"})
    );
    let (_, q) = c.get("/v1/queues/emails", SHOP).await;
    assert_eq!(
        q["config"],
        json!({"handler": "exec", "max_attempts": 1, "system": "mailer"})
    );
    // After a pause and an intake switch, the page says so.
    let (st, _) = c.post("/v1/queues/emails/pause", OPS, "").await;
    assert_eq!(st, 200);
    let (st, _) = c
        .post("/v1/queues/emails/intake", OPS, r#"{"intake": "closed"}"#)
        .await;
    assert_eq!(st, 200);
    let (_, q) = c.get("/v1/queues/emails", SHOP).await;
    assert_eq!(
        (&q["paused"], &q["intake"]),
        (&json!(true), &json!("closed"))
    );

    let (st, body) = c.get("/v1/queues/reports", SHOP).await;
    assert_eq!(
        (st, body),
        (403, json!({"error": "key shop may not use queue reports"}))
    );
    let (st, body) = c.get("/v1/queues/nope", OPS).await;
    assert_eq!((st, body), (404, json!({"error": "unknown queue nope"})));
    c.stop().await;
}

/// A manager that runs from its file, with nothing published (as under `gaffer up`): the
/// queue page shows the file's table, marked so; once a config is published and adopted,
/// that one with its version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_queue_shows_the_config_its_manager_runs_from_its_file_or_published() {
    let c = Console::start().await;
    let file = config_text() + "\n[manager]\ntick = \"200ms\"\n";
    let mut opts = gaffer::manager::ManagerOptions::new(
        test_config(&file),
        c.redis.url(),
        "config-shown".into(),
    );
    opts.file_source = Some(file.clone());
    let stop = CancellationToken::new();
    let watch = async {
        let shown =
            crate::harness::poll_some(Duration::from_secs(20), "the file's table", || async {
                let (_, q) = c.get("/v1/queues/emails", SHOP).await;
                (q["config_origin"] == "file").then_some(q)
            })
            .await;
        assert_eq!(
            (&shown["config"], &shown["config_version"]),
            (
                &json!({"handler": "exec", "max_attempts": 1, "system": "mailer"}),
                &json!(null)
            ),
            "{shown}"
        );

        let published = file.replace("max_attempts = 1\nsystem", "max_attempts = 3\nsystem");
        let keys = Keys::new("test");
        let mut conn = c.redis.client().await.connection();
        gaffer::cluster::publish_config(&mut conn, &keys, &published)
            .await
            .unwrap();
        let shown =
            crate::harness::poll_some(Duration::from_secs(20), "the published table", || async {
                let (_, q) = c.get("/v1/queues/emails", OPS).await;
                (q["config_origin"] == "published").then_some(q)
            })
            .await;
        assert_eq!(
            (&shown["config"]["max_attempts"], &shown["config_version"]),
            (&json!(3), &json!(1)),
            "{shown}"
        );
        stop.cancel();
    };
    // (joined, not spawned: the manager's future is not Send for every lifetime)
    let (ran, ()) = tokio::join!(gaffer::manager::run(opts, stop.clone()), watch);
    ran.unwrap();
    c.stop().await;
}

/// Five letters (dying in the same few milliseconds, so ties of their time of death are
/// paged by id), listed two at a time while one of them is requeued and a new one dies:
/// the walk shows each letter that stayed once, newest first, and none that died after
/// it began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_page_newest_first_and_move_by_id_or_all() {
    let c = Console::start().await;
    for id in ["d1", "d2", "d3", "d4", "d5"] {
        c.submit("emails", SHOP, id).await;
    }
    assert_eq!(c.fail_waiting("emails").await.len(), 5);

    let (st, page) = c.get("/v1/queues/emails/dead?limit=2", OPS).await;
    assert_eq!(st, 200, "{page}");
    let letters = page["dead"].as_array().unwrap();
    assert_eq!(letters.len(), 2, "{page}");
    let first = &letters[0];
    assert_eq!(first["attempts"], json!(1), "{first}");
    assert_eq!(
        first["error"],
        json!(format!("{} broke", first["id"].as_str().unwrap()))
    );
    assert_eq!(first["payload"], json!({"n": first["id"]}), "{first}");
    assert!(first["died_at"].as_str().unwrap().ends_with('Z'), "{first}");
    let mut seen: Vec<(i64, String)> = letters
        .iter()
        .map(|d| {
            (
                d["died_ms"].as_i64().unwrap(),
                d["id"].as_str().unwrap().into(),
            )
        })
        .collect();
    // Meanwhile: one letter already shown is requeued, and a new one dies.
    let shown = seen[0].1.clone();
    let (st, body) = c
        .post(
            "/v1/queues/emails/dead/requeue",
            OPS,
            &json!({"ids": [shown]}).to_string(),
        )
        .await;
    assert_eq!((st, body), (200, json!({"queue": "emails", "requeued": 1})));
    c.submit("emails", SHOP, "late").await;
    // (the requeued letter is taken and fails again too: it died after the walk began)
    assert_eq!(c.fail_waiting("emails").await.len(), 2);
    let mut cursor = page["next_cursor"].as_str().unwrap().to_string();
    loop {
        let (st, page) = c
            .get(
                &format!("/v1/queues/emails/dead?limit=2&cursor={cursor}"),
                OPS,
            )
            .await;
        assert_eq!(st, 200, "{page}");
        seen.extend(page["dead"].as_array().unwrap().iter().map(|d| {
            (
                d["died_ms"].as_i64().unwrap(),
                d["id"].as_str().unwrap().into(),
            )
        }));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = next.into(),
            None => break,
        }
    }
    let ids: Vec<&str> = seen.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>(),
        ["d1", "d2", "d3", "d4", "d5"].iter().collect(),
        "each letter there from the start, once, and not the late one: {ids:?}"
    );
    assert_eq!(ids.len(), 5, "{ids:?}");
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted, "newest first, then by id");

    // A fresh walk sees all six, newest first: the late one and the requeued one lead.
    let (_, page) = c.get("/v1/queues/emails/dead?limit=1000", OPS).await;
    assert_eq!(page["dead"].as_array().unwrap().len(), 6, "{page}");
    assert_eq!(page["next_cursor"], json!(null));

    // Requeue by id: unknown ids are passed over and the count says so; the record says
    // who did it.
    let (st, body) = c
        .post(
            "/v1/queues/emails/dead/requeue",
            OPS,
            r#"{"ids": ["d1", "nope", "d1"]}"#,
        )
        .await;
    assert_eq!((st, body), (200, json!({"queue": "emails", "requeued": 1})));
    let (_, rec) = c.get("/v1/queues/emails/tasks/d1", SHOP).await;
    assert_eq!(rec["state"], json!("waiting"), "{rec}");
    assert_eq!(
        rec["history"].as_array().unwrap().last().unwrap()["note"],
        json!("requeued from the dead letters by key ops")
    );
    let (st, body) = c
        .post("/v1/queues/emails/dead/purge", OPS, r#"{"ids": ["d2"]}"#)
        .await;
    assert_eq!((st, body), (200, json!({"queue": "emails", "purged": 1})));
    // Its record stays, failed, until it expires; there is nothing left to retry.
    let (_, rec) = c.get("/v1/queues/emails/tasks/d2", OPS).await;
    assert_eq!(rec["state"], json!("failed"), "{rec}");
    assert_eq!(
        c.post("/v1/queues/emails/tasks/d2/retry", OPS, "").await,
        (
            409,
            json!({"error": "task d2 failed and is no longer a dead letter (requeued or purged meanwhile): only a dead letter can be retried"})
        )
    );
    let (st, body) = c
        .post("/v1/queues/emails/dead/requeue", OPS, r#"{"all": true}"#)
        .await;
    assert_eq!((st, body), (200, json!({"queue": "emails", "requeued": 4})));
    assert_eq!(c.fail_waiting("emails").await.len(), 5);
    let (st, body) = c
        .post("/v1/queues/emails/dead/purge", OPS, r#"{"all": true}"#)
        .await;
    assert_eq!((st, body), (200, json!({"queue": "emails", "purged": 5})));
    let q = c.queue("emails").await;
    assert_eq!(q.stats().await.unwrap().dead, 0);
    let (_, page) = c.get("/v1/queues/emails/dead", OPS).await;
    assert_eq!(page, json!({"dead": [], "next_cursor": null}));
    c.stop().await;
}

/// Dead letters are an admin's: a limited key is refused, even on its own queue, and
/// bad requests are refused naming the problem; none of it changes Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_refusals_name_the_problem_and_change_nothing() {
    let c = Console::start().await;
    c.submit("emails", SHOP, "d1").await;
    c.fail_waiting("emails").await;
    let before = dump(&c.redis).await;
    let not_admin =
        json!({"error": "key shop is not an admin key: this endpoint needs admin = true"});
    let cases: Vec<(&str, &str, &str, &str, u16, Value)> = vec![
        (
            "GET",
            "/v1/queues/emails/dead",
            SHOP,
            "",
            403,
            not_admin.clone(),
        ),
        (
            "POST",
            "/v1/queues/emails/dead/requeue",
            SHOP,
            r#"{"all": true}"#,
            403,
            not_admin.clone(),
        ),
        (
            "POST",
            "/v1/queues/emails/dead/purge",
            SHOP,
            r#"{"ids": ["d1"]}"#,
            403,
            not_admin,
        ),
        (
            "GET",
            "/v1/queues/nope/dead",
            OPS,
            "",
            404,
            json!({"error": "unknown queue nope"}),
        ),
        (
            "GET",
            "/v1/queues/emails/dead?limit=0",
            OPS,
            "",
            400,
            json!({"error": "limit must be a number from 1 to 1000, got \"0\""}),
        ),
        (
            "GET",
            "/v1/queues/emails/dead?cursor=c12",
            OPS,
            "",
            400,
            json!({"error": "cursor \"c12\" is not one this api returned"}),
        ),
        (
            "GET",
            "/v1/queues/emails/dead?state=failed",
            OPS,
            "",
            400,
            json!({"error": "unknown query parameter \"state\": expected limit or cursor"}),
        ),
        (
            "POST",
            "/v1/queues/emails/dead/purge",
            OPS,
            "{}",
            400,
            json!({"error": "name the dead letters: give \"ids\": [..] or \"all\": true"}),
        ),
        (
            "POST",
            "/v1/queues/emails/dead/purge",
            OPS,
            r#"{"all": false}"#,
            400,
            json!({"error": "\"all\" must be true to move every dead letter (or give \"ids\")"}),
        ),
        (
            "POST",
            "/v1/queues/emails/dead/requeue",
            OPS,
            r#"{"ids": ["d1"], "all": true}"#,
            400,
            json!({"error": "give \"ids\" or \"all\", not both"}),
        ),
        (
            "POST",
            "/v1/queues/emails/dead/bury",
            OPS,
            "",
            404,
            json!({"error": "no such endpoint POST /v1/queues/emails/dead/bury"}),
        ),
    ];
    for (method, path, token, body, status, answer) in cases {
        let got = c.call(method, path, token, body).await;
        assert_eq!(got, (status, answer), "{method} {path} {body}");
    }
    let (st, body) = c.call("PUT", "/v1/queues/emails/dead/purge", OPS, "").await;
    assert_eq!(st, 405, "{body}");
    assert_eq!(dump(&c.redis).await, before, "a refusal changes nothing");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_retries_its_own_failed_task_and_no_other() {
    let c = Console::start().await;
    c.submit("emails", SHOP, "t1").await;
    c.fail_waiting("emails").await;
    let (_, rec) = c.get("/v1/queues/emails/tasks/t1", SHOP).await;
    assert_eq!(rec["state"], json!("failed"), "{rec}");

    // Another key: the task is as unknown to it as one that never was, and stays dead.
    let before = dump(&c.redis).await;
    let unknown = (404, json!({"error": "no task t1 in queue emails"}));
    assert_eq!(
        c.post("/v1/queues/emails/tasks/t1/retry", RIVAL, "").await,
        unknown
    );
    assert_eq!(
        c.post("/v1/queues/emails/tasks/nope/retry", RIVAL, "")
            .await,
        (404, json!({"error": "no task nope in queue emails"}))
    );
    assert_eq!(
        c.post("/v1/queues/reports/tasks/t1/retry", SHOP, "").await,
        (403, json!({"error": "key shop may not use queue reports"}))
    );
    assert_eq!(dump(&c.redis).await, before, "a refusal changes nothing");

    let (st, rec) = c.post("/v1/queues/emails/tasks/t1/retry", SHOP, "").await;
    assert_eq!(st, 200, "{rec}");
    assert_eq!(
        (&rec["state"], &rec["attempt"]),
        (&json!("waiting"), &json!(0))
    );
    assert_eq!(
        rec["history"].as_array().unwrap().last().unwrap()["note"],
        json!("retried by key shop")
    );
    assert_eq!(c.queue("emails").await.stats().await.unwrap().ready, 1);
    // Waiting now: a second retry is refused, saying why.
    assert_eq!(
        c.post("/v1/queues/emails/tasks/t1/retry", SHOP, "").await,
        (
            409,
            json!({"error": "task t1 is waiting: only a failed task can be retried"})
        )
    );
    // The retried task runs (and fails) again: an admin may retry it too.
    c.fail_waiting("emails").await;
    let (st, rec) = c.post("/v1/queues/emails/tasks/t1/retry", OPS, "").await;
    assert_eq!((st, &rec["state"]), (200, &json!("waiting")), "{rec}");

    // A queue without records: an admin's retry answers what the queue holds; a limited
    // key sees none of its tasks.
    let (st, _) = c
        .post(
            "/v1/queues/bulk/tasks",
            SHOP,
            r#"{"payload": 1, "id": "u1"}"#,
        )
        .await;
    assert_eq!(st, 202);
    assert_eq!(
        c.post("/v1/queues/bulk/tasks/u1/retry", OPS, "").await,
        (
            409,
            json!({"error": "task u1 is waiting: only a failed task can be retried"})
        )
    );
    c.fail_waiting("bulk").await;
    assert_eq!(
        c.post("/v1/queues/bulk/tasks/u1/retry", SHOP, "").await,
        (404, json!({"error": "no task u1 in queue bulk"}))
    );
    assert_eq!(
        c.post("/v1/queues/bulk/tasks/u1/retry", OPS, "").await,
        (
            200,
            json!({"id": "u1", "queue": "bulk", "state": "waiting"})
        )
    );
    let bulk = c.queue("bulk").await.stats().await.unwrap();
    assert_eq!((bulk.ready, bulk.dead), (1, 0));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_finds_the_tasks_the_key_may_see_in_every_queue() {
    let c = Console::start().await;
    c.submit("emails", SHOP, "same").await;
    c.submit("reports", OPS, "same").await;
    c.submit("bulk", OPS, "same").await;
    c.submit("emails", RIVAL, "theirs").await;

    let (st, body) = c.get("/v1/tasks/same", OPS).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        body,
        json!({"id": "same", "found": [
            {"queue": "bulk", "state": "waiting"},
            {"queue": "emails", "state": "waiting"},
            {"queue": "reports", "state": "waiting"},
        ]})
    );
    // shop: its own task in emails; bulk keeps no record of who submitted, reports is
    // not its queue.
    assert_eq!(
        c.get("/v1/tasks/same", SHOP).await,
        (
            200,
            json!({"id": "same", "found": [{"queue": "emails", "state": "waiting"}]})
        )
    );
    // rival may use emails, but the task there is shop's: as if there were none.
    assert_eq!(
        c.get("/v1/tasks/same", RIVAL).await,
        (200, json!({"id": "same", "found": []}))
    );
    assert_eq!(
        c.get("/v1/tasks/theirs", SHOP).await,
        (200, json!({"id": "theirs", "found": []}))
    );
    assert_eq!(
        c.get("/v1/tasks/theirs", RIVAL).await,
        (
            200,
            json!({"id": "theirs", "found": [{"queue": "emails", "state": "waiting"}]})
        )
    );
    // The state is the one now.
    c.fail_waiting("emails").await;
    assert_eq!(
        c.get("/v1/tasks/same", SHOP).await.1["found"],
        json!([{"queue": "emails", "state": "failed"}])
    );
    // An id given percent-encoded is the same id.
    c.submit("emails", SHOP, "a b/c").await;
    assert_eq!(
        c.get("/v1/tasks/a%20b%2Fc", SHOP).await.1["found"],
        json!([{"queue": "emails", "state": "waiting"}])
    );
    let long = "x".repeat(300);
    assert_eq!(
        c.get(&format!("/v1/tasks/{long}"), SHOP).await,
        (
            400,
            json!({"error": "task id must be 1 to 256 bytes, got 300"})
        )
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_is_shown_to_whoever_may_see_the_task_while_the_queue_holds_it() {
    let c = Console::start().await;
    c.submit("emails", SHOP, "p1").await;
    let held = json!({"id": "p1", "queue": "emails", "kept": true, "payload": {"n": "p1"}});
    let path = "/v1/queues/emails/tasks/p1/payload";
    assert_eq!(c.get(path, SHOP).await, (200, held.clone()));
    assert_eq!(c.get(path, OPS).await, (200, held.clone()));
    assert_eq!(
        c.get(path, RIVAL).await,
        (404, json!({"error": "no task p1 in queue emails"}))
    );
    // A dead letter keeps it; a task done does not.
    c.fail_waiting("emails").await;
    assert_eq!(c.get(path, SHOP).await, (200, held));
    let (st, _) = c.post("/v1/queues/emails/tasks/p1/retry", SHOP, "").await;
    assert_eq!(st, 200);
    let q = c.queue("emails").await;
    let batch = q.take(10, Duration::from_secs(60)).await.unwrap();
    q.ack(&batch.tasks).await.unwrap();
    assert_eq!(
        c.get(path, SHOP).await,
        (
            200,
            json!({"id": "p1", "queue": "emails", "kept": false, "payload": null})
        )
    );
    // A queue without records: an admin's only.
    c.submit("bulk", SHOP, "u1").await;
    assert_eq!(
        c.get("/v1/queues/bulk/tasks/u1/payload", OPS).await,
        (
            200,
            json!({"id": "u1", "queue": "bulk", "kept": true, "payload": {"n": "u1"}})
        )
    );
    assert_eq!(
        c.get("/v1/queues/bulk/tasks/u1/payload", SHOP).await,
        (404, json!({"error": "no task u1 in queue bulk"}))
    );
    c.stop().await;
}

/// The console's refresh at the issue's scale, 150 queues and 40 hosts: one read of the
/// cluster is about two calls per queue the key may see plus a handful (no call per host,
/// none per queue beyond the snapshot's), so a key limited to two queues costs a few
/// calls whatever the cluster's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_read_costs_calls_per_queue_the_key_sees_not_per_host() {
    let mut text =
        config_text().replace("queues = [\"emails\"]", "queues = [\"emails\", \"q007\"]");
    for i in 0..147 {
        text.push_str(&format!("\n[queues.q{i:03}]\nhandler = \"noop\"\n"));
    }
    let redis = TestRedis::start();
    let config = test_config(&text);
    let (addr, stop, task) = start_api(config.clone(), redis.url()).await;
    let c = Console {
        redis,
        addr,
        config,
        stop,
        task,
    };
    for h in 0..40 {
        let slots: Vec<(String, u32)> = (0..4)
            .map(|k| (format!("q{:03}", (h * 4 + k) % 147), 1))
            .collect();
        let slots: Vec<(&str, u32)> = slots.iter().map(|(q, n)| (q.as_str(), *n)).collect();
        c.host(&format!("host{h:02}"), &slots, &slots).await;
    }
    // Redis's work for one read: commands run (those scripts run included) and calls of
    // gaffer's functions.
    let cost = |token: &'static str| {
        let c = &c;
        async move {
            let before = (c.redis.commands_processed().await, calls(&c.redis).await);
            let started = std::time::Instant::now();
            let (st, doc) = c.get("/v1/cluster", token).await;
            let took = started.elapsed();
            assert_eq!(st, 200, "{doc}");
            let after = (c.redis.commands_processed().await, calls(&c.redis).await);
            // (less the INFO commands that read the counts)
            (doc, after.0 - before.0 - 3, after.1 - before.1, took)
        }
    };
    // (the first read also loads gaffer's function library into the fresh server)
    cost(OPS).await;
    let (all, admin_commands, admin_calls, admin_took) = cost(OPS).await;
    assert_eq!(all["queues"].as_object().unwrap().len(), 150);
    assert_eq!(all["hosts"].as_object().unwrap().len(), 40);
    let (mine, rival_commands, rival_calls, rival_took) = cost(RIVAL).await;
    assert_eq!(names(&mine["queues"]), set(&["emails", "q007"]));
    eprintln!(
        "GET /v1/cluster, 150 queues and 40 hosts: admin {admin_commands} redis commands \
         ({admin_calls} function calls) in {admin_took:?}; a key with 2 queues \
         {rival_commands} ({rival_calls}) in {rival_took:?}"
    );
    assert!(admin_calls <= 2 * 150, "{admin_calls}");
    assert!(rival_calls <= 2 * 2, "{rival_calls}");
    assert!(
        rival_commands * 20 < admin_commands,
        "{rival_commands} {admin_commands}"
    );
    c.stop().await;
}
