//! `gaffer tasks list QUEUE [--state S] [--limit N] [--cursor C] [--json]`.

use clap::Args;

use super::show::one_line;
use crate::cli::common::{open_any_queue, preview};
use crate::cli::{CliError, Global};
use crate::printable::printable;
use crate::queue_client::{ListQuery, MAX_LIST_LIMIT, RecordState};

/// Arguments of `gaffer tasks list`.
#[derive(Args)]
pub struct ListArgs {
    /// Queue name: of the config, or a retired one (`gaffer queues list`)
    pub queue: String,
    /// Only tasks in this state: waiting, running, done, failed, cancelled, frozen or
    /// cancelling
    #[arg(long, value_name = "STATE", value_parser = parse_state)]
    pub state: Option<RecordState>,
    /// Tasks per page, 1 to 1000
    #[arg(
        long,
        default_value_t = 50,
        value_parser = clap::value_parser!(u32).range(1..=MAX_LIST_LIMIT as i64),
    )]
    pub limit: u32,
    /// Where the page starts: the cursor the previous page ended with
    #[arg(long)]
    pub cursor: Option<String>,
    /// Print the page as JSON: {"tasks": [records without history], "next_cursor": C | null}
    #[arg(long)]
    pub json: bool,
}

fn parse_state(s: &str) -> Result<RecordState, String> {
    RecordState::parse(s).ok_or_else(|| {
        let all: Vec<&str> = RecordState::ALL.iter().map(|s| s.as_str()).collect();
        format!("the states are {}", all.join(", "))
    })
}

/// `gaffer tasks list`: one page of the queue's records, newest first, `--limit` of them
/// unless the listing ends first; the next page's cursor on the last line when there is
/// one.
pub async fn run(global: &Global, args: ListArgs) -> Result<(), CliError> {
    let (q, _) = open_any_queue(global, &args.queue).await?;
    let limit = args.limit as usize;
    let mut query = ListQuery {
        state: args.state,
        submitted_by: None,
        cursor: args.cursor.clone(),
        limit,
    };
    let mut page = q.list(&query).await?;
    // A page comes back short with a cursor when its scan budget ran out among records of
    // other states (`Queue::list`): the command goes on, each call still bounded, until
    // it has `--limit` tasks or the end.
    while page.tasks.len() < limit
        && let Some(cursor) = page.next_cursor.take()
    {
        query.cursor = Some(cursor);
        query.limit = limit - page.tasks.len();
        let more = q.list(&query).await?;
        page.tasks.extend(more.tasks);
        page.next_cursor = more.next_cursor;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    println!(
        "{:<24} {:<10} {:>7}  {:<24} {:<24} {:<16} error",
        "id", "state", "attempt", "created", "updated", "submitted_by"
    );
    for r in &page.tasks {
        let row = format!(
            "{:<24} {:<10} {:>7}  {:<24} {:<24} {:<16} {}",
            printable(&r.id),
            r.state.as_str(),
            r.attempt,
            r.created_at,
            r.updated_at,
            printable(r.submitted_by.as_deref().unwrap_or("-")),
            one_line(&preview(r.error.as_deref().unwrap_or("").as_bytes(), 40)),
        );
        println!("{}", row.trim_end());
    }
    if !q.limits().track {
        println!("(queue {} keeps no records: track = false)", args.queue);
    }
    if let Some(c) = &page.next_cursor {
        println!("more: pass --cursor {} for the next page", printable(c));
    }
    Ok(())
}
