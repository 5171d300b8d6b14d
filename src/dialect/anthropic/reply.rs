//! Messages answers the gateway writes or checks: error bodies
//! (`{"type":"error","error":{"type","message"}}`, the shape the official
//! SDKs raise on) and whole `message` bodies.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::FailureClass;
use crate::{
    Usage, dialect::AnswerFacts, dialect::BodyCheck, dialect::BodyFault, dialect::ErrorReply,
};

/// The Anthropic error `type` of a failure class.
///
/// A spent quota is reported as a rate limit (the gateway answers it with
/// 429); the provider's auth and permission failures are the gateway's
/// credential failing, not the client's, so they are `api_error`s.
pub(super) fn error_type(class: FailureClass) -> &'static str {
    use FailureClass::*;
    match class {
        InvalidRequest | ContextLengthExceeded | ContentFiltered => "invalid_request_error",
        PayloadTooLarge => "request_too_large",
        ModelNotFound => "not_found_error",
        RateLimited | QuotaExhausted => "rate_limit_error",
        Overloaded => "overloaded_error",
        Timeout => "timeout_error",
        _ => "api_error",
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(rename = "type")]
    error_type: &'a str,
    message: &'a str,
    /// The gateway's own code, or the provider's; not in Anthropic's
    /// shape, which its SDKs tolerate (they read `type` and `message`).
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'a str>,
}

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: ErrorBody<'a>,
}

pub(super) fn error_body(error: &ErrorReply<'_>) -> Bytes {
    let message = if error.message.is_empty() {
        "upstream failure"
    } else {
        error.message
    };
    let envelope = ErrorEnvelope {
        kind: "error",
        error: ErrorBody {
            error_type: error_type(error.class),
            message,
            code: error.code.or(error.provider_code),
        },
    };
    serde_json::to_vec(&envelope).map_or_else(
        |_| {
            Bytes::from_static(
                br#"{"type":"error","error":{"type":"api_error","message":"upstream failure"}}"#,
            )
        },
        Bytes::from,
    )
}

/// A whole `message` is an object of `type` `"message"` (when it says),
/// with a `content` array and a `stop_reason`; its `usage` and `model`
/// are read for the records, with its `id` and `stop_reason`, in the same
/// pass. An error object on a 200 is no answer.
pub(super) fn check_answer(body: &[u8]) -> (BodyCheck, AnswerFacts) {
    #[derive(Deserialize)]
    struct Message<'a> {
        // Raw: an id of another type leaves the answer valid, unnamed.
        #[serde(borrow, default)]
        id: Option<&'a RawValue>,
        #[serde(borrow, default, rename = "type")]
        kind: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        error: Option<&'a RawValue>,
        #[serde(borrow, default)]
        content: Option<&'a RawValue>,
        #[serde(borrow, default)]
        stop_reason: Option<&'a RawValue>,
        #[serde(default)]
        model: Option<String>,
        #[serde(default)]
        usage: Option<RawUsage>,
    }
    #[derive(Deserialize)]
    struct RawUsage {
        #[serde(default)]
        input_tokens: u64,
        #[serde(default)]
        cache_creation_input_tokens: Option<u64>,
        #[serde(default)]
        cache_read_input_tokens: Option<u64>,
        #[serde(default)]
        output_tokens: u64,
    }
    let invalid = |fault: BodyFault, message: &str| {
        let check = BodyCheck::Invalid {
            fault,
            message: message.to_owned(),
        };
        (check, AnswerFacts::default())
    };
    if let Some((fault, message)) = crate::dialect::raw::not_an_object(body, "the message body") {
        return invalid(fault, &message);
    }
    let message: Message<'_> = match serde_json::from_slice(body) {
        Ok(m) => m,
        Err(e) if e.is_syntax() || e.is_eof() => {
            return invalid(
                BodyFault::NotJson,
                &format!("the message body is not valid JSON: {e}"),
            );
        }
        Err(_) => return invalid(BodyFault::UnexpectedJson, "the body is not a message"),
    };
    if message.kind.as_deref() == Some("error") || message.error.is_some_and(|e| e.get() != "null")
    {
        return invalid(BodyFault::NoAnswer, "the message body is an error");
    }
    if message.kind.as_deref().is_some_and(|k| k != "message") {
        return invalid(BodyFault::NoAnswer, "the body is not a message");
    }
    let content_is_array = message
        .content
        .is_some_and(|c| c.get().as_bytes().first() == Some(&b'['));
    if !content_is_array {
        return invalid(BodyFault::NoAnswer, "the message has no `content` array");
    }
    // A whole message always says why it stopped; one that does not was
    // cut short.
    if message.stop_reason.is_none_or(|r| r.get() == "null") {
        return invalid(BodyFault::NoAnswer, "the message has no `stop_reason`");
    }
    let check = BodyCheck::Valid {
        usage: message.usage.map(|u| {
            let input = u
                .input_tokens
                .saturating_add(u.cache_creation_input_tokens.unwrap_or(0))
                .saturating_add(u.cache_read_input_tokens.unwrap_or(0));
            Usage::new(input, u.output_tokens)
        }),
        model: message.model,
    };
    let text =
        |raw: Option<&RawValue>| raw.and_then(|r| serde_json::from_str::<String>(r.get()).ok());
    let facts = AnswerFacts {
        id: text(message.id),
        finish_reason: text(message.stop_reason),
    };
    (check, facts)
}
