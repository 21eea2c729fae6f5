//! Connections to one Redis server or a Redis Cluster. Which one is decided by asking the
//! server (`INFO cluster`), so operators give one URL either way.
//!
//! Also here: a connection for pub/sub ([`pubsub`]), an idle taker's blocking wait on a
//! connection of its own ([`Waiter`]), and URLs with their passwords hidden for messages
//! ([`redacted`]). TLS: `[cluster]`'s PEM files are read once, by the CLI's
//! `redis_target`, and handed to slots through the zygote's `ZygoteInit`, so a slot reads
//! no file ([`TlsFiles`]); a certificate that rustls refuses becomes
//! `QueueError::Certificate`, with the reason in an operator's words.

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, Cmd, IntoConnectionInfo, Pipeline, RedisFuture,
    TlsCertificates, Value,
};
use serde::{Deserialize, Serialize};

use super::QueueError;
use super::cluster_conn::ClusterConn;
use super::sentinel::{SentinelConn, SentinelUrl};

/// How to reach Redis and how patient to be with it. Its `Debug` hides the password.
#[derive(Clone)]
pub struct ConnectOptions {
    /// Overrides the password of the URL (read from `redis_password_file`).
    pub password: Option<String>,
    /// How long one command may take before it fails; scripts over big batches need more
    /// than the driver's default of 500 ms.
    pub response_timeout: Duration,
    /// How long establishing a connection may take.
    pub connect_timeout: Duration,
    /// Certificates for `rediss://` beyond the system roots (`[cluster]`'s TLS files).
    pub tls: Option<TlsFiles>,
    /// How many replicas must confirm a write, and how long to wait for them (`[cluster]
    /// wait_replicas`, `wait_timeout`; see durability.rs). Not used by the connection
    /// itself: a [`QueueClient`](super::QueueClient) hands it to its queues' calls.
    pub durability: super::Durability,
}

/// The PEM files of `[cluster]` for TLS, read once when a role starts (a slot gets them
/// from its master, never reading files itself). Its `Debug` shows paths only.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct TlsFiles {
    /// CAs the server's certificate must chain to, instead of the system roots.
    pub ca: Option<PemFile>,
    /// Client certificate (chain) and its private key, for servers that require one.
    pub client: Option<(PemFile, PemFile)>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.as_ref().map(|p| &p.path))
            .field("client", &self.client.as_ref().map(|(c, _)| &c.path))
            .finish()
    }
}

/// One PEM file's contents and where they came from, for messages.
#[derive(Clone, Serialize, Deserialize)]
pub struct PemFile {
    /// Where it was read.
    pub path: PathBuf,
    /// Its contents.
    pub pem: Vec<u8>,
}

/// What a PEM file must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemKind {
    /// One or more certificates (a CA bundle, a certificate chain).
    Certificates,
    /// A private key.
    PrivateKey,
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds no PEM block of the kind needed.
    #[error("{path} holds no PEM {what}")]
    NoPem {
        /// The file.
        path: PathBuf,
        /// What was looked for.
        what: &'static str,
    },
}

impl PemFile {
    /// Reads `path`, which must hold at least one PEM block of `kind`.
    pub fn read(path: &Path, kind: PemKind) -> Result<Self, TlsFileError> {
        let pem = std::fs::read(path).map_err(|source| TlsFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        let text = String::from_utf8_lossy(&pem);
        // rustls would take an empty CA bundle as "trust nothing" and only fail at the
        // handshake, far from the file at fault.
        let (found, what) = match kind {
            PemKind::Certificates => (text.contains("-----BEGIN CERTIFICATE-----"), "certificate"),
            PemKind::PrivateKey => (text.contains("PRIVATE KEY-----"), "private key"),
        };
        if !found {
            return Err(TlsFileError::NoPem {
                path: path.to_owned(),
                what,
            });
        }
        Ok(PemFile {
            path: path.to_owned(),
            pem,
        })
    }
}

impl TlsFiles {
    /// The redis crate's form of the files.
    pub(crate) fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.pem.clone(),
                client_key: key.pem.clone(),
            }),
            root_cert: self.ca.as_ref().map(|ca| ca.pem.clone()),
        }
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls)
            .field("durability", &self.durability)
            .finish()
    }
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            password: None,
            response_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            tls: None,
            durability: super::Durability::default(),
        }
    }
}

/// A shared, reconnecting, multiplexed connection: cheap to clone, and concurrent
/// requests on clones are pipelined on one socket.
#[derive(Clone)]
pub enum RedisConn {
    /// One Redis server.
    Single(ConnectionManager),
    /// A Redis Cluster; commands are routed by the hash slot of their first key, and the
    /// connection follows the cluster's failovers (`cluster_conn.rs`).
    Cluster(ClusterConn),
    /// The primary a group of sentinels names, followed across failovers.
    Sentinel(SentinelConn),
}

impl RedisConn {
    /// Whether keys spread over the nodes of a Redis Cluster (a call reaching keys of two
    /// hash slots works on one server only, whether the sentinels name it or not).
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
            RedisConn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
            RedisConn::Sentinel(c) => c.get_db(),
        }
    }
}

/// What it takes to open more connections of the same kind (for blocking waits).
#[derive(Clone)]
pub(crate) enum Target {
    // Boxed like the cluster's: with TLS a client carries its certificates.
    Single(Box<Client>),
    Cluster(ClusterConn),
    Sentinel(SentinelConn),
}

/// Connects, detects a cluster, and returns the shared connection plus the means to open
/// dedicated ones.
pub(crate) async fn connect(
    url: &str,
    opts: &ConnectOptions,
) -> Result<(RedisConn, Target), QueueError> {
    if let Some(parsed) = SentinelUrl::parse(url) {
        let parsed = parsed.map_err(|e| QueueError::Invalid(format!("bad redis url: {e}")))?;
        let conn = SentinelConn::connect(&parsed, opts)
            .await
            .map_err(|e| match e {
                QueueError::Redis(e) => connect_error(url, e, opts),
                other => other,
            })?;
        return Ok((RedisConn::Sentinel(conn.clone()), Target::Sentinel(conn)));
    }
    let (client, info) = client(url, opts)?;
    let probe_cfg = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(opts.connect_timeout))
        .set_response_timeout(Some(opts.response_timeout));
    let mut probe = client
        .get_multiplexed_async_connection_with_config(&probe_cfg)
        .await
        .map_err(|e| connect_error(url, e, opts))?;
    let cluster_info: String = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut probe)
        .await?;
    if cluster_info.contains("cluster_enabled:1") {
        let conn = ClusterConn::connect(info, opts).await?;
        return Ok((RedisConn::Cluster(conn.clone()), Target::Cluster(conn)));
    }
    let cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(opts.connect_timeout))
        .set_response_timeout(Some(opts.response_timeout))
        // Few quick retries: while Redis is down a call fails within seconds rather than
        // hanging, and callers pace their own retries.
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(100))
        .set_max_delay(Duration::from_secs(1));
    let manager = ConnectionManager::new_with_config(client.clone(), cfg).await?;
    Ok((RedisConn::Single(manager), Target::Single(Box::new(client))))
}

/// A client for `url` with the options' password.
fn client(url: &str, opts: &ConnectOptions) -> Result<(Client, redis::ConnectionInfo), QueueError> {
    // A bad URL or password is no outage: retrying cannot fix it, so it is not a
    // `Connect` error (which callers retry).
    let mut info = url
        .into_connection_info()
        .map_err(|e| QueueError::Invalid(format!("bad redis url: {e}")))?;
    if let Some(pw) = &opts.password {
        let settings = info.redis_settings().clone().set_password(pw);
        info = info.set_redis_settings(settings);
    }
    let client = match &opts.tls {
        Some(tls) => Client::build_with_tls(info.clone(), tls.certificates())
            .map_err(|e| QueueError::Invalid(format!("tls files for {}: {e}", redacted(url))))?,
        None => Client::open(info.clone())
            .map_err(|e| QueueError::Invalid(format!("bad redis url: {e}")))?,
    };
    Ok((client, info))
}

/// A failed connection as callers tell them apart: a refused password or certificate
/// (waiting cannot fix either) from an outage.
fn connect_error(url: &str, e: redis::RedisError, opts: &ConnectOptions) -> QueueError {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        QueueError::Redis(e)
    } else if let Some(cert) = certificate_error(&e) {
        QueueError::Certificate(format!(
            "{}: {}",
            redacted(url),
            certificate_reason(&cert, opts)
        ))
    } else {
        QueueError::Connect {
            target: format!("{}: {e}", redacted(url)),
            cause: super::Cause::of_redis(&e),
        }
    }
}

/// What rustls said about the server's certificate, if that is what failed the connection.
/// Read from the message: the redis crate keeps the rustls error behind an `io::Error`
/// whose `source` skips it, so no downcast reaches it; the TLS tests pin the wording.
fn certificate_error(e: &redis::RedisError) -> Option<String> {
    const PREFIX: &str = "invalid peer certificate: ";
    let text = e.to_string();
    let at = text.find(PREFIX)?;
    Some(text[at + PREFIX.len()..].to_string())
}

/// A certificate problem in an operator's words: what is wrong and which file to look at.
fn certificate_reason(detail: &str, opts: &ConnectOptions) -> String {
    let ca = opts.tls.as_ref().and_then(|t| t.ca.as_ref());
    let is = |names: &[&str]| names.iter().any(|n| detail.starts_with(n));
    if is(&["UnknownIssuer"]) {
        match ca {
            Some(ca) => format!(
                "the server's certificate is not trusted: no CA in [cluster].redis_ca_file {} signed it",
                ca.path.display()
            ),
            None => "the server's certificate is not trusted: no system root CA signed it \
                     (set [cluster].redis_ca_file for a private CA)"
                .to_string(),
        }
    } else if is(&["Expired", "certificate expired"]) {
        format!("the server's certificate has expired ({detail})")
    } else if is(&["NotValidYet", "certificate not valid yet"]) {
        format!("the server's certificate is not valid yet ({detail})")
    } else if is(&["NotValidForName", "certificate not valid for name"]) {
        format!("the server's certificate is not valid for this host name ({detail})")
    } else {
        format!("the server's certificate was refused: {detail}")
    }
}

/// A connection dedicated to pub/sub on the server `url` names. On a Redis Cluster that is
/// one node, which is enough: a PUBLISH on any node reaches the subscribers of every node.
pub async fn pubsub(url: &str, opts: &ConnectOptions) -> Result<redis::aio::PubSub, QueueError> {
    let client = match SentinelUrl::parse(url) {
        // A subscription lives on the primary: the one named now (after a failover the
        // subscription drops, and its owner subscribes again, asking anew).
        Some(_) => match connect(url, opts).await? {
            (_, Target::Sentinel(conn)) => conn.primary_client().await?,
            _ => unreachable!("a sentinel url connects through sentinels"),
        },
        None => client(url, opts)?.0,
    };
    let pubsub = tokio::time::timeout(opts.connect_timeout, client.get_async_pubsub())
        .await
        .map_err(|_| QueueError::Connect {
            target: format!("{}: timed out", redacted(url)),
            cause: super::Cause::TimedOut,
        })?
        .map_err(|e| connect_error(url, e, opts))?;
    Ok(pubsub)
}

/// The URL with any password replaced, for messages and logs: the one in its user info
/// (`redis://user:PASSWORD@host`) and the one a unix socket's URL carries in its query
/// (`redis+unix:///path?user=u&pass=PASSWORD`, which the redis crate also reads).
pub fn redacted(url: &str) -> String {
    let mut out = url.to_string();
    for secret in url_passwords(url) {
        // (a query key written in any case: every `=SECRET` goes, which masks no less)
        out = out
            .replacen(&format!(":{secret}@"), ":***@", 1)
            .replace(&format!("={secret}"), "=***");
    }
    out
}

/// Whether connections to the URL's servers use TLS: `rediss://` and `rediss+sentinel://`.
pub fn uses_tls(url: &str) -> bool {
    url.starts_with("rediss://") || url.starts_with("rediss+sentinel://")
}

/// The query parameters of a Redis URL that hold a password.
const PASSWORD_PARAMS: [&str; 3] = ["pass", "password", "sentinel_password"];

/// The passwords a Redis URL holds, as written: its user info's, and its query's
/// `pass=` / `password=` values (empty ones left out).
pub fn url_passwords(url: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let Some(scheme) = url.find("://") else {
        return found;
    };
    let rest = &url[scheme + 3..];
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    if let Some((creds, _)) = before_query.rsplit_once('@')
        && let Some((_, pw)) = creds.split_once(':')
        && !pw.is_empty()
    {
        found.push(pw);
    }
    for pair in query.split(['&', '#']) {
        if let Some((key, value)) = pair.split_once('=')
            && PASSWORD_PARAMS.iter().any(|p| key.eq_ignore_ascii_case(p))
            && !value.is_empty()
        {
            found.push(value);
        }
    }
    found
}

/// A dedicated connection for blocking waits (BLPOP), which would stall every other user
/// of a multiplexed connection. Opened lazily, dropped and reopened after any error.
pub struct Waiter {
    target: Target,
    conn: Option<WaitConn>,
}

enum WaitConn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Waiter {
    pub(crate) fn new(target: Target) -> Self {
        Waiter { target, conn: None }
    }

    /// Blocks until a wake-up token is pushed to `key` or `timeout` passes. Returns true
    /// when woken. A Redis that stops answering cannot hang it past `timeout` + 2 s.
    pub async fn wait(&mut self, key: &str, timeout: Duration) -> Result<bool, QueueError> {
        let timeout = timeout.max(Duration::from_millis(1));
        let mut cmd = redis::cmd("BLPOP");
        cmd.arg(key).arg(format!("{:.3}", timeout.as_secs_f64()));
        let guard = timeout + Duration::from_secs(2);
        let conn = match self.conn.as_mut() {
            Some(c) => c,
            None => {
                let c = self.open().await?;
                self.conn.insert(c)
            }
        };
        let fut = async {
            match conn {
                WaitConn::Single(c) => cmd.query_async::<Option<(String, String)>>(c).await,
                WaitConn::Cluster(c) => cmd.query_async::<Option<(String, String)>>(c).await,
            }
        };
        match tokio::time::timeout(guard, fut).await {
            Ok(Ok(v)) => Ok(v.is_some()),
            Ok(Err(e)) => {
                self.conn = None;
                Err(e.into())
            }
            Err(_) => {
                self.conn = None;
                Err(QueueError::Connect {
                    target: "redis did not answer a blocking wait".into(),
                    cause: super::Cause::TimedOut,
                })
            }
        }
    }

    async fn open(&self) -> Result<WaitConn, QueueError> {
        // The blocking wait has its own deadline; the connection itself must not cut it.
        let long = Duration::from_secs(3600);
        Ok(match &self.target {
            Target::Single(client) => {
                let cfg = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(long));
                WaitConn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                )
            }
            Target::Cluster(cluster) => {
                let cfg = redis::cluster::ClusterConfig::new().set_response_timeout(long);
                WaitConn::Cluster(
                    cluster
                        .client()
                        .get_async_connection_with_config(cfg)
                        .await?,
                )
            }
            Target::Sentinel(conn) => {
                let cfg = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(2)))
                    .set_response_timeout(Some(long));
                let client = conn.primary_client().await?;
                WaitConn::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&cfg)
                        .await?,
                )
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{ConnectOptions, redacted};

    #[test]
    fn debug_output_hides_the_password() {
        let opts = ConnectOptions {
            password: Some("s3cret".into()),
            ..ConnectOptions::default()
        };
        let text = format!("{opts:?}");
        assert!(!text.contains("s3cret") && text.contains("***"), "{text}");
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redacted("redis://gaffer:s3cret@host:6379/0"),
            "redis://gaffer:***@host:6379/0"
        );
        assert_eq!(
            redacted("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        // A unix socket's URL carries its password in the query, where the redis crate
        // reads it.
        assert_eq!(
            redacted("redis+unix:///run/redis.sock?user=gaffer&pass=s3cret"),
            "redis+unix:///run/redis.sock?user=gaffer&pass=***"
        );
        assert_eq!(
            redacted("unix:///run/redis.sock?db=1&password=s3cret"),
            "unix:///run/redis.sock?db=1&password=***"
        );
        assert_eq!(
            redacted("unix:///run/redis.sock?db=1&Password=s3cret"),
            "unix:///run/redis.sock?db=1&Password=***"
        );
        assert_eq!(
            redacted("redis+sentinel://app:s3cret@s1:26379,s2/main/0?sentinel_password=t0p"),
            "redis+sentinel://app:***@s1:26379,s2/main/0?sentinel_password=***"
        );
        assert_eq!(
            redacted("redis://gaffer:s3cret@host/0?protocol=resp3"),
            "redis://gaffer:***@host/0?protocol=resp3"
        );
    }
}
