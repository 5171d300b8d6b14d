//! What kind of failure ([`FailureClass`]) and where it landed ([`Phase`]).

use std::fmt;

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
    /// The gateway is shutting down and its grace period is over: the
    /// stream is ended by the gateway, not by the provider or the client.
    Shutdown,
}

impl FailureClass {
    /// Every class, in declaration order (for tables, metrics registration
    /// and exhaustive tests).
    pub const ALL: [FailureClass; 16] = [
        Self::RateLimited,
        Self::QuotaExhausted,
        Self::Overloaded,
        Self::ServerError,
        Self::Timeout,
        Self::Connect,
        Self::Auth,
        Self::PermissionDenied,
        Self::ModelNotFound,
        Self::InvalidRequest,
        Self::ContextLengthExceeded,
        Self::ContentFiltered,
        Self::PayloadTooLarge,
        Self::InvalidResponse,
        Self::Cancelled,
        Self::Shutdown,
    ];

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
            Self::Shutdown => "shutdown",
        }
    }

    /// Whether the failure is about the client's request itself (the
    /// classes whose final stop reports the provider's own 4xx status).
    pub(crate) fn is_request_error(self) -> bool {
        matches!(
            self,
            Self::InvalidRequest
                | Self::ContextLengthExceeded
                | Self::ContentFiltered
                | Self::PayloadTooLarge
        )
    }

    /// A short, stable message a client may be shown for a failure of
    /// this class. Provider messages and transport errors carry account
    /// and project ids, proxy addresses and error chains: they stay in
    /// records and logs, and clients get this instead (the provider's own
    /// message reaches a client only for an error about its request).
    pub(crate) fn client_message(self) -> &'static str {
        match self {
            Self::RateLimited => "the provider is rate limiting requests; retry later",
            Self::QuotaExhausted => "the provider's quota for this gateway is exhausted",
            Self::Overloaded => "the provider is overloaded; retry later",
            Self::ServerError => "the provider failed to answer",
            Self::Timeout => "the provider did not answer in time",
            Self::Connect => "the provider could not be reached",
            Self::Auth => "the provider refused the gateway's credential",
            Self::PermissionDenied => "the provider refused access to this model",
            Self::ModelNotFound => "the provider does not know this model",
            Self::InvalidRequest => "the request is invalid",
            Self::ContextLengthExceeded => "the request does not fit the model's context window",
            Self::ContentFiltered => "the provider's content policy blocked the answer",
            Self::PayloadTooLarge => "the request is too large for the provider",
            Self::InvalidResponse => "the provider's answer was broken",
            Self::Cancelled => "the request was cancelled",
            Self::Shutdown => "the gateway is shutting down; retry the request",
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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

    /// Whether the request may have reached the provider (and so may have
    /// been processed, billed or rate-counted) in this phase.
    pub fn may_have_reached_provider(self) -> bool {
        !matches!(self, Self::BeforeSend)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
