//! The statistics window in front of the balancer: what happened over the last minute,
//! from the monotonic counters queues and masters keep.
//!
//! One window for the manager and the simulator. The manager feeds it the counters it
//! reads from Redis ([`Sample::from_reports`]), `gaffer simulate` the counters of its
//! simulated cluster; both read it with the backlog of now. It is pure: time is an input
//! value (the manager's monotonic clock, the simulator's simulated one), and it does no
//! I/O.
//!
//! Counters are kept in index form: a sample's per-queue columns follow its `queues`
//! (the config's queue names, in its order), so a simulated day of decisions looks
//! nothing up by name. Two samples whose queues differ (a config was adopted in between)
//! are matched by name, as if every counter were keyed by its queue.
//!
//! A sample holds monotonic counters: each queue's `enqueued`, and per master its start and
//! its per-queue work; a restarted master counts from zero. The window gives per-queue
//! [`QueueWindow`] deltas with the backlog of now, and the latest tick's arrivals beside
//! them (the balancer's surge rule).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::balancer::QueueWindow;
use crate::cluster::HostReport;
use crate::queue_client::QueueStats;

/// A master's counters for one queue, monotonic since the master started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkCounters {
    /// Tasks handled (any outcome).
    pub processed: u64,
    /// Seconds slots spent inside handlers.
    pub busy_seconds: f64,
    /// Seconds slots of the queue lived.
    pub slot_lifetime_seconds: f64,
}

/// What one master (a reporter of work) counted at a sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostCounters {
    /// When this master started: its counters restart from zero with a new value.
    pub started_ms: u64,
    /// Per queue of the sample's `queues`; `None` where the master reports nothing.
    pub queues: Vec<Option<WorkCounters>>,
}

/// The counters of one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// When, on the caller's monotonic clock.
    pub at: Duration,
    /// The queue names the per-queue columns follow.
    pub queues: Arc<[String]>,
    /// Per queue: tasks enqueued in total, a counter of the queue itself.
    pub enqueued: Vec<u64>,
    /// Per host (by name): its master's counters.
    pub hosts: BTreeMap<String, HostCounters>,
}

impl Sample {
    /// The manager's sample: the queues' counters from `stats` (a queue without them
    /// counts 0), the masters' from their `reports`, at `at`.
    pub fn from_reports(
        at: Duration,
        queues: Arc<[String]>,
        stats: &BTreeMap<String, QueueStats>,
        reports: &BTreeMap<String, HostReport>,
    ) -> Self {
        let enqueued = queues
            .iter()
            .map(|q| stats.get(q).map_or(0, |s| s.enqueued_total))
            .collect();
        let hosts = reports
            .iter()
            .map(|(host, r)| {
                let per_queue = queues
                    .iter()
                    .map(|q| {
                        r.queues.get(q).map(|qr| WorkCounters {
                            processed: qr.processed_total,
                            busy_seconds: qr.busy_seconds_total,
                            slot_lifetime_seconds: qr.slot_lifetime_seconds_total,
                        })
                    })
                    .collect();
                let counters = HostCounters {
                    started_ms: r.started_ms,
                    queues: per_queue,
                };
                (host.clone(), counters)
            })
            .collect();
        Self {
            at,
            queues,
            enqueued,
            hosts,
        }
    }
}

/// A queue's backlog now, split as the balancer reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Tasks ready and due.
    pub ready: u64,
    /// Tasks leased: work in flight.
    pub leased: u64,
}

impl From<&QueueStats> for Backlog {
    fn from(s: &QueueStats) -> Self {
        Self {
            ready: s.ready,
            leased: s.leased,
        }
    }
}

/// The samples of the last `length`, one per decision.
#[derive(Debug, Clone)]
pub struct StatsWindow {
    length: Duration,
    samples: VecDeque<Sample>,
}

impl StatsWindow {
    /// The length the manager averages over unless told otherwise, and the simulator.
    pub const DEFAULT_LENGTH: Duration = Duration::from_secs(60);

    /// An empty window over `length`.
    pub fn new(length: Duration) -> Self {
        Self {
            length,
            samples: VecDeque::new(),
        }
    }

    /// How far back it reaches once it has seen that much.
    pub fn length(&self) -> Duration {
        self.length
    }

    /// Adds a sample, later than the last one, and forgets the oldest while the one after
    /// it still covers the length: the window spans at least `length` once it can, and
    /// always keeps two samples.
    pub fn record(&mut self, sample: Sample) {
        let at = sample.at;
        self.samples.push_back(sample);
        while self.samples.len() > 2 && at.saturating_sub(self.samples[1].at) >= self.length {
            self.samples.pop_front();
        }
    }

    /// Whether it holds two samples, so rates over a span: with one, every queue reads as
    /// idle.
    pub fn has_rates(&self) -> bool {
        self.samples.len() >= 2
    }

    /// Time between the oldest and the newest sample kept.
    pub fn span(&self) -> Duration {
        match (self.samples.front(), self.samples.back()) {
            (Some(old), Some(new)) => new.at.saturating_sub(old.at),
            _ => Duration::ZERO,
        }
    }

    /// Per queue of the newest sample: what happened between the oldest and the newest
    /// sample (and, as `recent_*`, between the two newest: the latest tick), with
    /// `backlog` (now, same order) as its ready and leased.
    pub fn read(&self, backlog: &[Backlog]) -> Vec<QueueWindow> {
        let mut out = vec![QueueWindow::default(); backlog.len()];
        self.read_into(backlog, &mut out);
        out
    }

    /// [`StatsWindow::read`] into `out` (as long as `backlog`), for a caller that reads
    /// often; with no sample yet every queue reads as idle.
    pub fn read_into(&self, backlog: &[Backlog], out: &mut [QueueWindow]) {
        assert_eq!(backlog.len(), out.len(), "one backlog per queue window");
        let (Some(old), Some(new)) = (self.samples.front(), self.samples.back()) else {
            out.fill(QueueWindow::default());
            return;
        };
        let columns = Columns::between(old, new);
        let window_seconds = new.at.saturating_sub(old.at).as_secs_f64();
        // The latest tick: the balancer meets a surge from it before the average shows it.
        let prev = &self.samples[self.samples.len().saturating_sub(2)];
        let recent = Columns::between(prev, new);
        let recent_seconds = new.at.saturating_sub(prev.at).as_secs_f64();
        for (k, (w, b)) in out.iter_mut().zip(backlog).enumerate() {
            let before = columns.old(k).map_or(0, |j| old.enqueued[j]);
            let before_tick = recent.old(k).map_or(0, |j| prev.enqueued[j]);
            *w = QueueWindow {
                window_seconds,
                ready: b.ready,
                leased: b.leased,
                arrived: new.enqueued[k].saturating_sub(before),
                recent_seconds,
                recent_arrived: new.enqueued[k].saturating_sub(before_tick),
                ..QueueWindow::default()
            };
        }
        for (host, now) in &new.hosts {
            // A master that restarted counts from zero again.
            let then = old
                .hosts
                .get(host)
                .filter(|h| h.started_ms == now.started_ms);
            for (k, w) in out.iter_mut().enumerate() {
                let Some(c) = now.queues.get(k).copied().flatten() else {
                    continue;
                };
                let c0 = then
                    .zip(columns.old(k))
                    .and_then(|(h, j)| h.queues.get(j).copied().flatten())
                    .unwrap_or_default();
                w.processed += c.processed.saturating_sub(c0.processed);
                w.busy_seconds += (c.busy_seconds - c0.busy_seconds).max(0.0);
                w.slot_lifetime_seconds +=
                    (c.slot_lifetime_seconds - c0.slot_lifetime_seconds).max(0.0);
            }
        }
    }
}

/// Where the newest sample's queue columns are in the oldest one's.
enum Columns {
    /// The same queues, in the same order.
    Same,
    /// Per column of the newest sample, the oldest's column of that name.
    Renamed(Vec<Option<usize>>),
}

impl Columns {
    fn between(old: &Sample, new: &Sample) -> Self {
        if Arc::ptr_eq(&old.queues, &new.queues) || old.queues == new.queues {
            return Self::Same;
        }
        Self::Renamed(
            new.queues
                .iter()
                .map(|q| old.queues.iter().position(|o| o == q))
                .collect(),
        )
    }

    fn old(&self, k: usize) -> Option<usize> {
        match self {
            Self::Same => Some(k),
            Self::Renamed(ix) => ix[k],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(names: &[&str]) -> Arc<[String]> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn work(processed: u64, busy_seconds: f64, slot_lifetime_seconds: f64) -> WorkCounters {
        WorkCounters {
            processed,
            busy_seconds,
            slot_lifetime_seconds,
        }
    }

    fn host(started_ms: u64, queues: &[Option<WorkCounters>]) -> HostCounters {
        HostCounters {
            started_ms,
            queues: queues.to_vec(),
        }
    }

    fn sample(
        secs: u64,
        queues: &Arc<[String]>,
        enqueued: &[u64],
        hosts: &[(&str, HostCounters)],
    ) -> Sample {
        Sample {
            at: Duration::from_secs(secs),
            queues: queues.clone(),
            enqueued: enqueued.to_vec(),
            hosts: hosts
                .iter()
                .map(|(n, h)| (n.to_string(), h.clone()))
                .collect(),
        }
    }

    fn idle(n: usize) -> Vec<Backlog> {
        vec![Backlog::default(); n]
    }

    #[test]
    fn deltas_of_every_counter_summed_over_hosts() {
        let q = layout(&["a", "b"]);
        let mut w = StatsWindow::new(Duration::from_secs(60));
        w.record(sample(
            10,
            &q,
            &[100, 7],
            &[
                ("h1", host(1, &[Some(work(50, 5.0, 20.0)), None])),
                (
                    "h2",
                    host(1, &[Some(work(10, 1.0, 10.0)), Some(work(3, 0.5, 4.0))]),
                ),
            ],
        ));
        w.record(sample(
            40,
            &q,
            &[160, 7],
            &[
                ("h1", host(1, &[Some(work(80, 8.0, 50.0)), None])),
                (
                    "h2",
                    host(1, &[Some(work(15, 1.5, 40.0)), Some(work(3, 0.5, 34.0))]),
                ),
            ],
        ));
        let backlog = [
            Backlog {
                ready: 4,
                leased: 9,
            },
            Backlog::default(),
        ];
        let r = w.read(&backlog);
        assert_eq!(
            r[0],
            QueueWindow {
                window_seconds: 30.0,
                ready: 4,
                leased: 9,
                arrived: 60,
                processed: 35,
                busy_seconds: 3.5,
                slot_lifetime_seconds: 60.0,
                recent_seconds: 30.0,
                recent_arrived: 60,
            }
        );
        assert_eq!(
            r[1],
            QueueWindow {
                window_seconds: 30.0,
                slot_lifetime_seconds: 30.0,
                recent_seconds: 30.0,
                ..QueueWindow::default()
            }
        );
    }

    #[test]
    fn the_latest_tick_is_read_beside_the_window() {
        // 10 tasks per 2 s tick for 20 s, then 150 in the last tick: the window averages
        // them, the latest tick shows the jump alone.
        let q = layout(&["a"]);
        let mut w = StatsWindow::new(Duration::from_secs(60));
        for t in (0..=20).step_by(2) {
            w.record(sample(t, &q, &[t * 5], &[]));
        }
        w.record(sample(22, &q, &[100 + 150], &[]));
        let r = &w.read(&idle(1))[0];
        assert_eq!((r.window_seconds, r.arrived), (22.0, 250));
        assert_eq!((r.recent_seconds, r.recent_arrived), (2.0, 150));
    }

    #[test]
    fn a_restarted_master_counts_from_zero_again() {
        let q = layout(&["a"]);
        let mut w = StatsWindow::new(Duration::from_secs(60));
        w.record(sample(
            0,
            &q,
            &[0],
            &[
                ("h1", host(1_000, &[Some(work(900, 90.0, 600.0))])),
                ("h2", host(1_000, &[Some(work(100, 10.0, 60.0))])),
            ],
        ));
        // h1 restarted: its counters dropped and count since its new start; h2 did not,
        // and a counter of it that went down (never expected) counts nothing, not less.
        w.record(sample(
            20,
            &q,
            &[0],
            &[
                ("h1", host(5_000, &[Some(work(30, 3.0, 15.0))])),
                ("h2", host(1_000, &[Some(work(90, 12.0, 80.0))])),
            ],
        ));
        let r = &w.read(&idle(1))[0];
        assert_eq!(r.processed, 30);
        assert_eq!(r.busy_seconds, 3.0 + 2.0);
        assert_eq!(r.slot_lifetime_seconds, 15.0 + 20.0);
    }

    #[test]
    fn hosts_that_come_count_in_full_and_hosts_that_go_count_nothing() {
        let q = layout(&["a"]);
        let mut w = StatsWindow::new(Duration::from_secs(60));
        w.record(sample(
            0,
            &q,
            &[0],
            &[("gone", host(1, &[Some(work(10, 1.0, 10.0))]))],
        ));
        w.record(sample(
            10,
            &q,
            &[0],
            &[("new", host(1, &[Some(work(4, 2.0, 8.0))]))],
        ));
        assert_eq!(w.read(&idle(1))[0].processed, 4);
        assert_eq!(w.read(&idle(1))[0].slot_lifetime_seconds, 8.0);
    }

    #[test]
    fn a_queue_counter_that_drops_reads_as_no_arrivals() {
        // Redis lost its data: the queue's own counter starts again.
        let q = layout(&["a"]);
        let mut w = StatsWindow::new(Duration::from_secs(60));
        w.record(sample(0, &q, &[500], &[]));
        w.record(sample(2, &q, &[20], &[]));
        assert_eq!(w.read(&idle(1))[0].arrived, 0);
    }

    #[test]
    fn the_window_covers_its_length_and_keeps_two_samples() {
        let q = layout(&["a"]);
        let mut w = StatsWindow::new(Duration::from_secs(60));
        assert_eq!(w.length(), Duration::from_secs(60));
        assert_eq!(w.span(), Duration::ZERO);
        assert_eq!(w.read(&idle(1)), vec![QueueWindow::default()]);
        // One sample: a window of nothing yet.
        w.record(sample(0, &q, &[0], &[]));
        assert_eq!(w.read(&idle(1))[0].window_seconds, 0.0);
        // Every 2 s for 100 s: it grows to 60 s and stays there.
        for t in (2..=100).step_by(2) {
            w.record(sample(t, &q, &[t * 10], &[]));
            assert_eq!(w.span(), Duration::from_secs(t.min(60)), "at {t} s");
        }
        let r = &w.read(&idle(1))[0];
        assert_eq!(r.window_seconds, 60.0);
        assert_eq!(r.arrived, 600);
        // Every 7 s: the oldest kept sample is the newest at least 60 s old.
        let mut w = StatsWindow::new(Duration::from_secs(60));
        for t in (0..=140).step_by(7) {
            w.record(sample(t, &q, &[0], &[]));
        }
        assert_eq!(w.span(), Duration::from_secs(140 - 77));
        // A gap longer than the window: the two last samples stay.
        w.record(sample(1_000, &q, &[0], &[]));
        assert_eq!(w.span(), Duration::from_secs(1_000 - 140));
        assert_eq!(w.read(&idle(1))[0].window_seconds, 860.0);
    }

    #[test]
    fn queues_that_change_between_samples_are_matched_by_name() {
        let before = layout(&["a", "b"]);
        let after = layout(&["b", "c"]);
        let mut w = StatsWindow::new(Duration::from_secs(60));
        w.record(sample(
            0,
            &before,
            &[10, 20],
            &[(
                "h",
                host(1, &[Some(work(1, 1.0, 1.0)), Some(work(5, 5.0, 5.0))]),
            )],
        ));
        w.record(sample(
            10,
            &after,
            &[25, 3],
            &[(
                "h",
                host(1, &[Some(work(6, 6.0, 6.0)), Some(work(2, 2.0, 2.0))]),
            )],
        ));
        let r = w.read(&idle(2));
        assert_eq!((r[0].arrived, r[0].processed), (5, 1));
        // A queue the old sample did not have counts from zero.
        assert_eq!((r[1].arrived, r[1].processed), (3, 2));
    }

    /// The window is data in, data out: no clock, no Redis, no I/O (its time comes in
    /// with each sample).
    #[test]
    fn the_window_does_no_io_and_reads_no_clock() {
        let source = include_str!("window.rs");
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        for forbidden in [
            "tokio",
            "redis::",
            "Instant",
            "SystemTime",
            "now_ms()",
            "Utc::now",
            "std::fs",
            "std::net",
            ".await",
        ] {
            assert!(!code.contains(forbidden), "window.rs uses {forbidden}");
        }
    }

    #[test]
    fn the_managers_sample_comes_from_queue_stats_and_host_reports() {
        use crate::cluster::QueueReport;
        let q = layout(&["a", "b"]);
        let stats = BTreeMap::from([(
            "a".to_string(),
            QueueStats {
                enqueued_total: 42,
                ready: 3,
                leased: 2,
                ..QueueStats::default()
            },
        )]);
        let report = HostReport {
            started_ms: 77,
            queues: BTreeMap::from([
                (
                    "b".to_string(),
                    QueueReport {
                        processed_total: 9,
                        busy_seconds_total: 1.5,
                        slot_lifetime_seconds_total: 30.0,
                        ..QueueReport::default()
                    },
                ),
                ("not configured".to_string(), QueueReport::default()),
            ]),
            ..HostReport::default()
        };
        let reports = BTreeMap::from([("h".to_string(), report)]);
        let s = Sample::from_reports(Duration::from_secs(5), q.clone(), &stats, &reports);
        assert_eq!(
            s,
            sample(
                5,
                &q,
                &[42, 0],
                &[("h", host(77, &[None, Some(work(9, 1.5, 30.0))]))]
            )
        );
        assert_eq!(
            Backlog::from(&stats["a"]),
            Backlog {
                ready: 3,
                leased: 2
            }
        );
    }
}
