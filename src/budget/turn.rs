//! The per-turn budget every hop draws from.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::backoff::{Backoff, Delay};
use super::retry_budget::RetryBudget;
use super::spend::{SpendCeilings, TenantLedger, TenantRefusal, TenantSpend};
use crate::Cost;
use crate::identity::ClientId;
use crate::{TurnDeadline, TurnId};

/// Why a turn's budget refused another attempt (or spend).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetExhausted {
    /// The turn's deadline has passed.
    #[error("the turn's deadline of {limit:?} has passed ({elapsed:?} elapsed)")]
    Deadline {
        /// The turn's whole time budget.
        limit: Duration,
        /// Time since the turn started.
        elapsed: Duration,
    },
    /// Every attempt the turn may make has been made.
    #[error("all {max} attempts of the turn are used")]
    Attempts {
        /// Attempts made so far.
        used: u32,
        /// The turn's maximum.
        max: u32,
    },
    /// The next attempt would take the turn's spend past its ceiling.
    #[error(
        "spend ceiling {ceiling} reached: {spent}{} spent, next attempt estimated at {estimated_next}",
        if *.spent_includes_estimate { " (partly estimated)" } else { "" }
    )]
    Spend {
        /// Spent so far.
        spent: Cost,
        /// Whether `spent` includes estimated costs.
        spent_includes_estimate: bool,
        /// The estimated cost of the attempt that was refused.
        estimated_next: Cost,
        /// The turn's ceiling.
        ceiling: Cost,
    },
    /// The retry budget shared across turns refused an extra attempt: too
    /// many attempts are failing right now.
    #[error("the shared retry budget refused attempt {attempt} (too many retries across turns)")]
    RetryBudget {
        /// The attempt number that was refused.
        attempt: u32,
    },
    /// The tenant's spend reached its ceiling: the attempt's estimate
    /// could not be reserved ([`TenantSpend`]).
    #[error("tenant spend ceiling {ceiling} reached for this {window}: {spent} spent")]
    TenantCeiling {
        /// Spent and reserved in the window.
        spent: Cost,
        /// The tenant's ceiling.
        ceiling: Cost,
        /// `day` or `month`.
        window: &'static str,
    },
    /// The request's client names no tenant, and one is required.
    #[error("the request names no tenant")]
    TenantRequired,
    /// The tenant's spend store could not be asked and the policy fails
    /// closed. (The store's own error is logged, not carried: it is not for
    /// the client.)
    #[error("the tenant's spend could not be checked; try again later")]
    SpendStoreUnavailable,
}

impl From<TenantRefusal> for BudgetExhausted {
    fn from(refusal: TenantRefusal) -> Self {
        match refusal {
            TenantRefusal::Ceiling {
                spent,
                ceiling,
                window,
            } => Self::TenantCeiling {
                spent,
                ceiling,
                window,
            },
            TenantRefusal::NoTenant => Self::TenantRequired,
            TenantRefusal::Store(error) => {
                tracing::error!(%error, "tenant spend could not be reserved; turn refused");
                Self::SpendStoreUnavailable
            }
        }
    }
}

impl BudgetExhausted {
    /// The [`StopReason`](crate::StopReason) a turn refused for this
    /// reason stops with.
    pub(crate) fn stop_reason(&self) -> crate::StopReason {
        use crate::StopReason;
        match self {
            Self::Deadline { .. } => StopReason::Deadline,
            Self::Attempts { .. } => StopReason::Attempts,
            Self::Spend { .. } => StopReason::SpendCeiling,
            Self::RetryBudget { .. } => StopReason::RetryBudget,
            Self::TenantCeiling { .. } => StopReason::TenantCeiling,
            Self::TenantRequired => StopReason::TenantRequired,
            Self::SpendStoreUnavailable => StopReason::SpendStoreUnavailable,
        }
    }
}

/// The limits and helpers each turn starts with: the whole-turn deadline,
/// the attempt cap, the spend ceiling, the backoff and the retry budget
/// shared across turns. [`BudgetLayer`](super::BudgetLayer) holds one and
/// starts a [`TurnBudget`] from it per request.
///
/// Plain data: set the fields you need and take the rest from
/// [`TurnLimits::new`] (the defaults: 120 s deadline, 4 attempts, no spend
/// ceiling, [`Backoff::new`], no retry budget).
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::{Cost, budget::TurnLimits};
///
/// let limits = TurnLimits {
///     deadline: Duration::from_secs(30),
///     max_attempts: 3,
///     spend_ceiling: Some(Cost::from_usd(0.50)),
///     ..TurnLimits::new()
/// };
/// let turn = limits.start();
/// assert!(turn.turn_deadline().remaining() <= Duration::from_secs(30));
/// ```
#[derive(Debug, Clone)]
pub struct TurnLimits {
    /// Time allowed for the whole turn, every hop and wait included.
    pub deadline: Duration,
    /// Upstream attempts allowed per turn, first attempt included; 0 is
    /// taken as 1.
    pub max_attempts: u32,
    /// Money the turn may spend across all attempts; `None`: no ceiling.
    pub spend_ceiling: Option<Cost>,
    /// The backoff between attempts on the same target.
    pub backoff: Backoff,
    /// A retry budget shared by every turn started from these limits (and
    /// their clones); `None`: extra attempts are limited only by
    /// `max_attempts`.
    pub retry_budget: Option<RetryBudget>,
}

impl Default for TurnLimits {
    fn default() -> Self {
        Self::new()
    }
}

impl TurnLimits {
    /// The defaults (see the type docs).
    pub fn new() -> Self {
        Self {
            deadline: Duration::from_secs(120),
            max_attempts: 4,
            spend_ceiling: None,
            backoff: Backoff::new(),
            retry_budget: None,
        }
    }

    /// Start a turn now, with a random turn id, for the anonymous client.
    pub fn start(&self) -> TurnBudget {
        self.start_with_turn_id(TurnId::random())
    }

    /// Start a turn now, with a random turn id, for `client`: its extra
    /// attempts draw on the client's share of the retry budget.
    pub(crate) fn start_for(&self, client: ClientId) -> TurnBudget {
        self.start_turn(TurnId::random(), client)
    }

    /// Start a turn now, with the given turn id.
    pub fn start_with_turn_id(&self, turn_id: TurnId) -> TurnBudget {
        self.start_turn(turn_id, ClientId::anonymous())
    }

    fn start_turn(&self, turn_id: TurnId, client: ClientId) -> TurnBudget {
        let started = Instant::now();
        TurnBudget {
            inner: Arc::new(Inner {
                turn_id,
                started,
                deadline: deadline_after(started, self.deadline),
                limit: self.deadline,
                max_attempts: self.max_attempts.max(1),
                attempts: AtomicU32::new(0),
                spend_ceiling: self.spend_ceiling,
                spent: AtomicU64::new(0),
                spent_estimated: AtomicBool::new(false),
                watched_inside: AtomicBool::new(false),
                backoff: self.backoff.clone(),
                retry_budget: self.retry_budget.clone(),
                client,
                tenant: OnceLock::new(),
                ceilings: OnceLock::new(),
            }),
        }
    }
}

/// `start + limit`, or as far as the clock goes when that overflows.
fn deadline_after(start: Instant, limit: Duration) -> Instant {
    crate::time::later(start, limit)
}

/// The budget of one turn: deadline, attempts and spend, shared by every hop.
///
/// Made once per turn (by [`BudgetLayer`](super::BudgetLayer) or
/// [`TurnLimits::start`]) and carried in the request extensions; cloning
/// shares it (an `Arc` inside), so nothing resets per hop. The layers
/// inside draw on it (the failover layer claims each attempt, checks and
/// records its spend and fits its backoff into the time left); anyone may
/// read it back, from the request's or the response's extensions.
///
/// ```
/// use std::time::Duration;
/// use http::Request;
/// use tower_llm_failover::budget::{TurnBudget, TurnLimits};
///
/// // A turn the application starts itself (a BudgetLayer outside would
/// // start one per request), carried to every layer inside.
/// let turn = TurnLimits {
///     deadline: Duration::from_secs(30),
///     ..TurnLimits::new()
/// }
/// .start_with_turn_id("turn-42".into());
/// let mut request = Request::new(());
/// request.extensions_mut().insert(turn.turn_deadline());
/// request.extensions_mut().insert(turn);
///
/// let seen = TurnBudget::from_extensions(request.extensions()).unwrap();
/// assert_eq!(seen.turn_id().as_str(), "turn-42");
/// assert!(seen.turn_deadline().remaining() <= Duration::from_secs(30));
/// assert_eq!(seen.attempts_used(), 0);
/// assert_eq!(seen.spent().0, tower_llm_failover::Cost::ZERO);
/// ```
#[derive(Clone)]
pub struct TurnBudget {
    inner: Arc<Inner>,
}

struct Inner {
    turn_id: TurnId,
    started: Instant,
    deadline: Instant,
    limit: Duration,
    max_attempts: u32,
    attempts: AtomicU32,
    spend_ceiling: Option<Cost>,
    spent: AtomicU64,
    spent_estimated: AtomicBool,
    /// An inner layer answers by the deadline itself ([`TurnBudget::watch_inside`]).
    watched_inside: AtomicBool,
    backoff: Backoff,
    retry_budget: Option<RetryBudget>,
    /// Whose turn it is (the retry budget keeps a share per client).
    client: ClientId,
    /// The tenant the turn's spend is reserved with and settled to.
    /// Boxed: most turns of a gateway without tenants never set it, and a
    /// held stream keeps its budget for its life.
    tenant: OnceLock<Box<TenantLedger>>,
    /// Further accounts it is reserved with and settled to
    /// ([`SpendCeilings`]).
    ceilings: OnceLock<Vec<TenantLedger>>,
}

impl Drop for Inner {
    /// The last handle of the turn is gone (its body done or dropped, so
    /// every attempt's charge is made): the tenant's reservations are
    /// settled against what the turn really cost.
    fn drop(&mut self) {
        let spent = Cost::from_nanos(*self.spent.get_mut());
        let ceilings = self.ceilings.get().into_iter().flatten();
        let tenant = self.tenant.get().map(|ledger| &**ledger);
        for ledger in tenant.into_iter().chain(ceilings) {
            ledger.settle_in_background(spent);
        }
    }
}

/// What [`TurnBudget::retry_delay`] advises before another attempt on the
/// same target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryDelay {
    /// Wait this long (it ends before the deadline), then retry the same
    /// target.
    Wait(Duration),
    /// The provider asked for a wait longer than the backoff's maximum
    /// server-directed delay: reroute, or stop with the original failure.
    HintTooLong {
        /// The wait the provider asked for.
        asked: Duration,
        /// The configured maximum.
        max: Duration,
    },
    /// The wait would end at or past the turn's deadline: don't take it;
    /// reroute, or stop with the original failure.
    PastDeadline {
        /// The wait that would have been needed.
        wait: Duration,
        /// Time left in the turn.
        remaining: Duration,
    },
}

impl RetryDelay {}

impl TurnBudget {
    /// The turn's budget from a request's (or response's) extensions, if a
    /// [`BudgetLayer`](super::BudgetLayer) or the application put one there.
    pub fn from_extensions(extensions: &http::Extensions) -> Option<TurnBudget> {
        extensions.get::<TurnBudget>().cloned()
    }

    /// The turn's turn id.
    pub fn turn_id(&self) -> &TurnId {
        &self.inner.turn_id
    }

    /// When the turn started.
    pub(crate) fn started(&self) -> Instant {
        self.inner.started
    }

    /// Time since the turn started.
    pub(crate) fn elapsed(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// When the turn must be over.
    pub(crate) fn deadline(&self) -> Instant {
        self.inner.deadline
    }

    /// The turn's whole time budget (`deadline - started`).
    pub(crate) fn time_limit(&self) -> Duration {
        self.inner.limit
    }

    /// The turn's deadline (when it must be over, and the whole time it was
    /// given), as the request extension the other layers read; its
    /// [`remaining`](TurnDeadline::remaining) is the time left.
    pub fn turn_deadline(&self) -> TurnDeadline {
        TurnDeadline {
            at: self.inner.deadline,
            limit: self.inner.limit,
        }
    }

    /// Time left before the deadline; zero once it has passed.
    pub(crate) fn remaining(&self) -> Duration {
        self.inner
            .deadline
            .saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed.
    pub(crate) fn is_expired(&self) -> bool {
        Instant::now() >= self.inner.deadline
    }

    /// Attempts begun so far.
    pub fn attempts_used(&self) -> u32 {
        self.inner.attempts.load(Ordering::Acquire)
    }

    fn deadline_error(&self) -> BudgetExhausted {
        BudgetExhausted::Deadline {
            limit: self.inner.limit,
            elapsed: self.elapsed(),
        }
    }

    /// Begin an attempt: returns its 1-based number, or why the turn may not
    /// make it.
    ///
    /// Refuses once the deadline has passed or every attempt is used; the
    /// count is claimed atomically, so concurrent hops never overdraw it.
    /// When the turn carries a [`RetryBudget`], attempt 1 deposits into it
    /// and every later attempt withdraws from it first; a refused withdrawal
    /// gives [`BudgetExhausted::RetryBudget`] and does not use up an attempt.
    /// Spend is checked separately, with [`check_spend`](Self::check_spend),
    /// because only the caller knows the next attempt's estimate.
    pub(crate) fn try_begin_attempt(&self) -> Result<u32, BudgetExhausted> {
        self.try_begin_attempt_at(Instant::now())
    }

    /// [`try_begin_attempt`](Self::try_begin_attempt) at `now`: one clock
    /// read for the deadline, the retry budget and the caller's record of
    /// when the attempt started.
    pub(crate) fn try_begin_attempt_at(&self, now: Instant) -> Result<u32, BudgetExhausted> {
        let attempt = self.claim_attempt_at(now)?;
        if let Some(retry_budget) = &self.inner.retry_budget {
            if attempt == 1 {
                retry_budget.deposit_for_at(&self.inner.client, now);
            } else if !retry_budget.withdraw_for_at(&self.inner.client, now) {
                // Give the attempt back: it was never made.
                self.inner.attempts.fetch_sub(1, Ordering::AcqRel);
                return Err(BudgetExhausted::RetryBudget { attempt });
            }
        }
        Ok(attempt)
    }

    /// Claims a hedge's attempt: like [`try_begin_attempt`](Self::try_begin_attempt),
    /// but a hedge draws from its own budget, not the retry budget.
    /// `now` as for [`try_begin_attempt_at`](Self::try_begin_attempt_at).
    pub(crate) fn try_begin_hedge_at(&self, now: Instant) -> Result<u32, BudgetExhausted> {
        self.claim_attempt_at(now)
    }

    /// The next attempt's number, within the deadline and the attempts.
    fn claim_attempt_at(&self, now: Instant) -> Result<u32, BudgetExhausted> {
        if now >= self.inner.deadline {
            return Err(self.deadline_error());
        }
        let max = self.inner.max_attempts;
        let claimed =
            self.inner
                .attempts
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    (used < max).then_some(used + 1)
                });
        match claimed {
            Ok(before) => Ok(before + 1),
            Err(used) => Err(BudgetExhausted::Attempts { used, max }),
        }
    }

    /// Check that an attempt estimated to cost `estimated_next` still fits
    /// under the spend ceiling.
    ///
    /// Refuses when spend has already reached the ceiling, or when spend plus
    /// the estimate would pass it. Always fine without a ceiling.
    pub(crate) fn check_spend(&self, estimated_next: Cost) -> Result<(), BudgetExhausted> {
        let Some(ceiling) = self.inner.spend_ceiling else {
            return Ok(());
        };
        let (spent, spent_includes_estimate) = self.spent();
        if spent >= ceiling || spent.saturating_add(estimated_next) > ceiling {
            return Err(BudgetExhausted::Spend {
                spent,
                spent_includes_estimate,
                estimated_next,
                ceiling,
            });
        }
        Ok(())
    }

    /// Check, without using anything up, that the turn could still make an
    /// attempt: deadline not passed, an attempt left, spend below the
    /// ceiling. (The retry budget is not consulted: asking it costs a token.)
    pub(crate) fn check_open(&self) -> Result<(), BudgetExhausted> {
        if self.is_expired() {
            return Err(self.deadline_error());
        }
        self.check_attempts_and_spend()
    }

    /// [`check_open`](Self::check_open) for a budget started a moment ago
    /// (by the caller): a deadline a millisecond or more after the start
    /// has not passed, so the clock is not read for it.
    pub(crate) fn check_open_just_started(&self) -> Result<(), BudgetExhausted> {
        if self.inner.limit < Duration::from_millis(1) {
            return self.check_open();
        }
        self.check_attempts_and_spend()
    }

    fn check_attempts_and_spend(&self) -> Result<(), BudgetExhausted> {
        let used = self.attempts_used();
        if used >= self.inner.max_attempts {
            return Err(BudgetExhausted::Attempts {
                used,
                max: self.inner.max_attempts,
            });
        }
        self.check_spend(Cost::ZERO)
    }

    /// Add a finished attempt's cost; `estimated` marks it as estimated
    /// rather than computed from reported usage.
    pub(crate) fn record_spend(&self, cost: Cost, estimated: bool) {
        // fetch_update never fails with a closure returning Some.
        let _ = self
            .inner
            .spent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |spent| {
                Some(spent.saturating_add(cost.as_nanos()))
            });
        if estimated {
            self.inner.spent_estimated.store(true, Ordering::Release);
        }
    }

    /// Spent so far, and whether any of it is an estimate.
    pub fn spent(&self) -> (Cost, bool) {
        (
            Cost::from_nanos(self.inner.spent.load(Ordering::Acquire)),
            self.inner.spent_estimated.load(Ordering::Acquire),
        )
    }

    /// Meter this turn's spend with `tenant` under `spend`: each attempt
    /// then reserves its estimate ([`reserve_tenant`](Self::reserve_tenant)),
    /// and when the turn's last handle is dropped (its body done or
    /// dropped), the tenant's total is settled against
    /// [`spent`](Self::spent). Set once: `false` when the turn was already
    /// metered (the first tenant stays).
    ///
    /// [`BudgetLayer::tenant_spend`](super::BudgetLayer::tenant_spend)
    /// calls it with the tenant of the request's
    /// [`ClientId`](crate::identity::ClientId).
    pub(crate) fn meter_tenant(&self, spend: TenantSpend, tenant: String) -> bool {
        self.inner
            .tenant
            .set(Box::new(TenantLedger::new(spend, tenant)))
            .is_ok()
    }

    /// Meter this turn under every account of `ceilings` too (set once:
    /// `false` when the turn already had them, or `ceilings` is empty).
    /// Reserved and settled like the tenant
    /// ([`meter_tenant`](Self::meter_tenant)).
    pub(crate) fn meter_ceilings(&self, ceilings: SpendCeilings) -> bool {
        if ceilings.is_empty() {
            return false;
        }
        let ledgers = ceilings
            .accounts
            .into_iter()
            .map(|(spend, account)| TenantLedger::new(spend, account))
            .collect();
        self.inner.ceilings.set(ledgers).is_ok()
    }

    /// The tenant this turn's spend is metered with, if any.
    pub fn tenant(&self) -> Option<&str> {
        self.inner.tenant.get().map(|ledger| ledger.tenant())
    }

    /// Whether reserving spend for an attempt may wait on a store (the
    /// turn has a tenant or ceiling accounts): a wait not bounded by the
    /// deadline.
    pub(crate) fn reserves_with_ledgers(&self) -> bool {
        self.inner.tenant.get().is_some()
            || self.inner.ceilings.get().is_some_and(|c| !c.is_empty())
    }

    /// An inner layer says it answers by the deadline itself: every wait
    /// it makes from now on is bounded by the deadline. A budget layer
    /// outside then arms no timer of its own for the head (a timer-wheel
    /// entry per turn, made and cleared). Set by the failover layer once
    /// the request is read, for a turn that reserves with no ledger.
    pub(crate) fn watch_inside(&self) {
        self.inner.watched_inside.store(true, Ordering::Relaxed);
    }

    /// Whether [`watch_inside`](Self::watch_inside) was said.
    pub(crate) fn watched_inside(&self) -> bool {
        self.inner.watched_inside.load(Ordering::Relaxed)
    }

    /// Reserve an attempt's `estimate` with the turn's tenant before it is
    /// sent: the tenant's total must be below its ceiling, and then holds
    /// the estimate until the turn settles. The first attempt's
    /// reservation is the turn's admission. Always fine for a turn without
    /// a tenant.
    ///
    /// The same estimate is reserved under each account of the turn's
    /// [`SpendCeilings`]; the first that refuses refuses the attempt (what
    /// the others reserved for it is given back when the turn settles).
    pub(crate) async fn reserve_tenant(&self, estimate: Cost) -> Result<(), BudgetExhausted> {
        let ceilings = self.inner.ceilings.get().into_iter().flatten();
        let tenant = self.inner.tenant.get().map(|ledger| &**ledger);
        for ledger in tenant.into_iter().chain(ceilings) {
            ledger.reserve(estimate).await?;
        }
        Ok(())
    }

    /// Whether a wait of `wait` starting now would end before the deadline.
    /// A backoff that does not fit is never taken.
    pub(crate) fn wait_fits(&self, wait: Duration) -> bool {
        Instant::now()
            .checked_add(wait)
            .is_some_and(|end| end < self.inner.deadline)
    }

    /// The backoff before retry `retry_index` (0 = first retry) on the same
    /// target, given the provider's hint, checked against the time left.
    pub(crate) fn retry_delay(&self, retry_index: u32, hint: Option<Duration>) -> RetryDelay {
        match self.inner.backoff.delay(retry_index, hint) {
            Delay::Wait(wait) if self.wait_fits(wait) => RetryDelay::Wait(wait),
            Delay::Wait(wait) => RetryDelay::PastDeadline {
                wait,
                remaining: self.remaining(),
            },
            Delay::HintTooLong { asked, max } => RetryDelay::HintTooLong { asked, max },
        }
    }
}

impl Default for TurnBudget {
    /// A turn with the default [`TurnLimits`], starting now.
    fn default() -> Self {
        TurnLimits::new().start()
    }
}

impl fmt::Debug for TurnBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (spent, estimated) = self.spent();
        f.debug_struct("TurnBudget")
            .field("turn_id", &self.inner.turn_id)
            .field("time_limit", &self.inner.limit)
            .field("remaining", &self.remaining())
            .field("attempts_used", &self.attempts_used())
            .field("max_attempts", &self.inner.max_attempts)
            .field("spent", &spent)
            .field("spent_includes_estimate", &estimated)
            .field("spend_ceiling", &self.inner.spend_ceiling)
            .field("tenant", &self.inner.tenant.get())
            .finish()
    }
}

#[cfg(test)]
impl TurnBudget {
    /// Whether two handles are the same turn.
    pub(crate) fn ptr_eq(&self, other: &TurnBudget) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

#[cfg(test)]
impl RetryDelay {
    /// The wait to take, if any.
    pub(crate) fn wait(self) -> Option<Duration> {
        match self {
            RetryDelay::Wait(d) => Some(d),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_16_hex_and_distinct() {
        let a = TurnId::random();
        let b = TurnId::random();
        assert_eq!(a.as_str().len(), 16);
        assert!(a.as_str().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        let mut r1 = fastrand::Rng::with_seed(3);
        let mut r2 = fastrand::Rng::with_seed(3);
        assert_eq!(TurnId::from_rng(&mut r1), TurnId::from_rng(&mut r2));
        // The id is the generator's next u64 in zero-padded lowercase hex.
        for seed in [0, 3, 99] {
            let expected = format!("{:016x}", fastrand::Rng::with_seed(seed).u64(..));
            let id = TurnId::from_rng(&mut fastrand::Rng::with_seed(seed));
            assert_eq!(id.as_str(), expected);
        }
        assert_eq!(TurnId::from("req-7").to_string(), "req-7");
        // A random id (kept inline) and the same text adopted are one id.
        let adopted = TurnId::from(a.as_str().to_owned());
        assert_eq!(adopted, a);
        assert_eq!(adopted.cmp(&a), std::cmp::Ordering::Equal);
        let ids: std::collections::HashSet<TurnId> = [a.clone(), adopted].into();
        assert_eq!(ids.len(), 1);
        assert_eq!(format!("{a:?}"), format!("TurnId({:?})", a.as_str()));
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_counts_down_and_refuses() {
        let turn = TurnLimits {
            deadline: Duration::from_secs(10),
            ..TurnLimits::new()
        }
        .start();
        assert_eq!(turn.time_limit(), Duration::from_secs(10));
        assert_eq!(turn.remaining(), Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(turn.remaining(), Duration::from_secs(6));
        assert!(!turn.is_expired());
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(turn.is_expired());
        assert_eq!(turn.remaining(), Duration::ZERO);
        assert_eq!(
            turn.try_begin_attempt(),
            Err(BudgetExhausted::Deadline {
                limit: Duration::from_secs(10),
                elapsed: Duration::from_secs(10)
            })
        );
        assert_eq!(turn.attempts_used(), 0);
        assert!(turn.check_open().is_err());
    }

    /// A budget checked as just started skips the clock only when its
    /// deadline is at least a millisecond after its start; its attempts
    /// are still checked.
    #[tokio::test(start_paused = true)]
    async fn a_just_started_check_reads_the_clock_only_for_a_deadline_under_a_millisecond() {
        let limits = |deadline, max_attempts| TurnLimits {
            deadline,
            max_attempts,
            ..TurnLimits::new()
        };
        // Time moved past the deadline without the caller knowing: the
        // just-started check trusts the caller, the full check does not.
        let turn = limits(Duration::from_millis(1), 3).start();
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(turn.check_open_just_started().is_ok());
        assert!(turn.check_open().is_err());
        // Under a millisecond, the clock decides.
        let turn = limits(Duration::from_micros(999), 3).start();
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(matches!(
            turn.check_open_just_started(),
            Err(BudgetExhausted::Deadline { .. })
        ));
        assert!(matches!(
            limits(Duration::ZERO, 3).start().check_open_just_started(),
            Err(BudgetExhausted::Deadline { .. })
        ));
        // The attempts are checked either way.
        let turn = limits(Duration::from_secs(10), 1).start();
        assert_eq!(turn.try_begin_attempt(), Ok(1));
        assert!(matches!(
            turn.check_open_just_started(),
            Err(BudgetExhausted::Attempts { used: 1, max: 1 })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn huge_deadline_does_not_overflow() {
        let turn = TurnLimits {
            deadline: Duration::MAX,
            ..TurnLimits::new()
        }
        .start();
        assert!(!turn.is_expired());
        assert!(turn.wait_fits(Duration::from_secs(3600)));
        assert!(!turn.wait_fits(Duration::MAX));
    }

    #[test]
    fn attempts_are_claimed_atomically_across_threads() {
        let turn = TurnLimits {
            max_attempts: 50,
            ..TurnLimits::new()
        }
        .start();
        let ok = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..20 {
                        if turn.try_begin_attempt().is_ok() {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(ok.load(Ordering::Relaxed), 50);
        assert_eq!(turn.attempts_used(), 50);
    }

    #[test]
    fn zero_max_attempts_means_one() {
        let turn = TurnLimits {
            max_attempts: 0,
            ..TurnLimits::new()
        }
        .start();
        assert_eq!(turn.try_begin_attempt(), Ok(1));
        assert!(turn.try_begin_attempt().is_err());
    }

    #[test]
    fn spend_without_ceiling_is_unbounded_but_counted() {
        let turn = TurnBudget::default();
        turn.record_spend(Cost::MAX, false);
        turn.record_spend(Cost::from_nanos(5), true);
        assert_eq!(turn.spent(), (Cost::MAX, true));
        assert!(turn.check_spend(Cost::MAX).is_ok());
    }

    #[test]
    fn spend_error_reads_well() {
        let turn = TurnLimits {
            spend_ceiling: Some(Cost::from_usd(0.10)),
            ..TurnLimits::new()
        }
        .start();
        turn.record_spend(Cost::from_usd(0.08), true);
        let err = turn.check_spend(Cost::from_usd(0.03)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spend ceiling $0.10 reached: $0.08 (partly estimated) spent, next attempt estimated at $0.03"
        );
        assert!(turn.check_spend(Cost::from_usd(0.02)).is_ok());
        turn.record_spend(Cost::from_usd(0.02), false);
        // At the ceiling exactly: even a free attempt is refused.
        assert!(turn.check_spend(Cost::ZERO).is_err());
        assert!(turn.check_open().is_err());
    }
}
