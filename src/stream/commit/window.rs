use std::time::Duration;

/// When a streamed answer is released to the client: the commit point.
///
/// Until commit nothing of the attempt reaches the client, so a failure
/// inside the window is rerouted invisibly and the client gets one whole
/// answer from the backup. The default commits on the first model output,
/// adding nothing to time to first token; a wider window trades time to
/// first token for invisible failover. Whichever limit is reached first
/// commits; a finish reason or the end of the response always does. Held
/// output is also capped in memory: reaching
/// [`Caps::held_bytes`](crate::failover::Caps::held_bytes) commits too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitWindow {
    pub(crate) output_events: Option<u64>,
    pub(crate) output_bytes: Option<u64>,
    pub(crate) after_first_output: Option<Duration>,
}

impl Default for CommitWindow {
    fn default() -> Self {
        Self::first_output()
    }
}

impl CommitWindow {
    /// Commit on the first model output (the default).
    pub fn first_output() -> Self {
        Self::output_events(1)
    }

    /// Commit after `n` output events.
    pub fn output_events(n: u64) -> Self {
        Self {
            output_events: Some(n.max(1)),
            output_bytes: None,
            after_first_output: None,
        }
    }

    /// Commit only at the end of the response: the whole answer is held.
    pub fn end_of_response() -> Self {
        Self {
            output_events: None,
            output_bytes: None,
            after_first_output: None,
        }
    }

    /// Also commit once `bytes` of held output have been seen.
    pub fn or_bytes(mut self, bytes: u64) -> Self {
        self.output_bytes = Some(bytes);
        self
    }

    /// Also commit this long after the first output.
    pub fn or_after(mut self, duration: Duration) -> Self {
        self.after_first_output = Some(duration);
        self
    }

    /// Whether held output of `events` events and `bytes` bytes commits.
    pub(crate) fn reached(&self, events: u64, bytes: u64) -> bool {
        events > 0
            && (self.output_events.is_some_and(|n| events >= n)
                || self.output_bytes.is_some_and(|b| bytes >= b))
    }
}
