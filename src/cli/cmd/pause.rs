//! `gaffer pause QUEUE` and `gaffer resume QUEUE`.

use clap::Args;

use crate::cli::common::queue_handle;
use crate::cli::{CliError, Global};

/// The argument of `gaffer pause` and `gaffer resume`.
#[derive(Args)]
pub struct QueueArg {
    /// Queue name
    pub queue: String,
}

/// `gaffer pause QUEUE` (`paused`) and `gaffer resume QUEUE` (not `paused`).
pub async fn run(global: &Global, args: QueueArg, paused: bool) -> Result<(), CliError> {
    let queue = args.queue;
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    queue_handle(&client, &cfg, &queue)?;
    let keys = crate::cluster::Keys::new(&cfg.cluster.namespace);
    let mut conn = client.connection();
    let changed = crate::cluster::set_paused(&mut conn, &keys, &queue, paused).await?;
    let what = if paused { "paused" } else { "resumed" };
    let note = if changed { "" } else { " (already)" };
    println!("{queue} {what}{note}");
    Ok(())
}
