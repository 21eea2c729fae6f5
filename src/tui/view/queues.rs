//! The queues screen: one row per queue, sorted by the chosen column.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::{Block, Cell, Row, StatefulWidget, Table, TableState};

use super::{DIM, HEADER, RED_BOLD, SELECTED, YELLOW, count, intake, pct, rate, right, secs};
use crate::cluster::snapshot::late_text;
use crate::tui::state::{QueueRow, SortKey, State};

/// The queues table, the selected row highlighted.
pub(super) fn queues(state: &State, area: Rect, buf: &mut Buffer) {
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
        head("late", None),
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
        Constraint::Length(7),
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

/// One queue's row: load over 100 % and dead letters stand out, a paused queue is dim.
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
        right(late_text(s.oldest_due_age_ms)),
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
