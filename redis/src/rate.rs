//! [`RedisRateLimits`]: per-client rate limits shared by every replica.

use std::time::Duration;

use ::redis::Script;
use ::redis::aio::ConnectionLike;

use super::DEFAULT_PREFIX;
use tower_llm_failover::limit::{
    PerMinute, RateDecision, RateFuture, RateLimitError, RateLimitStore,
};

/// A [`RateLimitStore`] on Redis: the same GCRA as the in-memory
/// [`MemoryRateLimits`](tower_llm_failover::limit::MemoryRateLimits), one key per bucket
/// (`{<prefix>:rate:<bucket>}`), decided in one script on Redis' own clock
/// (`TIME`), so replicas whose clocks disagree still share one allowance.
/// A key lives only as long as its bucket is owed time.
#[derive(Debug, Clone)]
pub struct RedisRateLimits<C> {
    connection: C,
    prefix: String,
}

impl<C> RedisRateLimits<C> {
    /// A store over `connection` with the default prefix.
    pub fn new(connection: C) -> Self {
        Self {
            connection,
            prefix: DEFAULT_PREFIX.to_owned(),
        }
    }

    /// The key prefix (default [`DEFAULT_PREFIX`]).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
}

impl<C> RateLimitStore for RedisRateLimits<C>
where
    C: ConnectionLike + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    fn take<'a>(
        &'a self,
        bucket: &'a str,
        rate: PerMinute,
        units: u32,
    ) -> RateFuture<'a, Result<RateDecision, RateLimitError>> {
        Box::pin(async move {
            let per_minute = u64::from(rate.0.get());
            let minute_us: u64 = 60_000_000;
            let interval = (minute_us / per_minute).max(1);
            let units = u64::from(units).clamp(1, per_minute);
            let mut connection = self.connection.clone();
            let (taken, wait): (i64, i64) = Script::new(include_str!("rate.lua"))
                .key(format!("{{{}:rate:{bucket}}}", self.prefix))
                .arg(interval)
                .arg(units)
                .arg(interval.saturating_mul(per_minute))
                .invoke_async(&mut connection)
                .await
                // Unreachable or answering with an error: either way the
                // allowance cannot be read.
                .map_err(|e| RateLimitError::Unavailable(Box::new(e)))?;
            Ok(if taken == 1 {
                RateDecision::Allowed
            } else {
                RateDecision::Limited {
                    retry_after: Duration::from_micros(u64::try_from(wait).unwrap_or(0)),
                }
            })
        })
    }
}
