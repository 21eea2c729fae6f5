//! What goes over an exec child's pipes: the request line of a batch, the reply line and
//! its one reading ([`parse_reply`], which the fuzz target `exec_reply` drives).
//!
//! Payloads are untrusted (ARCHITECTURE.md, invariant 25): a payload nested deeper than 64
//! levels is rejected before the batch line is written (other non-JSON payloads go as
//! strings), and a reply is read only up to 64 MiB and must be a UTF-8 JSON object, or the
//! batch fails and the child is restarted.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::host::handler::{
    MAX_JSON_DEPTH, Outcome, PayloadError, Task, check_json_depth, check_payload_size,
};

/// Longest reply line accepted from the child; a longer one is malformed, so a runaway
/// child cannot make the slot buffer without bound.
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// How much of a malformed reply the failure reason quotes.
pub(super) const QUOTE_CHARS: usize = 200;

#[derive(Serialize)]
pub(super) struct Request<'a> {
    pub(super) batch: Vec<RequestTask<'a>>,
}

#[derive(Serialize)]
pub(super) struct RequestTask<'a> {
    pub(super) id: &'a str,
    pub(super) payload: Box<RawValue>,
    pub(super) attempt: u32,
}

#[derive(Deserialize)]
pub(super) struct Reply {
    /// Each entry decoded on its own: one entry the slot cannot read fails its task
    /// alone, not the batch-mates the child finished.
    results: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
pub(super) struct ReplyEntry {
    id: String,
    #[serde(flatten)]
    status: ReplyStatus,
}

/// Just the id of an entry whose status does not decode.
#[derive(Deserialize)]
pub(super) struct EntryId {
    id: String,
}

/// One task's result as the child reported it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum ReplyStatus {
    /// `"ok"`: the task is done, with an optional `"result"` kept in its record.
    Ok {
        /// What the child returned for the task.
        #[serde(default)]
        result: Option<serde_json::Value>,
        /// Follow-up tasks: `"next": [{"queue": "…", "payload": …}]`.
        #[serde(default)]
        next: Vec<ReplyFollowUp>,
    },
    /// `"retry"`: try again after `delay_ms`, or after the queue's policy delay. The queue
    /// caps a delay at `queue_client::MAX_DELAY`.
    Retry {
        /// The child's delay, in ms (a whole number; `1500.0` counts, as some languages
        /// write their floats).
        #[serde(default, deserialize_with = "whole_ms")]
        delay_ms: Option<u64>,
        /// The priority it comes back at (else the queue's `retry.priority`, else its
        /// own).
        #[serde(default)]
        priority: Option<i32>,
    },
    /// `"fail"`: failed with `error`; retried by the queue's policy.
    Fail {
        /// The child's reason (an `error` that is not a string is kept as its JSON text).
        #[serde(default, deserialize_with = "reason_text")]
        error: Option<String>,
    },
    /// An entry with the task's id whose status the slot cannot read: the task fails
    /// with the reason (never sent by a child: `status` cannot name it).
    #[serde(skip)]
    Unreadable {
        /// What was wrong with the entry.
        reason: String,
    },
}

/// A delay in ms: a non-negative whole number, written as an integer or a float.
pub(super) fn whole_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(ms) = n.as_u64() {
        return Ok(Some(ms));
    }
    match n.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64 => Ok(Some(f as u64)),
        _ => Err(serde::de::Error::custom(format!(
            "delay_ms must be a whole number of ms, got {n}"
        ))),
    }
}

/// A failure's reason: its text, or the JSON text of any other value.
pub(super) fn reason_text<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    Ok(match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s),
        Some(other) => Some(other.to_string()),
    })
}

/// One follow-up an `ok` result asks for.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyFollowUp {
    /// The queue it goes to.
    pub queue: String,
    /// Its payload; `null` when absent.
    #[serde(default)]
    pub payload: serde_json::Value,
}

/// A finished task's outcome from its `ok` entry: its result and follow-ups.
pub(super) fn done_outcome(result: Option<serde_json::Value>, next: Vec<ReplyFollowUp>) -> Outcome {
    let done = match result {
        Some(result) => Outcome::done_with(result),
        None => Outcome::done(),
    };
    next.into_iter()
        .fold(done, |o, f| o.then(f.queue, f.payload))
}

/// Why a reply line cannot be used. Either way the child is out of step with the slot:
/// the batch fails (retried by policy) and the child is restarted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The line is longer than the slot reads (see [`MAX_REPLY_BYTES`]).
    #[error("reply longer than {0} bytes")]
    TooLong(usize),
    /// The line is not a reply of the protocol.
    #[error("malformed reply ({reason}): {quote:?}")]
    Malformed {
        /// What the JSON parser said.
        reason: String,
        /// The start of the line, for the log.
        quote: String,
    },
    /// The reply names a task that is not in the batch: it answers another batch (the
    /// child wrote a line too many before), so the child is out of step.
    #[error("reply for task {id:?}, which is not in the batch: the child is out of step")]
    OutOfStep {
        /// The id no task of the batch has.
        id: String,
    },
}

/// Parses one reply line of the child (newline included or not) for a batch whose task ids
/// are `batch_ids`, and returns each task's status in batch order: `None` for a task the
/// reply does not mention. Results for ids not in the batch are ignored; of two results for
/// one id, the first counts. This is the exec handler's only reading of a reply, and the
/// fuzz target `exec_reply` drives it with arbitrary lines.
pub fn parse_reply(
    line: &[u8],
    batch_ids: &[&str],
) -> Result<Vec<Option<ReplyStatus>>, ReplyError> {
    let malformed = |reason: String| ReplyError::Malformed {
        reason,
        quote: String::from_utf8_lossy(line)
            .trim_end()
            .chars()
            .take(QUOTE_CHARS)
            .collect(),
    };
    // JSON text is UTF-8. serde_json checks only the strings it keeps, so without this a
    // line with other bytes in a key or value it skips would pass (found by fuzzing).
    let text = std::str::from_utf8(line).map_err(|e| malformed(format!("not UTF-8: {e}")))?;
    // serde's derived structs also accept an array of their fields in order, so
    // `[[…]]` would pass for `{"results":[…]}` (found by fuzzing); the protocol says object.
    if !text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return Err(malformed("expected a JSON object".to_owned()));
    }
    let reply: Reply = serde_json::from_str(text).map_err(|e| malformed(e.to_string()))?;
    let in_batch: std::collections::HashSet<&str> = batch_ids.iter().copied().collect();
    let mut by_id = HashMap::with_capacity(reply.results.len());
    for value in reply.results {
        let (id, status) = match ReplyEntry::deserialize(&value) {
            Ok(entry) => (entry.id, entry.status),
            // An entry without a readable id cannot be told apart from another batch's.
            // (an object: serde also reads a struct from an array of its fields)
            Err(e) => match EntryId::deserialize(&value)
                .ok()
                .filter(|_| value.is_object())
            {
                Some(EntryId { id }) => (
                    id,
                    ReplyStatus::Unreadable {
                        reason: format!("exec: unreadable result entry: {e}"),
                    },
                ),
                None => return Err(malformed(format!("a result entry without an id: {e}"))),
            },
        };
        if !in_batch.contains(id.as_str()) {
            return Err(ReplyError::OutOfStep { id });
        }
        by_id.entry(id).or_insert(status);
    }
    Ok(batch_ids.iter().map(|id| by_id.get(*id).cloned()).collect())
}

/// Decides what to send the child for one task: its payload as JSON, or an outcome
/// without asking the child. A payload over `max_payload` or JSON nested deeper than
/// [`MAX_JSON_DEPTH`](super::MAX_JSON_DEPTH) is rejected (a child's parser could crash
/// on it and fail its batch-mates with it, attempt after attempt); anything else that is
/// not JSON is sent as a JSON string, as the protocol says.
///
/// JSON goes to the child as the producer wrote it, byte for byte (written again from a
/// `serde_json::Value`, integers past 64 bits would become floats and an object's keys
/// would be sorted). Only JSON written over several lines is rewritten on one (a line is
/// one request), which changes its whitespace alone.
pub(super) fn request_payload(task: &Task, max_payload: u64) -> Result<Box<RawValue>, Outcome> {
    let reject = |e: PayloadError| Outcome::Reject {
        reason: e.to_string(),
    };
    check_payload_size(&task.payload, max_payload).map_err(reject)?;
    match check_json_depth(&task.payload, MAX_JSON_DEPTH) {
        Ok(()) => {}
        // The bracket scan refuses before parsing; only a payload that really is JSON
        // (checked without recursion, whatever its depth) is too deep rather than text.
        Err(e) if serde_json::from_slice::<serde::de::IgnoredAny>(&task.payload).is_ok() => {
            return Err(reject(e));
        }
        Err(_) => return Ok(json_string(&task.payload)),
    }
    let Ok(raw) = serde_json::from_slice::<&RawValue>(&task.payload) else {
        return Ok(json_string(&task.payload));
    };
    if raw.get().contains(['\n', '\r']) {
        // Valid JSON holds line breaks only as whitespace between tokens.
        let value: serde_json::Value =
            serde_json::from_str(raw.get()).expect("already read as JSON");
        return Ok(to_raw(&value));
    }
    Ok(raw.to_owned())
}

/// A payload that is not JSON as the JSON string the protocol sends for it (bytes that
/// are not UTF-8 replaced).
pub(super) fn json_string(payload: &[u8]) -> Box<RawValue> {
    to_raw(&String::from_utf8_lossy(payload))
}

pub(super) fn to_raw(value: &(impl Serialize + ?Sized)) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).expect("a JSON value or string always serialises")
}
