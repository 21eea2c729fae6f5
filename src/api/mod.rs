//! The task service over HTTP (`gaffer api`): submit, view, list, cancel, freeze and thaw
//! tasks, wait for their end, and the admin switches. Stateless: any number run behind a
//! load balancer, and everything meets in Redis as for the other roles.
//!
//! It holds no state of its own (ARCHITECTURE.md, invariant 28): every request is answered
//! from Redis, so any instance answers any request. A sync submit waits on the instance's
//! one pub/sub subscription (`ended`), sending Redis nothing while it waits, and a lost
//! subscription wakes every waiter to look again. A refused request changes nothing.
//!
//! By file: `routes.rs` (the endpoints and the checks every request passes), `submit.rs`
//! (the submit body), `chains.rs` (the chain endpoints), `schedules.rs` (the stored
//! schedules: create, list, show, delete), `auth.rs` (keys and rights),
//! `ended.rs` (waking the waiters), `error.rs` (`ApiError`), `outage.rs` (the instance's
//! one outage spell, fed by requests, `/healthz` and the config look), `listings.rs` (each
//! key's listings under way, against `[api].max_listings_per_key`), `console_data.rs`
//! (what the web console reads: the cluster, one queue with its config, a task found by
//! id), `dead.rs` (dead letters: listing, requeue, purge, and the retry of a failed
//! task), `console/` (the web console at `/ui/`: pages, sessions, CSRF, auth-proxy mode).
//! It serves on `crate::http::serve_with`.

mod auth;
mod chains;
mod console;
mod console_data;
mod dead;
mod ended;
mod error;
mod listings;
mod outage;
mod routes;
mod schedules;
mod submit;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::config::{ApiKey, Config};
use crate::queue_client::{ConnectOptions, QueueClient};
use ended::Ended;
pub use error::ApiError;
use outage::Outage;
use routes::Api;

/// Everything an api instance needs; built by `gaffer api`, `gaffer up` or a test.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// The validated config: queues, keys, limits.
    pub config: Config,
    /// Redis to meet the cluster in.
    pub redis_url: String,
    /// Password and timeouts for Redis.
    pub connect: ConnectOptions,
    /// Overrides `[api].listen` (`gaffer api --listen`, tests on port 0).
    pub listen: Option<SocketAddr>,
    /// Keys beyond the config's: the admin key `gaffer up` makes for its demo.
    pub extra_keys: Vec<ApiKey>,
    /// Handler names beyond the built-in ones, to read published configs.
    pub custom_handlers: Vec<String>,
}

impl ApiOptions {
    /// Options with the defaults for everything but what must be given.
    pub fn new(config: Config, redis_url: String) -> Self {
        Self {
            config,
            redis_url,
            connect: ConnectOptions::default(),
            listen: None,
            extra_keys: Vec::new(),
            custom_handlers: Vec::new(),
        }
    }
}

/// The SHA-256 of a token as 64 lower-case hex digits: what `[api.keys.NAME]` stores as
/// `token_sha256` (`gaffer api hash-token`). Surrounding white space (a trailing newline
/// from `echo`) is not part of the token.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.trim().as_bytes()))
}

/// An admin key for every queue with the token whose SHA-256 is `sha256_hex`: the key
/// `gaffer up` makes for its demo (the token itself stays with `up`).
pub fn admin_key(name: &str, sha256_hex: &str) -> anyhow::Result<ApiKey> {
    let hex = sha256_hex.trim();
    anyhow::ensure!(
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "an admin key's SHA-256 must be 64 hex digits"
    );
    let mut token_sha256 = [0u8; 32];
    for (i, byte) in token_sha256.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(ApiKey {
        name: name.to_string(),
        token_sha256,
        queues: crate::config::KeyQueues::All,
        admin: true,
    })
}

/// A fresh random token (32 bytes from the kernel, as hex).
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How often an instance looks for a config published with `gaffer config apply`.
const CONFIG_TICK: std::time::Duration = std::time::Duration::from_secs(2);

/// What wakes the instance's own loop (the requests are served by their own tasks).
enum Event {
    /// The caller's shutdown token (SIGTERM or SIGINT at the edge).
    Stop,
    /// Time to look for a newer published config.
    ConfigTick,
    /// The server's accept loop returned: its listener failed.
    ServerEnded(Result<std::io::Result<()>, tokio::task::JoinError>),
}

/// The state every request reads; replaced whole when a newer config is adopted, so a
/// request sees one config from start to end.
type Current = Arc<std::sync::RwLock<Arc<Api>>>;

/// Runs an api instance until `shutdown` is cancelled. Binds
/// before anything else, so an address in use fails the start; refuses a non-loopback
/// address without keys. `bound` (if given) learns the address actually bound (port 0 in
/// tests). Adopts configs published with `gaffer config apply` (keys, queues, limits)
/// without a restart; the listen address stays as bound.
pub async fn run(
    opts: ApiOptions,
    shutdown: CancellationToken,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> anyhow::Result<()> {
    let listener = bind(&opts).await?;
    let local = listener.local_addr()?;
    // (a secret file that cannot be read fails the start before anything connects)
    let console = console::Shared::load(&opts.config)?;
    let ns = &opts.config.cluster.namespace;
    let connect = QueueClient::connect_or_stop(&opts.redis_url, ns, &opts.connect, &shutdown);
    let Some(client) = connect.await? else {
        return Ok(());
    };
    let stop = shutdown.child_token();
    let ended = Ended::start(
        opts.redis_url.clone(),
        &opts.config.cluster.namespace,
        opts.connect.clone(),
        stop.clone(),
    );
    let outage = Arc::new(Outage::default());
    let api = Api::new(
        opts.config.clone(),
        client.clone(),
        keys_of(&opts.config, &opts.extra_keys),
        ended.clone(),
        outage.clone(),
        stop.clone(),
        console,
    )?;
    let current: Current = Arc::new(std::sync::RwLock::new(Arc::new(api)));
    tracing::info!(listen = %local, "api serving");
    if let Some(tx) = bound {
        let _ = tx.send(local);
    }
    let serving = current.clone();
    let mut server = tokio::spawn(crate::http::serve_with(
        listener,
        move |request| {
            let api = serving.read().expect("api state lock").clone();
            api.handle(request)
        },
        crate::http::ConnectionRules {
            read_timeout: opts.config.api.read_timeout,
            per_peer: opts.config.api.max_connections_per_peer,
            auth_timeout: Some(opts.config.api.auth_timeout),
        },
        stop.clone(),
    ));
    let mut config_tick = tokio::time::interval(CONFIG_TICK);
    config_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = crate::cluster::ConfigSeen::default();
    loop {
        let event = tokio::select! {
            // (a stop first: the server ends too once it is asked to)
            biased;
            () = shutdown.cancelled() => Event::Stop,
            served = &mut server => Event::ServerEnded(served),
            _ = config_tick.tick() => Event::ConfigTick,
        };
        match event {
            Event::Stop => break,
            // The listener can no longer accept: an instance that serves nothing must not
            // look alive to its supervisor, which restarts it.
            Event::ServerEnded(served) if stop.is_cancelled() || shutdown.is_cancelled() => {
                served??;
                return Ok(());
            }
            Event::ServerEnded(served) => {
                stop.cancel();
                served??;
                anyhow::bail!("the api's listener stopped accepting connections");
            }
            Event::ConfigTick => {
                let shared = Shared {
                    client: &client,
                    ended: &ended,
                    outage: &outage,
                    stop: &stop,
                };
                adopt_published(&opts, &shared, &current, &mut seen).await
            }
        }
    }
    tracing::info!("api stopping");
    stop.cancel();
    server.await??;
    Ok(())
}

/// Binds the listen address, refusing a non-loopback one without keys.
async fn bind(opts: &ApiOptions) -> anyhow::Result<tokio::net::TcpListener> {
    let addr = opts.listen.unwrap_or(opts.config.api.listen);
    let keys = keys_of(&opts.config, &opts.extra_keys);
    if keys.is_empty() && !addr.ip().is_loopback() {
        anyhow::bail!(
            "api address {addr} is not a loopback address; declare at least one [api.keys.NAME] to serve it"
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding [api].listen {addr}"))?;
    if keys.is_empty() {
        tracing::warn!(listen = %addr, "no [api.keys]: every request but /healthz is refused");
    }
    Ok(listener)
}

fn keys_of(config: &Config, extra: &[ApiKey]) -> auth::Keys {
    auth::Keys::new(
        config
            .api
            .keys
            .values()
            .cloned()
            .chain(extra.iter().cloned()),
    )
}

/// What every [`Api`] of an instance shares, whichever config it was built for.
struct Shared<'a> {
    client: &'a QueueClient,
    ended: &'a Arc<Ended>,
    outage: &'a Arc<Outage>,
    stop: &'a CancellationToken,
}

/// Adopts a published config whose text differs from the one `seen` names, whatever its
/// version: requests that start after it use its keys, queues and limits; requests under
/// way finish with the old one. Its read of Redis every [`CONFIG_TICK`] also ends an
/// outage spell that no request happened to end.
async fn adopt_published(
    opts: &ApiOptions,
    shared: &Shared<'_>,
    current: &Current,
    seen: &mut crate::cluster::ConfigSeen,
) {
    let keys = crate::cluster::Keys::new(&opts.config.cluster.namespace);
    let mut conn = shared.client.connection();
    let read = crate::cluster::changed_config(&mut conn, &keys, seen, &opts.custom_handlers);
    let published = match read.await {
        Ok(read) => {
            shared.outage.answered();
            *seen = read.seen;
            read.changed
        }
        Err(e) if e.is_transient() => {
            let what = "reading the published config failed";
            shared.outage.failed(what, e.cause(), &e);
            return;
        }
        Err(e) => {
            tracing::debug!(cause = %e.cause(), error = %e, "reading the published config failed");
            return;
        }
    };
    let Some(published) = published else { return };
    let version = published.version;
    let adopted = published
        .config
        .map_err(anyhow::Error::from)
        .and_then(|config| {
            let api_keys = keys_of(&config, &opts.extra_keys);
            let console = current
                .read()
                .expect("api state lock")
                .console
                .shared()
                .clone();
            // (the same secret unless the config names another file, read now)
            let console = console.for_config(&config)?;
            Api::new(
                config,
                shared.client.clone(),
                api_keys,
                shared.ended.clone(),
                shared.outage.clone(),
                shared.stop.clone(),
                console,
            )
        });
    match adopted {
        Ok(mut api) => {
            // (the listings under way count against the new config's limit too)
            api.listings = current.read().expect("api state lock").listings.clone();
            tracing::info!(version, "adopting the published config");
            *current.write().expect("api state lock") = Arc::new(api);
        }
        Err(e) => tracing::error!(version, error = %e, "cannot adopt the published config"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_hash_to_lower_hex_sha256() {
        assert_eq!(
            super::hash_token("test\n"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }
}
