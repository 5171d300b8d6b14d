//! Failure classification from the providers' own contracts.
//!
//! Every failure of an upstream call gets a [`FailureClass`](crate::FailureClass), the [`Phase`](crate::Phase)
//! it happened in, the HTTP status, the provider's own code, retry hints, a
//! bounded sanitized message, and a default [`Decision`](crate::Decision) the failover policy
//! reads: retry the same provider, reroute, or stop.
//!
//! Two ways in:
//!
//! - [`ClassifyLayer`] wraps an upstream HTTP service. A 2xx passes through
//!   untouched (no body read, no copy). Anything else becomes
//!   `Err(`[`UpstreamError`]`)`: the error body is read with a cap (64 KiB)
//!   and a timeout (10 s), classified, and kept so that a final stop can
//!   answer the client in its dialect's error shape
//!   ([`UpstreamError::to_response`]). Transport errors from the inner
//!   client are classified too. It works alone (metrics, logs, a
//!   `tower::retry::Policy` reading [`Classification::recovery`]) and inside
//!   the failover stack.
//! - [`Classifier`] is the engine, called directly for what the layer cannot
//!   see: in-band stream errors ([`Classifier::classify_in_band`]), 200
//!   bodies that are not valid answers ([`Classifier::validate_body`]),
//!   transport errors met while a body streams
//!   ([`Classifier::classify_transport`]), and the gateway's own timeouts,
//!   cancellations and truncations ([`Classification::timeout`],
//!   [`Classification::cancelled`], [`Classification::truncated`]).
//!
//! The rules come from the providers' documented contracts (OpenAI, Azure,
//! Anthropic, Gemini native and OpenAI-compatible, OpenRouter, vLLM, Ollama,
//! Groq, DeepSeek): the same 429 splits into a rate limit and an exhausted
//! quota, a Gemini `QuotaFailure` with a per-day quota id is not retried, an
//! OpenAI "Request too large ... (TPM)" 429 is a payload that tier can never
//! take. The order they are checked in is documented on the (private)
//! `rules` module and on [`Classifier`]; users change the outcome for a
//! status, a provider code or a provider with [`Override`]s.
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::Full;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_llm_failover::{Decision, FailureClass, Phase, classify::ClassifyLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A fake upstream that has run out of credit.
//! let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
//!     let body = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
//!     Ok::<_, std::convert::Infallible>(
//!         Response::builder().status(429).body(Full::new(Bytes::from(body))).unwrap(),
//!     )
//! });
//! let service = ServiceBuilder::new()
//!     .layer(ClassifyLayer::new().provider("openai"))
//!     .service(upstream);
//!
//! let error = service.oneshot(Request::new(Full::default())).await.unwrap_err();
//! let c = error.classification();
//! assert_eq!(c.class, FailureClass::QuotaExhausted); // a 429, but not a rate limit
//! assert_eq!(c.phase, Phase::Head);
//! assert_eq!(c.recovery, Decision::Reroute);
//! assert_eq!(c.provider_code.as_deref(), Some("insufficient_quota"));
//!
//! // What a gateway answers when no other provider is left, in the shape
//! // of the client's wire dialect.
//! let (status, body) = error.classification().to_error(&tower_llm_failover::dialect::DefaultDialect::default());
//! assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
//! assert!(body.starts_with(br#"{"error":{"#));
//! # }
//! ```
//!
//! # Why not tower-http's classify traits
//!
//! tower-http's `ClassifyResponse` decides from the response head, and its
//! `ClassifyEos` from trailers or a body error at the end of the stream.
//! Neither ever sees body bytes, and the contracts live in them: a 429's body
//! says whether to wait or to leave, and an SSE stream that answered 200
//! reports its failure in a `data: {"error":...}` event (HTTP/1.1 SSE has no
//! trailers). So the core is built on its own types, and the `tower-http`
//! feature adds `TowerHttpClassifier`, an adapter implementing
//! `ClassifyResponse` from the status and headers (`Ready` at the head) for
//! users who want the same classes in tower-http's `TraceLayer`. It is
//! optional because trait impls do not carry across tower-http 0.x majors
//! (many gateways still pin 0.6).
//!
//! # Credentials
//!
//! Messages are sanitized when a [`Classification`] is built
//! : keys echoed by a provider (`sk-...`, `AIza...`,
//! `Bearer ...`, long hex or base64 tokens) are replaced by `[REDACTED]`, and
//! the message is cut to 512 characters. The raw error body kept in
//! [`UpstreamError::body`] is not sanitized and is never printed by `Debug`.

mod body;
mod class;
mod classifier;
mod contract;
mod error;
mod future;
mod layer;
mod overrides;
mod rate_limits;
mod reply;
mod retry_after;
#[cfg(test)]
mod retry_after_tests;
mod rules;
mod sanitize;
mod service;
#[cfg(feature = "tower-http")]
mod tower_http;
mod transport;

pub use self::class::{Classification, Note, RetryHint};
pub use self::classifier::{Classifier, DEFAULT_BODY_LIMIT};
pub use self::error::UpstreamError;
pub use self::future::ResponseFuture;
pub use self::layer::ClassifyLayer;
pub use self::overrides::Override;
pub use self::rate_limits::RateLimitHeaders;
pub use self::sanitize::REDACTED;
pub use self::service::Classify;
#[cfg(feature = "tower-http")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower-http")))]
pub use self::tower_http::TowerHttpClassifier;
pub use self::transport::{ConnectionCheck, FailedCheck, NotSent};
