//! What happens after an attempt: one word for the classifier's advice
//! and the failover layer's choice.

use std::fmt;

/// What to do about an attempt. A classifier's advice
/// ([`Classification::recovery`](crate::classify::Classification::recovery))
/// is one of the first three; the failover layer's record of what it did
/// ([`AttemptRecord::decision`](crate::observe::AttemptRecord::decision))
/// adds [`Committed`](Decision::Committed) and [`LostRace`](Decision::LostRace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Try the same target again (after the retry hint or a backoff).
    RetrySame,
    /// Move to another eligible target.
    Reroute,
    /// Stop the turn and answer the client with this failure: no other
    /// provider would do better.
    Stop,
    /// The attempt committed: its answer went to the client.
    Committed,
    /// The attempt raced a hedge (or was one) and another attempt
    /// committed first: it was cancelled before sending anything.
    LostRace,
}

impl Decision {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RetrySame => "retry_same",
            Self::Reroute => "reroute",
            Self::Stop => "stop",
            Self::Committed => "committed",
            Self::LostRace => "lost_race",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
