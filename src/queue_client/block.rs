//! Blocks: tasks handled as one, in the forms lua/lib/blocks.lua keeps (packets of
//! follow-ups, runs of consecutive record numbers, batch leases), as Rust writes and reads
//! them: a packet's enqueue arguments, the runs a whole batch's ack sends, the ids a take
//! hands out as a batch lease, and the tasks it hands out of a packet. The rest of the
//! queue client sees tasks one by one.
//!
//! A packet's task must read as if it had been enqueued alone (ARCHITECTURE.md, invariant
//! 36): how every reader finds it, and how every path that changes one task alone first
//! makes it ordinary, is in lua/lib/blocks.lua ("Packets"). This side's one part in it is
//! a taken task's meta, made by [`packet_tasks`].

use super::QueueError;
use super::enqueue::{NewTask, TaskChain};
use super::lease::LeasedTask;
use super::meta::{Meta, MetaChain, MetaHead};
use super::scripts::Call;

/// A chunk of follow-ups as a packet's arguments (enqueue.lua mode `ik`): their ids, then
/// their chains separated by 0x1f, then their payloads each framed `LEN:bytes`, so that
/// the script neither takes in nor makes anything per task but the ids.
pub(super) fn push_packet_args(inv: &mut Call<'_>, chunk: &[NewTask]) {
    let mut chains: Vec<u8> = Vec::new();
    let mut payloads: Vec<u8> = Vec::with_capacity(chunk.iter().map(|t| t.payload.len() + 8).sum());
    for (i, t) in chunk.iter().enumerate() {
        inv.arg(t.id.as_deref().unwrap_or_default());
        if i > 0 {
            chains.push(FS);
        }
        if let Some(TaskChain::FollowUp(g)) = &t.chain {
            chains.extend_from_slice(g.as_bytes());
        }
        payloads.extend_from_slice(t.payload.len().to_string().as_bytes());
        payloads.push(b':');
        payloads.extend_from_slice(&t.payload);
    }
    inv.arg(chains).arg(payloads);
}

/// The sequence numbers of a whole batch's first-attempt acks (in the order sent) as runs
/// of consecutive numbers, "s1-s2,s3-s4"; empty when any is unknown (settle.lua then
/// writes each record).
pub(super) fn seq_runs(seqs: impl Iterator<Item = Option<u64>>) -> String {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for seq in seqs {
        let Some(s) = seq else { return String::new() };
        match runs.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(s) => *end = s,
            _ => runs.push((s, s)),
        }
    }
    runs.iter()
        .map(|(a, b)| format!("{a}-{b}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The tasks a take handed out of a packet (`lua/lib/blocks.lua`, "Packets"): `store` says
/// what they share and each one's number and chain, `taken` their ids in take order and
/// their payloads. Each task's meta is made here as its enqueue would have written it
/// (a follow-up's, `c` and its chain), so that the take need not loop over the tasks.
pub(super) fn packet_tasks(
    store: &[u8],
    taken: &[u8],
    token: u64,
) -> Result<Vec<LeasedTask>, QueueError> {
    let bad = |what: &str| QueueError::Protocol(format!("take returned a packet {what}"));
    let mut parts = store.split(|&b| b == RS);
    let (Some(head), Some(ids), Some(chains)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("store without its parts"));
    };
    let head = std::str::from_utf8(head).map_err(|_| bad("head that is not text"))?;
    let shared: Vec<&str> = head.split('\u{1f}').collect();
    let [pri, ma, created, _due, _n, base] = shared[..] else {
        return Err(bad(&format!("head {head:?}")));
    };
    let base: u64 = base.parse().map_err(|_| bad(&format!("base {base:?}")))?;
    let meta_head = (|| {
        Some(MetaHead {
            priority: pri.parse().ok()?,
            max_attempts: ma.parse().ok()?,
            enqueued_ms: created.parse().ok()?,
            // (a packet's tasks are follow-ups, which carry no time limit of their own)
            timeout_ms: None,
        })
    })();
    // (each id's place in the packet: its number is the base and that place)
    let places: std::collections::HashMap<&[u8], usize> =
        framed(ids).enumerate().map(|(i, id)| (id, i)).collect();
    let chains: Vec<&[u8]> = chains.split(|&b| b == FS).collect();
    let mut parts = taken.splitn(3, |&b| b == RS);
    let (Some(_), Some(ids), Some(mut payloads)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("take without its parts"));
    };
    let mut tasks = Vec::new();
    for id in framed(ids) {
        let place = *places.get(id).ok_or_else(|| bad("task it does not hold"))?;
        let colon = payloads
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| bad("payload without its length"))?;
        let len: usize = std::str::from_utf8(&payloads[..colon])
            .ok()
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| bad("payload length"))?;
        let payload = payloads
            .get(colon + 1..colon + 1 + len)
            .ok_or_else(|| bad("payload cut short"))?;
        payloads = &payloads[colon + 1 + len..];
        let chain = String::from_utf8_lossy(chains.get(place).copied().unwrap_or_default());
        let meta = Meta {
            head: meta_head,
            seq: Some(base + place as u64 + 1),
            chain: MetaChain::Of(chain.into_owned()),
        };
        tasks.push(LeasedTask {
            id: String::from_utf8_lossy(id).into_owned(),
            attempt: 1,
            payload: payload.to_vec(),
            token,
            meta,
        });
    }
    Ok(tasks)
}

/// The record separator and the field separator of the queue scripts (lua/lib/records.lua).
const RS: u8 = 0x1e;
const FS: u8 = 0x1f;

/// The ids of a batch lease as a take hands them out (its `'b'` reply): framed by FS, as
/// the batch keeps them.
pub(super) fn batch_ids(block: &[u8]) -> Result<Vec<String>, QueueError> {
    if block.len() < 2 || block.first() != Some(&FS) || block.last() != Some(&FS) {
        return Err(QueueError::Protocol(
            "take returned a batch's ids not framed by FS".into(),
        ));
    }
    Ok(framed(block)
        .map(|id| String::from_utf8_lossy(id).into_owned())
        .collect())
}

/// The ids of a block framed by FS (`FS id FS id … FS`).
fn framed(block: &[u8]) -> impl Iterator<Item = &[u8]> {
    block.split(|&b| b == FS).filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_go_as_runs_or_not_at_all() {
        let runs = |s: &[Option<u64>]| seq_runs(s.iter().copied());
        assert_eq!(runs(&[Some(5), Some(6), Some(7)]), "5-7");
        assert_eq!(runs(&[Some(5), Some(7), Some(8), Some(3)]), "5-5,7-8,3-3");
        assert_eq!(runs(&[Some(5), None]), "");
        assert_eq!(
            runs(&[Some(u64::MAX), Some(0)]),
            format!("{}-{},0-0", u64::MAX, u64::MAX)
        );
    }
}
