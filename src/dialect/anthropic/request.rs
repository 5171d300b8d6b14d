//! Messages requests: read once, borrowed from the body, and rewritten per
//! target by splicing the target's model into the raw bytes.
//!
//! The fields the gateway decides on must mean to it what they mean to the
//! provider: a lenient provider coerces `"stream": "true"` to `true`, and
//! its SSE answer would then reach a gateway expecting a whole body. These
//! fields are read strictly, `null` meaning absent, and any other type is
//! refused with a 400 ([`RequestError::WrongType`], code `invalid_type`):
//!
//! | field | must be |
//! |---|---|
//! | `model` | a string (absent or `null`: [`RequestError::MissingModel`]) |
//! | `messages` | an array ([`RequestError::MissingMessages`]) |
//! | `stream` | a boolean |
//! | `max_tokens` | a non-negative integer |
//! | `tool_choice.disable_parallel_tool_use` | a boolean |
//!
//! Other fields pass to the provider untouched and unjudged.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::dialect::raw::{
    ReadsElements, first_byte, model_edit, non_empty_array, read_elements, request_object, span,
    splice, strict_bool, strict_str, strict_u64, walk_content,
};
use crate::dialect::{RequestError, Requirements};

/// The API version sent upstream when the client named none.
pub(super) const DEFAULT_VERSION: &str = "2023-06-01";

const VERSION: HeaderName = HeaderName::from_static("anthropic-version");

/// A parsed Messages request: the body, and where its `model` is.
#[derive(Debug, Clone)]
pub struct MessagesRequest {
    body: Bytes,
    /// The `model` value, quotes included.
    model: Range<usize>,
}

impl MessagesRequest {
    /// The client's body, as it came (translation parses it again).
    pub(super) fn body(&self) -> &Bytes {
        &self.body
    }
}

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    /// Tallied as the body is read (the prompt is walked once there).
    #[serde(default, deserialize_with = "read_elements")]
    messages: Option<Tally>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_choice: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// A content block: only what requirements and the estimate read.
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    /// A `tool_result`'s own content (a string or blocks).
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    disable_parallel_tool_use: Option<&'a RawValue>,
}

/// What the blocks of a request hold, for requirements and the estimate.
#[derive(Default)]
struct Tally {
    text_bytes: u64,
    images: bool,
    documents: bool,
}

impl Tally {
    /// Adds a `content` (or `system`) value: a string or a list of blocks.
    fn content(&mut self, raw: &RawValue, depth: u8) {
        let text = walk_content(raw, depth, |block| self.block(block, depth));
        self.text_bytes += text;
    }

    fn block(&mut self, raw: &RawValue, depth: u8) {
        let Ok(block) = serde_json::from_str::<Block<'_>>(raw.get()) else {
            return;
        };
        match block.kind.as_deref() {
            Some("image") => self.images = true,
            Some("document") => self.documents = true,
            _ => {}
        }
        if let Some(text) = block.text.filter(|t| first_byte(t) == b'"') {
            self.text_bytes += text.get().len().saturating_sub(2) as u64;
        }
        if let Some(input) = block.input {
            self.text_bytes += input.get().len() as u64;
        }
        if let Some(content) = block.content {
            self.content(content, depth + 1);
        }
    }
}

impl ReadsElements for Tally {
    /// Adds one message: framing, and its content (objects only).
    fn element(&mut self, message: &RawValue) {
        if first_byte(message) != b'{' {
            return;
        }
        self.text_bytes += 16; // role and framing
        if let Ok(Message {
            content: Some(content),
        }) = serde_json::from_str::<Message<'_>>(message.get())
        {
            self.content(content, 0);
        }
    }
}

/// Reads a Messages request.
pub(super) fn read(body: Bytes) -> Result<(Requirements, MessagesRequest), RequestError> {
    let top: Top<'_> = request_object(&body)?;
    let mut tally = top.messages.ok_or(RequestError::MissingMessages)?;
    let model_raw = top
        .model
        .filter(|m| m.get() != "null")
        .ok_or(RequestError::MissingModel)?;
    let model = strict_str(model_raw, "model")?;
    let max_tokens = strict_u64(top.max_tokens, "max_tokens", 0)?;
    let stream = strict_bool(top.stream, "stream")?.unwrap_or(false);

    if let Some(system) = top.system {
        tally.content(system, 0);
    }
    tally.text_bytes += top.tools.map_or(0, |t| t.get().len() as u64);

    let tool_choice = top
        .tool_choice
        .filter(|c| first_byte(c) == b'{')
        .and_then(|c| serde_json::from_str::<Typed<'_>>(c.get()).ok());
    // `tool_choice: {"type": "none"}` sends the tools but forbids their
    // use: the target must still accept them.
    let no_parallel = match &tool_choice {
        Some(choice) => strict_bool(
            choice.disable_parallel_tool_use,
            "tool_choice.disable_parallel_tool_use",
        )?,
        None => None,
    };
    let tools = non_empty_array(top.tools);
    let parallel = tools && no_parallel != Some(true);
    let reasoning = top
        .thinking
        .filter(|t| first_byte(t) == b'{')
        .and_then(|t| serde_json::from_str::<Typed<'_>>(t.get()).ok())
        .is_some_and(|t| t.kind.as_deref().is_some_and(|k| k != "disabled"));
    let requirements = Requirements {
        model: model.into_owned(),
        tools,
        parallel_tool_calls: parallel,
        response_format: None,
        stream,
        // A Messages stream always reports usage (`message_start`,
        // `message_delta`), and its clients read it: never stripped.
        include_usage: stream,
        image_input: tally.images,
        document_input: tally.documents,
        reasoning,
        input_tokens: tally.text_bytes.div_ceil(4),
        max_output_tokens: max_tokens,
        ..Requirements::default()
    };
    let request = MessagesRequest {
        model: span(&body, model_raw),
        body: body.clone(),
    };
    Ok((requirements, request))
}

/// The body one target receives: the client's bytes with `model` spliced
/// in. A Messages stream reports usage unasked, so nothing else changes.
pub(super) fn upstream_body(request: &MessagesRequest, model: &str) -> Bytes {
    match model_edit(&request.body, &request.model, model) {
        None => request.body.clone(),
        Some(edit) => splice(&request.body, &mut [edit]),
    }
}

/// `anthropic-version` when the header policy forwarded none (the
/// provider refuses a request without it): [`DEFAULT_VERSION`]. The
/// client's `anthropic-version` and `anthropic-beta` cross only as the
/// policy says (betas through its allow-list), never around it.
pub(super) fn upstream_headers(_client: &HeaderMap, upstream: &mut HeaderMap) {
    if !upstream.contains_key(&VERSION) {
        upstream.insert(VERSION, HeaderValue::from_static(DEFAULT_VERSION));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BETA: HeaderName = HeaderName::from_static("anthropic-beta");

    fn read_json(
        value: serde_json::Value,
    ) -> Result<(Requirements, MessagesRequest), RequestError> {
        read(Bytes::from(value.to_string()))
    }

    /// Each object message counts its framing (16) and its content's text;
    /// other elements count nothing; `messages` of another type is missing.
    #[test]
    fn the_messages_are_tallied_as_the_body_is_read() {
        let input = |messages: &str| {
            read(Bytes::from(format!(
                r#"{{"model":"m","max_tokens":5,"messages":{messages}}}"#
            )))
            .map(|(r, _)| (r.input_tokens, r.image_input))
            .map_err(|e| e.to_string())
        };
        // 16 + 4 = 20: 5 tokens; then 16 + 4 ("abcd" in a text block)
        // with an image block beside it, and elements that are no message.
        assert_eq!(
            input(r#"[{"role":"user","content":"abcd"}]"#),
            Ok((5, false))
        );
        assert_eq!(
            input(
                r#"[1e400,"x",{"content":[{"type":"text","text":"abcd"},{"type":"image","source":{}}]}]"#
            ),
            Ok((5, true))
        );
        for messages in ["{}", "null", "7", r#""x""#, "false"] {
            assert_eq!(
                input(messages),
                Err(RequestError::MissingMessages.to_string()),
                "{messages}"
            );
        }
    }

    #[test]
    fn reads_what_a_request_needs() {
        let (r, _) = read_json(serde_json::json!({
            "model": "claude-x",
            "max_tokens": 1024,
            "stream": true,
            "system": [{"type": "text", "text": "be brief"}],
            "thinking": {"type": "enabled", "budget_tokens": 2000},
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "what is in these?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}}
                ]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}
            ]
        }))
        .unwrap();
        assert_eq!(r.model, "claude-x");
        assert!(r.stream && r.include_usage && r.tools && r.reasoning);
        assert!(r.image_input && r.document_input);
        assert!(!r.parallel_tool_calls, "disable_parallel_tool_use");
        assert_eq!(r.max_output_tokens, Some(1024));
        assert!(r.input_tokens > 10);

        let (r, _) = read_json(serde_json::json!({
            "model": "m", "max_tokens": 5, "thinking": {"type": "disabled"},
            "tools": [{"name": "f", "input_schema": {}}],
            "messages": [{"role": "user", "content": "hi"}]
        }))
        .unwrap();
        assert!(r.tools && r.parallel_tool_calls);
        assert!(!r.reasoning && !r.stream && !r.include_usage);
        assert!(!r.image_input && !r.document_input);
    }

    #[test]
    fn rejects_what_cannot_be_served() {
        assert_eq!(
            read_json(serde_json::json!({"model": "m"})).err(),
            Some(RequestError::MissingMessages)
        );
        assert_eq!(
            read_json(serde_json::json!({"messages": []})).err(),
            Some(RequestError::MissingModel)
        );
        assert!(matches!(
            read_json(serde_json::json!({"model": "m", "max_tokens": "x", "messages": []})),
            Err(RequestError::WrongType {
                field: "max_tokens",
                ..
            })
        ));
        assert_eq!(
            read_json(serde_json::json!("x")).err(),
            Some(RequestError::NotObject)
        );
        assert!(matches!(
            read(Bytes::from_static(
                br#"{"model":"a","model":"b","messages":[]}"#
            )),
            Err(RequestError::NotJson(_))
        ));
    }

    #[test]
    fn fields_a_lenient_provider_would_coerce_are_refused() {
        let base = || serde_json::json!({"model": "m", "max_tokens": 5, "messages": []});
        for (field, value, expected) in [
            ("stream", serde_json::json!(1), "a boolean"),
            ("stream", serde_json::json!("true"), "a boolean"),
            ("stream", serde_json::json!("false"), "a boolean"),
            (
                "max_tokens",
                serde_json::json!(5.0),
                "a non-negative integer",
            ),
            (
                "max_tokens",
                serde_json::json!(-1),
                "a non-negative integer",
            ),
            (
                "max_tokens",
                serde_json::json!("5"),
                "a non-negative integer",
            ),
            ("model", serde_json::json!(3), "a string"),
            ("model", serde_json::json!(["m"]), "a string"),
        ] {
            let mut body = base();
            body[field] = value.clone();
            let error = read_json(body).err();
            assert_eq!(
                error,
                Some(RequestError::WrongType { field, expected }),
                "{field}: {value}"
            );
            let error = error.unwrap();
            assert_eq!((error.code(), error.param()), ("invalid_type", Some(field)));
        }
        let mut body = base();
        body["tools"] = serde_json::json!([{"name": "f", "input_schema": {}}]);
        body["tool_choice"] =
            serde_json::json!({"type": "auto", "disable_parallel_tool_use": "true"});
        assert_eq!(
            read_json(body).err(),
            Some(RequestError::WrongType {
                field: "tool_choice.disable_parallel_tool_use",
                expected: "a boolean"
            })
        );
        // `null` means absent; real booleans and integers read as ever.
        let mut body = base();
        body["stream"] = serde_json::Value::Null;
        body["max_tokens"] = serde_json::Value::Null;
        let (r, _) = read_json(body).unwrap();
        assert!(!r.stream);
        assert_eq!(r.max_output_tokens, None);
        let mut body = base();
        body["stream"] = serde_json::json!(false);
        assert!(!read_json(body).unwrap().0.stream);
    }

    #[test]
    fn the_upstream_body_is_the_clients_bytes_with_the_model() {
        let raw = r#"{ "model" : "claude-x", "max_tokens": 9, "stream": true, "messages": [{"role":"user","content":"hi \"you\""}] }"#;
        let (_, request) = read(Bytes::from_static(raw.as_bytes())).unwrap();
        let body = upstream_body(&request, "claude \"target\"");
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{ "model" : "claude \"target\"", "max_tokens": 9, "stream": true, "messages": [{"role":"user","content":"hi \"you\""}] }"#
        );
    }

    #[test]
    fn version_defaults_and_betas_never_go_around_the_header_policy() {
        let mut upstream = HeaderMap::new();
        upstream_headers(&HeaderMap::new(), &mut upstream);
        assert_eq!(upstream[VERSION], DEFAULT_VERSION);
        assert!(upstream.get(BETA).is_none());

        // What the policy forwarded stays; the dialect adds no beta of the
        // client's that the policy did not forward.
        let mut client = HeaderMap::new();
        client.insert(VERSION, HeaderValue::from_static("2024-01-01"));
        client.append(BETA, HeaderValue::from_static("files-api-2025-04-14"));
        let mut upstream = HeaderMap::new();
        upstream.insert(VERSION, HeaderValue::from_static("2024-01-01"));
        upstream_headers(&client, &mut upstream);
        assert_eq!(upstream[VERSION], "2024-01-01");
        assert!(upstream.get(BETA).is_none());
    }
}
