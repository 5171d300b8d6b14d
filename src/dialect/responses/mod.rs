//! The OpenAI Responses dialect: `/v1/responses` requests (`input` items,
//! `instructions`, provider-hosted tools, `previous_response_id`), typed
//! lifecycle event streams (`response.created` … `response.completed`),
//! `response` objects, and OpenAI's `{"error":{...}}` error bodies.

mod reply;
mod request;
mod stream;
mod translate;

use bytes::{Bytes, BytesMut};
use http::StatusCode;

pub use request::ResponsesRequest;

use super::{
    AnswerFacts, BodyCheck, Chunk, ChunkIdentity, Dialect, ErrorFacts, ErrorReply, ErrorSource,
    NeutralEvent, NeutralRequest, OpenAiChat, RequestError, Requirements, TerminalError,
    TerminalMode,
};
use crate::FailureClass;
use crate::sse::SseEvent;

/// What the Responses dialect keeps of one stream: the last
/// `sequence_number` read (a terminal event continues it) and, for
/// translation, what the stream written so far said.
#[derive(Debug, Default)]
pub struct ResponsesMemo {
    last_sequence: Option<u64>,
    translation: translate::StreamMemo,
}

impl ResponsesMemo {
    /// The `sequence_number` of the next event the client gets: after the
    /// last one read, or written by translation.
    fn next_sequence(&self) -> u64 {
        self.last_sequence
            .map_or(0, |s| s.saturating_add(1))
            .max(self.translation.next_sequence())
    }
}

/// The OpenAI Responses dialect (`POST /v1/responses`).
///
/// - **Requirements**: `input` (a string or items: messages, function
///   calls and their outputs, reasoning, item references) and
///   `instructions` for the estimate; image and file inputs; function
///   `tools` and `parallel_tool_calls`; provider-hosted tools by type
///   ([`Requirements::hosted_tools`]); `max_output_tokens`; `reasoning`
///   (an effort other than `none`, or a summary); `text.format` (JSON
///   schema or object); `stream`; `store` (default `true`);
///   `previous_response_id`, `conversation` or an `item_reference`
///   ([`Requirements::provider_state`]). Every other field passes to a
///   Responses target untouched.
/// - **Upstream**: the client's bytes with the target's `model` spliced in.
/// - **Events**: `response.created`, `response.in_progress`,
///   `response.queued`, and an `output_item.added`, `content_part.added` or
///   summary part that carries no text yet are preamble, held until
///   commit; a non-empty delta of any kind (`output_text`,
///   `function_call_arguments`, `refusal`, `reasoning_summary_text`,
///   `reasoning_text`, ...), an item or part that already carries output
///   (a function call names its tool), an annotation, and a `*.done` with
///   text are output, which commits. `response.completed` ends the stream
///   with its usage (finish reason `completed`), as does a
///   `response.incomplete` with output (its reason:
///   `max_output_tokens`, `content_filter`). `response.failed`, `error`,
///   and a `response.incomplete` with no output are in-band failures.
/// - **Terminal** after commit: `response.failed` in the stream's response
///   id, continuing its `sequence_number`, `status: "failed"`, its `error`
///   carrying one of the API's codes and the gateway's class, phase, bytes
///   and output events sent; then an `error` event that both official
///   SDKs raise `APIError` on (see [`TerminalMode`]).
/// - **Whole answers**: a `response` object, `completed` (or `incomplete`
///   with output), with an `output` array; usage from `usage`.
/// - **Errors**: OpenAI's `{"error":{"message","type","param","code"}}`,
///   as for chat completions.
///
/// ```
/// use bytes::Bytes;
/// use tower_llm_failover::dialect::{ChunkKind, Dialect, OpenAiResponses};
/// use tower_llm_failover::sse::{SseItem, SseScanner};
///
/// let wire = Bytes::from_static(
///     b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n\
///       event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"content\":[]}}\n\n\
///       event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n\
///       event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
/// );
/// let mut kinds = Vec::new();
/// let mut memo = Default::default();
/// SseScanner::new().feed(&wire, |item| {
///     if let SseItem::Event(event) = item {
///         kinds.push(OpenAiResponses.inspect(&event, &mut memo).kind);
///     }
/// });
/// use ChunkKind::*;
/// assert_eq!(kinds, [Preamble, Preamble, Output, Done]);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenAiResponses;

impl Dialect for OpenAiResponses {
    type Request = ResponsesRequest;
    type Memo = ResponsesMemo;

    fn read_request(&self, body: Bytes) -> Result<(Requirements, ResponsesRequest), RequestError> {
        request::read(body)
    }

    fn upstream_body(&self, request: &ResponsesRequest, model: &str) -> Bytes {
        request::upstream_body(request, model)
    }

    fn inspect<'a>(&self, event: &'a SseEvent, memo: &mut ResponsesMemo) -> Chunk<'a> {
        stream::inspect(event, memo)
    }

    fn terminal(
        &self,
        identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes {
        stream::terminal(0, identity, finish_reason, error, mode)
    }

    fn stream_terminal(
        &self,
        memo: &ResponsesMemo,
        identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes {
        stream::terminal(memo.next_sequence(), identity, finish_reason, error, mode)
    }

    /// A Responses stream ends with `response.completed`, which only the
    /// provider can write (it carries the whole response): no frame of the
    /// gateway's stands in for it.
    fn done_frame(&self) -> Bytes {
        Bytes::new()
    }

    fn error_facts(&self, source: ErrorSource<'_>) -> Option<ErrorFacts> {
        match source {
            ErrorSource::Event(event) => stream::error_facts(event.data()),
            ErrorSource::Body(body) => stream::error_facts_of_body(body),
        }
    }

    fn check_answer(&self, body: &[u8]) -> (BodyCheck, AnswerFacts) {
        reply::check_answer(body)
    }

    fn error_body(&self, error: &ErrorReply<'_>) -> Bytes {
        OpenAiChat.error_body(error)
    }

    fn error_status(&self, class: FailureClass, status: StatusCode) -> StatusCode {
        OpenAiChat.error_status(class, status)
    }

    fn name(&self) -> &'static str {
        "openai-responses"
    }

    fn upstream_path(&self) -> Option<&'static str> {
        Some("/v1/responses")
    }

    fn to_neutral(&self, request: &ResponsesRequest) -> Result<NeutralRequest, String> {
        translate::to_neutral(request)
    }

    fn body_from_neutral(&self, request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
        translate::body_from_neutral(request, model)
    }

    fn decode_event(
        &self,
        event: &SseEvent,
        memo: &mut ResponsesMemo,
        out: &mut Vec<NeutralEvent>,
    ) {
        translate::decode_event(event, &mut memo.translation, out);
    }

    fn encode_event(&self, event: &NeutralEvent, memo: &mut ResponsesMemo, out: &mut BytesMut) {
        translate::encode_event(event, &mut memo.translation, out);
    }

    fn encoded_identity<'m>(&self, memo: &'m ResponsesMemo) -> ChunkIdentity<'m> {
        memo.translation.identity()
    }

    fn decode_answer(&self, body: &[u8]) -> Option<Vec<NeutralEvent>> {
        translate::decode_answer(body)
    }

    fn encode_answer(&self, events: &[NeutralEvent]) -> Option<Bytes> {
        translate::encode_answer(events)
    }
}
