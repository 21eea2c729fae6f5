//! Auth-proxy mode and the addresses of proxies: a proxy that authenticated a user names
//! them (and their groups) in headers, believed only from `[api.console].trusted_proxies`.
//! From any other address the headers are ignored, so a client that reaches the api past
//! the proxy cannot name itself anyone.

use std::net::{IpAddr, SocketAddr};

use hyper::HeaderMap;

use super::ConsoleError;
use crate::api::auth::Keys;
use crate::config::{ApiKey, ConsoleConfig};

/// The longest user name believed, in bytes.
const MAX_USER: usize = 256;

/// Whether the request came straight from a trusted proxy.
pub(super) fn trusted(settings: &ConsoleConfig, peer: Option<SocketAddr>) -> bool {
    peer.is_some_and(|p| settings.trusts(p.ip()))
}

/// The user a trusted proxy names in `user_header`. `None`: no proxy mode, no such
/// header, or a peer that is not a trusted proxy (counted, its header ignored).
pub(super) fn user(
    settings: &ConsoleConfig,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Result<Option<String>, ConsoleError> {
    let Some(name) = &settings.user_header else {
        return Ok(None);
    };
    let Some(value) = headers.get(name.as_str()) else {
        return Ok(None);
    };
    if !trusted(settings, peer) {
        tracing::debug!(peer = ?peer, header = %name, "a user header from an address that is not a trusted proxy, ignored");
        metrics::counter!("gaffer_console_proxy_header_ignored_total").increment(1);
        return Ok(None);
    }
    let user = std::str::from_utf8(value.as_bytes())
        .map_err(|_| ConsoleError::BadUser)?
        .trim();
    // (a name goes into logs and the page: no control characters, a bounded length)
    if user.is_empty() || user.len() > MAX_USER || user.chars().any(char::is_control) {
        return Err(ConsoleError::BadUser);
    }
    Ok(Some(user.to_string()))
}

/// The groups a trusted proxy lists in `groups_header` (commas between them, and the
/// header perhaps given more than once). Only called once [`user`] found a trusted user.
pub(super) fn groups(settings: &ConsoleConfig, headers: &HeaderMap) -> Vec<String> {
    let Some(name) = &settings.groups_header else {
        return Vec::new();
    };
    headers
        .get_all(name.as_str())
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(String::from)
        .collect()
}

/// The key of a proxy's user in `groups`: the first entry of `[api.console.groups]`, in
/// file order, whose group they are in; else `default_key`; else none.
pub(super) fn key_for<'k>(
    settings: &ConsoleConfig,
    keys: &'k Keys,
    user: &str,
    groups: &[String],
) -> Option<&'k ApiKey> {
    let mapped = settings
        .groups
        .iter()
        .find(|(group, _)| groups.iter().any(|g| g == group))
        .map(|(_, key)| key.as_str());
    let name = mapped.or(settings.default_key.as_deref())?;
    let key = keys.by_name(name);
    if key.is_none() {
        // (a mapping the config checks names a declared key; one given only at start,
        // such as `gaffer up`'s, is not a config key)
        tracing::warn!(
            user,
            key = name,
            "a console user's group maps to a key this instance does not have"
        );
    }
    key
}

/// The client's address as far as it can be told: the peer's, or behind trusted proxies
/// the last address in `X-Forwarded-For` that is not one of them (each proxy appends
/// the address it got the request from, so the entries before a trusted proxy's are
/// whatever the client wrote).
pub(super) fn client_ip(
    settings: &ConsoleConfig,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Option<IpAddr> {
    let peer = peer?.ip().to_canonical();
    if !settings.trusts(peer) {
        return Some(peer);
    }
    let forwarded: Vec<IpAddr> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map_while(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .collect();
    Some(
        forwarded
            .iter()
            .rev()
            .find(|ip| !settings.trusts(**ip))
            .or(forwarded.first())
            .copied()
            .unwrap_or(peer),
    )
}

/// Whether the browser reached the site over HTTPS, as far as it can be told: the api
/// serves plain HTTP, so only a trusted proxy's `X-Forwarded-Proto: https` says so
/// (`secure_cookie` overrides it either way).
pub(super) fn https(
    settings: &ConsoleConfig,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> bool {
    if let Some(always) = settings.secure_cookie {
        return always;
    }
    trusted(settings, peer)
        && headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
}

#[cfg(test)]
mod tests {
    use super::super::session::tests::key;
    use super::*;
    use crate::config::Cidr;

    fn settings() -> ConsoleConfig {
        ConsoleConfig {
            trusted_proxies: vec![
                Cidr::parse("10.0.0.5").unwrap(),
                Cidr::parse("192.168.0.0/16").unwrap(),
            ],
            user_header: Some("x-forwarded-user".into()),
            groups_header: Some("x-forwarded-groups".into()),
            groups: vec![
                ("admins".into(), "ops".into()),
                ("shop-team".into(), "shop".into()),
            ],
            ..ConsoleConfig::default()
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn peer(ip: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(ip.parse().unwrap(), 40000))
    }

    #[test]
    fn the_user_header_counts_only_from_a_trusted_proxy() {
        let s = settings();
        let h = headers(&[("x-forwarded-user", " alice ")]);
        assert_eq!(
            user(&s, &h, peer("10.0.0.5")).unwrap().as_deref(),
            Some("alice")
        );
        assert_eq!(
            user(&s, &h, peer("192.168.7.1")).unwrap().as_deref(),
            Some("alice")
        );
        assert_eq!(
            user(&s, &h, peer("::ffff:10.0.0.5")).unwrap().as_deref(),
            Some("alice")
        );
        assert_eq!(user(&s, &h, peer("10.0.0.6")).unwrap(), None);
        assert_eq!(user(&s, &h, None).unwrap(), None);
        assert_eq!(user(&s, &headers(&[]), peer("10.0.0.5")).unwrap(), None);
        let off = ConsoleConfig {
            user_header: None,
            ..settings()
        };
        assert_eq!(user(&off, &h, peer("10.0.0.5")).unwrap(), None);
        for bad in ["", "  ", "a\tb"] {
            let h = headers(&[("x-forwarded-user", bad)]);
            assert!(user(&s, &h, peer("10.0.0.5")).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_first_mapped_group_in_file_order_gives_the_key() {
        let s = settings();
        let keys = Keys::new([key("ops", "1"), key("shop", "2"), key("viewer", "3")]);
        let h = headers(&[
            ("x-forwarded-groups", "shop-team, staff"),
            ("x-forwarded-groups", "admins"),
        ]);
        let g = groups(&s, &h);
        assert_eq!(g, ["shop-team", "staff", "admins"]);
        // (admins is listed first in the config, whatever the header's order)
        assert_eq!(key_for(&s, &keys, "alice", &g).unwrap().name, "ops");
        let g = vec!["staff".to_string(), "shop-team".into()];
        assert_eq!(key_for(&s, &keys, "bob", &g).unwrap().name, "shop");
        assert!(key_for(&s, &keys, "carol", &["staff".into()]).is_none());
        let with_default = ConsoleConfig {
            default_key: Some("viewer".into()),
            ..settings()
        };
        assert_eq!(
            key_for(&with_default, &keys, "carol", &[]).unwrap().name,
            "viewer"
        );
    }

    #[test]
    fn the_client_is_the_last_address_before_the_trusted_proxies() {
        let s = settings();
        let h = headers(&[("x-forwarded-for", "1.2.3.4, 203.0.113.9, 192.168.1.1")]);
        let ip = |h: &HeaderMap, p: &str| client_ip(&s, h, peer(p)).unwrap().to_string();
        assert_eq!(
            ip(&h, "10.0.0.5"),
            "203.0.113.9",
            "what the client wrote is skipped"
        );
        assert_eq!(
            ip(&h, "198.51.100.7"),
            "198.51.100.7",
            "an untrusted peer is the client"
        );
        assert_eq!(ip(&headers(&[]), "10.0.0.5"), "10.0.0.5");
        let all_trusted = headers(&[("x-forwarded-for", "192.168.1.2, 192.168.1.1")]);
        assert_eq!(ip(&all_trusted, "10.0.0.5"), "192.168.1.2");
        let junk = headers(&[("x-forwarded-for", "nonsense")]);
        assert_eq!(ip(&junk, "10.0.0.5"), "10.0.0.5");
    }

    #[test]
    fn https_is_believed_from_a_trusted_proxy_or_set() {
        let s = settings();
        let h = headers(&[("x-forwarded-proto", "https")]);
        assert!(https(&s, &h, peer("10.0.0.5")));
        assert!(!https(&s, &h, peer("10.9.9.9")));
        assert!(!https(
            &s,
            &headers(&[("x-forwarded-proto", "http")]),
            peer("10.0.0.5")
        ));
        let always = ConsoleConfig {
            secure_cookie: Some(true),
            ..settings()
        };
        assert!(https(&always, &headers(&[]), peer("10.9.9.9")));
        let never = ConsoleConfig {
            secure_cookie: Some(false),
            ..settings()
        };
        assert!(!https(&never, &h, peer("10.0.0.5")));
    }
}
