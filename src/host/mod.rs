//! Neutral ground for the roles of a worker host: what the master (with its zygote) and
//! the slots share, so that neither imports the other.
//!
//! - [`sysinfo`]: readings from `/proc` and cgroups (the master sizes the host with them,
//!   a slot checks its own memory);
//! - [`proto`]: what a slot and its master say to each other (the spec a slot starts from,
//!   its events, its exit codes);
//! - [`handler`]: the handler API and the [`handler::Registry`] (the zygote preloads
//!   through it, the master asks it what this host can run, a slot runs the handlers);
//! - [`fork`]: the line on which a slot of a `start = "fork"` exec queue asks the zygote
//!   for its child.
//!
//! It imports neither `master` nor `slot` (checked by `tests/it/invariants.rs`). Its
//! public items are reached as `gaffer::slot::…` and `gaffer::master::sysinfo`.

pub mod fork;
pub mod handler;
pub mod proto;
pub mod sysinfo;
