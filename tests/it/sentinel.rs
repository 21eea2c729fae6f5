//! Redis behind Sentinel (`redis+sentinel://`): a real primary, a replica and three
//! sentinels (`redis-server CONF --sentinel`). The client asks the sentinels for the
//! primary, follows a failover (the primary killed) and a switch the primary lives through
//! (`SENTINEL FAILOVER`: it answers READONLY once demoted), and every error it returns in
//! between is one callers retry.

use std::time::{Duration, Instant};

use gaffer::queue_client::{ConnectOptions, NewTask, QueueClient, RedisNode, Topology};
use gaffer::redis_server::{RedisServer, RedisServerOptions, SentinelOf};

use gaffer::cluster::{self, Keys};
use nix::sys::signal::Signal;

use crate::harness::{eventually, poll_some};
use crate::manager::Cluster;

/// The name the sentinels monitor the primary under.
pub const PRIMARY_NAME: &str = "gaffer";

/// A primary, one replica and three sentinels, each in its own directory.
pub struct SentinelGroup {
    /// The data nodes: `[0]` starts as the primary, `[1]` as its replica.
    pub data: Vec<RedisServer>,
    /// The sentinels.
    pub sentinels: Vec<RedisServer>,
    _dir: tempfile::TempDir,
}

impl SentinelGroup {
    /// Starts the group and waits until every sentinel knows the replica and the other
    /// sentinels, so a failover can be agreed on.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let primary = RedisServer::start(&dir.path().join("data-0"), RedisServerOptions::default())
            .expect("start the primary");
        let replica = RedisServer::start(
            &dir.path().join("data-1"),
            RedisServerOptions {
                extra: vec![("replicaof".into(), format!("127.0.0.1 {}", primary.port()))],
                ..Default::default()
            },
        )
        .expect("start the replica");
        let sentinels = (0..3)
            .map(|i| {
                RedisServer::start(
                    &dir.path().join(format!("sentinel-{i}")),
                    RedisServerOptions {
                        sentinel: Some(SentinelOf {
                            name: PRIMARY_NAME.into(),
                            primary_port: primary.port(),
                            quorum: 2,
                            down_after: Duration::from_millis(1000),
                            failover_timeout: Duration::from_millis(5000),
                        }),
                        ..Default::default()
                    },
                )
                .expect("start a sentinel")
            })
            .collect();
        let group = SentinelGroup {
            data: vec![primary, replica],
            sentinels,
            _dir: dir,
        };
        group.wait_ready().await;
        group
    }

    async fn wait_ready(&self) {
        for s in &self.sentinels {
            let port = s.port();
            eventually(
                Duration::from_secs(30),
                "the sentinels know each other and the replica",
                || async move {
                    let facts = sentinel_master(port).await;
                    facts.get("num-other-sentinels").map(String::as_str) == Some("2")
                        && facts.get("num-slaves").map(String::as_str) == Some("1")
                },
            )
            .await;
        }
        // The replica must have caught up, or a failover finds no replica fit to promote.
        assert_eq!(
            replicated(self.data[0].port()).await,
            1,
            "the replica acknowledges the primary's writes"
        );
    }

    /// `redis+sentinel://` for the group.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+sentinel://{}/{PRIMARY_NAME}/0", hosts.join(","))
    }

    /// The port of the data node the sentinels name as primary now.
    pub async fn primary_port(&self) -> u16 {
        let mut conn = raw(self.sentinels[0].port()).await;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(PRIMARY_NAME)
            .query_async(&mut conn)
            .await
            .unwrap();
        port
    }
}

/// `WAIT 1 5000` on the primary at `port`: how many replicas have its writes.
async fn replicated(port: u16) -> i64 {
    redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut raw(port).await)
        .await
        .unwrap()
}

async fn raw(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/0"))
        .unwrap()
        .get_multiplexed_async_connection_with_config(
            // WAIT may block for its whole timeout.
            &redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap()
}

/// `SENTINEL MASTER gaffer` as field → value.
async fn sentinel_master(port: u16) -> std::collections::HashMap<String, String> {
    let mut conn = raw(port).await;
    redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(PRIMARY_NAME)
        .query_async(&mut conn)
        .await
        .unwrap_or_default()
}

/// Enqueues `id` until it is accepted, failing the test on any error a caller would not
/// retry; returns how long it took.
async fn enqueue_through(client: &QueueClient, id: &str, limit: Duration) -> Duration {
    let q = client.queue("ha").unwrap();
    let start = Instant::now();
    loop {
        match q.enqueue(NewTask::new("x").id(id)).await {
            Ok(_) => return start.elapsed(),
            Err(e) => {
                assert!(e.is_transient(), "an error callers would not retry: {e}");
                assert!(start.elapsed() < limit, "no primary within {limit:?}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The ids waiting in the queue `ha`.
async fn waiting_ids(client: &QueueClient) -> Vec<String> {
    let q = client.queue("ha").unwrap();
    let batch = q.take(100, Duration::from_secs(30)).await.unwrap();
    let mut ids: Vec<String> = batch.tasks.iter().map(|t| t.id.to_string()).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_url_follows_the_primary_when_it_dies() {
    let mut group = SentinelGroup::start().await;
    let client = QueueClient::connect(&group.url(), "test", &ConnectOptions::default())
        .await
        .expect("connect through the sentinels");
    let first = group.data[0].port();
    assert_eq!(
        client.redis_node(),
        RedisNode {
            topology: Topology::Sentinel,
            node: format!("127.0.0.1:{first}"),
            failovers: 0,
            last_failover: None,
        }
    );
    enqueue_through(&client, "before", Duration::from_secs(5)).await;
    // The write is on the replica before the primary dies, so the failover keeps it.
    assert_eq!(replicated(first).await, 1);

    group.data[0].kill();
    enqueue_through(&client, "after", Duration::from_secs(30)).await;

    let facts = client.redis_node();
    let second = group.data[1].port();
    assert_eq!(facts.node, format!("127.0.0.1:{second}"));
    assert_eq!(facts.failovers, 1);
    assert!(facts.last_failover.is_some());
    assert_eq!(group.primary_port().await, second);
    assert_eq!(waiting_ids(&client).await, ["after", "before"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_is_left_for_the_new_one() {
    let group = SentinelGroup::start().await;
    let client = QueueClient::connect(&group.url(), "test", &ConnectOptions::default())
        .await
        .expect("connect through the sentinels");
    enqueue_through(&client, "before", Duration::from_secs(5)).await;
    assert_eq!(replicated(group.data[0].port()).await, 1);

    // A switch the old primary lives through: it becomes a replica and answers READONLY
    // to writes on the connection the client still holds.
    let mut sentinel = raw(group.sentinels[0].port()).await;
    let _: () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(PRIMARY_NAME)
        .query_async(&mut sentinel)
        .await
        .unwrap();
    let second = group.data[1].port();
    let old = group.data[0].port();
    eventually(
        Duration::from_secs(30),
        "the old primary is a replica",
        || async move {
            // (a fresh connection each time: the switch drops the clients of the old primary)
            let role: redis::RedisResult<redis::Value> =
                redis::cmd("ROLE").query_async(&mut raw(old).await).await;
            role.is_ok_and(|r| format!("{r:?}").contains("slave"))
        },
    )
    .await;
    enqueue_through(&client, "after", Duration::from_secs(30)).await;
    let facts = client.redis_node();
    assert_eq!(facts.node, format!("127.0.0.1:{second}"));
    assert_eq!(waiting_ids(&client).await, ["after", "before"]);
}

#[tokio::test]
async fn a_sentinel_group_that_is_not_there_is_an_outage() {
    let port = gaffer::redis_server::free_port().unwrap();
    let url = format!("redis+sentinel://127.0.0.1:{port}/{PRIMARY_NAME}/0");
    let e = QueueClient::connect(&url, "test", &ConnectOptions::default())
        .await
        .err()
        .expect("no sentinel answers");
    assert!(e.is_transient(), "{e}");
    let bad = QueueClient::connect(
        "redis+sentinel://127.0.0.1:1",
        "test",
        &ConnectOptions::default(),
    )
    .await
    .err()
    .expect("no primary name");
    assert!(
        !bad.is_transient() && bad.to_string().contains("expected redis+sentinel://"),
        "{bad}"
    );
}

/// The (epoch, version) of every map the master's log says it adopted, in order.
pub fn adopted_maps(log: &str) -> Vec<(u64, u64)> {
    let field = |line: &str, key: &str| -> u64 {
        let at = line.find(&format!("{key}=")).expect(key) + key.len() + 1;
        let digits: String = line[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().expect(key)
    };
    log.lines()
        .filter(|l| l.contains("new slot map"))
        .map(|l| (field(l, "epoch"), field(l, "version")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_promoted_leaves_one_leader_and_no_older_map_adopted() {
    let mut group = SentinelGroup::start().await;
    let url = group.url();
    let client = QueueClient::connect(&url, "test", &ConnectOptions::default())
        .await
        .expect("connect through the sentinels");
    let mut c = Cluster::start_on(
        url,
        client,
        "",
        "[queues.a]\nhandler = \"noop\"\nmin_slots = 2\n",
    );
    c.manager(1);
    c.manager(2);
    c.master("h1");
    let keys = Keys::new("test");
    let report = |slots: u32| {
        let mut conn = c.client.connection();
        let keys = keys.clone();
        async move {
            let hosts = cluster::read_hosts(&mut conn, &keys).await.ok()?;
            let r = hosts.get("h1")?;
            (r.queues.get("a").map_or(0, |q| q.slots) == slots)
                .then_some((r.map_epoch, r.map_version))
        }
    };
    let (epoch, version) = poll_some(Duration::from_secs(30), "two slots of a on h1", || {
        report(2)
    })
    .await;

    // The replica stops receiving; the primary goes on: a pause, and the map without a's
    // slots that follows it, which the master runs.
    // (stopped first: with the link cut, it cannot reconnect and catch up, and what was
    // sent before is in its socket already)
    group.data[1].signal(Signal::SIGSTOP).unwrap();
    let mut primary = raw(group.data[0].port()).await;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut primary)
        .await
        .unwrap();
    c.cli(&["pause", "a"]);
    let (_, newer) = poll_some(
        Duration::from_secs(30),
        "the master on the paused map",
        || report(0),
    )
    .await;
    assert!(newer > version);
    // The primary dies; the replica, which never received them, is promoted.
    group.data[0].kill();
    group.data[1].signal(Signal::SIGCONT).unwrap();
    let promoted = group.data[1].port();
    eventually(
        Duration::from_secs(30),
        "the sentinels promote the replica",
        || async { group.primary_port().await == promoted },
    )
    .await;

    // The promoted replica has neither the pause nor the map: the leader sees the master
    // run a newer map than Redis holds, raises its epoch and writes one past it, and the
    // master follows that one, never the older map Redis went back to.
    let (after, _) = poll_some(
        Duration::from_secs(30),
        "a map past the lost one",
        || async { report(2).await.filter(|(e, _)| *e > epoch) },
    )
    .await;
    let log = c.log("master-h1.log");
    let maps = adopted_maps(&log);
    assert!(
        maps.windows(2).all(|w| w[0] < w[1]),
        "the master adopted an older map: {maps:?}\n{log}"
    );
    assert!(maps.contains(&(epoch, newer)), "{maps:?}");
    assert!(maps.last().is_some_and(|m| m.0 == after), "{maps:?}");
    // One leader: the lease names one manager, and only it wrote a map under its epoch.
    let lease: String = redis::cmd("GET")
        .arg(keys.lease())
        .query_async(&mut c.client.connection())
        .await
        .unwrap();
    assert!(
        lease.ends_with(&format!(":{after}")),
        "{lease} vs epoch {after}"
    );
    let writers: Vec<String> = ["manager1.log", "manager2.log"]
        .iter()
        .filter(|m| {
            c.log(m).lines().any(|l| {
                l.contains("published a new slot map") && l.contains(&format!("epoch={after}"))
            })
        })
        .map(|m| m.to_string())
        .collect();
    assert_eq!(writers.len(), 1, "{writers:?}");
}
