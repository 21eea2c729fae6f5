//! `gaffer simulate TRACE [--compare OTHER.toml]`: the balancer offline.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::cli::{CliError, Global};
use crate::simulate::Report;

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
    /// Also run the trace with the queues of this config, and print both reports side by
    /// side (with --json: {"config": {"path", "report"}, "compare": {"path", "report"}})
    #[arg(long, value_name = "OTHER.toml")]
    pub compare: Option<PathBuf>,
}

/// `gaffer simulate TRACE`: runs the trace over the config's queues; needs no Redis.
pub fn run(global: &Global, args: SimulateArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let path = &args.trace;
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
    let trace = crate::simulate::trace::parse(&text, &path.display().to_string())
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let simulate = |cfg: &crate::config::Config| {
        crate::simulate::run(cfg, &trace, args.policy).map_err(|e| CliError::Usage(e.to_string()))
    };
    let report = simulate(&cfg)?;
    let Some(other_path) = &args.compare else {
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print!("{}", report.table());
        }
        return Ok(());
    };
    let other = load_other(global, other_path)?;
    let other_report = simulate(&other)?;
    if args.json {
        let side = |path: &Path, report: &Report| serde_json::json!({"path": path.display().to_string(), "report": report});
        let both = serde_json::json!({
            "config": side(&global.config_path(), &report),
            "compare": side(other_path, &other_report),
        });
        println!("{both}");
    } else {
        print!(
            "{}",
            side_by_side(
                (&global.config_path(), &report),
                (other_path, &other_report)
            )
        );
    }
    Ok(())
}

/// The config to compare with, loaded and checked like the main one (exit 2 with
/// file:line:col on an error).
fn load_other(global: &Global, path: &Path) -> Result<crate::config::Config, CliError> {
    let custom = global.registry.custom_names();
    let source = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
    crate::config::parse_with(&source, &path.display().to_string(), &custom)
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// Two reports' tables beside each other, each under its config's path.
fn side_by_side(left: (&Path, &Report), right: (&Path, &Report)) -> String {
    let (a, b) = (left.1.table(), right.1.table());
    let head_a = left.0.display().to_string();
    let head_b = right.0.display().to_string();
    let lines_a: Vec<&str> = std::iter::once(head_a.as_str()).chain(a.lines()).collect();
    let lines_b: Vec<&str> = std::iter::once(head_b.as_str()).chain(b.lines()).collect();
    let width = lines_a.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let rows = lines_a.len().max(lines_b.len());
    let mut out = String::new();
    for i in 0..rows {
        let l = lines_a.get(i).copied().unwrap_or("");
        let r = lines_b.get(i).copied().unwrap_or("");
        out.push_str(format!("{l:<width$} | {r}").trim_end());
        out.push('\n');
    }
    out
}
