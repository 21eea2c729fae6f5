//! The cluster under test, all on this machine: Redis with AOF (appendfsync always: one
//! server, a 3-master Redis Cluster, or for the failover profile a Sentinel group or a
//! cluster with replicas, `redis.rs`), managers and masters as real `gaffer`
//! processes with distinct host names and HTTP ports, and the exec queues whose handler
//! records every task it receives: the plain queue, and the chain workload's two
//! (`chains.rs`).
//!
//! Every process is started from the main thread with PDEATHSIG, so none outlives the
//! harness even if it is killed; and every one inherits the run's marker variable, so the
//! final scan finds whatever was left behind, however it was reparented.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gaffer::chain::ChainTargets;
use gaffer::cluster::{self, Keys};
use gaffer::config::Config;
use gaffer::queue_client::{ConnectOptions, Queue, QueueClient, QueueLimits, QueueStats};
use gaffer::redis_server::free_port;
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::chains::{CHAIN_QUEUE, CHAIN_SLOTS, STEP_QUEUE, STEP_SLOTS};
use crate::procs;
use crate::redis::{Redis, Topology};

/// The environment variable every process of a run carries.
pub const MARKER: &str = "GAFFER_CHAOS_RUN";
/// The plain queue the producer feeds (and the long-tasks profile's queue).
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
    /// How Redis is deployed.
    pub redis: Topology,
    /// Slots of the plain queue, cluster-wide (min_slots = max_slots); of a long queue,
    /// its max_slots.
    pub slots: u32,
    /// Tasks per batch.
    pub batch_size: u32,
    /// The queue's lease, in ms.
    pub lease_ms: u64,
    /// What the queue runs.
    pub workload: Workload,
    /// The roles' `[cluster] wait_replicas` (written only when above 0): how many
    /// replicas must have a write before Redis's answer counts.
    pub wait_replicas: u32,
}

/// What the queue under test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Batches of short tasks (`examples/exec_handler.py`), each queue's slots
    /// throughout: plain tasks on [`QUEUE`] (`slots` slots), chains on the chain
    /// workload's queues (`chains.rs`), or both.
    Batch {
        /// Plain tasks.
        plain: bool,
        /// Chains.
        chains: bool,
    },
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
    /// The queues and their slots (a long queue's max_slots), every parent's before its
    /// children's: a drain reads them in this order (see `Cluster::stats`).
    pub fn queues(&self) -> Vec<(&'static str, u32)> {
        match self.workload {
            Workload::Batch { plain, chains } => {
                let mut out = Vec::new();
                if plain {
                    out.push((QUEUE, self.slots));
                }
                if chains {
                    out.extend([(CHAIN_QUEUE, CHAIN_SLOTS), (STEP_QUEUE, STEP_SLOTS)]);
                }
                out
            }
            Workload::Long { .. } => vec![(QUEUE, self.slots)],
        }
    }

    /// The slots the queues have whatever their demand: all of them for batch queues,
    /// none for a long one (one per task).
    pub fn min_slots(&self) -> u32 {
        match self.workload {
            Workload::Batch { .. } => self.queues().iter().map(|(_, n)| n).sum(),
            Workload::Long { .. } => 0,
        }
    }

    /// Whether the chain workload runs.
    pub fn chains(&self) -> bool {
        matches!(self.workload, Workload::Batch { chains: true, .. })
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
    /// The queue it serves.
    pub queue: String,
    /// idle, busy, starting, stopping, …
    pub state: String,
}

/// The running cluster.
pub struct Cluster {
    /// The run's directory: config, logs, Redis data, the handler record, the report.
    pub dir: PathBuf,
    config: PathBuf,
    /// The config the roles run, parsed: the producer's queues take their limits from it,
    /// the chain reads their targets.
    pub parsed: Config,
    /// The exec handler's record file.
    pub record: PathBuf,
    /// `MARKER=dir`, as found in every environment of the run.
    pub marker: String,
    /// Redis: one server or a cluster's nodes.
    pub redis: Redis,
    /// Managers.
    pub managers: Vec<Role>,
    /// Masters.
    pub masters: Vec<Role>,
    /// Drives the harness's own Redis calls (and the producer).
    pub rt: tokio::runtime::Runtime,
    /// The harness's queue handles, in the order of [`Shape::queues`]: short timeouts, so
    /// a frozen Redis cannot stall it.
    pub queues: Vec<Queue>,
    /// The harness's client (its connection reads what no queue call does).
    pub monitor: QueueClient,
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
        let mut tags: Vec<&str> = shape.queues().iter().map(|(q, _)| *q).collect();
        // (the roles' keys: the map, the manager's lease, the hosts' reports)
        tags.push("cluster");
        let redis = Redis::start(dir, shape.redis, &tags)?;
        let config = dir.join("config.toml");
        let handler = Path::new(env!("CARGO_MANIFEST_DIR")).join(match shape.workload {
            Workload::Batch { .. } => "examples/exec_handler.py",
            Workload::Long { .. } => "tests/chaos/long_handler.py",
        });
        let text = config_text(&redis.url(), &handler, &shape);
        std::fs::write(&config, &text).map_err(|e| e.to_string())?;
        let parsed = gaffer::config::parse(&text, &config.display().to_string())
            .map_err(|e| format!("the run's config: {e}"))?;
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
        let queues = shape
            .queues()
            .iter()
            .map(|(name, _)| monitor.queue(name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let mut c = Cluster {
            record: dir.join("handled.txt"),
            marker: format!("{MARKER}={}", dir.display()),
            dir: dir.to_path_buf(),
            config,
            parsed,
            redis,
            managers: Vec::new(),
            masters: Vec::new(),
            rt,
            queues,
            monitor,
            epochs: Vec::new(),
            problems: Vec::new(),
            places: Mutex::new(HashMap::new()),
            shape,
        };
        c.start_roles()?;
        Ok(c)
    }

    /// Starts the managers and the masters, and waits until every slot runs.
    fn start_roles(&mut self) -> Result<(), String> {
        for i in 1..=self.shape.managers {
            self.managers.push(Role {
                name: format!("manager{i}"),
                host: None,
                http: free_port().map_err(|e| e.to_string())?,
                child: None,
                log: self.dir.join(format!("manager{i}.log")),
            });
            self.spawn(false, i - 1)?;
        }
        for i in 1..=self.shape.masters {
            self.masters.push(Role {
                name: format!("h{i}"),
                host: Some(format!("h{i}")),
                http: free_port().map_err(|e| e.to_string())?,
                child: None,
                log: self.dir.join(format!("master-h{i}.log")),
            });
            self.spawn(true, i - 1)?;
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let running = self.running_slots();
            if running >= self.shape.min_slots() as usize && self.masters_up() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "only {running} of {} slots running after 90 s; see {}",
                    self.shape.min_slots(),
                    self.dir.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The harness's handle of queue `name` (one of [`Shape::queues`]).
    pub fn queue(&self, name: &str) -> &Queue {
        self.queues
            .iter()
            .find(|q| q.name() == name)
            .expect("a queue of the run")
    }

    /// Queue `name`'s limits as the run's config sets them.
    pub fn limits(&self, name: &str) -> QueueLimits {
        QueueLimits::from(&self.parsed.queues[name])
    }

    /// What chain reads need of the config's queues.
    pub fn targets(&self) -> ChainTargets {
        ChainTargets::from_config(&self.parsed)
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
                        queue: s["queue"].as_str().unwrap_or("?").to_string(),
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

    /// The moment each task of `queue` in the lists of tasks acked together is due to go
    /// (the latest list's, when a task is in several).
    fn batch_expiries(&self, queue: &str) -> Option<HashMap<String, i64>> {
        let lists = format!("{}:b", expiry_index(queue));
        let listing = format!("{NAMESPACE}:{{{queue}}}:idx");
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
                        .arg(&listing)
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

    /// When each task of `queue`'s record is due to go (Unix ms; None: never), pipelined. Records
    /// have expired three ways: by a TTL on the record's key, by the record's id in the
    /// queue's expiry index (a zset scored by the moment), or by its id in one of the
    /// lists of tasks acked together (`exp:b:MOMENT:TTL`, listed in the zset `exp:b`) or
    /// one of the runs of tasks acked together (listed there as `rS1:S2`: the tasks whose
    /// records are numbered S1 to S2 in the listing index `idx`), swept by the scripts. Any counts; of several lists, the latest. The keys are
    /// `NAMESPACE:{QUEUE}:r:ID` and `NAMESPACE:{QUEUE}:exp…`, as
    /// `src/queue_client/scripts.rs` and `lua/lib/keys.lua` lay a queue out.
    pub fn record_expiries(&self, queue: &str, ids: &[String]) -> Option<Vec<Option<i64>>> {
        let mut out = Vec::with_capacity(ids.len());
        let index = expiry_index(queue);
        let listed = self.batch_expiries(queue)?;
        for chunk in ids.chunks(1000) {
            let mut conn = self.monitor.connection();
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("PTTL")
                    .arg(format!("{NAMESPACE}:{{{queue}}}:r:{id}"))
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

    /// Every queue's counters, when Redis answers, read one queue after the other in the
    /// order of [`Shape::queues`]. A chain's follow-ups are enqueued before their parent is
    /// acked, so once a parent's queue reads empty every child it made is in a later
    /// queue's counters (or its own, for a handler's follow-ups to its own queue): reading
    /// parents first, all empty means nothing is left anywhere.
    pub fn stats(&self) -> Option<BTreeMap<String, QueueStats>> {
        let mut out = BTreeMap::new();
        for q in &self.queues {
            let s = self.call(Duration::from_secs(3), q.stats())?;
            out.insert(q.name().to_string(), s);
        }
        Some(out)
    }

    /// Settles refused as stale, over every queue, when Redis answers.
    pub fn stale_total(&self) -> Option<u64> {
        self.stats()
            .map(|s| s.values().map(|q| q.stale_total).sum())
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

    /// Every queue's leases (`QUEUE/token:id`), per task and in batch leases, when Redis
    /// answers.
    pub fn leased(&self) -> Option<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        for (queue, _) in self.shape.queues() {
            let held = self.leases_of(queue)?;
            out.extend(held.into_iter().map(|(_, m)| format!("{queue}/{m}")));
        }
        Some(out)
    }

    /// Queue `queue`'s leases (`token:id`) with the host of the slot that holds each: a
    /// task's own lease names it in its running entry (`leased:run:ID`, "at FS attempt FS
    /// host FS slot FS"), a batch lease in its value. Read by key, not by SCAN, which a
    /// Redis Cluster would answer from whichever node it asks.
    fn leases_of(&self, queue: &'static str) -> Option<Vec<(String, String)>> {
        let mut conn = self.monitor.connection();
        self.call(Duration::from_secs(3), async move {
            let leased: Vec<String> = redis::cmd("ZRANGE")
                .arg(format!("{NAMESPACE}:{{{queue}}}:leased"))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            let mut out = Vec::with_capacity(leased.len());
            if !leased.is_empty() {
                let keys: Vec<String> = leased
                    .iter()
                    .map(|m| {
                        let id = m.split_once(':').map_or("", |(_, id)| id);
                        format!("{NAMESPACE}:{{{queue}}}:leased:run:{id}")
                    })
                    .collect();
                let runs: Vec<Option<String>> =
                    redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
                for (m, run) in leased.into_iter().zip(runs) {
                    let host = run.as_deref().and_then(|v| v.split('\x1f').nth(2));
                    out.push((host.unwrap_or_default().to_string(), m));
                }
            }
            out.extend(batch_leases(&mut conn, queue).await?);
            Ok(out)
        })
    }

    /// The leases (`QUEUE/token:id`) held by the slots of `host`, when Redis answers.
    pub fn leases_on(&self, host: &str) -> Option<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        for (queue, _) in self.shape.queues() {
            let held = self.leases_of(queue)?;
            out.extend(
                held.into_iter()
                    .filter(|(h, _)| h == host)
                    .map(|(_, m)| format!("{queue}/{m}")),
            );
        }
        Some(out)
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

    /// Notes the map's epoch when it changed since the last sample.
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

    /// The slots that exited with an error of their own, as their masters logged them
    /// (`slot exited … code=Some(N)`, N not 0: a fault kills a slot by a signal, a stop
    /// ends it with 0), and how many slot exits the logs hold in all. Slots ride out
    /// Redis outages whatever the fault around them: a slot that gives up on an error is
    /// a problem even where no fault checks for it.
    pub fn slot_errors(&self) -> (usize, Vec<String>) {
        let mut exits = 0;
        let mut errors = Vec::new();
        for m in &self.masters {
            let text = std::fs::read_to_string(&m.log).unwrap_or_default();
            for line in text.lines().filter(|l| l.contains("slot exited")) {
                exits += 1;
                let code = line
                    .split_once("code=Some(")
                    .and_then(|(_, rest)| rest.split_once(')'))
                    .and_then(|(n, _)| n.parse::<i32>().ok());
                if code.is_some_and(|c| c != 0) {
                    errors.push(format!("{}: {}", m.name, line.trim()));
                }
            }
        }
        (exits, errors)
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

/// The key of `queue`'s index of records ended one at a time (`exp`; its lists and runs
/// of records ended together hang off it as `exp:b`).
fn expiry_index(queue: &str) -> String {
    format!("{NAMESPACE}:{{{queue}}}:exp")
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The run's config: the roles' tables and the workload's queues.
fn config_text(redis: &str, handler: &Path, s: &Shape) -> String {
    match s.workload {
        Workload::Batch { .. } => batch_config_text(redis, handler, s),
        Workload::Long {
            cancel_grace_ms,
            max_per_host,
        } => long_config_text(redis, handler, s, cancel_grace_ms, max_per_host),
    }
}

/// The config's cluster, manager and master tables: every profile's.
fn roles_config_text(redis: &str, max_per_host: u32, wait_replicas: u32) -> String {
    // A tick of 500 ms makes the manager's lease 3 s, so a manager frozen for a few
    // seconds loses it; drain_timeout bounds how long a stopping slot may take. The
    // failover profile's `wait_replicas` is left out at 0, its default.
    let wait = if wait_replicas > 0 {
        format!("wait_replicas = {wait_replicas}\n")
    } else {
        String::new()
    };
    format!(
        r#"[cluster]
redis = "{redis}"
namespace = "{NAMESPACE}"
{wait}
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
    roles_config_text(redis, max_per_host, s.wait_replicas)
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

/// Batch queues: the plain one, the chain workload's (its global queue routes every done
/// task to its step queue), or all three.
fn batch_config_text(redis: &str, handler: &Path, s: &Shape) -> String {
    // Room for every slot on the hosts left when one is down.
    let max_per_host = s.min_slots().div_ceil((s.masters as u32 - 1).max(1));
    let mut text = roles_config_text(redis, max_per_host, s.wait_replicas);
    for (queue, slots) in s.queues() {
        let next = if queue == CHAIN_QUEUE {
            format!("next = [{{ queue = \"{STEP_QUEUE}\", on = \"done\" }}]\n")
        } else {
            String::new()
        };
        text += &format!(
            r#"[queues.{queue}]
handler = "exec"
command = ["python3", "{handler}"]
min_slots = {slots}
max_slots = {slots}
batch_size = {batch}
lease = "{lease}ms"
max_attempts = {MAX_ATTEMPTS}
max_batch_time = "60s"
retry = {{ backoff = "fixed", base = "1s", max = "1s" }}
{next}
"#,
            handler = handler.display(),
            batch = s.batch_size,
            lease = s.lease_ms,
        );
    }
    text
}

/// The tasks in `queue`'s batch leases as (taker's host, `token:id`): the batch
/// `leased:b:TOKEN` is "at FS host FS slot FS count RS FS id FS id ... FS".
async fn batch_leases(
    conn: &mut gaffer::queue_client::RedisConn,
    queue: &str,
) -> redis::RedisResult<Vec<(String, String)>> {
    let base = format!("{NAMESPACE}:{{{queue}}}:leased:b");
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
