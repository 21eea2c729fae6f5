//! Statistics over a sliding window, from the monotonic counters queues and masters keep.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::balancer::QueueWindow;
use crate::cluster::HostReport;
use crate::queue_client::QueueStats;

/// Per host: when its master started, and per queue (processed, busy s, lifetime s).
type HostCounters = BTreeMap<String, (u64, BTreeMap<String, (u64, f64, f64)>)>;

struct Sample {
    at: Instant,
    enqueued: BTreeMap<String, u64>,
    hosts: HostCounters,
}

/// Samples of the last `window`, one per tick.
pub struct Windows {
    window: Duration,
    samples: VecDeque<Sample>,
}

impl Windows {
    /// An empty history averaging over `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: VecDeque::new(),
        }
    }

    /// Adds this tick's counters and forgets those older than the window.
    pub fn record(
        &mut self,
        at: Instant,
        queues: &BTreeMap<String, QueueStats>,
        hosts: &BTreeMap<String, HostReport>,
    ) {
        self.samples.push_back(Sample {
            at,
            enqueued: queues
                .iter()
                .map(|(q, s)| (q.clone(), s.enqueued_total))
                .collect(),
            hosts: hosts
                .iter()
                .map(|(h, r)| {
                    let per_queue = r
                        .queues
                        .iter()
                        .map(|(q, qr)| {
                            (
                                q.clone(),
                                (
                                    qr.processed_total,
                                    qr.busy_seconds_total,
                                    qr.slot_lifetime_seconds_total,
                                ),
                            )
                        })
                        .collect();
                    (h.clone(), (r.started_ms, per_queue))
                })
                .collect(),
        });
        while self.samples.len() > 2 && at.duration_since(self.samples[1].at) >= self.window {
            self.samples.pop_front();
        }
    }

    /// Per queue: what happened between the oldest and the newest sample, with the
    /// backlog of now.
    pub fn windows(&self, queues: &BTreeMap<String, QueueStats>) -> BTreeMap<String, QueueWindow> {
        let (Some(old), Some(new)) = (self.samples.front(), self.samples.back()) else {
            return BTreeMap::new();
        };
        let seconds = new.at.duration_since(old.at).as_secs_f64();
        queues
            .iter()
            .map(|(q, s)| {
                let mut w = QueueWindow {
                    window_seconds: seconds,
                    ready: s.ready,
                    leased: s.leased,
                    arrived: new
                        .enqueued
                        .get(q)
                        .copied()
                        .unwrap_or(0)
                        .saturating_sub(old.enqueued.get(q).copied().unwrap_or(0)),
                    ..QueueWindow::default()
                };
                for (host, (started, per_queue)) in &new.hosts {
                    let Some(&(p, b, l)) = per_queue.get(q) else {
                        continue;
                    };
                    // A master that restarted counts from zero again.
                    let (p0, b0, l0) = old
                        .hosts
                        .get(host)
                        .filter(|(s0, _)| s0 == started)
                        .and_then(|(_, pq)| pq.get(q).copied())
                        .unwrap_or((0, 0.0, 0.0));
                    w.processed += p.saturating_sub(p0);
                    w.busy_seconds += (b - b0).max(0.0);
                    w.slot_lifetime_seconds += (l - l0).max(0.0);
                }
                (q.clone(), w)
            })
            .collect()
    }
}
