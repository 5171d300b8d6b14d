//! Tenant spend over a calendar window (a day or a month, UTC), held in a
//! [`SpendStore`] so the ceiling can hold across gateway replicas.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName};

use super::cost::Cost;
use crate::BoxError;

/// A boxed, `Send` future, so [`SpendStore`] stays object safe.
pub type SpendFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The calendar window a tenant's ceiling applies to (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    pub fn within(&self) -> bool {
        self.spent < self.ceiling
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

    /// Tenants holding a total (for tests and metrics).
    pub fn len(&self) -> usize {
        self.totals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spent
            .len()
    }

    /// Whether no tenant holds a total.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
}

/// The longest tenant name [`TenantSpend`] accepts, in bytes.
pub const MAX_TENANT_LEN: usize = 128;

/// Why [`TenantSpend::admit`] refused a turn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TenantRefusal {
    /// The tenant's spend reached its ceiling for the window.
    #[error("tenant spend ceiling {ceiling} reached for this {window}: {spent} spent")]
    Ceiling {
        /// Spent in the window.
        spent: Cost,
        /// The ceiling.
        ceiling: Cost,
        /// `day` or `month`.
        window: &'static str,
    },
    /// The request names no tenant, and one is required.
    #[error("the request names no tenant (header `{0}`)")]
    NoTenant(HeaderName),
    /// The store could not be asked and the policy fails closed.
    #[error(transparent)]
    Store(#[from] SpendError),
}

/// A tenant ceiling over a window: which header names the tenant, the
/// ceiling, and what to do when the store cannot be reached.
///
/// [`admit`](Self::admit) before a turn (a check: the tenant's spend must
/// be below the ceiling), [`record`](Self::record) after it with what it
/// cost. Turns running at the same time may together pass the ceiling by
/// their own cost; no turn starts once it is reached.
#[derive(Debug, Clone)]
pub struct TenantSpend {
    store: Arc<dyn SpendStore>,
    header: HeaderName,
    window: SpendWindow,
    ceiling: Cost,
    fail_open: bool,
    require_tenant: bool,
}

impl TenantSpend {
    /// A ceiling of `ceiling` per `window` for the tenant named by
    /// `header`, kept in `store`; fails closed when the store is down.
    pub fn new(
        store: Arc<dyn SpendStore>,
        header: HeaderName,
        window: SpendWindow,
        ceiling: Cost,
    ) -> Self {
        Self {
            store,
            header,
            window,
            ceiling,
            fail_open: false,
            require_tenant: false,
        }
    }

    /// Let turns through when the store cannot be reached (logged), rather
    /// than refusing them.
    pub fn fail_open(mut self, open: bool) -> Self {
        self.fail_open = open;
        self
    }

    /// Refuse requests without the tenant header (default: they are not
    /// metered).
    pub fn require_tenant(mut self, required: bool) -> Self {
        self.require_tenant = required;
        self
    }

    /// The tenant a request names, if any: a header value of at most
    /// [`MAX_TENANT_LEN`] bytes after trimming; a longer one names no
    /// tenant (it would be a key in the store).
    pub fn tenant(&self, headers: &HeaderMap) -> Option<String> {
        headers
            .get(&self.header)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= MAX_TENANT_LEN)
            .map(str::to_owned)
    }

    /// Whether a turn of the tenant `headers` name may start: a read of the
    /// store, which writes nothing.
    pub async fn admit(&self, headers: &HeaderMap) -> Result<Option<String>, TenantRefusal> {
        let Some(tenant) = self.tenant(headers) else {
            if self.require_tenant {
                return Err(TenantRefusal::NoTenant(self.header.clone()));
            }
            return Ok(None);
        };
        match self.store.check(&tenant, self.window, self.ceiling).await {
            Ok(check) if check.within() => Ok(Some(tenant)),
            Ok(check) => Err(TenantRefusal::Ceiling {
                spent: check.spent,
                ceiling: check.ceiling,
                window: match self.window {
                    SpendWindow::Day => "day",
                    SpendWindow::Month => "month",
                },
            }),
            Err(error) if self.fail_open => {
                tracing::warn!(%error, "spend store unreachable; turn let through (fail open)");
                Ok(Some(tenant))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Adds a finished turn's cost to `tenant`'s window.
    pub async fn record(&self, tenant: &str, cost: Cost) -> Result<SpendCheck, SpendError> {
        self.store
            .add_and_check(tenant, self.window, cost, self.ceiling)
            .await
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
        let header = HeaderName::from_static("x-tenant");
        let spend = TenantSpend::new(store, header, SpendWindow::Day, Cost::from_usd(1.0));
        let mut headers = HeaderMap::new();
        let fits = "t".repeat(MAX_TENANT_LEN);
        headers.insert("x-tenant", fits.parse().unwrap());
        assert_eq!(spend.tenant(&headers), Some(fits));
        headers.insert("x-tenant", "t".repeat(MAX_TENANT_LEN + 1).parse().unwrap());
        assert_eq!(spend.tenant(&headers), None);
        assert_eq!(spend.admit(&headers).await.unwrap(), None);
        let required = spend.require_tenant(true);
        assert!(matches!(
            required.admit(&headers).await,
            Err(TenantRefusal::NoTenant(_))
        ));
    }
}
