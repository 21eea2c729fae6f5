//! `gaffer schedules [--json] | pause NAME | resume NAME | delete NAME`: every schedule
//! (the config's and the ones stored through the api) with its state and fires, and the
//! run-time switches on them.

use clap::{Args, Subcommand};

use crate::cli::{CliError, Global};
use crate::cluster::{self, Keys};
use crate::config::Config;
use crate::printable::printable;
use crate::queue_client::QueueClient;
use crate::schedule::store::{self, View, rfc3339};
use crate::schedule::{Schedule, Source};

/// Arguments of `gaffer schedules`: alone it lists; a subcommand switches one.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SchedulesArgs {
    /// What to do instead of listing
    #[command(subcommand)]
    pub command: Option<SchedulesCmd>,
    /// Print {"schedules": [{"name", "queue", "cron" | "every", "timezone", "until",
    /// "payload", "owner", "source", "state", "created_ms", "last_fire_ms",
    /// "next_fire_ms"}]}, as `GET /v1/schedules` answers an admin key
    #[arg(long)]
    pub json: bool,
}

/// `gaffer schedules …`.
#[derive(Subcommand)]
pub enum SchedulesCmd {
    /// Pause a schedule: its due moments are skipped until it is resumed
    ///
    /// Works on the config's schedules and the stored ones alike; the pause lives in Redis
    /// and holds across manager failovers. Skipped moments are not made up on resume.
    Pause(NameArg),
    /// Resume a paused schedule: it fires again from its next due moment
    Resume(NameArg),
    /// Delete a schedule stored through the api; it fires no more
    ///
    /// A config schedule cannot be deleted here: remove its [[schedules]] entry and run
    /// `gaffer config apply`.
    Delete(NameArg),
}

/// The schedule a subcommand works on.
#[derive(Args)]
pub struct NameArg {
    /// The schedule's name (`gaffer schedules` lists them)
    pub name: String,
}

/// Runs `gaffer schedules` or one of its subcommands.
pub async fn run(global: &Global, args: SchedulesArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    match args.command {
        None => list(&cfg, &client, args.json).await,
        Some(SchedulesCmd::Pause(a)) => pause(&cfg, &client, &a.name, true).await,
        Some(SchedulesCmd::Resume(a)) => pause(&cfg, &client, &a.name, false).await,
        Some(SchedulesCmd::Delete(a)) => delete(&cfg, &client, &a.name).await,
    }
}

/// Every schedule: the config's in file order, then the stored ones by name.
async fn list(cfg: &Config, client: &QueueClient, json: bool) -> Result<(), CliError> {
    let keys = Keys::new(&cfg.cluster.namespace);
    let stored = store::read(&mut client.connection(), &keys).await?;
    let views = store::views(cfg, &stored, cluster::now_ms() as i64);
    if json {
        let doc = serde_json::json!({ "schedules": views });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    print_table(&views);
    for (name, why) in &stored.unreadable {
        println!(
            "unreadable: stored schedule {} ({}): it does not fire",
            printable(name),
            printable(why)
        );
    }
    Ok(())
}

fn print_table(views: &[View]) {
    println!(
        "{:<24} {:<18} {:<20} {:<16} {:<9} {:<20} {:<20} source",
        "name", "queue", "rule", "tz", "state", "last", "next"
    );
    let time = |ms: Option<i64>| ms.map_or_else(|| "-".to_string(), short_time);
    for v in views {
        let rule = match (&v.cron, &v.every) {
            (Some(c), _) => format!("cron {c}"),
            (None, Some(e)) => format!("every {e}"),
            (None, None) => "-".into(),
        };
        let source = match v.source {
            Source::Config => "config".to_string(),
            Source::Api => format!("api ({})", printable(&v.owner)),
        };
        println!(
            "{:<24} {:<18} {:<20} {:<16} {:<9} {:<20} {:<20} {source}",
            printable(&v.name),
            printable(&v.queue),
            rule,
            v.timezone,
            v.state.as_str(),
            time(v.last_fire_ms),
            time(v.next_fire_ms),
        );
    }
}

/// `ms` in UTC to the second: `2026-11-23T18:00:00Z`.
fn short_time(ms: i64) -> String {
    rfc3339(ms / 1000 * 1000)
}

/// The schedule named `name`, the config's or stored; unknown is bad usage.
async fn find(
    cfg: &Config,
    client: &QueueClient,
    name: &str,
) -> Result<(Option<Schedule>, Option<Schedule>), CliError> {
    let keys = Keys::new(&cfg.cluster.namespace);
    let configured = cfg.schedules.iter().find(|s| s.name == name).cloned();
    let stored = store::get(&mut client.connection(), &keys, name).await?;
    if configured.is_none() && stored.is_none() {
        return Err(CliError::Usage(format!(
            "no schedule {}: `gaffer schedules` lists them",
            printable(name)
        )));
    }
    Ok((configured, stored))
}

/// `gaffer schedules pause|resume NAME`.
async fn pause(
    cfg: &Config,
    client: &QueueClient,
    name: &str,
    paused: bool,
) -> Result<(), CliError> {
    find(cfg, client, name).await?;
    let keys = Keys::new(&cfg.cluster.namespace);
    let changed = store::set_paused(&mut client.connection(), &keys, name, paused).await?;
    let what = if paused { "paused" } else { "resumed" };
    let note = if changed { "" } else { " (already)" };
    println!("schedule {} {what}{note}", printable(name));
    Ok(())
}

/// `gaffer schedules delete NAME`: a stored schedule only.
async fn delete(cfg: &Config, client: &QueueClient, name: &str) -> Result<(), CliError> {
    let (_, stored) = find(cfg, client, name).await?;
    let Some(stored) = stored else {
        return Err(CliError::Usage(format!(
            "schedule {} is defined in the config: remove its [[schedules]] entry and run `gaffer config apply`",
            printable(name)
        )));
    };
    let keys = Keys::new(&cfg.cluster.namespace);
    if !store::delete(&mut client.connection(), &keys, name, None).await? {
        return Err(CliError::Usage(format!(
            "no schedule {}: deleted meanwhile",
            printable(name)
        )));
    }
    println!(
        "schedule {} deleted (queue {}, {} {}, made by {})",
        printable(name),
        printable(&stored.queue),
        stored.rule.kind(),
        stored.rule.text(),
        printable(stored.owner())
    );
    Ok(())
}
