//! `POST /v1/messages` and `POST /v1/responses`: Anthropic Messages and
//! OpenAI Responses routes next to the chat routes.
//!
//! A provider declares the dialect it speaks (`dialect = "openai"`, the
//! default, `"anthropic"` or `"openai-responses"`). A configured route may
//! mix them: it answers `/v1/chat/completions`, `/v1/messages` and
//! `/v1/responses` alike, and a target of another dialect is translated.
//! Every route shares the gateway's one health registry.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use tower_llm_client::UpstreamClient;
use tower_llm_failover::FailureClass;
use tower_llm_failover::budget::Budget;
use tower_llm_failover::dialect::{
    AnthropicMessages, Dialect, ErrorReply, OpenAiChat, OpenAiResponses, ParsedRequest,
};
use tower_llm_failover::failover::Failover;

use crate::app::{Gateway, ProviderConfig, ReadTurn, RouteConfig, pattern_matches, read_turn};

/// One route of the endpoint whose clients speak `D`.
pub(crate) struct DialectRoute<D: Dialect> {
    pub(crate) pattern: String,
    /// What `GET /v1/models` lists for this route.
    pub(crate) listed: Vec<String>,
    pub(crate) service: Budget<Failover<UpstreamClient, D>, D>,
}

/// The wire dialect a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireDialect {
    /// OpenAI chat completions.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Responses.
    Responses,
}

impl WireDialect {
    /// The dialect's name, as records say it (`openai-chat`,
    /// `anthropic-messages`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => OpenAiChat.name(),
            Self::Anthropic => AnthropicMessages.name(),
            Self::Responses => OpenAiResponses.name(),
        }
    }
}

/// The dialect `provider` declares.
pub(crate) fn provider_dialect(provider: &ProviderConfig) -> Result<WireDialect, String> {
    match provider.dialect.as_deref().unwrap_or("openai") {
        "openai" => Ok(WireDialect::OpenAi),
        "anthropic" => Ok(WireDialect::Anthropic),
        "openai-responses" | "responses" => Ok(WireDialect::Responses),
        other => Err(format!(
            "provider {}: unknown dialect {other:?} (\"openai\", \"anthropic\" or \"openai-responses\")",
            provider.name
        )),
    }
}

/// How a provider authenticates when its config does not say: an
/// Anthropic provider with `x-api-key`, any other with a bearer token.
pub(crate) fn default_auth(provider: &ProviderConfig) -> &'static str {
    match provider_dialect(provider) {
        Ok(WireDialect::Anthropic) => "x-api-key",
        _ => "bearer",
    }
}

/// The dialect of a route's targets when they all speak one (the first
/// target's otherwise; only the routes made up without a config, one per
/// dialect, rely on it).
pub(crate) fn route_dialect(
    route: &RouteConfig,
    providers: &[ProviderConfig],
) -> Result<WireDialect, String> {
    let Some(target) = route.targets.first() else {
        return Ok(WireDialect::OpenAi);
    };
    let Some(provider) = providers.iter().find(|p| p.name == target.provider) else {
        return Err(format!(
            "route {}: unknown provider {}",
            route.model, target.provider
        ));
    };
    provider_dialect(provider)
}

/// A route without a config (every provider, the client's model) split
/// into one route per dialect.
pub(crate) fn split_by_dialect(
    route: RouteConfig,
    providers: &[ProviderConfig],
) -> Result<Vec<RouteConfig>, String> {
    let mut split: Vec<(WireDialect, RouteConfig)> = Vec::new();
    let template = RouteConfig {
        targets: Vec::new(),
        ..route.clone()
    };
    for target in route.targets {
        let Some(provider) = providers.iter().find(|p| p.name == target.provider) else {
            continue;
        };
        let dialect = provider_dialect(provider)?;
        match split.iter_mut().find(|(d, _)| *d == dialect) {
            Some((_, r)) => r.targets.push(target),
            None => split.push((
                dialect,
                RouteConfig {
                    targets: vec![target],
                    ..template.clone()
                },
            )),
        }
    }
    Ok(split.into_iter().map(|(_, r)| r).collect())
}

/// An error answer in Anthropic's shape.
fn error_answer(status: StatusCode, class: FailureClass, message: &str, code: &str) -> Response {
    let dialect = AnthropicMessages;
    let body = dialect.error_body(&ErrorReply::coded(class, code, message));
    let mut response = (dialect.error_status(class, status), body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(dialect.error_content_type()),
    );
    response
}

/// `POST /v1/messages`: reads the request once, picks the Messages route
/// by model, and hands the parsed request to its stack.
pub(crate) async fn handler(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    serve_turn(
        &gateway,
        &gateway.messages,
        &AnthropicMessages,
        request,
        error_answer,
    )
    .await
}

/// `POST /v1/responses`: the same for the Responses routes, whose errors
/// have OpenAI's shape.
pub(crate) async fn responses_handler(
    State(gateway): State<Arc<Gateway>>,
    request: Request,
) -> Response {
    serve_turn(
        &gateway,
        &gateway.responses,
        &OpenAiResponses,
        request,
        crate::app::error_answer,
    )
    .await
}

/// Reads a request of `dialect` once, admits its client, picks the route by
/// model, and hands the parsed request to the route's stack.
async fn serve_turn<D: Dialect>(
    gateway: &Gateway,
    routes: &[DialectRoute<D>],
    dialect: &D,
    request: Request,
    error_answer: crate::state::ErrorAnswer,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let ReadTurn {
        bytes,
        requirements,
        request: parsed,
    } = match read_turn(dialect, gateway.max_request_bytes, body, error_answer).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let client = tower_llm_failover::identity::ClientId::of(&parts.extensions);
    let slot = match gateway
        .clients()
        .admit(&client, &requirements, &mut parts.extensions, error_answer)
        .await
    {
        Ok(slot) => slot,
        Err(refused) => return refused,
    };
    let Some(route) = routes
        .iter()
        .find(|r| pattern_matches(&r.pattern, &requirements.model))
    else {
        return error_answer(
            StatusCode::NOT_FOUND,
            FailureClass::ModelNotFound,
            &format!(
                "the model `{}` has no {} route",
                requirements.model.escape_debug(),
                dialect.name()
            ),
            "model_not_found",
        );
    };
    parts.extensions.insert(ParsedRequest {
        requirements,
        request: parsed,
    });
    let request = http::Request::from_parts(parts, Full::new(bytes));
    crate::keys::hold(crate::app::run_turn(&route.service, request).await, slot)
}

/// The embedded demo's Messages providers and routes (TOML to append to the
/// demo config): the same two fakes, spoken to in Anthropic's dialect.
///
/// - `claude-demo-failover`: the primary answers `529 overloaded_error`;
///   the backup answers, and the client never notices.
/// - `claude-demo-cut`: the primary is cut after 5 deltas; the stream ends
///   with `event: error`, nothing spliced.
/// - `demo-mixed`: a chat client; the chat primary answers 429 and the
///   Messages backup answers, translated.
/// - `claude-demo-mixed`: a Messages client; the Messages primary answers
///   529 and the chat backup answers, translated.
/// - `claude-*`: primary, then backup, with the client's model.
/// - `responses-demo-failover`: a Responses client; the Responses primary
///   answers 429 and the chat backup answers, translated.
/// - `responses-demo-cut`: the Responses primary is cut after 5 deltas;
///   the stream ends with `response.failed` and an `error` event.
///
/// The chat demo's providers (`primary-billing`, `backup`) must be in the
/// same config.
pub fn demo_routes(primary: &str, backup: &str) -> String {
    format!(
        r#"
[[providers]]
name = "claude-primary"
base_url = "{primary}"
dialect = "anthropic"

[[providers]]
name = "claude-backup"
base_url = "{backup}"
dialect = "anthropic"

[[routes]]
model = "claude-demo-failover"
targets = [
  {{ provider = "claude-primary", model = "claude-primary#fault:status=529" }},
  {{ provider = "claude-backup", model = "claude-backup" }},
]

[[routes]]
model = "claude-demo-cut"
targets = [
  {{ provider = "claude-primary", model = "claude-primary#fault:reset_after=5" }},
  {{ provider = "claude-backup", model = "claude-backup" }},
]

[[routes]]
model = "demo-mixed"
targets = [
  {{ provider = "primary-billing", model = "primary-model#fault:status=429;error=quota" }},
  {{ provider = "claude-backup", model = "claude-backup" }},
]

[[routes]]
model = "claude-demo-mixed"
targets = [
  {{ provider = "claude-primary", model = "claude-primary#fault:status=529" }},
  {{ provider = "backup", model = "backup-model" }},
]

[[routes]]
model = "claude-*"
targets = [{{ provider = "claude-primary" }}, {{ provider = "claude-backup" }}]

[[providers]]
name = "responses-primary"
base_url = "{primary}"
dialect = "openai-responses"

[[providers]]
name = "responses-backup"
base_url = "{backup}"
dialect = "openai-responses"

[[routes]]
model = "responses-demo-failover"
targets = [
  {{ provider = "responses-primary", model = "responses-primary#fault:status=429" }},
  {{ provider = "backup", model = "backup-model" }},
]

[[routes]]
model = "responses-demo-cut"
targets = [
  {{ provider = "responses-primary", model = "responses-primary#fault:reset_after=5" }},
  {{ provider = "responses-backup", model = "responses-backup" }},
]
"#
    )
}
