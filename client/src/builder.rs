//! `UpstreamClientBuilder`: base URL, credential and connection settings.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::endpoint::Endpoint;
use super::io::CompactConnector;
use super::pool::Http1Pool;
use super::proxy::{ProxySetting, UpstreamConnector};
use super::service::Shared;
use super::tls::TlsOptions;
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
    tls: TlsOptions,
    proxy: ProxySetting,
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
            tls: TlsOptions::default(),
            proxy: ProxySetting::Direct,
        }
    }

    /// The target's credential (default [`Auth::None`]).
    pub fn auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    /// How long a TCP connect may take; `None` waits for the OS (default
    /// `DEFAULT_CONNECT_TIMEOUT`). A timeout surfaces as a connect error:
    /// the request was never sent.
    pub fn connect_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.connect_timeout = timeout.into();
        self
    }

    /// How long an idle pooled connection is kept; `None` keeps it until the
    /// server closes it (default `DEFAULT_POOL_IDLE_TIMEOUT`).
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
    /// (default `DEFAULT_STRIP_PREFIX`, `/v1`). See [the join
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

    /// Adds the CA certificates of a PEM bundle to the trusted roots (a
    /// private CA for an internal model server). Repeatable. The file is
    /// read by [`build`](Self::build); to trust *only* these CAs, also turn
    /// off [`webpki_roots`](Self::webpki_roots).
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.ca_files.push(path.into());
        self
    }

    /// Whether the Mozilla roots compiled into the crate (webpki-roots) are
    /// trusted (default on).
    pub fn webpki_roots(mut self, enabled: bool) -> Self {
        self.tls.webpki_roots = enabled;
        self
    }

    /// Whether the platform's trust store is trusted too (default off).
    /// Read by [`build`](Self::build) through rustls-native-certs, which
    /// honours `SSL_CERT_FILE` and `SSL_CERT_DIR`; a store with no usable
    /// certificate is [`ClientError::NativeRoots`].
    pub fn native_roots(mut self, enabled: bool) -> Self {
        self.tls.native_roots = enabled;
        self
    }

    /// Presents a client certificate (mTLS): a PEM certificate chain (leaf
    /// first) and its PEM private key (PKCS#8, PKCS#1 or SEC1). Both files
    /// are read by [`build`](Self::build); their contents never appear in
    /// an error.
    pub fn client_cert_files(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.tls.client_identity = Some((cert_file.into(), key_file.into()));
        self
    }

    /// Sends every request through the HTTP CONNECT proxy at `url`
    /// (`http://host:port`, optionally `http://user:password@host:port`,
    /// sent as `Proxy-Authorization: Basic` on the CONNECT only and never
    /// logged). Both http and https targets are tunnelled; TLS runs inside
    /// the tunnel, end to end with the upstream.
    pub fn proxy(mut self, url: impl Into<String>) -> Self {
        let no_proxy = match &mut self.proxy {
            ProxySetting::Url { no_proxy, .. } => std::mem::take(no_proxy),
            _ => String::new(),
        };
        self.proxy = ProxySetting::Url {
            url: url.into(),
            no_proxy,
        };
        self
    }

    /// Hosts that bypass the [`proxy`](Self::proxy), in the `NO_PROXY`
    /// syntax: comma-separated host names (matching subdomains too), IP
    /// addresses, CIDR blocks, or `*`. Call after `proxy`.
    pub fn no_proxy(mut self, list: impl Into<String>) -> Self {
        if let ProxySetting::Url { no_proxy, .. } = &mut self.proxy {
            *no_proxy = list.into();
        }
        self
    }

    /// Takes the proxy from the environment as curl does: `HTTPS_PROXY`
    /// for https targets, `HTTP_PROXY` for http ones, `ALL_PROXY` for
    /// both, `NO_PROXY` for exceptions (lowercase forms too), read by
    /// [`build`](Self::build). Replaces [`proxy`](Self::proxy). Without
    /// this call the environment is ignored.
    pub fn proxy_from_env(mut self) -> Self {
        self.proxy = ProxySetting::Env;
        self
    }

    /// Builds the client: reads the CA and client certificate files and
    /// checks the proxy URL. Needs no runtime; requests need Tokio.
    pub fn build(self) -> Result<UpstreamClient, ClientError> {
        let target = Endpoint::parse(&self.base_url, self.strip_prefix.as_deref())?;
        let credential = self.auth.to_header()?;
        let proxy = self.proxy.matcher()?;
        let connector = self.connector(proxy.clone())?;
        // A plain-`http` target reached directly is pooled by the client
        // itself (see `pool`); the rest by hyper-util.
        let pool = target
            .plain_origin()
            .filter(|_| proxy.is_none())
            .map(|origin| {
                Http1Pool::new(
                    connector.clone(),
                    origin,
                    self.pool_max_idle_per_host,
                    self.pool_idle_timeout,
                )
            });

        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(self.pool_idle_timeout)
            .pool_max_idle_per_host(self.pool_max_idle_per_host)
            .build(connector);

        Ok(UpstreamClient::from_parts(
            client,
            pool,
            Shared {
                host: target.host_header(),
                target,
                credential,
                auth_kind: self.auth.kind(),
                strip_headers: self.strip_headers.into_boxed_slice(),
            },
        ))
    }
}

impl UpstreamClientBuilder {
    /// The connector `build` uses: TCP_NODELAY, the connect timeout, the
    /// proxy tunnel when one applies, rustls with the trust options.
    fn connector(&self, proxy: Option<Arc<Matcher>>) -> Result<CompactConnector, ClientError> {
        let mut http = HttpConnector::new();
        // Streams are many small writes: without this, Nagle's algorithm and
        // delayed ACKs hold each stream's tail for ~40 ms.
        http.set_nodelay(true);
        http.enforce_http(false);
        http.set_connect_timeout(self.connect_timeout);
        let tcp = UpstreamConnector::new(http, proxy);
        let builder = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(self.tls.client_config()?)
            .https_or_http();
        // ALPN offers h2 then http/1.1: a server without HTTP/2 gets 1.1.
        Ok(CompactConnector(if self.http2 {
            builder.enable_all_versions().wrap_connector(tcp)
        } else {
            builder.enable_http1().wrap_connector(tcp)
        }))
    }
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
            .field("tls", &self.tls)
            .field("proxy", &self.proxy)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::UpstreamIo;
    use tower_service::Service as _;

    #[tokio::test]
    async fn client_sockets_set_tcp_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let builder = UpstreamClient::builder(format!("http://127.0.0.1:{port}/v1"));
        let mut connector = builder.connector(None).unwrap();
        let uri: http::Uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
        let (stream, accepted) = tokio::join!(connector.call(uri), listener.accept());
        let (_server_side, _) = accepted.unwrap();
        match stream.unwrap() {
            UpstreamIo::Plain(io) => assert!(io.inner().nodelay().unwrap()),
            UpstreamIo::Tls(_) => panic!("plain http base URL went through TLS"),
        }
    }

    #[test]
    fn tls_config_builds_offline() {
        assert!(
            UpstreamClient::builder("https://api.openai.com/v1")
                .http2(false)
                .build()
                .is_ok()
        );
    }
}
