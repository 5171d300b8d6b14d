use std::time::Duration;

/// When a streamed answer is released to the client: the commit point.
///
/// Until commit nothing of the attempt reaches the client, so a failure
/// inside the window is rerouted invisibly and the client gets one whole
/// answer from the backup. The default commits on the first model output,
/// adding nothing to time to first token; a wider window trades time to
/// first token for invisible failover. Whichever limit is reached first
/// commits; a finish reason or the end of the response always does (with
/// every limit `None` the whole answer is held). Held output is also capped
/// in memory: reaching [`Caps::held_bytes`](crate::failover::Caps::held_bytes)
/// commits too.
///
/// Plain data: set the limits you need and take the rest from `Default`.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::stream::CommitWindow;
///
/// // Hold up to 64 output events or 2 s after the first one.
/// let wider = CommitWindow {
///     output_events: Some(64),
///     after_first_output: Some(Duration::from_secs(2)),
///     ..CommitWindow::default()
/// };
/// // Only the end of the response commits: the whole answer is held.
/// let whole = CommitWindow {
///     output_events: None,
///     ..CommitWindow::default()
/// };
/// # let _ = (wider, whole);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitWindow {
    /// Commit after this many output events (default `Some(1)`: on the
    /// first model output; 0 is taken as 1).
    pub output_events: Option<u64>,
    /// Also commit once this many bytes of held output have been seen.
    pub output_bytes: Option<u64>,
    /// Also commit this long after the first output.
    pub after_first_output: Option<Duration>,
}

impl Default for CommitWindow {
    /// Commit on the first model output.
    fn default() -> Self {
        Self {
            output_events: Some(1),
            output_bytes: None,
            after_first_output: None,
        }
    }
}

impl CommitWindow {
    /// Whether held output of `events` events and `bytes` bytes commits
    /// (an `output_events` of 0 commits on the first, as 1 does).
    pub(crate) fn reached(&self, events: u64, bytes: u64) -> bool {
        events > 0
            && (self.output_events.is_some_and(|n| events >= n)
                || self.output_bytes.is_some_and(|b| bytes >= b))
    }
}
