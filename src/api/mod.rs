//! The task service over HTTP (`gaffer api`): submit, view, list, cancel, freeze and thaw
//! tasks, wait for their end, and the admin switches. Stateless: any number run behind a
//! load balancer, and everything meets in Redis as for the other roles.

use std::net::SocketAddr;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::queue_client::ConnectOptions;

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
}

impl ApiOptions {
    /// Options with the defaults for everything but what must be given.
    pub fn new(config: Config, redis_url: String) -> Self {
        Self {
            config,
            redis_url,
            connect: ConnectOptions::default(),
            listen: None,
        }
    }
}

/// The SHA-256 of a token as 64 lower-case hex digits: what `[api.keys.NAME]` stores as
/// `token_sha256` (`gaffer api hash-token`). Surrounding white space (a trailing newline
/// from `echo`) is not part of the token.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.trim().as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs an api instance until `shutdown` is cancelled or SIGTERM/SIGINT arrives. Binds
/// before anything else, so an address in use fails the start; refuses a non-loopback
/// address without keys. `bound` (if given) learns the address actually bound (port 0 in
/// tests).
pub async fn run(
    opts: ApiOptions,
    shutdown: CancellationToken,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> anyhow::Result<()> {
    let _ = (opts, shutdown, bound);
    anyhow::bail!("not yet")
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
