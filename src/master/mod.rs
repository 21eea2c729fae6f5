//! The host daemon: starts the zygote, reconciles running slots to this host's part of the
//! slot map, sizes the host from measured memory, supervises and reports.
//!
//! One loop owns all state and `select!`s over events: the tick (measure, reconcile,
//! watchdog, report), the zygote's events, the slots' datagrams, signals. Nothing here
//! forks: the zygote does, on request. Which slots to stop and start is decided by the
//! pure `plan::plan`; the loop gathers its input and applies it.

pub mod capacity;
mod language;
mod layouts;
mod plan;
mod report;
mod sched;
mod slots;
mod supervisor;
mod telemetry;
pub mod zygote;
mod zygotes;

/// The host readings, at their old path: `gaffer master`, `gaffer manager` and the tests
/// name the host and read PSS through it. They live in the neutral `crate::host`, which
/// the slots use too.
pub use crate::host::sysinfo;

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::host::handler::Registry;
use crate::queue_client::ConnectOptions;
use crate::signals::Reload;

pub use supervisor::run;

/// Everything a master needs; built by `gaffer master` or by a test.
#[derive(Debug, Clone)]
pub struct MasterOptions {
    /// The validated config.
    pub config: Config,
    /// Its text, handed to the zygote.
    pub config_source: String,
    /// The file to re-read on SIGHUP, if it came from one.
    pub config_path: Option<PathBuf>,
    /// Redis to meet the cluster in.
    pub redis_url: String,
    /// Password and timeouts for Redis.
    pub connect: ConnectOptions,
    /// The name this host registers as.
    pub host: String,
    /// Handlers this binary can run.
    pub registry: Registry,
    /// The gaffer binary to start the zygote from (this binary, normally).
    pub zygote_exe: PathBuf,
    /// How often to measure, reconcile and report.
    pub tick: Duration,
    /// Above this one-minute load average per CPU the host takes no more slots.
    pub max_load_per_cpu: f64,
    /// Requests to re-read `config_path` (SIGHUP at the binary's edge).
    pub reload: Reload,
    /// A second stop request: kill the slots now instead of waiting out `drain_timeout`
    /// (the first is the `shutdown` token given to [`run`]).
    pub hurry: CancellationToken,
}

impl MasterOptions {
    /// Options with the defaults for everything but what must be given.
    pub fn new(
        config: Config,
        config_source: String,
        redis_url: String,
        host: String,
        registry: Registry,
    ) -> std::io::Result<Self> {
        Ok(Self {
            config,
            config_source,
            config_path: None,
            redis_url,
            connect: ConnectOptions::default(),
            host,
            registry,
            zygote_exe: std::env::current_exe()?,
            tick: Duration::from_secs(1),
            max_load_per_cpu: 4.0,
            reload: Reload::default(),
            hurry: CancellationToken::new(),
        })
    }
}
