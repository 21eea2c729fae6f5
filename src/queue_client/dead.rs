//! Dead letters: listing them, putting them back (requeue) and deleting them (purge), in
//! bounded chunks so Redis is never blocked for long.

use redis::Value;
use serde::Serialize;

use super::args::{DeadListHead, DeadMoveHead};
use super::limits::HOUSEKEEPING_LIMIT;
use super::meta::Meta;
use super::reply::{bytes, int, string};
use super::scripts::SCRIPTS;
use super::{Queue, QueueError};

/// The history note of a dead letter put back in the queue.
const REQUEUE_NOTE: &str = "requeued from the dead letters";

/// A dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct DeadTask {
    /// Task id.
    pub id: String,
    /// When it died (ms since the epoch).
    pub died_ms: i64,
    /// Attempts made.
    pub attempts: u32,
    /// Its last error.
    pub error: String,
    /// Priority it had.
    pub priority: i32,
    /// The payload.
    #[serde(skip)]
    pub payload: Vec<u8>,
}

impl Queue {
    /// Dead letters, oldest first: `limit` from the `offset`-th, read in chunks of
    /// 1,000 (each script call reads every one's payload and error, so a
    /// large `limit` must not block Redis in one call).
    pub async fn dead(&self, offset: usize, limit: usize) -> Result<Vec<DeadTask>, QueueError> {
        let mut out = Vec::with_capacity(limit.min(HOUSEKEEPING_LIMIT));
        while out.len() < limit {
            let want = (limit - out.len()).min(HOUSEKEEPING_LIMIT);
            let chunk = self.dead_chunk(offset + out.len(), want).await?;
            let short = chunk.len() < want;
            out.extend(chunk);
            if short {
                break;
            }
        }
        Ok(out)
    }

    /// One call of [`Queue::dead`].
    async fn dead_chunk(&self, offset: usize, limit: usize) -> Result<Vec<DeadTask>, QueueError> {
        let mut inv = self.invocation(&SCRIPTS.dead_list);
        inv.head(&DeadListHead { offset, limit });
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        reply
            .chunks(6)
            .map(|row| {
                let meta = Meta::parse(&bytes(&row[5])).head;
                Ok(DeadTask {
                    id: string(&row[0])?,
                    died_ms: int(&row[1])?,
                    attempts: int(&row[2])? as u32,
                    payload: bytes(&row[3]),
                    error: string(&row[4])?,
                    priority: meta.map(|m| m.priority).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Puts dead letters back in the ready set with their attempts reset: the given ids,
    /// or all of those dead when it begins (in chunks, so Redis is never blocked for long);
    /// on an ordered queue at the front, before tasks created after them. Returns how many.
    pub async fn requeue_dead(&self, ids: Option<&[String]>) -> Result<u64, QueueError> {
        let action = if self.limits.ordered {
            "requeue_front"
        } else {
            "requeue"
        };
        self.dead_move(action, ids).await
    }

    /// Deletes dead letters: the given ids, or all of those dead when it begins. Returns
    /// how many.
    pub async fn purge_dead(&self, ids: Option<&[String]>) -> Result<u64, QueueError> {
        self.dead_move("purge", ids).await
    }

    async fn dead_move(
        &self,
        action: &'static str,
        ids: Option<&[String]>,
    ) -> Result<u64, QueueError> {
        let mut total = 0u64;
        let mut conn = self.conn.clone();
        match ids {
            Some(ids) => {
                // (to the front, the last chunk goes first, so the ids keep their order)
                let mut chunks: Vec<&[String]> = ids.chunks(HOUSEKEEPING_LIMIT).collect();
                if action == "requeue_front" {
                    chunks.reverse();
                }
                let last = chunks.len().saturating_sub(1);
                for (i, chunk) in chunks.into_iter().enumerate() {
                    // (takes are held until the last chunk: see dead_move.lua)
                    let action = if action == "requeue_front" && i < last {
                        "requeue_front_more"
                    } else {
                        action
                    };
                    let mut inv = self.invocation(&SCRIPTS.dead_move);
                    inv.head(&DeadMoveHead {
                        action,
                        limit: chunk.len(),
                        note: REQUEUE_NOTE,
                        cutoff_ms: String::new(),
                    });
                    for id in chunk {
                        inv.arg(id);
                    }
                    total += inv.invoke_async::<u64>(&mut conn).await?;
                }
            }
            // Those dead when it began: a handler that fails at once would otherwise feed
            // the sweep for ever, each task requeued with its attempts reset (and a purge
            // would delete dead letters no one had seen).
            None => {
                let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
                let cutoff = secs * 1000 + micros / 1000;
                loop {
                    let mut inv = self.invocation(&SCRIPTS.dead_move);
                    inv.head(&DeadMoveHead {
                        action,
                        limit: HOUSEKEEPING_LIMIT,
                        note: REQUEUE_NOTE,
                        cutoff_ms: cutoff.to_string(),
                    });
                    let n: u64 = inv.invoke_async(&mut conn).await?;
                    total += n;
                    if n == 0 {
                        break;
                    }
                }
            }
        }
        Ok(total)
    }
}
