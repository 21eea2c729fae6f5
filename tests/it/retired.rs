//! Queues removed from the config (retired): the manager's registry of every queue name a
//! config has named, and `stats`, `tasks`, `queues list` and `queues retire` on a queue
//! whose table is gone, against a real redis-server and the `gaffer` binary.

use std::collections::BTreeSet;
use std::time::Duration;

use gaffer::cluster::{self, Keys};
use gaffer::manager::ManagerOptions;
use gaffer::queue_client::{NewTask, QueueClient, QueueLimits, SettleOp};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::cli::{stderr, stdout};
use crate::harness::eventually;

const LEASE: Duration = Duration::from_secs(60);

/// The config the manager runs first: `kept`, `old` (removed later, with tasks) and
/// `drained` (removed later, empty).
const BEFORE: &str = r#"
[cluster]
namespace = "test"

[manager]
tick = "200ms"

[queues.kept]
handler = "noop"

[queues.old]
handler = "noop"

[queues.drained]
handler = "noop"
track = false
"#;

/// The config after the operator removed `old` and `drained`.
const AFTER: &str = r#"
[cluster]
namespace = "test"

[queues.kept]
handler = "noop"
"#;

/// A Redis, and the config files the commands run with.
/// The CLI's test rig with the config lacking the removed tables.
struct Env(crate::cli::Env);

impl std::ops::Deref for Env {
    type Target = crate::cli::Env;
    fn deref(&self) -> &crate::cli::Env {
        &self.0
    }
}

impl Env {
    fn new() -> Self {
        Env(crate::cli::Env::with_config(AFTER))
    }

    /// [`Env::gaffer`], which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.gaffer(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        stdout(&o)
    }

    /// [`Env::gaffer`], which must exit 2 saying `text` on stderr.
    fn usage(&self, args: &[&str], text: &str) {
        let o = self.gaffer(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(text), "{args:?}: {}", stderr(&o));
    }

    fn stats_json(&self) -> Value {
        serde_json::from_str(&self.ok(&["stats", "--json"])).unwrap()
    }

    /// The keys of queue `name` left in Redis.
    async fn keys_of(&self, name: &str) -> BTreeSet<String> {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("*{{{name}}}*"))
            .query_async(&mut self.redis.raw().await)
            .await
            .unwrap();
        keys.into_iter().collect()
    }

    async fn registry(&self) -> BTreeSet<String> {
        let client = self.redis.client().await;
        cluster::registered_queues(&mut client.connection(), &Keys::new("test"))
            .await
            .unwrap()
    }
}

/// Runs a manager in-process on `BEFORE` until it has registered every queue name, and
/// one more it adopts from a published config; stops it.
async fn run_manager(env: &Env) {
    let cfg = gaffer::config::parse(BEFORE, "before.toml").unwrap();
    let mut opts = ManagerOptions::new(cfg, env.redis.url(), "retired-test".into());
    opts.connect = env.redis.options();
    let stop = CancellationToken::new();
    let client = env.redis.client().await;
    let want = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    let watch = async {
        let all = want(&["kept", "old", "drained"]);
        eventually(
            Duration::from_secs(20),
            "the manager registers its queues",
            || {
                let all = all.clone();
                async move { env.registry().await == all }
            },
        )
        .await;
        // A config it adopts later adds its names too.
        let later = format!("{BEFORE}\n[queues.later]\nhandler = \"noop\"\n");
        cluster::publish_config(&mut client.connection(), &Keys::new("test"), &later)
            .await
            .unwrap();
        eventually(
            Duration::from_secs(20),
            "the manager registers an adopted config's queue",
            || async { env.registry().await.contains("later") },
        )
        .await;
        stop.cancel();
    };
    // (joined, not spawned: the manager's future is not Send for every lifetime)
    let (ran, ()) = tokio::join!(gaffer::manager::run(opts, stop.clone()), watch);
    ran.unwrap();
    // (the published config would name `old`: `queues retire` reads it; the operator
    // applies the config without the tables)
    cluster::publish_config(&mut client.connection(), &Keys::new("test"), AFTER)
        .await
        .unwrap();
}

/// `old` gets a dead letter and three waiting tasks; `drained` one task, done, and no
/// record of it.
async fn fill(client: &QueueClient) {
    let old = client.queue("old").unwrap();
    old.enqueue(NewTask::new("{}").id("d1")).await.unwrap();
    let b = old.take(1, LEASE).await.unwrap();
    assert_eq!(b.tasks.len(), 1);
    crate::harness::fail_all(&old, &b.tasks, |_| "gave up".into()).await;
    for id in ["w1", "w2", "w3"] {
        let t = NewTask::new(format!("{{\"id\":\"{id}\"}}")).id(id);
        old.enqueue(t).await.unwrap();
    }
    let drained = client
        .queue_with(
            "drained",
            QueueLimits {
                track: false,
                ..QueueLimits::default()
            },
        )
        .unwrap();
    drained.enqueue(NewTask::new("{}")).await.unwrap();
    let b = drained.take(1, LEASE).await.unwrap();
    let acks: Vec<SettleOp> = b
        .tasks
        .iter()
        .map(|t| SettleOp::new(t, gaffer::queue_client::Settle::Ack))
        .collect();
    drained.settle(&acks).await.unwrap();
}

/// The row of `name` in a table printed by `stats` or `queues list`, split on spaces.
fn row<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{text}"))
        .split_whitespace()
        .collect()
}

/// A queue removed from the config keeps its tasks: `stats` lists it as retired with its
/// counts, the read commands and purge work on it, requeue and thaw are refused with the
/// reason, and `queues retire` deletes every key of it, only when told to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_queue_is_retired_readable_and_deletable() {
    let env = Env::new();
    run_manager(&env).await;
    fill(&env.redis.client().await).await;

    let text = env.ok(&["stats"]);
    assert!(text.contains("retired (not in the config)"), "{text}");
    assert!(text.contains("gaffer queues retire NAME"), "{text}");
    assert_eq!(row(&text, "old"), ["old", "3", "0", "0", "1", "0", "yes"]);
    assert!(!text.lines().any(|l| l.starts_with("drained")), "{text}");
    let s = env.stats_json();
    let old = &s["retired"]["old"];
    assert_eq!(
        (old["ready"].as_u64(), old["dead"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(old["enqueued_total"], 4, "{s}");
    assert_eq!(old["records"], true, "{s}");
    assert!(s["queues"].get("old").is_none(), "{s}");
    let retired: Vec<&String> = s["retired"].as_object().unwrap().keys().collect();
    assert_eq!(
        retired,
        ["old"],
        "an empty one and configured ones are not listed: {s}"
    );

    let list = env.ok(&["queues", "list"]);
    assert_eq!(row(&list, "kept")[1], "configured", "{list}");
    assert_eq!(
        row(&list, "drained")[..3],
        ["drained", "retired", "0"],
        "{list}"
    );
    let json: Value = serde_json::from_str(&env.ok(&["queues", "list", "--json"])).unwrap();
    assert_eq!(json["queues"]["old"]["state"], "retired", "{json}");
    assert_eq!(json["queues"]["drained"]["holds_data"], false, "{json}");
    assert_eq!(json["queues"]["kept"]["state"], "configured", "{json}");

    reads_and_purge(&env);
    retire(&env).await;
}

/// `tasks dead | list | show | cancel | purge` on the retired `old`; requeue and thaw
/// refused.
fn reads_and_purge(env: &Env) {
    let dead = env.ok(&["tasks", "dead", "old"]);
    assert!(dead.contains("d1") && dead.contains("gave up"), "{dead}");
    let list = env.ok(&["tasks", "list", "old", "--json"]);
    let ids: BTreeSet<String> = serde_json::from_str::<Value>(&list).unwrap()["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        ids,
        ["d1", "w1", "w2", "w3"].map(String::from).into(),
        "{list}"
    );
    let show = env.ok(&["tasks", "show", "old", "w1"]);
    assert!(row(&show, "state").contains(&"waiting"), "{show}");

    let why = "no slot takes from a queue the config does not name";
    env.usage(&["tasks", "requeue", "old"], why);
    env.usage(&["tasks", "thaw", "old", "w1"], why);
    assert_eq!(
        env.stats_json()["retired"]["old"]["dead"],
        1,
        "requeue moved nothing"
    );
    env.usage(
        &["tasks", "dead", "nosuch"],
        "queue \"nosuch\" is not in the config (known: kept; retired: drained, later, old)",
    );

    let cancel = env.ok(&["tasks", "cancel", "old", "w3"]);
    assert!(cancel.contains("cancelled old task w3"), "{cancel}");
    env.usage(&["tasks", "purge", "old"], "needs --yes");
    let purge = env.ok(&["tasks", "purge", "old", "--yes"]);
    assert!(purge.contains("purged 1 dead letters of old"), "{purge}");
    let old = &env.stats_json()["retired"]["old"];
    assert_eq!(
        (old["ready"].as_u64(), old["dead"].as_u64()),
        (Some(2), Some(0))
    );
}

/// `queues retire` refuses a configured queue, an unknown name, and (without a terminal)
/// a retired one without --yes, deleting nothing; with --yes it deletes every key.
async fn retire(env: &Env) {
    env.usage(
        &["queues", "retire", "kept"],
        "queue kept is in the config; remove its table first",
    );
    env.usage(
        &["queues", "retire", "nosuch"],
        "is not in the config nor retired",
    );
    let before = env.keys_of("old").await;
    assert!(!before.is_empty());
    env.usage(
        &["queues", "retire", "old"],
        "needs --yes where no terminal can ask",
    );
    assert_eq!(
        env.keys_of("old").await,
        before,
        "a refused retire deletes nothing"
    );
    assert!(env.registry().await.contains("old"));

    let out = env.ok(&["queues", "retire", "old", "--yes"]);
    assert!(
        out.contains("retired old: deleted its tasks (2 ready), records and counters"),
        "{out}"
    );
    let left = env.keys_of("old").await;
    assert!(left.is_empty(), "keys of old left: {left:?}");
    assert!(!env.registry().await.contains("old"));
    let s = env.stats_json();
    assert!(s["retired"].get("old").is_none(), "{s}");
    env.usage(&["tasks", "dead", "old"], "is not in the config");
    // An empty one goes too, and the one still configured keeps its keys.
    env.ok(&["queues", "retire", "drained", "--yes"]);
    assert!(env.keys_of("drained").await.is_empty());
    assert_eq!(
        env.registry().await,
        ["kept", "later"].map(String::from).into()
    );
}

/// `queues retire` refuses a queue the published config (what the manager and masters
/// run) still names, though the local file lacks it, and deletes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_refuses_a_queue_the_published_config_names() {
    let env = Env::new();
    let client = env.redis.client().await;
    let keys = Keys::new("test");
    cluster::register_queues(&mut client.connection(), &keys, ["old"])
        .await
        .unwrap();
    client
        .queue("old")
        .unwrap()
        .enqueue(NewTask::new("{}").id("t"))
        .await
        .unwrap();
    cluster::publish_config(&mut client.connection(), &keys, BEFORE)
        .await
        .unwrap();
    env.usage(
        &["queues", "retire", "old", "--yes"],
        "the published config (version 1) names it",
    );
    assert!(!env.keys_of("old").await.is_empty());
}
