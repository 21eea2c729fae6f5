//! The console's answers, each with the security headers every `/ui/` answer carries:
//! script only from the site's own files (none inline, none from elsewhere), no framing
//! by any site, no `Referer` to anywhere, no guessing of types.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue, LOCATION};
use hyper::{Response, StatusCode};

/// The `Content-Security-Policy` of every `/ui/` answer.
pub(super) const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'self'";

/// The headers every `/ui/` answer carries, by name and value.
pub(super) const SECURITY: [(&str, &str); 4] = [
    ("content-security-policy", CSP),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("x-content-type-options", "nosniff"),
];

/// An answer of `status` with `body` of `content_type` and the security headers.
pub(super) fn answer(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    for (name, value) in SECURITY {
        r.headers_mut().insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    r
}

/// A JSON answer, not to be cached: sessions and refusals.
pub(super) fn json(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = answer(status, "application/json", body.to_string());
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `{"error": message}` with `status`.
pub(super) fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(status, &serde_json::json!({ "error": message }))
}

/// A redirect (`303 See Other`: the browser follows with a GET) to `location`.
pub(super) fn redirect(status: StatusCode, location: &'static str) -> Response<Full<Bytes>> {
    let mut r = answer(status, "text/plain; charset=utf-8", Bytes::new());
    r.headers_mut()
        .insert(LOCATION, HeaderValue::from_static(location));
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
