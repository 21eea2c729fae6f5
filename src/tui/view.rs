//! Drawing: `impl Widget for &State`. Reads the state only; every figure shown is either
//! in the latest snapshot or computed from the history, never from the clock. One file
//! per screen that outgrows this one: `view/lookup.rs` draws the task lookup.

mod lookup;

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, Cell, Clear, Paragraph, Row, Sparkline, SparklineBar, StatefulWidget, Table, TableState,
    Widget, Wrap,
};

use super::input::KEYS;
use super::state::{QueueRow, SortKey, State, View, rates};
use crate::cluster::snapshot::{HostState, Snapshot};
use crate::config::Intake;

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
                View::Queues => queues(self, main, buf),
                View::SlotMap => slot_map(self, latest, main, buf),
                View::QueueDetail => queue_detail(self, main, buf),
                View::HostDetail => host_detail(self, latest, main, buf),
                View::Task => lookup::task(self, main, buf),
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
            m.holder.as_deref().unwrap_or("?"),
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
    let mut spans = vec![
        Span::raw(" "),
        tab(" 1 Queues ", on_queues),
        Span::raw(" "),
        tab(" 2 Slot map ", !on_queues),
    ];
    match state.view {
        View::QueueDetail => {
            if let Some((name, _)) = state.selected_queue() {
                spans.push(Span::styled(format!("  › queue {name}"), BOLD));
            }
        }
        View::HostDetail => {
            if let Some((name, _)) = state.selected_host() {
                spans.push(Span::styled(format!("  › host {name}"), BOLD));
            }
        }
        View::Task => {
            if let Some(t) = &state.task {
                let id = truncate(&t.id, 40);
                spans.push(Span::styled(format!("  › task {id} in {}", t.queue), BOLD));
            }
        }
        View::Queues | View::SlotMap => {}
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
            format!(" {e} — retrying every {}{shown}", ago(refresh_ms(state))),
            RED_BOLD,
        );
    }
    if let Some(n) = &state.note {
        return Line::styled(
            format!(" {}", n.text),
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
    };
    Line::styled(format!(" {hints}  / task  Tab view  ? help  q quit"), DIM)
}

fn right(text: String) -> Cell<'static> {
    Cell::from(Line::from(text).right_aligned())
}

fn queues(state: &State, area: Rect, buf: &mut Buffer) {
    let rows = state.queue_rows();
    let arrow = if state.reverse { "▲" } else { "▼" };
    let head = |label: &'static str, key: Option<SortKey>| -> Cell<'static> {
        if key == Some(state.sort) {
            right(format!("{label}{arrow}"))
        } else {
            right(label.to_string())
        }
    };
    let header = Row::new(vec![
        Cell::from(if state.sort == SortKey::Name {
            format!("queue{arrow}")
        } else {
            "queue".into()
        }),
        head("prio", Some(SortKey::Priority)),
        head("min/max", None),
        head("slots now/want/avg", Some(SortKey::Slots)),
        head("load", Some(SortKey::Load)),
        head("ready", Some(SortKey::Ready)),
        head("delayed", None),
        head("leased", None),
        head("dead", Some(SortKey::Dead)),
        head("done/s", Some(SortKey::Done)),
        head("task", None),
        head("err/s", Some(SortKey::Errors)),
        head("recycl", None),
        Cell::from("intake"),
        Cell::from("state"),
    ])
    .style(HEADER);
    let body: Vec<Row<'_>> = rows.iter().map(queue_row).collect();
    let widths = [
        Constraint::Min(14),
        Constraint::Length(5),
        Constraint::Length(8),
        Constraint::Length(19),
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(6),
        Constraint::Length(6),
    ];
    let title = format!(
        " queues · sort {}{} · load over 100 % = the manager wants more slots ",
        state.sort.label(),
        if state.reverse { " (reversed)" } else { "" }
    );
    let table = Table::new(body, widths)
        .header(header)
        .block(Block::bordered().title(title))
        .column_spacing(1)
        .row_highlight_style(SELECTED);
    let mut ts =
        TableState::new().with_selected((!rows.is_empty()).then(|| state.queue_index(&rows)));
    StatefulWidget::render(table, area, buf, &mut ts);
}

fn queue_row<'a>(r: &QueueRow<'a>) -> Row<'a> {
    let q = r.view;
    let s = &q.stats;
    let load = match r.load {
        Some(l) if l > 1.0 => right(pct(l)).style(RED_BOLD),
        Some(l) => right(pct(l)),
        None => right("-".into()),
    };
    let dead = if s.dead > 0 {
        right(count(s.dead)).style(YELLOW)
    } else {
        right("0".into())
    };
    let state = if q.paused {
        Cell::from(Span::styled("paused", YELLOW))
    } else {
        Cell::from("")
    };
    let row = Row::new(vec![
        Cell::from(r.name),
        right(q.priority.to_string()),
        right(format!("{}/{}", q.min_slots, q.max_slots)),
        right(format!(
            "{}/{}/{:.1}",
            q.slots,
            r.wanted.map_or_else(|| "-".into(), |w| w.to_string()),
            r.slots_avg
        )),
        load,
        right(count(s.ready)),
        right(count(s.delayed)),
        right(count(s.leased)),
        dead,
        right(rate(r.rates.done_per_s)),
        right(secs(r.rates.mean_task_s)),
        right(rate(r.rates.errors_per_s)),
        right(count(q.recycles_total)),
        Cell::from(intake(q.intake)),
        state,
    ]);
    if q.paused { row.style(DIM) } else { row }
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

fn slot_map(state: &State, snap: &Snapshot, area: Rect, buf: &mut Buffer) {
    const BAR: u16 = 10;
    let names = state.map_queue_names();
    let host_w = snap
        .hosts
        .keys()
        .map(|h| h.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(5, 40) as u16;
    let fixed = [host_w, 9, BAR + 5, 10, 7];
    // Borders, the fixed columns and the spacing after each of them.
    let mut used: u16 = 2 + fixed.iter().map(|w| w + 1).sum::<u16>();
    let label = |q: &str| truncate(q, 10);
    let mut shown = Vec::new();
    for q in names.iter().skip(state.map_column) {
        let w = label(q).chars().count().max(5) as u16;
        if used + w > area.width {
            break;
        }
        used += w + 1;
        shown.push((*q, w));
    }
    let mut widths: Vec<Constraint> = fixed.iter().map(|w| Constraint::Length(*w)).collect();
    widths.extend(shown.iter().map(|(_, w)| Constraint::Length(*w)));
    widths.push(Constraint::Fill(1));

    let mut header = vec![
        Cell::from("host"),
        Cell::from("state"),
        Cell::from("memory/budget"),
        right("load/cpus".into()),
        right("slots".into()),
    ];
    header.extend(shown.iter().map(|(q, _)| right(label(q))));
    let map_for = |host: &str, q: &str| -> u32 {
        snap.map
            .as_ref()
            .and_then(|m| m.hosts.get(host)?.get(q).copied())
            .unwrap_or(0)
    };
    let rows: Vec<Row<'_>> = snap
        .hosts
        .iter()
        .map(|(name, h)| {
            let r = &h.report;
            let mut cells = vec![
                Cell::from(name.as_str()),
                Cell::from(host_state(h.state, h.drain_requested)),
                Cell::from(memory(r.pss_bytes, r.memory_budget_bytes, usize::from(BAR))),
                right(format!("{:.2}/{}", r.load1, r.cpus)),
                right(format!("{}/{}", r.slots, r.capacity)),
            ];
            for (q, _) in &shown {
                let running = r.queues.get(*q).map_or(0, |x| x.slots);
                cells.push(slot_cell(running, map_for(name, q)));
            }
            let row = Row::new(cells);
            if h.state == HostState::Dead {
                row.style(DIM)
            } else {
                row
            }
        })
        .collect();
    let live = || snap.hosts.values().filter(|h| h.state != HostState::Dead);
    let mut total = vec![
        Cell::from("total"),
        Cell::from(""),
        Cell::from(""),
        Cell::from(""),
        right(format!(
            "{}/{}",
            live().map(|h| h.report.slots).sum::<u32>(),
            live().map(|h| h.report.capacity).sum::<u32>()
        )),
    ];
    for (q, _) in &shown {
        let view = snap.queues.get(*q);
        total.push(slot_cell(
            view.map_or(0, |v| v.slots),
            view.map_or(0, |v| v.mapped),
        ));
    }
    let first = state.map_column.min(names.len());
    let title = format!(
        " slot map v{} · running→in map where they differ · queues {}-{} of {}{} · * drain requested ",
        snap.map.as_ref().map_or(0, |m| m.version),
        if shown.is_empty() { first } else { first + 1 },
        first + shown.len(),
        names.len(),
        if shown.len() < names.len() {
            " (h/l scroll)"
        } else {
            ""
        },
    );
    let n = rows.len();
    let table = Table::new(rows, widths)
        .header(Row::new(header).style(HEADER))
        .footer(Row::new(total).style(BOLD))
        .block(Block::bordered().title(title))
        .column_spacing(1)
        .row_highlight_style(SELECTED);
    let hosts = state.host_names();
    let mut ts = TableState::new().with_selected((n > 0).then(|| state.host_index(&hosts)));
    StatefulWidget::render(table, area, buf, &mut ts);
}

/// A grid cell: the running count, with the map's count when the two differ.
fn slot_cell(running: u32, mapped: u32) -> Cell<'static> {
    let (text, style) = if running != mapped {
        (format!("{running}→{mapped}"), YELLOW)
    } else if running == 0 {
        ("·".to_string(), DIM)
    } else {
        (running.to_string(), Style::new())
    };
    right(text).style(style)
}

/// A labelled sparkline of the newest values that fit.
fn spark(title: String, data: &[Option<f64>], style: Style, area: Rect, buf: &mut Buffer) {
    let block = Block::bordered().title(title);
    let keep = usize::from(block.inner(area).width);
    // Integers for the widget; only the shape matters there.
    let tail: Vec<SparklineBar> = data
        .iter()
        .skip(data.len().saturating_sub(keep))
        .map(|v| SparklineBar::from(v.map(|x| (x.max(0.0) * 100.0).round() as u64)))
        .collect();
    Sparkline::default()
        .block(block)
        .data(tail)
        .style(style)
        .render(area, buf);
}

/// A series over the history; `f` also gets the read before, for rates.
fn series(
    state: &State,
    mut f: impl FnMut(Option<&Snapshot>, &Snapshot) -> Option<f64>,
) -> Vec<Option<f64>> {
    let mut prev = None;
    state
        .history
        .iter()
        .map(|s| {
            let v = f(prev, s);
            prev = Some(s);
            v
        })
        .collect()
}

fn now_max(values: &[Option<f64>], fmt: impl Fn(Option<f64>) -> String) -> String {
    let now = values.last().copied().flatten();
    let max = values.iter().flatten().copied().reduce(f64::max);
    format!("now {}  max {}", fmt(now), fmt(max))
}

fn whole(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

fn queue_detail(state: &State, area: Rect, buf: &mut Buffer) {
    let rows = state.queue_rows();
    let Some(r) = rows.get(state.queue_index(&rows)) else {
        Paragraph::new("no queues in the config")
            .block(Block::bordered())
            .render(area, buf);
        return;
    };
    let name = r.name.to_string();
    let q = r.view;
    let s = &q.stats;
    let [info, charts] = area.layout(&Layout::horizontal([
        Constraint::Length(72),
        Constraint::Fill(1),
    ]));
    let key = |k: &'static str| Span::styled(format!("{k:<11}"), BOLD);
    let d = q.decision.as_ref();
    let mut lines = vec![
        Line::from(vec![
            key("config"),
            Span::raw(format!(
                "priority {}  min {}  max {}",
                q.priority, q.min_slots, q.max_slots
            )),
            if q.paused {
                Span::styled("  PAUSED", YELLOW.patch(BOLD))
            } else {
                Span::raw("")
            },
        ]),
        Line::from(vec![
            key("slots"),
            Span::raw(format!(
                "running {}  wanted {}  average {:.1}  in map {}",
                q.slots,
                r.wanted.map_or_else(|| "-".into(), |w| w.to_string()),
                r.slots_avg,
                q.mapped
            )),
        ]),
        Line::from(vec![
            key("load"),
            match r.load {
                Some(l) if l > 1.0 => Span::styled(pct(l), RED_BOLD),
                Some(l) => Span::raw(pct(l)),
                None => Span::raw("-"),
            },
            Span::raw(match d {
                Some(d) => format!(
                    "  (decision: current {} demand {} wanted {} placed {})",
                    d.current, d.demand, d.wanted, d.placed
                ),
                None => "  (no decision from a manager yet)".into(),
            }),
        ]),
        Line::from(vec![
            key("why"),
            Span::raw(d.map(|d| d.reason_text()).unwrap_or_default()),
        ]),
        Line::from(vec![
            key("intake"),
            intake(q.intake),
            Span::raw(match q.intake {
                Intake::Open => "  new tasks are enqueued",
                Intake::Closed => "  new tasks are refused",
                Intake::Cancel => "  new tasks are cancelled on arrival",
            }),
            Span::styled(
                if q.track {
                    ""
                } else {
                    "  (track = false: no task records)"
                },
                DIM,
            ),
        ]),
        Line::from(vec![
            key("tasks"),
            Span::raw(format!(
                "ready {}  delayed {}  leased {}  dead {}  frozen {}",
                s.ready, s.delayed, s.leased, s.dead, s.frozen
            )),
        ]),
        Line::from(vec![
            key("rates"),
            Span::raw(format!(
                "done {}/s  errors {}/s  mean task {}",
                rate(r.rates.done_per_s),
                rate(r.rates.errors_per_s),
                secs(r.rates.mean_task_s)
            )),
        ]),
        Line::from(vec![
            key("totals"),
            Span::raw(format!(
                "enqueued {}  acked {}  retried {}  dead {}",
                s.enqueued_total, s.acked_total, s.retried_total, s.dead_total
            )),
        ]),
        Line::from(vec![
            key(""),
            Span::raw(format!(
                "stale {}  expired {}  requeued {}  purged {}  cancelled {}",
                s.stale_total, s.expired_total, s.requeued_total, s.purged_total, s.cancelled_total
            )),
        ]),
        Line::from(vec![
            key("handlers"),
            Span::raw(format!(
                "processed {}  failed {}  busy {:.1}s",
                q.processed_total, q.failed_total, q.busy_seconds_total,
            )),
        ]),
        Line::from(vec![
            key(""),
            Span::raw(format!(
                "recycles {}  crashes {}",
                q.recycles_total, q.crashes_total
            )),
        ]),
        Line::raw(""),
        Line::styled("placement  host: running / in map", BOLD),
    ];
    if let Some(latest) = state.history.latest() {
        let mut any = false;
        for (host, h) in &latest.hosts {
            let running = h.report.queues.get(&name).map_or(0, |x| x.slots);
            let mapped = latest
                .map
                .as_ref()
                .and_then(|m| m.hosts.get(host)?.get(&name).copied())
                .unwrap_or(0);
            if running == 0 && mapped == 0 {
                continue;
            }
            any = true;
            lines.push(Line::from(vec![
                Span::raw(format!("  {host:<20} {running:>4} / {mapped:<4} ")),
                host_state(h.state, h.drain_requested),
            ]));
        }
        if !any {
            lines.push(Line::styled("  no slots anywhere", DIM));
        }
    }
    Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .block(Block::bordered().title(format!(" queue {name} ")))
        .render(info, buf);

    let of = |s: &Snapshot| s.queues.get(&name).cloned();
    let between = |p: Option<&Snapshot>, s: &Snapshot| {
        let p = p?;
        Some(rates(&of(p)?, &of(s)?, s.at_ms.checked_sub(p.at_ms)?))
    };
    let ready = series(state, |_, s| of(s).map(|q| q.stats.ready as f64));
    let done = series(state, |p, s| between(p, s)?.done_per_s);
    let errors = series(state, |p, s| between(p, s)?.errors_per_s);
    let slots = series(state, |_, s| of(s).map(|q| f64::from(q.slots)));
    let load = series(state, |_, s| of(s)?.decision?.load);
    let areas: [Rect; 5] = charts.layout(&Layout::vertical([Constraint::Fill(1); 5]));
    let cyan = Style::new().fg(Color::Cyan);
    let blue = Style::new().fg(Color::Blue);
    let load_fmt = |v: Option<f64>| v.map_or_else(|| "-".into(), pct);
    spark(
        format!(" ready · {} ", now_max(&ready, whole)),
        &ready,
        cyan,
        areas[0],
        buf,
    );
    let done_title = format!(" done/s · {} ", now_max(&done, rate));
    spark(done_title, &done, GREEN, areas[1], buf);
    let errors_title = format!(" errors/s · {} ", now_max(&errors, rate));
    spark(errors_title, &errors, RED, areas[2], buf);
    let slots_title = format!(" slots running · {} ", now_max(&slots, whole));
    spark(slots_title, &slots, blue, areas[3], buf);
    let load_title = format!(" load · {} ", now_max(&load, load_fmt));
    spark(load_title, &load, YELLOW, areas[4], buf);
}

fn host_detail(state: &State, latest: &Snapshot, area: Rect, buf: &mut Buffer) {
    let Some((name, h)) = state.selected_host() else {
        Paragraph::new("no master has reported yet")
            .block(Block::bordered())
            .render(area, buf);
        return;
    };
    let name = name.to_string();
    let r = &h.report;
    let [left, charts] = area.layout(&Layout::horizontal([
        Constraint::Length(96),
        Constraint::Fill(1),
    ]));
    let [info, table] = left.layout(&Layout::vertical([
        Constraint::Length(8),
        Constraint::Fill(1),
    ]));
    let key = |k: &'static str| Span::styled(format!("{k:<11}"), BOLD);
    let bytes = |b: u64| bytesize::ByteSize(b).to_string();
    let lines = vec![
        Line::from(vec![
            key("state"),
            host_state(h.state, h.drain_requested),
            Span::raw(if h.drain_requested {
                "  (drain requested by an operator)"
            } else {
                ""
            }),
        ]),
        Line::from(vec![
            key("master"),
            Span::raw(format!(
                "pid {}  up {}  reported {} before the read  follows map v{}",
                r.pid,
                ago(latest.at_ms.saturating_sub(r.started_ms)),
                ago(latest.at_ms.saturating_sub(r.ts_ms)),
                r.map_version
            )),
        ]),
        Line::from(vec![
            key("slots"),
            Span::raw(format!("{} of capacity {}", r.slots, r.capacity)),
        ]),
        Line::from(vec![
            key("memory"),
            memory(r.pss_bytes, r.memory_budget_bytes, 20),
            Span::raw(format!(
                "  PSS {} of budget {}, available {}",
                bytes(r.pss_bytes),
                bytes(r.memory_budget_bytes),
                bytes(r.mem_available_bytes)
            )),
        ]),
        Line::from(vec![
            key("load"),
            Span::raw(format!("{:.2} on {} cpus", r.load1, r.cpus)),
        ]),
        Line::from(vec![key("handlers"), Span::raw(r.handlers.join(", "))]),
    ];
    Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .block(Block::bordered().title(format!(" host {name} ")))
        .render(info, buf);

    let header = Row::new(
        [
            "queue",
            "slots",
            "wanted",
            "processed",
            "failed",
            "batches",
            "busy s",
            "lived s",
            "recycl",
            "crash",
            "hung",
        ]
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            if i == 0 {
                Cell::from(h)
            } else {
                right(h.to_string())
            }
        })
        .collect::<Vec<_>>(),
    )
    .style(HEADER);
    let rows: Vec<Row<'_>> = r
        .queues
        .iter()
        .map(|(q, x)| {
            Row::new(vec![
                Cell::from(q.as_str()),
                right(x.slots.to_string()),
                right(x.wanted.to_string()),
                right(count(x.processed_total)),
                right(count(x.failed_total)),
                right(count(x.batches_total)),
                right(format!("{:.1}", x.busy_seconds_total)),
                right(format!("{:.0}", x.slot_lifetime_seconds_total)),
                right(x.recycles_total.to_string()),
                right(x.crashes_total.to_string()),
                right(x.hung_total.to_string()),
            ])
        })
        .collect();
    let table_widget = Table::new(
        rows,
        [
            Constraint::Fill(1),
            Constraint::Length(5),
            Constraint::Length(6),
            Constraint::Length(9),
            Constraint::Length(7),
            Constraint::Length(8),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(6),
            Constraint::Length(5),
            Constraint::Length(5),
        ],
    )
    .header(header)
    .column_spacing(1)
    .block(Block::bordered().title(" queues on this host (counters since the master started) "));
    Widget::render(table_widget, table, buf);

    let of = |s: &Snapshot| {
        s.hosts
            .get(&name)
            .map(|h| (h.report.slots, h.report.pss_bytes, h.report.load1))
    };
    let slots = series(state, |_, s| of(s).map(|r| f64::from(r.0)));
    let pss = series(state, |_, s| of(s).map(|r| r.1 as f64 / (1024.0 * 1024.0)));
    let load = series(state, |_, s| of(s).map(|r| r.2));
    let areas: [Rect; 3] = charts.layout(&Layout::vertical([Constraint::Fill(1); 3]));
    let two = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    let slots_title = format!(" slots · {} ", now_max(&slots, whole));
    spark(
        slots_title,
        &slots,
        Style::new().fg(Color::Blue),
        areas[0],
        buf,
    );
    let pss_title = format!(" PSS MiB · {} ", now_max(&pss, whole));
    spark(
        pss_title,
        &pss,
        Style::new().fg(Color::Magenta),
        areas[1],
        buf,
    );
    let load_title = format!(" load average · {} ", now_max(&load, two));
    spark(load_title, &load, YELLOW, areas[2], buf);
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
    let s = ms / 1000;
    if ms < 10_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    }
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
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}
