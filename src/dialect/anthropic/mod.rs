//! The Anthropic Messages dialect: `/v1/messages` requests, typed event
//! streams (`message_start` … `message_stop`), `message` bodies and
//! `{"type":"error","error":{...}}` error bodies.

mod reply;
mod request;
mod stream;
mod translate;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};

pub use request::MessagesRequest;

use super::{
    AnswerFacts, BodyCheck, Chunk, ChunkIdentity, Dialect, ErrorReply, RequestError, Requirements,
    TerminalError, TerminalMode,
};
use super::{NeutralEvent, NeutralRequest};
use crate::FailureClass;
use crate::sse::SseEvent;

/// What the Messages dialect keeps of one stream: nothing for reading
/// event kinds; for translation, which content blocks are open and what
/// the stream written so far said.
#[derive(Debug, Default)]
pub struct MessagesMemo {
    translation: translate::StreamMemo,
}

/// Anthropic's status for an overloaded API, which its SDKs raise as
/// `OverloadedError`.
const OVERLOADED: u16 = 529;

/// The Anthropic Messages dialect.
///
/// - **Requirements**: `tools` (and `tool_choice`'s
///   `disable_parallel_tool_use`), image and document blocks, `max_tokens`,
///   `thinking`, `stream`. A stream always reports usage.
/// - **Upstream**: the client's bytes with the target's `model` spliced
///   in; `anthropic-version` `2023-06-01` when the header policy forwarded
///   none. The client's `anthropic-version` and `anthropic-beta` cross as
///   the header policy says (betas through its allow-list).
/// - **Events**: `message_start`, `ping`, `content_block_stop` and the
///   `content_block_start` of an empty text or thinking block are preamble;
///   any `content_block_delta`, any other `content_block_start` (a
///   `tool_use` or `server_tool_use` names a tool) and a `message_delta`
///   with a `stop_reason` are output, which commits the stream;
///   `message_stop` ends it; `event: error` is an in-band error. Usage is
///   read from `message_start` and `message_delta`.
/// - **Terminal**: a failure after commit ends with `event: error` (the
///   SDKs raise `APIStatusError` / `APIError` on it), its error carrying
///   the phase, the bytes and the output events sent before it; nothing
///   follows it.
/// - **Errors**: `{"type":"error","error":{"type","message"}}` with
///   Anthropic's types; an overloaded answer is a 529.
///
/// ```
/// use bytes::Bytes;
/// use tower_llm_failover::dialect::{AnthropicMessages, ChunkKind, Dialect};
/// use tower_llm_failover::sse::{SseItem, SseScanner};
///
/// let wire = Bytes::from_static(
///     b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-x\",\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n\
///       event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
///       event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
///       event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
/// );
/// let mut kinds = Vec::new();
/// SseScanner::new().feed(&wire, |item| {
///     if let SseItem::Event(event) = item {
///         kinds.push(AnthropicMessages.inspect(&event, &mut Default::default()).kind);
///     }
/// });
/// use ChunkKind::*;
/// assert_eq!(kinds, [Preamble, Preamble, Output, Done]);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct AnthropicMessages;

impl Dialect for AnthropicMessages {
    type Request = MessagesRequest;
    type Memo = MessagesMemo;

    fn read_request(&self, body: Bytes) -> Result<(Requirements, MessagesRequest), RequestError> {
        request::read(body)
    }

    fn upstream_body(&self, request: &MessagesRequest, model: &str) -> Bytes {
        request::upstream_body(request, model)
    }

    fn forwarded_request_headers(&self) -> &'static [&'static str] {
        &["anthropic-version", "anthropic-beta"]
    }

    fn upstream_headers(&self, client: &HeaderMap, upstream: &mut HeaderMap) {
        request::upstream_headers(client, upstream);
    }

    fn inspect<'a>(&self, event: &'a SseEvent, _memo: &mut MessagesMemo) -> Chunk<'a> {
        stream::inspect(event)
    }

    fn terminal(
        &self,
        _identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes {
        stream::terminal(finish_reason, error, mode)
    }

    fn done_frame(&self) -> Bytes {
        Bytes::from_static(stream::MESSAGE_STOP)
    }

    fn check_answer(&self, body: &[u8]) -> (BodyCheck, AnswerFacts) {
        reply::check_answer(body)
    }

    fn error_body(&self, error: &ErrorReply<'_>) -> Bytes {
        reply::error_body(error)
    }

    fn error_status(&self, class: FailureClass, status: StatusCode) -> StatusCode {
        if class == FailureClass::Overloaded && status == StatusCode::SERVICE_UNAVAILABLE {
            StatusCode::from_u16(OVERLOADED).unwrap_or(status)
        } else {
            status
        }
    }

    fn name(&self) -> &'static str {
        "anthropic-messages"
    }

    fn upstream_path(&self) -> Option<&'static str> {
        Some("/v1/messages")
    }

    fn to_neutral(&self, request: &MessagesRequest) -> Result<NeutralRequest, String> {
        translate::to_neutral(request)
    }

    fn body_from_neutral(&self, request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
        translate::body_from_neutral(request, model)
    }

    fn decode_event(&self, event: &SseEvent, memo: &mut MessagesMemo, out: &mut Vec<NeutralEvent>) {
        translate::decode_event(event, &mut memo.translation, out);
    }

    fn encode_event(&self, event: &NeutralEvent, memo: &mut MessagesMemo, out: &mut BytesMut) {
        translate::encode_event(event, &mut memo.translation, out);
    }

    fn encoded_identity<'m>(&self, memo: &'m MessagesMemo) -> ChunkIdentity<'m> {
        memo.translation.identity()
    }

    fn decode_answer(&self, body: &[u8]) -> Option<Vec<NeutralEvent>> {
        translate::decode_answer(body)
    }

    fn encode_answer(&self, events: &[NeutralEvent]) -> Option<Bytes> {
        Some(translate::encode_answer(events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Phase;
    use crate::sse::{SseItem, SseScanner};
    use crate::{Usage, dialect::BodyFault, dialect::ChunkKind};

    /// (event name, kind, finish reason, usage) of every event.
    type Read = (String, ChunkKind, Option<String>, Option<Usage>);

    fn read_all(wire: &str) -> Vec<Read> {
        let mut out = Vec::new();
        SseScanner::new().feed(&Bytes::copy_from_slice(wire.as_bytes()), |item| {
            if let SseItem::Event(event) = item {
                let chunk = AnthropicMessages.inspect(&event, &mut Default::default());
                let name = String::from_utf8_lossy(event.event().unwrap_or(b"")).into_owned();
                out.push((
                    name,
                    chunk.kind,
                    chunk.finish_reason.map(|f| f.into_owned()),
                    chunk.usage,
                ));
            }
        });
        out
    }

    fn kinds(reads: &[Read]) -> Vec<ChunkKind> {
        reads.iter().map(|r| r.1).collect()
    }

    use ChunkKind::{Done, Error, Output, Preamble};

    #[test]
    fn a_text_answer() {
        let reads = read_all(include_str!("fixtures/text.sse"));
        assert_eq!(
            kinds(&reads),
            [
                Preamble, Preamble, Preamble, Output, Output, Preamble, Output, Done
            ]
        );
        assert_eq!(reads[0].3, Some(Usage::new(25, 1)));
        assert_eq!(reads[6].2.as_deref(), Some("end_turn"));
        assert_eq!(reads[6].3, Some(Usage::new(0, 15)));
    }

    #[test]
    fn a_tool_use_answer_commits_on_the_tool_name() {
        let reads = read_all(include_str!("fixtures/tool_use.sse"));
        assert_eq!(
            kinds(&reads),
            [
                Preamble, Preamble, Preamble, Output, Preamble, Output, Output, Output, Output,
                Preamble, Output, Done
            ]
        );
        assert_eq!(reads[5].0, "content_block_start");
        assert_eq!(reads[10].2.as_deref(), Some("tool_use"));
        assert_eq!(reads[0].3, Some(Usage::new(472, 2)));
    }

    #[test]
    fn thinking_is_output() {
        let reads = read_all(include_str!("fixtures/thinking.sse"));
        assert_eq!(
            kinds(&reads),
            [
                Preamble, Preamble, Output, Output, Output, Preamble, Preamble, Output, Preamble,
                Output, Done
            ]
        );
    }

    #[test]
    fn overloaded_after_message_start_is_an_error_before_any_output() {
        let reads = read_all(include_str!("fixtures/overloaded_after_start.sse"));
        assert_eq!(kinds(&reads), [Preamble, Preamble, Error]);
    }

    #[test]
    fn overloaded_after_forty_deltas() {
        let reads = read_all(include_str!("fixtures/overloaded_after_40_deltas.sse"));
        assert_eq!(reads.len(), 43);
        assert_eq!(reads.iter().filter(|r| r.1 == Output).count(), 40);
        assert_eq!(
            reads[..2].iter().map(|r| r.1).collect::<Vec<_>>(),
            [Preamble, Preamble]
        );
        assert_eq!(reads[42].1, Error);
    }

    #[test]
    fn edge_events() {
        let cases: &[(&str, ChunkKind)] = &[
            // A stream without event names is read by `type`.
            (
                "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n",
                Output,
            ),
            ("data: {\"type\":\"message_stop\"}\n\n", Done),
            (
                "data: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"m\"}}\n\n",
                Error,
            ),
            // An error event whose data does not parse is still an error.
            ("event: error\ndata: {\"type\": \"err\n\n", Error),
            (
                "event: content_block_delta\ndata: {\"type\":\n\n",
                ChunkKind::Malformed,
            ),
            (
                "event: content_block_delta\ndata: [1]\n\n",
                ChunkKind::Malformed,
            ),
            (
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"server_tool_use\",\"id\":\"srvtoolu_1\",\"name\":\"web_search\",\"input\":{}}}\n\n",
                Output,
            ),
            (
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"pre\"}}\n\n",
                Output,
            ),
            (
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"citations_delta\",\"citation\":{\"type\":\"char_location\",\"cited_text\":\"x\"}}}\n\n",
                Output,
            ),
            // A message_delta without a stop reason commits nothing.
            (
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"output_tokens\":3}}\n\n",
                Preamble,
            ),
            (
                "event: future_event\ndata: {\"type\":\"future_event\"}\n\n",
                Preamble,
            ),
            (
                "event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
                ChunkKind::Malformed,
            ),
        ];
        for (wire, kind) in cases {
            let reads = read_all(wire);
            assert_eq!(reads.len(), 1, "{wire}");
            assert_eq!(reads[0].1, *kind, "{wire}");
        }
    }

    #[test]
    fn cached_input_counts_as_input() {
        let reads = read_all(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\",\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":1000,\"output_tokens\":1}}}\n\n",
        );
        assert_eq!(reads[0].3, Some(Usage::new(1105, 1)));
    }

    fn data_of(frame: &str, event: &str) -> serde_json::Value {
        let prefix = format!("event: {event}\ndata: ");
        let at = frame.find(&prefix).unwrap() + prefix.len();
        let end = frame[at..].find("\n\n").unwrap() + at;
        serde_json::from_str(&frame[at..end]).unwrap()
    }

    #[test]
    fn the_terminal_event_is_an_error_event_and_nothing_after_it() {
        let error = TerminalError {
            provider_code: Some("overloaded_error".to_owned()),
            bytes_sent: 1234,
            output_events: 40,
            ..TerminalError::new(FailureClass::Overloaded, Phase::Committed, "Overloaded")
        };
        for mode in [TerminalMode::Raise, TerminalMode::ErrorEventOnly] {
            let frames =
                AnthropicMessages.terminal(&ChunkIdentity::default(), "error", &error, mode);
            let text = std::str::from_utf8(&frames).unwrap();
            assert!(text.starts_with("event: error\ndata: "), "{text}");
            assert!(text.ends_with("\n\n") && text.matches("\n\n").count() == 1);
            assert!(!text.contains("message_stop"));
            let json = data_of(text, "error");
            assert_eq!(json["type"], "error");
            assert_eq!(json["error"]["type"], "overloaded_error");
            assert_eq!(json["error"]["message"], "Overloaded");
            assert_eq!(json["error"]["phase"], "committed");
            assert_eq!(json["error"]["bytes_sent"], 1234);
            assert_eq!(json["error"]["output_events"], 40);
        }
        let quiet = AnthropicMessages.terminal(
            &ChunkIdentity::default(),
            "error",
            &error,
            TerminalMode::Finish,
        );
        let quiet = std::str::from_utf8(&quiet).unwrap();
        let delta = data_of(quiet, "message_delta");
        assert_eq!(delta["delta"]["stop_reason"], "error");
        assert_eq!(delta["stream_error"]["type"], "overloaded_error");
        assert!(quiet.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
        assert!(!quiet.contains("event: error"));
    }

    #[test]
    fn error_bodies_have_the_sdk_shape_and_status() {
        let body = AnthropicMessages.error_body(&ErrorReply::coded(
            FailureClass::Overloaded,
            "no_available_target",
            "none left",
        ));
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "none left", "code": "no_available_target"}})
        );
        for (class, kind) in [
            (FailureClass::InvalidRequest, "invalid_request_error"),
            (FailureClass::ContextLengthExceeded, "invalid_request_error"),
            (FailureClass::PayloadTooLarge, "request_too_large"),
            (FailureClass::RateLimited, "rate_limit_error"),
            (FailureClass::ModelNotFound, "not_found_error"),
            (FailureClass::Auth, "api_error"),
            (FailureClass::ServerError, "api_error"),
            (FailureClass::Timeout, "timeout_error"),
        ] {
            let body = AnthropicMessages.error_body(&ErrorReply::new(class, "m"));
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(json["error"]["type"], kind, "{class}");
        }
        let overloaded = AnthropicMessages
            .error_status(FailureClass::Overloaded, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(overloaded.as_u16(), 529);
        assert_eq!(
            AnthropicMessages
                .error_status(FailureClass::RateLimited, StatusCode::TOO_MANY_REQUESTS),
            StatusCode::TOO_MANY_REQUESTS
        );
    }

    #[test]
    fn whole_messages_are_checked_and_read() {
        let ok = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":3}}"#;
        assert_eq!(
            AnthropicMessages.check_answer(ok),
            (
                BodyCheck::Valid {
                    usage: Some(Usage::new(15, 3)),
                    model: Some("claude-x".to_owned()),
                },
                AnswerFacts {
                    id: Some("msg_1".to_owned()),
                    finish_reason: Some("end_turn".to_owned())
                }
            )
        );
        let empty_after_tool = br#"{"type":"message","content":[],"stop_reason":"end_turn"}"#;
        assert!(matches!(
            AnthropicMessages.check_answer(empty_after_tool).0,
            BodyCheck::Valid { .. }
        ));
        for (bad, fault) in [
            (&br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#[..], BodyFault::NoAnswer),
            (br#"{"type":"message","content":[{"type":"text","text":"cut"}],"stop_reason":null}"#, BodyFault::NoAnswer),
            (br#"{"type":"message","stop_reason":"end_turn"}"#, BodyFault::NoAnswer),
            (br#"{"type":"completion","content":[],"stop_reason":"end_turn"}"#, BodyFault::NoAnswer),
            (br#"{"type":"message","content":[{"type":"te"#, BodyFault::NotJson),
            (br#"[{"type":"message"}]"#, BodyFault::UnexpectedJson),
            (b"not json", BodyFault::NotJson),
        ] {
            match AnthropicMessages.check_answer(bad).0 {
                BodyCheck::Invalid { fault: got, .. } => {
                    assert_eq!(got, fault, "{}", String::from_utf8_lossy(bad))
                }
                other => panic!("{other:?} for {}", String::from_utf8_lossy(bad)),
            }
        }
    }
}
