//! Response future of [`ActionExecutor`](super::ActionExecutor).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde_json::Value;

use super::error::ActionError;
use super::store::BoxFuture;

/// The future [`ActionExecutor`](super::ActionExecutor) returns.
///
/// It claims, waits, reconciles and runs the effect across several store
/// round trips, so it is one boxed state machine rather than a hand-written
/// one. Dropping it while the effect runs turns the action unknown.
pub struct ResponseFuture {
    inner: BoxFuture<'static, Result<Value, ActionError>>,
}

impl ResponseFuture {
    pub(crate) fn new(inner: BoxFuture<'static, Result<Value, ActionError>>) -> Self {
        Self { inner }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Value, ActionError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}
