//! What a slot tells its master: one datagram per event, but the ends of batches that
//! follow each other within [`REPORT_HOLD`] go as one.
//!
//! A busy no-op slot ends thousands of batches a second. A datagram each cost the slot a
//! send and the master a read, and on a small host that CPU is taken from Redis: end to
//! end with records the bench's median went from 0.766 to 0.795 of the strong bare loop
//! with batch ends held (docs/BENCHMARKS.md, "Fifth look"). So a
//! [`SlotEvent::BatchDone`] that leaves the slot busy (`next` is set) and comes less than
//! `REPORT_HOLD` after the last datagram is held and summed ([`SlotEvent::absorb`]). What
//! is held goes out first, before anything else is sent (the order of events holds), and
//! at the latest on the `report_flush` branch of the batch in hand's loop
//! ([`Reporter::flush_at`]). A batch end that leaves the slot idle is never held, so the
//! master's view of a slot's state is never late by more than `REPORT_HOLD`, and its
//! counters are exact once the held part is out.

use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::host::proto::SlotEvent;

/// How long after a datagram the ends of further batches are held, to go as one.
pub(super) const REPORT_HOLD: Duration = Duration::from_millis(20);

/// The slot's end of its master's socket, shared by the runtime and handler threads.
#[derive(Clone)]
pub(super) struct Reporter {
    sock: Option<Arc<UnixDatagram>>,
    hold: Duration,
    held: Arc<Mutex<Held>>,
}

/// The batch ends not sent yet, summed, and when the last datagram went.
struct Held {
    sum: Option<SlotEvent>,
    last_sent: Option<Instant>,
}

impl Reporter {
    /// A reporter to `sock` (none outside a master: it sends nothing) that holds batch
    /// ends for `hold` after each datagram.
    pub(super) fn new(sock: Option<UnixDatagram>, hold: Duration) -> Self {
        Reporter {
            sock: sock.map(Arc::new),
            hold,
            held: Arc::new(Mutex::new(Held {
                sum: None,
                last_sent: None,
            })),
        }
    }

    /// Sends `ev` after whatever is held, or holds it (see the module's doc).
    pub(super) fn send(&self, ev: &SlotEvent) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let recent = held
            .last_sent
            .is_some_and(|t| now.duration_since(t) < self.hold);
        if recent && matches!(ev, SlotEvent::BatchDone { next: Some(_), .. }) {
            match &mut held.sum {
                Some(sum) => sum.absorb(ev),
                None => held.sum = Some(ev.clone()),
            }
            return;
        }
        if let Some(sum) = held.sum.take() {
            self.write(&sum);
        }
        self.write(ev);
        held.last_sent = Some(now);
    }

    /// Sends what is held, if anything.
    pub(super) fn flush(&self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sum) = held.sum.take() {
            self.write(&sum);
            held.last_sent = Some(Instant::now());
        }
    }

    /// When what is held must go out (none: nothing is held).
    pub(super) fn flush_at(&self) -> Option<Instant> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.sum.as_ref()?;
        Some(held.last_sent? + self.hold)
    }

    /// Tells the master's watchdog the slot is working, not hung.
    pub(super) fn progress(&self, slot: u32, pid: u32) {
        self.send(&SlotEvent::Progress { slot, pid });
    }

    fn write(&self, ev: &SlotEvent) {
        if let (Some(sock), Ok(bytes)) = (&self.sock, serde_json::to_vec(ev)) {
            // Best effort: a master that is gone or busy must never block a slot.
            let _ = sock.send(&bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::proto::StartDelays;

    fn done(tasks: u32, next: Option<u32>, delay_ms: u64) -> SlotEvent {
        let mut start_delays = StartDelays::default();
        start_delays.count(delay_ms);
        SlotEvent::BatchDone {
            slot: 1,
            pid: 2,
            batches: 1,
            tasks,
            failed: 1,
            busy_ms: 3,
            stale: 0,
            next,
            start_delays,
        }
    }

    /// Every datagram waiting on the master's end, in order.
    fn received(master: &UnixDatagram) -> Vec<SlotEvent> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = master.recv(&mut buf) {
            out.push(serde_json::from_slice(&buf[..n]).expect("a slot event"));
        }
        out
    }

    fn pair(hold: Duration) -> (Reporter, UnixDatagram) {
        let (slot, master) = UnixDatagram::pair().expect("a socket pair");
        master.set_nonblocking(true).expect("nonblocking");
        (Reporter::new(Some(slot), hold), master)
    }

    #[test]
    fn busy_batch_ends_right_after_a_datagram_go_as_one_before_the_next_event() {
        let (r, master) = pair(Duration::from_secs(3600));
        r.send(&done(10, Some(10), 4));
        assert_eq!(received(&master), vec![done(10, Some(10), 4)]);
        r.send(&done(7, Some(5), 4));
        r.send(&done(5, Some(9), 40));
        assert!(received(&master).is_empty(), "held");
        assert!(r.flush_at().is_some());
        r.send(&SlotEvent::Idle { slot: 1, pid: 2 });
        let mut delays = StartDelays::default();
        delays.count(4);
        delays.count(40);
        let sum = SlotEvent::BatchDone {
            slot: 1,
            pid: 2,
            batches: 2,
            tasks: 12,
            failed: 2,
            busy_ms: 6,
            stale: 0,
            next: Some(9),
            start_delays: delays,
        };
        assert_eq!(
            received(&master),
            vec![sum, SlotEvent::Idle { slot: 1, pid: 2 }]
        );
        assert_eq!(r.flush_at(), None);
    }

    #[test]
    fn an_end_that_leaves_the_slot_idle_is_never_held_and_flush_sends_the_rest() {
        let (r, master) = pair(Duration::from_secs(3600));
        r.send(&done(1, Some(1), 0));
        r.send(&done(1, None, 0));
        assert_eq!(received(&master).len(), 2);
        r.send(&done(2, Some(2), 0));
        assert!(received(&master).is_empty());
        r.flush();
        assert_eq!(received(&master), vec![done(2, Some(2), 0)]);
        r.flush();
        assert!(received(&master).is_empty(), "nothing held twice");
    }

    #[test]
    fn without_a_hold_every_event_goes_at_once() {
        let (r, master) = pair(Duration::ZERO);
        for _ in 0..3 {
            r.send(&done(1, Some(1), 0));
        }
        assert_eq!(received(&master).len(), 3);
        assert_eq!(r.flush_at(), None);
    }
}
