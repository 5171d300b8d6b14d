//! Responses requests: read once, borrowed from the body, and rewritten
//! per target by splicing the target's model into the raw bytes. Every
//! other field, those outside the public schema included, passes to a
//! Responses target untouched.
//!
//! The fields the gateway decides on are read strictly, `null` meaning
//! absent; another type is refused with a 400 (`invalid_type`):
//!
//! | field | must be |
//! |---|---|
//! | `model` | a string |
//! | `input` | a string or an array |
//! | `stream`, `store`, `parallel_tool_calls` | a boolean |
//! | `max_output_tokens` | a non-negative integer |
//! | `previous_response_id` | a string |
//! | `conversation` | a string or an object with a string `id` |

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::dialect::raw::{
    first_byte, for_each_element, model_edit, request_object, span, splice, strict_bool,
    strict_str, strict_u64, walk_content,
};
use crate::dialect::{ProviderState, RequestError, Requirements, ResponseFormat};

/// A parsed Responses request: the body, and where its `model` is.
#[derive(Debug, Clone)]
pub struct ResponsesRequest {
    body: Bytes,
    /// The `model` value, quotes included.
    model: Range<usize>,
}

impl ResponsesRequest {
    /// The client's body, as it came (translation parses it again).
    pub(super) fn body(&self) -> &Bytes {
        &self.body
    }
}

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    parallel_tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_output_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    store: Option<&'a RawValue>,
    #[serde(borrow, default)]
    previous_response_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    conversation: Option<&'a RawValue>,
}

/// An input item, a content part or a tool: only what requirements and
/// the estimate read.
#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    /// `reasoning`'s `effort`, `text.format`'s `format`.
    #[serde(borrow, default)]
    effort: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    summary: Option<&'a RawValue>,
    #[serde(borrow, default)]
    format: Option<&'a RawValue>,
}

/// What the input holds, for requirements and the estimate.
#[derive(Default)]
struct Tally {
    text_bytes: u64,
    images: bool,
    documents: bool,
    /// An `item_reference` names an item the provider stored.
    item_reference: Option<String>,
}

impl Tally {
    /// Adds `input` or an item's `content`: a string or a list of items or
    /// parts.
    fn content(&mut self, raw: &RawValue, depth: u8) {
        let text = walk_content(raw, depth, |element| self.typed(element, depth));
        self.text_bytes += text;
    }

    fn typed(&mut self, raw: &RawValue, depth: u8) {
        let Ok(item) = serde_json::from_str::<Typed<'_>>(raw.get()) else {
            return;
        };
        self.text_bytes += 16; // role and framing
        match item.kind.as_deref() {
            Some("input_image") => self.images = true,
            Some("input_file") => self.documents = true,
            Some("item_reference") if self.item_reference.is_none() => {
                self.item_reference = item.id.map(Cow::into_owned);
            }
            _ => {}
        }
        for raw in [item.text, item.arguments].into_iter().flatten() {
            self.text_bytes += raw.get().len() as u64;
        }
        for raw in [item.content, item.output].into_iter().flatten() {
            self.content(raw, depth + 1);
        }
    }
}

/// The tool types a client runs itself; every other type is run by the
/// provider (web and file search, code interpreter, computer use, remote
/// MCP, image generation, ...).
const CLIENT_TOOLS: [&str; 2] = ["function", "custom"];

/// The tools' types: whether any is a function, and the hosted ones.
fn read_tools(raw: Option<&RawValue>) -> (bool, Vec<String>) {
    let mut any = false;
    let mut hosted = Vec::new();
    if let Some(raw) = raw.filter(|r| first_byte(r) == b'[') {
        let _ = for_each_element(raw, |tool| {
            any = true;
            let kind = serde_json::from_str::<Typed<'_>>(tool.get())
                .ok()
                .and_then(|t| t.kind)
                .unwrap_or(Cow::Borrowed("function"));
            if !CLIENT_TOOLS.contains(&&*kind) && !hosted.iter().any(|h| h == &*kind) {
                hosted.push(kind.into_owned());
            }
        });
    }
    (any, hosted)
}

/// The provider-held state the request continues, by the first field that
/// names one.
fn provider_state(top: &Top<'_>, tally: &mut Tally) -> Result<Option<ProviderState>, RequestError> {
    if let Some(raw) = top.previous_response_id.filter(|r| r.get() != "null") {
        let id = strict_str(raw, "previous_response_id")?;
        return Ok(Some(ProviderState {
            field: "previous_response_id",
            id: id.into_owned(),
        }));
    }
    if let Some(raw) = top.conversation.filter(|r| r.get() != "null") {
        let id = match first_byte(raw) {
            b'{' => serde_json::from_str::<Typed<'_>>(raw.get())
                .ok()
                .and_then(|c| c.id)
                .map(Cow::into_owned),
            _ => strict_str(raw, "conversation").ok().map(Cow::into_owned),
        };
        let Some(id) = id else {
            return Err(RequestError::WrongType {
                field: "conversation",
                expected: "a string or an object with an id",
            });
        };
        return Ok(Some(ProviderState {
            field: "conversation",
            id,
        }));
    }
    Ok(tally.item_reference.take().map(|id| ProviderState {
        field: "item_reference",
        id,
    }))
}

/// An object field read as [`Typed`], when it is one.
fn typed(raw: Option<&RawValue>) -> Option<Typed<'_>> {
    raw.filter(|r| first_byte(r) == b'{')
        .and_then(|r| serde_json::from_str::<Typed<'_>>(r.get()).ok())
}

/// Reads a Responses request.
pub(super) fn read(body: Bytes) -> Result<(Requirements, ResponsesRequest), RequestError> {
    let top: Top<'_> = request_object(&body)?;
    let model_raw = top
        .model
        .filter(|m| m.get() != "null")
        .ok_or(RequestError::MissingModel)?;
    let model = strict_str(model_raw, "model")?;
    let input = top.input.filter(|i| i.get() != "null");
    if input.is_some_and(|i| !matches!(first_byte(i), b'"' | b'[')) {
        return Err(RequestError::WrongType {
            field: "input",
            expected: "a string or an array",
        });
    }
    let stream = strict_bool(top.stream, "stream")?.unwrap_or(false);
    let store = strict_bool(top.store, "store")?.unwrap_or(true);
    let parallel = strict_bool(top.parallel_tool_calls, "parallel_tool_calls")?;
    let max_output_tokens = strict_u64(top.max_output_tokens, "max_output_tokens", 0)?;

    let mut tally = Tally::default();
    if let Some(input) = input {
        tally.content(input, 0);
    }
    if let Some(instructions) = top.instructions {
        tally.content(instructions, 0);
    }
    tally.text_bytes += top.tools.map_or(0, |t| t.get().len() as u64);
    let (tools, hosted_tools) = read_tools(top.tools);
    let provider_state = provider_state(&top, &mut tally)?;
    let reasoning = typed(top.reasoning).is_some_and(|r| {
        r.effort.as_deref().is_some_and(|e| e != "none")
            || r.summary.is_some_and(|s| s.get() != "null")
    });
    let format = typed(typed(top.text).and_then(|t| t.format))
        .and_then(|f| f.kind)
        .and_then(|kind| match &*kind {
            "json_schema" => Some(ResponseFormat::JsonSchema),
            "json_object" => Some(ResponseFormat::JsonObject),
            _ => None,
        });
    let requirements = Requirements {
        model: model.into_owned(),
        tools,
        // Parallel calls are on by default when tools are given.
        parallel_tool_calls: tools && parallel != Some(false),
        response_format: format,
        stream,
        // A Responses stream always reports usage (`response.completed`):
        // never stripped.
        include_usage: stream,
        image_input: tally.images,
        document_input: tally.documents,
        reasoning,
        input_tokens: tally.text_bytes.div_ceil(4),
        max_output_tokens,
        hosted_tools,
        provider_state,
        store,
    };
    let request = ResponsesRequest {
        model: span(&body, model_raw),
        body: body.clone(),
    };
    Ok((requirements, request))
}

/// The body one target receives: the client's bytes with `model` spliced
/// in; a Responses stream reports usage unasked, so nothing else changes.
pub(super) fn upstream_body(request: &ResponsesRequest, model: &str) -> Bytes {
    match model_edit(&request.body, &request.model, model) {
        None => request.body.clone(),
        Some(edit) => splice(&request.body, &mut [edit]),
    }
}
