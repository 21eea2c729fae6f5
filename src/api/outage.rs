//! The api's Redis outages, logged as one spell per instance however many requests meet
//! them: a busy instance would otherwise warn once per request, and a quiet one not at all.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::queue_client::{Cause, OutageLog};

/// One instance's spells without Redis, shared by its requests, its health check and its
/// config tick (which looks every few seconds, so a spell's end is seen without traffic).
#[derive(Debug, Default)]
pub struct Outage {
    /// Whether a spell is on: a request that got its answer from Redis reads only this.
    out: AtomicBool,
    log: Mutex<OutageLog>,
}

impl Outage {
    /// A call failed in an outage (`cause`), with `error` as its text; `what` says which.
    pub fn failed(&self, what: &str, cause: Cause, error: &dyn std::fmt::Display) {
        let mut log = self.log.lock().expect("outage log lock");
        log.failed_for(what, cause, error);
        self.out.store(true, Ordering::Relaxed);
    }

    /// Redis answered: ends the spell, if there was one.
    pub fn answered(&self) {
        if !self.out.load(Ordering::Relaxed) {
            return;
        }
        let mut log = self.log.lock().expect("outage log lock");
        log.answered();
        self.out.store(log.is_out(), Ordering::Relaxed);
    }
}
