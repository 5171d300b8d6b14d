//! Reconciliation: asking the external system what happened to an action.

use std::fmt;
use std::future::Future;

use serde_json::Value;

use super::id::ToolCall;
use super::store::{BoxError, BoxFuture};

/// A reconciler's answer about an action whose outcome is unknown.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciliation {
    /// The external system applied the effect; this is its result.
    Succeeded(Value),
    /// The external system has no trace of the effect: it is safe to run it now.
    NotApplied,
    /// The external system cannot tell (yet).
    StillUnknown,
}

/// Looks an action up in the external system by its action id, after a
/// timeout or a lost result left it unknown. The application implements it
/// (for a payment API: fetch the charge by its idempotency key).
///
/// Answering [`Reconciliation::NotApplied`] lets the effect run again, so only
/// answer it when the external system is certain.
pub trait Reconciler: fmt::Debug + Send + Sync + 'static {
    /// What happened to `call` (its `action_id` is the key to look up).
    fn reconcile<'a>(
        &'a self,
        call: &'a ToolCall,
    ) -> BoxFuture<'a, Result<Reconciliation, BoxError>>;
}

/// A [`Reconciler`] from an async closure; see [`reconcile_fn`].
#[derive(Clone)]
pub struct ReconcileFn<F> {
    f: F,
}

impl<F> fmt::Debug for ReconcileFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcileFn").finish_non_exhaustive()
    }
}

/// Makes a [`Reconciler`] from a closure taking the call (cloned) and
/// returning a future of the answer.
pub fn reconcile_fn<F, Fut>(f: F) -> ReconcileFn<F>
where
    F: Fn(ToolCall) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Reconciliation, BoxError>> + Send + 'static,
{
    ReconcileFn { f }
}

impl<F, Fut> Reconciler for ReconcileFn<F>
where
    F: Fn(ToolCall) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Reconciliation, BoxError>> + Send + 'static,
{
    fn reconcile<'a>(
        &'a self,
        call: &'a ToolCall,
    ) -> BoxFuture<'a, Result<Reconciliation, BoxError>> {
        Box::pin((self.f)(call.clone()))
    }
}

impl<T: Reconciler + ?Sized> Reconciler for std::sync::Arc<T> {
    fn reconcile<'a>(
        &'a self,
        call: &'a ToolCall,
    ) -> BoxFuture<'a, Result<Reconciliation, BoxError>> {
        (**self).reconcile(call)
    }
}
