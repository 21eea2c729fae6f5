//! Who is asking: a bearer token matched against the configured keys' SHA-256, in constant
//! time. Tokens themselves are never stored, compared as text or logged.

use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::config::ApiKey;

/// The keys an api instance accepts.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    keys: Vec<ApiKey>,
}

impl Keys {
    /// The configured keys plus any given at start (the demo's admin key of `gaffer up`).
    pub fn new(keys: impl IntoIterator<Item = ApiKey>) -> Self {
        Self {
            keys: keys.into_iter().collect(),
        }
    }

    /// Whether any key exists; without one every request but `/healthz` is refused.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key whose token the `Authorization` header carries.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<&ApiKey, ApiError> {
        let Some(header) = header else {
            return Err(ApiError::unauthorized(
                "missing token: send Authorization: Bearer TOKEN",
            ));
        };
        let token = bearer_token(header).ok_or_else(|| {
            ApiError::unauthorized("malformed Authorization header: expected Bearer TOKEN")
        })?;
        if token.is_empty() {
            return Err(ApiError::unauthorized("empty bearer token"));
        }
        self.by_token(token)
            .ok_or_else(|| ApiError::unauthorized("unknown token"))
    }

    /// The key whose token is `token` (the console's login form sends it).
    pub fn by_token(&self, token: &[u8]) -> Option<&ApiKey> {
        let digest: [u8; 32] = Sha256::digest(token).into();
        // Every key is compared, whatever matched, so the time taken says nothing about
        // which key (or how much of one) a guess came close to.
        let mut found = None;
        for key in &self.keys {
            if constant_time_eq(&digest, &key.token_sha256) {
                found = Some(key);
            }
        }
        found
    }

    /// The key named `name` (a console session names its key).
    pub fn by_name(&self, name: &str) -> Option<&ApiKey> {
        self.keys.iter().find(|k| k.name == name)
    }
}

/// The token of a `Bearer` credential, trimmed (empty when the header says only
/// `Bearer`); `None` for another scheme. The scheme is matched without regard to case
/// (RFC 9110, section 11.1), and proxies that trim a header's trailing white space turn
/// `Bearer ` into `Bearer`, which is still the empty token.
fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    let header = trim(header);
    let scheme_end = header
        .iter()
        .position(|c| c.is_ascii_whitespace())
        .unwrap_or(header.len());
    let (scheme, rest) = header.split_at(scheme_end);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| trim(rest))
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &b[start..end]
}

/// Equality of two digests in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimiser from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

/// A key may use a queue.
pub fn check_queue(key: &ApiKey, queue: &str) -> Result<(), ApiError> {
    if key.allows(queue) {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "key {} may not use queue {queue}",
            key.name
        )))
    }
}

/// A key is an admin key.
pub fn check_admin(key: &ApiKey) -> Result<(), ApiError> {
    if key.admin {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "key {} is not an admin key: this endpoint needs admin = true",
            key.name
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyQueues;

    fn key(name: &str, token: &str, admin: bool) -> ApiKey {
        ApiKey {
            name: name.into(),
            token_sha256: Sha256::digest(token.as_bytes()).into(),
            queues: KeyQueues::Only(["a".to_string()].into()),
            admin,
        }
    }

    #[test]
    fn a_token_finds_its_key_and_nothing_else_does() {
        let keys = Keys::new([key("shop", "s3cret", false), key("ops", "0ps", true)]);
        assert_eq!(
            keys.authenticate(Some(b"Bearer s3cret")).unwrap().name,
            "shop"
        );
        assert_eq!(keys.authenticate(Some(b"Bearer 0ps ")).unwrap().name, "ops");
        let refused = |h: Option<&[u8]>| keys.authenticate(h).unwrap_err().message;
        assert_eq!(
            refused(None),
            "missing token: send Authorization: Bearer TOKEN"
        );
        assert_eq!(refused(Some(b"Bearer nope")), "unknown token");
        assert_eq!(
            refused(Some(b"Basic abc")),
            "malformed Authorization header: expected Bearer TOKEN"
        );
        assert_eq!(refused(Some(b"Bearer ")), "empty bearer token");
        assert_eq!(refused(Some(b"Bearer")), "empty bearer token");
        assert_eq!(refused(Some(b"bearer  \t")), "empty bearer token");
        for scheme in ["BEARER", "bearer", "BeArEr"] {
            let header = format!("{scheme} s3cret");
            assert_eq!(
                keys.authenticate(Some(header.as_bytes())).unwrap().name,
                "shop"
            );
        }
        assert_eq!(
            refused(Some(b"Bearers3cret")),
            "malformed Authorization header: expected Bearer TOKEN"
        );
    }

    #[test]
    fn queue_and_admin_permissions() {
        let shop = key("shop", "x", false);
        assert!(check_queue(&shop, "a").is_ok());
        assert_eq!(
            check_queue(&shop, "b").unwrap_err().message,
            "key shop may not use queue b"
        );
        assert!(check_admin(&shop).is_err());
        let ops = key("ops", "y", true);
        assert!(check_queue(&ops, "b").is_ok() && check_admin(&ops).is_ok());
    }
}
