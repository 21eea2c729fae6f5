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

use crate::balancer::{Balancer, HostState, IndexedInput, QueueWindow};
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
    let nh = host_names.len();
    // The balancer orders hosts by name (its ties break by name); faults pick them by
    // number. `position[i]` is host number i's place in name order.
    let mut by_name: Vec<usize> = (0..nh).collect();
    by_name.sort_by(|&a, &b| host_names[a].cmp(&host_names[b]));
    let mut position = vec![0; nh];
    for (j, &i) in by_name.iter().enumerate() {
        position[i] = j;
    }
    // Indexed by name order from here on, as the map is.
    let mut dead_at: Vec<Option<u64>> = vec![None; nh];
    let mut dead = 0usize;
    let mut host_states: Vec<HostState> = (0..nh)
        .map(|_| HostState {
            capacity: trace.hosts.capacity(),
            handlers: handlers.clone(),
            alive: true,
            draining: false,
        })
        .collect();
    // One for the run: a simulated day is 43,200 decisions, and the tables, buffers and
    // map stay in index form between them.
    let mut balancer = Balancer::new(config);
    balancer.set_hosts(&host_states);
    let mut events = trace.events.iter().peekable();
    let mut rng = Rng(trace.seed ^ 0x6761_6666_6572);
    let nq = config.queues.len();
    let mut sims: Vec<QueueSim> = (0..nq).map(|_| QueueSim::default()).collect();
    // The map in force, in the balancer's index form: queue-major.
    let mut map = vec![0u32; nq * nh];
    let mut samples: VecDeque<Sample> = VecDeque::new();
    let mut spare_counters: Vec<Vec<(u64, u64, f64, f64)>> = Vec::new();
    let mut stats: Vec<QueueWindow> = vec![QueueWindow::default(); nq];
    let no_pause = vec![false; nq];
    let mut wanted = vec![0u32; nq];
    let mut last_wanted: Vec<u32> = Vec::new();
    // The last decision on exactly the current map, hosts and wanted slots left the map
    // as it was; the balancer is pure, so the same decision again would too.
    let mut settled = false;
    let mut hpa_history: Vec<VecDeque<(u64, u32)>> = vec![VecDeque::new(); nq];
    let (mut slot_moves, mut slot_starts) = (0u64, 0u64);
    let (mut busy_total, mut slot_seconds_total) = (0.0f64, 0.0f64);
    // A Monday at midnight UTC: work periods line up with the trace's clock.
    let epoch = chrono::DateTime::from_timestamp(1_767_571_200, 0).expect("a valid date");

    // Load segments per queue, in the order of `sims`.
    let loads: Vec<Vec<&trace::Load>> = config
        .queues
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
            for i in (0..nh).rev() {
                if left == 0 {
                    break;
                }
                let h = position[i];
                if dead_at[h].is_none() {
                    dead_at[h] = Some(t);
                    dead += 1;
                    left -= 1;
                }
            }
        }

        if t.is_multiple_of(tick_ms) {
            let mut hosts_changed = false;
            for (state, died) in host_states.iter_mut().zip(&dead_at) {
                let alive = !died.is_some_and(|d| t >= d + heartbeat_ms);
                if state.alive != alive {
                    state.alive = alive;
                    hosts_changed = true;
                }
            }
            if hosts_changed {
                balancer.set_hosts(&host_states);
                settled = false;
            }
            let decided = match policy {
                Policy::Gaffer => {
                    // Statistics for the window, as the manager would read them.
                    let mut counters = spare_counters.pop().unwrap_or_default();
                    counters.clear();
                    counters.extend(
                        sims.iter()
                            .map(|s| (s.arrived, s.done, s.busy_seconds, s.lifetime_seconds)),
                    );
                    samples.push_back(Sample { at_ms: t, counters });
                    while samples.len() > 2 && t - samples[1].at_ms >= WINDOW.as_millis() as u64 {
                        let old = samples.pop_front().expect("more than two");
                        spare_counters.push(old.counters);
                    }
                    let (old, new) = (
                        samples.front().expect("pushed"),
                        samples.back().expect("pushed"),
                    );
                    let window_seconds = (new.at_ms - old.at_ms) as f64 / 1000.0;
                    for (k, ((c, s), w)) in config
                        .queues
                        .values()
                        .zip(&sims)
                        .zip(&mut stats)
                        .enumerate()
                    {
                        let (a1, d1, b1, l1) = new.counters[k];
                        let (a0, d0, b0, l0) = old.counters[k];
                        let leased = s
                            .backlog_total
                            .min(u64::from(s.active) * u64::from(c.batch_size));
                        *w = QueueWindow {
                            window_seconds,
                            ready: s.backlog_total - leased,
                            leased,
                            arrived: a1 - a0,
                            processed: d1 - d0,
                            busy_seconds: b1 - b0,
                            slot_lifetime_seconds: l1 - l0,
                        };
                    }
                    balancer.decide(&IndexedInput {
                        stats: &stats,
                        current: &map,
                        now: epoch + chrono::Duration::milliseconds(t as i64),
                        paused: &no_pause,
                    });
                    true
                }
                Policy::Static | Policy::Hpa => {
                    for (k, (c, w)) in config.queues.values().zip(&mut wanted).enumerate() {
                        *w = match policy {
                            Policy::Static => c.min_slots,
                            _ => {
                                let backlog = sims[k].backlog_total as f64;
                                let desired = ((backlog / trace.hpa_target).ceil() as u32)
                                    .clamp(c.min_slots, c.max_slots);
                                let hist = &mut hpa_history[k];
                                hist.push_back((t, desired));
                                while hist.front().is_some_and(|&(at, _)| {
                                    at + (HPA_STABILISATION.as_millis() as u64) < t
                                }) {
                                    hist.pop_front();
                                }
                                // Up at once; down only to the highest recommendation of
                                // the stabilisation window.
                                let stable = hist.iter().map(|h| h.1).max().unwrap_or(desired);
                                desired.max(stable)
                            }
                        };
                    }
                    // Once settled, a decision changes nothing until the wanted slots
                    // or the hosts do: `static` would otherwise place every step.
                    let again = settled && wanted == last_wanted;
                    if !again {
                        balancer.place_wanted(&map, &wanted);
                        last_wanted.clone_from(&wanted);
                    }
                    !again
                }
            };
            if decided {
                settled = balancer.map() == map.as_slice();
                if !settled {
                    map.copy_from_slice(balancer.map());
                    map_changed = true;
                }
            }
        }

        // The slots that run: the map's, on hosts that are really alive. Only a decision
        // or a fault changes them.
        if map_changed || dead != dead_seen {
            map_changed = false;
            dead_seen = dead;
            let (mut started, mut stopped) = (0u64, 0u64);
            for (q, s) in sims.iter_mut().enumerate() {
                let running: u32 = map[q * nh..(q + 1) * nh]
                    .iter()
                    .zip(&dead_at)
                    .filter(|(_, died)| died.is_none())
                    .map(|(n, _)| *n)
                    .sum();
                let (up, down) = s.set_slots(running, t, start_ms);
                started += u64::from(up);
                stopped += u64::from(down);
            }
            slot_starts += started;
            slot_moves += started.min(stopped);
        }

        let dt = step_ms as f64 / 1000.0;
        for (s, segments) in sims.iter_mut().zip(&loads) {
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
                // `as` truncates and saturates (negatives and NaN to 0): floor without
                // a libm call per queue and step.
                let mut n = (capacity as u64).min(s.backlog_total);
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
    let queues = config
        .queues
        .keys()
        .zip(&sims)
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
