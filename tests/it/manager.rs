//! The manager end to end: real `gaffer manager` and `gaffer master` processes on one
//! redis-server, leadership and fencing, failover, schedules, operator commands.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gaffer::cluster::{self, HostReport, Keys, SlotMap};
use gaffer::manager::{FireClaim, Leadership};
use gaffer::queue_client::QueueClient;
use gaffer::redis_server::free_port;
use nix::sys::signal::Signal;

use crate::harness::{ANY_LOAD, TestRedis, eventually, poll_some};
use crate::host::{gone, http_get};

/// Processes killed on drop.
pub(crate) struct Procs(pub(crate) Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A cluster on one machine: one Redis, a config file, managers and masters.
pub(crate) struct Cluster {
    /// The Redis it started ([`Cluster::start_on`] is given a URL instead).
    pub(crate) redis: Option<TestRedis>,
    /// The Redis URL of the config.
    url: String,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) config: PathBuf,
    pub(crate) client: QueueClient,
    pub(crate) procs: Procs,
    /// Lines added to `[manager]` after `FAST`'s.
    manager_extra: String,
}

const FAST: &str = "[manager]\ntick = \"200ms\"\nheartbeat_timeout = \"2s\"\n\n";

impl Cluster {
    pub(crate) async fn start(tables: &str) -> Self {
        Self::start_with("", tables).await
    }

    /// A cluster whose `[manager]` also has the lines `manager_extra`.
    pub(crate) async fn start_with(manager_extra: &str, tables: &str) -> Self {
        let redis = TestRedis::start();
        let mut c = Self::start_on(redis.url(), redis.client().await, manager_extra, tables);
        c.redis = Some(redis);
        c
    }

    /// A cluster on the Redis at `url` (a Sentinel group's, say), `client` connected to it.
    pub(crate) fn start_on(
        url: String,
        client: QueueClient,
        manager_extra: &str,
        tables: &str,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        let c = Cluster {
            client,
            redis: None,
            url,
            dir,
            config,
            procs: Procs(Vec::new()),
            manager_extra: manager_extra.to_string(),
        };
        c.write_config(tables);
        c
    }

    pub(crate) fn write_config(&self, tables: &str) {
        let text = format!(
            "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n{FAST}{}\n{tables}",
            self.url, self.manager_extra
        );
        std::fs::write(&self.config, text).unwrap();
    }

    pub(crate) fn gaffer(&self, args: &[&str], log: &str) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gaffer"));
        cmd.arg("--config")
            .arg(&self.config)
            .args(args)
            .env("GAFFER_LOG", "info")
            .env(ANY_LOAD.0, ANY_LOAD.1)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join(log)).unwrap());
        cmd
    }

    /// Starts a manager; returns its index in `procs`.
    pub(crate) fn manager(&mut self, n: usize) -> usize {
        self.manager_http(n).0
    }

    /// Starts a manager; returns its index in `procs` and its HTTP port.
    pub(crate) fn manager_http(&mut self, n: usize) -> (usize, u16) {
        let http = free_port().unwrap();
        let child = self
            .gaffer(&["manager"], &format!("manager{n}.log"))
            .env("GAFFER_MANAGER_HTTP", format!("127.0.0.1:{http}"))
            .spawn()
            .unwrap();
        self.procs.0.push(child);
        (self.procs.0.len() - 1, http)
    }

    /// Starts a master for `host` with its own HTTP port.
    pub(crate) fn master(&mut self, host: &str) -> (usize, u16) {
        let http = free_port().unwrap();
        let child = self
            .gaffer(&["master", "--host", host], &format!("master-{host}.log"))
            .env("GAFFER_MASTER_HTTP", format!("127.0.0.1:{http}"))
            .spawn()
            .unwrap();
        self.procs.0.push(child);
        (self.procs.0.len() - 1, http)
    }

    /// Which of managers `a` and `b` holds the lease (its value is `host:pid:epoch`).
    pub(crate) async fn leader(&self, a: usize, b: usize) -> usize {
        let lease: String = redis::cmd("GET")
            .arg(Keys::new("test").lease())
            .query_async(&mut self.client.connection())
            .await
            .unwrap();
        if lease.contains(&format!(":{}:", self.pid(a))) {
            a
        } else {
            b
        }
    }

    pub(crate) fn pid(&self, i: usize) -> u32 {
        self.procs.0[i].id()
    }

    pub(crate) fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    pub(crate) fn cli(&self, args: &[&str]) -> String {
        crate::harness::gaffer_ok(&self.config, args)
    }

    pub(crate) async fn map(&self) -> Option<SlotMap> {
        cluster::read_map(&mut self.client.connection(), &Keys::new("test"))
            .await
            .unwrap()
    }

    /// Slots of `queue` per host in the current map.
    pub(crate) async fn placed(&self, queue: &str) -> BTreeMap<String, u32> {
        self.map()
            .await
            .map(|m| {
                m.hosts
                    .iter()
                    .filter_map(|(h, qs)| qs.get(queue).map(|n| (h.clone(), *n)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

pub(crate) fn signal(pid: u32, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

/// A host that is only a report: enough for the manager to place slots on it.
async fn heartbeat(client: &QueueClient, host: &str, capacity: u32) {
    heartbeat_skewed(client, host, capacity, 0).await;
}

/// [`heartbeat`] from a host whose clock is `skew_ms` ahead (negative: behind).
async fn heartbeat_skewed(client: &QueueClient, host: &str, capacity: u32, skew_ms: i64) {
    let report = HostReport {
        host: host.into(),
        ts_ms: cluster::now_ms().saturating_add_signed(skew_ms),
        capacity,
        handlers: vec!["noop".into(), "sleep".into()],
        ..HostReport::default()
    };
    cluster::publish_host(&mut client.connection(), &Keys::new("test"), &report)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_fenced_manager_cannot_write() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    let mut conn = client.connection();
    let keys = Keys::new("test");
    let ttl = Duration::from_secs(30);
    let mut first = Leadership::new(keys.clone(), "first".into(), ttl);
    let mut second = Leadership::new(keys.clone(), "second".into(), ttl);
    assert!(first.renew(&mut conn).await.unwrap());
    assert!(
        !second.renew(&mut conn).await.unwrap(),
        "the lease is taken"
    );
    let map = SlotMap::default();
    assert_eq!(first.write_map(&mut conn, &map).await.unwrap(), Some(1));

    // The first manager's lease runs out (as if it was paused) and the second takes over.
    let () = redis::cmd("DEL")
        .arg(keys.lease())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(second.renew(&mut conn).await.unwrap());
    assert_eq!(second.epoch(), 2);
    assert_eq!(
        first.write_map(&mut conn, &map).await.unwrap(),
        None,
        "fenced"
    );
    assert!(
        !first
            .claim_fire(
                &mut conn,
                &FireClaim {
                    field: "s",
                    name: "s",
                    stored: false
                },
                1
            )
            .await
            .unwrap(),
        "fenced"
    );
    assert!(
        !first
            .write_decisions(&mut conn, "[\"stale\"]", "{}")
            .await
            .unwrap(),
        "fenced"
    );
    assert!(second.write_decisions(&mut conn, "[]", "{}").await.unwrap());
    let decisions: String = redis::cmd("GET")
        .arg(keys.decisions())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(decisions, "[]", "the fenced manager wrote nothing");
    // Forgetting a host: fenced, and only the report as it was read.
    let report = HostReport {
        host: "h".into(),
        ..HostReport::default()
    };
    cluster::publish_host(&mut conn, &keys, &report)
        .await
        .unwrap();
    let read = serde_json::to_string(&report).unwrap();
    assert_eq!(
        first.forget_host(&mut conn, "h", &read).await.unwrap(),
        None
    );
    assert_eq!(
        second
            .forget_host(&mut conn, "h", "{\"stale\":1}")
            .await
            .unwrap(),
        Some(false),
        "a report that changed since it was read is kept"
    );
    assert!(
        cluster::read_hosts(&mut conn, &keys)
            .await
            .unwrap()
            .contains_key("h")
    );
    assert_eq!(
        second.forget_host(&mut conn, "h", &read).await.unwrap(),
        Some(true)
    );
    assert!(
        cluster::read_hosts(&mut conn, &keys)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(second.write_map(&mut conn, &map).await.unwrap(), Some(2));
    let stored = cluster::read_map(&mut conn, &keys).await.unwrap().unwrap();
    assert_eq!((stored.epoch, stored.version), (2, 2));
    assert!(!first.renew(&mut conn).await.unwrap(), "and it steps down");
    // Raising the epoch past what masters saw: fenced; the counter goes past it too, and
    // the lease keeps its time.
    assert!(!first.raise_epoch(&mut conn, 10).await.unwrap(), "fenced");
    assert!(second.raise_epoch(&mut conn, 10).await.unwrap());
    assert_eq!(second.epoch(), 11);
    let (lease, ttl, counter): (String, i64, u64) = redis::pipe()
        .get(keys.lease())
        .pttl(keys.lease())
        .get(keys.epoch())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((lease.as_str(), counter), ("second:11", 11));
    assert!(ttl > 0, "{ttl}");
    assert!(second.renew(&mut conn).await.unwrap());
    assert_eq!(second.epoch(), 11, "renewed at the raised epoch");
}

#[tokio::test]
async fn failover_after_sigstop_and_no_stale_map_after_sigcont() {
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\nmin_slots = 2\n").await;
    heartbeat(&c.client, "h1", 10).await;
    let m1 = c.manager(1);
    let m2 = c.manager(2);
    let first = poll_some(Duration::from_secs(20), "a first map", || async {
        heartbeat(&c.client, "h1", 10).await;
        c.map()
            .await
            .filter(|m| m.hosts.get("h1").is_some_and(|q| q.get("a") == Some(&2)))
    })
    .await;
    let leader = c.leader(m1, m2).await;
    signal(c.pid(leader), Signal::SIGSTOP);
    // Change what the right map is, so the standby must write one when it takes over.
    let epochs = std::sync::Mutex::new(vec![first.epoch]);
    let taken = poll_some(
        Duration::from_secs(30),
        "the standby to take over",
        || async {
            heartbeat(&c.client, "h1", 10).await;
            heartbeat(&c.client, "h2", 10).await;
            let m = c.map().await?;
            epochs.lock().unwrap().push(m.epoch);
            (m.epoch > first.epoch).then_some(m)
        },
    )
    .await;
    signal(c.pid(leader), Signal::SIGCONT);
    // The stale manager wakes up believing it leads; it must write nothing.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        heartbeat(&c.client, "h1", 10).await;
        heartbeat(&c.client, "h2", 10).await;
        let epoch = c.map().await.unwrap().epoch;
        epochs.lock().unwrap().push(epoch);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let epochs = epochs.into_inner().unwrap();
    assert!(
        epochs.windows(2).all(|w| w[0] <= w[1]),
        "a stale epoch was accepted: {epochs:?}"
    );
    assert!(
        epochs.iter().all(|&e| e == first.epoch || e == taken.epoch),
        "{epochs:?}"
    );
    let stale_log = c.log(&format!("manager{}.log", if leader == m1 { 1 } else { 2 }));
    assert!(stale_log.contains("leading=false"), "{stale_log}");
}

/// A host whose queue `a` keeps `busy` slots busy: its counters grow with the time since
/// `since`, as a master's would.
async fn busy_heartbeat(client: &QueueClient, host: &str, since: Instant, busy: f64) {
    let t = since.elapsed().as_secs_f64();
    let queue = gaffer::cluster::QueueReport {
        processed_total: (100.0 * t) as u64,
        busy_seconds_total: busy * t,
        slot_lifetime_seconds_total: (busy + 1.0) * t,
        ..Default::default()
    };
    let report = HostReport {
        host: host.into(),
        started_ms: 1,
        ts_ms: cluster::now_ms(),
        capacity: 20,
        handlers: vec!["noop".into()],
        queues: [("a".to_string(), queue)].into(),
        ..HostReport::default()
    };
    cluster::publish_host(&mut client.connection(), &Keys::new("test"), &report)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_failover_keeps_a_busy_queues_slots() {
    // Four slots' worth of work and nothing waiting: the balancer asks for five slots
    // (at 80 % utilisation) from the busy time alone. A manager that took over with an
    // empty window read the queue as idle and took them away for a tick.
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\nmax_slots = 10\n").await;
    let since = Instant::now();
    busy_heartbeat(&c.client, "h1", since, 4.0).await;
    let m1 = c.manager(1);
    let m2 = c.manager(2);
    let before = poll_some(
        Duration::from_secs(20),
        "a map for the busy queue",
        || async {
            busy_heartbeat(&c.client, "h1", since, 4.0).await;
            let placed = c.placed("a").await.get("h1").copied().unwrap_or(0);
            (placed >= 4).then_some(placed)
        },
    )
    .await;
    let first = c.map().await.unwrap();
    let leader = c.leader(m1, m2).await;
    signal(c.pid(leader), Signal::SIGKILL);
    let seen = std::sync::Mutex::new(Vec::new());
    poll_some(
        Duration::from_secs(30),
        "the standby to take over",
        || async {
            busy_heartbeat(&c.client, "h1", since, 4.0).await;
            let m = c.map().await?;
            if m.epoch > first.epoch {
                let a = m.hosts.get("h1").and_then(|q| q.get("a"));
                seen.lock().unwrap().push(a.copied().unwrap_or(0));
            }
            // a few of the new leader's ticks
            (seen.lock().unwrap().len() >= 30).then_some(())
        },
    )
    .await;
    let seen = seen.into_inner().unwrap();
    assert!(
        seen.iter().all(|&n| n >= 4),
        "the new leader took the busy queue's slots away (it had {before}): {seen:?}"
    );
    // The first leader held the map on its first tick; the standby's window was warm.
    let log = |i| c.log(&format!("manager{}.log", if i == m1 { 1 } else { 2 }));
    let standby = if leader == m1 { m2 } else { m1 };
    assert!(log(leader).contains("holding the map"), "{}", log(leader));
    assert!(
        !log(standby).contains("holding the map"),
        "{}",
        log(standby)
    );
}

#[tokio::test]
async fn a_host_silent_past_forget_hosts_after_is_forgotten() {
    let mut c = Cluster::start_with(
        "forget_hosts_after = \"3s\"\n",
        "[queues.a]\nhandler = \"noop\"\nmin_slots = 2\n",
    )
    .await;
    heartbeat(&c.client, "gone", 10).await;
    let started = Instant::now();
    c.manager(1);
    let keys = Keys::new("test");
    let hosts = || async {
        let raw: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(keys.hosts())
            .query_async(&mut c.client.connection())
            .await
            .unwrap();
        raw.into_keys().collect::<BTreeSet<_>>()
    };
    // `stays` keeps reporting; `gone` said nothing after its first report.
    poll_some(
        Duration::from_secs(30),
        "the silent host to be forgotten",
        || async {
            heartbeat(&c.client, "stays", 10).await;
            let now = hosts().await;
            assert!(now.contains("stays"), "a live host was forgotten: {now:?}");
            (!now.contains("gone")).then_some(())
        },
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "forgotten before forget_hosts_after: {:?}",
        started.elapsed()
    );
    // A forgotten host holds no slots.
    let placed = c.placed("a").await;
    assert_eq!(placed.keys().collect::<Vec<_>>(), ["stays"], "{placed:?}");
    let log = c.log("manager1.log");
    assert!(
        log.contains("forgot a host") && log.contains("host=\"gone\""),
        "{log}"
    );
    // A master that reports again is known again.
    heartbeat(&c.client, "gone", 10).await;
    assert!(hosts().await.contains("gone"));
}

#[tokio::test]
async fn a_manager_whose_epoch_restarted_below_the_masters_raises_it() {
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\nmin_slots = 2\n").await;
    let keys = Keys::new("test");
    let mut conn = c.client.connection();
    // An epoch counter that has counted a few leaders already.
    let () = redis::cmd("SET")
        .arg(keys.epoch())
        .arg(4)
        .query_async(&mut conn)
        .await
        .unwrap();
    c.master("h1");
    c.manager(1);
    let report = |want_epoch: u64, want_slots: u32| {
        let mut conn = c.client.connection();
        let keys = keys.clone();
        async move {
            let hosts = cluster::read_hosts(&mut conn, &keys).await.unwrap();
            let r = hosts.get("h1")?;
            let slots = r.queues.get("a").map_or(0, |q| q.slots);
            (r.map_epoch >= want_epoch && slots == want_slots).then_some(r.map_epoch)
        }
    };
    poll_some(Duration::from_secs(30), "the master on epoch 5", || {
        report(5, 2)
    })
    .await;
    // Redis loses everything (a restart without persistence): the epoch counter with it.
    let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    // A change only a map the master accepts can bring about.
    c.cli(&["pause", "a"]);
    let epoch = poll_some(
        Duration::from_secs(30),
        "the master to follow a new map",
        || report(6, 0),
    )
    .await;
    assert!(epoch > 5, "{epoch}");
    let log = c.log("manager1.log");
    assert!(log.contains("raised past it"), "{log}");
}

#[tokio::test]
async fn a_map_redis_lost_is_not_replaced_by_the_older_one_it_kept() {
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\nmin_slots = 2\n").await;
    let keys = Keys::new("test");
    let mut conn = c.client.connection();
    c.master("h1");
    let leader = c.manager(1);
    let report = |slots: u32| {
        let mut conn = c.client.connection();
        let keys = keys.clone();
        async move {
            let hosts = cluster::read_hosts(&mut conn, &keys).await.unwrap();
            let r = hosts.get("h1")?;
            (r.queues.get("a").map_or(0, |q| q.slots) == slots)
                .then_some((r.map_epoch, r.map_version))
        }
    };
    poll_some(Duration::from_secs(30), "two slots on h1", || report(2)).await;
    let old: String = redis::cmd("GET")
        .arg(keys.map())
        .query_async(&mut conn)
        .await
        .unwrap();
    c.cli(&["pause", "a"]);
    let (epoch, newer) = poll_some(Duration::from_secs(30), "the paused map on h1", || {
        report(0)
    })
    .await;
    // Redis goes back in time, as a failover to a replica that had not received the
    // newest writes does: the older map again, under the same leader and epoch, and
    // the pause gone.
    let () = redis::cmd("SET")
        .arg(keys.map())
        .arg(&old)
        .query_async(&mut conn)
        .await
        .unwrap();
    let () = redis::cmd("DEL")
        .arg(keys.paused())
        .query_async(&mut conn)
        .await
        .unwrap();
    // The master keeps its newer map until the leader writes one past it, under a raised
    // epoch; it never runs the older one again.
    let (after, _) = poll_some(
        Duration::from_secs(30),
        "a map past the lost one",
        || async { report(2).await.filter(|(e, _)| *e > epoch) },
    )
    .await;
    assert!(after > epoch);
    let manager = c.log("manager1.log");
    assert!(manager.contains("writes the map anew"), "{manager}");

    // The master's side alone, the leader stopped: an older map of the epoch it runs is
    // ignored, however long Redis holds it.
    signal(c.pid(leader), Signal::SIGSTOP);
    let current: String = redis::cmd("GET")
        .arg(keys.map())
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut older: serde_json::Value = serde_json::from_str(&current).unwrap();
    let version = older["version"].as_u64().unwrap();
    older["version"] = (version - 1).into();
    older["hosts"] = serde_json::json!({});
    let () = redis::cmd("SET")
        .arg(keys.map())
        .arg(older.to_string())
        .query_async(&mut conn)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the master ignores the older map",
        || async {
            c.log("master-h1.log")
                .contains("ignoring a slot map older than one already read")
        },
    )
    .await;
    assert!(report(2).await.is_some(), "the master still runs its map");
    signal(c.pid(leader), Signal::SIGCONT);
    let master = c.log("master-h1.log");
    let maps = crate::sentinel::adopted_maps(&master);
    assert!(maps.windows(2).all(|w| w[0] < w[1]), "{maps:?}");
    assert!(maps.contains(&(epoch, newer)), "{maps:?}");
}

#[tokio::test]
async fn a_config_redis_went_back_on_is_published_again_not_adopted() {
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\nmin_slots = 1\n").await;
    let keys = Keys::new("test");
    let mut conn = c.client.connection();
    c.master("h1");
    c.manager(1);
    let config_hash = async |conn: &mut gaffer::queue_client::RedisConn| -> Vec<(String, String)> {
        redis::cmd("HGETALL")
            .arg(keys.config())
            .query_async(conn)
            .await
            .unwrap()
    };
    let field = |hash: &[(String, String)], f: &str| {
        hash.iter().find(|(k, _)| k == f).map(|(_, v)| v.clone())
    };
    let out = c.cli(&["config", "apply"]);
    assert!(out.contains("version 1"), "{out}");
    let older = config_hash(&mut conn).await;
    let base = std::fs::read_to_string(&c.config).unwrap();
    std::fs::write(
        &c.config,
        base + "\n[queues.b]\nhandler = \"noop\"\nmin_slots = 1\n",
    )
    .unwrap();
    c.cli(&["config", "apply"]);
    eventually(Duration::from_secs(15), "b placed", || async {
        c.placed("b").await.get("h1") == Some(&1)
    })
    .await;
    let newer = field(&config_hash(&mut conn).await, "source").unwrap();
    // (the master's look at the config comes on its own tick: it runs b's slot once it
    // has adopted the newer one)
    eventually(Duration::from_secs(15), "the master runs b", || async {
        let hosts = cluster::read_hosts(&mut c.client.connection(), &keys)
            .await
            .unwrap();
        hosts
            .get("h1")
            .and_then(|r| r.queues.get("b"))
            .is_some_and(|q| q.slots == 1)
    })
    .await;
    let adopted = c
        .log("master-h1.log")
        .matches("adopting the published config")
        .count();
    assert!(adopted >= 1);

    // Redis goes back to the older config, as a failover to a replica that had not
    // received the newer apply does.
    let mut restore = redis::cmd("HSET");
    restore.arg(keys.config());
    for (k, v) in &older {
        restore.arg(k).arg(v);
    }
    let () = redis::cmd("DEL")
        .arg(keys.config())
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: i64 = restore.query_async(&mut conn).await.unwrap();

    // The leader publishes the config in force again; nobody adopts the older one.
    eventually(
        Duration::from_secs(15),
        "the config in force published again",
        || async {
            let hash = config_hash(&mut c.client.connection()).await;
            field(&hash, "source").as_deref() == Some(newer.as_str())
        },
    )
    .await;
    let manager = c.log("manager1.log");
    assert!(
        manager.contains("published the one in force again"),
        "{manager}"
    );
    let master = c.log("master-h1.log");
    assert_eq!(
        master.matches("adopting the published config").count(),
        adopted,
        "{master}"
    );
    assert_eq!(c.placed("b").await.get("h1"), Some(&1));
    // A role started now runs it too.
    let stats: serde_json::Value = serde_json::from_str(&c.cli(&["stats", "--json"])).unwrap();
    assert!(stats["queues"]["b"].is_object(), "{stats}");
}

#[tokio::test]
async fn hosts_are_judged_alive_by_their_reports_changing_not_by_their_clocks() {
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\nmin_slots = 2\n").await;
    c.manager(1);
    // A host whose clock runs a minute ahead: by the wall clocks, its last report would
    // look fresh for a minute after it stopped.
    poll_some(
        Duration::from_secs(30),
        "slots on the early host",
        || async {
            heartbeat_skewed(&c.client, "early", 10, 60_000).await;
            c.placed("a").await.get("early").copied()
        },
    )
    .await;
    // It stops; one whose clock runs a minute behind reports instead (every report a
    // minute old by the wall clocks, far past the 2 s timeout). The slots move to it
    // within the heartbeat timeout.
    poll_some(
        Duration::from_secs(20),
        "the slots on the late host",
        || async {
            heartbeat_skewed(&c.client, "late", 10, -60_000).await;
            let placed = c.placed("a").await;
            (placed.keys().collect::<Vec<_>>() == ["late"]).then_some(())
        },
    )
    .await;
    // `stats` shows the leader's verdicts, not the age of the reports by its own clock.
    heartbeat_skewed(&c.client, "late", 10, -60_000).await;
    let stats: serde_json::Value = serde_json::from_str(&c.cli(&["stats", "--json"])).unwrap();
    let state = |h: &str| {
        stats["hosts"][h]["state"]
            .as_str()
            .unwrap_or("?")
            .to_string()
    };
    assert_eq!(
        (state("late"), state("early")),
        ("alive".into(), "dead".into()),
        "{stats}"
    );
}

#[tokio::test]
async fn a_dead_masters_slots_move_within_the_heartbeat_timeout() {
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\nmin_slots = 4\n").await;
    let (m1, http1) = c.master("h1");
    let (_m2, http2) = c.master("h2");
    // Both hosts first: a manager deciding while only h1 has reported puts all four there,
    // and a map that is already placed stays where it is.
    eventually(Duration::from_secs(20), "both hosts reporting", || async {
        let hosts = cluster::read_hosts(&mut c.client.connection(), &Keys::new("test"))
            .await
            .unwrap();
        hosts.contains_key("h1") && hosts.contains_key("h2")
    })
    .await;
    let (_, manager_http) = c.manager_http(1);
    eventually(
        Duration::from_secs(30),
        "a spread over both hosts",
        || async {
            let p = c.placed("a").await;
            p.get("h1") == Some(&2) && p.get("h2") == Some(&2)
        },
    )
    .await;
    let running = |http: u16| -> usize {
        http_get(http, "/status")
            .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
            .map_or(0, |s| {
                s["slots"]
                    .as_array()
                    .map_or(0, |a| a.iter().filter(|x| x["state"] == "idle").count())
            })
    };
    eventually(Duration::from_secs(20), "slots running on both", || async {
        running(http1) == 2 && running(http2) == 2
    })
    .await;
    let status: serde_json::Value =
        serde_json::from_str(&http_get(http1, "/status").unwrap()).unwrap();
    let h1_pids: Vec<u32> = status["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["pid"].as_u64().map(|p| p as u32))
        .collect();
    signal(c.pid(m1), Signal::SIGKILL);
    let killed = Instant::now();
    eventually(Duration::from_secs(20), "all four slots on h2", || async {
        c.placed("a").await.get("h2") == Some(&4) && running(http2) == 4
    })
    .await;
    // Heartbeat timeout 2 s + manager tick + master tick, with room for a loaded machine.
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "took {:?}",
        killed.elapsed()
    );
    assert!(
        h1_pids.iter().all(|&p| gone(p)),
        "h1's slots died with their master"
    );
    // Why the slots moved is in the leader's log and counters: h1 judged dead, once.
    let scrape = http_get(manager_http, "/metrics").unwrap();
    let verdicts = |v: &str| {
        sample(
            &scrape,
            &format!("gaffer_manager_host_verdicts_total{{verdict=\"{v}\"}}"),
        )
    };
    assert_eq!(verdicts("dead"), Some(1.0), "{scrape}");
    assert_eq!(verdicts("alive"), Some(0.0), "{scrape}");
    let log = std::fs::read_to_string(c.dir.path().join("manager1.log")).unwrap();
    let judged: Vec<&str> = log.lines().filter(|l| l.contains("judged dead")).collect();
    assert!(
        judged.len() == 1 && judged[0].contains("host=\"h1\"") && judged[0].contains("allowed_ms="),
        "{judged:?}"
    );
}

/// A schedule whose fires fall between the manager's ticks fires every time from its
/// first sight on: the first fire after the manager began leading, then each one after
/// it. (Before, a schedule that had never fired looked back one second per tick, so its
/// fires were a toss-up until one landed in that second.)
#[tokio::test]
async fn a_schedule_sparser_than_the_tick_misses_no_fire() {
    let mut c = Cluster::start(
        "[queues.tick]\nhandler = \"noop\"\n\n[[schedules]]\nqueue = \"tick\"\ncron = \"*/5 * * * * *\"\npayload = {}\n",
    )
    .await;
    let text = std::fs::read_to_string(&c.config)
        .unwrap()
        .replace("tick = \"200ms\"", "tick = \"3s\"");
    std::fs::write(&c.config, text).unwrap();
    let m = c.manager(1);
    let lease = gaffer::cluster::Keys::new("test").lease();
    eventually(Duration::from_secs(20), "a leader", || async {
        let v: Option<String> = redis::cmd("GET")
            .arg(&lease)
            .query_async(&mut c.client.connection())
            .await
            .unwrap();
        v.is_some()
    })
    .await;
    let leading_ms = gaffer::cluster::now_ms() as i64;
    let q = c.client.queue("tick").unwrap();
    eventually(Duration::from_secs(30), "two fires", || async {
        q.stats().await.unwrap().enqueued_total >= 2
    })
    .await;
    signal(c.pid(m), Signal::SIGSTOP);
    let tasks = q.take(10_000, Duration::from_secs(60)).await.unwrap().tasks;
    let mut fires: Vec<i64> = tasks
        .iter()
        .map(|t| t.id.rsplit(':').next().unwrap().parse::<i64>().unwrap())
        .collect();
    fires.sort_unstable();
    // The first boundary of five seconds after the lead began (its first tick saw the
    // schedule then), give or take the tick that was under way.
    let first_due = (leading_ms - 3000) / 5000 * 5000 + 5000;
    assert!(
        fires[0] <= first_due + 5000,
        "first fire {} long after the first due {first_due}: {fires:?}",
        fires[0]
    );
    let expected: Vec<i64> = (0..fires.len() as i64)
        .map(|k| fires[0] + 5000 * k)
        .collect();
    assert_eq!(
        fires, expected,
        "every fire from the first, five seconds apart"
    );
}

/// A standby reads the cluster every tick (its load window stays warm) and writes nothing:
/// Redis's count of changes to its data stays still over its ticks, with a queue, its
/// tasks and a schedule due every second to tempt it.
#[tokio::test]
async fn a_standby_writes_nothing() {
    let mut c = Cluster::start(
        "[queues.a]\nhandler = \"noop\"\n\n[[schedules]]\nqueue = \"a\"\ncron = \"* * * * * *\"\npayload = {}\n",
    )
    .await;
    let q = c.client.queue("a").unwrap();
    for i in 0..3 {
        q.enqueue(gaffer::queue_client::NewTask::new(b"{}".to_vec()).id(format!("t{i}")))
            .await
            .unwrap();
    }
    // Another manager leads, for longer than the test lasts.
    let lease = Keys::new("test").lease();
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("elsewhere:1:7")
        .arg("PX")
        .arg(600_000)
        .query_async(&mut c.client.connection())
        .await
        .unwrap();
    let (_m, http) = c.manager_http(1);
    let ticks = || {
        http_get(http, "/metrics").and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("gaffer_manager_ticks_total "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
    };
    let first = poll_some(Duration::from_secs(20), "a first tick", || async {
        ticks()
    })
    .await;
    let changes = || async {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query_async(&mut c.client.connection())
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("rdb_changes_since_last_save:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("redis counts its changes")
    };
    let before = changes().await;
    poll_some(Duration::from_secs(20), "five more ticks", || async {
        ticks().filter(|&t| t >= first + 5.0)
    })
    .await;
    assert_eq!(changes().await, before, "a standby changed redis's data");
    let holder: String = redis::cmd("GET")
        .arg(&lease)
        .query_async(&mut c.client.connection())
        .await
        .unwrap();
    assert_eq!(holder, "elsewhere:1:7");
    assert_eq!(
        q.stats().await.unwrap().enqueued_total,
        3,
        "no schedule fired"
    );
}

/// A fire a manager claimed and then died (or lost Redis) before enqueueing stays pending,
/// and the next leader enqueues it; one whose task it did enqueue, and which has run since,
/// is not enqueued again (its tracked record says so). Before, the claim alone was kept
/// and such a fire was lost.
#[tokio::test]
async fn a_claimed_fire_whose_enqueue_was_lost_is_enqueued_by_the_next_leader() {
    // Yearly: no fire of its own falls within the test.
    let cron = "0 0 0 1 1 *";
    let mut c = Cluster::start(&format!(
        "[queues.lost]\nhandler = \"noop\"\n\n[queues.made]\nhandler = \"noop\"\n\n\
         [[schedules]]\nqueue = \"lost\"\ncron = \"{cron}\"\npayload = {{}}\n\n\
         [[schedules]]\nqueue = \"made\"\ncron = \"{cron}\"\npayload = {{}}\n"
    ))
    .await;
    let now = cluster::now_ms() as i64;
    let fire = now - 60_000;
    // What a manager that claimed `fire` for both schedules leaves when it dies: `lost`
    // before its enqueue; `made` after it, its task since run and acked.
    let made = c.client.queue("made").unwrap();
    made.enqueue(
        gaffer::queue_client::NewTask::new(b"{}".to_vec()).id(format!("schedule:1:{fire}")),
    )
    .await
    .unwrap();
    let b = made.take(1, Duration::from_secs(60)).await.unwrap();
    made.ack(&b.tasks).await.unwrap();
    let schedules = Keys::new("test").schedules();
    let mut conn = c.client.connection();
    let _: () = redis::cmd("HSET")
        .arg(&schedules)
        .arg(format!("0:lost:{cron}"))
        .arg(now)
        .arg(format!("0:lost:{cron}:pending"))
        .arg(fire)
        .arg(format!("1:made:{cron}"))
        .arg(now)
        .arg(format!("1:made:{cron}:pending"))
        .arg(fire)
        .query_async(&mut conn)
        .await
        .unwrap();
    c.manager(1);
    let lost = c.client.queue("lost").unwrap();
    eventually(
        Duration::from_secs(20),
        "both pending fires settled",
        || async {
            let fields: Vec<String> = redis::cmd("HKEYS")
                .arg(&schedules)
                .query_async(&mut c.client.connection())
                .await
                .unwrap();
            !fields.iter().any(|f| f.ends_with(":pending"))
        },
    )
    .await;
    let t = lost.take(10, Duration::from_secs(60)).await.unwrap().tasks;
    let ids: Vec<&str> = t.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(
        ids,
        [format!("schedule:lost.0:{fire}")],
        "the lost fire, once, under its name"
    );
    assert_eq!(
        made.stats().await.unwrap().enqueued_total,
        1,
        "the fire whose task ran (enqueued under the id of the releases before names) is not enqueued again"
    );
}

#[tokio::test]
async fn schedules_fire_once_per_second_across_a_failover() {
    let mut c = Cluster::start(
        "[queues.tick]\nhandler = \"noop\"\n\n[[schedules]]\nqueue = \"tick\"\ncron = \"* * * * * *\"\npayload = { kind = \"tick\" }\n",
    )
    .await;
    let m1 = c.manager(1);
    let m2 = c.manager(2);
    let q = c.client.queue("tick").unwrap();
    eventually(Duration::from_secs(20), "first fires", || async {
        q.stats().await.unwrap().enqueued_total >= 2
    })
    .await;
    let leader = c.leader(m1, m2).await;
    signal(c.pid(leader), Signal::SIGSTOP);
    let stopped_at = q.stats().await.unwrap().enqueued_total;
    // The standby takes over after the lease (3 s) and catches up on the missed seconds.
    eventually(
        Duration::from_secs(20),
        "fires after the failover",
        || async { q.stats().await.unwrap().enqueued_total >= stopped_at + 5 },
    )
    .await;
    signal(c.pid(leader), Signal::SIGCONT);
    let resumed_at = q.stats().await.unwrap().enqueued_total;
    eventually(
        Duration::from_secs(20),
        "fires with both running",
        || async { q.stats().await.unwrap().enqueued_total >= resumed_at + 3 },
    )
    .await;
    for i in 0..c.procs.0.len() {
        signal(c.pid(i), Signal::SIGSTOP);
    }
    let stats = q.stats().await.unwrap();
    let ids: Vec<String> = {
        let tasks = q.take(10_000, Duration::from_secs(60)).await.unwrap().tasks;
        tasks.into_iter().map(|t| t.id).collect()
    };
    assert_eq!(
        ids.len() as u64,
        stats.enqueued_total,
        "every enqueue is a distinct task"
    );
    let mut seconds: Vec<i64> = ids
        .iter()
        .map(|id| id.rsplit(':').next().unwrap().parse::<i64>().unwrap() / 1000)
        .collect();
    seconds.sort_unstable();
    let distinct: BTreeSet<i64> = seconds.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        seconds.len(),
        "a fire time enqueued twice: {seconds:?}"
    );
    let (first, last) = (seconds[0], *seconds.last().unwrap());
    assert_eq!(
        seconds.len() as i64,
        last - first + 1,
        "a fire time was skipped: {seconds:?}"
    );
    assert!(seconds.len() >= 10, "{seconds:?}");
    // Their records say which schedule submitted them.
    let rec = q.record(&ids[0]).await.unwrap().expect("a record");
    assert_eq!(rec.submitted_by.as_deref(), Some("schedule:tick.0"));
}

#[tokio::test]
async fn operators_pause_drain_and_apply_through_redis() {
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\nmin_slots = 2\n").await;
    c.manager(1);
    let (_m1, _http1) = c.master("h1");
    let (_m2, _http2) = c.master("h2");
    // Both hosts up and a placed (where depends on which host reported first: a map that
    // is right is not reshuffled).
    eventually(
        Duration::from_secs(30),
        "a placed, both hosts up",
        || async {
            let hosts = cluster::read_hosts(&mut c.client.connection(), &Keys::new("test"))
                .await
                .unwrap();
            hosts.len() == 2 && c.placed("a").await.values().sum::<u32>() == 2
        },
    )
    .await;

    c.cli(&["pause", "a"]);
    eventually(Duration::from_secs(10), "a paused", || async {
        c.placed("a").await.is_empty()
    })
    .await;
    let stats: serde_json::Value = serde_json::from_str(&c.cli(&["stats", "--json"])).unwrap();
    assert_eq!(stats["queues"]["a"]["paused"], true, "{stats}");
    c.cli(&["resume", "a"]);
    eventually(Duration::from_secs(10), "a resumed", || async {
        c.placed("a").await.values().sum::<u32>() == 2
    })
    .await;

    c.cli(&["drain", "h1"]);
    eventually(Duration::from_secs(10), "h1 drained", || async {
        let p = c.placed("a").await;
        p.get("h2") == Some(&2) && !p.contains_key("h1")
    })
    .await;
    c.cli(&["drain", "h1", "--cancel"]);

    // A new queue type published to the running cluster gets slots without a restart.
    let text = std::fs::read_to_string(&c.config).unwrap()
        + "\n[queues.b]\nhandler = \"sleep\"\nmin_slots = 1\n";
    std::fs::write(&c.config, text).unwrap();
    let out = c.cli(&["config", "apply"]);
    assert!(out.contains("version 1"), "{out}");
    eventually(Duration::from_secs(15), "b placed and running", || async {
        let stats: serde_json::Value = serde_json::from_str(&c.cli(&["stats", "--json"])).unwrap();
        stats["queues"]["b"]["slots"] == 1
    })
    .await;
    let stats = poll_some(
        Duration::from_secs(10),
        "the manager's load figures",
        || async {
            let stats: serde_json::Value =
                serde_json::from_str(&c.cli(&["stats", "--json"])).unwrap();
            stats["queues"]["a"]["load"].is_number().then_some(stats)
        },
    )
    .await;
    assert!(stats["manager"]["epoch"].as_u64() >= Some(1), "{stats}");
    assert_eq!(stats["queues"]["b"]["wanted"], 1, "{stats}");

    // A new tick published: the manager's leadership lease follows it (three ticks, at
    // least 3 s: 200ms kept it at 3 s, 5s makes it 15 s), and it is renewed before the
    // old one runs out (a first new tick 5 s away would have let it lapse: a new epoch).
    let lease = Keys::new("test").lease();
    let holder = || async {
        let v: Option<String> = redis::cmd("GET")
            .arg(&lease)
            .query_async(&mut c.client.connection())
            .await
            .unwrap();
        v
    };
    let before = holder().await;
    assert!(before.is_some());
    let text = std::fs::read_to_string(&c.config)
        .unwrap()
        .replace("tick = \"200ms\"", "tick = \"5s\"");
    std::fs::write(&c.config, text).unwrap();
    let out = c.cli(&["config", "apply"]);
    assert!(out.contains("version 2"), "{out}");
    eventually(
        Duration::from_secs(15),
        "the lease lasts three of the new ticks",
        || async {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&lease)
                .query_async(&mut c.client.connection())
                .await
                .unwrap();
            ttl > 6000
        },
    )
    .await;
    assert_eq!(holder().await, before, "the lease lapsed: a new epoch");
}

/// The value of the sample `series` (name and labels exactly as the scrape prints them).
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn the_lateness_rises_while_a_queue_is_paused_and_falls_after_resume() {
    let mut c = Cluster::start("[queues.a]\nhandler = \"noop\"\nmin_slots = 1\n").await;
    let (_, manager_http) = c.manager_http(1);
    let (_, master_http) = c.master("h1");
    c.cli(&["pause", "a"]);
    eventually(Duration::from_secs(10), "a paused", || async {
        c.placed("a").await.is_empty() && c.map().await.is_some()
    })
    .await;
    let q = c.client.queue("a").unwrap();
    let tasks: Vec<_> = (0..5)
        .map(|i| gaffer::queue_client::NewTask::new(format!("{i}")))
        .collect();
    q.enqueue_many(&tasks).await.unwrap();
    let enqueued = Instant::now();

    // Paused with due tasks: late, and later by each read; the manager's gauge says so.
    let late = |c: &Cluster| {
        let stats: serde_json::Value = serde_json::from_str(&c.cli(&["stats", "--json"])).unwrap();
        stats["queues"]["a"]["oldest_due_age_ms"].as_u64().unwrap()
    };
    let first = poll_some(Duration::from_secs(10), "a late by a second", || async {
        Some(late(&c)).filter(|&l| l >= 1000)
    })
    .await;
    let second = poll_some(Duration::from_secs(10), "a later still", || async {
        Some(late(&c)).filter(|&l| l > first)
    })
    .await;
    assert!(
        second <= enqueued.elapsed().as_millis() as u64 + 100,
        "{second}"
    );
    let gauge = poll_some(Duration::from_secs(10), "the lateness gauge", || async {
        let scrape = http_get(manager_http, "/metrics").unwrap_or_default();
        sample(&scrape, "gaffer_queue_oldest_due_age_seconds{queue=\"a\"}").filter(|&v| v >= 1.5)
    })
    .await;
    assert!(gauge < 60.0, "{gauge}");
    let text = c.cli(&["stats"]);
    assert!(text.contains(" late "), "{text}");

    // Resumed: the tasks run, and the queue is not late any more.
    c.cli(&["resume", "a"]);
    eventually(Duration::from_secs(20), "a done and on time", || async {
        let s = q.stats().await.unwrap();
        s.acked_total == 5 && s.oldest_due_age_ms == 0
    })
    .await;
    assert_eq!(late(&c), 0);
    // Each task waited from its enqueue through the pause: the master's histogram has all
    // five, none of them in a bucket under a second.
    let scrape = poll_some(Duration::from_secs(10), "the start delays", || async {
        let scrape = http_get(master_http, "/metrics").unwrap_or_default();
        (sample(
            &scrape,
            "gaffer_task_start_delay_seconds_count{queue=\"a\"}",
        ) == Some(5.0))
        .then_some(scrape)
    })
    .await;
    assert_eq!(
        sample(
            &scrape,
            "gaffer_task_start_delay_seconds_bucket{queue=\"a\",le=\"1\"}"
        ),
        Some(0.0),
        "{scrape}"
    );
    let sum = sample(&scrape, "gaffer_task_start_delay_seconds_sum{queue=\"a\"}").unwrap();
    assert!(sum >= 5.0 * (second as f64 / 1000.0), "{sum}");
}
