//! `gaffer queues list | retire`: the queues of the config beside the retired ones (named
//! by a config the manager ran once, not by this one), and the deletion of a retired
//! queue's data.

use clap::{Args, Subcommand};

use crate::cli::common::{ask, must_ask};
use crate::cli::{CliError, Global};
use crate::cluster::snapshot::{RetiredView, holdings_json, read_holdings, retired_names};
use crate::cluster::{self, Keys};
use crate::config::Config;
use crate::printable::printable;
use crate::queue_client::{QueueClient, QueueLimits};

/// `gaffer queues …`.
#[derive(Subcommand)]
pub enum QueuesCmd {
    /// Every queue: the config's and the retired ones, with their state and counts
    List(ListArgs),
    /// Delete all of a retired queue's data (tasks, dead letters, records, counters)
    ///
    /// Refused for a queue the config names, or one no manager has registered. Shows what
    /// it deletes and asks first on a terminal; without one it needs --yes.
    Retire(RetireArgs),
}

/// Arguments of `gaffer queues list`.
#[derive(Args)]
pub struct ListArgs {
    /// Print {"queues": {NAME: {"state": "configured" | "retired", "holds_data", the
    /// counts as `stats --json` names them, "records", "refused"}}}
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gaffer queues retire`.
#[derive(Args)]
pub struct RetireArgs {
    /// The retired queue whose data is deleted
    pub queue: String,
    /// Delete without asking
    #[arg(long, short)]
    pub yes: bool,
}

/// Runs one `queues` subcommand.
pub async fn run(global: &Global, cmd: QueuesCmd) -> Result<(), CliError> {
    match cmd {
        QueuesCmd::List(args) => list(global, args).await,
        QueuesCmd::Retire(args) => retire(global, args).await,
    }
}

/// One row of `queues list`.
struct Row {
    name: String,
    retired: bool,
    held: RetiredView,
}

/// `gaffer queues list`: the config's queues, then the retired ones, by name.
async fn list(global: &Global, args: ListArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    let mut rows = Vec::new();
    for (name, qc) in &cfg.queues {
        let q = client.queue_with(name, QueueLimits::from(qc))?;
        let held = read_holdings(&q).await?;
        rows.push(Row {
            name: name.clone(),
            retired: false,
            held,
        });
    }
    for name in retired_names(&client, &cfg).await? {
        let held = read_holdings(&client.queue(&name)?).await?;
        rows.push(Row {
            name,
            retired: true,
            held,
        });
    }
    if args.json {
        let queues: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|r| {
                let mut v = holdings_json(&r.held);
                v["state"] = state(r.retired).into();
                v["holds_data"] = r.held.holds_data().into();
                (r.name.clone(), v)
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "queues": queues }))?
        );
        return Ok(());
    }
    print_rows(&rows);
    Ok(())
}

fn state(retired: bool) -> &'static str {
    if retired { "retired" } else { "configured" }
}

fn print_rows(rows: &[Row]) {
    println!(
        "{:<24} {:<10} {:>9} {:>9} {:>9} {:>7} {:>7}  records",
        "queue", "state", "ready", "delayed", "leased", "dead", "frozen"
    );
    for r in rows {
        let s = &r.held.stats;
        let records = match (&r.held.refused, r.held.records) {
            (Some(_), _) => "?",
            (None, true) => "yes",
            (None, false) => "no",
        };
        println!(
            "{:<24} {:<10} {:>9} {:>9} {:>9} {:>7} {:>7}  {records}",
            printable(&r.name),
            state(r.retired),
            s.ready,
            s.delayed,
            s.leased,
            s.dead,
            s.frozen,
        );
    }
    for r in rows {
        if let Some(reason) = &r.held.refused {
            println!("refused: {}", printable(reason));
        }
    }
    if rows.iter().any(|r| r.retired) {
        println!(
            "(retired: not in the config, no slot takes from them; `gaffer queues retire NAME` deletes one's data)"
        );
    }
}

/// `gaffer queues retire NAME`: checks that the queue is retired and served by nothing,
/// shows what goes, asks (or needs `--yes`), deletes every key of the queue in one call,
/// then forgets its name.
async fn retire(global: &Global, args: RetireArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let name = &args.queue;
    if cfg.queues.contains_key(name) {
        return Err(CliError::Usage(format!(
            "queue {name} is in the config; remove its table first"
        )));
    }
    let client = global.connect(&cfg).await?;
    let retired = retired_names(&client, &cfg).await?;
    if !retired.contains(name) {
        let list: Vec<&str> = retired.iter().map(String::as_str).collect();
        return Err(CliError::Usage(format!(
            "queue {name:?} is not in the config nor retired (no manager has run a config naming it; retired: {})",
            if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            }
        )));
    }
    if let Some(why) = still_served(global, &client, &cfg, name).await? {
        return Err(CliError::Usage(format!(
            "queue {name} is not retired everywhere: {why}"
        )));
    }
    let q = client.queue(name)?;
    let held = read_holdings(&q).await?;
    if let Some(reason) = held.refused {
        return Err(CliError::runtime(format!("cannot retire {name}: {reason}")));
    }
    let what = describe(&held);
    let refusal =
        || format!("retiring {name} deletes {what}: it needs --yes where no terminal can ask");
    if must_ask(args.yes, refusal)? && !ask(&format!("delete queue {name}: {what}?"))? {
        println!("nothing deleted");
        return Ok(());
    }
    // (one function call, so on a Redis Cluster too: every key of the queue shares its
    // hash tag; the name goes after, so a failure in between leaves it to retire again)
    q.delete_all().await?;
    let keys = Keys::new(&cfg.cluster.namespace);
    cluster::unregister_queue(&mut client.connection(), &keys, name).await?;
    println!("retired {name}: deleted {what}");
    Ok(())
}

/// Why slots may still take from `name` though the local config lacks it: the published
/// config (which the manager and masters run) names it, or the slot map gives it slots.
async fn still_served(
    global: &Global,
    client: &QueueClient,
    cfg: &Config,
    name: &str,
) -> Result<Option<String>, CliError> {
    let keys = Keys::new(&cfg.cluster.namespace);
    let mut conn = client.connection();
    let custom = global.registry.custom_names();
    let read =
        cluster::changed_config(&mut conn, &keys, &cluster::ConfigSeen::default(), &custom).await?;
    if let Some(published) = read.changed
        && let Ok(running) = &published.config
        && running.queues.contains_key(name)
    {
        return Ok(Some(format!(
            "the published config (version {}) names it; `gaffer config apply` this config first",
            published.version
        )));
    }
    let map = cluster::read_map(&mut conn, &keys).await?;
    let slots: u32 = map
        .iter()
        .flat_map(|m| m.hosts.values())
        .filter_map(|q| q.get(name))
        .sum();
    if slots > 0 {
        return Ok(Some(format!(
            "the slot map still gives it {slots} slots; wait for the manager's next map"
        )));
    }
    Ok(None)
}

/// What deleting the queue removes, in words: "its tasks (2 ready, 1 dead), records and
/// counters".
fn describe(held: &RetiredView) -> String {
    let s = &held.stats;
    let counts: Vec<String> = [
        (s.ready, "ready"),
        (s.delayed, "delayed"),
        (s.leased, "leased"),
        (s.dead, "dead"),
        (s.frozen, "frozen"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    let mut parts = Vec::new();
    if !counts.is_empty() {
        parts.push(format!("tasks ({})", counts.join(", ")));
    }
    if held.records {
        parts.push("records".to_string());
    }
    parts.push("counters".to_string());
    let last = parts.pop().unwrap_or_default();
    if parts.is_empty() {
        format!("its {last}")
    } else {
        format!("its {} and {last}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue_client::QueueStats;

    #[test]
    fn describe_names_what_goes() {
        let mut held = RetiredView::default();
        assert_eq!(describe(&held), "its counters");
        held.records = true;
        assert_eq!(describe(&held), "its records and counters");
        held.stats = QueueStats {
            ready: 2,
            dead: 1,
            ..QueueStats::default()
        };
        assert_eq!(
            describe(&held),
            "its tasks (2 ready, 1 dead), records and counters"
        );
    }
}
