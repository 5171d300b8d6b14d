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
}

/// The in-memory [`SpendStore`], for one gateway process. Holds one total
/// per tenant and window label; older windows are dropped when a tenant's
/// window changes.
#[derive(Debug, Default)]
pub struct MemorySpendStore {
    totals: Mutex<HashMap<(String, SpendWindow), (String, Cost)>>,
}

impl MemorySpendStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
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
        let label = window.label(SystemTime::now());
        let mut totals = self.totals.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = totals
            .entry((tenant.to_owned(), window))
            .or_insert_with(|| (label.clone(), Cost::ZERO));
        if slot.0 != label {
            *slot = (label, Cost::ZERO);
        }
        slot.1 = slot.1.saturating_add(amount);
        let check = SpendCheck::new(slot.1, ceiling);
        Box::pin(std::future::ready(Ok(check)))
    }
}

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

    /// The tenant a request names, if any.
    pub fn tenant(&self, headers: &HeaderMap) -> Option<String> {
        headers
            .get(&self.header)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
    }

    /// Whether a turn of the tenant `headers` name may start.
    pub async fn admit(&self, headers: &HeaderMap) -> Result<Option<String>, TenantRefusal> {
        let Some(tenant) = self.tenant(headers) else {
            if self.require_tenant {
                return Err(TenantRefusal::NoTenant(self.header.clone()));
            }
            return Ok(None);
        };
        match self
            .store
            .add_and_check(&tenant, self.window, Cost::ZERO, self.ceiling)
            .await
        {
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
}
