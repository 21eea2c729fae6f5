//! The `gaffer` command line: argument parsing and dispatch only; the work is in the
//! library. Lives in the library so a team's own binary gets the same CLI.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::cli::{self, BenchArgs, CliError, Global, PushArgs, PushSource, TasksCmd};
use crate::slot::Registry;
use clap::{Args, Parser, Subcommand};

/// gaffer supervises clusters of queue workers on Redis.
///
/// Operators register queue types in one TOML file; gaffer decides how many worker
/// processes each queue gets, on which host, starts them and keeps them healthy.
#[derive(Parser)]
#[command(name = "gaffer", version, propagate_version = true)]
struct Cli {
    /// Config file [default: ./config.toml, then /etc/gaffer/config.toml]
    #[arg(long, global = true, env = "GAFFER_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// Redis URL, overriding [cluster].redis (redis://[user:password@]host:port/db)
    #[arg(long, global = true, env = "GAFFER_REDIS", value_name = "URL")]
    redis: Option<String>,
    /// Log lines on stderr: `text` (time, level, message, key=value fields) or `json` (one
    /// object per line). The level comes from GAFFER_LOG, an env filter such as
    /// `info` or `warn,gaffer::manager=debug` [default: info for daemons, warn otherwise]
    #[arg(
        long,
        global = true,
        env = "GAFFER_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    /// Where `gaffer up` keeps its local Redis and state; other commands look there for the
    /// Redis of a running `up` when the config names none [default: .gaffer beside the config]
    #[arg(long, global = true, env = "GAFFER_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines with key=value fields.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Validate or publish the config
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Enqueue tasks: one payload, a file of JSON lines, or synthetic ones
    Push(PushOpts),
    /// Queue counts and counters (and, once those roles run, hosts and the manager)
    Stats {
        /// Print the JSON document scripts rely on
        #[arg(long)]
        json: bool,
    },
    /// Inspect and repair tasks: dead letters, cancel by id
    #[command(subcommand)]
    Tasks(TasksOpts),
    /// Measure the queue on the configured Redis, beside a bare Lua loop in the same run
    Bench(BenchOpts),
    /// Run the whole cluster on this host: a local redis-server, the manager and a master
    ///
    /// Redis is started in the state directory (data kept between runs) unless the config
    /// or --redis names one. Other commands run against the same config find it. Ctrl-C
    /// drains the master, stops the manager and then Redis; a second Ctrl-C kills.
    Up {
        /// Push a built-in load to every queue: a wave per queue, each behind the last, so
        /// slots move between queues (watch with `gaffer top`)
        #[arg(long)]
        demo_load: bool,
    },
    /// Run this host's master: preload handlers, fork and supervise slots, report
    ///
    /// Follows this host's part of the slot map in Redis. SIGTERM or Ctrl-C drains: slots
    /// finish their batch (up to [master].drain_timeout), the host is deregistered.
    /// SIGHUP re-reads the config file.
    Master(MasterOpts),
    /// Run the cluster's manager: decide slots per queue and host, publish the slot map
    ///
    /// Run one per cluster under pacemaker; a second one is a harmless standby: a
    /// leadership lease with a fencing epoch lets one write at a time. Also fires the
    /// config's schedules. SIGTERM or Ctrl-C releases the lease for a standby.
    Manager(ManagerOpts),
    /// Terminal dashboard: queues, the slot map, hosts; pause, resume, drain, requeue
    ///
    /// Reads Redis only, so it works while the manager is down (its lease then shows as
    /// stale). Keys: ? for help, q to quit.
    Top {
        /// How often to re-read the cluster
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
        refresh: Duration,
    },
    /// Stop placing slots on a host: its slots stop after their batch and move elsewhere
    Drain {
        /// Host name as the master registered it (see `gaffer stats`)
        host: String,
        /// Undo: the host takes slots again
        #[arg(long)]
        cancel: bool,
    },
    /// Run the balancer offline over a trace file and print a report
    ///
    /// The queues come from the config, the hosts and the load from TRACE (see
    /// docs/SIMULATION.md). Deterministic: the same trace and seed give the same report.
    Simulate {
        /// The trace file (TOML)
        trace: PathBuf,
        /// Who decides the slots: gaffer's balancer, the KEDA/HPA rule, or min_slots
        #[arg(long, value_enum, default_value = "gaffer")]
        policy: crate::simulate::Policy,
        /// Print the report as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Pause a queue: its slots stop after their batch, tasks wait
    Pause {
        /// Queue name
        queue: String,
    },
    /// Resume a paused queue
    Resume {
        /// Queue name
        queue: String,
    },
    /// Internal: the master's forking helper (started by the master itself)
    #[command(name = "__zygote", hide = true)]
    Zygote,
}

#[derive(Args)]
struct MasterOpts {
    /// Host name to register as [default: the system's host name]
    #[arg(long, env = "GAFFER_HOST")]
    host: Option<String>,
    /// Address for /metrics and /status, overriding [master].http
    #[arg(long, env = "GAFFER_MASTER_HTTP", value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
}

#[derive(Args)]
struct ManagerOpts {
    /// Address for /metrics and /status, overriding [manager].http
    #[arg(long, env = "GAFFER_MANAGER_HTTP", value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Check the config: every error with file:line:col and the key; exit 2 on error
    Check,
    /// Validate the config and publish it to Redis; running manager and masters adopt it
    /// within a tick, without a restart
    Apply,
}

#[derive(Args)]
struct PushOpts {
    /// Queue to enqueue to (must be in the config)
    queue: String,
    /// One JSON payload
    #[arg(long, group = "source")]
    payload: Option<String>,
    /// One JSON payload per line; '-' reads stdin. Every line is checked before any is sent
    #[arg(long, group = "source", value_name = "PATH")]
    file: Option<PathBuf>,
    /// Number of tasks: synthetic payloads {"n": i}, or copies of --payload
    #[arg(long)]
    count: Option<usize>,
    /// Dedup id: while a task with this id is pending or leased, it is not enqueued again
    #[arg(long)]
    id: Option<String>,
    /// Higher is taken first
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Not due before this long from now (e.g. 30s, 5m, 2h)
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    delay: Duration,
    /// Attempts before dead letters, overriding the queue's max_attempts
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Print the result as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum TasksOpts {
    /// List dead letters, oldest first
    Dead {
        queue: String,
        /// How many to list
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// One JSON object per line
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back in the queue with their attempts reset (all, or the given ids)
    Requeue { queue: String, ids: Vec<String> },
    /// Delete dead letters (all, or the given ids); asks first on a terminal
    Purge {
        queue: String,
        ids: Vec<String>,
        /// Do not ask
        #[arg(long, short)]
        yes: bool,
    },
    /// Remove a task by id, whatever its state; a leased task's settle will be refused
    Cancel { queue: String, id: String },
    /// Show one task by id
    Show {
        queue: String,
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct BenchOpts {
    /// Tasks per run at batch 100 (batch 10 uses half, batch 1 a tenth)
    #[arg(long, default_value_t = 100_000)]
    tasks: usize,
    /// Payload size in bytes
    #[arg(long, default_value_t = 16)]
    payload_bytes: usize,
    /// Idle wake-up latency samples
    #[arg(long, default_value_t = 500)]
    samples: usize,
    /// Rounds per figure, gaffer and the bare loop alternating; each side's median is reported
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Print the report as JSON
    #[arg(long)]
    json: bool,
}

/// Parses the command line and runs the command with the handlers of `registry`;
/// a team's own binary calls this from its `main`.
pub fn run(registry: Registry) -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.command.is_daemon());
    let global = Global {
        config: cli.config,
        redis: cli.redis,
        state_dir: cli.state_dir,
        registry,
    };
    let result = match cli.command {
        // Before any runtime exists: the zygote must stay single-threaded to fork.
        Command::Zygote => crate::master::zygote::main(&global.registry),
        Command::Config(ConfigCmd::Check) => cli::config_check(&global),
        Command::Simulate {
            trace,
            policy,
            json,
        } => cli::simulate(&global, &trace, policy, json),
        Command::Master(m) => current_thread_runtime()
            .and_then(|rt| rt.block_on(cli::master(&global, m.host, m.http))),
        Command::Up { demo_load } => {
            let role_args = match cli.log_format {
                LogFormat::Text => vec![],
                LogFormat::Json => vec!["--log-format".to_string(), "json".to_string()],
            };
            current_thread_runtime()
                .and_then(|rt| rt.block_on(cli::up(&global, demo_load, role_args)))
        }
        Command::Manager(m) => {
            current_thread_runtime().and_then(|rt| rt.block_on(cli::manager(&global, m.http)))
        }
        other => runtime().and_then(|rt| rt.block_on(run_async(&global, other))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gaffer: {e:#}");
            e.exit_code()
        }
    }
}

impl Command {
    /// Long-running roles log what they do at info; one-shot commands only problems.
    fn is_daemon(&self) -> bool {
        matches!(
            self,
            Command::Master(_) | Command::Manager(_) | Command::Zygote | Command::Up { .. }
        )
    }
}

/// Installs the global subscriber: stderr, the GAFFER_LOG filter, text or JSON lines.
fn init_logging(format: LogFormat, daemon: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GAFFER_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if daemon { "info" } else { "warn" })
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

/// The master runs everything on its main thread: lean, and the zygote's PDEATHSIG is
/// tied to the thread that spawned it, which must live as long as the master.
fn current_thread_runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Runtime(e.into()))
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Runtime(e.into()))
}

async fn run_async(global: &Global, command: Command) -> Result<(), CliError> {
    match command {
        Command::Config(ConfigCmd::Check)
        | Command::Zygote
        | Command::Master(_)
        | Command::Manager(_)
        | Command::Up { .. }
        | Command::Simulate { .. } => {
            unreachable!("handled before")
        }
        Command::Push(p) => {
            let source = match (p.payload, p.file, p.count) {
                (Some(payload), None, _) => PushSource::Payload(payload),
                (None, Some(file), None) => PushSource::File(file),
                (None, None, Some(n)) => PushSource::Count(n),
                (None, Some(_), Some(_)) => {
                    return Err(CliError::Usage("--count cannot be used with --file".into()));
                }
                _ => {
                    return Err(CliError::Usage(
                        "push needs one of --payload JSON, --file PATH or --count N".into(),
                    ));
                }
            };
            let args = PushArgs {
                queue: p.queue,
                count: if matches!(source, PushSource::Payload(_)) {
                    p.count
                } else {
                    None
                },
                source,
                id: p.id,
                priority: p.priority,
                delay: p.delay,
                max_attempts: p.max_attempts,
                json: p.json,
            };
            cli::push(global, &args).await
        }
        Command::Stats { json } => cli::stats(global, json).await,
        Command::Top { refresh } => cli::top(global, refresh).await,
        Command::Config(ConfigCmd::Apply) => cli::config_apply(global).await,
        Command::Drain { host, cancel } => cli::drain(global, &host, cancel).await,
        Command::Pause { queue } => cli::pause(global, &queue, true).await,
        Command::Resume { queue } => cli::pause(global, &queue, false).await,
        Command::Tasks(t) => {
            let cmd = match t {
                TasksOpts::Dead { queue, limit, json } => TasksCmd::Dead { queue, limit, json },
                TasksOpts::Requeue { queue, ids } => TasksCmd::Requeue { queue, ids },
                TasksOpts::Purge { queue, ids, yes } => TasksCmd::Purge { queue, ids, yes },
                TasksOpts::Cancel { queue, id } => TasksCmd::Cancel { queue, id },
                TasksOpts::Show { queue, id, json } => TasksCmd::Show { queue, id, json },
            };
            cli::tasks(global, &cmd).await
        }
        Command::Bench(b) => {
            let args = BenchArgs {
                tasks: b.tasks,
                payload_bytes: b.payload_bytes,
                samples: b.samples,
                rounds: b.rounds,
                json: b.json,
            };
            cli::bench(global, &args).await
        }
    }
}
