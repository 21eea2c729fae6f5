//! What every command shares: the global options, the failure type with its exit code,
//! loading the config, connecting, and a few output helpers.
//!
//! `Global` (the config path, loading it, the Redis target, connecting), `CliError` (exit
//! codes 0, 1 and 2), `queue_handle` (a queue of the config, or exit 2), `open_any_queue`
//! (a retired queue too), `must_ask` and `ask` (a deletion's consent) and the output
//! helpers.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::{self, Config, ConfigError};
use crate::queue_client::{
    ConnectOptions, Durability, PemFile, PemKind, Queue, QueueClient, QueueError, QueueLimits,
    TlsFiles, redacted,
};
use crate::slot::Registry;

/// A command's failure, sorted by exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad usage: exit 2.
    #[error("{0}")]
    Usage(String),
    /// A config with errors: exit 2, printed as it is, one `file:line:col: key: message`
    /// per line with nothing before the first (editors and CI problem matchers read them).
    #[error("{0}")]
    Config(String),
    /// Anything that went wrong while running: exit 1.
    #[error(transparent)]
    Runtime(#[from] anyhow::Error),
}

impl From<QueueError> for CliError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Invalid(_) | QueueError::PayloadTooLarge { .. } => {
                CliError::Usage(e.to_string())
            }
            other => CliError::Runtime(other.into()),
        }
    }
}

impl From<redis::RedisError> for CliError {
    fn from(e: redis::RedisError) -> Self {
        QueueError::from(e).into()
    }
}

impl From<serde_json::Error> for CliError {
    fn from(e: serde_json::Error) -> Self {
        CliError::Runtime(e.into())
    }
}

impl CliError {
    /// The exit code this failure maps to.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) | CliError::Config(_) => ExitCode::from(2),
            CliError::Runtime(_) => ExitCode::from(1),
        }
    }

    /// A runtime failure (exit 1) with this message.
    pub fn runtime(message: impl std::fmt::Display) -> Self {
        CliError::Runtime(anyhow::anyhow!("{message}"))
    }
}

/// Settings every command shares.
#[derive(Debug, Clone)]
pub struct Global {
    /// `--config`, when given.
    pub config: Option<PathBuf>,
    /// `--redis`: overrides `[cluster].redis`.
    pub redis: Option<String>,
    /// `--state-dir`: where `gaffer up` keeps its Redis and state.
    pub state_dir: Option<PathBuf>,
    /// The handlers this binary can run; the config may name these.
    pub registry: Registry,
}

impl Global {
    /// The config file: `--config`, else ./config.toml, else /etc/gaffer/config.toml.
    pub fn config_path(&self) -> PathBuf {
        if let Some(p) = &self.config {
            return p.clone();
        }
        let local = PathBuf::from("config.toml");
        if local.exists() {
            return local;
        }
        PathBuf::from("/etc/gaffer/config.toml")
    }

    /// `--state-dir`, else `.gaffer` beside the config file.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| crate::up::default_state_dir(&self.config_path()))
    }

    /// Loads and validates the config; every error is printed, exit 2.
    pub fn load(&self) -> Result<Config, CliError> {
        self.load_source().map(|(cfg, _)| cfg)
    }

    /// Loads the config and keeps its text, for roles that hand it on (to the zygote).
    pub fn load_source(&self) -> Result<(Config, String), CliError> {
        let path = self.config_path();
        let usage = |e: ConfigError| match e {
            ConfigError::Invalid(d) => CliError::Config(d.to_string()),
            e => CliError::Usage(e.to_string()),
        };
        let source = std::fs::read_to_string(&path).map_err(|source| {
            usage(ConfigError::Io {
                path: path.clone(),
                source,
            })
        })?;
        let origin = path.display().to_string();
        let cfg =
            config::parse_with(&source, &origin, &self.registry.custom_names()).map_err(usage)?;
        Ok((cfg, source))
    }

    /// Connects to the Redis of the config (or `--redis`).
    pub async fn connect(&self, cfg: &Config) -> Result<QueueClient, CliError> {
        let (url, opts) = self.redis_target(cfg)?;
        QueueClient::connect(&url, &cfg.cluster.namespace, &opts)
            .await
            .map_err(|e| {
                // What and where: the URL (its password masked) and which setting gave it,
                // since a stale `GAFFER_REDIS` is not shown by `--help`.
                let said = format!(
                    "redis at {} (from {}): {e}",
                    redacted(&url),
                    self.redis_source(cfg)
                );
                // (no password where one is needed is NOAUTH, which the driver does not
                // class as an authentication failure)
                let refused = matches!(&e, QueueError::Redis(r)
                    if r.kind() == redis::ErrorKind::AuthenticationFailed
                        || matches!(r.code(), Some("NOAUTH" | "WRONGPASS")));
                match e {
                    // Waiting cannot fix these: a setting must change.
                    QueueError::Invalid(_) | QueueError::Certificate(_) => CliError::Usage(said),
                    _ if refused => CliError::Usage(said),
                    _ => CliError::Runtime(anyhow::anyhow!(said)),
                }
            })
    }

    /// Where the Redis URL in use comes from, as [`Global::redis_target`] chooses it.
    fn redis_source(&self, cfg: &Config) -> String {
        if self.redis.is_some() {
            "--redis or GAFFER_REDIS".into()
        } else if cfg.cluster.redis.is_some() {
            format!("[cluster].redis in {}", self.config_path().display())
        } else {
            format!("the `gaffer up` of {}", self.state_dir().display())
        }
    }

    /// The Redis URL and connect options: `--redis` over `[cluster].redis`, the password
    /// from `redis_password_file` when set, writes confirmed as `wait_replicas` says.
    pub fn redis_target(&self, cfg: &Config) -> Result<(String, ConnectOptions), CliError> {
        let url = self
            .redis
            .clone()
            .or_else(|| cfg.cluster.redis.clone())
            .or_else(|| crate::up::running_redis(&self.state_dir()))
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "{}: [cluster].redis is not set, no --redis was given, and no `gaffer up` \
                     runs with state directory {} (start one, or name a Redis)",
                    self.config_path().display(),
                    self.state_dir().display()
                ))
            })?;
        let mut opts = ConnectOptions::default();
        if let Some(file) = &cfg.cluster.redis_password_file {
            let pw = std::fs::read_to_string(file).map_err(|e| {
                CliError::Usage(format!(
                    "cannot read [cluster].redis_password_file {}: {e}",
                    file.display()
                ))
            })?;
            opts.password = Some(pw.trim_end_matches(['\n', '\r']).to_string());
        }
        refuse_tls_files_over_plain(cfg, &url)?;
        opts.tls = tls_files(cfg)?;
        opts.durability = Durability {
            wait_replicas: cfg.cluster.wait_replicas,
            wait_timeout: cfg.cluster.wait_timeout,
        };
        warn_if_insecure(&url);
        Ok((url, opts))
    }
}

/// TLS files with a URL that is not `rediss://` would connect in plain text, the files
/// unused: config validation refuses them beside a plain `[cluster].redis`, and this the
/// URL in use, which may come from `--redis`, `GAFFER_REDIS` or `gaffer up` instead.
fn refuse_tls_files_over_plain(cfg: &Config, url: &str) -> Result<(), CliError> {
    let c = &cfg.cluster;
    let set = [
        ("redis_ca_file", &c.redis_ca_file),
        ("redis_cert_file", &c.redis_cert_file),
        ("redis_key_file", &c.redis_key_file),
    ]
    .into_iter()
    .find_map(|(key, f)| f.as_ref().map(|_| key));
    match set {
        Some(key) if !crate::queue_client::uses_tls(url) => Err(CliError::Usage(format!(
            "[cluster].{key} is set, but the Redis URL in use ({}) is not rediss:// (or rediss+sentinel://): refusing to connect without TLS (use a rediss:// URL, or drop the TLS files)",
            redacted(url)
        ))),
        _ => Ok(()),
    }
}

/// `#insecure` turns certificate checks off: said at every start, so it is not forgotten
/// in production.
fn warn_if_insecure(url: &str) {
    if url.starts_with("rediss://") && url.ends_with("#insecure") {
        tracing::warn!(
            redis = %redacted(url),
            risk = "anyone on the path can read and change queue traffic",
            "tls certificate verification is off (#insecure)"
        );
    }
}

/// The TLS files of `[cluster]`, read once; a file that is missing, unreadable or holds no
/// PEM of its kind is bad usage naming the key and the file.
fn tls_files(cfg: &Config) -> Result<Option<TlsFiles>, CliError> {
    let c = &cfg.cluster;
    let read = |key: &str, path: &std::path::Path, kind: PemKind| {
        PemFile::read(path, kind).map_err(|e| CliError::Usage(format!("[cluster].{key}: {e}")))
    };
    let ca = c
        .redis_ca_file
        .as_deref()
        .map(|p| read("redis_ca_file", p, PemKind::Certificates))
        .transpose()?;
    let client = match (&c.redis_cert_file, &c.redis_key_file) {
        (Some(cert), Some(key)) => Some((
            read("redis_cert_file", cert, PemKind::Certificates)?,
            read("redis_key_file", key, PemKind::PrivateKey)?,
        )),
        // Config validation refuses one without the other.
        _ => None,
    };
    Ok((ca.is_some() || client.is_some()).then_some(TlsFiles { ca, client }))
}

/// A handle on a queue of the config, with the config's limits; a queue the config does
/// not name is bad usage (exit 2). For commands that only make sense on a queue slots
/// serve (`push`, `pause`, `intake`); [`open_any_queue`] also opens retired ones.
pub fn queue_handle(client: &QueueClient, cfg: &Config, name: &str) -> Result<Queue, CliError> {
    let q = cfg
        .queues
        .get(name)
        .ok_or_else(|| not_a_queue(cfg, name, &[]))?;
    Ok(client.queue_with(name, QueueLimits::from(q))?)
}

/// Bad usage: `name` is not in the config, nor among `retired` (when given).
fn not_a_queue(cfg: &Config, name: &str, retired: &[String]) -> CliError {
    let list = |names: Vec<&str>| {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    let known = list(cfg.queues.keys().map(String::as_str).collect());
    let retired = if retired.is_empty() {
        String::new()
    } else {
        format!(
            "; retired: {}",
            list(retired.iter().map(String::as_str).collect())
        )
    };
    CliError::Usage(format!(
        "queue {name:?} is not in the config (known: {known}{retired})"
    ))
}

/// Whether a queue is in the config in force or only in the registry of names configs have
/// named (`cluster::Keys::queues`): its table removed, its data still in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// In the config: opened with its limits.
    Configured,
    /// Retired: opened with default limits, since its config is gone; no slot takes from
    /// it.
    Retired,
}

/// Loads the config, connects, and opens one of its queues: what most commands on a
/// queue start with.
pub async fn open_queue(global: &Global, name: &str) -> Result<(Config, Queue), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    let q = queue_handle(&client, &cfg, name)?;
    Ok((cfg, q))
}

/// Like [`open_queue`], and a retired queue too (the registry is read only for a name the
/// config does not have); a name in neither is bad usage listing both.
pub async fn open_any_queue(global: &Global, name: &str) -> Result<(Queue, Standing), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    any_queue_handle(&client, &cfg, name).await
}

/// [`open_any_queue`] on a client at hand.
pub async fn any_queue_handle(
    client: &QueueClient,
    cfg: &Config,
    name: &str,
) -> Result<(Queue, Standing), CliError> {
    if let Some(q) = cfg.queues.get(name) {
        let queue = client.queue_with(name, QueueLimits::from(q))?;
        return Ok((queue, Standing::Configured));
    }
    let retired = crate::cluster::snapshot::retired_names(client, cfg).await?;
    if !retired.contains(name) {
        let retired: Vec<String> = retired.into_iter().collect();
        return Err(not_a_queue(cfg, name, &retired));
    }
    Ok((client.queue(name)?, Standing::Retired))
}

/// Bad usage: `what` (requeue, thaw) would put tasks back to wait in a retired queue,
/// where no slot takes them.
pub fn refuse_retired(name: &str, what: &str) -> CliError {
    CliError::Usage(format!(
        "queue {name} is retired (not in the config): cannot {what}, no slot takes from a queue the config does not name; put its [queues.{name}] table back first (and let the manager adopt it), or delete its data with `gaffer queues retire {name}`"
    ))
}

/// Whether a deletion must be asked for first: not with `--yes`. Where no terminal can
/// ask (cron, a pipe, `ssh host cmd`) it is bad usage saying `refusal`, so nothing is
/// deleted unasked.
pub fn must_ask(yes: bool, refusal: impl FnOnce() -> String) -> Result<bool, CliError> {
    if yes {
        return Ok(false);
    }
    if !std::io::stdin().is_terminal() {
        return Err(CliError::Usage(refusal()));
    }
    Ok(true)
}

/// Asks `question` on the terminal (stderr, ` [y/N] ` appended); true for y or yes.
pub fn ask(question: &str) -> Result<bool, CliError> {
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(anyhow::Error::from)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// The failure of a lookup that found nothing (exit 1).
pub fn no_task(queue: &str, id: &str) -> CliError {
    CliError::runtime(format!("no task {id:?} in queue {queue}"))
}

/// At most `max` characters of `payload` as text, with `…` when cut.
pub fn preview(payload: &[u8], max: usize) -> String {
    let s = String::from_utf8_lossy(payload);
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max).collect::<String>())
    } else {
        s.into_owned()
    }
}

/// A payload as JSON: parsed when it is JSON, else as a string.
pub fn payload_json(payload: &[u8]) -> serde_json::Value {
    serde_json::from_slice(payload)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(payload).into()))
}

/// Milliseconds since the epoch as RFC 3339 with milliseconds.
pub fn format_ms(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}
