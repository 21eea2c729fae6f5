//! `[cluster] wait_replicas`: a write reports success only once replicas confirmed it, so
//! a failover to a replica loses no acknowledged submit, settle or record write.
//!
//! Redis replicates asynchronously: a primary answers a write before any replica has it,
//! and a failover in that gap loses it (OPERATIONS.md, "Redis persistence"). `WAIT N
//! TIMEOUT` blocks the client until N replicas acknowledged everything it wrote, or the
//! timeout passed, and answers how many did. A function may not call `WAIT` (Redis
//! refuses it inside Lua), so a call that must be confirmed is sent as one pipeline on one
//! connection: the `FCALL`, then `WAIT wait_replicas wait_timeout_ms` ([`send`]).
//!
//! - **Which offset it waits for.** `WAIT` waits for the replication offset of its
//!   client's latest write. The connection is multiplexed (other calls of the process
//!   share it), but the `WAIT` comes after the `FCALL` on that socket, so that offset is at
//!   least the call's own: another caller's write in between can only make it wait for
//!   more, never for less.
//! - **Where it goes on a Redis Cluster.** The crate routes a pipeline by its first
//!   command that names a slot (`route_for_pipeline` in redis 1.8's cluster code): the
//!   `FCALL`'s first key, on that slot's primary. `WAIT`, which names no key, would go to
//!   every primary alone; inside the pipeline it follows the `FCALL` to the node that ran
//!   it, and counts that node's replicas. A redirection (`MOVED`) sends the pipeline again,
//!   whole, to the new owner. Behind Sentinel the pipeline goes, as every call does, to
//!   the one connection to the current primary (`sentinel.rs`).
//! - **What a failure means.** Fewer than `wait_replicas` acknowledgements within
//!   `wait_timeout` is [`QueueError::NotConfirmed`]: the write *was* done on the primary,
//!   it is only not known to be on a replica. It is transient, so every path that retries
//!   an outage retries it (a slot's settle, a take after a back-off; a retried settle
//!   finds its lease gone and counts as stale, harmlessly); the api answers 503 and says
//!   a submit may have been enqueued (an id makes a resubmit safe).
//! - **What it costs.** A replication round trip per confirmed write, and the connection
//!   is held while `WAIT` blocks: calls queued behind it on the same connection wait too.
//!   With the replicas gone, every confirmed write takes `wait_timeout` and fails, which
//!   stops the cluster acknowledging anything, as Redis's `min-replicas-to-write` would.
//!
//! Which functions are confirmed is [`Function`](super::scripts)'s business (every one
//! that writes but a take, the rate bucket, a record read's watch mark and housekeeping,
//! which a failover can only make happen again); [`Durability`] travels from the config
//! through [`ConnectOptions`](super::ConnectOptions) (and a master's `ZygoteInit` to its
//! slots) to every [`Queue`](super::Queue) of a [`QueueClient`](super::QueueClient).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisResult, Value};
use serde::{Deserialize, Serialize};

/// How many replicas must confirm a write before it reports success, and how long to wait
/// for them (`[cluster] wait_replicas` and `wait_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Durability {
    /// Replicas that must acknowledge each confirmed write; 0: none, no `WAIT` is sent.
    pub wait_replicas: u32,
    /// How long a write waits for them before it fails as not confirmed.
    pub wait_timeout: Duration,
}

impl Durability {
    /// Whether writes wait for replicas at all.
    pub fn waits(&self) -> bool {
        self.wait_replicas > 0
    }
}

impl Default for Durability {
    fn default() -> Self {
        Durability {
            wait_replicas: 0,
            wait_timeout: crate::config::DEFAULT_WAIT_TIMEOUT,
        }
    }
}

/// What a confirmed call's `WAIT` answered: how many replicas acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acknowledged(pub u64);

/// Sends `cmd`, followed by `WAIT` on the same connection when `wait` waits: the command's
/// reply (a server error left in it, as the caller reads it) and, with a `WAIT`, how many
/// replicas acknowledged. An error of the `WAIT` itself (an ACL without `+wait`) is the
/// error, unless the command failed first.
pub(crate) async fn send(
    conn: &mut impl ConnectionLike,
    cmd: &Cmd,
    wait: Option<Durability>,
) -> RedisResult<(Value, Option<Acknowledged>)> {
    let Some(wait) = wait.filter(Durability::waits) else {
        return Ok((conn.req_packed_command(cmd).await?, None));
    };
    let mut pipe = redis::pipe();
    pipe.add_command(cmd.clone())
        .cmd("WAIT")
        .arg(wait.wait_replicas)
        .arg(wait.wait_timeout.as_millis() as u64);
    let mut replies = conn.req_packed_commands(&pipe, 0, 2).await?.into_iter();
    let (Some(reply), Some(waited)) = (replies.next(), replies.next()) else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "a pipeline of FCALL and WAIT answered fewer than two replies",
        )));
    };
    if matches!(reply, Value::ServerError(_)) {
        return Ok((reply, None));
    }
    let acknowledged: u64 = redis::from_redis_value(waited.extract_error()?)?;
    Ok((reply, Some(Acknowledged(acknowledged))))
}

/// The error of a write that `acknowledged` replicas confirmed, when `wait` asked for more.
pub(crate) fn unconfirmed(
    wait: Durability,
    acknowledged: Acknowledged,
) -> Option<super::QueueError> {
    (acknowledged.0 < u64::from(wait.wait_replicas)).then(|| super::QueueError::NotConfirmed {
        acknowledged: acknowledged.0,
        wanted: wait.wait_replicas,
        timeout: wait.wait_timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_short_of_its_replicas_is_not_confirmed_and_names_the_limit() {
        let wait = Durability {
            wait_replicas: 2,
            wait_timeout: Duration::from_millis(1500),
        };
        assert!(unconfirmed(wait, Acknowledged(2)).is_none());
        assert!(unconfirmed(wait, Acknowledged(3)).is_none());
        let e = unconfirmed(wait, Acknowledged(1)).expect("short of its replicas");
        assert_eq!(
            e.to_string(),
            "write not confirmed: 1 of wait_replicas = 2 replicas acknowledged within 1s 500ms"
        );
        assert!(e.is_transient(), "{e}");
        assert!(!Durability::default().waits());
    }
}
