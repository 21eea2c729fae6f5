//! A long queue's running tasks on its detail screen: id, where it runs, since when.

use ratatui::text::{Line, Span};

use super::{BOLD, DIM};
use crate::cluster::snapshot::QueueView;
use crate::config::QueueKind;
use crate::printable::printable;

/// Lines listing the queue's running long tasks as of `now_ms` (the snapshot's time);
/// nothing for a batch queue.
pub(super) fn long_tasks(q: &QueueView, now_ms: u64) -> Vec<Line<'static>> {
    if q.kind != QueueKind::Long {
        return Vec::new();
    }
    let mut lines = vec![
        Line::raw(""),
        Line::styled(
            format!(
                "long tasks  {} running  (id · host/slot · running for)",
                q.stats.leased
            ),
            BOLD,
        ),
    ];
    if q.long_running.is_empty() {
        lines.push(Line::styled("  none running", DIM));
    }
    for t in &q.long_running {
        let slot = t.slot.map_or_else(|| "-".into(), |s| s.to_string());
        let running_for = std::time::Duration::from_secs(now_ms.saturating_sub(t.since_ms) / 1000);
        lines.push(Line::from(vec![
            Span::raw(format!("  {:<28} ", printable(&t.id))),
            Span::raw(format!("{:<20} ", format!("{}/{slot}", printable(&t.host)))),
            Span::raw(humantime::format_duration(running_for).to_string()),
        ]));
    }
    if (q.long_running.len() as u64) < q.stats.leased && !q.long_running.is_empty() {
        lines.push(Line::styled(
            format!("  … {} more", q.stats.leased - q.long_running.len() as u64),
            DIM,
        ));
    }
    lines
}
