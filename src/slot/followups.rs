//! A batch's follow-ups, created before the batch is settled.
//!
//! A task that is done (or has failed for good) may lead to follow-up tasks: its queue's
//! `next` routes and those its handler adds. They are enqueued with ids derived from
//! their parent's, after they are added to their chain's member list (but for an unlisted
//! chain's route follow-ups of its global task: `chain::run_base`), and all that
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
    QueueError, RecordState, RedisConn, SettleResult, TaskChain,
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
    /// Made by one of its parent's queue's routes (not by its handler).
    route: bool,
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

/// The parents whose children a queue refused, and each parent's chain.
type Enqueued = (Vec<(usize, Refusal)>, BTreeMap<usize, String>);

/// What [`FollowUps::in_one_call`] did.
enum OneCall {
    /// The children are made (but for the parents a queue refused).
    Made(Enqueued),
    /// It does not apply here: nothing was written (off one server, a chain not known
    /// yet, a claim refused).
    NotHere,
    /// Nothing was written: these parents' leases (batch positions) are gone.
    LeasesGone(Vec<usize>),
}

/// The writes of [`FollowUps::in_one_call`], and the parents whose leases they check, in
/// the order the writes name them.
struct OneCallWrites {
    writes: ChainWrites,
    parents: Vec<usize>,
}

/// What [`FollowUps::enqueue`] did.
enum Enqueue {
    /// The children are enqueued, but for these parents' (a queue refused them).
    Done(Vec<(usize, Refusal)>),
    /// Nothing was enqueued: a claim among the writes was refused.
    ClaimRefused,
    /// Nothing was written: the leases of these parents (positions among those the
    /// writes checked) are gone.
    LeasesGone(Vec<usize>),
}

/// How many times [`FollowUps::after_settle`] tries to cancel a cancelled parent's
/// follow-ups while Redis fails.
const CANCEL_TRIES: u32 = 4;

/// The follow-ups a batch made: by parent position, its chain and its children.
#[derive(Debug, Default)]
pub(super) struct Made {
    by_parent: BTreeMap<usize, (String, Vec<Member>)>,
}

/// `kids`, then every task `listed` (a chain's follow-ups with their parents) puts below
/// one of them, each once.
fn below(kids: &[Member], listed: &[(Member, Member)]) -> Vec<Member> {
    let mut children: HashMap<&Member, Vec<&Member>> = HashMap::new();
    for (child, parent) in listed {
        children.entry(parent).or_default().push(child);
    }
    let mut seen: std::collections::HashSet<&Member> = std::collections::HashSet::new();
    let mut out: Vec<&Member> = Vec::new();
    let mut todo: Vec<&Member> = kids.iter().rev().collect();
    while let Some(m) = todo.pop() {
        if seen.insert(m) {
            out.push(m);
            todo.extend(children.get(m).into_iter().flatten().rev());
        }
    }
    out.into_iter().cloned().collect()
}

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
    /// is retried (Redis failing until `lease_until`, a follow-up queue's intake closed);
    /// with the follow-ups made, for [`FollowUps::after_settle`]. A task whose lease is
    /// gone (cancelled while it ran, or run again elsewhere) makes none.
    pub(super) async fn before_settle(
        &mut self,
        tasks: &[LeasedTask],
        mut outcomes: Vec<Outcome>,
        lease_until: Instant,
    ) -> (Vec<Outcome>, Made) {
        self.refuse_unknown_targets(tasks, &mut outcomes);
        if !self.may_have_follow_ups(&outcomes) {
            return (outcomes, Made::default());
        }
        let mut pause = Duration::from_millis(50);
        loop {
            match self.create(tasks, &mut outcomes).await {
                Ok(made) => return (outcomes, made),
                Err(e) if Instant::now() + pause >= lease_until => {
                    tracing::warn!(queue = %self.cfg.name, error = %e,
                        "follow-ups could not be created before the leases expire; the tasks run again");
                    let outcomes = retry_all(outcomes, &format!("follow-ups not created: {e}"));
                    return (outcomes, Made::default());
                }
                Err(e) => {
                    tracing::warn!(queue = %self.cfg.name, error = %e, "creating follow-ups failed, retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
            }
        }
    }

    /// After the batch's settle (`results`, by position): a parent whose settle came back
    /// stale may have been cancelled after its follow-ups were made (the check before
    /// them passed). When its record says cancelled, its follow-ups and everything its
    /// chain lists below them are cancelled too, with a note naming it: a cancel stops the
    /// chain, as it does a task still waiting. (A parent run again elsewhere keeps them:
    /// that run makes the same ids.) Best effort: Redis failing past a few tries leaves
    /// them, and says so.
    pub(super) async fn after_settle(
        &mut self,
        tasks: &[LeasedTask],
        made: &Made,
        results: &[SettleResult],
    ) {
        for (&p, (chain, kids)) in &made.by_parent {
            if results.get(p) != Some(&SettleResult::Stale) {
                continue;
            }
            let mut pause = Duration::from_millis(50);
            for tries_left in (0..CANCEL_TRIES).rev() {
                match self.cancel_below(&tasks[p].id, chain, kids).await {
                    Ok(0) => break,
                    Ok(n) => {
                        tracing::info!(queue = %self.cfg.name, task = %tasks[p].id, cancelled = n,
                            "task cancelled while it ran: its follow-ups are cancelled too");
                        break;
                    }
                    Err(e) if tries_left == 0 => {
                        tracing::warn!(queue = %self.cfg.name, task = %tasks[p].id, error = %e,
                            "the follow-ups of a task cancelled while it ran could not be cancelled");
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_PAUSE);
                    }
                }
            }
        }
    }

    /// When task `id` of this queue is cancelled, cancels `kids` and every task chain
    /// `chain` lists below them; returns how many were cancelled.
    async fn cancel_below(
        &mut self,
        id: &str,
        chain: &str,
        kids: &[Member],
    ) -> Result<usize, QueueError> {
        match self.own.record(id).await? {
            Some(r) if r.state == RecordState::Cancelled => {}
            _ => return Ok(0),
        }
        let listed = chain::members_of(&self.client, &self.targets, chain)
            .await?
            .map(|m| m.follow)
            .unwrap_or_default();
        let note = format!(
            "cancelled: task {id} of queue {}, which led to it, was cancelled while it ran",
            self.cfg.name
        );
        let mut cancelled = 0;
        for m in below(kids, &listed) {
            if self
                .handle(&m.queue)?
                .cancel_unended(&m.id, &note)
                .await?
                .is_some()
            {
                cancelled += 1;
            }
        }
        Ok(cancelled)
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
    ) -> Result<Made, QueueError> {
        let on_failed = self.route_kinds().1;
        let mut candidates: Vec<usize> = (0..tasks.len())
            .filter(|&i| on_failed || !matches!(outcomes[i], Outcome::Retry { .. }))
            .collect();
        // (on one server the check is part of the children's first call, `in_one_call`)
        let single = matches!(self.client.connection(), RedisConn::Single(_));
        if !single {
            self.keep_held(tasks, &mut candidates).await?;
        }
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
            return Ok(Made::default());
        }
        let (refused, chains) = match self.in_one_call(tasks, &mut children, &facts).await? {
            OneCall::Made(done) => done,
            OneCall::LeasesGone(gone) => {
                children.retain(|c| !gone.contains(&c.parent));
                self.step_by_step(tasks, &mut children, &facts).await?
            }
            OneCall::NotHere => {
                // (on one server the leases were not checked yet)
                if single {
                    let mut parents: Vec<usize> = children.iter().map(|c| c.parent).collect();
                    parents.sort_unstable();
                    parents.dedup();
                    self.keep_held(tasks, &mut parents).await?;
                    children.retain(|c| parents.contains(&c.parent));
                }
                self.step_by_step(tasks, &mut children, &facts).await?
            }
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
        if children.is_empty() {
            return Ok(Made::default());
        }
        hold_for_tests();
        let mut made = Made::default();
        for c in children
            .iter()
            .filter(|c| !failed_parents.contains(&c.parent))
        {
            let Some(chain) = chains.get(&c.parent) else {
                continue;
            };
            made.by_parent
                .entry(c.parent)
                .or_insert_with(|| (chain.clone(), Vec::new()))
                .1
                .push(Member::new(&c.queue, &c.id));
        }
        Ok(made)
    }

    /// Leaves out of `candidates` the tasks whose leases are gone: cancelled while they
    /// ran, or reclaimed and run again by another slot (which makes their follow-ups).
    /// Their settles come back stale. One read for the batch.
    async fn keep_held(
        &self,
        tasks: &[LeasedTask],
        candidates: &mut Vec<usize>,
    ) -> Result<(), QueueError> {
        let asked: Vec<&LeasedTask> = candidates.iter().map(|&i| &tasks[i]).collect();
        let held = self.own.leases_held(&asked).await?;
        let mut i = 0;
        candidates.retain(|_| {
            i += 1;
            held[i - 1]
        });
        Ok(())
    }

    /// On one server, where a queue's keys and the chains' share a script: the chains'
    /// writes (claims of the chains parents start, members added to those they are in)
    /// and the children's enqueue in one call, which spares the batch a call waited for
    /// in turn. It applies when every parent's chain is known (its meta or record names
    /// it) and claims of chains under those names are all the parents': `None` when not
    /// (a parent whose record names no chain yet, a chain another task or run holds),
    /// and [`FollowUps::link_then_enqueue`] takes over, which redoes the writes (each
    /// idempotent) and renames what it must. A global task whose chain is unlisted
    /// ([`FollowUps::unlisted_base`]) writes nothing to it. Returns the parents whose
    /// children a queue refused, as [`FollowUps::enqueue`] does.
    async fn in_one_call(
        &mut self,
        tasks: &[LeasedTask],
        children: &mut [Child],
        facts: &BTreeMap<usize, ChainFacts>,
    ) -> Result<OneCall, QueueError> {
        if !matches!(self.client.connection(), RedisConn::Single(_)) {
            return Ok(OneCall::NotHere);
        }
        let mut chains = BTreeMap::new();
        for c in children.iter() {
            let Some(chain) = facts.get(&c.parent).and_then(|f| f.chain.clone()) else {
                return Ok(OneCall::NotHere);
            };
            chains.insert(c.parent, chain);
        }
        let Some(OneCallWrites { writes, parents }) =
            self.one_call_writes(tasks, children, &chains)
        else {
            return Ok(OneCall::NotHere);
        };
        Ok(match self.enqueue(children, &chains, Some(writes)).await? {
            Enqueue::Done(refused) => OneCall::Made((refused, chains)),
            Enqueue::ClaimRefused => OneCall::NotHere,
            Enqueue::LeasesGone(gone) => {
                OneCall::LeasesGone(gone.into_iter().map(|i| parents[i]).collect())
            }
        })
    }

    /// The chain writes of [`FollowUps::in_one_call`], with the children's ids: a chain's
    /// global task's children take their ids from its name (see `link`), or from its run
    /// when it is unlisted. `None` when an id would be too long (`link` then says which).
    fn one_call_writes(
        &self,
        tasks: &[LeasedTask],
        children: &mut [Child],
        chains: &BTreeMap<usize, String>,
    ) -> Option<OneCallWrites> {
        let own = self.cfg.name.clone();
        let starts = |parent: usize| chain::started_by(&own, &tasks[parent].id, &chains[&parent]);
        let unlisted: BTreeMap<usize, String> = chains
            .iter()
            .filter_map(|(&p, chain)| Some((p, self.unlisted_base(&tasks[p], chain)?)))
            .collect();
        for c in children.iter_mut().filter(|c| starts(c.parent)) {
            let base = unlisted.get(&c.parent).unwrap_or(&chains[&c.parent]);
            c.id = chain::derived_id(base, c.n);
            if c.id.len() > MAX_ID_LEN {
                return None;
            }
        }
        // per parent that starts a chain: its member, its run, its children
        let mut roots: BTreeMap<usize, (Member, String, Vec<Pair>)> = BTreeMap::new();
        let mut adds: BTreeMap<&str, Vec<Pair>> = BTreeMap::new();
        for c in children.iter() {
            let parent = Member::new(&own, &tasks[c.parent].id);
            let pair = (Member::new(&c.queue, &c.id), parent.clone());
            if unlisted.contains_key(&c.parent) {
                // (a handler's follow-ups are not found from the routes: they are listed)
                if !c.route {
                    adds.entry(&chains[&c.parent]).or_default().push(pair);
                }
            } else if starts(c.parent) {
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
        if roots
            .iter()
            .any(|(p, (root, _, _))| chain::reserved(&self.targets, &chains[p], root).is_some())
        {
            // (`link` renames it)
            return None;
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
        let ns = self.client.namespace();
        let mut writes = chain::writes(ns, &claims, &adds, self.targets.ttl);
        let mut parents: Vec<usize> = children.iter().map(|c| c.parent).collect();
        parents.sort_unstable();
        parents.dedup();
        let leased: Vec<&LeasedTask> = parents.iter().map(|&p| &tasks[p]).collect();
        writes.check_leases(&self.own, &leased);
        Some(OneCallWrites { writes, parents })
    }

    /// What a global task's children take their ids from when its chain is unlisted
    /// (`chain::run_base`): its enqueue said so in its meta (a task of a queue with a done
    /// route, on one server), and its chain is the one that gave it (`QUEUE:ID`). `None`
    /// when it is not. Its meta is written once for the run, so every attempt of it
    /// decides alike and makes the ids the first made.
    fn unlisted_base(&self, task: &LeasedTask, chain: &str) -> Option<String> {
        let run = task.meta.run().filter(|r| r.contains('.'))?;
        let name = chain::renamed(&self.cfg.name, &task.id, None);
        (task.meta.unlisted() && chain == name).then(|| chain::run_base(chain, &run))
    }

    /// [`FollowUps::link_then_enqueue`], unless no child is left.
    async fn step_by_step(
        &mut self,
        tasks: &[LeasedTask],
        children: &mut Vec<Child>,
        facts: &BTreeMap<usize, ChainFacts>,
    ) -> Result<Enqueued, QueueError> {
        if children.is_empty() {
            return Ok(Default::default());
        }
        self.link_then_enqueue(tasks, children, facts).await
    }

    /// Puts the children in their chains ([`FollowUps::link`]), then enqueues them.
    async fn link_then_enqueue(
        &mut self,
        tasks: &[LeasedTask],
        children: &mut Vec<Child>,
        facts: &BTreeMap<usize, ChainFacts>,
    ) -> Result<Enqueued, QueueError> {
        let (chains, too_long) = self.link(tasks, children, facts).await?;
        let mut refused: Vec<(usize, Refusal)> = too_long
            .into_iter()
            .map(|(p, why)| (p, Refusal::Taken(why)))
            .collect();
        children.retain(|c| !refused.iter().any(|(p, _)| *p == c.parent));
        if let Enqueue::Done(more) = self.enqueue(children, &chains, None).await? {
            refused.extend(more);
        }
        Ok((refused, chains))
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
            // (a task's route follow-ups come first: see `chain::run_base`)
            let mut routed = 0;
            match &outcomes[i] {
                Outcome::Done(done) => {
                    let result = done.result.clone().unwrap_or(serde_json::Value::Null);
                    next.extend(self.routes(RouteOn::Done).map(|q| (q, result.clone())));
                    routed = next.len();
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
            if !matches!(outcomes[i], Outcome::Done(_)) {
                routed = next.len();
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
                        route: n < routed,
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
        let unlisted = self.unlisted_roots(tasks, &mut new_roots);
        let mut too_long = Vec::new();
        for (r, base) in &unlisted {
            let parent = Member::new(&self.cfg.name, &tasks[r.parent].id);
            let over = children
                .iter()
                .filter(|c| c.parent == r.parent)
                .map(|c| chain::derived_id(base, c.n))
                .find(|id| id.len() > MAX_ID_LEN);
            if let Some(id) = over {
                too_long.push((r.parent, self::too_long(&id)));
                continue;
            }
            for c in children.iter_mut().filter(|c| c.parent == r.parent) {
                c.id = chain::derived_id(base, c.n);
                if !c.route {
                    in_chains
                        .entry(r.chain.clone())
                        .or_default()
                        .push((Member::new(&c.queue, &c.id), parent.clone()));
                }
            }
            chains.insert(r.parent, r.chain.clone());
        }
        let adds: Vec<(&str, &[(Member, Member)])> = in_chains
            .iter()
            .map(|(chain, members)| (chain.as_str(), members.as_slice()))
            .collect();
        let (_, started) = futures::future::try_join(
            chain::add_many(&conn, ns, &adds, ttl),
            self.start_chains(tasks, &new_roots),
        )
        .await?;
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

    /// Takes out of `new_roots` those whose chains are unlisted, each with what its
    /// children's ids come from ([`FollowUps::unlisted_base`]).
    fn unlisted_roots(
        &self,
        tasks: &[LeasedTask],
        new_roots: &mut Vec<NewRoot>,
    ) -> Vec<(NewRoot, String)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < new_roots.len() {
            match self.unlisted_base(&tasks[new_roots[i].parent], &new_roots[i].chain) {
                Some(base) => out.push((new_roots.remove(i), base)),
                None => i += 1,
            }
        }
        out
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
            // (a name kept for another task's unlisted chain is refused unwritten)
            let single = matches!(conn, RedisConn::Single(_));
            let kept: Vec<Option<Member>> = asked
                .iter()
                .map(|(i, name, _)| {
                    single
                        .then(|| chain::reserved(&self.targets, name, &roots[*i]))
                        .flatten()
                })
                .collect();
            let claims: Vec<Claim> = asked
                .iter()
                .zip(&kept)
                .filter(|(_, k)| k.is_none())
                .map(|((i, name, members), _)| Claim {
                    chain: name,
                    root: &roots[*i],
                    run: &runs[*i],
                    members,
                })
                .collect();
            let mut claimed = chain::claim_many(&conn, ns, &claims, ttl)
                .await?
                .into_iter();
            let answers: Vec<RootClaim> = kept
                .into_iter()
                .map(|k| match k {
                    Some(holder) => RootClaim::Taken(holder),
                    None => claimed.next().unwrap_or(RootClaim::Ours),
                })
                .collect();
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
    /// them; or that nothing was enqueued, the writes refused.
    async fn enqueue(
        &mut self,
        children: &[Child],
        chains: &BTreeMap<usize, String>,
        mut writes: Option<ChainWrites>,
    ) -> Result<Enqueue, QueueError> {
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
                        Ok(AfterChains::Refused(_)) => return Ok(Enqueue::ClaimRefused),
                        Ok(AfterChains::LeasesGone(gone)) => return Ok(Enqueue::LeasesGone(gone)),
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
        Ok(Enqueue::Done(refused))
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

/// Test hooks: with `GAFFER_TEST_HOLD_AFTER_FOLLOW_UPS=PATH` set, the first slot that has
/// just created follow-ups writes its pid to PATH and stops there, its batch unsettled, so
/// a test can kill it at exactly that moment (the window this module's order exists for).
/// With `GAFFER_TEST_PAUSE_AFTER_FOLLOW_UPS=PATH`, it writes its pid to PATH and waits
/// there until `PATH.go` exists, so a test can act in that window (cancel the parent).
/// Once PATH exists, slots go on as usual. Only in builds with debug assertions (the test
/// profile's): a release build has the empty one below.
#[cfg(debug_assertions)]
fn hold_for_tests() {
    if let Some(path) = std::env::var_os("GAFFER_TEST_HOLD_AFTER_FOLLOW_UPS")
        && claim_test_hold(&path)
    {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    if let Some(mut path) = std::env::var_os("GAFFER_TEST_PAUSE_AFTER_FOLLOW_UPS")
        && claim_test_hold(&path)
    {
        path.push(".go");
        while !std::path::Path::new(&path).exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A release build's test hooks: none, and no variable read.
#[cfg(not(debug_assertions))]
fn hold_for_tests() {}

/// Whether this slot is the first to reach a test hold at `path` (and wrote its pid there).
#[cfg(debug_assertions)]
fn claim_test_hold(path: &std::ffi::OsStr) -> bool {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, std::process::id().to_string().as_bytes())
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(id: &str) -> Member {
        Member::new("q", id)
    }

    #[test]
    fn below_a_parent_is_every_task_its_chain_lists_under_it_once() {
        let listed = [
            (m("a~1"), m("a")),
            (m("a~1~1"), m("a~1")),
            (m("a~1~2"), m("a~1")),
            (m("b~1"), m("b")),
            (m("a~1~1~1"), m("a~1~1")),
            // (a list never holds a cycle; a walk must end all the same)
            (m("a~1"), m("a~1~1~1")),
        ];
        let ids = |v: Vec<Member>| v.into_iter().map(|m| m.id).collect::<Vec<_>>();
        assert_eq!(
            ids(below(&[m("a~1"), m("a~2")], &listed)),
            ["a~1", "a~1~1", "a~1~1~1", "a~1~2", "a~2"]
        );
        assert_eq!(ids(below(&[m("b~1")], &listed)), ["b~1"]);
        assert_eq!(ids(below(&[], &listed)), Vec::<String>::new());
    }
}
