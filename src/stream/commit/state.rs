use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::time::Instant;

use crate::Usage;
use crate::{FailureClass, Phase};

/// Where a stream is (its [`Phase`]: preamble or committed) or how it
/// ended. Failover is legal only in [`StreamStatus::Preamble`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamStatus {
    /// No model output has reached the client yet.
    Preamble,
    /// Model output has been yielded to the client: the stream is committed.
    Committed,
    /// A finish reason or the end marker was seen; the stream ended cleanly.
    Finished,
    /// The stream failed and was ended with a terminal chunk.
    Failed,
    /// The client went away before the stream ended.
    Cancelled,
}

impl StreamStatus {
    fn from_u8(value: u8) -> Self {
        match value {
            0 => Self::Preamble,
            1 => Self::Committed,
            2 => Self::Finished,
            3 => Self::Failed,
            _ => Self::Cancelled,
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            Self::Preamble => 0,
            Self::Committed => 1,
            Self::Finished => 2,
            Self::Failed => 3,
            Self::Cancelled => 4,
        }
    }

    /// Whether the stream has ended one way or another.
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Self::Finished | Self::Failed | Self::Cancelled)
    }
}

/// How a stream failed, as recorded in its [`StreamState`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamFailure {
    /// The failure class.
    pub class: FailureClass,
    /// The phase the failure landed in: [`Phase::Preamble`] or
    /// [`Phase::Committed`].
    pub phase: Phase,
    /// A sanitized, bounded description.
    pub message: String,
    /// The provider's own error code or type, for in-band errors.
    pub provider_code: Option<String>,
    /// How the classification was reached when not from a provider answer
    /// (e.g. [`Note::TurnDeadline`](crate::classify::Note::TurnDeadline)).
    pub note: Option<crate::classify::Note>,
    /// Bytes of the upstream stream sent to the client before the failure.
    pub bytes_sent: u64,
    /// Model output events sent to the client before the failure.
    pub output_events: u64,
}

/// The last chunk identity a stream carried, owned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StreamIdentity {
    /// The completion id.
    pub id: Option<String>,
    /// The answering model.
    pub model: Option<String>,
    /// Creation time (Unix seconds).
    pub created: Option<i64>,
}

/// A point-in-time copy of a stream's state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamSnapshot {
    /// The status.
    pub status: StreamStatus,
    /// Bytes yielded to the client so far (synthetic frames included).
    pub bytes_flushed: u64,
    /// Model output events yielded to the client.
    pub output_events: u64,
    /// Malformed chunks dropped.
    pub malformed_dropped: u64,
    /// Time from the response head to the first model output.
    pub time_to_first_output: Option<std::time::Duration>,
    /// The last chunk identity seen.
    pub identity: StreamIdentity,
    /// The finish reason, once seen.
    pub finish_reason: Option<String>,
    /// Usage, if the stream reported it.
    pub usage: Option<Usage>,
    /// The failure, if the stream failed or was cancelled.
    pub failure: Option<StreamFailure>,
}

#[derive(Debug)]
struct Shared {
    status: AtomicU8,
    bytes_flushed: AtomicU64,
    output_events: AtomicU64,
    malformed: AtomicU64,
    started: Instant,
    first_output: OnceLock<Instant>,
    details: Mutex<Details>,
}

#[derive(Debug, Default)]
struct Details {
    identity: StreamIdentity,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    failure: Option<StreamFailure>,
}

/// A handle on one stream's state, readable while the stream runs.
///
/// [`StreamStateLayer`](crate::stream::StreamStateLayer) puts it in the extensions of
/// every `text/event-stream` response, so logs and other layers can tell
/// which phase a failure landed in and how many bytes the client received.
#[derive(Debug, Clone)]
pub struct StreamState {
    shared: Arc<Shared>,
}

impl StreamState {
    pub(crate) fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                status: AtomicU8::new(StreamStatus::Preamble.as_u8()),
                bytes_flushed: AtomicU64::new(0),
                output_events: AtomicU64::new(0),
                malformed: AtomicU64::new(0),
                started: Instant::now(),
                first_output: OnceLock::new(),
                details: Mutex::new(Details::default()),
            }),
        }
    }

    /// The current status: where the stream is (its phase) or how it ended.
    pub fn status(&self) -> StreamStatus {
        StreamStatus::from_u8(self.shared.status.load(Ordering::Acquire))
    }

    /// Bytes yielded to the client so far.
    pub(crate) fn bytes_flushed(&self) -> u64 {
        self.shared.bytes_flushed.load(Ordering::Acquire)
    }

    /// Model output events yielded to the client so far.
    pub(crate) fn output_events(&self) -> u64 {
        self.shared.output_events.load(Ordering::Acquire)
    }

    /// A consistent copy of everything recorded: bytes flushed, output
    /// events, usage, identity, the failure.
    pub fn snapshot(&self) -> StreamSnapshot {
        let details = self.details();
        StreamSnapshot {
            status: self.status(),
            bytes_flushed: self.bytes_flushed(),
            output_events: self.output_events(),
            malformed_dropped: self.shared.malformed.load(Ordering::Acquire),
            time_to_first_output: self
                .shared
                .first_output
                .get()
                .map(|at| at.saturating_duration_since(self.shared.started)),
            identity: details.identity.clone(),
            finish_reason: details.finish_reason.clone(),
            usage: details.usage,
            failure: details.failure.clone(),
        }
    }

    fn details(&self) -> std::sync::MutexGuard<'_, Details> {
        // A panic elsewhere while holding the lock leaves plain data behind;
        // reading it is still sound.
        self.shared
            .details
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn add_flushed(&self, bytes: u64) {
        self.shared.bytes_flushed.fetch_add(bytes, Ordering::AcqRel);
    }

    pub(crate) fn add_output_event(&self) {
        if self.shared.output_events.fetch_add(1, Ordering::AcqRel) == 0 {
            let _ = self.shared.first_output.set(Instant::now());
            self.set_status_if(StreamStatus::Preamble, StreamStatus::Committed);
        }
    }

    pub(crate) fn add_malformed(&self) -> u64 {
        self.shared.malformed.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(crate) fn set_status(&self, phase: StreamStatus) {
        self.shared.status.store(phase.as_u8(), Ordering::Release);
    }

    fn set_status_if(&self, from: StreamStatus, to: StreamStatus) {
        let _ = self.shared.status.compare_exchange(
            from.as_u8(),
            to.as_u8(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    pub(crate) fn set_identity(&self, identity: StreamIdentity) {
        self.details().identity = identity;
    }

    pub(crate) fn set_finish_reason(&self, reason: &str) {
        let mut details = self.details();
        if details.finish_reason.is_none() {
            details.finish_reason = Some(reason.to_owned());
        }
    }

    /// Usage reports are cumulative and may be partial (Anthropic reports
    /// input tokens at the start, output tokens at the end): each field
    /// keeps the largest count reported.
    pub(crate) fn set_usage(&self, usage: Usage) {
        let mut details = self.details();
        let merged = match details.usage {
            Some(seen) => Usage::new(
                seen.input_tokens.max(usage.input_tokens),
                seen.output_tokens.max(usage.output_tokens),
            ),
            None => usage,
        };
        details.usage = Some(merged);
    }

    pub(crate) fn set_failure(&self, failure: StreamFailure, status: StreamStatus) {
        self.details().failure = Some(failure);
        self.set_status(status);
    }
}
