//! One module per command: its arguments (clap) beside the function that runs it.
//! [`crate::cli`] parses and dispatches; these do the work and print.

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
pub mod simulate;
pub mod stats;
pub mod system;
pub mod tasks;
pub mod top;
pub mod trace;
pub mod up;
