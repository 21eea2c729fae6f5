//! `gaffer simulate` on the shipped traces: gaffer's balancer against the rules it must
//! beat, and determinism.

use std::path::Path;

use gaffer::simulate::{self, Policy, Report};

fn run(trace: &str, policy: Policy) -> Report {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces");
    let config = gaffer::config::load(&dir.join("cluster.toml")).unwrap();
    let path = dir.join(format!("{trace}.toml"));
    let text = std::fs::read_to_string(&path).unwrap();
    let trace = simulate::trace::parse(&text, &path.display().to_string()).unwrap();
    simulate::run(&config, &trace, policy).unwrap()
}

fn changes(r: &Report) -> u64 {
    r.queues.values().map(|q| q.slot_changes).sum()
}

/// The shipped traces, `surge` the flash crowd of issue 16.
const TRACES: [&str; 5] = ["steady", "diurnal", "burst", "host_loss", "surge"];

/// The acceptance bar of the balancer: on every shipped trace the highest-priority
/// queue waits at most half as long at p99 as under HPA (or both under 100 ms), with at
/// most a third of its slot changes, and it is fully served (only what slots hold when
/// the trace ends is left).
#[test]
fn gaffer_beats_hpa_on_every_shipped_trace() {
    for trace in TRACES {
        let g = run(trace, Policy::Gaffer);
        let h = run(trace, Policy::Hpa);
        let (ge, he) = (&g.queues["events"], &h.queues["events"]);
        assert!(
            ge.wait_p99_ms * 2 <= he.wait_p99_ms || ge.wait_p99_ms.max(he.wait_p99_ms) < 100,
            "{trace}: events p99 {} ms under gaffer, {} ms under hpa",
            ge.wait_p99_ms,
            he.wait_p99_ms
        );
        assert!(
            changes(&g) * 3 <= changes(&h),
            "{trace}: {} slot changes under gaffer, {} under hpa",
            changes(&g),
            changes(&h)
        );
        assert_eq!(
            ge.done + ge.left_at_end,
            ge.arrived,
            "{trace}: every task counted"
        );
        assert!(
            ge.left_at_end * 1000 <= ge.arrived,
            "{trace}: events fully served, {} of {} left at the end",
            ge.left_at_end,
            ge.arrived
        );
    }
}

/// The flash crowd: a fifteenfold surge on `events` while `reports`, whose batches run
/// 100 s, fills the cluster. Capacity exists (the lowest priority gives it), so gaffer
/// starts the surge's tasks within a second at p99; before, it took 7.35 s.
#[test]
fn a_surge_is_served_within_a_second() {
    let g = run("surge", Policy::Gaffer);
    let e = &g.queues["events"];
    assert!(e.wait_p99_ms < 1_000, "events p99 {} ms", e.wait_p99_ms);
    // The cluster stays full: the low priority keeps what the surge leaves.
    assert!(
        g.mean_utilisation > 0.9,
        "utilisation {}",
        g.mean_utilisation
    );
}

/// Batches are taken whole and a stopped slot finishes the task in hand and gives the rest
/// of its batch back, under every policy: no task is lost or counted twice, whatever the
/// rule moves.
#[test]
fn every_policy_accounts_for_every_task() {
    for trace in TRACES {
        for policy in [Policy::Gaffer, Policy::Hpa, Policy::Static] {
            let r = run(trace, policy);
            for (q, f) in &r.queues {
                assert_eq!(f.done + f.left_at_end, f.arrived, "{trace} {policy:?} {q}");
            }
        }
    }
}

#[test]
fn same_trace_same_report() {
    assert_eq!(
        run("host_loss", Policy::Gaffer),
        run("host_loss", Policy::Gaffer)
    );
}

#[test]
fn static_keeps_minimums() {
    let r = run("steady", Policy::Static);
    assert_eq!(r.queues["events"].mean_slots, 4.0);
    assert_eq!(r.queues["reports"].mean_slots, 0.0);
    assert_eq!(r.queues["reports"].done, 0);
}

#[test]
fn a_trace_naming_an_unknown_queue_is_refused() {
    let config =
        gaffer::config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/cluster.toml"))
            .unwrap();
    let trace = simulate::trace::parse(
        "duration = \"1m\"\n[hosts]\ncount = 1\nmemory = \"1GiB\"\nslot_memory = \"100MiB\"\n\
         [[load]]\nqueue = \"nope\"\nfrom = \"0s\"\nto = \"1m\"\nrate = 1.0\ntask_time = \"1s\"\n",
        "t.toml",
    )
    .unwrap();
    let err = simulate::run(&config, &trace, Policy::Gaffer)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`nope`"), "{err}");
    let err = simulate::trace::parse("duration = \"1m\"\n", "t.toml")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("t.toml: "), "{err}");
}

/// A small flash crowd: `reports` (batches of 50 tasks of 2 s) fills one host of 20 slots
/// when `events` jumps twentyfold for 3 min, so gaffer stops `reports` slots mid-batch.
const SMALL_SURGE: &str = "duration = \"10m\"\nseed = 3\n\
    [hosts]\ncount = 1\nmemory = \"4GiB\"\nslot_memory = \"200MiB\"\n\
    [[load]]\nqueue = \"reports\"\nfrom = \"0s\"\nto = \"10m\"\nrate = 20.0\ntask_time = \"2s\"\n\
    [[load]]\nqueue = \"events\"\nfrom = \"0s\"\nto = \"10m\"\nrate = 10.0\ntask_time = \"50ms\"\n\
    [[load]]\nqueue = \"events\"\nfrom = \"3m\"\nto = \"6m\"\nrate = 200.0\ntask_time = \"50ms\"\n";

/// `gaffer simulate` run as the binary on `trace` (written to `dir`), its exit status,
/// stdout and stderr.
fn simulate_binary(dir: &Path, trace: &str) -> (Option<i32>, String, String) {
    let path = dir.join("t.toml");
    std::fs::write(&path, trace).unwrap();
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/cluster.toml");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--config")
        .arg(&config)
        .arg("simulate")
        .arg(&path)
        .arg("--json")
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code(), text(&o.stdout), text(&o.stderr))
}

/// Tasks `reports` handled, from the binary's JSON report on `trace`.
fn reports_done(dir: &Path, trace: &str) -> u64 {
    let (code, out, err) = simulate_binary(dir, trace);
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    report["queues"]["reports"]["done"].as_u64().unwrap()
}

/// A queue listed in `whole_batch` has a handler that ignores the stop: its stopped slots
/// finish their whole batch beside their replacements, so it handles more in the same
/// time than when they give the rest of their batch back after the task in hand.
#[test]
fn whole_batch_queues_finish_their_batches_when_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let task = reports_done(dir.path(), SMALL_SURGE);
    let batch = reports_done(
        dir.path(),
        &format!("whole_batch = [\"reports\"]\n{SMALL_SURGE}"),
    );
    assert!(
        batch > task,
        "reports done: {batch} finishing whole batches, {task} stopping after the task"
    );
}

/// A `whole_batch` name the config lacks is a usage error (exit 2) located in the trace.
#[test]
fn a_whole_batch_queue_not_in_the_config_exits_2_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let trace = format!("whole_batch = [\"reports\", \"nope\"]\n{SMALL_SURGE}");
    let (code, _, err) = simulate_binary(dir.path(), &trace);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("t.toml:1:27: whole_batch[1]: queue `nope` is not in the config"),
        "{err}"
    );
}
