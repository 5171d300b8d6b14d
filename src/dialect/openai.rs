use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{Chunk, ChunkIdentity, ChunkKind, Dialect, TerminalError, TerminalMode, Usage};
use crate::sse::SseEvent;

const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";

/// The OpenAI `chat.completion.chunk` stream dialect.
///
/// Output is a non-empty `delta.content`, any `delta.tool_calls`, a non-empty
/// `delta.refusal`, `delta.reasoning_content` (DeepSeek, older vLLM) or
/// `delta.reasoning` (vLLM, Ollama, OpenRouter). Reasoning counts as output:
/// the client has seen bytes of the model's answer. An in-band error is an
/// `event: error` or data carrying a truthy top-level `error` (OpenAI, vLLM,
/// Gemini, OpenRouter's `finish_reason: "error"` chunk). Empty `choices`
/// (usage chunk, Azure's prompt-filter chunk) are never indexed.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenAiChat;

/// The fields of a chunk this dialect reads; everything else is skipped
/// without allocating.
#[derive(Deserialize)]
struct RawChunk<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<i64>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<RawUsage>,
    #[serde(borrow, default)]
    choices: Choices<'a>,
}

#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(borrow, default)]
    delta: Option<RawDelta<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    finish_reason: Option<Cow<'a, str>>,
}

/// serde borrows a bare `Cow<str>` field but always allocates for an
/// `Option<Cow<str>>`; this borrows whenever the string has no escapes.
fn borrowed_str<'de: 'a, 'a, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Borrowed<'a>>::deserialize(deserializer)?.map(|b| b.0))
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    refusal: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
}

impl RawDelta<'_> {
    fn has_output(&self) -> bool {
        // A raw JSON value carries output unless it is null, an empty string
        // or an empty array. Comparing raw text avoids decoding escapes.
        let carries = |value: Option<&RawValue>| {
            value.is_some_and(|v| !matches!(v.get().trim(), "null" | "\"\"" | "[]"))
        };
        carries(self.content)
            || carries(self.tool_calls)
            || carries(self.refusal)
            || carries(self.reasoning_content)
            || carries(self.reasoning)
    }
}

/// A summary of `choices`, read element by element so no `Vec` is built.
#[derive(Default)]
struct Choices<'a> {
    output: bool,
    finish_reason: Option<Cow<'a, str>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ChoicesVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for ChoicesVisitor<'a> {
            type Value = Choices<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of choices or null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Choices::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Choices::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_seq(self)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut choices = Choices::default();
                while let Some(choice) = seq.next_element::<RawChoice<'de>>()? {
                    choices.output |= choice.delta.as_ref().is_some_and(RawDelta::has_output);
                    if choices.finish_reason.is_none() {
                        choices.finish_reason = choice.finish_reason;
                    }
                }
                Ok(choices)
            }
        }
        deserializer.deserialize_option(ChoicesVisitor(std::marker::PhantomData))
    }
}

/// Whether a raw JSON value is truthy the way the SDKs test `data.get("error")`.
fn truthy(value: &RawValue) -> bool {
    !matches!(
        value.get().trim(),
        "null" | "false" | "\"\"" | "0" | "{}" | "[]"
    )
}

impl Dialect for OpenAiChat {
    fn inspect<'a>(&self, event: &'a SseEvent) -> Chunk<'a> {
        let data = event.data().as_ref();
        if data.starts_with(b"[DONE]") {
            return Chunk::of(ChunkKind::Done);
        }
        let error_event = event.is_named("error");
        if !error_event && !event.is_named("message") {
            // Unknown event types carry nothing a chat client reads.
            return Chunk::of(ChunkKind::Preamble);
        }
        let raw: RawChunk<'a> = match serde_json::from_slice(data) {
            Ok(raw) => raw,
            Err(_) if error_event => return Chunk::of(ChunkKind::Error),
            Err(_) => return Chunk::of(ChunkKind::Malformed),
        };
        let kind = if error_event || raw.error.is_some_and(truthy) {
            ChunkKind::Error
        } else if raw.choices.output {
            ChunkKind::Output
        } else {
            ChunkKind::Preamble
        };
        Chunk {
            kind,
            finish_reason: raw.choices.finish_reason,
            usage: raw.usage.map(|u| Usage {
                prompt_tokens: u.prompt_tokens.unwrap_or(0),
                completion_tokens: u.completion_tokens.unwrap_or(0),
            }),
            identity: ChunkIdentity {
                id: raw.id,
                model: raw.model,
                created: raw.created,
            },
        }
    }

    fn terminal(
        &self,
        identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes {
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

        let body = ErrorBody {
            message: &error.message,
            error_type: &error.error_type,
            param: None,
            code: &error.code,
            phase: error.phase.as_str(),
            bytes_sent: error.bytes_sent,
            output_events: error.output_events,
        };
        let mut out = Vec::with_capacity(512);
        let written = if mode == TerminalMode::ErrorEvent {
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
                error: (mode == TerminalMode::ErrorChunk).then_some(&body),
                stream_error: (mode == TerminalMode::FinishReasonOnly).then_some(&body),
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
        if mode != TerminalMode::ErrorEvent {
            out.extend_from_slice(DONE_FRAME);
        }
        Bytes::from(out)
    }

    fn done_frame(&self) -> Bytes {
        Bytes::from_static(DONE_FRAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::{SseItem, SseScanner};

    fn inspect_all(wire: &'static str) -> Vec<(ChunkKind, Option<String>, Option<Usage>)> {
        let mut out = Vec::new();
        SseScanner::new().feed(&Bytes::from_static(wire.as_bytes()), |item| {
            if let SseItem::Event(event) = item {
                let chunk = OpenAiChat.inspect(&event);
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
        assert_eq!(
            got[0].2,
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 40
            })
        );
    }

    #[test]
    fn terminal_chunk_keeps_identity_and_parses() {
        let identity = ChunkIdentity {
            id: Some("chatcmpl-1".into()),
            model: Some("gpt-x".into()),
            created: Some(7),
        };
        let error = TerminalError {
            message: "Rate limit \"reached\"".into(),
            error_type: "tokens".into(),
            code: "rate_limited".into(),
            phase: crate::classify::Phase::Committed,
            bytes_sent: 400,
            output_events: 40,
        };
        let frames = OpenAiChat.terminal(&identity, "error", &error, TerminalMode::ErrorChunk);
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
        assert_eq!(json["error"]["code"], "rate_limited");
        assert_eq!(json["error"]["phase"], "committed");
        assert_eq!(json["error"]["bytes_sent"], 400);
        assert_eq!(json["error"]["output_events"], 40);

        let quiet = OpenAiChat.terminal(&identity, "error", &error, TerminalMode::FinishReasonOnly);
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
        assert_eq!(quiet["stream_error"]["code"], "rate_limited");

        let event = OpenAiChat.terminal(&identity, "error", &error, TerminalMode::ErrorEvent);
        let event = std::str::from_utf8(&event).unwrap();
        assert!(event.starts_with("event: error\ndata: {\"error\":{"));
        assert!(event.ends_with("}}\n\n"));
        assert!(!event.contains("[DONE]"));
    }
}
