//! The host detail screen: the selected host's master, memory and load, its queues'
//! counters, and sparklines of its history.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, Widget, Wrap};

use super::charts::{now_max, series, spark, whole};
use super::{HEADER, YELLOW, ago, count, field, host_state, key, memory, right};
use crate::cluster::HostReport;
use crate::cluster::snapshot::{HostView, Snapshot, redis_text};
use crate::printable::printable;
use crate::tui::state::State;

/// The selected host: its figures and queues on the left, its history on the right.
pub(super) fn host_detail(state: &State, latest: &Snapshot, area: Rect, buf: &mut Buffer) {
    let Some((name, h)) = state.selected_host() else {
        Paragraph::new("no master has reported yet")
            .block(Block::bordered())
            .render(area, buf);
        return;
    };
    let name = name.to_string();
    let [left, charts] = area.layout(&Layout::horizontal([
        Constraint::Length(96),
        Constraint::Fill(1),
    ]));
    let [info, table] = left.layout(&Layout::vertical([
        Constraint::Length(9),
        Constraint::Fill(1),
    ]));
    Paragraph::new(figures(h, latest))
        .wrap(Wrap { trim: false })
        .block(Block::bordered().title(format!(" host {} ", printable(&name))))
        .render(info, buf);
    Widget::render(queue_table(&h.report), table, buf);
    history(state, &name, charts, buf);
}

/// The host's state, its master (ages as of the read), slots, memory, load, handlers and
/// the Redis node its master talks to.
fn figures(h: &HostView, latest: &Snapshot) -> Vec<Line<'static>> {
    let r = &h.report;
    let bytes = |b: u64| bytesize::ByteSize(b).to_string();
    vec![
        Line::from(vec![
            key("state"),
            host_state(h.state, h.drain_requested),
            Span::raw(if h.drain_requested {
                "  (drain requested by an operator)"
            } else {
                ""
            }),
        ]),
        field(
            "master",
            format!(
                "pid {}  up {}  reported {} before the read  follows map v{}",
                r.pid,
                ago(latest.at_ms.saturating_sub(r.started_ms)),
                ago(latest.at_ms.saturating_sub(r.ts_ms)),
                r.map_version
            ),
        ),
        field(
            "slots",
            format!(
                "{} of capacity {}{}",
                r.slots,
                r.capacity,
                if r.capacity_bound == Some(crate::cluster::Bound::Load) {
                    " (cpu overloaded: holding, replacing slots that exit)"
                } else {
                    ""
                }
            ),
        ),
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
        field(
            "load",
            match r.cpu_pressure {
                Some(p) => format!("{:.2} on {} cpus, cpu pressure {p:.0}%", r.load1, r.cpus),
                None => format!("{:.2} on {} cpus", r.load1, r.cpus),
            },
        ),
        field("handlers", r.handlers.join(", ")),
        field(
            "redis",
            r.redis.as_ref().map_or_else(
                || "not reported (a master from before it)".to_string(),
                |n| redis_text(n, latest.at_ms),
            ),
        ),
    ]
}

/// The master's counters per queue since it started.
fn queue_table(r: &HostReport) -> Table<'_> {
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
    Table::new(
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
    .block(Block::bordered().title(" queues on this host (counters since the master started) "))
}

/// Sparklines of the host over the history: slots, PSS, load average.
fn history(state: &State, name: &str, charts: Rect, buf: &mut Buffer) {
    let of = |s: &Snapshot| {
        s.hosts
            .get(name)
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
