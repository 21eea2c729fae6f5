//! The exec handler: one long-lived child per slot speaking JSON lines over stdin/stdout
//! (DESIGN.md, Handlers), so a team can write its handler in any language.
//!
//! The child is the slot's to keep alive: one that exits, answers nonsense or cannot be
//! written to fails the whole batch (retried by the queue's policy) and is replaced before
//! the next one. A child that hangs is left alone: the master's watchdog kills the slot,
//! and the child dies with it.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::handler::{Handler, HandlerError, Outcome, SlotContext, Task};
use crate::config::{Handler as HandlerConfig, QueueConfig};

/// Longest reply line accepted from the child; a longer one is malformed, so a runaway
/// child cannot make the slot buffer without bound.
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// Longest stderr line logged as one event; a longer one is logged in pieces.
const MAX_LOG_LINE: usize = 64 << 10;

/// How much of a malformed reply the failure reason quotes.
const QUOTE_CHARS: usize = 200;

/// Runs the queue's `command` as a child and exchanges one request and one reply per
/// batch with it.
#[derive(Debug)]
pub struct Exec {
    command: Vec<String>,
    child: Option<Running>,
    max_reply: usize,
}

/// A started child and our ends of its pipes.
#[derive(Debug)]
struct Running {
    process: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

#[derive(Serialize)]
struct Request<'a> {
    batch: Vec<RequestTask<'a>>,
}

#[derive(Serialize)]
struct RequestTask<'a> {
    id: &'a str,
    payload: serde_json::Value,
    attempt: u32,
}

#[derive(Deserialize)]
struct Reply {
    results: Vec<ReplyEntry>,
}

#[derive(Deserialize)]
struct ReplyEntry {
    id: String,
    #[serde(flatten)]
    status: Status,
}

#[derive(Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
enum Status {
    Ok,
    Retry { delay_ms: Option<u64> },
    Fail { error: Option<String> },
}

impl Exec {
    /// Starts the child. It is spawned from the calling thread, which must be the one the
    /// slot keeps for its handler all its life: PDEATHSIG fires when the spawning *thread*
    /// exits, not the process, so a child started from a short-lived thread would be
    /// killed with that thread.
    fn spawn(&self, ctx: &SlotContext) -> Result<Running, String> {
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| "the command is empty".to_owned())?;
        let parent = std::process::id();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("GAFFER_QUEUE", &ctx.queue.name)
            .env("GAFFER_SLOT", ctx.slot.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl and getppid are async-signal-safe and touch no memory of the
        // parent; the errors built here do not allocate.
        unsafe {
            cmd.pre_exec(move || {
                // The child must not outlive a slot killed by the watchdog or the OOM
                // killer, which run no destructors.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                    return Err(io::Error::last_os_error());
                }
                // The slot may have died between fork and prctl: then nothing would ever
                // send the signal.
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut process = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", self.command))?;
        let pid = process.id();
        let (Some(stdin), Some(stdout), Some(stderr)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) else {
            unreachable!("all three streams are piped");
        };
        let (queue, slot) = (ctx.queue.name.clone(), ctx.slot);
        let forwarder = std::thread::Builder::new()
            .name(format!("exec-stderr-{pid}"))
            .spawn(move || forward_stderr(stderr, &queue, slot, pid));
        if let Err(e) = forwarder {
            let _ = process.kill();
            let _ = process.wait();
            return Err(format!("cannot start the stderr thread for {pid}: {e}"));
        }
        tracing::info!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot, pid,
            command = ?self.command, "exec child started");
        Ok(Running {
            process,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    /// Kills and reaps the child, if any, so that none is left behind as a zombie or an
    /// orphan still holding the slot's resources.
    fn stop(&mut self) {
        let Some(mut running) = self.child.take() else {
            return;
        };
        let pid = running.process.id();
        let _ = running.process.kill();
        match running.process.wait() {
            Ok(status) => {
                tracing::debug!(target: "gaffer::exec", pid, %status, "exec child stopped")
            }
            Err(e) => tracing::warn!(target: "gaffer::exec", pid, "cannot reap exec child: {e}"),
        }
    }

    /// The running child, started anew if there is none or the last one has exited.
    fn running(&mut self, ctx: &SlotContext) -> Result<&mut Running, String> {
        if let Some(running) = &mut self.child {
            match running.process.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name,
                        slot = ctx.slot, pid = running.process.id(), %status,
                        "exec child exited between batches; restarting it");
                    self.child = None;
                }
                Err(e) => {
                    tracing::warn!(target: "gaffer::exec", pid = running.process.id(),
                        "cannot check exec child: {e}; restarting it");
                    self.stop();
                }
            }
        }
        if self.child.is_none() {
            self.child = Some(self.spawn(ctx)?);
        }
        Ok(self.child.as_mut().expect("started just above"))
    }

    /// Sends the batch and reads the reply; any error means the child can no longer be
    /// trusted to be in step with us.
    fn exchange(&mut self, ctx: &SlotContext, batch: &[Task]) -> Result<Reply, String> {
        let max_reply = self.max_reply;
        let running = self.running(ctx)?;
        let request = Request {
            batch: batch
                .iter()
                .map(|task| RequestTask {
                    id: &task.id,
                    payload: task.json().unwrap_or_else(|_| {
                        serde_json::Value::String(String::from_utf8_lossy(&task.payload).into())
                    }),
                    attempt: task.attempt,
                })
                .collect(),
        };
        // Compact JSON escapes control characters inside strings, so this is one line.
        let mut line = serde_json::to_vec(&request).map_err(|e| format!("cannot encode: {e}"))?;
        line.push(b'\n');
        running
            .stdin
            .write_all(&line)
            .and_then(|()| running.stdin.flush())
            .map_err(|e| format!("cannot write to the child: {e}"))?;

        let mut reply = Vec::new();
        (&mut running.stdout)
            .take(max_reply as u64 + 1)
            .read_until(b'\n', &mut reply)
            .map_err(|e| format!("cannot read from the child: {e}"))?;
        if reply.last() != Some(&b'\n') {
            return Err(if reply.len() > max_reply {
                format!("reply longer than {max_reply} bytes")
            } else if reply.is_empty() {
                "the child closed its stdout without replying".to_owned()
            } else {
                "the child closed its stdout in the middle of a reply".to_owned()
            });
        }
        serde_json::from_slice(&reply).map_err(|e| {
            let text = String::from_utf8_lossy(&reply);
            let quote: String = text.trim_end().chars().take(QUOTE_CHARS).collect();
            format!("malformed reply ({e}): {quote:?}")
        })
    }

    /// The child's pid, to watch it being replaced and reaped.
    #[cfg(test)]
    fn child_pid(&self) -> Option<u32> {
        self.child.as_ref().map(|r| r.process.id())
    }
}

impl Handler for Exec {
    /// Only keeps the command: the zygote must stay single-threaded and childless.
    fn preload(queue: &QueueConfig) -> Result<Self, HandlerError> {
        let HandlerConfig::Exec { command } = &queue.handler else {
            return Err(HandlerError::new("exec: queue is not configured as exec"));
        };
        Ok(Exec {
            command: command.clone(),
            child: None,
            max_reply: MAX_REPLY_BYTES,
        })
    }

    /// Starts the child, so that a command that cannot run fails the slot at once rather
    /// than every batch.
    fn init(&mut self, ctx: &SlotContext) -> Result<(), HandlerError> {
        self.stop();
        self.child = Some(
            self.spawn(ctx)
                .map_err(|e| HandlerError::new(format!("exec: {e}")))?,
        );
        Ok(())
    }

    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        if batch.is_empty() {
            return Vec::new();
        }
        let reply = match self.exchange(ctx, batch) {
            Ok(reply) => reply,
            Err(why) => {
                tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot,
                    pid = self.child.as_ref().map(|r| r.process.id()),
                    "exec batch failed: {why}; the child will be restarted");
                self.stop();
                let reason = format!("exec: {why}");
                return vec![Outcome::Fail { reason }; batch.len()];
            }
        };
        let mut by_id = HashMap::with_capacity(reply.results.len());
        for entry in reply.results {
            by_id.entry(entry.id).or_insert(entry.status);
        }
        batch
            .iter()
            .map(|task| match by_id.get(&task.id) {
                Some(Status::Ok) => Outcome::Done,
                Some(Status::Retry { delay_ms }) => Outcome::Retry {
                    delay: delay_ms
                        .map(Duration::from_millis)
                        .unwrap_or_else(|| ctx.queue.retry.delay(task.attempt)),
                    reason: "retry requested by handler".to_owned(),
                },
                Some(Status::Fail { error }) => Outcome::Fail {
                    reason: error.clone().unwrap_or_else(|| "failed".to_owned()),
                },
                None => Outcome::Fail {
                    reason: "exec: no result for this task".to_owned(),
                },
            })
            .collect()
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Copies the child's stderr to the slot's log, a line per event; ends when the child's
/// stderr closes.
fn forward_stderr(stderr: impl Read, queue: &str, slot: u32, pid: u32) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_LOG_LINE as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                tracing::info!(target: "gaffer::exec", queue, slot, pid, "{text}");
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(target: "gaffer::exec", queue, slot, pid,
                    "cannot read the child's stderr: {e}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Instant;

    use super::*;

    fn script() -> String {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/exec_handler.py").to_owned()
    }

    fn ctx_for(command: Vec<String>, slot: u32) -> SlotContext {
        SlotContext::detached(QueueConfig::new("q", HandlerConfig::Exec { command }), slot)
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
                Outcome::Done,
                Outcome::Retry {
                    delay: Duration::from_millis(1500),
                    reason: reason.clone(),
                },
                Outcome::Retry {
                    delay: ctx.queue.retry.delay(3),
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

    #[test]
    fn a_payload_that_is_not_json_is_sent_as_a_string() {
        // Echoes each payload back as the error, so the test sees what the child got.
        let echo = r#"
import json, sys
for line in sys.stdin:
    batch = json.loads(line)["batch"]
    out = [{"id": t["id"], "status": "fail", "error": json.dumps(t["payload"])} for t in batch]
    print(json.dumps({"results": out}), flush=True)
"#;
        let ctx = ctx_for(vec!["python3".into(), "-c".into(), echo.into()], 0);
        let mut exec = Exec::preload(&ctx.queue).unwrap();
        exec.init(&ctx).unwrap();
        let deep = "[".repeat(1000);
        let batch = vec![
            task("json", 1, r#"{"k": [1, 2]}"#),
            task("text", 1, "hello\nworld"),
            task("binary", 1, "\u{0}caf\u{e9}"),
            task("deep", 1, &deep),
        ];
        let reasons: Vec<String> = exec
            .handle(&ctx, &batch)
            .into_iter()
            .map(|o| match o {
                Outcome::Fail { reason } => reason,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(reasons[0], r#"{"k": [1, 2]}"#);
        assert_eq!(reasons[1], r#""hello\nworld""#);
        assert_eq!(reasons[2], r#""\u0000caf\u00e9""#);
        assert_eq!(reasons[3], serde_json::to_string(&deep).unwrap());
    }

    #[test]
    fn non_object_payloads_are_ok_in_the_example() {
        let (mut exec, ctx) = example();
        let batch = vec![task("s", 1, "just text"), task("n", 1, "42")];
        assert_eq!(exec.handle(&ctx, &batch), vec![Outcome::Done; 2]);
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
                Outcome::Done,
                Outcome::Fail {
                    reason: "exec: no result for this task".into()
                },
                Outcome::Done,
            ]
        );
    }

    #[test]
    fn results_match_by_id_first_wins_and_unknown_ids_are_ignored() {
        let reply = r#"{"results":[{"id":"x","status":"ok"},{"id":"b","status":"fail","error":"one"},{"id":"a","status":"ok"},{"id":"b","status":"ok"}]}"#;
        let script =
            format!("import sys\nfor line in sys.stdin:\n    print({reply:?}, flush=True)\n");
        let ctx = ctx_for(vec!["python3".into(), "-c".into(), script], 0);
        let mut exec = Exec::preload(&ctx.queue).unwrap();
        exec.init(&ctx).unwrap();
        let batch = vec![task("b", 1, "{}"), task("a", 1, "{}")];
        assert_eq!(
            exec.handle(&ctx, &batch),
            vec![
                Outcome::Fail {
                    reason: "one".into()
                },
                Outcome::Done
            ]
        );
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
        assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::Done; 2]);
        let second = exec.child_pid().unwrap();
        assert_ne!(first, second);
    }

    #[test]
    fn replies_of_the_wrong_shape_are_malformed() {
        for reply in [
            r#"{"results":[{"id":"a","status":"maybe"}]}"#,
            r#"{"results":[{"id":"a"}]}"#,
            r#"{"results":[{"id":"a","status":"retry","delay_ms":-5}]}"#,
            r#"{"results":{}}"#,
            r#"{"answers":[]}"#,
            r#"[]"#,
            "",
        ] {
            let script =
                format!("import sys\nfor line in sys.stdin:\n    print({reply:?}, flush=True)\n");
            let ctx = ctx_for(vec!["python3".into(), "-c".into(), script], 0);
            let mut exec = Exec::preload(&ctx.queue).unwrap();
            exec.init(&ctx).unwrap();
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
        let ctx = ctx_for(vec!["python3".into(), "-c".into(), script.into()], 0);
        let mut exec = Exec::preload(&ctx.queue).unwrap();
        exec.max_reply = 1000;
        exec.init(&ctx).unwrap();
        let outcomes = exec.handle(&ctx, &[task("a", 1, "{}")]);
        assert_eq!(
            outcomes,
            vec![Outcome::Fail {
                reason: "exec: reply longer than 1000 bytes".into()
            }]
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
        assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::Done; 2]);
        assert_ne!(exec.child_pid().unwrap(), first);
    }

    #[test]
    fn a_child_that_died_between_batches_is_replaced_first() {
        let (mut exec, ctx) = example();
        let first = exec.child_pid().unwrap();
        assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::Done; 2]);
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
        assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::Done; 2]);
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

    #[test]
    fn dropping_the_handler_kills_and_reaps_the_child() {
        let (mut exec, ctx) = example();
        assert_eq!(exec.handle(&ctx, &ok_batch()), vec![Outcome::Done; 2]);
        let pid = exec.child_pid().unwrap();
        drop(exec);
        assert_gone(pid);
    }
}
