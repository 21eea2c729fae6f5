//! The exec handler: one long-lived child per slot speaking JSON lines (DESIGN.md,
//! Handlers). Placeholder until the protocol lands.

use super::handler::{Handler, HandlerError, Outcome, SlotContext, Task};
use crate::config::{Handler as HandlerConfig, QueueConfig};

/// Runs the queue's `command` as a child and exchanges one request and one reply per
/// batch with it.
#[derive(Debug)]
pub struct Exec {
    command: Vec<String>,
}

impl Handler for Exec {
    fn preload(queue: &QueueConfig) -> Result<Self, HandlerError> {
        let HandlerConfig::Exec { command } = &queue.handler else {
            return Err(HandlerError::new("exec: queue is not configured as exec"));
        };
        Ok(Exec {
            command: command.clone(),
        })
    }

    fn handle(&mut self, _: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        let reason = format!("exec: {:?} not implemented", self.command);
        vec![Outcome::Fail { reason }; batch.len()]
    }
}
