//! [`Budget`]: the service that starts or reuses a turn's budget.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::body::BudgetBody;
use super::error::BudgetError;
use super::future::ResponseFuture;
use super::layer::{BudgetLayer, Settings};
use super::turn::TurnBudget;

/// Middleware that gives each turn one [`TurnBudget`] and enforces its
/// deadline on the response head and body. Made by [`BudgetLayer`]; see the
/// [module docs](super).
#[derive(Debug, Clone)]
pub struct Budget<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> Budget<S> {
    /// Wrap `inner` with the default [`BudgetLayer`] settings.
    pub fn new(inner: S) -> Self {
        Self::from_parts(inner, BudgetLayer::new().settings)
    }

    /// A [`BudgetLayer`] with the defaults, to configure.
    pub fn layer() -> BudgetLayer {
        BudgetLayer::new()
    }

    pub(crate) fn from_parts(inner: S, settings: Arc<Settings>) -> Self {
        Self { inner, settings }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Budget<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
{
    type Response = Response<BudgetBody<ResBody>>;
    type Error = BudgetError<S::Error>;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(BudgetError::Inner)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // Reuse the turn's budget on every later hop: nothing resets per hop.
        let budget = match TurnBudget::from_extensions(req.extensions()) {
            Some(budget) => budget,
            None => {
                let budget = self.settings.limits.start();
                req.extensions_mut().insert(budget.clone());
                budget
            }
        };
        let admitted = budget.check_open().and_then(|()| {
            if self.settings.attempt_per_call {
                budget.try_begin_attempt().map(drop)
            } else {
                Ok(())
            }
        });
        if let Err(refusal) = admitted {
            tracing::debug!(run_id = %budget.run_id(), %refusal, "turn budget refused the call");
            // The inner service stays ready for the next call.
            return ResponseFuture::refused(budget, refusal);
        }
        // Called right here, not inside the future: no clone-and-swap needed.
        let future = self.inner.call(req);
        ResponseFuture::called(future, budget, self.settings.pricing)
    }
}
