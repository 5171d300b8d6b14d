//! Translation to and from the neutral model: Messages.
//!
//! - **Requests in** ([`to_neutral`]): `system` and mid-conversation
//!   `system`-role messages, text / image / document / tool_use /
//!   tool_result / thinking / redacted_thinking blocks, custom tools,
//!   `tool_choice`, sampling, `thinking`, `output_config.effort`,
//!   `metadata.user_id`. Dropped as advisory: `cache_control` anywhere,
//!   citations, `top_k`, `service_tier`, `context_management`,
//!   `container`, unknown fields. Refused: server tools, `mcp_servers`,
//!   block types the neutral model has no part for.
//! - **Requests out** ([`body_from_neutral`]): the nearest Messages body; a
//!   later system message becomes a `<system>` text block of the next user
//!   message, unsigned thinking is dropped (Messages rejects it), the
//!   temperature is clamped to Messages' 0–1 and a `top_p` beside it is
//!   left out (current models take one of them), what Messages refuses
//!   beside thinking gives way to it (temperature, a `top_p` below 0.95;
//!   thinking itself gives way to a forced tool). Tool-call ids take
//!   Messages' form. Refused: `n > 1`, logprobs, audio,
//!   `response_format`, whitespace-only stop sequences.
//! - **Streams and whole answers** both ways: content blocks ↔ neutral
//!   events, tool calls numbered by their position among the answer's
//!   calls, usage with the prompt cache counted as input.

use crate::dialect::json::array;
use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::MessagesRequest;
use crate::Usage;
use crate::dialect::neutral::{ANSWER_ID_PREFIXES, TOOL_CALL_ID_PREFIXES, reprefix};
use crate::dialect::{
    ChunkIdentity, FinishReason, Message, NeutralEvent, NeutralRequest, Part, ResponseFormat,
    ToolChoice, ToolSpec,
};
use crate::sse::SseEvent;

/// Messages' tool-call id prefix.
const CALL_PREFIX: &str = "toolu_";
/// Messages' answer id prefix.
const ANSWER_PREFIX: &str = "msg_";
/// The id of a stream whose first event was not a `Start`.
const GATEWAY_ID: &str = "msg_gateway";
/// `max_tokens` when the request names no output limit (Messages requires
/// one; the failover layer normally fills it).
const DEFAULT_MAX_TOKENS: u64 = 4096;
/// Messages' smallest thinking budget.
const MIN_THINKING_BUDGET: u64 = 1024;
/// Messages accepts a `top_p` at or above this with thinking on.
const MIN_TOP_P_WITH_THINKING: f64 = 0.95;
/// The stop reasons Messages itself writes: an `Other` reason among them
/// is written as it is.
const STOP_REASONS: &[&str] = &[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
];

/// What translation keeps of one stream, read or written.
#[derive(Debug, Default)]
pub(super) struct StreamMemo {
    /// A stream of this dialect being read.
    reading: Reading,
    /// A stream of this dialect being written.
    writing: Writing,
}

impl StreamMemo {
    /// The identity of the stream written so far, in this dialect's form.
    pub(super) fn identity(&self) -> ChunkIdentity<'_> {
        let writing = &self.writing;
        if !writing.started {
            return ChunkIdentity::default();
        }
        ChunkIdentity {
            id: Some(Cow::Borrowed(writing.id.as_str())),
            model: (!writing.model.is_empty()).then_some(Cow::Borrowed(writing.model.as_str())),
            created: None,
        }
    }
}

// ---------------------------------------------------------------------------
// Requests: Messages → neutral
// ---------------------------------------------------------------------------

/// Reads a client's Messages request into the neutral model.
pub(super) fn to_neutral(request: &MessagesRequest) -> Result<NeutralRequest, String> {
    let body: Value =
        serde_json::from_slice(request.body()).map_err(|_| "a JSON request body".to_owned())?;
    let Value::Object(top) = body else {
        return Err("a JSON object request body".to_owned());
    };
    // Provider-hosted MCP servers run tools the target cannot reach.
    let mcp = match top.get("mcp_servers") {
        None | Some(Value::Null) => false,
        Some(Value::Array(servers)) => !servers.is_empty(),
        Some(_) => true,
    };
    if mcp {
        return Err("mcp_servers".to_owned());
    }
    let mut messages = Vec::new();
    if let Some(system) = top.get("system").filter(|s| !s.is_null()) {
        messages.push(Message::System(text_content(system)?));
    }
    for message in array(top.get("messages")) {
        read_message(message, &mut messages)?;
    }
    let (tool_choice, parallel_tool_calls) = read_tool_choice(top.get("tool_choice"))?;
    let (response_format, json_schema) = read_output_format(&top);
    let stream = top.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let text = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_owned);
    Ok(NeutralRequest {
        model: text(top.get("model")).unwrap_or_default(),
        messages,
        tools: read_tools(top.get("tools"))?,
        tool_choice,
        parallel_tool_calls,
        max_output_tokens: top.get("max_tokens").and_then(Value::as_u64),
        temperature: top.get("temperature").and_then(Value::as_f64),
        top_p: top.get("top_p").and_then(Value::as_f64),
        stop: array(top.get("stop_sequences"))
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        response_format,
        json_schema,
        reasoning_effort: text(top.get("output_config").and_then(|c| c.get("effort"))),
        thinking_budget: read_thinking(top.get("thinking")),
        user: text(top.get("metadata").and_then(|m| m.get("user_id"))),
        metadata: None,
        stream,
        // A Messages stream always reports usage, and its clients read it.
        include_usage: stream,
        choices: 1,
        logprobs: false,
        audio: false,
    })
}

/// A block's (or source's, or choice's) `type`.
fn kind(value: &Value) -> &str {
    value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("untyped")
}

/// A string field of a block, empty when absent.
fn field(value: &Value, name: &str) -> String {
    value
        .get(name)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// One message of `messages`: a user message's tool results become
/// [`Message::Tool`]s ahead of the rest of its parts.
fn read_message(message: &Value, out: &mut Vec<Message>) -> Result<(), String> {
    let content = message.get("content").unwrap_or(&Value::Null);
    match message.get("role").and_then(Value::as_str) {
        Some("user") => read_user(content, out),
        Some("assistant") => {
            let parts = match content {
                Value::String(text) => vec![Part::Text(text.clone())],
                _ => array(Some(content))
                    .map(read_block)
                    .collect::<Result<_, _>>()?,
            };
            out.push(Message::Assistant(parts));
            Ok(())
        }
        // Some agents send instructions mid-conversation as a system turn.
        Some("system") => {
            out.push(Message::System(text_content(content)?));
            Ok(())
        }
        Some(other) => Err(format!("role {other}")),
        None => Err("a message without a role".to_owned()),
    }
}

/// A user message: tool results first, each its own [`Message::Tool`],
/// then the other parts as one [`Message::User`] (when there are any, or
/// when there was no tool result).
fn read_user(content: &Value, out: &mut Vec<Message>) -> Result<(), String> {
    let mut parts = Vec::new();
    let mut results = false;
    match content {
        Value::String(text) => parts.push(Part::Text(text.clone())),
        Value::Array(blocks) => {
            for block in blocks {
                if kind(block) == "tool_result" {
                    out.push(read_tool_result(block)?);
                    results = true;
                } else {
                    parts.push(read_block(block)?);
                }
            }
        }
        _ => {}
    }
    if !results || !parts.is_empty() {
        out.push(Message::User(parts));
    }
    Ok(())
}

/// One content block of a user or assistant message.
fn read_block(block: &Value) -> Result<Part, String> {
    match kind(block) {
        // Citations are provenance of the text, not the text: dropped.
        "text" => Ok(Part::Text(field(block, "text"))),
        "image" => read_image(block.get("source").unwrap_or(&Value::Null)),
        "document" => read_document(block),
        "tool_use" => Ok(Part::ToolCall {
            id: field(block, "id"),
            name: field(block, "name"),
            arguments: compact(block.get("input")),
        }),
        "thinking" => Ok(Part::Thinking {
            text: field(block, "thinking"),
            signature: block
                .get("signature")
                .and_then(Value::as_str)
                .map(str::to_owned),
        }),
        "redacted_thinking" => Ok(Part::RedactedThinking(field(block, "data"))),
        other => Err(format!("content block {other}")),
    }
}

/// A tool's input as compact JSON text (`{}` when there is none).
fn compact(input: Option<&Value>) -> String {
    match input {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(value) => value.to_string(),
    }
}

/// An image block's source: base64 data as a `data:` URL, or its URL.
fn read_image(source: &Value) -> Result<Part, String> {
    match kind(source) {
        "base64" => Ok(Part::Image(format!(
            "data:{};base64,{}",
            field(source, "media_type"),
            field(source, "data")
        ))),
        "url" => Ok(Part::Image(field(source, "url"))),
        other => Err(format!("image source {other}")),
    }
}

/// A document block: base64 data (a PDF) as a `data:` URL, plain text as
/// a base64 `text/plain` `data:` URL, a URL as it is; its `title` names it.
fn read_document(block: &Value) -> Result<Part, String> {
    let source = block.get("source").unwrap_or(&Value::Null);
    let url = match kind(source) {
        "base64" => format!(
            "data:{};base64,{}",
            field(source, "media_type"),
            field(source, "data")
        ),
        "text" => format!(
            "data:text/plain;base64,{}",
            base64_encode(field(source, "data").as_bytes())
        ),
        "url" => field(source, "url"),
        other => return Err(format!("document source {other}")),
    };
    Ok(Part::Document {
        url,
        name: block
            .get("title")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

/// A `tool_result` block as a [`Message::Tool`].
fn read_tool_result(block: &Value) -> Result<Message, String> {
    let content = match block.get("content") {
        Some(Value::String(text)) => vec![Part::Text(text.clone())],
        Some(Value::Array(blocks)) => blocks
            .iter()
            .map(|b| match kind(b) {
                "text" | "image" | "document" => read_block(b),
                other => Err(format!("content block {other}")),
            })
            .collect::<Result<_, _>>()?,
        _ => Vec::new(),
    };
    Ok(Message::Tool {
        call_id: field(block, "tool_use_id"),
        content,
        is_error: block
            .get("is_error")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

/// System content: a string or text blocks (`cache_control` dropped).
fn text_content(content: &Value) -> Result<Vec<Part>, String> {
    match content {
        Value::String(text) => Ok(vec![Part::Text(text.clone())]),
        Value::Array(blocks) => blocks
            .iter()
            .map(|block| match kind(block) {
                "text" => Ok(Part::Text(field(block, "text"))),
                other => Err(format!("content block {other}")),
            })
            .collect(),
        _ => Ok(Vec::new()),
    }
}

/// Custom tools; a server tool (any other `type`) runs at the provider,
/// which another target cannot do.
fn read_tools(tools: Option<&Value>) -> Result<Vec<ToolSpec>, String> {
    array(tools)
        .map(|tool| match tool.get("type").and_then(Value::as_str) {
            None | Some("custom") => Ok(ToolSpec {
                name: field(tool, "name"),
                description: tool
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                parameters: tool
                    .get("input_schema")
                    .cloned()
                    .unwrap_or_else(empty_schema),
                strict: tool.get("strict").and_then(Value::as_bool),
            }),
            Some(other) => Err(format!("server tool {other}")),
        })
        .collect()
}

/// The schema of a tool without parameters.
fn empty_schema() -> Value {
    json!({"type": "object", "properties": {}})
}

/// `tool_choice`, and `disable_parallel_tool_use` as `parallel_tool_calls`.
fn read_tool_choice(choice: Option<&Value>) -> Result<(Option<ToolChoice>, Option<bool>), String> {
    let Some(choice) = choice.filter(|c| !c.is_null()) else {
        return Ok((None, None));
    };
    let parallel = (choice
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        == Some(true))
    .then_some(false);
    let choice = match kind(choice) {
        "auto" => ToolChoice::Auto,
        "any" => ToolChoice::Required,
        "none" => ToolChoice::None,
        "tool" => ToolChoice::Named(field(choice, "name")),
        other => return Err(format!("tool_choice {other}")),
    };
    Ok((Some(choice), parallel))
}

/// `thinking`: a budget, `Some(0)` for adaptive thinking, `None` when off.
fn read_thinking(thinking: Option<&Value>) -> Option<u64> {
    let thinking = thinking?;
    match kind(thinking) {
        "enabled" => Some(
            thinking
                .get("budget_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        ),
        "adaptive" => Some(0),
        _ => None,
    }
}

/// Structured output (`output_config.format`, or the earlier top-level
/// `output_format`): a JSON schema the answer must follow, which the
/// neutral model carries as chat completions' `json_schema`.
fn read_output_format(top: &Map<String, Value>) -> (Option<ResponseFormat>, Option<Value>) {
    let format = top
        .get("output_config")
        .and_then(|c| c.get("format"))
        .or_else(|| top.get("output_format"))
        .filter(|f| kind(f) == "json_schema");
    match format {
        Some(format) => (
            Some(ResponseFormat::JsonSchema),
            Some(json!({
                "name": "response",
                "schema": format.get("schema").cloned().unwrap_or_else(empty_schema),
                "strict": true,
            })),
        ),
        None => (None, None),
    }
}

// ---------------------------------------------------------------------------
// Requests: neutral → Messages
// ---------------------------------------------------------------------------

/// Writes a Messages body for `request` with `model`.
pub(super) fn body_from_neutral(request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
    refuse_unexpressible(request)?;
    let max_tokens = request.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let (system, messages) = write_messages(&request.messages)?;
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("max_tokens".into(), json!(max_tokens));
    if let Some(system) = system {
        body.insert("system".into(), system);
    }
    body.insert("messages".into(), Value::Array(messages));
    let choice = write_tools(request, &mut body);
    // Messages refuses thinking with a forced tool: the tool call is what
    // the client asked for, thinking only helps reach it.
    let forced = choice
        .as_ref()
        .is_some_and(|c| matches!(kind(c), "any" | "tool"));
    let thinking = if forced {
        None
    } else {
        write_thinking(request, max_tokens)
    };
    if let Some(choice) = choice {
        body.insert("tool_choice".into(), choice);
    }
    // Messages' temperature is 0–1 (chat's 0–2); with thinking on it takes
    // no temperature and a top_p of at least 0.95; and its current models
    // take a temperature or a top_p, not both: the temperature stays.
    let temperature = request.temperature.filter(|_| thinking.is_none());
    if let Some(temperature) = temperature {
        body.insert("temperature".into(), json!(temperature.clamp(0.0, 1.0)));
    }
    let top_p = request
        .top_p
        .filter(|p| temperature.is_none() && (thinking.is_none() || *p >= MIN_TOP_P_WITH_THINKING));
    if let Some(top_p) = top_p {
        body.insert("top_p".into(), json!(top_p));
    }
    // An empty stop sequence stops nothing (Messages refuses one).
    let stop: Vec<&String> = request.stop.iter().filter(|s| !s.is_empty()).collect();
    if !stop.is_empty() {
        body.insert("stop_sequences".into(), json!(stop));
    }
    if let Some(thinking) = thinking {
        body.insert("thinking".into(), thinking);
    }
    if let Some(user) = &request.user {
        body.insert("metadata".into(), json!({"user_id": user}));
    }
    if request.stream {
        body.insert("stream".into(), json!(true));
    }
    serde_json::to_vec(&Value::Object(body))
        .map(Bytes::from)
        .map_err(|_| "a body that serializes".to_owned())
}

/// What a Messages request has no place for.
fn refuse_unexpressible(request: &NeutralRequest) -> Result<(), String> {
    // Messages refuses a stop sequence of only whitespace (chat clients
    // send `"\n"`); dropping it would let the answer run on.
    let blank_stop = request
        .stop
        .iter()
        .any(|s| !s.is_empty() && s.trim().is_empty());
    let refusal = if request.choices > 1 {
        "n > 1"
    } else if blank_stop {
        "whitespace stop sequences"
    } else if request.logprobs {
        "logprobs"
    } else if request.audio {
        "audio"
    } else {
        match request.response_format {
            Some(ResponseFormat::JsonSchema) => "response_format json_schema",
            Some(ResponseFormat::JsonObject) => "response_format json_object",
            None => return Ok(()),
        }
    };
    Err(refusal.to_owned())
}

/// The conversation being written: the top-level system text, the
/// messages, the user message tool results are gathering in, and system
/// text waiting for the next user message.
#[derive(Default)]
struct Conversation {
    /// No user, assistant or tool message yet: system text is top-level.
    past_leading: bool,
    system: Vec<String>,
    messages: Vec<Value>,
    tool_results: Option<Vec<Value>>,
    pending_system: Vec<Value>,
}

impl Conversation {
    /// Adds a message unless it has no content (Messages rejects one).
    fn push(&mut self, role: &str, content: Vec<Value>) {
        if !content.is_empty() {
            self.messages
                .push(json!({"role": role, "content": content}));
        }
    }

    /// Ends the user message of gathered tool results, with any system
    /// text that came after them.
    fn close_tool_results(&mut self) {
        if let Some(mut content) = self.tool_results.take() {
            content.append(&mut self.pending_system);
            self.push("user", content);
        }
    }
}

/// The top-level `system` and the `messages`.
fn write_messages(messages: &[Message]) -> Result<(Option<Value>, Vec<Value>), String> {
    let mut c = Conversation::default();
    for message in messages {
        match message {
            Message::System(parts) | Message::Developer(parts) => {
                let texts = system_texts(parts)?;
                if !c.past_leading {
                    c.system.extend(texts);
                } else if !texts.is_empty() {
                    // Messages has no system turn: the nearest form is the
                    // instruction, marked, at the start of the next user turn.
                    let text = format!("<system>\n{}\n</system>", texts.join("\n"));
                    c.pending_system.push(text_block(&text));
                }
            }
            Message::User(parts) => {
                c.past_leading = true;
                let blocks = user_blocks(parts)?;
                let mut content = c.tool_results.take().unwrap_or_default();
                content.append(&mut c.pending_system);
                content.extend(blocks);
                c.push("user", content);
            }
            Message::Assistant(parts) => {
                c.past_leading = true;
                c.close_tool_results();
                let blocks = assistant_blocks(parts)?;
                c.push("assistant", blocks);
            }
            Message::Tool {
                call_id,
                content,
                is_error,
            } => {
                c.past_leading = true;
                let result = tool_result(call_id, content, *is_error)?;
                c.tool_results.get_or_insert_with(Vec::new).push(result);
            }
        }
    }
    c.close_tool_results();
    let pending = std::mem::take(&mut c.pending_system);
    c.push("user", pending);
    let system = match c.system.len() {
        0 => None,
        1 => c.system.pop().map(Value::String),
        _ => Some(Value::Array(
            c.system.iter().map(|t| text_block(t)).collect(),
        )),
    };
    Ok((system, c.messages))
}

/// A text block.
fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// What a part is, for a refusal's reason.
fn part_name(part: &Part) -> &'static str {
    match part {
        Part::Text(_) => "text",
        Part::Image(_) => "image",
        Part::Document { .. } => "document",
        Part::ToolCall { .. } => "tool call",
        Part::Thinking { .. } => "thinking",
        Part::RedactedThinking(_) => "redacted thinking",
        Part::Refusal(_) => "refusal",
    }
}

/// A system message's texts (empty ones left out: Messages rejects them).
fn system_texts(parts: &[Part]) -> Result<Vec<String>, String> {
    let mut texts = Vec::new();
    for part in parts {
        match part {
            Part::Text(text) | Part::Refusal(text) => {
                if !text.is_empty() {
                    texts.push(text.clone());
                }
            }
            other => return Err(format!("{} in a system message", part_name(other))),
        }
    }
    Ok(texts)
}

/// A user message's blocks.
fn user_blocks(parts: &[Part]) -> Result<Vec<Value>, String> {
    let mut blocks = Vec::new();
    for part in parts {
        match part {
            Part::Text(text) | Part::Refusal(text) => {
                if !text.is_empty() {
                    blocks.push(text_block(text));
                }
            }
            Part::Image(url) => blocks.push(image_block(url)?),
            Part::Document { url, name } => blocks.push(document_block(url, name.as_deref())?),
            other => return Err(format!("{} in a user message", part_name(other))),
        }
    }
    Ok(blocks)
}

/// An assistant message's blocks. Thinking goes back only signed: Messages
/// rejects thinking it did not sign (another dialect's reasoning).
fn assistant_blocks(parts: &[Part]) -> Result<Vec<Value>, String> {
    let mut blocks = Vec::new();
    for part in parts {
        match part {
            Part::Text(text) | Part::Refusal(text) => {
                if !text.is_empty() {
                    blocks.push(text_block(text));
                }
            }
            Part::Thinking {
                text,
                signature: Some(signature),
            } if !signature.is_empty() => {
                blocks.push(json!({"type": "thinking", "thinking": text, "signature": signature}))
            }
            Part::Thinking { .. } => {}
            Part::RedactedThinking(data) => {
                blocks.push(json!({"type": "redacted_thinking", "data": data}));
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => blocks.push(json!({
                "type": "tool_use",
                "id": call_id(id),
                "name": name,
                "input": arguments_object(arguments),
            })),
            other => return Err(format!("{} in an assistant message", part_name(other))),
        }
    }
    Ok(blocks)
}

/// A tool-call id in Messages' form: its prefix swapped, and characters
/// Messages refuses in an id (it takes `[A-Za-z0-9_-]`; some providers
/// write `functions.get_weather:0`) replaced by `_`, the same way for a
/// call and its result.
fn call_id(id: &str) -> Cow<'_, str> {
    let id = reprefix(id, TOOL_CALL_ID_PREFIXES, CALL_PREFIX);
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if id.chars().all(valid) {
        return id;
    }
    Cow::Owned(id.chars().map(|c| if valid(c) { c } else { '_' }).collect())
}

/// A tool call's arguments as the object `input` must be (`{}` when they
/// are not a JSON object).
fn arguments_object(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// A `tool_result` block: a lone text as a string, else blocks.
fn tool_result(id: &str, content: &[Part], is_error: bool) -> Result<Value, String> {
    let mut block = json!({
        "type": "tool_result",
        "tool_use_id": call_id(id),
    });
    match content {
        [] => {}
        [Part::Text(text)] => block["content"] = json!(text),
        parts => {
            let mut blocks = Vec::new();
            for part in parts {
                match part {
                    Part::Text(text) | Part::Refusal(text) => {
                        if !text.is_empty() {
                            blocks.push(text_block(text));
                        }
                    }
                    Part::Image(url) => blocks.push(image_block(url)?),
                    Part::Document { url, name } => {
                        blocks.push(document_block(url, name.as_deref())?);
                    }
                    other => return Err(format!("{} in a tool result", part_name(other))),
                }
            }
            block["content"] = Value::Array(blocks);
        }
    }
    if is_error {
        block["is_error"] = json!(true);
    }
    Ok(block)
}

/// Whether a URL is one Messages fetches.
fn is_web_url(url: &str) -> bool {
    url.starts_with("https://") || url.starts_with("http://")
}

/// An image block: a `data:` URL as base64 data, a web URL as a URL.
fn image_block(url: &str) -> Result<Value, String> {
    let source = if let Some(data) = DataUrl::parse(url) {
        json!({"type": "base64", "media_type": data.media_type, "data": data.base64()})
    } else if is_web_url(url) {
        json!({"type": "url", "url": url})
    } else {
        return Err("image by reference".to_owned());
    };
    Ok(json!({"type": "image", "source": source}))
}

/// A document block: a PDF `data:` URL as base64 data, a plain-text one as
/// a text source, a web URL as a URL; `name` as its title.
fn document_block(url: &str, name: Option<&str>) -> Result<Value, String> {
    let source = match DataUrl::parse(url) {
        Some(data) if data.media_type == "application/pdf" => {
            json!({"type": "base64", "media_type": "application/pdf", "data": data.base64()})
        }
        Some(data) if data.media_type == "text/plain" => {
            let text = data
                .bytes()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .ok_or_else(|| "document text/plain that is not UTF-8 text".to_owned())?;
            json!({"type": "text", "media_type": "text/plain", "data": text})
        }
        Some(data) => return Err(format!("document {}", data.media_type)),
        None if is_web_url(url) => json!({"type": "url", "url": url}),
        None => return Err("document by reference".to_owned()),
    };
    let mut block = json!({"type": "document", "source": source});
    if let Some(name) = name {
        block["title"] = json!(name);
    }
    Ok(block)
}

/// Tools (with `tool_choice`, returned, when there are any).
fn write_tools(request: &NeutralRequest, body: &mut Map<String, Value>) -> Option<Value> {
    if request.tools.is_empty() {
        return None;
    }
    let tools = request
        .tools
        .iter()
        .map(|tool| {
            let mut out = json!({"name": tool.name});
            if let Some(description) = &tool.description {
                out["description"] = json!(description);
            }
            // Messages requires an object schema; a tool without
            // parameters takes none.
            out["input_schema"] = if tool.parameters.is_object() {
                tool.parameters.clone()
            } else {
                empty_schema()
            };
            out
        })
        .collect();
    body.insert("tools".into(), Value::Array(tools));
    let disable_parallel = request.parallel_tool_calls == Some(false);
    let mut choice = match &request.tool_choice {
        Some(ToolChoice::Auto) => json!({"type": "auto"}),
        Some(ToolChoice::Required) => json!({"type": "any"}),
        // `none` takes no other field.
        Some(ToolChoice::None) => return Some(json!({"type": "none"})),
        Some(ToolChoice::Named(name)) => json!({"type": "tool", "name": name}),
        None if disable_parallel => json!({"type": "auto"}),
        None => return None,
    };
    if disable_parallel {
        choice["disable_parallel_tool_use"] = json!(true);
    }
    Some(choice)
}

/// `thinking`, from a budget or else from a reasoning effort.
fn write_thinking(request: &NeutralRequest, max_tokens: u64) -> Option<Value> {
    let budget = match request.thinking_budget {
        Some(0) => return Some(json!({"type": "adaptive"})),
        // A smaller budget than Messages takes asks for its least.
        Some(budget) => budget.max(MIN_THINKING_BUDGET),
        None => match request.reasoning_effort.as_deref()? {
            "minimal" | "none" => return None,
            "low" => 1024,
            "medium" => 4096,
            _ => 16384,
        },
    };
    // The budget must stay below `max_tokens`: a limit too small for the
    // least budget leaves thinking off.
    let budget = budget.min(max_tokens.saturating_sub(1));
    (budget >= MIN_THINKING_BUDGET).then(|| json!({"type": "enabled", "budget_tokens": budget}))
}

/// A parsed `data:` URL.
struct DataUrl<'a> {
    /// The media type, parameters left out.
    media_type: &'a str,
    /// The payload is base64.
    base64: bool,
    /// The text after the comma.
    payload: &'a str,
}

impl<'a> DataUrl<'a> {
    /// Parses `data:<media type>[;params][;base64],<payload>`.
    fn parse(url: &'a str) -> Option<Self> {
        let rest = url.strip_prefix("data:")?;
        let (header, payload) = rest.split_once(',')?;
        let mut params = header.split(';');
        let media_type = params.next().unwrap_or_default();
        let base64 = params.any(|p| p.eq_ignore_ascii_case("base64"));
        Some(Self {
            media_type,
            base64,
            payload,
        })
    }

    /// The payload as base64.
    fn base64(&self) -> Cow<'a, str> {
        if self.base64 {
            Cow::Borrowed(self.payload)
        } else {
            Cow::Owned(base64_encode(&percent_decode(self.payload)))
        }
    }

    /// The payload's bytes (`None` when its base64 is not).
    fn bytes(&self) -> Option<Vec<u8>> {
        if self.base64 {
            base64_decode(self.payload)
        } else {
            Some(percent_decode(self.payload))
        }
    }
}

/// The standard base64 alphabet.
const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let group = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        for i in 0..4 {
            if i <= chunk.len() {
                let sextet = (group >> (18 - 6 * i)) & 63;
                out.push(char::from(BASE64[sextet as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Base64 (standard or URL-safe; padding and whitespace allowed) decoded;
/// `None` when it is not base64.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut group, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            c if c.is_ascii_whitespace() => continue,
            _ => return None,
        };
        group = (group << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((group >> bits) & 0xFF) as u8);
            group &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// `%XX` escapes decoded; anything else taken as it is.
fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 3)
            .filter(|_| bytes[i] == b'%')
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Answers: the wire shapes read
// ---------------------------------------------------------------------------

/// One event of a Messages stream, as read.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InEvent {
    MessageStart {
        message: InMessage,
    },
    ContentBlockStart {
        index: u64,
        content_block: InBlock,
    },
    ContentBlockDelta {
        index: u64,
        delta: InDelta,
    },
    ContentBlockStop {
        index: u64,
    },
    MessageDelta {
        #[serde(default)]
        delta: InStop,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    /// `ping`, `error` and event types added later.
    #[serde(other)]
    Other,
}

/// A `message`: `message_start`'s, or a whole answer.
#[derive(Deserialize)]
struct InMessage {
    /// Loose: an id or model of another type leaves the answer readable.
    #[serde(default)]
    id: Value,
    #[serde(default)]
    model: Value,
    /// A whole answer's blocks (`message_start`'s are empty); an answer
    /// without any is none.
    #[serde(default)]
    content: Option<Vec<InBlock>>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

/// A content block (a block start's, or a whole answer's).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: String,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: Value,
    },
    /// Server tools' blocks and their results, which no neutral event
    /// carries (they are never asked for by a translated request).
    #[serde(other)]
    Other,
}

/// A `content_block_delta`'s delta.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InDelta {
    TextDelta {
        #[serde(default)]
        text: String,
    },
    ThinkingDelta {
        #[serde(default)]
        thinking: String,
    },
    SignatureDelta {
        #[serde(default)]
        signature: String,
    },
    InputJsonDelta {
        #[serde(default)]
        partial_json: String,
    },
    /// `citations_delta` and later kinds.
    #[serde(other)]
    Other,
}

/// A `message_delta`'s delta.
#[derive(Deserialize, Default)]
struct InStop {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// Messages' usage, each count as reported (absent: `None`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

impl WireUsage {
    /// These counts with `later`'s where it reports them.
    fn updated(self, later: Self) -> Self {
        Self {
            input_tokens: later.input_tokens.or(self.input_tokens),
            cache_creation_input_tokens: later
                .cache_creation_input_tokens
                .or(self.cache_creation_input_tokens),
            cache_read_input_tokens: later
                .cache_read_input_tokens
                .or(self.cache_read_input_tokens),
            output_tokens: later.output_tokens.or(self.output_tokens),
        }
    }

    /// Neutral usage: every input token, the cache's reads and writes
    /// included; the reads as cached.
    fn neutral(self) -> Usage {
        let input = [
            self.input_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ]
        .into_iter()
        .flatten()
        .fold(0u64, u64::saturating_add);
        let mut usage = Usage::new(input, self.output_tokens.unwrap_or(0));
        usage.cached_input_tokens = self.cache_read_input_tokens.unwrap_or(0);
        usage
    }
}

/// A Messages stop reason in neutral terms.
fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "end_turn" => FinishReason::Stop,
        "stop_sequence" => FinishReason::StopSequence,
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

/// A neutral finish reason as a Messages stop reason (`end_turn` when the
/// answer gave none, or one of another dialect's own).
fn stop_reason(finish: Option<&FinishReason>) -> &str {
    match finish {
        None | Some(FinishReason::Stop) => "end_turn",
        Some(FinishReason::StopSequence) => "stop_sequence",
        Some(FinishReason::Length) => "max_tokens",
        Some(FinishReason::ToolCalls) => "tool_use",
        Some(FinishReason::ContentFilter) => "refusal",
        Some(FinishReason::Other(reason)) if STOP_REASONS.contains(&reason.as_str()) => reason,
        Some(FinishReason::Other(_)) => "end_turn",
    }
}

/// A string of a loosely read field (`""` when it is not one).
fn loose_str(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

// ---------------------------------------------------------------------------
// Streams: Messages → neutral
// ---------------------------------------------------------------------------

/// What decoding keeps of the stream read so far.
#[derive(Debug, Default)]
struct Reading {
    /// `Start` was emitted.
    started: bool,
    /// `message_stop` was read: nothing after it counts.
    ended: bool,
    /// The tool calls' blocks, by block index.
    calls: BTreeMap<u64, CallBlock>,
    /// How many tool calls have begun.
    call_count: u32,
    /// `message_start`'s usage, which `message_delta`'s updates.
    start_usage: WireUsage,
}

/// A `tool_use` block being read.
#[derive(Debug, Clone, Copy)]
struct CallBlock {
    /// The call's position among the answer's calls.
    call: u32,
    /// Its block has not stopped.
    open: bool,
    /// Some of its arguments were read.
    has_arguments: bool,
}

/// Reads one event of a Messages stream into neutral events.
pub(super) fn decode_event(event: &SseEvent, memo: &mut StreamMemo, out: &mut Vec<NeutralEvent>) {
    let reading = &mut memo.reading;
    // In-band errors are the commit machine's; what does not parse is
    // skipped, never fatal.
    if reading.ended || event.is_named("error") {
        return;
    }
    if let Some((index, delta)) = fast_delta(event) {
        return reading.delta(index, delta, out);
    }
    let Ok(parsed) = serde_json::from_slice::<InEvent>(event.data()) else {
        return;
    };
    match parsed {
        InEvent::MessageStart { message } => {
            if !reading.started {
                reading.started = true;
                out.push(NeutralEvent::Start {
                    id: loose_str(&message.id),
                    model: loose_str(&message.model),
                    created: None,
                });
            }
            if let Some(usage) = message.usage {
                reading.start_usage = usage;
                out.push(NeutralEvent::Usage(usage.neutral()));
            }
        }
        InEvent::ContentBlockStart {
            index,
            content_block,
        } => reading.block_start(index, content_block, out),
        InEvent::ContentBlockDelta { index, delta } => reading.delta(index, delta, out),
        InEvent::ContentBlockStop { index } => {
            if let Some(block) = reading.calls.get_mut(&index) {
                end_call(block, out);
            }
        }
        InEvent::MessageDelta { delta, usage } => {
            if delta.stop_reason.is_some() {
                reading.close_calls(out);
            }
            if let Some(usage) = usage {
                let usage = reading.start_usage.updated(usage);
                out.push(NeutralEvent::Usage(usage.neutral()));
            }
            if let Some(reason) = delta.stop_reason {
                out.push(NeutralEvent::Finish(finish_reason(&reason)));
            }
        }
        InEvent::MessageStop => {
            reading.close_calls(out);
            reading.ended = true;
            out.push(NeutralEvent::End);
        }
        InEvent::Other => {}
    }
}

/// A `content_block_delta` (most of a stream's events), read flat and
/// borrowed: an internally tagged enum buffers every field before it picks
/// its variant, which made this read cost four times the rest of the
/// event's handling. `None` takes the general reading, which reads such an
/// event alike.
fn fast_delta(event: &SseEvent) -> Option<(u64, InDelta)> {
    #[derive(Deserialize)]
    struct Event<'a> {
        #[serde(rename = "type", borrow)]
        kind: Cow<'a, str>,
        index: u64,
        #[serde(borrow)]
        delta: Delta<'a>,
    }
    #[derive(Deserialize)]
    struct Delta<'a> {
        #[serde(rename = "type", borrow)]
        kind: Cow<'a, str>,
        #[serde(borrow, default)]
        text: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        thinking: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        signature: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        partial_json: Option<Cow<'a, str>>,
    }
    if !event.is_named("content_block_delta") {
        return None;
    }
    let parsed: Event<'_> = serde_json::from_slice(event.data()).ok()?;
    if parsed.kind != "content_block_delta" {
        return None;
    }
    let d = parsed.delta;
    let owned = |piece: Option<Cow<'_, str>>| piece.map(Cow::into_owned).unwrap_or_default();
    let delta = match &*d.kind {
        "text_delta" => InDelta::TextDelta {
            text: owned(d.text),
        },
        "thinking_delta" => InDelta::ThinkingDelta {
            thinking: owned(d.thinking),
        },
        "signature_delta" => InDelta::SignatureDelta {
            signature: owned(d.signature),
        },
        "input_json_delta" => InDelta::InputJsonDelta {
            partial_json: owned(d.partial_json),
        },
        _ => InDelta::Other,
    };
    Some((parsed.index, delta))
}

impl Reading {
    /// A `content_block_start`: a tool call begins; a block that starts
    /// with content gives it.
    fn block_start(&mut self, index: u64, block: InBlock, out: &mut Vec<NeutralEvent>) {
        match block {
            InBlock::Text { text } => push_text(out, NeutralEvent::Text, text),
            InBlock::Thinking {
                thinking,
                signature,
            } => {
                push_text(out, NeutralEvent::Thinking, thinking);
                push_text(out, NeutralEvent::ThinkingSignature, signature);
            }
            InBlock::RedactedThinking { data } => out.push(NeutralEvent::RedactedThinking(data)),
            InBlock::ToolUse { id, name, input } => {
                let call = self.call_count;
                self.call_count = self.call_count.saturating_add(1);
                out.push(NeutralEvent::ToolCallStart {
                    index: call,
                    id,
                    name,
                });
                // Streams start with `input: {}` and stream the arguments;
                // input given up front is the arguments.
                let has_arguments = input.as_object().is_some_and(|o| !o.is_empty());
                if has_arguments {
                    out.push(NeutralEvent::ToolCallArguments {
                        index: call,
                        delta: input.to_string(),
                    });
                }
                let block = CallBlock {
                    call,
                    open: true,
                    has_arguments,
                };
                self.calls.insert(index, block);
            }
            InBlock::Other => {}
        }
    }

    /// A `content_block_delta`.
    fn delta(&mut self, index: u64, delta: InDelta, out: &mut Vec<NeutralEvent>) {
        match delta {
            InDelta::TextDelta { text } => push_text(out, NeutralEvent::Text, text),
            InDelta::ThinkingDelta { thinking } => push_text(out, NeutralEvent::Thinking, thinking),
            InDelta::SignatureDelta { signature } => {
                push_text(out, NeutralEvent::ThinkingSignature, signature);
            }
            InDelta::InputJsonDelta { partial_json } => {
                // A server tool's input streams the same way: only a
                // `tool_use` block's is a call's.
                let Some(block) = self.calls.get_mut(&index).filter(|b| b.open) else {
                    return;
                };
                if !partial_json.is_empty() {
                    block.has_arguments = true;
                    out.push(NeutralEvent::ToolCallArguments {
                        index: block.call,
                        delta: partial_json,
                    });
                }
            }
            InDelta::Other => {}
        }
    }

    /// Ends every call still open (a stream that stops without closing
    /// its blocks).
    fn close_calls(&mut self, out: &mut Vec<NeutralEvent>) {
        for block in self.calls.values_mut() {
            end_call(block, out);
        }
    }
}

/// Pushes a text-carrying event unless its text is empty.
fn push_text(out: &mut Vec<NeutralEvent>, event: fn(String) -> NeutralEvent, text: String) {
    if !text.is_empty() {
        out.push(event(text));
    }
}

/// Ends a call if it is open. A call that streamed no arguments (a tool
/// without parameters: Messages streams an empty `partial_json`) gets
/// `{}`, so a client of another dialect parses them.
fn end_call(block: &mut CallBlock, out: &mut Vec<NeutralEvent>) {
    if !block.open {
        return;
    }
    block.open = false;
    if !block.has_arguments {
        out.push(NeutralEvent::ToolCallArguments {
            index: block.call,
            delta: "{}".to_owned(),
        });
    }
    out.push(NeutralEvent::ToolCallEnd { index: block.call });
}

/// Reads a whole Messages answer as the events its stream would give.
pub(super) fn decode_answer(body: &[u8]) -> Option<Vec<NeutralEvent>> {
    let message: InMessage = serde_json::from_slice(body).ok()?;
    let content = message.content?;
    let mut out = vec![NeutralEvent::Start {
        id: loose_str(&message.id),
        model: loose_str(&message.model),
        created: None,
    }];
    let mut calls = 0u32;
    for block in content {
        match block {
            InBlock::Text { text } => push_text(&mut out, NeutralEvent::Text, text),
            InBlock::Thinking {
                thinking,
                signature,
            } => {
                push_text(&mut out, NeutralEvent::Thinking, thinking);
                push_text(&mut out, NeutralEvent::ThinkingSignature, signature);
            }
            InBlock::RedactedThinking { data } => out.push(NeutralEvent::RedactedThinking(data)),
            InBlock::ToolUse { id, name, input } => {
                out.push(NeutralEvent::ToolCallStart {
                    index: calls,
                    id,
                    name,
                });
                out.push(NeutralEvent::ToolCallArguments {
                    index: calls,
                    delta: compact(Some(&input)),
                });
                out.push(NeutralEvent::ToolCallEnd { index: calls });
                calls = calls.saturating_add(1);
            }
            InBlock::Other => {}
        }
    }
    if let Some(usage) = message.usage {
        out.push(NeutralEvent::Usage(usage.neutral()));
    }
    if let Some(reason) = message.stop_reason {
        out.push(NeutralEvent::Finish(finish_reason(&reason)));
    }
    out.push(NeutralEvent::End);
    Some(out)
}

// ---------------------------------------------------------------------------
// Answers: the wire shapes written
// ---------------------------------------------------------------------------

/// One event of a Messages stream, as written.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutEvent<'a> {
    MessageStart {
        message: OutMessage<'a>,
    },
    ContentBlockStart {
        index: u64,
        content_block: OutBlock<'a>,
    },
    ContentBlockDelta {
        index: u64,
        delta: OutDelta<'a>,
    },
    ContentBlockStop {
        index: u64,
    },
    MessageDelta {
        delta: OutStop<'a>,
        usage: OutUsage,
    },
    MessageStop,
}

impl OutEvent<'_> {
    /// The SSE event name: the data's `type`, as Messages sends both.
    fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
        }
    }
}

/// A `message`: `message_start`'s (no content yet), or a whole answer.
#[derive(Serialize)]
struct OutMessage<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<OutBlock<'a>>,
    stop_reason: Option<&'a str>,
    /// Which stop sequence matched is not in the neutral model.
    stop_sequence: Option<&'a str>,
    usage: OutUsage,
}

/// A content block, as written.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutBlock<'a> {
    Text {
        text: &'a str,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: &'a str,
        input: Value,
    },
}

/// A `content_block_delta`'s delta, as written.
#[derive(Serialize)]
#[serde(tag = "type")]
enum OutDelta<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// A `message_delta`'s delta.
#[derive(Serialize)]
struct OutStop<'a> {
    stop_reason: &'a str,
    stop_sequence: Option<&'a str>,
}

/// Messages' usage: input without the cache's reads, which are counted
/// apart.
#[derive(Serialize, Default)]
struct OutUsage {
    input_tokens: u64,
    output_tokens: u64,
    #[serde(skip_serializing_if = "is_zero")]
    cache_read_input_tokens: u64,
}

impl From<Usage> for OutUsage {
    fn from(usage: Usage) -> Self {
        Self {
            input_tokens: usage.input_tokens.saturating_sub(usage.cached_input_tokens),
            output_tokens: usage.output_tokens,
            cache_read_input_tokens: usage.cached_input_tokens,
        }
    }
}

/// For `skip_serializing_if`.
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Appends one SSE event: `event: <type>`, its JSON data, a blank line.
fn write(out: &mut BytesMut, event: &OutEvent<'_>) {
    // Strings, integers and JSON values always serialize; were one not
    // to, the event is left out rather than written half.
    let Ok(data) = serde_json::to_vec(event) else {
        return;
    };
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.name().as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(&data);
    out.extend_from_slice(b"\n\n");
}

// ---------------------------------------------------------------------------
// Streams: neutral → Messages
// ---------------------------------------------------------------------------

/// What encoding keeps of the stream written so far.
#[derive(Debug, Default)]
struct Writing {
    /// `message_start` was written.
    started: bool,
    /// `message_stop` was written: nothing more is.
    ended: bool,
    /// The message id written, in Messages' form.
    id: String,
    /// The model written.
    model: String,
    /// The next content block's index.
    next_index: u64,
    /// The open content block.
    open: Option<OpenBlock>,
    /// The last usage given, written at the end.
    usage: Option<Usage>,
    /// The finish reason given, written at the end.
    finish: Option<FinishReason>,
}

/// The open content block being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpenBlock {
    index: u64,
    kind: OpenKind,
}

/// What the open block holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenKind {
    Text,
    /// Thinking, and whether its signature came (more thinking after it
    /// is a new block: a signature ends one).
    Thinking {
        signed: bool,
    },
    /// The tool call of this neutral index.
    Call(u32),
}

/// Writes one neutral event as Messages stream events.
pub(super) fn encode_event(event: &NeutralEvent, memo: &mut StreamMemo, out: &mut BytesMut) {
    let writing = &mut memo.writing;
    if writing.ended {
        return;
    }
    match event {
        NeutralEvent::Start { id, model, .. } => {
            if !writing.started {
                writing.start(id, model, out);
            }
        }
        // Messages has no refusal block: a refusal is the answer's text.
        NeutralEvent::Text(text) | NeutralEvent::Refusal(text) => writing.text(text, out),
        NeutralEvent::Thinking(text) => writing.thinking(text, out),
        NeutralEvent::ThinkingSignature(signature) => writing.signature(signature, out),
        NeutralEvent::RedactedThinking(data) => writing.redacted(data, out),
        NeutralEvent::ToolCallStart { index, id, name } => {
            writing.call_start(*index, id, name, out);
        }
        NeutralEvent::ToolCallArguments { index, delta } => {
            writing.call_arguments(*index, delta, out);
        }
        NeutralEvent::ToolCallEnd { index } => {
            if writing.open_kind() == Some(OpenKind::Call(*index)) {
                writing.close(out);
            }
        }
        NeutralEvent::Usage(usage) => writing.usage = Some(*usage),
        NeutralEvent::Finish(reason) => writing.finish = Some(reason.clone()),
        NeutralEvent::End => writing.end(out),
    }
}

impl Writing {
    /// Writes `message_start`.
    fn start(&mut self, id: &str, model: &str, out: &mut BytesMut) {
        self.started = true;
        self.id = if id.is_empty() {
            GATEWAY_ID.to_owned()
        } else {
            reprefix(id, ANSWER_ID_PREFIXES, ANSWER_PREFIX).into_owned()
        };
        self.model = model.to_owned();
        // Usage comes at the end (`message_delta`), when it is known.
        let message = OutMessage {
            id: &self.id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: OutUsage::default(),
        };
        write(out, &OutEvent::MessageStart { message });
    }

    /// Writes `message_start` if nothing has been written yet, so the
    /// stream stays valid when content comes first.
    fn ensure_started(&mut self, out: &mut BytesMut) {
        if !self.started {
            self.start(GATEWAY_ID, "", out);
        }
    }

    /// What the open block holds.
    fn open_kind(&self) -> Option<OpenKind> {
        self.open.map(|o| o.kind)
    }

    /// Closes the open block.
    fn close(&mut self, out: &mut BytesMut) {
        if let Some(open) = self.open.take() {
            write(out, &OutEvent::ContentBlockStop { index: open.index });
        }
    }

    /// Closes the open block and starts the next one; returns its index.
    fn begin(&mut self, block: OutBlock<'_>, out: &mut BytesMut) -> u64 {
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        let start = OutEvent::ContentBlockStart {
            index,
            content_block: block,
        };
        write(out, &start);
        index
    }

    /// Opens a block of `kind` unless it is the open one; returns its index.
    fn ensure_open(&mut self, kind: OpenKind, block: OutBlock<'_>, out: &mut BytesMut) -> u64 {
        self.ensure_started(out);
        match self.open {
            Some(open) if open.kind == kind => open.index,
            _ => {
                let index = self.begin(block, out);
                self.open = Some(OpenBlock { index, kind });
                index
            }
        }
    }

    /// Writes a delta to block `index`.
    fn delta(index: u64, delta: OutDelta<'_>, out: &mut BytesMut) {
        write(out, &OutEvent::ContentBlockDelta { index, delta });
    }

    fn text(&mut self, text: &str, out: &mut BytesMut) {
        if text.is_empty() {
            return;
        }
        let index = self.ensure_open(OpenKind::Text, OutBlock::Text { text: "" }, out);
        Self::delta(index, OutDelta::Text { text }, out);
    }

    fn thinking(&mut self, thinking: &str, out: &mut BytesMut) {
        if thinking.is_empty() {
            return;
        }
        let block = OutBlock::Thinking {
            thinking: "",
            signature: "",
        };
        let index = self.ensure_open(OpenKind::Thinking { signed: false }, block, out);
        Self::delta(index, OutDelta::Thinking { thinking }, out);
    }

    /// A signature belongs to the open thinking block; without one it has
    /// nowhere to go.
    fn signature(&mut self, signature: &str, out: &mut BytesMut) {
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if signature.is_empty() || !matches!(open.kind, OpenKind::Thinking { .. }) {
            return;
        }
        open.kind = OpenKind::Thinking { signed: true };
        Self::delta(open.index, OutDelta::Signature { signature }, out);
    }

    /// A redacted thinking block is whole at its start.
    fn redacted(&mut self, data: &str, out: &mut BytesMut) {
        self.ensure_started(out);
        let index = self.begin(OutBlock::RedactedThinking { data }, out);
        write(out, &OutEvent::ContentBlockStop { index });
    }

    fn call_start(&mut self, call: u32, id: &str, name: &str, out: &mut BytesMut) {
        self.ensure_started(out);
        let block = OutBlock::ToolUse {
            id: call_id(id),
            name,
            input: json!({}),
        };
        let index = self.begin(block, out);
        self.open = Some(OpenBlock {
            index,
            kind: OpenKind::Call(call),
        });
    }

    /// Arguments of the open call. Another call's are left out: a block
    /// cannot be reopened, and chat streams its calls one after another.
    fn call_arguments(&mut self, call: u32, partial_json: &str, out: &mut BytesMut) {
        match self.open {
            Some(open) if open.kind == OpenKind::Call(call) && !partial_json.is_empty() => {
                Self::delta(open.index, OutDelta::InputJson { partial_json }, out);
            }
            _ => {}
        }
    }

    /// Closes the open block, then `message_delta` with the stop reason
    /// and usage, and `message_stop`.
    fn end(&mut self, out: &mut BytesMut) {
        self.ensure_started(out);
        self.close(out);
        let delta = OutEvent::MessageDelta {
            delta: OutStop {
                stop_reason: stop_reason(self.finish.as_ref()),
                stop_sequence: None,
            },
            usage: self.usage.map(OutUsage::from).unwrap_or_default(),
        };
        write(out, &delta);
        write(out, &OutEvent::MessageStop);
        self.ended = true;
    }
}

/// A content block of a whole answer being gathered.
enum AnswerBlock {
    Text(String),
    Thinking {
        text: String,
        signature: String,
    },
    Redacted(String),
    Call {
        index: u32,
        id: String,
        name: String,
        arguments: String,
    },
}

/// Writes a whole Messages answer from neutral events.
pub(super) fn encode_answer(events: &[NeutralEvent]) -> Bytes {
    let mut start: Option<(String, &str)> = None;
    let mut blocks: Vec<AnswerBlock> = Vec::new();
    let (mut usage, mut finish) = (None, None);
    for event in events {
        match event {
            NeutralEvent::Start { id, model, .. } => {
                if start.is_none() && !id.is_empty() {
                    let id = reprefix(id, ANSWER_ID_PREFIXES, ANSWER_PREFIX).into_owned();
                    start = Some((id, model));
                }
            }
            NeutralEvent::Usage(u) => usage = Some(*u),
            NeutralEvent::Finish(reason) => finish = Some(reason),
            other => gather(&mut blocks, other),
        }
    }
    let (id, model) = start.unwrap_or_else(|| (GATEWAY_ID.to_owned(), ""));
    let content = blocks
        .iter()
        .map(|block| match block {
            AnswerBlock::Text(text) => OutBlock::Text { text },
            AnswerBlock::Thinking { text, signature } => OutBlock::Thinking {
                thinking: text,
                signature,
            },
            AnswerBlock::Redacted(data) => OutBlock::RedactedThinking { data },
            AnswerBlock::Call {
                id,
                name,
                arguments,
                ..
            } => OutBlock::ToolUse {
                id: call_id(id),
                name,
                input: arguments_object(arguments),
            },
        })
        .collect();
    let message = OutMessage {
        id: &id,
        kind: "message",
        role: "assistant",
        model,
        content,
        stop_reason: Some(stop_reason(finish)),
        stop_sequence: None,
        usage: usage.map(OutUsage::from).unwrap_or_default(),
    };
    serde_json::to_vec(&message)
        .map(Bytes::from)
        .unwrap_or_default()
}

/// Adds a content event to the answer's blocks: text and thinking run on
/// in their block, as in a stream.
fn gather(blocks: &mut Vec<AnswerBlock>, event: &NeutralEvent) {
    match (event, blocks.last_mut()) {
        (NeutralEvent::Text(more) | NeutralEvent::Refusal(more), Some(AnswerBlock::Text(text))) => {
            text.push_str(more);
        }
        (NeutralEvent::Text(text) | NeutralEvent::Refusal(text), _) if !text.is_empty() => {
            blocks.push(AnswerBlock::Text(text.clone()));
        }
        (NeutralEvent::Thinking(more), Some(AnswerBlock::Thinking { text, signature }))
            if signature.is_empty() =>
        {
            text.push_str(more)
        }
        (NeutralEvent::Thinking(text), _) if !text.is_empty() => {
            blocks.push(AnswerBlock::Thinking {
                text: text.clone(),
                signature: String::new(),
            });
        }
        (NeutralEvent::ThinkingSignature(more), Some(AnswerBlock::Thinking { signature, .. })) => {
            signature.push_str(more);
        }
        (NeutralEvent::RedactedThinking(data), _) => {
            blocks.push(AnswerBlock::Redacted(data.clone()));
        }
        (NeutralEvent::ToolCallStart { index, id, name }, _) => blocks.push(AnswerBlock::Call {
            index: *index,
            id: id.clone(),
            name: name.clone(),
            arguments: String::new(),
        }),
        (NeutralEvent::ToolCallArguments { index, delta }, _) => {
            let call = blocks.iter_mut().rev().find_map(|block| match block {
                AnswerBlock::Call {
                    index: i,
                    arguments,
                    ..
                } if i == index => Some(arguments),
                _ => None,
            });
            if let Some(arguments) = call {
                arguments.push_str(delta);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::{AnthropicMessages, BodyCheck, ChunkKind, Dialect};
    use crate::sse::{SseItem, SseScanner};
    use NeutralEvent as E;

    /// The dispatched events of a wire stream.
    fn sse_events(wire: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        SseScanner::new().feed(&Bytes::copy_from_slice(wire), |item| {
            if let SseItem::Event(event) = item {
                events.push(event);
            }
        });
        events
    }

    /// A whole stream decoded with one memo.
    fn decode_all(wire: &[u8]) -> Vec<NeutralEvent> {
        let mut memo = StreamMemo::default();
        let mut out = Vec::new();
        for event in sse_events(wire) {
            decode_event(&event, &mut memo, &mut out);
        }
        out
    }

    /// Neutral events encoded with one memo.
    fn encode_all(events: &[NeutralEvent]) -> (String, StreamMemo) {
        let mut memo = StreamMemo::default();
        let mut out = BytesMut::new();
        for event in events {
            encode_event(event, &mut memo, &mut out);
        }
        (String::from_utf8(out.to_vec()).unwrap(), memo)
    }

    fn usage(input: u64, output: u64, cached: u64) -> Usage {
        let mut usage = Usage::new(input, output);
        usage.cached_input_tokens = cached;
        usage
    }

    fn start(id: &str, model: &str) -> NeutralEvent {
        E::Start {
            id: id.to_owned(),
            model: model.to_owned(),
            created: None,
        }
    }

    fn text(t: &str) -> NeutralEvent {
        E::Text(t.to_owned())
    }

    fn call_start(index: u32, id: &str, name: &str) -> NeutralEvent {
        E::ToolCallStart {
            index,
            id: id.to_owned(),
            name: name.to_owned(),
        }
    }

    fn args(index: u32, delta: &str) -> NeutralEvent {
        E::ToolCallArguments {
            index,
            delta: delta.to_owned(),
        }
    }

    const MODEL: &str = "claude-sonnet-4-5-20250929";

    #[test]
    fn decodes_a_recorded_text_stream() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/text.sse")),
            [
                start("msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", MODEL),
                E::Usage(usage(25, 1, 0)),
                text("Hello"),
                text("!"),
                E::Usage(usage(25, 15, 0)),
                E::Finish(FinishReason::Stop),
                E::End,
            ]
        );
    }

    #[test]
    fn decodes_a_tool_call_with_streamed_arguments() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/tool_use.sse")),
            [
                start("msg_014p7gG3wDgGV9EUtLvnow3U", MODEL),
                E::Usage(usage(472, 2, 0)),
                text("Okay, let's check the weather for San Francisco:"),
                call_start(0, "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather"),
                args(0, "{\"location\":"),
                args(0, " \"San Francisco, CA\"}"),
                E::ToolCallEnd { index: 0 },
                E::Usage(usage(472, 89, 0)),
                E::Finish(FinishReason::ToolCalls),
                E::End,
            ]
        );
    }

    #[test]
    fn decodes_thinking_and_its_signature() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/thinking.sse")),
            [
                start("msg_01TmZSsRNRqfLqfcRyG7N4Qx", MODEL),
                E::Usage(usage(36, 4, 0)),
                E::Thinking(
                    "Let me solve this step by step:\n\n1. First break down 27 * 453".to_owned()
                ),
                E::Thinking("\n2. 453 = 400 + 50 + 3".to_owned()),
                E::ThinkingSignature(
                    "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds".to_owned()
                ),
                text("27 * 453 = 12,231"),
                E::Usage(usage(36, 134, 0)),
                E::Finish(FinishReason::Stop),
                E::End,
            ]
        );
    }

    #[test]
    fn decodes_parallel_tool_calls_numbered_among_calls_with_cached_usage() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/translate/parallel_tools.sse")),
            [
                start("msg_01GkXyPm3Wq7sJ8RbVnTzA5c", MODEL),
                // 12 uncached + 2048 read from the cache.
                E::Usage(usage(2060, 1, 2048)),
                text("I'll check both cities."),
                call_start(0, "toolu_01Paris7sJ8RbVnTzA5cGkXy", "get_weather"),
                args(0, "{\"city\": "),
                args(0, "\"Paris\"}"),
                E::ToolCallEnd { index: 0 },
                call_start(1, "toolu_01Tokyo3Wq7sJ8RbVnTzA5cGk", "get_weather"),
                args(1, "{\"city\": \"Tokyo\"}"),
                E::ToolCallEnd { index: 1 },
                call_start(2, "toolu_01ClockPm3Wq7sJ8RbVnTzA5", "get_time"),
                // No arguments streamed: `{}`, which every client parses.
                args(2, "{}"),
                E::ToolCallEnd { index: 2 },
                E::Usage(usage(2060, 96, 2048)),
                E::Finish(FinishReason::ToolCalls),
                E::End,
            ]
        );
    }

    #[test]
    fn decodes_a_refusal() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/translate/refusal.sse")),
            [
                start("msg_01RfSaLQ2nX8cT4vWbJ6mKpE", MODEL),
                E::Usage(usage(31, 1, 0)),
                text("I can't help"),
                E::Usage(usage(31, 4, 0)),
                E::Finish(FinishReason::ContentFilter),
                E::End,
            ]
        );
    }

    #[test]
    fn server_tools_citations_pings_and_unknown_events_decode_to_nothing() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/translate/server_tools.sse")),
            [
                start("msg_01SrvWq7sJ8RbVnTzA5cGkXy", MODEL),
                // Cache writes are input too.
                E::Usage(usage(2779, 3, 0)),
                E::RedactedThinking(
                    "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP".to_owned()
                ),
                text("Sunny, "),
                text("22°C."),
                E::Usage(usage(2779, 510, 0)),
                E::Finish(FinishReason::Other("pause_turn".to_owned())),
                // Nothing after `message_stop` counts.
                E::End,
            ]
        );
    }

    #[test]
    fn errors_and_what_does_not_parse_decode_to_nothing() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/overloaded_after_start.sse")),
            [
                start("msg_01XFDUDYJgAACzvnptvVoYEL", MODEL),
                E::Usage(usage(12, 1, 0))
            ]
        );
        let garbage = concat!(
            "event: content_block_delta\ndata: {\"type\":\n\n",
            "event: content_block_delta\ndata: [1]\n\n",
            "data: {\"type\":\"content_block_delta\",\"index\":\"x\",\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n",
            "event: error\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n",
            "event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":null}\n\n",
            ": a comment\n\n",
        );
        assert_eq!(decode_all(garbage.as_bytes()), []);
    }

    #[test]
    fn calls_a_stream_leaves_open_end_before_the_finish() {
        let wire = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"c\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"a\":1}}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":7}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        assert_eq!(
            decode_all(wire.as_bytes()),
            [
                start("msg_1", "c"),
                call_start(0, "toolu_1", "f"),
                // Input given whole at the block's start is the arguments.
                args(0, "{\"a\":1}"),
                E::ToolCallEnd { index: 0 },
                E::Usage(usage(0, 7, 0)),
                E::Finish(FinishReason::Length),
                E::End,
            ]
        );
        // No `message_delta` at all: the calls end before `End`.
        let wire = concat!(
            "data: {\"type\":\"content_block_start\",\"index\":4,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{}}}\n\n",
            "data: {\"type\":\"content_block_delta\",\"index\":4,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        );
        assert_eq!(
            decode_all(wire.as_bytes()),
            [
                call_start(0, "toolu_1", "f"),
                args(0, "{}"),
                E::ToolCallEnd { index: 0 },
                E::End
            ]
        );
    }

    #[test]
    fn stop_reasons_map_both_ways() {
        for (wire, neutral, back) in [
            ("end_turn", FinishReason::Stop, "end_turn"),
            ("stop_sequence", FinishReason::StopSequence, "stop_sequence"),
            ("max_tokens", FinishReason::Length, "max_tokens"),
            (
                "model_context_window_exceeded",
                FinishReason::Length,
                "max_tokens",
            ),
            ("tool_use", FinishReason::ToolCalls, "tool_use"),
            ("refusal", FinishReason::ContentFilter, "refusal"),
            (
                "pause_turn",
                FinishReason::Other("pause_turn".to_owned()),
                "pause_turn",
            ),
            (
                "brand_new",
                FinishReason::Other("brand_new".to_owned()),
                "end_turn",
            ),
        ] {
            assert_eq!(finish_reason(wire), neutral, "{wire}");
            assert_eq!(stop_reason(Some(&neutral)), back, "{wire}");
        }
        // Chat's own reasons that reach Messages as `Other`.
        assert_eq!(
            stop_reason(Some(&FinishReason::Other("function_call".to_owned()))),
            "end_turn"
        );
        assert_eq!(stop_reason(None), "end_turn");
    }

    /// A chat answer with text, parallel tool calls and cached usage.
    fn chat_answer() -> Vec<NeutralEvent> {
        vec![
            start("chatcmpl-9xYz", "gpt-4o-2024-08-06"),
            text("Hello"),
            text(" \"world\"\n"),
            call_start(0, "call_abc", "get_weather"),
            args(0, "{\"city\":"),
            args(0, "\"Paris\"}"),
            E::ToolCallEnd { index: 0 },
            call_start(1, "call_def", "get_time"),
            args(1, "{}"),
            E::ToolCallEnd { index: 1 },
            E::Usage(usage(100, 20, 60)),
            E::Finish(FinishReason::ToolCalls),
            E::End,
        ]
    }

    /// Each event's kind, as the dialect's own reader sees it.
    fn kinds(wire: &str) -> Vec<ChunkKind> {
        sse_events(wire.as_bytes())
            .iter()
            .map(|event| {
                AnthropicMessages
                    .inspect(event, &mut Default::default())
                    .kind
            })
            .collect()
    }

    #[test]
    fn encodes_exact_bytes_its_own_reader_reads() {
        let (wire, memo) = encode_all(&chat_answer());
        assert_eq!(wire, include_str!("fixtures/translate/encoded_tools.sse"));
        use ChunkKind::{Done, Output, Preamble};
        assert_eq!(
            kinds(&wire),
            [
                Preamble, Preamble, Output, Output, Preamble, Output, Output, Output, Preamble,
                Output, Output, Preamble, Output, Done
            ]
        );
        let identity = memo.identity();
        assert_eq!(identity.id.as_deref(), Some("msg_9xYz"));
        assert_eq!(identity.model.as_deref(), Some("gpt-4o-2024-08-06"));
        // Read back: the same answer, ids in Messages' form, usage reported
        // at the start (zero) and at the end.
        assert_eq!(
            decode_all(wire.as_bytes()),
            [
                start("msg_9xYz", "gpt-4o-2024-08-06"),
                E::Usage(usage(0, 0, 0)),
                text("Hello"),
                text(" \"world\"\n"),
                call_start(0, "toolu_abc", "get_weather"),
                args(0, "{\"city\":"),
                args(0, "\"Paris\"}"),
                E::ToolCallEnd { index: 0 },
                call_start(1, "toolu_def", "get_time"),
                args(1, "{}"),
                E::ToolCallEnd { index: 1 },
                E::Usage(usage(100, 20, 60)),
                E::Finish(FinishReason::ToolCalls),
                E::End,
            ]
        );
    }

    #[test]
    fn encodes_thinking_redacted_thinking_and_refusals() {
        let (wire, _) = encode_all(&[
            start("msg_1", "m"),
            E::Thinking("a".to_owned()),
            E::Thinking(String::new()),
            E::Thinking("b".to_owned()),
            E::ThinkingSignature("sig".to_owned()),
            // Thinking after a signature is a new block.
            E::Thinking("c".to_owned()),
            E::RedactedThinking("enc".to_owned()),
            // No thinking block open: the signature has nowhere to go.
            E::ThinkingSignature("lost".to_owned()),
            E::Refusal("no".to_owned()),
            text("."),
            E::Finish(FinishReason::ContentFilter),
            E::End,
            // Nothing after the end.
            text("late"),
            E::End,
        ]);
        let expected = [
            r#"message_start {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}"#,
            r#"content_block_start {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            r#"content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"a"}}"#,
            r#"content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"b"}}"#,
            r#"content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}"#,
            r#"content_block_stop {"type":"content_block_stop","index":0}"#,
            r#"content_block_start {"type":"content_block_start","index":1,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            r#"content_block_delta {"type":"content_block_delta","index":1,"delta":{"type":"thinking_delta","thinking":"c"}}"#,
            r#"content_block_stop {"type":"content_block_stop","index":1}"#,
            r#"content_block_start {"type":"content_block_start","index":2,"content_block":{"type":"redacted_thinking","data":"enc"}}"#,
            r#"content_block_stop {"type":"content_block_stop","index":2}"#,
            r#"content_block_start {"type":"content_block_start","index":3,"content_block":{"type":"text","text":""}}"#,
            r#"content_block_delta {"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"no"}}"#,
            r#"content_block_delta {"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"."}}"#,
            r#"content_block_stop {"type":"content_block_stop","index":3}"#,
            r#"message_delta {"type":"message_delta","delta":{"stop_reason":"refusal","stop_sequence":null},"usage":{"input_tokens":0,"output_tokens":0}}"#,
            r#"message_stop {"type":"message_stop"}"#,
        ];
        let expected: String = expected
            .iter()
            .map(|line| {
                let (name, data) = line.split_once(' ').unwrap();
                format!("event: {name}\ndata: {data}\n\n")
            })
            .collect();
        assert_eq!(wire, expected);
        assert_eq!(
            *kinds(&wire).last().unwrap(),
            ChunkKind::Done,
            "message_stop ends it"
        );
    }

    #[test]
    fn content_before_a_start_opens_a_gateway_message() {
        let (wire, memo) = encode_all(&[
            call_start(0, "D681PevKs", "f"),
            // Another call's arguments while this one is open: left out.
            args(1, "{\"x\":1}"),
            args(0, "{\"y\":2}"),
            // A start after content changes nothing.
            start("chatcmpl-late", "m"),
            E::End,
        ]);
        assert_eq!(memo.identity().id.as_deref(), Some(GATEWAY_ID));
        assert_eq!(memo.identity().model, None);
        assert!(!wire.contains("chatcmpl-late") && !wire.contains("\\\"x\\\""));
        assert_eq!(
            decode_all(wire.as_bytes()),
            [
                start(GATEWAY_ID, ""),
                E::Usage(usage(0, 0, 0)),
                // An id of no known dialect is kept.
                call_start(0, "D681PevKs", "f"),
                args(0, "{\"y\":2}"),
                E::ToolCallEnd { index: 0 },
                E::Usage(usage(0, 0, 0)),
                // No finish given: the natural end.
                E::Finish(FinishReason::Stop),
                E::End,
            ]
        );
        assert_eq!(StreamMemo::default().identity(), ChunkIdentity::default());
    }

    const ANSWER: &str = r#"{"id":"msg_01Ans","type":"message","role":"assistant","model":"claude-x","content":[{"type":"thinking","thinking":"Think.","signature":"c2ln"},{"type":"redacted_thinking","data":"ZW5j"},{"type":"text","text":"Calling.","citations":null},{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"query":"q"}},{"type":"tool_use","id":"toolu_01A","name":"get_weather","input":{"city":"Paris"}},{"type":"tool_use","id":"toolu_01B","name":"get_time","input":{}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":100,"output_tokens":42}}"#;

    #[test]
    fn whole_answers_decode_as_their_streams_would() {
        assert_eq!(
            decode_answer(ANSWER.as_bytes()).unwrap(),
            [
                start("msg_01Ans", "claude-x"),
                E::Thinking("Think.".to_owned()),
                E::ThinkingSignature("c2ln".to_owned()),
                E::RedactedThinking("ZW5j".to_owned()),
                text("Calling."),
                call_start(0, "toolu_01A", "get_weather"),
                args(0, "{\"city\":\"Paris\"}"),
                E::ToolCallEnd { index: 0 },
                call_start(1, "toolu_01B", "get_time"),
                args(1, "{}"),
                E::ToolCallEnd { index: 1 },
                E::Usage(usage(115, 42, 100)),
                E::Finish(FinishReason::ToolCalls),
                E::End,
            ]
        );
        // A recorded stream and the whole answer it makes agree.
        let streamed = decode_all(include_bytes!("fixtures/tool_use.sse"));
        let whole = r#"{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[{"type":"text","text":"Okay, let's check the weather for San Francisco:"},{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{"location":"San Francisco, CA"}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":89}}"#;
        let whole = decode_answer(whole.as_bytes()).unwrap();
        let calls = |events: &[NeutralEvent]| {
            events
                .iter()
                .filter(|e| matches!(e, E::ToolCallStart { .. } | E::ToolCallEnd { .. }))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(calls(&streamed), calls(&whole));
        assert_eq!(streamed.last(), whole.last());
        assert_eq!(streamed[streamed.len() - 3..], whole[whole.len() - 3..]);
        for bad in [&b"not json"[..], b"[]", b"{\"content\":\"x\"}"] {
            assert_eq!(decode_answer(bad), None);
        }
    }

    #[test]
    fn encoded_answers_are_valid_messages() {
        let mut events = chat_answer();
        events.insert(1, E::Thinking("hm".to_owned()));
        events.insert(2, E::ThinkingSignature("s".to_owned()));
        events.insert(3, E::Refusal("No: ".to_owned()));
        let body = encode_answer(&events);
        let json: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            json!({
                "id": "msg_9xYz", "type": "message", "role": "assistant",
                "model": "gpt-4o-2024-08-06",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "No: Hello \"world\"\n"},
                    {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_def", "name": "get_time", "input": {}},
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 40, "output_tokens": 20, "cache_read_input_tokens": 60},
            })
        );
        let (check, facts) = AnthropicMessages.check_answer(&body);
        assert_eq!(
            check,
            BodyCheck::Valid {
                usage: Some(Usage::new(100, 20)),
                model: Some("gpt-4o-2024-08-06".to_owned())
            }
        );
        assert_eq!(facts.id.as_deref(), Some("msg_9xYz"));
        assert_eq!(facts.finish_reason.as_deref(), Some("tool_use"));
        // Nothing at all is still a valid (empty) message.
        let empty = encode_answer(&[]);
        assert!(matches!(
            AnthropicMessages.check_answer(&empty).0,
            BodyCheck::Valid { .. }
        ));
        // Arguments that are not a JSON object become `{}`.
        let body = encode_answer(&[call_start(0, "call_1", "f"), args(0, "[1")]);
        let json: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["content"][0]["input"], json!({}));
        assert_eq!(json["id"], GATEWAY_ID);
        assert_eq!(json["stop_reason"], "end_turn");
    }

    /// A Messages request as the dialect reads it.
    fn request(body: &Value) -> MessagesRequest {
        super::super::request::read(Bytes::from(body.to_string()))
            .unwrap()
            .1
    }

    fn neutral(body: &Value) -> Result<NeutralRequest, String> {
        to_neutral(&request(body))
    }

    fn texts(texts: &[&str]) -> Vec<Part> {
        texts.iter().map(|t| Part::Text((*t).to_owned())).collect()
    }

    /// A request shaped like a coding agent's: cache hints, adaptive
    /// thinking, effort, betas' fields, a mid-conversation system turn.
    fn agent_request() -> Value {
        json!({
            "model": "claude-opus-4-6",
            "max_tokens": 32000,
            "stream": true,
            "system": [
                {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Be brief."}
            ],
            "thinking": {"type": "adaptive"},
            "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            "metadata": {"user_id": "user-42"},
            "top_k": 5, "service_tier": "auto", "container": "container_1", "mcp_servers": [],
            "some_future_field": {"x": 1},
            "stop_sequences": ["END"],
            "temperature": 0.5, "top_p": 0.9,
            "tools": [
                {"name": "read_file", "description": "Reads a file",
                 "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
                 "cache_control": {"type": "ephemeral"}},
                {"type": "custom", "name": "noop", "input_schema": {"type": "object"}, "strict": true}
            ],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Read a.txt", "cache_control": {"type": "ephemeral"}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="}, "title": "spec.pdf"},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello"}, "citations": {"enabled": true}},
                    {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should read it.", "signature": "c2ln"},
                    {"type": "redacted_thinking", "data": "ZW5j"},
                    {"type": "text", "text": "Reading.", "citations": null},
                    {"type": "tool_use", "id": "toolu_01A", "name": "read_file", "input": {"path": "a.txt"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "contents", "cache_control": {"type": "ephemeral"}},
                    {"type": "tool_result", "tool_use_id": "toolu_01B", "content": [{"type": "text", "text": "oops"}], "is_error": true},
                    {"type": "text", "text": "Thanks"}
                ]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01C"}]},
                {"role": "system", "content": "Now summarize."},
                {"role": "user", "content": "Go"},
                {"role": "assistant", "content": "Sure:"}
            ]
        })
    }

    #[test]
    fn reads_what_a_coding_agent_sends() {
        let expected = NeutralRequest {
            model: "claude-opus-4-6".to_owned(),
            messages: vec![
                Message::System(texts(&["You are a coding agent.", "Be brief."])),
                Message::User(vec![
                    Part::Text("Read a.txt".to_owned()),
                    Part::Image("data:image/png;base64,iVBORw0KGgo=".to_owned()),
                    Part::Image("https://example.com/cat.jpg".to_owned()),
                    Part::Document {
                        url: "data:application/pdf;base64,JVBERi0xLjQ=".to_owned(),
                        name: Some("spec.pdf".to_owned()),
                    },
                    Part::Document {
                        url: "data:text/plain;base64,aGVsbG8=".to_owned(),
                        name: None,
                    },
                    Part::Document {
                        url: "https://example.com/a.pdf".to_owned(),
                        name: None,
                    },
                ]),
                Message::Assistant(vec![
                    Part::Thinking {
                        text: "I should read it.".to_owned(),
                        signature: Some("c2ln".to_owned()),
                    },
                    Part::RedactedThinking("ZW5j".to_owned()),
                    Part::Text("Reading.".to_owned()),
                    Part::ToolCall {
                        id: "toolu_01A".to_owned(),
                        name: "read_file".to_owned(),
                        arguments: r#"{"path":"a.txt"}"#.to_owned(),
                    },
                ]),
                Message::Tool {
                    call_id: "toolu_01A".to_owned(),
                    content: texts(&["contents"]),
                    is_error: false,
                },
                Message::Tool {
                    call_id: "toolu_01B".to_owned(),
                    content: texts(&["oops"]),
                    is_error: true,
                },
                Message::User(texts(&["Thanks"])),
                Message::Tool {
                    call_id: "toolu_01C".to_owned(),
                    content: Vec::new(),
                    is_error: false,
                },
                Message::System(texts(&["Now summarize."])),
                Message::User(texts(&["Go"])),
                Message::Assistant(texts(&["Sure:"])),
            ],
            tools: vec![
                ToolSpec {
                    name: "read_file".to_owned(),
                    description: Some("Reads a file".to_owned()),
                    parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
                    strict: None,
                },
                ToolSpec {
                    name: "noop".to_owned(),
                    description: None,
                    parameters: json!({"type": "object"}),
                    strict: Some(true),
                },
            ],
            tool_choice: Some(ToolChoice::Auto),
            parallel_tool_calls: Some(false),
            max_output_tokens: Some(32000),
            temperature: Some(0.5),
            top_p: Some(0.9),
            stop: vec!["END".to_owned()],
            reasoning_effort: Some("high".to_owned()),
            thinking_budget: Some(0),
            user: Some("user-42".to_owned()),
            stream: true,
            include_usage: true,
            choices: 1,
            ..NeutralRequest::default()
        };
        assert_eq!(neutral(&agent_request()).unwrap(), expected);
    }

    #[test]
    fn reads_thinking_tool_choices_and_structured_output() {
        let base = |extra: Value| {
            let mut body = json!({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]});
            for (key, value) in extra.as_object().unwrap() {
                body[key] = value.clone();
            }
            neutral(&body).unwrap()
        };
        let plain = base(json!({}));
        assert_eq!(plain.messages, [Message::User(texts(&["hi"]))]);
        assert!(!plain.stream && !plain.include_usage && plain.choices == 1);
        assert_eq!(plain.tool_choice, None);
        for (thinking, budget) in [
            (
                json!({"type": "enabled", "budget_tokens": 2048}),
                Some(2048),
            ),
            (json!({"type": "adaptive"}), Some(0)),
            (json!({"type": "disabled"}), None),
        ] {
            assert_eq!(base(json!({"thinking": thinking})).thinking_budget, budget);
        }
        for (choice, expected, parallel) in [
            (json!({"type": "auto"}), ToolChoice::Auto, None),
            (
                json!({"type": "any", "disable_parallel_tool_use": false}),
                ToolChoice::Required,
                None,
            ),
            (json!({"type": "none"}), ToolChoice::None, None),
            (
                json!({"type": "tool", "name": "f", "disable_parallel_tool_use": true}),
                ToolChoice::Named("f".to_owned()),
                Some(false),
            ),
        ] {
            let read =
                base(json!({"tool_choice": choice, "tools": [{"name": "f", "input_schema": {}}]}));
            assert_eq!(read.tool_choice, Some(expected));
            assert_eq!(read.parallel_tool_calls, parallel);
        }
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        for format in [
            json!({"output_config": {"format": {"type": "json_schema", "schema": schema}}}),
            json!({"output_format": {"type": "json_schema", "schema": schema}}),
        ] {
            let read = base(format);
            assert_eq!(read.response_format, Some(ResponseFormat::JsonSchema));
            assert_eq!(
                read.json_schema,
                Some(json!({"name": "response", "schema": schema, "strict": true}))
            );
        }
    }

    #[test]
    fn refuses_what_the_neutral_model_cannot_carry() {
        let with = |key: &str, value: Value| {
            let mut body = json!({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]});
            body[key] = value;
            neutral(&body).err()
        };
        let block = |block: Value| with("messages", json!([{"role": "user", "content": [block]}]));
        let cases = [
            (
                with(
                    "tools",
                    json!([{"type": "web_search_20250305", "name": "web_search"}]),
                ),
                "server tool web_search_20250305",
            ),
            (
                with("tools", json!([{"type": "bash_20250124", "name": "bash"}])),
                "server tool bash_20250124",
            ),
            (
                with(
                    "mcp_servers",
                    json!([{"type": "url", "url": "https://mcp.example", "name": "x"}]),
                ),
                "mcp_servers",
            ),
            (
                block(json!({"type": "search_result", "source": "s", "title": "t", "content": []})),
                "content block search_result",
            ),
            (
                block(json!({"type": "container_upload", "file_id": "file_1"})),
                "content block container_upload",
            ),
            (
                block(
                    json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}),
                ),
                "content block server_tool_use",
            ),
            (
                block(
                    json!({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "search_result"}]}),
                ),
                "content block search_result",
            ),
            (
                block(json!({"type": "image", "source": {"type": "file", "file_id": "file_1"}})),
                "image source file",
            ),
            (
                block(json!({"type": "document", "source": {"type": "content", "content": []}})),
                "document source content",
            ),
            (
                with("system", json!([{"type": "image", "source": {}}])),
                "content block image",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]),
                ),
                "content block tool_result",
            ),
            (
                with("messages", json!([{"role": "tool", "content": "x"}])),
                "role tool",
            ),
            (
                with("tool_choice", json!({"type": "sometimes"})),
                "tool_choice sometimes",
            ),
        ];
        for (got, reason) in cases {
            assert_eq!(got.as_deref(), Some(reason));
        }
    }

    /// The body `body_from_neutral` writes, as JSON.
    fn body_of(request: &NeutralRequest) -> Value {
        serde_json::from_slice(&body_from_neutral(request, "claude-x").unwrap()).unwrap()
    }

    /// What a chat client's request reads as.
    fn chat_request() -> NeutralRequest {
        NeutralRequest {
            model: "gpt-4o".to_owned(),
            messages: vec![
                Message::System(texts(&["Be brief."])),
                Message::Developer(vec![
                    Part::Text("Use tools.".to_owned()),
                    Part::Text(String::new()),
                ]),
                Message::User(vec![
                    Part::Text("Weather in Paris?".to_owned()),
                    Part::Image("data:image/png;base64,iVBOR".to_owned()),
                    Part::Image("https://example.com/x.png".to_owned()),
                    Part::Document {
                        url: "data:application/pdf;base64,JVBER".to_owned(),
                        name: Some("a.pdf".to_owned()),
                    },
                    Part::Document {
                        url: "data:text/plain;base64,aGVsbG8=".to_owned(),
                        name: None,
                    },
                    Part::Document {
                        url: "data:text/plain,caf%C3%A9".to_owned(),
                        name: None,
                    },
                ]),
                Message::Assistant(vec![
                    Part::Thinking {
                        text: "unsigned reasoning".to_owned(),
                        signature: None,
                    },
                    Part::Text("Checking.".to_owned()),
                    Part::ToolCall {
                        id: "call_1".to_owned(),
                        name: "get_weather".to_owned(),
                        arguments: r#"{"city":"Paris"}"#.to_owned(),
                    },
                    Part::ToolCall {
                        id: "functions.get_time:1".to_owned(),
                        name: "get_time".to_owned(),
                        arguments: "not json".to_owned(),
                    },
                ]),
                Message::Tool {
                    call_id: "call_1".to_owned(),
                    content: texts(&["sunny"]),
                    is_error: false,
                },
                Message::System(texts(&["Answer in French."])),
                Message::Tool {
                    call_id: "functions.get_time:1".to_owned(),
                    content: vec![
                        Part::Text("boom".to_owned()),
                        Part::Image("https://example.com/trace.png".to_owned()),
                    ],
                    is_error: true,
                },
                Message::User(texts(&["And now?"])),
                Message::Assistant(vec![Part::Text(String::new())]),
                Message::Developer(texts(&["Last note.", "Really."])),
            ],
            tools: vec![
                ToolSpec {
                    name: "get_weather".to_owned(),
                    description: Some("Get weather".to_owned()),
                    parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
                    strict: Some(true),
                },
                ToolSpec {
                    name: "get_time".to_owned(),
                    description: None,
                    parameters: Value::Null,
                    strict: None,
                },
            ],
            tool_choice: Some(ToolChoice::Required),
            parallel_tool_calls: Some(false),
            max_output_tokens: Some(1000),
            temperature: Some(1.5),
            top_p: Some(0.5),
            stop: vec!["STOP".to_owned(), String::new()],
            user: Some("u1".to_owned()),
            metadata: Some(json!({"k": "v"})),
            stream: true,
            include_usage: true,
            choices: 1,
            ..NeutralRequest::default()
        }
    }

    #[test]
    fn writes_the_nearest_messages_body() {
        assert_eq!(
            body_of(&chat_request()),
            json!({
                "model": "claude-x",
                "max_tokens": 1000,
                "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
                "messages": [
                    {"role": "user", "content": [
                        {"type": "text", "text": "Weather in Paris?"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}},
                        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}, "title": "a.pdf"},
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello"}},
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "café"}},
                    ]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "functions_get_time_1", "name": "get_time", "input": {}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                        {"type": "tool_result", "tool_use_id": "functions_get_time_1", "is_error": true, "content": [
                            {"type": "text", "text": "boom"},
                            {"type": "image", "source": {"type": "url", "url": "https://example.com/trace.png"}},
                        ]},
                        {"type": "text", "text": "<system>\nAnswer in French.\n</system>"},
                        {"type": "text", "text": "And now?"},
                    ]},
                    {"role": "user", "content": [
                        {"type": "text", "text": "<system>\nLast note.\nReally.\n</system>"},
                    ]},
                ],
                "tools": [
                    {"name": "get_weather", "description": "Get weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                    {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
                ],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "temperature": 1.0,
                "stop_sequences": ["STOP"],
                "metadata": {"user_id": "u1"},
                "stream": true,
            })
        );
    }

    #[test]
    fn system_text_later_on_joins_the_next_user_turn_after_its_tool_results() {
        let request = NeutralRequest {
            messages: vec![
                Message::User(texts(&["hi"])),
                Message::System(texts(&["mid"])),
                Message::Assistant(texts(&["hello"])),
                Message::Tool {
                    call_id: "toolu_1".to_owned(),
                    content: Vec::new(),
                    is_error: false,
                },
                Message::System(texts(&["after results"])),
                Message::Assistant(texts(&["done"])),
            ],
            ..NeutralRequest::default()
        };
        let body = body_of(&request);
        assert_eq!(body["max_tokens"], 4096, "the default limit");
        assert_eq!(body.get("system"), None);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1"},
                    {"type": "text", "text": "<system>\nmid\n</system>"},
                    {"type": "text", "text": "<system>\nafter results\n</system>"},
                ]},
                {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
            ])
        );
        // One leading system text is a string.
        let request = NeutralRequest {
            messages: vec![
                Message::System(texts(&["only"])),
                Message::User(texts(&["x"])),
            ],
            ..NeutralRequest::default()
        };
        assert_eq!(body_of(&request)["system"], "only");
    }

    #[test]
    fn thinking_comes_from_a_budget_or_an_effort() {
        let thinking = |budget: Option<u64>, effort: Option<&str>, max: u64| {
            let request = NeutralRequest {
                thinking_budget: budget,
                reasoning_effort: effort.map(str::to_owned),
                max_output_tokens: Some(max),
                temperature: Some(0.3),
                top_p: Some(0.5),
                ..NeutralRequest::default()
            };
            let body = body_of(&request);
            // With thinking on, no temperature and only a top_p ≥ 0.95;
            // without, the temperature alone.
            let on = body.get("thinking").is_some();
            assert_eq!(body.get("temperature").is_none(), on, "{body}");
            assert_eq!(body.get("top_p"), None, "{body}");
            body.get("thinking").cloned()
        };
        let enabled = |n: u64| Some(json!({"type": "enabled", "budget_tokens": n}));
        assert_eq!(thinking(Some(2048), None, 4096), enabled(2048));
        assert_eq!(thinking(Some(8000), None, 4096), enabled(4095));
        assert_eq!(thinking(Some(500), None, 4096), enabled(1024));
        assert_eq!(thinking(Some(2048), None, 1000), None);
        assert_eq!(
            thinking(Some(0), None, 100),
            Some(json!({"type": "adaptive"}))
        );
        assert_eq!(thinking(Some(2048), Some("low"), 32000), enabled(2048));
        assert_eq!(thinking(None, Some("low"), 32000), enabled(1024));
        assert_eq!(thinking(None, Some("medium"), 32000), enabled(4096));
        assert_eq!(thinking(None, Some("high"), 32000), enabled(16384));
        assert_eq!(thinking(None, Some("xhigh"), 32000), enabled(16384));
        assert_eq!(thinking(None, Some("high"), 8000), enabled(7999));
        assert_eq!(thinking(None, Some("low"), 1024), None);
        assert_eq!(thinking(None, Some("minimal"), 32000), None);
        assert_eq!(thinking(None, Some("none"), 32000), None);
        assert_eq!(thinking(None, None, 32000), None);

        let request = NeutralRequest {
            thinking_budget: Some(2048),
            max_output_tokens: Some(4096),
            top_p: Some(0.97),
            ..NeutralRequest::default()
        };
        assert_eq!(body_of(&request)["top_p"], 0.97);
        let request = NeutralRequest {
            top_p: Some(0.5),
            ..NeutralRequest::default()
        };
        assert_eq!(body_of(&request)["top_p"], 0.5, "a top_p alone stays");
        // A forced tool keeps its force; thinking gives way.
        let mut request = chat_request();
        request.thinking_budget = Some(0);
        let body = body_of(&request);
        assert_eq!(body.get("thinking"), None);
        assert_eq!(body["temperature"], 1.0);
        request.tool_choice = Some(ToolChoice::Auto);
        assert_eq!(body_of(&request)["thinking"], json!({"type": "adaptive"}));
    }

    #[test]
    fn tool_choices_are_written_only_with_tools() {
        let choice = |choice: Option<ToolChoice>, parallel: Option<bool>| {
            let mut request = chat_request();
            request.tool_choice = choice;
            request.parallel_tool_calls = parallel;
            body_of(&request).get("tool_choice").cloned()
        };
        assert_eq!(choice(None, None), None);
        assert_eq!(choice(None, Some(true)), None);
        assert_eq!(
            choice(None, Some(false)),
            Some(json!({"type": "auto", "disable_parallel_tool_use": true}))
        );
        assert_eq!(
            choice(Some(ToolChoice::Auto), None),
            Some(json!({"type": "auto"}))
        );
        assert_eq!(
            choice(Some(ToolChoice::None), Some(false)),
            Some(json!({"type": "none"}))
        );
        assert_eq!(
            choice(Some(ToolChoice::Named("f".to_owned())), None),
            Some(json!({"type": "tool", "name": "f"}))
        );
        let mut request = chat_request();
        request.tools.clear();
        let body = body_of(&request);
        assert_eq!((body.get("tools"), body.get("tool_choice")), (None, None));
    }

    #[test]
    fn refuses_what_messages_cannot_express() {
        type Change = fn(&mut NeutralRequest);
        let refused = |change: Change| {
            let mut request = chat_request();
            change(&mut request);
            body_from_neutral(&request, "claude-x").err()
        };
        let cases: [(Change, &str); 10] = [
            (
                |r| r.stop = vec!["\n".to_owned()],
                "whitespace stop sequences",
            ),
            (|r| r.choices = 2, "n > 1"),
            (|r| r.logprobs = true, "logprobs"),
            (|r| r.audio = true, "audio"),
            (
                |r| r.response_format = Some(ResponseFormat::JsonSchema),
                "response_format json_schema",
            ),
            (
                |r| r.response_format = Some(ResponseFormat::JsonObject),
                "response_format json_object",
            ),
            (
                |r| {
                    r.messages = vec![Message::User(vec![Part::Document {
                        url: "data:text/csv;base64,YQ==".to_owned(),
                        name: None,
                    }])]
                },
                "document text/csv",
            ),
            (
                |r| r.messages = vec![Message::User(vec![Part::Image("file-abc".to_owned())])],
                "image by reference",
            ),
            (
                |r| r.messages = vec![Message::System(vec![Part::Image("https://x".to_owned())])],
                "image in a system message",
            ),
            (
                |r| {
                    r.messages = vec![Message::Assistant(vec![Part::Image(
                        "https://x".to_owned(),
                    )])]
                },
                "image in an assistant message",
            ),
        ];
        for (change, reason) in cases {
            assert_eq!(refused(change).as_deref(), Some(reason));
        }
    }

    #[test]
    fn call_ids_take_messages_form() {
        assert_eq!(call_id("call_abc"), "toolu_abc");
        assert_eq!(call_id("toolu_abc"), "toolu_abc");
        assert_eq!(call_id("D681PevKs"), "D681PevKs");
        assert_eq!(
            call_id("functions.get_weather:0"),
            "functions_get_weather_0"
        );
        let (wire, _) = encode_all(&[call_start(0, "call_a.b", "f"), E::End]);
        assert!(wire.contains(r#""id":"toolu_a_b""#), "{wire}");
        let body = encode_answer(&[call_start(0, "x:1", "f")]);
        assert!(
            std::str::from_utf8(&body)
                .unwrap()
                .contains(r#""id":"x_1""#)
        );
    }

    #[test]
    fn base64_and_data_urls() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("café ✓", "Y2Fmw6kg4pyT"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), encoded);
            assert_eq!(base64_decode(encoded).unwrap(), plain.as_bytes());
        }
        assert_eq!(base64_decode("Zm9v\nYg").unwrap(), b"foob");
        assert_eq!(base64_decode("_-8"), Some(vec![0xff, 0xef]));
        assert_eq!(base64_decode("Zm9v!"), None);
        assert_eq!(percent_decode("a%20b%zz%4"), b"a b%zz%4");
        let url = DataUrl::parse("data:text/plain;charset=utf-8;base64,aGk=").unwrap();
        assert_eq!(
            (url.media_type, url.base64, url.payload),
            ("text/plain", true, "aGk=")
        );
        assert_eq!(
            DataUrl::parse("data:image/png,%01").unwrap().base64(),
            "AQ=="
        );
        assert!(DataUrl::parse("https://x").is_none() && DataUrl::parse("data:x").is_none());
    }

    /// Round trips over what Messages can express.
    mod round_trip {
        use proptest::collection::vec;
        use proptest::prelude::*;

        use super::*;

        fn text() -> impl Strategy<Value = String> {
            "[a-zA-Z0-9 .,!?\"\\\\<>é✓\n]{1,12}"
        }

        fn id() -> impl Strategy<Value = String> {
            "[A-Za-z0-9]{1,10}"
        }

        fn base64_data() -> impl Strategy<Value = String> {
            vec(any::<u8>(), 1..12).prop_map(|bytes| base64_encode(&bytes))
        }

        /// A JSON object, compact, as a model writes arguments.
        fn arguments() -> impl Strategy<Value = String> {
            proptest::collection::btree_map("[a-z]{1,5}", text(), 0..3).prop_map(|map| {
                let object: Map<String, Value> = map
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                Value::Object(object).to_string()
            })
        }

        fn user_part() -> impl Strategy<Value = Part> {
            prop_oneof![
                text().prop_map(Part::Text),
                base64_data().prop_map(|d| Part::Image(format!("data:image/png;base64,{d}"))),
                id().prop_map(|p| Part::Image(format!("https://example.com/{p}.png"))),
                (base64_data(), proptest::option::of(text())).prop_map(|(d, name)| {
                    Part::Document {
                        url: format!("data:application/pdf;base64,{d}"),
                        name,
                    }
                }),
                (text(), proptest::option::of(text())).prop_map(|(t, name)| Part::Document {
                    url: format!("data:text/plain;base64,{}", base64_encode(t.as_bytes())),
                    name,
                }),
                id().prop_map(|p| Part::Document {
                    url: format!("https://example.com/{p}.pdf"),
                    name: None,
                }),
            ]
        }

        fn assistant_part() -> impl Strategy<Value = Part> {
            prop_oneof![
                text().prop_map(Part::Text),
                (text(), base64_data()).prop_map(|(text, signature)| Part::Thinking {
                    text,
                    signature: Some(signature),
                }),
                base64_data().prop_map(Part::RedactedThinking),
                (id(), "[a-z_]{1,8}", arguments()).prop_map(|(id, name, arguments)| {
                    Part::ToolCall {
                        id: format!("toolu_{id}"),
                        name,
                        arguments,
                    }
                }),
            ]
        }

        fn message() -> impl Strategy<Value = Message> {
            let result_part = prop_oneof![
                text().prop_map(Part::Text),
                id().prop_map(|p| Part::Image(format!("https://example.com/{p}.png"))),
            ];
            prop_oneof![
                vec(user_part(), 1..4).prop_map(Message::User),
                vec(assistant_part(), 1..4).prop_map(Message::Assistant),
                (id(), vec(result_part, 0..3), any::<bool>()).prop_map(
                    |(id, content, is_error)| Message::Tool {
                        call_id: format!("toolu_{id}"),
                        content,
                        is_error,
                    }
                ),
            ]
        }

        fn tool() -> impl Strategy<Value = ToolSpec> {
            ("[a-z_]{1,8}", proptest::option::of(text()), "[a-z]{1,5}").prop_map(
                |(name, description, param)| ToolSpec {
                    name,
                    description,
                    parameters: json!({"type": "object", "properties": {param: {"type": "string"}}}),
                    // Messages' tools are written without `strict`.
                    strict: None,
                },
            )
        }

        /// A neutral request in the form Messages reads back: a leading
        /// system message only (a later one becomes marked user text), no
        /// developer role (read back as system), `parallel_tool_calls`
        /// only `Some(false)` with a choice that carries it, thinking
        /// without the sampling and forced tools Messages refuses with it,
        /// a temperature or a top_p (not both), no stop sequence of only
        /// whitespace, tools without `strict` (not written), no effort
        /// (written as a budget), no `metadata` (only its user id is
        /// Messages'), usage asked for exactly when streamed.
        fn request() -> impl Strategy<Value = NeutralRequest> {
            let head = (
                "[a-z0-9-]{1,10}",
                proptest::option::of(vec(text(), 1..3)),
                vec(message(), 0..6),
                vec(tool(), 0..3),
                0u8..5,
                any::<bool>(),
                2000u64..64000,
            );
            let tail = (
                0u8..3,
                proptest::option::of(0u32..=100),
                proptest::option::of(0u32..=100),
                vec("[a-zA-Z][a-zA-Z0-9 .]{0,8}", 0..3),
                proptest::option::of(text()),
                any::<bool>(),
            );
            (head, tail).prop_map(|(head, tail)| {
                let (model, system, conversation, tools, choice, no_parallel, max) = head;
                let (thinking, temperature, top_p, stop, user, stream) = tail;
                let mut messages: Vec<Message> = system
                    .map(|t| Message::System(t.into_iter().map(Part::Text).collect()))
                    .into_iter()
                    .collect();
                messages.extend(conversation);
                let tool_choice = match (tools.first(), choice) {
                    (None, _) | (_, 0) => None,
                    (_, 1) => Some(ToolChoice::Auto),
                    (_, 2) => Some(ToolChoice::None),
                    (_, 3) => Some(ToolChoice::Required),
                    (Some(tool), _) => Some(ToolChoice::Named(tool.name.clone())),
                };
                let carries_parallel = matches!(
                    tool_choice,
                    Some(ToolChoice::Auto | ToolChoice::Required | ToolChoice::Named(_))
                );
                let forced = matches!(
                    tool_choice,
                    Some(ToolChoice::Required | ToolChoice::Named(_))
                );
                let thinking_budget = match thinking {
                    _ if forced => None,
                    1 => Some(0),
                    2 => Some(MIN_THINKING_BUDGET + max % (max - MIN_THINKING_BUDGET)),
                    _ => None,
                };
                let sampling = |v: Option<u32>| {
                    v.filter(|_| thinking_budget.is_none())
                        .map(|v| f64::from(v) / 100.0)
                };
                let temperature = sampling(temperature);
                // A temperature or a top_p, as current models take.
                let top_p = sampling(top_p).filter(|_| temperature.is_none());
                NeutralRequest {
                    model,
                    messages,
                    tools,
                    tool_choice,
                    parallel_tool_calls: (no_parallel && carries_parallel).then_some(false),
                    max_output_tokens: Some(max),
                    temperature,
                    top_p,
                    stop,
                    thinking_budget,
                    user,
                    stream,
                    include_usage: stream,
                    choices: 1,
                    ..NeutralRequest::default()
                }
            })
        }

        /// A segment of an answer: events that form one or more blocks.
        fn segment() -> impl Strategy<Value = Vec<NeutralEvent>> {
            prop_oneof![
                vec(text().prop_map(NeutralEvent::Text), 1..3),
                // A refusal is Messages text: read back as text.
                text().prop_map(|t| vec![NeutralEvent::Refusal(t)]),
                (vec(text(), 1..3), proptest::option::of(base64_data())).prop_map(|(t, sig)| {
                    t.into_iter()
                        .map(NeutralEvent::Thinking)
                        .chain(sig.map(NeutralEvent::ThinkingSignature))
                        .collect()
                }),
                base64_data().prop_map(|d| vec![NeutralEvent::RedactedThinking(d)]),
                (id(), "[a-z_]{1,8}", arguments(), 1usize..8).prop_map(
                    |(id, name, arguments, size)| {
                        // The arguments streamed in pieces of `size` characters.
                        let chars: Vec<char> = arguments.chars().collect();
                        let pieces = chars
                            .chunks(size)
                            .map(|piece| piece.iter().collect::<String>());
                        // Index filled in by `answer`.
                        let mut events = vec![NeutralEvent::ToolCallStart {
                            index: 0,
                            id: format!("toolu_{id}"),
                            name,
                        }];
                        events.extend(
                            pieces.map(|delta| NeutralEvent::ToolCallArguments { index: 0, delta }),
                        );
                        events.push(NeutralEvent::ToolCallEnd { index: 0 });
                        events
                    }
                ),
            ]
        }

        fn finish() -> impl Strategy<Value = FinishReason> {
            prop_oneof![
                Just(FinishReason::Stop),
                Just(FinishReason::StopSequence),
                Just(FinishReason::Length),
                Just(FinishReason::ToolCalls),
                Just(FinishReason::ContentFilter),
                Just(FinishReason::Other("pause_turn".to_owned())),
            ]
        }

        /// An answer's events, tool calls numbered in order.
        fn answer() -> impl Strategy<Value = Vec<NeutralEvent>> {
            (
                id(),
                "[a-z0-9-]{1,10}",
                vec(segment(), 0..6),
                (0u64..1_000_000, 0u64..100_000, 0u64..=100),
                finish(),
            )
                .prop_map(|(id, model, segments, (input, output, share), finish)| {
                    let mut events = vec![start(&format!("msg_{id}"), &model)];
                    let mut calls = 0;
                    for mut segment in segments {
                        if matches!(segment.first(), Some(NeutralEvent::ToolCallStart { .. })) {
                            for event in &mut segment {
                                if let NeutralEvent::ToolCallStart { index, .. }
                                | NeutralEvent::ToolCallArguments { index, .. }
                                | NeutralEvent::ToolCallEnd { index } = event
                                {
                                    *index = calls;
                                }
                            }
                            calls += 1;
                        }
                        events.extend(segment);
                    }
                    events.push(NeutralEvent::Usage(usage(
                        input,
                        output,
                        input * share / 100,
                    )));
                    events.push(NeutralEvent::Finish(finish));
                    events.push(NeutralEvent::End);
                    events
                })
        }

        /// Refusals as text: Messages has no refusal block.
        fn as_text(events: &[NeutralEvent]) -> Vec<NeutralEvent> {
            events
                .iter()
                .map(|event| match event {
                    NeutralEvent::Refusal(t) => NeutralEvent::Text(t.clone()),
                    other => other.clone(),
                })
                .collect()
        }

        /// Adjacent pieces of one block joined, as a whole answer holds
        /// them.
        fn joined(events: &[NeutralEvent]) -> Vec<NeutralEvent> {
            let mut out: Vec<NeutralEvent> = Vec::new();
            for event in as_text(events) {
                match (out.last_mut(), event) {
                    (Some(NeutralEvent::Text(a)), NeutralEvent::Text(b))
                    | (Some(NeutralEvent::Thinking(a)), NeutralEvent::Thinking(b)) => {
                        a.push_str(&b)
                    }
                    (
                        Some(NeutralEvent::ToolCallArguments { index: i, delta: a }),
                        NeutralEvent::ToolCallArguments { index: j, delta: b },
                    ) if *i == j => a.push_str(&b),
                    (_, event) => out.push(event),
                }
            }
            out
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn requests_survive_messages(request in request()) {
                let body = body_from_neutral(&request, &request.model).unwrap();
                let (_, read) = super::super::super::request::read(body).unwrap();
                prop_assert_eq!(to_neutral(&read).unwrap(), request);
            }

            #[test]
            fn streams_survive_messages(events in answer()) {
                let (wire, _) = encode_all(&events);
                // `message_start` reports usage before any is known: zero.
                let mut expected = as_text(&events);
                expected.insert(1, NeutralEvent::Usage(Usage::default()));
                prop_assert_eq!(decode_all(wire.as_bytes()), expected);
                for event in sse_events(wire.as_bytes()) {
                    let kind = AnthropicMessages.inspect(&event, &mut Default::default()).kind;
                    prop_assert!(kind != ChunkKind::Malformed && kind != ChunkKind::Error);
                }
            }

            #[test]
            fn answers_survive_messages(events in answer()) {
                let body = encode_answer(&events);
                let valid = matches!(AnthropicMessages.check_answer(&body).0, BodyCheck::Valid { .. });
                prop_assert!(valid, "{}", String::from_utf8_lossy(&body));
                prop_assert_eq!(decode_answer(&body).unwrap(), joined(&events));
            }
        }
    }
}
