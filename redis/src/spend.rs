//! [`RedisSpendStore`]: tenant spend shared by every replica.

use std::sync::Arc;

use ::redis::Script;
use ::redis::aio::ConnectionLike;

use super::{DEFAULT_PREFIX, is_unavailable, millis};
use tower_llm_failover::{
    Cost, budget::Reservation, budget::SpendCheck, budget::SpendError, budget::SpendFuture,
    budget::SpendStore, budget::SpendWindow,
};

/// `actual - reserved` in nano-USD, as a signed store delta (clamped to
/// `i64`, which the counter takes).
fn settle_delta(reserved: Cost, actual: Cost) -> i64 {
    let delta = i128::from(actual.as_nanos()) - i128::from(reserved.as_nanos());
    i64::try_from(delta).unwrap_or(if delta < 0 { i64::MIN } else { i64::MAX })
}

/// The window's counter at Redis' clock (`window_key()`), prepended to
/// each script.
const WINDOW: &str = include_str!("spend_window.lua");

/// Adds to the window's total, keeps it past the window's end, returns it.
/// ARGV: kind, amount, keep_ms.
const ADD: &str = r"
local key = window_key()
local total = redis.call('INCRBY', key, ARGV[2])
redis.call('PEXPIRE', key, ARGV[3])
return total
";

/// Adds the amount only while the window's total is below the ceiling (a
/// refusal, or a zero amount, writes nothing); returns `{reserved, total}`.
/// ARGV: kind, amount, ceiling, keep_ms.
const RESERVE: &str = r"
local key = window_key()
local total = tonumber(redis.call('GET', key) or '0')
if total >= tonumber(ARGV[3]) then
  return {0, total}
end
if tonumber(ARGV[2]) > 0 then
  total = redis.call('INCRBY', key, ARGV[2])
  redis.call('PEXPIRE', key, ARGV[4])
end
return {1, total}
";

/// Adds a signed settlement, never leaving the total below zero.
/// ARGV: kind, delta, keep_ms.
const SETTLE: &str = r"
local key = window_key()
if tonumber(ARGV[2]) == 0 then
  return tonumber(redis.call('GET', key) or '0')
end
local total = redis.call('INCRBY', key, ARGV[2])
if total < 0 then
  redis.call('SET', key, 0)
  total = 0
end
redis.call('PEXPIRE', key, ARGV[3])
return total
";

/// The window's total; writes nothing (a tenant that never spent creates
/// no key). ARGV: kind.
const CHECK: &str = r"
return tonumber(redis.call('GET', window_key()) or '0')
";

/// One spend script: the shared window code, then `body`.
fn script(body: &str) -> Script {
    Script::new(&format!("{WINDOW}{body}"))
}

/// A [`SpendStore`] on Redis: one counter per tenant and window,
/// `{<prefix>:spend:<tenant>}:<window>` (nano-USD), added to and read in
/// one script, kept a little past the window's end. A
/// [`reserve`](SpendStore::reserve) reads, compares and adds in one script,
/// so replicas reserving at once never all pass a nearly spent ceiling; a
/// [`settle`](SpendStore::settle) adds a signed amount in one script. A
/// [`check`](SpendStore::check) (what [`TenantSpend::admit`] does) only
/// reads: a tenant that never spent creates no key. The window (`d:2026-12-02`,
/// `m:2026-12`, UTC) is named inside each script from Redis' `TIME`, not
/// from this replica's clock, so every replica adds to the same window
/// however far apart their clocks are, midnight included.
///
/// [`TenantSpend::admit`]: tower_llm_failover::budget::TenantSpend::admit
#[derive(Debug, Clone)]
pub struct RedisSpendStore<C> {
    connection: C,
    prefix: String,
    scripts: Arc<Scripts>,
}

/// The store's scripts, hashed once.
#[derive(Debug)]
struct Scripts {
    add: Script,
    reserve: Script,
    settle: Script,
    check: Script,
}

impl<C> RedisSpendStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store over `connection` with the default prefix.
    pub fn new(connection: C) -> Self {
        Self {
            connection,
            prefix: DEFAULT_PREFIX.to_owned(),
            scripts: Arc::new(Scripts {
                add: script(ADD),
                reserve: script(RESERVE),
                settle: script(SETTLE),
                check: script(CHECK),
            }),
        }
    }

    /// The key prefix (default [`DEFAULT_PREFIX`]).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }
}

impl<C> SpendStore for RedisSpendStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    fn add_and_check<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<SpendCheck, SpendError>> {
        Box::pin(async move {
            let mut connection = self.connection.clone();
            let total: i64 = self
                .scripts
                .add
                .key(self.tag(tenant))
                .arg(kind(window))
                .arg(nanos(amount))
                .arg(millis(window.keep()))
                .invoke_async(&mut connection)
                .await
                .map_err(spend_error)?;
            let spent = Cost::from_nanos(u64::try_from(total).unwrap_or(0));
            Ok(SpendCheck::new(spent, ceiling))
        })
    }

    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<Reservation, SpendError>> {
        Box::pin(async move {
            let mut connection = self.connection.clone();
            let (reserved, total): (i64, i64) = self
                .scripts
                .reserve
                .key(self.tag(tenant))
                .arg(kind(window))
                .arg(nanos(amount))
                .arg(nanos(ceiling))
                .arg(millis(window.keep()))
                .invoke_async(&mut connection)
                .await
                .map_err(spend_error)?;
            let spent = Cost::from_nanos(u64::try_from(total).unwrap_or(0));
            Ok(Reservation::new(reserved == 1, spent, ceiling))
        })
    }

    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        reserved: Cost,
        actual: Cost,
    ) -> SpendFuture<'a, Result<Cost, SpendError>> {
        Box::pin(async move {
            let mut connection = self.connection.clone();
            let total: i64 = self
                .scripts
                .settle
                .key(self.tag(tenant))
                .arg(kind(window))
                .arg(settle_delta(reserved, actual))
                .arg(millis(window.keep()))
                .invoke_async(&mut connection)
                .await
                .map_err(spend_error)?;
            Ok(Cost::from_nanos(u64::try_from(total).unwrap_or(0)))
        })
    }

    fn check<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<SpendCheck, SpendError>> {
        Box::pin(async move {
            let mut connection = self.connection.clone();
            let total: i64 = self
                .scripts
                .check
                .key(self.tag(tenant))
                .arg(kind(window))
                .invoke_async(&mut connection)
                .await
                .map_err(spend_error)?;
            Ok(SpendCheck::new(
                Cost::from_nanos(u64::try_from(total).unwrap_or(0)),
                ceiling,
            ))
        })
    }
}

impl<C> RedisSpendStore<C> {
    /// `tenant`'s hash tag; the scripts append the window's label (the
    /// counter is in the tag's slot, so a cluster routes by this key).
    fn tag(&self, tenant: &str) -> String {
        format!("{{{}:spend:{tenant}}}", self.prefix)
    }
}

/// The window's kind as the scripts name it.
fn kind(window: SpendWindow) -> &'static str {
    match window {
        SpendWindow::Day => "d",
        SpendWindow::Month => "m",
    }
}

/// An amount as Redis' signed 64-bit integer (clamped).
fn nanos(cost: Cost) -> i64 {
    i64::try_from(cost.as_nanos()).unwrap_or(i64::MAX)
}

fn spend_error(error: ::redis::RedisError) -> SpendError {
    if is_unavailable(&error) {
        SpendError::Unavailable(Box::new(error))
    } else {
        SpendError::Backend(Box::new(error))
    }
}

#[cfg(test)]
#[allow(unreachable_pub)]
#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;

    /// The scripts' label, at a given time instead of `TIME`.
    const LABEL_AT: &str = "return window_label(ARGV[1], tonumber(ARGV[2]))";

    /// The Lua port names every window as `SpendWindow::label` does:
    /// month and year ends, leap days (2000, 2024; not 2100), the epoch.
    #[tokio::test]
    async fn scripts_name_windows_as_spend_window_label() {
        let Some(server) = redis_server::RedisServer::start("spend window labels").await else {
            return;
        };
        let mut connection = crate::connect(&server.url()).expect("url");
        let script = script(LABEL_AT);
        let day = 86_400_u64;
        let mut times = vec![
            0,
            day - 1,
            day,
            951_782_399,   // 2000-02-28T23:59:59
            951_868_799,   // 2000-02-29T23:59:59
            951_868_800,   // 2000-03-01
            1_709_164_800, // 2024-02-29
            1_709_251_199, // 2024-02-29T23:59:59
            1_735_689_599, // 2024-12-31T23:59:59
            1_735_689_600, // 2025-01-01
            1_740_787_199, // 2025-02-28T23:59:59
            1_740_787_200, // 2025-03-01
            1_798_761_599, // 2026-12-31T23:59:59
            4_107_542_400, // 2100-03-01 (2100 is no leap year)
            4_107_542_399,
            253_402_300_799, // 9999-12-31T23:59:59
        ];
        // Every day's first and last second over four years, leap day in.
        let start = 1_704_067_200; // 2024-01-01
        times.extend((0..4 * 366).flat_map(|d| [start + d * day, start + d * day + day - 1]));
        for secs in times {
            let at = UNIX_EPOCH + Duration::from_secs(secs);
            for window in [SpendWindow::Day, SpendWindow::Month] {
                let label: String = script
                    .arg(kind(window))
                    .arg(secs)
                    .invoke_async(&mut connection)
                    .await
                    .expect("label");
                assert_eq!(label, window.label(at), "{window:?} at {secs}");
            }
        }
    }

    /// The stores' counters are named by Redis' clock: the key a reserve
    /// wrote is the one `SpendWindow::label` names now (this machine's
    /// clock and the local server's are one clock).
    #[tokio::test]
    async fn counters_carry_the_label_of_redis_time() {
        let Some(server) = redis_server::RedisServer::start("spend window keys").await else {
            return;
        };
        let connection = crate::connect(&server.url()).expect("url");
        let store = RedisSpendStore::new(connection.clone()).prefix("t");
        let before = SystemTime::now();
        for window in [SpendWindow::Day, SpendWindow::Month] {
            let reservation = store
                .reserve("acme", window, Cost::from_nanos(7), Cost::from_nanos(100))
                .await
                .expect("reserve");
            assert!(reservation.reserved);
        }
        let after = SystemTime::now();
        let mut connection = connection;
        for window in [SpendWindow::Day, SpendWindow::Month] {
            let mut labels = vec![window.label(before), window.label(after)];
            labels.dedup();
            let mut found = 0;
            for label in &labels {
                let value: Option<i64> = ::redis::cmd("GET")
                    .arg(format!("{{t:spend:acme}}:{label}"))
                    .query_async(&mut connection)
                    .await
                    .expect("GET");
                found += value.unwrap_or(0);
            }
            assert_eq!(found, 7, "{window:?}: {labels:?}");
            let check = store
                .check("acme", window, Cost::from_nanos(100))
                .await
                .expect("check");
            assert_eq!(check.spent, Cost::from_nanos(7));
        }
    }
}
