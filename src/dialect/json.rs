//! Readers of JSON values the dialects' translations share, and the
//! pieces of the neutral model's mapping every dialect writes alike.

use serde_json::{Map, Value};

use super::ToolSpec;

/// A member that is present and not `null`.
pub(crate) fn present<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|v| !v.is_null())
}

/// A string member of a value (`None` when absent or not a string).
pub(crate) fn str_of<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// A string member, owned; empty when absent.
pub(crate) fn string_of(value: &Value, key: &str) -> String {
    str_of(value, key).unwrap_or_default().to_owned()
}

/// The elements of an array value (none when it is absent or no array).
pub(crate) fn array(value: Option<&Value>) -> impl Iterator<Item = &Value> {
    value.and_then(Value::as_array).into_iter().flatten()
}

/// The current Unix time, for an answer whose source gave none.
pub(crate) fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A function's definition (`{name, description, parameters, strict}`):
/// chat's `function` object and a Responses function tool alike.
pub(crate) fn read_function(function: &Value) -> Result<ToolSpec, String> {
    let name = str_of(function, "name").ok_or_else(|| "a tool without a name".to_owned())?;
    Ok(ToolSpec {
        name: name.to_owned(),
        description: str_of(function, "description").map(str::to_owned),
        // Absent parameters stay `Null`: a function without arguments.
        parameters: function.get("parameters").cloned().unwrap_or(Value::Null),
        strict: function.get("strict").and_then(Value::as_bool),
    })
}

/// The reasoning effort closest to a thinking budget (0: the target's own
/// budget, the middle effort).
pub(crate) fn effort_of_budget(budget: u64) -> &'static str {
    match budget {
        0 => "medium",
        1..=2048 => "low",
        2049..=8192 => "medium",
        _ => "high",
    }
}
