//! What chains read and write of a queue (`lua/chain.lua`, `lua/follow_enqueue.lua`, the
//! chains' lists enqueue.lua keeps), off the hot path: only a batch whose tasks have
//! follow-ups pays for it. What a chain is (its members, its state) is `crate::chain`'s.
//!
//! What it holds: a parent's place in a chain, read from the meta its take returned (no
//! call); the members of a chain this queue holds (its entries in a roster of chains,
//! `chains:ROSTER`, read by lua/chain_members.lua); the record of a task that became a
//! chain's global task by adding follow-ups, made to name its chain (lua/chain.lua); and
//! a slot's follow-ups enqueued after the check of their parents' leases, in one call on
//! one server (lua/follow_enqueue.lua).

use redis::Value;

use super::args::ChainMembersHead;
use super::enqueue::EnqueueReply;
use super::meta::MetaChain;
use super::scripts::SCRIPTS;
use super::{LeasedTask, NewTask, Queue, QueueError};

/// A parent task's place in a chain, as its meta says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainPlace {
    /// In no chain: its follow-ups make it the global task of one, named from its record
    /// number (`chain_id`).
    None,
    /// The global task of this chain.
    Global(String),
    /// A follow-up in this chain.
    FollowUp(String),
    /// The task has no record (an untracked queue's): it can be in no chain.
    Untracked,
}

/// What a follow-up step needs to know of one parent task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainFacts {
    /// Its place in a chain.
    pub place: ChainPlace,
    /// Its max_attempts as enqueued (0: no limit); `None` when its meta does not say.
    pub max_attempts: Option<u32>,
    /// Its record's number (`None`: untracked).
    pub seq: Option<u64>,
}

/// What an enqueue after the check of its parents' leases did
/// ([`Queue::enqueue_follow_ups`]).
#[derive(Debug)]
pub enum FollowUpsEnqueued {
    /// The leases stand: the tasks were enqueued (as `enqueue_many` says).
    Enqueued(Vec<super::Enqueued>),
    /// The leases of these parents (positions among those given, from 0) are gone:
    /// nothing was written.
    LeasesGone(Vec<usize>),
}

impl LeasedTask {
    /// What chains need of the task, from the meta its take returned: no call.
    pub fn chain_facts(&self) -> ChainFacts {
        let place = match &self.meta.chain {
            MetaChain::Global(g) => ChainPlace::Global(g.clone()),
            MetaChain::Of(g) => ChainPlace::FollowUp(g.clone()),
            MetaChain::None => ChainPlace::None,
            MetaChain::Unknown => ChainPlace::Untracked,
        };
        ChainFacts {
            place,
            max_attempts: self.meta.max_attempts(),
            seq: self.meta.seq,
        }
    }
}

impl Queue {
    /// Sets the chain of tasks whose records name none yet (tasks that became the
    /// global task of a chain by adding follow-ups). Returns how many it set.
    pub async fn set_chains(&self, pairs: &[(&str, &str)]) -> Result<u64, QueueError> {
        if pairs.is_empty() {
            return Ok(0);
        }
        let mut inv = self.invocation(&SCRIPTS.chain);
        for (id, chain) in pairs {
            inv.arg(*id).arg(*chain);
        }
        let mut conn = self.conn.clone();
        inv.invoke_async(&mut conn).await
    }

    /// The ids of the tasks of chain `chain` this queue holds (its chain's list, written
    /// as each was enqueued: `chain_members.lua`), in the order they were listed: none
    /// when the queue holds none or the list expired.
    pub async fn chain_members(&self, chain: &str) -> Result<Vec<String>, QueueError> {
        let mut conn = self.conn.clone();
        let ids: Vec<Vec<u8>> = self
            .invocation(&SCRIPTS.chain_members)
            .head(&ChainMembersHead {
                chain: chain.to_string(),
            })
            .invoke_async(&mut conn)
            .await?;
        Ok(ids
            .into_iter()
            .map(|id| String::from_utf8_lossy(&id).into_owned())
            .collect())
    }

    /// The id of the task numbered `seq` (its record's number), while its record lives:
    /// the global task of the chain `chain_id(queue, seq)` names.
    pub async fn id_numbered(&self, seq: u64) -> Result<Option<String>, QueueError> {
        let mut conn = self.conn.clone();
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.keys.index())
            .arg(seq)
            .arg(seq)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async(&mut conn)
            .await?;
        Ok(ids.into_iter().next())
    }

    /// Enqueues `tasks` (follow-ups) once the leases of `parents` (tasks of `parents_queue`)
    /// are seen to stand, in one call for the first chunk: a slot's follow-ups then cost
    /// one call, where a check and an enqueue in turn made a batch wait twice. On one
    /// server only (the parents' queue is in another slot than this one on a cluster).
    pub async fn enqueue_follow_ups(
        &self,
        tasks: &[NewTask],
        parents_queue: &Queue,
        parents: &[&LeasedTask],
    ) -> Result<FollowUpsEnqueued, QueueError> {
        if self.conn.is_cluster() {
            return Err(QueueError::Invalid(
                "a lease check and an enqueue share a call on one server only".into(),
            ));
        }
        for t in tasks {
            self.check(t)?;
        }
        let Some(&first) = super::enqueue::chunks(tasks).first() else {
            return Ok(FollowUpsEnqueued::Enqueued(Vec::new()));
        };
        let rest = &tasks[first.len()..];
        let mut inv = self.enqueue_invocation_with(&SCRIPTS.follow_enqueue, first);
        inv.key(parents_queue.keys.leased());
        for t in parents {
            inv.arg(t.token).arg(&t.id);
        }
        inv.arg(parents.len());
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        let mut out = match EnqueueReply::parse(reply)? {
            EnqueueReply::LeasesGone(gone) => {
                if gone.iter().any(|&p| p >= parents.len()) {
                    return Err(QueueError::Protocol(format!(
                        "lease check and enqueue named parents {gone:?} of {}",
                        parents.len()
                    )));
                }
                return Ok(FollowUpsEnqueued::LeasesGone(gone));
            }
            reply => self.enqueued_reply(first, reply)?,
        };
        if !rest.is_empty() {
            out.extend(self.enqueue_many(rest).await?);
        }
        Ok(FollowUpsEnqueued::Enqueued(out))
    }
}
