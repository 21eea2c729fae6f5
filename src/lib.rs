//! gaffer: a supervisor for clusters of queue workers on Redis.
//!
//! The library is the whole product; `src/main.rs` only parses the command line and
//! calls into it, so teams can build their own binary with their own handlers
//! ([`slot::Handler`], [`slot::Registry`]).

pub mod api;
mod backoff;
pub mod balancer;
pub mod bench;
pub mod chain;
// clap shows the argument docs as `--help`, where `[table].key` names a config key, not a
// Rust item for rustdoc to link.
#[allow(rustdoc::broken_intra_doc_links)]
pub mod cli;
pub mod cluster;
pub mod config;
mod host;
pub mod http;
pub mod manager;
pub mod master;
pub mod printable;
pub mod queue_client;
pub mod redis_server;
pub mod schedule;
pub mod signals;
pub mod simulate;
pub mod slot;
pub mod tui;
pub mod up;
