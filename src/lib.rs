//! Tower middleware for LLM gateways that put several model providers
//! behind one endpoint, in the API their clients speak: OpenAI chat
//! completions, Anthropic Messages and the OpenAI Responses API today, any
//! other through a [`Dialect`](dialect::Dialect) of your own. Providers of
//! any dialect may serve one route: a client is always answered in its own
//! dialect, through one neutral turn model.
//!
//! The one rule everything here serves: **a request may move to another
//! provider only while nothing of the model's answer has reached the client.**
//! Once the first piece of model output is flushed the stream is committed to
//! one voice; a later failure ends it cleanly instead of splicing a second
//! model's answer onto the first.
//!
//! The rules the crate enforces:
//!
//! 1. Failover is legal only at zero tokens: before commit a failed attempt
//!    is retried or rerouted invisibly; after it, never.
//! 2. After commit, never append: a failure ends the stream with the
//!    dialect's one terminal event (for chat completions a chunk with
//!    `finish_reason` set and an `error` object, then `[DONE]`).
//! 3. Classify by the provider's contract, not by catch-all: only some
//!    classes retry or reroute; request errors stop.
//! 4. One budget per turn: deadline, attempts and spend are shared by every
//!    hop; a wait longer than the time left is not taken.
//! 5. Switch only to a compatible backup (tools, response format, streaming,
//!    context window, images), or stop explicitly.
//! 6. An effect is keyed by the application's action id, not the attempt:
//!    a timeout means "unknown", never "repeat".
//! 7. Every hop is visible: one turn id per turn, one record per attempt,
//!    with the bytes flushed before the failure.
//!
//! The words every layer shares live at the crate root: [`FailureClass`],
//! [`Phase`], [`Decision`], [`TurnId`], [`TurnDeadline`], [`TurnOutcome`],
//! [`StopReason`], [`Usage`], [`Cost`].
//!
//! Modules, outermost layer first:
//! - [`identity`]: `IdentityLayer`: API keys, and the
//!   [`ClientId`](identity::ClientId) every shared count (retry shares,
//!   spend, health evidence, limits) is kept per.
//! - [`limit`]: request-body read limits, per-client rates, and an
//!   in-flight cap that sheds with the dialect's 503.
//! - [`budget`]: `BudgetLayer`: one deadline, attempt cap and spend ceiling
//!   per turn, published in the request extensions.
//! - [`failover`]: `Failover`: zero-token failover across compatible
//!   targets, and the decision per failure.
//! - [`health`]: passive health keyed by (provider, model), shared by a
//!   whole gateway; the backend trait and the memory store.
//! - [`stream`]: `StreamStateLayer` and the commit machine (Preamble →
//!   Committed → Ended) that it and `Failover` run every stream through.
//! - [`classify`]: failure classes from the providers' own contracts.
//! - [`dialect`]: everything about a wire format, and the neutral model
//!   dialects translate through; [`sse`]: the zero-copy SSE scanner
//!   underneath.
//! - [`observe`]: turn and attempt records, GenAI spans and metrics through
//!   `tracing` and the `metrics` facade.
//! - [`shutdown`]: the signal that ends running streams cleanly when a
//!   gateway's grace period is over.
//!
//! Companion crates of the same workspace:
//! - `tower-llm-client`: `UpstreamClient`, the real upstream HTTP client
//!   (hyper, rustls, provider auth, egress proxies).
//! - `tower-llm-actions`: idempotent tool actions keyed by the application.
//! - `tower-llm-redis`: the health, action, retry-budget, rate and spend
//!   stores shared by every replica on Redis.
//! - `tower-llm-testing`: scripted fake providers for tests.
//!
//! # How a request and its body flow
//!
//! A client's request enters [`BudgetLayer`](budget::BudgetLayer), which
//! starts the turn's [`TurnBudget`](budget::TurnBudget) (or reuses one from
//! the extensions) and answers a refused turn itself.
//! [`Failover`](failover::Failover) reads the body once through its
//! [`Dialect`](dialect::Dialect), keeps the targets whose capabilities fit,
//! skips those whose health key rests, and sends each attempt the client's
//! bytes with the target's model spliced in, through a
//! [`ClassifyLayer`](classify::ClassifyLayer) that names every failure. A
//! streamed answer runs through one [`StreamStateBody`](stream::StreamStateBody):
//! held back until the commit window, so an attempt that fails before then
//! is rerouted and the client never sees it; then released, frame for frame
//! the same bytes, ending with the dialect's terminal event if the stream
//! fails after commit. A whole answer is received, checked by the dialect
//! and released at once. Every outcome is a response: the stack's error
//! type is `Infallible`, so it mounts in axum with `route_service`.
//!
//! # The stack
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http::Request;
//! use http_body_util::{BodyExt, Full};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_llm_failover::budget::BudgetLayer;
//! use tower_llm_failover::failover::{Capabilities, Caps, Failover, Target};
//! use tower_llm_failover::stream::StreamPolicy;
//! use tower_llm_testing::{chunks, FakeProvider, Reply, Step};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Two upstreams (any Tower HTTP service; here scripted fakes): the
//! // primary is rate limited after its role chunk, the backup answers.
//! let primary = FakeProvider::new("primary").always(Reply::Stream(vec![
//!     Step::Data(chunks::role("primary")),
//!     Step::Data(chunks::rate_limit_error()),
//! ]));
//! let backup = FakeProvider::new("backup");
//!
//! let failover = Failover::builder()
//!     .target(Target::new("primary", primary.clone()))
//!     .target(
//!         Target::new("backup", backup.clone())
//!             .model("backup-model")
//!             .capabilities(Capabilities {
//!                 context_window: Some(200_000),
//!                 ..Capabilities::default()
//!             }),
//!     )
//!     .stream_policy(StreamPolicy::new().idle_timeout(Duration::from_secs(30)))
//!     .caps(|c| Caps { retries_per_target: 0, ..c })
//!     .build();
//! let gateway = ServiceBuilder::new()
//!     .layer(BudgetLayer::new().deadline(Duration::from_secs(60)))
//!     .service(failover);
//!
//! // Mounted in axum as it is: every outcome is a response.
//! let app = axum::Router::new().route_service("/v1/chat/completions", gateway);
//!
//! let request = Request::post("/v1/chat/completions")
//!     .body(axum::body::Body::from(
//!         r#"{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
//!     ))
//!     .unwrap();
//! let response = app.oneshot(request).await.unwrap();
//! assert_eq!(response.headers()["x-failover-target"], "backup");
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! let text = String::from_utf8(body.to_vec()).unwrap();
//!
//! // The client saw only the backup's answer, from its first byte.
//! assert!(text.starts_with("data: "));
//! assert!(!text.contains("primary"));
//! assert!(text.ends_with("data: [DONE]\n\n"));
//! assert_eq!((primary.calls(), backup.calls()), (1, 1));
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod budget;
pub mod classify;
pub mod dialect;
pub mod failover;
pub mod health;
pub mod identity;
pub mod limit;
pub mod observe;
pub mod shutdown;
pub mod sse;
pub mod stream;
mod time;
mod util;
mod vocab;

pub use vocab::{
    Cost, DeadlineExceeded, Decision, FailureClass, Phase, StopReason, TurnDeadline, TurnId,
    TurnOutcome, Usage,
};

/// The boxed error the crate's bodies and type-erased services use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The README's Rust blocks, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
