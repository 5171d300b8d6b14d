use bytes::Bytes;
use serde::Serialize;

#[cfg(test)]
use super::skim::skim;
use super::skim::{ChoiceSet, ChunkPrefix, Invalid, Skim, skim_next};
use crate::dialect::{Chunk, ChunkIdentity, ChunkKind, TerminalError, TerminalMode};
use crate::sse::SseEvent;

pub(super) const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";

/// Reads the data of a `message` or `error` event (not `[DONE]`), with no
/// memo: the reference the memo-resuming read is tested against.
#[cfg(test)]
pub(super) fn read_chunk(error_event: bool, data: &[u8]) -> Chunk<'_> {
    chunk_of(error_event, skim(data))
}

/// Reads the data of a `message` or `error` event as [`read_chunk`] does,
/// resuming after the text it shares with the stream's last valid chunk,
/// and adds the choices it carries (and finishes) to the stream's.
pub(super) fn read_chunk_next<'a>(
    error_event: bool,
    data: &'a [u8],
    prefix: &mut ChunkPrefix,
    choices: &mut ChoiceSet,
) -> Chunk<'a> {
    let skimmed = skim_next(data, prefix);
    if let Ok(skim) = &skimmed {
        choices.add(skim.choices);
    }
    chunk_of(error_event, skimmed)
}

/// What a skim says, as a chunk.
fn chunk_of(error_event: bool, skimmed: Result<Skim<'_>, Invalid>) -> Chunk<'_> {
    let Ok(skim) = skimmed else {
        return Chunk::of(if error_event {
            ChunkKind::Error
        } else {
            ChunkKind::Malformed
        });
    };
    let kind = if error_event || skim.error {
        ChunkKind::Error
    } else if skim.output {
        ChunkKind::Output
    } else {
        ChunkKind::Preamble
    };
    Chunk {
        kind,
        finish_reason: skim.finish_reason,
        usage: skim.usage,
        identity: ChunkIdentity {
            id: skim.id,
            model: skim.model,
            created: skim.created,
        },
    }
}

/// Reads one dispatched event of a chat chunk stream, with no memo.
#[cfg(test)]
pub(super) fn inspect(event: &SseEvent) -> Chunk<'_> {
    match chunk_data(event) {
        Ok((error_event, data)) => read_chunk(error_event, data),
        Err(kind) => Chunk::of(kind),
    }
}

/// Reads one dispatched event of a chat chunk stream as [`inspect`] does,
/// resuming after the text it shares with the stream's last chunk, and
/// keeps which choices appeared and finished.
pub(super) fn inspect_next<'a>(
    event: &'a SseEvent,
    prefix: &mut ChunkPrefix,
    choices: &mut ChoiceSet,
) -> Chunk<'a> {
    match chunk_data(event) {
        Ok((error_event, data)) => read_chunk_next(error_event, data, prefix, choices),
        Err(kind) => Chunk::of(kind),
    }
}

/// The data of an event that carries a chunk (and whether it is an
/// `error` event), or the kind of any other event.
fn chunk_data(event: &SseEvent) -> Result<(bool, &[u8]), ChunkKind> {
    let data = event.data().as_ref();
    if data.starts_with(b"[DONE]") {
        return Err(ChunkKind::Done);
    }
    let error_event = event.is_named("error");
    if !error_event && !event.is_named("message") {
        // Unknown event types carry nothing a chat client reads.
        return Err(ChunkKind::Preamble);
    }
    Ok((error_event, data))
}

/// The frames that end a failed chat chunk stream.
pub(super) fn terminal(
    identity: &ChunkIdentity<'_>,
    finish_reason: &str,
    error: &TerminalError,
    mode: TerminalMode,
) -> Bytes {
    {
        #[derive(Serialize)]
        struct ErrorBody<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            error_type: &'a str,
            param: Option<()>,
            code: &'a str,
            phase: &'a str,
            bytes_sent: u64,
            output_events: u64,
        }
        #[derive(Serialize)]
        struct Delta {}
        #[derive(Serialize)]
        struct Choice<'a> {
            index: u32,
            delta: Delta,
            finish_reason: &'a str,
        }
        #[derive(Serialize)]
        struct TerminalChunk<'a> {
            id: &'a str,
            object: &'static str,
            created: i64,
            model: &'a str,
            choices: [Choice<'a>; 1],
            #[serde(skip_serializing_if = "Option::is_none")]
            error: Option<&'a ErrorBody<'a>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            stream_error: Option<&'a ErrorBody<'a>>,
        }
        #[derive(Serialize)]
        struct ErrorEvent<'a> {
            error: &'a ErrorBody<'a>,
        }

        let code = super::reply::error_code(error.class, error.provider_code.as_deref());
        let body = ErrorBody {
            message: &error.message,
            error_type: super::reply::error_type(error.class),
            param: None,
            code: &code,
            phase: error.phase.as_str(),
            bytes_sent: error.bytes_sent,
            output_events: error.output_events,
        };
        let mut out = Vec::with_capacity(512);
        let written = if mode == TerminalMode::ErrorEventOnly {
            out.extend_from_slice(b"event: error\ndata: ");
            serde_json::to_writer(&mut out, &ErrorEvent { error: &body })
        } else {
            out.extend_from_slice(b"data: ");
            let chunk = TerminalChunk {
                id: identity.id.as_deref().unwrap_or("chatcmpl-gateway-error"),
                object: "chat.completion.chunk",
                created: identity.created.unwrap_or(0),
                model: identity.model.as_deref().unwrap_or(""),
                choices: [Choice {
                    index: 0,
                    delta: Delta {},
                    finish_reason,
                }],
                error: (mode == TerminalMode::Raise).then_some(&body),
                stream_error: (mode == TerminalMode::Finish).then_some(&body),
            };
            serde_json::to_writer(&mut out, &chunk)
        };
        // Serializing plain strings and integers into a Vec cannot fail;
        // should it ever, a bare error frame still ends the stream.
        if written.is_err() {
            out.clear();
            out.extend_from_slice(b"data: {\"error\":{\"message\":\"stream failed\"}}");
        }
        out.extend_from_slice(b"\n\n");
        if mode != TerminalMode::ErrorEventOnly {
            out.extend_from_slice(DONE_FRAME);
        }
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Usage;
    use crate::sse::{SseItem, SseScanner};

    fn inspect_all(wire: &'static str) -> Vec<(ChunkKind, Option<String>, Option<Usage>)> {
        let mut out = Vec::new();
        SseScanner::new().feed(&Bytes::from_static(wire.as_bytes()), |item| {
            if let SseItem::Event(event) = item {
                let chunk = inspect(&event);
                out.push((
                    chunk.kind,
                    chunk.finish_reason.map(|f| f.into_owned()),
                    chunk.usage,
                ));
            }
        });
        out
    }

    #[test]
    fn classifies_every_kind_of_chunk() {
        let cases: &[(&'static str, ChunkKind, Option<&str>)] = &[
            (
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"finish_reason\":null}]}\n\n",
                ChunkKind::Preamble,
                None,
            ),
            (
                "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n",
                ChunkKind::Output,
                None,
            ),
            (
                "data: {\"choices\":[{\"delta\":{\"content\":\"\\n\"}}]}\n\n",
                ChunkKind::Output,
                None,
            ),
            (
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}}]}\n\n",
                ChunkKind::Output,
                None,
            ),
            (
                "data: {\"choices\":[{\"delta\":{\"refusal\":\"no\"}}]}\n\n",
                ChunkKind::Output,
                None,
            ),
            (
                "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n",
                ChunkKind::Output,
                None,
            ),
            (
                "data: {\"choices\":[{\"delta\":{\"reasoning\":\"hm\"}}]}\n\n",
                ChunkKind::Output,
                None,
            ),
            (
                "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
                ChunkKind::Preamble,
                Some("stop"),
            ),
            (
                "data: {\"choices\":[],\"prompt_filter_results\":[]}\n\n",
                ChunkKind::Preamble,
                None,
            ),
            ("data: [DONE]\n\n", ChunkKind::Done, None),
            (
                "data: {\"choices\":[{\"delta\":{\"content\":\"x\"\n\n",
                ChunkKind::Malformed,
                None,
            ),
            ("data: not json\n\n", ChunkKind::Malformed, None),
            (
                "data: {\"error\":{\"message\":\"The server had an error while processing your request.\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n",
                ChunkKind::Error,
                None,
            ),
            (
                "data: {\"id\":\"cmpl-abc123\",\"object\":\"chat.completion.chunk\",\"created\":1234567890,\"model\":\"gpt-3.5-turbo\",\"provider\":\"openai\",\"error\":{\"code\":\"server_error\",\"message\":\"Provider disconnected unexpectedly\"},\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":\"error\"}]}\n\n",
                ChunkKind::Error,
                Some("error"),
            ),
            (
                "event: error\ndata: {\"type\": \"error\", \"error\": {\"type\": \"overloaded_error\", \"message\": \"Overloaded\"}}\n\n",
                ChunkKind::Error,
                None,
            ),
            (
                "data: {\"error\":{\"code\":503,\"message\":\"The model is overloaded. Please try again later.\",\"status\":\"UNAVAILABLE\"}}\n\n",
                ChunkKind::Error,
                None,
            ),
            (
                "data: {\"error\":{\"message\":\"EngineCore encountered an issue\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n",
                ChunkKind::Error,
                None,
            ),
            (
                "data: {\"error\":null,\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n",
                ChunkKind::Output,
                None,
            ),
            ("event: ping\ndata: {}\n\n", ChunkKind::Preamble, None),
        ];
        for (wire, kind, finish) in cases {
            let got = inspect_all(wire);
            assert_eq!(got.len(), 1, "{wire}");
            assert_eq!(got[0].0, *kind, "{wire}");
            assert_eq!(got[0].1.as_deref(), *finish, "{wire}");
        }
    }

    #[test]
    fn reads_usage_chunk_with_empty_choices() {
        let got = inspect_all(
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":40,\"total_tokens\":52}}\n\n",
        );
        assert_eq!(got[0].0, ChunkKind::Preamble);
        assert_eq!(got[0].2, Some(Usage::new(12, 40)));
    }

    #[test]
    fn terminal_chunk_keeps_identity_and_parses() {
        let identity = ChunkIdentity {
            id: Some("chatcmpl-1".into()),
            model: Some("gpt-x".into()),
            created: Some(7),
        };
        let error = TerminalError {
            bytes_sent: 400,
            output_events: 40,
            ..TerminalError::new(
                crate::FailureClass::RateLimited,
                crate::Phase::Committed,
                "Rate limit \"reached\"",
            )
        };
        let frames = terminal(&identity, "error", &error, TerminalMode::Raise);
        let text = std::str::from_utf8(&frames).unwrap();
        let (chunk, done) = text.split_once("\n\n").unwrap();
        assert_eq!(done, "data: [DONE]\n\n");
        let json: serde_json::Value =
            serde_json::from_str(chunk.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(json["id"], "chatcmpl-1");
        assert_eq!(json["model"], "gpt-x");
        assert_eq!(json["created"], 7);
        assert_eq!(json["choices"][0]["finish_reason"], "error");
        assert_eq!(json["error"]["message"], "Rate limit \"reached\"");
        assert_eq!(json["error"]["code"], "rate_limit_exceeded");
        assert_eq!(json["error"]["type"], "rate_limit_error");
        assert_eq!(json["error"]["phase"], "committed");
        assert_eq!(json["error"]["bytes_sent"], 400);
        assert_eq!(json["error"]["output_events"], 40);

        let quiet = terminal(&identity, "error", &error, TerminalMode::Finish);
        let quiet: serde_json::Value = serde_json::from_str(
            std::str::from_utf8(&quiet)
                .unwrap()
                .split("\n\n")
                .next()
                .unwrap()
                .strip_prefix("data: ")
                .unwrap(),
        )
        .unwrap();
        assert!(quiet.get("error").is_none());
        assert_eq!(quiet["stream_error"]["code"], "rate_limit_exceeded");

        let event = terminal(&identity, "error", &error, TerminalMode::ErrorEventOnly);
        let event = std::str::from_utf8(&event).unwrap();
        assert!(event.starts_with("event: error\ndata: {\"error\":{"));
        assert!(event.ends_with("}}\n\n"));
        assert!(!event.contains("[DONE]"));
    }
}
