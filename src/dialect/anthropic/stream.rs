//! Messages event streams: what each event is, and the frames the gateway
//! writes to end one.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;

use super::reply::error_type;
use crate::sse::SseEvent;
use crate::{
    Usage, dialect::Chunk, dialect::ChunkIdentity, dialect::ChunkKind, dialect::TerminalError,
    dialect::TerminalMode,
};

/// The end of a successful stream.
pub(super) const MESSAGE_STOP: &[u8] =
    b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

/// One event's data, borrowed from it: only what classification reads.
/// Every Messages event is an object with a `type`.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    /// `message_start`'s message.
    #[serde(borrow, default)]
    message: Option<StartMessage<'a>>,
    /// `content_block_start`'s block.
    #[serde(borrow, default)]
    content_block: Option<BlockStart<'a>>,
    /// `message_delta`'s delta (`content_block_delta`'s is never read:
    /// any content delta is output).
    #[serde(borrow, default)]
    delta: Option<MessageDelta<'a>>,
    /// `message_delta`'s usage.
    #[serde(default)]
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
struct StartMessage<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<RawUsage>,
}

#[derive(Deserialize)]
struct BlockStart<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct MessageDelta<'a> {
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
}

/// Anthropic's usage object. Input is counted with the prompt cache's
/// reads and writes: every input token the provider processed.
#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

impl RawUsage {
    fn usage(&self) -> Usage {
        let input = [
            self.input_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ]
        .into_iter()
        .flatten()
        .fold(0u64, u64::saturating_add);
        Usage::new(input, self.output_tokens.unwrap_or(0))
    }
}

/// Reads one dispatched event of a Messages stream.
///
/// The SDKs dispatch on the SSE event name; a stream without names is read
/// by its data's `type`, which Anthropic always sends as well. When both
/// are there they must agree: an event named one thing whose data says
/// another would be read one way here and another way by some client, so
/// it is malformed.
pub(super) fn inspect(event: &SseEvent) -> Chunk<'_> {
    if event.is_named("error") {
        return Chunk::of(ChunkKind::Error);
    }
    let Ok(data) = serde_json::from_slice::<Event<'_>>(event.data()) else {
        return Chunk::of(ChunkKind::Malformed);
    };
    let kind = data.kind.as_bytes();
    if event
        .event()
        .is_some_and(|name| name != b"message" && name != kind)
    {
        return Chunk::of(ChunkKind::Malformed);
    }
    match kind {
        b"message_start" => {
            let Some(message) = data.message else {
                return Chunk::of(ChunkKind::Malformed);
            };
            Chunk {
                usage: message.usage.as_ref().map(RawUsage::usage),
                identity: ChunkIdentity {
                    id: message.id,
                    model: message.model,
                    created: None,
                },
                ..Chunk::of(ChunkKind::Preamble)
            }
        }
        b"content_block_start" => match data.content_block {
            // An empty text or thinking block only announces output.
            Some(block) if empty_start(&block) => Chunk::of(ChunkKind::Preamble),
            // A tool call's name, a non-empty block, a server tool's result.
            Some(_) => Chunk::of(ChunkKind::Output),
            None => Chunk::of(ChunkKind::Malformed),
        },
        b"content_block_delta" => Chunk::of(ChunkKind::Output),
        b"message_delta" => {
            let finish_reason = data.delta.and_then(|d| d.stop_reason);
            Chunk {
                kind: if finish_reason.is_some() {
                    ChunkKind::Output
                } else {
                    ChunkKind::Preamble
                },
                finish_reason,
                usage: data.usage.as_ref().map(RawUsage::usage),
                identity: ChunkIdentity::default(),
            }
        }
        b"message_stop" => Chunk::of(ChunkKind::Done),
        b"error" => Chunk::of(ChunkKind::Error),
        // `ping`, `content_block_stop`, and event types added later: the
        // SDKs skip what they do not know.
        _ => Chunk::of(ChunkKind::Preamble),
    }
}

fn empty_start(block: &BlockStart<'_>) -> bool {
    match &*block.kind {
        "text" => block.text.as_deref().is_none_or(str::is_empty),
        "thinking" => block.thinking.as_deref().is_none_or(str::is_empty),
        _ => false,
    }
}

/// The frames that end a failed Messages stream.
///
/// Anthropic has no error `stop_reason`, and `message_stop` means success,
/// so a failure is an `event: error` (the SDKs raise on it) and nothing
/// after it. [`TerminalMode::Finish`], for clients that must not
/// raise, ends the message instead: a `message_delta` whose `stop_reason`
/// is the gateway's finish reason (`"error"`), the error under
/// `stream_error`, then `message_stop`. Its `usage` is an empty object: the
/// gateway does not know the output token count (output *events* are not
/// tokens), and the SDKs' stream helpers read `event.usage.output_tokens`
/// unconditionally, so a missing `usage` would make them raise.
pub(super) fn terminal(finish_reason: &str, error: &TerminalError, mode: TerminalMode) -> Bytes {
    #[derive(serde::Serialize)]
    struct ErrorBody<'a> {
        #[serde(rename = "type")]
        error_type: &'a str,
        message: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<&'a str>,
        phase: &'a str,
        bytes_sent: u64,
        output_events: u64,
    }
    let body = ErrorBody {
        error_type: error_type(error.class),
        message: &error.message,
        code: error.provider_code.as_deref(),
        phase: error.phase.as_str(),
        bytes_sent: error.bytes_sent,
        output_events: error.output_events,
    };
    let mut out = Vec::with_capacity(384);
    let written = match mode {
        TerminalMode::Raise | TerminalMode::ErrorEventOnly => {
            out.extend_from_slice(b"event: error\ndata: ");
            serde_json::to_writer(
                &mut out,
                &serde_json::json!({"type": "error", "error": body}),
            )
        }
        TerminalMode::Finish => {
            out.extend_from_slice(b"event: message_delta\ndata: ");
            serde_json::to_writer(
                &mut out,
                &serde_json::json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": finish_reason, "stop_sequence": null},
                    // No count claimed; see the doc comment.
                    "usage": {},
                    "stream_error": body,
                }),
            )
        }
    };
    // Serializing strings and integers into a Vec cannot fail; should it
    // ever, a bare error event still ends the stream.
    if written.is_err() {
        out.clear();
        out.extend_from_slice(
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"stream failed\"}}",
        );
    }
    out.extend_from_slice(b"\n\n");
    if mode == TerminalMode::Finish && written.is_ok() {
        out.extend_from_slice(MESSAGE_STOP);
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{SseItem, SseScanner};

    fn kind_of(wire: &str) -> ChunkKind {
        let mut kinds = Vec::new();
        SseScanner::new().feed(&Bytes::copy_from_slice(wire.as_bytes()), |item| {
            if let SseItem::Event(event) = item {
                kinds.push(inspect(&event).kind);
            }
        });
        assert_eq!(kinds.len(), 1, "{wire}");
        kinds[0]
    }

    #[test]
    fn an_event_name_and_data_type_that_disagree_are_malformed() {
        // Named as preamble, typed as output: either reading is a guess.
        assert_eq!(
            kind_of(
                "event: ping\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n"
            ),
            ChunkKind::Malformed
        );
        // Named as output, typed as preamble.
        assert_eq!(
            kind_of("event: content_block_delta\ndata: {\"type\":\"ping\"}\n\n"),
            ChunkKind::Malformed
        );
        // Named as the end, typed as something else.
        assert_eq!(
            kind_of(
                "event: message_stop\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n"
            ),
            ChunkKind::Malformed
        );
        // Agreeing, unnamed, or the default `message` name: read by `type`.
        assert_eq!(
            kind_of("event: ping\ndata: {\"type\":\"ping\"}\n\n"),
            ChunkKind::Preamble
        );
        assert_eq!(
            kind_of("event: message\ndata: {\"type\":\"message_stop\"}\n\n"),
            ChunkKind::Done
        );
        assert_eq!(
            kind_of(
                "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n"
            ),
            ChunkKind::Output
        );
        // `event: error` is an error whatever its data says.
        assert_eq!(
            kind_of("event: error\ndata: {\"type\":\"ping\"}\n\n"),
            ChunkKind::Error
        );
    }

    #[test]
    fn the_quiet_terminal_claims_no_output_token_count() {
        let error = TerminalError {
            bytes_sent: 1234,
            output_events: 40,
            ..TerminalError::new(
                crate::FailureClass::Overloaded,
                crate::Phase::Committed,
                "Overloaded",
            )
        };
        let frames = terminal("error", &error, TerminalMode::Finish);
        let text = std::str::from_utf8(&frames).unwrap();
        let prefix = "event: message_delta\ndata: ";
        let at = text.find(prefix).unwrap() + prefix.len();
        let end = text[at..].find("\n\n").unwrap() + at;
        let delta: serde_json::Value = serde_json::from_str(&text[at..end]).unwrap();
        // 40 output events are not 40 tokens: no count at all, but still
        // a `usage` object for the SDK helpers that read through it.
        assert_eq!(delta["usage"], serde_json::json!({}), "{delta}");
        assert_eq!(delta["stream_error"]["output_events"], 40);
        assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
    }
}
