//! `gaffer system [NAME [pause|resume|disable|enable]] [--json]`: external systems at run
//! time, switched or listed with their state, queues, caps and use.

use std::io::IsTerminal;

use clap::{Args, ValueEnum};

use crate::cli::{CliError, Global};
use crate::cluster::snapshot::{self, SystemView};
use crate::queue_client::{SweepProgress, SystemChange, SystemError, SystemState};

/// Arguments of `gaffer system`.
#[derive(Args)]
pub struct SystemArgs {
    /// System name (a [systems.NAME] of the config); without it, every system is listed
    pub system: Option<String>,
    /// Switch it: pause holds its queues' tasks, disable cancels them (and every new one),
    /// resume and enable make it active again
    #[arg(value_enum, requires = "system")]
    pub action: Option<Switch>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// What `gaffer system NAME ACTION` does.
#[derive(Clone, Copy, ValueEnum)]
pub enum Switch {
    /// Its queues take nothing; their tasks wait, noted
    Pause,
    /// Active again after a pause
    Resume,
    /// Its queues' waiting and new tasks are cancelled
    Disable,
    /// Active again after a disable
    Enable,
}

impl Switch {
    fn state(self) -> SystemState {
        match self {
            Switch::Pause => SystemState::Paused,
            Switch::Disable => SystemState::Disabled,
            Switch::Resume | Switch::Enable => SystemState::Active,
        }
    }
}

/// `gaffer system`: switches a system when asked, then prints the state of the one named
/// (or of every system).
pub async fn run(global: &Global, args: SystemArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    if let Some(name) = &args.system
        && !cfg.systems.contains_key(name)
    {
        return Err(SystemError::Unknown(name.clone()).into());
    }
    let client = global.connect(&cfg).await?;
    if let (Some(name), Some(action)) = (&args.system, args.action) {
        // The switch holds from its first step on; the sweep after it (a note or a cancel
        // per waiting task) can take minutes on a backlog, so it says how far it got. Cut
        // short, the manager's tick goes on with it.
        let tty = std::io::stderr().is_terminal();
        let mut last_line: Option<std::time::Instant> = None;
        let mut progress = |p: &SweepProgress| {
            let verb = match action.state() {
                SystemState::Disabled => "cancelled",
                _ => "noted",
            };
            if tty {
                eprint!("\r\x1b[2Ksystem {name}: {} {verb} in {}", p.done, p.queue);
            } else if last_line.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(1)) {
                // (a line a second at most where it goes to a log)
                eprintln!("system {name}: {} {verb} in {}", p.done, p.queue);
                last_line = Some(std::time::Instant::now());
            }
        };
        let change = client
            .set_system_reporting(&cfg, name, action.state(), &mut progress)
            .await?;
        if tty {
            eprint!("\r\x1b[2K");
        }
        print_change(&change, args.json)?;
        return Ok(());
    }
    let snap = snapshot::read(&client, &cfg).await?;
    let shown: Vec<(&String, &SystemView)> = snap
        .systems
        .iter()
        .filter(|(n, _)| args.system.as_ref().is_none_or(|s| s == *n))
        .collect();
    if args.json {
        let all = snapshot::stats_json(&snap);
        let mut out = serde_json::Map::new();
        for (name, _) in &shown {
            out.insert((*name).clone(), all["systems"][name.as_str()].clone());
        }
        println!("{}", serde_json::Value::Object(out));
        return Ok(());
    }
    print_table(&shown);
    Ok(())
}

impl From<SystemError> for CliError {
    fn from(e: SystemError) -> Self {
        match e {
            SystemError::Unknown(_) => CliError::Usage(e.to_string()),
            SystemError::Queue(e) => e.into(),
        }
    }
}

fn print_change(change: &SystemChange, json: bool) -> Result<(), CliError> {
    if json {
        println!("{}", serde_json::to_string(change)?);
        return Ok(());
    }
    let mut line = format!(
        "{}: {} (was {})",
        change.system,
        change.state.as_str(),
        change.was.as_str()
    );
    if change.cancelled > 0 {
        line.push_str(&format!(", {} waiting tasks cancelled", change.cancelled));
    }
    if change.noted > 0 {
        line.push_str(&format!(", {} waiting tasks held", change.noted));
    }
    println!("{line}");
    Ok(())
}

fn print_table(systems: &[(&String, &SystemView)]) {
    println!(
        "{:<20} {:<9} {:>5} {:>8} {:>9} {:>10}  queues",
        "system", "state", "slots", "max_conc", "rate/s", "started"
    );
    for (name, s) in systems {
        let state = if s.switched {
            s.state.as_str().to_string()
        } else {
            format!("{} (config)", s.state.as_str())
        };
        println!(
            "{:<20} {:<9} {:>5} {:>8} {:>9} {:>10}  {}",
            name,
            state,
            s.slots,
            s.max_concurrency.map_or("-".into(), |m| m.to_string()),
            s.rate_per_second.map_or("-".into(), |r| format!("{r}")),
            s.started_total,
            s.queues.join(", ")
        );
    }
}
