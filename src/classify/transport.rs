//! Transport failures from the upstream client, read from the error's
//! `source()` chain.

use std::error::Error;
use std::io;

use super::error::UpstreamError;
use super::{Classification, FailureClass, Phase};

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
    /// The hyper-util client said the connector failed.
    connect_stage: bool,
    timeout: bool,
    parse: bool,
    user: bool,
    io_kind: Option<io::ErrorKind>,
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
                stack.push(inner);
            }
            continue;
        }
        if e.is::<tokio::time::error::Elapsed>() {
            seen.timeout = true;
        }
        #[cfg(feature = "client")]
        inspect_client(e, &mut seen);
        if let Some(next) = e.source() {
            stack.push(next);
        }
    }

    let before_send = seen.connect_stage || seen.io_kind.is_some_and(is_before_send);
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
    let note = match (class, phase) {
        (FailureClass::Connect, Phase::BeforeSend) => "connect_failed",
        (FailureClass::Connect, _) => "connection_lost",
        (FailureClass::Timeout, _) => "transport_timeout",
        _ => "transport_error",
    };
    Classification::new(class, phase)
        .with_message(text)
        .with_note(note)
}

#[cfg(feature = "client")]
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
