//! [`ResponseFuture`] of the [`Budget`](super::Budget) service.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::{Sleep, sleep_until};

use crate::classify::Phase;

use super::body::BudgetBody;
use super::cost::{Pricing, ReportedUsage};
use super::error::{BudgetError, DeadlineExceeded};
use super::turn::{BudgetExhausted, TurnBudget};

pin_project! {
    /// Response future of [`Budget`](super::Budget): the inner call raced
    /// against the turn's deadline.
    ///
    /// On a response head it records the response's cost (when the layer
    /// has a [`Pricing`] and the response carries a [`ReportedUsage`]),
    /// puts the [`TurnBudget`] into the response extensions and wraps the
    /// body in a [`BudgetBody`].
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        budget: TurnBudget,
        pricing: Option<Pricing>,
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

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn refused(budget: TurnBudget, refusal: BudgetExhausted) -> Self {
        Self {
            state: State::Refused {
                refusal: Some(refusal),
            },
            budget,
            pricing: None,
        }
    }

    pub(crate) fn called(future: F, budget: TurnBudget, pricing: Option<Pricing>) -> Self {
        Self {
            state: State::Called {
                future,
                sleep: None,
            },
            budget,
            pricing,
        }
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: Body,
{
    type Output = Result<Response<BudgetBody<ResBody>>, BudgetError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let outcome = match this.state.as_mut().project() {
            StateProj::Refused { refusal } => match refusal.take() {
                Some(refusal) => Err(BudgetError::Exhausted(refusal)),
                // Polled after completion.
                None => return Poll::Pending,
            },
            StateProj::Called { future, mut sleep } => {
                if sleep.is_none() {
                    sleep.set(Some(sleep_until(this.budget.deadline())));
                }
                // The inner call first: an inner layer that answers at the
                // deadline (a failover layer stopping the turn with its own
                // error) is better than our bare error. The deadline is the
                // backstop for an inner that does not watch it.
                if let Poll::Ready(result) = future.poll(cx) {
                    match result {
                        Ok(response) => Ok(finish(response, this.budget, *this.pricing)),
                        Err(error) => Err(BudgetError::Inner(error)),
                    }
                } else if sleep
                    .as_mut()
                    .as_pin_mut()
                    .is_some_and(|sleep| sleep.poll(cx).is_ready())
                {
                    tracing::debug!(run_id = %this.budget.run_id(), "turn deadline passed before the response head");
                    Err(BudgetError::Deadline(DeadlineExceeded {
                        run_id: this.budget.run_id().clone(),
                        phase: Phase::Head,
                        limit: this.budget.time_limit(),
                        elapsed: this.budget.elapsed(),
                        body_bytes: 0,
                    }))
                } else {
                    return Poll::Pending;
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
        budget.record_spend(pricing.cost_of(usage), usage.estimated);
    }
    parts.extensions.insert(budget.clone());
    let body = if parts
        .extensions
        .get::<crate::stream::StreamState>()
        .is_some()
    {
        BudgetBody::deadline_enforced_inside(body, budget.clone())
    } else {
        BudgetBody::new(body, budget.clone())
    };
    Response::from_parts(parts, body)
}
