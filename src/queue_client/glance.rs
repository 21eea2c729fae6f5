//! The state (and a record's chain) of many tasks at once: what a bulk submit answers for
//! its dedup hits and what a chain's start checks, in a few script calls rather than one
//! per task (a resent bulk of 10,000 tasks made 10,000 calls one after another).

use futures::{StreamExt, TryStreamExt};
use redis::Value;

use super::reply::string;
use super::scripts::SCRIPTS;
use super::{Queue, QueueError, RecordState};

/// Ids per script call: each costs about a record read, so a call stays near a
/// millisecond of Redis's time.
const GLANCE_CHUNK: usize = 200;
/// Calls in flight at once.
const GLANCE_WINDOW: usize = 8;

/// What the queue holds of a task under an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Glance {
    /// Its record: its current state and the chain it names.
    Recorded {
        /// As `GET …/tasks/{id}` shows it.
        state: RecordState,
        /// The record's chain, if any.
        chain: Option<String>,
        /// Who submitted the task (an api key's name, `cli`, …), if the record says.
        submitted_by: Option<String>,
    },
    /// A task the queue keeps no record of (`track = false`), in this state.
    Held(RecordState),
    /// Nothing under the id.
    Unknown,
}

impl Glance {
    /// The state a submit answers for the task: an unknown one (it ended between the
    /// enqueue and this read, on a queue without records) as waiting, as it was found.
    pub fn state(&self) -> RecordState {
        match self {
            Glance::Recorded { state, .. } | Glance::Held(state) => *state,
            Glance::Unknown => RecordState::Waiting,
        }
    }
}

impl Queue {
    /// What the queue holds under each of `ids`, in their order: calls of up to 200 ids,
    /// several in flight. Writes nothing.
    pub async fn glance_many(&self, ids: &[&str]) -> Result<Vec<Glance>, QueueError> {
        // (owned ids: a stream of futures that borrow slices of borrowed ids is not `Send`
        // for every lifetime, which a server that spawns its handlers needs)
        let calls: Vec<_> = ids
            .chunks(GLANCE_CHUNK)
            .map(|chunk| self.glance_call(chunk.iter().map(|id| id.to_string()).collect()))
            .collect();
        let answers: Vec<Vec<Glance>> = futures::stream::iter(calls)
            .buffered(GLANCE_WINDOW)
            .try_collect()
            .await?;
        Ok(answers.into_iter().flatten().collect())
    }

    async fn glance_call(&self, ids: Vec<String>) -> Result<Vec<Glance>, QueueError> {
        let mut inv = self.invocation(&SCRIPTS.glance);
        for id in &ids {
            inv.arg(id);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        if reply.len() != 4 * ids.len() {
            return Err(QueueError::Protocol(format!(
                "glance at {} tasks returned {} values",
                ids.len(),
                reply.len()
            )));
        }
        reply
            .chunks(4)
            .map(|f| {
                let (kind, state, chain) = (string(&f[0])?, string(&f[1])?, string(&f[2])?);
                let by = string(&f[3])?;
                let state = || {
                    RecordState::parse(&state).ok_or_else(|| {
                        QueueError::Protocol(format!("unknown record state {state:?}"))
                    })
                };
                Ok(match kind.as_str() {
                    "r" => Glance::Recorded {
                        state: state()?,
                        chain: (!chain.is_empty()).then_some(chain),
                        submitted_by: (!by.is_empty()).then_some(by),
                    },
                    "t" => Glance::Held(state()?),
                    _ => Glance::Unknown,
                })
            })
            .collect()
    }
}
