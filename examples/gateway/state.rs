//! `[state]`: where the gateway keeps what its replicas share — health,
//! the retry budget and tenant spend. With `redis_url` every store is on
//! Redis (feature `redis`); without it, everything is in memory.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;
use serde::Deserialize;
use tower_llm_failover::budget::{
    Cost, MemorySpendStore, RetryBudget, RetryBudgetConfig, RunId, SpendStore, SpendWindow,
    TenantRefusal, TenantSpend, TurnBudget,
};
use tower_llm_failover::classify::FailureClass;
use tower_llm_failover::failover::{CooldownPolicy, HealthStore, MemoryHealthStore};
use tower_llm_failover::record::{self, StopReason};

/// `[state]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct StateConfig {
    /// `redis://host:port`: every store on Redis.
    pub(crate) redis_url: Option<String>,
    /// Key prefix in Redis (default `tlf`).
    pub(crate) prefix: Option<String>,
    /// How often a replica fetches the fleet's health view.
    pub(crate) health_refresh_ms: Option<u64>,
    /// The request header naming the tenant.
    pub(crate) tenant_header: Option<String>,
    /// The tenant ceiling per window, in USD.
    pub(crate) tenant_ceiling_usd: Option<f64>,
    /// `day` (default) or `month`, UTC.
    pub(crate) tenant_window: Option<String>,
    /// Let turns through when the spend store is unreachable (default:
    /// refuse them).
    pub(crate) spend_fail_open: bool,
    /// Refuse requests that name no tenant (400 `tenant_required`;
    /// default: they are not metered).
    pub(crate) require_tenant: bool,
}

/// Health, retry budget and spend store, as one backend builds them.
type Built = (Arc<dyn HealthStore>, RetryBudget, Arc<dyn SpendStore>);

/// The stores built from `[state]`.
pub(crate) struct Stores {
    pub(crate) health: Arc<dyn HealthStore>,
    pub(crate) retry_budget: RetryBudget,
    pub(crate) tenant: Option<TenantSpend>,
    /// Per-key rate limits shared on Redis (`None`: in memory).
    pub(crate) rate_limits: Option<Arc<dyn tower_llm_failover::limit::RateLimitStore>>,
}

impl Stores {
    pub(crate) fn build(
        state: Option<&StateConfig>,
        cooldown: CooldownPolicy,
        retry: RetryBudgetConfig,
    ) -> Result<Self, String> {
        let state = state.cloned().unwrap_or_default();
        let (health, retry_budget, spend): (
            Arc<dyn HealthStore>,
            RetryBudget,
            Arc<dyn SpendStore>,
        ) = match &state.redis_url {
            None => (
                Arc::new(MemoryHealthStore::new(cooldown)),
                RetryBudget::new(retry).map_err(|e| format!("budget: {e}"))?,
                Arc::new(MemorySpendStore::new()),
            ),
            Some(url) => on_redis(url, &state, cooldown, retry)?,
        };
        let tenant = match (&state.tenant_header, state.tenant_ceiling_usd) {
            (Some(header), Some(usd)) => {
                let header = HeaderName::from_bytes(header.as_bytes())
                    .map_err(|e| format!("state.tenant_header: {e}"))?;
                let window = match state.tenant_window.as_deref().unwrap_or("day") {
                    "day" => SpendWindow::Day,
                    "month" => SpendWindow::Month,
                    other => return Err(format!("state.tenant_window: unknown {other}")),
                };
                Some(
                    TenantSpend::new(spend, header, window, Cost::from_usd(usd))
                        .fail_open(state.spend_fail_open)
                        .require_tenant(state.require_tenant),
                )
            }
            (None, None) if state.require_tenant => {
                return Err(
                    "state.require_tenant needs tenant_header and tenant_ceiling_usd".to_owned(),
                );
            }
            (None, None) => None,
            _ => return Err("state: tenant_header and tenant_ceiling_usd go together".to_owned()),
        };
        let rate_limits = rate_limits_on(&state)?;
        Ok(Self {
            health,
            retry_budget,
            tenant,
            rate_limits,
        })
    }
}

#[cfg(feature = "redis")]
fn on_redis(
    url: &str,
    state: &StateConfig,
    cooldown: CooldownPolicy,
    retry: RetryBudgetConfig,
) -> Result<Built, String> {
    use std::time::Duration;
    use tower_llm_failover::redis::{
        DEFAULT_PREFIX, RedisHealthStore, RedisRetryBudget, RedisSpendStore, connect,
    };
    let connection = connect(url).map_err(|e| format!("state.redis_url: {e}"))?;
    let prefix = state.prefix.clone().unwrap_or(DEFAULT_PREFIX.to_owned());
    let health = RedisHealthStore::builder(connection.clone())
        .policy(cooldown)
        .prefix(prefix.clone())
        .refresh_every(Duration::from_millis(
            state.health_refresh_ms.unwrap_or(250),
        ))
        .start()
        .map_err(|e| e.to_string())?;
    let retry_budget = RedisRetryBudget::builder(connection.clone(), retry)
        .prefix(prefix.clone())
        .start()
        .map_err(|e| format!("budget: {e}"))?
        .into_retry_budget();
    let spend = RedisSpendStore::new(connection).prefix(prefix);
    tracing::info!("shared state on Redis");
    Ok((Arc::new(health), retry_budget, Arc::new(spend)))
}

/// Per-key rate limits on Redis when `redis_url` is set.
#[cfg(feature = "redis")]
fn rate_limits_on(
    state: &StateConfig,
) -> Result<Option<Arc<dyn tower_llm_failover::limit::RateLimitStore>>, String> {
    use tower_llm_failover::redis::{DEFAULT_PREFIX, RedisRateLimits, connect};
    let Some(url) = &state.redis_url else {
        return Ok(None);
    };
    let connection = connect(url).map_err(|e| format!("state.redis_url: {e}"))?;
    let prefix = state.prefix.clone().unwrap_or(DEFAULT_PREFIX.to_owned());
    Ok(Some(Arc::new(
        RedisRateLimits::new(connection).prefix(prefix),
    )))
}

#[cfg(not(feature = "redis"))]
fn rate_limits_on(
    _state: &StateConfig,
) -> Result<Option<Arc<dyn tower_llm_failover::limit::RateLimitStore>>, String> {
    Ok(None)
}

#[cfg(not(feature = "redis"))]
fn on_redis(
    _url: &str,
    _state: &StateConfig,
    _cooldown: CooldownPolicy,
    _retry: RetryBudgetConfig,
) -> Result<Built, String> {
    Err("state.redis_url: this gateway was built without the `redis` feature".to_owned())
}

/// Runs `turn` under the tenant's ceiling: refused when the tenant's spend
/// reached it (402) or the store cannot tell (503, unless it fails open);
/// otherwise the turn's cost is added once its body is done. A refusal is
/// written by `answer`, in the route's dialect.
pub(crate) async fn metered<F>(
    tenant: Option<&TenantSpend>,
    headers: &axum::http::HeaderMap,
    turn: F,
    answer: ErrorAnswer,
) -> Response
where
    F: std::future::Future<Output = Response>,
{
    let Some(spend) = tenant else {
        return turn.await;
    };
    let name = match spend.admit(headers).await {
        Ok(name) => name,
        Err(refusal) => {
            // Refused before any attempt: the turn still leaves its line.
            let run_id = RunId::random();
            tracing::info!(run_id = %run_id, %refusal, "tenant check refused the turn");
            record::refused_turn(&run_id, stop_reason(&refusal));
            let mut response = refused(&refusal, answer);
            if let Ok(value) = HeaderValue::from_str(run_id.as_str()) {
                response.headers_mut().insert(record::RUN_ID_HEADER, value);
            }
            return response;
        }
    };
    let response = turn.await;
    let (Some(name), Some(budget)) = (name, response.extensions().get::<TurnBudget>().cloned())
    else {
        return response;
    };
    // Adds the turn's cost when the body is done (or dropped): a stream's
    // usage is known only at its end.
    let guard = Recorder {
        spend: spend.clone(),
        tenant: name,
        budget,
    };
    response.map(move |body| {
        Body::new(body.map_frame(move |frame| {
            let _ = &guard;
            frame
        }))
    })
}

struct Recorder {
    spend: TenantSpend,
    tenant: String,
    budget: TurnBudget,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let (cost, _) = self.budget.spent();
        if cost.is_zero() {
            return;
        }
        let spend = self.spend.clone();
        let tenant = std::mem::take(&mut self.tenant);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(error) = spend.record(&tenant, cost).await {
                    tracing::error!(%error, "a turn's cost could not be added to its tenant");
                }
            });
        }
    }
}

/// Writes an error answer in a route's dialect: status, class, message, code.
pub(crate) type ErrorAnswer = fn(StatusCode, FailureClass, &str, &str) -> Response;

fn stop_reason(refusal: &TenantRefusal) -> StopReason {
    match refusal {
        TenantRefusal::Ceiling { .. } => StopReason::TenantCeiling,
        TenantRefusal::NoTenant(_) => StopReason::TenantRequired,
        _ => StopReason::SpendStoreUnavailable,
    }
}

fn refused(refusal: &TenantRefusal, answer: ErrorAnswer) -> Response {
    match refusal {
        TenantRefusal::Ceiling { .. } => answer(
            StatusCode::PAYMENT_REQUIRED,
            FailureClass::QuotaExhausted,
            &refusal.to_string(),
            "tenant_spend_ceiling_reached",
        ),
        TenantRefusal::NoTenant(_) => answer(
            StatusCode::BAD_REQUEST,
            FailureClass::InvalidRequest,
            &refusal.to_string(),
            "tenant_required",
        ),
        _ => {
            // The store's error (addresses, Redis' own text) is for the
            // log, not for the client.
            tracing::error!(error = %refusal, "tenant spend could not be checked; turn refused");
            answer(
                StatusCode::SERVICE_UNAVAILABLE,
                FailureClass::Overloaded,
                "the tenant's spend could not be checked; try again later",
                "spend_store_unavailable",
            )
        }
    }
}
