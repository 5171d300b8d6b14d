use std::sync::Arc;

use tower_layer::Layer;

use super::commit::InspectConfig;
use super::{StreamPolicy, StreamStateService};
use crate::classify::Classifier;
use crate::dialect::DefaultDialect;

/// Wraps a service's `text/event-stream` responses in a
/// [`StreamStateBody`](super::StreamStateBody) that tracks the commit point
/// and ends failed streams cleanly. See the [module docs](super).
#[derive(Debug, Clone)]
pub struct StreamStateLayer<D = DefaultDialect> {
    config: InspectConfig<D>,
}

impl Default for StreamStateLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamStateLayer {
    /// A layer for OpenAI chat-chunk streams with the defaults: terminal
    /// chunk with a top-level `error` and `finish_reason: "error"`, no idle
    /// timeout, three malformed chunks tolerated, 1 MiB line and event caps.
    pub fn new() -> Self {
        Self {
            config: InspectConfig::new(DefaultDialect::default()),
        }
    }
}

impl<D> StreamStateLayer<D> {
    /// Uses another wire dialect.
    pub fn dialect<D2>(self, dialect: D2) -> StreamStateLayer<D2> {
        StreamStateLayer {
            config: self.config.with_dialect(dialect),
        }
    }

    /// How streams are ended and bounded (terminal mode, finish reason,
    /// idle timeout, caps).
    pub fn policy(mut self, policy: StreamPolicy) -> Self {
        self.config.apply(&policy);
        self
    }

    /// The classifier that names in-band errors and stream failures, with
    /// its overrides.
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.config.classifier = classifier;
        self
    }

    /// The provider name classifier overrides match on, when this layer
    /// wraps one known upstream.
    pub fn provider(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.provider = Some(name.into());
        self
    }

    /// Ends running streams with the terminal event (class `shutdown`)
    /// when `signal` fires; see [`Shutdown`](crate::shutdown::Shutdown).
    pub fn shutdown(mut self, signal: crate::shutdown::Shutdown) -> Self {
        self.config.shutdown = Some(signal);
        self
    }
}

impl<S, D: Clone> Layer<S> for StreamStateLayer<D> {
    type Service = StreamStateService<S, D>;

    fn layer(&self, inner: S) -> Self::Service {
        StreamStateService::new(inner, Arc::new(self.config.clone()))
    }
}
