//! Checks of untrusted input that other modules share: queue names, which become part of
//! Redis keys, and JSON nesting, checked before any parser recurses into it. JSON text is
//! read byte by byte, knowing which bytes stand outside its strings ([`json_bytes`]): for
//! its depth, and for the api's compaction of payloads.

use super::QueueError;

/// Whether JSON text nests brackets deeper than `limit`, by a scan of brackets outside
/// strings: cheap, and run before any parser recurses into untrusted input (payloads in a
/// slot, request bodies in the api).
pub fn json_deeper_than(bytes: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    for (b, outside) in json_bytes(bytes) {
        match b {
            b'[' | b'{' if outside => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' if outside => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Each byte of JSON text with whether it stands outside every string (a string's quotes
/// count as inside): what scans of JSON text that build nothing (its depth, its white
/// space) read it by.
pub fn json_bytes(bytes: &[u8]) -> impl Iterator<Item = (u8, bool)> + '_ {
    let (mut in_string, mut escaped) = (false, false);
    bytes.iter().map(move |&b| {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            (b, false)
        } else {
            in_string = b == b'"';
            (b, !in_string)
        }
    })
}

/// Checks a queue name: it becomes part of Redis keys and their hash tag.
pub fn validate_queue_name(name: &str) -> Result<(), QueueError> {
    // The config's rule for every name that becomes part of a key.
    if crate::config::is_valid_name(name) {
        Ok(())
    } else {
        Err(QueueError::Invalid(format!(
            "queue name {name:?} is invalid: use 1 to 128 letters, digits, '_', '-' or '.'"
        )))
    }
}
