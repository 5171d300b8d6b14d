//! Telling every open connection that the gateway is shutting down, at no
//! shared write per poll.
//!
//! hyper-util's `GracefulShutdown` hands each connection a receiver of one
//! `tokio::sync::watch` channel, and polls its `changed()` at every poll of
//! the connection: a lock of the channel's `Notify` taken and released
//! each time (six atomic read-modify-writes more per small completion, on
//! lock words that every shard writes). [`Drain`] keeps the signal in a
//! flag that connections only read: a connection registers its waker with
//! the `Notify` once (again only if the waker polling it changes), and
//! afterwards each poll is a load of the flag.
//!
//! A connection told to drain gets hyper's `graceful_shutdown`: an idle
//! keep-alive connection closes at once, one answering a request closes
//! after its answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::HttpService;
use pin_project_lite::pin_project;
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tower_llm_failover::BoxError;

/// The shutdown signal of a server's connections (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct Drain {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    draining: AtomicBool,
    notify: Arc<Notify>,
}

impl Drain {
    /// A signal not yet given.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Tells every connection watched, now or later, to drain.
    pub(crate) fn start(&self) {
        // The flag first: a connection that registers after the wake-ups
        // below reads it (see `Drained::poll`).
        self.shared.draining.store(true, Ordering::SeqCst);
        self.shared.notify.notify_waiters();
    }

    /// `conn`, told to drain when [`start`](Self::start) is called.
    pub(crate) fn watch<C: Graceful>(&self, conn: C) -> Drained<C> {
        Drained {
            conn,
            // Created here, it sees every `notify_waiters` from now on,
            // polled or not.
            notified: Arc::clone(&self.shared.notify).notified_owned(),
            shared: Arc::clone(&self.shared),
            registered: None,
            told: false,
        }
    }
}

/// A connection that can finish what it is answering and then close.
pub(crate) trait Graceful: Future {
    /// Starts closing: at once when idle, after the answer in progress
    /// otherwise.
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> Graceful for http1::Connection<I, S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: Body + 'static,
    B::Error: Into<BoxError>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        http1::Connection::graceful_shutdown(self);
    }
}

pin_project! {
    /// A connection watched by a [`Drain`]: polls as the connection does.
    pub(crate) struct Drained<C> {
        #[pin]
        conn: C,
        #[pin]
        notified: OwnedNotified,
        shared: Arc<Shared>,
        // The waker the `Notify` holds for this connection.
        registered: Option<Waker>,
        told: bool,
    }
}

impl<C: Graceful> Future for Drained<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if !*this.told {
            let current = this
                .registered
                .as_ref()
                .is_some_and(|waker| waker.will_wake(cx.waker()));
            let draining = if current {
                // The `Notify` wakes this very waker at the signal: the
                // flag alone says whether it came.
                this.shared.draining.load(Ordering::Acquire)
            } else {
                // (Re)registered, then the flag read: a signal given
                // before the registration is in the flag, one given after
                // it wakes this waker.
                match this.notified.as_mut().poll(cx) {
                    Poll::Ready(()) => true,
                    Poll::Pending => {
                        *this.registered = Some(cx.waker().clone());
                        this.shared.draining.load(Ordering::SeqCst)
                    }
                }
            };
            if draining {
                *this.told = true;
                this.conn.as_mut().graceful_shutdown();
            }
        }
        this.conn.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    /// A stand-in connection: counts its drain calls, and ends once told
    /// to drain.
    #[derive(Default)]
    struct Conn {
        told: usize,
    }

    impl Future for Conn {
        type Output = usize;
        fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<usize> {
            if self.told > 0 {
                Poll::Ready(self.told)
            } else {
                Poll::Pending
            }
        }
    }

    impl Graceful for Conn {
        fn graceful_shutdown(mut self: Pin<&mut Self>) {
            self.told += 1;
        }
    }

    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll_with<F: Future + Unpin>(future: &mut F, wakes: &Arc<Wakes>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::clone(wakes));
        Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_registered_connection_is_woken_and_told_once() {
        let drain = Drain::new();
        let mut conn = Box::pin(drain.watch(Conn::default()));
        let wakes = Arc::new(Wakes::default());
        for _ in 0..3 {
            assert!(poll_with(&mut conn, &wakes).is_pending());
        }
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        drain.start();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the signal wakes it");
        assert_eq!(poll_with(&mut conn, &wakes), Poll::Ready(1), "told once");
    }

    #[test]
    fn a_connection_watched_after_the_signal_is_told_at_its_first_poll() {
        let drain = Drain::new();
        drain.start();
        let mut conn = Box::pin(drain.watch(Conn::default()));
        let wakes = Arc::new(Wakes::default());
        assert_eq!(poll_with(&mut conn, &wakes), Poll::Ready(1));
    }

    #[test]
    fn a_connection_polled_by_a_new_waker_is_woken_through_it() {
        let drain = Drain::new();
        let mut conn = Box::pin(drain.watch(Conn::default()));
        let first = Arc::new(Wakes::default());
        let second = Arc::new(Wakes::default());
        assert!(poll_with(&mut conn, &first).is_pending());
        assert!(poll_with(&mut conn, &second).is_pending());
        drain.start();
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1, "the waker polling last");
        assert_eq!(poll_with(&mut conn, &second), Poll::Ready(1));
    }

    #[test]
    fn every_connection_is_told_and_none_before_the_signal() {
        let drain = Drain::new();
        let wakes = Arc::new(Wakes::default());
        let mut conns: Vec<_> = (0..4)
            .map(|_| Box::pin(drain.watch(Conn::default())))
            .collect();
        for conn in &mut conns {
            assert!(poll_with(conn, &wakes).is_pending());
            assert!(poll_with(conn, &wakes).is_pending());
        }
        drain.start();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 4);
        for conn in &mut conns {
            assert_eq!(poll_with(conn, &wakes), Poll::Ready(1));
        }
    }
}
