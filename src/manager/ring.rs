//! The load the cluster saw, kept for `gaffer trace record`: per queue a bounded ring in
//! Redis of one entry per period (a minute unless told otherwise): tasks that arrived,
//! tasks handled and their busy time, so a mean task time; and one ring of the hosts
//! (alive, their capacity).
//!
//! The leading manager writes it from its tick: [`Recorder`] turns the samples the
//! statistics window already takes into one [`Period`] each time a period has passed
//! (pure, time as a value), and [`write()`] pushes it to the rings, trimmed to
//! [`RING_LEN`] entries. Entries are short text lines, newest first:
//! `end_ms seconds arrived processed busy_seconds` for a queue, `end_ms seconds hosts
//! capacity` for the hosts. A manager that takes over starts its own periods; two
//! managers' entries only interleave by time. The pushes are not fenced like the map
//! (invariant 19): a manager paused past its lease may push one period its successor
//! also counts, which costs a recorded trace a minute's double load, never a decision.
//!
//! The period is a minute; tests shorten it with `GAFFER_TRACE_PERIOD`.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::AsyncCommands;

use super::window::{Backlog, Sample, StatsWindow};
use crate::queue_client::RedisConn;

/// A period unless the manager is told otherwise (`GAFFER_TRACE_PERIOD`, for tests).
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(60);
/// Entries kept per ring: a day of minutes. At about 40 bytes an entry that is about
/// 60 KiB per queue.
pub const RING_LEN: usize = 1440;

/// One period of one queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueEntry {
    /// When the period ended, ms since the epoch.
    pub end_ms: u64,
    /// Its length, seconds.
    pub seconds: f64,
    /// Tasks enqueued during it.
    pub arrived: u64,
    /// Tasks handled during it.
    pub processed: u64,
    /// Seconds slots spent handling them.
    pub busy_seconds: f64,
}

/// One period of the hosts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostsEntry {
    /// When the period ended, ms since the epoch.
    pub end_ms: u64,
    /// Its length, seconds.
    pub seconds: f64,
    /// Hosts alive at its end.
    pub hosts: u32,
    /// Slots they could hold together.
    pub capacity: u64,
}

/// What one period adds to the rings.
#[derive(Debug, Clone, PartialEq)]
pub struct Period {
    /// Per queue name.
    pub queues: BTreeMap<String, QueueEntry>,
    /// The hosts.
    pub hosts: HostsEntry,
}

/// What the hosts were at a tick: alive ones and their capacity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostsNow {
    /// Hosts alive.
    pub alive: u32,
    /// Σ capacity of the alive hosts.
    pub capacity: u64,
}

/// Cuts the manager's samples into periods.
#[derive(Debug, Clone)]
pub struct Recorder {
    period: Duration,
    /// The sample the current period started at.
    start: Option<Sample>,
}

impl Recorder {
    /// Periods of `period`.
    pub fn new(period: Duration) -> Self {
        Self {
            period: period.max(Duration::from_millis(1)),
            start: None,
        }
    }

    /// The tick's `sample`, taken at wall-clock `now_ms` with `hosts`: a period when one
    /// has passed since the last (the first sample only starts one).
    pub fn observe(&mut self, sample: &Sample, now_ms: u64, hosts: HostsNow) -> Option<Period> {
        let Some(start) = self.start.as_ref() else {
            self.start = Some(sample.clone());
            return None;
        };
        if sample.at.saturating_sub(start.at) < self.period {
            return None;
        }
        // The window's arithmetic over exactly two samples: counter deltas, restarted
        // masters and renamed queues handled as for the balancer.
        let mut window = StatsWindow::new(self.period);
        window.record(start.clone());
        window.record(sample.clone());
        let idle = vec![Backlog::default(); sample.queues.len()];
        let read = window.read(&idle);
        let seconds = window.span().as_secs_f64();
        let queues = sample
            .queues
            .iter()
            .zip(read)
            .map(|(name, w)| {
                let entry = QueueEntry {
                    end_ms: now_ms,
                    seconds,
                    arrived: w.arrived,
                    processed: w.processed,
                    busy_seconds: w.busy_seconds,
                };
                (name.clone(), entry)
            })
            .collect();
        self.start = Some(sample.clone());
        Some(Period {
            queues,
            hosts: HostsEntry {
                end_ms: now_ms,
                seconds,
                hosts: hosts.alive,
                capacity: hosts.capacity,
            },
        })
    }
}

/// Why a ring entry could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ring entry `{entry}` is not {expected}")]
pub struct EntryError {
    entry: String,
    expected: &'static str,
}

/// Why a ring could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// Redis refused or was away.
    #[error("reading the load ring: {0}")]
    Redis(#[from] redis::RedisError),
    /// An entry is malformed.
    #[error(transparent)]
    Entry(#[from] EntryError),
}

impl QueueEntry {
    /// The entry as the ring keeps it.
    pub fn encode(&self) -> String {
        format!(
            "{} {:.3} {} {} {:.3}",
            self.end_ms, self.seconds, self.arrived, self.processed, self.busy_seconds
        )
    }

    /// An entry of the ring.
    pub fn decode(line: &str) -> Result<Self, EntryError> {
        let bad = || EntryError {
            entry: line.to_string(),
            expected: "`end_ms seconds arrived processed busy_seconds`",
        };
        let f: Vec<&str> = line.split(' ').collect();
        let [end_ms, seconds, arrived, processed, busy] = f[..] else {
            return Err(bad());
        };
        Ok(Self {
            end_ms: end_ms.parse().map_err(|_| bad())?,
            seconds: seconds.parse().map_err(|_| bad())?,
            arrived: arrived.parse().map_err(|_| bad())?,
            processed: processed.parse().map_err(|_| bad())?,
            busy_seconds: busy.parse().map_err(|_| bad())?,
        })
    }
}

impl HostsEntry {
    /// The entry as the ring keeps it.
    pub fn encode(&self) -> String {
        format!(
            "{} {:.3} {} {}",
            self.end_ms, self.seconds, self.hosts, self.capacity
        )
    }

    /// An entry of the ring.
    pub fn decode(line: &str) -> Result<Self, EntryError> {
        let bad = || EntryError {
            entry: line.to_string(),
            expected: "`end_ms seconds hosts capacity`",
        };
        let f: Vec<&str> = line.split(' ').collect();
        let [end_ms, seconds, hosts, capacity] = f[..] else {
            return Err(bad());
        };
        Ok(Self {
            end_ms: end_ms.parse().map_err(|_| bad())?,
            seconds: seconds.parse().map_err(|_| bad())?,
            hosts: hosts.parse().map_err(|_| bad())?,
            capacity: capacity.parse().map_err(|_| bad())?,
        })
    }
}

/// The ring keys of a namespace: `NS:{cluster}:load:q:QUEUE` and `NS:{cluster}:load:hosts`
/// (the cluster's hash tag, as every cluster-state key).
#[derive(Debug, Clone)]
pub struct RingKeys {
    ns: String,
}

impl RingKeys {
    /// Under `namespace`.
    pub fn new(namespace: &str) -> Self {
        Self {
            ns: namespace.to_string(),
        }
    }

    /// Queue `queue`'s ring.
    pub fn queue(&self, queue: &str) -> String {
        format!("{}:{{cluster}}:load:q:{queue}", self.ns)
    }

    /// The hosts' ring.
    pub fn hosts(&self) -> String {
        format!("{}:{{cluster}}:load:hosts", self.ns)
    }
}

/// Pushes `period` to its rings, each trimmed to [`RING_LEN`], in one round trip.
pub async fn write(
    conn: &mut RedisConn,
    keys: &RingKeys,
    period: &Period,
) -> redis::RedisResult<()> {
    let last = RING_LEN as isize - 1;
    let mut pipe = redis::pipe();
    for (queue, entry) in &period.queues {
        let key = keys.queue(queue);
        pipe.lpush(&key, entry.encode()).ignore();
        pipe.ltrim(&key, 0, last).ignore();
    }
    pipe.lpush(keys.hosts(), period.hosts.encode()).ignore();
    pipe.ltrim(keys.hosts(), 0, last).ignore();
    pipe.query_async(conn).await
}

/// Queue `queue`'s entries that ended at or after `since_ms`, oldest first.
pub async fn read_queue(
    conn: &mut RedisConn,
    keys: &RingKeys,
    queue: &str,
    since_ms: u64,
) -> Result<Vec<QueueEntry>, RingError> {
    let lines: Vec<String> = conn.lrange(keys.queue(queue), 0, -1).await?;
    let mut out = Vec::with_capacity(lines.len());
    for line in lines.iter().rev() {
        let e = QueueEntry::decode(line)?;
        if e.end_ms >= since_ms {
            out.push(e);
        }
    }
    Ok(out)
}

/// The hosts' entries that ended at or after `since_ms`, oldest first.
pub async fn read_hosts(
    conn: &mut RedisConn,
    keys: &RingKeys,
    since_ms: u64,
) -> Result<Vec<HostsEntry>, RingError> {
    let lines: Vec<String> = conn.lrange(keys.hosts(), 0, -1).await?;
    let mut out = Vec::with_capacity(lines.len());
    for line in lines.iter().rev() {
        let e = HostsEntry::decode(line)?;
        if e.end_ms >= since_ms {
            out.push(e);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::manager::window::{HostCounters, WorkCounters};

    fn sample(secs: u64, enqueued: u64, processed: u64, busy: f64) -> Sample {
        let host = HostCounters {
            started_ms: 1,
            queues: vec![Some(WorkCounters {
                processed,
                busy_seconds: busy,
                slot_lifetime_seconds: 0.0,
            })],
        };
        Sample {
            at: Duration::from_secs(secs),
            queues: Arc::from(vec!["a".to_string()]),
            enqueued: vec![enqueued],
            hosts: BTreeMap::from([("h".to_string(), host)]),
        }
    }

    #[test]
    fn a_period_is_cut_once_it_has_passed() {
        let mut r = Recorder::new(Duration::from_secs(10));
        let hosts = HostsNow {
            alive: 2,
            capacity: 80,
        };
        assert_eq!(r.observe(&sample(0, 100, 0, 0.0), 1_000, hosts), None);
        assert_eq!(r.observe(&sample(8, 150, 40, 2.0), 9_000, hosts), None);
        let p = r
            .observe(&sample(12, 220, 100, 5.0), 13_000, hosts)
            .unwrap();
        assert_eq!(
            p.queues["a"],
            QueueEntry {
                end_ms: 13_000,
                seconds: 12.0,
                arrived: 120,
                processed: 100,
                busy_seconds: 5.0,
            }
        );
        assert_eq!((p.hosts.hosts, p.hosts.capacity), (2, 80));
        // The next period starts where this one ended.
        let p = r
            .observe(&sample(22, 240, 130, 6.0), 23_000, hosts)
            .unwrap();
        assert_eq!((p.queues["a"].arrived, p.queues["a"].seconds), (20, 10.0));
    }

    #[test]
    fn entries_read_back_as_written() {
        let q = QueueEntry {
            end_ms: 1_767_571_200_000,
            seconds: 60.0,
            arrived: 1234,
            processed: 1200,
            busy_seconds: 48.25,
        };
        assert_eq!(QueueEntry::decode(&q.encode()), Ok(q));
        let h = HostsEntry {
            end_ms: 5,
            seconds: 60.0,
            hosts: 3,
            capacity: 120,
        };
        assert_eq!(HostsEntry::decode(&h.encode()), Ok(h));
        let err = QueueEntry::decode("5 x").unwrap_err().to_string();
        assert!(err.contains("`5 x`"), "{err}");
    }
}
