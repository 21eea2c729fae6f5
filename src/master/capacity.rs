//! How many slots this host can hold, from memory, load and `max_slots`.
//!
//! Pure arithmetic on readings taken elsewhere ([`crate::host::sysinfo`]), so every case
//! can be tested as data and the master's tick stays the only place that touches `/proc`.
//!
//! The memory budget counts what the master, zygote and slots use now (Σ PSS) as part of
//! what they may use, so the answer does not swing as slots start and stop: a slot moving
//! from MemAvailable into PSS leaves the budget unchanged.

use serde::Serialize;

/// Readings and settings one capacity decision is made from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityInput {
    /// Σ PSS of the master's whole process tree (zygotes, slots, their exec children and
    /// what those started) and of the slots' outside processes, each once, in bytes: a
    /// slot's share of it, the average slot, includes its exec child.
    pub pss_total: u64,
    /// Slots running now.
    pub slots: u32,
    /// `MemAvailable` from `/proc/meminfo`, in bytes.
    pub mem_available: u64,
    /// The cgroup's `memory.max`, when one is set.
    pub cgroup_limit: Option<u64>,
    /// The cgroup's `memory.current`.
    pub cgroup_usage: Option<u64>,
    /// Bytes left to the rest of the host.
    pub reserve: u64,
    /// Assumed size of one slot until one has run.
    pub slot_estimate: u64,
    /// One-minute load average.
    pub load1: f64,
    /// CPUs the load is shared by.
    pub cpus: u32,
    /// Load per CPU above which the host takes no more slots.
    pub max_load_per_cpu: f64,
    /// PSI's `some avg10` of `/proc/pressure/cpu` (percent of the last 10 s in which some
    /// task waited for a CPU), where the kernel has it.
    pub cpu_pressure: Option<f64>,
    /// The slots the host held when the CPU bound began ([`Capacity::held`] of the last
    /// decision): what it keeps, replacing slots that exit, while the bound holds.
    pub held: Option<u32>,
    /// Slots the host keeps whatever the CPU says: the `min_slots` of the queues the map
    /// gives it, each up to what the map gives (the plan starts the highest priorities
    /// first).
    pub floor: u32,
    /// Upper bound of slots on this host, whatever memory says.
    pub max_slots: Option<u32>,
}

/// PSI's `some avg10` under which the CPU is not contended now, whatever the load average
/// says. `some` is near 100 % whenever more tasks want a CPU than there are, whether 1.5 or
/// 40 per CPU, so it cannot carry the load's ceiling; but it falls within seconds of a
/// spike's end, where the one-minute load takes a minute or more.
pub const CONTENDED_PRESSURE: f64 = 50.0;

pub use crate::cluster::Bound;

/// How many slots the host can hold, with the numbers behind it for `/status` and reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capacity {
    /// Slots the host can hold now.
    pub slots: u32,
    /// Bytes one slot is counted as: Σ PSS / running slots, or the estimate; never 0.
    pub avg_slot: u64,
    /// Σ PSS + available − reserve, saturating at 0.
    pub budget: u64,
    /// `MemAvailable` bounded by the cgroup's headroom: min(mem_available, limit − usage).
    pub available: u64,
    /// Which limit decided `slots`.
    pub bound: Bound,
    /// While the CPU is overloaded, the slots the host holds at (the count when the
    /// overload began); the next decision's [`CapacityInput::held`].
    pub held: Option<u32>,
}

/// Sizes the host: `floor((Σ PSS + available − reserve) / avg_slot)`, then the load and
/// `max_slots` bounds.
///
/// An overloaded CPU holds the host at the slots it ran when the overload began (or the
/// queues' `min_slots` here, [`CapacityInput::floor`], if more) rather than shrinking it:
/// it stops growing, but a slot that exits (a crash, a recycle) is replaced, so a
/// min_slots queue keeps its slots through a spike. The manager moves new work to
/// other hosts, and killing busy slots here would only add churn to a host that is
/// already struggling. Memory still shrinks it, since running out of memory is worse than
/// running slowly. The CPU is overloaded when the load per CPU passes its ceiling and,
/// where the kernel has PSI, some task still waits for a CPU at least
/// [`CONTENDED_PRESSURE`] % of the time (the load lags a spike's end by a minute). A limit
/// reports itself as the [`Bound`] only when it is strictly tighter than the ones before
/// it.
pub fn capacity(input: &CapacityInput) -> Capacity {
    // Master and zygote PSS is spread over the slots, so a host running few slots counts
    // each as larger: that overhead is real and has to fit too.
    let avg_slot = match input.slots {
        0 => input.slot_estimate,
        n => input.pss_total / u64::from(n),
    }
    .max(1);

    let available = match input.cgroup_limit {
        // Usage unknown: the limit alone still bounds what can be had.
        Some(limit) => {
            let headroom = limit.saturating_sub(input.cgroup_usage.unwrap_or(0));
            input.mem_available.min(headroom)
        }
        None => input.mem_available,
    };

    let budget = input
        .pss_total
        .saturating_add(available)
        .saturating_sub(input.reserve);

    let mut slots = u32::try_from(budget / avg_slot).unwrap_or(u32::MAX);
    let mut bound = Bound::Memory;

    let held = overloaded(input).then(|| input.held.unwrap_or(input.slots).max(input.floor));
    if let Some(keep) = held
        && keep < slots
    {
        slots = keep;
        bound = Bound::Load;
    }

    if let Some(max) = input.max_slots
        && max < slots
    {
        slots = max;
        bound = Bound::MaxSlots;
    }

    Capacity {
        slots,
        avg_slot,
        budget,
        available,
        bound,
        held,
    }
}

/// Whether the CPU is overloaded now (see [`capacity`]). A NaN load or pressure compares
/// false and so imposes nothing: better than pinning the host on a reading that makes no
/// sense.
pub fn overloaded(input: &CapacityInput) -> bool {
    let load_per_cpu = input.load1 / f64::from(input.cpus.max(1));
    load_per_cpu > input.max_load_per_cpu
        && input.cpu_pressure.is_none_or(|p| p >= CONTENDED_PRESSURE)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::host::sysinfo;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// A host with 16 GiB available, nothing running, 512 MiB reserve, 64 MiB estimate,
    /// idle CPUs and no caps; each case changes what it is about.
    fn base() -> CapacityInput {
        CapacityInput {
            pss_total: 0,
            slots: 0,
            mem_available: 16 * GIB,
            cgroup_limit: None,
            cgroup_usage: None,
            reserve: 512 * MIB,
            slot_estimate: 64 * MIB,
            load1: 0.5,
            cpus: 8,
            max_load_per_cpu: 2.0,
            cpu_pressure: None,
            held: None,
            floor: 0,
            max_slots: None,
        }
    }

    /// Snapshots the input with its result, so each snapshot file reads on its own.
    fn check(name: &str, input: CapacityInput) {
        let output = capacity(&input);
        insta::assert_debug_snapshot!(name, (input, output));
    }

    #[test]
    fn no_slots_yet_uses_the_estimate() {
        // Only master and zygote run: (100 MiB + 16 GiB − 512 MiB) / 64 MiB = 249.
        check(
            "no_slots_yet",
            CapacityInput {
                pss_total: 100 * MIB,
                ..base()
            },
        );
    }

    #[test]
    fn eight_slots_sharing_pages() {
        // Shared pages make PSS small: 8 slots in 400 MiB count 50 MiB each;
        // (400 MiB + 4 GiB − 512 MiB) / 50 MiB = 79.
        check(
            "eight_slots_sharing",
            CapacityInput {
                pss_total: 400 * MIB,
                slots: 8,
                mem_available: 4 * GIB,
                ..base()
            },
        );
    }

    #[test]
    fn reserve_bigger_than_memory_gives_zero() {
        // 100 MiB + 200 MiB − 1 GiB saturates to a budget of 0.
        check(
            "reserve_bigger_than_memory",
            CapacityInput {
                pss_total: 100 * MIB,
                mem_available: 200 * MIB,
                reserve: GIB,
                ..base()
            },
        );
    }

    #[test]
    fn cgroup_limit_tighter_than_mem_available() {
        // 2 GiB limit with 1 GiB used leaves 1 GiB, though the host has 16:
        // (256 MiB + 1 GiB − 512 MiB) / 64 MiB = 12.
        check(
            "cgroup_limit_tighter",
            CapacityInput {
                pss_total: 256 * MIB,
                slots: 4,
                cgroup_limit: Some(2 * GIB),
                cgroup_usage: Some(GIB),
                ..base()
            },
        );
    }

    #[test]
    fn load_over_limit_holds_current_slots() {
        // Load 3 per CPU over 2: memory would allow 258, the host stays at its 10.
        check(
            "load_over_limit_holds",
            CapacityInput {
                pss_total: 640 * MIB,
                slots: 10,
                load1: 24.0,
                ..base()
            },
        );
    }

    #[test]
    fn load_over_limit_still_shrinks_on_memory() {
        // Memory fits 6 of the 10 running: load must not keep the other 4 alive.
        check(
            "load_over_limit_memory_shrinks",
            CapacityInput {
                pss_total: 640 * MIB,
                slots: 10,
                mem_available: 0,
                reserve: 256 * MIB,
                load1: 24.0,
                ..base()
            },
        );
    }

    #[test]
    fn max_slots_caps() {
        // Memory would allow 258.
        check(
            "max_slots_caps",
            CapacityInput {
                pss_total: 640 * MIB,
                slots: 10,
                max_slots: Some(12),
                ..base()
            },
        );
    }

    #[test]
    fn zero_estimate_never_divides_by_zero() {
        let output = capacity(&CapacityInput {
            slot_estimate: 0,
            mem_available: 10,
            reserve: 0,
            ..base()
        });
        assert_eq!((output.avg_slot, output.slots), (1, 10));
    }

    #[test]
    fn serializes_for_status() {
        let output = capacity(&CapacityInput {
            max_slots: Some(1),
            ..base()
        });
        let json = serde_json::to_value(&output).unwrap();
        assert_eq!(json["bound"], "max_slots");
        assert_eq!(json["slots"], 1);
    }

    #[test]
    fn an_overloaded_host_replaces_a_slot_that_exits_and_takes_no_more() {
        // Overloaded with 6 slots: held at 6. One crashes (5 run): still 6, so it is
        // replaced; none beyond.
        let busy = CapacityInput {
            pss_total: 600 * MIB,
            slots: 6,
            load1: 40.0,
            ..base()
        };
        let first = capacity(&busy);
        assert_eq!(
            (first.slots, first.bound, first.held),
            (6, Bound::Load, Some(6))
        );
        let after_crash = CapacityInput {
            slots: 5,
            held: first.held,
            ..busy.clone()
        };
        let next = capacity(&after_crash);
        assert_eq!(
            (next.slots, next.bound, next.held),
            (6, Bound::Load, Some(6))
        );
        // The spike is over by PSI though the load average still says 5 per CPU: the host
        // grows again at once.
        let calm = CapacityInput {
            cpu_pressure: Some(4.0),
            held: next.held,
            ..busy.clone()
        };
        let calm = capacity(&calm);
        assert_eq!((calm.bound, calm.held), (Bound::Memory, None));
        assert!(calm.slots > 6);
        // Contended by PSI too: held.
        let contended = CapacityInput {
            cpu_pressure: Some(97.0),
            ..busy.clone()
        };
        assert_eq!(capacity(&contended).held, Some(6));
        // A master that starts overloaded still serves its min_slots (4), no more.
        let fresh = CapacityInput {
            pss_total: 100 * MIB,
            slots: 0,
            floor: 4,
            ..busy
        };
        let fresh = capacity(&fresh);
        assert_eq!(
            (fresh.slots, fresh.bound, fresh.held),
            (4, Bound::Load, Some(4))
        );
    }

    fn any_input() -> impl Strategy<Value = CapacityInput> {
        (
            (0..64 * GIB, 0u32..512, 0..256 * GIB),
            (
                proptest::option::of(0..256 * GIB),
                proptest::option::of(0..256 * GIB),
            ),
            (0..8 * GIB, 0..4 * GIB),
            (0.0..256.0f64, 0u32..256, 0.0..8.0f64),
            proptest::option::of(0u32..1024),
        )
            .prop_map(
                |(
                    (pss_total, slots, mem_available),
                    (cgroup_limit, cgroup_usage),
                    (reserve, slot_estimate),
                    (load1, cpus, max_load_per_cpu),
                    max_slots,
                )| CapacityInput {
                    pss_total,
                    slots,
                    mem_available,
                    cgroup_limit,
                    cgroup_usage,
                    reserve,
                    slot_estimate,
                    load1,
                    cpus,
                    max_load_per_cpu,
                    cpu_pressure: None,
                    held: None,
                    floor: 0,
                    max_slots,
                },
            )
    }

    proptest! {
        #[test]
        fn an_overloaded_host_never_grows_past_what_it_held(input in any_input(), held in 0u32..512, floor in 0u32..64) {
            let input = CapacityInput { held: Some(held), floor, ..input };
            let output = capacity(&input);
            if overloaded(&input) {
                prop_assert!(output.slots <= held.max(floor));
                prop_assert_eq!(output.held, Some(held.max(floor)));
            } else {
                prop_assert_eq!(output.held, None);
            }
        }

        #[test]
        fn never_exceeds_max_slots(input in any_input()) {
            let output = capacity(&input);
            if let Some(max) = input.max_slots {
                prop_assert!(output.slots <= max);
            }
        }

        #[test]
        fn more_mem_available_never_lowers_capacity(input in any_input(), more in 0..64 * GIB) {
            let richer = CapacityInput { mem_available: input.mem_available + more, ..input.clone() };
            prop_assert!(capacity(&richer).slots >= capacity(&input).slots);
        }

        #[test]
        fn within_budget(input in any_input()) {
            let output = capacity(&input);
            prop_assert!(output.avg_slot > 0);
            prop_assert!(u64::from(output.slots) <= output.budget / output.avg_slot);
            prop_assert!(output.available <= input.mem_available);
        }
    }

    #[test]
    fn live_capacity_of_this_process() {
        let pss = sysinfo::pss(std::process::id()).unwrap();
        let cgroup = sysinfo::cgroup_memory().unwrap();
        let input = CapacityInput {
            pss_total: pss,
            slots: 1,
            mem_available: sysinfo::mem_available().unwrap(),
            cgroup_limit: cgroup.map(|(limit, _)| limit),
            cgroup_usage: cgroup.map(|(_, usage)| usage),
            reserve: 512 * MIB,
            slot_estimate: 64 * MIB,
            load1: sysinfo::load1().unwrap(),
            cpus: sysinfo::cpus().unwrap(),
            max_load_per_cpu: f64::INFINITY,
            cpu_pressure: sysinfo::cpu_pressure().unwrap(),
            held: None,
            floor: 0,
            max_slots: None,
        };
        let output = capacity(&input);
        assert!(output.slots >= 1, "{input:?} → {output:?}");
        assert_eq!(output.budget, pss + output.available - 512 * MIB);
    }
}
