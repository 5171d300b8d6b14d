//! [`BudgetBody`]: a response body that ends at the turn's deadline.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::Phase;

use super::turn::TurnBudget;
use crate::BoxError;
use crate::DeadlineExceeded;
use crate::time::Alarm;

pin_project! {
    /// A response body that ends with a boxed [`DeadlineExceeded`] when the
    /// turn's deadline passes mid-stream, so a stream layer outside can
    /// close the stream cleanly (a terminal chunk) instead of leaving the
    /// client on a silent connection.
    ///
    /// Frames pass through unchanged, and the inner body is polled first:
    /// a stream inspector inside that ends the stream at the same deadline
    /// (with a terminal event) wins over the bare error here. When the
    /// response says its body ends itself at the deadline (the commit
    /// machine marks the responses it inspects with the turn's deadline),
    /// no timer is armed here at all: one owner per deadline. After the
    /// deadline error the inner body is dropped (releasing the upstream
    /// connection) and the body reports its end.
    ///
    /// A refused turn's answer is a whole body of its own.
    pub struct BudgetBody<B> {
        #[pin]
        inner: Option<B>,
        // A refused turn's error answer.
        whole: Option<Bytes>,
        // Made on first poll, inside the runtime.
        alarm: Option<Alarm>,
        budget: TurnBudget,
        body_bytes: u64,
        // The inner body ends itself at the deadline with a terminal
        // event: it alone owns the deadline, no alarm is armed here.
        inner_owns_deadline: bool,
    }
}

impl<B> BudgetBody<B> {
    /// Wrap `inner` so it ends at `budget`'s deadline.
    pub(crate) fn new(inner: B, budget: TurnBudget) -> Self {
        Self {
            inner: Some(inner),
            whole: None,
            alarm: None,
            budget,
            body_bytes: 0,
            inner_owns_deadline: false,
        }
    }

    /// Leaves the deadline to the inner body, which ends itself then with
    /// a terminal event (see [`EndsItselfAt`](crate::time::EndsItselfAt)).
    pub(crate) fn inner_owns_deadline(mut self) -> Self {
        self.inner_owns_deadline = true;
        self
    }

    /// A whole body (a refused turn's error answer), no inner body.
    pub(crate) fn whole(bytes: Bytes, budget: TurnBudget) -> Self {
        Self {
            inner: None,
            whole: Some(bytes),
            alarm: None,
            budget,
            body_bytes: 0,
            inner_owns_deadline: false,
        }
    }
}

impl<B> std::fmt::Debug for BudgetBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetBody")
            .field("turn_id", self.budget.turn_id())
            .field("ended", &self.inner.is_none())
            .field("body_bytes", &self.body_bytes)
            .finish_non_exhaustive()
    }
}

/// The error is boxed (as tower-http's timeout body does) so any inner
/// body's error, boxed or not, passes through; a deadline is a boxed
/// [`DeadlineExceeded`], found with [`DeadlineExceeded::find_in`].
impl<B> Body for BudgetBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if let Some(bytes) = this.whole.take() {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        if this.inner.is_none() {
            return Poll::Ready(None);
        }
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        // The body first: what is ready (an error body written at the
        // deadline, a frame already here) goes out; the deadline cuts a body
        // that makes the client wait past it.
        let frame = match inner.poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending if *this.inner_owns_deadline => return Poll::Pending,
            Poll::Pending => {
                let alarm = this
                    .alarm
                    .get_or_insert_with(|| Alarm::at(this.budget.deadline()));
                if alarm.poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.inner.set(None);
                *this.alarm = None;
                // Bytes that went out cannot be taken back: from then on
                // only ending the stream is legal.
                let phase = if *this.body_bytes == 0 {
                    Phase::Preamble
                } else {
                    Phase::Committed
                };
                tracing::debug!(run_id = %crate::util::log_safe(this.budget.turn_id()), body_bytes = *this.body_bytes, "turn deadline passed mid-stream");
                return Poll::Ready(Some(Err(Box::new(DeadlineExceeded {
                    turn_id: this.budget.turn_id().clone(),
                    phase,
                    limit: this.budget.time_limit(),
                    elapsed: this.budget.elapsed(),
                    body_bytes: *this.body_bytes,
                }))));
            }
        };
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            *this.body_bytes = this.body_bytes.saturating_add(data.len() as u64);
        }
        Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.whole.is_none() && self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.whole, &self.inner) {
            (Some(bytes), _) => SizeHint::with_exact(bytes.len() as u64),
            (None, Some(inner)) => inner.size_hint(),
            (None, None) => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
impl<B> BudgetBody<B> {
    /// The turn this body belongs to.
    pub(crate) fn budget(&self) -> &TurnBudget {
        &self.budget
    }
}
