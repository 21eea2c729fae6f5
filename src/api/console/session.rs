//! Session cookies: `gaffer_session=1.KEY.EXPIRES_MS.NONCE.MAC`.
//!
//! Stateless: the cookie itself says which key it acts as and until when, and its MAC
//! (under the instance's session key) covers those and the key's `token_sha256`. So any
//! instance with the same secret accepts it, and a key removed from the config, or given
//! another token, ends every session made with it: the name finds no key, or the MAC no
//! longer matches. Key names hold no `.` other than their own, so the fields are split
//! from the right.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::HeaderMap;
use hyper::header::COOKIE;

use super::{ConsoleError, Secret, mac};
use crate::api::auth::Keys;
use crate::config::ApiKey;

/// The cookie's name.
pub(super) const COOKIE_NAME: &str = "gaffer_session";

/// The format's version, first in the cookie and in what its MAC covers.
const VERSION: &str = "1";

/// A session a verified cookie holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::api) struct Session {
    /// Its key's name.
    pub key: String,
    /// When it ends, in Unix milliseconds.
    pub expires_ms: u64,
    /// Its MAC, which its CSRF token derives from.
    pub mac: [u8; 32],
}

/// Now, in Unix milliseconds.
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn session_mac(secret: &Secret, key: &ApiKey, expires_ms: u64, nonce: &str) -> [u8; 32] {
    mac(
        &secret.session,
        &[
            VERSION.as_bytes(),
            key.name.as_bytes(),
            expires_ms.to_string().as_bytes(),
            nonce.as_bytes(),
            &key.token_sha256,
        ],
    )
}

/// A new session for `key` from `now_ms` for `ttl`: the cookie's value and the session.
/// `nonce` tells apart two sessions of one key made in the same millisecond.
pub(super) fn issue(
    secret: &Secret,
    key: &ApiKey,
    now_ms: u64,
    ttl: Duration,
    nonce: [u8; 16],
) -> (String, Session) {
    let expires_ms = now_ms.saturating_add(ttl.as_millis() as u64);
    let nonce = hex(&nonce);
    let mac = session_mac(secret, key, expires_ms, &nonce);
    let value = format!("{VERSION}.{}.{expires_ms}.{nonce}.{}", key.name, hex(&mac));
    let session = Session {
        key: key.name.clone(),
        expires_ms,
        mac,
    };
    (value, session)
}

/// The key and session a cookie's value holds, if it is one this secret made, for a key
/// `keys` still has with the same token, and not past its end at `now_ms`.
pub(super) fn verify<'k>(
    secret: &Secret,
    keys: &'k Keys,
    value: &str,
    now_ms: u64,
) -> Result<(&'k ApiKey, Session), ConsoleError> {
    let rest = value
        .strip_prefix(VERSION)
        .and_then(|r| r.strip_prefix('.'))
        .ok_or(ConsoleError::BadSession)?;
    let mut fields = rest.rsplitn(4, '.');
    let (Some(mac_hex), Some(nonce), Some(expires), Some(name)) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(ConsoleError::BadSession);
    };
    let expires_ms: u64 = expires.parse().map_err(|_| ConsoleError::BadSession)?;
    let sent = unhex::<32>(mac_hex).ok_or(ConsoleError::BadSession)?;
    let key = keys.by_name(name).ok_or(ConsoleError::BadSession)?;
    let mac = session_mac(secret, key, expires_ms, nonce);
    if !super::csrf::same(&mac, &sent) || now_ms >= expires_ms {
        return Err(ConsoleError::BadSession);
    }
    Ok((
        key,
        Session {
            key: key.name.clone(),
            expires_ms,
            mac,
        },
    ))
}

/// The values of every `gaffer_session` cookie the request carries.
pub(super) fn cookies(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|line| line.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE_NAME).then(|| value.trim_matches('"'))
        })
}

/// The `Set-Cookie` line of a new session: script cannot read it, it goes only to this
/// site's own requests (not a link or form from another site), and over HTTPS only when
/// `secure`.
pub(super) fn set_cookie(value: &str, ttl: Duration, secure: bool) -> String {
    format!(
        "{COOKIE_NAME}={value}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
        ttl.as_secs(),
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` line that makes the browser drop its session.
pub(super) fn clear_cookie(secure: bool) -> String {
    set_cookie("", Duration::ZERO, secure)
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` bytes written as `2N` hex digits.
pub(super) fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::KeyQueues;

    pub(in crate::api::console) fn key(name: &str, token: &str) -> ApiKey {
        ApiKey {
            name: name.into(),
            token_sha256: <sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()).into(),
            queues: KeyQueues::All,
            admin: false,
        }
    }

    pub(in crate::api::console) fn secret() -> Secret {
        Secret::derive(b"a test secret of at least thirty-two bytes")
    }

    const HOUR: Duration = Duration::from_secs(3600);
    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn a_cookie_verifies_until_it_expires() {
        let keys = Keys::new([key("shop.eu", "t1"), key("ops", "t2")]);
        let (value, made) = issue(
            &secret(),
            keys.by_name("shop.eu").unwrap(),
            NOW,
            HOUR,
            [7; 16],
        );
        assert!(value.starts_with("1.shop.eu.1800003600000."), "{value}");
        let (k, got) = verify(&secret(), &keys, &value, NOW + 1000).unwrap();
        assert_eq!((k.name.as_str(), &got), ("shop.eu", &made));
        assert_eq!(got.expires_ms, NOW + 3_600_000);
        let late = verify(&secret(), &keys, &value, NOW + 3_600_000);
        assert!(
            matches!(late, Err(ConsoleError::BadSession)),
            "expired at its end"
        );
    }

    #[test]
    fn a_tampered_cookie_or_another_secret_is_refused() {
        let keys = Keys::new([key("shop", "t1"), key("ops", "t2")]);
        let (value, _) = issue(&secret(), keys.by_name("shop").unwrap(), NOW, HOUR, [1; 16]);
        let refused = |v: &str| verify(&secret(), &keys, v, NOW).is_err();
        assert!(!refused(&value));
        // another key's name, a later end, another nonce, a flipped MAC digit
        assert!(refused(&value.replacen(".shop.", ".ops.", 1)));
        assert!(refused(&value.replacen(
            ".1800003600000.",
            ".1900003600000.",
            1
        )));
        assert!(refused(&value.replacen(".0101", ".0102", 1)));
        let mut flipped = value.clone();
        let last = flipped.pop().unwrap();
        flipped.push(if last == '0' { '1' } else { '0' });
        assert!(refused(&flipped));
        for junk in [
            "",
            "1",
            "1.shop",
            "2.shop.1.00.00",
            "1.shop.x.00.00",
            "1.....",
        ] {
            assert!(refused(junk), "{junk:?}");
        }
        let other = Secret::derive(b"another secret, just as long as the first");
        assert!(
            verify(&other, &keys, &value, NOW).is_err(),
            "another instance's secret"
        );
    }

    #[test]
    fn a_key_removed_or_given_another_token_ends_its_sessions() {
        let keys = Keys::new([key("shop", "t1")]);
        let (value, _) = issue(&secret(), keys.by_name("shop").unwrap(), NOW, HOUR, [2; 16]);
        let rotated = Keys::new([key("shop", "t1-new")]);
        assert!(verify(&secret(), &rotated, &value, NOW).is_err());
        let removed = Keys::new([key("ops", "t1")]);
        assert!(verify(&secret(), &removed, &value, NOW).is_err());
    }

    #[test]
    fn cookies_are_found_among_others_and_set_with_their_flags() {
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, "a=1; gaffer_session=one; b=2".parse().unwrap());
        headers.append(COOKIE, "gaffer_session=\"two\"".parse().unwrap());
        assert_eq!(cookies(&headers).collect::<Vec<_>>(), ["one", "two"]);
        assert_eq!(
            set_cookie("v", HOUR, false),
            "gaffer_session=v; Path=/; Max-Age=3600; HttpOnly; SameSite=Strict"
        );
        assert!(set_cookie("v", HOUR, true).ends_with("; SameSite=Strict; Secure"));
        assert!(clear_cookie(false).starts_with("gaffer_session=; Path=/; Max-Age=0;"));
    }

    #[test]
    fn hex_round_trips() {
        assert_eq!(unhex::<2>(&hex(&[0xab, 0x01])), Some([0xab, 0x01]));
        assert_eq!(unhex::<2>("abc"), None);
        assert_eq!(unhex::<2>("zz00"), None);
        assert_eq!(unhex::<2>("éa0"), None);
    }
}
