//! Translation to and from the neutral model: chat completions.
//!
//! Requests are read from the client's body again with `serde_json` (this
//! is the translation path, not the zero-copy one). What the neutral model
//! cannot carry and that changes the answer is refused by name
//! (`logit_bias`, `web_search_options`, a `file_id` input, a non-function
//! tool); what OpenAI documents as a hint is dropped (`store`, `seed`,
//! `service_tier`, the penalties, `verbosity`, `prediction`, the prompt
//! cache fields, an image's `detail`, a message's `name`).
//!
//! Streams are `chat.completion.chunk` events; only choice 0 is
//! translated. Reasoning is written as `delta.reasoning_content`, the
//! field DeepSeek introduced and vLLM, SGLang and most OpenAI-compatible
//! clients read (OpenAI itself streams no reasoning text).

use crate::dialect::json::{effort_of_budget, now, present, read_function, str_of, string_of};
use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::ChatRequest;
use crate::Usage;
use crate::dialect::neutral::{ANSWER_ID_PREFIXES, TOOL_CALL_ID_PREFIXES, reprefix};
use crate::dialect::{
    ChunkIdentity, FinishReason, Message, NeutralEvent, NeutralRequest, Part, ResponseFormat,
    ToolChoice,
};
use crate::sse::SseEvent;

/// This dialect's tool-call id prefix.
const CALL_PREFIX: &str = "call_";
/// This dialect's answer id prefix.
const ANSWER_PREFIX: &str = "chatcmpl-";
/// The stream's end marker.
const DONE: &[u8] = b"data: [DONE]\n\n";
/// Stop reasons of the other dialects the crate knows (Messages'): an
/// `Other` carrying one of them did not come from a chat provider, so it
/// is written as `stop` rather than passed on.
const FOREIGN_REASONS: &[&str] = &[
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
    /// Decoding: `Start` was emitted.
    started: bool,
    /// Decoding: the answer's tool calls, in the order they began (a
    /// call's neutral index is its position here).
    calls: Vec<DecodedCall>,
    /// Decoding: the finish reason was translated.
    finished: bool,
    /// Encoding: the identity every chunk written carries.
    written: Option<Identity>,
    /// Encoding: the last usage given, written in its own chunk at the end.
    usage: Option<Usage>,
}

/// A tool call a decoded stream began.
#[derive(Debug)]
struct DecodedCall {
    /// The chunk's `index` for it.
    wire: Option<u64>,
    /// Its id.
    id: String,
    /// Not ended yet.
    open: bool,
}

/// The identity of a stream written, in this dialect's form.
#[derive(Debug)]
struct Identity {
    id: String,
    model: String,
    created: i64,
}

impl StreamMemo {
    /// The identity of the stream written so far, in this dialect's form.
    pub(super) fn identity(&self) -> ChunkIdentity<'_> {
        match &self.written {
            Some(written) => ChunkIdentity {
                id: Some(Cow::Borrowed(&written.id)),
                model: Some(Cow::Borrowed(&written.model)),
                created: Some(written.created),
            },
            None => ChunkIdentity::default(),
        }
    }
}

// ---------------------------------------------------------------------------
// Small readers of JSON values.

/// A non-empty string member.
fn text_of<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    str_of(value, key).filter(|s| !s.is_empty())
}

/// Whether a value is truthy as the OpenAI SDKs test an `error` member.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|n| n != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// The id a legacy `function_call` gets: chat's legacy function calls
/// have none, and the call and its `function`-role result must agree.
fn legacy_call_id(name: &str) -> String {
    format!("{CALL_PREFIX}{name}")
}

// ---------------------------------------------------------------------------
// Requests: chat → neutral.

/// Reads a chat request into the neutral model.
pub(super) fn to_neutral(request: &ChatRequest) -> Result<NeutralRequest, String> {
    let body: Map<String, Value> =
        serde_json::from_slice(request.body()).map_err(|_| "a JSON object body".to_owned())?;
    refuse_unexpressible(&body)?;
    let mut out = NeutralRequest {
        model: present(&body, "model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        choices: 1,
        ..NeutralRequest::default()
    };
    if let Some(messages) = present(&body, "messages").and_then(Value::as_array) {
        for message in messages {
            let message = read_message(message, &mut out.audio)?;
            out.messages.push(message);
        }
    }
    read_tools(&body, &mut out)?;
    read_sampling(&body, &mut out)?;
    read_options(&body, &mut out);
    Ok(out)
}

/// Fields that change the answer and that the neutral model has no place
/// for.
fn refuse_unexpressible(body: &Map<String, Value>) -> Result<(), String> {
    // A provider-hosted search tool: another provider has none to run.
    if present(body, "web_search_options").is_some() {
        return Err("web_search_options".to_owned());
    }
    // A bias can forbid tokens; an empty map says nothing.
    let bias = present(body, "logit_bias");
    if bias.is_some_and(|b| b.as_object().is_none_or(|m| !m.is_empty())) {
        return Err("logit_bias".to_owned());
    }
    Ok(())
}

/// One message of `messages`.
fn read_message(message: &Value, audio: &mut bool) -> Result<Message, String> {
    let role = str_of(message, "role").unwrap_or_default();
    let content = message.get("content");
    Ok(match role {
        "system" => Message::System(read_content(content, audio)?),
        "developer" => Message::Developer(read_content(content, audio)?),
        "user" => Message::User(read_content(content, audio)?),
        "assistant" => Message::Assistant(read_assistant(message, audio)?),
        "tool" => Message::Tool {
            call_id: string_of(message, "tool_call_id"),
            content: read_content(content, audio)?,
            is_error: false,
        },
        // The legacy result of a legacy `function_call`, named by the
        // function it answers.
        "function" => Message::Tool {
            call_id: legacy_call_id(str_of(message, "name").unwrap_or_default()),
            content: read_content(content, audio)?,
            is_error: false,
        },
        other => return Err(format!("message role {other}")),
    })
}

/// A message's `content`: a string or an array of parts. An empty string
/// is no part at all (the form an empty message is written in).
fn read_content(content: Option<&Value>, audio: &mut bool) -> Result<Vec<Part>, String> {
    match content {
        Some(Value::String(text)) if !text.is_empty() => Ok(vec![Part::Text(text.clone())]),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| read_part(part, audio).transpose())
            .collect(),
        _ => Ok(Vec::new()),
    }
}

/// One content part; `None` for audio input, which only sets the flag.
fn read_part(part: &Value, audio: &mut bool) -> Result<Option<Part>, String> {
    let kind = str_of(part, "type").unwrap_or_default();
    Ok(Some(match kind {
        "text" => Part::Text(string_of(part, "text")),
        "image_url" => {
            // `{url, detail}`; `detail` is a resolution hint, dropped.
            let image = part.get("image_url").unwrap_or(&Value::Null);
            let url = image.as_str().or_else(|| str_of(image, "url"));
            Part::Image(url.unwrap_or_default().to_owned())
        }
        "file" => read_file(part.get("file").unwrap_or(&Value::Null))?,
        "input_audio" => {
            *audio = true;
            return Ok(None);
        }
        "refusal" => Part::Refusal(string_of(part, "refusal")),
        other => return Err(format!("content part {other}")),
    }))
}

/// A `file` part: inline data becomes a document; an uploaded file's id
/// names bytes only OpenAI holds.
fn read_file(file: &Value) -> Result<Part, String> {
    match str_of(file, "file_data") {
        Some(data) => Ok(Part::Document {
            url: data.to_owned(),
            name: str_of(file, "filename").map(str::to_owned),
        }),
        None => Err("file_id input".to_owned()),
    }
}

/// An assistant message of the history: its reasoning (first: it came
/// before the answer), content, refusal and tool calls.
fn read_assistant(message: &Value, audio: &mut bool) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let reasoning = text_of(message, "reasoning_content").or_else(|| text_of(message, "reasoning"));
    if let Some(text) = reasoning {
        parts.push(Part::Thinking {
            text: text.to_owned(),
            signature: None,
        });
    }
    parts.extend(read_content(message.get("content"), audio)?);
    if let Some(refusal) = text_of(message, "refusal") {
        parts.push(Part::Refusal(refusal.to_owned()));
    }
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            parts.push(read_tool_call(call)?);
        }
    }
    if let Some(call) = message.get("function_call").filter(|c| c.is_object()) {
        let name = str_of(call, "name").unwrap_or_default();
        parts.push(Part::ToolCall {
            id: legacy_call_id(name),
            name: name.to_owned(),
            arguments: string_of(call, "arguments"),
        });
    }
    // An earlier spoken answer (`audio: {id}`) needs an audio target.
    if message.get("audio").is_some_and(|a| !a.is_null()) {
        *audio = true;
    }
    Ok(parts)
}

/// One `tool_calls` entry of an assistant message.
fn read_tool_call(call: &Value) -> Result<Part, String> {
    match str_of(call, "type") {
        Some("function") | None => {}
        Some(other) => return Err(format!("tool call type {other}")),
    }
    let function = call.get("function").unwrap_or(&Value::Null);
    Ok(Part::ToolCall {
        id: string_of(call, "id"),
        name: string_of(function, "name"),
        arguments: string_of(function, "arguments"),
    })
}

/// `tools` (and legacy `functions`), `tool_choice` (and legacy
/// `function_call`), `parallel_tool_calls`.
fn read_tools(body: &Map<String, Value>, out: &mut NeutralRequest) -> Result<(), String> {
    for tool in present(body, "tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match str_of(tool, "type").unwrap_or("function") {
            "function" => out
                .tools
                .push(read_function(tool.get("function").unwrap_or(&Value::Null))?),
            other => return Err(format!("tool type {other}")),
        }
    }
    for function in present(body, "functions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.tools.push(read_function(function)?);
    }
    let choice = present(body, "tool_choice").or_else(|| present(body, "function_call"));
    out.tool_choice = choice.map(read_tool_choice).transpose()?;
    out.parallel_tool_calls = present(body, "parallel_tool_calls").and_then(Value::as_bool);
    Ok(())
}

/// `tool_choice` (`"auto"`, `{type: function, function: {name}}`) or the
/// legacy `function_call` (`"auto"`, `{name}`).
fn read_tool_choice(choice: &Value) -> Result<ToolChoice, String> {
    match choice {
        Value::String(mode) => match mode.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(format!("tool_choice {other}")),
        },
        Value::Object(_) => {
            // `allowed_tools` and `custom` choices restrict what may be
            // called: refused rather than widened to `auto`.
            let kind = str_of(choice, "type").unwrap_or("function");
            if kind != "function" {
                return Err(format!("tool_choice {kind}"));
            }
            let name = choice
                .get("function")
                .and_then(|f| str_of(f, "name"))
                .or_else(|| str_of(choice, "name"));
            name.map(|n| ToolChoice::Named(n.to_owned()))
                .ok_or_else(|| "tool_choice without a name".to_owned())
        }
        _ => Err("tool_choice".to_owned()),
    }
}

/// The output limit, sampling, stop sequences, structured output and
/// reasoning.
fn read_sampling(body: &Map<String, Value>, out: &mut NeutralRequest) -> Result<(), String> {
    out.max_output_tokens = present(body, "max_completion_tokens")
        .or_else(|| present(body, "max_tokens"))
        .and_then(Value::as_u64);
    out.temperature = present(body, "temperature").and_then(Value::as_f64);
    out.top_p = present(body, "top_p").and_then(Value::as_f64);
    out.stop = match present(body, "stop") {
        Some(Value::String(stop)) => vec![stop.clone()],
        Some(Value::Array(stops)) => stops
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    if let Some(format) = present(body, "response_format") {
        match str_of(format, "type") {
            Some("text") | None => {}
            Some("json_object") => out.response_format = Some(ResponseFormat::JsonObject),
            Some("json_schema") => {
                out.response_format = Some(ResponseFormat::JsonSchema);
                out.json_schema = format.get("json_schema").cloned();
            }
            Some(other) => return Err(format!("response_format {other}")),
        }
    }
    out.reasoning_effort = present(body, "reasoning_effort")
        .and_then(Value::as_str)
        .map(str::to_owned);
    // OpenRouter's `reasoning` object: `effort`, `max_tokens`, `enabled`.
    let reasoning = present(body, "reasoning").filter(|r| r.is_object());
    if let Some(reasoning) = reasoning.filter(|r| r.get("enabled") != Some(&Value::Bool(false))) {
        if out.reasoning_effort.is_none() {
            out.reasoning_effort = str_of(reasoning, "effort").map(str::to_owned);
        }
        out.thinking_budget = reasoning.get("max_tokens").and_then(Value::as_u64);
        if out.reasoning_effort.is_none() && out.thinking_budget.is_none() {
            // `enabled: true` alone: the target's own budget.
            out.thinking_budget = Some(0);
        }
    }
    Ok(())
}

/// The end user, metadata, streaming, `n`, log probabilities and audio.
fn read_options(body: &Map<String, Value>, out: &mut NeutralRequest) {
    let string = |key: &str| {
        present(body, key)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    out.user = string("user").or_else(|| string("safety_identifier"));
    out.metadata = present(body, "metadata").cloned();
    out.stream = present(body, "stream").and_then(Value::as_bool) == Some(true);
    out.include_usage = present(body, "stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    out.choices = present(body, "n").and_then(Value::as_u64).unwrap_or(1);
    out.logprobs = present(body, "logprobs").and_then(Value::as_bool) == Some(true)
        || present(body, "top_logprobs").is_some();
    let audio_out = present(body, "modalities")
        .and_then(Value::as_array)
        .is_some_and(|m| m.iter().any(|m| m.as_str() == Some("audio")));
    out.audio |= present(body, "audio").is_some() || audio_out;
}

// ---------------------------------------------------------------------------
// Requests: neutral → chat.

/// Writes a chat request body for `model`.
pub(super) fn body_from_neutral(request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
    if request.audio {
        return Err("audio".to_owned());
    }
    let mut body = Map::new();
    body.insert("model".to_owned(), Value::from(model));
    let messages = request
        .messages
        .iter()
        .map(write_message)
        .collect::<Result<Vec<_>, _>>()?;
    body.insert("messages".to_owned(), Value::Array(messages));
    write_tools(request, &mut body);
    write_sampling(request, &mut body)?;
    write_options(request, &mut body);
    serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

/// One message.
fn write_message(message: &Message) -> Result<Value, String> {
    Ok(match message {
        Message::System(parts) => {
            json!({"role": "system", "content": write_content(parts, "system")?})
        }
        Message::Developer(parts) => {
            json!({"role": "developer", "content": write_content(parts, "developer")?})
        }
        Message::User(parts) => json!({"role": "user", "content": write_content(parts, "user")?}),
        Message::Assistant(parts) => write_assistant(parts)?,
        // Chat has no error flag on a tool result: the text says it.
        Message::Tool {
            call_id, content, ..
        } => json!({
            "role": "tool",
            "tool_call_id": reprefix(call_id, TOOL_CALL_ID_PREFIXES, CALL_PREFIX),
            "content": tool_text(content)?,
        }),
    })
}

/// A system, developer or user message's content: a string when it is
/// one text part (or none), else parts.
fn write_content(parts: &[Part], role: &str) -> Result<Value, String> {
    match parts {
        [] => Ok(Value::from("")),
        [Part::Text(text)] => Ok(Value::from(text.as_str())),
        parts => parts
            .iter()
            .filter_map(|part| write_part(part, role).transpose())
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
    }
}

/// One content part; `None` for reasoning, which chat requests have no
/// place for.
fn write_part(part: &Part, role: &str) -> Result<Option<Value>, String> {
    let media = role == "user";
    Ok(Some(match part {
        Part::Text(text) => json!({"type": "text", "text": text}),
        Part::Image(url) if media => json!({"type": "image_url", "image_url": {"url": url}}),
        Part::Document { url, name } if media => {
            // `file_data` takes inline data only; a linked document has
            // no chat form.
            if !url.starts_with("data:") {
                return Err("document URL input".to_owned());
            }
            let mut file = Map::new();
            file.insert("file_data".to_owned(), Value::from(url.as_str()));
            if let Some(name) = name {
                file.insert("filename".to_owned(), Value::from(name.as_str()));
            }
            json!({"type": "file", "file": file})
        }
        Part::Thinking { .. } | Part::RedactedThinking(_) => return Ok(None),
        Part::Image(_) => return Err(format!("an image in a {role} message")),
        Part::Document { .. } => return Err(format!("a document in a {role} message")),
        Part::ToolCall { .. } => return Err(format!("a tool call in a {role} message")),
        Part::Refusal(_) => return Err(format!("a refusal in a {role} message")),
    }))
}

/// An assistant message: its text joined, its refusal, its tool calls.
/// Reasoning is dropped: chat requests have no place for it.
fn write_assistant(parts: &[Part]) -> Result<Value, String> {
    let mut text: Option<String> = None;
    let mut refusal: Option<String> = None;
    let mut calls = Vec::new();
    for part in parts {
        match part {
            Part::Text(t) => text.get_or_insert_with(String::new).push_str(t),
            Part::Refusal(r) => refusal.get_or_insert_with(String::new).push_str(r),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => calls.push(json!({
                "id": reprefix(id, TOOL_CALL_ID_PREFIXES, CALL_PREFIX),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            })),
            Part::Thinking { .. } | Part::RedactedThinking(_) => {}
            Part::Image(_) => return Err("an image in an assistant message".to_owned()),
            Part::Document { .. } => return Err("a document in an assistant message".to_owned()),
        }
    }
    let mut message = Map::new();
    message.insert("role".to_owned(), Value::from("assistant"));
    // An assistant message needs content or tool calls: an empty turn is
    // written as empty text, not `null`.
    let content = match text {
        Some(text) => Value::from(text),
        None if calls.is_empty() && refusal.is_none() => Value::from(""),
        None => Value::Null,
    };
    message.insert("content".to_owned(), content);
    if !calls.is_empty() {
        message.insert("tool_calls".to_owned(), Value::Array(calls));
    }
    if let Some(refusal) = refusal {
        message.insert("refusal".to_owned(), Value::from(refusal));
    }
    Ok(Value::Object(message))
}

/// A tool result's content: chat's tool messages carry text only.
fn tool_text(content: &[Part]) -> Result<String, String> {
    let mut text = String::new();
    for part in content {
        match part {
            Part::Text(t) => text.push_str(t),
            Part::Document { .. } => return Err("tool result with a document".to_owned()),
            _ => return Err("tool result with an image".to_owned()),
        }
    }
    Ok(text)
}

/// `tools`, `tool_choice` and `parallel_tool_calls`: the last two only
/// with tools (OpenAI refuses them alone).
fn write_tools(request: &NeutralRequest, body: &mut Map<String, Value>) {
    if request.tools.is_empty() {
        return;
    }
    let tools = request.tools.iter().map(|tool| {
        let mut function = Map::new();
        function.insert("name".to_owned(), Value::from(tool.name.as_str()));
        if let Some(description) = &tool.description {
            function.insert("description".to_owned(), Value::from(description.as_str()));
        }
        if !tool.parameters.is_null() {
            function.insert("parameters".to_owned(), tool.parameters.clone());
        }
        if let Some(strict) = tool.strict {
            function.insert("strict".to_owned(), Value::Bool(strict));
        }
        json!({"type": "function", "function": function})
    });
    body.insert("tools".to_owned(), tools.collect());
    if let Some(choice) = &request.tool_choice {
        let choice = match choice {
            ToolChoice::Auto => Value::from("auto"),
            ToolChoice::None => Value::from("none"),
            ToolChoice::Required => Value::from("required"),
            ToolChoice::Named(name) => json!({"type": "function", "function": {"name": name}}),
        };
        body.insert("tool_choice".to_owned(), choice);
    }
    if let Some(parallel) = request.parallel_tool_calls {
        body.insert("parallel_tool_calls".to_owned(), Value::Bool(parallel));
    }
}

/// The output limit, sampling, stop sequences, structured output and
/// reasoning effort.
fn write_sampling(request: &NeutralRequest, body: &mut Map<String, Value>) -> Result<(), String> {
    if let Some(max) = request.max_output_tokens {
        body.insert("max_completion_tokens".to_owned(), Value::from(max));
    }
    if let Some(temperature) = request.temperature {
        body.insert("temperature".to_owned(), Value::from(temperature));
    }
    if let Some(top_p) = request.top_p {
        body.insert("top_p".to_owned(), Value::from(top_p));
    }
    if !request.stop.is_empty() {
        body.insert("stop".to_owned(), Value::from(request.stop.clone()));
    }
    match request.response_format {
        None => {}
        Some(ResponseFormat::JsonObject) => {
            body.insert("response_format".to_owned(), json!({"type": "json_object"}));
        }
        Some(ResponseFormat::JsonSchema) => {
            let schema = request
                .json_schema
                .clone()
                .ok_or_else(|| "json_schema without a schema".to_owned())?;
            let format = json!({"type": "json_schema", "json_schema": schema});
            body.insert("response_format".to_owned(), format);
        }
    }
    let effort = match (&request.reasoning_effort, request.thinking_budget) {
        (Some(effort), _) => Some(effort.clone()),
        (None, Some(budget)) => Some(effort_of_budget(budget).to_owned()),
        (None, None) => None,
    };
    if let Some(effort) = effort {
        body.insert("reasoning_effort".to_owned(), Value::from(effort));
    }
    Ok(())
}

/// The end user, metadata, `n`, log probabilities and streaming (always
/// with usage, so spend can be counted).
fn write_options(request: &NeutralRequest, body: &mut Map<String, Value>) {
    if let Some(user) = &request.user {
        body.insert("user".to_owned(), Value::from(user.as_str()));
    }
    if let Some(metadata) = &request.metadata {
        body.insert("metadata".to_owned(), metadata.clone());
    }
    if request.choices > 1 {
        body.insert("n".to_owned(), Value::from(request.choices));
    }
    if request.logprobs {
        body.insert("logprobs".to_owned(), Value::Bool(true));
    }
    if request.stream {
        body.insert("stream".to_owned(), Value::Bool(true));
        body.insert("stream_options".to_owned(), json!({"include_usage": true}));
    }
}

// ---------------------------------------------------------------------------
// Finish reasons and usage.

/// A chat finish reason in neutral terms.
fn read_finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

/// A neutral finish reason as chat writes it: another dialect's reason
/// is `stop`, a chat provider's own (`error`, `abort`, ...) is kept.
fn write_finish_reason(reason: &FinishReason) -> &str {
    match reason {
        FinishReason::Stop | FinishReason::StopSequence => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Other(other)
            if other.is_empty() || FOREIGN_REASONS.contains(&other.as_str()) =>
        {
            "stop"
        }
        FinishReason::Other(other) => other,
    }
}

/// A chat `usage` object: `prompt_tokens` counts all input, cached reads
/// included (`prompt_tokens_details.cached_tokens`, or DeepSeek's
/// `prompt_cache_hit_tokens`).
fn read_usage(usage: &Value) -> Usage {
    let count = |value: Option<&Value>| value.and_then(Value::as_u64);
    let mut read = Usage::new(
        count(usage.get("prompt_tokens")).unwrap_or(0),
        count(usage.get("completion_tokens")).unwrap_or(0),
    );
    read.cached_input_tokens = count(usage.pointer("/prompt_tokens_details/cached_tokens"))
        .or_else(|| count(usage.get("prompt_cache_hit_tokens")))
        .unwrap_or(0);
    read
}

/// A `usage` object as chat writes it.
#[derive(Serialize)]
struct UsageOut {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    prompt_tokens_details: CachedOut,
}

/// `prompt_tokens_details`.
#[derive(Serialize)]
struct CachedOut {
    cached_tokens: u64,
}

impl From<&Usage> for UsageOut {
    fn from(usage: &Usage) -> Self {
        Self {
            prompt_tokens: usage.input_tokens,
            completion_tokens: usage.output_tokens,
            total_tokens: usage.input_tokens.saturating_add(usage.output_tokens),
            prompt_tokens_details: CachedOut {
                cached_tokens: usage.cached_input_tokens,
            },
        }
    }
}

// ---------------------------------------------------------------------------
// Streams: chat → neutral.

/// Reads one event of a chat stream.
pub(super) fn decode_event(event: &SseEvent, memo: &mut StreamMemo, out: &mut Vec<NeutralEvent>) {
    if event.data().starts_with(b"[DONE]") {
        out.push(NeutralEvent::End);
        return;
    }
    // `event: error` and other named events carry no answer.
    if !event.is_named("message") {
        return;
    }
    if memo.started && decode_text_chunk(event.data(), out) {
        return;
    }
    let Ok(chunk) = serde_json::from_slice::<Value>(event.data()) else {
        return;
    };
    if !chunk.is_object() || chunk.get("error").is_some_and(truthy) {
        return;
    }
    let mark = out.len();
    let id = text_of(&chunk, "id");
    if !memo.started && id.is_some() {
        out.push(start_of(&chunk));
        memo.started = true;
    }
    let choices = chunk.get("choices").and_then(Value::as_array);
    let first = choices
        .into_iter()
        .flatten()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0);
    if let Some(choice) = first {
        if let Some(delta) = choice.get("delta").filter(|d| d.is_object()) {
            decode_delta(delta, memo, out);
        }
        if let Some(reason) = text_of(choice, "finish_reason") {
            decode_finish(reason, memo, out);
        }
    }
    if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
        out.push(NeutralEvent::Usage(read_usage(usage)));
    }
    // A stream whose chunks name no id (Azure's leading prompt-filter
    // chunk has `""`) still starts before its first event.
    if !memo.started && out.len() > mark {
        out.insert(mark, start_of(&chunk));
        memo.started = true;
    }
}

/// The common chunk of a stream under way, read without building a JSON
/// tree: one choice (index 0) whose delta carries only text, no finish,
/// no usage, no error. Anything else (`false`) takes the full reading,
/// which gives the same events for such a chunk.
fn decode_text_chunk(data: &[u8], out: &mut Vec<NeutralEvent>) -> bool {
    #[derive(Deserialize)]
    struct Chunk<'a> {
        #[serde(default)]
        error: Option<IgnoredAny>,
        #[serde(default)]
        usage: Option<IgnoredAny>,
        #[serde(borrow)]
        choices: [Choice<'a>; 1],
    }
    #[derive(Deserialize)]
    struct Choice<'a> {
        #[serde(default)]
        index: u64,
        #[serde(default)]
        finish_reason: Option<IgnoredAny>,
        #[serde(borrow)]
        delta: Delta<'a>,
    }
    #[derive(Deserialize)]
    struct Delta<'a> {
        #[serde(borrow, default)]
        content: Option<Cow<'a, str>>,
        #[serde(default)]
        reasoning_content: Option<IgnoredAny>,
        #[serde(default)]
        reasoning: Option<IgnoredAny>,
        #[serde(default)]
        refusal: Option<IgnoredAny>,
        #[serde(default)]
        tool_calls: Option<IgnoredAny>,
        #[serde(default)]
        function_call: Option<IgnoredAny>,
    }
    let Ok(chunk) = serde_json::from_slice::<Chunk<'_>>(data) else {
        return false;
    };
    let [choice] = chunk.choices;
    let delta = choice.delta;
    let plain = chunk.error.is_none()
        && chunk.usage.is_none()
        && choice.index == 0
        && choice.finish_reason.is_none()
        && delta.reasoning_content.is_none()
        && delta.reasoning.is_none()
        && delta.refusal.is_none()
        && delta.tool_calls.is_none()
        && delta.function_call.is_none();
    if !plain {
        return false;
    }
    if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
        out.push(NeutralEvent::Text(text.into_owned()));
    }
    true
}

/// `Start` from a chunk's (or a whole answer's) identity.
fn start_of(chunk: &Value) -> NeutralEvent {
    NeutralEvent::Start {
        id: string_of(chunk, "id"),
        model: string_of(chunk, "model"),
        created: chunk.get("created").and_then(Value::as_i64),
    }
}

/// One `delta` of choice 0: reasoning, text, refusal, tool calls.
fn decode_delta(delta: &Value, memo: &mut StreamMemo, out: &mut Vec<NeutralEvent>) {
    // `reasoning_content` (DeepSeek, older vLLM) or `reasoning` (vLLM,
    // Ollama, OpenRouter); a provider sending both sends the same text.
    let reasoning = text_of(delta, "reasoning_content").or_else(|| text_of(delta, "reasoning"));
    if let Some(text) = reasoning {
        out.push(NeutralEvent::Thinking(text.to_owned()));
    }
    if let Some(text) = text_of(delta, "content") {
        out.push(NeutralEvent::Text(text.to_owned()));
    }
    if let Some(text) = text_of(delta, "refusal") {
        out.push(NeutralEvent::Refusal(text.to_owned()));
    }
    for entry in delta
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let function = entry.get("function").unwrap_or(&Value::Null);
        let call = CallDelta {
            wire: entry.get("index").and_then(Value::as_u64),
            id: text_of(entry, "id"),
            name: str_of(function, "name"),
            arguments: str_of(function, "arguments"),
        };
        decode_call(&call, memo, out);
    }
    // The legacy single `function_call`: its name comes first, then the
    // arguments; it has no id, so it gets the one its history form gets.
    if let Some(function) = delta.get("function_call").filter(|f| f.is_object()) {
        let name = text_of(function, "name");
        let id = name.map(legacy_call_id);
        let call = CallDelta {
            wire: Some(0),
            id: id.as_deref(),
            name,
            arguments: str_of(function, "arguments"),
        };
        decode_call(&call, memo, out);
    }
}

/// One piece of a streamed tool call.
struct CallDelta<'a> {
    wire: Option<u64>,
    id: Option<&'a str>,
    name: Option<&'a str>,
    arguments: Option<&'a str>,
}

/// A piece of a tool call: a new call (a new `index`, or a new id at a
/// known one, as some providers reuse index 0) begins; then its arguments.
fn decode_call(call: &CallDelta<'_>, memo: &mut StreamMemo, out: &mut Vec<NeutralEvent>) {
    let known = match call.wire {
        Some(wire) => memo.calls.iter().rposition(|c| c.wire == Some(wire)),
        // No index: a new call when it names an id, else the last one.
        None if call.id.is_none() => memo.calls.len().checked_sub(1),
        None => None,
    };
    let known = known.filter(|&at| call.id.is_none_or(|id| memo.calls[at].id == id));
    let at = match known {
        Some(at) => at,
        None => {
            let id = call.id.unwrap_or_default().to_owned();
            out.push(NeutralEvent::ToolCallStart {
                index: u32::try_from(memo.calls.len()).unwrap_or(u32::MAX),
                id: id.clone(),
                name: call.name.unwrap_or_default().to_owned(),
            });
            memo.calls.push(DecodedCall {
                wire: call.wire,
                id,
                open: true,
            });
            memo.calls.len() - 1
        }
    };
    if let Some(arguments) = call.arguments.filter(|a| !a.is_empty()) {
        out.push(NeutralEvent::ToolCallArguments {
            index: u32::try_from(at).unwrap_or(u32::MAX),
            delta: arguments.to_owned(),
        });
    }
}

/// The finish reason: every open call ends, then the answer finishes
/// (once: a provider repeating it says nothing new).
fn decode_finish(reason: &str, memo: &mut StreamMemo, out: &mut Vec<NeutralEvent>) {
    if memo.finished {
        return;
    }
    memo.finished = true;
    for (index, call) in memo.calls.iter_mut().enumerate() {
        if call.open {
            call.open = false;
            out.push(NeutralEvent::ToolCallEnd {
                index: u32::try_from(index).unwrap_or(u32::MAX),
            });
        }
    }
    out.push(NeutralEvent::Finish(read_finish_reason(reason)));
}

// ---------------------------------------------------------------------------
// Streams: neutral → chat.

/// A `chat.completion.chunk`.
#[derive(Serialize)]
struct ChunkOut<'a> {
    id: &'a str,
    object: &'static str,
    created: i64,
    model: &'a str,
    choices: &'a [ChoiceOut<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageOut>,
}

/// A chunk's choice (always 0).
#[derive(Serialize)]
struct ChoiceOut<'a> {
    index: u32,
    delta: DeltaOut<'a>,
    finish_reason: Option<&'a str>,
}

/// A chunk's `delta`: only the members set are written.
#[derive(Serialize, Default)]
struct DeltaOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[CallDeltaOut<'a>; 1]>,
}

/// One `delta.tool_calls` entry.
#[derive(Serialize)]
struct CallDeltaOut<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<Cow<'a, str>>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDeltaOut<'a>,
}

/// A tool call entry's `function`.
#[derive(Serialize)]
struct FunctionDeltaOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

/// Writes one neutral event as chat chunks.
pub(super) fn encode_event(event: &NeutralEvent, memo: &mut StreamMemo, out: &mut BytesMut) {
    let delta = match event {
        NeutralEvent::Start { id, model, created } => {
            memo.written = Some(Identity {
                id: reprefix(id, ANSWER_ID_PREFIXES, ANSWER_PREFIX).into_owned(),
                model: model.clone(),
                created: created.unwrap_or_else(now),
            });
            DeltaOut {
                role: Some("assistant"),
                content: Some(""),
                ..DeltaOut::default()
            }
        }
        NeutralEvent::Text(text) if !text.is_empty() => DeltaOut {
            content: Some(text),
            ..DeltaOut::default()
        },
        NeutralEvent::Thinking(text) if !text.is_empty() => DeltaOut {
            reasoning_content: Some(text),
            ..DeltaOut::default()
        },
        NeutralEvent::Refusal(text) if !text.is_empty() => DeltaOut {
            refusal: Some(text),
            ..DeltaOut::default()
        },
        NeutralEvent::ToolCallStart { index, id, name } => DeltaOut {
            tool_calls: Some([CallDeltaOut {
                index: *index,
                id: Some(reprefix(id, TOOL_CALL_ID_PREFIXES, CALL_PREFIX)),
                kind: Some("function"),
                function: FunctionDeltaOut {
                    name: Some(name),
                    arguments: "",
                },
            }]),
            ..DeltaOut::default()
        },
        NeutralEvent::ToolCallArguments { index, delta } if !delta.is_empty() => DeltaOut {
            tool_calls: Some([CallDeltaOut {
                index: *index,
                id: None,
                kind: None,
                function: FunctionDeltaOut {
                    name: None,
                    arguments: delta,
                },
            }]),
            ..DeltaOut::default()
        },
        NeutralEvent::Usage(usage) => {
            memo.usage = Some(*usage);
            return;
        }
        NeutralEvent::Finish(reason) => {
            let reason = write_finish_reason(reason);
            write_chunk(memo, DeltaOut::default(), Some(reason), out);
            return;
        }
        NeutralEvent::End => {
            write_end(memo, out);
            return;
        }
        // Chat has no signature, no encrypted reasoning and no end of a
        // tool call; empty pieces are no output.
        _ => return,
    };
    write_chunk(memo, delta, None, out);
}

/// The identity chunks carry: the `Start`'s, or (no `Start` given) an
/// empty id and model at the current time.
fn identity(memo: &mut StreamMemo) -> &Identity {
    memo.written.get_or_insert_with(|| Identity {
        id: String::new(),
        model: String::new(),
        created: now(),
    })
}

/// Writes one `data:` event holding a chunk with choice 0.
fn write_chunk(
    memo: &mut StreamMemo,
    delta: DeltaOut<'_>,
    finish_reason: Option<&str>,
    out: &mut BytesMut,
) {
    let identity = identity(memo);
    let choices = [ChoiceOut {
        index: 0,
        delta,
        finish_reason,
    }];
    let chunk = ChunkOut {
        id: &identity.id,
        object: "chat.completion.chunk",
        created: identity.created,
        model: &identity.model,
        choices: &choices,
        usage: None,
    };
    write_data(&chunk, out);
}

/// The end: the usage chunk (when usage was given), then `[DONE]`.
fn write_end(memo: &mut StreamMemo, out: &mut BytesMut) {
    if let Some(usage) = memo.usage.take() {
        let identity = identity(memo);
        let chunk = ChunkOut {
            id: &identity.id,
            object: "chat.completion.chunk",
            created: identity.created,
            model: &identity.model,
            choices: &[],
            usage: Some(UsageOut::from(&usage)),
        };
        write_data(&chunk, out);
    }
    out.put_slice(DONE);
}

/// Appends `data: <json>\n\n`; nothing if serializing fails (it cannot
/// for these types), so no half event is ever written.
fn write_data(value: &impl Serialize, out: &mut BytesMut) {
    let mark = out.len();
    out.put_slice(b"data: ");
    if serde_json::to_writer((&mut *out).writer(), value).is_err() {
        out.truncate(mark);
        return;
    }
    out.put_slice(b"\n\n");
}

// ---------------------------------------------------------------------------
// Whole answers.

/// Reads a `chat.completion` body as the events its stream would give:
/// Start, reasoning, text, refusal, tool calls, their ends, usage,
/// finish, end.
pub(super) fn decode_answer(body: &[u8]) -> Option<Vec<NeutralEvent>> {
    let answer: Value = serde_json::from_slice(body).ok()?;
    if !answer.is_object() || answer.get("error").is_some_and(truthy) {
        return None;
    }
    let choices = answer.get("choices")?.as_array()?;
    let choice = choices
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64) == Some(0))
        .or_else(|| choices.first())?;
    let mut out = vec![start_of(&answer)];
    let message = choice.get("message").unwrap_or(&Value::Null);
    let reasoning = text_of(message, "reasoning_content").or_else(|| text_of(message, "reasoning"));
    if let Some(text) = reasoning {
        out.push(NeutralEvent::Thinking(text.to_owned()));
    }
    if let Some(text) = answer_text(message.get("content")).filter(|t| !t.is_empty()) {
        out.push(NeutralEvent::Text(text));
    }
    if let Some(text) = text_of(message, "refusal") {
        out.push(NeutralEvent::Refusal(text.to_owned()));
    }
    let calls = answer_calls(message);
    for (index, (id, name, arguments)) in (0u32..).zip(&calls) {
        out.push(NeutralEvent::ToolCallStart {
            index,
            id: id.clone(),
            name: (*name).to_owned(),
        });
        if !arguments.is_empty() {
            out.push(NeutralEvent::ToolCallArguments {
                index,
                delta: (*arguments).to_owned(),
            });
        }
    }
    out.extend(
        (0u32..)
            .take(calls.len())
            .map(|index| NeutralEvent::ToolCallEnd { index }),
    );
    if let Some(usage) = answer.get("usage").filter(|u| u.is_object()) {
        out.push(NeutralEvent::Usage(read_usage(usage)));
    }
    if let Some(reason) = text_of(choice, "finish_reason") {
        out.push(NeutralEvent::Finish(read_finish_reason(reason)));
    }
    out.push(NeutralEvent::End);
    Some(out)
}

/// A message's text: a string, or its text parts joined.
fn answer_text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => Some(parts.iter().filter_map(|p| str_of(p, "text")).collect()),
        _ => None,
    }
}

/// A message's tool calls (id, name, arguments), the legacy
/// `function_call` included.
fn answer_calls(message: &Value) -> Vec<(String, &str, &str)> {
    let mut calls: Vec<(String, &str, &str)> = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|call| {
            let function = call.get("function").unwrap_or(&Value::Null);
            (
                string_of(call, "id"),
                str_of(function, "name").unwrap_or_default(),
                str_of(function, "arguments").unwrap_or_default(),
            )
        })
        .collect();
    if let Some(call) = message.get("function_call").filter(|c| c.is_object()) {
        let name = str_of(call, "name").unwrap_or_default();
        calls.push((
            legacy_call_id(name),
            name,
            str_of(call, "arguments").unwrap_or_default(),
        ));
    }
    calls
}

/// A `chat.completion` body.
#[derive(Serialize)]
struct AnswerOut<'a> {
    id: Cow<'a, str>,
    object: &'static str,
    created: i64,
    model: &'a str,
    choices: [AnswerChoiceOut<'a>; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageOut>,
}

/// The answer's one choice.
#[derive(Serialize)]
struct AnswerChoiceOut<'a> {
    index: u32,
    message: AnswerMessageOut<'a>,
    finish_reason: Option<&'a str>,
    logprobs: Option<()>,
}

/// The answer's message.
#[derive(Serialize)]
struct AnswerMessageOut<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<AnswerCallOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
}

/// One of the message's tool calls.
#[derive(Serialize)]
struct AnswerCallOut<'a> {
    id: Cow<'a, str>,
    #[serde(rename = "type")]
    kind: &'static str,
    function: AnswerFunctionOut<'a>,
}

/// A tool call's function.
#[derive(Serialize)]
struct AnswerFunctionOut<'a> {
    name: &'a str,
    arguments: &'a str,
}

/// What a whole answer's events add up to.
#[derive(Default)]
struct Collected<'a> {
    id: &'a str,
    model: &'a str,
    created: Option<i64>,
    text: Option<String>,
    thinking: Option<String>,
    refusal: Option<String>,
    /// Index, id, name, arguments.
    calls: Vec<(u32, &'a str, &'a str, String)>,
    usage: Option<Usage>,
    finish: Option<&'a FinishReason>,
}

/// Adds up a whole answer's events.
fn collect(events: &[NeutralEvent]) -> Collected<'_> {
    let mut answer = Collected::default();
    for event in events {
        match event {
            NeutralEvent::Start { id, model, created } => {
                (answer.id, answer.model, answer.created) = (id, model, *created);
            }
            NeutralEvent::Text(t) => answer.text.get_or_insert_with(String::new).push_str(t),
            NeutralEvent::Thinking(t) => {
                answer.thinking.get_or_insert_with(String::new).push_str(t)
            }
            NeutralEvent::Refusal(t) => answer.refusal.get_or_insert_with(String::new).push_str(t),
            NeutralEvent::ToolCallStart { index, id, name } => {
                answer.calls.push((*index, id, name, String::new()));
            }
            NeutralEvent::ToolCallArguments { index, delta } => {
                let call = answer.calls.iter_mut().rev().find(|c| c.0 == *index);
                if let Some(call) = call {
                    call.3.push_str(delta);
                }
            }
            NeutralEvent::Usage(usage) => answer.usage = Some(*usage),
            NeutralEvent::Finish(reason) => answer.finish = Some(reason),
            _ => {}
        }
    }
    answer
}

/// Writes a `chat.completion` body from a whole answer's events.
pub(super) fn encode_answer(events: &[NeutralEvent]) -> Bytes {
    let answer = collect(events);
    let body = AnswerOut {
        id: reprefix(answer.id, ANSWER_ID_PREFIXES, ANSWER_PREFIX),
        object: "chat.completion",
        created: answer.created.unwrap_or_else(now),
        model: answer.model,
        choices: [AnswerChoiceOut {
            index: 0,
            message: AnswerMessageOut {
                role: "assistant",
                content: answer.text.as_deref().filter(|t| !t.is_empty()),
                refusal: answer.refusal.as_deref().filter(|t| !t.is_empty()),
                tool_calls: answer
                    .calls
                    .iter()
                    .map(|(_, id, name, arguments)| AnswerCallOut {
                        id: reprefix(id, TOOL_CALL_ID_PREFIXES, CALL_PREFIX),
                        kind: "function",
                        function: AnswerFunctionOut { name, arguments },
                    })
                    .collect(),
                reasoning_content: answer.thinking.as_deref().filter(|t| !t.is_empty()),
            },
            finish_reason: answer.finish.map(write_finish_reason),
            logprobs: None,
        }],
        usage: answer.usage.as_ref().map(UsageOut::from),
    };
    // Serializing strings and integers cannot fail; should it, the body is
    // an empty answer rather than a panic.
    serde_json::to_vec(&body).map_or_else(|_| Bytes::new(), Bytes::from)
}

#[cfg(test)]
mod tests {
    use crate::dialect::ToolSpec;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, FileFailurePersistence};
    use serde::Deserialize;

    use super::super::request;
    use super::*;
    use crate::dialect::{BodyCheck, ChatMemo, ChunkKind, Dialect, OpenAiChat};
    use crate::sse::{SseItem, SseScanner};

    // --- helpers ---------------------------------------------------------

    /// The dispatched events of a wire stream.
    fn events_of(wire: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        SseScanner::new().feed(&Bytes::copy_from_slice(wire), |item| {
            if let SseItem::Event(event) = item {
                events.push(event);
            }
        });
        events
    }

    /// A wire stream decoded with one memo.
    fn decode(wire: &[u8]) -> Vec<NeutralEvent> {
        let mut memo = StreamMemo::default();
        let mut out = Vec::new();
        for event in events_of(wire) {
            decode_event(&event, &mut memo, &mut out);
        }
        out
    }

    /// Events encoded with one memo.
    fn encode(events: &[NeutralEvent]) -> BytesMut {
        let mut memo = StreamMemo::default();
        let mut out = BytesMut::new();
        for event in events {
            encode_event(event, &mut memo, &mut out);
        }
        out
    }

    fn read(body: Value) -> ChatRequest {
        request::read(Bytes::from(body.to_string())).unwrap().1
    }

    fn usage(input: u64, output: u64, cached: u64) -> Usage {
        let mut usage = Usage::new(input, output);
        usage.cached_input_tokens = cached;
        usage
    }

    fn start(id: &str, model: &str, created: i64) -> NeutralEvent {
        NeutralEvent::Start {
            id: id.to_owned(),
            model: model.to_owned(),
            created: Some(created),
        }
    }

    fn text(t: &str) -> NeutralEvent {
        NeutralEvent::Text(t.to_owned())
    }

    fn call_start(index: u32, id: &str, name: &str) -> NeutralEvent {
        NeutralEvent::ToolCallStart {
            index,
            id: id.to_owned(),
            name: name.to_owned(),
        }
    }

    fn args(index: u32, delta: &str) -> NeutralEvent {
        NeutralEvent::ToolCallArguments {
            index,
            delta: delta.to_owned(),
        }
    }

    /// A chunk as the OpenAI SDKs model it (`ChatCompletionChunk`), strict
    /// about what this encoder writes: a client parses what it gets.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SdkChunk {
        id: String,
        object: String,
        created: i64,
        model: String,
        choices: Vec<SdkChoice>,
        #[serde(default)]
        usage: Option<SdkUsage>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SdkChoice {
        index: u32,
        delta: SdkDelta,
        finish_reason: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SdkDelta {
        role: Option<String>,
        content: Option<String>,
        refusal: Option<String>,
        tool_calls: Option<Vec<SdkToolCall>>,
        /// DeepSeek's extension, which the SDKs keep as an extra field.
        reasoning_content: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SdkToolCall {
        index: u32,
        id: Option<String>,
        #[serde(rename = "type")]
        kind: Option<String>,
        function: Option<SdkFunction>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SdkFunction {
        name: Option<String>,
        arguments: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SdkUsage {
        prompt_tokens: u64,
        completion_tokens: u64,
        total_tokens: u64,
        prompt_tokens_details: Option<SdkPromptDetails>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SdkPromptDetails {
        cached_tokens: Option<u64>,
    }

    /// Every event of an encoded stream parses as an SDK chunk (but
    /// `[DONE]`), with the shape's invariants.
    fn sdk_chunks(wire: &[u8]) -> Vec<SdkChunk> {
        let events = events_of(wire);
        let (last, chunks) = events.split_last().expect("a stream");
        assert_eq!(last.data().as_ref(), b"[DONE]");
        chunks
            .iter()
            .map(|event| {
                let chunk: SdkChunk = serde_json::from_slice(event.data()).unwrap();
                assert_eq!(chunk.object, "chat.completion.chunk");
                for choice in &chunk.choices {
                    assert_eq!(choice.index, 0);
                    assert!(
                        choice
                            .delta
                            .role
                            .as_deref()
                            .is_none_or(|r| r == "assistant")
                    );
                    assert_ne!(choice.finish_reason.as_deref(), Some(""));
                    for call in choice.delta.tool_calls.iter().flatten() {
                        assert!(call.kind.as_deref().is_none_or(|k| k == "function"));
                        assert!(call.index < 1000);
                    }
                }
                chunk
            })
            .collect()
    }

    // --- recorded streams decoded ----------------------------------------

    #[test]
    fn a_recorded_text_stream_decodes_to_text_and_cached_usage() {
        let id = "chatcmpl-BFx7TextFixture01";
        assert_eq!(
            decode(include_bytes!("fixtures/translate/text.sse")),
            [
                start(id, "gpt-4o-2024-08-06", 1_741_600_000),
                text("Hello"),
                text(" there"),
                text("! How can"),
                text(" I help?"),
                NeutralEvent::Finish(FinishReason::Stop),
                NeutralEvent::Usage(usage(1117, 9, 1024)),
                NeutralEvent::End,
            ]
        );
    }

    #[test]
    fn recorded_parallel_tool_calls_decode_with_streamed_arguments() {
        let id = "chatcmpl-BFx7ToolsFixture02";
        assert_eq!(
            decode(include_bytes!("fixtures/translate/parallel_tool_calls.sse")),
            [
                start(id, "gpt-4o-2024-08-06", 1_741_600_100),
                call_start(0, "call_lQnnWeather0", "get_weather"),
                args(0, "{\"ci"),
                args(0, "ty\": \"Edinb"),
                args(0, "urgh\"}"),
                call_start(1, "call_2xjOStock01", "get_stock_price"),
                args(1, "{\"ti"),
                args(1, "cker\": \"AAPL\"}"),
                NeutralEvent::ToolCallEnd { index: 0 },
                NeutralEvent::ToolCallEnd { index: 1 },
                NeutralEvent::Finish(FinishReason::ToolCalls),
                NeutralEvent::Usage(usage(149, 60, 0)),
                NeutralEvent::End,
            ]
        );
    }

    #[test]
    fn a_recorded_reasoning_stream_decodes_thinking_then_text() {
        let id = "0f2c6e1a-5b7d-4e93-9a1f-3c8d2b7e6a40";
        assert_eq!(
            decode(include_bytes!("fixtures/translate/reasoning.sse")),
            [
                start(id, "deepseek-reasoner", 1_741_600_200),
                NeutralEvent::Thinking("Compare 9.11".to_owned()),
                NeutralEvent::Thinking(" and 9.8: 0.8 > 0.11.".to_owned()),
                text("9.8"),
                text(" is larger."),
                NeutralEvent::Finish(FinishReason::Stop),
                NeutralEvent::Usage(usage(18, 41, 0)),
                NeutralEvent::End,
            ]
        );
    }

    #[test]
    fn a_recorded_refusal_stream_decodes_to_refusal() {
        let id = "chatcmpl-BFx7RefusalFixture4";
        assert_eq!(
            decode(include_bytes!("fixtures/translate/refusal.sse")),
            [
                start(id, "gpt-4o-2024-08-06", 1_741_600_300),
                NeutralEvent::Refusal("I'm sorry".to_owned()),
                NeutralEvent::Refusal(", but I can't".to_owned()),
                NeutralEvent::Refusal(" assist with that.".to_owned()),
                NeutralEvent::Finish(FinishReason::Stop),
                NeutralEvent::Usage(usage(17, 12, 0)),
                NeutralEvent::End,
            ]
        );
    }

    #[test]
    fn decoding_skips_noise_and_starts_before_the_first_output() {
        // Azure's prompt-filter chunk (empty id), a keep-alive comment,
        // an `error` event, an in-band error chunk, data that does not
        // parse, choice 1, vLLM's `reasoning`, a provider reusing index 0
        // for a second call, a repeated finish and a legacy
        // `function_call` reason.
        let wire = concat!(
            "data: {\"choices\":[],\"created\":0,\"id\":\"\",\"model\":\"\",\"object\":\"\",\"prompt_filter_results\":[]}\n\n",
            ": OPENROUTER PROCESSING\n\n",
            "event: error\ndata: {\"error\":{\"message\":\"x\"}}\n\n",
            "data: {\"error\":{\"message\":\"y\"},\"choices\":[{\"index\":0,\"delta\":{\"content\":\"no\"}}]}\n\n",
            "data: {not json\n\n",
            "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"r\"}}]}\n\n",
            "data: {\"id\":\"later\",\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other choice\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"b\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"function_call\"}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(
            decode(wire.as_bytes()),
            [
                NeutralEvent::Start {
                    id: String::new(),
                    model: "m".to_owned(),
                    created: None,
                },
                NeutralEvent::Thinking("r".to_owned()),
                call_start(0, "a", "f"),
                args(0, "{}"),
                call_start(1, "b", "g"),
                args(1, "{\""),
                args(1, "}"),
                NeutralEvent::ToolCallEnd { index: 0 },
                NeutralEvent::ToolCallEnd { index: 1 },
                NeutralEvent::Finish(FinishReason::ToolCalls),
                NeutralEvent::End,
            ]
        );
    }

    #[test]
    fn a_legacy_function_call_stream_decodes_as_a_tool_call() {
        let wire = concat!(
            "data: {\"id\":\"chatcmpl-1\",\"model\":\"m\",\"created\":5,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"function_call\":{\"name\":\"f\",\"arguments\":\"\"}}}]}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"function_call\":{\"arguments\":\"{}\"}}}]}\n\n",
            "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"error\"}]}\n\n",
        );
        assert_eq!(
            decode(wire.as_bytes()),
            [
                start("chatcmpl-1", "m", 5),
                call_start(0, "call_f", "f"),
                args(0, "{}"),
                NeutralEvent::ToolCallEnd { index: 0 },
                NeutralEvent::Finish(FinishReason::Other("error".to_owned())),
            ]
        );
    }

    // --- streams encoded -------------------------------------------------

    #[test]
    fn neutral_events_encode_to_exact_chunks() {
        let events = [
            start("msg_01A", "claude-x", 1_700_000_000),
            NeutralEvent::Thinking("hm".to_owned()),
            NeutralEvent::ThinkingSignature("sig".to_owned()),
            NeutralEvent::RedactedThinking("enc".to_owned()),
            text("Hi \"you\"\n"),
            NeutralEvent::Refusal("no".to_owned()),
            call_start(0, "toolu_01", "get"),
            args(0, "{\"a\":1}"),
            NeutralEvent::ToolCallEnd { index: 0 },
            NeutralEvent::Usage(usage(10, 5, 4)),
            NeutralEvent::Finish(FinishReason::ToolCalls),
            NeutralEvent::End,
        ];
        let wire = encode(&events);
        let head = r#"data: {"id":"chatcmpl-01A","object":"chat.completion.chunk","created":1700000000,"model":"claude-x","choices":"#;
        let expected = [
            r#"[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"[{"index":0,"delta":{"reasoning_content":"hm"},"finish_reason":null}]}"#,
            r#"[{"index":0,"delta":{"content":"Hi \"you\"\n"},"finish_reason":null}]}"#,
            r#"[{"index":0,"delta":{"refusal":"no"},"finish_reason":null}]}"#,
            r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_01","type":"function","function":{"name":"get","arguments":""}}]},"finish_reason":null}]}"#,
            r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":1}"}}]},"finish_reason":null}]}"#,
            r#"[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4}}}"#,
        ]
        .iter()
        .map(|tail| format!("{head}{tail}\n\n"))
        .collect::<String>()
            + "data: [DONE]\n\n";
        assert_eq!(std::str::from_utf8(&wire).unwrap(), expected);

        // An SDK parses every chunk; the commit machine reads each output
        // chunk as output, the rest as preamble.
        let chunks = sdk_chunks(&wire);
        assert_eq!(chunks.len(), 8);
        assert!(
            chunks
                .iter()
                .all(|c| c.id == "chatcmpl-01A" && c.model == "claude-x")
        );
        assert!(chunks.iter().all(|c| c.created == 1_700_000_000));
        let usage = chunks[7].usage.as_ref().unwrap();
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.total_tokens
            ),
            (10, 5, 15)
        );
        assert_eq!(
            usage.prompt_tokens_details.as_ref().unwrap().cached_tokens,
            Some(4)
        );
        let call = &chunks[4].choices[0].delta.tool_calls.as_ref().unwrap()[0];
        let function = call.function.as_ref().unwrap();
        assert_eq!(call.id.as_deref(), Some("call_01"));
        assert_eq!(function.name.as_deref(), Some("get"));
        assert_eq!(function.arguments.as_deref(), Some(""));
        assert_eq!(
            chunks[1].choices[0].delta.reasoning_content.as_deref(),
            Some("hm")
        );
        assert_eq!(
            chunks[2].choices[0].delta.content.as_deref(),
            Some("Hi \"you\"\n")
        );
        assert_eq!(chunks[3].choices[0].delta.refusal.as_deref(), Some("no"));
        let kinds: Vec<ChunkKind> = events_of(&wire)
            .iter()
            .map(|e| OpenAiChat.inspect(e, &mut ChatMemo::default()).kind)
            .collect();
        use ChunkKind::{Done, Output, Preamble};
        assert_eq!(
            kinds,
            [
                Preamble, Output, Output, Output, Output, Output, Preamble, Preamble, Done
            ]
        );
    }

    #[test]
    fn the_identity_is_the_written_streams() {
        let mut memo = StreamMemo::default();
        assert_eq!(memo.identity(), ChunkIdentity::default());
        let mut out = BytesMut::new();
        encode_event(&start("resp_9", "m", 7), &mut memo, &mut out);
        assert_eq!(
            memo.identity(),
            ChunkIdentity {
                id: Some(Cow::Borrowed("chatcmpl-9")),
                model: Some(Cow::Borrowed("m")),
                created: Some(7),
            }
        );
        // No `created`: the current time, the same in every chunk.
        let mut memo = StreamMemo::default();
        encode_event(
            &NeutralEvent::Start {
                id: "x".to_owned(),
                model: "m".to_owned(),
                created: None,
            },
            &mut memo,
            &mut out,
        );
        assert!(memo.identity().created.is_some_and(|c| c > 1_700_000_000));
    }

    #[test]
    fn finish_reasons_map_both_ways() {
        for (chat, neutral) in [
            ("stop", FinishReason::Stop),
            ("length", FinishReason::Length),
            ("tool_calls", FinishReason::ToolCalls),
            ("content_filter", FinishReason::ContentFilter),
            ("abort", FinishReason::Other("abort".to_owned())),
        ] {
            assert_eq!(read_finish_reason(chat), neutral);
            assert_eq!(write_finish_reason(&neutral), chat);
        }
        assert_eq!(read_finish_reason("function_call"), FinishReason::ToolCalls);
        assert_eq!(write_finish_reason(&FinishReason::StopSequence), "stop");
        let pause = FinishReason::Other("pause_turn".to_owned());
        assert_eq!(write_finish_reason(&pause), "stop");
    }

    // --- whole answers ---------------------------------------------------

    #[test]
    fn a_completion_decodes_to_the_events_of_its_stream() {
        let body = json!({
            "id": "chatcmpl-7", "object": "chat.completion", "created": 9, "model": "deepseek-reasoner",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null, "message": {
                "role": "assistant", "content": "Let me look.", "reasoning_content": "Need data.",
                "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": ""}}
                ]
            }}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
                      "prompt_tokens_details": {"cached_tokens": 16}}
        });
        assert_eq!(
            decode_answer(body.to_string().as_bytes()).unwrap(),
            [
                start("chatcmpl-7", "deepseek-reasoner", 9),
                NeutralEvent::Thinking("Need data.".to_owned()),
                text("Let me look."),
                call_start(0, "call_a", "f"),
                args(0, "{\"x\":1}"),
                call_start(1, "call_b", "g"),
                NeutralEvent::ToolCallEnd { index: 0 },
                NeutralEvent::ToolCallEnd { index: 1 },
                NeutralEvent::Usage(usage(30, 12, 16)),
                NeutralEvent::Finish(FinishReason::ToolCalls),
                NeutralEvent::End,
            ]
        );
        assert_eq!(decode_answer(b"{\"error\":{\"message\":\"x\"}}"), None);
        assert_eq!(decode_answer(b"{\"choices\":[]}"), None);
        assert_eq!(decode_answer(b"[1]"), None);
        assert_eq!(decode_answer(b"{\"choices\":"), None);
    }

    #[test]
    fn events_encode_to_a_valid_completion() {
        let events = [
            start("msg_5", "claude-x", 11),
            NeutralEvent::Thinking("Think.".to_owned()),
            NeutralEvent::ThinkingSignature("sig".to_owned()),
            text("A"),
            text("nswer"),
            call_start(0, "toolu_1", "f"),
            args(0, "{\"q\":"),
            args(0, "2}"),
            NeutralEvent::ToolCallEnd { index: 0 },
            NeutralEvent::Usage(usage(20, 8, 5)),
            NeutralEvent::Finish(FinishReason::ToolCalls),
            NeutralEvent::End,
        ];
        let body = encode_answer(&events);
        let expected = json!({
            "id": "chatcmpl-5", "object": "chat.completion", "created": 11, "model": "claude-x",
            "choices": [{"index": 0, "message": {
                "role": "assistant", "content": "Answer",
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"q\":2}"}}],
                "reasoning_content": "Think."
            }, "finish_reason": "tool_calls", "logprobs": null}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28,
                      "prompt_tokens_details": {"cached_tokens": 5}}
        });
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), expected);
        let (check, facts) = OpenAiChat.check_answer(&body);
        assert_eq!(
            check,
            BodyCheck::Valid {
                usage: Some(Usage::new(20, 8)),
                model: Some("claude-x".to_owned()),
            }
        );
        assert_eq!(facts.id.as_deref(), Some("chatcmpl-5"));
        assert_eq!(facts.finish_reason.as_deref(), Some("tool_calls"));

        // A refusal alone: content null, the refusal beside it.
        let refused = encode_answer(&[
            start("chatcmpl-r", "m", 1),
            NeutralEvent::Refusal("No.".to_owned()),
            NeutralEvent::Finish(FinishReason::ContentFilter),
            NeutralEvent::End,
        ]);
        let refused: Value = serde_json::from_slice(&refused).unwrap();
        assert_eq!(
            refused["choices"][0]["message"],
            json!({"role": "assistant", "content": null, "refusal": "No."})
        );
        assert_eq!(refused["choices"][0]["finish_reason"], "content_filter");
        assert!(refused.get("usage").is_none());
    }

    // --- requests --------------------------------------------------------

    #[test]
    fn a_chat_request_reads_into_the_neutral_model() {
        let body = json!({
            "model": "gpt-x",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
                {"role": "user", "name": "ann", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
                    {"type": "file", "file": {"file_data": "data:application/pdf;base64,QQ==", "filename": "a.pdf"}}
                ]},
                {"role": "assistant", "content": "Looking.", "reasoning_content": "Hmm.", "refusal": null,
                 "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a cat"}]},
                {"role": "assistant", "content": null, "refusal": "No."}
            ],
            "tools": [{"type": "function", "function": {"name": "look", "description": "Looks.",
                       "parameters": {"type": "object"}, "strict": true}}],
            "tool_choice": {"type": "function", "function": {"name": "look"}},
            "parallel_tool_calls": false,
            "max_tokens": 50, "max_completion_tokens": 100,
            "temperature": 0.5, "top_p": 0.9, "stop": "END",
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": true}},
            "reasoning_effort": "low",
            "safety_identifier": "u-1",
            "metadata": {"k": "v"},
            "stream": true, "stream_options": {"include_usage": true},
            "n": 2, "top_logprobs": 3,
            "store": false, "seed": 1, "service_tier": "flex", "prompt_cache_key": "k",
            "prompt_cache_retention": "24h", "frequency_penalty": 0.1, "presence_penalty": 0.1,
            "verbosity": "low", "prediction": {"type": "content", "content": "x"}, "logit_bias": {},
            "some_future_field": 1
        });
        let expected = NeutralRequest {
            model: "gpt-x".to_owned(),
            messages: vec![
                Message::System(vec![Part::Text("Be brief.".to_owned())]),
                Message::Developer(vec![Part::Text("Use tools.".to_owned())]),
                Message::User(vec![
                    Part::Text("What is this?".to_owned()),
                    Part::Image("https://x/a.png".to_owned()),
                    Part::Document {
                        url: "data:application/pdf;base64,QQ==".to_owned(),
                        name: Some("a.pdf".to_owned()),
                    },
                ]),
                Message::Assistant(vec![
                    Part::Thinking {
                        text: "Hmm.".to_owned(),
                        signature: None,
                    },
                    Part::Text("Looking.".to_owned()),
                    Part::ToolCall {
                        id: "call_1".to_owned(),
                        name: "look".to_owned(),
                        arguments: "{}".to_owned(),
                    },
                ]),
                Message::Tool {
                    call_id: "call_1".to_owned(),
                    content: vec![Part::Text("a cat".to_owned())],
                    is_error: false,
                },
                Message::Assistant(vec![Part::Refusal("No.".to_owned())]),
            ],
            tools: vec![ToolSpec {
                name: "look".to_owned(),
                description: Some("Looks.".to_owned()),
                parameters: json!({"type": "object"}),
                strict: Some(true),
            }],
            tool_choice: Some(ToolChoice::Named("look".to_owned())),
            parallel_tool_calls: Some(false),
            max_output_tokens: Some(100),
            temperature: Some(0.5),
            top_p: Some(0.9),
            stop: vec!["END".to_owned()],
            response_format: Some(ResponseFormat::JsonSchema),
            json_schema: Some(json!({"name": "s", "schema": {"type": "object"}, "strict": true})),
            reasoning_effort: Some("low".to_owned()),
            thinking_budget: None,
            user: Some("u-1".to_owned()),
            metadata: Some(json!({"k": "v"})),
            stream: true,
            include_usage: true,
            choices: 2,
            logprobs: true,
            audio: false,
        };
        assert_eq!(to_neutral(&read(body)).unwrap(), expected);
    }

    #[test]
    fn legacy_functions_and_audio_read_into_the_neutral_model() {
        let body = json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}]},
                {"role": "assistant", "content": null, "function_call": {"name": "f", "arguments": "{}"}},
                {"role": "function", "name": "f", "content": "done"}
            ],
            "functions": [{"name": "f", "parameters": {"type": "object"}}],
            "function_call": {"name": "f"},
            "max_tokens": 7,
            "stop": ["a", "b"],
            "response_format": {"type": "text"},
            "user": "u", "safety_identifier": "s",
            "logprobs": false,
            "reasoning": {"max_tokens": 3000}
        });
        let neutral = to_neutral(&read(body)).unwrap();
        assert_eq!(
            neutral.messages,
            [
                Message::User(vec![]),
                Message::Assistant(vec![Part::ToolCall {
                    id: "call_f".to_owned(),
                    name: "f".to_owned(),
                    arguments: "{}".to_owned(),
                }]),
                Message::Tool {
                    call_id: "call_f".to_owned(),
                    content: vec![Part::Text("done".to_owned())],
                    is_error: false,
                },
            ]
        );
        assert!(neutral.audio && !neutral.logprobs && !neutral.stream);
        assert_eq!(neutral.tools[0].strict, None);
        assert_eq!(neutral.tool_choice, Some(ToolChoice::Named("f".to_owned())));
        assert_eq!(neutral.max_output_tokens, Some(7));
        assert_eq!(neutral.stop, ["a", "b"]);
        assert_eq!(neutral.response_format, None);
        assert_eq!(neutral.user.as_deref(), Some("u"));
        assert_eq!(neutral.thinking_budget, Some(3000));
        assert_eq!(neutral.choices, 1);
        let audio_out = json!({"model": "m", "messages": [], "modalities": ["text", "audio"]});
        assert!(to_neutral(&read(audio_out)).unwrap().audio);
        let choice = |c: Value| {
            to_neutral(&read(
                json!({"model": "m", "messages": [], "tool_choice": c}),
            ))
        };
        assert_eq!(
            choice(json!("auto")).unwrap().tool_choice,
            Some(ToolChoice::Auto)
        );
        assert_eq!(
            choice(json!("none")).unwrap().tool_choice,
            Some(ToolChoice::None)
        );
        assert_eq!(
            choice(json!("required")).unwrap().tool_choice,
            Some(ToolChoice::Required)
        );
    }

    #[test]
    fn what_the_neutral_model_cannot_carry_is_refused_by_name() {
        let refusal = |extra: Value| {
            let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
                body.extend(extra.clone());
            }
            to_neutral(&read(body)).err()
        };
        let file_id = json!({"messages": [{"role": "user", "content": [
            {"type": "file", "file": {"file_id": "file-1"}}]}]});
        assert_eq!(refusal(file_id).as_deref(), Some("file_id input"));
        let custom = json!({"tools": [{"type": "custom", "custom": {"name": "x"}}]});
        assert_eq!(refusal(custom).as_deref(), Some("tool type custom"));
        let search = json!({"web_search_options": {}});
        assert_eq!(refusal(search).as_deref(), Some("web_search_options"));
        let bias = json!({"logit_bias": {"50256": -100}});
        assert_eq!(refusal(bias).as_deref(), Some("logit_bias"));
        let allowed = json!({"tool_choice": {"type": "allowed_tools", "allowed_tools": {}}});
        assert_eq!(
            refusal(allowed).as_deref(),
            Some("tool_choice allowed_tools")
        );
        let part =
            json!({"messages": [{"role": "user", "content": [{"type": "video", "video": {}}]}]});
        assert_eq!(refusal(part).as_deref(), Some("content part video"));
        let role = json!({"messages": [{"role": "narrator", "content": "x"}]});
        assert_eq!(refusal(role).as_deref(), Some("message role narrator"));
        let format = json!({"response_format": {"type": "grammar"}});
        assert_eq!(refusal(format).as_deref(), Some("response_format grammar"));
        // What OpenAI documents as hints is dropped, not refused.
        let hints =
            json!({"seed": 3, "store": true, "logit_bias": null, "web_search_options": null});
        assert_eq!(refusal(hints), None);
    }

    #[test]
    fn a_neutral_request_writes_a_chat_body() {
        let request = NeutralRequest {
            model: "client-model".to_owned(),
            messages: vec![
                Message::System(vec![Part::Text("Be brief.".to_owned())]),
                Message::User(vec![
                    Part::Text("Read.".to_owned()),
                    Part::Image("data:image/png;base64,AA==".to_owned()),
                    Part::Document {
                        url: "data:application/pdf;base64,QQ==".to_owned(),
                        name: None,
                    },
                ]),
                Message::Assistant(vec![
                    Part::Thinking {
                        text: "t".to_owned(),
                        signature: Some("s".to_owned()),
                    },
                    Part::RedactedThinking("r".to_owned()),
                    Part::Text("Reading".to_owned()),
                    Part::Text(" it.".to_owned()),
                    Part::ToolCall {
                        id: "toolu_01".to_owned(),
                        name: "read".to_owned(),
                        arguments: "{}".to_owned(),
                    },
                ]),
                Message::Tool {
                    call_id: "toolu_01".to_owned(),
                    content: vec![Part::Text("fail".to_owned())],
                    is_error: true,
                },
                Message::Assistant(vec![Part::Thinking {
                    text: "only".to_owned(),
                    signature: None,
                }]),
            ],
            tools: vec![ToolSpec {
                name: "read".to_owned(),
                description: None,
                parameters: json!({"type": "object"}),
                strict: None,
            }],
            tool_choice: Some(ToolChoice::Required),
            parallel_tool_calls: Some(true),
            max_output_tokens: Some(1024),
            temperature: Some(1.0),
            top_p: None,
            stop: vec!["\n\nHuman:".to_owned()],
            response_format: Some(ResponseFormat::JsonObject),
            json_schema: None,
            reasoning_effort: None,
            thinking_budget: Some(4096),
            user: Some("u".to_owned()),
            metadata: Some(json!({"user_id": "u"})),
            stream: true,
            include_usage: false,
            choices: 1,
            logprobs: false,
            audio: false,
        };
        let body = body_from_neutral(&request, "target-model").unwrap();
        let expected = json!({
            "model": "target-model",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [
                    {"type": "text", "text": "Read."},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                    {"type": "file", "file": {"file_data": "data:application/pdf;base64,QQ=="}}
                ]},
                {"role": "assistant", "content": "Reading it.", "tool_calls": [
                    {"id": "call_01", "type": "function", "function": {"name": "read", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_01", "content": "fail"},
                {"role": "assistant", "content": ""}
            ],
            "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
            "tool_choice": "required",
            "parallel_tool_calls": true,
            "max_completion_tokens": 1024,
            "temperature": 1.0,
            "stop": ["\n\nHuman:"],
            "response_format": {"type": "json_object"},
            "reasoning_effort": "medium",
            "user": "u",
            "metadata": {"user_id": "u"},
            "stream": true,
            "stream_options": {"include_usage": true}
        });
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), expected);
        // The body is one the dialect reads as a request.
        assert!(request::read(body).is_ok());
    }

    #[test]
    fn what_chat_cannot_express_is_refused_by_name() {
        let with = |f: &dyn Fn(&mut NeutralRequest)| {
            let mut request = NeutralRequest {
                model: "m".to_owned(),
                choices: 1,
                ..NeutralRequest::default()
            };
            f(&mut request);
            body_from_neutral(&request, "m").err()
        };
        assert_eq!(with(&|r| r.audio = true).as_deref(), Some("audio"));
        let image_result = |r: &mut NeutralRequest| {
            r.messages.push(Message::Tool {
                call_id: "c".to_owned(),
                content: vec![Part::Image("https://x/a.png".to_owned())],
                is_error: false,
            });
        };
        assert_eq!(
            with(&image_result).as_deref(),
            Some("tool result with an image")
        );
        let linked = |r: &mut NeutralRequest| {
            r.messages.push(Message::User(vec![Part::Document {
                url: "https://x/a.pdf".to_owned(),
                name: None,
            }]));
        };
        assert_eq!(with(&linked).as_deref(), Some("document URL input"));
        let schema = |r: &mut NeutralRequest| r.response_format = Some(ResponseFormat::JsonSchema);
        assert_eq!(
            with(&schema).as_deref(),
            Some("json_schema without a schema")
        );
        // tool_choice and parallel_tool_calls are not written without tools.
        let lone = |r: &mut NeutralRequest| {
            r.tool_choice = Some(ToolChoice::Auto);
            r.parallel_tool_calls = Some(true);
        };
        assert_eq!(with(&lone), None);
    }

    #[test]
    fn a_thinking_budget_becomes_an_effort() {
        for (budget, effort) in [
            (0, "medium"),
            (1024, "low"),
            (2048, "low"),
            (2049, "medium"),
            (8192, "medium"),
            (32_000, "high"),
        ] {
            assert_eq!(effort_of_budget(budget), effort, "{budget}");
        }
    }

    // --- round trips -----------------------------------------------------

    fn config() -> Config {
        Config {
            cases: 256,
            failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
            ..Config::default()
        }
    }

    /// Non-empty text with characters that need escaping.
    fn any_text() -> impl Strategy<Value = String> {
        "[a-z \"\\\\\n\u{e9}\u{1f600}]{1,8}"
    }

    fn call_id() -> impl Strategy<Value = String> {
        "call_[A-Za-z0-9]{1,6}"
    }

    fn texts() -> impl Strategy<Value = Vec<Part>> {
        prop::collection::vec(any_text().prop_map(Part::Text), 0..3)
    }

    fn user_part() -> impl Strategy<Value = Part> {
        prop_oneof![
            any_text().prop_map(Part::Text),
            "[a-z]{1,5}".prop_map(|p| Part::Image(format!("https://x/{p}.png"))),
            ("[A-Za-z0-9]{1,6}", prop::option::of("[a-z]{1,5}\\.pdf")).prop_map(|(d, name)| {
                Part::Document {
                    url: format!("data:application/pdf;base64,{d}"),
                    name,
                }
            }),
        ]
    }

    /// An assistant turn in chat's canonical order (text, refusal, calls;
    /// chat requests carry no reasoning).
    fn assistant() -> impl Strategy<Value = Message> {
        let call = (call_id(), "[a-z_]{1,6}", "[{}\":a-z0-9]{0,8}");
        (
            prop::option::of(any_text()),
            prop::option::of(any_text()),
            prop::collection::vec(call, 0..3),
        )
            .prop_map(|(text, refusal, calls)| {
                let mut parts: Vec<Part> = text.into_iter().map(Part::Text).collect();
                parts.extend(refusal.map(Part::Refusal));
                parts.extend(
                    calls
                        .into_iter()
                        .map(|(id, name, arguments)| Part::ToolCall {
                            id,
                            name,
                            arguments,
                        }),
                );
                Message::Assistant(parts)
            })
    }

    fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            texts().prop_map(Message::System),
            texts().prop_map(Message::Developer),
            prop::collection::vec(user_part(), 0..3).prop_map(Message::User),
            assistant(),
            (call_id(), prop::option::of(any_text())).prop_map(|(call_id, text)| {
                Message::Tool {
                    call_id,
                    content: text.into_iter().map(Part::Text).collect(),
                    is_error: false,
                }
            }),
        ]
    }

    fn tool() -> impl Strategy<Value = ToolSpec> {
        let parameters = prop_oneof![
            Just(Value::Null),
            Just(json!({"type": "object", "properties": {"a": {"type": "string"}}})),
        ];
        (
            "[a-z_]{1,8}",
            prop::option::of(any_text()),
            parameters,
            prop::option::of(any::<bool>()),
        )
            .prop_map(|(name, description, parameters, strict)| ToolSpec {
                name,
                description,
                parameters,
                strict,
            })
    }

    fn tool_choice() -> impl Strategy<Value = Option<ToolChoice>> {
        prop::option::of(prop_oneof![
            Just(ToolChoice::Auto),
            Just(ToolChoice::None),
            Just(ToolChoice::Required),
            "[a-z_]{1,8}".prop_map(ToolChoice::Named),
        ])
    }

    /// Multiples of 1/4: exact in binary, so the JSON text round-trips.
    fn sampling() -> impl Strategy<Value = Option<f64>> {
        prop::option::of((0u32..=8).prop_map(|k| f64::from(k) / 4.0))
    }

    fn response_format() -> impl Strategy<Value = (Option<ResponseFormat>, Option<Value>)> {
        prop_oneof![
            Just((None, None)),
            Just((Some(ResponseFormat::JsonObject), None)),
            Just((
                Some(ResponseFormat::JsonSchema),
                Some(json!({"name": "s", "schema": {"type": "object"}, "strict": true}))
            )),
        ]
    }

    /// Requests chat can express, in the form chat reads them back:
    /// `tool_choice` and `parallel_tool_calls` only with tools (chat
    /// writes neither alone), no thinking budget (written as an effort),
    /// `include_usage` exactly when streaming (a translated stream always
    /// asks for usage), no audio (refused).
    fn request() -> impl Strategy<Value = NeutralRequest> {
        let conversation = (
            "[a-z0-9.-]{1,10}",
            prop::collection::vec(message(), 0..5),
            prop::collection::vec(tool(), 0..3),
            tool_choice(),
            prop::option::of(any::<bool>()),
        );
        let options = (
            prop::option::of(0u64..1_000_000),
            sampling(),
            sampling(),
            prop::collection::vec(any_text(), 0..3),
            response_format(),
            prop::option::of(prop_oneof![Just("low"), Just("medium"), Just("high")]),
            prop::option::of("[a-z0-9-]{1,8}"),
            prop::option::of(Just(json!({"k": "v"}))),
            any::<bool>(),
            1u64..4,
            any::<bool>(),
        );
        (conversation, options).prop_map(|(conversation, options)| {
            let (model, messages, tools, tool_choice, parallel_tool_calls) = conversation;
            let (max, temperature, top_p, stop, format, effort, user, metadata, stream, n, lp) =
                options;
            let with_tools = !tools.is_empty();
            NeutralRequest {
                model,
                messages,
                tools,
                tool_choice: tool_choice.filter(|_| with_tools),
                parallel_tool_calls: parallel_tool_calls.filter(|_| with_tools),
                max_output_tokens: max,
                temperature,
                top_p,
                stop,
                response_format: format.0,
                json_schema: format.1,
                reasoning_effort: effort.map(str::to_owned),
                thinking_budget: None,
                user,
                metadata,
                stream,
                include_usage: stream,
                choices: n,
                logprobs: lp,
                audio: false,
            }
        })
    }

    /// One piece of a generated answer.
    #[derive(Debug, Clone)]
    enum Piece {
        Text(String),
        Thinking(String),
        Refusal(String),
        Call(String),
        Arguments(usize, String),
    }

    fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            any_text().prop_map(Piece::Text),
            any_text().prop_map(Piece::Thinking),
            any_text().prop_map(Piece::Refusal),
            "[a-z_]{1,6}".prop_map(Piece::Call),
            (0usize..4, "[{}\":a-z0-9 ]{1,6}").prop_map(|(at, a)| Piece::Arguments(at, a)),
        ]
    }

    fn finish_reason() -> impl Strategy<Value = FinishReason> {
        prop_oneof![
            Just(FinishReason::Stop),
            Just(FinishReason::Length),
            Just(FinishReason::ToolCalls),
            Just(FinishReason::ContentFilter),
            "[a-z]{1,8}"
                .prop_filter("a chat provider's own reason", |r| {
                    read_finish_reason(r) == FinishReason::Other(r.clone())
                        && !FOREIGN_REASONS.contains(&r.as_str())
                })
                .prop_map(FinishReason::Other),
        ]
    }

    /// Answers chat streams can express, in the order chat decodes them:
    /// a `chatcmpl-` id and a `created` (else the encoder reprefixes or
    /// stamps them), non-empty pieces (empty ones are no chunk), every
    /// call ended right before the finish (chat has no end of a call),
    /// one usage after the finish (chat sends it in the last chunk).
    fn answer() -> impl Strategy<Value = Vec<NeutralEvent>> {
        (
            "[A-Za-z0-9]{1,8}",
            "[a-z0-9.-]{1,8}",
            0i64..2_000_000_000,
            prop::collection::vec(piece(), 0..12),
            finish_reason(),
            prop::option::of((0u64..1000, 0u64..1000, 0u64..1000)),
        )
            .prop_map(|(id, model, created, pieces, reason, counts)| {
                let mut events = vec![start(&format!("chatcmpl-{id}"), &model, created)];
                let mut calls = 0u32;
                for piece in pieces {
                    events.push(match piece {
                        Piece::Text(t) => NeutralEvent::Text(t),
                        Piece::Thinking(t) => NeutralEvent::Thinking(t),
                        Piece::Refusal(t) => NeutralEvent::Refusal(t),
                        Piece::Call(name) => {
                            calls += 1;
                            call_start(calls - 1, &format!("call_{calls}{name}"), &name)
                        }
                        Piece::Arguments(_, _) if calls == 0 => continue,
                        Piece::Arguments(at, delta) => NeutralEvent::ToolCallArguments {
                            index: u32::try_from(at).unwrap() % calls,
                            delta,
                        },
                    });
                }
                events.extend((0..calls).map(|index| NeutralEvent::ToolCallEnd { index }));
                events.push(NeutralEvent::Finish(reason));
                if let Some((input, output, cached)) = counts {
                    events.push(NeutralEvent::Usage(usage(input, output, cached)));
                }
                events.push(NeutralEvent::End);
                events
            })
    }

    /// What a whole answer keeps of a stream's events: each kind of text
    /// joined, each call's arguments joined, usage before the finish.
    fn whole(events: &[NeutralEvent]) -> Vec<NeutralEvent> {
        let answer = collect(events);
        let mut out = vec![NeutralEvent::Start {
            id: answer.id.to_owned(),
            model: answer.model.to_owned(),
            created: answer.created,
        }];
        out.extend(answer.thinking.map(NeutralEvent::Thinking));
        out.extend(answer.text.map(NeutralEvent::Text));
        out.extend(answer.refusal.map(NeutralEvent::Refusal));
        for (index, id, name, arguments) in &answer.calls {
            out.push(call_start(*index, id, name));
            if !arguments.is_empty() {
                out.push(args(*index, arguments));
            }
        }
        out.extend(
            answer
                .calls
                .iter()
                .map(|c| NeutralEvent::ToolCallEnd { index: c.0 }),
        );
        out.extend(answer.usage.map(NeutralEvent::Usage));
        out.extend(answer.finish.cloned().map(NeutralEvent::Finish));
        out.push(NeutralEvent::End);
        out
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn requests_round_trip(request in request()) {
            let body = body_from_neutral(&request, &request.model).unwrap();
            let (_, read) = request::read(body).unwrap();
            prop_assert_eq!(to_neutral(&read).unwrap(), request);
        }

        #[test]
        fn streams_round_trip(events in answer()) {
            let mut memo = StreamMemo::default();
            let mut wire = BytesMut::new();
            for event in &events {
                let before = wire.len();
                encode_event(event, &mut memo, &mut wire);
                // Each output event is one chunk the commit machine reads
                // as output.
                let output = matches!(
                    event,
                    NeutralEvent::Text(_)
                        | NeutralEvent::Thinking(_)
                        | NeutralEvent::Refusal(_)
                        | NeutralEvent::ToolCallStart { .. }
                        | NeutralEvent::ToolCallArguments { .. }
                );
                if output {
                    let written = events_of(&wire[before..]);
                    prop_assert_eq!(written.len(), 1);
                    let kind = OpenAiChat.inspect(&written[0], &mut ChatMemo::default()).kind;
                    prop_assert_eq!(kind, ChunkKind::Output);
                }
            }
            sdk_chunks(&wire);
            prop_assert_eq!(decode(&wire), events);
        }

        #[test]
        fn answers_round_trip(events in answer()) {
            let body = encode_answer(&events);
            let (check, _) = OpenAiChat.check_answer(&body);
            let valid = matches!(check, BodyCheck::Valid { .. });
            prop_assert!(valid);
            prop_assert_eq!(decode_answer(&body).unwrap(), whole(&events));
        }
    }
}
