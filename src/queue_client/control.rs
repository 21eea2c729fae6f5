//! Operator controls on one task or a whole queue: look a task up, cancel it, freeze and
//! thaw it, switch the queue's intake, delete the queue.

use redis::Value;
use serde::Serialize;

use super::args::{FindHead, FreezeHead};
use super::meta::Meta;
use super::reply::{bytes, int, string};
use super::scripts::SCRIPTS;
use super::{Queue, QueueError};

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Due, waiting to be taken.
    Ready,
    /// Not yet due.
    Delayed,
    /// Handed out under a lease.
    Leased,
    /// In the dead letters.
    Dead,
    /// Held by an operator until thawed.
    Frozen,
    /// A running long task whose cancel was asked: its slot stops it within a tick (and
    /// the queue's `cancel_grace`), then it ends cancelled.
    Cancelling,
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TaskState::Ready => "ready",
            TaskState::Delayed => "delayed",
            TaskState::Leased => "leased",
            TaskState::Dead => "dead",
            TaskState::Frozen => "frozen",
            TaskState::Cancelling => "cancelling",
        })
    }
}

/// Everything known about one task.
#[derive(Debug, Clone, Serialize)]
pub struct TaskInfo {
    /// Task id.
    pub id: String,
    /// Where it is.
    pub state: TaskState,
    /// Priority.
    pub priority: i32,
    /// Attempts so far.
    pub attempts: u32,
    /// Its max_attempts (0 = no limit).
    pub max_attempts: u32,
    /// When it was enqueued (ms since the epoch).
    pub enqueued_ms: i64,
    /// Due time (delayed), lease expiry (leased) or time of death (dead), in ms.
    pub at_ms: i64,
    /// Last error, if any.
    pub last_error: Option<String>,
    /// Lease token while leased.
    pub lease_token: Option<u64>,
    /// The payload.
    #[serde(skip)]
    pub payload: Vec<u8>,
}

/// What a freeze or thaw found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeResult {
    /// Applied (or already so).
    Done,
    /// The task is not in a state the action applies to (running, failed, or ended).
    NotApplicable,
    /// No such task.
    Unknown,
}

/// What a cancel does to a dead letter.
#[derive(Debug, Clone, Copy)]
enum Dead {
    /// Removes it: an operator's cancel of a task that failed for good.
    Cancel,
    /// Leaves it: it has ended.
    Keep,
}

impl Queue {
    /// benchmarks and decommissioning a queue type.
    pub async fn delete_all(&self) -> Result<(), QueueError> {
        let mut conn = self.conn.clone();
        self.invocation(&SCRIPTS.drop)
            .invoke_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Looks a task up by id.
    pub async fn find(&self, id: &str) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, None, Dead::Keep, "", "").await
    }

    /// Looks a task up by id, only while its record names `owner` as its submitter,
    /// checked in the same step (`None`: it does not, or no task): a caller that checked
    /// who may see a task then reads that task, never another one submitted under its id
    /// since.
    pub async fn find_owned(&self, id: &str, owner: &str) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, None, Dead::Keep, "", owner).await
    }

    /// Removes a task by id, whatever its state, and returns what it was. A leased task's
    /// holder will find its settle rejected as stale. Its record says cancelled. In a
    /// long queue a running task is asked to stop instead: it is returned as
    /// [`TaskState::Cancelling`], its record says cancelling, and its slot ends it
    /// cancelled once it has stopped it.
    pub async fn cancel(&self, id: &str) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, Some("cancelled"), Dead::Cancel, "", "")
            .await
    }

    /// Like [`cancel`](Self::cancel), with `note` (who cancelled, why) in the record's
    /// history.
    pub async fn cancel_with(&self, id: &str, note: &str) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, Some(note), Dead::Cancel, "", "")
            .await
    }

    /// Like [`cancel_with`](Self::cancel_with), but a task that has ended stays as it
    /// ended, a dead letter too (it failed): for callers that looked at the task before
    /// (it may have failed since), and those that stop what a task led to.
    pub async fn cancel_unended(
        &self,
        id: &str,
        note: &str,
    ) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, Some(note), Dead::Keep, "", "")
            .await
    }

    /// Like [`cancel_with`](Self::cancel_with), only while the task's record names `owner`
    /// as its submitter, checked in the same step (`None`: it does not, or no task): a
    /// caller that checked who may cancel a task then cancels that task, never another
    /// one submitted under its id since. A dead letter stays as it is, as with
    /// [`cancel_unended`](Self::cancel_unended).
    pub async fn cancel_owned(
        &self,
        id: &str,
        note: &str,
        owner: &str,
    ) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, Some(note), Dead::Keep, "", owner)
            .await
    }

    /// Cancels a waiting task (ready or delayed) with `note`, only while the queue's
    /// switch says `system` is disabled, checked in the same step: a disable's sweep
    /// that an `enable` overtook cancels nothing more. `None`: not cancelled (unknown,
    /// not waiting, or the system no longer disabled).
    pub(super) async fn cancel_while_disabled(
        &self,
        id: &str,
        system: &str,
        note: &str,
    ) -> Result<Option<TaskInfo>, QueueError> {
        self.find_or_cancel(id, Some(note), Dead::Keep, system, "")
            .await
    }

    /// find.lua: look up `id`, and cancel it with the note when `cancel` is given (a
    /// dead letter as `dead` says); only a waiting task while `system` is disabled when
    /// `system` is not empty; only while its record's submitter is `owner` when that is
    /// not empty.
    async fn find_or_cancel(
        &self,
        id: &str,
        cancel: Option<&str>,
        dead: Dead,
        system: &str,
        owner: &str,
    ) -> Result<Option<TaskInfo>, QueueError> {
        // No task has an empty id, and the payload hash keeps a field by that name for
        // itself (see `pinned` in lua/lib/tasks.lua).
        if id.is_empty() {
            return Ok(None);
        }
        let mut inv = self.invocation(&SCRIPTS.find);
        inv.head(&FindHead {
            id: id.to_string(),
            cancel: cancel.is_some(),
            note: cancel.unwrap_or("").to_string(),
            history_ttl_ms: self.ttl_arg(),
            kind: self.limits.kind.as_str(),
            system: system.to_string(),
            owner: owner.to_string(),
            keep_dead: matches!(dead, Dead::Keep),
        });
        let mut conn = self.conn.clone();
        let reply: Option<Vec<Value>> = inv.invoke_async(&mut conn).await?;
        let Some(r) = reply else { return Ok(None) };
        if r.len() != 7 {
            return Err(QueueError::Protocol(format!(
                "find returned {} values",
                r.len()
            )));
        }
        let state = match string(&r[0])?.as_str() {
            "ready" => TaskState::Ready,
            "delayed" => TaskState::Delayed,
            "leased" => TaskState::Leased,
            "dead" => TaskState::Dead,
            "frozen" => TaskState::Frozen,
            "cancelling" => TaskState::Cancelling,
            other => return Err(QueueError::Protocol(format!("unknown state {other:?}"))),
        };
        let meta = Meta::parse(&bytes(&r[2]))
            .head
            .ok_or_else(|| QueueError::Protocol("malformed task meta".into()))?;
        let err = string(&r[5])?;
        let tok = string(&r[6])?;
        Ok(Some(TaskInfo {
            id: id.to_string(),
            state,
            priority: meta.priority,
            attempts: int(&r[3])? as u32,
            max_attempts: meta.max_attempts,
            enqueued_ms: meta.enqueued_ms,
            at_ms: int(&r[1])?,
            last_error: (!err.is_empty()).then_some(err),
            lease_token: tok.parse().ok(),
            payload: bytes(&r[4]),
        }))
    }

    /// Holds a waiting task until [`thaw`](Self::thaw): takers do not see it meanwhile.
    /// `note` goes into its history (who froze it, why).
    pub async fn freeze(&self, id: &str, note: &str) -> Result<FreezeResult, QueueError> {
        self.freeze_call(id, "freeze", note, "").await
    }

    /// [`freeze`](Self::freeze) or [`thaw`](Self::thaw) (`freeze` false), only while the
    /// task's record names `owner` as its submitter, checked in the same step (else
    /// [`FreezeResult::Unknown`]); see [`cancel_owned`](Self::cancel_owned).
    pub async fn hold_owned(
        &self,
        id: &str,
        freeze: bool,
        note: &str,
        owner: &str,
    ) -> Result<FreezeResult, QueueError> {
        let action = if freeze { "freeze" } else { "thaw" };
        self.freeze_call(id, action, note, owner).await
    }

    /// Releases a frozen task: ready at once, or delayed while its due time is ahead; on
    /// an ordered queue before the tasks waiting (created after it).
    pub async fn thaw(&self, id: &str, note: &str) -> Result<FreezeResult, QueueError> {
        self.freeze_call(id, "thaw", note, "").await
    }

    async fn freeze_call(
        &self,
        id: &str,
        action: &str,
        note: &str,
        owner: &str,
    ) -> Result<FreezeResult, QueueError> {
        if id.is_empty() {
            // (the name of the hashes' own field, see `find_or_cancel`)
            return Ok(FreezeResult::Unknown);
        }
        let mut inv = self.invocation(&SCRIPTS.freeze);
        inv.head(&FreezeHead {
            id: id.to_string(),
            action: action.to_string(),
            note: note.to_string(),
            ordered: self.limits.ordered,
            owner: owner.to_string(),
        });
        let mut conn = self.conn.clone();
        let reply: Option<String> = inv.invoke_async(&mut conn).await?;
        Ok(match (action, reply.as_deref()) {
            (_, None) => FreezeResult::Unknown,
            ("freeze", Some("frozen")) => FreezeResult::Done,
            ("thaw", Some("ready" | "delayed")) => FreezeResult::Done,
            _ => FreezeResult::NotApplicable,
        })
    }

    /// The queue's intake as it is now: the run-time switch when set, else the config's.
    pub async fn intake(&self) -> Result<crate::config::Intake, QueueError> {
        Ok(self.intake_switch().await?.unwrap_or(self.limits.intake))
    }

    /// The queue's run-time intake switch, if one is set.
    pub async fn intake_switch(&self) -> Result<Option<crate::config::Intake>, QueueError> {
        let mut conn = self.conn.clone();
        let v: Option<String> = redis::cmd("HGET")
            .arg(self.keys.conf())
            .arg("intake")
            .query_async(&mut conn)
            .await?;
        Ok(v.as_deref().and_then(crate::config::Intake::parse))
    }

    /// Switches the queue's intake at run time; `None` drops the switch, so the config's
    /// value applies again. The switch lives beside the queue, so every producer (the
    /// API, the CLI, the library) honours it in the same script that enqueues.
    pub async fn set_intake(
        &self,
        intake: Option<crate::config::Intake>,
    ) -> Result<(), QueueError> {
        let mut conn = self.conn.clone();
        let cmd = match intake {
            Some(i) => {
                let mut c = redis::cmd("HSET");
                c.arg(self.keys.conf()).arg("intake").arg(i.as_str());
                c
            }
            None => {
                let mut c = redis::cmd("HDEL");
                c.arg(self.keys.conf()).arg("intake");
                c
            }
        };
        cmd.query_async::<()>(&mut conn).await?;
        Ok(())
    }
}
