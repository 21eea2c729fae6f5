//! Drawing: `impl Widget for &State`. Reads the state only; every figure shown is either
//! in the latest snapshot or computed from the history, never from the clock. This file
//! draws the frame (header, tabs, status line, help, confirmation) and holds what the
//! screens share (styles, formatting, the state spans); each screen has its own file:
//! `queues.rs`, `slot_map.rs`, `queue_detail.rs`, `host_detail.rs`, `lookup.rs` (the task
//! lookup), with the detail screens' sparklines in `charts.rs` and a long queue's running
//! tasks in `long_tasks.rs`.
//!
//! `systems.rs` is the external systems' screen (key 3, in the Tab cycle when the config
//! has systems).

mod charts;
mod host_detail;
mod long_tasks;
mod lookup;
mod queue_detail;
mod queues;
mod slot_map;
mod systems;

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Clear, Paragraph, Widget, Wrap};

use super::input::KEYS;
use super::state::{State, View};
use crate::cluster::snapshot::HostState;
use crate::config::Intake;
use crate::printable::printable;

const RED: Style = Style::new().fg(Color::Red);
const RED_BOLD: Style = Style::new().fg(Color::Red).add_modifier(Modifier::BOLD);
const YELLOW: Style = Style::new().fg(Color::Yellow);
const GREEN: Style = Style::new().fg(Color::Green);
const DIM: Style = Style::new().add_modifier(Modifier::DIM);
const BOLD: Style = Style::new().add_modifier(Modifier::BOLD);
const HEADER: Style = Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD);
const SELECTED: Style = Style::new().add_modifier(Modifier::REVERSED);

impl Widget for &State {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let [head, tabs, main, finder, status] = area.layout(&Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(0),
            Constraint::Length(u16::from(self.finder.is_some())),
            Constraint::Length(1),
        ]));
        header(self).render(head, buf);
        tab_line(self).render(tabs, buf);
        match self.history.latest() {
            None => Paragraph::new(Line::styled("  reading Redis…", DIM))
                .block(Block::bordered())
                .render(main, buf),
            Some(latest) => match self.view {
                View::Queues => queues::queues(self, main, buf),
                View::SlotMap => slot_map::slot_map(self, latest, main, buf),
                View::QueueDetail => queue_detail::queue_detail(self, main, buf),
                View::HostDetail => host_detail::host_detail(self, latest, main, buf),
                View::Task => lookup::task(self, main, buf),
                View::Systems => systems::systems(self, main, buf),
            },
        }
        if let Some(f) = &self.finder {
            lookup::finder_line(f, finder.width).render(finder, buf);
        }
        status_line(self).render(status, buf);
        if self.help {
            help(area, buf);
        }
        if let Some(p) = &self.pending {
            dialog(&p.question, area, buf);
        }
    }
}

fn refresh_ms(state: &State) -> u64 {
    u64::try_from(state.refresh.as_millis()).unwrap_or(u64::MAX)
}

/// The manager line: who leads, and how fresh the read is.
fn header(state: &State) -> Line<'static> {
    let mut spans = vec![Span::styled(" gaffer top ", BOLD), Span::raw("│ ")];
    let Some(snap) = state.history.latest() else {
        spans.push(Span::styled("manager: not read yet", DIM));
        return Line::from(spans);
    };
    let m = &snap.manager;
    if m.stale() {
        spans.push(Span::styled("STALE: no manager holds the lease", RED_BOLD));
        if let Some(v) = m.map_version {
            spans.push(Span::raw(format!(
                " (map v{v} of epoch {} is the last one written)",
                m.map_epoch.unwrap_or(0)
            )));
        }
    } else {
        spans.push(Span::raw(format!(
            "manager {} · epoch {} · lease {} · map v{}",
            printable(m.holder.as_deref().unwrap_or("?")),
            m.epoch.map_or_else(|| "?".into(), |e| e.to_string()),
            m.lease_ttl_ms
                .map_or_else(|| "?".into(), |t| format!("{:.1}s", t as f64 / 1000.0)),
            m.map_version.unwrap_or(0),
        )));
    }
    let age = state.now_ms.saturating_sub(snap.at_ms);
    let late = age > 3 * refresh_ms(state);
    spans.push(Span::raw(" │ "));
    spans.push(Span::styled(
        format!("read {} ({} ago)", clock(snap.at_ms), ago(age)),
        if late { YELLOW } else { Style::new() },
    ));
    let dead = snap
        .hosts
        .values()
        .filter(|h| h.state == HostState::Dead)
        .count();
    spans.push(Span::raw(format!(
        " │ {} queues · {} hosts{}",
        snap.queues.len(),
        snap.hosts.len(),
        if dead > 0 {
            format!(" ({dead} dead)")
        } else {
            String::new()
        }
    )));
    Line::from(spans)
}

/// Which view, and where the queue list comes from.
fn tab_line(state: &State) -> Line<'static> {
    let tab = |label: &'static str, on: bool| {
        Span::styled(label, if on { SELECTED.patch(BOLD) } else { DIM })
    };
    let on_queues = matches!(state.base_view(), View::Queues | View::QueueDetail);
    let on_systems = state.base_view() == View::Systems;
    let mut spans = vec![
        Span::raw(" "),
        tab(" 1 Queues ", on_queues),
        Span::raw(" "),
        tab(" 2 Slot map ", !on_queues && !on_systems),
    ];
    // The systems tab shows only where the config has systems.
    if state
        .history
        .latest()
        .is_some_and(|s| !s.systems.is_empty())
    {
        spans.push(Span::raw(" "));
        spans.push(tab(" 3 Systems ", on_systems));
    }
    match state.view {
        View::QueueDetail => {
            if let Some((name, _)) = state.selected_queue() {
                spans.push(Span::styled(format!("  › queue {name}"), BOLD));
            }
        }
        View::HostDetail => {
            if let Some((name, _)) = state.selected_host() {
                let name = printable(name);
                spans.push(Span::styled(format!("  › host {name}"), BOLD));
            }
        }
        View::Task => {
            if let Some(t) = &state.task {
                let id = truncate(&t.id, 40);
                let queue = printable(&t.queue);
                spans.push(Span::styled(format!("  › task {id} in {queue}"), BOLD));
            }
        }
        View::Queues | View::SlotMap | View::Systems => {}
    }
    if !state.config.is_empty() {
        spans.push(Span::styled(
            format!(
                "   config: {} · refresh {}",
                state.config,
                ago(refresh_ms(state))
            ),
            DIM,
        ));
    }
    Line::from(spans)
}

/// Errors first (a read that failed, an action that failed), then notes, then key hints.
fn status_line(state: &State) -> Line<'static> {
    if let Some(e) = &state.read_error {
        let shown = match state.history.latest() {
            Some(s) => format!("; showing the read of {}", clock(s.at_ms)),
            None => String::new(),
        };
        return Line::styled(
            format!(
                " {} — retrying every {}{shown}",
                printable(e),
                ago(refresh_ms(state))
            ),
            RED_BOLD,
        );
    }
    if let Some(n) = &state.note {
        return Line::styled(
            format!(" {}", printable(&n.text)),
            if n.error { RED_BOLD } else { GREEN },
        );
    }
    if state.typing() {
        return Line::styled(
            " Enter look up  Tab ↑ ↓ other queue  Backspace erase  Esc cancel",
            DIM,
        );
    }
    let hints = match state.view {
        View::Queues => "Enter detail  s/S sort  p pause/resume  i intake  r requeue dead",
        View::QueueDetail => "Esc back  j/k next queue  p pause/resume  i intake  r requeue dead",
        View::SlotMap => "Enter detail  d drain/undrain  j/k move  h/l scroll queues",
        View::HostDetail => "Esc back  j/k next host  d drain/undrain",
        View::Task => "Esc back  j/k scroll history  Enter read again",
        View::Systems => "1 queues  2 slot map  (switch with gaffer system NAME …)",
    };
    Line::styled(format!(" {hints}  / task  Tab view  ? help  q quit"), DIM)
}

/// A right-aligned cell, for figures.
fn right(text: String) -> Cell<'static> {
    Cell::from(Line::from(text).right_aligned())
}

/// A queue's intake: closed (new tasks refused) and cancel (new tasks cancelled on
/// arrival) stand out, open is the quiet normal.
fn intake(intake: Intake) -> Span<'static> {
    let style = match intake {
        Intake::Open => Style::new(),
        Intake::Closed => YELLOW.patch(BOLD),
        Intake::Cancel => RED_BOLD,
    };
    Span::styled(intake.as_str(), style)
}

/// A host's state: dead stands out, draining warns, with a mark while a drain is asked
/// for but not adopted yet.
fn host_state(state: HostState, drain_requested: bool) -> Span<'static> {
    let style = match state {
        HostState::Alive => GREEN,
        HostState::Draining => YELLOW,
        HostState::Dead => RED_BOLD,
    };
    // Asked to drain, not draining yet: the master adopts it on its next tick.
    let mark = if drain_requested && state == HostState::Alive {
        "*"
    } else {
        ""
    };
    Span::styled(format!("{}{mark}", state.as_str()), style)
}

/// A field name on the left of a detail screen's figures.
fn key(k: &'static str) -> Span<'static> {
    Span::styled(format!("{k:<11}"), BOLD)
}

/// A detail line: its key, then plain text.
fn field(k: &'static str, text: impl Into<std::borrow::Cow<'static, str>>) -> Line<'static> {
    Line::from(vec![key(k), Span::raw(text)])
}

/// PSS against the budget, as a bar and a percentage.
fn memory(pss: u64, budget: u64, width: usize) -> Span<'static> {
    if budget == 0 {
        return Span::styled(format!("{:width$} ?", ""), DIM);
    }
    let ratio = pss as f64 / budget as f64;
    let full = ((ratio.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    let text = format!(
        "{}{} {:>3.0}%",
        "█".repeat(full),
        "░".repeat(width - full),
        ratio * 100.0
    );
    let style = if ratio > 0.9 {
        RED
    } else if ratio > 0.75 {
        YELLOW
    } else {
        GREEN
    };
    Span::styled(text, style)
}

fn help(area: Rect, buf: &mut Buffer) {
    let height = KEYS.len() as u16 + 4;
    let popup = area.centered(Constraint::Length(64), Constraint::Length(height));
    Clear.render(popup, buf);
    let mut lines: Vec<Line<'_>> = KEYS
        .iter()
        .map(|(k, what)| {
            Line::from(vec![
                Span::styled(format!(" {k:<12}"), BOLD),
                Span::raw(*what),
            ])
        })
        .collect();
    lines.push(Line::raw(""));
    lines.push(Line::styled(" Esc or ? closes this help", DIM));
    Paragraph::new(lines)
        .block(Block::bordered().title(" keys "))
        .render(popup, buf);
}

fn dialog(question: &str, area: Rect, buf: &mut Buffer) {
    let popup = area.centered(Constraint::Length(64), Constraint::Length(6));
    Clear.render(popup, buf);
    Paragraph::new(vec![
        Line::raw(question.to_string()),
        Line::raw(""),
        Line::from(vec![
            Span::styled("[y]", BOLD),
            Span::raw(" yes    "),
            Span::styled("[n]", BOLD),
            Span::raw(" / Esc no"),
        ]),
    ])
    .wrap(Wrap { trim: true })
    .block(Block::bordered().title(" confirm ").border_style(YELLOW))
    .render(popup, buf);
}

/// Wall-clock time of a read, in UTC so every operator's screen (and every test) agrees.
fn clock(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX))
        .map_or_else(|| "?".into(), |t| t.format("%H:%M:%S UTC").to_string())
}

fn ago(ms: u64) -> String {
    crate::cluster::snapshot::age_text(ms)
}

fn count(n: u64) -> String {
    if n < 100_000 {
        n.to_string()
    } else if n < 100_000_000 {
        format!("{}k", n / 1000)
    } else {
        format!("{}M", n / 1_000_000)
    }
}

fn rate(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(0.0) => "0".into(),
        Some(v) if v < 10.0 => format!("{v:.2}"),
        Some(v) if v < 1000.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
    }
}

fn secs(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v < 0.001 => format!("{:.0}µs", v * 1e6),
        Some(v) if v < 1.0 => format!("{:.0}ms", v * 1e3),
        Some(v) if v < 60.0 => format!("{v:.1}s"),
        Some(v) => format!("{:.0}m", v / 60.0),
    }
}

fn pct(load: f64) -> String {
    format!("{:.0}%", load * 100.0)
}

fn truncate(s: &str, max: usize) -> String {
    let s = printable(s);
    if s.chars().count() <= max {
        s.into_owned()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}
