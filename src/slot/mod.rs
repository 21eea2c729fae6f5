//! Slots: the worker processes. A slot serves one queue type for its whole life: it takes
//! a batch of leased tasks, hands it to the queue's [`Handler`], settles the outcomes, and
//! tells its master how it goes.
//!
//! This module knows nothing of the manager or the balancer; it meets the rest of gaffer
//! only through `queue_client` and the [`SlotEvent`]s it sends its master.

pub mod builtin;
pub mod exec;
mod handler;

pub use handler::{
    Handler, HandlerError, MAX_JSON_DEPTH, Outcome, PayloadError, Registry, SlotContext, Task,
    check_json_depth, check_payload_size,
};
mod run;

pub use run::{EXIT_FATAL, EXIT_RECYCLE, EXIT_STOPPED, SlotEvent, SlotSpec, run_slot, slot_main};
