//! The faults, each injected, stopped and checked by itself: what it did, to which
//! processes, when, and anything that went wrong beyond the fault itself (a role that
//! crashed or spun, a process left behind, a standby that never took over).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde::Serialize;

use crate::cluster::{Cluster, DRAIN_TIMEOUT, SlotInfo};
use crate::oracle::now_ms;
use crate::procs;
use crate::rng::Rng;

/// The kinds of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// kill -9 a slot, preferably one inside a batch.
    SlotKill,
    /// SIGSTOP a busy slot past its lease, then SIGCONT: its late settle must be rejected.
    SlotStop,
    /// kill -9 a master (its zygote, slots and exec children must die with it), then
    /// restart it under the same host name.
    MasterKill,
    /// SIGSTOP the leading manager past its lease, then SIGCONT: the standby takes over
    /// and the woken one must not write.
    ManagerStop,
    /// kill -9 Redis (on a cluster, one node the seed picks), then restart it on the
    /// same port and AOF.
    RedisKill,
    /// SIGSTOP Redis (on a cluster, one node) for 10 s, then SIGCONT.
    RedisStop,
    /// Redis (on a cluster, one node) killed or frozen, then SIGTERM to a master: it must exit within its
    /// `drain_timeout` and a bound with nothing of its tree left; Redis comes back, the
    /// master is restarted, and the leases its slots held come back to the queue.
    MasterTermInOutage,
    /// SIGSTOP a master with its whole tree (zygote, slots, exec children) past the
    /// lease, then SIGCONT: a host frozen as a whole, as a paused VM. Long tasks only:
    /// its tasks run elsewhere meanwhile, and its woken slots stop theirs at once.
    HostStop,
    /// kill -9 the primary serving the run's first queue, on Redis with replicas: a
    /// replica takes its place, and the killed node comes back as a replica. The failover
    /// profile only (`failover.rs`), which injects it itself; what the primary had not
    /// yet sent its replica is lost with it.
    Failover,
}

impl FaultKind {
    /// Every kind, in the order the report lists them.
    pub const ALL: [FaultKind; 7] = [
        FaultKind::SlotKill,
        FaultKind::SlotStop,
        FaultKind::MasterKill,
        FaultKind::ManagerStop,
        FaultKind::RedisKill,
        FaultKind::RedisStop,
        FaultKind::MasterTermInOutage,
    ];

    /// Every kind the long-tasks profile injects, in the order its report lists them.
    pub const LONG: [FaultKind; 8] = [
        FaultKind::SlotKill,
        FaultKind::SlotStop,
        FaultKind::MasterKill,
        FaultKind::ManagerStop,
        FaultKind::RedisKill,
        FaultKind::RedisStop,
        FaultKind::MasterTermInOutage,
        FaultKind::HostStop,
    ];

    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::HostStop => "SIGSTOP a whole host past the lease",
            FaultKind::SlotKill => "kill -9 a slot",
            FaultKind::SlotStop => "SIGSTOP a slot past its lease",
            FaultKind::MasterKill => "kill -9 a master, restart it",
            FaultKind::ManagerStop => "SIGSTOP the leading manager",
            FaultKind::RedisKill => "kill -9 Redis, restart (AOF)",
            FaultKind::RedisStop => "SIGSTOP Redis for 10 s",
            FaultKind::MasterTermInOutage => "SIGTERM a master during a Redis outage",
            FaultKind::Failover => "kill -9 the primary, fail over",
        }
    }

    /// About how long injecting it takes, so the schedule does not overrun its phase.
    pub fn estimate(self, lease: Duration) -> Duration {
        match self {
            FaultKind::SlotKill => Duration::from_secs(2),
            FaultKind::SlotStop => lease + Duration::from_secs(7),
            FaultKind::MasterKill => Duration::from_secs(10),
            FaultKind::ManagerStop => Duration::from_secs(10),
            FaultKind::RedisKill => Duration::from_secs(10),
            FaultKind::RedisStop => Duration::from_secs(15),
            FaultKind::MasterTermInOutage => DRAIN_TIMEOUT + Duration::from_secs(7),
            FaultKind::HostStop => lease + Duration::from_secs(7),
            FaultKind::Failover => Duration::from_secs(30),
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    /// What it was.
    pub kind: FaultKind,
    /// When it began (Unix ms).
    pub start_ms: u64,
    /// When it was over: the process resumed or restarted (Unix ms).
    pub end_ms: u64,
    /// What it hit.
    pub target: String,
    /// The host it hit, for a slot or a master.
    pub host: Option<String>,
    /// The slot's number on that host, for a slot.
    pub slot: Option<u32>,
    /// Every pid it killed or froze.
    pub pids: BTreeSet<u32>,
    /// What was observed.
    pub notes: Vec<String>,
    /// What went wrong beyond the fault itself; any fails the run.
    pub problems: Vec<String>,
    /// Settles rejected as stale around it (for a frozen slot: its late settle).
    pub stale: u64,
    /// False when there was nothing to hit (no busy slot): not counted as injected.
    pub injected: bool,
    /// Extra handlings the oracle put down to it.
    pub duplicates: usize,
    /// Takes it kept from reaching the handler (seen in the records).
    pub not_run: usize,
}

impl Fault {
    /// A fault of `kind` starting now, not yet aimed at anything.
    pub fn new(kind: FaultKind) -> Self {
        Fault {
            kind,
            start_ms: now_ms(),
            end_ms: now_ms(),
            target: String::new(),
            host: None,
            slot: None,
            pids: BTreeSet::new(),
            notes: Vec::new(),
            problems: Vec::new(),
            stale: 0,
            injected: true,
            duplicates: 0,
            not_run: 0,
        }
    }
}

/// Injects one fault of `kind`, waits it out, and checks the aftermath.
pub fn inject(c: &mut Cluster, kind: FaultKind, rng: &mut Rng) -> Fault {
    let mut f = Fault::new(kind);
    match kind {
        FaultKind::SlotKill => slot_kill(c, rng, &mut f),
        FaultKind::SlotStop => slot_stop(c, rng, &mut f),
        FaultKind::MasterKill => master_kill(c, rng, &mut f),
        FaultKind::ManagerStop => manager_stop(c, &mut f),
        FaultKind::RedisKill => redis_down(c, rng, &mut f, false),
        FaultKind::RedisStop => redis_down(c, rng, &mut f, true),
        FaultKind::MasterTermInOutage => master_term_in_outage(c, rng, &mut f),
        FaultKind::HostStop => host_stop(c, rng, &mut f),
        FaultKind::Failover => {
            f.injected = false;
            f.problems
                .push("a failover is injected by the failover profile, not scheduled".into());
        }
    }
    f
}

/// A slot to hit: a busy one if there is one within `wait`, else (when `any`) any slot.
fn pick_slot(c: &Cluster, rng: &mut Rng, wait: Duration, any: bool) -> Option<SlotInfo> {
    let deadline = Instant::now() + wait;
    loop {
        let slots = c.slots();
        let busy: Vec<_> = slots.iter().filter(|s| s.state == "busy").collect();
        if let Some(s) = rng.pick(&busy) {
            return Some((*s).clone());
        }
        if Instant::now() >= deadline {
            let idle: Vec<_> = slots.iter().filter(|s| s.state == "idle").collect();
            return any.then(|| rng.pick(&idle).map(|s| (*s).clone())).flatten();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls until every pid in `pids` is gone; returns those still alive after `limit`.
fn wait_gone(pids: &BTreeSet<u32>, limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|&p| !procs::gone(p)).collect();
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn slot_kill(c: &mut Cluster, rng: &mut Rng, f: &mut Fault) {
    let Some(SlotInfo {
        master,
        pid,
        slot,
        queue,
        ..
    }) = pick_slot(c, rng, Duration::from_secs(3), true)
    else {
        f.injected = false;
        f.notes.push("no slot running".into());
        return;
    };
    f.target = format!("slot {pid} of {queue} on {}", c.masters[master].name);
    f.host = Some(c.masters[master].name.clone());
    f.slot = Some(slot);
    // Its exec child must die with it (PDEATHSIG).
    let mut tree = procs::descendants(pid);
    tree.insert(pid);
    f.pids.insert(pid);
    f.start_ms = now_ms();
    if let Err(e) = procs::signal(pid, Signal::SIGKILL) {
        f.problems.push(e);
    }
    f.end_ms = now_ms();
    let alive = wait_gone(&tree, Duration::from_secs(5));
    if !alive.is_empty() {
        f.problems.push(format!(
            "still alive 5 s after its slot was killed: {alive:?}"
        ));
    }
}

fn slot_stop(c: &mut Cluster, rng: &mut Rng, f: &mut Fault) {
    let Some(SlotInfo {
        master,
        pid,
        slot,
        queue,
        ..
    }) = pick_slot(c, rng, Duration::from_secs(5), false)
    else {
        f.injected = false;
        f.notes.push("no busy slot within 5 s".into());
        return;
    };
    f.target = format!("slot {pid} of {queue} on {}", c.masters[master].name);
    f.host = Some(c.masters[master].name.clone());
    f.slot = Some(slot);
    f.pids.insert(pid);
    let children = procs::descendants(pid);
    let stale_before = c.stale_total();
    let hold = c.shape.lease() + Duration::from_secs(3);
    f.start_ms = now_ms();
    if let Err(e) = procs::signal(pid, Signal::SIGSTOP) {
        f.problems.push(e);
        return;
    }
    c.idle(hold);
    if c.shape.min_slots() == 0 {
        // A long task's slot: the kernel killed it at its deadline, frozen as it was.
        return frozen_long_slot_killed(pid, &children, f);
    }
    if let Err(e) = procs::signal(pid, Signal::SIGCONT) {
        f.problems.push(e);
    }
    f.end_ms = now_ms();
    // The woken slot settles (or extends) its batch within moments: its lease has
    // expired and been reclaimed by another slot's take, so Redis must refuse it.
    c.idle(Duration::from_secs(3));
    if let (Some(before), Some(after)) = (stale_before, c.stale_total()) {
        f.stale = after - before;
        f.notes
            .push(format!("{} late settles rejected as stale", f.stale));
    }
    if procs::gone(pid) {
        f.problems
            .push("the frozen slot did not survive its SIGCONT".to_string());
    }
}

/// A slot frozen past its long task's lease must be gone, killed by its kernel deadline
/// before the lease could pass, with its exec child (which ran on meanwhile).
fn frozen_long_slot_killed(pid: u32, children: &BTreeSet<u32>, f: &mut Fault) {
    f.end_ms = now_ms();
    if procs::gone(pid) {
        f.notes
            .push("killed by its kernel deadline while frozen".into());
    } else {
        let _ = procs::signal(pid, Signal::SIGCONT);
        f.problems
            .push("the frozen slot outlived its long task's lease".into());
    }
    let alive: Vec<u32> = children
        .iter()
        .copied()
        .filter(|&p| !procs::gone(p))
        .collect();
    if !alive.is_empty() {
        f.problems.push(format!(
            "the frozen slot's children outlived its lease: {alive:?}"
        ));
    }
}

fn host_stop(c: &mut Cluster, rng: &mut Rng, f: &mut Fault) {
    let i = rng.range(0, c.masters.len() as u64) as usize;
    let Some(pid) = c.masters[i].pid() else {
        f.injected = false;
        return;
    };
    f.target = format!("master {} ({pid}) and its tree", c.masters[i].name);
    f.host = Some(c.masters[i].name.clone());
    f.pids = procs::descendants(pid);
    f.pids.insert(pid);
    f.start_ms = now_ms();
    // The master first, so it cannot start a process the freeze would miss.
    for p in std::iter::once(pid).chain(f.pids.iter().copied().filter(|&p| p != pid)) {
        if let Err(e) = procs::signal(p, Signal::SIGSTOP) {
            f.problems.push(e);
        }
    }
    c.idle(c.shape.lease() + Duration::from_secs(3));
    // Slots holding long tasks are killed by their kernel deadline, frozen as they are,
    // and their exec children with them.
    let killed = f.pids.iter().filter(|&&p| procs::gone(p)).count();
    f.notes
        .push(format!("{killed} of them gone before the SIGCONT"));
    for &p in &f.pids {
        // Processes that died meanwhile (none should) are reported below.
        let _ = procs::signal(p, Signal::SIGCONT);
    }
    f.end_ms = now_ms();
    c.idle(Duration::from_secs(3));
    if procs::gone(pid) {
        f.problems
            .push("the frozen master did not survive its SIGCONT".into());
    } else {
        f.notes.push(format!("{} processes frozen", f.pids.len()));
    }
}

fn master_kill(c: &mut Cluster, rng: &mut Rng, f: &mut Fault) {
    let i = rng.range(0, c.masters.len() as u64) as usize;
    let Some(pid) = c.masters[i].pid() else {
        f.injected = false;
        return;
    };
    f.target = format!("master {} ({pid})", c.masters[i].name);
    f.host = Some(c.masters[i].name.clone());
    let tree = procs::descendants(pid);
    f.pids = tree.clone();
    f.pids.insert(pid);
    f.start_ms = now_ms();
    if let Some(child) = c.masters[i].child.as_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
    c.masters[i].child = None;
    // Zygote, slots and exec children die with it: nothing may be left running.
    let alive = wait_gone(&tree, Duration::from_secs(10));
    if alive.is_empty() {
        f.notes
            .push(format!("its {} descendants died with it", tree.len()));
    } else {
        let list: Vec<String> = alive
            .iter()
            .map(|p| format!("{p} ({})", procs::cmdline(*p)))
            .collect();
        f.problems.push(format!(
            "left behind 10 s after the master was killed: {}",
            list.join(", ")
        ));
    }
    // Down for a moment, or past the heartbeat timeout so its slots move elsewhere.
    let down = Duration::from_millis(rng.range(500, 5000));
    c.idle(down);
    if let Err(e) = c.spawn(true, i) {
        f.problems.push(e);
        return;
    }
    f.end_ms = now_ms();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.masters[i].status().is_none() {
        if Instant::now() > deadline {
            f.problems
                .push("the restarted master did not answer /status within 20 s".into());
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f.notes.push(format!("down {down:?}, restarted"));
}

fn manager_stop(c: &mut Cluster, f: &mut Fault) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let (leader, epoch) = loop {
        if let Some(l) = c.leader() {
            break l;
        }
        if Instant::now() > deadline {
            f.injected = false;
            f.problems.push("no manager holds the lease".into());
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let Some(pid) = c.managers[leader].pid() else {
        f.injected = false;
        return;
    };
    f.target = format!("{} ({pid}, epoch {epoch})", c.managers[leader].name);
    f.pids.insert(pid);
    f.start_ms = now_ms();
    if let Err(e) = procs::signal(pid, Signal::SIGSTOP) {
        f.problems.push(e);
        return;
    }
    // Frozen until a standby holds the lease (3 s TTL), then a little longer.
    let frozen = Instant::now();
    let mut took_over = None;
    while frozen.elapsed() < Duration::from_secs(20) {
        c.idle(Duration::from_millis(200));
        if let Some((l, e)) = c.leader()
            && l != leader
        {
            took_over = Some((l, e, frozen.elapsed()));
            break;
        }
    }
    c.idle(Duration::from_secs(1));
    if let Err(e) = procs::signal(pid, Signal::SIGCONT) {
        f.problems.push(e);
    }
    f.end_ms = now_ms();
    match took_over {
        Some((l, e, after)) => f.notes.push(format!(
            "{} took over after {:.1} s (epoch {epoch} -> {e})",
            c.managers[l].name,
            after.as_secs_f64()
        )),
        None => {
            f.problems
                .push("no standby took the lease within 20 s".into());
            return;
        }
    }
    // The woken manager believes it leads until its next renewal: it must step down
    // and write nothing (the epochs seen by `idle` must never go back down).
    c.idle(Duration::from_secs(3));
    match c.managers[leader].status() {
        Some(s) if s["leading"] == false => f.notes.push("the woken one stepped down".into()),
        Some(s) => f
            .problems
            .push(format!("the woken manager still claims to lead: {s}")),
        None => f
            .problems
            .push("the woken manager does not answer /status".into()),
    }
}

fn redis_down(c: &mut Cluster, rng: &mut Rng, f: &mut Fault, freeze: bool) {
    let node = c.redis.pick(rng);
    let Some(pid) = c.redis.pid(node) else {
        f.injected = false;
        return;
    };
    f.target = format!("{} ({pid})", c.redis.name(node));
    let slots_before: BTreeSet<u32> = c.slots().iter().map(|s| s.pid).collect();
    let before = cpu(c);
    let started = Instant::now();
    f.start_ms = now_ms();
    if freeze {
        if let Err(e) = c.redis.signal(node, Signal::SIGSTOP) {
            f.problems.push(e);
            return;
        }
        watch_roles(c, Duration::from_secs(10));
    } else {
        c.redis.kill(node);
        watch_roles(c, Duration::from_millis(rng.range(1000, 4000)));
    }
    let after = cpu(c);
    let outage = started.elapsed();
    if freeze {
        if let Err(e) = c.redis.signal(node, Signal::SIGCONT) {
            f.problems.push(e);
        }
    } else if let Err(e) = c.redis.restart(node) {
        f.problems.push(e);
    }
    f.end_ms = now_ms();
    // No role may spin while Redis is away: each backs off.
    let hz = procs::ticks_per_second();
    let mut worst = (0.0f64, "none".to_string());
    for (pid, name) in &before.1 {
        let (Some(t0), Some(t1)) = (before.0.get(pid), after.0.get(pid)) else {
            continue;
        };
        let share = (t1 - t0) as f64 / hz / outage.as_secs_f64();
        if share > worst.0 {
            worst = (share, format!("{pid} {name}"));
        }
        if share > 0.5 {
            f.problems.push(format!(
                "{pid} ({name}) used {:.0} % of a CPU while Redis was away",
                share * 100.0
            ));
        }
    }
    f.notes.push(format!(
        "down {:.1} s; busiest process {:.0} % CPU ({})",
        outage.as_secs_f64(),
        worst.0 * 100.0,
        worst.1
    ));
    // Slots wait Redis out: none exits, and the manager, which could not hear from any
    // host meanwhile, must not take their slots away once it can.
    c.idle(Duration::from_secs(4));
    let lost: Vec<u32> = slots_before
        .iter()
        .copied()
        .filter(|&p| procs::gone(p))
        .collect();
    if lost.is_empty() {
        f.notes
            .push(format!("all {} slots rode it out", slots_before.len()));
    } else if c.shape.min_slots() == 0 {
        // A long queue's slots follow its tasks: a cancel or an add held up by the
        // outage lands as it ends, and the map grows or shrinks by as many slots.
        f.notes.push(format!(
            "{} of {} slots gone since (a long queue's slots follow its tasks)",
            lost.len(),
            slots_before.len()
        ));
    } else {
        f.problems.push(format!(
            "{} of {} slots did not survive the outage: {lost:?}",
            lost.len(),
            slots_before.len()
        ));
    }
}

/// How long past its `drain_timeout` a master stopped during an outage may take: its
/// draining report and deregistration wait on Redis a second each, then the kill lands.
const DRAIN_BOUND: Duration = Duration::from_secs(5);

fn master_term_in_outage(c: &mut Cluster, rng: &mut Rng, f: &mut Fault) {
    let i = rng.range(0, c.masters.len() as u64) as usize;
    let (Some(pid), Some(mut child)) = (c.masters[i].pid(), c.masters[i].child.take()) else {
        f.injected = false;
        return;
    };
    let host = c.masters[i].name.clone();
    f.target = format!("master {host} ({pid})");
    f.host = Some(host.clone());
    // Read while Redis answers: the leases its slots hold now must come back later.
    let held = c.leases_on(&host).unwrap_or_default();
    let tree = procs::descendants(pid);
    f.pids = tree.clone();
    f.pids.insert(pid);
    let freeze = rng.range(0, 2) == 1;
    let node = c.redis.pick(rng);
    f.start_ms = now_ms();
    if freeze {
        if let Err(e) = c.redis.signal(node, Signal::SIGSTOP) {
            f.problems.push(e);
        }
    } else {
        c.redis.kill(node);
    }
    watch_roles(c, Duration::from_millis(rng.range(500, 2000)));
    let asked = Instant::now();
    if let Err(e) = procs::signal(pid, Signal::SIGTERM) {
        f.problems.push(e);
    }
    let exit = wait_exit(c, &mut child, DRAIN_TIMEOUT + DRAIN_BOUND);
    let took = asked.elapsed();
    f.notes.push(format!(
        "{} {}",
        c.redis.name(node),
        if freeze { "frozen" } else { "killed" }
    ));
    match exit {
        Some(status) if status.success() => f.notes.push(format!(
            "the master exited {:.1} s after SIGTERM",
            took.as_secs_f64()
        )),
        Some(status) => f.problems.push(format!(
            "the master stopped with {status} {:.1} s after SIGTERM",
            took.as_secs_f64()
        )),
        None => f.problems.push(format!(
            "the master did not exit within drain_timeout {DRAIN_TIMEOUT:?} + {DRAIN_BOUND:?} \
             of SIGTERM with Redis down; killed"
        )),
    }
    let alive = wait_gone(&tree, Duration::from_secs(2));
    if !alive.is_empty() {
        let list: Vec<String> = alive
            .iter()
            .map(|p| format!("{p} ({})", procs::cmdline(*p)))
            .collect();
        f.problems.push(format!(
            "left behind by the stopped master: {}",
            list.join(", ")
        ));
    }
    let back = if freeze {
        c.redis.signal(node, Signal::SIGCONT)
    } else {
        c.redis.restart(node)
    };
    if let Err(e) = back.and_then(|()| c.spawn(true, i)) {
        f.problems.push(e);
    }
    f.end_ms = now_ms();
    leases_come_back(c, &held, f);
}

/// Waits up to `limit` for `child` to exit, watching the other roles meanwhile; kills it
/// (and returns None) past the limit.
fn wait_exit(
    c: &mut Cluster,
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        c.check_roles();
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The leases in `held` (`QUEUE/token:id`) end once Redis is back: each is settled or, expired,
/// reclaimed by another slot's take, so its task runs again.
fn leases_come_back(c: &mut Cluster, held: &BTreeSet<String>, f: &mut Fault) {
    let deadline = Instant::now() + c.shape.lease() + Duration::from_secs(10);
    loop {
        let still: Vec<String> = match c.leased() {
            Some(now) => held.intersection(&now).cloned().collect(),
            None => held.iter().cloned().collect(),
        };
        if still.is_empty() {
            f.notes
                .push(format!("the {} leases it held came back", held.len()));
            return;
        }
        if Instant::now() >= deadline {
            f.problems.push(format!(
                "leases of the stopped master still held {:?} after Redis came back: {still:?}",
                c.shape.lease() + Duration::from_secs(10)
            ));
            return;
        }
        c.idle(Duration::from_millis(200));
    }
}

/// CPU ticks of every process of the cluster, and their names.
type CpuSample = (
    std::collections::BTreeMap<u32, u64>,
    std::collections::BTreeMap<u32, String>,
);

fn cpu(c: &Cluster) -> CpuSample {
    let mut ticks = std::collections::BTreeMap::new();
    let mut names = std::collections::BTreeMap::new();
    for (pid, name) in c.tree() {
        if let Some(t) = procs::cpu_ticks(pid) {
            ticks.insert(pid, t);
            names.insert(pid, name);
        }
    }
    (ticks, names)
}

/// Waits `d` while Redis is away, only watching that no role exits (the map cannot be
/// read meanwhile).
fn watch_roles(c: &mut Cluster, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        c.check_roles();
        std::thread::sleep(Duration::from_millis(200));
    }
}
