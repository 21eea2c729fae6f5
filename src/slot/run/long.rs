//! A long task (`kind = "long"`) in a slot: one task at a time, its lease renewed every
//! tick while the handler runs (`Queue::renew_long`), stopped on a cancel or before a
//! lease it could not keep could be handed to another slot. A cancel asked of it goes to
//! the handler (`SlotContext` cancellation; `exec/stop.rs` writes the cancel line, then
//! SIGTERM, SIGKILL). It ends cancelled, settled by its outcome (its follow-ups made
//! first, through `FollowUps::before_settle`), or handed back when the slot stops
//! (`Queue::hand_back_started`: the record keeps the run). Only a cancel or a slot's stop
//! interrupts a running long task otherwise; the balancer never takes a busy long slot
//! for another queue.
//!
//! The timing argument (docs/OPERATIONS.md, "Long tasks"): a renewal sent at `t` by the
//! slot's monotonic clock is applied by Redis no earlier than `t`, so the lease it sets
//! runs at least until `t + lease`, and another slot can take the task only after that.
//! The slot keeps `lease_until = t + lease` of its last successful renewal (of the take
//! at first) and stops the task at `lease_until - LONG_STOP_MARGIN` if no renewal
//! succeeded since, SIGKILL for an exec child, without waiting on Redis: no renewal
//! call, however slow, holds that deadline up.
//!
//! A slot that cannot act cannot stop anything: one frozen (SIGSTOP) or hung while its
//! exec child runs on. So the kernel keeps the deadline too: a one-shot timer, re-armed
//! at each renewal, sends the slot process SIGKILL [`GUARD_AFTER_STOP`] after the stop
//! point, still before the lease could pass; the exec child dies with its slot
//! (PDEATHSIG), stopped or not. The timer is dropped once the handler has returned.

use std::time::{Duration, Instant};

use nix::sys::signal::{SigEvent, SigevNotify, Signal};
use nix::sys::time::TimeSpec;
use nix::sys::timer::{Expiration, Timer, TimerSetTimeFlags};
use nix::time::ClockId;

use super::{HandleResult, Panicked, Serving, Taken, merge_outcomes, screen, settle_ops};
use crate::backoff::Backoff;
use crate::config::{KILL_AFTER_TERM, LONG_RENEW_EVERY, LONG_STOP_MARGIN};
use crate::host::handler::{Outcome, Stop, Task};
use crate::host::proto::{EXIT_RECYCLE, SlotEvent, StartDelays};
use crate::queue_client::{LeasedTask, LongSettled, Renewal, Settle, SettleOp, SettleResult};
use crate::slot::followups::Made;

/// How long a slot waits for a handler to return after its long task had to stop at
/// once; a handler still running then is ended with the slot's process (its master
/// starts a new slot at once). Well inside [`GUARD_AFTER_STOP`]: the wait starts at the
/// stop point at the earliest, and a slot the kernel's timer kills first counts as a crash
/// (its queue backed off) where one that exits itself is recycled at once.
const HANDLER_STOP_WAIT: Duration = Duration::from_millis(300);

/// How long past its `cancel_grace` and [`KILL_AFTER_TERM`] a handler asked to stop (a
/// cancel, the slot's stop) may take to return before its run is ended without it and the
/// slot exits: a Rust handler that never looks at its cancel, or an exec child whose reply
/// pipe a process it started in a session of its own holds open after the child was
/// killed, would otherwise hold the task `cancelling` for ever.
const STOP_SLACK: Duration = Duration::from_secs(1);

/// How long after a long task's stop point the kernel kills a slot that has not stopped it
/// (frozen, hung): inside [`LONG_STOP_MARGIN`], so still before the lease could pass, and
/// late enough that a slot that runs stops its task itself first.
const GUARD_AFTER_STOP: Duration = Duration::from_millis(500);

const _: () = assert!(HANDLER_STOP_WAIT.as_millis() + 100 < GUARD_AFTER_STOP.as_millis());

/// The note of the waiting entry a long task's record gets when its slot was stopped
/// before the task ended, so the history tells the cut-short run from a retry.
pub const HANDED_BACK_NOTE: &str =
    "handed back unfinished: its slot was asked to stop (a drain, a shutdown or a smaller map)";

/// The kernel's copy of a long task's deadline: a CLOCK_MONOTONIC timer that sends this
/// process SIGKILL, which a stopped process receives too. Dropping it disarms it.
struct DeadlineGuard(Option<Timer>);

impl DeadlineGuard {
    /// A guard not yet armed; without one (timer_create failed, logged) the slot's own
    /// deadline still holds for a slot that runs.
    fn new(queue: &str, slot: u32) -> Self {
        let kill = SigEvent::new(SigevNotify::SigevSignal {
            signal: Signal::SIGKILL,
            si_value: 0,
        });
        match Timer::new(ClockId::CLOCK_MONOTONIC, kill) {
            Ok(t) => DeadlineGuard(Some(t)),
            Err(e) => {
                tracing::warn!(queue, slot, error = %e,
                    "no kernel timer for the long task's deadline; a frozen slot could not stop it");
                DeadlineGuard(None)
            }
        }
    }

    /// (Re-)arms it [`GUARD_AFTER_STOP`] after `stop_at`.
    fn arm(&mut self, stop_at: Instant) {
        let Some(timer) = &mut self.0 else { return };
        let after = (stop_at + GUARD_AFTER_STOP).saturating_duration_since(Instant::now());
        // A zero expiry would disarm it; a deadline already past kills at once.
        let after = TimeSpec::from_duration(after.max(Duration::from_millis(1)));
        if let Err(e) = timer.set(Expiration::OneShot(after), TimerSetTimeFlags::empty()) {
            tracing::warn!(error = %e, "arming the long task's kernel deadline failed");
        }
    }
}

/// How a long task's run ended, which decides what is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LongEnd {
    /// The handler returned on its own or after a cancel: its follow-ups made and
    /// settled by its outcome, or ended cancelled (no follow-ups) when a cancel was asked.
    Returned,
    /// The slot was asked to stop (a drain, a smaller map): the task goes back to wait
    /// for another slot, no attempt counted, its record keeping the run
    /// ([`HANDED_BACK_NOTE`]).
    HandedBack,
    /// The lease is gone or could not be renewed in time: nothing is settled; another
    /// slot may run the task already.
    LeaseLost,
}

/// The state of one long task's run.
struct LongRun {
    /// The leased task.
    task: LeasedTask,
    /// When its lease runs out at the earliest, by this process's clock.
    lease_until: Instant,
    /// What ends the run, once known.
    end: LongEnd,
    /// Whether an operator's cancel was seen.
    cancelled: bool,
    /// The kernel's copy of the deadline while the handler runs.
    guard: Option<DeadlineGuard>,
    /// Once the handler was asked to stop (a cancel, the slot's stop): when it must have
    /// returned (see [`STOP_SLACK`]).
    stop_by: Option<Instant>,
}

impl LongRun {
    /// When the task must be gone if no renewal succeeds before.
    fn stop_at(&self) -> Instant {
        self.lease_until
            .checked_sub(LONG_STOP_MARGIN)
            .unwrap_or(self.lease_until)
    }
}

impl Serving {
    /// Runs one long task to its end: handler, renewals every tick, cancel, stop, then
    /// the settle its end calls for.
    pub(super) async fn run_long(&mut self, taken: Taken) {
        let start_delays = taken.start_delays();
        let Taken {
            mut batch,
            lease_until,
            ..
        } = taken;
        let Some(task) = batch.tasks.first().cloned() else {
            return;
        };
        let (slot, pid) = (self.slot, self.pid);
        self.reporter.send(&SlotEvent::BatchStarted {
            slot,
            pid,
            tasks: 1,
        });
        tracing::info!(queue = %self.cfg.name, slot, task = %task.id, attempt = task.attempt, "long task started");
        let started = Instant::now();
        let mut run = LongRun {
            task,
            lease_until,
            end: LongEnd::Returned,
            cancelled: false,
            guard: None,
            stop_by: None,
        };
        if !self.fresh_lease(&mut run).await {
            return self.not_started(&run).await;
        }
        let (refused, tasks) = screen(&self.cfg, slot, &mut batch.tasks);
        let handled = tasks.len();
        self.cancel.reset();
        let mut guard = DeadlineGuard::new(&self.cfg.name, slot);
        guard.arm(run.stop_at());
        run.guard = Some(guard);
        let result = self.watch_long(&mut run, tasks).await;
        run.guard = None;
        let busy = started.elapsed();
        let outcome = match result {
            Some(Ok(o)) => merge_outcomes(refused, handled, o),
            Some(Err(panic)) => merge_outcomes(
                refused,
                handled,
                vec![Outcome::Fail {
                    reason: format!("handler panicked: {panic}"),
                }],
            ),
            None if run.end == LongEnd::LeaseLost => {
                self.course.recycle((
                    EXIT_RECYCLE,
                    "a long task's handler did not return after its lease was lost".into(),
                ));
                Vec::new()
            }
            None => {
                let reason = format!(
                    "the long task's handler did not return within {} of being asked to stop",
                    humantime::format_duration(self.stop_wait())
                );
                // (a slot asked to stop exits as stopped; its task is handed back)
                if !self.course.is_stopping() {
                    self.course.recycle((EXIT_RECYCLE, reason.clone()));
                }
                // (a cancel wins over it: the task ends cancelled; handed back, it is unused)
                vec![Outcome::Fail { reason }]
            }
        };
        let failed = self.end_long(&mut run, outcome).await;
        tracing::info!(queue = %self.cfg.name, slot, task = %run.task.id, end = ?run.end,
            cancelled = run.cancelled, secs = busy.as_secs(), "long task ended");
        self.reporter.send(&SlotEvent::BatchDone {
            slot,
            pid,
            batches: 1,
            tasks: 1,
            failed: u32::from(failed),
            busy_ms: busy.as_millis() as u64,
            stale: u32::from(run.end == LongEnd::LeaseLost),
            next: None,
            start_delays,
        });
    }

    /// Whether the task may start: a take answered past its stop point (Redis was frozen
    /// or slow while the lease ran on its clock) is renewed first, so a handler is never
    /// started only to be killed at once; false when that renewal did not succeed in
    /// time or found the lease gone.
    async fn fresh_lease(&mut self, run: &mut LongRun) -> bool {
        if Instant::now() < run.stop_at() {
            return true;
        }
        let sent = Instant::now();
        let bound = self.cfg.lease.saturating_sub(LONG_STOP_MARGIN);
        match tokio::time::timeout(bound, self.queue.renew_long(&run.task, self.cfg.lease)).await {
            Ok(Ok(Renewal::Renewed | Renewal::CancelAsked { .. })) => {
                run.lease_until = sent + self.cfg.lease;
                Instant::now() < run.stop_at()
            }
            _ => false,
        }
    }

    /// A task taken too late to start: handed back unstarted (its lease expires by
    /// itself if that fails too), and the slot reports an idle batch.
    async fn not_started(&mut self, run: &LongRun) {
        tracing::warn!(queue = %self.cfg.name, slot = self.slot, task = %run.task.id,
            "a long task's take was answered past its stop point and could not be renewed; handing it back unstarted");
        if let Err(e) = self.queue.release(std::slice::from_ref(&run.task)).await {
            tracing::warn!(queue = %self.cfg.name, slot = self.slot, error = %e,
                "handing the long task back failed; it comes back when its lease expires");
        }
        self.reporter.send(&SlotEvent::BatchDone {
            slot: self.slot,
            pid: self.pid,
            batches: 1,
            tasks: 1,
            failed: 1,
            busy_ms: 0,
            stale: 0,
            next: None,
            start_delays: StartDelays::default(),
        });
    }

    /// Hands the task to the handler and keeps its lease while it runs. Returns the
    /// handler's result, or `None` when it did not return within [`HANDLER_STOP_WAIT`]
    /// of a stop at once, or by its run's `stop_by` once asked to stop.
    async fn watch_long(&mut self, run: &mut LongRun, tasks: Vec<Task>) -> Option<HandleResult> {
        let mut reply = if tasks.is_empty() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = tx.send((Vec::new(), Ok(Vec::new())));
            rx
        } else {
            self.worker.handle(tasks, Vec::new())
        };
        let mut renew_every =
            tokio::time::interval_at((Instant::now() + LONG_RENEW_EVERY).into(), LONG_RENEW_EVERY);
        renew_every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopped_now = run.end == LongEnd::LeaseLost;
            tokio::select! {
                biased;
                r = &mut reply => {
                    return Some(r.map_or_else(|_| Err(Panicked("handler thread ended".into())), |(_, r)| r));
                }
                () = tokio::time::sleep_until(run.stop_at().into()), if !stopped_now => {
                    tracing::error!(queue = %self.cfg.name, slot = self.slot, task = %run.task.id,
                        "no lease renewal succeeded in time; stopping the long task before its lease could pass to another slot");
                    self.stop_long_now(run);
                }
                () = tokio::time::sleep(HANDLER_STOP_WAIT), if stopped_now => return None,
                () = tokio::time::sleep_until(run.stop_by.unwrap_or(run.lease_until).into()),
                    if run.stop_by.is_some() && !stopped_now =>
                {
                    tracing::error!(queue = %self.cfg.name, slot = self.slot, task = %run.task.id,
                        "the long task's handler has not returned since it was asked to stop; ending its run without it (the slot exits)");
                    return None;
                }
                _ = renew_every.tick(), if !stopped_now => self.renew_long(run).await,
                () = self.stop.cancelled(), if !self.course.is_stopping() => {
                    self.course.stop();
                    if !run.cancelled {
                        run.end = LongEnd::HandedBack;
                    }
                    self.ask_stop(run);
                }
            }
        }
    }

    /// One renewal, bounded by the moment the task must be gone.
    async fn renew_long(&mut self, run: &mut LongRun) {
        let sent = Instant::now();
        let renewal = tokio::time::timeout_at(
            run.stop_at().into(),
            self.queue.renew_long(&run.task, self.cfg.lease),
        )
        .await;
        match renewal {
            Ok(Ok(Renewal::Renewed)) => self.renewed(run, sent),
            Ok(Ok(Renewal::CancelAsked { note })) => {
                self.renewed(run, sent);
                if !run.cancelled {
                    tracing::info!(queue = %self.cfg.name, slot = self.slot, task = %run.task.id,
                        note = %note, "long task cancelled; stopping it");
                    run.cancelled = true;
                    run.end = LongEnd::Returned;
                    self.ask_stop(run);
                }
            }
            Ok(Ok(Renewal::Lost)) => {
                tracing::error!(queue = %self.cfg.name, slot = self.slot, task = %run.task.id,
                    "the long task's lease is gone (another slot may hold it); stopping it at once");
                self.stop_long_now(run);
            }
            Ok(Err(e)) => tracing::warn!(queue = %self.cfg.name, slot = self.slot,
                task = %run.task.id, error = %e, "renewing the long task's lease failed"),
            // The deadline branch stops the task on the loop's next turn.
            Err(_) => {}
        }
    }

    fn renewed(&self, run: &mut LongRun, sent: Instant) {
        run.lease_until = sent + self.cfg.lease;
        let stop_at = run.stop_at();
        if let Some(guard) = &mut run.guard {
            guard.arm(stop_at);
        }
        // The master's watchdog sees a live slot, however long the task runs.
        self.reporter.progress(self.slot, self.pid);
    }

    /// Asks the handler to stop (an exec child gets the cancel line, then SIGTERM after
    /// `cancel_grace`, SIGKILL after [`KILL_AFTER_TERM`]), to have returned by
    /// [`Serving::stop_wait`] from the first time it was asked.
    fn ask_stop(&self, run: &mut LongRun) {
        run.stop_by
            .get_or_insert_with(|| Instant::now() + self.stop_wait());
        self.cancel.ask(Stop::Cancel);
    }

    /// How long a handler asked to stop may take to return.
    fn stop_wait(&self) -> Duration {
        self.cfg.cancel_grace + KILL_AFTER_TERM + STOP_SLACK
    }

    fn stop_long_now(&self, run: &mut LongRun) {
        run.end = LongEnd::LeaseLost;
        self.cancel.ask(Stop::Now);
    }

    /// Settles what the run's end calls for; returns whether the task did not end done.
    async fn end_long(&mut self, run: &mut LongRun, outcome: Vec<Outcome>) -> bool {
        match run.end {
            LongEnd::LeaseLost => true,
            LongEnd::HandedBack => {
                if let Err(e) = self
                    .queue
                    .hand_back_started(&run.task, HANDED_BACK_NOTE)
                    .await
                {
                    tracing::warn!(queue = %self.cfg.name, slot = self.slot, error = %e,
                        "handing the long task back failed; it comes back when its lease expires");
                }
                true
            }
            LongEnd::Returned => {
                let (outcome, made) = self.follow_ups_of(run, outcome).await;
                if run.end == LongEnd::LeaseLost {
                    return true;
                }
                let Some(op) =
                    settle_ops(&self.cfg, std::slice::from_ref(&run.task), outcome).pop()
                else {
                    return true;
                };
                let failed = !matches!(op.action, Settle::Ack | Settle::AckWithResult { .. });
                let settled = self.settle_long(run, &op).await;
                // (a cancel asked after the last renewal wins over the outcome: the
                // follow-ups made meanwhile go with it)
                if let Some(LongSettled::Cancelled | LongSettled::Settled(SettleResult::Stale)) =
                    settled
                {
                    let task = std::slice::from_ref(&run.task);
                    self.follow_ups
                        .after_settle(task, &made, &[SettleResult::Stale])
                        .await;
                }
                match settled {
                    Some(LongSettled::Cancelled) => true,
                    Some(LongSettled::Settled(_)) => failed,
                    None => true,
                }
            }
        }
    }

    /// Creates the follow-ups of a task that returned, as a batch task's are (its
    /// queue's `next` routes, its handler's `Done::next`), before it is settled; returns
    /// the outcome to settle. A task cancelled makes none: a last renewal first learns of
    /// a cancel asked since the previous one (and keeps the lease for the follow-ups'
    /// time); a lease found gone ends the run settling nothing.
    async fn follow_ups_of(
        &mut self,
        run: &mut LongRun,
        outcome: Vec<Outcome>,
    ) -> (Vec<Outcome>, Made) {
        if !run.cancelled {
            self.renew_long(run).await;
        }
        if run.cancelled || run.end == LongEnd::LeaseLost {
            return (outcome, Made::default());
        }
        self.follow_ups
            .before_settle(std::slice::from_ref(&run.task), outcome, run.lease_until)
            .await
    }

    /// Settles a returned long task, retrying while Redis is unreachable and the lease
    /// still holds; past it the task comes back by itself.
    async fn settle_long(&self, run: &LongRun, op: &SettleOp) -> Option<LongSettled> {
        let mut backoff = Backoff::new(super::FIRST_BACKOFF, super::MAX_SETTLE_BACKOFF);
        loop {
            match self.queue.settle_long(&run.task, op).await {
                Ok(settled) => return Some(settled),
                Err(e) if e.is_transient() && Instant::now() < run.lease_until => {
                    tracing::warn!(queue = %self.cfg.name, slot = self.slot, error = %e, "settling the long task failed, retrying");
                    backoff.pause().await;
                }
                Err(e) => {
                    tracing::error!(queue = %self.cfg.name, slot = self.slot, error = %e,
                        "settling the long task failed; it comes back when its lease expires");
                    return None;
                }
            }
        }
    }
}
