//! `[[keys]]`, `[tenants]` and `[admin]`: who may use the gateway, for
//! which models, and how much.
//!
//! With no key configured every request is the one anonymous client, as
//! before keys existed. With any key configured:
//!
//! - A model request must carry a key (`Authorization: Bearer <key>` or
//!   `x-api-key: <key>`); a missing or unknown one gets `401` in the
//!   route's dialect. Keys are compared as SHA-256 digests in constant
//!   time (the library's `ApiKeys`), never logged and never forwarded.
//! - A model outside the key's `models` gets `403` (`404` with
//!   `hide_unlisted_models`, so the key cannot learn the model exists),
//!   and `GET /v1/models` lists only what the key may use.
//! - Over `requests_per_minute`, `tokens_per_minute` (the request's
//!   prompt estimate plus its output limit, taken at admission) or
//!   `max_in_flight` (a stream holds its slot until its end), the answer
//!   is `429` with `retry-after`. Other keys are unaffected. With
//!   `[state] redis_url` the per-minute counts are shared by every replica.
//! - `spend_usd_per_day` and `spend_usd_per_month` hold the key to its
//!   own ceilings beside its tenant's: each attempt reserves its estimate
//!   under the key's account too, and the turn settles it; past either,
//!   `402 tenant_spend_ceiling_reached`.
//! - `/metrics` and `/v1/health/targets` need the admin key
//!   (`[admin] key_env`); without one configured they answer `401`.
//! - The tenant is the key's `tenant` (default: its name). A tenant header
//!   is read only when `[tenants] trust_header` names it, for a gateway
//!   behind a proxy that sets it.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt;
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_llm_failover::FailureClass;
use tower_llm_failover::dialect::Requirements;
use tower_llm_failover::identity::{ApiKeys, ClientId, IdentityLayer};
use tower_llm_failover::limit::{
    MemoryRateLimits, PerMinute, RateDecision, RateLimitStore, retry_after_seconds,
};
use tower_llm_failover::{
    Cost, budget::SpendCeilings, budget::SpendStore, budget::SpendWindow, budget::TenantSpend,
};

use crate::app::pattern_matches;
use crate::state::ErrorAnswer;

/// One `[[keys]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// The operator's name for the key: logs, records and limits use it.
    pub name: String,
    /// The environment variable holding the key.
    pub key_env: Option<String>,
    /// Or the key's SHA-256, as 64 hex digits.
    pub key_sha256: Option<String>,
    /// Who pays (default: the name).
    pub tenant: Option<String>,
    /// Model patterns the key may ask for (`*` as wildcard; default all).
    pub models: Option<Vec<String>>,
    /// Answer a model outside `models` with 404 instead of 403.
    #[serde(default)]
    pub hide_unlisted_models: bool,
    /// Model requests of this key per minute.
    pub requests_per_minute: Option<u32>,
    /// Tokens of this key per minute: each request's prompt estimate plus
    /// its output limit, taken at admission.
    pub tokens_per_minute: Option<u32>,
    /// Model requests of this key at once (a stream until its end).
    pub max_in_flight: Option<usize>,
    /// This key's own spend ceilings, USD per UTC day and month (beside
    /// its tenant's `[state] tenant_ceiling_usd`).
    pub spend_usd_per_day: Option<f64>,
    /// The key's ceiling per UTC month, USD.
    pub spend_usd_per_month: Option<f64>,
}

/// `[tenants]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsConfig {
    /// The request header naming the tenant, trusted (set it only behind a
    /// proxy that authenticates clients and sets the header itself).
    pub trust_header: Option<String>,
}

/// `[admin]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// The environment variable holding the admin key.
    pub key_env: Option<String>,
    /// Or the admin key's SHA-256, as 64 hex digits.
    pub key_sha256: Option<String>,
}

/// What one key may do.
#[derive(Debug)]
struct KeyPolicy {
    models: Option<Vec<String>>,
    hide_unlisted: bool,
    requests: Option<PerMinute>,
    tokens: Option<PerMinute>,
    in_flight: Option<Arc<Semaphore>>,
    /// The key's own spend ceilings, reserved and settled with each turn
    /// (`None`: it has none).
    ceilings: Option<SpendCeilings>,
}

/// The gateway's clients: the key table, each key's policy, and where the
/// per-minute counts live.
pub(crate) struct Clients {
    keys: ApiKeys,
    policies: HashMap<String, KeyPolicy>,
    rates: Arc<dyn RateLimitStore>,
    admin: Option<ApiKeys>,
    tenant_header: Option<HeaderName>,
    /// Limits that cannot be read (the rate store down) refuse the request.
    fail_open: bool,
}

impl Clients {
    pub(crate) fn build(
        keys: &[KeyConfig],
        tenants: &TenantsConfig,
        admin: &AdminConfig,
        rates: Option<Arc<dyn RateLimitStore>>,
        spend: &Arc<dyn SpendStore>,
        fail_open: bool,
    ) -> Result<Self, String> {
        let mut table = ApiKeys::new();
        let mut policies = HashMap::new();
        for key in keys {
            if policies.contains_key(&key.name) {
                return Err(format!("keys: `{}` is named twice", key.name));
            }
            let client = ClientId::key(key.name.as_str())
                .with_tenant(key.tenant.clone().unwrap_or_else(|| key.name.clone()));
            table = match (&key.key_env, &key.key_sha256) {
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "keys: `{}`: key_env and key_sha256 exclude each other",
                        key.name
                    ));
                }
                (Some(var), None) => {
                    let secret = std::env::var(var)
                        .map_err(|_| format!("keys: `{}`: ${var} is not set", key.name))?;
                    if secret.trim().is_empty() {
                        return Err(format!("keys: `{}`: ${var} is empty", key.name));
                    }
                    table.key(client, secret.trim())
                }
                (None, Some(hex)) => table
                    .key_sha256(client, hex)
                    .map_err(|e| format!("keys: {e}"))?,
                (None, None) => {
                    return Err(format!(
                        "keys: `{}` needs one of key_env and key_sha256",
                        key.name
                    ));
                }
            };
            policies.insert(
                key.name.clone(),
                KeyPolicy {
                    models: key.models.clone(),
                    hide_unlisted: key.hide_unlisted_models,
                    requests: key.requests_per_minute.and_then(PerMinute::new),
                    tokens: key.tokens_per_minute.and_then(PerMinute::new),
                    in_flight: key.max_in_flight.map(|n| Arc::new(Semaphore::new(n))),
                    ceilings: key_ceilings(key, spend, fail_open),
                },
            );
        }
        let admin = match (&admin.key_env, &admin.key_sha256) {
            (None, None) => None,
            (Some(var), None) => {
                let secret = std::env::var(var).map_err(|_| format!("admin: ${var} is not set"))?;
                Some(ApiKeys::new().key(ClientId::key("admin"), secret.trim()))
            }
            (None, Some(hex)) => Some(
                ApiKeys::new()
                    .key_sha256(ClientId::key("admin"), hex)
                    .map_err(|e| format!("admin: {e}"))?,
            ),
            (Some(_), Some(_)) => {
                return Err("admin: key_env and key_sha256 exclude each other".to_owned());
            }
        };
        let tenant_header = tenants
            .trust_header
            .as_deref()
            .map(|h| HeaderName::from_bytes(h.as_bytes()).map_err(|e| format!("tenants: {e}")))
            .transpose()?;
        Ok(Self {
            keys: table,
            policies,
            rates: rates.unwrap_or_else(|| Arc::new(MemoryRateLimits::new())),
            admin,
            tenant_header,
            fail_open,
        })
    }

    /// The identity layer of one route's dialect.
    pub(crate) fn identity(&self) -> IdentityLayer {
        let layer = IdentityLayer::new(self.keys.clone());
        match &self.tenant_header {
            Some(header) => layer.trust_tenant_header(header.clone()),
            None => layer,
        }
    }

    /// Whether keys are configured.
    pub(crate) fn enforced(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Whether `headers` carry the admin key (always true without keys).
    pub(crate) fn is_admin(&self, headers: &HeaderMap) -> bool {
        if !self.enforced() {
            return true;
        }
        let Some(admin) = &self.admin else {
            return false;
        };
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.get(..7)
                    .filter(|s| s.eq_ignore_ascii_case("bearer "))
                    .map(|_| &v[7..])
            })
            .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
        presented.is_some_and(|k| admin.find(k.trim().as_bytes()).is_some())
    }

    /// Whether `client` may see `model` listed.
    pub(crate) fn may_list(&self, client: &ClientId, model: &str) -> bool {
        self.policy(client)
            .and_then(|p| p.models.as_ref())
            .is_none_or(|models| models.iter().any(|m| pattern_matches(m, model)))
    }

    fn policy(&self, client: &ClientId) -> Option<&KeyPolicy> {
        client.key_name().and_then(|k| self.policies.get(k))
    }

    /// Admits a turn of `client` for `requirements`: the model list, the
    /// per-minute limits and the key's in-flight slot, or the refusal in
    /// the route's dialect. The slot, if any, is held by what this returns;
    /// the key's own spend ceilings go into `extensions`, for the route's
    /// budget layer to reserve with each attempt.
    pub(crate) async fn admit(
        &self,
        client: &ClientId,
        requirements: &Requirements,
        extensions: &mut http::Extensions,
        answer: ErrorAnswer,
    ) -> Result<Option<OwnedSemaphorePermit>, Response> {
        let Some(policy) = self.policy(client) else {
            return Ok(None);
        };
        if let Some(ceilings) = &policy.ceilings {
            extensions.insert(ceilings.clone());
        }
        let name = client.label();
        if let Some(models) = &policy.models
            && !models
                .iter()
                .any(|m| pattern_matches(m, &requirements.model))
        {
            return Err(if policy.hide_unlisted {
                answer(
                    StatusCode::NOT_FOUND,
                    FailureClass::ModelNotFound,
                    &format!(
                        "the model `{}` does not exist",
                        requirements.model.escape_debug()
                    ),
                    "model_not_found",
                )
            } else {
                answer(
                    StatusCode::FORBIDDEN,
                    FailureClass::PermissionDenied,
                    &format!(
                        "this key may not use the model `{}`",
                        requirements.model.escape_debug()
                    ),
                    "model_not_allowed",
                )
            });
        }
        if let Some(rate) = policy.requests {
            self.take(&format!("rpm:{name}"), rate, 1, "requests", answer)
                .await?;
        }
        if let Some(rate) = policy.tokens {
            let tokens = requirements
                .input_tokens
                .saturating_add(requirements.max_output_tokens.unwrap_or(0));
            let tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
            self.take(&format!("tpm:{name}"), rate, tokens, "tokens", answer)
                .await?;
        }
        match &policy.in_flight {
            None => Ok(None),
            Some(slots) => match Arc::clone(slots).try_acquire_owned() {
                Ok(permit) => Ok(Some(permit)),
                Err(_) => Err(limited(
                    answer,
                    "this key has as many requests in flight as it may",
                    "in_flight_limit_exceeded",
                    1,
                )),
            },
        }
    }

    async fn take(
        &self,
        bucket: &str,
        rate: PerMinute,
        units: u32,
        what: &str,
        answer: ErrorAnswer,
    ) -> Result<(), Response> {
        match self.rates.take(bucket, rate, units).await {
            Ok(RateDecision::Allowed) => Ok(()),
            Ok(RateDecision::Limited { retry_after }) => Err(limited(
                answer,
                &format!("this key is over its {what} per minute"),
                "rate_limit_exceeded",
                retry_after_seconds(retry_after),
            )),
            Err(error) if self.fail_open => {
                tracing::warn!(%error, "rate limits unreadable; request let through (fail open)");
                Ok(())
            }
            Err(error) => {
                tracing::error!(%error, "rate limits unreadable; request refused");
                Err(answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    FailureClass::Overloaded,
                    "the gateway's limits could not be checked; try again later",
                    "limits_unavailable",
                ))
            }
        }
    }
}

/// The account a key's own ceilings are kept under: `key`, a unit
/// separator (no header value holds one, so no tenant can be named so),
/// and the key's name.
fn key_account(name: &str) -> String {
    format!("key\u{1f}{name}")
}

fn key_ceilings(
    key: &KeyConfig,
    spend: &Arc<dyn SpendStore>,
    fail_open: bool,
) -> Option<SpendCeilings> {
    let mut ceilings = None;
    for (usd, window) in [
        (key.spend_usd_per_day, SpendWindow::Day),
        (key.spend_usd_per_month, SpendWindow::Month),
    ] {
        if let Some(usd) = usd {
            let mut ceiling = TenantSpend::new(Arc::clone(spend), window, Cost::from_usd(usd));
            ceiling.fail_open = fail_open;
            let held = ceilings.take().unwrap_or_else(SpendCeilings::new);
            ceilings = Some(held.ceiling(ceiling, key_account(&key.name)));
        }
    }
    ceilings
}

/// A `429` with `retry-after`.
fn limited(answer: ErrorAnswer, message: &str, code: &str, seconds: u64) -> Response {
    let mut response = answer(
        StatusCode::TOO_MANY_REQUESTS,
        FailureClass::RateLimited,
        message,
        code,
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// Holds `permit` until the response body is done or dropped.
pub(crate) fn hold(response: Response, permit: Option<OwnedSemaphorePermit>) -> Response {
    match permit {
        None => response,
        Some(permit) => response.map(move |body| {
            Body::new(body.map_frame(move |frame| {
                let _ = &permit;
                frame
            }))
        }),
    }
}
