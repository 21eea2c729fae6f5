//! The file as written: serde structs that reject unknown keys and keep spans.
//!
//! Every field is optional so a missing key is reported by validation (with all other
//! problems of the same table) instead of stopping serde. Integers are read as `i64` and
//! range-checked later for the same reason, and durations and sizes keep their parse error
//! instead of failing, so one bad value does not hide the rest of its table.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Visitor};
use toml::Spanned;

use super::Handler;
use super::values;

pub(crate) type S<T> = Option<Spanned<T>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub redis: S<String>,
    pub namespace: S<String>,
    pub redis_password_file: S<String>,
    pub redis_ca_file: S<String>,
    pub redis_cert_file: S<String>,
    pub redis_key_file: S<String>,
    pub wait_replicas: S<i64>,
    pub wait_timeout: S<Human<Duration>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawManager {
    pub tick: S<Human<Duration>>,
    pub timezone: S<String>,
    pub heartbeat_timeout: S<Human<Duration>>,
    pub forget_hosts_after: S<Human<Duration>>,
    pub http: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMaster {
    pub memory_reserve: S<Human<Size>>,
    pub slot_estimate: S<Human<Size>>,
    pub drain_timeout: S<Human<Duration>>,
    pub http: S<String>,
    pub max_slots: S<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQueue {
    pub handler: S<String>,
    pub command: S<Vec<Spanned<String>>>,
    pub start: S<String>,
    pub fail_rate: S<f64>,
    pub grow_per_task: S<Human<Size>>,
    pub preload: S<Human<Size>>,
    pub priority: S<i64>,
    pub min_slots: S<i64>,
    pub max_slots: S<i64>,
    pub batch_size: S<i64>,
    pub lease: S<Human<Duration>>,
    pub max_attempts: S<i64>,
    pub retry: S<RawRetry>,
    pub private_dirty_limit: S<Human<Size>>,
    pub max_batch_time: S<Human<Duration>>,
    pub work_periods: S<Vec<Spanned<String>>>,
    pub system: S<String>,
    pub max_payload: S<Human<Size>>,
    pub user: S<String>,
    pub cpu_scheduling: S<String>,
    pub track: S<bool>,
    pub prefetch: S<bool>,
    pub ordered: S<bool>,
    pub history_ttl: S<Human<Duration>>,
    pub max_result: S<Human<Size>>,
    pub dedup: S<String>,
    pub intake: S<String>,
    /// Follow-up routes: read from the tree across queues in `routes.rs`; here only so
    /// that `deny_unknown_fields` knows the key.
    #[allow(dead_code)]
    pub next: S<serde::de::IgnoredAny>,
    pub kind: S<String>,
    pub work_periods_long: S<String>,
    pub cancel_grace: S<Human<Duration>>,
    pub max_per_host: S<i64>,
    pub timeout: S<Human<Duration>>,
    /// Settings of a handler built into a team's own binary, passed to it as JSON.
    pub options: S<serde_json::Value>,
}

/// Keys that belong to one handler only, with that handler's name.
pub(crate) const HANDLER_KEYS: [(&str, &str); 5] = [
    ("command", Handler::EXEC),
    ("start", Handler::EXEC),
    ("fail_rate", Handler::FLAKY),
    ("grow_per_task", Handler::MEMHOG),
    ("preload", Handler::PRELOAD_DEMO),
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetry {
    pub backoff: S<String>,
    pub base: S<Human<Duration>>,
    pub max: S<Human<Duration>>,
    pub intervals: S<Vec<Spanned<Human<Duration>>>>,
    pub priority: S<i64>,
}

/// One `next = [{ queue, on }]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub queue: S<String>,
    pub on: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSystem {
    pub max_concurrency: S<i64>,
    pub rate: S<String>,
    pub paused: S<bool>,
    pub work_periods: S<Vec<Spanned<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSchedule {
    pub name: S<String>,
    pub queue: S<String>,
    pub cron: S<String>,
    pub every: S<Human<Duration>>,
    pub payload: S<serde_json::Value>,
    pub timezone: S<String>,
    /// An RFC 3339 time: a TOML offset date-time or a string.
    pub until: S<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApi {
    pub listen: S<String>,
    pub max_body: S<Human<Size>>,
    pub max_wait: S<Human<Duration>>,
    pub read_timeout: S<Human<Duration>>,
    pub max_connections_per_peer: S<i64>,
    pub auth_timeout: S<Human<Duration>>,
    pub max_listings_per_key: S<i64>,
    /// Only accepted here: `keys` and each `[api.keys.NAME]` are read from the tree on
    /// their own (like `[systems.NAME]`), so one bad key does not hide the others and a
    /// misshapen `keys` is reported once, in the words used for every other table.
    #[allow(dead_code)]
    pub keys: S<de::IgnoredAny>,
    /// `true`, `false` or a table: read from the tree in `console.rs`, since serde cannot
    /// tell a misshapen one apart in the words used elsewhere.
    #[allow(dead_code)]
    pub console: S<de::IgnoredAny>,
}

/// `[api.console]`, the web console's settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConsole {
    pub session_ttl: S<Human<Duration>>,
    pub session_secret_file: S<String>,
    pub secure_cookie: S<bool>,
    pub max_failed_logins: S<i64>,
    pub failed_login_window: S<Human<Duration>>,
    pub trusted_proxies: S<Vec<Spanned<String>>>,
    pub user_header: S<String>,
    pub groups_header: S<String>,
    pub default_key: S<String>,
    /// Read from the tree in file order (`console.rs`): the first group wins.
    #[allow(dead_code)]
    pub groups: S<de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApiKey {
    pub token_sha256: S<String>,
    pub queues: S<Vec<Spanned<String>>>,
    pub admin: S<bool>,
}

/// A byte count written as a size string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Size(pub u64);

/// A value written in a human syntax; holds the parse error rather than failing, so
/// validation can report it alongside everything else in the same table.
#[derive(Debug, Clone)]
pub(crate) struct Human<T>(pub Result<T, String>);

/// How each human syntax is parsed and what it looks like in examples.
pub(crate) trait HumanSyntax: Sized {
    const WHAT: &'static str;
    const EXAMPLE: &'static str;
    fn parse(text: &str) -> Result<Self, String>;
}

impl HumanSyntax for Duration {
    const WHAT: &'static str = "duration";
    const EXAMPLE: &'static str = "\"10s\"";
    fn parse(text: &str) -> Result<Self, String> {
        values::parse_duration(text)
    }
}

impl HumanSyntax for Size {
    const WHAT: &'static str = "size";
    const EXAMPLE: &'static str = "\"64MiB\"";
    fn parse(text: &str) -> Result<Self, String> {
        values::parse_size(text).map(Size)
    }
}

impl<'de, T: HumanSyntax> Deserialize<'de> for Human<T> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(HumanVisitor(PhantomData))
    }
}

struct HumanVisitor<T>(PhantomData<T>);

impl<T: HumanSyntax> HumanVisitor<T> {
    fn bare_number(n: impl fmt::Display) -> Human<T> {
        Human(Err(format!(
            "bare number {n} is not a {what}, write a string with a unit like {example}",
            what = T::WHAT,
            example = T::EXAMPLE,
        )))
    }
}

impl<'de, T: HumanSyntax> Visitor<'de> for HumanVisitor<T> {
    type Value = Human<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} string like {}", T::WHAT, T::EXAMPLE)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Human(T::parse(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Self::bare_number(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Self::bare_number(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Self::bare_number(v))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // toml hands a datetime over as a one-entry map under a private key.
        let found = match map.next_key::<String>()? {
            Some(k) if k == "$__toml_private_datetime" => {
                format!("datetime `{}`", map.next_value::<String>()?)
            }
            _ => String::from("table"),
        };
        while map
            .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
            .is_some()
        {}
        Ok(Human(Err(format!(
            "expected a {} string like {}, found {found}",
            T::WHAT,
            T::EXAMPLE
        ))))
    }
}
