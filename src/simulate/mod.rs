//! `gaffer simulate`: the real balancer in a deterministic discrete-time simulation of a
//! cluster, beside the rules it has to beat (`hpa`: KEDA's queue-length autoscaling;
//! `static`: every queue at its minimum).
//!
//! Time advances in steps of [`STEP`]. Arrivals are Poisson per step (seeded); slots
//! work off their queue's backlog FIFO at the mean task time; a new slot works after the
//! trace's `slot_start`. Waits (enqueue to start) go into a histogram with 10 ms
//! resolution. All three policies place slots with the balancer's placement, so they
//! differ only in how many slots each queue gets, and when.

pub mod trace;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use serde::Serialize;

use crate::balancer::{self, HostState, Input, Placement, QueueWindow};
use crate::config::Config;
pub use trace::Trace;

/// Simulated time per step.
pub const STEP: Duration = Duration::from_millis(100);
/// The statistics window the simulated manager averages over.
const WINDOW: Duration = Duration::from_secs(60);
/// KEDA/HPA sync period and scale-down stabilisation.
const HPA_SYNC: Duration = Duration::from_secs(15);
const HPA_STABILISATION: Duration = Duration::from_secs(300);

/// Which rule decides the slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// gaffer's balancer, every manager tick.
    Gaffer,
    /// The Kubernetes HPA rule that KEDA drives from queue length.
    Hpa,
    /// Every queue at `min_slots`.
    Static,
}

/// Per queue figures of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueueReport {
    /// Tasks that arrived.
    pub arrived: u64,
    /// Tasks handled.
    pub done: u64,
    /// Median wait from enqueue to start, ms.
    pub wait_p50_ms: u64,
    /// 99th percentile wait, ms.
    pub wait_p99_ms: u64,
    /// Longest wait, ms.
    pub wait_max_ms: u64,
    /// Largest backlog seen.
    pub max_backlog: u64,
    /// Slots averaged over the run.
    pub mean_slots: f64,
    /// Σ |change| of the queue's slots over all decisions.
    pub slot_changes: u64,
}

/// The report of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The rule that decided.
    pub policy: Policy,
    /// Simulated seconds.
    pub duration_seconds: f64,
    /// The trace's seed.
    pub seed: u64,
    /// Per queue of the config.
    pub queues: BTreeMap<String, QueueReport>,
    /// Slots that left one queue for another in the same decision.
    pub slot_moves: u64,
    /// Slots started.
    pub slot_starts: u64,
    /// Busy slot-seconds / slot-seconds.
    pub mean_utilisation: f64,
}

/// SplitMix64: small, seeded, and enough for arrivals.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn poisson(&mut self, lambda: f64) -> u64 {
        if lambda <= 0.0 {
            return 0;
        }
        if lambda < 30.0 {
            let (limit, mut p, mut k) = ((-lambda).exp(), 1.0, 0u64);
            loop {
                p *= self.uniform();
                if p <= limit {
                    return k;
                }
                k += 1;
            }
        }
        // Normal approximation (Box–Muller) for large means.
        let z =
            (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos();
        (lambda + z * lambda.sqrt()).round().max(0.0) as u64
    }
}

#[derive(Default)]
struct QueueSim {
    backlog: VecDeque<(u64, u64)>,
    backlog_total: u64,
    active: u32,
    pending: VecDeque<(u64, u32)>,
    carry: f64,
    task_seconds: f64,
    arrived: u64,
    done: u64,
    busy_seconds: f64,
    lifetime_seconds: f64,
    waits: BTreeMap<u64, u64>,
    slot_steps: u64,
    slot_changes: u64,
    max_backlog: u64,
}

impl QueueSim {
    fn slots(&self) -> u32 {
        self.active + self.pending.iter().map(|p| p.1).sum::<u32>()
    }

    /// Sets the queue's slots; returns (started, stopped).
    fn set_slots(&mut self, n: u32, now_ms: u64, start_ms: u64) -> (u32, u32) {
        let cur = self.slots();
        if n > cur {
            self.pending.push_back((now_ms + start_ms, n - cur));
            self.slot_changes += u64::from(n - cur);
            return (n - cur, 0);
        }
        let mut drop = cur - n;
        self.slot_changes += u64::from(drop);
        let stopped = drop;
        // Slots still starting go first: they hold no work.
        while drop > 0 {
            let Some(last) = self.pending.back_mut() else {
                break;
            };
            let d = last.1.min(drop);
            last.1 -= d;
            drop -= d;
            if last.1 == 0 {
                self.pending.pop_back();
            }
        }
        self.active -= drop.min(self.active);
        (0, stopped)
    }

    fn percentile(&self, q: f64) -> u64 {
        let total: u64 = self.waits.values().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (&bucket, &n) in &self.waits {
            seen += n;
            if seen >= rank {
                return bucket * 10;
            }
        }
        0
    }
}

struct Sample {
    at_ms: u64,
    /// Per queue, in the order of the config's (and `sims`') keys.
    counters: Vec<(u64, u64, f64, f64)>,
}

/// Runs `trace` against the queues of `config` under `policy`.
pub fn run(config: &Config, trace: &Trace, policy: Policy) -> Result<Report, String> {
    for l in &trace.load {
        if !config.queues.contains_key(&l.queue) {
            return Err(format!(
                "the trace loads queue `{}`, which is not in the config",
                l.queue
            ));
        }
    }
    let step_ms = STEP.as_millis() as u64;
    let end_ms = trace.duration.as_millis() as u64;
    let start_ms = trace.hosts.slot_start.as_millis() as u64;
    let heartbeat_ms = config.manager.heartbeat_timeout.as_millis() as u64;
    let tick_ms = match policy {
        Policy::Gaffer => (config.manager.tick.as_millis() as u64).max(step_ms),
        Policy::Hpa => HPA_SYNC.as_millis() as u64,
        Policy::Static => step_ms,
    };
    let handlers: BTreeSet<String> = config
        .queues
        .values()
        .map(|q| q.handler.name().to_string())
        .collect();
    let host_names: Vec<String> = (0..trace.hosts.count)
        .map(|i| format!("host{i:03}"))
        .collect();
    let mut dead_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut events = trace.events.iter().peekable();
    let mut rng = Rng(trace.seed ^ 0x6761_6666_6572);
    let mut sims: BTreeMap<String, QueueSim> = config
        .queues
        .keys()
        .map(|q| (q.clone(), QueueSim::default()))
        .collect();
    let mut map = Placement::new();
    let mut samples: VecDeque<Sample> = VecDeque::new();
    let mut hpa_history: BTreeMap<String, VecDeque<(u64, u32)>> = BTreeMap::new();
    let (mut slot_moves, mut slot_starts) = (0u64, 0u64);
    let (mut busy_total, mut slot_seconds_total) = (0.0f64, 0.0f64);
    // A Monday at midnight UTC: work periods line up with the trace's clock.
    let epoch = chrono::DateTime::from_timestamp(1_767_571_200, 0).expect("a valid date");
    let no_pause = BTreeSet::new();

    // Load segments per queue, in the order of `sims`.
    let loads: Vec<Vec<&trace::Load>> = sims
        .keys()
        .map(|q| trace.load.iter().filter(|l| &l.queue == q).collect())
        .collect();
    let (mut map_changed, mut dead_seen) = (true, 0usize);

    let mut t = 0u64;
    while t < end_ms {
        // Faults: the last alive hosts die; their slots vanish now, the manager notices
        // after the heartbeat timeout.
        while let Some(e) = events.next_if(|e| e.at.as_millis() as u64 <= t) {
            let mut left = e.kill_hosts;
            for h in host_names.iter().rev() {
                if left == 0 {
                    break;
                }
                if !dead_at.contains_key(h) {
                    dead_at.insert(h.clone(), t);
                    left -= 1;
                }
            }
        }

        if t.is_multiple_of(tick_ms) {
            let hosts: BTreeMap<String, HostState> = host_names
                .iter()
                .map(|h| {
                    let known_dead = dead_at.get(h).is_some_and(|&d| t >= d + heartbeat_ms);
                    (
                        h.clone(),
                        HostState {
                            capacity: trace.hosts.capacity(),
                            handlers: handlers.clone(),
                            alive: !known_dead,
                            draining: false,
                        },
                    )
                })
                .collect();
            // Statistics for the window, as the manager would read them.
            samples.push_back(Sample {
                at_ms: t,
                counters: sims
                    .values()
                    .map(|s| (s.arrived, s.done, s.busy_seconds, s.lifetime_seconds))
                    .collect(),
            });
            while samples.len() > 2 && t - samples[1].at_ms >= WINDOW.as_millis() as u64 {
                samples.pop_front();
            }
            let targets: Option<BTreeMap<String, u32>> = match policy {
                Policy::Gaffer => None,
                Policy::Static => Some(
                    config
                        .queues
                        .iter()
                        .map(|(q, c)| (q.clone(), c.min_slots))
                        .collect(),
                ),
                Policy::Hpa => Some(
                    config
                        .queues
                        .iter()
                        .map(|(q, c)| {
                            let backlog = sims[q].backlog_total as f64;
                            let desired = ((backlog / trace.hpa_target).ceil() as u32)
                                .clamp(c.min_slots, c.max_slots);
                            let hist = hpa_history.entry(q.clone()).or_default();
                            hist.push_back((t, desired));
                            while hist.front().is_some_and(|&(at, _)| {
                                at + (HPA_STABILISATION.as_millis() as u64) < t
                            }) {
                                hist.pop_front();
                            }
                            // Up at once; down only to the highest recommendation of the
                            // stabilisation window.
                            let stable = hist.iter().map(|h| h.1).max().unwrap_or(desired);
                            (q.clone(), desired.max(stable))
                        })
                        .collect(),
                ),
            };
            let (old, new) = (
                samples.front().expect("pushed"),
                samples.back().expect("pushed"),
            );
            let window_seconds = (new.at_ms - old.at_ms) as f64 / 1000.0;
            let stats: BTreeMap<String, QueueWindow> = config
                .queues
                .iter()
                .zip(sims.values())
                .enumerate()
                .map(|(k, ((q, c), s))| {
                    let (a1, d1, b1, l1) = new.counters[k];
                    let (a0, d0, b0, l0) = old.counters[k];
                    let leased = s
                        .backlog_total
                        .min(u64::from(s.active) * u64::from(c.batch_size));
                    (
                        q.clone(),
                        QueueWindow {
                            window_seconds,
                            ready: s.backlog_total - leased,
                            leased,
                            arrived: a1 - a0,
                            processed: d1 - d0,
                            busy_seconds: b1 - b0,
                            slot_lifetime_seconds: l1 - l0,
                        },
                    )
                })
                .collect();
            let input = Input {
                config,
                stats: &stats,
                current: &map,
                hosts: &hosts,
                now: epoch + chrono::Duration::milliseconds(t as i64),
                paused: &no_pause,
            };
            let next = match targets {
                None => balancer::decide(&input).map,
                Some(wanted) => balancer::place_wanted(&input, &wanted),
            };
            if next != map {
                map = next;
                map_changed = true;
            }
        }

        // The slots that run: the map's, on hosts that are really alive. Only a decision
        // or a fault changes them.
        if map_changed || dead_at.len() != dead_seen {
            map_changed = false;
            dead_seen = dead_at.len();
            let mut running: BTreeMap<&str, u32> = BTreeMap::new();
            for (h, qs) in &map {
                if dead_at.contains_key(h) {
                    continue;
                }
                for (q, &n) in qs {
                    *running.entry(q.as_str()).or_default() += n;
                }
            }
            let (mut started, mut stopped) = (0u64, 0u64);
            for (q, s) in &mut sims {
                let (up, down) =
                    s.set_slots(running.get(q.as_str()).copied().unwrap_or(0), t, start_ms);
                started += u64::from(up);
                stopped += u64::from(down);
            }
            slot_starts += started;
            slot_moves += started.min(stopped);
        }

        let dt = step_ms as f64 / 1000.0;
        for (s, segments) in sims.values_mut().zip(&loads) {
            let (mut rate, mut weighted) = (0.0, 0.0);
            for l in segments {
                let r = l.rate_at(Duration::from_millis(t));
                rate += r;
                weighted += r * l.task_time.as_secs_f64();
            }
            if rate > 0.0 {
                s.task_seconds = weighted / rate;
                let n = rng.poisson(rate * dt);
                if n > 0 {
                    s.backlog.push_back((t + step_ms / 2, n));
                    s.backlog_total += n;
                    s.arrived += n;
                }
            }
            while s.pending.front().is_some_and(|p| p.0 <= t) {
                s.active += s.pending.pop_front().expect("checked").1;
            }
            let slots = s.slots();
            s.lifetime_seconds += f64::from(slots) * dt;
            s.slot_steps += u64::from(slots);
            slot_seconds_total += f64::from(slots) * dt;
            if s.task_seconds > 0.0 && s.active > 0 {
                let capacity = f64::from(s.active) * dt / s.task_seconds + s.carry;
                let mut n = (capacity.floor() as u64).min(s.backlog_total);
                s.carry = if n == s.backlog_total {
                    0.0
                } else {
                    (capacity - n as f64).min(1.0)
                };
                let handled = n;
                while n > 0 {
                    let front = s.backlog.front_mut().expect("backlog_total > 0");
                    let k = front.1.min(n);
                    let wait = t.saturating_sub(front.0);
                    *s.waits.entry(wait / 10).or_default() += k;
                    front.1 -= k;
                    n -= k;
                    if front.1 == 0 {
                        s.backlog.pop_front();
                    }
                }
                s.backlog_total -= handled;
                s.done += handled;
                let busy = handled as f64 * s.task_seconds;
                s.busy_seconds += busy;
                busy_total += busy;
            }
            s.max_backlog = s.max_backlog.max(s.backlog_total);
        }
        t += step_ms;
    }

    let steps = (end_ms / step_ms).max(1) as f64;
    let queues = sims
        .iter()
        .map(|(q, s)| {
            (
                q.clone(),
                QueueReport {
                    arrived: s.arrived,
                    done: s.done,
                    wait_p50_ms: s.percentile(0.5),
                    wait_p99_ms: s.percentile(0.99),
                    wait_max_ms: s.waits.keys().next_back().map_or(0, |b| b * 10),
                    max_backlog: s.max_backlog,
                    mean_slots: s.slot_steps as f64 / steps,
                    slot_changes: s.slot_changes,
                },
            )
        })
        .collect();
    Ok(Report {
        policy,
        duration_seconds: end_ms as f64 / 1000.0,
        seed: trace.seed,
        queues,
        slot_moves,
        slot_starts,
        mean_utilisation: if slot_seconds_total > 0.0 {
            busy_total / slot_seconds_total
        } else {
            0.0
        },
    })
}

impl Report {
    /// The report as a table for people.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "policy {:?}, {:.0} s simulated, seed {}",
            self.policy, self.duration_seconds, self.seed
        );
        let _ = writeln!(
            s,
            "{:<20} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
            "queue", "arrived", "done", "p50 ms", "p99 ms", "max ms", "backlog", "slots", "changes"
        );
        for (q, r) in &self.queues {
            let _ = writeln!(
                s,
                "{:<20} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8.1} {:>8}",
                q,
                r.arrived,
                r.done,
                r.wait_p50_ms,
                r.wait_p99_ms,
                r.wait_max_ms,
                r.max_backlog,
                r.mean_slots,
                r.slot_changes
            );
        }
        let _ = writeln!(
            s,
            "slot moves {}, slot starts {}, mean utilisation {:.1} %",
            self.slot_moves,
            self.slot_starts,
            self.mean_utilisation * 100.0
        );
        s
    }
}
