//! Action ids and the tool call the executor layer runs.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::error::ActionError;

/// The application's name for one effect, for example `send-order-847`.
///
/// It is independent of model attempts, `tool_call` ids and retries: two
/// model attempts that propose the same effect must carry the same action id,
/// and that is what makes the effect run once. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActionId(Arc<str>);

impl ActionId {
    /// Wraps the application's id.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ActionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ActionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ActionId {
    fn from(id: &str) -> Self {
        Self::new(id)
    }
}

impl From<String> for ActionId {
    fn from(id: String) -> Self {
        Self::new(id)
    }
}

impl AsRef<str> for ActionId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Serialize for ActionId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ActionId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::from)
    }
}

/// One proposed tool call, as the executor layer receives it.
///
/// `action_id` decides whether the effect runs; `attempt_id` names the model
/// attempt that proposed it and only goes into records and traces.
///
/// Build it with [`ToolCall::new`] (or [`ToolCall::from_openai`]) and
/// [`with_attempt_id`](ToolCall::with_attempt_id); more fields may be added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolCall {
    /// The application's id for the effect.
    pub action_id: ActionId,
    /// The model attempt that proposed this call, for records only.
    pub attempt_id: Option<String>,
    /// The tool (function) name.
    pub tool: String,
    /// The parsed arguments.
    pub arguments: Value,
}

impl ToolCall {
    /// A call of `tool` with `arguments` for the action `action_id`.
    pub fn new(action_id: impl Into<ActionId>, tool: impl Into<String>, arguments: Value) -> Self {
        Self {
            action_id: action_id.into(),
            attempt_id: None,
            tool: tool.into(),
            arguments,
        }
    }

    /// Records which model attempt proposed this call.
    pub fn with_attempt_id(mut self, attempt_id: impl Into<String>) -> Self {
        self.attempt_id = Some(attempt_id.into());
        self
    }

    /// Builds a call from an OpenAI `tool_calls[]` element
    /// (`{"id", "type": "function", "function": {"name", "arguments"}}`),
    /// whose `arguments` is a JSON-encoded string.
    ///
    /// The model's `tool_call` id is deliberately not used as the action id:
    /// a backup model proposes the same effect under a different one.
    ///
    /// # Errors
    ///
    /// [`ActionError::InvalidArguments`] when the element has no function
    /// name or its arguments are not a JSON string holding valid JSON.
    pub fn from_openai(
        action_id: impl Into<ActionId>,
        tool_call: &Value,
    ) -> Result<Self, ActionError> {
        let function = tool_call.get("function");
        let tool = function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| ActionError::InvalidArguments {
                tool: String::new(),
                path: "/function/name".to_owned(),
                message: "tool call has no function name".to_owned(),
            })?;
        let arguments = match function.and_then(|f| f.get("arguments")) {
            None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
            Some(Value::String(raw)) if raw.trim().is_empty() => {
                Value::Object(serde_json::Map::new())
            }
            Some(Value::String(raw)) => {
                serde_json::from_str(raw).map_err(|e| ActionError::InvalidArguments {
                    tool: tool.to_owned(),
                    path: String::new(),
                    message: format!("arguments are not valid JSON: {e}"),
                })?
            }
            // Some providers already send an object; accept it as is.
            Some(other) => other.clone(),
        };
        Ok(Self::new(action_id, tool, arguments))
    }
}
