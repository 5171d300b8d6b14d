//! Transport failures from the upstream client, read from the error's
//! `source()` chain.

use crate::classify::Note;
use std::error::Error;
use std::io;

use super::Classification;
use super::error::UpstreamError;
use crate::{FailureClass, Phase};

/// A connection check that failed before the request reached the
/// upstream's application: an egress proxy that refused the tunnel, a
/// policy that rejected the destination. A client's error type implements
/// it, and the client puts the error in its chain as a [`FailedCheck`]: the
/// classifier reads the note from there (class `connect`, phase
/// before-send), knowing nothing of the client.
pub trait ConnectionCheck: Error + Send + Sync + 'static {
    /// The classification's note.
    fn note(&self) -> Note;
    /// What failed, in a few words; the classification's message.
    fn what(&self) -> &'static str;
}

/// A [`ConnectionCheck`] failure, as it travels in an error chain (its
/// source is the check's own error).
#[derive(Debug)]
pub struct FailedCheck(Box<dyn ConnectionCheck>);

impl FailedCheck {
    /// Wraps a failed check for the error chain.
    pub fn new(check: impl ConnectionCheck) -> Self {
        Self(Box::new(check))
    }
}

impl std::fmt::Display for FailedCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl Error for FailedCheck {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

/// The request never left the client: the connection could not be made,
/// or it closed before the request was written. A client puts it in its
/// error chain (its source is the cause); the classifier reads the phase
/// from it (before-send: safe to send elsewhere), knowing nothing of the
/// client. hyper-util's client says the same with its `is_connect`.
#[derive(Debug)]
pub struct NotSent(crate::BoxError);

impl NotSent {
    /// The request was not sent, because of `cause`.
    pub fn new(cause: impl Into<crate::BoxError>) -> Self {
        Self(cause.into())
    }
}

impl std::fmt::Display for NotSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request was not sent")
    }
}

impl Error for NotSent {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

/// Deepest chain walked; error chains are short, this only bounds a cycle.
const MAX_DEPTH: usize = 32;

/// io kinds that mean the request never left (refused, DNS, no route).
fn is_before_send(kind: io::ErrorKind) -> bool {
    use io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | NotFound
            | AddrNotAvailable
            | AddrInUse
            | HostUnreachable
            | NetworkUnreachable
            | NetworkDown
    )
}

#[derive(Default)]
struct Seen {
    /// The client said the request never left ([`NotSent`], hyper-util's
    /// `is_connect`).
    connect_stage: bool,
    timeout: bool,
    parse: bool,
    user: bool,
    io_kind: Option<io::ErrorKind>,
    /// A TLS or proxy check that failed: the upstream's application never
    /// saw the request.
    check: Option<Check>,
}

/// Which connection check failed, for the note and the message.
#[derive(Clone, Copy)]
struct Check {
    note: Note,
    what: &'static str,
}

/// Classifies a transport error; see [`Classifier::classify_transport`].
///
/// [`Classifier::classify_transport`]: super::Classifier::classify_transport
pub(crate) fn classify(error: &(dyn Error + 'static), head_received: bool) -> Classification {
    let mut seen = Seen::default();
    let mut stack: Vec<&(dyn Error + 'static)> = vec![error];
    let mut visited = 0;
    while let Some(e) = stack.pop() {
        visited += 1;
        if visited > MAX_DEPTH {
            break;
        }
        if let Some(upstream) = e.downcast_ref::<UpstreamError>() {
            // Already classified by an inner ClassifyLayer.
            return upstream.classification().clone();
        }
        if let Some(io_err) = e.downcast_ref::<io::Error>() {
            seen.io_kind.get_or_insert(io_err.kind());
            if io_err.kind() == io::ErrorKind::TimedOut {
                seen.timeout = true;
            }
            // io::Error::source skips the wrapped error itself; get_ref does not.
            if let Some(inner) = io_err.get_ref() {
                #[cfg(feature = "hyper")]
                if io_err.kind() == io::ErrorKind::InvalidData && seen.check.is_none() {
                    seen.check = alert_text_check(&inner.to_string());
                }
                stack.push(inner);
            }
            continue;
        }
        if e.is::<tokio::time::error::Elapsed>() {
            seen.timeout = true;
        }
        if e.is::<NotSent>() {
            seen.connect_stage = true;
        }
        if let Some(failed) = e.downcast_ref::<FailedCheck>() {
            seen.check.get_or_insert(Check {
                note: failed.0.note(),
                what: failed.0.what(),
            });
        }
        #[cfg(feature = "hyper")]
        inspect_client(e, &mut seen);
        if let Some(next) = e.source() {
            stack.push(next);
        }
    }

    // A failed TLS or proxy check refuses the connection before the
    // upstream's application sees a request (with TLS 1.3 the server's
    // refusal of a client certificate arrives after the client's side of
    // the handshake, while the request is being sent). Once a head came
    // back, the connection had been accepted.
    let check_refused = seen.check.is_some() && !head_received;
    let before_send =
        seen.connect_stage || check_refused || seen.io_kind.is_some_and(is_before_send);
    let phase = if before_send {
        Phase::BeforeSend
    } else if head_received {
        Phase::Preamble
    } else {
        Phase::Head
    };
    let text = chain_text(error);
    let class = if seen.timeout || (seen.io_kind.is_none() && looks_like_timeout(&text)) {
        FailureClass::Timeout
    } else if seen.parse || (!before_send && seen.io_kind == Some(io::ErrorKind::InvalidData)) {
        FailureClass::InvalidResponse
    } else if seen.user {
        FailureClass::InvalidRequest
    } else {
        FailureClass::Connect
    };
    let note = match (class, phase, seen.check) {
        (FailureClass::Connect, _, Some(check)) => check.note,
        (FailureClass::Connect, Phase::BeforeSend, None) => Note::ConnectFailed,
        (FailureClass::Connect, _, None) => Note::ConnectionLost,
        (FailureClass::Timeout, _, _) => Note::TransportTimeout,
        _ => Note::TransportError,
    };
    let text = match seen.check {
        // Which check failed comes first: the message is bounded.
        Some(check) => format!("{}: {text}", check.what),
        None => text,
    };
    Classification::new(class, phase)
        .with_message(text)
        .with_note(note)
}

#[cfg(feature = "hyper")]
fn inspect_client(e: &(dyn Error + 'static), seen: &mut Seen) {
    if let Some(client) = e.downcast_ref::<hyper_util::client::legacy::Error>()
        && client.is_connect()
    {
        seen.connect_stage = true;
    }
    if let Some(h) = e.downcast_ref::<hyper::Error>() {
        if h.is_timeout() {
            seen.timeout = true;
        }
        if h.is_parse() || h.is_parse_status() {
            seen.parse = true;
        }
        // A user error (our own request body failed, bad header mix) is
        // ours, not the provider's; a body write abort is the caller leaving.
        if h.is_user() && !h.is_body_write_aborted() {
            seen.user = true;
        }
    }
    if seen.check.is_none()
        && let Some(tls) = e.downcast_ref::<rustls::Error>()
    {
        seen.check = tls_check(tls);
    }
}

/// The TLS failures that mean "this connection was refused at the
/// handshake": the server's application never saw a request.
#[cfg(feature = "hyper")]
fn tls_check(error: &rustls::Error) -> Option<Check> {
    use rustls::{CertificateError as Cert, Error as E};
    let check = |note, what| Some(Check { note, what });
    match error {
        E::InvalidCertificate(cert) => match cert {
            Cert::UnknownIssuer => check(
                Note::TlsUnknownCa,
                "TLS: the upstream's certificate is signed by an unknown CA (not in the trusted roots)",
            ),
            Cert::NotValidForName | Cert::NotValidForNameContext { .. } => check(
                Note::TlsNameMismatch,
                "TLS: the upstream's certificate does not match the host name",
            ),
            Cert::Expired
            | Cert::ExpiredContext { .. }
            | Cert::NotValidYet
            | Cert::NotValidYetContext { .. } => check(
                Note::TlsCertificateExpired,
                "TLS: the upstream's certificate is expired or not yet valid",
            ),
            _ => check(
                Note::TlsBadCertificate,
                "TLS: the upstream's certificate is invalid",
            ),
        },
        E::NoCertificatesPresented => check(
            Note::TlsBadCertificate,
            "TLS: the upstream presented no certificate",
        ),
        E::AlertReceived(alert) => alert_check(&format!("{alert:?}")),
        E::PeerIncompatible(_) | E::NoApplicationProtocol => check(
            Note::TlsHandshakeFailed,
            "TLS: no protocol version, cipher suite or ALPN protocol in common with the upstream",
        ),
        _ => None,
    }
}

/// A TLS alert the upstream sent, by its rustls name. HTTP/2 keeps only
/// the text of an io error (`received fatal alert: CertificateRequired`),
/// so the name is what both paths share.
#[cfg(feature = "hyper")]
fn alert_check(name: &str) -> Option<Check> {
    let check = |note, what| Some(Check { note, what });
    match name {
        "CertificateRequired" => check(
            Note::TlsClientCertificateRequired,
            "TLS: the upstream requires a client certificate (mTLS) and none was sent",
        ),
        "BadCertificate"
        | "UnsupportedCertificate"
        | "CertificateRevoked"
        | "CertificateExpired"
        | "CertificateUnknown"
        | "UnknownCA"
        | "AccessDenied" => check(
            Note::TlsClientCertificateRejected,
            "TLS: the upstream rejected the client certificate",
        ),
        "HandshakeFailure"
        | "ProtocolVersion"
        | "InsufficientSecurity"
        | "NoApplicationProtocol" => check(
            Note::TlsHandshakeRefused,
            "TLS: the upstream refused the handshake",
        ),
        _ => None,
    }
}

/// The text of an io error whose rustls error was flattened to a string.
#[cfg(feature = "hyper")]
fn alert_text_check(text: &str) -> Option<Check> {
    alert_check(text.strip_prefix("received fatal alert: ")?.trim())
}

/// For error types we cannot downcast (other clients, tower's own
/// `Elapsed` without its feature), the wording is the only signal.
fn looks_like_timeout(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("timed out") || lower.contains("timeout") || lower.contains("deadline")
}

/// "outer: inner: innermost", for the message (sanitized by the caller).
fn chain_text(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    let mut depth = 0;
    while let Some(e) = next {
        depth += 1;
        if depth > 8 {
            break;
        }
        let part = e.to_string();
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = e.source();
    }
    if text.is_empty() {
        "transport error".to_owned()
    } else {
        text
    }
}
