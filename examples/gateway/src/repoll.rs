//! A connection future polled again at once when it wakes its own task.
//!
//! hyper's server hands a request body to the service through a channel
//! whose sender is the connection's own dispatcher: when the handler reads
//! the body, the channel wakes the sender, which is the very task doing the
//! reading. Tokio treats a task woken during its own poll as a yield: it
//! goes to the back of the run queue and an idle worker is woken to steal
//! it. That moved almost every request from one worker to the other (one
//! futex wake and wait per small completion, both workers busy at one
//! connection, found with `gdb` on `parking_lot`'s `notify_one_slow`);
//! a bare pass-through, whose request body is read by the upstream
//! connection's task, stays on one worker.
//!
//! [`Repoll`] gives the inner future a waker of its own. A wake-up that
//! comes while the inner future is being polled only marks it, and the
//! inner future is polled again before this poll returns, a bounded number
//! of times; any other wake-up goes to the task as usual.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// How often the inner future is polled again within one poll before the
/// wake-up goes to the runtime after all, so that a future that keeps
/// waking itself (hyper's own yield after many requests in a row, an
/// exhausted cooperative budget) still lets other tasks run.
const MAX_REPOLLS: usize = 4;

pin_project_lite::pin_project! {
    /// Polls `inner` again at once when it woke its own task while being
    /// polled, instead of yielding to the runtime (see the module docs).
    pub struct Repoll<F> {
        #[pin]
        inner: F,
        wakes: Arc<Wakes>,
        waker: Waker,
    }
}

/// What the inner future's waker records.
struct Wakes {
    /// Set while the inner future is being polled.
    polling: AtomicBool,
    /// Set by every wake-up.
    woken: AtomicBool,
    /// The task's own waker, for wake-ups between polls.
    task: AtomicWaker,
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Marked first: a poll that has just ended sees the mark (and polls
        // again) or this sees it ended (and wakes the task); both may
        // happen, neither is lost.
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl<F> Repoll<F> {
    /// Wraps `inner`; one allocation, for the waker.
    pub fn new(inner: F) -> Self {
        let wakes = Arc::new(Wakes {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(Arc::clone(&wakes));
        Repoll {
            inner,
            wakes,
            waker,
        }
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        this.wakes.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(this.waker);
        for _ in 0..=MAX_REPOLLS {
            // Plain stores (a sequentially consistent one is a locked
            // instruction on x86, about 20 cycles): a wake-up on this
            // thread sees them in program order; one from another thread
            // that reads them stale wakes the task, as without `Repoll`.
            // Only the end of the poll needs the full order against a
            // wake-up's mark (below and in `wake_by_ref`).
            this.wakes.woken.store(false, Ordering::Relaxed);
            this.wakes.polling.store(true, Ordering::Release);
            let poll = this.inner.as_mut().poll(&mut inner_cx);
            this.wakes.polling.store(false, Ordering::SeqCst);
            if poll.is_ready() {
                return poll;
            }
            if !this.wakes.woken.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wake-ups the runtime would get.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Pending, waking itself, `times` times; then ready with its polls.
    struct WakesItself {
        times: usize,
        polls: usize,
    }

    impl Future for WakesItself {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.times {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn poll_once<F: Future + Unpin>(future: &mut F, count: &Arc<Count>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::clone(count));
        Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_wake_during_the_poll_is_a_poll_again_not_a_yield() {
        let count = Arc::new(Count::default());
        let mut future = Repoll::new(WakesItself { times: 2, polls: 0 });
        assert_eq!(poll_once(&mut future, &count), Poll::Ready(3));
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "the task was not woken");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_after_the_bound() {
        let count = Arc::new(Count::default());
        let mut future = Repoll::new(WakesItself {
            times: usize::MAX,
            polls: 0,
        });
        assert_eq!(poll_once(&mut future, &count), Poll::Pending);
        assert_eq!(future.inner.polls, MAX_REPOLLS + 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken once, to yield");
    }

    // The commit body's join yields with tokio's deferred wake-up, which
    // must still let the runtime's other tasks run first; a plain
    // self-wake is polled again before them.
    #[tokio::test]
    async fn a_deferred_yield_still_lets_other_tasks_run_first() {
        let other_ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&other_ran);
        let _other = tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
        let seen = Repoll::new(async {
            tokio::task::yield_now().await;
            other_ran.load(Ordering::SeqCst)
        })
        .await;
        assert!(seen, "the other task ran during the yield");
    }

    #[tokio::test]
    async fn a_plain_self_wake_is_polled_again_before_other_tasks() {
        let other_ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&other_ran);
        let _other = tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
        let mut woke = false;
        let seen = Repoll::new(std::future::poll_fn(|cx| {
            if !woke {
                woke = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(other_ran.load(Ordering::SeqCst))
        }))
        .await;
        assert!(!seen, "polled again at once");
    }

    #[test]
    fn a_wake_between_polls_reaches_the_task() {
        /// Pending until its waker, kept, is used from outside.
        #[derive(Default)]
        struct Waits {
            waker: Option<Waker>,
            polls: usize,
        }
        impl Future for Waits {
            type Output = ();
            fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                self.polls += 1;
                if self.polls > 1 {
                    return Poll::Ready(());
                }
                self.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
        let count = Arc::new(Count::default());
        let mut future = Repoll::new(Waits::default());
        assert_eq!(poll_once(&mut future, &count), Poll::Pending);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        let waker = future
            .inner
            .waker
            .take()
            .unwrap_or_else(|| Waker::noop().clone());
        std::thread::spawn(move || waker.wake()).join().ok();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the task was woken");
        assert_eq!(poll_once(&mut future, &count), Poll::Ready(()));
    }
}
