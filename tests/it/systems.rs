//! External systems at run time: `gaffer system NAME pause|resume|disable|enable` on real
//! queues and real master processes, and a system's `rate` held cluster-wide at take time
//! by two masters with four slots.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gaffer::cluster::{self, Keys, SlotMap};
use gaffer::queue_client::{
    NewTask, Queue, QueueClient, QueueLimits, RecordState, Settle, SettleOp, SystemState,
};
use gaffer::redis_server::free_port;

use crate::harness::{ANY_LOAD, TestRedis, eventually};

/// Redis, a config file, the masters started on it (killed on drop).
pub(crate) struct Rig {
    pub redis: TestRedis,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub client: QueueClient,
    pub cfg: gaffer::config::Config,
    masters: Vec<Child>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for c in &mut self.masters {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Rig {
    /// Redis and a config of `tables` (queues, systems) in namespace `test`.
    pub async fn start(tables: &str) -> Self {
        let redis = TestRedis::start();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        let text = format!(
            "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n\
             [master]\ndrain_timeout = \"10s\"\nmemory_reserve = \"64MiB\"\n\n{tables}",
            redis.url()
        );
        std::fs::write(&config, &text).unwrap();
        let cfg = gaffer::config::parse(&text, "config.toml").expect("test config is valid");
        Rig {
            client: redis.client().await,
            redis,
            dir,
            config,
            cfg,
            masters: Vec::new(),
        }
    }

    /// A queue of the config, with its limits (system, ordered) as a slot sees them.
    pub fn queue(&self, name: &str) -> Queue {
        let limits = QueueLimits::from(&self.cfg.queues[name]);
        self.client.queue_with(name, limits).unwrap()
    }

    /// Runs the CLI; returns stdout, failing the test on a non-zero exit.
    pub fn cli(&self, args: &[&str]) -> String {
        crate::harness::gaffer_ok(&self.config, args)
    }

    /// Rewrites the config file with `tables` (queues, systems), as an operator edits it.
    pub fn rewrite(&self, tables: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        let head = &text[..text.find("\n\n[master]").unwrap()];
        let master = "[master]\ndrain_timeout = \"10s\"\nmemory_reserve = \"64MiB\"\n\n";
        std::fs::write(&self.config, format!("{head}\n\n{master}{tables}")).unwrap();
    }

    /// Starts a manager on the config file.
    pub fn manager(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("manager.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--config")
            .arg(&self.config)
            .arg("manager")
            .env("GAFFER_LOG", "info")
            .env(
                "GAFFER_MANAGER_HTTP",
                format!("127.0.0.1:{}", free_port().unwrap()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.masters.push(child);
    }

    /// Publishes a map (host → queue → slots) and starts a master per host in it.
    pub async fn masters(&mut self, map: &[(&str, &str, u32)]) {
        let mut hosts: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
        for (host, queue, n) in map {
            hosts
                .entry(host.to_string())
                .or_default()
                .insert(queue.to_string(), *n);
        }
        let slot_map = SlotMap {
            epoch: 1,
            version: 1,
            hosts: hosts.clone(),
        };
        cluster::write_map_unfenced(&mut self.client.connection(), &Keys::new("test"), &slot_map)
            .await
            .unwrap();
        for host in hosts.keys() {
            let log = std::fs::File::create(self.dir.path().join(format!("{host}.log"))).unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
                .arg("--config")
                .arg(&self.config)
                .args(["master", "--host", host])
                .env("GAFFER_LOG", "info")
                .env(ANY_LOAD.0, ANY_LOAD.1)
                .env(
                    "GAFFER_MASTER_HTTP",
                    format!("127.0.0.1:{}", free_port().unwrap()),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            self.masters.push(child);
        }
    }
}

/// Enqueues `n` tasks with payload `{}`; returns their ids.
pub(crate) async fn enqueue(q: &Queue, n: usize) -> Vec<String> {
    let tasks: Vec<NewTask> = (0..n).map(|_| NewTask::new(b"{}".to_vec())).collect();
    q.enqueue_many(&tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// Switches system `partner` as `gaffer system partner …` does.
/// How many tasks a take of up to `n` from `q` gets (leased for a minute).
async fn took(q: &Queue, n: usize) -> usize {
    q.take(n, Duration::from_secs(60))
        .await
        .unwrap()
        .tasks
        .len()
}

async fn switch(rig: &Rig, state: SystemState) {
    rig.client
        .set_system(&rig.cfg, "partner", state)
        .await
        .unwrap();
}

/// Removes the calls queue's copy of its system's switch, as if it had just joined.
async fn forget_switch(rig: &Rig) {
    let mut raw = rig.redis.raw().await;
    let _: () = redis::cmd("HDEL")
        .arg("test:{calls}:conf")
        .arg("system")
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// The cluster's hash of switches lost (its node failed over, or it was deleted), while
/// the queues keep their copies.
async fn cluster_loses_its_switches(rig: &Rig) {
    let mut raw = rig.redis.raw().await;
    let _: () = redis::cmd("DEL")
        .arg("test:{cluster}:systems")
        .query_async(&mut raw)
        .await
        .unwrap();
}

/// The note of a task's last history entry, and its state.
async fn last_note(q: &Queue, id: &str) -> (RecordState, String) {
    let r = q.record(id).await.unwrap().expect("a record");
    let last = r.history.unwrap().pop().unwrap();
    (r.state, last.note.unwrap_or_default())
}

const PARTNER: &str = "[systems.partner]\nmax_concurrency = 4\n\n\
    [queues.calls]\nhandler = \"noop\"\nsystem = \"partner\"\nbatch_size = 10\n\n\
    [queues.other]\nhandler = \"noop\"\n";

/// A pause notes, and a disable cancels, the waiting tasks of a packet of follow-ups
/// (ARCHITECTURE.md, invariant 36) as it does tasks enqueued one by one, each alone.
#[tokio::test]
async fn a_packets_waiting_tasks_are_noted_and_cancelled_by_the_switches() {
    let rig = Rig::start(PARTNER).await;
    let limits = QueueLimits {
        packets: true,
        ..QueueLimits::from(&rig.cfg.queues["calls"])
    };
    let q = rig.client.queue_with("calls", limits).unwrap();
    let kids: Vec<NewTask> = (1..=5)
        .map(|i| {
            NewTask::new("{}")
                .id(format!("G~{i}"))
                .chain(gaffer::queue_client::TaskChain::FollowUp("G".into()))
        })
        .collect();
    q.enqueue_many(&kids).await.unwrap();
    q.enqueue(NewTask::new("{}").id("plain")).await.unwrap();
    let mut raw = rig.redis.raw().await;
    let alone: i64 = redis::cmd("EXISTS")
        .arg("test:{calls}:r:G~3")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(alone, 0, "the follow-ups were enqueued as a packet");
    let ids: Vec<String> = (1..=5)
        .map(|i| format!("G~{i}"))
        .chain(["plain".into()])
        .collect();
    let set = |state| rig.client.set_system(&rig.cfg, "partner", state);
    let paused = set(SystemState::Paused).await.unwrap();
    assert_eq!(paused.noted, 6, "{paused:?}");
    for id in &ids {
        let note = (
            RecordState::Waiting,
            "held: system partner is paused".into(),
        );
        assert_eq!(last_note(&q, id).await, note, "{id}");
    }
    // Its record written, a packet's task still waits in its packet: its id is taken.
    let again = q.enqueue(NewTask::new("{}").id("G~2")).await.unwrap();
    assert!(!again.created, "{again:?}");
    let disabled = set(SystemState::Disabled).await.unwrap();
    assert_eq!(disabled.cancelled, 6, "{disabled:?}");
    for id in &ids {
        let note = (RecordState::Cancelled, "system partner is disabled".into());
        assert_eq!(last_note(&q, id).await, note, "{id}");
    }
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.ready, stats.leased, stats.cancelled_total),
        (0, 0, 6)
    );
    set(SystemState::Active).await.unwrap();
    assert!(
        q.take(10, Duration::from_secs(30))
            .await
            .unwrap()
            .tasks
            .is_empty()
    );
}

#[tokio::test]
async fn disable_cancels_waiting_and_new_tasks_with_the_note_and_enable_runs_again() {
    let mut rig = Rig::start(PARTNER).await;
    let q = rig.queue("calls");
    let other = rig.queue("other");
    let waiting = enqueue(&q, 100).await;
    enqueue(&other, 3).await;

    let (out, said) =
        crate::harness::gaffer_ok_with_stderr(&rig.config, &["system", "partner", "disable"]);
    assert!(out.contains("100 waiting tasks cancelled"), "{out}");
    // The sweep's progress, on stderr (a line a second at most off a terminal: the first).
    assert!(said.starts_with("system partner: "), "{said}");
    assert!(said.contains(" cancelled in calls"), "{said}");
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.ready, stats.delayed), (0, 0), "{stats:?}");
    for id in &waiting {
        let (state, note) = last_note(&q, id).await;
        assert_eq!(state, RecordState::Cancelled, "{id}");
        assert_eq!(note, "system partner is disabled", "{id}");
    }
    // A queue of no system is untouched.
    assert_eq!(other.stats().await.unwrap().ready, 3);

    // New tasks are cancelled on arrival, naming the system.
    let late = enqueue(&q, 1).await.remove(0);
    assert_eq!(
        last_note(&q, &late).await,
        (RecordState::Cancelled, "system partner is disabled".into())
    );
    let listed: serde_json::Value = serde_json::from_str(&rig.cli(&["system", "--json"])).unwrap();
    assert_eq!(listed["partner"]["state"], "disabled", "{listed}");

    // Enabled: a slot of a real master runs new tasks.
    rig.cli(&["system", "partner", "enable"]);
    rig.masters(&[("h1", "calls", 1)]).await;
    let fresh = enqueue(&q, 20).await;
    eventually(Duration::from_secs(30), "20 tasks acked", || async {
        q.stats().await.unwrap().acked_total == 20
    })
    .await;
    for id in &fresh {
        assert_eq!(
            q.record(id).await.unwrap().unwrap().state,
            RecordState::Done
        );
    }
}

#[tokio::test]
async fn a_tick_that_read_the_switches_before_an_operator_switched_leaves_them_alone() {
    let rig = Rig::start(PARTNER).await;
    let q = rig.queue("calls");
    let (client, cfg) = (&rig.client, &rig.cfg);
    // The manager read the switches (none yet), then an operator disabled the system
    // before the tick copied its reading to the queues.
    let before = client.read_switches().await.unwrap();
    switch(&rig, SystemState::Disabled).await;
    let changed = client
        .reconcile_system_switches(cfg, &before)
        .await
        .unwrap();
    assert!(changed.is_empty(), "an older reading is refused");
    let late = enqueue(&q, 1).await.remove(0);
    assert_eq!(
        last_note(&q, &late).await,
        (RecordState::Cancelled, "system partner is disabled".into()),
        "still disabled"
    );

    // The other way round: a reading of the disable, then an enable.
    let disabled = client.read_switches().await.unwrap();
    assert_eq!(disabled.states["partner"], SystemState::Disabled);
    switch(&rig, SystemState::Active).await;
    let changed = client
        .reconcile_system_switches(cfg, &disabled)
        .await
        .unwrap();
    assert!(changed.is_empty());
    let fresh = enqueue(&q, 2).await;
    let none = std::collections::BTreeSet::new();
    let swept = client.sweep_disabled(cfg, &disabled, &none).await.unwrap();
    assert_eq!(swept, 0, "a sweep from an older reading cancels nothing");
    assert_eq!(
        q.stats().await.unwrap().ready,
        2,
        "enabled: new tasks wait to run"
    );
    for id in &fresh {
        assert_eq!(last_note(&q, id).await.0, RecordState::Waiting, "{id}");
    }

    // A queue without its copy (it joined the system, say) gets it from a current reading.
    let now = client.read_switches().await.unwrap();
    forget_switch(&rig).await;
    switch(&rig, SystemState::Paused).await;
    let paused = client.read_switches().await.unwrap();
    assert!(
        client
            .reconcile_system_switches(cfg, &now)
            .await
            .unwrap()
            .is_empty(),
        "the pause is newer than that reading"
    );
    forget_switch(&rig).await;
    let calls = std::collections::BTreeSet::from(["calls".to_string()]);
    let changed = client
        .reconcile_system_switches(cfg, &paused)
        .await
        .unwrap();
    assert_eq!(changed, calls);
    let lease = Duration::from_secs(60);
    assert!(q.take(10, lease).await.unwrap().tasks.is_empty(), "paused");

    // An older gaffer's `enable` counts no generation: a tick that read the disable
    // before it writes it back, but does not sweep that queue until it reads again.
    switch(&rig, SystemState::Disabled).await;
    let disabled = client.read_switches().await.unwrap();
    let mut raw = rig.redis.raw().await;
    let _: () = redis::pipe()
        .hset("test:{cluster}:systems", "partner", "active")
        .hset("test:{calls}:conf", "system", "active:partner")
        .query_async(&mut raw)
        .await
        .unwrap();
    let fresh = enqueue(&q, 2).await;
    let changed = client
        .reconcile_system_switches(cfg, &disabled)
        .await
        .unwrap();
    assert_eq!(changed, calls);
    let swept = client
        .sweep_disabled(cfg, &disabled, &changed)
        .await
        .unwrap();
    assert_eq!(swept, 0);
    for id in &fresh {
        assert_eq!(last_note(&q, id).await.0, RecordState::Waiting, "{id}");
    }
    let now = client.read_switches().await.unwrap();
    assert_eq!(now.states["partner"], SystemState::Active);
    client.reconcile_system_switches(cfg, &now).await.unwrap();
    assert_eq!(
        q.take(10, lease).await.unwrap().tasks.len(),
        2,
        "active again"
    );
}

/// The cluster's hash of switches lost (flushed, or a failover that lost writes): a queue
/// keeps a copy of a higher generation than the count starts from again, and the next
/// switch outcounts it rather than being refused.
#[tokio::test]
async fn a_switch_outcounts_a_copy_the_cluster_lost_count_of() {
    let rig = Rig::start(PARTNER).await;
    let q = rig.queue("calls");
    let (client, cfg) = (&rig.client, &rig.cfg);
    for state in [SystemState::Paused, SystemState::Disabled] {
        client.set_system(cfg, "partner", state).await.unwrap();
    }
    cluster_loses_its_switches(&rig).await;
    switch(&rig, SystemState::Active).await;
    let ids = enqueue(&q, 2).await;
    for id in &ids {
        assert_eq!(last_note(&q, id).await.0, RecordState::Waiting, "{id}");
    }
    let lease = Duration::from_secs(60);
    assert_eq!(q.take(10, lease).await.unwrap().tasks.len(), 2, "active");
    let now = client.read_switches().await.unwrap();
    assert_eq!(now.states["partner"], SystemState::Active);
    assert_eq!(now.gens["partner"], 3, "past the queue's 2");
}

#[tokio::test]
async fn what_waits_again_under_a_disabled_system_is_cancelled_by_the_manager() {
    let mut rig = Rig::start(PARTNER).await;
    let q = rig.queue("calls");
    let ids = enqueue(&q, 3).await;
    // Two of them run when the system is disabled: one is retried after, the other's slot
    // dies (its lease runs out); the third waits, and the switch's sweep cancels it.
    let retried = q.take(1, Duration::from_secs(60)).await.unwrap();
    let lost = q.take(1, Duration::from_millis(300)).await.unwrap();
    let change = rig
        .client
        .set_system(&rig.cfg, "partner", SystemState::Disabled)
        .await
        .unwrap();
    assert_eq!(change.cancelled, 1);
    assert_eq!(last_note(&q, &ids[2]).await.0, RecordState::Cancelled);
    let retry = Settle::Retry {
        delay: Duration::ZERO,
        priority: None,
        reason: "try again".into(),
    };
    q.settle(&[SettleOp::new(&retried.tasks[0], retry)])
        .await
        .unwrap();
    assert_eq!(q.stats().await.unwrap().ready, 1, "waiting again");

    rig.manager();
    let again = [&retried.tasks[0].id, &lost.tasks[0].id];
    eventually(Duration::from_secs(30), "both cancelled", || async {
        let mut all = true;
        for id in again {
            all &= last_note(&q, id).await.0 == RecordState::Cancelled;
        }
        all
    })
    .await;
    for id in again {
        assert_eq!(
            last_note(&q, id).await,
            (RecordState::Cancelled, "system partner is disabled".into()),
            "{id}"
        );
    }
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.ready, stats.delayed, stats.leased),
        (0, 0, 0),
        "{stats:?}"
    );
}

#[tokio::test]
async fn pause_holds_tasks_with_a_note_and_resume_runs_them_all() {
    let mut rig = Rig::start(PARTNER).await;
    let q = rig.queue("calls");
    let before = enqueue(&q, 10).await;
    let out = rig.cli(&["system", "partner", "pause"]);
    assert!(out.contains("10 waiting tasks held"), "{out}");
    for id in &before {
        assert_eq!(
            last_note(&q, id).await,
            (
                RecordState::Waiting,
                "held: system partner is paused".into()
            )
        );
    }
    // A take hands out nothing while paused, whoever asks.
    assert_eq!(took(&q, 10).await, 0, "nothing while paused");

    // A running slot stops taking too: its wake-ups are spent, nothing is leased.
    rig.masters(&[("h1", "calls", 2)]).await;
    let during = enqueue(&q, 40).await;
    assert_eq!(
        last_note(&q, &during[0]).await,
        (
            RecordState::Waiting,
            "held: system partner is paused".into()
        )
    );
    let wake = "test:{calls}:wake".to_string();
    let conn = rig.client.connection();
    eventually(
        Duration::from_secs(30),
        "the slots spent their wake-ups",
        || {
            let mut conn = conn.clone();
            let wake = wake.clone();
            async move {
                let n: u64 = redis::cmd("LLEN")
                    .arg(&wake)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                n == 0
            }
        },
    )
    .await;
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.leased, stats.acked_total, stats.ready),
        (0, 0, 50),
        "{stats:?}"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&rig.cli(&["system", "partner", "--json"])).unwrap();
    assert_eq!(listed["partner"]["state"], "paused", "{listed}");

    rig.cli(&["system", "partner", "resume"]);
    eventually(Duration::from_secs(30), "all 50 acked", || async {
        q.stats().await.unwrap().acked_total == 50
    })
    .await;
    for id in before.iter().chain(&during) {
        assert_eq!(
            q.record(id).await.unwrap().unwrap().state,
            RecordState::Done,
            "{id}"
        );
    }
}

#[tokio::test]
async fn a_configured_pause_holds_until_resumed_at_run_time() {
    let rig = Rig::start(
        "[systems.partner]\npaused = true\n\n\
         [queues.calls]\nhandler = \"noop\"\nsystem = \"partner\"\n",
    )
    .await;
    let q = rig.queue("calls");
    let ids = enqueue(&q, 5).await;
    // Held with the pause's note from their enqueue on, no switch set.
    for id in &ids {
        assert_eq!(
            last_note(&q, id).await,
            (
                RecordState::Waiting,
                "held: system partner is paused".into()
            ),
            "{id}"
        );
    }
    assert_eq!(took(&q, 10).await, 0, "nothing while paused");
    let listed: serde_json::Value = serde_json::from_str(&rig.cli(&["stats", "--json"])).unwrap();
    assert_eq!(listed["systems"]["partner"]["state"], "paused", "{listed}");
    assert_eq!(listed["systems"]["partner"]["switched"], false, "{listed}");
    rig.cli(&["system", "partner", "resume"]);
    assert_eq!(took(&q, 10).await, 5);
}

#[tokio::test]
async fn an_unknown_system_is_bad_usage() {
    let rig = Rig::start(PARTNER).await;
    let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&rig.config)
        .args(["system", "nope", "pause"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown system `nope`"), "{err}");
}

/// An exec handler that appends each task's start time (ms) to the file in `START_LOG`
/// and acks it; warm-up tasks (`{"warm": true}`) are acked unlogged.
const STARTS: &str = r#"
import json, os, sys, time
log = os.environ["START_LOG"]
for line in sys.stdin:
    batch = json.loads(line)["batch"]
    with open(log, "a") as f:
        for t in batch:
            if not t["payload"].get("warm"):
                f.write("%d\n" % int(time.time() * 1000))
    sys.stdout.write(json.dumps({"results": [{"id": t["id"], "status": "ok"} for t in batch]}) + "\n")
    sys.stdout.flush()
"#;

#[tokio::test]
async fn a_rate_cap_holds_across_two_hosts_and_four_slots() {
    const RATE: usize = 50;
    const BATCH: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("starts.py");
    std::fs::write(&script, STARTS).unwrap();
    let log = dir.path().join("starts.log");
    let tables = format!(
        "[systems.partner]\nrate = \"{RATE}/s\"\n\n\
         [queues.calls]\nhandler = \"exec\"\ncommand = [\"env\", \"START_LOG={}\", \"python3\", \"{}\"]\n\
         system = \"partner\"\nbatch_size = {BATCH}\n",
        log.display(),
        script.display()
    );
    let mut rig = Rig::start(&tables).await;
    let q = rig.queue("calls");
    rig.masters(&[("h1", "calls", 2), ("h2", "calls", 2)]).await;
    // Warm-up: the slots' exec children are running (a child's start would delay its
    // first batch, bunching the starts after it) and the bucket is in its steady state.
    let warm: Vec<NewTask> = (0..8 * BATCH)
        .map(|_| NewTask::new(br#"{"warm":true}"#.to_vec()))
        .collect();
    q.enqueue_many(&warm).await.unwrap();
    eventually(Duration::from_secs(60), "warm-up tasks acked", || async {
        q.stats().await.unwrap().acked_total == warm.len() as u64
    })
    .await;
    // More than 20 s of work at the cap, so the cap, not the backlog, sets the pace.
    enqueue(&q, 25 * RATE).await;
    let starts = || -> Vec<u64> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    };
    eventually(Duration::from_secs(90), "20 s of tasks started", || async {
        let s = starts();
        s.len() > 2 * BATCH && s.iter().max().unwrap() - s.iter().min().unwrap() >= 20_000
    })
    .await;
    let s = starts();
    let first = *s.iter().min().unwrap();
    let mut per_second: BTreeMap<u64, usize> = BTreeMap::new();
    for t in &s {
        *per_second.entry((t - first) / 1000).or_default() += 1;
    }
    let worst = per_second.values().max().copied().unwrap();
    assert!(
        worst <= RATE + BATCH,
        "{worst} tasks started in one second, over the cap {RATE}/s by more than a batch ({BATCH}): {per_second:?}"
    );
    let listed: serde_json::Value = serde_json::from_str(&rig.cli(&["system", "--json"])).unwrap();
    assert!(
        listed["partner"]["started_total"].as_u64().unwrap() >= s.len() as u64,
        "{listed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_switches_a_system() {
    const OPS: &str = "ops-token";
    const SHOP: &str = "shop-token";
    let keys = format!(
        "[api.keys.ops]\ntoken_sha256 = \"{}\"\nadmin = true\n\n\
         [api.keys.shop]\ntoken_sha256 = \"{}\"\nqueues = [\"calls\"]\n",
        gaffer::api::hash_token(OPS),
        gaffer::api::hash_token(SHOP)
    );
    let rig = Rig::start(&format!("{PARTNER}\n{keys}")).await;
    let q = rig.queue("calls");
    enqueue(&q, 7).await;
    let mut opts = gaffer::api::ApiOptions::new(rig.cfg.clone(), rig.redis.url());
    opts.listen = Some("127.0.0.1:0".parse().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(gaffer::api::run(opts, stop.clone(), Some(tx)));
    let addr = rx.await.expect("the api binds");
    let post = |path: &'static str, token: &'static str| async move {
        let (st, body) = crate::api::request(addr, "POST", path, Some(token), Some(b"")).await;
        (
            st,
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
        )
    };

    let (st, body) = post("/v1/systems/partner/disable", SHOP).await;
    assert_eq!(st, 403, "{body}");
    assert_eq!(
        q.stats().await.unwrap().ready,
        7,
        "a refused request changes nothing"
    );
    let (st, body) = post("/v1/systems/nope/pause", OPS).await;
    assert_eq!(
        (st, body["error"].as_str()),
        (404, Some("unknown system nope"))
    );

    let (st, body) = post("/v1/systems/partner/disable", OPS).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        (
            body["state"].as_str(),
            body["was"].as_str(),
            body["cancelled"].as_u64()
        ),
        (Some("disabled"), Some("active"), Some(7)),
        "{body}"
    );
    assert_eq!(q.stats().await.unwrap().ready, 0);
    let (st, body) = post("/v1/systems/partner/enable", OPS).await;
    assert_eq!(
        (st, body["state"].as_str()),
        (200, Some("active")),
        "{body}"
    );
    enqueue(&q, 1).await;
    assert_eq!(
        q.stats().await.unwrap().ready,
        1,
        "enabled: new tasks wait to run"
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn switches_and_the_rate_bucket_work_on_a_redis_cluster() {
    // The switch's cluster key, each queue's conf and the bucket are in three hash slots.
    let client = crate::harness::shared_cluster_client().await;
    let mut cfg = gaffer::config::parse(
        "[systems.sys_cluster]\nrate = \"1000/s\"\n\n\
         [queues.sys_cluster_a]\nhandler = \"noop\"\nsystem = \"sys_cluster\"\n\n\
         [queues.sys_cluster_b]\nhandler = \"noop\"\nsystem = \"sys_cluster\"\n",
        "cluster.toml",
    )
    .unwrap();
    cfg.cluster.namespace = "test".into();
    let queue = |name: &str| {
        client
            .queue_with(name, QueueLimits::from(&cfg.queues[name]))
            .unwrap()
    };
    let (a, b) = (queue("sys_cluster_a"), queue("sys_cluster_b"));
    enqueue(&a, 5).await;
    enqueue(&b, 5).await;
    let lease = Duration::from_secs(60);
    client
        .set_system(
            &cfg,
            "sys_cluster",
            gaffer::queue_client::SystemState::Paused,
        )
        .await
        .unwrap();
    assert!(a.take(10, lease).await.unwrap().tasks.is_empty());
    assert!(b.take(10, lease).await.unwrap().tasks.is_empty());
    let change = client
        .set_system(
            &cfg,
            "sys_cluster",
            gaffer::queue_client::SystemState::Disabled,
        )
        .await
        .unwrap();
    assert_eq!(change.cancelled, 10);
    client
        .set_system(
            &cfg,
            "sys_cluster",
            gaffer::queue_client::SystemState::Active,
        )
        .await
        .unwrap();
    enqueue(&a, 3).await;
    let taken = a.take(10, lease).await.unwrap();
    assert_eq!(
        taken.tasks.len(),
        3,
        "tokens from the bucket, then the take"
    );
    assert!(client.system_granted("sys_cluster").await.unwrap() >= 3);
}

#[tokio::test]
async fn a_queue_that_left_a_paused_system_is_released_by_the_manager() {
    let mut rig = Rig::start(PARTNER).await;
    let q = rig.queue("calls");
    enqueue(&q, 3).await;
    rig.cli(&["system", "partner", "pause"]);
    let lease = Duration::from_secs(60);
    assert!(q.take(10, lease).await.unwrap().tasks.is_empty());
    // The config moves the queue out of the system: the manager's tick drops its switch.
    rig.rewrite(&PARTNER.replace("system = \"partner\"\n", ""));
    rig.manager();
    let got = crate::harness::poll_some(Duration::from_secs(30), "the queue released", || async {
        let b = q.take(10, lease).await.unwrap();
        (!b.tasks.is_empty()).then_some(b)
    })
    .await;
    assert_eq!(got.tasks.len(), 3);
}

/// A take granted more rate tokens than it found tasks hands the rest back: the bucket
/// counts only the tasks that started, so a queue of a rate-capped system that has little
/// to do never starves the system's other queues of tokens.
#[tokio::test]
async fn a_take_that_finds_fewer_tasks_than_its_tokens_hands_the_rest_back() {
    let rig = Rig::start(
        "[systems.partner]\nrate = \"1000/s\"\n\n\
         [queues.calls]\nhandler = \"noop\"\nsystem = \"partner\"\nbatch_size = 10\n",
    )
    .await;
    let q = rig.queue("calls");
    enqueue(&q, 3).await;
    let taken = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(taken.tasks.len(), 3);
    assert_eq!(rig.client.system_granted("partner").await.unwrap(), 3);
    // An empty take keeps none.
    let empty = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert!(empty.tasks.is_empty());
    assert_eq!(rig.client.system_granted("partner").await.unwrap(), 3);
}

/// A system's bucket saves up to its largest batch, whichever of its queues takes: a
/// queue of single tasks taking first leaves the queue of batches of 100 the tokens saved
/// for it (each take capped the bucket at its own batch, so the small queue's takes threw
/// the rest away, and the system ran under its rate in batches of one).
#[tokio::test]
async fn a_systems_queues_share_one_burst_whatever_their_batches() {
    let rig = Rig::start(
        "[systems.partner]\nrate = \"10/s\"\n\n\
         [queues.one]\nhandler = \"noop\"\nsystem = \"partner\"\nbatch_size = 1\n\n\
         [queues.bulk]\nhandler = \"noop\"\nsystem = \"partner\"\nbatch_size = 100\n",
    )
    .await;
    let (one, bulk) = (rig.queue("one"), rig.queue("bulk"));
    enqueue(&one, 5).await;
    enqueue(&bulk, 200).await;
    // A fresh bucket is full: 100 tokens.
    assert_eq!(took(&one, 1).await, 1);
    let got = took(&bulk, 100).await;
    assert!(got >= 99, "the batch queue got {got} of the 99 tokens left");
    // Both took from one bucket: nothing more is saved until it refills (10 a second).
    let more = took(&bulk, 100).await;
    assert!(more <= 2, "{more} past the burst");
}

/// A switch reaches every queue of its system before any sweep starts: while the first
/// queue's backlog is being cancelled, the second already takes nothing (before, each
/// queue's copy was written only after the sweep of the one before it, which for a large
/// backlog let the later queues go on calling a disabled system for minutes).
#[tokio::test]
async fn a_switch_reaches_every_queue_before_the_sweeps() {
    let rig = Rig::start(
        "[systems.partner]\n\n\
         [queues.a_first]\nhandler = \"noop\"\nsystem = \"partner\"\n\n\
         [queues.b_second]\nhandler = \"noop\"\nsystem = \"partner\"\n",
    )
    .await;
    enqueue(&rig.queue("a_first"), 50).await;
    enqueue(&rig.queue("b_second"), 5).await;
    let mut sync = redis::Client::open(rig.redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut seen_during_first = Vec::new();
    let mut progress = |p: &gaffer::queue_client::SweepProgress| {
        if p.queue == "a_first" {
            let copy: Option<String> = redis::cmd("HGET")
                .arg("test:{b_second}:conf")
                .arg("system")
                .query(&mut sync)
                .unwrap();
            seen_during_first.push(copy);
        }
    };
    let change = rig
        .client
        .set_system_reporting(&rig.cfg, "partner", SystemState::Disabled, &mut progress)
        .await
        .unwrap();
    assert_eq!(change.cancelled, 55);
    assert!(
        !seen_during_first.is_empty(),
        "the first queue's sweep reported"
    );
    assert!(
        seen_during_first
            .iter()
            .all(|c| c.as_deref() == Some("disabled:partner")),
        "{seen_during_first:?}"
    );
}

/// A switch the cluster lost while its queues kept it (the node of its hash failed over on
/// a Redis Cluster, or the hash was lost) is adopted back from the queues by the manager's
/// reconcile, so `gaffer system` and the balancer follow what the queues do within a tick
/// (before, the system showed active, and got slots, while its queues cancelled every
/// task). A switch an operator made after the reading is left as it is.
#[tokio::test]
async fn a_switch_the_cluster_lost_is_adopted_back_from_its_queues() {
    let rig = Rig::start(PARTNER).await;
    let (client, cfg) = (&rig.client, &rig.cfg);
    client
        .set_system(cfg, "partner", SystemState::Disabled)
        .await
        .unwrap();
    cluster_loses_its_switches(&rig).await;
    let lost = client.read_switches().await.unwrap();
    assert!(!lost.states.contains_key("partner"), "{lost:?}");
    client.reconcile_system_switches(cfg, &lost).await.unwrap();
    let healed = client.read_switches().await.unwrap();
    assert_eq!(healed.states["partner"], SystemState::Disabled);
    assert_eq!(healed.gens["partner"], 1);
    // An operator's switch after that reading: the stale reading changes nothing.
    client
        .set_system(cfg, "partner", SystemState::Active)
        .await
        .unwrap();
    client.reconcile_system_switches(cfg, &lost).await.unwrap();
    let now = client.read_switches().await.unwrap();
    assert_eq!(
        (now.states["partner"], now.gens["partner"]),
        (SystemState::Active, 2)
    );
    let q = rig.queue("calls");
    enqueue(&q, 1).await;
    assert_eq!(took(&q, 10).await, 1);
}
