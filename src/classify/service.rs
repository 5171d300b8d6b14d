use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Buf;
use http::{Request, Response};
use tower_service::Service;

use super::{Classifier, ClassifyLayer, ResponseFuture, UpstreamError};
use crate::Phase;

/// The boxed error type inner services' errors are converted through.
pub(crate) use crate::BoxError;

/// Classifies the failures of an upstream HTTP service.
///
/// - A 2xx response passes through untouched: same response, body not read.
/// - Any other status: the error body is read up to the classifier's cap
///   and within its timeout, classified with
///   [`Classifier::classify_head`], and returned as
///   `Err(`[`UpstreamError`]`)` holding the retained body.
/// - An inner error is classified with [`Classifier::classify_transport`]
///   (an [`UpstreamError`] from an inner `Classify` is kept as is); an error
///   from `poll_ready` is in [`Phase::BeforeSend`], as no request was sent.
///
/// See the [module docs](super) for an example.
#[derive(Debug, Clone)]
pub struct Classify<S> {
    inner: S,
    classifier: Classifier,
    provider: Option<Arc<str>>,
}

impl<S> Classify<S> {
    /// Wraps `inner` with the default classifier.
    pub fn new(inner: S) -> Self {
        Self::from_parts(inner, Classifier::default(), None)
    }

    pub(crate) fn from_parts(inner: S, classifier: Classifier, provider: Option<Arc<str>>) -> Self {
        Self {
            inner,
            classifier,
            provider,
        }
    }

    /// A [`ClassifyLayer`] with the defaults.
    pub fn layer() -> ClassifyLayer {
        ClassifyLayer::new()
    }

    /// Names the provider behind this service.
    pub fn provider(mut self, name: impl Into<Arc<str>>) -> Self {
        self.provider = Some(name.into());
        self
    }

    /// Sets the classifier.
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.classifier = classifier;
        self
    }

    crate::util::inner_service_accessors!();
}

/// An inner service's error as an [`UpstreamError`]; `phase` forces the
/// phase (used for `poll_ready` errors: nothing was sent).
pub(crate) fn transport_error(
    classifier: &Classifier,
    provider: &Option<Arc<str>>,
    error: BoxError,
    phase: Option<Phase>,
) -> UpstreamError {
    let error = match error.downcast::<UpstreamError>() {
        Ok(upstream) => return *upstream,
        Err(other) => other,
    };
    let mut c = classifier.classify_transport(provider.as_deref(), &*error, false);
    if let Some(phase) = phase {
        c.phase = phase;
    }
    UpstreamError::new(c)
        .with_provider(provider.clone())
        .with_source(Arc::from(error))
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Classify<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body,
    ResBody::Data: Buf,
{
    type Response = Response<ResBody>;
    type Error = UpstreamError;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self.inner.poll_ready(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(transport_error(
                &self.classifier,
                &self.provider,
                e.into(),
                Some(Phase::BeforeSend),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The future does not need the service, so no clone-and-swap: the
        // service polled ready is the one called.
        ResponseFuture::new(
            self.inner.call(request),
            self.classifier.clone(),
            self.provider.clone(),
        )
    }
}
