//! The plan as data: each rule has a case whose input and plan are a snapshot, and
//! proptest checks the invariants on random hosts.

use std::fmt::Write;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

/// A host to plan for, built up by the tests. Times are seconds relative to `now`.
struct Case {
    input: PlanInput,
}

impl Case {
    /// Zygote generation 2, ready and taking requests, nothing wanted or running, no
    /// capacity measured yet.
    fn new() -> Self {
        Case {
            input: PlanInput {
                // Far from the clock's origin, so any age can be subtracted.
                now: Instant::now() + Duration::from_secs(86_400),
                slots: BTreeMap::new(),
                wanted: BTreeMap::new(),
                capacity: None,
                long: BTreeSet::new(),
                zygote: ZygoteView {
                    generation: 2,
                    ready: true,
                    accepts: true,
                    preloaded: BTreeSet::new(),
                },
            },
        }
    }

    /// The map gives this host `slots` of `queue`; the zygote preloaded it.
    fn want(mut self, queue: &str, slots: u32, priority: i32) -> Self {
        self.input.wanted.insert(
            queue.into(),
            Want {
                slots,
                priority,
                not_before: None,
            },
        );
        self.input.zygote.preloaded.insert(queue.into());
        self
    }

    /// Slot `n` of `queue` from the current zygote, `age` seconds old.
    fn slot(self, n: u32, queue: &str, state: SlotState, age: u64) -> Self {
        let generation = self.input.zygote.generation;
        self.slot_of(generation, n, queue, state, age)
    }

    /// Slot `n` of `queue` from the zygote of `generation`, `age` seconds old.
    fn slot_of(mut self, generation: u64, n: u32, queue: &str, state: SlotState, age: u64) -> Self {
        let spawned_at = self.input.now - Duration::from_secs(age);
        self.input.slots.insert(
            n,
            SlotView {
                queue: queue.into(),
                generation,
                state,
                spawned_at,
                retiring: false,
            },
        );
        self
    }

    /// Slot `n` marks itself retiring (an earlier plan retired it).
    fn retiring(mut self, n: u32) -> Self {
        self.input.slots.get_mut(&n).expect("a slot").retiring = true;
        self
    }

    /// `queue` is of kind long.
    fn long(mut self, queue: &str) -> Self {
        self.input.long.insert(queue.into());
        self
    }

    fn capacity(mut self, slots: u32) -> Self {
        self.input.capacity = Some(slots);
        self
    }

    /// `queue` backs off after crashes until `secs` from now (negative: it has passed).
    fn backing_off(mut self, queue: &str, secs: i64) -> Self {
        let now = self.input.now;
        let at = if secs >= 0 {
            now + Duration::from_secs(secs as u64)
        } else {
            now - Duration::from_secs(secs.unsigned_abs())
        };
        self.input.wanted.get_mut(queue).unwrap().not_before = Some(at);
        self
    }

    fn zygote(mut self, f: impl FnOnce(&mut ZygoteView)) -> Self {
        f(&mut self.input.zygote);
        self
    }
}

/// The input and the plan as text: times as seconds relative to `now`.
fn render(input: &PlanInput, plan: &Plan) -> String {
    let secs = |t: Instant| {
        if t >= input.now {
            format!("+{}s", (t - input.now).as_secs())
        } else {
            format!("-{}s", (input.now - t).as_secs())
        }
    };
    let z = &input.zygote;
    let mut out = String::new();
    let preloaded: Vec<&str> = z.preloaded.iter().map(String::as_str).collect();
    let _ = writeln!(
        out,
        "zygote: generation {}, ready {}, accepts {}, preloaded {preloaded:?}",
        z.generation, z.ready, z.accepts
    );
    let capacity = input
        .capacity
        .map_or("unmeasured".into(), |c| c.to_string());
    let _ = writeln!(out, "capacity: {capacity}");
    if !input.long.is_empty() {
        let _ = writeln!(out, "long: {:?}", input.long);
    }
    out.push_str("wanted:\n");
    for (q, w) in &input.wanted {
        let backoff = w
            .not_before
            .map_or(String::new(), |t| format!(", not before {}", secs(t)));
        let _ = writeln!(out, "  {q}: {} (priority {}{backoff})", w.slots, w.priority);
    }
    out.push_str("slots:\n");
    for (n, s) in &input.slots {
        let _ = writeln!(
            out,
            "  #{n} {} gen {} {:?}, spawned {}",
            s.queue,
            s.generation,
            s.state,
            secs(s.spawned_at)
        );
    }
    let _ = writeln!(out, "stop: {:?}", plan.stop);
    if !plan.retire.is_empty() {
        let _ = writeln!(out, "retire: {:?}", plan.retire);
    }
    let _ = writeln!(out, "spawn: {:?}", plan.spawn);
    out
}

/// Plans the case, checks the invariants, and snapshots input and plan.
fn check(name: &str, case: Case) {
    let plan = plan(&case.input);
    assert_invariants(&case.input, &plan);
    insta::assert_snapshot!(name, render(&case.input, &plan));
}

use SlotState::{Busy, Idle, Spawning, Starting, Stopping};

#[test]
fn a_busy_long_slot_never_stops_but_retires() {
    // watch (long) is no longer wanted here and the new zygote is ready: its idle slot
    // and its old idle one stop, its busy ones (either generation) keep their tasks and
    // retire (they exit once it ended). images (batch) shrinks as always, busy last.
    check(
        "busy_long_slots_retire",
        Case::new()
            .long("watch")
            .want("images", 1, 0)
            .slot(1, "watch", Busy, 100)
            .slot(2, "watch", Idle, 50)
            .slot_of(1, 3, "watch", Busy, 500)
            .slot_of(1, 4, "watch", Idle, 500)
            .slot(5, "images", Busy, 10)
            .slot(6, "images", Busy, 20),
    );
}

#[test]
fn a_retiring_slot_stops_once_its_queue_s_long_tasks_are_not_kept() {
    // The host drains (no long queue kept): watch's busy slot that an earlier plan
    // retired is stopped with the rest, so its task is handed back within the drain's
    // bound instead of holding the master until a cancel (found by the fault suite).
    check(
        "retiring_slot_stops_when_draining",
        Case::new()
            .slot(1, "watch", Busy, 100)
            .retiring(1)
            .slot(2, "watch", Busy, 50),
    );
    // Kept (the host serves on): it stays retiring, and is not stopped.
    let kept = Case::new()
        .long("watch")
        .want("watch", 1, 0)
        .slot(1, "watch", Busy, 100)
        .retiring(1)
        .slot(2, "watch", Busy, 50);
    let plan = plan(&kept.input);
    assert_invariants(&kept.input, &plan);
    assert_eq!((plan.stop.clone(), plan.retire.clone()), (vec![], vec![1]));
}

#[test]
fn an_old_busy_long_slot_retires_and_its_place_is_taken_at_once() {
    // A new zygote is ready. watch wants 2: its old busy slot retires and no longer
    // counts, so its current idle slot stays and one more starts beside the retiring
    // one (room for it). tail wants 1 and has only an old busy slot: it retires and a
    // new one starts; the old holds its place until its task ends, so capacity 4 is
    // full.
    check(
        "old_busy_long_slots_retire",
        Case::new()
            .long("watch")
            .long("tail")
            .want("watch", 2, 0)
            .want("tail", 1, 0)
            .capacity(4)
            .slot_of(1, 1, "watch", Busy, 500)
            .slot(2, "watch", Idle, 50)
            .slot_of(1, 3, "tail", Busy, 500),
    );
}

#[test]
fn nothing_running_starts_what_is_wanted() {
    check(
        "nothing_running",
        Case::new().want("images", 2, 0).want("mail", 1, 0),
    );
}

#[test]
fn scarce_capacity_goes_to_the_highest_priority() {
    // 4 places for 6 wanted: urgent (priority 9) gets its 3; the last goes to bulk, first
    // by name of the two at priority 1.
    check(
        "scarce_capacity_by_priority",
        Case::new()
            .want("bulk", 2, 1)
            .want("reports", 1, 1)
            .want("urgent", 3, 9)
            .capacity(4),
    );
}

#[test]
fn surplus_stops_idle_first_then_starting_then_busy_youngest_first() {
    // 6 running, 2 wanted: the two idle ones stop (youngest first), then the spawning and
    // starting ones (youngest first); the two busy ones stay.
    check(
        "surplus_stop_order",
        Case::new()
            .want("images", 2, 0)
            .slot(1, "images", Busy, 100)
            .slot(2, "images", Idle, 50)
            .slot(3, "images", Idle, 10)
            .slot(4, "images", Starting, 5)
            .slot(5, "images", Spawning, 1)
            .slot(6, "images", Busy, 20),
    );
}

#[test]
fn a_queue_no_longer_wanted_stops_all_its_slots() {
    check(
        "unwanted_queue_stops",
        Case::new()
            .want("images", 1, 0)
            .slot(1, "images", Idle, 10)
            .slot(2, "retired", Busy, 10)
            .slot(3, "retired", Idle, 10),
    );
}

#[test]
fn stopping_slots_neither_count_nor_stop_again() {
    // Slot 1 is on its way out: images has 1 running of 2, and the host has room for 1
    // more only because stopping slots do not count.
    check(
        "stopping_slots_do_not_count",
        Case::new()
            .want("images", 2, 0)
            .slot(1, "images", Stopping, 30)
            .slot(2, "images", Busy, 20)
            .capacity(2),
    );
}

#[test]
fn a_ready_new_zygote_rolls_every_old_slot_over() {
    // Generation 2 is ready: generation 1's slots all stop, busy or not, and generation 2
    // is filled up to what is wanted.
    check(
        "roll_over_to_new_zygote",
        Case::new()
            .want("images", 2, 0)
            .slot_of(1, 1, "images", Busy, 100)
            .slot_of(1, 2, "images", Idle, 90)
            .slot(3, "images", Idle, 5),
    );
}

#[test]
fn a_new_zygote_not_ready_yet_keeps_the_old_slots() {
    // Generation 2 is still preloading: the old slots keep serving, only the surplus
    // stops, and nothing starts.
    check(
        "new_zygote_not_ready",
        Case::new()
            .want("images", 1, 0)
            .slot_of(1, 1, "images", Busy, 100)
            .slot_of(1, 2, "images", Idle, 90)
            .zygote(|z| z.ready = false),
    );
}

#[test]
fn a_retired_zygote_stops_surplus_but_starts_nothing() {
    check(
        "retired_zygote",
        Case::new()
            .want("images", 3, 0)
            .want("mail", 1, 0)
            .slot(1, "mail", Idle, 5)
            .slot(2, "mail", Idle, 3)
            .zygote(|z| z.accepts = false),
    );
}

#[test]
fn crash_back_off_holds_a_queue_until_its_time() {
    // flaky backs off for 3 s more: nothing starts for it; mail's back-off has passed.
    check(
        "crash_back_off",
        Case::new()
            .want("flaky", 2, 5)
            .want("mail", 1, 0)
            .backing_off("flaky", 3)
            .backing_off("mail", -1),
    );
}

#[test]
fn a_queue_the_zygote_did_not_preload_gets_no_slot() {
    check(
        "not_preloaded",
        Case::new()
            .want("broken", 2, 9)
            .want("mail", 1, 0)
            .zygote(|z| {
                z.preloaded.remove("broken");
            }),
    );
}

#[test]
fn capacity_below_what_runs_stops_nothing() {
    // The host shrank to 1 but runs 3 wanted slots: capacity never stops a slot (the
    // manager moves them), it only keeps new ones from starting.
    check(
        "over_capacity_keeps_running",
        Case::new()
            .want("images", 4, 0)
            .slot(1, "images", Busy, 10)
            .slot(2, "images", Idle, 10)
            .slot(3, "images", Idle, 10)
            .capacity(1),
    );
}

/// Whether slot `s` is among those that go on running (not stopping) before the plan.
fn running(s: &SlotView) -> bool {
    s.state != Stopping
}

/// Whether `queue` may start slots at all: the zygote preloaded it and it is not backing
/// off.
fn eligible(input: &PlanInput, queue: &str) -> bool {
    let z = &input.zygote;
    z.ready
        && z.accepts
        && z.preloaded.contains(queue)
        && input.wanted[queue]
            .not_before
            .is_none_or(|t| input.now >= t)
}

fn assert_invariants(input: &PlanInput, plan: &Plan) {
    // Same input, same plan.
    assert_eq!(&super::plan(input), plan);

    // Stops only running slots, each once.
    let stopped: BTreeSet<u32> = plan.stop.iter().copied().collect();
    assert_eq!(stopped.len(), plan.stop.len(), "a slot stopped twice");
    for n in &stopped {
        assert!(running(&input.slots[n]), "#{n} stopped again");
    }

    // Never over capacity: what keeps running plus what starts fits, unless nothing
    // starts (capacity never stops a slot).
    let kept: Vec<&SlotView> = input
        .slots
        .iter()
        .filter(|(n, s)| running(s) && !stopped.contains(n))
        .map(|(_, s)| s)
        .collect();
    let capacity = input.capacity.map_or(usize::MAX, |c| c as usize);
    if !plan.spawn.is_empty() {
        assert!(kept.len() + plan.spawn.len() <= capacity, "over capacity");
    }

    for queue in &plan.spawn {
        assert!(eligible(input, queue), "{queue} started while not eligible");
    }

    // Retires only running slots busy with a long task (or retiring already), each once,
    // none it stops.
    let retired: BTreeSet<u32> = plan.retire.iter().copied().collect();
    assert_eq!(retired.len(), plan.retire.len(), "a slot retired twice");
    for n in &retired {
        let s = &input.slots[n];
        let pinned = input.long.contains(&s.queue) && s.state == Busy;
        assert!(running(s) && (pinned || s.retiring), "#{n} retired: {s:?}");
        assert!(!stopped.contains(n), "#{n} both stopped and retired");
    }

    let queues: BTreeSet<&str> = input
        .slots
        .values()
        .map(|s| s.queue.as_str())
        .chain(input.wanted.keys().map(String::as_str))
        .collect();
    for queue in queues {
        assert_queue(input, plan, &stopped, queue, capacity, kept.len());
    }
}

/// The invariants of one queue: roll-over, surplus order, no more than wanted, priority.
fn assert_queue(
    input: &PlanInput,
    plan: &Plan,
    stopped: &BTreeSet<u32>,
    queue: &str,
    capacity: usize,
    kept_total: usize,
) {
    let want = input.wanted.get(queue).map_or(0, |w| w.slots) as usize;
    let current = input.zygote.generation;
    let roll_over = input.zygote.ready;
    let mine: Vec<(u32, &SlotView)> = input
        .slots
        .iter()
        .filter(|(_, s)| s.queue == queue && running(s))
        .map(|(&n, s)| (n, s))
        .collect();
    // A busy slot of a long queue never stops, and only such a slot retires.
    let pinned = |s: &SlotView| input.long.contains(queue) && s.state == Busy;
    let retired = |n: &u32| plan.retire.contains(n);
    for (n, s) in &mine {
        if pinned(s) {
            assert!(!stopped.contains(n), "#{n} busy with a long task stopped");
        }
        // A retiring slot stays so while its queue's long tasks are kept, and stops once
        // they are not (a drain, a window that hands them back).
        if s.retiring && input.long.contains(queue) {
            assert!(
                retired(n) && !stopped.contains(n),
                "#{n} retiring, no longer so"
            );
        } else if s.retiring {
            assert!(
                stopped.contains(n) && !retired(n),
                "#{n} retiring on a queue whose long tasks are not kept, not stopped"
            );
        }
    }
    // Once the new zygote is ready, no old slot keeps running: those busy with a long
    // task retire, the others stop.
    if roll_over {
        for (n, s) in &mine {
            if s.generation != current {
                let gone = if pinned(s) {
                    retired(n)
                } else {
                    stopped.contains(n)
                };
                assert!(gone, "#{n} of an old zygote kept");
            }
        }
    }
    let candidates: Vec<(u32, &SlotView)> = mine
        .into_iter()
        .filter(|(_, s)| !s.retiring && (!roll_over || s.generation == current))
        .collect();
    let (gone, stay): (Vec<_>, Vec<_>) = candidates.iter().partition(|(n, _)| stopped.contains(n));
    // Exactly the surplus stops (as far as slots may stop), and it stops first: idle
    // before starting before busy, the youngest first.
    let stoppable = candidates.iter().filter(|(_, s)| !pinned(s)).count();
    assert_eq!(
        gone.len(),
        candidates.len().saturating_sub(want).min(stoppable),
        "{queue}"
    );
    let key = |s: &SlotView| (s.state.stop_rank(), Reverse(s.spawned_at));
    for (g, gs) in &gone {
        for (k, ks) in &stay {
            assert!(key(gs) <= key(ks), "{queue}: #{g} stopped before #{k}");
        }
    }
    // Busy long slots beyond the surplus retire, exactly as many as it lacks.
    let retiring = stay.iter().filter(|(n, _)| retired(n)).count();
    assert_eq!(
        gone.len() + retiring,
        candidates.len().saturating_sub(want),
        "{queue}: stopped and retired make the surplus"
    );
    // Never more than wanted go on.
    let started = plan.spawn.iter().filter(|q| *q == queue).count();
    assert!(
        stay.len() - retiring + started <= want,
        "{queue} over-started"
    );
    // A queue left short while it could start slots is short of capacity, and no queue
    // of lower priority started any.
    if input.wanted.contains_key(queue)
        && eligible(input, queue)
        && stay.len() - retiring + started < want
    {
        assert!(
            kept_total + plan.spawn.len() >= capacity,
            "{queue} short with room"
        );
        let priority = input.wanted[queue].priority;
        for other in &plan.spawn {
            assert!(
                input.wanted[other].priority >= priority,
                "{other} started before higher-priority {queue}"
            );
        }
    }
}

fn any_state() -> impl Strategy<Value = SlotState> {
    prop_oneof![
        Just(Spawning),
        Just(Starting),
        Just(Idle),
        Just(Busy),
        Just(Stopping)
    ]
}

const QUEUES: [&str; 4] = ["a", "b", "c", "d"];

fn any_input() -> impl Strategy<Value = PlanInput> {
    let wanted = proptest::collection::btree_map(
        proptest::sample::select(&QUEUES[..]).prop_map(String::from),
        (0u32..6, 0i32..3, proptest::option::of(-5i64..5)),
        0..4,
    );
    let slots = proptest::collection::btree_map(
        1u32..40,
        (
            proptest::sample::select(&QUEUES[..]),
            1u64..=2,
            any_state(),
            0u64..100,
        ),
        0..16,
    );
    let zygote = (
        1u64..=2,
        any::<bool>(),
        any::<bool>(),
        proptest::sample::subsequence(&QUEUES[..], 0..=4),
    );
    let long = proptest::sample::subsequence(&QUEUES[..], 0..=2);
    (wanted, slots, zygote, proptest::option::of(0u32..20), long).prop_map(
        |(wanted, slots, (generation, ready, accepts, preloaded), capacity, long)| {
            let now = Instant::now() + Duration::from_secs(86_400);
            let at = |secs: i64| {
                if secs >= 0 {
                    now + Duration::from_secs(secs as u64)
                } else {
                    now - Duration::from_secs(secs.unsigned_abs())
                }
            };
            PlanInput {
                now,
                wanted: wanted
                    .into_iter()
                    .map(|(q, (slots, priority, back_off))| {
                        let not_before = back_off.map(at);
                        (
                            q,
                            Want {
                                slots,
                                priority,
                                not_before,
                            },
                        )
                    })
                    .collect(),
                slots: slots
                    .into_iter()
                    .map(|(n, (queue, generation, state, age))| {
                        let spawned_at = now - Duration::from_secs(age);
                        let queue = queue.to_string();
                        // (an earlier plan retires busy long slots only; one in four)
                        let retiring =
                            state == Busy && long.contains(&queue.as_str()) && n % 4 == 0;
                        (
                            n,
                            SlotView {
                                queue,
                                generation,
                                state,
                                spawned_at,
                                retiring,
                            },
                        )
                    })
                    .collect(),
                capacity,
                zygote: ZygoteView {
                    generation,
                    ready,
                    accepts,
                    preloaded: preloaded.into_iter().map(String::from).collect(),
                },
                long: long.into_iter().map(String::from).collect(),
            }
        },
    )
}

proptest! {
    #[test]
    fn every_plan_keeps_the_invariants(input in any_input()) {
        let plan = plan(&input);
        assert_invariants(&input, &plan);
    }
}
