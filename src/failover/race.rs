//! Attempts running at once (a slow attempt and its hedges), polled in the
//! order they started: the first to come to an end is taken, and the
//! others are not polled again.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio::time::Instant;

use super::attempt::Outcome;
use super::ledger::{AttemptStart, InFlight};
use crate::Cost;
use crate::dialect::Dialect;
use crate::health::Admitted;

/// An attempt under way.
pub(super) struct Running<'a, F> {
    pub(super) index: usize,
    pub(super) start: AttemptStart,
    pub(super) admitted: Admitted,
    /// Records the attempt if it is dropped before it ends.
    pub(super) in_flight: InFlight<'a>,
    /// Started beside a slower attempt.
    pub(super) hedged: bool,
    /// Its cost estimate, reserved under the turn's spend ceiling while it
    /// runs.
    pub(super) estimate: Cost,
    pub(super) attempt: InSpan<F>,
}

/// A future polled and dropped within its span, as `tracing::Instrument`
/// would; apart from it so that the future is written straight into its
/// box: wrapped first, a turn's answer (about 2.6 KB) or an attempt (about
/// 2.1 KB) was built on the stack and moved twice. Boxed: attempts move in
/// and out of the race's list, and a turn's future stays small.
pub(super) struct InSpan<F> {
    span: tracing::Span,
    /// Always `Some` until dropped.
    future: Option<Pin<Box<F>>>,
}

impl<F: Future> InSpan<F> {
    pub(super) fn new(span: tracing::Span, future: Pin<Box<F>>) -> Self {
        Self {
            span,
            future: Some(future),
        }
    }

    fn poll_in_span(&mut self, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let _entered = self.span.enter();
        match &mut self.future {
            Some(future) => future.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        self.get_mut().poll_in_span(cx)
    }
}

impl<F> Drop for InSpan<F> {
    fn drop(&mut self) {
        // What the future does as it is dropped (an attempt closing its
        // connection, say) is within its span too.
        let _entered = self.span.enter();
        drop(self.future.take());
    }
}

/// What a race came to.
pub(super) enum Raced<B, D: Dialect> {
    /// Attempt `.0` (an index into the list) ended.
    Ended(usize, Outcome<B, D>),
    /// The hedge timer fired first.
    HedgeDue,
}

/// Polls `running` in start order, then the hedge timer, until one is
/// ready. An attempt's commit and its side effects (its record, its
/// charge) happen within the poll that returns it, so the first ready is
/// the only one that committed: when two could commit in the same poll,
/// the earlier attempt wins and the later one is never polled again.
pub(super) async fn race<F, B, D>(
    running: &mut [Running<'_, F>],
    hedge_at: Option<Instant>,
) -> Raced<B, D>
where
    F: Future<Output = Outcome<B, D>>,
    D: Dialect,
{
    let mut timer = std::pin::pin!(hedge_at.map(tokio::time::sleep_until));
    std::future::poll_fn(|cx| {
        for (at, running) in running.iter_mut().enumerate() {
            if let Poll::Ready(outcome) = running.attempt.poll_in_span(cx) {
                return Poll::Ready(Raced::Ended(at, outcome));
            }
        }
        match timer.as_mut().as_pin_mut().map(|sleep| sleep.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Raced::HedgeDue),
            _ => Poll::Pending,
        }
    })
    .await
}

impl<F> Running<'_, F> {
    /// Estimates reserved by attempts still running.
    pub(super) fn reserved(running: &[Self]) -> Cost {
        running
            .iter()
            .fold(Cost::ZERO, |sum, r| sum.saturating_add(r.estimate))
    }
}
