//! The gateway's configuration and router: the TOML [`Config`], the
//! [`Gateway`] it builds, and [`serve()`], which serves it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post_service};

use http_body_util::Full;
use serde::Deserialize;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_llm_client::{Auth, UpstreamClient, UpstreamClientBuilder};
use tower_llm_failover::FailureClass;
use tower_llm_failover::dialect::{
    AnthropicMessages, Dialect, ErrorReply, OpenAiChat, OpenAiResponses, ParsedRequest,
    TerminalMode,
};
use tower_llm_failover::failover::{Caps, Hedge};
use tower_llm_failover::failover::{HeaderPolicy, Timeouts};
use tower_llm_failover::identity::ClientId;
use tower_llm_failover::limit::{RateLimitStore, ReadLimitError};
use tower_llm_failover::shutdown::Shutdown;
use tower_llm_failover::stream::StreamPolicy;
use tower_llm_failover::{
    Cost, budget::Budget, budget::BudgetLayer, budget::Pricing, budget::RetryBudget,
    budget::RetryBudgetConfig, budget::SpendStore, budget::TenantSpend, budget::TurnLimits,
};
use tower_llm_failover::{
    failover::Capabilities, failover::Failover, failover::FailoverBuilder, failover::Strategy,
    failover::Target, health::CooldownPolicy, health::HealthStore, health::KeyState,
    stream::CommitWindow,
};

use crate::serve::ServerConfig;
pub use crate::serve::{Running, shutdown_signal};
use crate::{front, keys, messages, serve, state, telemetry};

/// The TOML file `--config` reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The per-turn budget.
    #[serde(default)]
    pub budget: BudgetConfig,
    /// Failover settings beyond the budget.
    #[serde(default)]
    pub failover: FailoverConfig,
    /// Connection and request limits.
    #[serde(default)]
    pub server: ServerConfig,
    /// The upstream providers.
    pub providers: Vec<ProviderConfig>,
    /// Client-facing models and their targets, matched in file order.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Shared state (Redis) and tenant ceilings; absent: all in memory.
    pub state: Option<state::StateConfig>,
    /// Logs, metrics and OTLP export.
    #[serde(default)]
    pub telemetry: telemetry::TelemetryConfig,
    /// Client keys; none: every request is the anonymous client.
    #[serde(default)]
    pub keys: Vec<keys::KeyConfig>,
    /// Whether a tenant header is trusted.
    #[serde(default)]
    pub tenants: keys::TenantsConfig,
    /// The operator's key for `/metrics` and `/v1/health/targets`.
    #[serde(default)]
    pub admin: keys::AdminConfig,
}

fn default_listen() -> String {
    "127.0.0.1:8080".to_owned()
}

/// `[budget]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetConfig {
    /// Time allowed for the whole turn, every attempt and wait included.
    pub deadline_ms: u64,
    /// Upstream attempts per turn, the first included.
    pub max_attempts: u32,
    /// How long a stream may take to its first output, for targets that
    /// set no `first_output_timeout_ms` of their own.
    pub first_token_timeout_ms: u64,
    /// Longest gap between two frames of an upstream body.
    pub idle_timeout_ms: u64,
    /// Response head of a stream (the library's 10 s when absent).
    pub head_timeout_ms: Option<u64>,
    /// Response head of a non-streaming answer (30 s: half the default
    /// deadline, so a silent upstream leaves the backup time). `None`: the
    /// library's 60 s.
    pub non_streaming_head_timeout_ms: Option<u64>,
    /// A whole non-streaming answer (the turn deadline when absent).
    pub response_timeout_ms: Option<u64>,
    /// What one turn may spend over all its attempts, in USD (targets
    /// priced with `input_per_million` and `output_per_million`).
    pub spend_ceiling_usd: Option<f64>,
    /// Extra attempts allowed across turns, as a fraction of first attempts.
    pub retry_percent: f32,
    /// Extra attempts allowed per second whatever the first attempts
    /// (tower's reserve; 10 by default).
    pub retry_min_per_sec: u32,
    /// How long a first attempt counts toward the retry budget (1–60 s).
    pub retry_ttl_ms: u64,
    /// Each client's own reserve of extra attempts per second inside the
    /// fleet's budget (default: half of `retry_min_per_sec`, at least 1).
    pub retry_client_min_per_sec: Option<u32>,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self {
            deadline_ms: 60_000,
            max_attempts: 4,
            first_token_timeout_ms: 10_000,
            idle_timeout_ms: 10_000,
            head_timeout_ms: None,
            non_streaming_head_timeout_ms: Some(30_000),
            response_timeout_ms: None,
            spend_ceiling_usd: None,
            retry_percent: 0.2,
            retry_min_per_sec: 10,
            retry_ttl_ms: 10_000,
            retry_client_min_per_sec: None,
        }
    }
}

/// `[failover]`: the library's own names.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailoverConfig {
    /// `ordered`, `cheapest_healthy` or `lowest_latency`.
    pub strategy: String,
    /// Output events held back before commit (1 = commit on first output).
    pub commit_output_events: u64,
    /// Or commit once this many bytes of output are held back.
    pub commit_output_bytes: Option<u64>,
    /// Or commit this long after the first output.
    pub commit_after_first_output_ms: Option<u64>,
    /// Retries on one target (for failures whose recovery is to retry the
    /// same target) before rerouting.
    pub max_retries_per_target: u32,
    /// With another target left, a longer wait reroutes instead.
    pub max_same_target_wait_ms: u64,
    /// `error_chunk`, `finish_reason_only` or `error_event`.
    pub terminal_mode: String,
    /// The largest request body accepted (`413` beyond it).
    pub max_request_bytes: usize,
    /// How long running streams may go on after SIGINT/SIGTERM.
    pub shutdown_grace_ms: u64,
    /// Cooldown of account-scope failures (quota, auth, permission).
    pub cooldown_account_ms: Option<u64>,
    /// Hintless model-scope failures inside the window that cool a model.
    pub cooldown_failures: Option<u32>,
    /// The window `cooldown_failures` are counted in.
    pub cooldown_window_ms: Option<u64>,
    /// The first model-scope cooldown; doubles for each one in a row.
    pub cooldown_base_ms: Option<u64>,
    /// The longest cooldown, retry hints included.
    pub cooldown_max_ms: Option<u64>,
    /// Refuse at once when every target rests instead of probing one.
    pub refuse_when_cooling: bool,
    /// Client request headers that reach the provider, besides the
    /// library's defaults (`openai-organization`, say).
    pub forward_request_headers: Vec<String>,
    /// Provider response headers that reach the client, besides the
    /// library's defaults.
    pub forward_response_headers: Vec<String>,
    /// `anthropic-beta` values clients may send on, besides the library's
    /// allow-list (`DEFAULT_ANTHROPIC_BETAS`).
    pub allow_anthropic_betas: Vec<String>,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        Self {
            strategy: "ordered".to_owned(),
            commit_output_events: 1,
            commit_output_bytes: None,
            commit_after_first_output_ms: None,
            max_retries_per_target: 2,
            max_same_target_wait_ms: 5_000,
            terminal_mode: "error_chunk".to_owned(),
            max_request_bytes: 4 << 20,
            shutdown_grace_ms: 30_000,
            cooldown_account_ms: None,
            cooldown_failures: None,
            cooldown_window_ms: None,
            cooldown_base_ms: None,
            cooldown_max_ms: None,
            refuse_when_cooling: false,
            forward_request_headers: Vec::new(),
            forward_response_headers: Vec::new(),
            allow_anthropic_betas: Vec::new(),
        }
    }
}

impl BudgetConfig {
    /// The retry budget's settings, checked.
    fn retry_budget_config(&self) -> Result<RetryBudgetConfig, String> {
        let retry_config = RetryBudgetConfig {
            ttl: Duration::from_millis(self.retry_ttl_ms),
            min_per_sec: self.retry_min_per_sec,
            retry_percent: self.retry_percent,
        };
        retry_config
            .validate()
            .map_err(|e| format!("budget: {e}"))?;
        Ok(retry_config)
    }
}

impl FailoverConfig {
    /// `strategy` as the library's [`Strategy`].
    fn strategy(&self) -> Result<Strategy, String> {
        match self.strategy.as_str() {
            "ordered" => Ok(Strategy::Ordered),
            "cheapest_healthy" => Ok(Strategy::CheapestHealthy),
            "lowest_latency" => Ok(Strategy::LowestLatency),
            other => Err(format!("failover.strategy: unknown {other}")),
        }
    }

    /// `terminal_mode` as the library's [`TerminalMode`].
    fn terminal_mode(&self) -> Result<TerminalMode, String> {
        match self.terminal_mode.as_str() {
            "error_chunk" => Ok(TerminalMode::Raise),
            "finish_reason_only" => Ok(TerminalMode::Finish),
            "error_event" => Ok(TerminalMode::ErrorEventOnly),
            other => Err(format!("failover.terminal_mode: unknown {other}")),
        }
    }

    /// When a stream commits: after `commit_output_events`, or the output
    /// bytes, or the time after first output, whichever comes first.
    fn commit_window(&self) -> CommitWindow {
        CommitWindow {
            output_events: Some(self.commit_output_events),
            output_bytes: self.commit_output_bytes,
            after_first_output: self.commit_after_first_output_ms.map(Duration::from_millis),
        }
    }

    /// The library's cooldown policy with the `cooldown_*` keys set.
    fn cooldown_policy(&self) -> CooldownPolicy {
        let defaults = CooldownPolicy::default();
        let millis_or = |ms: Option<u64>, default| ms.map_or(default, Duration::from_millis);
        CooldownPolicy {
            account: millis_or(self.cooldown_account_ms, defaults.account),
            failure_threshold: self.cooldown_failures.unwrap_or(defaults.failure_threshold),
            failure_window: millis_or(self.cooldown_window_ms, defaults.failure_window),
            base: millis_or(self.cooldown_base_ms, defaults.base),
            max: millis_or(self.cooldown_max_ms, defaults.max),
            ..defaults
        }
    }
}

/// `[[providers]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The name targets refer to; also the provider in logs and metrics.
    pub name: String,
    /// The provider's API base URL (`https://api.openai.com/v1`).
    pub base_url: String,
    /// The wire dialect it speaks: `openai` (chat completions, the default),
    /// `anthropic` (Messages) or `openai-responses` (Responses).
    #[serde(default)]
    pub dialect: Option<String>,
    /// The key is read from this environment variable.
    pub api_key_env: Option<String>,
    /// `bearer` (default; `x-api-key` for an `anthropic` provider),
    /// `x-api-key` or `api-key`.
    #[serde(default)]
    pub auth: Option<String>,
    /// How long a TCP connect may take (the client's default when absent).
    pub connect_timeout_ms: Option<u64>,
    // Upstream TLS trust, client certificate and egress proxy.
    /// PEM bundle of CAs trusted for this provider, added to the roots.
    pub ca_file: Option<String>,
    /// Trust the Mozilla roots compiled in (default true); false with
    /// `ca_file` trusts only that bundle.
    pub webpki_roots: Option<bool>,
    /// Trust the platform's store too (default false).
    pub native_roots: Option<bool>,
    /// PEM certificate chain presented to the provider (mTLS).
    pub client_cert_file: Option<String>,
    /// PEM private key of `client_cert_file`.
    pub client_key_file: Option<String>,
    /// HTTP CONNECT proxy, `http://[user:password@]host:port`.
    pub proxy_url: Option<String>,
    /// Hosts that bypass `proxy_url` (NO_PROXY syntax).
    pub no_proxy: Option<String>,
    /// Take the proxy from HTTPS_PROXY / HTTP_PROXY / NO_PROXY.
    #[serde(default)]
    pub proxy_from_env: bool,
    /// Offer HTTP/2 by ALPN (default true).
    pub http2: Option<bool>,
}

impl ProviderConfig {
    /// The provider's API key, read from `api_key_env`, sent the way
    /// `auth` says (the dialect's default when absent); no key without
    /// `api_key_env`.
    fn upstream_auth(&self) -> Result<Auth, String> {
        let Some(var) = &self.api_key_env else {
            return Ok(Auth::None);
        };
        let key =
            std::env::var(var).map_err(|_| format!("provider {}: ${var} is not set", self.name))?;
        match self.auth.as_deref().unwrap_or(messages::default_auth(self)) {
            "bearer" => Ok(Auth::bearer(key)),
            "x-api-key" => Ok(Auth::x_api_key(key)),
            "api-key" => Ok(Auth::api_key(key)),
            other => Err(format!("provider {}: unknown auth {other}", self.name)),
        }
    }

    /// The provider's upstream client: its key, dialect, connect timeout,
    /// TLS trust and proxy.
    fn client(&self) -> Result<UpstreamClient, String> {
        let auth = self.upstream_auth()?;
        messages::provider_dialect(self)?;
        let mut builder = UpstreamClient::builder(self.base_url.clone()).auth(auth);
        if let Some(ms) = self.connect_timeout_ms {
            builder = builder.connect_timeout(Duration::from_millis(ms));
        }
        let builder = self
            .apply_connection(builder)
            .map_err(|e| format!("provider {}: {e}", self.name))?;
        builder
            .build()
            .map_err(|e| format!("provider {}: {e}", self.name))
    }

    /// Applies the TLS and proxy keys to a client builder.
    fn apply_connection(
        &self,
        mut builder: UpstreamClientBuilder,
    ) -> Result<UpstreamClientBuilder, String> {
        if let Some(path) = &self.ca_file {
            builder = builder.ca_file(path);
        }
        if let Some(on) = self.webpki_roots {
            builder = builder.webpki_roots(on);
        }
        if let Some(on) = self.native_roots {
            builder = builder.native_roots(on);
        }
        match (&self.client_cert_file, &self.client_key_file) {
            (Some(cert), Some(key)) => builder = builder.client_cert_files(cert, key),
            (None, None) => {}
            _ => return Err("client_cert_file and client_key_file go together".to_owned()),
        }
        match (&self.proxy_url, self.proxy_from_env) {
            (Some(_), true) => {
                return Err("proxy_url and proxy_from_env exclude each other".to_owned());
            }
            (Some(url), false) => {
                builder = builder.proxy(url.clone());
                if let Some(list) = &self.no_proxy {
                    builder = builder.no_proxy(list.clone());
                }
            }
            (None, true) => builder = builder.proxy_from_env(),
            (None, false) if self.no_proxy.is_some() => {
                return Err("no_proxy needs proxy_url".to_owned());
            }
            (None, false) => {}
        }
        if let Some(on) = self.http2 {
            builder = builder.http2(on);
        }
        Ok(builder)
    }
}

/// `[[routes]]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Client-facing model name, `*` as wildcard.
    pub model: String,
    /// The model names `GET /v1/models` lists for a wildcard route (a
    /// route without `*` lists its own name).
    #[serde(default)]
    pub models: Vec<String>,
    /// Where the route's turns go, tried as `[failover] strategy` says
    /// (in this order with `ordered`).
    pub targets: Vec<TargetConfig>,
    /// Hedging, off unless `hedge_after_ms` or `hedge_after_percentile`
    /// is set: when an attempt has not committed in time, a hedge races it
    /// on the next healthy target, and the first to commit is served.
    /// Hedge an attempt that has not committed this long after its start.
    pub hedge_after_ms: Option<u64>,
    /// Or: hedge after this percentile (1–99.9) of the target's recent
    /// times to commit, with `hedge_after_floor_ms` as the least wait.
    pub hedge_after_percentile: Option<f64>,
    /// The least wait of the percentile policy, and the wait until a
    /// target has 20 samples (default 250).
    pub hedge_after_floor_ms: Option<u64>,
    /// Hedges at most this share of first attempts, in percent (default 5).
    pub hedge_budget_percent: Option<f32>,
    /// Hedges per turn (default 1).
    pub max_hedges: Option<u32>,
    /// Tools that are not idempotent: a request carrying a result of one
    /// of them is never hedged.
    #[serde(default)]
    pub unhedgeable_tools: Vec<String>,
}

impl RouteConfig {
    /// The route's hedge policy, `None` when hedging is off, or why the
    /// settings do not make one.
    pub fn hedge(&self) -> Result<Option<Hedge>, String> {
        let hedge = match (self.hedge_after_ms, self.hedge_after_percentile) {
            (Some(_), Some(_)) => {
                return Err("set hedge_after_ms or hedge_after_percentile, not both".to_owned());
            }
            (Some(ms), None) => Hedge::after(Duration::from_millis(ms)),
            (None, Some(p)) if (1.0..=99.9).contains(&p) => Hedge::percentile(
                p,
                Duration::from_millis(self.hedge_after_floor_ms.unwrap_or(250)),
            ),
            (None, Some(p)) => {
                return Err(format!(
                    "hedge_after_percentile must be within 1 and 99.9, got {p}"
                ));
            }
            (None, None) => {
                let set = self.hedge_after_floor_ms.is_some()
                    || self.hedge_budget_percent.is_some()
                    || self.max_hedges.is_some()
                    || !self.unhedgeable_tools.is_empty();
                if set {
                    return Err(
                        "hedge settings need hedge_after_ms or hedge_after_percentile".to_owned(),
                    );
                }
                return Ok(None);
            }
        };
        if self.hedge_after_ms.is_some() && self.hedge_after_floor_ms.is_some() {
            return Err("hedge_after_floor_ms goes with hedge_after_percentile".to_owned());
        }
        let hedge = match self.hedge_budget_percent {
            Some(p) if (0.0..=100_000.0).contains(&p) => hedge.with_budget_percent(p),
            Some(p) => {
                return Err(format!(
                    "hedge_budget_percent must be within 0 and 100000, got {p}"
                ));
            }
            None => hedge,
        };
        Ok(Some(
            hedge
                .with_max_hedges(self.max_hedges.unwrap_or(1))
                .with_unhedgeable_tools(self.unhedgeable_tools.iter().cloned()),
        ))
    }
}

/// One target of a route: a provider plus an upstream model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// The `[[providers]]` name.
    pub provider: String,
    /// Upstream model; the client's when absent.
    pub model: Option<String>,
    // What the target can do (a request goes only to targets that can
    // serve it); everything when absent.
    /// The context window, in tokens.
    pub context_window: Option<u64>,
    /// The largest output the target accepts, in tokens.
    pub max_output_tokens: Option<u64>,
    /// Function/tool calling (`tools`).
    pub tools: Option<bool>,
    /// Several tool calls in one turn (`parallel_tool_calls`).
    pub parallel_tool_calls: Option<bool>,
    /// `response_format: {"type": "json_schema"}`.
    pub json_schema: Option<bool>,
    /// `response_format: {"type": "json_object"}`.
    pub json_object: Option<bool>,
    /// Streamed answers.
    pub streaming: Option<bool>,
    /// Images in the input.
    pub image_input: Option<bool>,
    /// The provider-hosted tools this target runs (the Responses API's
    /// `web_search`, `file_search`, ...); any when absent. A target of
    /// another dialect than the client's runs none.
    pub hosted_tools: Option<Vec<String>>,
    /// The `max_tokens` sent to this target when a client of another
    /// dialect set no output limit (a Messages target requires one; 4,096
    /// when absent).
    pub default_max_tokens: Option<u64>,
    /// Price of a million input tokens, USD (with `output_per_million`).
    pub input_per_million: Option<f64>,
    /// Price of a million output tokens, USD (with `input_per_million`).
    pub output_per_million: Option<f64>,
    /// How long a stream from this target may take to its first output;
    /// `[budget] first_token_timeout_ms` when absent.
    pub first_output_timeout_ms: Option<u64>,
    /// The same for a request that asks for reasoning or thinking (a
    /// reasoning model often takes 30–60 s); `first_output_timeout_ms`
    /// when absent.
    pub reasoning_first_output_timeout_ms: Option<u64>,
}

impl TargetConfig {
    /// A target on `provider` with the client's model and nothing else
    /// set: every capability, no price, the budget's timeouts.
    fn on_provider(provider: String) -> Self {
        Self {
            provider,
            model: None,
            context_window: None,
            max_output_tokens: None,
            tools: None,
            parallel_tool_calls: None,
            json_schema: None,
            json_object: None,
            streaming: None,
            image_input: None,
            hosted_tools: None,
            default_max_tokens: None,
            input_per_million: None,
            output_per_million: None,
            first_output_timeout_ms: None,
            reasoning_first_output_timeout_ms: None,
        }
    }

    fn capabilities(&self) -> Capabilities {
        let d = Capabilities::default();
        Capabilities {
            tools: self.tools.unwrap_or(d.tools),
            parallel_tool_calls: self.parallel_tool_calls.unwrap_or(d.parallel_tool_calls),
            json_schema: self.json_schema.unwrap_or(d.json_schema),
            json_object: self.json_object.unwrap_or(d.json_object),
            streaming: self.streaming.unwrap_or(d.streaming),
            image_input: self.image_input.unwrap_or(d.image_input),
            context_window: self.context_window,
            max_output_tokens: self.max_output_tokens,
            default_output_tokens: self.default_max_tokens,
            hosted_tools: self.hosted_tools.clone(),
            ..d
        }
    }
}

impl Config {
    /// Reads a TOML config.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }
}

/// Clean attempts and first-try turns a route stack holds per target
/// before their metrics reach the recorder
/// ([`FailoverBuilder::batch_metrics`]): each shard's stacks would
/// otherwise take the shared metric handles' cache lines from the other
/// cores on every request. `GET /metrics` and the telemetry's tick (every
/// [`telemetry::UPKEEP_EVERY`]) hand over what is held first.
pub const METRICS_BATCH: usize = 32;

/// The stack behind one route.
///
/// The failover layer holds each stream back and ends it cleanly after
/// commit itself (it contains the commit machine), so no stream layer goes
/// around it; the budget layer answers a refused turn itself. The error type
/// is `Infallible`.
type RouteService = Budget<Failover<UpstreamClient>>;

struct Route {
    pattern: String,
    /// What `GET /v1/models` lists for this route.
    listed: Vec<String>,
    service: RouteService,
}

/// What the handlers share.
pub struct Gateway {
    routes: Vec<Route>,
    /// The Messages routes (`POST /v1/messages`).
    pub(crate) messages: Vec<messages::DialectRoute<AnthropicMessages>>,
    /// The Responses routes (`POST /v1/responses`).
    pub(crate) responses: Vec<messages::DialectRoute<OpenAiResponses>>,
    pub(crate) max_request_bytes: usize,
    /// The dialect each provider speaks, by provider name (for the health
    /// report).
    dialects: HashMap<String, &'static str>,
    /// What `GET /metrics` renders (404 without it).
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Model names the operator configured: the only ones metric labels
    /// carry (anything else is `other`).
    configured_models: std::collections::HashSet<String>,
    /// The config, stores, keys, caps and shutdown signal, shared with
    /// every [`Gateway::shard`] of this gateway.
    shared: Shared,
}

/// What every shard of one gateway shares: the config, the stores (health,
/// budgets, spend, rate counts), the client keys, the in-flight cap and the
/// shutdown signal. What a shard has of its own: its upstream clients (and
/// so their connection pools) and its route stacks.
#[derive(Clone)]
struct Shared {
    config: Arc<Config>,
    /// One health registry for the whole gateway.
    health: Arc<dyn HealthStore>,
    retry_budget: RetryBudget,
    /// Tenant spend metering, when tenant ceilings are configured.
    tenant: Option<TenantSpend>,
    /// Client keys, their limits and the admin key.
    clients: Arc<keys::Clients>,
    caps: serve::InFlightCaps,
    /// Ends running streams cleanly when the shutdown grace period is over.
    shutdown: Shutdown,
}

impl Shared {
    /// The stores, budgets and keys of a config, built once per gateway.
    fn build(config: &Config) -> Result<Self, String> {
        let b = &config.budget;
        let retry_config = b.retry_budget_config()?;
        let cooldown = config.failover.cooldown_policy();
        // One health registry for the whole gateway: a provider shared by
        // several routes has one health state (shared by every replica on
        // Redis when `[state] redis_url` is set).
        let stores = state::Stores::build(config.state.as_ref(), cooldown, retry_config)?;
        // A share per client inside the fleet's budget: one client's
        // failures spend its own reroutes, not the others'.
        let share = RetryBudgetConfig {
            min_per_sec: b
                .retry_client_min_per_sec
                .unwrap_or((b.retry_min_per_sec / 2).max(1)),
            ..retry_config
        };
        let retry_budget = stores
            .retry_budget
            .with_client_shares(share, 10_000)
            .map_err(|e| format!("budget: {e}"))?;
        let clients = client_keys(
            config,
            stores.tenant_header.as_ref(),
            stores.rate_limits.clone(),
            &stores.spend,
        )?;
        Ok(Self {
            config: Arc::new(config.clone()),
            health: stores.health,
            retry_budget,
            tenant: stores.tenant,
            clients: Arc::new(clients),
            caps: serve::InFlightCaps::new(&config.server),
            shutdown: Shutdown::new(),
        })
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The routes by pattern: their stacks hold every target's client.
        let chat: Vec<&str> = self.routes.iter().map(|r| r.pattern.as_str()).collect();
        let messages: Vec<&str> = self.messages.iter().map(|r| r.pattern.as_str()).collect();
        let responses: Vec<&str> = self.responses.iter().map(|r| r.pattern.as_str()).collect();
        f.debug_struct("Gateway")
            .field("routes", &chat)
            .field("messages", &messages)
            .field("responses", &responses)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("metrics", &self.prometheus.is_some())
            .field("server", &self.shared.config.server)
            .finish_non_exhaustive()
    }
}

/// `*` matches any run of characters; everything else literally.
pub fn pattern_matches(pattern: &str, model: &str) -> bool {
    // Every request is matched against the routes in turn: no allocation,
    // and no search at all for the catch-all route.
    if pattern == "*" {
        return true;
    }
    let Some((first, after_first)) = pattern.split_once('*') else {
        return pattern == model;
    };
    let (middles, last) = after_first.rsplit_once('*').unwrap_or(("", after_first));
    let Some(mut rest) = model
        .strip_prefix(first)
        .and_then(|rest| rest.strip_suffix(last))
    else {
        return false;
    };
    if middles.is_empty() {
        return true;
    }
    for middle in middles.split('*') {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

/// One upstream client per provider, by provider name.
fn provider_clients(providers: &[ProviderConfig]) -> Result<HashMap<&str, UpstreamClient>, String> {
    let mut clients = HashMap::new();
    for provider in providers {
        clients.insert(provider.name.as_str(), provider.client()?);
    }
    Ok(clients)
}

/// The configured routes; without any, every request tries the providers
/// in order with the client's model (one route per dialect).
fn routes_or_default(config: &Config) -> Result<Vec<RouteConfig>, String> {
    if !config.routes.is_empty() {
        return Ok(config.routes.clone());
    }
    let every_provider = RouteConfig {
        model: "*".to_owned(),
        models: Vec::new(),
        targets: config
            .providers
            .iter()
            .map(|p| TargetConfig::on_provider(p.name.clone()))
            .collect(),
        ..RouteConfig::default()
    };
    Ok(vec![every_provider]
        .into_iter()
        .map(|r| messages::split_by_dialect(r, &config.providers))
        .collect::<Result<Vec<_>, _>>()?
        .concat())
}

/// The client keys, their limits and the admin key, on the shared
/// rate-limit and spend stores (`[state] tenant_header` stands in for an
/// absent `[tenants] trust_header`).
fn client_keys(
    config: &Config,
    state_tenant_header: Option<&String>,
    rate_limits: Option<Arc<dyn RateLimitStore>>,
    spend: &Arc<dyn SpendStore>,
) -> Result<keys::Clients, String> {
    let mut tenants = config.tenants.clone();
    if tenants.trust_header.is_none() {
        tenants.trust_header = state_tenant_header.cloned();
    }
    keys::Clients::build(
        &config.keys,
        &tenants,
        &config.admin,
        rate_limits,
        spend,
        config.state.as_ref().is_some_and(|s| s.spend_fail_open),
    )
}

/// Model names the operator wrote: routes without `*`, the models wildcard
/// routes list, and the targets' upstream models.
fn configured_models(routes: &[RouteConfig]) -> std::collections::HashSet<String> {
    let mut configured = std::collections::HashSet::new();
    for route in routes {
        if !route.model.contains('*') {
            configured.insert(route.model.clone());
        }
        configured.extend(route.models.iter().cloned());
        configured.extend(route.targets.iter().filter_map(|t| t.model.clone()));
    }
    configured
}

/// Each endpoint's routes: chat completions, Messages, Responses.
type BuiltRoutes = (
    Vec<Route>,
    Vec<messages::DialectRoute<AnthropicMessages>>,
    Vec<messages::DialectRoute<OpenAiResponses>>,
);

/// What every route's stack shares, built once from the config: the
/// providers' clients, the failover settings, the health registry and the
/// budgets.
struct StackParts<'a> {
    config: &'a Config,
    /// Each provider's client, by provider name.
    clients: HashMap<&'a str, UpstreamClient>,
    strategy: Strategy,
    commit: CommitWindow,
    stream_policy: StreamPolicy,
    health: Arc<dyn HealthStore>,
    retry_budget: RetryBudget,
    /// Tenant spend metering, when tenant ceilings are configured.
    tenant: Option<TenantSpend>,
    shutdown: Shutdown,
}

impl StackParts<'_> {
    /// Builds each route's stacks. A configured route is served on
    /// `/v1/chat/completions`, `/v1/messages` and `/v1/responses` alike,
    /// whatever its targets speak: a target of another dialect is
    /// translated. The
    /// routes made up when none is configured (every provider, the
    /// client's model) serve only their own dialect's clients: a model
    /// name means nothing to another API's provider.
    fn build_routes(&self, routes_config: &[RouteConfig]) -> Result<BuiltRoutes, String> {
        let configured = !self.config.routes.is_empty();
        let mut routes = Vec::new();
        let mut messages_routes = Vec::new();
        let mut responses_routes = Vec::new();
        for route in routes_config {
            let dialect = messages::route_dialect(route, &self.config.providers)?;
            let serves_chat = configured || dialect == messages::WireDialect::OpenAi;
            let serves_messages = configured || dialect == messages::WireDialect::Anthropic;
            let serves_responses = configured || dialect == messages::WireDialect::Responses;
            let failover = self.failover(route)?;
            let budget = self.budget_layer();
            let listed = if route.model.contains('*') {
                route.models.clone()
            } else {
                vec![route.model.clone()]
            };
            if serves_messages {
                let dialect = AnthropicMessages;
                let service = ServiceBuilder::new()
                    .layer(budget.clone().dialect(dialect))
                    .service(failover.clone().dialect(dialect).build());
                messages_routes.push(messages::DialectRoute {
                    pattern: route.model.clone(),
                    listed: listed.clone(),
                    service,
                });
            }
            if serves_responses {
                let dialect = OpenAiResponses;
                let service = ServiceBuilder::new()
                    .layer(budget.clone().dialect(dialect))
                    .service(failover.clone().dialect(dialect).build());
                responses_routes.push(messages::DialectRoute {
                    pattern: route.model.clone(),
                    listed: listed.clone(),
                    service,
                });
            }
            if serves_chat {
                let service = ServiceBuilder::new()
                    .layer(budget)
                    .service(failover.build());
                routes.push(Route {
                    pattern: route.model.clone(),
                    listed,
                    service,
                });
            }
        }
        Ok((routes, messages_routes, responses_routes))
    }

    /// A route's failover layer: the `[budget]` timeouts, the `[failover]`
    /// settings and the route's targets.
    fn failover(&self, route: &RouteConfig) -> Result<FailoverBuilder<UpstreamClient>, String> {
        let b = &self.config.budget;
        let f = &self.config.failover;
        let mut builder = Failover::builder()
            .shutdown(self.shutdown.clone())
            .batch_metrics(METRICS_BATCH)
            .strategy(self.strategy.clone())
            .commit_window(self.commit)
            .timeouts(|t| Timeouts {
                head: b.head_timeout_ms.map(Duration::from_millis).or(t.head),
                non_streaming_head: b
                    .non_streaming_head_timeout_ms
                    .map(Duration::from_millis)
                    .or(t.non_streaming_head),
                response: b.response_timeout_ms.map(Duration::from_millis),
                first_output: Duration::from_millis(b.first_token_timeout_ms),
            })
            .caps(|c| Caps {
                retries_per_target: f.max_retries_per_target,
                same_target_wait: Duration::from_millis(f.max_same_target_wait_ms),
                request_bytes: f.max_request_bytes,
                ..c
            })
            .health(self.health.clone())
            .refuse_when_cooling(f.refuse_when_cooling)
            .header_policy(
                HeaderPolicy::new()
                    .forward_request_headers(&f.forward_request_headers)
                    .forward_response_headers(&f.forward_response_headers)
                    .allow_anthropic_betas(&f.allow_anthropic_betas),
            )
            .stream_policy(self.stream_policy.clone());
        for target in &route.targets {
            builder = builder.target(self.target(route, target)?);
        }
        if let Some(hedge) = route
            .hedge()
            .map_err(|why| format!("route {}: {why}", route.model))?
        {
            builder = builder.hedge(hedge);
        }
        Ok(builder)
    }

    /// One target of a route, on its provider's client: named
    /// `provider/model` (or the provider alone), with its capabilities,
    /// price and first-output timeouts.
    fn target(
        &self,
        route: &RouteConfig,
        target: &TargetConfig,
    ) -> Result<Target<UpstreamClient>, String> {
        let client = self.clients.get(target.provider.as_str()).ok_or_else(|| {
            format!(
                "route {}: unknown provider {}",
                route.model, target.provider
            )
        })?;
        let name = match &target.model {
            Some(model) => format!("{}/{model}", target.provider),
            None => target.provider.clone(),
        };
        let provider = self
            .config
            .providers
            .iter()
            .find(|p| p.name == target.provider)
            .ok_or_else(|| {
                format!(
                    "route {}: unknown provider {}",
                    route.model, target.provider
                )
            })?;
        let mut t = Target::new(name, client.clone())
            .provider(target.provider.clone())
            .capabilities(target.capabilities());
        // Each target speaks its provider's dialect; a route's service
        // translates for the targets that do not speak its clients'.
        t = match messages::provider_dialect(provider)? {
            messages::WireDialect::OpenAi => t.dialect(OpenAiChat),
            messages::WireDialect::Anthropic => t.dialect(AnthropicMessages),
            messages::WireDialect::Responses => t.dialect(OpenAiResponses),
        };
        if let Some(model) = &target.model {
            t = t.model(model.clone());
        }
        if let (Some(input), Some(output)) = (target.input_per_million, target.output_per_million) {
            t = t.pricing(Pricing::per_million_usd(input, output));
        }
        if let Some(ms) = target.first_output_timeout_ms {
            t = t.first_output_timeout(Duration::from_millis(ms));
        }
        if let Some(ms) = target.reasoning_first_output_timeout_ms {
            t = t.reasoning_first_output_timeout(Duration::from_millis(ms));
        }
        Ok(t)
    }

    /// A route's budget layer: the turn's deadline, attempts and spend
    /// ceiling, the shared retry budget and tenant metering.
    fn budget_layer(&self) -> BudgetLayer {
        let b = &self.config.budget;
        let mut budget = BudgetLayer::new().limits(TurnLimits {
            deadline: Duration::from_millis(b.deadline_ms),
            max_attempts: b.max_attempts,
            spend_ceiling: b.spend_ceiling_usd.map(Cost::from_usd),
            retry_budget: Some(self.retry_budget.clone()),
            ..TurnLimits::new()
        });
        if let Some(spend) = &self.tenant {
            budget = budget.tenant_spend(spend.clone());
        }
        budget
    }
}

impl Gateway {
    /// Builds every route's stack from a config.
    pub fn from_config(config: &Config) -> Result<Self, String> {
        Self::assemble(Shared::build(config)?)
    }

    /// Another shard of this gateway: route stacks and upstream clients
    /// of its own (so its upstream connections live on the runtime that
    /// serves it), over this gateway's stores, budgets, keys, in-flight
    /// cap and shutdown signal. What a route's failover layer measures
    /// for itself (the hedge delay's latency window) is per shard.
    pub fn shard(&self) -> Result<Self, String> {
        let mut shard = Self::assemble(self.shared.clone())?;
        shard.prometheus = self.prometheus.clone();
        Ok(shard)
    }

    /// A gateway's route stacks and upstream clients over `shared`.
    fn assemble(shared: Shared) -> Result<Self, String> {
        let config = &*shared.config;
        let clients = provider_clients(&config.providers)?;
        let routes_config = routes_or_default(config)?;
        let b = &config.budget;
        let f = &config.failover;
        let strategy = f.strategy()?;
        let terminal_mode = f.terminal_mode()?;
        let commit = f.commit_window();
        let configured_models = configured_models(&routes_config);
        let stream_policy = StreamPolicy {
            terminal_mode,
            idle_timeout: Some(Duration::from_millis(b.idle_timeout_ms)),
            ..StreamPolicy::new()
        };

        let parts = StackParts {
            config,
            clients,
            strategy,
            commit,
            stream_policy,
            health: shared.health.clone(),
            retry_budget: shared.retry_budget.clone(),
            tenant: shared.tenant.clone(),
            // The same signal; its waiters queue per shard.
            shutdown: shared.shutdown.branch(),
        };
        let (routes, messages_routes, responses_routes) = parts.build_routes(&routes_config)?;
        Ok(Self {
            routes,
            messages: messages_routes,
            responses: responses_routes,
            max_request_bytes: f.max_request_bytes,
            dialects: config
                .providers
                .iter()
                .map(|p| {
                    let dialect = messages::provider_dialect(p).map_or("unknown", |d| d.as_str());
                    (p.name.clone(), dialect)
                })
                .collect(),
            prometheus: None,
            configured_models,
            shared,
        })
    }

    /// Client keys, their limits and the admin key.
    pub(crate) fn clients(&self) -> &keys::Clients {
        &self.shared.clients
    }

    /// Serves `GET /metrics` from this Prometheus recorder's handle.
    pub fn with_prometheus(
        mut self,
        handle: metrics_exporter_prometheus::PrometheusHandle,
    ) -> Self {
        self.prometheus = Some(handle);
        self
    }

    fn route(&self, model: &str) -> Option<&Route> {
        self.routes
            .iter()
            .find(|r| pattern_matches(&r.pattern, model))
    }

    /// The front service: the model routes' stacks called directly, and
    /// the axum router (the same stacks, models, health, metrics) for the
    /// rest.
    pub(crate) fn front(self) -> front::Front {
        // Only the model routes are capped: health and metrics answer at
        // saturation.
        // One count over every shard of the gateway.
        let caps = self.shared.caps.clone();
        // The key check wraps the in-flight cap: a request without a valid
        // key never takes a slot.
        let identity = self.clients().identity();
        let gateway = Arc::new(self);
        let routes = front::ModelRoutes {
            chat: front::model_stack(
                identity.clone().dialect(OpenAiChat),
                caps.chat,
                &gateway,
                front::chat,
            ),
            messages: front::model_stack(
                identity.clone().dialect(AnthropicMessages),
                caps.messages,
                &gateway,
                front::messages,
            ),
            responses: front::model_stack(
                identity.clone().dialect(OpenAiResponses),
                caps.responses,
                &gateway,
                front::responses,
            ),
        };
        let router = Router::new()
            .route("/v1/chat/completions", post_service(routes.chat.clone()))
            .route("/v1/messages", post_service(routes.messages.clone()))
            .route("/v1/responses", post_service(routes.responses.clone()))
            .route(
                "/v1/models",
                get(models).layer(identity.dialect(OpenAiChat)),
            )
            .route("/v1/health/targets", get(health_targets))
            .route("/metrics", get(metrics_text))
            .route(
                "/healthz",
                get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
            )
            .with_state(gateway);
        front::Front::new(routes, router)
    }
}

/// An error answer in the OpenAI dialect's shape (chat completions and
/// Responses alike).
pub(crate) fn error_answer(
    status: StatusCode,
    class: FailureClass,
    message: &str,
    code: &str,
) -> Response {
    let body = OpenAiChat.error_body(&ErrorReply::coded(class, code, message));
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(OpenAiChat.error_content_type()),
    );
    response
}

/// A request body read once by a route's dialect: the raw bytes (each
/// target's body is spliced from them), what the turn requires, and the
/// dialect's parsed request. Every refusal is an answer in the dialect's
/// shape, written by `answer`.
pub(crate) struct ReadTurn<R> {
    pub(crate) bytes: bytes::Bytes,
    pub(crate) requirements: tower_llm_failover::dialect::Requirements,
    pub(crate) request: R,
}

/// Reads a model request's body within the gateway's limits and parses it
/// with `dialect`: 408 for a body cut by the read limits (the client's
/// pace, not a bad body), 413 over the size limit, 400 for an unreadable
/// body, bad JSON, a bad request or a model name that is a pattern.
pub(crate) async fn read_turn<D: Dialect>(
    dialect: &D,
    max_request_bytes: usize,
    body: Body,
    answer: state::ErrorAnswer,
) -> Result<ReadTurn<D::Request>, Response> {
    // Not `axum::body::to_bytes`: a one-frame body is kept as its `Bytes`,
    // with no list of frames on the heap.
    let bytes = match tower_llm_failover::limit::read_whole(body, max_request_bytes).await {
        Ok(bytes) => bytes,
        Err(error) => {
            if let Some(limit) = ReadLimitError::find_in(&*error) {
                return Err(answer(
                    StatusCode::REQUEST_TIMEOUT,
                    FailureClass::Timeout,
                    &limit.to_string(),
                    "request_body_timeout",
                ));
            }
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&*error);
            let mut too_large = false;
            while let Some(e) = source {
                too_large |= e.is::<http_body_util::LengthLimitError>();
                source = e.source();
            }
            return Err(if too_large {
                answer(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    FailureClass::PayloadTooLarge,
                    &format!("the request body exceeds the {max_request_bytes}-byte limit"),
                    "request_too_large",
                )
            } else {
                answer(
                    StatusCode::BAD_REQUEST,
                    FailureClass::InvalidRequest,
                    &format!("the request body could not be read: {error}"),
                    "invalid_body",
                )
            });
        }
    };
    // Read once, by the dialect: the model picks the route, and the failover
    // layer finds the parsed request in the extensions instead of parsing
    // it again.
    let (requirements, request) = match dialect.read_request(bytes.clone()) {
        Ok(parsed) => parsed,
        Err(error) => {
            return Err(answer(
                StatusCode::BAD_REQUEST,
                FailureClass::InvalidRequest,
                &error.to_string(),
                error.code(),
            ));
        }
    };
    // A model name is a name, not a pattern: `gpt-*` must not reach a
    // provider (or match a route) as if it were one.
    if requirements.model.contains(['*', '?']) {
        return Err(answer(
            StatusCode::BAD_REQUEST,
            FailureClass::InvalidRequest,
            &format!(
                "the model `{}` is not a model name",
                requirements.model.escape_debug()
            ),
            "invalid_model",
        ));
    }
    Ok(ReadTurn {
        bytes,
        requirements,
        request,
    })
}

pub(crate) async fn chat_completions(
    State(gateway): State<Arc<Gateway>>,
    request: Request,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let ReadTurn {
        bytes,
        requirements,
        request: chat,
    } = match read_turn(&OpenAiChat, gateway.max_request_bytes, body, error_answer).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let client = ClientId::of(&parts.extensions);
    let slot = match gateway
        .clients()
        .admit(&client, &requirements, &mut parts.extensions, error_answer)
        .await
    {
        Ok(slot) => slot,
        Err(refused) => return refused,
    };
    let Some(route) = gateway.route(&requirements.model) else {
        return error_answer(
            StatusCode::NOT_FOUND,
            FailureClass::ModelNotFound,
            &format!(
                "the model `{}` does not exist",
                requirements.model.escape_debug()
            ),
            "model_not_found",
        );
    };
    parts.extensions.insert(ParsedRequest {
        requirements,
        request: chat,
    });
    let request = http::Request::from_parts(parts, Full::new(bytes));
    keys::hold(run_turn(&route.service, request).await, slot)
}

/// The turn of `request` on a route's stack. The stack is called in
/// place, not through `oneshot`, whose state would take the request and
/// then the turn's future, each moved in; an `async` block, not an
/// `async fn`, which would copy the request into its body's locals.
pub(crate) fn run_turn<D: Dialect>(
    service: &Budget<Failover<UpstreamClient, D>, D>,
    request: http::Request<Full<bytes::Bytes>>,
) -> impl Future<Output = Response> + Send + use<D> {
    let mut service = service.clone();
    async move {
        let Ok(ready) = ServiceExt::<http::Request<Full<bytes::Bytes>>>::ready(&mut service).await;
        let Ok(response) = ready.call(request).await;
        response.map(Body::new)
    }
}

/// `GET /v1/models`: the model names a client can ask for (a wildcard
/// route's declared `models`; never a pattern).
async fn models(State(gateway): State<Arc<Gateway>>, request: Request) -> Response {
    let client = ClientId::of(request.extensions());
    let mut names: Vec<&str> = Vec::new();
    let chat = gateway.routes.iter().flat_map(|r| &r.listed);
    let others = gateway
        .messages
        .iter()
        .flat_map(|r| &r.listed)
        .chain(gateway.responses.iter().flat_map(|r| &r.listed));
    for name in chat.chain(others) {
        if !names.contains(&name.as_str()) && gateway.clients().may_list(&client, name) {
            names.push(name);
        }
    }
    let data: Vec<_> = names
        .iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "gateway"}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/health/targets`: every health key the gateway knows, with its
/// state, failure streak and last failure class.
async fn health_targets(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if !gateway.clients().is_admin(&headers) {
        return admin_refused();
    }
    let keys: Vec<_> = gateway
        .shared
        .health
        .snapshot()
        .into_iter()
        .map(|entry| {
            let mut json = serde_json::json!({
                "provider": entry.key.provider(),
                "dialect": gateway.dialects.get(entry.key.provider()).copied(),
                "model": entry.key.upstream_model(),
                "scope": entry.key.scope().to_string(),
                "state": entry.state.as_str(),
                "failure_streak": entry.failure_streak,
                "cooldowns": entry.cooldowns,
                "last_class": entry.last_class.map(|c| c.as_str()),
            });
            if let KeyState::Cooling { remaining, until } = entry.state {
                json["cooling_remaining_ms"] = serde_json::json!(remaining.as_millis() as u64);
                json["cooling_until_unix_ms"] = serde_json::json!(
                    until
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64)
                );
            }
            json
        })
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": keys})).into_response()
}

/// `GET /metrics`: Prometheus text, health and retry-budget figures read
/// at the scrape.
async fn metrics_text(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if !gateway.clients().is_admin(&headers) {
        return admin_refused();
    }
    let Some(handle) = &gateway.prometheus else {
        return StatusCode::NOT_FOUND.into_response();
    };
    // What the route stacks hold (`METRICS_BATCH`) goes in first.
    tower_llm_failover::observe::flush_metrics();
    // Only model names the operator configured become label values: a
    // client's invented names would be series Prometheus never forgets.
    tower_llm_failover::health::record_health_labelled(&*gateway.shared.health, &|model| {
        gateway.configured_models.contains(model)
    });
    gateway.shared.retry_budget.record_metrics();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        handle.render(),
    )
        .into_response()
}

/// The `401` of an operator endpoint asked without the admin key.
fn admin_refused() -> Response {
    let mut response = error_answer(
        StatusCode::UNAUTHORIZED,
        FailureClass::Auth,
        "this endpoint needs the gateway's admin key",
        "invalid_api_key",
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Serves `gateway` on `listener` with the `[server]` limits (see
/// `serve.rs`).
pub fn serve(gateway: Gateway, listener: tokio::net::TcpListener) -> Running {
    let (config, shutdown) = (
        gateway.shared.config.server.clone(),
        gateway.shared.shutdown.clone(),
    );
    serve::serve(gateway.front(), listener, &config, shutdown)
}

/// Serves `gateway` on `listener` thread per core: `[server] threads`
/// shards (0: one per core), each a thread with a single-threaded runtime
/// serving its connections to their end with upstream clients of its own
/// ([`Gateway::shard`]); the caller's runtime only accepts, giving each
/// connection to the shard with the fewest open ones. What shards share
/// (health, budgets, keys and their limits, the in-flight and connection
/// caps, the shutdown signal) is shared state, as on one runtime.
///
/// Why: on a work-stealing runtime, a request and the upstream connection
/// it uses often run on different workers, and every hand-over between
/// them is a cross-thread wake-up (a futex or an eventfd write, and a
/// context switch). A shard keeps a request and its upstream connection
/// on one thread.
pub fn serve_sharded(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
) -> Result<Running, String> {
    let count = match gateway.shared.config.server.threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    let mut gateways = (1..count)
        .map(|_| gateway.shard())
        .collect::<Result<Vec<_>, _>>()?;
    let (config, shutdown) = (
        gateway.shared.config.server.clone(),
        gateway.shared.shutdown.clone(),
    );
    gateways.push(gateway);
    let (threads, runtimes) =
        serve::ShardThreads::start(count).map_err(|e| format!("cannot start a shard: {e}"))?;
    let places = gateways
        .into_iter()
        .zip(runtimes)
        .map(|(gateway, runtime)| serve::Place {
            runtime: Some(runtime),
            front: gateway.front(),
        })
        .collect();
    Ok(serve::serve_on(
        places, threads, listener, &config, shutdown,
    ))
}
