//! The failover policy's decision after a failed attempt.

use std::time::Duration;

use crate::budget::{RetryDelay, TurnBudget};
use crate::{Decision, FailureClass, classify::Classification, classify::Note};

/// What the failover layer does next: a [`Decision`] with the wait it
/// takes before retrying the same target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Try the same target again after this wait.
    RetrySame {
        /// The wait before the next attempt.
        after: Duration,
    },
    /// Move to the next eligible target.
    Reroute,
    /// Stop the turn and answer the client with this failure.
    Stop,
}

impl Step {
    /// The recorded decision.
    pub(crate) fn decision(self) -> Decision {
        match self {
            Self::RetrySame { .. } => Decision::RetrySame,
            Self::Reroute => Decision::Reroute,
            Self::Stop => Decision::Stop,
        }
    }
}

/// What to do after a failed attempt, before looking at other targets.
pub(super) fn decide(
    failure: &Classification,
    retries_here: u32,
    max_retries: u32,
    budget: &TurnBudget,
    cooldown: Option<Duration>,
    // With another target left: the longest wait worth taking here.
    others_left: Option<Duration>,
) -> Step {
    match failure.recovery {
        Decision::Stop | Decision::Committed | Decision::LostRace => Step::Stop,
        Decision::Reroute => Step::Reroute,
        // An overloaded provider with no hint of when it recovers: another
        // provider answers sooner than a backoff on this one.
        Decision::RetrySame
            if failure.class == FailureClass::Overloaded
                && failure.retry.after.is_none()
                && others_left.is_some() =>
        {
            Step::Reroute
        }
        // Our own head and first-output timeouts: a silent upstream is not
        // waited on twice in one turn.
        Decision::RetrySame if failure.note == Some(Note::GatewayTimeout) => Step::Reroute,
        Decision::RetrySame if retries_here >= max_retries => Step::Reroute,
        Decision::RetrySame => match budget.retry_delay(retries_here, failure.retry.after) {
            // The failure just cooled the target down for longer than the
            // wait: retrying it would only find it resting.
            RetryDelay::Wait(after) if cooldown.is_some_and(|c| c > after) => Step::Reroute,
            // Another target answers sooner than a long wait on this one.
            RetryDelay::Wait(after) if others_left.is_some_and(|max| after > max) => Step::Reroute,
            RetryDelay::Wait(after) => Step::RetrySame { after },
            // A wait past the deadline or longer than any we honour is not
            // taken: reroute now (or stop if nothing is left).
            RetryDelay::HintTooLong { .. } | RetryDelay::PastDeadline { .. } => Step::Reroute,
        },
    }
}
