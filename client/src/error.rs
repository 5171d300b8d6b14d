//! The client's errors: building it, and sending a request.

use std::error::Error;
use std::fmt;
use std::path::PathBuf;

use tower_llm_failover::classify::{NotSent, UpstreamError};

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
    /// A CA bundle (`ca_file`) could not be read or holds no usable CA
    /// certificate.
    #[error("CA file {}: {reason}", path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (never its contents).
        reason: String,
    },
    /// The client certificate chain (`client_cert_file`) could not be read.
    #[error("client certificate file {}: {reason}", path.display())]
    ClientCertificate {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (never its contents).
        reason: String,
    },
    /// The client private key (`client_key_file`) could not be read, or
    /// does not belong to the certificate.
    #[error("client key file {}: {reason}", path.display())]
    ClientKey {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (never its contents).
        reason: String,
    },
    /// The platform's trust store was asked for and holds nothing usable.
    #[error("native roots: {0}")]
    NativeRoots(String),
    /// The trust options leave no root at all (webpki roots off, no native
    /// roots, no CA file): no server could ever be verified.
    #[error("no trust roots: enable the webpki or native roots, or give a CA file")]
    NoTrustRoots,
    /// The proxy URL is not `http://host:port` (the URL itself is not
    /// echoed: it may carry credentials).
    #[error("invalid proxy URL: {0}")]
    InvalidProxyUrl(String),
    /// The proxy URL's scheme is not `http`: only HTTP CONNECT proxies
    /// reached over plain TCP are supported.
    #[error("proxy URL scheme must be http, got {0:?}")]
    UnsupportedProxyScheme(String),
}

/// Why a request did not get a response head from the upstream.
///
/// Its `source()` is the underlying error itself, so
/// [`Classifier::classify_transport`](tower_llm_failover::classify::Classifier::classify_transport)
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
    /// A plain-`http` target (pooled by the client itself): the request
    /// was not sent, because the connection could not be made or closed
    /// before the request was written. Its source is the cause.
    NotSent(NotSent),
    /// A plain-`http` target: hyper failed once the request was written
    /// (the connection closed or broke before the response head).
    Http(hyper::Error),
}

impl SendError {
    /// The hyper-util error, for a transport failure of an `https` or
    /// proxied target.
    pub fn transport(&self) -> Option<&hyper_util::client::legacy::Error> {
        match self {
            Self::Transport(e) => Some(e),
            Self::InvalidRequest(_) | Self::NotSent(_) | Self::Http(_) => None,
        }
    }

    /// Whether the transport failed while connecting (so the request was
    /// never sent).
    pub fn is_connect(&self) -> bool {
        match self {
            Self::Transport(e) => e.is_connect(),
            Self::NotSent(_) => true,
            Self::InvalidRequest(_) | Self::Http(_) => false,
        }
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transport(_) | Self::Http(_) => f.write_str("upstream transport error"),
            Self::InvalidRequest(_) => f.write_str("request cannot be sent upstream"),
            Self::NotSent(_) => {
                f.write_str("upstream connection failed before the request was sent")
            }
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
            Self::NotSent(e) => Some(e),
            Self::Http(e) => Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_llm_failover::{FailureClass, Phase, classify::Classification, classify::Classifier};

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
