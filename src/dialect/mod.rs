//! Wire dialects: what each SSE event of a model's stream means.
//!
//! A [`Dialect`] reads one dispatched [`SseEvent`] and says whether it carries
//! model output (which commits the stream), a finish reason, usage, an in-band
//! error, the end-of-stream marker, or only preamble (role chunks, empty
//! deltas, keep-alives). It also writes the synthetic frames a gateway needs:
//! the terminal chunk that ends a failed stream and the end marker.
//!
//! [`OpenAiChat`] speaks OpenAI `chat.completion.chunk` streams, the format of
//! every OpenAI-compatible provider. Other dialects (Anthropic Messages
//! events) implement the same trait beside it.
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
//!         kinds.push(OpenAiChat.inspect(&event).kind);
//!     }
//! });
//! assert_eq!(kinds, [ChunkKind::Preamble, ChunkKind::Output, ChunkKind::Done]);
//! ```

#[cfg(test)]
mod differential;
mod openai;
#[cfg(test)]
mod oracle;
mod skim;

use std::borrow::Cow;

use bytes::Bytes;

use crate::classify::Phase;
use crate::sse::SseEvent;

pub use openai::OpenAiChat;

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

/// Token usage a provider reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub prompt_tokens: u64,
    /// Output (completion) tokens.
    pub completion_tokens: u64,
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
    /// Usage, if the event reported it.
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

    /// Whether this event commits the stream: model output or a finish reason.
    pub fn commits(&self) -> bool {
        self.kind == ChunkKind::Output || self.finish_reason.is_some()
    }
}

/// How a failed stream is ended for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TerminalMode {
    /// A chunk in the stream's identity with `finish_reason` set and a
    /// top-level `error` object, then `[DONE]`. The official OpenAI SDKs raise
    /// it as an API error; clients that only read `finish_reason` still see
    /// the stream ended in error. The shape OpenRouter documents.
    #[default]
    ErrorChunk,
    /// The same chunk with the error under a non-standard key
    /// (`stream_error`), then `[DONE]`, for clients that must not raise.
    FinishReasonOnly,
    /// A bare `event: error` with `data: {"error":{...}}`, nothing after it.
    ErrorEvent,
}

/// The facts a terminal chunk reports about a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalError {
    /// Human-readable message (already sanitized).
    pub message: String,
    /// Error type, e.g. the provider's own or `upstream_error`.
    pub error_type: String,
    /// Error code, e.g. the failure class.
    pub code: String,
    /// The phase the failure landed in.
    pub phase: Phase,
    /// Bytes sent to the client before the failure.
    pub bytes_sent: u64,
    /// Model output events sent to the client before the failure.
    pub output_events: u64,
}

/// A stream's wire dialect. See the [module docs](self).
pub trait Dialect: Clone + Send + Sync + 'static {
    /// Reads one dispatched event.
    fn inspect<'a>(&self, event: &'a SseEvent) -> Chunk<'a>;

    /// The frames that end a failed stream in `identity`, per `mode`.
    fn terminal(
        &self,
        identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes;

    /// The end-of-stream frame to append when a stream finished without one.
    fn done_frame(&self) -> Bytes;
}
