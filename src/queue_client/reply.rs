//! Decoding the scripts' replies: the few shapes they return, and the `meta` field they
//! pack, with anything else a protocol error rather than a panic.

use redis::Value;

use super::QueueError;

/// The static part of a task's record (`meta` hash), as the scripts pack it.
pub(super) struct Meta {
    pub(super) priority: i32,
    pub(super) max_attempts: u32,
    pub(super) enqueued_ms: i64,
}

impl Meta {
    /// Parses `priority:max_attempts:enqueued_ms` (and whatever follows: a tracked task's
    /// `.SEQ:CHAIN`); `None` when malformed.
    pub(super) fn parse(s: &str) -> Option<Meta> {
        let mut it = s.split(':');
        let priority = it.next()?.parse().ok()?;
        let max_attempts = it.next()?.parse().ok()?;
        let enq = it.next()?;
        let enqueued_ms = enq.split_once('.').map_or(enq, |(ms, _)| ms).parse().ok()?;
        Some(Meta {
            priority,
            max_attempts,
            enqueued_ms,
        })
    }
}

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

#[cfg(test)]
mod tests {
    use super::Meta;

    #[test]
    fn a_meta_parses_with_or_without_its_record_number_and_chain() {
        let fields = |s: &str| Meta::parse(s).map(|m| (m.priority, m.max_attempts, m.enqueued_ms));
        assert_eq!(fields("-2:5:1700"), Some((-2, 5, 1700)));
        assert_eq!(fields("0:3:1700:s"), Some((0, 3, 1700)));
        assert_eq!(fields("0:3:1700.42:cQ:G.1"), Some((0, 3, 1700)));
        assert_eq!(fields("0:3:17x0.42:"), None);
    }
}
