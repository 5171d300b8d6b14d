//! Whole Responses answers: the `response` object a non-streaming request
//! gets, checked before it is released.

use crate::dialect::raw::not_an_object;
use crate::dialect::{AnswerFacts, BodyCheck, BodyFault};

use super::stream::ResponseObject;

/// Checks a whole `response` object and reads what identifies it.
///
/// Valid: an object whose `status` is `completed` with an `output` array,
/// or `incomplete` with output in it (the output limit was reached after
/// some). A `failed` response, an `incomplete` one without output, one
/// still `queued` or `in_progress` (a background request, whose answer is
/// not here) and an error body are not answers.
pub(super) fn check_answer(body: &[u8]) -> (BodyCheck, AnswerFacts) {
    if let Some((fault, message)) = not_an_object(body, "the response body") {
        return (
            BodyCheck::Invalid { fault, message },
            AnswerFacts::default(),
        );
    }
    let response: ResponseObject<'_> = match serde_json::from_slice(body) {
        Ok(response) => response,
        Err(e) => {
            return (
                BodyCheck::Invalid {
                    fault: if e.is_data() {
                        BodyFault::UnexpectedJson
                    } else {
                        BodyFault::NotJson
                    },
                    message: format!("the response body is not a response object: {e}"),
                },
                AnswerFacts::default(),
            );
        }
    };
    let facts = AnswerFacts {
        id: response.id.as_deref().map(str::to_owned),
        finish_reason: response.finish_reason().map(|r| r.into_owned()),
    };
    let status = response.status.as_deref();
    let valid = response.object.as_deref().is_none_or(|o| o == "response")
        && response.output.is_some()
        && match status {
            Some("completed") => true,
            Some("incomplete") => response.has_output(),
            _ => false,
        };
    if !valid {
        let message = match status {
            Some(status) => format!("the response is {status}, not an answer"),
            None => "the body is not a response object with an output".to_owned(),
        };
        return (
            BodyCheck::Invalid {
                fault: BodyFault::NoAnswer,
                message,
            },
            facts,
        );
    }
    (
        BodyCheck::Valid {
            usage: response.usage.as_ref().map(super::stream::RawUsage::usage),
            model: response.model.as_deref().map(str::to_owned),
        },
        facts,
    )
}
