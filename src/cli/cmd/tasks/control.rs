//! `gaffer tasks cancel | freeze | thaw QUEUE ID`.

use clap::Args;

use crate::cli::common::{Standing, no_task, open_any_queue, refuse_retired};
use crate::cli::{CliError, Global};
use crate::queue_client::{FreezeResult, Queue, TaskState};

/// One task: its queue and id.
#[derive(Args)]
pub struct TaskRef {
    /// The task's queue
    pub queue: String,
    /// The task's id
    pub id: String,
}

/// `gaffer tasks cancel QUEUE ID`: removes the task whatever its state, noted in its
/// record as cancelled by the CLI; a running long task is asked to stop (cancelling). A
/// retired queue's task too.
pub async fn cancel(global: &Global, task: TaskRef) -> Result<(), CliError> {
    let TaskRef { queue, id } = task;
    let (q, _) = open_any_queue(global, &queue).await?;
    match q.cancel_with(&id, "cancelled by cli").await? {
        Some(t) if t.state == TaskState::Cancelling => {
            println!(
                "cancelling {queue} task {id}: its slot stops it within a tick (and the queue's cancel_grace), then it is cancelled"
            );
            Ok(())
        }
        Some(t) => {
            println!("cancelled {queue} task {id} (was {})", t.state);
            Ok(())
        }
        None => Err(no_task(&queue, &id)),
    }
}

/// Which way `hold` goes.
#[derive(Clone, Copy)]
pub enum Hold {
    /// `gaffer tasks freeze`.
    Freeze,
    /// `gaffer tasks thaw`.
    Thaw,
}

/// `gaffer tasks freeze | thaw QUEUE ID`. A task the action does not apply to fails
/// (exit 1) with the state it is in; an unknown one too. A retired queue's task may be
/// frozen, not thawed: no slot would take it.
pub async fn hold(global: &Global, task: TaskRef, how: Hold) -> Result<(), CliError> {
    let TaskRef { queue, id } = task;
    let (q, standing) = open_any_queue(global, &queue).await?;
    if matches!(how, Hold::Thaw) && standing == Standing::Retired {
        return Err(refuse_retired(&queue, "thaw its tasks"));
    }
    let (verb, done, applies) = match how {
        Hold::Freeze => ("freeze", "frozen", "a waiting task"),
        Hold::Thaw => ("thaw", "thawed", "a frozen task"),
    };
    let result = match how {
        Hold::Freeze => q.freeze(&id, "frozen by cli").await?,
        Hold::Thaw => q.thaw(&id, "thawed by cli").await?,
    };
    if result == FreezeResult::Done {
        println!("{done} {queue} task {id}");
        return Ok(());
    }
    // Not applicable, or gone from the queue while its record still tells its end.
    match state_of(&q, &id).await? {
        Some(state) => Err(CliError::runtime(format!(
            "cannot {verb} {queue} task {id}: it is {state}; only {applies} can be {done}"
        ))),
        None => Err(no_task(&queue, &id)),
    }
}

/// The task's state as its record says, else as the queue says; `None` when unknown.
async fn state_of(q: &Queue, id: &str) -> Result<Option<String>, CliError> {
    if let Some(r) = q.record(id).await? {
        return Ok(Some(r.state.to_string()));
    }
    Ok(q.find(id).await?.map(|t| t.state.to_string()))
}
