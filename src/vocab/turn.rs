//! A turn's words: its id, how it ended, why it stopped, and the deadline
//! every layer reads.

use std::error::Error as StdError;

use super::Phase;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// The id of one turn (one client request and all its hops), shared by its
/// records and log lines.
///
/// A turn the library starts gets 16 lowercase hex characters (64 random bits, not
/// a secret); [`From<String>`] adopts an id chosen elsewhere (a request id
/// header, say). Cloning is cheap.
#[derive(Clone)]
pub struct TurnId(Repr);

/// A random id is kept inline (no allocation per turn); an adopted one is
/// shared text.
#[derive(Clone)]
enum Repr {
    Hex(HexText),
    Text(Arc<str>),
}

/// A random id's 16 hex digits, word-aligned: the UTF-8 check of
/// [`TurnId::as_str`] then reads them as two words (unaligned, byte by
/// byte: about 160 instructions, twice a turn).
#[derive(Clone, Copy)]
#[repr(align(8))]
struct HexText([u8; 16]);

impl TurnId {
    /// A fresh random id from fastrand's thread-local generator.
    pub(crate) fn random() -> Self {
        Self::from_rng(&mut fastrand::Rng::new())
    }

    /// A random id from the given generator (seed it for reproducible ids).
    pub(crate) fn from_rng(rng: &mut fastrand::Rng) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut n = rng.u64(..);
        let mut text = [b'0'; 16];
        for digit in text.iter_mut().rev() {
            *digit = HEX[(n & 0xf) as usize];
            n >>= 4;
        }
        TurnId(Repr::Hex(HexText(text)))
    }

    /// The id's bytes: its text's, without checking them as UTF-8 again
    /// (a header value is made from these).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Hex(HexText(text)) => text,
            Repr::Text(text) => text.as_bytes(),
        }
    }

    /// The id as a log line writes it: a random id as it is (hex digits
    /// need no escaping, and skipping the escaping pass is most of what
    /// writing it costs), an adopted one through
    /// [`log_safe`](crate::util::log_safe).
    pub(crate) fn logged(&self) -> LoggedTurnId<'_> {
        LoggedTurnId(self)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Always ASCII hex digits: the fallback is never taken.
            Repr::Hex(HexText(text)) => std::str::from_utf8(text).unwrap_or_default(),
            Repr::Text(text) => text,
        }
    }
}

// Compared, hashed and shown as the text, whichever way it is kept.
impl PartialEq for TurnId {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for TurnId {}

impl std::hash::Hash for TurnId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for TurnId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TurnId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl fmt::Debug for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TurnId").field(&self.as_str()).finish()
    }
}

impl fmt::Display for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A turn id as a log line writes it: see [`TurnId::logged`].
pub(crate) struct LoggedTurnId<'a>(&'a TurnId);

impl fmt::Display for LoggedTurnId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.0 {
            Repr::Hex(_) => f.write_str(self.0.as_str()),
            Repr::Text(text) => crate::util::log_safe(&**text).fmt(f),
        }
    }
}

impl From<&str> for TurnId {
    fn from(id: &str) -> Self {
        TurnId(Repr::Text(id.into()))
    }
}

impl AsRef<str> for TurnId {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for TurnId {
    fn from(id: String) -> Self {
        TurnId(Repr::Text(id.into()))
    }
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TurnOutcome {
    /// The first attempt answered.
    FirstTry,
    /// An answer came after one or more hops (retries or reroutes).
    AfterHop,
    /// An answer was committed, then failed (ended with a terminal event)
    /// or was cut short by the client.
    EndedAfterCommit,
    /// No model output reached the client: the turn answered with an error.
    StoppedBeforeOutput,
}

impl TurnOutcome {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FirstTry => "first_try",
            Self::AfterHop => "after_hop",
            Self::EndedAfterCommit => "ended_after_commit",
            Self::StoppedBeforeOutput => "stopped_before_output",
        }
    }
}

/// Why a turn stopped without a whole answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The gateway could not serve the request (unreadable body, no
    /// compatible target).
    InvalidRequest,
    /// The provider refused the request itself (a request error): it is
    /// never sent elsewhere.
    RequestError,
    /// Every option was tried and failed.
    Exhausted,
    /// Every target was cooling down.
    NoAvailableTarget,
    /// The turn's deadline passed.
    Deadline,
    /// The turn's attempts were used up.
    Attempts,
    /// The next attempt would have passed the spend ceiling.
    SpendCeiling,
    /// The retry budget shared across turns refused another attempt.
    RetryBudget,
    /// The client went away (or an outer layer answered first).
    Cancelled,
    /// A committed stream failed and was ended with a terminal event.
    StreamFailed,
    /// The gateway shut down before the turn answered.
    Shutdown,
    /// The tenant's spend reached its ceiling for the window
    /// (`TenantSpend`).
    TenantCeiling,
    /// The request named no tenant, and one is required.
    TenantRequired,
    /// The tenant's spend could not be read and the check fails closed.
    SpendStoreUnavailable,
}

impl StopReason {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::RequestError => "request_error",
            Self::Exhausted => "exhausted",
            Self::NoAvailableTarget => "no_available_target",
            Self::Deadline => "deadline",
            Self::Attempts => "attempts",
            Self::SpendCeiling => "spend_ceiling",
            Self::RetryBudget => "retry_budget",
            Self::Cancelled => "cancelled",
            Self::StreamFailed => "stream_failed",
            Self::Shutdown => "shutdown",
            Self::TenantCeiling => "tenant_ceiling",
            Self::TenantRequired => "tenant_required",
            Self::SpendStoreUnavailable => "spend_store_unavailable",
        }
    }
}

/// The turn's deadline, as a request extension.
///
/// The budget layer inserts it for every turn it serves (from its
/// [`TurnBudget::turn_deadline`](crate::budget::TurnBudget::turn_deadline));
/// the stream layer reads it and ends a stream at the deadline with its
/// terminal event, needing none of the budget's types. A stack that starts
/// its own `TurnBudget` inserts this beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnDeadline {
    /// When the turn's time is up.
    pub at: Instant,
    /// The whole time the turn was given.
    pub limit: Duration,
}

impl TurnDeadline {
    /// Time left before the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }
}

/// The turn's deadline passed while the [`Budget`](crate::budget::Budget) service
/// waited for the response head or streamed the response body.
///
/// Its class is [`FailureClass::Timeout`](crate::FailureClass::Timeout), and its recovery
/// [`Decision::Stop`](crate::Decision::Stop): the turn has no time left for
/// another hop (see its
/// [`classification`](DeadlineExceeded::classification)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "turn {turn_id}: deadline of {limit:?} passed in phase {phase} ({elapsed:?} elapsed, {body_bytes} body bytes passed)"
)]
pub struct DeadlineExceeded {
    /// The turn that ran out of time.
    pub turn_id: TurnId,
    /// Where the deadline passed.
    ///
    /// [`Phase::Head`] while waiting for the response head. In the body the
    /// budget layer cannot see commit, so it says [`Phase::Preamble`] when no
    /// body byte had passed yet and [`Phase::Committed`] once any had (bytes
    /// that went out cannot be taken back, so the stream must be ended, not
    /// rerouted). A stream layer that tracks commit knows better.
    pub phase: Phase,
    /// The turn's whole time budget.
    pub limit: Duration,
    /// Time since the turn started when the deadline fired.
    pub elapsed: Duration,
    /// Body data bytes that passed through the budget layer before the
    /// deadline (0 for a head timeout).
    pub body_bytes: u64,
}

impl DeadlineExceeded {
    /// Find a `DeadlineExceeded` in an error or its chain of sources (e.g.
    /// behind a boxed body error).
    pub fn find_in<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a DeadlineExceeded> {
        crate::util::find_in_chain(error)
    }
}

#[cfg(test)]
mod tests {
    use super::TurnId;

    /// A random id goes into a line as it is; an adopted one (a client's
    /// request id) escaped, so that it cannot end or forge a line.
    #[test]
    fn a_logged_turn_id_is_escaped_unless_it_is_a_random_one() {
        let random = TurnId::from_rng(&mut fastrand::Rng::with_seed(7));
        assert_eq!(random.logged().to_string(), random.as_str());
        assert_eq!(random.as_bytes(), random.as_str().as_bytes());
        let forged = TurnId::from("req-1\nINFO forged \u{1b}[31m");
        assert_eq!(
            forged.logged().to_string(),
            r"req-1\nINFO forged \u{1b}[31m"
        );
        assert_eq!(forged.as_bytes(), forged.as_str().as_bytes());
    }
}
