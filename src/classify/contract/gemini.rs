//! Google Gemini's error-body contract: the `google.rpc.Status` shape,
//! `{"error": {"code", "message", "status", "details": [...]}}`, with the
//! HTTP status as `code` and the canonical code name as `status`.
//!
//! Follows Google's API error model (AIP-193, "Errors") and the detail
//! messages of `google/rpc/error_details.proto` (`ErrorInfo.reason`,
//! `QuotaFailure.violations[].quotaId`, `RetryInfo.retryDelay`), the Gemini
//! API's troubleshooting guide, gemini-cli's `googleQuotaErrors.ts` (a
//! per-day quota id is not retried) and python-genai's `errors.py` (the
//! OpenAI-compatible endpoint's errors come wrapped in a JSON array). Stream
//! chunks are `GenerateContentResponse`s whose `finishReason` or
//! `promptFeedback.blockReason` can report the content filter.
//!
//! Rows of the provider reference's classification table: 5, 5a, 6a, 7, 8,
//! 10, 11, 12, 16, 16a, 19, 20, 24.

use serde_json::{Map, Value};

use super::{first_object, str_field};
use crate::FailureClass::{self, *};
use crate::classify::body::ErrorBody;
use crate::classify::retry_after::parse_go_duration;

/// Finish reasons that mean the content filter stopped the answer.
const FILTER_REASONS: &[&str] = &[
    "SAFETY",
    "RECITATION",
    "BLOCKLIST",
    "PROHIBITED_CONTENT",
    "SPII",
    "IMAGE_SAFETY",
    "IMAGE_PROHIBITED_CONTENT",
    "IMAGE_RECITATION",
];

/// The error inside an array, as the OpenAI-compatible endpoint sends it:
/// the first object (python-genai unwraps it the same way).
pub(super) fn wrapped_error(items: &[Value]) -> Option<&Value> {
    items.iter().find(|v| v.is_object())
}

/// Reads `error.status` and the `google.rpc` messages in `error.details`
/// (an array; Anthropic's `details` is an object).
pub(super) fn read_error(err: &Map<String, Value>, out: &mut ErrorBody) {
    out.status = str_field(err, "status");
    let Some(details) = err.get("details").and_then(Value::as_array) else {
        return;
    };
    for detail in details.iter().filter_map(Value::as_object) {
        read_detail(detail, out);
    }
}

/// Reads one `google.rpc` detail message, by its `@type`.
fn read_detail(detail: &Map<String, Value>, out: &mut ErrorBody) {
    let ty = detail.get("@type").and_then(Value::as_str).unwrap_or("");
    if ty.ends_with("google.rpc.RetryInfo") {
        out.retry_delay = detail
            .get("retryDelay")
            .and_then(Value::as_str)
            .and_then(parse_go_duration);
    } else if ty.ends_with("google.rpc.QuotaFailure") {
        let violations = detail.get("violations").and_then(Value::as_array);
        for v in violations
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
        {
            if let Some(id) = str_field(v, "quotaId") {
                out.quota_ids.push(id);
            }
        }
    } else if ty.ends_with("google.rpc.ErrorInfo")
        && let Some(reason) = str_field(detail, "reason")
    {
        out.reasons.push(reason);
    }
}

/// A content-filter finish on a chunk: `candidates[0].finishReason` is one
/// of the filter's, or `promptFeedback.blockReason` is set.
pub(super) fn filter_finish(obj: &Map<String, Value>) -> Option<String> {
    if let Some(reason) = first_object(obj, "candidates").and_then(|c| str_field(c, "finishReason"))
        && FILTER_REASONS.contains(&reason.as_str())
    {
        return Some(reason);
    }
    obj.get("promptFeedback")
        .and_then(Value::as_object)
        .and_then(|f| str_field(f, "blockReason"))
}

/// Row 5: a `QuotaFailure` names a per-day quota, which no wait within the
/// turn restores.
pub(super) fn daily_quota(b: &ErrorBody) -> bool {
    b.quota_ids
        .iter()
        .any(|id| id.contains("PerDay") || id.contains("Daily"))
}

/// Row 10: an `ErrorInfo` reason says the API key is invalid or expired.
pub(super) fn class_of_reasons(b: &ErrorBody) -> Option<FailureClass> {
    b.reasons
        .iter()
        .any(|r| r == "API_KEY_INVALID" || r == "API_KEY_EXPIRED")
        .then_some(Auth)
}

/// The class a canonical `status` name means (exact case).
pub(super) fn class_of_status(b: &ErrorBody) -> Option<FailureClass> {
    match b.status.as_deref()? {
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
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::classify::body::parse_error_body;

    #[test]
    fn gemini_details() {
        let b = parse_error_body(br#"{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"53s"}]}}"#);
        assert_eq!(b.status.as_deref(), Some("RESOURCE_EXHAUSTED"));
        assert_eq!(
            b.quota_ids,
            ["GenerateRequestsPerDayPerProjectPerModel-FreeTier"]
        );
        assert_eq!(b.retry_delay, Some(Duration::from_secs(53)));
    }
}
