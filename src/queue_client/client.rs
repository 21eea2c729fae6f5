//! The client: a connection to the queues of one namespace, connected at once or patiently
//! (waiting out an outage), and the handles on its queues.

use std::sync::Arc;
use std::time::Duration;

use super::conn::{self, Target};
use super::record::rfc3339;
use super::scripts::Keys;
use super::validate_queue_name;
use super::{
    ConnectError, ConnectOptions, Durability, Queue, QueueError, QueueLimits, RedisConn, Waiter,
    redacted,
};

/// How a role reaches Redis: one server, a Redis Cluster, or the primary that sentinels
/// name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topology {
    /// One server (`redis://`, `rediss://`, `redis+unix://`).
    Single,
    /// A Redis Cluster.
    Cluster,
    /// A primary and its replicas under Sentinel (`redis+sentinel://`).
    Sentinel,
}

/// Which Redis node a role talks to and the failovers it followed: `/status`, the host
/// reports and `gaffer stats` show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RedisNode {
    /// How it reaches Redis.
    pub topology: Topology,
    /// `host:port` of the server or of the primary it talks to now; for a cluster, the
    /// URL it was given (it talks to every master).
    pub node: String,
    /// How many times it saw another primary named (Sentinel; 0 otherwise).
    pub failovers: u64,
    /// When it last did, RFC 3339.
    pub last_failover: Option<String>,
}

impl RedisNode {
    /// [`last_failover`](Self::last_failover) in ms since the epoch, when there is one
    /// that reads.
    pub fn last_failover_ms(&self) -> Option<u64> {
        let at = chrono::DateTime::parse_from_rfc3339(self.last_failover.as_deref()?).ok()?;
        u64::try_from(at.timestamp_millis()).ok()
    }
}

impl Topology {
    /// Its name, as JSON gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::Cluster => "cluster",
            Topology::Sentinel => "sentinel",
        }
    }
}

fn rfc3339_of(t: std::time::SystemTime) -> String {
    let ms = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    rfc3339(ms)
}

/// A connection to the queues of one namespace.
#[derive(Clone)]
pub struct QueueClient {
    conn: RedisConn,
    target: Target,
    namespace: Arc<str>,
    /// The URL it connected with, its passwords hidden.
    origin: Arc<str>,
    /// How its queues' writes are confirmed on replicas (durability.rs).
    durability: Durability,
}

impl QueueClient {
    /// Connects to the Redis at `url` (a single server or any node of a Redis Cluster).
    pub async fn connect(
        url: &str,
        namespace: &str,
        opts: &ConnectOptions,
    ) -> Result<Self, QueueError> {
        let (conn, target) = conn::connect(url, opts).await?;
        Ok(QueueClient {
            conn,
            target,
            namespace: namespace.into(),
            origin: redacted(url).into(),
            durability: opts.durability,
        })
    }

    /// Like [`connect`](Self::connect), but waits out a Redis that is unreachable or not
    /// ready yet, backing off from 100 ms to 5 s, with a warning on the first failure and
    /// about every minute after. Errors that waiting cannot fix (a bad URL, a wrong
    /// password) return at once. For daemons, which must come up in whatever order hosts
    /// and services start, and ride out an outage that began before they did; drop the
    /// future to give up.
    pub async fn connect_patiently(
        url: &str,
        namespace: &str,
        opts: &ConnectOptions,
    ) -> Result<Self, QueueError> {
        let mut backoff =
            crate::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut warned: Option<std::time::Instant> = None;
        loop {
            match Self::connect(url, namespace, opts).await {
                Ok(client) => {
                    if warned.is_some() {
                        tracing::info!(redis = %redacted(url), "redis reachable");
                    }
                    return Ok(client);
                }
                Err(e) if e.is_transient() => {
                    if warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                        tracing::warn!(redis = %redacted(url), error = %e,
                            "redis unreachable; waiting for it");
                        warned = Some(std::time::Instant::now());
                    }
                    backoff.pause().await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A daemon's start: [`connect_patiently`](Self::connect_patiently), but `None` as soon
    /// as `stop` is cancelled, so a role asked to stop while Redis is down exits at once.
    /// The error names the (redacted) URL.
    pub async fn connect_or_stop(
        url: &str,
        namespace: &str,
        opts: &ConnectOptions,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<Option<Self>, ConnectError> {
        tokio::select! {
            r = Self::connect_patiently(url, namespace, opts) => r.map(Some).map_err(|source| {
                ConnectError { url: redacted(url), source }
            }),
            () = stop.cancelled() => Ok(None),
        }
    }

    /// A handle on one queue with default limits.
    pub fn queue(&self, name: &str) -> Result<Queue, QueueError> {
        self.queue_with(name, QueueLimits::default())
    }

    /// A handle on one queue with the limits of its config.
    pub fn queue_with(&self, name: &str, limits: QueueLimits) -> Result<Queue, QueueError> {
        validate_queue_name(name)?;
        Ok(Queue {
            conn: self.conn.clone(),
            keys: Arc::new(Keys::new(&self.namespace, name)),
            name: name.into(),
            limits,
            worker: None,
            durability: self.durability,
        })
    }

    /// A dedicated connection for blocking waits; one per concurrent taker.
    pub fn waiter(&self) -> Waiter {
        Waiter::new(self.target.clone())
    }

    /// The shared connection, for commands outside the queue API.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Which Redis it talks to and the failovers it followed, for status pages.
    pub fn redis_node(&self) -> RedisNode {
        match &self.target {
            Target::Single(client) => RedisNode {
                topology: Topology::Single,
                node: client.get_connection_info().addr().to_string(),
                failovers: 0,
                last_failover: None,
            },
            // A cluster's client talks to every master; the node named is the one it
            // was pointed at, and the failovers its watcher saw (`cluster_conn.rs`).
            Target::Cluster(conn) => {
                let facts = conn.facts();
                RedisNode {
                    topology: Topology::Cluster,
                    node: self.origin.to_string(),
                    failovers: facts.failovers,
                    last_failover: facts.last_failover.map(rfc3339_of),
                }
            }
            Target::Sentinel(conn) => {
                let facts = conn.facts();
                RedisNode {
                    topology: Topology::Sentinel,
                    node: facts
                        .as_ref()
                        .map_or_else(String::new, |f| f.primary.clone()),
                    failovers: facts.as_ref().map_or(0, |f| f.failovers),
                    last_failover: facts.and_then(|f| f.last_failover).map(rfc3339_of),
                }
            }
        }
    }

    /// The key namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// How its writes are confirmed on replicas (`[cluster] wait_replicas`).
    pub fn durability(&self) -> Durability {
        self.durability
    }
}
