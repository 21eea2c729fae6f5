//! How long each host has been silent, on the manager's own monotonic clock.
//!
//! A master stamps its report with its own wall clock. Comparing that stamp with the
//! manager's wall clock makes a host whose clock runs a heartbeat timeout behind look dead
//! while it reports every second, and one whose clock runs ahead look alive after it died.
//! So a host's silence is measured from the moment the manager last saw its report change,
//! by the manager's monotonic clock: the stamps are only compared with each other. The
//! two clocks meet once, when a host is first seen, and its report's age by the wall
//! clocks is then the only measure there is (a report left by a host that died before this
//! manager started must not pass for a fresh one).
//!
//! Pure: times are inputs, so it is tested as data.
//!
//! A report that changed counts from the last look at most (a host that died during a long
//! gap is not fresh), and a host is forgotten only once watched past a heartbeat timeout.
//! The leader writes its verdicts with its decisions (`{cluster}:liveness`, fenced), and
//! `stats`, `top` and the api show them; only without a leader, or for a host it has not
//! judged yet, do they judge by the report's age on their own clock.

use std::collections::{BTreeMap, HashMap};

use crate::cluster::HostReport;

/// The last report seen of each host, and when it last changed.
#[derive(Debug, Default, Clone)]
pub struct Heartbeats {
    seen: HashMap<String, Seen>,
    /// When reports were last observed (monotonic ms).
    last_observed: Option<i64>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    /// The report's stamp, as the master wrote it.
    ts_ms: u64,
    /// When it last changed, on the manager's monotonic clock (ms, may lie before its
    /// origin for a report first seen old).
    changed_at: i64,
    /// When this manager first saw the host (monotonic ms).
    first_seen: i64,
}

impl Heartbeats {
    /// Takes in the `reports` read at `mono_ms` (the manager's monotonic clock) and
    /// `wall_ms` (its wall clock); hosts no longer reporting are forgotten.
    pub fn observe(&mut self, reports: &BTreeMap<String, HostReport>, mono_ms: u64, wall_ms: u64) {
        let now = i64::try_from(mono_ms).unwrap_or(i64::MAX);
        // A report that changed since the last look changed at most that long ago, and
        // its age by the wall clocks says when within that gap (a host that died during a
        // long gap is not fresh now); a skewed clock can cost at most the gap.
        let gap = self
            .last_observed
            .map_or(i64::MAX, |t| now.saturating_sub(t));
        self.last_observed = Some(now);
        self.seen.retain(|host, _| reports.contains_key(host));
        for (host, r) in reports {
            let age = i64::try_from(wall_ms.saturating_sub(r.ts_ms)).unwrap_or(i64::MAX);
            match self.seen.get_mut(host) {
                Some(s) if s.ts_ms == r.ts_ms => {}
                Some(s) => {
                    s.ts_ms = r.ts_ms;
                    s.changed_at = now.saturating_sub(age.min(gap));
                }
                None => {
                    let seen = Seen {
                        ts_ms: r.ts_ms,
                        changed_at: now.saturating_sub(age),
                        first_seen: now,
                    };
                    self.seen.insert(host.clone(), seen);
                }
            }
        }
    }

    /// How long `host` has been silent at `mono_ms`; None for a host never observed.
    pub fn silent_ms(&self, host: &str, mono_ms: u64) -> Option<u64> {
        let s = self.seen.get(host)?;
        let now = i64::try_from(mono_ms).unwrap_or(i64::MAX);
        Some(u64::try_from(now.saturating_sub(s.changed_at)).unwrap_or(0))
    }

    /// How long this manager has watched `host` at `mono_ms`: a host is forgotten only
    /// once watched past a heartbeat timeout, so that its silence was measured by its
    /// reports, not by the wall clocks of first sight.
    pub fn watched_ms(&self, host: &str, mono_ms: u64) -> u64 {
        let now = i64::try_from(mono_ms).unwrap_or(i64::MAX);
        self.seen.get(host).map_or(0, |s| {
            u64::try_from(now.saturating_sub(s.first_seen)).unwrap_or(0)
        })
    }

    /// Whether `report` is the one last observed of its host (unchanged since).
    pub fn is_last_seen(&self, report: &HostReport) -> bool {
        self.seen
            .get(&report.host)
            .is_some_and(|s| s.ts_ms == report.ts_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reports(hosts: &[(&str, u64)]) -> BTreeMap<String, HostReport> {
        hosts
            .iter()
            .map(|(h, ts)| {
                let r = HostReport {
                    host: (*h).into(),
                    ts_ms: *ts,
                    ..HostReport::default()
                };
                ((*h).to_string(), r)
            })
            .collect()
    }

    #[test]
    fn a_host_whose_clock_runs_behind_is_alive_while_its_report_changes() {
        let mut hb = Heartbeats::default();
        // 60 s behind the manager's wall clock, reporting every second.
        let wall = 1_000_000_000;
        hb.observe(&reports(&[("late", wall - 60_000)]), 0, wall);
        assert_eq!(
            hb.silent_ms("late", 0),
            Some(60_000),
            "first sight: its age"
        );
        for s in 1..=5u64 {
            let ts = wall - 60_000 + s * 1000;
            hb.observe(&reports(&[("late", ts)]), s * 1000, wall + s * 1000);
            // (a changed report counts from the last look at most: a tick, here 1 s)
            assert_eq!(hb.silent_ms("late", s * 1000 + 300), Some(1300));
        }
    }

    #[test]
    fn a_host_whose_clock_runs_ahead_is_silent_once_its_report_stops_changing() {
        let mut hb = Heartbeats::default();
        let wall = 1_000_000_000;
        // 60 s ahead: by the wall clocks its last report would look fresh for a minute.
        hb.observe(&reports(&[("early", wall + 60_000)]), 0, wall);
        assert_eq!(hb.silent_ms("early", 0), Some(0));
        for s in 1..=20u64 {
            hb.observe(
                &reports(&[("early", wall + 60_000)]),
                s * 1000,
                wall + s * 1000,
            );
        }
        assert_eq!(hb.silent_ms("early", 20_000), Some(20_000));
    }

    #[test]
    fn a_report_that_changed_during_a_long_gap_is_no_fresher_than_its_age() {
        let mut hb = Heartbeats::default();
        let wall = 1_000_000_000;
        hb.observe(&reports(&[("h", wall)]), 0, wall);
        // Not observed for 30 s; the host's last report came 2 s into the gap.
        hb.observe(&reports(&[("h", wall + 2_000)]), 30_000, wall + 30_000);
        assert_eq!(hb.silent_ms("h", 30_000), Some(28_000));
        assert_eq!(hb.watched_ms("h", 30_000), 30_000);
    }

    #[test]
    fn a_report_left_before_the_manager_started_is_as_old_as_it_looks() {
        let mut hb = Heartbeats::default();
        let wall = 1_000_000_000;
        hb.observe(&reports(&[("gone", wall - 3_600_000)]), 5, wall);
        assert_eq!(hb.silent_ms("gone", 1005), Some(3_601_000));
    }

    #[test]
    fn hosts_that_stop_reporting_are_forgotten_and_unknown_ones_have_no_silence() {
        let mut hb = Heartbeats::default();
        hb.observe(&reports(&[("a", 10), ("b", 10)]), 0, 10);
        hb.observe(&reports(&[("a", 20)]), 10, 20);
        assert_eq!(hb.silent_ms("b", 10), None);
        assert_eq!(hb.silent_ms("nobody", 10), None);
        let r = &reports(&[("a", 20)])["a"];
        assert!(hb.is_last_seen(r));
        let newer = &reports(&[("a", 30)])["a"];
        assert!(!hb.is_last_seen(newer));
    }
}
