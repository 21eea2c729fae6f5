//! Long tasks (`kind = "long"`): the renewal a slot sends every tick while its one task
//! runs (which also tells it of a cancel asked meanwhile), and the two ways such a task
//! ends: stopped after a cancel, or returned and settled like any task.

use std::time::Duration;

use redis::Value;

use super::lease::SettleOrder;
use super::reply::{int, string};
use super::scripts::SCRIPTS;
use super::{LeasedTask, Queue, QueueError, SettleOp, SettleResult};

/// What a renewal of a long task's lease found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// The lease runs the full lease from now.
    Renewed,
    /// Renewed, and a cancel was asked: the slot stops the task and ends it with
    /// [`Queue::end_cancelled`].
    CancelAsked {
        /// Who asked (the note of the cancel).
        note: String,
    },
    /// No lease with this token: it ran out and another slot may hold the task, or the
    /// task ended. The slot stops the task at once and settles nothing.
    Lost,
}

/// How a long task that returned was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongSettled {
    /// Settled by its outcome, as any task.
    Settled(SettleResult),
    /// A cancel asked meanwhile won: the task ended cancelled, its outcome unused.
    Cancelled,
}

impl Queue {
    /// Renews a running long task's lease to `lease` from now and reports a cancel asked
    /// of it.
    pub async fn renew_long(
        &self,
        task: &LeasedTask,
        lease: Duration,
    ) -> Result<Renewal, QueueError> {
        let mut inv = self.invocation(&SCRIPTS.long);
        inv.arg("renew")
            .arg(&task.id)
            .arg(task.token)
            .arg(lease.as_millis().max(1) as u64);
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        match reply.as_slice() {
            [code] if int(code)? == 0 => Ok(Renewal::Lost),
            [code] if int(code)? == 1 => Ok(Renewal::Renewed),
            [code, note] if int(code)? == 2 => Ok(Renewal::CancelAsked {
                note: string(note)?,
            }),
            other => Err(QueueError::Protocol(format!(
                "long renewal returned {other:?}"
            ))),
        }
    }

    /// Ends a long task its slot stopped after a cancel: the record says cancelled (with
    /// the asker's note). False when the lease was no longer held.
    pub async fn end_cancelled(&self, task: &LeasedTask) -> Result<bool, QueueError> {
        let mut inv = self.invocation(&SCRIPTS.long);
        inv.arg("cancelled");
        self.push_long_head(&mut inv, task);
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = inv.invoke_async(&mut conn).await?;
        Ok(reply.first() == Some(&1))
    }

    /// Settles a long task that returned, by `op` (its outcome), unless a cancel was
    /// asked meanwhile: then it ends cancelled, as the cancel's caller was told.
    pub async fn settle_long(
        &self,
        task: &LeasedTask,
        op: &SettleOp,
    ) -> Result<LongSettled, QueueError> {
        let ops = std::slice::from_ref(op);
        let order = SettleOrder::of(ops);
        let mut inv = self.invocation(&SCRIPTS.long);
        inv.arg("settle");
        self.push_long_head(&mut inv, task);
        self.push_settle_args(&mut inv, ops, &order);
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        match reply.as_slice() {
            [kind] if string(kind)? == "c" => Ok(LongSettled::Cancelled),
            [kind, results] if string(kind)? == "s" => {
                let codes: Vec<i64> = redis::from_redis_value(results.clone())
                    .map_err(|e| QueueError::Protocol(format!("long settle results: {e}")))?;
                let r = order.results(codes)?;
                Ok(LongSettled::Settled(r[0]))
            }
            other => Err(QueueError::Protocol(format!(
                "long settle returned {other:?}"
            ))),
        }
    }

    /// long.lua's arguments after the op: the lease, attempt, worker and record TTL.
    fn push_long_head(&self, inv: &mut super::scripts::Call<'_>, task: &LeasedTask) {
        let (host, slot) = self.worker_args();
        inv.arg(&task.id)
            .arg(task.token)
            .arg(task.attempt)
            .arg(host)
            .arg(slot)
            .arg(self.ttl_arg());
    }
}
