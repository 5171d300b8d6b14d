//! The OpenAI chat completions dialect: `/v1/chat/completions` requests,
//! `chat.completion.chunk` streams, `chat.completion` bodies and
//! `{"error":{...}}` error bodies — the format of every OpenAI-compatible
//! provider.

mod reply;
mod request;
pub(crate) mod skim;
mod stream;
mod translate;

use bytes::{Bytes, BytesMut};

pub use request::ChatRequest;

use super::{
    AnswerFacts, BodyCheck, Chunk, ChunkIdentity, Dialect, ErrorReply, RequestError, Requirements,
    TerminalError, TerminalMode,
};
use super::{NeutralEvent, NeutralRequest};
use crate::sse::SseEvent;

/// What the chat dialect keeps of a stream's earlier events: the last
/// valid chunk's text before `choices` (so the next chunk's shared prefix
/// is skipped), and which choices appeared and finished.
#[derive(Debug, Default)]
pub struct ChatMemo {
    prefix: skim::ChunkPrefix,
    choices: skim::ChoiceSet,
    /// What translation keeps of the stream (unused when not translating).
    translation: translate::StreamMemo,
}

/// The OpenAI chat completions dialect.
///
/// Output is a non-empty `delta.content`, any `delta.tool_calls`, a non-empty
/// `delta.refusal`, `delta.reasoning_content` (DeepSeek, older vLLM) or
/// `delta.reasoning` (vLLM, Ollama, OpenRouter). Reasoning counts as output:
/// the client has seen bytes of the model's answer. An in-band error is an
/// `event: error` or data carrying a truthy top-level `error` (OpenAI, vLLM,
/// Gemini, OpenRouter's `finish_reason: "error"` chunk). Empty `choices`
/// (usage chunk, Azure's prompt-filter chunk) are never indexed.
///
/// Upstream bodies are the client's bytes with `model` spliced in and, for
/// streams, `stream_options.include_usage` turned on.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenAiChat;

impl Dialect for OpenAiChat {
    type Request = ChatRequest;
    type Memo = ChatMemo;

    fn read_request(&self, body: Bytes) -> Result<(Requirements, ChatRequest), RequestError> {
        request::read(body)
    }

    fn upstream_body(&self, request: &ChatRequest, model: &str) -> Bytes {
        request::upstream_body(request, model)
    }

    fn inspect<'a>(&self, event: &'a SseEvent, memo: &mut ChatMemo) -> Chunk<'a> {
        stream::inspect_next(event, &mut memo.prefix, &mut memo.choices)
    }

    fn answer_open(&self, memo: &ChatMemo) -> bool {
        memo.choices.open()
    }

    fn terminal(
        &self,
        identity: &ChunkIdentity<'_>,
        finish_reason: &str,
        error: &TerminalError,
        mode: TerminalMode,
    ) -> Bytes {
        stream::terminal(identity, finish_reason, error, mode)
    }

    fn done_frame(&self) -> Bytes {
        Bytes::from_static(stream::DONE_FRAME)
    }

    fn check_answer(&self, body: &[u8]) -> (BodyCheck, AnswerFacts) {
        reply::check_answer(body)
    }

    fn error_body(&self, error: &ErrorReply<'_>) -> Bytes {
        reply::error_body(error)
    }

    fn name(&self) -> &'static str {
        "openai-chat"
    }

    fn upstream_path(&self) -> Option<&'static str> {
        Some("/v1/chat/completions")
    }

    fn to_neutral(&self, request: &ChatRequest) -> Result<NeutralRequest, String> {
        translate::to_neutral(request)
    }

    fn body_from_neutral(&self, request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
        translate::body_from_neutral(request, model)
    }

    fn decode_event(&self, event: &SseEvent, memo: &mut ChatMemo, out: &mut Vec<NeutralEvent>) {
        translate::decode_event(event, &mut memo.translation, out);
    }

    fn encode_event(&self, event: &NeutralEvent, memo: &mut ChatMemo, out: &mut BytesMut) {
        translate::encode_event(event, &mut memo.translation, out);
    }

    fn encoded_identity<'m>(&self, memo: &'m ChatMemo) -> ChunkIdentity<'m> {
        memo.translation.identity()
    }

    fn decode_answer(&self, body: &[u8]) -> Option<Vec<NeutralEvent>> {
        translate::decode_answer(body)
    }

    fn encode_answer(&self, events: &[NeutralEvent]) -> Option<Bytes> {
        Some(translate::encode_answer(events))
    }
}

// Test-only modules last: a test item above the public ones would hide
// them from the public-item count.
#[cfg(test)]
mod differential;
#[cfg(test)]
mod oracle;
