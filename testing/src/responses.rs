//! The OpenAI Responses side of [`FakeUpstream`](super::upstream::FakeUpstream):
//! `POST /v1/responses` answers and event streams, with the same faults as
//! chat completions and Messages.
//!
//! # The request
//!
//! `model` (a string) and `input` (a string or an array of items) are
//! required; without them the answer is a 400 in OpenAI's error shape
//! (`{"error":{"message","type":"invalid_request_error","param","code"}}`,
//! `code` `missing_required_parameter` or `invalid_type`). `stream`,
//! `tools`, `instructions` and `max_output_tokens` are read; the input
//! tokens are counted as the words of the input (string contents, text
//! parts and function call outputs) and of `instructions`. A request whose
//! `tools` has a `{"type": "function", ...}` entry is answered with a
//! function call, others with text.
//!
//! # The stream
//!
//! Every event is one SSE frame, `event: <type>\ndata: <json>\n\n`, sent
//! as one HTTP chunk; its data starts with `"type"` (the event name) and
//! `"sequence_number"` (0, 1, 2, ... in the order sent). A text answer of
//! N tokens:
//!
//! ```text
//! response.created                 response: status in_progress, output [], usage null
//! response.in_progress
//! response.output_item.added       output_index 0, item: message msg_fake_0, in_progress, content []
//! response.content_part.added      part: output_text, annotations [], logprobs [], text ""
//! response.output_text.delta × N   delta "{name}-tok{i} "
//! response.output_text.done        the whole text
//! response.content_part.done
//! response.output_item.done        the message, completed, with its content
//! response.completed               response: status completed, output, usage
//! ```
//!
//! With a function tool, the item is a `function_call` (`id` `fc_fake_0`,
//! `call_id` `call_fake`, `name` [`TOOL_NAME`], `arguments` `""`), then
//! `response.function_call_arguments.delta`s joining into
//! `{"q": "<tokens>"}` (an opening piece, one per token, a closing piece),
//! `response.function_call_arguments.done`, `response.output_item.done`
//! and `response.completed`. A [`Fault::Refusal`] answers a message whose
//! part is `{"type":"refusal","refusal":""}`, filled by
//! `response.refusal.delta`s and closed by `response.refusal.done`.
//! Without `"stream": true` the answer is the response object of
//! `response.completed`, as JSON.
//!
//! # Faults
//!
//! Errors before the body are chat's ([`ErrorFixture::body`], the same
//! headers). Mid-stream faults count output deltas, as on the other wires:
//! the message item and its empty part are preamble, a function call's
//! item is output (it names the tool), so `error_after=0` fails after
//! `response.content_part.added` on text and right after
//! `response.in_progress` on a tool call. `error_after=N` ends with
//! `response.failed` (the response with status `failed`, `output` `[]`
//! and `error` `{code, message}` from the fixture: its `code`, else its
//! `type`; `server_error` by default) and no `response.completed`;
//! `reset_after`, `stall_after` and `eof_after` cut after N deltas;
//! `malformed_at=N` sends a truncated-JSON delta event (with its own
//! sequence number) before delta N, then goes on; `no_done` sends all but
//! `response.completed`. Whole answers take faults as chat's do, except
//! `error_after`, which answers 200 with a `failed` response object.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use super::Step;
use super::chunks::TOOL_CALL_ID;
use super::messages::TOOL_NAME;
use super::upstream::{
    ErrorFixture, Fault, REFUSAL, TOOL_ARGUMENTS_CLOSE, TOOL_ARGUMENTS_OPEN, refusal_pieces,
};

/// The id of every fake response.
pub const RESPONSE_ID: &str = "resp_fake";

/// The `created_at` of every fake response (2026-01-01T00:00:00Z).
pub const CREATED_AT: u64 = 1_767_225_600;

/// The id of the message item of a text or refusal answer.
pub const MESSAGE_ITEM_ID: &str = "msg_fake_0";

/// The id of the `function_call` item of a tool-call answer (its `call_id`
/// is [`TOOL_CALL_ID`], as on chat).
pub const FUNCTION_CALL_ITEM_ID: &str = "fc_fake_0";

/// What one Responses request asked for.
pub(super) struct ResponsesAsk {
    pub(super) model: String,
    pub(super) stream: bool,
    /// The request has a function tool: the answer is a function call.
    tools: bool,
    input_tokens: u64,
    /// Echoed in the response object.
    instructions: Value,
    /// Echoed in the response object.
    max_output_tokens: Value,
    /// The request's `tools`, echoed in the response object.
    tool_list: Value,
}

impl ResponsesAsk {
    /// The request's fields, or the body of the 400 to answer (OpenAI's
    /// error shape, naming the parameter).
    pub(super) fn read(body: &Value) -> Result<Self, String> {
        let model = match body.get("model") {
            Some(Value::String(model)) => model,
            None | Some(Value::Null) => return Err(missing("model")),
            Some(_) => return Err(invalid_type("model", "a string")),
        };
        let input_words: usize = match body.get("input") {
            Some(Value::String(text)) => words(text),
            Some(Value::Array(items)) => items.iter().map(item_words).sum(),
            None | Some(Value::Null) => return Err(missing("input")),
            Some(_) => return Err(invalid_type("input", "a string or an array")),
        };
        let instructions = body.get("instructions").cloned().unwrap_or(Value::Null);
        let total = input_words + instructions.as_str().map_or(0, words);
        let tool_list = body
            .get("tools")
            .filter(|t| t.is_array())
            .cloned()
            .unwrap_or_else(|| json!([]));
        let tools = tool_list.as_array().is_some_and(|tools| {
            tools
                .iter()
                .any(|t| t.get("type").and_then(Value::as_str) == Some("function"))
        });
        Ok(Self {
            model: model.clone(),
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
            tools,
            input_tokens: u64::try_from(total.max(1)).unwrap_or(u64::MAX),
            instructions,
            max_output_tokens: body
                .get("max_output_tokens")
                .cloned()
                .unwrap_or(Value::Null),
            tool_list,
        })
    }
}

fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// The words of an input item: its string content, the text of its
/// content parts, or a function call's output.
fn item_words(item: &Value) -> usize {
    let content = match item.get("content") {
        Some(Value::String(text)) => words(text),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(words)
            .sum(),
        _ => 0,
    };
    content + item.get("output").and_then(Value::as_str).map_or(0, words)
}

/// OpenAI's 400 body for a missing parameter.
fn missing(param: &str) -> String {
    bad_parameter(
        param,
        "missing_required_parameter",
        &format!("Missing required parameter: '{param}'."),
    )
}

/// OpenAI's 400 body for a parameter of the wrong type.
fn invalid_type(param: &str, expected: &str) -> String {
    bad_parameter(
        param,
        "invalid_type",
        &format!("Invalid type for '{param}': expected {expected}."),
    )
}

fn bad_parameter(param: &str, code: &str, message: &str) -> String {
    json!({"error": {"message": message, "type": "invalid_request_error",
                     "param": param, "code": code}})
    .to_string()
}

/// A JSON object written field by field, in the order given (a `Value`
/// sorts its keys, and OpenAI sends `type` first).
#[derive(Default)]
struct Obj(String);

impl Obj {
    /// A field whose value is `value` as JSON.
    fn field(self, key: &str, value: impl Into<Value>) -> Self {
        self.raw(key, &value.into().to_string())
    }

    /// A field whose value is already JSON text.
    fn raw(mut self, key: &str, json: &str) -> Self {
        self.0.push(if self.0.is_empty() { '{' } else { ',' });
        self.0.push('"');
        self.0.push_str(key);
        self.0.push_str("\":");
        self.0.push_str(json);
        self
    }

    /// The object's JSON text.
    fn end(mut self) -> String {
        if self.0.is_empty() {
            return "{}".to_owned();
        }
        self.0.push('}');
        self.0
    }
}

/// What the answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Text,
    ToolCall,
    Refusal,
}

impl Answer {
    fn of(ask: &ResponsesAsk, fault: Option<&Fault>) -> Self {
        if fault == Some(&Fault::Refusal) {
            Self::Refusal
        } else if ask.tools {
            Self::ToolCall
        } else {
            Self::Text
        }
    }

    /// The pieces the answer streams in, one delta each (a tool call's
    /// opening and closing pieces aside).
    fn pieces(self, name: &str, tokens: usize) -> Vec<String> {
        match self {
            Self::Refusal => refusal_pieces().map(str::to_owned).collect(),
            Self::Text | Self::ToolCall => (0..tokens).map(|i| format!("{name}-tok{i} ")).collect(),
        }
    }

    /// The whole text (a tool call's whole arguments) of these pieces.
    fn full(self, pieces: &[String]) -> String {
        match self {
            Self::Refusal => REFUSAL.to_owned(),
            Self::Text => pieces.concat(),
            Self::ToolCall => format!(
                "{TOOL_ARGUMENTS_OPEN}{}{TOOL_ARGUMENTS_CLOSE}",
                pieces.concat()
            ),
        }
    }

    fn item_id(self) -> &'static str {
        match self {
            Self::ToolCall => FUNCTION_CALL_ITEM_ID,
            Self::Text | Self::Refusal => MESSAGE_ITEM_ID,
        }
    }

    fn delta_event(self) -> &'static str {
        match self {
            Self::Text => "response.output_text.delta",
            Self::ToolCall => "response.function_call_arguments.delta",
            Self::Refusal => "response.refusal.delta",
        }
    }

    /// The message's content part: empty (`None`), or holding `full`.
    fn part(self, full: Option<&str>) -> String {
        let text = full.unwrap_or_default();
        match self {
            Self::Refusal => Obj::default()
                .field("type", "refusal")
                .field("refusal", text)
                .end(),
            Self::Text | Self::ToolCall => Obj::default()
                .field("type", "output_text")
                .raw("annotations", "[]")
                .raw("logprobs", "[]")
                .field("text", text)
                .end(),
        }
    }

    /// The output item: in progress and empty (`None`), or completed with
    /// `full`.
    fn item(self, full: Option<&str>) -> String {
        let status = if full.is_some() {
            "completed"
        } else {
            "in_progress"
        };
        let item = Obj::default()
            .field("id", self.item_id())
            .field("type", self.item_type())
            .field("status", status);
        match self {
            Self::ToolCall => item
                .field("arguments", full.unwrap_or_default())
                .field("call_id", TOOL_CALL_ID)
                .field("name", TOOL_NAME)
                .end(),
            Self::Text | Self::Refusal => {
                let content = full.map_or_else(String::new, |f| self.part(Some(f)));
                item.field("role", "assistant")
                    .raw("content", &format!("[{content}]"))
                    .end()
            }
        }
    }

    fn item_type(self) -> &'static str {
        match self {
            Self::ToolCall => "function_call",
            Self::Text | Self::Refusal => "message",
        }
    }
}

/// The response object in `status`, with this output (JSON text), usage
/// (`Some(output_tokens)`) and error.
fn response_object(
    ask: &ResponsesAsk,
    status: &str,
    output: &str,
    output_tokens: Option<usize>,
    error: Value,
) -> String {
    let usage = output_tokens.map_or_else(
        || "null".to_owned(),
        |n| {
            let n = u64::try_from(n).unwrap_or(u64::MAX);
            json!({"input_tokens": ask.input_tokens,
                   "input_tokens_details": {"cached_tokens": 0},
                   "output_tokens": n,
                   "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": ask.input_tokens.saturating_add(n)})
            .to_string()
        },
    );
    Obj::default()
        .field("id", RESPONSE_ID)
        .field("object", "response")
        .field("created_at", CREATED_AT)
        .field("status", status)
        .field("error", error)
        .raw("incomplete_details", "null")
        .field("instructions", ask.instructions.clone())
        .field("max_output_tokens", ask.max_output_tokens.clone())
        .field("model", ask.model.as_str())
        .raw("output", output)
        .field("parallel_tool_calls", true)
        .raw("previous_response_id", "null")
        .field("temperature", 1.0)
        .raw("text", r#"{"format":{"type":"text"}}"#)
        .field("tool_choice", "auto")
        .field("tools", ask.tool_list.clone())
        .field("top_p", 1.0)
        .field("truncation", "disabled")
        .raw("usage", &usage)
        .raw("metadata", "{}")
        .end()
}

/// The `error` of a failed response for a fixture: `{code, message}`,
/// the code being the fixture's `code`, else its `type`.
fn failure(fixture: ErrorFixture) -> Value {
    let body: Value = serde_json::from_str(fixture.body()).unwrap_or_default();
    let error = &body["error"];
    let code = error["code"]
        .as_str()
        .or_else(|| error["type"].as_str())
        .unwrap_or("server_error");
    json!({"code": code, "message": error["message"]})
}

/// A stream being written: its steps and the next sequence number.
#[derive(Default)]
struct Events {
    steps: VecDeque<Step>,
    sequence: u64,
}

impl Events {
    fn next_sequence(&mut self) -> u64 {
        let n = self.sequence;
        self.sequence += 1;
        n
    }

    /// An event `kind` whose data is `type`, `sequence_number`, then the
    /// fields `fill` writes.
    fn push(&mut self, kind: &str, fill: impl FnOnce(Obj) -> Obj) {
        let data = Obj::default()
            .field("type", kind)
            .field("sequence_number", self.next_sequence());
        let data = fill(data).end();
        self.steps.push_back(Step::Data(Bytes::from(format!(
            "event: {kind}\ndata: {data}\n\n"
        ))));
    }

    /// A delta event of the answer: a piece of text, of the arguments or
    /// of the refusal.
    fn delta(&mut self, answer: Answer, piece: &str) {
        self.push(answer.delta_event(), |o| {
            let o = o
                .field("item_id", answer.item_id())
                .field("output_index", 0);
            match answer {
                Answer::ToolCall => o.field("delta", piece),
                Answer::Text => o
                    .field("content_index", 0)
                    .field("delta", piece)
                    .raw("logprobs", "[]"),
                Answer::Refusal => o.field("content_index", 0).field("delta", piece),
            }
        });
    }

    /// A delta event cut short: its JSON ends inside the delta's string.
    fn malformed(&mut self, answer: Answer, name: &str) {
        let kind = answer.delta_event();
        let sequence = self.next_sequence();
        let item_id = answer.item_id();
        self.steps.push_back(Step::Data(Bytes::from(format!(
            "event: {kind}\ndata: {{\"type\":\"{kind}\",\"sequence_number\":{sequence},\"item_id\":\"{item_id}\",\"output_index\":0,\"delta\":\"{name}-brok\n\n"
        ))));
    }

    /// The answer's item opens: `output_item.added`, then the empty
    /// content part of a message, or a tool call's opening piece.
    fn open(&mut self, answer: Answer) {
        let item = answer.item(None);
        self.push("response.output_item.added", |o| {
            o.field("output_index", 0).raw("item", &item)
        });
        if answer == Answer::ToolCall {
            self.delta(answer, TOOL_ARGUMENTS_OPEN);
            return;
        }
        let part = answer.part(None);
        self.push("response.content_part.added", |o| {
            o.field("item_id", MESSAGE_ITEM_ID)
                .field("output_index", 0)
                .field("content_index", 0)
                .raw("part", &part)
        });
    }

    /// The answer's item closes with `full`: the `.done` events of the
    /// text, refusal or arguments (and of the content part), then
    /// `output_item.done`.
    fn close(&mut self, answer: Answer, full: &str) {
        match answer {
            Answer::ToolCall => {
                self.delta(answer, TOOL_ARGUMENTS_CLOSE);
                self.push("response.function_call_arguments.done", |o| {
                    o.field("item_id", FUNCTION_CALL_ITEM_ID)
                        .field("name", TOOL_NAME)
                        .field("output_index", 0)
                        .field("arguments", full)
                });
            }
            Answer::Text | Answer::Refusal => {
                let text_done = |o: Obj| {
                    let o = o
                        .field("item_id", MESSAGE_ITEM_ID)
                        .field("output_index", 0)
                        .field("content_index", 0);
                    if answer == Answer::Text {
                        o.field("text", full).raw("logprobs", "[]")
                    } else {
                        o.field("refusal", full)
                    }
                };
                if answer == Answer::Text {
                    self.push("response.output_text.done", text_done);
                } else {
                    self.push("response.refusal.done", text_done);
                }
                let part = answer.part(Some(full));
                self.push("response.content_part.done", |o| {
                    o.field("item_id", MESSAGE_ITEM_ID)
                        .field("output_index", 0)
                        .field("content_index", 0)
                        .raw("part", &part)
                });
            }
        }
        let item = answer.item(Some(full));
        self.push("response.output_item.done", |o| {
            o.field("output_index", 0).raw("item", &item)
        });
    }
}

/// The SSE script for a streamed answer, and whether it ends in a reset
/// (see the [module docs](self) for the events).
pub(super) fn stream_steps(
    name: &str,
    ask: &ResponsesAsk,
    tokens: usize,
    pace: Duration,
    fault: Option<&Fault>,
) -> (VecDeque<Step>, bool) {
    let answer = Answer::of(ask, fault);
    let pieces = answer.pieces(name, tokens);
    let cut = fault.and_then(Fault::cut_after);
    let malformed_at = fault.and_then(Fault::malformed_at);
    let mut events = Events::default();
    let opening = response_object(ask, "in_progress", "[]", None, Value::Null);
    events.push("response.created", |o| o.raw("response", &opening));
    events.push("response.in_progress", |o| o.raw("response", &opening));
    // A function call's item names the tool: it is output, so a fault
    // before any token comes first (the in-band error before output).
    if !(answer == Answer::ToolCall && cut == Some(0)) {
        events.open(answer);
    }
    for (i, piece) in pieces.iter().enumerate() {
        if cut == Some(i) {
            break;
        }
        if i == 0 {
            if let Some(Fault::SlowFirstToken { delay_ms }) = fault {
                events
                    .steps
                    .push_back(Step::Wait(Duration::from_millis(*delay_ms)));
            }
        } else if !pace.is_zero() {
            events.steps.push_back(Step::Wait(pace));
        }
        if malformed_at == Some(i) {
            events.malformed(answer, name);
        }
        events.delta(answer, piece);
    }
    match fault {
        Some(Fault::ErrorAfter { error, .. }) => {
            let error = failure(error.unwrap_or(ErrorFixture::ServerError));
            let failed = response_object(ask, "failed", "[]", None, error);
            events.push("response.failed", |o| o.raw("response", &failed));
            return (events.steps, false);
        }
        Some(Fault::ResetAfter { .. }) => return (events.steps, true),
        Some(Fault::StallAfter { .. }) => {
            events.steps.push_back(Step::Stall);
            return (events.steps, false);
        }
        Some(Fault::EofAfter { .. }) => return (events.steps, false),
        _ => {}
    }
    if malformed_at.is_some_and(|n| n >= pieces.len()) {
        events.malformed(answer, name);
    }
    let full = answer.full(&pieces);
    events.close(answer, &full);
    if !matches!(fault, Some(Fault::MissingDone)) {
        let output = format!("[{}]", answer.item(Some(&full)));
        let done = response_object(ask, "completed", &output, Some(pieces.len()), Value::Null);
        events.push("response.completed", |o| o.raw("response", &done));
    }
    (events.steps, false)
}

/// The JSON script for a non-streamed answer, and whether it ends in a
/// reset.
pub(super) fn response_steps(
    name: &str,
    ask: &ResponsesAsk,
    tokens: usize,
    fault: Option<&Fault>,
) -> (VecDeque<Step>, bool) {
    let answer = Answer::of(ask, fault);
    let pieces = answer.pieces(name, tokens);
    let output = format!("[{}]", answer.item(Some(&answer.full(&pieces))));
    let full = Bytes::from(response_object(
        ask,
        "completed",
        &output,
        Some(pieces.len()),
        Value::Null,
    ));
    let half = full.slice(..full.len() / 2);
    let mut steps = VecDeque::with_capacity(2);
    match fault {
        Some(Fault::ErrorAfter { error, .. }) => {
            let error = failure(error.unwrap_or(ErrorFixture::ServerError));
            let failed = response_object(ask, "failed", "[]", None, error);
            steps.push_back(Step::Data(Bytes::from(failed)));
        }
        Some(Fault::ResetAfter { .. }) => {
            steps.push_back(Step::Data(half));
            return (steps, true);
        }
        Some(Fault::StallAfter { .. }) => {
            steps.push_back(Step::Data(half));
            steps.push_back(Step::Stall);
        }
        Some(Fault::EofAfter { .. } | Fault::MalformedAt { .. }) => {
            steps.push_back(Step::Data(half));
        }
        _ => steps.push_back(Step::Data(full)),
    }
    (steps, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(body: &Value) -> ResponsesAsk {
        ResponsesAsk::read(body).unwrap()
    }

    /// The events of a script: name and data as JSON (`Null` when the
    /// data is not JSON).
    fn events(steps: &VecDeque<Step>) -> Vec<(String, Value)> {
        steps
            .iter()
            .filter_map(|step| match step {
                Step::Data(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                _ => None,
            })
            .map(|text| {
                let (head, data) = text.split_once('\n').unwrap();
                let name = head.strip_prefix("event: ").unwrap().to_owned();
                let data = data.strip_prefix("data: ").unwrap().trim_end();
                (name, serde_json::from_str(data).unwrap_or(Value::Null))
            })
            .collect()
    }

    #[test]
    fn input_words_and_function_tools_are_read() {
        let read = ask(&json!({
            "model": "m",
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": "one two three"},
                {"role": "user", "content": [{"type": "input_text", "text": "four five"},
                                             {"type": "input_image", "image_url": "x"}]},
                {"type": "function_call_output", "call_id": "c", "output": "six"},
            ],
            "tools": [{"type": "web_search"}],
        }));
        assert_eq!(read.input_tokens, 8);
        assert!(!read.tools, "no function tool");
        assert!(!read.stream);
        let read = ask(&json!({"model": "m", "input": "", "stream": true,
                               "tools": [{"type": "function", "name": "f"}]}));
        assert_eq!(read.input_tokens, 1, "at least one");
        assert!(read.tools);
        assert!(read.stream);
    }

    #[test]
    fn fields_are_written_in_the_order_given() {
        let text = Obj::default()
            .field("type", "x")
            .field("sequence_number", 0)
            .raw("a", "[]")
            .field("q", "say \"hi\"")
            .end();
        assert_eq!(
            text,
            r#"{"type":"x","sequence_number":0,"a":[],"q":"say \"hi\""}"#
        );
        assert_eq!(Obj::default().end(), "{}");
    }

    #[test]
    fn a_failure_carries_the_fixtures_code_else_its_type() {
        let code = |f| failure(f)["code"].as_str().unwrap().to_owned();
        assert_eq!(code(ErrorFixture::ServerError), "server_error");
        assert_eq!(code(ErrorFixture::RateLimit), "rate_limit_exceeded");
        assert_eq!(code(ErrorFixture::Overloaded), "server_is_overloaded");
        assert!(failure(ErrorFixture::Quota)["message"].is_string());
    }

    #[test]
    fn a_tool_call_is_cut_after_its_argument_pieces() {
        let tool = ask(&json!({"model": "m", "input": "x", "stream": true,
                               "tools": [{"type": "function", "name": "f"}]}));
        let fault = Fault::ResetAfter { tokens: 2 };
        let (steps, reset) = stream_steps("p", &tool, 5, Duration::ZERO, Some(&fault));
        assert!(reset);
        let events = events(&steps);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
            ]
        );
        assert_eq!(events[3].1["delta"], TOOL_ARGUMENTS_OPEN);
        assert_eq!(events[5].1["delta"], "p-tok1 ");
        assert_eq!(events[5].1["sequence_number"], 5);
    }

    #[test]
    fn pacing_and_a_slow_first_token_wait_between_deltas() {
        let text = ask(&json!({"model": "m", "input": "x", "stream": true}));
        let fault = Fault::SlowFirstToken { delay_ms: 7 };
        let pace = Duration::from_millis(3);
        let (steps, _) = stream_steps("p", &text, 3, pace, Some(&fault));
        let waits: Vec<Duration> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Wait(d) => Some(*d),
                _ => None,
            })
            .collect();
        assert_eq!(waits, [Duration::from_millis(7), pace, pace]);
        // The first wait comes after the preamble, before the first delta.
        assert!(matches!(steps[4], Step::Wait(_)));
    }

    #[test]
    fn a_whole_answer_cut_short_is_half_the_json() {
        let text = ask(&json!({"model": "m", "input": "x"}));
        let (whole, _) = response_steps("p", &text, 3, None);
        let Some(Step::Data(whole)) = whole.front() else {
            panic!("a body");
        };
        for fault in [
            Fault::EofAfter { tokens: 1 },
            Fault::MalformedAt { tokens: 1 },
        ] {
            let (steps, reset) = response_steps("p", &text, 3, Some(&fault));
            assert!(!reset);
            let Some(Step::Data(half)) = steps.front() else {
                panic!("a body");
            };
            assert_eq!(*half, whole.slice(..whole.len() / 2));
        }
        let (steps, _) = response_steps("p", &text, 3, Some(&Fault::MissingDone));
        assert!(matches!(steps.front(), Some(Step::Data(b)) if b == whole));
    }
}
