//! `gaffer top`: the terminal dashboard.

use std::time::Duration;

use clap::Args;

use crate::cli::{CliError, Global};

/// Arguments of `gaffer top`.
#[derive(Args)]
pub struct TopArgs {
    /// How often to re-read the cluster
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub refresh: Duration,
}

/// `gaffer top`: the dashboard, refreshed every `refresh`, until q or Ctrl-C. It starts
/// even while Redis is unreachable, and says so until it can read.
pub async fn run(global: &Global, args: TopArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let (url, connect) = global.redis_target(&cfg)?;
    let shutdown = crate::signals::shutdown_on_term().map_err(|e| {
        CliError::Runtime(anyhow::anyhow!("cannot install the signal handlers: {e}"))
    })?;
    let opts = crate::tui::TopOptions {
        config_label: global.config_path().display().to_string(),
        cfg,
        url,
        connect,
        refresh: args.refresh,
        custom_handlers: global.registry.custom_names(),
    };
    crate::tui::run(opts, shutdown).await?;
    Ok(())
}
