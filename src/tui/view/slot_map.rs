//! The slot map screen: hosts × queues, each cell the slots running with the map's count
//! where the two differ, beside each host's state, memory, load and capacity, and (through
//! Sentinel, or after a failover) the Redis node each master talks to.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::Style;
use ratatui::widgets::{Block, Cell, Row, StatefulWidget, Table, TableState};

use std::collections::BTreeMap;

use super::{BOLD, DIM, HEADER, SELECTED, YELLOW, ago, host_state, memory, right, truncate};
use crate::cluster::snapshot::{HostState, Snapshot};
use crate::queue_client::Topology;
use crate::tui::state::State;

/// Width of the memory bar.
const BAR: u16 = 10;

/// The grid of hosts and the queue columns that fit from `map_column` on.
pub(super) fn slot_map(state: &State, snap: &Snapshot, area: Rect, buf: &mut Buffer) {
    let names = state.map_queue_names();
    let redis = redis_column(snap);
    let mut fixed = fixed_widths(snap).to_vec();
    if let Some(r) = &redis {
        fixed.push(r.width);
    }
    let shown = fitting_queues(&names, state.map_column, &fixed, area.width);
    let mut widths: Vec<Constraint> = fixed[..5].iter().map(|w| Constraint::Length(*w)).collect();
    widths.extend(shown.iter().map(|(_, w)| Constraint::Length(*w)));
    if let Some(r) = &redis {
        widths.push(Constraint::Length(r.width));
    }
    widths.push(Constraint::Fill(1));

    let rows = host_rows(snap, &shown, redis.as_ref());
    let n = rows.len();
    let mut head = header(&shown);
    let mut foot = total(snap, &shown);
    if redis.is_some() {
        head.push(Cell::from("redis"));
        foot.push(Cell::from(""));
    }
    let mut title = title(state, snap, names.len(), shown.len());
    if redis.is_some() {
        title.push_str("· ↻ redis failover ");
    }
    let table = Table::new(rows, widths)
        .header(Row::new(head).style(HEADER))
        .footer(Row::new(foot).style(BOLD))
        .block(Block::bordered().title(title))
        .column_spacing(1)
        .row_highlight_style(SELECTED);
    let hosts = state.host_names();
    let mut ts = TableState::new().with_selected((n > 0).then(|| state.host_index(&hosts)));
    StatefulWidget::render(table, area, buf, &mut ts);
}

/// The widths of the columns before the queues: host (as wide as the longest name, within
/// bounds), state, memory, load, slots.
fn fixed_widths(snap: &Snapshot) -> [u16; 5] {
    let host_w = snap
        .hosts
        .keys()
        .map(|h| crate::printable::printable(h).chars().count())
        .max()
        .unwrap_or(0)
        .clamp(5, 40) as u16;
    [host_w, 9, BAR + 5, 10, 7]
}

/// The redis column: each host's Redis node, with the age of the last failover its master
/// followed (`10.0.0.6:6379 ↻2m05s`); a node other than the one most live hosts name
/// stands out (a master still on an old primary). Shown only when some master reaches
/// Redis through Sentinel or followed a failover: one server's node says nothing the
/// config does not.
struct RedisColumn {
    width: u16,
    cells: BTreeMap<String, (String, bool)>,
}

fn redis_column(snap: &Snapshot) -> Option<RedisColumn> {
    let nodes = || {
        snap.hosts
            .iter()
            .filter_map(|(h, v)| Some((h, v, v.report.redis.as_ref()?)))
    };
    if !nodes().any(|(_, _, n)| n.topology == Topology::Sentinel || n.failovers > 0) {
        return None;
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, v, n) in nodes() {
        if v.state != HostState::Dead {
            *counts.entry(n.node.as_str()).or_default() += 1;
        }
    }
    let most = counts.iter().max_by_key(|(_, c)| **c).map(|(n, _)| *n);
    let cells: BTreeMap<String, (String, bool)> = nodes()
        .map(|(h, _, n)| {
            let mut text = truncate(&n.node, 24);
            if let Some(at) = n.last_failover_ms() {
                text.push_str(&format!(" ↻{}", ago(snap.at_ms.saturating_sub(at))));
            }
            (h.clone(), (text, most.is_some_and(|m| m != n.node)))
        })
        .collect();
    let width = cells
        .values()
        .map(|(t, _)| t.chars().count())
        .max()
        .unwrap_or(0)
        .max(5) as u16;
    Some(RedisColumn { width, cells })
}

/// A queue's column label.
fn label(q: &str) -> String {
    truncate(q, 10)
}

/// The queue columns from `first` on that fit in `width` beside the fixed ones, with
/// their widths.
fn fitting_queues<'a>(
    names: &[&'a str],
    first: usize,
    fixed: &[u16],
    width: u16,
) -> Vec<(&'a str, u16)> {
    // Borders, the fixed columns and the spacing after each of them.
    let mut used: u16 = 2 + fixed.iter().map(|w| w + 1).sum::<u16>();
    let mut shown = Vec::new();
    for q in names.iter().skip(first) {
        let w = label(q).chars().count().max(5) as u16;
        if used + w > width {
            break;
        }
        used += w + 1;
        shown.push((*q, w));
    }
    shown
}

/// The column names, the shown queues' among them.
fn header(shown: &[(&str, u16)]) -> Vec<Cell<'static>> {
    let mut header = vec![
        Cell::from("host"),
        Cell::from("state"),
        Cell::from("memory/budget"),
        right("load/cpus".into()),
        right("slots".into()),
    ];
    header.extend(shown.iter().map(|(q, _)| right(label(q))));
    header
}

/// One row per host: its state, memory, load and slots, then its cell of each shown
/// queue, then its Redis node when that column shows; a dead host is dim.
fn host_rows<'a>(
    snap: &'a Snapshot,
    shown: &[(&str, u16)],
    redis: Option<&RedisColumn>,
) -> Vec<Row<'a>> {
    let map_for = |host: &str, q: &str| -> u32 {
        snap.map
            .as_ref()
            .and_then(|m| m.hosts.get(host)?.get(q).copied())
            .unwrap_or(0)
    };
    snap.hosts
        .iter()
        .map(|(name, h)| {
            let r = &h.report;
            let mut cells = vec![
                Cell::from(crate::printable::printable(name)),
                Cell::from(host_state(h.state, h.drain_requested)),
                Cell::from(memory(r.pss_bytes, r.memory_budget_bytes, usize::from(BAR))),
                right(format!("{:.2}/{}", r.load1, r.cpus)),
                right(format!("{}/{}", r.slots, r.capacity)),
            ];
            for (q, _) in shown {
                let running = r.queues.get(*q).map_or(0, |x| x.slots);
                cells.push(slot_cell(running, map_for(name, q)));
            }
            if let Some(redis) = redis {
                cells.push(match redis.cells.get(name) {
                    Some((text, true)) => Cell::from(text.clone()).style(YELLOW),
                    Some((text, false)) => Cell::from(text.clone()),
                    None => Cell::from("-").style(DIM),
                });
            }
            let row = Row::new(cells);
            if h.state == HostState::Dead {
                row.style(DIM)
            } else {
                row
            }
        })
        .collect()
}

/// The footer: slots and capacity of the live hosts, and each shown queue's slots.
fn total(snap: &Snapshot, shown: &[(&str, u16)]) -> Vec<Cell<'static>> {
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
    for (q, _) in shown {
        let view = snap.queues.get(*q);
        total.push(slot_cell(
            view.map_or(0, |v| v.slots),
            view.map_or(0, |v| v.mapped),
        ));
    }
    total
}

/// The map's version, which queue columns are shown of how many, and the legend.
fn title(state: &State, snap: &Snapshot, queues: usize, shown: usize) -> String {
    let first = state.map_column.min(queues);
    format!(
        " slot map v{} · running→in map where they differ · queues {}-{} of {}{} · * drain requested ",
        snap.map.as_ref().map_or(0, |m| m.version),
        if shown == 0 { first } else { first + 1 },
        first + shown,
        queues,
        if shown < queues { " (h/l scroll)" } else { "" },
    )
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
