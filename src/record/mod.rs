//! Run and attempt records: every hop of a turn stays visible.
//!
//! A turn has one run id and one [`AttemptRecord`] per upstream attempt:
//! target, upstream model, start and duration, the class and phase of the
//! failure, the bytes flushed to the client before it (always 0 before
//! commit), output events, usage and cost, and the [`Decision`] taken.
//! "429 after 0 bytes" and "429 after 40 bytes" are different facts and the
//! records keep them apart.
//!
//! The failover layer puts a [`RunRecord`] handle in the response
//! extensions. For a stream it is completed when the stream ends, so read it
//! after the body is done (or watch it live).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use http::HeaderValue;

pub use crate::classify::RateLimitHeaders;
use crate::classify::{FailureClass, Phase};
use crate::dialect::Usage;
use crate::failover::Decision;
use crate::units::{Cost, RunId};

/// Response header with the number of upstream attempts the turn made.
pub const ATTEMPTS_HEADER: &str = "x-failover-attempts";
/// Response header with the name of the target that answered.
pub const TARGET_HEADER: &str = "x-failover-target";
/// Response header with the turn's run id.
pub const RUN_ID_HEADER: &str = "x-failover-run-id";

/// One upstream attempt of a turn.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AttemptRecord {
    /// 1-based attempt number within the turn.
    pub attempt: u32,
    /// Target name.
    pub target: Arc<str>,
    /// Provider name.
    pub provider: Arc<str>,
    /// The model name sent upstream.
    pub upstream_model: String,
    /// The model the upstream said answered, when it said.
    pub response_model: Option<String>,
    /// Wall-clock start.
    pub started: SystemTime,
    /// How long the attempt took (for a committed stream: until it ended).
    pub duration: Duration,
    /// The failure class, if the attempt failed.
    pub class: Option<FailureClass>,
    /// The phase the failure landed in.
    pub phase: Option<Phase>,
    /// The upstream's HTTP status, when there was one.
    pub status: Option<u16>,
    /// Bytes of this attempt flushed to the client before its failure (0 for
    /// every failure before commit), or in all for a committed attempt.
    pub bytes_flushed: u64,
    /// Model output events seen (held back or sent).
    pub output_events: u64,
    /// Time from the attempt's start to its first output.
    pub time_to_first_output: Option<Duration>,
    /// Usage, reported or estimated.
    pub usage: Option<Usage>,
    /// Cost of the attempt at the target's price.
    pub cost: Option<Cost>,
    /// Whether usage and cost are estimates (the upstream reported none).
    pub estimated: bool,
    /// The failure's sanitized message.
    pub message: Option<String>,
    /// The provider's rate-limit headers on the attempt's response
    /// (`anthropic-ratelimit-*`, `x-ratelimit-*`, `retry-after`), as sent.
    pub rate_limits: RateLimitHeaders,
    /// The decision taken.
    pub decision: Decision,
}

#[derive(Debug, Default)]
struct RunInner {
    attempts: Vec<AttemptRecord>,
    winner: Option<Arc<str>>,
    done: bool,
}

/// A turn's record: its run id and attempts. Cheap to clone; shared with the
/// stream that is still running.
#[derive(Debug, Clone)]
pub struct RunRecord {
    run_id: RunId,
    inner: Arc<Mutex<RunInner>>,
}

impl RunRecord {
    /// An empty record for `run_id`.
    pub fn new(run_id: RunId) -> Self {
        Self {
            run_id,
            inner: Arc::default(),
        }
    }

    /// The turn's run id.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of the attempts so far.
    pub fn attempts(&self) -> Vec<AttemptRecord> {
        self.lock().attempts.clone()
    }

    /// The number of attempts so far.
    pub fn attempt_count(&self) -> usize {
        self.lock().attempts.len()
    }

    /// The target that answered, once one committed.
    pub fn winner(&self) -> Option<Arc<str>> {
        self.lock().winner.clone()
    }

    /// Whether the turn is over (for a stream: the stream has ended).
    pub fn is_done(&self) -> bool {
        self.lock().done
    }

    pub(crate) fn push(&self, record: AttemptRecord) {
        emit(self.run_id.as_str(), &record);
        self.push_quietly(record);
    }

    /// Adds a committed stream's record, logged once, when the stream ends
    /// ([`finish_last`](Self::finish_last)) with its final figures.
    pub(crate) fn push_streaming(&self, record: AttemptRecord) {
        self.push_quietly(record);
    }

    fn push_quietly(&self, record: AttemptRecord) {
        let mut inner = self.lock();
        if record.decision == Decision::Committed {
            inner.winner = Some(record.target.clone());
        }
        inner.attempts.push(record);
    }

    /// Updates the last attempt (a committed stream's final figures).
    pub(crate) fn finish_last(&self, update: impl FnOnce(&mut AttemptRecord)) {
        let mut inner = self.lock();
        if let Some(last) = inner.attempts.last_mut() {
            update(last);
            emit(self.run_id.as_str(), last);
        }
        inner.done = true;
    }

    pub(crate) fn mark_done(&self) {
        self.lock().done = true;
    }

    /// The summary headers: attempt count, winning target, run id.
    pub fn summary_headers(&self) -> Vec<(&'static str, HeaderValue)> {
        let inner = self.lock();
        let mut headers = vec![(ATTEMPTS_HEADER, HeaderValue::from(inner.attempts.len()))];
        if let Some(winner) = &inner.winner
            && let Ok(value) = HeaderValue::from_str(winner)
        {
            headers.push((TARGET_HEADER, value));
        }
        if let Ok(value) = HeaderValue::from_str(self.run_id.as_str()) {
            headers.push((RUN_ID_HEADER, value));
        }
        headers
    }
}

/// One tracing event per attempt (a committed stream's when it ends).
/// The run id and the model may be the client's, so they are escaped.
fn emit(run_id: &str, r: &AttemptRecord) {
    tracing::info!(
        target: "tower_llm_failover::attempt",
        run_id = %log_safe(run_id),
        attempt = r.attempt,
        target = %log_safe(&r.target),
        provider = %log_safe(&r.provider),
        upstream_model = %log_safe(&r.upstream_model),
        class = r.class.map(FailureClass::as_str),
        phase = r.phase.map(Phase::as_str),
        status = r.status,
        bytes_flushed = r.bytes_flushed,
        output_events = r.output_events,
        duration_ms = r.duration.as_millis() as u64,
        input_tokens = r.usage.map(|u| u.prompt_tokens),
        output_tokens = r.usage.map(|u| u.completion_tokens),
        cost_usd = r.cost.map(Cost::as_usd),
        estimated = r.estimated,
        decision = r.decision.as_str(),
        "attempt"
    );
}

/// A value made safe for one log line: its [`Display`](fmt::Display) text
/// with control characters (newlines, ANSI escapes), quotes and
/// backslashes escaped as Rust's [`char::escape_debug`] does, so a
/// client-chosen value (a model name, an id) can never forge a line or
/// restyle a terminal. Nothing is allocated.
///
/// ```
/// use tower_llm_failover::record::log_safe;
///
/// let model = "gpt-x\nINFO forged \u{1b}[31mred";
/// assert_eq!(log_safe(model).to_string(), r"gpt-x\nINFO forged \u{1b}[31mred");
/// ```
pub fn log_safe<T: fmt::Display>(value: T) -> LogSafe<T> {
    LogSafe(value)
}

/// A value escaped for a log line: see [`log_safe`].
#[derive(Debug, Clone, Copy)]
pub struct LogSafe<T>(T);

impl<T: fmt::Display> fmt::Display for LogSafe<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        write!(Escaping(f), "{}", self.0)
    }
}

/// Writes through to a formatter, escaping as it goes.
struct Escaping<'a, 'b>(&'a mut fmt::Formatter<'b>);

impl fmt::Write for Escaping<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            for e in c.escape_debug() {
                self.0.write_char(e)?;
            }
        }
        Ok(())
    }
}
