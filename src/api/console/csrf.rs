//! CSRF tokens: what a browser's write must carry in `X-CSRF-Token`.
//!
//! A page of another site can make the browser send a request with its cookies (a form
//! post, a fetch without CORS), but cannot read this site's answers, so it cannot know a
//! value the page learns from `GET /ui/session`. A session's token is a MAC of the
//! session's own MAC; a proxy user's (who has no cookie of ours: the proxy's session
//! rides along with any request) covers the user, the key and its token, and an end.

use super::session::{Session, hex, unhex};
use super::{Secret, mac};
use crate::config::ApiKey;

/// The header a write carries its token in.
pub(super) const HEADER: &str = "x-csrf-token";

/// The token of a cookie's session.
pub(super) fn for_session(secret: &Secret, session: &Session) -> String {
    hex(&mac(&secret.csrf, &[b"session", &session.mac]))
}

/// Whether `sent` is the token of `session`.
pub(super) fn check_session(secret: &Secret, session: &Session, sent: &str) -> bool {
    let want = mac(&secret.csrf, &[b"session", &session.mac]);
    unhex::<32>(sent).is_some_and(|got| same(&want, &got))
}

fn proxy_mac(secret: &Secret, user: &str, key: &ApiKey, expires_ms: u64) -> [u8; 32] {
    mac(
        &secret.csrf,
        &[
            b"proxy",
            user.as_bytes(),
            key.name.as_bytes(),
            &key.token_sha256,
            expires_ms.to_string().as_bytes(),
        ],
    )
}

/// The token of a proxy's `user` acting as `key`, good until `expires_ms`:
/// `EXPIRES_MS.MAC`.
pub(super) fn for_proxy(secret: &Secret, user: &str, key: &ApiKey, expires_ms: u64) -> String {
    format!(
        "{expires_ms}.{}",
        hex(&proxy_mac(secret, user, key, expires_ms))
    )
}

/// Whether `sent` is a token of `user` acting as `key` that has not ended at `now_ms`.
pub(super) fn check_proxy(
    secret: &Secret,
    user: &str,
    key: &ApiKey,
    sent: &str,
    now_ms: u64,
) -> bool {
    let Some((expires, mac_hex)) = sent.split_once('.') else {
        return false;
    };
    let (Ok(expires_ms), Some(got)) = (expires.parse::<u64>(), unhex::<32>(mac_hex)) else {
        return false;
    };
    same(&proxy_mac(secret, user, key, expires_ms), &got) && now_ms < expires_ms
}

/// Equality of two MACs in time that does not depend on where they differ.
pub(super) fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // (black_box keeps the optimiser from turning the fold into an early exit)
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::super::session::tests::{key, secret};
    use super::*;

    #[test]
    fn a_sessions_token_is_its_own() {
        let s = secret();
        let k = key("shop", "t");
        let (_, one) =
            super::super::session::issue(&s, &k, 0, std::time::Duration::from_secs(60), [1; 16]);
        let (_, two) =
            super::super::session::issue(&s, &k, 0, std::time::Duration::from_secs(60), [2; 16]);
        let token = for_session(&s, &one);
        assert_eq!(token.len(), 64);
        assert!(check_session(&s, &one, &token));
        assert!(!check_session(&s, &two, &token), "another session's");
        assert!(!check_session(&s, &one, ""));
        assert!(!check_session(&s, &one, &token[..63]));
    }

    #[test]
    fn a_proxy_users_token_covers_user_key_and_end() {
        let s = secret();
        let ops = key("ops", "t");
        let token = for_proxy(&s, "alice", &ops, 5_000);
        assert!(check_proxy(&s, "alice", &ops, &token, 4_999));
        assert!(!check_proxy(&s, "alice", &ops, &token, 5_000), "ended");
        assert!(!check_proxy(&s, "bob", &ops, &token, 0), "another user");
        assert!(
            !check_proxy(&s, "alice", &key("ops", "rotated"), &token, 0),
            "a new token"
        );
        assert!(!check_proxy(
            &s,
            "alice",
            &ops,
            &token.replacen("5000", "9000", 1),
            0
        ));
        assert!(!check_proxy(&s, "alice", &ops, "junk", 0));
    }
}
