//! `gaffer trace record --hours N -o FILE`: the cluster's own recorded load as a trace
//! for `gaffer simulate`, so a changed config can be tried on yesterday's load before
//! `config apply`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::cli::{CliError, Global};
use crate::manager::ring::{self, RingKeys};
use crate::simulate::recorded::{self, RecordedHosts};

/// `gaffer trace` commands.
#[derive(Subcommand)]
pub enum TraceCmd {
    /// Write a trace of the load the manager recorded (per queue arrivals and mean task
    /// time per period, and the hosts) for `gaffer simulate`
    Record(RecordArgs),
}

/// Arguments of `gaffer trace record`.
#[derive(Args)]
pub struct RecordArgs {
    /// How far back, in hours (the manager keeps a day of minutes)
    #[arg(long, default_value_t = MAX_HOURS, value_parser = hours)]
    pub hours: f64,
    /// The trace file to write
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

/// The longest look back: the manager keeps [`ring::RING_LEN`] periods, a day of minutes.
const MAX_HOURS: f64 = 24.0;

fn hours(text: &str) -> Result<f64, String> {
    let h: f64 = text
        .parse()
        .map_err(|_| format!("--hours `{text}` is not a number"))?;
    if !(h > 0.0 && h <= MAX_HOURS) {
        return Err(format!(
            "--hours {h} is out of range: more than 0, at most {MAX_HOURS}"
        ));
    }
    Ok(h)
}

/// `gaffer trace`.
pub async fn run(global: &Global, cmd: TraceCmd) -> Result<(), CliError> {
    match cmd {
        TraceCmd::Record(args) => record(global, args).await,
    }
}

/// Reads the rings of the config's queues over the last `hours`, writes the trace.
async fn record(global: &Global, args: RecordArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    let mut conn = client.connection();
    let keys = RingKeys::new(&cfg.cluster.namespace);
    let since_ms = crate::cluster::now_ms().saturating_sub((args.hours * 3.6e6) as u64);
    let ring_error = |e: ring::RingError| CliError::Runtime(e.into());
    let mut queues = BTreeMap::new();
    for name in cfg.queues.keys() {
        let entries = ring::read_queue(&mut conn, &keys, name, since_ms)
            .await
            .map_err(ring_error)?;
        queues.insert(name.clone(), entries);
    }
    let hosts = ring::read_hosts(&mut conn, &keys, since_ms)
        .await
        .map_err(ring_error)?;
    let recorded = RecordedHosts {
        slot_memory: cfg.master.slot_estimate,
    };
    let Some(text) = recorded::render(&queues, &hosts, recorded) else {
        return Err(CliError::Runtime(anyhow::anyhow!(
            "no load recorded in the last {} h: is a manager leading on this Redis?",
            args.hours
        )));
    };
    std::fs::write(&args.output, text).map_err(|e| {
        CliError::Runtime(anyhow::anyhow!(
            "cannot write {}: {e}",
            args.output.display()
        ))
    })?;
    println!(
        "{}: {} periods of {} queues",
        args.output.display(),
        hosts.len(),
        queues.len()
    );
    Ok(())
}
