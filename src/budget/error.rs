//! Errors of the budget layer, its response future and its body.

use crate::classify::Note;
use std::error::Error as StdError;
use std::time::Duration;

use crate::{Decision, FailureClass, Phase, classify::Classification};

use super::turn::BudgetExhausted;
use crate::TurnId;

/// The turn's deadline passed while the [`Budget`](super::Budget) service
/// waited for the response head or streamed the response body.
///
/// Its class is [`FailureClass::Timeout`], and its recovery
/// [`Decision::Stop`]: the turn has no time left for another hop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "turn {turn_id}: deadline of {limit:?} passed in phase {phase} ({elapsed:?} elapsed, {body_bytes} body bytes passed)"
)]
pub struct DeadlineExceeded {
    pub(crate) turn_id: TurnId,
    pub(crate) phase: Phase,
    pub(crate) limit: Duration,
    pub(crate) elapsed: Duration,
    pub(crate) body_bytes: u64,
}

impl DeadlineExceeded {
    /// The turn that ran out of time.
    pub fn turn_id(&self) -> &TurnId {
        &self.turn_id
    }

    /// Where the deadline passed.
    ///
    /// [`Phase::Head`] while waiting for the response head. In the body the
    /// budget layer cannot see commit, so it says [`Phase::Preamble`] when no
    /// body byte had passed yet and [`Phase::Committed`] once any had (bytes
    /// that went out cannot be taken back, so the stream must be ended, not
    /// rerouted). A stream layer that tracks commit knows better.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Always [`FailureClass::Timeout`].
    pub fn class(&self) -> FailureClass {
        FailureClass::Timeout
    }

    /// The turn's whole time budget.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Time since the turn started when the deadline fired.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Body data bytes that passed through the budget layer before the
    /// deadline (0 for a head timeout).
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    /// This failure as a [`Classification`]: class `timeout`, this phase,
    /// provider code `turn_deadline_exceeded`, recovery `Stop`.
    pub fn classification(&self) -> Classification {
        Classification::new(FailureClass::Timeout, self.phase)
            .with_provider_code("turn_deadline_exceeded")
            .with_message(self.to_string())
            .with_recovery(Decision::Stop)
            .with_note(Note::TurnDeadline)
    }

    /// Find a `DeadlineExceeded` in an error or its chain of sources (e.g.
    /// behind a boxed body error).
    pub fn find_in<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a DeadlineExceeded> {
        find_in_chain(error)
    }
}

impl BudgetExhausted {
    /// Find a `BudgetExhausted` in an error or its chain of sources.
    pub fn find_in<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a BudgetExhausted> {
        find_in_chain(error)
    }
}

fn find_in_chain<'a, T: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(found) = error.downcast_ref::<T>() {
            return Some(found);
        }
        current = error.source();
    }
    None
}
