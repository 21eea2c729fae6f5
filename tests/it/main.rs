//! gaffer's integration tests: one binary, against real redis-server processes that the
//! harness starts on free ports in temp dirs. No test depends on a Redis at 6379.
//!
//! The files: `harness.rs` (servers, the shared cluster, polling, `on_both!` for a case on
//! one server and on a 3-master Redis Cluster), `queue.rs`, `batch_lease.rs`, `records.rs`
//! and `packets.rs` (the task store), `config.rs`, `cli.rs`, `host.rs` (real master
//! processes), `slot.rs` (the slot loop in-process), `simulate.rs` (the acceptance bar on
//! the shipped traces), `trace.rs` (`trace record` on a real manager and master), `api.rs`
//! (the task service over real HTTP: `Service::start`, `request`), `console.rs` (the web console's
//! logins, cookies, CSRF and proxy mode over real HTTP), `api_console_data.rs` (what
//! the web console reads and does: the cluster, one queue, search, dead letters, retry, by
//! key rights), `chains.rs` (chains
//! through a real master's exec slots and the api, on one Redis and on a Redis Cluster),
//! `long.rs` (long tasks on real masters with distinct host names), `drain.rs` (stops with
//! Redis down or frozen), `durability.rs` (`wait_replicas`: writes confirmed on real
//! replicas, one server's and a Redis Cluster's), `preempt.rs` (a stop mid-batch), `systems.rs` (system switches
//! and the rate cap on real masters), `ordered.rs` (ordered queues across four hosts),
//! `fork_start.rs` and `memory_exec.rs` (forked exec children, a host's memory),
//! `manager.rs` (leadership, fencing, schedules), `schedules.rs` (stored schedules
//! through a real api across a manager failover, their key rules, `gaffer schedules`),
//! `retired.rs` (queues removed from the config: the registry of names, `stats`, `tasks`
//! and `queues retire` on them),
//! `redis_node.rs` (which Redis node each role names in `/status`, its host report and
//! `stats`, across a Sentinel failover and a Redis Cluster failover),
//! `retries.rs` (the `retry` table through a real master), `timeouts.rs` (a batch queue's
//! `timeout` per task, exec and Rust handlers), `outage.rs` (the regressions
//! the fault suite found), `tls.rs` (TLS-only servers and clusters; `GAFFER_TEST_TLS=1` makes the
//! harness's servers TLS-only for the queue and record tests), `acl.rs` (each role's ACL
//! line, read out of `docs/SECURITY.md`, on a server with the default user off),
//! `secrets.rs` (every output searched for a known password and token), `hardening_*.rs`
//! (access, config, ids, load, protocol), `up.rs` (`gaffer up` and the dashboards' metrics
//! against a real scrape), `top.rs` (`gaffer top` in tmux), `invariants.rs` (the
//! architecture invariants checked on the sources), `browser/` (the web console in a real
//! headless Chromium through WebDriver).

mod acl;
mod api;
mod api_console_data;
mod batch_lease;
mod browser;
mod chains;
mod cli;
mod config;
mod console;
mod drain;
mod durability;
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
mod redis_node;
mod retired;
mod retries;
mod schedules;
mod secrets;
mod sentinel;
mod simulate;
mod slot;
mod systems;
mod timeouts;
mod tls;
mod top;
mod trace;
mod up;
