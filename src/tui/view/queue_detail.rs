//! The queue detail screen: the selected queue's config, decision, intake and counters,
//! where its slots run, and sparklines of its history.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Widget, Wrap};

use super::charts::{now_max, series, spark, whole};
use super::{
    BOLD, DIM, GREEN, RED, RED_BOLD, YELLOW, field, host_state, intake, key, pct, rate, secs,
};
use crate::cluster::snapshot::Snapshot;
use crate::config::Intake;
use crate::tui::state::{QueueRow, State, rates};

/// The selected queue: its figures and placement on the left, its history on the right.
pub(super) fn queue_detail(state: &State, area: Rect, buf: &mut Buffer) {
    let rows = state.queue_rows();
    let Some(r) = rows.get(state.queue_index(&rows)) else {
        Paragraph::new("no queues in the config")
            .block(Block::bordered())
            .render(area, buf);
        return;
    };
    let name = r.name.to_string();
    let [info, charts] = area.layout(&Layout::horizontal([
        Constraint::Length(72),
        Constraint::Fill(1),
    ]));
    let mut lines = settings(r);
    lines.extend(counters(r));
    lines.extend(placement(state, &name));
    let now_ms = state.history.latest().map_or(0, |s| s.at_ms);
    lines.extend(super::long_tasks::long_tasks(r.view, now_ms));
    Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .block(Block::bordered().title(format!(" queue {name} ")))
        .render(info, buf);
    history(state, &name, charts, buf);
}

/// What the queue is asked to do and what the manager made of it: config, slots, load and
/// its reason, intake.
fn settings(r: &QueueRow<'_>) -> Vec<Line<'static>> {
    let q = r.view;
    let d = q.decision.as_ref();
    vec![
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
        field(
            "slots",
            format!(
                "running {}  wanted {}  average {:.1}  in map {}",
                q.slots,
                r.wanted.map_or_else(|| "-".into(), |w| w.to_string()),
                r.slots_avg,
                q.mapped
            ),
        ),
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
        field("why", d.map(|d| d.reason_text()).unwrap_or_default()),
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
    ]
}

/// What went through the queue: its tasks now, rates, and the counters of the queue and
/// of its handlers.
fn counters(r: &QueueRow<'_>) -> Vec<Line<'static>> {
    let q = r.view;
    let s = &q.stats;
    vec![
        field(
            "tasks",
            format!(
                "ready {}  delayed {}  leased {}  dead {}  frozen {}",
                s.ready, s.delayed, s.leased, s.dead, s.frozen
            ),
        ),
        field(
            "late",
            format!(
                "oldest due task waiting {}",
                crate::cluster::snapshot::late_text(s.oldest_due_age_ms)
            ),
        ),
        field(
            "rates",
            format!(
                "done {}/s  errors {}/s  mean task {}",
                rate(r.rates.done_per_s),
                rate(r.rates.errors_per_s),
                secs(r.rates.mean_task_s)
            ),
        ),
        field(
            "totals",
            format!(
                "enqueued {}  acked {}  retried {}  dead {}",
                s.enqueued_total, s.acked_total, s.retried_total, s.dead_total
            ),
        ),
        field(
            "",
            format!(
                "stale {}  expired {}  requeued {}  purged {}  cancelled {}",
                s.stale_total, s.expired_total, s.requeued_total, s.purged_total, s.cancelled_total
            ),
        ),
        field(
            "handlers",
            format!(
                "processed {}  failed {}  busy {:.1}s",
                q.processed_total, q.failed_total, q.busy_seconds_total,
            ),
        ),
        field(
            "",
            format!("recycles {}  crashes {}", q.recycles_total, q.crashes_total),
        ),
        field(
            "last crash",
            q.last_crash.as_ref().map_or_else(
                || "-".to_string(),
                |(host, c)| {
                    let last = c.reason.lines().last().unwrap_or_default();
                    format!("on {host}: {}", crate::printable::printable(last))
                },
            ),
        ),
    ]
}

/// Where the queue's slots run and where the map puts them, host by host; hosts with
/// neither are left out.
fn placement(state: &State, name: &str) -> Vec<Line<'static>> {
    let mut lines = vec![
        Line::raw(""),
        Line::styled("placement  host: running / in map", BOLD),
    ];
    if let Some(latest) = state.history.latest() {
        let mut any = false;
        for (host, h) in &latest.hosts {
            let running = h.report.queues.get(name).map_or(0, |x| x.slots);
            let mapped = latest
                .map
                .as_ref()
                .and_then(|m| m.hosts.get(host)?.get(name).copied())
                .unwrap_or(0);
            if running == 0 && mapped == 0 {
                continue;
            }
            any = true;
            lines.push(Line::from(vec![
                Span::raw(format!(
                    "  {:<20} {running:>4} / {mapped:<4} ",
                    crate::printable::printable(host)
                )),
                host_state(h.state, h.drain_requested),
            ]));
        }
        if !any {
            lines.push(Line::styled("  no slots anywhere", DIM));
        }
    }
    lines
}

/// Sparklines of the queue over the history: ready, done/s, errors/s, slots, load.
fn history(state: &State, name: &str, charts: Rect, buf: &mut Buffer) {
    let of = |s: &Snapshot| s.queues.get(name).cloned();
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
