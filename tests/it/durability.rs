//! `[cluster] wait_replicas`: writes confirmed on real replicas (`redis-server` started as
//! a replica of the test's primary, or a Redis Cluster of three primaries with a replica
//! each). A confirmed write is on its replica when the call returns, with no polling;
//! with the replica stopped it fails naming the limit, within about `wait_timeout`.

use std::time::{Duration, Instant};

use gaffer::queue_client::{
    ConnectOptions, Durability, Glance, NewTask, QueueClient, QueueError, RecordState,
};
use gaffer::redis_server::RedisServerOptions;
use nix::sys::signal::Signal;
use redis::aio::MultiplexedConnection;

use crate::harness::{TestCluster, TestRedis, eventually};

/// Confirmed by `replicas`, waiting at most `timeout`.
fn confirmed(replicas: u32, timeout: Duration) -> ConnectOptions {
    ConnectOptions {
        durability: Durability {
            wait_replicas: replicas,
            wait_timeout: timeout,
        },
        ..ConnectOptions::default()
    }
}

/// A primary and one replica of it, the link up and the primary counting it online.
async fn primary_and_replica() -> (TestRedis, TestRedis) {
    let primary = TestRedis::with(RedisServerOptions::default());
    let replica = TestRedis::with(RedisServerOptions::default());
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.server.port())
        .query_async(&mut replica.raw().await)
        .await
        .unwrap();
    let mut on_primary = primary.raw().await;
    eventually(Duration::from_secs(20), "the replica online", || {
        let mut conn = on_primary.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .unwrap();
            info.contains("connected_slaves:1") && info.contains("state=online")
        }
    })
    .await;
    let _: () = redis::cmd("PING")
        .query_async(&mut on_primary)
        .await
        .unwrap();
    (primary, replica)
}

/// `WAIT`s the server has run.
async fn waits_run(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Whether the server behind `conn` holds `key` (a raw read: on a replica, no script).
async fn holds(conn: &mut MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}

/// What the replica's queue holds of `id`, read with `FCALL_RO` (which a replica serves).
async fn state_on(client: &QueueClient, queue: &str, id: &str) -> Glance {
    let q = client.queue(queue).unwrap();
    q.glance_many(&[id]).await.unwrap().remove(0)
}

fn recorded(state: RecordState) -> impl Fn(&Glance) -> bool {
    move |g| matches!(g, Glance::Recorded { state: s, .. } if *s == state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_writes_are_on_the_replica_when_they_return() {
    let (primary, replica) = primary_and_replica().await;
    // (a generous timeout: these writes must be confirmed, however busy the machine)
    let client = QueueClient::connect(
        &primary.url(),
        "test",
        &confirmed(1, Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let q = client.queue("dur").unwrap();
    let on_replica = QueueClient::connect(&replica.url(), "test", &ConnectOptions::default())
        .await
        .unwrap();
    let mut raw_replica = replica.raw().await;
    let mut raw_primary = primary.raw().await;
    // (the library loaded first: a call that finds it missing sends its pipeline twice)
    let plain = QueueClient::connect(&primary.url(), "test", &ConnectOptions::default())
        .await
        .unwrap();
    plain.queue("dur").unwrap().stats().await.unwrap();
    let waits_before = waits_run(&mut raw_primary).await;

    // An enqueue: its record and its place in the queue are on the replica at once.
    q.enqueue(NewTask::new(b"{}".to_vec()).id("a"))
        .await
        .unwrap();
    assert!(holds(&mut raw_replica, "test:{dur}:r:a").await);
    let stats = on_replica.queue("dur").unwrap().stats().await.unwrap();
    assert_eq!((stats.ready, stats.enqueued_total), (1, 1), "{stats:?}");
    assert!(recorded(RecordState::Waiting)(
        &state_on(&on_replica, "dur", "a").await
    ));

    // A take (not confirmed by itself) and its ack (confirmed, and the take with it).
    let batch = q.take(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(batch.tasks.len(), 1);
    q.ack(&batch.tasks).await.unwrap();
    let stats = on_replica.queue("dur").unwrap().stats().await.unwrap();
    assert_eq!(
        (stats.ready, stats.leased, stats.acked_total),
        (0, 0, 1),
        "{stats:?}"
    );
    assert!(recorded(RecordState::Done)(
        &state_on(&on_replica, "dur", "a").await
    ));

    // A record's change: a task frozen by an operator.
    q.enqueue(NewTask::new(b"{}".to_vec()).id("b"))
        .await
        .unwrap();
    q.freeze("b", "held for the test").await.unwrap();
    assert!(recorded(RecordState::Frozen)(
        &state_on(&on_replica, "dur", "b").await
    ));

    // Each confirmed write was followed by a WAIT: the enqueues, the ack and the freeze
    // (the take, unconfirmed, by none).
    let waits = waits_run(&mut raw_primary).await - waits_before;
    assert_eq!(waits, 4, "WAITs run by the calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_for_a_stopped_replica_and_returns_once_it_has_it() {
    let (primary, replica) = primary_and_replica().await;
    let client = QueueClient::connect(
        &primary.url(),
        "test",
        &confirmed(1, Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let q = client.queue("late").unwrap();
    // (the library loaded, so the call below is the enqueue alone)
    q.enqueue(NewTask::new(b"{}".to_vec()).id("first"))
        .await
        .unwrap();
    replica.server.signal(Signal::SIGSTOP).unwrap();
    let call = tokio::spawn({
        let q = q.clone();
        async move { q.enqueue(NewTask::new(b"{}".to_vec()).id("late")).await }
    });
    // The primary has the task, and the call has not returned: it waits for the replica.
    let raw_primary = primary.raw().await;
    eventually(Duration::from_secs(3), "the task on the primary", || {
        let mut conn = raw_primary.clone();
        async move { holds(&mut conn, "test:{late}:r:late").await }
    })
    .await;
    assert!(
        !call.is_finished(),
        "the enqueue returned before its replica had it"
    );
    replica.server.signal(Signal::SIGCONT).unwrap();
    call.await.unwrap().unwrap();
    assert!(holds(&mut replica.raw().await, "test:{late}:r:late").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_stopped_a_write_fails_naming_the_limit_and_zero_still_succeeds() {
    let (primary, replica) = primary_and_replica().await;
    let timeout = Duration::from_millis(500);
    let waiting = QueueClient::connect(&primary.url(), "test", &confirmed(1, timeout))
        .await
        .unwrap();
    let q = waiting.queue("cut").unwrap();
    q.enqueue(NewTask::new(b"{}".to_vec()).id("before"))
        .await
        .unwrap();
    replica.server.signal(Signal::SIGSTOP).unwrap();

    let sent = Instant::now();
    let e = q
        .enqueue(NewTask::new(b"{}".to_vec()).id("unconfirmed"))
        .await
        .unwrap_err();
    let took = sent.elapsed();
    assert!(
        matches!(
            e,
            QueueError::NotConfirmed {
                acknowledged: 0,
                wanted: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "write not confirmed: 0 of wait_replicas = 1 replicas acknowledged within 500ms"
    );
    assert!(e.is_transient(), "{e}");
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "failed after {took:?}"
    );

    // The write was done on the primary, only not confirmed; without waiting, the same
    // primary takes writes as ever.
    let plain = QueueClient::connect(&primary.url(), "test", &ConnectOptions::default())
        .await
        .unwrap();
    let pq = plain.queue("cut").unwrap();
    assert!(recorded(RecordState::Waiting)(
        &pq.glance_many(&["unconfirmed"]).await.unwrap()[0]
    ));
    let sent = Instant::now();
    pq.enqueue(NewTask::new(b"{}".to_vec()).id("unwaited"))
        .await
        .unwrap();
    assert!(sent.elapsed() < timeout, "took {:?}", sent.elapsed());

    replica.server.signal(Signal::SIGCONT).unwrap();
    // The replica back, writes are confirmed again (with time to spare for its catching up).
    let patient = QueueClient::connect(
        &primary.url(),
        "test",
        &confirmed(1, Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let q = patient.queue("cut").unwrap();
    q.enqueue(NewTask::new(b"{}".to_vec()).id("after"))
        .await
        .unwrap();
    assert!(holds(&mut replica.raw().await, "test:{cut}:r:after").await);
}

/// On a Redis Cluster the `WAIT` goes to the node that ran the write and counts its own
/// replicas: with one primary's replica stopped, writes to its queues fail and writes to
/// the other primaries' queues are confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_write_waits_for_its_own_primarys_replica() {
    let cluster = ReplicatedCluster::start();
    let url = cluster.nodes[0].url();
    let client = QueueClient::connect(&url, "test", &confirmed(1, Duration::from_millis(500)))
        .await
        .unwrap();
    // One queue on each primary.
    let mut queues: Vec<(String, usize)> = Vec::new();
    for i in 0.. {
        let name = format!("q{i}");
        let owner = cluster.primary_of(&format!("test:{{{name}}}:ready"));
        if !queues.iter().any(|(_, o)| *o == owner) {
            queues.push((name, owner));
        }
        if queues.len() == 3 {
            break;
        }
    }
    for (name, _) in &queues {
        let q = client.queue(name).unwrap();
        q.enqueue(NewTask::new(b"{}".to_vec()).id("a"))
            .await
            .unwrap();
        // On the replica of its primary, at once.
        let key = format!("test:{{{name}}}:r:a");
        assert_eq!(cluster.replicas_holding(&key).await, 1, "{key}");
    }
    let (stopped_queue, owner) = queues[0].clone();
    let stopped = cluster.replica_of(owner);
    cluster.nodes[stopped]
        .server
        .signal(Signal::SIGSTOP)
        .unwrap();
    let e = client
        .queue(&stopped_queue)
        .unwrap()
        .enqueue(NewTask::new(b"{}".to_vec()).id("b"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            QueueError::NotConfirmed {
                acknowledged: 0,
                ..
            }
        ),
        "{e:?}"
    );
    for (name, _) in &queues[1..] {
        let q = client.queue(name).unwrap();
        q.enqueue(NewTask::new(b"{}".to_vec()).id("b"))
            .await
            .unwrap();
    }
    cluster.nodes[stopped]
        .server
        .signal(Signal::SIGCONT)
        .unwrap();
}

/// A Redis Cluster of three primaries, each with one replica (six nodes of their own).
struct ReplicatedCluster {
    nodes: Vec<TestRedis>,
    /// For each node: `Some(primary's index)` when it is a replica.
    replica_of: Vec<Option<usize>>,
    /// Slot ranges per primary index.
    slots: Vec<(usize, Vec<(u16, u16)>)>,
}

impl ReplicatedCluster {
    fn start() -> Self {
        let nodes = TestCluster::start_with_replicas().nodes;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let layout = Self::layout(&nodes);
            let linked = nodes.iter().all(|n| {
                let info = cli(n.server.port(), &["info", "replication"]);
                info.contains("role:master") && info.contains("state=online")
                    || info.contains("master_link_status:up")
            });
            let ok = nodes
                .iter()
                .all(|n| cli(n.server.port(), &["cluster", "info"]).contains("cluster_state:ok"));
            if let Some((replica_of, slots)) = layout.filter(|_| linked && ok) {
                return ReplicatedCluster {
                    nodes,
                    replica_of,
                    slots,
                };
            }
            assert!(
                Instant::now() < deadline,
                "the cluster never came up with its replicas"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Who replicates whom and who serves which slots, from `CLUSTER NODES`, once three
    /// replicas name their primaries.
    #[allow(clippy::type_complexity)]
    fn layout(nodes: &[TestRedis]) -> Option<(Vec<Option<usize>>, Vec<(usize, Vec<(u16, u16)>)>)> {
        let text = cli(nodes[0].server.port(), &["cluster", "nodes"]);
        let index_of_port = |port: u16| nodes.iter().position(|n| n.server.port() == port);
        let mut ids = std::collections::HashMap::new();
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
        for row in &rows {
            let port: u16 = row[1].split(['@', ':']).nth(1)?.parse().ok()?;
            ids.insert(row[0], index_of_port(port)?);
        }
        let mut replica_of = vec![None; nodes.len()];
        let mut slots = Vec::new();
        for row in &rows {
            let me = ids[row[0]];
            if row[2].contains("slave") {
                replica_of[me] = Some(*ids.get(row[3])?);
            } else {
                let ranges = row[8..]
                    .iter()
                    .filter_map(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                slots.push((me, ranges));
            }
        }
        (replica_of.iter().flatten().count() == 3).then_some((replica_of, slots))
    }

    /// The index of the primary that serves `key`'s slot.
    fn primary_of(&self, key: &str) -> usize {
        let slot: u16 = cli(self.nodes[0].server.port(), &["cluster", "keyslot", key])
            .trim()
            .parse()
            .unwrap();
        self.slots
            .iter()
            .find(|(_, ranges)| ranges.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|(p, _)| *p)
            .expect("a primary for every slot")
    }

    /// The index of `primary`'s replica.
    fn replica_of(&self, primary: usize) -> usize {
        self.replica_of
            .iter()
            .position(|p| *p == Some(primary))
            .expect("a replica for every primary")
    }

    /// How many replicas hold `key` (each read with `READONLY`, a raw read; a replica of
    /// another slot answers MOVED, which counts as not holding it).
    async fn replicas_holding(&self, key: &str) -> usize {
        let mut n = 0;
        for (i, node) in self.nodes.iter().enumerate() {
            if self.replica_of[i].is_none() {
                continue;
            }
            let mut conn = node.raw().await;
            let () = redis::cmd("READONLY").query_async(&mut conn).await.unwrap();
            if redis::cmd("EXISTS")
                .arg(key)
                .query_async::<i64>(&mut conn)
                .await
                .is_ok_and(|v| v == 1)
            {
                n += 1;
            }
        }
        n
    }
}

/// `redis-cli -p PORT ARGS…`'s output.
fn cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A master hands `wait_replicas` to its slots through the zygote: with the replica
/// stopped, a slot's ack is done but not confirmed, and the slot retries it as it retries
/// a settle in an outage, until the replica is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_masters_slots_confirm_their_settles() {
    let (primary, replica) = primary_and_replica().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let text = format!(
        "[cluster]\nredis = {:?}\nnamespace = \"test\"\nwait_replicas = 1\nwait_timeout = \"300ms\"\n\n\
         [manager]\ntick = \"200ms\"\nheartbeat_timeout = \"2s\"\n\n\
         [queues.q]\nhandler = \"noop\"\nmin_slots = 1\n",
        primary.url()
    );
    std::fs::write(&config, text).unwrap();
    let _daemons = crate::harness::Killed::manager_and_master(&config, dir.path());
    let plain = QueueClient::connect(&primary.url(), "test", &ConnectOptions::default())
        .await
        .unwrap();
    let q = plain.queue("q").unwrap();
    q.enqueue(NewTask::new(b"{}".to_vec()).id("one"))
        .await
        .unwrap();
    eventually(Duration::from_secs(60), "the first task acked", || {
        let q = q.clone();
        async move { q.stats().await.is_ok_and(|s| s.acked_total == 1) }
    })
    .await;

    replica.server.signal(Signal::SIGSTOP).unwrap();
    q.enqueue(NewTask::new(b"{}".to_vec()).id("two"))
        .await
        .unwrap();
    let log = || std::fs::read_to_string(dir.path().join("master.log")).unwrap_or_default();
    eventually(
        Duration::from_secs(30),
        "a slot's settle not confirmed",
        || {
            let said = log().contains("write not confirmed: 0 of wait_replicas = 1");
            async move { said }
        },
    )
    .await;
    replica.server.signal(Signal::SIGCONT).unwrap();
    // (its retry, confirmed, finds the ack done: counted stale, the task done once)
    eventually(Duration::from_secs(30), "the second task acked", || {
        let q = q.clone();
        async move { q.stats().await.is_ok_and(|s| s.acked_total == 2) }
    })
    .await;
    assert!(recorded(RecordState::Done)(
        &q.glance_many(&["two"]).await.unwrap()[0]
    ));
    assert!(!log().contains("ERROR"), "{}", log());
}

/// The api answers a submit its replicas did not confirm with a 503 naming the limit, its
/// outcome unknown; the same submit again, the replica back, finds the task made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_an_unconfirmed_submit_503_and_its_retry_finds_the_task() {
    use crate::api::{SHOP, config_text, request, test_config};
    let (primary, replica) = primary_and_replica().await;
    let mut opts = gaffer::api::ApiOptions::new(test_config(&config_text("")), primary.url());
    opts.listen = Some("127.0.0.1:0".parse().unwrap());
    opts.connect = confirmed(1, Duration::from_millis(500));
    let stop = tokio_util::sync::CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let api = tokio::spawn(gaffer::api::run(opts, stop.clone(), Some(tx)));
    let addr = rx.await.expect("the api binds");
    let submit = || async move {
        let body = br#"{"payload": {}, "id": "m1"}"#;
        let (status, body) = request(
            addr,
            "POST",
            "/v1/queues/emails/tasks",
            Some(SHOP),
            Some(body),
        )
        .await;
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        (status, body)
    };

    replica.server.signal(Signal::SIGSTOP).unwrap();
    let (status, body) = submit().await;
    replica.server.signal(Signal::SIGCONT).unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["outcome"], "unknown", "{body}");
    let said = body["error"].as_str().unwrap();
    assert!(
        said.starts_with(
            "write not confirmed: 0 of wait_replicas = 1 replicas acknowledged within 500ms; \
             the task may have been enqueued: retry with the same id"
        ),
        "{said}"
    );

    // Retried with its id once the replica is back: the task the primary made, once.
    let (status, body) = poll_ok(submit).await;
    assert!(status < 300, "{status} {body}");
    assert_eq!(body["created"], false, "{body}");
    stop.cancel();
    api.await.unwrap().unwrap();
}

/// `submit` again until it is answered other than 503 (the replica catching up), within
/// a deadline.
async fn poll_ok<F, Fut>(mut submit: F) -> (u16, serde_json::Value)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (u16, serde_json::Value)>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = submit().await;
        if status != 503 || Instant::now() > deadline {
            return (status, body);
        }
    }
}
