//! `UpstreamClient`: the Tower service that sends a request to one target.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_llm_failover::classify::Note;

use super::body::ResponseBody;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::uri::Authority;
use http::{Request, Response, Version};
use http_body::Body;
use http_body_util::BodyExt as _;
use http_body_util::Full;
use http_body_util::combinators::UnsyncBoxBody;
use hyper_util::client::legacy::Client;
use tower_service::Service;

use super::endpoint::Endpoint;
use super::io::CompactConnector;
use super::pool::Http1Pool;
use super::{ResponseFuture, SendError, UpstreamClientBuilder, headers};
use tower_llm_failover::{FailureClass, Phase, classify::Classification, classify::UpstreamError};

use tower_llm_failover::BoxError;

/// The request body the pooled hyper client is typed on: any caller body,
/// boxed once per request.
pub(crate) type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

/// What every clone shares.
pub(crate) struct Shared {
    pub(crate) target: Endpoint,
    pub(crate) credential: Option<(HeaderName, HeaderValue)>,
    /// The `host` header, made once (see [`Endpoint::host_header`]).
    pub(crate) host: Option<HeaderValue>,
    pub(crate) auth_kind: &'static str,
    pub(crate) strip_headers: Box<[HeaderName]>,
}

/// A Tower service sending requests to one upstream: base URL, credential,
/// a pooled hyper-util client over rustls (a plain-`http` target: HTTP/1.1
/// connections pooled by the client itself).
///
/// - `Request<Full<Bytes>>`, the one body type the failover layer sends
///   (one concrete type, so `ServiceExt` combinators infer);
/// - `Response = http::Response<hyper::body::Incoming>`, the upstream's own
///   body, unread;
/// - `Error = `[`SendError`], whose `source()` is hyper-util's error (or,
///   for a plain-`http` target, hyper's or the connect error).
///
/// Cloning is cheap (one reference count: the failover layer clones a
/// target's service for every attempt) and clones share the connection
/// pool. See the [module docs](super) for the URL join rule and the header
/// rules.
#[derive(Clone)]
pub struct UpstreamClient {
    inner: Arc<Inner>,
}

/// What an [`UpstreamClient`] and its clones hold, behind one `Arc`:
/// hyper-util's client alone is half a dozen of them.
struct Inner {
    client: Client<CompactConnector, UpstreamBody>,
    /// A plain-`http` target reached directly: its own pool
    /// ([`Http1Pool`](super::pool::Http1Pool)), not hyper-util's.
    pool: Option<Arc<Http1Pool>>,
    shared: Shared,
}

impl UpstreamClient {
    /// Starts a builder for `base_url`, the URL an OpenAI SDK would take as
    /// its `base_url` (`https://api.openai.com/v1`,
    /// `http://127.0.0.1:9101/v1`).
    pub fn builder(base_url: impl Into<String>) -> UpstreamClientBuilder {
        UpstreamClientBuilder::new(base_url.into())
    }

    pub(crate) fn from_parts(
        client: Client<CompactConnector, UpstreamBody>,
        pool: Option<Arc<Http1Pool>>,
        shared: Shared,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                pool,
                shared,
            }),
        }
    }

    /// The target's host and port, for logs.
    pub fn authority(&self) -> &Authority {
        self.inner.shared.target.authority()
    }

    /// Rewrites a gateway request into the upstream request this client
    /// sends: joined URI, HTTP/1.1 (HTTP/2 when ALPN picks it), headers
    /// cleaned and the target's credential set. [`call`](Service::call) does
    /// this itself; it is public for pass-through proxies and tests.
    pub(crate) fn prepare<B>(&self, request: Request<B>) -> Result<Request<B>, SendError>
    where
        B: Body,
    {
        let (mut parts, body) = request.into_parts();
        parts.uri = self
            .inner
            .shared
            .target
            .join(parts.uri.path_and_query())
            .map_err(|e| {
                SendError::InvalidRequest(Box::new(UpstreamError::new(
                    Classification::new(FailureClass::InvalidRequest, Phase::BeforeSend)
                        .with_message(format!("cannot build the upstream URI: {e}"))
                        .with_note(Note::InvalidUpstreamUri),
                )))
            })?;
        // hyper-util refuses an HTTP/2 request on an HTTP/1 connection; the
        // version the client spoke to the gateway says nothing about ours.
        parts.version = Version::HTTP_11;
        headers::prepare(
            &mut parts.headers,
            &self.inner.shared.strip_headers,
            self.inner.shared.credential.as_ref(),
            self.inner.shared.host.as_ref(),
            body.size_hint().exact(),
        );
        Ok(Request::from_parts(parts, body))
    }
}

/// One concrete request body type (the one [`Failover`] sends), so
/// `ServiceExt` combinators over the client infer their types.
///
/// [`Failover`]: tower_llm_failover::failover::Failover
impl Service<Request<Full<Bytes>>> for UpstreamClient {
    type Response = Response<ResponseBody>;
    type Error = SendError;
    type Future = ResponseFuture;

    /// Always ready: the pool (the client's own, or hyper-util's) opens or
    /// reuses a connection inside the response future, so there is no capacity to
    /// wait for here (connect errors surface from the future). Put a
    /// `ConcurrencyLimitLayer` in front to bound in-flight requests.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        match self.prepare(request) {
            Ok(request) => {
                let request =
                    request.map(|body| body.map_err(|never| match never {}).boxed_unsync());
                match &self.inner.pool {
                    Some(pool) => {
                        // Written into its box, not built on the stack and
                        // copied in (`Box::pin`).
                        let send = Box::write(
                            Box::new_uninit(),
                            super::pool::send(Arc::clone(pool), request),
                        );
                        ResponseFuture::pooled(Box::into_pin(send))
                    }
                    None => ResponseFuture::sent(self.inner.client.request(request)),
                }
            }
            Err(error) => ResponseFuture::rejected(error),
        }
    }
}

impl fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamClient")
            .field("target", &self.inner.shared.target)
            .field("auth", &self.inner.shared.auth_kind)
            .field("strip_headers", &self.inner.shared.strip_headers)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Auth;
    use http_body_util::Full;

    #[test]
    fn prepare_joins_and_replaces_the_credential() {
        let client = UpstreamClient::builder("http://127.0.0.1:9/v1")
            .auth(Auth::bearer("sk-target"))
            .build()
            .unwrap();
        let request = Request::builder()
            .uri("/v1/chat/completions?x=1")
            .version(Version::HTTP_2)
            .header("authorization", "Bearer sk-client")
            .header("host", "gateway")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let out = client.prepare(request).unwrap();
        assert_eq!(
            out.uri().to_string(),
            "http://127.0.0.1:9/v1/chat/completions?x=1"
        );
        assert_eq!(out.version(), Version::HTTP_11);
        assert_eq!(out.headers()["authorization"], "Bearer sk-target");
        // The upstream's host, made once, not the client's.
        assert_eq!(out.headers()["host"], "127.0.0.1:9");
        assert_eq!(out.headers().get_all("host").iter().count(), 1);
    }

    /// The failover layer clones a target's service for every attempt:
    /// one reference count, whatever the client holds.
    #[test]
    fn a_clone_shares_everything_through_one_reference_count() {
        for base in ["http://127.0.0.1:9/v1", "https://upstream.local/v1"] {
            let client = UpstreamClient::builder(base).build().unwrap();
            let clone = client.clone();
            assert!(Arc::ptr_eq(&client.inner, &clone.inner));
            assert_eq!(Arc::strong_count(&client.inner), 2);
        }
    }

    #[test]
    fn the_host_header_is_made_once_for_plain_http_only() {
        let host = |base: &str| {
            UpstreamClient::builder(base)
                .build()
                .unwrap()
                .inner
                .shared
                .host
                .clone()
        };
        assert_eq!(host("http://127.0.0.1:9/v1").unwrap(), "127.0.0.1:9");
        // The scheme's default port is left out, as hyper-util leaves it.
        assert_eq!(
            host("http://upstream.local:80/v1").unwrap(),
            "upstream.local"
        );
        assert_eq!(host("http://upstream.local/v1").unwrap(), "upstream.local");
        assert_eq!(host("http://[::1]:8080/v1").unwrap(), "[::1]:8080");
        // Possibly HTTP/2: hyper-util decides.
        assert!(host("https://upstream.local/v1").is_none());
    }

    #[test]
    fn debug_shows_no_secret() {
        let client = UpstreamClient::builder("https://h/v1?key=AIzaSECRET")
            .auth(Auth::bearer("sk-SECRET"))
            .build()
            .unwrap();
        let text = format!("{client:?}");
        assert!(!text.contains("SECRET"), "{text}");
        assert!(text.contains("bearer"), "{text}");
        let builder = UpstreamClient::builder("https://h/v1?key=AIzaSECRET")
            .auth(Auth::x_api_key("sk-SECRET"));
        let text = format!("{builder:?}");
        assert!(!text.contains("SECRET"), "{text}");
    }
}
