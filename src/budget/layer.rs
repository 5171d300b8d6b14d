//! [`BudgetLayer`]: the per-turn budget's configuration.

use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::cost::Pricing;
use super::service::Budget;
use super::spend::TenantSpend;
use super::turn::TurnLimits;
use crate::dialect::DefaultDialect;

/// Applies a per-turn [`TurnBudget`](super::TurnBudget) to every request:
/// made on the first hop, reused by every later one.
///
/// See the [module docs](super) for what the service does with it.
/// Defaults: the [`TurnLimits::new`] limits (120 s deadline, 4 attempts, no
/// spend ceiling, the OpenAI-SDK backoff, no retry budget), no pricing,
/// refusals answered in the OpenAI chat dialect's error shape
/// ([`dialect`](Self::dialect) to change).
#[derive(Debug, Clone)]
pub struct BudgetLayer<D = DefaultDialect> {
    pub(crate) settings: Arc<Settings>,
    pub(crate) dialect: D,
}

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) limits: TurnLimits,
    pub(crate) pricing: Option<Pricing>,
    pub(crate) tenant: Option<TenantSpend>,
}

impl Default for BudgetLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl BudgetLayer {
    /// A layer with the defaults (see the type docs).
    pub fn new() -> Self {
        Self {
            settings: Arc::new(Settings {
                limits: TurnLimits::new(),
                pricing: None,
                tenant: None,
            }),
            dialect: DefaultDialect::default(),
        }
    }
}

impl<D> BudgetLayer<D> {
    /// Answers refused turns in this wire dialect's error shape.
    pub fn dialect<D2>(self, dialect: D2) -> BudgetLayer<D2> {
        BudgetLayer {
            settings: self.settings,
            dialect,
        }
    }

    fn update(mut self, f: impl FnOnce(&mut Settings)) -> Self {
        f(Arc::make_mut(&mut self.settings));
        self
    }

    /// Replace all turn limits at once: deadline, attempt cap, spend
    /// ceiling, backoff and retry budget ([`TurnLimits`]; its retry budget
    /// is shared by all turns through this layer and every other holder of
    /// a clone of it).
    pub fn limits(self, limits: TurnLimits) -> Self {
        self.update(|s| s.limits = limits)
    }

    /// Time allowed for the whole turn, every hop and wait included: the
    /// [`deadline`](TurnLimits::deadline) of the layer's limits, the one
    /// almost every stack sets.
    pub fn deadline(self, deadline: Duration) -> Self {
        self.update(|s| s.limits.deadline = deadline)
    }

    /// Record each response's cost at this price, from the
    /// [`ReportedUsage`](super::ReportedUsage) in its extensions.
    ///
    /// Set it only around a single upstream: a failover layer inside records
    /// each attempt's spend itself, at each target's own price.
    pub fn pricing(self, pricing: Pricing) -> Self {
        self.update(|s| s.pricing = Some(pricing))
    }

    /// Meter every turn with its tenant under `spend`: the tenant is the
    /// one the request's [`ClientId`](crate::identity::ClientId) names (put
    /// in the request extensions by an identity layer in front; a request
    /// without one is the anonymous client, which names no tenant). Each
    /// attempt a failover layer inside makes reserves its estimate first,
    /// the first being the turn's admission, and the end of the turn (its
    /// body done or dropped) settles against what it really cost .
    ///
    /// Refusals are answered in the dialect's shape: 402
    /// `tenant_spend_ceiling_reached`, 400 `tenant_required` (no tenant,
    /// and [`TenantSpend::require_tenant`]), 503 `spend_store_unavailable`
    /// (failing closed).
    ///
    /// Reservations are made by whoever makes the attempts (the failover
    /// layer): around a bare upstream nothing is reserved, and the turn's
    /// cost is only added at its end.
    pub fn tenant_spend(self, spend: TenantSpend) -> Self {
        self.update(|s| s.tenant = Some(spend))
    }
}

impl<S, D: Clone> Layer<S> for BudgetLayer<D> {
    type Service = Budget<S, D>;

    fn layer(&self, inner: S) -> Self::Service {
        Budget::from_parts(inner, self.settings.clone(), self.dialect.clone())
    }
}
