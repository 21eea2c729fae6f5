//! The host side end to end: a real `gaffer master` process, its re-executed zygote and
//! forked slots, real /proc readings, against a throwaway redis-server.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gaffer::cluster::{self, Keys, SlotMap};
use gaffer::queue_client::{NewTask, Queue, QueueClient};
use gaffer::redis_server::free_port;
use serde_json::Value;

use crate::harness::{ANY_LOAD, TestRedis, eventually, poll_some};

const HOST: &str = "h1";

/// A master process under test, killed on drop (its zygote and slots follow it).
pub struct TestMaster {
    pub redis: TestRedis,
    pub child: Child,
    pub http: u16,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub client: QueueClient,
}

/// The `[master]` and `[cluster]` tables plus the given queue tables.
fn config_text(redis: &str, http: u16, queues: &str) -> String {
    format!(
        "[cluster]\nredis = \"{redis}\"\nnamespace = \"test\"\n\n\
         [master]\nhttp = \"127.0.0.1:{http}\"\ndrain_timeout = \"10s\"\n\
         memory_reserve = \"64MiB\"\n\n{queues}"
    )
}

impl TestMaster {
    /// Starts redis and a master serving `queues` (TOML tables), following `map`
    /// (queue → slots on this host).
    pub async fn start(queues: &str, map: &[(&str, u32)]) -> Self {
        Self::start_with(Path::new(env!("CARGO_BIN_EXE_gaffer")), queues, map).await
    }

    /// Like [`start`](Self::start), with another gaffer binary (a team's own).
    pub async fn start_with(bin: &Path, queues: &str, map: &[(&str, u32)]) -> Self {
        Self::start_env(bin, queues, map, &[]).await
    }

    /// Like [`start_with`](Self::start_with), with extra environment for the master.
    pub async fn start_env(
        bin: &Path,
        queues: &str,
        map: &[(&str, u32)],
        env: &[(&str, String)],
    ) -> Self {
        let redis = TestRedis::start();
        let dir = tempfile::tempdir().unwrap();
        let http = free_port().unwrap();
        let config = dir.path().join("config.toml");
        std::fs::write(&config, config_text(&redis.url(), http, queues)).unwrap();
        let client = redis.client().await;
        publish(&client, 1, map).await;
        let log = std::fs::File::create(dir.path().join("master.log")).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .args(["master", "--host", HOST])
            .env("GAFFER_LOG", "info")
            .env(ANY_LOAD.0, ANY_LOAD.1)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let m = TestMaster {
            redis,
            child,
            http,
            dir,
            config,
            client,
        };
        let want: u32 = map.iter().map(|(_, n)| n).sum();
        m.wait_status("slots to start", Duration::from_secs(20), |s| {
            slots(s).iter().filter(|s| s["state"] == "idle").count() as u32 >= want
        })
        .await;
        m
    }

    /// `gaffer stats --json` against this master's config.
    pub fn stats_json(&self) -> Value {
        serde_json::from_str(&self.gaffer(&["stats", "--json"])).unwrap()
    }

    /// `gaffer ARGS` against this master's config; its stdout (it must succeed).
    pub fn gaffer(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("master.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn queue(&self, name: &str) -> Queue {
        self.client.queue(name).unwrap()
    }

    /// `GET /status`, or None while the master does not answer.
    pub fn status(&self) -> Option<Value> {
        http_get(self.http, "/status").and_then(|b| serde_json::from_str(&b).ok())
    }

    /// Polls `/status` until `cond` holds; returns that status.
    pub async fn wait_status(
        &self,
        what: &str,
        limit: Duration,
        mut cond: impl FnMut(&Value) -> bool,
    ) -> Value {
        let log = || self.log();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.status()
                && s.get("slots").is_some()
                && cond(&s)
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for: {what}\nstatus: {:?}\nlog:\n{}",
                self.status(),
                log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for TestMaster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a slot map giving this host `map`.
pub async fn publish(client: &QueueClient, version: u64, map: &[(&str, u32)]) {
    let mut hosts = BTreeMap::new();
    hosts.insert(
        HOST.to_string(),
        map.iter().map(|(q, n)| (q.to_string(), *n)).collect(),
    );
    let map = SlotMap {
        epoch: 1,
        version,
        hosts,
    };
    cluster::write_map_unfenced(&mut client.connection(), &Keys::new("test"), &map)
        .await
        .unwrap();
}

pub fn slots(status: &Value) -> Vec<Value> {
    status["slots"].as_array().cloned().unwrap_or_default()
}

pub(crate) fn queue_report(status: &Value, queue: &str, key: &str) -> u64 {
    status["host"]["queues"][queue][key].as_u64().unwrap_or(0)
}

pub(crate) fn slot_pids(status: &Value) -> Vec<u32> {
    slots(status)
        .iter()
        .filter_map(|s| s["pid"].as_u64().map(|p| p as u32))
        .collect()
}

/// A minimal HTTP/1.0 GET: enough for our own endpoint, no client dependency.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_string())
}

/// Every process's parent, from `/proc/*/stat` (read here, apart from the code under test).
pub(crate) fn parents() -> BTreeMap<u32, u32> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid …": comm may hold spaces and parentheses.
        if let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
        {
            out.insert(pid, ppid);
        }
    }
    out
}

/// `root` and every process under it.
pub(crate) fn process_tree(root: u32) -> Vec<u32> {
    let parents = parents();
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parents.iter().filter(|&(_, &pp)| pp == p).map(|(&c, _)| c));
        i += 1;
    }
    out
}

/// Whether a process is gone (or a zombie, which no longer runs anything).
pub fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// The scheduling policy (`SCHED_*`) of each thread of process `pid`, from
/// `/proc/PID/task/*/stat` (its 41st field).
pub(crate) fn thread_policies(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (_, rest) = stat.rsplit_once(')').unwrap();
        out.push(rest.split_whitespace().nth(38).unwrap().parse().unwrap());
    }
    out
}

pub(crate) fn pss(pid: u32) -> u64 {
    gaffer::master::sysinfo::pss(pid).unwrap_or(0)
}

pub(crate) fn kill(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

pub(crate) async fn enqueue(q: &Queue, payloads: impl IntoIterator<Item = String>) -> Vec<String> {
    let tasks: Vec<NewTask> = payloads.into_iter().map(NewTask::new).collect();
    q.enqueue_many(&tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

pub(crate) async fn wait_acked(q: &Queue, n: u64, limit: Duration) {
    eventually(
        limit,
        &format!("{n} tasks acked on {}", q.name()),
        || async { q.stats().await.unwrap().acked_total >= n },
    )
    .await;
}

#[tokio::test]
async fn preloaded_data_is_shared_by_slots() {
    let m = TestMaster::start(
        "[queues.lookup]\nhandler = \"preload_demo\"\npreload = \"256MiB\"\nbatch_size = 1\n",
        &[("lookup", 8)],
    )
    .await;
    let q = m.queue("lookup");
    // Every slot must read all of the data at least once.
    let status = loop {
        enqueue(&q, (0..8).map(|i| format!("{{\"n\":{i}}}"))).await;
        let s = m
            .wait_status("a round of lookups", Duration::from_secs(60), |s| {
                slots(s).iter().all(|s| s["state"] == "idle")
            })
            .await;
        if slots(&s).iter().all(|s| s["batches"].as_u64() >= Some(1)) {
            break s;
        }
    };
    let mut pids = vec![m.pid()];
    pids.extend(
        status["zygote_pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as u32),
    );
    pids.extend(slot_pids(&status));
    assert_eq!(pids.len(), 10, "master, zygote, 8 slots: {status}");
    let total: u64 = pids.iter().map(|&p| pss(p)).sum();
    let preload = 256u64 << 20;
    assert!(
        total < preload * 3 / 2,
        "Σ PSS {} MiB over master, zygote and 8 slots is not under 1.5 × 256 MiB",
        total >> 20
    );
}

#[tokio::test]
async fn memhog_slot_recycles_and_loses_nothing() {
    let m = TestMaster::start(
        "[queues.hog]\nhandler = \"memhog\"\ngrow_per_task = \"4MiB\"\n\
         private_dirty_limit = \"24MiB\"\nbatch_size = 2\n",
        &[("hog", 1)],
    )
    .await;
    let q = m.queue("hog");
    enqueue(&q, (0..40).map(|i| format!("{{\"n\":{i}}}"))).await;
    wait_acked(&q, 40, Duration::from_secs(60)).await;
    let s = m
        .wait_status("recycles reported", Duration::from_secs(10), |s| {
            queue_report(s, "hog", "recycles_total") >= 2
        })
        .await;
    assert_eq!(queue_report(&s, "hog", "crashes_total"), 0, "{s}");
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (
            stats.acked_total,
            stats.ready,
            stats.leased,
            stats.dead,
            stats.retried_total
        ),
        (40, 0, 0, 0, 0)
    );
    assert!(m.log().contains("over the limit"), "{}", m.log());
}

#[tokio::test]
async fn killed_slot_is_replaced_and_its_tasks_come_back() {
    let m = TestMaster::start(
        "[queues.slow]\nhandler = \"sleep\"\nlease = \"2s\"\nbatch_size = 2\n",
        &[("slow", 1)],
    )
    .await;
    let q = m.queue("slow");
    enqueue(&q, (0..2).map(|_| r#"{"ms":60000}"#.to_string())).await;
    let busy = m
        .wait_status("the slot to be busy", Duration::from_secs(10), |s| {
            slots(s).iter().any(|s| s["state"] == "busy")
        })
        .await;
    let victim = slot_pids(&busy)[0];
    kill(victim, nix::sys::signal::Signal::SIGKILL);
    let s = m
        .wait_status("a replacement slot", Duration::from_secs(10), |s| {
            let pids = slot_pids(s);
            pids.len() == 1 && pids[0] != victim && queue_report(s, "slow", "crashes_total") == 1
        })
        .await;
    let replacement = slot_pids(&s)[0];
    // The leases ran out and the replacement took both tasks again, as second attempts.
    eventually(Duration::from_secs(10), "tasks re-leased", || async {
        let s = q.stats().await.unwrap();
        s.expired_total == 2 && s.leased == 2
    })
    .await;
    let ids: Vec<String> = q
        .dead(0, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert!(ids.is_empty());
    // Stop the long sleeps: the test only needed them in flight.
    kill(replacement, nix::sys::signal::Signal::SIGKILL);
}

#[tokio::test]
async fn master_killed_takes_zygote_and_slots_with_it() {
    let mut m = TestMaster::start("[queues.t]\nhandler = \"noop\"\n", &[("t", 4)]).await;
    let s = m.status().unwrap();
    let mut pids: Vec<u32> = slot_pids(&s);
    pids.extend(
        s["zygote_pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as u32),
    );
    assert_eq!(pids.len(), 5);
    m.child.kill().unwrap();
    let killed = Instant::now();
    m.child.wait().unwrap();
    let deadline = killed + Duration::from_secs(1);
    while !pids.iter().all(|&p| gone(p)) {
        assert!(
            Instant::now() < deadline,
            "still running 1 s after the master died: {:?}",
            pids.iter().filter(|&&p| !gone(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test]
async fn sigterm_drains_the_running_batch_and_deregisters() {
    let mut m = TestMaster::start(
        "[queues.slow]\nhandler = \"sleep\"\nbatch_size = 3\n",
        &[("slow", 1)],
    )
    .await;
    let q = m.queue("slow");
    let keys = Keys::new("test");
    let mut conn = m.client.connection();
    assert!(
        cluster::read_hosts(&mut conn, &keys)
            .await
            .unwrap()
            .contains_key(HOST)
    );
    enqueue(&q, (0..3).map(|_| r#"{"ms":500}"#.to_string())).await;
    m.wait_status("the batch to start", Duration::from_secs(10), |s| {
        slots(s).iter().any(|s| s["state"] == "busy")
    })
    .await;
    kill(m.pid(), nix::sys::signal::Signal::SIGTERM);
    let status = m.child.wait().unwrap();
    assert!(status.success(), "master exited with {status}\n{}", m.log());
    let stats = q.stats().await.unwrap();
    // The sleep handler stops between tasks: the task in hand is finished, the rest of
    // the batch is given back unstarted (no attempt counted), nothing is left leased.
    assert_eq!((stats.leased, stats.retried_total), (0, 0), "{stats:?}");
    assert_eq!(stats.acked_total + stats.ready, 3, "{stats:?}");
    assert!(
        stats.acked_total < 3,
        "the drain ran the whole batch: {stats:?}"
    );
    assert!(
        !cluster::read_hosts(&mut conn, &keys)
            .await
            .unwrap()
            .contains_key(HOST)
    );
}

/// The first SIGTERM drains (slots finish their batch within `drain_timeout`, 10 s here);
/// a second one kills the slots at once, as an operator in a hurry expects.
#[tokio::test]
async fn a_second_sigterm_kills_the_slots_without_waiting_out_the_drain() {
    let mut m = TestMaster::start(
        "[queues.slow]\nhandler = \"sleep\"\nbatch_size = 1\n",
        &[("slow", 1)],
    )
    .await;
    let q = m.queue("slow");
    enqueue(&q, [r#"{"ms":3600000}"#.to_string()]).await;
    m.wait_status("the batch to start", Duration::from_secs(10), |s| {
        slots(s).iter().any(|s| s["state"] == "busy")
    })
    .await;
    kill(m.pid(), nix::sys::signal::Signal::SIGTERM);
    poll_some(Duration::from_secs(10), "the drain to start", || async {
        m.log().contains("draining").then_some(())
    })
    .await;
    assert!(m.child.try_wait().unwrap().is_none(), "{}", m.log());
    kill(m.pid(), nix::sys::signal::Signal::SIGTERM);
    // Well inside the 10 s drain_timeout: only the second request can end it this soon.
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    let status = loop {
        if let Some(status) = m.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "master still running after the second SIGTERM\n{}",
            m.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "master exited with {status}\n{}", m.log());
    assert!(m.log().contains("second stop request"), "{}", m.log());
    assert_eq!(q.stats().await.unwrap().acked_total, 0);
}

#[tokio::test]
async fn hung_handler_is_killed_and_its_tasks_return() {
    let m = TestMaster::start(
        "[queues.stuck]\nhandler = \"sleep\"\nlease = \"3s\"\nmax_batch_time = \"1s\"\n",
        &[("stuck", 1)],
    )
    .await;
    let q = m.queue("stuck");
    let id = enqueue(&q, [r#"{"ms":3600000}"#.to_string()])
        .await
        .remove(0);
    let s = m
        .wait_status("the watchdog", Duration::from_secs(15), |s| {
            queue_report(s, "stuck", "hung_total") >= 1
        })
        .await;
    assert_eq!(queue_report(&s, "stuck", "crashes_total"), 0, "{s}");
    // Hung means killed: its lease is not extended any more, so the task comes back.
    let info = poll_some(Duration::from_secs(15), "the task taken again", || async {
        q.find(&id).await.unwrap().filter(|t| t.attempts >= 2)
    })
    .await;
    assert_eq!(info.id, id);
    assert!(m.log().contains("slot hung"), "{}", m.log());
}

#[tokio::test]
async fn a_batch_three_leases_long_is_handled_once() {
    let m = TestMaster::start(
        "[queues.long]\nhandler = \"sleep\"\nlease = \"1s\"\nbatch_size = 1\n",
        &[("long", 2)],
    )
    .await;
    let q = m.queue("long");
    enqueue(&q, [r#"{"ms":3000}"#.to_string()]).await;
    wait_acked(&q, 1, Duration::from_secs(20)).await;
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.expired_total, stats.stale_total), (0, 0));
    let s = m
        .wait_status("the batch reported", Duration::from_secs(5), |s| {
            queue_report(s, "long", "batches_total") >= 1
        })
        .await;
    assert_eq!(queue_report(&s, "long", "processed_total"), 1, "{s}");
    assert_eq!(queue_report(&s, "long", "batches_total"), 1, "{s}");
}

/// A busy slot sends the ends of batches close together as one datagram
/// (`slot/run/report.rs`); the master still counts every batch and task once.
#[tokio::test]
async fn batch_ends_summed_by_a_slot_are_each_counted_by_the_master() {
    let m = TestMaster::start(
        "[queues.many]\nhandler = \"noop\"\nbatch_size = 1\n",
        &[("many", 1)],
    )
    .await;
    let q = m.queue("many");
    enqueue(&q, (0..300).map(|i| format!("{i}"))).await;
    wait_acked(&q, 300, Duration::from_secs(30)).await;
    let s = m
        .wait_status("every batch reported", Duration::from_secs(10), |s| {
            queue_report(s, "many", "processed_total") >= 300
        })
        .await;
    assert_eq!(queue_report(&s, "many", "processed_total"), 300, "{s}");
    // one task per take, one slot: a batch per task
    assert_eq!(queue_report(&s, "many", "batches_total"), 300, "{s}");
    let metrics = http_get(m.http, "/metrics").unwrap();
    assert!(
        metrics.contains("gaffer_batches_total{queue=\"many\"} 300"),
        "{metrics}"
    );
}

/// Children of `parent` that are zombies.
#[tokio::test]
async fn slots_run_sched_batch_unless_their_queue_says_normal() {
    let m = TestMaster::start(
        "[queues.b]\nhandler = \"noop\"\n\n\
         [queues.n]\nhandler = \"noop\"\ncpu_scheduling = \"normal\"\n",
        &[("b", 1), ("n", 1)],
    )
    .await;
    let status = m.status().unwrap();
    let slot_of = |queue: &str| {
        slots(&status)
            .iter()
            .find(|s| s["queue"] == queue)
            .and_then(|s| s["pid"].as_u64())
            .unwrap() as u32
    };
    let (batch, normal) = (thread_policies(slot_of("b")), thread_policies(slot_of("n")));
    // (a slot has its runtime's thread and its handler's)
    assert!(batch.len() >= 2, "{batch:?}");
    assert!(batch.iter().all(|&p| p == libc::SCHED_BATCH), "{batch:?}");
    assert!(normal.len() >= 2, "{normal:?}");
    assert!(normal.iter().all(|&p| p == libc::SCHED_OTHER), "{normal:?}");
    // The master and its zygote keep the policy they started with.
    assert!(
        thread_policies(m.pid())
            .iter()
            .all(|&p| p == libc::SCHED_OTHER)
    );
}

#[tokio::test]
async fn the_zygote_sweeps_the_fifo_dirs_of_slots_killed_mid_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new("true").spawn().unwrap();
    let gone = child.id();
    child.wait().unwrap();
    // What a slot killed before its forked child opened its FIFOs leaves.
    let left = tmp.path().join(format!("gaffer-fork-{gone}-AbC123"));
    std::fs::create_dir(&left).unwrap();
    nix::unistd::mkfifo(&left.join("stdin"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let m = TestMaster::start_env(
        Path::new(env!("CARGO_BIN_EXE_gaffer")),
        "[queues.a]\nhandler = \"noop\"\n",
        &[("a", 1)],
        &[("TMPDIR", tmp.path().display().to_string())],
    )
    .await;
    assert!(!left.exists(), "{}", m.log());
}

fn zombies_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (state, ppid) = (f.next(), f.next().and_then(|p| p.parse::<u32>().ok()));
        if ppid == Some(parent) && state == Some("Z") {
            out.push(pid);
        }
    }
    out
}

fn open_fds(pid: u32) -> usize {
    gaffer::master::sysinfo::open_fds(pid).unwrap()
}

#[tokio::test]
async fn a_thousand_slot_kills_leave_no_zombies_and_no_fd_leak() {
    let m = TestMaster::start(
        "[queues.churn]\nhandler = \"sleep\"\nbatch_size = 1\nlease = \"5s\"\n",
        &[("churn", 2)],
    )
    .await;
    let q = m.queue("churn");
    // Plenty of short tasks: each slot finishes a batch before it is killed, which is
    // what tells the master it was healthy (no crash back-off).
    for _ in 0..4 {
        enqueue(&q, (0..5000).map(|_| r#"{"ms":20}"#.to_string())).await;
    }
    let zygote = m.status().unwrap()["zygote_pids"][0].as_u64().unwrap() as u32;
    let mut killed = std::collections::HashSet::new();
    let mut fds_after_100 = 0;
    for cycle in 0..1000 {
        if cycle == 100 {
            fds_after_100 = open_fds(m.pid());
        }
        let s = m
            .wait_status(
                "a slot that finished a batch",
                Duration::from_secs(20),
                |s| {
                    slots(s).iter().any(|s| {
                        s["batches"].as_u64() >= Some(1)
                            && s["pid"]
                                .as_u64()
                                .is_some_and(|p| !killed.contains(&(p as u32)))
                    })
                },
            )
            .await;
        let victim = slots(&s)
            .iter()
            .find(|s| {
                s["batches"].as_u64() >= Some(1)
                    && s["pid"]
                        .as_u64()
                        .is_some_and(|p| !killed.contains(&(p as u32)))
            })
            .and_then(|s| s["pid"].as_u64())
            .unwrap() as u32;
        kill(victim, nix::sys::signal::Signal::SIGKILL);
        killed.insert(victim);
    }
    let s = m
        .wait_status("the last replacement", Duration::from_secs(20), |s| {
            let pids = slot_pids(s);
            pids.len() == 2
                && pids.iter().all(|p| !killed.contains(p))
                && queue_report(s, "churn", "crashes_total") == 1000
        })
        .await;
    assert_eq!(s["zygote_pids"][0].as_u64(), Some(u64::from(zygote)));
    assert_eq!(zombies_of(zygote), Vec::<u32>::new());
    assert_eq!(zombies_of(m.pid()), Vec::<u32>::new());
    let fds = open_fds(m.pid());
    assert!(
        fds <= fds_after_100 + 2,
        "master fds grew from {fds_after_100} to {fds} over 900 slot restarts"
    );
}

fn exec_queue(name: &str, extra: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/exec_handler.py");
    format!(
        "[queues.{name}]\nhandler = \"exec\"\ncommand = [\"python3\", \"{}\"]\nbatch_size = 10\n\
         max_attempts = 2\nretry = {{ backoff = \"fixed\", base = \"100ms\", max = \"100ms\" }}\n{extra}",
        script.display()
    )
}

#[tokio::test]
async fn exec_handler_outcomes_through_a_slot() {
    let m = TestMaster::start(&exec_queue("py", ""), &[("py", 1)]).await;
    let q = m.queue("py");
    let ok = enqueue(&q, [r#"{"action":"ok"}"#.to_string()])
        .await
        .remove(0);
    let retry = enqueue(&q, [r#"{"action":"retry","delay_ms":100}"#.to_string()])
        .await
        .remove(0);
    let fail = enqueue(&q, [r#"{"action":"fail","error":"bad input"}"#.to_string()])
        .await
        .remove(0);
    // retry twice and fail twice (max_attempts = 2) end in the dead letters.
    eventually(Duration::from_secs(20), "two dead letters", || async {
        q.stats().await.unwrap().dead == 2
    })
    .await;
    let dead = q.dead(0, 10).await.unwrap();
    let err = |id: &str| dead.iter().find(|d| d.id == id).map(|d| d.error.clone());
    assert!(err(&fail).unwrap().contains("bad input"), "{dead:?}");
    assert!(err(&retry).is_some(), "{dead:?}");
    assert!(
        q.find(&ok).await.unwrap().is_none(),
        "ok task acked and deleted"
    );
    assert_eq!(q.stats().await.unwrap().acked_total, 1);

    // A malformed reply fails the batch and restarts the child; the next batch works.
    let garbage = enqueue(&q, [r#"{"action":"garbage"}"#.to_string()])
        .await
        .remove(0);
    eventually(Duration::from_secs(20), "garbage dead-lettered", || async {
        q.stats().await.unwrap().dead == 3
    })
    .await;
    assert!(q.dead(0, 10).await.unwrap().iter().any(|d| d.id == garbage));
    enqueue(&q, [r#"{"action":"die"}"#.to_string()]).await;
    eventually(
        Duration::from_secs(20),
        "dying child dead-lettered",
        || async { q.stats().await.unwrap().dead == 4 },
    )
    .await;
    enqueue(&q, [r#"{"action":"ok"}"#.to_string()]).await;
    wait_acked(&q, 2, Duration::from_secs(20)).await;
    let s = m.status().unwrap();
    assert_eq!(
        queue_report(&s, "py", "crashes_total"),
        0,
        "the slot survived: {s}"
    );
}

#[tokio::test]
async fn surplus_slots_stop_and_new_queues_start_on_reload() {
    let m = TestMaster::start("[queues.a]\nhandler = \"noop\"\n", &[("a", 3)]).await;
    let first_zygote = m.status().unwrap()["zygote_pids"][0].as_u64().unwrap() as u32;
    publish(&m.client, 2, &[("a", 1)]).await;
    m.wait_status("surplus stopped", Duration::from_secs(10), |s| {
        slots(s).len() == 1
    })
    .await;

    // A new queue whose handler preloads: a new zygote, the old one retires.
    let text = std::fs::read_to_string(&m.config).unwrap()
        + "\n[queues.b]\nhandler = \"preload_demo\"\npreload = \"1MiB\"\n";
    std::fs::write(&m.config, text).unwrap();
    publish(&m.client, 3, &[("a", 1), ("b", 2)]).await;
    kill(m.pid(), nix::sys::signal::Signal::SIGHUP);
    let s = m
        .wait_status(
            "b's slots from a new zygote",
            Duration::from_secs(20),
            |s| {
                let zs = s["zygote_pids"].as_array().unwrap();
                zs.len() == 1
                    && zs[0].as_u64() != Some(u64::from(first_zygote))
                    && slots(s)
                        .iter()
                        .filter(|x| x["queue"] == "b" && x["state"] == "idle")
                        .count()
                        == 2
                    && slots(s)
                        .iter()
                        .filter(|x| x["queue"] == "a" && x["state"] == "idle")
                        .count()
                        == 1
            },
        )
        .await;
    assert!(slots(&s).iter().all(|x| x["generation"] == 2), "{s}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(first_zygote) {
        assert!(Instant::now() < deadline, "the old zygote did not retire");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Once a config is published (the same queues: no new zygote), a SIGHUP no longer
    // reads the file, which now names a queue the cluster's config does not.
    let zygote = s["zygote_pids"][0].as_u64().unwrap();
    let published = std::fs::read_to_string(&m.config).unwrap();
    gaffer::cluster::publish_config(&mut m.client.connection(), &Keys::new("test"), &published)
        .await
        .unwrap();
    let reloads = || m.log().matches("config reloaded").count();
    let before = reloads();
    eventually(Duration::from_secs(10), "the master adopts it", || async {
        m.log().contains("adopting the published config") && reloads() > before
    })
    .await;
    let before = reloads();
    std::fs::write(&m.config, published + "\n[queues.c]\nhandler = \"noop\"\n").unwrap();
    kill(m.pid(), nix::sys::signal::Signal::SIGHUP);
    eventually(Duration::from_secs(10), "the SIGHUP refused", || async {
        m.log().contains("a published config is in force")
    })
    .await;
    assert_eq!(reloads(), before, "{}", m.log());
    assert_eq!(m.status().unwrap()["zygote_pids"][0].as_u64(), Some(zygote));
}

#[tokio::test]
async fn reports_reach_stats_json() {
    let m = TestMaster::start("[queues.t]\nhandler = \"noop\"\n", &[("t", 2)]).await;
    let stats = || m.stats_json();
    // The report is written every tick; the slots may have started since the last one.
    let v = poll_some(
        Duration::from_secs(10),
        "two slots in stats --json",
        || async {
            let v = stats();
            (v["hosts"][HOST]["slots"] == 2).then_some(v)
        },
    )
    .await;
    let host = &v["hosts"][HOST];
    assert_eq!(host["alive"], true, "{v}");
    assert_eq!(host["slots"], 2, "{v}");
    assert!(host["capacity"].as_u64().unwrap() >= 2, "{v}");
    assert!(host["pss_bytes"].as_u64().unwrap() > 0, "{v}");
    assert!(host["mem_available_bytes"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["queues"]["t"]["slots"], 2, "{v}");
    assert_eq!(v["manager"]["map_version"], 1, "{v}");
    let metrics = http_get(m.http, "/metrics").unwrap();
    assert!(
        metrics.contains("gaffer_master_capacity_slots"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gaffer_queue_slots{queue=\"t\"} 2"),
        "{metrics}"
    );
}

/// The example team binary, built by `scripts/test` (`cargo build --examples`).
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/custom_handler");
    assert!(
        bin.exists(),
        "{} is missing: run scripts/test, or `cargo build --examples` first",
        bin.display()
    );
    bin
}

#[tokio::test]
async fn a_team_binary_runs_its_own_handler() {
    let queue =
        "[queues.geo]\nhandler = \"geocode\"\noptions = { cities = [\"Lisbon\", \"Porto\"] }\n";
    let m = TestMaster::start_with(&example_binary(), queue, &[("geo", 1)]).await;
    let q = m.queue("geo");
    enqueue(&q, [r#"{"city":"porto"}"#.to_string()]).await;
    let unknown = enqueue(&q, [r#"{"city":"Atlantis"}"#.to_string()])
        .await
        .remove(0);
    wait_acked(&q, 1, Duration::from_secs(20)).await;
    eventually(
        Duration::from_secs(20),
        "the unknown city dead-lettered",
        || async { q.stats().await.unwrap().dead == 1 },
    )
    .await;
    let dead = q.dead(0, 10).await.unwrap();
    assert_eq!(dead[0].id, unknown);
    assert!(dead[0].error.contains("unknown city"), "{dead:?}");
    let s = m.status().unwrap();
    assert!(
        s["host"]["handlers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h == "geocode"),
        "the host advertises the custom handler: {s}"
    );

    // The stock binary refuses the same config, naming the handler.
    let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&m.config)
        .args(["config", "check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown handler `geocode`"));
}

#[tokio::test]
async fn systemd_hears_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let env = [
        ("NOTIFY_SOCKET", sock_path.display().to_string()),
        ("WATCHDOG_USEC", "2000000".to_string()),
    ];
    let mut m = TestMaster::start_env(
        Path::new(env!("CARGO_BIN_EXE_gaffer")),
        "[queues.t]\nhandler = \"noop\"\n",
        &[("t", 1)],
        &env,
    )
    .await;
    let mut heard = Vec::new();
    let mut buf = [0u8; 1024];
    while !(heard.iter().any(|m: &String| m.contains("READY=1"))
        && heard.iter().any(|m| m.contains("WATCHDOG=1")))
    {
        let n = sock.recv(&mut buf).expect("a notification within 20 s");
        heard.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    kill(m.pid(), nix::sys::signal::Signal::SIGTERM);
    loop {
        let n = sock.recv(&mut buf).expect("STOPPING within 20 s");
        if String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1") {
            break;
        }
    }
    assert!(m.child.wait().unwrap().success());
}

#[tokio::test]
async fn slots_ride_out_a_redis_restart() {
    let mut m = TestMaster::start(
        "[queues.t]\nhandler = \"noop\"\nbatch_size = 10\n",
        &[("t", 2)],
    )
    .await;
    let before = slot_pids(&m.status().unwrap());
    m.redis.server.kill();
    // Long enough for every slot to notice and back off a few times.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    m.redis.server.restart().unwrap();
    let client = m.redis.client().await;
    publish(&client, 2, &[("t", 2)]).await;
    let q = client.queue("t").unwrap();
    enqueue(&q, (0..500).map(|i| format!("{{\"n\":{i}}}"))).await;
    wait_acked(&q, 500, Duration::from_secs(30)).await;
    let s = m.status().unwrap();
    assert_eq!(slot_pids(&s), before, "the same slots carried on: {s}");
    assert_eq!(queue_report(&s, "t", "crashes_total"), 0, "{s}");
}

#[tokio::test]
async fn slots_switch_to_the_queue_user() {
    let root = nix::unistd::Uid::effective().is_root();
    let m = TestMaster::start(
        "[queues.t]\nhandler = \"noop\"\nuser = \"nobody\"\n",
        if root { &[("t", 1)] } else { &[] },
    )
    .await;
    if !root {
        // Not root: the switch cannot happen, and the slot must refuse to run instead
        // of running as the master's user.
        publish(&m.client, 2, &[("t", 1)]).await;
        m.wait_status("the slot to fail", Duration::from_secs(10), |s| {
            queue_report(s, "t", "crashes_total") >= 1
        })
        .await;
        return;
    }
    let pid = slot_pids(&m.status().unwrap())[0];
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap().uid;
    assert!(
        uid.split_whitespace()
            .skip(1)
            .all(|u| u == nobody.to_string()),
        "{uid}"
    );
    let q = m.queue("t");
    enqueue(&q, ["{}".to_string()]).await;
    wait_acked(&q, 1, Duration::from_secs(10)).await;
    // Changing credentials clears PDEATHSIG; the slot must still die with its master.
    let mut m = m;
    m.child.kill().unwrap();
    m.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    while !gone(pid) {
        assert!(Instant::now() < deadline, "slot {pid} outlived its master");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test]
async fn repeated_crashes_back_off() {
    let m = TestMaster::start(
        "[queues.broken]\nhandler = \"exec\"\ncommand = [\"/nonexistent/handler\"]\n",
        &[],
    )
    .await;
    publish(&m.client, 2, &[("broken", 1)]).await;
    // Every start fails at init. Restarted at once, these would be hundreds in a few
    // seconds; backing off (0.5 s, 1 s, 2 s, …) they stay a handful.
    let s = m
        .wait_status("three crashes", Duration::from_secs(10), |s| {
            queue_report(s, "broken", "crashes_total") >= 3
        })
        .await;
    let started = Instant::now();
    let at_three = queue_report(&s, "broken", "crashes_total");
    let s = m
        .wait_status("the next crash", Duration::from_secs(10), |s| {
            queue_report(s, "broken", "crashes_total") > at_three
        })
        .await;
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "restarted after {:?} with {} crashes behind it: {s}",
        started.elapsed(),
        at_three
    );
    assert!(m.log().contains("backing off"), "{}", m.log());
    assert!(
        m.log().contains("/nonexistent/handler"),
        "the error names the command"
    );
}

/// `n` busy loops at the lowest CPU priority, killed when dropped: they keep more tasks
/// runnable than there are CPUs (so the load and PSI's `some` rise) while taking almost
/// no time from the tests beside them.
fn cpu_burner(n: u32) -> crate::harness::Killed {
    crate::harness::Killed(
        (0..n)
            .map(|_| {
                Command::new("nice")
                    .args(["-n", "19", "sh", "-c", "while :; do :; done"])
                    .spawn()
                    .unwrap()
            })
            .collect(),
    )
}

/// A host over its load ceiling (a CPU burner; the ceiling lowered so a 2-CPU machine
/// passes it) serves its min_slots queue, replaces that queue's crashed slot, starts
/// nothing beyond, and says why in `stats --json`.
#[tokio::test]
async fn an_overloaded_host_replaces_a_crashed_slot_and_takes_no_more() {
    let cpus = gaffer::master::sysinfo::cpus().unwrap();
    let _burner = cpu_burner(3 * cpus);
    // Where the kernel has PSI, the overload counts once some task waits for a CPU at
    // least half the time (capacity::CONTENDED_PRESSURE); avg10 takes a few seconds.
    eventually(Duration::from_secs(60), "the CPU contended", || async {
        gaffer::master::sysinfo::cpu_pressure()
            .unwrap()
            .is_none_or(|p| p >= 60.0)
    })
    .await;
    let queues = "[queues.q]\nhandler = \"noop\"\nmin_slots = 2\nmax_slots = 4\n\
                  [queues.extra]\nhandler = \"noop\"\n";
    let low = [("GAFFER_MAX_LOAD_PER_CPU", "0.001".to_string())];
    let bin = Path::new(env!("CARGO_BIN_EXE_gaffer"));
    // (start_env waits for the two slots: min_slots are served through the overload)
    let m = TestMaster::start_env(bin, queues, &[("q", 2)], &low).await;
    let host = |v: &Value| v["hosts"][HOST].clone();
    poll_some(Duration::from_secs(10), "the bound in stats", || async {
        let h = host(&m.stats_json());
        (h["capacity_bound"] == "load").then_some(())
    })
    .await;
    // A map that asks for more: the overloaded host starts none of it.
    publish(&m.client, 2, &[("q", 2), ("extra", 1)]).await;
    let seen = poll_some(Duration::from_secs(10), "map 2 reported", || async {
        let h = host(&m.stats_json());
        (h["map_version"] == 2).then(|| h["last_seen_ms"].as_u64().unwrap())
    })
    .await;
    // Two more reports (ticks) after it saw the map: still nothing for extra.
    poll_some(Duration::from_secs(10), "two ticks later", || async {
        let h = host(&m.stats_json());
        (h["last_seen_ms"].as_u64().unwrap() >= seen + 2000).then_some(())
    })
    .await;
    let status = m.status().unwrap();
    let running = |s: &Value, q: &str| slots(s).iter().filter(|x| x["queue"] == q).count();
    assert_eq!(running(&status, "extra"), 0, "{status}");
    assert_eq!(running(&status, "q"), 2, "{status}");
    // A crashed slot of q is replaced (the host holds two), and still none for extra.
    let victim = slots(&status)[0]["pid"].as_u64().unwrap() as u32;
    kill(victim, nix::sys::signal::Signal::SIGKILL);
    m.wait_status("the slot replaced", Duration::from_secs(10), |s| {
        let pids: Vec<u64> = slots(s).iter().filter_map(|x| x["pid"].as_u64()).collect();
        running(s, "q") == 2 && !pids.contains(&u64::from(victim))
    })
    .await;
    let h = host(&m.stats_json());
    assert_eq!(h["capacity_bound"], "load", "{h}");
    assert_eq!(running(&m.status().unwrap(), "extra"), 0);
    let stats = m.gaffer(&["stats"]);
    assert!(
        stats.contains("cpu overloaded: holding its slots"),
        "{stats}"
    );
}
