//! A batch's follow-ups, created before the batch is settled.
//!
//! A task that is done (or has failed for good) may lead to follow-up tasks: its queue's
//! `next` routes and those its handler adds. They are enqueued with ids derived from
//! their parent's, after they are added to their chain's member list, and all that
//! before the parent is settled: a slot that dies anywhere in between leaves its tasks'
//! leases to expire, and the parents run again, make the same ids, and the enqueue
//! (deduplicating against records too) finds the children already made. Each step is
//! idempotent and, on a Redis Cluster, where a parent, its children and its chain live in
//! different slots, touches one key or one queue at a time (on one server a batch's
//! chains share a call, the first of its children's enqueues too when no chain needs
//! a new name). A batch without follow-ups pays nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::chain::{self, ChainTargets, Claim, Member, RootClaim};
use crate::config::{QueueConfig, RouteOn};
use crate::host::handler::Outcome;
use crate::queue_client::{
    AfterChains, ChainFacts, ChainWrites, LeasedTask, MAX_ID_LEN, NewTask, Queue, QueueClient,
    QueueError, RedisConn, TaskChain,
};

/// Longest pause between attempts to create a batch's follow-ups while Redis fails.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What a slot keeps to create follow-ups.
pub(super) struct FollowUps {
    client: QueueClient,
    /// The slot's own queue: its tasks are the parents.
    own: Queue,
    cfg: QueueConfig,
    targets: Arc<ChainTargets>,
    handles: HashMap<String, Queue>,
}

/// A parent that starts a chain of its own (or adds to the one it started before).
struct NewRoot {
    parent: usize,
    /// The chain to claim: the parent's id, or the name its record already has.
    chain: String,
    /// Its follow-ups as (queue, place): their ids come from the chain's name.
    kids: Vec<(String, usize)>,
    /// Whether the parent's record already names `chain`.
    named: bool,
}

/// One follow-up to create.
struct Child {
    /// Which task of the batch it follows.
    parent: usize,
    /// Its place among its parent's follow-ups, from 1.
    n: usize,
    queue: String,
    /// Derived from its parent's id, or for a chain's global task from the chain's name
    /// (see [`FollowUps::link`]).
    id: String,
    payload: Vec<u8>,
}

/// The chain a parent starts.
struct Named {
    chain: String,
    /// Its follow-ups were added by a gaffer that did not tell runs apart: its children's
    /// ids are derived from the parent's, as that gaffer derived them
    /// (`RootClaim::OursBefore`).
    before: bool,
}

/// A follow-up and its parent, as a chain lists them.
type Pair = (Member, Member);

/// Why a parent's follow-ups were not made.
enum Refusal {
    /// For now: the queue's intake is closed.
    Closed(String),
    /// For good: the id is another task's.
    Taken(String),
}

impl FollowUps {
    /// Follow-ups of the tasks of `own` (whose config is `cfg`).
    pub(super) fn new(
        client: QueueClient,
        own: Queue,
        cfg: QueueConfig,
        targets: Arc<ChainTargets>,
    ) -> Self {
        FollowUps {
            client,
            own,
            cfg,
            targets,
            handles: HashMap::new(),
        }
    }

    /// Creates the follow-ups of a handled batch, and returns the outcomes to settle: a
    /// task whose follow-ups cannot be made fails (a queue the config does not name) or
    /// is retried (Redis failing until `lease_until`, a follow-up queue's intake closed).
    pub(super) async fn before_settle(
        &mut self,
        tasks: &[LeasedTask],
        mut outcomes: Vec<Outcome>,
        lease_until: Instant,
    ) -> Vec<Outcome> {
        self.refuse_unknown_targets(tasks, &mut outcomes);
        if !self.may_have_follow_ups(&outcomes) {
            return outcomes;
        }
        let mut pause = Duration::from_millis(50);
        loop {
            match self.create(tasks, &mut outcomes).await {
                Ok(()) => return outcomes,
                Err(e) if Instant::now() + pause >= lease_until => {
                    tracing::warn!(queue = %self.cfg.name, error = %e,
                        "follow-ups could not be created before the leases expire; the tasks run again");
                    return retry_all(outcomes, &format!("follow-ups not created: {e}"));
                }
                Err(e) => {
                    tracing::warn!(queue = %self.cfg.name, error = %e, "creating follow-ups failed, retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
            }
        }
    }

    /// A handler's follow-up to a queue the config does not name, or one that keeps no
    /// records, or with a payload over that queue's limit, fails its task for good; so do
    /// follow-ups of a task whose id holds the byte 0x1e or 0x1f, which would cut the
    /// records its chain's name is written into (a queue with routes refuses such ids at
    /// enqueue; a handler's own follow-ups are known only now).
    fn refuse_unknown_targets(&self, tasks: &[LeasedTask], outcomes: &mut [Outcome]) {
        for (t, o) in tasks.iter().zip(outcomes.iter_mut()) {
            let Outcome::Done(done) = o else { continue };
            if !done.next.is_empty() && t.id.contains(['\u{1e}', '\u{1f}']) {
                *o = Outcome::Reject {
                    reason: format!(
                        "task id {:?} cannot start a chain: it holds the byte 0x1e or 0x1f",
                        t.id
                    ),
                };
                continue;
            }
            let refusal = done.next.iter().find_map(|f| {
                let Some(limits) = self.targets.queues.get(&f.queue) else {
                    return Some(format!("follow-up to unknown queue {:?}", f.queue));
                };
                if !limits.track {
                    return Some(format!(
                        "follow-up to queue {} which has track = false: chains need records",
                        f.queue
                    ));
                }
                let size = f.payload.to_string().len() as u64;
                (size > limits.max_payload).then(|| {
                    format!(
                        "follow-up payload of {size} bytes to queue {} exceeds its max_payload {}",
                        f.queue, limits.max_payload
                    )
                })
            });
            if let Some(reason) = refusal {
                *o = Outcome::Reject { reason };
            }
        }
    }

    /// Whether any outcome could have follow-ups (before anything is read from Redis).
    fn may_have_follow_ups(&self, outcomes: &[Outcome]) -> bool {
        let (on_done, on_failed) = self.route_kinds();
        outcomes.iter().any(|o| match o {
            Outcome::Done(d) => on_done || !d.next.is_empty(),
            // (a retry at the last attempt fails for good)
            Outcome::Fail { .. } | Outcome::Reject { .. } | Outcome::Retry { .. } => on_failed,
        })
    }

    /// Whether an outcome makes follow-ups whatever its task's facts: a done task with a
    /// done route or follow-ups of its own (a failure's routes depend on its attempt).
    fn surely_has_follow_ups(&self, outcome: &Outcome) -> bool {
        match outcome {
            Outcome::Done(d) => !d.next.is_empty() || self.route_kinds().0,
            _ => false,
        }
    }

    fn route_kinds(&self) -> (bool, bool) {
        let has = |on| self.cfg.next.iter().any(|r| r.on == on);
        (has(RouteOn::Done), has(RouteOn::Failed))
    }

    /// The steps, each idempotent: what the parents are, their children, their chains,
    /// the chains' member lists, then the children themselves.
    async fn create(
        &mut self,
        tasks: &[LeasedTask],
        outcomes: &mut [Outcome],
    ) -> Result<(), QueueError> {
        let on_failed = self.route_kinds().1;
        let candidates: Vec<usize> = (0..tasks.len())
            .filter(|&i| on_failed || !matches!(outcomes[i], Outcome::Retry { .. }))
            .collect();
        let parents: Vec<&LeasedTask> = candidates.iter().map(|&i| &tasks[i]).collect();
        let starting: Vec<bool> = candidates
            .iter()
            .map(|&i| {
                // (an id too long for its children fails below, and names no chain)
                self.surely_has_follow_ups(&outcomes[i]) && tasks[i].id.len() + 8 <= MAX_ID_LEN
            })
            .collect();
        let facts: BTreeMap<usize, ChainFacts> = candidates
            .iter()
            .copied()
            .zip(self.own.parents_chain_facts(&parents, &starting).await?)
            .collect();
        let children = self.plan(tasks, outcomes, &facts);
        let mut failed_parents = self.too_long_ids(&children, outcomes);
        let mut children: Vec<Child> = children
            .into_iter()
            .filter(|c| !failed_parents.contains(&c.parent))
            .collect();
        if children.is_empty() {
            return Ok(());
        }
        let refused = match self.in_one_call(tasks, &mut children, &facts).await? {
            Some(refused) => refused,
            None => self.link_then_enqueue(tasks, &mut children, &facts).await?,
        };
        for (parent, refusal) in refused {
            if failed_parents.insert(parent) {
                outcomes[parent] = match refusal {
                    Refusal::Closed(reason) => Outcome::Retry {
                        delay: self.cfg.retry.delay(tasks[parent].attempt),
                        reason,
                    },
                    Refusal::Taken(reason) => Outcome::Reject { reason },
                };
            }
        }
        hold_for_tests();
        Ok(())
    }

    /// On one server, where a queue's keys and the chains' share a script: the chains'
    /// writes (claims of the chains parents start, members added to those they are in)
    /// and the children's enqueue in one call, which spares the batch a call waited for
    /// in turn. It applies when every parent's chain is known (its meta or record names
    /// it) and claims of chains under those names are all the parents': `None` when not
    /// (a parent whose record names no chain yet, a chain another task or run holds),
    /// and [`FollowUps::link_then_enqueue`] takes over, which redoes the writes (each
    /// idempotent) and renames what it must. Returns the parents whose children a queue
    /// refused, as [`FollowUps::enqueue`] does.
    async fn in_one_call(
        &mut self,
        tasks: &[LeasedTask],
        children: &mut [Child],
        facts: &BTreeMap<usize, ChainFacts>,
    ) -> Result<Option<Vec<(usize, Refusal)>>, QueueError> {
        if !matches!(self.client.connection(), RedisConn::Single(_)) {
            return Ok(None);
        }
        let mut chains = BTreeMap::new();
        for c in children.iter() {
            let Some(chain) = facts.get(&c.parent).and_then(|f| f.chain.clone()) else {
                return Ok(None);
            };
            chains.insert(c.parent, chain);
        }
        // Its own chain's children take their ids from its name (see `link`).
        let own = self.cfg.name.clone();
        let starts = |parent: usize| chain::started_by(&own, &tasks[parent].id, &chains[&parent]);
        for c in children.iter_mut().filter(|c| starts(c.parent)) {
            c.id = chain::derived_id(&chains[&c.parent], c.n);
            if c.id.len() > MAX_ID_LEN {
                return Ok(None);
            }
        }
        // per parent that starts a chain: its member, its run, its children
        let mut roots: BTreeMap<usize, (Member, String, Vec<Pair>)> = BTreeMap::new();
        let mut adds: BTreeMap<&str, Vec<Pair>> = BTreeMap::new();
        for c in children.iter() {
            let parent = Member::new(&own, &tasks[c.parent].id);
            let pair = (Member::new(&c.queue, &c.id), parent.clone());
            if starts(c.parent) {
                let run = tasks[c.parent].meta.run().unwrap_or_default();
                roots
                    .entry(c.parent)
                    .or_insert_with(|| (parent, run, Vec::new()))
                    .2
                    .push(pair);
            } else {
                adds.entry(&chains[&c.parent]).or_default().push(pair);
            }
        }
        let claims: Vec<Claim> = roots
            .iter()
            .map(|(p, (root, run, members))| Claim {
                chain: &chains[p],
                root,
                run,
                members,
            })
            .collect();
        let adds: Vec<(&str, &[(Member, Member)])> =
            adds.iter().map(|(c, m)| (*c, m.as_slice())).collect();
        let writes = chain::writes(self.client.namespace(), &claims, &adds, self.targets.ttl);
        self.enqueue(children, &chains, Some(writes)).await
    }

    /// Puts the children in their chains ([`FollowUps::link`]), then enqueues them.
    async fn link_then_enqueue(
        &mut self,
        tasks: &[LeasedTask],
        children: &mut Vec<Child>,
        facts: &BTreeMap<usize, ChainFacts>,
    ) -> Result<Vec<(usize, Refusal)>, QueueError> {
        let (chains, too_long) = self.link(tasks, children, facts).await?;
        let mut refused: Vec<(usize, Refusal)> = too_long
            .into_iter()
            .map(|(p, why)| (p, Refusal::Taken(why)))
            .collect();
        children.retain(|c| !refused.iter().any(|(p, _)| *p == c.parent));
        let enqueued = self.enqueue(children, &chains, None).await?;
        refused.extend(enqueued.unwrap_or_default());
        Ok(refused)
    }

    /// Every child of the batch: the queue's routes for how each task ended, then the
    /// handler's own follow-ups, numbered from 1 per parent.
    fn plan(
        &self,
        tasks: &[LeasedTask],
        outcomes: &[Outcome],
        facts: &BTreeMap<usize, ChainFacts>,
    ) -> Vec<Child> {
        let mut out = Vec::new();
        for (&i, fact) in facts {
            let task = &tasks[i];
            let mut next: Vec<(String, serde_json::Value)> = Vec::new();
            match &outcomes[i] {
                Outcome::Done(done) => {
                    let result = done.result.clone().unwrap_or(serde_json::Value::Null);
                    next.extend(self.routes(RouteOn::Done).map(|q| (q, result.clone())));
                    next.extend(
                        done.next
                            .iter()
                            .map(|f| (f.queue.clone(), f.payload.clone())),
                    );
                }
                Outcome::Reject { reason } => next.extend(self.failed_routes(task, reason)),
                Outcome::Fail { reason } if final_attempt(task, fact) => {
                    next.extend(self.failed_routes(task, reason))
                }
                // The queue dead-letters a retry at the last attempt, saying so (settle.lua).
                Outcome::Retry { reason, .. } if final_attempt(task, fact) => {
                    let max = fact.max_attempts.unwrap_or_default();
                    let reason = if reason.is_empty() {
                        "retry requested"
                    } else {
                        reason
                    };
                    let why = format!(
                        "attempt {} of {max} failed (max_attempts reached): {reason}",
                        task.attempt
                    );
                    next.extend(self.failed_routes(task, &why))
                }
                _ => {}
            }
            out.extend(
                next.into_iter()
                    .enumerate()
                    .map(|(n, (queue, payload))| Child {
                        parent: i,
                        n: n + 1,
                        queue,
                        id: chain::derived_id(&task.id, n + 1),
                        payload: payload.to_string().into_bytes(),
                    }),
            );
        }
        out
    }

    fn routes(&self, on: RouteOn) -> impl Iterator<Item = String> + '_ {
        self.cfg
            .next
            .iter()
            .filter(move |r| r.on == on)
            .map(|r| r.queue.clone())
    }

    /// The `on = "failed"` follow-ups of a task that failed for good: their payload says
    /// which task failed, why, and what it was given.
    fn failed_routes(&self, task: &LeasedTask, reason: &str) -> Vec<(String, serde_json::Value)> {
        let given = serde_json::from_slice(&task.payload).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&task.payload).into())
        });
        let payload =
            json!({"task": task.id, "queue": self.cfg.name, "error": reason, "payload": given});
        self.routes(RouteOn::Failed)
            .map(|q| (q, payload.clone()))
            .collect()
    }

    /// Parents whose children's ids would be over the id limit (a chain too deep) fail.
    fn too_long_ids(
        &self,
        children: &[Child],
        outcomes: &mut [Outcome],
    ) -> std::collections::BTreeSet<usize> {
        let mut failed = std::collections::BTreeSet::new();
        for c in children.iter().filter(|c| c.id.len() > MAX_ID_LEN) {
            if failed.insert(c.parent) {
                outcomes[c.parent] = Outcome::Reject {
                    reason: too_long(&c.id),
                };
            }
        }
        failed
    }

    /// Puts the children in their parents' chains, one call per chain, and returns each
    /// parent's chain: the one its record names, else a chain of its own (the parent
    /// becomes a global task, its record says so), under its id or, when another task's
    /// chain (or an earlier run's of the same task) already has that id, under
    /// `QUEUE:ID`, and should that be taken too, `QUEUE:ID@RUN`. A global task's children
    /// take their ids from its chain's name (`CHAIN~N`), so that two chains never make
    /// one id between them. Also returns the parents whose children's ids came out too
    /// long under a renamed chain.
    async fn link(
        &self,
        tasks: &[LeasedTask],
        children: &mut [Child],
        facts: &BTreeMap<usize, ChainFacts>,
    ) -> Result<(BTreeMap<usize, String>, Vec<(usize, String)>), QueueError> {
        let mut by_parent: BTreeMap<usize, Vec<&Child>> = BTreeMap::new();
        for c in children.iter() {
            by_parent.entry(c.parent).or_default().push(c);
        }
        let mut chains = BTreeMap::new();
        let mut in_chains: BTreeMap<String, Vec<(Member, Member)>> = BTreeMap::new();
        let mut new_roots = Vec::new();
        for (parent, kids) in by_parent {
            let id = &tasks[parent].id;
            let of = |chain: &str| NewRoot {
                parent,
                chain: chain.to_string(),
                kids: kids.iter().map(|c| (c.queue.clone(), c.n)).collect(),
                named: true,
            };
            match facts.get(&parent).and_then(|f| f.chain.clone()) {
                // Its own chain (just named by `chain_facts`, or started before): claimed
                // again, which is idempotent, with the new members.
                Some(chain) if chain::started_by(&self.cfg.name, id, &chain) => {
                    new_roots.push(of(&chain))
                }
                Some(chain) => {
                    let parent_member = Member::new(&self.cfg.name, id);
                    in_chains.entry(chain.clone()).or_default().extend(
                        kids.iter()
                            .map(|c| (Member::new(&c.queue, &c.id), parent_member.clone())),
                    );
                    chains.insert(parent, chain);
                }
                None => new_roots.push(NewRoot {
                    named: false,
                    ..of(id)
                }),
            }
        }
        let conn = self.client.connection();
        let ns = self.client.namespace();
        let ttl = self.targets.ttl;
        let adds: Vec<(&str, &[(Member, Member)])> = in_chains
            .iter()
            .map(|(chain, members)| (chain.as_str(), members.as_slice()))
            .collect();
        let (_, started) = futures::future::try_join(
            chain::add_many(&conn, ns, &adds, ttl),
            self.start_chains(tasks, &new_roots),
        )
        .await?;
        let mut too_long = Vec::new();
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        let mut before: BTreeMap<&str, Vec<(Member, Member)>> = BTreeMap::new();
        for (r, named) in new_roots.iter().zip(&started) {
            let id = tasks[r.parent].id.as_str();
            let Named {
                chain,
                before: old_ids,
            } = match named {
                Ok(named) => named,
                Err(why) => {
                    too_long.push((r.parent, why.clone()));
                    continue;
                }
            };
            let base = if *old_ids { id } else { chain.as_str() };
            for c in children.iter_mut().filter(|c| c.parent == r.parent) {
                c.id = chain::derived_id(base, c.n);
                if *old_ids {
                    before.entry(chain).or_default().push((
                        Member::new(&c.queue, &c.id),
                        Member::new(&self.cfg.name, id),
                    ));
                }
            }
            // Records that do not name their chain yet (or name one another task holds).
            if !r.named || *chain != r.chain {
                pairs.push((id, chain.as_str()));
            }
            chains.insert(r.parent, chain.clone());
        }
        // (the members of chains whose claim added none: see `RootClaim::OursBefore`)
        let adds: Vec<(&str, &[(Member, Member)])> =
            before.iter().map(|(c, m)| (*c, m.as_slice())).collect();
        futures::future::try_join(
            chain::add_many(&conn, ns, &adds, ttl),
            self.own.set_chains(&pairs),
        )
        .await?;
        Ok((chains, too_long))
    }

    /// A chain for each parent that starts one, with its follow-ups: under the chain
    /// named, or another name when that one is taken (see [`FollowUps::link`]). Returns
    /// each one's chain, or why its children's ids would be too long. One call for all of
    /// them on one server (then one more for each level of the rare renames).
    async fn start_chains(
        &self,
        tasks: &[LeasedTask],
        new_roots: &[NewRoot],
    ) -> Result<Vec<Result<Named, String>>, QueueError> {
        let conn = self.client.connection();
        let ns = self.client.namespace();
        let ttl = self.targets.ttl;
        let roots: Vec<Member> = new_roots
            .iter()
            .map(|r| Member::new(&self.cfg.name, &tasks[r.parent].id))
            .collect();
        let runs: Vec<String> = new_roots
            .iter()
            .map(|r| tasks[r.parent].meta.run().unwrap_or_default())
            .collect();
        let mut out: Vec<Result<Named, String>> = new_roots
            .iter()
            .map(|r| {
                Ok(Named {
                    chain: r.chain.clone(),
                    before: false,
                })
            })
            .collect();
        // Each round claims the chains still to claim, each under its next name.
        let mut todo: Vec<usize> = (0..new_roots.len()).collect();
        for round in 0..3 {
            let names: Vec<String> = todo
                .iter()
                .map(|&i| match round {
                    0 => new_roots[i].chain.clone(),
                    1 => chain::renamed(&self.cfg.name, &roots[i].id, None),
                    _ => chain::renamed(&self.cfg.name, &roots[i].id, Some(&runs[i])),
                })
                .collect();
            let mut asked = Vec::new();
            for (&i, name) in todo.iter().zip(names) {
                let members: Vec<(Member, Member)> = new_roots[i]
                    .kids
                    .iter()
                    .map(|(q, n)| {
                        (
                            Member::new(q, chain::derived_id(&name, *n)),
                            roots[i].clone(),
                        )
                    })
                    .collect();
                match members.iter().find(|(m, _)| m.id.len() > MAX_ID_LEN) {
                    Some((m, _)) => out[i] = Err(too_long(&m.id)),
                    None => asked.push((i, name, members)),
                }
            }
            let claims: Vec<Claim> = asked
                .iter()
                .map(|(i, name, members)| Claim {
                    chain: name,
                    root: &roots[*i],
                    run: &runs[*i],
                    members,
                })
                .collect();
            let answers = chain::claim_many(&conn, ns, &claims, ttl).await?;
            todo.clear();
            for ((i, name, _), answer) in asked.into_iter().zip(answers) {
                match answer {
                    RootClaim::Ours => {
                        out[i] = Ok(Named {
                            chain: name,
                            before: false,
                        })
                    }
                    RootClaim::OursBefore => {
                        out[i] = Ok(Named {
                            chain: name,
                            before: true,
                        })
                    }
                    RootClaim::Taken(_) | RootClaim::EarlierRun if round < 2 => todo.push(i),
                    RootClaim::Taken(holder) => {
                        out[i] = Err(format!(
                            "chain {name} is taken by task {} of queue {}",
                            holder.id, holder.queue
                        ))
                    }
                    RootClaim::EarlierRun => {
                        out[i] = Err(format!("chain {name} is taken by an earlier run"))
                    }
                }
            }
            if todo.is_empty() {
                break;
            }
        }
        Ok(out)
    }

    /// Enqueues the children, one call per target queue, the first after `writes` when
    /// given (in the same call). Returns the parents whose children a queue refused: its
    /// intake closed (for now), or an id held by a task that is not in the parent's chain
    /// (for good; see `lua/enqueue.lua`), when the others' are enqueued again without
    /// them; `None`, with nothing enqueued, when a claim among `writes` was refused.
    async fn enqueue(
        &mut self,
        children: &[Child],
        chains: &BTreeMap<usize, String>,
        mut writes: Option<ChainWrites>,
    ) -> Result<Option<Vec<(usize, Refusal)>>, QueueError> {
        let mut by_queue: BTreeMap<&str, Vec<&Child>> = BTreeMap::new();
        for c in children {
            by_queue.entry(&c.queue).or_default().push(c);
        }
        let mut refused = Vec::new();
        for (queue, mut kids) in by_queue {
            let handle = self.handle(queue)?;
            while !kids.is_empty() {
                let tasks: Vec<NewTask> = kids
                    .iter()
                    .map(|c| {
                        NewTask::new(c.payload.clone())
                            .id(&c.id)
                            .chain(TaskChain::FollowUp(chains[&c.parent].clone()))
                    })
                    .collect();
                let made = match writes.take() {
                    Some(writes) => match handle.enqueue_after_chains(&tasks, &writes).await {
                        Ok(AfterChains::Enqueued(made)) => Ok(made),
                        Ok(AfterChains::Refused(_)) => return Ok(None),
                        Err(e) => Err(e),
                    },
                    None => handle.enqueue_many(&tasks).await,
                };
                let made = match made {
                    Ok(made) => made,
                    Err(QueueError::IntakeClosed { .. }) => {
                        refused.extend(kids.iter().map(|c| {
                            (
                                c.parent,
                                Refusal::Closed(format!(
                                    "follow-up queue {queue} refuses new tasks: its intake is closed"
                                )),
                            )
                        }));
                        break;
                    }
                    Err(e) => return Err(e),
                };
                let taken: Vec<(usize, Refusal)> = kids
                    .iter()
                    .zip(&made)
                    .filter_map(|(c, e)| Some((c, e.taken?)))
                    .map(|(c, by)| {
                        let reason = format!(
                            "follow-up id {} on queue {queue} is taken by a task of {}",
                            c.id,
                            by.as_str()
                        );
                        (c.parent, Refusal::Taken(reason))
                    })
                    .collect();
                if taken.is_empty() {
                    break;
                }
                kids.retain(|c| !taken.iter().any(|(p, _)| *p == c.parent));
                refused.extend(taken);
            }
        }
        Ok(Some(refused))
    }

    fn handle(&mut self, queue: &str) -> Result<Queue, QueueError> {
        if let Some(q) = self.handles.get(queue) {
            return Ok(q.clone());
        }
        let limits = self.targets.queues.get(queue).cloned().unwrap_or_default();
        let q = self.client.queue_with(queue, limits)?;
        self.handles.insert(queue.to_string(), q.clone());
        Ok(q)
    }
}

/// Whether a failed attempt is the task's last: its next failure dead-letters it.
fn final_attempt(task: &LeasedTask, fact: &ChainFacts) -> bool {
    match fact.max_attempts {
        Some(0) | None => false,
        Some(max) => task.attempt >= max,
    }
}

/// Why a follow-up's id cannot be used.
fn too_long(id: &str) -> String {
    format!(
        "follow-up id {}… is over {MAX_ID_LEN} bytes: the chain is too deep",
        &id[..32.min(id.len())]
    )
}

fn retry_all(outcomes: Vec<Outcome>, reason: &str) -> Vec<Outcome> {
    outcomes
        .into_iter()
        .map(|o| match o {
            Outcome::Retry { .. } => o,
            _ => Outcome::Retry {
                delay: Duration::ZERO,
                reason: reason.to_string(),
            },
        })
        .collect()
}

/// Test hook: with `GAFFER_TEST_HOLD_AFTER_FOLLOW_UPS=PATH` set, the first slot that has
/// just created follow-ups writes its pid to PATH and stops there, its batch unsettled, so
/// a test can kill it at exactly that moment (the window this module's order exists for).
/// Once PATH exists, slots go on as usual.
fn hold_for_tests() {
    let Some(path) = std::env::var_os("GAFFER_TEST_HOLD_AFTER_FOLLOW_UPS") else {
        return;
    };
    let claimed = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, std::process::id().to_string().as_bytes())
        });
    if claimed.is_err() {
        return;
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
