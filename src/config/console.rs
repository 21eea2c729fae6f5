//! `[api].console`: the web console's settings, and their checks.
//!
//! `console` is `true` (the default: the console with every default), `false` (no console:
//! `/ui/` answers 404 and no cookie or proxy header is honoured), or a table of settings,
//! which turns it on. Its `groups` table is read from the tree in file order, since the
//! first mapped group a user is in decides their key.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::error::Collector;
use super::raw::RawConsole;
use super::validate::{deserialize, duration_checked, find, int, join, table_of};

/// Shortest `session_ttl`: a session that ends before a page is read is no session.
const MIN_SESSION_TTL: Duration = Duration::from_secs(60);
/// Longest `session_ttl`: a stolen cookie is good until then.
const MAX_SESSION_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest `failed_login_window`.
const MAX_LOGIN_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The web console's settings, `[api.console]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// How long a session cookie lasts from its login; there is no renewal.
    pub session_ttl: Duration,
    /// The file holding the secret session cookies are signed with; instances that share
    /// it accept each other's cookies. `None`: a random secret per process, so a restart
    /// ends every session.
    pub session_secret_file: Option<PathBuf>,
    /// `Some(true)`: the cookie is always `Secure`; `Some(false)`: never; `None`: when a
    /// trusted proxy says the browser used HTTPS (`X-Forwarded-Proto: https`).
    pub secure_cookie: Option<bool>,
    /// Failed logins one client address may make within `failed_login_window`; further
    /// attempts are refused unchecked until the window ends.
    pub max_failed_logins: u32,
    /// The window failed logins are counted over.
    pub failed_login_window: Duration,
    /// The addresses whose `X-Forwarded-*` and user headers are believed.
    pub trusted_proxies: Vec<Cidr>,
    /// The header (lower case) a trusted proxy names the authenticated user in; `None`:
    /// no auth-proxy mode.
    pub user_header: Option<String>,
    /// The header (lower case) a trusted proxy lists the user's groups in, separated by
    /// commas.
    pub groups_header: Option<String>,
    /// Group → key name, in file order: a user gets the key of the first one they are in.
    pub groups: Vec<(String, String)>,
    /// The key of a proxy user in no mapped group; `None`: such a user is refused.
    pub default_key: Option<String>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            session_ttl: Duration::from_secs(12 * 3600),
            session_secret_file: None,
            secure_cookie: None,
            max_failed_logins: 10,
            failed_login_window: Duration::from_secs(300),
            trusted_proxies: Vec::new(),
            user_header: None,
            groups_header: None,
            groups: Vec::new(),
            default_key: None,
        }
    }
}

impl ConsoleConfig {
    /// Whether `ip` is one of `trusted_proxies`.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|c| c.contains(ip))
    }
}

/// An address or a network: `10.0.0.5` or `10.1.0.0/16` (IPv6 alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The network's address, its host bits cleared.
    pub addr: IpAddr,
    /// The length of its prefix in bits (32 or 128 for one address).
    pub prefix: u8,
}

impl Cidr {
    /// Parses `IP` or `IP/PREFIX`; an error says what is wrong.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (ip, prefix) = match text.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = ip
            .parse()
            .map_err(|_| format!("`{ip}` is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("prefix `/{p}` must be 0 to {max}")),
            },
        };
        Ok(Cidr {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `ip` is in this network. An IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`,
    /// as a dual-stack socket reports IPv4 peers) is taken as the IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

/// `ip` with every bit past `prefix` cleared.
fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let keep = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((bits & keep).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let keep = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((bits & keep).into())
        }
    }
}

/// `[api].console` as written: `None` when it is `false`. `keys` are the names of the
/// declared `[api.keys.NAME]`, valid or not, which `groups` and `default_key` may name.
pub(super) fn console(
    c: &mut Collector,
    api: &DeTable,
    keys: &BTreeSet<String>,
) -> Option<ConsoleConfig> {
    let Some(value) = find(api, "console") else {
        return Some(ConsoleConfig::default());
    };
    match value.get_ref() {
        DeValue::Boolean(on) => return on.then(ConsoleConfig::default),
        DeValue::Table(_) => {}
        other => {
            c.error(
                value.span(),
                "api.console",
                format!(
                    "expected true, false or a table of console settings, found {}",
                    other.type_str()
                ),
            );
            return Some(ConsoleConfig::default());
        }
    }
    let table = table_of(c, value, "api.console")?;
    let groups = groups(c, table, keys);
    let raw = deserialize::<RawConsole>(c, value, "api.console")?;
    let d = ConsoleConfig::default();
    const AT: &str = "api.console";
    let session_ttl = duration_checked(c, (AT, "session_ttl"), raw.session_ttl, d.session_ttl, {
        |got| {
            (!(MIN_SESSION_TTL..=MAX_SESSION_TTL).contains(&got))
                .then(|| String::from("must be between 1m and 30days"))
        }
    });
    let failed_login_window = duration_checked(
        c,
        (AT, "failed_login_window"),
        raw.failed_login_window,
        d.failed_login_window,
        |got| (got > MAX_LOGIN_WINDOW).then(|| String::from("must be at most 1day")),
    );
    let max_failed_logins = int(
        c,
        AT,
        "max_failed_logins",
        raw.max_failed_logins,
        d.max_failed_logins,
        1,
        1_000_000,
    );
    let session_secret_file = raw.session_secret_file.and_then(|f| {
        if f.get_ref().trim().is_empty() {
            c.error(
                f.span(),
                &join(AT, "session_secret_file"),
                "must not be empty",
            );
            None
        } else {
            Some(PathBuf::from(f.into_inner()))
        }
    });
    let trusted_proxies = trusted_proxies(c, raw.trusted_proxies);
    let user_header = header_name(c, "user_header", raw.user_header);
    let groups_header = header_name(c, "groups_header", raw.groups_header);
    let default_key = raw
        .default_key
        .and_then(|k| known_key(c, &join(AT, "default_key"), &k, keys).then(|| k.into_inner()));
    let out = ConsoleConfig {
        session_ttl,
        session_secret_file,
        secure_cookie: raw.secure_cookie.map(Spanned::into_inner),
        max_failed_logins,
        failed_login_window,
        trusted_proxies,
        user_header,
        groups_header,
        groups,
        default_key,
    };
    proxy_mode(c, table, &out);
    Some(out)
}

/// The checks across the auth-proxy keys: a user header needs proxies to trust and a way
/// to a key; groups need the header they are read from.
fn proxy_mode(c: &mut Collector, table: &DeTable, out: &ConsoleConfig) {
    let span = |key: &str| find(table, key).map(Spanned::span);
    if let Some(at) = span("user_header") {
        if out.trusted_proxies.is_empty() {
            c.error(
                at.clone(),
                "api.console.user_header",
                "needs `trusted_proxies`: from any address the header would let anyone name a user",
            );
        }
        if out.groups.is_empty() && out.default_key.is_none() && span("groups").is_none() {
            c.error(
                at,
                "api.console.user_header",
                "needs [api.console.groups] or `default_key`: the keys users get",
            );
        }
    } else {
        for key in ["groups_header", "groups", "default_key"] {
            if let Some(at) = span(key) {
                c.error(
                    at,
                    &join("api.console", key),
                    "needs `user_header`: it applies to users a trusted proxy names",
                );
            }
        }
        return;
    }
    // (a groups header written but refused has its own error)
    if let Some(at) = span("groups")
        && span("groups_header").is_none()
    {
        c.error(
            at,
            "api.console.groups",
            "needs `groups_header`: the header the groups are read from",
        );
    }
    if out.user_header.is_some() && out.user_header == out.groups_header {
        c.error(
            span("groups_header").unwrap_or(0..0),
            "api.console.groups_header",
            "must differ from `user_header`",
        );
    }
}

/// `[api.console.groups]`: group name → key name, in file order.
fn groups(c: &mut Collector, console: &DeTable, keys: &BTreeSet<String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(table) = find(console, "groups").and_then(|v| table_of(c, v, "api.console.groups"))
    else {
        return out;
    };
    let mut entries: Vec<_> = table.iter().collect();
    entries.sort_by_key(|(group, _)| group.span().start);
    for (group, value) in entries {
        let at = join("api.console.groups", group.get_ref());
        let DeValue::String(key) = value.get_ref() else {
            c.error(
                value.span(),
                &at,
                format!(
                    "expected a key name like \"ops\", found {}",
                    value.get_ref().type_str()
                ),
            );
            continue;
        };
        let key = Spanned::new(value.span(), key.to_string());
        if group.get_ref().trim().is_empty() {
            c.error(group.span(), &at, "a group name must not be empty");
        } else if known_key(c, &at, &key, keys) {
            out.push((group.get_ref().to_string(), key.into_inner()));
        }
    }
    out
}

/// Whether `key` names a declared `[api.keys.NAME]`; an error is collected when not.
fn known_key(c: &mut Collector, at: &str, key: &Spanned<String>, keys: &BTreeSet<String>) -> bool {
    let known = keys.contains(key.get_ref());
    if !known {
        c.error(
            key.span(),
            at,
            format!(
                "unknown key `{0}`, no [api.keys.{0}] table is defined",
                key.get_ref()
            ),
        );
    }
    known
}

fn trusted_proxies(c: &mut Collector, raw: Option<Spanned<Vec<Spanned<String>>>>) -> Vec<Cidr> {
    let mut out = Vec::new();
    for (i, entry) in raw
        .map(Spanned::into_inner)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        match Cidr::parse(entry.get_ref()) {
            Ok(cidr) => out.push(cidr),
            Err(why) => c.error(
                entry.span(),
                &format!("api.console.trusted_proxies[{i}]"),
                format!(
                    "{why}: expected an address or a network like \"10.0.0.5\" or \"10.1.0.0/16\""
                ),
            ),
        }
    }
    out
}

/// A header name as HTTP allows it (RFC 9110's token), kept in lower case.
fn header_name(c: &mut Collector, key: &str, raw: Option<Spanned<String>>) -> Option<String> {
    let raw = raw?;
    let name = raw.get_ref();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        c.error(
            raw.span(),
            &join("api.console", key),
            "expected a header name like \"X-Forwarded-User\"",
        );
        return None;
    }
    const OWN: [&str; 4] = ["authorization", "cookie", "host", "x-csrf-token"];
    let lower = name.to_ascii_lowercase();
    if OWN.contains(&lower.as_str()) {
        c.error(
            raw.span(),
            &join("api.console", key),
            format!("`{name}` carries something else; name the header the proxy sets"),
        );
        return None;
    }
    Some(lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_match_their_networks() {
        let net = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(net.contains("10.1.200.3".parse().unwrap()));
        assert!(!net.contains("10.2.0.1".parse().unwrap()));
        assert!(
            net.contains("::ffff:10.1.0.9".parse().unwrap()),
            "mapped v4"
        );
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert_eq!(one.prefix, 32);
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        // (host bits written in the network are cleared, not refused)
        assert_eq!(
            Cidr::parse("10.1.2.3/8").unwrap(),
            Cidr::parse("10.0.0.0/8").unwrap()
        );
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("203.0.113.9".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()), "v4 nets hold no v6");
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::5".parse().unwrap()));
        assert!(!v6.contains("fe80::1".parse().unwrap()));
        assert!(
            Cidr::parse("::1/128")
                .unwrap()
                .contains("::1".parse().unwrap())
        );
    }

    #[test]
    fn bad_networks_say_what_is_wrong() {
        assert_eq!(
            Cidr::parse("10.0.0/8").unwrap_err(),
            "`10.0.0` is not an IP address"
        );
        assert_eq!(
            Cidr::parse("10.0.0.0/33").unwrap_err(),
            "prefix `/33` must be 0 to 32"
        );
        assert_eq!(
            Cidr::parse("::/x").unwrap_err(),
            "prefix `/x` must be 0 to 128"
        );
    }
}
