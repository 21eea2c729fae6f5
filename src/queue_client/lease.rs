//! The hot path: take a leased batch, wait for work, settle (ack, retry, fail, extend).
//! A settle carries its lease's token, so one that comes too late is rejected as stale.
//!
//! **A lease token is the only authority to settle** (ARCHITECTURE.md, invariant 2). A
//! lease exists exactly while it is held: as the member `TOKEN:ID` of `leased`, or as its
//! task's id in a batch lease (`leased:b:TOKEN`, see lua/lib/blocks.lua). Reclaiming,
//! settling and cancelling remove it, and a take leases under a new token. A batch lease
//! goes whole only with an ack of exactly its tasks; anything else splits it into
//! per-task leases first. A settle that finds no lease is stale: it is counted and
//! changes nothing. A lease that expired but was not yet reclaimed can still be settled
//! by its holder, as nobody else has the task. A token is never handed out twice, even
//! after Redis lost an acknowledged take and set the counter `tok` back with it: a token
//! is at least Redis's clock in µs (`new_token` in lua/take.lua), so the holder of the
//! lost one finds its lease gone rather than shared.
//!
//! **No reaper** (invariant 4). A take first brings back what is due: leases that ran out
//! (to the front of their list, the attempt counted, or to the dead letters past
//! `max_attempts`), then delayed tasks (to the back). It moves at most
//! `HOUSEKEEPING_LIMIT` (1,000) of each, or its batch size when that is larger, so no
//! call runs long and an idle queue costs nothing. A queue no slot takes from (a disabled
//! system's) is brought back by [`Queue::reclaim`].
//!
//! **No polling** (invariant 6). An idle taker blocks on the queue's `wake` list (BLPOP,
//! on a connection of its own: [`Waiter`]) until a token comes, its wait runs out, or the
//! next due time or lease expiry that its empty take reported. Whatever makes a task
//! ready pushes a token (an enqueue, a retry without delay, a release, a thaw, a
//! requeue). A full take with more waiting wakes a peer, so a backlog spreads over idle
//! takers; a take that leaves nothing ready drops the tokens left, as each would send an
//! idle taker on an empty take.
//!
//! **What holds a take** (invariant 31). take.lua decides, at every take: it hands out
//! nothing while the queue's system is paused or disabled, nor on an ordered queue while
//! its order says wait (`take_hold` in lua/lib/control.lua). Being the take's, not left
//! to slot counts, the rule binds a slot already running at its next take. A queue whose
//! system has a rate first gets tokens from the system's bucket and takes at most that
//! many (`system`).
//!
//! **What the hot path costs.** docs/STORAGE.md ("Why it is shaped so") has the commands
//! per task, BENCHMARKS.md the figures. A take of first attempts makes one batch lease
//! and its reply (`'b'`) carries no attempts, its ids as one string (the batch's own);
//! an ack of exactly that batch removes it
//! whole, writes no record (given the tasks' record numbers) and replies `{}`. Any other
//! settle, a release, a cancel or an expiry splits the batch into per-task leases first.
//! A settle fences those with one ZADD XX CH that moves each held lease to -inf (the
//! count says whether all are held; only a short count asks which) and one
//! ZREMRANGEBYSCORE of the -inf leases. No reply carries a score, and a lease's expiry
//! goes to Redis once, as text: else Redis would print or parse a double per task. `att`
//! and `err` are touched only for tasks that failed an attempt. Take reads `att` only
//! while `att` holds something, and dead letters keep their attempts there, so a queue
//! with dead letters pays one HMGET more per take.

use std::time::Duration;

use redis::Value;
use serde::Serialize;

use super::args::{Head, ReleaseHead, SettleHead, TakeHead};
use super::block::{batch_ids, packet_tasks, seq_runs};
use super::limits::HOUSEKEEPING_LIMIT;
use super::meta::Meta;
use super::reply::{int, owned_string};
use super::scripts::SCRIPTS;
use super::system::Granted;
use super::{MAX_BATCH, MAX_DELAY, Queue, QueueError, Waiter};

/// One leased task.
#[derive(Debug, Clone)]
pub struct LeasedTask {
    /// Task id.
    pub id: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The payload as enqueued.
    pub payload: Vec<u8>,
    /// The lease token every settle of this task must carry.
    pub token: u64,
    /// What its meta says, as the take found it.
    pub(crate) meta: Meta,
}

/// The result of one take.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Leased tasks, highest priority first.
    pub tasks: Vec<LeasedTask>,
    /// Redis's clock when the batch was taken (ms since the epoch).
    pub now_ms: i64,
    /// When the leases expire (ms since the epoch, Redis's clock); 0 when empty.
    pub expires_ms: i64,
    /// When empty: how soon a delayed task becomes due or a lease expires.
    pub next_hint: Option<Duration>,
}

/// How to settle one leased task.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// Done: delete it.
    Ack,
    /// Done with a result (JSON text), kept in the task's record. A result over the
    /// queue's `max_result` fails the task instead, naming the limit.
    AckWithResult {
        /// The handler's result as JSON text.
        result: String,
    },
    /// Try again after `delay`, optionally at another priority; `reason` becomes its last
    /// error. Past max_attempts it is dead-lettered instead.
    Retry {
        /// Delay before it is due again.
        delay: Duration,
        /// New priority, if any.
        priority: Option<i32>,
        /// Why, kept as the last error.
        reason: String,
    },
    /// Give up: move it to the dead letters with this reason.
    Fail {
        /// Why; shown with the dead letter.
        reason: String,
    },
    /// Keep it leased for this long from now.
    Extend {
        /// New lease length, counted from now.
        lease: Duration,
    },
}

/// One settle request: which lease, and what to do with it.
#[derive(Debug, Clone)]
pub struct SettleOp {
    /// Task id.
    pub id: String,
    /// The attempt the lease was handed out for.
    pub attempt: u32,
    /// The token of the lease being settled.
    pub token: u64,
    /// What to do.
    pub action: Settle,
    /// The task's record's sequence number, as its take found it (`None`: unknown). With
    /// it, the ack of a whole batch writes no record (see `K_DONE` in lua/lib/records.lua); it
    /// must be the take's, or the ack shows other tasks' records as done.
    pub seq: Option<u64>,
}

impl SettleOp {
    /// A settle of `task` with `action`.
    pub fn new(task: &LeasedTask, action: Settle) -> Self {
        SettleOp {
            id: task.id.clone(),
            attempt: task.attempt,
            token: task.token,
            action,
            seq: task.meta.seq,
        }
    }
}

/// What happened to one settle request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SettleResult {
    /// Applied.
    Done,
    /// Rejected: the lease expired and the task was reclaimed, re-leased, settled or
    /// cancelled. Nothing was changed.
    Stale,
    /// A retry past max_attempts, or a result over `max_result`: the task went to the
    /// dead letters.
    DeadLettered,
}

impl Queue {
    /// Takes up to `n` due tasks, each leased for `lease`: highest priority first, FIFO
    /// within a priority. Expired leases and due delayed tasks are brought back first.
    pub async fn take(&self, n: usize, lease: Duration) -> Result<Batch, QueueError> {
        let n = match self.acquire_tokens(n).await? {
            Granted::Tasks(n) => n,
            Granted::None(wait) => return Ok(Batch::rate_limited(wait)),
        };
        let batch = self.take_granted(n, lease).await?;
        self.refund_tokens(n, batch.tasks.len()).await;
        Ok(batch)
    }

    /// Brings back what a take would first (leases that ran out, delayed tasks now due)
    /// and takes nothing: for a queue no slot takes from, such as one of a disabled
    /// system, whose sweep then cancels them.
    pub async fn reclaim(&self) -> Result<(), QueueError> {
        let args = TakeHead {
            n: 0,
            ..self.take_args(1, Duration::from_secs(1))?
        };
        let mut inv = self.invocation(&SCRIPTS.take);
        inv.head(&args);
        let mut conn = self.conn.clone();
        let _: Value = inv.invoke_async(&mut conn).await?;
        Ok(())
    }

    /// take.lua for `n` tasks whose tokens (if the system has a rate) are in hand.
    async fn take_granted(&self, n: usize, lease: Duration) -> Result<Batch, QueueError> {
        let mut inv = self.invocation(&SCRIPTS.take);
        inv.head(&self.take_args(n, lease)?);
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        parse_take(reply)
    }

    /// Settles a handled batch and takes the next in one round trip: what a slot does in
    /// its steady state. The settle is applied first, exactly as [`settle`](Self::settle)
    /// applies it (a stale op is rejected and counted); then up to `n` tasks are taken as
    /// [`take`](Self::take) takes them. `ops` must not be empty.
    pub async fn settle_take(
        &self,
        ops: &[SettleOp],
        n: usize,
        lease: Duration,
    ) -> Result<(Vec<SettleResult>, Batch), QueueError> {
        if ops.is_empty() {
            return Err(QueueError::Invalid(
                "settle_take needs at least one op to settle".into(),
            ));
        }
        let n = match self.acquire_tokens(n).await? {
            Granted::Tasks(n) => n,
            Granted::None(wait) => {
                return Ok((self.settle(ops).await?, Batch::rate_limited(wait)));
            }
        };
        let take_args = self.take_args(n, lease)?;
        let checked = self.check_results(ops);
        let ops = checked.as_deref().unwrap_or(ops);
        let order = SettleOrder::of(ops);
        let mut inv = self.invocation(&SCRIPTS.settle_take);
        self.push_settle_args(&mut inv, ops, &order);
        inv.head(&take_args).arg(TakeHead::NAMES.len());
        let mut conn = self.conn.clone();
        let (settled, taken): (Vec<i64>, Vec<Value>) = inv.invoke_async(&mut conn).await?;
        let batch = parse_take(taken)?;
        self.refund_tokens(n, batch.tasks.len()).await;
        Ok((order.results(settled)?, batch))
    }

    /// take.lua's arguments (all of them its head).
    fn take_args(&self, n: usize, lease: Duration) -> Result<TakeHead, QueueError> {
        if n == 0 || n > MAX_BATCH {
            return Err(QueueError::Invalid(format!(
                "batch size must be 1 to {MAX_BATCH}, got {n}"
            )));
        }
        let lease_ms = lease.as_millis();
        if lease_ms == 0 {
            return Err(QueueError::Invalid("lease must be at least 1ms".into()));
        }
        let (host, slot) = self.worker_args();
        Ok(TakeHead {
            n,
            lease_ms: lease_ms as u64,
            limit: HOUSEKEEPING_LIMIT.max(n),
            host: host.to_string(),
            slot,
            history_ttl_ms: self.ttl_arg(),
            system: self.configured_system_state(),
            ordered: self.limits.ordered,
            failed_routes: self.limits.failed_routes,
        })
    }

    /// Like [`take`](Self::take), but when nothing is due waits up to `max_wait` for an
    /// enqueue (woken through `waiter`, no polling) or for the next delayed task or lease
    /// expiry. Returns an empty batch when `max_wait` passes.
    pub async fn take_wait(
        &self,
        waiter: &mut Waiter,
        n: usize,
        lease: Duration,
        max_wait: Duration,
    ) -> Result<Batch, QueueError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            let batch = self.take(n, lease).await?;
            let now = tokio::time::Instant::now();
            if !batch.tasks.is_empty() || now >= deadline {
                return Ok(batch);
            }
            let mut wait = deadline - now;
            if let Some(hint) = batch.next_hint {
                wait = wait.min(hint + Duration::from_millis(1));
            }
            if let Err(e) = waiter.wait(self.keys.wake(), wait).await {
                // The next take reports the outage; pausing here keeps a broken waiter
                // from turning this loop into a busy one.
                tracing::debug!(queue = %self.name, error = %e, "wake-up wait failed");
                tokio::time::sleep(wait.min(Duration::from_millis(500))).await;
            }
        }
    }

    /// Waits up to `timeout` for an enqueue to this queue (or a wake-up from another
    /// taker's take); true when woken. For takers that run their own loop around
    /// [`take`](Self::take) and must stay cancellable while idle.
    pub async fn wait(&self, waiter: &mut Waiter, timeout: Duration) -> Result<bool, QueueError> {
        waiter.wait(self.keys.wake(), timeout).await
    }

    /// Whether each of `tasks`' leases still stands, by position, reading only: false for
    /// a task cancelled since it was taken (its lease removed), or reclaimed by another
    /// slot after its lease ran out. One expired that nobody reclaimed still stands: its
    /// settle would be taken.
    pub async fn leases_held(&self, tasks: &[&LeasedTask]) -> Result<Vec<bool>, QueueError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.invocation(&SCRIPTS.held);
        for t in tasks {
            inv.arg(t.token).arg(&t.id);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = inv.invoke_async(&mut conn).await?;
        if reply.len() != tasks.len() {
            return Err(QueueError::Protocol(format!(
                "lease check of {} tasks answered {} values",
                tasks.len(),
                reply.len()
            )));
        }
        Ok(reply.into_iter().map(|v| v == 1).collect())
    }

    /// Settles leased tasks in one round trip. Each result says whether it was applied or
    /// rejected as stale.
    pub async fn settle(&self, ops: &[SettleOp]) -> Result<Vec<SettleResult>, QueueError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let checked = self.check_results(ops);
        let ops = checked.as_deref().unwrap_or(ops);
        let order = SettleOrder::of(ops);
        let inv = self.settle_invocation(ops, &order);
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = inv.invoke_async(&mut conn).await?;
        order.results(reply)
    }

    /// The settle script's call.
    fn settle_invocation(
        &self,
        ops: &[SettleOp],
        order: &SettleOrder,
    ) -> super::scripts::Call<'static> {
        let mut inv = self.invocation(&SCRIPTS.settle);
        self.push_settle_args(&mut inv, ops, order);
        inv
    }

    /// settle.lua's arguments: its header (with the first attempts' shared token), then
    /// the acks of first attempts, those of later attempts, and the other ops, in `order`.
    pub(super) fn push_settle_args(
        &self,
        inv: &mut super::scripts::Call<'_>,
        ops: &[SettleOp],
        order: &SettleOrder,
    ) {
        let (host, slot) = self.worker_args();
        let first = !order.first.is_empty();
        inv.head(&SettleHead {
            k1: order.first.len(),
            k2: order.later.len(),
            host: host.to_string(),
            slot,
            history_ttl_ms: self.ttl_arg(),
            ordered: self.limits.ordered,
            token: if first {
                order.token.to_string()
            } else {
                String::new()
            },
            runs: if first {
                seq_runs(order.first.iter().map(|&i| ops[i].seq))
            } else {
                String::new()
            },
        });
        for &i in &order.first {
            inv.arg(&ops[i].id);
        }
        // Later attempts carry their attempt: the record's done entry names it.
        for &i in &order.later {
            inv.arg(&ops[i].id).arg(ops[i].token).arg(ops[i].attempt);
        }
        for &i in &order.others {
            push_other_op(inv, &ops[i]);
        }
    }

    /// The ops with every result over `max_result` turned into a fail naming the limit
    /// (never cut: a cut result would be a wrong one); `None` when all fit.
    fn check_results(&self, ops: &[SettleOp]) -> Option<Vec<SettleOp>> {
        let limit = self.limits.max_result;
        let too_big = |op: &SettleOp| matches!(&op.action, Settle::AckWithResult { result } if result.len() as u64 > limit);
        if !ops.iter().any(too_big) {
            return None;
        }
        Some(
            ops.iter()
                .map(|op| match &op.action {
                    Settle::AckWithResult { result } if too_big(op) => SettleOp {
                        action: Settle::Fail {
                            reason: format!(
                                "result of {} bytes exceeds max_result {} bytes of queue {}",
                                result.len(),
                                limit,
                                self.name
                            ),
                        },
                        ..op.clone()
                    },
                    _ => op.clone(),
                })
                .collect(),
        )
    }

    /// Hands leased tasks back unstarted, in one round trip: each goes back to the front
    /// of its priority's list with no attempt counted, so the next take hands it out at
    /// the same attempt. For a batch a slot took but will not run (it is stopping, or the
    /// batch waited past its lease). Fenced like a settle: a lease no longer held is
    /// left alone and reported stale. A long task whose cancel was asked ends cancelled
    /// instead (it would otherwise run again elsewhere before its cancel was seen).
    pub async fn release(&self, tasks: &[LeasedTask]) -> Result<Vec<SettleResult>, QueueError> {
        self.release_noted(tasks, "").await
    }

    /// Hands back a long task its slot stopped before it ended (a drain, a smaller map),
    /// as [`Queue::release`] does, except that it ran: its record keeps the run and a
    /// waiting entry with `note`, at the attempts it had used before this one (none is
    /// counted for a run its slot cut short).
    pub async fn hand_back_started(
        &self,
        task: &LeasedTask,
        note: &str,
    ) -> Result<SettleResult, QueueError> {
        // (an empty note would read as a task that never started)
        let note = if note.is_empty() { "handed back" } else { note };
        let mut r = self.release_noted(std::slice::from_ref(task), note).await?;
        Ok(r.pop().unwrap_or(SettleResult::Stale))
    }

    async fn release_noted(
        &self,
        tasks: &[LeasedTask],
        note: &str,
    ) -> Result<Vec<SettleResult>, QueueError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let (host, slot) = self.worker_args();
        let mut inv = self.invocation(&SCRIPTS.release);
        inv.head(&ReleaseHead {
            history_ttl_ms: self.ttl_arg(),
            note: note.to_string(),
            host: host.to_string(),
            slot,
        });
        for t in tasks {
            inv.arg(&t.id).arg(t.token).arg(t.attempt);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = inv.invoke_async(&mut conn).await?;
        if reply.len() != tasks.len() {
            return Err(QueueError::Protocol(format!(
                "release of {} returned {} results",
                tasks.len(),
                reply.len()
            )));
        }
        Ok(reply
            .into_iter()
            .map(|r| match r {
                1 => SettleResult::Done,
                _ => SettleResult::Stale,
            })
            .collect())
    }

    /// Acks leased tasks (one round trip).
    pub async fn ack(&self, tasks: &[LeasedTask]) -> Result<Vec<SettleResult>, QueueError> {
        let ops: Vec<SettleOp> = tasks
            .iter()
            .map(|t| SettleOp::new(t, Settle::Ack))
            .collect();
        self.settle(&ops).await
    }

    /// Extends the leases of tasks still being worked on (one round trip).
    pub async fn extend(
        &self,
        tasks: &[LeasedTask],
        lease: Duration,
    ) -> Result<Vec<SettleResult>, QueueError> {
        let ops: Vec<SettleOp> = tasks
            .iter()
            .map(|t| SettleOp::new(t, Settle::Extend { lease }))
            .collect();
        self.settle(&ops).await
    }
}

impl Batch {
    /// The empty batch of a take its system's rate held back: the next token in `wait`.
    fn rate_limited(wait: Duration) -> Self {
        Batch {
            tasks: Vec::new(),
            now_ms: 0,
            expires_ms: 0,
            next_hint: Some(wait),
        }
    }
}

/// take.lua's reply, by the kind its first value names. The values are taken apart by
/// value: a payload is moved into its task, never copied.
fn parse_take(reply: Vec<Value>) -> Result<Batch, QueueError> {
    let mut it = reply.into_iter();
    let kind = it.next().map(owned_string).transpose()?.unwrap_or_default();
    let mut rest: Vec<Value> = it.collect();
    let bad = |shape: &str| QueueError::Protocol(format!("take's reply {kind:?} is not {shape}"));
    match kind.as_str() {
        "n" => {
            let [now, hint] = &rest[..] else {
                return Err(bad("{'n', now, hint}"));
            };
            let hint = int(hint)?;
            Ok(Batch {
                tasks: Vec::new(),
                now_ms: int(now)?,
                expires_ms: 0,
                next_hint: (hint >= 0).then(|| Duration::from_millis(hint as u64)),
            })
        }
        "a" if rest.len() >= 3 && (rest.len() - 3).is_multiple_of(3) => {
            let values = rest.split_off(3);
            let token = int(&rest[1])? as u64;
            let mut tasks = Vec::with_capacity(values.len() / 3);
            let mut values = values.into_iter();
            while let (Some(id), Some(attempt), payload) =
                (values.next(), values.next(), values.next())
            {
                tasks.push(leased(
                    owned_string(id)?,
                    int(&attempt)? as u32,
                    payload,
                    token,
                )?);
            }
            taken(tasks, &rest[0], &rest[2])
        }
        "a" => Err(bad("{'a', now, token, expiry, (id, attempt, payload)...}")),
        "f" => {
            let Ok([now, token, exp, Value::Array(ids), Value::Array(payloads)]) =
                <[Value; 5]>::try_from(rest)
            else {
                return Err(bad("{'f', now, token, expiry, ids, payloads}"));
            };
            let ids = ids
                .into_iter()
                .map(owned_string)
                .collect::<Result<_, _>>()?;
            let tasks = first_attempts(ids, payloads, &token)?;
            taken(tasks, &now, &exp)
        }
        "b" => {
            let Ok(
                [
                    now,
                    token,
                    exp,
                    Value::BulkString(framed),
                    Value::Array(payloads),
                ],
            ) = <[Value; 5]>::try_from(rest)
            else {
                return Err(bad("{'b', now, token, expiry, framed ids, payloads}"));
            };
            let tasks = first_attempts(batch_ids(&framed)?, payloads, &token)?;
            taken(tasks, &now, &exp)
        }
        "p" => {
            let [
                now,
                token,
                exp,
                Value::BulkString(store),
                Value::BulkString(got),
            ] = &rest[..]
            else {
                return Err(bad("{'p', now, token, expiry, store, taken}"));
            };
            taken(packet_tasks(store, got, int(token)? as u64)?, now, exp)
        }
        _ => Err(QueueError::Protocol(format!(
            "take returned a reply of kind {kind:?}"
        ))),
    }
}

/// Tasks at their first attempt under `token`: `ids` and `payloads` in the same order.
fn first_attempts(
    ids: Vec<String>,
    payloads: Vec<Value>,
    token: &Value,
) -> Result<Vec<LeasedTask>, QueueError> {
    if ids.len() != payloads.len() {
        return Err(QueueError::Protocol(format!(
            "take returned {} ids and {} payloads",
            ids.len(),
            payloads.len()
        )));
    }
    let token = int(token)? as u64;
    ids.into_iter()
        .zip(payloads)
        .map(|(id, payload)| leased(id, 1, Some(payload), token))
        .collect()
}

/// A batch of `tasks` taken at `now`, their leases until `exp`.
fn taken(tasks: Vec<LeasedTask>, now: &Value, exp: &Value) -> Result<Batch, QueueError> {
    Ok(Batch {
        tasks,
        now_ms: int(now)?,
        expires_ms: int(exp)?,
        next_hint: None,
    })
}

/// One task of a take's reply.
fn leased(
    id: String,
    attempt: u32,
    payload: Option<Value>,
    token: u64,
) -> Result<LeasedTask, QueueError> {
    let (meta, payload) = match payload {
        Some(Value::BulkString(b)) => split_value(b)?,
        _ => (Meta::default(), Vec::new()),
    };
    Ok(LeasedTask {
        id,
        attempt,
        payload,
        token,
        meta,
    })
}

/// A task's stored value, which is its meta, a newline, then the payload (lua/lib/tasks.lua,
/// `task_value`): the meta is cut off here rather than in the take, whose reply then
/// needs no loop over the tasks.
fn split_value(mut value: Vec<u8>) -> Result<(Meta, Vec<u8>), QueueError> {
    let Some(cut) = value.iter().position(|&b| b == b'\n') else {
        return Err(QueueError::Protocol(
            "take returned a task value without its meta".into(),
        ));
    };
    let meta = Meta::parse(&value[..cut]);
    value.drain(..=cut);
    Ok((meta, value))
}

/// Where each op goes in the settle script's arguments. Acks go first as (id, token)
/// pairs, those of first attempts before the rest (only later attempts have state to clean
/// up); other ops follow with all their arguments.
pub(super) struct SettleOrder {
    /// Acks of first attempts that hold `token` (indices into the ops): sent as bare ids.
    first: Vec<usize>,
    /// The lease token of every op in `first`.
    token: u64,
    /// Acks of later attempts, and of first attempts under another token.
    later: Vec<usize>,
    /// Everything else: extend, retry, fail, ack with a result.
    others: Vec<usize>,
}

impl SettleOrder {
    /// The ops' indices in the script's three groups, each in the ops' order.
    pub(super) fn of(ops: &[SettleOp]) -> Self {
        let is_ack = |i: &usize| ops[*i].action == Settle::Ack;
        // A slot settles one batch, so its first attempts share one token: the script
        // gets it once. Any other token goes with the later attempts, which carry theirs.
        let token = (0..ops.len())
            .find(|i| is_ack(i) && ops[*i].attempt <= 1)
            .map_or(0, |i| ops[i].token);
        let in_first = |i: &usize| is_ack(i) && ops[*i].attempt <= 1 && ops[*i].token == token;
        let first: Vec<usize> = (0..ops.len()).filter(in_first).collect();
        let later: Vec<usize> = (0..ops.len())
            .filter(|i| is_ack(i) && !in_first(i))
            .collect();
        let others: Vec<usize> = (0..ops.len()).filter(|i| !is_ack(i)).collect();
        SettleOrder {
            first,
            token,
            later,
            others,
        }
    }

    /// How many ops, and so how many codes the script replies.
    fn len(&self) -> usize {
        self.first.len() + self.later.len() + self.others.len()
    }

    /// The script's reply, one code per op in this order, as results in the ops' order.
    pub(super) fn results(&self, reply: Vec<i64>) -> Result<Vec<SettleResult>, QueueError> {
        let n = self.len();
        // No codes: every op was applied (the script's short answer for the common case).
        if reply.is_empty() {
            return Ok(vec![SettleResult::Done; n]);
        }
        if reply.len() != n {
            return Err(QueueError::Protocol(format!(
                "settle of {} returned {} results",
                n,
                reply.len()
            )));
        }
        let mut out = vec![SettleResult::Stale; n];
        for (&i, r) in self
            .first
            .iter()
            .chain(&self.later)
            .chain(&self.others)
            .zip(reply)
        {
            out[i] = match r {
                1 => SettleResult::Done,
                2 => SettleResult::DeadLettered,
                _ => SettleResult::Stale,
            };
        }
        Ok(out)
    }
}

/// Adds one op other than a plain ack to the settle script's call: its kind, id, token
/// and attempt, then three arguments whose meaning depends on the kind.
fn push_other_op(inv: &mut super::scripts::Call<'_>, op: &SettleOp) {
    inv.arg(match op.action {
        Settle::Ack => unreachable!("acks are sent before the other ops"),
        Settle::Extend { .. } => "e",
        Settle::Retry { .. } => "r",
        Settle::Fail { .. } => "f",
        Settle::AckWithResult { .. } => "d",
    })
    .arg(&op.id)
    .arg(op.token)
    .arg(op.attempt);
    match &op.action {
        Settle::Ack => {}
        Settle::Extend { lease } => {
            inv.arg(lease.as_millis().max(1) as u64).arg("").arg("");
        }
        Settle::Retry {
            delay,
            priority,
            reason,
        } => {
            // Clamped, not refused: refusing would leave the task leased.
            inv.arg((*delay).min(MAX_DELAY).as_millis() as u64)
                .arg(priority.map(|p| p.to_string()).unwrap_or_default())
                .arg(reason);
        }
        Settle::Fail { reason } => {
            inv.arg(reason).arg("").arg("");
        }
        Settle::AckWithResult { result } => {
            inv.arg(result).arg("").arg("");
        }
    }
}

/// Checks that the Redis user may run what settles need beside the scripts' other
/// commands and an older ACL may lack: `ZREMRANGEBYSCORE` (SECURITY.md's lines from
/// 2026-11-24), run on a key no queue has, so nothing changes, and `WAIT` when writes are
/// confirmed on replicas (`wait_replicas`; asked for none, it answers at once). A master
/// calls it at its start so that a missing command is a clear error there, not a settle
/// refused later. Errors other than the ACL's refusal are left to the calls that follow.
pub async fn check_settle_commands(client: &super::QueueClient) -> Result<(), QueueError> {
    if client.durability().waits() {
        let waited: Result<i64, _> = redis::cmd("WAIT")
            .arg(0)
            .arg(0)
            .query_async(&mut client.connection())
            .await;
        if let Err(e) = waited.map_err(QueueError::from)
            && e.cause() == super::Cause::AclRefused
        {
            return Err(QueueError::Invalid(format!(
                "the redis user may not run WAIT, which [cluster] wait_replicas needs: add \
                 +wait to its ACL line (docs/SECURITY.md) ({e})"
            )));
        }
    }
    let probe = format!("{}:{{acl-probe}}:leased", client.namespace());
    let done: Result<i64, _> = redis::cmd("ZREMRANGEBYSCORE")
        .arg(&probe)
        .arg("-inf")
        .arg("-inf")
        .query_async(&mut client.connection())
        .await;
    match done.map_err(QueueError::from) {
        Err(e) if e.cause() == super::Cause::AclRefused => Err(QueueError::Invalid(format!(
            "the redis user may not run ZREMRANGEBYSCORE, which settles need: add \
             +zremrangebyscore to its ACL line (docs/SECURITY.md) ({e})"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue_client::meta::MetaChain;

    #[test]
    fn a_value_splits_into_its_meta_and_payload() {
        let (meta, payload) = split_value(b"-2:5:1700:cQ:G~1\n{\"a\":\n1}".to_vec()).unwrap();
        assert_eq!(payload, b"{\"a\":\n1}");
        assert_eq!(meta, Meta::parse(b"-2:5:1700:cQ:G~1"));
        assert_eq!(meta.chain, MetaChain::Of("Q:G~1".into()));
        let (meta, payload) = split_value(b"0:3:1\n".to_vec()).unwrap();
        assert_eq!((meta.max_attempts(), payload.len()), (Some(3), 0));
        assert!(split_value(b"no meta".to_vec()).is_err());
    }

    #[test]
    fn a_take_reply_is_read_by_its_kind() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let none = parse_take(vec![text("n"), Value::Int(5), Value::Int(-1)]).unwrap();
        assert_eq!((none.tasks.len(), none.next_hint), (0, None));
        let value = |p: &str| text(&format!("0:3:1700\n{p}"));
        let first = parse_take(vec![
            text("f"),
            Value::Int(5),
            Value::Int(9),
            Value::Int(30),
            Value::Array(vec![text("a"), text("b")]),
            Value::Array(vec![value("x"), value("y")]),
        ])
        .unwrap();
        let ids: Vec<(&str, u32, u64)> = first
            .tasks
            .iter()
            .map(|t| (t.id.as_str(), t.attempt, t.token))
            .collect();
        assert_eq!(ids, [("a", 1, 9), ("b", 1, 9)]);
        assert_eq!((first.now_ms, first.expires_ms), (5, 30));
        // (a batch lease's ids come as the batch keeps them: FS id FS ... FS)
        let batch = parse_take(vec![
            text("b"),
            Value::Int(5),
            Value::Int(9),
            Value::Int(30),
            text("\u{1f}a\u{1f}bc\u{1f}"),
            Value::Array(vec![value("x"), value("y")]),
        ])
        .unwrap();
        let got: Vec<(&str, u32, u64, &[u8])> = batch
            .tasks
            .iter()
            .map(|t| (t.id.as_str(), t.attempt, t.token, &t.payload[..]))
            .collect();
        assert_eq!(got, [("a", 1, 9, &b"x"[..]), ("bc", 1, 9, &b"y"[..])]);
        let any = parse_take(vec![
            text("a"),
            Value::Int(5),
            Value::Int(9),
            Value::Int(30),
            text("c"),
            Value::Int(2),
            value("z"),
        ])
        .unwrap();
        assert_eq!(
            (
                any.tasks[0].id.as_str(),
                any.tasks[0].attempt,
                &any.tasks[0].payload[..]
            ),
            ("c", 2, &b"z"[..])
        );
        // (a shape that does not fit its kind, and an unknown kind, are protocol errors)
        for bad in [
            vec![
                text("a"),
                Value::Int(5),
                Value::Int(9),
                Value::Int(30),
                text("c"),
            ],
            vec![text("f"), Value::Int(5)],
            // (ids not framed, or fewer than payloads)
            vec![
                text("b"),
                Value::Int(5),
                Value::Int(9),
                Value::Int(30),
                text("a\u{1f}b"),
                Value::Array(vec![value("x"), value("y")]),
            ],
            vec![
                text("b"),
                Value::Int(5),
                Value::Int(9),
                Value::Int(30),
                text("\u{1f}a\u{1f}"),
                Value::Array(vec![value("x"), value("y")]),
            ],
            vec![text("x"), Value::Int(5), Value::Int(0), Value::Int(0)],
            vec![Value::Int(5), Value::Int(0), Value::Int(0)],
        ] {
            assert!(matches!(parse_take(bad), Err(QueueError::Protocol(_))));
        }
    }
}
