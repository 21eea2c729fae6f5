//! The chain endpoints: `GET /v1/chains/{id}`, a submit with `"chain": true` (the task
//! becomes the global task of a chain of its own), with `"wait"` held until the whole
//! chain has ended, and the global task's record showing its chain's tasks.

use std::time::Duration;

use hyper::StatusCode;
use serde_json::{Value, json};

use super::error::ApiError;
use super::routes::{Api, DedupHit, WAIT_RECHECK, query_pairs, replaced};
use super::submit::Submit;
use crate::chain::{self, ChainError, ChainHead, ChainTargets, ChainTask, ChainView, PageCursor};
use crate::config::ApiKey;
use crate::queue_client::{Enqueued, Glance, NewTask, Queue, QueueError, TaskRecord};

type Answer = Result<(StatusCode, Value), ApiError>;

/// The chain a run of global task `id` of `queue` follows: the one its record names when
/// that is a name the task started it under, else its id.
fn run_chain_name(queue: &Queue, id: &str, record: Option<&TaskRecord>) -> String {
    record
        .and_then(|r| r.chain.as_deref())
        .filter(|c| chain::started_by(queue.name(), id, c))
        .unwrap_or(id)
        .to_string()
}

/// The run a chain wait follows (see `Api::run_chain`): its creation time and submitter,
/// and the name its chain had at the last look.
struct RunPin {
    created_at: String,
    submitted_by: Option<String>,
    name: String,
}

/// A chain submit's refusal: 409 naming the chain's holder for an admin key; a limited
/// key is told neither the holder's queue and id (which may be outside its list) nor why
/// the name is taken (another task's, kept for one, an earlier run's), only that it is.
fn chain_refusal(e: ChainError) -> ApiError {
    let limited = match &e {
        ChainError::Queue(_) => None,
        ChainError::Taken { chain, .. }
        | ChainError::Reserved { chain, .. }
        | ChainError::Ended { chain, .. } => Some(format!(
            "chain {chain} already exists: submit the global task under another id"
        )),
        ChainError::InChain { id, queue, .. } => Some(
            QueueError::IdTaken {
                queue: queue.clone(),
                id: id.clone(),
            }
            .to_string(),
        ),
    };
    match (e, limited) {
        (ChainError::Queue(q), _) => q.into(),
        (e, Some(limited)) => ApiError::conflict(e.to_string()).or_for_limited(limited),
        (e, None) => ApiError::conflict(e.to_string()),
    }
}

/// Tasks per page of `GET /v1/chains/{id}` when `limit` does not say.
const DEFAULT_CHAIN_LIMIT: usize = 500;
/// The most tasks one page of a chain may ask for: what bounds the records one view reads.
const MAX_CHAIN_LIMIT: usize = 1000;

/// The query of `GET /v1/chains/{id}`: `limit` (1 to [`MAX_CHAIN_LIMIT`]) and `cursor`.
fn chain_query(query: Option<&str>) -> Result<(usize, Option<PageCursor>), ApiError> {
    let mut limit = DEFAULT_CHAIN_LIMIT;
    let mut cursor = None;
    for (name, value) in query_pairs(query.unwrap_or(""))? {
        match name.as_str() {
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_CHAIN_LIMIT).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "limit must be a number from 1 to {MAX_CHAIN_LIMIT}, got {value:?}"
                        ))
                    })?
            }
            "cursor" => {
                cursor = Some(PageCursor::decode(&value).ok_or_else(|| {
                    ApiError::bad_request(format!("cursor {value:?} is not one this api returned"))
                })?)
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?}: expected limit or cursor"
                )));
            }
        }
    }
    Ok((limit, cursor))
}

/// Whether a key may see a chain: it may use its global task's queue, and is admin or
/// submitted that task (the run that made the chain: once the id holds a later run, which
/// another key may have submitted, only admin keys see the chain).
fn may_see(key: &ApiKey, head: &ChainHead) -> bool {
    key.allows(&head.root.queue)
        && (key.admin
            || head
                .record
                .as_ref()
                .is_some_and(|r| r.submitted_by.as_deref() == Some(key.name.as_str())))
}

impl Api {
    fn chain_targets(&self) -> ChainTargets {
        ChainTargets::from_config(&self.config)
    }

    /// `GET /v1/chains/{id}`: a page of the chain's tasks with their records, the global
    /// one first. A key sees a chain when it may see its global task, which is decided
    /// first, from that task alone (two reads at most): a chain a key may not see is
    /// answered as an unknown one, at the cost of one, whatever its size.
    pub(super) async fn chain(&self, key: &ApiKey, id: &str, query: Option<&str>) -> Answer {
        let (limit, cursor) = chain_query(query)?;
        let unknown = || ApiError::not_found(format!("no chain {id}"));
        let targets = self.chain_targets();
        let head = chain::head(&self.client, &targets, id)
            .await?
            .ok_or_else(unknown)?;
        if !may_see(key, &head) {
            return Err(unknown());
        }
        let page = chain::read_page(&self.client, &targets, id, limit, cursor.as_ref())
            .await?
            .ok_or_else(unknown)?;
        Ok((StatusCode::OK, page.to_json()))
    }

    /// Whether a key sees a record: its own, or a follow-up in a chain whose global task
    /// it submitted (the run that made the chain: the id may since hold a later run).
    pub(super) async fn owns(&self, key: &ApiKey, rec: &TaskRecord) -> Result<bool, ApiError> {
        if key.admin || rec.submitted_by.as_deref() == Some(key.name.as_str()) {
            return Ok(true);
        }
        let Some(chain) = rec
            .chain
            .as_deref()
            .filter(|c| !chain::started_by(&rec.queue, &rec.id, c))
        else {
            return Ok(false);
        };
        let Some(list) = chain::members_of(&self.client, &self.chain_targets(), chain).await?
        else {
            return Ok(false);
        };
        // (an unlisted chain's members are its global task's current run's only)
        let member = chain::Member::new(&rec.queue, &rec.id);
        if !list.follow.iter().any(|(m, _)| *m == member) {
            return Ok(false);
        }
        let Some(queue) = self.queues.get(&list.root.queue) else {
            return Ok(false);
        };
        Ok(queue.record(&list.root.id).await?.is_some_and(|r| {
            list.made_by(chain, &r) && r.submitted_by.as_deref() == Some(key.name.as_str())
        }))
    }

    /// A record as `GET …/tasks/{id}` answers it: a global task's shows its chain's state
    /// and tasks beside (`chain_state`, `chain_tasks`: queue, id, state, parent).
    pub(super) async fn record_answer(&self, rec: TaskRecord) -> Result<Value, ApiError> {
        let own = rec
            .chain
            .as_deref()
            .filter(|c| chain::started_by(&rec.queue, &rec.id, c));
        let mut out = json!(rec);
        let Some(own) = own else {
            return Ok(out);
        };
        let targets = self.chain_targets();
        // (A task of a queue with a done route names its own chain from its enqueue on;
        // until it has follow-ups, a chain of that id may still be another task's, or an
        // earlier run's of the same task, whose view then leaves this record out.)
        let view = chain::read(&self.client, &targets, own).await?.filter(|v| {
            v.tasks.first().is_some_and(|t| {
                t.member == chain::Member::new(&rec.queue, &rec.id) && t.record.is_some()
            })
        });
        if let Some(view) = view {
            let tasks: Vec<Value> = view
                .tasks
                .iter()
                .map(|t| {
                    json!({"queue": t.member.queue, "id": t.member.id,
                           "state": t.record.as_ref().map(|r| r.state), "parent": t.parent})
                })
                .collect();
            out["chain_state"] = json!(view.state);
            out["chain_tasks"] = json!(tasks);
        }
        Ok(out)
    }

    /// Before a submit with `"chain": true` is enqueued: the queue must keep records
    /// (a chain is followed through them), and each task becomes a chain's global task
    /// (an id already another task's chain is refused, 409).
    pub(super) async fn start_chains(
        &self,
        queue: &Queue,
        parsed: &mut Submit,
    ) -> Result<(), ApiError> {
        let tasks: &mut [NewTask] = match parsed {
            Submit::One { task, .. } => std::slice::from_mut(task),
            Submit::Bulk(tasks) => tasks,
        };
        if !tasks.iter().any(|t| t.chain.is_some()) {
            return Ok(());
        }
        if !queue.limits().track {
            return Err(ApiError::bad_request(format!(
                "chain needs records to follow, and queue {} keeps none (track = false)",
                queue.name()
            )));
        }
        // The refusals the enqueue would answer come first: a refused task must leave no
        // chain claimed under its id.
        for t in tasks.iter() {
            queue.check(t)?;
        }
        if queue.intake().await? == crate::config::Intake::Closed {
            return Err(QueueError::IntakeClosed {
                queue: queue.name().to_string(),
            }
            .into());
        }
        let targets = self.chain_targets();
        let chained = tasks.iter_mut().filter(|t| t.chain.is_some()).collect();
        chain::start_global(&self.client, queue, chained, &targets)
            .await
            .map_err(chain_refusal)
    }

    /// Before a limited key's chain submit claims anything: an id whose task or kept
    /// record another submitter's is refused (409, as its enqueue would refuse it), so
    /// the chain checks that come first neither claim a chain for it nor tell this key
    /// what that task is (its chain, its state). The enqueue's own check stays the one
    /// that holds against a submit racing this one.
    pub(super) async fn refuse_held_chain_ids(
        &self,
        queue: &Queue,
        key: &ApiKey,
        tasks: &[NewTask],
    ) -> Result<(), ApiError> {
        let ids: Vec<&str> = tasks
            .iter()
            .filter(|t| t.chain.is_some())
            .filter_map(|t| t.id.as_deref())
            .collect();
        if ids.is_empty() || !queue.limits().track {
            return Ok(());
        }
        // (in a few calls: a chain bulk of 10,000 ids is not 10,000 reads)
        let glances = queue.glance_many(&ids).await?;
        for (id, glance) in ids.iter().zip(glances) {
            let held_by_another = matches!(&glance, Glance::Recorded { submitted_by, .. }
                if submitted_by.as_deref() != Some(key.name.as_str()));
            if held_by_another {
                return Err(QueueError::IdTaken {
                    queue: queue.name().to_string(),
                    id: id.to_string(),
                }
                .into());
            }
        }
        Ok(())
    }

    /// `"chain": true` with `"wait"`: enqueues the global task, then holds the request
    /// until the whole chain has ended (200 with the chain) or `wait` passed (202 with
    /// the chain as it stands). Woken by each of its tasks' ends: it watches every task of
    /// the chain not yet ended, and looks again at each end (a task's follow-ups join the
    /// chain before it ends, so none can slip by), and every [`WAIT_RECHECK`] besides.
    pub(super) async fn submit_chain_and_wait(
        &self,
        queue: &Queue,
        key: &ApiKey,
        made: &Enqueued,
        wait: Duration,
    ) -> Answer {
        let found = match self.dedup_hit_of_another(queue, key, made).await? {
            DedupHit::Another(answer) => return Ok(answer),
            DedupHit::Own(found) => found,
        };
        let deadline = tokio::time::Instant::now() + wait;
        // Tasks found ended that the chain's view still showed unended: their id holds a
        // task of another chain (or run). Looked at again once, then only waited on, so
        // such a task does not spin this loop until the deadline.
        let mut seen_ended = std::collections::BTreeSet::new();
        // (the run the dedup check found, when it found one: the wait keeps to it)
        let mut pin = found.map(|r| RunPin {
            name: run_chain_name(queue, &made.id, Some(&r)),
            created_at: r.created_at,
            submitted_by: r.submitted_by,
        });
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let view = self.run_chain(queue, &made.id, &mut pin).await?;
            if view.state.is_end() {
                return Ok((StatusCode::OK, view.to_json()));
            }
            let watching = tokio::select! {
                w = self.ended.connected(left.min(WAIT_RECHECK)) => w,
                () = self.shutdown.cancelled() => false,
            };
            if tokio::time::Instant::now() >= deadline || self.shutdown.is_cancelled() {
                // (the wait for the subscription may have taken seconds: look once more)
                return self.chain_as_it_stands(queue, &made.id, &mut pin).await;
            }
            if !watching {
                // (the wait for the subscription was the pause before the next look)
                continue;
            }
            let unended: Vec<&ChainTask> = view
                .tasks
                .iter()
                .filter(|t| !t.record.as_ref().is_some_and(|r| r.state.is_end()))
                .collect();
            let mut registrations: Vec<_> = unended
                .iter()
                .map(|t| self.ended.register(&t.member.queue, &t.member.id))
                .collect();
            // (A task listed before it is made, or not yet made again, has no record to
            // watch: its parent, listed too and not ended, wakes this wait.) All at once,
            // within the deadline: a fan-out of thousands is one pipeline, not thousands
            // of calls in turn.
            let watches = unended.iter().filter_map(|t| {
                let q = self.queues.get(&t.member.queue)?;
                Some(async move { q.watch(&t.member.id).await.map(|r| (*t, r)) })
            });
            let Ok(watched) =
                tokio::time::timeout_at(deadline, futures::future::try_join_all(watches)).await
            else {
                return self.chain_as_it_stands(queue, &made.id, &mut pin).await;
            };
            let mut ended_meanwhile = false;
            for (t, rec) in watched? {
                let ended = rec.is_some_and(|r| r.state.is_end());
                ended_meanwhile |= ended && seen_ended.insert(t.member.clone());
            }
            if ended_meanwhile {
                continue;
            }
            // (no registration: no unended task is listed, and the next look decides)
            let woken = async {
                if registrations.is_empty() {
                    std::future::pending::<()>().await;
                }
                let _ = futures::future::select_all(registrations.iter_mut().map(|r| &mut r.woken))
                    .await;
            };
            tokio::select! {
                _ = woken => continue,
                () = tokio::time::sleep(WAIT_RECHECK) => continue,
                () = tokio::time::sleep_until(deadline) => {}
                () = self.shutdown.cancelled() => {}
            }
            return self.chain_as_it_stands(queue, &made.id, &mut pin).await;
        }
    }

    /// A chain wait's answer at its deadline (or a stop): the chain read once more, 200
    /// when it has ended, else 202.
    async fn chain_as_it_stands(
        &self,
        queue: &Queue,
        id: &str,
        pin: &mut Option<RunPin>,
    ) -> Answer {
        let view = self.run_chain(queue, id, pin).await?;
        let status = if view.state.is_end() {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        };
        Ok((status, view.to_json()))
    }

    /// The chain of the run of global task `id` that a submit made or found: the chain
    /// its record names (its id, or the name its run's claim got where an earlier run of
    /// the id has that chain, `QUEUE:ID`…). Until the run has made a chain of its own
    /// there, the chain of its name can be an earlier run's (the earlier run ended between
    /// the submit's check and its enqueue), which leaves its record out: the run is then
    /// a chain of one task, itself, and a wait follows it until it makes follow-ups or
    /// ends. `pin` keeps the run the first look found: once it ended, its id may hold
    /// another task (`dedup = "active"`), whose record is not this run's: another key's
    /// answers 410, as a plain wait does; the key's own leaves the run's chain as last
    /// named (and only a run that made no chain shows the new task, as a plain wait would).
    async fn run_chain(
        &self,
        queue: &Queue,
        id: &str,
        pin: &mut Option<RunPin>,
    ) -> Result<ChainView, ApiError> {
        let record = queue.record(id).await?;
        if let (Some(p), Some(r)) = (pin.as_ref(), record.as_ref())
            && r.created_at != p.created_at
        {
            if r.submitted_by != p.submitted_by {
                return Err(replaced(queue, id));
            }
            let view = chain::read(&self.client, &self.chain_targets(), &p.name).await?;
            // (an unlisted chain's view is of the run its id holds now: this run's chain
            // can no longer be read)
            let later = |v: &ChainView| {
                v.tasks
                    .first()
                    .and_then(|t| t.record.as_ref())
                    .is_some_and(|rec| rec.created_at != p.created_at)
            };
            if view.as_ref().is_some_and(later) {
                return Err(ApiError::gone(format!(
                    "task {id} of queue {} ended and its id already holds a new run, which \
                     its chain {} now shows",
                    queue.name(),
                    p.name
                )));
            }
            return Ok(view.unwrap_or_else(|| ChainView::of_task(&p.name, r.clone())));
        }
        let name = run_chain_name(queue, id, record.as_ref());
        if let Some(r) = &record {
            *pin = Some(RunPin {
                created_at: r.created_at.clone(),
                submitted_by: r.submitted_by.clone(),
                name: name.clone(),
            });
        }
        let view = chain::read(&self.client, &self.chain_targets(), &name).await?;
        let run_shown = |v: &ChainView| {
            v.tasks.first().is_some_and(|t| {
                t.record.is_some() && t.member == chain::Member::new(queue.name(), id)
            })
        };
        match (view, record) {
            (Some(v), _) if run_shown(&v) => Ok(v),
            (_, Some(r)) => Ok(ChainView::of_task(&name, r)),
            (Some(v), None) => Ok(v),
            (None, None) => Err(ApiError::not_found(format!("no chain {name}"))),
        }
    }
}
