//! What the master measures and reports: the host's capacity from its readings, the host
//! report it publishes every tick, and the `/status` document.
//!
//! Memory is read once per tick from one process-tree scan (ARCHITECTURE.md, invariant 39):
//! the host's PSS is Σ PSS of the master's whole tree (zygotes, language zygotes, slots,
//! exec children and theirs) plus the slots' outside trees, each process once; a slot's
//! figure is its tree ∪ its outside process's tree, summed per queue. A process that cannot
//! be measured is left out with one warning, never counted twice.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use super::capacity::{self, Capacity, CapacityInput};
use super::plan::SlotState;
use super::supervisor::{Master, STOPPING_REDIS_WAIT};
use super::telemetry;
use crate::cluster::{self, HostReport, QueueReport};
use crate::host::sysinfo;
use crate::queue_client::QueueError;

/// What is measured and reported.
pub(super) struct Reporting {
    /// The latest capacity decision, with the numbers behind it; none before the first
    /// tick.
    pub(super) capacity: Option<Capacity>,
    /// The host report last published; its readings are the next one's until measured
    /// again.
    pub(super) last: HostReport,
    /// When the master started, in ms since the epoch, as its reports say.
    pub(super) started_ms: u64,
    /// The `/status` document, shared with the HTTP server.
    pub(super) status: Arc<Mutex<serde_json::Value>>,
    /// Each running slot's PSS as last measured: its tree and its outside process's.
    pub(super) slot_pss: BTreeMap<u32, u64>,
    /// While the CPU is overloaded, the slots each queue ran when the overload began:
    /// what the plan lets it restart (a slot that exits is replaced in its own queue, not
    /// given to another).
    pub(super) held_queues: Option<BTreeMap<String, u32>>,
}

impl Reporting {
    pub(super) fn new(status: Arc<Mutex<serde_json::Value>>) -> Self {
        Reporting {
            capacity: None,
            last: HostReport::default(),
            started_ms: cluster::now_ms(),
            status,
            slot_pss: BTreeMap::new(),
            held_queues: None,
        }
    }
}

/// The status document `/status` serves.
#[derive(Serialize)]
struct Status<'a> {
    host: &'a HostReport,
    capacity: &'a Option<Capacity>,
    zygote_pids: Vec<u32>,
    slots: Vec<SlotStatus<'a>>,
}

#[derive(Serialize)]
struct SlotStatus<'a> {
    slot: u32,
    queue: &'a str,
    pid: Option<u32>,
    state: SlotState,
    generation: u64,
    batches: u64,
    age_seconds: f64,
    /// Spawn request to first take, in ms; null until the slot is ready.
    ready_ms: Option<f64>,
    /// Asked to exit once its long task ended (an old generation's, or a surplus).
    retiring: bool,
    /// Its process outside its own tree (a fork-mode exec child), as it last said.
    outside_pid: Option<u32>,
    /// PSS of its tree and its outside process's tree, as last measured; null before.
    pss_bytes: Option<u64>,
}

/// What one tick measured of the processes' memory.
struct Memory {
    /// Σ PSS of the host's processes, each once.
    host: u64,
    /// Each slot's: its tree ∪ its outside process's tree.
    slots: BTreeMap<u32, u64>,
}

/// Says once per master that some process cannot be measured: it is left out of the
/// budget for as long as it lasts (a slot of another user without CAP_SYS_PTRACE).
fn warn_unreadable(what: &str, pid: u32, e: &sysinfo::SysinfoError) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(pid, error = %e, "cannot measure {what}; the memory budget leaves it out");
    }
}

impl Master {
    /// The master, its zygotes and its forked slots: what is measured when `/proc`
    /// cannot be scanned for their descendants.
    fn pids(&self) -> Vec<u32> {
        let mut pids = vec![std::process::id()];
        pids.extend(
            self.zygotes
                .procs
                .values()
                .map(|z| z.pid)
                .filter(|&p| p != 0),
        );
        pids.extend(self.slots.procs.values().filter_map(|s| s.pid));
        pids
    }

    /// The PSS of the host's processes and of each slot, from one scan of `/proc` and
    /// one rollup per process: the master's whole tree (zygotes, language zygotes,
    /// slots, exec children and what they started) plus any slot's outside process's
    /// tree that is not in it, each process once.
    fn memory(&self) -> Memory {
        let (tree, roots) = match sysinfo::ProcTree::read() {
            Ok(tree) => (tree, vec![std::process::id()]),
            Err(e) => {
                warn_unreadable("the process tree", std::process::id(), &e);
                (sysinfo::ProcTree::default(), self.pids())
            }
        };
        let slots: Vec<(u32, Vec<u32>)> = self
            .slots
            .procs
            .iter()
            .filter_map(|(&n, s)| Some((n, tree.trees(std::iter::once(s.pid?).chain(s.outside)))))
            .collect();
        let mut host = tree.trees(roots);
        host.extend(slots.iter().flat_map(|(_, pids)| pids.iter().copied()));
        let rollups = sysinfo::Rollups::read(host.iter().copied());
        if let Some((pid, e)) = rollups.unreadable.first() {
            warn_unreadable("a process", *pid, e);
        }
        Memory {
            host: rollups.sum(host).pss,
            slots: slots
                .into_iter()
                .map(|(n, pids)| (n, rollups.sum(pids).pss))
                .collect(),
        }
    }

    /// Reads the host and sizes it ([`capacity::capacity`]).
    pub(super) fn measure(&mut self) {
        let memory = self.memory();
        let pss_total = memory.host;
        self.reporting.slot_pss = memory.slots;
        let (limit, usage) = sysinfo::cgroup_memory()
            .ok()
            .flatten()
            .map_or((None, None), |(l, u)| (Some(l), Some(u)));
        let master = &self.opts.config.master;
        let input = CapacityInput {
            pss_total,
            slots: self
                .slots
                .procs
                .values()
                .filter(|s| s.pid.is_some())
                .count() as u32,
            mem_available: sysinfo::mem_available().unwrap_or(0),
            cgroup_limit: limit,
            cgroup_usage: usage,
            reserve: master.memory_reserve,
            slot_estimate: master.slot_estimate,
            load1: sysinfo::load1().unwrap_or(0.0),
            cpus: sysinfo::cpus().unwrap_or(1),
            max_load_per_cpu: self.opts.max_load_per_cpu,
            cpu_pressure: sysinfo::cpu_pressure().ok().flatten(),
            held: self.reporting.capacity.as_ref().and_then(|c| c.held),
            floor: self.min_slots_floor(),
            max_slots: master.max_slots,
        };
        let cap = capacity::capacity(&input);
        self.reporting.held_queues = cap.held.map(|_| {
            self.reporting
                .held_queues
                .take()
                .unwrap_or_else(|| self.running_by_queue())
        });
        match (input.held, cap.held) {
            (None, Some(holding)) => tracing::warn!(
                load1 = input.load1,
                cpus = input.cpus,
                cpu_pressure = ?input.cpu_pressure,
                holding,
                "cpu overloaded: the host holds its slots, replacing those that exit, and takes no more"
            ),
            (Some(_), None) => tracing::info!(
                load1 = input.load1,
                cpu_pressure = ?input.cpu_pressure,
                "cpu no longer overloaded: the host takes slots again"
            ),
            _ => {}
        }
        let last = &mut self.reporting.last;
        last.pss_bytes = pss_total;
        last.mem_available_bytes = cap.available;
        last.memory_budget_bytes = cap.budget;
        last.load1 = input.load1;
        last.cpus = input.cpus;
        last.capacity = cap.slots;
        last.cpu_pressure = input.cpu_pressure;
        last.capacity_bound = Some(cap.bound);
        self.reporting.capacity = Some(cap);
    }

    /// Running slots (stopping ones not counted) per queue.
    fn running_by_queue(&self) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for s in self.slots.procs.values() {
            if s.state != SlotState::Stopping {
                *out.entry(s.queue.clone()).or_default() += 1;
            }
        }
        out
    }

    /// The slots the host keeps through a CPU overload: each queue the map gives it, up to
    /// its `min_slots` (see [`capacity::CapacityInput::floor`]).
    fn min_slots_floor(&self) -> u32 {
        let queues = &self.opts.config.queues;
        self.wanted()
            .iter()
            .map(|(q, &n)| n.min(queues.get(q).map_or(0, |c| c.min_slots)))
            .sum()
    }

    /// The host report as things stand: the last readings, the slots and counters now.
    pub(super) fn host_report(&self) -> HostReport {
        let now = Instant::now();
        let wanted = self.wanted();
        let mut queues: BTreeMap<String, QueueReport> = BTreeMap::new();
        for (name, q) in &self.slots.queues {
            queues.insert(name.clone(), q.report.clone());
        }
        for (n, s) in &self.slots.procs {
            let r = queues.entry(s.queue.clone()).or_default();
            if s.state != SlotState::Stopping {
                r.slots += 1;
            }
            r.pss_bytes += self.reporting.slot_pss.get(n).copied().unwrap_or(0);
            // Running slots count their life so far, so load is right before they exit.
            r.slot_lifetime_seconds_total += (now - s.spawned_at).as_secs_f64();
        }
        for (name, &n) in &wanted {
            queues.entry(name.clone()).or_default().wanted = n;
        }
        let mapped = self
            .orders
            .map
            .as_ref()
            .map(|m| m.for_host(&self.opts.host));
        for (name, _) in mapped.into_iter().flatten() {
            if let Some(reason) = self.layouts.refused(&name) {
                queues.entry(name).or_default().refused = Some(reason);
            }
        }
        let mut r = self.reporting.last.clone();
        r.host = self.opts.host.clone();
        r.pid = std::process::id();
        r.started_ms = self.reporting.started_ms;
        r.ts_ms = cluster::now_ms();
        r.draining = self.stopping || self.orders.drain_requested;
        r.slots = self.slots.procs.len() as u32;
        r.handlers = self.opts.registry.names();
        r.map_version = self.orders.map.as_ref().map_or(0, |m| m.version);
        r.map_epoch = self.orders.max_epoch;
        r.queues = queues;
        r.redis = Some(self.redis.client.redis_node());
        r
    }

    /// Publishes the host report (Redis, gauges, `/status`).
    pub(super) async fn report(&mut self) {
        let report = self.host_report();
        telemetry::host_gauges(&report);
        self.publish_status(&report);
        let redis = &mut self.redis;
        let publish = cluster::publish_host(&mut redis.conn, &redis.keys, &report);
        let published = if self.stopping {
            // Stopping, Redis is best effort: the slots' exits must not wait on it.
            tokio::time::timeout(STOPPING_REDIS_WAIT, publish)
                .await
                .unwrap_or_else(|_| {
                    Err(QueueError::Connect {
                        target: "redis did not answer in time".into(),
                        cause: crate::queue_client::Cause::TimedOut,
                    })
                })
        } else {
            publish.await
        };
        match published {
            Ok(()) => redis.outage.answered(),
            Err(e) => redis.outage.failed("publishing the host report failed", &e),
        }
        self.reporting.last = report;
    }

    /// Rebuilds the `/status` document.
    pub(super) fn publish_status(&self, report: &HostReport) {
        let now = Instant::now();
        let status = Status {
            host: report,
            capacity: &self.reporting.capacity,
            zygote_pids: self.zygotes.procs.values().map(|z| z.pid).collect(),
            slots: self
                .slots
                .procs
                .iter()
                .map(|(&slot, s)| SlotStatus {
                    slot,
                    queue: &s.queue,
                    pid: s.pid,
                    state: s.state,
                    generation: s.generation,
                    batches: s.batches,
                    age_seconds: (now - s.spawned_at).as_secs_f64(),
                    ready_ms: s.ready_after.map(|d| d.as_secs_f64() * 1000.0),
                    retiring: s.retiring,
                    outside_pid: s.outside,
                    pss_bytes: self.reporting.slot_pss.get(&slot).copied(),
                })
                .collect(),
        };
        if let (Ok(v), Ok(mut slot)) = (serde_json::to_value(&status), self.reporting.status.lock())
        {
            *slot = v;
        }
    }
}
