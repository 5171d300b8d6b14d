//! `[state]`: where the gateway keeps what its replicas share — health,
//! the retry budget and tenant spend. With `redis_url` every store is on
//! Redis (feature `redis`); without it, everything is in memory.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use tower_llm_failover::budget::{
    Cost, MemorySpendStore, RetryBudget, RetryBudgetConfig, SpendStore, SpendWindow, TenantSpend,
};
use tower_llm_failover::classify::FailureClass;
use tower_llm_failover::failover::{CooldownPolicy, HealthStore, MemoryHealthStore};

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
    /// The request header naming the tenant, trusted as it is (a gateway
    /// behind an authenticating proxy): a client without a key identity
    /// is metered as the tenant it names.
    pub(crate) tenant_header: Option<String>,
    /// The tenant ceiling per window, in USD.
    pub(crate) tenant_ceiling_usd: Option<f64>,
    /// `day` (default) or `month`, UTC.
    pub(crate) tenant_window: Option<String>,
    /// Let turns through when the spend store is unreachable (default:
    /// refuse them).
    pub(crate) spend_fail_open: bool,
    /// Refuse requests whose client names no tenant (400
    /// `tenant_required`; default: they are not metered).
    pub(crate) require_tenant: bool,
}

/// Health, retry budget and spend store, as one backend builds them.
type Built = (Arc<dyn HealthStore>, RetryBudget, Arc<dyn SpendStore>);

/// The stores built from `[state]`.
pub(crate) struct Stores {
    pub(crate) health: Arc<dyn HealthStore>,
    pub(crate) retry_budget: RetryBudget,
    /// Every route's budget layer meters tenants with it.
    pub(crate) tenant: Option<TenantSpend>,
    /// Per-key rate limits shared on Redis (`None`: in memory).
    pub(crate) rate_limits: Option<Arc<dyn tower_llm_failover::limit::RateLimitStore>>,
    /// `[state] tenant_header`: the older name of `[tenants] trust_header`.
    pub(crate) tenant_header: Option<String>,
    /// Where spend is added up (per-key ceilings use it too).
    pub(crate) spend: Arc<dyn SpendStore>,
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
        // An alias of `[tenants] trust_header`, read by the identity layer.
        let tenant_header = state.tenant_header.clone();
        // The tenant comes from the client's identity (a key's tenant) or,
        // when configured, the trusted header; the ceiling applies to both.
        let tenant = match state.tenant_ceiling_usd {
            Some(usd) => {
                let window = match state.tenant_window.as_deref().unwrap_or("day") {
                    "day" => SpendWindow::Day,
                    "month" => SpendWindow::Month,
                    other => return Err(format!("state.tenant_window: unknown {other}")),
                };
                Some(
                    TenantSpend::new(Arc::clone(&spend), window, Cost::from_usd(usd))
                        .fail_open(state.spend_fail_open)
                        .require_tenant(state.require_tenant),
                )
            }
            None if state.require_tenant => {
                return Err("state.require_tenant needs tenant_ceiling_usd".to_owned());
            }
            None if tenant_header.is_some() => {
                return Err("state.tenant_header needs tenant_ceiling_usd".to_owned());
            }
            None => None,
        };
        let rate_limits = rate_limits_on(&state)?;
        Ok(Self {
            health,
            retry_budget,
            tenant,
            rate_limits,
            tenant_header,
            spend,
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

/// Writes an error answer in a route's dialect: status, class, message, code.
pub(crate) type ErrorAnswer = fn(StatusCode, FailureClass, &str, &str) -> Response;
