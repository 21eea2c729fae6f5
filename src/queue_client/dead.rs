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

/// Dead letters one call of [`Queue::dead_page`] reads at most: each is a payload and an
/// error read, so a call stays short however large the page asked for.
pub const DEAD_PAGE_CALL: usize = 100;

/// About the most bytes of payloads and errors one page of [`Queue::dead_page`] holds
/// (a payload may be as large as the queue's `max_payload`).
pub const DEAD_PAGE_BYTES: usize = 4 << 20;

/// Where a page of dead letters, newest first, goes on from: the last letter shown, by
/// its time of death and id. As text (an api's `next_cursor`), `d` then the
/// milliseconds, `.`, and the id in hex, so any id makes a cursor safe in a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadCursor {
    /// When the letter died (ms since the epoch).
    pub died_ms: i64,
    /// Its id.
    pub id: String,
}

impl DeadCursor {
    /// The cursor as text.
    pub fn encode(&self) -> String {
        let hex: String = self.id.bytes().map(|b| format!("{b:02x}")).collect();
        format!("d{}.{hex}", self.died_ms)
    }

    /// A cursor [`DeadCursor::encode`] made; `None` for any other text.
    pub fn decode(text: &str) -> Option<Self> {
        let (ms, hex) = text.strip_prefix('d')?.split_once('.')?;
        if ms.is_empty() || !ms.bytes().all(|b| b.is_ascii_digit()) || hex.len() % 2 != 0 {
            return None;
        }
        let id = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(Self {
            died_ms: ms.parse().ok()?,
            id: String::from_utf8(id).ok().filter(|id| !id.is_empty())?,
        })
    }
}

/// A page of dead letters, newest first.
#[derive(Debug, Clone, Default)]
pub struct DeadPage {
    /// The letters.
    pub dead: Vec<DeadTask>,
    /// Where the next page starts ([`DeadCursor::encode`]); `None` on the last page.
    pub next_cursor: Option<String>,
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
        let head = DeadListHead {
            offset,
            limit,
            newest: false,
            after_ms: String::new(),
            after_id: String::new(),
            page_bytes: 0,
        };
        Ok(self.dead_call(&head).await?.0)
    }

    /// One page of the dead letters, newest first (by time of death, then id), from
    /// after `cursor` (`None`: the newest): at most `limit` letters, fewer once their
    /// payloads and errors hold about [`DEAD_PAGE_BYTES`], read in calls of at most
    /// [`DEAD_PAGE_CALL`] letters. A cursor marks a place, not a letter: letters that
    /// die after the first page do not show on later ones, and one requeued or purged
    /// meanwhile moves no other onto a page it was not on.
    pub async fn dead_page(
        &self,
        cursor: Option<&DeadCursor>,
        limit: usize,
    ) -> Result<DeadPage, QueueError> {
        if limit == 0 {
            return Err(QueueError::Invalid(
                "a page of dead letters holds at least one".into(),
            ));
        }
        let mut page = DeadPage::default();
        let mut after = cursor.cloned();
        let mut bytes = 0;
        loop {
            let want = (limit - page.dead.len()).min(DEAD_PAGE_CALL);
            let head = DeadListHead {
                offset: 0,
                limit: want,
                newest: true,
                after_ms: after
                    .as_ref()
                    .map(|c| c.died_ms.to_string())
                    .unwrap_or_default(),
                after_id: after.as_ref().map(|c| c.id.clone()).unwrap_or_default(),
                page_bytes: DEAD_PAGE_BYTES.saturating_sub(bytes).max(1),
            };
            let (letters, more) = self.dead_call(&head).await?;
            bytes += letters
                .iter()
                .map(|d| d.payload.len() + d.error.len())
                .sum::<usize>();
            if let Some(last) = letters.last() {
                after = Some(DeadCursor {
                    died_ms: last.died_ms,
                    id: last.id.clone(),
                });
            }
            page.dead.extend(letters);
            if !more {
                return Ok(page);
            }
            if page.dead.len() >= limit || bytes >= DEAD_PAGE_BYTES {
                page.next_cursor = after.map(|c| c.encode());
                return Ok(page);
            }
        }
    }

    /// One call of dead_list.lua: its letters, and whether more follow.
    async fn dead_call(&self, head: &DeadListHead) -> Result<(Vec<DeadTask>, bool), QueueError> {
        let mut inv = self.invocation(&SCRIPTS.dead_list);
        inv.head(head);
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        let Some((more, rows)) = reply.split_first() else {
            return Err(QueueError::Protocol("dead_list returned nothing".into()));
        };
        let letters = rows
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
            .collect::<Result<Vec<_>, QueueError>>()?;
        Ok((letters, int(more)? == 1))
    }

    /// Puts dead letters back in the ready set with their attempts reset: the given ids,
    /// or all of those dead when it begins (in chunks, so Redis is never blocked for long);
    /// on an ordered queue at the front, before tasks created after them. Returns how many.
    pub async fn requeue_dead(&self, ids: Option<&[String]>) -> Result<u64, QueueError> {
        self.requeue_dead_by(ids, REQUEUE_NOTE, None).await
    }

    /// [`Queue::requeue_dead`] with `note` in the requeued records' history (who put them
    /// back), and, given `owner`, only the named letters whose record names that
    /// submitter: an api key requeues its own, checked in the same step that moves them.
    pub async fn requeue_dead_by(
        &self,
        ids: Option<&[String]>,
        note: &str,
        owner: Option<&str>,
    ) -> Result<u64, QueueError> {
        let action = if self.limits.ordered {
            "requeue_front"
        } else {
            "requeue"
        };
        self.dead_move(action, ids, note, owner).await
    }

    /// Deletes dead letters: the given ids, or all of those dead when it begins. Returns
    /// how many.
    pub async fn purge_dead(&self, ids: Option<&[String]>) -> Result<u64, QueueError> {
        self.dead_move("purge", ids, REQUEUE_NOTE, None).await
    }

    async fn dead_move(
        &self,
        action: &'static str,
        ids: Option<&[String]>,
        note: &str,
        owner: Option<&str>,
    ) -> Result<u64, QueueError> {
        if owner.is_some() && ids.is_none() {
            return Err(QueueError::Invalid(
                "an owner's requeue names its dead letters".into(),
            ));
        }
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
                        note: note.to_string(),
                        cutoff_ms: String::new(),
                        owner: owner.unwrap_or_default().to_string(),
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
                        note: note.to_string(),
                        cutoff_ms: cutoff.to_string(),
                        owner: String::new(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_cursors_read_back_and_refuse_what_they_did_not_make() {
        for id in ["a", "x y/z", "é~g1", "id.with.dots"] {
            let c = DeadCursor {
                died_ms: 1_795_453_200_123,
                id: id.into(),
            };
            let text = c.encode();
            assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'));
            assert_eq!(DeadCursor::decode(&text), Some(c));
        }
        for bad in [
            "", "d", "d12", "d.61", "x12.61", "d12.6", "d12.zz", "d-1.61", "d12.", "d12.ff",
        ] {
            assert_eq!(DeadCursor::decode(bad), None, "{bad}");
        }
    }
}
