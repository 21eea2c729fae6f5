//! `gaffer manager`: the cluster's role.

use std::net::SocketAddr;

use clap::Args;

use crate::cli::{CliError, Global};

/// Arguments of `gaffer manager`.
#[derive(Args)]
pub struct ManagerArgs {
    /// Address for /metrics and /status, overriding [manager].http
    #[arg(long, env = "GAFFER_MANAGER_HTTP", value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Period of the load rings `gaffer trace record` reads (a minute); shorter for tests
    #[arg(long, env = "GAFFER_TRACE_PERIOD", value_name = "DURATION", hide = true,
          value_parser = crate::config::parse_duration)]
    pub trace_period: Option<std::time::Duration>,
}

/// `gaffer manager`: runs the cluster's manager until SIGTERM or Ctrl-C.
pub async fn run(global: &Global, args: ManagerArgs) -> Result<(), CliError> {
    let (cfg, source) = global.load_source()?;
    let (url, connect) = global.redis_target(&cfg)?;
    let id = format!(
        "{}:{}",
        crate::master::sysinfo::host_name(),
        std::process::id()
    );
    let http = args.http.unwrap_or(cfg.manager.http);
    let mut opts = crate::manager::ManagerOptions::new(cfg, url, id);
    opts.connect = connect;
    opts.file_source = Some(source);
    opts.http = Some(http);
    opts.custom_handlers = global.registry.custom_names();
    if let Some(period) = args.trace_period {
        opts.trace_period = period;
    }
    let shutdown = crate::signals::shutdown_on_term()
        .map_err(|e| CliError::Runtime(anyhow::anyhow!("installing signal handlers: {e}")))?;
    crate::manager::run(opts, shutdown)
        .await
        .map_err(CliError::Runtime)
}
