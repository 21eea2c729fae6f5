//! Cluster state shared through Redis: what masters report about their hosts and queues,
//! and the slot map the manager publishes. Both sides import these types; neither knows
//! the other.
//!
//! Keys, all under the hash tag `{cluster}` so that the manager's fenced scripts (which
//! check the leadership lease and write the map in one step) are single-slot on a Redis
//! Cluster:
//! - `NS:{cluster}:hosts`: hash, host name → JSON [`HostReport`], rewritten every master
//!   tick; the manager counts a host alive while its report keeps changing (its `ts_ms`
//!   is compared only with its own earlier ones: `manager/heartbeats.rs`).
//! - `NS:{cluster}:liveness`: string, JSON host → alive: the leader's verdicts at its last
//!   decision, which `stats` and `top` show.
//! - `NS:{cluster}:map`: string, JSON [`SlotMap`]: slots per host and queue, with the
//!   writer's fencing epoch and a version.
//! - `NS:{cluster}:lease`, `NS:{cluster}:epoch`: the manager's leadership (see
//!   `manager`).
//! - `NS:{cluster}:config`: hash {version, source, stamp, published_us}: the config
//!   published by `gaffer config apply`; `stamp` is `VERSION:SHA256` of the text (absent,
//!   or of another version, when a build from before it applied); `published_us` Redis's
//!   time of the apply (absent, or an older apply's, likewise).
//! - `NS:{cluster}:config:in-force`: hash {source, origin, version, manager}: the config
//!   the leading manager runs, `origin` `published` (with its version) or `file` (its own
//!   file, while nothing is published), written at each leadership and adoption. Only
//!   readers that show it (the api's `GET /v1/queues/{q}`) read it.
//! - `NS:{cluster}:paused`, `NS:{cluster}:draining`: sets of paused queues and draining
//!   hosts, written by `gaffer pause|resume|drain`.
//! - `NS:{cluster}:decisions`: JSON of the manager's last decision per queue.
//! - `NS:{cluster}:sched`: hash, schedule claim field → last fire time claimed (ms), with
//!   the fire pending and the last fired beside it; `NS:{cluster}:schedules:def`,
//!   `:schedules:owners`, `:schedules:paused`: the stored schedules, their count per
//!   owner, the paused names. Their writers and readers: `schedule::store`.
//! - `NS:{cluster}:queues`: set, every queue name a config has named: the leading manager
//!   adds its config's names (at each config it adopts and each leadership it takes),
//!   `gaffer queues retire` removes one. A name in it but not in the config in force is a
//!   retired queue, which `stats` and `tasks` still reach.
//!
//! Configs are told apart by their text (ARCHITECTURE.md, invariant 38). `config apply`
//! numbers configs with `HINCRBY`, which a Redis that lost its data starts again at 1, so a
//! role that waited for a version above the one it read would run a revoked key until the
//! count caught up. Every role (manager, master, api, `top`) therefore reads the published
//! config through [`changed_config`], which compares the text's SHA-256 with the one it
//! read last (`ConfigSeen`): another text is adopted at any version, the same text under
//! another version is not adopted again, and a version that did not go up, or a config
//! gone, is warned about. [`publish_config`] writes `stamp` = `VERSION:SHA256` beside the
//! text, so a tick with nothing new reads two short fields; a stamp naming another version
//! (an older build's apply left it) or none means the text is read and compared. A text
//! published before the one read (Redis went back to an older apply: a failover to a
//! replica that lagged) is not adopted; the leader publishes the one in force again.

pub mod snapshot;

use std::collections::{BTreeMap, BTreeSet};

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::config::{Config, ConfigError};
use crate::queue_client::{QueueError, RedisConn, RedisNode};

/// The limit that decided a host's capacity (the master's `capacity` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The memory budget divided by the average slot.
    Memory,
    /// The CPU is overloaded: the host holds the slots it ran then, replacing those that
    /// exit, and takes no more.
    Load,
    /// The configured `max_slots`.
    MaxSlots,
}

/// What a master reports about its host every tick.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    /// The host name slots are placed by.
    pub host: String,
    /// The master's pid, to tell restarts apart.
    pub pid: u32,
    /// When this master started (Unix ms); counters restart from zero with it.
    pub started_ms: u64,
    /// When this report was written (Unix ms, the master's clock).
    pub ts_ms: u64,
    /// The master is stopping: place nothing here.
    pub draining: bool,
    /// Slots the host can hold now (memory, load and `max_slots` considered).
    pub capacity: u32,
    /// Slots running now.
    pub slots: u32,
    /// Σ PSS of the master's whole process tree (master, zygotes, slots, every exec
    /// child and what it started) and of the slots' outside processes, each process once.
    pub pss_bytes: u64,
    /// MemAvailable, bounded by the cgroup's memory.max when set.
    pub mem_available_bytes: u64,
    /// Memory the slots may use: Σ PSS + MemAvailable − reserve.
    pub memory_budget_bytes: u64,
    /// One-minute load average.
    pub load1: f64,
    /// Online CPUs.
    pub cpus: u32,
    /// PSI's `some avg10` of the CPU (percent of the last 10 s in which some task waited
    /// for one), where the kernel has it. Absent in the reports of masters from before it.
    #[serde(default)]
    pub cpu_pressure: Option<f64>,
    /// What bounds `capacity`: `"memory"`, `"load"` (the CPU is overloaded: the host holds
    /// the slots it ran then, replacing those that exit, and takes no more) or
    /// `"max_slots"`. Absent in the reports of masters from before it: `None`.
    #[serde(default)]
    pub capacity_bound: Option<Bound>,
    /// Handler names this host's binary can run.
    pub handlers: Vec<String>,
    /// Version of the slot map the host follows (0: none seen yet).
    pub map_version: u64,
    /// The highest manager epoch the master has seen (it ignores maps of lower ones): a
    /// manager whose epoch restarted below it (Redis lost its data) raises its own past it.
    /// Absent in the reports of masters from before it: 0.
    #[serde(default)]
    pub map_epoch: u64,
    /// Per queue served or recently served.
    pub queues: BTreeMap<String, QueueReport>,
    /// The Redis node the master talks to and the failovers it followed (through
    /// Sentinel; 0 on one server and on a Redis Cluster, whose failovers the manager
    /// counts). Absent in the reports of masters from before it: `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisNode>,
}

/// Per queue on one host, counters monotonic since the master started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueReport {
    /// Slots running now.
    pub slots: u32,
    /// Slots the map asks for.
    pub wanted: u32,
    /// Tasks handled (any outcome).
    pub processed_total: u64,
    /// Tasks whose outcome was not done.
    pub failed_total: u64,
    /// Batches handled.
    pub batches_total: u64,
    /// Seconds spent inside `handle`.
    pub busy_seconds_total: f64,
    /// Seconds lived by slots of this queue (running ones count up to now).
    pub slot_lifetime_seconds_total: f64,
    /// Slots that exited 75 (memory recycling).
    pub recycles_total: u64,
    /// Slots that exited otherwise unasked (crash, signal).
    pub crashes_total: u64,
    /// Slots killed by the watchdog.
    pub hung_total: u64,
    /// Σ PSS of the queue's running slots, each with its descendants and its outside
    /// process's tree (zygotes are not in it). Absent in the reports of masters from
    /// before it: 0.
    #[serde(default)]
    pub pss_bytes: u64,
    /// Why the queue's last slot crash on this host happened, as the slot said it (its
    /// exit reason's head and tail: a traceback's last lines), absent before any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_crash: Option<LastCrash>,
    /// Why the master runs no slot for the queue although the map asks for some (its
    /// layout is newer than the master's: `queue_client::layout`); absent when it runs them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// A slot's crash as its master reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LastCrash {
    /// The slot's exit reason (bounded to [`LastCrash::MAX_REASON`] bytes), or its exit
    /// code or signal when it said none.
    pub reason: String,
    /// When, in ms since the epoch.
    pub at_ms: u64,
}

impl LastCrash {
    /// The most of a reason a report carries: its first line and as many of its last
    /// lines as fit (a handler's traceback ends with its cause).
    pub const MAX_REASON: usize = 1024;

    /// A crash now, its reason bounded.
    pub fn new(reason: &str, at_ms: u64) -> Self {
        LastCrash {
            reason: bounded_reason(reason),
            at_ms,
        }
    }
}

/// `reason` whole if it fits [`LastCrash::MAX_REASON`], else its first line, `…` and the
/// last lines that fit.
fn bounded_reason(reason: &str) -> String {
    let reason = reason.trim();
    if reason.len() <= LastCrash::MAX_REASON {
        return reason.to_string();
    }
    let first = reason.lines().next().unwrap_or_default();
    let first: String = first.chars().take(LastCrash::MAX_REASON / 4).collect();
    let mut room = LastCrash::MAX_REASON.saturating_sub(first.len() + 4);
    let mut tail: Vec<&str> = Vec::new();
    for line in reason.lines().rev() {
        if line.len() + 1 > room {
            break;
        }
        room -= line.len() + 1;
        tail.push(line);
    }
    tail.reverse();
    format!("{first}\n…\n{}", tail.join("\n"))
}

/// Slots per host and queue, as the manager decided.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotMap {
    /// Fencing epoch of the manager that wrote it; masters ignore lower epochs.
    pub epoch: u64,
    /// Goes up with every write.
    pub version: u64,
    /// Host → queue → slots.
    pub hosts: BTreeMap<String, BTreeMap<String, u32>>,
}

impl SlotMap {
    /// The part of the map for one host.
    pub fn for_host(&self, host: &str) -> BTreeMap<String, u32> {
        self.hosts.get(host).cloned().unwrap_or_default()
    }
}

/// Names of the cluster-state keys under a namespace.
#[derive(Debug, Clone)]
pub struct Keys {
    ns: String,
}

impl Keys {
    /// Keys under `namespace` (the config's `[cluster].namespace`).
    pub fn new(namespace: &str) -> Self {
        Self {
            ns: namespace.to_owned(),
        }
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}:{{cluster}}:{suffix}", self.ns)
    }

    /// The hash of host reports.
    pub fn hosts(&self) -> String {
        self.key("hosts")
    }

    /// The slot map.
    pub fn map(&self) -> String {
        self.key("map")
    }

    /// The manager's leadership lease: `id:epoch`, with a TTL.
    pub fn lease(&self) -> String {
        self.key("lease")
    }

    /// The fencing epoch counter.
    pub fn epoch(&self) -> String {
        self.key("epoch")
    }

    /// The published config.
    pub fn config(&self) -> String {
        self.key("config")
    }

    /// The config the leading manager runs, with where it came from (the published one,
    /// or the manager's own file while none is published): `source`, `origin`, `version`,
    /// `manager`.
    pub fn config_in_force(&self) -> String {
        self.key("config:in-force")
    }

    /// Paused queues.
    pub fn paused(&self) -> String {
        self.key("paused")
    }

    /// Draining hosts.
    pub fn draining(&self) -> String {
        self.key("draining")
    }

    /// The manager's last decisions.
    pub fn decisions(&self) -> String {
        self.key("decisions")
    }

    /// The leader's verdicts on the hosts at its last decision: JSON, host name → alive.
    /// `stats` and `top` show them rather than judge by clocks of their own.
    pub fn liveness(&self) -> String {
        self.key("liveness")
    }

    /// The leader's schedule claims: last fire time per schedule, and the fire pending
    /// (`schedule::store`).
    pub fn schedules(&self) -> String {
        self.key("sched")
    }

    /// The schedules stored through the api: name → JSON.
    pub fn schedule_defs(&self) -> String {
        self.key("schedules:def")
    }

    /// How many stored schedules each owner has.
    pub fn schedule_owners(&self) -> String {
        self.key("schedules:owners")
    }

    /// The names of paused schedules (the config's and stored ones).
    pub fn schedules_paused(&self) -> String {
        self.key("schedules:paused")
    }

    /// Every queue name a config has named: what tells a queue removed from the config
    /// (retired, its data still in Redis) from a name never used.
    pub fn queues(&self) -> String {
        self.key("queues")
    }
}

/// Adds queue names to the registry of every name a config has named.
pub async fn register_queues<I, S>(
    conn: &mut RedisConn,
    keys: &Keys,
    names: I,
) -> Result<(), QueueError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let names: Vec<String> = names.into_iter().map(|n| n.as_ref().to_owned()).collect();
    if names.is_empty() {
        return Ok(());
    }
    let _: i64 = conn.sadd(keys.queues(), names).await?;
    Ok(())
}

/// Every queue name a config has named (since the release that keeps the registry).
pub async fn registered_queues(
    conn: &mut RedisConn,
    keys: &Keys,
) -> Result<BTreeSet<String>, QueueError> {
    Ok(conn.smembers(keys.queues()).await?)
}

/// Forgets a queue name (its data deleted: `gaffer queues retire`), and any pause of it.
pub async fn unregister_queue(
    conn: &mut RedisConn,
    keys: &Keys,
    name: &str,
) -> Result<(), QueueError> {
    let () = redis::pipe()
        .srem(keys.queues(), name)
        .ignore()
        .srem(keys.paused(), name)
        .ignore()
        .query_async(conn)
        .await?;
    Ok(())
}

/// Writes a host's report (its heartbeat).
pub async fn publish_host(
    conn: &mut RedisConn,
    keys: &Keys,
    report: &HostReport,
) -> Result<(), QueueError> {
    let json = serde_json::to_string(report).map_err(|e| QueueError::Protocol(e.to_string()))?;
    let () = conn.hset(keys.hosts(), &report.host, json).await?;
    Ok(())
}

/// Removes a host's report: it left the cluster on purpose.
pub async fn deregister_host(
    conn: &mut RedisConn,
    keys: &Keys,
    host: &str,
) -> Result<(), QueueError> {
    let _: i64 = conn.hdel(keys.hosts(), host).await?;
    Ok(())
}

/// Every host's last report; unreadable entries (another version's) are skipped.
pub async fn read_hosts(
    conn: &mut RedisConn,
    keys: &Keys,
) -> Result<BTreeMap<String, HostReport>, QueueError> {
    let raw: BTreeMap<String, String> = conn.hgetall(keys.hosts()).await?;
    Ok(raw
        .into_iter()
        .filter_map(|(host, json)| Some((host, serde_json::from_str(&json).ok()?)))
        .collect())
}

/// The current slot map, if one was published.
pub async fn read_map(conn: &mut RedisConn, keys: &Keys) -> Result<Option<SlotMap>, QueueError> {
    let raw: Option<String> = conn.get(keys.map()).await?;
    raw.map(|json| serde_json::from_str(&json).map_err(|e| QueueError::Protocol(e.to_string())))
        .transpose()
}

/// Writes a slot map without any fencing: for tests and tools. The manager writes through
/// its fenced path instead.
pub async fn write_map_unfenced(
    conn: &mut RedisConn,
    keys: &Keys,
    map: &SlotMap,
) -> Result<(), QueueError> {
    let json = serde_json::to_string(map).map_err(|e| QueueError::Protocol(e.to_string()))?;
    let () = conn.set(keys.map(), json).await?;
    Ok(())
}

/// Publishes config text under the next version (`gaffer config apply`); one script, so
/// two concurrent applies never share a version. Returns the version.
///
/// Beside the version and the text it writes their `stamp`, `VERSION:SHA256`, so that a
/// role can tell from two short fields that nothing changed, and `published_us`, Redis's
/// time of the apply, so that a role can tell an older config (Redis failed over to a
/// replica that had not received the newer one) from a newer one whose version restarted. An apply of a build from
/// before the stamp leaves it as it was: a stamp whose version is not the hash's is
/// ignored, and the text compared instead.
pub async fn publish_config(
    conn: &mut RedisConn,
    keys: &Keys,
    source: &str,
) -> Result<u64, QueueError> {
    let version: u64 = redis::Script::new(
        "local v = redis.call('HINCRBY', KEYS[1], 'version', 1) \
         local t = redis.call('TIME') \
         local us = string.format('%d', t[1] * 1000000 + t[2]) \
         redis.call('HSET', KEYS[1], 'source', ARGV[1], 'stamp', v .. ':' .. ARGV[2], \
           'published_us', us) return v",
    )
    .key(keys.config())
    .arg(source)
    .arg(sha256_hex(source))
    .invoke_async(conn)
    .await?;
    Ok(version)
}

/// The SHA-256 of a config's text, as 64 lower-case hex digits: what tells one published
/// config from another.
pub fn sha256_hex(source: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(source.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Which published config a role read last. A role compares texts, not only versions:
/// Redis that lost its data (a restart without persistence, a failover to a replica that
/// lagged) numbers configs from 1 again, and a role that waited for a version above the
/// one it had read would run a revoked key until the count caught up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigSeen {
    /// The version read last (0: none since the start, or none published any more).
    pub version: u64,
    /// The SHA-256 of the text read last ([`sha256_hex`]); `None` until one was read.
    pub sha256: Option<String>,
    /// When the text read last was published (Redis's clock, Unix µs; 0 for an apply of a
    /// build that did not say).
    pub published_us: u64,
}

/// A published config whose text differs from the one a role read last.
#[derive(Debug)]
pub struct Published {
    /// Its version. A role marks it seen whether or not it parses, so a config this binary
    /// refuses stays refused rather than being read again every tick.
    pub version: u64,
    /// Its text, as published.
    pub source: String,
    /// The text parsed with this binary's custom handler names: a binary lacking one may
    /// refuse a config `config apply` accepted.
    pub config: Result<Config, ConfigError>,
}

/// What [`changed_config`] read.
#[derive(Debug)]
pub struct ConfigRead {
    /// What the role has now seen; it keeps it for its next read.
    pub seen: ConfigSeen,
    /// The published config, when its text is not the one seen before.
    pub changed: Option<Published>,
    /// Redis holds a config published before the one seen (it failed over to a replica
    /// that lagged): not adopted; a leader publishes the one it runs again.
    pub behind: bool,
}

/// The config published now, when its text differs from the one `seen` names, parsed
/// with the binary's custom handler names; whatever its version, so that a config applied
/// after Redis lost its data is adopted at once. The same text under another version is
/// no change (nothing to adopt again). A version that went backwards, a text that changed
/// under the same version, and a published config gone are warned about.
pub async fn changed_config(
    conn: &mut RedisConn,
    keys: &Keys,
    seen: &ConfigSeen,
    custom_handlers: &[String],
) -> Result<ConfigRead, QueueError> {
    let (version, stamp): (Option<u64>, Option<String>) = redis::cmd("HMGET")
        .arg(keys.config())
        .arg("version")
        .arg("stamp")
        .query_async(conn)
        .await?;
    let Some(version) = version else {
        return Ok(gone(seen));
    };
    if let Some(sha) = stamp.as_deref().and_then(|s| stamp_sha(s, version))
        && seen.sha256.as_deref() == Some(sha)
    {
        return Ok(same_text(seen, version));
    }
    // The text read with its own version, in one call: another apply may have come since.
    let (version, source, published_us): (Option<u64>, Option<String>, Option<u64>) =
        redis::cmd("HMGET")
            .arg(keys.config())
            .arg("version")
            .arg("source")
            .arg("published_us")
            .query_async(conn)
            .await?;
    let (Some(version), Some(source)) = (version, source) else {
        return Ok(gone(seen));
    };
    let published_us = published_us.unwrap_or(0);
    let sha = sha256_hex(&source);
    if seen.sha256.as_deref() == Some(sha.as_str()) {
        return Ok(same_text(seen, version));
    }
    // (0: an apply of a build that did not say; compared by its text alone, as before)
    if published_us > 0 && published_us < seen.published_us {
        tracing::warn!(
            version,
            published_us,
            running_published_us = seen.published_us,
            "redis holds a config published before the one in force (it failed over to a replica that lagged?): not adopted; the leading manager publishes the one in force again"
        );
        return Ok(ConfigRead {
            seen: seen.clone(),
            changed: None,
            behind: true,
        });
    }
    if seen.sha256.is_some() && version <= seen.version {
        tracing::warn!(
            version,
            previous = seen.version,
            "the published config's version did not go up (redis lost its data or failed over to a replica that lagged): its text differs, so it is adopted"
        );
    }
    let origin = format!("redis config v{version}");
    let config = crate::config::parse_with(&source, &origin, custom_handlers);
    Ok(ConfigRead {
        seen: ConfigSeen {
            version,
            sha256: Some(sha),
            published_us,
        },
        changed: Some(Published {
            version,
            source,
            config,
        }),
        behind: false,
    })
}

/// The SHA-256 a stamp gives for `version`; `None` when it is another version's (left by
/// an apply of a build that wrote no stamp) or unreadable.
fn stamp_sha(stamp: &str, version: u64) -> Option<&str> {
    let (v, sha) = stamp.split_once(':')?;
    (v.parse::<u64>().ok()? == version).then_some(sha)
}

/// The text seen before, now published as `version`: nothing to adopt.
fn same_text(seen: &ConfigSeen, version: u64) -> ConfigRead {
    if version != seen.version {
        if version < seen.version {
            tracing::warn!(
                version,
                previous = seen.version,
                "the published config's version went backwards (redis lost its data or failed over to a replica that lagged); its text is unchanged, nothing to adopt"
            );
        } else {
            tracing::info!(
                version,
                "a config published again with its text unchanged; nothing to adopt"
            );
        }
    }
    ConfigRead {
        seen: ConfigSeen {
            version,
            sha256: seen.sha256.clone(),
            published_us: seen.published_us,
        },
        changed: None,
        behind: false,
    }
}

/// No config published (any more). The role keeps what it runs; once, it says why the
/// config it read is gone.
fn gone(seen: &ConfigSeen) -> ConfigRead {
    if seen.version > 0 {
        tracing::warn!(
            previous = seen.version,
            "the published config is gone from redis (it lost its data?): keeping the config in force until one is applied again"
        );
    }
    ConfigRead {
        seen: ConfigSeen {
            version: 0,
            sha256: seen.sha256.clone(),
            published_us: seen.published_us,
        },
        changed: None,
        behind: false,
    }
}

/// Pauses (`true`) or resumes a queue for the manager. Returns whether anything changed.
pub async fn set_paused(
    conn: &mut RedisConn,
    keys: &Keys,
    queue: &str,
    paused: bool,
) -> Result<bool, QueueError> {
    let changed: i64 = if paused {
        conn.sadd(keys.paused(), queue).await?
    } else {
        conn.srem(keys.paused(), queue).await?
    };
    Ok(changed > 0)
}

/// Marks a host for draining (`true`) or lets it take slots again. Returns whether
/// anything changed.
pub async fn set_draining(
    conn: &mut RedisConn,
    keys: &Keys,
    host: &str,
    draining: bool,
) -> Result<bool, QueueError> {
    let changed: i64 = if draining {
        conn.sadd(keys.draining(), host).await?
    } else {
        conn.srem(keys.draining(), host).await?
    };
    Ok(changed > 0)
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod last_crash_tests {
    use super::*;

    #[test]
    fn a_long_reason_keeps_its_first_line_and_its_last_lines() {
        let mut reason = String::from("handler init failed: the zygote exited");
        for i in 0..200 {
            reason.push_str(&format!("\n  File \"m{i}.py\", line {i}, in <module>"));
        }
        reason.push_str("\nModuleNotFoundError: No module named 'x'");
        let c = LastCrash::new(&reason, 7);
        assert!(
            c.reason.len() <= LastCrash::MAX_REASON,
            "{}",
            c.reason.len()
        );
        assert!(
            c.reason
                .starts_with("handler init failed: the zygote exited\n…\n")
        );
        assert!(
            c.reason
                .ends_with("ModuleNotFoundError: No module named 'x'")
        );
        assert_eq!(LastCrash::new(" short \n", 1).reason, "short");
    }
}
