//! Ollama's error-body contract.
//!
//! Follows Ollama's API documentation, "Errors" (native NDJSON errors are
//! `{"error": "text"}`, mid-stream with the status left at 200), and its
//! OpenAI-compatible layer's `NewError` (the OpenAI shape with `type` one of
//! `invalid_request_error`, `not_found_error`, `api_error` and `code`
//! always null). Those types are read as the same names elsewhere:
//! `not_found_error` by the `anthropic` type rules, the other two by the
//! in-band fallback (`rules` module); the status decides first.
//!
//! Rows of the provider reference's classification table: 10, 12.

use crate::classify::body::{ErrorBody, Shape};

/// Reads a native error, `{"error": "text"}`: the text is the message.
pub(super) fn read_native_error(text: &str, out: &mut ErrorBody) {
    out.shape = Shape::Error;
    out.message = Some(text.to_owned());
}
