//! [`RedisSentinelConnection`]: the stores on a Sentinel-managed primary.

use std::sync::{Arc, Mutex, PoisonError};

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use ::redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, TlsMode, Value};

use super::connect::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT, ensure_crypto_provider};

/// A connection to the primary that Redis Sentinel names, for any store.
///
/// The primary is asked of the sentinels on first use (and checked with
/// `ROLE`), then one multiplexed connection serves every clone. A reply
/// that says the server can no longer take writes (`READONLY`,
/// `MASTERDOWN`: it was demoted) or a connection error drops that
/// connection, so the next command asks the sentinels again and follows a
/// failover. The failing command itself is not resent (a timed-out script
/// may have run); the stores treat it as Redis being unreachable.
///
/// Asking the sentinels and connecting each take at most 1 s, and a reply
/// at most 1 s, as with [`connect`](super::connect).
#[derive(Clone)]
pub struct RedisSentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    /// Asks the sentinels; one asker at a time (it caches its connections
    /// to them).
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The primary's connection while it is believed to be the primary.
    primary: Mutex<Option<MultiplexedConnection>>,
    config: AsyncConnectionConfig,
}

impl std::fmt::Debug for RedisSentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSentinelConnection")
            .field("connected", &self.current().is_some())
            .finish_non_exhaustive()
    }
}

/// A connection through the sentinels at `sentinel_urls` to the primary of
/// `service` (the name in the sentinels' `sentinel monitor`). With
/// `rediss://` sentinel URLs the primary is reached with TLS as well,
/// trusting the platform's roots. For AUTH, a database or a private CA on
/// the primary, build a [`SentinelClient`] (redis-rs'
/// `SentinelClientBuilder`) and use [`RedisSentinelConnection::new`].
/// Connects lazily (on first use); nothing is asked of the sentinels here.
pub fn connect_sentinel<T: AsRef<str>>(
    sentinel_urls: &[T],
    service: &str,
) -> Result<RedisSentinelConnection, RedisError> {
    ensure_crypto_provider();
    let urls: Vec<&str> = sentinel_urls.iter().map(AsRef::as_ref).collect();
    let tls = urls.iter().any(|url| url.starts_with("rediss://"));
    let node = tls.then(|| SentinelNodeConnectionInfo::default().set_tls_mode(TlsMode::Secure));
    let client = SentinelClient::build(urls, service, node, SentinelServerType::Master)?;
    Ok(RedisSentinelConnection::new(client))
}

impl RedisSentinelConnection {
    /// A connection through `client`, which must ask for the
    /// [`Master`](SentinelServerType::Master): a store on a replica
    /// would have each write refused.
    pub fn new(client: SentinelClient) -> Self {
        ensure_crypto_provider();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        Self {
            shared: Arc::new(Shared {
                sentinel: tokio::sync::Mutex::new(client),
                primary: Mutex::new(None),
                config,
            }),
        }
    }

    fn current(&self) -> Option<MultiplexedConnection> {
        self.shared
            .primary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, connection: Option<MultiplexedConnection>) {
        *self
            .shared
            .primary
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = connection;
    }

    /// The primary's connection, asking the sentinels when there is none.
    async fn primary(&self) -> Result<MultiplexedConnection, RedisError> {
        if let Some(connection) = self.current() {
            return Ok(connection);
        }
        let mut sentinel = self.shared.sentinel.lock().await;
        // Another command may have found it while this one waited.
        if let Some(connection) = self.current() {
            return Ok(connection);
        }
        // Bounded: redis-rs puts no timeout on its questions to sentinels.
        let client = tokio::time::timeout(CONNECT_TIMEOUT, sentinel.async_get_client())
            .await
            .map_err(|_| timed_out("asking the sentinels for the primary"))??;
        drop(sentinel);
        let connection = tokio::time::timeout(
            CONNECT_TIMEOUT,
            client.get_multiplexed_async_connection_with_config(&self.shared.config),
        )
        .await
        .map_err(|_| timed_out("connecting to the primary"))??;
        self.set(Some(connection.clone()));
        Ok(connection)
    }

    /// Forgets the primary after an error that says it is gone or demoted.
    fn after<T>(&self, result: &Result<T, RedisError>) {
        if let Err(error) = result
            && (super::is_unavailable(error) || super::is_demoted(error))
        {
            self.set(None);
        }
    }
}

fn timed_out(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} took over {CONNECT_TIMEOUT:?}"),
    ))
}

impl ConnectionLike for RedisSentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut connection = self.primary().await?;
            let result = connection.req_packed_command(cmd).await;
            self.after(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut connection = self.primary().await?;
            let result = connection
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.after(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.current().map_or(0, |c| c.get_db())
    }
}
