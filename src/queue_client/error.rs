//! The queue's errors: what every operation returns, with Redis errors kept whole so a
//! caller can tell an outage (retry later) from a refusal (do not retry).

/// Errors of queue operations. Redis errors keep their kind so callers can tell a
/// connection problem (retry later) from a refused request (do not retry).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Redis could not be reached or failed a command.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Connecting failed (bad URL, refused, timed out).
    #[error("cannot connect to redis at {0}")]
    Connect(String),
    /// The server's TLS certificate was refused (unknown CA, expired, wrong name): no
    /// outage, so not retried.
    #[error("tls certificate of redis at {0}")]
    Certificate(String),
    /// The payload is larger than the queue allows.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes of queue {queue}")]
    PayloadTooLarge {
        /// Queue name.
        queue: String,
        /// Payload size in bytes.
        size: usize,
        /// The queue's limit in bytes.
        limit: u64,
    },
    /// A request the queue refuses: bad id, batch size, queue name, priority.
    #[error("{0}")]
    Invalid(String),
    /// Redis answered something the scripts never return: a bug or a foreign key.
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
    /// The queue's intake is closed: nothing was enqueued.
    #[error("the intake of queue {queue} is closed: it accepts no new tasks")]
    IntakeClosed {
        /// Queue name.
        queue: String,
    },
    /// A submit of ids that must be its submitter's own ([`NewTask::own_id`]) found one
    /// held by another submitter's task or kept record: nothing was enqueued. Names
    /// neither that submitter nor the task's state.
    ///
    /// [`NewTask::own_id`]: super::NewTask::own_id
    #[error("id {id} is taken in queue {queue}")]
    IdTaken {
        /// Queue name.
        queue: String,
        /// The first id taken.
        id: String,
    },
}

impl QueueError {
    /// True when the error says Redis is unreachable, slow or not ready yet (loading its
    /// data after a restart, a cluster failing over), so retrying later may work.
    pub fn is_transient(&self) -> bool {
        use redis::{ErrorKind, ServerErrorKind};
        match self {
            QueueError::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    // The driver's own word for "wait and retry": a server loading its AOF
                    // or RDB answers LOADING until it has read every key.
                    || matches!(
                        e.kind(),
                        ErrorKind::Server(
                            ServerErrorKind::BusyLoading
                                | ServerErrorKind::TryAgain
                                | ServerErrorKind::MasterDown
                                | ServerErrorKind::ClusterDown
                        )
                    )
            }
            QueueError::Connect(_) => true,
            _ => false,
        }
    }

    /// True when the server is a replica (a primary a failover demoted, or a replica's
    /// URL): no write succeeds on this connection. Not transient: a daemon's role exits
    /// and comes back with a fresh connection.
    pub fn is_read_only(&self) -> bool {
        matches!(self, QueueError::Redis(e)
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly))
    }

    /// True when Redis refused a write for want of memory (`maxmemory` reached): nothing
    /// was written, and the same call may succeed once memory is freed.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, QueueError::Redis(e) if e.code() == Some("OOM"))
    }
}

/// Redis could not be reached for a reason waiting cannot fix (a bad URL, a wrong
/// password), as a daemon reports it at its start.
#[derive(Debug, thiserror::Error)]
#[error("connecting to {url}")]
pub struct ConnectError {
    /// The URL, password redacted.
    pub url: String,
    /// What went wrong.
    pub source: QueueError,
}
