//! The queues this master runs no slot for because their data is of a newer layout than
//! its own ([`crate::queue_client::layout`]): a newer gaffer migrated them. Its scripts
//! would refuse every take, so its slots would only fail; the map's slots for such a
//! queue are left unstarted, said once in the log and shown in the host report (`gaffer
//! stats`). A queue of an older layout is no master's concern: its slots back off on the
//! scripts' refusal until `gaffer migrate` has run.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::queue_client::{QueueError, RedisConn, layout, recorded_layout};

/// How long a queue's layout, once read, is taken as known: a queue moves to a newer
/// layout only when an operator runs a newer `gaffer migrate`.
const RECHECK: Duration = Duration::from_secs(30);

/// What the master read of its queues' layouts.
#[derive(Default)]
pub(super) struct Layouts {
    /// Per queue: when its layout was read, and the layout if newer than this master's.
    read: BTreeMap<String, (Instant, Option<u32>)>,
}

impl Layouts {
    /// Why the master runs no slot for `queue`, if it runs none.
    pub(super) fn refused(&self, queue: &str) -> Option<String> {
        let found = self.read.get(queue)?.1?;
        Some(
            QueueError::Layout {
                queue: queue.to_string(),
                found,
                need: layout::CURRENT,
            }
            .to_string(),
        )
    }

    /// Reads the layout of each of `queues` not read within [`RECHECK`] (one HGET each);
    /// logs a queue refused or no longer refused. A failed read keeps what was known.
    pub(super) async fn check(
        &mut self,
        conn: &RedisConn,
        namespace: &str,
        queues: impl Iterator<Item = String>,
        now: Instant,
    ) {
        for queue in queues {
            if self
                .read
                .get(&queue)
                .is_some_and(|(at, _)| now.duration_since(*at) < RECHECK)
            {
                continue;
            }
            let newer = match recorded_layout(conn, namespace, &queue).await {
                Ok(l) => l.filter(|&l| l > layout::CURRENT),
                Err(e) => {
                    tracing::debug!(queue, error = %e, "reading the queue's layout failed");
                    continue;
                }
            };
            let before = self.read.insert(queue.clone(), (now, newer));
            let was = before.and_then(|(_, l)| l);
            if newer.is_some() && was.is_none() {
                tracing::warn!(
                    queue,
                    reason = self.refused(&queue).unwrap_or_default(),
                    "running no slot for the queue: its layout is newer than this gaffer's"
                );
            } else if newer.is_none() && was.is_some() {
                tracing::info!(
                    queue,
                    "the queue's layout is this gaffer's again: running its slots"
                );
            }
        }
    }
}
