//! Per-client rate limits: requests and tokens per minute, by GCRA.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::BoxError;

/// A boxed, `Send` future, so [`RateLimiter`](RateLimitStore) stays
/// object safe.
pub type RateFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A rate: so many units (requests, tokens) per minute, spread evenly
/// (GCRA), with a burst of the whole minute's worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PerMinute(pub NonZeroU32);

impl PerMinute {
    /// `n` per minute; `None` for zero (no limit).
    pub fn new(n: u32) -> Option<Self> {
        NonZeroU32::new(n).map(Self)
    }
}

/// What a [`RateLimitStore`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// Within the rate: the units were taken.
    Allowed,
    /// Over it: nothing was taken; the units fit again after this long.
    Limited {
        /// When to retry.
        retry_after: Duration,
    },
}

/// Errors of a [`RateLimitStore`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitError {
    /// The store could not be reached.
    #[error("rate-limit store unavailable: {0}")]
    Unavailable(#[source] BoxError),
}

/// Where rate-limit state is kept: in this process
/// ([`MemoryRateLimits`]) or shared by a fleet (on Redis: crate `tower-llm-redis`).
pub trait RateLimitStore: fmt::Debug + Send + Sync + 'static {
    /// Takes `units` from `bucket`'s allowance of `rate`, or says when they
    /// would fit. `units` larger than a whole minute's allowance are taken
    /// as the whole minute (a request that big is not refused for ever;
    /// it spends the minute).
    fn take<'a>(
        &'a self,
        bucket: &'a str,
        rate: PerMinute,
        units: u32,
    ) -> RateFuture<'a, Result<RateDecision, RateLimitError>>;
}

/// The in-memory [`RateLimitStore`]: one [`governor`] limiter per bucket.
///
/// Buckets are made on first use and kept for the life of the store, so
/// bucket names must come from configuration (key names), never from a
/// client's free text.
#[derive(Default)]
pub struct MemoryRateLimits {
    buckets: Mutex<HashMap<String, (PerMinute, Arc<DefaultDirectRateLimiter>)>>,
}

impl MemoryRateLimits {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn limiter(&self, bucket: &str, rate: PerMinute) -> Arc<DefaultDirectRateLimiter> {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        match buckets.get(bucket) {
            Some((held, limiter)) if *held == rate => Arc::clone(limiter),
            _ => {
                let limiter = Arc::new(RateLimiter::direct(Quota::per_minute(rate.0)));
                buckets.insert(bucket.to_owned(), (rate, Arc::clone(&limiter)));
                limiter
            }
        }
    }

    /// The decision, without the future (the store never waits).
    pub(crate) fn take_now(&self, bucket: &str, rate: PerMinute, units: u32) -> RateDecision {
        let limiter = self.limiter(bucket, rate);
        let units = NonZeroU32::new(units.min(rate.0.get())).unwrap_or(NonZeroU32::MIN);
        match limiter.check_n(units) {
            Ok(Ok(())) => RateDecision::Allowed,
            Ok(Err(not_until)) => RateDecision::Limited {
                retry_after: not_until.wait_time_from(DefaultClock::default().now()),
            },
            // Cannot happen: units were capped at the burst. Refusing for a
            // minute is the safe reading.
            Err(_) => RateDecision::Limited {
                retry_after: Duration::from_secs(60),
            },
        }
    }
}

impl fmt::Debug for MemoryRateLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self
            .buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("MemoryRateLimits")
            .field("buckets", &held)
            .finish()
    }
}

impl RateLimitStore for MemoryRateLimits {
    fn take<'a>(
        &'a self,
        bucket: &'a str,
        rate: PerMinute,
        units: u32,
    ) -> RateFuture<'a, Result<RateDecision, RateLimitError>> {
        Box::pin(std::future::ready(Ok(self.take_now(bucket, rate, units))))
    }
}

/// `retry-after` in whole seconds, rounded up, at least 1.
pub fn retry_after_seconds(after: Duration) -> u64 {
    (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_minute_then_says_when() {
        let store = MemoryRateLimits::new();
        let rate = PerMinute::new(3).unwrap();
        for _ in 0..3 {
            assert_eq!(store.take_now("a", rate, 1), RateDecision::Allowed);
        }
        match store.take_now("a", rate, 1) {
            RateDecision::Limited { retry_after } => {
                assert!(
                    retry_after > Duration::from_secs(15) && retry_after <= Duration::from_secs(20)
                );
            }
            other => panic!("{other:?}"),
        }
        // Another bucket is untouched.
        assert_eq!(store.take_now("b", rate, 1), RateDecision::Allowed);
        assert_eq!(retry_after_seconds(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(19_001)), 20);
    }

    #[test]
    fn more_units_than_a_minute_spend_the_minute() {
        let store = MemoryRateLimits::new();
        let rate = PerMinute::new(100).unwrap();
        assert_eq!(store.take_now("t", rate, 1_000), RateDecision::Allowed);
        assert!(matches!(
            store.take_now("t", rate, 1),
            RateDecision::Limited { .. }
        ));
    }
}
