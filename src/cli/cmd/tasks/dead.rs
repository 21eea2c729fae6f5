//! `gaffer tasks dead | requeue | purge`: the dead letters.

use std::io::{IsTerminal, Write};

use clap::Args;

use crate::cli::common::{format_ms, open_queue, payload_json, preview};
use crate::cli::{CliError, Global};

/// Arguments of `gaffer tasks dead`.
#[derive(Args)]
pub struct DeadArgs {
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
    pub queue: String,
    pub ids: Vec<String>,
}

/// Arguments of `gaffer tasks purge`.
#[derive(Args)]
pub struct PurgeArgs {
    pub queue: String,
    pub ids: Vec<String>,
    /// Do not ask
    #[arg(long, short)]
    pub yes: bool,
}

/// `gaffer tasks dead QUEUE`: dead letters, oldest first, as a table or JSON lines.
pub async fn list(global: &Global, args: DeadArgs) -> Result<(), CliError> {
    let (_, q) = open_queue(global, &args.queue).await?;
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
            d.id,
            format_ms(d.died_ms),
            d.attempts,
            preview(d.error.as_bytes(), 40),
            preview(&d.payload, 60)
        );
    }
    let total = q.stats().await?.dead;
    if total as usize > dead.len() {
        println!("({} of {total} shown; --limit shows more)", dead.len());
    }
    Ok(())
}

/// `gaffer tasks requeue QUEUE [ID…]`.
pub async fn requeue(global: &Global, args: RequeueArgs) -> Result<(), CliError> {
    let (_, q) = open_queue(global, &args.queue).await?;
    let ids = &args.ids;
    let n = q
        .requeue_dead((!ids.is_empty()).then_some(&ids[..]))
        .await?;
    println!("requeued {n} dead letters of {}", args.queue);
    Ok(())
}

/// `gaffer tasks purge QUEUE [ID…]`: asks first on a terminal when purging all.
pub async fn purge(global: &Global, args: PurgeArgs) -> Result<(), CliError> {
    let (_, q) = open_queue(global, &args.queue).await?;
    let (queue, ids) = (&args.queue, &args.ids);
    if ids.is_empty() && !args.yes && std::io::stdin().is_terminal() {
        let n = q.stats().await?.dead;
        eprint!("purge all {n} dead letters of {queue}? [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin()
            .read_line(&mut answer)
            .map_err(anyhow::Error::from)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("nothing purged");
            return Ok(());
        }
    }
    let n = q.purge_dead((!ids.is_empty()).then_some(&ids[..])).await?;
    println!("purged {n} dead letters of {queue}");
    Ok(())
}
