//! Statistics and housekeeping: a queue's counts and counters, and the deletion of
//! records whose time is up.

use redis::Value;
use serde::Serialize;

use super::args::HousekeepHead;
use super::reply::{int, string};
use super::scripts::SCRIPTS;
use super::{Queue, QueueError};

/// A queue's counts and monotonic counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    /// Due and waiting.
    pub ready: u64,
    /// Not yet due.
    pub delayed: u64,
    /// Handed out (including expired leases not yet reclaimed).
    pub leased: u64,
    /// Dead letters.
    pub dead: u64,
    /// Held by an operator (freeze) until thawed.
    pub frozen: u64,
    /// How long the longest-waiting due task has been due, in ms (0: none waits): the
    /// queue's lateness. A task counts from its enqueue, or from when it came due when it
    /// did not become ready at its enqueue (enqueued with a delay, retried, given back,
    /// thawed, requeued). Frozen and leased tasks do not count.
    pub oldest_due_age_ms: u64,
    /// Tasks created by enqueue.
    pub enqueued_total: u64,
    /// Tasks acked.
    pub acked_total: u64,
    /// Retries accepted.
    pub retried_total: u64,
    /// Tasks dead-lettered.
    pub dead_total: u64,
    /// Settles rejected as stale.
    pub stale_total: u64,
    /// Leases that expired and were reclaimed.
    pub expired_total: u64,
    /// Dead letters requeued.
    pub requeued_total: u64,
    /// Dead letters purged.
    pub purged_total: u64,
    /// Tasks cancelled by id.
    pub cancelled_total: u64,
}

impl Queue {
    /// Counts and counters.
    pub async fn stats(&self) -> Result<QueueStats, QueueError> {
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self
            .invocation(&SCRIPTS.stats)
            .invoke_async(&mut conn)
            .await?;
        if reply.len() < 6 {
            return Err(QueueError::Protocol("stats returned too little".into()));
        }
        let mut s = QueueStats {
            ready: int(&reply[0])? as u64,
            delayed: int(&reply[1])? as u64,
            leased: int(&reply[2])? as u64,
            dead: int(&reply[3])? as u64,
            frozen: int(&reply[4])? as u64,
            oldest_due_age_ms: int(&reply[5])?.max(0) as u64,
            ..Default::default()
        };
        for pair in reply[6..].chunks(2) {
            let [field, value] = pair else { break };
            let value: u64 = string(value)?.parse().unwrap_or(0);
            match string(field)?.as_str() {
                "enqueued" => s.enqueued_total = value,
                "acked" => s.acked_total = value,
                "retried" => s.retried_total = value,
                "dead" => s.dead_total = value,
                "stale" => s.stale_total = value,
                "expired" => s.expired_total = value,
                "requeued" => s.requeued_total = value,
                "purged" => s.purged_total = value,
                "cancelled" => s.cancelled_total = value,
                _ => {}
            }
        }
        Ok(s)
    }

    /// Deletes up to `limit` records whose `history_ttl` has run out since their task
    /// ended; returns how many. Takes do it too; the manager calls it for every queue each
    /// tick, so a queue without takes sheds its old records on time as well.
    pub async fn housekeep(&self, limit: usize) -> Result<u64, QueueError> {
        let mut inv = self.invocation(&SCRIPTS.housekeep);
        inv.head(&HousekeepHead { limit });
        let mut conn = self.conn.clone();
        inv.invoke_async(&mut conn).await
    }
}
