//! Every role under the ACL docs/SECURITY.md gives it: a redis-server with the default user
//! off and only that role's user (plus the test's admin, who sets the scene and reads the
//! ACL log), and the role's normal work through it. Anything Redis refuses fails the test
//! with its NOPERM words, read from `ACL LOG`: daemons retry refused commands, so the
//! refusal, not a timeout, is what the test reports.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gaffer::cluster::{self, HostReport, Keys, SlotMap};
use gaffer::queue_client::{NewTask, QueueLimits};
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};

use crate::harness::{ANY_LOAD, AclRedis};

/// A config for `redis` with its role's user and password file, namespace `gaffer`.
fn write_config(dir: &Path, redis: &AclRedis, extra: &str) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    let text = format!(
        "[cluster]\nredis = {:?}\nnamespace = \"gaffer\"\nredis_password_file = {:?}\n\n\
         [manager]\ntick = \"200ms\"\nheartbeat_timeout = \"5s\"\n\n\
         [queues.work]\nhandler = \"noop\"\nmin_slots = 2\n\n{extra}",
        redis.url(),
        redis.password_file().display().to_string(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn gaffer(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("GAFFER_LOG")
        .output()
        .unwrap()
}

/// Fails with the command's stderr and Redis's refusals unless it succeeded.
async fn assert_ok(redis: &AclRedis, what: &str, o: &Output) {
    if !o.status.success() {
        panic!(
            "{what}: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            redis.refusals().await.join("\n")
        );
    }
}

/// Fails unless the command failed (exit 1) on a refusal Redis logged, and says so: a
/// refused top-level command answers `NOPERM …` (the driver prints `NoPerm: …`), a command
/// a script called "The user executing the script can't run this command …" (Redis 7.0).
async fn assert_refused(redis: &AclRedis, what: &str, o: &Output) -> Vec<String> {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{what}: {stderr}");
    assert!(
        stderr.to_lowercase().contains("noperm") || stderr.contains("can't run this command"),
        "{what}: {stderr}"
    );
    let refused = redis.refusals().await;
    assert!(!refused.is_empty(), "{what}: no ACL LOG entry for {stderr}");
    refused
}

/// A daemon of the role, its log in `dir/NAME.log`; killed on drop.
struct Daemon {
    child: Child,
    log: std::path::PathBuf,
}

impl Daemon {
    fn start(config: &Path, dir: &Path, name: &str, args: &[&str], http_env: &str) -> Self {
        let http = gaffer::redis_server::free_port().unwrap();
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--config")
            .arg(config)
            .args(args)
            .env("GAFFER_LOG", "info")
            .env(ANY_LOAD.0, ANY_LOAD.1)
            .env(http_env, format!("127.0.0.1:{http}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Daemon { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits for its exit; the exit status and the log.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait().unwrap();
        (status, self.log())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn the_manager_leads_and_writes_a_map_under_its_acl() {
    let redis = AclRedis::start("manager");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &redis,
        "[[schedules]]\nname = \"cfg\"\nqueue = \"work\"\nevery = \"1s\"\n",
    );
    let admin = redis.admin_client().await;
    let keys = Keys::new("gaffer");
    // A stored schedule beside the config's: the manager reads and fires both.
    let stored = gaffer::schedule::Schedule {
        name: "stored".into(),
        queue: "work".into(),
        rule: gaffer::schedule::Rule::every("1s").unwrap(),
        timezone: None,
        until_ms: None,
        payload: "{}".into(),
        origin: gaffer::schedule::Origin::Api {
            owner: "ops".into(),
            created_ms: cluster::now_ms() as i64,
        },
    };
    gaffer::schedule::store::create(&mut admin.connection(), &keys, &stored, 10)
        .await
        .unwrap();
    // A host that is only a report, so the manager has somewhere to place the slots.
    let report = HostReport {
        host: "h1".into(),
        ts_ms: cluster::now_ms(),
        capacity: 4,
        handlers: vec!["noop".into()],
        ..HostReport::default()
    };
    cluster::publish_host(&mut admin.connection(), &keys, &report)
        .await
        .unwrap();
    admin
        .queue("work")
        .unwrap()
        .enqueue(NewTask::new("{}"))
        .await
        .unwrap();
    let manager = Daemon::start(
        &config,
        dir.path(),
        "manager",
        &["manager"],
        "GAFFER_MANAGER_HTTP",
    );
    redis
        .eventually(
            Duration::from_secs(30),
            "the manager places work's slots on h1",
            || async {
                let map = cluster::read_map(&mut admin.connection(), &keys).await;
                map.ok()
                    .flatten()
                    .is_some_and(|m| m.epoch >= 1 && m.for_host("h1").get("work") == Some(&2))
            },
        )
        .await;
    redis
        .eventually(Duration::from_secs(30), "both schedules fire", || async {
            let fired: (Option<i64>, Option<i64>) = redis::cmd("HMGET")
                .arg(keys.schedules())
                .arg("name:cfg:fired")
                .arg("name:stored:fired")
                .query_async(&mut admin.connection())
                .await
                .unwrap();
            fired.0.is_some() && fired.1.is_some()
        })
        .await;
    let (status, log) = manager.stop();
    assert!(status.success(), "{status}\n{log}");
    redis.assert_nothing_refused().await;
    assert!(!log.contains("NOPERM"), "{log}");
}

#[tokio::test]
async fn a_master_and_its_slots_take_and_settle_under_their_acl() {
    let redis = AclRedis::start("master");
    let dir = tempfile::tempdir().unwrap();
    // `first` leads to `after` by a route: its slots make follow-ups and their chains too.
    let chained = "[queues.first]\nhandler = \"noop\"\nnext = [{ queue = \"after\" }]\n\n\
                   [queues.after]\nhandler = \"noop\"\n";
    let config = write_config(dir.path(), &redis, chained);
    let admin = redis.admin_client().await;
    let q = admin.queue("work").unwrap();
    let tasks: Vec<NewTask> = (0..20)
        .map(|i| NewTask::new(format!("{{\"n\":{i}}}")))
        .collect();
    q.enqueue_many(&tasks).await.unwrap();
    let first = admin.queue("first").unwrap();
    let after = admin.queue("after").unwrap();
    first.enqueue_many(&tasks[..5]).await.unwrap();
    let map = SlotMap {
        epoch: 1,
        version: 1,
        hosts: BTreeMap::from([(
            "h1".to_string(),
            BTreeMap::from([("work".into(), 2), ("first".into(), 1), ("after".into(), 1)]),
        )]),
    };
    cluster::write_map_unfenced(&mut admin.connection(), &Keys::new("gaffer"), &map)
        .await
        .unwrap();
    let master = Daemon::start(
        &config,
        dir.path(),
        "master",
        &["master", "--host", "h1"],
        "GAFFER_MASTER_HTTP",
    );
    redis
        .eventually(
            Duration::from_secs(60),
            "the slots ack every task",
            || async { q.stats().await.is_ok_and(|s| s.acked_total == 20) },
        )
        .await;
    redis
        .eventually(
            Duration::from_secs(60),
            "the follow-ups made and acked",
            || async { after.stats().await.is_ok_and(|s| s.acked_total == 5) },
        )
        .await;
    let (status, log) = master.stop();
    assert!(status.success(), "{status}\n{log}");
    redis.assert_nothing_refused().await;
    assert!(!log.contains("NOPERM"), "{log}");
    let hosts = cluster::read_hosts(&mut admin.connection(), &Keys::new("gaffer"))
        .await
        .unwrap();
    assert!(
        !hosts.contains_key("h1"),
        "the master deregistered: {hosts:?}"
    );
}

/// A master under an ACL from before `+zremrangebyscore` (the fast removal of acked
/// per-task leases) refuses to start, naming the command to add, rather than running
/// slots whose settles would be refused.
#[tokio::test]
async fn a_master_under_an_acl_without_zremrangebyscore_refuses_to_start_naming_it() {
    let redis = AclRedis::start_with("master", |line| {
        assert!(line.contains(" +zremrangebyscore "), "{line}");
        line.replace(" +zremrangebyscore ", " ")
    });
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &redis, "");
    let mut master = Daemon::start(
        &config,
        dir.path(),
        "master",
        &["master", "--host", "h1"],
        "GAFFER_MASTER_HTTP",
    );
    let status = crate::harness::poll_some(Duration::from_secs(30), "the master exits", || {
        let exited = master.child.try_wait().unwrap();
        async move { exited }
    })
    .await;
    assert!(!status.success(), "{}", master.log());
    assert!(
        master
            .log()
            .contains("add +zremrangebyscore to its ACL line"),
        "{}",
        master.log()
    );
}

const TOKEN: &str = "acl-test-token-0123456789abcdef";

/// One request to the api as the test's key: status and JSON body.
async fn call(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    let body = (!body.is_empty()).then_some(body.as_bytes());
    let (status, raw) = crate::api::request(addr, method, path, Some(TOKEN), body).await;
    let json = serde_json::from_slice(&raw)
        .unwrap_or_else(|_| json!(String::from_utf8_lossy(&raw).into_owned()));
    (status, json)
}

/// An api in-process under `redis`'s ACL, with an admin key for queue `work`.
async fn start_api(
    redis: &AclRedis,
    dir: &Path,
) -> (
    std::net::SocketAddr,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let keys = format!(
        "[api.keys.shop]\ntoken_sha256 = {:?}\nqueues = [\"work\"]\nadmin = true\n",
        gaffer::api::hash_token(TOKEN)
    );
    let config = write_config(dir, redis, &keys);
    let cfg = gaffer::config::load(&config).unwrap();
    let mut opts = gaffer::api::ApiOptions::new(cfg, redis.url());
    opts.connect = redis.options();
    opts.listen = Some("127.0.0.1:0".parse().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let api = tokio::spawn(gaffer::api::run(opts, stop.clone(), Some(tx)));
    let addr = rx.await.expect("the api binds");
    (addr, stop, api)
}

/// The first batch a take of queue `work` finds.
async fn take_some(q: &gaffer::queue_client::Queue) -> gaffer::queue_client::Batch {
    crate::harness::poll_some(Duration::from_secs(10), "a task to take", || {
        let q = q.clone();
        async move {
            let b = q.take(10, Duration::from_secs(30)).await.ok()?;
            (!b.tasks.is_empty()).then_some(b)
        }
    })
    .await
}

/// What the web console reads and does, under the api's ACL: the cluster, one queue (its
/// published table too), a search, a payload, and a dead letter listed, retried,
/// requeued and purged (the test's admin plays the slot that fails it).
async fn console_endpoints(addr: std::net::SocketAddr, redis: &AclRedis) {
    for path in ["/v1/cluster", "/v1/queues/work", "/v1/tasks/a"] {
        let (st, body) = call(addr, "GET", path, "").await;
        assert_eq!(st, 200, "{path}: {body}");
    }
    let task = r#"{"payload": 3, "id": "f", "max_attempts": 1}"#;
    let (st, body) = call(addr, "POST", "/v1/queues/work/tasks", task).await;
    assert_eq!(st, 202, "{body}");
    let (st, body) = call(addr, "GET", "/v1/queues/work/tasks/f/payload", "").await;
    assert_eq!((st, &body["payload"]), (200, &json!(3)), "{body}");
    let q = redis.admin_client().await.queue("work").unwrap();
    fail_taken(&q).await;
    let (st, page) = call(addr, "GET", "/v1/queues/work/dead?limit=10", "").await;
    assert_eq!((st, &page["dead"][0]["id"]), (200, &json!("f")), "{page}");
    let (st, rec) = call(addr, "POST", "/v1/queues/work/tasks/f/retry", "").await;
    assert_eq!((st, &rec["state"]), (200, &json!("waiting")), "{rec}");
    fail_taken(&q).await;
    let (st, body) = call(
        addr,
        "POST",
        "/v1/queues/work/dead/requeue",
        r#"{"ids": ["f"]}"#,
    )
    .await;
    assert_eq!((st, &body["requeued"]), (200, &json!(1)), "{body}");
    fail_taken(&q).await;
    let (st, body) = call(
        addr,
        "POST",
        "/v1/queues/work/dead/purge",
        r#"{"all": true}"#,
    )
    .await;
    assert_eq!((st, &body["purged"]), (200, &json!(1)), "{body}");
}

/// Takes what waits in `q` and fails it for good (with its one attempt).
async fn fail_taken(q: &gaffer::queue_client::Queue) {
    let batch = take_some(q).await;
    crate::harness::fail_all(q, &batch.tasks, |_| "no".into()).await;
}

/// An api whose ACL lacks the channels of task ends (the easy mistake) answers a sync
/// wait once its task ended, by looking again, long before the wait runs out; and one
/// whose task's id another submitter's task took meanwhile answers 410, never with that
/// task's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_wait_without_the_channels_sees_its_end_and_never_another_keys_task() {
    let redis = AclRedis::start_with("api", |line| line.replace(" &gaffer:{*}:ended", ""));
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop, api) = start_api(&redis, dir.path()).await;
    let admin = redis.admin_client().await;
    let q = admin.queue("work").unwrap();
    let wait = Duration::from_secs(60);
    let submit = |id: &'static str| {
        tokio::spawn(async move {
            let body = format!(r#"{{"payload": 1, "id": "{id}", "wait": "60s"}}"#);
            let (st, rec) = call(addr, "POST", "/v1/queues/work/tasks", &body).await;
            (st, rec, Instant::now())
        })
    };

    let waiting = submit("w");
    let batch = take_some(&q).await;
    q.ack(&batch.tasks).await.unwrap();
    let acked = Instant::now();
    let (st, rec, answered) = waiting.await.unwrap();
    assert_eq!((st, rec["state"].clone()), (200, json!("done")), "{rec}");
    assert!(
        answered.duration_since(acked) < wait / 2,
        "the end was seen only at the wait's end"
    );

    let waiting = submit("x");
    let batch = take_some(&q).await;
    q.ack(&batch.tasks).await.unwrap();
    q.enqueue_many(&[NewTask::new("2".to_owned()).id("x").submitted_by("other")])
        .await
        .unwrap();
    let (st, body, _) = waiting.await.unwrap();
    assert_eq!(st, 410, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("its id already holds a new task"),
        "{body}"
    );
    stop.cancel();
    api.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_submits_views_lists_cancels_and_waits_under_its_acl() {
    let redis = AclRedis::start("api");
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop, api) = start_api(&redis, dir.path()).await;

    let (st, body) = call(
        addr,
        "POST",
        "/v1/queues/work/tasks",
        r#"{"payload": 1, "id": "a"}"#,
    )
    .await;
    assert_eq!((st, body["created"].clone()), (202, json!(true)), "{body}");
    let (st, rec) = call(addr, "GET", "/v1/queues/work/tasks/a", "").await;
    assert_eq!((st, rec["state"].clone()), (200, json!("waiting")), "{rec}");
    let (st, page) = call(addr, "GET", "/v1/queues/work/tasks?limit=10", "").await;
    assert_eq!(
        (st, page["tasks"][0]["id"].clone()),
        (200, json!("a")),
        "{page}"
    );
    let (st, rec) = call(addr, "DELETE", "/v1/queues/work/tasks/a", "").await;
    assert_eq!(
        (st, rec["state"].clone()),
        (200, json!("cancelled")),
        "{rec}"
    );
    let (st, queues) = call(addr, "GET", "/v1/queues", "").await;
    assert_eq!(st, 200, "{queues}");
    assert!(queues["work"].is_object(), "{queues}");
    let (st, body) = call(addr, "POST", "/v1/queues/work/pause", "").await;
    assert_eq!(st, 200, "{body}");
    let (st, body) = call(addr, "POST", "/v1/queues/work/resume", "").await;
    assert_eq!(st, 200, "{body}");
    let (st, body) = call(addr, "GET", "/healthz", "").await;
    assert_eq!(st, 200, "{body}");
    let schedule = r#"{"name": "s", "queue": "work", "every": "1h", "payload": {}}"#;
    let (st, body) = call(addr, "POST", "/v1/schedules", schedule).await;
    assert_eq!(st, 201, "{body}");
    let (st, body) = call(addr, "GET", "/v1/schedules", "").await;
    assert_eq!(st, 200, "{body}");
    let (st, body) = call(addr, "DELETE", "/v1/schedules/s", "").await;
    assert_eq!(st, 204, "{body}");
    console_endpoints(addr, &redis).await;

    // A sync submit: the test's admin plays the slot, and the api hears of the end
    // through its pattern subscription.
    let waiting = tokio::spawn(async move {
        call(
            addr,
            "POST",
            "/v1/queues/work/tasks",
            r#"{"payload": 2, "id": "w", "wait": "20s"}"#,
        )
        .await
    });
    let admin = redis.admin_client().await;
    let q = admin.queue("work").unwrap();
    let batch = take_some(&q).await;
    // Acked once the api waits for it (its id is in the queue's watch set).
    redis
        .eventually(Duration::from_secs(10), "the api waits", || async {
            let mut conn = admin.connection();
            redis::cmd("SISMEMBER")
                .arg("gaffer:{work}:watch")
                .arg("w")
                .query_async::<bool>(&mut conn)
                .await
                .unwrap_or(false)
        })
        .await;
    q.ack(&batch.tasks).await.unwrap();
    let (st, rec) = waiting.await.unwrap();
    assert_eq!((st, rec["state"].clone()), (200, json!("done")), "{rec}");
    stop.cancel();
    api.await.unwrap().unwrap();
    redis.assert_nothing_refused().await;
}

#[tokio::test]
async fn a_producer_pushes_to_its_queue_and_nowhere_else() {
    let redis = AclRedis::start("producer");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &redis, "[queues.other]\nhandler = \"noop\"\n");
    // It may not load gaffer's function library: until a role that may has, its push
    // fails saying so, and enqueues nothing.
    let o = gaffer(&config, &["push", "work", "--payload", "{\"n\":0}"]);
    let refused = assert_refused(&redis, "push before the library is loaded", &o).await;
    assert!(
        refused.iter().any(|r| r.contains("function|load")),
        "{refused:?}"
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("lacks gaffer's function library") && stderr.contains("gaffer migrate"),
        "{stderr}"
    );
    redis.forget_refusals().await;
    // (the admin's first call loads it)
    let admin = redis.admin_client().await;
    assert_eq!(admin.queue("work").unwrap().stats().await.unwrap().ready, 0);
    let o = gaffer(&config, &["push", "work", "--payload", "{\"n\":1}"]);
    assert_ok(&redis, "push", &o).await;
    let o = gaffer(&config, &["push", "work", "--count", "50"]);
    assert_ok(&redis, "push --count", &o).await;
    let o = gaffer(
        &config,
        &["push", "work", "--chain", "--id", "c1", "--payload", "{}"],
    );
    assert_ok(&redis, "push --chain", &o).await;
    redis.assert_nothing_refused().await;
    let s = admin.queue("work").unwrap().stats().await.unwrap();
    assert_eq!(s.ready, 52);

    // Its ACL names its queues: another one is refused, in Redis's words.
    let o = gaffer(&config, &["push", "other", "--payload", "{}"]);
    let refused = assert_refused(&redis, "push to another queue", &o).await;
    assert!(
        refused.iter().all(|r| r.contains("gaffer:{other}:")),
        "{refused:?}"
    );
    assert_eq!(
        admin.queue("other").unwrap().stats().await.unwrap().ready,
        0
    );
}

#[tokio::test]
async fn a_read_only_user_reads_stats_and_records_and_cannot_write() {
    let redis = AclRedis::start("readonly");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &redis,
        "[queues.short]\nhandler = \"noop\"\nhistory_ttl = \"1s\"\n",
    );
    let admin = redis.admin_client().await;
    let q = admin.queue("work").unwrap();
    q.enqueue(NewTask::new("{}").id("t1")).await.unwrap();

    let o = gaffer(&config, &["stats", "--json"]);
    assert_ok(&redis, "stats", &o).await;
    let stats: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(stats["queues"]["work"]["ready"], json!(1), "{stats}");
    let o = gaffer(&config, &["tasks", "show", "work", "t1", "--json"]);
    assert_ok(&redis, "tasks show", &o).await;
    let rec: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rec["state"], json!("waiting"), "{rec}");
    let o = gaffer(&config, &["tasks", "list", "work"]);
    assert_ok(&redis, "tasks list", &o).await;
    let o = gaffer(&config, &["schedules", "--json"]);
    assert_ok(&redis, "schedules", &o).await;
    redis.assert_nothing_refused().await;
    reads_pass_over_records_due_but_not_swept(&redis, &config).await;

    let o = gaffer(&config, &["push", "work", "--payload", "{}"]);
    assert_refused(&redis, "push", &o).await;
    let o = gaffer(&config, &["pause", "work"]);
    let refused = assert_refused(&redis, "pause", &o).await;
    assert!(
        refused
            .iter()
            .any(|r| r.contains("'sadd'") && r.contains("context toplevel")),
        "{refused:?}"
    );
    assert_eq!(q.stats().await.unwrap().enqueued_total, 1);
}

/// The read-only user's record reads when records are due but nobody has swept them (no
/// manager runs here, and its reads may not delete): one ended alone (cancelled, its own
/// expiry entry), two acked together (their batch's expiry list). `tasks show` finds none
/// of them, `tasks list` lists only the live task, nothing is refused, and the records
/// are still stored afterwards.
async fn reads_pass_over_records_due_but_not_swept(redis: &AclRedis, config: &Path) {
    let short = redis
        .admin_client()
        .await
        .queue_with(
            "short",
            QueueLimits {
                history_ttl: Duration::from_millis(300),
                ..QueueLimits::default()
            },
        )
        .unwrap();
    let ids = ["acked1", "acked2", "cancelled", "live"];
    let tasks: Vec<_> = ids.iter().map(|id| NewTask::new("{}").id(*id)).collect();
    short.enqueue_many(&tasks).await.unwrap();
    let batch = short.take(2, Duration::from_secs(30)).await.unwrap();
    assert_eq!(batch.tasks.len(), 2);
    short.ack(&batch.tasks).await.unwrap();
    short.cancel("cancelled").await.unwrap().expect("cancelled");
    let mut raw = redis.admin_raw().await;
    wait_until_due(redis, &mut raw, "short").await;
    let ended = ["acked1", "acked2", "cancelled"];
    assert_eq!(stored_records(&mut raw, "short", &ended).await, 3);

    for id in ended {
        let o = gaffer(config, &["tasks", "show", "short", id, "--json"]);
        redis.assert_nothing_refused().await;
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "tasks show {id}: {stderr}");
        assert!(
            stderr.contains(&format!("no task \"{id}\" in queue short")),
            "tasks show {id}: {stderr}"
        );
    }
    let o = gaffer(config, &["tasks", "show", "short", "live", "--json"]);
    assert_ok(redis, "tasks show of a live task", &o).await;
    let rec: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rec["state"], json!("waiting"), "{rec}");
    let o = gaffer(config, &["tasks", "list", "short", "--json"]);
    assert_ok(redis, "tasks list with due records", &o).await;
    let page: Value = serde_json::from_slice(&o.stdout).unwrap();
    let listed: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(listed, ["live"], "{page}");
    redis.assert_nothing_refused().await;
    assert_eq!(stored_records(&mut raw, "short", &ended).await, 3);
}

/// Waits until Redis's clock has passed every expiry moment of `queue`'s records (its
/// `exp` zset and the zset of its batches' lists), reading only those zsets, so nothing
/// is swept on the way.
async fn wait_until_due(redis: &AclRedis, raw: &mut MultiplexedConnection, queue: &str) {
    let mut latest = 0.0f64;
    for key in [
        format!("gaffer:{{{queue}}}:exp"),
        format!("gaffer:{{{queue}}}:exp:b"),
    ] {
        let top: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(-1)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(raw)
            .await
            .unwrap();
        let (_, score) = top.first().unwrap_or_else(|| panic!("{key} is empty"));
        latest = latest.max(*score);
    }
    redis
        .eventually(Duration::from_secs(10), "the records' time is up", || {
            let mut raw = raw.clone();
            async move {
                let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
                (s * 1000 + us / 1000) as f64 > latest
            }
        })
        .await;
}

/// How many of `ids` still have a record stored in `queue`.
async fn stored_records(raw: &mut MultiplexedConnection, queue: &str, ids: &[&str]) -> u64 {
    let mut exists = redis::cmd("EXISTS");
    for id in ids {
        exists.arg(format!("gaffer:{{{queue}}}:r:{id}"));
    }
    exists.query_async(raw).await.unwrap()
}

/// Every command a gaffer script runs (`redis.call('CMD'` and `bulk('CMD'` in `src/`, the
/// Lua files and the scripts inlined in Rust) is granted by the ACL line of each role that runs scripts
/// on any queue: Redis checks a script's commands against the caller's ACL, so a path
/// the role's other tests do not reach (a legacy layout, a long task's cancel) would be
/// refused there first, at run time.
#[test]
fn every_command_the_scripts_run_is_in_the_acl_lines() {
    let mut used = std::collections::BTreeSet::new();
    let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if !matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("lua" | "rs")
            ) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // (and the commands handed to the prelude's `bulk`, which calls them)
            let calls = ["redis.call('", "bulk('"]
                .into_iter()
                .flat_map(|call| text.split(call).skip(1));
            for part in calls {
                let cmd: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase())
                    .collect();
                if !cmd.is_empty() {
                    used.insert(cmd.to_lowercase());
                }
            }
        }
    }
    assert!(
        used.contains("zadd") && used.contains("hexists"),
        "{used:?}"
    );
    for role in ["manager", "master", "api"] {
        let line = crate::harness::acl_line(role);
        let granted: std::collections::BTreeSet<&str> = line
            .split_whitespace()
            .filter_map(|w| w.strip_prefix('+'))
            .collect();
        let missing: Vec<&String> = used
            .iter()
            .filter(|c| !granted.contains(c.as_str()))
            .collect();
        assert!(missing.is_empty(), "gaffer-{role} lacks {missing:?}");
    }
}
