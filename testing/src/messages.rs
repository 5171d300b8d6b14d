//! The Anthropic Messages side of [`FakeUpstream`](super::upstream::FakeUpstream):
//! `POST /v1/messages` answers, event streams and error bodies, with the
//! same faults as chat completions.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use super::Step;
use super::upstream::{ErrorFixture, Fault, REFUSAL, refusal_pieces};

/// The message id every fake answer uses.
pub const MESSAGE_ID: &str = "msg_fake";

/// The tool a fake tool-use answer calls.
pub const TOOL_NAME: &str = "get_weather";

/// What one Messages request asked for.
pub(super) struct MessagesAsk {
    pub(super) model: String,
    pub(super) stream: bool,
    pub(super) tools: bool,
    pub(super) input_tokens: u64,
}

impl MessagesAsk {
    /// The request's fields, or why it is a 400.
    pub(super) fn read(body: &Value) -> Result<Self, &'static str> {
        let Some(model) = body.get("model").and_then(Value::as_str) else {
            return Err("model: Field required");
        };
        let Some(messages) = body.get("messages").and_then(Value::as_array) else {
            return Err("messages: Field required");
        };
        if body.get("max_tokens").and_then(Value::as_u64).is_none() {
            return Err("max_tokens: Field required");
        }
        let words: usize = messages
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_str))
            .map(|c| c.split_whitespace().count())
            .sum();
        Ok(Self {
            model: model.to_owned(),
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
            tools: body
                .get("tools")
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty()),
            input_tokens: u64::try_from(words.max(1)).unwrap_or(u64::MAX),
        })
    }
}

/// The Anthropic error body of a fixture: `{"type":"error","error":{...}}`.
pub(super) fn error_body(fixture: ErrorFixture) -> String {
    let (kind, message) = match fixture {
        ErrorFixture::RateLimit => (
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
        ),
        ErrorFixture::Quota => (
            "billing_error",
            "Your credit balance is too low to access the Anthropic API.",
        ),
        ErrorFixture::ContextLength => (
            "invalid_request_error",
            "prompt is too long: 205351 tokens > 200000 maximum",
        ),
        ErrorFixture::InvalidKey => ("authentication_error", "invalid x-api-key"),
        ErrorFixture::Forbidden => (
            "permission_error",
            "Your API key does not have permission to use the specified resource.",
        ),
        ErrorFixture::ModelNotFound => ("not_found_error", "model: claude-x"),
        ErrorFixture::ServerError => ("api_error", "Internal server error"),
        ErrorFixture::Overloaded => ("overloaded_error", "Overloaded"),
        ErrorFixture::RequestTooLarge => (
            "request_too_large",
            "Request exceeds the maximum allowed number of bytes.",
        ),
        _ => ("invalid_request_error", "Invalid request (fake upstream)."),
    };
    error_json(kind, message)
}

/// `{"type":"error","error":{"type":kind,"message":message},"request_id":...}`.
pub(super) fn error_json(kind: &str, message: &str) -> String {
    json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_fake"})
        .to_string()
}

/// The `anthropic-ratelimit-*` headers of an answer: the requests left.
pub(super) fn ratelimit_headers(remaining: u32) -> [(&'static str, String); 3] {
    [
        ("anthropic-ratelimit-requests-limit", "50".to_owned()),
        (
            "anthropic-ratelimit-requests-remaining",
            remaining.to_string(),
        ),
        (
            "anthropic-ratelimit-requests-reset",
            "2026-12-01T00:00:30Z".to_owned(),
        ),
    ]
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

fn token_text(name: &str, i: usize) -> String {
    format!("{name}-tok{i} ")
}

/// A delta of the answer: text, or a piece of the tool call's input.
fn delta(tools: bool, text: &str) -> Bytes {
    let delta = if tools {
        json!({"type": "input_json_delta", "partial_json": text})
    } else {
        json!({"type": "text_delta", "text": text})
    };
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 0, "delta": delta}),
    )
}

fn malformed(name: &str) -> Bytes {
    Bytes::from(format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{name}-brok\n\n"
    ))
}

/// The `message_start` event a stream opens with.
fn message_start(ask: &MessagesAsk) -> Bytes {
    event(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": MESSAGE_ID, "type": "message", "role": "assistant", "content": [],
            "model": ask.model, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": ask.input_tokens, "output_tokens": 1}}}),
    )
}

/// The SSE script for a streamed answer, and whether it ends in a reset.
///
/// Text: `message_start`, an empty text block, `ping`, one `text_delta` per
/// token, `content_block_stop`, `message_delta` (`end_turn`),
/// `message_stop`. With tools the block is a `tool_use` of [`TOOL_NAME`]
/// (its start is output: it names the tool) whose input
/// `{"q":"<tokens>"}` comes as one `input_json_delta` per token between
/// an opening and a closing piece; the stop reason is `tool_use`.
pub(super) fn stream_steps(
    name: &str,
    ask: &MessagesAsk,
    tokens: usize,
    pace: Duration,
    fault: Option<&Fault>,
) -> (VecDeque<Step>, bool) {
    if fault == Some(&Fault::Refusal) {
        return (refusal_stream_steps(ask, pace), false);
    }
    let cut = fault.and_then(Fault::cut_after);
    let malformed_at = fault.and_then(Fault::malformed_at);
    let mut steps = VecDeque::with_capacity(tokens * 2 + 8);
    steps.push_back(Step::Data(message_start(ask)));
    let block = if ask.tools {
        json!({"type": "tool_use", "id": "toolu_fake", "name": TOOL_NAME, "input": {}})
    } else {
        json!({"type": "text", "text": ""})
    };
    // A tool call's block names the tool: it is output, so a fault before
    // any token comes first (the in-band error before output).
    if !(ask.tools && cut == Some(0)) {
        steps.push_back(Step::Data(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": block}),
        )));
        steps.push_back(Step::Data(event("ping", &json!({"type": "ping"}))));
        if ask.tools {
            steps.push_back(Step::Data(delta(true, "{\"q\": \"")));
        }
    }
    for i in 0..tokens {
        if cut == Some(i) {
            break;
        }
        if i == 0 {
            if let Some(Fault::SlowFirstToken { delay_ms }) = fault {
                steps.push_back(Step::Wait(Duration::from_millis(*delay_ms)));
            }
        } else if !pace.is_zero() {
            steps.push_back(Step::Wait(pace));
        }
        if malformed_at == Some(i) {
            steps.push_back(Step::Data(malformed(name)));
        }
        steps.push_back(Step::Data(delta(ask.tools, &token_text(name, i))));
    }
    match fault {
        Some(Fault::ErrorAfter { error, .. }) => {
            let body = error_body(error.unwrap_or(ErrorFixture::Overloaded));
            steps.push_back(Step::Data(Bytes::from(format!(
                "event: error\ndata: {body}\n\n"
            ))));
            return (steps, false);
        }
        Some(Fault::ResetAfter { .. }) => return (steps, true),
        Some(Fault::StallAfter { .. }) => {
            steps.push_back(Step::Stall);
            return (steps, false);
        }
        Some(Fault::EofAfter { .. }) => return (steps, false),
        _ => {}
    }
    if malformed_at.is_some_and(|n| n >= tokens) {
        steps.push_back(Step::Data(malformed(name)));
    }
    if ask.tools {
        steps.push_back(Step::Data(delta(true, "\"}")));
    }
    steps.push_back(Step::Data(event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    )));
    let stop_reason = if ask.tools { "tool_use" } else { "end_turn" };
    steps.push_back(Step::Data(event(
        "message_delta",
        &json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": tokens}}),
    )));
    if !matches!(fault, Some(Fault::MissingDone)) {
        steps.push_back(Step::Data(event(
            "message_stop",
            &json!({"type": "message_stop"}),
        )));
    }
    (steps, false)
}

/// A streamed refusal: `message_start`, a text block whose `text_delta`s
/// are the pieces of [`REFUSAL`], `message_delta` with `stop_reason`
/// `refusal`, `message_stop`.
fn refusal_stream_steps(ask: &MessagesAsk, pace: Duration) -> VecDeque<Step> {
    let mut steps = VecDeque::from([
        Step::Data(message_start(ask)),
        Step::Data(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
        )),
        Step::Data(event("ping", &json!({"type": "ping"}))),
    ]);
    for (i, piece) in refusal_pieces().enumerate() {
        if i > 0 && !pace.is_zero() {
            steps.push_back(Step::Wait(pace));
        }
        steps.push_back(Step::Data(delta(false, piece)));
    }
    steps.push_back(Step::Data(event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    )));
    steps.push_back(Step::Data(event(
        "message_delta",
        &json!({"type": "message_delta",
                "delta": {"stop_reason": "refusal", "stop_sequence": null},
                "usage": {"output_tokens": refusal_pieces().count()}}),
    )));
    steps.push_back(Step::Data(event(
        "message_stop",
        &json!({"type": "message_stop"}),
    )));
    steps
}

/// The JSON script for a non-streamed answer, and whether it ends in a
/// reset.
pub(super) fn message_steps(
    name: &str,
    ask: &MessagesAsk,
    tokens: usize,
    fault: Option<&Fault>,
) -> (VecDeque<Step>, bool) {
    let text: String = (0..tokens).map(|i| token_text(name, i)).collect();
    let (content, stop_reason, output_tokens) = if fault == Some(&Fault::Refusal) {
        (
            json!([{"type": "text", "text": REFUSAL}]),
            "refusal",
            refusal_pieces().count(),
        )
    } else if ask.tools {
        (
            json!([{"type": "tool_use", "id": "toolu_fake", "name": TOOL_NAME, "input": {"q": text}}]),
            "tool_use",
            tokens,
        )
    } else {
        (json!([{"type": "text", "text": text}]), "end_turn", tokens)
    };
    let full = Bytes::from(
        json!({
            "id": MESSAGE_ID, "type": "message", "role": "assistant", "model": ask.model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": null,
            "usage": {"input_tokens": ask.input_tokens, "output_tokens": output_tokens}
        })
        .to_string(),
    );
    let half = full.slice(..full.len() / 2);
    let mut steps = VecDeque::with_capacity(2);
    match fault {
        Some(Fault::ErrorAfter { error, .. }) => {
            let body = error_body(error.unwrap_or(ErrorFixture::Overloaded));
            steps.push_back(Step::Data(Bytes::from(body)));
        }
        Some(Fault::ResetAfter { .. }) => {
            steps.push_back(Step::Data(half));
            return (steps, true);
        }
        Some(Fault::StallAfter { .. }) => {
            steps.push_back(Step::Data(half));
            steps.push_back(Step::Stall);
        }
        Some(Fault::EofAfter { .. } | Fault::MalformedAt { .. }) => {
            steps.push_back(Step::Data(half));
        }
        _ => steps.push_back(Step::Data(full)),
    }
    (steps, false)
}
