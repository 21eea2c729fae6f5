//! What chains read and write of a queue's tasks (`lua/chain.lua`), off the hot path: only
//! a batch whose tasks have follow-ups pays for it. The chains themselves (their member
//! lists, their state) are `crate::chain`'s.

use redis::Value;

use super::lease::MetaChain;
use super::reply::string;
use super::scripts::SCRIPTS;
use super::{LeasedTask, NewTask, Queue, QueueError, RedisConn};

/// What a follow-up step needs to know of one parent task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainFacts {
    /// Whether the task has a record (chains follow tasks through their records).
    pub has_record: bool,
    /// The chain it belongs to, if any.
    pub chain: Option<String>,
    /// Its max_attempts as enqueued (0: no limit); `None` when the task is gone, or was
    /// asked for as starting a chain (a done task: its attempts no longer matter).
    pub max_attempts: Option<u32>,
}

impl Queue {
    /// [`Queue::chain_facts`] of leased tasks: from the metas their take returned where
    /// those say (no call: a route queue's tasks, follow-ups, tasks in no chain), from
    /// Redis for the rest (a task starting a chain whose record may name none yet, an
    /// untracked task, one enqueued before metas kept their chain).
    pub async fn parents_chain_facts(
        &self,
        tasks: &[&LeasedTask],
        starting: &[bool],
    ) -> Result<Vec<ChainFacts>, QueueError> {
        let starts = |i: usize| starting.get(i) == Some(&true);
        let mut facts: Vec<Option<ChainFacts>> = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let chain = match &t.meta.chain {
                    MetaChain::Own => Some(t.id.clone()),
                    MetaChain::Unlisted => Some(crate::chain::renamed(&self.name, &t.id, None)),
                    MetaChain::Of(g) => Some(g.clone()),
                    MetaChain::None if !starts(i) => None,
                    MetaChain::None | MetaChain::Unknown => return None,
                };
                Some(ChainFacts {
                    has_record: true,
                    chain,
                    max_attempts: if starts(i) { None } else { t.meta.max_attempts },
                })
            })
            .collect();
        let ask: Vec<usize> = (0..tasks.len()).filter(|&i| facts[i].is_none()).collect();
        if !ask.is_empty() {
            let ids: Vec<&str> = ask.iter().map(|&i| tasks[i].id.as_str()).collect();
            let mask: Vec<bool> = ask.iter().map(|&i| starts(i)).collect();
            for (i, f) in ask.into_iter().zip(self.chain_facts(&ids, &mask).await?) {
                facts[i] = Some(f);
            }
        }
        Ok(facts.into_iter().flatten().collect())
    }

    /// Each task's record chain and max_attempts, in the order of `ids`, in one call.
    /// A task `starting[i]` says is about to start a chain of its own gets, when its
    /// record names no chain, the chain of its own id at once (see `lua/chain.lua`):
    /// the caller then claims that chain, and renames it with [`Queue::set_chains`]
    /// should another task hold it.
    pub async fn chain_facts(
        &self,
        ids: &[&str],
        starting: &[bool],
    ) -> Result<Vec<ChainFacts>, QueueError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mask: String = (0..ids.len())
            .map(|i| {
                if starting.get(i) == Some(&true) {
                    '1'
                } else {
                    '0'
                }
            })
            .collect();
        let mut inv = self.invocation(&SCRIPTS.chain);
        inv.arg("get").arg(mask);
        for id in ids {
            inv.arg(*id);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        if reply.len() != 2 * ids.len() {
            return Err(QueueError::Protocol(format!(
                "chain facts of {} tasks returned {} values",
                ids.len(),
                reply.len()
            )));
        }
        reply
            .chunks(2)
            .zip(ids)
            .map(|(pair, id)| {
                let has_record = !matches!(pair[0], Value::Nil);
                // (1: the task's own id)
                let chain = match pair[0] {
                    Value::Int(1) => id.to_string(),
                    _ => string(&pair[0])?,
                };
                let ma = string(&pair[1])?;
                Ok(ChainFacts {
                    has_record,
                    chain: (!chain.is_empty()).then_some(chain),
                    max_attempts: ma.parse().ok(),
                })
            })
            .collect()
    }

    /// Sets the chain of tasks whose records have none yet, or their own id (tasks that
    /// became the global task of their own chain by adding follow-ups). Returns how many
    /// it set.
    pub async fn set_chains(&self, pairs: &[(&str, &str)]) -> Result<u64, QueueError> {
        if pairs.is_empty() {
            return Ok(0);
        }
        let mut inv = self.invocation(&SCRIPTS.chain);
        inv.arg("set");
        for (id, chain) in pairs {
            inv.arg(*id).arg(*chain);
        }
        let mut conn = self.conn.clone();
        Ok(inv.invoke_async(&mut conn).await?)
    }
}

/// Writes to chains' member lists (`lua/claim.lua`): claims of new chains and members
/// added to chains, in one call on one server. What the lists hold is `crate::chain`'s:
/// here they are keys and strings.
#[derive(Debug, Clone, Default)]
pub struct ChainWrites {
    keys: Vec<String>,
    /// Per list: its head as a claim writes it ('' for an add), and the members.
    args: Vec<String>,
    ttl_ms: u64,
    /// The parents' leases key and their leases (token, id) that must still stand
    /// ([`ChainWrites::check_leases`]).
    leases: Option<(String, Vec<(u64, String)>)>,
}

/// The claims a [`ChainWrites`] call refused: (position among its lists from 1, the
/// holder as the list stores it, or `''` / `'='`: see `lua/claim.lua`).
pub type RefusedClaims = Vec<(usize, Vec<u8>)>;

/// What an enqueue after chain writes did (see [`Queue::enqueue_after_chains`]).
#[derive(Debug)]
pub enum AfterChains {
    /// Every claim was the caller's: the tasks were enqueued (as `enqueue_many` says).
    Enqueued(Vec<super::Enqueued>),
    /// Some claims were refused: nothing was enqueued (the other claims and the adds were
    /// written).
    Refused(RefusedClaims),
    /// The leases of these parents (positions among those given to
    /// [`ChainWrites::check_leases`], from 0) are gone: nothing was written.
    LeasesGone(Vec<usize>),
}

impl ChainWrites {
    /// Writes whose lists live `ttl` after them.
    pub fn new(ttl: std::time::Duration) -> Self {
        ChainWrites {
            ttl_ms: ttl.as_millis().max(1) as u64,
            ..Default::default()
        }
    }

    /// Claims the list `key` with the head `head`, then appends `members`.
    pub fn claim(&mut self, key: String, head: String, members: String) {
        debug_assert!(!head.is_empty());
        self.keys.push(key);
        self.args.push(head);
        self.args.push(members);
    }

    /// Makes the writes, and the enqueue after them, depend on the leases of `parents`
    /// (tasks of `queue`) still standing: none is made when one is gone (see
    /// [`AfterChains::LeasesGone`]). On one server, with an enqueue only.
    pub fn check_leases(&mut self, queue: &Queue, parents: &[&super::LeasedTask]) {
        let leases = parents.iter().map(|t| (t.token, t.id.clone())).collect();
        self.leases = Some((queue.keys.leased().to_string(), leases));
    }

    /// Appends `members` to the list `key`.
    pub fn add(&mut self, key: String, members: String) {
        self.keys.push(key);
        self.args.push(String::new());
        self.args.push(members);
    }

    /// How many lists it writes.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it writes nothing.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Writes them alone, in one call: every list must be in one hash slot (one server,
    /// or a single list).
    pub async fn write(&self, conn: &RedisConn) -> Result<RefusedClaims, QueueError> {
        if self.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = SCRIPTS.claim.prepare_invoke();
        inv.arg(self.ttl_ms);
        for k in &self.keys {
            inv.key(k);
        }
        for a in &self.args {
            inv.arg(a);
        }
        let mut conn = conn.clone();
        Ok(inv.invoke_async(&mut conn).await?)
    }
}

impl Queue {
    /// Writes `chains`, then (only when no claim among them was refused) enqueues
    /// `tasks`, in one call for the first chunk of tasks: a slot's follow-ups then cost
    /// one call with their chains, where two in turn made a batch wait twice. On one
    /// server only (the chains' keys are in other slots than the queue's).
    pub async fn enqueue_after_chains(
        &self,
        tasks: &[NewTask],
        chains: &ChainWrites,
    ) -> Result<AfterChains, QueueError> {
        if !matches!(self.conn, RedisConn::Single(_)) {
            return Err(QueueError::Invalid(
                "chains and an enqueue share a call on one server only".into(),
            ));
        }
        for t in tasks {
            self.check(t)?;
        }
        let Some(&first) = super::enqueue::chunks(tasks).first() else {
            let refused = chains.write(&self.conn).await?;
            return Ok(match refused.is_empty() {
                true => AfterChains::Enqueued(Vec::new()),
                false => AfterChains::Refused(refused),
            });
        };
        let rest = &tasks[first.len()..];
        let mut inv = self.enqueue_invocation_with(&SCRIPTS.claim_enqueue, first);
        for k in &chains.keys {
            inv.key(k);
        }
        for a in &chains.args {
            inv.arg(a);
        }
        inv.arg(chains.ttl_ms);
        let leases = chains
            .leases
            .as_ref()
            .map_or(&[][..], |(_, l)| l.as_slice());
        if let Some((key, _)) = &chains.leases {
            inv.key(key);
            for (token, id) in leases {
                inv.arg(token).arg(id);
            }
        }
        inv.arg(leases.len());
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        let bad = |e: redis::ParsingError| QueueError::Protocol(format!("claim and enqueue: {e}"));
        let mut out = match reply.as_slice() {
            [Value::Int(-3), gone] => {
                let gone: Vec<usize> = redis::from_redis_value(gone.clone()).map_err(bad)?;
                if gone.iter().any(|&p| p == 0 || p > leases.len()) {
                    return Err(QueueError::Protocol(format!(
                        "claim and enqueue named parents {gone:?} of {}",
                        leases.len()
                    )));
                }
                return Ok(AfterChains::LeasesGone(
                    gone.into_iter().map(|p| p - 1).collect(),
                ));
            }
            [Value::Int(-2), refused] => {
                let refused: RefusedClaims =
                    redis::from_redis_value(refused.clone()).map_err(bad)?;
                return Ok(AfterChains::Refused(refused));
            }
            [Value::Int(base), flags] => {
                let flags: Vec<u8> = redis::from_redis_value(flags.clone()).map_err(bad)?;
                self.enqueued_reply(first, *base, flags)?
            }
            other => {
                return Err(QueueError::Protocol(format!(
                    "claim and enqueue returned {other:?}"
                )));
            }
        };
        if !rest.is_empty() {
            out.extend(self.enqueue_many(rest).await?);
        }
        Ok(AfterChains::Enqueued(out))
    }
}
