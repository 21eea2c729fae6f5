//! The simulated cluster, one step of simulated time at a time.
//!
//! A step: faults strike; on a decision tick, hosts that died a heartbeat timeout ago
//! show, the policy reads its statistics and decides a map; the map's slots start and
//! stop; tasks arrive; slots that finished starting begin to work and every slot lives
//! the step; working slots handle the backlog. The report is read off at the end.
//!
//! The decision step by policy: `gaffer` is `balancer::decide` on the manager's
//! `StatsWindow` fed the simulated counters; `hpa` and `static` place their wanted counts
//! with `balancer::place_wanted`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::balancer::{Balancer, HostState, IndexedInput, QueueWindow};
use crate::config::{Config, QueueConfig};
use crate::manager::window::{Backlog, HostCounters, Sample, StatsWindow};

use super::queue::{QueueSim, StopAt};
use super::rng::Rng;
use super::trace::{Load, Trace};
use super::{HPA_STABILISATION, HPA_SYNC, Policy, QueueReport, Report, STEP};

/// The master the simulated cluster's work is reported as. The simulation works off a
/// queue's backlog with all its slots together, not host by host, and its masters never
/// restart (a fault kills a host, whose last report a manager keeps, frozen): so one
/// master that never restarts reports exactly what per-host masters would add up to.
const REPORTER: &str = "simulated cluster";

/// [`STEP`] in ms, and in seconds: constants, so the hot loop divides by nothing.
const STEP_MS: u64 = STEP.as_millis() as u64;
const DT: f64 = STEP_MS as f64 / 1000.0;

/// The clocks of a run, in simulated ms.
struct Timing {
    end_ms: u64,
    /// Fork to first take.
    slot_start_ms: u64,
    /// How long a dead host goes unnoticed.
    heartbeat_ms: u64,
    /// Between two decisions of the policy.
    tick_ms: u64,
}

impl Timing {
    fn new(config: &Config, trace: &Trace, policy: Policy) -> Self {
        Self {
            end_ms: trace.duration.as_millis() as u64,
            slot_start_ms: trace.hosts.slot_start.as_millis() as u64,
            heartbeat_ms: config.manager.heartbeat_timeout.as_millis() as u64,
            tick_ms: match policy {
                Policy::Gaffer => (config.manager.tick.as_millis() as u64).max(STEP_MS),
                Policy::Hpa => HPA_SYNC.as_millis() as u64,
                Policy::Static => STEP_MS,
            },
        }
    }
}

/// The simulated hosts: which died when, and what the deciding side knows of them. All
/// indexed by name order, as the map is; faults pick hosts by number.
struct SimHosts {
    /// `position[i]`: host number i's place in name order.
    position: Vec<usize>,
    /// When the host died.
    dead_at: Vec<Option<u64>>,
    /// Hosts dead so far.
    dead: usize,
    /// The hosts as a manager sees them: a death shows a heartbeat timeout later.
    states: Vec<HostState>,
}

impl SimHosts {
    fn new(trace: &Trace, handlers: &BTreeSet<String>) -> Self {
        let names: Vec<String> = (0..trace.hosts.count)
            .map(|i| format!("host{i:03}"))
            .collect();
        let nh = names.len();
        // The balancer orders hosts by name (its ties break by name).
        let mut by_name: Vec<usize> = (0..nh).collect();
        by_name.sort_by(|&a, &b| names[a].cmp(&names[b]));
        let mut position = vec![0; nh];
        for (j, &i) in by_name.iter().enumerate() {
            position[i] = j;
        }
        let state = HostState {
            capacity: trace.hosts.capacity(),
            handlers: handlers.clone(),
            alive: true,
            draining: false,
        };
        Self {
            position,
            dead_at: vec![None; nh],
            dead: 0,
            states: vec![state; nh],
        }
    }

    fn len(&self) -> usize {
        self.states.len()
    }

    /// The `n` highest-numbered alive hosts die at `now_ms`.
    fn kill(&mut self, n: u32, now_ms: u64) {
        let mut left = n;
        for i in (0..self.len()).rev() {
            if left == 0 {
                break;
            }
            let h = self.position[i];
            if self.dead_at[h].is_none() {
                self.dead_at[h] = Some(now_ms);
                self.dead += 1;
                left -= 1;
            }
        }
    }

    /// Deaths a heartbeat timeout old show at `now_ms`; whether any host changed.
    fn notice(&mut self, now_ms: u64, heartbeat_ms: u64) -> bool {
        let mut changed = false;
        for (state, died) in self.states.iter_mut().zip(&self.dead_at) {
            let alive = !died.is_some_and(|d| now_ms >= d + heartbeat_ms);
            if state.alive != alive {
                state.alive = alive;
                changed = true;
            }
        }
        changed
    }

    /// The slots of one queue's row of the map that really run: on hosts alive now.
    fn running(&self, row: &[u32]) -> u32 {
        row.iter()
            .zip(&self.dead_at)
            .filter(|(_, died)| died.is_none())
            .map(|(n, _)| *n)
            .sum()
    }
}

/// What the `gaffer` policy decides on: the manager's statistics window, fed the
/// simulated counters.
struct Statistics {
    window: StatsWindow,
    /// The config's queue names: the columns of every sample.
    queues: Arc<[String]>,
    /// Per queue: its backlog now.
    backlog: Vec<Backlog>,
    /// Per queue: the window as the balancer reads it.
    windows: Vec<QueueWindow>,
}

/// One HPA recommendation.
#[derive(Debug, Clone, Copy)]
struct Recommendation {
    at_ms: u64,
    slots: u32,
}

/// What `hpa` and `static` decide: the slots each queue wants.
#[derive(Default)]
struct Wanted {
    /// Per queue, this decision.
    now: Vec<u32>,
    /// What was placed last.
    last: Vec<u32>,
    /// `hpa`, per queue: its recommendations of the stabilisation window.
    recommendations: Vec<VecDeque<Recommendation>>,
}

impl Wanted {
    /// HPA's rule for queue `k` with `backlog` tasks at `now_ms`: ceil(backlog / target),
    /// clamped to min/max; up at once, down only to the highest recommendation of the
    /// stabilisation window.
    fn hpa(&mut self, k: usize, c: &QueueConfig, backlog: u64, now_ms: u64, target: f64) -> u32 {
        let desired = ((backlog as f64 / target).ceil() as u32).clamp(c.min_slots, c.max_slots);
        let history = &mut self.recommendations[k];
        history.push_back(Recommendation {
            at_ms: now_ms,
            slots: desired,
        });
        let stabilisation = HPA_STABILISATION.as_millis() as u64;
        while history
            .front()
            .is_some_and(|r| r.at_ms + stabilisation < now_ms)
        {
            history.pop_front();
        }
        let stable = history.iter().map(|r| r.slots).max().unwrap_or(desired);
        desired.max(stable)
    }
}

/// Figures of the whole run.
#[derive(Debug, Default)]
struct Totals {
    /// Slots that left one queue for another in the same decision.
    slot_moves: u64,
    slot_starts: u64,
    busy_seconds: f64,
    slot_seconds: f64,
}

/// A simulated cluster under one policy.
pub(super) struct SimCluster<'a> {
    config: &'a Config,
    trace: &'a Trace,
    policy: Policy,
    timing: Timing,
    /// Simulated time, ms.
    now_ms: u64,
    hosts: SimHosts,
    /// The next fault of the trace's events.
    next_event: usize,
    rng: Rng,
    /// Per queue of the config, in its order (the balancer's).
    queues: Vec<QueueSim>,
    /// Per queue: its load segments.
    loads: Vec<Vec<&'a Load>>,
    /// One for the run: a simulated day is 43,200 decisions, and the tables, buffers and
    /// map stay in index form between them.
    balancer: Balancer<'a>,
    /// The map in force, in the balancer's index form: queue-major.
    map: Vec<u32>,
    /// The map changed since slots were last set.
    map_changed: bool,
    /// Deaths counted when slots were last set.
    dead_seen: usize,
    /// The last decision on exactly the current map, hosts and wanted slots left the map
    /// as it was; the balancer is pure, so the same decision again would too.
    settled: bool,
    statistics: Statistics,
    wanted: Wanted,
    /// Per queue: paused by an operator (never, here).
    paused: Vec<bool>,
    totals: Totals,
    /// Simulated time 0: a Monday at midnight UTC, so work periods line up with the
    /// trace's clock.
    epoch: chrono::DateTime<chrono::Utc>,
}

impl<'a> SimCluster<'a> {
    /// The cluster of `trace` serving the queues of `config`, at time 0.
    pub(super) fn new(config: &'a Config, trace: &'a Trace, policy: Policy) -> Self {
        let handlers: BTreeSet<String> = config
            .queues
            .values()
            .map(|q| q.handler.name().to_string())
            .collect();
        let hosts = SimHosts::new(trace, &handlers);
        let mut balancer = Balancer::new(config);
        balancer.set_hosts(&hosts.states);
        let nq = config.queues.len();
        let loads = config
            .queues
            .keys()
            .map(|q| trace.load.iter().filter(|l| &l.queue == q).collect())
            .collect();
        Self {
            config,
            trace,
            policy,
            timing: Timing::new(config, trace, policy),
            now_ms: 0,
            map: vec![0; nq * hosts.len()],
            hosts,
            next_event: 0,
            rng: Rng(trace.seed ^ 0x6761_6666_6572),
            queues: config
                .queues
                .iter()
                .map(|(name, c)| QueueSim::new(c.batch_size, stop_at(trace, name)))
                .collect(),
            loads,
            balancer,
            map_changed: true,
            dead_seen: 0,
            settled: false,
            statistics: Statistics {
                window: StatsWindow::new(StatsWindow::DEFAULT_LENGTH),
                queues: config.queues.keys().cloned().collect(),
                backlog: vec![Backlog::default(); nq],
                windows: vec![QueueWindow::default(); nq],
            },
            wanted: Wanted {
                now: vec![0; nq],
                last: Vec::new(),
                recommendations: vec![VecDeque::new(); nq],
            },
            paused: vec![false; nq],
            totals: Totals::default(),
            epoch: chrono::DateTime::from_timestamp(1_767_571_200, 0).expect("a valid date"),
        }
    }

    /// Runs the trace to its end and reports.
    pub(super) fn run(mut self) -> Report {
        while self.now_ms < self.timing.end_ms {
            self.step();
        }
        self.report()
    }

    /// One step of [`STEP`]: faults; on a tick, hosts noticed and the policy's decision;
    /// slot starts and stops; then queue by queue arrivals, slots at work, handling.
    fn step(&mut self) {
        self.faults();
        if self.now_ms.is_multiple_of(self.timing.tick_ms) {
            self.notice_hosts();
            self.decide();
        }
        self.start_stop_slots();
        // Queue by queue, in one pass: this is the hot loop (a simulated day is 864,000
        // steps).
        let now_ms = self.now_ms;
        for (q, segments) in self.queues.iter_mut().zip(&self.loads) {
            arrivals(q, segments, now_ms, &mut self.rng);
            // Slots that finished starting begin to work; all its slots live the step.
            q.start_ready(now_ms);
            self.totals.slot_seconds += q.live(DT);
            // Handling: its working slots take batches and finish them.
            self.totals.busy_seconds += q.handle(now_ms, STEP_MS);
        }
        self.now_ms += STEP_MS;
    }

    /// Faults due by now strike: the last alive hosts die, and their slots vanish now.
    fn faults(&mut self) {
        let events = &self.trace.events;
        while let Some(e) = events
            .get(self.next_event)
            .filter(|e| e.at.as_millis() as u64 <= self.now_ms)
        {
            self.hosts.kill(e.kill_hosts, self.now_ms);
            self.next_event += 1;
        }
    }

    /// The deciding side learns of deaths a heartbeat timeout old.
    fn notice_hosts(&mut self) {
        if self.hosts.notice(self.now_ms, self.timing.heartbeat_ms) {
            self.balancer.set_hosts(&self.hosts.states);
            self.settled = false;
        }
    }

    /// The policy's decision; a new map is in force at once.
    fn decide(&mut self) {
        let decided = match self.policy {
            Policy::Gaffer => {
                self.statistics();
                self.balancer.decide(&IndexedInput {
                    stats: &self.statistics.windows,
                    current: &self.map,
                    now: self.epoch + chrono::Duration::milliseconds(self.now_ms as i64),
                    paused: &self.paused,
                });
                true
            }
            Policy::Hpa | Policy::Static => self.place_wanted(),
        };
        if decided {
            self.settled = self.balancer.map() == self.map.as_slice();
            if !self.settled {
                self.map.copy_from_slice(self.balancer.map());
                self.map_changed = true;
            }
        }
    }

    /// The statistics a manager would read: the simulated counters into the window, and
    /// the window with the backlog of now as the balancer's input.
    fn statistics(&mut self) {
        let s = &mut self.statistics;
        let reporter = HostCounters {
            started_ms: 0,
            queues: self.queues.iter().map(|q| Some(q.work)).collect(),
        };
        s.window.record(Sample {
            at: Duration::from_millis(self.now_ms),
            queues: s.queues.clone(),
            enqueued: self.queues.iter().map(|q| q.arrived).collect(),
            hosts: BTreeMap::from([(REPORTER.to_string(), reporter)]),
        });
        for (b, q) in s.backlog.iter_mut().zip(&self.queues) {
            *b = q.split_backlog();
        }
        s.window.read_into(&s.backlog, &mut s.windows);
    }

    /// `hpa` and `static`: the slots each queue wants, placed by the balancer. Once
    /// settled, a placement changes nothing until the wanted slots or the hosts do
    /// (`static` would otherwise place every step); whether it placed.
    fn place_wanted(&mut self) -> bool {
        for (k, c) in self.config.queues.values().enumerate() {
            self.wanted.now[k] = match self.policy {
                Policy::Static => c.min_slots,
                _ => {
                    let backlog = self.queues[k].ready();
                    let target = self.trace.hpa_target;
                    self.wanted.hpa(k, c, backlog, self.now_ms, target)
                }
            };
        }
        let again = self.settled && self.wanted.now == self.wanted.last;
        if !again {
            self.balancer.place_wanted(&self.map, &self.wanted.now);
            self.wanted.last.clone_from(&self.wanted.now);
        }
        !again
    }

    /// Slot starts and stops: the map's slots on hosts that really live. Only a decision
    /// or a fault changes them.
    fn start_stop_slots(&mut self) {
        if !self.map_changed && self.hosts.dead == self.dead_seen {
            return;
        }
        self.map_changed = false;
        self.dead_seen = self.hosts.dead;
        let nh = self.hosts.len();
        let mut started = 0u64;
        let mut stopped = 0u64;
        for (k, q) in self.queues.iter_mut().enumerate() {
            let running = self.hosts.running(&self.map[k * nh..(k + 1) * nh]);
            let change = q.set_slots(running, self.now_ms, self.timing.slot_start_ms);
            started += u64::from(change.started);
            stopped += u64::from(change.stopped);
        }
        self.totals.slot_starts += started;
        self.totals.slot_moves += started.min(stopped);
    }

    /// The figures of the run.
    fn report(self) -> Report {
        let steps = (self.timing.end_ms / STEP_MS).max(1) as f64;
        let queues = self
            .config
            .queues
            .keys()
            .zip(&self.queues)
            .map(|(name, q)| {
                let report = QueueReport {
                    arrived: q.arrived,
                    done: q.work.processed,
                    wait_p50_ms: q.percentile(0.5),
                    wait_p99_ms: q.percentile(0.99),
                    wait_max_ms: q.max_wait(),
                    max_backlog: q.max_backlog,
                    mean_slots: q.slot_steps as f64 / steps,
                    slot_changes: q.slot_changes,
                    left_at_end: q.left(),
                };
                (name.clone(), report)
            })
            .collect();
        let t = &self.totals;
        Report {
            policy: self.policy,
            duration_seconds: self.timing.end_ms as f64 / 1000.0,
            seed: self.trace.seed,
            queues,
            slot_moves: t.slot_moves,
            slot_starts: t.slot_starts,
            mean_utilisation: if t.slot_seconds > 0.0 {
                t.busy_seconds / t.slot_seconds
            } else {
                0.0
            },
        }
    }
}

/// A queue's arrivals of the step at `now_ms`: Poisson, at the step's middle, with the
/// mean task time of the segments that bring them.
fn arrivals(q: &mut QueueSim, segments: &[&Load], now_ms: u64, rng: &mut Rng) {
    let at = Duration::from_millis(now_ms);
    let mut rate = 0.0;
    let mut weighted = 0.0;
    for l in segments {
        let r = l.rate_at(at);
        rate += r;
        weighted += r * l.task_time.as_secs_f64();
    }
    if rate > 0.0 {
        let task_seconds = weighted / rate;
        let n = rng.poisson(rate * DT);
        q.arrive(now_ms + STEP_MS / 2, n, task_seconds);
    }
}

/// Where a stopped busy slot of `queue` stops: after its whole batch when the trace says
/// its handler ignores the stop, after the task in hand otherwise.
fn stop_at(trace: &Trace, queue: &str) -> StopAt {
    if trace.stops_at_batch_end(queue) {
        StopAt::Batch
    } else {
        StopAt::Task
    }
}
