//! Connecting the stores to Redis: one server (`redis://`, `rediss://`),
//! a cluster (feature `cluster`), or a Sentinel-managed primary
//! ([`super::RedisSentinelConnection`]).

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, RedisError, TlsCertificates};

/// How long connecting, and waiting for one reply, may take: a Redis
/// outage turns into quick, typed errors instead of stalled requests.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// A [`ConnectionManager`] with settings fit for a request path: commands
/// time out after 1 s and connecting after 1 s, and reconnection retries
/// back off from 50 ms to 1 s, so a Redis outage turns into quick, typed
/// errors instead of stalled requests. It connects lazily (on first use),
/// so a gateway starts while Redis is down; call it inside a Tokio runtime.
///
/// `rediss://host:port` connects with TLS (rustls), trusting the
/// platform's roots; to trust a private CA or present a client
/// certificate, use [`connect_tls`]. The `#insecure` fragment (no
/// certificate check) is refused: this crate does not build redis-rs'
/// `tls-rustls-insecure`.
pub fn connect(url: &str) -> Result<ConnectionManager, RedisError> {
    ensure_crypto_provider();
    manager(checked(Client::open(url)?)?)
}

/// [`connect`] for a `rediss://` URL with the given trust and client
/// identity: `root_cert` (PEM) replaces the platform's roots, `client_tls`
/// (PEM certificate chain and key) is presented to a server that asks for
/// one. A `redis://` URL is refused, so a TLS setting is never dropped
/// silently.
pub fn connect_tls(url: &str, tls: TlsCertificates) -> Result<ConnectionManager, RedisError> {
    ensure_crypto_provider();
    manager(checked(Client::build_with_tls(url, tls)?)?)
}

/// Refuses `rediss://…#insecure` now: redis-rs would only fail on each
/// connection attempt, a configuration error found request by request.
fn checked(client: Client) -> Result<Client, RedisError> {
    if let ::redis::ConnectionAddr::TcpTls { insecure: true, .. } =
        client.get_connection_info().addr()
    {
        return Err(RedisError::from((
            ::redis::ErrorKind::InvalidClientConfig,
            "rediss://…#insecure (no certificate check) is not supported; trust the server's CA with connect_tls",
        )));
    }
    Ok(client)
}

fn manager(client: Client) -> Result<ConnectionManager, RedisError> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(1))
        .set_number_of_retries(3);
    ConnectionManager::new_lazy_with_config(client, config)
}

/// A connection to a Redis Cluster, for any store: `urls` name some of its
/// nodes (`redis://` or `rediss://`, all alike), the rest is discovered.
/// Each store's keys share a hash tag, so each script runs on one node;
/// `MOVED` and `ASK` redirections and slot refreshes are handled by
/// redis-rs. Connects lazily (on first use), with the timeouts of
/// [`connect`]; call it inside a Tokio runtime. `tls` (for `rediss://`)
/// replaces the platform's roots and adds a client identity, as in
/// [`connect_tls`].
#[cfg(feature = "cluster")]
pub fn connect_cluster<T: AsRef<str>>(
    urls: &[T],
    tls: Option<TlsCertificates>,
) -> Result<RedisClusterConnection, RedisError> {
    ensure_crypto_provider();
    if urls.is_empty() {
        return Err(RedisError::from((
            ::redis::ErrorKind::InvalidClientConfig,
            "a Redis Cluster needs at least one node URL",
        )));
    }
    let mut builder = ::redis::cluster::ClusterClientBuilder::new(urls.iter().map(AsRef::as_ref))
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        .retries(3);
    if let Some(tls) = tls {
        builder = builder.certs(tls);
    }
    let client = builder.build()?;
    let config = ::redis::cluster::ClusterConfig::new()
        .set_connection_timeout(CONNECT_TIMEOUT)
        .set_response_timeout(RESPONSE_TIMEOUT);
    Ok(RedisClusterConnection(
        client.get_pending_async_connection_with_config(config),
    ))
}

/// A Redis Cluster connection ([`connect_cluster`]): redis-rs'
/// [`ClusterConnection`](::redis::cluster_async::ClusterConnection), with
/// the `Debug` every store needs (the spend, action and rate-limit store
/// traits require it; redis-rs' type has none). Clones share the
/// connections to the nodes.
#[cfg(feature = "cluster")]
#[derive(Clone)]
pub struct RedisClusterConnection(pub ::redis::cluster_async::ClusterConnection);

#[cfg(feature = "cluster")]
impl std::fmt::Debug for RedisClusterConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisClusterConnection")
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "cluster")]
impl ::redis::aio::ConnectionLike for RedisClusterConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, ::redis::Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

/// redis-rs builds its rustls configuration from the process-wide default
/// crypto provider (it takes no provider of its own), and rustls picks
/// one only when exactly one is compiled in. This crate uses ring: install
/// it unless the application already installed a provider, so a
/// dependency that also enables aws-lc-rs cannot make TLS panic.
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one meanwhile, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
