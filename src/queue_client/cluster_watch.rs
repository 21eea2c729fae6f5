//! A Redis Cluster's failovers, as a cluster connection's watcher sees them
//! (`cluster_conn.rs`): a master of some slots replaced by its replica.
//!
//! Each look is one `CLUSTER NODES` (any node answers): every node's id, role, the master
//! a replica follows, its config epoch and its slots. A failover is a node that holds
//! slots now, held none at the last look, followed one that did then, and carries a config
//! epoch above every one seen then: a replica that wins a failover takes a new epoch
//! above the cluster's. Slots moved to another master (resharding) are not counted, as
//! the node taking them was no replica. A node that has not heard of the failover yet
//! answers with the older epochs; its answer is passed over, so a look that lands on it
//! neither counts the failover again nor undoes it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

/// What one `CLUSTER NODES` says.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct NodesView {
    /// The masters that hold slots, by id.
    owners: BTreeSet<String>,
    /// Each replica's master, by id.
    replica_of: BTreeMap<String, String>,
    /// Each node's config epoch.
    epochs: BTreeMap<String, u64>,
    /// Each node's `host:port`.
    addrs: BTreeMap<String, String>,
    /// The highest config epoch of a master that holds slots.
    max_epoch: u64,
}

/// Reads the text of `CLUSTER NODES`; lines it cannot read are passed over.
fn parse(text: &str) -> NodesView {
    let mut v = NodesView::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [
            id,
            addr,
            flags,
            master,
            _ping,
            _pong,
            epoch,
            _link,
            slots @ ..,
        ] = f.as_slice()
        else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        let epoch: u64 = epoch.parse().unwrap_or(0);
        v.epochs.insert(id.to_string(), epoch);
        // `host:port@bus-port[,hostname]`
        let addr = addr.split(['@', ',']).next().unwrap_or_default();
        v.addrs.insert(id.to_string(), addr.to_string());
        if flags.contains(&"slave") && *master != "-" {
            v.replica_of.insert(id.to_string(), master.to_string());
        }
        // (an entry in brackets is a slot being migrated, not one held; a master failing,
        // `fail?` or `fail`, holds its slots until a replica takes them)
        let holds = slots.iter().any(|s| !s.starts_with('['));
        if flags.contains(&"master") && holds {
            v.owners.insert(id.to_string());
            v.max_epoch = v.max_epoch.max(epoch);
        }
    }
    v
}

/// The failovers one client has seen between its looks.
#[derive(Debug, Default)]
pub(crate) struct ClusterWatch {
    last: Option<NodesView>,
    /// Failovers seen since the first look.
    pub(crate) failovers: u64,
    /// When the last one was seen.
    pub(crate) last_failover: Option<SystemTime>,
}

/// A replica seen taking its master's slots: the promoted node's and its old master's
/// `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Promotion {
    pub(crate) node: String,
    pub(crate) was: String,
}

impl ClusterWatch {
    /// Takes a look (`CLUSTER NODES`'s text, read at `now`) and returns the failovers it
    /// shows since the last one.
    pub(crate) fn observe(&mut self, nodes: &str, now: SystemTime) -> Vec<Promotion> {
        let view = parse(nodes);
        if view.owners.is_empty() {
            return Vec::new(); // not an answer about slots at all
        }
        let Some(last) = &self.last else {
            self.last = Some(view);
            return Vec::new();
        };
        if view.max_epoch < last.max_epoch {
            return Vec::new(); // a node that has not heard the news yet
        }
        let promoted: Vec<Promotion> = view
            .owners
            .iter()
            .filter(|id| !last.owners.contains(*id))
            .filter_map(|id| {
                let master = last.replica_of.get(id)?;
                let epoch = view.epochs.get(id).copied().unwrap_or(0);
                (last.owners.contains(master) && epoch > last.max_epoch).then(|| Promotion {
                    node: view.addrs.get(id).cloned().unwrap_or_default(),
                    was: last.addrs.get(master).cloned().unwrap_or_default(),
                })
            })
            .collect();
        if !promoted.is_empty() {
            self.failovers += promoted.len() as u64;
            self.last_failover = Some(now);
        }
        self.last = Some(view);
        promoted
    }

    /// `host:port` of the masters holding slots, as the last look that counted saw them.
    pub(crate) fn owners(&self) -> Option<BTreeSet<String>> {
        let last = self.last.as_ref()?;
        Some(
            last.owners
                .iter()
                .filter_map(|id| last.addrs.get(id).cloned())
                .collect(),
        )
    }

    /// `host:port` of every node the last look that counted listed, masters first.
    pub(crate) fn nodes(&self) -> Vec<String> {
        let Some(last) = &self.last else {
            return Vec::new();
        };
        let (masters, others): (Vec<_>, Vec<_>) = last
            .addrs
            .iter()
            .partition(|(id, _)| last.owners.contains(*id));
        masters
            .into_iter()
            .chain(others)
            .map(|(_, a)| a.clone())
            .filter(|a| !a.is_empty() && !a.starts_with(':'))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: SystemTime = SystemTime::UNIX_EPOCH;

    /// Three masters a, b, c with replicas ra, rb, rc; `lines` replaces nodes by id.
    fn nodes(changed: &[&str]) -> String {
        let mut lines: BTreeMap<&str, String> = [
            "a 10.0.0.1:7000@17000 master - 0 0 1 connected 0-5460",
            "b 10.0.0.2:7000@17000 myself,master - 0 0 2 connected 5461-10922",
            "c 10.0.0.3:7000@17000 master - 0 0 3 connected 10923-16383",
            "ra 10.0.0.4:7000@17000 slave a 0 0 1 connected",
            "rb 10.0.0.5:7000@17000 slave b 0 0 2 connected",
            "rc 10.0.0.6:7000@17000 slave c 0 0 3 connected",
        ]
        .into_iter()
        .map(|l| (l.split(' ').next().unwrap(), l.to_string()))
        .collect();
        for l in changed {
            lines.insert(l.split(' ').next().unwrap(), l.to_string());
        }
        lines.into_values().collect::<Vec<_>>().join("\n")
    }

    /// `a` failed and `ra` took its slots with a new epoch.
    fn after_a_failed() -> String {
        nodes(&[
            "a 10.0.0.1:7000@17000 master,fail - 0 0 1 disconnected",
            "ra 10.0.0.4:7000@17000 master - 0 0 4 connected 0-5460",
        ])
    }

    #[test]
    fn a_replica_taking_its_masters_slots_is_one_failover() {
        let mut w = ClusterWatch::default();
        assert!(w.observe(&nodes(&[]), AT).is_empty(), "the first look");
        // `a` failing: it holds its slots until its replica takes them.
        let failing = nodes(&["a 10.0.0.1:7000@17000 master,fail - 0 0 1 disconnected 0-5460"]);
        assert!(w.observe(&failing, AT).is_empty());
        let seen = w.observe(&after_a_failed(), AT);
        assert_eq!(
            seen,
            [Promotion {
                node: "10.0.0.4:7000".into(),
                was: "10.0.0.1:7000".into()
            }]
        );
        assert_eq!((w.failovers, w.last_failover), (1, Some(AT)));
        // What a connection following the failover reconnects to: the new owners first.
        let owners: Vec<String> = w.owners().unwrap().into_iter().collect();
        assert_eq!(owners, ["10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.4:7000"]);
        assert_eq!(w.nodes().len(), 6);
        assert!(owners.contains(&w.nodes()[0]), "{:?}", w.nodes());
        // The old master back as the new one's replica changes nothing.
        let back = nodes(&[
            "a 10.0.0.1:7000@17000 slave ra 0 0 4 connected",
            "ra 10.0.0.4:7000@17000 master - 0 0 4 connected 0-5460",
        ]);
        assert!(w.observe(&back, AT).is_empty());
        assert_eq!(w.failovers, 1);
    }

    #[test]
    fn a_node_that_has_not_heard_of_the_failover_neither_undoes_nor_repeats_it() {
        let mut w = ClusterWatch::default();
        w.observe(&nodes(&[]), AT);
        assert_eq!(w.observe(&after_a_failed(), AT).len(), 1);
        // A look that lands on a node still naming `a`, then on one that knows.
        assert!(w.observe(&nodes(&[]), AT).is_empty());
        assert!(w.observe(&after_a_failed(), AT).is_empty());
        assert_eq!(w.failovers, 1);
    }

    #[test]
    fn slots_moved_to_another_master_are_no_failover() {
        let mut w = ClusterWatch::default();
        w.observe(&nodes(&[]), AT);
        // A fourth master, no one's replica, takes slots of c (with a new epoch).
        let mut resharded = nodes(&["c 10.0.0.3:7000@17000 master - 0 0 3 connected 11000-16383"]);
        resharded.push_str("\nd 10.0.0.7:7000@17000 master - 0 0 5 connected 10923-10999");
        assert!(w.observe(&resharded, AT).is_empty());
        // Slots being migrated (in brackets) are not held.
        let migrating = nodes(&["rc 10.0.0.6:7000@17000 slave c 0 0 3 connected [10923->-c]"]);
        assert!(w.observe(&migrating, AT).is_empty());
        assert_eq!(w.failovers, 0);
    }

    #[test]
    fn an_answer_without_slots_is_passed_over() {
        let mut w = ClusterWatch::default();
        assert!(w.observe("", AT).is_empty());
        assert!(
            w.observe("ERR this instance has cluster support disabled", AT)
                .is_empty()
        );
        w.observe(&nodes(&[]), AT);
        assert_eq!(w.observe(&after_a_failed(), AT).len(), 1);
    }
}
