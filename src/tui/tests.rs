//! Every view drawn from fixed state into a `TestBackend` (insta snapshots), and the
//! rules of `update`: sorting, selection, and no effect without a confirmation.

use std::collections::BTreeMap;
use std::time::Duration;

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::Color;

use super::state::{Action, Effect, Finder, Found, HISTORY, SortKey, State, View, update};
use crate::cluster::snapshot::{
    DecisionView, HostState, HostView, LongRunning, ManagerView, QueueView, Snapshot, SystemView,
};
use crate::cluster::{HostReport, QueueReport, SlotMap};
use crate::config::{Intake, QueueKind};
use crate::queue_client::{
    HistoryEntry, QueueStats, RecordState, RedisNode, SystemState, TaskRecord, Topology, rfc3339,
};

/// 2023-11-14 22:13:20 UTC: far from any clock the tests run under.
const T0: u64 = 1_700_000_000_000;
const STEP_MS: u64 = 2_000;
const READS: u64 = 30;
const GIB: u64 = 1 << 30;

struct QueueSpec {
    name: &'static str,
    priority: i32,
    min: u32,
    max: u32,
    slots: u32,
    wanted: u32,
    load: f64,
    paused: bool,
    /// Acks per read interval.
    acks: u64,
    /// Retries per read interval.
    retries: u64,
    dead: u64,
    intake: Intake,
    track: bool,
}

const QUEUES: [QueueSpec; 4] = [
    QueueSpec {
        name: "emails",
        priority: 10,
        min: 2,
        max: 20,
        slots: 6,
        wanted: 9,
        load: 1.85,
        paused: false,
        acks: 240,
        retries: 2,
        dead: 0,
        intake: Intake::Open,
        track: true,
    },
    QueueSpec {
        name: "reports",
        priority: 1,
        min: 0,
        max: 4,
        slots: 0,
        wanted: 0,
        load: 0.0,
        paused: true,
        acks: 0,
        retries: 0,
        dead: 0,
        intake: Intake::Open,
        track: false,
    },
    QueueSpec {
        name: "resize_photo",
        priority: 5,
        min: 1,
        max: 50,
        slots: 4,
        wanted: 4,
        load: 0.62,
        paused: false,
        acks: 60,
        retries: 0,
        dead: 3,
        intake: Intake::Closed,
        track: true,
    },
    QueueSpec {
        name: "webhooks",
        priority: 3,
        min: 1,
        max: 8,
        slots: 2,
        wanted: 2,
        load: 0.95,
        paused: false,
        acks: 20,
        retries: 6,
        dead: 1,
        intake: Intake::Cancel,
        track: true,
    },
];

fn host_report(host: &str, i: u64, ts_ms: u64, pss: u64, slots: &[(&str, u32)]) -> HostReport {
    HostReport {
        host: host.into(),
        pid: 4000 + host.len() as u32,
        started_ms: T0 - 3_600_000,
        ts_ms,
        draining: false,
        capacity: 16,
        slots: slots.iter().map(|(_, n)| n).sum(),
        pss_bytes: pss,
        mem_available_bytes: 6 * GIB,
        memory_budget_bytes: 2 * GIB,
        load1: 1.5 + (i % 4) as f64 / 10.0,
        cpus: 4,
        cpu_pressure: Some(12.0),
        capacity_bound: Some(crate::cluster::Bound::Memory),
        handlers: vec!["noop".into(), "sleep".into(), "exec".into()],
        map_version: 17,
        map_epoch: 3,
        redis: None,
        queues: slots
            .iter()
            .map(|(q, n)| {
                let report = QueueReport {
                    slots: *n,
                    wanted: *n,
                    processed_total: 100 * i,
                    failed_total: i,
                    batches_total: 10 * i,
                    busy_seconds_total: 4.0 * i as f64,
                    slot_lifetime_seconds_total: 7_200.0,
                    recycles_total: 1,
                    crashes_total: 0,
                    hung_total: 0,
                    pss_bytes: 0,
                    last_crash: None,
                    refused: None,
                };
                (q.to_string(), report)
            })
            .collect(),
    }
}

/// Read `i` of a cluster of three hosts: h1 alive, h2 draining at an operator's request,
/// h3 silent past the heartbeat timeout. Counters grow with `i`; backlogs wave.
fn snapshot(i: u64, manager_up: bool) -> Snapshot {
    let at_ms = T0 + i * STEP_MS;
    let wave = |k: u64| (i * 7 + k * 3) % 11;
    let mut queues = BTreeMap::new();
    for (k, q) in QUEUES.iter().enumerate() {
        let k = k as u64;
        let slots = if q.slots > 0 && i.is_multiple_of(5) {
            q.slots - 1
        } else {
            q.slots
        };
        let processed = i * (q.acks + q.retries);
        let reasons = if q.paused {
            vec![serde_json::json!({"reason": "paused"})]
        } else if q.load > 1.0 {
            vec![
                serde_json::json!({"reason": "grow"}),
                serde_json::json!({"reason": "scarcity", "short": 3}),
            ]
        } else {
            vec![serde_json::json!({"reason": "hold"})]
        };
        let view = QueueView {
            priority: q.priority,
            min_slots: q.min,
            max_slots: q.max,
            stats: QueueStats {
                ready: if q.paused { 40 } else { q.acks * wave(k) / 4 },
                delayed: k * 2,
                leased: u64::from(slots) * 10,
                dead: q.dead,
                enqueued_total: 1_000 + i * (q.acks + q.retries + 5),
                acked_total: 900 + i * q.acks,
                retried_total: 10 + i * q.retries,
                dead_total: q.dead,
                frozen: if q.name == "emails" { 2 } else { 0 },
                // (a paused queue's tasks wait on: late by minutes)
                oldest_due_age_ms: match q.name {
                    "emails" => 4_200,
                    "reports" => 754_000,
                    _ => 0,
                },
                ..QueueStats::default()
            },
            slots,
            mapped: q.wanted,
            decision: Some(DecisionView {
                current: q.slots,
                demand: q.wanted + 1,
                wanted: q.wanted,
                placed: q.wanted,
                load: Some(q.load + wave(k) as f64 / 100.0),
                reasons,
            }),
            paused: q.paused,
            intake: q.intake,
            track: q.track,
            processed_total: processed,
            failed_total: i * q.retries,
            // 40 ms per task.
            busy_seconds_total: processed as f64 * 0.04,
            recycles_total: if q.name == "resize_photo" { 3 } else { 0 },
            crashes_total: 0,
            last_crash: (q.name == "emails").then(|| {
                let reason = "handler init failed: exec: the handler's zygote exited (exit code 1) before it was ready; its last lines:\nModuleNotFoundError: No module named 'PIL'";
                ("h1".to_string(), crate::cluster::LastCrash::new(reason, 0))
            }),
            refused: None,
            kind: QueueKind::Batch,
            long_running: Vec::new(),
        };
        queues.insert(q.name.to_string(), view);
    }
    let mut hosts = BTreeMap::new();
    let mut h1 = host_report(
        "h1",
        i,
        at_ms - 300,
        GIB + i * 8 * (1 << 20),
        &[("emails", 4), ("resize_photo", 2), ("webhooks", 2)],
    );
    let mut h2 = host_report(
        "h2",
        i,
        at_ms - 800,
        GIB * 17 / 10,
        &[("emails", 2), ("resize_photo", 2)],
    );
    h2.draining = true;
    let mut h3 = host_report("h3", i, T0 - 60_000, GIB / 2, &[("webhooks", 1)]);
    // Through Sentinel: the live hosts followed a failover two minutes before the first
    // read; h3 went silent on the old primary.
    let promoted = RedisNode {
        topology: Topology::Sentinel,
        node: "10.0.0.6:6379".into(),
        failovers: 1,
        last_failover: Some(rfc3339((T0 - 120_000) as i64)),
    };
    h1.redis = Some(promoted.clone());
    h2.redis = Some(promoted);
    h3.redis = Some(RedisNode {
        topology: Topology::Sentinel,
        node: "10.0.0.5:6379".into(),
        failovers: 0,
        last_failover: None,
    });
    for (name, state, drain_requested, report) in [
        ("h1", HostState::Alive, false, h1),
        ("h2", HostState::Draining, true, h2),
        ("h3", HostState::Dead, false, h3),
    ] {
        let view = HostView {
            state,
            drain_requested,
            report,
        };
        hosts.insert(name.to_string(), view);
    }
    let mut map = BTreeMap::new();
    map.insert(
        "h1".to_string(),
        BTreeMap::from([
            ("emails".to_string(), 9),
            ("resize_photo".to_string(), 4),
            ("webhooks".to_string(), 2),
        ]),
    );
    map.insert("h2".to_string(), BTreeMap::new());
    let manager = ManagerView {
        holder: manager_up.then(|| "mgr-a:4242".to_string()),
        epoch: manager_up.then_some(3),
        lease_ttl_ms: manager_up.then_some(4_200),
        map_epoch: Some(3),
        map_version: Some(17),
    };
    Snapshot {
        at_ms,
        queues,
        hosts,
        map: Some(SlotMap {
            epoch: 3,
            version: 17,
            hosts: map,
        }),
        manager,
        systems: Default::default(),
        drain_marked_unknown: Vec::new(),
        retired: BTreeMap::new(),
    }
}

fn feed(state: &mut State, snap: Snapshot) {
    update(
        state,
        Action::Snapshot {
            snapshot: Box::new(snap),
            config: "config.toml".into(),
        },
    );
}

/// A dashboard fed `READS` reads, the clock a second after the last one.
fn state(manager_up: bool) -> State {
    let mut s = State::new(Duration::from_secs(2));
    for i in 0..READS {
        feed(&mut s, snapshot(i, manager_up));
    }
    let now_ms = T0 + (READS - 1) * STEP_MS + 1_000;
    update(&mut s, Action::Tick { now_ms });
    s
}

fn draw(state: &State, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(width, height)).unwrap();
    t.draw(|f| f.render_widget(state, f.area())).unwrap();
    t
}

fn press(state: &mut State, actions: &[Action]) -> Vec<Option<Effect>> {
    actions.iter().map(|a| update(state, a.clone())).collect()
}

/// Where `text` starts on screen: (x, y) of its first cell.
fn find(buf: &Buffer, text: &str) -> Option<(u16, u16)> {
    for y in 0..buf.area.height {
        let cells: Vec<&str> = (0..buf.area.width).map(|x| buf[(x, y)].symbol()).collect();
        let Some(byte) = cells.concat().find(text) else {
            continue;
        };
        // Cells may hold multi-byte symbols: count cells up to the match.
        let mut bytes = 0;
        for (x, s) in cells.iter().enumerate() {
            if bytes == byte {
                return Some((x as u16, y));
            }
            bytes += s.len();
        }
    }
    None
}

#[test]
fn queues_view() {
    let s = state(true);
    let t = draw(&s, 160, 14);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn load_over_100_percent_is_red_and_under_is_not() {
    let s = state(true);
    let t = draw(&s, 160, 14);
    let buf = t.backend().buffer();
    let load_of = |name: &str| {
        s.queue_rows()
            .iter()
            .find(|r| r.name == name)
            .and_then(|r| r.load)
            .unwrap()
    };
    let over = load_of("emails");
    assert!(over > 1.0, "the fixture's emails queue must be over 100 %");
    let (x, y) = find(buf, &format!(" {:.0}%", over * 100.0)).expect("emails load on screen");
    assert_eq!(buf[(x + 1, y)].fg, Color::Red, "load {over} at ({x},{y})");
    let under = load_of("resize_photo");
    assert!(under < 1.0);
    let (x, y) = find(buf, &format!(" {:.0}%", under * 100.0)).expect("resize_photo load");
    assert_eq!(
        buf[(x + 1, y)].fg,
        Color::Reset,
        "load {under} at ({x},{y})"
    );
}

#[test]
fn slot_map_view_with_a_stale_manager() {
    let mut s = state(false);
    update(&mut s, Action::ShowSlotMap);
    let t = draw(&s, 160, 12);
    insta::assert_snapshot!(t.backend());
    let buf = t.backend().buffer();
    let (x, y) = find(buf, "STALE: no manager holds the lease").expect("stale lease shown");
    assert_eq!(buf[(x, y)].fg, Color::Red);
    let (x, y) = find(buf, "dead ").expect("h3 shown dead");
    assert_eq!(buf[(x, y)].fg, Color::Red);
    // h3 names another Redis node than the live hosts: it stands out.
    let (x, y) = find(buf, "10.0.0.5:6379").expect("h3's redis node");
    assert_eq!(buf[(x, y)].fg, Color::Yellow);
    let (x, y) = find(buf, "10.0.0.6:6379 ↻2m58s").expect("h1's redis node");
    assert_eq!(buf[(x, y)].fg, Color::Reset);
}

#[test]
fn queue_detail_view() {
    let mut s = state(true);
    press(&mut s, &[Action::Open]);
    assert_eq!(s.view, View::QueueDetail);
    let t = draw(&s, 160, 34);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn long_queue_detail_shows_its_running_tasks() {
    // emails (the queue the detail opens) as a long queue with three running tasks.
    let mut s = State::new(Duration::from_secs(2));
    for i in 0..READS {
        let mut snap = snapshot(i, true);
        let at_ms = snap.at_ms;
        let q = snap.queues.get_mut("emails").unwrap();
        q.kind = QueueKind::Long;
        q.stats.leased = 3;
        q.long_running = [
            ("btc-usd", "h1", 1, 3_725),
            ("eth-usd", "h2", 4, 61),
            ("feed-7", "h1", 2, 5),
        ]
        .into_iter()
        .map(|(id, host, slot, age_s)| LongRunning {
            id: id.into(),
            host: host.into(),
            slot: Some(slot),
            since_ms: at_ms - age_s * 1000,
        })
        .collect();
        feed(&mut s, snap);
    }
    let now_ms = T0 + (READS - 1) * STEP_MS + 1_000;
    update(&mut s, Action::Tick { now_ms });
    press(&mut s, &[Action::Open]);
    assert_eq!(s.view, View::QueueDetail);
    let t = draw(&s, 160, 40);
    let buf = t.backend().buffer();
    assert!(find(buf, "btc-usd").is_some(), "{}", t.backend());
    assert!(find(buf, "1h 2m 5s").is_some(), "{}", t.backend());
    insta::assert_snapshot!(t.backend());
}

#[test]
fn host_detail_view() {
    let mut s = state(true);
    press(&mut s, &[Action::ShowSlotMap, Action::Open]);
    assert_eq!(s.view, View::HostDetail);
    let t = draw(&s, 160, 24);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn help_view() {
    let mut s = state(true);
    update(&mut s, Action::Help);
    let t = draw(&s, 100, 23);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn confirmation_dialog() {
    let mut s = state(true);
    update(&mut s, Action::Pause);
    let t = draw(&s, 120, 14);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn unreachable_redis_keeps_the_last_read_and_says_so() {
    let mut s = state(true);
    let error = "redis: Connection refused (os error 111)".to_string();
    update(&mut s, Action::ReadFailed { error });
    let now_ms = T0 + (READS - 1) * STEP_MS + 35_000;
    update(&mut s, Action::Tick { now_ms });
    let t = draw(&s, 160, 14);
    insta::assert_snapshot!(t.backend());
    let buf = t.backend().buffer();
    assert!(
        find(buf, "emails").is_some(),
        "the last read stays on screen"
    );
    let (x, y) = find(buf, "redis: Connection refused").expect("error in the status line");
    assert_eq!(y, 13, "on the last line");
    assert_eq!(buf[(x, y)].fg, Color::Red);
    let (x, y) = find(buf, "read 22:14:18 UTC (35s ago)").expect("age of the last read");
    assert_eq!(buf[(x, y)].fg, Color::Yellow, "older than three refreshes");

    // The next good read clears it.
    feed(&mut s, snapshot(READS, true));
    assert_eq!(s.read_error, None);
}

#[test]
fn before_the_first_read() {
    let mut s = State::new(Duration::from_secs(2));
    let error = "cannot connect to redis at redis://127.0.0.1:1/: refused".to_string();
    update(&mut s, Action::ReadFailed { error });
    let t = draw(&s, 100, 6);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn sort_keys_cycle_and_reverse() {
    let mut s = state(true);
    let names =
        |s: &State| -> Vec<String> { s.queue_rows().iter().map(|r| r.name.to_string()).collect() };
    assert_eq!(s.sort, SortKey::Name);
    assert_eq!(names(&s), ["emails", "reports", "resize_photo", "webhooks"]);
    let mut seen = vec![s.sort];
    for _ in 0..SortKey::CYCLE.len() {
        update(&mut s, Action::Sort);
        seen.push(s.sort);
    }
    assert_eq!(&seen[..SortKey::CYCLE.len()], &SortKey::CYCLE[..]);
    assert_eq!(seen.last(), Some(&SortKey::Name), "a full cycle comes back");

    while s.sort != SortKey::Load {
        update(&mut s, Action::Sort);
    }
    assert_eq!(names(&s), ["emails", "webhooks", "resize_photo", "reports"]);
    update(&mut s, Action::ReverseSort);
    assert_eq!(names(&s), ["reports", "resize_photo", "webhooks", "emails"]);
    while s.sort != SortKey::Priority {
        update(&mut s, Action::Sort);
    }
    assert!(s.reverse, "the direction stays while the column changes");
    update(&mut s, Action::ReverseSort);
    assert_eq!(names(&s), ["emails", "resize_photo", "webhooks", "reports"]);
}

#[test]
fn the_selection_follows_its_queue_across_a_resort() {
    let mut s = state(true);
    press(&mut s, &[Action::Down, Action::Down]);
    assert_eq!(s.selected_queue().unwrap().0, "resize_photo");
    while s.sort != SortKey::Load {
        update(&mut s, Action::Sort);
    }
    assert_eq!(s.selected_queue().unwrap().0, "resize_photo");
    press(&mut s, &[Action::Down, Action::Down, Action::Down]);
    assert_eq!(s.selected_queue().unwrap().0, "reports", "stops at the end");
    press(&mut s, &[Action::Up]);
    assert_eq!(s.selected_queue().unwrap().0, "resize_photo");
    press(&mut s, &[Action::Open]);
    assert_eq!(s.view, View::QueueDetail);
    press(&mut s, &[Action::Back]);
    assert_eq!(s.view, View::Queues);
}

#[test]
fn no_effect_without_confirmation() {
    let mut s = state(true);
    // emails is selected and running: p asks to pause it, and nothing happens yet.
    assert_eq!(update(&mut s, Action::Pause), None);
    let pending = s.pending.clone().expect("a question");
    assert!(
        pending.question.contains("Pause queue emails"),
        "{pending:?}"
    );
    // Keys other than y / n / Esc leave the question open and do nothing.
    assert_eq!(
        press(&mut s, &[Action::Down, Action::Sort, Action::Requeue]),
        [None, None, None]
    );
    assert_eq!(s.pending, Some(pending));
    assert_eq!(s.sort, SortKey::Name);
    assert_eq!(s.selected_queue().unwrap().0, "emails");
    assert_eq!(
        update(&mut s, Action::Confirm),
        Some(Effect::Pause {
            queue: "emails".into(),
            paused: true
        })
    );
    assert_eq!(s.pending, None);
    assert_eq!(
        update(&mut s, Action::Confirm),
        None,
        "a second y has nothing to do"
    );
}

#[test]
fn escape_and_n_cancel() {
    let mut s = state(true);
    press(&mut s, &[Action::Open]);
    for cancel in [Action::Back, Action::Cancel] {
        update(&mut s, Action::Pause);
        assert!(s.pending.is_some());
        assert_eq!(update(&mut s, cancel), None);
        assert_eq!(s.pending, None);
        assert_eq!(
            update(&mut s, Action::Confirm),
            None,
            "nothing left to confirm"
        );
        assert_eq!(
            s.view,
            View::QueueDetail,
            "Esc closed the dialog, not the view"
        );
    }
}

#[test]
fn each_action_asks_for_its_own_effect() {
    let mut s = state(true);
    // reports is paused: p offers to resume it.
    press(&mut s, &[Action::Down]);
    let resume = Effect::Pause {
        queue: "reports".into(),
        paused: false,
    };
    assert_eq!(
        press(&mut s, &[Action::Pause, Action::Confirm]),
        [None, Some(resume)]
    );
    // reports has no dead letters: nothing to ask.
    assert_eq!(update(&mut s, Action::Requeue), None);
    assert_eq!(s.pending, None);
    assert!(s.note.as_ref().unwrap().text.contains("no dead letters"));
    press(&mut s, &[Action::Down]);
    let requeue = Effect::RequeueDead {
        queue: "resize_photo".into(),
    };
    assert_eq!(
        press(&mut s, &[Action::Requeue, Action::Confirm]),
        [None, Some(requeue)]
    );
    // d in the queues view drains nothing.
    assert_eq!(update(&mut s, Action::Drain), None);
    assert_eq!(s.pending, None);

    press(&mut s, &[Action::ShowSlotMap]);
    let drain = Effect::Drain {
        host: "h1".into(),
        draining: true,
    };
    assert_eq!(
        press(&mut s, &[Action::Drain, Action::Confirm]),
        [None, Some(drain)]
    );
    // h2 drains at an operator's request: d offers to undo it.
    press(&mut s, &[Action::Down]);
    let undrain = Effect::Drain {
        host: "h2".into(),
        draining: false,
    };
    assert_eq!(
        press(&mut s, &[Action::Drain, Action::Confirm]),
        [None, Some(undrain)]
    );
    assert_eq!(update(&mut s, Action::Quit), Some(Effect::Quit));
}

/// Read `i` with three systems: one active under a rate (started 48 per second), one
/// paused at run time, one disabled.
fn with_systems(i: u64) -> Snapshot {
    let mut snap = snapshot(i, true);
    let system = |state, switched, queues: &[&str], cap, rate, started| SystemView {
        state,
        switched,
        queues: queues.iter().map(|q| q.to_string()).collect(),
        max_concurrency: cap,
        rate_per_second: rate,
        slots: if state == SystemState::Active { 3 } else { 0 },
        started_total: started,
    };
    snap.systems = BTreeMap::from([
        (
            "geo_api".to_string(),
            system(
                SystemState::Active,
                false,
                &["geocode", "reverse"],
                Some(4),
                Some(50.0),
                10_000 + i * 96,
            ),
        ),
        (
            "mailer".to_string(),
            system(SystemState::Paused, true, &["emails"], None, None, 0),
        ),
        (
            "partner".to_string(),
            system(
                SystemState::Disabled,
                true,
                &["partner_sync"],
                Some(10),
                Some(5.0),
                1_234,
            ),
        ),
    ]);
    snap
}

#[test]
fn systems_view() {
    let mut s = State::new(Duration::from_secs(2));
    for i in 0..READS {
        feed(&mut s, with_systems(i));
    }
    update(
        &mut s,
        Action::Tick {
            now_ms: T0 + (READS - 1) * STEP_MS + 1_000,
        },
    );
    // Tab goes queues → slot map → systems → queues once the cluster has systems.
    press(&mut s, &[Action::NextView, Action::NextView]);
    assert_eq!(s.view, View::Systems);
    let rows = s.system_rows();
    let geo = rows.iter().find(|r| r.name == "geo_api").unwrap();
    assert!(
        (geo.started_per_s.unwrap() - 48.0).abs() < 1e-9,
        "{:?}",
        geo.started_per_s
    );
    assert_eq!(
        rows.iter()
            .find(|r| r.name == "mailer")
            .unwrap()
            .started_per_s,
        None
    );
    let t = draw(&s, 120, 10);
    insta::assert_snapshot!(t.backend());
    press(&mut s, &[Action::NextView]);
    assert_eq!(s.view, View::Queues);
    press(&mut s, &[Action::ShowSystems]);
    assert_eq!(s.view, View::Systems);
}

#[test]
fn views_switch_and_help_swallows_keys() {
    let mut s = state(true);
    press(&mut s, &[Action::NextView]);
    assert_eq!(s.view, View::SlotMap);
    press(&mut s, &[Action::NextView]);
    assert_eq!(s.view, View::Queues);
    press(&mut s, &[Action::ShowSlotMap, Action::Down, Action::Open]);
    assert_eq!(s.view, View::HostDetail);
    assert_eq!(s.selected_host().unwrap().0, "h2");
    press(&mut s, &[Action::Back]);
    assert_eq!(s.view, View::SlotMap);

    update(&mut s, Action::Help);
    assert_eq!(
        press(
            &mut s,
            &[Action::Drain, Action::Confirm, Action::ShowQueues]
        ),
        [None, None, None]
    );
    assert!(s.help);
    assert_eq!(s.pending, None);
    assert_eq!(s.view, View::SlotMap);
    update(&mut s, Action::Back);
    assert!(!s.help);
}

#[test]
fn rates_come_from_counter_deltas_over_the_window() {
    let s = state(true);
    let rows = s.queue_rows();
    let emails = rows.iter().find(|r| r.name == "emails").unwrap();
    // 240 acks and 2 retries per 2 s read, 40 ms per task.
    let done = emails.rates.done_per_s.unwrap();
    assert!((done - 120.0).abs() < 1e-9, "{done}");
    let errors = emails.rates.errors_per_s.unwrap();
    assert!((errors - 1.0).abs() < 1e-9, "{errors}");
    let task = emails.rates.mean_task_s.unwrap();
    assert!((task - 0.04).abs() < 1e-9, "{task}");
    // 6 slots, one fewer on every fifth of the 30 reads.
    assert!(
        (emails.slots_avg - 5.8).abs() < 1e-9,
        "{}",
        emails.slots_avg
    );
    let reports = rows.iter().find(|r| r.name == "reports").unwrap();
    assert_eq!(reports.rates.done_per_s, Some(0.0));
    assert_eq!(reports.rates.mean_task_s, None, "no task, no mean");
}

#[test]
fn a_counter_that_goes_back_gives_no_rate() {
    let mut s = State::new(Duration::from_secs(2));
    let mut a = snapshot(10, true);
    let mut b = snapshot(11, true);
    // A master restarted: its counters began again from zero.
    for q in a.queues.values_mut() {
        q.processed_total += 1_000_000;
    }
    b.queues.get_mut("emails").unwrap().stats.acked_total = 0;
    feed(&mut s, a);
    feed(&mut s, b);
    let rows = s.queue_rows();
    let emails = rows.iter().find(|r| r.name == "emails").unwrap();
    assert_eq!(emails.rates.done_per_s, None);
    assert_eq!(emails.rates.mean_task_s, None);
    assert!(emails.rates.errors_per_s.is_some());
}

#[test]
fn the_history_is_bounded() {
    let mut s = State::new(Duration::from_secs(1));
    for i in 0..(HISTORY as u64 + 30) {
        feed(&mut s, snapshot(i, true));
    }
    assert_eq!(s.history.len(), HISTORY);
    let oldest = s.history.iter().next().unwrap().at_ms;
    assert_eq!(oldest, T0 + 30 * STEP_MS);
}

#[test]
fn keys_map_to_actions() {
    use super::input::action_for;
    use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
    let key = |c: KeyCode| KeyEvent::new(c, KeyModifiers::NONE);
    assert_eq!(action_for(key(KeyCode::Char('q'))), Some(Action::Quit));
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    assert_eq!(action_for(ctrl_c), Some(Action::Quit));
    assert_eq!(
        action_for(key(KeyCode::Char('S'))),
        Some(Action::ReverseSort)
    );
    assert_eq!(action_for(key(KeyCode::Esc)), Some(Action::Back));
    assert_eq!(action_for(key(KeyCode::Down)), Some(Action::Down));
    assert_eq!(action_for(key(KeyCode::Char('x'))), None);
    let mut release = key(KeyCode::Char('y'));
    release.kind = KeyEventKind::Release;
    assert_eq!(action_for(release), None, "a release is not a second press");
}

#[test]
fn every_view_fits_any_terminal_size() {
    let mut views = Vec::new();
    for setup in [
        vec![],
        vec![Action::ShowSlotMap],
        vec![Action::Open],
        vec![Action::ShowSlotMap, Action::Open],
        vec![Action::Help],
        vec![Action::Pause],
    ] {
        let mut s = state(false);
        press(&mut s, &setup);
        views.push(s);
    }
    views.push(State::new(Duration::from_secs(1)));
    let mut systems = State::new(Duration::from_secs(1));
    feed(&mut systems, with_systems(0));
    press(&mut systems, &[Action::ShowSystems]);
    views.push(systems);
    for s in &views {
        for (w, h) in [(1, 1), (12, 3), (40, 8), (80, 4), (200, 60)] {
            let t = draw(s, w, h);
            let buf = t.backend().buffer();
            assert_eq!((buf.area.width, buf.area.height), (w, h));
            // Below the header, tabs and status lines the layout squeezes the header, and
            // a popup may cover it.
            if h < 4 || s.help || s.pending.is_some() {
                continue;
            }
            let first: String = (0..w.min(11)).map(|x| buf[(x, 0)].symbol()).collect();
            assert_eq!(
                first,
                " gaffer top"[..usize::from(w.min(11))],
                "{w}x{h} {:?}",
                s.view
            );
        }
    }
}

#[test]
fn closed_and_cancel_intakes_stand_out() {
    let s = state(true);
    let t = draw(&s, 160, 14);
    let buf = t.backend().buffer();
    let (x, y) = find(buf, "closed").expect("resize_photo's intake");
    assert_eq!(buf[(x, y)].fg, Color::Yellow);
    assert!(find(buf, "│resize_photo").is_some_and(|(_, row)| row == y));
    let (x, y) = find(buf, "cancel").expect("webhooks' intake");
    assert_eq!(buf[(x, y)].fg, Color::Red);
    assert!(find(buf, "│webhooks").is_some_and(|(_, row)| row == y));
    let (x, y) = find(buf, "open ").expect("an open intake");
    assert_eq!(buf[(x, y)].fg, Color::Reset, "open is the quiet normal");
}

/// A failed task: retried, held while its system was paused (four identical transitions
/// folded into one entry), then failed for good with a long error.
fn failed_record() -> TaskRecord {
    let at = |s: u64| rfc3339((T0 + s * 1000) as i64);
    let entry = |state, s, attempt, place: Option<(&str, u32)>, note: Option<&str>| HistoryEntry {
        state,
        at: at(s),
        attempt,
        host: place.map(|(h, _)| h.to_string()),
        slot: place.map(|(_, n)| n),
        note: note.map(str::to_string),
        count: None,
    };
    let error = "partner api answered 502 Bad Gateway after 30s: upstream connect error or \
                 disconnect/reset before headers, reset reason: connection termination; \
                 the request was POST /v2/invoices/8812/sync with 14 line items, retried by \
                 policy with exponential backoff from 10s, and every attempt met the same \
                 answer from the load balancer in front of the partner's invoice service";
    let mut held = entry(
        RecordState::Waiting,
        40,
        1,
        None,
        Some("system partner_api is paused"),
    );
    held.count = Some(4);
    TaskRecord {
        id: "invoice-8812".into(),
        queue: "webhooks".into(),
        state: RecordState::Failed,
        priority: 2,
        attempt: 3,
        max_attempts: 3,
        created_at: at(0),
        due_at: at(200),
        updated_at: at(260),
        submitted_by: Some("shop".into()),
        error: Some(error.into()),
        result: None,
        chain: None,
        history: Some(vec![
            entry(RecordState::Waiting, 0, 0, None, None),
            entry(RecordState::Running, 1, 1, Some(("h1", 3)), None),
            entry(
                RecordState::Waiting,
                31,
                1,
                Some(("h1", 3)),
                Some("partner api answered 502 Bad Gateway after 30s"),
            ),
            held,
            entry(RecordState::Running, 100, 2, Some(("h2", 1)), None),
            entry(
                RecordState::Waiting,
                130,
                2,
                Some(("h2", 1)),
                Some("partner api answered 502 Bad Gateway after 30s"),
            ),
            entry(RecordState::Running, 230, 3, Some(("h1", 12)), None),
            entry(RecordState::Failed, 260, 3, Some(("h1", 12)), Some(error)),
        ]),
    }
}

/// Opens the lookup line, types `id` into it and presses Enter: the effect Enter asked.
fn look_up(s: &mut State, id: &str) -> Option<Effect> {
    update(s, Action::Find);
    for c in id.chars() {
        update(s, Action::Type(c));
    }
    update(s, Action::Open)
}

fn answer(s: &mut State, queue: &str, id: &str, result: Result<Option<TaskRecord>, &str>) {
    update(
        s,
        Action::LookedUp {
            queue: queue.into(),
            id: id.into(),
            result: result.map(|r| r.map(Box::new)).map_err(str::to_string),
            chain: None,
        },
    );
}

#[test]
fn lookup_input_line() {
    let mut s = state(true);
    // The line starts in the selected queue; ↓ (or Tab) takes the next one of the table.
    press(&mut s, &[Action::Down, Action::Find]);
    assert_eq!(s.finder.as_ref().unwrap().queue, "reports");
    for c in "invoice-88".chars() {
        update(&mut s, Action::Type(c));
    }
    press(&mut s, &[Action::Down, Action::Down]);
    let t = draw(&s, 160, 14);
    insta::assert_snapshot!(t.backend());
    assert_eq!(
        s.finder,
        Some(Finder {
            queue: "webhooks".into(),
            id: "invoice-88".into()
        })
    );
    // Narrow: the id's tail stays in sight.
    let t = draw(&s, 40, 8);
    assert!(find(t.backend().buffer(), "…ice-88").is_some());
}

#[test]
fn a_failed_record_with_a_folded_entry_and_a_long_error() {
    let mut s = state(true);
    press(&mut s, &[Action::Down, Action::Down, Action::Down]);
    assert_eq!(
        look_up(&mut s, "invoice-8812"),
        Some(Effect::Lookup {
            queue: "webhooks".into(),
            id: "invoice-8812".into()
        })
    );
    answer(
        &mut s,
        "webhooks",
        "invoice-8812",
        Ok(Some(failed_record())),
    );
    let t = draw(&s, 160, 30);
    insta::assert_snapshot!(t.backend());
    let buf = t.backend().buffer();
    let (x, y) = find(buf, "failed   attempt 3/3").expect("the state");
    assert_eq!(buf[(x, y)].fg, Color::Red);
    let (x, y) = find(buf, "×4").expect("the folded entry's count");
    assert!(
        find(buf, "system partner_api is paused").is_some_and(|(_, row)| row == y),
        "on the folded entry's row"
    );
    assert_eq!(buf[(x, y)].fg, Color::Reset);
    let (x, y) = find(buf, "running").expect("a running entry");
    assert_eq!(buf[(x, y)].fg, Color::Yellow);
}

#[test]
fn a_task_of_a_chain_shows_its_chain_with_each_task_state() {
    use crate::chain::{ChainState, ChainTask, ChainView, Member};
    let mut s = state(true);
    press(&mut s, &[Action::Down, Action::Down, Action::Down]);
    look_up(&mut s, "invoice-8812");
    let mut record = failed_record();
    record.chain = Some("import-7".into());
    let task = |id: &str, parent: Option<&str>, state: Option<RecordState>| ChainTask {
        member: Member::new("webhooks", id),
        parent: parent.map(|p| Member::new("webhooks", p)),
        record: state.map(|state| TaskRecord {
            id: id.into(),
            state,
            history: None,
            ..record.clone()
        }),
    };
    let mut tasks = vec![
        task("import-7", None, Some(RecordState::Done)),
        task("import-7~1", Some("import-7"), Some(RecordState::Done)),
        task("import-7~2", Some("import-7"), Some(RecordState::Running)),
        task("import-7~3", Some("import-7"), None),
    ];
    tasks.extend((4..=9).map(|n| {
        task(
            &format!("import-7~{n}"),
            Some("import-7"),
            Some(RecordState::Waiting),
        )
    }));
    let chain = ChainView {
        id: "import-7".into(),
        state: ChainState::Running,
        failed: None,
        tasks,
    };
    update(
        &mut s,
        Action::LookedUp {
            queue: "webhooks".into(),
            id: "invoice-8812".into(),
            result: Ok(Some(Box::new(record))),
            chain: Some(Box::new(chain)),
        },
    );
    let t = draw(&s, 120, 36);
    insta::assert_snapshot!(t.backend());
    let buf = t.backend().buffer();
    assert!(find(buf, "import-7  running   2 of 10 tasks done").is_some());
    let (x, y) = find(buf, "import-7~2  running").expect("a running task of the chain");
    assert_eq!(buf[(x + 12, y)].fg, Color::Yellow);
    assert!(find(buf, "(expired)").is_some());
    assert!(find(buf, "… 2 more: gaffer tasks chain import-7").is_some());
}

#[test]
fn the_history_scrolls_and_a_small_screen_says_which_entries_it_shows() {
    let mut s = state(true);
    look_up(&mut s, "invoice-8812");
    answer(&mut s, "emails", "invoice-8812", Ok(Some(failed_record())));
    // Three lines of header, tabs and status, ten of the record's fields in their frame:
    // a screen of 18 lines leaves two history entries below the history's frame and header.
    let t = draw(&s, 160, 28);
    assert!(find(t.backend().buffer(), "history · 8 entries, oldest first").is_some());
    let t = draw(&s, 160, 18);
    let buf = t.backend().buffer();
    assert!(find(buf, "entries 1-2 of 8, oldest first · j/k scroll").is_some());
    press(&mut s, &[Action::Down, Action::Down, Action::Down]);
    assert_eq!(s.task.as_ref().unwrap().scroll, 3);
    let t = draw(&s, 160, 18);
    assert!(find(t.backend().buffer(), "entries 4-5 of 8").is_some());
    for _ in 0..20 {
        update(&mut s, Action::Down);
    }
    assert_eq!(
        s.task.as_ref().unwrap().scroll,
        7,
        "stops at the last entry"
    );
    for _ in 0..20 {
        update(&mut s, Action::Up);
    }
    assert_eq!(s.task.as_ref().unwrap().scroll, 0);
}

#[test]
fn a_done_record_is_green_and_its_result_is_compact_json_cut_to_the_width() {
    let mut s = state(true);
    look_up(&mut s, "thumb-1");
    let mut r = failed_record();
    r.id = "thumb-1".into();
    r.queue = "emails".into();
    r.state = RecordState::Done;
    r.error = None;
    r.max_attempts = 0;
    let items: Vec<serde_json::Value> = (0..40)
        .map(|i| serde_json::json!({"sku": format!("A-{i}"), "ok": true}))
        .collect();
    r.result = Some(serde_json::json!({ "items": items }));
    answer(&mut s, "emails", "thumb-1", Ok(Some(r)));
    let t = draw(&s, 100, 30);
    let buf = t.backend().buffer();
    let (x, y) = find(buf, "done   attempt 3/∞").expect("the state");
    assert_eq!(buf[(x, y)].fg, Color::Green);
    let (x, y) = find(buf, r#"result     {"items":[{"ok":true,"sku":"A-0"},"#).expect("result");
    let row: String = (x..99).map(|x| buf[(x, y)].symbol()).collect();
    assert!(row.ends_with("…"), "{row}");
}

#[test]
fn no_record() {
    let mut s = state(true);
    look_up(&mut s, "nope-1");
    assert_eq!(s.task.as_ref().unwrap().found, Found::Waiting);
    let t = draw(&s, 100, 8);
    assert!(find(t.backend().buffer(), "looking up nope-1 in emails…").is_some());
    answer(&mut s, "emails", "nope-1", Ok(None));
    let t = draw(&s, 100, 10);
    insta::assert_snapshot!(t.backend());

    // An untracked queue keeps no records, and says so.
    update(&mut s, Action::Back);
    press(&mut s, &[Action::Down]);
    look_up(&mut s, "r-1");
    answer(&mut s, "reports", "r-1", Ok(None));
    let t = draw(&s, 120, 10);
    assert!(find(t.backend().buffer(), "no record of task r-1 in reports").is_some());
    assert!(
        find(
            t.backend().buffer(),
            "does not track its tasks (track = false)"
        )
        .is_some()
    );
}

#[test]
fn a_failed_lookup_shows_like_other_errors_and_keeps_what_was_shown() {
    let mut s = state(true);
    look_up(&mut s, "x1");
    answer(
        &mut s,
        "emails",
        "x1",
        Err("redis: Connection refused (os error 111)"),
    );
    assert!(matches!(&s.task.as_ref().unwrap().found, Found::Failed(e) if e.contains("refused")));
    let t = draw(&s, 120, 10);
    let buf = t.backend().buffer();
    let (x, y) = find(
        buf,
        "looking up task x1 in emails: redis: Connection refused",
    )
    .expect("the error in the status line");
    assert_eq!((y, buf[(x, y)].fg), (9, Color::Red));

    // A record on screen stays there when looking again fails.
    let mut r = failed_record();
    r.id = "x1".into();
    answer(&mut s, "emails", "x1", Ok(Some(r)));
    assert_eq!(
        update(&mut s, Action::Open),
        Some(Effect::Lookup {
            queue: "emails".into(),
            id: "x1".into()
        }),
        "Enter in the task view reads the record again"
    );
    answer(&mut s, "emails", "x1", Err("redis: no answer within 10s"));
    assert!(matches!(s.task.as_ref().unwrap().found, Found::Record(_)));
    assert!(s.note.as_ref().is_some_and(|n| n.error));
}

#[test]
fn the_lookup_steps_are_pure() {
    use super::input::{action_for, typing_action_for};
    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
    let key = |c: KeyCode| KeyEvent::new(c, KeyModifiers::NONE);
    assert_eq!(action_for(key(KeyCode::Char('/'))), Some(Action::Find));
    // In the line, letters are text: q types a q, it does not quit.
    assert_eq!(
        typing_action_for(key(KeyCode::Char('q'))),
        Some(Action::Type('q'))
    );
    assert_eq!(
        typing_action_for(key(KeyCode::Backspace)),
        Some(Action::Erase)
    );
    assert_eq!(typing_action_for(key(KeyCode::Tab)), Some(Action::Down));
    assert_eq!(typing_action_for(key(KeyCode::BackTab)), Some(Action::Up));
    assert_eq!(typing_action_for(key(KeyCode::Enter)), Some(Action::Open));
    assert_eq!(typing_action_for(key(KeyCode::Esc)), Some(Action::Back));
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    assert_eq!(typing_action_for(ctrl_c), Some(Action::Quit));

    let mut s = state(true);
    press(&mut s, &[Action::ShowSlotMap]);
    assert_eq!(update(&mut s, Action::Find), None);
    assert!(s.typing());
    // Keys that act elsewhere do nothing here but what the line makes of them.
    assert_eq!(
        press(
            &mut s,
            &[
                Action::Type('q'),
                Action::Type('1'),
                Action::Type('x'),
                Action::Erase,
                Action::Pause,
                Action::Help,
                Action::Up,
            ]
        ),
        [None, None, None, None, None, None, None]
    );
    assert_eq!(
        s.finder,
        Some(Finder {
            queue: "webhooks".into(),
            id: "q1".into()
        }),
        "↑ from the first queue wraps round to the last"
    );
    assert!(!s.help && s.pending.is_none());
    assert_eq!(s.view, View::SlotMap);

    // Esc closes the line and asks nothing.
    assert_eq!(update(&mut s, Action::Back), None);
    assert!(!s.typing());
    assert_eq!(s.view, View::SlotMap);

    // Enter with no id asks for one.
    update(&mut s, Action::Find);
    assert_eq!(update(&mut s, Action::Open), None);
    assert!(s.typing());
    assert!(s.note.as_ref().unwrap().text.contains("type a task id"));
    update(&mut s, Action::Back);

    // Enter looks up, and the task view waits; Esc goes back where the lookup began.
    let effect = look_up(&mut s, "q1");
    let lookup = Effect::Lookup {
        queue: "emails".into(),
        id: "q1".into(),
    };
    assert_eq!(effect, Some(lookup.clone()));
    assert_eq!(s.view, View::Task);
    assert!(!s.typing());
    // The loop answers an effect it could not run with the lookup's own failure.
    assert_eq!(
        lookup.failed("busy".into()),
        Action::LookedUp {
            queue: "emails".into(),
            id: "q1".into(),
            result: Err("busy".into()),
            chain: None,
        }
    );
    // An answer for another task (an earlier lookup) is dropped.
    answer(&mut s, "emails", "other", Ok(Some(failed_record())));
    assert_eq!(s.task.as_ref().unwrap().found, Found::Waiting);
    answer(&mut s, "emails", "q1", Ok(None));
    assert_eq!(s.task.as_ref().unwrap().found, Found::Nothing);
    // Tab leaves for the other list view; Esc from the task view goes back.
    update(&mut s, Action::Back);
    assert_eq!(s.view, View::SlotMap);
    look_up(&mut s, "q1");
    update(&mut s, Action::NextView);
    assert_eq!(s.view, View::Queues);
    // An answer after the operator left changes nothing.
    answer(&mut s, "emails", "q1", Ok(Some(failed_record())));
    assert_eq!(s.task.as_ref().unwrap().found, Found::Waiting);

    // A lookup from the task view starts in its queue and comes back to the same place.
    press(&mut s, &[Action::Down]);
    look_up(&mut s, "a");
    assert_eq!(s.task.as_ref().unwrap().queue, "reports");
    assert_eq!(update(&mut s, Action::Find), None);
    assert_eq!(s.finder.as_ref().unwrap().queue, "reports");
    update(&mut s, Action::Type('b'));
    update(&mut s, Action::Open);
    update(&mut s, Action::Back);
    assert_eq!(s.view, View::Queues);
}

#[test]
fn lookup_views_fit_any_terminal_size() {
    let mut typing = state(false);
    update(&mut typing, Action::Find);
    for c in "a-very-long-task-id-that-does-not-fit".chars() {
        update(&mut typing, Action::Type(c));
    }
    let mut record = state(false);
    look_up(&mut record, "invoice-8812");
    answer(
        &mut record,
        "emails",
        "invoice-8812",
        Ok(Some(failed_record())),
    );
    let mut nothing = state(false);
    look_up(&mut nothing, "z");
    answer(&mut nothing, "emails", "z", Ok(None));
    for s in [&typing, &record, &nothing] {
        for (w, h) in [(1, 1), (12, 3), (40, 8), (80, 4), (200, 60)] {
            let t = draw(s, w, h);
            let buf = t.backend().buffer();
            assert_eq!((buf.area.width, buf.area.height), (w, h));
        }
    }
}

#[test]
fn i_cycles_a_queues_intake_after_a_confirmation() {
    let mut s = state(true);
    // emails is selected and open: i asks to close it, y does.
    assert_eq!(update(&mut s, Action::Intake), None);
    let pending = s.pending.clone().expect("a question");
    assert_eq!(
        pending.question,
        "Switch the intake of emails to closed? new tasks are refused."
    );
    assert_eq!(
        update(&mut s, Action::Confirm),
        Some(Effect::SetIntake {
            queue: "emails".into(),
            intake: Intake::Closed
        })
    );
    // Not from the slot map.
    press(&mut s, &[Action::ShowSlotMap]);
    assert_eq!(update(&mut s, Action::Intake), None);
    assert!(s.pending.is_none());
}

/// What Redis holds reaches the dashboard escaped, never raw: records written before ids
/// were checked (or a handler's error) may hold an OSC title, a screen clear, a C1 CSI or
/// a bidi override; each shows as its escape (`crate::printable`), where ratatui alone
/// would drop the control byte and print the rest as a command's remains.
#[test]
fn control_characters_from_redis_are_shown_escaped() {
    use crate::chain::{ChainState, ChainTask, ChainView, Member};
    let mut s = state(true);
    press(&mut s, &[Action::Down, Action::Down, Action::Down]);
    look_up(&mut s, "invoice-8812");
    let evil_id = "inv\u{1b}]0;pwned\u{7}\u{1b}[2J";
    let mut record = failed_record();
    record.submitted_by = Some("shop\u{9b}31m".into());
    record.error = Some("boom\u{1b}[2J then \u{202e}gnp.exe".into());
    record.chain = Some(evil_id.into());
    let history = record.history.as_mut().unwrap();
    let last = history.last_mut().unwrap();
    last.host = Some("h1\u{1b}[31m".into());
    last.note = Some("died\u{7}\u{7f}".into());
    let chain = ChainView {
        id: evil_id.into(),
        state: ChainState::Failed,
        failed: None,
        tasks: vec![ChainTask {
            member: Member::new("webhooks", evil_id),
            parent: None,
            record: None,
        }],
    };
    update(
        &mut s,
        Action::LookedUp {
            queue: "webhooks".into(),
            id: "invoice-8812".into(),
            result: Ok(Some(Box::new(record))),
            chain: Some(Box::new(chain)),
        },
    );
    let t = draw(&s, 160, 34);
    insta::assert_snapshot!(t.backend());
    let buf = t.backend().buffer();
    for shown in [
        "shop\\u{009b}31m",
        "boom\\x1b[2J then \\u{202e}gnp.exe",
        "chain inv\\x1b]0;pwned\\x07\\x1b[2J",
        "webhooks inv\\x1b]0;pwned\\x07\\x1b[2J",
        "h1\\x1b[31m/12",
        "died\\x07\\x7f",
    ] {
        assert!(find(buf, shown).is_some(), "{shown} in\n{}", t.backend());
    }

    // A long task's id and host, in the queue's detail.
    let mut s = State::new(Duration::from_secs(2));
    for i in 0..READS {
        let mut snap = snapshot(i, true);
        let at_ms = snap.at_ms;
        let q = snap.queues.get_mut("emails").unwrap();
        q.kind = QueueKind::Long;
        q.stats.leased = 1;
        q.long_running = vec![LongRunning {
            id: evil_id.into(),
            host: "h\u{1b}[8m2".into(),
            slot: Some(1),
            since_ms: at_ms - 5_000,
        }];
        feed(&mut s, snap);
    }
    update(
        &mut s,
        Action::Tick {
            now_ms: T0 + (READS - 1) * STEP_MS + 1_000,
        },
    );
    press(&mut s, &[Action::Open]);
    let t = draw(&s, 160, 40);
    let buf = t.backend().buffer();
    assert!(
        find(buf, "inv\\x1b]0;pwned\\x07\\x1b[2J").is_some(),
        "{}",
        t.backend()
    );
    assert!(find(buf, "h\\x1b[8m2/1").is_some(), "{}", t.backend());
}
