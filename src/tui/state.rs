//! The dashboard's state and its one transition, `update(&mut State, Action) ->
//! Option<Effect>`: pure, no I/O and no clock (time arrives in actions and snapshots), so
//! every screen can be rebuilt in a test from fixed data.
//!
//! It keeps the last 120 snapshots, rates from counter deltas between them, and the task
//! lookup line with its answer.

use std::collections::VecDeque;
use std::time::Duration;

use crate::chain::ChainView;
use crate::cluster::snapshot::{HostView, QueueView, Snapshot, SystemView};
use crate::queue_client::{MAX_ID_LEN, TaskRecord};

/// Snapshots kept for rates, averages and sparklines.
pub const HISTORY: usize = 120;

/// Rates are taken over the newest snapshots spanning at most this long (or the last two):
/// between two reads alone a rate jumps with every batch boundary.
pub const RATE_WINDOW_MS: u64 = 10_000;

/// Which way ↑ and ↓ move a selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Towards the top (↑).
    Up,
    /// Towards the bottom (↓).
    Down,
}

/// The screens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// One row per queue.
    Queues,
    /// Hosts × queues, with each host's memory, load and state.
    SlotMap,
    /// The selected queue, with history.
    QueueDetail,
    /// The selected host, with history.
    HostDetail,
    /// One task's record, looked up by id ([`State::task`]).
    Task,
    /// One row per external system: its state, queues, caps and use.
    Systems,
}

/// Columns the queues table sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    /// Queue name, A first.
    Name,
    /// Config priority, highest first.
    Priority,
    /// The manager's load, highest first.
    Load,
    /// Ready tasks, most first.
    Ready,
    /// Dead letters, most first.
    Dead,
    /// Tasks done per second, most first.
    Done,
    /// Failed attempts per second, most first.
    Errors,
    /// Slots running now, most first.
    Slots,
}

impl SortKey {
    /// The order `s` cycles through.
    pub const CYCLE: [SortKey; 8] = [
        SortKey::Name,
        SortKey::Priority,
        SortKey::Load,
        SortKey::Ready,
        SortKey::Dead,
        SortKey::Done,
        SortKey::Errors,
        SortKey::Slots,
    ];

    /// The key after this one.
    pub fn next(self) -> SortKey {
        let i = Self::CYCLE.iter().position(|k| *k == self).unwrap_or(0);
        Self::CYCLE[(i + 1) % Self::CYCLE.len()]
    }

    /// Name shown in the title.
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Name => "name",
            SortKey::Priority => "priority",
            SortKey::Load => "load",
            SortKey::Ready => "ready",
            SortKey::Dead => "dead",
            SortKey::Done => "done/s",
            SortKey::Errors => "errors/s",
            SortKey::Slots => "slots",
        }
    }
}

/// Everything that can happen to the dashboard: keys (already decoded), reads, time.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Time passed; `now_ms` is the wall clock (ms since the epoch).
    Tick {
        /// Wall-clock ms.
        now_ms: u64,
    },
    /// A good read of the cluster.
    Snapshot {
        /// What was read.
        snapshot: Box<Snapshot>,
        /// Where the queue list came from ("config.toml", "published v3").
        config: String,
    },
    /// A read failed; the last good one stays on screen.
    ReadFailed {
        /// Why (already free of secrets).
        error: String,
    },
    /// An effect finished: what it did, or why it failed.
    EffectDone(Result<String, String>),
    /// A task lookup answered: the record (None: no record), or why it failed.
    LookedUp {
        /// The queue looked in.
        queue: String,
        /// The id looked up.
        id: String,
        /// What Redis said.
        result: Result<Option<Box<TaskRecord>>, String>,
        /// The task's chain, when it is in one.
        chain: Option<Box<ChainView>>,
    },
    /// Tab: the other list view.
    NextView,
    /// 1: the queues table.
    ShowQueues,
    /// 2: the slot map.
    ShowSlotMap,
    /// 3: the external systems.
    ShowSystems,
    /// k / ↑.
    Up,
    /// j / ↓.
    Down,
    /// h / ←: earlier queue columns of the slot map.
    Left,
    /// l / →: later queue columns of the slot map.
    Right,
    /// Enter: detail of the selected row.
    Open,
    /// Esc: close the dialog or help, or back from a detail.
    Back,
    /// s: next sort column.
    Sort,
    /// S: reverse the sort.
    ReverseSort,
    /// p: pause or resume the selected queue (asks first).
    Pause,
    /// d: drain or undrain the selected host (asks first).
    Drain,
    /// r: requeue the selected queue's dead letters (asks first).
    Requeue,
    /// i: switch the selected queue's intake to the next of open, closed, cancel (asks
    /// first).
    Intake,
    /// y: do what the dialog asks.
    Confirm,
    /// n: don't.
    Cancel,
    /// ?: show or hide the keys.
    Help,
    /// /: open the task lookup line.
    Find,
    /// A character typed into the lookup line.
    Type(char),
    /// Backspace in the lookup line.
    Erase,
    /// q / Ctrl-C.
    Quit,
}

/// A side effect `update` asks the async loop to perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Pause (`true`) or resume a queue.
    Pause {
        /// The queue.
        queue: String,
        /// Pause or resume.
        paused: bool,
    },
    /// Drain (`true`) or undrain a host.
    Drain {
        /// The host.
        host: String,
        /// Drain or undrain.
        draining: bool,
    },
    /// Switch a queue's intake at run time.
    SetIntake {
        /// The queue.
        queue: String,
        /// What it becomes.
        intake: crate::config::Intake,
    },
    /// Requeue every dead letter of a queue.
    RequeueDead {
        /// The queue.
        queue: String,
    },
    /// Read one task's record (it changes nothing, so it asks no confirmation).
    Lookup {
        /// The queue.
        queue: String,
        /// The task id.
        id: String,
    },
    /// Leave the dashboard.
    Quit,
}

impl Effect {
    /// The action that reports this effect as failed with `error`: how the loop answers
    /// an effect it could not perform (still busy with the last one, or no answer in
    /// time).
    pub fn failed(self, error: String) -> Action {
        match self {
            Effect::Lookup { queue, id } => Action::LookedUp {
                queue,
                id,
                result: Err(error),
                chain: None,
            },
            Effect::Pause { .. }
            | Effect::SetIntake { .. }
            | Effect::Drain { .. }
            | Effect::RequeueDead { .. }
            | Effect::Quit => Action::EffectDone(Err(error)),
        }
    }
}

/// The task lookup's input line, open while an id is typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finder {
    /// The queue to look in: the selected one at first, ↑ ↓ Tab choose another.
    pub queue: String,
    /// The id typed so far.
    pub id: String,
}

/// What a task lookup found.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// Asked; no answer yet.
    Waiting,
    /// The record, with its history.
    Record(Box<TaskRecord>),
    /// No record: an unknown id, a record past its `history_ttl`, or a queue that does
    /// not track.
    Nothing,
    /// Redis failed; the error (free of secrets).
    Failed(String),
}

/// The task view: one lookup and its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskLookup {
    /// The queue looked in.
    pub queue: String,
    /// The id looked up.
    pub id: String,
    /// The answer, once there is one.
    pub found: Found,
    /// The first history entry shown.
    pub scroll: usize,
    /// The task's chain with its tasks' states, when it is in one.
    pub chain: Option<Box<ChainView>>,
    /// The view Esc goes back to.
    pub back: View,
}

/// An effect waiting for y / n.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// What the dialog asks.
    pub question: String,
    /// What y does.
    pub effect: Effect,
}

/// A line for the status bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The text.
    pub text: String,
    /// Shown in red.
    pub error: bool,
}

/// The last [`HISTORY`] snapshots, oldest first.
#[derive(Debug, Clone, Default)]
pub struct History {
    snaps: VecDeque<Snapshot>,
}

impl History {
    /// Adds a read, dropping the oldest beyond [`HISTORY`].
    pub fn push(&mut self, snap: Snapshot) {
        if self.snaps.len() == HISTORY {
            self.snaps.pop_front();
        }
        self.snaps.push_back(snap);
    }

    /// The newest read.
    pub fn latest(&self) -> Option<&Snapshot> {
        self.snaps.back()
    }

    /// Oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Snapshot> + ExactSizeIterator {
        self.snaps.iter()
    }

    /// Reads kept.
    pub fn len(&self) -> usize {
        self.snaps.len()
    }

    /// No read yet.
    pub fn is_empty(&self) -> bool {
        self.snaps.is_empty()
    }

    /// The read rates start from: the oldest within [`RATE_WINDOW_MS`] of the newest, or
    /// the one before the newest.
    fn base(&self) -> Option<&Snapshot> {
        let latest = self.latest()?;
        let n = self.snaps.len();
        if n < 2 {
            return None;
        }
        self.snaps
            .iter()
            .take(n - 1)
            .find(|s| latest.at_ms.saturating_sub(s.at_ms) <= RATE_WINDOW_MS)
            .or_else(|| self.snaps.get(n - 2))
    }
}

/// Figures derived from two reads of one queue; None where a counter went backwards
/// (a master restarted or died) or no time passed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    /// Acks per second.
    pub done_per_s: Option<f64>,
    /// Retries plus dead letters per second: attempts that did not end in done.
    pub errors_per_s: Option<f64>,
    /// Handler seconds per task processed.
    pub mean_task_s: Option<f64>,
}

/// The rates of a queue between two reads `dt_ms` apart.
pub fn rates(old: &QueueView, new: &QueueView, dt_ms: u64) -> Rates {
    if dt_ms == 0 {
        return Rates::default();
    }
    let secs = dt_ms as f64 / 1000.0;
    let per_s = |a: u64, b: u64| b.checked_sub(a).map(|d| d as f64 / secs);
    let errors = |q: &QueueView| q.stats.retried_total + q.stats.dead_total;
    let processed = new.processed_total.checked_sub(old.processed_total);
    let busy = new.busy_seconds_total - old.busy_seconds_total;
    Rates {
        done_per_s: per_s(old.stats.acked_total, new.stats.acked_total),
        errors_per_s: per_s(errors(old), errors(new)),
        mean_task_s: match processed {
            Some(n) if n > 0 && busy >= 0.0 => Some(busy / n as f64),
            _ => None,
        },
    }
}

/// One row of the systems table: the latest read and the rate in use over the window.
#[derive(Debug, Clone)]
pub struct SystemRow<'a> {
    /// The system.
    pub name: &'a str,
    /// Its latest read.
    pub view: &'a SystemView,
    /// Tasks its bucket let start per second over the rate window (systems with a rate).
    pub started_per_s: Option<f64>,
}

/// One row of the queues table, everything computed.
#[derive(Debug, Clone)]
pub struct QueueRow<'a> {
    /// The queue.
    pub name: &'a str,
    /// Its latest read.
    pub view: &'a QueueView,
    /// Slots the manager wants (its last decision).
    pub wanted: Option<u32>,
    /// Mean of the running slots over the history.
    pub slots_avg: f64,
    /// The manager's load (1.0 = 100 %).
    pub load: Option<f64>,
    /// Over the rate window.
    pub rates: Rates,
}

/// The dashboard.
#[derive(Debug, Clone)]
pub struct State {
    /// The screen shown.
    pub view: View,
    /// Recent reads.
    pub history: History,
    /// Where the queue list came from.
    pub config: String,
    /// How often Redis is read.
    pub refresh: Duration,
    /// Wall clock of the last tick.
    pub now_ms: u64,
    /// The selected queue, by name so it survives re-sorting.
    pub queue: Option<String>,
    /// The selected host.
    pub host: Option<String>,
    /// Queues table order.
    pub sort: SortKey,
    /// Sort the other way.
    pub reverse: bool,
    /// First queue column shown in the slot map.
    pub map_column: usize,
    /// The help overlay is open.
    pub help: bool,
    /// A dialog waiting for y / n.
    pub pending: Option<Pending>,
    /// The task lookup line, while it is open: keys type into it.
    pub finder: Option<Finder>,
    /// The last task looked up, shown by [`View::Task`].
    pub task: Option<TaskLookup>,
    /// The last read failed with this; cleared by a good read.
    pub read_error: Option<String>,
    /// The outcome of the last action.
    pub note: Option<Note>,
}

impl State {
    /// An empty dashboard that reads every `refresh`.
    pub fn new(refresh: Duration) -> Self {
        State {
            view: View::Queues,
            history: History::default(),
            config: String::new(),
            refresh,
            now_ms: 0,
            queue: None,
            host: None,
            sort: SortKey::Name,
            reverse: false,
            map_column: 0,
            help: false,
            pending: None,
            finder: None,
            task: None,
            read_error: None,
            note: None,
        }
    }

    /// The systems table, by name.
    pub fn system_rows(&self) -> Vec<SystemRow<'_>> {
        let Some(latest) = self.history.latest() else {
            return Vec::new();
        };
        let base = self.history.base();
        latest
            .systems
            .iter()
            .map(|(name, view)| {
                let started_per_s = base
                    .and_then(|b| {
                        let old = b.systems.get(name)?;
                        let dt = latest.at_ms.checked_sub(b.at_ms).filter(|d| *d > 0)?;
                        let d = view.started_total.checked_sub(old.started_total)?;
                        Some(d as f64 * 1000.0 / dt as f64)
                    })
                    .filter(|_| view.rate_per_second.is_some());
                SystemRow {
                    name,
                    view,
                    started_per_s,
                }
            })
            .collect()
    }

    /// The queues table, sorted.
    pub fn queue_rows(&self) -> Vec<QueueRow<'_>> {
        let Some(latest) = self.history.latest() else {
            return Vec::new();
        };
        let base = self.history.base();
        let mut rows: Vec<QueueRow<'_>> = latest
            .queues
            .iter()
            .map(|(name, view)| {
                let (mut sum, mut n) = (0u64, 0u64);
                for s in self.history.iter() {
                    if let Some(q) = s.queues.get(name) {
                        sum += u64::from(q.slots);
                        n += 1;
                    }
                }
                let rates = base
                    .and_then(|b| Some((b.queues.get(name)?, latest.at_ms.checked_sub(b.at_ms)?)))
                    .map_or_else(Rates::default, |(old, dt)| rates(old, view, dt));
                QueueRow {
                    name,
                    view,
                    wanted: view.decision.as_ref().map(|d| d.wanted),
                    slots_avg: if n == 0 { 0.0 } else { sum as f64 / n as f64 },
                    load: view.decision.as_ref().and_then(|d| d.load),
                    rates,
                }
            })
            .collect();
        let key = self.sort;
        let num = |v: Option<f64>| v.unwrap_or(f64::NEG_INFINITY);
        rows.sort_by(|a, b| {
            let by = match key {
                SortKey::Name => a.name.cmp(b.name),
                SortKey::Priority => b.view.priority.cmp(&a.view.priority),
                SortKey::Load => num(b.load).total_cmp(&num(a.load)),
                SortKey::Ready => b.view.stats.ready.cmp(&a.view.stats.ready),
                SortKey::Dead => b.view.stats.dead.cmp(&a.view.stats.dead),
                SortKey::Done => num(b.rates.done_per_s).total_cmp(&num(a.rates.done_per_s)),
                SortKey::Errors => num(b.rates.errors_per_s).total_cmp(&num(a.rates.errors_per_s)),
                SortKey::Slots => b.view.slots.cmp(&a.view.slots),
            };
            // Ties fall back to the name so equal rows never swap between refreshes.
            let by = by.then_with(|| a.name.cmp(b.name));
            if self.reverse { by.reverse() } else { by }
        });
        rows
    }

    /// Hosts in map order (by name).
    pub fn host_names(&self) -> Vec<&str> {
        self.history
            .latest()
            .map(|s| s.hosts.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Index of the selected queue in `queue_rows()`.
    pub fn queue_index(&self, rows: &[QueueRow<'_>]) -> usize {
        self.queue
            .as_deref()
            .and_then(|q| rows.iter().position(|r| r.name == q))
            .unwrap_or(0)
    }

    /// Index of the selected host in `host_names()`.
    pub fn host_index(&self, hosts: &[&str]) -> usize {
        self.host
            .as_deref()
            .and_then(|h| hosts.iter().position(|n| *n == h))
            .unwrap_or(0)
    }

    /// The selected queue's name and latest read, if there is one.
    pub fn selected_queue(&self) -> Option<(&str, &QueueView)> {
        let rows = self.queue_rows();
        let i = self.queue_index(&rows);
        let name = rows.get(i)?.name;
        let latest = self.history.latest()?;
        latest
            .queues
            .get_key_value(name)
            .map(|(k, v)| (k.as_str(), v))
    }

    /// The selected host's name and latest read, if there is one.
    pub fn selected_host(&self) -> Option<(&str, &HostView)> {
        let hosts = self.host_names();
        let name = *hosts.get(self.host_index(&hosts))?;
        self.history
            .latest()?
            .hosts
            .get_key_value(name)
            .map(|(k, v)| (k.as_str(), v))
    }

    /// Queue names in slot-map column order.
    pub fn map_queue_names(&self) -> Vec<&str> {
        self.history
            .latest()
            .map(|s| s.queues.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Whether keys type into the lookup line (the loop then maps them with
    /// `input::typing_action_for`).
    pub fn typing(&self) -> bool {
        self.finder.is_some()
    }

    /// The queue a new lookup starts in: the task view's, else the selected one.
    fn lookup_queue(&self) -> Option<String> {
        if self.view == View::Task
            && let Some(t) = &self.task
        {
            return Some(t.queue.clone());
        }
        self.selected_queue().map(|(name, _)| name.to_string())
    }

    /// The queue before or after `queue` in the queues table's order, wrapping round.
    fn other_queue(&self, queue: &str, way: Direction) -> Option<String> {
        let rows = self.queue_rows();
        let n = rows.len();
        if n == 0 {
            return None;
        }
        let i = rows.iter().position(|r| r.name == queue);
        let j = match (i, way) {
            (None, _) => 0,
            (Some(i), Direction::Down) => (i + 1) % n,
            (Some(i), Direction::Up) => (i + n - 1) % n,
        };
        Some(rows[j].name.to_string())
    }

    /// The view the task view goes back to, or the view itself.
    pub fn base_view(&self) -> View {
        match (self.view, &self.task) {
            (View::Task, Some(t)) => t.back,
            (View::Task, None) => View::Queues,
            (v, _) => v,
        }
    }

    fn move_selection(&mut self, way: Direction) {
        let step = |i: usize, n: usize| match way {
            Direction::Down => (i + 1).min(n.saturating_sub(1)),
            Direction::Up => i.saturating_sub(1),
        };
        match self.view {
            View::Queues | View::QueueDetail => {
                let rows = self.queue_rows();
                if rows.is_empty() {
                    return;
                }
                let i = step(self.queue_index(&rows), rows.len());
                self.queue = Some(rows[i].name.to_string());
            }
            View::SlotMap | View::HostDetail => {
                let hosts = self.host_names();
                if hosts.is_empty() {
                    return;
                }
                let i = step(self.host_index(&hosts), hosts.len());
                self.host = Some(hosts[i].to_string());
            }
            View::Systems => {}
            View::Task => {
                if let Some(t) = &mut self.task {
                    let n = match &t.found {
                        Found::Record(r) => r.history.as_ref().map_or(0, Vec::len),
                        _ => 0,
                    };
                    t.scroll = step(t.scroll, n);
                }
            }
        }
    }

    fn ask(&mut self, question: String, effect: Effect) {
        self.pending = Some(Pending { question, effect });
    }

    fn say(&mut self, text: impl Into<String>) {
        self.note = Some(Note {
            text: text.into(),
            error: false,
        });
    }
}

/// Applies one action; returns the side effect to perform, if any. Effects that change
/// the cluster are only returned by [`Action::Confirm`] of a dialog opened earlier; a
/// lookup, which only reads, by Enter in the lookup line or the task view.
pub fn update(state: &mut State, action: Action) -> Option<Effect> {
    // News from outside (time, reads, answers) and quitting never wait behind a dialog,
    // the help or the lookup line; keys do.
    match action {
        Action::Tick { now_ms } => state.now_ms = now_ms,
        Action::Snapshot { snapshot, config } => record_read(state, *snapshot, config),
        Action::ReadFailed { error } => state.read_error = Some(error),
        Action::EffectDone(result) => effect_done(state, result),
        Action::LookedUp {
            queue,
            id,
            result,
            chain,
        } => looked_up(
            state,
            Looked {
                queue,
                id,
                result,
                chain,
            },
        ),
        Action::Quit => return Some(Effect::Quit),
        key => return press(state, key),
    }
    None
}

/// A good read: kept in the history, and it clears a read error.
fn record_read(state: &mut State, snapshot: Snapshot, config: String) {
    state.now_ms = state.now_ms.max(snapshot.at_ms);
    state.history.push(snapshot);
    state.config = config;
    state.read_error = None;
}

/// What an effect did, or why it failed, in the status line.
fn effect_done(state: &mut State, result: Result<String, String>) {
    state.note = Some(match result {
        Ok(text) => Note { text, error: false },
        Err(text) => Note { text, error: true },
    });
}

/// A key, in order: it answers an open dialog, or closes the help, or types into the
/// lookup line, or acts on the view.
fn press(state: &mut State, action: Action) -> Option<Effect> {
    if let Some(pending) = state.pending.take() {
        return answer(state, pending, action);
    }
    if state.help {
        if matches!(action, Action::Help | Action::Back) {
            state.help = false;
        }
        return None;
    }
    state.note = None;
    if let Some(finder) = state.finder.take() {
        return type_into(state, finder, action);
    }
    act(state, action)
}

/// A key while a dialog asks: y performs its effect, n or Esc cancels.
fn answer(state: &mut State, pending: Pending, action: Action) -> Option<Effect> {
    match action {
        Action::Confirm => return Some(pending.effect),
        Action::Cancel | Action::Back => state.say("cancelled"),
        // Anything else leaves the question open: a stray key must not act.
        _ => state.pending = Some(pending),
    }
    None
}

/// A key on the view, with no dialog, help or lookup line open.
fn act(state: &mut State, action: Action) -> Option<Effect> {
    match action {
        Action::NextView => next_view(state),
        Action::ShowQueues => state.view = View::Queues,
        Action::ShowSlotMap => state.view = View::SlotMap,
        Action::ShowSystems => state.view = View::Systems,
        Action::Up => state.move_selection(Direction::Up),
        Action::Down => state.move_selection(Direction::Down),
        Action::Left => state.map_column = state.map_column.saturating_sub(1),
        Action::Right => {
            let n = state.map_queue_names().len();
            state.map_column = (state.map_column + 1).min(n.saturating_sub(1));
        }
        Action::Open => return open(state),
        Action::Back => back(state),
        Action::Sort => state.sort = state.sort.next(),
        Action::ReverseSort => state.reverse = !state.reverse,
        Action::Pause => ask_pause(state),
        Action::Drain => ask_drain(state),
        Action::Requeue => ask_requeue(state),
        Action::Intake => ask_intake(state),
        Action::Help => state.help = true,
        Action::Find => open_finder(state),
        // Only the lookup line takes text.
        Action::Type(_) | Action::Erase => {}
        // Without a dialog there is nothing to answer.
        Action::Confirm | Action::Cancel => {}
        // Handled by `update` before any key.
        Action::Tick { .. }
        | Action::Snapshot { .. }
        | Action::ReadFailed { .. }
        | Action::EffectDone(_)
        | Action::LookedUp { .. }
        | Action::Quit => {}
    }
    None
}

/// Tab: the other list view (the task view counts as the one it came from).
fn next_view(state: &mut State) {
    state.view = match state.base_view() {
        View::Queues | View::QueueDetail => View::SlotMap,
        View::SlotMap | View::HostDetail | View::Task if has_systems(state) => View::Systems,
        View::SlotMap | View::HostDetail | View::Task | View::Systems => View::Queues,
    };
}

/// Whether the latest read has external systems (the systems view is in the Tab cycle).
fn has_systems(state: &State) -> bool {
    state
        .history
        .latest()
        .is_some_and(|s| !s.systems.is_empty())
}

/// Enter: the detail of the selected row, or the task view's record read anew.
fn open(state: &mut State) -> Option<Effect> {
    match state.view {
        View::Queues => {
            if let Some((name, _)) = state.selected_queue() {
                state.queue = Some(name.to_string());
                state.view = View::QueueDetail;
            }
        }
        View::SlotMap => {
            if let Some((name, _)) = state.selected_host() {
                state.host = Some(name.to_string());
                state.view = View::HostDetail;
            }
        }
        View::QueueDetail | View::HostDetail | View::Systems => {}
        // Enter again: read the record anew.
        View::Task => {
            if let Some(t) = &state.task {
                return Some(Effect::Lookup {
                    queue: t.queue.clone(),
                    id: t.id.clone(),
                });
            }
        }
    }
    None
}

/// Esc: from a detail back to its list, from the task view back where the lookup began.
fn back(state: &mut State) {
    match state.view {
        View::QueueDetail => state.view = View::Queues,
        View::HostDetail => state.view = View::SlotMap,
        View::Task => state.view = state.base_view(),
        View::Queues | View::SlotMap | View::Systems => {}
    }
}

/// p: asks to pause the selected queue, or to resume it.
fn ask_pause(state: &mut State) {
    match state.view {
        View::Queues | View::QueueDetail => {
            if let Some((name, q)) = state.selected_queue() {
                let (name, paused) = (name.to_string(), !q.paused);
                let question = if paused {
                    format!("Pause queue {name}? The manager gives it no slots; tasks wait.")
                } else {
                    format!("Resume queue {name}?")
                };
                state.ask(
                    question,
                    Effect::Pause {
                        queue: name,
                        paused,
                    },
                );
            }
        }
        View::SlotMap | View::HostDetail | View::Task | View::Systems => {
            state.say("p pauses a queue: switch to the queues view (1)");
        }
    }
}

/// d: asks to drain the selected host, or to stop draining it.
fn ask_drain(state: &mut State) {
    match state.view {
        View::SlotMap | View::HostDetail => {
            if let Some((name, h)) = state.selected_host() {
                let (name, draining) = (name.to_string(), !h.drain_requested);
                let question = if draining {
                    format!("Drain host {name}? Its slots move to other hosts.")
                } else {
                    format!("Stop draining host {name}? It takes slots again.")
                };
                state.ask(
                    question,
                    Effect::Drain {
                        host: name,
                        draining,
                    },
                );
            }
        }
        View::Queues | View::QueueDetail | View::Task | View::Systems => {
            state.say("d drains a host: switch to the slot map (2)");
        }
    }
}

/// r: asks to requeue the selected queue's dead letters, if it has any.
fn ask_requeue(state: &mut State) {
    match state.view {
        View::Queues | View::QueueDetail => {
            if let Some((name, q)) = state.selected_queue() {
                let (name, dead) = (name.to_string(), q.stats.dead);
                if dead == 0 {
                    state.say(format!("{name} has no dead letters"));
                } else {
                    state.ask(
                        format!("Requeue all {dead} dead letters of {name}?"),
                        Effect::RequeueDead { queue: name },
                    );
                }
            }
        }
        View::SlotMap | View::HostDetail | View::Task | View::Systems => {
            state.say("r requeues a queue's dead letters: switch to the queues view (1)");
        }
    }
}

/// i: asks to switch the selected queue's intake to the next of open, closed, cancel.
fn ask_intake(state: &mut State) {
    match state.view {
        View::Queues | View::QueueDetail => {
            if let Some((name, q)) = state.selected_queue() {
                use crate::config::Intake;
                let name = name.to_string();
                let (next, what) = match q.intake {
                    Intake::Open => (Intake::Closed, "new tasks are refused"),
                    Intake::Closed => (Intake::Cancel, "new tasks are cancelled on arrival"),
                    Intake::Cancel => (Intake::Open, "new tasks are enqueued again"),
                };
                state.ask(
                    format!("Switch the intake of {name} to {}? {what}.", next.as_str()),
                    Effect::SetIntake {
                        queue: name,
                        intake: next,
                    },
                );
            }
        }
        View::SlotMap | View::HostDetail | View::Task | View::Systems => {
            state.say("i switches a queue's intake: switch to the queues view (1)");
        }
    }
}

/// /: opens the lookup line in the queue a lookup starts in.
fn open_finder(state: &mut State) {
    match state.lookup_queue() {
        Some(queue) => {
            state.finder = Some(Finder {
                queue,
                id: String::new(),
            })
        }
        None => state.say("no queue to look in yet: waiting for the first read"),
    }
}

/// An action while the lookup line is open: text edits it, ↑ ↓ choose the queue, Enter
/// looks up, Esc closes it; anything else leaves it as it is.
fn type_into(state: &mut State, mut finder: Finder, action: Action) -> Option<Effect> {
    match action {
        Action::Type(c) if !c.is_control() => {
            if finder.id.len() + c.len_utf8() <= MAX_ID_LEN {
                finder.id.push(c);
            } else {
                state.say(format!("a task id has at most {MAX_ID_LEN} bytes"));
            }
        }
        Action::Erase => {
            finder.id.pop();
        }
        Action::Up | Action::Down => {
            let way = if action == Action::Down {
                Direction::Down
            } else {
                Direction::Up
            };
            if let Some(q) = state.other_queue(&finder.queue, way) {
                finder.queue = q;
            }
        }
        Action::Back => return None,
        Action::Open => {
            if finder.id.is_empty() {
                state.say("type a task id, then Enter");
            } else {
                let Finder { queue, id } = finder;
                state.task = Some(TaskLookup {
                    queue: queue.clone(),
                    id: id.clone(),
                    found: Found::Waiting,
                    scroll: 0,
                    chain: None,
                    back: state.base_view(),
                });
                state.view = View::Task;
                return Some(Effect::Lookup { queue, id });
            }
        }
        _ => {}
    }
    state.finder = Some(finder);
    None
}

/// What [`Action::LookedUp`] brings.
struct Looked {
    queue: String,
    id: String,
    result: Result<Option<Box<TaskRecord>>, String>,
    chain: Option<Box<ChainView>>,
}

/// The answer to a lookup, shown if the task view still waits for that task; an answer
/// that comes after the operator left or asked for another task is dropped.
fn looked_up(state: &mut State, answer: Looked) {
    let Looked {
        queue,
        id,
        result,
        chain,
    } = answer;
    let Some(t) = state.task.as_mut() else {
        return;
    };
    if state.view != View::Task || t.queue != queue || t.id != id {
        return;
    }
    if result.is_ok() {
        t.chain = chain;
    }
    t.found = match result {
        Ok(Some(record)) => {
            let n = record.history.as_ref().map_or(0, Vec::len);
            t.scroll = t.scroll.min(n.saturating_sub(1));
            Found::Record(record)
        }
        Ok(None) => Found::Nothing,
        Err(error) => {
            state.note = Some(Note {
                text: format!("looking up task {id} in {queue}: {error}"),
                error: true,
            });
            // Like a failed read, a failed lookup again keeps the last answer on screen.
            match std::mem::replace(&mut t.found, Found::Waiting) {
                shown @ (Found::Record(_) | Found::Nothing) => shown,
                Found::Waiting | Found::Failed(_) => Found::Failed(error),
            }
        }
    };
}
