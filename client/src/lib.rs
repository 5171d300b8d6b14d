//! The real upstream client: a base URL and a credential as a Tower service
//! (feature `client`, on by default).
//!
//! [`UpstreamClient`] is the innermost service of a gateway stack (budget →
//! failover → classify → **upstream client**). An `https` target (or one
//! reached through a proxy) is sent by a pooled
//! `hyper_util::client::legacy::Client` speaking HTTP/1.1, and HTTP/2 where
//! the server picks it by ALPN, over rustls (ring, no OpenSSL). A plain
//! `http://` target reached directly (a model server on the host or beside
//! it) speaks HTTP/1.1 over connections the client pools itself: one list
//! per target, no pool key to hash per request, a connection handed back
//! to the list by its response's [`ResponseBody`] once read to the end
//! (about 9k instructions and 0.8 µs of CPU less per small completion in
//! the gateway than hyper-util's pool, which serves any number of hosts).
//! Its idle timeout and idle cap are the same settings.
//!
//! # TLS
//!
//! By default the Mozilla roots compiled in (webpki-roots) are trusted and
//! no client certificate is sent. The builder adds:
//!
//! - [`ca_file`](UpstreamClientBuilder::ca_file): a PEM bundle of private
//!   CAs, added to the roots; with
//!   [`webpki_roots(false)`](UpstreamClientBuilder::webpki_roots) it
//!   replaces them;
//! - [`native_roots(true)`](UpstreamClientBuilder::native_roots): the
//!   platform's trust store (rustls-native-certs) as well;
//! - [`client_cert_files`](UpstreamClientBuilder::client_cert_files): a
//!   certificate chain and key for servers that require mTLS.
//!
//! Files are read once, by `build`, and a bad one is a typed
//! [`ClientError`] naming the path (never the contents).
//!
//! ALPN offers `h2` then `http/1.1`: an upstream speaking HTTP/2 gets one
//! connection per origin, which every concurrent request shares once it is
//! open; one without gets HTTP/1.1 and a pool of connections. (Requests
//! that start together before the first connection to an origin is up may
//! each open one; hyper-util keeps a single HTTP/2 connection and drops the
//! rest.)
//!
//! # Egress proxies
//!
//! [`proxy`](UpstreamClientBuilder::proxy) sends every request through an
//! HTTP CONNECT proxy (`http://[user:password@]host:port`), except the
//! hosts [`no_proxy`](UpstreamClientBuilder::no_proxy) lists;
//! [`proxy_from_env`](UpstreamClientBuilder::proxy_from_env) reads
//! `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` / `NO_PROXY` instead. The
//! environment is never read unless asked. hyper-util's own matcher and
//! [`Tunnel`](hyper_util::client::legacy::connect::proxy::Tunnel)
//! connector do the work: http and https targets alike go through one
//! CONNECT per connection, and TLS runs inside the tunnel, end to end with
//! the upstream. Proxy credentials go only into the CONNECT's
//! `Proxy-Authorization`; errors and `Debug` output name the proxy by
//! `host:port`.
//!
//! # The URL join rule
//!
//! The base URL is what an OpenAI SDK takes as `base_url`: the API root,
//! `/v1` included (`https://api.openai.com/v1`, `http://127.0.0.1:9101/v1`,
//! `https://generativelanguage.googleapis.com/v1beta/openai`). A request's
//! path is taken relative to the gateway's own `/v1` prefix and appended to
//! the base URL's path:
//!
//! | base URL | request | upstream |
//! |---|---|---|
//! | `http://h:9101/v1` | `/v1/chat/completions` | `http://h:9101/v1/chat/completions` |
//! | `http://h:9101/v1/` | `/chat/completions` | `http://h:9101/v1/chat/completions` |
//! | `http://h/v1` | `/v1beta/x` | `http://h/v1/v1beta/x` (prefix only as whole segments) |
//! | `https://x.azure.com/openai/deployments/d?api-version=1` | `/v1/chat/completions?a=b` | `https://x.azure.com/openai/deployments/d/chat/completions?api-version=1&a=b` |
//!
//! Trailing slashes of the base URL are dropped; the queries of both are
//! joined with `&`. The stripped prefix is set with
//! [`UpstreamClientBuilder::strip_prefix`] (or turned off with
//! [`UpstreamClientBuilder::keep_prefix`]).
//!
//! # Headers
//!
//! Dropped from the client's request: hop-by-hop headers (`connection` and
//! every header it names, `keep-alive`, `proxy-connection`, `proxy-*`,
//! `te`, `trailer`, `transfer-encoding`, `upgrade`); every credential
//! (`authorization`, `proxy-authorization`, `x-api-key`, `api-key`,
//! `x-goog-api-key`, `cookie`, plus [`UpstreamClientBuilder::strip_header`]);
//! `host` (hyper sets the target's); `accept-encoding` (the gateway reads the
//! body, so it asks for identity); `content-length` when the body knows its
//! exact length (hyper sets the right one). Everything else (content-type,
//! user-agent, `openai-*`) goes through. Then the target's own [`Auth`] is
//! set, marked sensitive. Secrets never appear in `Debug` output.
//!
//! # Sockets
//!
//! TCP_NODELAY is set on every connection: a stream is many small writes,
//! and Nagle's algorithm with delayed ACKs would hold each one's tail for
//! about 40 ms. Connect and pool idle timeouts are configurable.
//!
//! # Errors
//!
//! [`SendError::Transport`] wraps `hyper_util::client::legacy::Error` as its
//! `source()`, so [`Classifier::classify_transport`] sees `is_connect()` and
//! the io error below it: a refused connection is `Connect` before send.
//! A plain-`http` target's errors say the same in their own words:
//! [`SendError::NotSent`] carries a
//! [`NotSent`](tower_llm_failover::classify::NotSent) (the connection could
//! not be made, or closed before the request was written: before send),
//! [`SendError::Http`] hyper's error once the request was written.
//!
//! A failed connection check is `Connect` before send too, so failover
//! reroutes it like any connect failure, and its note and message say
//! which check failed:
//!
//! | failure | note |
//! |---|---|
//! | server certificate from an unknown CA | `tls_unknown_ca` |
//! | server certificate for another host name | `tls_name_mismatch` |
//! | server certificate expired or not yet valid | `tls_certificate_expired` |
//! | any other invalid server certificate | `tls_bad_certificate` |
//! | server requires a client certificate, none sent | `tls_client_certificate_required` |
//! | server rejects the client certificate | `tls_client_certificate_rejected` |
//! | server refuses the handshake, or nothing in common | `tls_handshake_refused`, `tls_handshake_failed` |
//! | proxy answers the CONNECT with an error status | `proxy_refused` |
//! | proxy answers 407 | `proxy_auth_required` |
//! | proxy cannot be reached | `proxy_unreachable` |
//! | proxy breaks off, or is not `http://` | `proxy_failed`, `proxy_unsupported` |
//!
//! The proxy failures are [`ProxyError`]s in the chain.
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use http::Request;
//! use http_body_util::Full;
//! use tower::ServiceExt;
//! use tower_llm_failover::{FailureClass, Phase, classify::Classifier};
//! use tower_llm_client::{Auth, UpstreamClient};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A port nobody listens on.
//! let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//!
//! let client = UpstreamClient::builder(format!("http://127.0.0.1:{port}/v1"))
//!     .auth(Auth::bearer("sk-target-key"))
//!     .connect_timeout(std::time::Duration::from_secs(2))
//!     .build()?;
//!
//! let request = Request::post("/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .header("authorization", "Bearer the-client-key") // never forwarded
//!     .body(Full::new(Bytes::from_static(br#"{"model":"m","messages":[]}"#)))?;
//! let error = client.oneshot(request).await.unwrap_err();
//!
//! let c = Classifier::default().classify_transport(Some("primary"), &error, false);
//! assert_eq!(c.class, FailureClass::Connect);
//! assert_eq!(c.phase, Phase::BeforeSend); // safe to send elsewhere
//! # Ok(())
//! # }
//! ```
//!
//! [`Classifier::classify_transport`]: tower_llm_failover::classify::Classifier::classify_transport

mod auth;
mod body;
mod builder;
mod endpoint;
mod error;
mod future;
mod headers;
mod io;
mod pool;
mod proxy;
mod service;
mod tls;

use std::time::Duration;

pub use self::auth::Auth;
pub use self::body::ResponseBody;
pub use self::builder::UpstreamClientBuilder;
pub use self::error::{ClientError, SendError};
pub use self::future::ResponseFuture;
pub use self::proxy::ProxyError;
pub use self::service::UpstreamClient;

/// Default TCP connect timeout.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time an idle pooled connection is kept.
pub(crate) const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Default gateway-side path prefix replaced by the base URL's path.
pub(crate) const DEFAULT_STRIP_PREFIX: &str = "/v1";
