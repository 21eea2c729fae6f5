//! An arbitrary reply line from an exec child: the slot's reply parser never panics, and
//! what it accepts is one status per task of the batch.
//!
//! A done task's `result` and follow-ups (`next`) are those the reply gave for it, in its
//! first entry: each follow-up's queue and payload (null when absent), in order.
//!
//! Input: a first line of comma-separated task ids (the batch), then the reply line.
#![no_main]

use gaffer::slot::exec::{ReplyError, ReplyFollowUp, ReplyStatus, parse_reply};
use libfuzzer_sys::fuzz_target;
use serde::de::IgnoredAny;

fuzz_target!(|data: &[u8]| {
    let (ids, line) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b"a,b,c"[..], data),
    };
    let ids = String::from_utf8_lossy(ids);
    let ids: Vec<&str> = ids.split(',').collect();
    match parse_reply(line, &ids) {
        Ok(statuses) => {
            assert_eq!(statuses.len(), ids.len());
            // Only UTF-8 JSON text, an object with a `results` array, is a reply.
            let text = std::str::from_utf8(line).expect("accepted a reply that is not UTF-8");
            serde_json::from_str::<IgnoredAny>(text).expect("accepted a reply that is not JSON");
            match serde_json::from_str::<serde_json::Value>(text) {
                Ok(value) => {
                    assert!(value["results"].is_array(), "accepted {value}");
                    check_results(&value, &ids, &statuses);
                }
                // Value refuses some JSON that a reply may carry in keys it ignores:
                // numbers beyond f64 and nesting deeper than 128.
                Err(e) => {
                    let e = e.to_string();
                    assert!(
                        e.starts_with("number out of range")
                            || e.starts_with("recursion limit exceeded"),
                        "accepted a reply serde_json refuses: {e}"
                    );
                }
            }
        }
        Err(e @ ReplyError::Malformed { .. }) => {
            let ReplyError::Malformed { quote, .. } = &e else {
                unreachable!()
            };
            assert!(quote.chars().count() <= 200, "quote too long");
            let _ = e.to_string();
        }
        Err(ReplyError::OutOfStep { id }) => {
            assert!(!ids.contains(&id.as_str()), "{id} is in the batch, yet out of step")
        }
        Err(e @ ReplyError::TooLong(_)) => panic!("the parser does not bound length: {e}"),
    }
});

/// Each done task's result is its first entry's `result` (absent or null: none), and its
/// follow-ups are that entry's `next`.
fn check_results(value: &serde_json::Value, ids: &[&str], statuses: &[Option<ReplyStatus>]) {
    let entries = value["results"].as_array().expect("results is an array");
    for (id, status) in ids.iter().zip(statuses) {
        let Some(ReplyStatus::Ok { result, next }) = status else {
            continue;
        };
        let first = entries
            .iter()
            .find(|e| e["id"] == *id)
            .expect("a status comes from an entry with its id");
        let sent = match &first["result"] {
            serde_json::Value::Null => None,
            v => Some(v),
        };
        assert_eq!(result.as_ref(), sent, "the result of {id} in {value}");
        check_next(&first["next"], next, id, value);
    }
}

/// The follow-ups the parser kept are exactly the entry's `next` array (absent: none), each
/// with only `queue` (a string) and `payload` (null when absent).
fn check_next(
    sent: &serde_json::Value,
    kept: &[ReplyFollowUp],
    id: &str,
    value: &serde_json::Value,
) {
    let sent = match sent {
        serde_json::Value::Null => &[][..],
        serde_json::Value::Array(a) => a.as_slice(),
        other => panic!("accepted next {other} of {id} in {value}"),
    };
    assert_eq!(sent.len(), kept.len(), "the follow-ups of {id} in {value}");
    for (s, k) in sent.iter().zip(kept) {
        let fields = s.as_object().expect("a follow-up is an object");
        assert!(
            fields.keys().all(|f| f == "queue" || f == "payload"),
            "accepted a follow-up with other fields: {s}"
        );
        assert_eq!(s["queue"].as_str(), Some(k.queue.as_str()), "{s}");
        assert_eq!(s["payload"], k.payload, "{s}");
    }
}
