//! `gaffer up`: the whole cluster on this host.

use clap::Args;

use crate::cli::{CliError, Global, LogFormat};
use crate::queue_client::ConnectOptions;

/// Arguments of `gaffer up`.
#[derive(Args)]
pub struct UpArgs {
    /// Push a built-in load to every queue: a wave per queue, each behind the last, so
    /// slots move between queues (watch with `gaffer top`)
    #[arg(long)]
    pub demo_load: bool,
}

/// `gaffer up`: the whole cluster on this host until Ctrl-C. The roles it starts log in
/// `log_format`, as `up` itself does.
pub async fn run(global: &Global, args: UpArgs, log_format: LogFormat) -> Result<(), CliError> {
    let cfg = global.load()?;
    // Only an explicit Redis counts here: a state file names the Redis `up` itself started.
    let redis = global.redis.clone().or_else(|| cfg.cluster.redis.clone());
    let connect = match &redis {
        Some(_) => global.redis_target(&cfg)?.1,
        None => ConnectOptions::default(),
    };
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Runtime(anyhow::anyhow!("cannot find this program: {e}")))?;
    let role_args = match log_format {
        LogFormat::Text => vec![],
        LogFormat::Json => vec!["--log-format".to_string(), "json".to_string()],
    };
    let opts = crate::up::UpOptions {
        config_path: global.config_path(),
        config: cfg,
        redis,
        connect,
        state_dir: global.state_dir(),
        demo_load: args.demo_load,
        exe,
        role_args,
    };
    // Both before anything starts, so an early Ctrl-C is not the default "terminate".
    let signals =
        |e: std::io::Error| CliError::Runtime(anyhow::anyhow!("installing signal handlers: {e}"));
    let shutdown = crate::signals::shutdown_on_term().map_err(signals)?;
    let presses = crate::signals::interrupts().map_err(signals)?;
    crate::up::run(opts, shutdown, crate::up::Interrupts::from_signal(presses))
        .await
        .map_err(CliError::Runtime)
}
