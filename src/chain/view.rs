//! A chain as readers see it: every member's record, and the chain's state from them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{ChainTargets, Member, members_of};
use crate::queue_client::{QueueClient, QueueError, QueueLimits, RecordState, TaskRecord};

/// Where a chain is, from its tasks' records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChainState {
    /// No task of it has started yet.
    Waiting,
    /// Some task has started and none failed; not all are done.
    Running,
    /// Every task is done.
    Done,
    /// A task failed for good (named in [`ChainView::failed`]).
    Failed,
    /// A task was cancelled, and none failed.
    Cancelled,
}

impl ChainState {
    /// Whether the chain has ended: nothing of it will run any more.
    pub fn is_end(self) -> bool {
        matches!(
            self,
            ChainState::Done | ChainState::Failed | ChainState::Cancelled
        )
    }

    /// The state's name, as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChainState::Waiting => "waiting",
            ChainState::Running => "running",
            ChainState::Done => "done",
            ChainState::Failed => "failed",
            ChainState::Cancelled => "cancelled",
        }
    }
}

/// One task of a chain as read.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainTask {
    /// Which task.
    pub member: Member,
    /// The task whose follow-up it is; `None` for the global task.
    pub parent: Option<Member>,
    /// Its record; `None` when it has expired (or its queue is no longer configured).
    pub record: Option<TaskRecord>,
}

/// A chain: its global task first, then the follow-ups in the order of their ids.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainView {
    /// The chain's id.
    pub id: String,
    /// Its state, from its tasks' records.
    pub state: ChainState,
    /// The first task that failed for good, if any.
    pub failed: Option<Member>,
    /// Every task.
    pub tasks: Vec<ChainTask>,
}

impl ChainView {
    /// A chain of one task, `record`'s: a global task's run whose chain has no
    /// follow-ups of its own (yet).
    pub fn of_task(id: &str, record: TaskRecord) -> Self {
        let tasks = vec![ChainTask {
            member: Member::new(&record.queue, &record.id),
            parent: None,
            record: Some(record),
        }];
        let (state, failed) = state_of(&tasks);
        ChainView {
            id: id.to_string(),
            state,
            failed,
            tasks,
        }
    }

    /// The API's document: `{"id", "state", "failed", "tasks": [records with "parent"]}`.
    pub fn to_json(&self) -> Value {
        let tasks: Vec<Value> = self.tasks.iter().map(task_json).collect();
        let failed = self.failed.as_ref().map(|m| {
            let error = self
                .tasks
                .iter()
                .find(|t| &t.member == m)
                .and_then(|t| t.record.as_ref())
                .and_then(|r| r.error.clone());
            json!({"queue": m.queue, "id": m.id, "error": error})
        });
        json!({"id": self.id, "state": self.state, "failed": failed, "tasks": tasks})
    }
}

/// A task as a chain's document shows it: its record without history, with `parent`;
/// `{"id", "queue", "state": null}` when its record is gone.
pub(super) fn task_json(t: &ChainTask) -> Value {
    let mut v = match &t.record {
        Some(r) => serde_json::to_value(r).unwrap_or(Value::Null),
        None => json!({"id": t.member.id, "queue": t.member.queue, "state": null}),
    };
    if let Value::Object(map) = &mut v {
        map.remove("history");
        map.insert("parent".into(), json!(t.parent));
    }
    v
}

/// How many times a chain's member list and records are read over while it grows.
pub(super) const MAX_READS: usize = 5;

/// Reads chain `chain`: its members (`members_of`) and their records (each queue's
/// records through its limits in `targets`). `None` when no such chain is known.
pub async fn read(
    client: &QueueClient,
    targets: &ChainTargets,
    chain: &str,
) -> Result<Option<ChainView>, QueueError> {
    let queues = &targets.queues;
    let Some(mut list) = members_of(client, targets, chain).await? else {
        return Ok(None);
    };
    // The member list and the records are read apart, so a parent can end between the
    // two, its follow-ups added after the list was read: every task read would be ended
    // and the chain seem done while one it has is not listed. A follow-up is listed before
    // its parent ends, so once the list reads the same after the records as before, every
    // task those records' parents made is in it. (Bounded: a chain growing all the while
    // is shown as it last read, and not as done: a task it has may not be in that list.)
    let mut reads_left = MAX_READS;
    let (records, settled) = loop {
        let reads = std::iter::once(&list.root)
            .chain(list.follow.iter().map(|(c, _)| c))
            .map(|m| record_of(client, queues, m));
        let records = futures::future::try_join_all(reads).await?;
        reads_left -= 1;
        match members_of(client, targets, chain).await? {
            Some(again) if again.follow.len() != list.follow.len() => {
                if reads_left == 0 {
                    break (records, false);
                }
                list = again
            }
            _ => break (records, true),
        }
    };
    let order: Vec<(Member, Option<Member>)> = std::iter::once((list.root, None))
        .chain(list.follow.into_iter().map(|(c, p)| (c, Some(p))))
        .collect();
    let since = made_at(chain, records.first().and_then(Option::as_ref)).map(String::from);
    let tasks = tasks_of(chain, since.as_deref(), order, records);
    let (state, failed) = state_of(&tasks);
    let state = as_read(state, settled);
    Ok(Some(ChainView {
        id: chain.to_string(),
        state,
        failed,
        tasks,
    }))
}

/// Tasks of chain `chain` (each with its parent, `None` for the global task) with the
/// records read for them, each kept only when it names the chain: its id may since hold
/// another task (the same id submitted again once it ended), of another chain or none. A
/// task whose record names the chain but was made before its global task (`since`, that
/// task's creation, when known) is left out: it is an older chain's of the same id, which
/// only a queue dropped and made again can leave behind.
pub(super) fn tasks_of(
    chain: &str,
    since: Option<&str>,
    order: Vec<(Member, Option<Member>)>,
    records: Vec<Option<TaskRecord>>,
) -> Vec<ChainTask> {
    order
        .into_iter()
        .zip(records)
        .filter_map(|((member, parent), record)| {
            let record = record.filter(|r| r.chain.as_deref() == Some(chain));
            let older = record
                .as_ref()
                .zip(since)
                .is_some_and(|(r, since)| parent.is_some() && r.created_at.as_str() < since);
            (!older).then_some(ChainTask {
                record,
                member,
                parent,
            })
        })
        .collect()
}

/// When the global task of chain `chain` was made, from its record (`None` when that is
/// gone or is not the chain's).
pub(super) fn made_at<'a>(chain: &str, root: Option<&'a TaskRecord>) -> Option<&'a str> {
    root.filter(|r| r.chain.as_deref() == Some(chain))
        .map(|r| r.created_at.as_str())
}

/// A chain's state as a reader shows it: a list that kept growing while it was read
/// (`settled` false) may lack a task its parents made, so the chain is not shown done;
/// a failure or a cancel found is one however the list grows.
pub(super) fn as_read(state: ChainState, settled: bool) -> ChainState {
    if !settled && state == ChainState::Done {
        ChainState::Running
    } else {
        state
    }
}

pub(super) async fn record_of(
    client: &QueueClient,
    queues: &BTreeMap<String, QueueLimits>,
    m: &Member,
) -> Result<Option<TaskRecord>, QueueError> {
    let Some(limits) = queues.get(&m.queue) else {
        return Ok(None);
    };
    client
        .queue_with(&m.queue, limits.clone())?
        .record(&m.id)
        .await
}

/// The chain's state from its tasks' (a task whose record is gone counts for nothing):
/// failed as soon as one failed, else cancelled when one was, else done when all are,
/// else running once any has started.
pub(super) fn state_of(tasks: &[ChainTask]) -> (ChainState, Option<Member>) {
    let mut seen = Summary::default();
    seen.add(tasks);
    seen.state()
}

/// What a chain's tasks read so far say of its state (see [`state_of`]): kept between
/// the pages of a walk, so its last page can say the whole chain's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Summary {
    /// The first task that failed for good.
    pub(super) failed: Option<Member>,
    /// Whether one was cancelled.
    pub(super) cancelled: bool,
    /// Whether every one read (with a record) is done.
    pub(super) all_done: bool,
    /// Whether any has started.
    pub(super) started: bool,
}

impl Default for Summary {
    fn default() -> Self {
        Summary {
            failed: None,
            cancelled: false,
            all_done: true,
            started: false,
        }
    }
}

impl Summary {
    /// Counts in more tasks, read after those already counted.
    pub(super) fn add(&mut self, tasks: &[ChainTask]) {
        for t in tasks {
            let Some(r) = &t.record else { continue };
            if r.state == RecordState::Failed && self.failed.is_none() {
                self.failed = Some(t.member.clone());
            }
            self.cancelled |= r.state == RecordState::Cancelled;
            self.all_done &= r.state == RecordState::Done;
            self.started |= !matches!(r.state, RecordState::Waiting | RecordState::Frozen);
        }
    }

    /// The state the tasks counted say, and the first that failed.
    pub(super) fn state(&self) -> (ChainState, Option<Member>) {
        if let Some(m) = &self.failed {
            return (ChainState::Failed, Some(m.clone()));
        }
        let state = if self.cancelled {
            ChainState::Cancelled
        } else if self.all_done {
            ChainState::Done
        } else if self.started {
            ChainState::Running
        } else {
            ChainState::Waiting
        };
        (state, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, state: Option<RecordState>) -> ChainTask {
        let member = Member::new("q", id);
        ChainTask {
            parent: None,
            record: state.map(|state| TaskRecord {
                id: id.into(),
                queue: "q".into(),
                state,
                priority: 0,
                attempt: 0,
                max_attempts: 1,
                created_at: String::new(),
                due_at: String::new(),
                updated_at: String::new(),
                submitted_by: None,
                error: None,
                result: None,
                chain: None,
                history: None,
            }),
            member,
        }
    }

    fn check(states: &[(&str, Option<RecordState>)], expected: (ChainState, Option<&str>)) {
        let tasks: Vec<ChainTask> = states.iter().map(|(id, s)| task(id, *s)).collect();
        let (state, failed) = state_of(&tasks);
        assert_eq!(
            (state, failed.map(|m| m.id)),
            (expected.0, expected.1.map(String::from))
        );
    }

    #[test]
    fn a_chain_is_done_only_when_every_task_is() {
        use RecordState::*;
        check(&[("g", Some(Waiting))], (ChainState::Waiting, None));
        check(
            &[("g", Some(Done)), ("g~1", Some(Waiting))],
            (ChainState::Running, None),
        );
        check(
            &[
                ("g", Some(Done)),
                ("g~1", Some(Running)),
                ("g~2", Some(Done)),
            ],
            (ChainState::Running, None),
        );
        check(
            &[("g", Some(Done)), ("g~1", Some(Done)), ("g~2", Some(Done))],
            (ChainState::Done, None),
        );
        // an expired record counts for nothing
        check(
            &[("g", None), ("g~1", Some(Done))],
            (ChainState::Done, None),
        );
    }

    #[test]
    fn a_list_still_growing_is_never_read_as_done() {
        use ChainState::*;
        let read = |settled| [Done, Failed, Cancelled, Running].map(|s| as_read(s, settled));
        assert_eq!(read(true), [Done, Failed, Cancelled, Running]);
        assert_eq!(read(false), [Running, Failed, Cancelled, Running]);
    }

    #[test]
    fn one_failure_fails_the_chain_and_is_named_before_a_cancel() {
        use RecordState::*;
        check(
            &[
                ("g", Some(Done)),
                ("g~1", Some(Cancelled)),
                ("g~2", Some(Failed)),
                ("g~3", Some(Running)),
            ],
            (ChainState::Failed, Some("g~2")),
        );
        check(
            &[
                ("g", Some(Done)),
                ("g~1", Some(Cancelled)),
                ("g~2", Some(Running)),
            ],
            (ChainState::Cancelled, None),
        );
    }
}
