//! The heads of the library's functions' arguments, one per function that takes fixed
//! arguments (a function with several ops, such as long or system, has one head that
//! every op sends whole), each declared once as a struct whose fields are the arguments in order: the struct sends
//! them ([`Call::head`]), and the library gets their names as a Lua list
//! (`ENQUEUE_HEAD = {'n', 'priority', …}`), which a body reads with `head(ARGV,
//! ENQUEUE_HEAD)` into a table by name (`A.priority`). So Rust and Lua cannot disagree on
//! a position, and a test holds each body to reading exactly the names its head declares.
//! What follows a head (payloads, ids, ops) is the body's own, documented in its file;
//! held and chain take only pairs ((id, token) and (id, chain)), and have no head.

use redis::ToRedisArgs;

use super::scripts::Call;

/// A head of arguments: its fields' names, in order, and how it sends them.
pub(crate) trait Head {
    /// The Lua list the library defines with the names (e.g. `ENQUEUE_HEAD`).
    const LUA_NAME: &'static str;
    /// The fields' names, in the order they are sent.
    const NAMES: &'static [&'static str];
    /// Sends the fields, in order.
    fn push(&self, call: &mut Call<'_>);
}

/// Declares a head: a struct of the fields and its [`Head`] impl, from one list, so the
/// names and the order sent are the same list.
macro_rules! head {
    ($(#[$doc:meta])* $name:ident as $lua:literal { $($(#[$fdoc:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub(crate) struct $name {
            $($(#[$fdoc])* pub(crate) $field: $ty,)*
        }

        impl Head for $name {
            const LUA_NAME: &'static str = $lua;
            const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];
            fn push(&self, call: &mut Call<'_>) {
                $(call.arg(self.$field.to_head_arg());)*
            }
        }
    };
}

/// How a field goes as an argument: as its text; a flag as '1' or '0'.
pub(crate) trait HeadArg {
    /// The argument.
    fn to_head_arg(&self) -> impl ToRedisArgs;
}

impl HeadArg for bool {
    fn to_head_arg(&self) -> impl ToRedisArgs {
        if *self { "1" } else { "0" }
    }
}

macro_rules! head_arg_as_is {
    ($($t:ty),*) => {$(
        impl HeadArg for $t {
            fn to_head_arg(&self) -> impl ToRedisArgs {
                self.clone()
            }
        }
    )*};
}
head_arg_as_is!(u64, i64, i32, u32, usize, f64, String, &'static str);

head! {
    /// enqueue.lua's head (the options a chunk's tasks share).
    EnqueueHead as "ENQUEUE_HEAD" {
        /// Tasks in the call.
        n: usize,
        /// Their priority.
        priority: i32,
        /// Their delay (ms; the script adds Redis's clock), 0 with `at_ms`.
        delay_ms: u64,
        /// When they are due (ms since the epoch); 0: none.
        at_ms: u64,
        /// Their max_attempts (0: no limit).
        max_attempts: u32,
        /// Their own time limit (ms; 0: the queue's `timeout` alone).
        timeout_ms: u64,
        /// How the tasks follow: 'p', 'ip', 'ig' or 'ik' (enqueue.lua).
        mode: &'static str,
        /// Whether the queue keeps records.
        track: bool,
        /// Who submitted them ('' none).
        submitted_by: String,
        /// The queue's dedup ('a' or 'r'), then 'o' when the ids are the submitter's own.
        dedup: &'static str,
        /// The config's intake, used while no run-time switch is set.
        intake: &'static str,
        /// How long records live after the end (ms).
        history_ttl_ms: u64,
        /// Whether each task is the global task of a chain of its own.
        root: bool,
        /// 'paused:NAME' for a system the config starts paused, else ''.
        system: String,
    }
}

head! {
    /// take.lua's head, all of its arguments.
    TakeHead as "TAKE_HEAD" {
        /// Tasks to take (0: bring back what is due and take nothing).
        n: usize,
        /// The lease (ms).
        lease_ms: u64,
        /// Housekeeping done at most (leases, delayed tasks, records).
        limit: usize,
        /// The taker's host ('' none).
        host: String,
        /// The taker's slot ('' none).
        slot: String,
        /// How long records live after the end (ms).
        history_ttl_ms: u64,
        /// The config's system state ('paused' or ''; a run-time switch wins).
        system: &'static str,
        /// Whether the queue hands out one task at a time, in order.
        ordered: bool,
        /// Whether the queue has `on = "failed"` routes (take.lua).
        failed_routes: bool,
    }
}

head! {
    /// settle.lua's head, before its acks and ops.
    SettleHead as "SETTLE_HEAD" {
        /// Acks of first attempts holding `token`, sent as bare ids.
        k1: usize,
        /// Acks of later attempts, as (id, token, attempt).
        k2: usize,
        /// The settler's host ('' none).
        host: String,
        /// The settler's slot ('' none).
        slot: String,
        /// How long records live after the end (ms).
        history_ttl_ms: u64,
        /// Whether the queue hands out one task at a time, in order.
        ordered: bool,
        /// The token of the first attempts' acks ('' when k1 is 0).
        token: String,
        /// The record numbers of the first attempts as runs "s1-s2,…" ('' when one has none).
        runs: String,
    }
}

head! {
    /// find.lua's head, all of its arguments.
    FindHead as "FIND_HEAD" {
        /// The task.
        id: String,
        /// Whether to cancel it.
        cancel: bool,
        /// The cancelled record's history note.
        note: String,
        /// How long records live after the end (ms).
        history_ttl_ms: u64,
        /// The queue's kind ('long': a running task is asked to stop).
        kind: &'static str,
        /// A system ('' none): a disable's sweep cancels only while it is disabled.
        system: String,
        /// An owner ('' any): only a task whose record names it as its submitter.
        owner: String,
        /// Whether a dead letter stays as it is.
        keep_dead: bool,
    }
}

head! {
    /// list.lua's head, all of its arguments.
    ListHead as "LIST_HEAD" {
        /// Whose records ('' every one).
        submitter: String,
        /// Which state ('' any).
        state: &'static str,
        /// Entries below this score ('' from the newest).
        cursor: String,
        /// Records on the page, at most.
        limit: usize,
        /// Index entries looked at, at most.
        cap: usize,
        /// Records' bytes after which the call stops.
        page_bytes: usize,
    }
}

head! {
    /// freeze.lua's head, all of its arguments.
    FreezeHead as "FREEZE_HEAD" {
        /// The task.
        id: String,
        /// 'freeze' or 'thaw'.
        action: String,
        /// The history note.
        note: String,
        /// Whether the queue runs its tasks in order.
        ordered: bool,
        /// An owner ('' any): only a task whose record names it as its submitter.
        owner: String,
    }
}

head! {
    /// long.lua's head: every op sends all of it (a renewal's worker and record TTL go
    /// unused; `lease_ms` is a renewal's only).
    LongHead as "LONG_HEAD" {
        /// 'renew', 'cancelled' or 'settle' (long.lua).
        op: &'static str,
        /// The task.
        id: String,
        /// Its lease's token.
        token: u64,
        /// A renewal's new lease (ms from now); 0 for the other ops.
        lease_ms: u64,
        /// The attempt the slot runs.
        attempt: u32,
        /// The slot's host ('' none).
        host: String,
        /// The slot ('' none).
        slot: String,
        /// How long records live after the end (ms).
        history_ttl_ms: u64,
    }
}

head! {
    /// release.lua's head, before its (id, token, attempt) triples.
    ReleaseHead as "RELEASE_HEAD" {
        /// How long records live after the end (ms).
        history_ttl_ms: u64,
        /// Why a task that ran waits again ('' for tasks that never started).
        note: String,
        /// The slot's host ('' none).
        host: String,
        /// The slot ('' none).
        slot: String,
    }
}

head! {
    /// dead_move.lua's head, before its ids (none: the oldest dead by the cutoff).
    DeadMoveHead as "DEAD_MOVE_HEAD" {
        /// 'requeue', 'requeue_front', 'requeue_front_more' or 'purge' (dead_move.lua).
        action: &'static str,
        /// Dead letters moved at most.
        limit: usize,
        /// The requeued records' history note.
        note: String,
        /// Only letters whose record names this submitter, when given ('' : anyone's).
        owner: String,
        /// Only those dead by then (ms, Redis's clock; '' with ids).
        cutoff_ms: String,
    }
}

head! {
    /// dead_list.lua's head, all of its arguments.
    DeadListHead as "DEAD_LIST_HEAD" {
        /// Dead letters skipped, oldest first (oldest first only).
        offset: usize,
        /// Dead letters listed at most.
        limit: usize,
        /// Newest first, from a cursor, rather than oldest first from an offset.
        newest: bool,
        /// The cursor's time of death (ms; '' : from the newest).
        after_ms: String,
        /// The cursor's id.
        after_id: String,
        /// Newest first, the reply ends once it holds this many bytes of payloads and
        /// errors.
        page_bytes: usize,
    }
}

head! {
    /// record_get.lua's head, all of its arguments.
    RecordGetHead as "RECORD_GET_HEAD" {
        /// The task.
        id: String,
        /// Whether an api instance waits for the task's end.
        watch: bool,
    }
}

head! {
    /// chain_members.lua's head, all of its arguments.
    ChainMembersHead as "CHAIN_MEMBERS_HEAD" {
        /// The chain.
        chain: String,
    }
}

head! {
    /// housekeep.lua's head, all of its arguments.
    HousekeepHead as "HOUSEKEEP_HEAD" {
        /// Records deleted at most.
        limit: usize,
    }
}

head! {
    /// system.lua's head: every op sends all of it, what it does not use as '' or 0.
    SystemHead as "SYSTEM_HEAD" {
        /// 'set', 'clear', 'waiting' or 'note' (system.lua).
        op: &'static str,
        /// set: the switch ('STATE:NAME'); clear: the system.
        switch: String,
        /// set, clear: the generation read.
        generation: u64,
        /// waiting, note: waiting tasks skipped.
        offset: u64,
        /// waiting, note: tasks looked at, at most.
        limit: usize,
        /// note: the records' note.
        note: String,
    }
}

impl SystemHead {
    /// A head of `op` with nothing else set.
    pub(crate) fn op(op: &'static str) -> Self {
        SystemHead {
            op,
            switch: String::new(),
            generation: 0,
            offset: 0,
            limit: 0,
            note: String::new(),
        }
    }
}

head! {
    /// migrate.lua's head, all of its arguments.
    MigrateHead as "MIGRATE_HEAD" {
        /// The position the caller read (the queue's migration field, '' none).
        position: String,
        /// The layout it read ('' none).
        layout: String,
        /// This pass.
        pass: &'static str,
        /// Its cursor ('0' to begin).
        cursor: String,
        /// The step's next pass ('' when this is its last).
        next: &'static str,
        /// The layout the step reaches.
        to: u32,
        /// Items looked at, at most.
        budget: u32,
    }
}

head! {
    /// bucket.lua's head, all of its arguments.
    BucketHead as "BUCKET_HEAD" {
        /// Tokens a second.
        rate: f64,
        /// Tokens saved up at most.
        burst: usize,
        /// > 0: tokens to acquire, at most; < 0: tokens handed back unused.
        want: i64,
    }
}

head! {
    /// switch.lua's head, all of its arguments.
    SwitchHead as "SWITCH_HEAD" {
        /// The system.
        system: String,
        /// Its new state.
        state: &'static str,
    }
}

head! {
    /// outcount.lua's head, all of its arguments.
    OutcountHead as "OUTCOUNT_HEAD" {
        /// The system.
        system: String,
        /// The state the switch is written with.
        state: &'static str,
        /// The queue's copy's generation.
        theirs: u64,
        /// The switch's own generation.
        ours: u64,
    }
}

head! {
    /// adopt.lua's head, all of its arguments.
    AdoptHead as "ADOPT_HEAD" {
        /// The system.
        system: String,
        /// The queue's copy's state.
        state: String,
        /// The copy's generation.
        theirs: u64,
    }
}

/// The Lua list of `H`'s names, as the library defines it.
fn lua_list<H: Head>() -> String {
    let names: Vec<String> = H::NAMES.iter().map(|n| format!("'{n}'")).collect();
    format!("local {} = {{{}}}\n", H::LUA_NAME, names.join(", "))
}

/// The library's definitions of every head's names.
pub(crate) fn lua() -> String {
    [
        lua_list::<EnqueueHead>(),
        lua_list::<TakeHead>(),
        lua_list::<SettleHead>(),
        lua_list::<FindHead>(),
        lua_list::<ListHead>(),
        lua_list::<FreezeHead>(),
        lua_list::<LongHead>(),
        lua_list::<ReleaseHead>(),
        lua_list::<DeadMoveHead>(),
        lua_list::<DeadListHead>(),
        lua_list::<RecordGetHead>(),
        lua_list::<ChainMembersHead>(),
        lua_list::<HousekeepHead>(),
        lua_list::<SystemHead>(),
        lua_list::<MigrateHead>(),
        lua_list::<BucketHead>(),
        lua_list::<SwitchHead>(),
        lua_list::<OutcountHead>(),
        lua_list::<AdoptHead>(),
    ]
    .concat()
}

impl Call<'_> {
    /// Sends `head`'s fields, in order (before anything else of the call).
    pub(crate) fn head(&mut self, head: &impl Head) -> &mut Self {
        head.push(self);
        self
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The names a body reads of its head (`A.NAME`), and whether it reads the head
    /// (`head(ARGV, LIST)`) and counts it (`#LIST`).
    fn read_names(body: &str) -> BTreeSet<&str> {
        body.match_indices("A.")
            .filter(|(i, _)| {
                !body[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '.')
            })
            .map(|(i, _)| {
                let rest = &body[i + 2..];
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .collect()
    }

    fn check<H: Head>(body: &str) {
        let declared: BTreeSet<&str> = H::NAMES.iter().copied().collect();
        assert!(
            lua().contains(&lua_list::<H>()),
            "the library lacks {}",
            H::LUA_NAME
        );
        assert_eq!(read_names(body), declared, "{}", H::LUA_NAME);
        assert!(
            body.contains(&format!("head(ARGV, {})", H::LUA_NAME)),
            "{}",
            H::LUA_NAME
        );
        // (arguments after the head are read from H on)
        if body.contains("ARGV[H") {
            assert!(
                body.contains(&format!("local H = #{}", H::LUA_NAME)),
                "{}",
                H::LUA_NAME
            );
        }
        let by_position = body
            .match_indices("ARGV[")
            .any(|(i, _)| body[i + 5..].starts_with(|c: char| c.is_ascii_digit()));
        assert!(
            !by_position,
            "{} reads an argument by position",
            H::LUA_NAME
        );
    }

    /// Each body reads exactly the names its head sends, by name: a field added on one
    /// side only, or a position read by hand, fails here.
    #[test]
    fn each_body_reads_the_names_its_head_sends() {
        check::<EnqueueHead>(include_str!("lua/enqueue.lua"));
        check::<TakeHead>(include_str!("lua/take.lua"));
        check::<SettleHead>(include_str!("lua/settle.lua"));
        check::<FindHead>(include_str!("lua/find.lua"));
        check::<ListHead>(include_str!("lua/list.lua"));
        check::<FreezeHead>(include_str!("lua/freeze.lua"));
        check::<LongHead>(include_str!("lua/long.lua"));
        check::<ReleaseHead>(include_str!("lua/release.lua"));
        check::<DeadMoveHead>(include_str!("lua/dead_move.lua"));
        check::<DeadListHead>(include_str!("lua/dead_list.lua"));
        check::<RecordGetHead>(include_str!("lua/record_get.lua"));
        check::<ChainMembersHead>(include_str!("lua/chain_members.lua"));
        check::<HousekeepHead>(include_str!("lua/housekeep.lua"));
        check::<SystemHead>(include_str!("lua/system.lua"));
        check::<MigrateHead>(include_str!("lua/migrate.lua"));
        check::<BucketHead>(include_str!("lua/bucket.lua"));
        check::<SwitchHead>(include_str!("lua/switch.lua"));
        check::<OutcountHead>(include_str!("lua/outcount.lua"));
        check::<AdoptHead>(include_str!("lua/adopt.lua"));
    }

    #[test]
    fn the_lua_lists_name_the_fields_in_order() {
        assert_eq!(
            lua_list::<TakeHead>(),
            "local TAKE_HEAD = {'n', 'lease_ms', 'limit', 'host', 'slot', 'history_ttl_ms', \
             'system', 'ordered', 'failed_routes'}\n"
        );
        assert_eq!(
            read_names("x = A.n + AA.m + A.lease_ms; B.A.q"),
            BTreeSet::from(["n", "lease_ms"])
        );
    }
}
