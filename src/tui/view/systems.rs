//! The systems screen: one row per external system, with its state, its queues, its caps
//! and what of them is in use (slots now, tasks started per second).

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::{Block, Cell, Row, Table, Widget};

use super::{DIM, HEADER, RED_BOLD, YELLOW, count, rate, right};
use crate::queue_client::SystemState;
use crate::tui::state::{State, SystemRow};

/// The systems table.
pub(super) fn systems(state: &State, area: Rect, buf: &mut Buffer) {
    let rows = state.system_rows();
    let header = Row::new(vec![
        Cell::from("system"),
        Cell::from("state"),
        right("slots/max".into()),
        right("started/s".into()),
        right("rate cap".into()),
        right("started".into()),
        Cell::from("queues"),
    ])
    .style(HEADER);
    let body: Vec<Row<'_>> = rows.iter().map(system_row).collect();
    let widths = [
        Constraint::Min(14),
        Constraint::Length(16),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Min(20),
    ];
    Table::new(body, widths)
        .header(header)
        .block(
            Block::bordered()
                .title(" systems · gaffer system NAME pause|resume|disable|enable switches one "),
        )
        .column_spacing(1)
        .render(area, buf);
}

/// One system's row: a paused one yellow, a disabled one red, a state set by the config
/// rather than a run-time switch marked so.
fn system_row<'a>(r: &SystemRow<'a>) -> Row<'a> {
    let s = r.view;
    let label = if s.switched {
        s.state.as_str().to_string()
    } else {
        format!("{} (config)", s.state.as_str())
    };
    let state = match s.state {
        SystemState::Active => Cell::from(label),
        SystemState::Paused => Cell::from(Span::styled(label, YELLOW)),
        SystemState::Disabled => Cell::from(Span::styled(label, RED_BOLD)),
    };
    let cap = s
        .max_concurrency
        .map_or_else(|| "-".into(), |m| m.to_string());
    let row = Row::new(vec![
        Cell::from(r.name),
        state,
        right(format!("{}/{cap}", s.slots)),
        right(rate(r.started_per_s)),
        right(
            s.rate_per_second
                .map_or_else(|| "-".into(), |c| format!("{c}/s")),
        ),
        right(count(s.started_total)),
        Cell::from(s.queues.join(", ")),
    ]);
    if s.state == SystemState::Active {
        row
    } else {
        row.style(DIM)
    }
}
