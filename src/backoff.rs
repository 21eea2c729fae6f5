//! Capped doubling back-off: the one rule every "try again later" in gaffer follows.
//!
//! A [`Backoff`] hands out pauses that start at `start` and double up to `cap`; `reset`
//! starts over after a success. It keeps no clock: [`Backoff::next`] only says how long,
//! so a caller can sleep ([`Backoff::pause`]) or schedule a deadline of its own.
//!
//! Used by the slot loop (an outage, a failed take) and by the master's crash and zygote
//! restarts.

use std::time::Duration;

/// Pauses that double from a start value up to a cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    /// The first pause after a [`Backoff::reset`].
    start: Duration,
    /// No pause is longer than this.
    cap: Duration,
    /// The pause the next call to [`Backoff::next`] returns.
    upcoming: Duration,
}

impl Backoff {
    /// Pauses of `start`, `2 × start`, `4 × start`, … never longer than `cap`.
    pub const fn new(start: Duration, cap: Duration) -> Self {
        let first = if start.as_nanos() < cap.as_nanos() {
            start
        } else {
            cap
        };
        Backoff {
            start,
            cap,
            upcoming: first,
        }
    }

    /// The next pause; the one after it is twice as long, up to the cap.
    #[allow(clippy::should_implement_trait)] // Never ends, so not an Iterator.
    pub fn next(&mut self) -> Duration {
        let pause = self.upcoming;
        self.upcoming = pause.saturating_mul(2).min(self.cap);
        pause
    }

    /// Starts over: the next pause is the first one again.
    pub fn reset(&mut self) {
        *self = Backoff::new(self.start, self.cap);
    }

    /// Sleeps for the next pause.
    pub async fn pause(&mut self) {
        tokio::time::sleep(self.next()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn pauses(b: &mut Backoff, n: usize) -> Vec<u128> {
        (0..n).map(|_| b.next().as_millis()).collect()
    }

    #[test]
    fn doubles_up_to_the_cap() {
        let mut b = Backoff::new(ms(50), ms(1000));
        assert_eq!(
            pauses(&mut b, 8),
            [50, 100, 200, 400, 800, 1000, 1000, 1000]
        );
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::new(ms(500), Duration::from_secs(60));
        assert_eq!(pauses(&mut b, 3), [500, 1000, 2000]);
        b.reset();
        assert_eq!(pauses(&mut b, 2), [500, 1000]);
    }

    #[test]
    fn a_start_above_the_cap_is_cut_to_it() {
        let mut b = Backoff::new(ms(300), ms(200));
        assert_eq!(pauses(&mut b, 3), [200, 200, 200]);
        b.reset();
        assert_eq!(b.next(), ms(200));
    }

    #[test]
    fn never_overflows() {
        let mut b = Backoff::new(Duration::MAX / 3, Duration::MAX);
        for _ in 0..10 {
            b.next();
        }
        assert_eq!(b.next(), Duration::MAX);
        let mut zero = Backoff::new(Duration::ZERO, ms(10));
        assert_eq!(pauses(&mut zero, 3), [0, 0, 0]);
    }

    #[tokio::test]
    async fn pause_sleeps_the_next_pause() {
        let mut b = Backoff::new(ms(50), ms(80));
        let started = std::time::Instant::now();
        b.pause().await;
        b.pause().await;
        assert!(started.elapsed() >= ms(130), "{:?}", started.elapsed());
        assert_eq!(b.next(), ms(80));
    }
}
