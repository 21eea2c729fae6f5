//! Which Redis node each role talks to, and the failovers it followed (issue 43): every
//! daemon's `/status` (`"redis"`), the master's host report, `gaffer stats` (text and
//! `--json`). On one server; through Sentinel, a real master following a killed primary;
//! on a Redis Cluster with replicas, the manager counting a replica that took its
//! master's slots, and a connection following a frozen master to its replica.

use std::process::{Command, Stdio};
use std::time::Duration;

use gaffer::cluster::{self, Keys};
use gaffer::manager::ManagerOptions;
use gaffer::queue_client::{ConnectOptions, QueueClient};
use gaffer::redis_server::free_port;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::harness::{ANY_LOAD, TestCluster, eventually};
use crate::host::http_get;
use crate::manager::{Cluster, Procs};
use crate::sentinel::SentinelGroup;

/// `GET /status` of the daemon on `port`, or Null while it does not answer.
fn status(port: u16) -> Value {
    http_get(port, "/status")
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or(Value::Null)
}

/// The `"redis"` object of one server at `port`.
fn single(port: u16) -> Value {
    json!({
        "topology": "single",
        "node": format!("127.0.0.1:{port}"),
        "failovers": 0,
        "last_failover": null,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_stats_name_the_redis_node_each_role_talks_to() {
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\n").await;
    let (_, manager_http) = c.manager_http(1);
    let (_, master_http) = c.master("h1");
    let node = single(c.redis.as_ref().unwrap().server.port());
    for (who, http) in [("manager", manager_http), ("master", master_http)] {
        eventually(
            Duration::from_secs(20),
            &format!("the {who}'s /status names its redis node"),
            || async { status(http)["redis"] == node },
        )
        .await;
    }
    // The master's host report carries it: in /status, and in Redis for stats and top.
    eventually(
        Duration::from_secs(20),
        "the host report names the node",
        || async { status(master_http)["host"]["redis"] == node },
    )
    .await;
    let stats: Value = serde_json::from_str(&c.cli(&["stats", "--json"])).unwrap();
    assert_eq!(stats["hosts"]["h1"]["redis"], node, "{stats}");
    assert_eq!(stats["redis"], node, "the node stats read from: {stats}");
    let text = c.cli(&["stats"]);
    let h1 = text
        .lines()
        .find(|l| l.starts_with("h1 "))
        .unwrap_or_else(|| panic!("{text}"));
    let addr = format!("127.0.0.1:{}", c.redis.as_ref().unwrap().server.port());
    assert!(h1.contains(&addr), "{text}");
    assert!(
        text.contains(&format!("this command reached redis {addr}\n")),
        "{text}"
    );
}

/// A real master through Sentinel: its primary killed, the master follows the replica the
/// sentinels promote, and its `/status`, its host report and `stats` say so: the new node,
/// one failover, and when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_behind_sentinel_reports_the_new_primary_after_a_failover() {
    let mut group = SentinelGroup::start().await;
    let dir = tempfile::tempdir().unwrap();
    let http = free_port().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n\
             [master]\nhttp = \"127.0.0.1:{http}\"\ndrain_timeout = \"10s\"\n\
             memory_reserve = \"64MiB\"\n\n[queues.ha]\nhandler = \"noop\"\n",
            group.url()
        ),
    )
    .unwrap();
    let _master = Procs(vec![
        Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--config")
            .arg(&config)
            .args(["master", "--host", "h1"])
            .env("GAFFER_LOG", "info")
            .env(ANY_LOAD.0, ANY_LOAD.1)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("master.log")).unwrap())
            .spawn()
            .unwrap(),
    ]);
    let log = || std::fs::read_to_string(dir.path().join("master.log")).unwrap_or_default();
    let (first, second) = (group.data[0].port(), group.data[1].port());
    let before = json!({
        "topology": "sentinel",
        "node": format!("127.0.0.1:{first}"),
        "failovers": 0,
        "last_failover": null,
    });
    eventually(
        Duration::from_secs(20),
        "the master reports through the first primary",
        || async { status(http)["host"]["redis"] == before && status(http)["redis"] == before },
    )
    .await;

    group.data[0].kill();
    let followed = |r: &Value| {
        r["topology"] == "sentinel"
            && r["node"] == format!("127.0.0.1:{second}")
            && r["failovers"] == 1
            && r["last_failover"].is_string()
    };
    let limit = Duration::from_secs(60);
    eventually(limit, "/status names the promoted replica", || async {
        followed(&status(http)["redis"])
    })
    .await;
    // The host report written through the new primary says the same, and stats shows it.
    let client = QueueClient::connect(&group.url(), "test", &ConnectOptions::default())
        .await
        .unwrap();
    eventually(
        limit,
        "the host report names the promoted replica",
        || async {
            let hosts = cluster::read_hosts(&mut client.connection(), &Keys::new("test")).await;
            hosts.is_ok_and(|h| {
                h.get("h1")
                    .and_then(|r| r.redis.as_ref())
                    .is_some_and(|r| followed(&json!(r)))
            })
        },
    )
    .await;
    let stats: Value =
        serde_json::from_str(&crate::harness::gaffer_ok(&config, &["stats", "--json"])).unwrap();
    assert!(followed(&stats["hosts"]["h1"]["redis"]), "{stats}");
    let text = crate::harness::gaffer_ok(&config, &["stats"]);
    assert!(
        text.lines()
            .any(|l| l.starts_with("h1 ") && l.contains(" (sentinel)") && l.contains("1, last ")),
        "{text}\n{}",
        log()
    );
}

/// `CLUSTER NODES` of the node at `port`.
fn cluster_nodes(port: u16) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "cluster", "nodes"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `redis-cli -p PORT ARGS…`'s output.
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A Redis Cluster of three masters and three replicas: a manager's `/status` counts a
/// replica promoted by `CLUSTER FAILOVER` as one failover of its Redis node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managers_status_counts_a_redis_cluster_failover() {
    let nodes = TestCluster::start_with_replicas().nodes;
    let ports: Vec<u16> = nodes.iter().map(|n| n.server.port()).collect();
    // Every node knows the three replicas and the cluster is up, so the manager's first
    // look (any node answers) sees who follows whom.
    whole_cluster(&ports).await;
    let replica: u16 = cluster_nodes(ports[0])
        .lines()
        .find(|l| l.contains("slave"))
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)?
                .split(['@', ':'])
                .nth(1)?
                .parse()
                .ok()
        })
        .expect("a replica");
    eventually(
        Duration::from_secs(30),
        "the replica is in sync",
        || async { cli(replica, &["info", "replication"]).contains("master_link_status:up") },
    )
    .await;

    let cfg = gaffer::config::parse(
        "[cluster]\nnamespace = \"test\"\n\n[manager]\ntick = \"200ms\"\n\n[queues.a]\nhandler = \"noop\"\n",
        "cluster.toml",
    )
    .unwrap();
    let http = free_port().unwrap();
    let url = format!("redis://127.0.0.1:{}", ports[0]);
    let mut opts = ManagerOptions::new(cfg, url, "node-test".into());
    opts.http = Some(format!("127.0.0.1:{http}").parse().unwrap());
    let stop = CancellationToken::new();
    let watch = async {
        eventually(Duration::from_secs(20), "a tick done", || async {
            let s = status(http);
            s["tick_ms"].is_u64() && s["redis"]["topology"] == "cluster"
        })
        .await;
        assert_eq!(status(http)["redis"]["failovers"], 0);
        let answer = cli(replica, &["cluster", "failover"]);
        assert!(answer.contains("OK"), "{answer}");
        eventually(
            Duration::from_secs(30),
            "the manager counts the failover",
            || async {
                let r = &status(http)["redis"];
                r["failovers"] == 1 && r["last_failover"].is_string()
            },
        )
        .await;
        assert!(cli(replica, &["role"]).starts_with("master"));
        stop.cancel();
    };
    // (joined, not spawned: the manager's future is not Send for every lifetime)
    let (ran, ()) = tokio::join!(gaffer::manager::run(opts, stop.clone()), watch);
    ran.unwrap();
}

/// Waits until every node of a cluster with replicas says the cluster is up and lists the
/// three replicas.
async fn whole_cluster(ports: &[u16]) {
    for &p in ports {
        eventually(
            Duration::from_secs(30),
            "every node knows the whole cluster",
            || async move {
                cli(p, &["cluster", "info"]).contains("cluster_state:ok")
                    && cluster_nodes(p).matches("slave").count() == 3
            },
        )
        .await;
    }
}

/// The port of the master serving `key`, and of its replica, as the node at `port` sees
/// them.
fn master_and_replica_of(port: u16, key: &str) -> (u16, u16) {
    let slot: u16 = cli(port, &["cluster", "keyslot", key])
        .trim()
        .parse()
        .unwrap();
    let nodes = cluster_nodes(port);
    let port_of = |l: &str| -> u16 {
        let addr = l.split_whitespace().nth(1).unwrap();
        addr.split(['@', ':']).nth(1).unwrap().parse().unwrap()
    };
    let master = nodes
        .lines()
        .find(|l| {
            l.contains("master")
                && l.split_whitespace().skip(8).any(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    (a.parse::<u16>().unwrap_or(1)..=b.parse().unwrap_or(0)).contains(&slot)
                })
        })
        .expect("a master serving the key's slot");
    let id = master.split_whitespace().next().unwrap();
    let replica = nodes
        .lines()
        .find(|l| l.split_whitespace().nth(3) == Some(id))
        .expect("the master's replica");
    (port_of(master), port_of(replica))
}

/// A master of a Redis Cluster that freezes (SIGSTOP) rather than dies: once its replica
/// holds its slots, a connection's calls for them reach the replica while the old master
/// is still frozen, and a call that was waiting on the frozen master fails rather than
/// waiting for it to wake. (The redis crate's own client retries a timed-out call on the
/// same node and asks for the slots again only on `MOVED`: without the connection's
/// watcher, every call for those slots waits out the freeze.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connection_follows_a_frozen_master_to_its_replica() {
    use nix::sys::signal::Signal;
    let nodes = TestCluster::start_with_replicas().nodes;
    let ports: Vec<u16> = nodes.iter().map(|n| n.server.port()).collect();
    whole_cluster(&ports).await;
    // A key on a master other than the seed, so the seed keeps answering the looks.
    let key = (0..)
        .map(|i| format!("frozen-{i}"))
        .find(|k| master_and_replica_of(ports[0], k).0 != ports[0])
        .unwrap();
    let (master, replica) = master_and_replica_of(ports[0], &key);
    eventually(
        Duration::from_secs(30),
        "the replica is in sync",
        || async { cli(replica, &["info", "replication"]).contains("master_link_status:up") },
    )
    .await;
    let url = format!("redis://127.0.0.1:{}", ports[0]);
    let client = QueueClient::connect(&url, "test", &ConnectOptions::default())
        .await
        .unwrap();
    let mut conn = client.connection();
    let () = redis::cmd("SET")
        .arg(&key)
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();
    // (the replica has the write before its master freezes)
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut conn)
        .await
        .unwrap();

    let frozen = nodes.iter().find(|n| n.server.port() == master).unwrap();
    frozen.server.signal(Signal::SIGSTOP).unwrap();
    let mut waiting = client.connection();
    let in_flight = {
        let key = key.clone();
        tokio::spawn(async move {
            redis::cmd("GET")
                .arg(&key)
                .query_async::<Option<String>>(&mut waiting)
                .await
        })
    };
    eventually(
        Duration::from_secs(30),
        "the replica takes its frozen master's slots",
        || async { cli(replica, &["role"]).starts_with("master") },
    )
    .await;
    let got = crate::harness::poll_some(
        Duration::from_secs(8),
        "a read of the key from the promoted replica, the old master still frozen",
        || {
            let mut conn = client.connection();
            let key = key.clone();
            async move {
                let mut get = redis::cmd("GET");
                get.arg(&key);
                let get = get.query_async::<Option<String>>(&mut conn);
                tokio::time::timeout(Duration::from_secs(1), get)
                    .await
                    .ok()?
                    .ok()?
            }
        },
    )
    .await;
    assert_eq!(got, "v");
    let ended = tokio::time::timeout(Duration::from_secs(3), in_flight).await;
    assert!(
        ended.is_ok(),
        "the call that waited on the frozen master is still waiting"
    );
    assert_eq!(client.redis_node().failovers, 1);
    frozen.server.signal(Signal::SIGCONT).unwrap();
}
