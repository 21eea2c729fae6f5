//! Task records: what the task service shows of one task, kept in Redis beside its queue.
//! The format is in lua/lib/records.lua, the keys in `docs/STORAGE.md`; this module turns
//! them into [`TaskRecord`], whose JSON form is the API's record.
//!
//! **A record changes in the same script as its task** (ARCHITECTURE.md, invariant 26). A
//! tracked queue's enqueue creates a record per task, and every function that moves the
//! task (take and its lease expiry, settle, requeue, cancel, freeze, thaw) updates it in
//! the same atomic step, appending to its history. Nothing but the library's functions
//! writes a record. The ack of a whole batch lease writes none: it keeps one entry per
//! run of the batch's record numbers (`exp:b:r`, see `K_DONE` in lua/lib/records.lua),
//! which the slot sends back from the take's metas; settle checks that the runs are the
//! batch's count of distinct numbers, and writes each record otherwise. Takers and
//! settlers need no flag: a call asks once whether the queue keeps records, and a task
//! that has none (enqueued while the queue did not track) is left without one. Tested by
//! the history snapshots in `tests/it/records.rs`, on one server and a 3-master cluster,
//! and by the fault suite's record check.
//!
//! **No reaper for records** (invariant 27). A task that ends notes when its record goes
//! (`history_ttl` later): its id in `exp`, or in its batch's list, or its number in its
//! batch's run. Takes delete the due ones, a bounded number per call as with expired
//! leases; the manager's tick does the same for every queue, so an idle queue sheds them
//! too; an enqueue that dedups against records does it before it looks. Reads write
//! nothing, so a read-only Redis user can run them. They pass over a due record that is
//! still stored (`rec_visible` in lua/lib/views.lua: its own moment, or its batch's
//! list's or run's, has passed), so none shows one. A record leaves with its index
//! entries.
//!
//! A listing looks at index entries in calls of at most [`LIST_CALL_BUDGET`], Redis free
//! between them. [`Queue::watch`] marks a task an api instance waits for, whose end is
//! published on [`Queue::ended_channel`]; [`Queue::record_memory`] is what records cost.

use std::time::Duration;

use redis::Value;
use serde::Serialize;

use super::args::{ListHead, RecordGetHead};
use super::reply::{bytes, string};
use super::scripts::SCRIPTS;
use super::{MAX_LIST_LIMIT, Queue, QueueError};

/// A task's state as the task service shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// Ready or delayed; `due_at` says when it can run.
    Waiting,
    /// Leased by a slot.
    Running,
    /// Handled successfully.
    Done,
    /// Dead-lettered: attempts exhausted or rejected.
    Failed,
    /// Cancelled by a caller or an operator, or on arrival by the queue's intake.
    Cancelled,
    /// Held by an operator until thawed.
    Frozen,
    /// Cancel asked of a running long task whose slot has not stopped yet.
    Cancelling,
}

impl RecordState {
    /// Every state, as written in URLs and JSON.
    pub const ALL: [RecordState; 7] = [
        RecordState::Waiting,
        RecordState::Running,
        RecordState::Done,
        RecordState::Failed,
        RecordState::Cancelled,
        RecordState::Frozen,
        RecordState::Cancelling,
    ];

    /// The state as written.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Waiting => "waiting",
            RecordState::Running => "running",
            RecordState::Done => "done",
            RecordState::Failed => "failed",
            RecordState::Cancelled => "cancelled",
            RecordState::Frozen => "frozen",
            RecordState::Cancelling => "cancelling",
        }
    }

    /// Parses a state as written; `None` for anything else.
    pub fn parse(s: &str) -> Option<RecordState> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the task has ended: nothing more will happen to it unless an operator
    /// requeues a failed one.
    pub fn is_end(self) -> bool {
        matches!(
            self,
            RecordState::Done | RecordState::Failed | RecordState::Cancelled
        )
    }
}

impl std::fmt::Display for RecordState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One entry of a task's history: a state it entered, when, on which attempt, where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryEntry {
    /// The state entered.
    pub state: RecordState,
    /// When (RFC 3339 UTC, milliseconds).
    pub at: String,
    /// The attempt it belongs to (0 before the first take).
    pub attempt: u32,
    /// The host of the slot that ran the attempt, where one did.
    pub host: Option<String>,
    /// The slot that ran the attempt (its number on its host), where one did.
    pub slot: Option<u32>,
    /// Why: the error of a failed attempt, who cancelled, what froze it.
    pub note: Option<String>,
    /// How many identical transitions in a row this entry stands for, when more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

/// Everything the task service knows of one task: the API's record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskRecord {
    /// The task's id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Where it is in its life.
    pub state: RecordState,
    /// Higher is taken first.
    pub priority: i32,
    /// Attempts started so far.
    pub attempt: u32,
    /// Attempts before it is dead-lettered (0: no limit).
    pub max_attempts: u32,
    /// When it was submitted.
    pub created_at: String,
    /// When it can run (again).
    pub due_at: String,
    /// When its record last changed.
    pub updated_at: String,
    /// Who submitted it: an API key's name, `cli`, `schedule:NAME`, `chain:ID`.
    pub submitted_by: Option<String>,
    /// The last error, if any attempt failed.
    pub error: Option<String>,
    /// What the handler returned, as JSON.
    pub result: Option<serde_json::Value>,
    /// The global task of its chain, if any.
    pub chain: Option<String>,
    /// Its state changes, oldest first; left out of listings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<HistoryEntry>>,
}

/// Which records a listing wants.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only records in this state.
    pub state: Option<RecordState>,
    /// Only records this submitter created (a non-admin API key sees only its own).
    pub submitted_by: Option<String>,
    /// Where the previous page ended (its `next_cursor`).
    pub cursor: Option<String>,
    /// Records per page, 1..=[`MAX_LIST_LIMIT`].
    pub limit: usize,
}

/// One page of a listing.
#[derive(Debug, Clone, Serialize)]
pub struct ListPage {
    /// Records without history, newest first.
    pub tasks: Vec<TaskRecord>,
    /// Where the next page starts; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// What records take in Redis, from [`Queue::record_memory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RecordMemory {
    /// One record (0 when it has none).
    pub record_bytes: u64,
    /// The whole listing index of the queue.
    pub index_bytes: u64,
    /// Entries in the listing index.
    pub index_entries: u64,
    /// The whole expiry index (ended tasks by when their record goes).
    pub expiry_bytes: u64,
    /// Entries in the expiry index.
    pub expiry_entries: u64,
}

/// Index entries one script call of a listing looks at, at most. A script holds Redis
/// whole while it runs, and each entry costs a record read (about 5 to 10 µs), so this
/// keeps one call near a millisecond: a call of 5,000 entries (a filter matching none of
/// 10,000 waiting tasks) held Redis for 25 to 50 ms, and six listing loops raised every
/// other client's PING p99 from 1 ms to 300 ms. A page looks at up to its `limit` entries
/// (at least this many) in calls of this size, Redis free between them, and a page whose
/// budget ran out among records of other states comes back short with a cursor.
pub const LIST_CALL_BUDGET: usize = 128;

/// The most bytes of records one page holds, about: results and errors can be large (a
/// result up to the queue's max_result), and each call's reply is built whole in Redis's
/// memory.
const PAGE_BYTES: usize = 4 << 20;

/// A record's history as stored: entries separated by \x1e, fields by \x1f.
fn parse_history(text: &str) -> Vec<HistoryEntry> {
    text.split('\x1e')
        .filter(|e| !e.is_empty())
        .filter_map(|entry| {
            let f: Vec<&str> = entry.split('\x1f').collect();
            if f.len() < 6 {
                return None;
            }
            let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
            Some(HistoryEntry {
                state: RecordState::parse(f[0])?,
                at: rfc3339(f[1].parse().ok()?),
                attempt: f[2].parse().unwrap_or(0),
                host: opt(f[3]),
                slot: f[4].parse().ok(),
                note: opt(f[5]),
                count: f.get(6).and_then(|c| c.parse().ok()),
            })
        })
        .collect()
}

/// Milliseconds since the epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Builds a record from the fields `{s, p, a, m, c, d, u, b, e, r, g[, h]}` the scripts
/// return.
fn from_fields(queue: &str, id: String, f: &[Value]) -> Result<TaskRecord, QueueError> {
    let text =
        |i: usize| -> Result<String, QueueError> { f.get(i).map_or(Ok(String::new()), string) };
    let num = |i: usize| -> i64 { text(i).ok().and_then(|s| s.parse().ok()).unwrap_or(0) };
    let opt = |i: usize| -> Option<String> { text(i).ok().filter(|s| !s.is_empty()) };
    let state_text = text(0)?;
    let state = RecordState::parse(&state_text)
        .ok_or_else(|| QueueError::Protocol(format!("unknown record state {state_text:?}")))?;
    let result = f.get(9).map(bytes).filter(|b| !b.is_empty()).map(|b| {
        // Results are checked as JSON before they are stored; a foreign one shows as text.
        serde_json::from_slice(&b)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&b).into()))
    });
    Ok(TaskRecord {
        id,
        queue: queue.to_string(),
        state,
        priority: num(1) as i32,
        attempt: num(2) as u32,
        max_attempts: num(3) as u32,
        created_at: rfc3339(num(4)),
        due_at: rfc3339(num(5)),
        updated_at: rfc3339(num(6)),
        submitted_by: opt(7),
        error: opt(8),
        result,
        chain: opt(10),
        history: (f.len() > 11).then(|| parse_history(&text(11).unwrap_or_default())),
    })
}

impl Queue {
    /// The task's record with its history; `None` when the task has none (unknown, its
    /// record's time is up, or the queue does not track). Writes nothing.
    pub async fn record(&self, id: &str) -> Result<Option<TaskRecord>, QueueError> {
        self.record_call(id, Watch::No).await
    }

    /// The sequence number of the task's record (its place in the listing index), which
    /// with its enqueue time names its run; `None` when it has no record.
    pub async fn record_seq(&self, id: &str) -> Result<Option<u64>, QueueError> {
        let mut conn = self.conn.clone();
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(self.keys.index())
            .arg(id)
            .query_async(&mut conn)
            .await?;
        Ok(score.map(|s| s as u64))
    }

    /// Like [`record`](Self::record), and marks that a caller waits for the task's end:
    /// when it ends, its id is published on [`ended_channel`](Self::ended_channel). Call
    /// it after subscribing, so the end cannot slip between the two.
    pub async fn watch(&self, id: &str) -> Result<Option<TaskRecord>, QueueError> {
        self.record_call(id, Watch::Yes).await
    }

    async fn record_call(&self, id: &str, watch: Watch) -> Result<Option<TaskRecord>, QueueError> {
        let mut inv = self.invocation(&SCRIPTS.record_get);
        inv.head(&RecordGetHead {
            id: id.to_string(),
            watch: matches!(watch, Watch::Yes),
        });
        let mut conn = self.conn.clone();
        let reply: Option<Vec<Value>> = inv.invoke_async(&mut conn).await?;
        reply
            .map(|f| from_fields(&self.name, id.to_string(), &f))
            .transpose()
    }

    /// Redis memory (`MEMORY USAGE`) of a task's record, and of the listing index and the
    /// expiry index with their entry counts: what records cost, for `gaffer bench` and
    /// capacity planning.
    pub async fn record_memory(&self, id: &str) -> Result<RecordMemory, QueueError> {
        let mut conn = self.conn.clone();
        let (record_bytes, _) = memory(&mut conn, &self.keys.record(id), KeyKind::Record).await?;
        let (index_bytes, index_entries) =
            memory(&mut conn, self.keys.index(), KeyKind::Index).await?;
        let (mut expiry_bytes, mut expiry_entries) =
            memory(&mut conn, self.keys.expiry(), KeyKind::Index).await?;
        let (ends_bytes, ends_entries) = self.ended_lists_memory(&mut conn).await?;
        expiry_bytes += ends_bytes;
        expiry_entries += ends_entries;
        Ok(RecordMemory {
            record_bytes,
            index_bytes,
            index_entries,
            expiry_bytes,
            expiry_entries,
        })
    }

    /// `MEMORY USAGE` of what tasks ended together leave (the runs of a whole batch's
    /// ack, and the lists) and of the zset that lists them, and how many tasks they hold
    /// (see `lua/lib/records.lua`).
    async fn ended_lists_memory(
        &self,
        conn: &mut super::RedisConn,
    ) -> Result<(u64, u64), QueueError> {
        let zset = format!("{}:b", self.keys.expiry());
        let (mut bytes, _) = memory(conn, &zset, KeyKind::Index).await?;
        let (runs_bytes, _) = memory(conn, &format!("{zset}:r"), KeyKind::Index).await?;
        bytes += runs_bytes;
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&zset)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await?;
        let mut entries = 0;
        for m in members {
            // a run "rS1:S2" of tasks numbered S1 to S2
            if let Some((a, b)) = m.strip_prefix('r').and_then(|r| r.split_once(':')) {
                let (a, b): (u64, u64) = (a.parse().unwrap_or(0), b.parse().unwrap_or(0));
                entries += (b + 1).saturating_sub(a);
                continue;
            }
            let list = format!("{zset}:{m}");
            let (b, _) = memory(conn, &list, KeyKind::Record).await?;
            let n: u64 = redis::cmd("LLEN").arg(&list).query_async(conn).await?;
            bytes += b;
            entries += n;
        }
        Ok((bytes, entries))
    }

    /// The channel on which the ids of watched tasks are published when they end.
    pub fn ended_channel(&self) -> String {
        self.keys.ended_channel()
    }

    /// One page of the queue's records, newest first; records whose time is up are left
    /// out. Writes nothing. The page looks at no more index entries than its `limit`, or
    /// [`LIST_CALL_BUDGET`] if that is more, in script calls of at most
    /// [`LIST_CALL_BUDGET`] entries each: with a `state` filter a page can come back with
    /// fewer records than `limit`, even none, and a `next_cursor` to go on from.
    pub async fn list(&self, query: &ListQuery) -> Result<ListPage, QueueError> {
        if query.limit == 0 || query.limit > MAX_LIST_LIMIT {
            return Err(QueueError::Invalid(format!(
                "limit must be 1 to {MAX_LIST_LIMIT}, got {}",
                query.limit
            )));
        }
        let mut cursor = match &query.cursor {
            Some(c) => Some(decode_cursor(c)?),
            None => None,
        };
        let budget = query.limit.max(LIST_CALL_BUDGET);
        let (mut looked, mut bytes) = (0, 0);
        let mut tasks = Vec::new();
        loop {
            let cap = LIST_CALL_BUDGET.min(budget - looked);
            let call = self
                .list_call(
                    query,
                    cursor,
                    query.limit - tasks.len(),
                    cap,
                    PAGE_BYTES - bytes,
                )
                .await?;
            looked += cap;
            bytes += call.bytes;
            tasks.extend(call.tasks);
            cursor = call.next;
            if cursor.is_none()
                || tasks.len() >= query.limit
                || looked >= budget
                || bytes >= PAGE_BYTES
            {
                return Ok(ListPage {
                    tasks,
                    next_cursor: cursor.map(encode_cursor),
                });
            }
        }
    }

    /// One script call of a listing: at most `limit` records, looking at no more than
    /// `cap` index entries, from below `cursor` (`None`: the newest).
    async fn list_call(
        &self,
        query: &ListQuery,
        cursor: Option<u64>,
        limit: usize,
        cap: usize,
        page_bytes: usize,
    ) -> Result<ListCall, QueueError> {
        let mut inv = self.invocation(&SCRIPTS.list);
        inv.head(&ListHead {
            submitter: query.submitted_by.clone().unwrap_or_default(),
            state: query.state.map(RecordState::as_str).unwrap_or(""),
            cursor: cursor.map(|c| c.to_string()).unwrap_or_default(),
            limit,
            cap,
            page_bytes: page_bytes.max(1),
        });
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = inv.invoke_async(&mut conn).await?;
        let Some((next, rows)) = reply.split_first() else {
            return Err(QueueError::Protocol("list returned nothing".into()));
        };
        let next = string(next)?;
        let bytes = rows
            .iter()
            .map(|v| match v {
                Value::BulkString(b) => b.len(),
                _ => 0,
            })
            .sum();
        let tasks = rows
            .chunks(12)
            .map(|row| from_fields(&self.name, string(&row[0])?, &row[1..]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ListCall {
            tasks,
            next: (!next.is_empty()).then(|| next.parse().ok()).flatten(),
            bytes,
        })
    }
}

/// What one script call of a listing returned.
struct ListCall {
    tasks: Vec<TaskRecord>,
    /// The score below which the listing goes on; `None` at its end.
    next: Option<u64>,
    /// The records' bytes, as the script counts them against the page's.
    bytes: usize,
}

/// Whether a read of a record also marks that a caller waits for the task's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watch {
    No,
    Yes,
}

/// The kinds of key [`memory`] measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    /// A task's record (a string), or a list measured whole.
    Record,
    /// A listing or expiry index: a sorted set, with an entry count.
    Index,
}

/// `MEMORY USAGE` of a key (0 when absent) and, for an index, its entry count.
async fn memory(
    conn: &mut super::RedisConn,
    key: &str,
    kind: KeyKind,
) -> Result<(u64, u64), QueueError> {
    let zset = kind == KeyKind::Index;
    let mut usage = redis::cmd("MEMORY");
    usage.arg("USAGE").arg(key);
    if zset {
        // Every element, not a sample: the figure is divided by the count.
        usage.arg("SAMPLES").arg(0);
    }
    let bytes: Option<u64> = usage.query_async(conn).await?;
    let entries: u64 = if zset {
        redis::cmd("ZCARD").arg(key).query_async(conn).await?
    } else {
        0
    };
    Ok((bytes.unwrap_or(0), entries))
}

/// Cursors are opaque to callers: a sequence number, written so nobody builds on its form.
fn encode_cursor(seq: u64) -> String {
    format!("c{:x}", seq ^ CURSOR_MASK)
}

fn decode_cursor(c: &str) -> Result<u64, QueueError> {
    c.strip_prefix('c')
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .map(|v| v ^ CURSOR_MASK)
        .ok_or_else(|| QueueError::Invalid(format!("cursor {c:?} is not one this api returned")))
}

const CURSOR_MASK: u64 = 0x5a5a_5a5a_5a5a;

/// How long an ended record is kept, in the unit the scripts use.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    ttl.as_millis().clamp(1, u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_entries_parse_with_folded_counts() {
        let h = "waiting\x1f0\x1f0\x1f\x1f\x1f\x1erunning\x1f1000\x1f1\x1fh1\x1f3\x1f\x1ewaiting\x1f2000\x1f1\x1f\x1f\x1fsystem paused\x1f4";
        let entries = parse_history(h);
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].state, RecordState::Waiting);
        assert_eq!(entries[0].host, None);
        assert_eq!(entries[1].host.as_deref(), Some("h1"));
        assert_eq!(entries[1].slot, Some(3));
        assert_eq!(entries[1].at, "1970-01-01T00:00:01.000Z");
        assert_eq!(entries[2].note.as_deref(), Some("system paused"));
        assert_eq!(entries[2].count, Some(4));
        assert_eq!(entries[1].count, None);
    }

    #[test]
    fn cursors_round_trip_and_refuse_foreign_text() {
        for seq in [0, 1, 99, 1 << 40] {
            assert_eq!(decode_cursor(&encode_cursor(seq)).unwrap(), seq);
        }
        assert!(decode_cursor("12").is_err());
        assert!(decode_cursor("czz").is_err());
    }

    #[test]
    fn states_round_trip() {
        for s in RecordState::ALL {
            assert_eq!(RecordState::parse(s.as_str()), Some(s));
        }
        assert!(RecordState::Done.is_end() && !RecordState::Frozen.is_end());
    }
}
