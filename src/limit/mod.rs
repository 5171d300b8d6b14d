//! Limits a slow or greedy client cannot get around: how long and how
//! slowly a request body may be read, and how many requests run at once.
//!
//! - [`ReadLimitLayer`]: the request body must arrive within a total time
//!   and at a minimum rate ([`ReadLimits`]); otherwise reading it fails with
//!   a typed [`ReadLimitError`], so a trickled body cannot hold a task and
//!   its buffer for ever.
//! - [`InFlightLimitLayer`]: at most `max` requests in flight, a stream
//!   counting until its body ends. Request `max + 1` is **shed at once**
//!   with the dialect's 503 error and a `retry-after` header, never queued:
//!   a queue without a bound is memory a client can fill, and a queue with
//!   one only moves the wait to where the client cannot see it.
//! - [`WriteStallLimit`]: an accepted connection whose writes fail once the
//!   client has taken no bytes for a timeout while there were bytes for it
//!   ([`WriteStalled`]), so a client that stops reading loses its
//!   connection, and with it its stream and its in-flight slot: hyper stops
//!   polling a response body once the socket is full, so no timer inside
//!   the body can do it.
//!
//! - [`RateLimitStore`]: requests and tokens per minute per client (GCRA:
//!   [`MemoryRateLimits`] on the `governor` crate, or shared on Redis),
//!   answered with a `retry-after`.
//!
//! Why not tower's `ConcurrencyLimit` + `LoadShed`: they release the slot
//! when the response *future* resolves, which for a stream is when its
//! head is sent, long before its last byte. Here the slot is held by the
//! response body.
//!
//! [`read_whole`] reads a request body within a size limit, a small one
//! without a copy: for a handler that reads the body before the stack does.
//!
//! Header-read timeouts and connection caps belong to the server that
//! accepts connections (hyper's `header_read_timeout` with a timer, and a
//! semaphore around accept); the gateway example shows both, answering the
//! connection over its cap with [`shed_response`].

mod body;
mod layer;
mod rate;
mod read;
mod service;
mod write_stall;

pub use body::{InFlightBody, ReadLimitBody, ReadLimitError};
pub use layer::{InFlightLimitLayer, ReadLimitLayer};
pub use rate::{
    MemoryRateLimits, PerMinute, RateDecision, RateFuture, RateLimitError, RateLimitStore,
    retry_after_seconds,
};
pub(crate) use read::Gathered;
pub use read::read_whole;
pub use service::{InFlightFuture, InFlightLimit, ReadLimit};
pub use write_stall::{WriteStallLimit, WriteStalled};

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::Full;

use crate::FailureClass;
use crate::dialect::{Dialect, ErrorReply};

/// How a request body must arrive (see [`ReadLimitLayer`]).
///
/// The minimum rate is cumulative: after the `grace` period, a body that has
/// sent `n` bytes must go on by `grace + n / rate` after it started (the
/// first time its reader waited for it). A client that sends its first
/// bytes fast and then one byte a minute is cut as soon as the average
/// falls below the rate.
///
/// Plain data; the default (and [`ReadLimits::new`]) sets no limit.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::limit::{ReadLimitLayer, ReadLimits};
///
/// // The whole body within 30 s; after 5 s, at least 1 KiB/s on average.
/// let layer = ReadLimitLayer::new(ReadLimits {
///     timeout: Some(Duration::from_secs(30)),
///     min_bytes_per_second: Some(1024),
///     grace: Duration::from_secs(5),
/// });
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadLimits {
    /// The whole body must be read within this long of the first time its
    /// reader waited for it (frames ready at once, such as a small body
    /// that came with the request's head, take no time); `None`: no total
    /// limit.
    pub timeout: Option<Duration>,
    /// After [`grace`](Self::grace), the body must average at least this
    /// many bytes per second; `None` (or zero): no rate check.
    pub min_bytes_per_second: Option<u64>,
    /// How long the body may take before the rate check starts.
    pub grace: Duration,
}

impl ReadLimits {
    /// No limits.
    pub fn new() -> Self {
        Self::default()
    }
}

/// The answer to a request shed by a limit: `503` (or what the dialect's
/// clients expect for overload, see `Dialect::error_status`), the dialect's error body
/// (class `overloaded`, code `overloaded`) and `retry-after` in whole
/// seconds (at least 1).
pub fn shed_response<D: Dialect>(dialect: &D, retry_after: Duration) -> Response<Full<Bytes>> {
    shed_answer(dialect, retry_after).map(Full::new)
}

/// [`shed_response`] with its body as bytes.
pub(crate) fn shed_answer<D: Dialect>(dialect: &D, retry_after: Duration) -> Response<Bytes> {
    let reply = ErrorReply::coded(
        FailureClass::Overloaded,
        "overloaded",
        "the gateway is at its limit of concurrent requests; retry later",
    );
    let mut response = dialect.error_response(StatusCode::SERVICE_UNAVAILABLE, &reply);
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}
