//! The handle on one queue and what every operation on it shares: the keys, the worker
//! that records name, the script invocation and how its writes are confirmed.

use std::sync::Arc;

use super::scripts::{Call, Function, Keys};
use super::{Durability, QueueLimits, RedisConn, record};

/// A handle on one queue: cheap to clone, safe to share between tasks.
#[derive(Clone)]
pub struct Queue {
    pub(super) conn: RedisConn,
    pub(super) keys: Arc<Keys>,
    pub(super) name: Arc<str>,
    pub(super) limits: QueueLimits,
    pub(super) worker: Option<Arc<Worker>>,
    /// How its writes are confirmed on replicas (durability.rs).
    pub(super) durability: Durability,
}

/// Who takes and settles, as task records show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// The host's name.
    pub host: String,
    /// The slot's number on its host.
    pub slot: u32,
}

impl Queue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue's limits.
    pub fn limits(&self) -> QueueLimits {
        self.limits.clone()
    }

    /// The same queue, taking and settling as `worker`: the records of the tasks it takes
    /// name its host and slot.
    pub fn with_worker(mut self, worker: Worker) -> Self {
        self.worker = Some(Arc::new(worker));
        self
    }

    pub(super) fn worker_args(&self) -> (&str, String) {
        match &self.worker {
            Some(w) => (&w.host, w.slot.to_string()),
            None => ("", String::new()),
        }
    }

    pub(super) fn ttl_arg(&self) -> u64 {
        record::ttl_ms(self.limits.history_ttl)
    }

    pub(super) fn invocation<'a>(&self, script: &'a Function) -> Call<'a> {
        let mut inv = script.prepare_invoke();
        inv.confirming(self.durability);
        for k in &self.keys.all {
            inv.key(k);
        }
        inv
    }
}
