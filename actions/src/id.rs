//! Action ids and the tool call the executor layer runs.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::error::ActionError;

/// The application's name for one effect, for example `send-order-847`,
/// optionally in a tenant's namespace.
///
/// It is independent of model attempts, `tool_call` ids and retries: two
/// model attempts that propose the same effect must carry the same action id,
/// and that is what makes the effect run once. Cheap to clone.
///
/// **Tenants.** An id is unique within its tenant: `call_0` of tenant `acme`
/// and `call_0` of tenant `globex` are two actions, stored under two keys,
/// each run once with its own result. A gateway serving several tenants
/// sets the tenant on every call ([`ToolCall::with_tenant`], usually from
/// the request's `ClientId` (`tower_llm_failover::identity`)), so ids that
/// collide across tenants (provider-derived ones such as `call_0`) never
/// answer one tenant with another's result. An id without a tenant is in
/// a namespace of its own, apart from every tenant's.
///
/// [`as_str`](Self::as_str) and [`Display`](fmt::Display) give the
/// application's id alone; [`tenant`](Self::tenant) the namespace;
/// equality, hashing and stores use both.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActionId {
    tenant: Option<Arc<str>>,
    id: Arc<str>,
}

impl ActionId {
    /// Wraps the application's id, in no tenant's namespace.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self {
            tenant: None,
            id: id.into(),
        }
    }

    /// The same id in `tenant`'s namespace. An empty tenant is no tenant
    /// (one spelling of "none").
    pub fn with_tenant(mut self, tenant: impl Into<Arc<str>>) -> Self {
        let tenant = tenant.into();
        self.tenant = (!tenant.is_empty()).then_some(tenant);
        self
    }

    /// The application's id as a string slice (without the tenant).
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The tenant whose namespace the id is in, if any.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }
}

impl fmt::Debug for ActionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tenant {
            Some(tenant) => write!(f, "{:?}/{:?}", &**tenant, &*self.id),
            None => fmt::Debug::fmt(&*self.id, f),
        }
    }
}

impl fmt::Display for ActionId {
    /// The application's id alone: what error messages name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
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
        &self.id
    }
}

/// The serialized forms: a string (no tenant, as before tenants existed)
/// or `{"tenant": "...", "id": "..."}`.
#[derive(Serialize)]
#[serde(untagged)]
enum Wire<'a> {
    Plain(&'a str),
    Tenant { tenant: &'a str, id: &'a str },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum WireOwned {
    Plain(String),
    Tenant { tenant: String, id: String },
}

impl Serialize for ActionId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.tenant {
            None => Wire::Plain(&self.id),
            Some(tenant) => Wire::Tenant {
                tenant,
                id: &self.id,
            },
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ActionId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match WireOwned::deserialize(deserializer)? {
            WireOwned::Plain(id) => Self::new(id),
            WireOwned::Tenant { tenant, id } => Self::new(id).with_tenant(tenant),
        })
    }
}

/// One proposed tool call, as the executor layer receives it.
///
/// `action_id` decides whether the effect runs; `attempt_id` names the model
/// attempt that proposed it and only goes into records and traces.
///
/// Build it with [`ToolCall::new`] (or [`ToolCall::from_openai`]),
/// [`with_attempt_id`](ToolCall::with_attempt_id) and, when the gateway
/// serves several tenants, [`with_tenant`](ToolCall::with_tenant); more
/// fields may be added.
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

    /// Puts the action id in `tenant`'s namespace (see [`ActionId`]): the
    /// same id from two tenants is two actions, each run once with its own
    /// result. A gateway takes the tenant from the request:
    ///
    /// ```
    /// # use serde_json::json;
    /// # use tower_llm_actions::ToolCall;
    /// use tower_llm_failover::identity::ClientId;
    ///
    /// # let mut extensions = http::Extensions::new();
    /// # extensions.insert(ClientId::key("k1").with_tenant("acme"));
    /// // `extensions`: the chat request's, where the identity layer put the client.
    /// let client = ClientId::of(&extensions);
    /// let mut call = ToolCall::new("call_0", "send_order", json!({ "sku": "A-1" }));
    /// if let Some(tenant) = client.tenant() {
    ///     call = call.with_tenant(tenant);
    /// }
    /// assert_eq!(call.action_id.tenant(), Some("acme"));
    /// ```
    pub fn with_tenant(mut self, tenant: impl Into<Arc<str>>) -> Self {
        self.action_id = self.action_id.with_tenant(tenant);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant's id is another action than the same id of another tenant
    /// or of none; it serializes with its tenant and reads back.
    #[test]
    fn a_tenant_namespaces_the_id() {
        let plain = ActionId::new("call_0");
        let acme = ActionId::new("call_0").with_tenant("acme");
        let globex = ActionId::new("call_0").with_tenant("globex");
        assert_ne!(plain, acme);
        assert_ne!(acme, globex);
        assert_eq!(ActionId::new("call_0").with_tenant(""), plain);
        assert_eq!((acme.as_str(), acme.tenant()), ("call_0", Some("acme")));
        assert_eq!(acme.to_string(), "call_0");
        assert_eq!(format!("{acme:?}"), r#""acme"/"call_0""#);

        assert_eq!(
            serde_json::to_value(&plain).ok(),
            Some(Value::from("call_0"))
        );
        let json = serde_json::to_value(&acme).ok();
        assert_eq!(
            json,
            Some(serde_json::json!({ "tenant": "acme", "id": "call_0" }))
        );
        let back: Option<ActionId> = json.and_then(|j| serde_json::from_value(j).ok());
        assert_eq!(back, Some(acme));
        let old: Option<ActionId> = serde_json::from_str(r#""call_0""#).ok();
        assert_eq!(old, Some(plain));
    }
}
