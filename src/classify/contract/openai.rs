//! OpenAI's error-body contract, and the OpenAI-compatible servers that
//! reuse its shape and codes (Groq, DeepSeek, Mistral, Together, ...).
//!
//! Follows OpenAI's API reference ("Error codes" guide), the OpenAI help
//! centre articles on quota and billing errors ("Retrying a billing,
//! spending, or quota error does not restore access"), and openai-python's
//! error handling; Groq's "Flex processing" documentation for
//! `capacity_exceeded`. The shape is `{"error": {"message", "type",
//! "param", "code"}}`, where servers that copy it send `code` as a string,
//! a number (the HTTP status) or null, so `code` is read tolerantly.
//!
//! Rows of the provider reference's classification table: 1, 1a, 2, 6a,
//! 10, 11, 12, 13, 15 (Groq), 24 (`finish_reason`).

use serde_json::{Map, Value};

use super::{field_is, first_object, str_field};
use crate::FailureClass::{self, *};
use crate::classify::body::ErrorBody;

/// Codes meaning "retrying does not restore access" (row 2).
const QUOTA_CODES: &[&str] = &[
    "insufficient_quota",
    "credit_balance_exhausted",
    "organization_spend_limit_exceeded",
    "project_spend_limit_exceeded",
    "organization_usage_limit_exceeded",
];

/// Reads `message`, `type`, `param` and `code` (a string, a number, a
/// numeric string or null) of an error object.
pub(super) fn read_error(err: &Map<String, Value>, out: &mut ErrorBody) {
    out.message = str_field(err, "message");
    out.kind = str_field(err, "type");
    out.param = str_field(err, "param");
    match err.get("code") {
        Some(Value::String(s)) => {
            let s = s.trim();
            if let Ok(n) = s.parse::<i64>() {
                out.code_num = Some(n);
            } else if !s.is_empty() {
                out.code = Some(s.to_owned());
            }
        }
        Some(Value::Number(n)) => {
            out.code_num = n.as_i64().or_else(|| n.as_f64().map(|f| f as i64));
        }
        _ => {}
    }
}

/// A content-filter finish on a chunk: `choices[0].finish_reason` is
/// `content_filter` (OpenAI, Azure in streams).
pub(super) fn filter_finish(obj: &Map<String, Value>) -> Option<String> {
    first_object(obj, "choices")
        .and_then(|c| str_field(c, "finish_reason"))
        .filter(|reason| reason == "content_filter")
}

/// Row 2: `type` or `code` says the quota or the credit is spent.
pub(super) fn quota_exhausted(b: &ErrorBody) -> bool {
    field_is(b.kind.as_ref(), "insufficient_quota")
        || QUOTA_CODES.iter().any(|q| field_is(b.code.as_ref(), q))
}

/// Row 1a: a 429 (or `rate_limit_exceeded`) whose message says the request
/// alone is over this tier's tokens-per-minute limit.
pub(super) fn too_large_for_tier(status: Option<u16>, b: &ErrorBody) -> bool {
    (status == Some(429) || field_is(b.code.as_ref(), "rate_limit_exceeded"))
        && tpm_request_too_large(b.message.as_deref().unwrap_or(""))
}

/// Row 13: `code` is `context_length_exceeded`.
pub(super) fn context_length_code(b: &ErrorBody) -> bool {
    field_is(b.code.as_ref(), "context_length_exceeded")
}

/// The class a specific `code` means (ASCII case ignored), if it is one of
/// OpenAI's or an OpenAI-compatible server's.
pub(super) fn class_of_code(b: &ErrorBody) -> Option<FailureClass> {
    match b.code.as_ref()?.to_ascii_lowercase().as_str() {
        "rate_limit_exceeded" => Some(RateLimited),
        "invalid_api_key" | "invalid_authentication" => Some(Auth),
        "model_not_found" => Some(ModelNotFound),
        // `capacity_exceeded`: Groq's flex tier.
        "server_is_overloaded" | "slow_down" | "capacity_exceeded" => Some(Overloaded),
        "unsupported_country_region_territory" => Some(PermissionDenied),
        // Groq's 413.
        "request_too_large" => Some(PayloadTooLarge),
        _ => None,
    }
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

/// The number written right after `label` in `text` (`,` and `_` digit
/// separators skipped).
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
    use crate::classify::body::parse_error_body;

    #[test]
    fn openai_shape_with_tolerant_code() {
        let b = parse_error_body(br#"{"error":{"message":"m","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#);
        assert!(b.found());
        assert_eq!(b.code.as_deref(), Some("rate_limit_exceeded"));
        assert_eq!(b.kind.as_deref(), Some("tokens"));
        let b = parse_error_body(
            br#"{"error":{"message":"m","type":"BadRequestError","param":null,"code":400}}"#,
        );
        assert_eq!((b.code.as_deref(), b.code_num), (None, Some(400)));
        let b = parse_error_body(br#"{"error":{"message":"m","code":"429"}}"#);
        assert_eq!(b.named_status(), Some(429));
        let b = parse_error_body(br#"{"error":{"message":"m","code":null}}"#);
        assert_eq!((b.code.as_deref(), b.code_num), (None, None));
    }

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
}
