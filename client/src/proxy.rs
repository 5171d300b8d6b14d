//! Egress through an HTTP CONNECT proxy: hyper-util's proxy matcher picks
//! the proxy for a destination (honouring `NO_PROXY`), and hyper-util's
//! [`Tunnel`] connector opens the tunnel. TLS to the upstream then runs
//! inside the tunnel, end to end.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use http::uri::{Authority, Scheme};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_service::Service;

use super::ClientError;
use tower_llm_failover::classify::{ConnectionCheck, FailedCheck, Note};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// hyper-util does not export its tunnel error type by name; its variants
/// are public and reachable through the connector's `Error`.
type TunnelError = <Tunnel<HttpConnector> as Service<Uri>>::Error;

/// Why the CONNECT tunnel through an egress proxy was not opened. The
/// request never reached the upstream: classified `connect`, before send.
///
/// The proxy is named by host and port only: credentials in a proxy URL
/// never appear in an error, a log or `Debug` output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The proxy itself could not be reached (refused, DNS, timeout).
    #[error("egress proxy {proxy} is unreachable")]
    Unreachable {
        /// The proxy's `host:port`.
        proxy: String,
        /// The connect error.
        #[source]
        source: BoxError,
    },
    /// The proxy answered the CONNECT with a status other than 200 (and
    /// other than 407).
    #[error("egress proxy {proxy} refused the CONNECT tunnel")]
    Refused {
        /// The proxy's `host:port`.
        proxy: String,
    },
    /// The proxy answered the CONNECT with 407: credentials missing or
    /// wrong.
    #[error("egress proxy {proxy} requires authorization (407)")]
    AuthRequired {
        /// The proxy's `host:port`.
        proxy: String,
    },
    /// The proxy closed the connection or sent something that is not an
    /// HTTP response while the tunnel was being opened.
    #[error("egress proxy {proxy} broke off the CONNECT tunnel ({reason})")]
    Broken {
        /// The proxy's `host:port`.
        proxy: String,
        /// What went wrong, in a few words.
        reason: &'static str,
        /// The io error, when there was one.
        #[source]
        source: Option<io::Error>,
    },
    /// The proxy URL (from the environment) is not an `http://` proxy;
    /// only HTTP CONNECT proxies reached over plain TCP are supported.
    #[error("egress proxy {proxy}: scheme {scheme} is not supported, only http:// CONNECT proxies")]
    UnsupportedScheme {
        /// The proxy's `host:port`.
        proxy: String,
        /// The proxy URL's scheme.
        scheme: String,
    },
}

impl ProxyError {
    /// The proxy's `host:port`.
    pub fn proxy(&self) -> &str {
        match self {
            Self::Unreachable { proxy, .. }
            | Self::Refused { proxy }
            | Self::AuthRequired { proxy }
            | Self::Broken { proxy, .. }
            | Self::UnsupportedScheme { proxy, .. } => proxy,
        }
    }

    fn from_tunnel(proxy: String, error: TunnelError) -> Self {
        match error {
            TunnelError::ConnectFailed(source) => Self::Unreachable { proxy, source },
            TunnelError::ProxyAuthRequired => Self::AuthRequired { proxy },
            TunnelError::TunnelUnsuccessful => Self::Refused { proxy },
            TunnelError::Io(source) => Self::Broken {
                proxy,
                reason: "io error",
                source: Some(source),
            },
            TunnelError::TunnelUnexpectedEof => Self::Broken {
                proxy,
                reason: "closed before answering",
                source: None,
            },
            TunnelError::ProxyHeadersTooLong => Self::Broken {
                proxy,
                reason: "response head too long",
                source: None,
            },
            TunnelError::MissingHost => Self::Broken {
                proxy,
                reason: "destination has no host",
                source: None,
            },
        }
    }
}

/// Where a client's egress proxy comes from.
#[derive(Clone, Default)]
pub(crate) enum ProxySetting {
    /// Connect directly.
    #[default]
    Direct,
    /// Every destination through this proxy, except those `no_proxy` lists.
    Url { url: String, no_proxy: String },
    /// `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` / `NO_PROXY` (and their
    /// lowercase forms), read when the client is built.
    Env,
}

impl ProxySetting {
    /// The matcher, or `None` to connect directly.
    pub(crate) fn matcher(&self) -> Result<Option<Arc<Matcher>>, ClientError> {
        match self {
            Self::Direct => Ok(None),
            Self::Env => Ok(Some(Arc::new(Matcher::from_env()))),
            Self::Url { url, no_proxy } => {
                validate_proxy_url(url)?;
                Ok(Some(Arc::new(
                    Matcher::builder()
                        .all(url.clone())
                        .no(no_proxy.clone())
                        .build(),
                )))
            }
        }
    }
}

impl fmt::Debug for ProxySetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Direct => f.write_str("Direct"),
            Self::Env => f.write_str("Env"),
            Self::Url { url, no_proxy } => f
                .debug_struct("Url")
                .field("proxy", &redacted_proxy(url))
                .field("no_proxy", no_proxy)
                .finish(),
        }
    }
}

/// `http://host:port` with an optional `user:password@`; nothing else.
fn validate_proxy_url(url: &str) -> Result<(), ClientError> {
    let uri: Uri = url
        .parse()
        .map_err(|_| ClientError::InvalidProxyUrl("does not parse as a URL".to_owned()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => return Err(ClientError::UnsupportedProxyScheme(other.to_owned())),
        None => {
            return Err(ClientError::InvalidProxyUrl(
                "needs a scheme: http://host:port".to_owned(),
            ));
        }
    }
    let host = uri.authority().map(host_port).unwrap_or_default();
    if host.is_empty() || host.starts_with(':') {
        return Err(ClientError::InvalidProxyUrl("has no host".to_owned()));
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(ClientError::InvalidProxyUrl(
            "must not have a path".to_owned(),
        ));
    }
    Ok(())
}

/// `host:port` of an authority, without `user:password@`.
fn host_port(authority: &Authority) -> &str {
    let text = authority.as_str();
    text.rsplit_once('@').map_or(text, |(_, host)| host)
}

/// The proxy URL for logs: scheme and `host:port` only.
pub(crate) fn redacted_proxy(url: &str) -> String {
    match url.parse::<Uri>() {
        Ok(uri) => format!(
            "{}://{}",
            uri.scheme_str().unwrap_or("http"),
            uri.authority().map(host_port).unwrap_or_default()
        ),
        Err(_) => "<invalid proxy URL>".to_owned(),
    }
}

/// The TCP connector under TLS: direct, or through a CONNECT tunnel when
/// the proxy matcher intercepts the destination.
#[derive(Clone)]
pub(crate) struct UpstreamConnector {
    http: HttpConnector,
    proxy: Option<Arc<Matcher>>,
}

impl UpstreamConnector {
    pub(crate) fn new(http: HttpConnector, proxy: Option<Arc<Matcher>>) -> Self {
        Self { http, proxy }
    }
}

impl fmt::Debug for UpstreamConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Matcher's Debug keeps credentials out; say only whether one is set.
        f.debug_struct("UpstreamConnector")
            .field("proxied", &self.proxy.is_some())
            .finish_non_exhaustive()
    }
}

/// The connector's future.
pub(crate) type Connecting =
    Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, BoxError>> + Send>>;

impl Service<Uri> for UpstreamConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let Some(intercept) = self.proxy.as_deref().and_then(|m| m.intercept(&dst)) else {
            let connecting = self.http.call(dst);
            return Box::pin(async move { connecting.await.map_err(Into::into) });
        };
        let proxy_uri = intercept.uri().clone();
        let proxy = proxy_uri
            .authority()
            .map(host_port)
            .unwrap_or_default()
            .to_owned();
        if proxy_uri.scheme() != Some(&Scheme::HTTP) {
            let scheme = proxy_uri.scheme_str().unwrap_or_default().to_owned();
            return Box::pin(async move {
                Err(FailedCheck::new(ProxyError::UnsupportedScheme { proxy, scheme }).into())
            });
        }
        let mut tunnel = Tunnel::new(proxy_uri, self.http.clone());
        if let Some(auth) = intercept.basic_auth() {
            // Marked sensitive by Tunnel; sent only in the CONNECT head.
            tunnel = tunnel.with_auth(auth.clone());
        }
        let dst = with_explicit_port(dst);
        Box::pin(async move {
            tunnel
                .call(dst)
                .await
                .map_err(|e| FailedCheck::new(ProxyError::from_tunnel(proxy, e)).into())
        })
    }
}

impl ConnectionCheck for ProxyError {
    fn note(&self) -> Note {
        self.check().0
    }

    fn what(&self) -> &'static str {
        self.check().1
    }
}

impl ProxyError {
    fn check(&self) -> (Note, &'static str) {
        use ProxyError as P;
        match self {
            P::Unreachable { .. } => (Note::ProxyUnreachable, "egress proxy: cannot connect to it"),
            P::Refused { .. } => (
                Note::ProxyRefused,
                "egress proxy: it refused to open a tunnel to the upstream",
            ),
            P::AuthRequired { .. } => (
                Note::ProxyAuthRequired,
                "egress proxy: it wants credentials (407)",
            ),
            P::UnsupportedScheme { .. } => (
                Note::ProxyUnsupported,
                "egress proxy: only http:// CONNECT proxies are supported",
            ),
            _ => (
                Note::ProxyFailed,
                "egress proxy: the CONNECT tunnel broke off",
            ),
        }
    }
}

/// hyper-util's tunnel assumes port 443 when the URI names none; an
/// `http://` destination means 80.
fn with_explicit_port(dst: Uri) -> Uri {
    if dst.port().is_some() {
        return dst;
    }
    let port = if dst.scheme() == Some(&Scheme::HTTP) {
        80
    } else {
        443
    };
    let Some(host) = dst.host() else {
        return dst;
    };
    let authority = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut parts = dst.clone().into_parts();
    match authority.parse() {
        Ok(authority) => {
            parts.authority = Some(authority);
            Uri::from_parts(parts).unwrap_or(dst)
        }
        Err(_) => dst,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_destination_without_a_port_tunnels_to_80() {
        let uri = with_explicit_port("http://api.example/v1".parse().unwrap());
        assert_eq!(uri.port_u16(), Some(80));
        let uri = with_explicit_port("https://api.example/v1".parse().unwrap());
        assert_eq!(uri.port_u16(), Some(443));
        let uri = with_explicit_port("http://api.example:8080/v1".parse().unwrap());
        assert_eq!(uri.port_u16(), Some(8080));
    }

    #[test]
    fn proxy_urls_are_checked_and_never_shown_with_credentials() {
        assert!(validate_proxy_url("http://proxy.internal:3128").is_ok());
        assert!(validate_proxy_url("http://user:pw@proxy.internal:3128").is_ok());
        assert!(matches!(
            validate_proxy_url("socks5://proxy:1080"),
            Err(ClientError::UnsupportedProxyScheme(s)) if s == "socks5"
        ));
        assert!(matches!(
            validate_proxy_url("https://proxy:443"),
            Err(ClientError::UnsupportedProxyScheme(_))
        ));
        assert!(validate_proxy_url("proxy:3128").is_err());
        assert!(validate_proxy_url("http://proxy:3128/path").is_err());
        let error = validate_proxy_url("http://user:SECRET@:3128").unwrap_err();
        assert!(!error.to_string().contains("SECRET"), "{error}");

        let setting = ProxySetting::Url {
            url: "http://user:SECRET@proxy.internal:3128".to_owned(),
            no_proxy: "localhost".to_owned(),
        };
        let text = format!("{setting:?}");
        assert!(!text.contains("SECRET"), "{text}");
        assert!(text.contains("proxy.internal:3128"), "{text}");
    }

    #[test]
    fn no_proxy_destinations_bypass_the_proxy() {
        let matcher = ProxySetting::Url {
            url: "http://proxy.internal:3128".to_owned(),
            no_proxy: "internal.example, 10.0.0.0/8".to_owned(),
        }
        .matcher()
        .unwrap()
        .unwrap();
        let through = |uri: &str| matcher.intercept(&uri.parse().unwrap()).is_some();
        assert!(through("https://api.openai.com/v1"));
        assert!(through("http://api.openai.com/v1"));
        assert!(!through("https://llm.internal.example/v1"));
        assert!(!through("http://10.1.2.3:8000/v1"));
    }
}
