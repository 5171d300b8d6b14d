//! [`WriteStallLimit`]: an accepted connection whose peer must keep taking
//! the bytes written to it.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::time::{Alarm, later};

/// Why a write to a connection was failed: the peer took no bytes for
/// `after` while a write was waiting. Carried as the source of an
/// [`io::Error`] of kind [`TimedOut`](io::ErrorKind::TimedOut).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the peer took no bytes for {} ms while a write was waiting", .after.as_millis())]
#[non_exhaustive]
pub struct WriteStalled {
    /// The stall timeout that was exceeded.
    pub after: Duration,
}

impl WriteStalled {
    /// Finds a write stall in an error's `source()` chain (hyper and the
    /// serve loop around it wrap the `io::Error`).
    pub fn find_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut current = Some(error);
        // Chains are short; the bound only guards against a cycle.
        for _ in 0..32 {
            let e = current?;
            if let Some(found) = e.downcast_ref::<Self>() {
                return Some(found);
            }
            // `io::Error` hides its custom payload from `source()`; look
            // inside it as well.
            if let Some(found) = e
                .downcast_ref::<io::Error>()
                .and_then(io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<Self>())
            {
                return Some(found);
            }
            current = e.source();
        }
        None
    }

    fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, self)
    }
}

pin_project! {
    /// An accepted connection whose writes fail once the peer has taken no
    /// bytes for the stall timeout while there were bytes to write.
    ///
    /// hyper writes a response only as fast as the client reads it, and
    /// stops polling the response body once the socket's buffers are full.
    /// A client that asks for a long stream and never reads therefore
    /// holds the stream, its upstream connection and its in-flight slot
    /// for ever: no timer inside the body runs while nobody polls it. This
    /// wrapper times the socket instead. When a write (or a flush, or a
    /// shutdown) has returned `Pending` for longer than the timeout, with
    /// no byte taken since, the next poll fails with an [`io::Error`] of
    /// kind [`TimedOut`](io::ErrorKind::TimedOut) whose source is
    /// [`WriteStalled`]. hyper then closes the connection and drops the
    /// response body: the failover body, its upstream connection and the
    /// slot of [`InFlightLimitLayer`](super::InFlightLimitLayer) go with
    /// it, and the turn ends as cancelled.
    ///
    /// The timer is armed by the first write that returns `Pending` and
    /// wakes the writing task when it fires, so the writer polls again and
    /// meets the error even when nothing else would wake it. A write that
    /// makes progress ends the stall; a slow reader that keeps taking bytes
    /// is never cut, however slow. Reads pass through untouched (a client
    /// that sends but does not read still stalls). Writes are delegated as
    /// they come, vectored ones included: nothing is copied or buffered.
    ///
    /// A zero timeout turns the limit off: the wrapper only delegates.
    ///
    /// # With hyper's (or hyper-util's) serve loop
    ///
    /// Wrap the accepted socket before handing it to hyper. axum's own
    /// [`serve`] takes a listener and gives no hook for the socket, so an
    /// axum router is served with the same loop (`TowerToHyperService`):
    ///
    /// [`serve`]: https://docs.rs/axum/0.8/axum/fn.serve.html
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// use hyper::server::conn::http1;
    /// use hyper_util::rt::{TokioIo, TokioTimer};
    /// use hyper_util::service::TowerToHyperService;
    /// use tower_llm_failover::limit::{WriteStallLimit, WriteStalled};
    ///
    /// # async fn run(router: axum::Router) -> std::io::Result<()> {
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    /// loop {
    ///     let (tcp, _peer) = listener.accept().await?;
    ///     // A client that takes no bytes for 30 s loses its connection.
    ///     let io = TokioIo::new(WriteStallLimit::new(tcp, Duration::from_secs(30)));
    ///     let service = TowerToHyperService::new(router.clone());
    ///     tokio::spawn(async move {
    ///         let conn = http1::Builder::new()
    ///             .timer(TokioTimer::new())
    ///             .serve_connection(io, service);
    ///         if let Err(error) = conn.await {
    ///             if WriteStalled::find_in(&error).is_some() {
    ///                 // The client stopped reading; its response was dropped.
    ///             }
    ///         }
    ///     });
    /// }
    /// # }
    /// ```
    #[derive(Debug)]
    pub struct WriteStallLimit<T> {
        #[pin]
        io: T,
        timeout: Duration,
        // Created by the first stall: a connection whose writes never wait
        // costs no timer.
        alarm: Option<Alarm>,
        // A write has been waiting since the alarm was set, with no byte
        // taken since.
        stalled: bool,
    }
}

impl<T> WriteStallLimit<T> {
    /// Wraps `io`: its writes fail once the peer has taken no bytes for
    /// `timeout` while there were bytes to write (zero: never).
    pub fn new(io: T, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            alarm: None,
            stalled: false,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// The wrapped connection, mutably (writing through it bypasses the
    /// stall timer).
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.io
    }

    /// The wrapped connection.
    pub fn into_inner(self) -> T {
        self.io
    }
}

impl<T: AsyncWrite> WriteStallLimit<T> {
    /// Runs a write (flush, shutdown) on the inner I/O and judges its
    /// answer: `progress` says whether a `Ready(Ok)` means bytes were
    /// taken, which ends the stall; `Pending` starts or continues it and
    /// fails it once the timeout passed.
    fn poll_with<R>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        op: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<R>>,
        progress: impl FnOnce(&R) -> bool,
    ) -> Poll<io::Result<R>> {
        let this = self.project();
        // The inner write first: a write the peer takes now is never failed
        // for an earlier wait.
        let poll = op(this.io, cx);
        if this.timeout.is_zero() {
            return poll;
        }
        match poll {
            Poll::Pending => {
                if !*this.stalled {
                    *this.stalled = true;
                    let deadline = later(Instant::now(), *this.timeout);
                    match this.alarm {
                        Some(alarm) => alarm.reset(deadline),
                        None => *this.alarm = Some(Alarm::at(deadline)),
                    }
                }
                // Polled here so that the timer wakes this task: the writer
                // polls again and meets the error.
                match this.alarm.as_mut().map(|alarm| alarm.poll(cx)) {
                    Some(Poll::Ready(())) => Poll::Ready(Err(WriteStalled {
                        after: *this.timeout,
                    }
                    .into_io())),
                    _ => Poll::Pending,
                }
            }
            Poll::Ready(Ok(done)) => {
                if progress(&done) {
                    // The stall is over. The alarm is left as it is: if it
                    // fires, the task is woken once for nothing, which is
                    // cheaper than moving the timer on every write.
                    *this.stalled = false;
                }
                Poll::Ready(Ok(done))
            }
            // An error is no progress but no wait either: the caller sees
            // it as it is.
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
        }
    }
}

impl<T: AsyncRead> AsyncRead for WriteStallLimit<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

impl<T: AsyncWrite> AsyncWrite for WriteStallLimit<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            // Nothing to write, so nothing can stall.
            return self.project().io.poll_write(cx, buf);
        }
        self.poll_with(cx, |io, cx| io.poll_write(cx, buf), |&n| n > 0)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if bufs.iter().all(|buf| buf.is_empty()) {
            return self.project().io.poll_write_vectored(cx, bufs);
        }
        self.poll_with(cx, |io, cx| io.poll_write_vectored(cx, bufs), |&n| n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A flush that completes leaves nothing waiting (a buffering inner
        // stream, TLS say, wrote it all); one that waits is a stall.
        self.poll_with(cx, |io, cx| io.poll_flush(cx), |()| true)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A shutdown waits only to write what is left (TLS's close_notify):
        // a peer that takes nothing must not hold the close either.
        self.poll_with(cx, |io, cx| io.poll_shutdown(cx), |()| true)
    }
}
