//! A team's own gaffer binary with a handler of its own.
//!
//! Build it like any Rust program (`cargo build --release --example custom_handler` here;
//! in your own crate, depend on `gaffer` and make this your `main.rs`), install it in
//! place of `gaffer` on your hosts, and name the handler in the config:
//!
//! ```toml
//! [queues.geocode]
//! handler = "geocode"
//! options = { cities = ["Lisbon", "Porto"] }   # handed to preload as JSON
//! ```
//!
//! Every command of the stock binary is there (`master`, `stats`, `push`, …); the
//! master's zygote is this same binary re-executed, so your handlers are preloaded
//! once per host and shared by every slot.

use std::collections::HashMap;

use gaffer::config::{Handler as HandlerConfig, QueueConfig};
use gaffer::slot::{Handler, HandlerError, Outcome, Registry, SlotContext, Task};

/// Looks up `{"city": NAME}` in a table built once per host.
struct Geocode {
    /// Built in the zygote by `preload`: every slot of the host shares these pages.
    table: HashMap<String, (f64, f64)>,
}

impl Handler for Geocode {
    fn preload(queue: &QueueConfig) -> Result<Self, HandlerError> {
        let HandlerConfig::Named { options, .. } = &queue.handler else {
            return Err(HandlerError::new(
                "geocode: not configured as a custom handler",
            ));
        };
        // A real handler would load a model or a big lookup file here. No threads and no
        // connections: the zygote must stay single-threaded to fork.
        let cities = options["cities"]
            .as_array()
            .ok_or_else(|| HandlerError::new("geocode: options.cities must be a list"))?;
        let table = cities
            .iter()
            .filter_map(|c| c.as_str())
            .enumerate()
            .map(|(i, c)| (c.to_lowercase(), (i as f64, -(i as f64))))
            .collect();
        Ok(Geocode { table })
    }

    fn init(&mut self, ctx: &SlotContext) -> Result<(), HandlerError> {
        // Per-slot resources (database connections, HTTP clients) belong here.
        eprintln!("geocode slot {} ready for {}", ctx.slot, ctx.queue.name);
        Ok(())
    }

    fn close(&mut self) {
        // Flush and close what `init` opened: the slot ends (stopped, scaled down,
        // recycled). `Drop` does not run in a forked slot.
        eprintln!("geocode slot closing");
    }

    fn handle(&mut self, _ctx: &SlotContext, batch: &[Task]) -> Vec<Outcome> {
        batch
            .iter()
            .map(|task| {
                let payload = match task.json() {
                    Ok(v) => v,
                    // Undecodable input can never succeed: dead-letter it at once.
                    Err(e) => {
                        return Outcome::Reject {
                            reason: e.to_string(),
                        };
                    }
                };
                let Some(city) = payload["city"].as_str() else {
                    return Outcome::Reject {
                        reason: "payload needs a \"city\" string".into(),
                    };
                };
                match self.table.get(&city.to_lowercase()) {
                    Some(_coordinates) => Outcome::done(),
                    None => Outcome::Reject {
                        reason: format!("unknown city {city:?}"),
                    },
                }
            })
            .collect()
    }
}

fn main() -> std::process::ExitCode {
    gaffer::cli::run(Registry::builtin().register::<Geocode>("geocode"))
}
