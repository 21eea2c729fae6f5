//! `gaffer migrate [QUEUE…]`: moves queues' data to this gaffer's layout
//! ([`crate::queue_client::layout`]), a bounded part per call, while the cluster runs.

use std::time::{Duration, Instant};

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::cli::common::any_queue_handle;
use crate::cli::{CliError, Global};
use crate::queue_client::{LayoutState, MigrateStep, Queue, QueueError, layout};

/// Arguments of `gaffer migrate`.
#[derive(Args)]
pub struct MigrateArgs {
    /// Queues to migrate (each in the config, or retired) [default: every queue of the
    /// config]
    pub queues: Vec<String>,
    /// Items one call looks at: each call is atomic and blocks Redis for its length, so
    /// keep it small on a busy queue
    #[arg(long, default_value_t = 500, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub budget: u32,
    /// Stop each queue after N calls, its position kept: a later run goes on from there
    #[arg(long, value_name = "N")]
    pub calls: Option<u64>,
    /// Print {"queues": [{"queue", "from", "layout", "resumed_from", "calls",
    /// "looked_at", "done"}], "interrupted"} as JSON; `from` and `layout` are null for a
    /// queue holding no data
    #[arg(long)]
    pub json: bool,
}

/// What a run did to one queue.
struct Outcome {
    queue: String,
    from: Option<u32>,
    layout: Option<u32>,
    resumed_from: Option<String>,
    calls: u64,
    looked_at: u64,
    done: bool,
}

/// `gaffer migrate`: each queue in turn, until it is at the current layout, Ctrl-C, or
/// `--calls`. Progress goes to stderr, the result to stdout. An interrupted run exits 1,
/// saying how to go on; a run cut by `--calls` exits 0.
pub async fn run(global: &Global, args: MigrateArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let names: Vec<String> = if args.queues.is_empty() {
        cfg.queues.keys().cloned().collect()
    } else {
        args.queues.clone()
    };
    let client = global.connect(&cfg).await?;
    // (a retired queue named on the command line too: its data must reach this layout
    // before this gaffer can read or delete it)
    let mut queues = Vec::with_capacity(names.len());
    for n in &names {
        queues.push(any_queue_handle(&client, &cfg, n).await?.0);
    }
    let stop = crate::signals::shutdown_on_term().map_err(CliError::runtime)?;
    let mut outcomes = Vec::new();
    for q in &queues {
        outcomes.push(migrate_queue(q, &args, &stop).await?);
        if stop.is_cancelled() {
            break;
        }
    }
    let interrupted = stop.is_cancelled();
    print_outcomes(&outcomes, interrupted, args.json);
    if interrupted {
        return Err(CliError::runtime(
            "migrate interrupted: each queue keeps its position; run gaffer migrate again to go on",
        ));
    }
    Ok(())
}

/// One queue, call after call.
async fn migrate_queue(
    q: &Queue,
    args: &MigrateArgs,
    stop: &CancellationToken,
) -> Result<Outcome, CliError> {
    let LayoutState {
        layout: from,
        position,
        ..
    } = q.layout_state().await?;
    let mut out = Outcome {
        queue: q.name().to_string(),
        from,
        layout: from,
        resumed_from: position.map(|(p, c)| format!("{p} {c}")),
        calls: 0,
        looked_at: 0,
        done: false,
    };
    if let Some(at) = &out.resumed_from {
        eprintln!("{}: going on from {at}", out.queue);
    }
    let mut said = Instant::now();
    loop {
        if stop.is_cancelled() || args.calls.is_some_and(|n| out.calls >= n) {
            return Ok(out);
        }
        let step = q.migrate_step(args.budget).await.map_err(|e| match e {
            QueueError::Layout { .. } => CliError::runtime(e),
            e => e.into(),
        })?;
        match step {
            MigrateStep::Done => break,
            MigrateStep::Raced => {}
            MigrateStep::Worked {
                pass,
                to,
                looked_at,
                pass_done,
            } => {
                out.calls += 1;
                out.looked_at += looked_at;
                if pass_done || said.elapsed() >= Duration::from_secs(2) {
                    let state = if pass_done { "done" } else { "under way" };
                    eprintln!(
                        "{}: layout {to}, pass {pass} {state}: {} items looked at in {} calls",
                        out.queue, out.looked_at, out.calls
                    );
                    said = Instant::now();
                }
            }
        }
    }
    out.done = true;
    out.layout = out.from.map(|_| layout::CURRENT);
    Ok(out)
}

fn print_outcomes(outcomes: &[Outcome], interrupted: bool, json: bool) {
    if json {
        let queues: Vec<serde_json::Value> = outcomes
            .iter()
            .map(|o| {
                serde_json::json!({
                    "queue": o.queue,
                    "from": o.from,
                    "layout": o.layout,
                    "resumed_from": o.resumed_from,
                    "calls": o.calls,
                    "looked_at": o.looked_at,
                    "done": o.done,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "queues": queues, "interrupted": interrupted })
        );
        return;
    }
    for o in outcomes {
        let line = match (o.from, o.done) {
            (None, _) => "no data yet: its first write records the current layout".to_string(),
            (Some(f), true) if f == layout::CURRENT && o.calls == 0 => {
                format!("layout {f} already")
            }
            (Some(f), true) => format!(
                "layout {f} -> {} ({} items looked at in {} calls)",
                layout::CURRENT,
                o.looked_at,
                o.calls
            ),
            (Some(f), false) => format!(
                "layout {f}, not done ({} items looked at in {} calls): run again to go on",
                o.looked_at, o.calls
            ),
        };
        println!("{}: {line}", o.queue);
    }
}
