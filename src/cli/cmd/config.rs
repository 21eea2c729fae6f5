//! `gaffer config check | apply`.

use clap::Subcommand;

use crate::cli::{CliError, Global};

/// `gaffer config …`.
#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Check the config: every error with file:line:col and the key; exit 2 on error
    Check,
    /// Validate the config and publish it to Redis; running manager and masters adopt it
    /// within a tick, without a restart
    Apply,
}

/// `gaffer config check`: the summary on stdout, or every error on stderr and exit 2.
pub fn check(global: &Global) -> Result<(), CliError> {
    let cfg = global.load()?;
    println!("{}", cfg.summary());
    Ok(())
}

/// `gaffer config apply`: validates the config, then publishes it with a new version.
pub async fn apply(global: &Global) -> Result<(), CliError> {
    let (cfg, source) = global.load_source()?;
    let client = global.connect(&cfg).await?;
    let keys = crate::cluster::Keys::new(&cfg.cluster.namespace);
    let version = crate::cluster::publish_config(&mut client.connection(), &keys, &source).await?;
    println!("published config version {version}: {}", cfg.summary());
    Ok(())
}
