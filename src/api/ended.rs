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
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::queue_client::{ConnectOptions, pubsub, redacted};

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
    // The last subscribe error logged, so that a refusal that lasts (an ACL without the
    // channels) is said once as a warning, not at every retry.
    let mut said: Option<String> = None;
    loop {
        let subscribed = async {
            let mut ps = pubsub(&url, &connect).await?;
            ps.psubscribe(&pattern).await?;
            Ok::<_, crate::queue_client::QueueError>(ps)
        };
        let ps = tokio::select! {
            () = shutdown.cancelled() => return,
            r = subscribed => r,
        };
        match ps {
            Ok(ps) => {
                backoff.reset();
                said = None;
                ended.connected.send_replace(true);
                tracing::debug!(redis = %redacted(&url), "listening for the end of watched tasks");
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
                tracing::warn!(redis = %redacted(&url), "lost the subscription to task ends; reconnecting");
            }
            Err(e) => {
                let text = e.to_string();
                if said.as_deref() == Some(text.as_str()) {
                    tracing::debug!(redis = %redacted(&url), error = %e, "cannot subscribe to task ends");
                } else {
                    // Until it can, a sync wait is woken only by its periodic look.
                    tracing::warn!(redis = %redacted(&url), pattern = %pattern, error = %e,
                        "cannot subscribe to task ends; sync waits see ends only by looking again every few seconds (an ACL needs the channels &NS:{{*}}:ended)");
                    said = Some(text);
                }
            }
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
