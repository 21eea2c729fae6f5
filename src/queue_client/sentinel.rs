//! Redis behind Sentinel: `redis+sentinel://HOST:PORT,HOST:PORT/NAME/DB` (`rediss+sentinel`
//! for TLS to the sentinels and the data nodes alike). The sentinels are asked which server
//! is the primary of `NAME`; the connection follows the primary when they promote another.
//!
//! [`SentinelConn`] holds one multiplexed connection to the current primary. A reply that
//! says the connection is no longer worth using (the socket dropped, refused or timed out,
//! or `READONLY` from a primary demoted to a replica) marks it broken, and the next call
//! asks the sentinels again: the failed call returns its error, as a call to a server that
//! went away does, and callers retry it after their own backoff. A `READONLY` reply comes
//! back as a dropped connection, so every caller treats it as the outage it is rather
//! than as a server configured read-only. A watcher task asks a sentinel every
//! [`RECHECK`] which primary it names (`SENTINEL GET-MASTER-ADDR-BY-NAME`, on a connection
//! of its own); when that is not the one the connection talks to, the connection is
//! dropped and the calls waiting on it fail at once, so a primary that froze (rather than
//! died) holds no call for the whole response timeout, and one demoted while it stayed
//! reachable serves no stale reads.
//!
//! Credentials: the URL's `user:password@` (or `[cluster] redis_password_file`) log in to
//! the data nodes; `sentinel_user` and `sentinel_password` in the query log in to the
//! sentinels, which Redis configures apart (`requirepass` in sentinel.conf).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, Client, Cmd, ConnectionAddr, Pipeline, RedisFuture, Value};

use super::QueueError;
use super::conn::ConnectOptions;
use super::follow::Switch;

/// How often the watcher asks a sentinel which primary it names.
const RECHECK: Duration = Duration::from_secs(1);

/// A parsed `redis+sentinel://` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// `rediss+sentinel`: TLS to the sentinels and the data nodes.
    pub tls: bool,
    /// The sentinels' host and port (26379 when the URL gives none).
    pub sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the primary under.
    pub service: String,
    /// The database of the data nodes.
    pub db: i64,
    /// The data nodes' user, if any.
    pub user: Option<String>,
    /// The data nodes' password, if any.
    pub password: Option<String>,
    /// The sentinels' user (`sentinel_user=` in the query).
    pub sentinel_user: Option<String>,
    /// The sentinels' password (`sentinel_password=` in the query).
    pub sentinel_password: Option<String>,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("tls", &self.tls)
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("db", &self.db)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("sentinel_user", &self.sentinel_user)
            .finish()
    }
}

/// The default port of a sentinel.
const SENTINEL_PORT: u16 = 26379;

impl SentinelUrl {
    /// `None` when `url` is not a Sentinel URL at all; otherwise the URL or what is wrong
    /// with it.
    pub fn parse(url: &str) -> Option<Result<SentinelUrl, String>> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss+sentinel://") {
            (true, rest)
        } else {
            return None;
        };
        Some(Self::parse_rest(tls, rest))
    }

    fn parse_rest(tls: bool, rest: &str) -> Result<SentinelUrl, String> {
        const SHAPE: &str = "expected redis+sentinel://HOST:PORT,HOST:PORT/NAME[/DB]";
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (hosts, path) = rest.split_once('/').ok_or(SHAPE)?;
        let (creds, hosts) = match hosts.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, hosts),
        };
        let (user, password) = match creds {
            Some(c) => match c.split_once(':') {
                Some((u, p)) => (non_empty(u), non_empty(p)),
                None => (non_empty(c), None),
            },
            None => (None, None),
        };
        let sentinels = hosts
            .split(',')
            .map(host_port)
            .collect::<Result<Vec<_>, _>>()?;
        let mut parts = path.trim_end_matches('/').split('/');
        let service = parts.next().filter(|s| !s.is_empty()).ok_or(format!(
            "no primary name after the sentinels' addresses ({SHAPE})"
        ))?;
        let db = match parts.next() {
            Some(d) => d
                .parse::<i64>()
                .map_err(|_| format!("the database {d:?} is not a number ({SHAPE})"))?,
            None => 0,
        };
        if parts.next().is_some() {
            return Err(format!("too many path segments ({SHAPE})"));
        }
        let mut url = SentinelUrl {
            tls,
            sentinels,
            service: service.to_string(),
            db,
            user,
            password,
            sentinel_user: None,
            sentinel_password: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sentinel_user", v)) => url.sentinel_user = non_empty(v),
                Some(("sentinel_password", v)) => url.sentinel_password = non_empty(v),
                _ => {
                    return Err(format!(
                        "unknown query parameter {:?} (known: sentinel_user, sentinel_password)",
                        pair.split('=').next().unwrap_or(pair)
                    ));
                }
            }
        }
        Ok(url)
    }

    /// The redis crate's client for this URL and the options (a password file overrides
    /// the URL's password; TLS files apply to sentinels and data nodes alike).
    fn client(&self, opts: &ConnectOptions) -> Result<SentinelClient, QueueError> {
        let addrs = self.sentinels.iter().map(|(host, port)| {
            if self.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let invalid = |e: redis::RedisError| QueueError::Invalid(format!("bad redis url: {e}"));
        let mut b = SentinelClientBuilder::new(addrs, &self.service, SentinelServerType::Master)
            .map_err(invalid)?
            .set_client_to_redis_db(self.db);
        if let Some(u) = &self.user {
            b = b.set_client_to_redis_username(u);
        }
        if let Some(p) = opts.password.as_ref().or(self.password.as_ref()) {
            b = b.set_client_to_redis_password(p);
        }
        if let Some(u) = &self.sentinel_user {
            b = b.set_client_to_sentinel_username(u);
        }
        if let Some(p) = &self.sentinel_password {
            b = b.set_client_to_sentinel_password(p);
        }
        if self.tls {
            b = b
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
            if let Some(tls) = &opts.tls {
                b = b
                    .set_client_to_redis_certificates(tls.certificates())
                    .set_client_to_sentinel_certificates(tls.certificates());
            }
        }
        b.build().map_err(invalid)
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn host_port(s: &str) -> Result<(String, u16), String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("an empty sentinel address in the list".into());
    }
    // `[::1]:26379`: the port follows the bracket.
    let (host, port) = match s.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or(format!("sentinel address {s:?}: unclosed '['"))?;
            (host, after.strip_prefix(':'))
        }
        None => match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        },
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("sentinel address {s:?}: the port is not a number"))?,
        None => SENTINEL_PORT,
    };
    Ok((host.to_string(), port))
}

/// Where a connection through Sentinel stands: the primary it talks to and its failovers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryFacts {
    /// `host:port` of the primary, as the sentinels named it last.
    pub primary: String,
    /// How many times this process saw the sentinels name another primary.
    pub failovers: u64,
    /// When it last saw that.
    pub last_failover: Option<SystemTime>,
}

/// A connection to the primary the sentinels name, following it across failovers. Cheap
/// to clone; clones share the connection.
#[derive(Clone)]
pub struct SentinelConn {
    shared: Arc<Shared>,
}

struct Shared {
    /// Held while asking the sentinels, so a burst of failed calls asks once.
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The primary's name for the sentinels (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    service: String,
    state: Mutex<State>,
    /// The generation of the connection; a call in flight on an older one is cut short.
    switch: Switch,
    config: AsyncConnectionConfig,
    /// Bounds one round of asking the sentinels and connecting to the primary.
    resolve_limit: Duration,
}

struct State {
    conn: Option<(MultiplexedConnection, Client)>,
    /// Bumped when the connection is dropped, so a late failure of an old connection
    /// does not drop a new one.
    generation: u64,
    facts: Option<PrimaryFacts>,
}

impl SentinelConn {
    /// Asks the sentinels for the primary and connects to it.
    pub(crate) async fn connect(
        url: &SentinelUrl,
        opts: &ConnectOptions,
    ) -> Result<Self, QueueError> {
        let client = url.client(opts)?;
        let conn = SentinelConn {
            shared: Arc::new(Shared {
                sentinel: tokio::sync::Mutex::new(client),
                service: url.service.clone(),
                state: Mutex::new(State {
                    conn: None,
                    generation: 0,
                    facts: None,
                }),
                switch: Switch::new(),
                config: AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(opts.connect_timeout))
                    .set_response_timeout(Some(opts.response_timeout)),
                resolve_limit: opts.connect_timeout * 2,
            }),
        };
        conn.current().await?;
        tokio::spawn(watch(Arc::downgrade(&conn.shared)));
        Ok(conn)
    }

    /// The primary it talks to and the failovers it saw.
    pub fn facts(&self) -> Option<PrimaryFacts> {
        self.shared
            .state
            .lock()
            .expect("sentinel state")
            .facts
            .clone()
    }

    /// A client for the current primary, for dedicated connections (blocking waits).
    pub(crate) async fn primary_client(&self) -> Result<Client, redis::RedisError> {
        Ok(self.current().await?.1)
    }

    /// Asks the sentinels for the primary and connects to it. While they name no healthy
    /// primary (it is down and not replaced yet) the error is an outage, as a refused
    /// connection is: callers wait it out.
    async fn resolve(
        &self,
        sentinel: &mut SentinelClient,
    ) -> Result<(MultiplexedConnection, Client), redis::RedisError> {
        let client = sentinel.async_get_client().await.map_err(|e| {
            if matches!(
                e.kind(),
                redis::ErrorKind::MasterNameNotFoundBySentinel
                    | redis::ErrorKind::NoValidReplicasFoundBySentinel
            ) {
                redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the sentinels name no healthy primary (it is down and not replaced yet, \
                     or none is monitored under the URL's name)",
                ))
            } else {
                e
            }
        })?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.shared.config)
            .await?;
        Ok((conn, client))
    }

    /// The current connection, asking the sentinels first when there is none.
    async fn current(&self) -> Result<(MultiplexedConnection, Client, u64), redis::RedisError> {
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let mut sentinel = self.shared.sentinel.lock().await;
        // Another call may have reconnected while this one waited.
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let (conn, client) =
            tokio::time::timeout(self.shared.resolve_limit, self.resolve(&mut sentinel))
                .await
                .map_err(|_| timed_out("asking the sentinels for the primary timed out"))??;
        let addr = client.get_connection_info().addr().to_string();
        let mut state = self.shared.state.lock().expect("sentinel state");
        state.note_primary(&addr);
        state.conn = Some((conn.clone(), client.clone()));
        Ok((conn, client, state.generation))
    }

    fn cached(&self) -> Option<(MultiplexedConnection, Client, u64)> {
        let state = self.shared.state.lock().expect("sentinel state");
        let (conn, client) = state.conn.clone()?;
        Some((conn, client, state.generation))
    }

    /// Forgets the connection of `generation`, so the next call asks the sentinels.
    fn drop_conn(&self, generation: u64) {
        let mut state = self.shared.state.lock().expect("sentinel state");
        if state.generation == generation {
            state.generation += 1;
            state.conn = None;
            self.shared.switch.to(state.generation);
        }
    }

    /// A `READONLY` reply (the driver hands server errors back as values): the primary
    /// became a replica, so the connection is dropped and the call fails as a dropped
    /// connection does (see the module's doc).
    fn unless_demoted(&self, values: &[Value], generation: u64) -> redis::RedisResult<()> {
        let demoted = values
            .iter()
            .any(|v| matches!(v, Value::ServerError(e) if e.code() == "READONLY"));
        if !demoted {
            return Ok(());
        }
        self.drop_conn(generation);
        let primary = self.facts().map(|f| f.primary).unwrap_or_default();
        Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            format!(
                "the redis primary at {primary} became a replica (READONLY); \
                 asking the sentinels for the new one"
            ),
        )))
    }

    /// What a failed call means for the connection: dropped when it is no longer worth
    /// using.
    fn after_error(&self, e: redis::RedisError, generation: u64) -> redis::RedisError {
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
        {
            self.drop_conn(generation);
        }
        e
    }
}

impl SentinelConn {
    /// Runs `call` on the connection of `generation`, cut short with a dropped-connection
    /// error when that connection is dropped meanwhile (the watcher saw another primary).
    async fn unless_switched<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
        generation: u64,
    ) -> redis::RedisResult<T> {
        let call = async { call.await.map_err(|e| self.after_error(e, generation)) };
        self.shared
            .switch
            .unless_switched(
                call,
                generation,
                "the sentinels named another redis primary while the call waited",
            )
            .await
    }
}

/// The watcher of one [`SentinelConn`]: every [`RECHECK`], which primary a sentinel names;
/// another one than the connection's drops the connection. It ends with the last clone of
/// the connection.
async fn watch(shared: std::sync::Weak<Shared>) {
    let mut sentinel: Option<MultiplexedConnection> = None;
    loop {
        tokio::time::sleep(RECHECK).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let this = SentinelConn { shared };
        match tokio::time::timeout(this.shared.resolve_limit, this.named_primary(&mut sentinel))
            .await
        {
            Ok(Ok(named)) => {
                let (current, generation) = {
                    let state = this.shared.state.lock().expect("sentinel state");
                    let current = state
                        .conn
                        .as_ref()
                        .map(|(_, c)| c.get_connection_info().addr().to_string());
                    (current, state.generation)
                };
                if let Some(current) = current
                    && current != named
                {
                    tracing::warn!(primary = %named, was = %current,
                        "the sentinels name another redis primary; reconnecting");
                    this.drop_conn(generation);
                }
            }
            // (asked again next time, on a new connection; a failed call asks anyway)
            _ => sentinel = None,
        }
    }
}

impl SentinelConn {
    /// `host:port` of the primary a sentinel names, on the watcher's connection `conn`
    /// (opened when there is none).
    async fn named_primary(
        &self,
        conn: &mut Option<MultiplexedConnection>,
    ) -> redis::RedisResult<String> {
        if conn.is_none() {
            let client = self
                .shared
                .sentinel
                .lock()
                .await
                .async_get_sentinel_client()
                .await?;
            *conn = Some(
                client
                    .get_multiplexed_async_connection_with_config(&self.shared.config)
                    .await?,
            );
        }
        let c = conn.as_mut().expect("opened above");
        let (host, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.shared.service)
            .query_async(c)
            .await?;
        Ok(ConnectionAddr::Tcp(host, port).to_string())
    }
}

impl State {
    /// Notes the primary the sentinels named; another one than before is a failover.
    fn note_primary(&mut self, addr: &str) {
        match &mut self.facts {
            None => {
                self.facts = Some(PrimaryFacts {
                    primary: addr.to_string(),
                    failovers: 0,
                    last_failover: None,
                });
            }
            Some(f) if f.primary != addr => {
                tracing::warn!(primary = %addr, was = %f.primary, "redis primary changed");
                f.primary = addr.to_string();
                f.failovers += 1;
                f.last_failover = Some(SystemTime::now());
            }
            Some(_) => {}
        }
    }
}

fn timed_out(what: &str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        what.to_string(),
    ))
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (mut conn, _, generation) = self.current().await?;
            let call = conn.req_packed_command(cmd);
            let value = self.unless_switched(call, generation).await?;
            self.unless_demoted(std::slice::from_ref(&value), generation)?;
            Ok(value)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (mut conn, _, generation) = self.current().await?;
            let call = conn.req_packed_commands(pipeline, offset, count);
            let values = self.unless_switched(call, generation).await?;
            self.unless_demoted(&values, generation)?;
            Ok(values)
        })
    }

    fn get_db(&self) -> i64 {
        self.shared
            .state
            .lock()
            .expect("sentinel state")
            .conn
            .as_ref()
            .map_or(0, |(_, c)| c.get_connection_info().redis_settings().db())
    }
}

#[cfg(test)]
mod tests {
    use super::SentinelUrl;

    fn parse(url: &str) -> Result<SentinelUrl, String> {
        SentinelUrl::parse(url).expect("a sentinel url")
    }

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_primary_and_the_database() {
        let u = parse("redis+sentinel://a:26380,b,[::1]:26381/gaffer/3").unwrap();
        assert!(!u.tls);
        assert_eq!(
            u.sentinels,
            [
                ("a".to_string(), 26380),
                ("b".to_string(), 26379),
                ("::1".to_string(), 26381)
            ]
        );
        assert_eq!((u.service.as_str(), u.db), ("gaffer", 3));
        let u = parse("rediss+sentinel://app:pw@h:1/main?sentinel_password=spw").unwrap();
        assert!(u.tls);
        assert_eq!(u.db, 0);
        assert_eq!(u.user.as_deref(), Some("app"));
        assert_eq!(u.password.as_deref(), Some("pw"));
        assert_eq!(u.sentinel_password.as_deref(), Some("spw"));
        assert!(!format!("{u:?}").contains("pw\""), "{u:?}");
        assert!(SentinelUrl::parse("redis://h:1/0").is_none());
    }

    #[test]
    fn a_bad_sentinel_url_says_what_is_wrong() {
        for (url, says) in [
            ("redis+sentinel://h:1", "expected redis+sentinel://"),
            ("redis+sentinel://h:1/", "no primary name"),
            ("redis+sentinel://h:x/m", "the port is not a number"),
            ("redis+sentinel://h:1,,h:2/m", "an empty sentinel address"),
            ("redis+sentinel://h:1/m/x", "is not a number"),
            ("redis+sentinel://h:1/m/0/1", "too many path segments"),
            (
                "redis+sentinel://h:1/m?pass=x",
                "unknown query parameter \"pass\"",
            ),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
        }
    }
}
