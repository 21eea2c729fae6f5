//! Redis's work per task of a slot's steady-state call (settle a batch of 100 and take the
//! next, `Queue::settle_take`) on a tracked queue, with nothing else running: 2 takers with
//! 2 calls in flight each drain 400,000 no-op tasks; Redis's CPU and FCALL time per task.
//!
//! `cargo run --release --example settle_take_cost -- [REDIS_URL] [TASKS] [ROUNDS]` on a
//! throwaway Redis: it writes under the namespace `lc` and runs `FLUSHALL` after each round.
use gaffer::queue_client::{ConnectOptions, NewTask, QueueClient, QueueLimits, Settle, SettleOp};
use std::time::{Duration, Instant};

use gaffer::bench::redis_cpu_s;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or("redis://127.0.0.1:6399".into());
    let n: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(400_000);
    let rounds: usize = std::env::args()
        .nth(3)
        .map(|s| s.parse().unwrap())
        .unwrap_or(3);
    let in_flight: usize = std::env::var("GAFFER_IN_FLIGHT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let opts = ConnectOptions::default();
    let mut results = Vec::new();
    for round in 0..rounds {
        let client = QueueClient::connect(&url, "lc", &opts).await?;
        let limits = QueueLimits {
            track: true,
            ..Default::default()
        };
        let q = client.queue_with("c", limits.clone())?;
        let tasks: Vec<NewTask> = (0..1000).map(|_| NewTask::new(vec![b'x'; 16])).collect();
        for _ in 0..n / 1000 {
            q.enqueue_many(&tasks).await?;
        }
        let mut conn = client.connection();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await?;
        let cpu0 = redis_cpu_s(&mut conn).await?;
        let t0 = Instant::now();
        let mut handles = Vec::new();
        for _ in 0..2 {
            let c = QueueClient::connect(&url, "lc", &opts).await?;
            let q = c.queue_with("c", limits.clone())?;
            // loops per taker on one connection: calls in flight (2, as a prefetching
            // slot keeps, unless GAFFER_IN_FLIGHT says otherwise)
            for _ in 0..in_flight {
                let q = q.clone();
                handles.push(tokio::spawn(async move {
                    let lease = Duration::from_secs(30);
                    let mut done = 0usize;
                    let mut b = q.take(100, lease).await.unwrap();
                    while !b.tasks.is_empty() {
                        done += b.tasks.len();
                        let ops: Vec<SettleOp> = b
                            .tasks
                            .iter()
                            .map(|t| SettleOp::new(t, Settle::Ack))
                            .collect();
                        b = q.settle_take(&ops, 100, lease).await.unwrap().1;
                    }
                    done
                }));
            }
        }
        let mut moved = 0;
        for h in handles {
            moved += h.await?;
        }
        let el = t0.elapsed().as_secs_f64();
        let cpu = redis_cpu_s(&mut conn).await? - cpu0;
        let cs: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        let fcall = cs
            .lines()
            .find(|l| l.starts_with("cmdstat_fcall:"))
            .unwrap_or("")
            .to_string();
        let usec: f64 = fcall
            .split("usec=")
            .nth(1)
            .and_then(|x| x.split(',').next())
            .map(|x| x.parse().unwrap())
            .unwrap_or(0.0);
        println!(
            "round {round}: {moved} tasks {:.0}/s, Redis CPU {:.3} us/task, FCALL time {:.3} us/task | {}",
            moved as f64 / el,
            cpu * 1e6 / moved as f64,
            usec / moved as f64,
            fcall
        );
        results.push(usec / moved as f64);
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
    }
    results.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("median FCALL us/task {:.3}", results[results.len() / 2]);
    Ok(())
}
