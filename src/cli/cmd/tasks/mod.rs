//! `gaffer tasks …`: one task's record, listings, chains, dead letters, freeze, thaw,
//! cancel.

mod chain;
mod control;
mod dead;
mod list;
mod show;

use clap::Subcommand;

use crate::cli::{CliError, Global};

pub use chain::ChainArgs;
pub use control::TaskRef;
pub use dead::{DeadArgs, PurgeArgs, RequeueArgs};
pub use list::ListArgs;
pub use show::ShowArgs;

/// `gaffer tasks …`.
#[derive(Subcommand)]
pub enum TasksCmd {
    /// List dead letters, oldest first
    Dead(DeadArgs),
    /// Put dead letters back in the queue with their attempts reset (all, or the given ids)
    Requeue(RequeueArgs),
    /// Delete dead letters (all, or the given ids); asks first on a terminal
    Purge(PurgeArgs),
    /// Remove a task by id, whatever its state; a leased task's settle will be refused
    Cancel(TaskRef),
    /// Show one task by id
    ///
    /// A tracked queue's task shows its record: fields, then its history (--json prints
    /// the API's record). Otherwise what the queue holds of it, while it holds it.
    Show(ShowArgs),
    /// List a queue's task records, newest first, a page at a time
    List(ListArgs),
    /// Show a chain as a tree: its global task and every follow-up, each with its state
    ///
    /// ID is the chain's global task's id (a follow-up's record names it as `chain`).
    /// The chain is done when every task is done, failed as soon as one failed for good.
    Chain(ChainArgs),
    /// Hold a waiting task: takers do not see it until it is thawed
    Freeze(TaskRef),
    /// Release a frozen task: ready at once, or delayed while its due time is ahead
    Thaw(TaskRef),
}

/// Runs one `tasks` subcommand.
pub async fn run(global: &Global, cmd: TasksCmd) -> Result<(), CliError> {
    match cmd {
        TasksCmd::Dead(args) => dead::list(global, args).await,
        TasksCmd::Requeue(args) => dead::requeue(global, args).await,
        TasksCmd::Purge(args) => dead::purge(global, args).await,
        TasksCmd::Cancel(task) => control::cancel(global, task).await,
        TasksCmd::Show(args) => show::run(global, args).await,
        TasksCmd::List(args) => list::run(global, args).await,
        TasksCmd::Chain(args) => chain::run(global, args).await,
        TasksCmd::Freeze(task) => control::hold(global, task, control::Hold::Freeze).await,
        TasksCmd::Thaw(task) => control::hold(global, task, control::Hold::Thaw).await,
    }
}
