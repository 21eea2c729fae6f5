//! A queue's layout version and `gaffer migrate` (queue_client/layout.rs, migrate.rs):
//! data written as older releases wrote it is moved to the current layout by the real
//! binary while an in-process producer and slot wait on the refusal, and nothing is lost.

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use gaffer::config::{Handler as HandlerConfig, QueueConfig};
use gaffer::queue_client::{NewTask, QueueClient, QueueError, QueueLimits, RecordState, layout};
use gaffer::slot::{Handler, HandlerError, Outcome, SlotContext, Task, run_slot};
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::harness::{TestRedis, eventually};

/// When the old tasks were enqueued (ms since the epoch).
const ENQ: u64 = 1_764_000_000_000;
/// The pin both hashes of the old layout held (`pinned` in lua/lib/tasks.lua).
const PIN: &str =
    "--------------------------------------------------------------------------------";

fn key(queue: &str, suffix: &str) -> String {
    format!("test:{{{queue}}}:{suffix}")
}

/// A config naming `queue`, tracked, in the tests' namespace.
fn config(dir: &tempfile::TempDir, queues: &[&str]) -> PathBuf {
    let mut text = String::from("[cluster]\nnamespace = \"test\"\n");
    for q in queues {
        text += &format!("\n[queues.{q}]\nhandler = \"noop\"\ntrack = true\n");
    }
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn gaffer(url: &str, config: &PathBuf, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(config)
        .arg("--redis")
        .arg(url)
        .args(args)
        .output()
        .unwrap()
}

/// `gaffer migrate ARGS --json`, which must succeed: its report of `queue`.
fn migrate_json(url: &str, config: &PathBuf, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["migrate", "--json"];
    all.extend_from_slice(args);
    let out = gaffer(url, config, &all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["interrupted"], false);
    v["queues"][0].clone()
}

/// A record as releases before records named their chain wrote it: seven head fields
/// (priority, max_attempts, created, due, submitted_by, error, result), then its history.
fn short_record(state: &str) -> String {
    format!("0\x1f3\x1f{ENQ}\x1f{ENQ}\x1f\x1f\x1f\x1e{state}\x1f{ENQ}\x1f0\x1f\x1f\x1f")
}

/// Writes `queue` as releases before 2026-11-24 left it: `waiting` tasks w0.. whose metas
/// are in the `meta` hash (half of them written before metas kept a chain field, with
/// records of seven fields; the rest with their chain field and full records), and a dead
/// letter `dead0` of the same form. Every task has a record, listed in `idx`.
async fn write_layout_1(c: &mut impl redis::aio::ConnectionLike, queue: &str, waiting: usize) {
    let k = |s: &str| key(queue, s);
    let mut pipe = redis::pipe();
    pipe.hset(k("meta"), "", PIN).hset(k("payload"), "", PIN);
    for i in 0..waiting {
        let id = format!("w{i}");
        let (meta, rec) = if i % 2 == 0 {
            (format!("0:3:{ENQ}"), short_record("waiting"))
        } else {
            // (a full record: eight head fields, the chain empty)
            let full = short_record("waiting").replacen('\x1e', "\x1f\x1e", 1);
            (format!("0:3:{ENQ}:"), full)
        };
        pipe.hset(k("meta"), &id, meta)
            .hset(k("payload"), &id, format!("p{i}"))
            .set(format!("{}{id}", k("r:")), rec)
            .zadd(k("idx"), &id, i)
            .rpush(k("ready:0"), &id);
    }
    pipe.zadd(k("ready"), 0, 0)
        .hset(k("meta"), "dead0", format!("0:3:{ENQ}"))
        .hset(k("payload"), "dead0", "pdead")
        .zadd(k("dead"), "dead0", ENQ)
        .hset(k("err"), "dead0", "boom")
        .hset(k("att"), "dead0", 3)
        .set(format!("{}dead0", k("r:")), short_record("failed"))
        .zadd(k("idx"), "dead0", waiting)
        .set(k("seq"), waiting + 1);
    let () = pipe.query_async(c).await.unwrap();
}

/// Tells the test each task it handled (id, payload).
struct Seen(std::sync::mpsc::Sender<(String, Vec<u8>)>);

impl Handler for Seen {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Err(HandlerError::new("built by the test"))
    }

    fn handle(&mut self, _: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        for t in batch {
            let _ = self.0.send((t.id.clone(), t.payload.clone()));
        }
        vec![Outcome::done(); batch.len()]
    }
}

fn tracked() -> QueueLimits {
    QueueLimits {
        track: true,
        ..QueueLimits::default()
    }
}

async fn client(redis: &TestRedis) -> QueueClient {
    redis.client().await
}

#[tokio::test]
async fn a_layout_1_queue_is_migrated_while_a_producer_and_a_slot_wait_and_nothing_is_lost() {
    let redis = TestRedis::start();
    let client = client(&redis).await;
    migrated_while_running(&redis.url(), &client, "legacy").await;
}

/// The same on a Redis Cluster: the migration's calls, like every queue call, touch the
/// queue's one hash slot.
#[tokio::test]
async fn a_layout_1_queue_on_a_redis_cluster_is_migrated_while_it_runs() {
    let url = crate::harness::shared_cluster_url();
    let client = QueueClient::connect(&url, "test", &Default::default())
        .await
        .unwrap();
    migrated_while_running(&url, &client, "legacy_on_cluster").await;
}

/// A queue `name` of layout 1 with 40 waiting tasks and a dead letter, migrated by the
/// binary (`--budget 3`) while an in-process slot and producer, refused meanwhile, wait:
/// afterwards every task is handled once and every record and the dead letter read right.
async fn migrated_while_running(url: &str, client: &QueueClient, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir, &[name]);
    let mut c = client.connection();
    write_layout_1(&mut c, name, 40).await;
    let q = client.queue_with(name, tracked()).unwrap();

    // The slot and the producer start first: this gaffer's scripts refuse the queue.
    let mut cfg = QueueConfig::new(name, HandlerConfig::named(HandlerConfig::NOOP));
    cfg.track = true;
    cfg.batch_size = 7;
    let (report, _events) = UnixDatagram::pair().unwrap();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    let stop = CancellationToken::new();
    let slot = {
        let spec = crate::harness::slot_spec_at(url, cfg, 1, report);
        let stop = stop.clone();
        std::thread::spawn(move || run_slot(spec, Box::new(Seen(seen_tx)), Some(stop)))
    };
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let producer = {
        let (q, refused) = (q.clone(), refused.clone());
        tokio::spawn(async move {
            for i in 0..30 {
                let task = NewTask::new(format!("n{i}")).id(format!("n{i}"));
                loop {
                    match q.enqueue(task.clone()).await {
                        Ok(_) => break,
                        Err(QueueError::Layout { found: 1, need, .. })
                            if need == layout::CURRENT =>
                        {
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(e) => panic!("enqueue n{i}: {e}"),
                    }
                }
            }
        })
    };
    eventually(Duration::from_secs(10), "a refused enqueue", || async {
        refused.load(std::sync::atomic::Ordering::Relaxed) > 0
    })
    .await;
    let report = migrate_json(url, &config, &["--budget", "3"]);
    assert_eq!(report["from"], 1, "{report}");
    assert_eq!(report["layout"], layout::CURRENT, "{report}");
    assert_eq!(report["done"], true);
    assert!(report["calls"].as_u64().unwrap() > 10, "{report}");
    producer.await.unwrap();

    // Every task once: the 40 old ones with their payloads, and the 30 new.
    let mut handled: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    eventually(Duration::from_secs(30), "every task handled", || {
        for (id, payload) in seen.try_iter() {
            assert!(handled.insert(id.clone(), payload).is_none(), "{id} twice");
        }
        let n = handled.len();
        async move { n == 70 }
    })
    .await;
    stop.cancel();
    slot.join().unwrap();
    for i in 0..40 {
        assert_eq!(handled[&format!("w{i}")], format!("p{i}").as_bytes());
        let rec = q.record(&format!("w{i}")).await.unwrap().expect("record");
        assert_eq!(rec.state, RecordState::Done, "w{i}");
        assert_eq!((rec.priority, rec.max_attempts), (0, 3));
    }
    for i in 0..30 {
        assert_eq!(handled[&format!("n{i}")], format!("n{i}").as_bytes());
    }
    let dead = q.dead(0, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].id.as_str(), &dead[0].payload[..]),
        ("dead0", &b"pdead"[..])
    );
    assert_eq!(
        q.record("dead0").await.unwrap().unwrap().state,
        RecordState::Failed
    );
    let s = q.stats().await.unwrap();
    assert_eq!((s.ready, s.leased, s.delayed, s.dead), (0, 0, 0, 1));
    let meta: bool = c.exists(key(name, "meta")).await.unwrap();
    assert!(!meta, "the meta hash is gone");
    let (stamped, position): (Option<u32>, Option<String>) = redis::cmd("HMGET")
        .arg(key(name, "conf"))
        .arg(layout::FIELD)
        .arg(gaffer::queue_client::MIGRATE_FIELD)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!((stamped, position), (Some(layout::CURRENT), None));
}

#[tokio::test]
async fn every_script_refuses_a_layout_1_queue_holding_data() {
    let redis = TestRedis::start();
    write_layout_1(&mut redis.raw().await, "old", 2).await;
    let client = client(&redis).await;
    let q = client.queue_with("old", tracked()).unwrap();
    let want = format!(
        "queue old has layout 1, this gaffer needs layout {}: run gaffer migrate old",
        layout::CURRENT
    );
    let refused = |r: Result<(), QueueError>| match r {
        Err(e @ QueueError::Layout { found: 1, need, .. }) if need == layout::CURRENT => {
            assert_eq!(e.to_string(), want)
        }
        other => panic!("not refused: {other:?}"),
    };
    refused(q.enqueue(NewTask::new("x")).await.map(drop));
    refused(q.take(10, Duration::from_secs(30)).await.map(drop));
    refused(q.stats().await.map(drop));
    refused(q.record("w0").await.map(drop));
    refused(q.dead(0, 10).await.map(drop));
    // Nothing was written: the old tasks wait as they were.
    let mut c = redis.raw().await;
    let ready: u64 = c.llen(key("old", "ready:0")).await.unwrap();
    let stamp: Option<String> = c.hget(key("old", "conf"), layout::FIELD).await.unwrap();
    assert_eq!((ready, stamp), (2, None));
}

#[tokio::test]
async fn a_new_queue_is_stamped_by_its_first_write_and_not_by_a_read() {
    let redis = TestRedis::start();
    let client = client(&redis).await;
    let q = client.queue_with("fresh", tracked()).unwrap();
    let mut c = redis.raw().await;
    let s = q.stats().await.unwrap();
    assert_eq!(s.ready, 0);
    let conf: bool = c.exists(key("fresh", "conf")).await.unwrap();
    assert!(!conf, "a read stamped the queue");
    q.enqueue(NewTask::new("x").id("a")).await.unwrap();
    let stamp: Option<u32> = c.hget(key("fresh", "conf"), layout::FIELD).await.unwrap();
    assert_eq!(stamp, Some(layout::CURRENT));
    // Stamped, the queue's scripts run as before, and migrate has nothing to do.
    assert_eq!(
        q.take(10, Duration::from_secs(30))
            .await
            .unwrap()
            .tasks
            .len(),
        1
    );
    let dir = tempfile::tempdir().unwrap();
    let report = migrate_json(&redis.url(), &config(&dir, &["fresh"]), &[]);
    assert_eq!(
        (&report["from"], &report["calls"], &report["done"]),
        (
            &serde_json::json!(layout::CURRENT),
            &serde_json::json!(0),
            &serde_json::json!(true)
        )
    );
}

#[tokio::test]
async fn an_interrupted_migrate_goes_on_from_its_position() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir, &["cut", "whole"]);
    write_layout_1(&mut redis.raw().await, "cut", 20).await;
    write_layout_1(&mut redis.raw().await, "whole", 20).await;
    let first = migrate_json(
        &redis.url(),
        &config,
        &["cut", "--budget", "2", "--calls", "3"],
    );
    assert_eq!(
        (&first["done"], &first["calls"]),
        (&serde_json::json!(false), &serde_json::json!(3))
    );
    let mut c = redis.raw().await;
    let position: String = c
        .hget(key("cut", "conf"), gaffer::queue_client::MIGRATE_FIELD)
        .await
        .unwrap();
    assert!(position.starts_with("forms r "), "{position}");
    // Still refused meanwhile.
    let q = client(&redis).await.queue_with("cut", tracked()).unwrap();
    assert!(matches!(q.stats().await, Err(QueueError::Layout { .. })));

    let second = migrate_json(&redis.url(), &config, &["cut", "--budget", "2"]);
    assert_eq!(second["resumed_from"], position.as_str());
    assert_eq!(second["done"], true);
    // What the two runs looked at is what one whole run of the same data looks at: the
    // second did not start over.
    let whole = migrate_json(&redis.url(), &config, &["whole", "--budget", "2"]);
    assert_eq!(whole["resumed_from"], serde_json::Value::Null);
    let looked = |v: &serde_json::Value| v["looked_at"].as_u64().unwrap();
    assert_eq!(looked(&first) + looked(&second), looked(&whole));
    assert_eq!(q.stats().await.unwrap().ready, 20);
    let task = q
        .take(1, Duration::from_secs(30))
        .await
        .unwrap()
        .tasks
        .remove(0);
    assert_eq!((task.id.as_str(), &task.payload[..]), ("w0", &b"p0"[..]));
}

#[tokio::test]
async fn a_master_runs_no_slot_for_a_queue_of_a_newer_layout_and_says_so() {
    let queues = "[queues.fine]\nhandler = \"noop\"\n\n[queues.newer]\nhandler = \"noop\"\n";
    let m = crate::host::TestMaster::start(queues, &[("fine", 1)]).await;
    let newer = layout::CURRENT + 1;
    let mut c = m.redis.raw().await;
    let () = c
        .hset(key("newer", "conf"), layout::FIELD, newer)
        .await
        .unwrap();
    crate::host::publish(&m.client, 2, &[("fine", 1), ("newer", 2)]).await;
    let want = format!(
        "queue newer has layout {newer}, this gaffer needs layout {}: upgrade gaffer",
        layout::CURRENT
    );
    let status = m
        .wait_status("the queue refused", Duration::from_secs(20), |s| {
            s["host"]["queues"]["newer"]["refused"].as_str() == Some(want.as_str())
        })
        .await;
    let serving = |s: &serde_json::Value, q: &str| {
        crate::host::slots(s)
            .iter()
            .filter(|slot| slot["queue"] == q)
            .count()
    };
    assert_eq!(
        (serving(&status, "newer"), serving(&status, "fine")),
        (0, 1)
    );
    assert_eq!(status["host"]["queues"]["newer"]["crashes_total"], 0);
    // (`gaffer stats` is of this layout too: its own read is refused first)
    let stats = m.stats_json();
    assert_eq!(stats["queues"]["newer"]["refused"], want.as_str());
    assert!(stats["queues"]["fine"]["refused"].is_null());
    let said = m.log().matches("running no slot for the queue").count();
    assert_eq!(said, 1, "{}", m.log());
}

/// A queue waiting for `gaffer migrate` does not stop the manager's tick: the other
/// queues are still decided and placed.
#[tokio::test]
async fn the_manager_goes_on_deciding_while_a_queue_waits_for_migrate() {
    use gaffer::cluster::{self, HostReport, Keys};
    let redis = TestRedis::start();
    write_layout_1(&mut redis.raw().await, "old", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let text = format!(
        "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n\
         [manager]\ntick = \"200ms\"\nheartbeat_timeout = \"5s\"\n\n\
         [queues.old]\nhandler = \"noop\"\nmin_slots = 1\n\n\
         [queues.work]\nhandler = \"noop\"\nmin_slots = 1\n",
        redis.url()
    );
    std::fs::write(&config, text).unwrap();
    let log = dir.path().join("manager.log");
    let http = gaffer::redis_server::free_port().unwrap();
    let mut manager = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&config)
        .arg("manager")
        .env("GAFFER_LOG", "info")
        .env("GAFFER_MANAGER_HTTP", format!("127.0.0.1:{http}"))
        .env(crate::harness::ANY_LOAD.0, crate::harness::ANY_LOAD.1)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let client = client(&redis).await;
    let placed = crate::harness::poll_some(Duration::from_secs(30), "work placed on h1", || {
        let client = client.clone();
        async move {
            let report = HostReport {
                host: "h1".into(),
                ts_ms: cluster::now_ms(),
                capacity: 20,
                handlers: vec!["noop".into()],
                ..HostReport::default()
            };
            let keys = Keys::new("test");
            cluster::publish_host(&mut client.connection(), &keys, &report)
                .await
                .unwrap();
            let map = cluster::read_map(&mut client.connection(), &keys)
                .await
                .unwrap();
            map.and_then(|m| m.for_host("h1").get("work").copied())
        }
    })
    .await;
    let _ = manager.kill();
    let _ = manager.wait();
    assert!(placed >= 1, "{}", std::fs::read_to_string(&log).unwrap());
}

/// A full record as layout 1 wrote it (eight head fields: priority, max_attempts, created,
/// due, submitted_by, error, result, chain), then its history.
fn record_1(by: &str, chain: &str, state: &str) -> String {
    format!(
        "0\x1f3\x1f{ENQ}\x1f{ENQ}\x1f{by}\x1f\x1f\x1f{chain}\x1e{state}\x1f{ENQ}\x1f0\x1f\x1f\x1f"
    )
}

/// Chains as layout 1 kept them on one server are read under their names once migrated: a
/// route chain without a member list (`routed:g1`, its follow-up named from its run), a
/// listed one (`g2`), and a global task still waiting (`g3`, its meta `u`), which a slot
/// of this release then runs, its follow-up joining the chain its record names.
#[tokio::test]
async fn layout_1_chains_are_read_under_their_names_once_migrated() {
    use gaffer::chain::{ChainTargets, read};
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        "[cluster]\nnamespace = \"test\"\n\n[queues.routed]\nhandler = \"noop\"\n\
         next = [{ queue = \"kids\" }]\n\n[queues.kids]\nhandler = \"noop\"\n",
    )
    .unwrap();
    let (r, k) = (|s: &str| key("routed", s), |s: &str| key("kids", s));
    let run1 = format!("routed:g1@{ENQ}.1~1");
    let mut c = redis.raw().await;
    let mut pipe = redis::pipe();
    pipe.hset(r("payload"), "", PIN)
        .set(r("r:g1"), record_1("shop", "routed:g1", "done"))
        .zadd(r("idx"), "g1", 1)
        .set(r("r:g2"), record_1("shop", "g2", "done"))
        .zadd(r("idx"), "g2", 2)
        .hset(r("payload"), "g3", format!("0:3:{ENQ}.3:u\n{{}}"))
        .set(r("r:g3"), record_1("shop", "routed:g3", "waiting"))
        .zadd(r("idx"), "g3", 3)
        .rpush(r("ready:0"), "g3")
        .zadd(r("ready"), 0, 0)
        .set(r("seq"), 3)
        .hset(k("payload"), "", PIN)
        .set(
            format!("{}{run1}", k("r:")),
            record_1("chain:routed:g1", "routed:g1", "done"),
        )
        .zadd(k("idx"), &run1, 1)
        .set(k("r:g2~1"), record_1("chain:g2", "g2", "done"))
        .zadd(k("idx"), "g2~1", 2)
        .set(k("seq"), 2)
        .set("test:{chain:g2}:tasks", "^9:routed\x1fg2");
    let () = pipe.query_async(&mut c).await.unwrap();
    let client = client(&redis).await;
    let cfg = gaffer::config::load(&path).unwrap();
    let targets = ChainTargets::from_config(&cfg);
    let ids = |view: Option<gaffer::chain::ChainView>| {
        let view = view.expect("the chain is known");
        view.tasks
            .iter()
            .map(|t| {
                let parent = t.parent.as_ref().map(|p| p.id.clone()).unwrap_or_default();
                (t.member.id.clone(), parent, t.record.is_some())
            })
            .collect::<Vec<_>>()
    };
    // (until the queues are migrated, a chain's read is refused as any script's)
    let refused = read(&client, &targets, "routed:g1").await.unwrap_err();
    assert!(
        matches!(refused, QueueError::Layout { found: 1, .. }),
        "{refused:?}"
    );
    for queue in ["routed", "kids"] {
        let report = migrate_json(&redis.url(), &path, &[queue]);
        assert_eq!(report["layout"], layout::CURRENT, "{report}");
    }
    let g = |s: &str| s.to_string();
    assert_eq!(
        ids(read(&client, &targets, "routed:g1").await.unwrap()),
        [(g("g1"), g(""), true), (run1.clone(), g("g1"), true)]
    );
    assert_eq!(
        ids(read(&client, &targets, "g2").await.unwrap()),
        [(g("g2"), g(""), true), (g("g2~1"), g("g2"), true)]
    );
    // g3 runs now: its follow-up is named from the chain its meta names.
    let (report, _events) = UnixDatagram::pair().unwrap();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    let stop = CancellationToken::new();
    let slot = {
        let mut spec = crate::harness::slot_spec(&redis, cfg.queues["routed"].clone(), 1, report);
        spec.chains = std::sync::Arc::new(targets.clone());
        let stop = stop.clone();
        std::thread::spawn(move || run_slot(spec, Box::new(Seen(seen_tx)), Some(stop)))
    };
    let kids = client.queue_with("kids", tracked()).unwrap();
    eventually(Duration::from_secs(20), "g3's follow-up made", || async {
        kids.find("routed:g3~1").await.unwrap().is_some()
    })
    .await;
    stop.cancel();
    slot.join().unwrap();
    assert_eq!(
        seen.try_iter().map(|(id, _)| id).collect::<Vec<_>>(),
        ["g3"]
    );
    assert_eq!(
        ids(read(&client, &targets, "routed:g3").await.unwrap()),
        [(g("g3"), g(""), true), (g("routed:g3~1"), g("g3"), true)]
    );
}

/// Turns queue `queue`'s chain rosters back into the lists layout 2 kept, a key per chain
/// (`chain:G`, ids separated by 0x1f, with the roster's expiry), and stamps it layout 2:
/// the only form in which layouts 2 and 3 differ. Returns how many lists it made.
async fn write_as_layout_2(c: &mut impl redis::aio::ConnectionLike, queue: &str) -> usize {
    let rosters: Vec<String> = redis::cmd("KEYS")
        .arg(key(queue, "chains:*"))
        .query_async(c)
        .await
        .unwrap();
    let mut lists: BTreeMap<String, (Vec<String>, i64)> = BTreeMap::new();
    for b in &rosters {
        let v: String = redis::cmd("GET").arg(b).query_async(c).await.unwrap();
        let ttl: i64 = redis::cmd("PTTL").arg(b).query_async(c).await.unwrap();
        for e in v.split_terminator('\u{1e}') {
            let (g, id) = e.split_once('\u{1f}').unwrap();
            let list = lists.entry(g.to_string()).or_insert((Vec::new(), ttl));
            list.0.push(id.to_string());
        }
        let () = redis::cmd("DEL").arg(b).query_async(c).await.unwrap();
    }
    for (g, (ids, ttl)) in &lists {
        let () = redis::cmd("SET")
            .arg(key(queue, &format!("chain:{g}")))
            .arg(ids.join("\u{1f}"))
            .arg("PX")
            .arg(ttl)
            .query_async(c)
            .await
            .unwrap();
    }
    let () = redis::cmd("HSET")
        .arg(key(queue, "conf"))
        .arg(layout::FIELD)
        .arg(2)
        .query_async(c)
        .await
        .unwrap();
    lists.len()
}

/// A queue of layout 2 (its chains' lists a key per chain) is migrated by the binary
/// (`--budget 3`) while a producer and a slot of the parents' queue make new chains whose
/// follow-ups it refuses until then, and a slot of its own waits: afterwards every chain,
/// old and new, reads whole from the rosters, every task ran, and no list of layout 2 is
/// left.
#[tokio::test]
async fn a_layout_2_queue_s_chain_lists_move_into_rosters_while_it_runs() {
    use gaffer::chain::{ChainTargets, read};
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(
        &path,
        "[cluster]\nnamespace = \"test\"\n\n[queues.routed]\nhandler = \"noop\"\ntrack = true\n\
         batch_size = 4\nnext = [{ queue = \"kids\" }]\n\n\
         [queues.kids]\nhandler = \"noop\"\ntrack = true\nbatch_size = 3\n",
    )
    .unwrap();
    let client = client(&redis).await;
    let cfg = gaffer::config::load(&path).unwrap();
    let targets = std::sync::Arc::new(ChainTargets::from_config(&cfg));
    let routed = client
        .queue_with("routed", QueueLimits::from(&cfg.queues["routed"]))
        .unwrap();
    let kids = client.queue_with("kids", tracked()).unwrap();
    // A slot of a queue, its handler telling the test each task it ran.
    let slot_of = |queue: &str, stop: &CancellationToken| {
        let (report, _events) = UnixDatagram::pair().unwrap();
        let (seen_tx, seen) = std::sync::mpsc::channel();
        let mut spec = crate::harness::slot_spec(&redis, cfg.queues[queue].clone(), 1, report);
        spec.chains = targets.clone();
        let stop = stop.clone();
        let slot = std::thread::spawn(move || {
            let _events = _events;
            run_slot(spec, Box::new(Seen(seen_tx)), Some(stop))
        });
        (slot, seen)
    };
    let submit = |from: usize| {
        let routed = routed.clone();
        async move {
            for i in from..from + 20 {
                let task = NewTask::new(format!("p{i}")).id(format!("t{i}"));
                routed.enqueue(task).await.unwrap();
            }
        }
    };

    // Twenty chains made by this release, their lists then written as layout 2 wrote them.
    submit(0).await;
    let stop = CancellationToken::new();
    let (parents, _) = slot_of("routed", &stop);
    eventually(Duration::from_secs(20), "twenty follow-ups", || async {
        kids.stats().await.unwrap().ready == 20
    })
    .await;
    stop.cancel();
    parents.join().unwrap();
    let mut c = redis.raw().await;
    assert_eq!(write_as_layout_2(&mut c, "kids").await, 20);
    let refused = kids.stats().await.unwrap_err();
    assert!(
        matches!(refused, QueueError::Layout { found: 2, .. }),
        "{refused:?}"
    );

    // Twenty more chains, whose follow-ups wait for the migration, and both queues' slots.
    let stop = CancellationToken::new();
    let (parents, _) = slot_of("routed", &stop);
    let (children, seen) = slot_of("kids", &stop);
    submit(20).await;
    let report = migrate_json(&redis.url(), &path, &["kids", "--budget", "3"]);
    assert_eq!(report["from"], 2, "{report}");
    assert_eq!(report["layout"], layout::CURRENT, "{report}");
    assert!(report["calls"].as_u64().unwrap() > 5, "{report}");

    let mut ran: BTreeMap<String, usize> = BTreeMap::new();
    eventually(Duration::from_secs(60), "forty follow-ups ran", || {
        for (id, _) in seen.try_iter() {
            *ran.entry(id).or_default() += 1;
        }
        let n = ran.len();
        async move { n == 40 }
    })
    .await;
    stop.cancel();
    parents.join().unwrap();
    children.join().unwrap();
    assert!(ran.values().all(|&n| n == 1), "{ran:?}");
    for i in 0..40 {
        let chain = gaffer::chain::chain_id("routed", i + 1);
        let view = read(&client, &targets, &chain)
            .await
            .unwrap()
            .expect(&chain);
        let ids: Vec<(&str, &str)> = view
            .tasks
            .iter()
            .map(|t| (t.member.queue.as_str(), t.member.id.as_str()))
            .collect();
        let kid = gaffer::chain::derived_id(&chain, 1);
        assert_eq!(
            ids,
            [("routed", format!("t{i}").as_str()), ("kids", kid.as_str())]
        );
        assert!(ran.contains_key(&kid), "{kid}");
    }
    let lists: Vec<String> = redis::cmd("KEYS")
        .arg(key("kids", "chain:*"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(lists, Vec::<String>::new(), "no list of layout 2 is left");
    let roster = key("kids", "chains:~crouted.0");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&roster)
        .query_async(&mut c)
        .await
        .unwrap();
    let week = 7 * 24 * 3600 * 1000;
    assert!(ttl > 2 * week - 60_000 && ttl <= 2 * week, "{ttl}");
}
