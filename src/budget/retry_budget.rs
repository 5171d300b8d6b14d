//! A retry budget shared across turns, so an outage does not become a retry
//! storm.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tower::retry::budget::Budget as TowerBudget;

use crate::identity::ClientId;

/// Caps extra attempts (retries and reroutes) as a fraction of first
/// attempts, across all turns that share it.
///
/// By default it is a windowed token bucket with the semantics of tower's
/// [`TpsBudget`](tower::retry::budget::TpsBudget) (after Finagle's retry
/// budget), kept here so its [`level`](Self::level) can be read;
/// [`RetryBudget::from_budget`] accepts any other
/// [`tower::retry::budget::Budget`], e.g. one shared by several gateway
/// replicas. Cloning shares the budget (an `Arc` inside).
///
/// Give it to the turns through [`TurnLimits::retry_budget`]: each turn's
/// first attempt deposits into it, and each extra attempt (a retry or a
/// reroute) withdraws from it first; a refused withdrawal stops the turn
/// with [`BudgetExhausted::RetryBudget`] instead of making the attempt.
/// [`level`](Self::level), [`stats`](Self::stats) and
/// [`record_metrics`](Self::record_metrics) tell how it is doing.
///
/// [`TurnLimits::retry_budget`]: super::TurnLimits::retry_budget
/// [`BudgetExhausted::RetryBudget`]: super::BudgetExhausted::RetryBudget
///
/// ```
/// use tower_llm_failover::budget::{RetryBudget, RetryBudgetConfig, TurnLimits};
///
/// // One extra attempt per 5 first attempts, no reserve.
/// let budget = RetryBudget::new(RetryBudgetConfig {
///     min_per_sec: 0,
///     retry_percent: 0.2,
///     ..RetryBudgetConfig::new()
/// })
/// .unwrap();
/// // Shared by every turn started from these limits.
/// let limits = TurnLimits {
///     retry_budget: Some(budget.clone()),
///     ..TurnLimits::new()
/// };
/// # let _ = limits;
/// assert_eq!(budget.level(), Some(0.0));
/// assert_eq!(budget.stats().deposits, 0);
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    inner: Arc<Inner>,
    stats: Arc<Counters>,
    /// Each client's own share inside the fleet's budget, when set.
    shares: Option<Arc<ClientShares>>,
}

enum Inner {
    /// Ours: the level can be read.
    Local(TokenBucket),
    /// Any other budget: it cannot say its level.
    Other(Box<dyn TowerBudget + Send + Sync>),
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

/// Settings of a [`RetryBudget`]'s token bucket, in tower's `TpsBudget`
/// terms and ranges (a shared budget, e.g. on Redis, takes the same).
///
/// Plain data: set the fields you need and take the rest from
/// [`RetryBudgetConfig::new`]. The ranges are checked where the budget is
/// made ([`RetryBudget::new`], [`validate`](Self::validate)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudgetConfig {
    /// How long a deposit counts (default 10 s); must be within
    /// 1 s ..= 60 s.
    pub ttl: Duration,
    /// Extra attempts allowed per second regardless of deposits, so a quiet
    /// gateway can still retry (default 10); must be below `i32::MAX`.
    pub min_per_sec: u32,
    /// Extra attempts allowed per first attempt (default 0.2: one per
    /// five); must be within 0 ..= 1000.
    pub retry_percent: f32,
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

    /// The deposit lifetime, the reserve per second and the percentage.
    pub fn parts(&self) -> (Duration, u32, f32) {
        (self.ttl, self.min_per_sec, self.retry_percent)
    }

    /// Check the settings against the ranges tower's `TpsBudget` accepts.
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

/// A [`RetryBudgetConfig`] value out of the range tower's `TpsBudget`
/// accepts.
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
    /// A token bucket with the given settings, or the setting that is out
    /// of range.
    pub fn new(config: RetryBudgetConfig) -> Result<Self, RetryBudgetConfigError> {
        config.validate()?;
        Ok(Self::local(TokenBucket::new(config)))
    }

    fn local(bucket: TokenBucket) -> Self {
        Self {
            inner: Arc::new(Inner::Local(bucket)),
            stats: Arc::default(),
            shares: None,
        }
    }

    /// Any tower retry budget (e.g. one backed by shared storage). Its
    /// [`level`](Self::level) is unknown.
    pub fn from_budget(budget: impl TowerBudget + Send + Sync + 'static) -> Self {
        Self {
            inner: Arc::new(Inner::Other(Box::new(budget))),
            stats: Arc::default(),
            shares: None,
        }
    }

    /// Gives every client a share of its own inside this budget: a
    /// bucket with `share`'s settings, fed by that client's first attempts
    /// only. An extra attempt then needs both the client's share and the
    /// fleet's budget, so one client's failing requests spend its own
    /// share and stop there, leaving the fleet's reroutes to the others.
    ///
    /// The anonymous client (requests without a [`ClientId`]) has one
    /// share. Shares are kept in this process (with a Redis fleet budget
    /// too: each replica bounds its clients locally), at most
    /// `max_clients` of them, the least recently used forgotten first.
    pub fn with_client_shares(
        mut self,
        share: RetryBudgetConfig,
        max_clients: usize,
    ) -> Result<Self, RetryBudgetConfigError> {
        share.validate()?;
        self.shares = Some(Arc::new(ClientShares {
            config: share,
            max_clients: max_clients.max(1),
            buckets: Mutex::new(HashMap::default()),
        }));
        Ok(self)
    }

    /// [`deposit`](Self::deposit) for a first attempt of `client`: the
    /// fleet's budget and the client's share both earn it.
    #[cfg(test)]
    pub(crate) fn deposit_for(&self, client: &ClientId) {
        self.deposit_for_at(client, Instant::now());
    }

    /// [`deposit_for`](Self::deposit_for) at `now`: one clock read for
    /// both buckets (and the turn's deadline check): every first attempt
    /// comes here.
    pub(crate) fn deposit_for_at(&self, client: &ClientId, now: Instant) {
        if let Some(shares) = &self.shares {
            shares.with_bucket(client, now, |bucket| bucket.deposit_at(now));
        }
        self.deposit_at(now);
    }

    /// [`withdraw`](Self::withdraw) for an extra attempt of `client`: the
    /// client's share is asked first, so a client whose share is spent
    /// takes nothing from the fleet's budget.
    #[cfg(test)]
    pub(crate) fn withdraw_for(&self, client: &ClientId) -> bool {
        self.withdraw_for_at(client, Instant::now())
    }

    /// [`withdraw_for`](Self::withdraw_for) at `now`.
    pub(crate) fn withdraw_for_at(&self, client: &ClientId, now: Instant) -> bool {
        if let Some(shares) = &self.shares
            && !shares.with_bucket(client, now, |bucket| bucket.withdraw_at(now))
        {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.withdraw_at(now)
    }

    /// Record a first attempt; each one earns a fraction of an extra attempt.
    pub(crate) fn deposit(&self) {
        self.deposit_at(Instant::now());
    }

    fn deposit_at(&self, now: Instant) {
        match &*self.inner {
            Inner::Local(bucket) => bucket.deposit_at(now),
            Inner::Other(budget) => budget.deposit(),
        }
        self.stats.deposits.fetch_add(1, Ordering::Relaxed);
    }

    /// Ask for one extra attempt; `false` means don't make it.
    pub(crate) fn withdraw(&self) -> bool {
        self.withdraw_at(Instant::now())
    }

    fn withdraw_at(&self, now: Instant) -> bool {
        let granted = match &*self.inner {
            Inner::Local(bucket) => bucket.withdraw_at(now),
            Inner::Other(budget) => budget.withdraw(),
        };
        let counter = if granted {
            &self.stats.granted
        } else {
            &self.stats.refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
        granted
    }

    /// Sets the retry budget's metrics to its figures so far: the
    /// deposit and withdrawal counters, and its level gauge when it can
    /// say ([`level`](Self::level)). Call it before each scrape.
    pub fn record_metrics(&self) {
        use crate::observe::{attr, metric};
        if let Some(level) = self.level() {
            metrics::gauge!(metric::RETRY_BUDGET_LEVEL).set(level);
        }
        let stats = self.stats();
        metrics::counter!(metric::RETRY_BUDGET_DEPOSITS).absolute(stats.deposits);
        metrics::counter!(metric::RETRY_BUDGET_WITHDRAWALS, attr::FAILOVER_RESULT => "granted")
            .absolute(stats.granted);
        metrics::counter!(metric::RETRY_BUDGET_WITHDRAWALS, attr::FAILOVER_RESULT => "refused")
            .absolute(stats.refused);
    }

    /// Counts of deposits and withdrawals so far.
    pub fn stats(&self) -> RetryBudgetStats {
        RetryBudgetStats {
            deposits: self.stats.deposits.load(Ordering::Relaxed),
            granted: self.stats.granted.load(Ordering::Relaxed),
            refused: self.stats.refused.load(Ordering::Relaxed),
        }
    }

    /// Extra attempts the budget would grant now (fractional: a deposit
    /// earns part of one), never below 0; `None` for a budget from
    /// [`from_budget`](Self::from_budget), which cannot say.
    pub fn level(&self) -> Option<f64> {
        match &*self.inner {
            Inner::Local(bucket) => Some(bucket.level()),
            Inner::Other(_) => None,
        }
    }
}

/// The per-client shares of a [`RetryBudget`].
struct ClientShares {
    config: RetryBudgetConfig,
    max_clients: usize,
    /// Each client's bucket and when it was last used.
    // foldhash, not SipHash: looked up on every attempt; its per-process
    // seed still keeps client names from being chosen to collide.
    buckets: Mutex<HashMap<ClientId, (TokenBucket, Instant), foldhash::fast::RandomState>>,
}

impl ClientShares {
    /// `client`'s bucket, made on first use, lent to `with` under the
    /// map's lock (no reference count taken and dropped per attempt); past
    /// `max_clients`, the least recently used is forgotten (it starts whole
    /// if it comes back, which only ever gives it its reserve again).
    fn with_bucket<R>(
        &self,
        client: &ClientId,
        now: Instant,
        with: impl FnOnce(&TokenBucket) -> R,
    ) -> R {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((bucket, used)) = buckets.get_mut(client) {
            *used = now;
            return with(bucket);
        }
        if buckets.len() >= self.max_clients
            && let Some(oldest) = buckets
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            buckets.remove(&oldest);
        }
        let bucket = TokenBucket::new(self.config);
        let answer = with(&bucket);
        buckets.insert(client.clone(), (bucket, now));
        answer
    }
}

impl Default for RetryBudget {
    /// tower's defaults (10 s, 10/s, 20 %).
    fn default() -> Self {
        Self::local(TokenBucket::new(RetryBudgetConfig::new()))
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("stats", &self.stats())
            .field("level", &self.level())
            .finish_non_exhaustive()
    }
}

/// Slots per ttl, as in tower's `TpsBudget`.
const SLOTS: usize = 10;

/// tower's `TpsBudget`, token for token, with a readable balance.
///
/// Tokens are integers: a deposit adds `deposit_amount`, a withdrawal
/// takes `withdraw_amount` (for 20 %: 1 and 5). Changes land in the
/// current slot (`writer`); every `ttl / 10` the slot is committed and the
/// oldest forgotten, so a deposit counts for one ttl. A reserve of
/// `min_per_sec × ttl` withdrawals is always added to the balance. One
/// lock over the slots (tower mixes a lock and atomics): a turn touches
/// it once or twice.
struct TokenBucket {
    slots: Mutex<Slots>,
    reserve: i64,
    window: Duration,
    deposit_amount: i64,
    withdraw_amount: i64,
}

struct Slots {
    committed: [i64; SLOTS],
    /// The current slot's changes, committed when it expires.
    writer: i64,
    /// The slot `writer` is committed to.
    index: usize,
    /// When the current slot began.
    since: Instant,
}

impl TokenBucket {
    /// Settings already validated.
    fn new(config: RetryBudgetConfig) -> Self {
        let (ttl, min_per_sec, percent) = config.parts();
        // tower's arithmetic, so both budgets grant the same.
        let (deposit_amount, withdraw_amount) = if percent == 0.0 {
            // Deposits earn nothing: only the reserve can be withdrawn.
            (0, 1)
        } else if percent <= 1.0 {
            (1, (1.0 / percent) as i64)
        } else {
            // Each deposit earns `percent` withdrawals.
            (1000, (1000.0 / percent) as i64)
        };
        let reserve = i64::from(min_per_sec)
            .saturating_mul(ttl.as_secs() as i64)
            .saturating_mul(withdraw_amount);
        Self {
            slots: Mutex::new(Slots {
                committed: [0; SLOTS],
                writer: 0,
                index: 0,
                since: Instant::now(),
            }),
            reserve,
            window: ttl / SLOTS as u32,
            deposit_amount,
            withdraw_amount,
        }
    }

    fn deposit_at(&self, now: Instant) {
        let mut slots = self.lock();
        self.expire(&mut slots, now);
        slots.writer = slots.writer.saturating_add(self.deposit_amount);
    }

    fn withdraw_at(&self, now: Instant) -> bool {
        let mut slots = self.lock();
        self.expire(&mut slots, now);
        if self.balance(&slots) >= self.withdraw_amount {
            slots.writer = slots.writer.saturating_sub(self.withdraw_amount);
            true
        } else {
            false
        }
    }

    /// The balance in withdrawals.
    fn level(&self) -> f64 {
        let mut slots = self.lock();
        self.expire(&mut slots, Instant::now());
        self.balance(&slots).max(0) as f64 / self.withdraw_amount.max(1) as f64
    }

    /// A panic elsewhere while holding the lock leaves whole integers
    /// behind: still a valid state.
    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Commits the current slot once its window passed, and forgets the
    /// slots older than the ttl.
    fn expire(&self, slots: &mut Slots, now: Instant) {
        let mut elapsed = now.saturating_duration_since(slots.since);
        if elapsed < self.window {
            return;
        }
        let writer = std::mem::take(&mut slots.writer);
        let index = slots.index;
        slots.committed[index] = writer;
        let mut next = (index + 1) % SLOTS;
        // tower clears one slot per window passed; ten clear them all (the
        // one just committed included), so stop there after a long idle.
        let mut cleared = 0;
        while elapsed > self.window && cleared < SLOTS {
            slots.committed[next] = 0;
            elapsed -= self.window;
            next = (next + 1) % SLOTS;
            cleared += 1;
        }
        slots.index = next;
        slots.since = now;
    }

    fn balance(&self, slots: &Slots) -> i64 {
        slots
            .committed
            .iter()
            .fold(slots.writer, |sum, slot| sum.saturating_add(*slot))
            .saturating_add(self.reserve)
    }
}

#[cfg(test)]
impl RetryBudget {
    /// Extra attempts `client`'s own share would grant now (`None` without
    /// shares).
    pub(crate) fn client_level(&self, client: &ClientId) -> Option<f64> {
        self.shares
            .as_ref()
            .map(|s| s.with_bucket(client, Instant::now(), TokenBucket::level))
    }
}

#[cfg(test)]
impl RetryBudget {
    /// Whether two handles share one budget.
    fn ptr_eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.stats, &other.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_client_that_spent_its_share_leaves_the_fleet_budget_to_others() {
        // Fleet: 4 extra attempts in reserve; each client's share: 2.
        let fleet = RetryBudgetConfig {
            ttl: Duration::from_secs(2),
            min_per_sec: 2,
            retry_percent: 0.0,
        };
        let share = RetryBudgetConfig {
            ttl: Duration::from_secs(2),
            min_per_sec: 1,
            retry_percent: 0.0,
        };
        let budget = RetryBudget::new(fleet)
            .unwrap()
            .with_client_shares(share, 16)
            .unwrap();
        let (a, b) = (ClientId::key("a"), ClientId::key("b"));
        let a_granted = (0..10).filter(|_| budget.withdraw_for(&a)).count();
        assert_eq!(a_granted, 2, "a client gets its share and no more");
        assert_eq!(budget.level(), Some(2.0), "the fleet keeps the rest");
        assert!(budget.withdraw_for(&b) && budget.withdraw_for(&b));
        assert!(!budget.withdraw_for(&b));
        assert_eq!(budget.client_level(&a), Some(0.0));
        // Deposits earn a client's share only for that client.
        let earning = RetryBudget::new(RetryBudgetConfig {
            min_per_sec: 0,
            ..RetryBudgetConfig::new()
        })
        .unwrap()
        .with_client_shares(
            RetryBudgetConfig {
                min_per_sec: 0,
                retry_percent: 1.0,
                ..RetryBudgetConfig::new()
            },
            16,
        )
        .unwrap();
        earning.deposit_for(&a);
        assert_eq!(earning.client_level(&a), Some(1.0));
        assert_eq!(earning.client_level(&b), Some(0.0));
    }

    #[test]
    fn client_shares_are_bounded() {
        let budget = RetryBudget::default()
            .with_client_shares(RetryBudgetConfig::new(), 4)
            .unwrap();
        for i in 0..100 {
            budget.withdraw_for(&ClientId::key(format!("k{i}")));
        }
        let held = budget
            .shares
            .as_ref()
            .map(|s| s.buckets.lock().unwrap().len());
        assert_eq!(held, Some(4));
    }

    #[test]
    fn rejects_what_tps_budget_would_panic_on() {
        let bad = [
            RetryBudgetConfig {
                ttl: Duration::from_millis(999),
                ..RetryBudgetConfig::new()
            },
            RetryBudgetConfig {
                ttl: Duration::from_secs(61),
                ..RetryBudgetConfig::new()
            },
            RetryBudgetConfig {
                retry_percent: -0.1,
                ..RetryBudgetConfig::new()
            },
            RetryBudgetConfig {
                retry_percent: 1000.5,
                ..RetryBudgetConfig::new()
            },
            RetryBudgetConfig {
                retry_percent: f32::NAN,
                ..RetryBudgetConfig::new()
            },
            RetryBudgetConfig {
                min_per_sec: u32::MAX,
                ..RetryBudgetConfig::new()
            },
        ];
        for config in bad {
            assert!(RetryBudget::new(config).is_err(), "{config:?} accepted");
        }
        assert_eq!(
            RetryBudget::new(RetryBudgetConfig {
                ttl: Duration::ZERO,
                ..RetryBudgetConfig::new()
            })
            .unwrap_err(),
            RetryBudgetConfigError::Ttl(Duration::ZERO)
        );
        let edges = [
            RetryBudgetConfig {
                ttl: Duration::from_secs(1),
                ..RetryBudgetConfig::new()
            },
            RetryBudgetConfig {
                ttl: Duration::from_secs(60),
                ..RetryBudgetConfig::new()
            },
            RetryBudgetConfig {
                retry_percent: 0.0,
                ..RetryBudgetConfig::new()
            },
            RetryBudgetConfig {
                retry_percent: 1000.0,
                ..RetryBudgetConfig::new()
            },
            RetryBudgetConfig {
                min_per_sec: 0,
                ..RetryBudgetConfig::new()
            },
        ];
        for config in edges {
            assert!(RetryBudget::new(config).is_ok(), "{config:?} refused");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn percent_caps_withdrawals_and_clones_share() {
        let budget = RetryBudget::new(RetryBudgetConfig {
            min_per_sec: 0,
            retry_percent: 0.5,
            ..RetryBudgetConfig::new()
        })
        .unwrap();
        let other = budget.clone();
        assert!(budget.ptr_eq(&other));
        // A budget built apart is another budget, even with the same figures.
        let apart = RetryBudget::new(RetryBudgetConfig {
            min_per_sec: 0,
            retry_percent: 0.5,
            ..RetryBudgetConfig::new()
        })
        .unwrap();
        assert!(!budget.ptr_eq(&apart));
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

    #[tokio::test(start_paused = true)]
    async fn level_is_the_withdrawals_left() {
        // 20 %: five deposits earn one extra attempt; a reserve of 1/s for
        // a 2 s ttl is two more.
        let budget = RetryBudget::new(RetryBudgetConfig {
            ttl: Duration::from_secs(2),
            min_per_sec: 1,
            retry_percent: 0.2,
        })
        .unwrap();
        assert_eq!(budget.level(), Some(2.0));
        for _ in 0..3 {
            budget.deposit();
        }
        assert_eq!(budget.level(), Some(2.6));
        budget.deposit();
        budget.deposit();
        assert_eq!(budget.level(), Some(3.0));
        assert!(budget.withdraw());
        assert_eq!(budget.level(), Some(2.0));
        assert!(budget.withdraw() && budget.withdraw());
        assert_eq!(budget.level(), Some(0.0));
        assert!(!budget.withdraw());
        // The deposits expire after the ttl, the withdrawals with them:
        // the reserve is whole again.
        tokio::time::advance(Duration::from_millis(2_300)).await;
        assert_eq!(budget.level(), Some(2.0));
        // A budget that cannot say reports no level.
        let other = RetryBudget::from_budget(tower::retry::budget::TpsBudget::default());
        assert_eq!(other.level(), None);
    }

    /// The same script of deposits, withdrawals and pauses gets the same
    /// grants from tower's `TpsBudget` and from ours.
    #[tokio::test(start_paused = true)]
    async fn grants_what_tower_tps_budget_grants() {
        use tower::retry::budget::{Budget as _, TpsBudget};
        for (ttl, min_per_sec, percent) in [(1, 0, 0.5), (3, 1, 0.2), (10, 0, 2.5), (2, 2, 0.0)] {
            let config = RetryBudgetConfig {
                ttl: Duration::from_secs(ttl),
                min_per_sec,
                retry_percent: percent,
            };
            let ours = RetryBudget::new(config).unwrap();
            let tower = TpsBudget::new(Duration::from_secs(ttl), min_per_sec, percent);
            let mut rng = fastrand::Rng::with_seed(ttl);
            for step in 0..2_000 {
                match rng.u8(0..10) {
                    0..=4 => {
                        ours.deposit();
                        tower.deposit();
                    }
                    5..=7 => assert_eq!(
                        ours.withdraw(),
                        tower.withdraw(),
                        "step {step} of {config:?}"
                    ),
                    8 => tokio::time::advance(Duration::from_millis(rng.u64(1..400))).await,
                    _ => tokio::time::advance(Duration::from_millis(rng.u64(0..30_000))).await,
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_retry_budget_level_is_a_gauge() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        // Recorded synchronously: a recorder of this test's own (a snapshot of
        // the global one, taken by a test in parallel, resets values).
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let level = |budget: &RetryBudget| {
            metrics::with_local_recorder(&recorder, || budget.record_metrics());
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .find(|(key, ..)| key.key().name() == "failover.retry_budget.level")
                .map(|(.., value)| match value {
                    DebugValue::Gauge(level) => level.into_inner(),
                    other => panic!("{other:?}"),
                })
        };
        // 50 %: two first attempts earn one extra attempt; no reserve.
        let budget = RetryBudget::new(RetryBudgetConfig {
            min_per_sec: 0,
            retry_percent: 0.5,
            ..RetryBudgetConfig::new()
        })
        .unwrap();
        for _ in 0..5 {
            budget.deposit();
        }
        assert_eq!(level(&budget), Some(2.5));
        assert!(budget.withdraw() && budget.withdraw());
        assert_eq!(level(&budget), Some(0.5));
        // A budget that cannot say its level sets no gauge.
        let other = RetryBudget::from_budget(tower::retry::budget::TpsBudget::default());
        let fresh = DebuggingRecorder::new();
        metrics::with_local_recorder(&fresh, || other.record_metrics());
        assert!(
            fresh
                .snapshotter()
                .snapshot()
                .into_vec()
                .iter()
                .all(|(key, ..)| key.key().name() != "failover.retry_budget.level")
        );
    }
}
