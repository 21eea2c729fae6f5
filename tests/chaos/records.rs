//! The record oracle: every task of a tracked queue keeps a record in Redis with its state
//! and history, written by the same Lua step as each change of the task. After the drain,
//! each enqueued task's record must say done and tell the same story as the handler's
//! record and the fault log, down to every attempt.
//!
//! What the handler's record can see: the exec child writes a line for each task of a
//! batch as it reaches it, before running it. A take whose batch never reached the child
//! leaves a `running` entry and no line: the slot was killed (alone or with its master)
//! between the take and the child's line, the slot was frozen with the batch in hand, or
//! Redis ran the take and then died or was frozen before the slot read the reply. Such a
//! start is ended only by a lease expiry, so it is checked as that: a lease expiry after
//! it, and a fault of one of those kinds on its slot (or on Redis) between the take and
//! the expiry. Every other start is a handler run, matched one to one.
//!
//! A failover (the failover profile) can lose a record's last writes with the old
//! primary; `failover.rs` counts the mismatches near one as its cost instead of failing
//! the run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use gaffer::queue_client::{HistoryEntry, RecordState, TaskRecord};
use serde::Serialize;

use crate::faults::{Fault, FaultKind};
use crate::oracle::{Cause, Enqueued, Handled};

/// A slot process as the harness saw it in its master's `/status`: host and slot number.
pub type Place = (String, u32);

/// Tolerance between Redis's clock (history times) and the handler's (record lines):
/// both read this machine's wall clock, in whole milliseconds.
const CLOCK_SLACK_MS: i64 = 5;
/// How far a fault may end before the take it explains (a slot dying as its take runs).
const FAULT_SLACK_MS: i64 = 1000;
/// How far a done record's expiry may stray from its end plus `history_ttl` (a TTL is
/// read a few ms after the moment it is reckoned from).
const EXPIRY_SLACK_MS: i64 = 1000;

/// What the records of a run say, and where they disagree with the rest.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecordVerdict {
    /// Tasks whose record was looked up: every enqueued one.
    pub tasks: usize,
    /// Records found and checked (a missing one is a mismatch).
    pub checked: usize,
    /// Records that passed every check.
    pub good: usize,
    /// `running` entries, folded counts included: every take of a task in its record.
    pub starts: u64,
    /// Handler runs matched to their own `running` entry.
    pub matched: usize,
    /// Of those, runs whose slot pid the harness had seen, so that the entry's host and
    /// slot number were compared with the slot's.
    pub places_checked: usize,
    /// Starts no handler run matches: the batch never reached the handler.
    pub not_run: usize,
    /// Those starts per fault that explains them.
    pub not_run_by_cause: BTreeMap<Cause, usize>,
    /// Those starts per fault (index in the fault log).
    pub not_run_by_fault: BTreeMap<usize, usize>,
    /// Handler runs of an earlier life of a re-created task (its record is the new one's).
    pub earlier_life: usize,
    /// `waiting` entries that record a lease expiry (folded counts included).
    pub lease_expiries: u64,
    /// `waiting` entries after a run with another note (a retry).
    pub retries: u64,
    /// Smallest gap from a take (Redis's clock) to its handler run (the handler's).
    pub take_to_handler_min_ms: Option<i64>,
    /// Records that failed a check, each with what was seen.
    pub mismatches: Vec<RecordMismatch>,
}

/// A record that disagrees with the handler, the fault log or the rules of its history.
#[derive(Debug, Clone, Serialize)]
pub struct RecordMismatch {
    /// Task id.
    pub id: String,
    /// Every check it failed.
    pub problems: Vec<String>,
    /// The record: state, attempt, error, then its history one entry a line.
    pub record: Vec<String>,
    /// The handler's runs of the task.
    pub handled: Vec<Handled>,
}

/// One history entry, times in Unix ms (comparable with the fault log and the handler).
#[derive(Debug, Clone)]
struct Entry {
    state: RecordState,
    at: i64,
    attempt: u32,
    host: Option<String>,
    slot: Option<u32>,
    note: Option<String>,
    count: u64,
}

impl Entry {
    fn from(h: &HistoryEntry) -> Option<Entry> {
        Some(Entry {
            state: h.state,
            at: ms(&h.at)?,
            attempt: h.attempt,
            host: h.host.clone(),
            slot: h.slot,
            note: h.note.clone(),
            count: h.count.unwrap_or(1),
        })
    }

    fn place(&self) -> String {
        format!(
            "{}/{}",
            self.host.as_deref().unwrap_or("-"),
            self.slot.map_or("-".into(), |s| s.to_string())
        )
    }

    fn show(&self) -> String {
        let mut s = format!(
            "{} attempt {} on {} at {}",
            self.state,
            self.attempt,
            self.place(),
            self.at
        );
        if let Some(n) = &self.note {
            s.push_str(&format!(" note {n:?}"));
        }
        if self.count > 1 {
            s.push_str(&format!(" ×{}", self.count));
        }
        s
    }
}

fn ms(rfc3339: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// Everything the record check needs beside the records.
pub struct Inputs<'a> {
    /// What the producer got acknowledged.
    pub enqueued: &'a [Enqueued],
    /// The handler's record, in time order.
    pub handled: &'a [Handled],
    /// Every enqueued id's record (None: it has none).
    pub records: &'a HashMap<String, Option<TaskRecord>>,
    /// When every enqueued id's record is due to go (Unix ms; None: never).
    pub expiries: &'a HashMap<String, Option<i64>>,
    /// The fault log.
    pub faults: &'a [Fault],
    /// Every slot process seen: pid to host and slot number (a pid may be reused).
    pub places: &'a HashMap<u32, BTreeSet<Place>>,
    /// The masters' host names.
    pub hosts: &'a BTreeSet<String>,
    /// max_attempts every task was enqueued with.
    pub max_attempts: u32,
    /// The queue's history_ttl.
    pub history_ttl: Duration,
}

/// Checks every enqueued task's record.
pub fn check(inp: &Inputs) -> RecordVerdict {
    let mut v = RecordVerdict {
        tasks: inp.enqueued.len(),
        ..RecordVerdict::default()
    };
    let mut by_id: HashMap<&str, Vec<&Handled>> = HashMap::new();
    for h in inp.handled {
        by_id.entry(&h.id).or_default().push(h);
    }
    for e in inp.enqueued {
        let runs = by_id.get(e.id.as_str()).map_or(&[][..], Vec::as_slice);
        let record = inp.records.get(&e.id).and_then(Option::as_ref);
        if record.is_some() {
            v.checked += 1;
        }
        let problems = match record {
            None => vec!["no record".to_string()],
            Some(r) => check_one(inp, e, r, runs, &mut v),
        };
        if problems.is_empty() {
            v.good += 1;
        } else {
            v.mismatches.push(RecordMismatch {
                id: e.id.clone(),
                problems,
                record: record.map_or_else(Vec::new, show_record),
                handled: runs.iter().map(|h| (*h).clone()).collect(),
            });
        }
    }
    v
}

fn show_record(r: &TaskRecord) -> Vec<String> {
    let mut out = vec![format!(
        "state {}, attempt {}, max_attempts {}, created {}, error {:?}",
        r.state,
        r.attempt,
        r.max_attempts,
        ms(&r.created_at).unwrap_or(0),
        r.error
    )];
    for h in r.history.iter().flatten() {
        out.push(match Entry::from(h) {
            Some(e) => e.show(),
            None => format!("unreadable entry {h:?}"),
        });
    }
    out
}

/// The problems of one record; adds its figures to `v`.
fn check_one(
    inp: &Inputs,
    e: &Enqueued,
    r: &TaskRecord,
    runs: &[&Handled],
    v: &mut RecordVerdict,
) -> Vec<String> {
    let mut p = Vec::new();
    if r.state != RecordState::Done {
        p.push(format!("state {} after the drain, not done", r.state));
    }
    if r.max_attempts != inp.max_attempts {
        p.push(format!(
            "max_attempts {}, enqueued with {}",
            r.max_attempts, inp.max_attempts
        ));
    }
    let Some(history) = r.history.as_ref().filter(|h| !h.is_empty()) else {
        p.push("no history".into());
        return p;
    };
    let Some(hist) = history.iter().map(Entry::from).collect::<Option<Vec<_>>>() else {
        p.push("a history entry with an unreadable time".into());
        return p;
    };
    let Some(created) = ms(&r.created_at) else {
        p.push(format!("unreadable created_at {:?}", r.created_at));
        return p;
    };

    // The shape: created waiting, then (running, waiting)* running done.
    let first = &hist[0];
    if first.state != RecordState::Waiting
        || first.attempt != 0
        || first.note.is_some()
        || first.host.is_some()
        || first.count != 1
    {
        p.push(format!(
            "history starts with {}, not as created (waiting, attempt 0)",
            first.show()
        ));
    }
    if (first.at - created).abs() > CLOCK_SLACK_MS {
        p.push(format!(
            "first entry at {}, record created at {created}",
            first.at
        ));
    }
    let last = hist.last().expect("not empty");
    if last.state != RecordState::Done {
        p.push(format!("history ends with {}, not done", last.show()));
    }
    // Index of each running entry, and what follows it.
    let mut running: Vec<usize> = Vec::new();
    let mut last_note: Option<&str> = None;
    for (i, en) in hist.iter().enumerate() {
        if en.count > 1 {
            // Folded: the same transition twice in a row. No state of this suite can
            // follow itself (a take needs a waiting task, an expiry or retry a leased one).
            p.push(format!(
                "entry {i} folds {} identical transitions",
                en.count
            ));
        }
        if i == 0 {
            continue;
        }
        let prev = &hist[i - 1];
        if en.at < prev.at {
            p.push(format!(
                "entry {i} at {} is before entry {} at {}",
                en.at,
                i - 1,
                prev.at
            ));
        }
        if en.attempt < prev.attempt {
            p.push(format!(
                "attempt goes down from {} to {} at entry {i}",
                prev.attempt, en.attempt
            ));
        }
        match en.state {
            RecordState::Running => {
                v.starts += en.count;
                running.push(i);
                if prev.state != RecordState::Waiting {
                    p.push(format!("entry {i}: taken while {}", prev.state));
                }
                if en.attempt != prev.attempt + 1 {
                    p.push(format!(
                        "entry {i}: taken as attempt {} after waiting as attempt {}",
                        en.attempt, prev.attempt
                    ));
                }
                if !en.host.as_ref().is_some_and(|h| inp.hosts.contains(h)) || en.slot.is_none() {
                    p.push(format!(
                        "entry {i}: running on {}, not a slot of a host of the run",
                        en.place()
                    ));
                }
                if en.note.is_some() {
                    p.push(format!("entry {i}: running with a note {:?}", en.note));
                }
            }
            RecordState::Waiting | RecordState::Done => {
                let what = en.state;
                if prev.state != RecordState::Running {
                    p.push(format!("entry {i}: {what} after {}", prev.state));
                    continue;
                }
                // Ended by the slot that ran it (its settle) or by the expiry of the
                // lease it held, which names that slot.
                if en.attempt != prev.attempt || en.host != prev.host || en.slot != prev.slot {
                    p.push(format!(
                        "entry {i}: {what} as attempt {} on {}, after running as attempt {} on {}",
                        en.attempt,
                        en.place(),
                        prev.attempt,
                        prev.place()
                    ));
                }
                if what == RecordState::Done {
                    if en.note.is_some() {
                        p.push(format!("entry {i}: done with a note {:?}", en.note));
                    }
                    continue;
                }
                match en.note.as_deref() {
                    None => p.push(format!(
                        "entry {i}: waiting again after attempt {} without a note",
                        prev.attempt
                    )),
                    Some(n) if n.starts_with("lease expired") => {
                        v.lease_expiries += en.count;
                        let want = format!("lease expired on attempt {}", prev.attempt);
                        if n != want {
                            p.push(format!("entry {i}: note {n:?}, expected {want:?}"));
                        }
                    }
                    Some(_) => v.retries += en.count,
                }
                last_note = en.note.as_deref();
            }
            other => p.push(format!(
                "entry {i}: {other}, which nothing in this run does"
            )),
        }
    }
    let last_run = running.last().map(|&i| &hist[i]);
    match last_run {
        Some(lr) if lr.attempt != r.attempt => p.push(format!(
            "the record says attempt {}, its last running entry {}",
            r.attempt, lr.attempt
        )),
        None => p.push("no running entry".into()),
        _ => {}
    }
    if r.error.as_deref() != last_note {
        p.push(format!(
            "error {:?}, while the last note of its history is {:?}",
            r.error, last_note
        ));
    }

    // It goes history_ttl after its end.
    let want = last.at + inp.history_ttl.as_millis() as i64;
    match inp.expiries.get(&e.id).copied().flatten() {
        Some(at) if (at - want).abs() > EXPIRY_SLACK_MS => p.push(format!(
            "due to go at {at}, not history_ttl after its end at {} ({want})",
            last.at
        )),
        Some(_) => {}
        None => p.push("never goes: no TTL and not in the expiry index".into()),
    }

    // Handler runs against running entries, one to one by attempt.
    let mut unmatched: BTreeMap<u32, usize> =
        running.iter().map(|&i| (hist[i].attempt, i)).collect();
    for h in runs {
        if h.t_ms < created as u64 {
            // Before this record's task was created: an earlier life, which only an
            // enqueue retried after an unanswered call can explain.
            v.earlier_life += 1;
            if e.calls <= 1 {
                p.push(format!(
                    "handled at {} as attempt {}, before the task was created at {created} \
                     (and it was enqueued in one call)",
                    h.t_ms, h.attempt
                ));
            }
            continue;
        }
        let Some(i) = unmatched.remove(&h.attempt) else {
            p.push(format!(
                "handled as attempt {} at {} by slot pid {}, which no running entry (left) shows",
                h.attempt, h.t_ms, h.slot_pid
            ));
            continue;
        };
        v.matched += 1;
        let en = &hist[i];
        let gap = h.t_ms as i64 - en.at;
        v.take_to_handler_min_ms = Some(v.take_to_handler_min_ms.map_or(gap, |m| m.min(gap)));
        if gap < -CLOCK_SLACK_MS {
            p.push(format!(
                "handled as attempt {} at {}, before its take at {}",
                h.attempt, h.t_ms, en.at
            ));
        }
        if let Some(seen) = inp.places.get(&h.slot_pid) {
            v.places_checked += 1;
            let here = (en.host.clone().unwrap_or_default(), en.slot.unwrap_or(0));
            if !seen.contains(&here) {
                p.push(format!(
                    "attempt {} ran in slot pid {} ({}), the record says {}",
                    h.attempt,
                    h.slot_pid,
                    seen.iter()
                        .map(|(h, s)| format!("{h}/{s}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    en.place()
                ));
            }
        }
    }
    // Starts the handler never received: ended by a lease expiry, cut short by a fault.
    for (attempt, i) in unmatched {
        v.not_run += 1;
        let en = &hist[i];
        let next = hist.get(i + 1);
        let expired = next.is_some_and(|n| {
            n.state == RecordState::Waiting
                && n.note
                    .as_deref()
                    .is_some_and(|n| n.starts_with("lease expired"))
        });
        if !expired {
            p.push(format!(
                "attempt {attempt} never reached the handler, yet ended as {}",
                next.map_or("nothing".into(), Entry::show)
            ));
            continue;
        }
        let to = next.map_or(en.at, |n| n.at);
        match not_run_cause(en, to, inp.faults) {
            Some((cause, fault)) => {
                *v.not_run_by_cause.entry(cause).or_default() += 1;
                *v.not_run_by_fault.entry(fault).or_default() += 1;
            }
            None => p.push(format!(
                "attempt {attempt} taken on {} at {} never reached the handler, and no fault \
                 hit that slot, its master or Redis before its lease expired at {to}",
                en.place(),
                en.at
            )),
        }
    }
    p
}

/// The fault that kept a take from reaching the handler, with its index in the log: one
/// on its slot, its master or Redis between the take (`en.at`) and the lease's expiry.
fn not_run_cause(en: &Entry, expired: i64, faults: &[Fault]) -> Option<(Cause, usize)> {
    let overlaps =
        |f: &Fault| f.start_ms as i64 <= expired && f.end_ms as i64 + FAULT_SLACK_MS >= en.at;
    let on_host = |f: &Fault| f.host.is_some() && f.host == en.host;
    let on_slot = |f: &Fault| on_host(f) && f.slot.is_some() && f.slot == en.slot;
    let kinds = [
        (FaultKind::SlotKill, Cause::SlotKilled),
        (FaultKind::MasterKill, Cause::MasterKilled),
        (FaultKind::SlotStop, Cause::SlotStopped),
        (FaultKind::RedisKill, Cause::RedisKilled),
        (FaultKind::RedisStop, Cause::RedisStopped),
        (FaultKind::MasterTermInOutage, Cause::MasterStoppedInOutage),
        (FaultKind::Failover, Cause::Failover),
    ];
    kinds.into_iter().find_map(|(kind, cause)| {
        faults
            .iter()
            .position(|f| {
                f.kind == kind
                    && f.injected
                    && overlaps(f)
                    && match kind {
                        FaultKind::SlotKill | FaultKind::SlotStop => on_slot(f),
                        FaultKind::MasterKill => on_host(f),
                        _ => true,
                    }
            })
            .map(|i| (cause, i))
    })
}

/// Checks the checker: a good history passes, and each way a record can be wrong is
/// caught. Runs before every run (milliseconds); returns what it failed to catch.
pub fn selftest() -> Vec<String> {
    use gaffer::queue_client::rfc3339;
    const TTL: Duration = Duration::from_secs(7 * 24 * 3600);
    let entry =
        |state, at: i64, attempt, place: Option<(&str, u32)>, note: Option<&str>| HistoryEntry {
            state,
            at: rfc3339(at),
            attempt,
            host: place.map(|p| p.0.to_string()),
            slot: place.map(|p| p.1),
            note: note.map(String::from),
            count: None,
        };
    use RecordState::{Done, Running, Waiting};
    let expired = Some("lease expired on attempt 1");
    // Taken on h1/2, its slot killed before the handler got it, taken again on h2/1.
    let good_history = vec![
        entry(Waiting, 1000, 0, None, None),
        entry(Running, 2000, 1, Some(("h1", 2)), None),
        entry(Waiting, 7000, 1, Some(("h1", 2)), expired),
        entry(Running, 7000, 2, Some(("h2", 1)), None),
        entry(Done, 7500, 2, Some(("h2", 1)), None),
    ];
    let good_record = TaskRecord {
        id: "t1".into(),
        queue: "chaos".into(),
        state: Done,
        priority: 0,
        attempt: 2,
        max_attempts: 100,
        created_at: rfc3339(1000),
        due_at: rfc3339(1000),
        updated_at: rfc3339(7500),
        submitted_by: None,
        error: expired.map(String::from),
        result: None,
        chain: None,
        history: Some(good_history),
    };
    let good_run = Handled {
        queue: "chaos".into(),
        id: "t1".into(),
        attempt: 2,
        slot_pid: 21,
        t_ms: 7100,
    };
    let mut kill = Fault::new(FaultKind::SlotKill);
    (kill.start_ms, kill.end_ms) = (2500, 2500);
    (kill.host, kill.slot) = (Some("h1".into()), Some(2));
    let hosts: BTreeSet<String> = ["h1", "h2", "h3"].map(String::from).into();
    let good_places: HashMap<u32, BTreeSet<Place>> = [(21, [("h2".to_string(), 1)].into())].into();
    let good_expiry = 7500 + TTL.as_millis() as i64;

    type Mutant = (
        &'static str,
        Box<
            dyn Fn(
                &mut Option<TaskRecord>,
                &mut Vec<Handled>,
                &mut Vec<Fault>,
                &mut HashMap<u32, BTreeSet<Place>>,
                &mut Option<i64>,
            ),
        >,
    );
    fn rec(r: &mut Option<TaskRecord>) -> &mut TaskRecord {
        r.as_mut().expect("a record")
    }
    fn hist(r: &mut Option<TaskRecord>) -> &mut Vec<HistoryEntry> {
        rec(r).history.as_mut().expect("a history")
    }
    let mutants: Vec<Mutant> = vec![
        ("as it should be", Box::new(|_, _, _, _, _| {})),
        ("no record", Box::new(|r, _, _, _, _| *r = None)),
        (
            "not done",
            Box::new(|r, _, _, _, _| {
                let r = rec(r);
                r.state = Running;
                r.history.as_mut().unwrap().pop();
            }),
        ),
        (
            "a run no entry shows",
            Box::new(|_, h, _, _, _| {
                h.push(Handled {
                    attempt: 3,
                    t_ms: 7200,
                    ..h[0].clone()
                })
            }),
        ),
        (
            "handled twice as one attempt",
            Box::new(|_, h, _, _, _| {
                h.push(Handled {
                    t_ms: 7200,
                    ..h[0].clone()
                })
            }),
        ),
        (
            "a start no fault explains",
            Box::new(|_, _, f, _, _| f.clear()),
        ),
        (
            "a kill of another slot",
            Box::new(|_, _, f, _, _| f[0].slot = Some(3)),
        ),
        (
            "a kill long before the take",
            Box::new(|_, _, f, _, _| (f[0].start_ms, f[0].end_ms) = (500, 500)),
        ),
        (
            "a start the handler never got, acked",
            Box::new(|r, h, _, _, _| {
                h.clear();
                let _ = r;
            }),
        ),
        (
            "waiting again without a note",
            Box::new(|r, _, _, _, _| hist(r)[2].note = None),
        ),
        (
            "an expiry naming another attempt",
            Box::new(|r, _, _, _, _| hist(r)[2].note = Some("lease expired on attempt 2".into())),
        ),
        (
            "running on a host not of the run",
            Box::new(|r, _, _, _, _| hist(r)[3].host = Some("h9".into())),
        ),
        (
            "running without a slot",
            Box::new(|r, _, _, _, _| hist(r)[1].slot = None),
        ),
        (
            "done by another slot",
            Box::new(|r, _, _, _, _| hist(r)[4].slot = Some(3)),
        ),
        (
            "the record's attempt is not the last run's",
            Box::new(|r, _, _, _, _| rec(r).attempt = 3),
        ),
        (
            "a folded start",
            Box::new(|r, _, _, _, _| hist(r)[3].count = Some(2)),
        ),
        (
            "attempts going down",
            Box::new(|r, _, _, _, _| hist(r)[4].attempt = 1),
        ),
        (
            "handled before it was created, though enqueued in one call",
            Box::new(|_, h, _, _, _| {
                h.push(Handled {
                    attempt: 1,
                    t_ms: 900,
                    ..h[0].clone()
                })
            }),
        ),
        (
            "taken twice without a waiting between",
            Box::new(|r, _, _, _, _| {
                hist(r).remove(2);
            }),
        ),
        (
            "times going back",
            Box::new(|r, _, _, _, _| hist(r)[4].at = rfc3339(6000)),
        ),
        (
            "handled before its take",
            Box::new(|_, h, _, _, _| h[0].t_ms = 6900),
        ),
        (
            "handled by another slot",
            Box::new(|_, _, _, p, _| {
                p.insert(21, [("h3".to_string(), 1)].into());
            }),
        ),
        (
            "an error that is not the last note",
            Box::new(|r, _, _, _, _| rec(r).error = None),
        ),
        ("no expiry", Box::new(|_, _, _, _, t| *t = None)),
        (
            "an expiry not history_ttl after its end",
            Box::new(|_, _, _, _, t| *t = t.map(|t| t - 60_000)),
        ),
        (
            "another max_attempts",
            Box::new(|r, _, _, _, _| rec(r).max_attempts = 5),
        ),
    ];
    let mut failed = Vec::new();
    for (i, (name, mutate)) in mutants.iter().enumerate() {
        let mut record = Some(good_record.clone());
        let mut handled = vec![good_run.clone()];
        let mut faults = vec![kill.clone()];
        let mut places = good_places.clone();
        let mut expiry = Some(good_expiry);
        mutate(
            &mut record,
            &mut handled,
            &mut faults,
            &mut places,
            &mut expiry,
        );
        let enqueued = [Enqueued {
            queue: "chaos".into(),
            id: "t1".into(),
            acked_ms: 1000,
            calls: 1,
            existed: false,
            chain: None,
        }];
        let records = [("t1".to_string(), record)].into();
        let expiries = [("t1".to_string(), expiry)].into();
        let v = check(&Inputs {
            enqueued: &enqueued,
            handled: &handled,
            records: &records,
            expiries: &expiries,
            faults: &faults,
            places: &places,
            hosts: &hosts,
            max_attempts: 100,
            history_ttl: TTL,
        });
        match (i, v.mismatches.first()) {
            (0, Some(m)) => failed.push(format!("a good record fails: {:?}", m.problems)),
            (0, None) if v.not_run != 1 || v.matched != 1 => {
                failed.push(format!("a good record miscounted: {v:?}"))
            }
            (i, None) if i > 0 => failed.push(format!("not caught: {name}")),
            _ => {}
        }
    }
    failed
}
