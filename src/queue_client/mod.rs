//! The leased-task queue on Redis: what producers enqueue and slots take and settle.
//!
//! Each operation is one call of a function of gaffer's Lua library, so it is atomic and
//! costs one round trip whatever the batch size. Time is Redis's own (`TIME` inside the
//! scripts): clients with skewed clocks still agree on leases and due times. A queue's
//! keys share one hash tag, so queues spread over a Redis Cluster. The storage layout is
//! described in `docs/STORAGE.md`.
//!
//! Guarantees: a task is handed to one taker at a time while its lease is valid; a lease
//! is identified by a token, and a settle carrying a token that is no longer the task's
//! is rejected and counted as stale; an expired lease returns the task to the ready set
//! on the next take (counted as an attempt) or dead-letters it past `max_attempts`.
//!
//! A task is in exactly one of ready, delayed, leased, frozen and dead, or gone
//! (ARCHITECTURE.md, invariant 1). Every function that moves a task takes it out of one
//! place and puts it in the next in the same call; no path adds without removing, so no
//! taker can find a task in two places. `find`'s states and the `stats` totals are
//! checked against this in `tests/it/queue.rs`.
//!
//! The other rules the queue keeps are stated in full, with their mechanics, where they
//! are kept: 2 (a token is the only authority to settle), 4 (no reaper) and 6 (no
//! polling) in `lease`; 5 (one entry per ready task) in lua/lib/tasks.lua; 7 (one queue,
//! one hash slot) in `scripts`; 35 (one library) in `scripts` and `args`; 8 (refuse
//! before sending) in `enqueue`; 26 and 27 (records) in `record`; 31 (what holds a take)
//! in `lease`, `system` and lua/lib/control.lua; 36 (packets) in lua/lib/blocks.lua.
//!
//! The module by concern: `client` (connecting, handles on queues), `queue` (the handle
//! and what its operations share), `enqueue`, `lease` (take and settle: the hot path),
//! `long` (renewal and end of long tasks), `record` (records, listing, watching),
//! `glance` (the states of many tasks in a few calls), `chained` (what chains read and
//! set of a queue's tasks), `control` (find, cancel, freeze and thaw, intake, delete),
//! `dead` (dead letters), `durability` (writes confirmed on replicas: `[cluster]
//! wait_replicas`), `stats` (counters and housekeeping), `limits`, `error`,
//! `checks` (input checks other modules share), `reply` (decoding script replies), `meta`
//! (a task's meta, read in one place), `args` (the heads of the busiest functions'
//! arguments), `block` (packets, runs and batch leases as Rust sees them), `conn`
//! (connections), `sentinel` (following the primary a group of sentinels names),
//! `cluster_conn` (a Redis Cluster connection that follows failovers, frozen masters
//! too), `cluster_watch` (reading its failovers from `CLUSTER NODES`), `follow` (what
//! the two following connections share), `outage`,
//! `scripts` (the Lua library, its calls and the keys), `system` (external systems: the
//! run-time switch and the rate bucket), `layout` (the layout version a queue's data is
//! in) and `migrate` (moving a queue to the current one).

mod args;
mod block;
mod chained;
mod checks;
mod client;
mod cluster_conn;
mod cluster_watch;
mod conn;
mod control;
mod dead;
mod durability;
mod enqueue;
mod error;
mod follow;
mod glance;
pub mod layout;
mod lease;
mod limits;
mod long;
mod meta;
mod migrate;
mod outage;
mod queue;
mod record;
mod reply;
mod scripts;
mod sentinel;
mod stats;
mod system;

pub use chained::{ChainFacts, ChainPlace, FollowUpsEnqueued};
pub use checks::{json_bytes, json_deeper_than, validate_queue_name};
pub use client::{QueueClient, RedisNode, Topology};
pub use cluster_conn::{ClusterConn, ClusterFacts};
pub use conn::{
    ConnectOptions, PemFile, PemKind, RedisConn, TlsFileError, TlsFiles, Waiter, pubsub, redacted,
    url_passwords, uses_tls,
};
pub use control::{FreezeResult, TaskInfo, TaskState};
pub use dead::{DEAD_PAGE_BYTES, DEAD_PAGE_CALL, DeadCursor, DeadPage, DeadTask};
pub use durability::Durability;
pub use enqueue::{
    CHAIN_ID_PREFIX, Enqueued, GENERATED_ID_PREFIX, NewTask, TakenBy, TaskChain, chain_id,
    chain_origin, check_id,
};
pub use error::{Cause, ConnectError, QueueError};
pub use glance::Glance;
pub use lease::{Batch, LeasedTask, Settle, SettleOp, SettleResult, check_settle_commands};
pub use limits::{
    DEFAULT_MAX_PAYLOAD, MAX_BATCH, MAX_DELAY, MAX_ID_LEN, MAX_LIST_LIMIT, QueueLimits,
    SystemLimits,
};
pub use long::{LongSettled, Renewal};
pub use migrate::{LayoutState, MIGRATE_FIELD, MigrateStep, PASSES, Pass, recorded_layout};
pub use outage::{OutageLog, Spell, SpellStep};
pub use queue::{Queue, Worker};
pub use record::{
    HistoryEntry, LIST_CALL_BUDGET, ListPage, ListQuery, RecordMemory, RecordState, TaskRecord,
    rfc3339,
};
pub use sentinel::{PrimaryFacts, SentinelConn, SentinelUrl};
pub use stats::QueueStats;
pub use system::{
    SweepProgress, Switches, SystemChange, SystemError, SystemState, bucket_key,
    states as system_states, switches_key, with_switches,
};
