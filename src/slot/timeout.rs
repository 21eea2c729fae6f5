//! A batch queue's time limit per task (`timeout`): the handler gets its batch one task at
//! a time, each under a deadline. A task over it is cancelled the way a long task is
//! (`SlotContext::is_cancelled` turns true; an exec child gets the cancel line, SIGTERM
//! after `cancel_grace`, then SIGKILL), and unless its handler still finished it, it is
//! retried with the note "timed out after …". The tasks before it keep their outcomes and
//! the tasks after it run as usual: one task's time is never the batch's loss.
//!
//! Runs on the handler thread: the deadline is watched by a thread of its own for each
//! task, since the handler thread is inside `handle` meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::host::handler::{Handler, Outcome, SlotContext, Stop, Task};
use crate::queue_client::LeasedTask;

/// The time limits of a batch's handled tasks (those `screen` did not decide: `None` in
/// `refused`, in order): the queue's `timeout`, or a task's own when shorter. Empty when
/// the queue has no `timeout`: its handler gets the batch whole.
pub(crate) fn limits(
    timeout: Option<Duration>,
    tasks: &[LeasedTask],
    refused: &[Option<Outcome>],
) -> Vec<Duration> {
    let Some(queue_limit) = timeout else {
        return Vec::new();
    };
    tasks
        .iter()
        .zip(refused)
        .filter(|(_, r)| r.is_none())
        .map(|(t, _)| {
            t.meta
                .timeout()
                .map_or(queue_limit, |own| own.min(queue_limit))
        })
        .collect()
}

/// The outcomes of `batch` handled one task at a time, each within its limit (`limits`,
/// one per task). Shorter than the batch when the slot was asked to stop: the tasks after
/// the outcomes were not started (the caller gives them back, as for any handler's short
/// vector).
pub(crate) fn handle_each_within(
    handler: &mut dyn Handler,
    ctx: &SlotContext,
    batch: &[Task],
    limits: &[Duration],
) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(batch.len());
    for (task, &limit) in batch.iter().zip(limits) {
        if ctx.should_stop() {
            break;
        }
        let (got, timed_out) = handle_within(handler, ctx, task, limit);
        let Some(outcome) = got else {
            // (a handler that returns nothing was asked to stop before it started it,
            // or lost it: the rest goes as a short vector says)
            if timed_out {
                outcomes.push(timed_out_retry(ctx, task, limit));
            }
            break;
        };
        outcomes.push(if timed_out && !matches!(outcome, Outcome::Done(_)) {
            timed_out_retry(ctx, task, limit)
        } else {
            outcome
        });
        // (the master's watchdog hears the batch is alive, task by task)
        ctx.progress();
    }
    outcomes
}

/// One task through the handler, cancelled when `limit` passes: its outcome, if the
/// handler gave one, and whether its time ran out.
fn handle_within(
    handler: &mut dyn Handler,
    ctx: &SlotContext,
    task: &Task,
    limit: Duration,
) -> (Option<Outcome>, bool) {
    ctx.cancel.reset();
    let deadline = Instant::now() + limit;
    let done = AtomicBool::new(false);
    let timed_out = AtomicBool::new(false);
    let got = std::thread::scope(|scope| {
        let watch = std::thread::Builder::new()
            .name("task-timeout".into())
            .spawn_scoped(scope, || {
                let stop = ctx.cancel.wait_past(Stop::Run, Some(deadline), &done);
                if stop == Stop::Run && !done.load(Ordering::Acquire) {
                    timed_out.store(true, Ordering::Release);
                    ctx.cancel.ask(Stop::Cancel);
                }
            });
        if let Err(e) = watch {
            tracing::warn!(queue = %ctx.queue.name, slot = ctx.slot, task = %task.id,
                "cannot watch the task's timeout: {e}; it runs until it returns");
        }
        let got = handler.handle(ctx, std::slice::from_ref(task));
        done.store(true, Ordering::Release);
        ctx.cancel.wake();
        got
    });
    let timed_out = timed_out.load(Ordering::Acquire);
    ctx.cancel.reset();
    if timed_out {
        tracing::info!(queue = %ctx.queue.name, slot = ctx.slot, task = %task.id,
            limit = %humantime::format_duration(limit), "task timed out");
    }
    (got.into_iter().next(), timed_out)
}

/// The retry of a task over its time limit, after the queue's retry delay.
fn timed_out_retry(ctx: &SlotContext, task: &Task, limit: Duration) -> Outcome {
    Outcome::Retry {
        delay: ctx.queue.retry.delay(task.attempt),
        priority: None,
        reason: timed_out_note(limit),
    }
}

/// What a timed-out task's history says.
fn timed_out_note(limit: Duration) -> String {
    format!("timed out after {}", humantime::format_duration(limit))
}
