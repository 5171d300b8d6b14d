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
        // Set when the body first has to wait: a body nobody reads is not
        // timed, and frames ready at once (a small body comes with its
        // head) take no time, nor a clock read.
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
                let started = *this.started.get_or_insert_with(Instant::now);
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

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::pin::pin;

    use super::*;

    /// A body with one frame ready, then nothing (and no wake-up: the test
    /// polls it itself).
    struct OneFrameThenWaits(Option<Bytes>);

    impl Body for OneFrameThenWaits {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.0.take() {
                Some(bytes) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                None => Poll::Pending,
            }
        }
    }

    /// The read timeout runs from the first time the reader waits: a frame
    /// that was there at once took the client no time, however long the
    /// reader took before it read on.
    #[tokio::test(start_paused = true)]
    async fn the_read_timeout_runs_from_the_first_wait_not_from_frames_ready_at_once() {
        let limits = ReadLimits {
            timeout: Some(Duration::from_secs(5)),
            ..ReadLimits::new()
        };
        let first = Bytes::from_static(b"{\"model\":");
        let mut body = pin!(ReadLimitBody::new(OneFrameThenWaits(Some(first)), limits));
        let mut poll = async || poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await;
        match poll().await {
            Poll::Ready(Some(Ok(frame))) => assert_eq!(frame.data_ref().map(Bytes::len), Some(9)),
            other => panic!("the ready frame, not {other:?}"),
        }
        // The reader is busy for longer than the timeout before it reads on.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(poll().await.is_pending(), "the first wait starts the clock");
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(poll().await.is_pending(), "4 s into the wait");
        tokio::time::sleep(Duration::from_secs(2)).await;
        match poll().await {
            Poll::Ready(Some(Err(error))) => assert_eq!(
                error.downcast_ref::<ReadLimitError>(),
                Some(&ReadLimitError::Timeout(Duration::from_secs(5)))
            ),
            other => panic!("the timeout 6 s into the wait, not {other:?}"),
        }
    }
}
