//! OpenRouter's error-body contract: OpenAI's shape with a numeric `code`
//! equal to the HTTP status, plus `error.metadata`.
//!
//! Follows OpenRouter's API reference, "Errors and debugging" (moderation
//! `metadata.reasons` / `flagged_input`, provider errors with
//! `metadata.provider_name` and `raw`) and its streaming page ("Errors
//! After Tokens Have Been Sent"). `metadata.error_type`
//! (`provider_overloaded`, `context_length_exceeded`) comes from 3rd-party
//! notes on newer docs and is read when present.
//!
//! Rows of the provider reference's classification table: 4 (402, in the
//! shared quota step), 11a, 13, 21.

use serde_json::{Map, Value};

use super::{field_is, str_field};
use crate::FailureClass::{self, *};
use crate::classify::body::ErrorBody;

/// Reads `error.metadata`: whether moderation flagged the input, and its
/// `error_type`.
pub(super) fn read_error(err: &Map<String, Value>, out: &mut ErrorBody) {
    if let Some(meta) = err.get("metadata").and_then(Value::as_object) {
        out.moderation = meta.contains_key("reasons") || meta.contains_key("flagged_input");
        out.metadata_error_type = str_field(meta, "error_type");
    }
}

/// Row 11a: moderation flagged the input.
pub(super) fn moderated(b: &ErrorBody) -> bool {
    b.moderation
}

/// Row 13: `metadata.error_type` is `context_length_exceeded`.
pub(super) fn context_length(b: &ErrorBody) -> bool {
    field_is(b.metadata_error_type.as_ref(), "context_length_exceeded")
}

/// The class a specific `metadata.error_type` means.
pub(super) fn class_of_error_type(b: &ErrorBody) -> Option<FailureClass> {
    field_is(b.metadata_error_type.as_ref(), "provider_overloaded").then_some(Overloaded)
}
