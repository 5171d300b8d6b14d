//! Failure classification from the providers' own contracts.
//!
//! Every failure of an upstream call gets a [`FailureClass`], the [`Phase`] it
//! happened in, and a default [`Recovery`] the failover policy reads.

use std::time::Duration;

use http::StatusCode;

/// What kind of failure an upstream call had, named by the provider contract
/// that documents it rather than by a catch-all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureClass {
    /// A short-term rate limit: wait and retry.
    RateLimited,
    /// Quota, credit or spend limit exhausted: retrying that provider will not help.
    QuotaExhausted,
    /// The provider is overloaded (529, 503, capacity exceeded).
    Overloaded,
    /// A server-side error (500, 502, 409 lock timeouts).
    ServerError,
    /// A timeout, the provider's (408, 504) or ours.
    Timeout,
    /// Connection could not be made or was reset before the response head.
    Connect,
    /// The provider rejected the gateway's credential.
    Auth,
    /// The provider refused access (region, tier, permissions).
    PermissionDenied,
    /// The upstream model does not exist for this provider.
    ModelNotFound,
    /// The client's request is invalid; no provider will accept it.
    InvalidRequest,
    /// The prompt does not fit the model's context window.
    ContextLengthExceeded,
    /// The provider's content policy blocked the request or the answer.
    ContentFiltered,
    /// The request is larger than this provider (or tier) accepts.
    PayloadTooLarge,
    /// The provider answered something that is not what it claims to be.
    InvalidResponse,
    /// The client went away or the turn was cancelled.
    Cancelled,
}

impl FailureClass {
    /// A stable snake_case name, used in logs, metrics and error codes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::QuotaExhausted => "quota_exhausted",
            Self::Overloaded => "overloaded",
            Self::ServerError => "server_error",
            Self::Timeout => "timeout",
            Self::Connect => "connect",
            Self::Auth => "auth",
            Self::PermissionDenied => "permission_denied",
            Self::ModelNotFound => "model_not_found",
            Self::InvalidRequest => "invalid_request",
            Self::ContextLengthExceeded => "context_length_exceeded",
            Self::ContentFiltered => "content_filtered",
            Self::PayloadTooLarge => "payload_too_large",
            Self::InvalidResponse => "invalid_response",
            Self::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where in an upstream call a failure happened. Failover is legal in every
/// phase but [`Phase::Committed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Before the request could have reached the provider (DNS, connect, TLS).
    BeforeSend,
    /// After the request was sent, up to and including the response head.
    Head,
    /// The response is streaming but no model output has reached the client.
    Preamble,
    /// Model output has reached the client: the stream is committed.
    Committed,
}

impl Phase {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BeforeSend => "before_send",
            Self::Head => "head",
            Self::Preamble => "preamble",
            Self::Committed => "committed",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a failover policy should do about a failure, absent overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Recovery {
    /// Try the same target again (after the retry hint or a backoff).
    RetrySame,
    /// Move to another eligible target.
    Reroute,
    /// Return the failure to the client; no other provider would do better.
    Stop,
}

/// Retry hints a provider gave with a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryHint {
    /// How long the provider asked us to wait (`retry-after-ms`,
    /// `retry-after`, Gemini `RetryInfo.retryDelay`).
    pub after: Option<Duration>,
    /// `x-should-retry`, when present.
    pub should_retry: Option<bool>,
}

/// One classified failure.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Classification {
    /// The failure class.
    pub class: FailureClass,
    /// Where the failure happened.
    pub phase: Phase,
    /// The HTTP status, when there was a response head.
    pub status: Option<StatusCode>,
    /// The provider's own error code or type string.
    pub provider_code: Option<String>,
    /// Retry hints from headers or body.
    pub retry: RetryHint,
    /// A bounded, sanitized message (never carries a credential).
    pub message: String,
    /// The default recovery for this failure.
    pub recovery: Recovery,
}
