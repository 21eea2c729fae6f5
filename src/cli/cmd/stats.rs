//! `gaffer stats [--json]`: queues, hosts and the manager in one read.

use clap::Args;
use serde_json::json;

use crate::cli::{CliError, Global};
use crate::cluster::snapshot::{HostState, Snapshot};

/// Arguments of `gaffer stats`.
#[derive(Args)]
pub struct StatsArgs {
    /// Print the JSON document scripts rely on
    #[arg(long)]
    pub json: bool,
}

/// `gaffer stats`: every configured queue's counts, as a table or as the JSON contract.
pub async fn run(global: &Global, args: StatsArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    let snap = crate::cluster::snapshot::read(&client, &cfg).await?;
    if args.json {
        println!("{}", stats_json(&snap));
        return Ok(());
    }
    print_queues(&snap);
    print_hosts(&snap);
    let m = &snap.manager;
    match &m.holder {
        Some(id) => println!(
            "\nmanager {id} epoch {} (map version {})",
            m.epoch.unwrap_or(0),
            m.map_version.unwrap_or(0)
        ),
        None => println!("\nmanager: none holds the lease (map and decisions are stale)"),
    }
    Ok(())
}

fn print_queues(snap: &Snapshot) {
    println!(
        "{:<24} {:>9} {:>9} {:>9} {:>7} {:>12} {:>12} {:>8} {:>8} {:>6} {:>6}",
        "queue",
        "ready",
        "delayed",
        "leased",
        "dead",
        "enqueued",
        "acked",
        "retried",
        "stale",
        "slots",
        "wanted"
    );
    for (name, q) in &snap.queues {
        let s = &q.stats;
        println!(
            "{:<24} {:>9} {:>9} {:>9} {:>7} {:>12} {:>12} {:>8} {:>8} {:>6} {:>6}",
            name,
            s.ready,
            s.delayed,
            s.leased,
            s.dead,
            s.enqueued_total,
            s.acked_total,
            s.retried_total,
            s.stale_total,
            q.slots,
            q.decision
                .as_ref()
                .map_or_else(|| "-".to_string(), |d| d.wanted.to_string()),
        );
    }
}

fn print_hosts(snap: &Snapshot) {
    if snap.hosts.is_empty() {
        return;
    }
    println!(
        "\n{:<24} {:>8} {:>6} {:>9} {:>10} {:>12} {:>6}",
        "host", "state", "slots", "capacity", "pss", "available", "load"
    );
    for (name, h) in &snap.hosts {
        let r = &h.report;
        println!(
            "{:<24} {:>8} {:>6} {:>9} {:>10} {:>12} {:>6.2}",
            name,
            h.state.as_str(),
            r.slots,
            r.capacity,
            bytesize::ByteSize(r.pss_bytes).to_string(),
            bytesize::ByteSize(r.mem_available_bytes).to_string(),
            r.load1
        );
    }
}

/// The `stats --json` document (a contract: keys are added, never renamed).
pub fn stats_json(snap: &Snapshot) -> serde_json::Value {
    let qs: serde_json::Map<String, serde_json::Value> = snap
        .queues
        .iter()
        .map(|(name, q)| {
            let s = &q.stats;
            let d = q.decision.as_ref();
            (
                name.clone(),
                json!({
                    "ready": s.ready, "delayed": s.delayed, "leased": s.leased, "dead": s.dead,
                    "frozen": s.frozen,
                    "slots": q.slots,
                    "mapped": q.mapped,
                    "wanted": d.map(|d| d.wanted),
                    "load": d.and_then(|d| d.load),
                    "reasons": d.map(|d| d.reasons.clone()),
                    "paused": q.paused,
                    "priority": q.priority, "min_slots": q.min_slots, "max_slots": q.max_slots,
                    "enqueued_total": s.enqueued_total, "acked_total": s.acked_total,
                    "retried_total": s.retried_total, "dead_total": s.dead_total,
                    "stale_total": s.stale_total, "expired_total": s.expired_total,
                    "processed_total": q.processed_total, "failed_total": q.failed_total,
                    "busy_seconds_total": q.busy_seconds_total,
                    "recycles_total": q.recycles_total, "crashes_total": q.crashes_total,
                }),
            )
        })
        .collect();
    let hosts: serde_json::Map<String, serde_json::Value> = snap
        .hosts
        .iter()
        .map(|(name, h)| {
            let r = &h.report;
            (
                name.clone(),
                json!({
                    "alive": h.state != HostState::Dead, "state": h.state.as_str(),
                    "draining": r.draining, "drain_requested": h.drain_requested,
                    "capacity": r.capacity, "slots": r.slots, "pss_bytes": r.pss_bytes,
                    "mem_available_bytes": r.mem_available_bytes,
                    "memory_budget_bytes": r.memory_budget_bytes, "load1": r.load1,
                    "cpus": r.cpus, "handlers": r.handlers, "map_version": r.map_version,
                    "last_seen_ms": r.ts_ms,
                    "queues": r.queues.iter().map(|(q, qr)| (q.clone(), json!(qr.slots)))
                        .collect::<serde_json::Map<_, _>>(),
                }),
            )
        })
        .collect();
    let m = &snap.manager;
    json!({
        "queues": qs,
        "hosts": hosts,
        "manager": {
            "epoch": m.map_epoch,
            "map_version": m.map_version,
            "leader": m.holder,
            "lease_epoch": m.epoch,
            "lease_ttl_ms": m.lease_ttl_ms,
            "stale": m.stale(),
        },
    })
}
