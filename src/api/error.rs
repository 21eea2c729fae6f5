//! The API's refusals: a status and a message naming what was wrong and the limit.
//!
//! An `ApiError` carries a status and a message, the outage's cause when Redis failed the
//! request, whether a write's outcome is unknown, and the message a limited key gets where
//! the precise one would name what is outside its list.

use hyper::StatusCode;

use crate::queue_client::{Cause, QueueError};

/// A refused or failed request: answered as `{"error": message}` with `status`. A
/// refusal changes nothing in Redis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What was wrong, lower-case, naming the limit where there is one.
    pub message: String,
    /// Whether the answer closes the connection: the request's body was not read whole,
    /// so the connection cannot carry another request.
    pub close: bool,
    /// A write that failed without an answer from Redis may have happened: answered as
    /// `"outcome": "unknown"` beside the error (see [`ApiError::outcome_unknown`]).
    pub outcome_unknown: bool,
    /// The Redis outage that failed the request, by its cause: the instance logs it as
    /// part of a spell rather than per request.
    pub outage: Option<Cause>,
    /// What a limited (non-admin) key is told instead of `message`, where that names a
    /// task, chain holder or queue outside the key's list; `None`: the same message.
    pub limited: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            close: false,
            outcome_unknown: false,
            outage: None,
            limited: None,
        }
    }

    /// This refusal of a write whose command may have reached Redis: the connection was
    /// lost or timed out after it was sent, so the write may have been done. A client
    /// retries such a submit with the same id, which deduplicates it.
    pub fn outcome_unknown(mut self) -> Self {
        self.outcome_unknown = true;
        self
    }

    /// This refusal, with what a limited key is told instead (see [`ApiError::limited`]).
    pub fn or_for_limited(mut self, message: impl Into<String>) -> Self {
        self.limited = Some(message.into());
        self
    }

    /// This refusal as `key` gets it: an admin key the precise message, any other key
    /// the one kept for limited keys, where there is one.
    pub fn seen_by(mut self, key: &crate::config::ApiKey) -> Self {
        if let Some(limited) = self.limited.take().filter(|_| !key.admin) {
            self.message = limited;
        }
        self
    }

    /// This refusal, answered with `Connection: close` (see [`ApiError::close`]).
    pub fn closing(mut self) -> Self {
        self.close = true;
        self
    }

    /// 400: bad JSON, an unknown field, a bad duration or value.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401: no token, or one that matches no key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    /// 403: the key may not use that queue or action.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    /// 404: unknown queue, task, chain or route.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 405: a known path with another method.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, message)
    }

    /// 408: the request's body did not arrive in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, message)
    }

    /// 409: the queue's intake is closed, or the task is not in a state the action
    /// applies to.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }

    /// 410: the task ended and its record is gone: its id already holds a new task that
    /// another key submitted.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, message)
    }

    /// 413: the body or a payload over its limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }

    /// 429: the key has as many requests of a kind under way as its limit allows.
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, message)
    }

    /// 503: Redis unreachable, or a write its replicas did not confirm in time.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500: something the api cannot explain (an unexpected reply from Redis).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

/// A submit's enqueue that failed: as any failure, but a transient one after the command
/// may have been sent (a timeout, a connection dropped) leaves the outcome unknown, and
/// says so.
pub fn enqueue_failed(e: QueueError) -> ApiError {
    let unknown = match &e {
        QueueError::Redis(r) => {
            !r.is_connection_refusal() && e.is_transient() && {
                // (LOADING and the like are answers: the script did not run)
                r.is_io_error() || r.is_timeout() || r.is_connection_dropped()
            }
        }
        // (the primary has it; whether a failover keeps it is what was not confirmed)
        QueueError::NotConfirmed { .. } => true,
        _ => false,
    };
    let err = ApiError::from(e);
    if unknown {
        ApiError {
            message: format!(
                "{}; the task may have been enqueued: retry with the same id to be sure it exists once",
                err.message
            ),
            ..err
        }
        .outcome_unknown()
    } else {
        err
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        if let QueueError::NotConfirmed { .. } = e {
            // (said as it is: Redis answered, its replicas did not confirm in time; the
            // write was done on the primary, so whether it holds is unknown)
            let mut failed = ApiError::unavailable(e.to_string()).outcome_unknown();
            failed.outage = Some(e.cause());
            return failed;
        }
        if e.is_transient() {
            let mut failed = ApiError::unavailable(format!("redis unreachable: {e}"));
            failed.outage = Some(e.cause());
            return failed;
        }
        if e.is_read_only() {
            return ApiError::unavailable(format!(
                "redis refuses writes: the server is a replica (failing over?) ({e})"
            ));
        }
        if e.is_out_of_memory() {
            return ApiError::unavailable(format!(
                "redis refuses writes: it is at its maxmemory ({e})"
            ));
        }
        match e {
            QueueError::PayloadTooLarge { .. } => ApiError::too_large(e.to_string()),
            QueueError::Invalid(m) => ApiError::bad_request(m),
            QueueError::IntakeClosed { .. } | QueueError::IdTaken { .. } => {
                ApiError::conflict(e.to_string())
            }
            // (a queue waiting for `gaffer migrate`: the same request succeeds after it)
            QueueError::Layout { .. } => ApiError::unavailable(e.to_string()),
            other => ApiError::internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write its replicas did not confirm is a 503 that says so, not "redis
    /// unreachable", its outcome unknown (the primary did it), and a submit's says the
    /// task may be enqueued.
    #[test]
    fn a_write_not_confirmed_is_unavailable_with_the_limit_named() {
        let not_confirmed = || QueueError::NotConfirmed {
            acknowledged: 0,
            wanted: 1,
            timeout: std::time::Duration::from_secs(1),
        };
        let said = "write not confirmed: 0 of wait_replicas = 1 replicas acknowledged within 1s";
        let e = ApiError::from(not_confirmed());
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.message, said);
        assert_eq!(e.outage, Some(Cause::NotConfirmed));
        assert!(e.outcome_unknown, "{e:?}");
        let e = enqueue_failed(not_confirmed());
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.outcome_unknown, "{e:?}");
        assert!(
            e.message.starts_with(said) && e.message.contains("retry with the same id"),
            "{}",
            e.message
        );
    }
}
