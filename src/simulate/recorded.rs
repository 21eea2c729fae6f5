//! A trace from the manager's load rings (`gaffer trace record`): what the cluster saw,
//! written in the trace format `gaffer simulate` reads (`docs/SIMULATION.md`).
//!
//! Each period of a queue becomes one load segment at the period's arrival rate and mean
//! task time; the hosts are the most that were alive at once, each holding the largest
//! capacity seen per host, and a drop in live hosts becomes an event that kills that
//! many. A trace has no way to bring a host back, so hosts that return are not modelled.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::manager::ring::{HostsEntry, QueueEntry};

/// What a recorded trace needs beside the rings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecordedHosts {
    /// PSS of one slot (the config's `slot_estimate`): with a host's capacity, its memory.
    pub slot_memory: u64,
}

/// The trace text of `queues` (per queue, its entries oldest first) and `hosts` (oldest
/// first); `None` when no entry was recorded.
pub fn render(
    queues: &BTreeMap<String, Vec<QueueEntry>>,
    hosts: &[HostsEntry],
    recorded: RecordedHosts,
) -> Option<String> {
    let start = |end_ms: u64, seconds: f64| end_ms.saturating_sub((seconds * 1000.0) as u64);
    let entries = queues.values().flatten();
    let t0 = entries
        .clone()
        .map(|e| start(e.end_ms, e.seconds))
        .chain(hosts.iter().map(|h| start(h.end_ms, h.seconds)))
        .min()?;
    let end = entries
        .map(|e| e.end_ms)
        .chain(hosts.iter().map(|h| h.end_ms))
        .max()?;
    let mut s = String::new();
    let periods = hosts.len();
    let _ = writeln!(
        s,
        "# Recorded by `gaffer trace record`: {periods} periods of the manager's load rings."
    );
    let _ = writeln!(s, "duration = \"{}ms\"\nseed = 1\n", end - t0);
    host_table(&mut s, hosts, recorded);
    for (queue, entries) in queues {
        load_segments(&mut s, queue, entries, t0);
    }
    kill_events(&mut s, hosts, t0);
    Some(s)
}

/// `[hosts]`: the most hosts alive at once, each as large as the largest seen.
fn host_table(s: &mut String, hosts: &[HostsEntry], recorded: RecordedHosts) {
    let count = hosts.iter().map(|h| h.hosts).max().unwrap_or(0).max(1);
    let per_host = hosts
        .iter()
        .filter(|h| h.hosts > 0)
        .map(|h| h.capacity.div_ceil(u64::from(h.hosts)))
        .max()
        .unwrap_or(1)
        .max(1);
    let memory = per_host * recorded.slot_memory;
    let _ = writeln!(
        s,
        "[hosts]\ncount = {count}\nmemory = \"{memory}B\"\nslot_memory = \"{}B\"\n",
        recorded.slot_memory
    );
}

/// One `[[load]]` per period of `queue` that brought tasks.
fn load_segments(s: &mut String, queue: &str, entries: &[QueueEntry], t0: u64) {
    let processed: u64 = entries.iter().map(|e| e.processed).sum();
    let busy: f64 = entries.iter().map(|e| e.busy_seconds).sum();
    // A period whose tasks were not handled in it takes the queue's mean over the record.
    let overall = (processed > 0).then(|| busy / processed as f64);
    for e in entries.iter().filter(|e| e.arrived > 0 && e.seconds > 0.0) {
        let task = if e.processed > 0 {
            Some(e.busy_seconds / e.processed as f64)
        } else {
            overall
        };
        let from = e.end_ms.saturating_sub((e.seconds * 1000.0) as u64) - t0;
        let to = e.end_ms - t0;
        let rate = e.arrived as f64 / e.seconds;
        // A task time the record does not know (nothing of the queue was ever handled):
        // the shortest the format takes, said so.
        let task_us = task.map_or(1, |t| ((t * 1e6).round() as u64).max(1));
        if task.is_none() {
            let _ = writeln!(
                s,
                "# {queue}: no task was handled; its task time is unknown"
            );
        }
        let _ = writeln!(
            s,
            "[[load]]\nqueue = \"{queue}\"\nfrom = \"{from}ms\"\nto = \"{to}ms\"\n\
             rate = {rate:.4}\ntask_time = \"{task_us}us\"\n"
        );
    }
}

/// A drop in live hosts between two periods kills that many.
fn kill_events(s: &mut String, hosts: &[HostsEntry], t0: u64) {
    for pair in hosts.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        if after.hosts < before.hosts {
            let _ = writeln!(
                s,
                "[[events]]\nat = \"{}ms\"\nkill_hosts = {}\n",
                before.end_ms - t0,
                before.hosts - after.hosts
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn q(end_s: u64, arrived: u64, processed: u64, busy: f64) -> QueueEntry {
        QueueEntry {
            end_ms: end_s * 1000,
            seconds: 60.0,
            arrived,
            processed,
            busy_seconds: busy,
        }
    }

    fn h(end_s: u64, hosts: u32, capacity: u64) -> HostsEntry {
        HostsEntry {
            end_ms: end_s * 1000,
            seconds: 60.0,
            hosts,
            capacity,
        }
    }

    #[test]
    fn the_rings_read_back_as_a_trace_of_the_same_load() {
        let queues = BTreeMap::from([
            (
                "a".to_string(),
                vec![q(1060, 600, 600, 30.0), q(1120, 1200, 1000, 100.0)],
            ),
            ("idle".to_string(), vec![q(1060, 0, 0, 0.0)]),
            ("b".to_string(), vec![q(1120, 60, 0, 0.0)]),
        ]);
        let hosts = [h(1060, 3, 120), h(1120, 2, 80)];
        let text = render(
            &queues,
            &hosts,
            RecordedHosts {
                slot_memory: 1 << 26,
            },
        )
        .unwrap();
        let trace = crate::simulate::trace::parse(&text, "recorded").unwrap();
        assert_eq!(trace.duration, Duration::from_secs(120));
        assert_eq!(trace.hosts.count, 3);
        assert_eq!(trace.hosts.capacity(), 40);
        let a: Vec<(f64, Duration, Duration)> = trace
            .load
            .iter()
            .filter(|l| l.queue == "a")
            .map(|l| (l.rate, l.from, l.task_time))
            .collect();
        assert_eq!(
            a,
            [
                (10.0, Duration::ZERO, Duration::from_millis(50)),
                (20.0, Duration::from_secs(60), Duration::from_millis(100)),
            ]
        );
        // Nothing of `b` was handled: its task time is unknown, and said so.
        assert!(text.contains("# b: no task was handled"), "{text}");
        assert!(trace.load.iter().all(|l| l.queue != "idle"));
        assert_eq!(trace.events.len(), 1);
        assert_eq!(
            (trace.events[0].at, trace.events[0].kill_hosts),
            (Duration::from_secs(60), 1)
        );
    }

    #[test]
    fn no_entries_no_trace() {
        assert_eq!(
            render(&BTreeMap::new(), &[], RecordedHosts { slot_memory: 1 }),
            None
        );
    }
}
