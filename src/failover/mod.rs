//! Zero-token failover across providers.
//!
//! [`Failover`] serves the requests of one wire dialect (OpenAI chat
//! completions by default, Anthropic Messages, or a [`Dialect`](crate::dialect::Dialect)
//! of your own) from a list of [`Target`]s. It reads the request once, keeps only targets whose
//! [`Capabilities`] satisfy it (tools, response format, streaming, images,
//! context window), orders them by a [`Strategy`], and runs attempts:
//!
//! - A streamed answer is held back until it commits — by default at the
//!   first model output, or later per the [`CommitWindow`](crate::stream::CommitWindow) — so every failure
//!   before that point (error status, transport error, in-band error,
//!   malformed or truncated stream, no first output in time) is classified
//!   and retried or rerouted, and the client sees only the winning attempt's
//!   bytes, from its first byte. After commit the layer never switches: a
//!   later failure ends the stream with a terminal chunk.
//! - A non-streaming answer is received whole (capped) and validated before
//!   it is released; a truncated body, invalid JSON or an error-shaped 200 is
//!   a failure that may be rerouted. Non-streaming requests are sent
//!   non-streaming upstream, so the provider's own JSON reaches the client.
//! - Decisions come from the classification's recovery, the turn's budget
//!   (deadline, attempts, spend, the retry budget shared across turns) and
//!   eligibility. Request errors return to the client at once with the
//!   provider's message; when every option is spent the client gets one
//!   error in the dialect's shape naming the first failure and the attempt
//!   count.
//! - Optionally, a [`Hedge`]: an attempt that has not committed in time
//!   (a fixed wait, or a percentile of the target's recent times to
//!   commit) is raced by one more on the next healthy target. The first
//!   to commit is served; the others are dropped at once, which closes
//!   their upstream connections, and are recorded as
//!   [`Decision::LostRace`](crate::Decision::LostRace). Hedges count as
//!   attempts, reserve their estimate under the spend ceiling while they
//!   run, draw from their own budget (5 % of first attempts by default),
//!   and are never made for a request that could repeat an effect (a
//!   provider-hosted tool, provider-held state, the result of a tool
//!   marked not idempotent). Losing a race says nothing about health.
//! - Passive health in a [`HealthStore`](crate::health::HealthStore) shared by the whole gateway (see
//!   [Health](#health) below).
//! - Every attempt is recorded ([`TurnRecord`](crate::observe::TurnRecord) in
//!   the response extensions, summary headers, one tracing event each).
//!
//! Each target's service is wrapped in a
//! [`ClassifyLayer`](crate::classify::ClassifyLayer) named after its
//! provider, and each upstream request carries the target's model, has
//! `stream_options.include_usage` turned on for streams (the usage chunk is
//! removed again when the client did not ask for it), and only the client
//! headers the [header policy](#headers) forwards.
//!
//! # Headers
//!
//! Headers cross the layer by allow-list, each way ([`HeaderPolicy`]):
//!
//! - **to the provider**, only the client headers in
//!   the default list of [`HeaderPolicy`] (`accept`, `content-type`,
//!   `x-request-id`, `traceparent`, `tracestate`, `anthropic-version`,
//!   `anthropic-beta`), so a client cannot choose the organisation or
//!   project the gateway's key bills, nor send a credential of its own;
//! - **to the client**, only the provider headers in
//!   the default list of [`HeaderPolicy`] (`content-type`, `cache-control`, the
//!   provider's request id `x-request-id` / `request-id`, and rate limits
//!   under the provider's names: `x-ratelimit-*`, `anthropic-ratelimit-*`,
//!   `retry-after`, `retry-after-ms`), on streams and on whole answers
//!   alike; `set-cookie`, `openai-organization`, debug headers and the rest
//!   are dropped. The layer's own `x-failover-*` headers are added after.
//!
//! Hop-by-hop headers never pass either way. Credential and account headers
//! (`authorization`, `x-api-key`, `api-key`, `x-goog-api-key`, cookies,
//! `openai-organization`, `openai-project`) pass only when the operator
//! names them exactly: [`HeaderPolicy::forward_request_headers`] and
//! [`HeaderPolicy::forward_response_headers`] add to the defaults, given
//! with [`FailoverBuilder::header_policy`].
//!
//! # Timeouts
//!
//! Every wait is bounded by the turn's deadline, and sooner by:
//!
//! | wait | default | set with ([`FailoverBuilder::timeouts`]) |
//! |---|---|---|
//! | response head of a stream | 10 s (and never past the first-output timeout) | [`Timeouts::head`] |
//! | first model output of a stream | 15 s | [`Timeouts::first_output`]; per target [`Target::first_output_timeout`], and [`Target::reasoning_first_output_timeout`] for a request that asks for reasoning |
//! | response head of a non-streaming answer | 60 s | [`Timeouts::non_streaming_head`] |
//! | gap between body frames, streamed or whole | 30 s | [`StreamPolicy::idle_timeout`](crate::stream::StreamPolicy::idle_timeout) |
//! | a whole non-streaming answer, head and body | none | [`Timeouts::response`] |
//!
//! A silent head or a stalled body before commit is rerouted while the turn
//! still has time. A non-streaming head comes only once the provider has
//! written the whole answer: raise its timeout (or stream) for long
//! completions.
//!
//! # Health
//!
//! Health lives in [`health`](crate::health): one [`HealthStore`](crate::health::HealthStore)
//! serves every route and every `Failover` that is given it
//! ([`FailoverBuilder::health`]).
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tower::ServiceExt;
//! use tower_llm_failover::failover::{Failover, Target};
//! use tower_llm_testing::{json_response, ScriptedBody};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A primary that is rate limited and a backup that answers.
//! let upstream = |ok: bool| {
//!     tower::service_fn(move |_req: Request<Full<Bytes>>| async move {
//!         Ok::<_, std::convert::Infallible>(if ok {
//!             json_response(200, r#"{"id":"c","object":"chat.completion","model":"backup-model","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#)
//!         } else {
//!             json_response(429, r#"{"error":{"message":"quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#)
//!         })
//!     })
//! };
//! let failover = Failover::builder()
//!     .target(Target::new("primary", upstream(false)))
//!     .target(Target::new("backup", upstream(true)).model("backup-model"))
//!     .build();
//!
//! let request = Request::post("/v1/chat/completions")
//!     .body(Full::new(Bytes::from(r#"{"model":"gpt-x","messages":[{"role":"user","content":"hi"}]}"#)))
//!     .unwrap();
//! let response = failover.oneshot(request).await.unwrap();
//! assert_eq!(response.status(), 200);
//! assert_eq!(response.headers()["x-failover-attempts"], "2");
//! assert_eq!(response.headers()["x-failover-target"], "backup");
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! assert!(std::str::from_utf8(&body).unwrap().contains("backup-model"));
//! # }
//! ```

mod attempt;
mod body;
mod decision;
mod headers;
mod hedge;
mod layer;
mod ledger;
mod owners;
mod race;
mod reply;
mod resting;
mod select;
mod service;
mod shared;
mod target;
mod translate;
mod turn;
mod upstream;

pub use body::FailoverBody;

pub(crate) use crate::time::later;
pub use headers::{DEFAULT_ANTHROPIC_BETAS, HeaderPolicy};
pub use hedge::{Hedge, HedgeAfter};
pub use layer::FailoverLayer;
pub use select::{Candidate, Selector, Strategy};
pub use service::{Caps, Failover, FailoverBuilder, ResponseFuture, Timeouts};
pub use target::{BoxUpstream, Capabilities, Target, UpstreamBody};
