//! The submit request: `{"payload", "id"?, "priority"?, "delay"? | "at"?, "max_attempts"?,
//! "timeout"?, "wait"?, "chain"?}` or `{"tasks": [ … ]}`, checked whole before anything is
//! enqueued.

use std::time::{Duration, SystemTime};

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::error::ApiError;
use crate::config::{MAX_JSON_DEPTH, QueueConfig};
use crate::queue_client::{MAX_BATCH, NewTask, TaskChain, json_bytes, json_deeper_than};

/// One task as submitted. Its payload stays the body's own text until it is checked and
/// compacted: a JSON tree built from it takes many times its size (a body of empty
/// arrays, about twelve), and memory per request must stay near `[api].max_body`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTask<'a> {
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
    id: Option<String>,
    priority: Option<i32>,
    delay: Option<String>,
    at: Option<String>,
    max_attempts: Option<u32>,
    timeout: Option<String>,
    wait: Option<String>,
    chain: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBulk<'a> {
    #[serde(borrow)]
    tasks: Vec<&'a RawValue>,
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
    // (checked as JSON without building it; the keys of the top level alone say which
    // form the body has)
    let whole: &RawValue = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("body is not valid JSON: {e}")))?;
    if !whole.get().trim_start().starts_with('{') {
        return Err(ApiError::bad_request(
            "body must be a JSON object: {\"payload\": …} or {\"tasks\": […]}",
        ));
    }
    let top: HashMap<String, &RawValue> = serde_json::from_str(whole.get())
        .map_err(|e| ApiError::bad_request(format!("body is not valid JSON: {e}")))?;
    if !top.contains_key("tasks") {
        let (task, wait) = task(whole, by, max_wait)?;
        return Ok(Submit::One { task, wait });
    }
    let bulk: RawBulk = serde_json::from_str(whole.get())
        .map_err(|e| ApiError::bad_request(format!("bad bulk submit: {}", without_position(&e))))?;
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
    Ok(Submit::Bulk(tasks))
}

fn task(
    value: &RawValue,
    by: &str,
    max_wait: Duration,
) -> Result<(NewTask, Option<Duration>), ApiError> {
    if !value.get().trim_start().starts_with('{') {
        return Err(ApiError::bad_request(
            "bad task: a task must be a JSON object",
        ));
    }
    let raw: RawTask = serde_json::from_str(value.get())
        .map_err(|e| ApiError::bad_request(format!("bad task: {}", without_position(&e))))?;
    let payload = checked_payload(raw.payload)?;
    let mut task = NewTask::new(payload).submitted_by(by);
    if raw.chain == Some(true) {
        task.chain = Some(TaskChain::Global);
    }
    task.id = raw.id;
    task.priority = raw.priority.unwrap_or(0);
    task.max_attempts = raw.max_attempts;
    if let Some(t) = raw.timeout {
        let limit = duration("timeout", &t)?;
        if limit.is_zero() {
            return Err(ApiError::bad_request("timeout must be greater than zero"));
        }
        task.timeout = Some(limit);
    }
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

/// Refuses the submit when a task's `timeout` is one its queue (`queue`, from the config)
/// cannot honour ([`QueueConfig::task_timeout_refusal`]); a bulk's names the task.
pub fn check_timeouts(tasks: &[NewTask], queue: &QueueConfig) -> Result<(), ApiError> {
    for (i, t) in tasks.iter().enumerate() {
        let Some(why) = t.timeout.and_then(|own| queue.task_timeout_refusal(own)) else {
            continue;
        };
        let at = if tasks.len() > 1 {
            format!("tasks[{i}]: ")
        } else {
            String::new()
        };
        return Err(ApiError::bad_request(format!("{at}{why}")));
    }
    Ok(())
}

/// A task's payload (`None`: missing), checked as a slot will read it and compacted.
pub(super) fn checked_payload(payload: Option<&RawValue>) -> Result<Vec<u8>, ApiError> {
    let payload = payload.ok_or_else(|| ApiError::bad_request("missing field `payload`"))?;
    // (a raw value is only skimmed: a lone surrogate or a number out of range passes it,
    // and would fail the task at every attempt in a strict parser)
    serde_json::from_str::<Checked>(payload.get())
        .map_err(|e| ApiError::bad_request(format!("bad payload: {}", without_position(&e))))?;
    let payload = compact_json(payload.get());
    // (the body's own depth is checked before parsing, with room for its envelope: a
    // payload alone may nest no deeper than a slot accepts, or the task would fail there)
    if json_deeper_than(&payload, MAX_JSON_DEPTH) {
        return Err(ApiError::bad_request(format!(
            "payload nested deeper than {MAX_JSON_DEPTH} levels"
        )));
    }
    Ok(payload)
}

/// What a field was wrong with, without serde's position in the text: the text parsed is
/// a task's, not the body's, so its lines and columns would mislead.
pub(super) fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) if e.line() > 0 => text[..i].to_string(),
        _ => text,
    }
}

/// JSON read to the end of every string and number, so what a parser that builds values
/// would refuse (a lone surrogate escape, a number out of range) is refused here too,
/// without building anything.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// Valid JSON text without the white space between its tokens: what a payload is stored
/// as, as it was when payloads were parsed into a tree and written out again (but with
/// its keys in the submitter's order).
fn compact_json(text: &str) -> Vec<u8> {
    json_bytes(text.as_bytes())
        .filter(|&(b, outside)| !(outside && b.is_ascii_whitespace()))
        .map(|(b, _)| b)
        .collect()
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

    /// Bytes the current thread holds allocated, and the most it held since the last
    /// [`reset_peak`]: a submit is parsed on one thread, so this measures what parsing a
    /// body takes whatever other tests do meanwhile.
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        pub struct Counting;

        thread_local! {
            static LIVE: Cell<isize> = const { Cell::new(0) };
            static PEAK: Cell<isize> = const { Cell::new(0) };
        }

        fn track(delta: isize) {
            let _ = LIVE.try_with(|live| {
                live.set(live.get() + delta);
                let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
            });
        }

        // SAFETY: every call goes to the system allocator unchanged; the counting beside
        // it touches only const-initialised thread locals, which never allocate.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                let p = unsafe { System.alloc(layout) };
                if !p.is_null() {
                    track(layout.size() as isize);
                }
                p
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                unsafe { System.dealloc(ptr, layout) };
                track(-(layout.size() as isize));
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
                let p = unsafe { System.realloc(ptr, layout, new) };
                if !p.is_null() {
                    track(new as isize - layout.size() as isize);
                }
                p
            }
        }

        /// Starts a measurement; returns the bytes held now.
        pub fn reset_peak() -> isize {
            let live = LIVE.with(Cell::get);
            PEAK.with(|p| p.set(live));
            live
        }

        /// The most held since [`reset_peak`].
        pub fn peak() -> isize {
            PEAK.with(Cell::get)
        }
    }

    #[global_allocator]
    static ALLOCATOR: counting::Counting = counting::Counting;

    /// What parsing `body` took at its peak, beyond what was held before, per byte of body.
    fn memory_per_body_byte(body: &[u8]) -> f64 {
        let before = counting::reset_peak();
        let parsed = parse(body, "k", Duration::from_secs(60));
        let peak = counting::peak() - before;
        assert!(parsed.is_ok(), "{:?}", parsed.err());
        drop(parsed);
        peak as f64 / body.len() as f64
    }

    #[test]
    fn a_body_takes_about_its_own_size_in_memory_while_parsed() {
        // The body of the attack: about 3.9 MB of empty arrays, which as a JSON tree took
        // about twelve times its size.
        let arrays = vec!["[]"; 1_300_000].join(",");
        let one = format!(r#"{{"payload": [{arrays}]}}"#);
        let per_byte = memory_per_body_byte(one.as_bytes());
        assert!(
            per_byte < 2.5,
            "one task: {per_byte:.1} bytes per body byte"
        );
        let part = vec!["[]"; 1_000].join(",");
        let tasks = vec![format!(r#"{{"payload": [{part}]}}"#); 1_000].join(",");
        let bulk = format!(r#"{{"tasks": [{tasks}]}}"#);
        let per_byte = memory_per_body_byte(bulk.as_bytes());
        assert!(per_byte < 2.5, "a bulk: {per_byte:.1} bytes per body byte");
    }

    #[test]
    fn a_payload_is_kept_compact_in_the_submitters_key_order() {
        let body = "{\"payload\": {\"b\": [1, 2],\n \"a\": \"x y\\\" z\"}}";
        let Submit::One { task, .. } = parse(body.as_bytes(), "k", Duration::from_secs(1)).unwrap()
        else {
            panic!("one task")
        };
        assert_eq!(task.payload, br#"{"b":[1,2],"a":"x y\" z"}"#);
        assert_eq!(
            err("{\"tasks\": [1]}"),
            "tasks[0]: bad task: a task must be a JSON object"
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
