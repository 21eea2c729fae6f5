//! The handler API: what a team implements to run its own code in gaffer's slots.
//!
//! Neutral ground between the roles of a host: the zygote preloads handlers through the
//! [`Registry`], the master asks it which queues this host can serve, and a slot runs
//! [`Handler::init`] and [`Handler::handle`]. Public as `gaffer::slot::{Handler, …}`.
//!
//! What it holds: [`Handler`] (`preload` once in the zygote, `init` once in the slot,
//! `handle` per batch, `close` when the slot ends), [`Task`], [`Outcome`], [`SlotContext`]
//! (with `should_stop`, the slot's stop as a batch handler sees it, and `is_cancelled`, a
//! long task's cancel) and the [`Registry`], handler name → handler.
//!
//! Payloads are untrusted bytes: `Task::json` refuses nesting deeper than 64 before
//! parsing, and a handler answers such a task with `Outcome::Reject` (ARCHITECTURE.md,
//! invariant 25).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::{Handler as HandlerConfig, QueueConfig};

/// Largest JSON nesting [`Task::json`] accepts; deeper payloads are refused, not parsed.
/// Defined in config beside the other limits, since the api checks it too.
pub use crate::config::MAX_JSON_DEPTH;

/// One leased task as a handler sees it: no lease token, nothing it could settle with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The task id, unique within its queue.
    pub id: String,
    /// 1 on the first attempt; goes up each time the task is taken again.
    pub attempt: u32,
    /// The payload as enqueued: opaque bytes, JSON by convention.
    pub payload: Vec<u8>,
}

impl Task {
    /// The payload parsed as JSON, refusing nesting deeper than [`MAX_JSON_DEPTH`] before
    /// the parser recurses into it.
    pub fn json(&self) -> Result<serde_json::Value, PayloadError> {
        check_json_depth(&self.payload, MAX_JSON_DEPTH)?;
        serde_json::from_slice(&self.payload).map_err(|e| PayloadError::NotJson(e.to_string()))
    }
}

/// Why a payload was refused or could not be decoded. Payloads are untrusted input; a
/// handler usually answers these with [`Outcome::Reject`], and the slot itself rejects
/// [`PayloadError::TooLarge`] ones before they reach a handler.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// The payload is larger than the queue's `max_payload`.
    #[error("payload of {} exceeds max_payload {}", human_size(*size, *limit), human_size(*limit, *size))]
    TooLarge {
        /// The payload's size in bytes.
        size: u64,
        /// The queue's `max_payload` in bytes.
        limit: u64,
    },
    /// The payload is not valid JSON.
    #[error("payload is not valid JSON: {0}")]
    NotJson(String),
    /// Brackets nest deeper than the limit.
    #[error("payload nested deeper than {0} levels")]
    TooDeep(usize),
}

/// `bytes` for a message beside `other`: in binary units, or in exact bytes when the two
/// would round to the same text ("1.0 MiB exceeds 1.0 MiB" would explain nothing).
fn human_size(bytes: u64, other: u64) -> String {
    let (b, o) = (bytesize::ByteSize(bytes), bytesize::ByteSize(other));
    if b.to_string() == o.to_string() {
        format!("{bytes} B")
    } else {
        b.to_string()
    }
}

/// Refuses a payload larger than `max_payload`. Enqueue already refuses them; this catches
/// those that got in anyway (another client, a limit lowered since), before anything
/// parses or copies them further.
pub fn check_payload_size(payload: &[u8], max_payload: u64) -> Result<(), PayloadError> {
    let size = payload.len() as u64;
    if size > max_payload {
        return Err(PayloadError::TooLarge {
            size,
            limit: max_payload,
        });
    }
    Ok(())
}

/// Scans brackets outside strings; cheap, and keeps a hostile payload from recursing the
/// parser.
pub fn check_json_depth(bytes: &[u8], limit: usize) -> Result<(), PayloadError> {
    if crate::queue_client::json_deeper_than(bytes, limit) {
        return Err(PayloadError::TooDeep(limit));
    }
    Ok(())
}

/// What became of one task; a handler returns one per task, in batch order.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Finished: the task is deleted; what it returned is kept in its record.
    Done(Done),
    /// A foreseen postponement: try again after `delay` (counts as an attempt).
    Retry {
        /// How long the task waits before it can be taken again, at most
        /// `queue_client::MAX_DELAY` (a longer one is cut to it).
        delay: Duration,
        /// The priority it comes back at; `None`: the queue's `retry.priority`, else its
        /// own.
        priority: Option<i32>,
        /// Recorded as the task's last error.
        reason: String,
    },
    /// Failed: tried again after the queue's retry policy delay, dead-lettered once
    /// `max_attempts` is reached.
    Fail {
        /// Recorded as the task's last error.
        reason: String,
    },
    /// Can never succeed (e.g. an undecodable payload): dead-lettered at once.
    Reject {
        /// Recorded as the task's last error.
        reason: String,
    },
}

impl Outcome {
    /// Finished, with nothing to return.
    pub fn done() -> Outcome {
        Outcome::Done(Done::default())
    }

    /// Finished, returning `result`: kept in the task's record for whoever submitted it
    /// (the queue's `max_result` bounds its JSON text; a larger one fails the task).
    pub fn done_with(result: serde_json::Value) -> Outcome {
        Outcome::Done(Done {
            result: Some(result),
            next: Vec::new(),
        })
    }

    /// Adds a follow-up task to a finished task: `payload` enqueued on `queue` as the
    /// next step of its chain, before this task is acked (see [`FollowUp`]). On any
    /// outcome but [`Outcome::Done`] it does nothing: only a finished task has follow-ups
    /// of its own (a queue's `on = "failed"` routes come from its config).
    pub fn then(mut self, queue: impl Into<String>, payload: serde_json::Value) -> Outcome {
        if let Outcome::Done(done) = &mut self {
            done.next.push(FollowUp {
                queue: queue.into(),
                payload,
            });
        }
        self
    }
}

/// What a finished task leaves behind.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Done {
    /// The result, as JSON; `None` keeps no result.
    pub result: Option<serde_json::Value>,
    /// Follow-up tasks the handler adds, after those of the queue's `next` routes.
    pub next: Vec<FollowUp>,
}

/// A task a finished task creates as the next step of its chain. It is enqueued before
/// its parent is acked, with an id derived from the parent's, so a slot that dies in
/// between creates it once (the enqueue of the re-run parent finds it) and loses none.
/// A queue the config does not name fails the parent, with a reason saying so.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowUp {
    /// The queue it goes to.
    pub queue: String,
    /// Its payload (for a queue's `next` route: the parent's result).
    pub payload: serde_json::Value,
}

/// An error from `preload` or `init`; the slot logs it and exits with a crash code.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

impl HandlerError {
    /// An error with this message.
    pub fn new(message: impl fmt::Display) -> Self {
        Self(message.to_string())
    }
}

/// What a handler knows about the slot it runs in.
pub struct SlotContext {
    /// The queue this slot serves.
    pub queue: QueueConfig,
    /// The slot's number on its host, unique among the master's running slots.
    pub slot: u32,
    pub(crate) progress: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Set by the slot when the long task in hand must stop.
    pub(crate) cancel: Cancellation,
    /// Set by the slot when it must stop: the batch in hand is cut short.
    pub(crate) stop: SlotStop,
    /// A process working for the slot outside its own process tree, whose tree counts
    /// as the slot's memory: a `start = "fork"` exec child, forked by its language's
    /// zygote rather than by the slot. 0 when there is none.
    pub(crate) outside: OutsidePid,
    /// The line to gaffer's zygote on which a `start = "fork"` exec handler asks for its
    /// child; none outside a master.
    pub(crate) fork_line: Option<Arc<crate::host::fork::ForkLine>>,
}

/// The pid of a slot's process outside its own tree ([`SlotContext`]), set by the
/// handler thread and read by the slot between batches.
#[derive(Debug, Clone, Default)]
pub struct OutsidePid(Arc<std::sync::atomic::AtomicU32>);

impl OutsidePid {
    /// Names the process (0: none any more).
    pub fn set(&self, pid: u32) {
        self.0.store(pid, std::sync::atomic::Ordering::Relaxed);
    }

    /// The process, if there is one.
    pub fn get(&self) -> Option<u32> {
        Some(self.0.load(std::sync::atomic::Ordering::Relaxed)).filter(|&p| p != 0)
    }
}

impl SlotContext {
    /// A context outside any master, for tests and tools that drive a handler directly.
    pub fn detached(queue: QueueConfig, slot: u32) -> Self {
        Self {
            queue,
            slot,
            progress: None,
            cancel: Cancellation::default(),
            stop: SlotStop::default(),
            outside: OutsidePid::default(),
            fork_line: None,
        }
    }

    /// Where a handler that runs its work in a process outside the slot's own process
    /// tree (not its child: a forked exec child, a process a service started for it)
    /// names that process, so that its memory counts as the slot's: in the host's
    /// budget and against the queue's `private_dirty_limit`.
    pub fn outside(&self) -> &OutsidePid {
        &self.outside
    }

    /// Whether the slot was asked to stop (its queue shrank, its host drains, its master
    /// stops) while a batch queue's batch is in hand. A handler that works its batch task
    /// by task looks at this between tasks and, once it is true, returns the outcomes of
    /// the tasks it finished so far: a prefix of the batch. The slot settles those and
    /// gives the rest back to the queue at once, unstarted, with no attempt counted.
    /// Once true it stays true (the slot exits after this batch). Never true in a long
    /// queue, whose stop is [`is_cancelled`](Self::is_cancelled).
    pub fn should_stop(&self) -> bool {
        self.stop.is_asked()
    }

    /// Whether the long task in hand must stop: an operator cancelled it, or the slot
    /// could not renew its lease (then the slot does not wait for the handler long). A
    /// handler of a long queue looks at this between steps of its work and returns soon
    /// after it turns true; its outcome is then unused. Never true in a batch queue.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.stop() != Stop::Run
    }

    /// Waits up to `timeout` for the task in hand to be cancelled; true when it was.
    /// A long task's handler can wait here instead of sleeping between steps.
    pub fn wait_cancelled(&self, timeout: Duration) -> bool {
        let never = AtomicBool::new(false);
        self.cancel
            .wait_past(Stop::Run, Some(Instant::now() + timeout), &never)
            != Stop::Run
    }

    /// Tells the master the slot is alive and working. A batch that legitimately runs
    /// longer than the queue's `max_batch_time` calls this now and then, or the master
    /// kills the slot as hung.
    pub fn progress(&self) {
        if let Some(p) = &self.progress {
            p();
        }
    }
}

/// The slot's stop as a batch queue's handler sees it, shared by the slot (which asks)
/// and the handler thread (which polls it between tasks, or waits for it: the exec
/// handler's stop line). Asked at most once and never withdrawn: a slot asked to stop
/// exits after the batch in hand.
#[derive(Clone, Default)]
pub(crate) struct SlotStop {
    inner: Arc<SlotStopInner>,
}

#[derive(Default)]
struct SlotStopInner {
    /// Whether the stop was asked: read per task by handlers, so an atomic, set while
    /// holding `lock` so no waiter misses it.
    asked: AtomicBool,
    /// Held to set `asked` and to wait for it.
    lock: Mutex<()>,
    /// Notified when the stop is asked, and by [`SlotStop::wake`].
    changed: Condvar,
    /// Positions in the batch in hand of tasks the handler did not start though it
    /// returned an outcome in their place (an exec child's reply after the stop line
    /// covers any subset of the batch, not only a prefix).
    unstarted: Mutex<Vec<usize>>,
    /// Why the handler gave up (see [`SlotStop::give_up`]), once it did.
    given_up: Mutex<Option<String>>,
}

impl SlotStop {
    fn lock(&self) -> MutexGuard<'_, ()> {
        // A poisoned lock guards nothing that could be left half-changed.
        self.inner.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the handler to stop after the task in hand.
    pub(crate) fn ask(&self) {
        let _held = self.lock();
        self.inner.asked.store(true, Ordering::Release);
        self.inner.changed.notify_all();
    }

    /// Whether the stop was asked.
    pub(crate) fn is_asked(&self) -> bool {
        self.inner.asked.load(Ordering::Acquire)
    }

    /// Waits until the stop is asked or `done` is set (and [`wake`](Self::wake) called);
    /// true when it was asked.
    pub(crate) fn wait(&self, done: &AtomicBool) -> bool {
        let mut held = self.lock();
        while !self.is_asked() && !done.load(Ordering::Acquire) {
            held = self
                .inner
                .changed
                .wait(held)
                .unwrap_or_else(|p| p.into_inner());
        }
        self.is_asked()
    }

    /// Wakes the waiters of [`wait`](Self::wait), so they look at their `done` flag;
    /// whoever sets the flag calls this after setting it.
    pub(crate) fn wake(&self) {
        let _held = self.lock();
        self.inner.changed.notify_all();
    }

    /// Says which positions of the batch in hand the handler did not start, though its
    /// outcomes hold a placeholder for them.
    pub(crate) fn leave_unstarted(&self, positions: Vec<usize>) {
        *self
            .inner
            .unstarted
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = positions;
    }

    /// The handler cannot go on (an exec child that fails every batch): the stop is
    /// asked, so the positions it leaves unstarted go back to the queue unstarted, and
    /// the slot exits as crashed after this batch, so its master backs off and counts it.
    pub(crate) fn give_up(&self, reason: String) {
        *self
            .inner
            .given_up
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(reason);
        self.ask();
    }

    /// Why the handler gave up, if it did.
    pub(crate) fn given_up(&self) -> Option<String> {
        self.inner
            .given_up
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The positions [`leave_unstarted`](Self::leave_unstarted) gave for the batch just
    /// handled, cleared for the next one.
    pub(crate) fn take_unstarted(&self) -> Vec<usize> {
        std::mem::take(
            &mut *self
                .inner
                .unstarted
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }
}

/// How far a long task's stop has gone; later kinds order after earlier ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stop {
    /// Running: nothing asked.
    Run,
    /// An operator cancelled it: an exec child gets the cancel line, SIGTERM after the
    /// queue's `cancel_grace`, then SIGKILL.
    Cancel,
    /// The slot could not renew its lease: the task must be gone at once, before the
    /// lease could be handed to another slot.
    Now,
}

/// The stop of the long task in hand, shared by the slot (which asks) and the handler
/// thread (which waits for it, or polls it between steps of its work).
#[derive(Clone, Default)]
pub(crate) struct Cancellation {
    inner: Arc<(Mutex<Option<Stop>>, Condvar)>,
}

impl Cancellation {
    fn state(&self) -> MutexGuard<'_, Option<Stop>> {
        // A poisoned lock still holds a valid stop: nothing panics while holding it.
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How far the stop has gone.
    pub(crate) fn stop(&self) -> Stop {
        self.state().unwrap_or(Stop::Run)
    }

    /// Asks the task to stop as `stop` says; never goes back to a milder stop.
    pub(crate) fn ask(&self, stop: Stop) {
        let mut s = self.state();
        *s = Some(s.unwrap_or(Stop::Run).max(stop));
        self.inner.1.notify_all();
    }

    /// Clears the stop before the next task.
    pub(crate) fn reset(&self) {
        *self.state() = None;
    }

    /// Wakes the waiters of [`wait_past`](Self::wait_past), so they look at their `done`
    /// flag; whoever sets the flag calls this after setting it.
    pub(crate) fn wake(&self) {
        let _s = self.state();
        self.inner.1.notify_all();
    }

    /// Waits until the stop goes past `past`, `deadline` passes or `done` is set (and
    /// [`wake`](Self::wake) called); returns the stop as it then is.
    pub(crate) fn wait_past(
        &self,
        past: Stop,
        deadline: Option<Instant>,
        done: &AtomicBool,
    ) -> Stop {
        let mut s = self.state();
        loop {
            let stop = s.unwrap_or(Stop::Run);
            if stop > past || done.load(Ordering::Acquire) {
                return stop;
            }
            s = match deadline {
                None => self.inner.1.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return stop;
                    }
                    self.inner
                        .1
                        .wait_timeout(s, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }
}

impl fmt::Debug for SlotContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotContext")
            .field("queue", &self.queue.name)
            .field("slot", &self.slot)
            .finish()
    }
}

/// The code that handles a queue's tasks.
///
/// The life of a handler: [`Handler::preload`] builds it once in the host's zygote, before
/// any fork, so whatever it loads there (code, models, lookup tables) is shared
/// copy-on-write by every slot of the host; each slot then calls [`Handler::init`] once
/// after the fork (open connections here, never in `preload`), and [`Handler::handle`] once
/// per batch. `handle` runs on its own thread, so it may block; a panic in it fails only
/// that batch.
pub trait Handler: Send + 'static {
    /// Builds the handler in the zygote for one queue. Must not start threads or open
    /// connections: the zygote stays single-threaded so that it can fork.
    fn preload(queue: &QueueConfig) -> Result<Self, HandlerError>
    where
        Self: Sized;

    /// Runs once in each slot after the fork, before the first batch.
    fn init(&mut self, _ctx: &SlotContext) -> Result<(), HandlerError> {
        Ok(())
    }

    /// Handles one batch; returns one outcome per task, in the same order. A task
    /// without an outcome (a short vector) is retried after the policy delay, unless
    /// the slot was asked to stop ([`SlotContext::should_stop`]): then a short vector
    /// is the prefix of the batch the handler finished, and the tasks after it go back
    /// to the queue unstarted, with no attempt counted. A handler that cannot stop early
    /// simply ignores the stop and returns the whole batch's outcomes, as before.
    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome>;

    /// Runs once when the slot ends on its own (stopped, scaled down, recycled, or after
    /// an error it exits on) with no batch in the handler, on the handler's thread: flush
    /// and close what `init` opened. The slot waits for it (a few seconds at most) before
    /// it exits. In a forked slot the handler is not dropped afterwards (`Drop` does not
    /// run): the process exits, and freeing what `preload` built would only write to
    /// memory shared with the zygote. Not called when the slot is killed.
    fn close(&mut self) {}
}

type Preload = fn(&QueueConfig) -> Result<Box<dyn Handler>, HandlerError>;

fn preload_boxed<H: Handler>(queue: &QueueConfig) -> Result<Box<dyn Handler>, HandlerError> {
    Ok(Box::new(H::preload(queue)?))
}

/// Handler implementations by the name `handler = "…"` uses. [`Registry::builtin`] has
/// gaffer's own; a team's binary adds its handlers and passes the registry to
/// [`crate::cli::run`].
#[derive(Clone)]
pub struct Registry {
    handlers: BTreeMap<String, Preload>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.handlers.keys()).finish()
    }
}

impl Registry {
    /// Adds a handler under `name`, used as `handler = "name"` in the config with its
    /// settings in the queue's `options` table.
    ///
    /// # Panics
    /// If `name` is a built-in handler's name or already registered: a programming error
    /// in the team's `main`.
    pub fn register<H: Handler>(mut self, name: &str) -> Self {
        assert!(
            !HandlerConfig::NAMES.contains(&name) && !self.handlers.contains_key(name),
            "handler `{name}` is already registered"
        );
        self.handlers.insert(name.to_owned(), preload_boxed::<H>);
        self
    }

    /// Adds a handler under one of the built-in names, which [`Registry::register`]
    /// refuses to a team: for [`Registry::builtin`], written beside the built-in handlers.
    pub(crate) fn with_builtin<H: Handler>(mut self, name: &str) -> Self {
        self.handlers.insert(name.to_owned(), preload_boxed::<H>);
        self
    }

    /// A registry with no handler at all.
    pub(crate) fn empty() -> Self {
        Self {
            handlers: BTreeMap::new(),
        }
    }

    /// Every name this registry can run, as the host advertises them.
    pub fn names(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    /// The names beyond the built-in ones, for [`crate::config::parse_with`].
    pub fn custom_names(&self) -> Vec<String> {
        self.handlers
            .keys()
            .filter(|n| !HandlerConfig::NAMES.contains(&n.as_str()))
            .cloned()
            .collect()
    }

    /// Whether this registry can run the queue's handler.
    pub fn supports(&self, queue: &QueueConfig) -> bool {
        self.handlers.contains_key(queue.handler.name())
    }

    /// Runs the queue handler's `preload`.
    pub fn preload(&self, queue: &QueueConfig) -> Result<Box<dyn Handler>, HandlerError> {
        let name = queue.handler.name();
        let preload = self.handlers.get(name).ok_or_else(|| {
            HandlerError::new(format!("no handler named `{name}` in this binary"))
        })?;
        preload(queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_depth_is_checked_outside_strings() {
        assert!(check_json_depth(br#"{"a":"[[[[[[[["}"#, 2).is_ok());
        assert!(check_json_depth(br#"[[["#, 2).is_err());
        assert!(check_json_depth(br#"{"a":"\"[[["}"#, 1).is_ok());
        let deep = "[".repeat(100_000);
        let task = Task {
            id: "x".into(),
            attempt: 1,
            payload: deep.into_bytes(),
        };
        assert_eq!(task.json(), Err(PayloadError::TooDeep(MAX_JSON_DEPTH)));
        assert_eq!(
            PayloadError::TooDeep(64).to_string(),
            "payload nested deeper than 64 levels"
        );
    }

    #[test]
    fn an_oversized_payload_is_refused_naming_both_sizes() {
        assert_eq!(check_payload_size(&[0; 1000], 1000), Ok(()));
        let too_large = |size: u64, limit| PayloadError::TooLarge { size, limit }.to_string();
        assert_eq!(
            check_payload_size(&[0; 1001], 1000)
                .unwrap_err()
                .to_string(),
            too_large(1001, 1000)
        );
        assert_eq!(
            too_large(12_900_000, 1 << 20),
            "payload of 12.3 MiB exceeds max_payload 1.0 MiB"
        );
        // Sizes that round to the same text are given in bytes.
        assert_eq!(
            too_large((1 << 20) + 1, 1 << 20),
            "payload of 1048577 B exceeds max_payload 1048576 B"
        );
    }
}
