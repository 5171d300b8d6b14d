//! The failover policy's decision after a failed attempt.

use std::time::Duration;

use crate::budget::{RetryDelay, TurnBudget};
use crate::classify::{Classification, FailureClass, Note, Recovery};

/// What the failover layer decided after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Try the same target again after this wait.
    RetrySame {
        /// The wait before the next attempt.
        after: Duration,
    },
    /// Move to the next eligible target.
    Reroute,
    /// Stop the turn and answer the client with this failure.
    Stop,
    /// The attempt committed: its answer went to the client.
    Committed,
}

impl Decision {
    /// A stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::RetrySame { .. } => "retry_same",
            Self::Reroute => "reroute",
            Self::Stop => "stop",
            Self::Committed => "committed",
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
) -> Decision {
    match failure.recovery {
        Recovery::Stop => Decision::Stop,
        Recovery::Reroute => Decision::Reroute,
        // An overloaded provider with no hint of when it recovers: another
        // provider answers sooner than a backoff on this one.
        Recovery::RetrySame
            if failure.class == FailureClass::Overloaded
                && failure.retry.after.is_none()
                && others_left.is_some() =>
        {
            Decision::Reroute
        }
        // Our own head and first-output timeouts: a silent upstream is not
        // waited on twice in one turn.
        Recovery::RetrySame if failure.note == Some(Note::GatewayTimeout) => Decision::Reroute,
        Recovery::RetrySame if retries_here >= max_retries => Decision::Reroute,
        Recovery::RetrySame => match budget.retry_delay(retries_here, failure.retry.after) {
            // The failure just cooled the target down for longer than the
            // wait: retrying it would only find it resting.
            RetryDelay::Wait(after) if cooldown.is_some_and(|c| c > after) => Decision::Reroute,
            // Another target answers sooner than a long wait on this one.
            RetryDelay::Wait(after) if others_left.is_some_and(|max| after > max) => {
                Decision::Reroute
            }
            RetryDelay::Wait(after) => Decision::RetrySame { after },
            // A wait past the deadline or longer than any we honour is not
            // taken: reroute now (or stop if nothing is left).
            RetryDelay::HintTooLong { .. } | RetryDelay::PastDeadline { .. } => Decision::Reroute,
        },
    }
}
