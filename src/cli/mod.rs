//! The `gaffer` command line. Lives in the library so a team's own binary gets the same
//! CLI: its `main` calls [`run`]. Each command is a module of [`cmd`] holding its
//! arguments (clap) beside the function that runs it; this module parses, picks how the
//! command runs (without a runtime, on a lean one, on a threaded one) and maps failures
//! to exit codes: 0 ok, 1 runtime failure, 2 bad usage or bad config (README,
//! "Commands").

pub mod cmd;
mod common;

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use crate::cluster::snapshot::stats_json;
pub use common::{CliError, Global};

use crate::slot::Registry;
use cmd::{
    api, bench, config, drain, intake, manager, master, migrate, pause, push, queues, schedules,
    simulate, stats, system,
};
use cmd::{tasks, top, trace, up};

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
    // (the variable's value is not shown in --help: it may hold a password)
    #[arg(
        long,
        global = true,
        env = "GAFFER_REDIS",
        hide_env_values = true,
        value_name = "URL"
    )]
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
pub enum LogFormat {
    /// Human-readable lines with key=value fields.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Validate or publish the config
    #[command(subcommand)]
    Config(config::ConfigCmd),
    /// Enqueue tasks: one payload, a file of JSON lines, or synthetic ones
    Push(push::PushArgs),
    /// Queue counts and counters (and, once those roles run, hosts and the manager)
    Stats(stats::StatsArgs),
    /// Inspect and repair tasks: records, listings, dead letters, freeze, cancel by id
    #[command(subcommand)]
    Tasks(tasks::TasksCmd),
    /// List the queues, and delete the data of those removed from the config
    ///
    /// A queue whose [queues.NAME] table is removed keeps its tasks, dead letters and
    /// records in Redis: it is retired, and no slot takes from it. The leading manager
    /// registers every queue name its config names, which is how gaffer finds them again:
    /// `queues list` shows every queue with its state and counts, `stats` the retired ones
    /// that hold data, and `tasks dead|list|show|purge|cancel` work on them (requeue and
    /// thaw are refused: nothing would take the tasks). `queues retire NAME` deletes all of
    /// a retired queue's data, asking first. A queue removed before the registry existed
    /// is not known: see docs/OPERATIONS.md, "Remove a queue".
    #[command(subcommand)]
    Queues(queues::QueuesCmd),
    /// List the schedules with their state and fires; pause, resume or delete one
    ///
    /// Every schedule: the config's [[schedules]] (an unnamed entry is QUEUE.N, N its
    /// position in the file from 0) and the ones stored through the api (`POST
    /// /v1/schedules`), each with its queue, rule, time zone, state (active, paused,
    /// ended, or shadowed: a stored one whose name the config took), last and next fire.
    /// The leading manager fires each once per due moment, across failovers. `pause` and
    /// `resume` work on both kinds (the paused set lives in Redis; moments skipped while
    /// paused are not made up); `delete` removes a stored one. An unknown name exits 2.
    Schedules(schedules::SchedulesArgs),
    /// Measure the queue on the configured Redis, beside a bare Lua loop in the same run
    Bench(bench::BenchArgs),
    /// Run the whole cluster on this host: a local redis-server, the manager and a master
    ///
    /// Redis is started in the state directory (data kept between runs) unless the config
    /// or --redis names one. Other commands run against the same config find it. Ctrl-C
    /// drains the master, stops the manager and then Redis; a second Ctrl-C kills.
    Up(up::UpArgs),
    /// Run this host's master: preload handlers, fork and supervise slots, report
    ///
    /// Follows this host's part of the slot map in Redis. SIGTERM or Ctrl-C drains: slots
    /// finish the task in hand and give the rest of their batch back (up to
    /// [master].drain_timeout), the host is deregistered.
    /// SIGHUP re-reads the config file.
    Master(master::MasterArgs),
    /// Run the cluster's manager: decide slots per queue and host, publish the slot map
    ///
    /// Run one per cluster under pacemaker; a second one is a harmless standby: a
    /// leadership lease with a fencing epoch lets one write at a time. Also fires the
    /// schedules, the config's and the ones stored through the api. SIGTERM or Ctrl-C releases the lease for a standby.
    Manager(manager::ManagerArgs),
    /// Terminal dashboard: queues, the slot map, hosts; pause, resume, drain, requeue
    ///
    /// Reads Redis only, so it works while the manager is down (its lease then shows as
    /// stale). Keys: ? for help, q to quit.
    Top(top::TopArgs),
    /// Stop placing slots on a host: its slots stop after their batch and move elsewhere
    Drain(drain::DrainArgs),
    /// Run the balancer offline over a trace file and print a report
    ///
    /// The queues come from the config, the hosts and the load from TRACE (see
    /// docs/SIMULATION.md). Deterministic: the same trace and seed give the same report.
    Simulate(simulate::SimulateArgs),
    /// Record the cluster's own load as a trace for `simulate`
    ///
    /// The leading manager keeps, per queue, arrivals and mean task time per minute for a
    /// day (and the hosts); `trace record --hours N -o FILE` writes them as a trace, so
    /// `simulate` answers what a changed config would have done to that load.
    #[command(subcommand)]
    Trace(trace::TraceCmd),
    /// Pause a queue: its slots stop after their batch, tasks wait
    Pause(pause::QueueArg),
    /// Resume a paused queue
    Resume(pause::QueueArg),
    /// Show or switch whether a queue accepts new tasks: open, closed or cancel
    ///
    /// Without a value, prints the intake in force and where it comes from. A value sets
    /// the run-time switch, which wins over the config's `intake` until --reset drops it.
    /// closed refuses new tasks; cancel records them as cancelled at once.
    Intake(intake::IntakeArgs),
    /// Show or switch external systems: pause, resume, disable, enable
    ///
    /// Without a name, lists every [systems.NAME] with its state, queues, caps and use.
    /// pause holds its queues' tasks (they wait, with a note); disable cancels its queues'
    /// waiting tasks and every new one with the note "system NAME is disabled".
    System(system::SystemArgs),
    /// Move queues' data to this gaffer's layout, while producers and slots run
    ///
    /// Each queue's `conf` hash records its layout version; this gaffer's scripts refuse a
    /// queue of another one ("queue Q has layout 1, this gaffer needs layout 2"). Migrate
    /// works in atomic calls of bounded size (--budget), keeping its position in the
    /// queue, so Ctrl-C (or --calls) leaves it to a later run. The previous release's
    /// slots and producers may run meanwhile; this release's wait until it ends. Progress
    /// on stderr; see docs/OPERATIONS.md "Upgrade".
    Migrate(migrate::MigrateArgs),
    /// Run the task service (HTTP): submit, view, list, cancel, freeze and thaw tasks
    ///
    /// Listens on [api].listen (or --listen). Stateless: run any number behind a load
    /// balancer. SIGTERM or Ctrl-C stops it. `gaffer api hash-token` prints the value a
    /// key's token_sha256 takes.
    Api(api::ApiArgs),
    /// Internal: the master's forking helper (started by the master itself)
    #[command(name = "__zygote", hide = true)]
    Zygote,
}

impl Command {
    /// The log filter when GAFFER_LOG does not set one: long-running roles log what they
    /// do at info; one-shot commands only problems.
    fn default_log_filter(&self) -> &'static str {
        match self {
            Command::Master(_) | Command::Manager(_) | Command::Zygote | Command::Up(_) => "info",
            Command::Api(a) if a.command.is_none() => "info",
            _ => "warn",
        }
    }
}

/// Parses the command line and runs the command with the handlers of `registry`;
/// a team's own binary calls this from its `main`.
pub fn run(registry: Registry) -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.command.default_log_filter());
    let global = Global {
        config: cli.config,
        redis: cli.redis,
        state_dir: cli.state_dir,
        registry,
    };
    match dispatch(cli.command, &global, cli.log_format) {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Config(lines)) => {
            eprintln!("{lines}");
            ExitCode::from(2)
        }
        Err(e) => {
            // (an error may quote what Redis holds: an id, a host name)
            eprintln!(
                "gaffer: {}",
                crate::printable::printable_lines(&format!("{e:#}"))
            );
            e.exit_code()
        }
    }
}

/// Runs one command, and is the one place that decides how: synchronous commands run on
/// this thread without a runtime, roles on a current-thread runtime, the rest on a
/// multi-threaded one. Only the runtime of the chosen arm is ever built.
fn dispatch(command: Command, global: &Global, log_format: LogFormat) -> Result<(), CliError> {
    use Runtime::{Lean, Threaded};
    match command {
        // Before any runtime exists: the zygote must stay single-threaded to fork.
        Command::Zygote => crate::master::zygote::main(&global.registry),
        Command::Config(config::ConfigCmd::Check) => config::check(global),
        Command::Simulate(args) => simulate::run(global, args),
        Command::Api(api::ApiArgs {
            command: Some(api::ApiCmd::HashToken),
            ..
        }) => api::hash_token(),
        Command::Master(args) => Lean.block_on(master::run(global, args)),
        Command::Manager(args) => Lean.block_on(manager::run(global, args)),
        Command::Up(args) => Lean.block_on(up::run(global, args, log_format)),
        Command::Api(args) => Threaded.block_on(api::serve(global, args)),
        Command::Config(config::ConfigCmd::Apply) => Threaded.block_on(config::apply(global)),
        Command::Push(args) => Threaded.block_on(push::run(global, args)),
        Command::Stats(args) => Threaded.block_on(stats::run(global, args)),
        Command::Tasks(cmd) => Threaded.block_on(tasks::run(global, cmd)),
        Command::Queues(cmd) => Threaded.block_on(queues::run(global, cmd)),
        Command::Schedules(args) => Threaded.block_on(schedules::run(global, args)),
        Command::Bench(args) => Threaded.block_on(bench::run(global, args)),
        Command::Top(args) => Threaded.block_on(top::run(global, args)),
        Command::Drain(args) => Threaded.block_on(drain::run(global, args)),
        Command::Pause(args) => Threaded.block_on(pause::run(global, args, true)),
        Command::Resume(args) => Threaded.block_on(pause::run(global, args, false)),
        Command::Intake(args) => Threaded.block_on(intake::run(global, args)),
        Command::System(args) => Threaded.block_on(system::run(global, args)),
        Command::Migrate(args) => Threaded.block_on(migrate::run(global, args)),
        Command::Trace(cmd) => Threaded.block_on(trace::run(global, cmd)),
    }
}

/// The tokio runtime an async command gets.
#[derive(Clone, Copy)]
enum Runtime {
    /// Everything on the main thread: lean, and the master's zygote has its PDEATHSIG
    /// tied to the thread that spawned it, which must live as long as the master.
    Lean,
    /// Worker threads, for commands that do many Redis calls at once.
    Threaded,
}

impl Runtime {
    /// Builds the runtime and runs `work` on it to its end.
    fn block_on(self, work: impl Future<Output = Result<(), CliError>>) -> Result<(), CliError> {
        let mut builder = match self {
            Runtime::Lean => tokio::runtime::Builder::new_current_thread(),
            Runtime::Threaded => tokio::runtime::Builder::new_multi_thread(),
        };
        let rt = builder
            .enable_all()
            .build()
            .map_err(|e| CliError::Runtime(e.into()))?;
        rt.block_on(work)
    }
}

/// Installs the global subscriber: stderr, the GAFFER_LOG filter, text or JSON lines.
fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GAFFER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }

    /// `--help` explains every argument and flag of every command an operator sees.
    #[test]
    fn every_argument_has_help() {
        fn missing(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && !arg.is_hide_set() {
                    out.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
                missing(sub, &format!("{path} {}", sub.get_name()), out);
            }
        }
        let mut out = Vec::new();
        missing(&super::Cli::command(), "gaffer", &mut out);
        assert!(out.is_empty(), "arguments without help: {out:#?}");
    }
}
