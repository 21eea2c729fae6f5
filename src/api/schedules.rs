//! The schedule endpoints: `POST /v1/schedules` stores a recurring task, `GET
//! /v1/schedules` lists, `GET|DELETE /v1/schedules/{name}` shows or deletes one. The
//! schedules live in Redis (`schedule::store`) and the leading manager fires them.
//!
//! The key rules are the tasks': a limited key stores schedules only on its queues, and
//! sees and deletes only its own (any other, the config's too, answers 404 as if it did
//! not exist). Names are one namespace across the config and every key; a limited key is
//! told a name is taken, not by whom.

use hyper::StatusCode;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::error::ApiError;
use super::routes::{Answer, Api, MAX_BODY_DEPTH};
use super::submit::{checked_payload, without_position};
use crate::cluster;
use crate::config::{ApiKey, MAX_JSON_DEPTH};
use crate::queue_client::{NewTask, json_deeper_than};
use crate::schedule::store::{self, Created, MAX_PER_OWNER, Stored};
use crate::schedule::{Origin, Rule, Schedule};

/// The body of `POST /v1/schedules`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchedule<'a> {
    name: String,
    queue: String,
    cron: Option<String>,
    every: Option<String>,
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
    timezone: Option<String>,
    until: Option<String>,
}

impl Api {
    fn cluster_keys(&self) -> cluster::Keys {
        cluster::Keys::new(&self.config.cluster.namespace)
    }

    /// `POST /v1/schedules`: checks the body whole, then stores it in one step that
    /// refuses a taken name and a key at its limit. 201 with the schedule as listed.
    pub(super) async fn create_schedule(&self, key: &ApiKey, body: &[u8]) -> Answer {
        if json_deeper_than(body, MAX_BODY_DEPTH) {
            return Err(ApiError::bad_request(format!(
                "body nested deeper than {MAX_BODY_DEPTH} levels (a payload may nest {MAX_JSON_DEPTH})"
            )));
        }
        let raw: RawSchedule = serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("bad schedule: {}", without_position(&e)))
        })?;
        let queue = self.queue(&raw.queue, key)?;
        let now_ms = cluster::now_ms() as i64;
        let s = schedule_of(raw, key, now_ms)?;
        // (the payload's size, and the id its fires take, as the queue will check them)
        let probe = NewTask::new(s.payload.clone().into_bytes()).id(s.task_id(now_ms));
        queue.check(&probe)?;
        if self.config.schedules.iter().any(|c| c.name == s.name) {
            return Err(ApiError::conflict(format!(
                "schedule {} is defined in the config: choose another name",
                s.name
            ))
            .or_for_limited(taken(&s.name)));
        }
        let mut conn = self.client.connection();
        let keys = self.cluster_keys();
        match store::create(&mut conn, &keys, &s, MAX_PER_OWNER).await? {
            Created::Stored => {}
            Created::Taken => {
                let owner = store::get(&mut conn, &keys, &s.name).await.ok().flatten();
                let by = owner.map_or_else(String::new, |o| format!(", made by {}", o.owner()));
                return Err(ApiError::conflict(format!(
                    "schedule {} exists{by}: choose another name",
                    s.name
                ))
                .or_for_limited(taken(&s.name)));
            }
            Created::AtLimit => {
                return Err(ApiError::conflict(format!(
                    "key {} already has {MAX_PER_OWNER} stored schedules, the limit per key: delete one first",
                    key.name
                )));
            }
        }
        tracing::info!(schedule = %s.name, queue = %s.queue, rule = %s.rule.text(),
            key = %key.name, "schedule stored");
        let view = store::view(&self.config, &Stored::default(), &s, false, now_ms);
        Ok((StatusCode::CREATED, json!(view)))
    }

    /// `GET /v1/schedules`: an admin key every schedule, the config's first; any other
    /// key its own.
    pub(super) async fn list_schedules(&self, key: &ApiKey) -> Answer {
        let stored = store::read(&mut self.client.connection(), &self.cluster_keys()).await?;
        let now_ms = cluster::now_ms() as i64;
        let views: Vec<store::View> = if key.admin {
            store::views(&self.config, &stored, now_ms)
        } else {
            stored
                .schedules
                .iter()
                .filter(|s| s.owner() == key.name)
                .map(|s| store::view(&self.config, &stored, s, self.shadowed(s), now_ms))
                .collect()
        };
        Ok((StatusCode::OK, json!({ "schedules": views })))
    }

    /// `GET /v1/schedules/{name}`: the schedule, if the key may see it (an admin key the
    /// config's one first, where both have the name).
    pub(super) async fn get_schedule(&self, key: &ApiKey, name: &str) -> Answer {
        let stored = store::read(&mut self.client.connection(), &self.cluster_keys()).await?;
        let config = self.config.schedules.iter().find(|s| s.name == name);
        let own = stored
            .get(name)
            .filter(|s| key.admin || s.owner() == key.name);
        let (s, shadowed) = match (config.filter(|_| key.admin), own) {
            (Some(c), _) => (c, false),
            (None, Some(s)) => (s, self.shadowed(s)),
            (None, None) => return Err(no_schedule(name)),
        };
        let now_ms = cluster::now_ms() as i64;
        let view = store::view(&self.config, &stored, s, shadowed, now_ms);
        Ok((StatusCode::OK, json!(view)))
    }

    /// `DELETE /v1/schedules/{name}`: deletes a stored schedule (a limited key's own
    /// only) with its claims and its pause: it fires no more. 204.
    pub(super) async fn delete_schedule(&self, key: &ApiKey, name: &str) -> Answer {
        let owner = (!key.admin).then_some(key.name.as_str());
        let mut conn = self.client.connection();
        if store::delete(&mut conn, &self.cluster_keys(), name, owner).await? {
            tracing::info!(schedule = %name, key = %key.name, "schedule deleted");
            return Ok((StatusCode::NO_CONTENT, serde_json::Value::Null));
        }
        if key.admin && self.config.schedules.iter().any(|s| s.name == name) {
            return Err(ApiError::conflict(format!(
                "schedule {name} is defined in the config: remove its [[schedules]] entry and apply the config"
            )));
        }
        Err(no_schedule(name))
    }

    /// Whether the task `id`, fired by a schedule named `name`, is a fire of `key`'s
    /// stored schedule of that name: not of an earlier schedule of the name, which
    /// another key may have made (its fires all came before this one was created).
    pub(super) async fn fired_for(
        &self,
        key: &ApiKey,
        name: &str,
        id: &str,
    ) -> Result<bool, ApiError> {
        let fire_ms = id
            .strip_prefix(crate::schedule::SUBMITTER_PREFIX)
            .and_then(|rest| rest.strip_prefix(name))
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|ms| ms.parse::<i64>().ok());
        let Some(fire_ms) = fire_ms else {
            return Ok(false);
        };
        let mut conn = self.client.connection();
        let s = match store::get(&mut conn, &self.cluster_keys(), name).await {
            Ok(s) => s,
            // (a definition that cannot be read names no owner)
            Err(crate::queue_client::QueueError::Protocol(_)) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(s.is_some_and(|s| {
            s.owner() == key.name && s.created_ms().is_some_and(|created| fire_ms > created)
        }))
    }

    /// Whether the config has a schedule of `s`'s name (which then fires instead).
    fn shadowed(&self, s: &Schedule) -> bool {
        self.config.schedules.iter().any(|c| c.name == s.name)
    }
}

/// The schedule a `POST /v1/schedules` body asks for, `key`'s, made at `now_ms`.
fn schedule_of(raw: RawSchedule, key: &ApiKey, now_ms: i64) -> Result<Schedule, ApiError> {
    if !crate::config::is_valid_name(&raw.name) {
        return Err(ApiError::bad_request(format!(
            "schedule name {:?} is invalid: use 1 to 128 letters, digits, '_', '-' or '.'",
            raw.name
        )));
    }
    let rule = match (raw.cron.as_deref(), raw.every.as_deref()) {
        (None, None) => {
            return Err(ApiError::bad_request(
                "missing field `cron` or `every`: a cron expression like \"0 3 * * *\", or a period like \"30s\"",
            ));
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("give cron or every, not both"));
        }
        (Some(c), None) => Rule::cron(c),
        (None, Some(e)) => Rule::every(e),
    }
    .map_err(ApiError::bad_request)?;
    let timezone = raw
        .timezone
        .map(|tz| {
            tz.parse::<chrono_tz::Tz>().map_err(|_| {
                ApiError::bad_request(format!(
                    "unknown time zone {tz:?}: expected an IANA name like \"Europe/Moscow\" or \"UTC\""
                ))
            })
        })
        .transpose()?;
    let until_ms = raw.until.map(|u| until(&u, now_ms)).transpose()?;
    let payload = checked_payload(raw.payload)?;
    let payload = String::from_utf8(payload)
        .map_err(|_| ApiError::bad_request("bad payload: not UTF-8 text"))?;
    Ok(Schedule {
        name: raw.name,
        queue: raw.queue,
        rule,
        timezone,
        until_ms,
        payload,
        origin: Origin::Api {
            owner: key.name.clone(),
            created_ms: now_ms,
        },
    })
}

/// `until`: an RFC 3339 time after `now_ms`, as Unix ms.
fn until(text: &str, now_ms: i64) -> Result<i64, ApiError> {
    let ms = chrono::DateTime::parse_from_rfc3339(text)
        .map_err(|e| {
            ApiError::bad_request(format!(
                "bad until {text:?}: {e}; write an RFC 3339 time like \"2026-11-23T18:00:00Z\""
            ))
        })?
        .timestamp_millis();
    if ms <= now_ms {
        return Err(ApiError::bad_request(format!(
            "until {text:?} is in the past: the schedule would never fire"
        )));
    }
    Ok(ms)
}

fn taken(name: &str) -> String {
    format!("schedule name {name} is taken: choose another")
}

fn no_schedule(name: &str) -> ApiError {
    ApiError::not_found(format!("no schedule {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyQueues;

    fn key() -> ApiKey {
        ApiKey {
            name: "shop".into(),
            token_sha256: [0; 32],
            queues: KeyQueues::All,
            admin: false,
        }
    }

    fn err(body: &str) -> String {
        let raw: RawSchedule = match serde_json::from_str(body) {
            Ok(r) => r,
            Err(e) => return format!("bad schedule: {}", without_position(&e)),
        };
        schedule_of(raw, &key(), 1_000_000).unwrap_err().message
    }

    #[test]
    fn a_body_is_checked_whole_with_messages_naming_the_limit() {
        let ok = r#"{"name": "n", "queue": "q", "every": "2s", "payload": {"b": 1, "a": 2}}"#;
        let s = schedule_of(serde_json::from_str(ok).unwrap(), &key(), 5).unwrap();
        assert_eq!(
            s.payload, r#"{"b":1,"a":2}"#,
            "compact, in the caller's order"
        );
        assert_eq!(
            s.origin,
            Origin::Api {
                owner: "shop".into(),
                created_ms: 5
            }
        );
        assert_eq!(
            err(r#"{"name": "n", "queue": "q", "every": "1s", "payload": 1, "colour": 2}"#),
            "bad schedule: unknown field `colour`, expected one of `name`, `queue`, `cron`, `every`, `payload`, `timezone`, `until`"
        );
        assert_eq!(
            err(r#"{"name": "a b", "queue": "q", "every": "1s", "payload": 1}"#),
            "schedule name \"a b\" is invalid: use 1 to 128 letters, digits, '_', '-' or '.'"
        );
        assert_eq!(
            err(r#"{"name": "n", "queue": "q", "every": "1s", "cron": "* * * * *", "payload": 1}"#),
            "give cron or every, not both"
        );
        assert_eq!(
            err(r#"{"name": "n", "queue": "q", "every": "100ms", "payload": 1}"#),
            "every 100ms is shorter than the limit of 1s"
        );
        assert_eq!(
            err(r#"{"name": "n", "queue": "q", "every": "1s", "payload": 1, "timezone": "Mars"}"#),
            "unknown time zone \"Mars\": expected an IANA name like \"Europe/Moscow\" or \"UTC\""
        );
        assert_eq!(
            err(
                r#"{"name": "n", "queue": "q", "every": "1s", "payload": 1, "until": "1970-01-01T00:00:00Z"}"#
            ),
            "until \"1970-01-01T00:00:00Z\" is in the past: the schedule would never fire"
        );
        assert_eq!(
            err(r#"{"name": "n", "queue": "q", "cron": "61 * * * *", "payload": 1}"#),
            "invalid cron `61 * * * *`: number out of bounds"
        );
        assert_eq!(
            err(r#"{"name": "n", "queue": "q", "every": "1s"}"#),
            "missing field `payload`"
        );
    }
}
