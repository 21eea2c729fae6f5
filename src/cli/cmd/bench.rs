//! `gaffer bench`: the queue's figures beside a bare Lua loop.

use std::io::IsTerminal;

use clap::{Args, Subcommand};

use crate::bench::BenchOptions;
use crate::bench::api::ApiBenchOptions;
use crate::bench::e2e::{E2eOptions, Prefetch};
use crate::cli::{CliError, Global};

/// Arguments of `gaffer bench`.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// Another measurement than the queue's
    #[command(subcommand)]
    pub command: Option<BenchCmd>,
    /// Tasks per run at batch 100 (batch 10 uses half, batch 1 a tenth)
    #[arg(long, default_value_t = 100_000)]
    pub tasks: usize,
    /// Payload size in bytes
    #[arg(long, default_value_t = 16)]
    pub payload_bytes: usize,
    /// Idle wake-up latency samples
    #[arg(long, default_value_t = 500)]
    pub samples: usize,
    /// Rounds per figure, gaffer and the bare loop alternating; each side's median is reported
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    /// End to end instead: a manager and a master with --slots no-op slots drain the tasks,
    /// timed from the first ack to the last, beside both bare loops
    #[arg(long)]
    pub e2e: bool,
    /// No-op slots of the end-to-end run (and bare takers beside them)
    #[arg(long, default_value_t = 2, requires = "e2e")]
    pub slots: u32,
    /// Batch sizes of the end-to-end run, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "100", requires = "e2e")]
    pub batch: Vec<usize>,
    /// The end-to-end queue's slots prefetch (prefetch = true, lease and max_batch_time 30s)
    #[arg(long, requires = "e2e")]
    pub prefetch: bool,
    /// The end-to-end queue keeps a record per task (track = true), as a queue does by
    /// default; without it the queue runs untracked
    #[arg(long, requires = "e2e")]
    pub track: bool,
}

/// `gaffer bench …`.
#[derive(Subcommand)]
pub enum BenchCmd {
    /// The task service: single and bulk submits, latency at a fixed rate, sync wake-up
    ///
    /// Starts an api instance on loopback over the configured Redis, with a bench queue and
    /// a key of its own (both gone afterwards), and measures it beside the library's own
    /// enqueue at the same concurrency.
    Api(ApiBenchArgs),
}

/// Arguments of `gaffer bench api`.
#[derive(Args)]
pub struct ApiBenchArgs {
    /// How long each throughput figure runs
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub duration: std::time::Duration,
    /// Keep-alive connections sending at once
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Tasks per bulk submit
    #[arg(long, default_value_t = 1000)]
    pub bulk: usize,
    /// Requests per second of the fixed-rate latency figure
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Sync submits whose wake-up is timed
    #[arg(long, default_value_t = 300)]
    pub samples: usize,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

/// A token Ctrl-C (or SIGTERM) cancels, so that a bench stopped early deletes its queues
/// and keys (and stops the roles `--e2e` started) before the process exits; a second one
/// stops at once.
fn stop_on_interrupt() -> Result<tokio_util::sync::CancellationToken, CliError> {
    let stop = crate::signals::stop_on_term().map_err(|e| CliError::Runtime(e.into()))?;
    tokio::spawn(async move {
        stop.second.cancelled().await;
        std::process::exit(130);
    });
    Ok(stop.first)
}

/// `gaffer bench`: the queue's figures beside the bare Lua loop's, same run, same Redis.
pub async fn run(global: &Global, args: BenchArgs) -> Result<(), CliError> {
    if let Some(BenchCmd::Api(api)) = args.command {
        return run_api(global, api).await;
    }
    let cfg = global.load()?;
    let (url, connect) = global.redis_target(&cfg)?;
    // The library's input, built here and only here.
    let opts = BenchOptions {
        url,
        connect,
        namespace: cfg.cluster.namespace.clone(),
        tasks: args.tasks,
        payload_bytes: args.payload_bytes,
        wake_samples: args.samples,
        rounds: args.rounds,
        stop: stop_on_interrupt()?,
        ..Default::default()
    };
    let tty = std::io::stderr().is_terminal();
    let progress = |what: &str| {
        if tty {
            eprint!("\r\x1b[2Kbench: {what}");
        } else {
            eprintln!("bench: {what}");
        }
    };
    if args.e2e {
        return run_e2e(opts, &args, progress, tty).await;
    }
    let report = crate::bench::run(&opts, progress).await?;
    print_report(tty, args.json, &report, || report.table())
}

/// `gaffer bench --e2e`.
async fn run_e2e(
    base: BenchOptions,
    args: &BenchArgs,
    progress: impl FnMut(&str),
    tty: bool,
) -> Result<(), CliError> {
    if let Some(&b) = args
        .batch
        .iter()
        .find(|&&b| b == 0 || b > crate::queue_client::MAX_BATCH)
    {
        return Err(CliError::Usage(format!(
            "--batch {b} is out of range: 1 to {}",
            crate::queue_client::MAX_BATCH
        )));
    }
    let opts = E2eOptions {
        base,
        exe: std::env::current_exe()
            .map_err(|e| anyhow::anyhow!("finding this executable: {e}"))?,
        slots: args.slots.max(1),
        batches: args.batch.clone(),
        prefetch: if args.prefetch {
            Prefetch::On
        } else {
            Prefetch::Off
        },
        track: args.track,
    };
    let report = crate::bench::e2e::run(&opts, progress).await?;
    print_report(tty, args.json, &report, || report.table())
}

/// Ends the progress line on a terminal, then prints a report as JSON or as its table.
fn print_report(
    tty: bool,
    json: bool,
    report: &impl serde::Serialize,
    table: impl FnOnce() -> String,
) -> Result<(), CliError> {
    if tty {
        eprintln!();
    }
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{}", table());
    }
    Ok(())
}

/// `gaffer bench api`.
async fn run_api(global: &Global, args: ApiBenchArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let (url, connect) = global.redis_target(&cfg)?;
    let opts = ApiBenchOptions {
        url,
        connect,
        namespace: cfg.cluster.namespace.clone(),
        seconds: args.duration.as_secs_f64(),
        connections: args.connections.max(1),
        bulk: args.bulk.clamp(1, crate::queue_client::MAX_BATCH),
        rate: args.rate.max(1.0),
        wait_samples: args.samples,
        stop: stop_on_interrupt()?,
    };
    let report = crate::bench::api::run(&opts, |what| eprintln!("bench api: {what}")).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
