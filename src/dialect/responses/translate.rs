//! Translation to and from the neutral model: the Responses API.
//!
//! - **Requests in** ([`to_neutral`]): `instructions` (a system message,
//!   first), `input` (a string: one user message; or items: messages of
//!   the `user`, `system`, `developer` and `assistant` roles with
//!   `input_text`, `output_text`, `refusal`, `input_image` and `input_file`
//!   parts; `function_call` and `function_call_output`; `reasoning`'s
//!   summary and text, read as unsigned thinking), function `tools`,
//!   `tool_choice`, `parallel_tool_calls`, `max_output_tokens`,
//!   `temperature`, `top_p`, `reasoning.effort`, `text.format`, `metadata`,
//!   `user` (else `safety_identifier`), `stream`, and logprobs asked for by
//!   `top_logprobs` or `include`. Adjacent items of the model's turn
//!   (reasoning, an assistant message, function calls) are one assistant
//!   message. Dropped as advisory: `store`, `include` (but logprobs),
//!   `prompt_cache_key`, `prompt_cache_retention`, `service_tier`,
//!   `truncation`, `background`, `max_tool_calls`, `stream_options`,
//!   `reasoning.summary`, `text.verbosity`, an image's `detail`, a text's
//!   annotations, a reasoning item's `encrypted_content` (it is the
//!   provider's own and no other provider reads it), unknown fields;
//!   `previous_response_id` and `conversation` (a turn that names them is
//!   bound to the provider holding the state before it is ever
//!   translated). Refused: provider-hosted tools and `custom` tools by
//!   name, `item_reference`s and input files or images given by `file_id`
//!   (the provider holds them), a stored `prompt` template, input items and
//!   parts the neutral model has no form for.
//! - **Requests out** ([`body_from_neutral`]): every message as an input
//!   item in its place (system and developer messages keep their roles),
//!   tool calls as `function_call` items, tool results as
//!   `function_call_output` (their error flag has no place); reasoning
//!   history is dropped (a reasoning item is sent back only with the
//!   provider's own id or encrypted content, which another dialect's
//!   thinking does not have). A tool without `strict` is written
//!   `strict: false`, the other dialects' default (the Responses API's is
//!   strict); an output limit below 16, the API's least, is raised to 16;
//!   `store: false`, so the answer to a translated turn is not left stored
//!   at the provider by the gateway's choice. Refused: `n > 1`, stop
//!   sequences, logprobs, audio.
//! - **Streams and whole answers** both ways: output items ↔ neutral
//!   events, tool calls numbered by their position among the answer's
//!   function calls, `response.completed` (or `response.incomplete`) →
//!   usage, finish reason and end. Read: every delta once; a `.done`
//!   event, a whole item or the completed response's output only for what
//!   no delta gave; a call that read no arguments gets `{}`; a completed
//!   response is a natural end, or tool calls when it made any; an
//!   incomplete one ends by the output limit, a filter, or its own reason;
//!   hosted tools' items carry nothing. Written: thinking as a reasoning
//!   item's summary (a signature and redacted thinking have no place), a
//!   stop sequence or another dialect's own reason as `completed`, the
//!   response id `resp_` and the answer's own. A stream written for a
//!   Responses client is one the official SDKs' stream helpers accept:
//!   sequence numbers from 0, `output_index` the item's position, every
//!   item closed, and `response.completed` carrying the whole output and
//!   usage.

use crate::dialect::json::{
    array, effort_of_budget, now, present, read_function, str_of, string_of,
};
use std::borrow::Cow;
use std::fmt::Write as _;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::ResponsesRequest;
use crate::Usage;
use crate::dialect::neutral::{ANSWER_ID_PREFIXES, TOOL_CALL_ID_PREFIXES, reprefix};
use crate::dialect::{
    ChunkIdentity, FinishReason, Message, NeutralEvent, NeutralRequest, Part, ResponseFormat,
    ToolChoice,
};
use crate::sse::SseEvent;

/// The Responses API's tool-call id prefix (`call_id`).
const CALL_PREFIX: &str = "call_";
/// The Responses API's response id prefix.
const ANSWER_PREFIX: &str = "resp_";
/// The id of a response whose answer named none.
const GATEWAY_ID: &str = "resp_gateway";
/// The least `max_output_tokens` the Responses API takes.
const MIN_OUTPUT_TOKENS: u64 = 16;
/// The `include` value that asks for the output's log probabilities.
const LOGPROBS_INCLUDE: &str = "message.output_text.logprobs";

/// What translation keeps of one stream, read or written.
#[derive(Debug, Default)]
pub(super) struct StreamMemo {
    /// A stream of this dialect being read.
    reading: Reading,
    /// A stream of this dialect being written.
    writing: Writing,
}

impl StreamMemo {
    /// The identity of the stream written so far, in this dialect's form:
    /// the response id, model and creation time its lifecycle events
    /// carry (a terminal `response.failed` must carry the same id).
    pub(super) fn identity(&self) -> ChunkIdentity<'_> {
        let writing = &self.writing;
        if !writing.started {
            return ChunkIdentity::default();
        }
        let identity = &writing.identity;
        ChunkIdentity {
            id: Some(Cow::Borrowed(identity.id.as_str())),
            model: Some(Cow::Borrowed(identity.model.as_str())),
            created: Some(identity.created),
        }
    }

    /// The `sequence_number` the next event written gets.
    pub(super) fn next_sequence(&self) -> u64 {
        self.writing.frames.sequence
    }
}

// ---------------------------------------------------------------------------
// Small readers of JSON values.

/// A text as parts: none when it is empty (the form an empty message is
/// written in).
fn text_parts(text: &str) -> Vec<Part> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![Part::Text(text.to_owned())]
    }
}

// ---------------------------------------------------------------------------
// Requests: Responses → neutral.

/// Reads a Responses request into the neutral model.
pub(super) fn to_neutral(request: &ResponsesRequest) -> Result<NeutralRequest, String> {
    let body: Map<String, Value> =
        serde_json::from_slice(request.body()).map_err(|_| "a JSON object body".to_owned())?;
    // A stored prompt template: its instructions and input are the
    // provider's.
    if present(&body, "prompt").is_some() {
        return Err("prompt (a template the provider holds)".to_owned());
    }
    let mut out = NeutralRequest {
        model: present(&body, "model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        choices: 1,
        ..NeutralRequest::default()
    };
    match present(&body, "instructions") {
        Some(Value::String(text)) if !text.is_empty() => {
            out.messages.push(Message::System(text_parts(text)));
        }
        // A prompt's instructions come as input items.
        Some(Value::Array(items)) => {
            for item in items {
                read_item(item, &mut out.messages)?;
            }
        }
        _ => {}
    }
    match present(&body, "input") {
        Some(Value::String(text)) => out.messages.push(Message::User(text_parts(text))),
        Some(Value::Array(items)) => {
            for item in items {
                read_item(item, &mut out.messages)?;
            }
        }
        _ => {}
    }
    read_tools(&body, &mut out)?;
    read_sampling(&body, &mut out)?;
    read_options(&body, &mut out);
    Ok(out)
}

/// One item of `input`.
fn read_item(item: &Value, out: &mut Vec<Message>) -> Result<(), String> {
    match str_of(item, "type").unwrap_or("message") {
        "message" => read_message(item, out),
        "function_call" => {
            let id = str_of(item, "call_id").or_else(|| str_of(item, "id"));
            let call = Part::ToolCall {
                id: id.unwrap_or_default().to_owned(),
                name: string_of(item, "name"),
                arguments: string_of(item, "arguments"),
            };
            push_assistant(out, vec![call]);
            Ok(())
        }
        "function_call_output" => {
            out.push(Message::Tool {
                call_id: string_of(item, "call_id"),
                content: read_content(item.get("output"))?,
                is_error: false,
            });
            Ok(())
        }
        "reasoning" => {
            // The summary (and any reasoning text) is the thinking; the
            // encrypted content is the provider's own, no signature.
            let text = reasoning_text(item);
            if !text.is_empty() {
                push_assistant(
                    out,
                    vec![Part::Thinking {
                        text,
                        signature: None,
                    }],
                );
            }
            Ok(())
        }
        "item_reference" => Err(format!(
            "item_reference {} (a provider-held item)",
            str_of(item, "id").unwrap_or_default()
        )),
        other => Err(format!("input item {other}")),
    }
}

/// Adds parts of the model's turn: to the assistant message just before,
/// or as a new one (a turn's reasoning, message and function calls are
/// separate items).
fn push_assistant(out: &mut Vec<Message>, parts: Vec<Part>) {
    match out.last_mut() {
        Some(Message::Assistant(previous)) => previous.extend(parts),
        _ => out.push(Message::Assistant(parts)),
    }
}

/// A reasoning item's summary, then its reasoning text, paragraphs apart.
fn reasoning_text(item: &Value) -> String {
    let texts = array(item.get("summary"))
        .chain(array(item.get("content")))
        .filter_map(|part| str_of(part, "text"))
        .filter(|text| !text.is_empty());
    let mut joined = String::new();
    for text in texts {
        if !joined.is_empty() {
            joined.push_str("\n\n");
        }
        joined.push_str(text);
    }
    joined
}

/// A message item (typed, or the short `{role, content}` form).
fn read_message(item: &Value, out: &mut Vec<Message>) -> Result<(), String> {
    let content = read_content(item.get("content"))?;
    match str_of(item, "role").unwrap_or_default() {
        "user" => out.push(Message::User(content)),
        "system" => out.push(Message::System(content)),
        "developer" => out.push(Message::Developer(content)),
        "assistant" => push_assistant(out, content),
        other => return Err(format!("message role {other}")),
    }
    Ok(())
}

/// A message's `content` or a tool's `output`: a string or parts.
fn read_content(content: Option<&Value>) -> Result<Vec<Part>, String> {
    match content {
        Some(Value::String(text)) => Ok(text_parts(text)),
        Some(Value::Array(parts)) => parts.iter().map(read_part).collect(),
        _ => Ok(Vec::new()),
    }
}

/// One content part. An image's `detail` and a text's annotations are
/// dropped (a resolution hint, provenance).
fn read_part(part: &Value) -> Result<Part, String> {
    match str_of(part, "type").unwrap_or_default() {
        "input_text" | "output_text" | "text" => Ok(Part::Text(string_of(part, "text"))),
        "refusal" => Ok(Part::Refusal(string_of(part, "refusal"))),
        "input_image" => match str_of(part, "image_url") {
            Some(url) => Ok(Part::Image(url.to_owned())),
            None => Err("input_image file_id (a file the provider holds)".to_owned()),
        },
        "input_file" => {
            let name = str_of(part, "filename");
            let url = match (str_of(part, "file_data"), str_of(part, "file_url")) {
                (Some(data), _) => file_data_url(data, name),
                (None, Some(url)) => url.to_owned(),
                (None, None) => {
                    return Err("input_file file_id (a file the provider holds)".to_owned());
                }
            };
            Ok(Part::Document {
                url,
                name: name.map(str::to_owned),
            })
        }
        other => Err(format!("content part {other}")),
    }
}

/// `file_data` as a `data:` URL: as it is when it is one, else base64 data
/// whose media type the file name's extension says (a PDF when it says
/// none: the Responses API's file inputs are PDFs first).
fn file_data_url(data: &str, name: Option<&str>) -> String {
    if data.starts_with("data:") {
        return data.to_owned();
    }
    let extension = name
        .and_then(|n| n.rsplit_once('.'))
        .map(|(_, extension)| extension.to_ascii_lowercase());
    let media_type = match extension.as_deref() {
        Some("txt") => "text/plain",
        Some("md") => "text/markdown",
        Some("csv") => "text/csv",
        Some("json") => "application/json",
        Some("html") => "text/html",
        _ => "application/pdf",
    };
    format!("data:{media_type};base64,{data}")
}

/// `tools`, `tool_choice` and `parallel_tool_calls`.
fn read_tools(body: &Map<String, Value>, out: &mut NeutralRequest) -> Result<(), String> {
    for tool in array(present(body, "tools")) {
        match str_of(tool, "type").unwrap_or("function") {
            "function" => out.tools.push(read_function(tool)?),
            // Free-form input under a grammar: no other dialect has one.
            "custom" => {
                return Err(format!(
                    "the custom tool {}",
                    str_of(tool, "name").unwrap_or_default()
                ));
            }
            other => return Err(format!("the provider-hosted tool {other}")),
        }
    }
    out.tool_choice = present(body, "tool_choice")
        .map(read_tool_choice)
        .transpose()?;
    out.parallel_tool_calls = present(body, "parallel_tool_calls").and_then(Value::as_bool);
    Ok(())
}

/// `tool_choice`: a mode, or `{type: function, name}`. Choices that
/// restrict or force other tools (`allowed_tools`, a hosted tool, `mcp`,
/// `custom`) are refused rather than widened.
fn read_tool_choice(choice: &Value) -> Result<ToolChoice, String> {
    match choice {
        Value::String(mode) => match mode.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(format!("tool_choice {other}")),
        },
        Value::Object(_) => match str_of(choice, "type").unwrap_or("function") {
            "function" => str_of(choice, "name")
                .map(|n| ToolChoice::Named(n.to_owned()))
                .ok_or_else(|| "tool_choice without a name".to_owned()),
            other => Err(format!("tool_choice {other}")),
        },
        _ => Err("tool_choice".to_owned()),
    }
}

/// The output limit, sampling, reasoning effort and structured output.
fn read_sampling(body: &Map<String, Value>, out: &mut NeutralRequest) -> Result<(), String> {
    out.max_output_tokens = present(body, "max_output_tokens").and_then(Value::as_u64);
    out.temperature = present(body, "temperature").and_then(Value::as_f64);
    out.top_p = present(body, "top_p").and_then(Value::as_f64);
    // `summary` asks for the reasoning to be summarized: advisory.
    out.reasoning_effort = present(body, "reasoning")
        .and_then(|r| str_of(r, "effort"))
        .map(str::to_owned);
    let format = present(body, "text")
        .and_then(|t| t.get("format"))
        .filter(|f| !f.is_null());
    if let Some(format) = format {
        match str_of(format, "type") {
            Some("text") | None => {}
            Some("json_object") => out.response_format = Some(ResponseFormat::JsonObject),
            Some("json_schema") => {
                // Chat completions' `json_schema`: the format without its type.
                let mut schema = format.as_object().cloned().unwrap_or_default();
                schema.remove("type");
                out.response_format = Some(ResponseFormat::JsonSchema);
                out.json_schema = Some(Value::Object(schema));
            }
            Some(other) => return Err(format!("text.format {other}")),
        }
    }
    Ok(())
}

/// The end user, metadata, streaming and log probabilities.
fn read_options(body: &Map<String, Value>, out: &mut NeutralRequest) {
    let string = |key: &str| {
        present(body, key)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    out.user = string("user").or_else(|| string("safety_identifier"));
    out.metadata = present(body, "metadata").cloned();
    out.stream = present(body, "stream").and_then(Value::as_bool) == Some(true);
    // A Responses stream always reports usage, and its clients read it.
    out.include_usage = out.stream;
    let top_logprobs = present(body, "top_logprobs").and_then(Value::as_u64);
    out.logprobs = top_logprobs.is_some_and(|n| n > 0)
        || array(present(body, "include")).any(|i| i.as_str() == Some(LOGPROBS_INCLUDE));
}

// ---------------------------------------------------------------------------
// Requests: neutral → Responses.

/// Writes a Responses body for `model`.
pub(super) fn body_from_neutral(request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
    refuse_unexpressible(request)?;
    let mut body = Map::new();
    body.insert("model".to_owned(), Value::from(model));
    let mut input = Vec::new();
    for message in &request.messages {
        write_message(message, &mut input)?;
    }
    body.insert("input".to_owned(), Value::Array(input));
    write_tools(request, &mut body);
    write_sampling(request, &mut body)?;
    write_options(request, &mut body);
    serde_json::to_vec(&body)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

/// What a Responses request has no place for, or the answer could not
/// carry back.
fn refuse_unexpressible(request: &NeutralRequest) -> Result<(), String> {
    let refusal = if request.choices > 1 {
        "n > 1"
    } else if request.stop.iter().any(|s| !s.is_empty()) {
        "stop sequences"
    } else if request.logprobs {
        "logprobs"
    } else if request.audio {
        "audio"
    } else {
        return Ok(());
    };
    Err(refusal.to_owned())
}

/// What a part is, for a refusal's reason.
fn part_name(part: &Part) -> &'static str {
    match part {
        Part::Text(_) => "text",
        Part::Image(_) => "an image",
        Part::Document { .. } => "a document",
        Part::ToolCall { .. } => "a tool call",
        Part::Thinking { .. } => "thinking",
        Part::RedactedThinking(_) => "redacted thinking",
        Part::Refusal(_) => "a refusal",
    }
}

/// A tool-call id in this dialect's form.
fn call_id(id: &str) -> Cow<'_, str> {
    reprefix(id, TOOL_CALL_ID_PREFIXES, CALL_PREFIX)
}

/// One message as input items.
fn write_message(message: &Message, input: &mut Vec<Value>) -> Result<(), String> {
    let item = match message {
        Message::System(parts) => input_message("system", parts)?,
        Message::Developer(parts) => input_message("developer", parts)?,
        Message::User(parts) => input_message("user", parts)?,
        Message::Assistant(parts) => return write_assistant(parts, input),
        // The Responses API has no error flag on a tool's output: its text
        // says it.
        Message::Tool {
            call_id: id,
            content,
            ..
        } => json!({
            "type": "function_call_output",
            "call_id": call_id(id),
            "output": input_content(content, "tool result")?,
        }),
    };
    input.push(item);
    Ok(())
}

/// A system, developer or user message item.
fn input_message(role: &str, parts: &[Part]) -> Result<Value, String> {
    let media = role == "user";
    if !media && let Some(part) = parts.iter().find(|p| !matches!(p, Part::Text(_))) {
        return Err(format!("{} in a {role} message", part_name(part)));
    }
    let context = format!("{role} message");
    Ok(json!({"type": "message", "role": role, "content": input_content(parts, &context)?}))
}

/// Input content: a string when it is one text (or none), else
/// `input_text`, `input_image` and `input_file` parts.
fn input_content(parts: &[Part], context: &str) -> Result<Value, String> {
    match parts {
        [] => return Ok(Value::from("")),
        [Part::Text(text)] => return Ok(Value::from(text.as_str())),
        _ => {}
    }
    parts
        .iter()
        .map(|part| match part {
            Part::Text(text) => Ok(json!({"type": "input_text", "text": text})),
            Part::Image(url) => {
                Ok(json!({"type": "input_image", "image_url": url, "detail": "auto"}))
            }
            Part::Document { url, name } => {
                // Inline data is `file_data`, a link `file_url`.
                let mut file = json!({"type": "input_file"});
                let key = if url.starts_with("data:") {
                    "file_data"
                } else {
                    "file_url"
                };
                file[key] = Value::from(url.as_str());
                if let Some(name) = name {
                    file["filename"] = Value::from(name.as_str());
                }
                Ok(file)
            }
            other => Err(format!("{} in a {context}", part_name(other))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// An assistant message: its text and refusals as one message item per
/// run, its tool calls as `function_call` items, in order. Its reasoning
/// is dropped: the Responses API takes a reasoning item back only with
/// its own id or encrypted content.
fn write_assistant(parts: &[Part], input: &mut Vec<Value>) -> Result<(), String> {
    let start = input.len();
    let mut content: Vec<Value> = Vec::new();
    let flush = |content: &mut Vec<Value>, input: &mut Vec<Value>| {
        if !content.is_empty() {
            let content = Value::Array(std::mem::take(content));
            input.push(json!({"type": "message", "role": "assistant", "content": content}));
        }
    };
    for part in parts {
        match part {
            Part::Text(text) => content.push(json!({"type": "output_text", "text": text})),
            Part::Refusal(refusal) => {
                content.push(json!({"type": "refusal", "refusal": refusal}));
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                flush(&mut content, input);
                input.push(json!({
                    "type": "function_call",
                    "call_id": call_id(id),
                    "name": name,
                    "arguments": arguments,
                }));
            }
            Part::Thinking { .. } | Part::RedactedThinking(_) => {}
            other => return Err(format!("{} in an assistant message", part_name(other))),
        }
    }
    flush(&mut content, input);
    // An empty turn is still a turn: empty text.
    if input.len() == start {
        input.push(json!({"type": "message", "role": "assistant", "content": ""}));
    }
    Ok(())
}

/// `tools`, `tool_choice` and `parallel_tool_calls`: the last two only
/// with tools.
fn write_tools(request: &NeutralRequest, body: &mut Map<String, Value>) {
    if request.tools.is_empty() {
        return;
    }
    let tools = request.tools.iter().map(|tool| {
        let mut function = Map::new();
        function.insert("type".to_owned(), Value::from("function"));
        function.insert("name".to_owned(), Value::from(tool.name.as_str()));
        if let Some(description) = &tool.description {
            function.insert("description".to_owned(), Value::from(description.as_str()));
        }
        // Both are required (`null` allowed); a function is strict only
        // when asked (the other dialects' default: the Responses API's
        // own is strict, which refuses schemas written for them).
        function.insert("parameters".to_owned(), tool.parameters.clone());
        function.insert("strict".to_owned(), Value::Bool(tool.strict == Some(true)));
        Value::Object(function)
    });
    body.insert("tools".to_owned(), tools.collect());
    if let Some(choice) = &request.tool_choice {
        let choice = match choice {
            ToolChoice::Auto => Value::from("auto"),
            ToolChoice::None => Value::from("none"),
            ToolChoice::Required => Value::from("required"),
            ToolChoice::Named(name) => json!({"type": "function", "name": name}),
        };
        body.insert("tool_choice".to_owned(), choice);
    }
    if let Some(parallel) = request.parallel_tool_calls {
        body.insert("parallel_tool_calls".to_owned(), Value::Bool(parallel));
    }
}

/// The output limit, sampling, structured output and reasoning effort.
fn write_sampling(request: &NeutralRequest, body: &mut Map<String, Value>) -> Result<(), String> {
    if let Some(max) = request.max_output_tokens {
        let max = max.max(MIN_OUTPUT_TOKENS);
        body.insert("max_output_tokens".to_owned(), Value::from(max));
    }
    if let Some(temperature) = request.temperature {
        body.insert("temperature".to_owned(), Value::from(temperature));
    }
    if let Some(top_p) = request.top_p {
        body.insert("top_p".to_owned(), Value::from(top_p));
    }
    let format = match request.response_format {
        None => None,
        Some(ResponseFormat::JsonObject) => Some(json!({"type": "json_object"})),
        Some(ResponseFormat::JsonSchema) => {
            let schema = request
                .json_schema
                .as_ref()
                .and_then(Value::as_object)
                .ok_or_else(|| "json_schema without a schema".to_owned())?;
            let mut format = Map::new();
            format.insert("type".to_owned(), Value::from("json_schema"));
            format.extend(schema.iter().map(|(k, v)| (k.clone(), v.clone())));
            Some(Value::Object(format))
        }
    };
    if let Some(format) = format {
        body.insert("text".to_owned(), json!({ "format": format }));
    }
    let effort = match (&request.reasoning_effort, request.thinking_budget) {
        (Some(effort), _) => Some(effort.clone()),
        (None, Some(budget)) => Some(effort_of_budget(budget).to_owned()),
        (None, None) => None,
    };
    if let Some(effort) = effort {
        // No `summary`: some providers refuse it to unverified accounts.
        body.insert("reasoning".to_owned(), json!({ "effort": effort }));
    }
    Ok(())
}

/// The end user, metadata, streaming, and `store: false`.
fn write_options(request: &NeutralRequest, body: &mut Map<String, Value>) {
    if let Some(user) = &request.user {
        body.insert("user".to_owned(), Value::from(user.as_str()));
    }
    if let Some(metadata) = &request.metadata {
        body.insert("metadata".to_owned(), metadata.clone());
    }
    if request.stream {
        // A Responses stream reports usage unasked.
        body.insert("stream".to_owned(), Value::Bool(true));
    }
    // The client of another dialect cannot name a stored response: storing
    // it would only keep its data at the provider.
    body.insert("store".to_owned(), Value::Bool(false));
}

// ---------------------------------------------------------------------------
// Finish reasons and usage.

/// Why a response ended, in neutral terms: `completed` is a natural end,
/// or tool calls when it made any; an incomplete response says why.
fn read_finish(incomplete: bool, reason: Option<&str>, calls: bool) -> FinishReason {
    match (incomplete, reason) {
        (false, _) if calls => FinishReason::ToolCalls,
        (false, _) => FinishReason::Stop,
        (true, Some("max_output_tokens")) => FinishReason::Length,
        (true, Some("content_filter")) => FinishReason::ContentFilter,
        (true, Some(other)) => FinishReason::Other(other.to_owned()),
        (true, None) => FinishReason::Other("incomplete".to_owned()),
    }
}

/// How a neutral finish is written: a response's status and, when it is
/// incomplete, why. A stop sequence, a tool call or another dialect's own
/// reason is a completed response.
fn write_finish(finish: Option<&FinishReason>) -> (&'static str, Option<&'static str>) {
    match finish {
        Some(FinishReason::Length) => ("incomplete", Some("max_output_tokens")),
        Some(FinishReason::ContentFilter) => ("incomplete", Some("content_filter")),
        _ => ("completed", None),
    }
}

/// A response's `usage`: `input_tokens` counts the cached ones.
fn read_usage(usage: &Value) -> Usage {
    let count = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
    let mut read = Usage::new(count("/input_tokens"), count("/output_tokens"));
    read.cached_input_tokens = count("/input_tokens_details/cached_tokens");
    read
}

// ---------------------------------------------------------------------------
// Streams: Responses → neutral.

/// What decoding keeps of the stream read so far.
#[derive(Debug, Default)]
struct Reading {
    /// `Start` was emitted.
    started: bool,
    /// The response completed: nothing after it counts.
    ended: bool,
    /// The output items, in the order they were first seen.
    items: Vec<ReadItem>,
    /// How many function calls have begun.
    calls: u32,
}

/// An output item being read.
#[derive(Debug)]
struct ReadItem {
    /// Its `output_index`, when the stream gave one.
    index: Option<u64>,
    /// Its id, when the stream gave one.
    id: Option<String>,
    kind: ReadKind,
    /// The pieces whose text was given (by deltas or whole): a `.done`
    /// event repeats them, and is read only for a piece given no other way.
    given: Vec<Piece>,
    /// The piece reasoning text was last given for: the next one is a new
    /// paragraph.
    last: Option<Piece>,
}

/// What an output item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadKind {
    Message,
    Reasoning,
    /// A function call: its position among the answer's calls, whether it
    /// is still open and whether any of its arguments were read.
    Call {
        call: u32,
        open: bool,
        has_arguments: bool,
    },
    /// A provider-hosted tool's call or anything newer: no neutral event.
    Other,
}

/// A content part or a reasoning summary part of an item, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Content(u64),
    Summary(u64),
}

/// What kind of text a piece holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextKind {
    Text,
    Refusal,
    Thinking,
}

/// One event of a Responses stream, read flat and borrowed: every event's
/// fields are members of one object, so one pass reads any of them.
#[derive(Deserialize)]
struct InEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(borrow, default)]
    item_id: Option<Cow<'a, str>>,
    #[serde(default)]
    content_index: Option<u64>,
    #[serde(default)]
    summary_index: Option<u64>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    item: Option<&'a RawValue>,
    #[serde(borrow, default)]
    part: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
}

impl InEvent<'_> {
    fn content(&self) -> Piece {
        Piece::Content(self.content_index.unwrap_or(0))
    }

    fn summary(&self) -> Piece {
        Piece::Summary(self.summary_index.unwrap_or(0))
    }
}

/// A raw member as a JSON value (`Null` when absent or not JSON).
fn value_of(raw: Option<&RawValue>) -> Value {
    raw.and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or(Value::Null)
}

/// Reads one event of a Responses stream into neutral events.
pub(super) fn decode_event(event: &SseEvent, memo: &mut StreamMemo, out: &mut Vec<NeutralEvent>) {
    let reading = &mut memo.reading;
    // In-band errors and failed responses are the commit machine's; what
    // does not parse is skipped, never fatal.
    if reading.ended || event.is_named("error") {
        return;
    }
    let Ok(data) = serde_json::from_slice::<InEvent<'_>>(event.data()) else {
        return;
    };
    let mark = out.len();
    reading.event(&data, out);
    // A stream without `response.created` still starts before its first
    // event.
    if !reading.started && out.len() > mark {
        reading.started = true;
        let start = NeutralEvent::Start {
            id: String::new(),
            model: String::new(),
            created: None,
        };
        out.insert(mark, start);
    }
}

impl Reading {
    /// One event, by its type.
    fn event(&mut self, e: &InEvent<'_>, out: &mut Vec<NeutralEvent>) {
        let id = e.item_id.as_deref();
        match &*e.kind {
            "response.created" | "response.in_progress" | "response.queued" => {
                self.start(&value_of(e.response), out);
            }
            "response.output_item.added" => {
                let item = value_of(e.item);
                let at = self.item(e.output_index, &item, out);
                self.whole_item(at, &item, out);
            }
            "response.output_item.done" => {
                let item = value_of(e.item);
                let at = self.item(e.output_index, &item, out);
                self.whole_item(at, &item, out);
                self.end_call(at, out);
            }
            "response.content_part.added" | "response.content_part.done" => {
                let at = self.ensure(e.output_index, id, ReadKind::Message, out);
                let part = value_of(e.part);
                self.whole_part(at, e.content(), &part, out);
            }
            "response.reasoning_summary_part.added" | "response.reasoning_summary_part.done" => {
                let at = self.ensure(e.output_index, id, ReadKind::Reasoning, out);
                let text = str_of(&value_of(e.part), "text").map(str::to_owned);
                self.give_whole(at, e.summary(), TextKind::Thinking, text.as_deref(), out);
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let kind = if e.kind.starts_with("response.refusal") {
                    TextKind::Refusal
                } else {
                    TextKind::Text
                };
                let at = self.ensure(e.output_index, id, ReadKind::Message, out);
                self.give(at, e.content(), kind, e.delta.as_deref(), out);
            }
            "response.output_text.done" => {
                let at = self.ensure(e.output_index, id, ReadKind::Message, out);
                self.give_whole(at, e.content(), TextKind::Text, e.text.as_deref(), out);
            }
            "response.refusal.done" => {
                let at = self.ensure(e.output_index, id, ReadKind::Message, out);
                let refusal = e.refusal.as_deref();
                self.give_whole(at, e.content(), TextKind::Refusal, refusal, out);
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                let at = self.ensure(e.output_index, id, ReadKind::Reasoning, out);
                let piece = if e.kind.contains("summary") {
                    e.summary()
                } else {
                    e.content()
                };
                self.give(at, piece, TextKind::Thinking, e.delta.as_deref(), out);
            }
            "response.reasoning_summary_text.done" | "response.reasoning_text.done" => {
                let at = self.ensure(e.output_index, id, ReadKind::Reasoning, out);
                let piece = if e.kind.contains("summary") {
                    e.summary()
                } else {
                    e.content()
                };
                self.give_whole(at, piece, TextKind::Thinking, e.text.as_deref(), out);
            }
            "response.function_call_arguments.delta" => {
                let at = self.ensure_call(e.output_index, id, out);
                self.arguments(at, e.delta.as_deref(), false, out);
            }
            "response.function_call_arguments.done" => {
                let at = self.ensure_call(e.output_index, id, out);
                self.arguments(at, e.arguments.as_deref(), true, out);
            }
            "response.completed" | "response.incomplete" => {
                let incomplete = e.kind == "response.incomplete";
                self.finish(&value_of(e.response), incomplete, out);
            }
            // `response.failed` and `error` are the commit machine's;
            // annotations, hosted tools' progress and newer events carry
            // nothing the neutral model has.
            _ => {}
        }
    }

    /// `Start`, from the first lifecycle event's response.
    fn start(&mut self, response: &Value, out: &mut Vec<NeutralEvent>) {
        if self.started {
            return;
        }
        self.started = true;
        out.push(NeutralEvent::Start {
            id: string_of(response, "id"),
            model: string_of(response, "model"),
            created: response
                .get("created_at")
                .and_then(Value::as_f64)
                .map(|c| c as i64),
        });
    }

    /// The position of the item at `index` (or with `id`), if it was seen;
    /// an event that names neither is the last item's.
    fn find(&self, index: Option<u64>, id: Option<&str>) -> Option<usize> {
        if index.is_none() && id.is_none() {
            return self.items.len().checked_sub(1);
        }
        let by_index = index.and_then(|i| self.items.iter().rposition(|it| it.index == Some(i)));
        by_index.or_else(|| {
            let id = id?;
            self.items
                .iter()
                .rposition(|it| it.id.as_deref() == Some(id))
        })
    }

    /// Adds an item; a function call begins.
    fn push(
        &mut self,
        index: Option<u64>,
        id: Option<&str>,
        kind: ReadKind,
        call: Option<(&str, &str)>,
        out: &mut Vec<NeutralEvent>,
    ) -> usize {
        let kind = match (kind, call) {
            (ReadKind::Call { .. }, Some((call_id, name))) => {
                let call = self.calls;
                self.calls = self.calls.saturating_add(1);
                out.push(NeutralEvent::ToolCallStart {
                    index: call,
                    id: call_id.to_owned(),
                    name: name.to_owned(),
                });
                ReadKind::Call {
                    call,
                    open: true,
                    has_arguments: false,
                }
            }
            (kind, _) => kind,
        };
        self.items.push(ReadItem {
            index,
            id: id.map(str::to_owned),
            kind,
            given: Vec::new(),
            last: None,
        });
        self.items.len() - 1
    }

    /// The item an `output_item` event (or a completed response's output)
    /// names: the one seen, or a new one.
    fn item(&mut self, index: Option<u64>, item: &Value, out: &mut Vec<NeutralEvent>) -> usize {
        match self.find(index, str_of(item, "id")) {
            Some(at) => at,
            None => self.add_item(index, item, out),
        }
    }

    /// Adds an item an `output_item` event (or a completed response's
    /// output) names for the first time.
    fn add_item(&mut self, index: Option<u64>, item: &Value, out: &mut Vec<NeutralEvent>) -> usize {
        let id = str_of(item, "id");
        let kind = match str_of(item, "type").unwrap_or("message") {
            "message" => ReadKind::Message,
            "reasoning" => ReadKind::Reasoning,
            "function_call" => ReadKind::Call {
                call: 0,
                open: true,
                has_arguments: false,
            },
            _ => ReadKind::Other,
        };
        let call_id = str_of(item, "call_id").or(id).unwrap_or_default();
        let name = str_of(item, "name").unwrap_or_default();
        self.push(index, id, kind, Some((call_id, name)), out)
    }

    /// The item a part or delta event names; one not announced is taken
    /// to be of `kind`.
    fn ensure(
        &mut self,
        index: Option<u64>,
        id: Option<&str>,
        kind: ReadKind,
        out: &mut Vec<NeutralEvent>,
    ) -> usize {
        match self.find(index, id) {
            Some(at) => at,
            None => self.push(index, id, kind, None, out),
        }
    }

    /// The function call an arguments event names; one not announced
    /// begins here, named by nothing but its item id.
    fn ensure_call(
        &mut self,
        index: Option<u64>,
        id: Option<&str>,
        out: &mut Vec<NeutralEvent>,
    ) -> usize {
        if let Some(at) = self.find(index, id) {
            return at;
        }
        let kind = ReadKind::Call {
            call: 0,
            open: true,
            has_arguments: false,
        };
        self.push(index, id, kind, Some((id.unwrap_or_default(), "")), out)
    }

    /// What a whole item carries that was not given yet: a message's
    /// parts, a reasoning item's summary and text, a call's arguments.
    fn whole_item(&mut self, at: usize, item: &Value, out: &mut Vec<NeutralEvent>) {
        match self.items[at].kind {
            ReadKind::Message => {
                for (i, part) in (0u64..).zip(array(item.get("content"))) {
                    self.whole_part(at, Piece::Content(i), part, out);
                }
            }
            ReadKind::Reasoning => {
                for (i, part) in (0u64..).zip(array(item.get("summary"))) {
                    let text = str_of(part, "text");
                    self.give_whole(at, Piece::Summary(i), TextKind::Thinking, text, out);
                }
                for (i, part) in (0u64..).zip(array(item.get("content"))) {
                    let text = str_of(part, "text");
                    self.give_whole(at, Piece::Content(i), TextKind::Thinking, text, out);
                }
            }
            ReadKind::Call { .. } => self.arguments(at, str_of(item, "arguments"), true, out),
            ReadKind::Other => {}
        }
    }

    /// A whole content part: text, a refusal, or reasoning text.
    fn whole_part(&mut self, at: usize, piece: Piece, part: &Value, out: &mut Vec<NeutralEvent>) {
        let (kind, text) = match str_of(part, "type") {
            Some("refusal") => (TextKind::Refusal, str_of(part, "refusal")),
            _ if self.items[at].kind == ReadKind::Reasoning => {
                (TextKind::Thinking, str_of(part, "text"))
            }
            _ => (TextKind::Text, str_of(part, "text")),
        };
        self.give_whole(at, piece, kind, text, out);
    }

    /// A piece's whole text, when none of it was given yet.
    fn give_whole(
        &mut self,
        at: usize,
        piece: Piece,
        kind: TextKind,
        text: Option<&str>,
        out: &mut Vec<NeutralEvent>,
    ) {
        if !self.items[at].given.contains(&piece) {
            self.give(at, piece, kind, text, out);
        }
    }

    /// Text of a piece (a delta, or a whole piece not given before).
    fn give(
        &mut self,
        at: usize,
        piece: Piece,
        kind: TextKind,
        text: Option<&str>,
        out: &mut Vec<NeutralEvent>,
    ) {
        let Some(text) = text.filter(|t| !t.is_empty()) else {
            return;
        };
        let item = &mut self.items[at];
        if !item.given.contains(&piece) {
            item.given.push(piece);
        }
        out.push(match kind {
            TextKind::Text => NeutralEvent::Text(text.to_owned()),
            TextKind::Refusal => NeutralEvent::Refusal(text.to_owned()),
            // A reasoning item's summary parts are paragraphs.
            TextKind::Thinking if item.last.is_some_and(|last| last != piece) => {
                item.last = Some(piece);
                NeutralEvent::Thinking(format!("\n\n{text}"))
            }
            TextKind::Thinking => {
                item.last = Some(piece);
                NeutralEvent::Thinking(text.to_owned())
            }
        });
    }

    /// Arguments of an open call: a delta, or whole ones (given only when
    /// none were read before).
    fn arguments(
        &mut self,
        at: usize,
        text: Option<&str>,
        whole: bool,
        out: &mut Vec<NeutralEvent>,
    ) {
        let ReadKind::Call {
            call,
            open: true,
            has_arguments,
        } = &mut self.items[at].kind
        else {
            return;
        };
        if whole && *has_arguments {
            return;
        }
        let Some(text) = text.filter(|t| !t.is_empty()) else {
            return;
        };
        *has_arguments = true;
        out.push(NeutralEvent::ToolCallArguments {
            index: *call,
            delta: text.to_owned(),
        });
    }

    /// Ends a call if it is open. A call that read no arguments gets `{}`,
    /// so a client of another dialect parses them.
    fn end_call(&mut self, at: usize, out: &mut Vec<NeutralEvent>) {
        let ReadKind::Call {
            call,
            open,
            has_arguments,
        } = &mut self.items[at].kind
        else {
            return;
        };
        if !*open {
            return;
        }
        *open = false;
        if !*has_arguments {
            *has_arguments = true;
            out.push(NeutralEvent::ToolCallArguments {
                index: *call,
                delta: "{}".to_owned(),
            });
        }
        out.push(NeutralEvent::ToolCallEnd { index: *call });
    }

    /// The end of the response: what its output holds that the stream did
    /// not give, every call ended, usage, why it ended, the end.
    fn finish(&mut self, response: &Value, incomplete: bool, out: &mut Vec<NeutralEvent>) {
        self.start(response, out);
        for (position, item) in (0u64..).zip(array(response.get("output"))) {
            // By id: a provider's indexes and the output's positions may
            // disagree, its ids do not. An item without one is the stream's
            // at its position.
            let at = match str_of(item, "id") {
                Some(id) => match self.find(None, Some(id)) {
                    Some(at) => at,
                    None => self.add_item(None, item, out),
                },
                None => self.item(Some(position), item, out),
            };
            self.whole_item(at, item, out);
            self.end_call(at, out);
        }
        // Calls the output did not list end too.
        for at in 0..self.items.len() {
            self.end_call(at, out);
        }
        if let Some(usage) = response.get("usage").filter(|u| u.is_object()) {
            out.push(NeutralEvent::Usage(read_usage(usage)));
        }
        let reason = response
            .pointer("/incomplete_details/reason")
            .and_then(Value::as_str);
        out.push(NeutralEvent::Finish(read_finish(
            incomplete,
            reason,
            self.calls > 0,
        )));
        out.push(NeutralEvent::End);
        self.ended = true;
    }
}

/// Reads a whole `response` object as the events its stream would give.
pub(super) fn decode_answer(body: &[u8]) -> Option<Vec<NeutralEvent>> {
    let response: Value = serde_json::from_slice(body).ok()?;
    if str_of(&response, "object").is_some_and(|o| o != "response") {
        return None;
    }
    response.get("output")?.as_array()?;
    let incomplete = str_of(&response, "status") == Some("incomplete");
    let mut reading = Reading::default();
    let mut out = Vec::new();
    reading.finish(&response, incomplete, &mut out);
    Some(out)
}

// ---------------------------------------------------------------------------
// Answers: the wire shapes written.

/// A `response` object: the lifecycle events' and a whole answer.
#[derive(Serialize)]
struct ResponseOut<'a> {
    id: &'a str,
    object: &'static str,
    created_at: i64,
    status: &'static str,
    model: &'a str,
    output: Vec<ItemOut<'a>>,
    usage: Option<UsageOut>,
    /// The SDKs' response model requires the request's tool settings; the
    /// gateway does not keep the client's, so the API's defaults.
    parallel_tool_calls: bool,
    tool_choice: &'static str,
    tools: [(); 0],
    error: Option<()>,
    incomplete_details: Option<IncompleteOut>,
}

/// Why a response is incomplete.
#[derive(Serialize)]
struct IncompleteOut {
    reason: &'static str,
}

/// The Responses usage object: `input_tokens` counts the cached ones.
#[derive(Serialize)]
struct UsageOut {
    input_tokens: u64,
    input_tokens_details: InputDetailsOut,
    output_tokens: u64,
    output_tokens_details: OutputDetailsOut,
    total_tokens: u64,
}

/// `input_tokens_details`: cache writes are not in the neutral model.
#[derive(Serialize)]
struct InputDetailsOut {
    cached_tokens: u64,
    cache_write_tokens: u64,
}

/// `output_tokens_details`: reasoning tokens are not in the neutral model
/// (they are counted in `output_tokens`).
#[derive(Serialize)]
struct OutputDetailsOut {
    reasoning_tokens: u64,
}

impl From<&Usage> for UsageOut {
    fn from(usage: &Usage) -> Self {
        Self {
            input_tokens: usage.input_tokens,
            input_tokens_details: InputDetailsOut {
                cached_tokens: usage.cached_input_tokens,
                cache_write_tokens: 0,
            },
            output_tokens: usage.output_tokens,
            output_tokens_details: OutputDetailsOut {
                reasoning_tokens: 0,
            },
            total_tokens: usage.input_tokens.saturating_add(usage.output_tokens),
        }
    }
}

/// An output item, as written.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ItemOut<'a> {
    Message {
        id: &'a str,
        status: &'static str,
        role: &'static str,
        content: Vec<PartOut<'a>>,
    },
    FunctionCall {
        id: &'a str,
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
        status: &'static str,
    },
    Reasoning {
        id: &'a str,
        summary: Vec<PartOut<'a>>,
    },
}

/// A message's content part or a reasoning summary part, as written.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum PartOut<'a> {
    OutputText { text: &'a str, annotations: [(); 0] },
    Refusal { refusal: &'a str },
    SummaryText { text: &'a str },
}

/// The data of a lifecycle event.
#[derive(Serialize)]
struct LifecycleOut<'a> {
    response: ResponseOut<'a>,
}

/// The data of `response.output_item.added` / `.done`.
#[derive(Serialize)]
struct ItemEventOut<'a> {
    output_index: usize,
    item: ItemOut<'a>,
}

/// The data of a part, delta or `.done` event of an item: only the
/// members set are written.
#[derive(Serialize, Default)]
struct PieceEventOut<'a> {
    item_id: &'a str,
    output_index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary_index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<PartOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a str>,
    /// Text events carry their (absent) log probabilities.
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[(); 0]>,
}

/// Writes the frames of a stream: each `event: <type>` with data whose
/// `type` is the same and whose `sequence_number` is the next.
#[derive(Debug, Default)]
struct Frames {
    /// The next event's `sequence_number`.
    sequence: u64,
    /// Nothing is written: a whole answer is being gathered.
    silent: bool,
}

impl Frames {
    /// Appends one event: `{"type":…,"sequence_number":…` and the members
    /// of `body` (an object); nothing if it does not serialize (these types
    /// always do), so no half event is ever written.
    fn emit(&mut self, out: &mut BytesMut, kind: &str, body: &impl Serialize) {
        if self.silent {
            self.sequence += 1;
            return;
        }
        let mark = out.len();
        out.put_slice(b"event: ");
        out.put_slice(kind.as_bytes());
        out.put_slice(b"\ndata: {\"type\":\"");
        out.put_slice(kind.as_bytes());
        out.put_slice(b"\",\"sequence_number\":");
        let _ = write!(out, "{}", self.sequence);
        let members = out.len();
        let written = serde_json::to_writer((&mut *out).writer(), body).is_ok();
        match out.get(members..) {
            Some(b"{}") => {
                out.truncate(members);
                out.put_u8(b'}');
            }
            Some([b'{', ..]) if written => out[members] = b',',
            _ => {
                out.truncate(mark);
                return;
            }
        }
        out.put_slice(b"\n\n");
        self.sequence += 1;
    }
}

// ---------------------------------------------------------------------------
// Streams: neutral → Responses.

/// What encoding keeps of the stream written so far. The answer is kept
/// whole, every item with its full text and arguments, because
/// `response.completed` must carry it (npm's stream helper replaces its
/// snapshot with that event's response): memory O(answer).
#[derive(Debug, Default)]
struct Writing {
    frames: Frames,
    /// `response.created` was written.
    started: bool,
    /// `response.completed` (or `.incomplete`) was written: nothing more is.
    ended: bool,
    identity: Identity,
    /// The output items written, in order: an item's position is its
    /// `output_index`.
    items: Vec<OutItem>,
    /// The position of the open message or reasoning item.
    current: Option<usize>,
    /// The last usage given, written at the end.
    usage: Option<Usage>,
    /// The finish reason given, written at the end.
    finish: Option<FinishReason>,
}

/// The identity of the response written.
#[derive(Debug, Default)]
struct Identity {
    id: String,
    model: String,
    created: i64,
}

/// An output item written.
#[derive(Debug)]
enum OutItem {
    /// An assistant message: its text and refusal parts.
    Message { id: String, parts: Vec<OutPart> },
    /// Reasoning: one summary part.
    Reasoning { id: String, text: String },
    /// A function call, and the neutral index it was written for.
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        index: u32,
        open: bool,
    },
}

/// A message's content part written.
#[derive(Debug)]
struct OutPart {
    refusal: bool,
    text: String,
    open: bool,
}

impl OutPart {
    fn out(&self) -> PartOut<'_> {
        if self.refusal {
            PartOut::Refusal {
                refusal: &self.text,
            }
        } else {
            PartOut::OutputText {
                text: &self.text,
                annotations: [],
            }
        }
    }
}

impl OutItem {
    /// The item as written: as it starts (empty, in progress), or whole.
    fn out(&self, whole: bool) -> ItemOut<'_> {
        let status = if whole { "completed" } else { "in_progress" };
        match self {
            Self::Message { id, parts } => ItemOut::Message {
                id,
                status,
                role: "assistant",
                content: if whole {
                    parts.iter().map(OutPart::out).collect()
                } else {
                    Vec::new()
                },
            },
            Self::Reasoning { id, text } => ItemOut::Reasoning {
                id,
                summary: if whole {
                    vec![PartOut::SummaryText { text }]
                } else {
                    Vec::new()
                },
            },
            Self::Call {
                id,
                call_id,
                name,
                arguments,
                ..
            } => ItemOut::FunctionCall {
                id,
                call_id,
                name,
                arguments: if whole { arguments } else { "" },
                status,
            },
        }
    }
}

/// A `response` object of `identity`: in progress with no output, or the
/// answer's end with every item whole.
fn response_out<'a>(
    identity: &'a Identity,
    items: &'a [OutItem],
    usage: Option<&Usage>,
    finish: Option<&FinishReason>,
    end: bool,
) -> ResponseOut<'a> {
    let (status, reason) = if end {
        write_finish(finish)
    } else {
        ("in_progress", None)
    };
    ResponseOut {
        id: &identity.id,
        object: "response",
        created_at: identity.created,
        status,
        model: &identity.model,
        output: items.iter().map(|item| item.out(true)).collect(),
        usage: usage.map(UsageOut::from),
        parallel_tool_calls: true,
        tool_choice: "auto",
        tools: [],
        error: None,
        incomplete_details: reason.map(|reason| IncompleteOut { reason }),
    }
}

/// Writes one neutral event as Responses stream events.
pub(super) fn encode_event(event: &NeutralEvent, memo: &mut StreamMemo, out: &mut BytesMut) {
    memo.writing.event(event, out);
}

impl Writing {
    fn event(&mut self, event: &NeutralEvent, out: &mut BytesMut) {
        if self.ended {
            return;
        }
        match event {
            NeutralEvent::Start { id, model, created } => self.start(id, model, *created, out),
            NeutralEvent::Text(text) => self.text(text, false, out),
            NeutralEvent::Refusal(text) => self.text(text, true, out),
            NeutralEvent::Thinking(text) => self.thinking(text, out),
            // A reasoning item carries no signature another provider wrote,
            // nor its encrypted reasoning.
            NeutralEvent::ThinkingSignature(_) | NeutralEvent::RedactedThinking(_) => {}
            NeutralEvent::ToolCallStart { index, id, name } => {
                self.call_start(*index, id, name, out);
            }
            NeutralEvent::ToolCallArguments { index, delta } => {
                self.call_arguments(*index, delta, out);
            }
            NeutralEvent::ToolCallEnd { index } => {
                let call = self.items.iter().rposition(
                    |item| matches!(item, OutItem::Call { index: i, open: true, .. } if i == index),
                );
                if let Some(at) = call {
                    self.close_item(at, out);
                }
            }
            NeutralEvent::Usage(usage) => self.usage = Some(*usage),
            NeutralEvent::Finish(reason) => {
                self.finish = Some(reason.clone());
                self.ensure_started(out);
                self.close_all(out);
            }
            NeutralEvent::End => self.end(out),
        }
    }

    /// Writes `response.created` and `response.in_progress`.
    fn start(&mut self, id: &str, model: &str, created: Option<i64>, out: &mut BytesMut) {
        if self.started {
            return;
        }
        self.started = true;
        // A response id is `resp_` and the answer's own (its dialect's
        // prefix swapped): the SDKs show it, no request names it again.
        let id = match reprefix(id, ANSWER_ID_PREFIXES, ANSWER_PREFIX) {
            _ if id.is_empty() => GATEWAY_ID.to_owned(),
            id if id.starts_with(ANSWER_PREFIX) => id.into_owned(),
            id => format!("{ANSWER_PREFIX}{id}"),
        };
        self.identity = Identity {
            id,
            model: model.to_owned(),
            created: created.unwrap_or_else(now),
        };
        for kind in ["response.created", "response.in_progress"] {
            let response = response_out(&self.identity, &[], None, None, false);
            self.frames.emit(out, kind, &LifecycleOut { response });
        }
    }

    /// Starts the response if nothing has been written yet, so the stream
    /// stays valid when content comes first.
    fn ensure_started(&mut self, out: &mut BytesMut) {
        self.start("", "", None, out);
    }

    /// An item id of this response: `prefix`, the response's own id, the
    /// item's position.
    fn item_id(&self, prefix: &str, at: usize) -> String {
        let id = &self.identity.id;
        let own = id.strip_prefix(ANSWER_PREFIX).unwrap_or(id);
        format!("{prefix}{own}_{at}")
    }

    /// Adds an item and writes `response.output_item.added`; returns its
    /// position.
    fn add(&mut self, item: OutItem, out: &mut BytesMut) -> usize {
        let at = self.items.len();
        self.items.push(item);
        let event = ItemEventOut {
            output_index: at,
            item: self.items[at].out(false),
        };
        self.frames.emit(out, "response.output_item.added", &event);
        at
    }

    /// The open message (or reasoning) item, opened when another kind is
    /// open or none is.
    fn current(&mut self, message: bool, out: &mut BytesMut) -> usize {
        if let Some(at) = self.current {
            let open = &self.items[at];
            if matches!(open, OutItem::Message { .. }) == message {
                return at;
            }
        }
        self.close_current(out);
        let at = self.items.len();
        let item = if message {
            OutItem::Message {
                id: self.item_id("msg_", at),
                parts: Vec::new(),
            }
        } else {
            OutItem::Reasoning {
                id: self.item_id("rs_", at),
                text: String::new(),
            }
        };
        self.add(item, out);
        self.current = Some(at);
        if let OutItem::Reasoning { id, .. } = &self.items[at] {
            let event = PieceEventOut {
                item_id: id,
                output_index: at,
                summary_index: Some(0),
                part: Some(PartOut::SummaryText { text: "" }),
                ..PieceEventOut::default()
            };
            self.frames
                .emit(out, "response.reasoning_summary_part.added", &event);
        }
        at
    }

    /// Text or a refusal: a delta of the open message's part of that kind
    /// (a new part when the other kind is open).
    fn text(&mut self, text: &str, refusal: bool, out: &mut BytesMut) {
        if text.is_empty() {
            return;
        }
        self.ensure_started(out);
        let at = self.current(true, out);
        let Self { frames, items, .. } = self;
        let Some(OutItem::Message { id, parts }) = items.get_mut(at) else {
            return;
        };
        if !parts.last().is_some_and(|p| p.open && p.refusal == refusal) {
            let last = parts.len().saturating_sub(1);
            if let Some(open) = parts.last_mut().filter(|p| p.open) {
                close_part(frames, id, at, last, open, out);
            }
            parts.push(OutPart {
                refusal,
                text: String::new(),
                open: true,
            });
            let part = if refusal {
                PartOut::Refusal { refusal: "" }
            } else {
                PartOut::OutputText {
                    text: "",
                    annotations: [],
                }
            };
            let event = PieceEventOut {
                item_id: id,
                output_index: at,
                content_index: Some(parts.len() - 1),
                part: Some(part),
                ..PieceEventOut::default()
            };
            frames.emit(out, "response.content_part.added", &event);
        }
        let content_index = parts.len() - 1;
        if let Some(part) = parts.last_mut() {
            part.text.push_str(text);
        }
        let (kind, logprobs) = if refusal {
            ("response.refusal.delta", None)
        } else {
            ("response.output_text.delta", Some([]))
        };
        let event = PieceEventOut {
            item_id: id,
            output_index: at,
            content_index: Some(content_index),
            delta: Some(text),
            logprobs,
            ..PieceEventOut::default()
        };
        frames.emit(out, kind, &event);
    }

    /// Reasoning: a delta of the open reasoning item's summary.
    fn thinking(&mut self, text: &str, out: &mut BytesMut) {
        if text.is_empty() {
            return;
        }
        self.ensure_started(out);
        let at = self.current(false, out);
        let Self { frames, items, .. } = self;
        let Some(OutItem::Reasoning { id, text: whole }) = items.get_mut(at) else {
            return;
        };
        whole.push_str(text);
        let event = PieceEventOut {
            item_id: id,
            output_index: at,
            summary_index: Some(0),
            delta: Some(text),
            ..PieceEventOut::default()
        };
        frames.emit(out, "response.reasoning_summary_text.delta", &event);
    }

    /// A function call begins: its item is added, and stays open until the
    /// call ends (another call's or the text's items may come between).
    fn call_start(&mut self, index: u32, id: &str, name: &str, out: &mut BytesMut) {
        self.ensure_started(out);
        self.close_current(out);
        let at = self.items.len();
        // A call the client cannot answer without an id gets one.
        let call_id = if id.is_empty() {
            self.item_id(CALL_PREFIX, at)
        } else {
            call_id(id).into_owned()
        };
        let item = OutItem::Call {
            id: self.item_id("fc_", at),
            call_id,
            name: name.to_owned(),
            arguments: String::new(),
            index,
            open: true,
        };
        self.add(item, out);
    }

    /// Arguments of an open call; those of a call not open are dropped.
    fn call_arguments(&mut self, index: u32, delta: &str, out: &mut BytesMut) {
        if delta.is_empty() {
            return;
        }
        let Self { frames, items, .. } = self;
        let call = items
            .iter_mut()
            .enumerate()
            .rev()
            .find_map(|(at, item)| match item {
                OutItem::Call {
                    id,
                    arguments,
                    index: i,
                    open: true,
                    ..
                } if *i == index => Some((at, id, arguments)),
                _ => None,
            });
        let Some((at, id, arguments)) = call else {
            return;
        };
        arguments.push_str(delta);
        let event = PieceEventOut {
            item_id: id,
            output_index: at,
            delta: Some(delta),
            ..PieceEventOut::default()
        };
        frames.emit(out, "response.function_call_arguments.delta", &event);
    }

    /// Closes the open message or reasoning item.
    fn close_current(&mut self, out: &mut BytesMut) {
        if let Some(at) = self.current.take() {
            self.close_item(at, out);
        }
    }

    /// Closes every open item, in order.
    fn close_all(&mut self, out: &mut BytesMut) {
        self.close_current(out);
        for at in 0..self.items.len() {
            if matches!(self.items[at], OutItem::Call { open: true, .. }) {
                self.close_item(at, out);
            }
        }
    }

    /// Writes the `.done` events that close the item at `at`, then
    /// `response.output_item.done` with the whole item.
    fn close_item(&mut self, at: usize, out: &mut BytesMut) {
        let Self { frames, items, .. } = self;
        let Some(item) = items.get_mut(at) else {
            return;
        };
        match item {
            OutItem::Message { id, parts } => {
                let last = parts.len().saturating_sub(1);
                if let Some(open) = parts.last_mut().filter(|p| p.open) {
                    close_part(frames, id, at, last, open, out);
                }
            }
            OutItem::Reasoning { id, text } => {
                let done = PieceEventOut {
                    item_id: id,
                    output_index: at,
                    summary_index: Some(0),
                    text: Some(text),
                    ..PieceEventOut::default()
                };
                frames.emit(out, "response.reasoning_summary_text.done", &done);
                let done = PieceEventOut {
                    item_id: id,
                    output_index: at,
                    summary_index: Some(0),
                    part: Some(PartOut::SummaryText { text }),
                    ..PieceEventOut::default()
                };
                frames.emit(out, "response.reasoning_summary_part.done", &done);
            }
            OutItem::Call {
                id,
                arguments,
                open,
                ..
            } => {
                if !*open {
                    return;
                }
                *open = false;
                let done = PieceEventOut {
                    item_id: id,
                    output_index: at,
                    arguments: Some(arguments),
                    ..PieceEventOut::default()
                };
                frames.emit(out, "response.function_call_arguments.done", &done);
            }
        }
        let event = ItemEventOut {
            output_index: at,
            item: item.out(true),
        };
        frames.emit(out, "response.output_item.done", &event);
    }

    /// Closes every item, then writes `response.completed` (or
    /// `response.incomplete`) with the whole output and usage.
    fn end(&mut self, out: &mut BytesMut) {
        self.ensure_started(out);
        self.close_all(out);
        let kind = match write_finish(self.finish.as_ref()) {
            ("incomplete", _) => "response.incomplete",
            _ => "response.completed",
        };
        let response = response_out(
            &self.identity,
            &self.items,
            self.usage.as_ref(),
            self.finish.as_ref(),
            true,
        );
        self.frames.emit(out, kind, &LifecycleOut { response });
        self.ended = true;
    }
}

/// Writes the `.done` events that close a message's content part.
fn close_part(
    frames: &mut Frames,
    item_id: &str,
    at: usize,
    content_index: usize,
    part: &mut OutPart,
    out: &mut BytesMut,
) {
    part.open = false;
    let (kind, done) = if part.refusal {
        let done = PieceEventOut {
            refusal: Some(&part.text),
            ..PieceEventOut::default()
        };
        ("response.refusal.done", done)
    } else {
        let done = PieceEventOut {
            text: Some(&part.text),
            logprobs: Some([]),
            ..PieceEventOut::default()
        };
        ("response.output_text.done", done)
    };
    let done = PieceEventOut {
        item_id,
        output_index: at,
        content_index: Some(content_index),
        ..done
    };
    frames.emit(out, kind, &done);
    let done = PieceEventOut {
        item_id,
        output_index: at,
        content_index: Some(content_index),
        part: Some(part.out()),
        ..PieceEventOut::default()
    };
    frames.emit(out, "response.content_part.done", &done);
}

/// Writes a whole `response` object from a whole answer's events: the
/// items a stream of them would have written, whole.
pub(super) fn encode_answer(events: &[NeutralEvent]) -> Option<Bytes> {
    let mut writing = Writing {
        frames: Frames {
            sequence: 0,
            silent: true,
        },
        ..Writing::default()
    };
    let mut nothing = BytesMut::new();
    for event in events {
        if *event != NeutralEvent::End {
            writing.event(event, &mut nothing);
        }
    }
    writing.ensure_started(&mut nothing);
    writing.close_all(&mut nothing);
    let response = response_out(
        &writing.identity,
        &writing.items,
        writing.usage.as_ref(),
        writing.finish.as_ref(),
        true,
    );
    serde_json::to_vec(&response).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::super::request;
    use super::*;
    use crate::dialect::ToolSpec;
    use crate::dialect::{
        BodyCheck, ChunkKind, Dialect, OpenAiResponses, ResponsesMemo, TerminalError, TerminalMode,
    };
    use crate::sse::{SseItem, SseScanner};
    use crate::{FailureClass, Phase};
    use NeutralEvent as E;

    // --- helpers ---------------------------------------------------------

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
    fn encode_all(events: &[NeutralEvent]) -> (BytesMut, StreamMemo) {
        let mut memo = StreamMemo::default();
        let mut out = BytesMut::new();
        for event in events {
            encode_event(event, &mut memo, &mut out);
        }
        (out, memo)
    }

    /// The `(event name, data)` of each frame of a written stream, checked
    /// as the SDKs read it: the name is the data's `type`, sequence
    /// numbers run from 0 by 1, an item's `output_index` is its position,
    /// every item added is done before the response completes, and no
    /// event reads as malformed or an error.
    fn frames(wire: &[u8]) -> Vec<(String, Value)> {
        let mut added = 0;
        let mut done = Vec::new();
        let mut out = Vec::new();
        for (sequence, event) in (0u64..).zip(sse_events(wire)) {
            let name = std::str::from_utf8(event.event().unwrap())
                .unwrap()
                .to_owned();
            let data: Value = serde_json::from_slice(event.data()).unwrap();
            assert_eq!(data["type"], name.as_str());
            assert_eq!(data["sequence_number"], sequence, "{name}");
            let kind = OpenAiResponses
                .inspect(&event, &mut ResponsesMemo::default())
                .kind;
            // An incomplete response with no output at all (the limit
            // reached before any) reads as a failure, as a provider's does.
            let outputless = name == "response.incomplete"
                && data["response"]["output"]
                    .as_array()
                    .is_some_and(Vec::is_empty);
            assert!(
                kind != ChunkKind::Malformed && (kind != ChunkKind::Error || outputless),
                "{name}: {data}"
            );
            match name.as_str() {
                "response.output_item.added" => {
                    assert_eq!(data["output_index"], added, "{data}");
                    added += 1;
                }
                "response.output_item.done" => done.push(data["output_index"].as_u64().unwrap()),
                "response.completed" | "response.incomplete" => {
                    done.sort_unstable();
                    assert_eq!(done, (0..added).collect::<Vec<u64>>(), "every item done");
                    let output = data["response"]["output"].as_array().unwrap();
                    assert_eq!(output.len() as u64, added, "the whole output");
                }
                _ => {}
            }
            out.push((name, data));
        }
        out
    }

    fn usage(input: u64, output: u64, cached: u64) -> Usage {
        let mut usage = Usage::new(input, output);
        usage.cached_input_tokens = cached;
        usage
    }

    fn start(id: &str, model: &str, created: i64) -> NeutralEvent {
        E::Start {
            id: id.to_owned(),
            model: model.to_owned(),
            created: Some(created),
        }
    }

    fn text(t: &str) -> NeutralEvent {
        E::Text(t.to_owned())
    }

    fn thinking(t: &str) -> NeutralEvent {
        E::Thinking(t.to_owned())
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

    // --- recorded streams decoded ----------------------------------------

    #[test]
    fn decodes_a_recorded_text_stream() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/translate/text.sse")),
            [
                start(
                    "resp_68c1f0a2b3d4e5f60718293a4b5c6d7e",
                    "gpt-4.1-2025-04-14",
                    1_757_540_002
                ),
                text("Hello"),
                text(" there"),
                text("! How can"),
                text(" I help?"),
                // `.done` events and the completed response repeat the text:
                // not read again.
                E::Usage(usage(1117, 9, 1024)),
                E::Finish(FinishReason::Stop),
                E::End,
            ]
        );
    }

    #[test]
    fn decodes_function_calls_with_streamed_arguments() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/translate/function_calls.sse")),
            [
                start(
                    "resp_68c1f1b0c1d2e3f405162738495a6b7c",
                    "gpt-4.1-2025-04-14",
                    1_757_540_272
                ),
                call_start(0, "call_qYxLm3Weather0", "get_weather"),
                args(0, "{\""),
                args(0, "city"),
                args(0, "\":\""),
                args(0, "Edinburgh"),
                args(0, "\"}"),
                E::ToolCallEnd { index: 0 },
                call_start(1, "call_2xjOStock01", "get_stock_price"),
                args(1, "{\"ticker\":"),
                args(1, "\"AAPL\"}"),
                E::ToolCallEnd { index: 1 },
                E::Usage(usage(149, 60, 0)),
                E::Finish(FinishReason::ToolCalls),
                E::End,
            ]
        );
    }

    #[test]
    fn decodes_a_reasoning_summary_then_text() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/translate/reasoning.sse")),
            [
                start(
                    "resp_68c1f2c0d1e2f3a4b5c6d7e8f9a0b1c2",
                    "o4-mini-2025-04-16",
                    1_757_540_544
                ),
                thinking("**Comparing decimals**\n\nCompare 9.11"),
                thinking(" and 9.8: 0.8 > 0.11."),
                // The second summary part is a new paragraph; the encrypted
                // content is the provider's own.
                thinking("\n\nSo 9.8"),
                thinking(" is larger."),
                text("9.8"),
                text(" is larger."),
                E::Usage(usage(18, 341, 0)),
                E::Finish(FinishReason::Stop),
                E::End,
            ]
        );
    }

    #[test]
    fn decodes_a_refusal_cut_by_the_output_limit() {
        assert_eq!(
            decode_all(include_bytes!("fixtures/translate/refusal_incomplete.sse")),
            [
                start(
                    "resp_68c1f3d0e1f2a3b4c5d6e7f8091a2b3c",
                    "gpt-4o-2024-08-06",
                    1_757_540_816
                ),
                E::Refusal("I'm sorry".to_owned()),
                E::Refusal(", but I can't".to_owned()),
                E::Refusal(" assist with that.".to_owned()),
                E::Usage(usage(17, 12, 0)),
                E::Finish(FinishReason::Length),
                E::End,
            ]
        );
    }

    #[test]
    fn the_dialects_recorded_streams_decode_whole() {
        // The streams the dialect's own tests classify, each piece joined.
        let head = start("resp_68a1", "gpt-5-2025-08-07", 1_756_000_000);
        let end = |output: u64, reason: FinishReason| {
            [E::Usage(usage(36, output, 12)), E::Finish(reason), E::End]
        };
        let cases: [(&[u8], Vec<NeutralEvent>); 4] = [
            (
                include_bytes!("fixtures/text.sse"),
                vec![text("Hello! How can I help?")],
            ),
            (
                include_bytes!("fixtures/function_call.sse"),
                vec![
                    call_start(0, "call_Ab12", "get_weather"),
                    args(0, "{\"city\":\"Paris\"}"),
                    E::ToolCallEnd { index: 0 },
                ],
            ),
            (
                include_bytes!("fixtures/reasoning.sse"),
                vec![thinking("**Thinking** about it."), text("42")],
            ),
            (
                include_bytes!("fixtures/refusal.sse"),
                vec![E::Refusal("I'm sorry, I can't help with that.".to_owned())],
            ),
        ];
        for (wire, body) in cases {
            let calls = body.iter().any(|e| matches!(e, E::ToolCallStart { .. }));
            let (output, reason) = if calls {
                (18, FinishReason::ToolCalls)
            } else {
                (9, FinishReason::Stop)
            };
            let mut expected = vec![head.clone()];
            expected.extend(body);
            expected.extend(end(output, reason));
            assert_eq!(joined(&decode_all(wire)), expected);
        }
        // A failed response is the commit machine's: the text before it,
        // no end.
        assert_eq!(
            joined(&decode_all(include_bytes!(
                "fixtures/failed_after_output.sse"
            ))),
            [head.clone(), text("Hello! How")]
        );
        assert_eq!(
            decode_all(include_bytes!("fixtures/failed_before_output.sse")),
            [head]
        );
    }

    #[test]
    fn whole_pieces_are_read_once_when_no_delta_gave_them() {
        // No `response.created`; a message given only by its `.done`
        // events; a reasoning item only by `output_item.done`; a call whose
        // arguments come whole; a hosted tool's item; a call announced only
        // by its arguments; an item only in the completed response; events
        // that carry nothing the neutral model has.
        let wire = concat!(
            "data: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"m0\",\"content\":[]}}\n\n",
            "data: {\"type\":\"response.output_text.done\",\"output_index\":0,\"item_id\":\"m0\",\"content_index\":0,\"text\":\"Whole\"}\n\n",
            "data: {\"type\":\"response.content_part.done\",\"output_index\":0,\"item_id\":\"m0\",\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"Whole\"}}\n\n",
            "data: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"m0\",\"content\":[{\"type\":\"output_text\",\"text\":\"Whole\"},{\"type\":\"refusal\",\"refusal\":\"no\"}]}}\n\n",
            "data: {\"type\":\"response.output_item.done\",\"output_index\":1,\"item\":{\"type\":\"reasoning\",\"id\":\"r1\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"a\"},{\"type\":\"summary_text\",\"text\":\"b\"}],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"raw\"}]}}\n\n",
            "data: {\"type\":\"response.output_item.added\",\"output_index\":2,\"item\":{\"type\":\"function_call\",\"id\":\"fc2\",\"call_id\":\"call_2\",\"name\":\"f\",\"arguments\":\"\"}}\n\n",
            "data: {\"type\":\"response.function_call_arguments.done\",\"output_index\":2,\"item_id\":\"fc2\",\"arguments\":\"{\\\"x\\\":1}\"}\n\n",
            "data: {\"type\":\"response.output_item.done\",\"output_index\":2,\"item\":{\"type\":\"function_call\",\"id\":\"fc2\",\"call_id\":\"call_2\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}\n\n",
            "data: {\"type\":\"response.output_item.added\",\"output_index\":3,\"item\":{\"type\":\"web_search_call\",\"id\":\"ws3\",\"status\":\"in_progress\"}}\n\n",
            "data: {\"type\":\"response.web_search_call.searching\",\"output_index\":3,\"item_id\":\"ws3\"}\n\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":4,\"item_id\":\"fc4\",\"delta\":\"{}\"}\n\n",
            "data: {\"type\":\"response.output_text.annotation.added\",\"output_index\":0,\"item_id\":\"m0\",\"annotation\":{}}\n\n",
            "data: {\"type\":\"response.future_event\",\"delta\":{\"x\":1}}\n\n",
            "event: error\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"err\"}\n\n",
            "data: {not json\n\n",
            ": keep-alive\n\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_x\",\"status\":\"completed\",\"output\":[",
            "{\"type\":\"message\",\"id\":\"m0\",\"content\":[{\"type\":\"output_text\",\"text\":\"Whole\"}]},",
            "{\"type\":\"function_call\",\"id\":\"fc5\",\"call_id\":\"call_5\",\"name\":\"g\",\"arguments\":\"\"}",
            "],\"usage\":{\"input_tokens\":3,\"output_tokens\":4}}}\n\n",
            "data: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"late\"}\n\n",
        );
        assert_eq!(
            decode_all(wire.as_bytes()),
            [
                E::Start {
                    id: String::new(),
                    model: String::new(),
                    created: None,
                },
                text("Whole"),
                E::Refusal("no".to_owned()),
                thinking("a"),
                thinking("\n\nb"),
                thinking("\n\nraw"),
                call_start(0, "call_2", "f"),
                args(0, "{\"x\":1}"),
                E::ToolCallEnd { index: 0 },
                call_start(1, "fc4", ""),
                args(1, "{}"),
                // Calls end before the finish; one without arguments gets `{}`.
                call_start(2, "call_5", "g"),
                args(2, "{}"),
                E::ToolCallEnd { index: 2 },
                E::ToolCallEnd { index: 1 },
                E::Usage(usage(3, 4, 0)),
                E::Finish(FinishReason::ToolCalls),
                // Nothing after the completed response counts.
                E::End,
            ]
        );
    }

    #[test]
    fn events_that_name_no_item_are_the_last_items() {
        let wire = concat!(
            "data: {\"type\":\"response.output_item.added\",\"item\":{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\"}}\n\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{\\\"a\\\":\"}\n\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"1}\"}\n\n",
            "data: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
            "data: {\"type\":\"response.output_text.delta\",\"delta\":\"b\"}\n\n",
        );
        assert_eq!(
            decode_all(wire.as_bytes()),
            [
                E::Start {
                    id: String::new(),
                    model: String::new(),
                    created: None,
                },
                call_start(0, "call_1", "f"),
                args(0, "{\"a\":"),
                args(0, "1}"),
                // Text that names no item is read as text all the same.
                text("a"),
                text("b"),
            ]
        );
    }

    #[test]
    fn incomplete_reasons_and_statuses_map_to_finish_reasons() {
        for (incomplete, reason, calls, finish) in [
            (false, None, false, FinishReason::Stop),
            (false, None, true, FinishReason::ToolCalls),
            (true, Some("max_output_tokens"), true, FinishReason::Length),
            (
                true,
                Some("content_filter"),
                false,
                FinishReason::ContentFilter,
            ),
            (
                true,
                Some("max_turns"),
                false,
                FinishReason::Other("max_turns".to_owned()),
            ),
            (
                true,
                None,
                false,
                FinishReason::Other("incomplete".to_owned()),
            ),
        ] {
            assert_eq!(read_finish(incomplete, reason, calls), finish);
        }
        for (finish, written) in [
            (None, ("completed", None)),
            (Some(FinishReason::Stop), ("completed", None)),
            (Some(FinishReason::StopSequence), ("completed", None)),
            (Some(FinishReason::ToolCalls), ("completed", None)),
            (
                Some(FinishReason::Other("pause_turn".to_owned())),
                ("completed", None),
            ),
            (
                Some(FinishReason::Length),
                ("incomplete", Some("max_output_tokens")),
            ),
            (
                Some(FinishReason::ContentFilter),
                ("incomplete", Some("content_filter")),
            ),
        ] {
            assert_eq!(write_finish(finish.as_ref()), written);
        }
    }

    // --- streams encoded -------------------------------------------------

    /// An answer with reasoning, text, a refusal, a tool call, usage.
    fn mixed_answer() -> Vec<NeutralEvent> {
        vec![
            start("chatcmpl-01A", "gpt-x", 1_700_000_000),
            thinking("hm"),
            // No place for a signature another provider wrote.
            E::ThinkingSignature("sig".to_owned()),
            E::RedactedThinking("enc".to_owned()),
            text("Hi \"you\"\n"),
            E::Refusal("no".to_owned()),
            call_start(0, "toolu_01", "get"),
            args(0, "{\"a\":"),
            args(0, "1}"),
            E::ToolCallEnd { index: 0 },
            E::Finish(FinishReason::ToolCalls),
            E::Usage(usage(10, 5, 4)),
            E::End,
        ]
    }

    #[test]
    fn neutral_events_encode_to_the_exact_events_the_sdks_read() {
        let (wire, memo) = encode_all(&mixed_answer());
        // Each event's data starts with its type and sequence number, as
        // OpenAI's do: reasoning, the message (a text part, then a refusal
        // part), the call, each item closed before the next kind opens,
        // the completed response with the whole output and usage.
        assert_eq!(
            std::str::from_utf8(&wire).unwrap(),
            include_str!("fixtures/translate/encoded_mixed.sse")
        );
        let frames = frames(&wire);
        let completed = &frames.last().unwrap().1["response"];
        assert_eq!(completed["output"][0]["summary"][0]["text"], "hm");
        assert_eq!(
            completed["output"][1]["content"],
            json!([
                {"type": "output_text", "text": "Hi \"you\"\n", "annotations": []},
                {"type": "refusal", "refusal": "no"}
            ])
        );
        assert_eq!(
            completed["output"][2]["call_id"], "call_01",
            "toolu_01 in this dialect's form"
        );
        assert_eq!(completed["output"][2]["arguments"], "{\"a\":1}");
        assert_eq!(
            completed["usage"],
            json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
                   "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15})
        );
        assert_eq!(memo.next_sequence(), 24);
        assert_eq!(
            memo.identity(),
            ChunkIdentity {
                id: Some(Cow::Borrowed("resp_01A")),
                model: Some(Cow::Borrowed("gpt-x")),
                created: Some(1_700_000_000),
            }
        );
        // Read back: the same answer, the signature and redacted reasoning
        // left out, usage before the finish.
        assert_eq!(
            decode_all(&wire),
            [
                start("resp_01A", "gpt-x", 1_700_000_000),
                thinking("hm"),
                text("Hi \"you\"\n"),
                E::Refusal("no".to_owned()),
                call_start(0, "call_01", "get"),
                args(0, "{\"a\":"),
                args(0, "1}"),
                E::ToolCallEnd { index: 0 },
                E::Usage(usage(10, 5, 4)),
                E::Finish(FinishReason::ToolCalls),
                E::End,
            ]
        );
    }

    #[test]
    fn output_events_commit_and_the_completed_response_ends_the_stream() {
        let (wire, _) = encode_all(&mixed_answer());
        let kinds: Vec<ChunkKind> = sse_events(&wire)
            .iter()
            .map(|e| {
                OpenAiResponses
                    .inspect(e, &mut ResponsesMemo::default())
                    .kind
            })
            .collect();
        use ChunkKind::{Done, Output, Preamble};
        assert_eq!(
            kinds,
            [
                Preamble, Preamble, Preamble, Preamble, Output, Output, Output, Output, Preamble,
                Preamble, Output, Output, Output, Preamble, Output, Output, Output, Output, Output,
                Output, Output, Output, Output, Done
            ]
        );
    }

    #[test]
    fn interleaved_calls_stay_open_and_text_between_them_is_its_own_item() {
        let (wire, _) = encode_all(&[
            start("resp_7", "m", 7),
            call_start(0, "call_a", "f"),
            call_start(1, "call_b", "g"),
            args(0, "{\"x\":"),
            text("while calling"),
            args(1, "{}"),
            args(0, "1}"),
            // Arguments of a call that never began, an end of one that is
            // not open, and an empty piece: nothing.
            args(5, "{}"),
            E::ToolCallEnd { index: 9 },
            text(""),
            thinking(""),
            E::Finish(FinishReason::ToolCalls),
            E::End,
            // Nothing after the end.
            text("late"),
            E::End,
        ]);
        let frames = frames(&wire);
        let names: Vec<(&str, Option<u64>)> = frames
            .iter()
            .map(|(n, d)| (n.as_str(), d["output_index"].as_u64()))
            .collect();
        assert_eq!(
            names,
            [
                ("response.created", None),
                ("response.in_progress", None),
                ("response.output_item.added", Some(0)),
                ("response.output_item.added", Some(1)),
                ("response.function_call_arguments.delta", Some(0)),
                ("response.output_item.added", Some(2)),
                ("response.content_part.added", Some(2)),
                ("response.output_text.delta", Some(2)),
                ("response.function_call_arguments.delta", Some(1)),
                ("response.function_call_arguments.delta", Some(0)),
                // The finish closes the open message, then each call in order.
                ("response.output_text.done", Some(2)),
                ("response.content_part.done", Some(2)),
                ("response.output_item.done", Some(2)),
                ("response.function_call_arguments.done", Some(0)),
                ("response.output_item.done", Some(0)),
                ("response.function_call_arguments.done", Some(1)),
                ("response.output_item.done", Some(1)),
                ("response.completed", None),
            ]
        );
        let output = &frames.last().unwrap().1["response"]["output"];
        assert_eq!(output[0]["arguments"], "{\"x\":1}");
        assert_eq!(output[1]["arguments"], "{}");
        assert_eq!(output[2]["content"][0]["text"], "while calling");
        assert_eq!(frames.last().unwrap().1["response"]["usage"], Value::Null);
    }

    #[test]
    fn the_output_limit_and_a_filter_end_in_an_incomplete_response() {
        for (reason, written) in [
            (FinishReason::Length, "max_output_tokens"),
            (FinishReason::ContentFilter, "content_filter"),
        ] {
            let (wire, _) = encode_all(&[
                start("msg_1", "claude", 1),
                text("Cut"),
                E::Usage(usage(3, 1, 0)),
                E::Finish(reason.clone()),
                E::End,
            ]);
            let frames = frames(&wire);
            let (name, last) = frames.last().unwrap();
            assert_eq!(name, "response.incomplete");
            assert_eq!(last["response"]["id"], "resp_1");
            assert_eq!(last["response"]["status"], "incomplete");
            assert_eq!(
                last["response"]["incomplete_details"],
                json!({"reason": written})
            );
            assert_eq!(last["response"]["output"][0]["content"][0]["text"], "Cut");
            let decoded = decode_all(&wire);
            assert_eq!(decoded[decoded.len() - 2], E::Finish(reason));
        }
    }

    #[test]
    fn content_before_a_start_opens_a_gateway_response() {
        let (wire, memo) = encode_all(&[
            text("early"),
            // A start after content changes nothing.
            start("chatcmpl-late", "m", 5),
            call_start(0, "", "f"),
            E::End,
        ]);
        assert_eq!(memo.identity().id.as_deref(), Some(GATEWAY_ID));
        assert_eq!(memo.identity().model.as_deref(), Some(""));
        assert!(memo.identity().created.is_some_and(|c| c > 1_700_000_000));
        let frames = frames(&wire);
        assert!(!String::from_utf8_lossy(&wire).contains("chatcmpl-late"));
        // A call without an id gets one its answer can name.
        let call = &frames.last().unwrap().1["response"]["output"][1];
        assert_eq!(call["call_id"], "call_gateway_1");
        assert_eq!(call["id"], "fc_gateway_1");
        assert_eq!(StreamMemo::default().identity(), ChunkIdentity::default());
        // An id of no known dialect (DeepSeek's) takes this dialect's prefix.
        let (_, memo) = encode_all(&[start("0f2c6e1a-5b7d", "m", 1)]);
        assert_eq!(memo.identity().id.as_deref(), Some("resp_0f2c6e1a-5b7d"));
        assert_eq!(StreamMemo::default().next_sequence(), 0);
        // The end with nothing before it is still a whole stream.
        let (wire, _) = encode_all(&[E::End]);
        let names: Vec<String> = frames_names(&wire);
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.completed"
            ]
        );
    }

    fn frames_names(wire: &[u8]) -> Vec<String> {
        frames(wire).into_iter().map(|(name, _)| name).collect()
    }

    #[test]
    fn a_failed_translated_stream_ends_in_its_own_identity_and_sequence() {
        let dialect = OpenAiResponses;
        let mut memo = ResponsesMemo::default();
        let mut out = BytesMut::new();
        for event in [start("msg_9", "claude", 9), text("Hel")] {
            dialect.encode_event(&event, &mut memo, &mut out);
        }
        let identity = dialect.encoded_identity(&memo);
        assert_eq!(identity.id.as_deref(), Some("resp_9"));
        let error = TerminalError::new(FailureClass::Overloaded, Phase::Committed, "overloaded");
        let terminal =
            dialect.stream_terminal(&memo, &identity, "error", &error, TerminalMode::Raise);
        out.extend_from_slice(&terminal);
        let events = sse_events(&out);
        let datas: Vec<Value> = events
            .iter()
            .map(|e| serde_json::from_slice(e.data()).unwrap())
            .collect();
        for (sequence, data) in (0u64..).zip(&datas) {
            assert_eq!(data["sequence_number"], sequence, "{data}");
        }
        let failed = &datas[datas.len() - 2];
        assert_eq!(failed["type"], "response.failed");
        assert_eq!(failed["response"]["id"], "resp_9", "the same response");
        assert_eq!(failed["response"]["created_at"], 9);
    }

    // --- whole answers ---------------------------------------------------

    const ANSWER: &str = r#"{"id":"resp_01Ans","object":"response","created_at":1757541000,"status":"completed","model":"o4-mini","output":[
        {"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"Think."}],"encrypted_content":"gAAAA"},
        {"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Calling.","annotations":[{"type":"url_citation","url":"https://x"}]}]},
        {"id":"ws_1","type":"web_search_call","status":"completed"},
        {"id":"fc_1","type":"function_call","status":"completed","call_id":"call_01A","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
        {"id":"fc_2","type":"function_call","status":"completed","call_id":"call_01B","name":"get_time","arguments":""}
    ],"usage":{"input_tokens":115,"input_tokens_details":{"cached_tokens":100},"output_tokens":42,"output_tokens_details":{"reasoning_tokens":20},"total_tokens":157},
    "parallel_tool_calls":true,"tool_choice":"auto","tools":[],"error":null,"incomplete_details":null}"#;

    #[test]
    fn whole_responses_decode_as_their_streams_would() {
        assert_eq!(
            decode_answer(ANSWER.as_bytes()).unwrap(),
            [
                start("resp_01Ans", "o4-mini", 1_757_541_000),
                thinking("Think."),
                text("Calling."),
                call_start(0, "call_01A", "get_weather"),
                args(0, "{\"city\":\"Paris\"}"),
                E::ToolCallEnd { index: 0 },
                call_start(1, "call_01B", "get_time"),
                args(1, "{}"),
                E::ToolCallEnd { index: 1 },
                E::Usage(usage(115, 42, 100)),
                E::Finish(FinishReason::ToolCalls),
                E::End,
            ]
        );
        // A recorded stream and the response it completes with agree.
        for wire in [
            &include_bytes!("fixtures/translate/text.sse")[..],
            include_bytes!("fixtures/translate/function_calls.sse"),
            include_bytes!("fixtures/translate/reasoning.sse"),
            include_bytes!("fixtures/translate/refusal_incomplete.sse"),
        ] {
            let last = sse_events(wire).pop().unwrap();
            let data: Value = serde_json::from_slice(last.data()).unwrap();
            let whole = decode_answer(data["response"].to_string().as_bytes()).unwrap();
            assert_eq!(joined(&decode_all(wire)), joined(&whole));
        }
        let incomplete = r#"{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[]}"#;
        assert_eq!(
            decode_answer(incomplete.as_bytes()).unwrap(),
            [
                E::Start {
                    id: String::new(),
                    model: String::new(),
                    created: None
                },
                E::Finish(FinishReason::Length),
                E::End
            ]
        );
        for bad in [
            &b"not json"[..],
            b"[]",
            b"{\"status\":\"completed\"}",
            b"{\"object\":\"chat.completion\",\"output\":[]}",
            b"{\"output\":{}}",
        ] {
            assert_eq!(decode_answer(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    /// Adjacent pieces of one kind joined, as a whole answer holds them.
    fn joined(events: &[NeutralEvent]) -> Vec<NeutralEvent> {
        let mut out: Vec<NeutralEvent> = Vec::new();
        for event in events {
            match (out.last_mut(), event) {
                (Some(E::Text(a)), E::Text(b))
                | (Some(E::Thinking(a)), E::Thinking(b))
                | (Some(E::Refusal(a)), E::Refusal(b)) => a.push_str(b),
                (
                    Some(E::ToolCallArguments { index: i, delta: a }),
                    E::ToolCallArguments { index: j, delta: b },
                ) if i == j => a.push_str(b),
                (_, event) => out.push(event.clone()),
            }
        }
        out
    }

    #[test]
    fn encoded_answers_are_valid_responses() {
        let body = encode_answer(&mixed_answer()).unwrap();
        let json: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            json!({
                "id": "resp_01A", "object": "response", "created_at": 1_700_000_000,
                "status": "completed", "model": "gpt-x",
                "output": [
                    {"type": "reasoning", "id": "rs_01A_0", "summary": [{"type": "summary_text", "text": "hm"}]},
                    {"type": "message", "id": "msg_01A_1", "status": "completed", "role": "assistant", "content": [
                        {"type": "output_text", "text": "Hi \"you\"\n", "annotations": []},
                        {"type": "refusal", "refusal": "no"},
                    ]},
                    {"type": "function_call", "id": "fc_01A_2", "call_id": "call_01", "name": "get",
                     "arguments": "{\"a\":1}", "status": "completed"},
                ],
                "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
                          "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15},
                "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
                "error": null, "incomplete_details": null,
            })
        );
        let (check, facts) = OpenAiResponses.check_answer(&body);
        assert_eq!(
            check,
            BodyCheck::Valid {
                usage: Some(usage(10, 5, 4)),
                model: Some("gpt-x".to_owned()),
            }
        );
        assert_eq!(facts.id.as_deref(), Some("resp_01A"));
        assert_eq!(facts.finish_reason.as_deref(), Some("completed"));
        // The same response the stream completes with.
        let (wire, _) = encode_all(&mixed_answer());
        let completed = sse_events(&wire).pop().unwrap();
        let completed: Value = serde_json::from_slice(completed.data()).unwrap();
        assert_eq!(completed["response"], json);

        // Nothing at all is still a valid (empty) response.
        let empty = encode_answer(&[]).unwrap();
        assert!(matches!(
            OpenAiResponses.check_answer(&empty).0,
            BodyCheck::Valid { .. }
        ));
        let empty: Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(
            (&empty["id"], &empty["usage"]),
            (&json!(GATEWAY_ID), &Value::Null)
        );
        // The output limit: incomplete, and still an answer with its output.
        let cut = encode_answer(&[
            start("chatcmpl-c", "m", 1),
            text("Cu"),
            E::Finish(FinishReason::Length),
        ])
        .unwrap();
        let (check, facts) = OpenAiResponses.check_answer(&cut);
        assert!(matches!(check, BodyCheck::Valid { .. }));
        assert_eq!(facts.finish_reason.as_deref(), Some("max_output_tokens"));
    }

    // --- requests --------------------------------------------------------

    fn read(body: &Value) -> ResponsesRequest {
        request::read(Bytes::from(body.to_string())).unwrap().1
    }

    fn neutral(body: &Value) -> Result<NeutralRequest, String> {
        to_neutral(&read(body))
    }

    fn texts(texts: &[&str]) -> Vec<Part> {
        texts.iter().map(|t| Part::Text((*t).to_owned())).collect()
    }

    /// A request as an agent sends it: instructions, history with images,
    /// files, reasoning, function calls and their outputs, and fields that
    /// are hints.
    fn agent_request() -> Value {
        json!({
            "model": "gpt-5",
            "instructions": "You are a coding agent.",
            "input": [
                {"type": "message", "role": "developer", "content": "Use tools."},
                {"role": "user", "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": "https://x/a.png", "detail": "low"},
                    {"type": "input_file", "file_data": "data:application/pdf;base64,QQ==", "filename": "a.pdf"},
                    {"type": "input_file", "file_url": "https://x/b.pdf"},
                    {"type": "input_file", "file_data": "SGk=", "filename": "notes.txt"}
                ]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look first."}],
                 "encrypted_content": "gAAAA"},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [
                    {"type": "output_text", "text": "Looking.", "annotations": []}
                ]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "look", "arguments": "{}"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "look", "arguments": "{\"x\":1}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "a cat"},
                {"type": "function_call_output", "call_id": "call_2", "output": [
                    {"type": "input_text", "text": "a dog"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA=="}
                ]},
                {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
                {"role": "system", "content": [{"type": "input_text", "text": "Be brief."}]},
                {"role": "user", "content": "And now?"}
            ],
            "tools": [
                {"type": "function", "name": "look", "description": "Looks.",
                 "parameters": {"type": "object"}, "strict": true},
                {"type": "function", "name": "noop", "parameters": null}
            ],
            "tool_choice": {"type": "function", "name": "look"},
            "parallel_tool_calls": false,
            "max_output_tokens": 100,
            "temperature": 0.5, "top_p": 0.9,
            "reasoning": {"effort": "low", "summary": "auto"},
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": true},
                     "verbosity": "low"},
            "safety_identifier": "u-1",
            "metadata": {"k": "v"},
            "stream": true, "stream_options": {"include_obfuscation": false},
            "store": true, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "k", "prompt_cache_retention": "24h", "service_tier": "flex",
            "truncation": "auto", "background": false, "max_tool_calls": 3,
            "previous_response_id": null, "conversation": null,
            "some_future_field": {"x": 1}
        })
    }

    #[test]
    fn reads_what_an_agent_sends() {
        let expected = NeutralRequest {
            model: "gpt-5".to_owned(),
            messages: vec![
                Message::System(texts(&["You are a coding agent."])),
                Message::Developer(texts(&["Use tools."])),
                Message::User(vec![
                    Part::Text("What is this?".to_owned()),
                    Part::Image("https://x/a.png".to_owned()),
                    Part::Document {
                        url: "data:application/pdf;base64,QQ==".to_owned(),
                        name: Some("a.pdf".to_owned()),
                    },
                    Part::Document {
                        url: "https://x/b.pdf".to_owned(),
                        name: None,
                    },
                    Part::Document {
                        url: "data:text/plain;base64,SGk=".to_owned(),
                        name: Some("notes.txt".to_owned()),
                    },
                ]),
                // The turn's reasoning, message and calls are one message.
                Message::Assistant(vec![
                    Part::Thinking {
                        text: "Look first.".to_owned(),
                        signature: None,
                    },
                    Part::Text("Looking.".to_owned()),
                    Part::ToolCall {
                        id: "call_1".to_owned(),
                        name: "look".to_owned(),
                        arguments: "{}".to_owned(),
                    },
                    Part::ToolCall {
                        id: "call_2".to_owned(),
                        name: "look".to_owned(),
                        arguments: "{\"x\":1}".to_owned(),
                    },
                ]),
                Message::Tool {
                    call_id: "call_1".to_owned(),
                    content: texts(&["a cat"]),
                    is_error: false,
                },
                Message::Tool {
                    call_id: "call_2".to_owned(),
                    content: vec![
                        Part::Text("a dog".to_owned()),
                        Part::Image("data:image/png;base64,AA==".to_owned()),
                    ],
                    is_error: false,
                },
                Message::Assistant(vec![Part::Refusal("No.".to_owned())]),
                Message::System(texts(&["Be brief."])),
                Message::User(texts(&["And now?"])),
            ],
            tools: vec![
                ToolSpec {
                    name: "look".to_owned(),
                    description: Some("Looks.".to_owned()),
                    parameters: json!({"type": "object"}),
                    strict: Some(true),
                },
                ToolSpec {
                    name: "noop".to_owned(),
                    description: None,
                    parameters: Value::Null,
                    strict: None,
                },
            ],
            tool_choice: Some(ToolChoice::Named("look".to_owned())),
            parallel_tool_calls: Some(false),
            max_output_tokens: Some(100),
            temperature: Some(0.5),
            top_p: Some(0.9),
            stop: Vec::new(),
            response_format: Some(ResponseFormat::JsonSchema),
            json_schema: Some(json!({"name": "s", "schema": {"type": "object"}, "strict": true})),
            reasoning_effort: Some("low".to_owned()),
            thinking_budget: None,
            user: Some("u-1".to_owned()),
            metadata: Some(json!({"k": "v"})),
            stream: true,
            include_usage: true,
            choices: 1,
            logprobs: false,
            audio: false,
        };
        assert_eq!(neutral(&agent_request()).unwrap(), expected);
    }

    #[test]
    fn reads_short_forms_choices_formats_and_logprobs() {
        let base = |extra: Value| {
            let mut body = json!({"model": "m", "input": "hi"});
            for (key, value) in extra.as_object().unwrap() {
                body[key] = value.clone();
            }
            neutral(&body).unwrap()
        };
        let plain = base(json!({}));
        assert_eq!(plain.messages, [Message::User(texts(&["hi"]))]);
        assert!(!plain.stream && !plain.include_usage && !plain.logprobs);
        assert_eq!(
            (plain.choices, plain.tool_choice, plain.user),
            (1, None, None)
        );
        // An empty input and empty instructions are no text.
        let empty = base(json!({"input": "", "instructions": ""}));
        assert_eq!(empty.messages, [Message::User(Vec::new())]);
        for (choice, expected) in [
            (json!("auto"), ToolChoice::Auto),
            (json!("none"), ToolChoice::None),
            (json!("required"), ToolChoice::Required),
            (
                json!({"type": "function", "name": "f"}),
                ToolChoice::Named("f".to_owned()),
            ),
        ] {
            assert_eq!(
                base(json!({"tool_choice": choice})).tool_choice,
                Some(expected)
            );
        }
        assert_eq!(
            base(json!({"text": {"format": {"type": "json_object"}}})).response_format,
            Some(ResponseFormat::JsonObject)
        );
        let text = base(json!({"text": {"format": {"type": "text"}}}));
        assert_eq!((text.response_format, text.json_schema), (None, None));
        assert!(base(json!({"top_logprobs": 2})).logprobs);
        assert!(!base(json!({"top_logprobs": 0})).logprobs);
        assert!(base(json!({"include": ["message.output_text.logprobs"]})).logprobs);
        assert_eq!(
            base(json!({"user": "a", "safety_identifier": "b"}))
                .user
                .as_deref(),
            Some("a")
        );
        assert_eq!(
            base(json!({"reasoning": {"summary": "auto"}})).reasoning_effort,
            None
        );
        // Instructions given as items (a prompt's).
        let items = base(json!({"instructions": [{"role": "developer", "content": "d"}]}));
        assert_eq!(
            items.messages,
            [
                Message::Developer(texts(&["d"])),
                Message::User(texts(&["hi"]))
            ]
        );
        // A reasoning item with nothing readable adds nothing; a function
        // call after a user message starts the model's turn.
        let history = base(json!({"input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
            {"type": "function_call", "call_id": "call_9", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_9", "output": ""},
            {"role": "assistant", "content": ""}
        ]}));
        assert_eq!(
            history.messages,
            [
                Message::User(texts(&["q"])),
                Message::Assistant(vec![Part::ToolCall {
                    id: "call_9".to_owned(),
                    name: "f".to_owned(),
                    arguments: "{}".to_owned(),
                }]),
                Message::Tool {
                    call_id: "call_9".to_owned(),
                    content: Vec::new(),
                    is_error: false,
                },
                Message::Assistant(Vec::new()),
            ]
        );
    }

    /// Why a request with `value` as its `key` is not translated.
    fn refusal_with(key: &str, value: Value) -> Option<String> {
        let mut body = json!({"model": "m", "input": "hi"});
        body[key] = value;
        neutral(&body).err()
    }

    #[test]
    fn hosted_and_custom_tools_are_refused_by_name() {
        let with = refusal_with;
        let cases = [
            (
                with("tools", json!([{"type": "web_search"}])),
                "the provider-hosted tool web_search",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "function", "name": "f"}, {"type": "file_search", "vector_store_ids": ["vs_1"]}]),
                ),
                "the provider-hosted tool file_search",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "code_interpreter", "container": {"type": "auto"}}]),
                ),
                "the provider-hosted tool code_interpreter",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "mcp", "server_label": "x", "server_url": "https://mcp"}]),
                ),
                "the provider-hosted tool mcp",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "custom", "name": "grep", "format": {"type": "text"}}]),
                ),
                "the custom tool grep",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "function", "description": "no name"}]),
                ),
                "a tool without a name",
            ),
        ];
        for (got, reason) in cases {
            assert_eq!(got.as_deref(), Some(reason));
        }
    }

    #[test]
    fn refuses_what_the_neutral_model_cannot_carry_by_name() {
        let with = refusal_with;
        let item = |item: Value| with("input", json!([item]));
        let part = |part: Value| item(json!({"role": "user", "content": [part]}));
        let cases = [
            (
                item(json!({"type": "item_reference", "id": "msg_42"})),
                "item_reference msg_42 (a provider-held item)",
            ),
            (
                part(json!({"type": "input_image", "file_id": "file-1", "detail": "auto"})),
                "input_image file_id (a file the provider holds)",
            ),
            (
                part(json!({"type": "input_file", "file_id": "file-2"})),
                "input_file file_id (a file the provider holds)",
            ),
            (
                part(json!({"type": "input_audio"})),
                "content part input_audio",
            ),
            (
                item(json!({"type": "web_search_call", "id": "ws_1", "status": "completed"})),
                "input item web_search_call",
            ),
            (
                item(
                    json!({"type": "custom_tool_call", "call_id": "c", "name": "grep", "input": "x"}),
                ),
                "input item custom_tool_call",
            ),
            (
                item(json!({"role": "narrator", "content": "x"})),
                "message role narrator",
            ),
            (
                with(
                    "tool_choice",
                    json!({"type": "allowed_tools", "mode": "auto", "tools": []}),
                ),
                "tool_choice allowed_tools",
            ),
            (
                with("tool_choice", json!({"type": "web_search_preview"})),
                "tool_choice web_search_preview",
            ),
            (
                with("tool_choice", json!("sometimes")),
                "tool_choice sometimes",
            ),
            (
                with("text", json!({"format": {"type": "grammar"}})),
                "text.format grammar",
            ),
            (
                with("prompt", json!({"id": "pmpt_1", "version": "2"})),
                "prompt (a template the provider holds)",
            ),
        ];
        for (got, reason) in cases {
            assert_eq!(got.as_deref(), Some(reason));
        }
    }

    #[test]
    fn hints_and_provider_state_fields_are_not_reasons_to_refuse() {
        let with = refusal_with;
        for (key, value) in [
            ("store", json!(true)),
            (
                "include",
                json!(["reasoning.encrypted_content", "web_search_call.results"]),
            ),
            ("prompt_cache_key", json!("k")),
            ("previous_response_id", json!("resp_1")),
            ("conversation", json!("conv_1")),
            ("background", json!(true)),
            ("truncation", json!("auto")),
            ("service_tier", json!("priority")),
            ("made_up", json!([1, 2])),
            ("prompt", Value::Null),
        ] {
            assert_eq!(with(key, value), None, "{key}");
        }
    }

    /// What a chat client's (or a Messages client's) request reads as.
    fn chat_request() -> NeutralRequest {
        NeutralRequest {
            model: "claude-x".to_owned(),
            messages: vec![
                Message::System(texts(&["Be brief."])),
                Message::Developer(texts(&["Use tools.", "Really."])),
                Message::User(vec![
                    Part::Text("Read.".to_owned()),
                    Part::Image("data:image/png;base64,AA==".to_owned()),
                    Part::Document {
                        url: "data:application/pdf;base64,QQ==".to_owned(),
                        name: Some("a.pdf".to_owned()),
                    },
                    Part::Document {
                        url: "https://x/b.pdf".to_owned(),
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
                    Part::Refusal("Not that.".to_owned()),
                ]),
                Message::Tool {
                    call_id: "toolu_01".to_owned(),
                    content: texts(&["fail"]),
                    is_error: true,
                },
                Message::Tool {
                    call_id: "D681PevKs".to_owned(),
                    content: vec![
                        Part::Text("shot".to_owned()),
                        Part::Image("https://x/s.png".to_owned()),
                    ],
                    is_error: false,
                },
                Message::Assistant(vec![Part::Thinking {
                    text: "only".to_owned(),
                    signature: None,
                }]),
                Message::User(Vec::new()),
            ],
            tools: vec![
                ToolSpec {
                    name: "read".to_owned(),
                    description: Some("Reads.".to_owned()),
                    parameters: json!({"type": "object"}),
                    strict: None,
                },
                ToolSpec {
                    name: "strict".to_owned(),
                    description: None,
                    parameters: Value::Null,
                    strict: Some(true),
                },
            ],
            tool_choice: Some(ToolChoice::Required),
            parallel_tool_calls: Some(true),
            max_output_tokens: Some(1024),
            temperature: Some(1.0),
            top_p: Some(0.5),
            stop: vec![String::new()],
            response_format: Some(ResponseFormat::JsonObject),
            json_schema: None,
            reasoning_effort: None,
            thinking_budget: Some(4096),
            user: Some("u".to_owned()),
            metadata: Some(json!({"k": "v"})),
            stream: true,
            include_usage: false,
            choices: 1,
            logprobs: false,
            audio: false,
        }
    }

    fn body_of(request: &NeutralRequest) -> Value {
        serde_json::from_slice(&body_from_neutral(request, "gpt-target").unwrap()).unwrap()
    }

    #[test]
    fn a_neutral_request_writes_a_responses_body() {
        let body = body_from_neutral(&chat_request(), "gpt-target").unwrap();
        let expected = json!({
            "model": "gpt-target",
            "input": [
                {"type": "message", "role": "system", "content": "Be brief."},
                {"type": "message", "role": "developer", "content": [
                    {"type": "input_text", "text": "Use tools."},
                    {"type": "input_text", "text": "Really."}
                ]},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "Read."},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "auto"},
                    {"type": "input_file", "file_data": "data:application/pdf;base64,QQ==", "filename": "a.pdf"},
                    {"type": "input_file", "file_url": "https://x/b.pdf"}
                ]},
                // Reasoning dropped; text runs around the call are messages.
                {"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "Reading"},
                    {"type": "output_text", "text": " it."}
                ]},
                {"type": "function_call", "call_id": "call_01", "name": "read", "arguments": "{}"},
                {"type": "message", "role": "assistant", "content": [
                    {"type": "refusal", "refusal": "Not that."}
                ]},
                {"type": "function_call_output", "call_id": "call_01", "output": "fail"},
                {"type": "function_call_output", "call_id": "D681PevKs", "output": [
                    {"type": "input_text", "text": "shot"},
                    {"type": "input_image", "image_url": "https://x/s.png", "detail": "auto"}
                ]},
                {"type": "message", "role": "assistant", "content": ""},
                {"type": "message", "role": "user", "content": ""}
            ],
            "tools": [
                {"type": "function", "name": "read", "description": "Reads.",
                 "parameters": {"type": "object"}, "strict": false},
                {"type": "function", "name": "strict", "parameters": null, "strict": true}
            ],
            "tool_choice": "required",
            "parallel_tool_calls": true,
            "max_output_tokens": 1024,
            "temperature": 1.0,
            "top_p": 0.5,
            "text": {"format": {"type": "json_object"}},
            "reasoning": {"effort": "medium"},
            "user": "u",
            "metadata": {"k": "v"},
            "stream": true,
            "store": false
        });
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), expected);
        // A body the dialect reads as a request, a stream that reports usage.
        let (requirements, _) = request::read(body).unwrap();
        assert!(requirements.stream && requirements.include_usage && !requirements.store);
    }

    #[test]
    fn limits_schemas_efforts_and_choices_take_the_responses_form() {
        let mut request = chat_request();
        request.max_output_tokens = Some(1);
        request.response_format = Some(ResponseFormat::JsonSchema);
        request.json_schema = Some(
            json!({"name": "s", "schema": {"type": "object"}, "strict": true, "description": "d"}),
        );
        request.reasoning_effort = Some("high".to_owned());
        request.tool_choice = Some(ToolChoice::Named("read".to_owned()));
        request.stream = false;
        let body = body_of(&request);
        assert_eq!(body["max_output_tokens"], 16, "the API's least");
        assert_eq!(
            body["text"],
            json!({"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": true, "description": "d"}})
        );
        assert_eq!(body["reasoning"], json!({"effort": "high"}));
        assert_eq!(
            body["tool_choice"],
            json!({"type": "function", "name": "read"})
        );
        assert_eq!(body.get("stream"), None);
        for (budget, effort) in [
            (0, "medium"),
            (1024, "low"),
            (2048, "low"),
            (2049, "medium"),
            (32_000, "high"),
        ] {
            assert_eq!(effort_of_budget(budget), effort, "{budget}");
        }
        // tool_choice and parallel_tool_calls only with tools.
        request.tools.clear();
        let body = body_of(&request);
        assert_eq!(
            (
                body.get("tools"),
                body.get("tool_choice"),
                body.get("parallel_tool_calls")
            ),
            (None, None, None)
        );
    }

    #[test]
    fn what_responses_cannot_express_is_refused_by_name() {
        type Change = fn(&mut NeutralRequest);
        let refused = |change: Change| {
            let mut request = chat_request();
            change(&mut request);
            body_from_neutral(&request, "gpt-target").err()
        };
        let cases: [(Change, &str); 10] = [
            (|r| r.choices = 2, "n > 1"),
            (|r| r.stop = vec!["END".to_owned()], "stop sequences"),
            (|r| r.logprobs = true, "logprobs"),
            (|r| r.audio = true, "audio"),
            (
                |r| r.response_format = Some(ResponseFormat::JsonSchema),
                "json_schema without a schema",
            ),
            (
                |r| r.messages = vec![Message::System(vec![Part::Image("https://x".to_owned())])],
                "an image in a system message",
            ),
            (
                |r| r.messages = vec![Message::Developer(vec![Part::Refusal("x".to_owned())])],
                "a refusal in a developer message",
            ),
            (
                |r| {
                    r.messages = vec![Message::Assistant(vec![Part::Image(
                        "https://x".to_owned(),
                    )])]
                },
                "an image in an assistant message",
            ),
            (
                |r| {
                    r.messages = vec![Message::User(vec![
                        Part::Text("a".to_owned()),
                        Part::Refusal("b".to_owned()),
                    ])]
                },
                "a refusal in a user message",
            ),
            (
                |r| {
                    r.messages = vec![Message::Tool {
                        call_id: "c".to_owned(),
                        content: vec![
                            Part::Text("a".to_owned()),
                            Part::ToolCall {
                                id: "x".to_owned(),
                                name: "f".to_owned(),
                                arguments: String::new(),
                            },
                        ],
                        is_error: false,
                    }]
                },
                "a tool call in a tool result",
            ),
        ];
        for (change, reason) in cases {
            assert_eq!(refused(change).as_deref(), Some(reason));
        }
    }

    /// Round trips over what the Responses API can express.
    mod round_trip {
        use proptest::collection::vec;
        use proptest::prelude::*;
        use proptest::test_runner::{Config, FileFailurePersistence};

        use super::*;

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

        fn media_part() -> impl Strategy<Value = Part> {
            prop_oneof![
                any_text().prop_map(Part::Text),
                "[a-z]{1,5}".prop_map(|p| Part::Image(format!("https://x/{p}.png"))),
                "[A-Za-z0-9]{1,6}".prop_map(|d| Part::Image(format!("data:image/png;base64,{d}"))),
                ("[A-Za-z0-9]{1,6}", prop::option::of("[a-z]{1,5}\\.pdf")).prop_map(|(d, name)| {
                    Part::Document {
                        url: format!("data:application/pdf;base64,{d}"),
                        name,
                    }
                }),
                ("[a-z]{1,5}", prop::option::of("[a-z]{1,5}\\.pdf")).prop_map(|(p, name)| {
                    Part::Document {
                        url: format!("https://x/{p}.pdf"),
                        name,
                    }
                }),
            ]
        }

        /// An assistant turn: text, refusals and calls in any order (its
        /// reasoning is not written back).
        fn assistant() -> impl Strategy<Value = Message> {
            let part = prop_oneof![
                any_text().prop_map(Part::Text),
                any_text().prop_map(Part::Refusal),
                (call_id(), "[a-z_]{1,6}", "[{}\":a-z0-9]{0,8}").prop_map(
                    |(id, name, arguments)| Part::ToolCall {
                        id,
                        name,
                        arguments,
                    }
                ),
            ];
            vec(part, 0..4).prop_map(Message::Assistant)
        }

        fn message() -> impl Strategy<Value = Message> {
            let texts = || vec(any_text().prop_map(Part::Text), 0..3);
            prop_oneof![
                texts().prop_map(Message::System),
                texts().prop_map(Message::Developer),
                vec(media_part(), 0..3).prop_map(Message::User),
                assistant(),
                (call_id(), vec(media_part(), 0..3)).prop_map(|(call_id, content)| {
                    Message::Tool {
                        call_id,
                        content,
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
                any::<bool>(),
            )
                .prop_map(|(name, description, parameters, strict)| ToolSpec {
                    name,
                    description,
                    parameters,
                    strict: Some(strict),
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

        /// Two assistant messages in a row are one turn of the model's:
        /// read back as one.
        fn no_adjacent_assistants(messages: Vec<Message>) -> Vec<Message> {
            let mut out: Vec<Message> = Vec::new();
            for message in messages {
                let both = matches!(
                    (out.last(), &message),
                    (Some(Message::Assistant(_)), Message::Assistant(_))
                );
                if !both {
                    out.push(message);
                }
            }
            out
        }

        /// Requests the Responses API can express, in the form it reads
        /// them back: no two assistant messages in a row (one turn), tools
        /// with `strict` said (absent is written `false`), `tool_choice`
        /// and `parallel_tool_calls` only with tools, an output limit of
        /// at least 16, an effort (a budget is written as one), usage
        /// exactly when streaming; no stop sequences, `n`, logprobs or
        /// audio (refused).
        fn request() -> impl Strategy<Value = NeutralRequest> {
            let conversation = (
                "[a-z0-9.-]{1,10}",
                vec(message(), 0..6),
                vec(tool(), 0..3),
                tool_choice(),
                prop::option::of(any::<bool>()),
            );
            let options = (
                prop::option::of(16u64..1_000_000),
                sampling(),
                sampling(),
                response_format(),
                prop::option::of(prop_oneof![Just("low"), Just("medium"), Just("high")]),
                prop::option::of("[a-z0-9-]{1,8}"),
                prop::option::of(Just(json!({"k": "v"}))),
                any::<bool>(),
            );
            (conversation, options).prop_map(|(conversation, options)| {
                let (model, messages, tools, tool_choice, parallel_tool_calls) = conversation;
                let (max, temperature, top_p, format, effort, user, metadata, stream) = options;
                let with_tools = !tools.is_empty();
                NeutralRequest {
                    model,
                    messages: no_adjacent_assistants(messages),
                    tools,
                    tool_choice: tool_choice.filter(|_| with_tools),
                    parallel_tool_calls: parallel_tool_calls.filter(|_| with_tools),
                    max_output_tokens: max,
                    temperature,
                    top_p,
                    response_format: format.0,
                    json_schema: format.1,
                    reasoning_effort: effort.map(str::to_owned),
                    user,
                    metadata,
                    stream,
                    include_usage: stream,
                    choices: 1,
                    ..NeutralRequest::default()
                }
            })
        }

        /// One piece of a generated answer.
        #[derive(Debug, Clone)]
        enum Piece {
            Text(String),
            Thinking(String),
            Refusal(String),
            /// A call begins, with its first arguments.
            Call(String, String),
            /// Arguments of the n-th open call (modulo).
            Arguments(usize, String),
            /// The n-th open call ends (modulo).
            End(usize),
        }

        fn piece() -> impl Strategy<Value = Piece> {
            prop_oneof![
                any_text().prop_map(Piece::Text),
                any_text().prop_map(Piece::Thinking),
                any_text().prop_map(Piece::Refusal),
                ("[a-z_]{1,6}", "[{}\":a-z0-9 ]{1,6}").prop_map(|(n, a)| Piece::Call(n, a)),
                (0usize..4, "[{}\":a-z0-9 ]{1,6}").prop_map(|(at, a)| Piece::Arguments(at, a)),
                (0usize..4).prop_map(Piece::End),
            ]
        }

        fn finish_reason() -> impl Strategy<Value = FinishReason> {
            prop_oneof![
                Just(FinishReason::Stop),
                Just(FinishReason::StopSequence),
                Just(FinishReason::Length),
                Just(FinishReason::ToolCalls),
                Just(FinishReason::ContentFilter),
                "[a-z_]{1,8}".prop_map(FinishReason::Other),
            ]
        }

        /// Answers as other dialects decode them: a start, pieces (every
        /// call with arguments; arguments and ends only of open calls), the
        /// calls still open ended, a finish, usage (after it, as chat sends
        /// it, or none), the end.
        fn answer() -> impl Strategy<Value = Vec<NeutralEvent>> {
            (
                "[A-Za-z0-9]{1,8}",
                "[a-z0-9.-]{1,8}",
                0i64..2_000_000_000,
                vec(piece(), 0..14),
                finish_reason(),
                prop::option::of((0u64..1000, 0u64..1000, 0u64..1000)),
            )
                .prop_map(|(id, model, created, pieces, reason, counts)| {
                    let mut events = vec![start(&format!("resp_{id}"), &model, created)];
                    let mut calls = 0u32;
                    let mut open: Vec<u32> = Vec::new();
                    for piece in pieces {
                        match piece {
                            Piece::Text(t) => events.push(E::Text(t)),
                            Piece::Thinking(t) => events.push(E::Thinking(t)),
                            Piece::Refusal(t) => events.push(E::Refusal(t)),
                            Piece::Call(name, first) => {
                                let id = format!("call_{calls}{name}");
                                events.push(call_start(calls, &id, &name));
                                events.push(args(calls, &first));
                                open.push(calls);
                                calls += 1;
                            }
                            Piece::Arguments(at, delta) if !open.is_empty() => {
                                events.push(args(open[at % open.len()], &delta));
                            }
                            Piece::End(at) if !open.is_empty() => {
                                let index = open.remove(at % open.len());
                                events.push(E::ToolCallEnd { index });
                            }
                            Piece::Arguments(..) | Piece::End(_) => {}
                        }
                    }
                    events.extend(open.into_iter().map(|index| E::ToolCallEnd { index }));
                    events.push(E::Finish(reason));
                    if let Some((input, output, cached)) = counts {
                        events.push(E::Usage(usage(input, output, cached)));
                    }
                    events.push(E::End);
                    events
                })
        }

        /// The finish a Responses stream says: the output limit or a
        /// filter (incomplete), else tool calls when it made any, else a
        /// natural end.
        fn said(reason: &FinishReason, calls: bool) -> FinishReason {
            match reason {
                FinishReason::Length | FinishReason::ContentFilter => reason.clone(),
                _ if calls => FinishReason::ToolCalls,
                _ => FinishReason::Stop,
            }
        }

        /// What a Responses stream of `events` decodes to: the same events,
        /// usage before the finish, the finish as the stream says it.
        fn expected(events: &[NeutralEvent]) -> Vec<NeutralEvent> {
            let calls = events.iter().any(|e| matches!(e, E::ToolCallStart { .. }));
            let mut out: Vec<NeutralEvent> = events
                .iter()
                .filter(|e| !matches!(e, E::Finish(_) | E::Usage(_) | E::End))
                .cloned()
                .collect();
            out.extend(events.iter().filter(|e| matches!(e, E::Usage(_))).cloned());
            if let Some(E::Finish(reason)) = events.iter().find(|e| matches!(e, E::Finish(_))) {
                out.push(E::Finish(said(reason, calls)));
            }
            out.push(E::End);
            out
        }

        /// What an answer says, joined: each kind of text, each call's
        /// id, name and arguments, its usage.
        type Said = (
            String,
            String,
            String,
            Vec<(u32, String, String, String)>,
            Option<Usage>,
        );

        fn said_of(events: &[NeutralEvent]) -> Said {
            let mut said: Said = Default::default();
            for event in events {
                match event {
                    E::Text(t) => said.0.push_str(t),
                    E::Thinking(t) => said.1.push_str(t),
                    E::Refusal(t) => said.2.push_str(t),
                    E::ToolCallStart { index, id, name } => {
                        said.3
                            .push((*index, id.clone(), name.clone(), String::new()));
                    }
                    E::ToolCallArguments { index, delta } => {
                        if let Some(call) = said.3.iter_mut().find(|c| c.0 == *index) {
                            call.3.push_str(delta);
                        }
                    }
                    E::Usage(u) => said.4 = Some(*u),
                    _ => {}
                }
            }
            said
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
                let (wire, memo) = encode_all(&events);
                // Sequence numbers, output indexes, items closed, the whole
                // output at the end (checked by `frames`).
                let frames = frames(&wire);
                prop_assert_eq!(memo.next_sequence(), frames.len() as u64);
                let (name, last) = frames.last().unwrap();
                prop_assert!(name == "response.completed" || name == "response.incomplete");
                prop_assert_eq!(decode_all(&wire), expected(&events));
                // The completed response is the answer the stream gave.
                let whole = decode_answer(last["response"].to_string().as_bytes()).unwrap();
                prop_assert_eq!(said_of(&whole), said_of(&events));
            }

            #[test]
            fn answers_round_trip(events in answer()) {
                let body = encode_answer(&events).unwrap();
                let response: Value = serde_json::from_slice(&body).unwrap();
                let has_output = response["output"].as_array().is_some_and(|o| !o.is_empty());
                let (check, _) = OpenAiResponses.check_answer(&body);
                // An incomplete response with no output is no answer (the
                // limit spent before any output): the dialect's own check
                // says so, as for a provider's.
                let valid = matches!(check, BodyCheck::Valid { .. });
                prop_assert_eq!(valid, response["status"] == "completed" || has_output);
                let decoded = decode_answer(&body).unwrap();
                prop_assert_eq!(said_of(&decoded), said_of(&events));
                let calls = events.iter().any(|e| matches!(e, E::ToolCallStart { .. }));
                let reason = events.iter().find_map(|e| match e {
                    E::Finish(reason) => Some(said(reason, calls)),
                    _ => None,
                });
                prop_assert_eq!(decoded[decoded.len() - 2].clone(), E::Finish(reason.unwrap()));
                // The stream of the same events completes with this response.
                let (wire, _) = encode_all(&events);
                let completed = sse_events(&wire).pop().unwrap();
                let completed: Value = serde_json::from_slice(completed.data()).unwrap();
                prop_assert_eq!(&completed["response"], &response);
            }
        }
    }
}
