//! One budget per turn: deadline, attempts and spend, shared by every hop.
//!
//! A *turn* is one client request and every upstream attempt made for it.
//! [`BudgetLayer`] gives each turn one [`TurnBudget`] and carries it in the
//! request extensions; every hop draws from it and nothing resets per hop
//! (a request that already carries a `TurnBudget` keeps it):
//!
//! - **Deadline** for the whole turn, every hop and backoff included. The
//!   [`Budget`] service races the response head against it (a 504 in the
//!   dialect's error shape when it passes first) and wraps the body in a
//!   [`BudgetBody`] that ends with a boxed [`DeadlineExceeded`](crate::DeadlineExceeded) error
//!   (class [`Timeout`](crate::FailureClass::Timeout)) when it
//!   passes mid-stream, unless a stream inspector inside ended the stream
//!   first.
//! - **Attempts**: whoever makes the attempts (the failover layer) claims
//!   each one from the turn, atomically, so concurrent hops never overdraw
//!   the cap; past it the turn is refused with [`BudgetExhausted`]. With a
//!   [`RetryBudget`], every extra attempt also needs its consent.
//! - **Spend** in money ([`Cost`](crate::Cost), nano-USD): each attempt's
//!   cost is recorded after it (marked when estimated), and the next
//!   attempt's estimate is checked against the turn's own ceiling before
//!   it ([`TurnBudget::spent`] reads the total).
//! - **Backoff** between attempts on the same target ([`Backoff`]), with
//!   provider hints honoured; a wait that would end past the deadline is
//!   refused.
//! - **Tenant spend** over a day or a month ([`TenantSpend`] over a
//!   [`SpendStore`]: in memory, or shared by replicas on Redis), for the
//!   tenant of the request's [`ClientId`](crate::identity::ClientId)
//!   ([`BudgetLayer::tenant_spend`]). Each attempt reserves its estimate
//!   before it is sent (the first is the
//!   turn's admission), and the end of the turn settles the tenant's total
//!   to what the turn cost, so concurrent turns of one tenant pass its
//!   ceiling by at most one attempt's estimate each.
//!
//! **What is charged.** Every attempt whose request reached the provider:
//! the usage it reported, else an estimate (marked as such in its
//! [`AttemptRecord`](crate::observe::AttemptRecord)`::estimated`): prompt
//! tokens plus the output seen. A whole (non-streamed) answer cut before it
//! came (a head timeout) is charged the request's `max_tokens` (or the
//! failover layer's `default_output_tokens`), since the provider generates
//! and bills it all the same; so is an attempt the client left mid-way. An
//! attempt that never reached the provider (connect, DNS, TLS:
//! [`Phase::BeforeSend`](crate::Phase::BeforeSend)) and one the
//! provider refused with an error status (4xx, 5xx) cost nothing:
//! providers do not bill refused requests.
//! - **Retry budget** shared across turns ([`RetryBudget`]: tower's
//!   `TpsBudget` token bucket, with a level that can be read), so an outage
//!   does not become a retry storm.
//!
//! The layer never has to be told how it is nested. It answers a refused
//! turn (deadline passed, attempts or spend used up) with an error response
//! in its dialect's shape, so its error type is the inner service's. An
//! inner layer that makes attempts (a failover layer) counts them in the
//! budget; a call in which nobody did counts as one attempt. It records the
//! cost of a response that carries [`ReportedUsage`] (when given a
//! [`Pricing`]) and puts the `TurnBudget` into the response extensions.
//!
//! # Example
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_llm_failover::Cost;
//! use tower_llm_failover::budget::{BudgetLayer, Pricing, ReportedUsage, TurnBudget, TurnLimits};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A stand-in upstream that reports its usage in the response extensions.
//! let upstream = tower::service_fn(|req: Request<Full<Bytes>>| async move {
//!     // Inner layers find the turn's budget in the request.
//!     let turn = TurnBudget::from_extensions(req.extensions()).unwrap();
//!     assert_eq!(turn.attempts_used(), 0);
//!     let mut res = Response::new(Full::new(Bytes::from_static(b"{\"choices\":[]}")));
//!     res.extensions_mut().insert(ReportedUsage::reported(1_000, 200));
//!     Ok::<_, Infallible>(res)
//! });
//!
//! let service = ServiceBuilder::new()
//!     .layer(
//!         BudgetLayer::new()
//!             .limits(TurnLimits {
//!                 deadline: Duration::from_secs(30),
//!                 max_attempts: 3,
//!                 spend_ceiling: Some(Cost::from_usd(0.50)),
//!                 ..TurnLimits::new()
//!             })
//!             .pricing(Pricing::per_million_usd(2.5, 10.0)),
//!     )
//!     .service(upstream);
//!
//! let response = service.oneshot(Request::new(Full::new(Bytes::new()))).await.unwrap();
//! let turn = response.extensions().get::<TurnBudget>().unwrap().clone();
//! assert_eq!(turn.spent(), (Cost::from_usd(0.0045), false));
//! assert_eq!(turn.attempts_used(), 1, "the call was the turn's one attempt");
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(&body[..], b"{\"choices\":[]}");
//! # }
//! ```

mod backoff;
mod body;
mod cost;
mod future;
mod layer;
#[cfg(test)]
mod layer_tests;
mod retry_budget;
mod service;
mod spend;
mod turn;
#[cfg(test)]
mod turn_tests;

pub use backoff::Backoff;
pub use body::BudgetBody;
pub use cost::{Pricing, ReportedUsage};
pub use future::ResponseFuture;
pub use layer::BudgetLayer;
pub use retry_budget::{RetryBudget, RetryBudgetConfig, RetryBudgetConfigError, RetryBudgetStats};
pub use service::Budget;
pub use spend::{
    MemorySpendStore, Reservation, SpendCeilings, SpendCheck, SpendError, SpendFuture, SpendStore,
    SpendWindow, TenantRefusal, TenantSpend,
};
pub(crate) use turn::RetryDelay;
pub use turn::{BudgetExhausted, TurnBudget, TurnLimits};
