//! The queue's errors: what every operation returns, with Redis errors kept whole so a
//! caller can tell an outage (retry later) from a refusal (do not retry).

/// Errors of queue operations. Redis errors keep their kind so callers can tell a
/// connection problem (retry later) from a refused request (do not retry).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Redis could not be reached or failed a command.
    #[error("redis: {0}")]
    Redis(redis::RedisError),
    /// Connecting failed (refused, timed out, dropped): an outage, retried.
    #[error("cannot connect to redis at {target}")]
    Connect {
        /// The server (password redacted) and what went wrong, as the driver said it.
        target: String,
        /// What went wrong, as an operator acts on it.
        cause: Cause,
    },
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
    /// The queue's data is of another layout than this gaffer's
    /// ([`layout`](super::layout)): nothing was read or written. An older one is moved on
    /// by `gaffer migrate`; a newer one needs a newer gaffer.
    #[error("queue {queue} has layout {found}, this gaffer needs layout {need}: {}", layout_hint(.queue, *.found, *.need))]
    Layout {
        /// Queue name.
        queue: String,
        /// The queue's layout.
        found: u32,
        /// This gaffer's ([`super::layout::CURRENT`]).
        need: u32,
    },
    /// The write was done on the primary, but fewer replicas than `[cluster]
    /// wait_replicas` acknowledged it within `wait_timeout` (`durability.rs`): a failover
    /// now could lose it. Transient: the same call may be confirmed once the replicas
    /// catch up.
    #[error("write not confirmed: {acknowledged} of wait_replicas = {wanted} replicas acknowledged within {}", humantime::format_duration(*.timeout))]
    NotConfirmed {
        /// Replicas that acknowledged the write in time.
        acknowledged: u64,
        /// `wait_replicas`.
        wanted: u32,
        /// `wait_timeout`.
        timeout: std::time::Duration,
    },
}

fn layout_hint(queue: &str, found: u32, need: u32) -> String {
    if found < need {
        format!("run gaffer migrate {queue}")
    } else {
        "upgrade gaffer".to_string()
    }
}

/// The error code of a script's layout refusal (`layout_check` in lua/lib/keys.lua).
const LAYOUT_CODE: &str = "LAYOUT";

impl From<redis::RedisError> for QueueError {
    fn from(e: redis::RedisError) -> Self {
        layout_refusal(&e).unwrap_or(QueueError::Redis(e))
    }
}

/// The [`QueueError::Layout`] a script's refusal stands for: "queue Q has layout F, this
/// gaffer needs layout N: …".
fn layout_refusal(e: &redis::RedisError) -> Option<QueueError> {
    if e.code() != Some(LAYOUT_CODE) {
        return None;
    }
    let rest = e.detail()?.strip_prefix("queue ")?;
    let (queue, rest) = rest.split_once(" has layout ")?;
    let (found, rest) = rest.split_once(", this gaffer needs layout ")?;
    let need = rest.split(':').next()?;
    Some(QueueError::Layout {
        queue: queue.to_string(),
        found: found.parse().ok()?,
        need: need.parse().ok()?,
    })
}

impl QueueError {
    /// True when the error says Redis is unreachable, slow or not ready yet (loading its
    /// data after a restart, a cluster failing over), so retrying later may work.
    pub fn is_transient(&self) -> bool {
        match self {
            // What waiting may end is what an operator would call an outage (see
            // [`Cause::of_redis`]): one list, so a new kind of failure the driver returns
            // is named and retried alike.
            QueueError::Redis(e) => Cause::of_redis(e).is_outage(),
            QueueError::Connect { .. } | QueueError::NotConfirmed { .. } => true,
            _ => false,
        }
    }

    /// Why the call failed, as an operator acts on it: logged beside the error, so that an
    /// outage is not mistaken for a refusal (a password, an ACL) or the other way round.
    pub fn cause(&self) -> Cause {
        match self {
            QueueError::Redis(e) => Cause::of_redis(e),
            QueueError::Connect { cause, .. } => *cause,
            QueueError::Certificate(_) => Cause::TlsRefused,
            QueueError::NotConfirmed { .. } => Cause::NotConfirmed,
            _ => Cause::Other,
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

/// Why a call to Redis failed, in the words an operator acts on. Logs carry it as
/// `cause=…` ([`Cause::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Nothing listens at the address: Redis is down or restarting.
    Refused,
    /// No answer in time: Redis frozen or overloaded, or the network cut.
    TimedOut,
    /// The connection broke (reset, closed, cut short).
    Dropped,
    /// Redis answers but cannot serve yet: loading its data after a restart, or a
    /// cluster failing over.
    NotReady,
    /// The user or password was refused (`WRONGPASS`, `NOAUTH`).
    AuthRefused,
    /// The ACL refused this user a command, key or channel (`NOPERM`).
    AclRefused,
    /// The TLS handshake failed (a certificate refused).
    TlsRefused,
    /// The server is a replica: it refuses writes.
    ReadOnly,
    /// Redis is at its `maxmemory`: it refuses writes.
    OutOfMemory,
    /// Fewer replicas than `[cluster] wait_replicas` confirmed a write in time (replicas
    /// down, lagging or cut off): the primary has it, a failover could lose it.
    NotConfirmed,
    /// Anything else; the error's own text says what.
    Other,
}

impl Cause {
    /// Its name in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Refused => "refused",
            Cause::TimedOut => "timed_out",
            Cause::Dropped => "dropped",
            Cause::NotReady => "not_ready",
            Cause::AuthRefused => "auth_refused",
            Cause::AclRefused => "acl_refused",
            Cause::TlsRefused => "tls_refused",
            Cause::ReadOnly => "read_only",
            Cause::OutOfMemory => "out_of_memory",
            Cause::NotConfirmed => "not_confirmed",
            Cause::Other => "other",
        }
    }

    /// True when waiting may end it (Redis down, frozen, restarting, its replicas behind);
    /// false when someone must act (a password, an ACL, a certificate).
    pub fn is_outage(self) -> bool {
        matches!(
            self,
            Cause::Refused
                | Cause::TimedOut
                | Cause::Dropped
                | Cause::NotReady
                | Cause::NotConfirmed
        )
    }

    /// The cause of a driver's error. Checked in this order because the driver's own
    /// tests overlap: a refusal also reads as a dropped connection.
    pub fn of_redis(e: &redis::RedisError) -> Cause {
        use redis::{ErrorKind, ServerErrorKind};
        match (e.kind(), e.code()) {
            (ErrorKind::AuthenticationFailed, _) | (_, Some("WRONGPASS" | "NOAUTH")) => {
                return Cause::AuthRefused;
            }
            (ErrorKind::Server(ServerErrorKind::NoPerm), _) | (_, Some("NOPERM")) => {
                return Cause::AclRefused;
            }
            (ErrorKind::Server(ServerErrorKind::ReadOnly), _) => return Cause::ReadOnly,
            (_, Some("OOM")) => return Cause::OutOfMemory,
            (
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::Moved
                    | ServerErrorKind::Ask,
                ),
                _,
            ) => return Cause::NotReady,
            _ => {}
        }
        // A cluster client with no connection to the node that serves the key: the node
        // is down or restarting (it found the node's address, and could not reach it).
        if e.is_connection_refusal() || e.kind() == ErrorKind::ClusterConnectionNotFound {
            Cause::Refused
        } else if e.is_timeout() {
            Cause::TimedOut
        } else if e.is_connection_dropped() || e.is_io_error() {
            Cause::Dropped
        } else {
            Cause::Other
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: std::io::ErrorKind) -> QueueError {
        QueueError::Redis(redis::RedisError::from(std::io::Error::from(kind)))
    }

    /// A reply line as the server sends it, as the driver turns it into an error.
    fn server(reply: &str) -> QueueError {
        let value = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()).unwrap();
        QueueError::Redis(value.extract_error().unwrap_err())
    }

    /// A script's layout refusal becomes [`QueueError::Layout`], its message whole.
    #[test]
    fn a_layout_refusal_is_typed() {
        let reply =
            "LAYOUT queue q.1 has layout 1, this gaffer needs layout 2: run gaffer migrate q.1";
        let value = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()).unwrap();
        let e = QueueError::from(value.extract_error().unwrap_err());
        assert!(
            matches!(&e, QueueError::Layout { queue, found: 1, need: 2 } if queue == "q.1"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), &reply["LAYOUT ".len()..]);
        let newer = QueueError::Layout {
            queue: "q".into(),
            found: 3,
            need: 2,
        };
        assert_eq!(
            newer.to_string(),
            "queue q has layout 3, this gaffer needs layout 2: upgrade gaffer"
        );
        assert!(matches!(server("LAYOUT nonsense"), QueueError::Redis(_)));
    }

    /// What the api's listener once blamed on the ACL whatever happened: each failure is
    /// named for what it is.
    #[test]
    fn failures_are_named_by_their_cause() {
        use std::io::ErrorKind;
        let cases = [
            (io(ErrorKind::ConnectionRefused), Cause::Refused),
            (io(ErrorKind::TimedOut), Cause::TimedOut),
            (io(ErrorKind::ConnectionReset), Cause::Dropped),
            (io(ErrorKind::UnexpectedEof), Cause::Dropped),
            (io(ErrorKind::BrokenPipe), Cause::Dropped),
            (
                server("LOADING Redis is loading the dataset in memory"),
                Cause::NotReady,
            ),
            (server("CLUSTERDOWN The cluster is down"), Cause::NotReady),
            // (what a cluster client returns when the node a slot moved to is down)
            (server("MOVED 4772 127.0.0.1:42271"), Cause::NotReady),
            (server("ASK 4772 127.0.0.1:42271"), Cause::NotReady),
            // (and what it returns while it cannot reconnect to a node that was killed)
            (
                QueueError::Redis(redis::RedisError::from((
                    redis::ErrorKind::ClusterConnectionNotFound,
                    "No connections found",
                ))),
                Cause::Refused,
            ),
            (
                server(
                    "NOPERM this user has no permissions to access one of the channels used as arguments",
                ),
                Cause::AclRefused,
            ),
            (
                server("WRONGPASS invalid username-password pair or user is disabled."),
                Cause::AuthRefused,
            ),
            (
                server("NOAUTH Authentication required."),
                Cause::AuthRefused,
            ),
            (
                QueueError::Redis(redis::RedisError::from((
                    redis::ErrorKind::AuthenticationFailed,
                    "Password authentication failed",
                ))),
                Cause::AuthRefused,
            ),
            (
                server("READONLY You can't write against a read only replica."),
                Cause::ReadOnly,
            ),
            (
                server("OOM command not allowed when used memory > 'maxmemory'."),
                Cause::OutOfMemory,
            ),
            (server("ERR unknown command"), Cause::Other),
            (
                QueueError::Connect {
                    target: "redis://127.0.0.1:1/: timed out".into(),
                    cause: Cause::TimedOut,
                },
                Cause::TimedOut,
            ),
            (QueueError::Certificate("x".into()), Cause::TlsRefused),
            (
                QueueError::NotConfirmed {
                    acknowledged: 0,
                    wanted: 1,
                    timeout: std::time::Duration::from_secs(1),
                },
                Cause::NotConfirmed,
            ),
            (QueueError::Invalid("bad id".into()), Cause::Other),
        ];
        for (error, cause) in cases {
            assert_eq!(error.cause(), cause, "{error}");
        }
        assert!(Cause::Refused.is_outage() && Cause::NotReady.is_outage());
        assert!(Cause::NotConfirmed.is_outage());
        assert!(server("MOVED 4772 127.0.0.1:42271").is_transient());
        // (a slot exited on it when a cluster node was killed: found by the fault suite)
        let not_found = redis::RedisError::from((
            redis::ErrorKind::ClusterConnectionNotFound,
            "No connections found",
        ));
        assert!(QueueError::Redis(not_found).is_transient());
        assert!(!server("ERR unknown command").is_transient());
        assert!(!server("READONLY You can't write against a read only replica.").is_transient());
        assert!(!server("OOM command not allowed when used memory > 'maxmemory'.").is_transient());
        assert!(!Cause::AclRefused.is_outage() && !Cause::AuthRefused.is_outage());
    }
}
