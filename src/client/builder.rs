//! `UpstreamClientBuilder`: base URL, credential and connection settings.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderName;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::service::Shared;
use super::target::Target;
use super::{
    Auth, ClientError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_IDLE_TIMEOUT, DEFAULT_STRIP_PREFIX,
    UpstreamClient,
};

/// Builds an [`UpstreamClient`]; start with [`UpstreamClient::builder`].
#[derive(Clone)]
pub struct UpstreamClientBuilder {
    base_url: String,
    auth: Auth,
    connect_timeout: Option<Duration>,
    pool_idle_timeout: Option<Duration>,
    pool_max_idle_per_host: usize,
    strip_prefix: Option<String>,
    strip_headers: Vec<HeaderName>,
    http2: bool,
}

impl UpstreamClientBuilder {
    pub(crate) fn new(base_url: String) -> Self {
        Self {
            base_url,
            auth: Auth::None,
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
            pool_idle_timeout: Some(DEFAULT_POOL_IDLE_TIMEOUT),
            pool_max_idle_per_host: usize::MAX,
            strip_prefix: Some(DEFAULT_STRIP_PREFIX.to_owned()),
            strip_headers: Vec::new(),
            http2: true,
        }
    }

    /// The target's credential (default [`Auth::None`]).
    pub fn auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    /// How long a TCP connect may take; `None` waits for the OS (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]). A timeout surfaces as a connect error:
    /// the request was never sent.
    pub fn connect_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.connect_timeout = timeout.into();
        self
    }

    /// How long an idle pooled connection is kept; `None` keeps it until the
    /// server closes it (default [`DEFAULT_POOL_IDLE_TIMEOUT`]).
    pub fn pool_idle_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.pool_idle_timeout = timeout.into();
        self
    }

    /// The most idle connections kept per host (default unlimited).
    pub fn pool_max_idle_per_host(mut self, max: usize) -> Self {
        self.pool_max_idle_per_host = max;
        self
    }

    /// The gateway-side path prefix replaced by the base URL's path
    /// (default [`DEFAULT_STRIP_PREFIX`], `/v1`). See [the join
    /// rule](super#the-url-join-rule).
    pub fn strip_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.strip_prefix = Some(prefix.into());
        self
    }

    /// Appends the whole request path to the base URL's path.
    pub fn keep_prefix(mut self) -> Self {
        self.strip_prefix = None;
        self
    }

    /// One more client header never forwarded, on top of the hop-by-hop
    /// headers and the built-in credential list.
    pub fn strip_header(mut self, name: HeaderName) -> Self {
        self.strip_headers.push(name);
        self
    }

    /// Whether HTTP/2 is offered by ALPN on https (default on). Plain http
    /// always speaks HTTP/1.1.
    pub fn http2(mut self, enabled: bool) -> Self {
        self.http2 = enabled;
        self
    }

    /// Builds the client. Needs no runtime; requests need Tokio.
    pub fn build(self) -> Result<UpstreamClient, ClientError> {
        let target = Target::parse(&self.base_url, self.strip_prefix.as_deref())?;
        let credential = self.auth.to_header()?;
        let connector = self.connector()?;

        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(self.pool_idle_timeout)
            .pool_max_idle_per_host(self.pool_max_idle_per_host)
            .build(connector);

        Ok(UpstreamClient::from_parts(
            client,
            Arc::new(Shared {
                target,
                credential,
                auth_kind: self.auth.kind(),
                strip_headers: self.strip_headers.into_boxed_slice(),
            }),
        ))
    }
}

impl UpstreamClientBuilder {
    /// The connector `build` uses: TCP_NODELAY, the connect timeout, rustls.
    fn connector(&self) -> Result<HttpsConnector<HttpConnector>, ClientError> {
        let mut http = HttpConnector::new();
        // Streams are many small writes: without this, Nagle's algorithm and
        // delayed ACKs hold each stream's tail for ~40 ms.
        http.set_nodelay(true);
        http.enforce_http(false);
        http.set_connect_timeout(self.connect_timeout);
        https_connector(http, self.http2)
    }
}

/// rustls with the ring provider picked explicitly (the process default
/// panics when another crate in the build also enables aws-lc-rs) and the
/// webpki roots compiled in, built once per process.
fn tls_config() -> Result<rustls::ClientConfig, ClientError> {
    static CONFIG: OnceLock<Result<rustls::ClientConfig, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            use hyper_rustls::ConfigBuilderExt as _;
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map(|b| b.with_webpki_roots().with_no_client_auth())
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(ClientError::Tls)
}

fn https_connector(
    http: HttpConnector,
    http2: bool,
) -> Result<HttpsConnector<HttpConnector>, ClientError> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config()?)
        .https_or_http();
    Ok(if http2 {
        builder.enable_all_versions().wrap_connector(http)
    } else {
        builder.enable_http1().wrap_connector(http)
    })
}

impl fmt::Debug for UpstreamClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The base URL's query may carry a key.
        let base = self.base_url.split('?').next().unwrap_or_default();
        f.debug_struct("UpstreamClientBuilder")
            .field("base_url", &base)
            .field("auth", &self.auth)
            .field("connect_timeout", &self.connect_timeout)
            .field("pool_idle_timeout", &self.pool_idle_timeout)
            .field("pool_max_idle_per_host", &self.pool_max_idle_per_host)
            .field("strip_prefix", &self.strip_prefix)
            .field("strip_headers", &self.strip_headers)
            .field("http2", &self.http2)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_rustls::MaybeHttpsStream;
    use tower_service::Service as _;

    #[tokio::test]
    async fn client_sockets_set_tcp_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let builder = UpstreamClient::builder(format!("http://127.0.0.1:{port}/v1"));
        let mut connector = builder.connector().unwrap();
        let uri: http::Uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
        let (stream, accepted) = tokio::join!(connector.call(uri), listener.accept());
        let (_server_side, _) = accepted.unwrap();
        match stream.unwrap() {
            MaybeHttpsStream::Http(io) => assert!(io.inner().nodelay().unwrap()),
            MaybeHttpsStream::Https(_) => panic!("plain http base URL went through TLS"),
        }
    }

    #[test]
    fn tls_config_builds_offline_and_is_shared() {
        let a = tls_config().unwrap();
        let b = tls_config().unwrap();
        assert_eq!(a.alpn_protocols, b.alpn_protocols);
        assert!(
            UpstreamClient::builder("https://api.openai.com/v1")
                .http2(false)
                .build()
                .is_ok()
        );
    }
}
