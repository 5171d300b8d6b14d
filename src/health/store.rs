//! The backend trait and the words it speaks.

use super::{HealthKey, Scope};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::FailureClass;

/// Whether a key may take a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// In rotation.
    Healthy,
    /// Resting until this instant.
    Cooling(Instant),
    /// The cooldown is over and no probe is out: the next request probes.
    Probe,
    /// The cooldown is over and a probe is out: wait for its answer.
    Probing,
}

/// A store's answer to [`HealthStore::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Healthy: send.
    Open,
    /// Send as the key's probe; its outcome decides the key's state.
    Probe,
    /// Resting or probed by another request: skip, for now.
    Refused(Availability),
}

/// One failure, as a store records it.
///
/// Plain data: [`FailureReport::new`] gives the class and scope, the
/// rest is set with the fields
/// (`FailureReport { was_probe: true, ..FailureReport::new(class, scope) }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureReport {
    /// The failure's class.
    pub class: FailureClass,
    /// Where it is charged ([`ScopeRules`](super::ScopeRules)).
    pub scope: Scope,
    /// The provider's retry hint, when it gave one.
    pub retry_after: Option<Duration>,
    /// The request held the probe slot, which it gives back.
    pub was_probe: bool,
    /// The client whose request failed ([`ClientId::witness`]): a timeout
    /// or a stream fault counts toward a cooldown once per client within
    /// the failure window, as it may be the request's doing (a huge prompt,
    /// a long answer) rather than the provider's. `None`, an anonymous
    /// request, counts as a new client each time.
    ///
    /// [`ClientId::witness`]: crate::identity::ClientId::witness
    pub witness: Option<Arc<str>>,
}

impl FailureReport {
    /// A failure of `class` charged to `scope`: no retry hint, not a probe,
    /// no witness.
    pub fn new(class: FailureClass, scope: Scope) -> Self {
        Self {
            class,
            scope,
            retry_after: None,
            was_probe: false,
            witness: None,
        }
    }

    /// The client this failure counts once for, when its class counts per
    /// client (timeouts and stream faults; the provider's own statements,
    /// such as a status or a reset, count every time).
    pub fn counted_per_client(&self) -> Option<&Arc<str>> {
        matches!(
            self.class,
            FailureClass::Timeout | FailureClass::InvalidResponse
        )
        .then_some(self.witness.as_ref())
        .flatten()
    }
}

/// A success, as a store records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SuccessReport {
    /// A stream committed: the key answers (cooldown and probe are over),
    /// but its failure streak ends only when the stream ends whole.
    Committed {
        /// Time to first output.
        ttft: Option<Duration>,
    },
    /// A whole answer arrived (or a committed stream ended whole).
    Whole {
        /// Time to first output, when measured.
        ttft: Option<Duration>,
    },
}

/// The state of one key in a [`HealthSnapshot`] entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyState {
    /// In rotation.
    Healthy,
    /// Resting for this much longer (until about `until`).
    Cooling {
        /// Time left.
        remaining: Duration,
        /// The wall-clock end of the cooldown.
        until: SystemTime,
    },
    /// The cooldown is over; the next request probes.
    Probe,
    /// A probe is out.
    Probing,
}

impl KeyState {
    /// A stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Cooling { .. } => "cooling",
            Self::Probe => "probe",
            Self::Probing => "probing",
        }
    }
}

/// One key of a [`HealthStore::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthSnapshot {
    /// The key.
    pub key: HealthKey,
    /// Its state now.
    pub state: KeyState,
    /// Failures in a row since the last success.
    pub failure_streak: u32,
    /// Cooldowns in a row since the last success.
    pub cooldowns: u32,
    /// The class of the last failure, if any.
    pub last_class: Option<FailureClass>,
}

/// The health registry of a gateway: one per gateway, shared by every route
/// and [`Failover`](crate::failover::Failover).
///
/// Reads are served from a local view. Each state transition (a failure,
/// a cooldown start, a probe claim, a recovery) is one call, so a
/// networked store can make it one atomic round trip; methods are called
/// on the request path and must not block, so such a store applies the
/// transition to its local view at once and ships it in the background.
///
/// [`Availability`] of a model key combines its own state with its
/// account's: a cooling account cools every model behind it.
pub trait HealthStore: Send + Sync + fmt::Debug + 'static {
    /// Whether `key` may take a request now (local read).
    fn availability(&self, key: &HealthKey) -> Availability;

    /// Admits a request to `key` if healthy, or as its probe (decided and
    /// marked in one transition, so two requests never both probe).
    /// `force`: admit as a probe even while the key rests — the turn has
    /// nothing else left to try.
    fn admit(&self, key: &HealthKey, force: bool) -> Admission;

    /// A probe admitted to `key` was abandoned without an outcome.
    fn release_probe(&self, key: &HealthKey);

    /// Records a success.
    fn success(&self, key: &HealthKey, report: SuccessReport);

    /// Records a failure of a request to `key`; returns the cooldown it
    /// started, if any. The failure lands on the key's account for account
    /// scope, on the key for model scope, and nowhere for request scope.
    fn failure(&self, key: &HealthKey, report: FailureReport) -> Option<Duration>;

    /// Smoothed time to first output of `key`'s recent successes.
    fn time_to_first_output(&self, key: &HealthKey) -> Option<Duration>;

    /// Every key the store knows, in key order.
    fn snapshot(&self) -> Vec<HealthSnapshot>;
}
