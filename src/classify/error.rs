//! The error `ClassifyLayer` returns for every failed upstream call.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::Classification;
use super::sanitize::sanitize_message;

/// A failed upstream call, classified.
///
/// Carries the [`Classification`], the provider name, the retained (capped)
/// error body and, for transport failures, the client's error as `source()`.
/// [`to_response`](Self::to_response) turns it into the response a
/// gateway returns on a final stop.
///
/// `Debug` and `Display` show the sanitized message only: the retained body
/// is printed as its length, the source as its sanitized text, so an API key
/// echoed by a provider never reaches a log through this type.
#[derive(Clone)]
pub struct UpstreamError {
    classification: Classification,
    provider: Option<Arc<str>>,
    body: Bytes,
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl UpstreamError {
    /// An error for a classification, with no provider, body or source.
    pub fn new(classification: Classification) -> Self {
        Self {
            classification,
            provider: None,
            body: Bytes::new(),
            source: None,
        }
    }

    /// Sets the provider name.
    pub fn with_provider(mut self, provider: Option<Arc<str>>) -> Self {
        self.provider = provider;
        self
    }

    /// Sets the retained error body.
    pub fn with_body(mut self, body: Bytes) -> Self {
        self.body = body;
        self
    }

    /// Sets the underlying transport error.
    pub fn with_source(mut self, source: Arc<dyn Error + Send + Sync>) -> Self {
        self.source = Some(source);
        self
    }

    /// The classification.
    pub fn classification(&self) -> &Classification {
        &self.classification
    }

    /// Consumes the error, returning its classification.
    pub(crate) fn into_classification(self) -> Classification {
        self.classification
    }

    /// The provider name, when the layer was given one.
    pub fn provider(&self) -> Option<&str> {
        self.provider.as_deref()
    }

    /// The retained error body, at most the classifier's body limit (empty
    /// for transport errors).
    ///
    /// These are the provider's raw bytes: **not sanitized**, they may echo
    /// a credential. Log the classification's message instead.
    pub fn body(&self) -> &Bytes {
        &self.body
    }
}

impl fmt::Debug for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Len(usize);
        impl fmt::Debug for Len {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "<{} bytes>", self.0)
            }
        }
        f.debug_struct("UpstreamError")
            .field("provider", &self.provider)
            .field("classification", &self.classification)
            .field("body", &Len(self.body.len()))
            .field(
                "source",
                &self
                    .source
                    .as_ref()
                    .map(|s| sanitize_message(&s.to_string())),
            )
            .finish()
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.provider {
            Some(p) => write!(f, "upstream {p} failed: {}", self.classification),
            None => write!(f, "upstream failed: {}", self.classification),
        }
    }
}

impl Error for UpstreamError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|s| s as &(dyn Error + 'static))
    }
}
