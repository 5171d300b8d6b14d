//! The classification rules: from a status and a parsed error body to a
//! class.
//!
//! Checked in this order (first match wins), each step citing the row of the
//! provider reference's classification table it implements. Steps 1 to 7
//! are the providers' contracts (`contract` module, one file per provider
//! family); the rest is generic and lives here.
//!
//! 1. quota and billing, whatever the status (rows 2, 3a, 3b, 4, 5):
//!    OpenAI's codes, Anthropic's billing and spend limits, any 402, a
//!    Gemini per-day quota;
//! 2. OpenAI's "Request too large ... (TPM)" 429 (row 1a);
//! 3. content filters: Azure, OpenRouter moderation (rows 11a, 14);
//! 4. context length by code: OpenAI, OpenRouter (row 13);
//! 5. specific provider codes (OpenAI and OpenAI-compatible servers), our
//!    own class names, OpenRouter `metadata.error_type`, Gemini `ErrorInfo`
//!    reasons;
//! 6. specific error types (Anthropic, vLLM, Ollama);
//! 7. Gemini `status` strings (rows 5a, 6a, 7, 8, 16, 16a);
//! 8. the HTTP status (or, in-band, the status the error's `code` names);
//! 9. in-band with no status: the generic type decides between
//!    `InvalidRequest` and `ServerError`;
//! 10. an `InvalidRequest` whose message names the context window becomes
//!     `ContextLengthExceeded` (row 13, Anthropic and vLLM wording).
//!
//! Generic types and codes (`invalid_request_error`, `server_error`,
//! `api_error`) decide nothing on their own: OpenAI sends
//! `invalid_request_error` with 401 and 404 too, and DeepSeek's "Server
//! Overloaded" 503 says `server_error`, so the status speaks first. Only
//! in-band, with no status, do they pick between `InvalidRequest` and
//! `ServerError`.

use super::body::ErrorBody;
use super::contract;
use crate::FailureClass::{self, *};

/// Message fragments (lowercase) that name the context window (row 13):
/// OpenAI's and vLLM's "maximum context length", Anthropic's "prompt is too
/// long", and other servers' wordings.
const CONTEXT_PHRASES: &[&str] = &[
    "maximum context length",
    "context length exceeded",
    "context_length_exceeded",
    "prompt is too long",
    "context window",
    "exceeds the maximum number of tokens",
];

/// The class of an error response or event.
///
/// `status` is the HTTP status of the response head, `None` in-band (then
/// the status the body's numeric `code` names is used). `has_retry_after`
/// says whether the head carried a `retry-after`/`retry-after-ms` header.
pub(crate) fn class_of(
    status: Option<u16>,
    body: &ErrorBody,
    has_retry_after: bool,
) -> FailureClass {
    let status = status.or_else(|| body.named_status());
    let class = contract::class_by_contract(status, body, has_retry_after)
        .or_else(|| status.map(status_class))
        .unwrap_or_else(|| in_band_fallback(body));
    if class == InvalidRequest && message_names_context(body) {
        ContextLengthExceeded
    } else {
        class
    }
}

/// The class an HTTP status means on its own.
pub(crate) fn status_class(status: u16) -> FailureClass {
    match status {
        400 | 422 => InvalidRequest,
        401 => Auth,
        402 => QuotaExhausted,
        403 => PermissionDenied,
        404 | 410 => ModelNotFound,
        408 => Timeout,
        409 => ServerError,
        413 => PayloadTooLarge,
        429 => RateLimited,
        // Groq flex tier "capacity_exceeded".
        498 => Overloaded,
        // "Client closed request" (nginx, Groq, gRPC CANCELLED).
        499 => Cancelled,
        405..=499 => InvalidRequest,
        503 | 529 => Overloaded,
        // 504, and Cloudflare's 522 (connection timed out) and 524 (a timeout occurred).
        504 | 522 | 524 => Timeout,
        500..=599 => ServerError,
        // 1xx, 2xx, 3xx or nonsense handed in as a failure.
        _ => InvalidResponse,
    }
}

/// An in-band error with no status, code or known type: the provider failed
/// on its side, unless it said the request was invalid
/// (`invalid_request_error` of OpenAI, Anthropic and Ollama, vLLM's
/// `BadRequestError`).
fn in_band_fallback(b: &ErrorBody) -> FailureClass {
    let generic_request = [
        "invalid_request_error",
        "badrequesterror",
        "invalid_request",
    ];
    match &b.kind {
        Some(kind) if generic_request.iter().any(|g| kind.eq_ignore_ascii_case(g)) => {
            InvalidRequest
        }
        _ => ServerError,
    }
}

/// Whether the message names the context window (`CONTEXT_PHRASES`).
fn message_names_context(b: &ErrorBody) -> bool {
    let Some(message) = &b.message else {
        return false;
    };
    let lower = message.to_ascii_lowercase();
    CONTEXT_PHRASES.iter().any(|p| lower.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_without_a_specific_meaning() {
        assert_eq!(status_class(418), InvalidRequest);
        assert_eq!(status_class(302), InvalidResponse);
        assert_eq!(status_class(599), ServerError);
    }
}
