//! Wire dialects: everything about one API's wire format, in one place.
//!
//! A [`Dialect`] owns what the rest of the crate must not know about a
//! wire format:
//!
//! - **requests**: what a request needs from a target ([`Requirements`]),
//!   and the body each target receives (its model, usage reporting on);
//! - **streams**: what each dispatched [`SseEvent`] is — model output
//!   (which commits the stream), a finish reason, usage, an in-band error,
//!   the end-of-stream marker, or only preamble (role chunks, empty deltas,
//!   keep-alives) — and the synthetic frames a gateway writes: the terminal
//!   event that ends a failed stream and the end marker;
//! - **whole answers**: whether a non-streaming body is a valid answer, and
//!   its usage;
//! - **errors**: the error body a client of this API raises on.
//!
//! [`OpenAiChat`] speaks OpenAI chat completions, which most providers
//! also serve; [`AnthropicMessages`] speaks Anthropic's
//! Messages API. Other dialects implement the same trait beside them;
//! nothing outside this module names a wire type. Dialects map to and from
//! one neutral turn model ([`NeutralRequest`], [`NeutralEvent`]), so a
//! target of another dialect than its clients'
//! ([`Target::dialect`](crate::failover::Target::dialect)) is served
//! translated, and a new dialect costs one mapping each way.
//!
//! # Writing a dialect
//!
//! One method per concern, in the crate's neutral words (`tests/toy_dialect.rs`
//! is a whole dialect in one file):
//!
//! | concern | methods |
//! |---|---|
//! | a request | [`read_request`](Dialect::read_request) (→ [`Requirements`]), [`upstream_body`](Dialect::upstream_body), [`upstream_headers`](Dialect::upstream_headers), [`forwarded_request_headers`](Dialect::forwarded_request_headers) |
//! | a stream | [`inspect`](Dialect::inspect) with the stream's [`Memo`](Dialect::Memo) (→ [`Chunk`]: kind, finish reason, [`Usage`], identity), [`answer_open`](Dialect::answer_open) |
//! | ending a stream | [`terminal`](Dialect::terminal) (per [`TerminalMode`]; [`stream_terminal`](Dialect::stream_terminal) when it needs the stream's memo), [`done_frame`](Dialect::done_frame) |
//! | a whole answer | [`check_answer`](Dialect::check_answer) (→ [`BodyCheck`], [`AnswerFacts`]) |
//! | errors | [`error_facts`](Dialect::error_facts) (an in-band event or a body: [`ErrorSource`]), [`error_body`](Dialect::error_body), [`error_status`](Dialect::error_status), and the provided [`error_response`](Dialect::error_response) every answering layer uses |
//! | translation (provided; a dialect that skips them is served only to its own clients) | [`name`](Dialect::name), [`upstream_path`](Dialect::upstream_path), [`to_neutral`](Dialect::to_neutral) / [`body_from_neutral`](Dialect::body_from_neutral) (requests, [`NeutralRequest`]), [`decode_event`](Dialect::decode_event) / [`encode_event`](Dialect::encode_event) / [`encoded_identity`](Dialect::encoded_identity) (streams, [`NeutralEvent`]), [`decode_answer`](Dialect::decode_answer) / [`encode_answer`](Dialect::encode_answer) (whole answers) |
//!
//! ```
//! use bytes::Bytes;
//! use tower_llm_failover::dialect::{ChunkKind, Dialect, OpenAiChat};
//! use tower_llm_failover::sse::{SseItem, SseScanner};
//!
//! let wire = Bytes::from_static(
//!     b"data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
//!       data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
//!       data: [DONE]\n\n",
//! );
//! let mut kinds = Vec::new();
//! SseScanner::new().feed(&wire, |item| {
//!     if let SseItem::Event(event) = item {
//!         kinds.push(OpenAiChat.inspect(&event, &mut Default::default()).kind);
//!     }
//! });
//! assert_eq!(kinds, [ChunkKind::Preamble, ChunkKind::Output, ChunkKind::Done]);
//! ```

mod anthropic;
pub(crate) mod foreign;
mod json;
mod neutral;
mod openai;
mod raw;
mod request;
mod responses;

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};

use crate::sse::SseEvent;
use crate::{FailureClass, Phase, Usage};

pub use anthropic::{AnthropicMessages, MessagesMemo, MessagesRequest};
pub use neutral::{
    FinishReason, Message, NeutralEvent, NeutralRequest, Part, ToolChoice, ToolSpec,
};
pub use openai::{ChatMemo, ChatRequest, OpenAiChat};
pub use responses::{OpenAiResponses, ResponsesMemo, ResponsesRequest};

/// The dialect the layers speak unless told otherwise (OpenAI chat
/// completions). The one place outside a dialect's own module that names
/// it: the layers' default type parameters say `DefaultDialect`.
pub type DefaultDialect = OpenAiChat;
pub use request::{ProviderState, RequestError, Requirements, ResponseFormat};

/// What one event of a model stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkKind {
    /// No model output: role-only chunks, empty deltas, usage-only chunks,
    /// unknown event types. Holding these back is invisible to the client.
    Preamble,
    /// Model output (content, tool call, refusal or reasoning delta).
    Output,
    /// The end-of-stream marker (`data: [DONE]`).
    Done,
    /// An in-band error event.
    Error,
    /// The event's payload does not parse.
    Malformed,
}

/// The identity of a stream's chunks, borrowed from one event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChunkIdentity<'a> {
    /// The completion id (`id`).
    pub id: Option<Cow<'a, str>>,
    /// The answering model (`model`).
    pub model: Option<Cow<'a, str>>,
    /// Creation time (`created`, Unix seconds).
    pub created: Option<i64>,
}

/// What a dialect read from one event. Borrows from the event: reading a
/// chunk after commit allocates nothing unless a string carries escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// The event's kind.
    pub kind: ChunkKind,
    /// The finish reason, if the event set one.
    pub finish_reason: Option<Cow<'a, str>>,
    /// Usage, if the event reported it. Reports are cumulative and may be
    /// partial (a field not reported is 0): a stream keeps the largest
    /// count of each field it saw.
    pub usage: Option<Usage>,
    /// The chunk identity fields that were present.
    pub identity: ChunkIdentity<'a>,
}

impl Chunk<'_> {
    /// A chunk of the given kind with nothing else.
    pub fn of(kind: ChunkKind) -> Self {
        Self {
            kind,
            finish_reason: None,
            usage: None,
            identity: ChunkIdentity::default(),
        }
    }
}

/// How a failed stream is ended for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TerminalMode {
    /// End with the dialect's error, in the form its clients' SDKs raise:
    /// for chat completions a chunk in the stream's identity with
    /// `finish_reason` set and a top-level `error` object, then `[DONE]`
    /// (the shape OpenRouter documents); for Messages an `error` event.
    /// Clients that only read the finish reason still see the stream ended
    /// in error.
    #[default]
    Raise,
    /// End with the finish reason, the error reported where SDKs do not
    /// look (chat: under `stream_error`), then the end marker: for clients
    /// that must not raise.
    Finish,
    /// Only an error event (`event: error`, `data: {"error":{...}}`), no
    /// end marker after it.
    ErrorEventOnly,
}

/// The facts a terminal event reports about a failure: built with
/// [`TerminalError::new`] and struct update syntax for the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalError {
    /// Human-readable message (already sanitized).
    pub message: String,
    /// The failure's class.
    pub class: FailureClass,
    /// The provider's own error code, when it gave one.
    pub provider_code: Option<String>,
    /// The phase the failure landed in.
    pub phase: Phase,
    /// Bytes sent to the client before the failure.
    pub bytes_sent: u64,
    /// Model output events sent to the client before the failure.
    pub output_events: u64,
}

impl TerminalError {
    /// A terminal error of `class` in `phase` with this message.
    pub fn new(class: FailureClass, phase: Phase, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            class,
            provider_code: None,
            phase,
            bytes_sent: 0,
            output_events: 0,
        }
    }
}

/// An error a gateway answers a client with, in wire-neutral terms; the
/// dialect shapes it ([`Dialect::error_body`]). Built with
/// [`ErrorReply::new`] (a provider's failure) or [`ErrorReply::coded`] (the
/// gateway's own), and struct update syntax for the rest:
/// `ErrorReply { param: Some("model"), ..ErrorReply::coded(class, "invalid_request", message) }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorReply<'a> {
    /// The failure class the error reports.
    pub class: FailureClass,
    /// The gateway's own machine-readable code (`invalid_json`,
    /// `no_available_target`, ...); `None` for a provider's failure, whose
    /// code the dialect derives from the class and `provider_code`.
    pub code: Option<&'a str>,
    /// The provider's own code, when the error is a provider's.
    pub provider_code: Option<&'a str>,
    /// The message (already sanitized).
    pub message: &'a str,
    /// The request field at fault, when known.
    pub param: Option<&'a str>,
}

impl<'a> ErrorReply<'a> {
    /// An error of `class` with this message.
    pub fn new(class: FailureClass, message: &'a str) -> Self {
        Self {
            class,
            code: None,
            provider_code: None,
            message,
            param: None,
        }
    }

    /// The gateway's own error of `class`, under its machine-readable
    /// `code`, with this message.
    pub fn coded(class: FailureClass, code: &'a str, message: &'a str) -> Self {
        Self {
            code: Some(code),
            ..Self::new(class, message)
        }
    }
}

/// A request a dialect has already read. A gateway that read the body to
/// pick a route puts it in the request's extensions, and
/// [`Failover`](crate::failover::Failover) uses it instead of reading the
/// body again: one parse per turn.
#[derive(Debug, Clone)]
pub struct ParsedRequest<R> {
    /// What the request needs from a target.
    pub requirements: Requirements,
    /// What the dialect keeps of the request ([`Dialect::Request`]).
    pub request: R,
}

/// What an error says, as its dialect reads it: the facts classification's
/// contract rules read. A dialect whose errors the classifier does not know
/// by shape (OpenAI, Anthropic, Gemini, vLLM and their relatives it does)
/// reports them here, so its overload is an overload and its bad request a
/// bad request. Built with struct update syntax:
/// `ErrorFacts { kind: Some("overloaded".into()), ..ErrorFacts::default() }`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorFacts {
    /// The error's type (`rate_limit_error`, `overloaded_error`, ...).
    pub kind: Option<String>,
    /// The error's code (`rate_limit_exceeded`, `context_length_exceeded`).
    pub code: Option<String>,
    /// The error's message.
    pub message: Option<String>,
    /// The HTTP status the error names, if it names one.
    pub status: Option<u16>,
    /// How long the provider asks to wait.
    pub retry_after: Option<std::time::Duration>,
}

/// What a dialect found in a whole (non-streaming) answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyCheck {
    /// A valid answer, with what it reported.
    Valid {
        /// Usage, if reported.
        usage: Option<Usage>,
        /// The answering model, if named.
        model: Option<String>,
    },
    /// Not a valid answer (it may still be a provider's error body, which
    /// classification reads).
    Invalid {
        /// What is wrong.
        fault: BodyFault,
        /// What is wrong, for the record.
        message: String,
    },
}

/// What identifies a whole (non-streaming) answer, read for the records
/// and spans (`gen_ai.response.id`, `gen_ai.response.finish_reasons`) by
/// [`Dialect::check_answer`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnswerFacts {
    /// The answer's id, when it has one.
    pub id: Option<String>,
    /// Why the model stopped (the first choice's, as for a stream).
    pub finish_reason: Option<String>,
}

/// Where an error a dialect reads came from.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum ErrorSource<'a> {
    /// An in-band error event of a stream.
    Event(&'a SseEvent),
    /// A whole body (a success status carrying an error).
    Body(&'a [u8]),
}

/// Why a whole answer is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BodyFault {
    /// Not JSON (or cut short).
    NotJson,
    /// JSON, but not the shape of an answer (an array, a scalar).
    UnexpectedJson,
    /// The shape of an answer without the answer (no choices, no content),
    /// or an error where the answer should be.
    NoAnswer,
}

/// A wire dialect. See the [module docs](self).
///
/// `Request` is what the dialect keeps of a parsed client request, to build
/// each target's body without parsing it again.
pub trait Dialect: Clone + Send + Sync + 'static {
    /// What the dialect keeps of a parsed request.
    type Request: Clone + Send + Sync + 'static;

    /// What the dialect keeps of one stream's earlier events to read the
    /// next ([`inspect`](Self::inspect)); `()` when it keeps nothing.
    type Memo: Default + Send + 'static;

    /// Reads a client's request body once: what it needs from a target,
    /// and what the upstream bodies are built from.
    fn read_request(&self, body: Bytes) -> Result<(Requirements, Self::Request), RequestError>;

    /// The body one target receives: the client's request with `model`,
    /// and usage reporting turned on for a stream (so spend can be
    /// counted; usage the client did not ask for is dropped again from the
    /// stream, by [`Chunk::usage`]).
    fn upstream_body(&self, request: &Self::Request, model: &str) -> Bytes;

    /// Sets headers the upstream request needs from the client's (an API
    /// version, a beta flag). Default: none.
    fn upstream_headers(&self, client: &HeaderMap, upstream: &mut HeaderMap) {
        let _ = (client, upstream);
    }

    /// Client request headers of this API that the provider needs to read
    /// the request (an API version, beta flags). The failover layer
    /// forwards them beside its header policy's lists. Default: none.
    fn forwarded_request_headers(&self) -> &'static [&'static str] {
        &[]
    }

    /// Reads the next dispatched event of a stream, with the stream's
    /// `memo` (one per stream, given every event in order), which a
    /// dialect may use to skip work the earlier events already did. The
    /// reading must not depend on the memo: the same kind, finish reason
    /// and usage as for a fresh memo. Identity fields equal to those of an
    /// earlier event may read as `None`.
    fn inspect<'a>(&self, event: &'a SseEvent, memo: &mut Self::Memo) -> Chunk<'a>;

    /// Whether a finish reason seen so far leaves part of the answer open
    /// (a chat stream with `n > 1`: one choice finished, another not). A
    /// stream is whole only when this is `false` at its finish. Default:
    /// `false`.
    fn answer_open(&self, memo: &Self::Memo) -> bool {
        let _ = memo;
        false
    }

    /// The frames that end a failed stream in `identity`, per `mode`.
    fn terminal(
        &self,
        identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes;

    /// The frames that end a failed stream, with the memo of the stream
    /// the client received: the one [`inspect`](Self::inspect) was given
    /// or, for a translated stream, the one
    /// [`encode_event`](Self::encode_event) wrote with. A dialect whose
    /// terminal continues the stream's own counters (the Responses API's
    /// `sequence_number`) reads them there. Default:
    /// [`terminal`](Self::terminal).
    fn stream_terminal(
        &self,
        memo: &Self::Memo,
        identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes {
        let _ = memo;
        self.terminal(identity, finish_reason, error, mode)
    }

    /// The end-of-stream frame to append when a stream finished without one.
    fn done_frame(&self) -> Bytes;

    /// What an error says: an in-band error event (one
    /// [`inspect`](Self::inspect) called [`ChunkKind::Error`]) or an error
    /// carried by a success body. Default `None`: the classifier reads it
    /// with the error shapes it knows.
    fn error_facts(&self, source: ErrorSource<'_>) -> Option<ErrorFacts> {
        let _ = source;
        None
    }

    /// Checks a whole non-streaming answer before it is released and, in
    /// the same pass, reads what identifies it (its id and finish reason)
    /// for the records.
    fn check_answer(&self, body: &[u8]) -> (BodyCheck, AnswerFacts);

    /// The body of an error answer, in the shape this API's clients raise
    /// on. The status is the gateway's to choose.
    fn error_body(&self, error: &ErrorReply<'_>) -> Bytes;

    /// The whole error answer a layer of the gateway gives itself: this
    /// API's status for `status` ([`error_status`](Self::error_status)),
    /// its error body and content type. Every layer that answers (the
    /// failover, budget, limit and identity layers, and
    /// [`UpstreamError::to_response`](crate::classify::UpstreamError::to_response))
    /// builds its answer here.
    fn error_response(&self, status: StatusCode, error: &ErrorReply<'_>) -> http::Response<Bytes> {
        let mut response = http::Response::new(self.error_body(error));
        *response.status_mut() = self.error_status(error.class, status);
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(self.error_content_type()),
        );
        response
    }

    /// The content type of [`error_body`](Self::error_body).
    fn error_content_type(&self) -> &'static str {
        "application/json"
    }

    /// The status this API's clients expect for an error of `class` the
    /// gateway answers with `status` (Anthropic's overloaded API is a 529,
    /// not a 503). Default: `status`.
    fn error_status(&self, class: FailureClass, status: StatusCode) -> StatusCode {
        let _ = class;
        status
    }

    /// The dialect's name, as configuration, records and refusals say it
    /// (`openai-chat`, `anthropic-messages`). Default: `custom`.
    fn name(&self) -> &'static str {
        "custom"
    }

    /// The path a request of this dialect is sent to when the client spoke
    /// another dialect (`/v1/chat/completions`, `/v1/messages`); the
    /// upstream client joins it to the provider's base URL as it joins a
    /// client's path. Default: `None`, the client's path.
    fn upstream_path(&self) -> Option<&'static str> {
        None
    }

    /// The client's request in the [neutral model](NeutralRequest), for a
    /// target of another dialect. `Err` says why this request cannot be
    /// translated. Default: this dialect does not translate.
    fn to_neutral(&self, request: &Self::Request) -> Result<NeutralRequest, String> {
        let _ = request;
        Err(format!("the {} dialect does not translate", self.name()))
    }

    /// The body a target of this dialect receives for a request of another
    /// dialect, read into the neutral model, with `model` as the target's
    /// model. The failover layer has already fitted the request to the
    /// target (output limit clipped or defaulted, history it cannot take
    /// removed). `Err` names what the request needs that this dialect
    /// cannot express (`"n > 1"`): the target is then ineligible, and the
    /// refusal says why. Default: this dialect does not translate.
    fn body_from_neutral(&self, request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
        let _ = (request, model);
        Err(format!("the {} dialect does not translate", self.name()))
    }

    /// Reads one event of this dialect's stream into neutral events, with a
    /// memo of its own (one per stream, given every event in order; not
    /// the one [`inspect`](Self::inspect) is given). Default: nothing.
    fn decode_event(&self, event: &SseEvent, memo: &mut Self::Memo, out: &mut Vec<NeutralEvent>) {
        let _ = (event, memo, out);
    }

    /// Writes one neutral event as this dialect's stream, with the memo of
    /// the stream being written (one per stream). Default: nothing.
    fn encode_event(&self, event: &NeutralEvent, memo: &mut Self::Memo, out: &mut BytesMut) {
        let _ = (event, memo, out);
    }

    /// The identity of a stream this dialect wrote with
    /// [`encode_event`](Self::encode_event), in this dialect's form: what
    /// its [`terminal`](Self::terminal) event carries. Default: none.
    fn encoded_identity<'m>(&self, memo: &'m Self::Memo) -> ChunkIdentity<'m> {
        let _ = memo;
        ChunkIdentity::default()
    }

    /// Reads a whole answer of this dialect (one
    /// [`check_answer`](Self::check_answer) found valid) as the neutral
    /// events a stream of it would have given. Default: `None`, no
    /// translation.
    fn decode_answer(&self, body: &[u8]) -> Option<Vec<NeutralEvent>> {
        let _ = body;
        None
    }

    /// Writes a whole answer of this dialect from neutral events
    /// ([`decode_answer`](Self::decode_answer) of another dialect).
    /// Default: `None`, no translation.
    fn encode_answer(&self, events: &[NeutralEvent]) -> Option<Bytes> {
        let _ = events;
        None
    }
}
