//! The chain endpoints: `GET /v1/chains/{id}`, a submit with `"chain": true` (the task
//! becomes the global task of a chain of its own), with `"wait"` held until the whole
//! chain has ended, and the global task's record showing its chain's tasks.

use std::time::Duration;

use hyper::StatusCode;
use serde_json::{Value, json};

use super::error::ApiError;
use super::routes::{Api, DedupHit, WAIT_RECHECK, replaced};
use super::submit::Submit;
use crate::chain::{self, ChainError, ChainHead, ChainTargets, ChainTask, ChainView, PageCursor};
use crate::config::ApiKey;
use crate::queue_client::{Enqueued, Glance, NewTask, Queue, QueueError, TaskRecord};

type Answer = Result<(StatusCode, Value), ApiError>;

/// A chain submit's refusal: 409 naming the chain the id's task is in for an admin key;
/// a limited key is told only that the id is taken (the chain may be another key's).
fn chain_refusal(e: ChainError) -> ApiError {
    match e {
        ChainError::Queue(q) => q.into(),
        ChainError::InChain {
            ref id, ref queue, ..
        } => {
            let limited = QueueError::IdTaken {
                queue: queue.clone(),
                id: id.clone(),
            }
            .to_string();
            ApiError::conflict(e.to_string()).or_for_limited(limited)
        }
    }
}

/// Tasks per page of `GET /v1/chains/{id}` when `limit` does not say.
const DEFAULT_CHAIN_LIMIT: usize = 500;
/// The most tasks one page of a chain may ask for: what bounds the records one view reads.
const MAX_CHAIN_LIMIT: usize = 1000;

/// The query of `GET /v1/chains/{id}`: `limit` (1 to [`MAX_CHAIN_LIMIT`]) and `cursor`.
fn chain_query(query: Option<&str>) -> Result<(usize, Option<PageCursor>), ApiError> {
    super::listings::page_query(
        query,
        DEFAULT_CHAIN_LIMIT,
        MAX_CHAIN_LIMIT,
        PageCursor::decode,
    )
}

/// Whether a key may see a chain: it may use its global task's queue, and is admin or
/// submitted that task (whose record the head holds while it lives).
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
    /// it submitted.
    pub(super) async fn owns(&self, key: &ApiKey, rec: &TaskRecord) -> Result<bool, ApiError> {
        if key.admin || rec.submitted_by.as_deref() == Some(key.name.as_str()) {
            return Ok(true);
        }
        if let Some(name) = rec
            .submitted_by
            .as_deref()
            .and_then(crate::schedule::fired_by)
        {
            return self.fired_for(key, name, &rec.id).await;
        }
        let Some(chain) = rec
            .chain
            .as_deref()
            .filter(|_| chain::started_chain(rec).is_none())
        else {
            return Ok(false);
        };
        let head = chain::head(&self.client, &self.chain_targets(), chain).await?;
        Ok(head.is_some_and(|h| {
            h.record
                .is_some_and(|r| r.submitted_by.as_deref() == Some(key.name.as_str()))
        }))
    }

    /// A record as `GET …/tasks/{id}` answers it: a global task's shows its chain's state
    /// and tasks beside (`chain_state`, `chain_tasks`: queue, id, state, parent).
    pub(super) async fn record_answer(&self, rec: TaskRecord) -> Result<Value, ApiError> {
        let mut out = json!(rec);
        let Some(own) = chain::started_chain(&rec) else {
            return Ok(out);
        };
        let targets = self.chain_targets();
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
    /// (an id whose task is a follow-up in another chain is refused, 409).
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
        // (the refusals the enqueue would answer come first, as for any submit)
        for t in tasks.iter() {
            queue.check(t)?;
        }
        if queue.intake().await? == crate::config::Intake::Closed {
            return Err(QueueError::IntakeClosed {
                queue: queue.name().to_string(),
            }
            .into());
        }
        let chained = tasks.iter_mut().filter(|t| t.chain.is_some()).collect();
        chain::start_global(queue, chained)
            .await
            .map_err(chain_refusal)
    }

    /// Before a limited key's chain submit is checked: an id whose task or kept record
    /// another submitter's is refused (409, as its enqueue would refuse it), so the chain
    /// check that comes first does not tell this key what that task is (its chain, its
    /// state). The enqueue's own check stays the one
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
        // task of another chain (or none). Looked at again once, then only waited on, so
        // such a task does not spin this loop until the deadline.
        let mut seen_ended = std::collections::BTreeSet::new();
        let name = self.submitted_chain(queue, made, found.as_deref()).await?;
        let pin = name.as_str();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let view = self.run_chain(queue, key, &made.id, pin).await?;
            if view.state.is_end() {
                return Ok((StatusCode::OK, view.to_json()));
            }
            let watching = tokio::select! {
                w = self.ended.connected(left.min(WAIT_RECHECK)) => w,
                () = self.shutdown.cancelled() => false,
            };
            if tokio::time::Instant::now() >= deadline || self.shutdown.is_cancelled() {
                // (the wait for the subscription may have taken seconds: look once more)
                return self.chain_as_it_stands(queue, key, &made.id, pin).await;
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
                return self.chain_as_it_stands(queue, key, &made.id, pin).await;
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
            return self.chain_as_it_stands(queue, key, &made.id, pin).await;
        }
    }

    /// A chain wait's answer at its deadline (or a stop): the chain read once more, 200
    /// when it has ended, else 202.
    async fn chain_as_it_stands(
        &self,
        queue: &Queue,
        key: &ApiKey,
        id: &str,
        chain: &str,
    ) -> Answer {
        let view = self.run_chain(queue, key, id, chain).await?;
        let status = if view.state.is_end() {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        };
        Ok((status, view.to_json()))
    }

    /// The chain a submit made or found for its global task: the id its enqueue minted;
    /// for a dedup hit, the chain the task's record names, or (a task in no chain yet,
    /// submitted before without `chain`) the one its record number names, which its
    /// follow-ups will start.
    async fn submitted_chain(
        &self,
        queue: &Queue,
        made: &Enqueued,
        found: Option<&TaskRecord>,
    ) -> Result<String, ApiError> {
        if let Some(chain) = &made.chain {
            return Ok(chain.clone());
        }
        if let Some(chain) = found.and_then(chain::started_chain) {
            return Ok(chain.to_string());
        }
        match queue.record_seq(&made.id).await? {
            Some(seq) => Ok(chain::chain_id(queue.name(), seq)),
            None => Err(ApiError::not_found(format!(
                "task {} of queue {} has no record: its chain cannot be followed",
                made.id,
                queue.name()
            ))),
        }
    }

    /// The chain `chain` a submit of global task `id` made or found: its view, or until
    /// the task has made follow-ups (a task in no chain yet), the task alone as a chain of
    /// one. Once the task ended, its id may hold another task (`dedup = "active"`), whose
    /// record is not this chain's: 410.
    async fn run_chain(
        &self,
        queue: &Queue,
        key: &ApiKey,
        id: &str,
        chain: &str,
    ) -> Result<ChainView, ApiError> {
        let view = chain::read(&self.client, &self.chain_targets(), chain).await?;
        if let Some(view) = view.filter(|v| v.tasks.first().is_some_and(|t| t.record.is_some())) {
            return Ok(view);
        }
        let record = queue.record(id).await?;
        let number = chain::chain_origin(chain).map(|(_, seq)| seq);
        let this_one = match &record {
            Some(r) if r.chain.as_deref() == Some(chain) => true,
            Some(r) if r.chain.is_none() => {
                number.is_some() && queue.record_seq(id).await? == number
            }
            _ => false,
        };
        match record {
            Some(r) if this_one => Ok(ChainView::of_task(chain, r)),
            Some(r) if r.submitted_by.as_deref() != Some(key.name.as_str()) => {
                Err(replaced(queue, id))
            }
            Some(_) => Err(ApiError::gone(format!(
                "task {id} of queue {} ended and its id already holds another task; its chain \
                 {chain} is gone with its record",
                queue.name()
            ))),
            None => Err(ApiError::not_found(format!("no chain {chain}"))),
        }
    }
}
