//! `gaffer top`: the terminal dashboard.
//!
//! It reads only Redis (`cluster::snapshot`), so it works while the manager is down and
//! then says the lease is stale. The shape is input → [`Action`] → [`update`] → draw:
//! `update` is pure and returns an [`Effect`] for anything that touches the cluster, and
//! drawing is `impl Widget for &State`. One task owns the Redis connection: it reads a
//! snapshot every `refresh` and performs effects (a task lookup is one), reporting both
//! back as events; the UI loop never waits on Redis, so an unreachable server shows in
//! the status line while keys still work.
//!
//! It reads Redis only through `cluster::snapshot::read` (and `changed_config`) and, for
//! one task, `Queue::record`, returned as an `Effect::Lookup` by Enter in the lookup line
//! (it only reads, so it asks no confirmation). It writes only through `set_paused`,
//! `set_draining`, `set_intake` and `requeue_dead`, each returned as an `Effect` by the `y`
//! of a dialog (ARCHITECTURE.md, invariant 21). `tests.rs` renders every screen on a
//! `TestBackend` against snapshots in `snapshots/`.

mod input;
mod state;
#[cfg(test)]
mod tests;
mod view;

use std::io::IsTerminal;
use std::os::fd::OwnedFd;
use std::time::Duration;

use anyhow::Context;
use crossterm::event::EventStream;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::chain::ChainView;
use crate::cluster::snapshot::Snapshot;
use crate::cluster::{self, Keys, Published, now_ms};
use crate::config::Config;
use crate::queue_client::{ConnectOptions, QueueClient, QueueError, QueueLimits, TaskRecord};

pub use input::{KEYS, action_for, typing_action_for};
pub use state::{
    Action, Effect, Finder, Found, HISTORY, History, Note, Pending, QueueRow, RATE_WINDOW_MS,
    Rates, SortKey, State, TaskLookup, View, rates, update,
};

/// How long one read or one effect may take before it counts as failed: past this the
/// dashboard says so instead of showing an ever older read in silence.
const REDIS_LIMIT: Duration = Duration::from_secs(10);

/// What `gaffer top` needs.
#[derive(Debug, Clone)]
pub struct TopOptions {
    /// The validated config; a newer one published with `config apply` replaces it.
    pub cfg: Config,
    /// Where `cfg` came from, for the screen.
    pub config_label: String,
    /// Redis URL (may hold a password: it is never shown).
    pub url: String,
    /// Connect options (password file, timeouts).
    pub connect: ConnectOptions,
    /// How often to read Redis.
    pub refresh: Duration,
    /// Custom handler names of this binary, to parse published configs that use them.
    pub custom_handlers: Vec<String>,
}

/// Why the Redis side has no answer for the UI: Redis (or the client) failed, or did not
/// answer in time. Its message is what the dashboard shows, free of secrets (the client's
/// errors show the URL redacted).
#[derive(Debug, thiserror::Error)]
enum RedisSideError {
    /// Redis or the queue client failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// No answer within [`REDIS_LIMIT`].
    #[error("redis: no answer within {}s", REDIS_LIMIT.as_secs())]
    Late,
}

/// Everything the UI loop waits for.
enum Event {
    /// A second passed: ages on screen move on.
    Tick,
    /// A terminal event (key, resize).
    Input(crossterm::event::Event),
    /// A read of the cluster with the label of the config used, or why it failed.
    Snapshot(Result<(Box<Snapshot>, String), RedisSideError>),
    /// An effect finished: its answer, as the action that reports it.
    EffectDone(Action),
    /// Shutdown was asked for (the binary's edge cancels the token on SIGTERM or SIGINT),
    /// or the terminal went away.
    Terminate,
}

/// How many actions may wait for the Redis side before another is refused as busy.
const EFFECTS_QUEUED: usize = 8;

/// Runs the dashboard until q, Ctrl-C or `shutdown` is cancelled; the terminal is restored
/// on every exit, a panic included. The caller owns the signal handlers: the binary hands
/// a token that SIGTERM and SIGINT cancel.
pub async fn run(opts: TopOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        anyhow::bail!(
            "gaffer top needs a terminal on stdout; `gaffer stats` (or `stats --json`) reads once"
        );
    }
    // A read takes a few round trips; below this, refreshing would only load Redis.
    let refresh = opts.refresh.max(Duration::from_millis(100));
    // Keys typed while an action runs queue up in order (a lookup pressed twice, a pause
    // confirmed while a read is slow); only a burst beyond this is refused as busy.
    let (effects_tx, effects_rx) = mpsc::channel(EFFECTS_QUEUED);
    let (events_tx, events_rx) = mpsc::channel(4);
    let redis = tokio::spawn(redis_side(opts, refresh, effects_rx, events_tx));

    let quiet = StderrSilenced::start();
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            ratatui::restore();
            drop(quiet);
            redis.abort();
            return Err(e).context("cannot set up the terminal");
        }
    };
    if let Some(q) = &quiet {
        q.restore_on_panic();
    }
    let result = ui_loop(&mut terminal, refresh, effects_tx, events_rx, shutdown).await;
    ratatui::restore();
    drop(quiet);
    redis.abort();
    result
}

async fn ui_loop(
    terminal: &mut ratatui::DefaultTerminal,
    refresh: Duration,
    effects: mpsc::Sender<Effect>,
    mut events: mpsc::Receiver<Event>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut state = State::new(refresh);
    state.now_ms = now_ms();
    let mut input = EventStream::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        terminal.draw(|frame| frame.render_widget(&state, frame.area()))?;
        let event = tokio::select! {
            _ = tick.tick() => Event::Tick,
            ev = input.next() => match ev {
                Some(Ok(ev)) => Event::Input(ev),
                Some(Err(e)) => return Err(e).context("reading the terminal"),
                None => Event::Terminate,
            },
            Some(ev) = events.recv() => ev,
            () = shutdown.cancelled() => Event::Terminate,
        };
        let action = match event {
            Event::Tick => Some(Action::Tick { now_ms: now_ms() }),
            Event::Input(crossterm::event::Event::Key(key)) if state.typing() => {
                typing_action_for(key)
            }
            Event::Input(crossterm::event::Event::Key(key)) => action_for(key),
            // A resize only needs the redraw at the top of the loop.
            Event::Input(_) => None,
            Event::Snapshot(Ok((snapshot, config))) => Some(Action::Snapshot { snapshot, config }),
            Event::Snapshot(Err(error)) => Some(Action::ReadFailed {
                error: error.to_string(),
            }),
            Event::EffectDone(action) => Some(action),
            Event::Terminate => Some(Action::Quit),
        };
        let Some(action) = action else { continue };
        let Some(effect) = update(&mut state, action) else {
            continue;
        };
        if effect == Effect::Quit {
            return Ok(());
        }
        // Effects run one at a time in order; a full queue means Redis is far behind.
        if let Err(e) = effects.try_send(effect) {
            let busy = "still busy with earlier actions; try again".to_string();
            update(&mut state, e.into_inner().failed(busy));
        }
    }
}

/// The one owner of the Redis connection: reads every `refresh` (and at once after an
/// effect), connects again when it has to, and never gives up.
async fn redis_side(
    opts: TopOptions,
    refresh: Duration,
    mut effects: mpsc::Receiver<Effect>,
    events: mpsc::Sender<Event>,
) {
    let mut client: Option<QueueClient> = None;
    let mut cfg = opts.cfg.clone();
    let mut label = opts.config_label.clone();
    let mut seen = cluster::ConfigSeen::default();
    let keys = Keys::new(&opts.cfg.cluster.namespace);
    loop {
        let read = tokio::time::timeout(REDIS_LIMIT, async {
            let c = connected(&mut client, &opts).await?;
            let mut conn = c.connection();
            // A config published with `config apply` may name queues the file lacks.
            let read = cluster::changed_config(&mut conn, &keys, &seen, &opts.custom_handlers);
            let read = read.await?;
            seen = read.seen;
            match read.changed {
                Some(Published {
                    version,
                    config: Ok(newer),
                    ..
                }) => {
                    cfg = newer;
                    label = format!("published v{version}");
                }
                Some(Published { version, .. }) => {
                    label = format!(
                        "{} (published v{version} does not parse in this binary)",
                        opts.config_label
                    );
                }
                None => {}
            }
            let snap = cluster::snapshot::read(c, &cfg).await?;
            Ok::<_, RedisSideError>((Box::new(snap), label.clone()))
        })
        .await
        .unwrap_or(Err(RedisSideError::Late));
        if events.send(Event::Snapshot(read)).await.is_err() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(refresh) => {}
            effect = effects.recv() => {
                let Some(effect) = effect else { return };
                let done = tokio::time::timeout(
                    REDIS_LIMIT,
                    perform(&mut client, &opts, &cfg, &keys, effect.clone()),
                )
                .await
                .unwrap_or_else(|_| effect.failed(RedisSideError::Late.to_string()));
                if events.send(Event::EffectDone(done)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The client, connecting first if there is none yet (Redis was down so far).
async fn connected<'a>(
    client: &'a mut Option<QueueClient>,
    opts: &TopOptions,
) -> Result<&'a QueueClient, QueueError> {
    let c = match client.take() {
        Some(c) => c,
        // The errors of `connect` show the URL redacted.
        None => QueueClient::connect(&opts.url, &opts.cfg.cluster.namespace, &opts.connect).await?,
    };
    Ok(client.insert(c))
}

/// Performs an effect; the answer comes back as the action that reports it.
async fn perform(
    client: &mut Option<QueueClient>,
    opts: &TopOptions,
    cfg: &Config,
    keys: &Keys,
    effect: Effect,
) -> Action {
    match effect {
        Effect::Lookup { queue, id } => {
            let (result, chain) = match lookup(client, opts, cfg, &queue, &id).await {
                Ok((record, chain)) => (Ok(record), chain),
                Err(e) => (Err(e.to_string()), None),
            };
            Action::LookedUp {
                queue,
                id,
                result,
                chain,
            }
        }
        other => Action::EffectDone(
            change(client, opts, cfg, keys, other)
                .await
                .map_err(|e| e.to_string()),
        ),
    }
}

/// A found record and its chain, when it is in one.
type Lookup = (Option<Box<TaskRecord>>, Option<Box<ChainView>>);

/// One task's record with its history (None when it has none), and its chain with its
/// tasks' states when it is in one.
async fn lookup(
    client: &mut Option<QueueClient>,
    opts: &TopOptions,
    cfg: &Config,
    queue: &str,
    id: &str,
) -> Result<Lookup, QueueError> {
    let c = connected(client, opts).await?;
    let limits = cfg
        .queues
        .get(queue)
        .map(QueueLimits::from)
        .unwrap_or_default();
    let record = c.queue_with(queue, limits)?.record(id).await?;
    let chain = match record.as_ref().and_then(|r| r.chain.as_deref()) {
        Some(g) => {
            let targets = crate::chain::ChainTargets::from_config(cfg);
            crate::chain::read(c, &targets, g).await?.map(Box::new)
        }
        None => None,
    };
    Ok((record.map(Box::new), chain))
}

/// Performs an effect that changes the cluster: what it did, or why it failed.
async fn change(
    client: &mut Option<QueueClient>,
    opts: &TopOptions,
    cfg: &Config,
    keys: &Keys,
    effect: Effect,
) -> Result<String, QueueError> {
    let c = connected(client, opts).await?;
    let mut conn = c.connection();
    Ok(match effect {
        Effect::Pause { queue, paused } => {
            let changed = cluster::set_paused(&mut conn, keys, &queue, paused).await?;
            let what = if paused { "paused" } else { "resumed" };
            format!("{queue} {what}{}", already(changed))
        }
        Effect::Drain { host, draining } => {
            let changed = cluster::set_draining(&mut conn, keys, &host, draining).await?;
            let what = if draining {
                "is draining"
            } else {
                "takes slots again"
            };
            format!("{host} {what}{}", already(changed))
        }
        Effect::SetIntake { queue, intake } => {
            let limits = cfg
                .queues
                .get(&queue)
                .map(QueueLimits::from)
                .unwrap_or_default();
            c.queue_with(&queue, limits)?
                .set_intake(Some(intake))
                .await?;
            format!("intake of {queue}: {}", intake.as_str())
        }
        Effect::RequeueDead { queue } => {
            let limits = cfg
                .queues
                .get(&queue)
                .map(QueueLimits::from)
                .unwrap_or_default();
            let n = c.queue_with(&queue, limits)?.requeue_dead(None).await?;
            format!("requeued {n} dead letters of {queue}")
        }
        // Answered by `perform` itself.
        Effect::Lookup { .. } | Effect::Quit => String::new(),
    })
}

/// The note's tail when a pause or drain asked for what already was.
fn already(changed: bool) -> &'static str {
    if changed { "" } else { " (already)" }
}

/// Stderr pointed at /dev/null while the dashboard owns the terminal: a log line written
/// there (a library's warning) would scribble over the screen. Given back on drop, and
/// before a panic message is printed.
struct StderrSilenced {
    saved: OwnedFd,
}

impl StderrSilenced {
    /// Silences stderr if it is a terminal; a redirected stderr keeps its lines.
    fn start() -> Option<Self> {
        if !std::io::stderr().is_terminal() {
            return None;
        }
        let saved = nix::unistd::dup(std::io::stderr()).ok()?;
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .ok()?;
        nix::unistd::dup2_stderr(&null).ok()?;
        Some(StderrSilenced { saved })
    }

    /// Chains a panic hook that gives stderr back before the hooks installed earlier run
    /// (ratatui's restores the screen, the default one prints the message).
    fn restore_on_panic(&self) {
        let Ok(saved) = self.saved.try_clone() else {
            return;
        };
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = nix::unistd::dup2_stderr(&saved);
            previous(info);
        }));
    }
}

impl Drop for StderrSilenced {
    fn drop(&mut self) {
        let _ = nix::unistd::dup2_stderr(&self.saved);
    }
}
