//! Schedules: recurring tasks, written in the config (`[[schedules]]`) or stored in Redis
//! through the api (`POST /v1/schedules`). Neutral ground: the manager fires them, the api
//! stores and lists them, the CLI lists, pauses and deletes them, and none of those roles
//! imports another.
//!
//! `mod.rs` is the definition ([`Schedule`] with its [`Rule`]), when it fires, and the
//! names it goes by (the task id and `submitted_by` of each fire, its field in the claim
//! hash). `store.rs` is what Redis holds of schedules (stored definitions, paused names,
//! the leader's claims), read in one round trip, the create and delete scripts, and the
//! listing that `gaffer schedules` and `GET /v1/schedules` show.
//!
//! Fire moments are the same for every manager, whichever leads: a cron rule's are read in
//! the schedule's time zone; an `every` rule's fall at whole periods from its origin (a
//! stored schedule's creation; the Unix epoch for the config's, so `every = "1h"` fires on
//! the hour, UTC).

pub mod store;

use std::time::Duration;

use chrono_tz::Tz;

/// The shortest `every`: a schedule firing more often is a queue's job, not a schedule's.
pub const MIN_EVERY: Duration = Duration::from_secs(1);

/// What `submitted_by` starts with in a fire's record, before the schedule's name.
pub const SUBMITTER_PREFIX: &str = "schedule:";

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// A cron expression (five fields, or six with seconds first), read in the schedule's
    /// time zone.
    Cron {
        /// The parsed expression (boxed: it is large beside a period).
        expr: Box<croner::Cron>,
        /// The expression as written.
        source: String,
    },
    /// A fixed period, fired at whole periods from the schedule's origin.
    Every(Duration),
}

impl Rule {
    /// A cron rule, or why `text` is none.
    pub fn cron(text: &str) -> Result<Rule, String> {
        let expr = crate::config::parse_cron(text)?;
        Ok(Rule::Cron {
            expr: Box::new(expr),
            source: text.to_owned(),
        })
    }

    /// An `every` rule for a period of `text` (`"30s"`), at least [`MIN_EVERY`].
    pub fn every(text: &str) -> Result<Rule, String> {
        let period = crate::config::parse_duration(text)?;
        Rule::every_period(period)
    }

    /// An `every` rule for `period`, at least [`MIN_EVERY`] and a whole number of ms.
    pub fn every_period(period: Duration) -> Result<Rule, String> {
        if period < MIN_EVERY {
            return Err(format!(
                "every {} is shorter than the limit of {}",
                humantime::format_duration(period),
                humantime::format_duration(MIN_EVERY)
            ));
        }
        // (whole milliseconds: fire moments are counted in them)
        Ok(Rule::Every(
            Duration::from_millis(period.as_millis() as u64),
        ))
    }

    /// `"cron"` or `"every"`: the key the config and the api write the rule under.
    pub fn kind(&self) -> &'static str {
        match self {
            Rule::Cron { .. } => "cron",
            Rule::Every(_) => "every",
        }
    }

    /// The rule's text: the cron expression as written, or the period (`"2s"`).
    pub fn text(&self) -> String {
        match self {
            Rule::Cron { source, .. } => source.clone(),
            Rule::Every(p) => humantime::format_duration(*p).to_string(),
        }
    }

    /// Up to `limit` fire moments (Unix ms) after `after_ms`, in order; `origin_ms` counts
    /// an `every` rule's periods, `tz` reads a cron rule.
    fn after(&self, after_ms: i64, tz: Tz, origin_ms: i64, limit: usize) -> Vec<i64> {
        match self {
            Rule::Cron { expr, .. } => {
                let from = chrono::DateTime::from_timestamp_millis(after_ms)
                    .unwrap_or_default()
                    .with_timezone(&tz);
                expr.iter_after(from)
                    .take(limit)
                    .map(|t| t.timestamp_millis())
                    .collect()
            }
            Rule::Every(period) => {
                let p = i64::try_from(period.as_millis()).unwrap_or(i64::MAX).max(1);
                let first = if after_ms < origin_ms {
                    1
                } else {
                    (after_ms - origin_ms) / p + 1
                };
                (first..)
                    .map_while(|k| k.checked_mul(p).and_then(|d| d.checked_add(origin_ms)))
                    .take(limit)
                    .collect()
            }
        }
    }
}

/// Where a schedule comes from, and what that decides about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A `[[schedules]]` entry: its position in the file, and whether it has a `name`
    /// (an unnamed entry keeps the claim field of the releases before names).
    Config {
        /// Its position among the `[[schedules]]`, from 0.
        index: usize,
        /// Whether the entry wrote a `name`.
        named: bool,
    },
    /// Stored through the api.
    Api {
        /// The key that made it (its name), or `cli`/`admin`.
        owner: String,
        /// When it was made (Unix ms): its `every` periods count from here, and it fires
        /// from here on.
        created_ms: i64,
    },
}

/// Which of the two a schedule is, as listings say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A `[[schedules]]` entry.
    Config,
    /// Stored in Redis through the api.
    Api,
}

/// A recurring task: what to enqueue where, when, and until when.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Unique among the config's and the stored schedules; a config entry without one is
    /// `QUEUE.N` ([`default_name`]).
    pub name: String,
    /// The queue its tasks go to.
    pub queue: String,
    /// When it fires.
    pub rule: Rule,
    /// The IANA zone its cron rule is read in; `None`: `[manager].timezone`.
    pub timezone: Option<Tz>,
    /// The moment (Unix ms) after which it fires no more: it has ended.
    pub until_ms: Option<i64>,
    /// Each task's payload, as compact JSON text.
    pub payload: String,
    /// The config's or stored.
    pub origin: Origin,
}

/// The name of an unnamed `[[schedules]]` entry: its queue and its position in the file
/// (`nightly_report.0`).
pub fn default_name(queue: &str, index: usize) -> String {
    format!("{queue}.{index}")
}

impl Schedule {
    /// Whether it is the config's or stored.
    pub fn source(&self) -> Source {
        match self.origin {
            Origin::Config { .. } => Source::Config,
            Origin::Api { .. } => Source::Api,
        }
    }

    /// Who made it: a key's name, `cli`, `admin`, or `config`.
    pub fn owner(&self) -> &str {
        match &self.origin {
            Origin::Config { .. } => "config",
            Origin::Api { owner, .. } => owner,
        }
    }

    /// When it was stored (Unix ms); `None` for the config's.
    pub fn created_ms(&self) -> Option<i64> {
        match self.origin {
            Origin::Config { .. } => None,
            Origin::Api { created_ms, .. } => Some(created_ms),
        }
    }

    /// Its field in the claim hash (`Keys::schedules`), which holds the last fire claimed;
    /// `FIELD:pending` holds a fire claimed and not yet enqueued, `FIELD:fired` the last
    /// fire claimed to be enqueued. An unnamed cron entry of the config keeps the field of
    /// the releases before names (`INDEX:QUEUE:CRON`), so an upgrade neither fires again
    /// nor skips; every other schedule has `name:NAME`.
    pub fn claim_key(&self) -> String {
        match (&self.origin, &self.rule) {
            (
                Origin::Config {
                    index,
                    named: false,
                },
                Rule::Cron { source, .. },
            ) => format!("{index}:{}:{source}", self.queue),
            _ => claim_key_of(&self.name),
        }
    }

    /// The id of the task fired at `fire_ms`: the same from every manager, so a fire
    /// enqueued twice deduplicates.
    pub fn task_id(&self, fire_ms: i64) -> String {
        format!("{SUBMITTER_PREFIX}{}:{fire_ms}", self.name)
    }

    /// The id releases before names gave the fire at `fire_ms` of an unnamed cron entry
    /// (`schedule:INDEX:MS`): a fire left pending by such a release may have been
    /// enqueued under it.
    pub fn legacy_task_id(&self, fire_ms: i64) -> Option<String> {
        match (&self.origin, &self.rule) {
            (
                Origin::Config {
                    index,
                    named: false,
                },
                Rule::Cron { .. },
            ) => Some(format!("{SUBMITTER_PREFIX}{index}:{fire_ms}")),
            _ => None,
        }
    }

    /// What a fire's record shows as `submitted_by`.
    pub fn submitted_by(&self) -> String {
        format!("{SUBMITTER_PREFIX}{}", self.name)
    }

    /// The zone its cron rule is read in, `default` (`[manager].timezone`) unless it names
    /// one.
    pub fn zone(&self, default: Tz) -> Tz {
        self.timezone.unwrap_or(default)
    }

    /// Whether it has ended at `now_ms`: its `until` has passed.
    pub fn ended_at(&self, now_ms: i64) -> bool {
        self.until_ms.is_some_and(|u| now_ms > u)
    }

    /// Where firing starts when no fire was ever claimed: a stored schedule fires from its
    /// creation on (a leader that first sees it later catches up); `None` for the config's,
    /// which fire from the moment the leader first sees them.
    pub fn start_ms(&self) -> Option<i64> {
        self.created_ms()
    }

    fn origin_ms(&self) -> i64 {
        self.created_ms().unwrap_or(0)
    }

    /// Its fire moments after `after_ms` up to `now_ms` and its `until`, at most `limit`,
    /// in order; `default` is `[manager].timezone`.
    pub fn due(&self, after_ms: i64, now_ms: i64, default: Tz, limit: usize) -> Vec<i64> {
        let last = self.until_ms.map_or(now_ms, |u| u.min(now_ms));
        self.rule
            .after(after_ms, self.zone(default), self.origin_ms(), limit)
            .into_iter()
            .take_while(|&ms| ms <= last)
            .collect()
    }

    /// Its first fire moment after `after_ms`, if it fires again before its `until`.
    pub fn next_after(&self, after_ms: i64, default: Tz) -> Option<i64> {
        let next = *self
            .rule
            .after(after_ms, self.zone(default), self.origin_ms(), 1)
            .first()?;
        (self.until_ms.is_none_or(|u| next <= u)).then_some(next)
    }
}

/// The claim field of a named schedule: `name:NAME` (names hold no `:`, so no field of one
/// schedule is another's).
pub fn claim_key_of(name: &str) -> String {
    format!("name:{name}")
}

/// The schedule's name in a fire's `submitted_by`, when it is one's.
pub fn fired_by(submitted_by: &str) -> Option<&str> {
    submitted_by.strip_prefix(SUBMITTER_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(rule: Rule, origin: Origin) -> Schedule {
        Schedule {
            name: "n".into(),
            queue: "q".into(),
            rule,
            timezone: None,
            until_ms: None,
            payload: "{}".into(),
            origin,
        }
    }

    #[test]
    fn every_fires_at_whole_periods_from_its_origin() {
        let s = schedule(
            Rule::every("2s").unwrap(),
            Origin::Api {
                owner: "shop".into(),
                created_ms: 1_000_500,
            },
        );
        assert_eq!(
            s.due(0, 1_007_000, chrono_tz::UTC, 10),
            [1_002_500, 1_004_500, 1_006_500]
        );
        assert_eq!(s.due(1_004_500, 1_007_000, chrono_tz::UTC, 10), [1_006_500]);
        assert_eq!(s.next_after(1_006_500, chrono_tz::UTC), Some(1_008_500));
        let config = schedule(
            Rule::every("1m").unwrap(),
            Origin::Config {
                index: 0,
                named: true,
            },
        );
        assert_eq!(
            config.due(59_999, 181_000, chrono_tz::UTC, 10),
            [60_000, 120_000, 180_000]
        );
    }

    #[test]
    fn until_ends_the_fires() {
        let mut s = schedule(
            Rule::every("1s").unwrap(),
            Origin::Config {
                index: 0,
                named: true,
            },
        );
        s.until_ms = Some(3_000);
        assert_eq!(s.due(0, 10_000, chrono_tz::UTC, 10), [1_000, 2_000, 3_000]);
        assert_eq!(s.next_after(3_000, chrono_tz::UTC), None);
        assert!(s.ended_at(3_001) && !s.ended_at(3_000));
    }

    #[test]
    fn cron_is_read_in_the_schedules_zone() {
        let mut s = schedule(
            Rule::cron("0 3 * * *").unwrap(),
            Origin::Config {
                index: 0,
                named: true,
            },
        );
        let midnight_utc = 1_767_225_600_000; // 2026-01-01T00:00:00Z
        let hour = 3_600_000;
        assert_eq!(
            s.next_after(midnight_utc, chrono_tz::UTC),
            Some(midnight_utc + 3 * hour)
        );
        s.timezone = Some(chrono_tz::Europe::Moscow);
        // 03:00 in Moscow (UTC+3) is midnight UTC: the next is the day after.
        assert_eq!(
            s.next_after(midnight_utc, chrono_tz::UTC),
            Some(midnight_utc + 24 * hour)
        );
    }

    #[test]
    fn an_unnamed_cron_entry_keeps_the_names_of_the_releases_before_names() {
        let unnamed = Schedule {
            name: default_name("q", 2),
            ..schedule(
                Rule::cron("* * * * *").unwrap(),
                Origin::Config {
                    index: 2,
                    named: false,
                },
            )
        };
        assert_eq!(unnamed.claim_key(), "2:q:* * * * *");
        assert_eq!(unnamed.task_id(7), "schedule:q.2:7");
        assert_eq!(unnamed.legacy_task_id(7).as_deref(), Some("schedule:2:7"));
        assert_eq!(unnamed.submitted_by(), "schedule:q.2");
        let named = schedule(
            Rule::cron("* * * * *").unwrap(),
            Origin::Config {
                index: 2,
                named: true,
            },
        );
        assert_eq!(named.claim_key(), "name:n");
        assert_eq!(named.legacy_task_id(7), None);
        assert_eq!(fired_by("schedule:n"), Some("n"));
        assert_eq!(
            Rule::every("500ms").unwrap_err(),
            "every 500ms is shorter than the limit of 1s"
        );
    }
}
