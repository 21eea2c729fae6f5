//! Where slots go: the new map is the current one, edited as little as possible.
//!
//! Works on indices into the (sorted) host and queue names and a dense count matrix, so
//! a decision for 1,000 hosts × 1,000 queues does no string work in its loops; ties
//! break by name because indices follow name order.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::{Input, Placement};

/// Builds the new map for `targets` (slots per queue) from the current map: slots on
/// hosts that died, drain or lack the handler are dropped; surplus is taken from the
/// hosts with the most slots of that queue; growth goes to the hosts with the fewest,
/// so a type spreads; no host goes above its capacity. Queues grow in scarcity order
/// (minimums first by priority, then the rest by priority).
pub fn place(input: &Input, targets: &BTreeMap<String, u32>) -> Placement {
    let config = input.config;
    let hosts: Vec<&str> = input.hosts.keys().map(String::as_str).collect();
    let queues: Vec<&str> = config.queues.keys().map(String::as_str).collect();
    let (nh, nq) = (hosts.len(), queues.len());
    let host_index: BTreeMap<&str, usize> =
        hosts.iter().enumerate().map(|(i, h)| (*h, i)).collect();
    let queue_index: BTreeMap<&str, usize> =
        queues.iter().enumerate().map(|(i, q)| (*q, i)).collect();

    // runs[q * nh + h]: host h is usable and has queue q's handler.
    let mut handler_of: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
    let mut runs = vec![false; nq * nh];
    for (qi, q) in queues.iter().enumerate() {
        let handler = config.queues[*q].handler.name();
        let row = handler_of.entry(handler).or_insert_with(|| {
            hosts
                .iter()
                .map(|h| {
                    let s = &input.hosts[*h];
                    s.usable() && s.handlers.contains(handler)
                })
                .collect()
        });
        runs[qi * nh..(qi + 1) * nh].copy_from_slice(row);
    }
    let capacity: Vec<u32> = hosts.iter().map(|h| input.hosts[*h].capacity).collect();
    let priority: Vec<i32> = queues.iter().map(|q| config.queues[*q].priority).collect();
    let target: Vec<u32> = queues
        .iter()
        .map(|q| targets.get(*q).copied().unwrap_or(0))
        .collect();

    // count[h * nq + q]
    let mut count = vec![0u32; nh * nq];
    for (host, qs) in input.current {
        let Some(&hi) = host_index.get(host.as_str()) else {
            continue;
        };
        for (queue, &n) in qs {
            if let Some(&qi) = queue_index.get(queue.as_str())
                && runs[qi * nh + hi]
            {
                count[hi * nq + qi] = n;
            }
        }
    }
    let mut used: Vec<u32> = (0..nh)
        .map(|h| count[h * nq..(h + 1) * nq].iter().sum())
        .collect();

    // A host whose capacity fell sheds its lowest-priority slots first.
    for h in 0..nh {
        let mut over = used[h].saturating_sub(capacity[h]);
        if over == 0 {
            continue;
        }
        let mut order: Vec<usize> = (0..nq).filter(|&q| count[h * nq + q] > 0).collect();
        order.sort_by_key(|&q| (priority[q], Reverse(count[h * nq + q]), q));
        for q in order {
            let take = count[h * nq + q].min(over);
            count[h * nq + q] -= take;
            over -= take;
            if over == 0 {
                break;
            }
        }
        used[h] = capacity[h];
    }

    let mut placed: Vec<u32> = (0..nq)
        .map(|q| (0..nh).map(|h| count[h * nq + q]).sum())
        .collect();

    // Surplus: from the hosts with the most slots of the queue.
    for q in 0..nq {
        if placed[q] <= target[q] {
            continue;
        }
        let mut heap: BinaryHeap<(u32, Reverse<usize>)> = (0..nh)
            .filter(|&h| count[h * nq + q] > 0)
            .map(|h| (count[h * nq + q], Reverse(h)))
            .collect();
        while placed[q] > target[q] {
            let Some((n, Reverse(h))) = heap.pop() else {
                break;
            };
            count[h * nq + q] -= 1;
            used[h] -= 1;
            placed[q] -= 1;
            if n > 1 {
                heap.push((n - 1, Reverse(h)));
            }
        }
    }

    // Growth, in the order capacity is granted: minimums by priority, then the rest.
    let mut order: Vec<usize> = (0..nq).collect();
    order.sort_by_key(|&q| (Reverse(priority[q]), q));
    for pass_min in [true, false] {
        for &q in &order {
            let goal = if pass_min {
                target[q].min(config.queues[queues[q]].min_slots)
            } else {
                target[q]
            };
            if placed[q] >= goal {
                continue;
            }
            // Fewest of this queue first (spreading), then most room, then name.
            let mut heap: BinaryHeap<(Reverse<u32>, u32, Reverse<usize>)> = (0..nh)
                .filter(|&h| runs[q * nh + h] && used[h] < capacity[h])
                .map(|h| {
                    (
                        Reverse(count[h * nq + q]),
                        capacity[h] - used[h],
                        Reverse(h),
                    )
                })
                .collect();
            while placed[q] < goal {
                let Some((Reverse(mine), free, Reverse(h))) = heap.pop() else {
                    break;
                };
                count[h * nq + q] += 1;
                used[h] += 1;
                placed[q] += 1;
                if free > 1 {
                    heap.push((Reverse(mine + 1), free - 1, Reverse(h)));
                }
            }
        }
    }

    let mut map = Placement::new();
    for (h, host) in hosts.iter().enumerate() {
        let row: BTreeMap<String, u32> = (0..nq)
            .filter(|&q| count[h * nq + q] > 0)
            .map(|q| (queues[q].to_string(), count[h * nq + q]))
            .collect();
        if !row.is_empty() {
            map.insert((*host).to_string(), row);
        }
    }
    map
}
