//! What the connections that follow a failover share (`sentinel.rs`, `cluster_conn.rs`):
//! a generation number bumped each time the connection is replaced, and calls in flight
//! on an older one cut short, so a call waiting on a server that froze fails at once
//! instead of waiting out the response timeout.

use tokio::sync::watch;

/// The generation of a following connection, as calls in flight watch it.
pub(crate) struct Switch {
    generation: watch::Sender<u64>,
}

impl Switch {
    /// Generation 0.
    pub(crate) fn new() -> Self {
        Switch {
            generation: watch::Sender::new(0),
        }
    }

    /// Tells calls in flight that the connection is now of `generation`.
    pub(crate) fn to(&self, generation: u64) {
        self.generation.send_replace(generation);
    }

    /// Runs `call`, made on the connection of `generation`; when that connection is
    /// replaced meanwhile, the call fails with a dropped-connection error saying `why`,
    /// which callers treat as the outage it is and retry after their backoff.
    pub(crate) async fn unless_switched<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
        generation: u64,
        why: &'static str,
    ) -> redis::RedisResult<T> {
        let mut switched = self.generation.subscribe();
        tokio::select! {
            r = call => r,
            _ = switched.wait_for(|g| *g != generation) => Err(redis::RedisError::from(
                std::io::Error::new(std::io::ErrorKind::ConnectionAborted, why),
            )),
        }
    }
}
