//! `gaffer push QUEUE`: enqueue one payload, a file of them, or synthetic ones.

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde_json::json;

use crate::cli::common::queue_handle;
use crate::cli::{CliError, Global};
use crate::queue_client::{NewTask, RecordState};

/// Arguments of `gaffer push`.
#[derive(Args)]
pub struct PushArgs {
    /// Queue to enqueue to (must be in the config)
    pub queue: String,
    /// One JSON payload
    #[arg(long, group = "source")]
    pub payload: Option<String>,
    /// One JSON payload per line; '-' reads stdin. Every line is checked before any is sent
    #[arg(long, group = "source", value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Number of tasks: synthetic payloads {"n": i}, or copies of --payload
    #[arg(long)]
    pub count: Option<usize>,
    /// Dedup id: while a task with this id is pending or leased, it is not enqueued again
    #[arg(long)]
    pub id: Option<String>,
    /// Higher is taken first
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Not due before this long from now (e.g. 30s, 5m, 2h)
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub delay: Duration,
    /// Attempts before dead letters, overriding the queue's max_attempts
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// The task's own time limit ("30s"), at most the queue's `timeout`: a task still
    /// running then is stopped and retried
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Make each task the global task of a chain of its own: its enqueue mints the
    /// chain's id (`~cQUEUE.N`, printed), which `gaffer tasks chain CHAIN` follows
    #[arg(long)]
    pub chain: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

/// Where the payloads come from, as the flags combine.
enum Source<'a> {
    /// One JSON payload, this many times.
    Payload(&'a str, usize),
    /// One JSON payload per line; `-` is stdin.
    File(&'a Path),
    /// Synthetic payloads `{"n": i}`.
    Count(usize),
}

impl PushArgs {
    /// The source the flags name: exactly one of --payload, --file, --count (which also
    /// repeats --payload).
    fn source(&self) -> Result<Source<'_>, CliError> {
        match (&self.payload, &self.file, self.count) {
            (Some(p), None, n) => Ok(Source::Payload(p, n.unwrap_or(1))),
            (None, Some(f), None) => Ok(Source::File(f)),
            (None, None, Some(n)) => Ok(Source::Count(n)),
            (None, Some(_), Some(_)) => {
                Err(CliError::Usage("--count cannot be used with --file".into()))
            }
            _ => Err(CliError::Usage(
                "push needs one of --payload JSON, --file PATH or --count N".into(),
            )),
        }
    }
}

const PUSH_CHUNK: usize = 10_000;

fn read_payloads(source: &Source<'_>) -> Result<Vec<Vec<u8>>, CliError> {
    match source {
        Source::Payload(p, n) => {
            serde_json::from_str::<serde_json::Value>(p)
                .map_err(|e| CliError::Usage(format!("--payload is not valid JSON: {e}")))?;
            Ok(vec![p.as_bytes().to_vec(); *n])
        }
        Source::Count(n) => Ok((0..*n)
            .map(|i| format!("{{\"n\":{i}}}").into_bytes())
            .collect()),
        Source::File(path) => read_lines(path),
    }
}

/// Every line of a file (or stdin) checked as JSON before anything is sent, so a bad
/// line enqueues nothing.
fn read_lines(path: &Path) -> Result<Vec<Vec<u8>>, CliError> {
    let stdin = path.as_os_str() == "-";
    let reader: Box<dyn BufRead> = if stdin {
        Box::new(std::io::stdin().lock())
    } else {
        let f = std::fs::File::open(path)
            .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
        Box::new(std::io::BufReader::new(f))
    };
    let name = if stdin {
        "stdin".to_string()
    } else {
        path.display().to_string()
    };
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| CliError::Runtime(anyhow::anyhow!("{name}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        serde_json::from_str::<serde_json::Value>(&line)
            .map_err(|e| CliError::Usage(format!("{name}:{}: not a JSON payload: {e}", i + 1)))?;
        out.push(line.into_bytes());
    }
    Ok(out)
}

/// `gaffer push`: enqueue one payload, a file of them, or synthetic ones, in bulk, as
/// submitted by `cli`. A closed intake refuses them all (exit 1).
pub async fn run(global: &Global, args: PushArgs) -> Result<(), CliError> {
    let source = args.source()?;
    let cfg = global.load()?;
    let payloads = read_payloads(&source)?;
    if args.id.is_some() && payloads.len() != 1 {
        return Err(CliError::Usage(
            "--id names one task; it cannot be used with several payloads".into(),
        ));
    }
    let client = global.connect(&cfg).await?;
    let q = queue_handle(&client, &cfg, &args.queue)?;
    if let (Some(own), Some(queue)) = (args.timeout, cfg.queues.get(&args.queue))
        && let Some(why) = queue.task_timeout_refusal(own)
    {
        return Err(CliError::Usage(why));
    }
    let tasks: Vec<NewTask> = payloads
        .into_iter()
        .map(|p| NewTask {
            payload: p,
            id: args.id.clone(),
            priority: args.priority,
            delay: args.delay,
            at: None,
            max_attempts: args.max_attempts,
            timeout: args.timeout,
            submitted_by: Some(crate::config::RESERVED_SUBMITTER.into()),
            chain: None,
            own_id: false,
        })
        .collect();
    let mut tasks = tasks;
    if args.chain {
        crate::chain::start_global(&q, tasks.iter_mut().collect())
            .await
            .map_err(|e| CliError::Runtime(e.into()))?;
    }
    let total = tasks.len();
    let show_progress = total > PUSH_CHUNK && std::io::stderr().is_terminal();
    // Ctrl-C (or SIGTERM) between chunks stops after the chunk in flight and says how
    // far it got: killed mid-push, a rerun without ids would enqueue the first part twice.
    // A second one stops at once, the chunk in flight or not.
    let stop = if total > PUSH_CHUNK {
        Some(crate::signals::stop_on_term().map_err(|e| CliError::Runtime(e.into()))?)
    } else {
        None
    };
    let (mut created, mut cancelled) = (0usize, 0usize);
    let (mut ids, mut chains) = (Vec::new(), Vec::new());
    for (i, chunk) in tasks.chunks(PUSH_CHUNK).enumerate() {
        let sent = i * PUSH_CHUNK;
        if stop.as_ref().is_some_and(|s| s.first.is_cancelled()) {
            if show_progress {
                eprintln!();
            }
            return Err(CliError::Runtime(anyhow::anyhow!(
                "interrupted: {sent} of {total} tasks sent to {} ({created} enqueued, {} already pending); the other {} were not sent",
                args.queue,
                sent - created,
                total - sent
            )));
        }
        let at = PushAt {
            queue: &args.queue,
            total,
            sent,
            created,
            in_flight: chunk.len(),
        };
        let failed = |e| {
            if show_progress && total > 1 {
                eprintln!();
            }
            at.failed(e)
        };
        let done = match &stop {
            Some(s) => tokio::select! {
                done = q.enqueue_many(chunk) => done.map_err(failed)?,
                () = s.second.cancelled() => {
                    return Err(CliError::Runtime(anyhow::anyhow!(
                        "interrupted twice: stopped at once, {sent} of {total} tasks sent to {} before the {} in flight, which may or may not be enqueued",
                        args.queue,
                        chunk.len()
                    )));
                }
            },
            None => q.enqueue_many(chunk).await.map_err(failed)?,
        };
        created += done.iter().filter(|e| e.created).count();
        cancelled += done
            .iter()
            .filter(|e| e.state == Some(RecordState::Cancelled))
            .count();
        if total == 1 {
            chains = done.iter().filter_map(|e| e.chain.clone()).collect();
            ids = done.into_iter().map(|e| e.id).collect();
        }
        if show_progress {
            eprint!("\rpush: {}/{total}", ((i + 1) * PUSH_CHUNK).min(total));
        }
    }
    if show_progress {
        eprintln!();
    }
    if cancelled > 0 {
        eprintln!(
            "warning: the intake of queue {} is cancel: {cancelled} of these tasks were \
             recorded as cancelled and will not run",
            args.queue
        );
    }
    report(&args, total, created, &ids, &chains);
    Ok(())
}

/// What a push says it did; `chains`, for a single task, the chain its enqueue started.
fn report(args: &PushArgs, total: usize, created: usize, ids: &[String], chains: &[String]) {
    if args.json {
        let mut out = json!({"queue": args.queue, "tasks": total, "created": created,
                             "existing": total - created, "ids": ids});
        if !chains.is_empty() {
            out["chains"] = json!(chains);
        }
        println!("{out}");
    } else if total == 1 {
        let what = if created == 1 {
            "enqueued"
        } else {
            "already pending"
        };
        let chain = chains
            .first()
            .map(|c| format!(" (chain {c})"))
            .unwrap_or_default();
        println!(
            "{what}: {} task {}{chain}",
            args.queue,
            ids.first().map(String::as_str).unwrap_or("")
        );
    } else {
        println!(
            "enqueued {created} tasks to {} ({} already pending)",
            args.queue,
            total - created
        );
    }
}

/// How far a bulk push got when a chunk failed.
struct PushAt<'a> {
    queue: &'a str,
    total: usize,
    /// Tasks sent before the chunk that failed.
    sent: usize,
    /// Of those, the ones enqueued (the rest were pending already).
    created: usize,
    /// The failed chunk's tasks.
    in_flight: usize,
}

impl PushAt<'_> {
    /// The error of a failed chunk, saying how far the push got, as an interrupt does: a
    /// rerun without ids would enqueue what was sent twice (and a chunk goes in several
    /// calls, of which some may have been made). A refusal (found before any of its chunk
    /// is sent) stays bad usage.
    fn failed(&self, e: crate::queue_client::QueueError) -> CliError {
        use crate::queue_client::QueueError::{Invalid, PayloadTooLarge};
        let refused = matches!(e, Invalid(_) | PayloadTooLarge { .. });
        let PushAt {
            queue,
            total,
            sent,
            created,
            in_flight,
        } = *self;
        if total == 1 || (refused && sent == 0) {
            return e.into();
        }
        let rest = if refused {
            format!("the other {} were not sent", total - sent)
        } else {
            format!(
                "the {in_flight} in flight may or may not be enqueued, and the other {} were not sent",
                total - sent - in_flight
            )
        };
        let said = anyhow::anyhow!(
            "{e}: {sent} of {total} tasks sent to {queue} before ({created} enqueued, {} already pending); {rest}",
            sent - created,
        );
        if refused {
            CliError::Usage(format!("{said:#}"))
        } else {
            CliError::Runtime(said)
        }
    }
}
