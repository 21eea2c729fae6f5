//! An arbitrary task payload through `Task::json` (what handlers and the exec protocol
//! decode it with): never panics, never returns JSON nested deeper than the limit, agrees
//! with serde_json on what is JSON, and what it returns serialises to one line (the exec
//! protocol's framing).
#![no_main]

use gaffer::slot::{MAX_JSON_DEPTH, PayloadError, Task};
use libfuzzer_sys::fuzz_target;

fn depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fuzz_target!(|data: &[u8]| {
    let task = Task {
        id: "t".into(),
        attempt: 1,
        payload: data.to_vec(),
    };
    match task.json() {
        Ok(value) => {
            assert!(depth(&value) <= MAX_JSON_DEPTH, "too deep: {value}");
            let line = serde_json::to_vec(&value).unwrap();
            assert!(!line.contains(&b'\n'), "not one line: {value}");
        }
        Err(PayloadError::NotJson(_)) => {
            assert!(serde_json::from_slice::<serde_json::Value>(data).is_err());
        }
        Err(PayloadError::TooDeep(limit)) => assert_eq!(limit, MAX_JSON_DEPTH),
        Err(e @ PayloadError::TooLarge { .. }) => panic!("json() checked size: {e}"),
    }
});
