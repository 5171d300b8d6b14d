//! What a request needs from a target, in wire-neutral terms.

/// The `response_format` a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFormat {
    /// `{"type": "json_object"}`.
    JsonObject,
    /// `{"type": "json_schema", ...}`.
    JsonSchema,
}

/// What a request needs from a target, read once from the client's request
/// body by its [`Dialect`](super::Dialect).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Requirements {
    /// The client's `model`.
    pub model: String,
    /// `tools` (or legacy `functions`) is present and non-empty.
    pub tools: bool,
    /// `parallel_tool_calls: true` with tools.
    pub parallel_tool_calls: bool,
    /// The `response_format` kind, when structured output is asked for.
    pub response_format: Option<ResponseFormat>,
    /// `stream: true`.
    pub stream: bool,
    /// The client asked for `stream_options.include_usage`.
    pub include_usage: bool,
    /// A message has an image part.
    pub image_input: bool,
    /// Estimated prompt tokens (about four bytes of text per token, plus a
    /// few tokens per message); an estimate for eligibility and spend, not
    /// a tokenizer's count.
    pub prompt_tokens: u64,
    /// `max_completion_tokens` or `max_tokens`.
    pub max_output_tokens: Option<u64>,
}

/// Why a request body cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The body is not JSON.
    #[error("the request body is not valid JSON: {0}")]
    NotJson(String),
    /// The body is JSON but not an object.
    #[error("the request body must be a JSON object")]
    NotObject,
    /// `messages` is missing or not an array.
    #[error("'messages' is required and must be an array")]
    MissingMessages,
    /// `model` is missing or not a string.
    #[error("'model' is required and must be a string")]
    MissingModel,
}
