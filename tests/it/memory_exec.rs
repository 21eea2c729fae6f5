//! Exec handlers' memory on a real host: a slot's processes are its own and every
//! descendant's (the exec child, what it started), the host's are the master's whole
//! tree; both are reported, sized by and held against `private_dirty_limit`.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gaffer::config::{Handler as HandlerConfig, QueueConfig};
use gaffer::queue_client::NewTask;
use gaffer::slot::{Handler, HandlerError, Outcome, SlotContext, SlotEvent, Task, run_slot};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::harness::{TestRedis, eventually, poll_some};
use crate::host::{TestMaster, process_tree, slots};

const MIB: u64 = 1 << 20;

/// Reads one batch line after another and answers every task ok; `EXTRA` runs first.
const SERVE: &str = r#"
import json, os, sys, time
EXTRA
for line in sys.stdin:
    msg = json.loads(line)
    if "batch" not in msg:
        continue
    results = []
    for t in msg["batch"]:
        TASK
        results.append({"id": t["id"], "status": "ok"})
    sys.stdout.write(json.dumps({"results": results}) + "\n")
    sys.stdout.flush()
"#;

/// An exec queue `name` running `script` (written into `dir`) with `args`, plus `extra`
/// keys.
fn exec_queue(dir: &Path, name: &str, script: &str, args: &[&str], extra: &str) -> String {
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, script).unwrap();
    let mut command = vec![
        format!("{:?}", "python3"),
        format!("{:?}", path.display().to_string()),
    ];
    command.extend(args.iter().map(|a| format!("{a:?}")));
    format!(
        "[queues.{name}]\nhandler = \"exec\"\ncommand = [{}]\n{extra}",
        command.join(", ")
    )
}

/// PSS of a process from its smaps_rollup (0 once gone).
fn pss(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn u64_at(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_u64()
        .unwrap_or_else(|| panic!("no number at {path:?} in {v}"))
}

#[tokio::test]
async fn the_hosts_pss_counts_exec_children() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    std::fs::create_dir(&ready).unwrap();
    // Each child writes 64 MiB of its own at start, then says so with a file.
    let script = SERVE
        .replace(
            "EXTRA",
            "ballast = bytearray(b'\\x01') * (64 << 20)\n\
             open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()",
        )
        .replace("TASK", "pass");
    let queue = exec_queue(
        dir.path(),
        "big",
        &script,
        &[&ready.display().to_string()],
        "",
    );
    let m = TestMaster::start(&queue, &[("big", 3)]).await;
    eventually(
        Duration::from_secs(30),
        "three children holding 64 MiB",
        || async { std::fs::read_dir(&ready).unwrap().count() == 3 },
    )
    .await;
    // The report of a tick after the children allocated, against /proc read meanwhile.
    let (status, measured, slots_alone) = poll_some(
        Duration::from_secs(20),
        "a reported PSS within 10 % of the master's tree",
        || async {
            let status = m.status()?;
            let measured: u64 = process_tree(m.pid()).into_iter().map(pss).sum();
            let reported = status["host"]["pss_bytes"].as_u64()?;
            let mut alone = vec![m.pid()];
            alone.extend(
                status["zygote_pids"]
                    .as_array()?
                    .iter()
                    .filter_map(|p| p.as_u64().map(|p| p as u32)),
            );
            alone.extend(
                slots(&status)
                    .iter()
                    .filter_map(|s| s["pid"].as_u64().map(|p| p as u32)),
            );
            let alone: u64 = alone.into_iter().map(pss).sum();
            (reported.abs_diff(measured) * 10 <= measured).then_some((status, measured, alone))
        },
    )
    .await;
    let reported = u64_at(&status, &["host", "pss_bytes"]);
    assert!(
        measured > 3 * 64 * MIB && reported > slots_alone + 3 * 60 * MIB,
        "reported {} MiB, /proc {} MiB, master + zygote + slots alone {} MiB",
        reported >> 20,
        measured >> 20,
        slots_alone >> 20
    );
    // Each slot's figure holds its child's 64 MiB; together they are within the host's.
    let per_slot: Vec<u64> = slots(&status)
        .iter()
        .map(|s| s["pss_bytes"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(per_slot.len(), 3, "{status}");
    assert!(per_slot.iter().all(|&p| p >= 60 * MIB), "{per_slot:?}");
    assert!(
        per_slot.iter().sum::<u64>() <= reported,
        "{per_slot:?} {reported}"
    );
    assert!(
        u64_at(&status, &["host", "queues", "big", "pss_bytes"]) >= 3 * 60 * MIB,
        "{status}"
    );
    // The same figures reach `gaffer stats --json` and the capacity's average slot.
    let v = poll_some(
        Duration::from_secs(10),
        "the report in stats --json",
        || async {
            let v = m.stats_json();
            (v["hosts"]["h1"]["pss_bytes"].as_u64()? > 3 * 64 * MIB).then_some(v)
        },
    )
    .await;
    assert_eq!(v["hosts"]["h1"]["queues"]["big"], 3, "{v}");
    assert!(
        u64_at(&v, &["hosts", "h1", "queue_pss_bytes", "big"]) >= 3 * 60 * MIB,
        "{v}"
    );
    assert!(
        u64_at(&status, &["capacity", "avg_slot"]) >= 64 * MIB,
        "{status}"
    );
    let metrics = crate::host::http_get(m.http, "/metrics").unwrap();
    let gauge = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gaffer_master_pss_bytes "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(gauge > (3 * 64 * MIB) as f64, "{gauge}");
    let queue_gauge = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gaffer_queue_pss_bytes{queue=\"big\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(queue_gauge > (3 * 60 * MIB) as f64, "{queue_gauge}");
}

#[tokio::test]
async fn a_leaking_exec_child_recycles_its_slot_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("record");
    // 20 MiB written and kept per task; each task's start and end with the child's pid.
    let script = SERVE
        .replace("EXTRA", "hog = []\nrecord = sys.argv[1]")
        .replace(
            "TASK",
            "for kind in ('start', 'end'):\n\
         \x20           if kind == 'end':\n\
         \x20               hog.append(bytearray(b'\\x01') * (20 << 20))\n\
         \x20           with open(record, 'a') as f:\n\
         \x20               f.write(f\"{kind} {t['id']} {os.getpid()} {time.monotonic_ns()}\\n\")",
        );
    let queue = exec_queue(
        dir.path(),
        "leaky",
        &script,
        &[&record.display().to_string()],
        "batch_size = 1\nprivate_dirty_limit = \"100MiB\"\n",
    );
    let m = TestMaster::start(&queue, &[("leaky", 1)]).await;
    let q = m.queue("leaky");
    const TASKS: usize = 14;
    let ids: BTreeSet<String> = q
        .enqueue_many(
            &(0..TASKS)
                .map(|i| NewTask::new(format!("{{\"n\":{i}}}")))
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    eventually(Duration::from_secs(60), "every task acked", || async {
        q.stats().await.unwrap().acked_total >= TASKS as u64
    })
    .await;
    let status = m
        .wait_status("the recycles reported", Duration::from_secs(10), |s| {
            s["host"]["queues"]["leaky"]["recycles_total"].as_u64() >= Some(2)
        })
        .await;
    let report = &status["host"]["queues"]["leaky"];
    assert_eq!(report["crashes_total"], 0, "{status}");
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (
            stats.acked_total,
            stats.ready,
            stats.leased,
            stats.dead,
            stats.retried_total
        ),
        (TASKS as u64, 0, 0, 0, 0),
        "{stats:?}"
    );

    // Every task started and ended once, in one child; no child ran a task after the
    // one that took it past the limit (5 × 20 MiB, plus the interpreter's own).
    let text = std::fs::read_to_string(&record).unwrap();
    let mut runs: BTreeMap<&str, Vec<(&str, &str, u64)>> = BTreeMap::new();
    let mut per_child: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let [kind, id, pid, ns] = f[..] else {
            panic!("bad record line {line:?}")
        };
        runs.entry(id)
            .or_default()
            .push((kind, pid, ns.parse().unwrap()));
        if kind == "start" {
            *per_child.entry(pid).or_default() += 1;
        }
    }
    let seen: BTreeSet<String> = runs.keys().map(|s| s.to_string()).collect();
    assert_eq!(seen, ids, "{text}");
    for (id, r) in &runs {
        assert!(
            matches!(r[..], [("start", p1, t1), ("end", p2, t2)] if p1 == p2 && t1 <= t2),
            "task {id} ran other than once: {r:?}"
        );
    }
    assert!(per_child.len() >= 3, "{per_child:?}");
    assert!(
        per_child.values().all(|&n| n <= 5),
        "a child ran past the limit: {per_child:?}"
    );
    let log = m.log();
    let recycled = log
        .lines()
        .filter(|l| l.contains("slot exited") && l.contains("recycled"))
        .count();
    assert!(recycled >= 2, "{log}");
    assert!(
        log.contains("over the limit of 100.0 MiB (private_dirty_limit)"),
        "{log}"
    );
}

/// Names a process of its own (a `sleep`) as the slot's outside process at init, and
/// another once its first batch ran: a stand-in for a fork-mode exec child.
struct NamesOutside {
    children: Vec<std::process::Child>,
}

impl NamesOutside {
    fn start(&mut self, ctx: &SlotContext) {
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        ctx.outside().set(child.id());
        self.children.push(child);
    }
}

impl Drop for NamesOutside {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Handler for NamesOutside {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Ok(NamesOutside {
            children: Vec::new(),
        })
    }

    fn init(&mut self, ctx: &SlotContext) -> Result<(), HandlerError> {
        self.start(ctx);
        Ok(())
    }

    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        if self.children.len() == 1 {
            self.start(ctx);
        }
        vec![Outcome::done(); batch.len()]
    }
}

#[tokio::test]
async fn a_slot_tells_its_master_its_outside_process() {
    let redis = TestRedis::start();
    let cfg = QueueConfig::new("outside", HandlerConfig::named(HandlerConfig::NOOP));
    let (report, events) = UnixDatagram::pair().unwrap();
    events
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let stop = CancellationToken::new();
    let spec = crate::harness::slot_spec(&redis, cfg, 5, report);
    let thread = {
        let stop = stop.clone();
        let handler = NamesOutside::preload(&spec.queue).unwrap();
        std::thread::spawn(move || run_slot(spec, Box::new(handler), Some(stop)))
    };
    let mut heard: Vec<SlotEvent> = Vec::new();
    let next_event = || {
        let mut buf = [0u8; 4096];
        let n = events.recv(&mut buf).ok()?;
        Some(serde_json::from_slice::<SlotEvent>(&buf[..n]).unwrap())
    };
    let outside_pids = |heard: &[SlotEvent]| -> Vec<Option<u32>> {
        heard
            .iter()
            .filter_map(|e| match e {
                SlotEvent::Outside {
                    slot: 5, outside, ..
                } => Some(*outside),
                _ => None,
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut enqueued = false;
    while outside_pids(&heard).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "heard {heard:?}");
        if let Some(ev) = next_event() {
            heard.push(ev);
        }
        if !enqueued && outside_pids(&heard).len() == 1 {
            let q = redis.client().await.queue("outside").unwrap();
            q.enqueue_many(&[NewTask::new("{}")]).await.unwrap();
            enqueued = true;
        }
    }
    stop.cancel();
    assert_eq!(thread.join().unwrap(), gaffer::slot::EXIT_STOPPED);
    let told = outside_pids(&heard);
    assert!(
        told.iter().all(Option::is_some) && told[0] != told[1],
        "the first child at init, the second after the batch: {heard:?}"
    );
    let ready = heard
        .iter()
        .position(|e| matches!(e, SlotEvent::Ready { .. }))
        .unwrap();
    let first = heard
        .iter()
        .position(|e| matches!(e, SlotEvent::Outside { .. }))
        .unwrap();
    assert!(ready < first, "{heard:?}");
}
