use std::sync::Arc;

use crate::dialect::foreign::ForeignDialect;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use crate::classify::{Classifier, Classify, ClassifyLayer};
use crate::{Cost, budget::Pricing};

use crate::dialect::{Requirements, ResponseFormat};

/// What a target can do. A request is sent only to targets whose
/// capabilities satisfy it.
///
/// The defaults assume a capable target (everything `true`, no declared
/// limits): a gateway that declares nothing routes everything everywhere.
/// Declare what a target lacks to keep requests that need it away. Plain
/// data: set the fields you need, the rest from `Default`.
///
/// ```
/// use tower_llm_failover::failover::Capabilities;
///
/// let text_only = Capabilities {
///     tools: false,
///     image_input: false,
///     document_input: false,
///     context_window: Some(32_000),
///     ..Capabilities::default()
/// };
/// # let _ = text_only;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Function/tool calling (`tools`).
    pub tools: bool,
    /// Several tool calls in one turn (`parallel_tool_calls`).
    pub parallel_tool_calls: bool,
    /// `response_format: {"type": "json_schema"}`.
    pub json_schema: bool,
    /// `response_format: {"type": "json_object"}`.
    pub json_object: bool,
    /// `stream: true`.
    pub streaming: bool,
    /// Image parts in messages.
    pub image_input: bool,
    /// Document parts in messages (PDFs, text files).
    pub document_input: bool,
    /// Reasoning (extended thinking) on request.
    pub reasoning: bool,
    /// Context window in tokens, when declared.
    pub context_window: Option<u64>,
    /// Largest `max_tokens` the target accepts, when declared. A request
    /// of the target's own dialect asking for more makes it ineligible; a
    /// translated request (another dialect's client) is clipped to it.
    pub max_output_tokens: Option<u64>,
    /// The output limit sent to this target when a client of another
    /// dialect set none (Messages requires `max_tokens`; a Messages target
    /// without this declared gets 4,096).
    pub default_output_tokens: Option<u64>,
    /// The provider-hosted tools this target runs (`web_search`,
    /// `file_search`, ...; [`Requirements::hosted_tools`]). `None`, the
    /// default: any its request names (the provider decides). A target of
    /// another dialect than the clients' runs none, whatever this says.
    pub hosted_tools: Option<Vec<String>>,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            tools: true,
            parallel_tool_calls: true,
            json_schema: true,
            json_object: true,
            streaming: true,
            image_input: true,
            document_input: true,
            reasoning: true,
            context_window: None,
            max_output_tokens: None,
            default_output_tokens: None,
            hosted_tools: None,
        }
    }
}

impl Capabilities {
    /// What of `requirements` this target lacks; empty when eligible.
    pub fn missing(&self, requirements: &Requirements) -> Vec<String> {
        let mut missing = Vec::new();
        if requirements.tools && !self.tools {
            missing.push("tools".to_owned());
        }
        if requirements.parallel_tool_calls && !self.parallel_tool_calls {
            missing.push("parallel tool calls".to_owned());
        }
        match requirements.response_format {
            Some(ResponseFormat::JsonSchema) if !self.json_schema => {
                missing.push("response_format json_schema".to_owned());
            }
            Some(ResponseFormat::JsonObject) if !self.json_object => {
                missing.push("response_format json_object".to_owned());
            }
            _ => {}
        }
        if requirements.stream && !self.streaming {
            missing.push("streaming".to_owned());
        }
        if requirements.image_input && !self.image_input {
            missing.push("image input".to_owned());
        }
        if requirements.document_input && !self.document_input {
            missing.push("document input".to_owned());
        }
        if requirements.reasoning && !self.reasoning {
            missing.push("reasoning".to_owned());
        }
        if let Some(window) = self.context_window {
            let needed = requirements
                .input_tokens
                .saturating_add(requirements.max_output_tokens.unwrap_or(0));
            if needed > window {
                missing.push(format!("context window of {needed} tokens (has {window})"));
            }
        }
        if let Some(hosted) = &self.hosted_tools {
            for tool in &requirements.hosted_tools {
                if !hosted.contains(tool) {
                    missing.push(format!("the hosted tool {tool}"));
                }
            }
        }
        if let (Some(limit), Some(asked)) = (self.max_output_tokens, requirements.max_output_tokens)
            && asked > limit
        {
            missing.push(format!("{asked} output tokens (allows {limit})"));
        }
        missing
    }
}

/// The response body of a [boxed](Target::boxed) target.
pub type UpstreamBody = UnsyncBoxBody<Bytes, crate::BoxError>;

/// A type-erased upstream service: what [`Target::boxed`] makes of any
/// Tower HTTP service, so targets of different types share one
/// [`Failover`](super::Failover).
pub type BoxUpstream =
    BoxCloneSyncService<Request<Full<Bytes>>, Response<UpstreamBody>, crate::BoxError>;

/// One upstream the failover layer may send a turn to: a provider plus an
/// upstream model, with what the gateway knows about it.
///
/// The service is any Tower HTTP service (the hyper client, or a fake in
/// tests); the target wraps it in a [`ClassifyLayer`] named after the
/// provider, so every failure reaches the failover loop classified.
#[derive(Debug, Clone)]
pub struct Target<S> {
    pub(crate) name: Arc<str>,
    /// The name as the summary header's value, made once: a turn it answers
    /// shares it rather than copy the name into a new one.
    pub(crate) name_value: Option<http::HeaderValue>,
    pub(crate) provider: Arc<str>,
    /// An `Arc` so that a health key shares it rather than copy it.
    pub(crate) model: Option<Arc<str>>,
    pub(crate) capabilities: Capabilities,
    pub(crate) pricing: Option<Pricing>,
    /// How long a stream may take to its first output here; `None`: the
    /// builder's default.
    pub(crate) first_output_timeout: Option<Duration>,
    /// The same, for a request that asks for reasoning (thinking).
    pub(crate) reasoning_first_output_timeout: Option<Duration>,
    /// The target's dialect when it is not the clients' (set by
    /// [`dialect`](Self::dialect); cleared at build for the clients' own).
    pub(crate) dialect: Option<ForeignDialect>,
    pub(crate) service: S,
}

impl Target<BoxUpstream> {
    /// A target in front of any Tower HTTP service, type-erased so targets
    /// of different service types (`tower_llm_client::UpstreamClient`, a
    /// `tower::service_fn`, a fake) mix in one failover without type
    /// plumbing. Costs one allocation per call.
    pub fn boxed<S, B>(name: impl Into<Arc<str>>, service: S) -> Self
    where
        S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + Sync + 'static,
        S::Future: Send + 'static,
        S::Error: Into<crate::BoxError>,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<crate::BoxError>,
    {
        let service = service
            .map_response(|response: Response<B>| {
                response.map(|body| body.map_err(Into::into).boxed_unsync())
            })
            .map_err(Into::into);
        Target::new(name, BoxCloneSyncService::new(service))
    }
}

impl<S> Target<S> {
    /// A target named `name` (also its provider name until
    /// [`provider`](Self::provider) says otherwise) in front of `service`,
    /// passing the client's model through.
    pub fn new(name: impl Into<Arc<str>>, service: S) -> Self {
        let name = name.into();
        Self {
            provider: Arc::clone(&name),
            name_value: http::HeaderValue::from_str(&name).ok(),
            name,
            model: None,
            capabilities: Capabilities::default(),
            pricing: None,
            first_output_timeout: None,
            reasoning_first_output_timeout: None,
            dialect: None,
            service,
        }
    }

    /// The provider name (classifier overrides and logs use it).
    pub fn provider(mut self, provider: impl Into<Arc<str>>) -> Self {
        self.provider = provider.into();
        self
    }

    /// The model name sent upstream instead of the client's.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(Arc::from(model.into()));
        self
    }

    /// What the target can do.
    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Price per million input and output tokens.
    pub fn pricing(mut self, pricing: Pricing) -> Self {
        self.pricing = Some(pricing);
        self
    }

    /// How long a stream from this target may take to its first output
    /// (default: the builder's
    /// [`Timeouts::first_output`](super::Timeouts::first_output)).
    /// A slow model's wait is its own: a faster target's stays short.
    pub fn first_output_timeout(mut self, timeout: Duration) -> Self {
        self.first_output_timeout = Some(timeout);
        self
    }

    /// How long a stream from this target may take to its first output
    /// when the request asks for reasoning (`reasoning_effort`,
    /// `reasoning`, `thinking`): a reasoning model thinks before it writes,
    /// often 30–60 s. Default: the
    /// [`first_output_timeout`](Self::first_output_timeout).
    pub fn reasoning_first_output_timeout(mut self, timeout: Duration) -> Self {
        self.reasoning_first_output_timeout = Some(timeout);
        self
    }

    /// The wire dialect this target speaks (default: its failover
    /// service's, the clients' own). A target of another dialect is served
    /// through the [neutral model](crate::dialect::NeutralRequest): the
    /// client's request is translated into this dialect, the answer read
    /// by it (so the commit point is found where it really is) and written
    /// back in the client's dialect, terminal event included. What the
    /// request needs that this dialect cannot express makes the target
    /// ineligible, named in the refusal. A target of the clients' own
    /// dialect is not translated: its bytes pass as they came.
    pub fn dialect<D: crate::dialect::Dialect>(mut self, dialect: D) -> Self {
        self.dialect = Some(ForeignDialect::new(dialect));
        self
    }

    /// The name of the dialect this target speaks: its own when it was
    /// given one, else `clients` (the failover service's).
    pub(crate) fn dialect_name(&self, clients: &'static str) -> &'static str {
        self.dialect.as_ref().map_or(clients, |d| d.0.name())
    }

    /// The first-output timeout of a request here, when the target sets
    /// one: the reasoning one for a request that asks for reasoning.
    pub(crate) fn first_output_for(&self, reasoning: bool) -> Option<Duration> {
        reasoning
            .then_some(self.reasoning_first_output_timeout)
            .flatten()
            .or(self.first_output_timeout)
    }

    /// The model this target sends for a client's `model`.
    pub(crate) fn upstream_model<'a>(&'a self, client_model: &'a str) -> &'a str {
        self.model.as_deref().unwrap_or(client_model)
    }

    /// The model this target sends for a client's `model`, shared.
    pub(crate) fn upstream_model_shared(&self, client_model: &Arc<str>) -> Arc<str> {
        Arc::clone(self.model.as_ref().unwrap_or(client_model))
    }

    /// The health key of this target for a client's `model`: its provider
    /// and the model it sends upstream (marked as client-named for a
    /// pass-through target).
    pub(crate) fn health_key(&self, client_model: &Arc<str>) -> crate::health::HealthKey {
        let provider = Arc::clone(&self.provider);
        match &self.model {
            Some(model) => crate::health::HealthKey::model(provider, Arc::clone(model)),
            None => crate::health::HealthKey::client_model(provider, Arc::clone(client_model)),
        }
    }

    /// Whether the model sent upstream is the client's (no model of its own).
    pub(crate) fn passes_client_model(&self) -> bool {
        self.model.is_none()
    }

    /// The estimated cost of a request, when the target has a price.
    pub(crate) fn estimate(&self, input_tokens: u64, output_tokens: u64) -> Option<Cost> {
        self.pricing.map(|p| p.cost(input_tokens, output_tokens))
    }

    pub(crate) fn classified(self, classifier: &Classifier) -> Target<Classify<S>> {
        let layer = ClassifyLayer::new()
            .provider(Arc::clone(&self.provider))
            .classifier(classifier.clone());
        Target {
            service: tower_layer::Layer::layer(&layer, self.service),
            name: self.name,
            name_value: self.name_value,
            provider: self.provider,
            model: self.model,
            capabilities: self.capabilities,
            pricing: self.pricing,
            first_output_timeout: self.first_output_timeout,
            reasoning_first_output_timeout: self.reasoning_first_output_timeout,
            dialect: self.dialect,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass-through target's keys are client-named; a fixed model's are
    /// not.
    #[test]
    fn a_pass_through_targets_health_keys_are_client_named() {
        let primary = Target::new("primary", ());
        let backup = Target::new("backup", ()).model("backup-model");
        assert!(primary.health_key(&Arc::from("anything")).is_client_named());
        assert!(!backup.health_key(&Arc::from("anything")).is_client_named());
        assert_eq!(
            backup.health_key(&Arc::from("anything")),
            crate::health::HealthKey::model("backup", "backup-model")
        );
    }
}
