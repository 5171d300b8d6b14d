//! Checking tool-call arguments against the tools' JSON Schemas.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use jsonschema::error::ValidationErrorKind;
use jsonschema::{ValidationError, Validator};
use serde_json::Value;

use super::error::ActionError;
use super::id::ToolCall;

/// A tool's `parameters` schema that could not be compiled.
#[derive(Debug, thiserror::Error)]
#[error("schema of tool `{tool}` is unusable: {message}")]
#[non_exhaustive]
pub struct SchemaError {
    /// The tool.
    pub tool: String,
    /// Why the schema was rejected.
    pub message: String,
}

/// Compiled `parameters` schemas by tool name, checked before any claim.
///
/// Schemas are compiled offline: a `$ref` to anything outside the schema
/// itself (`https://`, `file://`) makes compilation fail instead of fetching
/// it. Cheap to clone.
#[derive(Clone, Default)]
pub struct ToolSchemas {
    tools: Arc<HashMap<String, Arc<Validator>>>,
}

impl fmt::Debug for ToolSchemas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.tools.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("ToolSchemas")
            .field("tools", &names)
            .finish()
    }
}

impl ToolSchemas {
    /// No schemas.
    pub fn new() -> Self {
        Self::default()
    }

    /// Compiles the schemas of a chat request's `tools` (the whole request
    /// body, or just its `tools` array): each `tools[].function.parameters`.
    /// A function without `parameters` takes an object with any members.
    ///
    /// # Errors
    ///
    /// [`SchemaError`] when a function has no name or a schema does not compile.
    pub fn from_request(request: &Value) -> Result<Self, SchemaError> {
        let tools = match request {
            Value::Array(tools) => tools.as_slice(),
            other => other
                .get("tools")
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice),
        };
        let mut schemas = Self::new();
        for tool in tools {
            let function = tool.get("function").unwrap_or(tool);
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| SchemaError {
                    tool: String::new(),
                    message: "a tool has no function name".to_owned(),
                })?;
            let fallback = serde_json::json!({ "type": "object" });
            let parameters = function.get("parameters").unwrap_or(&fallback);
            schemas = schemas.with_tool(name, parameters)?;
        }
        Ok(schemas)
    }

    /// Adds (or replaces) the schema of `tool`.
    ///
    /// # Errors
    ///
    /// [`SchemaError`] when the schema does not compile, including a `$ref`
    /// that would need fetching.
    pub fn with_tool(
        mut self,
        tool: impl Into<String>,
        parameters: &Value,
    ) -> Result<Self, SchemaError> {
        let tool = tool.into();
        let validator = jsonschema::options()
            .offline()
            .build(parameters)
            .map_err(|e| SchemaError {
                tool: tool.clone(),
                message: e.to_string(),
            })?;
        Arc::make_mut(&mut self.tools).insert(tool, Arc::new(validator));
        Ok(self)
    }

    /// Whether a schema for `tool` is known.
    pub fn contains(&self, tool: &str) -> bool {
        self.tools.contains_key(tool)
    }

    /// Checks `call`'s arguments against its tool's schema.
    ///
    /// # Errors
    ///
    /// [`ActionError::InvalidArguments`] naming the first failing field by its
    /// JSON pointer (for a missing required member, the pointer of that
    /// member), or [`ActionError::UnknownTool`] when there is no schema for
    /// the tool.
    pub fn validate(&self, call: &ToolCall) -> Result<(), ActionError> {
        let Some(validator) = self.tools.get(&call.tool) else {
            return Err(ActionError::UnknownTool {
                tool: call.tool.clone(),
            });
        };
        match validator.validate(&call.arguments) {
            Ok(()) => Ok(()),
            Err(error) => Err(ActionError::InvalidArguments {
                tool: call.tool.clone(),
                path: failing_path(&error),
                message: error.to_string(),
            }),
        }
    }
}

/// The JSON pointer of the field at fault. For `required` the instance path
/// is the parent object; name the missing member instead.
fn failing_path(error: &ValidationError<'_>) -> String {
    let mut path = error.instance_path().to_string();
    if let ValidationErrorKind::Required { property } = error.kind() {
        let member = match property {
            Value::String(name) => name.clone(),
            other => other.to_string(),
        };
        path.push('/');
        path.push_str(&member.replace('~', "~0").replace('/', "~1"));
    }
    path
}
