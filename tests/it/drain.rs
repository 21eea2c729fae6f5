//! Stopping while Redis is gone: a master asked to stop during an outage exits within
//! `drain_timeout` plus a little, and leaves no slot behind.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gaffer::redis_server::free_port;
use serde_json::Value;

use crate::harness::{ANY_LOAD, TestRedis, poll_some};
use crate::host::{gone, http_get, publish, slots};

/// The master's drain timeout in these tests.
const DRAIN: Duration = Duration::from_secs(5);
/// What a stop may take beyond the drain timeout: the last kill, the zygote's reaping,
/// deregistering (given up on while Redis is down).
const GRACE: Duration = Duration::from_secs(4);

/// A master process killed on drop, its log in a temp dir.
struct Master {
    child: Child,
    http: u16,
    dir: tempfile::TempDir,
}

impl Master {
    fn start(redis: &TestRedis, queues: &str) -> Master {
        let dir = tempfile::tempdir().unwrap();
        let http = free_port().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n\
                 [master]\nhttp = \"127.0.0.1:{http}\"\ndrain_timeout = \"{}s\"\n\
                 memory_reserve = \"64MiB\"\n\n{queues}",
                redis.url(),
                DRAIN.as_secs()
            ),
        )
        .unwrap();
        let child = gaffer_master(&config, &dir.path().join("master.log"));
        Master { child, http, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("master.log")).unwrap_or_default()
    }

    fn status(&self) -> Option<Value> {
        http_get(self.http, "/status").and_then(|b| serde_json::from_str(&b).ok())
    }

    /// The pids of its slots once `n` of them are in `state`.
    async fn slot_pids_when(&self, n: usize, state: &str) -> Vec<u32> {
        poll_some(
            Duration::from_secs(30),
            &format!("{n} slots {state}"),
            || async {
                let s = self.status()?;
                let pids: Vec<u32> = slots(&s)
                    .iter()
                    .filter(|s| s["state"] == state)
                    .filter_map(|s| s["pid"].as_u64().map(|p| p as u32))
                    .collect();
                (pids.len() >= n).then_some(pids)
            },
        )
        .await
    }

    /// SIGTERM, then the time until the process exited (fails past `limit`).
    async fn stop_within(&mut self, limit: Duration) -> Duration {
        let asked = Instant::now();
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = poll_some(limit, "the master to exit", || {
            std::future::ready(self.child.try_wait().unwrap())
        })
        .await;
        assert!(
            status.success(),
            "master exited with {status}\n{}",
            self.log()
        );
        let took = asked.elapsed();
        eprintln!("the master stopped {took:?} after SIGTERM");
        took
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gaffer_master(config: &Path, log: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(config)
        .args(["master", "--host", "h1"])
        .env("GAFFER_LOG", "info")
        .env(ANY_LOAD.0, ANY_LOAD.1)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Every process whose parent is `pid`, from /proc.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.split_whitespace().nth(1)?.to_string();
                    rest.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// The issue's case: four idle slots, Redis stopped, then SIGTERM. The slots used to log
/// that they were exiting and stay alive for up to a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_slots_stop_within_the_drain_timeout_while_redis_is_down() {
    let mut redis = TestRedis::start();
    let client = redis.client().await;
    publish(&client, 1, &[("w", 4)]).await;
    let mut m = Master::start(&redis, "[queues.w]\nhandler = \"noop\"\n");
    let pids = m.slot_pids_when(4, "idle").await;
    let zygotes = children_of(m.child.id());
    redis.server.kill();
    poll_some(
        Duration::from_secs(20),
        "the master to see the outage",
        || std::future::ready(m.log().contains("redis unreachable").then_some(())),
    )
    .await;
    let took = m.stop_within(DRAIN + GRACE + Duration::from_secs(30)).await;
    let left: Vec<u32> = pids
        .iter()
        .chain(&zygotes)
        .copied()
        .filter(|&p| !gone(p))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}\n{}", m.log());
    assert!(
        took <= DRAIN + GRACE,
        "the master took {took:?} to stop\n{}",
        m.log()
    );
}

/// Redis frozen (SIGSTOP) rather than gone: every call waits out its response timeout
/// instead of failing at once. Slots in the middle of a long batch cannot finish it; the
/// master gives them the drain timeout, kills them, and exits without waiting on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_slots_are_killed_at_the_drain_timeout_while_redis_is_frozen() {
    let redis = TestRedis::start();
    let client = redis.client().await;
    publish(&client, 1, &[("s", 2)]).await;
    let q = client.queue("s").unwrap();
    let long = gaffer::queue_client::NewTask::new(r#"{"ms":3600000}"#);
    q.enqueue_many(&[long.clone(), long]).await.unwrap();
    let mut m = Master::start(&redis, "[queues.s]\nhandler = \"sleep\"\nbatch_size = 1\n");
    let pids = m.slot_pids_when(2, "busy").await;
    let zygotes = children_of(m.child.id());
    let freeze = nix::sys::signal::Signal::SIGSTOP;
    redis.server.signal(freeze).unwrap();
    let took = m.stop_within(DRAIN + GRACE + Duration::from_secs(60)).await;
    redis
        .server
        .signal(nix::sys::signal::Signal::SIGCONT)
        .unwrap();
    let left: Vec<u32> = pids
        .iter()
        .chain(&zygotes)
        .copied()
        .filter(|&p| !gone(p))
        .collect();
    assert!(left.is_empty(), "left running: {left:?}\n{}", m.log());
    assert!(
        took >= DRAIN && took <= DRAIN + GRACE,
        "the master took {took:?} to stop (drain timeout {DRAIN:?})\n{}",
        m.log()
    );
    assert!(m.log().contains("slot did not stop in time"), "{}", m.log());
}

/// `gaffer up` on a Redis it did not start, which freezes (every call waits out its
/// response timeout, the worst an outage does to a stop): Ctrl-C still stops the api,
/// drains the master, stops the manager, and leaves no process, within the drain timeout
/// and a few seconds per role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_stops_on_ctrl_c_while_its_redis_is_frozen() {
    let redis = TestRedis::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nredis = \"{}\"\nnamespace = \"test\"\n\n[manager]\ntick = \"200ms\"\n\n\
             [master]\ndrain_timeout = \"{}s\"\nmemory_reserve = \"64MiB\"\n\n\
             [queues.w]\nhandler = \"noop\"\nmin_slots = 2\n",
            redis.url(),
            DRAIN.as_secs()
        ),
    )
    .unwrap();
    let port = || format!("127.0.0.1:{}", free_port().unwrap());
    let master_http = free_port().unwrap();
    let log = dir.path().join("up.log");
    let mut up = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&config)
        .args(["up", "--demo-load"])
        .env("GAFFER_STATE_DIR", dir.path().join("state"))
        .env("GAFFER_MANAGER_HTTP", port())
        .env("GAFFER_MASTER_HTTP", format!("127.0.0.1:{master_http}"))
        .env("GAFFER_API_LISTEN", port())
        .env("GAFFER_LOG", "info")
        .env(ANY_LOAD.0, ANY_LOAD.1)
        .env_remove("GAFFER_REDIS")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let tree = poll_some(Duration::from_secs(30), "two slots under up", || {
        let running = http_get(master_http, "/status")
            .and_then(|b| serde_json::from_str::<Value>(&b).ok())
            .is_some_and(|s| slots(&s).iter().filter(|s| s["state"] == "idle").count() >= 2);
        std::future::ready(running.then(|| descendants(up.id())))
    })
    .await;
    redis
        .server
        .signal(nix::sys::signal::Signal::SIGSTOP)
        .unwrap();
    let asked = Instant::now();
    let pid = nix::unistd::Pid::from_raw(up.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let limit = DRAIN + 3 * GRACE;
    let status = poll_some(limit + Duration::from_secs(60), "up to exit", || {
        std::future::ready(up.try_wait().unwrap())
    })
    .await;
    let took = asked.elapsed();
    eprintln!("gaffer up stopped {took:?} after Ctrl-C");
    redis
        .server
        .signal(nix::sys::signal::Signal::SIGCONT)
        .unwrap();
    let _ = up.kill();
    assert!(status.success(), "up exited with {status}\n{}", read_log());
    let left: Vec<u32> = tree.iter().copied().filter(|&p| !gone(p)).collect();
    assert!(left.is_empty(), "left running: {left:?}\n{}", read_log());
    assert!(took <= limit, "up took {took:?} to stop\n{}", read_log());
}

/// Every process descended from `root` (children, their children, …), from /proc.
fn descendants(root: u32) -> Vec<u32> {
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let kids = children_of(found[i]);
        found.extend(kids);
        i += 1;
    }
    found.split_off(1)
}
