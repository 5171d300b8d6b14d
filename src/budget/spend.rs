//! Tenant spend over a calendar window (a day or a month, UTC), held in a
//! [`SpendStore`] so the ceiling can hold across gateway replicas.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::BoxError;
use crate::Cost;
use crate::identity::ClientId;

/// A boxed, `Send` future, so [`SpendStore`] stays object safe.
pub type SpendFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The calendar window a tenant's ceiling applies to (UTC).
///
/// Exhaustive: a new window is a change every [`SpendStore`] must make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpendWindow {
    /// One UTC day.
    Day,
    /// One UTC calendar month.
    Month,
}

impl SpendWindow {
    /// The window's name at `at`: `d:2026-12-01` or `m:2026-12`.
    pub fn label(self, at: SystemTime) -> String {
        let days = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() / 86_400);
        let (year, month, day) = civil_from_days(days as i64);
        match self {
            Self::Day => format!("d:{year:04}-{month:02}-{day:02}"),
            Self::Month => format!("m:{year:04}-{month:02}"),
        }
    }

    /// How long a store keeps a window's total: past its end, with room
    /// for clock skew.
    pub fn keep(self) -> std::time::Duration {
        let day = std::time::Duration::from_secs(86_400);
        match self {
            Self::Day => day * 2,
            Self::Month => day * 32,
        }
    }
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A tenant's spend after an [`add_and_check`](SpendStore::add_and_check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpendCheck {
    /// The window's total, the added amount included.
    pub spent: Cost,
    /// The ceiling it was checked against.
    pub ceiling: Cost,
}

impl SpendCheck {
    /// A check that found `spent` against `ceiling`.
    pub fn new(spent: Cost, ceiling: Cost) -> Self {
        Self { spent, ceiling }
    }

    /// Whether the tenant may start another turn: spend is below the ceiling.
    pub(crate) fn within(&self) -> bool {
        self.spent < self.ceiling
    }
}

/// What a [`reserve`](SpendStore::reserve) found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reservation {
    /// Whether the amount was added: the total was below the ceiling.
    pub reserved: bool,
    /// The window's total after the call (the amount included when
    /// reserved).
    pub spent: Cost,
    /// The ceiling it was checked against.
    pub ceiling: Cost,
}

impl Reservation {
    /// A reservation that was (`reserved`) or was not made, leaving
    /// `spent` against `ceiling`.
    pub fn new(reserved: bool, spent: Cost, ceiling: Cost) -> Self {
        Self {
            reserved,
            spent,
            ceiling,
        }
    }
}

/// Errors of a [`SpendStore`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpendError {
    /// The store could not be reached.
    #[error("spend store unavailable: {0}")]
    Unavailable(#[source] BoxError),
    /// The store answered with an error.
    #[error("spend store failed: {0}")]
    Backend(#[source] BoxError),
}

/// Where tenants' spend is added up, per window.
pub trait SpendStore: fmt::Debug + Send + Sync + 'static {
    /// Adds `amount` to `tenant`'s total of the current `window` and
    /// returns the new total against `ceiling`, atomically (zero `amount`:
    /// a check).
    fn add_and_check<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<SpendCheck, SpendError>>;

    /// `tenant`'s total of the current `window` against `ceiling`, without
    /// writing anything: a tenant that never spent leaves no trace (every
    /// distinct header value would otherwise keep a record for the
    /// window). The default adds zero; stores should override it.
    fn check<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<SpendCheck, SpendError>> {
        self.add_and_check(tenant, window, Cost::ZERO, ceiling)
    }

    /// Adds `amount` to `tenant`'s total of the current `window` only when
    /// the total is below `ceiling`, else adds nothing, in one atomic step:
    /// concurrent reservations never all pass a nearly spent ceiling. Each
    /// may take the total past the ceiling by at most its own amount.
    ///
    /// Required (no default): a check followed by an add would let every
    /// concurrent turn through.
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<Reservation, SpendError>>;

    /// Settles a turn against what it really cost: adds `actual - reserved`
    /// (which may be negative) to `tenant`'s total of the current `window`,
    /// never taking it below zero, atomically. Returns the new total.
    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        reserved: Cost,
        actual: Cost,
    ) -> SpendFuture<'a, Result<Cost, SpendError>>;
}

/// The in-memory [`SpendStore`], for one gateway process. Holds one total
/// per tenant that spent in the current window; when a window ends (its
/// label changes), the totals of the window that ended are dropped, so the
/// map holds only the tenants of the current day or month. A
/// [`check`](SpendStore::check) stores nothing.
#[derive(Debug, Default)]
pub struct MemorySpendStore {
    totals: Mutex<Totals>,
}

#[derive(Debug, Default)]
struct Totals {
    /// `(tenant, window)` to the total of the window's current label.
    spent: HashMap<(String, SpendWindow), Cost>,
    /// The label each window's totals belong to.
    labels: HashMap<SpendWindow, String>,
}

impl Totals {
    /// Starts `window`'s new label when it changed, dropping the totals of
    /// the one that ended.
    fn roll(&mut self, window: SpendWindow, label: String) {
        if self.labels.get(&window) != Some(&label) {
            self.spent.retain(|(_, w), _| *w != window);
            self.labels.insert(window, label);
        }
    }
}

impl MemorySpendStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `amount` at `at` (zero: a check, which stores nothing).
    fn add_at(
        &self,
        tenant: &str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
        at: SystemTime,
    ) -> SpendCheck {
        let mut totals = self.totals.lock().unwrap_or_else(PoisonError::into_inner);
        totals.roll(window, window.label(at));
        let spent = if amount.is_zero() {
            totals
                .spent
                .get(&(tenant.to_owned(), window))
                .copied()
                .unwrap_or(Cost::ZERO)
        } else {
            let total = totals
                .spent
                .entry((tenant.to_owned(), window))
                .or_insert(Cost::ZERO);
            *total = total.saturating_add(amount);
            *total
        };
        SpendCheck::new(spent, ceiling)
    }

    /// Reserves `amount` at `at` when the total is below `ceiling`; a
    /// zero amount (or a refusal) stores nothing.
    fn reserve_at(
        &self,
        tenant: &str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
        at: SystemTime,
    ) -> Reservation {
        let mut totals = self.totals.lock().unwrap_or_else(PoisonError::into_inner);
        totals.roll(window, window.label(at));
        let key = (tenant.to_owned(), window);
        let spent = totals.spent.get(&key).copied().unwrap_or(Cost::ZERO);
        if spent >= ceiling {
            return Reservation::new(false, spent, ceiling);
        }
        if amount.is_zero() {
            return Reservation::new(true, spent, ceiling);
        }
        let total = spent.saturating_add(amount);
        totals.spent.insert(key, total);
        Reservation::new(true, total, ceiling)
    }

    /// Adds `actual - reserved` at `at`, never below zero; a total that
    /// comes to zero is dropped (it would be a record of nothing).
    fn settle_at(
        &self,
        tenant: &str,
        window: SpendWindow,
        reserved: Cost,
        actual: Cost,
        at: SystemTime,
    ) -> Cost {
        let mut totals = self.totals.lock().unwrap_or_else(PoisonError::into_inner);
        totals.roll(window, window.label(at));
        let key = (tenant.to_owned(), window);
        let spent = totals.spent.get(&key).copied().unwrap_or(Cost::ZERO);
        let total = spent.saturating_add(actual).saturating_sub(reserved);
        if total.is_zero() {
            totals.spent.remove(&key);
        } else {
            totals.spent.insert(key, total);
        }
        total
    }
}

impl SpendStore for MemorySpendStore {
    fn add_and_check<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<SpendCheck, SpendError>> {
        let check = self.add_at(tenant, window, amount, ceiling, SystemTime::now());
        Box::pin(std::future::ready(Ok(check)))
    }

    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<Reservation, SpendError>> {
        let reservation = self.reserve_at(tenant, window, amount, ceiling, SystemTime::now());
        Box::pin(std::future::ready(Ok(reservation)))
    }

    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        reserved: Cost,
        actual: Cost,
    ) -> SpendFuture<'a, Result<Cost, SpendError>> {
        let total = self.settle_at(tenant, window, reserved, actual, SystemTime::now());
        Box::pin(std::future::ready(Ok(total)))
    }
}

pub(crate) use crate::identity::MAX_TENANT_LEN;

/// Why [`TenantSpend`] refused a turn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TenantRefusal {
    /// The tenant's spend reached its ceiling for the window.
    #[error("tenant spend ceiling {ceiling} reached for this {window}: {spent} spent")]
    Ceiling {
        /// Spent (and reserved) in the window.
        spent: Cost,
        /// The ceiling.
        ceiling: Cost,
        /// `day` or `month`.
        window: &'static str,
    },
    /// The request's client ([`ClientId`]) names no tenant, and one is
    /// required.
    #[error("the request names no tenant (its client identity has none)")]
    NoTenant,
    /// The store could not be asked and the policy fails closed.
    #[error(transparent)]
    Store(#[from] SpendError),
}

/// Default tries of a settlement the store could not take (fail closed).
const SETTLE_TRIES: u32 = 10;
/// Default wait before the first retry of a settlement; it doubles.
const SETTLE_FIRST_WAIT: Duration = Duration::from_millis(100);
/// The longest wait between two tries of a settlement.
const SETTLE_MAX_WAIT: Duration = Duration::from_secs(5);
/// Default bound on settlements waiting for a retry at once.
const SETTLE_MAX_PENDING: usize = 1024;

/// A tenant ceiling over a window: the store, the ceiling, and what to do
/// when the store cannot be reached.
///
/// The tenant is the one the request's [`ClientId`] names
/// ([`ClientId::tenant`]): an identity layer in front puts it in the
/// request extensions (the gateway's key check, or an application's own
/// authentication; a library user who meters by tenant inserts a
/// `ClientId` in the extensions). Nothing here reads a header: a
/// self-asserted tenant header would let any client spend another's
/// ceiling.
///
/// Given to [`BudgetLayer::tenant_spend`](super::BudgetLayer::tenant_spend),
/// every turn of a tenant is metered: each attempt
/// [`reserve`](Self::reserve)s its estimate before it is sent (the first
/// one is the turn's admission), and the end of the turn
/// [`settle`](Self::settle)s against what it really cost. Turns of one
/// tenant running at the same time can together pass the ceiling by at
/// most one attempt's estimate each; no attempt starts once it is reached.
///
/// The store, the window and the ceiling are given to [`new`](Self::new);
/// the policy is in the public fields, set on the value it returns:
///
/// ```
/// use std::sync::Arc;
/// use tower_llm_failover::Cost;
/// use tower_llm_failover::budget::{MemorySpendStore, SpendWindow, TenantSpend};
///
/// let mut spend = TenantSpend::new(
///     Arc::new(MemorySpendStore::new()),
///     SpendWindow::Day,
///     Cost::from_usd(20.0),
/// );
/// spend.require_tenant = true;
/// assert!(!spend.fail_open);
/// ```
#[derive(Debug, Clone)]
pub struct TenantSpend {
    store: Arc<dyn SpendStore>,
    window: SpendWindow,
    ceiling: Cost,
    /// Let turns through when the store cannot be reached (logged), rather
    /// than refusing them; a settlement the store could not take is then
    /// logged and not retried. Default `false`: fail closed.
    pub fail_open: bool,
    /// Refuse requests whose client names no tenant (default `false`: they
    /// are not metered).
    pub require_tenant: bool,
    /// Failing closed, how often a settlement the store could not take is
    /// tried in all (default 10; 0 is taken as 1: it is always tried once).
    pub settle_tries: u32,
    /// Failing closed, the wait before a settlement's first retry (default
    /// 100 ms); it doubles, up to 5 s.
    pub settle_first_wait: Duration,
    /// Failing closed, how many settlements may wait for a retry at once
    /// (default 1,024); beyond it, one that fails is logged and dropped, so
    /// an outage cannot grow memory without bound.
    pub max_pending_settlements: usize,
    /// Settlements waiting for a retry, across clones.
    pending: Arc<AtomicUsize>,
}

impl TenantSpend {
    /// A ceiling of `ceiling` per `window` for each tenant, kept in
    /// `store`; fails closed when the store is down.
    pub fn new(store: Arc<dyn SpendStore>, window: SpendWindow, ceiling: Cost) -> Self {
        Self {
            store,
            window,
            ceiling,
            fail_open: false,
            require_tenant: false,
            settle_tries: SETTLE_TRIES,
            settle_first_wait: SETTLE_FIRST_WAIT,
            max_pending_settlements: SETTLE_MAX_PENDING,
            pending: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Settlements waiting for a retry right now.
    pub fn pending_settlements(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// The tenant `client` names, if any: at most 128 bytes
    /// after trimming; a longer one names no tenant (it would be a key in
    /// the store).
    pub(crate) fn tenant(&self, client: &ClientId) -> Option<String> {
        client
            .tenant()
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= MAX_TENANT_LEN)
            .map(str::to_owned)
    }

    /// The tenant `client` names, or why its turn may not start: none
    /// named and one is required. `Ok(None)`: not metered.
    pub(crate) fn tenant_of(&self, client: &ClientId) -> Result<Option<String>, TenantRefusal> {
        match self.tenant(client) {
            Some(tenant) => Ok(Some(tenant)),
            None if self.require_tenant => Err(TenantRefusal::NoTenant),
            None => Ok(None),
        }
    }

    /// Whether the tenant's spend is below the ceiling right now: a read
    /// of the store, which writes nothing and reserves nothing (the
    /// admission of a metered turn is its first
    /// [`reserve`](Self::reserve)).
    pub async fn admit(&self, client: &ClientId) -> Result<Option<String>, TenantRefusal> {
        let Some(tenant) = self.tenant_of(client)? else {
            return Ok(None);
        };
        match self.store.check(&tenant, self.window, self.ceiling).await {
            Ok(check) if check.within() => Ok(Some(tenant)),
            Ok(check) => Err(self.ceiling_reached(check.spent)),
            Err(error) if self.fail_open => {
                tracing::warn!(%error, "spend store unreachable; turn let through (fail open)");
                Ok(Some(tenant))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Reserves an attempt's estimated cost for `tenant`: added when the
    /// tenant's total is below the ceiling, refused otherwise. Returns
    /// what was reserved: `amount`, or zero when the store could not be
    /// reached and the policy fails open (the turn goes through
    /// unreserved; its settlement adds its whole cost).
    pub async fn reserve(&self, tenant: &str, amount: Cost) -> Result<Cost, TenantRefusal> {
        match self
            .store
            .reserve(tenant, self.window, amount, self.ceiling)
            .await
        {
            Ok(reservation) if reservation.reserved => Ok(amount),
            Ok(reservation) => Err(self.ceiling_reached(reservation.spent)),
            Err(error) if self.fail_open => {
                tracing::warn!(%error, "spend store unreachable; attempt let through unreserved (fail open)");
                Ok(Cost::ZERO)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Settles a finished turn of `tenant`: adds `actual - reserved` (less
    /// than zero when the estimates were high). Returns the tenant's new
    /// total.
    ///
    /// Failing closed, a settlement the store could not take is tried
    /// again with a doubling wait ([`settle_tries`](Self::settle_tries),
    /// [`settle_first_wait`](Self::settle_first_wait)) while at most
    /// [`max_pending_settlements`](Self::max_pending_settlements) wait at
    /// once: a turn's cost is not lost to a store's brief outage.
    /// The error is returned only once the tries are used up.
    pub async fn settle(
        &self,
        tenant: &str,
        reserved: Cost,
        actual: Cost,
    ) -> Result<Cost, SpendError> {
        let mut wait = self.settle_first_wait;
        let mut tries = 1;
        let mut pending: Option<Pending> = None;
        loop {
            let error = match self
                .store
                .settle(tenant, self.window, reserved, actual)
                .await
            {
                Ok(total) => return Ok(total),
                Err(error) => error,
            };
            if self.fail_open || tries >= self.settle_tries.max(1) {
                return Err(error);
            }
            if pending.is_none() {
                match Pending::enter(&self.pending, self.max_pending_settlements) {
                    Some(entered) => pending = Some(entered),
                    None => return Err(error),
                }
            }
            tracing::warn!(%error, tries, "a turn's spend could not be settled; trying again");
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2).min(SETTLE_MAX_WAIT);
            tries += 1;
        }
    }

    fn ceiling_reached(&self, spent: Cost) -> TenantRefusal {
        TenantRefusal::Ceiling {
            spent,
            ceiling: self.ceiling,
            window: match self.window {
                SpendWindow::Day => "day",
                SpendWindow::Month => "month",
            },
        }
    }
}

/// A settlement waiting for a retry, counted while it waits.
struct Pending(Arc<AtomicUsize>);

impl Pending {
    /// Counts one more, unless `max` already wait.
    fn enter(count: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(Arc::clone(count)))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// More ceilings a request's turn is held to besides its tenant's: each a
/// [`TenantSpend`] and the account it is kept under (a client key's own
/// daily or monthly ceiling, say). An identity layer puts it in the
/// request extensions; the [`BudgetLayer`](super::BudgetLayer) meters the
/// turn with every one of them: each attempt reserves its estimate under
/// each account, and the turn settles every account at its end. An
/// account that reached its ceiling refuses the attempt like the tenant's.
///
/// Accounts share the store's names with tenants: give them a prefix a
/// tenant cannot carry (the gateway uses `key` and a control character,
/// which no header value holds).
#[derive(Debug, Clone, Default)]
pub struct SpendCeilings {
    pub(crate) accounts: Vec<(TenantSpend, String)>,
}

impl SpendCeilings {
    /// No further ceiling.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds the turn to `spend`'s ceiling under `account` too.
    pub fn ceiling(mut self, spend: TenantSpend, account: impl Into<String>) -> Self {
        self.accounts.push((spend, account.into()));
        self
    }

    /// Whether it holds no ceiling.
    pub(crate) fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }
}

/// One turn's account with its tenant: what its attempts reserved, settled
/// once when the turn's budget is dropped (its body done or dropped, every
/// charge made).
pub(crate) struct TenantLedger {
    spend: TenantSpend,
    tenant: String,
    reserved: std::sync::atomic::AtomicU64,
}

impl TenantLedger {
    pub(crate) fn new(spend: TenantSpend, tenant: String) -> Self {
        Self {
            spend,
            tenant,
            reserved: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn tenant(&self) -> &str {
        &self.tenant
    }

    /// What the turn's attempts reserved so far.
    pub(crate) fn reserved(&self) -> Cost {
        Cost::from_nanos(self.reserved.load(Ordering::Acquire))
    }

    /// Reserves one attempt's estimate.
    pub(crate) async fn reserve(&self, amount: Cost) -> Result<(), TenantRefusal> {
        let reserved = self.spend.reserve(&self.tenant, amount).await?;
        // fetch_update never fails with a closure returning Some.
        let _ = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_add(reserved.as_nanos()))
            });
        Ok(())
    }

    /// Settles the turn at `actual`, off the caller's task (it runs from a
    /// drop). Nothing to do when the reservations were exact.
    pub(crate) fn settle_in_background(&self, actual: Cost) {
        let reserved = self.reserved();
        if reserved == actual {
            return;
        }
        let spend = self.spend.clone();
        let tenant = self.tenant.clone();
        let settle = async move {
            if let Err(error) = spend.settle(&tenant, reserved, actual).await {
                tracing::error!(
                    %error,
                    tenant = %crate::util::log_safe(&tenant),
                    %reserved,
                    %actual,
                    "a turn's spend could not be settled with its tenant"
                );
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(settle);
            }
            Err(_) => tracing::error!(
                tenant = %crate::util::log_safe(&self.tenant),
                %reserved,
                %actual,
                "a turn ended outside a Tokio runtime: its spend could not be settled"
            ),
        }
    }
}

impl fmt::Debug for TenantLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantLedger")
            .field("tenant", &self.tenant)
            .field("reserved", &self.reserved())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
impl MemorySpendStore {
    /// Tenants holding a total.
    fn len(&self) -> usize {
        self.totals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spent
            .len()
    }

    /// Whether no tenant holds a total.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn window_labels_follow_the_utc_calendar() {
        let at = UNIX_EPOCH + Duration::from_secs(1_796_083_200); // 2026-12-01
        assert_eq!(SpendWindow::Day.label(at), "d:2026-12-01");
        assert_eq!(SpendWindow::Month.label(at), "m:2026-12");
        assert_eq!(SpendWindow::Day.label(UNIX_EPOCH), "d:1970-01-01");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(SpendWindow::Day.label(leap), "d:2000-02-29");
    }

    #[tokio::test]
    async fn memory_store_adds_and_checks() {
        let store = MemorySpendStore::new();
        let ceiling = Cost::from_usd(1.0);
        let c = store
            .add_and_check("t", SpendWindow::Day, Cost::from_usd(0.6), ceiling)
            .await
            .unwrap();
        assert!(c.within());
        let c = store
            .add_and_check("t", SpendWindow::Day, Cost::from_usd(0.4), ceiling)
            .await
            .unwrap();
        assert!(!c.within());
        let other = store
            .add_and_check("u", SpendWindow::Day, Cost::ZERO, ceiling)
            .await
            .unwrap();
        assert_eq!(other.spent, Cost::ZERO);
    }

    #[test]
    fn memory_store_checks_store_nothing_and_old_windows_go() {
        let store = MemorySpendStore::new();
        let ceiling = Cost::from_usd(1.0);
        let day = UNIX_EPOCH + Duration::from_secs(1_796_083_200); // 2026-12-01
        for i in 0..100 {
            let tenant = format!("probe-{i}");
            let c = store.add_at(&tenant, SpendWindow::Day, Cost::ZERO, ceiling, day);
            assert_eq!(c.spent, Cost::ZERO);
        }
        assert!(store.is_empty(), "checks left records");
        store.add_at("a", SpendWindow::Day, Cost::from_usd(0.5), ceiling, day);
        store.add_at("b", SpendWindow::Day, Cost::from_usd(0.5), ceiling, day);
        store.add_at("a", SpendWindow::Month, Cost::from_usd(0.5), ceiling, day);
        assert_eq!(store.len(), 3);
        let c = store.add_at("a", SpendWindow::Day, Cost::ZERO, ceiling, day);
        assert_eq!(c.spent, Cost::from_usd(0.5));
        // The next day: the day's totals are gone, the month's stay.
        let next = day + Duration::from_secs(86_400);
        let c = store.add_at("a", SpendWindow::Day, Cost::ZERO, ceiling, next);
        assert_eq!(c.spent, Cost::ZERO);
        assert_eq!(store.len(), 1);
        let c = store.add_at("a", SpendWindow::Month, Cost::ZERO, ceiling, next);
        assert_eq!(c.spent, Cost::from_usd(0.5));
    }

    #[tokio::test]
    async fn an_over_long_tenant_names_no_tenant() {
        let store = Arc::new(MemorySpendStore::new());
        let spend = TenantSpend::new(store, SpendWindow::Day, Cost::from_usd(1.0));
        let fits = "t".repeat(MAX_TENANT_LEN);
        let client = ClientId::anonymous().with_tenant(fits.as_str());
        assert_eq!(spend.tenant(&client), Some(fits));
        let long = ClientId::anonymous().with_tenant("t".repeat(MAX_TENANT_LEN + 1));
        assert_eq!(spend.tenant(&long), None);
        assert_eq!(spend.admit(&long).await.unwrap(), None);
        // A key without a tenant of its own pays as itself.
        assert_eq!(spend.tenant(&ClientId::key("ci")), Some("ci".to_owned()));
        let required = TenantSpend {
            require_tenant: true,
            ..spend
        };
        assert!(matches!(
            required.admit(&long).await,
            Err(TenantRefusal::NoTenant)
        ));
        assert!(matches!(
            required.tenant_of(&ClientId::anonymous()),
            Err(TenantRefusal::NoTenant)
        ));
    }

    #[test]
    fn a_reservation_passes_only_below_the_ceiling_and_stores_no_refusal() {
        let store = MemorySpendStore::new();
        let day = UNIX_EPOCH + Duration::from_secs(1_796_083_200);
        let (estimate, ceiling) = (Cost::from_usd(0.2), Cost::from_usd(1.0));
        let admitted = (0..20)
            .filter(|_| {
                store
                    .reserve_at("t", SpendWindow::Day, estimate, ceiling, day)
                    .reserved
            })
            .count();
        assert_eq!(admitted, 5, "five estimates fill the ceiling exactly");
        let total = store
            .add_at("t", SpendWindow::Day, Cost::ZERO, ceiling, day)
            .spent;
        assert_eq!(total, ceiling);
        // Below the ceiling by a nano-USD: one more goes, overshooting by at
        // most its own estimate.
        store.settle_at("t", SpendWindow::Day, Cost::from_nanos(1), Cost::ZERO, day);
        let r = store.reserve_at("t", SpendWindow::Day, estimate, ceiling, day);
        assert!(r.reserved);
        assert_eq!(
            r.spent,
            ceiling
                .saturating_add(estimate)
                .saturating_sub(Cost::from_nanos(1))
        );
        // A refused or zero reservation of an unknown tenant stores nothing.
        assert!(
            store
                .reserve_at("u", SpendWindow::Day, Cost::ZERO, ceiling, day)
                .reserved
        );
        assert!(
            !store
                .reserve_at("v", SpendWindow::Day, estimate, Cost::ZERO, day)
                .reserved
        );
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn settling_brings_the_total_to_the_real_cost_and_never_below_zero() {
        let store = MemorySpendStore::new();
        let day = UNIX_EPOCH + Duration::from_secs(1_796_083_200);
        let ceiling = Cost::from_usd(1.0);
        store.reserve_at("t", SpendWindow::Day, Cost::from_usd(0.5), ceiling, day);
        store.reserve_at("t", SpendWindow::Day, Cost::from_usd(0.25), ceiling, day);
        // The first turn cost 0.1 of its 0.5; the second 0.4 of its 0.25.
        let total = store.settle_at(
            "t",
            SpendWindow::Day,
            Cost::from_usd(0.5),
            Cost::from_usd(0.1),
            day,
        );
        assert_eq!(total, Cost::from_usd(0.35));
        let total = store.settle_at(
            "t",
            SpendWindow::Day,
            Cost::from_usd(0.25),
            Cost::from_usd(0.4),
            day,
        );
        assert_eq!(total, Cost::from_usd(0.5));
        // A refund larger than the total (the window rolled) stops at zero
        // and leaves no record.
        let total = store.settle_at("t", SpendWindow::Day, Cost::from_usd(2.0), Cost::ZERO, day);
        assert_eq!(total, Cost::ZERO);
        assert!(store.is_empty());
    }

    /// A store whose settlements fail `failures` times, then go through.
    #[derive(Debug, Default)]
    struct Flaky {
        inner: MemorySpendStore,
        failures: AtomicUsize,
        settle_calls: AtomicUsize,
    }

    impl SpendStore for Flaky {
        fn add_and_check<'a>(
            &'a self,
            tenant: &'a str,
            window: SpendWindow,
            amount: Cost,
            ceiling: Cost,
        ) -> SpendFuture<'a, Result<SpendCheck, SpendError>> {
            self.inner.add_and_check(tenant, window, amount, ceiling)
        }

        fn reserve<'a>(
            &'a self,
            tenant: &'a str,
            window: SpendWindow,
            amount: Cost,
            ceiling: Cost,
        ) -> SpendFuture<'a, Result<Reservation, SpendError>> {
            self.inner.reserve(tenant, window, amount, ceiling)
        }

        fn settle<'a>(
            &'a self,
            tenant: &'a str,
            window: SpendWindow,
            reserved: Cost,
            actual: Cost,
        ) -> SpendFuture<'a, Result<Cost, SpendError>> {
            self.settle_calls.fetch_add(1, Ordering::AcqRel);
            let failing = self
                .failures
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            if failing {
                return Box::pin(std::future::ready(Err(SpendError::Unavailable(
                    "down".into(),
                ))));
            }
            self.inner.settle(tenant, window, reserved, actual)
        }
    }

    fn flaky(failures: usize) -> Arc<Flaky> {
        Arc::new(Flaky {
            failures: AtomicUsize::new(failures),
            ..Flaky::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn failing_closed_a_settlement_is_retried_until_the_store_takes_it() {
        let store = flaky(3);
        let spend = TenantSpend::new(store.clone(), SpendWindow::Day, Cost::from_usd(1.0));
        spend.reserve("t", Cost::from_usd(0.5)).await.unwrap();
        let started = tokio::time::Instant::now();
        let total = spend
            .settle("t", Cost::from_usd(0.5), Cost::from_usd(0.2))
            .await
            .unwrap();
        assert_eq!(total, Cost::from_usd(0.2), "the settlement was not lost");
        assert_eq!(store.settle_calls.load(Ordering::Acquire), 4);
        // 100 + 200 + 400 ms of backoff.
        assert_eq!(started.elapsed(), Duration::from_millis(700));
        assert_eq!(spend.pending_settlements(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn settlement_retries_are_bounded() {
        let store = flaky(usize::MAX);
        let spend = TenantSpend {
            settle_tries: 3,
            settle_first_wait: Duration::from_millis(10),
            ..TenantSpend::new(store.clone(), SpendWindow::Day, Cost::from_usd(1.0))
        };
        assert!(
            spend
                .settle("t", Cost::ZERO, Cost::from_usd(0.1))
                .await
                .is_err()
        );
        assert_eq!(store.settle_calls.load(Ordering::Acquire), 3);
        // Fail open: one try, no retry.
        let open = TenantSpend {
            fail_open: true,
            ..spend.clone()
        };
        assert!(
            open.settle("t", Cost::ZERO, Cost::from_usd(0.1))
                .await
                .is_err()
        );
        assert_eq!(store.settle_calls.load(Ordering::Acquire), 4);
        // No room to wait: tried once.
        let full = TenantSpend {
            max_pending_settlements: 0,
            ..spend
        };
        assert!(
            full.settle("t", Cost::ZERO, Cost::from_usd(0.1))
                .await
                .is_err()
        );
        assert_eq!(store.settle_calls.load(Ordering::Acquire), 5);
    }
}
