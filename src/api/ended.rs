//! Waking the requests that wait for a task's end, without polling.
//!
//! One pub/sub connection per api instance listens on every queue's `NS:{Q}:ended`
//! channel (a pattern subscription). A waiting request registers here first, then marks
//! the task's record as watched (`Queue::watch`); the script that ends a watched task
//! publishes its id, and the listener wakes the requests waiting for it. While the
//! subscription is down, waiting requests are woken at once (they look at the record and
//! wait again), so a missed message costs a look, never a hung request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::queue_client::{Cause, ConnectOptions, QueueError, Spell, SpellStep, pubsub, redacted};

type Waiters = HashMap<(String, String), Vec<(u64, oneshot::Sender<()>)>>;

/// The waiting requests of one api instance and the subscription that wakes them.
pub struct Ended {
    waiters: Mutex<Waiters>,
    next: AtomicU64,
    connected: watch::Sender<bool>,
}

/// One request's wait for one task; dropping it unregisters.
pub struct Registration {
    ended: Arc<Ended>,
    key: (String, String),
    token: u64,
    /// Fires when the task ended, or when the subscription dropped (look again).
    pub woken: oneshot::Receiver<()>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut waiters = self.ended.waiters.lock().expect("waiters lock");
        if let Some(list) = waiters.get_mut(&self.key) {
            list.retain(|(t, _)| *t != self.token);
            if list.is_empty() {
                waiters.remove(&self.key);
            }
        }
    }
}

impl Ended {
    /// Starts the listener on `url` for the namespace's queues; it runs until `shutdown`.
    pub fn start(
        url: String,
        namespace: &str,
        connect: ConnectOptions,
        shutdown: CancellationToken,
    ) -> Arc<Ended> {
        let ended = Arc::new(Ended {
            waiters: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            connected: watch::channel(false).0,
        });
        let pattern = format!("{namespace}:{{*}}:ended");
        tokio::spawn(listen(ended.clone(), url, pattern, connect, shutdown));
        ended
    }

    /// Registers a wait for `id` of `queue`. Register before marking the record watched,
    /// so its end cannot slip between the two.
    pub fn register(self: &Arc<Self>, queue: &str, id: &str) -> Registration {
        let (tx, rx) = oneshot::channel();
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let key = (queue.to_string(), id.to_string());
        self.waiters
            .lock()
            .expect("waiters lock")
            .entry(key.clone())
            .or_default()
            .push((token, tx));
        Registration {
            ended: self.clone(),
            key,
            token,
            woken: rx,
        }
    }

    /// Waits until the subscription is up; false when `limit` passes first.
    pub async fn connected(&self, limit: Duration) -> bool {
        let mut rx = self.connected.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|up| *up))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn wake(&self, queue: &str, id: &str) {
        let key = (queue.to_string(), id.to_string());
        if let Some(list) = self.waiters.lock().expect("waiters lock").remove(&key) {
            for (_, tx) in list {
                let _ = tx.send(());
            }
        }
    }

    fn wake_all(&self) {
        let all = std::mem::take(&mut *self.waiters.lock().expect("waiters lock"));
        for (_, tx) in all.into_values().flatten() {
            let _ = tx.send(());
        }
    }
}

/// The queue of an `NS:{Q}:ended` channel.
fn queue_of(channel: &str) -> Option<&str> {
    let start = channel.find('{')? + 1;
    let end = channel.rfind("}:ended")?;
    (start <= end).then(|| &channel[start..end])
}

async fn listen(
    ended: Arc<Ended>,
    url: String,
    pattern: String,
    connect: ConnectOptions,
    shutdown: CancellationToken,
) {
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    // The spell without a subscription: said once as it starts (with its cause), once as
    // it ends, and in between only when a refusal someone must fix (an ACL) replaces an
    // outage, so that a long outage does not warn at every retry.
    let mut spell = Spell::default();
    loop {
        let subscribed = async {
            let mut ps = pubsub(&url, &connect).await?;
            ps.psubscribe(&pattern).await?;
            Ok::<_, QueueError>(ps)
        };
        let ps = tokio::select! {
            () = shutdown.cancelled() => return,
            r = subscribed => r,
        };
        match ps {
            Ok(ps) => {
                backoff.reset();
                said_subscribed(&url, spell.answered(Instant::now()));
                ended.connected.send_replace(true);
                let mut messages = ps.into_on_message();
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        msg = messages.next() => match msg {
                            Some(msg) => {
                                let id: String = msg.get_payload().unwrap_or_default();
                                if let Some(queue) = queue_of(msg.get_channel_name()) {
                                    ended.wake(queue, &id);
                                }
                            }
                            None => break,
                        },
                    }
                }
                // No error to name: the stream just ends. The spell's warning waits for
                // the cause the next subscribe meets, or this line is all there is.
                tracing::info!(redis = %redacted(&url), "lost the subscription to task ends; subscribing again");
            }
            Err(e) => said_failure(&url, &pattern, &e, spell.failed(e.cause(), Instant::now())),
        }
        ended.connected.send_replace(false);
        // Whoever waits looks at its task again rather than miss an end while we were away.
        ended.wake_all();
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = backoff.pause() => {}
        }
    }
}

/// Logs a failed subscribe as its spell's step says: a warning with its cause when the
/// spell starts or turns into a refusal, debug otherwise.
fn said_failure(url: &str, pattern: &str, e: &QueueError, step: SpellStep) {
    let cause = e.cause();
    let (SpellStep::Started(_) | SpellStep::Changed { .. }) = step else {
        tracing::debug!(redis = %redacted(url), cause = %cause, error = %e, "cannot subscribe to task ends");
        return;
    };
    // Until it can, a sync wait is woken only by its periodic look.
    if cause == Cause::AclRefused {
        tracing::warn!(redis = %redacted(url), cause = %cause, pattern = %pattern, error = %e,
            "cannot subscribe to task ends: the ACL refuses the channels (grant &NS:{{*}}:ended); sync waits see ends only by looking again every few seconds");
    } else {
        tracing::warn!(redis = %redacted(url), cause = %cause, error = %e,
            "cannot subscribe to task ends; sync waits see ends only by looking again every few seconds until it can (retries logged at debug)");
    }
}

/// Logs a subscribe that succeeded: the end of a spell with its length, or a first one.
fn said_subscribed(url: &str, step: SpellStep) {
    match step {
        SpellStep::Ended { lasted, failed } => tracing::info!(
            redis = %redacted(url),
            after = %humantime::format_duration(lasted),
            failed_attempts = failed,
            "subscribed to task ends again"
        ),
        _ => tracing::debug!(redis = %redacted(url), "listening for the end of watched tasks"),
    }
}

#[cfg(test)]
mod tests {
    use super::queue_of;

    #[test]
    fn channels_name_their_queue() {
        assert_eq!(queue_of("gaffer:{emails}:ended"), Some("emails"));
        assert_eq!(queue_of("gaffer:{a.b-c}:ended"), Some("a.b-c"));
        assert_eq!(queue_of("gaffer:emails:ended"), None);
    }
}
