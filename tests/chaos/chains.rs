//! The chain workload: every task the producer sends to [`CHAIN_QUEUE`] is the global
//! task of a chain of its own (the queue has a `next` route), and every chain has the
//! same four tasks, told by the payloads the global task carries (the exec handler
//! answers a payload's `result` and `next` as its own):
//!
//! ```text
//! G (chain)  ──route──▶  C~1 (step)  ──handler──▶  C~1~1 (step)
//!            ──handler─▶ C~2 (step)
//! ```
//!
//! where `C` is the chain's id, `~cchain.N`, minted by G's enqueue from its record
//! number. G fans out (the route's follow-up first, then the handler's), and C~1 makes a
//! follow-up of its own, so a chain has two steps past its global task. Each follow-up's
//! result names its global task and its place (`{"of": G, "at": "~1"}`), so the check can
//! tell that every follow-up was made from the right parent's run.
//!
//! The oracle, besides the plain one that every task of a chain goes through (lost,
//! duplicates with causes, records): every chain the run started has exactly its three
//! follow-ups, no more (the step queue's counter of created tasks equals three per
//! chain: a follow-up is made once, ARCHITECTURE.md invariant 32); the chain's reader
//! (`gaffer::chain::read`) lists exactly its four tasks with their parents and says it is
//! done; every record names the chain, a follow-up's its submitter `chain:C`; and every
//! chain id has the form `~cchain.N` on either topology (invariant 37).
//!
//! A global task re-created by a retried enqueue (its first life done before the retry
//! came: `Cause::EnqueueRetried`) gets a new number, so a new chain; its first life's
//! chain is found from the follow-ups the handler ran (their results name their global
//! task) and must be whole too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use gaffer::chain::{ChainState, DERIVED_SEP};
use gaffer::queue_client::{CHAIN_ID_PREFIX, TaskRecord, chain_origin};
use serde::Serialize;
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::oracle::{Enqueued, Handled};
use crate::rng::Rng;

/// Every task's record (None: it has none), by id.
type Records = HashMap<String, Option<TaskRecord>>;

/// The queue of the chains' global tasks: its route makes each one's first follow-up.
pub const CHAIN_QUEUE: &str = "chain";
/// The queue of every follow-up.
pub const STEP_QUEUE: &str = "step";
/// Slots of [`CHAIN_QUEUE`].
pub const CHAIN_SLOTS: u32 = 2;
/// Slots of [`STEP_QUEUE`]: three follow-ups per global task.
pub const STEP_SLOTS: u32 = 3;
/// Each chain's follow-ups: the part their id adds to the chain's, and their parent's
/// (None: the global task). The route's first, then the global task handler's, then the
/// one its first follow-up's handler makes.
pub const FOLLOW_UPS: [(&str, Option<&str>); 3] =
    [("~1", None), ("~2", None), ("~1~1", Some("~1"))];

/// The global task `gid`'s payload: it and each follow-up sleep 20–400 ms, and it says
/// what each of them answers (see the module doc).
pub fn payload(gid: &str, rng: &mut Rng) -> String {
    let mut sleep = || rng.range(20, 400);
    let done = |at: &str| json!({"of": gid, "at": at});
    let grandchild = json!({"action": "sleep", "ms": sleep(), "result": done("~1~1")});
    let route = json!({
        "action": "sleep", "ms": sleep(), "result": done("~1"),
        "next": [{"queue": STEP_QUEUE, "payload": grandchild}],
    });
    let second = json!({"action": "sleep", "ms": sleep(), "result": done("~2")});
    json!({
        "action": "sleep", "ms": sleep(), "result": route,
        "next": [{"queue": STEP_QUEUE, "payload": second}],
    })
    .to_string()
}

/// One chain the run must have made whole.
#[derive(Debug, Clone, Serialize)]
pub struct ChainCase {
    /// Its id, `~cchain.N`.
    pub id: String,
    /// Its global task's id.
    pub global: String,
    /// The chain of an earlier life of its global task, whose record is now the later
    /// life's: its members are read from the step queue's list of it alone.
    pub earlier_life: bool,
}

impl ChainCase {
    /// Its follow-ups as tasks to account for: they go through the plain oracle and the
    /// record check as the producer's tasks do, each created once (one call).
    pub fn follow_ups(&self) -> Vec<Enqueued> {
        FOLLOW_UPS
            .iter()
            .map(|(at, _)| Enqueued {
                queue: STEP_QUEUE.into(),
                id: format!("{}{at}", self.id),
                acked_ms: 0,
                calls: 1,
                existed: false,
                chain: Some(self.id.clone()),
            })
            .collect()
    }

    /// Its members as its reader should list them: (queue, id, parent's id), the global
    /// task first.
    fn expected(&self) -> BTreeSet<(String, String, Option<String>)> {
        let mut out = BTreeSet::new();
        out.insert((CHAIN_QUEUE.to_string(), self.global.clone(), None));
        for (at, parent) in FOLLOW_UPS {
            let parent = match parent {
                None => self.global.clone(),
                Some(p) => format!("{}{p}", self.id),
            };
            out.insert((
                STEP_QUEUE.to_string(),
                format!("{}{at}", self.id),
                Some(parent),
            ));
        }
        out
    }
}

/// The chain a follow-up's id names: the `~cQUEUE.N` before its first `~N`.
pub fn chain_of(id: &str) -> Option<&str> {
    let rest = id.strip_prefix(CHAIN_ID_PREFIX)?;
    let end = rest.find(DERIVED_SEP)?;
    Some(&id[..CHAIN_ID_PREFIX.len() + end])
}

/// Whether `chain` has the one form a chain id has: `~cchain.N`, N a record number.
pub fn minted(chain: &str) -> bool {
    chain_origin(chain).is_some_and(|(q, n)| q == CHAIN_QUEUE && chain == format!("~c{q}.{n}"))
}

/// The chains the run must have made: one per global task, named by its record, and one
/// per earlier life of a re-created global task, found by the follow-ups the handler ran
/// (their results name the global task). Returns them and what does not add up.
pub fn cases(
    c: &Cluster,
    enqueued: &[Enqueued],
    records: &Records,
    handled: &[Handled],
) -> (Vec<ChainCase>, Vec<String>) {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    let globals: HashMap<&str, &Enqueued> = enqueued
        .iter()
        .filter(|e| e.queue == CHAIN_QUEUE)
        .map(|e| (e.id.as_str(), e))
        .collect();
    for e in globals.values() {
        let chain = records
            .get(&e.id)
            .and_then(Option::as_ref)
            .and_then(|r| r.chain.clone());
        match chain {
            Some(id) => out.push(ChainCase {
                id,
                global: e.id.clone(),
                earlier_life: false,
            }),
            None => problems.push(format!("global task {}: its record names no chain", e.id)),
        }
    }
    let known: BTreeSet<&str> = out.iter().map(|k| k.id.as_str()).collect();
    let mut unknown: BTreeMap<&str, &str> = BTreeMap::new();
    for h in handled.iter().filter(|h| h.queue == STEP_QUEUE) {
        if let Some(chain) = chain_of(&h.id).filter(|ch| !known.contains(ch)) {
            unknown.entry(chain).or_insert(&h.id);
        }
    }
    for (chain, id) in unknown {
        let rec = c
            .call(Duration::from_secs(5), c.queue(STEP_QUEUE).record(id))
            .flatten();
        let of = rec.as_ref().and_then(|r| r.result.as_ref()?["of"].as_str());
        match of.and_then(|g| globals.get(g)) {
            Some(g) if g.calls > 1 => out.push(ChainCase {
                id: chain.to_string(),
                global: g.id.clone(),
                earlier_life: true,
            }),
            _ => problems.push(format!(
                "follow-ups of chain {chain} (such as {id}, made for {of:?}) ran, and no \
                 global task's enqueue can have started it"
            )),
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    (out, problems)
}

/// What the chain check found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChainVerdict {
    /// Chains checked.
    pub chains: usize,
    /// Of those, chains of an earlier life of their global task.
    pub earlier_lives: usize,
    /// Follow-ups they should have (three each).
    pub follow_ups: usize,
    /// Chains their reader said are done, listing exactly their tasks.
    pub done: usize,
    /// Chain ids seen (the records' and the ids' they derive), all `~cchain.N`.
    pub ids_checked: usize,
    /// Everything that did not add up, by chain.
    pub problems: Vec<String>,
}

/// What Redis says of one chain: its members as listed (queue, id, parent's id; the
/// global task with none) and, read through the chain's reader, its state.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Its members, each as many times as listed.
    pub members: Vec<(String, String, Option<String>)>,
    /// Its state as its reader says (None: not read that way, an earlier life).
    pub state: Option<ChainState>,
}

/// Checks every chain: its members and state as Redis lists them, and the records of its
/// tasks (read already, by id). `answers` holds the chain id each global task's enqueue
/// answered with, when it created the task.
pub fn check(
    c: &Cluster,
    cases: &[ChainCase],
    records: &Records,
    answers: &HashMap<String, String>,
) -> ChainVerdict {
    let mut v = ChainVerdict {
        chains: cases.len(),
        earlier_lives: cases.iter().filter(|k| k.earlier_life).count(),
        follow_ups: cases.len() * FOLLOW_UPS.len(),
        ..ChainVerdict::default()
    };
    let seen = read_all(c, cases);
    let mut numbers = BTreeSet::new();
    for (case, seen) in cases.iter().zip(seen) {
        let Some(seen) = seen else {
            v.problems
                .push(format!("chain {}: Redis did not answer its reads", case.id));
            continue;
        };
        if !numbers.insert(case.id.clone()) {
            v.problems.push(format!("chain {}: checked twice", case.id));
        }
        let p = check_one(case, &seen, records, answers.get(&case.global));
        v.ids_checked += 1 + FOLLOW_UPS.len();
        if p.is_empty() && seen.state == Some(ChainState::Done) {
            v.done += 1;
        }
        v.problems
            .extend(p.into_iter().map(|p| format!("chain {}: {p}", case.id)));
    }
    v
}

/// Reads what Redis says of every chain, 50 at a time: through the chain's reader, or for
/// an earlier life (whose global task's record is another chain's now) the step queue's
/// list of it.
fn read_all(c: &Cluster, cases: &[ChainCase]) -> Vec<Option<Seen>> {
    let targets = c.targets();
    let step = c.queue(STEP_QUEUE);
    let mut out = Vec::with_capacity(cases.len());
    for chunk in cases.chunks(50) {
        let reads = chunk.iter().map(|case| {
            let targets = &targets;
            async move {
                if case.earlier_life {
                    let ids = step.chain_members(&case.id).await?;
                    return Ok(Some(listed_only(case, ids)));
                }
                let view = gaffer::chain::read(&c.monitor, targets, &case.id).await?;
                Ok(Some(view.map_or_else(Seen::default, |view| {
                    Seen {
                        state: Some(view.state),
                        members: view
                            .tasks
                            .into_iter()
                            .map(|t| (t.member.queue, t.member.id, t.parent.map(|p| p.id)))
                            .collect(),
                    }
                })))
            }
        });
        let found = c.call(
            Duration::from_secs(60),
            futures::future::try_join_all(reads),
        );
        match found {
            Some(found) => out.extend(found),
            None => out.extend(chunk.iter().map(|_| None)),
        }
    }
    out
}

/// An earlier life's chain as the step queue lists it: its global task (in no list) and
/// each listed follow-up under the parent its id derives from.
fn listed_only(case: &ChainCase, ids: Vec<String>) -> Seen {
    let mut members = vec![(CHAIN_QUEUE.to_string(), case.global.clone(), None)];
    for id in ids {
        let parent = id
            .rsplit_once(DERIVED_SEP)
            .map(|(p, _)| p)
            .filter(|p| *p != case.id)
            .map_or(case.global.clone(), str::to_string);
        members.push((STEP_QUEUE.to_string(), id, Some(parent)));
    }
    Seen {
        members,
        state: None,
    }
}

/// The problems of one chain.
fn check_one(
    case: &ChainCase,
    seen: &Seen,
    records: &Records,
    answer: Option<&String>,
) -> Vec<String> {
    let mut p = Vec::new();
    if !minted(&case.id) {
        p.push("its id is not of the form ~cchain.N".into());
    }
    let listed: BTreeSet<_> = seen.members.iter().cloned().collect();
    if listed.len() != seen.members.len() {
        p.push(format!("a task listed twice: {:?}", seen.members));
    }
    let want = case.expected();
    if listed != want {
        p.push(format!(
            "lists {:?} (task, parent), not {:?}",
            listed.iter().map(|m| (&m.1, &m.2)).collect::<Vec<_>>(),
            want.iter().map(|m| (&m.1, &m.2)).collect::<Vec<_>>()
        ));
    }
    if !case.earlier_life && seen.state != Some(ChainState::Done) {
        p.push(format!("its reader says {:?}, not done", seen.state));
    }
    let record = |id: &str| records.get(id).and_then(Option::as_ref);
    if !case.earlier_life {
        match record(&case.global) {
            Some(r) => p.extend(global_problems(case, r, answer)),
            None => p.push(format!("no record of its global task {}", case.global)),
        }
    }
    for (at, _) in FOLLOW_UPS {
        let id = format!("{}{at}", case.id);
        // (a missing record is the record check's to report)
        if let Some(r) = record(&id) {
            p.extend(follow_up_problems(case, at, r));
        }
    }
    p
}

/// What is wrong with the record of a chain's global task.
fn global_problems(case: &ChainCase, r: &TaskRecord, answer: Option<&String>) -> Vec<String> {
    let mut p = Vec::new();
    if r.chain.as_deref() != Some(&case.id) {
        p.push(format!(
            "its global task's record names chain {:?}",
            r.chain
        ));
    }
    if r.submitted_by.is_some() {
        p.push(format!(
            "its global task's record names a submitter {:?}",
            r.submitted_by
        ));
    }
    if let Some(a) = answer.filter(|a| **a != case.id) {
        p.push(format!("its global task's enqueue answered chain {a}"));
    }
    let made_for = r.result.as_ref().map(|v| &v["result"]["of"]);
    if made_for != Some(&Value::String(case.global.clone())) {
        p.push(format!("its global task's result is {:?}", r.result));
    }
    p
}

/// What is wrong with the record of follow-up `at` of a chain.
fn follow_up_problems(case: &ChainCase, at: &str, r: &TaskRecord) -> Vec<String> {
    let mut p = Vec::new();
    let id = format!("{}{at}", case.id);
    if r.chain.as_deref() != Some(&case.id) {
        p.push(format!("{id}'s record names chain {:?}", r.chain));
    }
    let by = format!("chain:{}", case.id);
    if r.submitted_by.as_deref() != Some(&by) {
        p.push(format!(
            "{id}'s record names submitter {:?}",
            r.submitted_by
        ));
    }
    if r.result != Some(json!({"of": case.global, "at": at})) {
        p.push(format!(
            "{id}'s result is {:?}: not made from its place in {}'s chain",
            r.result, case.global
        ));
    }
    p
}

/// A way to break a whole chain, named.
type Mutant = (
    &'static str,
    Box<dyn Fn(&mut ChainCase, &mut Seen, &mut Records)>,
);

/// Checks the checker: a whole chain passes (read through its reader, or as an earlier
/// life through its list), and each way a chain can be wrong is caught. Returns what it
/// failed to catch.
pub fn selftest() -> Vec<String> {
    let case = ChainCase {
        id: "~cchain.7".into(),
        global: "c0000003".into(),
        earlier_life: false,
    };
    let good_seen = Seen {
        members: case.expected().into_iter().collect(),
        state: Some(ChainState::Done),
    };
    let mut good_records = Records::new();
    let route = json!({"action": "sleep", "result": {"of": case.global, "at": "~1"}});
    good_records.insert(case.global.clone(), Some(record(&case, route, None)));
    for (at, _) in FOLLOW_UPS {
        let result = json!({"of": case.global, "at": at});
        let by = format!("chain:{}", case.id);
        let id = format!("{}{at}", case.id);
        good_records.insert(id, Some(record(&case, result, Some(&by))));
    }
    let mut failed = Vec::new();
    for (i, (name, mutate)) in mutants().iter().enumerate() {
        let (mut k, mut s, mut r) = (case.clone(), good_seen.clone(), good_records.clone());
        mutate(&mut k, &mut s, &mut r);
        let answer = k.id.clone();
        let p = check_one(&k, &s, &r, Some(&answer));
        match (i, p.is_empty()) {
            (0 | 1, false) => failed.push(format!("a whole chain fails ({name}): {p:?}")),
            (i, true) if i > 1 => failed.push(format!("not caught: {name}")),
            _ => {}
        }
    }
    failed
}

/// A done record of chain `case`'s, with `result`, naming `by` as its submitter.
fn record(case: &ChainCase, result: Value, by: Option<&str>) -> TaskRecord {
    TaskRecord {
        id: String::new(),
        queue: String::new(),
        state: gaffer::queue_client::RecordState::Done,
        priority: 0,
        attempt: 1,
        max_attempts: 100,
        created_at: String::new(),
        due_at: String::new(),
        updated_at: String::new(),
        submitted_by: by.map(String::from),
        error: None,
        result: Some(result),
        chain: Some(case.id.clone()),
        history: None,
    }
}

/// Sets a field of the record of `id` (which the good chain has).
fn edit(r: &mut Records, id: &str, f: impl Fn(&mut TaskRecord)) {
    f(r.get_mut(id).and_then(Option::as_mut).expect("a record"))
}

/// The self-test's chains: the first two whole, each other one broken one way.
fn mutants() -> Vec<Mutant> {
    let mut out = listings();
    out.extend(records_broken());
    out
}

/// Chains whole (the first two), or broken in what Redis lists of them.
fn listings() -> Vec<Mutant> {
    vec![
        ("as it should be", Box::new(|_, _, _| {})),
        (
            "an earlier life, as its list holds it",
            Box::new(|k, s, r| {
                k.earlier_life = true;
                let ids = s.members.iter().skip(1).map(|m| m.1.clone()).collect();
                *s = listed_only(k, ids);
                edit(r, "c0000003", |r| r.chain = Some("~cchain.9".into()));
            }),
        ),
        (
            "a follow-up missing",
            Box::new(|_, s, _| drop(s.members.pop())),
        ),
        (
            "a follow-up listed twice",
            Box::new(|_, s, _| s.members.push(s.members[1].clone())),
        ),
        (
            "a follow-up too many",
            Box::new(|_, s, _| {
                let extra = ("step".into(), "~cchain.7~3".into(), Some("c0000003".into()));
                s.members.push(extra)
            }),
        ),
        (
            "a follow-up under another parent",
            Box::new(|_, s, _| {
                let last = s.members.len() - 1;
                s.members[last].2 = Some("~cchain.7~2".into())
            }),
        ),
        (
            "an earlier life missing a follow-up",
            Box::new(|k, s, _| {
                k.earlier_life = true;
                *s = listed_only(k, vec!["~cchain.7~1".into(), "~cchain.7~2".into()]);
            }),
        ),
        (
            "not done",
            Box::new(|_, s, _| s.state = Some(ChainState::Running)),
        ),
        (
            "unknown to its reader",
            Box::new(|_, s, _| *s = Seen::default()),
        ),
    ]
}

/// Chains broken in their form or their tasks' records.
fn records_broken() -> Vec<Mutant> {
    vec![
        (
            "an id of another form",
            Box::new(|k, s, r| {
                let old = k.id.clone();
                k.id = "chain:c0000003".into();
                rename(&old, &k.id, s, r)
            }),
        ),
        (
            "a follow-up's record naming another chain",
            Box::new(|_, _, r| edit(r, "~cchain.7~2", |r| r.chain = Some("~cchain.8".into()))),
        ),
        (
            "a follow-up's record naming another submitter",
            Box::new(|_, _, r| edit(r, "~cchain.7~1~1", |r| r.submitted_by = None)),
        ),
        (
            "a follow-up made from another place",
            Box::new(|_, _, r| {
                let other = json!({"of": "c0000003", "at": "~1"});
                edit(r, "~cchain.7~2", |r| r.result = Some(other.clone()))
            }),
        ),
        (
            "a global task's record naming another chain",
            Box::new(|_, _, r| edit(r, "c0000003", |r| r.chain = None)),
        ),
        (
            "a global task's record naming a submitter",
            Box::new(|_, _, r| edit(r, "c0000003", |r| r.submitted_by = Some("cli".into()))),
        ),
        (
            "no record of the global task",
            Box::new(|k, _, r| drop(r.remove(&k.global))),
        ),
    ]
}

/// Renames chain `old` to `new` in what was seen and in the records, for the self-test's
/// chain of another form (consistent everywhere but in its form).
fn rename(old: &str, new: &str, s: &mut Seen, r: &mut Records) {
    let fix = |id: &str| id.replacen(old, new, 1);
    for m in &mut s.members {
        m.1 = fix(&m.1);
        m.2 = m.2.as_deref().map(fix);
    }
    *r = r
        .drain()
        .map(|(id, rec)| {
            let rec = rec.map(|mut rec| {
                rec.chain = Some(new.to_string());
                if let Some(by) = &mut rec.submitted_by {
                    *by = format!("chain:{new}");
                }
                rec
            });
            (fix(&id), rec)
        })
        .collect();
}
