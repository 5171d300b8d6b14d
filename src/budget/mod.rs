//! One budget per turn: deadline, attempts and spend, shared by every hop.
//!
//! A *turn* is one client request and every upstream attempt made for it.
//! [`BudgetLayer`] gives each turn one [`TurnBudget`] and carries it in the
//! request extensions; every hop draws from it and nothing resets per hop
//! (a request that already carries a `TurnBudget` keeps it):
//!
//! - **Deadline** for the whole turn, every hop and backoff included. The
//!   [`Budget`] service races the response head against it
//!   ([`BudgetError::Deadline`], phase [`Head`](crate::classify::Phase::Head))
//!   and wraps the body in a [`BudgetBody`] that ends with
//!   a boxed [`DeadlineExceeded`] error when it passes mid-stream. Both carry a
//!   [`DeadlineExceeded`] (class [`Timeout`](crate::classify::FailureClass::Timeout)).
//! - **Attempts**: [`TurnBudget::try_begin_attempt`] claims the next
//!   1-based attempt number or refuses with [`BudgetExhausted`].
//! - **Spend** in money ([`Cost`], nano-USD): [`TurnBudget::record_spend`]
//!   after each attempt (marked when estimated), [`TurnBudget::check_spend`]
//!   with the next attempt's estimate before it.
//! - **Backoff** between attempts on the same target ([`Backoff`]), with
//!   provider hints honoured; [`TurnBudget::retry_delay`] and
//!   [`TurnBudget::wait_fits`] refuse a wait that would end past the deadline.
//! - **Retry budget** shared across turns ([`RetryBudget`], tower's
//!   `TpsBudget` inside), so an outage does not become a retry storm.
//!
//! Alone around one upstream, the layer counts each call as an attempt,
//! refuses calls of an exhausted turn, records the cost of a response that
//! carries [`ReportedUsage`] (when given a [`Pricing`]) and puts the
//! `TurnBudget` into the response extensions. Inside a gateway, a failover
//! layer below it reads the budget from the request extensions and begins
//! its own attempts (set [`BudgetLayer::attempt_per_call`] to `false`).
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
//! use tower_llm_failover::budget::{BudgetLayer, Cost, Pricing, ReportedUsage, TurnBudget};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A stand-in upstream that reports its usage in the response extensions.
//! let upstream = tower::service_fn(|req: Request<Full<Bytes>>| async move {
//!     // Inner layers find the turn's budget in the request.
//!     let turn = TurnBudget::from_extensions(req.extensions()).unwrap();
//!     assert_eq!(turn.attempts_used(), 1);
//!     let mut res = Response::new(Full::new(Bytes::from_static(b"{\"choices\":[]}")));
//!     res.extensions_mut().insert(ReportedUsage::reported(1_000, 200));
//!     Ok::<_, Infallible>(res)
//! });
//!
//! let service = ServiceBuilder::new()
//!     .layer(
//!         BudgetLayer::new()
//!             .deadline(Duration::from_secs(30))
//!             .max_attempts(3)
//!             .spend_ceiling(Cost::from_usd(0.50))
//!             .pricing(Pricing::per_million_usd(2.5, 10.0)),
//!     )
//!     .service(upstream);
//!
//! let response = service.oneshot(Request::new(Full::new(Bytes::new()))).await.unwrap();
//! let turn = response.extensions().get::<TurnBudget>().unwrap().clone();
//! assert_eq!(turn.spent(), (Cost::from_usd(0.0045), false));
//! let body = response.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(&body[..], b"{\"choices\":[]}");
//! # }
//! ```

mod backoff;
mod body;
mod cost;
mod error;
mod future;
mod layer;
mod retry_budget;
mod service;
mod turn;

pub use backoff::{Backoff, Delay};
pub use body::BudgetBody;
pub use cost::{Cost, Pricing, ReportedUsage};
pub use error::{BudgetError, DeadlineExceeded};
pub use future::ResponseFuture;
pub use layer::BudgetLayer;
pub use retry_budget::{RetryBudget, RetryBudgetConfig, RetryBudgetConfigError, RetryBudgetStats};
pub use service::Budget;
pub use turn::{BudgetExhausted, RetryDelay, RunId, TurnBudget, TurnLimits};
