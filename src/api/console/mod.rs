//! The web console at `/ui/`: its pages, its logins, and who a browser's request acts as.
//!
//! The console has no rights of its own (ARCHITECTURE.md, invariant 43). It serves static
//! pages, turns a key's token into a session cookie, and tells the API which key a
//! browser's request acts as: the session's, or the one a trusted proxy's user maps to.
//! Every read and every action then goes through the API's endpoints and their checks,
//! exactly as with that key's bearer token. Nothing here reads or writes Redis.
//!
//! Sessions are stateless (any instance answers any request, invariant 28): a cookie
//! names its key and its end, signed with a MAC keyed by the instance's secret and mixed
//! with the key's `token_sha256`, so a key removed or given another token ends its
//! sessions at once. A browser's writes carry a CSRF token derived from the session.
//!
//! By file: `pages.rs` (the `/ui/` routes: pages, login, logout, session), `session.rs`
//! (cookies: sign, verify, flags), `csrf.rs`, `proxy.rs` (trusted addresses, the user and
//! groups headers, the client's address), `limiter.rs` (failed logins per address),
//! `assets.rs` (the embedded files), `headers.rs` (answers with the security headers).

mod assets;
mod csrf;
mod headers;
mod limiter;
mod pages;
mod proxy;
mod session;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use hyper::header::AUTHORIZATION;
use hyper::{Method, Request};
use sha2::Sha256;

use super::error::ApiError;
use super::routes::Api;
use crate::config::{ApiConfig, ApiKey, Config, ConsoleConfig};

pub(super) use pages::serve;

/// The shortest session secret accepted from `session_secret_file`, in bytes.
const MIN_SECRET: usize = 32;

/// Why the console cannot start, or refused a browser's request.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The secret file could not be read.
    #[error("cannot read [api.console].session_secret_file {}: {source}", path.display())]
    SecretFile {
        /// The file as configured.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The secret file holds too little to sign with.
    #[error(
        "[api.console].session_secret_file {} holds {len} bytes: at least {MIN_SECRET} are needed \
         (`head -c 48 /dev/urandom | base64 > FILE` makes one)",
        path.display()
    )]
    SecretTooShort {
        /// The file as configured.
        path: PathBuf,
        /// Its length, white space around it left out.
        len: usize,
    },
    /// The kernel's random bytes could not be read.
    #[error("cannot read random bytes: {0}")]
    Random(std::io::Error),
    /// No session cookie and no proxy user.
    #[error("not logged in: log in at /ui/login")]
    NoSession,
    /// A session cookie that is malformed, expired, forged, or whose key was removed or
    /// given another token.
    #[error("session expired or revoked: log in again at /ui/login")]
    BadSession,
    /// A write without the session's CSRF token.
    #[error(
        "missing or wrong csrf token: send the X-CSRF-Token header with the csrf value of GET /ui/session"
    )]
    Csrf,
    /// A trusted proxy's user header that names no user.
    #[error("the proxy's user header holds no usable user name")]
    BadUser,
    /// A proxy user none of whose groups maps to a key.
    #[error("user {user} has no key: none of their groups is mapped in [api.console.groups]")]
    NoKey {
        /// The user as the proxy named them.
        user: String,
    },
}

impl From<ConsoleError> for ApiError {
    fn from(e: ConsoleError) -> Self {
        let message = e.to_string();
        match e {
            ConsoleError::NoSession | ConsoleError::BadSession => ApiError::unauthorized(message),
            ConsoleError::Csrf | ConsoleError::NoKey { .. } => ApiError::forbidden(message),
            ConsoleError::BadUser => ApiError::bad_request(message),
            ConsoleError::SecretFile { .. }
            | ConsoleError::SecretTooShort { .. }
            | ConsoleError::Random(_) => ApiError::internal(message),
        }
    }
}

/// The keys an instance's MACs are made with, derived from its secret, one per use so a
/// value made for one use is never accepted for another.
pub(super) struct Secret {
    session: [u8; 32],
    csrf: [u8; 32],
}

impl Secret {
    fn derive(secret: &[u8]) -> Secret {
        let derive = |label: &[u8]| -> [u8; 32] { mac(secret, &[label]) };
        Secret {
            session: derive(b"gaffer console session key v1"),
            csrf: derive(b"gaffer console csrf key v1"),
        }
    }
}

/// HMAC-SHA256 of `parts` under `key`, each part followed by a zero byte so no two lists
/// of parts make the same input.
fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("hmac takes a key of any length");
    for part in parts {
        m.update(part);
        m.update(&[0]);
    }
    m.finalize().into_bytes().into()
}

/// What an instance's console keeps across the configs it adopts: its secret and the
/// failed logins counted per address.
pub struct Shared {
    secret: Secret,
    /// The file the secret came from; `None`: random, this process's own.
    secret_file: Option<PathBuf>,
    failed: Arc<limiter::FailedLogins>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // (never the secret)
        f.debug_struct("Shared")
            .field("secret_file", &self.secret_file)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// The console's state for an instance starting with `config`: the secret read from
    /// `session_secret_file`, or a random one.
    pub fn load(config: &Config) -> Result<Arc<Shared>, ConsoleError> {
        pages::register_metrics();
        Self::with(secret_file(config), Arc::default())
    }

    /// The state for a newly adopted `config`: the same, unless it names another secret
    /// file, which is read then (the failed logins are kept either way).
    pub fn for_config(self: &Arc<Self>, config: &Config) -> Result<Arc<Shared>, ConsoleError> {
        let file = secret_file(config);
        if file == self.secret_file {
            return Ok(Arc::clone(self));
        }
        Self::with(file, Arc::clone(&self.failed))
    }

    fn with(
        file: Option<PathBuf>,
        failed: Arc<limiter::FailedLogins>,
    ) -> Result<Arc<Shared>, ConsoleError> {
        let secret = match &file {
            Some(path) => read_secret(path)?,
            None => random::<32>()?.to_vec(),
        };
        Ok(Arc::new(Shared {
            secret: Secret::derive(&secret),
            secret_file: file,
            failed,
        }))
    }
}

fn secret_file(config: &Config) -> Option<PathBuf> {
    config
        .api
        .console
        .as_ref()
        .and_then(|c| c.session_secret_file.clone())
}

/// The secret in `path`, white space around it left out (a trailing newline is not part of
/// it), at least [`MIN_SECRET`] bytes.
fn read_secret(path: &Path) -> Result<Vec<u8>, ConsoleError> {
    let bytes = std::fs::read(path).map_err(|source| ConsoleError::SecretFile {
        path: path.to_owned(),
        source,
    })?;
    let secret = bytes.trim_ascii().to_vec();
    if secret.len() < MIN_SECRET {
        return Err(ConsoleError::SecretTooShort {
            path: path.to_owned(),
            len: secret.len(),
        });
    }
    Ok(secret)
}

/// `N` random bytes from the kernel.
fn random<const N: usize>() -> Result<[u8; N], ConsoleError> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(ConsoleError::Random)?;
    Ok(bytes)
}

/// The console of one [`Api`]: its config's settings (`None`: `console = false`) and the
/// instance's [`Shared`] state.
pub struct Console {
    settings: Option<ConsoleConfig>,
    shared: Arc<Shared>,
}

impl Console {
    /// The console `config` describes, with the instance's state.
    pub fn new(config: &ApiConfig, shared: Arc<Shared>) -> Console {
        Console {
            settings: config.console.clone(),
            shared,
        }
    }

    /// The instance's state, to carry into the next config.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Whether `path` is the console's: it is on, and the path is `/ui` or under `/ui/`.
    pub fn owns(&self, path: &str) -> bool {
        self.settings.is_some() && (path == "/ui" || path.starts_with("/ui/"))
    }
}

/// Who a browser's request acts as.
pub(super) struct Visitor<'k> {
    /// The key whose rights it has.
    pub key: &'k ApiKey,
    /// How it was told.
    pub via: Via,
}

/// How a visitor was identified.
pub(super) enum Via {
    /// A session cookie.
    Session(session::Session),
    /// A trusted proxy's user header.
    Proxy {
        /// The user it names.
        user: String,
    },
}

impl Visitor<'_> {
    /// The user a proxy named, if any.
    pub fn user(&self) -> Option<&str> {
        match &self.via {
            Via::Proxy { user } => Some(user),
            Via::Session(_) => None,
        }
    }
}

/// The browser's visitor of `request`, if it is one: the user a trusted proxy names
/// (when proxy mode is on), else the session cookie's. `Ok(None)`: neither is there.
pub(super) fn identify<'a, B>(
    api: &'a Api,
    settings: &ConsoleConfig,
    request: &Request<B>,
) -> Result<Option<Visitor<'a>>, ConsoleError> {
    let peer = crate::http::peer_of(request);
    if let Some(user) = proxy::user(settings, request.headers(), peer)? {
        let groups = proxy::groups(settings, request.headers());
        let key = proxy::key_for(settings, &api.keys, &user, &groups)
            .ok_or(ConsoleError::NoKey { user: user.clone() })?;
        return Ok(Some(Visitor {
            key,
            via: Via::Proxy { user },
        }));
    }
    let secret = &api.console.shared.secret;
    let mut cookies = session::cookies(request.headers()).peekable();
    if cookies.peek().is_none() {
        return Ok(None);
    }
    // (several: one of them may be a stale copy another path or host left)
    let now = session::now_ms();
    for value in cookies {
        if let Ok((key, session)) = session::verify(secret, &api.keys, value, now) {
            return Ok(Some(Visitor {
                key,
                via: Via::Session(session),
            }));
        }
    }
    Err(ConsoleError::BadSession)
}

/// Whether a method only reads, so needs no CSRF token.
fn reads(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD)
}

/// Refuses a write of `visitor` without its CSRF token in `X-CSRF-Token`.
pub(super) fn check_csrf<B>(
    shared: &Shared,
    visitor: &Visitor,
    request: &Request<B>,
) -> Result<(), ConsoleError> {
    if reads(request.method()) {
        return Ok(());
    }
    let sent = request
        .headers()
        .get(csrf::HEADER)
        .and_then(|v| v.to_str().ok());
    let ok = sent.is_some_and(|t| match &visitor.via {
        Via::Session(s) => csrf::check_session(&shared.secret, s, t),
        Via::Proxy { user } => {
            csrf::check_proxy(&shared.secret, user, visitor.key, t, session::now_ms())
        }
    });
    if ok {
        return Ok(());
    }
    let user = visitor.user().unwrap_or("");
    tracing::info!(key = %visitor.key.name, user, method = %request.method(), path = request.uri().path(), "console write refused: missing or wrong csrf token");
    metrics::counter!("gaffer_console_csrf_refused_total").increment(1);
    Err(ConsoleError::Csrf)
}

/// The key a request to the API acts as: its bearer token's when it has an
/// `Authorization` header or the console is off; else the browser's visitor's (a proxy's
/// user, a session), whose writes must carry the CSRF token. Neither: the bearer refusal.
pub(super) fn authenticate<'a, B>(
    api: &'a Api,
    request: &Request<B>,
) -> Result<&'a ApiKey, ApiError> {
    let bearer = request.headers().get(AUTHORIZATION);
    let settings = match &api.console.settings {
        Some(s) if bearer.is_none() => s,
        _ => return api.keys.authenticate(bearer.map(|v| v.as_bytes())),
    };
    let Some(visitor) = identify(api, settings, request)? else {
        return api.keys.authenticate(None);
    };
    check_csrf(&api.console.shared, &visitor, request)?;
    if !reads(request.method()) {
        // (who did what from a browser: the key alone does not say which person)
        tracing::info!(
            key = %visitor.key.name,
            user = visitor.user().unwrap_or(""),
            method = %request.method(),
            path = request.uri().path(),
            "console action"
        );
    }
    Ok(visitor.key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_differ_by_use_and_secret() {
        let a = Secret::derive(b"0123456789abcdef0123456789abcdef");
        let b = Secret::derive(b"0123456789abcdef0123456789abcdeX");
        assert_ne!(a.session, a.csrf);
        assert_ne!(a.session, b.session);
        // (parts are delimited: moving a byte from one part to the next changes the MAC)
        assert_ne!(mac(b"k", &[b"ab", b"c"]), mac(b"k", &[b"a", b"bc"]));
    }

    #[test]
    fn a_secret_file_must_hold_enough() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "too short\n").unwrap();
        let e = read_secret(&short).unwrap_err();
        assert!(
            e.to_string()
                .contains("holds 9 bytes: at least 32 are needed"),
            "{e}"
        );
        let good = dir.path().join("good");
        std::fs::write(&good, format!("{}\n", "x".repeat(40))).unwrap();
        assert_eq!(
            read_secret(&good).unwrap().len(),
            40,
            "the newline is not part"
        );
        let missing = read_secret(&dir.path().join("none")).unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("cannot read [api.console].session_secret_file")
        );
    }
}
