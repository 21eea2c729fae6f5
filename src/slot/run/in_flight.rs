//! A slot's calls to Redis that settle a handled batch and take the next one, sent without
//! waiting for their answer (`InFlight`), and what a settled batch's end needs once the
//! answer is in (`Settled`).
//!
//! Without `prefetch` a slot waits for each call at once: one round trip per batch, one
//! call in flight. With `prefetch = true` it goes on while the call is in flight:
//!
//! - A slot that took a batch the plain way (after an idle wait) sends a take on its own
//!   while the handler runs (`send_take`), so the next batch is underway.
//! - Each handled batch's settle takes the batch after next in the same call
//!   (`send_settle_take`), and the slot turns at once to the batch the oldest call
//!   brought (`finish_oldest`). So a slot whose handler is quick keeps two calls in flight,
//!   and Redis always has the next call of each slot queued while it answers one; one
//!   whose handler is slow overlaps its next take with the handler's work, as before.
//! - At most two calls are in flight, and at most one while the handler holds a batch: a
//!   batch taken ahead waits in the slot at most while one other batch is handled, which
//!   is why config refuses `prefetch` where `max_batch_time` exceeds `lease`.
//! - A batch's end (its follow-ups' `after_settle`, its `BatchDone`) is told once its
//!   call is answered, so with `prefetch` a `BatchDone` may come after the next batch ran.
//!   A call that failed settles its batch alone, retried as ever (`settle`).
//! - Calls are answered in the order they were sent (one connection), and finished in that
//!   order; a stopping slot finishes every call in flight before it gives back what they
//!   took, the latest first (`give_back_ahead`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::{Serving, Taken, count_stale, settle};
use crate::host::proto::{SlotEvent, StartDelays};
use crate::queue_client::{Batch, LeasedTask, QueueError, SettleOp, SettleResult};
use crate::slot::followups::Made;

/// Most calls a slot has in flight (with `prefetch`; one without).
pub(super) const MAX_IN_FLIGHT: usize = 2;

/// What a call answers: the settle's results (none for a take alone) and the batch taken.
type Answer = Result<(Vec<SettleResult>, Batch), QueueError>;

/// A call sent to Redis and not yet finished by the slot.
pub(super) struct InFlight {
    /// The call, run by the slot's runtime while the slot goes on.
    call: JoinHandle<Answer>,
    /// When it was sent: the batch it takes is leased from no earlier.
    sent: Instant,
    /// The batch it settles and that batch's ops (kept for a settle alone if the call
    /// fails); none for a take alone.
    settles: Option<(Arc<Vec<SettleOp>>, Settled)>,
}

/// A handled batch whose settle was sent: what its end needs once the settle is answered.
pub(super) struct Settled {
    /// The batch's tasks that were settled (those given back unstarted left out).
    pub(super) tasks: Vec<LeasedTask>,
    /// The follow-ups made for them.
    pub(super) made: Made,
    /// When their leases run out.
    pub(super) lease_until: Instant,
    /// How many were settled other than acked.
    pub(super) failed: u32,
    /// How many were found stale before the settle (given back after their lease went).
    pub(super) stale: u32,
    /// How long the handler held the batch.
    pub(super) busy: Duration,
    /// How long its tasks waited to start.
    pub(super) start_delays: StartDelays,
    /// Whether its end is told to the master: not for a batch the handler was given up
    /// on, which the master must not count as a finished batch.
    pub(super) report: bool,
}

impl Serving {
    /// Sends the settle of a handled batch together with the next take.
    pub(super) fn send_settle_take(&mut self, ops: Vec<SettleOp>, settled: Settled) {
        let ops = Arc::new(ops);
        let (queue, call_ops) = (self.queue.clone(), ops.clone());
        let (n, lease) = (self.cfg.batch_size as usize, self.cfg.lease);
        let sent = Instant::now();
        let call = tokio::spawn(async move { queue.settle_take(&call_ops, n, lease).await });
        self.in_flight.push_back(InFlight {
            call,
            sent,
            settles: Some((ops, settled)),
        });
    }

    /// Sends a take on its own, for the batch after the one the handler is given now.
    pub(super) fn send_take(&mut self) {
        let queue = self.queue.clone();
        let (n, lease) = (self.cfg.batch_size as usize, self.cfg.lease);
        let sent = Instant::now();
        let call = tokio::spawn(async move { Ok((Vec::new(), queue.take(n, lease).await?)) });
        self.in_flight.push_back(InFlight {
            call,
            sent,
            settles: None,
        });
    }

    /// Waits for the oldest call in flight and finishes it: ends the batch it settled
    /// (settling it alone if the call failed) and returns the batch it took, if any. The
    /// slot's `ahead` is left alone: the caller puts the batch where it belongs.
    pub(super) async fn finish_oldest(&mut self) -> Option<Taken> {
        let InFlight {
            call,
            sent,
            settles,
        } = self.in_flight.pop_front()?;
        let answer = call
            .await
            .unwrap_or_else(|e| Err(QueueError::Protocol(format!("the call's task ended: {e}"))));
        let (results, mut taken) = match answer {
            Ok((results, next)) => {
                self.backoff.reset();
                let taken = (!next.tasks.is_empty()).then(|| Taken::new(next, sent));
                (Some(results), taken)
            }
            Err(e) => {
                if settles.is_some() {
                    tracing::warn!(queue = %self.cfg.name, slot = self.slot, error = %e,
                        "settle and take failed; settling alone");
                } else {
                    tracing::warn!(queue = %self.cfg.name, slot = self.slot, error = %e,
                        "taking the next batch ahead failed");
                }
                (None, None)
            }
        };
        if let Some((ops, settled)) = settles {
            let results = match results {
                Some(results) => results,
                None => self.settle_alone(&ops, settled.lease_until).await,
            };
            self.end_batch(settled, &results, taken.as_mut()).await;
        }
        taken
    }

    /// Settles a handled batch on its own, retried through an outage (`settle`).
    pub(super) async fn settle_alone(
        &mut self,
        ops: &[SettleOp],
        lease_until: Instant,
    ) -> Vec<SettleResult> {
        let (slot, pid, reporter) = (self.slot, self.pid, &self.reporter);
        // (a slot retrying its settle through an outage is not hung: the master's
        // watchdog must not kill it, and run its tasks again)
        let progress = || reporter.progress(slot, pid);
        settle(
            &self.queue,
            ops,
            lease_until,
            &self.stop,
            &mut self.course,
            &progress,
        )
        .await
    }

    /// Ends a settled batch: cancels the follow-ups of a task found cancelled meanwhile and
    /// tells the master, announcing `next` when it surely goes to the handler next (a
    /// stopping or recycling slot gives it back).
    pub(super) async fn end_batch(
        &mut self,
        settled: Settled,
        results: &[SettleResult],
        next: Option<&mut Taken>,
    ) {
        let Settled {
            tasks,
            made,
            failed,
            stale,
            busy,
            start_delays,
            report,
            ..
        } = settled;
        self.follow_ups.after_settle(&tasks, &made, results).await;
        let goes_on = self.goes_on();
        let next = next.filter(|_| goes_on).map(|t| {
            t.announced = true;
            t.batch.tasks.len() as u32
        });
        if !report {
            return;
        }
        self.reporter.send(&SlotEvent::BatchDone {
            slot: self.slot,
            pid: self.pid,
            batches: 1,
            tasks: tasks.len() as u32,
            failed,
            busy_ms: busy.as_millis() as u64,
            stale: stale + count_stale(results),
            next,
            start_delays,
        });
    }
}
