//! Redis behind Sentinel (`redis+sentinel://`): a real primary, a replica and three
//! sentinels (`redis-server CONF --sentinel`). The client asks the sentinels for the
//! primary, follows a failover (the primary killed) and a switch the primary lives through
//! (`SENTINEL FAILOVER`: it answers READONLY once demoted), and every error it returns in
//! between is one callers retry.

use std::time::{Duration, Instant};

use gaffer::queue_client::{ConnectOptions, NewTask, QueueClient, RedisNode, Topology};
use gaffer::redis_server::{RedisServer, RedisServerOptions, SentinelOf};

use crate::harness::eventually;

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
        let mut primary = raw(self.data[0].port()).await;
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(5000)
            .query_async(&mut primary)
            .await
            .unwrap();
        assert_eq!(acked, 1, "the replica acknowledges the primary's writes");
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
    let mut primary = raw(first).await;
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut primary)
        .await
        .unwrap();
    assert_eq!(acked, 1);

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
    let mut primary = raw(group.data[0].port()).await;
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut primary)
        .await
        .unwrap();

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
