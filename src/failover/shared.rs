//! What every turn of one failover service shares: its targets and
//! settings, read by the turn and its attempts.

use super::Timeouts;
use std::sync::Arc;

use super::headers::HeaderPolicy;
use super::select::Strategy;
use super::target::Target;
use crate::budget::TurnLimits;
use crate::classify::{Classifier, Classify};
use crate::health::{HealthStore, ScopeRules};
use crate::{stream::CommitWindow, stream::commit::InspectConfig};

pub(crate) struct Shared<S, D> {
    pub(crate) dialect: D,
    pub(crate) targets: Vec<Target<Classify<S>>>,
    /// The targets' metric handles, registered once.
    pub(crate) meters: Arc<crate::observe::Meters>,
    pub(crate) health: Arc<dyn HealthStore>,
    pub(crate) scopes: ScopeRules,
    pub(crate) refuse_when_cooling: bool,
    pub(crate) strategy: Strategy,
    pub(crate) classifier: Classifier,
    pub(crate) limits: TurnLimits,
    pub(crate) commit: CommitWindow,
    pub(crate) timeouts: Timeouts,
    /// The longest gap between body frames (the stream policy's idle
    /// timeout; none: `Duration::MAX`).
    pub(crate) idle: std::time::Duration,
    pub(crate) headers: HeaderPolicy,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) max_held_bytes: u64,
    pub(crate) max_retries_per_target: u32,
    /// With another target left, a longer wait reroutes instead.
    pub(crate) max_same_target_wait: std::time::Duration,
    pub(crate) default_output_tokens: u64,
    pub(crate) stream: Arc<InspectConfig<D>>,
    /// When it fires, a turn that has not answered yet answers `503`
    /// (class `shutdown`) instead of waiting on.
    pub(crate) shutdown: Option<crate::shutdown::Shutdown>,
    /// Which provider holds the state a request continues.
    pub(crate) owners: Arc<super::owners::StateOwners>,
    /// The hedge policy, when hedging is on.
    pub(crate) hedging: Option<super::hedge::Hedging>,
}
