//! Requests to answers: routing, the checks every request passes (token, queue, key's
//! rights, body size), and one function per endpoint.
//!
//! An `Endpoint` is parsed once from the path, its parts named, with its metric name and
//! methods; then the checks every request passes; then one function per endpoint.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::auth::{self, Keys};
use super::dead::DeadAction;
use super::ended::Ended;
use super::error::{ApiError, enqueue_failed};
use super::listings::Listings;
use super::outage::Outage;
use super::submit::{self, Submit};
use crate::cluster;
use crate::config::MAX_JSON_DEPTH;
use crate::config::{ApiKey, Config, Intake};
use crate::queue_client::{
    Enqueued, FreezeResult, ListQuery, MAX_LIST_LIMIT, Queue, QueueClient, QueueLimits,
    RecordState, TaskRecord, TaskState, json_deeper_than,
};

/// What `POST …/tasks/{id}/freeze|thaw` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Hold a waiting task where it is.
    Freeze,
    /// Put a frozen task back.
    Thaw,
}

/// JSON nesting a request body may have: a payload's levels plus the envelope.
pub(super) const MAX_BODY_DEPTH: usize = MAX_JSON_DEPTH + 3;
/// Records per page when a listing does not say.
const DEFAULT_LIST_LIMIT: usize = 100;
/// How often a waiting request looks at what it waits for even without a wake-up: the
/// subscription that wakes it can die without a word (a connection a NAT or a failover
/// dropped silently), and then only this read ends the wait before its deadline.
pub(super) const WAIT_RECHECK: Duration = Duration::from_secs(5);

/// The first pause before a sync submit's wait tries Redis again after it failed; the
/// pauses double up to [`WAIT_RETRY_CAP`].
const WAIT_RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between a failing wait's tries.
const WAIT_RETRY_CAP: Duration = Duration::from_secs(1);

/// What every request shares.
pub struct Api {
    pub(super) config: Config,
    pub(super) client: QueueClient,
    pub(super) queues: HashMap<String, Queue>,
    pub(super) keys: Keys,
    pub(super) ended: Arc<Ended>,
    /// The instance's spells without Redis (kept across configs).
    pub(super) outage: Arc<Outage>,
    pub(super) shutdown: CancellationToken,
    pub(super) metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// The listings under way by key (`[api].max_listings_per_key`).
    pub(super) listings: Arc<Listings>,
    /// The web console: its settings, and the instance's secret and failed logins.
    pub(super) console: super::console::Console,
}

/// An answer: status and JSON body.
pub(super) type Answer = Result<(StatusCode, serde_json::Value), ApiError>;

impl Api {
    /// Builds the shared state: one queue handle per configured queue, with its limits.
    pub fn new(
        config: Config,
        client: QueueClient,
        keys: Keys,
        ended: Arc<Ended>,
        outage: Arc<Outage>,
        shutdown: CancellationToken,
        console: Arc<super::console::Shared>,
    ) -> anyhow::Result<Api> {
        let queues = config
            .queues
            .values()
            .map(|q| {
                Ok((
                    q.name.clone(),
                    client.queue_with(&q.name, QueueLimits::from(q))?,
                ))
            })
            .collect::<Result<_, crate::queue_client::QueueError>>()?;
        Ok(Api {
            console: super::console::Console::new(&config.api, console),
            config,
            client,
            queues,
            keys,
            ended,
            outage,
            shutdown,
            metrics: crate::http::install_metrics(),
            listings: Arc::default(),
        })
    }

    /// Answers one request, counting it by route and status class.
    pub async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let started = Instant::now();
        let (route, answer) = self.route(request).await;
        let response = match answer {
            Ok(r) => {
                // Every route past the token but /metrics and /status reads Redis: a
                // success is Redis answering.
                // (nor does the console: its pages read nothing)
                let local = matches!(route, "metrics" | "status" | "healthz")
                    || route.starts_with("console_");
                if r.status().is_success() && !local {
                    self.outage.answered();
                }
                r
            }
            Err(e) => {
                if let Some(cause) = e.outage {
                    self.outage
                        .failed("a request could not reach redis", cause, &e.message);
                }
                let mut body = json!({ "error": e.message });
                if e.outcome_unknown {
                    body["outcome"] = json!("unknown");
                }
                let mut r = json_response(e.status, &body);
                if e.close {
                    // Saying so lets the client stop sending rather than meet a reset.
                    r.headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                r
            }
        };
        let class = match response.status().as_u16() {
            200..=299 => "2xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        metrics::counter!("gaffer_api_requests_total", "route" => route, "status" => class)
            .increment(1);
        metrics::histogram!("gaffer_api_request_seconds", "route" => route)
            .record(started.elapsed().as_secs_f64());
        response
    }

    async fn route(
        &self,
        request: Request<Incoming>,
    ) -> (&'static str, Result<Response<Full<Bytes>>, ApiError>) {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        if self.console.owns(&path) {
            let (route, answer) = super::console::serve(self, request).await;
            return (route, Ok(answer));
        }
        let segments: Vec<String> = path
            .trim_matches('/')
            .split('/')
            .map(|s| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .collect();
        let seg: Vec<&str> = segments.iter().map(String::as_str).collect();
        let Some(endpoint) = Endpoint::parse(&seg) else {
            return (
                "unknown",
                Err(ApiError::not_found(format!(
                    "no such endpoint {method} {path}"
                ))),
            );
        };
        let (route, allowed) = (endpoint.name(), endpoint.methods());
        // (HEAD is GET without the body, which hyper leaves out: load balancers ask it)
        let as_get = if method == Method::HEAD {
            Method::GET
        } else {
            method.clone()
        };
        if !allowed.contains(&as_get) {
            let mut e = json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                &json!({ "error": format!("{method} is not allowed on {path}: use {}", names(allowed)) }),
            );
            if let Ok(v) = HeaderValue::from_str(&names(allowed)) {
                e.headers_mut().insert(ALLOW, v);
            }
            return (route, Ok(e));
        }
        if let Endpoint::Healthz = endpoint {
            return (route, Ok(self.healthz().await));
        }
        // (a bearer token, or a console's session or proxy user: console/mod.rs)
        let key = match super::console::authenticate(self, &request) {
            Ok(k) => k.clone(),
            Err(e) => return (route, Err(e)),
        };
        crate::http::authenticated(&request);
        if let Endpoint::Metrics = endpoint {
            return (route, Ok(self.render_metrics()));
        }
        if let Endpoint::Status = endpoint {
            return (route, Ok(json_response(StatusCode::OK, &self.status())));
        }
        let answer = self.dispatch(endpoint, &as_get, &key, request).await;
        let answer = answer.map_err(|e| e.seen_by(&key));
        (
            route,
            answer.map(|(status, body)| {
                if status == StatusCode::NO_CONTENT {
                    // (a 204 has no body, not even JSON's null)
                    let mut r = Response::new(Full::new(Bytes::new()));
                    *r.status_mut() = status;
                    r
                } else {
                    json_response(status, &body)
                }
            }),
        )
    }

    async fn dispatch(
        &self,
        endpoint: Endpoint<'_>,
        method: &Method,
        key: &ApiKey,
        request: Request<Incoming>,
    ) -> Answer {
        match endpoint {
            // (answered before the key is asked for)
            Endpoint::Healthz | Endpoint::Metrics | Endpoint::Status => {
                Err(ApiError::not_found("no such endpoint"))
            }
            Endpoint::Queues => self.queues_stats(key).await,
            Endpoint::Tasks { queue: q } => {
                let queue = self.queue(q, key)?;
                if *method == Method::POST {
                    let body = self.body(request).await?;
                    self.submit(queue, key, &body).await
                } else {
                    self.list(queue, key, request.uri().query()).await
                }
            }
            Endpoint::Task { queue: q, id } => {
                self.task(self.queue(q, key)?, key, id, method).await
            }
            Endpoint::Hold { queue: q, id, op } => {
                let queue = self.queue(q, key)?;
                if key.admin && !queue.limits().track {
                    return self.untracked_hold(queue, key, id, op).await;
                }
                self.freeze(queue, key, id, op).await
            }
            Endpoint::QueueAdmin { queue: q, action } => {
                auth::check_admin(key)?;
                let queue = self.queue(q, key)?;
                match action {
                    "intake" => {
                        let body = self.body(request).await?;
                        self.set_intake(queue, &body).await
                    }
                    _ => self.pause(q, action == "pause").await,
                }
            }
            Endpoint::HostAdmin { host, drain } => {
                auth::check_admin(key)?;
                self.drain(host, drain).await
            }
            Endpoint::SystemAdmin { system, action } => {
                auth::check_admin(key)?;
                self.switch_system(system, action).await
            }
            Endpoint::Chain { id } => self.chain(key, id, request.uri().query()).await,
            Endpoint::Schedules if *method == Method::POST => {
                let body = self.body(request).await?;
                self.create_schedule(key, &body).await
            }
            Endpoint::Schedules => self.list_schedules(key).await,
            Endpoint::Schedule { name } if *method == Method::DELETE => {
                self.delete_schedule(key, name).await
            }
            Endpoint::Schedule { name } => self.get_schedule(key, name).await,
            Endpoint::Cluster => self.cluster(key).await,
            Endpoint::Queue { queue: q } => self.queue_detail(self.queue(q, key)?, key).await,
            Endpoint::Search { id } => self.search(key, id).await,
            Endpoint::Dead { queue: q } => self.dead_letters(q, key, request.uri().query()).await,
            Endpoint::DeadMove { queue: q, action } => {
                self.move_dead(q, key, action, request).await
            }
            Endpoint::Retry { queue: q, id } => self.retry(self.queue(q, key)?, key, id).await,
            Endpoint::Payload { queue: q, id } => self.payload(self.queue(q, key)?, key, id).await,
        }
    }

    /// The request's body, within `[api].max_body` and `read_timeout`.
    async fn body(&self, request: Request<Incoming>) -> Result<Bytes, ApiError> {
        let api = &self.config.api;
        read_body(request, api.max_body, api.read_timeout).await
    }

    /// `GET` (the record) or `DELETE` (cancel) of task `id`; on a queue without records,
    /// for admin keys, what the queue itself holds.
    async fn task(&self, queue: &Queue, key: &ApiKey, id: &str, method: &Method) -> Answer {
        if key.admin && !queue.limits().track {
            return self.untracked_task(queue, key, id, method).await;
        }
        if *method == Method::DELETE {
            self.cancel(queue, key, id).await
        } else {
            let rec = self.own_record(queue, key, id).await?;
            Ok((StatusCode::OK, self.record_answer(rec).await?))
        }
    }

    /// A configured queue the key may use. The key's rights are checked first: a queue
    /// outside a limited key's list answers 403 whether it exists or not, so no key
    /// learns the names of queues it may not use; only a key that may use every queue
    /// (admin, or `["*"]`, which `GET /v1/queues` shows every queue anyway) learns that a
    /// queue is unknown.
    pub(super) fn queue(&self, name: &str, key: &ApiKey) -> Result<&Queue, ApiError> {
        auth::check_queue(key, name)?;
        self.queues
            .get(name)
            .ok_or_else(|| ApiError::not_found(format!("unknown queue {name}")))
    }

    async fn healthz(&self) -> Response<Full<Bytes>> {
        let mut conn = self.client.connection();
        let ping = tokio::time::timeout(
            Duration::from_secs(2),
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await;
        let (cause, error) = match ping {
            Ok(Ok(_)) => {
                self.outage.answered();
                return json_response(StatusCode::OK, &json!({ "status": "ok" }));
            }
            Ok(Err(e)) => (
                crate::queue_client::Cause::of_redis(&e),
                format!("redis unreachable: {e}"),
            ),
            Err(_) => (
                crate::queue_client::Cause::TimedOut,
                "redis unreachable: no answer within 2s".to_string(),
            ),
        };
        self.outage
            .failed("the health check could not reach redis", cause, &error);
        json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({ "error": error }))
    }

    /// What `stats --json` shows under "queues", for the queues the key may use (read
    /// alone: neither the other queues nor the retired ones).
    async fn queues_stats(&self, key: &ApiKey) -> Answer {
        let allows = |q: &str| key.allows(q);
        let scope = cluster::snapshot::Scope::Only(&allows);
        let snap = cluster::snapshot::read_scoped(&self.client, &self.config, scope).await?;
        let mut doc = cluster::snapshot::stats_json(&snap);
        let mut queues = doc["queues"].take();
        if let Some(map) = queues.as_object_mut() {
            map.retain(|name, _| key.allows(name));
        }
        Ok((StatusCode::OK, queues))
    }

    async fn submit(&self, queue: &Queue, key: &ApiKey, body: &[u8]) -> Answer {
        if json_deeper_than(body, MAX_BODY_DEPTH) {
            return Err(ApiError::bad_request(format!(
                "body nested deeper than {MAX_BODY_DEPTH} levels (a payload may nest {MAX_JSON_DEPTH})"
            )));
        }
        let mut parsed = submit::parse(body, &key.name, self.config.api.max_wait)?;
        if let Some(cfg) = self.config.queues.get(queue.name()) {
            submit::check_timeouts(parsed.tasks_mut(), cfg)?;
        }
        if !key.admin {
            // (keys that share a queue do not share its ids: see `NewTask::own_id`)
            parsed.tasks_mut().iter_mut().for_each(|t| t.own_id = true);
            self.refuse_held_chain_ids(queue, key, parsed.tasks_mut())
                .await?;
        }
        self.start_chains(queue, &mut parsed).await?;
        match parsed {
            Submit::One {
                task,
                wait: Some(wait),
            } if task.chain.is_some() => {
                let made = queue.enqueue(task).await.map_err(enqueue_failed)?;
                match self.submit_chain_and_wait(queue, key, &made, wait).await {
                    // (the task exists: see the single submit's wait below)
                    Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => Ok((
                        StatusCode::ACCEPTED,
                        accepted(queue, &made, Err(e.clone()), Some(&e)),
                    )),
                    // (the task exists: the answer names it, as the single wait's does)
                    Err(e) => {
                        let e = e.seen_by(key);
                        Ok((e.status, json!({"error": e.message, "id": made.id})))
                    }
                    answer => answer,
                }
            }
            Submit::Bulk(tasks) => {
                let made = queue.enqueue_many(&tasks).await.map_err(enqueue_failed)?;
                // The dedup hits' states, read in a few calls: one call each made a resent
                // bulk of 10,000 tasks 10,000 round trips in turn. (The tasks exist: a
                // failure now answers their ids with a null state, never a 503.)
                let hits: Vec<&str> = made
                    .iter()
                    .filter(|m| m.state.is_none())
                    .map(|m| m.id.as_str())
                    .collect();
                let found = queue.glance_many(&hits).await.map_err(ApiError::from);
                let mut glances = found.as_ref().ok().into_iter().flatten();
                let out: Vec<_> = made
                    .iter()
                    .map(|m| {
                        let state = match (m.state, &found) {
                            (Some(s), _) => Ok(s),
                            (None, Ok(_)) => {
                                Ok(glances.next().map_or(RecordState::Waiting, |g| g.state()))
                            }
                            (None, Err(e)) => Err(e.clone()),
                        };
                        accepted(queue, m, state, None)
                    })
                    .collect();
                Ok((StatusCode::ACCEPTED, json!({ "tasks": out })))
            }
            Submit::One { task, wait } => {
                if wait.is_some() && !queue.limits().track {
                    // Refused before anything is enqueued: there is no end to wait for.
                    return Err(ApiError::bad_request(format!(
                        "wait needs a record to follow, and queue {} keeps none (track = false)",
                        queue.name()
                    )));
                }
                let by = task.submitted_by.clone();
                let made = queue.enqueue(task).await.map_err(enqueue_failed)?;
                // From here the task exists: whatever fails now, the answer is 202 with
                // its id, so a client never retries a submit that was done.
                if let Some(wait) = wait {
                    return Ok(self.wait_after_submit(queue, key, &made, by, wait).await);
                }
                let state = match made.state {
                    Some(s) => Ok(s),
                    None => self.state_of(queue, &made.id).await,
                };
                Ok((StatusCode::ACCEPTED, accepted(queue, &made, state, None)))
            }
        }
    }

    /// A sync submit's wait, once its task is enqueued: its record at the end, or when
    /// the wait ran out. Redis failing meanwhile does not end the wait before its
    /// deadline (a restart or a failover often takes less); one that fails to the end
    /// answers 202 with the id and says what failed (`wait_error`), never 503, since the
    /// task exists.
    async fn wait_after_submit(
        &self,
        queue: &Queue,
        key: &ApiKey,
        made: &Enqueued,
        by: Option<String>,
        wait: Duration,
    ) -> (StatusCode, serde_json::Value) {
        let deadline = tokio::time::Instant::now() + wait;
        let mut backoff = crate::backoff::Backoff::new(WAIT_RETRY_FIRST, WAIT_RETRY_CAP);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let e = match self.wait_once(queue, key, made, by.clone(), left).await {
                Ok(answer) => return answer,
                Err(e) => e,
            };
            let pause = backoff.next();
            let unavailable = e.status == StatusCode::SERVICE_UNAVAILABLE;
            if unavailable
                && tokio::time::Instant::now() + pause < deadline
                && !self.shutdown.is_cancelled()
            {
                tokio::select! {
                    () = tokio::time::sleep(pause) => continue,
                    () = self.shutdown.cancelled() => {}
                }
            }
            if unavailable {
                let answer = accepted(queue, made, Err(e.clone()), Some(&e));
                return (StatusCode::ACCEPTED, answer);
            }
            // (a 404 or 410 says what became of the task: more than a bare 202 would)
            let e = e.seen_by(key);
            return (e.status, json!({"error": e.message, "id": made.id}));
        }
    }

    /// One try of [`Api::wait_after_submit`], waiting at most `wait`.
    async fn wait_once(
        &self,
        queue: &Queue,
        key: &ApiKey,
        made: &Enqueued,
        by: Option<String>,
        wait: Duration,
    ) -> Answer {
        let found = match self.dedup_hit_of_another(queue, key, made).await? {
            DedupHit::Another(answer) => return Ok(answer),
            DedupHit::Own(found) => found,
        };
        // (the submitter the wait keeps to: the caller's, or the one the check above
        // found, so the id holding another key's task since is seen)
        let owner = match made.created {
            true => Some(by),
            false => found.map(|r| r.submitted_by),
        };
        let (ended, rec) = self.wait_end(queue, &made.id, wait, owner).await?;
        let status = if ended {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        };
        Ok((status, json!(rec)))
    }

    /// A sync submit that found another key's task under its id is answered as a submit
    /// without `wait` is (the id, the task's state, `created: false`), not with that
    /// task's record, result or chain, which this key may not see. Otherwise the record
    /// found (none when the submit made the task, or there is none), for the wait to keep
    /// to that task.
    pub(super) async fn dedup_hit_of_another(
        &self,
        queue: &Queue,
        key: &ApiKey,
        made: &Enqueued,
    ) -> Result<DedupHit, ApiError> {
        if made.created {
            return Ok(DedupHit::Own(None));
        }
        let Some(rec) = queue.record(&made.id).await? else {
            return Ok(DedupHit::Own(None));
        };
        if self.owns(key, &rec).await? {
            return Ok(DedupHit::Own(Some(Box::new(rec))));
        }
        Ok(DedupHit::Another((
            StatusCode::ACCEPTED,
            json!({"id": made.id, "queue": queue.name(), "state": rec.state, "created": false}),
        )))
    }

    /// The state of an existing task: its record's, or for an untracked queue where the
    /// queue has it.
    async fn state_of(&self, queue: &Queue, id: &str) -> Result<RecordState, ApiError> {
        if let Some(rec) = queue.record(id).await? {
            return Ok(rec.state);
        }
        Ok(match queue.find(id).await?.map(|i| i.state) {
            Some(TaskState::Leased) => RecordState::Running,
            Some(TaskState::Dead) => RecordState::Failed,
            Some(TaskState::Frozen) => RecordState::Frozen,
            Some(TaskState::Cancelling) => RecordState::Cancelling,
            _ => RecordState::Waiting,
        })
    }

    /// Holds the request until the task ends or `wait` passes; true when it ended.
    /// `owner`: the task's submitter, when known (`Some(None)`: none). It
    /// sleeps until the task's end is published (see `ended`), looking again every
    /// [`WAIT_RECHECK`] besides, and so without the subscription (lost, or refused by an
    /// ACL).
    async fn wait_end(
        &self,
        queue: &Queue,
        id: &str,
        wait: Duration,
        mut owner: Option<Option<String>>,
    ) -> Result<(bool, TaskRecord), ApiError> {
        let deadline = tokio::time::Instant::now() + wait;
        // The submitter of the task waited on: `owner` when the caller made it, else the
        // first record read's. Under `dedup = "active"` its id may hold another key's task
        // once it ended, whose record this request must not answer with.
        let mine = |rec: TaskRecord, owner: &mut Option<Option<String>>| {
            let first = owner.get_or_insert_with(|| rec.submitted_by.clone());
            if *first == rec.submitted_by {
                Ok(rec)
            } else {
                Err(replaced(queue, id))
            }
        };
        loop {
            let mut registration = self.ended.register(queue.name(), id);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // Without the subscription an end could pass unseen: wait for it first, a
            // while (not past a stop, which answers every waiting request at once).
            let watching = tokio::select! {
                w = self.ended.connected(left.min(WAIT_RECHECK)) => w,
                () = self.shutdown.cancelled() => false,
            };
            let rec = if watching {
                queue.watch(id).await?
            } else {
                queue.record(id).await?
            };
            let rec = rec.ok_or_else(|| lost_record(queue, id))?;
            let rec = mine(rec, &mut owner)?;
            if rec.state.is_end() {
                return Ok((true, rec));
            }
            if tokio::time::Instant::now() >= deadline || self.shutdown.is_cancelled() {
                return Ok((false, rec));
            }
            if !watching {
                // (the wait for the subscription was the pause before the next look)
                continue;
            }
            tokio::select! {
                _ = &mut registration.woken => continue,
                () = tokio::time::sleep(WAIT_RECHECK) => continue,
                () = tokio::time::sleep_until(deadline) => {}
                () = self.shutdown.cancelled() => {}
            }
            let rec = match queue.record(id).await? {
                Some(now) => mine(now, &mut owner)?,
                None => rec,
            };
            return Ok((rec.state.is_end(), rec));
        }
    }

    async fn list(&self, queue: &Queue, key: &ApiKey, query: Option<&str>) -> Answer {
        let mut q = ListQuery {
            limit: DEFAULT_LIST_LIMIT,
            ..Default::default()
        };
        for (name, value) in query_pairs(query.unwrap_or(""))? {
            match name.as_str() {
                "state" => {
                    q.state = Some(RecordState::parse(&value).ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "unknown state {value:?}: expected one of {}",
                            RecordState::ALL.map(RecordState::as_str).join(", ")
                        ))
                    })?)
                }
                "limit" => q.limit = super::listings::parse_limit(&value, MAX_LIST_LIMIT)?,
                "cursor" => q.cursor = Some(value),
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter {other:?}: expected state, limit or cursor"
                    )));
                }
            }
        }
        if !key.admin {
            q.submitted_by = Some(key.name.clone());
        }
        let _listing = self
            .listings
            .start(&key.name, self.config.api.max_listings_per_key)?;
        let page = queue.list(&q).await?;
        Ok((StatusCode::OK, json!(page)))
    }

    /// The task's record, if the key may see it: a non-admin key sees only what it
    /// submitted, and anything else is as unknown to it as a task that never was.
    pub(super) async fn own_record(
        &self,
        queue: &Queue,
        key: &ApiKey,
        id: &str,
    ) -> Result<TaskRecord, ApiError> {
        let unknown = || ApiError::not_found(format!("no task {id} in queue {}", queue.name()));
        let rec = queue.record(id).await?.ok_or_else(unknown)?;
        if !self.owns(key, &rec).await? {
            return Err(unknown());
        }
        Ok(rec)
    }

    async fn cancel(&self, queue: &Queue, key: &ApiKey, id: &str) -> Answer {
        let rec = self.own_record(queue, key, id).await?;
        if !rec.state.is_end() {
            // (the task whose record was checked: not one another key submitted under its
            // id meanwhile)
            let owner = rec.submitted_by.as_deref().unwrap_or_default();
            queue
                .cancel_owned(id, &format!("cancelled by key {}", key.name), owner)
                .await?;
        }
        // An ended task stays as it ended: the record tells the caller it was too late.
        match queue.record(id).await? {
            Some(now) if now.submitted_by != rec.submitted_by => Err(replaced(queue, id)),
            now => Ok((StatusCode::OK, json!(now.unwrap_or(rec)))),
        }
    }

    /// A task of a queue that keeps no records (`track = false`), for an admin key (no
    /// record names a submitter, so no other key may see it): what the queue holds of it,
    /// `{id, queue, state}`; DELETE cancels it.
    async fn untracked_task(
        &self,
        queue: &Queue,
        key: &ApiKey,
        id: &str,
        method: &Method,
    ) -> Answer {
        let unknown = || ApiError::not_found(format!("no task {id} in queue {}", queue.name()));
        let state = if *method == Method::DELETE {
            let note = format!("cancelled by key {}", key.name);
            match queue
                .cancel_unended(id, &note)
                .await?
                .ok_or_else(unknown)?
                .state
            {
                TaskState::Cancelling => RecordState::Cancelling,
                // (a dead letter failed: it stays as it ended)
                TaskState::Dead => RecordState::Failed,
                _ => RecordState::Cancelled,
            }
        } else {
            queue.find(id).await?.ok_or_else(unknown)?;
            self.state_of(queue, id).await?
        };
        Ok((
            StatusCode::OK,
            json!({"id": id, "queue": queue.name(), "state": state}),
        ))
    }

    /// Freeze or thaw of a task of an untracked queue, for an admin key (see
    /// [`Api::untracked_task`]).
    async fn untracked_hold(&self, queue: &Queue, key: &ApiKey, id: &str, op: Hold) -> Answer {
        let (verb, after) = match op {
            Hold::Freeze => ("frozen", RecordState::Frozen),
            Hold::Thaw => ("thawed", RecordState::Waiting),
        };
        let note = format!("{verb} by key {}", key.name);
        let result = match op {
            Hold::Freeze => queue.freeze(id, &note).await?,
            Hold::Thaw => queue.thaw(id, &note).await?,
        };
        match result {
            FreezeResult::Done => Ok((
                StatusCode::OK,
                json!({"id": id, "queue": queue.name(), "state": after}),
            )),
            FreezeResult::NotApplicable => Err(ApiError::conflict(format!(
                "task {id} is {}: only a waiting task can be frozen, and only a frozen one thawed",
                self.state_of(queue, id).await?
            ))),
            FreezeResult::Unknown => Err(ApiError::not_found(format!(
                "no task {id} in queue {}",
                queue.name()
            ))),
        }
    }

    async fn freeze(&self, queue: &Queue, key: &ApiKey, id: &str, op: Hold) -> Answer {
        let rec = self.own_record(queue, key, id).await?;
        let owner = rec.submitted_by.as_deref().unwrap_or_default();
        let (freeze, verb) = match op {
            Hold::Freeze => (true, "frozen"),
            Hold::Thaw => (false, "thawed"),
        };
        let note = format!("{verb} by key {}", key.name);
        let result = queue.hold_owned(id, freeze, &note, owner).await?;
        match result {
            FreezeResult::Done => {
                let rec = queue.record(id).await?.unwrap_or(rec);
                Ok((StatusCode::OK, json!(rec)))
            }
            FreezeResult::Unknown | FreezeResult::NotApplicable => {
                // The state as it is now, which the one checked may no longer be; and a
                // task submitted under the id by another key since is none of its own.
                match queue.record(id).await? {
                    Some(now) if now.submitted_by == rec.submitted_by => {
                        Err(ApiError::conflict(format!(
                            "task {id} is {}: only a waiting task can be frozen, and only a frozen one thawed",
                            now.state
                        )))
                    }
                    _ => Err(ApiError::not_found(format!(
                        "no task {id} in queue {}",
                        queue.name()
                    ))),
                }
            }
        }
    }

    async fn set_intake(&self, queue: &Queue, body: &[u8]) -> Answer {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Body {
            intake: Option<String>,
        }
        let b: Body = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("bad intake request: {e}")))?;
        let intake = b
            .intake
            .map(|s| {
                Intake::parse(&s).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "unknown intake {s:?}: expected one of {} (or null for the config's)",
                        Intake::NAMES.join(", ")
                    ))
                })
            })
            .transpose()?;
        queue.set_intake(intake).await?;
        let now = queue.intake().await?;
        Ok((
            StatusCode::OK,
            json!({"queue": queue.name(), "intake": now.as_str(), "switched": intake.is_some()}),
        ))
    }

    async fn pause(&self, queue: &str, paused: bool) -> Answer {
        let keys = cluster::Keys::new(&self.config.cluster.namespace);
        cluster::set_paused(&mut self.client.connection(), &keys, queue, paused).await?;
        Ok((StatusCode::OK, json!({"queue": queue, "paused": paused})))
    }

    /// `POST /v1/systems/{system}/pause|resume|disable|enable`: the run-time switch, with
    /// what it did (tasks cancelled by a disable, records noted by a pause).
    async fn switch_system(&self, system: &str, action: &str) -> Answer {
        use crate::queue_client::{SystemError, SystemState};
        let state = match action {
            "pause" => SystemState::Paused,
            "disable" => SystemState::Disabled,
            _ => SystemState::Active,
        };
        match self.client.set_system(&self.config, system, state).await {
            Ok(change) => Ok((StatusCode::OK, json!(change))),
            Err(SystemError::Unknown(_)) => {
                Err(ApiError::not_found(format!("unknown system {system}")))
            }
            Err(SystemError::Queue(e)) => Err(e.into()),
        }
    }

    async fn drain(&self, host: &str, draining: bool) -> Answer {
        let keys = cluster::Keys::new(&self.config.cluster.namespace);
        cluster::set_draining(&mut self.client.connection(), &keys, host, draining).await?;
        Ok((StatusCode::OK, json!({"host": host, "draining": draining})))
    }

    /// `/status`: the instance's own state, behind a token like `/metrics`: the Redis node
    /// it talks to and the failovers it followed (read from the client, no call to Redis).
    pub(super) fn status(&self) -> serde_json::Value {
        json!({ "redis": self.client.redis_node() })
    }

    /// `/metrics`: Prometheus text, behind a token like everything but `/healthz`.
    pub(super) fn render_metrics(&self) -> Response<Full<Bytes>> {
        self.metrics.run_upkeep();
        let mut r = Response::new(Full::new(Bytes::from(self.metrics.render())));
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        r
    }
}

/// The route a path belongs to and the methods it answers.
/// An endpoint of the api, parsed once from its path's (decoded) segments: the one place
/// that knows the paths, each endpoint's parts named for the handler that answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint<'a> {
    /// `GET /healthz`, without a key.
    Healthz,
    /// `GET /metrics`.
    Metrics,
    /// `GET /status`.
    Status,
    /// `GET /v1/queues`.
    Queues,
    /// `GET|POST /v1/queues/Q/tasks`: a listing, or a submit.
    Tasks { queue: &'a str },
    /// `GET|DELETE /v1/queues/Q/tasks/ID`: a record, or a cancel.
    Task { queue: &'a str, id: &'a str },
    /// `POST /v1/queues/Q/tasks/ID/freeze|thaw`.
    Hold {
        queue: &'a str,
        id: &'a str,
        op: Hold,
    },
    /// `POST /v1/queues/Q/pause|resume|intake` (admin).
    QueueAdmin { queue: &'a str, action: &'a str },
    /// `POST /v1/hosts/H/drain|undrain` (admin).
    HostAdmin { host: &'a str, drain: bool },
    /// `POST /v1/systems/S/pause|resume|disable|enable` (admin).
    SystemAdmin { system: &'a str, action: &'a str },
    /// `GET /v1/chains/ID`.
    Chain { id: &'a str },
    /// `GET|POST /v1/schedules`: a listing, or a new stored schedule.
    Schedules,
    /// `GET|DELETE /v1/schedules/NAME`.
    Schedule { name: &'a str },
    /// `GET /v1/cluster`: the stats document, cut to what the key may see.
    Cluster,
    /// `GET /v1/queues/Q`: one queue's figures and config.
    Queue { queue: &'a str },
    /// `GET /v1/tasks/ID`: the queues holding a task under the id.
    Search { id: &'a str },
    /// `GET /v1/queues/Q/dead` (admin).
    Dead { queue: &'a str },
    /// `POST /v1/queues/Q/dead/requeue|purge` (admin).
    DeadMove { queue: &'a str, action: DeadAction },
    /// `POST /v1/queues/Q/tasks/ID/retry`.
    Retry { queue: &'a str, id: &'a str },
    /// `GET /v1/queues/Q/tasks/ID/payload`.
    Payload { queue: &'a str, id: &'a str },
}

impl<'a> Endpoint<'a> {
    /// The endpoint `seg` names, if any.
    fn parse(seg: &[&'a str]) -> Option<Self> {
        Some(match *seg {
            ["healthz"] => Endpoint::Healthz,
            ["metrics"] => Endpoint::Metrics,
            ["status"] => Endpoint::Status,
            ["v1", "queues"] => Endpoint::Queues,
            ["v1", "queues", queue, "tasks"] => Endpoint::Tasks { queue },
            ["v1", "queues", queue, "tasks", id] => Endpoint::Task { queue, id },
            [
                "v1",
                "queues",
                queue,
                "tasks",
                id,
                action @ ("freeze" | "thaw"),
            ] => {
                let op = if action == "freeze" {
                    Hold::Freeze
                } else {
                    Hold::Thaw
                };
                Endpoint::Hold { queue, id, op }
            }
            [
                "v1",
                "queues",
                queue,
                action @ ("pause" | "resume" | "intake"),
            ] => Endpoint::QueueAdmin { queue, action },
            ["v1", "hosts", host, action @ ("drain" | "undrain")] => Endpoint::HostAdmin {
                host,
                drain: action == "drain",
            },
            [
                "v1",
                "systems",
                system,
                action @ ("pause" | "resume" | "disable" | "enable"),
            ] => Endpoint::SystemAdmin { system, action },
            ["v1", "chains", id] => Endpoint::Chain { id },
            ["v1", "schedules"] => Endpoint::Schedules,
            ["v1", "schedules", name] => Endpoint::Schedule { name },
            ["v1", "cluster"] => Endpoint::Cluster,
            ["v1", "queues", queue] => Endpoint::Queue { queue },
            ["v1", "tasks", id] => Endpoint::Search { id },
            ["v1", "queues", queue, "dead"] => Endpoint::Dead { queue },
            ["v1", "queues", queue, "dead", action] => Endpoint::DeadMove {
                queue,
                action: DeadAction::parse(action)?,
            },
            ["v1", "queues", queue, "tasks", id, "retry"] => Endpoint::Retry { queue, id },
            ["v1", "queues", queue, "tasks", id, "payload"] => Endpoint::Payload { queue, id },
            _ => return None,
        })
    }

    /// Its name, as the request metrics' `route` label says it.
    fn name(&self) -> &'static str {
        match self {
            Endpoint::Healthz => "healthz",
            Endpoint::Metrics => "metrics",
            Endpoint::Status => "status",
            Endpoint::Queues => "queues",
            Endpoint::Tasks { .. } => "tasks",
            Endpoint::Task { .. } => "task",
            Endpoint::Hold { .. } => "freeze",
            Endpoint::QueueAdmin { .. } => "queue_admin",
            Endpoint::HostAdmin { .. } => "host_admin",
            Endpoint::SystemAdmin { .. } => "system_admin",
            Endpoint::Chain { .. } => "chain",
            Endpoint::Schedules => "schedules",
            Endpoint::Schedule { .. } => "schedule",
            Endpoint::Cluster => "cluster",
            Endpoint::Queue { .. } => "queue",
            Endpoint::Search { .. } => "search",
            Endpoint::Dead { .. } => "dead",
            Endpoint::DeadMove { .. } => "dead_move",
            Endpoint::Retry { .. } => "retry",
            Endpoint::Payload { .. } => "payload",
        }
    }

    /// The methods it answers (HEAD too wherever GET is).
    fn methods(&self) -> &'static [Method] {
        const GET: &[Method] = &[Method::GET];
        const POST: &[Method] = &[Method::POST];
        match self {
            Endpoint::Healthz
            | Endpoint::Metrics
            | Endpoint::Status
            | Endpoint::Queues
            | Endpoint::Chain { .. }
            | Endpoint::Cluster
            | Endpoint::Queue { .. }
            | Endpoint::Search { .. }
            | Endpoint::Dead { .. }
            | Endpoint::Payload { .. } => GET,
            Endpoint::Tasks { .. } => &[Method::GET, Method::POST],
            Endpoint::Task { .. } | Endpoint::Schedule { .. } => &[Method::GET, Method::DELETE],
            Endpoint::Schedules => &[Method::GET, Method::POST],
            Endpoint::Hold { .. }
            | Endpoint::QueueAdmin { .. }
            | Endpoint::HostAdmin { .. }
            | Endpoint::SystemAdmin { .. }
            | Endpoint::DeadMove { .. }
            | Endpoint::Retry { .. } => POST,
        }
    }
}

fn names(methods: &[Method]) -> String {
    let mut names: Vec<&str> = Vec::with_capacity(methods.len() + 1);
    for m in methods {
        names.push(m.as_str());
        if *m == Method::GET {
            names.push(Method::HEAD.as_str());
        }
    }
    names.join(", ")
}

/// The most of an over-limit body read (and dropped) before the 413 is answered: a client
/// that sends its whole body before it reads (most HTTP libraries without
/// `Expect: 100-continue`) would otherwise meet a connection reset, which discards the
/// answer, instead of the 413. Past it, the answer goes at once.
const MAX_DISCARD: u64 = 64 << 20;

/// Reads a body up to `limit` bytes; a declared or actual length past it is refused before
/// anything is parsed. An over-limit body is read to its end and dropped (up to
/// [`MAX_DISCARD`], within `timeout`) before the refusal, unless the client waits for
/// `100 Continue` and so has sent nothing yet.
pub(super) async fn read_body(
    request: Request<Incoming>,
    limit: u64,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::too_large(format!(
            "request body exceeds the limit of {} ([api].max_body)",
            bytesize::ByteSize(limit)
        ))
        .closing()
    };
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let expects_continue = request
        .headers()
        .get(hyper::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if let Some(n) = declared.filter(|&n| n > limit) {
        // (without a 100 Continue the body is not sent; a body larger than what is worth
        // reading to say no to is cut off as before)
        if !expects_continue && n <= MAX_DISCARD {
            let _ = tokio::time::timeout(timeout, discard(request.into_body())).await;
        }
        return Err(too_large());
    }
    let mut body = request.into_body();
    let mut kept = Vec::new();
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            if (kept.len() + data.len()) as u64 > limit {
                discard(body).await;
                return Ok::<_, hyper::Error>(false);
            }
            kept.extend_from_slice(&data);
        }
        Ok(true)
    };
    // (a client that trickles it would hold a connection and a buffer)
    match tokio::time::timeout(timeout, read).await {
        Err(_) => Err(ApiError::request_timeout(format!(
            "the request body did not arrive within {} ([api].read_timeout)",
            humantime::format_duration(timeout)
        ))
        .closing()),
        Ok(Ok(true)) => Ok(Bytes::from(kept)),
        Ok(Ok(false)) => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::bad_request(format!("reading the body: {e}")).closing()),
    }
}

/// Reads and drops what is left of a body, up to [`MAX_DISCARD`] bytes.
async fn discard(mut body: Incoming) {
    let mut dropped = 0u64;
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(data) = frame.data_ref() {
            dropped += data.len() as u64;
            if dropped > MAX_DISCARD {
                return;
            }
        }
    }
}

/// `a=1&b=x%20y` as decoded pairs; a name given twice is refused, since which of its
/// values counts would be a guess.
pub(super) fn query_pairs(query: &str) -> Result<Vec<(String, String)>, ApiError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        let (k, v) = (decode(k), decode(v));
        if pairs.iter().any(|(seen, _)| *seen == k) {
            return Err(ApiError::bad_request(format!(
                "query parameter {k:?} given more than once: give each at most once"
            )));
        }
        pairs.push((k, v));
    }
    Ok(pairs)
}

/// The answer to a submit that enqueued (or found) its task: its id and state. A state
/// Redis could not be asked for is `null`, with why in `state_error`; a sync submit's wait
/// that failed says why in `wait_error`.
fn accepted(
    queue: &Queue,
    made: &Enqueued,
    state: Result<RecordState, ApiError>,
    wait_error: Option<&ApiError>,
) -> serde_json::Value {
    let mut answer = json!({"id": made.id, "queue": queue.name(), "created": made.created});
    if let Some(chain) = &made.chain {
        // (the chain a created task starts: a found one's record names it)
        answer["chain"] = json!(chain);
    }
    match state {
        Ok(s) => answer["state"] = json!(s),
        Err(e) => {
            answer["state"] = serde_json::Value::Null;
            if wait_error.is_none() {
                answer["state_error"] = json!(e.message);
            }
        }
    }
    if let Some(e) = wait_error {
        answer["wait_error"] = json!(e.message);
    }
    answer
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The answer for a task that ended while a request followed it and whose id already
/// holds another key's task (`dedup = "active"`): its record is gone.
/// What a sync submit's check of a dedup hit found (see `Api::dedup_hit_of_another`).
pub(super) enum DedupHit {
    /// Another key's task: the answer.
    Another((StatusCode, serde_json::Value)),
    /// The caller's own task, or one it made: its record as read, if the submit did not
    /// make it.
    Own(Option<Box<TaskRecord>>),
}

/// The answer for a wait whose task's record is not there: on a queue that keeps records,
/// Redis lost it while the request waited.
pub(super) fn lost_record(queue: &Queue, id: &str) -> ApiError {
    if queue.limits().track {
        ApiError::not_found(format!(
            "task {id} of queue {} has no record any more: redis lost it while the request waited \
             (restarted without its data, or failed over to a replica that lacked it); submit it again",
            queue.name()
        ))
    } else {
        ApiError::not_found(format!(
            "task {id} of queue {} keeps no record to wait on (track = false)",
            queue.name()
        ))
    }
}

pub(super) fn replaced(queue: &Queue, id: &str) -> ApiError {
    ApiError::gone(format!(
        "task {id} of queue {} ended and its id already holds a new task another key submitted: its record is gone",
        queue.name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_parsed_once_with_their_parts() {
        let parse = |path: &'static str| {
            let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
            Endpoint::parse(&seg)
        };
        assert_eq!(
            parse("/v1/queues/q/tasks"),
            Some(Endpoint::Tasks { queue: "q" })
        );
        assert_eq!(
            parse("/v1/queues/q/tasks/x/thaw"),
            Some(Endpoint::Hold {
                queue: "q",
                id: "x",
                op: Hold::Thaw
            })
        );
        assert_eq!(
            parse("/v1/hosts/h1/undrain"),
            Some(Endpoint::HostAdmin {
                host: "h1",
                drain: false
            })
        );
        assert_eq!(
            parse("/v1/systems/smtp/disable"),
            Some(Endpoint::SystemAdmin {
                system: "smtp",
                action: "disable"
            })
        );
        assert_eq!(parse("/v1/cluster"), Some(Endpoint::Cluster));
        assert_eq!(parse("/v1/queues/q"), Some(Endpoint::Queue { queue: "q" }));
        assert_eq!(parse("/v1/tasks/x"), Some(Endpoint::Search { id: "x" }));
        assert_eq!(
            parse("/v1/queues/q/dead"),
            Some(Endpoint::Dead { queue: "q" })
        );
        assert_eq!(
            parse("/v1/queues/q/dead/purge"),
            Some(Endpoint::DeadMove {
                queue: "q",
                action: DeadAction::Purge
            })
        );
        assert_eq!(
            parse("/v1/queues/q/dead/requeue"),
            Some(Endpoint::DeadMove {
                queue: "q",
                action: DeadAction::Requeue
            })
        );
        assert_eq!(
            parse("/v1/queues/q/tasks/x/retry"),
            Some(Endpoint::Retry {
                queue: "q",
                id: "x"
            })
        );
        // (a queue named like an action is still a queue)
        assert_eq!(
            parse("/v1/queues/dead/dead"),
            Some(Endpoint::Dead { queue: "dead" })
        );
        assert_eq!(parse("/v1/queues/q/dead/bury"), None);
        assert_eq!(parse("/v1/tasks"), None);
        assert_eq!(parse("/v1/tasks/x/y"), None);
        assert_eq!(parse("/v1/cluster/x"), None);
        let retry = parse("/v1/queues/q/tasks/x/retry").unwrap();
        assert_eq!(
            (retry.name(), names(retry.methods())),
            ("retry", "POST".into())
        );
        let dead = parse("/v1/queues/q/dead").unwrap();
        assert_eq!(
            (dead.name(), names(dead.methods())),
            ("dead", "GET, HEAD".into())
        );
        assert_eq!(
            parse("/v1/queues/q/tasks/x/payload"),
            Some(Endpoint::Payload {
                queue: "q",
                id: "x"
            })
        );
        let search = parse("/v1/tasks/x").unwrap();
        assert_eq!(search.name(), "search");
        assert_eq!(parse("/v1/queues/q/tasks/x/melt"), None);
        assert_eq!(parse("/v1/queues/q/scale"), None);
        assert_eq!(parse("/v2"), None);
        let task = parse("/v1/queues/q/tasks/x").unwrap();
        assert_eq!(task.name(), "task");
        assert_eq!(names(task.methods()), "GET, HEAD, DELETE");
        assert_eq!(
            parse("/v1/queues/q/tasks/x/freeze").unwrap().name(),
            "freeze"
        );
    }

    #[test]
    fn query_pairs_are_decoded() {
        assert_eq!(
            query_pairs("state=done&cursor=c%2012&limit=").unwrap(),
            vec![
                ("state".into(), "done".into()),
                ("cursor".into(), "c 12".into()),
                ("limit".into(), "".into())
            ]
        );
        assert_eq!(
            query_pairs("state=done&limit=5&state=failed")
                .unwrap_err()
                .message,
            "query parameter \"state\" given more than once: give each at most once"
        );
    }
}
