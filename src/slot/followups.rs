//! A batch's follow-ups, created before the batch is settled.
//!
//! A task that is done (or has failed for good) may lead to follow-up tasks: its queue's
//! `next` routes and those its handler adds. They are enqueued with ids derived from
//! their parent's (a chain's global task's from the chain's id: `crate::chain`), in their
//! chain, before the parent is settled: a slot that dies anywhere in between leaves its
//! tasks' leases to expire, and the parents run again, make the same ids, and the enqueue
//! (deduplicating against records too) finds the children already made. The enqueue lists
//! each child in its chain in the same step, so there is nothing else to write. On one
//! server the check that the parents' leases still stand is part of the first enqueue
//! call; on a Redis Cluster, where a parent and its children live in different slots, it
//! is a call of its own before. A batch without follow-ups pays nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::chain::{self, ChainTargets, Member};
use crate::config::{QueueConfig, RouteOn};
use crate::host::handler::Outcome;
use crate::queue_client::{
    ChainFacts, ChainPlace, FollowUpsEnqueued, LeasedTask, MAX_ID_LEN, NewTask, Queue, QueueClient,
    QueueError, RecordState, SettleResult, TaskChain,
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

/// One follow-up to create.
struct Child {
    /// Which task of the batch it follows.
    parent: usize,
    /// Its place among its parent's follow-ups, from 1.
    n: usize,
    queue: String,
    /// Derived from its parent's id, or for a chain's global task from the chain's id.
    id: String,
    payload: Vec<u8>,
}

/// A parent's chain: its id, and what its children's ids derive from (the chain's id for
/// its global task, else the parent's own id).
struct ParentChain {
    chain: String,
    base: String,
    /// Whether the parent starts the chain now (its record names none yet).
    starts: bool,
}

/// What [`FollowUps::enqueue`] did.
enum Enqueue {
    /// The children are enqueued, but for these parents' (a queue refused them).
    Done(Vec<(usize, Refusal)>),
    /// Nothing was written: the leases of these parents (batch positions) are gone.
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

    fn route_kinds(&self) -> (bool, bool) {
        let has = |on| self.cfg.next.iter().any(|r| r.on == on);
        (has(RouteOn::Done), has(RouteOn::Failed))
    }

    /// The steps, each idempotent: what the parents are, their chains and children, the
    /// records of the parents that start a chain now, then the children themselves.
    async fn create(
        &mut self,
        tasks: &[LeasedTask],
        outcomes: &mut [Outcome],
    ) -> Result<Made, QueueError> {
        let on_failed = self.route_kinds().1;
        let mut candidates: Vec<usize> = (0..tasks.len())
            .filter(|&i| on_failed || !matches!(outcomes[i], Outcome::Retry { .. }))
            .collect();
        // (on one server the check is part of the children's first call: `enqueue`)
        let single = !self.client.connection().is_cluster();
        if !single {
            self.keep_held(tasks, &mut candidates).await?;
        }
        let facts: BTreeMap<usize, ChainFacts> = candidates
            .iter()
            .map(|&i| (i, tasks[i].chain_facts()))
            .collect();
        let mut children = self.plan(tasks, outcomes, &facts);
        let mut chains: BTreeMap<usize, ParentChain> = BTreeMap::new();
        let mut failed_parents = std::collections::BTreeSet::new();
        for c in &children {
            if chains.contains_key(&c.parent) || failed_parents.contains(&c.parent) {
                continue;
            }
            match self.chain_of(&tasks[c.parent], &facts[&c.parent]) {
                Some(chain) => {
                    chains.insert(c.parent, chain);
                }
                None => {
                    failed_parents.insert(c.parent);
                    outcomes[c.parent] = Outcome::Reject {
                        reason: format!(
                            "a task of queue {} cannot have follow-ups: the queue keeps no \
                             records (track = false), and a chain is followed through them",
                            self.cfg.name
                        ),
                    };
                }
            }
        }
        for c in children.iter_mut() {
            if let Some(chain) = chains.get(&c.parent) {
                c.id = chain::derived_id(&chain.base, c.n);
            }
        }
        failed_parents.extend(self.too_long_ids(&children, outcomes));
        children.retain(|c| !failed_parents.contains(&c.parent));
        if children.is_empty() {
            return Ok(Made::default());
        }
        self.name_new_chains(tasks, &children, &chains).await?;
        let refused = loop {
            match self.enqueue(tasks, &children, &chains, single).await? {
                Enqueue::Done(refused) => break refused,
                // (those parents' settles come back stale; the others' children are made)
                Enqueue::LeasesGone(gone) => children.retain(|c| !gone.contains(&c.parent)),
            }
        };
        for (parent, refusal) in refused {
            if failed_parents.insert(parent) {
                outcomes[parent] = match refusal {
                    Refusal::Closed(reason) => Outcome::Retry {
                        delay: self.cfg.retry.delay(tasks[parent].attempt),
                        priority: None,
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
            made.by_parent
                .entry(c.parent)
                .or_insert_with(|| (chains[&c.parent].chain.clone(), Vec::new()))
                .1
                .push(Member::new(&c.queue, &c.id));
        }
        Ok(made)
    }

    /// A parent's chain as its meta says it: the chain it is the global task of or a
    /// follow-up in, or for a task in no chain the chain its record number names, which
    /// it starts now. `None` for a task without a record (an untracked queue's).
    fn chain_of(&self, task: &LeasedTask, fact: &ChainFacts) -> Option<ParentChain> {
        let (chain, base, starts) = match &fact.place {
            ChainPlace::Global(g) => (g.clone(), g.clone(), false),
            ChainPlace::FollowUp(g) => (g.clone(), task.id.clone(), false),
            ChainPlace::None => {
                let g = chain::chain_id(&self.cfg.name, fact.seq?);
                (g.clone(), g, true)
            }
            ChainPlace::Untracked => return None,
        };
        Some(ParentChain {
            chain,
            base,
            starts,
        })
    }

    /// The records of the parents that start a chain now name it, before any child is
    /// made: a reader finds the chain's global task by its number and its record.
    async fn name_new_chains(
        &self,
        tasks: &[LeasedTask],
        children: &[Child],
        chains: &BTreeMap<usize, ParentChain>,
    ) -> Result<(), QueueError> {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for (&p, chain) in chains.iter().filter(|(_, c)| c.starts) {
            if children.iter().any(|c| c.parent == p) {
                pairs.push((&tasks[p].id, &chain.chain));
            }
        }
        self.own.set_chains(&pairs).await.map(|_| ())
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

    /// Every child of the batch: the queue's routes for how each task ended, then the
    /// handler's own follow-ups, numbered from 1 per parent (ids are given once their
    /// parents' chains are known).
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
                        id: String::new(),
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

    /// Enqueues the children, one call per target queue; on one server (`single`) the
    /// first call checks that the parents' leases stand, and writes nothing when one is
    /// gone. Returns the parents whose children a queue refused: its intake closed (for
    /// now), or an id held by a task that is not in the parent's chain (for good; see
    /// `lua/enqueue.lua`), when the others' are enqueued again without them.
    async fn enqueue(
        &mut self,
        tasks: &[LeasedTask],
        children: &[Child],
        chains: &BTreeMap<usize, ParentChain>,
        single: bool,
    ) -> Result<Enqueue, QueueError> {
        let mut by_queue: BTreeMap<&str, Vec<&Child>> = BTreeMap::new();
        for c in children {
            by_queue.entry(&c.queue).or_default().push(c);
        }
        let mut parents: Vec<usize> = children.iter().map(|c| c.parent).collect();
        parents.sort_unstable();
        parents.dedup();
        let mut check_leases = single;
        let mut refused = Vec::new();
        for (queue, mut kids) in by_queue {
            let handle = self.handle(queue)?;
            while !kids.is_empty() {
                let new: Vec<NewTask> = kids
                    .iter()
                    .map(|c| {
                        NewTask::new(c.payload.clone())
                            .id(&c.id)
                            .chain(TaskChain::FollowUp(chains[&c.parent].chain.clone()))
                    })
                    .collect();
                let made = if std::mem::take(&mut check_leases) {
                    let leased: Vec<&LeasedTask> = parents.iter().map(|&p| &tasks[p]).collect();
                    match handle.enqueue_follow_ups(&new, &self.own, &leased).await {
                        Ok(FollowUpsEnqueued::Enqueued(made)) => Ok(made),
                        Ok(FollowUpsEnqueued::LeasesGone(gone)) => {
                            return Ok(Enqueue::LeasesGone(
                                gone.into_iter().map(|i| parents[i]).collect(),
                            ));
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    handle.enqueue_many(&new).await
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
                priority: None,
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
