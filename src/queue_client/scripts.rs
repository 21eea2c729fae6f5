//! The Lua scripts behind every queue operation, each one round trip and atomic.
//! They share `lua/prelude.lua` (key order, chunked variadic calls, helpers).

use std::sync::LazyLock;

use redis::Script;

/// Every script the queue runs, compiled (hashed) once per process.
pub(crate) struct Scripts {
    pub enqueue: Script,
    pub take: Script,
    pub settle: Script,
    pub settle_take: Script,
    pub release: Script,
    pub stats: Script,
    pub dead_list: Script,
    pub dead_move: Script,
    pub find: Script,
    pub drop: Script,
    pub record_get: Script,
    pub list: Script,
    pub freeze: Script,
    pub housekeep: Script,
    pub chain: Script,
    pub long: Script,
}

const PRELUDE: &str = include_str!("lua/prelude.lua");

pub(crate) fn with_prelude(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

/// settle.lua and take.lua as two functions of one script, called by settle_take.lua:
/// each body inside a function whose parameters `ARGV` and `ARGN` (how many of ARGV are
/// its arguments) shadow the script's, so the bodies are the files as they are (their
/// record lines included) and cannot drift apart from the scripts that run alone.
fn settle_then_take() -> Script {
    Script::new(&format!(
        "{PRELUDE}\nlocal function settle_part(ARGV, ARGN)\n{}\nend\nlocal function take_part(ARGV, ARGN)\n{}\nend\n{}",
        include_str!("lua/settle.lua"),
        include_str!("lua/take.lua"),
        include_str!("lua/settle_take.lua"),
    ))
}

/// long.lua with settle.lua's body as its function `settle_part`, like
/// [`settle_then_take`]: a long task that returns is settled by the same code as any.
fn long_with_settle() -> Script {
    Script::new(&format!(
        "{PRELUDE}\nlocal function settle_part(ARGV, ARGN)\n{}\nend\n{}",
        include_str!("lua/settle.lua"),
        include_str!("lua/long.lua"),
    ))
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    enqueue: with_prelude(include_str!("lua/enqueue.lua")),
    take: with_prelude(include_str!("lua/take.lua")),
    settle: with_prelude(include_str!("lua/settle.lua")),
    settle_take: settle_then_take(),
    release: with_prelude(include_str!("lua/release.lua")),
    stats: with_prelude(include_str!("lua/stats.lua")),
    dead_list: with_prelude(include_str!("lua/dead_list.lua")),
    dead_move: with_prelude(include_str!("lua/dead_move.lua")),
    find: with_prelude(include_str!("lua/find.lua")),
    drop: with_prelude(include_str!("lua/drop.lua")),
    record_get: with_prelude(include_str!("lua/record_get.lua")),
    list: with_prelude(include_str!("lua/list.lua")),
    freeze: with_prelude(include_str!("lua/freeze.lua")),
    housekeep: with_prelude(include_str!("lua/housekeep.lua")),
    chain: with_prelude(include_str!("lua/chain.lua")),
    long: long_with_settle(),
});

/// The keys of one queue, in the order `prelude.lua` reads them. All share the hash tag
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
    use super::Keys;

    #[test]
    fn every_key_of_a_queue_shares_its_hash_tag() {
        let keys = Keys::new("gaffer", "resize_photo");
        for key in &keys.all {
            assert!(key.starts_with("gaffer:{resize_photo}:"), "{key}");
        }
        assert_eq!(keys.wake(), "gaffer:{resize_photo}:wake");
    }
}
