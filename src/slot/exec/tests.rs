//! The exec handler against real children (`examples/exec_handler.py` and inline scripts).

use std::path::Path;
use std::time::Instant;

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use super::*;
use crate::config::KILL_AFTER_TERM;
use crate::host::handler::Stop;

fn script() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/examples/exec_handler.py").to_owned()
}

fn ctx_for(command: Vec<String>, slot: u32) -> SlotContext {
    SlotContext::detached(QueueConfig::new("q", HandlerConfig::exec(command)), slot)
}

/// A child that echoes each payload back as the task's error, so a test sees what the
/// child got.
const ECHO: &str = r#"
import json, sys
for line in sys.stdin:
    batch = json.loads(line)["batch"]
    out = [{"id": t["id"], "status": "fail", "error": json.dumps(t["payload"])} for t in batch]
    print(json.dumps({"results": out}), flush=True)
"#;

/// The context of slot 0 whose exec command is `python3 -c script`.
fn python(script: &str) -> SlotContext {
    ctx_for(vec!["python3".into(), "-c".into(), script.into()], 0)
}

/// The handler preloaded and initialised (its child started) for `ctx`.
fn started(ctx: &SlotContext) -> Exec {
    let mut exec = Exec::preload(&ctx.queue).unwrap();
    exec.init(ctx).unwrap();
    exec
}

/// A started handler running the example script.
fn example() -> (Exec, SlotContext) {
    let ctx = ctx_for(vec!["python3".into(), script()], 0);
    let mut exec = Exec::preload(&ctx.queue).unwrap();
    exec.init(&ctx).unwrap();
    (exec, ctx)
}

fn task(id: &str, attempt: u32, payload: &str) -> Task {
    Task {
        id: id.into(),
        attempt,
        payload: payload.as_bytes().to_vec(),
    }
}

fn ok_batch() -> Vec<Task> {
    vec![task("a", 1, r#"{"action":"ok"}"#), task("b", 1, "{}")]
}

fn is_exec_failure(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Fail { reason } if reason.starts_with("exec: "))
}

/// Polls until `pid` no longer exists; reaping is synchronous in `stop`, so this only
/// allows for the kernel tearing the process down.
fn assert_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "process {pid} is still there");
        std::thread::yield_now();
    }
}

#[test]
fn ok_retry_and_fail_are_honoured() {
    let (mut exec, ctx) = example();
    let batch = vec![
        task("ok", 1, r#"{"action":"ok"}"#),
        task("later", 2, r#"{"action":"retry","delay_ms":1500}"#),
        task("policy", 3, r#"{"action":"retry"}"#),
        task("bad", 1, r#"{"action":"fail","error":"no such image"}"#),
        task("plain", 1, r#"{"action":"fail"}"#),
    ];
    let reason = "retry requested by handler".to_owned();
    assert_eq!(
        exec.handle(&ctx, &batch),
        vec![
            Outcome::done(),
            Outcome::Retry {
                delay: Duration::from_millis(1500),
                priority: None,
                reason: reason.clone(),
            },
            Outcome::Retry {
                delay: ctx.queue.retry.delay(3),
                priority: None,
                reason,
            },
            Outcome::Fail {
                reason: "no such image".into()
            },
            Outcome::Fail {
                reason: "failed".into()
            },
        ]
    );
}

/// The reasons of outcomes that must all be failures (an echoing child's answers).
fn fail_reasons(outcomes: Vec<Outcome>) -> Vec<String> {
    outcomes
        .into_iter()
        .map(|o| match o {
            Outcome::Fail { reason } => reason,
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

#[test]
fn a_payload_that_is_not_json_is_sent_as_a_string() {
    let ctx = python(ECHO);
    let mut exec = started(&ctx);
    let deep = "[".repeat(1000);
    let batch = vec![
        task("json", 1, r#"{"k": [1, 2]}"#),
        task("text", 1, "hello\nworld"),
        task("binary", 1, "\u{0}caf\u{e9}"),
        task("deep", 1, &deep),
    ];
    let reasons = fail_reasons(exec.handle(&ctx, &batch));
    assert_eq!(reasons[0], r#"{"k": [1, 2]}"#);
    assert_eq!(reasons[1], r#""hello\nworld""#);
    assert_eq!(reasons[2], r#""\u0000caf\u00e9""#);
    assert_eq!(reasons[3], serde_json::to_string(&deep).unwrap());
}

/// A sink for the log that a test reads back, as slow as a busy journal (20 µs a line).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        std::thread::sleep(Duration::from_micros(20));
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What a child writes to stderr as its input ends (a goodbye, a traceback) is in the
/// slot's log by the time its orderly end is over: the slot then exits, and the lines
/// its forwarder had not yet read were lost.
#[test]
fn a_childs_last_stderr_lines_are_logged_before_the_close_returns() {
    let script = r#"
import json, sys
for line in sys.stdin:
    out = [{"id": t["id"], "status": "ok"} for t in json.loads(line)["batch"]]
    print(json.dumps({"results": out}), flush=True)
# One write, larger than the pipe holds: the child exits as soon as its end is in the pipe.
sys.stderr.write("".join(f"goodbye {i} {'.' * 90}\n" for i in range(2000)))
sys.stderr.flush()
"#;
    let log = Captured::default();
    let sink = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let ctx = python(script);
        let mut exec = started(&ctx);
        assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::done(); 2]);
        exec.close();
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("goodbye 1999 "),
        "{}",
        &text[text.len().saturating_sub(500)..]
    );
}

/// The child reads what the producer wrote: big integers stay integers, keys keep their
/// order, numbers their spelling; only line breaks between tokens go.
#[test]
fn json_payloads_reach_the_child_as_written() {
    // Echoes each payload's raw text, as the request line holds it.
    let raw_echo = r#"
import json, re, sys
for line in sys.stdin:
    ids = [t["id"] for t in json.loads(line)["batch"]]
    texts = re.findall(r'"payload":(.*?),"attempt":', line)
    out = [{"id": i, "status": "fail", "error": p} for i, p in zip(ids, texts)]
    print(json.dumps({"results": out}), flush=True)
"#;
    let ctx = python(raw_echo);
    let mut exec = started(&ctx);
    let big = r#"{"z": 1, "a": 123456789012345678901234567890, "f": 1.10, "e": 1E2}"#;
    let batch = vec![
        task("big", 1, big),
        task("padded", 1, "  [1,2]  "),
        task("lines", 1, "{\n  \"b\": 2,\n  \"a\": 1\n}\n"),
    ];
    let reasons = fail_reasons(exec.handle(&ctx, &batch));
    assert_eq!(reasons[0], big);
    assert_eq!(reasons[1], "[1,2]");
    // Written again on one line: whitespace is all that changes.
    let lines: serde_json::Value = serde_json::from_str(&reasons[2]).unwrap();
    assert_eq!(lines, serde_json::json!({"a": 1, "b": 2}));
    assert!(!reasons[2].contains('\n'), "{}", reasons[2]);
}

#[test]
fn non_object_payloads_are_ok_in_the_example() {
    let (mut exec, ctx) = example();
    let batch = vec![task("s", 1, "just text"), task("n", 1, "42")];
    assert_eq!(exec.handle(&ctx, &batch), vec![Outcome::done(); 2]);
}

#[test]
fn a_task_missing_from_the_reply_fails() {
    let (mut exec, ctx) = example();
    let batch = vec![
        task("a", 1, "{}"),
        task("b", 1, r#"{"action":"skip"}"#),
        task("c", 1, "{}"),
    ];
    assert_eq!(
        exec.handle(&ctx, &batch),
        vec![
            Outcome::done(),
            Outcome::Fail {
                reason: "exec: no result for this task".into()
            },
            Outcome::done(),
        ]
    );
}

#[test]
fn results_match_by_id_and_the_first_wins() {
    let reply = r#"{"results":[{"id":"b","status":"fail","error":"one"},{"id":"a","status":"ok"},{"id":"b","status":"ok"}]}"#;
    let script = format!("import sys\nfor line in sys.stdin:\n    print({reply:?}, flush=True)\n");
    let ctx = python(&script);
    let mut exec = started(&ctx);
    let batch = vec![task("b", 1, "{}"), task("a", 1, "{}")];
    assert_eq!(
        exec.handle(&ctx, &batch),
        vec![
            Outcome::Fail {
                reason: "one".into()
            },
            Outcome::done()
        ]
    );
}

/// A child that cannot work (here it exits at once) fails two batches; at the third
/// the handler gives up: the batch goes back unstarted and the slot is told to exit as
/// crashed, so its master backs off rather than the tasks burning their attempts.
#[test]
fn a_child_that_fails_batch_after_batch_makes_the_slot_give_up() {
    let ctx = python("import sys\nsys.exit(3)\n");
    let mut exec = Exec::preload(&ctx.queue).unwrap();
    let batch = |n: u32| {
        vec![
            task(&format!("a{n}"), 1, "{}"),
            task(&format!("b{n}"), 1, "{}"),
        ]
    };
    // The same task failing again (a poison task retried) starts the count again.
    for n in [0, 0, 1] {
        let outcomes = exec.handle(&ctx, &batch(n));
        assert!(outcomes.iter().all(is_exec_failure), "{outcomes:?}");
        assert_eq!(ctx.stop.given_up(), None);
    }
    exec.handle(&ctx, &batch(2));
    assert!(
        ctx.stop
            .given_up()
            .is_some_and(|r| r.contains("3 batches in a row")),
        "{:?}",
        ctx.stop.given_up()
    );
    assert!(ctx.should_stop());
    assert_eq!(ctx.stop.take_unstarted(), vec![0, 1]);
}

/// A child that writes a line too many (a second reply, a print) would have every
/// later batch read the reply of the one before: the line left over, or a reply that
/// names a task not in the batch, restarts it.
#[test]
fn a_child_out_of_step_is_restarted() {
    let script = "import json, sys\nfor line in sys.stdin:\n    ids = [t['id'] for t in json.loads(line)['batch']]\n    reply = json.dumps({'results': [{'id': i, 'status': 'ok'} for i in ids]})\n    print(reply, flush=True)\n    if 'twice' in ids:\n        print(reply, flush=True)\n";
    let ctx = python(script);
    let mut exec = started(&ctx);
    let first = exec.child_pid().unwrap();
    assert_eq!(
        exec.handle(&ctx, &[task("twice", 1, "{}")]),
        vec![Outcome::done()]
    );
    // The second line may come after the reply was read: then the next batch reads
    // it, sees a task not its own, and fails (to be retried) with a new child.
    let next = exec.handle(&ctx, &[task("next", 1, "{}")]);
    assert_gone(first);
    if next != vec![Outcome::done()] {
        assert!(
            matches!(&next[0], Outcome::Fail { reason } if reason.contains("out of step")),
            "{next:?}"
        );
        assert_eq!(
            exec.handle(&ctx, &[task("again", 1, "{}")]),
            vec![Outcome::done()]
        );
    }
}

#[test]
fn a_malformed_reply_fails_the_batch_and_restarts_the_child() {
    let (mut exec, ctx) = example();
    let first = exec.child_pid().unwrap();
    let batch = vec![task("a", 1, "{}"), task("g", 1, r#"{"action":"garbage"}"#)];
    let outcomes = exec.handle(&ctx, &batch);
    assert_eq!(outcomes.len(), 2);
    assert!(outcomes.iter().all(is_exec_failure), "{outcomes:?}");
    assert!(
        matches!(&outcomes[0], Outcome::Fail { reason } if reason.contains("malformed reply")),
        "{outcomes:?}"
    );
    assert_gone(first);
    assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::done(); 2]);
    let second = exec.child_pid().unwrap();
    assert_ne!(first, second);
}

/// An entry with the task's id but a status the slot cannot read fails that task, naming
/// why; the child answered this batch, so it stays.
#[test]
fn entries_of_the_wrong_shape_fail_their_task() {
    for reply in [
        r#"{"results":[{"id":"a","status":"maybe"}]}"#,
        r#"{"results":[{"id":"a"}]}"#,
        r#"{"results":[{"id":"a","status":"retry","delay_ms":-5}]}"#,
    ] {
        let script =
            format!("import sys\nfor line in sys.stdin:\n    print({reply:?}, flush=True)\n");
        let ctx = python(&script);
        let mut exec = started(&ctx);
        let child = exec.child_pid();
        let outcomes = exec.handle(&ctx, &[task("a", 1, "{}")]);
        assert!(
            matches!(&outcomes[..], [Outcome::Fail { reason }] if reason.starts_with("exec: unreadable result entry")),
            "{reply}: {outcomes:?}"
        );
        assert_eq!(exec.child_pid(), child, "{reply}");
    }
}

#[test]
fn replies_of_the_wrong_shape_are_malformed() {
    for reply in [
        r#"{"results":[{"status":"ok"}]}"#,
        r#"{"results":{}}"#,
        r#"{"answers":[]}"#,
        r#"[]"#,
        "",
    ] {
        let script =
            format!("import sys\nfor line in sys.stdin:\n    print({reply:?}, flush=True)\n");
        let ctx = python(&script);
        let mut exec = started(&ctx);
        let outcomes = exec.handle(&ctx, &[task("a", 1, "{}")]);
        assert!(
            matches!(&outcomes[..], [Outcome::Fail { reason }] if reason.starts_with("exec: malformed reply")),
            "{reply}: {outcomes:?}"
        );
    }
}

#[test]
fn an_overlong_reply_is_malformed() {
    let script = "import sys\nfor line in sys.stdin:\n    print('x' * 5000, flush=True)\n";
    let ctx = python(script);
    let mut exec = started(&ctx);
    exec.max_reply = 1000;
    let outcomes = exec.handle(&ctx, &[task("a", 1, "{}")]);
    assert_eq!(
        outcomes,
        vec![Outcome::Fail {
            reason: "exec: reply longer than 1000 bytes".into()
        }]
    );
}

#[test]
fn a_reply_that_never_ends_is_bounded_and_the_child_replaced() {
    // "flood" writes without end and without a newline, as a runaway child would;
    // the slot must stop reading at the bound instead of buffering it all.
    let script = r#"
import json, sys
for line in sys.stdin:
    batch = json.loads(line)["batch"]
    if any(t["payload"] == "flood" for t in batch):
        chunk = "x" * 65536
        while True:
            sys.stdout.write(chunk)
    print(json.dumps({"results": [{"id": t["id"], "status": "ok"} for t in batch]}), flush=True)
"#;
    let ctx = python(script);
    let mut exec = started(&ctx);
    exec.max_reply = 1 << 20;
    let first = exec.child_pid().unwrap();
    let outcomes = exec.handle(&ctx, &[task("a", 1, "flood"), task("b", 1, "{}")]);
    let reason = "exec: reply longer than 1048576 bytes".to_owned();
    assert_eq!(outcomes, vec![Outcome::Fail { reason }; 2]);
    assert_gone(first);
    assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::done(); 2]);
    assert_ne!(exec.child_pid().unwrap(), first);
}

#[test]
fn oversized_and_deep_payloads_are_rejected_and_the_rest_is_sent() {
    let mut ctx = python(ECHO);
    ctx.queue.max_payload = 200;
    let mut exec = started(&ctx);
    let child = exec.child_pid().unwrap();
    let deep_json = format!("{}{}", "[".repeat(65), "]".repeat(65));
    let deep_text = format!("{}not json", "[".repeat(65));
    let batch = vec![
        task("small", 1, "[1]"),
        task("big", 1, &"x".repeat(201)),
        task("deep", 1, &deep_json),
        task("text", 1, &deep_text),
    ];
    let fail = |reason: String| Outcome::Fail { reason };
    let reject = |reason: &str| Outcome::Reject {
        reason: reason.into(),
    };
    assert_eq!(
        exec.handle(&ctx, &batch),
        vec![
            fail("[1]".into()),
            reject("payload of 201 B exceeds max_payload 200 B"),
            reject("payload nested deeper than 64 levels"),
            // Not JSON at all: sent as a string, as the protocol says.
            fail(serde_json::to_string(&deep_text).unwrap()),
        ]
    );
    // A batch refused whole never reaches the child, which stays as it was.
    assert_eq!(
        exec.handle(&ctx, &[task("big", 2, &"x".repeat(201))]),
        vec![reject("payload of 201 B exceeds max_payload 200 B")]
    );
    assert_eq!(exec.child_pid(), Some(child));
    assert_eq!(
        exec.handle(&ctx, &[task("next", 1, "{}")]),
        vec![fail("{}".into())]
    );
}

#[test]
fn an_entry_the_slot_cannot_read_fails_its_task_alone() {
    let line = br#"{"results":[{"id":"a","status":"retry","delay_ms":1500.0,"priority":1000},{"id":"b","status":"ok","next":[{"queue":"q","delay":"5m"}]},{"id":"c","status":"fail","error":{"code":3}},{"id":"d","status":"retry","delay_ms":1.5}]}"#;
    let got = parse_reply(line, &["a", "b", "c", "d"]).unwrap();
    assert_eq!(
        got[0],
        Some(ReplyStatus::Retry {
            delay_ms: Some(1500),
            priority: Some(1000)
        })
    );
    assert!(
        matches!(&got[1], Some(ReplyStatus::Unreadable { reason }) if reason.contains("unknown field `delay`")),
        "{got:?}"
    );
    assert_eq!(
        got[2],
        Some(ReplyStatus::Fail {
            error: Some(r#"{"code":3}"#.into())
        })
    );
    assert!(
        matches!(&got[3], Some(ReplyStatus::Unreadable { reason }) if reason.contains("whole number")),
        "{got:?}"
    );
    // Without an id, an entry cannot be told from another batch's: the line is bad;
    // so is an entry that is no object (serde would read its fields from an array).
    for line in [
        &br#"{"results":[{"status":"ok"}]}"#[..],
        br#"{"results":[["a"]]}"#,
    ] {
        assert!(
            matches!(parse_reply(line, &["a"]), Err(ReplyError::Malformed { .. })),
            "{}",
            String::from_utf8_lossy(line)
        );
    }
}

#[test]
fn parse_reply_gives_one_status_per_task_in_batch_order() {
    let line = br#"{"results":[{"id":"c","status":"retry","delay_ms":5},{"id":"a","status":"ok"},{"id":"a","status":"fail"}],"more":1}"#;
    // A task that is not in the batch: the reply answers another batch.
    let other = br#"{"results":[{"id":"a","status":"ok"},{"id":"x","status":"ok"}]}"#;
    assert_eq!(
        parse_reply(other, &["a", "b"]),
        Err(ReplyError::OutOfStep { id: "x".into() })
    );
    assert_eq!(
        parse_reply(line, &["a", "b", "c"]),
        Ok(vec![
            Some(ReplyStatus::Ok {
                result: None,
                next: vec![]
            }),
            None,
            Some(ReplyStatus::Retry {
                delay_ms: Some(5),
                priority: None
            })
        ])
    );
    assert_eq!(parse_reply(b"{\"results\":[]}\n", &["a"]), Ok(vec![None]));
    let long = format!("{{\"results\": {}", "x".repeat(1000));
    match parse_reply(long.as_bytes(), &["a"]) {
        Err(ReplyError::Malformed { quote, .. }) => assert_eq!(quote.chars().count(), 200),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_reply_that_is_not_utf8_is_malformed() {
    // Found by fuzzing (exec_reply): serde_json checks only the strings it keeps, so
    // bytes that are not UTF-8 in a skipped key passed as a reply.
    let line = b"{\"results\":[{\"id\":\"a\",\"status\":\"ok\"}],\"extra\":{\"\xff\":1}}";
    let reason = match parse_reply(line, &["a"]) {
        Err(ReplyError::Malformed { reason, .. }) => reason,
        other => panic!("{other:?}"),
    };
    assert!(reason.starts_with("not UTF-8"), "{reason}");
}

#[test]
fn a_reply_that_is_an_array_is_malformed() {
    // Found by fuzzing (exec_reply): a derived struct also reads an array of its
    // fields, so this passed for {"results":[{"id":"a","status":"ok"}]}.
    for line in [
        &br#"[[{"id":"a","status":"ok"}]]"#[..],
        b"[[]]",
        b" \t[[]]\n",
    ] {
        let reason = match parse_reply(line, &["a"]) {
            Err(ReplyError::Malformed { reason, .. }) => reason,
            other => panic!("{other:?}"),
        };
        assert_eq!(reason, "expected a JSON object");
    }
    let ok = b" \r\n{\"results\":[{\"id\":\"a\",\"status\":\"ok\"}]}\n";
    assert_eq!(
        parse_reply(ok, &["a"]),
        Ok(vec![Some(ReplyStatus::Ok {
            result: None,
            next: vec![]
        })])
    );
}

#[test]
fn a_child_that_dies_mid_batch_is_replaced() {
    let (mut exec, ctx) = example();
    let first = exec.child_pid().unwrap();
    let batch = vec![task("a", 1, "{}"), task("d", 1, r#"{"action":"die"}"#)];
    let outcomes = exec.handle(&ctx, &batch);
    assert_eq!(
        outcomes,
        vec![
            Outcome::Fail {
                reason: "exec: the child closed its stdout without replying".into()
            };
            2
        ]
    );
    assert_gone(first);
    assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::done(); 2]);
    assert_ne!(exec.child_pid().unwrap(), first);
}

#[test]
fn a_child_that_died_between_batches_is_replaced_first() {
    let (mut exec, ctx) = example();
    let first = exec.child_pid().unwrap();
    assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::done(); 2]);
    // SAFETY: signals our own child, which has not been reaped, so the pid is its.
    assert_eq!(unsafe { libc::kill(first as i32, libc::SIGKILL) }, 0);
    // Wait until it is a zombie, so the next batch must notice it before writing.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{first}/stat")).unwrap();
        let state = stat.rsplit_once(')').unwrap().1.trim_start();
        if state.starts_with('Z') {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "child {first} did not die: {stat}"
        );
        std::thread::yield_now();
    }
    assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::done(); 2]);
    assert_ne!(exec.child_pid().unwrap(), first);
    assert_gone(first);
}

#[test]
fn the_child_gets_queue_and_slot_in_its_environment() {
    let script = r#"
import json, os, sys
for line in sys.stdin:
    error = os.environ["GAFFER_QUEUE"] + "/" + os.environ["GAFFER_SLOT"]
    out = [{"id": t["id"], "status": "fail", "error": error} for t in json.loads(line)["batch"]]
    print(json.dumps({"results": out}), flush=True)
"#;
    let ctx = ctx_for(vec!["python3".into(), "-c".into(), script.into()], 7);
    let mut exec = Exec::preload(&ctx.queue).unwrap();
    exec.init(&ctx).unwrap();
    assert_eq!(
        exec.handle(&ctx, &[task("a", 1, "{}")]),
        vec![Outcome::Fail {
            reason: "q/7".into()
        }]
    );
}

#[test]
fn a_missing_program_fails_init_naming_it() {
    let ctx = ctx_for(vec!["/nonexistent/gaffer-handler".into(), "--x".into()], 0);
    let mut exec = Exec::preload(&ctx.queue).unwrap();
    let err = exec.init(&ctx).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/gaffer-handler"), "{err}");
    assert!(err.contains("No such file or directory"), "{err}");
    // The batch fails with the same reason instead of panicking.
    let outcomes = exec.handle(&ctx, &[task("a", 1, "{}")]);
    assert!(
        matches!(&outcomes[..], [Outcome::Fail { reason }] if reason.contains("cannot start")),
        "{outcomes:?}"
    );
}

#[test]
fn preload_starts_nothing() {
    let ctx = ctx_for(vec!["python3".into(), script()], 0);
    let exec = Exec::preload(&ctx.queue).unwrap();
    assert_eq!(exec.child_pid(), None);
}

/// A child that starts `sleep 1000` in its own group (its pid written to `pid_file`),
/// and then ends at the end of its input, or (when `stubborn`) ignores that and
/// SIGTERM too.
fn child_with_a_background_process(pid_file: &Path, stubborn: bool) -> SlotContext {
    python(&format!(
        r#"
import signal, subprocess, sys, time
p = subprocess.Popen(["sleep", "1000"])
open({pid_file:?}, "w").write(str(p.pid))
if {stubborn}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for line in sys.stdin:
    pass
while {stubborn}:
    time.sleep(1)
"#,
        pid_file = pid_file.display().to_string(),
        stubborn = if stubborn { "True" } else { "False" },
    ))
}

/// The pid the child wrote to `pid_file`, once it has.
fn written_pid(pid_file: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "the child wrote no pid");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts a child with a background process (see
/// [`child_with_a_background_process`]), closes it, checks that neither is left, and
/// returns how long the close took.
fn close_with_a_background_process(stubborn: bool) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut exec = started(&child_with_a_background_process(&pid_file, stubborn));
    let child = exec.child_pid().unwrap();
    let background = written_pid(&pid_file);
    let t0 = Instant::now();
    exec.close_child();
    let took = t0.elapsed();
    assert_gone(child);
    assert_gone(background);
    took
}

#[test]
fn a_child_that_ends_at_its_input_leaves_no_process_of_its_group() {
    let took = close_with_a_background_process(false);
    assert!(
        took < EXIT_GRACE,
        "the child ended at a signal, not at its input"
    );
}

#[test]
fn a_child_that_ignores_its_end_of_input_and_sigterm_is_killed_after_both() {
    let took = close_with_a_background_process(true);
    // (a lower bound: SIGKILL comes only after the grace and SIGTERM's wait)
    assert!(took >= EXIT_GRACE + KILL_AFTER_TERM, "{took:?}");
}

#[test]
fn dropping_the_handler_ends_and_reaps_the_child() {
    let (mut exec, ctx) = example();
    assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::done(); 2]);
    let pid = exec.child_pid().unwrap();
    drop(exec);
    assert_gone(pid);
}

/// A long queue's child that logs the cancel line to stderr and ignores it, and
/// SIGTERM too (when `stubborn`): only SIGKILL ends it.
fn long_ctx(stubborn: &str) -> SlotContext {
    let child = format!(
        r#"
import json, signal, sys
if {stubborn}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
line = sys.stdin.readline()
print("got a batch", file=sys.stderr, flush=True)
for line in sys.stdin:
    print("cancel line: " + line.strip(), file=sys.stderr, flush=True)
"#
    );
    let mut ctx = python(&child);
    ctx.queue.kind = crate::config::QueueKind::Long;
    ctx.queue.cancel_grace = Duration::from_millis(200);
    ctx
}

/// Waits until `pid` ignores SIGTERM (its SigIgn mask in /proc), so a signal sent
/// later meets the child's own disposition rather than its start-up.
fn wait_ignoring_sigterm(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0);
        if mask & (1 << (libc::SIGTERM - 1)) != 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{pid} never ignored SIGTERM");
        std::thread::yield_now();
    }
}

/// Cancels the long task in `exec` once it runs and returns the outcome and how long
/// the handler took after the cancel.
fn cancel_running(exec: &mut Exec, ctx: &SlotContext, stop: Stop) -> (Outcome, Duration) {
    let cancel = ctx.cancel.clone();
    let asked = std::thread::spawn(move || {
        // The batch line is written before the handler blocks on the reply; asking
        // before that only means the watcher sees the stop at once.
        cancel.ask(stop);
        Instant::now()
    });
    let out = exec.handle(ctx, &[task("w", 1, "{}")]);
    let asked = asked.join().unwrap();
    (out.into_iter().next().unwrap(), asked.elapsed())
}

#[test]
fn a_cancelled_long_task_gets_sigterm_after_the_grace_then_sigkill() {
    for (stubborn, at_least) in [
        ("False", Duration::from_millis(200)),
        ("True", KILL_AFTER_TERM),
    ] {
        let ctx = long_ctx(stubborn);
        let mut exec = started(&ctx);
        let pid = exec.child_pid().unwrap();
        if stubborn == "True" {
            wait_ignoring_sigterm(pid);
        }
        let (outcome, took) = cancel_running(&mut exec, &ctx, Stop::Cancel);
        assert!(is_exec_failure(&outcome), "{outcome:?}");
        // SIGTERM waits out the grace; a child that ignores it waits for SIGKILL.
        assert!(took >= at_least, "{stubborn}: ended after {took:?}");
        assert_gone(pid);
        ctx.cancel.reset();
    }
}

#[test]
fn a_long_task_that_must_stop_now_is_killed_at_once() {
    let mut ctx = long_ctx("True");
    // A grace no loaded machine could pass for: ending well within it shows none
    // was waited.
    ctx.queue.cancel_grace = Duration::from_secs(30);
    let mut exec = started(&ctx);
    let pid = exec.child_pid().unwrap();
    let (outcome, took) = cancel_running(&mut exec, &ctx, Stop::Now);
    assert!(is_exec_failure(&outcome), "{outcome:?}");
    assert!(
        took < ctx.queue.cancel_grace,
        "no grace when the lease is lost: {took:?}"
    );
    assert_gone(pid);
}

/// A child that finishes the batch's first task, says so in `marker`, then waits for
/// a line: after the stop line it answers the tasks it finished (`a`, and with
/// `subset` also `c`, as a child working in parallel might); `ignore` answers all.
fn stopping_child(marker: &Path, answer: &str) -> SlotContext {
    let script = format!(
        r#"
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "stop" in msg:
        continue
    ids = [t["id"] for t in msg["batch"]]
    open({marker:?}, "w").close()
    stop = json.loads(sys.stdin.readline())
    assert stop == {{"stop": True}}, stop
    done = {{"prefix": ids[:1], "subset": [ids[0], ids[2]], "ignore": ids}}[{answer:?}]
    print(json.dumps({{"results": [{{"id": i, "status": "ok"}} for i in done]}}), flush=True)
"#,
        marker = marker.display().to_string(),
    );
    python(&script)
}

/// Runs a batch of four in `ctx`'s child and asks the slot's stop once the child has
/// it (its marker exists): the outcomes and the positions left unstarted.
fn stop_mid_batch(ctx: &SlotContext, marker: &Path) -> (Vec<Outcome>, Vec<usize>) {
    let mut exec = started(ctx);
    let batch: Vec<Task> = ["a", "b", "c", "d"].map(|id| task(id, 1, "{}")).into();
    let stop = ctx.stop.clone();
    let marker = marker.to_owned();
    let asker = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !marker.exists() {
            assert!(Instant::now() < deadline, "the child never got the batch");
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.ask();
    });
    let outcomes = exec.handle(ctx, &batch);
    asker.join().unwrap();
    (outcomes, ctx.stop.take_unstarted())
}

#[test]
fn a_stop_mid_batch_sends_the_stop_line_and_the_unanswered_tasks_are_left_unstarted() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("has-batch");
    let ctx = stopping_child(&marker, "prefix");
    let (outcomes, unstarted) = stop_mid_batch(&ctx, &marker);
    assert_eq!(outcomes[0], Outcome::done());
    assert_eq!(unstarted, [1, 2, 3], "{outcomes:?}");

    let marker = dir.path().join("has-batch-2");
    let ctx = stopping_child(&marker, "subset");
    let (outcomes, unstarted) = stop_mid_batch(&ctx, &marker);
    assert_eq!(
        (&outcomes[0], &outcomes[2]),
        (&Outcome::done(), &Outcome::done())
    );
    assert_eq!(unstarted, [1, 3], "{outcomes:?}");
}

#[test]
fn a_child_that_ignores_the_stop_line_has_its_full_reply_used() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("has-batch");
    let ctx = stopping_child(&marker, "ignore");
    let (outcomes, unstarted) = stop_mid_batch(&ctx, &marker);
    assert_eq!(outcomes, vec![Outcome::done(); 4]);
    assert_eq!(unstarted, Vec::<usize>::new());
}

#[test]
fn a_stop_before_the_batch_sends_nothing_and_starts_nothing() {
    let (mut exec, ctx) = example();
    let child = exec.child_pid();
    ctx.stop.ask();
    assert_eq!(exec.handle(&ctx, &ok_batch()), vec![]);
    assert_eq!(exec.child_pid(), child, "the child is left as it was");
}
