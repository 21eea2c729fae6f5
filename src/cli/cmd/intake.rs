//! `gaffer intake QUEUE [open|closed|cancel] [--reset]`: whether a queue accepts new
//! tasks, switched at run time.

use clap::Args;
use clap::builder::{PossibleValuesParser, TypedValueParser};

use crate::cli::common::open_queue;
use crate::cli::{CliError, Global};
use crate::config::Intake;

/// Arguments of `gaffer intake`.
#[derive(Args)]
pub struct IntakeArgs {
    /// Queue name (must be in the config)
    pub queue: String,
    /// Set the run-time switch: open accepts new tasks, closed refuses them, cancel
    /// records them as cancelled at once
    #[arg(
        value_name = "INTAKE",
        value_parser = PossibleValuesParser::new(Intake::NAMES)
            .map(|s| Intake::parse(&s).unwrap_or_default()),
    )]
    pub value: Option<Intake>,
    /// Drop the run-time switch: the config's intake applies again
    #[arg(long, conflicts_with = "value")]
    pub reset: bool,
}

/// `gaffer intake`: prints the intake in force (and whether it is the run-time switch or
/// the config's value), after setting or dropping the switch when asked.
pub async fn run(global: &Global, args: IntakeArgs) -> Result<(), CliError> {
    let (_, q) = open_queue(global, &args.queue).await?;
    let configured = q.limits().intake;
    let queue = &args.queue;
    if let Some(value) = args.value {
        q.set_intake(Some(value)).await?;
        println!(
            "{queue}: intake {} (run-time switch; the config says {})",
            value.as_str(),
            configured.as_str()
        );
        return Ok(());
    }
    if args.reset {
        q.set_intake(None).await?;
    }
    let now = q.intake().await?;
    let from = match (args.reset, now == configured) {
        (true, _) => "no run-time switch: the config's value".to_string(),
        (false, true) => "the config's value".to_string(),
        (false, false) => format!("run-time switch; the config says {}", configured.as_str()),
    };
    println!("{queue}: intake {} ({from})", now.as_str());
    Ok(())
}
