//! The contract rules: from a status and a parsed error body to a class.
//!
//! Checked in this order (first match wins), each step citing the row of the
//! provider reference's classification table it implements:
//!
//! 1. quota and billing, whatever the status (rows 2, 3a, 3b, 4, 5);
//! 2. OpenAI's "Request too large ... (TPM)" 429 (row 1a);
//! 3. content filters (rows 11a, 14);
//! 4. context length by code (row 13);
//! 5. specific provider codes, OpenRouter `metadata.error_type`, Gemini
//!    `ErrorInfo` reasons;
//! 6. specific error types (Anthropic, vLLM, Ollama);
//! 7. Gemini `status` strings (rows 5a, 6a, 7, 8, 16, 16a);
//! 8. the HTTP status (or, in-band, the status the error's `code` names);
//! 9. an `InvalidRequest` whose message names the context window becomes
//!    `ContextLengthExceeded` (row 13, Anthropic and vLLM wording).
//!
//! Generic types and codes (`invalid_request_error`, `server_error`,
//! `api_error`) decide nothing on their own: OpenAI sends
//! `invalid_request_error` with 401 and 404 too, and DeepSeek's "Server
//! Overloaded" 503 says `server_error`, so the status speaks first. Only
//! in-band, with no status, do they pick between `InvalidRequest` and
//! `ServerError`.

use super::body::ErrorBody;
use crate::FailureClass::{self, *};

/// OpenAI codes meaning "retrying does not restore access" (row 2).
const QUOTA_CODES: &[&str] = &[
    "insufficient_quota",
    "credit_balance_exhausted",
    "organization_spend_limit_exceeded",
    "project_spend_limit_exceeded",
    "organization_usage_limit_exceeded",
];

/// Message fragments (lowercase) that name the context window (row 13).
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
    let class = contract_class(status, body, has_retry_after)
        .or_else(|| status.map(status_class))
        .unwrap_or_else(|| in_band_fallback(body));
    if class == InvalidRequest && message_names_context(body) {
        ContextLengthExceeded
    } else {
        class
    }
}

fn eq(a: Option<&String>, b: &str) -> bool {
    a.is_some_and(|a| a.eq_ignore_ascii_case(b))
}

fn contract_class(
    status: Option<u16>,
    b: &ErrorBody,
    has_retry_after: bool,
) -> Option<FailureClass> {
    let code = b.code.as_ref();
    let kind = b.kind.as_ref();
    let message = b.message.as_deref().unwrap_or("");

    // 1. Quota and billing: the same 429 must not read as a rate limit.
    if eq(kind, "insufficient_quota")
        || QUOTA_CODES.iter().any(|q| eq(code, q))
        || eq(kind, "billing_error")
        || (eq(b.detail_code.as_ref(), "enforced_spend_limit_reached") && !has_retry_after)
        || message
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("you have reached your specified api usage limits")
        || status == Some(402)
        || b.quota_ids
            .iter()
            .any(|id| id.contains("PerDay") || id.contains("Daily"))
    {
        return Some(QuotaExhausted);
    }

    // 2. "Request too large for gpt-4o ... on tokens per min (TPM): Limit N,
    //    Requested M": no retry on this tier can succeed.
    if (status == Some(429) || eq(code, "rate_limit_exceeded")) && tpm_request_too_large(message) {
        return Some(PayloadTooLarge);
    }

    // 3. Content filters: Azure, OpenRouter moderation.
    if eq(code, "content_filter")
        || eq(b.inner_code.as_ref(), "ResponsibleAIPolicyViolation")
        || b.moderation
    {
        return Some(ContentFiltered);
    }

    // 4. Context length by code.
    if eq(code, "context_length_exceeded")
        || eq(b.metadata_error_type.as_ref(), "context_length_exceeded")
    {
        return Some(ContextLengthExceeded);
    }

    // 5. Specific codes.
    if let Some(code) = code {
        let class = match code.to_ascii_lowercase().as_str() {
            "rate_limit_exceeded" => Some(RateLimited),
            "invalid_api_key" | "invalid_authentication" => Some(Auth),
            "model_not_found" => Some(ModelNotFound),
            "server_is_overloaded" | "slow_down" | "capacity_exceeded" => Some(Overloaded),
            "unsupported_country_region_territory" => Some(PermissionDenied),
            "request_too_large" => Some(PayloadTooLarge),
            _ => None,
        };
        if class.is_some() {
            return class;
        }
        // Our own class names, as a gateway's terminal event carries them:
        // an inspector that re-reads it keeps the class.
        if let Some(class) = FailureClass::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(code))
        {
            return Some(class);
        }
    }
    if eq(b.metadata_error_type.as_ref(), "provider_overloaded") {
        return Some(Overloaded);
    }
    if b.reasons
        .iter()
        .any(|r| r == "API_KEY_INVALID" || r == "API_KEY_EXPIRED")
    {
        return Some(Auth);
    }

    // 6. Specific types.
    if let Some(kind) = kind {
        let class = match kind.to_ascii_lowercase().as_str() {
            "rate_limit_error" => Some(RateLimited),
            "overloaded_error" => Some(Overloaded),
            "timeout_error" => Some(Timeout),
            "authentication_error" => Some(Auth),
            "permission_error" => Some(PermissionDenied),
            "not_found_error" | "notfounderror" => Some(ModelNotFound),
            "request_too_large" => Some(PayloadTooLarge),
            _ => None,
        };
        if class.is_some() {
            return class;
        }
    }

    // 7. Gemini status strings.
    if let Some(gstatus) = &b.status {
        let class = match gstatus.as_str() {
            "RESOURCE_EXHAUSTED" => Some(RateLimited),
            "UNAVAILABLE" => Some(Overloaded),
            "INTERNAL" | "UNKNOWN" | "ABORTED" | "DATA_LOSS" => Some(ServerError),
            "DEADLINE_EXCEEDED" => Some(Timeout),
            "UNAUTHENTICATED" => Some(Auth),
            "PERMISSION_DENIED" | "FAILED_PRECONDITION" => Some(PermissionDenied),
            "NOT_FOUND" => Some(ModelNotFound),
            "INVALID_ARGUMENT" | "OUT_OF_RANGE" => Some(InvalidRequest),
            "CANCELLED" => Some(Cancelled),
            _ => None,
        };
        if class.is_some() {
            return class;
        }
    }
    None
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
/// on its side, unless it said the request was invalid.
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

fn message_names_context(b: &ErrorBody) -> bool {
    let Some(message) = &b.message else {
        return false;
    };
    let lower = message.to_ascii_lowercase();
    CONTEXT_PHRASES.iter().any(|p| lower.contains(p))
}

/// Row 1a: "Request too large for <model> ... on tokens per min (TPM):
/// Limit N, Requested M" with M > N. When the numbers cannot be read the
/// wording alone decides.
fn tpm_request_too_large(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    if !lower.trim_start().starts_with("request too large")
        || !(lower.contains("(tpm)") || lower.contains("tokens per min"))
    {
        return false;
    }
    match (
        number_after(&lower, "limit "),
        number_after(&lower, "requested "),
    ) {
        (Some(limit), Some(requested)) => requested > limit,
        _ => true,
    }
}

fn number_after(text: &str, label: &str) -> Option<u64> {
    let at = text.find(label)? + label.len();
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '_')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tpm_rule_needs_requested_over_limit() {
        assert!(tpm_request_too_large(
            "Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 50000."
        ));
        assert!(!tpm_request_too_large(
            "Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 20000."
        ));
        assert!(!tpm_request_too_large(
            "Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 199434, Requested 2299."
        ));
    }

    #[test]
    fn statuses_without_a_specific_meaning() {
        assert_eq!(status_class(418), InvalidRequest);
        assert_eq!(status_class(302), InvalidResponse);
        assert_eq!(status_class(599), ServerError);
    }
}
