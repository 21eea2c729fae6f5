//! `gaffer bench`: the queue's figures beside a bare Lua loop.

use std::io::IsTerminal;

use clap::Args;

use crate::bench::BenchOptions;
use crate::cli::{CliError, Global};

/// Arguments of `gaffer bench`.
#[derive(Args)]
pub struct BenchArgs {
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
}

/// `gaffer bench`: the queue's figures beside the bare Lua loop's, same run, same Redis.
pub async fn run(global: &Global, args: BenchArgs) -> Result<(), CliError> {
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
        ..Default::default()
    };
    let tty = std::io::stderr().is_terminal();
    let report = crate::bench::run(&opts, |what| {
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
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
