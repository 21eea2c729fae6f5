//! The exec handler: one long-lived child per slot speaking JSON lines over stdin/stdout
//! (README, "Handlers"), so a team can write its handler in any language.
//!
//! The child is the slot's to keep alive: one that exits, answers nonsense or cannot be
//! written to fails the whole batch (retried by the queue's policy) and is replaced before
//! the next one. A child that hangs is left alone: the master's watchdog kills the slot,
//! and the child dies with it.
//!
//! A reply's entries are read one by one. After three failed batches in a row with no task
//! in common the handler gives up (`SlotStop::give_up`): the batch goes back and the slot
//! exits as crashed, so its master backs off instead of the slot spinning. `tests.rs`
//! drives all of it against real children.

//!
//! Split by concern: [`protocol`] what goes over the pipes (requests, replies, their
//! parsing), `child` the child's process (spawned or forked) and its life, `stop` the
//! stop and cancel lines written while the handler thread waits for a reply, `forked` a
//! `start = "fork"` child as its slot holds it.

mod child;
mod forked;
pub mod protocol;
mod stop;
#[cfg(test)]
mod tests;

use std::sync::mpsc;
use std::time::Duration;

use crate::config::{Handler as HandlerConfig, QueueConfig, Start};
use crate::host::handler::{Handler, HandlerError, Outcome, OutsidePid, SlotContext, Task};

pub use child::EXIT_GRACE;
use child::Running;
pub use protocol::{MAX_REPLY_BYTES, ReplyError, ReplyFollowUp, ReplyStatus, parse_reply};
use protocol::{Request, RequestTask, done_outcome, request_payload};
use stop::{StopLine, StopWriter};

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

/// Batches in a row a child may fail (crash, hang up, answer out of step) before the slot
/// gives up: the batch in hand goes back unstarted, and the slot exits as crashed, so its
/// master backs off and counts the crash (an alert) instead of the queue's tasks burning
/// their attempts, batch after batch, against a child that cannot work. A failed batch
/// that shares a task with the one before starts the count again: one poison task that
/// kills the child at each attempt is the task's fault, and must reach the dead letters.
const GIVE_UP_AFTER: u32 = 3;

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
        // (a task under a timeout is cancelled as a long task is: the cancel line, then
        // signals; its slot hands it over alone, see slot/timeout.rs)
        let exchanged = if ctx.queue.is_long() || ctx.queue.timeout.is_some() {
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
                if ctx.is_cancelled() {
                    // Stopped on purpose (a cancel, a timeout): no sign of a broken child.
                    return fail_sent(decided, &reason);
                }
                let ids: Vec<String> = request.batch.iter().map(|t| t.id.to_owned()).collect();
                let again = ids.iter().any(|id| self.last_failed.contains(id));
                self.failed_in_a_row = if again { 1 } else { self.failed_in_a_row + 1 };
                self.last_failed = ids;
                if self.failed_in_a_row >= GIVE_UP_AFTER && !ctx.queue.is_long() {
                    return give_up(ctx, decided, &reason, self.failed_in_a_row);
                }
                return fail_sent(decided, &reason);
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

/// The outcomes of a batch whose exchange failed: those decided before sending stand, the
/// tasks sent to the child fail with `reason`.
fn fail_sent(decided: Vec<Option<Outcome>>, reason: &str) -> Vec<Outcome> {
    decided
        .into_iter()
        .map(|d| {
            d.unwrap_or_else(|| Outcome::Fail {
                reason: reason.to_owned(),
            })
        })
        .collect()
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
    fail_sent(decided, &reason)
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
        Some(ReplyStatus::Retry { delay_ms, priority }) => Outcome::Retry {
            delay: delay_ms
                .map(Duration::from_millis)
                .unwrap_or_else(|| queue.retry.delay(task.attempt)),
            priority,
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

impl Drop for Exec {
    fn drop(&mut self) {
        self.close_child();
    }
}
