//! Decoding the scripts' replies: the few shapes they return, with anything else a
//! protocol error rather than a panic (a task's meta: `meta.rs`).

use redis::Value;

use super::QueueError;

/// An integer reply, or one sent as text.
pub(super) fn int(v: &Value) -> Result<i64, QueueError> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| QueueError::Protocol("expected an integer".into())),
        other => Err(QueueError::Protocol(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}

/// A text reply; nil reads as empty.
pub(super) fn string(v: &Value) -> Result<String, QueueError> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        Value::Nil => Ok(String::new()),
        other => Err(QueueError::Protocol(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

/// [`string`] of a reply the caller owns: valid UTF-8 (any id) becomes the string without
/// a copy.
pub(super) fn owned_string(v: Value) -> Result<String, QueueError> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8(b)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())),
        other => string(&other),
    }
}

/// A bulk reply's bytes; anything else reads as none.
pub(super) fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        _ => Vec::new(),
    }
}
