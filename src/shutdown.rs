//! Ending running streams when the gateway stops.
//!
//! A graceful shutdown stops accepting and lets running streams finish
//! within a grace period. A stream still running when the grace period ends
//! must not be cut mid-body (the client would see a broken answer and blame
//! the network): [`Shutdown::end_streams`] ends every stream inspected with
//! the signal the way any post-commit failure ends, with the dialect's
//! terminal event (class [`Shutdown`](crate::FailureClass::Shutdown))
//! in the stream's [`TerminalMode`](crate::dialect::TerminalMode). What that
//! event is belongs to the dialect: for OpenAI chat, a terminal chunk and
//! `[DONE]`; for Anthropic Messages, an `event: error` and no end marker
//! after it (`message_stop` would mean success). A stream still held back
//! before its commit point fails its attempt with the same class, which
//! never reroutes, so the client gets a clean error before any output.
//!
//! A turn given the signal through
//! [`FailoverBuilder::shutdown`](crate::failover::FailoverBuilder::shutdown)
//! that has not answered yet (waiting for a response head, or sleeping in
//! backoff between attempts) answers at once with the dialect's `503` error,
//! class and code `shutdown`, and tries no other target. Only a layer given
//! the signal sees it: a turn behind a [`StreamStateLayer`](crate::stream::StreamStateLayer)
//! alone is cut with its connection.
//!
//! The signal is dialect-generic: give one to
//! [`FailoverBuilder::shutdown`](crate::failover::FailoverBuilder::shutdown)
//! or [`StreamStateLayer::shutdown`](crate::stream::StreamStateLayer::shutdown)
//! and call [`end_streams`](Shutdown::end_streams) when the grace period
//! is over; then give the connections a moment to write the terminal event
//! before dropping them.
//!
//! ```
//! use tower_llm_failover::shutdown::Shutdown;
//!
//! let shutdown = Shutdown::new();
//! let seen_by_streams = shutdown.clone();
//! assert!(!seen_by_streams.is_ending());
//! shutdown.end_streams();
//! assert!(seen_by_streams.is_ending());
//! ```

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::time::ArmedFor;

/// A signal, shared by clones, that ends every running stream cleanly (see
/// the [module docs](self)).
#[derive(Debug, Clone)]
pub struct Shutdown {
    /// The signal: cancelled by [`end_streams`](Self::end_streams) on any
    /// handle.
    root: CancellationToken,
    /// What this handle's waits queue on: the root, or for a
    /// [`branch`](Self::branch) a child of it.
    token: CancellationToken,
    /// Set before the token is cancelled: read without the token's lock.
    fired: Arc<AtomicBool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A signal that has not fired.
    pub fn new() -> Self {
        let root = CancellationToken::new();
        Self {
            token: root.clone(),
            root,
            fired: Arc::default(),
        }
    }

    /// The same signal, with a queue of waiters of its own: for the
    /// layers of one thread of a thread-per-core server. Every turn waits
    /// on the signal while it has not answered, and a wait is queued and
    /// dequeued under the queue's lock; on one shared queue, threads
    /// serving turns on different cores take that lock from each other
    /// several times per turn. Ending either handle ends both.
    ///
    /// ```
    /// use tower_llm_failover::shutdown::Shutdown;
    ///
    /// let shutdown = Shutdown::new();
    /// let shard = shutdown.branch();
    /// shutdown.end_streams();
    /// assert!(shard.is_ending());
    /// ```
    pub fn branch(&self) -> Self {
        Self {
            root: self.root.clone(),
            token: self.root.child_token(),
            fired: Arc::clone(&self.fired),
        }
    }

    /// Ends every stream inspected with this signal (a clone, or a
    /// [`branch`](Self::branch)) with the terminal event, now and from now
    /// on. Idempotent.
    pub fn end_streams(&self) {
        self.fired.store(true, Ordering::Release);
        self.root.cancel();
    }

    /// Whether [`end_streams`](Self::end_streams) was called.
    pub fn is_ending(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// Resolves once [`end_streams`](Self::end_streams) is called.
    pub(crate) fn ending(&self) -> WaitForCancellationFutureOwned {
        self.token.clone().cancelled_owned()
    }

    /// One stream's wait for the signal, cheap to poll again.
    pub(crate) fn wait(&self) -> Ending {
        Ending {
            fired: Arc::clone(&self.fired),
            wait: Box::pin(self.ending()),
            armed: ArmedFor::default(),
        }
    }
}

/// A stream's wait for the [`Shutdown`] signal, polled once per task: after
/// it returned `Pending` to a task, later polls by the same task only read
/// a flag, since the signal wakes that task when it fires. A stream's body
/// polls it each time the upstream has nothing ready (about once per
/// event), where a full poll takes the signal's lock.
pub(crate) struct Ending {
    fired: Arc<AtomicBool>,
    wait: Pin<Box<WaitForCancellationFutureOwned>>,
    armed: ArmedFor,
}

impl Ending {
    /// `Ready` once the signal fired; `Pending` with the task in `cx`
    /// woken then.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.fired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        self.armed.poll(&mut self.wait, cx)
    }
}

impl std::fmt::Debug for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ending")
            .field("fired", &self.fired.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's wait, armed once, sees the signal and wakes its task.
    #[tokio::test]
    async fn a_stream_wait_sees_the_signal_after_it_was_armed() {
        let shutdown = Shutdown::new();
        let mut wait = shutdown.wait();
        std::future::poll_fn(|cx| {
            assert!(wait.poll(cx).is_pending());
            assert!(wait.poll(cx).is_pending(), "checked, not polled again");
            Poll::Ready(())
        })
        .await;
        let signal = shutdown.clone();
        tokio::spawn(async move { signal.end_streams() });
        // Woken by the signal, not by polling in a loop.
        std::future::poll_fn(|cx| wait.poll(cx)).await;
        assert!(shutdown.is_ending());
    }

    /// A branch's waits are woken by the signal however it is ended: from
    /// the handle it came from, from another branch, or from itself.
    #[tokio::test]
    async fn a_branch_is_the_same_signal_with_waiters_of_its_own() {
        for ender in 0..3 {
            let shutdown = Shutdown::default();
            let (one, two) = (shutdown.branch(), shutdown.branch());
            let waits = [shutdown.ending(), one.ending(), two.ending()];
            let mut waits: Vec<_> = waits.into_iter().map(Box::pin).collect();
            std::future::poll_fn(|cx| {
                for wait in &mut waits {
                    assert!(wait.as_mut().poll(cx).is_pending());
                }
                Poll::Ready(())
            })
            .await;
            let handles = [shutdown.clone(), one.clone(), two.clone()];
            let by = handles[ender].clone();
            tokio::spawn(async move { by.end_streams() });
            for wait in waits {
                wait.await;
            }
            for handle in &handles {
                assert!(handle.is_ending(), "ended by handle {ender}");
            }
        }
    }
}
