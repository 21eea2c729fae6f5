//! The daemons' small HTTP/1 endpoint: `GET /metrics` for Prometheus and `GET /status` for
//! people and scripts (each role's own document, with the Redis node it talks to:
//! [`status_with_redis`]).
//!
//! The caller binds the listener, so a bad address or a port in use fails the daemon's
//! start-up instead of surfacing later from a background task.
//!
//! `serve_with` is the accept loop the api shares: a request head must arrive within a
//! timeout (which also closes idle keep-alive connections), connections are capped below
//! the descriptor limit, and shutdown has a grace period.

use std::convert::Infallible;
use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long requests in flight at shutdown may take to finish before they are cut off.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// How long to stop accepting after running out of file descriptors or memory, so the
/// loop does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How long a connection may take to send a request's head, counted from when the server
/// waits for one: a client that trickles its headers, and a keep-alive connection idle
/// that long, are closed, so neither holds a connection forever (the default of
/// `[api].read_timeout`, and the daemons' `/metrics` and `/status` endpoint's).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The most connections served at once; more wait in the listen backlog until one closes.
/// Kept well below the descriptor limit, so the daemon's own connections (Redis, files)
/// never run out because of its clients.
pub fn max_connections() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    (soft / 4 * 3).clamp(16, 16_384)
}

/// What the server answers with.
#[derive(Clone)]
pub struct Routes {
    /// Renders `/metrics`; `None` answers it with 404.
    pub metrics: Option<PrometheusHandle>,
    /// Builds the `/status` document, called once per request.
    pub status: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
}

/// A `/status` builder: the document a role's ticks rewrite in `doc`, with `"redis"` set
/// to the node `client` talks to as of the request (read from the client, no call to
/// Redis), so a failover shows at once rather than at the next tick.
pub fn status_with_redis(
    doc: Arc<std::sync::Mutex<serde_json::Value>>,
    client: crate::queue_client::QueueClient,
) -> Arc<dyn Fn() -> serde_json::Value + Send + Sync> {
    Arc::new(move || {
        let mut status = doc.lock().map(|s| s.clone()).unwrap_or_default();
        if let Some(fields) = status.as_object_mut() {
            fields.insert("redis".into(), serde_json::json!(client.redis_node()));
        }
        status
    })
}

/// Serves `routes` on `listener` until `shutdown` is cancelled.
///
/// On cancellation it stops accepting, lets requests in flight finish for a short grace
/// period, closes idle connections and returns. Errors of single connections are logged
/// and do not stop the server; only a listener that can no longer accept returns an error.
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let routes = Arc::new(routes);
    serve_with(
        listener,
        move |request| {
            let response = respond(&routes, &request);
            async move { response }
        },
        ConnectionRules::plain(HEADER_READ_TIMEOUT),
        shutdown,
    )
    .await
}

/// How a server started with [`serve_with`] treats its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionRules {
    /// How long a connection may take to send a request's head (see
    /// [`HEADER_READ_TIMEOUT`]).
    pub read_timeout: Duration,
    /// The most connections one peer address may hold at once; 0: no such limit. A
    /// connection past it is answered 429 and closed, so one client cannot take every
    /// connection the server serves.
    pub per_peer: usize,
    /// A connection that has not made an authenticated request this long after it was
    /// accepted is closed once no request of it is in flight (see [`authenticated`]), so
    /// clients without a token cannot hold connections for the whole `read_timeout`.
    /// `None`: no such deadline (the daemons' endpoints have no tokens).
    pub auth_timeout: Option<Duration>,
}

impl ConnectionRules {
    /// The daemons' endpoint: the header deadline only.
    pub fn plain(read_timeout: Duration) -> Self {
        Self {
            read_timeout,
            per_peer: 0,
            auth_timeout: None,
        }
    }
}

/// What a connection's handler may tell the accept loop about it; every request carries
/// one in its extensions.
#[derive(Debug, Default)]
pub struct ConnectionState {
    authenticated: std::sync::atomic::AtomicBool,
    in_flight: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// The address of the peer a request came from, in the request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub std::net::SocketAddr);

/// The address of the peer `request` came from (the TCP peer: behind a proxy, the
/// proxy's); `None` for a request that did not come through [`serve_with`].
pub fn peer_of<B>(request: &Request<B>) -> Option<std::net::SocketAddr> {
    request.extensions().get::<Peer>().map(|p| p.0)
}

/// Marks the connection `request` came on as authenticated: it is then no longer held to
/// [`ConnectionRules::auth_timeout`].
pub fn authenticated<B>(request: &Request<B>) {
    if let Some(state) = request.extensions().get::<Arc<ConnectionState>>() {
        state
            .authenticated
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How long a connection being closed by the server (refused, or never authenticated)
/// may take to finish what it is sending or receiving.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How often at most a warning about connection limits is logged; the hits in between
/// are counted into the next one.
const LIMIT_WARN_INTERVAL: Duration = Duration::from_secs(60);

/// The accept loop behind [`serve`], for any async handler: HTTP/1 with keep-alive, one
/// task per connection, the same shutdown (stop accepting, a grace period for requests in
/// flight, then cut), a connection's request head read within `rules.read_timeout`, at
/// most [`max_connections`] at once and `rules.per_peer` per peer address, and
/// connections that never authenticate closed after `rules.auth_timeout`. The task
/// service's API runs on it too.
pub async fn serve_with<H, F>(
    listener: TcpListener,
    handler: H,
    rules: ConnectionRules,
    shutdown: CancellationToken,
) -> io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let handler = Arc::new(handler);
    let mut connections = JoinSet::new();
    let limit = max_connections();
    let peers = Arc::new(PeerCounts::default());
    let mut at_limit = LimitWarning::default();
    let mut per_peer = LimitWarning::default();
    let mut was_full = false;
    loop {
        let full = connections.len() >= limit;
        if full && !was_full && at_limit.hit(std::time::Instant::now()) {
            let hits = at_limit.take();
            tracing::warn!(
                connections = limit,
                hits,
                "http connections at their limit; new ones wait until one closes"
            );
        }
        was_full = full;
        let (stream, peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            // Reaps finished connections so a long-lived server does not accumulate them.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept(), if !full => match accepted {
                Ok(accepted) => accepted,
                Err(e) => match classify_accept_error(&e) {
                    AcceptError::Connection => {
                        tracing::debug!(error = %e, "http accept failed");
                        continue;
                    }
                    AcceptError::Resources => {
                        tracing::warn!(error = %e, "http accept failed, backing off");
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                        }
                    }
                    AcceptError::Listener => return Err(e),
                },
            },
        };
        let Some(held) = peers.enter(peer.ip(), rules.per_peer) else {
            if per_peer.hit(std::time::Instant::now()) {
                let hits = per_peer.take();
                tracing::warn!(
                    peer = %peer.ip(),
                    limit = rules.per_peer,
                    hits,
                    "http connection refused: its peer holds its limit of connections"
                );
            }
            connections.spawn(refuse_peer(stream, rules.per_peer));
            continue;
        };
        // Small request/response exchanges: waiting for more bytes to fill a segment only
        // adds latency.
        let _ = stream.set_nodelay(true);
        let handler = Arc::clone(&handler);
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _held = held;
            serve_connection(stream, peer, handler, rules, shutdown).await;
        });
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::debug!(
            connections = connections.len(),
            "http connections cut off at shutdown"
        );
    }
    // Dropping the set aborts whatever is left.
    Ok(())
}

/// One connection, served until it closes, the server stops, or it is held to
/// [`ConnectionRules::auth_timeout`] and never authenticated.
async fn serve_connection<H, F>(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    handler: Arc<H>,
    rules: ConnectionRules,
    shutdown: CancellationToken,
) where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let state = Arc::new(ConnectionState::default());
    let on_request = Arc::clone(&state);
    let service = service_fn(move |mut request: Request<Incoming>| {
        let state = Arc::clone(&on_request);
        state
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        request.extensions_mut().insert(Arc::clone(&state));
        request.extensions_mut().insert(Peer(peer));
        let response = handler(request);
        async move {
            let response = response.await;
            if state
                .in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
                == 1
            {
                state.idle.notify_waiters();
            }
            Ok::<_, Infallible>(response)
        }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(rules.read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = unauthenticated_expiry(&state, rules.auth_timeout) => {
            tracing::debug!("http connection closed: no authenticated request in time");
            // (gracefully, so an answer being written goes out whole and the client sees
            // the close between requests; bounded, as a client may be mid-head)
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(CLOSE_GRACE, connection.as_mut()).await;
            return;
        }
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "http connection failed");
    }
}

/// Resolves once a connection held to `timeout` has passed it without authenticating and
/// has no request in flight; never for one that authenticated or has no such deadline.
async fn unauthenticated_expiry(state: &ConnectionState, timeout: Option<Duration>) {
    use std::sync::atomic::Ordering;
    let Some(timeout) = timeout else {
        return std::future::pending().await;
    };
    tokio::time::sleep(timeout).await;
    loop {
        // (registered before the look, so an end between the look and the wait is seen)
        let idle = state.idle.notified();
        if state.authenticated.load(Ordering::Relaxed) {
            return std::future::pending().await;
        }
        if state.in_flight.load(Ordering::SeqCst) == 0 {
            return;
        }
        idle.await;
    }
}

/// Answers a connection past its peer's limit with 429 and closes it.
async fn refuse_peer(mut stream: tokio::net::TcpStream, limit: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::json!({
        "error": format!(
            "too many connections from this address: the limit is {limit} ([api].max_connections_per_peer)"
        )
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // (bounded: a peer that does not read must not keep this task. What it sent is read
    // to its end before the close: closing with unread data resets the connection, and
    // the reset drops the 429 on the client's side.)
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
}

/// Connections held per peer address.
#[derive(Debug, Default)]
struct PeerCounts {
    held: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One connection counted against its peer; uncounted when dropped.
struct PeerHold {
    peers: Arc<PeerCounts>,
    ip: std::net::IpAddr,
}

impl PeerCounts {
    /// Counts a connection from `ip`, or `None` when it already holds `limit` (0: none).
    fn enter(self: &Arc<Self>, ip: std::net::IpAddr, limit: usize) -> Option<PeerHold> {
        let mut held = self.held.lock().expect("peer counts lock");
        let n = held.entry(ip).or_default();
        if limit > 0 && *n >= limit {
            return None;
        }
        *n += 1;
        Some(PeerHold {
            peers: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for PeerHold {
    fn drop(&mut self) {
        let mut held = self.peers.held.lock().expect("peer counts lock");
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// A warning said at most once a minute, with how often its cause
/// happened since it was last said: a limit hit again and again as connections turn over
/// makes one line a minute, not one per hit.
#[derive(Debug, Default)]
pub struct LimitWarning {
    last: Option<std::time::Instant>,
    hits: u64,
}

impl LimitWarning {
    /// Counts one hit at `now`; true when the warning is to be said now (then
    /// [`take`](Self::take) the count).
    pub fn hit(&mut self, now: std::time::Instant) -> bool {
        self.hits += 1;
        let due = self
            .last
            .is_none_or(|last| now.duration_since(last) >= LIMIT_WARN_INTERVAL);
        if due {
            self.last = Some(now);
        }
        due
    }

    /// The hits counted since the warning was last said, starting the count again.
    pub fn take(&mut self) -> u64 {
        std::mem::take(&mut self.hits)
    }
}

/// What an accept error says about the listener.
enum AcceptError {
    /// One incoming connection failed (aborted, refused by a firewall, ...): go on.
    Connection,
    /// Out of descriptors or memory: wait a little, it may pass.
    Resources,
    /// The listener itself is unusable.
    Listener,
}

fn classify_accept_error(e: &io::Error) -> AcceptError {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => AcceptError::Resources,
        Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EFAULT) => AcceptError::Listener,
        _ => AcceptError::Connection,
    }
}

/// Answers one request; the request body is never needed.
fn respond(routes: &Routes, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path();
    let known = match path {
        "/metrics" => routes.metrics.is_some(),
        "/status" => true,
        _ => false,
    };
    if !known {
        return text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
    }
    if request.method() != Method::GET {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n".into(),
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return response;
    }
    match (path, &routes.metrics) {
        ("/metrics", Some(handle)) => {
            // Histograms and summaries are only correct after upkeep; doing it per scrape
            // saves every daemon a background task.
            handle.run_upkeep();
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                handle.render(),
            )
        }
        _ => text(
            StatusCode::OK,
            "application/json",
            (routes.status)().to_string(),
        ),
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The process's Prometheus recorder, installed as the global `metrics` recorder on the
/// first call; later calls return the same handle.
///
/// Tests start several daemons in one process, and a second global recorder would be
/// refused. If some other recorder was installed first, the handle still works but renders
/// nothing, which is logged rather than fatal: metrics are not worth failing a daemon for.
pub fn install_metrics() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // (the start delay is a histogram with buckets, so alerts can sum them across
            // hosts; the rest stay summaries, each process's quantiles)
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("gaffer_task_start_delay_seconds".into()),
                    &crate::host::proto::START_DELAY_BUCKETS,
                )
                .expect("the start delay buckets are not empty")
                .build_recorder();
            let handle = recorder.handle();
            if let Err(e) = metrics::set_global_recorder(recorder) {
                tracing::warn!(error = %e, "metrics recorder not installed, /metrics stays empty");
            }
            handle
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::task::JoinHandle;

    use super::*;

    /// Bounds each await so a broken server fails the test instead of hanging it.
    const LIMIT: Duration = Duration::from_secs(10);

    struct Server {
        addr: SocketAddr,
        shutdown: CancellationToken,
        task: JoinHandle<io::Result<()>>,
    }

    async fn start(metrics: Option<PrometheusHandle>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let routes = Routes {
            metrics,
            status: Arc::new(|| serde_json::json!({"host": "h1", "slots": 3})),
        };
        let task = tokio::spawn(serve(listener, routes, shutdown.clone()));
        Server {
            addr,
            shutdown,
            task,
        }
    }

    /// Sends one raw request and returns the status code, the header block and the body.
    async fn request(addr: SocketAddr, method: &str, path: &str) -> (u16, String, String) {
        let exchange = async {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut raw = String::new();
            stream.read_to_string(&mut raw).await.unwrap();
            raw
        };
        let raw = tokio::time::timeout(LIMIT, exchange).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_lowercase(), body.to_owned())
    }

    async fn stop(server: Server) {
        server.shutdown.cancel();
        let result = tokio::time::timeout(LIMIT, server.task).await;
        result.unwrap().unwrap().unwrap();
    }

    #[tokio::test]
    async fn serves_metrics_and_status() {
        let handle = install_metrics();
        let server = start(Some(handle)).await;
        metrics::counter!("gaffer_test_total").increment(3);

        let (status, head, body) = request(server.addr, "GET", "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(
            body.lines().any(|line| line == "gaffer_test_total 3"),
            "{body}"
        );

        let (status, head, body) = request(server.addr, "GET", "/status").await;
        assert_eq!(status, 200);
        assert!(head.contains("content-type: application/json"), "{head}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json, serde_json::json!({"host": "h1", "slots": 3}));

        stop(server).await;
    }

    #[tokio::test]
    async fn install_metrics_twice_returns_the_same_recorder() {
        let first = install_metrics();
        metrics::counter!("gaffer_test_twice_total").increment(1);
        assert!(
            install_metrics()
                .render()
                .contains("gaffer_test_twice_total 1")
        );
        assert!(first.render().contains("gaffer_test_twice_total 1"));
    }

    #[tokio::test]
    async fn unknown_paths_and_methods() {
        let server = start(None).await;
        assert_eq!(request(server.addr, "GET", "/nope").await.0, 404);
        // No handle: /metrics does not exist on this daemon.
        assert_eq!(request(server.addr, "GET", "/metrics").await.0, 404);
        let (status, head, _) = request(server.addr, "POST", "/status").await;
        assert_eq!(status, 405);
        assert!(head.contains("allow: get"), "{head}");
        stop(server).await;
    }

    #[test]
    fn a_limit_warning_is_said_once_a_minute_with_the_hits_between() {
        let mut w = LimitWarning::default();
        let t0 = std::time::Instant::now();
        assert!(w.hit(t0));
        assert_eq!(w.take(), 1);
        for s in 1..=59 {
            assert!(!w.hit(t0 + Duration::from_secs(s)), "said again after {s}s");
        }
        assert!(w.hit(t0 + Duration::from_secs(60)));
        assert_eq!(w.take(), 60, "the 59 unsaid hits and this one");
        assert!(!w.hit(t0 + Duration::from_secs(61)));
    }

    #[tokio::test]
    async fn cancel_returns_despite_an_idle_connection() {
        let server = start(None).await;
        // Connected but silent: must not keep the server alive past shutdown.
        let mut idle = TcpStream::connect(server.addr).await.unwrap();
        assert_eq!(request(server.addr, "GET", "/status").await.0, 200);
        stop(server).await;
        let mut rest = Vec::new();
        let read = tokio::time::timeout(LIMIT, idle.read_to_end(&mut rest)).await;
        assert_eq!(read.unwrap().unwrap(), 0, "the idle connection is closed");
    }
}
