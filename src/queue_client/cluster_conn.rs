//! A Redis Cluster connection that follows a failover on its own. The redis crate's
//! cluster client finds a master that died (its connection is refused, and the client
//! asks the other nodes for the slots again), but not one that froze: a call to it times
//! out and is retried on the same node, and the client asks for the slots again only when
//! a node answers `MOVED`, which a frozen node never does. Its queues would stall for as
//! long as the node stays frozen, long after its replica took over.
//!
//! So [`ClusterConn`] keeps a watcher task that looks at the cluster every [`RECHECK`]:
//! one `CLUSTER NODES`, from the first node (of those the last look listed) that answers
//! within [`LOOK_LIMIT`]. When the masters holding slots are no longer those the
//! connection was made with (a replica took its master's slots), it makes a new cluster
//! connection from the new masters and cuts short the calls still waiting on the old one,
//! which fail as a dropped connection does: callers retry them after their backoff. The
//! same looks count the failovers `/status` shows (`cluster_watch.rs` reads them, and
//! passes over a node that has not heard the news yet).
//!
//! Each look needs `CLUSTER NODES` (`+cluster|nodes` in an ACL line). Refused, the
//! watcher says so once and the connection is left to the crate's own recovery, which
//! follows a master killed but not one frozen.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisFuture,
    Value,
};

use super::cluster_watch::ClusterWatch;
use super::conn::ConnectOptions;
use super::follow::Switch;

/// How often the watcher looks at the cluster.
const RECHECK: Duration = Duration::from_secs(1);

/// How long one node may take to answer a look before the next one is asked.
const LOOK_LIMIT: Duration = Duration::from_millis(800);

/// The failovers a cluster connection has seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// Replicas seen taking their master's slots.
    pub failovers: u64,
    /// When the last one was seen.
    pub last_failover: Option<SystemTime>,
}

/// A connection to a Redis Cluster that follows its failovers. Cheap to clone; clones
/// share the connection.
#[derive(Clone)]
pub struct ClusterConn {
    shared: Arc<Shared>,
}

struct Shared {
    /// The seed node's settings (user, password, database, TLS): every node is reached
    /// with them, at its own address.
    seed: ConnectionInfo,
    opts: ConnectOptions,
    state: Mutex<State>,
    switch: Switch,
}

struct State {
    conn: ClusterConnection,
    client: ClusterClient,
    /// Bumped when the connection is replaced.
    generation: u64,
    /// `host:port` of the masters holding slots when `conn` was made; `None` until the
    /// first look.
    owners: Option<BTreeSet<String>>,
    /// `host:port` of every node the last look listed: where the next look asks.
    nodes: Vec<String>,
    watch: ClusterWatch,
    /// Whether the last look failed (said once, not every second).
    look_failed: bool,
}

impl ClusterConn {
    /// Connects through the node `seed` names and starts the watcher.
    pub(crate) async fn connect(
        seed: ConnectionInfo,
        opts: &ConnectOptions,
    ) -> Result<Self, redis::RedisError> {
        let client = cluster_client(vec![seed.clone()], opts)?;
        let conn = client.get_async_connection().await?;
        let shared = Arc::new(Shared {
            seed,
            opts: opts.clone(),
            state: Mutex::new(State {
                conn,
                client,
                generation: 0,
                owners: None,
                nodes: Vec::new(),
                watch: ClusterWatch::default(),
                look_failed: false,
            }),
            switch: Switch::new(),
        });
        let conn = ClusterConn { shared };
        // The first look is the baseline failovers are counted from: taken now, a
        // failover right after the connection is made is one it saw.
        let mut looker = Looker::default();
        conn.look(&mut looker).await;
        tokio::spawn(watch(Arc::downgrade(&conn.shared), looker));
        Ok(conn)
    }

    /// The failovers it has seen.
    pub fn facts(&self) -> ClusterFacts {
        let state = self.state();
        ClusterFacts {
            failovers: state.watch.failovers,
            last_failover: state.watch.last_failover,
        }
    }

    /// A client for the cluster as it stands, for dedicated connections (blocking waits).
    pub(crate) fn client(&self) -> ClusterClient {
        self.state().client.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().expect("cluster state")
    }

    fn current(&self) -> (ClusterConnection, u64) {
        let state = self.state();
        (state.conn.clone(), state.generation)
    }

    /// Takes in one look's `CLUSTER NODES`; returns the masters to reconnect to, with the
    /// generation the decision was made on, when they changed.
    fn observe(&self, nodes: &str) -> Option<(BTreeSet<String>, u64)> {
        let mut state = self.state();
        for p in state.watch.observe(nodes, SystemTime::now()) {
            tracing::warn!(node = %p.node, was = %p.was,
                "redis cluster failover: a replica took its master's slots");
        }
        let listed = state.watch.nodes();
        if !listed.is_empty() {
            state.nodes = listed;
        }
        let owners = state.watch.owners()?;
        match &state.owners {
            None => {
                state.owners = Some(owners);
                None
            }
            Some(had) if *had != owners => Some((owners, state.generation)),
            Some(_) => None,
        }
    }

    /// Replaces the connection of `generation` by one made from `owners`, and cuts short
    /// the calls waiting on the old one. On failure the old one stays, and the next look
    /// tries again.
    async fn reconnect(&self, owners: BTreeSet<String>, generation: u64) {
        let nodes: Vec<ConnectionInfo> = owners
            .iter()
            .filter_map(|a| node_info(&self.shared.seed, a))
            .collect();
        let limit = self.shared.opts.connect_timeout * 2 + LOOK_LIMIT;
        let made = tokio::time::timeout(limit, async {
            let client = cluster_client(nodes, &self.shared.opts)?;
            let conn = client.get_async_connection().await?;
            Ok::<_, redis::RedisError>((client, conn))
        })
        .await;
        match made {
            Ok(Ok((client, conn))) => {
                let mut state = self.state();
                if state.generation == generation {
                    tracing::warn!(masters = ?owners,
                        "the redis cluster's masters changed; reconnected to the new ones");
                    state.conn = conn;
                    state.client = client;
                    state.generation += 1;
                    state.owners = Some(owners);
                    self.shared.switch.to(state.generation);
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, masters = ?owners,
                "the redis cluster's masters changed; reconnecting failed, trying again"),
            Err(_) => tracing::warn!(masters = ?owners,
                "the redis cluster's masters changed; reconnecting timed out, trying again"),
        }
    }

    /// Notes how a look went, saying a failure once until a look succeeds again.
    fn look_went(&self, answered: bool) {
        let mut state = self.state();
        if !answered && !state.look_failed {
            tracing::warn!(
                "no redis cluster node answered CLUSTER NODES (does the ACL grant \
                 +cluster|nodes?): failovers are followed only when calls fail"
            );
        }
        state.look_failed = !answered;
    }
}

/// The watcher of one [`ClusterConn`] (see the module's doc). It ends with the last clone
/// of the connection.
async fn watch(shared: Weak<Shared>, mut looker: Looker) {
    loop {
        tokio::time::sleep(RECHECK).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        ClusterConn { shared }.look(&mut looker).await;
    }
}

impl ClusterConn {
    /// One look at the cluster, and a new connection if its masters changed.
    async fn look(&self, looker: &mut Looker) {
        let nodes = self.state().nodes.clone();
        let text = looker.look(&self.shared, &nodes).await;
        self.look_went(text.is_some());
        if let Some((owners, generation)) = text.and_then(|t| self.observe(&t)) {
            self.reconnect(owners, generation).await;
        }
    }
}

/// The watcher's own connections, one per node asked, kept between looks.
#[derive(Default)]
struct Looker {
    conns: HashMap<String, MultiplexedConnection>,
    /// The node that answered last, asked first next time.
    last: Option<String>,
}

impl Looker {
    /// `CLUSTER NODES` from the first of `nodes` (the seed when none is known yet) that
    /// answers in time.
    async fn look(&mut self, shared: &Shared, nodes: &[String]) -> Option<String> {
        let mut order: Vec<String> = self.last.iter().cloned().collect();
        if nodes.is_empty() {
            order.push(shared.seed.addr().to_string());
        }
        order.extend(
            nodes
                .iter()
                .filter(|n| Some(*n) != self.last.as_ref())
                .cloned(),
        );
        for node in order {
            match tokio::time::timeout(LOOK_LIMIT, self.ask(shared, &node)).await {
                Ok(Ok(text)) => {
                    self.last = Some(node);
                    return Some(text);
                }
                _ => {
                    self.conns.remove(&node);
                }
            }
        }
        self.last = None;
        None
    }

    async fn ask(&mut self, shared: &Shared, node: &str) -> redis::RedisResult<String> {
        if !self.conns.contains_key(node) {
            let info = node_info(&shared.seed, node).ok_or_else(|| {
                redis::RedisError::from((redis::ErrorKind::Client, "not a host:port"))
            })?;
            let client = match &shared.opts.tls {
                Some(tls) => Client::build_with_tls(info, tls.certificates())?,
                None => Client::open(info)?,
            };
            let cfg = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(LOOK_LIMIT))
                .set_response_timeout(Some(LOOK_LIMIT));
            let conn = client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await?;
            self.conns.insert(node.to_string(), conn);
        }
        let conn = self.conns.get_mut(node).expect("inserted above");
        redis::cmd("CLUSTER").arg("NODES").query_async(conn).await
    }
}

/// The seed's settings at the node `addr` (`host:port`, as `CLUSTER NODES` writes it).
fn node_info(seed: &ConnectionInfo, addr: &str) -> Option<ConnectionInfo> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let at = match seed.addr() {
        ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host, port),
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        // (a cluster is reached over TCP; the seed was one)
        _ => return None,
    };
    Some(seed.clone().set_addr(at))
}

/// The crate's cluster client for `nodes`, with the options' timeouts, password and TLS.
pub(crate) fn cluster_client(
    nodes: Vec<ConnectionInfo>,
    opts: &ConnectOptions,
) -> Result<ClusterClient, redis::RedisError> {
    let mut builder = ClusterClientBuilder::new(nodes)
        .connection_timeout(opts.connect_timeout)
        .response_timeout(opts.response_timeout)
        .retries(3);
    if let Some(pw) = &opts.password {
        builder = builder.password(pw);
    }
    if let Some(tls) = &opts.tls {
        builder = builder.certs(tls.certificates());
    }
    builder.build()
}

const SWITCHED: &str = "the redis cluster's masters changed while the call waited";

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (mut conn, generation) = self.current();
            let call = conn.req_packed_command(cmd);
            self.shared
                .switch
                .unless_switched(call, generation, SWITCHED)
                .await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (mut conn, generation) = self.current();
            let call = conn.req_packed_commands(pipeline, offset, count);
            self.shared
                .switch
                .unless_switched(call, generation, SWITCHED)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.seed.redis_settings().db()
    }
}

#[cfg(test)]
mod tests {
    use super::node_info;
    use redis::IntoConnectionInfo;

    #[test]
    fn a_node_is_reached_with_the_seeds_settings_at_its_own_address() {
        let seed = "redis://app:pw@10.0.0.1:7000/0"
            .into_connection_info()
            .unwrap();
        let other = node_info(&seed, "10.0.0.4:7001").unwrap();
        assert_eq!(other.addr().to_string(), "10.0.0.4:7001");
        assert_eq!(other.redis_settings().username(), Some("app"));
        assert_eq!(other.redis_settings().password(), Some("pw"));
        let tls = "rediss://10.0.0.1:7000/0".into_connection_info().unwrap();
        let other = node_info(&tls, "[::1]:7002").unwrap();
        assert!(matches!(
            other.addr(),
            redis::ConnectionAddr::TcpTls { port: 7002, .. }
        ));
        assert!(node_info(&seed, "no-port").is_none());
    }
}
