//! gaffer's integration tests: one binary, against real redis-server processes that the
//! harness starts on free ports in temp dirs. No test depends on a Redis at 6379.

mod acl;
mod api;
mod batch_lease;
mod chains;
mod cli;
mod config;
mod drain;
mod fork_start;
mod hardening_access;
mod hardening_config;
mod hardening_ids;
mod hardening_load;
mod hardening_protocol;
mod harness;
mod host;
mod invariants;
mod long;
mod manager;
mod memory_exec;
mod migrate;
mod ordered;
mod outage;
mod packets;
mod preempt;
mod queue;
mod records;
mod secrets;
mod simulate;
mod slot;
mod systems;
mod tls;
mod top;
mod trace;
mod up;
