use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::Cost;

/// One eligible, admissible target as a [`Selector`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Candidate {
    /// The target's index in the layer's target list.
    pub index: usize,
    /// The request's estimated cost at this target's price, if it has one.
    pub estimated_cost: Option<Cost>,
    /// The target's smoothed recent time to first output, if known. Looked
    /// up only for a selector that may read it (`LowestLatency` and custom
    /// ones): `None` for the others.
    pub time_to_first_output: Option<Duration>,
}

/// Orders the candidates of a turn: the first is tried first, the rest are
/// the reroute order. Candidates arrive in configured order.
pub trait Selector: Send + Sync + 'static {
    /// Reorders `candidates` in place.
    fn order(&self, candidates: &mut [Candidate]);
}

impl<F> Selector for F
where
    F: Fn(&mut [Candidate]) + Send + Sync + 'static,
{
    fn order(&self, candidates: &mut [Candidate]) {
        self(candidates)
    }
}

/// The built-in selection strategies.
#[derive(Clone, Default)]
pub enum Strategy {
    /// The configured order.
    #[default]
    Ordered,
    /// Cheapest eligible healthy target first, by the request's estimated
    /// cost; targets without a price go last, in configured order.
    CheapestHealthy,
    /// Lowest recent time to first output first; targets with no history
    /// go first so they get measured.
    LowestLatency,
    /// A selector of your own.
    Custom(Arc<dyn Selector>),
}

impl fmt::Debug for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ordered => f.write_str("Ordered"),
            Self::CheapestHealthy => f.write_str("CheapestHealthy"),
            Self::LowestLatency => f.write_str("LowestLatency"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl Strategy {
    /// Whether ordering may read the candidates' time to first output, a
    /// health store lookup (under its lock) per candidate per turn.
    pub(crate) fn reads_latency(&self) -> bool {
        matches!(self, Self::LowestLatency | Self::Custom(_))
    }
}

impl Selector for Strategy {
    fn order(&self, candidates: &mut [Candidate]) {
        match self {
            Self::Ordered => {}
            // Stable sorts keep the configured order among equals.
            Self::CheapestHealthy => {
                candidates.sort_by_key(|c| (c.estimated_cost.is_none(), c.estimated_cost))
            }
            Self::LowestLatency => candidates
                .sort_by_key(|c| (c.time_to_first_output.is_some(), c.time_to_first_output)),
            Self::Custom(selector) => selector.order(candidates),
        }
    }
}
