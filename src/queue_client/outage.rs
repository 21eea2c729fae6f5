//! A Redis outage logged as a spell rather than as one warning per failed call, by the
//! manager, the master and the api. [`Spell`] is the pure state machine (the time is
//! given), [`OutageLog`] the logging around it. Each warning names its [`Cause`], read
//! from the error in `error.rs`: refused, timed out, dropped, not ready, auth or ACL
//! refused, …

use std::time::{Duration, Instant};

use super::{Cause, QueueError};

/// Where a spell without Redis stands, and what each failure or answer has to say about
/// it. Pure (the time is given), so the words of an outage are decided, and tested, apart
/// from logging them.
#[derive(Debug, Default)]
pub struct Spell {
    since: Option<Instant>,
    cause: Option<Cause>,
    failed: u64,
}

/// What one failure or answer says about the spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpellStep {
    /// The first failure: the spell starts (one warning).
    Started(Cause),
    /// A failure whose cause turned from an outage into a refusal someone must act on (a
    /// password, an ACL) or back: worth a warning again.
    Changed {
        /// The cause of the failure before.
        from: Cause,
        /// The cause now.
        to: Cause,
    },
    /// Another failure of the spell: quiet (debug).
    Again(Cause),
    /// The first answer after failures: the spell ends (one info line).
    Ended {
        /// How long it lasted, to the millisecond.
        lasted: Duration,
        /// Calls that failed during it.
        failed: u64,
    },
    /// An answer with no spell on: nothing to say.
    Calm,
}

impl Spell {
    /// A call failed for `cause` at `now`.
    pub fn failed(&mut self, cause: Cause, now: Instant) -> SpellStep {
        self.failed += 1;
        let before = self.cause.replace(cause);
        match (self.since, before) {
            (None, _) | (_, None) => {
                self.since = Some(now);
                SpellStep::Started(cause)
            }
            (Some(_), Some(from)) if from.is_outage() != cause.is_outage() => {
                SpellStep::Changed { from, to: cause }
            }
            (Some(_), Some(_)) => SpellStep::Again(cause),
        }
    }

    /// A call succeeded at `now`: ends the spell, if there was one.
    pub fn answered(&mut self, now: Instant) -> SpellStep {
        let Some(since) = self.since.take() else {
            return SpellStep::Calm;
        };
        self.cause = None;
        let lasted = now.saturating_duration_since(since);
        let step = SpellStep::Ended {
            lasted: Duration::from_millis(lasted.as_millis() as u64),
            failed: self.failed,
        };
        self.failed = 0;
        step
    }

    /// Whether a spell is on: a call failed and none has succeeded since.
    pub fn is_out(&self) -> bool {
        self.since.is_some()
    }
}

/// One daemon's spells without Redis. A daemon calls Redis several times a tick, and
/// during an outage every call fails: warned one by one, a ten-minute outage buries the
/// log in identical lines. So the first failure of a spell is a warning (with its cause,
/// saying that the rest are quiet), the failures after it go to debug, and the first
/// answer after it is one info line with how long the spell lasted and how many calls
/// failed. An error that is not an outage (a refused request, a reply that makes no
/// sense) is warned about every time. It also sets the gauge `gaffer_redis_up`: 0 from an
/// outage's first failure, 1 from the first answer (the alert rules' Redis outage).
#[derive(Debug, Default)]
pub struct OutageLog {
    spell: Spell,
}

impl OutageLog {
    /// A call to Redis failed; `what` says which, as the warning's message.
    pub fn failed(&mut self, what: &str, error: &QueueError) {
        if !error.is_transient() {
            tracing::warn!(cause = %error.cause(), error = %error, "{what}");
            return;
        }
        self.failed_for(what, error.cause(), error);
    }

    /// A call failed for `cause`, an outage's, with `error` as its text: for callers
    /// that no longer hold the [`QueueError`] (the api's answers).
    pub fn failed_for(&mut self, what: &str, cause: Cause, error: &dyn std::fmt::Display) {
        metrics::gauge!("gaffer_redis_up").set(0.0);
        match self.spell.failed(cause, Instant::now()) {
            SpellStep::Started(_) | SpellStep::Changed { .. } => tracing::warn!(
                cause = %cause,
                error = %error,
                "{what}; redis unreachable, further failures are logged at debug until it answers"
            ),
            _ => tracing::debug!(cause = %cause, error = %error, "{what}"),
        }
    }

    /// A call to Redis succeeded: ends the spell, if there was one.
    pub fn answered(&mut self) {
        metrics::gauge!("gaffer_redis_up").set(1.0);
        if let SpellStep::Ended { lasted, failed } = self.spell.answered(Instant::now()) {
            tracing::info!(
                after = %humantime::format_duration(lasted),
                failed_calls = failed,
                "redis answers again"
            );
        }
    }

    /// Whether a spell is on: a call failed and none has succeeded since.
    pub fn is_out(&self) -> bool {
        self.spell.is_out()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> QueueError {
        QueueError::Redis(redis::RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )))
    }

    #[test]
    fn a_spell_starts_at_the_first_transient_failure_and_ends_at_an_answer() {
        let mut log = OutageLog::default();
        log.answered();
        assert!(!log.is_out());
        log.failed("reading the map failed", &QueueError::Invalid("bad".into()));
        assert!(!log.is_out(), "a refused request is no outage");
        log.failed("reading the map failed", &refused());
        log.failed("publishing the report failed", &refused());
        assert!(log.is_out());
        assert_eq!(log.spell.failed, 2);
        log.answered();
        assert!(!log.is_out());
        assert_eq!(log.spell.failed, 0);
    }

    /// One warning when a spell starts, quiet while it lasts, one more only when what
    /// failed it turns from an outage into a refusal, and its length when it ends.
    #[test]
    fn a_spell_says_its_start_a_change_of_kind_and_its_end_once() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut spell = Spell::default();
        assert_eq!(spell.answered(at(0)), SpellStep::Calm);
        assert_eq!(
            spell.failed(Cause::Refused, at(10)),
            SpellStep::Started(Cause::Refused)
        );
        assert_eq!(
            spell.failed(Cause::Refused, at(20)),
            SpellStep::Again(Cause::Refused)
        );
        // Redis coming back and loading its data is the same outage.
        assert_eq!(
            spell.failed(Cause::NotReady, at(30)),
            SpellStep::Again(Cause::NotReady)
        );
        assert_eq!(
            spell.failed(Cause::AclRefused, at(40)),
            SpellStep::Changed {
                from: Cause::NotReady,
                to: Cause::AclRefused
            }
        );
        assert_eq!(
            spell.failed(Cause::AclRefused, at(50)),
            SpellStep::Again(Cause::AclRefused)
        );
        assert_eq!(
            spell.answered(at(13_010)),
            SpellStep::Ended {
                lasted: Duration::from_secs(13),
                failed: 5
            }
        );
        assert_eq!(spell.answered(at(13_020)), SpellStep::Calm);
        assert_eq!(
            spell.failed(Cause::TimedOut, at(14_000)),
            SpellStep::Started(Cause::TimedOut),
            "a new spell after an answer"
        );
    }
}
