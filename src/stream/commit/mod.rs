//! The commit machine: one inspector for every stream the crate touches.
//!
//! A streamed answer moves through three phases, **Preamble → Committed →
//! Ended**. The [`StreamStateBody`] scans each upstream byte once with the SSE
//! scanner, asks the [`Dialect`](crate::dialect::Dialect) what each event
//! is, and tracks the phase, the bytes flushed, output events, usage and the
//! stream's identity in a [`StreamState`].
//!
//! The same body serves both sides of the commit point:
//!
//! - **Held back** (inside [`Failover`](crate::failover::Failover)): nothing
//!   is released until the [`CommitWindow`] is reached. A failure before
//!   then is handed back to the failover loop as a classification, and the
//!   client never sees a byte of that attempt. Once the window is reached
//!   the held frames and the rest of the upstream flow through the very
//!   same body (the linkerd2-proxy `peek` pattern): nothing is scanned
//!   twice.
//! - **Pass-through** (inside [`StreamStateLayer`](crate::stream::StreamStateLayer)):
//!   frames flow at once; the first output commits.
//!
//! After commit a failure ends the stream with the dialect's terminal event
//! and end marker, never with a second voice. One rule covers malformed
//! events in every phase: each is dropped and counted, and more than the
//! configured number fails the stream.

mod body;
mod failure;
mod state;
mod window;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

pub use body::StreamStateBody;
pub(crate) use body::{Hold, OnEnd, Release, is_event_stream};
pub use state::{StreamFailure, StreamIdentity, StreamSnapshot, StreamState, StreamStatus};
pub use window::CommitWindow;

use crate::classify::Classifier;
use crate::dialect::TerminalMode;

pub(crate) use crate::BoxError;

/// Default number of malformed events dropped before a stream fails.
pub(crate) const DEFAULT_MAX_MALFORMED: u64 = 3;

/// How streams are inspected and ended: shared by every body of one layer.
#[derive(Debug, Clone)]
pub(crate) struct InspectConfig<D> {
    pub(crate) dialect: D,
    pub(crate) terminal_mode: TerminalMode,
    pub(crate) finish_reason: Cow<'static, str>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_malformed: u64,
    pub(crate) max_line_bytes: usize,
    pub(crate) max_event_bytes: usize,
    pub(crate) classifier: Classifier,
    pub(crate) provider: Option<Arc<str>>,
    /// Ends running streams with the terminal event when it fires.
    pub(crate) shutdown: Option<crate::shutdown::Shutdown>,
}

impl<D> InspectConfig<D> {
    pub(crate) fn new(dialect: D) -> Self {
        Self {
            dialect,
            terminal_mode: TerminalMode::default(),
            finish_reason: Cow::Borrowed("error"),
            idle_timeout: None,
            max_malformed: DEFAULT_MAX_MALFORMED,
            max_line_bytes: crate::sse::DEFAULT_MAX_LINE_BYTES,
            max_event_bytes: crate::sse::DEFAULT_MAX_EVENT_BYTES,
            classifier: Classifier::default(),
            provider: None,
            shutdown: None,
        }
    }

    /// Takes a stream policy's settings.
    pub(crate) fn apply(&mut self, policy: &super::StreamPolicy) {
        self.terminal_mode = policy.terminal_mode;
        self.finish_reason = policy.finish_reason.clone();
        self.idle_timeout = policy.idle_timeout;
        self.max_malformed = policy.max_malformed;
        self.max_line_bytes = policy.max_line_bytes;
        self.max_event_bytes = policy.max_event_bytes;
    }

    /// The same settings for another dialect.
    pub(crate) fn with_dialect<D2>(self, dialect: D2) -> InspectConfig<D2> {
        InspectConfig {
            dialect,
            terminal_mode: self.terminal_mode,
            finish_reason: self.finish_reason,
            idle_timeout: self.idle_timeout,
            max_malformed: self.max_malformed,
            max_line_bytes: self.max_line_bytes,
            max_event_bytes: self.max_event_bytes,
            classifier: self.classifier,
            provider: self.provider,
            shutdown: self.shutdown,
        }
    }
}
