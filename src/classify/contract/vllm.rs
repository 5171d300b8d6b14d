//! vLLM's error-body contract: OpenAI's shape with the HTTP status as a
//! numeric `code` and Python exception names as `type`
//! (`BadRequestError`, `NotFoundError`, `InternalServerError`), or, in
//! older versions, the same fields flat at the top level with
//! `"object": "error"`.
//!
//! vLLM documents no error format; this follows its OpenAI-compatible
//! server's code (`ErrorResponse` / `ErrorInfo` in the protocol module, and
//! the chat serving stream generator, which sends the error as a `data:`
//! event followed by `data: [DONE]`). The numeric `code` counts as the
//! status (`ErrorBody::named_status`); `BadRequestError` is one of the
//! generic request types of the in-band fallback (`rules` module).
//!
//! Rows of the provider reference's classification table: 13, 20, 25.

use serde_json::{Map, Value};

use crate::FailureClass::{self, *};
use crate::classify::body::ErrorBody;

/// Whether an object without an `error` field is itself the error: vLLM's
/// legacy flat `{"object": "error", ...}`, or any object with a string
/// `message` and a `code` or `type`.
pub(super) fn is_flat_error(obj: &Map<String, Value>) -> bool {
    obj.get("object").and_then(Value::as_str) == Some("error")
        || (obj.get("message").is_some_and(Value::is_string)
            && (obj.contains_key("code") || obj.contains_key("type")))
}

/// The class a specific exception-named `type` means (ASCII case ignored).
pub(super) fn class_of_type(b: &ErrorBody) -> Option<FailureClass> {
    b.kind
        .as_ref()?
        .eq_ignore_ascii_case("NotFoundError")
        .then_some(ModelNotFound)
}
