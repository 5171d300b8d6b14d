//! The providers' error-body contracts: what each provider family's error
//! bodies look like, and what their codes, types and statuses mean.
//!
//! One file per family, each naming the documentation it follows:
//!
//! - `openai`: OpenAI, and the OpenAI-compatible servers that reuse its
//!   codes (Groq, DeepSeek, ...);
//! - `azure`: Azure OpenAI's `innererror` and content filter;
//! - `openrouter`: OpenRouter's `error.metadata`;
//! - `vllm`: vLLM's legacy flat error and its exception-named types;
//! - `ollama`: Ollama's native `{"error": "text"}`;
//! - `anthropic`: Anthropic's `{"type": "error", "error": {...}}`;
//! - `gemini`: Google's `error.status` and `google.rpc` `details[]`, and
//!   the array-wrapped errors of Gemini's OpenAI-compatible endpoint.
//!
//! This file holds what is not one provider's: the order the shapes and the
//! rules are tried in, the FastAPI `detail` body in front of self-hosted
//! servers, the status-named quota (402), our own class names, and the
//! helpers the families share. What a status means on its own, and the
//! fallbacks after the contracts, are in the `rules` module.
//!
//! Shapes, the first that matches wins:
//! - a JSON **array** (Gemini's OpenAI-compatible endpoint): the first
//!   object in it is read instead;
//! - `{"error": {...}}`: OpenAI, Azure (`innererror`), Gemini native
//!   (`status`, `details[]`), OpenRouter (`metadata`), vLLM (numeric `code`),
//!   Ollama's OpenAI-compatible errors, and Anthropic's
//!   `{"type": "error", "error": {...}}` (`error.details` too); `code` may
//!   be a string, a number or null;
//! - `{"error": "text"}`: Ollama native NDJSON;
//! - a flat `{"object": "error", "message", "type", "code"}` (vLLM legacy)
//!   or any object with `message` and `code`/`type`;
//! - `{"detail": ...}`: FastAPI defaults in front of self-hosted servers;
//! - any other JSON is `Shape::OtherJson` (a bare string keeps its text as
//!   the message).
//!
//! Every object also has its content-filter finish read (OpenAI and Azure
//! `finish_reason`, Gemini `finishReason` and `blockReason`).

mod anthropic;
mod azure;
mod gemini;
mod ollama;
mod openai;
mod openrouter;
mod vllm;

use serde_json::{Map, Value};

use super::body::{ErrorBody, Shape};
use crate::FailureClass::{self, *};

/// Parses an already-decoded JSON value.
pub(crate) fn parse_value(value: &Value) -> ErrorBody {
    let mut out = ErrorBody {
        shape: Shape::OtherJson,
        ..ErrorBody::default()
    };
    match value {
        Value::Array(items) => {
            if let Some(first) = gemini::wrapped_error(items) {
                return parse_value(first);
            }
        }
        Value::Object(obj) => parse_object(obj, &mut out),
        Value::String(s) => {
            out.message = Some(s.clone());
        }
        _ => {}
    }
    out
}

/// Reads a JSON object by the first shape it matches.
fn parse_object(obj: &Map<String, Value>, out: &mut ErrorBody) {
    match obj.get("error") {
        Some(Value::Object(err)) => {
            out.shape = Shape::Error;
            fill_from_error(err, out);
        }
        Some(Value::String(s)) => ollama::read_native_error(s, out),
        _ => {
            if vllm::is_flat_error(obj) {
                out.shape = Shape::Error;
                fill_from_error(obj, out);
            } else if let Some(detail) = obj.get("detail") {
                // FastAPI's default error body.
                out.shape = Shape::Error;
                out.message = Some(match detail {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
            }
        }
    }
    out.filter_finish = openai::filter_finish(obj).or_else(|| gemini::filter_finish(obj));
}

/// Reads an error object: each family reads the fields it defines (no two
/// read the same one).
fn fill_from_error(err: &Map<String, Value>, out: &mut ErrorBody) {
    openai::read_error(err, out);
    gemini::read_error(err, out);
    azure::read_error(err, out);
    anthropic::read_error(err, out);
    openrouter::read_error(err, out);
}

/// The class the providers' contracts give an error body, if any.
///
/// `status` is the response's status, or in-band the one the body's `code`
/// names; `has_retry_after` says whether the head carried a
/// `retry-after`/`retry-after-ms` header. The steps, first match wins, are
/// listed on the `rules` module (steps 1 to 7).
pub(crate) fn class_by_contract(
    status: Option<u16>,
    b: &ErrorBody,
    has_retry_after: bool,
) -> Option<FailureClass> {
    // 1. Quota and billing: the same 429 must not read as a rate limit.
    if quota_exhausted(status, b, has_retry_after) {
        return Some(QuotaExhausted);
    }
    // 2. OpenAI's "Request too large ... (TPM)": no retry on this tier can
    //    succeed.
    if openai::too_large_for_tier(status, b) {
        return Some(PayloadTooLarge);
    }
    // 3. Content filters.
    if azure::content_filtered(b) || openrouter::moderated(b) {
        return Some(ContentFiltered);
    }
    // 4. Context length by code.
    if openai::context_length_code(b) || openrouter::context_length(b) {
        return Some(ContextLengthExceeded);
    }
    // 5. Specific codes, then 6. specific types, then 7. Gemini statuses.
    openai::class_of_code(b)
        .or_else(|| own_class_name(b))
        .or_else(|| openrouter::class_of_error_type(b))
        .or_else(|| gemini::class_of_reasons(b))
        .or_else(|| anthropic::class_of_type(b))
        .or_else(|| vllm::class_of_type(b))
        .or_else(|| gemini::class_of_status(b))
}

/// Step 1: quota or billing exhausted, whatever the status (rows 2, 3a, 3b,
/// 4, 5). A 402 is one whoever sends it (Anthropic, OpenRouter, DeepSeek).
fn quota_exhausted(status: Option<u16>, b: &ErrorBody, has_retry_after: bool) -> bool {
    openai::quota_exhausted(b)
        || anthropic::quota_exhausted(b, has_retry_after)
        || status == Some(402)
        || gemini::daily_quota(b)
}

/// Our own class names, as a gateway's terminal event carries them in
/// `code`: an inspector that re-reads it keeps the class.
fn own_class_name(b: &ErrorBody) -> Option<FailureClass> {
    let code = b.code.as_ref()?;
    FailureClass::ALL
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(code))
}

/// Whether an optional field equals `expected`, ASCII case ignored.
fn field_is(field: Option<&String>, expected: &str) -> bool {
    field.is_some_and(|f| f.eq_ignore_ascii_case(expected))
}

/// A string field, trimmed; `None` when absent, not a string, or blank.
fn str_field(obj: &Map<String, Value>, key: &str) -> Option<String> {
    obj.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The first element of an array field, when it is an object
/// (`choices[0]`, `candidates[0]`).
fn first_object<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    obj.get(key)
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_object)
}
