//! The cluster under test, all on this machine: one redis-server with AOF (appendfsync
//! always), managers and masters as real `gaffer` processes with distinct host names and
//! HTTP ports, and the exec queue whose handler records every task it receives.
//!
//! Every process is started from the main thread with PDEATHSIG, so none outlives the
//! harness even if it is killed; and every one inherits the run's marker variable, so the
//! final scan finds whatever was left behind, however it was reparented.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gaffer::cluster::{self, Keys};
use gaffer::queue_client::{ConnectOptions, Queue, QueueClient, QueueStats};
use gaffer::redis_server::{RedisServer, RedisServerOptions, free_port};
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::procs;

/// The environment variable every process of a run carries.
pub const MARKER: &str = "GAFFER_CHAOS_RUN";
/// The queue the producer feeds.
pub const QUEUE: &str = "chaos";
/// The key namespace.
pub const NAMESPACE: &str = "chaos";
/// The queue's `max_attempts`, which the producer gives every task too.
pub const MAX_ATTEMPTS: u32 = 100;
/// The masters' `drain_timeout`: how long a stopping slot may take before its master
/// kills it, and the bound of a master's stop with Redis down.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

/// The shape of the cluster and its queue.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Shape {
    /// Masters (hosts).
    pub masters: usize,
    /// Managers (one leads, the others stand by).
    pub managers: usize,
    /// Slots of the queue, cluster-wide (min_slots = max_slots).
    pub slots: u32,
    /// Tasks per batch.
    pub batch_size: u32,
    /// The queue's lease, in ms.
    pub lease_ms: u64,
    /// What the queue runs.
    pub workload: Workload,
}

/// What the queue under test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Batches of short tasks (`examples/exec_handler.py`), `slots` slots throughout.
    Batch,
    /// `kind = "long"` tasks that run until cancelled (`tests/chaos/long_handler.py`):
    /// `slots` is then the queue's max_slots, and the balancer gives it one slot per
    /// waiting or running task.
    Long {
        /// The queue's `cancel_grace`, in ms.
        cancel_grace_ms: u64,
        /// The queue's `max_per_host`, also each master's `max_slots`.
        max_per_host: u32,
    },
}

impl Shape {
    /// The slots the queue has whatever its demand: all of them for a batch queue, none
    /// for a long one (one per task).
    pub fn min_slots(&self) -> u32 {
        match self.workload {
            Workload::Batch => self.slots,
            Workload::Long { .. } => 0,
        }
    }

    /// The queue's lease.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
}

/// A manager or master process, restarted by the harness when a fault kills it.
pub struct Role {
    /// "manager1", "h1", …
    pub name: String,
    /// `--host` for a master.
    pub host: Option<String>,
    /// Its HTTP port (/status).
    pub http: u16,
    /// The running process.
    pub child: Option<Child>,
    /// Its stderr, appended across restarts.
    pub log: PathBuf,
}

impl Role {
    /// Its pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `GET /status` as JSON.
    pub fn status(&self) -> Option<Value> {
        procs::http_get(self.http, "/status").and_then(|b| serde_json::from_str(&b).ok())
    }
}

/// One slot as its master's `/status` shows it.
#[derive(Debug, Clone)]
pub struct SlotInfo {
    /// Index of its master.
    pub master: usize,
    /// Its pid.
    pub pid: u32,
    /// Its number on its host (what task records name).
    pub slot: u32,
    /// idle, busy, starting, stopping, …
    pub state: String,
}

/// The running cluster.
pub struct Cluster {
    /// The run's directory: config, logs, Redis data, the handler record, the report.
    pub dir: PathBuf,
    config: PathBuf,
    /// The exec handler's record file.
    pub record: PathBuf,
    /// `MARKER=dir`, as found in every environment of the run.
    pub marker: String,
    /// The Redis server.
    pub redis: RedisServer,
    /// Managers.
    pub managers: Vec<Role>,
    /// Masters.
    pub masters: Vec<Role>,
    /// Drives the harness's own Redis calls (and the producer).
    pub rt: tokio::runtime::Runtime,
    /// The harness's queue handle: short timeouts, so a frozen Redis cannot stall it.
    pub queue: Queue,
    monitor: QueueClient,
    /// Map epochs seen, in order: a fenced manager must never bring one back down.
    pub epochs: Vec<u64>,
    /// Failures seen outside any one fault: roles that exited on their own.
    pub problems: Vec<String>,
    /// Every slot process seen in a master's `/status`: pid to (host, slot number).
    places: Mutex<HashMap<u32, BTreeSet<(String, u32)>>>,
    /// The cluster's shape.
    pub shape: Shape,
}

impl Cluster {
    /// Starts Redis, the managers and the masters, and waits until every slot runs.
    pub fn start(dir: &Path, shape: Shape) -> Result<Cluster, String> {
        let redis = RedisServer::start(
            &dir.join("redis"),
            RedisServerOptions {
                appendonly: true,
                ..RedisServerOptions::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let config = dir.join("config.toml");
        let handler = Path::new(env!("CARGO_MANIFEST_DIR")).join(match shape.workload {
            Workload::Batch => "examples/exec_handler.py",
            Workload::Long { .. } => "tests/chaos/long_handler.py",
        });
        std::fs::write(&config, config_text(&redis.url(), &handler, &shape))
            .map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let opts = ConnectOptions {
            response_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            ..ConnectOptions::default()
        };
        let monitor = rt
            .block_on(QueueClient::connect(&redis.url(), NAMESPACE, &opts))
            .map_err(|e| e.to_string())?;
        let queue = monitor.queue(QUEUE).map_err(|e| e.to_string())?;
        let mut c = Cluster {
            record: dir.join("handled.txt"),
            marker: format!("{MARKER}={}", dir.display()),
            dir: dir.to_path_buf(),
            config,
            redis,
            managers: Vec::new(),
            masters: Vec::new(),
            rt,
            queue,
            monitor,
            epochs: Vec::new(),
            problems: Vec::new(),
            places: Mutex::new(HashMap::new()),
            shape,
        };
        for i in 1..=c.shape.managers {
            c.managers.push(Role {
                name: format!("manager{i}"),
                host: None,
                http: free_port().map_err(|e| e.to_string())?,
                child: None,
                log: dir.join(format!("manager{i}.log")),
            });
            c.spawn(false, i - 1)?;
        }
        for i in 1..=c.shape.masters {
            c.masters.push(Role {
                name: format!("h{i}"),
                host: Some(format!("h{i}")),
                http: free_port().map_err(|e| e.to_string())?,
                child: None,
                log: dir.join(format!("master-h{i}.log")),
            });
            c.spawn(true, i - 1)?;
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let running = c.running_slots();
            if running >= c.shape.min_slots() as usize && c.masters_up() {
                return Ok(c);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "only {running} of {} slots running after 90 s; see {}",
                    c.shape.slots,
                    dir.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts (or restarts) master `i` or manager `i`, with PDEATHSIG so it dies with
    /// the harness. Called from the main thread only: PDEATHSIG follows the spawning
    /// thread.
    pub fn spawn(&mut self, master: bool, i: usize) -> Result<(), String> {
        let role = if master {
            &self.masters[i]
        } else {
            &self.managers[i]
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&role.log)
            .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gaffer"));
        cmd.arg("--config").arg(&self.config);
        if master {
            cmd.args(["master", "--host", role.host.as_deref().unwrap_or("?")])
                .env("GAFFER_MASTER_HTTP", format!("127.0.0.1:{}", role.http))
                .env("GAFFER_CHAOS_HOST", role.host.as_deref().unwrap_or("?"))
                .env("GAFFER_EXEC_RECORD", &self.record);
        } else {
            cmd.arg("manager")
                .env("GAFFER_MANAGER_HTTP", format!("127.0.0.1:{}", role.http));
        }
        // Masters take slots whatever the machine's load: the suite loads it on purpose.
        cmd.env("GAFFER_LOG", "info")
            .env("GAFFER_MAX_LOAD_PER_CPU", "1000")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", role.name))?;
        let role = if master {
            &mut self.masters[i]
        } else {
            &mut self.managers[i]
        };
        role.child = Some(child);
        Ok(())
    }

    /// Whether every master answers `/status`.
    pub fn masters_up(&self) -> bool {
        self.masters.iter().all(|m| m.status().is_some())
    }

    /// How many slots are up (idle or busy).
    pub fn running_slots(&self) -> usize {
        self.slots()
            .iter()
            .filter(|s| s.state == "idle" || s.state == "busy")
            .count()
    }

    /// Every slot the masters report.
    pub fn slots(&self) -> Vec<SlotInfo> {
        let mut out = Vec::new();
        for (i, m) in self.masters.iter().enumerate() {
            let Some(status) = m.status() else { continue };
            for s in status["slots"].as_array().map_or(&[][..], Vec::as_slice) {
                if let (Some(pid), Some(slot)) = (s["pid"].as_u64(), s["slot"].as_u64()) {
                    out.push(SlotInfo {
                        master: i,
                        pid: pid as u32,
                        slot: slot as u32,
                        state: s["state"].as_str().unwrap_or("?").to_string(),
                    });
                }
            }
        }
        if let Ok(mut places) = self.places.lock() {
            for s in &out {
                places
                    .entry(s.pid)
                    .or_default()
                    .insert((self.masters[s.master].name.clone(), s.slot));
            }
        }
        out
    }

    /// The moment each task in the lists of tasks acked together is due to go (the latest
    /// list's, when a task is in several).
    fn batch_expiries(&self, index: &str) -> Option<HashMap<String, i64>> {
        let lists = format!("{index}:b");
        let mut conn = self.monitor.connection();
        self.call(Duration::from_secs(30), async move {
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&lists)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            let mut due = HashMap::new();
            for m in members {
                if let Some((a, b)) = m.strip_prefix('r').and_then(|r| r.split_once(':')) {
                    // a run of tasks acked together: those whose records are numbered
                    // a to b in the listing index
                    let moment: Option<f64> = redis::cmd("ZSCORE")
                        .arg(&lists)
                        .arg(&m)
                        .query_async(&mut conn)
                        .await?;
                    let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                        .arg(format!("{NAMESPACE}:{{{QUEUE}}}:idx"))
                        .arg(a)
                        .arg(b)
                        .query_async(&mut conn)
                        .await?;
                    let moment = moment.unwrap_or(0.0) as i64;
                    for id in ids {
                        let at = due.entry(id).or_insert(moment);
                        *at = (*at).max(moment);
                    }
                    continue;
                }
                let moment: i64 = m
                    .split(':')
                    .next()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                let ids: Vec<String> = redis::cmd("LRANGE")
                    .arg(format!("{lists}:{m}"))
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await?;
                for id in ids {
                    let at = due.entry(id).or_insert(moment);
                    *at = (*at).max(moment);
                }
            }
            Ok(due)
        })
    }

    /// Every slot process seen so far (every call of [`slots`](Self::slots), which
    /// [`idle`](Self::idle) makes every 250 ms): pid to host and slot number.
    pub fn places(&self) -> HashMap<u32, BTreeSet<(String, u32)>> {
        self.places.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// When each task's record is due to go (Unix ms; None: never), pipelined. Records
    /// have expired three ways: by a TTL on the record's key, by the record's id in the
    /// queue's expiry index (a zset scored by the moment), or by its id in one of the
    /// lists of tasks acked together (`exp:b:MOMENT:TTL`, listed in the zset `exp:b`) or
    /// one of the runs of tasks acked together (listed there as `rS1:S2`: the tasks whose
    /// records are numbered S1 to S2 in the listing index `idx`), swept by the scripts. Any counts; of several lists, the latest. The keys are
    /// `NAMESPACE:{QUEUE}:r:ID` and `NAMESPACE:{QUEUE}:exp…`, as
    /// `src/queue_client/scripts.rs` and `lua/lib/keys.lua` lay a queue out.
    pub fn record_expiries(&self, ids: &[String]) -> Option<Vec<Option<i64>>> {
        let mut out = Vec::with_capacity(ids.len());
        let index = format!("{NAMESPACE}:{{{QUEUE}}}:exp");
        let listed = self.batch_expiries(&index)?;
        for chunk in ids.chunks(1000) {
            let mut conn = self.monitor.connection();
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("PTTL")
                    .arg(format!("{NAMESPACE}:{{{QUEUE}}}:r:{id}"))
                    .cmd("ZSCORE")
                    .arg(&index)
                    .arg(id);
            }
            let sent = crate::oracle::now_ms() as i64;
            let part: Vec<(i64, Option<f64>)> = self.call(Duration::from_secs(30), async move {
                let flat: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
                Ok(flat
                    .chunks(2)
                    .map(|p| {
                        let ttl = redis::from_redis_value(p[0].clone()).unwrap_or(-2);
                        let score = redis::from_redis_value(p[1].clone()).ok().flatten();
                        (ttl, score)
                    })
                    .collect())
            })?;
            out.extend(
                part.into_iter()
                    .zip(chunk)
                    .map(|((ttl, score), id)| match (ttl, score) {
                        (t, _) if t > 0 => Some(sent + t),
                        (_, Some(s)) => Some(s as i64),
                        _ => listed.get(id).copied(),
                    }),
            );
        }
        Some(out)
    }

    /// Runs `f` on the harness's runtime, giving up after `limit`.
    pub fn call<T>(
        &self,
        limit: Duration,
        f: impl std::future::Future<Output = Result<T, gaffer::queue_client::QueueError>>,
    ) -> Option<T> {
        self.rt
            .block_on(async { tokio::time::timeout(limit, f).await.ok()?.ok() })
    }

    /// The queue's counters, when Redis answers.
    pub fn stats(&self) -> Option<QueueStats> {
        self.call(Duration::from_secs(3), self.queue.stats())
    }

    /// The lease value `host:pid:epoch`, when Redis answers.
    pub fn lease(&self) -> Option<String> {
        let mut conn = self.monitor.connection();
        self.call(Duration::from_secs(2), async move {
            let v: Option<String> = redis::cmd("GET")
                .arg(Keys::new(NAMESPACE).lease())
                .query_async(&mut conn)
                .await?;
            Ok(v)
        })
        .flatten()
    }

    /// The queue's leases (`token:id`), per task and in batch leases, when Redis answers.
    pub fn leased(&self) -> Option<BTreeSet<String>> {
        let mut conn = self.monitor.connection();
        self.call(Duration::from_secs(2), async move {
            let v: Vec<String> = redis::cmd("ZRANGE")
                .arg(format!("{NAMESPACE}:{{{QUEUE}}}:leased"))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            let batched = batch_leases(&mut conn).await?;
            Ok(v.into_iter()
                .chain(batched.into_iter().map(|(_, m)| m))
                .collect())
        })
    }

    /// The leases held by the slots of `host`: those whose running entry
    /// (`leased:run:ID`, "at FS attempt FS host FS slot FS") names it, and the tasks of
    /// the batch leases its slots took.
    pub fn leases_on(&self, host: &str) -> Option<BTreeSet<String>> {
        let mut conn = self.monitor.connection();
        let prefix = format!("{NAMESPACE}:{{{QUEUE}}}:leased:run:");
        let ids = self.call(Duration::from_secs(3), async move {
            let mut keys: Vec<String> = Vec::new();
            let mut cursor = 0u64;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{prefix}*"))
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await?;
                keys.extend(batch);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            if keys.is_empty() {
                return Ok(BTreeSet::new());
            }
            let values: Vec<Option<String>> =
                redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
            Ok(keys
                .iter()
                .zip(values)
                .filter(|(_, v)| v.as_deref().and_then(|v| v.split('\x1f').nth(2)) == Some(host))
                .map(|(k, _)| k[prefix.len()..].to_string())
                .collect::<BTreeSet<String>>())
        })?;
        let leased = self.leased()?;
        let mut conn = self.monitor.connection();
        let batched = self.call(Duration::from_secs(2), async move {
            Ok(batch_leases(&mut conn).await?)
        })?;
        Some(
            leased
                .into_iter()
                .filter(|m| m.split_once(':').is_some_and(|(_, id)| ids.contains(id)))
                .chain(
                    batched
                        .into_iter()
                        .filter(|(h, _)| h == host)
                        .map(|(_, m)| m),
                )
                .collect(),
        )
    }

    /// Which manager holds the lease, with its epoch.
    pub fn leader(&self) -> Option<(usize, u64)> {
        let lease = self.lease()?;
        let mut parts = lease.rsplitn(3, ':');
        let epoch: u64 = parts.next()?.parse().ok()?;
        let pid: u32 = parts.next()?.parse().ok()?;
        let i = self.managers.iter().position(|m| m.pid() == Some(pid))?;
        Some((i, epoch))
    }

    fn sample_epoch(&mut self) {
        let mut conn = self.monitor.connection();
        let keys = Keys::new(NAMESPACE);
        let map = self.call(Duration::from_millis(500), async move {
            cluster::read_map(&mut conn, &keys).await
        });
        if let Some(Some(map)) = map
            && self.epochs.last() != Some(&map.epoch)
        {
            self.epochs.push(map.epoch);
        }
    }

    /// A role that exited without being asked is a failure (a crash on a fault): it is
    /// recorded with its log tail and restarted so the run goes on.
    pub fn check_roles(&mut self) {
        for master in [false, true] {
            let n = if master {
                self.masters.len()
            } else {
                self.managers.len()
            };
            for i in 0..n {
                let role = if master {
                    &mut self.masters[i]
                } else {
                    &mut self.managers[i]
                };
                let Some(child) = role.child.as_mut() else {
                    continue;
                };
                if let Ok(Some(status)) = child.try_wait() {
                    let tail = tail(&role.log, 15);
                    self.problems.push(format!(
                        "{} exited on its own ({status}); log tail:\n{tail}",
                        role.name
                    ));
                    eprintln!(
                        "chaos: {} exited on its own ({status}); restarting it",
                        role.name
                    );
                    role.child = None;
                    if let Err(e) = self.spawn(master, i) {
                        self.problems.push(e);
                    }
                }
            }
        }
    }

    /// Waits `d`, watching the roles, the map epoch and the slots meanwhile.
    pub fn idle(&mut self, d: Duration) {
        let end = Instant::now() + d;
        loop {
            self.check_roles();
            self.sample_epoch();
            // Notes every slot process, so the records' host and slot can be checked.
            self.slots();
            let now = Instant::now();
            if now >= end {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(250)));
        }
    }

    /// The pids of every gaffer process of the run and their children (zygotes, slots,
    /// exec children), with their command lines.
    pub fn tree(&self) -> Vec<(u32, String)> {
        let mut out = Vec::new();
        for role in self.managers.iter().chain(&self.masters) {
            if let Some(pid) = role.pid() {
                out.push((pid, role.name.clone()));
                for d in procs::descendants(pid) {
                    out.push((d, procs::cmdline(d)));
                }
            }
        }
        out
    }

    /// Stops everything in order (masters drain, managers, then Redis). Returns what did
    /// not go as it should.
    pub fn shutdown(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        for role in self.masters.iter().chain(&self.managers) {
            if let Some(pid) = role.pid() {
                let _ = procs::signal(pid, Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for role in self.masters.iter_mut().chain(self.managers.iter_mut()) {
            let Some(mut child) = role.child.take() else {
                continue;
            };
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            problems.push(format!("{} stopped with {status}", role.name));
                        }
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        problems.push(format!("{} did not stop within 30 s of SIGTERM", role.name));
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        self.redis.stop(Duration::from_secs(5));
        problems
    }

    /// Processes of this run still alive (other than the harness): its descendants, and
    /// anything carrying the run's marker in its environment, the run's directory in its
    /// command line or as its working directory (redis-server rewrites its command line
    /// over its environment, but works in its data directory).
    pub fn leftovers(&self) -> Vec<(u32, String)> {
        let me = std::process::id();
        let dir = self.dir.display().to_string();
        let mine = procs::descendants(me);
        procs::all_pids()
            .into_iter()
            .filter(|&p| p != me && !procs::gone(p))
            .filter(|&p| {
                mine.contains(&p)
                    || procs::has_env(p, &self.marker)
                    || procs::cmdline(p).contains(&dir)
                    || procs::cwd(p).is_some_and(|d| d.starts_with(&self.dir))
            })
            .map(|p| (p, procs::cmdline(p)))
            .collect()
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn config_text(redis: &str, handler: &Path, s: &Shape) -> String {
    match s.workload {
        Workload::Batch => batch_config_text(redis, handler, s),
        Workload::Long {
            cancel_grace_ms,
            max_per_host,
        } => long_config_text(redis, handler, s, cancel_grace_ms, max_per_host),
    }
}

/// The config's cluster, manager and master tables: every profile's.
fn roles_config_text(redis: &str, max_per_host: u32) -> String {
    // A tick of 500 ms makes the manager's lease 3 s, so a manager frozen for a few
    // seconds loses it; drain_timeout bounds how long a stopping slot may take.
    format!(
        r#"[cluster]
redis = "{redis}"
namespace = "{NAMESPACE}"

[manager]
tick = "500ms"
heartbeat_timeout = "3s"

[master]
drain_timeout = "{drain}ms"
memory_reserve = "64MiB"
slot_estimate = "32MiB"
max_slots = {max_per_host}

"#,
        drain = DRAIN_TIMEOUT.as_millis(),
    )
}

/// A long queue of up to `s.slots` tasks, `max_per_host` on each host (so the hosts left
/// when one is down can hold them all), each master room for as many.
fn long_config_text(
    redis: &str,
    handler: &Path,
    s: &Shape,
    cancel_grace_ms: u64,
    max_per_host: u32,
) -> String {
    roles_config_text(redis, max_per_host)
        + &format!(
            r#"[queues.{QUEUE}]
kind = "long"
handler = "exec"
command = ["python3", "{handler}"]
min_slots = 0
max_slots = {slots}
max_per_host = {max_per_host}
lease = "{lease}s"
cancel_grace = "{cancel_grace_ms}ms"
max_attempts = {MAX_ATTEMPTS}
retry = {{ backoff = "fixed", base = "1s", max = "1s" }}
"#,
            handler = handler.display(),
            slots = s.slots,
            lease = s.lease_ms / 1000,
        )
}

fn batch_config_text(redis: &str, handler: &Path, s: &Shape) -> String {
    // Room for every slot on the hosts left when one is down.
    let max_per_host = s.slots.div_ceil((s.masters as u32 - 1).max(1));
    roles_config_text(redis, max_per_host)
        + &format!(
            r#"[queues.{QUEUE}]
handler = "exec"
command = ["python3", "{handler}"]
min_slots = {slots}
max_slots = {slots}
batch_size = {batch}
lease = "{lease}ms"
max_attempts = {MAX_ATTEMPTS}
max_batch_time = "60s"
retry = {{ backoff = "fixed", base = "1s", max = "1s" }}
"#,
            handler = handler.display(),
            slots = s.slots,
            batch = s.batch_size,
            lease = s.lease_ms,
        )
}

/// The tasks in the queue's batch leases as (taker's host, `token:id`): the batch
/// `leased:b:TOKEN` is "at FS host FS slot FS count RS FS id FS id ... FS".
async fn batch_leases(
    conn: &mut gaffer::queue_client::RedisConn,
) -> redis::RedisResult<Vec<(String, String)>> {
    let base = format!("{NAMESPACE}:{{{QUEUE}}}:leased:b");
    let toks: Vec<String> = redis::cmd("ZRANGE")
        .arg(&base)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?;
    let mut out = Vec::new();
    for tok in toks {
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("{base}:{tok}"))
            .query_async(conn)
            .await?;
        let Some((head, ids)) = v.as_deref().and_then(|v| v.split_once('\x1e')) else {
            continue;
        };
        let host = head.split('\x1f').nth(1).unwrap_or_default().to_string();
        for id in ids.split('\x1f').filter(|id| !id.is_empty()) {
            out.push((host.clone(), format!("{tok}:{id}")));
        }
    }
    Ok(out)
}
