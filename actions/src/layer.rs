//! `ActionExecutorLayer`: configuration of the idempotent executor.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::disposition::FinalOnError;
use super::reconcile::Reconciler;
use super::schema::ToolSchemas;
use super::service::ActionExecutor;
use super::store::ActionStore;

/// Settings shared by every clone of the service.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn ActionStore>,
    pub(crate) reconciler: Option<Arc<dyn Reconciler>>,
    pub(crate) schemas: Option<ToolSchemas>,
    pub(crate) effect_timeout: Duration,
    pub(crate) in_progress_wait: Duration,
    pub(crate) lease_grace: Duration,
}

impl Config {
    /// How long a running claim is trusted: the effect's own timeout plus a
    /// margin for storing its outcome.
    pub(crate) fn lease(&self) -> Duration {
        self.effect_timeout.saturating_add(self.lease_grace)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("store", &self.store)
            .field("reconciler", &self.reconciler)
            .field("schemas", &self.schemas)
            .field("effect_timeout", &self.effect_timeout)
            .field("in_progress_wait", &self.in_progress_wait)
            .field("lease_grace", &self.lease_grace)
            .finish()
    }
}

/// Wraps an effect-performing service (`Service<ToolCall, Response = Value>`)
/// so that each [`ActionId`](super::ActionId) applies its effect at most once
/// per stored record; see the [crate docs](crate).
///
/// `C` classifies the executor's errors ([`FinalOnError`] unless
/// [`classify_errors`](Self::classify_errors) says otherwise).
#[derive(Clone)]
pub struct ActionExecutorLayer<C = FinalOnError> {
    config: Config,
    classify: C,
}

impl<C> fmt::Debug for ActionExecutorLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActionExecutorLayer")
            .field("config", &self.config)
            .field("classify", &std::any::type_name::<C>())
            .finish()
    }
}

impl ActionExecutorLayer {
    /// Default time the effect may take before the action turns unknown.
    pub(crate) const DEFAULT_EFFECT_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default time a duplicate waits for a running action before it gets
    /// [`ActionError::InProgress`](super::ActionError::InProgress).
    pub(crate) const DEFAULT_IN_PROGRESS_WAIT: Duration = Duration::from_secs(10);
    /// Default margin added to the effect timeout for the claim's lease.
    pub(crate) const DEFAULT_LEASE_GRACE: Duration = Duration::from_secs(5);

    /// A layer recording actions in `store`, without reconciler or schemas.
    pub fn new(store: Arc<dyn ActionStore>) -> Self {
        Self {
            config: Config {
                store,
                reconciler: None,
                schemas: None,
                effect_timeout: Self::DEFAULT_EFFECT_TIMEOUT,
                in_progress_wait: Self::DEFAULT_IN_PROGRESS_WAIT,
                lease_grace: Self::DEFAULT_LEASE_GRACE,
            },
            classify: FinalOnError,
        }
    }
}

impl<C> ActionExecutorLayer<C> {
    /// How long the effect may take; past it the effect's future is dropped,
    /// the action turns unknown and the caller gets
    /// [`ActionError::NeedsReconciliation`](super::ActionError::NeedsReconciliation).
    pub fn effect_timeout(mut self, timeout: Duration) -> Self {
        self.config.effect_timeout = timeout;
        self
    }

    /// How long a second call with a running action id waits for the first
    /// to finish (and then returns its stored outcome) before answering
    /// [`ActionError::InProgress`](super::ActionError::InProgress).
    /// `Duration::ZERO` answers at once.
    pub fn in_progress_wait(mut self, wait: Duration) -> Self {
        self.config.in_progress_wait = wait;
        self
    }

    /// Margin added to the effect timeout to form the claim's lease. A running
    /// claim past its lease (its owner crashed or was lost) turns unknown on
    /// the next claim.
    pub fn lease_grace(mut self, grace: Duration) -> Self {
        self.config.lease_grace = grace;
        self
    }

    /// Asks `reconciler` about unknown actions instead of reporting them.
    pub fn reconciler(mut self, reconciler: impl Reconciler) -> Self {
        self.config.reconciler = Some(Arc::new(reconciler));
        self
    }

    /// Checks each call's arguments against its tool's schema before any
    /// claim; calls of tools without a schema are refused.
    pub fn schemas(mut self, schemas: ToolSchemas) -> Self {
        self.config.schemas = Some(schemas);
        self
    }

    /// Classifies the executor's errors with `classify` (for example a
    /// closure `|e: &MyError| Disposition::Retryable`).
    pub fn classify_errors<C2>(self, classify: C2) -> ActionExecutorLayer<C2> {
        ActionExecutorLayer {
            config: self.config,
            classify,
        }
    }
}

impl<S, C: Clone> Layer<S> for ActionExecutorLayer<C> {
    type Service = ActionExecutor<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        ActionExecutor::new(inner, Arc::new(self.config.clone()), self.classify.clone())
    }
}
