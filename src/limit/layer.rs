use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tower_layer::Layer;

use super::ReadLimits;
use super::service::{InFlightLimit, ReadLimit};
use crate::dialect::DefaultDialect;

/// Wraps each request body in a [`ReadLimitBody`](super::ReadLimitBody)
/// with the given [`ReadLimits`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadLimitLayer {
    limits: ReadLimits,
}

impl ReadLimitLayer {
    /// A layer applying `limits`.
    pub fn new(limits: ReadLimits) -> Self {
        Self { limits }
    }
}

impl<S> Layer<S> for ReadLimitLayer {
    type Service = ReadLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ReadLimit::new(inner, self.limits)
    }
}

/// At most `max` requests in flight across every service this layer makes
/// (they share one count); the next is shed at once with the dialect's 503
/// and `retry-after`. A streamed response holds its slot until its body
/// ends or is dropped.
#[derive(Debug, Clone)]
pub struct InFlightLimitLayer<D = DefaultDialect> {
    slots: Arc<Semaphore>,
    max: usize,
    dialect: D,
    retry_after: Duration,
}

impl InFlightLimitLayer {
    /// At most `max` requests in flight; shed answers speak the default
    /// dialect and say `retry-after: 1`.
    pub fn new(max: usize) -> Self {
        let max = max.min(Semaphore::MAX_PERMITS);
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            dialect: DefaultDialect::default(),
            retry_after: Duration::from_secs(1),
        }
    }
}

impl<D> InFlightLimitLayer<D> {
    /// Shed answers in another dialect's error shape.
    pub fn dialect<D2>(self, dialect: D2) -> InFlightLimitLayer<D2> {
        InFlightLimitLayer {
            slots: self.slots,
            max: self.max,
            dialect,
            retry_after: self.retry_after,
        }
    }

    /// The `retry-after` of a shed answer (rounded up to whole seconds).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = after;
        self
    }

    /// Requests in flight now, across every service this layer made.
    pub fn in_flight(&self) -> usize {
        self.max.saturating_sub(self.slots.available_permits())
    }
}

impl<S, D: Clone> Layer<S> for InFlightLimitLayer<D> {
    type Service = InFlightLimit<S, D>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimit::new(
            inner,
            Arc::clone(&self.slots),
            self.dialect.clone(),
            self.retry_after,
        )
    }
}
