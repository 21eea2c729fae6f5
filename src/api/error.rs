//! The API's refusals: a status and a message naming what was wrong and the limit.

use hyper::StatusCode;

use crate::queue_client::QueueError;

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
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            close: false,
        }
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

    /// 503: Redis unreachable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500: something the api cannot explain (an unexpected reply from Redis).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        if e.is_transient() {
            return ApiError::unavailable(format!("redis unreachable: {e}"));
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
            QueueError::IntakeClosed { .. } => ApiError::conflict(e.to_string()),
            other => ApiError::internal(other.to_string()),
        }
    }
}
