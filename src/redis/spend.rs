//! [`RedisSpendStore`]: tenant spend shared by every replica.

use std::time::SystemTime;

use ::redis::Script;
use ::redis::aio::ConnectionLike;

use super::{DEFAULT_PREFIX, is_unavailable, millis};
use crate::budget::{
    Cost, Reservation, SpendCheck, SpendError, SpendFuture, SpendStore, SpendWindow, settle_delta,
};

/// Adds to the window's total, keeps it past the window's end, returns it.
const ADD: &str = r"
local total = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return total
";

/// Adds the amount only while the window's total is below the ceiling (a
/// refusal, or a zero amount, writes nothing); returns `{reserved, total}`.
const RESERVE: &str = r"
local total = tonumber(redis.call('GET', KEYS[1]) or '0')
if total >= tonumber(ARGV[2]) then
  return {0, total}
end
if tonumber(ARGV[1]) > 0 then
  total = redis.call('INCRBY', KEYS[1], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return {1, total}
";

/// Adds a signed settlement, never leaving the total below zero.
const SETTLE: &str = r"
if tonumber(ARGV[1]) == 0 then
  return tonumber(redis.call('GET', KEYS[1]) or '0')
end
local total = redis.call('INCRBY', KEYS[1], ARGV[1])
if total < 0 then
  redis.call('SET', KEYS[1], 0)
  total = 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return total
";

/// A [`SpendStore`] on Redis: one counter per tenant and window,
/// `{<prefix>:spend:<tenant>}:<window>` (nano-USD), added to and read in
/// one script, kept a little past the window's end. A
/// [`reserve`](SpendStore::reserve) reads, compares and adds in one script,
/// so replicas reserving at once never all pass a nearly spent ceiling; a
/// [`settle`](SpendStore::settle) adds a signed amount in one script. A
/// [`check`](SpendStore::check) (what [`TenantSpend::admit`] does) is a
/// plain `GET`: a tenant that never spent creates no key. The window is
/// named from this replica's clock (UTC), so replicas whose clocks agree
/// to the second share it.
///
/// [`TenantSpend::admit`]: crate::budget::TenantSpend::admit
#[derive(Debug, Clone)]
pub struct RedisSpendStore<C> {
    connection: C,
    prefix: String,
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
            let key = self.key(tenant, window);
            // INCRBY takes a signed 64-bit amount.
            let amount = i64::try_from(amount.as_nanos()).unwrap_or(i64::MAX);
            let mut connection = self.connection.clone();
            let total: i64 = Script::new(ADD)
                .key(key)
                .arg(amount)
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
            let (reserved, total): (i64, i64) = Script::new(RESERVE)
                .key(self.key(tenant, window))
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
            let total: i64 = Script::new(SETTLE)
                .key(self.key(tenant, window))
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
            let total: Option<i64> = ::redis::cmd("GET")
                .arg(self.key(tenant, window))
                .query_async(&mut connection)
                .await
                .map_err(spend_error)?;
            let spent = Cost::from_nanos(total.and_then(|t| u64::try_from(t).ok()).unwrap_or(0));
            Ok(SpendCheck::new(spent, ceiling))
        })
    }
}

impl<C> RedisSpendStore<C> {
    /// The counter of `tenant`'s current `window`.
    fn key(&self, tenant: &str, window: SpendWindow) -> String {
        format!(
            "{{{}:spend:{tenant}}}:{}",
            self.prefix,
            window.label(SystemTime::now())
        )
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
