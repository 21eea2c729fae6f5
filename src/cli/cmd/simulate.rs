//! `gaffer simulate TRACE`: the balancer offline.

use std::path::PathBuf;

use clap::Args;

use crate::cli::{CliError, Global};

/// Arguments of `gaffer simulate`.
#[derive(Args)]
pub struct SimulateArgs {
    /// The trace file (TOML)
    pub trace: PathBuf,
    /// Who decides the slots: gaffer's balancer, the KEDA/HPA rule, or min_slots
    #[arg(long, value_enum, default_value = "gaffer")]
    pub policy: crate::simulate::Policy,
    /// Print the report as one JSON object
    #[arg(long)]
    pub json: bool,
}

/// `gaffer simulate TRACE`: runs the trace over the config's queues; needs no Redis.
pub fn run(global: &Global, args: SimulateArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let path = &args.trace;
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
    let trace = crate::simulate::trace::parse(&text, &path.display().to_string())
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let report = crate::simulate::run(&cfg, &trace, args.policy)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
