//! Enqueue: the tasks producers submit, checked whole before any is sent, then sent in
//! chunks of shared options, pipelined on the connection.
//!
//! **Refuse before sending** (ARCHITECTURE.md, invariant 8). Every task of a call is
//! checked before the first chunk goes ([`Queue::check`]: its payload's size, its id, how
//! far ahead it is due), so a refused bulk enqueues nothing. An ordered queue refuses a
//! priority or a delay here: its tasks run in creation order, so none may be due later
//! than one created after it. The queue's name was checked when its handle was made
//! (`checks`), and a take's batch size is checked before its call (`lease`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt};
use redis::Value;
use serde::Serialize;

use super::args::EnqueueHead;
use super::block::push_packet_args;
use super::reply::{int, string};
use super::scripts::SCRIPTS;
use super::{MAX_DELAY, MAX_ID_LEN, Queue, QueueError, RecordState};
use crate::config::Dedup;

/// Tasks per enqueue script call, and how many calls are in flight at once.
const ENQUEUE_CHUNK: usize = 1000;
const ENQUEUE_CHUNK_BYTES: usize = 8 * 1024 * 1024;
const ENQUEUE_WINDOW: usize = 8;

/// A task to enqueue.
#[derive(Debug, Clone, Default)]
pub struct NewTask {
    /// Opaque payload; JSON by convention.
    pub payload: Vec<u8>,
    /// Dedup key: while a task with this id is pending or leased, enqueueing it again
    /// returns the existing one. Generated (`~gN`, see [`GENERATED_ID_PREFIX`]) when absent.
    pub id: Option<String>,
    /// Higher is taken first.
    pub priority: i32,
    /// Not due before this much time from now.
    pub delay: Duration,
    /// Not due before this moment; wins over `delay`.
    pub at: Option<SystemTime>,
    /// Overrides the queue's max_attempts.
    pub max_attempts: Option<u32>,
    /// Its own time limit: a slot of a queue with a `timeout` stops it at the shorter of
    /// the two. Callers check it against the queue's (the api refuses a longer one).
    pub timeout: Option<Duration>,
    /// Who submits it, as its record shows: an API key's name, `cli`, `schedule:NAME`.
    pub submitted_by: Option<String>,
    /// Its place in a chain, if any.
    pub chain: Option<TaskChain>,
    /// Whether its id is its submitter's own: an id held by a task (or a kept record) that
    /// names another submitter refuses the enqueue ([`QueueError::IdTaken`]) instead of
    /// deduplicating onto that task or replacing it. A limited api key's submits set it,
    /// so keys that share a queue do not share its ids.
    pub own_id: bool,
}

/// A task's place in a chain (see `crate::chain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskChain {
    /// The global task of a chain of its own, whose id its enqueue mints from the task's
    /// queue and record number ([`chain_id`]).
    Global,
    /// A follow-up in the chain of this global task. It needs an id (derived from its
    /// parent's), and deduplicates against records too: a parent run again finds the
    /// children it made, even finished ones. Its record shows `chain:ID` as submitter.
    FollowUp(String),
}

impl NewTask {
    /// A task with this payload and every option at its default.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        NewTask {
            payload: payload.into(),
            ..Default::default()
        }
    }

    /// Sets the dedup id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the delay.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets the due time.
    pub fn at(mut self, at: SystemTime) -> Self {
        self.at = Some(at);
        self
    }

    /// Sets max_attempts for this task.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// Sets its own time limit.
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// Sets who submits it.
    pub fn submitted_by(mut self, by: impl Into<String>) -> Self {
        self.submitted_by = Some(by.into());
        self
    }

    /// Sets its place in a chain.
    pub fn chain(mut self, chain: TaskChain) -> Self {
        self.chain = Some(chain);
        self
    }
}

/// What an enqueue did with one task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Enqueued {
    /// The task's id (generated or given).
    pub id: String,
    /// False when a task with the same id already existed (pending, leased or dead; or
    /// with `dedup = "record"`, finished while its record lives).
    pub created: bool,
    /// The new task's state: waiting, or cancelled when the queue's intake cancels new
    /// tasks; `None` for an existing task (look its record up).
    pub state: Option<RecordState>,
    /// A chain's follow-up whose id a task (or live record) of another chain, or of no
    /// chain, already holds: nothing of its call was created (see `lua/enqueue.lua`).
    #[serde(skip)]
    pub taken: Option<TakenBy>,
    /// The chain a created task starts (a global task: [`TaskChain::Global`], or any task
    /// of a queue whose routes start chains), as its enqueue minted it ([`chain_id`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
}

/// What holds the id a chain's follow-up was to have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakenBy {
    /// A task of another chain.
    OtherChain,
    /// A task in no chain.
    NoChain,
}

impl TakenBy {
    /// As a reason says it: "a task of …".
    pub fn as_str(self) -> &'static str {
        match self {
            TakenBy::OtherChain => "another chain",
            TakenBy::NoChain => "no chain",
        }
    }
}

impl Queue {
    /// Refuses a task the queue cannot take: too large, a bad id, due too far ahead. The
    /// enqueue runs it too; a caller that writes something before enqueueing (a chain's
    /// claim) runs it first, so a refused task leaves nothing behind.
    pub fn check(&self, task: &NewTask) -> Result<(), QueueError> {
        if task.payload.len() as u64 > self.limits.max_payload {
            return Err(QueueError::PayloadTooLarge {
                queue: self.name.to_string(),
                size: task.payload.len(),
                limit: self.limits.max_payload,
            });
        }
        if matches!(task.chain, Some(TaskChain::FollowUp(_))) && task.id.is_none() {
            return Err(QueueError::Invalid(
                "a chain's follow-up needs an id derived from its parent's".into(),
            ));
        }
        if let Some(id) = &task.id {
            // A follow-up's id is derived from its parent's, which may be generated.
            let derived = matches!(task.chain, Some(TaskChain::FollowUp(_)));
            check_id(id, derived)?;
        }
        if self.limits.ordered && task.priority != 0 {
            return Err(QueueError::Invalid(format!(
                "priority {} refused: queue {} is ordered (tasks run in creation order, priority must be 0)",
                task.priority, self.name
            )));
        }
        if self.limits.ordered && (task.at.is_some() || !task.delay.is_zero()) {
            return Err(QueueError::Invalid(format!(
                "delay refused: queue {} is ordered (tasks run in creation order, so none may be due later than one created after it)",
                self.name
            )));
        }
        let off = match task.at {
            Some(at) => at.duration_since(SystemTime::now()).unwrap_or_default(),
            None => task.delay,
        };
        if off > MAX_DELAY {
            return Err(QueueError::Invalid(format!(
                "task due in {:.1} days exceeds the limit of {} days",
                off.as_secs_f64() / 86_400.0,
                MAX_DELAY.as_secs() / 86_400
            )));
        }
        Ok(())
    }

    /// Enqueues one task.
    pub async fn enqueue(&self, task: NewTask) -> Result<Enqueued, QueueError> {
        let mut out = self.enqueue_many(std::slice::from_ref(&task)).await?;
        out.pop()
            .ok_or_else(|| QueueError::Protocol("enqueue returned nothing".into()))
    }

    /// Enqueues many tasks: one script call per chunk, chunks pipelined on the connection.
    /// Every task is checked before any is sent, so a refused task enqueues nothing.
    pub async fn enqueue_many(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, QueueError> {
        for t in tasks {
            self.check(t)?;
        }
        let chunks = chunks(tasks);
        let Some((first, rest)) = chunks.split_first() else {
            return Ok(Vec::new());
        };
        // The first call goes alone: it loads the function library if Redis lacks it.
        // Pipelined calls that all found their function missing would retry in any order
        // and break FIFO between chunks.
        let mut out = self.enqueue_chunk(first).await?;
        // The futures are built first: a stream that maps borrowed chunks in a closure
        // makes a future that is not `Send` for every lifetime, which a server that
        // spawns its handlers cannot use.
        let calls: Vec<_> = rest.iter().map(|chunk| self.enqueue_chunk(chunk)).collect();
        let results: Vec<Vec<Enqueued>> = futures::stream::iter(calls)
            .buffered(ENQUEUE_WINDOW)
            .try_collect()
            .await?;
        out.extend(results.into_iter().flatten());
        Ok(out)
    }

    /// One script call: a chunk of tasks that share their options.
    async fn enqueue_chunk(&self, chunk: &[NewTask]) -> Result<Vec<Enqueued>, QueueError> {
        let inv = self.enqueue_invocation_with(&SCRIPTS.enqueue, chunk);
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        self.enqueued_reply(chunk, EnqueueReply::parse(reply)?)
    }

    /// Whether follow-ups go as packets: the queue's limits say so (see
    /// [`super::QueueLimits::packets`]), it tracks (a packet is its tasks' records), it
    /// runs tasks in any order (an ordered queue's take hands out one task at a time), and
    /// its tasks are batch tasks (a take of long tasks leases each alone).
    fn as_packets(&self) -> bool {
        self.limits.packets
            && self.limits.track
            && !self.limits.ordered
            && self.limits.kind == crate::config::QueueKind::Batch
    }

    /// What the enqueue script answered for `chunk`: its tasks, or why none was enqueued.
    pub(super) fn enqueued_reply(
        &self,
        chunk: &[NewTask],
        reply: EnqueueReply,
    ) -> Result<Vec<Enqueued>, QueueError> {
        match reply {
            EnqueueReply::Done { base, flags } => {
                let root = self.root(&chunk[0].chain).then_some(&*self.name);
                enqueued(chunk, base, flags, root)
            }
            EnqueueReply::Taken { flags } => {
                let at = flags.iter().position(|&f| f == b't');
                let id = at.and_then(|i| chunk.get(i)).and_then(|t| t.id.clone());
                Err(QueueError::IdTaken {
                    queue: self.name.to_string(),
                    id: id.unwrap_or_default(),
                })
            }
            EnqueueReply::Closed => Err(QueueError::IntakeClosed {
                queue: self.name.to_string(),
            }),
            EnqueueReply::LeasesGone(_) => Err(QueueError::Protocol(
                "enqueue answered that parents' leases are gone".into(),
            )),
        }
    }

    /// The call of `script` (enqueue.lua, or a script that ends in it) for a chunk: the
    /// options of its first task (they are all the same), the queue's limits, then the
    /// payloads (with their ids when given).
    pub(super) fn enqueue_invocation_with<'a>(
        &self,
        script: &'a super::scripts::Function,
        chunk: &[NewTask],
    ) -> super::scripts::Call<'a> {
        let first = &chunk[0];
        let at_ms = first
            .at
            .map(|at| millis_since_epoch(at).max(1))
            .unwrap_or(0);
        // A delay is passed as such: the script adds Redis's clock, not ours.
        let delay_ms = if first.at.is_some() {
            0
        } else {
            first.delay.as_millis() as u64
        };
        let mode = match (&first.chain, &first.id) {
            (Some(TaskChain::FollowUp(_)), _) if self.as_packets() => "ik",
            (Some(TaskChain::FollowUp(_)), _) => "ig",
            (_, Some(_)) => "ip",
            (_, None) => "p",
        };
        let mut inv = self.invocation(script);
        inv.head(&EnqueueHead {
            n: chunk.len(),
            priority: first.priority,
            delay_ms,
            at_ms,
            max_attempts: first.max_attempts.unwrap_or(self.limits.max_attempts),
            timeout_ms: first.timeout.map_or(0, |t| t.as_millis().max(1) as u64),
            mode,
            track: self.limits.track,
            submitted_by: first.submitted_by.clone().unwrap_or_default(),
            dedup: match (self.limits.dedup, first.own_id) {
                (Dedup::Active, false) => "a",
                (Dedup::Record, false) => "r",
                (Dedup::Active, true) => "ao",
                (Dedup::Record, true) => "ro",
            },
            intake: self.limits.intake.as_str(),
            history_ttl_ms: self.ttl_arg(),
            root: self.root(&first.chain),
            system: match &self.limits.system {
                // (so its new tasks get the pause's note before any switch is set)
                Some(sys) if sys.paused => format!("paused:{}", sys.name),
                _ => String::new(),
            },
        });
        if mode == "ik" {
            push_packet_args(&mut inv, chunk);
            return inv;
        }
        for t in chunk {
            match (mode, &t.chain) {
                ("p", _) => inv.arg(&t.payload[..]),
                ("ig", Some(TaskChain::FollowUp(g))) => inv
                    .arg(t.id.as_deref().unwrap_or_default())
                    .arg(&t.payload[..])
                    .arg(g.as_str()),
                _ => inv
                    .arg(t.id.as_deref().unwrap_or_default())
                    .arg(&t.payload[..]),
            };
        }
        inv
    }
}

/// What every generated id starts with: a task submitted without an id gets `~gN`, N
/// the queue's counter `seq`. Only URL-unreserved characters (RFC 3986), so the id goes
/// into a URL as it is; no client id may start with it, so none can take a generated one.
/// Builds before this generated `#N` (a `#` starts a URL's fragment); those ids keep
/// working, and client ids may still not start with `#`.
pub const GENERATED_ID_PREFIX: &str = "~g";

/// What every chain's id starts with: `~cQUEUE.SEQ`, minted from its global task's queue
/// and record number ([`chain_id`]). No client id may start with it, so a chain's id
/// never names a task a client made, and follow-up ids (derived from it) never clash
/// with one.
pub const CHAIN_ID_PREFIX: &str = "~c";

/// The id of the chain whose global task is task number `seq` of `queue` (enqueue.lua's
/// `chain_name` makes the same): unique in the namespace while the queue lives, as its counter never goes
/// back, and the same on one server and on a Redis Cluster.
pub fn chain_id(queue: &str, seq: u64) -> String {
    format!("{CHAIN_ID_PREFIX}{queue}.{seq}")
}

/// The queue and record number of the global task of chain `chain`, when the id has the
/// form [`chain_id`] makes (a chain an older layout named otherwise does not).
pub fn chain_origin(chain: &str) -> Option<(&str, u64)> {
    let (queue, seq) = chain.strip_prefix(CHAIN_ID_PREFIX)?.rsplit_once('.')?;
    let seq = seq.parse().ok().filter(|_| !seq.starts_with('+'))?;
    crate::config::is_valid_name(queue).then_some((queue, seq))
}

/// The generated id of the task numbered `n` (enqueue.lua makes the same).
fn generated_id(n: u64) -> String {
    format!("{GENERATED_ID_PREFIX}{n}")
}

/// Refuses an id no task may have: empty or over [`MAX_ID_LEN`] bytes; holding a control
/// character (C0 U+0000–U+001F, DEL U+007F, C1 U+0080–U+009F: it would reach operators'
/// terminals as a command, and 0x1e and 0x1f separate a record's fields); or in a form
/// kept for generated ids, `#…` (before) or `~g…` (now). Every enqueue path runs it (the
/// API's single and bulk submits, `gaffer push`, schedules, a slot's follow-ups). A
/// `derived` id (a chain's follow-up: its parent's id and `~N`) is its parent's choice,
/// not a client's: it may have a generated parent, and a parent an older build accepted
/// with a control character still makes its follow-ups, unless the character is 0x1e or
/// 0x1f, which would cut the chain's records (refused there as before).
pub fn check_id(id: &str, derived: bool) -> Result<(), QueueError> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(QueueError::Invalid(format!(
            "task id must be 1 to {MAX_ID_LEN} bytes, got {}",
            id.len()
        )));
    }
    if derived {
        return match id.chars().find(|c| matches!(c, '\u{1e}' | '\u{1f}')) {
            Some(c) => Err(QueueError::Invalid(format!(
                "task id {id:?} is invalid in a chain: it holds the control character U+{:04X} \
                 (0x1e and 0x1f separate the fields of its chain's records)",
                c as u32
            ))),
            None => Ok(()),
        };
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return Err(QueueError::Invalid(format!(
            "task id {id:?} is invalid: it holds the control character U+{:04X} \
             (ids may hold no C0, DEL or C1 control character: U+0000-U+001F, U+007F, U+0080-U+009F)",
            c as u32
        )));
    }
    if id.starts_with('#') {
        return Err(QueueError::Invalid(format!(
            "task id {id:?} is invalid: ids starting with '#' are reserved for generated ids"
        )));
    }
    if id.starts_with(GENERATED_ID_PREFIX) {
        return Err(QueueError::Invalid(format!(
            "task id {id:?} is invalid: ids starting with '{GENERATED_ID_PREFIX}' are reserved for generated ids"
        )));
    }
    if id.starts_with(CHAIN_ID_PREFIX) {
        return Err(QueueError::Invalid(format!(
            "task id {id:?} is invalid: ids starting with '{CHAIN_ID_PREFIX}' are reserved for chains and their follow-ups"
        )));
    }
    Ok(())
}

/// What the script's reply says of each task of a chunk: the generated ids count on from
/// `base`, and one flag per task says whether it was created and in which state.
fn enqueued(
    chunk: &[NewTask],
    base: u64,
    flags: Vec<u8>,
    starts_chains: Option<&str>,
) -> Result<Vec<Enqueued>, QueueError> {
    if flags.len() != chunk.len() {
        return Err(QueueError::Protocol(format!(
            "enqueue of {} tasks returned {} flags",
            chunk.len(),
            flags.len()
        )));
    }
    Ok(chunk
        .iter()
        .zip(flags)
        .enumerate()
        .map(|(i, (t, flag))| Enqueued {
            id: t
                .id
                .clone()
                .unwrap_or_else(|| generated_id(base + i as u64 + 1)),
            created: matches!(flag, b'1' | b'x'),
            chain: starts_chains
                .filter(|_| matches!(flag, b'1' | b'x'))
                .map(|queue| chain_id(queue, base + i as u64 + 1)),
            taken: match flag {
                b'c' => Some(TakenBy::OtherChain),
                b'n' => Some(TakenBy::NoChain),
                _ => None,
            },
            state: match flag {
                b'1' => Some(RecordState::Waiting),
                b'x' => Some(RecordState::Cancelled),
                _ => None,
            },
        })
        .collect())
}

/// The tasks in chunks for one script call each: at most `ENQUEUE_CHUNK` tasks and
/// `ENQUEUE_CHUNK_BYTES` of payload. A script call shares its options, so chunks also end
/// where the options change.
pub(super) fn chunks(tasks: &[NewTask]) -> Vec<&[NewTask]> {
    let mut chunks: Vec<&[NewTask]> = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, t) in tasks.iter().enumerate() {
        if i > start
            && (i - start >= ENQUEUE_CHUNK
                || bytes + t.payload.len() > ENQUEUE_CHUNK_BYTES
                || !same_options(&tasks[start], t))
        {
            chunks.push(&tasks[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += t.payload.len();
    }
    if start < tasks.len() {
        chunks.push(&tasks[start..]);
    }
    chunks
}

/// Whether two tasks can share one enqueue call: same options, and ids given for both or
/// for neither (the script has a faster path when every id is generated).
fn same_options(a: &NewTask, b: &NewTask) -> bool {
    (
        a.priority,
        a.delay,
        a.at,
        a.max_attempts,
        a.timeout,
        a.id.is_some(),
        &a.submitted_by,
        chain_kind(&a.chain),
        a.own_id,
    ) == (
        b.priority,
        b.delay,
        b.at,
        b.max_attempts,
        b.timeout,
        b.id.is_some(),
        &b.submitted_by,
        chain_kind(&b.chain),
        b.own_id,
    )
}

impl Queue {
    /// The enqueue's `root` argument (`lua/enqueue.lua`, which then mints each chain's
    /// id from the task's record number): whether a task enqueued with `chain` starts a chain of its own: a global task, or
    /// any task but a follow-up in a queue whose routes start chains. (An untracked
    /// queue keeps no record to number it by: it starts none.)
    fn root(&self, chain: &Option<TaskChain>) -> bool {
        self.limits.track
            && match chain {
                Some(TaskChain::Global) => true,
                None => self.limits.starts_chains,
                Some(TaskChain::FollowUp(_)) => false,
            }
    }
}

/// What of a task's chain its enqueue call shares: a follow-up's chain is passed per task.
fn chain_kind(chain: &Option<TaskChain>) -> u8 {
    match chain {
        None => 0,
        Some(TaskChain::Global) => 1,
        Some(TaskChain::FollowUp(_)) => 2,
    }
}

/// A moment as the scripts take it: ms since the epoch, 0 before it.
fn millis_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What enqueue.lua (and follow_enqueue.lua, which ends in it) answers, by the kind its
/// first value names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EnqueueReply {
    /// `{'ok', base, flags}`: the tasks (see enqueue.lua for the flags).
    Done {
        /// Generated ids are numbered from it.
        base: u64,
        /// One character per task.
        flags: Vec<u8>,
    },
    /// `{'closed'}`: the intake is closed; nothing enqueued.
    Closed,
    /// `{'taken', flags}`: another submitter's tasks hold some of the ids ('t'); nothing
    /// enqueued.
    Taken {
        /// One character per task.
        flags: Vec<u8>,
    },
    /// `{'gone', positions}` (follow_enqueue.lua): the leases of these parents (from 0)
    /// are gone; nothing enqueued.
    LeasesGone(Vec<usize>),
}

impl EnqueueReply {
    /// Reads a reply; a shape that does not fit its kind is a protocol error.
    pub(super) fn parse(reply: Vec<Value>) -> Result<EnqueueReply, QueueError> {
        let bad = || QueueError::Protocol(format!("enqueue returned {reply:?}"));
        let kind = reply.first().map(string).transpose()?.unwrap_or_default();
        let flags = |v: &Value| match v {
            Value::BulkString(b) => Ok(b.clone()),
            _ => Err(bad()),
        };
        match (kind.as_str(), &reply[..]) {
            ("ok", [_, base, f]) => Ok(EnqueueReply::Done {
                base: u64::try_from(int(base)?).map_err(|_| bad())?,
                flags: flags(f)?,
            }),
            ("closed", [_]) => Ok(EnqueueReply::Closed),
            ("taken", [_, f]) => Ok(EnqueueReply::Taken { flags: flags(f)? }),
            ("gone", [_, Value::Array(at)]) => {
                let at: Vec<usize> = at
                    .iter()
                    .map(|p| match int(p) {
                        Ok(p) if p > 0 => Ok(p as usize - 1),
                        _ => Err(bad()),
                    })
                    .collect::<Result<_, _>>()?;
                Ok(EnqueueReply::LeasesGone(at))
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_enqueue_reply_is_read_by_its_kind() {
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let parse = |v: Vec<Value>| EnqueueReply::parse(v);
        assert_eq!(
            parse(vec![text("ok"), Value::Int(7), text("10")]).unwrap(),
            EnqueueReply::Done {
                base: 7,
                flags: b"10".to_vec()
            }
        );
        assert_eq!(parse(vec![text("closed")]).unwrap(), EnqueueReply::Closed);
        assert_eq!(
            parse(vec![text("taken"), text("-t")]).unwrap(),
            EnqueueReply::Taken {
                flags: b"-t".to_vec()
            }
        );
        assert_eq!(
            parse(vec![text("gone"), Value::Array(vec![Value::Int(2)])]).unwrap(),
            EnqueueReply::LeasesGone(vec![1])
        );
        for bad in [
            vec![Value::Int(-1), text("")],
            vec![text("ok"), Value::Int(-2), text("1")],
            vec![text("gone"), Value::Array(vec![Value::Int(0)])],
            vec![text("closed"), text("x")],
        ] {
            assert!(matches!(parse(bad), Err(QueueError::Protocol(_))));
        }
    }
}
