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
        // Kept, so a host can be drained before it starts; shown by `stats` until undone.
        let names: Vec<&str> = known.keys().map(String::as_str).collect();
        eprintln!(
            "warning: no master has registered as {host:?} (yet); marking it anyway (known hosts: {}; `gaffer drain {host} --cancel` drops the mark)",
            if names.is_empty() {
                "none".to_string()
            } else {
                crate::printable::printable(&names.join(", ")).into_owned()
            }
        );
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
