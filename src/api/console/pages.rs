//! The console's routes under `/ui/`: the pages and files, the login form's post, logout
//! and the session's description for the page's script. Every answer carries the
//! security headers (`headers.rs`); none reads Redis.

use std::time::Instant;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{
    ALLOW, CACHE_CONTROL, ETAG, HOST, HeaderMap, HeaderValue, IF_NONE_MATCH, ORIGIN, RETRY_AFTER,
    SET_COOKIE,
};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use super::headers::{self, redirect};
use super::{ConsoleError, Via, Visitor, assets, check_csrf, csrf, identify, proxy, session};
use crate::api::error::ApiError;
use crate::api::routes::{Api, query_pairs, read_body};
use crate::config::{ConsoleConfig, KeyQueues};

/// The largest login form accepted: a token and a little.
const MAX_LOGIN_BODY: u64 = 8 << 10;

/// What the login counter's `outcome` label says.
const OUTCOMES: [&str; 4] = ["ok", "failed", "limited", "cross_site"];

/// Registers the console's counters at zero, so alerts see them before the first event.
pub(super) fn register_metrics() {
    for outcome in OUTCOMES {
        metrics::counter!("gaffer_console_logins_total", "outcome" => outcome).increment(0);
    }
    metrics::counter!("gaffer_console_csrf_refused_total").increment(0);
    metrics::counter!("gaffer_console_proxy_header_ignored_total").increment(0);
}

fn count_login(outcome: &'static str) {
    metrics::counter!("gaffer_console_logins_total", "outcome" => outcome).increment(1);
}

/// Answers a request under `/ui` (the caller checked [`super::Console::owns`]), with the
/// route name the request metrics count it under.
pub(in crate::api) async fn serve(
    api: &Api,
    request: Request<Incoming>,
) -> (&'static str, Response<Full<Bytes>>) {
    let Some(settings) = api.console.settings.as_ref() else {
        return (
            "console_unknown",
            headers::error(StatusCode::NOT_FOUND, "no console"),
        );
    };
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    let reads = method == Method::GET || method == Method::HEAD;
    let (route, allowed): (&'static str, &'static str) = match path.as_str() {
        "/ui" | "/ui/" => ("console_page", "GET, HEAD"),
        "/ui/login" => ("console_login", "GET, HEAD, POST"),
        "/ui/logout" => ("console_logout", "POST"),
        "/ui/session" => ("console_session", "GET, HEAD"),
        _ => ("console_asset", "GET, HEAD"),
    };
    let answer = match (path.as_str(), reads) {
        ("/ui", true) => redirect(StatusCode::PERMANENT_REDIRECT, "/ui/"),
        ("/ui/", true) => index(api, settings, &request),
        ("/ui/login", true) => login_page(api, settings, &request),
        ("/ui/login", false) if method == Method::POST => login(api, settings, request).await,
        ("/ui/logout", false) if method == Method::POST => logout(api, settings, &request),
        ("/ui/session", true) => session_answer(api, settings, &request),
        (other, true) if route == "console_asset" => {
            match other.strip_prefix("/ui/").and_then(assets::served_as) {
                Some(asset) => file(asset, request.headers()),
                None => {
                    let message = format!("no such page {path}");
                    return (
                        "console_unknown",
                        headers::error(StatusCode::NOT_FOUND, &message),
                    );
                }
            }
        }
        _ => not_allowed(&method, &path, allowed),
    };
    (route, answer)
}

fn not_allowed(method: &Method, path: &str, allowed: &'static str) -> Response<Full<Bytes>> {
    let message = format!("{method} is not allowed on {path}: use {allowed}");
    let mut r = headers::error(StatusCode::METHOD_NOT_ALLOWED, &message);
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allowed));
    r
}

/// An embedded file, or 304 when the browser's copy is this one.
fn file(asset: &'static assets::Asset, request: &HeaderMap) -> Response<Full<Bytes>> {
    let tag = assets::etag(asset);
    let fresh = request
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == tag || t.trim() == "*");
    let mut r = if fresh {
        let mut r = headers::answer(StatusCode::NOT_MODIFIED, asset.content_type, Bytes::new());
        // (a 304 has no body: the type is the cached copy's)
        r.headers_mut().remove(hyper::header::CONTENT_TYPE);
        r
    } else {
        headers::answer(StatusCode::OK, asset.content_type, asset.body)
    };
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r.headers_mut().insert(ETAG, HeaderValue::from_static(tag));
    r
}

/// A refusal of the console as an answer.
fn refusal(e: ConsoleError) -> Response<Full<Bytes>> {
    let e = ApiError::from(e);
    headers::error(e.status, &e.message)
}

/// `/ui/`: the console for a visitor, the login form for anyone else.
fn index(
    api: &Api,
    settings: &ConsoleConfig,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    match identify(api, settings, request) {
        Ok(Some(_)) => {
            crate::http::authenticated(request);
            file(page("index.html"), request.headers())
        }
        Ok(None) | Err(ConsoleError::BadSession) => redirect(StatusCode::SEE_OTHER, "/ui/login"),
        Err(e) => refusal(e),
    }
}

fn page(name: &str) -> &'static assets::Asset {
    assets::file(name).expect("the console's pages are embedded")
}

/// `GET /ui/login`: the form; a proxy's user, who needs none, goes to the console.
fn login_page(
    api: &Api,
    settings: &ConsoleConfig,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    if let Ok(Some(Visitor {
        via: Via::Proxy { .. },
        ..
    })) = identify(api, settings, request)
    {
        return redirect(StatusCode::SEE_OTHER, "/ui/");
    }
    file(page("login.html"), request.headers())
}

/// Whether a login post came from another site's page: the browser says so in
/// `Sec-Fetch-Site`, or, from one that does not send it, in an `Origin` naming another
/// host than the request's. A post without either (a script, curl) is not a browser's.
fn cross_site(settings: &ConsoleConfig, request: &Request<Incoming>) -> bool {
    let headers = request.headers();
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if let Some(site) = text("sec-fetch-site") {
        return !matches!(site, "same-origin" | "none");
    }
    let Some(origin) = text(ORIGIN.as_str()) else {
        return false;
    };
    let from_proxy = proxy::trusted(settings, crate::http::peer_of(request));
    let host = text("x-forwarded-host")
        .filter(|_| from_proxy)
        .or_else(|| text(HOST.as_str()));
    let origin_host = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    !matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h.trim()))
}

/// `POST /ui/login` with `token=…`: a session cookie and the console, or the form again.
async fn login(
    api: &Api,
    settings: &ConsoleConfig,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let peer = crate::http::peer_of(&request);
    let client = proxy::client_ip(settings, request.headers(), peer);
    if cross_site(settings, &request) {
        count_login("cross_site");
        tracing::info!(client = ?client, "console login refused: posted from another site");
        return headers::error(
            StatusCode::FORBIDDEN,
            "cross-site login refused: log in from the console's own page",
        );
    }
    let failed = &api.console.shared.failed;
    let (max, window) = (settings.max_failed_logins, settings.failed_login_window);
    if let Some(ip) = client
        && let Some(wait) = failed.blocked(ip, Instant::now(), max, window)
    {
        count_login("limited");
        let mut r = redirect(StatusCode::SEE_OTHER, "/ui/login?failed=wait");
        let secs = wait.as_secs().max(1).to_string();
        if let Ok(v) = HeaderValue::from_str(&secs) {
            r.headers_mut().insert(RETRY_AFTER, v);
        }
        return r;
    }
    let secure = proxy::https(settings, request.headers(), peer);
    let body = match read_body(request, MAX_LOGIN_BODY, api.config.api.read_timeout).await {
        Ok(body) => body,
        Err(e) => return headers::error(e.status, &e.message),
    };
    let token = std::str::from_utf8(&body)
        .ok()
        .and_then(|text| query_pairs(text).ok())
        .and_then(|pairs| pairs.into_iter().find(|(k, _)| k == "token"))
        .map(|(_, v)| v.trim().to_owned())
        .filter(|t| !t.is_empty());
    let Some(key) = token.and_then(|t| api.keys.by_token(t.as_bytes())) else {
        count_login("failed");
        let used_up = client.is_some_and(|ip| failed.failed(ip, Instant::now(), max, window));
        if used_up {
            tracing::warn!(client = ?client, failures = max, window = %humantime::format_duration(window), "console logins from this address refused until its window ends");
        } else {
            tracing::info!(client = ?client, "console login failed");
        }
        return redirect(StatusCode::SEE_OTHER, "/ui/login?failed=1");
    };
    let nonce = match super::random::<16>() {
        Ok(n) => n,
        Err(e) => return refusal(e),
    };
    let secret = &api.console.shared.secret;
    let ttl = settings.session_ttl;
    let (value, _) = session::issue(secret, key, session::now_ms(), ttl, nonce);
    if let Some(ip) = client {
        failed.succeeded(ip);
    }
    count_login("ok");
    tracing::info!(key = %key.name, client = ?client, "console login");
    let mut r = redirect(StatusCode::SEE_OTHER, "/ui/");
    set_cookie(&mut r, &session::set_cookie(&value, ttl, secure));
    r
}

fn set_cookie(r: &mut Response<Full<Bytes>>, line: &str) {
    if let Ok(v) = HeaderValue::from_str(line) {
        r.headers_mut().append(SET_COOKIE, v);
    }
}

/// `POST /ui/logout`: the browser drops its cookie. A session's logout needs its CSRF
/// token (another site must not log a user out); without a session there is nothing to
/// protect, and the cookie is dropped all the same.
fn logout(
    api: &Api,
    settings: &ConsoleConfig,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    if let Ok(Some(visitor)) = identify(api, settings, request) {
        if let Err(e) = check_csrf(&api.console.shared, &visitor, request) {
            return refusal(e);
        }
        tracing::info!(key = %visitor.key.name, user = visitor.user().unwrap_or(""), "console logout");
    }
    let secure = proxy::https(settings, request.headers(), crate::http::peer_of(request));
    let mut r = headers::answer(
        StatusCode::NO_CONTENT,
        "text/plain; charset=utf-8",
        Bytes::new(),
    );
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    set_cookie(&mut r, &session::clear_cookie(secure));
    r
}

/// `GET /ui/session`: who the browser is, for the page's script: the key, the user a proxy
/// named, the key's rights, the CSRF token its writes carry, and when it ends.
fn session_answer(
    api: &Api,
    settings: &ConsoleConfig,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let visitor = match identify(api, settings, request) {
        Ok(Some(v)) => v,
        Ok(None) => return refusal(ConsoleError::NoSession),
        Err(e) => return refusal(e),
    };
    crate::http::authenticated(request);
    headers::json(StatusCode::OK, &describe(api, settings, &visitor))
}

fn describe(api: &Api, settings: &ConsoleConfig, visitor: &Visitor) -> serde_json::Value {
    let secret = &api.console.shared.secret;
    let key = visitor.key;
    let (csrf, expires_ms, via) = match &visitor.via {
        Via::Session(s) => (csrf::for_session(secret, s), s.expires_ms, "session"),
        Via::Proxy { user } => {
            let ends = session::now_ms().saturating_add(settings.session_ttl.as_millis() as u64);
            (csrf::for_proxy(secret, user, key, ends), ends, "proxy")
        }
    };
    let queues: Vec<&str> = match &key.queues {
        _ if key.admin => vec!["*"],
        KeyQueues::All => vec!["*"],
        KeyQueues::Only(names) => names.iter().map(String::as_str).collect(),
    };
    json!({
        "key": key.name,
        "user": visitor.user(),
        "admin": key.admin,
        "queues": queues,
        "csrf": csrf,
        "expires_ms": expires_ms,
        "via": via,
    })
}

#[cfg(test)]
mod tests {
    use super::headers::CSP;

    #[test]
    fn the_policy_allows_no_inline_script_and_no_framing() {
        assert!(CSP.contains("script-src 'self';"));
        assert!(!CSP.contains("unsafe-inline") && !CSP.contains("unsafe-eval"));
        assert!(CSP.contains("frame-ancestors 'none'"));
    }
}
