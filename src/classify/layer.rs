use std::sync::Arc;

use tower_layer::Layer;

use super::{Classifier, Classify};

/// Applies [`Classify`] to a service: every failed upstream call becomes an
/// [`UpstreamError`](super::UpstreamError).
///
/// ```
/// use tower_llm_failover::classify::{Classifier, ClassifyLayer};
///
/// let layer = ClassifyLayer::new()
///     .provider("openai")
///     .classifier(Classifier::new().with_body_limit(16 * 1024));
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClassifyLayer {
    classifier: Classifier,
    provider: Option<Arc<str>>,
}

impl ClassifyLayer {
    /// A layer with the default [`Classifier`] and no provider name.
    pub fn new() -> Self {
        Self::default()
    }

    /// Names the provider behind this service: reported in errors and
    /// matched by provider overrides.
    pub fn provider(mut self, name: impl Into<Arc<str>>) -> Self {
        self.provider = Some(name.into());
        self
    }

    /// Sets the classifier (overrides, body cap and timeout).
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.classifier = classifier;
        self
    }
}

impl<S> Layer<S> for ClassifyLayer {
    type Service = Classify<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Classify::from_parts(inner, self.classifier.clone(), self.provider.clone())
    }
}
