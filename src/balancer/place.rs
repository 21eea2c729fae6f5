//! Where slots go: the new map is the current one, edited as little as possible.
//!
//! Works on indices into the (sorted) host and queue names and a dense count matrix, so
//! a decision for 1,000 hosts × 1,000 queues does no string work in its loops; ties
//! break by name because indices follow name order.
//!
//! A new map is an edit of the current one (ARCHITECTURE.md, invariant 18): slots keep
//! their queue type unless the queue shrinks; surplus leaves the hosts with the most of
//! that type, growth goes to the hosts with the fewest, so a type spreads; a map that is
//! already right comes back unchanged.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{Balancer, HostTables, Pass, QueueInfo};

/// Builds the new map for the balancer's targets from `current` (queue-major, like
/// [`super::IndexedInput::current`]): slots on hosts that died, drain or lack the
/// handler are dropped; surplus is taken from the hosts with the most slots of that
/// queue; growth goes to the hosts with the fewest, so a type spreads; no host goes above
/// its capacity. Queues grow in scarcity order (minimums first by priority, then the rest
/// by priority).
pub(super) fn place(b: &mut Balancer, current: &[u32]) {
    let nh = b.host_count();
    let Balancer {
        queues,
        order,
        hosts,
        targets,
        placed,
        map,
        floor,
        scratch: s,
        ..
    } = b;
    let mut grid = Grid::kept(queues, hosts, current, nh, map, &mut s.used);
    grid.shed_over_capacity(queues, &hosts.capacity, &mut s.shed);

    placed.clear();
    placed.extend((0..queues.len()).map(|q| grid.row(q).iter().sum::<u32>()));

    grid.take_surplus(placed, targets, &mut s.surplus);
    // Growth, in the order capacity is granted: long queues' running tasks, minimums by
    // priority, then the rest.
    for pass in Pass::ALL {
        let goals = Goals {
            pass,
            queues,
            targets,
            floor,
        };
        grid.grow_queues(goals, order, hosts, placed, &mut s.growth);
    }
}

/// What a growth pass grows each queue to.
#[derive(Clone, Copy)]
struct Goals<'a, 'c> {
    pass: Pass,
    queues: &'a [QueueInfo<'c>],
    targets: &'a [u32],
    /// Slots placed first (a long queue's running tasks).
    floor: &'a [u32],
}

impl Goals<'_, '_> {
    /// The number of slots queue `q` should hold after this pass.
    fn of(&self, q: usize) -> u32 {
        let min = self.queues[q].config.min_slots;
        self.pass.goal(self.targets[q], min, self.floor[q])
    }
}

/// The map being built: slots per queue and host, and the slots each host holds.
struct Grid<'a> {
    hosts: usize,
    /// `count[q * hosts + h]`, queue-major.
    count: &'a mut Vec<u32>,
    /// Per host, its slots of every queue.
    used: &'a mut Vec<u32>,
}

impl<'a> Grid<'a> {
    /// The current map, kept only where host h is usable and runs q's handler.
    fn kept(
        queues: &[QueueInfo],
        hosts: &HostTables,
        current: &[u32],
        nh: usize,
        count: &'a mut Vec<u32>,
        used: &'a mut Vec<u32>,
    ) -> Self {
        count.clear();
        count.resize(queues.len() * nh, 0);
        for (q, info) in queues.iter().enumerate() {
            let runs = &hosts.can[info.handler * nh..(info.handler + 1) * nh];
            let row = q * nh..(q + 1) * nh;
            for ((n, &c), &r) in count[row.clone()].iter_mut().zip(&current[row]).zip(runs) {
                if r {
                    *n = c;
                }
            }
        }
        used.clear();
        used.resize(nh, 0);
        for row in count.chunks_exact(nh.max(1)) {
            for (u, &n) in used.iter_mut().zip(row) {
                *u += n;
            }
        }
        Grid {
            hosts: nh,
            count,
            used,
        }
    }

    /// Queue `q`'s slots per host.
    fn row(&self, q: usize) -> &[u32] {
        &self.count[q * self.hosts..(q + 1) * self.hosts]
    }

    /// A host whose capacity fell sheds its lowest-priority slots first.
    fn shed_over_capacity(
        &mut self,
        queues: &[QueueInfo],
        capacity: &[u32],
        shed: &mut Vec<usize>,
    ) {
        let (nh, nq) = (self.hosts, queues.len());
        let count = &mut *self.count;
        for h in 0..nh {
            let mut over = self.used[h].saturating_sub(capacity[h]);
            if over == 0 {
                continue;
            }
            shed.clear();
            shed.extend((0..nq).filter(|&q| count[q * nh + h] > 0));
            // A long queue's slots go last: they hold tasks that run until cancelled.
            shed.sort_by_key(|&q| {
                let c = queues[q].config;
                (c.is_long(), c.priority, Reverse(count[q * nh + h]), q)
            });
            for &q in shed.iter() {
                let take = count[q * nh + h].min(over);
                count[q * nh + h] -= take;
                over -= take;
                if over == 0 {
                    break;
                }
            }
            self.used[h] = capacity[h];
        }
    }

    /// Surplus: from the hosts with the most slots of the queue. `buffer` is the heap's
    /// storage, kept between decisions.
    fn take_surplus(
        &mut self,
        placed: &mut [u32],
        targets: &[u32],
        buffer: &mut Vec<(u32, Reverse<usize>)>,
    ) {
        let nh = self.hosts;
        let mut heap = BinaryHeap::from(std::mem::take(buffer));
        for q in 0..placed.len() {
            if placed[q] <= targets[q] {
                continue;
            }
            let row = &mut self.count[q * nh..(q + 1) * nh];
            heap.clear();
            heap.extend(
                row.iter()
                    .enumerate()
                    .filter(|(_, n)| **n > 0)
                    .map(|(h, &n)| (n, Reverse(h))),
            );
            while placed[q] > targets[q] {
                let Some((n, Reverse(h))) = heap.pop() else {
                    break;
                };
                row[h] -= 1;
                self.used[h] -= 1;
                placed[q] -= 1;
                if n > 1 {
                    heap.push((n - 1, Reverse(h)));
                }
            }
        }
        *buffer = heap.into_vec();
    }

    /// One growth pass: each queue in `order` grows towards its goal on the hosts that run
    /// its handler and have room.
    fn grow_queues(
        &mut self,
        goals: Goals,
        order: &[usize],
        hosts: &HostTables,
        placed: &mut [u32],
        cands: &mut Vec<(u32, u64)>,
    ) {
        let nh = self.hosts;
        let capacity = &hosts.capacity;
        for &q in order {
            let goal = goals.of(q);
            if placed[q] >= goal {
                continue;
            }
            let handler = goals.queues[q].handler;
            let runs = &hosts.can[handler * nh..(handler + 1) * nh];
            let row = &mut self.count[q * nh..(q + 1) * nh];
            let used = &mut *self.used;
            cands.clear();
            let mut tier = Tier::default();
            let hosts = row.iter().zip(runs).zip(used.iter().zip(capacity.iter()));
            let per_host = goals.queues[q].config.max_per_host.unwrap_or(u32::MAX);
            for (h, ((&n, &runs), (&used, &capacity))) in hosts.enumerate() {
                if runs && used < capacity && n < per_host {
                    cands.push((n, rank(capacity - used, h)));
                    tier.see(n);
                }
            }
            let mut need = goal - placed[q];
            grow(cands, tier, &mut need, per_host, |h| {
                row[h] += 1;
                used[h] += 1;
            });
            placed[q] = goal - need;
        }
    }
}

/// The fewest slots of a queue among candidates, and how many have that few.
#[derive(Clone, Copy)]
struct Tier {
    least: u32,
    size: usize,
}

impl Default for Tier {
    fn default() -> Self {
        Tier {
            least: u32::MAX,
            size: 0,
        }
    }
}

impl Tier {
    fn see(&mut self, n: u32) {
        if n < self.least {
            *self = Tier { least: n, size: 1 };
        } else if n == self.least {
            self.size += 1;
        }
    }
}

/// A host's rank for the next slot of a queue, among hosts with as many slots of it:
/// most free room first, then the lowest index; lower ranks first. One integer, so that
/// choosing among a thousand hosts compares integers.
fn rank(free: u32, host: usize) -> u64 {
    (u64::from(!free) << 32) | host as u64
}

/// Adds up to `need` slots one at a time, none to a host holding `per_host` of the queue,
/// each to the candidate (slots of the queue,
/// [`rank`]) with the fewest slots of the queue (spreading), then the lowest rank; `add`
/// is told each host. `first` is the candidates' [`Tier`], seen as they were gathered.
///
/// That is a priority queue's order, done by tiers: a host that gets a slot drops below
/// every other host of its tier (one more slot), so a tier is either taken whole, each
/// host once, or only its best `need` hosts are; whichever order those come in, each
/// gets one slot.
fn grow(
    cands: &mut Vec<(u32, u64)>,
    first: Tier,
    need: &mut u32,
    per_host: u32,
    mut add: impl FnMut(usize),
) {
    let mut known = Some(first);
    while *need > 0 && !cands.is_empty() {
        let Tier { least, size } = known.take().unwrap_or_else(|| {
            let mut t = Tier::default();
            cands.iter().for_each(|c| t.see(c.0));
            t
        });
        // The tier to the front; often it is every candidate already.
        let mut tier = size;
        if size < cands.len() {
            tier = 0;
            for i in 0..cands.len() {
                if cands[i].0 == least {
                    cands.swap(i, tier);
                    tier += 1;
                }
            }
        }
        let want = *need as usize;
        if want < tier {
            let best = &mut cands[..tier];
            best.select_nth_unstable_by_key(want - 1, |c| c.1);
            for c in &best[..want] {
                add(c.1 as u32 as usize);
            }
            *need = 0;
            return;
        }
        for c in &mut cands[..tier] {
            add(c.1 as u32 as usize);
            // One more slot, one less free room: the rank's upper half is !free.
            c.0 += 1;
            c.1 += 1 << 32;
        }
        *need -= tier as u32;
        // Full hosts leave (free room 0 is rank !0 in the upper half), and so do hosts
        // at the queue's `max_per_host`.
        cands.retain(|c| c.1 >> 32 != u64::from(u32::MAX) && c.0 < per_host);
    }
}
