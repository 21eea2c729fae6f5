//! The trace file of `gaffer simulate` (`docs/SIMULATION.md`, "The trace format").
//!
//! `TraceError` locates every mistake by line and column; the `whole_batch` names are
//! checked against the config by `simulate::run`.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

/// A simulated cluster and the load it gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Simulated time.
    pub duration: Duration,
    /// Same seed, same report.
    pub seed: u64,
    /// The hosts.
    pub hosts: Hosts,
    /// Load segments; overlapping ones add up.
    pub load: Vec<Load>,
    /// Faults.
    pub events: Vec<Event>,
    /// Tasks per slot the `hpa` policy aims for (KEDA's queue-length target).
    pub hpa_target: f64,
    /// Queues whose handlers ignore a stop: a stopped slot of one finishes its whole batch.
    pub whole_batch: Vec<WholeBatch>,
    /// Where the trace came from (its path), for the errors found against a config.
    pub origin: String,
}

/// A queue the trace's `whole_batch` names, with where, so a name the config does not
/// have is reported at its place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WholeBatch {
    /// The queue.
    pub queue: String,
    /// 1-based line of the name in the trace.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
}

impl Trace {
    /// Whether a stopped slot of `queue` finishes its whole batch (its handler ignores the
    /// stop) rather than only the task in hand.
    pub fn stops_at_batch_end(&self, queue: &str) -> bool {
        self.whole_batch.iter().any(|w| w.queue == queue)
    }

    /// Checks that every queue `whole_batch` names is one `known` accepts (the config's):
    /// a name that is not would silently change nothing.
    pub fn check_whole_batch(&self, known: impl Fn(&str) -> bool) -> Result<(), TraceError> {
        let unknown = self
            .whole_batch
            .iter()
            .enumerate()
            .find(|(_, w)| !known(&w.queue));
        match unknown {
            Some((i, w)) => Err(TraceError::UnknownQueue {
                origin: self.origin.clone(),
                line: w.line,
                column: w.column,
                key: format!("whole_batch[{i}]"),
                queue: w.queue.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// Identical hosts.
#[derive(Debug, Clone, PartialEq)]
pub struct Hosts {
    /// How many.
    pub count: u32,
    /// Memory of each.
    pub memory: u64,
    /// PSS of one slot.
    pub slot_memory: u64,
    /// Fork to first take.
    pub slot_start: Duration,
}

impl Hosts {
    /// Slots one host holds.
    pub fn capacity(&self) -> u32 {
        u32::try_from(self.memory / self.slot_memory.max(1)).unwrap_or(u32::MAX)
    }
}

/// Poisson arrivals for one queue over an interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// Queue name (must be in the config).
    pub queue: String,
    /// Start.
    pub from: Duration,
    /// End.
    pub to: Duration,
    /// Tasks per second at `from`.
    pub rate: f64,
    /// Tasks per second at `to` (linear ramp); `rate` when absent.
    pub rate_to: f64,
    /// Mean handling time per task.
    pub task_time: Duration,
}

impl Load {
    /// The arrival rate at `t`, 0 outside the segment.
    pub fn rate_at(&self, t: Duration) -> f64 {
        if t < self.from || t >= self.to {
            return 0.0;
        }
        let span = (self.to - self.from).as_secs_f64();
        let x = if span > 0.0 {
            (t - self.from).as_secs_f64() / span
        } else {
            0.0
        };
        self.rate + (self.rate_to - self.rate) * x
    }
}

/// A fault at a moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// When.
    pub at: Duration,
    /// How many hosts die then (the highest-numbered alive ones).
    pub kill_hosts: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrace {
    duration: String,
    seed: Option<u64>,
    hpa_target: Option<f64>,
    hosts: RawHosts,
    #[serde(default)]
    load: Vec<RawLoad>,
    #[serde(default)]
    events: Vec<RawEvent>,
    #[serde(default)]
    whole_batch: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHosts {
    count: u32,
    memory: String,
    slot_memory: String,
    slot_start: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoad {
    queue: String,
    from: String,
    to: String,
    rate: f64,
    rate_to: Option<f64>,
    task_time: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    at: String,
    kill_hosts: u32,
}

/// Why a trace cannot be used; every message starts with the trace's origin (its path),
/// then the key at fault. The underlying parser's message is part of the text rather than
/// a `source`, so a report that prints the chain does not say it twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// Not TOML, or not the trace's shape.
    #[error("{origin}: {reason}")]
    Syntax {
        /// The trace's path.
        origin: String,
        /// The TOML parser's message.
        reason: String,
    },
    /// A duration or size that does not parse.
    #[error("{origin}: {key}: {reason}")]
    Value {
        /// The trace's path.
        origin: String,
        /// The key, e.g. `load[0].from`.
        key: String,
        /// The value parser's message.
        reason: String,
    },
    /// A size or time that must be above zero is zero.
    #[error("{origin}: {key}: must be greater than zero")]
    Zero {
        /// The trace's path.
        origin: String,
        /// The key, e.g. `hosts.slot_memory`.
        key: String,
    },
    /// A load rate that is negative, infinite or NaN.
    #[error("{origin}: {key}: rates must be finite and not negative")]
    Rate {
        /// The trace's path.
        origin: String,
        /// The key, e.g. `load[0].rate`.
        key: String,
    },
    /// A queue name the config does not have, located as config errors are.
    #[error("{origin}:{line}:{column}: {key}: queue `{queue}` is not in the config")]
    UnknownQueue {
        /// The trace's path.
        origin: String,
        /// 1-based line of the name.
        line: usize,
        /// 1-based column of the name, in characters.
        column: usize,
        /// The key, e.g. `whole_batch[0]`.
        key: String,
        /// The name.
        queue: String,
    },
}

/// Parses a trace; errors name the file and what is wrong.
pub fn parse(text: &str, origin: &str) -> Result<Trace, TraceError> {
    let raw: RawTrace = toml::from_str(text).map_err(|e| TraceError::Syntax {
        origin: origin.to_string(),
        reason: e.to_string(),
    })?;
    let value = |key: &str, reason: String| TraceError::Value {
        origin: origin.to_string(),
        key: key.to_string(),
        reason,
    };
    let dur = |key: &str, v: &str| crate::config::parse_duration(v).map_err(|e| value(key, e));
    let size = |key: &str, v: &str| crate::config::parse_size(v).map_err(|e| value(key, e));
    let zero = |key: String| TraceError::Zero {
        origin: origin.to_string(),
        key,
    };
    let duration = dur("duration", &raw.duration)?;
    let hosts = Hosts {
        count: raw.hosts.count,
        memory: size("hosts.memory", &raw.hosts.memory)?,
        slot_memory: size("hosts.slot_memory", &raw.hosts.slot_memory)?,
        slot_start: match &raw.hosts.slot_start {
            Some(s) => dur("hosts.slot_start", s)?,
            None => Duration::from_millis(200),
        },
    };
    if hosts.slot_memory == 0 {
        return Err(zero("hosts.slot_memory".to_string()));
    }
    let mut load = Vec::new();
    for (i, l) in raw.load.iter().enumerate() {
        let key = |k: &str| format!("load[{i}].{k}");
        let seg = Load {
            queue: l.queue.clone(),
            from: dur(&key("from"), &l.from)?,
            to: dur(&key("to"), &l.to)?,
            rate: l.rate,
            rate_to: l.rate_to.unwrap_or(l.rate),
            task_time: dur(&key("task_time"), &l.task_time)?,
        };
        if seg.rate < 0.0 || seg.rate_to < 0.0 || !seg.rate.is_finite() || !seg.rate_to.is_finite()
        {
            return Err(TraceError::Rate {
                origin: origin.to_string(),
                key: key("rate"),
            });
        }
        if seg.task_time.is_zero() {
            return Err(zero(key("task_time")));
        }
        load.push(seg);
    }
    let mut events = Vec::new();
    for (i, e) in raw.events.iter().enumerate() {
        events.push(Event {
            at: dur(&format!("events[{i}].at"), &e.at)?,
            kill_hosts: e.kill_hosts,
        });
    }
    events.sort_by_key(|e| e.at);
    Ok(Trace {
        duration,
        seed: raw.seed.unwrap_or(0),
        hosts,
        load,
        events,
        hpa_target: raw.hpa_target.unwrap_or(5.0),
        whole_batch: located(text, &raw.whole_batch),
        origin: origin.to_string(),
    })
}

/// The names of `whole_batch` with their places in `text`.
fn located(text: &str, names: &[Spanned<String>]) -> Vec<WholeBatch> {
    names
        .iter()
        .map(|name| {
            let (line, column) = crate::config::line_col(text, name.span().start);
            WholeBatch {
                queue: name.get_ref().clone(),
                line,
                column,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTS: &str =
        "duration = \"1m\"\n[hosts]\ncount = 1\nmemory = \"1GiB\"\nslot_memory = \"100MiB\"\n";

    #[test]
    fn whole_batch_is_empty_unless_given() {
        let t = parse(HOSTS, "t.toml").unwrap();
        assert!(t.whole_batch.is_empty());
        assert!(!t.stops_at_batch_end("reports"));
        assert_eq!(t.check_whole_batch(|_| false), Ok(()));
    }

    #[test]
    fn whole_batch_names_queues_whose_slots_finish_their_batch() {
        let text = format!("whole_batch = [\"reports\", \"resize\"]\n{HOSTS}");
        let t = parse(&text, "t.toml").unwrap();
        let names: Vec<&str> = t.whole_batch.iter().map(|w| w.queue.as_str()).collect();
        assert_eq!(names, ["reports", "resize"]);
        assert!(t.stops_at_batch_end("reports"));
        assert!(!t.stops_at_batch_end("events"));
        assert_eq!(t.check_whole_batch(|_| true), Ok(()));
    }

    #[test]
    fn a_whole_batch_queue_the_config_lacks_is_refused_at_its_place() {
        let text = format!("whole_batch = [\n  \"reports\",\n  \"nope\",\n]\n{HOSTS}");
        let t = parse(&text, "traces/t.toml").unwrap();
        let err = t.check_whole_batch(|q| q == "reports").unwrap_err();
        assert_eq!(
            err.to_string(),
            "traces/t.toml:3:3: whole_batch[1]: queue `nope` is not in the config"
        );
    }

    #[test]
    fn whole_batch_must_be_a_list_of_names() {
        let text = format!("whole_batch = \"reports\"\n{HOSTS}");
        let err = parse(&text, "t.toml").unwrap_err().to_string();
        assert!(err.starts_with("t.toml: "), "{err}");
        assert!(err.contains("whole_batch"), "{err}");
    }
}
