//! Time arithmetic that never panics on a huge configured duration, and
//! timers cheap to poll again.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// How far "never" is: where [`later`] saturates. Thirty years outlives any
/// process, and stays far from the platform's `Instant` limit.
pub(crate) const FAR: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);

/// `at + duration`, saturating far in the future instead of panicking.
///
/// Every configured duration (timeouts, leases, TTLs, waits) that is added
/// to an instant goes through here, so `Duration::MAX` means "very long",
/// never a panic.
pub(crate) fn later(at: Instant, duration: Duration) -> Instant {
    at.checked_add(duration)
        .or_else(|| at.checked_add(FAR))
        // Unreachable on real clocks; still no panic.
        .unwrap_or(at)
}

/// Put in a response's extensions by a body that ends itself at this
/// instant with its dialect's terminal event (the commit machine, when it
/// was given the turn's deadline). A deadline layer outside leaves the cut
/// to it: two timers for one instant may fire in either order on a
/// multi-threaded runtime, and an outer cut is a bare body error, which
/// hyper turns into an aborted chunked body (no terminal event, no end
/// marker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndsItselfAt(pub(crate) Instant);

/// The task a wait will wake: set when the wait returned `Pending` to it.
/// A wait polled again by that same task, with nothing new to tell, need
/// not be polled at all: it will wake the task when it ends. Its owner
/// checks first whether it ended (a cheap read), then asks this.
#[derive(Debug, Default)]
pub(crate) struct ArmedFor(Option<Waker>);

impl ArmedFor {
    /// Polls `wait` unless it is armed for the task in `cx` already; arms
    /// it for that task on `Pending`.
    pub(crate) fn poll<F: Future + Unpin>(
        &mut self,
        wait: &mut F,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        if self
            .0
            .as_ref()
            .is_some_and(|waker| waker.will_wake(cx.waker()))
        {
            return Poll::Pending;
        }
        let poll = Pin::new(wait).poll(cx);
        if poll.is_pending() {
            self.0 = Some(cx.waker().clone());
        }
        poll
    }

    /// Forgets the task: the next poll polls the wait again.
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

/// A timer that is polled once per task: after it returned `Pending` to a
/// task, later polls by the same task only check whether it fired, since
/// the timer will wake that task when it does. A stream's body layers poll
/// their timers each time the upstream has nothing ready (about once per
/// event); a full [`Sleep`] poll swaps the waker and takes the timer's
/// state each time, which was the largest per-event cost after the scan.
#[derive(Debug)]
pub(crate) struct Alarm {
    sleep: Pin<Box<Sleep>>,
    armed: ArmedFor,
}

impl Alarm {
    /// An alarm at `deadline` (registered with the runtime on first poll).
    pub(crate) fn at(deadline: Instant) -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            armed: ArmedFor::default(),
        }
    }

    /// When it fires.
    pub(crate) fn deadline(&self) -> Instant {
        self.sleep.deadline()
    }

    /// Whether it fired (known without a poll once it was armed).
    pub(crate) fn is_elapsed(&self) -> bool {
        self.sleep.is_elapsed()
    }

    /// Moves it to `deadline`; the next poll arms it again.
    pub(crate) fn reset(&mut self, deadline: Instant) {
        self.sleep.as_mut().reset(deadline);
        self.armed.disarm();
    }

    /// `Ready` once the deadline passed; `Pending` with the task in `cx`
    /// woken then.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.sleep.is_elapsed() {
            return Poll::Ready(());
        }
        // Outside the task's coop budget: a `Sleep` polled with the budget
        // spent answers `Pending` without registering its timer, and the
        // alarm, marked armed, would never poll it again.
        self.armed
            .poll(&mut tokio::task::unconstrained(&mut self.sleep), cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A huge configured duration saturates far ahead instead of panicking.
    #[test]
    fn later_saturates_on_a_huge_duration() {
        let now = Instant::now();
        assert_eq!(
            later(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        let far = later(now, Duration::MAX);
        assert!(far >= now + FAR, "Duration::MAX reads as very long");
    }

    /// Armed once, an alarm answers a poll by the same task from its
    /// state alone, and still fires; a reset arms it again.
    #[tokio::test(start_paused = true)]
    async fn an_alarm_fires_for_the_task_it_was_armed_for() {
        let mut alarm = Alarm::at(Instant::now() + Duration::from_secs(5));
        std::future::poll_fn(|cx| {
            assert!(alarm.poll(cx).is_pending());
            assert!(alarm.armed.0.is_some());
            assert!(alarm.poll(cx).is_pending(), "checked, not polled again");
            Poll::Ready(())
        })
        .await;
        tokio::time::advance(Duration::from_secs(5)).await;
        std::future::poll_fn(|cx| alarm.poll(cx)).await;
        assert!(alarm.is_elapsed());

        alarm.reset(Instant::now() + Duration::from_secs(1));
        assert!(alarm.armed.0.is_none());
        assert!(!alarm.is_elapsed());
        let started = Instant::now();
        std::future::poll_fn(|cx| alarm.poll(cx)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    /// Armed by a task whose coop budget is spent (the upstream body said
    /// `Pending` for that reason), an alarm still registers its timer.
    #[tokio::test(start_paused = true)]
    async fn an_alarm_armed_with_the_budget_spent_still_fires() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..1_000 {
            tx.send(()).unwrap_or_default();
        }
        let mut alarm = Alarm::at(Instant::now() + Duration::from_secs(5));
        std::future::poll_fn(|cx| {
            // Ready items until the budget runs out, then `Pending`.
            while let Poll::Ready(Some(())) = rx.poll_recv(cx) {}
            assert!(!rx.is_empty(), "the budget, not the channel, ran out");
            assert!(alarm.poll(cx).is_pending());
            Poll::Ready(())
        })
        .await;
        let fired = tokio::time::timeout(
            Duration::from_secs(60),
            std::future::poll_fn(|cx| alarm.poll(cx)),
        )
        .await;
        assert!(fired.is_ok(), "the alarm's timer was registered");
        assert!(alarm.is_elapsed());
    }
}
