//! The slot process after the fork: its own runtime, its own Redis connection, and the
//! loop take → handle → settle. Leases are extended meanwhile, the slot checks its own
//! memory, and its stop (SIGTERM through `signals`, or a token in-process) is passed to
//! the handler in hand (`SlotStop`), whose unstarted rest is given back
//! (`Queue::release`) before the finished tasks are settled. Whether it serves on, stops
//! or recycles is one enum, `Course`.
//!
//! What the loop guarantees (ARCHITECTURE.md's invariants 15, 25 and 34, in full):
//!
//! - **A slot never loses a batch it took.** `take` is never cancelled by SIGTERM; a
//!   stopping slot finishes the task in hand (the batch, for a handler that cannot stop
//!   early), settles what it finished, gives the rest back and exits 0. The combined
//!   settle+take is sent only by a slot that is not stopping and not about to recycle. With
//!   `prefetch = true` that call stays in flight while the slot goes on (`in_flight.rs`: up
//!   to two calls, a take sent alone while the handler runs after a plain take), and a
//!   slot that ends finishes every call in flight before it gives back what they took. A
//!   batch taken ahead (by any of these calls) is checked before the handler gets it: a
//!   slot asked to stop meanwhile, or
//!   about to recycle, gives it back at once (`lua/release.lua`: to the front of its list,
//!   no attempt counted), and one whose lease ran out while it waited is given back, never
//!   run, since another taker may hold it now. A prefetched batch's lease runs from its
//!   take, so config refuses `prefetch` where `max_batch_time` exceeds `lease`. A batch
//!   that runs long has its leases extended every lease/3 from the runtime thread while
//!   the handler thread works, so only a dead or hung slot lets a lease lapse.
//! - **A payload never crashes a slot.** Payloads are untrusted bytes. A slot
//!   dead-letters a leased task whose payload exceeds the queue's `max_payload` before
//!   the handler sees it (`screen`); `Task::json` refuses nesting deeper than 64 before
//!   parsing, and handlers answer with `Outcome::Reject`; the exec handler rejects both
//!   before writing the batch line, and reads a reply only up to 64 MiB, a UTF-8 JSON
//!   object or the batch fails and the child is restarted. The rest of the batch is
//!   handled either way.
//! - **A stop returns the unstarted rest of a batch, with no attempt counted.** A slot
//!   asked to stop while its handler holds a batch asks the handler too
//!   (`SlotContext::should_stop`; an exec child gets `{"stop": true}` on stdin). The tasks
//!   the handler finished are settled with their outcomes, fenced by their lease tokens;
//!   those it did not start (past a Rust handler's short vector, once the stop was asked;
//!   left out of an exec child's reply after the stop line) go back through
//!   `Queue::release`: to the head of their priority's list in the order they were taken,
//!   their attempt count unchanged, their record untouched. Without a stop, a short vector
//!   or a task missing from a reply still fails. A batch whose take was in flight when the
//!   stop came goes back whole before any handler sees it, as one taken ahead does.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use self::in_flight::{MAX_IN_FLIGHT, Settled};
use self::report::{REPORT_HOLD, Reporter};
use super::followups::FollowUps;
use super::timeout;
use crate::backoff::Backoff;
use crate::config::QueueConfig;
use crate::host::handler::{
    Cancellation, Handler, HandlerError, Outcome, OutsidePid, SlotContext, SlotStop, Task,
    check_payload_size,
};
use crate::host::proto::{
    EXIT_FATAL, EXIT_RECYCLE, EXIT_STOPPED, RETIRE_SIGNAL, SlotEvent, SlotSpec, StartDelays,
};
use crate::queue_client::Worker as RecordWorker;

mod in_flight;
mod long;
mod memory;
mod report;

use crate::queue_client::{
    Batch, LeasedTask, Queue, QueueClient, QueueError, QueueLimits, Settle, SettleOp, SettleResult,
    Waiter,
};
pub use long::HANDED_BACK_NOTE;

/// Longest a slot's orderly end waits for its handler's [`Handler::close`] (an exec
/// child's: end of input, grace, SIGTERM, SIGKILL) before the process exits anyway.
const CLOSE_WAIT: Duration = Duration::from_secs(
    super::exec::EXIT_GRACE.as_secs() + crate::config::KILL_AFTER_TERM.as_secs() + 2,
);

/// First pause after a failed attempt to reach Redis (or to settle).
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between attempts to reach Redis.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Longest pause between attempts to settle a handled batch: once Redis is back, every
/// second counts before another slot reclaims the expired leases and runs the tasks again
/// (and the first call after an outage may still report the old connection's error).
const MAX_SETTLE_BACKOFF: Duration = Duration::from_secs(1);
/// Longest an idle slot waits for a wake-up before taking again anyway.
const IDLE_WAIT: Duration = Duration::from_secs(30);

/// Runs a slot to its end and returns its exit code; SIGTERM stops it after the batch
/// in hand. Called in a freshly forked child: builds its own runtime.
pub fn slot_main(spec: SlotSpec, handler: Box<dyn Handler>) -> i32 {
    run_slot(spec, handler, None)
}

/// Like [`slot_main`], also stopping when `stop` is cancelled: for running a slot inside
/// another process (tests, a team's tooling), where SIGTERM belongs to that process.
pub fn run_slot(spec: SlotSpec, handler: Box<dyn Handler>, stop: Option<CancellationToken>) -> i32 {
    if let Some(sock) = &spec.report {
        let _ = sock.set_nonblocking(true);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("slot {}: building the runtime: {e}", spec.slot);
            return EXIT_FATAL;
        }
    };
    let mut spec = spec;
    let reporter = Reporter::new(spec.report.take(), REPORT_HOLD);
    let slot = spec.slot;
    let pid = std::process::id();
    let queue_name = spec.queue.name.clone();
    let (code, reason) = runtime.block_on(run(stop, spec, reporter.clone(), handler));
    tracing::info!(queue = %queue_name, slot, pid, code, reason = %reason, "slot exiting");
    reporter.send(&SlotEvent::Exiting {
        slot,
        pid,
        code,
        reason,
    });
    // The handler thread may be stuck in foreign code; exit without joining it.
    runtime.shutdown_background();
    code
}

/// A batch's outcomes, or what its `handle` panicked with.
type HandleResult = Result<Vec<Outcome>, Panicked>;

/// The text of a handler's panic, caught on the handler thread.
#[derive(Debug)]
struct Panicked(String);

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why the handler thread could not be started: the slot exits with a crash code.
#[derive(Debug, thiserror::Error)]
enum StartError {
    /// `init` returned an error.
    #[error("handler init failed: {0}")]
    Init(HandlerError),
    /// `init` panicked.
    #[error("handler init panicked: {0}")]
    InitPanicked(Panicked),
    /// The OS refused the thread.
    #[error("starting the handler thread: {0}")]
    Thread(std::io::Error),
    /// The thread ended without a word about `init`.
    #[error("handler thread ended during init")]
    ThreadEnded,
}

/// The handler lives on its own thread so a blocking `handle` never stops lease
/// extension, and a panic is caught there without taking the slot down.
struct Worker {
    /// Batches to the thread; taken at the drop, which ends the thread's loop.
    tx: Option<std_mpsc::Sender<Job>>,
    /// Disconnects when the thread has ended, its handler closed.
    ended: std_mpsc::Receiver<()>,
    /// Whether a batch is in the handler.
    busy: Arc<std::sync::atomic::AtomicBool>,
}

/// A batch for the handler thread: its tasks, their time limits (the queue's `timeout`,
/// or a task's own when shorter; empty without a `timeout`) and where the outcome goes.
type Job = (Vec<Task>, Vec<Duration>, oneshot::Sender<Handled>);

/// A batch back from the handler thread (so its payloads need not be copied to go
/// there), and what the handler made of it.
type Handled = (Vec<Task>, HandleResult);

impl Worker {
    /// Starts the handler's thread; `forked`: the slot is a process of its own, which
    /// exits after the handler's `close` (see below).
    fn start(
        mut handler: Box<dyn Handler>,
        ctx: SlotContext,
        forked: bool,
    ) -> Result<Worker, StartError> {
        let (tx, rx) = std_mpsc::channel::<Job>();
        let (init_tx, init_rx) = std_mpsc::channel();
        let (ended_tx, ended) = std_mpsc::channel::<()>();
        let busy = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let in_handler = busy.clone();
        std::thread::Builder::new()
            .name("handler".into())
            .spawn(move || {
                // (dropped last, once the handler is)
                let _ended = ended_tx;
                // init runs on this thread too: whatever it starts (an exec child with
                // PDEATHSIG) is tied to a thread that lives as long as the slot.
                let init = std::panic::catch_unwind(AssertUnwindSafe(|| handler.init(&ctx)));
                let ok = matches!(init, Ok(Ok(())));
                let _ = init_tx.send(match init {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(StartError::Init(e)),
                    Err(p) => Err(StartError::InitPanicked(panicked(&p))),
                });
                if !ok {
                    return;
                }
                while let Ok((batch, limits, reply)) = rx.recv() {
                    in_handler.store(true, std::sync::atomic::Ordering::Release);
                    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        if limits.len() == batch.len() {
                            timeout::handle_each_within(&mut *handler, &ctx, &batch, &limits)
                        } else {
                            handler.handle(&ctx, &batch)
                        }
                    }))
                    .map_err(|p| panicked(&p));
                    in_handler.store(false, std::sync::atomic::Ordering::Release);
                    let _ = reply.send((batch, r));
                }
                if let Err(p) = std::panic::catch_unwind(AssertUnwindSafe(|| handler.close())) {
                    tracing::warn!(queue = %ctx.queue.name, slot = ctx.slot,
                        "handler close panicked: {}", panicked(&p));
                }
                // In a forked slot, closed but not dropped: freeing what `preload` built
                // would write to pages shared with the zygote, for nothing, as the process
                // is about to exit. A slot run inside another process drops it.
                // (either way before `_ended` goes, which tells the slot the handler is
                // done with: a captured value would be dropped only after it)
                if forked {
                    std::mem::forget(handler);
                } else {
                    drop(handler);
                }
            })
            .map_err(StartError::Thread)?;
        init_rx.recv().map_err(|_| StartError::ThreadEnded)??;
        Ok(Worker {
            tx: Some(tx),
            ended,
            busy,
        })
    }

    /// Hands `batch` to the handler thread; `limits`, one per task, make it run one task
    /// at a time under them (slot/timeout.rs), empty the whole batch at once.
    fn handle(&self, batch: Vec<Task>, limits: Vec<Duration>) -> oneshot::Receiver<Handled> {
        let (reply, rx) = oneshot::channel();
        if let Some(tx) = &self.tx {
            let _ = tx.send((batch, limits, reply));
        }
        rx
    }
}

impl Drop for Worker {
    /// Ends the handler thread and waits (at most [`CLOSE_WAIT`]) for its handler's
    /// `close`, so that an exec child gets its orderly end before the slot exits and
    /// PDEATHSIG kills it. A thread still in `handle` (a handler that hangs, which the
    /// slot gave up on) is not waited for.
    fn drop(&mut self) {
        self.tx = None;
        if self.busy.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let _ = self.ended.recv_timeout(CLOSE_WAIT);
    }
}

fn panicked(p: &Box<dyn std::any::Any + Send>) -> Panicked {
    Panicked(
        p.downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic".into()),
    )
}

/// How a slot's life ends: its exit code and why.
type End = (i32, String);

/// The end of a slot the master retired ([`RETIRE_SIGNAL`]): its task in hand ended, and
/// it took no other.
fn retired() -> End {
    (
        EXIT_STOPPED,
        "retired: the master asked it to take no task after the one in hand".into(),
    )
}

/// Where a slot's serving goes once the batch in hand is settled: on to the next batch, or
/// to its end, and with which exit code and reason (observed by the master and by tests).
///
/// Precedence, whatever the order things come in:
/// - [`Serving`](Course::Serving) is where a slot starts; nothing leads back to it.
/// - A stop asked (SIGTERM, or the caller's token) stands for the rest of the slot's life,
///   a recycle due or not: the slot takes no other batch, a handler in hand is asked to
///   stop ([`SlotStop`]; a long task's, through its [`Cancellation`]), a settle retrying
///   through an outage gives up once the leases passed, and what was taken ahead goes back.
/// - A recycle due (the memory check before a settle, a handler given up on, a long task's
///   handler that did not return) ends the slot after the batch in hand, without hurrying
///   that batch. Its code and reason are the slot's exit, a stop asked before or after it
///   notwithstanding: the master counts the recycle (`EXIT_RECYCLE`), or backs off after
///   a handler given up on (`EXIT_FATAL`).
/// - The first recycle due stands: a later one does not replace its code and reason.
/// - A stop with no recycle due exits [`EXIT_STOPPED`], "asked to stop".
///
/// (The master's retire, [`RETIRE_SIGNAL`], is read from its token where it applies: it
/// asks no handler to stop and ends the slot only between batches.)
#[derive(Debug)]
enum Course {
    /// Takes batches on, one after another.
    Serving,
    /// Ends with this code and reason once the batch in hand is settled.
    Recycle(End),
    /// Asked to stop: ends once the batch in hand is finished and settled, with the
    /// recycle's end when one is due too.
    Stopping {
        /// The recycle due, before or after the stop.
        recycle: Option<End>,
    },
}

impl Course {
    /// Takes note of a stop asked, keeping any recycle due.
    fn stop(&mut self) {
        *self = match std::mem::replace(self, Course::Serving) {
            Course::Serving => Course::Stopping { recycle: None },
            Course::Recycle(end) => Course::Stopping { recycle: Some(end) },
            stopping @ Course::Stopping { .. } => stopping,
        };
    }

    /// Takes note of a recycle due with its exit code and reason, unless one is already.
    fn recycle(&mut self, end: End) {
        match self {
            Course::Serving => *self = Course::Recycle(end),
            Course::Stopping { recycle } => {
                recycle.get_or_insert(end);
            }
            Course::Recycle(_) => {}
        }
    }

    /// Whether the slot takes another batch after the one in hand.
    fn takes_more(&self) -> bool {
        matches!(self, Course::Serving)
    }

    /// Whether a stop was asked.
    fn is_stopping(&self) -> bool {
        matches!(self, Course::Stopping { .. })
    }

    /// The end of a recycle due, which ends the slot as soon as its batch is settled.
    fn recycle_due(&self) -> Option<End> {
        match self {
            Course::Recycle(end) | Course::Stopping { recycle: Some(end) } => Some(end.clone()),
            Course::Serving | Course::Stopping { recycle: None } => None,
        }
    }

    /// How the slot ends, when it ends rather than take another batch.
    fn end(&self) -> Option<End> {
        match self {
            Course::Serving => None,
            Course::Stopping { recycle: None } => Some((EXIT_STOPPED, "asked to stop".into())),
            Course::Recycle(_) | Course::Stopping { .. } => self.recycle_due(),
        }
    }
}

async fn run(
    stop: Option<CancellationToken>,
    spec: SlotSpec,
    reporter: Reporter,
    handler: Box<dyn Handler>,
) -> End {
    let SlotSpec {
        queue: cfg,
        slot,
        redis_url,
        namespace,
        connect,
        report: _,
        host,
        chains,
        fork_line,
    } = spec;
    let pid = std::process::id();
    let forked = stop.is_none();
    // (a slot started in-process by a test is stopped by its token alone)
    let (stop, retire) = match stop {
        Some(token) => (token, CancellationToken::new()),
        None => match (
            crate::signals::shutdown_on_sigterm(),
            crate::signals::token_on(RETIRE_SIGNAL),
        ) {
            (Ok(stop), Ok(retire)) => (stop, retire),
            (Err(e), _) | (_, Err(e)) => {
                return (EXIT_FATAL, format!("installing the signal handlers: {e}"));
            }
        },
    };
    // Waits out a Redis outage like every daemon; an error waiting cannot fix (a wrong
    // password) ends the slot.
    let client = match QueueClient::connect_or_stop(&redis_url, &namespace, &connect, &stop).await {
        Ok(Some(client)) => client,
        Ok(None) => return (EXIT_STOPPED, "stopped before connecting".into()),
        Err(e) => return (EXIT_FATAL, format!("{e}: {}", e.source)),
    };
    let queue = match client.queue_with(&cfg.name, QueueLimits::from(&cfg)) {
        Ok(q) => q.with_worker(RecordWorker { host, slot }),
        Err(e) => return (EXIT_FATAL, format!("queue: {e}")),
    };
    let waiter = client.waiter();
    let follow_ups = FollowUps::new(client.clone(), queue.clone(), cfg.clone(), chains);

    let progress_reporter = reporter.clone();
    let cancel = Cancellation::default();
    let handler_stop = SlotStop::default();
    let outside = OutsidePid::default();
    let ctx = SlotContext {
        queue: cfg.clone(),
        slot,
        progress: Some(Arc::new(move || {
            progress_reporter.progress(slot, pid);
        })),
        cancel: cancel.clone(),
        stop: handler_stop.clone(),
        outside: outside.clone(),
        fork_line: fork_line.map(|s| Arc::new(crate::host::fork::ForkLine::new(s))),
    };
    let worker = match Worker::start(handler, ctx, forked) {
        Ok(w) => w,
        Err(e) => return (EXIT_FATAL, e.to_string()),
    };
    reporter.send(&SlotEvent::Ready { slot, pid });
    Serving {
        cfg,
        slot,
        pid,
        queue,
        waiter,
        worker,
        reporter,
        stop,
        retire,
        course: Course::Serving,
        backoff: Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
        layout_refused: false,
        ahead: None,
        in_flight: VecDeque::new(),
        follow_ups,
        cancel,
        handler_stop,
        outside,
        memory: memory::SlotMemory::default(),
    }
    .serve()
    .await
}

/// A connected, initialised slot: the loop take → handle → settle and what it keeps.
struct Serving {
    /// A process of the handler's outside this one's tree (a forked exec child).
    outside: OutsidePid,
    /// The processes its memory is summed over, and what the master was told of them.
    memory: memory::SlotMemory,
    /// The queue it serves.
    cfg: QueueConfig,
    /// The master's number for it.
    slot: u32,
    /// This process.
    pid: u32,
    /// The queue's handle, recording this slot as the worker.
    queue: Queue,
    /// The blocking connection an idle slot waits for wake-ups on.
    waiter: Waiter,
    /// The handler's thread.
    worker: Worker,
    /// Datagrams to the master.
    reporter: Reporter,
    /// Cancelled by SIGTERM (or the caller).
    stop: CancellationToken,
    /// Cancelled by [`RETIRE_SIGNAL`]: the slot ends once its task in hand has ended,
    /// taking no other (sent to long queues' slots, and to a batch slot the master
    /// counts as one since a reload made its queue long).
    retire: CancellationToken,
    /// Whether it serves on after the batch in hand, or ends and how (a stop asked, a
    /// recycle due).
    course: Course,
    /// Pauses after failed takes and wake-up waits.
    backoff: Backoff,
    /// A take was refused for the queue's layout (`gaffer migrate` not run yet): said
    /// once in the log until a take succeeds.
    layout_refused: bool,
    /// The next batch, taken with the last one's settle or prefetched while the handler
    /// ran, once its call is finished.
    ahead: Option<Taken>,
    /// Calls sent and not yet finished, oldest first: at most one without `prefetch`,
    /// and then only inside [`settle_and_take`](Self::settle_and_take); with it, up to
    /// [`in_flight::MAX_IN_FLIGHT`].
    in_flight: VecDeque<in_flight::InFlight>,
    /// Creates a batch's follow-ups before it is settled.
    follow_ups: FollowUps,
    /// The stop of a long task in hand, which its handler sees in its `SlotContext`.
    cancel: Cancellation,
    /// The slot's stop as a batch's handler sees it (`SlotContext::should_stop`): asked
    /// with the stop (`Course::Stopping`), while a batch is in the handler.
    handler_stop: SlotStop,
}

/// A batch in hand and when its leases run out by this process's clock (counted from
/// before the take was sent, so never later than Redis's).
struct Taken {
    batch: Batch,
    lease_until: Instant,
    /// When the take was sent: with the batch's `now_ms`, Redis's clock at any later
    /// moment (for the tasks' enqueue-to-start delays).
    sent: Instant,
    /// Taken ahead, and the last `BatchDone` told the master that it starts next (so no
    /// `BatchStarted` is sent for it, and an `Idle` if it goes back instead).
    announced: bool,
}

impl Taken {
    /// `batch`, taken by a call sent at `sent`.
    fn new(batch: Batch, sent: Instant) -> Self {
        let lease = Duration::from_millis((batch.expires_ms - batch.now_ms).max(0) as u64);
        Taken {
            batch,
            lease_until: sent + lease,
            sent,
            announced: false,
        }
    }

    /// How long its first attempts waited from their enqueue until now, their start (a
    /// retried task's wait was counted at its first attempt).
    fn start_delays(&self) -> StartDelays {
        let now_ms = self.batch.now_ms + self.sent.elapsed().as_millis() as i64;
        let mut d = StartDelays::default();
        for t in self.batch.tasks.iter().filter(|t| t.attempt == 1) {
            if let Some(enqueued) = t.meta.enqueued_ms() {
                d.count((now_ms - enqueued).max(0) as u64);
            }
        }
        d
    }
}

impl Serving {
    async fn serve(mut self) -> End {
        loop {
            self.tell_outside();
            if let Some(end) = self.course.end() {
                self.give_back_ahead().await;
                return end;
            }
            if self.retire.is_cancelled() {
                self.give_back_ahead().await;
                return retired();
            }
            let taken = match self.ahead.take() {
                Some(taken) => match self.still_ours(taken).await {
                    Some(taken) => taken,
                    None => continue,
                },
                None if !self.in_flight.is_empty() => {
                    self.ahead = self.finish_oldest().await;
                    continue;
                }
                None => match self.next_batch().await {
                    Ok(Some(taken)) => taken,
                    Ok(None) => continue,
                    Err(end) => return end,
                },
            };
            // (retired while the take was in flight: a long task would keep it for hours)
            if self.retire.is_cancelled() {
                self.give_back(&taken.batch.tasks, taken.lease_until).await;
                return retired();
            }
            // (asked to stop while the take was in flight: its tasks go back unstarted, as
            // a batch taken ahead does, rather than to a handler asked to stop at once; a
            // long task would start only to be stopped)
            if self.stop.is_cancelled() {
                self.course.stop();
                self.give_back(&taken.batch.tasks, taken.lease_until).await;
                continue;
            }
            if self.cfg.is_long() {
                self.run_long(taken).await;
            } else {
                self.handle(taken).await;
            }
            if let Some(end) = self.course.recycle_due() {
                self.give_back_ahead().await;
                return end;
            }
        }
    }

    /// A batch taken ahead, checked before it reaches the handler: a slot asked to stop
    /// meanwhile keeps it for [`give_back_ahead`](Self::give_back_ahead), and one whose
    /// leases ran out while it waited (another taker may hold them now) goes back
    /// unstarted rather than being run twice.
    async fn still_ours(&mut self, taken: Taken) -> Option<Taken> {
        if self.stop.is_cancelled() {
            self.course.stop();
            self.ahead = Some(taken);
            return None;
        }
        if Instant::now() >= taken.lease_until {
            tracing::warn!(queue = %self.cfg.name, slot = self.slot, tasks = taken.batch.tasks.len(),
                "a batch taken ahead outlived its lease before the handler was free; giving it back");
            self.give_back(&taken.batch.tasks, taken.lease_until).await;
            if taken.announced {
                self.reporter.send(&SlotEvent::Idle {
                    slot: self.slot,
                    pid: self.pid,
                });
            }
            return None;
        }
        Some(taken)
    }

    /// Gives back the batches taken ahead, unstarted: a stopping or recycling slot leaves
    /// them to others at once, with no attempt counted. Calls in flight are finished
    /// first (a take in flight is never dropped: it may have leased tasks), and the
    /// batches go back the latest first, so that they land at the head of their lists in
    /// the order they were taken.
    async fn give_back_ahead(&mut self) {
        let mut ahead: Vec<Taken> = self.ahead.take().into_iter().collect();
        while !self.in_flight.is_empty() {
            ahead.extend(self.finish_oldest().await);
        }
        for taken in ahead.iter().rev() {
            self.give_back(&taken.batch.tasks, taken.lease_until).await;
        }
    }

    /// Hands leased tasks back to the queue unstarted (a batch taken ahead, or the rest
    /// of a batch cut short by a stop). A transient failure is retried, as a settle is,
    /// until their leases run out (`lease_until`): a lease that expires counts an attempt
    /// the task never had, and at `max_attempts` dead-letters it unrun. Returns how many
    /// were stale (their lease already gone elsewhere).
    async fn give_back(&self, tasks: &[LeasedTask], lease_until: Instant) -> u32 {
        if tasks.is_empty() {
            return 0;
        }
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_SETTLE_BACKOFF);
        loop {
            match self.queue.release(tasks).await {
                Ok(results) => return count_stale(&results),
                Err(e) if e.is_transient() && Instant::now() < lease_until => {
                    self.reporter.progress(self.slot, self.pid);
                    tracing::warn!(queue = %self.cfg.name, slot = self.slot, error = %e,
                        "giving back unstarted tasks failed, retrying");
                    backoff.pause().await;
                }
                Err(e) => {
                    tracing::warn!(queue = %self.cfg.name, slot = self.slot, error = %e,
                        "giving back unstarted tasks failed; they come back when their leases expire");
                    return 0;
                }
            }
        }
    }

    /// Takes a batch; `None` after an empty take (having waited for work) or a failed one
    /// (having backed off).
    async fn next_batch(&mut self) -> Result<Option<Taken>, End> {
        let name = &self.cfg.name;
        let slot = self.slot;
        let sent = Instant::now();
        // take is not cancelled by SIGTERM: a cancelled take could have leased tasks
        // that nobody would handle until their lease ran out.
        let batch = match self
            .queue
            .take(self.cfg.batch_size as usize, self.cfg.lease)
            .await
        {
            Ok(b) => {
                self.backoff.reset();
                if std::mem::take(&mut self.layout_refused) {
                    tracing::info!(queue = %name, slot, "the queue's layout is this gaffer's now: taking again");
                }
                b
            }
            Err(e) if e.is_transient() || matches!(e, QueueError::Layout { .. }) => {
                // (a queue not migrated yet is waited out, not crashed on: the master would
                // start the slot again into the same refusal)
                if !matches!(e, QueueError::Layout { .. }) {
                    tracing::warn!(queue = %name, slot, error = %e, "take failed, backing off");
                } else if !std::mem::replace(&mut self.layout_refused, true) {
                    tracing::warn!(queue = %name, slot, error = %e, "take refused, backing off until the queue is migrated");
                }
                tokio::select! {
                    () = self.backoff.pause() => {}
                    () = self.stop.cancelled() => self.course.stop(),
                }
                return Ok(None);
            }
            Err(e) => return Err((EXIT_FATAL, format!("take: {e}"))),
        };
        if !batch.tasks.is_empty() {
            return Ok(Some(Taken::new(batch, sent)));
        }
        let wait = batch
            .next_hint
            .map_or(IDLE_WAIT, |h| (h + Duration::from_millis(1)).min(IDLE_WAIT));
        tokio::select! {
            r = self.queue.wait(&mut self.waiter, wait) => if let Err(e) = r {
                tracing::debug!(queue = %name, slot, error = %e, "wake-up wait failed");
                tokio::select! {
                    () = self.backoff.pause() => {}
                    () = self.stop.cancelled() => self.course.stop(),
                }
            },
            () = self.stop.cancelled() => self.course.stop(),
            // (the loop's top sees it)
            () = self.retire.cancelled() => {}
        }
        Ok(None)
    }

    /// Hands the batch to the handler, extends its leases while it runs, gives back
    /// what a stop left unstarted, settles the outcomes and reports the batch.
    async fn handle(&mut self, taken: Taken) {
        let start_delays = taken.start_delays();
        let Taken {
            mut batch,
            lease_until,
            announced,
            ..
        } = taken;
        let (slot, pid) = (self.slot, self.pid);
        if !announced {
            self.reporter.send(&SlotEvent::BatchStarted {
                slot,
                pid,
                tasks: batch.tasks.len() as u32,
            });
        }
        let started = Instant::now();
        let (refused, tasks) = screen(&self.cfg, slot, &mut batch.tasks);
        let handled = tasks.len();
        let limits = timeout::limits(self.cfg.timeout, &batch.tasks, &refused);
        let (result, back, lease_until) =
            self.run_handler(&batch, tasks, limits, lease_until).await;
        restore_payloads(&mut batch.tasks, &refused, back);
        let busy = started.elapsed();
        let (outcomes, unstarted) = match result {
            Ok(o) => {
                let unstarted = self.unstarted(handled, o.len());
                (o, unstarted)
            }
            Err(panic) => {
                tracing::error!(queue = %self.cfg.name, slot, panic = %panic, "handler panicked; failing the batch");
                self.handler_stop.take_unstarted();
                let reason = format!("handler panicked: {panic}");
                (vec![Outcome::Fail { reason }; handled], Vec::new())
            }
        };
        let outcomes = merge_partial(refused, handled, outcomes, &unstarted);
        let (tasks, outcomes, unstarted) = split_unstarted(batch.tasks, outcomes);
        if !unstarted.is_empty() {
            // Each give-back goes to the head of the queue: a batch taken ahead (later)
            // goes first, so the rest of this one lands before it, as they were taken.
            self.give_back_ahead().await;
        }
        let stale = self.give_back(&unstarted, lease_until).await;
        if !unstarted.is_empty() {
            tracing::info!(queue = %self.cfg.name, slot, settled = tasks.len(), returned = unstarted.len(),
                "asked to stop: the batch's unstarted tasks went back to the queue");
        }
        let (outcomes, made) = self
            .follow_ups
            .before_settle(&tasks, outcomes, lease_until)
            .await;
        let ops = settle_ops(&self.cfg, &tasks, outcomes);
        let failed = ops
            .iter()
            .filter(|op| !matches!(op.action, Settle::Ack))
            .count() as u32;
        let settled = Settled {
            tasks,
            made,
            lease_until,
            failed,
            stale,
            busy,
            start_delays,
            // A batch the handler gave up on is no finished batch: the master takes one as
            // the end of a crash streak, and must instead back off when this slot exits
            // crashed.
            report: self.handler_stop.given_up().is_none(),
        };
        self.settle_and_take(ops, settled).await;
    }

    /// The positions of the handler's batch (of `handled` tasks) that it did not start,
    /// having returned `got` outcomes: none unless the slot asked it to stop; then those
    /// it named ([`SlotStop::leave_unstarted`]: an exec child's reply covering a subset)
    /// and every one past its outcomes (a Rust handler's prefix).
    fn unstarted(&self, handled: usize, got: usize) -> Vec<usize> {
        let mut named = self.handler_stop.take_unstarted();
        if !self.handler_stop.is_asked() {
            return Vec::new();
        }
        named.retain(|&i| i < got.min(handled));
        named.extend(got.min(handled)..handled);
        named
    }

    /// Whether the slot takes another batch after the one in hand: its course serves on,
    /// and no stop was asked since it last looked (that batch would only go back).
    fn goes_on(&self) -> bool {
        self.course.takes_more() && !self.stop.is_cancelled()
    }

    /// Settles a handled batch and ends it ([`end_batch`](Self::end_batch)). A slot that
    /// [goes on](Self::goes_on) (no stop asked, no recycle due) and has no batch ahead yet
    /// takes its next batch in the same call: one round trip per batch. Without
    /// `prefetch` it waits for that call, and its batch goes `ahead`; with it, the call
    /// stays in flight while the slot goes on (`in_flight.rs`). When that call fails, the
    /// settle is retried alone, as always, and the next batch is taken the usual way.
    async fn settle_and_take(&mut self, ops: Vec<SettleOp>, settled: Settled) {
        let due = match self.handler_stop.given_up() {
            Some(reason) => Some((EXIT_FATAL, reason)),
            None => self.over_memory_limit(),
        };
        if let Some(end) = due {
            self.course.recycle(end);
        }
        if self.goes_on() && self.ahead.is_none() && self.in_flight.len() < MAX_IN_FLIGHT {
            self.send_settle_take(ops, settled);
            if !self.cfg.prefetch {
                self.ahead = self.finish_oldest().await;
            }
            return;
        }
        let results = self.settle_alone(&ops, settled.lease_until).await;
        self.end_batch(settled, &results, None).await;
    }

    /// Runs the handler on `tasks` (those of `batch` that passed [`screen`]), extending
    /// the whole batch's leases every lease/3 of their run meanwhile (the first time
    /// lease/3 after they were taken, which for a batch taken ahead may be at once), and
    /// with `prefetch` sending the next take while the handler works when no call is in
    /// flight (after a plain take).
    /// Returns the handler's result and when the leases run out.
    async fn run_handler(
        &mut self,
        batch: &Batch,
        tasks: Vec<Task>,
        limits: Vec<Duration>,
        mut lease_until: Instant,
    ) -> (HandleResult, Vec<Task>, Instant) {
        let lease = self.cfg.lease;
        // A batch refused whole never reaches the handler: handlers are not asked to
        // cope with empty batches.
        let mut reply = if tasks.is_empty() {
            let (tx, rx) = oneshot::channel();
            let _ = tx.send((Vec::new(), Ok(Vec::new())));
            rx
        } else {
            self.worker.handle(tasks, limits)
        };
        let first_extension = lease_until
            .checked_sub(lease - lease / 3)
            .map_or_else(Instant::now, |t| t.max(Instant::now()));
        let mut extend_every = tokio::time::interval_at(
            first_extension.into(),
            (lease / 3).max(Duration::from_millis(10)),
        );
        extend_every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if self.cfg.prefetch
            && self.course.takes_more()
            && self.ahead.is_none()
            && self.in_flight.is_empty()
        {
            self.send_take();
        }
        let mut lost = vec![false; batch.tasks.len()];
        // (the ends of the batches before, if they were held, go out by then at the latest)
        let flush_at = self.reporter.flush_at();
        let report_flush = tokio::time::sleep_until(flush_at.unwrap_or_else(Instant::now).into());
        tokio::pin!(report_flush);
        let mut flushed = flush_at.is_none();
        let (back, result) = loop {
            tokio::select! {
                r = &mut reply => break r.unwrap_or_else(|_| (Vec::new(), Err(Panicked("handler thread ended".into())))),
                () = &mut report_flush, if !flushed => {
                    self.reporter.flush();
                    flushed = true;
                }
                _ = extend_every.tick() => {
                    if extend(&self.queue, &batch.tasks, &mut lost, lease).await {
                        lease_until = Instant::now() + lease;
                    }
                }
                // The handler finishes the task in hand (one that can stop early); the
                // batch is settled and its rest given back; then the loop sees the stop.
                () = self.stop.cancelled(), if !self.course.is_stopping() => {
                    self.course.stop();
                    self.handler_stop.ask();
                }
            }
        };
        (result, back, lease_until)
    }

    /// Tells the master of the slot's outside process when it changed (after init, and
    /// between batches), so that its memory counts as this slot's.
    fn tell_outside(&mut self) {
        if let Some(outside) = self.memory.outside_news(self.outside.get(), Instant::now()) {
            self.reporter.send(&SlotEvent::Outside {
                slot: self.slot,
                pid: self.pid,
                outside,
            });
        }
    }

    /// Recycles the slot when the Private_Dirty of its processes passed the queue's
    /// limit: its own and its descendants' (a spawned exec child, what that started) and
    /// its outside process's tree (a forked exec child).
    fn over_memory_limit(&mut self) -> Option<End> {
        let limit = self.cfg.private_dirty_limit?;
        let dirty = self
            .memory
            .private_dirty(self.pid, self.outside.get(), Instant::now());
        match dirty {
            Ok(dirty) if dirty > limit => Some((
                EXIT_RECYCLE,
                format!(
                    "private dirty memory of the slot's processes {} over the limit of {} (private_dirty_limit)",
                    bytesize::ByteSize(dirty),
                    bytesize::ByteSize(limit)
                ),
            )),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(queue = %self.cfg.name, slot = self.slot, error = %e, "cannot read own memory");
                None
            }
        }
    }
}

/// Splits a batch into the outcomes decided before the handler (a payload over the
/// queue's `max_payload` is rejected: it can never succeed, and must not be copied to a
/// handler that could choke on it) and the tasks the handler gets. JSON depth is left to
/// the handlers that parse JSON ([`Task::json`]): payloads are opaque bytes, and binary
/// ones often have more than 64 unbalanced brackets.
fn screen(
    cfg: &QueueConfig,
    slot: u32,
    tasks: &mut [LeasedTask],
) -> (Vec<Option<Outcome>>, Vec<Task>) {
    let mut refused = Vec::with_capacity(tasks.len());
    let mut handled = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Some(reason) = past_its_attempts(t) {
            tracing::warn!(queue = %cfg.name, slot, task = %t.id, "{reason}; failing it");
            refused.push(Some(Outcome::Reject { reason }));
            continue;
        }
        match check_payload_size(&t.payload, cfg.max_payload) {
            Ok(()) => {
                refused.push(None);
                // (moved, not copied: `restore_payloads` gives it back)
                handled.push(Task {
                    id: t.id.clone(),
                    attempt: t.attempt,
                    payload: std::mem::take(&mut t.payload),
                });
            }
            Err(e) => {
                tracing::warn!(queue = %cfg.name, slot, task = %t.id, "{e}; dead-lettering it");
                refused.push(Some(Outcome::Reject {
                    reason: e.to_string(),
                }));
            }
        }
    }
    (refused, handled)
}

/// Why a task handed out past its max_attempts fails without running: its lease ran out
/// at its last attempt (its slot died), and its queue has failed routes, which a take
/// cannot make (take.lua), so it came back once more for a slot to fail it with them.
fn past_its_attempts(t: &LeasedTask) -> Option<String> {
    let max = t.meta.max_attempts().filter(|&m| m > 0)?;
    (t.attempt > max)
        .then(|| format!("lease expired on attempt {max} of {max} (max_attempts reached)"))
}

/// Gives the tasks [`screen`] passed to the handler their payloads back, from the batch
/// the handler thread returned (none when that thread died: the payloads stay empty).
fn restore_payloads(leased: &mut [LeasedTask], refused: &[Option<Outcome>], back: Vec<Task>) {
    let mut back = back.into_iter();
    for (t, r) in leased.iter_mut().zip(refused) {
        if r.is_none()
            && let Some(b) = back.next()
        {
            t.payload = b.payload;
        }
    }
}

/// The outcomes of the whole batch, in order: those decided by [`screen`], and the
/// handler's for the rest. A handler that returned too few outcomes gets the missing ones
/// failed (retried by policy).
fn merge_outcomes(
    refused: Vec<Option<Outcome>>,
    handled: usize,
    outcomes: Vec<Outcome>,
) -> Vec<Outcome> {
    let got = outcomes.len();
    let mut outcomes = outcomes.into_iter();
    refused
        .into_iter()
        .map(|r| {
            r.or_else(|| outcomes.next())
                .unwrap_or_else(|| Outcome::Fail {
                    reason: format!("handler returned {got} outcomes for a batch of {handled}"),
                })
        })
        .collect()
}

/// Like [`merge_outcomes`], with the handler's positions in `unstarted` (sorted or not)
/// left without an outcome: those tasks go back to the queue unstarted.
fn merge_partial(
    refused: Vec<Option<Outcome>>,
    handled: usize,
    outcomes: Vec<Outcome>,
    unstarted: &[usize],
) -> Vec<Option<Outcome>> {
    if unstarted.is_empty() {
        return merge_outcomes(refused, handled, outcomes)
            .into_iter()
            .map(Some)
            .collect();
    }
    let mut given = vec![true; handled];
    for &i in unstarted {
        given[i] = false;
    }
    let mut outcomes = outcomes.into_iter().map(Some);
    let mut given = given.into_iter();
    refused
        .into_iter()
        .map(|r| match r {
            Some(refused) => Some(refused),
            None => {
                let outcome = outcomes.next().flatten();
                given.next().unwrap_or(false).then_some(outcome).flatten()
            }
        })
        .collect()
}

/// Splits a handled batch into the tasks to settle with their outcomes (in order) and
/// the tasks left without one, to give back unstarted.
fn split_unstarted(
    tasks: Vec<LeasedTask>,
    outcomes: Vec<Option<Outcome>>,
) -> (Vec<LeasedTask>, Vec<Outcome>, Vec<LeasedTask>) {
    if outcomes.iter().all(Option::is_some) {
        return (tasks, outcomes.into_iter().flatten().collect(), Vec::new());
    }
    let (mut settled, mut settles, mut back) = (Vec::new(), Vec::new(), Vec::new());
    for (task, outcome) in tasks.into_iter().zip(outcomes) {
        match outcome {
            Some(outcome) => {
                settled.push(task);
                settles.push(outcome);
            }
            None => back.push(task),
        }
    }
    (settled, settles, back)
}

/// One settle operation per task, from its outcome (one per task, in order).
fn settle_ops(cfg: &QueueConfig, tasks: &[LeasedTask], outcomes: Vec<Outcome>) -> Vec<SettleOp> {
    tasks
        .iter()
        .zip(outcomes)
        .map(|(t, outcome)| {
            let action = match outcome {
                Outcome::Done(done) => match done.result {
                    None => Settle::Ack,
                    Some(result) => Settle::AckWithResult {
                        result: result.to_string(),
                    },
                },
                Outcome::Retry {
                    delay,
                    priority,
                    reason,
                } => Settle::Retry {
                    delay,
                    priority: priority.or(cfg.retry.priority),
                    reason,
                },
                Outcome::Fail { reason } => Settle::Retry {
                    delay: cfg.retry.delay(t.attempt),
                    priority: cfg.retry.priority,
                    reason,
                },
                Outcome::Reject { reason } => Settle::Fail { reason },
            };
            SettleOp::new(t, action)
        })
        .collect()
}

/// Extends the leases of `tasks` but those `lost` marks, and marks those found gone
/// (cancelled, or reclaimed by another slot): asking again would count a stale settle at
/// every tick. Returns whether the call succeeded.
async fn extend(queue: &Queue, tasks: &[LeasedTask], lost: &mut [bool], lease: Duration) -> bool {
    let held: Vec<usize> = (0..tasks.len()).filter(|&i| !lost[i]).collect();
    if held.is_empty() {
        return true;
    }
    let ops: Vec<SettleOp> = held
        .iter()
        .map(|&i| SettleOp::new(&tasks[i], Settle::Extend { lease }))
        .collect();
    match queue.settle(&ops).await {
        Ok(results) => {
            for (&i, r) in held.iter().zip(results) {
                lost[i] = r == SettleResult::Stale;
            }
            true
        }
        Err(e) => {
            tracing::warn!(queue = queue.name(), error = %e, "extending leases failed");
            false
        }
    }
}

/// Settles the batch, retrying while Redis is unreachable or not ready, past the leases'
/// expiry too: until another taker reclaims them, expired leases still take their
/// holder's settle (and a reclaimed one refuses it as stale, harmlessly), so giving up
/// would only make the tasks run again. A stopping slot gives up once the leases have
/// passed; the tasks come back by themselves. Each retry calls `progress`. Returns the
/// results (none when it gave up).
async fn settle(
    queue: &Queue,
    ops: &[SettleOp],
    lease_until: Instant,
    stop: &CancellationToken,
    course: &mut Course,
    progress: &dyn Fn(),
) -> Vec<SettleResult> {
    let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_SETTLE_BACKOFF);
    loop {
        match queue.settle(ops).await {
            Ok(results) => return results,
            Err(e)
                if e.is_transient() && (!course.is_stopping() || Instant::now() < lease_until) =>
            {
                progress();
                tracing::warn!(queue = queue.name(), error = %e, "settle failed, retrying");
                tokio::select! {
                    () = backoff.pause() => {}
                    () = stop.cancelled(), if !course.is_stopping() => course.stop(),
                }
            }
            Err(e) => {
                tracing::error!(queue = queue.name(), error = %e,
                    "settle failed; the tasks come back when their leases expire");
                return Vec::new();
            }
        }
    }
}

/// How many settles were rejected as stale.
fn count_stale(results: &[SettleResult]) -> u32 {
    results
        .iter()
        .filter(|r| matches!(r, SettleResult::Stale))
        .count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settles_are_retried_at_least_every_second() {
        let mut b = Backoff::new(FIRST_BACKOFF, MAX_SETTLE_BACKOFF);
        let pauses: Vec<u128> = (0..8).map(|_| b.next().as_millis()).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        let mut b = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        assert_eq!((0..10).map(|_| b.next()).max(), Some(MAX_BACKOFF));
    }

    fn memory() -> End {
        (EXIT_RECYCLE, "private dirty memory over the limit".into())
    }

    fn given_up() -> End {
        (EXIT_FATAL, "handler given up on".into())
    }

    fn asked_to_stop() -> End {
        (EXIT_STOPPED, "asked to stop".into())
    }

    #[test]
    fn a_serving_slot_takes_more_and_has_no_end() {
        let c = Course::Serving;
        assert!(c.takes_more());
        assert!(!c.is_stopping());
        assert_eq!(c.recycle_due(), None);
        assert_eq!(c.end(), None);
    }

    #[test]
    fn a_stop_alone_exits_stopped_once_the_loop_comes_round() {
        let mut c = Course::Serving;
        c.stop();
        c.stop();
        assert!(c.is_stopping());
        assert!(!c.takes_more());
        // (no recycle due: the slot leaves after the batch by the loop's top, not at once)
        assert_eq!(c.recycle_due(), None);
        assert_eq!(c.end(), Some(asked_to_stop()));
    }

    #[test]
    fn a_recycle_due_ends_the_slot_with_its_code_and_hurries_nothing() {
        let mut c = Course::Serving;
        c.recycle(memory());
        assert!(!c.takes_more());
        // (a settle retrying through an outage keeps at it, as a serving slot's does)
        assert!(!c.is_stopping());
        assert_eq!(c.recycle_due(), Some(memory()));
        assert_eq!(c.end(), Some(memory()));
    }

    /// Every order of a stop and two recycles ends the same way: stopping (a stop stands),
    /// with the first recycle's code and reason (a stop never hides a recycle from the
    /// master, and a later recycle never replaces the first).
    #[test]
    fn a_stop_and_recycles_end_with_the_first_recycle_whatever_their_order() {
        #[derive(Clone, Copy, Debug)]
        enum Ask {
            Stop,
            GivenUp,
            Memory,
        }
        let orders = [
            [Ask::Stop, Ask::GivenUp, Ask::Memory],
            [Ask::Stop, Ask::Memory, Ask::GivenUp],
            [Ask::GivenUp, Ask::Stop, Ask::Memory],
            [Ask::GivenUp, Ask::Memory, Ask::Stop],
            [Ask::Memory, Ask::Stop, Ask::GivenUp],
            [Ask::Memory, Ask::GivenUp, Ask::Stop],
        ];
        for order in orders {
            let first = order.iter().find_map(|ask| match ask {
                Ask::Stop => None,
                Ask::GivenUp => Some(given_up()),
                Ask::Memory => Some(memory()),
            });
            let mut c = Course::Serving;
            for ask in order {
                match ask {
                    Ask::Stop => c.stop(),
                    Ask::GivenUp => c.recycle(given_up()),
                    Ask::Memory => c.recycle(memory()),
                }
                assert!(!c.takes_more(), "{order:?}: took more after {ask:?}");
            }
            assert!(c.is_stopping(), "{order:?}: the stop was forgotten");
            assert_eq!(c.recycle_due(), first, "{order:?}");
            assert_eq!(c.end(), first, "{order:?}");
        }
    }
}
