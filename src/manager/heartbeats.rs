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
//! After an outage of the manager's own, [`Blind`] lets reports be older by as long as the
//! spell lasted, for one heartbeat timeout: the masters could not write theirs either.
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

/// The manager's recent spells without Redis. Masters cannot report while Redis is away,
/// so for one heartbeat timeout after the manager hears from Redis again a report may be
/// older by as long as the spell lasted. Without that, any outage longer than the
/// heartbeat timeout made every host look dead: the map was emptied, then refilled a
/// tick later, and every slot of the cluster was stopped and started again.
///
/// A spell is a gap between two answers from Redis far longer than a tick, however it
/// came about: calls refused while Redis was down, or one call waiting on a frozen Redis
/// that answered in the end. A shorter spell during a longer one's grace keeps the longer
/// grace, now running until one timeout after the shorter: Redis was not yet whole, and
/// the masters had not had their timeout of it to report in. (The fault suite found the
/// case: a Redis Cluster node frozen for 10 s, then a 1.3 s tick while the other nodes
/// still said the cluster was down. The short gap replaced the long one, and a new leader
/// judged dead a host whose first report after the freeze had not landed yet, and moved
/// its slots away.) The grace is the longest spell in it, never a sum: a manager whose
/// every tick is slow, or a Redis that stalls again and again, must not keep a dead host
/// alive for ever. Times are on a monotonic clock, in ms.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Blind {
    /// When Redis last answered.
    last_ok_ms: Option<u64>,
    /// Extra age allowed to reports until `grace_until_ms`.
    grace_ms: u64,
    grace_until_ms: u64,
}

impl Blind {
    /// Redis answered at `now_ms`. `tick_ms` is the usual time between two answers,
    /// `timeout_ms` the heartbeat timeout.
    pub(super) fn reached(&mut self, now_ms: u64, tick_ms: u64, timeout_ms: u64) {
        if let Some(last) = self.last_ok_ms {
            let gap = now_ms.saturating_sub(last);
            // Twice the tick: a slow tick is no outage.
            if gap > tick_ms.saturating_mul(2) {
                self.grace_ms = gap.max(self.tolerance_ms(last));
                self.grace_until_ms = now_ms.saturating_add(timeout_ms);
            }
        }
        self.last_ok_ms = Some(now_ms);
    }

    /// How much older than the heartbeat timeout a report may be at `now_ms`.
    pub(super) fn tolerance_ms(&self, now_ms: u64) -> u64 {
        if now_ms < self.grace_until_ms {
            self.grace_ms
        } else {
            0
        }
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

    /// A [`Blind`] that heard Redis answer at each of `answers` (ms), with a 500 ms tick
    /// and a 3 s heartbeat timeout.
    fn answered_at(answers: impl IntoIterator<Item = u64>) -> Blind {
        let mut b = Blind::default();
        for now in answers {
            b.reached(now, 500, 3_000);
        }
        b
    }

    #[test]
    fn reports_may_age_by_the_outage_for_one_timeout_after_it() {
        assert_eq!(
            answered_at([1_000, 1_500]).tolerance_ms(1_600),
            0,
            "no outage yet"
        );
        // No answer from 1 500 to 9 500, whether calls failed or one call waited.
        let b = answered_at([1_000, 1_500, 9_500]);
        assert_eq!(b.tolerance_ms(9_500), 8_000);
        // Ticks on time after it keep the grace until it runs out.
        let b = answered_at(
            [1_000, 1_500]
                .into_iter()
                .chain((9_500..=12_500).step_by(500)),
        );
        assert_eq!(b.tolerance_ms(12_499), 8_000);
        assert_eq!(
            b.tolerance_ms(12_500),
            0,
            "one timeout after, reports must be fresh"
        );
    }

    #[test]
    fn a_slow_tick_is_no_outage() {
        assert_eq!(answered_at([1_000, 1_900]).tolerance_ms(1_900), 0);
    }

    #[test]
    fn the_first_answer_grants_nothing() {
        assert_eq!(answered_at([60_000]).tolerance_ms(60_000), 0);
    }

    /// The fault suite's case (seed 26445 of the long profile on a cluster), as data.
    #[test]
    fn a_slow_tick_during_an_outage_s_grace_extends_it_rather_than_cutting_it_short() {
        let (tick, timeout) = (500, 3_000);
        let mut b = Blind::default();
        let mut hb = Heartbeats::default();
        let wall = 1_000_000_000;
        // The host reports every 500 ms; Redis last answers at 21 000 before a 10 s freeze.
        for t in (20_000..=21_000).step_by(500) {
            b.reached(t, tick, timeout);
            hb.observe(&reports(&[("h2", wall + t - 300)]), t, wall + t);
        }
        // Redis answers again at 31 540, and the next tick, slowed by a cluster still
        // marked down, at 32 838. The host's first report since has not landed.
        b.reached(31_540, tick, timeout);
        b.reached(32_838, tick, timeout);
        hb.observe(&reports(&[("h2", wall + 20_700)]), 32_838, wall + 32_838);
        let silent = hb.silent_ms("h2", 32_838).unwrap();
        let allowed = timeout + b.tolerance_ms(32_838);
        assert!(
            silent <= allowed,
            "a host that reported until the freeze is alive just after it: silent {silent} ms, allowed {allowed} ms"
        );
        // It has one timeout from then to report; silent past that it is dead.
        assert_eq!(b.tolerance_ms(32_838 + timeout), 0);
        let silent = hb.silent_ms("h2", 32_838 + timeout).unwrap();
        assert!(silent > timeout, "{silent}");
    }

    #[test]
    fn a_gap_after_the_grace_ran_out_is_a_spell_of_its_own() {
        assert_eq!(answered_at([1_000, 9_000]).tolerance_ms(9_000), 8_000);
        let answers = [1_000, 9_000]
            .into_iter()
            .chain((9_500..=13_000).step_by(500))
            .chain([15_000]);
        assert_eq!(answered_at(answers).tolerance_ms(15_000), 2_000);
    }

    #[test]
    fn ticks_that_are_all_slow_keep_the_grace_at_one_tick_s_length() {
        let b = answered_at((0..=60_000).step_by(1_200));
        assert_eq!(b.tolerance_ms(60_000), 1_200);
    }
}
