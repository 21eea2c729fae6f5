//! `gaffer tasks dead | requeue | purge`: the dead letters.

use clap::Args;

use crate::cli::common::{
    Standing, ask, format_ms, must_ask, open_any_queue, payload_json, preview, refuse_retired,
};
use crate::cli::{CliError, Global};
use crate::printable::{one_line, printable};

/// Arguments of `gaffer tasks dead`.
#[derive(Args)]
pub struct DeadArgs {
    /// The queue whose dead letters are listed
    pub queue: String,
    /// How many to list
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// One JSON object per line
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `gaffer tasks requeue`.
#[derive(Args)]
pub struct RequeueArgs {
    /// The queue whose dead letters go back to wait
    pub queue: String,
    /// The dead letters to requeue; none: all of them
    pub ids: Vec<String>,
}

/// Arguments of `gaffer tasks purge`.
#[derive(Args)]
pub struct PurgeArgs {
    /// The queue whose dead letters are deleted
    pub queue: String,
    /// The dead letters to delete; none: all of them (asked first on a terminal, and
    /// refused without one unless --yes)
    pub ids: Vec<String>,
    /// Purge all without asking
    #[arg(long, short)]
    pub yes: bool,
}

/// `gaffer tasks dead QUEUE`: dead letters, oldest first, as a table or JSON lines; of a
/// retired queue too.
pub async fn list(global: &Global, args: DeadArgs) -> Result<(), CliError> {
    let (q, _) = open_any_queue(global, &args.queue).await?;
    let dead = q.dead(0, args.limit).await?;
    if args.json {
        for d in &dead {
            let mut v = serde_json::to_value(d)?;
            v["payload"] = payload_json(&d.payload);
            println!("{v}");
        }
        return Ok(());
    }
    println!(
        "{:<24} {:<24} {:>8}  {:<40} payload",
        "id", "died", "attempts", "error"
    );
    for d in &dead {
        println!(
            "{:<24} {:<24} {:>8}  {:<40} {}",
            printable(&d.id),
            format_ms(d.died_ms),
            d.attempts,
            one_line(&preview(d.error.as_bytes(), 40)),
            one_line(&preview(&d.payload, 60))
        );
    }
    let total = q.stats().await?.dead;
    if total as usize > dead.len() {
        println!("({} of {total} shown; --limit shows more)", dead.len());
    }
    Ok(())
}

/// `gaffer tasks requeue QUEUE [ID…]`; refused on a retired queue, where no slot would
/// take them.
pub async fn requeue(global: &Global, args: RequeueArgs) -> Result<(), CliError> {
    let (q, standing) = open_any_queue(global, &args.queue).await?;
    if standing == Standing::Retired {
        return Err(refuse_retired(&args.queue, "requeue its dead letters"));
    }
    let ids = &args.ids;
    let n = q
        .requeue_dead((!ids.is_empty()).then_some(&ids[..]))
        .await?;
    println!("requeued {n} dead letters of {}", args.queue);
    all_named_found(&args.queue, ids, n)
}

/// An error (exit 1, as for a cancel of an unknown task) when fewer dead letters were
/// moved than distinct ids were named.
fn all_named_found(queue: &str, ids: &[String], moved: u64) -> Result<(), CliError> {
    let named = ids.iter().collect::<std::collections::BTreeSet<_>>().len() as u64;
    if ids.is_empty() || moved >= named {
        return Ok(());
    }
    Err(CliError::Runtime(anyhow::anyhow!(
        "{} of the {named} ids named are not dead letters of {queue}",
        named - moved
    )))
}

/// `gaffer tasks purge QUEUE [ID…]`: asks first on a terminal when purging all; works on
/// a retired queue too.
pub async fn purge(global: &Global, args: PurgeArgs) -> Result<(), CliError> {
    let (q, _) = open_any_queue(global, &args.queue).await?;
    let (queue, ids) = (&args.queue, &args.ids);
    let refusal = || {
        format!(
            "purging every dead letter of {queue} needs --yes where no terminal can ask (or name the ids)"
        )
    };
    if ids.is_empty() && must_ask(args.yes, refusal)? {
        let n = q.stats().await?.dead;
        if !ask(&format!("purge all {n} dead letters of {queue}?"))? {
            println!("nothing purged");
            return Ok(());
        }
    }
    let n = q.purge_dead((!ids.is_empty()).then_some(&ids[..])).await?;
    println!("purged {n} dead letters of {queue}");
    all_named_found(queue, ids, n)
}
