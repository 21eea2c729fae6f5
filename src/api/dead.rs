//! Dead letters over HTTP: the listing (`GET /v1/queues/{queue}/dead`), requeue and purge
//! (`POST …/dead/requeue|purge`), all for admin keys, and the retry of one failed task
//! (`POST /v1/queues/{queue}/tasks/{id}/retry`), which a key may do to its own tasks.
//!
//! They do what `gaffer tasks dead | requeue | purge` do, through the same calls of the
//! queue (`Queue::dead_page`, `requeue_dead_by`, `purge_dead`), which move letters in
//! bounded chunks; a retry checks in the same step that moves it that the letter is still
//! the task whose record the key was shown.

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{Value, json};

use super::auth;
use super::console_data::{check_task_id, payload_json};
use super::error::ApiError;
use super::routes::{Answer, Api, read_body};
use crate::config::ApiKey;
use crate::queue_client::{
    DeadCursor, DeadTask, MAX_BATCH, MAX_LIST_LIMIT, Queue, RecordState, TaskState, rfc3339,
};

/// Dead letters per page when the listing does not say.
const DEFAULT_DEAD_LIMIT: usize = 100;

/// What `POST /v1/queues/{queue}/dead/{action}` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DeadAction {
    /// Back in the queue, attempts reset.
    Requeue,
    /// Deleted, records too.
    Purge,
}

impl DeadAction {
    /// The action named in a path.
    pub(super) fn parse(word: &str) -> Option<Self> {
        match word {
            "requeue" => Some(DeadAction::Requeue),
            "purge" => Some(DeadAction::Purge),
            _ => None,
        }
    }
}

/// Which dead letters a requeue or purge moves: the body `{"ids": [..]}` or
/// `{"all": true}`.
#[derive(Debug, PartialEq, Eq)]
enum Chosen {
    Ids(Vec<String>),
    All,
}

/// Reads a requeue or purge body: exactly one of `ids` (1 to [`MAX_BATCH`] ids) and
/// `"all": true`, so that moving every letter is never what a forgotten field does.
fn chosen(body: &[u8]) -> Result<Chosen, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        ids: Option<Vec<String>>,
        all: Option<bool>,
    }
    let b: Body = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("bad dead letter request: {e}")))?;
    match (b.ids, b.all) {
        (Some(_), Some(_)) => Err(ApiError::bad_request("give \"ids\" or \"all\", not both")),
        (None, None) => Err(ApiError::bad_request(
            "name the dead letters: give \"ids\": [..] or \"all\": true",
        )),
        (None, Some(false)) => Err(ApiError::bad_request(
            "\"all\" must be true to move every dead letter (or give \"ids\")",
        )),
        (None, Some(true)) => Ok(Chosen::All),
        (Some(ids), None) if ids.is_empty() => Err(ApiError::bad_request(
            "\"ids\" is empty: name at least one dead letter, or give \"all\": true",
        )),
        (Some(ids), None) if ids.len() > MAX_BATCH => Err(ApiError::too_large(format!(
            "{} ids exceed the limit of {MAX_BATCH} per request",
            ids.len()
        ))),
        (Some(ids), None) => {
            ids.iter().try_for_each(|id| check_task_id(id))?;
            Ok(Chosen::Ids(ids))
        }
    }
}

/// The query of a dead letter listing: `limit` (1 to [`MAX_LIST_LIMIT`]) and `cursor`.
fn dead_query(query: Option<&str>) -> Result<(usize, Option<DeadCursor>), ApiError> {
    super::listings::page_query(
        query,
        DEFAULT_DEAD_LIMIT,
        MAX_LIST_LIMIT,
        DeadCursor::decode,
    )
}

/// A dead letter as the listing answers it: as `gaffer tasks dead --json` prints it, with
/// its time of death in RFC 3339 too.
fn letter_json(d: &DeadTask) -> Value {
    let mut v = json!(d);
    v["died_at"] = json!(rfc3339(d.died_ms));
    v["payload"] = payload_json(&d.payload);
    v
}

impl Api {
    /// `GET /v1/queues/{queue}/dead`: a page of dead letters, newest first (admin).
    pub(super) async fn dead_letters(
        &self,
        queue: &str,
        key: &ApiKey,
        query: Option<&str>,
    ) -> Answer {
        auth::check_admin(key)?;
        let queue = self.queue(queue, key)?;
        let (limit, cursor) = dead_query(query)?;
        let _listing = self
            .listings
            .start(&key.name, self.config.api.max_listings_per_key)?;
        let page = queue.dead_page(cursor.as_ref(), limit).await?;
        let dead: Vec<Value> = page.dead.iter().map(letter_json).collect();
        Ok((
            StatusCode::OK,
            json!({"dead": dead, "next_cursor": page.next_cursor}),
        ))
    }

    /// `POST /v1/queues/{queue}/dead/requeue|purge` (admin): how many letters moved. Named ids
    /// that are not dead letters are passed over (the count says so); `all` moves those
    /// dead when it begins, not those that die while it runs.
    pub(super) async fn move_dead(
        &self,
        queue: &str,
        key: &ApiKey,
        action: DeadAction,
        request: Request<Incoming>,
    ) -> Answer {
        auth::check_admin(key)?;
        let queue = self.queue(queue, key)?;
        let api = &self.config.api;
        let body = read_body(request, api.max_body, api.read_timeout).await?;
        let chosen = chosen(&body)?;
        let ids = match &chosen {
            Chosen::Ids(ids) => Some(&ids[..]),
            Chosen::All => None,
        };
        let answer = match action {
            DeadAction::Requeue => {
                let note = format!("requeued from the dead letters by key {}", key.name);
                let n = queue.requeue_dead_by(ids, &note, None).await?;
                json!({"queue": queue.name(), "requeued": n})
            }
            DeadAction::Purge => {
                let n = queue.purge_dead(ids).await?;
                json!({"queue": queue.name(), "purged": n})
            }
        };
        Ok((StatusCode::OK, answer))
    }

    /// `POST /v1/queues/{queue}/tasks/{id}/retry`: a failed task of the key's back in the
    /// queue, attempts reset; the record after. Any other key's task answers as unknown,
    /// and a task in another state 409.
    pub(super) async fn retry(&self, queue: &Queue, key: &ApiKey, id: &str) -> Answer {
        let unknown = || ApiError::not_found(format!("no task {id} in queue {}", queue.name()));
        let note = format!("retried by key {}", key.name);
        let ids = [id.to_string()];
        if !queue.limits().track {
            // (no record names a submitter: only an admin key sees the queue's tasks)
            if !key.admin {
                return Err(unknown());
            }
            if queue.requeue_dead_by(Some(&ids), &note, None).await? == 1 {
                return Ok((
                    StatusCode::OK,
                    json!({"id": id, "queue": queue.name(), "state": RecordState::Waiting}),
                ));
            }
            let info = queue.find(id).await?.ok_or_else(unknown)?;
            return Err(not_failed(id, untracked_state(info.state)));
        }
        let rec = self.own_record(queue, key, id).await?;
        if rec.state != RecordState::Failed {
            return Err(not_failed(id, rec.state));
        }
        // (the letter whose record was checked: not one another key's task left under
        // its id since)
        let owner = rec.submitted_by.as_deref().unwrap_or_default();
        if queue
            .requeue_dead_by(Some(&ids), &note, Some(owner))
            .await?
            == 1
        {
            let now = queue.record(id).await?.unwrap_or(rec);
            return Ok((StatusCode::OK, json!(now)));
        }
        match queue.record(id).await? {
            Some(now)
                if now.submitted_by == rec.submitted_by && now.state == RecordState::Failed =>
            {
                Err(ApiError::conflict(format!(
                    "task {id} failed and is no longer a dead letter (requeued or purged meanwhile): only a dead letter can be retried"
                )))
            }
            Some(now) if now.submitted_by == rec.submitted_by => Err(not_failed(id, now.state)),
            _ => Err(unknown()),
        }
    }
}

/// The refusal of a retry of a task that has not failed.
fn not_failed(id: &str, state: RecordState) -> ApiError {
    ApiError::conflict(format!(
        "task {id} is {state}: only a failed task can be retried"
    ))
}

/// The state a task of a queue without records is shown in.
fn untracked_state(state: TaskState) -> RecordState {
    match state {
        TaskState::Leased => RecordState::Running,
        TaskState::Dead => RecordState::Failed,
        TaskState::Frozen => RecordState::Frozen,
        TaskState::Cancelling => RecordState::Cancelling,
        _ => RecordState::Waiting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_names_its_letters_or_all_of_them_and_nothing_else() {
        assert_eq!(
            chosen(br#"{"ids": ["a", "b"]}"#),
            Ok(Chosen::Ids(vec!["a".into(), "b".into()]))
        );
        assert_eq!(chosen(br#"{"all": true}"#), Ok(Chosen::All));
        let refused = |body: &[u8]| chosen(body).unwrap_err().message;
        assert_eq!(
            refused(b"{}"),
            "name the dead letters: give \"ids\": [..] or \"all\": true"
        );
        assert_eq!(
            refused(br#"{"all": false}"#),
            "\"all\" must be true to move every dead letter (or give \"ids\")"
        );
        assert_eq!(
            refused(br#"{"ids": ["a"], "all": true}"#),
            "give \"ids\" or \"all\", not both"
        );
        assert_eq!(
            refused(br#"{"ids": []}"#),
            "\"ids\" is empty: name at least one dead letter, or give \"all\": true"
        );
        assert_eq!(
            refused(br#"{"ids": [""]}"#),
            "task id must be 1 to 256 bytes, got 0"
        );
        assert!(
            refused(br#"{"id": "a"}"#).starts_with("bad dead letter request: unknown field `id`")
        );
        assert!(refused(b"").starts_with("bad dead letter request: EOF"));
        let many = serde_json::to_vec(&json!({"ids": vec!["x"; MAX_BATCH + 1]})).unwrap();
        let e = chosen(&many).unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(e.message, "10001 ids exceed the limit of 10000 per request");
    }

    #[test]
    fn a_dead_listing_takes_a_limit_and_a_cursor_it_made() {
        assert_eq!(dead_query(None).unwrap(), (DEFAULT_DEAD_LIMIT, None));
        let c = DeadCursor {
            died_ms: 5,
            id: "a".into(),
        };
        let q = format!("limit=2&cursor={}", c.encode());
        assert_eq!(dead_query(Some(&q)).unwrap(), (2, Some(c)));
        let refused = |q: &str| dead_query(Some(q)).unwrap_err().message;
        assert_eq!(
            refused("limit=0"),
            "limit must be a number from 1 to 1000, got \"0\""
        );
        assert_eq!(
            refused("cursor=c12"),
            "cursor \"c12\" is not one this api returned"
        );
        assert_eq!(
            refused("state=failed"),
            "unknown query parameter \"state\": expected limit or cursor"
        );
    }
}
