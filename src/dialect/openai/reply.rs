//! OpenAI answers the gateway writes or checks: error bodies
//! (`{"error":{"message","type","param","code"}}`, the shape the official
//! SDKs raise on) and whole `chat.completion` bodies.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::dialect::{AnswerFacts, BodyCheck, BodyFault, ErrorReply, Usage};
use crate::failure::FailureClass;

/// The OpenAI error `type` of a failure class.
pub(super) fn error_type(class: FailureClass) -> &'static str {
    use FailureClass::*;
    match class {
        InvalidRequest
        | ContextLengthExceeded
        | ContentFiltered
        | PayloadTooLarge
        | ModelNotFound => "invalid_request_error",
        RateLimited => "rate_limit_error",
        QuotaExhausted => "insufficient_quota",
        _ => "server_error",
    }
}

/// The OpenAI error `code`: OpenAI's own codes where one exists
/// (`context_length_exceeded`, `content_filter`, `model_not_found`,
/// `rate_limit_exceeded`, `insufficient_quota`), the provider's code for
/// other invalid requests, else the class name.
pub(super) fn error_code(class: FailureClass, provider_code: Option<&str>) -> String {
    use FailureClass::*;
    match class {
        ContextLengthExceeded => "context_length_exceeded".to_owned(),
        ContentFiltered => "content_filter".to_owned(),
        ModelNotFound => "model_not_found".to_owned(),
        RateLimited => "rate_limit_exceeded".to_owned(),
        QuotaExhausted => "insufficient_quota".to_owned(),
        InvalidRequest => provider_code.unwrap_or(class.as_str()).to_owned(),
        other => other.as_str().to_owned(),
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    error_type: &'a str,
    param: Option<&'a str>,
    code: &'a str,
}

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    error: ErrorBody<'a>,
}

pub(super) fn error_body(error: &ErrorReply<'_>) -> Bytes {
    let derived;
    let code = match error.code {
        Some(code) => code,
        None => {
            derived = error_code(error.class, error.provider_code);
            &derived
        }
    };
    let message = if error.message.is_empty() {
        "upstream failure"
    } else {
        error.message
    };
    let envelope = ErrorEnvelope {
        error: ErrorBody {
            message,
            error_type: error_type(error.class),
            param: error.param.filter(|_| error.class.is_request_error()),
            code,
        },
    };
    serde_json::to_vec(&envelope).map_or_else(
        |_| Bytes::from_static(br#"{"error":{"message":"upstream failure","type":"server_error","param":null,"code":null}}"#),
        Bytes::from,
    )
}

/// A `chat.completion` is an object with a non-empty `choices` and no
/// `error`; its `usage`, `model`, `id` and first choice's `finish_reason`
/// are read for the records, in the same pass.
pub(super) fn check_answer(body: &[u8]) -> (BodyCheck, AnswerFacts) {
    #[derive(Deserialize)]
    struct Completion<'a> {
        // Raw: an id of another type leaves the answer valid, unnamed.
        #[serde(borrow, default)]
        id: Option<&'a RawValue>,
        #[serde(borrow, default)]
        error: Option<&'a RawValue>,
        #[serde(borrow, default)]
        choices: Option<&'a RawValue>,
        #[serde(default)]
        model: Option<String>,
        #[serde(default)]
        usage: Option<RawUsage>,
    }
    #[derive(Deserialize)]
    struct RawUsage {
        #[serde(default)]
        prompt_tokens: u64,
        #[serde(default)]
        completion_tokens: u64,
    }
    #[derive(Deserialize)]
    struct Choice {
        #[serde(default)]
        finish_reason: Option<String>,
    }
    let invalid = |fault: BodyFault, message: &str| {
        let check = BodyCheck::Invalid {
            fault,
            message: message.to_owned(),
        };
        (check, AnswerFacts::default())
    };
    if let Some((fault, message)) = crate::dialect::raw::not_an_object(body, "the completion body")
    {
        return invalid(fault, &message);
    }
    let completion: Completion<'_> = match serde_json::from_slice(body) {
        Ok(c) => c,
        Err(e) if e.is_syntax() || e.is_eof() => {
            return invalid(
                BodyFault::NotJson,
                &format!("the completion body is not valid JSON: {e}"),
            );
        }
        Err(_) => {
            return invalid(
                BodyFault::UnexpectedJson,
                "the completion body is not a completion",
            );
        }
    };
    if completion.error.is_some_and(|e| e.get() != "null") {
        return invalid(BodyFault::NoAnswer, "the completion body is an error");
    }
    let choices = completion
        .choices
        .and_then(|c| serde_json::from_str::<Vec<&RawValue>>(c.get()).ok());
    match choices {
        Some(choices) if !choices.is_empty() => {
            let check = BodyCheck::Valid {
                usage: completion.usage.map(|u| Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                }),
                model: completion.model,
            };
            // The first choice only, as a stream records; its other
            // fields were skimmed once already.
            let finish_reason = choices
                .first()
                .and_then(|c| serde_json::from_str::<Choice>(c.get()).ok())
                .and_then(|c| c.finish_reason);
            let id = completion
                .id
                .and_then(|id| serde_json::from_str::<String>(id.get()).ok());
            (check, AnswerFacts::new(id, finish_reason))
        }
        Some(_) => invalid(BodyFault::NoAnswer, "the completion has an empty `choices`"),
        None => invalid(BodyFault::NoAnswer, "the completion has no `choices`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_have_the_sdk_shape() {
        let body = error_body(
            &ErrorReply::new(FailureClass::RateLimited, "slow down")
                .provider_code(Some("x"))
                .param(Some("ignored")),
        );
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error": {"message": "slow down", "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded"}})
        );
        let body = error_body(
            &ErrorReply::new(FailureClass::InvalidRequest, "bad")
                .provider_code(Some("invalid_value"))
                .param(Some("temperature")),
        );
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], "invalid_value");
        assert_eq!(json["error"]["param"], "temperature");
        let body = error_body(
            &ErrorReply::new(FailureClass::Overloaded, "none left").code("no_available_target"),
        );
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], "no_available_target");
        assert_eq!(json["error"]["type"], "server_error");
    }

    #[test]
    fn completions_are_checked_and_read() {
        let ok = br#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
        assert_eq!(
            check_answer(ok),
            (
                BodyCheck::Valid {
                    usage: Some(Usage {
                        prompt_tokens: 3,
                        completion_tokens: 2
                    }),
                    model: Some("m".to_owned())
                },
                AnswerFacts::new(Some("c".to_owned()), Some("stop".to_owned()))
            )
        );
        // An id or a choice of an unexpected shape: still an answer,
        // without the facts it could not read.
        let odd = br#"{"id":7,"choices":[1,{"finish_reason":"length"}]}"#;
        assert_eq!(
            check_answer(odd),
            (
                BodyCheck::Valid {
                    usage: None,
                    model: None
                },
                AnswerFacts::default()
            )
        );
        for bad in [
            &b"{\"choices\":[]}"[..],
            b"{\"id\":\"c\"}",
            b"{\"error\":{\"message\":\"x\"}}",
            b"[{\"error\":{}}]",
            b"{\"choices\":[",
            b"not json",
        ] {
            assert!(
                matches!(check_answer(bad).0, BodyCheck::Invalid { .. }),
                "{bad:?}"
            );
        }
    }
}
