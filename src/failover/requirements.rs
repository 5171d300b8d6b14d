use serde_json::Value;

/// The `response_format` a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFormat {
    /// `{"type": "json_object"}`.
    JsonObject,
    /// `{"type": "json_schema", ...}`.
    JsonSchema,
}

/// What a chat completion request needs from a target, read once from the
/// client's request body.
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
    /// Estimated prompt tokens (about four bytes of text per token, plus a
    /// few tokens per message); an estimate for eligibility and spend, not
    /// a tokenizer's count.
    pub prompt_tokens: u64,
    /// `max_completion_tokens` or `max_tokens`.
    pub max_output_tokens: Option<u64>,
}

/// Why a request body cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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

impl Requirements {
    /// Reads the requirements of a parsed chat completion request.
    pub fn from_request(body: &Value) -> Result<Self, RequestError> {
        let object = body.as_object().ok_or(RequestError::NotObject)?;
        let messages = object
            .get("messages")
            .and_then(Value::as_array)
            .ok_or(RequestError::MissingMessages)?;
        let model = object
            .get("model")
            .and_then(Value::as_str)
            .ok_or(RequestError::MissingModel)?
            .to_owned();
        let non_empty = |key: &str| {
            object
                .get(key)
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
        };
        let tools = non_empty("tools") || non_empty("functions");
        let response_format = match object
            .get("response_format")
            .and_then(|f| f.get("type"))
            .and_then(Value::as_str)
        {
            Some("json_schema") => Some(ResponseFormat::JsonSchema),
            Some("json_object") => Some(ResponseFormat::JsonObject),
            _ => None,
        };
        let mut text_bytes = 0u64;
        let mut image_input = false;
        for message in messages {
            text_bytes += 16; // role and framing
            match message.get("content") {
                Some(Value::String(text)) => text_bytes += text.len() as u64,
                Some(Value::Array(parts)) => {
                    for part in parts {
                        if let Some("image_url" | "input_image" | "image") =
                            part.get("type").and_then(Value::as_str)
                        {
                            image_input = true;
                        }
                        if let Some(text) = part.get("text").and_then(Value::as_str) {
                            text_bytes += text.len() as u64;
                        }
                    }
                }
                _ => {}
            }
            if let Some(calls) = message.get("tool_calls") {
                text_bytes += calls.to_string().len() as u64;
            }
        }
        if let Some(tools) = object.get("tools") {
            text_bytes += tools.to_string().len() as u64;
        }
        let max_output_tokens = object
            .get("max_completion_tokens")
            .or_else(|| object.get("max_tokens"))
            .and_then(Value::as_u64);
        Ok(Self {
            model,
            tools,
            parallel_tool_calls: tools
                && object
                    .get("parallel_tool_calls")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            response_format,
            stream: object
                .get("stream")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            include_usage: object
                .get("stream_options")
                .and_then(|o| o.get("include_usage"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
            image_input,
            prompt_tokens: text_bytes.div_ceil(4),
            max_output_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_a_request_needs() {
        let body = serde_json::json!({
            "model": "gpt-x",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": 100,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "parallel_tool_calls": true,
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:..."}}
                ]}
            ]
        });
        let r = Requirements::from_request(&body).unwrap();
        assert_eq!(r.model, "gpt-x");
        assert!(r.tools && r.parallel_tool_calls && r.stream && r.include_usage && r.image_input);
        assert_eq!(r.response_format, Some(ResponseFormat::JsonSchema));
        assert_eq!(r.max_output_tokens, Some(100));
        assert!(r.prompt_tokens > 10);
    }

    #[test]
    fn rejects_bodies_without_messages_or_model() {
        assert_eq!(
            Requirements::from_request(&serde_json::json!({"model": "m"})),
            Err(RequestError::MissingMessages)
        );
        assert_eq!(
            Requirements::from_request(&serde_json::json!({"messages": []})),
            Err(RequestError::MissingModel)
        );
        assert_eq!(
            Requirements::from_request(&serde_json::json!([1])),
            Err(RequestError::NotObject)
        );
    }
}
