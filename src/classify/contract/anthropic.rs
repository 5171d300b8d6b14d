//! Anthropic's error-body contract: `{"type": "error", "error": {"type",
//! "message"}, "request_id"}` on any status, and the same object as the
//! `data` of an `event: error` mid-stream.
//!
//! Follows Anthropic's API documentation, "Errors" (docs.claude.com), and
//! the error types of anthropic-sdk-python (`ErrorType`:
//! `invalid_request_error`, `authentication_error`, `permission_error`,
//! `not_found_error`, `request_too_large`, `rate_limit_error`,
//! `timeout_error`, `overloaded_error`, `api_error`, `billing_error`; the
//! docs say more may come). `error.details.error_code` and the "API usage
//! limits" wording come from 3rd-party summaries of the docs.
//!
//! Rows of the provider reference's classification table: 3, 3a, 3b, 4, 6,
//! 8, 10, 11, 12, 13 (by message, in `rules`), 15, 22.

use serde_json::{Map, Value};

use super::{field_is, str_field};
use crate::FailureClass::{self, *};
use crate::classify::body::ErrorBody;

/// Reads `error.details.error_code` (an object; Gemini's `details` is an
/// array).
pub(super) fn read_error(err: &Map<String, Value>, out: &mut ErrorBody) {
    if let Some(details) = err.get("details").and_then(Value::as_object) {
        out.detail_code = str_field(details, "error_code");
    }
}

/// Rows 3a, 3b, 4: billing, a spend limit reached (a 429 without
/// `retry-after`), or the account's usage limits reached.
pub(super) fn quota_exhausted(b: &ErrorBody, has_retry_after: bool) -> bool {
    field_is(b.kind.as_ref(), "billing_error")
        || (field_is(b.detail_code.as_ref(), "enforced_spend_limit_reached") && !has_retry_after)
        || b.message
            .as_deref()
            .unwrap_or("")
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("you have reached your specified api usage limits")
}

/// The class a specific `type` means (ASCII case ignored). Ollama's
/// OpenAI-compatible `not_found_error` reads the same.
pub(super) fn class_of_type(b: &ErrorBody) -> Option<FailureClass> {
    match b.kind.as_ref()?.to_ascii_lowercase().as_str() {
        "rate_limit_error" => Some(RateLimited),
        "overloaded_error" => Some(Overloaded),
        "timeout_error" => Some(Timeout),
        "authentication_error" => Some(Auth),
        "permission_error" => Some(PermissionDenied),
        "not_found_error" => Some(ModelNotFound),
        "request_too_large" => Some(PayloadTooLarge),
        _ => None,
    }
}
