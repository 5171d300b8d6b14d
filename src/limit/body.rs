use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use super::ReadLimits;
use crate::BoxError;

/// Why reading a request body was stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadLimitError {
    /// The body was not complete within the total read timeout.
    #[error("the request body was not received within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The body arrived slower than the minimum rate.
    #[error("the request body arrived slower than {0} bytes per second")]
    TooSlow(u64),
}

impl ReadLimitError {
    /// Finds a read-limit error in an error's `source()` chain (a body
    /// error is often wrapped by whoever read the body).
    pub fn find_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut current = Some(error);
        // Chains are short; the bound only guards against a cycle.
        for _ in 0..32 {
            let e = current?;
            if let Some(found) = e.downcast_ref::<Self>() {
                return Some(found);
            }
            current = e.source();
        }
        None
    }
}

pin_project! {
    /// A request body read under [`ReadLimits`] (see
    /// [`ReadLimitLayer`](super::ReadLimitLayer)).
    pub struct ReadLimitBody<B> {
        #[pin]
        inner: B,
        limits: ReadLimits,
        // Set at the first poll: a body nobody reads is not timed.
        started: Option<Instant>,
        read: u64,
        // Armed at the earliest instant a limit could be broken and
        // re-armed from the byte count only when it fires, so a frame
        // costs no timer-wheel work.
        timer: Option<Pin<Box<Sleep>>>,
        failed: bool,
    }
}

impl<B> std::fmt::Debug for ReadLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadLimitBody")
            .field("limits", &self.limits)
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

impl<B> ReadLimitBody<B> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: B, limits: ReadLimits) -> Self {
        Self {
            inner,
            limits,
            started: None,
            read: 0,
            timer: None,
            failed: false,
        }
    }
}

/// When the body breaks a limit if no more bytes come, and which limit.
fn due(limits: &ReadLimits, started: Instant, read: u64) -> Option<(Instant, ReadLimitError)> {
    let total = limits
        .timeout
        .map(|t| (crate::time::later(started, t), ReadLimitError::Timeout(t)));
    // A rate of zero checks nothing (and divides by nothing).
    let rate = limits
        .min_bytes_per_second
        .filter(|rate| *rate > 0)
        .map(|rate| {
            // `read / rate` seconds of credit, in nanoseconds without overflow.
            let credit_ns = u128::from(read) * 1_000_000_000 / u128::from(rate);
            let credit = Duration::from_nanos(u64::try_from(credit_ns).unwrap_or(u64::MAX));
            (
                crate::time::later(started, limits.grace.saturating_add(credit)),
                ReadLimitError::TooSlow(rate),
            )
        });
    match (total, rate) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

impl<B> Body for ReadLimitBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if *this.failed {
            return Poll::Ready(None);
        }
        let started = *this.started.get_or_insert_with(Instant::now);
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    *this.read += data.remaining() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => {
                *this.timer = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let Some((at, error)) = due(this.limits, started, *this.read) else {
                    return Poll::Pending;
                };
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if Instant::now() >= at {
                    *this.failed = true;
                    tracing::info!(%error, read = *this.read, "request body read stopped");
                    return Poll::Ready(Some(Err(error.into())));
                }
                // Bytes came since it was armed: wait for the new due time.
                timer.as_mut().reset(at);
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        *this.failed = true;
                        Poll::Ready(Some(Err(error.into())))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// A response body that holds its request's in-flight slot until it
    /// ends or is dropped (see [`InFlightLimitLayer`](super::InFlightLimitLayer)).
    pub struct InFlightBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

impl<B> InFlightBody<B> {
    pub(crate) fn admitted(body: B, permit: Option<OwnedSemaphorePermit>) -> Self {
        Self {
            kind: Kind::Admitted { body, permit },
        }
    }

    pub(crate) fn shed(body: Option<Bytes>) -> Self {
        Self {
            kind: Kind::Shed { body },
        }
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // The inner service's body, holding the slot.
        Admitted {
            #[pin]
            body: B,
            permit: Option<OwnedSemaphorePermit>,
        },
        // The shed answer.
        Shed {
            body: Option<Bytes>,
        },
    }
}

impl<B> std::fmt::Debug for InFlightBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            Kind::Admitted { .. } => f.write_str("InFlightBody::Admitted"),
            Kind::Shed { .. } => f.write_str("InFlightBody::Shed"),
        }
    }
}

impl<B> Body for InFlightBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Admitted { body, permit } => {
                let frame = std::task::ready!(body.poll_frame(cx));
                if frame.is_none() {
                    // The stream is over: the slot is free before the
                    // connection drops the body.
                    permit.take();
                }
                Poll::Ready(frame)
            }
            KindProj::Shed { body } => Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Admitted { body, .. } => body.is_end_stream(),
            Kind::Shed { body } => body.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Admitted { body, .. } => body.size_hint(),
            Kind::Shed { body } => {
                SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
