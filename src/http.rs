//! The daemons' small HTTP/1 endpoint: `GET /metrics` for Prometheus and `GET /status` for
//! people and `gaffer status`.
//!
//! The caller binds the listener, so a bad address or a port in use fails the daemon's
//! start-up instead of surfacing later from a background task.

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
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
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
        HEADER_READ_TIMEOUT,
        shutdown,
    )
    .await
}

/// The accept loop behind [`serve`], for any async handler: HTTP/1 with keep-alive, one
/// task per connection, the same shutdown (stop accepting, a grace period for requests in
/// flight, then cut), a connection's request head read within `read_timeout` (see
/// [`HEADER_READ_TIMEOUT`]), at most [`max_connections`] at once. The task service's API
/// runs on it too.
pub async fn serve_with<H, F>(
    listener: TcpListener,
    handler: H,
    read_timeout: Duration,
    shutdown: CancellationToken,
) -> io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let handler = Arc::new(handler);
    let mut connections = JoinSet::new();
    let limit = max_connections();
    let mut at_limit_said = false;
    loop {
        let full = connections.len() >= limit;
        if full && !at_limit_said {
            tracing::warn!(
                connections = limit,
                "http connections at their limit; new ones wait until one closes"
            );
        }
        at_limit_said = full;
        let stream = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            // Reaps finished connections so a long-lived server does not accumulate them.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept(), if !full => match accepted {
                Ok((stream, _peer)) => stream,
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
        // Small request/response exchanges: waiting for more bytes to fill a segment only
        // adds latency.
        let _ = stream.set_nodelay(true);
        let handler = Arc::clone(&handler);
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let service = service_fn(move |request| {
                let response = handler(request);
                async move { Ok::<_, Infallible>(response.await) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "http connection failed");
            }
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
            let recorder = PrometheusBuilder::new().build_recorder();
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
