//! The Lua scripts behind every queue operation, each one round trip and atomic.
//! They share `lua/prelude.lua` (key order, chunked variadic calls, helpers).

use std::sync::LazyLock;

use redis::Script;

use super::layout;

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
    pub glance: Script,
    pub list: Script,
    pub freeze: Script,
    pub housekeep: Script,
    pub chain: Script,
    pub long: Script,
    pub follow_enqueue: Script,
    pub held: Script,
}

const PRELUDE: &str = include_str!("lua/prelude.lua");

/// `body` after the part of the prelude it uses and the queue's layout check
/// (`layout_check` in lua/prelude.lua), which stamps a new queue: for scripts that write.
pub(crate) fn with_prelude(body: &str) -> Script {
    Script::new(&checked(body, true))
}

/// [`with_prelude`] for a script that only reads: its check stamps nothing, so that a
/// look at a queue never used leaves no key behind.
fn reading_with_prelude(body: &str) -> Script {
    Script::new(&checked(body, false))
}

/// `body` after the layout's definitions, the part of the prelude it uses and the layout
/// check, as one script's text.
fn checked(body: &str, stamp: bool) -> String {
    let body = format!("layout_check({stamp})\n{body}");
    unchecked(&body)
}

/// `body` after the layout's definitions and the part of the prelude it uses, with no
/// layout check: for `gaffer migrate`'s passes, which run on a queue of an older layout.
pub(crate) fn unchecked(body: &str) -> String {
    format!("{}\n{}\n{body}", layout::lua_header(), prelude_for(body))
}

/// The prelude's top-level definitions that `body` uses, directly or through others, in
/// their order. Redis runs a script's whole text at every call: each `local function` is
/// a closure made anew, and making one walks the list of open upvalues, which grows with
/// every top-level local before it. The whole prelude cost every call about 16 µs of
/// Redis's time, as much as a batch's take of 100 tasks spends on them; a script pays
/// only for the helpers it calls.
fn prelude_for(body: &str) -> String {
    // (read once for every script)
    static ITEMS: LazyLock<Vec<PreludeItem<'static>>> = LazyLock::new(|| prelude_items(PRELUDE));
    let items = &*ITEMS;
    let mut need: std::collections::HashSet<&str> = identifiers(body).collect();
    let mut keep = vec![false; items.len()];
    loop {
        let mut grew = false;
        for (i, item) in items.iter().enumerate() {
            if !keep[i] && (item.names.is_empty() || item.names.iter().any(|n| need.contains(n))) {
                keep[i] = true;
                grew = true;
                need.extend(identifiers(item.text));
            }
        }
        if !grew {
            break;
        }
    }
    items
        .iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(item, _)| item.text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// One top-level statement of the prelude (a `local` at the start of a line, with the
/// comment lines above it and the indented lines and `end` below it) and what it defines.
struct PreludeItem<'a> {
    text: &'a str,
    names: Vec<&'a str>,
}

fn prelude_items(prelude: &str) -> Vec<PreludeItem<'_>> {
    let mut starts = Vec::new();
    let mut comment_start = None;
    let mut offset = 0;
    for line in prelude.split_inclusive('\n') {
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
    starts.push(prelude.len());
    starts
        .windows(2)
        .map(|w| {
            let text = prelude[w[0]..w[1]].trim_end_matches('\n');
            PreludeItem {
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

/// settle.lua and take.lua as two functions of one script, called by settle_take.lua:
/// each body inside a function whose parameters `ARGV` and `ARGN` (how many of ARGV are
/// its arguments) shadow the script's, so the bodies are the files as they are (their
/// record lines included) and cannot drift apart from the scripts that run alone.
fn settle_then_take() -> Script {
    with_prelude(&format!(
        "local function settle_part(ARGV, ARGN)\n{}\nend\nlocal function take_part(ARGV, ARGN)\n{}\nend\n{}",
        include_str!("lua/settle.lua"),
        include_str!("lua/take.lua"),
        include_str!("lua/settle_take.lua"),
    ))
}

/// long.lua with settle.lua's body as its function `settle_part`, like
/// [`settle_then_take`]: a long task that returns is settled by the same code as any.
fn long_with_settle() -> Script {
    with_prelude(&format!(
        "local function settle_part(ARGV, ARGN)\n{}\nend\n{}",
        include_str!("lua/settle.lua"),
        include_str!("lua/long.lua"),
    ))
}

/// follow_enqueue.lua with enqueue.lua's body as its function `enqueue_part`, like
/// [`settle_then_take`]: a slot's follow-ups, after the check that their parents' leases
/// stand, in one call.
fn enqueue_after_lease_check() -> Script {
    with_prelude(&format!(
        "local function enqueue_part()\n{}\nend\n{}",
        include_str!("lua/enqueue.lua"),
        include_str!("lua/follow_enqueue.lua"),
    ))
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    enqueue: with_prelude(include_str!("lua/enqueue.lua")),
    take: with_prelude(include_str!("lua/take.lua")),
    settle: with_prelude(include_str!("lua/settle.lua")),
    settle_take: settle_then_take(),
    release: with_prelude(include_str!("lua/release.lua")),
    stats: reading_with_prelude(include_str!("lua/stats.lua")),
    dead_list: reading_with_prelude(include_str!("lua/dead_list.lua")),
    dead_move: with_prelude(include_str!("lua/dead_move.lua")),
    find: with_prelude(include_str!("lua/find.lua")),
    drop: with_prelude(include_str!("lua/drop.lua")),
    record_get: reading_with_prelude(include_str!("lua/record_get.lua")),
    glance: reading_with_prelude(include_str!("lua/glance.lua")),
    list: reading_with_prelude(include_str!("lua/list.lua")),
    freeze: with_prelude(include_str!("lua/freeze.lua")),
    housekeep: with_prelude(include_str!("lua/housekeep.lua")),
    chain: with_prelude(include_str!("lua/chain.lua")),
    long: long_with_settle(),
    follow_enqueue: enqueue_after_lease_check(),
    held: reading_with_prelude(include_str!("lua/held.lua")),
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

    /// The zset of the queue's per-task leases (batch leases are derived from it).
    pub fn leased(&self) -> &str {
        &self.all[2]
    }

    /// The key of a task's record.
    pub fn record(&self, id: &str) -> String {
        format!("{}{id}", self.all[12])
    }

    /// The list of the ids of chain `chain`'s tasks in the queue (prelude.lua's
    /// `chain_index`).
    pub fn chain(&self, chain: &str) -> String {
        let rec = &self.all[12];
        format!("{}chain:{chain}", &rec[..rec.len() - 2])
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
    use super::*;

    #[test]
    fn a_script_gets_the_prelude_items_it_uses_and_those_they_use_in_order() {
        let prelude = "-- head\nlocal A, B = 1, 2\nlocal C = 3\n\n-- f\nlocal function f(x)\n  -- uses C, not B\n  return A + C + x\nend\nlocal function g()\n  return 'f(B)'\nend\nlocal function h() return f(1) end\n";
        let items = prelude_items(prelude);
        let names: Vec<Vec<&str>> = items.iter().map(|i| i.names.clone()).collect();
        assert_eq!(
            names,
            [vec!["A", "B"], vec!["C"], vec!["f"], vec!["g"], vec!["h"]]
        );
        assert_eq!(
            items[2].text,
            "\n-- f\nlocal function f(x)\n  -- uses C, not B\n  return A + C + x\nend"
        );
        let used: Vec<&str> = identifiers("x = h() -- g()\ny = 'g' .. \"g\\\"g\" .. 1e5").collect();
        assert_eq!(used, ["x", "h", "y"]);
        // A quote left open ends with its line; long strings and comments are skipped.
        let used: Vec<&str> = identifiers("a = 'it\nb = [[g]] --[[ g\n g ]] c").collect();
        assert_eq!(used, ["a", "b", "c"]);
    }

    /// The prelude has the shape `prelude_items` reads: at the start of a line only a
    /// `local`, a comment or the `end` of a function. A top-level assignment (`x = …`)
    /// would be cut from the item that defines its name.
    #[test]
    fn the_prelude_is_top_level_locals_only() {
        for (n, line) in PRELUDE.lines().enumerate() {
            let top = !line.starts_with([' ', '\t']) && !line.trim().is_empty();
            assert!(
                !top || line.starts_with("local ") || line.starts_with("--") || line == "end",
                "prelude.lua line {}: {line}",
                n + 1
            );
        }
    }

    /// Every script body and the prelude items it is given: no name the prelude defines
    /// and the script uses may be left out (Redis would fail the call on a nil global).
    #[test]
    fn no_script_misses_a_prelude_item_it_uses() {
        let all: std::collections::HashSet<&str> = prelude_items(PRELUDE)
            .iter()
            .flat_map(|i| i.names.clone())
            .collect();
        let bodies = [
            include_str!("lua/enqueue.lua"),
            include_str!("lua/take.lua"),
            include_str!("lua/settle.lua"),
            include_str!("lua/settle_take.lua"),
            include_str!("lua/release.lua"),
            include_str!("lua/stats.lua"),
            include_str!("lua/dead_list.lua"),
            include_str!("lua/dead_move.lua"),
            include_str!("lua/find.lua"),
            include_str!("lua/drop.lua"),
            include_str!("lua/record_get.lua"),
            include_str!("lua/glance.lua"),
            include_str!("lua/list.lua"),
            include_str!("lua/freeze.lua"),
            include_str!("lua/housekeep.lua"),
            include_str!("lua/chain.lua"),
            include_str!("lua/long.lua"),
            include_str!("lua/system.lua"),
            include_str!("lua/held.lua"),
        ];
        // (the script that ends in enqueue.lua, as `enqueue_after_lease_check` puts it
        // together)
        let follow_enqueue = format!(
            "local function enqueue_part()\n{}\nend\n{}",
            include_str!("lua/enqueue.lua"),
            include_str!("lua/follow_enqueue.lua"),
        );
        for body in bodies.into_iter().chain([follow_enqueue.as_str()]) {
            let given = prelude_for(body);
            let defined: std::collections::HashSet<&str> = prelude_items(&given)
                .iter()
                .flat_map(|i| i.names.clone())
                .collect();
            let text = format!("{given}\n{body}");
            for name in identifiers(&text).filter(|n| all.contains(n)) {
                assert!(defined.contains(name), "{name} missing for {}", &body[..60]);
            }
            assert!(given.len() < PRELUDE.len(), "{}", &body[..60]);
        }
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
