//! Responses event streams: what each typed lifecycle event is, and the
//! frames the gateway writes to end one.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::ResponsesMemo;
use crate::dialect::{Chunk, ChunkIdentity, ChunkKind, ErrorFacts, TerminalError, TerminalMode};
use crate::sse::SseEvent;
use crate::{FailureClass, Usage};

/// One event's data, borrowed from it: only what classification reads.
/// Every Responses event is an object with a `type` and a
/// `sequence_number`.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(default)]
    sequence_number: Option<u64>,
    /// The lifecycle events' response object.
    #[serde(borrow, default)]
    response: Option<ResponseObject<'a>>,
    /// `response.output_item.added` / `.done`'s item.
    #[serde(borrow, default)]
    item: Option<Item<'a>>,
    /// `response.content_part.added` / `.done`'s part (and the reasoning
    /// summary's).
    #[serde(borrow, default)]
    part: Option<Piece<'a>>,
    /// Any `*.delta` event's delta (text, arguments, a refusal, a summary).
    #[serde(borrow, default)]
    delta: Option<&'a RawValue>,
    /// `*.done` events' whole text, refusal or arguments.
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

/// The response object of `response.created` … `response.completed`.
#[derive(Deserialize)]
pub(super) struct ResponseObject<'a> {
    #[serde(borrow, default)]
    pub(super) object: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) created_at: Option<f64>,
    #[serde(borrow, default)]
    pub(super) status: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) usage: Option<RawUsage>,
    #[serde(borrow, default)]
    pub(super) incomplete_details: Option<Incomplete<'a>>,
    #[serde(borrow, default)]
    pub(super) error: Option<ErrorObject<'a>>,
    #[serde(borrow, default)]
    pub(super) output: Option<Vec<Item<'a>>>,
}

#[derive(Deserialize)]
pub(super) struct Incomplete<'a> {
    #[serde(borrow, default)]
    pub(super) reason: Option<Cow<'a, str>>,
}

/// A response's `error` (`{"code","message"}`), or an `error` event's own
/// fields.
#[derive(Deserialize)]
pub(super) struct ErrorObject<'a> {
    #[serde(borrow, default)]
    pub(super) code: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "type")]
    pub(super) kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) message: Option<Cow<'a, str>>,
}

/// An output item: only whether it already carries output.
#[derive(Deserialize)]
pub(super) struct Item<'a> {
    #[serde(borrow, rename = "type", default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<Vec<Piece<'a>>>,
    #[serde(borrow, default)]
    summary: Option<Vec<Piece<'a>>>,
}

/// A content part or summary part: its text or refusal.
#[derive(Deserialize)]
pub(super) struct Piece<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
}

/// The Responses usage object. `input_tokens` counts the cached ones.
#[derive(Deserialize)]
pub(super) struct RawUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<CachedDetails>,
}

#[derive(Deserialize)]
struct CachedDetails {
    #[serde(default)]
    cached_tokens: u64,
}

impl RawUsage {
    pub(super) fn usage(&self) -> Usage {
        Usage {
            cached_input_tokens: self
                .input_tokens_details
                .as_ref()
                .map_or(0, |d| d.cached_tokens),
            ..Usage::new(self.input_tokens, self.output_tokens)
        }
    }
}

impl Piece<'_> {
    fn carries_output(&self) -> bool {
        self.text.as_deref().is_some_and(|t| !t.is_empty())
            || self.refusal.as_deref().is_some_and(|r| !r.is_empty())
    }
}

impl Item<'_> {
    /// Whether the item already carries model output: a message or
    /// reasoning item with text, or any other item (a function call names
    /// its tool; a hosted tool's call is the model's action).
    pub(super) fn carries_output(&self) -> bool {
        let any = |pieces: &Option<Vec<Piece<'_>>>| {
            pieces
                .as_deref()
                .is_some_and(|p| p.iter().any(Piece::carries_output))
        };
        match self.kind.as_deref() {
            Some("message") | None => any(&self.content),
            Some("reasoning") => any(&self.summary) || any(&self.content),
            Some(_) => true,
        }
    }
}

impl ResponseObject<'_> {
    /// Whether the response's output holds any model output.
    pub(super) fn has_output(&self) -> bool {
        self.output
            .as_deref()
            .is_some_and(|items| items.iter().any(Item::carries_output))
    }

    /// The finish reason the records keep: `completed`, or why the
    /// response is incomplete (`max_output_tokens`, `content_filter`).
    pub(super) fn finish_reason(&self) -> Option<Cow<'_, str>> {
        match self.status.as_deref() {
            Some("incomplete") => Some(
                self.incomplete_details
                    .as_ref()
                    .and_then(|d| d.reason.clone())
                    .unwrap_or(Cow::Borrowed("incomplete")),
            ),
            Some(status) => Some(Cow::Borrowed(status)).filter(|_| status == "completed"),
            None => None,
        }
    }
}

/// Whether a delta value carries output: a non-empty string (or any other
/// value, which only a newer event type would send).
fn delta_carries_output(delta: &RawValue) -> bool {
    !matches!(delta.get(), "\"\"" | "null")
}

/// Reads one dispatched event of a Responses stream.
///
/// The SDKs dispatch on the data's `type`; when the SSE event name is
/// there too it must agree (an event named one thing whose data says
/// another is read one way here and another way by some client).
pub(super) fn inspect<'a>(event: &'a SseEvent, memo: &mut ResponsesMemo) -> Chunk<'a> {
    if event.is_named("error") {
        return Chunk::of(ChunkKind::Error);
    }
    let Ok(data) = serde_json::from_slice::<Event<'_>>(event.data()) else {
        return Chunk::of(ChunkKind::Malformed);
    };
    let kind: &str = &data.kind;
    if event
        .event()
        .is_some_and(|name| name != b"message" && name != kind.as_bytes())
    {
        return Chunk::of(ChunkKind::Malformed);
    }
    if let Some(sequence) = data.sequence_number {
        memo.last_sequence = Some(memo.last_sequence.map_or(sequence, |s| s.max(sequence)));
    }
    match kind {
        "response.created" | "response.in_progress" | "response.queued" => match data.response {
            Some(response) => Chunk {
                identity: identity_of(response),
                ..Chunk::of(ChunkKind::Preamble)
            },
            None => Chunk::of(ChunkKind::Malformed),
        },
        "response.completed" | "response.incomplete" => {
            let Some(response) = data.response else {
                return Chunk::of(ChunkKind::Malformed);
            };
            // An incomplete response with no output is a failure (a filter,
            // the output limit spent on reasoning): another target may
            // answer.
            if kind == "response.incomplete" && !response.has_output() {
                return Chunk::of(ChunkKind::Error);
            }
            let usage = response.usage.as_ref().map(RawUsage::usage);
            let finish_reason = response
                .finish_reason()
                .map(|r| Cow::Owned(r.into_owned()))
                .or(Some(Cow::Borrowed("completed")));
            Chunk {
                kind: ChunkKind::Done,
                finish_reason,
                usage,
                identity: identity_of(response),
            }
        }
        "response.failed" | "error" => Chunk::of(ChunkKind::Error),
        "response.output_item.added" | "response.output_item.done" => match data.item {
            Some(item) if item.carries_output() => Chunk::of(ChunkKind::Output),
            Some(_) => Chunk::of(ChunkKind::Preamble),
            None => Chunk::of(ChunkKind::Malformed),
        },
        "response.content_part.added"
        | "response.content_part.done"
        | "response.reasoning_summary_part.added"
        | "response.reasoning_summary_part.done" => match data.part {
            Some(part) if part.carries_output() => Chunk::of(ChunkKind::Output),
            Some(_) => Chunk::of(ChunkKind::Preamble),
            None => Chunk::of(ChunkKind::Malformed),
        },
        "response.output_text.annotation.added" => Chunk::of(ChunkKind::Output),
        _ if kind.ends_with(".delta") => match data.delta {
            Some(delta) if delta_carries_output(delta) => Chunk::of(ChunkKind::Output),
            _ => Chunk::of(ChunkKind::Preamble),
        },
        _ if kind.ends_with(".done") => {
            let whole = [&data.text, &data.refusal, &data.arguments]
                .into_iter()
                .any(|t| t.as_deref().is_some_and(|t| !t.is_empty()));
            Chunk::of(if whole {
                ChunkKind::Output
            } else {
                ChunkKind::Preamble
            })
        }
        // Event types added later: the SDKs' plain iteration skips what it
        // does not know.
        _ => Chunk::of(ChunkKind::Preamble),
    }
}

/// A lifecycle event's identity, owned (the response object is borrowed
/// from the event but dropped here).
fn identity_of(response: ResponseObject<'_>) -> ChunkIdentity<'_> {
    ChunkIdentity {
        id: response.id,
        model: response.model,
        created: response.created_at.map(|c| c as i64),
    }
}

/// What an in-band failure says: a `response.failed`'s response error, an
/// `error` event's own fields, or why a `response.incomplete` had no
/// output.
pub(super) fn error_facts(data: &[u8]) -> Option<ErrorFacts> {
    #[derive(Deserialize)]
    struct Failure<'a> {
        #[serde(borrow, rename = "type", default)]
        kind: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        response: Option<ResponseObject<'a>>,
        #[serde(borrow, default)]
        code: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        message: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        error: Option<ErrorObject<'a>>,
    }
    let failure: Failure<'_> = serde_json::from_slice(data).ok()?;
    let owned = |c: &Option<Cow<'_, str>>| c.as_deref().map(str::to_owned);
    if let Some(response) = &failure.response {
        if let Some(error) = &response.error {
            return Some(ErrorFacts {
                kind: owned(&error.kind),
                code: owned(&error.code),
                message: owned(&error.message),
                ..ErrorFacts::default()
            });
        }
        if response.status.as_deref() == Some("incomplete") {
            let reason = response
                .incomplete_details
                .as_ref()
                .and_then(|d| d.reason.as_deref())
                .unwrap_or("incomplete");
            return Some(ErrorFacts {
                code: Some(reason.to_owned()),
                message: Some(format!(
                    "the response is incomplete ({reason}) with no output"
                )),
                ..ErrorFacts::default()
            });
        }
    }
    if let Some(error) = &failure.error {
        return Some(ErrorFacts {
            kind: owned(&error.kind),
            code: owned(&error.code),
            message: owned(&error.message),
            ..ErrorFacts::default()
        });
    }
    (failure.kind.as_deref() == Some("error")).then(|| ErrorFacts {
        code: owned(&failure.code),
        message: owned(&failure.message),
        ..ErrorFacts::default()
    })
}

/// What a whole body that is a failed (or output-less incomplete)
/// response says.
pub(super) fn error_facts_of_body(body: &[u8]) -> Option<ErrorFacts> {
    let response: ResponseObject<'_> = serde_json::from_slice(body).ok()?;
    let failed = response.error.is_some()
        || (response.status.as_deref() == Some("incomplete") && !response.has_output());
    if !failed {
        return None;
    }
    let mut wrapped = Vec::with_capacity(body.len() + 16);
    wrapped.extend_from_slice(b"{\"response\":");
    wrapped.extend_from_slice(body);
    wrapped.push(b'}');
    error_facts(&wrapped)
}

/// The `code` of a response's `error`: one of the API's own
/// (`ResponseError.code`), so an SDK that validates strictly reads it.
fn response_error_code(class: FailureClass) -> &'static str {
    match class {
        FailureClass::RateLimited | FailureClass::QuotaExhausted => "rate_limit_exceeded",
        FailureClass::InvalidRequest | FailureClass::ContextLengthExceeded => "invalid_prompt",
        _ => "server_error",
    }
}

/// The frames that end a failed Responses stream, continuing its
/// `sequence_number` (`next`) in its response's identity.
///
/// - [`TerminalMode::Raise`]: `response.failed` (the documented end of a
///   failed response: same id, `status: "failed"`, an `error` with one of
///   the API's codes and the gateway's class, phase, bytes and output
///   events), then an `error` event. The SDKs raise only on an event whose
///   data has a top-level `error` object (Python's `Stream`, npm's
///   `Stream`), so the `error` event carries its documented fields and
///   that object too: both SDKs' plain iteration and their stream helpers
///   raise `APIError` with its message.
/// - [`TerminalMode::ErrorEventOnly`]: only that `error` event.
/// - [`TerminalMode::Finish`], for clients that must not raise:
///   `response.incomplete` with the gateway's finish reason as
///   `incomplete_details.reason` and the error under `stream_error`.
///
/// Its `output` is empty: the gateway does not keep the answer. A
/// stream helper that rebuilds its final response from this event (npm's)
/// loses the text it accumulated; plain iteration has every delta.
pub(super) fn terminal(
    next: u64,
    identity: &ChunkIdentity<'_>,
    finish_reason: &str,
    error: &TerminalError,
    mode: TerminalMode,
) -> Bytes {
    let code = response_error_code(error.class);
    let details = json!({
        "code": code,
        "message": error.message,
        "type": error.class.as_str(),
        "provider_code": error.provider_code,
        "phase": error.phase.as_str(),
        "bytes_sent": error.bytes_sent,
        "output_events": error.output_events,
    });
    let response = |status: &str, extra: (&str, Value)| {
        let mut response = json!({
            "id": identity.id.as_deref().unwrap_or(""),
            "object": "response",
            "created_at": identity.created.unwrap_or(0),
            "status": status,
            "model": identity.model.as_deref().unwrap_or(""),
            "output": [],
            "parallel_tool_calls": true,
            "tool_choice": "auto",
            "tools": [],
            "error": null,
            "incomplete_details": null,
        });
        response[extra.0] = extra.1;
        response
    };
    let mut out = Vec::with_capacity(1024);
    let mut sequence = next;
    let frame = |out: &mut Vec<u8>, kind: &str, data: &Value| {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        // Serializing a JSON value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, data);
        out.extend_from_slice(b"\n\n");
    };
    let error_event = |sequence: u64| {
        json!({
            "type": "error",
            "code": code,
            "message": error.message,
            "param": null,
            "sequence_number": sequence,
            "error": details,
        })
    };
    match mode {
        TerminalMode::Raise => {
            let failed = json!({
                "type": "response.failed",
                "sequence_number": sequence,
                "response": response("failed", ("error", details.clone())),
            });
            frame(&mut out, "response.failed", &failed);
            sequence += 1;
            frame(&mut out, "error", &error_event(sequence));
        }
        TerminalMode::ErrorEventOnly => frame(&mut out, "error", &error_event(sequence)),
        TerminalMode::Finish => {
            let mut incomplete = response(
                "incomplete",
                ("incomplete_details", json!({"reason": finish_reason})),
            );
            incomplete["stream_error"] = details.clone();
            let event = json!({
                "type": "response.incomplete",
                "sequence_number": sequence,
                "response": incomplete,
            });
            frame(&mut out, "response.incomplete", &event);
        }
    }
    Bytes::from(out)
}
