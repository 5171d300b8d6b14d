//! A retry budget shared across turns, so an outage does not become a retry
//! storm.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tower::retry::budget::{Budget as TowerBudget, TpsBudget};

/// Caps extra attempts (retries and reroutes) as a fraction of first
/// attempts, across all turns that share it.
///
/// By default it wraps tower's [`TpsBudget`] (a windowed token bucket after
/// Finagle's retry budget); [`RetryBudget::from_budget`] accepts any other
/// [`tower::retry::budget::Budget`], e.g. one shared by several gateway
/// replicas. Cloning shares the budget (an `Arc` inside).
///
/// Protocol: [`deposit`](Self::deposit) once per turn, on its first attempt;
/// [`withdraw`](Self::withdraw) before each extra attempt, and don't make it
/// when that returns `false`. [`TurnBudget::try_begin_attempt`] does both
/// when the turn carries a retry budget.
///
/// [`TurnBudget::try_begin_attempt`]: super::TurnBudget::try_begin_attempt
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::budget::{RetryBudget, RetryBudgetConfig};
///
/// // One extra attempt per 5 first attempts, no reserve.
/// let budget = RetryBudget::new(
///     RetryBudgetConfig::new()
///         .min_per_sec(0)
///         .retry_percent(0.2),
/// )
/// .unwrap();
/// for _ in 0..5 {
///     budget.deposit();
/// }
/// assert!(budget.withdraw());
/// assert!(!budget.withdraw());
/// assert_eq!(budget.stats().refused, 1);
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    inner: Arc<dyn TowerBudget + Send + Sync>,
    stats: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    deposits: AtomicU64,
    granted: AtomicU64,
    refused: AtomicU64,
}

/// Counts of a [`RetryBudget`]'s use since it was made (for metrics and
/// tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryBudgetStats {
    /// Deposits made (first attempts).
    pub deposits: u64,
    /// Withdrawals granted (extra attempts allowed).
    pub granted: u64,
    /// Withdrawals refused (extra attempts not made).
    pub refused: u64,
}

/// Settings for the [`TpsBudget`] inside a [`RetryBudget`], checked before
/// use because `TpsBudget::new` panics on values out of range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudgetConfig {
    ttl: Duration,
    min_per_sec: u32,
    retry_percent: f32,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryBudgetConfig {
    /// tower's defaults: deposits count for 10 s, a reserve of 10 extra
    /// attempts per second, plus 20 % of first attempts.
    pub fn new() -> Self {
        Self {
            ttl: Duration::from_secs(10),
            min_per_sec: 10,
            retry_percent: 0.2,
        }
    }

    /// How long a deposit counts; must be within 1 s ..= 60 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Extra attempts allowed per second regardless of deposits, so a quiet
    /// gateway can still retry; must be below `i32::MAX`.
    pub fn min_per_sec(mut self, min_per_sec: u32) -> Self {
        self.min_per_sec = min_per_sec;
        self
    }

    /// Extra attempts allowed per first attempt (0.2 = one per five);
    /// must be within 0 ..= 1000.
    pub fn retry_percent(mut self, retry_percent: f32) -> Self {
        self.retry_percent = retry_percent;
        self
    }

    /// The deposit lifetime, the reserve per second and the percentage.
    pub fn parts(&self) -> (Duration, u32, f32) {
        (self.ttl, self.min_per_sec, self.retry_percent)
    }

    /// Check the settings against `TpsBudget::new`'s assertions.
    pub fn validate(&self) -> Result<(), RetryBudgetConfigError> {
        if self.ttl < Duration::from_secs(1) || self.ttl > Duration::from_secs(60) {
            return Err(RetryBudgetConfigError::Ttl(self.ttl));
        }
        // Written so NaN fails too.
        if !(self.retry_percent >= 0.0 && self.retry_percent <= 1000.0) {
            return Err(RetryBudgetConfigError::RetryPercent(self.retry_percent));
        }
        if self.min_per_sec >= i32::MAX as u32 {
            return Err(RetryBudgetConfigError::MinPerSec(self.min_per_sec));
        }
        Ok(())
    }
}

/// A [`RetryBudgetConfig`] value out of the range [`TpsBudget`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryBudgetConfigError {
    /// The deposit lifetime is outside 1 s ..= 60 s.
    #[error("retry budget ttl must be between 1 s and 60 s, got {0:?}")]
    Ttl(Duration),
    /// The retry percentage is outside 0 ..= 1000 (or NaN).
    #[error("retry budget percent must be between 0 and 1000, got {0}")]
    RetryPercent(f32),
    /// The reserve per second is too large.
    #[error("retry budget min_per_sec must be below 2147483647, got {0}")]
    MinPerSec(u32),
}

impl RetryBudget {
    /// A [`TpsBudget`] with the given settings, or the setting that is out
    /// of range.
    pub fn new(config: RetryBudgetConfig) -> Result<Self, RetryBudgetConfigError> {
        config.validate()?;
        Ok(Self::from_budget(TpsBudget::new(
            config.ttl,
            config.min_per_sec,
            config.retry_percent,
        )))
    }

    /// Any tower retry budget (e.g. one backed by shared storage).
    pub fn from_budget(budget: impl TowerBudget + Send + Sync + 'static) -> Self {
        Self {
            inner: Arc::new(budget),
            stats: Arc::default(),
        }
    }

    /// Record a first attempt; each one earns a fraction of an extra attempt.
    pub fn deposit(&self) {
        self.inner.deposit();
        self.stats.deposits.fetch_add(1, Ordering::Relaxed);
    }

    /// Ask for one extra attempt; `false` means don't make it.
    pub fn withdraw(&self) -> bool {
        let granted = self.inner.withdraw();
        let counter = if granted {
            &self.stats.granted
        } else {
            &self.stats.refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
        granted
    }

    /// Counts of deposits and withdrawals so far.
    pub fn stats(&self) -> RetryBudgetStats {
        RetryBudgetStats {
            deposits: self.stats.deposits.load(Ordering::Relaxed),
            granted: self.stats.granted.load(Ordering::Relaxed),
            refused: self.stats.refused.load(Ordering::Relaxed),
        }
    }

    /// Whether two handles share one budget.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.stats, &other.stats)
    }
}

impl Default for RetryBudget {
    /// tower's default [`TpsBudget`] (10 s, 10/s, 20 %).
    fn default() -> Self {
        Self::from_budget(TpsBudget::default())
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_tps_budget_would_panic_on() {
        let bad = [
            RetryBudgetConfig::new().ttl(Duration::from_millis(999)),
            RetryBudgetConfig::new().ttl(Duration::from_secs(61)),
            RetryBudgetConfig::new().retry_percent(-0.1),
            RetryBudgetConfig::new().retry_percent(1000.5),
            RetryBudgetConfig::new().retry_percent(f32::NAN),
            RetryBudgetConfig::new().min_per_sec(u32::MAX),
        ];
        for config in bad {
            assert!(RetryBudget::new(config).is_err(), "{config:?} accepted");
        }
        assert_eq!(
            RetryBudget::new(RetryBudgetConfig::new().ttl(Duration::ZERO)).unwrap_err(),
            RetryBudgetConfigError::Ttl(Duration::ZERO)
        );
        let edges = [
            RetryBudgetConfig::new().ttl(Duration::from_secs(1)),
            RetryBudgetConfig::new().ttl(Duration::from_secs(60)),
            RetryBudgetConfig::new().retry_percent(0.0),
            RetryBudgetConfig::new().retry_percent(1000.0),
            RetryBudgetConfig::new().min_per_sec(0),
        ];
        for config in edges {
            assert!(RetryBudget::new(config).is_ok(), "{config:?} refused");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn percent_caps_withdrawals_and_clones_share() {
        let budget =
            RetryBudget::new(RetryBudgetConfig::new().min_per_sec(0).retry_percent(0.5)).unwrap();
        let other = budget.clone();
        assert!(budget.ptr_eq(&other));
        assert!(!budget.withdraw());
        for _ in 0..10 {
            other.deposit();
        }
        let granted = (0..10).filter(|_| budget.withdraw()).count();
        assert_eq!(granted, 5);
        assert_eq!(
            budget.stats(),
            RetryBudgetStats {
                deposits: 10,
                granted: 5,
                refused: 6
            }
        );
        // Deposits expire after the ttl.
        for _ in 0..10 {
            budget.deposit();
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!budget.withdraw());
    }
}
