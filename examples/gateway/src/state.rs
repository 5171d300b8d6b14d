//! `[state]`: where the gateway keeps what its replicas share — health,
//! the retry budget and tenant spend. With one of `redis_url` (`redis://`
//! or `rediss://`), `redis_cluster_urls` or `redis_sentinel` every store
//! is on Redis; without them, everything is in memory.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use tower_llm_failover::FailureClass;
use tower_llm_failover::{
    Cost, budget::MemorySpendStore, budget::RetryBudget, budget::RetryBudgetConfig,
    budget::SpendStore, budget::SpendWindow, budget::TenantSpend,
};
use tower_llm_failover::{health::CooldownPolicy, health::HealthStore, health::MemoryHealthStore};

/// `[state]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// `redis://host:port` or `rediss://host:port` (TLS): every store on
    /// one Redis.
    pub redis_url: Option<String>,
    /// PEM file of the CA(s) to trust for `rediss://` (`redis_url`,
    /// `redis_cluster_urls`) instead of the platform's roots.
    pub redis_ca_file: Option<String>,
    /// Some nodes of a Redis Cluster: every store on the cluster.
    pub redis_cluster_urls: Option<Vec<String>>,
    /// A Sentinel-managed primary: every store on it.
    pub redis_sentinel: Option<SentinelConfig>,
    /// Key prefix in Redis (default `tlf`).
    pub prefix: Option<String>,
    /// How often a replica fetches the fleet's health view.
    pub health_refresh_ms: Option<u64>,
    /// The request header naming the tenant, trusted as it is (a gateway
    /// behind an authenticating proxy): a client without a key identity
    /// is metered as the tenant it names.
    pub tenant_header: Option<String>,
    /// The tenant ceiling per window, in USD.
    pub tenant_ceiling_usd: Option<f64>,
    /// `day` (default) or `month`, UTC.
    pub tenant_window: Option<String>,
    /// Let turns through when the spend store is unreachable (default:
    /// refuse them).
    pub spend_fail_open: bool,
    /// Refuse requests whose client names no tenant (400
    /// `tenant_required`; default: they are not metered).
    pub require_tenant: bool,
}

/// `[state] redis_sentinel = { urls = [...], service = "mymaster" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    /// The sentinels (`redis://` or `rediss://`; with `rediss://` the
    /// primary is reached with TLS too).
    pub urls: Vec<String>,
    /// The name the sentinels monitor the primary under.
    pub service: String,
}

/// The per-key rate-limit store, when shared.
type RateLimits = Option<Arc<dyn tower_llm_failover::limit::RateLimitStore>>;

/// Health, retry budget, spend store and shared rate limits, as one
/// backend builds them.
type Built = (
    Arc<dyn HealthStore>,
    RetryBudget,
    Arc<dyn SpendStore>,
    RateLimits,
);

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
        let redis = [
            state.redis_url.is_some(),
            state.redis_cluster_urls.is_some(),
            state.redis_sentinel.is_some(),
        ];
        let (health, retry_budget, spend, rate_limits): Built =
            match redis.iter().filter(|set| **set).count() {
                0 if state.redis_ca_file.is_some() => {
                    return Err("state.redis_ca_file needs a Redis to trust".to_owned());
                }
                0 => (
                    Arc::new(MemoryHealthStore::new(cooldown)),
                    RetryBudget::new(retry).map_err(|e| format!("budget: {e}"))?,
                    Arc::new(MemorySpendStore::new()),
                    None,
                ),
                1 => on_redis(&state, cooldown, retry)?,
                _ => {
                    return Err(
                        "state: one of redis_url, redis_cluster_urls, redis_sentinel".to_owned(),
                    );
                }
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
                let mut tenant = TenantSpend::new(Arc::clone(&spend), window, Cost::from_usd(usd));
                tenant.fail_open = state.spend_fail_open;
                tenant.require_tenant = state.require_tenant;
                Some(tenant)
            }
            None if state.require_tenant => {
                return Err("state.require_tenant needs tenant_ceiling_usd".to_owned());
            }
            None if tenant_header.is_some() => {
                return Err("state.tenant_header needs tenant_ceiling_usd".to_owned());
            }
            None => None,
        };
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

fn on_redis(
    state: &StateConfig,
    cooldown: CooldownPolicy,
    retry: RetryBudgetConfig,
) -> Result<Built, String> {
    use tower_llm_redis::{TlsCertificates, connect, connect_sentinel, connect_tls};
    let tls = match &state.redis_ca_file {
        Some(path) => Some(TlsCertificates {
            client_tls: None,
            root_cert: Some(
                std::fs::read(path).map_err(|e| format!("state.redis_ca_file {path}: {e}"))?,
            ),
        }),
        None => None,
    };
    if let Some(url) = &state.redis_url {
        let url = url.as_str();
        return match &tls {
            Some(tls) => stores_on(
                || connect_tls(url, tls.clone()).map_err(|e| format!("state.redis_url: {e}")),
                state,
                cooldown,
                retry,
            ),
            None => stores_on(
                || connect(url).map_err(|e| format!("state.redis_url: {e}")),
                state,
                cooldown,
                retry,
            ),
        };
    }
    if let Some(urls) = &state.redis_cluster_urls {
        return on_cluster(urls, tls, state, cooldown, retry);
    }
    if let Some(sentinel) = &state.redis_sentinel {
        if tls.is_some() {
            // redis-rs' SentinelClientBuilder takes a CA for the primary,
            // but not from a URL list; not wired here.
            return Err("state.redis_ca_file is not supported with redis_sentinel".to_owned());
        }
        return stores_on(
            || {
                connect_sentinel(&sentinel.urls, &sentinel.service)
                    .map_err(|e| format!("state.redis_sentinel: {e}"))
            },
            state,
            cooldown,
            retry,
        );
    }
    Err("state: no Redis configured".to_owned())
}

fn on_cluster(
    urls: &[String],
    tls: Option<tower_llm_redis::TlsCertificates>,
    state: &StateConfig,
    cooldown: CooldownPolicy,
    retry: RetryBudgetConfig,
) -> Result<Built, String> {
    use tower_llm_redis::connect_cluster;
    stores_on(
        || connect_cluster(urls, tls.clone()).map_err(|e| format!("state.redis_cluster_urls: {e}")),
        state,
        cooldown,
        retry,
    )
}

/// Every store on connections from `connect`. The health store gets a
/// connection of its own: its refresh (every `health_refresh_ms`, a reply
/// that grows with the fleet's keys) must not queue ahead of the spend
/// reservations and rate-limit takes on a request's path. The retry
/// budget (a background sync) shares the spend store's.
fn stores_on<C>(
    connect: impl Fn() -> Result<C, String>,
    state: &StateConfig,
    cooldown: CooldownPolicy,
    retry: RetryBudgetConfig,
) -> Result<Built, String>
where
    C: ::redis::aio::ConnectionLike + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    use std::time::Duration;
    use tower_llm_redis::{
        DEFAULT_PREFIX, RedisHealthStore, RedisRateLimits, RedisRetryBudget, RedisSpendStore,
    };
    let prefix = state.prefix.clone().unwrap_or(DEFAULT_PREFIX.to_owned());
    let health = RedisHealthStore::builder(connect()?)
        .policy(cooldown)
        .prefix(prefix.clone())
        .refresh_every(Duration::from_millis(
            state.health_refresh_ms.unwrap_or(250),
        ))
        .start()
        .map_err(|e| e.to_string())?;
    let connection = connect()?;
    let retry_budget = RedisRetryBudget::builder(connection.clone(), retry)
        .prefix(prefix.clone())
        .start()
        .map_err(|e| format!("budget: {e}"))?
        .into_retry_budget();
    let spend = RedisSpendStore::new(connection).prefix(prefix.clone());
    let rate_limits = RedisRateLimits::new(connect()?).prefix(prefix);
    tracing::info!("shared state on Redis");
    Ok((
        Arc::new(health),
        retry_budget,
        Arc::new(spend),
        Some(Arc::new(rate_limits)),
    ))
}

/// Writes an error answer in a route's dialect: status, class, message, code.
pub(crate) type ErrorAnswer = fn(StatusCode, FailureClass, &str, &str) -> Response;
