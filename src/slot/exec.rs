//! The exec handler: one long-lived child per slot speaking JSON lines over stdin/stdout
//! (DESIGN.md, Handlers), so a team can write its handler in any language.
//!
//! The child is the slot's to keep alive: one that exits, answers nonsense or cannot be
//! written to fails the whole batch (retried by the queue's policy) and is replaced before
//! the next one. A child that hangs is left alone: the master's watchdog kills the slot,
//! and the child dies with it.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::forked::{ForkError, Forked, Streams};
use crate::config::{Handler as HandlerConfig, KILL_AFTER_TERM, QueueConfig, Start};
use crate::host::fork::START_ENV;
use crate::host::handler::{
    Handler, HandlerError, MAX_JSON_DEPTH, Outcome, OutsidePid, PayloadError, SlotContext,
    SlotStop, Stop, Task, check_json_depth, check_payload_size,
};

/// Longest reply line accepted from the child; a longer one is malformed, so a runaway
/// child cannot make the slot buffer without bound.
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// Longest stderr line logged as one event; a longer one is logged in pieces.
const MAX_LOG_LINE: usize = 64 << 10;

/// How much of a malformed reply the failure reason quotes.
const QUOTE_CHARS: usize = 200;

/// How long a child has to exit after its stdin closes at the slot's orderly end, before
/// it gets SIGTERM (then SIGKILL [`KILL_AFTER_TERM`] later).
pub const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Runs the queue's `command` as a child and exchanges one request and one reply per
/// batch with it.
#[derive(Debug)]
pub struct Exec {
    command: Vec<String>,
    /// Started anew per child, or forked by the queue's language zygote.
    start: Start,
    /// Where a forked child is named as the slot's process outside its tree, so that
    /// its memory counts as the slot's (0 once it has ended).
    outside: OutsidePid,
    child: Option<Running>,
    max_reply: usize,
    /// Writes the stop line while a batch is in the child (batch queues; started with
    /// the first batch).
    stop_writer: Option<StopWriter>,
    /// Batches in a row whose exchange with the child failed, no two in a row sharing a
    /// task (see [`GIVE_UP_AFTER`]).
    failed_in_a_row: u32,
    /// The ids of the last batch whose exchange failed.
    last_failed: Vec<String>,
    /// The child answered in step but wrote more after its reply: it is stopped once the
    /// exchange is over, and the next batch starts a new one.
    restart_after_reply: bool,
    /// One per child whose stderr is still being forwarded (disconnected once read to its
    /// end): the slot's orderly end waits for them, [`STDERR_FLUSH`] at most, so that a
    /// child's last words (a traceback, a goodbye) reach the log before the slot exits.
    stderr_open: Vec<mpsc::Receiver<()>>,
}

/// Longest wait at the slot's orderly end for its children's stderr to be logged to the
/// end (a process the child left in the background may hold it open).
const STDERR_FLUSH: Duration = Duration::from_secs(1);

/// Batches in a row a child may fail (crash, hang up, answer out of step) before the slot
/// gives up: the batch in hand goes back unstarted, and the slot exits as crashed, so its
/// master backs off and counts the crash (an alert) instead of the queue's tasks burning
/// their attempts, batch after batch, against a child that cannot work. A failed batch
/// that shares a task with the one before starts the count again: one poison task that
/// kills the child at each attempt is the task's fault, and must reach the dead letters.
const GIVE_UP_AFTER: u32 = 3;

/// Whether the stop line went to the child while it had the batch: then a task its reply
/// leaves out was not started, and goes back to the queue instead of failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopLine {
    /// Not written: the reply answers the whole batch, as always.
    NotSent,
    /// Written after the batch line and before the reply was read.
    Sent,
}

/// What the stop writer shares with the handler thread: the stdin of the child that has a
/// batch, while it has one.
#[derive(Default)]
struct InFlight {
    /// A duplicate of the child's stdin, from the batch line written to the reply read.
    stdin: Option<File>,
    /// Whether the stop line was written during this batch.
    sent: bool,
}

impl InFlight {
    /// Writes `{"stop": true}` to the child holding a batch, once per batch; `queue` and
    /// `slot` name it in the log.
    fn write_stop(&mut self, queue: &str, slot: u32) {
        let Some(stdin) = &mut self.stdin else {
            return;
        };
        if self.sent {
            return;
        }
        match stdin
            .write_all(b"{\"stop\":true}\n")
            .and_then(|()| stdin.flush())
        {
            Ok(()) => self.sent = true,
            // The child is gone or not reading: its reply (or its absence) says the rest.
            Err(e) => tracing::warn!(target: "gaffer::exec", queue, slot,
                "cannot write the stop line: {e}"),
        }
    }
}

/// A thread that waits for the slot's stop and, when a batch is in the child then,
/// writes the stop line on its stdin: the handler thread is blocked reading the reply
/// meanwhile. The slot is asked to stop once in its life, so one thread waiting on a
/// condition variable serves every batch; dropping the writer ends it.
struct StopWriter {
    in_flight: Arc<Mutex<InFlight>>,
    /// The slot's stop, woken to end the thread.
    stop: SlotStop,
    /// Set when the writer is dropped.
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for StopWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopWriter").finish_non_exhaustive()
    }
}

impl StopWriter {
    /// Starts the thread for the slot of `ctx`. Without a thread (the OS refused one) a
    /// stop asked before a batch is sent still reaches the child; one asked later waits
    /// for the reply.
    fn start(ctx: &SlotContext) -> StopWriter {
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let done = Arc::new(AtomicBool::new(false));
        let (shared, over) = (in_flight.clone(), done.clone());
        let (stop, queue, slot) = (ctx.stop.clone(), ctx.queue.name.clone(), ctx.slot);
        let thread = std::thread::Builder::new()
            .name("exec-stop-line".into())
            .spawn(move || {
                if stop.wait(&over) && !over.load(Ordering::Acquire) {
                    lock(&shared).write_stop(&queue, slot);
                }
            });
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot,
                    "cannot start the stop line's thread: {e}; a stop waits for the batch's reply");
                None
            }
        };
        StopWriter {
            in_flight,
            stop: ctx.stop.clone(),
            done,
            thread,
        }
    }

    /// The batch line is written: from now until [`batch_over`](Self::batch_over) a stop
    /// is passed on to `stdin`, at once when it was already asked.
    fn batch_sent(&self, ctx: &SlotContext, stdin: File) {
        let mut in_flight = lock(&self.in_flight);
        *in_flight = InFlight {
            stdin: Some(stdin),
            sent: false,
        };
        if ctx.should_stop() {
            in_flight.write_stop(&ctx.queue.name, ctx.slot);
        }
    }

    /// The reply is read (or the exchange failed): no more stop lines for this batch.
    /// Says whether one was written.
    fn batch_over(&self) -> StopLine {
        let in_flight = std::mem::take(&mut *lock(&self.in_flight));
        if in_flight.sent {
            StopLine::Sent
        } else {
            StopLine::NotSent
        }
    }
}

impl Drop for StopWriter {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        self.stop.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Locks what the stop writer shares; a poisoned lock still holds a usable state (a
/// write that panicked left at worst a stop line unsent).
fn lock(in_flight: &Mutex<InFlight>) -> std::sync::MutexGuard<'_, InFlight> {
    in_flight.lock().unwrap_or_else(|p| p.into_inner())
}

/// A started child and our ends of its pipes.
#[derive(Debug)]
struct Running {
    process: Proc,
    stdin: File,
    stdout: BufReader<File>,
}

/// The child's process: the slot's own (`start = "spawn"`), or forked by the queue's
/// language zygote (`start = "fork"`), which reaps it.
#[derive(Debug)]
enum Proc {
    Spawned(Child),
    Forked(Forked),
}

impl Proc {
    fn id(&self) -> u32 {
        match self {
            Proc::Spawned(child) => child.id(),
            Proc::Forked(forked) => forked.pid(),
        }
    }

    /// Whether the child ends within `wait` (`Duration::MAX`: until it does); a spawned
    /// one is not reaped, so its pid, and its group's id, stay its own.
    fn exited_within(&self, wait: Duration) -> bool {
        match self {
            Proc::Spawned(child) => exited_within(child.id(), wait),
            Proc::Forked(forked) => forked.exited_within(wait),
        }
    }

    /// Its status text if it has ended (a forked child's exit status is its zygote's).
    fn ended(&mut self) -> io::Result<Option<String>> {
        match self {
            Proc::Spawned(child) => Ok(child.try_wait()?.map(|s| s.to_string())),
            Proc::Forked(forked) => Ok((!forked.is_alive()).then(|| "ended".to_string())),
        }
    }

    /// Sends `sig` to its process group.
    fn signal(&self, sig: Signal) {
        match self {
            Proc::Spawned(child) => signal(child.id(), sig),
            Proc::Forked(forked) => forked.signal(sig),
        }
    }

    /// Sends `sig` to what is left of its group once it has ended (what it started). A
    /// spawned child is not reaped yet, so its group's id is still its own; a forked one's
    /// zygote reaped it, and the id stays the group's only while the group has a member
    /// (the kernel reuses no pid that names a live group), so the signal goes out at once,
    /// leaving only the moment between its last member's end and a new process of that
    /// pid making a group of its own.
    fn signal_group_left(&self, sig: Signal) {
        signal(self.id(), sig);
    }

    /// Waits for its end and reaps it if it is the slot's; its status text.
    fn reap(&mut self) -> io::Result<String> {
        match self {
            Proc::Spawned(child) => child.wait().map(|s| s.to_string()),
            Proc::Forked(forked) => {
                forked.exited_within(Duration::MAX);
                Ok("ended".to_string())
            }
        }
    }

    /// What a watcher thread holds to signal it while the handler thread reads its reply.
    fn signaller(&self) -> io::Result<Signaller> {
        match self {
            Proc::Spawned(child) => Ok(Signaller::Group(child.id())),
            Proc::Forked(forked) => forked.try_clone().map(Signaller::Forked),
        }
    }
}

/// A child's process group, as a thread other than the handler's signals it.
enum Signaller {
    /// A spawned child's group, by its id (the child's pid, not reaped meanwhile).
    Group(u32),
    /// A forked child, signalled while it lives.
    Forked(Forked),
}

impl Signaller {
    fn pid(&self) -> u32 {
        match self {
            Signaller::Group(pid) => *pid,
            Signaller::Forked(forked) => forked.pid(),
        }
    }

    fn signal(&self, sig: Signal) {
        match self {
            Signaller::Group(pid) => signal(*pid, sig),
            Signaller::Forked(forked) => forked.signal(sig),
        }
    }
}

#[derive(Serialize)]
struct Request<'a> {
    batch: Vec<RequestTask<'a>>,
}

#[derive(Serialize)]
struct RequestTask<'a> {
    id: &'a str,
    payload: Box<RawValue>,
    attempt: u32,
}

#[derive(Deserialize)]
struct Reply {
    /// Each entry decoded on its own: one entry the slot cannot read fails its task
    /// alone, not the batch-mates the child finished.
    results: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct ReplyEntry {
    id: String,
    #[serde(flatten)]
    status: ReplyStatus,
}

/// Just the id of an entry whose status does not decode.
#[derive(Deserialize)]
struct EntryId {
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
fn whole_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
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
fn reason_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
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
fn done_outcome(result: Option<serde_json::Value>, next: Vec<ReplyFollowUp>) -> Outcome {
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

/// Why a batch could not be exchanged with the child: after any of these the child is no
/// longer trusted to be in step and is restarted.
#[derive(Debug, thiserror::Error)]
enum ChildError {
    /// The configured command is empty (config validation forbids it; kept for safety).
    #[error("the command is empty")]
    EmptyCommand,
    /// The program could not be started.
    #[error("cannot start {command:?}: {source}")]
    Start {
        /// The command as configured.
        command: Vec<String>,
        /// What the OS said.
        source: io::Error,
    },
    /// The thread that forwards the child's stderr could not be started.
    #[error("cannot start the stderr thread for {pid}: {source}")]
    StderrThread {
        /// The child, killed again.
        pid: u32,
        /// What the OS said.
        source: io::Error,
    },
    /// The request could not be encoded.
    #[error("cannot encode: {0}")]
    Encode(serde_json::Error),
    /// Writing the request failed.
    #[error("cannot write to the child: {0}")]
    Write(io::Error),
    /// Reading the reply failed.
    #[error("cannot read from the child: {0}")]
    Read(io::Error),
    /// Stdout closed before a reply.
    #[error("the child closed its stdout without replying")]
    ClosedBeforeReply,
    /// Stdout closed inside a reply.
    #[error("the child closed its stdout in the middle of a reply")]
    ClosedInReply,
    /// The reply was too long or not a reply.
    #[error(transparent)]
    Reply(#[from] ReplyError),
    /// The child could not be forked (`start = "fork"`).
    #[error(transparent)]
    Fork(#[from] ForkError),
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
fn request_payload(task: &Task, max_payload: u64) -> Result<Box<RawValue>, Outcome> {
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
fn json_string(payload: &[u8]) -> Box<RawValue> {
    to_raw(&String::from_utf8_lossy(payload))
}

fn to_raw(value: &(impl Serialize + ?Sized)) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).expect("a JSON value or string always serialises")
}

impl Exec {
    /// Starts the child: spawned (`start = "spawn"`) or forked by the queue's language
    /// zygote (`start = "fork"`); its stderr forwarded to the slot's log by a thread.
    fn spawn(&mut self, ctx: &SlotContext) -> Result<Running, ChildError> {
        let (process, stdin, stdout, stderr) = match self.start {
            Start::Spawn => self.spawn_command(ctx)?,
            Start::Fork => {
                let line = ctx.fork_line.as_deref().ok_or(ForkError::NoLine)?;
                let env = [
                    ("GAFFER_QUEUE", ctx.queue.name.clone()),
                    ("GAFFER_SLOT", ctx.slot.to_string()),
                ];
                let env = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                let (
                    forked,
                    Streams {
                        stdin,
                        stdout,
                        stderr,
                    },
                ) = Forked::start(line, env)?;
                (Proc::Forked(forked), stdin, stdout, stderr)
            }
        };
        let pid = process.id();
        let (queue, slot) = (ctx.queue.name.clone(), ctx.slot);
        // The log the slot's thread writes to, which a thread does not inherit.
        let log = tracing::dispatcher::get_default(|d| d.clone());
        let (read_to_end, open) = mpsc::channel::<()>();
        let forwarder = std::thread::Builder::new()
            .name(format!("exec-stderr-{pid}"))
            .spawn(move || {
                let _read_to_end = read_to_end;
                tracing::dispatcher::with_default(&log, || {
                    forward_stderr(stderr, &queue, slot, pid)
                })
            });
        if let Err(source) = forwarder {
            let mut process = process;
            process.signal(Signal::SIGKILL);
            let _ = process.reap();
            return Err(ChildError::StderrThread { pid, source });
        }
        self.stderr_open
            .retain(|rx| matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)));
        self.stderr_open.push(open);
        if let Proc::Forked(_) = process {
            self.outside = ctx.outside().clone();
            self.outside.set(pid);
        }
        tracing::info!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot, pid,
            command = ?self.command, start = self.start.name(), "exec child started");
        Ok(Running {
            process,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    /// Spawns the command as the slot's own child. It is spawned from the calling
    /// thread, which must be the one the slot keeps for its handler all its life:
    /// PDEATHSIG fires when the spawning *thread* exits, not the process, so a child
    /// started from a short-lived thread would be killed with that thread.
    fn spawn_command(&self, ctx: &SlotContext) -> Result<(Proc, File, File, File), ChildError> {
        let (program, args) = self.command.split_first().ok_or(ChildError::EmptyCommand)?;
        let parent = std::process::id();
        let mut cmd = Command::new(program);
        cmd.args(args)
            // A URL given to gaffer in its environment may hold the Redis password: a
            // handler, which may run as another user, gets none of it.
            .env_remove("GAFFER_REDIS")
            .env(START_ENV, Start::Spawn.name())
            .env("GAFFER_QUEUE", &ctx.queue.name)
            .env("GAFFER_SLOT", ctx.slot.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own, which every signal the slot sends it goes to: a command
            // that starts its worker as a subprocess (`sh -c '…; …'`) has it stopped
            // too, where a signal to the child alone left it running, holding the reply
            // pipe (a cancel that never ended, a long task run twice).
            .process_group(0);
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
        let mut process = cmd.spawn().map_err(|source| ChildError::Start {
            command: self.command.clone(),
            source,
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) else {
            unreachable!("all three streams are piped");
        };
        let file = |fd: std::os::fd::OwnedFd| File::from(fd);
        Ok((
            Proc::Spawned(process),
            file(stdin.into()),
            file(stdout.into()),
            file(stderr.into()),
        ))
    }

    /// Kills and reaps the child, if any, so that none is left behind as a zombie or an
    /// orphan still holding the slot's resources.
    fn stop(&mut self) {
        let Some(mut running) = self.child.take() else {
            return;
        };
        let pid = running.process.id();
        self.outside.set(0);
        running.process.signal(Signal::SIGKILL);
        match running.process.reap() {
            Ok(status) => {
                tracing::debug!(target: "gaffer::exec", pid, %status, "exec child stopped")
            }
            Err(e) => tracing::warn!(target: "gaffer::exec", pid, "cannot reap exec child: {e}"),
        }
    }

    /// The running child, started anew if there is none or the last one has exited.
    fn running(&mut self, ctx: &SlotContext) -> Result<&mut Running, ChildError> {
        if let Some(running) = &mut self.child {
            match running.process.ended() {
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

    /// Sends a batch queue's batch and reads the reply (any error means the child can no
    /// longer be trusted to be in step with us), passing the slot's stop to the child as
    /// the stop line while the child has the batch ([`StopWriter`]).
    fn exchange_stoppable(
        &mut self,
        ctx: &SlotContext,
        request: &Request<'_>,
    ) -> Result<(Vec<Option<ReplyStatus>>, StopLine), ChildError> {
        // Taken out while the exchange borrows `self`, and put back after it.
        let writer = self
            .stop_writer
            .take()
            .unwrap_or_else(|| StopWriter::start(ctx));
        let r = self.send(ctx, request).and_then(|()| {
            let stdin = self
                .child
                .as_ref()
                .map(|r| r.stdin.as_fd().try_clone_to_owned());
            match stdin {
                Some(Ok(stdin)) => writer.batch_sent(ctx, File::from(stdin)),
                Some(Err(e)) => tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name,
                    slot = ctx.slot, "cannot keep the child's stdin for a stop line: {e}"),
                None => {}
            }
            self.receive(request)
        });
        let line = writer.batch_over();
        self.stop_writer = Some(writer);
        r.map(|statuses| (statuses, line))
    }

    /// Writes the batch line to the child (started first if need be).
    fn send(&mut self, ctx: &SlotContext, request: &Request<'_>) -> Result<(), ChildError> {
        self.running(ctx)?;
        self.send_started(request)
    }

    /// Writes the batch line to the child as it is, not reaped nor replaced if it exited
    /// (the write then fails): a watcher holding its pid must never signal another
    /// process that reused it.
    fn send_started(&mut self, request: &Request<'_>) -> Result<(), ChildError> {
        let running = self.child.as_mut().ok_or(ChildError::ClosedBeforeReply)?;
        // Compact JSON escapes control characters inside strings, so this is one line.
        let mut line = serde_json::to_vec(request).map_err(ChildError::Encode)?;
        line.push(b'\n');
        running
            .stdin
            .write_all(&line)
            .and_then(|()| running.stdin.flush())
            .map_err(ChildError::Write)
    }

    /// Reads the child's reply to `request`.
    fn receive(&mut self, request: &Request<'_>) -> Result<Vec<Option<ReplyStatus>>, ChildError> {
        let max_reply = self.max_reply;
        let running = self.child.as_mut().ok_or(ChildError::ClosedBeforeReply)?;
        // Bounded, so a child that writes without end (no newline) costs at most
        // `max_reply` bytes before it is called out of step and restarted.
        let mut reply = Vec::new();
        (&mut running.stdout)
            .take(max_reply as u64 + 1)
            .read_until(b'\n', &mut reply)
            .map_err(ChildError::Read)?;
        if reply.last() != Some(&b'\n') {
            return Err(if reply.len() > max_reply {
                ReplyError::TooLong(max_reply).into()
            } else if reply.is_empty() {
                ChildError::ClosedBeforeReply
            } else {
                ChildError::ClosedInReply
            });
        }
        // More than the reply line already read: stdout carries replies only, and a
        // line left over would be read as the next batch's reply.
        let leftover = !running.stdout.buffer().is_empty();
        let pid = running.process.id();
        let ids: Vec<&str> = request.batch.iter().map(|t| t.id).collect();
        let statuses = parse_reply(&reply, &ids)?;
        if leftover {
            tracing::warn!(target: "gaffer::exec", pid,
                "the exec child wrote more than its reply line on stdout (log to stderr instead); restarting it");
            // (stopped once the exchange is over: a long task's watcher may still hold
            // the child's pid until then)
            self.restart_after_reply = true;
        }
        Ok(statuses)
    }

    /// Sends a long queue's task and reads the reply, while a watcher thread stops
    /// the child when the slot asks ([`watch_stop`]): the handler thread is blocked
    /// reading the reply meanwhile, so the cancel line and the signals come from another.
    fn exchange_long(
        &mut self,
        ctx: &SlotContext,
        request: &Request<'_>,
    ) -> Result<Vec<Option<ReplyStatus>>, ChildError> {
        let running = self.running(ctx)?;
        let pid = running.process.id();
        let stdin = running.stdin.as_fd().try_clone_to_owned().map(File::from);
        let signaller = running.process.signaller();
        let id = request.batch.first().map_or("", |t| t.id);
        let done = AtomicBool::new(false);
        let done_flag = &done;
        std::thread::scope(|scope| {
            let watcher = match (stdin, signaller) {
                (Ok(stdin), Ok(signaller)) => std::thread::Builder::new()
                    .name(format!("exec-stop-{pid}"))
                    .spawn_scoped(scope, move || {
                        watch_stop(ctx, id, &signaller, stdin, done_flag)
                    })
                    .map(drop),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            if let Err(e) = watcher {
                tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot, pid,
                    "cannot watch the long task for a cancel: {e}; it runs until it returns");
            }
            // (the child `pid` names, which the watcher may signal)
            let r = self
                .send_started(request)
                .and_then(|()| self.receive(request));
            done.store(true, Ordering::Release);
            ctx.cancel.wake();
            r
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
        let HandlerConfig::Exec { command, start } = &queue.handler else {
            return Err(HandlerError::new("exec: queue is not configured as exec"));
        };
        Ok(Exec {
            command: command.clone(),
            start: *start,
            outside: OutsidePid::default(),
            child: None,
            max_reply: MAX_REPLY_BYTES,
            stderr_open: Vec::new(),
            stop_writer: None,
            failed_in_a_row: 0,
            last_failed: Vec::new(),
            restart_after_reply: false,
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

    /// A batch queue's slot asked to stop before the batch reached the child starts none
    /// of it; asked while the child has it, the child gets the stop line and the tasks
    /// its reply leaves out go back unstarted.
    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        if ctx.should_stop() {
            return Vec::new();
        }
        // Per task: decided here (Some) or sent to the child (None).
        let mut decided = Vec::with_capacity(batch.len());
        let mut request = Request {
            batch: Vec::with_capacity(batch.len()),
        };
        for task in batch {
            match request_payload(task, ctx.queue.max_payload) {
                Ok(payload) => {
                    decided.push(None);
                    request.batch.push(RequestTask {
                        id: &task.id,
                        payload,
                        attempt: task.attempt,
                    });
                }
                Err(outcome) => decided.push(Some(outcome)),
            }
        }
        if request.batch.is_empty() {
            return decided.into_iter().flatten().collect();
        }
        let exchanged = if ctx.queue.is_long() {
            self.exchange_long(ctx, &request)
                .map(|statuses| (statuses, StopLine::NotSent))
        } else {
            self.exchange_stoppable(ctx, &request)
        };
        let (statuses, line) = match exchanged {
            Ok(exchanged) => {
                self.failed_in_a_row = 0;
                self.last_failed.clear();
                if std::mem::take(&mut self.restart_after_reply) {
                    self.stop();
                }
                exchanged
            }
            Err(why) => {
                tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot,
                    pid = self.child.as_ref().map(|r| r.process.id()),
                    "exec batch failed: {why}; the child will be restarted");
                self.stop();
                let reason = format!("exec: {why}");
                let ids: Vec<String> = request.batch.iter().map(|t| t.id.to_owned()).collect();
                let again = ids.iter().any(|id| self.last_failed.contains(id));
                self.failed_in_a_row = if again { 1 } else { self.failed_in_a_row + 1 };
                self.last_failed = ids;
                if self.failed_in_a_row >= GIVE_UP_AFTER && !ctx.queue.is_long() {
                    return give_up(ctx, decided, &reason, self.failed_in_a_row);
                }
                return decided
                    .into_iter()
                    .map(|d| {
                        d.unwrap_or_else(|| Outcome::Fail {
                            reason: reason.clone(),
                        })
                    })
                    .collect();
            }
        };
        let (outcomes, unstarted) = outcomes(ctx, batch, decided, statuses, line);
        if !unstarted.is_empty() {
            ctx.stop.leave_unstarted(unstarted);
        }
        outcomes
    }

    /// The child's orderly end: end of input, 5 s, SIGTERM, 2 s, SIGKILL to its group.
    fn close(&mut self) {
        self.close_child();
    }
}

/// The outcomes of a batch the slot gives up on (see [`GIVE_UP_AFTER`]): those decided
/// before sending stand; the tasks sent to the child go back unstarted.
fn give_up(ctx: &SlotContext, decided: Vec<Option<Outcome>>, why: &str, n: u32) -> Vec<Outcome> {
    let reason = format!("{why}, {n} batches in a row: giving up (the slot exits as crashed)");
    tracing::error!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot,
        "{reason}; the batch goes back unstarted");
    let sent: Vec<usize> = (0..decided.len())
        .filter(|&i| decided[i].is_none())
        .collect();
    ctx.stop.leave_unstarted(sent);
    ctx.stop.give_up(reason.clone());
    decided
        .into_iter()
        .map(|d| {
            d.unwrap_or_else(|| Outcome::Fail {
                reason: reason.clone(),
            })
        })
        .collect()
}

/// The batch's outcomes, in order, from those decided before sending (`decided`) and the
/// child's reply for the rest (`statuses`, in request order); and, after the stop line,
/// the positions of the tasks the reply left out, which were not started (each with a
/// placeholder outcome).
fn outcomes(
    ctx: &SlotContext,
    batch: &[Task],
    decided: Vec<Option<Outcome>>,
    statuses: Vec<Option<ReplyStatus>>,
    line: StopLine,
) -> (Vec<Outcome>, Vec<usize>) {
    let mut statuses = statuses.into_iter();
    let mut unstarted = Vec::new();
    let outcomes = batch
        .iter()
        .zip(decided)
        .enumerate()
        .map(|(i, (task, decided))| {
            if let Some(outcome) = decided {
                return outcome;
            }
            match statuses.next().flatten() {
                None if line == StopLine::Sent => {
                    unstarted.push(i);
                    Outcome::Fail {
                        reason: "exec: not started before the stop".to_owned(),
                    }
                }
                status => reply_outcome(status, task, &ctx.queue),
            }
        })
        .collect();
    (outcomes, unstarted)
}

/// One task's outcome from its reply entry; a task the reply leaves out failed.
fn reply_outcome(status: Option<ReplyStatus>, task: &Task, queue: &QueueConfig) -> Outcome {
    match status {
        Some(ReplyStatus::Ok { result, next }) => done_outcome(result, next),
        Some(ReplyStatus::Retry { delay_ms }) => Outcome::Retry {
            delay: delay_ms
                .map(Duration::from_millis)
                .unwrap_or_else(|| queue.retry.delay(task.attempt)),
            reason: "retry requested by handler".to_owned(),
        },
        Some(ReplyStatus::Fail { error }) => Outcome::Fail {
            reason: error.unwrap_or_else(|| "failed".to_owned()),
        },
        Some(ReplyStatus::Unreadable { reason }) => Outcome::Fail { reason },
        None => Outcome::Fail {
            reason: "exec: no result for this task".to_owned(),
        },
    }
}

impl Exec {
    /// Ends the child as a program reading requests expects at the slot's orderly end:
    /// its stdin closes (end of input), it has [`EXIT_GRACE`] to exit, then SIGTERM and
    /// [`KILL_AFTER_TERM`], then SIGKILL. Whatever it started in its group is killed
    /// once it exited, before it is reaped (the group's id is its pid until then).
    fn close_child(&mut self) {
        // The stop writer's copy of stdin would keep the end of input from the child.
        self.stop_writer = None;
        let Some(Running {
            mut process,
            stdin,
            mut stdout,
        }) = self.child.take()
        else {
            self.await_stderr();
            return;
        };
        drop(stdin);
        self.outside.set(0);
        // Read to its end and dropped: a child that writes at the end of its input must
        // neither die of SIGPIPE nor block on a full pipe for it.
        let _ = std::thread::Builder::new()
            .name("exec-stdout-drain".into())
            .spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let pid = process.id();
        let mut how = "exited at the end of its input";
        let mut exited = process.exited_within(EXIT_GRACE);
        for (sig, wait) in [
            (Signal::SIGTERM, KILL_AFTER_TERM),
            (Signal::SIGKILL, Duration::MAX),
        ] {
            if exited {
                break;
            }
            tracing::info!(target: "gaffer::exec", pid, signal = %sig,
                "the exec child has not exited since its input ended");
            process.signal(sig);
            how = if sig == Signal::SIGTERM {
                "stopped by SIGTERM"
            } else {
                "killed"
            };
            exited = process.exited_within(wait);
        }
        process.signal_group_left(Signal::SIGKILL);
        match process.reap() {
            Ok(status) => {
                tracing::debug!(target: "gaffer::exec", pid, %status, how, "exec child ended")
            }
            Err(e) => tracing::warn!(target: "gaffer::exec", pid, "cannot reap exec child: {e}"),
        }
        self.await_stderr();
    }

    /// Waits until every child's stderr is logged to its end, [`STDERR_FLUSH`] at most.
    fn await_stderr(&mut self) {
        let deadline = Instant::now() + STDERR_FLUSH;
        for open in self.stderr_open.drain(..) {
            let left = deadline.saturating_duration_since(Instant::now());
            // (nothing is ever sent: the end is the sender's drop)
            if open.recv_timeout(left) == Err(mpsc::RecvTimeoutError::Timeout) {
                tracing::debug!(target: "gaffer::exec",
                    "an exec child's stderr is still open at the slot's end; not waiting for it");
            }
        }
    }
}

/// Whether the child `pid` exits within `wait` (it is not reaped: its pid, and so its
/// group's id, stay its own). An error asking counts as exited: there is no child to wait
/// for.
fn exited_within(pid: u32, wait: Duration) -> bool {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    let deadline = Instant::now().checked_add(wait);
    // Polled: a child's exit comes as SIGCHLD, which belongs to the slot's runtime.
    let mut pause = Duration::from_millis(1);
    loop {
        match waitid(Id::Pid(Pid::from_raw(pid as i32)), flags) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(_) | Err(_) => return true,
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.close_child();
    }
}

/// Stops a long task's child when the slot asks, until the exchange is over (`done`): at
/// once with SIGKILL when the lease could not be kept ([`Stop::Now`]); after a cancel, the
/// line `{"cancel": "ID"}` first, SIGTERM after the queue's `cancel_grace`, SIGKILL
/// [`KILL_AFTER_TERM`] later. The child is reaped only after this ends, so its pid cannot
/// have been reused meanwhile.
fn watch_stop(ctx: &SlotContext, id: &str, child: &Signaller, mut stdin: File, done: &AtomicBool) {
    let pid = child.pid();
    let c = &ctx.cancel;
    let over = || done.load(Ordering::Acquire);
    let stop = c.wait_past(Stop::Run, None, done);
    if over() {
        return;
    }
    if stop == Stop::Now {
        return child.signal(Signal::SIGKILL);
    }
    let line = format!("{}\n", serde_json::json!({ "cancel": id }));
    if let Err(e) = stdin
        .write_all(line.as_bytes())
        .and_then(|()| stdin.flush())
    {
        tracing::warn!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot, pid,
            "cannot write the cancel line: {e}");
    }
    for (wait, sig) in [
        (ctx.queue.cancel_grace, Signal::SIGTERM),
        (KILL_AFTER_TERM, Signal::SIGKILL),
    ] {
        let stop = c.wait_past(Stop::Cancel, Some(Instant::now() + wait), done);
        if over() {
            return;
        }
        if stop == Stop::Now {
            return child.signal(Signal::SIGKILL);
        }
        tracing::info!(target: "gaffer::exec", queue = %ctx.queue.name, slot = ctx.slot, pid,
            task = id, signal = %sig, "the cancelled long task has not stopped");
        child.signal(sig);
    }
}

/// Sends `sig` to the child's process group (the child and what it started); one that
/// is already gone needs nothing. The group's id is the child's pid, which cannot have
/// been reused while the child is not reaped (this slot reaps it).
fn signal(pid: u32, sig: Signal) {
    if let Err(e) = kill(Pid::from_raw(-(pid as i32)), sig) {
        tracing::debug!(target: "gaffer::exec", pid, "cannot send {sig}: {e}");
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
        let script =
            format!("import sys\nfor line in sys.stdin:\n    print({reply:?}, flush=True)\n");
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
        let line = br#"{"results":[{"id":"a","status":"retry","delay_ms":1500.0},{"id":"b","status":"ok","next":[{"queue":"q","delay":"5m"}]},{"id":"c","status":"fail","error":{"code":3}},{"id":"d","status":"retry","delay_ms":1.5}]}"#;
        let got = parse_reply(line, &["a", "b", "c", "d"]).unwrap();
        assert_eq!(
            got[0],
            Some(ReplyStatus::Retry {
                delay_ms: Some(1500)
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
                Some(ReplyStatus::Retry { delay_ms: Some(5) })
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
}
