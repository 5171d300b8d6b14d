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
/// take it whole, so a setting lives in one place. Plain data: set the
/// fields you need and take the rest from [`StreamPolicy::new`].
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::dialect::TerminalMode;
/// use tower_llm_failover::stream::StreamPolicy;
///
/// let policy = StreamPolicy {
///     terminal_mode: TerminalMode::Finish,
///     idle_timeout: Some(Duration::from_secs(30)),
///     ..StreamPolicy::new()
/// };
/// assert_eq!(policy.finish_reason, "error");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPolicy {
    /// How a stream that fails after commit is ended (default: the
    /// dialect's error terminal event).
    pub terminal_mode: TerminalMode,
    /// The finish reason the terminal event carries (default `error`).
    pub finish_reason: Cow<'static, str>,
    /// The longest gap between frames of an upstream body before the
    /// attempt fails with a timeout (before commit: rerouted; after: ended
    /// with the terminal event). Default: none.
    pub idle_timeout: Option<Duration>,
    /// Malformed events dropped before the stream fails (default 3).
    pub max_malformed: u64,
    /// Longest SSE line accepted (default: the SSE scanner's cap, 1 MiB).
    pub max_line_bytes: usize,
    /// Largest SSE event accepted (default: the SSE scanner's cap, 1 MiB).
    pub max_event_bytes: usize,
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

    /// Declares an idle timeout (sets
    /// [`idle_timeout`](Self::idle_timeout) to `Some(timeout)`).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }
}
