//! The shared failure vocabulary: class, phase, recovery, retry hint and the
//! classification that carries them.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

use super::sanitize::{sanitize_code, sanitize_message};

use crate::{Decision, FailureClass, Phase};

impl FailureClass {
    /// The default recovery for this class: the data a failover policy reads
    /// when no override applies.
    ///
    /// | class | recovery | why |
    /// |---|---|---|
    /// | `InvalidRequest`, `ContentFiltered`, `Cancelled` | `Stop` | the client's request (or the client) is the problem; no provider does better |
    /// | `Shutdown` | `Stop` | the gateway itself is going away |
    /// | `RateLimited`, `Overloaded`, `ServerError`, `Timeout`, `Connect` | `RetrySame` | transient; the failover policy decides when waiting costs too much and reroutes |
    /// | `QuotaExhausted`, `Auth`, `PermissionDenied`, `ModelNotFound` | `Reroute` | about the gateway's account with that provider, not the client's request |
    /// | `PayloadTooLarge` | `Reroute` | the limit is the provider's (or tier's, e.g. OpenAI's TPM 429) |
    /// | `InvalidResponse` | `Reroute` | the provider broke its own contract |
    /// | `ContextLengthExceeded` | `Reroute` | **only toward a larger context window**: the failover layer filters candidates by window and stops when none is larger |
    ///
    /// A classification in [`Phase::Committed`] can never move: whatever the
    /// recovery says, the failover layer ends the committed stream instead.
    pub fn default_recovery(self) -> Decision {
        match self {
            Self::InvalidRequest | Self::ContentFiltered | Self::Cancelled | Self::Shutdown => {
                Decision::Stop
            }
            Self::RateLimited
            | Self::Overloaded
            | Self::ServerError
            | Self::Timeout
            | Self::Connect => Decision::RetrySame,
            Self::QuotaExhausted
            | Self::Auth
            | Self::PermissionDenied
            | Self::ModelNotFound
            | Self::PayloadTooLarge
            | Self::InvalidResponse
            | Self::ContextLengthExceeded => Decision::Reroute,
        }
    }
}

/// How a classification was reached when not from a complete provider
/// answer: a typed reason, read by decisions and printed in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Note {
    /// The gateway's own head, first-output or idle timeout.
    GatewayTimeout,
    /// The turn's deadline passed.
    TurnDeadline,
    /// The client went away or the turn was cancelled.
    Cancelled,
    /// The stream ended without its terminator.
    TruncatedStream,
    /// An event that does not parse as the dialect expects.
    MalformedChunk,
    /// An event, line or held-back preamble over its cap.
    Oversize,
    /// A transport error with no more specific reading.
    TransportError,
    /// An in-band error event whose payload does not parse.
    UnparsedErrorEvent,
    /// An error event that carries no error.
    NoErrorInEvent,
    /// A provider's error in a success (200) body.
    ErrorOn200,
    /// The upstream URI could not be built.
    InvalidUpstreamUri,
    /// The error body was over the read cap.
    ErrorBodyTooLarge,
    /// The error body did not arrive in time.
    ErrorBodyTimeout,
    /// The error body failed while being read.
    ErrorBodyUnreadable,
    /// The error body was empty.
    EmptyErrorBody,
    /// The error body was an HTML page.
    HtmlErrorBody,
    /// The error body was broken JSON.
    InvalidJsonErrorBody,
    /// The error body was plain text.
    TextErrorBody,
    /// The error body was JSON of no known shape.
    UnknownErrorShape,
    /// A whole answer that is not JSON.
    InvalidJson,
    /// A whole answer that is JSON of the wrong shape.
    UnexpectedJson,
    /// A whole answer without the answer in it.
    NoAnswer,
    /// The connection could not be made.
    ConnectFailed,
    /// The connection was lost.
    ConnectionLost,
    /// A transport timeout.
    TransportTimeout,
    /// TLS: the upstream's certificate is signed by an unknown CA.
    TlsUnknownCa,
    /// TLS: the certificate does not match the host name.
    TlsNameMismatch,
    /// TLS: the certificate is expired or not yet valid.
    TlsCertificateExpired,
    /// TLS: the certificate is invalid or missing.
    TlsBadCertificate,
    /// TLS: nothing in common to negotiate.
    TlsHandshakeFailed,
    /// TLS: the upstream requires a client certificate.
    TlsClientCertificateRequired,
    /// TLS: the upstream rejected the client certificate.
    TlsClientCertificateRejected,
    /// TLS: the upstream refused the handshake.
    TlsHandshakeRefused,
    /// Egress proxy: cannot connect to it.
    ProxyUnreachable,
    /// Egress proxy: it refused the tunnel.
    ProxyRefused,
    /// Egress proxy: it wants credentials.
    ProxyAuthRequired,
    /// Egress proxy: not an http:// CONNECT proxy.
    ProxyUnsupported,
    /// Egress proxy: the tunnel broke off.
    ProxyFailed,
    /// The provider says the quota is one model's (Gemini quota ids naming
    /// `PerModel`), not the whole credential's.
    PerModelQuota,
}

impl Note {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GatewayTimeout => "gateway_timeout",
            Self::TurnDeadline => "turn_deadline",
            Self::Cancelled => "cancelled",
            Self::TruncatedStream => "truncated_stream",
            Self::MalformedChunk => "malformed_chunk",
            Self::Oversize => "oversize",
            Self::TransportError => "transport_error",
            Self::UnparsedErrorEvent => "unparsed_error_event",
            Self::NoErrorInEvent => "no_error_in_event",
            Self::ErrorOn200 => "error_on_200",
            Self::InvalidUpstreamUri => "invalid_upstream_uri",
            Self::ErrorBodyTooLarge => "error_body_too_large",
            Self::ErrorBodyTimeout => "error_body_timeout",
            Self::ErrorBodyUnreadable => "error_body_unreadable",
            Self::EmptyErrorBody => "empty_error_body",
            Self::HtmlErrorBody => "html_error_body",
            Self::InvalidJsonErrorBody => "invalid_json_error_body",
            Self::TextErrorBody => "text_error_body",
            Self::UnknownErrorShape => "unknown_error_shape",
            Self::InvalidJson => "invalid_json",
            Self::UnexpectedJson => "unexpected_json",
            Self::NoAnswer => "no_answer",
            Self::ConnectFailed => "connect_failed",
            Self::ConnectionLost => "connection_lost",
            Self::TransportTimeout => "transport_timeout",
            Self::TlsUnknownCa => "tls_unknown_ca",
            Self::TlsNameMismatch => "tls_name_mismatch",
            Self::TlsCertificateExpired => "tls_certificate_expired",
            Self::TlsBadCertificate => "tls_bad_certificate",
            Self::TlsHandshakeFailed => "tls_handshake_failed",
            Self::TlsClientCertificateRequired => "tls_client_certificate_required",
            Self::TlsClientCertificateRejected => "tls_client_certificate_rejected",
            Self::TlsHandshakeRefused => "tls_handshake_refused",
            Self::ProxyUnreachable => "proxy_unreachable",
            Self::ProxyRefused => "proxy_refused",
            Self::ProxyAuthRequired => "proxy_auth_required",
            Self::ProxyUnsupported => "proxy_unsupported",
            Self::ProxyFailed => "proxy_failed",
            Self::PerModelQuota => "per_model_quota",
        }
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Retry hints a provider gave with a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RetryHint {
    /// How long the provider asked us to wait (`retry-after-ms`,
    /// `retry-after`, Gemini `RetryInfo.retryDelay`).
    pub after: Option<Duration>,
    /// `x-should-retry`, when present.
    pub should_retry: Option<bool>,
}

/// One classified failure.
///
/// Build one with [`Classification::new`] and the `with_*` setters, or with
/// the shortcuts for failures the gateway observes itself
/// ([`timeout`](Classification::timeout), [`cancelled`](Classification::cancelled),
/// [`truncated`](Classification::truncated), ...). The setters sanitize what
/// they are given, so `message` never carries a credential.
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
    pub recovery: Decision,
    /// The provider's `param` (which request field was wrong), when it named one.
    pub param: Option<String>,
    /// A fixed machine-readable note on how this classification was reached
    /// when it was not from a complete provider answer, e.g.
    /// `"error_body_too_large"`, `"error_body_timeout"`, `"truncated_stream"`.
    pub note: Option<Note>,
    /// The provider's rate-limit headers on the failed response (see
    /// [`RateLimitHeaders`](super::RateLimitHeaders)).
    pub rate_limits: super::RateLimitHeaders,
}

impl Classification {
    /// A classification with the class's default recovery and no details.
    pub fn new(class: FailureClass, phase: Phase) -> Self {
        Self {
            class,
            phase,
            status: None,
            provider_code: None,
            retry: RetryHint::default(),
            message: String::new(),
            recovery: class.default_recovery(),
            param: None,
            note: None,
            rate_limits: super::RateLimitHeaders::default(),
        }
    }

    /// Our own timeout: `what` names what we waited for
    /// (`"response head"`, `"first byte"`, `"next chunk"`, ...).
    pub fn timeout(phase: Phase, what: &str) -> Self {
        Self::new(FailureClass::Timeout, phase)
            .with_message(format!("timed out waiting for {what}"))
            .with_note(Note::GatewayTimeout)
    }

    /// The client went away or the turn was cancelled.
    pub fn cancelled(phase: Phase) -> Self {
        Self::new(FailureClass::Cancelled, phase)
            .with_message("the request was cancelled")
            .with_note(Note::Cancelled)
    }

    /// The stream ended without its terminator (`[DONE]`, `message_stop`):
    /// never a success.
    pub fn truncated(phase: Phase) -> Self {
        Self::new(FailureClass::InvalidResponse, phase)
            .with_message("the upstream stream ended without its terminator")
            .with_note(Note::TruncatedStream)
    }

    /// A chunk or event that does not parse as what the dialect expects.
    pub(crate) fn malformed_chunk(phase: Phase, what: &str) -> Self {
        Self::new(FailureClass::InvalidResponse, phase)
            .with_message(format!("malformed upstream chunk: {what}"))
            .with_note(Note::MalformedChunk)
    }

    /// An upstream event, line or held-back preamble larger than its cap.
    pub(crate) fn oversize(phase: Phase, what: &str) -> Self {
        Self::new(FailureClass::InvalidResponse, phase)
            .with_message(format!("upstream {what} exceeded its size cap"))
            .with_note(Note::Oversize)
    }

    /// The model's answer was blocked by a content filter (a normal
    /// completion by `finish_reason`, a stop for failover).
    pub(crate) fn content_filtered(phase: Phase, reason: &str) -> Self {
        Self::new(FailureClass::ContentFiltered, phase)
            .with_provider_code(reason)
            .with_message(format!(
                "the provider's content filter blocked the answer ({reason})"
            ))
    }

    /// Sets the phase.
    pub fn with_phase(mut self, phase: Phase) -> Self {
        self.phase = phase;
        self
    }

    /// Sets the class and resets the recovery to the new class's default.
    pub(crate) fn with_class(mut self, class: FailureClass) -> Self {
        self.class = class;
        self.recovery = class.default_recovery();
        self
    }

    /// Sets the HTTP status.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets the provider's code (sanitized and bounded).
    pub fn with_provider_code(mut self, code: &str) -> Self {
        self.provider_code = sanitize_code(code);
        self
    }

    /// Sets the retry hints.
    pub(crate) fn with_retry(mut self, retry: RetryHint) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the message, sanitized and bounded (see the [module docs](super)).
    pub fn with_message(mut self, message: impl AsRef<str>) -> Self {
        self.message = sanitize_message(message.as_ref());
        self
    }

    /// Sets the recovery.
    pub(crate) fn with_recovery(mut self, recovery: Decision) -> Self {
        self.recovery = recovery;
        self
    }

    /// Sets the note.
    pub fn with_note(mut self, note: Note) -> Self {
        self.note = Some(note);
        self
    }
}

impl fmt::Display for Classification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.class, self.phase)?;
        if let Some(status) = self.status {
            write!(f, " (HTTP {})", status.as_u16())?;
        }
        if let Some(code) = &self.provider_code {
            write!(f, " [{code}]")?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl crate::DeadlineExceeded {
    /// This failure as a [`Classification`]: class `timeout`, this phase,
    /// provider code `turn_deadline_exceeded`, recovery `Stop`.
    pub fn classification(&self) -> Classification {
        Classification::new(FailureClass::Timeout, self.phase)
            .with_provider_code("turn_deadline_exceeded")
            .with_message(self.to_string())
            .with_recovery(Decision::Stop)
            .with_note(Note::TurnDeadline)
    }
}
