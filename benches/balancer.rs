//! One balancer decision at the target scale (BENCHMARKS.md): 1,000 hosts × 1,000 queue
//! types × 100,000 slots (target ≤ 50 ms), from a map that is already in place (the
//! steady state) and from an empty map (a cold start).
//!
//! `cargo bench --bench balancer` prints the median of 11 runs of each.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gaffer::balancer::{self, HostState, Input, Placement, QueueWindow};
use gaffer::config::{Config, Handler, QueueConfig};

fn main() {
    let mut config = Config::default();
    for i in 0..1000 {
        let mut q = QueueConfig::new(format!("q{i:04}"), Handler::named(Handler::NOOP));
        q.priority = i % 10;
        q.min_slots = 1;
        q.max_slots = 1000;
        q.batch_size = 10;
        config.queues.insert(q.name.clone(), q);
    }
    let handlers: BTreeSet<String> = Handler::NAMES.iter().map(|s| s.to_string()).collect();
    let hosts: BTreeMap<String, HostState> = (0..1000)
        .map(|i| {
            (
                format!("h{i:04}"),
                HostState {
                    capacity: 110,
                    handlers: handlers.clone(),
                    alive: true,
                    draining: false,
                },
            )
        })
        .collect();
    // Each queue: about 100 slots' worth of work.
    let stats: BTreeMap<String, QueueWindow> = config
        .queues
        .keys()
        .map(|q| {
            (
                q.clone(),
                QueueWindow {
                    window_seconds: 60.0,
                    ready: 50,
                    leased: 500,
                    arrived: 96_000,
                    processed: 96_000,
                    busy_seconds: 4_800.0,
                    slot_lifetime_seconds: 6_000.0,
                    ..QueueWindow::default()
                },
            )
        })
        .collect();
    let paused = BTreeSet::new();
    let now = chrono::DateTime::from_timestamp(1_767_571_200, 0).unwrap();
    let empty = Placement::new();
    let input = |current| Input {
        config: &config,
        stats: &stats,
        current,
        hosts: &hosts,
        now,
        paused: &paused,
    };
    let steady = balancer::decide(&input(&empty)).map;
    let slots: u32 = steady.values().flat_map(|q| q.values()).sum();
    for (name, current) in [("steady", &steady), ("cold start", &empty)] {
        let mut times: Vec<Duration> = (0..11)
            .map(|_| {
                let start = Instant::now();
                let out = balancer::decide(&input(current));
                let took = start.elapsed();
                std::hint::black_box(out);
                took
            })
            .collect();
        times.sort();
        println!(
            "balancer decision, 1000 hosts x 1000 queues x {slots} slots, {name}: median {:.1} ms (min {:.1}, max {:.1})",
            times[5].as_secs_f64() * 1e3,
            times[0].as_secs_f64() * 1e3,
            times[10].as_secs_f64() * 1e3
        );
    }
}
