//! What Redis holds of schedules, all under the `{cluster}` hash tag (one slot, so the
//! scripts below and the manager's fenced claims are single-slot on a Redis Cluster):
//! - `NS:{cluster}:schedules:def` (hash): name → JSON [`Def`], the schedules stored
//!   through the api; written and deleted only by the scripts here.
//! - `NS:{cluster}:schedules:owners` (hash): owner → how many stored schedules it has,
//!   kept by the same scripts, against the limit per key.
//! - `NS:{cluster}:schedules:paused` (set): names of paused schedules, the config's and
//!   stored ones alike (`gaffer schedules pause|resume`).
//! - `NS:{cluster}:sched` (hash): the leader's claims, by [`Schedule::claim_key`]: the
//!   last fire claimed, `:pending` a fire claimed and not yet enqueued, `:fired` the last
//!   fire claimed to be enqueued (what listings show as `last_fire_ms`).
//!
//! [`read`] takes all of it in one round trip: the manager's tick, a listing.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{Origin, Rule, Schedule, Source};
use crate::cluster::Keys;
use crate::config::Config;
use crate::queue_client::{QueueError, RedisConn};

/// Stored schedules per owner, at most: each is read at every tick of the leader.
pub const MAX_PER_OWNER: u64 = 1000;

/// A stored schedule as its JSON in the definitions hash.
#[derive(Debug, Serialize, Deserialize)]
pub struct Def {
    /// Its name, the hash's field too.
    pub name: String,
    /// The queue its tasks go to.
    pub queue: String,
    /// A cron expression, or…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// …a period (`"2s"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// Each task's payload.
    pub payload: Box<RawValue>,
    /// An IANA zone; none: `[manager].timezone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// After this moment (Unix ms) it fires no more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
    /// The key that made it, or `cli`/`admin`.
    pub owner: String,
    /// When it was made (Unix ms).
    pub created_ms: i64,
}

impl Def {
    /// The stored form of `s` (a stored schedule's).
    pub fn of(s: &Schedule) -> Result<Def, QueueError> {
        let Origin::Api { owner, created_ms } = &s.origin else {
            return Err(QueueError::Invalid(format!(
                "schedule {} is the config's: only the api's are stored",
                s.name
            )));
        };
        let (cron, every) = match &s.rule {
            Rule::Cron { source, .. } => (Some(source.clone()), None),
            Rule::Every(_) => (None, Some(s.rule.text())),
        };
        Ok(Def {
            name: s.name.clone(),
            queue: s.queue.clone(),
            cron,
            every,
            payload: RawValue::from_string(s.payload.clone()).map_err(protocol)?,
            timezone: s.timezone.map(|tz| tz.name().to_owned()),
            until_ms: s.until_ms,
            owner: owner.clone(),
            created_ms: *created_ms,
        })
    }

    /// The schedule it stores, or why it cannot be read (another release's, or edited by
    /// hand).
    pub fn schedule(self) -> Result<Schedule, String> {
        let rule = match (self.cron.as_deref(), self.every.as_deref()) {
            (Some(c), None) => Rule::cron(c)?,
            (None, Some(e)) => Rule::every(e)?,
            _ => return Err("it has neither or both of cron and every".into()),
        };
        let timezone = self
            .timezone
            .map(|tz| {
                tz.parse::<chrono_tz::Tz>()
                    .map_err(|_| format!("unknown time zone `{tz}`"))
            })
            .transpose()?;
        Ok(Schedule {
            name: self.name,
            queue: self.queue,
            rule,
            timezone,
            until_ms: self.until_ms,
            payload: self.payload.get().to_owned(),
            origin: Origin::Api {
                owner: self.owner,
                created_ms: self.created_ms,
            },
        })
    }
}

fn protocol(e: impl std::fmt::Display) -> QueueError {
    QueueError::Protocol(e.to_string())
}

/// A claim's three fields (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Claim {
    /// The last fire claimed (or skipped), ms.
    pub last: Option<i64>,
    /// A fire claimed and not yet enqueued, ms.
    pub pending: Option<i64>,
    /// The last fire claimed to be enqueued, ms.
    pub fired: Option<i64>,
}

/// Everything Redis holds of schedules, read at once.
#[derive(Debug, Default)]
pub struct Stored {
    /// The stored schedules, by name.
    pub schedules: Vec<Schedule>,
    /// Stored definitions that could not be read: name and why.
    pub unreadable: Vec<(String, String)>,
    /// The paused names.
    pub paused: BTreeSet<String>,
    /// The claim hash as it is.
    claims: HashMap<String, String>,
}

impl Stored {
    /// The claim of the schedule whose claim field is `key`.
    pub fn claim(&self, key: &str) -> Claim {
        let field = |f: &str| self.claims.get(f).and_then(|v| v.parse::<i64>().ok());
        Claim {
            last: field(key),
            pending: field(&format!("{key}:pending")),
            fired: field(&format!("{key}:fired")),
        }
    }

    /// The stored schedule named `name`.
    pub fn get(&self, name: &str) -> Option<&Schedule> {
        self.schedules.iter().find(|s| s.name == name)
    }

    /// Whether `s` is paused.
    pub fn is_paused(&self, s: &Schedule) -> bool {
        self.paused.contains(&s.name)
    }
}

/// Reads the stored schedules, the paused names and the claims in one round trip.
pub async fn read(conn: &mut RedisConn, keys: &Keys) -> Result<Stored, QueueError> {
    let (defs, paused, claims): (
        HashMap<String, String>,
        BTreeSet<String>,
        HashMap<String, String>,
    ) = redis::pipe()
        .hgetall(keys.schedule_defs())
        .smembers(keys.schedules_paused())
        .hgetall(keys.schedules())
        .query_async(conn)
        .await?;
    let mut stored = Stored {
        paused,
        claims,
        ..Stored::default()
    };
    for (name, json) in defs {
        let read = serde_json::from_str::<Def>(&json)
            .map_err(|e| e.to_string())
            .and_then(Def::schedule);
        match read {
            Ok(s) => stored.schedules.push(s),
            Err(why) => stored.unreadable.push((name, why)),
        }
    }
    stored.schedules.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(stored)
}

/// The stored schedule named `name`, if there is one that can be read.
pub async fn get(
    conn: &mut RedisConn,
    keys: &Keys,
    name: &str,
) -> Result<Option<Schedule>, QueueError> {
    let json: Option<String> = redis::cmd("HGET")
        .arg(keys.schedule_defs())
        .arg(name)
        .query_async(conn)
        .await?;
    let Some(json) = json else { return Ok(None) };
    let def: Def = serde_json::from_str(&json).map_err(protocol)?;
    def.schedule().map(Some).map_err(QueueError::Protocol)
}

/// Store a schedule (ARGV[2], JSON) under its name (ARGV[1]) unless the name is taken or
/// its owner (ARGV[3]) has ARGV[4] already; its name leaves the paused set and the claim
/// hash, where an earlier schedule of that name may have left it. Returns 1 when stored,
/// -1 when the name is taken, -2 at the owner's limit.
const CREATE: &str = r"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return -1 end
local n = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0')
if n >= tonumber(ARGV[4]) then return -2 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
local claim = 'name:' .. ARGV[1]
redis.call('HDEL', KEYS[3], claim, claim .. ':pending', claim .. ':fired')
redis.call('SREM', KEYS[4], ARGV[1])
return 1
";

/// Delete the stored schedule ARGV[1], if ARGV[2] is empty or its owner, with its claims
/// and its paused mark. Returns 1 when deleted, 0 when there is no such schedule (of
/// that owner).
const DELETE: &str = r"
local def = redis.call('HGET', KEYS[1], ARGV[1])
if not def then return 0 end
local owner = cjson.decode(def)['owner']
if ARGV[2] ~= '' and owner ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HINCRBY', KEYS[2], owner, -1) <= 0 then redis.call('HDEL', KEYS[2], owner) end
local claim = 'name:' .. ARGV[1]
redis.call('HDEL', KEYS[3], claim, claim .. ':pending', claim .. ':fired')
redis.call('SREM', KEYS[4], ARGV[1])
return 1
";

/// What [`create`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// Stored.
    Stored,
    /// A stored schedule has the name already.
    Taken,
    /// Its owner has [`MAX_PER_OWNER`] stored schedules already.
    AtLimit,
}

/// Stores `s` (a stored schedule's), in one step that refuses a name taken and an owner
/// at `max_per_owner`.
pub async fn create(
    conn: &mut RedisConn,
    keys: &Keys,
    s: &Schedule,
    max_per_owner: u64,
) -> Result<Created, QueueError> {
    let def = Def::of(s)?;
    let json = serde_json::to_string(&def).map_err(protocol)?;
    let n: i64 = redis::Script::new(CREATE)
        .key(keys.schedule_defs())
        .key(keys.schedule_owners())
        .key(keys.schedules())
        .key(keys.schedules_paused())
        .arg(&s.name)
        .arg(json)
        .arg(&def.owner)
        .arg(max_per_owner)
        .invoke_async(conn)
        .await?;
    Ok(match n {
        1 => Created::Stored,
        -1 => Created::Taken,
        _ => Created::AtLimit,
    })
}

/// Deletes the stored schedule `name` (only if `owner` made it, when given), its claims
/// and its paused mark: it fires no more. Whether there was one to delete.
pub async fn delete(
    conn: &mut RedisConn,
    keys: &Keys,
    name: &str,
    owner: Option<&str>,
) -> Result<bool, QueueError> {
    let n: i64 = redis::Script::new(DELETE)
        .key(keys.schedule_defs())
        .key(keys.schedule_owners())
        .key(keys.schedules())
        .key(keys.schedules_paused())
        .arg(name)
        .arg(owner.unwrap_or_default())
        .invoke_async(conn)
        .await?;
    Ok(n == 1)
}

/// Pauses (`true`) or resumes the schedule `name`. Whether anything changed.
pub async fn set_paused(
    conn: &mut RedisConn,
    keys: &Keys,
    name: &str,
    paused: bool,
) -> Result<bool, QueueError> {
    let mut cmd = redis::cmd(if paused { "SADD" } else { "SREM" });
    let changed: i64 = cmd
        .arg(keys.schedules_paused())
        .arg(name)
        .query_async(conn)
        .await?;
    Ok(changed > 0)
}

/// A schedule's state, as listings show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// It fires.
    Active,
    /// Paused at run time: its fires are skipped until it is resumed.
    Paused,
    /// Its `until` has passed: it fires no more.
    Ended,
    /// A stored schedule whose name the config now defines: the config's fires, this one
    /// does not until one of them goes.
    Shadowed,
}

impl State {
    /// Its name, as listings write it.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Active => "active",
            State::Paused => "paused",
            State::Ended => "ended",
            State::Shadowed => "shadowed",
        }
    }
}

/// One schedule as `gaffer schedules --json` and `GET /v1/schedules` show it: the fields
/// of `POST /v1/schedules` (the rule as `cron` or `every`), then what it is and when it
/// fires.
#[derive(Debug, Serialize)]
pub struct View {
    /// Its name.
    pub name: String,
    /// Its queue.
    pub queue: String,
    /// The cron expression, for a cron rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The period, for an `every` rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// The zone it is read in (its own, or `[manager].timezone`).
    pub timezone: String,
    /// When it ends, RFC 3339; `null`: never.
    pub until: Option<String>,
    /// Each task's payload.
    pub payload: Box<RawValue>,
    /// The key that made it, `cli`, `admin`, or `config`.
    pub owner: String,
    /// `config` or `api`.
    pub source: Source,
    /// Active, paused, ended, or shadowed.
    pub state: State,
    /// When it was stored, ms; `null` for the config's.
    pub created_ms: Option<i64>,
    /// The last fire claimed to be enqueued, ms (`null`: none since this release).
    pub last_fire_ms: Option<i64>,
    /// Its next fire, ms; `null` when paused, ended or shadowed.
    pub next_fire_ms: Option<i64>,
}

/// The listing: the config's schedules in file order, then the stored ones by name.
pub fn views(config: &Config, stored: &Stored, now_ms: i64) -> Vec<View> {
    let configured: BTreeSet<&str> = config.schedules.iter().map(|s| s.name.as_str()).collect();
    config
        .schedules
        .iter()
        .map(|s| view(config, stored, s, false, now_ms))
        .chain(stored.schedules.iter().map(|s| {
            let shadowed = configured.contains(s.name.as_str());
            view(config, stored, s, shadowed, now_ms)
        }))
        .collect()
}

/// `s` as listed.
pub fn view(config: &Config, stored: &Stored, s: &Schedule, shadowed: bool, now_ms: i64) -> View {
    let default_tz = config.manager.timezone;
    let claim = stored.claim(&s.claim_key());
    let state = if shadowed {
        State::Shadowed
    } else if s.ended_at(now_ms) {
        State::Ended
    } else if stored.is_paused(s) {
        State::Paused
    } else {
        State::Active
    };
    // (the next moment after the last claimed, or after now when it is not behind: a
    // leader catches up on what it missed)
    let after = claim
        .last
        .or(s.start_ms())
        .map_or(now_ms, |l| l.max(now_ms - CATCH_UP_MS));
    let next_fire_ms = match state {
        State::Active => s.next_after(after, default_tz),
        _ => None,
    };
    let payload = RawValue::from_string(s.payload.clone())
        .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null is JSON"));
    View {
        name: s.name.clone(),
        queue: s.queue.clone(),
        cron: matches!(s.rule, Rule::Cron { .. }).then(|| s.rule.text()),
        every: matches!(s.rule, Rule::Every(_)).then(|| s.rule.text()),
        timezone: s.zone(default_tz).name().to_owned(),
        until: s.until_ms.map(rfc3339),
        payload,
        owner: s.owner().to_owned(),
        source: s.source(),
        state,
        created_ms: s.created_ms(),
        last_fire_ms: claim.fired,
        next_fire_ms,
    }
}

/// How far back a leader catches up on fires it missed (a cluster that was down does not
/// flood its queues): a day.
pub const CATCH_UP_MS: i64 = 86_400_000;

/// `ms` as an RFC 3339 time in UTC, to the millisecond when it has any.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}
