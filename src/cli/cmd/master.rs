//! `gaffer master`: this host's role.

use std::net::SocketAddr;

use crate::cli::{CliError, Global};
use clap::Args;

/// Arguments of `gaffer master`.
#[derive(Args)]
pub struct MasterArgs {
    /// Host name to register as [default: the system's host name]
    #[arg(long, env = "GAFFER_HOST")]
    pub host: Option<String>,
    /// Address for /metrics and /status, overriding [master].http
    #[arg(long, env = "GAFFER_MASTER_HTTP", value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Above this one-minute load average per CPU the host takes no more slots; raise it
    /// where other work shares the host and its load says nothing of gaffer's (a test or
    /// build machine)
    #[arg(long, env = "GAFFER_MAX_LOAD_PER_CPU", value_name = "LOAD", default_value_t = 4.0,
        value_parser = positive_load)]
    pub max_load_per_cpu: f64,
}

/// A load ceiling: a number greater than zero.
fn positive_load(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!(
            "expected a number greater than zero, found {text:?}"
        )),
    }
}

/// `gaffer master`: runs this host's master until SIGTERM or Ctrl-C, then drains.
pub async fn run(global: &Global, args: MasterArgs) -> Result<(), CliError> {
    let (mut cfg, source) = global.load_source()?;
    if let Some(http) = args.http {
        cfg.master.http = http;
    }
    let (url, connect) = global.redis_target(&cfg)?;
    let host = args.host.unwrap_or_else(crate::master::sysinfo::host_name);
    let mut opts =
        crate::master::MasterOptions::new(cfg, source, url, host, global.registry.clone())
            .map_err(|e| CliError::Runtime(e.into()))?;
    opts.connect = connect;
    opts.max_load_per_cpu = args.max_load_per_cpu;
    opts.config_path = Some(global.config_path());
    let stop = crate::signals::stop_on_term().map_err(|e| CliError::Runtime(e.into()))?;
    opts.hurry = stop.second;
    opts.reload = crate::signals::reload_on_hup().map_err(|e| CliError::Runtime(e.into()))?;
    crate::master::run(opts, stop.first)
        .await
        .map_err(CliError::Runtime)
}
