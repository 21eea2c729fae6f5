//! The operator commands behind `gaffer`'s command line. `main.rs` parses arguments and
//! calls these; they print results and return an exit code: 0 ok, 1 runtime failure,
//! 2 bad usage or bad config (DESIGN.md "CLI contract").

mod args;

pub use args::run;

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;

use crate::bench::{self, BenchOptions};
use crate::config::{self, Config, ConfigError};
use crate::queue_client::{ConnectOptions, NewTask, Queue, QueueClient, QueueError, QueueLimits};
use crate::slot::Registry;

/// A command's failure, sorted by exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad usage or bad config: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Anything that went wrong while running: exit 1.
    #[error(transparent)]
    Runtime(#[from] anyhow::Error),
}

impl From<QueueError> for CliError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Invalid(_) | QueueError::PayloadTooLarge { .. } => {
                CliError::Usage(e.to_string())
            }
            other => CliError::Runtime(other.into()),
        }
    }
}

impl From<redis::RedisError> for CliError {
    fn from(e: redis::RedisError) -> Self {
        QueueError::from(e).into()
    }
}

impl CliError {
    /// The exit code this failure maps to.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) => ExitCode::from(2),
            CliError::Runtime(_) => ExitCode::from(1),
        }
    }
}

/// Settings every command shares.
#[derive(Debug, Clone)]
pub struct Global {
    /// `--config`, when given.
    pub config: Option<PathBuf>,
    /// `--redis`: overrides `[cluster].redis`.
    pub redis: Option<String>,
    /// `--state-dir`: where `gaffer up` keeps its Redis and state.
    pub state_dir: Option<PathBuf>,
    /// The handlers this binary can run; the config may name these.
    pub registry: Registry,
}

impl Global {
    /// The config file: `--config`, else ./config.toml, else /etc/gaffer/config.toml.
    pub fn config_path(&self) -> PathBuf {
        if let Some(p) = &self.config {
            return p.clone();
        }
        let local = PathBuf::from("config.toml");
        if local.exists() {
            return local;
        }
        PathBuf::from("/etc/gaffer/config.toml")
    }

    /// `--state-dir`, else `.gaffer` beside the config file.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| crate::up::default_state_dir(&self.config_path()))
    }

    /// Loads and validates the config; every error is printed, exit 2.
    pub fn load(&self) -> Result<Config, CliError> {
        self.load_source().map(|(cfg, _)| cfg)
    }

    /// Loads the config and keeps its text, for roles that hand it on (to the zygote).
    pub fn load_source(&self) -> Result<(Config, String), CliError> {
        let path = self.config_path();
        let usage = |e: ConfigError| CliError::Usage(e.to_string());
        let source = std::fs::read_to_string(&path).map_err(|source| {
            usage(ConfigError::Io {
                path: path.clone(),
                source,
            })
        })?;
        let origin = path.display().to_string();
        let cfg =
            config::parse_with(&source, &origin, &self.registry.custom_names()).map_err(usage)?;
        Ok((cfg, source))
    }

    /// Connects to the Redis of the config (or `--redis`).
    pub async fn connect(&self, cfg: &Config) -> Result<QueueClient, CliError> {
        let (url, opts) = self.redis_target(cfg)?;
        QueueClient::connect(&url, &cfg.cluster.namespace, &opts)
            .await
            .map_err(|e| CliError::Runtime(e.into()))
    }

    /// The Redis URL and connect options: `--redis` over `[cluster].redis`, the password
    /// from `redis_password_file` when set.
    pub fn redis_target(&self, cfg: &Config) -> Result<(String, ConnectOptions), CliError> {
        let url = self
            .redis
            .clone()
            .or_else(|| cfg.cluster.redis.clone())
            .or_else(|| crate::up::running_redis(&self.state_dir()))
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "{}: [cluster].redis is not set, no --redis was given, and no `gaffer up` \
                     runs with state directory {} (start one, or name a Redis)",
                    self.config_path().display(),
                    self.state_dir().display()
                ))
            })?;
        let mut opts = ConnectOptions::default();
        if let Some(file) = &cfg.cluster.redis_password_file {
            let pw = std::fs::read_to_string(file).map_err(|e| {
                CliError::Usage(format!(
                    "cannot read [cluster].redis_password_file {}: {e}",
                    file.display()
                ))
            })?;
            opts.password = Some(pw.trim_end_matches(['\n', '\r']).to_string());
        }
        Ok((url, opts))
    }
}

fn queue_handle(client: &QueueClient, cfg: &Config, name: &str) -> Result<Queue, CliError> {
    let q = cfg.queues.get(name).ok_or_else(|| {
        let known: Vec<&str> = cfg.queues.keys().map(String::as_str).collect();
        CliError::Usage(format!(
            "queue {name:?} is not in the config (known: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ))
    })?;
    Ok(client.queue_with(name, QueueLimits::from(q))?)
}

/// `gaffer config check`: the summary on stdout, or every error on stderr and exit 2.
pub fn config_check(global: &Global) -> Result<(), CliError> {
    let cfg = global.load()?;
    println!("{}", cfg.summary());
    Ok(())
}

/// Where `push` takes its payloads from.
#[derive(Debug, Clone)]
pub enum PushSource {
    /// One JSON payload (repeated `count` times when `count` is given).
    Payload(String),
    /// One JSON payload per line; `-` is stdin.
    File(PathBuf),
    /// Synthetic payloads `{"n": i}`.
    Count(usize),
}

/// Options of `push`.
#[derive(Debug, Clone)]
pub struct PushArgs {
    /// Target queue.
    pub queue: String,
    /// Where payloads come from.
    pub source: PushSource,
    /// How many copies of `--payload`.
    pub count: Option<usize>,
    /// Dedup id (one task only).
    pub id: Option<String>,
    /// Priority.
    pub priority: i32,
    /// Delay before due.
    pub delay: Duration,
    /// Overrides the queue's max_attempts.
    pub max_attempts: Option<u32>,
    /// Print the result as JSON.
    pub json: bool,
}

const PUSH_CHUNK: usize = 10_000;

fn read_payloads(source: &PushSource, count: Option<usize>) -> Result<Vec<Vec<u8>>, CliError> {
    match source {
        PushSource::Payload(p) => {
            serde_json::from_str::<serde_json::Value>(p)
                .map_err(|e| CliError::Usage(format!("--payload is not valid JSON: {e}")))?;
            Ok(vec![p.as_bytes().to_vec(); count.unwrap_or(1)])
        }
        PushSource::Count(n) => Ok((0..*n)
            .map(|i| format!("{{\"n\":{i}}}").into_bytes())
            .collect()),
        PushSource::File(path) => {
            let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                let f = std::fs::File::open(path)
                    .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
                Box::new(std::io::BufReader::new(f))
            };
            let name = if path.as_os_str() == "-" {
                "stdin".to_string()
            } else {
                path.display().to_string()
            };
            // Every line is checked before anything is sent, so a bad line enqueues nothing.
            let mut out = Vec::new();
            for (i, line) in reader.lines().enumerate() {
                let line = line.map_err(|e| CliError::Runtime(anyhow::anyhow!("{name}: {e}")))?;
                if line.trim().is_empty() {
                    continue;
                }
                serde_json::from_str::<serde_json::Value>(&line).map_err(|e| {
                    CliError::Usage(format!("{name}:{}: not a JSON payload: {e}", i + 1))
                })?;
                out.push(line.into_bytes());
            }
            Ok(out)
        }
    }
}

/// `gaffer push`: enqueue one payload, a file of them, or synthetic ones, in bulk.
pub async fn push(global: &Global, args: &PushArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let payloads = read_payloads(&args.source, args.count)?;
    if args.id.is_some() && payloads.len() != 1 {
        return Err(CliError::Usage(
            "--id names one task; it cannot be used with several payloads".into(),
        ));
    }
    let client = global.connect(&cfg).await?;
    let q = queue_handle(&client, &cfg, &args.queue)?;
    let tasks: Vec<NewTask> = payloads
        .into_iter()
        .map(|p| NewTask {
            payload: p,
            id: args.id.clone(),
            priority: args.priority,
            delay: args.delay,
            at: None,
            max_attempts: args.max_attempts,
            submitted_by: Some("cli".into()),
        })
        .collect();
    let total = tasks.len();
    let show_progress = total > PUSH_CHUNK && std::io::stderr().is_terminal();
    let mut created = 0usize;
    let mut ids = Vec::new();
    for (i, chunk) in tasks.chunks(PUSH_CHUNK).enumerate() {
        let done = q.enqueue_many(chunk).await?;
        created += done.iter().filter(|e| e.created).count();
        if total == 1 {
            ids = done.into_iter().map(|e| e.id).collect();
        }
        if show_progress {
            eprint!("\rpush: {}/{total}", ((i + 1) * PUSH_CHUNK).min(total));
        }
    }
    if show_progress {
        eprintln!();
    }
    if args.json {
        println!(
            "{}",
            json!({"queue": args.queue, "tasks": total, "created": created,
                   "existing": total - created, "ids": ids})
        );
    } else if total == 1 {
        let what = if created == 1 {
            "enqueued"
        } else {
            "already pending"
        };
        println!(
            "{what}: {} task {}",
            args.queue,
            ids.first().map(String::as_str).unwrap_or("")
        );
    } else {
        println!(
            "enqueued {created} tasks to {} ({} already pending)",
            args.queue,
            total - created
        );
    }
    Ok(())
}

/// `gaffer stats`: every configured queue's counts, as a table or as the JSON contract.
pub async fn stats(global: &Global, json_out: bool) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    let snap = crate::cluster::snapshot::read(&client, &cfg).await?;
    if json_out {
        println!("{}", stats_json(&snap));
        return Ok(());
    }
    println!(
        "{:<24} {:>9} {:>9} {:>9} {:>7} {:>12} {:>12} {:>8} {:>8} {:>6} {:>6}",
        "queue",
        "ready",
        "delayed",
        "leased",
        "dead",
        "enqueued",
        "acked",
        "retried",
        "stale",
        "slots",
        "wanted"
    );
    for (name, q) in &snap.queues {
        let s = &q.stats;
        println!(
            "{:<24} {:>9} {:>9} {:>9} {:>7} {:>12} {:>12} {:>8} {:>8} {:>6} {:>6}",
            name,
            s.ready,
            s.delayed,
            s.leased,
            s.dead,
            s.enqueued_total,
            s.acked_total,
            s.retried_total,
            s.stale_total,
            q.slots,
            q.decision
                .as_ref()
                .map_or_else(|| "-".to_string(), |d| d.wanted.to_string()),
        );
    }
    if !snap.hosts.is_empty() {
        println!(
            "\n{:<24} {:>8} {:>6} {:>9} {:>10} {:>12} {:>6}",
            "host", "state", "slots", "capacity", "pss", "available", "load"
        );
        for (name, h) in &snap.hosts {
            let r = &h.report;
            println!(
                "{:<24} {:>8} {:>6} {:>9} {:>10} {:>12} {:>6.2}",
                name,
                h.state.as_str(),
                r.slots,
                r.capacity,
                bytesize::ByteSize(r.pss_bytes).to_string(),
                bytesize::ByteSize(r.mem_available_bytes).to_string(),
                r.load1
            );
        }
    }
    let m = &snap.manager;
    match &m.holder {
        Some(id) => println!(
            "\nmanager {id} epoch {} (map version {})",
            m.epoch.unwrap_or(0),
            m.map_version.unwrap_or(0)
        ),
        None => println!("\nmanager: none holds the lease (map and decisions are stale)"),
    }
    Ok(())
}

/// The `stats --json` document (a contract: keys are added, never renamed).
pub fn stats_json(snap: &crate::cluster::snapshot::Snapshot) -> serde_json::Value {
    use crate::cluster::snapshot::HostState;
    let qs: serde_json::Map<String, serde_json::Value> = snap
        .queues
        .iter()
        .map(|(name, q)| {
            let s = &q.stats;
            let d = q.decision.as_ref();
            (
                name.clone(),
                json!({
                    "ready": s.ready, "delayed": s.delayed, "leased": s.leased, "dead": s.dead,
                    "slots": q.slots,
                    "mapped": q.mapped,
                    "wanted": d.map(|d| d.wanted),
                    "load": d.and_then(|d| d.load),
                    "reasons": d.map(|d| d.reasons.clone()),
                    "paused": q.paused,
                    "priority": q.priority, "min_slots": q.min_slots, "max_slots": q.max_slots,
                    "enqueued_total": s.enqueued_total, "acked_total": s.acked_total,
                    "retried_total": s.retried_total, "dead_total": s.dead_total,
                    "stale_total": s.stale_total, "expired_total": s.expired_total,
                    "processed_total": q.processed_total, "failed_total": q.failed_total,
                    "busy_seconds_total": q.busy_seconds_total,
                    "recycles_total": q.recycles_total, "crashes_total": q.crashes_total,
                }),
            )
        })
        .collect();
    let hosts: serde_json::Map<String, serde_json::Value> = snap
        .hosts
        .iter()
        .map(|(name, h)| {
            let r = &h.report;
            (
                name.clone(),
                json!({
                    "alive": h.state != HostState::Dead, "state": h.state.as_str(),
                    "draining": r.draining, "drain_requested": h.drain_requested,
                    "capacity": r.capacity, "slots": r.slots, "pss_bytes": r.pss_bytes,
                    "mem_available_bytes": r.mem_available_bytes,
                    "memory_budget_bytes": r.memory_budget_bytes, "load1": r.load1,
                    "cpus": r.cpus, "handlers": r.handlers, "map_version": r.map_version,
                    "last_seen_ms": r.ts_ms,
                    "queues": r.queues.iter().map(|(q, qr)| (q.clone(), json!(qr.slots)))
                        .collect::<serde_json::Map<_, _>>(),
                }),
            )
        })
        .collect();
    let m = &snap.manager;
    json!({
        "queues": qs,
        "hosts": hosts,
        "manager": {
            "epoch": m.map_epoch,
            "map_version": m.map_version,
            "leader": m.holder,
            "lease_epoch": m.epoch,
            "lease_ttl_ms": m.lease_ttl_ms,
            "stale": m.stale(),
        },
    })
}

/// The `tasks` subcommands.
#[derive(Debug, Clone)]
pub enum TasksCmd {
    /// List dead letters.
    Dead {
        /// Queue.
        queue: String,
        /// How many, oldest first.
        limit: usize,
        /// JSON lines instead of a table.
        json: bool,
    },
    /// Requeue dead letters (the given ids, or all).
    Requeue {
        /// Queue.
        queue: String,
        /// Ids; empty = all.
        ids: Vec<String>,
    },
    /// Purge dead letters (the given ids, or all).
    Purge {
        /// Queue.
        queue: String,
        /// Ids; empty = all.
        ids: Vec<String>,
        /// Skip the confirmation asked on a terminal.
        yes: bool,
    },
    /// Cancel a task by id, whatever its state.
    Cancel {
        /// Queue.
        queue: String,
        /// Task id.
        id: String,
    },
    /// Show one task by id.
    Show {
        /// Queue.
        queue: String,
        /// Task id.
        id: String,
        /// JSON output.
        json: bool,
    },
}

fn preview(payload: &[u8], max: usize) -> String {
    let s = String::from_utf8_lossy(payload);
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max).collect::<String>())
    } else {
        s.into_owned()
    }
}

fn payload_json(payload: &[u8]) -> serde_json::Value {
    serde_json::from_slice(payload)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(payload).into()))
}

fn format_ms(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// `gaffer tasks …`.
pub async fn tasks(global: &Global, cmd: &TasksCmd) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    match cmd {
        TasksCmd::Dead { queue, limit, json } => {
            let q = queue_handle(&client, &cfg, queue)?;
            let dead = q.dead(0, *limit).await?;
            if *json {
                for d in &dead {
                    let mut v = serde_json::to_value(d).map_err(anyhow::Error::from)?;
                    v["payload"] = payload_json(&d.payload);
                    println!("{v}");
                }
            } else {
                println!(
                    "{:<24} {:<24} {:>8}  {:<40} payload",
                    "id", "died", "attempts", "error"
                );
                for d in &dead {
                    println!(
                        "{:<24} {:<24} {:>8}  {:<40} {}",
                        d.id,
                        format_ms(d.died_ms),
                        d.attempts,
                        preview(d.error.as_bytes(), 40),
                        preview(&d.payload, 60)
                    );
                }
                let total = q.stats().await?.dead;
                if total as usize > dead.len() {
                    println!("({} of {total} shown; --limit shows more)", dead.len());
                }
            }
        }
        TasksCmd::Requeue { queue, ids } => {
            let q = queue_handle(&client, &cfg, queue)?;
            let n = q
                .requeue_dead((!ids.is_empty()).then_some(&ids[..]))
                .await?;
            println!("requeued {n} dead letters of {queue}");
        }
        TasksCmd::Purge { queue, ids, yes } => {
            let q = queue_handle(&client, &cfg, queue)?;
            if ids.is_empty() && !yes && std::io::stdin().is_terminal() {
                let n = q.stats().await?.dead;
                eprint!("purge all {n} dead letters of {queue}? [y/N] ");
                let _ = std::io::stderr().flush();
                let mut answer = String::new();
                std::io::stdin()
                    .read_line(&mut answer)
                    .map_err(anyhow::Error::from)?;
                if !matches!(answer.trim(), "y" | "Y" | "yes") {
                    println!("nothing purged");
                    return Ok(());
                }
            }
            let n = q.purge_dead((!ids.is_empty()).then_some(&ids[..])).await?;
            println!("purged {n} dead letters of {queue}");
        }
        TasksCmd::Cancel { queue, id } => {
            let q = queue_handle(&client, &cfg, queue)?;
            match q.cancel(id).await? {
                Some(t) => println!("cancelled {queue} task {id} (was {})", t.state),
                None => {
                    return Err(CliError::Runtime(anyhow::anyhow!(
                        "no task {id:?} in queue {queue}"
                    )));
                }
            }
        }
        TasksCmd::Show { queue, id, json } => {
            let q = queue_handle(&client, &cfg, queue)?;
            let Some(t) = q.find(id).await? else {
                return Err(CliError::Runtime(anyhow::anyhow!(
                    "no task {id:?} in queue {queue}"
                )));
            };
            let mut v = serde_json::to_value(&t).map_err(anyhow::Error::from)?;
            v["payload"] = payload_json(&t.payload);
            if *json {
                println!("{v}");
            } else {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v).map_err(anyhow::Error::from)?
                );
            }
        }
    }
    Ok(())
}

/// Options of `bench`.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// Tasks per batch-100 run.
    pub tasks: usize,
    /// Payload size.
    pub payload_bytes: usize,
    /// Wake-up samples.
    pub samples: usize,
    /// Alternating rounds per figure.
    pub rounds: usize,
    /// JSON output.
    pub json: bool,
}

/// `gaffer bench`: the queue's figures beside the bare Lua loop's, same run, same Redis.
pub async fn bench(global: &Global, args: &BenchArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let (url, connect) = global.redis_target(&cfg)?;
    let opts = BenchOptions {
        url,
        connect,
        namespace: cfg.cluster.namespace.clone(),
        tasks: args.tasks,
        payload_bytes: args.payload_bytes,
        wake_samples: args.samples,
        rounds: args.rounds,
        ..Default::default()
    };
    let tty = std::io::stderr().is_terminal();
    let report = bench::run(&opts, |what| {
        if tty {
            eprint!("\r\x1b[2Kbench: {what}");
        } else {
            eprintln!("bench: {what}");
        }
    })
    .await?;
    if tty {
        eprintln!();
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(anyhow::Error::from)?
        );
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// `gaffer master`: runs this host's master until SIGTERM or Ctrl-C, then drains.
pub async fn master(
    global: &Global,
    host: Option<String>,
    http: Option<std::net::SocketAddr>,
) -> Result<(), CliError> {
    let (mut cfg, source) = global.load_source()?;
    if let Some(http) = http {
        cfg.master.http = http;
    }
    let (url, connect) = global.redis_target(&cfg)?;
    let host = host.unwrap_or_else(crate::master::sysinfo::host_name);
    let mut opts =
        crate::master::MasterOptions::new(cfg, source, url, host, global.registry.clone())
            .map_err(|e| CliError::Runtime(e.into()))?;
    opts.connect = connect;
    opts.config_path = Some(global.config_path());
    crate::master::run(opts, tokio_util::sync::CancellationToken::new())
        .await
        .map_err(CliError::Runtime)
}

/// `gaffer manager`: runs the cluster's manager until SIGTERM or Ctrl-C.
pub async fn manager(global: &Global, http: Option<std::net::SocketAddr>) -> Result<(), CliError> {
    let cfg = global.load()?;
    let (url, connect) = global.redis_target(&cfg)?;
    let id = format!(
        "{}:{}",
        crate::master::sysinfo::host_name(),
        std::process::id()
    );
    let http = http.unwrap_or(cfg.manager.http);
    let mut opts = crate::manager::ManagerOptions::new(cfg, url, id);
    opts.connect = connect;
    opts.http = Some(http);
    opts.custom_handlers = global.registry.custom_names();
    crate::manager::run(opts, tokio_util::sync::CancellationToken::new())
        .await
        .map_err(CliError::Runtime)
}

/// `gaffer up`: the whole cluster on this host until Ctrl-C.
pub async fn up(global: &Global, demo_load: bool, role_args: Vec<String>) -> Result<(), CliError> {
    let cfg = global.load()?;
    // Only an explicit Redis counts here: a state file names the Redis `up` itself started.
    let redis = global.redis.clone().or_else(|| cfg.cluster.redis.clone());
    let connect = match &redis {
        Some(_) => global.redis_target(&cfg)?.1,
        None => ConnectOptions::default(),
    };
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Runtime(anyhow::anyhow!("cannot find this program: {e}")))?;
    let opts = crate::up::UpOptions {
        config_path: global.config_path(),
        config: cfg,
        redis,
        connect,
        state_dir: global.state_dir(),
        demo_load,
        exe,
        role_args,
    };
    crate::up::run(opts, tokio_util::sync::CancellationToken::new())
        .await
        .map_err(CliError::Runtime)
}

/// `gaffer config apply`: validates the config, then publishes it with a new version.
pub async fn config_apply(global: &Global) -> Result<(), CliError> {
    let (cfg, source) = global.load_source()?;
    let client = global.connect(&cfg).await?;
    let keys = crate::cluster::Keys::new(&cfg.cluster.namespace);
    let version = crate::cluster::publish_config(&mut client.connection(), &keys, &source).await?;
    println!("published config version {version}: {}", cfg.summary());
    Ok(())
}

/// `gaffer drain HOST [--cancel]`.
pub async fn drain(global: &Global, host: &str, cancel: bool) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    let keys = crate::cluster::Keys::new(&cfg.cluster.namespace);
    let mut conn = client.connection();
    let known = crate::cluster::read_hosts(&mut conn, &keys).await?;
    if !known.contains_key(host) && !cancel {
        eprintln!("warning: no master has registered as {host:?} (yet); draining it anyway");
    }
    let changed = crate::cluster::set_draining(&mut conn, &keys, host, !cancel).await?;
    let what = if cancel {
        "takes slots again"
    } else {
        "is draining"
    };
    let note = if changed { "" } else { " (already)" };
    println!("{host} {what}{note}");
    Ok(())
}

/// `gaffer top`: the dashboard, refreshed every `refresh`, until q or Ctrl-C. It starts
/// even while Redis is unreachable, and says so until it can read.
pub async fn top(global: &Global, refresh: std::time::Duration) -> Result<(), CliError> {
    let cfg = global.load()?;
    let (url, connect) = global.redis_target(&cfg)?;
    crate::tui::run(crate::tui::TopOptions {
        config_label: global.config_path().display().to_string(),
        cfg,
        url,
        connect,
        refresh,
        custom_handlers: global.registry.custom_names(),
    })
    .await?;
    Ok(())
}

/// `gaffer pause QUEUE` and `gaffer resume QUEUE`.
pub async fn pause(global: &Global, queue: &str, paused: bool) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    queue_handle(&client, &cfg, queue)?;
    let keys = crate::cluster::Keys::new(&cfg.cluster.namespace);
    let mut conn = client.connection();
    let changed = crate::cluster::set_paused(&mut conn, &keys, queue, paused).await?;
    let what = if paused { "paused" } else { "resumed" };
    let note = if changed { "" } else { " (already)" };
    println!("{queue} {what}{note}");
    Ok(())
}

/// `gaffer simulate TRACE`: the balancer offline; needs no Redis.
pub fn simulate(
    global: &Global,
    trace: &std::path::Path,
    policy: crate::simulate::Policy,
    json_out: bool,
) -> Result<(), CliError> {
    let cfg = global.load()?;
    let text = std::fs::read_to_string(trace)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", trace.display())))?;
    let trace = crate::simulate::trace::parse(&text, &trace.display().to_string())
        .map_err(CliError::Usage)?;
    let report = crate::simulate::run(&cfg, &trace, policy).map_err(CliError::Usage)?;
    if json_out {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| CliError::Runtime(e.into()))?
        );
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
