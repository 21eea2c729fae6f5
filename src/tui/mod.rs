//! `gaffer top`: the terminal dashboard.

use std::time::Duration;

use crate::config::Config;
use crate::queue_client::QueueClient;

/// Runs the dashboard until the operator quits.
pub async fn run(_client: QueueClient, _cfg: Config, _refresh: Duration) -> anyhow::Result<()> {
    anyhow::bail!("gaffer top is not built yet")
}
