//! Moving a queue's data to the current [`layout`](super::layout) (`gaffer migrate`), in
//! calls of bounded work while producers and slots of the previous release run.
//!
//! A migration from layout N to N + 1 is the [`PASSES`] whose `from` is N, in their order.
//! A pass is a Lua body run as `pass(cursor, budget)` by lua/migrate.lua, which keeps the
//! position (`PASS CURSOR`) in the queue's `conf` hash (field [`MIGRATE_FIELD`]) in the same
//! call as the work: a migrate stopped anywhere (Ctrl-C, a crash, a lost connection) goes
//! on from there when run again, and two running at once step in turn. The last pass of a
//! step stamps layout N + 1 as it ends. While a queue has not reached the current layout,
//! this gaffer's scripts refuse it ([`QueueError::Layout`]), so a pass may assume only
//! binaries of the previous release touch the queue meanwhile.

use std::sync::LazyLock;

use redis::Value;

use super::args::MigrateHead;
use super::layout::{self, CURRENT, UNRECORDED};
use super::reply::int;
use super::scripts::{Function, Keys};
use super::{Queue, QueueError, RedisConn};

/// The field of a queue's `conf` hash that holds where its migration is.
pub const MIGRATE_FIELD: &str = "migrate";

/// One pass of a migration step: Lua that rewrites a bounded part of a queue's data per
/// call (see the module's doc).
pub struct Pass {
    /// The layout the step starts from.
    pub from: u32,
    /// The pass's name, as `gaffer migrate` reports it and the position records it (no
    /// space).
    pub name: &'static str,
    /// Its body: given `cursor` ('0' to begin) and `budget` (items to look at), returns
    /// the next cursor (nil when done; no newline) and how many items it looked at.
    pub(super) body: &'static str,
}

/// Every pass of every step, in the order they run. A new pass is one more entry.
pub const PASSES: &[Pass] = &[
    Pass {
        from: 1,
        name: "forms",
        body: include_str!("lua/migrate_forms.lua"),
    },
    Pass {
        from: 1,
        name: "chains",
        body: include_str!("lua/migrate_chains.lua"),
    },
    Pass {
        from: 2,
        name: "rosters",
        body: include_str!("lua/migrate_rosters.lua"),
    },
];

impl Pass {
    /// The name of its function in the library (`scripts.rs`).
    pub(super) fn function_name(&self) -> String {
        format!("migrate_{}", self.name)
    }

    /// Its function's body: the pass's own as `pass(cursor, budget)`, then
    /// lua/migrate.lua.
    pub(super) fn lua(&self) -> String {
        format!(
            "local function pass(cursor, budget)\n{}\nend\n{}",
            self.body,
            include_str!("lua/migrate.lua")
        )
    }
}

/// Each pass's function.
static FUNCTIONS: LazyLock<Vec<Function>> = LazyLock::new(|| {
    PASSES
        .iter()
        .map(|p| Function::named(&p.function_name()))
        .collect()
});

/// Where a queue's layout stands (lua/layout_where.lua).
static WHERE: LazyLock<Function> = LazyLock::new(|| Function::named("layout_where"));

/// A queue's layout and migration, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutState {
    /// Its layout: recorded, or [`UNRECORDED`] when it holds data and records none;
    /// `None` for a queue with no data (its first write stamps the current layout).
    pub layout: Option<u32>,
    /// The migration under way: its pass and cursor.
    pub position: Option<(String, String)>,
    recorded: String,
    position_text: String,
}

/// What one call of [`Queue::migrate_step`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrateStep {
    /// Nothing to do: the queue is at the current layout, or holds no data.
    Done,
    /// The pass named worked on a part of the data: `looked_at` items.
    Worked {
        /// The pass.
        pass: &'static str,
        /// The layout the step leads to.
        to: u32,
        /// Items looked at.
        looked_at: u64,
        /// Whether the pass ended with this call.
        pass_done: bool,
    },
    /// Another migrate moved the position meanwhile: nothing done, call again.
    Raced,
}

impl Queue {
    /// The queue's layout and where its migration is.
    pub async fn layout_state(&self) -> Result<LayoutState, QueueError> {
        let mut conn = self.conn.clone();
        let reply: Vec<Value> = self.invocation(&WHERE).invoke_async(&mut conn).await?;
        let text = |i: usize| match reply.get(i) {
            Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
            _ => Err(QueueError::Protocol("layout state: not a string".into())),
        };
        let (recorded, position_text) = (text(0)?, text(1)?);
        let holds = reply.get(2).map(int).transpose()? == Some(1);
        let layout = match recorded.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) if recorded.is_empty() && !holds => None,
            Err(_) => Some(UNRECORDED),
        };
        let position = position_text
            .split_once(' ')
            .map(|(p, c)| (p.to_string(), c.to_string()));
        Ok(LayoutState {
            layout,
            position,
            recorded,
            position_text,
        })
    }

    /// One call of the migration toward [`CURRENT`]: at most `budget` items looked at.
    /// Refuses a queue of a newer layout than this gaffer's.
    pub async fn migrate_step(&self, budget: u32) -> Result<MigrateStep, QueueError> {
        let state = self.layout_state().await?;
        let Some(from) = state.layout.filter(|&l| l != CURRENT) else {
            return Ok(MigrateStep::Done);
        };
        if from > CURRENT {
            return Err(QueueError::Layout {
                queue: self.name.to_string(),
                found: from,
                need: CURRENT,
            });
        }
        let step: Vec<usize> = (0..PASSES.len())
            .filter(|&i| PASSES[i].from == from)
            .collect();
        let (at, cursor) = match &state.position {
            None => (0, "0".to_string()),
            Some((name, cursor)) => {
                let at = step.iter().position(|&i| PASSES[i].name == name);
                let at = at.ok_or_else(|| {
                    QueueError::Protocol(format!(
                        "queue {} is in migration pass {name:?}, which this gaffer does not know",
                        self.name
                    ))
                })?;
                (at, cursor.clone())
            }
        };
        let pass = &PASSES[step[at]];
        let next = step.get(at + 1).map_or("", |&i| PASSES[i].name);
        let mut inv = self.invocation(&FUNCTIONS[step[at]]);
        inv.head(&MigrateHead {
            position: state.position_text.clone(),
            layout: state.recorded.clone(),
            pass: pass.name,
            cursor,
            next,
            to: from + 1,
            budget: budget.max(1),
        });
        let mut conn = self.conn.clone();
        let (kind, n): (String, u64) = inv.invoke_async(&mut conn).await?;
        Ok(match kind.as_str() {
            "raced" => MigrateStep::Raced,
            "more" | "done" => MigrateStep::Worked {
                pass: pass.name,
                to: from + 1,
                looked_at: n,
                pass_done: kind == "done",
            },
            _ => return Err(QueueError::Protocol(format!("migrate returned {kind:?}"))),
        })
    }
}

/// The layout `queue`'s conf records (`None`: none recorded), read with one HGET: for a
/// master, which runs no slot for a queue of a newer layout than its own.
pub async fn recorded_layout(
    conn: &RedisConn,
    namespace: &str,
    queue: &str,
) -> Result<Option<u32>, QueueError> {
    let keys = Keys::new(namespace, queue);
    let v: Option<String> = redis::cmd("HGET")
        .arg(keys.conf())
        .arg(layout::FIELD)
        .query_async(&mut conn.clone())
        .await?;
    Ok(v.and_then(|v| v.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every step from layout 1 to the current one has a pass, so a migration always
    /// ends by stamping the next layout; names are unique and hold no space.
    #[test]
    fn every_step_has_passes_with_distinct_names() {
        for from in UNRECORDED..CURRENT {
            assert!(PASSES.iter().any(|p| p.from == from), "no pass from {from}");
        }
        for (i, p) in PASSES.iter().enumerate() {
            assert!(!p.name.contains(' ') && !p.name.is_empty());
            assert!(p.from < CURRENT);
            assert!(PASSES[..i].iter().all(|q| q.name != p.name));
        }
    }
}
