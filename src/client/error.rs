//! The client's errors: building it, and sending a request.

use std::error::Error;
use std::fmt;

use crate::classify::UpstreamError;

/// Why [`UpstreamClientBuilder::build`](super::UpstreamClientBuilder::build)
/// failed. Never echoes a credential; a base URL's query (which may carry a
/// key) is not printed either.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The base URL does not parse as a URI.
    #[error("invalid base URL: {0}")]
    InvalidBaseUrl(String),
    /// The base URL's scheme is neither `http` nor `https`.
    #[error("base URL scheme must be http or https, got {0:?}")]
    UnsupportedScheme(String),
    /// The base URL has no host (`/v1` alone, `http:///v1`).
    #[error("base URL has no host")]
    MissingHost,
    /// The base URL carries `user:password@`; credentials go in
    /// [`Auth`](super::Auth), where they are kept out of logs.
    #[error("base URL carries credentials (user:password@); pass them with `auth` instead")]
    CredentialsInUrl,
    /// The credential cannot be a header value (a control character, a
    /// newline).
    #[error("credential is not a valid header value")]
    InvalidCredential,
    /// The TLS configuration could not be built.
    #[error("TLS setup failed: {0}")]
    Tls(String),
}

/// Why a request did not get a response head from the upstream.
///
/// Its `source()` is the underlying error itself, so
/// [`Classifier::classify_transport`](crate::classify::Classifier::classify_transport)
/// (and `ClassifyLayer`) walk straight into hyper-util's error, its
/// `is_connect()` and the io error below it.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendError {
    /// The hyper-util client failed: connect, TLS, write, or the connection
    /// closed before the head arrived.
    Transport(hyper_util::client::legacy::Error),
    /// The request could not be turned into an upstream request (its URI
    /// could not be joined onto the base URL). Classified as
    /// `InvalidRequest` before send: it never left the gateway.
    InvalidRequest(Box<UpstreamError>),
}

impl SendError {
    /// The hyper-util error, for a transport failure.
    pub fn transport(&self) -> Option<&hyper_util::client::legacy::Error> {
        match self {
            Self::Transport(e) => Some(e),
            Self::InvalidRequest(_) => None,
        }
    }

    /// Whether the transport failed while connecting (so the request was
    /// never sent).
    pub fn is_connect(&self) -> bool {
        match self {
            Self::Transport(e) => e.is_connect(),
            Self::InvalidRequest(_) => false,
        }
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transport(_) => f.write_str("upstream transport error"),
            Self::InvalidRequest(_) => f.write_str("request cannot be sent upstream"),
        }
    }
}

impl Error for SendError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        // The inner errors themselves (not a Box around one), so that
        // downcasting in the classifier finds them.
        match self {
            Self::Transport(e) => Some(e),
            Self::InvalidRequest(e) => Some(&**e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{Classification, Classifier, FailureClass, Phase};

    #[test]
    fn an_unsendable_request_keeps_its_own_classification() {
        let error = SendError::InvalidRequest(Box::new(UpstreamError::new(Classification::new(
            FailureClass::InvalidRequest,
            Phase::BeforeSend,
        ))));
        assert!(!error.is_connect());
        assert!(error.transport().is_none());
        let c = Classifier::default().classify_transport(Some("p"), &error, false);
        assert_eq!(c.class, FailureClass::InvalidRequest);
        assert_eq!(c.phase, Phase::BeforeSend);
    }
}
