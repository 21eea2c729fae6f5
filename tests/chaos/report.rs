//! The run's report: a table for people, the same figures as JSON for scripts and for
//! `docs/RELIABILITY.md`.

use std::collections::BTreeMap;
use std::fmt::Write;

use gaffer::queue_client::QueueStats;
use serde::Serialize;

use crate::Profile;
use crate::chains::ChainVerdict;
use crate::cluster::Shape;
use crate::failover::Figures;
use crate::faults::{Fault, FaultKind};
use crate::oracle::Verdict;

/// Everything a run found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The profile run.
    pub profile: String,
    /// The seed of the schedule and payloads.
    pub seed: u64,
    /// The command that repeats this run.
    pub command: String,
    /// The cluster's shape.
    pub shape: Shape,
    /// Plain tasks per second the producer aimed at.
    pub rate: f64,
    /// Chains per second the producer aimed at (four tasks each).
    pub chain_rate: f64,
    /// The kinds of fault the profile injects (each must have been, at least once).
    pub kinds: Vec<FaultKind>,
    /// Per fault kind: times injected and what the injections found.
    pub fault_table: BTreeMap<FaultKind, FaultSummary>,
    /// Every fault in order.
    pub faults: Vec<Fault>,
    /// The oracle's counts.
    pub verdict: Verdict,
    /// Tasks accounted for per queue: the producer's, and the follow-ups of the chains.
    pub tasks_by_queue: BTreeMap<String, u64>,
    /// What the chain check found (None: no chains in the workload).
    pub chains: Option<ChainVerdict>,
    /// What the failovers cost (the failover profile only).
    pub failover: Option<Figures>,
    /// Extra handlings per cause, by label.
    pub duplicates_by_cause: BTreeMap<String, usize>,
    /// Each queue's counters at the end (none when Redis did not answer).
    pub queue_stats: BTreeMap<String, QueueStats>,
    /// Map epochs seen, in order.
    pub epochs: Vec<u64>,
    /// Seconds from the end of the faults until the queue was empty.
    pub drain_seconds: f64,
    /// Seconds it took to read and check every task's record.
    pub records_seconds: f64,
    /// Seconds the whole run took.
    pub seconds: f64,
    /// Processes of the run still alive after the shutdown.
    pub leftovers: Vec<String>,
    /// Everything that failed the run.
    pub problems: Vec<String>,
    /// lost = 0, unexpected = 0, every duplicate explained, every record agrees, no
    /// problem, nothing left.
    pub passed: bool,
}

/// One row of the fault table.
#[derive(Debug, Default, Serialize)]
pub struct FaultSummary {
    /// Times injected.
    pub injected: usize,
    /// Problems found by its checks.
    pub problems: usize,
    /// Settles rejected as stale around it.
    pub stale: u64,
    /// Extra handlings it caused.
    pub duplicates: usize,
    /// Takes it kept from reaching the handler.
    pub not_run: usize,
}

impl Report {
    /// An empty report for a run about to start, which `command` repeats.
    pub fn new(profile: &Profile, seed: u64, command: String, shape: Shape) -> Self {
        Report {
            profile: profile.name.clone(),
            seed,
            command,
            shape,
            rate: profile.rate,
            chain_rate: profile.chain_rate,
            kinds: FaultKind::ALL.to_vec(),
            fault_table: BTreeMap::new(),
            faults: Vec::new(),
            verdict: Verdict::default(),
            chains: None,
            failover: None,
            tasks_by_queue: BTreeMap::new(),
            duplicates_by_cause: BTreeMap::new(),
            queue_stats: BTreeMap::new(),
            epochs: Vec::new(),
            drain_seconds: 0.0,
            records_seconds: 0.0,
            seconds: 0.0,
            leftovers: Vec::new(),
            problems: Vec::new(),
            passed: false,
        }
    }

    /// Fills the summaries and decides whether the run passed.
    pub fn finish(&mut self) {
        for &kind in &self.kinds {
            self.fault_table.insert(kind, FaultSummary::default());
        }
        for (&i, &n) in &self.verdict.by_fault {
            if let Some(f) = self.faults.get_mut(i) {
                f.duplicates = n;
            }
        }
        for (&i, &n) in &self.verdict.records.not_run_by_fault {
            if let Some(f) = self.faults.get_mut(i) {
                f.not_run = n;
            }
        }
        for f in &mut self.faults {
            // A frozen slot whose batch ran elsewhere woke to settle leases it no longer
            // held: Redis must have refused that.
            if f.kind == FaultKind::SlotStop && f.duplicates > 0 && f.stale == 0 {
                f.problems.push(format!(
                    "{} of its tasks ran again elsewhere, yet no late settle was rejected",
                    f.duplicates
                ));
            }
            let row = self.fault_table.entry(f.kind).or_default();
            row.injected += usize::from(f.injected);
            row.problems += f.problems.len();
            row.stale += f.stale;
            row.duplicates += f.duplicates;
            row.not_run += f.not_run;
            for p in &f.problems {
                self.problems
                    .push(format!("{} ({}): {p}", f.kind.label(), f.target));
            }
        }
        for (cause, n) in &self.verdict.by_cause {
            self.duplicates_by_cause.insert(cause.label().into(), *n);
        }
        if !self.verdict.phantom_existing.is_empty() {
            self.problems.push(format!(
                "Redis said these ids existed on their first enqueue: {:?}",
                &self.verdict.phantom_existing[..self.verdict.phantom_existing.len().min(10)]
            ));
        }
        if self.verdict.unexplained > 0 {
            self.duplicates_by_cause
                .insert("UNEXPLAINED".into(), self.verdict.unexplained);
        }
        let missing: Vec<&str> = self
            .kinds
            .iter()
            .filter(|k| self.fault_table.get(k).is_none_or(|r| r.injected == 0))
            .map(|k| k.label())
            .collect();
        if !missing.is_empty() {
            self.problems
                .push(format!("never injected: {}", missing.join(", ")));
        }
        let r = &self.verdict.records;
        if r.tasks != self.verdict.enqueued {
            self.problems.push(format!(
                "the records of {} of {} tasks were checked",
                r.tasks, self.verdict.enqueued
            ));
        }
        if let Some(ch) = &self.chains {
            // (a failover's lost writes can break a chain: counted as its cost)
            match &mut self.failover {
                Some(fig) => fig.chains_wrong.extend(ch.problems.iter().cloned()),
                None => self.problems.extend(ch.problems.iter().cloned()),
            }
            if ch.chains == 0 {
                self.problems.push("no chain was started".into());
            }
        }
        if let Some(fig) = &self.failover {
            self.problems.extend(crate::failover::judge(fig));
        }
        let lost_fails = self.failover.as_ref().is_none_or(Figures::lost_fails);
        self.passed = self.verdict.enqueued > 0
            && (self.verdict.lost.is_empty() || !lost_fails)
            && self.verdict.unexpected.is_empty()
            && self.verdict.unexplained == 0
            && self.verdict.records.mismatches.is_empty()
            && self.leftovers.is_empty()
            && self.problems.is_empty();
    }

    /// The report as text.
    pub fn table(&self) -> String {
        let mut s = String::new();
        self.head(&mut s);
        self.counts(&mut s);
        self.failovers(&mut s);
        self.failures(&mut s);
        let _ = writeln!(s, "\n{}", if self.passed { "PASSED" } else { "FAILED" });
        s
    }

    /// The run, its cluster and the fault table.
    fn head(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\ngaffer chaos: profile {}, seed {}, {:.0} s ({})",
            self.profile, self.seed, self.seconds, self.command
        );
        let queues: Vec<String> = self
            .shape
            .queues()
            .iter()
            .map(|(q, n)| format!("{q} {n}"))
            .collect();
        let _ = writeln!(
            s,
            "cluster: {} masters, {} managers, Redis {}; slots {}, batch {}, lease {} ms; \
             {} tasks/s, {} chains/s\n",
            self.shape.masters,
            self.shape.managers,
            self.shape.redis.name(),
            queues.join(", "),
            self.shape.batch_size,
            self.shape.lease_ms,
            self.rate,
            self.chain_rate
        );
        let _ = writeln!(
            s,
            "{:<39} {:>8} {:>10} {:>11} {:>8} {:>8}",
            "fault", "injected", "duplicates", "stale sett.", "not run", "problems"
        );
        for (kind, row) in &self.fault_table {
            let _ = writeln!(
                s,
                "{:<39} {:>8} {:>10} {:>11} {:>8} {:>8}",
                kind.label(),
                row.injected,
                row.duplicates,
                row.stale,
                row.not_run,
                row.problems
            );
        }
        let _ = writeln!(s);
    }

    /// What the oracles counted: tasks, chains, duplicates, the queues' counters, the
    /// records, the drain.
    fn counts(&self, s: &mut String) {
        let v = &self.verdict;
        let per: Vec<String> = self
            .tasks_by_queue
            .iter()
            .map(|(q, n)| format!("{n} {q}"))
            .collect();
        let _ = writeln!(
            s,
            "tasks {} ({}), acked {}, handled {} times; lost {}, unexpected {}, dead {}",
            v.enqueued,
            per.join(", "),
            v.acked,
            v.handlings,
            v.lost.len(),
            v.unexpected.len(),
            v.dead.len()
        );
        if let Some(ch) = &self.chains {
            let _ = writeln!(
                s,
                "chains {} ({} of an earlier life), {} follow-ups; {} read done with exactly \
                 their tasks; {} ids checked of the form ~cchain.N; {} problems",
                ch.chains,
                ch.earlier_lives,
                ch.follow_ups,
                ch.done,
                ch.ids_checked,
                ch.problems.len()
            );
        }
        let extra: usize = v.by_cause.values().sum::<usize>() + v.unexplained;
        let _ = writeln!(
            s,
            "duplicates: {} tasks handled more than once, {extra} extra handlings",
            v.duplicates.len()
        );
        for (label, n) in &self.duplicates_by_cause {
            let _ = writeln!(s, "  {label:<44} {n:>6}");
        }
        for (name, q) in &self.queue_stats {
            let _ = writeln!(
                s,
                "queue {name}: enqueued {}, acked {}, expired leases {}, stale settles {}, retried {}, dead {}",
                q.enqueued_total,
                q.acked_total,
                q.expired_total,
                q.stale_total,
                q.retried_total,
                q.dead_total
            );
        }
        let _ = writeln!(s, "attempts handled: {:?}", v.attempts);
        let r = &v.records;
        let _ = writeln!(
            s,
            "records: {} checked in {:.1} s, {} good, {} mismatched; {} takes: {} handled, {} \
             never reached the handler, {} handlings of an earlier life",
            r.checked,
            self.records_seconds,
            r.good,
            r.mismatches.len(),
            r.starts,
            r.matched,
            r.not_run,
            r.earlier_life
        );
        for (cause, n) in &r.not_run_by_cause {
            let _ = writeln!(s, "  not run: {:<35} {n:>6}", cause.label());
        }
        let _ = writeln!(
            s,
            "  {} lease expiries, {} retries; slot of {} handlings checked against /status; \
             take to handler at least {} ms",
            r.lease_expiries,
            r.retries,
            r.places_checked,
            r.take_to_handler_min_ms
                .map_or("-".to_string(), |m| m.to_string())
        );
        let _ = writeln!(
            s,
            "drained in {:.1} s; map epochs seen {:?}; processes left behind: {}",
            self.drain_seconds,
            self.epochs,
            self.leftovers.len()
        );
        for l in &self.leftovers {
            let _ = writeln!(s, "  left behind: {l}");
        }
    }

    /// The failovers: each kill and how long until work flowed again, then what they
    /// cost (lost, run twice, records wrong), the lost tasks first and loud.
    fn failovers(&self, s: &mut String) {
        let Some(fig) = &self.failover else { return };
        let _ = writeln!(
            s,
            "\nFAILOVERS on Redis {}, wait_replicas = {}, the primary {}: work must flow again \
             within {:.0} s of a kill ({})",
            fig.topology,
            fig.wait_replicas,
            if fig.freeze {
                "frozen, then woken"
            } else {
                "killed, then restarted"
            },
            fig.bound_s,
            fig.bound
        );
        let t = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.1} s"));
        for f in &fig.failovers {
            let _ = writeln!(
                s,
                "  #{} killed {}\n     promoted {}: failover logged after {} (named where the \
                 roles ask after {}), first take {}, first ack {} (the harness saw acks after \
                 {}), back as a replica after {}",
                f.n,
                f.killed,
                f.promoted.as_deref().unwrap_or("none"),
                t(f.declared_s),
                t(f.named_s),
                t(f.first_take_s),
                t(f.resumed_s),
                t(f.seen_flowing_s),
                t(f.rejoined_s)
            );
            for n in &f.notes {
                let _ = writeln!(s, "     {n}");
            }
        }
        let _ = writeln!(
            s,
            "  failovers Redis logged: {} for {} kills",
            fig.failovers_logged.len(),
            fig.failovers.len()
        );
        let v = &self.verdict;
        if !v.lost.is_empty() {
            let _ = writeln!(
                s,
                "  *** LOST {} ACKNOWLEDGED TASKS in the failovers ({}): {:?}",
                v.lost.len(),
                if fig.lost_fails() {
                    "wait_replicas ≥ 1: this fails the run"
                } else {
                    "wait_replicas = 0: counted, not failing the run"
                },
                &v.lost[..v.lost.len().min(20)]
            );
        } else {
            let _ = writeln!(s, "  lost: 0 acknowledged tasks");
        }
        let _ = writeln!(
            s,
            "  run twice: {} tasks ({} extra handlings after a failover, {} of them the same \
             attempt again: a take lost)",
            fig.run_twice,
            fig.again_after_failover + fig.same_attempt_again,
            fig.same_attempt_again
        );
        let _ = writeln!(
            s,
            "  records wrong near a failover: {}; chain problems: {}; counters that disagree: {}",
            fig.records_wrong.len(),
            fig.chains_wrong.len(),
            fig.counters_wrong.len()
        );
        for m in fig.records_wrong.iter().take(5) {
            let _ = writeln!(s, "    record {}: {}", m.id, m.problems.join("; "));
        }
        for p in fig.chains_wrong.iter().take(5) {
            let _ = writeln!(s, "    chain: {p}");
        }
        for p in fig.counters_wrong.iter().take(5) {
            let _ = writeln!(s, "    counters: {p}");
        }
    }

    /// What failed the run, each kind of failure at most a few times over.
    fn failures(&self, s: &mut String) {
        let v = &self.verdict;
        let r = &v.records;
        if !v.lost.is_empty() {
            let _ = writeln!(s, "LOST: {:?}", &v.lost[..v.lost.len().min(20)]);
        }
        if !v.unexpected.is_empty() {
            let _ = writeln!(
                s,
                "UNEXPECTED: {:?}",
                &v.unexpected[..v.unexpected.len().min(20)]
            );
        }
        for d in v
            .duplicates
            .iter()
            .filter(|d| d.causes.contains(&None))
            .take(10)
        {
            let _ = writeln!(s, "UNEXPLAINED duplicate {}: {:?}", d.id, d.handled);
        }
        for m in r.mismatches.iter().take(10) {
            let _ = writeln!(s, "RECORD MISMATCH {}: {}", m.id, m.problems.join("; "));
            for line in &m.record {
                let _ = writeln!(s, "    {line}");
            }
            for h in &m.handled {
                let _ = writeln!(
                    s,
                    "    handled as attempt {} at {} by slot pid {}",
                    h.attempt, h.t_ms, h.slot_pid
                );
            }
        }
        if r.mismatches.len() > 10 {
            let _ = writeln!(
                s,
                "… and {} more record mismatches (all in the JSON report)",
                r.mismatches.len() - 10
            );
        }
        for p in &self.problems {
            let _ = writeln!(s, "PROBLEM: {p}");
        }
    }
}
