//! [`RedisSpendStore`]: tenant spend shared by every replica.

use std::time::SystemTime;

use ::redis::Script;
use ::redis::aio::ConnectionLike;

use super::{DEFAULT_PREFIX, is_unavailable, millis};
use crate::budget::{Cost, SpendCheck, SpendError, SpendFuture, SpendStore, SpendWindow};

/// Adds to the window's total, keeps it past the window's end, returns it.
const ADD: &str = r"
local total = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return total
";

/// A [`SpendStore`] on Redis: one counter per tenant and window,
/// `{<prefix>:spend:<tenant>}:<window>` (nano-USD), added to and read in
/// one script, kept a little past the window's end. A
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

fn spend_error(error: ::redis::RedisError) -> SpendError {
    if is_unavailable(&error) {
        SpendError::Unavailable(Box::new(error))
    } else {
        SpendError::Backend(Box::new(error))
    }
}
