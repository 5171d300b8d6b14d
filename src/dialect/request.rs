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
/// body by its [`Dialect`](super::Dialect). A dialect outside this crate
/// builds it from [`Requirements::new`]:
/// `Requirements { stream: true, ..Requirements::new("gpt-x") }`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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
    /// A message has a document part (a PDF, a text file).
    pub document_input: bool,
    /// The request turns on the model's reasoning (extended thinking).
    pub reasoning: bool,
    /// Estimated prompt tokens (about four bytes of text per token, plus a
    /// few tokens per message); an estimate for eligibility and spend, not
    /// a tokenizer's count.
    pub input_tokens: u64,
    /// `max_completion_tokens` or `max_tokens`.
    pub max_output_tokens: Option<u64>,
    /// Tools the provider runs itself (the Responses API's `web_search`,
    /// `file_search`, `code_interpreter`, `computer_use_preview`, `mcp`),
    /// by type. Only a target that speaks the clients' dialect and hosts
    /// each of them is eligible
    /// ([`Capabilities::hosted_tools`](crate::failover::Capabilities::hosted_tools)).
    pub hosted_tools: Vec<String>,
    /// State the provider that created it holds (`previous_response_id`,
    /// a `conversation`): the turn is bound to that provider.
    pub provider_state: Option<ProviderState>,
    /// The request asks the provider to keep the answer (the Responses
    /// API's `store`, on by default there), so a later turn may continue
    /// it: the gateway remembers which provider answered.
    pub store: bool,
}

/// State held by the provider that created it, which a request continues
/// (the Responses API's `previous_response_id` or `conversation`). Such a
/// turn is eligible only on targets of that provider (its name stands for
/// its account: two accounts of one provider are two provider names), and
/// of the clients' own dialect: no other provider holds the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderState {
    /// The request field that names it (`previous_response_id`).
    pub field: &'static str,
    /// The id it names (`resp_…`, `conv_…`).
    pub id: String,
}

impl Requirements {
    /// The requirements of a request for `model` that needs nothing else.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            ..Self::default()
        }
    }
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
    /// Any other field a dialect requires is missing or wrong.
    #[error("'{field}' {problem}")]
    Invalid {
        /// The request field at fault.
        field: &'static str,
        /// What is wrong with it ("is required", "must be a string", ...).
        problem: &'static str,
    },
    /// A field the gateway and the provider must read alike has another
    /// type than the API's (`"stream": "true"`, `"n": 2.0`): a lenient
    /// provider would coerce it and answer what the gateway did not expect.
    #[error("'{field}' must be {expected}")]
    WrongType {
        /// The request field at fault.
        field: &'static str,
        /// What it must be ("a boolean", "a non-negative integer", ...).
        expected: &'static str,
    },
}

impl RequestError {
    /// The stable machine-readable code a client is answered with:
    /// `invalid_json`, `invalid_type` for [`WrongType`](Self::WrongType),
    /// else `invalid_request`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotJson(_) => "invalid_json",
            Self::WrongType { .. } => "invalid_type",
            _ => "invalid_request",
        }
    }

    /// The request field at fault, when one is.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Self::MissingMessages => Some("messages"),
            Self::MissingModel => Some("model"),
            Self::Invalid { field, .. } | Self::WrongType { field, .. } => Some(field),
            Self::NotJson(_) | Self::NotObject => None,
        }
    }
}
