//! Slots: the worker processes. A slot serves one queue type for its whole life: it takes
//! a batch of leased tasks, hands it to the queue's [`Handler`], settles the outcomes, and
//! tells its master how it goes.
//!
//! This module knows nothing of the manager, the balancer or the master; it meets the rest
//! of gaffer only through `queue_client` and the neutral `crate::host`: the handler API,
//! the [`SlotEvent`]s it sends its master and the exit codes it ends with (re-exported
//! here, their public home).

pub mod builtin;
pub mod exec;
mod followups;
mod registry;
mod run;
mod timeout;

pub use crate::host::handler::{
    Done, FollowUp, Handler, HandlerError, MAX_JSON_DEPTH, Outcome, PayloadError, Registry,
    SlotContext, Task, check_json_depth, check_payload_size,
};
pub use crate::host::proto::{
    EXIT_FATAL, EXIT_RECYCLE, EXIT_STOPPED, RETIRE_SIGNAL, SlotEvent, SlotSpec,
};
pub use run::{HANDED_BACK_NOTE, run_slot, slot_main};
