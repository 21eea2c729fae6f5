//! Built-in handlers for demos and tests: each exercises one part of the machinery.
//!
//! `noop`, `sleep`, `flaky`, `memhog` and `preload_demo`. Each reads its settings from its
//! options, as a team's handler does, and stops between tasks once the slot asks
//! (`SlotContext::should_stop`).

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::config::{Handler as HandlerConfig, QueueConfig};
use crate::host::handler::{Handler, HandlerError, Outcome, SlotContext, Task};

/// A built-in handler's settings, read from its options like a custom handler reads its
/// own; config validation wrote them there from the queue's keys, with their defaults.
fn settings<T: DeserializeOwned>(queue: &QueueConfig, name: &str) -> Result<T, HandlerError> {
    let not_configured = || HandlerError::new(format!("{name}: queue is not configured as {name}"));
    if queue.handler.name() != name {
        return Err(not_configured());
    }
    let options = queue.handler.options().ok_or_else(not_configured)?;
    serde_json::from_value(options.clone())
        .map_err(|e| HandlerError::new(format!("{name}: bad options: {e}")))
}

/// Acknowledges every task: measures the queue and slot machinery alone.
#[derive(Debug)]
pub struct Noop;

impl Handler for Noop {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Ok(Noop)
    }

    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        vec![Outcome::done(); unstopped(ctx, batch).count()]
    }
}

/// The tasks of `batch` up to the slot's stop: a built-in handler looks at
/// [`SlotContext::should_stop`] before each task and returns the outcomes of those it
/// finished; the slot gives the rest back unstarted.
fn unstopped<'a>(ctx: &'a SlotContext, batch: &'a [Task]) -> impl Iterator<Item = &'a Task> {
    batch.iter().take_while(|_| !ctx.should_stop())
}

/// Sleeps `{"ms": N}` per task, one task after the other: slow work on demand.
#[derive(Debug)]
pub struct Sleep;

impl Handler for Sleep {
    fn preload(_: &QueueConfig) -> Result<Self, HandlerError> {
        Ok(Sleep)
    }

    /// In a long queue the sleep ends early when the task is cancelled; in a batch
    /// queue a slot asked to stop finishes the task in hand and returns the rest of the
    /// batch unstarted.
    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        unstopped(ctx, batch)
            .map(|task| match task.json() {
                Ok(v) => match v.get("ms").and_then(serde_json::Value::as_u64) {
                    Some(ms) if ctx.wait_cancelled(Duration::from_millis(ms)) => Outcome::Fail {
                        reason: "sleep: cancelled".into(),
                    },
                    Some(_) => Outcome::done(),
                    None if v.get("ms").is_none() => Outcome::done(),
                    None => Outcome::Reject {
                        reason: "sleep: `ms` must be a non-negative integer".into(),
                    },
                },
                Err(e) => Outcome::Reject {
                    reason: format!("sleep: {e}"),
                },
            })
            .collect()
    }
}

/// [`Flaky`]'s options.
#[derive(Deserialize)]
struct FlakySettings {
    /// Between 0 and 1.
    fail_rate: f64,
}

/// Fails `fail_rate` of its tasks (retried by the queue's policy): exercises retries and
/// dead letters.
#[derive(Debug)]
pub struct Flaky {
    fail_rate: f64,
    rng: u64,
}

impl Handler for Flaky {
    fn preload(queue: &QueueConfig) -> Result<Self, HandlerError> {
        let FlakySettings { fail_rate } = settings(queue, HandlerConfig::FLAKY)?;
        Ok(Flaky { fail_rate, rng: 0 })
    }

    fn init(&mut self, ctx: &SlotContext) -> Result<(), HandlerError> {
        // Seeded per process so the slots of a host do not fail the same tasks in step.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        self.rng = u64::from(std::process::id()) << 32 ^ u64::from(nanos) ^ u64::from(ctx.slot) | 1;
        Ok(())
    }

    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        unstopped(ctx, batch)
            .map(|_| {
                // xorshift64: no dependency for a demo's coin flips.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                let draw = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
                if draw < self.fail_rate {
                    Outcome::Fail {
                        reason: "flaky: simulated failure".into(),
                    }
                } else {
                    Outcome::done()
                }
            })
            .collect()
    }
}

/// [`Memhog`]'s options.
#[derive(Deserialize)]
struct MemhogSettings {
    /// Bytes kept per task.
    grow_per_task: u64,
}

/// Keeps `grow_per_task` bytes of private, dirty memory per task for the life of the
/// slot, so its Private_Dirty climbs until the slot recycles itself.
#[derive(Debug)]
pub struct Memhog {
    grow_per_task: usize,
    kept: Vec<Vec<u8>>,
}

impl Handler for Memhog {
    fn preload(queue: &QueueConfig) -> Result<Self, HandlerError> {
        let MemhogSettings { grow_per_task } = settings(queue, HandlerConfig::MEMHOG)?;
        Ok(Memhog {
            grow_per_task: usize::try_from(grow_per_task)
                .map_err(|_| HandlerError::new("memhog: grow_per_task too large"))?,
            kept: Vec::new(),
        })
    }

    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(batch.len());
        for task in unstopped(ctx, batch) {
            // Written, not just allocated: untouched pages are not private dirty memory.
            let fill = task.id.bytes().fold(1u8, |a, b| a.wrapping_add(b)) | 1;
            self.kept.push(vec![fill; self.grow_per_task]);
            outcomes.push(Outcome::done());
        }
        outcomes
    }
}

/// [`PreloadDemo`]'s options.
#[derive(Deserialize)]
struct PreloadDemoSettings {
    /// Bytes built once per host.
    preload: u64,
}

/// Builds `preload` bytes in the zygote and reads all of them per task (a checksum), so
/// every slot touches every shared page and the host's PSS shows the sharing.
#[derive(Debug)]
pub struct PreloadDemo {
    data: Vec<u64>,
}

impl PreloadDemo {
    /// The checksum every task computes over the preloaded data.
    pub fn checksum(&self) -> u64 {
        self.data.iter().fold(0u64, |a, &w| a.rotate_left(5) ^ w)
    }
}

impl Handler for PreloadDemo {
    fn preload(queue: &QueueConfig) -> Result<Self, HandlerError> {
        let PreloadDemoSettings { preload } = settings(queue, HandlerConfig::PRELOAD_DEMO)?;
        let words = usize::try_from(preload / 8)
            .map_err(|_| HandlerError::new("preload_demo: preload too large"))?;
        let mut data = Vec::with_capacity(words);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        data.extend((0..words).map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            x
        }));
        Ok(PreloadDemo { data })
    }

    fn handle(&mut self, ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        unstopped(ctx, batch)
            .map(|_| {
                std::hint::black_box(self.checksum());
                Outcome::done()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(payload: &str) -> Task {
        Task {
            id: "t".into(),
            attempt: 1,
            payload: payload.as_bytes().to_vec(),
        }
    }

    fn ctx(handler: HandlerConfig) -> SlotContext {
        SlotContext::detached(QueueConfig::new("q", handler), 0)
    }

    /// A context for the queue `q` of a config's text, as validation builds it.
    fn configured(toml: &str) -> SlotContext {
        let config = crate::config::parse(toml, "t.toml").unwrap();
        SlotContext::detached(config.queues["q"].clone(), 0)
    }

    #[test]
    fn sleep_rejects_bad_payloads_and_accepts_ms() {
        let c = ctx(HandlerConfig::named(HandlerConfig::SLEEP));
        let out = Sleep.handle(
            &c,
            &[task(r#"{"ms":1}"#), task("nope"), task(r#"{"ms":-1}"#)],
        );
        assert_eq!(out[0], Outcome::done());
        assert!(matches!(out[1], Outcome::Reject { .. }));
        assert!(matches!(out[2], Outcome::Reject { .. }));
    }

    #[test]
    fn built_ins_stop_between_tasks_once_the_slot_asks() {
        let c = ctx(HandlerConfig::named(HandlerConfig::SLEEP));
        let batch = [task(r#"{"ms":1}"#), task(r#"{"ms":1}"#)];
        assert_eq!(Sleep.handle(&c, &batch).len(), 2);
        assert_eq!(Noop.handle(&c, &batch).len(), 2);
        c.stop.ask();
        // Nothing was started: the whole batch goes back.
        assert_eq!(Sleep.handle(&c, &batch), vec![]);
        assert_eq!(Noop.handle(&c, &batch), vec![]);
    }

    #[test]
    fn flaky_fails_about_its_rate() {
        let c = configured("[queues.q]\nhandler = \"flaky\"\nfail_rate = 0.25\n");
        let mut h = Flaky::preload(&c.queue).unwrap();
        h.init(&c).unwrap();
        let batch: Vec<Task> = (0..4000).map(|_| task("{}")).collect();
        let failed = h
            .handle(&c, &batch)
            .iter()
            .filter(|o| matches!(o, Outcome::Fail { .. }))
            .count();
        assert!((800..1200).contains(&failed), "{failed} of 4000 failed");
    }

    #[test]
    fn memhog_keeps_memory_per_task() {
        let c = configured("[queues.q]\nhandler = \"memhog\"\ngrow_per_task = \"4KiB\"\n");
        let mut h = Memhog::preload(&c.queue).unwrap();
        h.handle(&c, &[task("{}"), task("{}")]);
        assert_eq!(h.kept.iter().map(Vec::len).sum::<usize>(), 8192);
    }

    #[test]
    fn preload_demo_builds_its_size() {
        let c = configured("[queues.q]\nhandler = \"preload_demo\"\npreload = \"64KiB\"\n");
        let h = PreloadDemo::preload(&c.queue).unwrap();
        assert_eq!(h.data.len() * 8, 1 << 16);
        assert_ne!(h.checksum(), 0);
    }

    #[test]
    fn defaults_come_from_the_config() {
        let c = configured("[queues.q]\nhandler = \"flaky\"\n");
        assert_eq!(Flaky::preload(&c.queue).unwrap().fail_rate, 0.1);
        let c = configured("[queues.q]\nhandler = \"memhog\"\n");
        assert_eq!(Memhog::preload(&c.queue).unwrap().grow_per_task, 4 << 20);
    }

    #[test]
    fn a_built_in_refuses_another_handlers_queue() {
        let c = ctx(HandlerConfig::named(HandlerConfig::NOOP));
        let e = Flaky::preload(&c.queue).unwrap_err();
        assert_eq!(e.to_string(), "flaky: queue is not configured as flaky");
        let c = ctx(HandlerConfig::named(HandlerConfig::FLAKY));
        let e = Flaky::preload(&c.queue).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("flaky: bad options: missing field `fail_rate`")
        );
    }
}
