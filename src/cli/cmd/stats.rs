//! `gaffer stats [--json]`: queues, hosts and the manager in one read.

use clap::Args;

use crate::cli::{CliError, Global};
use crate::cluster::now_ms;
use crate::cluster::snapshot::{Snapshot, age_text, late_text, redis_text, stats_json};
use crate::printable::printable;

/// Arguments of `gaffer stats`.
#[derive(Args)]
pub struct StatsArgs {
    /// Print the JSON document scripts rely on
    #[arg(long)]
    pub json: bool,
}

/// `gaffer stats`: every configured queue's counts, and the retired queues' that hold
/// data, as tables or as the JSON contract.
pub async fn run(global: &Global, args: StatsArgs) -> Result<(), CliError> {
    let cfg = global.load()?;
    let client = global.connect(&cfg).await?;
    let snap = crate::cluster::snapshot::read(&client, &cfg).await?;
    if args.json {
        let mut doc = stats_json(&snap);
        // (the node this command read from: beside the hosts', a master still on an old
        // primary shows)
        doc["redis"] = serde_json::json!(client.redis_node());
        println!("{doc}");
        return Ok(());
    }
    print_queues(&snap);
    print_retired(&snap);
    print_hosts(&snap);
    if !snap.drain_marked_unknown.is_empty() {
        println!(
            "\nmarked for draining, but no master reports as: {} (`gaffer drain NAME --cancel` drops a mark)",
            printable(&snap.drain_marked_unknown.join(", "))
        );
    }
    let m = &snap.manager;
    match &m.holder {
        Some(id) => println!(
            "\nmanager {} epoch {} (map version {})",
            printable(id),
            m.epoch.unwrap_or(0),
            m.map_version.unwrap_or(0)
        ),
        None => println!(
            "\nSTALE: no manager holds the lease (the map and decisions shown are the last ones written)"
        ),
    }
    println!(
        "this command reached redis {}",
        redis_text(&client.redis_node(), now_ms())
    );
    Ok(())
}

fn print_queues(snap: &Snapshot) {
    println!(
        "{:<24} {:>9} {:>7} {:>9} {:>9} {:>7} {:>12} {:>12} {:>8} {:>8} {:>6} {:>6} {:>6}",
        "queue",
        "ready",
        "late",
        "delayed",
        "leased",
        "dead",
        "enqueued",
        "acked",
        "retried",
        "stale",
        "slots",
        "wanted",
        "load"
    );
    for (name, q) in &snap.queues {
        let s = &q.stats;
        // (the balancer's last measure: busy time and backlog over slot time, over 1 when
        // demand exceeds the slots; `-` before one)
        let load = q
            .decision
            .as_ref()
            .and_then(|d| d.load)
            .map_or_else(|| "-".to_string(), |l| format!("{l:.2}"));
        println!(
            "{:<24} {:>9} {:>7} {:>9} {:>9} {:>7} {:>12} {:>12} {:>8} {:>8} {:>6} {:>6} {:>6}",
            name,
            s.ready,
            late_text(s.oldest_due_age_ms),
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
            load,
        );
    }
    // A queue its layout keeps from being served says so, with what to do.
    for q in snap.queues.values() {
        if let Some(reason) = &q.refused {
            println!("refused: {}", crate::printable::printable(reason));
        }
    }
    // A crashing queue says why under the table: its handler's own words (a traceback's
    // last line), which `crashes_total` alone does not.
    for (name, q) in &snap.queues {
        if let Some((host, crash)) = &q.last_crash {
            let ago = crate::cluster::now_ms().saturating_sub(crash.at_ms) / 1000;
            let last = crash.reason.lines().last().unwrap_or_default();
            println!(
                "{name}: {} crashes, the last on {host} {ago}s ago: {}",
                q.crashes_total,
                crate::printable::printable(last)
            );
        }
    }
}

/// The retired queues holding data, under the queue table: nothing takes from them, and
/// an operator who removed a table may not know their tasks are still there.
fn print_retired(snap: &Snapshot) {
    if snap.retired.is_empty() {
        return;
    }
    println!(
        "\nretired (not in the config): no slot takes from them; `gaffer queues retire NAME` deletes one's data"
    );
    println!(
        "{:<24} {:>9} {:>9} {:>9} {:>7} {:>7}  records",
        "queue", "ready", "delayed", "leased", "dead", "frozen"
    );
    for (name, r) in &snap.retired {
        let s = &r.stats;
        println!(
            "{:<24} {:>9} {:>9} {:>9} {:>7} {:>7}  {}",
            printable(name),
            s.ready,
            s.delayed,
            s.leased,
            s.dead,
            s.frozen,
            if r.records { "yes" } else { "no" }
        );
    }
    for r in snap.retired.values() {
        if let Some(reason) = &r.refused {
            println!("refused: {}", printable(reason));
        }
    }
}

/// What bounds a host's capacity, in words: for the CPU, that the host holds its slots.
fn bound_text(r: &crate::cluster::HostReport) -> &'static str {
    use crate::cluster::Bound;
    match r.capacity_bound {
        Some(Bound::Load) => "cpu overloaded: holding its slots, replacing those that exit",
        Some(Bound::Memory) => "memory",
        Some(Bound::MaxSlots) => "max_slots",
        None => "-",
    }
}

/// The Redis node a host's master talks to, and its topology unless one server; `-` in
/// the report of a master from before it.
fn node_text(r: &crate::cluster::HostReport) -> String {
    use crate::queue_client::Topology;
    match &r.redis {
        None => "-".into(),
        Some(n) if n.topology == Topology::Single => printable(&n.node).into_owned(),
        Some(n) => format!("{} ({})", printable(&n.node), n.topology.as_str()),
    }
}

/// The failovers a host's master followed: how many, and how long ago the last one was.
fn failovers_text(r: &crate::cluster::HostReport, now_ms: u64) -> String {
    match &r.redis {
        None => "-".into(),
        Some(n) if n.failovers == 0 => "0".into(),
        Some(n) => match n.last_failover_ms() {
            Some(at) => format!(
                "{}, last {} ago",
                n.failovers,
                age_text(now_ms.saturating_sub(at))
            ),
            None => n.failovers.to_string(),
        },
    }
}

fn print_hosts(snap: &Snapshot) {
    if snap.hosts.is_empty() {
        return;
    }
    let now = now_ms();
    let redis: Vec<(String, String)> = snap
        .hosts
        .values()
        .map(|h| (node_text(&h.report), failovers_text(&h.report, now)))
        .collect();
    let node_w = redis
        .iter()
        .map(|(n, _)| n.chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    let fail_w = redis
        .iter()
        .map(|(_, f)| f.chars().count())
        .max()
        .unwrap_or(0)
        .max(9);
    println!(
        "\n{:<24} {:>8} {:>6} {:>9} {:>10} {:>12} {:>6} {:>5}  {:<node_w$}  {:<fail_w$}  bound",
        "host",
        "state",
        "slots",
        "capacity",
        "pss",
        "available",
        "load",
        "cpu%",
        "redis",
        "failovers"
    );
    for ((name, h), (node, failovers)) in snap.hosts.iter().zip(&redis) {
        let r = &h.report;
        let pressure = r
            .cpu_pressure
            .map_or("-".to_string(), |p| format!("{p:.0}"));
        println!(
            "{:<24} {:>8} {:>6} {:>9} {:>10} {:>12} {:>6.2} {:>5}  {:<node_w$}  {:<fail_w$}  {}",
            printable(name),
            h.state.as_str(),
            r.slots,
            r.capacity,
            bytesize::ByteSize(r.pss_bytes).to_string(),
            bytesize::ByteSize(r.mem_available_bytes).to_string(),
            r.load1,
            pressure,
            node,
            failovers,
            bound_text(r)
        );
    }
}
