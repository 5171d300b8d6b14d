//! [`ResponseFuture`] of the [`Budget`](super::Budget) service.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::{Sleep, sleep_until};

use crate::dialect::{Dialect, ErrorReply};
use crate::{FailureClass, Phase};

use super::body::BudgetBody;
use super::cost::{Pricing, ReportedUsage};
use super::turn::{BudgetExhausted, TurnBudget};
use crate::DeadlineExceeded;

pin_project! {
    /// Response future of [`Budget`](super::Budget): the inner call raced
    /// against the turn's deadline.
    ///
    /// On a response head it records the response's cost (when the layer
    /// has a [`Pricing`] and the response carries a [`ReportedUsage`]),
    /// puts the [`TurnBudget`] into the response extensions and wraps the
    /// body in a [`BudgetBody`]. A refused turn and a deadline before the
    /// head are answered with an error response in the dialect's shape.
    ///
    /// The deadline's timer is armed when the inner call first waits,
    /// unless the layer inside has said it answers by the deadline itself
    /// (the failover layer, once it has read the request of a turn with no
    /// spend store to wait on): a turn then costs no timer here.
    pub struct ResponseFuture<F, D> {
        #[pin]
        state: State<F>,
        budget: TurnBudget,
        pricing: Option<Pricing>,
        attempts_before: u32,
        dialect: D,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Refused { refusal: Option<BudgetExhausted> },
        Called {
            #[pin]
            future: F,
            // Made on first poll, inside the runtime.
            #[pin]
            sleep: Option<Sleep>,
        },
        Done,
    }
}

impl<F, D> std::fmt::Debug for ResponseFuture<F, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl<F, D> ResponseFuture<F, D> {
    pub(crate) fn refused(budget: TurnBudget, refusal: BudgetExhausted, dialect: D) -> Self {
        Self {
            state: State::Refused {
                refusal: Some(refusal),
            },
            budget,
            pricing: None,
            attempts_before: 0,
            dialect,
        }
    }

    pub(crate) fn called(
        future: F,
        budget: TurnBudget,
        pricing: Option<Pricing>,
        attempts_before: u32,
        dialect: D,
    ) -> Self {
        Self {
            state: State::Called {
                future,
                sleep: None,
            },
            budget,
            pricing,
            attempts_before,
            dialect,
        }
    }
}

impl<F, D, ResBody, E> Future for ResponseFuture<F, D>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: Body<Data = Bytes>,
    D: Dialect,
{
    type Output = Result<Response<BudgetBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let outcome = match this.state.as_mut().project() {
            StateProj::Refused { refusal } => match refusal.take() {
                Some(refusal) => Ok(refused(this.dialect, this.budget, &refusal)),
                // Polled after completion.
                None => return Poll::Pending,
            },
            StateProj::Called { future, mut sleep } => {
                // The inner call first: an inner layer that answers at the
                // deadline (a failover layer stopping the turn with its own
                // error) is better than our bare error. The deadline is the
                // backstop for an inner that does not watch it.
                if let Poll::Ready(result) = future.poll(cx) {
                    if this.budget.attempts_used() == *this.attempts_before {
                        // Nobody inside counted an attempt: the call was one.
                        let _ = this.budget.try_begin_attempt();
                    }
                    result.map(|response| finish(response, this.budget, *this.pricing))
                } else {
                    // Made when the inner call first waits, inside the
                    // runtime; not at all when the inner layer said it
                    // answers by the deadline itself (said before it
                    // first waits without a bound).
                    if sleep.is_none() && !this.budget.watched_inside() {
                        sleep.set(Some(sleep_until(this.budget.deadline())));
                    }
                    let passed = sleep
                        .as_mut()
                        .as_pin_mut()
                        .is_some_and(|sleep| sleep.poll(cx).is_ready());
                    if !passed {
                        return Poll::Pending;
                    }
                    tracing::debug!(run_id = %crate::util::log_safe(this.budget.turn_id()), "turn deadline passed before the response head");
                    let deadline = DeadlineExceeded {
                        turn_id: this.budget.turn_id().clone(),
                        phase: Phase::Head,
                        limit: this.budget.time_limit(),
                        elapsed: this.budget.elapsed(),
                        body_bytes: 0,
                    };
                    Ok(answer(
                        this.dialect,
                        this.budget,
                        StatusCode::GATEWAY_TIMEOUT,
                        &ErrorReply::coded(
                            FailureClass::Timeout,
                            "turn_deadline_exceeded",
                            &deadline.to_string(),
                        ),
                    ))
                }
            }
            StateProj::Done => return Poll::Pending,
        };
        // Drops the inner call (and its connection) as soon as we are done.
        this.state.set(State::Done);
        Poll::Ready(outcome)
    }
}

fn finish<B: Body>(
    response: Response<B>,
    budget: &TurnBudget,
    pricing: Option<Pricing>,
) -> Response<BudgetBody<B>> {
    let (mut parts, body) = response.into_parts();
    if let (Some(pricing), Some(usage)) = (pricing, parts.extensions.get::<ReportedUsage>()) {
        budget.record_spend(
            pricing.cost(usage.input_tokens, usage.output_tokens),
            usage.estimated,
        );
    }
    // A failover layer inside has put the same turn's there already.
    if parts.extensions.get::<TurnBudget>().is_none() {
        parts.extensions.insert(budget.clone());
    }
    let body = BudgetBody::new(body, budget.clone());
    // An inner commit machine ends the stream at (or before) the deadline
    // with a terminal event: a timer here too could fire first and cut it.
    let body = match parts.extensions.get::<crate::time::EndsItselfAt>() {
        Some(ends) if ends.0 <= budget.deadline() => body.inner_owns_deadline(),
        _ => body,
    };
    Response::from_parts(parts, body)
}

/// A refused turn, answered in the dialect's shape: 402 for the spend
/// ceiling, 429 for attempts used up, 504 for a passed deadline.
fn refused<B, D: Dialect>(
    dialect: &D,
    budget: &TurnBudget,
    refusal: &BudgetExhausted,
) -> Response<BudgetBody<B>> {
    let message = refusal.to_string();
    let (status, class, code) = match refusal {
        BudgetExhausted::Spend { .. } => (
            StatusCode::PAYMENT_REQUIRED,
            FailureClass::QuotaExhausted,
            "spend_ceiling_reached",
        ),
        BudgetExhausted::Attempts { .. } => (
            StatusCode::TOO_MANY_REQUESTS,
            FailureClass::RateLimited,
            "turn_budget_exhausted",
        ),
        BudgetExhausted::TenantCeiling { .. } => (
            StatusCode::PAYMENT_REQUIRED,
            FailureClass::QuotaExhausted,
            "tenant_spend_ceiling_reached",
        ),
        BudgetExhausted::TenantRequired => (
            StatusCode::BAD_REQUEST,
            FailureClass::InvalidRequest,
            "tenant_required",
        ),
        BudgetExhausted::SpendStoreUnavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            FailureClass::Overloaded,
            "spend_store_unavailable",
        ),
        _ => (
            StatusCode::GATEWAY_TIMEOUT,
            FailureClass::Timeout,
            "turn_deadline_exceeded",
        ),
    };
    let mut response = answer(
        dialect,
        budget,
        status,
        &ErrorReply::coded(class, code, &message),
    );
    // The refused turn's line is logged under this id: the client can name it.
    if let Ok(value) = HeaderValue::from_str(budget.turn_id().as_str()) {
        response
            .headers_mut()
            .insert(crate::observe::TURN_ID_HEADER, value);
    }
    response
}

fn answer<B, D: Dialect>(
    dialect: &D,
    budget: &TurnBudget,
    status: StatusCode,
    reply: &ErrorReply<'_>,
) -> Response<BudgetBody<B>> {
    let mut response = dialect
        .error_response(status, reply)
        .map(|body| BudgetBody::whole(body, budget.clone()));
    response.extensions_mut().insert(budget.clone());
    response
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, Response};
    use http_body::{Body, Frame};
    use http_body_util::BodyExt;
    use tower::{ServiceBuilder, ServiceExt};

    use super::*;
    use crate::budget::{BudgetLayer, TurnBudget};
    use crate::time::EndsItselfAt;

    /// A body that never yields a frame (a stalled upstream).
    struct Stalled;

    impl Body for Stalled {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Pending
        }
    }

    /// Whether the budget layer cuts a stalled body at its deadline, when
    /// the response does (`marked`) or does not say its body ends itself.
    async fn cut_at_the_deadline(marked: bool) -> bool {
        let service = ServiceBuilder::new()
            .layer(BudgetLayer::new().deadline(Duration::from_secs(5)))
            .service(tower::service_fn(move |request: Request<()>| async move {
                let deadline = request
                    .extensions()
                    .get::<TurnBudget>()
                    .map(TurnBudget::deadline);
                let mut response = Response::new(Stalled);
                if let (true, Some(at)) = (marked, deadline) {
                    response.extensions_mut().insert(EndsItselfAt(at));
                }
                Ok::<_, Infallible>(response)
            }));
        let response = service
            .oneshot(Request::new(()))
            .await
            .unwrap_or_else(|e| match e {});
        let mut body = response.into_body();
        tokio::time::timeout(Duration::from_secs(6), body.frame())
            .await
            .is_ok()
    }

    /// One owner per deadline: a body that ends itself at the deadline (the
    /// commit machine, with its terminal event) is not cut here as well,
    /// where a timer for the same instant could fire first.
    #[tokio::test(start_paused = true)]
    async fn a_body_that_ends_itself_at_the_deadline_is_not_cut_here() {
        assert!(cut_at_the_deadline(false).await, "an unmarked body is cut");
        assert!(
            !cut_at_the_deadline(true).await,
            "a marked body is left to end itself"
        );
    }
}
