//! The Lua behind every queue operation: one library of Redis functions (`FUNCTION
//! LOAD`, Redis 7.0 or later), each call one round trip and atomic.
//!
//! The library is the files of `lua/lib/` in the order of [`LIB`] (each uses only what
//! the ones before it define: keys, calls, tasks, records, chains, blocks, record_io,
//! expiry, views, locate, control), then one function per operation, whose body is its
//! file in `lua/` ([`FUNCTIONS`]). A library's top-level code runs once, when Redis
//! loads it, so a call pays only for what it does: the helpers are not made anew at each
//! call, as a script's are. A queue function binds its queue's keys (`bind` in
//! lua/lib/keys.lua) and checks the queue's layout (`layout_check`) before its body.
//!
//! **One queue, one hash slot** (ARCHITECTURE.md, invariant 7). A queue function gets its
//! queue's keys as KEYS ([`Keys`]), all under the queue's hash tag; every other key it
//! touches is named from one of them in Lua (a priority's ready list from `ready`, a
//! record from `r:`, a batch lease from `leased`) and keeps that tag. So a call touches
//! one Redis Cluster slot, and the same tests run on one server and on a 3-master cluster
//! (`harness::on_both!`). Two kinds of call reach further, by name: follow_enqueue.lua
//! also reads the parents' queue's leases, on one server only, and a bare function's keys
//! (a system's bucket, the switches hash) are what its caller gives.
//!
//! The library's name carries a hash of its text (`gaffer_HASH`, its functions
//! `gaffer_NAME_HASH`), so two releases of gaffer on one Redis (a rolling upgrade) each
//! call their own functions. A call that finds its function missing (a new or restarted
//! server, a failover to a replica that never had it) loads the library, on every master
//! of a cluster, and calls again, as `EVALSHA` after `NOSCRIPT`; a user that may not load
//! it gets an error saying who can (docs/SECURITY.md).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, FromRedisValue, RedisError, RedisResult, ToRedisArgs, Value};

use super::durability::{self, Durability};
use super::{QueueError, args, layout, migrate};

/// The library's files, in load order.
const LIB: [(&str, &str); 11] = [
    ("keys", include_str!("lua/lib/keys.lua")),
    ("calls", include_str!("lua/lib/calls.lua")),
    ("tasks", include_str!("lua/lib/tasks.lua")),
    ("records", include_str!("lua/lib/records.lua")),
    ("chains", include_str!("lua/lib/chains.lua")),
    ("blocks", include_str!("lua/lib/blocks.lua")),
    ("record_io", include_str!("lua/lib/record_io.lua")),
    ("expiry", include_str!("lua/lib/expiry.lua")),
    ("views", include_str!("lua/lib/views.lua")),
    ("locate", include_str!("lua/lib/locate.lua")),
    ("control", include_str!("lua/lib/control.lua")),
];

/// How a function starts, before its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// A queue's: its keys bound and its layout checked; `stamp`: a queue with no data
    /// gets the current layout (for functions that write: a look at a queue never used
    /// leaves no key behind).
    Queue { stamp: bool },
    /// A queue's keys bound, its layout not checked: `gaffer migrate`'s, which work on a
    /// queue of an older layout.
    Unchecked,
    /// No queue: KEYS is what the caller gives (a system's bucket, the switches hash).
    Bare,
}

/// One function of the library.
struct Def {
    name: &'static str,
    body: &'static str,
    start: Start,
    /// Whether it writes; one that does not is flagged `no-writes` and called with
    /// `FCALL_RO`.
    writes: bool,
}

const fn def(name: &'static str, body: &'static str, start: Start, writes: bool) -> Def {
    Def {
        name,
        body,
        start,
        writes,
    }
}

const WRITES: Start = Start::Queue { stamp: true };
const READS: Start = Start::Queue { stamp: false };

/// The bodies other functions call (settle_take.lua calls `settle_part` and `take_part`,
/// long.lua `settle_part`, follow_enqueue.lua `enqueue_part`), each defined once as a
/// local function `NAME_part(ARGV, ARGN)` of the library: whoever calls one gives it the
/// arguments that are its own, and the body is the same file that runs alone.
const PARTS: [(&str, &str); 3] = [
    ("settle", include_str!("lua/settle.lua")),
    ("take", include_str!("lua/take.lua")),
    ("enqueue", include_str!("lua/enqueue.lua")),
];

/// Every function but `gaffer migrate`'s passes (added from [`migrate::PASSES`]).
const FUNCTIONS: [Def; 26] = [
    def("enqueue", "return enqueue_part(ARGV, ARGN)", WRITES, true),
    def("take", "return take_part(ARGV, ARGN)", WRITES, true),
    def("settle", "return settle_part(ARGV, ARGN)", WRITES, true),
    def(
        "settle_take",
        include_str!("lua/settle_take.lua"),
        WRITES,
        true,
    ),
    def("release", include_str!("lua/release.lua"), WRITES, true),
    def("stats", include_str!("lua/stats.lua"), READS, false),
    def("dead_list", include_str!("lua/dead_list.lua"), READS, false),
    def("dead_move", include_str!("lua/dead_move.lua"), WRITES, true),
    def("find", include_str!("lua/find.lua"), WRITES, true),
    def("drop", include_str!("lua/drop.lua"), WRITES, true),
    // (a read, but it marks a task an api instance waits for)
    def(
        "record_get",
        include_str!("lua/record_get.lua"),
        READS,
        true,
    ),
    def("glance", include_str!("lua/glance.lua"), READS, false),
    def("list", include_str!("lua/list.lua"), READS, false),
    def("freeze", include_str!("lua/freeze.lua"), WRITES, true),
    def("housekeep", include_str!("lua/housekeep.lua"), WRITES, true),
    def("chain", include_str!("lua/chain.lua"), WRITES, true),
    def(
        "chain_members",
        include_str!("lua/chain_members.lua"),
        READS,
        false,
    ),
    def("long", include_str!("lua/long.lua"), WRITES, true),
    def(
        "follow_enqueue",
        include_str!("lua/follow_enqueue.lua"),
        WRITES,
        true,
    ),
    def("held", include_str!("lua/held.lua"), READS, false),
    def("system", include_str!("lua/system.lua"), WRITES, true),
    def(
        "layout_where",
        include_str!("lua/layout_where.lua"),
        Start::Unchecked,
        false,
    ),
    def("bucket", include_str!("lua/bucket.lua"), Start::Bare, true),
    def("switch", include_str!("lua/switch.lua"), Start::Bare, true),
    def(
        "outcount",
        include_str!("lua/outcount.lua"),
        Start::Bare,
        true,
    ),
    def("adopt", include_str!("lua/adopt.lua"), Start::Bare, true),
];

/// The functions that write but are not confirmed under `[cluster] wait_replicas`
/// (durability.rs): what a failover can only make happen again, never lose for whoever
/// was told it happened. A take (its tasks come back when their leases end, as after any
/// take Redis lost; its slot's settle is confirmed, and refused as stale), the rate
/// bucket's tokens, a record read's watch mark, housekeeping's deletions.
const UNCONFIRMED: [&str; 4] = ["take", "bucket", "record_get", "housekeep"];

/// The library as loaded: its text and name, and its version (the hash in its names).
pub(crate) struct Library {
    text: String,
    name: String,
    version: String,
}

/// The one library of this build.
pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(library);

fn library() -> Library {
    let mut code = format!(
        "{}\nlocal MIGRATE_FIELD = '{}'\n{}",
        layout::lua_header(),
        migrate::MIGRATE_FIELD,
        args::lua()
    );
    for (name, text) in LIB {
        code.push_str(&format!("\n-- lib/{name}.lua\n{text}"));
    }
    for (name, body) in PARTS {
        code.push_str(&format!(
            "\n-- {name}.lua\nlocal function {name}_part(ARGV, ARGN)\n{body}\nend\n"
        ));
    }
    let migrations = migrate::PASSES.iter().map(|p| (p.function_name(), p.lua()));
    let passes: Vec<(String, String)> = migrations.collect();
    let defs = FUNCTIONS
        .iter()
        .map(|d| (d.name, d.body, d.start, d.writes));
    let defs = defs.chain(
        passes
            .iter()
            .map(|(name, body)| (name.as_str(), body.as_str(), Start::Unchecked, true)),
    );
    let mut registrations = String::new();
    for (name, body, start, writes) in defs {
        registrations.push_str(&registration(name, body, start, writes));
    }
    // (the version hashes the text before the names that carry it are added)
    let version =
        redis::Script::new(&format!("{code}{registrations}")).get_hash()[..12].to_string();
    let text =
        format!("#!lua name=gaffer_{version}\nlocal VERSION = '{version}'\n{code}{registrations}");
    Library {
        text,
        name: format!("gaffer_{version}"),
        version,
    }
}

/// The Lua that registers function `name`, `body` run after its start.
fn registration(name: &str, body: &str, start: Start, writes: bool) -> String {
    let begin = match start {
        Start::Queue { stamp } => format!("bind(keys) layout_check({stamp})"),
        Start::Unchecked => "bind(keys)".to_string(),
        Start::Bare => "KEYS = keys CALL_TIME = nil".to_string(),
    };
    let flags = if writes { "" } else { "'no-writes'" };
    format!(
        "\n-- {name}\nredis.register_function{{function_name = 'gaffer_{name}_' .. VERSION, \
         flags = {{{flags}}}, callback = function(keys, ARGV)\n{begin}\nlocal ARGN = #ARGV\n{body}\nend}}\n"
    )
}

/// A function of the library, as called.
pub(crate) struct Function {
    name: String,
    writes: bool,
    /// Whether a call waits for replicas under `wait_replicas` (see [`UNCONFIRMED`]).
    confirmed: bool,
}

impl Function {
    /// The library's function `name` (a name of [`FUNCTIONS`], or a migration pass's).
    pub(crate) fn named(name: &str) -> Function {
        let writes = FUNCTIONS
            .iter()
            .find(|d| d.name == name)
            .is_none_or(|d| d.writes);
        debug_assert!(
            LIBRARY.text.contains(&format!("'gaffer_{name}_'")),
            "{name}"
        );
        Function {
            name: format!("gaffer_{name}_{}", LIBRARY.version),
            writes,
            confirmed: writes && !UNCONFIRMED.contains(&name),
        }
    }

    /// A call of the function, its keys and arguments to add.
    pub(crate) fn prepare_invoke(&self) -> Call<'_> {
        Call {
            function: self,
            keys: Vec::new(),
            args: Vec::new(),
            durability: Durability::default(),
        }
    }
}

/// One call of a [`Function`]: its keys and its arguments, and how its write is confirmed.
pub(crate) struct Call<'a> {
    function: &'a Function,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
    durability: Durability,
}

impl Call<'_> {
    /// Adds a key.
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds an argument (a value that writes several, such as a slice, adds each).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// Confirms the call's write on replicas as `durability` says, if its function is one
    /// that is confirmed (durability.rs).
    pub(crate) fn confirming(&mut self, durability: Durability) -> &mut Self {
        self.durability = durability;
        self
    }

    /// Calls the function, loading the library first when Redis lacks it; a confirmed
    /// write is followed by `WAIT` on the same connection, and fails as
    /// [`QueueError::NotConfirmed`] when too few replicas acknowledged it.
    pub(crate) async fn invoke_async<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> Result<T, QueueError> {
        let cmd = self.cmd();
        let wait = Some(self.durability).filter(|_| self.function.confirmed);
        let (reply, acknowledged) = match reply(conn, &cmd, wait).await {
            Err(e) if is_missing_function(&e) => {
                load(conn).await?;
                reply(conn, &cmd, wait).await?
            }
            other => other?,
        };
        if let (Some(wait), Some(acknowledged)) = (wait, acknowledged)
            && let Some(e) = durability::unconfirmed(wait, acknowledged)
        {
            return Err(e);
        }
        Ok(redis::from_redis_value(reply).map_err(RedisError::from)?)
    }

    fn cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd(if self.function.writes {
            "FCALL"
        } else {
            "FCALL_RO"
        });
        cmd.arg(&self.function.name).arg(self.keys.len());
        for k in &self.keys {
            cmd.arg(k.as_slice());
        }
        for a in &self.args {
            cmd.arg(a.as_slice());
        }
        cmd
    }
}

/// The reply of `cmd`, a server error as an error, and what its `WAIT` (if any) answered.
async fn reply(
    conn: &mut impl ConnectionLike,
    cmd: &redis::Cmd,
    wait: Option<Durability>,
) -> RedisResult<(Value, Option<durability::Acknowledged>)> {
    let (reply, acknowledged) = durability::send(conn, cmd, wait).await?;
    Ok((reply.extract_error()?, acknowledged))
}

/// Whether Redis answered that it has no such function.
fn is_missing_function(e: &RedisError) -> bool {
    e.detail()
        .is_some_and(|d| d.starts_with("Function not found"))
}

/// Loads the library on the server behind `conn` (every master of a cluster). A user
/// refused `FUNCTION LOAD` gets an error naming the library and who may load it.
async fn load(conn: &mut impl ConnectionLike) -> RedisResult<()> {
    let loaded: RedisResult<Value> = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&LIBRARY.text)
        .query_async(conn)
        .await;
    match loaded {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some("NOPERM") => Err(RedisError::from((
            ErrorKind::Client,
            "function library missing",
            format!(
                "redis lacks gaffer's function library {} and this user may not load it \
                 (FUNCTION LOAD refused: NOPERM): start a manager, master or api of this \
                 release first, or \
                 run `gaffer migrate` (see docs/SECURITY.md)",
                LIBRARY.name
            ),
        ))),
        Err(e) => Err(e),
    }
}

/// Every queue function, as called.
pub(crate) struct Scripts {
    pub enqueue: Function,
    pub take: Function,
    pub settle: Function,
    pub settle_take: Function,
    pub release: Function,
    pub stats: Function,
    pub dead_list: Function,
    pub dead_move: Function,
    pub find: Function,
    pub drop: Function,
    pub record_get: Function,
    pub glance: Function,
    pub list: Function,
    pub freeze: Function,
    pub housekeep: Function,
    pub chain: Function,
    pub chain_members: Function,
    pub long: Function,
    pub follow_enqueue: Function,
    pub held: Function,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    enqueue: Function::named("enqueue"),
    take: Function::named("take"),
    settle: Function::named("settle"),
    settle_take: Function::named("settle_take"),
    release: Function::named("release"),
    stats: Function::named("stats"),
    dead_list: Function::named("dead_list"),
    dead_move: Function::named("dead_move"),
    find: Function::named("find"),
    drop: Function::named("drop"),
    record_get: Function::named("record_get"),
    glance: Function::named("glance"),
    list: Function::named("list"),
    freeze: Function::named("freeze"),
    housekeep: Function::named("housekeep"),
    chain: Function::named("chain"),
    chain_members: Function::named("chain_members"),
    long: Function::named("long"),
    follow_enqueue: Function::named("follow_enqueue"),
    held: Function::named("held"),
});

/// The keys of one queue, in the order `bind` in lua/lib/keys.lua reads them. All share the hash tag
/// `{QUEUE}`, so one queue lives in one Redis Cluster slot; so do the per-priority ready
/// lists (`…:ready:PRIORITY`) that the scripts derive from the `ready` key, the task
/// records (`…:r:ID`) derived from the `r:` prefix (`exp` and `watch` hold which records
/// expire when and which ended tasks someone waits for), and the per-submitter indexes
/// (`…:idx:NAME`) derived from `idx`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub all: [String; 18],
    namespace: String,
}

impl Keys {
    pub fn new(namespace: &str, queue: &str) -> Self {
        let k = |suffix: &str| format!("{namespace}:{{{queue}}}:{suffix}");
        Keys {
            all: [
                k("ready"),
                k("delayed"),
                k("leased"),
                k("dead"),
                k("payload"),
                k("meta"),
                k("att"),
                k("err"),
                k("stats"),
                k("seq"),
                k("tok"),
                k("wake"),
                k("r:"),
                k("idx"),
                k("conf"),
                k("frozen"),
                k("exp"),
                k("watch"),
            ],
            namespace: namespace.to_string(),
        }
    }

    /// The namespace the queue's keys live under.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn wake(&self) -> &str {
        &self.all[11]
    }

    /// The zset of the queue's per-task leases (batch leases are derived from it).
    pub fn leased(&self) -> &str {
        &self.all[2]
    }

    /// The key of a task's record.
    pub fn record(&self, id: &str) -> String {
        format!("{}{id}", self.all[12])
    }

    /// The listing index of the queue's records.
    pub fn index(&self) -> &str {
        &self.all[13]
    }

    /// Ended tasks by when their record goes.
    pub fn expiry(&self) -> &str {
        &self.all[16]
    }

    /// The hash of run-time switches (`intake`) and record bookkeeping.
    pub fn conf(&self) -> &str {
        &self.all[14]
    }

    /// The channel on which the end of a task someone waits for is announced.
    pub fn ended_channel(&self) -> String {
        let prefix = &self.all[12];
        format!("{}ended", &prefix[..prefix.len() - 2])
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// The library's files as one text, as [`library`] puts them.
    fn lib_text() -> String {
        LIB.iter()
            .map(|(_, text)| *text)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A name used in a function before its `local` is defined would be a global there,
    /// which Redis refuses only when a call reaches it: each top-level definition of the
    /// library uses only names defined above it.
    #[test]
    fn each_library_name_is_defined_before_what_uses_it() {
        let text = lib_text();
        let items = items(&text);
        let all: HashSet<&str> = items.iter().flat_map(|i| i.names.clone()).collect();
        let mut defined = HashSet::new();
        for item in &items {
            for name in identifiers(item.text).filter(|n| all.contains(n)) {
                assert!(
                    defined.contains(name) || item.names.contains(&name),
                    "{name} is used before its definition in:\n{}",
                    item.text
                );
            }
            defined.extend(item.names.iter().copied());
        }
        assert!(all.contains("bind") && all.contains("layout_check"));
    }

    /// Top-level code runs when Redis loads the library, where no call can be made and
    /// the string, math and table libraries are out of reach (a string's methods are
    /// not): the files hold only definitions.
    #[test]
    fn the_library_files_hold_only_definitions() {
        for (name, text) in LIB {
            for (n, line) in text.lines().enumerate() {
                let top = !line.starts_with([' ', '\t']) && !line.trim().is_empty();
                let at = format!("lib/{name}.lua line {}: {line}", n + 1);
                assert!(
                    // ("}" closes a table of functions: one local for several)
                    !top || line.starts_with("local ")
                        || line.starts_with("--")
                        || line == "end"
                        || line == "}",
                    "{at}"
                );
                if line.starts_with("local ") && !line.starts_with("local function") {
                    let value = line.split_once('=').map_or("", |(_, v)| v);
                    for lib in ["string.", "math.", "table.", "redis.", "tonumber("] {
                        assert!(!value.contains(lib), "{at}");
                    }
                }
            }
        }
    }

    /// What only lib/blocks.lua may name: the blocks' keys and the helpers that read their
    /// layouts (ARCHITECTURE.md, invariant 36). keys.lua defines the keys.
    const BLOCK_INTERNALS: [&str; 22] = [
        "K_PKTS",
        "K_PKTW",
        "K_DONE",
        "K_BATCHES",
        "K_BATCHN",
        "PACKET",
        "batch_key",
        "batch_parts",
        "batch_gone",
        "batch_split",
        "batch_of",
        "batch_lease_framed",
        "packet_store_key",
        "packet_parts",
        "packet_fields_at",
        "packet_meta_of",
        "packet_record_of",
        "packet_record_at",
        "packet_unpack_waiting",
        "waiting_parts",
        "waiting_ids",
        "waiting_tasks",
    ];

    /// Packets, runs and batch leases have one home: every other file of the library, and
    /// every function's body, asks blocks.lua's functions and never reads their keys.
    #[test]
    fn the_block_keys_are_known_only_to_blocks_lua() {
        let blocks = LIB.iter().find(|(n, _)| *n == "blocks").expect("blocks").1;
        let defined: HashSet<&str> = identifiers(blocks).collect();
        for name in BLOCK_INTERNALS {
            assert!(defined.contains(name), "blocks.lua has no {name}");
        }
        let libs = LIB
            .iter()
            .filter(|(n, _)| !matches!(*n, "blocks" | "keys"))
            .map(|(n, text)| (format!("lib/{n}.lua"), *text));
        let bodies = FUNCTIONS
            .iter()
            .map(|d| (d.name.to_string(), d.body))
            .chain(PARTS.iter().map(|(n, b)| (format!("{n} (part)"), *b)))
            .chain(migrate::PASSES.iter().map(|p| (p.function_name(), p.body)));
        for (file, text) in libs.chain(bodies) {
            for name in identifiers(text) {
                assert!(
                    !BLOCK_INTERNALS.contains(&name),
                    "{file} names {name}: ask lib/blocks.lua instead"
                );
            }
        }
    }

    /// Every function reads its fixed arguments through a head (args.rs), by name: no
    /// body reads one by position (what follows a head, such as ids, is read from `H`).
    #[test]
    fn no_function_reads_an_argument_by_position() {
        let bodies = FUNCTIONS
            .iter()
            .map(|d| (d.name.to_string(), d.body))
            .chain(PARTS.iter().map(|(n, b)| (format!("{n} (part)"), *b)))
            .chain(migrate::PASSES.iter().map(|p| (p.function_name(), p.body)))
            .chain([("migrate".to_string(), include_str!("lua/migrate.lua"))]);
        for (name, body) in bodies {
            let by_position = body
                .match_indices("ARGV[")
                .any(|(i, _)| body[i + 5..].starts_with(|c: char| c.is_ascii_digit()));
            assert!(!by_position, "{name} reads an argument by position");
        }
    }

    #[test]
    fn the_names_of_the_library_and_its_functions_carry_its_version() {
        assert_eq!(LIBRARY.version.len(), 12);
        assert!(
            LIBRARY
                .text
                .starts_with(&format!("#!lua name={}\n", LIBRARY.name))
        );
        assert_eq!(
            Function::named("take").name,
            format!("gaffer_take_{}", LIBRARY.version)
        );
        assert!(!Function::named("stats").writes && Function::named("record_get").writes);
        for pass in migrate::PASSES {
            assert!(
                LIBRARY
                    .text
                    .contains(&format!("'gaffer_{}_'", pass.function_name()))
            );
        }
    }

    /// Every function left unconfirmed under `wait_replicas` is one that writes (a
    /// misspelt name would leave nothing out); reads are never followed by `WAIT`.
    #[test]
    fn the_unconfirmed_functions_are_writes_and_the_rest_of_the_writes_are_confirmed() {
        for name in UNCONFIRMED {
            let def = FUNCTIONS.iter().find(|d| d.name == name).expect(name);
            assert!(def.writes, "{name}");
            assert!(!Function::named(name).confirmed, "{name}");
        }
        for def in FUNCTIONS {
            let confirmed = Function::named(def.name).confirmed;
            assert_eq!(
                confirmed,
                def.writes && !UNCONFIRMED.contains(&def.name),
                "{}",
                def.name
            );
        }
        for name in ["enqueue", "settle", "settle_take", "freeze", "find", "long"] {
            assert!(Function::named(name).confirmed, "{name}");
        }
        assert!(!Function::named("stats").confirmed);
        for pass in migrate::PASSES {
            assert!(Function::named(&pass.function_name()).confirmed);
        }
    }

    #[test]
    fn identifiers_skip_strings_and_comments() {
        let used: Vec<&str> = identifiers("x = h() -- g()\ny = 'g' .. \"g\\\"g\" .. 1e5").collect();
        assert_eq!(used, ["x", "h", "y"]);
        // A quote left open ends with its line; long strings and comments are skipped.
        let used: Vec<&str> = identifiers("a = 'it\nb = [[g]] --[[ g\n g ]] c").collect();
        assert_eq!(used, ["a", "b", "c"]);
    }

    /// One top-level statement of the library (a `local` at the start of a line, with the
    /// comment lines above it and the indented lines and `end` below it) and what it defines.
    struct Item<'a> {
        text: &'a str,
        names: Vec<&'a str>,
    }

    fn items(lib: &str) -> Vec<Item<'_>> {
        let mut starts = Vec::new();
        let mut comment_start = None;
        let mut offset = 0;
        for line in lib.split_inclusive('\n') {
            if line.starts_with("--") || line.trim().is_empty() {
                comment_start.get_or_insert(offset);
            } else if line.starts_with("local ") {
                starts.push(comment_start.unwrap_or(offset));
                comment_start = None;
            } else {
                comment_start = None;
            }
            offset += line.len();
        }
        starts.push(lib.len());
        starts
            .windows(2)
            .map(|w| {
                let text = lib[w[0]..w[1]].trim_end_matches('\n');
                Item {
                    text,
                    names: defined_names(text),
                }
            })
            .collect()
    }

    /// The names a top-level `local` statement defines.
    fn defined_names(item: &str) -> Vec<&str> {
        let Some(line) = item.lines().find(|l| l.starts_with("local ")) else {
            return Vec::new();
        };
        let rest = &line["local ".len()..];
        if let Some(f) = rest.strip_prefix("function ") {
            return f.split('(').next().map(str::trim).into_iter().collect();
        }
        rest.split('=')
            .next()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect()
    }

    /// The identifiers of Lua code, outside its strings and comments. A string or comment
    /// this misreads can only add names (a helper given needlessly), or hide the rest of its
    /// line: a short string ends at the line's end, a long one (`[[…]]`) at its `]]`.
    fn identifiers(code: &str) -> impl Iterator<Item = &str> {
        let b = code.as_bytes();
        let mut i = 0;
        let long_end = |from: usize| code[from..].find("]]").map_or(b.len(), |at| from + at + 2);
        std::iter::from_fn(move || {
            while i < b.len() {
                match b[i] {
                    b'-' if b.get(i + 1) == Some(&b'-') => {
                        if code[i + 2..].starts_with("[[") {
                            i = long_end(i + 4);
                            continue;
                        }
                        while i < b.len() && b[i] != b'\n' {
                            i += 1;
                        }
                    }
                    b'[' if b.get(i + 1) == Some(&b'[') => i = long_end(i + 2),
                    q @ (b'\'' | b'"') => {
                        i += 1;
                        while i < b.len() && b[i] != q && b[i] != b'\n' {
                            i += if b[i] == b'\\' { 2 } else { 1 };
                        }
                        i += 1;
                    }
                    c if c == b'_' || c.is_ascii_alphabetic() => {
                        let start = i;
                        while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                            i += 1;
                        }
                        return Some(&code[start..i]);
                    }
                    c if c.is_ascii_digit() => {
                        // (a number's letters, as in 1e3 or 0x1f, are not names)
                        while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                            i += 1;
                        }
                    }
                    _ => i += 1,
                }
            }
            None
        })
    }

    #[test]
    fn every_key_of_a_queue_shares_its_hash_tag() {
        let keys = Keys::new("gaffer", "resize_photo");
        for key in &keys.all {
            assert!(key.starts_with("gaffer:{resize_photo}:"), "{key}");
        }
        assert_eq!(keys.wake(), "gaffer:{resize_photo}:wake");
    }
}
