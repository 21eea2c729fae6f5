//! The task lookup: the line an id is typed into, and the task view with the record's
//! fields, its chain (each task with its state) and its history. Like every view it reads the state only.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, Widget, Wrap};

use super::{BOLD, DIM, GREEN, HEADER, RED, RED_BOLD, SELECTED, YELLOW, right, truncate};
use crate::chain::ChainView;
use crate::printable::printable;
use crate::queue_client::{HistoryEntry, RecordState, TaskRecord};
use crate::tui::state::{Finder, Found, State, TaskLookup};

/// Width of the field names on the left of the record.
const KEY_WIDTH: usize = 11;
/// A long error is wrapped over at most this many lines.
const ERROR_LINES: usize = 4;
/// A chain's tasks shown at most, the global task first; the rest are counted.
const CHAIN_LINES: usize = 8;

/// The colour of a task state: failed red, done green, running yellow, the rest apart.
pub(super) fn state_style(state: RecordState) -> Style {
    match state {
        RecordState::Waiting => Style::new().fg(Color::Cyan),
        RecordState::Running => YELLOW,
        RecordState::Done => GREEN,
        RecordState::Failed => RED_BOLD,
        RecordState::Cancelled | RecordState::Cancelling => Style::new().fg(Color::Magenta),
        RecordState::Frozen => Style::new().fg(Color::Blue),
    }
}

/// The lookup line: the queue looked in and the id typed so far, its tail when it is
/// wider than the line.
pub(super) fn finder_line(f: &Finder, width: u16) -> Line<'static> {
    let head = vec![
        Span::styled(" look up task ", SELECTED.patch(BOLD)),
        Span::raw(" in "),
        Span::styled(f.queue.clone(), Style::new().fg(Color::Cyan).patch(BOLD)),
        Span::raw("  id: "),
    ];
    let used: usize = head.iter().map(Span::width).sum::<usize>() + 1;
    let room = usize::from(width).saturating_sub(used);
    let n = f.id.chars().count();
    let id = if n <= room {
        printable(&f.id).into_owned()
    } else if room == 0 {
        String::new()
    } else {
        let tail: String = f.id.chars().skip(n - (room - 1)).collect();
        format!("…{tail}")
    };
    let mut spans = head;
    spans.push(Span::styled(id, BOLD));
    // The cursor.
    spans.push(Span::styled(" ", SELECTED));
    Line::from(spans)
}

/// The task view: waiting, the record, no record, or why the lookup failed.
pub(super) fn task(state: &State, area: Rect, buf: &mut Buffer) {
    let Some(t) = &state.task else {
        message(
            " task ".into(),
            vec![Line::styled("no task looked up yet: / looks one up", DIM)],
            area,
            buf,
        );
        return;
    };
    let title = format!(" task {} in {} ", truncate(&t.id, 60), printable(&t.queue));
    let id = printable(&t.id);
    match &t.found {
        Found::Waiting => message(
            title,
            vec![Line::styled(
                format!("looking up {id} in {}…", t.queue),
                DIM,
            )],
            area,
            buf,
        ),
        Found::Nothing => {
            let tracked = state
                .history
                .latest()
                .and_then(|s| s.queues.get(&t.queue))
                .map(|q| q.track);
            let why = match tracked {
                Some(false) => format!(
                    "queue {} does not track its tasks (track = false): it keeps no records",
                    t.queue
                ),
                _ => "the id is unknown, or its record expired (history_ttl after the task ended)"
                    .into(),
            };
            message(
                title,
                vec![
                    Line::styled(format!("no record of task {id} in {}", t.queue), BOLD),
                    Line::raw(""),
                    Line::styled(why, DIM),
                    Line::styled("Enter looks again · / another task · Esc back", DIM),
                ],
                area,
                buf,
            );
        }
        Found::Failed(error) => message(
            title,
            vec![
                Line::styled(format!("looking up {id} failed"), RED_BOLD),
                Line::styled(printable(error).into_owned(), RED),
                Line::raw(""),
                Line::styled("Enter tries again · Esc back", DIM),
            ],
            area,
            buf,
        ),
        Found::Record(r) => record(t, r, title, area, buf),
    }
}

fn message(title: String, lines: Vec<Line<'static>>, area: Rect, buf: &mut Buffer) {
    Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .block(Block::bordered().title(title))
        .render(area, buf);
}

fn key(k: &'static str) -> Span<'static> {
    Span::styled(format!("{k:<KEY_WIDTH$}"), BOLD)
}

/// A line of the task view: its key, then plain text.
fn field(k: &'static str, text: impl Into<std::borrow::Cow<'static, str>>) -> Line<'static> {
    Line::from(vec![key(k), Span::raw(text)])
}

fn record(t: &TaskLookup, r: &TaskRecord, title: String, area: Rect, buf: &mut Buffer) {
    let value_width = usize::from(area.width.saturating_sub(2)).saturating_sub(KEY_WIDTH);
    let attempts = if r.max_attempts == 0 {
        format!("{}/∞", r.attempt)
    } else {
        format!("{}/{}", r.attempt, r.max_attempts)
    };
    let mut lines = vec![
        Line::from(vec![
            key("state"),
            Span::styled(r.state.as_str(), state_style(r.state)),
            Span::raw(format!("   attempt {attempts}   priority {}", r.priority)),
        ]),
        field(
            "created",
            format!("{}   updated {}", r.created_at, r.updated_at),
        ),
        field("due", r.due_at.clone()),
        Line::from(vec![
            key("submitted"),
            Span::raw(printable(r.submitted_by.as_deref().unwrap_or("-")).into_owned()),
            Span::raw(
                r.chain
                    .as_ref()
                    .map(|c| format!("   chain {}", printable(c)))
                    .unwrap_or_default(),
            ),
        ]),
    ];
    match &r.error {
        Some(e) => {
            for (i, l) in wrap(e, value_width, ERROR_LINES).into_iter().enumerate() {
                let k = if i == 0 { key("error") } else { key("") };
                lines.push(Line::from(vec![k, Span::styled(l, RED)]));
            }
        }
        None => lines.push(Line::from(vec![key("error"), Span::styled("-", DIM)])),
    }
    lines.push(Line::from(vec![
        key("result"),
        match &r.result {
            Some(v) => Span::raw(truncate(&v.to_string(), value_width.max(1))),
            None => Span::styled("-", DIM),
        },
    ]));
    if let Some(chain) = &t.chain {
        lines.extend(chain_lines(chain, value_width));
    }
    let [info, history] = area.layout(&Layout::vertical([
        Constraint::Length(lines.len() as u16 + 2),
        Constraint::Fill(1),
    ]));
    Paragraph::new(lines)
        .block(Block::bordered().title(title))
        .render(info, buf);
    history_table(t, r.history.as_deref().unwrap_or_default(), history, buf);
}

/// The task's chain: its state, then its tasks (the global one first) with theirs.
fn chain_lines(chain: &ChainView, width: usize) -> Vec<Line<'static>> {
    let done = chain
        .tasks
        .iter()
        .filter(|t| {
            t.record
                .as_ref()
                .is_some_and(|r| r.state == RecordState::Done)
        })
        .count();
    let mut lines = vec![Line::from(vec![
        key("chain"),
        Span::raw(format!("{}  ", printable(&chain.id))),
        Span::styled(chain.state.as_str(), BOLD),
        Span::raw(format!("   {done} of {} tasks done", chain.tasks.len())),
    ])];
    for t in chain.tasks.iter().take(CHAIN_LINES) {
        let name = truncate(
            &format!("{} {}", t.member.queue, t.member.id),
            width.saturating_sub(12).max(1),
        );
        let state = match &t.record {
            Some(r) => Span::styled(format!("  {}", r.state.as_str()), state_style(r.state)),
            None => Span::styled("  (expired)", DIM),
        };
        let lead = if t.parent.is_some() { "  └ " } else { "" };
        lines.push(Line::from(vec![
            key(""),
            Span::raw(format!("{lead}{name}")),
            state,
        ]));
    }
    if chain.tasks.len() > CHAIN_LINES {
        lines.push(Line::from(vec![
            key(""),
            Span::styled(
                format!(
                    "… {} more: gaffer tasks chain {}",
                    chain.tasks.len() - CHAIN_LINES,
                    printable(&chain.id)
                ),
                DIM,
            ),
        ]));
    }
    lines
}

/// The history, oldest first, from the scroll position on.
fn history_table(t: &TaskLookup, entries: &[HistoryEntry], area: Rect, buf: &mut Buffer) {
    const AT: u16 = 24;
    const STATE: u16 = 10;
    const ATTEMPT: u16 = 7;
    const COUNT: u16 = 6;
    let place = |e: &HistoryEntry| match (&e.host, e.slot) {
        (Some(h), Some(s)) => format!("{}/{s}", printable(h)),
        (Some(h), None) => printable(h).into_owned(),
        (None, Some(s)) => format!("slot {s}"),
        (None, None) => "-".into(),
    };
    let place_width = entries
        .iter()
        .map(|e| place(e).chars().count())
        .max()
        .unwrap_or(0)
        .clamp(9, 30) as u16;
    // Borders, the other columns and the spaces between the six.
    let fixed = 2 + AT + STATE + ATTEMPT + place_width + COUNT + 5;
    let note_width = usize::from(area.width.saturating_sub(fixed)).max(1);
    // Inside the borders, below the header.
    let visible = usize::from(area.height.saturating_sub(3));
    let n = entries.len();
    let first = t.scroll.min(n.saturating_sub(1));
    let last = (first + visible).min(n);
    let title = if n == 0 {
        " history · none kept ".to_string()
    } else if visible >= n {
        format!(" history · {n} entries, oldest first ")
    } else {
        format!(
            " history · entries {}-{last} of {n}, oldest first · j/k scroll ",
            first + 1
        )
    };
    let header = Row::new(vec![
        Cell::from("at"),
        Cell::from("state"),
        right("attempt".into()),
        Cell::from("host/slot"),
        Cell::from("note"),
        right("times".into()),
    ])
    .style(HEADER);
    let rows: Vec<Row<'_>> = entries[first..last]
        .iter()
        .map(|e| {
            Row::new(vec![
                Cell::from(e.at.as_str()),
                Cell::from(Span::styled(e.state.as_str(), state_style(e.state))),
                right(e.attempt.to_string()),
                Cell::from(place(e)),
                Cell::from(
                    e.note
                        .as_deref()
                        .map(|n| truncate(&single_line(n), note_width))
                        .unwrap_or_default(),
                ),
                right(e.count.map(|c| format!("×{c}")).unwrap_or_default()),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(AT),
        Constraint::Length(STATE),
        Constraint::Length(ATTEMPT),
        Constraint::Length(place_width),
        Constraint::Fill(1),
        Constraint::Length(COUNT),
    ];
    Table::new(rows, widths)
        .header(header)
        .column_spacing(1)
        .block(Block::bordered().title(title))
        .render(area, buf);
}

/// Line breaks (a newline in an error) as spaces, so a cell is one line, and every
/// other unprintable character escaped (see [`crate::printable`]).
fn single_line(text: &str) -> String {
    crate::printable::one_line(text)
}

/// `text` wrapped at spaces into lines of at most `width` characters (a longer word is
/// cut), at most `max_lines` of them, the last ending in … when text was left out.
fn wrap(text: &str, width: usize, max_lines: usize) -> Vec<String> {
    if width == 0 || max_lines == 0 {
        return Vec::new();
    }
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    let mut len = 0;
    for word in single_line(text).split(' ').filter(|w| !w.is_empty()) {
        let mut word: Vec<char> = word.chars().collect();
        loop {
            let gap = usize::from(len > 0);
            if len + gap + word.len() <= width {
                if gap == 1 {
                    line.push(' ');
                }
                line.extend(word.iter());
                len += gap + word.len();
                break;
            }
            if len > 0 {
                lines.push(std::mem::take(&mut line));
                len = 0;
                continue;
            }
            // A word wider than the line: cut it.
            let rest = word.split_off(width);
            lines.push(word.iter().collect());
            word = rest;
        }
    }
    if len > 0 {
        lines.push(line);
    }
    if lines.len() > max_lines {
        lines.truncate(max_lines);
        if let Some(last) = lines.last_mut() {
            let mut kept: Vec<char> = last.chars().collect();
            kept.truncate(width - 1);
            *last = kept.into_iter().collect::<String>() + "…";
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn wrap_breaks_at_spaces_cuts_long_words_and_marks_what_it_leaves_out() {
        assert_eq!(wrap("a bb ccc", 4, 5), ["a bb", "ccc"]);
        assert_eq!(wrap("abcdefghij", 4, 5), ["abcd", "efgh", "ij"]);
        assert_eq!(wrap("one two three four", 5, 2), ["one", "two…"]);
        assert_eq!(wrap("line\nbreak", 20, 2), ["line break"]);
        assert!(wrap("x", 0, 3).is_empty());
    }
}
