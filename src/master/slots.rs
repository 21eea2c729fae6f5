//! The master's slots: reconciling them to the map (the pure [`plan`] decides, this
//! applies), their events and exits, crash back-off per queue, the watchdog.
//!
//! Slot exits: 0 asked to stop, 75 recycled (restart at once), anything else a crash:
//! restart at once the first time, then a back-off doubling from 500 ms to 60 s, reset by
//! the queue's next finished batch.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;

use super::plan::{self, PlanInput, SlotState, SlotView, Want};
use super::supervisor::Master;
use super::telemetry::{BatchDone, Exit, SlotExit};
use super::zygote::ZygoteRequest;
use crate::backoff::Backoff;
use crate::cluster::QueueReport;
use crate::config::Config;
use crate::host::proto::{EXIT_RECYCLE, EXIT_STOPPED, RETIRE_SIGNAL, SlotEvent};

/// The pause after a queue's second crash in a row; it doubles with every further one.
const CRASH_BACKOFF: Duration = Duration::from_millis(500);
/// Longest pause before restarting a queue's slots after repeated crashes.
const MAX_CRASH_BACKOFF: Duration = Duration::from_secs(60);

/// One slot, from the spawn request to its reaped exit.
pub(super) struct SlotProc {
    /// The queue it serves.
    pub(super) queue: String,
    /// The generation of the zygote it was asked of.
    pub(super) generation: u64,
    /// Its pid, once the zygote forked it.
    pub(super) pid: Option<u32>,
    /// Where it is in its life.
    pub(super) state: SlotState,
    /// When it was asked of the zygote.
    pub(super) spawned_at: Instant,
    /// Its last event: the watchdog's clock.
    pub(super) last_progress: Instant,
    /// Stopping: when it is killed if it has not exited.
    pub(super) stop_deadline: Option<Instant>,
    /// The watchdog killed it.
    pub(super) hung: bool,
    /// Batches it finished.
    pub(super) batches: u64,
    /// The reason it gave before exiting.
    pub(super) exit_reason: Option<String>,
    /// From the spawn request to the slot's first take (fork, runtime, Redis, init).
    pub(super) ready_after: Option<Duration>,
    /// Asked to retire ([`RETIRE_SIGNAL`]): it exits once its long task ended.
    pub(super) retiring: bool,
    /// Its process outside its own tree, as it last said ([`SlotEvent::Outside`]): that
    /// process's tree counts as the slot's memory.
    pub(super) outside: Option<u32>,
}

impl SlotProc {
    fn new(queue: String, generation: u64, now: Instant) -> Self {
        SlotProc {
            queue,
            generation,
            pid: None,
            state: SlotState::Spawning,
            spawned_at: now,
            last_progress: now,
            stop_deadline: None,
            hung: false,
            batches: 0,
            exit_reason: None,
            ready_after: None,
            retiring: false,
            outside: None,
        }
    }

    /// Where the slot is in its life after its event `ev` at `now` (a stopping slot stays
    /// stopping).
    fn observe(&mut self, ev: &SlotEvent, now: Instant) {
        if let SlotEvent::Outside { outside, .. } = ev {
            // (news of a process, not of work: the watchdog's clock is left alone)
            self.outside = *outside;
            return;
        }
        self.last_progress = now;
        if let SlotEvent::Ready { .. } = ev {
            self.ready_after = Some(now - self.spawned_at);
        }
        if self.state == SlotState::Stopping {
            return;
        }
        self.state = match ev {
            SlotEvent::Ready { .. } | SlotEvent::Idle { .. } => SlotState::Idle,
            SlotEvent::BatchStarted { .. } => SlotState::Busy,
            SlotEvent::BatchDone { next, .. } if next.is_some() => SlotState::Busy,
            SlotEvent::BatchDone { .. } => SlotState::Idle,
            // A slot reports progress only with work in hand: one seen idle lost its
            // BatchStarted (datagrams are dropped when the master's socket is full), and a
            // long task's slot taken for idle would be stopped, its task cut short, where
            // a busy one is left to finish or retired.
            SlotEvent::Progress { .. } if self.state == SlotState::Idle => SlotState::Busy,
            SlotEvent::Progress { .. } | SlotEvent::Outside { .. } | SlotEvent::Exiting { .. } => {
                self.state
            }
        };
    }
}

/// What the master keeps per queue.
pub(super) struct QueueState {
    /// What is reported for the queue: counters since the master started.
    pub(super) report: QueueReport,
    /// Crashes since the queue's last finished batch.
    pub(super) crashes: u32,
    /// The pause after the next repeated crash; reset by a finished batch.
    pub(super) backoff: Backoff,
    /// Crash back-off: no slot of the queue starts before then.
    pub(super) not_before: Option<Instant>,
}

impl Default for QueueState {
    fn default() -> Self {
        QueueState {
            report: QueueReport::default(),
            crashes: 0,
            backoff: Backoff::new(CRASH_BACKOFF, MAX_CRASH_BACKOFF),
            not_before: None,
        }
    }
}

/// The slots, and what is kept per queue.
pub(super) struct Slots {
    /// Every slot from its spawn request to its reaped exit, by number.
    pub(super) procs: BTreeMap<u32, SlotProc>,
    /// The number the next slot gets (never 0).
    next: u32,
    /// Counters and crash back-off per queue.
    pub(super) queues: BTreeMap<String, QueueState>,
}

impl Slots {
    pub(super) fn new() -> Self {
        Slots {
            procs: BTreeMap::new(),
            next: 1,
            queues: BTreeMap::new(),
        }
    }

    fn take_number(&mut self) -> u32 {
        let n = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        n
    }

    /// A slot of `queue` crashed: the first restarts at once, repeats back off, doubling.
    pub(super) fn crashed(&mut self, queue: &str) {
        let q = self.queues.entry(queue.to_owned()).or_default();
        q.report.crashes_total += 1;
        q.crashes += 1;
        if q.crashes > 1 {
            let delay = q.backoff.next();
            q.not_before = Some(Instant::now() + delay);
            tracing::warn!(queue, crashes = q.crashes, delay = ?delay, "slots keep crashing; backing off");
        }
    }

    /// The zygote of `generation` is gone, and its slots with it: forget them, counting
    /// those not asked to stop as crashed.
    pub(super) fn orphaned(&mut self, generation: u64) {
        let orphans: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, s)| s.generation == generation)
            .map(|(&n, _)| n)
            .collect();
        for n in orphans {
            if let Some(s) = self.procs.remove(&n) {
                // Normally gone already; make sure, since nobody will reap it otherwise.
                if let Some(pid) = s.pid {
                    signal_pid(pid, Signal::SIGKILL);
                }
                if s.state != SlotState::Stopping {
                    self.crashed(&s.queue);
                }
            }
        }
    }

    /// Kills slots silent for longer than their queue's `max_batch_time`, and stopping
    /// ones past their deadline.
    pub(super) fn watchdog(&mut self, cfg: &Config, now: Instant) {
        for (&n, s) in &mut self.procs {
            let Some(pid) = s.pid else { continue };
            let limit = cfg
                .queues
                .get(&s.queue)
                .map_or(Duration::from_secs(600), |q| q.max_batch_time);
            match s.state {
                SlotState::Busy | SlotState::Starting
                    if !s.hung && now - s.last_progress > limit =>
                {
                    s.hung = true;
                    let q = self.queues.entry(s.queue.clone()).or_default();
                    q.report.hung_total += 1;
                    tracing::warn!(queue = %s.queue, slot = n, pid, state = ?s.state,
                        silent = ?(now - s.last_progress), max_batch_time = ?limit,
                        "slot hung; killing it");
                    signal_pid(pid, Signal::SIGKILL);
                }
                SlotState::Stopping if s.stop_deadline.is_some_and(|d| now >= d) => {
                    tracing::warn!(queue = %s.queue, slot = n, pid, "slot did not stop in time; killing it");
                    s.stop_deadline = None;
                    signal_pid(pid, Signal::SIGKILL);
                }
                _ => {}
            }
        }
    }

    /// The second stop request: every slot is killed now.
    pub(super) fn kill_all(&mut self) {
        for s in self.procs.values_mut() {
            if let Some(pid) = s.pid {
                signal_pid(pid, Signal::SIGKILL);
            }
            s.state = SlotState::Stopping;
        }
    }
}

impl Master {
    /// This host's wanted slots per queue: the map's part, limited to queues this host
    /// can run.
    pub(super) fn wanted(&self) -> BTreeMap<String, u32> {
        if self.stopping || self.orders.drain_requested {
            return BTreeMap::new();
        }
        let Some(map) = &self.orders.map else {
            return BTreeMap::new();
        };
        let cfg = &self.opts.config;
        map.for_host(&self.opts.host)
            .into_iter()
            .filter(|(q, n)| {
                *n > 0
                    && cfg
                        .queues
                        .get(q)
                        .is_some_and(|c| self.opts.registry.supports(c))
                    && self.layouts.refused(q).is_none()
            })
            .collect()
    }

    /// What queue `queue` may run of the `wanted` slots the map gives it: all of them,
    /// but while the CPU is overloaded only what it ran when the overload began or its
    /// `min_slots`, so a slot that exits is replaced in its own queue and the host grows
    /// no queue.
    fn overload_cap(&self, queue: &str, wanted: u32) -> u32 {
        let Some(held) = &self.reporting.held_queues else {
            return wanted;
        };
        let min = self
            .opts
            .config
            .queues
            .get(queue)
            .map_or(0, |c| c.min_slots);
        let keep = held.get(queue).copied().unwrap_or(0).max(min);
        wanted.min(keep)
    }

    /// Everything the plan is made from, as things stand at `now`.
    fn plan_input(&self, now: Instant) -> PlanInput {
        let cfg = &self.opts.config;
        let wanted = self
            .wanted()
            .into_iter()
            .map(|(queue, slots)| {
                let slots = self.overload_cap(&queue, slots);
                let want = Want {
                    slots,
                    priority: cfg.queues.get(&queue).map_or(0, |c| c.priority),
                    not_before: self.slots.queues.get(&queue).and_then(|q| q.not_before),
                };
                (queue, want)
            })
            .collect();
        let slots = self
            .slots
            .procs
            .iter()
            .map(|(&n, s)| {
                let view = SlotView {
                    queue: s.queue.clone(),
                    generation: s.generation,
                    state: s.state,
                    spawned_at: s.spawned_at,
                    retiring: s.retiring,
                };
                (n, view)
            })
            .collect();
        PlanInput {
            now,
            slots,
            wanted,
            capacity: self.reporting.capacity.as_ref().map(|c| c.slots),
            zygote: self.zygotes.view(),
            long: self.long_queues_kept(),
        }
    }

    /// The long queues whose busy slots the plan keeps: all of them, but none while the
    /// host drains (a stop, or `gaffer drain`): then their tasks are stopped and handed
    /// back like a cancel, within `drain_timeout`. Nor one whose window has shut and that
    /// hands its tasks back then (`work_periods_long = "hand_back"`).
    fn long_queues_kept(&self) -> BTreeSet<String> {
        if self.stopping || self.orders.drain_requested {
            return BTreeSet::new();
        }
        let cfg = &self.opts.config;
        let now = chrono::Utc::now();
        cfg.queues
            .values()
            .filter(|q| q.is_long() && !cfg.hands_back_at(q, now))
            .map(|q| q.name.clone())
            .collect()
    }

    /// Brings the slots to this host's part of the map: plans, then stops and spawns.
    pub(super) async fn reconcile(&mut self) {
        let now = Instant::now();
        let plan = plan::plan(&self.plan_input(now));
        self.stop_slots(&plan.stop, now);
        self.retire_slots(&plan.retire);
        self.spawn_slots(plan.spawn, now).await;
    }

    /// Asks busy slots of long queues to exit once their task ended, taking no other
    /// (`RETIRE_SIGNAL`), once each.
    fn retire_slots(&mut self, retire: &[u32]) {
        for n in retire {
            let Some(s) = self.slots.procs.get_mut(n) else {
                continue;
            };
            if let (false, Some(pid)) = (s.retiring, s.pid) {
                s.retiring = true;
                tracing::info!(slot = n, pid, queue = %s.queue, generation = s.generation,
                    "retiring a slot busy with a long task: it exits once its task ended");
                signal_pid(
                    pid,
                    Signal::try_from(RETIRE_SIGNAL).unwrap_or(Signal::SIGUSR1),
                );
            }
        }
    }

    /// Asks the slots to stop (SIGTERM: they finish the task in hand and give the rest of their batch back), within `drain_timeout`.
    fn stop_slots(&mut self, stop: &[u32], now: Instant) {
        let drain_timeout = self.opts.config.master.drain_timeout;
        for n in stop {
            if let Some(s) = self.slots.procs.get_mut(n) {
                s.state = SlotState::Stopping;
                s.stop_deadline = Some(now + drain_timeout);
                if let Some(pid) = s.pid {
                    signal_pid(pid, Signal::SIGTERM);
                }
            }
        }
    }

    /// Asks the current zygote for one slot of each queue; stops at the first failed
    /// write (the zygote is going, its end will be seen).
    async fn spawn_slots(&mut self, queues: Vec<String>, now: Instant) {
        let generation = self.zygotes.generation;
        for queue in queues {
            let slot = self.slots.take_number();
            let req = ZygoteRequest::Spawn {
                queue: queue.clone(),
                slot,
            };
            let Ok(mut line) = serde_json::to_vec(&req) else {
                continue;
            };
            line.push(b'\n');
            let Some(stdin) = self
                .zygotes
                .procs
                .get_mut(&generation)
                .and_then(|z| z.stdin.as_mut())
            else {
                return;
            };
            if let Err(e) = stdin.write_all(&line).await {
                tracing::error!(error = %e, "writing to the zygote failed");
                return;
            }
            self.slots
                .procs
                .insert(slot, SlotProc::new(queue, generation, now));
        }
    }

    /// The zygote reaped a slot: count its life and how it ended, then reconcile.
    pub(super) async fn slot_exited(
        &mut self,
        slot: u32,
        pid: u32,
        code: Option<i32>,
        signal: Option<i32>,
    ) {
        let Some(s) = self.slots.procs.remove(&slot) else {
            return;
        };
        let lived = s.spawned_at.elapsed();
        let q = self.slots.queues.entry(s.queue.clone()).or_default();
        q.report.slot_lifetime_seconds_total += lived.as_secs_f64();
        let exit = if s.hung {
            Exit::Hung
        } else if code == Some(EXIT_RECYCLE) {
            q.report.recycles_total += 1;
            Exit::Recycled
        } else if s.state == SlotState::Stopping || code == Some(EXIT_STOPPED) {
            Exit::Stopped
        } else {
            let reason = match (&s.exit_reason, code, signal) {
                (Some(reason), _, _) => reason.clone(),
                (None, Some(code), _) => format!("exited with code {code}"),
                (None, None, Some(signal)) => format!("killed by signal {signal}"),
                (None, None, None) => "ended".to_string(),
            };
            q.report.last_crash = Some(crate::cluster::LastCrash::new(
                &reason,
                crate::cluster::now_ms(),
            ));
            Exit::Crashed
        };
        SlotExit {
            queue: &s.queue,
            slot,
            pid,
            code,
            signal,
            exit,
            lived,
            reason: s.exit_reason.as_deref(),
        }
        .emit();
        if exit == Exit::Crashed {
            self.slots.crashed(&s.queue);
        }
        self.retire_idle_zygotes();
        self.reconcile().await;
    }

    /// A slot's datagram: its state, progress and batch counters.
    pub(super) fn slot_event(&mut self, ev: SlotEvent) {
        let (pid, slot, now) = (ev.pid(), ev.slot(), Instant::now());
        let Some(s) = self.slots.procs.get_mut(&slot) else {
            return;
        };
        if s.pid.is_some_and(|p| p != pid) {
            return;
        }
        s.observe(&ev, now);
        match ev {
            SlotEvent::BatchDone {
                batches,
                tasks,
                failed,
                busy_ms,
                stale,
                ref start_delays,
                ..
            } => {
                s.batches += u64::from(batches);
                let queue = s.queue.clone();
                let q = self.slots.queues.entry(queue.clone()).or_default();
                q.report.processed_total += u64::from(tasks);
                q.report.failed_total += u64::from(failed);
                q.report.batches_total += u64::from(batches);
                q.report.busy_seconds_total += busy_ms as f64 / 1000.0;
                q.crashes = 0;
                q.backoff.reset();
                q.not_before = None;
                BatchDone {
                    queue: &queue,
                    batches,
                    tasks,
                    failed,
                    busy_ms,
                    stale,
                    start_delays,
                }
                .emit();
            }
            SlotEvent::Exiting { reason, .. } => s.exit_reason = Some(reason),
            _ => {}
        }
    }
}

pub(super) fn signal_pid(pid: u32, sig: Signal) {
    if pid > 1 {
        match kill(Pid::from_raw(pid as i32), sig) {
            // Already gone: its exit is on its way to us.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            // EPERM: a slot of another user without CAP_KILL; it will not stop.
            Err(e) => tracing::warn!(pid, signal = %sig, error = %e, "cannot signal a slot"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_in(state: SlotState) -> SlotProc {
        let mut p = SlotProc::new("q".into(), 1, Instant::now());
        p.state = state;
        p
    }

    #[test]
    fn progress_from_a_slot_seen_idle_makes_it_busy() {
        let progress = SlotEvent::Progress { slot: 1, pid: 2 };
        let mut idle = proc_in(SlotState::Idle);
        idle.observe(&progress, Instant::now());
        assert_eq!(idle.state, SlotState::Busy, "its BatchStarted was lost");
        for state in [SlotState::Busy, SlotState::Stopping, SlotState::Starting] {
            let mut p = proc_in(state);
            p.observe(&progress, Instant::now());
            assert_eq!(p.state, state);
        }
    }

    #[test]
    fn a_stopping_slot_stays_stopping_and_the_others_follow_their_events() {
        let now = Instant::now();
        let events = [
            (SlotEvent::Ready { slot: 1, pid: 2 }, SlotState::Idle),
            (
                SlotEvent::BatchStarted {
                    slot: 1,
                    pid: 2,
                    tasks: 3,
                },
                SlotState::Busy,
            ),
            (SlotEvent::Idle { slot: 1, pid: 2 }, SlotState::Idle),
        ];
        for (ev, after) in events {
            let mut p = proc_in(SlotState::Starting);
            p.observe(&ev, now);
            assert_eq!(p.state, after, "{ev:?}");
            let mut p = proc_in(SlotState::Stopping);
            p.observe(&ev, now);
            assert_eq!(p.state, SlotState::Stopping, "{ev:?}");
        }
    }

    #[test]
    fn the_outside_pid_is_kept_and_changes_neither_state_nor_progress() {
        let before = Instant::now();
        let mut p = proc_in(SlotState::Busy);
        let later = before + Duration::from_secs(5);
        let outside = |outside| SlotEvent::Outside {
            slot: 1,
            pid: 2,
            outside,
        };
        p.observe(&outside(Some(77)), later);
        assert_eq!(p.outside, Some(77));
        assert_eq!(p.state, SlotState::Busy);
        assert!(
            p.last_progress < later,
            "a hung slot's child is no progress"
        );
        p.observe(&outside(Some(78)), later);
        assert_eq!(p.outside, Some(78));
        p.observe(&outside(None), later);
        assert_eq!(p.outside, None);
        let mut idle = proc_in(SlotState::Idle);
        idle.observe(&outside(Some(9)), later);
        assert_eq!((idle.state, idle.outside), (SlotState::Idle, Some(9)));
    }
}
