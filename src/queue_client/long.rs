//! Long tasks (`kind = "long"`): the renewal a slot sends every tick while its one task
//! runs (which also tells it of a cancel asked meanwhile), and the two ways such a task
//! ends: stopped after a cancel, or returned and settled like any task.

use std::time::Duration;

use redis::Value;

use super::args::LongHead;
use super::lease::SettleOrder;
use super::reply::string;
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
        inv.head(&self.long_head("renew", task, lease.as_millis().max(1) as u64));
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        let kind = reply.first().map(string).transpose()?;
        match (kind.as_deref(), reply.get(1)) {
            (Some("lost"), None) => Ok(Renewal::Lost),
            (Some("renewed"), None) => Ok(Renewal::Renewed),
            (Some("cancel_asked"), Some(note)) => Ok(Renewal::CancelAsked {
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
        inv.head(&self.long_head("cancelled", task, 0));
        let mut conn = self.conn.clone();
        let reply: Vec<String> = inv.invoke_async(&mut conn).await?;
        match reply.first().map(String::as_str) {
            Some("ended") => Ok(true),
            Some("lost") => Ok(false),
            other => Err(QueueError::Protocol(format!(
                "long cancelled returned {other:?}"
            ))),
        }
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
        inv.head(&self.long_head("settle", task, 0));
        self.push_settle_args(&mut inv, ops, &order);
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        match reply.as_slice() {
            [kind] if string(kind)? == "cancelled" => Ok(LongSettled::Cancelled),
            [kind, results] if string(kind)? == "settled" => {
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

    /// long.lua's head for `op` on `task` (`lease_ms`: a renewal's, else 0).
    fn long_head(&self, op: &'static str, task: &LeasedTask, lease_ms: u64) -> LongHead {
        let (host, slot) = self.worker_args();
        LongHead {
            op,
            id: task.id.clone(),
            token: task.token,
            lease_ms,
            attempt: task.attempt,
            host: host.to_string(),
            slot,
            history_ttl_ms: self.ttl_arg(),
        }
    }
}
