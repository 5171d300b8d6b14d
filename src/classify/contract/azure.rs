//! Azure OpenAI's error-body contract: OpenAI's shape (read by `openai`)
//! plus `error.innererror` and the content filter.
//!
//! Follows the Azure OpenAI documentation on content filtering and the
//! Azure OpenAI REST API error schema (`innererror.code`,
//! `ResponsibleAIPolicyViolation`). A filtered prompt answers 400 with
//! `code: "content_filter"`; in streams Azure ends with
//! `finish_reason: "content_filter"` instead (read by `openai`).
//!
//! Row of the provider reference's classification table: 14.

use serde_json::{Map, Value};

use super::{field_is, str_field};
use crate::classify::body::ErrorBody;

/// Reads `error.innererror.code`.
pub(super) fn read_error(err: &Map<String, Value>, out: &mut ErrorBody) {
    if let Some(inner) = err.get("innererror").and_then(Value::as_object) {
        out.inner_code = str_field(inner, "code");
    }
}

/// Row 14: the content filter refused the prompt or the answer.
pub(super) fn content_filtered(b: &ErrorBody) -> bool {
    field_is(b.code.as_ref(), "content_filter")
        || field_is(b.inner_code.as_ref(), "ResponsibleAIPolicyViolation")
}
