//! The neutral turn model: one description of a request and of an
//! answer's events that every dialect maps to and from, so a client of one
//! dialect can be served by a target of another and the next dialect costs
//! one mapping each way, not one per pair.
//!
//! A dialect that translates implements [`Dialect::to_neutral`],
//! [`Dialect::body_from_neutral`], [`Dialect::decode_event`],
//! [`Dialect::encode_event`], [`Dialect::decode_answer`] and
//! [`Dialect::encode_answer`](super::Dialect::encode_answer). What a
//! target's dialect cannot express makes the target ineligible, by name;
//! nothing the answer depends on is dropped silently.
//!
//! [`Dialect::to_neutral`]: super::Dialect::to_neutral
//! [`Dialect::body_from_neutral`]: super::Dialect::body_from_neutral
//! [`Dialect::decode_event`]: super::Dialect::decode_event
//! [`Dialect::encode_event`]: super::Dialect::encode_event
//! [`Dialect::decode_answer`]: super::Dialect::decode_answer

use serde_json::Value;

use super::ResponseFormat;
use crate::Usage;

/// A request in the neutral model: what every dialect's request says,
/// read once from the client's dialect ([`Dialect::to_neutral`](super::Dialect::to_neutral)).
///
/// Fields a dialect has no place for are either refused (the target is
/// ineligible: `choices > 1` on Messages, `logprobs`, `audio`) or dropped
/// where the provider's own documentation calls them advisory (cache hints,
/// beta flags); `docs/dialects.md` lists each.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NeutralRequest {
    /// The client's `model`.
    pub model: String,
    /// The conversation in order, system and developer instructions
    /// included where they stood.
    pub messages: Vec<Message>,
    /// Function tools the model may call.
    pub tools: Vec<ToolSpec>,
    /// How the model must use the tools.
    pub tool_choice: Option<ToolChoice>,
    /// Whether the model may call several tools in one turn (`None`: the
    /// provider's default).
    pub parallel_tool_calls: Option<bool>,
    /// The output limit (`max_tokens`, `max_completion_tokens`).
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Structured output asked for.
    pub response_format: Option<ResponseFormat>,
    /// The JSON schema of [`ResponseFormat::JsonSchema`]: `name`, `schema`,
    /// `strict` and `description`, as chat completions' `json_schema`.
    pub json_schema: Option<Value>,
    /// Reasoning effort (`minimal`, `low`, `medium`, `high`, ...).
    pub reasoning_effort: Option<String>,
    /// A thinking budget in tokens; `Some(0)` asks for thinking with the
    /// target's own budget (Messages' adaptive thinking).
    pub thinking_budget: Option<u64>,
    /// The end user's id, for the provider's abuse tracking.
    pub user: Option<String>,
    /// Request metadata, as the client sent it.
    pub metadata: Option<Value>,
    /// The answer is streamed.
    pub stream: bool,
    /// The client asked for usage in the stream.
    pub include_usage: bool,
    /// How many alternative answers are asked for (`n`); 1 when not said.
    pub choices: u64,
    /// Token log probabilities are asked for.
    pub logprobs: bool,
    /// Audio input or output is asked for.
    pub audio: bool,
}

/// One message of a [`NeutralRequest`]'s conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// System instructions.
    System(Vec<Part>),
    /// Developer instructions (chat completions' `developer` role).
    Developer(Vec<Part>),
    /// The user's turn.
    User(Vec<Part>),
    /// The model's earlier turn: text, tool calls, thinking, refusal.
    Assistant(Vec<Part>),
    /// The result of one tool call.
    Tool {
        /// The id of the call it answers.
        call_id: String,
        /// What the tool returned.
        content: Vec<Part>,
        /// The tool failed.
        is_error: bool,
    },
}

/// One part of a [`Message`].
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Text.
    Text(String),
    /// An image: an `https:` URL or a `data:` URL with its media type.
    Image(String),
    /// A document (a PDF, a text file): a `data:` URL or an `https:` URL,
    /// and its file name when the client gave one.
    Document {
        /// The document's URL.
        url: String,
        /// The file name.
        name: Option<String>,
    },
    /// A tool call the model made.
    ToolCall {
        /// The call's id.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments, as the JSON text the model wrote.
        arguments: String,
    },
    /// The model's reasoning, with the provider's signature when it gave
    /// one (Messages' thinking blocks must be sent back signed).
    Thinking {
        /// The reasoning text.
        text: String,
        /// The signature.
        signature: Option<String>,
    },
    /// Reasoning the provider encrypted (Messages' `redacted_thinking`).
    RedactedThinking(String),
    /// The model refused.
    Refusal(String),
}

/// A function tool of a [`NeutralRequest`].
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The tool's name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// Its parameters' JSON schema.
    pub parameters: Value,
    /// Strict schema adherence, when the client asked for it.
    pub strict: Option<bool>,
}

/// How the model must use the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool.
    None,
    /// At least one tool.
    Required,
    /// This tool.
    Named(String),
}

/// Why the model stopped, in neutral terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A natural end (`stop`, `end_turn`).
    Stop,
    /// A stop sequence matched (`stop_sequence`; chat says `stop`).
    StopSequence,
    /// The output limit (`length`, `max_tokens`).
    Length,
    /// The model called tools (`tool_calls`, `tool_use`).
    ToolCalls,
    /// The answer was refused or filtered (`content_filter`, `refusal`).
    ContentFilter,
    /// Any other reason, as the provider named it.
    Other(String),
}

/// One event of an answer in the neutral model. A stream decodes into
/// these event by event ([`Dialect::decode_event`](super::Dialect::decode_event));
/// a whole answer is the same events in order
/// ([`Dialect::decode_answer`](super::Dialect::decode_answer)).
#[derive(Debug, Clone, PartialEq)]
pub enum NeutralEvent {
    /// The answer starts: its id and the answering model.
    Start {
        /// The answer's id, in the provider's form.
        id: String,
        /// The answering model.
        model: String,
        /// Creation time (Unix seconds), when the provider gave it.
        created: Option<i64>,
    },
    /// Text of the answer.
    Text(String),
    /// A tool call begins.
    ToolCallStart {
        /// The call's position among this answer's calls, from 0.
        index: u32,
        /// The call's id.
        id: String,
        /// The tool's name.
        name: String,
    },
    /// Arguments of a begun tool call.
    ToolCallArguments {
        /// The call's position.
        index: u32,
        /// The next piece of the arguments' JSON text.
        delta: String,
    },
    /// A tool call's arguments are complete.
    ToolCallEnd {
        /// The call's position.
        index: u32,
    },
    /// Reasoning text.
    Thinking(String),
    /// The signature of the reasoning so far (Messages).
    ThinkingSignature(String),
    /// Encrypted reasoning (Messages' `redacted_thinking`).
    RedactedThinking(String),
    /// Refusal text.
    Refusal(String),
    /// Usage, cumulative.
    Usage(Usage),
    /// Why the model stopped.
    Finish(FinishReason),
    /// The answer is complete.
    End,
}

/// The prefixes tool-call ids carry in the dialects the crate knows
/// (chat completions' and the Responses API's `call_`, Messages' `toolu_`).
pub(crate) const TOOL_CALL_ID_PREFIXES: &[&str] = &["call_", "toolu_"];

/// The prefixes answer ids carry (`chatcmpl-`, `msg_`, `resp_`).
pub(crate) const ANSWER_ID_PREFIXES: &[&str] = &["chatcmpl-", "msg_", "resp_"];

/// An id in the form of the dialect whose prefix is `own`: a known prefix
/// (one of `known`) is swapped for `own`, so ids survive a round trip
/// (`toolu_X` → `call_X` → `toolu_X`); an id with no known prefix is kept
/// as it is (both halves of a tool call and its result map alike).
pub(crate) fn reprefix<'a>(id: &'a str, known: &[&str], own: &str) -> std::borrow::Cow<'a, str> {
    if id.starts_with(own) {
        return std::borrow::Cow::Borrowed(id);
    }
    match known.iter().find_map(|prefix| id.strip_prefix(prefix)) {
        Some(rest) => std::borrow::Cow::Owned(format!("{own}{rest}")),
        None => std::borrow::Cow::Borrowed(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_swap_known_prefixes_and_survive_a_round_trip() {
        let chat = reprefix("toolu_01A", TOOL_CALL_ID_PREFIXES, "call_");
        assert_eq!(chat, "call_01A");
        assert_eq!(
            reprefix(&chat, TOOL_CALL_ID_PREFIXES, "toolu_"),
            "toolu_01A"
        );
        assert_eq!(reprefix("call_9", TOOL_CALL_ID_PREFIXES, "call_"), "call_9");
        assert_eq!(
            reprefix("D681PevKs", TOOL_CALL_ID_PREFIXES, "toolu_"),
            "D681PevKs"
        );
        assert_eq!(
            reprefix("msg_1", ANSWER_ID_PREFIXES, "chatcmpl-"),
            "chatcmpl-1"
        );
    }
}
