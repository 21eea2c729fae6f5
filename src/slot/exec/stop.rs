//! The lines the slot writes to an exec child while the handler thread waits for its
//! reply: a batch queue's stop line (a [`StopWriter`] thread) and a long task's cancel
//! line and signals ([`watch_stop`]).
//!
//! The stop line: a slot asked to stop while the handler holds a batch writes `{"stop":
//! true}` on the child's stdin, from a [`StopWriter`] thread, since the handler thread is
//! blocked on the reply. The tasks the reply then leaves out are named unstarted through
//! `SlotStop`, and the slot gives them back with no attempt counted (ARCHITECTURE.md,
//! invariant 34); without a stop, a task missing from a reply fails as before. A long
//! task's cancel is the cancel line, then SIGTERM, then SIGKILL to the child's group.

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use nix::sys::signal::Signal;

use crate::config::KILL_AFTER_TERM;
use crate::host::handler::{SlotContext, SlotStop, Stop};

use super::child::Signaller;

/// Whether the stop line went to the child while it had the batch: then a task its reply
/// leaves out was not started, and goes back to the queue instead of failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StopLine {
    /// Not written: the reply answers the whole batch, as always.
    NotSent,
    /// Written after the batch line and before the reply was read.
    Sent,
}

/// What the stop writer shares with the handler thread: the stdin of the child that has a
/// batch, while it has one.
#[derive(Default)]
pub(super) struct InFlight {
    /// A duplicate of the child's stdin, from the batch line written to the reply read.
    stdin: Option<File>,
    /// Whether the stop line was written during this batch.
    sent: bool,
}

impl InFlight {
    /// Writes `{"stop": true}` to the child holding a batch, once per batch; `queue` and
    /// `slot` name it in the log.
    pub(super) fn write_stop(&mut self, queue: &str, slot: u32) {
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
pub(super) struct StopWriter {
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
    pub(super) fn start(ctx: &SlotContext) -> StopWriter {
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
    pub(super) fn batch_sent(&self, ctx: &SlotContext, stdin: File) {
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
    pub(super) fn batch_over(&self) -> StopLine {
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
pub(super) fn lock(in_flight: &Mutex<InFlight>) -> std::sync::MutexGuard<'_, InFlight> {
    in_flight.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stops a long task's child when the slot asks, until the exchange is over (`done`): at
/// once with SIGKILL when the lease could not be kept ([`Stop::Now`]); after a cancel, the
/// line `{"cancel": "ID"}` first, SIGTERM after the queue's `cancel_grace`, SIGKILL
/// [`KILL_AFTER_TERM`] later. The child is reaped only after this ends, so its pid cannot
/// have been reused meanwhile.
pub(super) fn watch_stop(
    ctx: &SlotContext,
    id: &str,
    child: &Signaller,
    mut stdin: File,
    done: &AtomicBool,
) {
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
    // (a batch queue's task is cancelled by its timeout: the line says so)
    let line = if ctx.queue.timeout.is_some() && !ctx.queue.is_long() {
        serde_json::json!({ "cancel": id, "timeout": true })
    } else {
        serde_json::json!({ "cancel": id })
    };
    let line = format!("{line}\n");
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
            task = id, signal = %sig, "the cancelled task has not stopped");
        child.signal(sig);
    }
}
