//! Idempotent tool actions: an effect runs once per action id, and a timeout
//! means "unknown", never "repeat".
//!
//! Failover makes model attempts repeatable; effects are not. A backup model
//! may propose the same tool call again, and a retried executor could charge a
//! card twice. Here the application's [`ActionId`] (for example
//! `send-order-847`), not the model attempt, decides whether an effect runs.
//!
//! [`ActionExecutorLayer`] wraps any Tower service that performs effects
//! (`Service<ToolCall, Response = serde_json::Value>`). For each call it:
//!
//! 1. checks the arguments against the tool's JSON Schema, if
//!    [`ToolSchemas`] are configured (invalid calls leave no record);
//! 2. claims the action in an [`ActionStore`] *before* the effect;
//! 3. runs the inner service under the effect timeout and stores the outcome.
//!
//! The same action id again gets the stored result (or the stored final
//! error) without running the effect. A concurrent duplicate waits for the
//! first call, up to [`in_progress_wait`](ActionExecutorLayer::in_progress_wait),
//! then gets [`ActionError::InProgress`]. If the effect times out, its future
//! is dropped, or the executor fails ambiguously, the action becomes
//! [`ActionState::Unknown`]. A later call never repeats it blindly: it asks
//! the [`Reconciler`] (if any) and acts on the answer; without one, or if the
//! reconciler cannot tell, it returns [`ActionError::NeedsReconciliation`].
//!
//! States: not started → running → succeeded | failed (retryable or final) |
//! unknown. A retryable failure runs again on the next call; an unknown one
//! runs again only after the reconciler answers [`Reconciliation::NotApplied`].
//! Every transition is a `tracing` event (`"action transition"`) with the
//! action id, attempt id, run, and the states before and after.
//!
//! [`MemoryStore`] is the in-process store: bounded, finished records expire
//! after a time-to-live, live records are never evicted (a full store refuses
//! new claims with [`StoreError::Full`]). The trait is shaped so a shared
//! backend can implement each step with one round trip.
//!
//! # What an action id binds
//!
//! - **Its arguments.** A claim carries the [`ArgumentsDigest`] (SHA-256 of
//!   the canonical JSON) of the call's arguments. The same id with the same
//!   arguments, however spelled, replays; with other arguments it is
//!   refused with [`StoreError::ArgumentsDiffer`], neither replayed nor run.
//! - **Its tenant.** Ids are unique per tenant: set the request's tenant on
//!   each call with [`ToolCall::with_tenant`] (from the request's
//!   `ClientId` (`tower_llm_failover::identity`)), so two tenants' `call_0` are
//!   two actions with their own results. An id without a tenant is in a
//!   namespace of its own.
//! - **Its tool.** Another tool under the same id is
//!   [`StoreError::ToolMismatch`].
//!
//! # How long a finished action is remembered
//!
//! A finished record (succeeded, failed) is a tombstone kept for the
//! store's time-to-live, 7 days by default ([`MemoryStore::ttl`],
//! `RedisActionStore::ttl`). A resubmission within it replays; one after it
//! runs the effect again. Set it above the longest time your application
//! may resubmit an action; with [`MemoryStore`], size
//! [`max_records`](MemoryStore::max_records) for the actions finished in
//! one TTL. Every duration (TTL, lease, timeouts, waits) saturates:
//! `Duration::MAX` means "very long", never a panic.
//!
//! On Redis, a claim the primary acknowledged can be lost if the primary
//! dies before replicating it; `RedisActionStore::wait_for_replicas` makes
//! claims wait for replicas and fail closed without them.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use serde_json::{Value, json};
//! use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
//! use tower_llm_actions::{
//!     ActionError, ActionExecutorLayer, ActionState, ActionStore, Disposition, MemoryStore,
//!     Reconciliation, ToolCall, ToolSchemas, reconcile_fn,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The tools from the chat request, checked before any effect.
//! let request = json!({ "tools": [{ "type": "function", "function": {
//!     "name": "send_order",
//!     "parameters": {
//!         "type": "object",
//!         "properties": { "sku": { "type": "string" }, "qty": { "type": "integer", "minimum": 1 } },
//!         "required": ["sku", "qty"]
//!     }
//! }}]});
//! // Finished records answer resubmissions for 7 days (the default TTL).
//! let store = Arc::new(MemoryStore::new().max_records(10_000).ttl(MemoryStore::DEFAULT_TTL));
//!
//! let mut executor = ServiceBuilder::new()
//!     .layer(
//!         ActionExecutorLayer::new(store.clone())
//!             .schemas(ToolSchemas::from_request(&request)?)
//!             .effect_timeout(Duration::from_secs(10))
//!             .in_progress_wait(Duration::from_secs(2))
//!             // Ask the order system what happened to an action it may have applied.
//!             .reconciler(reconcile_fn(|_call: ToolCall| async {
//!                 Ok::<_, BoxError>(Reconciliation::NotApplied)
//!             }))
//!             .classify_errors(|_e: &BoxError| Disposition::Retryable),
//!     )
//!     .service_fn(|call: ToolCall| async move {
//!         // The effect: place the order in the external system.
//!         Ok::<_, BoxError>(json!({ "order": call.action_id.as_str(), "status": "placed" }))
//!     });
//!
//! let call = ToolCall::new("send-order-847", "send_order", json!({ "sku": "A-1", "qty": 2 }))
//!     .with_attempt_id("turn-9/attempt-1");
//! let first = executor.ready().await?.call(call.clone()).await?;
//!
//! // A backup model proposes the same call: the stored result, no second order.
//! let again = executor.ready().await?.call(call.with_attempt_id("turn-9/attempt-2")).await?;
//! assert_eq!(first, again);
//! assert!(matches!(store.state(&"send-order-847".into()).await?, ActionState::Succeeded { .. }));
//!
//! // Invalid arguments never reach the executor.
//! let bad = ToolCall::new("send-order-848", "send_order", json!({ "sku": "A-1", "qty": 0 }));
//! let err = executor.ready().await?.call(bad).await.unwrap_err();
//! assert!(matches!(err, ActionError::InvalidArguments { ref path, .. } if path == "/qty"));
//! # let _: Value = first;
//! # Ok(())
//! # }
//! ```

mod digest;
mod disposition;
mod error;
mod future;
mod id;
mod layer;
mod memory;
mod reconcile;
mod schema;
mod service;
mod state;
mod store;
mod telemetry;
mod time;

pub use digest::ArgumentsDigest;
pub use disposition::{ClassifyEffectError, Disposition, FinalOnError};
pub use error::{ActionError, UnknownReason};
pub use future::ResponseFuture;
pub use id::{ActionId, ToolCall};
pub use layer::ActionExecutorLayer;
pub use memory::MemoryStore;
pub use reconcile::{ReconcileFn, Reconciler, Reconciliation, reconcile_fn};
pub use schema::{SchemaError, ToolSchemas};
pub use service::ActionExecutor;
pub use state::{ActionRecord, ActionState, FenceToken, StateKind, StoredError, Transition};
pub use store::{ActionStore, BoxFuture, Claim, ClaimRequest, Claimed, StoreError};
pub use telemetry::describe_metrics;
