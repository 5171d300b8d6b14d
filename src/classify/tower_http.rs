//! An adapter to tower-http 0.7's classify traits (feature `tower-http`).

use crate::classify::Note;
use std::any::Any;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

use http::Response;
use tower_http::classify::{
    ClassifiedResponse, ClassifyResponse, NeverClassifyEos, SharedClassifier,
};

use super::{Classification, Classifier, UpstreamError};
use crate::{FailureClass, Phase};

/// A tower-http [`ClassifyResponse`] backed by a [`Classifier`], so that
/// tower-http's `TraceLayer` (`TraceLayer::new(adapter.into_make_classifier())`)
/// or anything else built on those traits sees the same classes:
///
/// ```
/// use http::{Response, StatusCode};
/// use tower_http::classify::{ClassifiedResponse, ClassifyResponse};
/// use tower_llm_failover::{FailureClass, classify::TowerHttpClassifier};
///
/// let adapter = TowerHttpClassifier::new().provider("anthropic");
/// let response = Response::builder().status(529).body(()).unwrap();
/// match adapter.classify_response(&response) {
///     ClassifiedResponse::Ready(Err(c)) => assert_eq!(c.class, FailureClass::Overloaded),
///     _ => unreachable!(),
/// }
/// ```
///
/// It classifies from the status and headers alone and is `Ready` at the
/// head: the traits never hand over body bytes, so the error body (the
/// difference between a rate limit and an exhausted quota) and in-band SSE
/// errors are out of its reach. Put it outside a
/// [`ClassifyLayer`](super::ClassifyLayer) and the service errors it sees are
/// [`UpstreamError`]s whose full classification it reports as is.
#[derive(Debug, Clone, Default)]
pub struct TowerHttpClassifier {
    classifier: Classifier,
    provider: Option<Arc<str>>,
}

impl TowerHttpClassifier {
    /// An adapter with the default classifier.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the classifier.
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// Names the provider.
    pub fn provider(mut self, name: impl Into<Arc<str>>) -> Self {
        self.provider = Some(name.into());
        self
    }

    /// Wraps the adapter for `TraceLayer::new`.
    pub fn into_make_classifier(self) -> SharedClassifier<Self> {
        SharedClassifier::new(self)
    }
}

impl ClassifyResponse for TowerHttpClassifier {
    type FailureClass = Classification;
    type ClassifyEos = NeverClassifyEos<Classification>;

    fn classify_response<B>(
        self,
        res: &Response<B>,
    ) -> ClassifiedResponse<Self::FailureClass, Self::ClassifyEos> {
        if res.status().is_success() {
            return ClassifiedResponse::Ready(Ok(()));
        }
        let c = self.classifier.classify_head(
            self.provider.as_deref(),
            res.status(),
            res.headers(),
            &[],
        );
        ClassifiedResponse::Ready(Err(c))
    }

    fn classify_error<E>(self, error: &E) -> Self::FailureClass
    where
        E: fmt::Display + 'static,
    {
        // The trait only promises Display; recover the error chain when the
        // concrete type is one we know.
        let any: &dyn Any = error;
        let provider = self.provider.as_deref();
        if let Some(upstream) = any.downcast_ref::<UpstreamError>() {
            return upstream.classification().clone();
        }
        if let Some(boxed) = any.downcast_ref::<Box<dyn Error + Send + Sync>>() {
            return self
                .classifier
                .classify_transport(provider, &**boxed, false);
        }
        if let Some(io) = any.downcast_ref::<std::io::Error>() {
            return self.classifier.classify_transport(provider, io, false);
        }
        #[cfg(feature = "hyper")]
        {
            if let Some(e) = any.downcast_ref::<hyper_util::client::legacy::Error>() {
                return self.classifier.classify_transport(provider, e, false);
            }
            if let Some(e) = any.downcast_ref::<hyper::Error>() {
                return self.classifier.classify_transport(provider, e, false);
            }
        }
        let c = Classification::new(FailureClass::Connect, Phase::Head)
            .with_message(error.to_string())
            .with_note(Note::TransportError);
        self.classifier.apply_overrides(provider, c)
    }
}
