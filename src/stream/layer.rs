use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::StreamStateService;
use crate::classify::Classifier;
use crate::commit::InspectConfig;
use crate::dialect::{DefaultDialect, TerminalMode};

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

    pub(crate) fn config(&self) -> &InspectConfig<D> {
        &self.config
    }

    /// How a failed stream is ended for the client.
    pub fn terminal_mode(mut self, mode: TerminalMode) -> Self {
        self.config.terminal_mode = mode;
        self
    }

    /// The `finish_reason` of the terminal chunk (default `"error"`).
    pub fn finish_reason(mut self, reason: impl Into<Cow<'static, str>>) -> Self {
        self.config.finish_reason = reason.into();
        self
    }

    /// Fails the stream when no frame arrives from upstream for this long.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.config.idle_timeout = Some(timeout);
        self
    }

    /// How many malformed chunks are dropped before the stream is failed.
    pub fn max_malformed(mut self, count: u64) -> Self {
        self.config.max_malformed = count;
        self
    }

    /// Cap on one SSE line, in bytes.
    pub fn max_line_bytes(mut self, limit: usize) -> Self {
        self.config.max_line_bytes = limit;
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

    /// Cap on one SSE event, in bytes; also bounds the bytes of an
    /// incomplete event held back from the client.
    pub fn max_event_bytes(mut self, limit: usize) -> Self {
        self.config.max_event_bytes = limit;
        self
    }
}

impl<S, D: Clone> Layer<S> for StreamStateLayer<D> {
    type Service = StreamStateService<S, D>;

    fn layer(&self, inner: S) -> Self::Service {
        StreamStateService::new(inner, Arc::new(self.config.clone()))
    }
}
