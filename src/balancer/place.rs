//! Where slots go: the new map is the current one, edited as little as possible.

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
    let runs = |host: &str, queue: &str| -> bool {
        match (input.hosts.get(host), config.queues.get(queue)) {
            (Some(h), Some(q)) => h.usable() && h.handlers.contains(q.handler.name()),
            _ => false,
        }
    };

    let mut map: Placement = BTreeMap::new();
    for (host, queues) in input.current {
        for (queue, &n) in queues {
            if n > 0 && runs(host, queue) {
                map.entry(host.clone())
                    .or_default()
                    .insert(queue.clone(), n);
            }
        }
    }
    let mut used: BTreeMap<String, u32> = map
        .iter()
        .map(|(h, qs)| (h.clone(), qs.values().sum()))
        .collect();

    // A host whose capacity fell sheds its lowest-priority slots first.
    for (host, queues) in &mut map {
        let cap = input.hosts[host].capacity;
        let mut over = used[host].saturating_sub(cap);
        if over == 0 {
            continue;
        }
        let mut order: Vec<String> = queues.keys().cloned().collect();
        order.sort_by_key(|q| (config.queues[q].priority, Reverse(queues[q])));
        for q in order {
            let n = queues.get_mut(&q).expect("listed");
            let take = (*n).min(over);
            *n -= take;
            over -= take;
            if over == 0 {
                break;
            }
        }
        used.insert(host.clone(), cap);
    }

    // Surplus: from the hosts with the most slots of the queue.
    let mut placed: BTreeMap<String, u32> = BTreeMap::new();
    for queues in map.values() {
        for (q, &n) in queues {
            *placed.entry(q.clone()).or_default() += n;
        }
    }
    for (queue, &have) in &placed {
        let want = targets.get(queue).copied().unwrap_or(0);
        if have <= want {
            continue;
        }
        let mut heap: BinaryHeap<(u32, Reverse<String>)> = map
            .iter()
            .filter_map(|(h, qs)| {
                qs.get(queue)
                    .filter(|n| **n > 0)
                    .map(|n| (*n, Reverse(h.clone())))
            })
            .collect();
        for _ in want..have {
            let Some((n, Reverse(host))) = heap.pop() else {
                break;
            };
            let slot = map
                .get_mut(&host)
                .and_then(|qs| qs.get_mut(queue))
                .expect("in heap");
            *slot -= 1;
            *used.get_mut(&host).expect("host in map") -= 1;
            if n > 1 {
                heap.push((n - 1, Reverse(host)));
            }
        }
    }

    // Growth, in the order capacity is granted: minimums by priority, then the rest.
    let mut order: Vec<&String> = config.queues.keys().collect();
    order.sort_by_key(|q| (Reverse(config.queues[*q].priority), *q));
    for pass_min in [true, false] {
        for queue in &order {
            let target = targets.get(*queue).copied().unwrap_or(0);
            let goal = if pass_min {
                target.min(config.queues[*queue].min_slots)
            } else {
                target
            };
            let have: u32 = map
                .values()
                .map(|qs| qs.get(*queue).copied().unwrap_or(0))
                .sum();
            if have >= goal {
                continue;
            }
            // Fewest of this queue first (spreading), then most room, then name.
            let mut heap: BinaryHeap<(Reverse<u32>, u32, Reverse<String>)> = input
                .hosts
                .iter()
                .filter(|(h, _)| runs(h, queue))
                .filter_map(|(h, state)| {
                    let free = state
                        .capacity
                        .saturating_sub(used.get(h).copied().unwrap_or(0));
                    let mine = map
                        .get(h)
                        .and_then(|qs| qs.get(*queue))
                        .copied()
                        .unwrap_or(0);
                    (free > 0).then(|| (Reverse(mine), free, Reverse(h.clone())))
                })
                .collect();
            for _ in have..goal {
                let Some((Reverse(mine), free, Reverse(host))) = heap.pop() else {
                    break;
                };
                *map.entry(host.clone())
                    .or_default()
                    .entry((*queue).clone())
                    .or_default() += 1;
                *used.entry(host.clone()).or_default() += 1;
                if free > 1 {
                    heap.push((Reverse(mine + 1), free - 1, Reverse(host)));
                }
            }
        }
    }

    for queues in map.values_mut() {
        queues.retain(|_, n| *n > 0);
    }
    map.retain(|_, qs| !qs.is_empty());
    map
}
