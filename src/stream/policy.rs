//! How a stream is ended and bounded: one policy that the stream layer and
//! the failover layer both take.

use std::borrow::Cow;
use std::time::Duration;

use super::commit::DEFAULT_MAX_MALFORMED;
use crate::dialect::TerminalMode;

/// The stream settings: how a failed stream ends (terminal mode, finish
/// reason), how long it may be silent, and how much a malformed or
/// oversized stream is allowed.
///
/// [`StreamStateLayer::policy`](super::StreamStateLayer::policy) and
/// [`FailoverBuilder::stream_policy`](crate::failover::FailoverBuilder::stream_policy)
/// take it whole, so a setting lives in one place.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::dialect::TerminalMode;
/// use tower_llm_failover::stream::StreamPolicy;
///
/// let policy = StreamPolicy::new()
///     .terminal_mode(TerminalMode::Finish)
///     .idle_timeout(Duration::from_secs(30));
/// assert_eq!(policy.idle(), Some(Duration::from_secs(30)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPolicy {
    pub(crate) terminal_mode: TerminalMode,
    pub(crate) finish_reason: Cow<'static, str>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_malformed: u64,
    pub(crate) max_line_bytes: usize,
    pub(crate) max_event_bytes: usize,
}

impl Default for StreamPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamPolicy {
    /// The defaults: the dialect's error terminal event with finish reason
    /// `error`, no idle timeout, 3 malformed events tolerated, the SSE
    /// scanner's default line and event caps.
    pub fn new() -> Self {
        Self {
            terminal_mode: TerminalMode::default(),
            finish_reason: Cow::Borrowed("error"),
            idle_timeout: None,
            max_malformed: DEFAULT_MAX_MALFORMED,
            max_line_bytes: crate::sse::DEFAULT_MAX_LINE_BYTES,
            max_event_bytes: crate::sse::DEFAULT_MAX_EVENT_BYTES,
        }
    }

    /// How a stream that fails after commit is ended.
    pub fn terminal_mode(mut self, mode: TerminalMode) -> Self {
        self.terminal_mode = mode;
        self
    }

    /// The finish reason the terminal event carries (default `error`).
    pub fn finish_reason(mut self, reason: impl Into<Cow<'static, str>>) -> Self {
        self.finish_reason = reason.into();
        self
    }

    /// The longest gap between frames of an upstream body before the
    /// attempt fails with a timeout (before commit: rerouted; after: ended
    /// with the terminal event). Default: none.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// The idle timeout, if one is set.
    pub fn idle(&self) -> Option<Duration> {
        self.idle_timeout
    }

    /// Malformed events dropped before the stream fails (default 3).
    pub fn max_malformed(mut self, count: u64) -> Self {
        self.max_malformed = count;
        self
    }

    /// Longest SSE line accepted.
    pub fn max_line_bytes(mut self, limit: usize) -> Self {
        self.max_line_bytes = limit;
        self
    }

    /// Largest SSE event accepted.
    pub fn max_event_bytes(mut self, limit: usize) -> Self {
        self.max_event_bytes = limit;
        self
    }
}
