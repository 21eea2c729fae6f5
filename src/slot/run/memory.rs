//! What a slot knows of its own memory: the processes it is summed over (its own tree and
//! its outside process's), and when to tell its master of that outside process.
//!
//! Σ Private_Dirty of its tree and its outside process's tree is checked against
//! `private_dirty_limit` before each settle; the tree is rescanned at most once a second,
//! and each check reads only its processes. The master is told of the outside process
//! (`SlotEvent::Outside`) so that a host's memory counts each process once.

use std::time::{Duration, Instant};

use crate::host::sysinfo::{ProcTree, Rollups, SysinfoError};

/// How long a scan of `/proc` for the slot's descendants serves its memory checks: a
/// check per batch reads its processes' rollups, but not all of `/proc` (a Rust slot of a
/// fast queue settles thousands of batches a second). A child started since is counted
/// from the next scan on.
const TREE_RESCAN: Duration = Duration::from_secs(1);

/// How often a slot repeats its outside process to the master while it has one: its
/// datagrams are best effort, and a dropped one would leave that process's memory out
/// of the slot's figure for as long as it lives.
const OUTSIDE_RETELL: Duration = Duration::from_secs(30);

/// A slot's memory bookkeeping.
#[derive(Debug, Default)]
pub(super) struct SlotMemory {
    /// The roots the processes below were found under (the slot, its outside process).
    roots: Vec<u32>,
    /// The roots and their descendants, as last scanned.
    pids: Vec<u32>,
    /// When `/proc` was last scanned for them.
    scanned_at: Option<Instant>,
    /// The outside process the master was last told of, and when.
    told: Option<(Option<u32>, Instant)>,
}

impl SlotMemory {
    /// Σ Private_Dirty of process `own` and its descendants, and of process `outside` and
    /// its descendants, each process once: what the queue's `private_dirty_limit` is
    /// held against. Processes gone since the last scan are left out; `own` unreadable
    /// is an error.
    pub(super) fn private_dirty(
        &mut self,
        own: u32,
        outside: Option<u32>,
        now: Instant,
    ) -> Result<u64, SysinfoError> {
        let roots: Vec<u32> = std::iter::once(own).chain(outside).collect();
        if roots != self.roots || self.scanned_at.is_none_or(|t| now >= t + TREE_RESCAN) {
            self.pids = match ProcTree::read() {
                Ok(tree) => tree.trees(roots.iter().copied()),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the process tree; the memory check counts the slot and its outside process only");
                    roots.clone()
                }
            };
            self.roots = roots;
            self.scanned_at = Some(now);
        }
        let mut rollups = Rollups::read(self.pids.iter().copied());
        if let Some(i) = rollups.unreadable.iter().position(|(pid, _)| *pid == own) {
            return Err(rollups.unreadable.swap_remove(i).1);
        }
        Ok(rollups.total().private_dirty)
    }

    /// What to tell the master of the outside process now that it is `outside`: the
    /// value when it changed since it was last told (or was never told, and is set), or
    /// when [`OUTSIDE_RETELL`] passed since and it is still set; else nothing.
    pub(super) fn outside_news(
        &mut self,
        outside: Option<u32>,
        now: Instant,
    ) -> Option<Option<u32>> {
        let due = match self.told {
            None => outside.is_some(),
            Some((told, at)) => {
                told != outside || (outside.is_some() && now >= at + OUTSIDE_RETELL)
            }
        };
        if due {
            self.told = Some((outside, now));
        }
        due.then_some(outside)
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufRead;
    use std::process::{Child, Command, Stdio};

    use super::*;
    use crate::host::sysinfo;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_outside_process_is_told_when_it_changes_and_now_and_then() {
        let t0 = Instant::now();
        let mut m = SlotMemory::default();
        assert_eq!(m.outside_news(None, t0), None, "nothing to say yet");
        assert_eq!(m.outside_news(Some(7), t0), Some(Some(7)));
        assert_eq!(m.outside_news(Some(7), t0 + Duration::from_secs(1)), None);
        assert_eq!(
            m.outside_news(Some(8), t0 + Duration::from_secs(2)),
            Some(Some(8))
        );
        let later = t0 + Duration::from_secs(2) + OUTSIDE_RETELL;
        assert_eq!(m.outside_news(Some(8), later), Some(Some(8)), "told again");
        assert_eq!(m.outside_news(Some(8), later), None);
        assert_eq!(m.outside_news(None, later), Some(None), "gone");
        assert_eq!(m.outside_news(None, later + OUTSIDE_RETELL), None);
    }

    /// A python process whose child writes `mib` MiB; returns it once the child has.
    fn parent_of_a_writer(mib: u32) -> Child {
        let code = format!(
            "import subprocess, sys\n\
             grow = \"import sys\\nb = bytearray(b'\\\\x01') * ({mib} << 20)\\nprint('ready', flush=True)\\nsys.stdin.read()\"\n\
             g = subprocess.Popen([sys.executable, '-c', grow], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n\
             print(g.stdout.readline().decode().strip(), flush=True)\n\
             sys.stdin.read()\ng.stdin.close()\ng.wait()\n"
        );
        let mut child = Command::new("python3")
            .args(["-c", &code])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        child
    }

    fn end(mut child: Child) {
        drop(child.stdin.take());
        child.wait().unwrap();
    }

    #[test]
    fn private_dirty_counts_the_descendants_and_the_outside_tree() {
        // Stand-ins: `own` for the slot (its exec child's child writes 40 MiB) and
        // `outside` for a forked exec child (its child writes 24 MiB).
        let own = parent_of_a_writer(40);
        let outside = parent_of_a_writer(24);
        let mut m = SlotMemory::default();
        let now = Instant::now();
        let alone = m.private_dirty(own.id(), None, now).unwrap();
        let both = m.private_dirty(own.id(), Some(outside.id()), now).unwrap();
        let own_only = sysinfo::private_dirty(own.id()).unwrap();
        end(own);
        end(outside);
        assert!(
            own_only < 40 * MIB,
            "the parent itself wrote little: {own_only}"
        );
        assert!(alone >= 40 * MIB, "the slot's tree: {alone}");
        assert!(
            both >= alone + 24 * MIB,
            "with the outside tree: {both} (alone {alone})"
        );
    }
}
