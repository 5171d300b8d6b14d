//! [`Budget`]: the service that starts or reuses a turn's budget.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::body::BudgetBody;
use super::future::ResponseFuture;
use super::layer::Settings;
use super::turn::{BudgetExhausted, TurnBudget};
use crate::dialect::{DefaultDialect, Dialect};
use crate::identity::ClientId;

/// Middleware that gives each turn one [`TurnBudget`] and enforces its
/// deadline on the response head and body. Made by
/// [`BudgetLayer`](super::BudgetLayer); see the [module docs](super).
///
/// A refused turn (deadline passed, attempts or spend used up) is answered,
/// not failed: an error response in the dialect's shape. Its error type is
/// the inner service's, so over an infallible stack it stays infallible.
#[derive(Debug, Clone)]
pub struct Budget<S, D = DefaultDialect> {
    inner: S,
    settings: Arc<Settings>,
    dialect: D,
}

impl<S, D> Budget<S, D> {
    /// Meters a new turn with the tenant of the request's client, when the
    /// layer has a [`TenantSpend`](super::TenantSpend); refuses a request
    /// naming none when one is required. A turn already metered (a later
    /// hop) keeps its tenant.
    fn meter_tenant<B>(
        &self,
        budget: &TurnBudget,
        req: &Request<B>,
    ) -> Result<(), BudgetExhausted> {
        // A later hop finds them set already and leaves them.
        if let Some(ceilings) = req.extensions().get::<super::SpendCeilings>() {
            budget.meter_ceilings(ceilings.clone());
        }
        let Some(spend) = &self.settings.tenant else {
            return Ok(());
        };
        if budget.tenant().is_some() {
            return Ok(());
        }
        if let Some(tenant) = spend.tenant_of(&ClientId::of(req.extensions()))? {
            budget.meter_tenant(spend.clone(), tenant);
        }
        Ok(())
    }

    pub(crate) fn from_parts(inner: S, settings: Arc<Settings>, dialect: D) -> Self {
        Self {
            inner,
            settings,
            dialect,
        }
    }

    crate::util::inner_service_accessors!();
}

impl<S, D, ReqBody, ResBody> Service<Request<ReqBody>> for Budget<S, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
    D: Dialect,
{
    type Response = Response<BudgetBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, D>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // Reuse the turn's budget on every later hop: nothing resets per hop.
        let (budget, just_started) = match TurnBudget::from_extensions(req.extensions()) {
            Some(budget) => (budget, false),
            None => {
                let client = crate::identity::ClientId::of(req.extensions());
                let budget = self.settings.limits.start_for(client);
                req.extensions_mut().insert(budget.clone());
                (budget, true)
            }
        };
        // The deadline in the neutral words every layer reads.
        req.extensions_mut().insert(budget.turn_deadline());
        let open = if just_started {
            budget.check_open_just_started()
        } else {
            budget.check_open()
        };
        let refusal = open.and_then(|()| self.meter_tenant(&budget, &req));
        if let Err(refusal) = refusal {
            tracing::debug!(run_id = %crate::util::log_safe(budget.turn_id()), %refusal, "turn budget refused the call");
            // Refused before any attempt: the turn still leaves its line.
            crate::observe::refused_turn(budget.turn_id(), refusal.stop_reason());
            // The inner service stays ready for the next call.
            return ResponseFuture::refused(budget, refusal, self.dialect.clone());
        }
        // Attempts are counted by whoever makes them (a failover layer
        // inside); a call in which nobody did counts as one.
        let attempts_before = budget.attempts_used();
        // Called right here, not inside the future: no clone-and-swap needed.
        let future = self.inner.call(req);
        ResponseFuture::called(
            future,
            budget,
            self.settings.pricing,
            attempts_before,
            self.dialect.clone(),
        )
    }
}
