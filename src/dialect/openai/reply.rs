//! OpenAI answers the gateway writes or checks: error bodies
//! (`{"error":{"message","type","param","code"}}`, the shape the official
//! SDKs raise on) and whole `chat.completion` bodies.

use bytes::Bytes;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::fmt;

use crate::FailureClass;
use crate::dialect::raw::scalars_read_as;
use crate::{
    Usage, dialect::AnswerFacts, dialect::BodyCheck, dialect::BodyFault, dialect::ErrorReply,
};

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
/// are read for the records.
///
/// An answer of the usual shape is read by the skimmer (a third of serde's
/// instructions, no allocation but the kept strings); any other body, and
/// every body the skimmer is unsure of, by serde ([`check_answer_in_full`]),
/// which alone decides what is wrong with a body.
pub(super) fn check_answer(body: &[u8]) -> (BodyCheck, AnswerFacts) {
    if let Some(answer) = super::skim::skim_completion(body) {
        let check = BodyCheck::Valid {
            usage: answer.usage,
            model: answer.model.map(str::to_owned),
        };
        let facts = AnswerFacts {
            id: answer.id.map(str::to_owned),
            finish_reason: answer.finish_reason.map(str::to_owned),
        };
        return (check, facts);
    }
    check_answer_in_full(body)
}

/// [`check_answer`] by serde alone: the body is walked once (`choices` is
/// read element by element, the first for its `finish_reason`, the rest
/// only checked).
pub(super) fn check_answer_in_full(body: &[u8]) -> (BodyCheck, AnswerFacts) {
    #[derive(Deserialize)]
    struct Completion<'a> {
        // Raw: an id of another type leaves the answer valid, unnamed.
        #[serde(borrow, default)]
        id: Option<&'a RawValue>,
        #[serde(borrow, default)]
        error: Option<&'a RawValue>,
        #[serde(default)]
        choices: Option<Choices>,
        #[serde(default)]
        model: Option<String>,
        #[serde(default)]
        usage: Option<RawUsage>,
    }
    #[derive(Deserialize)]
    struct RawUsage {
        #[serde(default, rename = "prompt_tokens")]
        input_tokens: u64,
        #[serde(default, rename = "completion_tokens")]
        output_tokens: u64,
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
    match completion.choices {
        Some(Choices::First { finish_reason }) => {
            let check = BodyCheck::Valid {
                usage: completion
                    .usage
                    .map(|u| Usage::new(u.input_tokens, u.output_tokens)),
                model: completion.model,
            };
            let id = completion
                .id
                .and_then(|id| serde_json::from_str::<String>(id.get()).ok());
            (check, AnswerFacts { id, finish_reason })
        }
        Some(Choices::Empty) => {
            invalid(BodyFault::NoAnswer, "the completion has an empty `choices`")
        }
        // Absent, null, or not an array.
        _ => invalid(BodyFault::NoAnswer, "the completion has no `choices`"),
    }
}

/// A completion's `choices` as the check reads it in one pass: empty, or
/// the first one's `finish_reason` (as a stream records; the rest are only
/// checked), or no array at all. Any value deserializes, so a `choices` of
/// another type is "no choices", not "not a completion".
///
/// Reading rather than skipping the first choice has one edge: JSON that
/// can be skipped but not read there (a number beyond `f64`, such as
/// `1e400`, a lone surrogate escape in a key, nesting past serde_json's
/// limit inside `finish_reason`) makes the body not JSON,
/// where the earlier three-pass check let it pass. No provider writes
/// either; both are treated as the malformed answers they are.
enum Choices {
    Empty,
    First { finish_reason: Option<String> },
    NotAList,
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ChoicesVisitor)
    }
}

/// Reads a completion's `choices` in one pass: the first choice for its
/// `finish_reason`, the rest only skipped; a value that is not an array is
/// [`Choices::NotAList`].
struct ChoicesVisitor;

impl<'de> Visitor<'de> for ChoicesVisitor {
    type Value = Choices;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the choices")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Choices, A::Error> {
        let Some(FirstChoice(finish_reason)) = seq.next_element::<FirstChoice>()? else {
            return Ok(Choices::Empty);
        };
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Choices::First { finish_reason })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Choices, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Choices::NotAList)
    }
    scalars_read_as!(Choices::NotAList);
}

/// One choice: its `finish_reason` when it is an object with a
/// string there, else nothing (a choice of another shape leaves the
/// answer valid, with no reason recorded).
struct FirstChoice(Option<String>);

impl<'de> Deserialize<'de> for FirstChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FirstChoiceVisitor)
    }
}

/// Reads one choice for its `finish_reason`, skipping every other key.
struct FirstChoiceVisitor;

impl<'de> Visitor<'de> for FirstChoiceVisitor {
    type Value = FirstChoice;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a choice")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FirstChoice, A::Error> {
        let mut reason = None;
        while let Some(FinishReasonKey(is_reason)) = map.next_key()? {
            if is_reason {
                reason = map.next_value::<Reason>()?.0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(FirstChoice(reason))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FirstChoice, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(FirstChoice(None))
    }
    scalars_read_as!(FirstChoice(None));
}

/// Whether a choice's key is `finish_reason` (read without a copy).
struct FinishReasonKey(bool);

impl<'de> Deserialize<'de> for FinishReasonKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_identifier(FinishReasonKeyVisitor)
    }
}

/// Reads a choice's key as whether it is `finish_reason`.
struct FinishReasonKeyVisitor;

impl Visitor<'_> for FinishReasonKeyVisitor {
    type Value = FinishReasonKey;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E>(self, key: &str) -> Result<FinishReasonKey, E> {
        Ok(FinishReasonKey(key == "finish_reason"))
    }
}

/// A `finish_reason`: a string, or anything else read as none.
struct Reason(Option<String>);

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(Reason(match value {
            serde_json::Value::String(reason) => Some(reason),
            _ => None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_have_the_sdk_shape() {
        let body = error_body(&ErrorReply {
            provider_code: Some("x"),
            param: Some("ignored"),
            ..ErrorReply::new(FailureClass::RateLimited, "slow down")
        });
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error": {"message": "slow down", "type": "rate_limit_error", "param": null, "code": "rate_limit_exceeded"}})
        );
        let body = error_body(&ErrorReply {
            provider_code: Some("invalid_value"),
            param: Some("temperature"),
            ..ErrorReply::new(FailureClass::InvalidRequest, "bad")
        });
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["code"], "invalid_value");
        assert_eq!(json["error"]["param"], "temperature");
        let body = error_body(&ErrorReply::coded(
            FailureClass::Overloaded,
            "no_available_target",
            "none left",
        ));
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
                    usage: Some(Usage::new(3, 2)),
                    model: Some("m".to_owned())
                },
                AnswerFacts {
                    id: Some("c".to_owned()),
                    finish_reason: Some("stop".to_owned())
                }
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

    /// `choices` is read in the same pass as the body: how the one-pass
    /// reader tells each shape apart.
    #[test]
    fn choices_of_every_shape_are_read_in_one_pass() {
        let fault = |body: &[u8]| match check_answer(body).0 {
            BodyCheck::Invalid { fault, message } => Some((fault, message)),
            BodyCheck::Valid { .. } => None,
        };
        let reason = |body: &[u8]| check_answer(body).1.finish_reason;
        // Not an array (or null, or absent): no choices, not "not a completion".
        for body in [
            &br#"{"choices":{"0":{}}}"#[..],
            br#"{"choices":"x"}"#,
            br#"{"choices":3}"#,
            br#"{"choices":true}"#,
            br#"{"choices":null}"#,
            br#"{"model":"m"}"#,
        ] {
            assert_eq!(
                fault(body),
                Some((
                    BodyFault::NoAnswer,
                    "the completion has no `choices`".to_owned()
                )),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(
            fault(br#"{"choices":[]}"#),
            Some((
                BodyFault::NoAnswer,
                "the completion has an empty `choices`".to_owned()
            ))
        );
        // The first choice's reason only; a reason that is no string, or a
        // first choice that is no object, reads as none.
        assert_eq!(
            reason(br#"{"choices":[{"finish_reason":"length"},{"finish_reason":"stop"}]}"#),
            Some("length".to_owned())
        );
        assert_eq!(reason(br#"{"choices":[{"finish_reason":7}]}"#), None);
        assert_eq!(reason(br#"{"choices":[{"finish_reason":null}]}"#), None);
        assert_eq!(reason(br#"{"choices":[[{"finish_reason":"stop"}]]}"#), None);
        assert_eq!(
            reason(br#"{"choices":[null,{"finish_reason":"stop"}]}"#),
            None
        );
        // Escaped keys and nested values are skipped, not misread.
        assert_eq!(
            reason(
                br#"{"choices":[{"message":{"finish_reason":"no"},"finish\u005freason":"stop"}]}"#
            ),
            Some("stop".to_owned())
        );
        // JSON that can be skipped but not read, in the first choice: not
        // JSON (see `Choices`); further on it is only skipped.
        assert_eq!(
            fault(br#"{"choices":[1e400]}"#).map(|f| f.0),
            Some(BodyFault::NotJson)
        );
        assert_eq!(
            reason(br#"{"choices":[{"finish_reason":"stop"},1e400]}"#),
            Some("stop".to_owned())
        );
        // Broken JSON inside `choices` is still not JSON.
        assert_eq!(
            fault(br#"{"choices":[{"finish_reason":"stop"},{]}"#).map(|f| f.0),
            Some(BodyFault::NotJson)
        );
        assert_eq!(
            fault(br#"{"choices":[{"finish_reason":"stop"}],"error":null,"choices2":}"#)
                .map(|f| f.0),
            Some(BodyFault::NotJson)
        );
    }
}
