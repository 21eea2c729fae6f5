//! The layout version of a queue's data: which forms its keys hold, recorded in the
//! queue's `conf` hash (field [`FIELD`]) so that a gaffer never reads a form it does not
//! know. Every queue script checks it first (`layout_check` in lua/lib/keys.lua, one HGET)
//! and refuses a queue of another layout; `gaffer migrate` moves a queue's data from one
//! version to the next (`migrate.rs`).
//!
//! The versions:
//!
//! - **1**: what every release up to 2026-11-29 wrote, with no `layout` field. Besides
//!   the forms of layout 2 it may hold a task's meta in the `meta` hash with its bare
//!   payload in `payload` (releases before 2026-11-24), a tracked task's meta without its
//!   chain field (before metas kept it), and records with fewer than eight head fields
//!   (before records named their chain). Its chains are named by their global task's id
//!   (or `QUEUE:ID`), a global task's meta says `s` or `u`, and their members are found
//!   through lists under tags of their own (`{chain:ID}:tasks`) or from their records.
//! - **2**: the releases of 2026-11-29 and 2026-11-30. A task's meta is the head of its
//!   `payload` value (`task_value`), a tracked task's meta ends in its chain field, and
//!   every record has all its head fields; there is no `meta` hash. A chain's id is
//!   minted from its global task's number (`~cQUEUE.N`), a global task's meta says `g`
//!   and the chain, and each queue lists the members of a chain it holds in a key per
//!   chain (`chain:ID`, the ids separated by 0x1f); the migration lists layout 1's chains
//!   there under their old names. Ready tasks that came due other than at their enqueue
//!   keep when in `ready:due` (none after a migration: those count from their enqueue). A
//!   task submitted with a time limit of its own has it in its meta, after its
//!   max_attempts (`3t5000`). The first write to a queue with no data stamps it.
//! - **3**: this release. As layout 2, but a queue lists the members it holds of 128
//!   chains of consecutive numbers in one roster (`chains:~cQUEUE.K` for chains
//!   `~cQUEUE.N` with N / 128 = K; a chain of layout 1's names has a roster of its own,
//!   `chains:ID`), as entries `CHAIN 0x1f ID 0x1e`: a key per chain cost as much of
//!   Redis's time as the rest of a follow-up's enqueue. Its pass moves each list of
//!   layout 2 into its roster.
//!
//! A new version is one more number here, its description, and its passes in
//! `migrate.rs`; the Lua side gets the number from `lua_header`, never by hand.

/// The layout this gaffer reads and writes.
pub const CURRENT: u32 = 3;

/// The layout of a queue that holds data but no `layout` field: every release before
/// versions were recorded.
pub const UNRECORDED: u32 = 1;

/// The field of the queue's `conf` hash that holds its layout.
pub const FIELD: &str = "layout";

/// The Lua definitions of the layout that every queue script starts with (`LAYOUT`, the
/// current version, `LAYOUT_UNRECORDED` and `LAYOUT_FIELD`, as strings, the form HGET
/// returns), generated here so Rust and Lua cannot disagree.
pub(crate) fn lua_header() -> String {
    format!(
        "local LAYOUT, LAYOUT_UNRECORDED, LAYOUT_FIELD = '{CURRENT}', '{UNRECORDED}', '{FIELD}'"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lua_header_names_the_current_layout_and_field() {
        assert_eq!(
            lua_header(),
            format!("local LAYOUT, LAYOUT_UNRECORDED, LAYOUT_FIELD = '{CURRENT}', '1', 'layout'")
        );
        const { assert!(UNRECORDED < CURRENT) };
    }
}
