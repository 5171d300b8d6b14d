//! Shared state on Redis: health, action claims, the retry budget and tenant
//! spend hold across every replica of a gateway.
//!
//! Every store is generic over the connection: a
//! [`ConnectionManager`](::redis::aio::ConnectionManager) (multiplexed,
//! reconnects on its own; [`connect`], [`connect_tls`] for `rediss://`), a
//! cluster connection (feature `cluster`: `connect_cluster`), a
//! Sentinel-managed primary ([`connect_sentinel`]), or any
//! [`ConnectionLike`](::redis::aio::ConnectionLike) that is `Clone` and
//! `Debug`.
//! Each state change is one Lua script, so one atomic round trip, and the
//! keys of one change share a hash tag, so they live in one cluster slot.
//!
//! | store | keys | when Redis is unreachable |
//! |---|---|---|
//! | [`RedisHealthStore`] | `{<prefix>:health}:…` (one slot: health state is small) | serves from its local view; transitions are applied locally and logged as not shared |
//! | [`RedisActionStore`] | `{<prefix>:action:<id>}` per action (`{<prefix>:taction:<len>:<tenant>:<id>}` in a tenant's namespace) | fails closed: [`StoreError::Unavailable`](tower_llm_actions::StoreError::Unavailable), no effect runs |
//! | [`RedisRetryBudget`] | `{<prefix>:retry}:…` | falls back to a local budget of the same settings |
//! | [`RedisRateLimits`] | `{<prefix>:rate:<bucket>}` per client bucket | fails closed or open, as the caller decides on [`RateLimitError`](tower_llm_failover::limit::RateLimitError) |
//! | [`RedisSpendStore`] | `{<prefix>:spend:<tenant>}:<window>` | fails closed, or open when configured ([`SpendStore`](tower_llm_failover::budget::SpendStore)) |
//!
//! When Redis comes back, the connection manager reconnects and every store
//! carries on without a restart.
//!
//! Run Redis with `maxmemory-policy noeviction`. Finished action records,
//! spend counters and the health and retry keys carry a TTL, so not only
//! `allkeys-*` but also `volatile-*` policies may evict them: an evicted
//! finished action record lets a resubmitted action run its effect again,
//! an evicted spend counter forgets a tenant's spend.
//! Under `noeviction` a full Redis answers writes with OOM instead: action
//! claims fail closed, spend checks follow their fail-open policy, and
//! health and the retry budget fall back to their local state.
//!
//! The request's happy path (a healthy key admitted, a success on a key
//! without state) makes no round trip: [`RedisHealthStore`] answers from a
//! local view and ships transitions in the background; replicas learn each
//! other's transitions by a cheap versioned refresh.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tower_llm_failover::health::CooldownPolicy;
//! use tower_llm_redis::{RedisActionStore, RedisHealthStore, connect};
//!
//! // The health store's background refresh gets a connection of its own,
//! // so it never queues ahead of action claims.
//! let health = Arc::new(RedisHealthStore::builder(connect("redis://127.0.0.1:6379")?)
//!     .policy(CooldownPolicy::default())
//!     .start()?);
//! let actions = Arc::new(RedisActionStore::new(connect("redis://127.0.0.1:6379")?));
//! # let _ = (health, actions);
//! # Ok(()) }
//! ```

mod action;
mod connect;
mod health;
mod rate;
mod retry_budget;
mod sentinel;
mod spend;

use std::time::Duration;

use ::redis::RedisError;

/// TLS settings of [`connect_tls`] and [`connect_cluster`] (redis-rs').
pub use ::redis::{ClientTlsConfig, TlsCertificates};
pub use action::RedisActionStore;
#[cfg(feature = "cluster")]
pub use connect::{RedisClusterConnection, connect_cluster};
pub use connect::{connect, connect_tls};
pub use health::{RedisHealthStats, RedisHealthStore, RedisHealthStoreBuilder};
pub use rate::RedisRateLimits;
pub use retry_budget::RedisRetryBudget;
pub use sentinel::{RedisSentinelConnection, connect_sentinel};
pub use spend::RedisSpendStore;

/// The key prefix every store uses unless told otherwise.
pub const DEFAULT_PREFIX: &str = "tlf";

/// Whether `error` means Redis could not be reached (as opposed to Redis
/// answering with an error).
pub(crate) fn is_unavailable(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
        || error.is_cluster_error()
        // No writable primary there right now (a failover): as good as
        // unreachable, so each store takes its fallback.
        || is_demoted(error)
}

/// Whether `error` says the server is not (or no longer) a primary that
/// takes writes: `READONLY` from a demoted primary, `MASTERDOWN` from a
/// replica that lost its primary.
pub(crate) fn is_demoted(error: &RedisError) -> bool {
    matches!(error.code(), Some("READONLY" | "MASTERDOWN"))
}

/// `at + duration`, saturating about thirty years ahead instead of
/// panicking on a configured `Duration::MAX` (the library's own helper is
/// private; five lines are not worth a shared crate).
pub(crate) fn later(at: tokio::time::Instant, duration: Duration) -> tokio::time::Instant {
    const FAR: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);
    at.checked_add(duration)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

/// Milliseconds of `d`, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
