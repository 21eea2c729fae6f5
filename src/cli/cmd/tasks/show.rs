//! `gaffer tasks show QUEUE ID [--json]`: one task's record and history.

use clap::Args;

use crate::cli::common::{no_task, open_any_queue, payload_json, preview};
use crate::cli::{CliError, Global};
use crate::queue_client::{HistoryEntry, Queue, TaskRecord};

/// Arguments of `gaffer tasks show`.
#[derive(Args)]
pub struct ShowArgs {
    /// The task's queue
    pub queue: String,
    /// The task's id (as `gaffer push` or the API answered it)
    pub id: String,
    /// Print the record as the API answers it (one JSON object)
    #[arg(long)]
    pub json: bool,
}

/// `gaffer tasks show`: the task's record when it has one (`--json`: exactly the API's
/// record), else what the queue holds of it (an untracked queue); exit 1 when unknown.
pub async fn run(global: &Global, args: ShowArgs) -> Result<(), CliError> {
    let (q, _) = open_any_queue(global, &args.queue).await?;
    if let Some(record) = q.record(&args.id).await? {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&record)?);
        } else {
            print_record(&q, &record).await?;
        }
        return Ok(());
    }
    let Some(t) = q.find(&args.id).await? else {
        return Err(no_task(&args.queue, &args.id));
    };
    let mut v = serde_json::to_value(&t)?;
    v["payload"] = payload_json(&t.payload);
    if args.json {
        println!("{v}");
    } else {
        // (JSON escapes C0 only: DEL, C1 and bidi controls of a payload would pass)
        let text = serde_json::to_string_pretty(&v)?;
        println!("{}", crate::printable::printable_lines(&text));
    }
    Ok(())
}

/// The record's fields, one per line, the payload while the queue still holds the task,
/// then the history as a table.
async fn print_record(q: &Queue, r: &TaskRecord) -> Result<(), CliError> {
    let or_dash = |s: Option<&str>| s.map_or_else(|| "-".to_string(), one_line);
    let max = match r.max_attempts {
        0 => "0 (no limit)".to_string(),
        n => n.to_string(),
    };
    let result = r
        .result
        .as_ref()
        .map(|v| preview(v.to_string().as_bytes(), 200));
    let mut fields = vec![
        ("id", one_line(&r.id)),
        ("queue", one_line(&r.queue)),
        ("state", r.state.to_string()),
        ("priority", r.priority.to_string()),
        ("attempt", r.attempt.to_string()),
        ("max_attempts", max),
        ("created_at", r.created_at.clone()),
        ("due_at", r.due_at.clone()),
        ("updated_at", r.updated_at.clone()),
        ("submitted_by", or_dash(r.submitted_by.as_deref())),
        ("error", or_dash(r.error.as_deref())),
        ("result", or_dash(result.as_deref())),
        ("chain", or_dash(r.chain.as_deref())),
    ];
    if let Some(t) = q.find(&r.id).await? {
        fields.push(("payload", one_line(&preview(&t.payload, 200))));
    }
    for (name, value) in fields {
        println!("{name:<13} {value}");
    }
    let history = r.history.as_deref().unwrap_or_default();
    println!();
    println!(
        "{:<24}  {:<10} {:>7}  {:<24} note",
        "at", "state", "attempt", "host/slot"
    );
    for e in history {
        let row = format!(
            "{:<24}  {:<10} {:>7}  {:<24} {}",
            e.at,
            e.state.as_str(),
            e.attempt,
            place(e),
            note(e)
        );
        println!("{}", row.trim_end());
    }
    Ok(())
}

/// Where an attempt ran: `host/slot`, either alone, or `-`.
fn place(e: &HistoryEntry) -> String {
    match (&e.host, e.slot) {
        (Some(h), Some(s)) => format!("{}/{s}", one_line(h)),
        (Some(h), None) => one_line(h),
        (None, Some(s)) => format!("/{s}"),
        (None, None) => "-".into(),
    }
}

/// The entry's note on one line, with `×N` when it stands for N identical transitions.
fn note(e: &HistoryEntry) -> String {
    let text = e.note.as_deref().map(one_line).unwrap_or_default();
    match e.count {
        Some(n) if text.is_empty() => format!("×{n}"),
        Some(n) => format!("{text} ×{n}"),
        None => text,
    }
}

/// Text on one line: line breaks become spaces, so a table keeps its rows, and nothing
/// unprintable reaches the terminal raw (see [`crate::printable`]).
pub(super) fn one_line(s: &str) -> String {
    crate::printable::one_line(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue_client::RecordState;

    fn entry(
        host: Option<&str>,
        slot: Option<u32>,
        note: Option<&str>,
        count: Option<u64>,
    ) -> HistoryEntry {
        HistoryEntry {
            state: RecordState::Waiting,
            at: "1970-01-01T00:00:00.000Z".into(),
            attempt: 1,
            host: host.map(Into::into),
            slot,
            note: note.map(Into::into),
            count,
        }
    }

    #[test]
    fn history_cells_name_the_slot_and_fold_counts() {
        assert_eq!(place(&entry(Some("h1"), Some(3), None, None)), "h1/3");
        assert_eq!(place(&entry(Some("h1"), None, None, None)), "h1");
        assert_eq!(place(&entry(None, None, None, None)), "-");
        let paused = entry(None, None, Some("system paused\nby ops"), Some(4));
        assert_eq!(note(&paused), "system paused by ops ×4");
        assert_eq!(note(&entry(None, None, None, Some(2))), "×2");
        assert_eq!(
            note(&entry(None, None, Some("lease expired"), None)),
            "lease expired"
        );
    }
}
