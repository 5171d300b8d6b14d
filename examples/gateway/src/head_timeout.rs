//! The header-read timeout of a served connection, kept by the connection
//! instead of by a timer per request.
//!
//! hyper's own `header_read_timeout` arms a timer for every request head it
//! waits for: on a kept-alive connection a boxed sleep, a timer-wheel entry
//! made and cleared, and a clock read per request (about 1.5k instructions
//! of the gateway's 70k per small completion, measured with `callgrind`;
//! the bookkeeping here costs 0.6k of it back).
//! Here the connection keeps one alarm for its whole life: [`HeadTimed`]
//! counts the requests its service is answering and notes when the last
//! answer ended, and [`HeadLimit`], around the socket, fails a read that
//! waits for a head past that moment plus the timeout. The alarm is set
//! once and moved only when it fires early (requests came since), so a
//! busy connection pays for it about once per timeout, not per request.
//!
//! What is timed is what hyper timed: the wait for a request head, from
//! the end of the previous answer (the connection's start for the first,
//! whose first byte the serve loop also waits for within the timeout), to
//! the whole head; a head trickled byte by byte is cut at the same moment
//! as one never sent. While a request is answered (its body read, its
//! answer streamed, however long) or a write waits for the client, nothing
//! is timed here: the body's read limits and the write-stall limit apply.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Why a connection was closed: no request head within the timeout.
/// Carried as the source of an [`io::Error`] of kind
/// [`TimedOut`](io::ErrorKind::TimedOut).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no request head within {} ms of the connection's start or last answer", .after.as_millis())]
#[non_exhaustive]
pub struct HeadTimedOut {
    /// The header-read timeout that passed.
    pub after: Duration,
}

/// What a connection's service and its socket share: how many requests
/// are being answered, and when the last answer ended.
#[derive(Debug)]
struct Idle {
    /// The connection's start: `idle_since` counts from it. The standard
    /// clock, read directly (tokio's goes through its test clock when that
    /// feature is on).
    epoch: Instant,
    /// Requests taken by the service whose answer has not ended.
    answering: AtomicUsize,
    /// Nanoseconds from `epoch` to the end of the last answer.
    idle_since: AtomicU64,
}

impl Idle {
    fn mark_idle(&self) {
        let since = Instant::now().saturating_duration_since(self.epoch);
        self.idle_since.store(
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// When the head now awaited must have come.
    fn head_deadline(&self, timeout: Duration) -> Instant {
        let since = Duration::from_nanos(self.idle_since.load(Ordering::Relaxed));
        let idle = self.epoch.checked_add(since).unwrap_or(self.epoch);
        // A timeout past what the clock can hold: a year is never reached.
        idle.checked_add(timeout)
            .or_else(|| idle.checked_add(Duration::from_secs(86_400 * 365)))
            .unwrap_or(idle)
    }
}

/// Makes the pair for one connection accepted at `accepted`: the socket's
/// [`HeadLimit`] and the service's [`HeadTimed`]. The first head is due
/// `timeout` after `accepted`; a zero timeout turns the limit off.
pub fn head_limit<T, S>(
    io: T,
    service: S,
    accepted: Instant,
    timeout: Duration,
) -> (HeadLimit<T>, HeadTimed<S>) {
    let idle = Arc::new(Idle {
        epoch: accepted,
        answering: AtomicUsize::new(0),
        idle_since: AtomicU64::new(0),
    });
    (
        HeadLimit {
            io,
            idle: Arc::clone(&idle),
            timeout,
            alarm: None,
            armed: None,
            write_waiting: false,
        },
        HeadTimed {
            inner: service,
            idle,
        },
    )
}

pin_project! {
    /// A served socket whose reads fail once a request head has been
    /// awaited for the timeout (see the module docs).
    #[derive(Debug)]
    pub struct HeadLimit<T> {
        #[pin]
        io: T,
        idle: Arc<Idle>,
        timeout: Duration,
        // Made by the first wait for a head; reset only when it fires.
        alarm: Option<Pin<Box<Sleep>>>,
        // The task the alarm wakes once it was polled `Pending` by it: polled
        // again by that task before it fired, it need not be polled at all.
        // A full poll swaps the waker and takes the timer's state, about
        // 0.5k instructions per request on a kept-alive connection.
        armed: Option<Waker>,
        // A write returned `Pending` and has not been taken since.
        write_waiting: bool,
    }
}

impl<T> HeadLimit<T> {
    /// The wrapped socket.
    pub fn get_ref(&self) -> &T {
        &self.io
    }
}

impl<T: AsyncRead> AsyncRead for HeadLimit<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        // Bytes in hand first: a head that came is never failed.
        let poll = this.io.poll_read(cx, buf);
        if poll.is_ready()
            || this.timeout.is_zero()
            || *this.write_waiting
            || this.idle.answering.load(Ordering::Relaxed) > 0
        {
            return poll;
        }
        let deadline = this.idle.head_deadline(*this.timeout);
        let alarm = this
            .alarm
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline.into())));
        // The alarm keeps an earlier deadline while requests come and go:
        // when it fires before the head's deadline it is moved there, once.
        loop {
            if !alarm.is_elapsed()
                && this
                    .armed
                    .as_ref()
                    .is_some_and(|task| task.will_wake(cx.waker()))
            {
                return Poll::Pending;
            }
            // Outside the task's coop budget: a `Sleep` polled with the
            // budget spent answers `Pending` without registering its timer,
            // and the alarm, marked armed, would never be polled again.
            let mut unconstrained = tokio::task::unconstrained(alarm.as_mut());
            if Pin::new(&mut unconstrained).poll(cx).is_pending() {
                *this.armed = Some(cx.waker().clone());
                return Poll::Pending;
            }
            // Within the timer's millisecond of the deadline counts as
            // past it: an alarm moved there could fire again at once.
            if deadline.saturating_duration_since(Instant::now()) < Duration::from_millis(1) {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    HeadTimedOut {
                        after: *this.timeout,
                    },
                )));
            }
            alarm.as_mut().reset(deadline.into());
            *this.armed = None;
        }
    }
}

impl<T: AsyncWrite> HeadLimit<T> {
    /// Notes whether a write waits for the client: a head is not timed
    /// while an answer is still going out, and its wait starts when the
    /// answer's last bytes are taken.
    fn note_write<R>(self: Pin<&mut Self>, poll: &Poll<io::Result<R>>) {
        let this = self.project();
        if poll.is_pending() {
            *this.write_waiting = true;
        } else if *this.write_waiting {
            *this.write_waiting = false;
            this.idle.mark_idle();
        }
    }
}

impl<T: AsyncWrite> AsyncWrite for HeadLimit<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = self.as_mut().project().io.poll_write(cx, buf);
        self.note_write(&poll);
        poll
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = self.as_mut().project().io.poll_write_vectored(cx, bufs);
        self.note_write(&poll);
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = self.as_mut().project().io.poll_flush(cx);
        self.note_write(&poll);
        poll
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

/// A connection's service, counting the requests it is answering: from
/// the call to the end of the answer's body (or the drop of either).
#[derive(Debug, Clone)]
pub struct HeadTimed<S> {
    inner: S,
    idle: Arc<Idle>,
}

/// One request being answered; its drop ends the answer.
#[derive(Debug)]
struct Answering(Arc<Idle>);

impl Answering {
    fn new(idle: &Arc<Idle>) -> Self {
        idle.answering.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(idle))
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        // Marked before the count falls: a read that sees no request
        // being answered sees this answer's end.
        self.0.mark_idle();
        self.0.answering.fetch_sub(1, Ordering::Release);
    }
}

impl<S, Req, B> tower::Service<Req> for HeadTimed<S>
where
    S: tower::Service<Req, Response = http::Response<B>>,
{
    type Response = http::Response<AnsweringBody<B>>;
    type Error = S::Error;
    type Future = HeadTimedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let answering = Answering::new(&self.idle);
        HeadTimedFuture {
            future: self.inner.call(request),
            answering: Some(answering),
        }
    }
}

pin_project! {
    /// [`HeadTimed`]'s future: the answer's body carries the count on.
    pub struct HeadTimedFuture<F> {
        #[pin]
        future: F,
        answering: Option<Answering>,
    }
}

impl<F, B, E> std::future::Future for HeadTimedFuture<F>
where
    F: std::future::Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<AnsweringBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.future.poll(cx));
        let answering = this.answering.take();
        Poll::Ready(response.map(|response| response.map(|body| AnsweringBody { body, answering })))
    }
}

pin_project! {
    /// An answer's body: the request counts as being answered until this
    /// ends or is dropped.
    pub struct AnsweringBody<B> {
        #[pin]
        body: B,
        answering: Option<Answering>,
    }
}

impl<B: Body<Data = Bytes>> Body for AnsweringBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.body.poll_frame(cx));
        if frame.is_none() {
            // Ended: the wait for the next head may start (hyper keeps the
            // body until it has written its end).
            this.answering.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
