//! A Redis outage logged as a spell rather than as one warning per failed call.

use std::time::{Duration, Instant};

use super::QueueError;

/// One daemon's spells without Redis. A daemon calls Redis several times a tick, and
/// during an outage every call fails: warned one by one, a ten-minute outage buries the
/// log in identical lines. So the first failure of a spell is a warning (saying that the
/// rest are quiet), the failures after it go to debug, and the first answer after it is
/// one info line with how long the spell lasted and how many calls failed. An error
/// that is not an outage (a refused request, a reply that makes no sense) is warned
/// about every time.
#[derive(Debug, Default)]
pub struct OutageLog {
    since: Option<Instant>,
    failed: u64,
}

impl OutageLog {
    /// A call to Redis failed; `what` says which, as the warning's message.
    pub fn failed(&mut self, what: &str, error: &QueueError) {
        if !error.is_transient() {
            tracing::warn!(error = %error, "{what}");
            return;
        }
        self.failed += 1;
        if self.since.is_none() {
            self.since = Some(Instant::now());
            tracing::warn!(
                error = %error,
                "{what}; redis unreachable, further failures are logged at debug until it answers"
            );
        } else {
            tracing::debug!(error = %error, "{what}");
        }
    }

    /// A call to Redis succeeded: ends the spell, if there was one.
    pub fn answered(&mut self) {
        if let Some(since) = self.since.take() {
            let lasted = Duration::from_millis(since.elapsed().as_millis() as u64);
            tracing::info!(
                after = %humantime::format_duration(lasted),
                failed_calls = self.failed,
                "redis answers again"
            );
            self.failed = 0;
        }
    }

    /// Whether a spell is on: a call failed and none has succeeded since.
    pub fn is_out(&self) -> bool {
        self.since.is_some()
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
        assert_eq!(log.failed, 2);
        log.answered();
        assert!(!log.is_out());
        assert_eq!(log.failed, 0);
    }
}
