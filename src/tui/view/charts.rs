//! The detail screens' sparklines: a series over the history and its labelled chart.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::{Block, Sparkline, SparklineBar, Widget};

use crate::cluster::snapshot::Snapshot;
use crate::tui::state::State;

/// A labelled sparkline of the newest values that fit.
pub(super) fn spark(
    title: String,
    data: &[Option<f64>],
    style: Style,
    area: Rect,
    buf: &mut Buffer,
) {
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
pub(super) fn series(
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

pub(super) fn now_max(values: &[Option<f64>], fmt: impl Fn(Option<f64>) -> String) -> String {
    let now = values.last().copied().flatten();
    let max = values.iter().flatten().copied().reduce(f64::max);
    format!("now {}  max {}", fmt(now), fmt(max))
}

pub(super) fn whole(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}
