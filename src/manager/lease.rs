//! Leadership: one lease key with a TTL and a fencing epoch. Every write the manager makes
//! to shared state goes through a script that first checks the lease still names this
//! manager and its epoch, so a manager that lost the lease (paused, partitioned) cannot
//! write, even if it does not know yet.
//!
//! The fenced writes (ARCHITECTURE.md, invariant 19), all made through
//! `Leadership::fenced`: the map, the balancer's decisions with the hosts' liveness, each
//! schedule claim and skip, the config in force published again over an older one, the deletion of a silent host's report (compare-and-delete) and epoch
//! raises. Each compares the lease value with `id:epoch` in the same step (all `{cluster}`
//! keys share one hash slot), so a manager paused past its lease is refused the moment it
//! wakes. Masters also ignore maps of a lower epoch than they have seen, and report the
//! highest (`map_epoch`); a leader whose epoch is lower (the counter restarted with Redis's
//! data) raises it past, in a fenced script, on the first tick a report shows it. The load
//! rings and the queue scripts a tick runs (housekeeping, system switches, the disabled
//! sweep) are not fenced: they are idempotent or guarded by generations.

use std::time::Duration;

use redis::{Script, ScriptInvocation};

use crate::cluster::{Keys, SlotMap};
use crate::queue_client::{QueueError, RedisConn};

/// Take the lease if free, renew it if ours. Returns our epoch, or 0 if another holds it.
const ACQUIRE: &str = r"
local cur = redis.call('GET', KEYS[1])
local me = ARGV[1]
if cur then
  local id, epoch = string.match(cur, '^(.*):(%d+)$')
  if id == me then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(epoch)
  end
  return 0
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], me .. ':' .. epoch, 'PX', ARGV[2])
return epoch
";

/// Write the map if the lease is still `id:epoch`. Returns the new version, or 0 when
/// fenced off.
const WRITE_MAP: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then return 0 end
local version = 1
local old = redis.call('GET', KEYS[2])
if old then
  local v = string.match(old, '"version":(%d+)')
  if v then version = tonumber(v) + 1 end
end
local map = string.gsub(ARGV[3], '"version":0', '"version":' .. version, 1)
redis.call('SET', KEYS[2], map)
return version
"#;

/// Write the balancer's decisions and the hosts' liveness (KEYS[3], ARGV[4]) if the lease
/// is still `id:epoch`. Returns 1, or 0 when fenced off.
const WRITE_DECISIONS: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[4])
return 1
";

/// Raise the epoch of the lease `id:epoch` past ARGV[3] (the highest a master has seen):
/// the counter goes past it too, so no later manager falls below it again. Returns the new
/// epoch, or 0 when fenced off.
const RAISE_EPOCH: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then return 0 end
local epoch = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if epoch <= floor then
  epoch = floor + 1
  redis.call('SET', KEYS[2], epoch)
end
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%d', epoch), 'KEEPTTL')
return epoch
";

/// Publish the config in force again (ARGV[3], its SHA-256 ARGV[4], published at ARGV[5])
/// if the lease is still `id:epoch`: Redis went back to an older one. Its publish time is
/// kept, so it stays newer than the one it replaces. Returns the version, or 0 when
/// fenced off.
const REPUBLISH_CONFIG: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then return 0 end
local v = redis.call('HINCRBY', KEYS[2], 'version', 1)
redis.call('HSET', KEYS[2], 'source', ARGV[3], 'stamp', v .. ':' .. ARGV[4],
  'published_us', ARGV[5])
return v
";

/// Record the config the leader runs (ARGV[3] its text, ARGV[4] `published` or `file`,
/// ARGV[5] its published version or '') if the lease is still `id:epoch`, for readers that
/// show it (the console's queue page). Returns 1, or 0 when fenced off.
const SHOW_CONFIG: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'source', ARGV[3], 'origin', ARGV[4], 'version', ARGV[5],
  'manager', ARGV[1])
return 1
";

/// Delete a host's report if the lease is still `id:epoch` and the report is still the
/// one read (a master that came back meanwhile wrote a new one). Returns 1 when deleted,
/// 0 when the report changed, -1 when fenced off.
const FORGET_HOST: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then return -1 end
if redis.call('HGET', KEYS[2], ARGV[3]) ~= ARGV[4] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[3])
return 1
";

/// Record a schedule's fire time if the lease is ours, the schedule is not paused (ARGV[7]
/// in KEYS[4]), still stored when it is a stored one (ARGV[8] = 1: ARGV[7] in KEYS[3]) and
/// the time is new; mark it pending (ARGV[5]) until its task is enqueued, and the last
/// fire (ARGV[6]). Returns 1 when this manager should enqueue it, 0 otherwise.
const FIRE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then return 0 end
if redis.call('SMISMEMBER', KEYS[4], ARGV[7])[1] == 1 then return 0 end
if ARGV[8] == '1' and redis.call('HEXISTS', KEYS[3], ARGV[7]) == 0 then return 0 end
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0')
if tonumber(ARGV[4]) <= last then return 0 end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4], ARGV[5], ARGV[4], ARGV[6], ARGV[4])
return 1
";

/// Move a schedule's last fire time to ARGV[4] without a fire (its fires skipped: paused,
/// its queue gone, or first seen), if the lease is ours, the time is new and a stored
/// schedule is still stored (as for FIRE). Returns 1 when moved.
const SKIP: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. ':' .. ARGV[2] then return 0 end
if ARGV[6] == '1' and redis.call('HEXISTS', KEYS[3], ARGV[5]) == 0 then return 0 end
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0')
if tonumber(ARGV[4]) <= last then return 0 end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
return 1
";

/// Forget a schedule's pending fire once its task is enqueued, if it is still that fire.
const FIRED: &str = r"
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
";

/// Let go of the lease if it is still ours (a clean stop hands over at once).
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] .. ':' .. ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The schedule a fire claim is for.
#[derive(Debug, Clone, Copy)]
pub struct FireClaim<'a> {
    /// Its field in the claim hash (`Schedule::claim_key`).
    pub field: &'a str,
    /// Its name: a paused name's fires are refused.
    pub name: &'a str,
    /// A stored schedule: its fires are refused once it is deleted.
    pub stored: bool,
}

/// This manager's claim on leadership.
#[derive(Debug, Clone)]
pub struct Leadership {
    keys: Keys,
    id: String,
    ttl: Duration,
    epoch: u64,
}

impl Leadership {
    /// A claim for the manager `id` (unique per process) with leases of `ttl`.
    pub fn new(keys: Keys, id: String, ttl: Duration) -> Self {
        Self {
            keys,
            id,
            ttl,
            epoch: 0,
        }
    }

    /// Leases from now on last `ttl` (a published config changed the tick).
    pub fn set_ttl(&mut self, ttl: Duration) {
        self.ttl = ttl;
    }

    /// The epoch of the lease held, 0 when not leading.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// An invocation of `script`, fenced: its keys the lease and `key`, its first two
    /// arguments this manager's id and epoch (the scripts compare the lease with them).
    fn fenced<'a>(&self, script: &'a Script, key: String) -> ScriptInvocation<'a> {
        let mut inv = script.key(self.keys.lease());
        inv.key(key).arg(&self.id).arg(self.epoch);
        inv
    }

    /// Acquires or renews the lease; true while leading.
    pub async fn renew(&mut self, conn: &mut RedisConn) -> Result<bool, QueueError> {
        let epoch: u64 = Script::new(ACQUIRE)
            .key(self.keys.lease())
            .key(self.keys.epoch())
            .arg(&self.id)
            .arg(self.ttl.as_millis() as u64)
            .invoke_async(conn)
            .await?;
        self.epoch = epoch;
        Ok(epoch > 0)
    }

    /// Writes `map` under the lease; its version is assigned here. None when fenced off
    /// (the lease moved on), which also means this manager is no longer leading.
    pub async fn write_map(
        &mut self,
        conn: &mut RedisConn,
        map: &SlotMap,
    ) -> Result<Option<u64>, QueueError> {
        let mut map = map.clone();
        map.epoch = self.epoch;
        map.version = 0;
        let json = serde_json::to_string(&map).map_err(|e| QueueError::Protocol(e.to_string()))?;
        let version: u64 = self
            .fenced(&Script::new(WRITE_MAP), self.keys.map())
            .arg(json)
            .invoke_async(conn)
            .await?;
        if version == 0 {
            self.epoch = 0;
            return Ok(None);
        }
        Ok(Some(version))
    }

    /// Writes the balancer's `decisions` and the hosts' `liveness` (JSON both) under the
    /// lease; false when fenced off, which also means this manager is no longer leading.
    pub async fn write_decisions(
        &mut self,
        conn: &mut RedisConn,
        decisions: &str,
        liveness: &str,
    ) -> Result<bool, QueueError> {
        let n: i64 = self
            .fenced(&Script::new(WRITE_DECISIONS), self.keys.decisions())
            .key(self.keys.liveness())
            .arg(decisions)
            .arg(liveness)
            .invoke_async(conn)
            .await?;
        if n == 0 {
            self.epoch = 0;
        }
        Ok(n == 1)
    }

    /// Raises this manager's epoch past `seen`, the highest epoch a master has seen: after
    /// Redis lost its data the epoch counter starts again from 1, and masters ignore every
    /// map below the highest epoch they saw. False when fenced off (no longer leading).
    pub async fn raise_epoch(
        &mut self,
        conn: &mut RedisConn,
        seen: u64,
    ) -> Result<bool, QueueError> {
        let epoch: u64 = self
            .fenced(&Script::new(RAISE_EPOCH), self.keys.epoch())
            .arg(seen)
            .invoke_async(conn)
            .await?;
        self.epoch = epoch;
        Ok(epoch > 0)
    }

    /// Publishes `source`, the config in force, again with its publish time `published_us`
    /// (Redis holds an older one); false when fenced off.
    pub async fn republish_config(
        &mut self,
        conn: &mut RedisConn,
        source: &str,
        published_us: u64,
    ) -> Result<bool, QueueError> {
        let version: u64 = self
            .fenced(&Script::new(REPUBLISH_CONFIG), self.keys.config())
            .arg(source)
            .arg(crate::cluster::sha256_hex(source))
            .arg(published_us)
            .invoke_async(conn)
            .await?;
        if version == 0 {
            self.epoch = 0;
        }
        Ok(version > 0)
    }

    /// Records `source`, the config this leader runs, from `origin` (`published`, with its
    /// `version`, or `file`); false when fenced off.
    pub async fn show_config(
        &mut self,
        conn: &mut RedisConn,
        source: &str,
        origin: &str,
        version: Option<u64>,
    ) -> Result<bool, QueueError> {
        let n: u64 = self
            .fenced(&Script::new(SHOW_CONFIG), self.keys.config_in_force())
            .arg(source)
            .arg(origin)
            .arg(version.map(|v| v.to_string()).unwrap_or_default())
            .invoke_async(conn)
            .await?;
        if n == 0 {
            self.epoch = 0;
        }
        Ok(n == 1)
    }

    /// Deletes `host`'s report if it is still `report` (its JSON as read); None when fenced
    /// off, else whether it was deleted.
    pub async fn forget_host(
        &mut self,
        conn: &mut RedisConn,
        host: &str,
        report: &str,
    ) -> Result<Option<bool>, QueueError> {
        let n: i64 = self
            .fenced(&Script::new(FORGET_HOST), self.keys.hosts())
            .arg(host)
            .arg(report)
            .invoke_async(conn)
            .await?;
        if n < 0 {
            self.epoch = 0;
            return Ok(None);
        }
        Ok(Some(n == 1))
    }

    /// Claims one fire of `schedule` at `fire_ms`; true when this manager must enqueue it
    /// (leading, the schedule not paused and, a stored one, not deleted, and no manager
    /// claimed this time before). The fire stays pending until [`Leadership::fired`] says
    /// its task was enqueued, so that a manager that dies or loses Redis in between leaves
    /// it to the next tick, not lost.
    pub async fn claim_fire(
        &mut self,
        conn: &mut RedisConn,
        schedule: &FireClaim<'_>,
        fire_ms: i64,
    ) -> Result<bool, QueueError> {
        let n: i64 = self
            .fenced(&Script::new(FIRE), self.keys.schedules())
            .key(self.keys.schedule_defs())
            .key(self.keys.schedules_paused())
            .arg(schedule.field)
            .arg(fire_ms)
            .arg(pending_field(schedule.field))
            .arg(format!("{}:fired", schedule.field))
            .arg(schedule.name)
            .arg(u8::from(schedule.stored))
            .invoke_async(conn)
            .await?;
        Ok(n == 1)
    }

    /// Moves `schedule`'s last fire time to `up_to_ms` without firing: the fires until
    /// then are skipped (paused, its queue gone) or before its first sight. True when
    /// moved (leading, and the time is new).
    pub async fn skip_fires(
        &mut self,
        conn: &mut RedisConn,
        schedule: &FireClaim<'_>,
        up_to_ms: i64,
    ) -> Result<bool, QueueError> {
        let n: i64 = self
            .fenced(&Script::new(SKIP), self.keys.schedules())
            .key(self.keys.schedule_defs())
            .arg(schedule.field)
            .arg(up_to_ms)
            .arg(schedule.name)
            .arg(u8::from(schedule.stored))
            .invoke_async(conn)
            .await?;
        Ok(n == 1)
    }

    /// Says that the task of the fire at `fire_ms` of the schedule whose claim field is
    /// `key` is enqueued (or refused for good): that fire is no longer pending.
    pub async fn fired(
        &self,
        conn: &mut RedisConn,
        key: &str,
        fire_ms: i64,
    ) -> Result<(), QueueError> {
        let _: i64 = Script::new(FIRED)
            .key(self.keys.schedules())
            .arg(pending_field(key))
            .arg(fire_ms)
            .invoke_async(conn)
            .await?;
        Ok(())
    }

    /// Gives the lease up if still held.
    pub async fn release(&mut self, conn: &mut RedisConn) -> Result<(), QueueError> {
        let _: i64 = Script::new(RELEASE)
            .key(self.keys.lease())
            .arg(&self.id)
            .arg(self.epoch)
            .invoke_async(conn)
            .await?;
        self.epoch = 0;
        Ok(())
    }
}

/// The field of the schedules hash holding schedule `key`'s pending fire.
fn pending_field(key: &str) -> String {
    format!("{key}:pending")
}
