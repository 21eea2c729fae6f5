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
    /// Print {"queue", "intake", "configured", "switched"} as JSON: the intake in force,
    /// the config's, and whether a run-time switch is set
    #[arg(long)]
    pub json: bool,
}

/// `gaffer intake`: prints the intake in force (and whether it is the run-time switch or
/// the config's value), after setting or dropping the switch when asked.
pub async fn run(global: &Global, args: IntakeArgs) -> Result<(), CliError> {
    let (_, q) = open_queue(global, &args.queue).await?;
    let configured = q.limits().intake;
    let queue = &args.queue;
    if let Some(value) = args.value {
        q.set_intake(Some(value)).await?;
    } else if args.reset {
        q.set_intake(None).await?;
    }
    let switch = q.intake_switch().await?;
    let now = switch.unwrap_or(configured);
    if args.json {
        let out = serde_json::json!({
            "queue": queue,
            "intake": now.as_str(),
            "configured": configured.as_str(),
            "switched": switch.is_some(),
        });
        println!("{out}");
        return Ok(());
    }
    let from = match (switch, args.reset) {
        (Some(_), _) => format!("run-time switch; the config says {}", configured.as_str()),
        (None, true) => "no run-time switch: the config's value".to_string(),
        (None, false) => "the config's value".to_string(),
    };
    println!("{queue}: intake {} ({from})", now.as_str());
    Ok(())
}
