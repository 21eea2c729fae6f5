//! The submit request: `{"payload", "id"?, "priority"?, "delay"? | "at"?, "max_attempts"?,
//! "wait"?, "chain"?}` or `{"tasks": [ … ]}`, checked whole before anything is enqueued.

use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::error::ApiError;
use crate::config::MAX_JSON_DEPTH;
use crate::queue_client::{MAX_BATCH, NewTask, TaskChain, json_deeper_than};

/// One task as submitted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask {
    payload: Option<serde_json::Value>,
    id: Option<String>,
    priority: Option<i32>,
    delay: Option<String>,
    at: Option<String>,
    max_attempts: Option<u32>,
    wait: Option<String>,
    chain: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBulk {
    tasks: Vec<serde_json::Value>,
}

/// A checked submit.
#[derive(Debug)]
pub enum Submit {
    /// One task, with how long the request may wait for its end.
    One {
        /// The task to enqueue.
        task: NewTask,
        /// `"wait"`: hold the request until the task ends, at most this long.
        wait: Option<Duration>,
    },
    /// `{"tasks": [...]}`: checked together, all or nothing, then enqueued in parts (see
    /// docs/API.md: a refusal only Redis gives, between parts, leaves the parts before it).
    Bulk(Vec<NewTask>),
}

impl Submit {
    /// Its tasks: the one, or the bulk's in order.
    pub fn tasks_mut(&mut self) -> &mut [NewTask] {
        match self {
            Submit::One { task, .. } => std::slice::from_mut(task),
            Submit::Bulk(tasks) => tasks,
        }
    }
}

/// Parses and checks a submit body. `by` becomes every task's `submitted_by`;
/// `max_wait` bounds `"wait"`.
pub fn parse(body: &[u8], by: &str, max_wait: Duration) -> Result<Submit, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("body is not valid JSON: {e}")))?;
    let is_bulk = value.as_object().is_some_and(|o| o.contains_key("tasks"));
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "body must be a JSON object: {\"payload\": …} or {\"tasks\": […]}",
        ));
    }
    if is_bulk {
        let bulk: RawBulk = serde_json::from_value(value)
            .map_err(|e| ApiError::bad_request(format!("bad bulk submit: {e}")))?;
        if bulk.tasks.is_empty() {
            return Err(ApiError::bad_request("tasks must hold at least one task"));
        }
        if bulk.tasks.len() > MAX_BATCH {
            return Err(ApiError::too_large(format!(
                "bulk of {} tasks exceeds the limit of {MAX_BATCH} tasks per request",
                bulk.tasks.len()
            )));
        }
        let tasks = bulk
            .tasks
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let (task, wait) = task(v, by, max_wait).map_err(|e| ApiError {
                    message: format!("tasks[{i}]: {}", e.message),
                    ..e
                })?;
                if wait.is_some() {
                    return Err(ApiError::bad_request(format!(
                        "tasks[{i}]: wait is for a single submit, not a bulk one"
                    )));
                }
                Ok(task)
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Submit::Bulk(tasks));
    }
    let (task, wait) = task(value, by, max_wait)?;
    Ok(Submit::One { task, wait })
}

fn task(
    value: serde_json::Value,
    by: &str,
    max_wait: Duration,
) -> Result<(NewTask, Option<Duration>), ApiError> {
    let raw: RawTask = serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("bad task: {e}")))?;
    let payload = raw
        .payload
        .ok_or_else(|| ApiError::bad_request("missing field `payload`"))?;
    let payload = payload.to_string();
    // (the body's own depth is checked before parsing, with room for its envelope: a
    // payload alone may nest no deeper than a slot accepts, or the task would fail there)
    if json_deeper_than(payload.as_bytes(), MAX_JSON_DEPTH) {
        return Err(ApiError::bad_request(format!(
            "payload nested deeper than {MAX_JSON_DEPTH} levels"
        )));
    }
    let mut task = NewTask::new(payload).submitted_by(by);
    if raw.chain == Some(true) {
        task.chain = Some(TaskChain::Global);
    }
    task.id = raw.id;
    task.priority = raw.priority.unwrap_or(0);
    task.max_attempts = raw.max_attempts;
    match (raw.delay, raw.at) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give delay or at, not both: delay counts from now, at is a moment",
            ));
        }
        (Some(d), None) => task.delay = duration("delay", &d)?,
        (None, Some(at)) => task.at = Some(moment(&at)?),
        (None, None) => {}
    }
    let wait = raw.wait.map(|w| duration("wait", &w)).transpose()?;
    if let Some(w) = wait
        && w > max_wait
    {
        return Err(ApiError::bad_request(format!(
            "wait {} exceeds the limit of {} ([api].max_wait)",
            humantime::format_duration(w),
            humantime::format_duration(max_wait)
        )));
    }
    Ok((task, wait))
}

fn duration(field: &str, text: &str) -> Result<Duration, ApiError> {
    humantime::parse_duration(text).map_err(|e| {
        ApiError::bad_request(format!(
            "bad {field} {text:?}: {e}; write a duration like \"30s\" or \"5m\""
        ))
    })
}

fn moment(text: &str) -> Result<SystemTime, ApiError> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(SystemTime::from)
        .map_err(|e| {
            ApiError::bad_request(format!(
                "bad at {text:?}: {e}; write an RFC 3339 time like \"2026-11-23T18:00:00Z\""
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        parse(body.as_bytes(), "k", Duration::from_secs(60))
            .unwrap_err()
            .message
    }

    #[test]
    fn a_single_submit_with_every_option() {
        let body = r#"{"payload": {"a": 1}, "id": "x", "priority": 3, "delay": "5m", "max_attempts": 2, "wait": "30s"}"#;
        let Submit::One { task, wait } =
            parse(body.as_bytes(), "shop", Duration::from_secs(60)).unwrap()
        else {
            panic!("one task")
        };
        assert_eq!(task.payload, br#"{"a":1}"#);
        assert_eq!(task.id.as_deref(), Some("x"));
        assert_eq!((task.priority, task.max_attempts), (3, Some(2)));
        assert_eq!(task.delay, Duration::from_secs(300));
        assert_eq!(task.submitted_by.as_deref(), Some("shop"));
        assert_eq!(wait, Some(Duration::from_secs(30)));
    }

    #[test]
    fn refusals_name_what_and_the_limit() {
        assert!(err("{").starts_with("body is not valid JSON"));
        assert!(err("[1]").starts_with("body must be a JSON object"));
        assert_eq!(err("{}"), "missing field `payload`");
        assert!(err(r#"{"payload": 1, "colour": "red"}"#).contains("unknown field `colour`"));
        assert!(
            err(r#"{"payload": 1, "delay": "5 parsecs"}"#).starts_with("bad delay \"5 parsecs\"")
        );
        assert!(
            err(r#"{"payload": 1, "delay": "5s", "at": "2026-01-01T00:00:00Z"}"#)
                .starts_with("give delay or at")
        );
        assert!(err(r#"{"payload": 1, "at": "tomorrow"}"#).starts_with("bad at \"tomorrow\""));
        assert_eq!(
            err(r#"{"payload": 1, "wait": "2m"}"#),
            "wait 2m exceeds the limit of 1m ([api].max_wait)"
        );
        assert_eq!(err(r#"{"tasks": []}"#), "tasks must hold at least one task");
        let nested = |n| format!(r#"{{"payload": {}{}}}"#, "[".repeat(n), "]".repeat(n));
        assert_eq!(err(&nested(65)), "payload nested deeper than 64 levels");
        assert!(parse(nested(64).as_bytes(), "k", Duration::from_secs(60)).is_ok());
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert_eq!(
            err(&format!(r#"{{"tasks": [{{"payload": {deep}}}]}}"#)),
            "tasks[0]: payload nested deeper than 64 levels"
        );
        assert_eq!(
            err(r#"{"tasks": [{"payload": 1}, {"payload": 2, "wait": "1s"}]}"#),
            "tasks[1]: wait is for a single submit, not a bulk one"
        );
        assert_eq!(
            err(r#"{"tasks": [{"payload": 1}, {"id": "x"}]}"#),
            "tasks[1]: missing field `payload`"
        );
    }

    #[test]
    fn a_bulk_submit_keeps_its_order() {
        let body = r#"{"tasks": [{"payload": "a"}, {"payload": "b", "priority": 1}]}"#;
        let Submit::Bulk(tasks) = parse(body.as_bytes(), "k", Duration::from_secs(1)).unwrap()
        else {
            panic!("bulk")
        };
        assert_eq!(tasks.len(), 2);
        assert_eq!(tasks[0].payload, br#""a""#);
        assert_eq!(tasks[1].priority, 1);
    }
}
