//! Redis outages the fault suite (`scripts/chaos`) found mishandled, each pinned down
//! with a real redis-server.

use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use gaffer::config::{Handler as HandlerConfig, QueueConfig};
use gaffer::queue_client::{ConnectOptions, NewTask, QueueClient};
use gaffer::redis_server::RedisServerOptions;
use gaffer::slot::{
    EXIT_STOPPED, Handler, HandlerError, Outcome, SlotContext, SlotEvent, Task, run_slot,
};
use tokio_util::sync::CancellationToken;

use crate::harness::{ANY_LOAD, TestRedis, eventually, poll_some};
use gaffer::cluster::{self, Keys};
use gaffer::redis_server::{RedisServer, free_port};

/// Whether the server on `port` answers PING with LOADING (it is reading its AOF).
fn loading(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 64];
    s.write_all(b"PING\r\n").is_ok()
        && matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"-LOADING"))
}

/// Whether a batch may be finished.
type Ready = dyn Fn(&[Task]) -> bool + Send;

/// Finishes a batch once `ready(batch)` holds (looked at every 5 ms, for at most 30 s),
/// counting the tasks it was handed.
struct DoneWhen {
    ready: Box<Ready>,
    handled: Arc<AtomicU32>,
}

impl Handler for DoneWhen {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        unreachable!("built by the test")
    }

    fn handle(&mut self, _: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        self.handled.fetch_add(batch.len() as u32, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(self.ready)(batch) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        vec![Outcome::done(); batch.len()]
    }
}

/// A restarted Redis answers LOADING while it replays its AOF. The slot took that for a
/// permanent error: it gave its settle up (the task ran again once the lease expired) and
/// exited fatally on its next take. Both must wait and retry instead.
/// Runs slot 1 of `queue` in a thread, as a master would fork it; cancel the token to
/// stop it.
fn start_slot<H: Handler + Send + 'static>(
    redis: &TestRedis,
    queue: QueueConfig,
    handler: H,
) -> (CancellationToken, std::thread::JoinHandle<i32>) {
    let (stop, slot, _events) = start_slot_reporting(redis, queue, handler);
    (stop, slot)
}

/// [`start_slot`], also handing back the master's end of the slot's report socket (the
/// slot's thread keeps one too, so it lives as long as the slot).
fn start_slot_reporting<H: Handler + Send + 'static>(
    redis: &TestRedis,
    queue: QueueConfig,
    handler: H,
) -> (
    CancellationToken,
    std::thread::JoinHandle<i32>,
    UnixDatagram,
) {
    let (report, events) = UnixDatagram::pair().unwrap();
    let ours = events.try_clone().unwrap();
    let spec = crate::harness::slot_spec(redis, queue, 1, report);
    let stop = CancellationToken::new();
    let token = stop.clone();
    (
        stop,
        std::thread::spawn(move || {
            let _events = events;
            run_slot(spec, Box::new(handler), Some(token))
        }),
        ours,
    )
}

#[tokio::test]
async fn a_slot_rides_out_a_redis_loading_its_aof() {
    // 1 ms per key replayed: a couple of seconds of LOADING after a restart.
    let mut redis = TestRedis::with(RedisServerOptions {
        appendonly: true,
        extra: vec![("key-load-delay".into(), "1000".into())],
        ..RedisServerOptions::default()
    });
    let client = redis.client().await;
    let () = redis::cmd("EVAL")
        .arg("for i = 1, 2000 do redis.call('SET', 'pad:' .. i, i) end")
        .arg(0)
        .query_async(&mut client.connection())
        .await
        .unwrap();
    let q = client.queue("load").unwrap();
    let mut cfg = QueueConfig::new("load", HandlerConfig::named(HandlerConfig::NOOP));
    cfg.batch_size = 1;
    // Far longer than the test: an expired lease cannot stand in for a settle.
    cfg.lease = Duration::from_secs(120);
    q.enqueue(NewTask::new("during-load")).await.unwrap();

    let handled = Arc::new(AtomicU32::new(0));
    // A task whose payload is `during-load` finishes only once Redis answers LOADING, so
    // its settle reaches a server that is still reading its AOF.
    let port = redis.server.port();
    let handler = DoneWhen {
        ready: Box::new(move |batch| {
            !batch.iter().any(|t| t.payload == b"during-load") || loading(port)
        }),
        handled: handled.clone(),
    };
    let (stop, slot) = start_slot(&redis, cfg, handler);
    eventually(Duration::from_secs(20), "the task handed out", || async {
        q.stats().await.unwrap().leased == 1
    })
    .await;
    // Blocks this thread until the AOF is replayed; the slot settles meanwhile.
    redis.server.restart().unwrap();
    eventually(Duration::from_secs(20), "the task acked", || async {
        q.stats().await.is_ok_and(|s| s.acked_total == 1)
    })
    .await;
    assert!(!slot.is_finished(), "the slot exited on LOADING");
    q.enqueue(NewTask::new("after")).await.unwrap();
    eventually(Duration::from_secs(20), "a later task acked", || async {
        q.stats().await.unwrap().acked_total == 2
    })
    .await;
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.expired_total, stats.stale_total),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(handled.load(Ordering::SeqCst), 2, "each task ran once");
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
}

/// Redis gone for longer than the lease: the slot used to give its settle up when the
/// lease ran out locally, so the task ran a second time once Redis was back, although no
/// other taker had reclaimed it and the late settle would have been taken.
#[tokio::test]
async fn a_settle_outlives_an_outage_longer_than_the_lease() {
    let mut redis = TestRedis::with_aof();
    let client = redis.client().await;
    let q = client.queue("outage").unwrap();
    let mut cfg = QueueConfig::new("outage", HandlerConfig::named(HandlerConfig::NOOP));
    cfg.batch_size = 1;
    cfg.lease = Duration::from_secs(2);
    q.enqueue(NewTask::new("x")).await.unwrap();

    let release = Arc::new(AtomicBool::new(false));
    let handled = Arc::new(AtomicU32::new(0));
    let handler = DoneWhen {
        ready: {
            let release = release.clone();
            Box::new(move |_| release.load(Ordering::SeqCst))
        },
        handled: handled.clone(),
    };
    let (stop, slot, events) = start_slot_reporting(&redis, cfg.clone(), handler);
    eventually(Duration::from_secs(20), "the task handed out", || async {
        q.stats().await.unwrap().leased == 1
    })
    .await;
    redis.server.kill();
    let down = Instant::now();
    release.store(true, Ordering::SeqCst);
    // Not a synchronisation: the outage must outlast the lease, whatever the slot does.
    tokio::time::sleep((cfg.lease + Duration::from_secs(1)).saturating_sub(down.elapsed())).await;
    // Meanwhile the slot, retrying its settle, told its master it is not hung (its
    // watchdog kills a slot silent past max_batch_time, and the task would run again).
    events.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let mut progress = 0;
    while let Ok(n) = events.recv(&mut buf) {
        let ev: SlotEvent = serde_json::from_slice(&buf[..n]).unwrap();
        progress += usize::from(matches!(ev, SlotEvent::Progress { .. }));
    }
    assert!(
        progress >= 2,
        "progress reports during the outage: {progress}"
    );
    redis.server.restart().unwrap();
    eventually(Duration::from_secs(20), "the task acked", || async {
        q.stats().await.is_ok_and(|s| s.acked_total == 1)
    })
    .await;
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.expired_total, stats.stale_total, stats.leased),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(handled.load(Ordering::SeqCst), 1, "the task ran once");
    stop.cancel();
    assert_eq!(slot.join().unwrap(), EXIT_STOPPED);
}

// (daemon processes, killed on drop)
use crate::harness::Killed as Daemons;

/// A host that boots while Redis is down (or a pacemaker start during an outage) used to
/// see its master or manager exit at once on the refused connection. They must wait for
/// Redis, come up when it does, and still stop cleanly on SIGTERM meanwhile.
#[tokio::test]
async fn daemons_started_before_redis_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nredis = \"redis://127.0.0.1:{port}/0\"\nnamespace = \"test\"\n\n\
             [manager]\ntick = \"200ms\"\n\n[queues.a]\nhandler = \"noop\"\nmin_slots = 1\n"
        ),
    )
    .unwrap();
    let log = |name: &str| dir.path().join(name);
    let start =
        |args: &[&str], env: (&str, String), name: &str| daemon(&config, args, env, &log(name));
    let http = |()| format!("127.0.0.1:{}", free_port().unwrap());
    let mut d = Daemons(vec![
        start(
            &["manager"],
            ("GAFFER_MANAGER_HTTP", http(())),
            "manager.log",
        ),
        start(
            &["master", "--host", "h1"],
            ("GAFFER_MASTER_HTTP", http(())),
            "h1.log",
        ),
        start(
            &["master", "--host", "h2"],
            ("GAFFER_MASTER_HTTP", http(())),
            "h2.log",
        ),
    ]);
    let read = |name: &str| std::fs::read_to_string(log(name)).unwrap_or_default();
    for name in ["manager.log", "h1.log", "h2.log"] {
        eventually(
            Duration::from_secs(20),
            &format!("{name}: waiting"),
            || async { read(name).contains("waiting for it") },
        )
        .await;
    }
    for (i, c) in d.0.iter_mut().enumerate() {
        assert!(c.try_wait().unwrap().is_none(), "daemon {i} exited");
    }

    // Stopped while waiting: a clean exit.
    let h2 = d.0.pop().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(h2.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = h2.wait_with_output().unwrap();
    assert!(out.status.success(), "{}\n{}", out.status, read("h2.log"));

    let _redis = RedisServer::start(
        &dir.path().join("redis"),
        RedisServerOptions {
            port: Some(port),
            ..RedisServerOptions::default()
        },
    )
    .unwrap();
    let client = gaffer::queue_client::QueueClient::connect(
        &format!("redis://127.0.0.1:{port}/0"),
        "test",
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    let keys = Keys::new("test");
    eventually(
        Duration::from_secs(30),
        "h1 registered and placed by the manager",
        || async {
            let map = cluster::read_map(&mut client.connection(), &keys)
                .await
                .unwrap();
            map.is_some_and(|m| m.for_host("h1").get("a") == Some(&1))
        },
    )
    .await;
    for (i, c) in d.0.iter_mut().enumerate() {
        assert!(c.try_wait().unwrap().is_none(), "daemon {i} exited");
    }
}

/// A Redis outage longer than the heartbeat timeout: no master could report meanwhile, so
/// every host looked dead to the manager when Redis came back. It emptied the map, then
/// refilled it a tick later, and every slot of the cluster was stopped and restarted.
#[tokio::test]
async fn an_outage_longer_than_the_heartbeat_timeout_moves_no_slot() {
    outage_moves_no_slot().await;
}

/// Slots of queue `a` on host `h1` in the current map; `None` without a map (or Redis).
async fn slots_of_a_on_h1(client: &QueueClient, keys: &Keys) -> Option<u32> {
    cluster::read_map(&mut client.connection(), keys)
        .await
        .ok()
        .flatten()
        .map(|m| m.for_host("h1").get("a").copied().unwrap_or(0))
}

/// A config in `dir` for a manager that ticks every 200 ms and judges heartbeats after 2 s,
/// with one queue `a` of at least two slots.
fn quick_manager_config(dir: &std::path::Path, redis_url: &str) -> std::path::PathBuf {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nredis = \"{redis_url}\"\nnamespace = \"test\"\n\n\
             [manager]\ntick = \"200ms\"\nheartbeat_timeout = \"2s\"\n\n\
             [queues.a]\nhandler = \"noop\"\nmin_slots = 2\n"
        ),
    )
    .unwrap();
    config
}

/// `gaffer --config CONFIG ARGS` as a daemon with one more variable in its environment,
/// logging at info into `log`.
fn daemon(
    config: &std::path::Path,
    args: &[&str],
    env: (&str, String),
    log: &std::path::Path,
) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env(env.0, env.1)
        .env("GAFFER_LOG", "info")
        .env(ANY_LOAD.0, ANY_LOAD.1)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Runs a manager and a master with two slots, kills Redis for 4 s and restarts it from
/// its AOF, and checks that the map and the slots stay put.
async fn outage_moves_no_slot() {
    let mut redis = TestRedis::with_aof();
    let dir = tempfile::tempdir().unwrap();
    let config = quick_manager_config(dir.path(), &redis.url());
    let master_http = free_port().unwrap();
    let start = |args: &[&str], env: (&str, String), name: &str| {
        daemon(&config, args, env, &dir.path().join(name))
    };
    let _d = Daemons(vec![
        start(
            &["manager"],
            (
                "GAFFER_MANAGER_HTTP",
                format!("127.0.0.1:{}", free_port().unwrap()),
            ),
            "manager.log",
        ),
        start(
            &["master", "--host", "h1"],
            ("GAFFER_MASTER_HTTP", format!("127.0.0.1:{master_http}")),
            "h1.log",
        ),
    ]);
    let slot_pids = || -> Vec<u64> {
        crate::host::http_get(master_http, "/status")
            .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
            .map(|s| {
                let mut pids: Vec<u64> = s["slots"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|x| x["pid"].as_u64()).collect())
                    .unwrap_or_default();
                pids.sort_unstable();
                pids
            })
            .unwrap_or_default()
    };
    let client = redis.client().await;
    let keys = Keys::new("test");
    let placed = || slots_of_a_on_h1(&client, &keys);
    eventually(
        Duration::from_secs(30),
        "two slots placed and running",
        || async { placed().await == Some(2) && slot_pids().len() == 2 },
    )
    .await;
    let before = slot_pids();

    // Not a synchronisation: the outage must outlast the heartbeat timeout (2 s) and the
    // manager's lease (3 s).
    redis.server.kill();
    tokio::time::sleep(Duration::from_secs(4)).await;
    redis.server.restart().unwrap();

    // Watch the map from the moment Redis is back until the manager has decided a few
    // times on fresh reports.
    let watch = Instant::now();
    let mut seen = Vec::new();
    while watch.elapsed() < Duration::from_secs(4) {
        if let Some(n) = placed().await {
            seen.push(n);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !seen.is_empty(),
        "the map could not be read after the restart"
    );
    assert!(
        seen.iter().all(|&n| n == 2),
        "h1's slots in the maps seen: {seen:?}"
    );
    assert_eq!(slot_pids(), before, "slots were restarted");

    // The outage is logged as a spell: one warning when it starts, one line when it ends,
    // not a warning per failed call (a call or four per tick for 4 s).
    for log in ["manager.log", "h1.log"] {
        let path = dir.path().join(log);
        let text = poll_some(
            Duration::from_secs(10),
            "the end of the spell logged",
            || {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                std::future::ready(text.contains("redis answers again").then_some(text))
            },
        )
        .await;
        let warnings: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") && !l.contains("slot="))
            .collect();
        let spells = warnings
            .iter()
            .filter(|l| l.contains("redis unreachable, further failures are logged at debug"))
            .count();
        assert!(
            (1..=2).contains(&spells) && warnings.len() <= 3,
            "{log}: warnings over a 4 s outage:\n{}",
            warnings.join("\n")
        );
    }
}

/// The same with Redis frozen (SIGSTOP) rather than killed: the manager's call waits and
/// then succeeds, so no call fails, yet every report is as old as the freeze. (The host
/// here is a report the test writes, so it can stay silent for a moment after the freeze,
/// as a master whose tick comes late would.)
#[tokio::test]
async fn a_freeze_longer_than_the_heartbeat_timeout_moves_no_slot() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let config = quick_manager_config(dir.path(), &redis.url());
    let _d = Daemons(vec![daemon(
        &config,
        &["manager"],
        (
            "GAFFER_MANAGER_HTTP",
            format!("127.0.0.1:{}", free_port().unwrap()),
        ),
        &dir.path().join("manager.log"),
    )]);
    let client = redis.client().await;
    let keys = Keys::new("test");
    let beating = Arc::new(AtomicBool::new(true));
    let heart = {
        let (client, keys, beating) = (client.clone(), keys.clone(), beating.clone());
        tokio::spawn(async move {
            loop {
                if beating.load(Ordering::SeqCst) {
                    let report = cluster::HostReport {
                        host: "h1".into(),
                        ts_ms: cluster::now_ms(),
                        capacity: 10,
                        handlers: vec!["noop".into()],
                        ..Default::default()
                    };
                    let _ = cluster::publish_host(&mut client.connection(), &keys, &report).await;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let placed = || slots_of_a_on_h1(&client, &keys);
    eventually(
        Duration::from_secs(30),
        "two slots placed on h1",
        || async { placed().await == Some(2) },
    )
    .await;

    beating.store(false, Ordering::SeqCst);
    redis
        .server
        .signal(nix::sys::signal::Signal::SIGSTOP)
        .unwrap();
    // Not a synchronisation: the freeze must outlast the heartbeat timeout (2 s) and the
    // manager's lease (3 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    redis
        .server
        .signal(nix::sys::signal::Signal::SIGCONT)
        .unwrap();
    let resumed = Instant::now();
    let mut seen = Vec::new();
    while resumed.elapsed() < Duration::from_secs(3) {
        // The host reports again a quarter of a heartbeat timeout after the freeze.
        if resumed.elapsed() > Duration::from_millis(500) {
            beating.store(true, Ordering::SeqCst);
        }
        if let Some(n) = placed().await {
            seen.push(n);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    heart.abort();
    assert!(
        !seen.is_empty(),
        "the map could not be read after the freeze"
    );
    assert!(
        seen.iter().all(|&n| n == 2),
        "h1's slots in the maps seen: {seen:?}"
    );
}
