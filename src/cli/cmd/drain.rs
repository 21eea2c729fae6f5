//! `gaffer drain HOST [--cancel]`.

use clap::Args;

use crate::cli::{CliError, Global};

/// Arguments of `gaffer drain`.
#[derive(Args)]
pub struct DrainArgs {
    /// Host name as the master registered it (see `gaffer stats`)
    pub host: String,
    /// Undo: the host takes slots again
    #[arg(long)]
    pub cancel: bool,
}

/// `gaffer drain HOST [--cancel]`: the host gets no slots (or takes them again).
pub async fn run(global: &Global, args: DrainArgs) -> Result<(), CliError> {
    let DrainArgs { host, cancel } = args;
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    let keys = crate::cluster::Keys::new(&cfg.cluster.namespace);
    let mut conn = client.connection();
    let known = crate::cluster::read_hosts(&mut conn, &keys).await?;
    if !known.contains_key(&host) && !cancel {
        eprintln!("warning: no master has registered as {host:?} (yet); draining it anyway");
    }
    let changed = crate::cluster::set_draining(&mut conn, &keys, &host, !cancel).await?;
    let what = if cancel {
        "takes slots again"
    } else {
        "is draining"
    };
    let note = if changed { "" } else { " (already)" };
    println!("{host} {what}{note}");
    Ok(())
}
