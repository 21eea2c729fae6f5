//! One module per command: its arguments (clap) beside the function that runs it.
//! [`crate::cli`] parses and dispatches; these do the work and print.
//!
//! The commands: `config`, `push`, `stats`, `bench` (and `bench api`), `up`, `master`,
//! `manager`, `top`, `drain`, `simulate` (with `--compare`), `trace` (`record`), `pause`
//! (and resume), `intake`, `system` (external systems: list, pause, resume, disable,
//! enable), `queues` (list, retire: queues removed from the config), `schedules` (list,
//! pause, resume, delete), `api` (and
//! `hash-token`), and `tasks/` (`dead` with requeue and purge, `show`,
//! `list`, `chain`, `control`: cancel, freeze, thaw). A command that starts a role installs
//! its signal handlers through `crate::signals` and hands the role tokens.

pub mod api;
pub mod bench;
pub mod config;
pub mod drain;
pub mod intake;
pub mod manager;
pub mod master;
pub mod migrate;
pub mod pause;
pub mod push;
pub mod queues;
pub mod schedules;
pub mod simulate;
pub mod stats;
pub mod system;
pub mod tasks;
pub mod top;
pub mod trace;
pub mod up;
