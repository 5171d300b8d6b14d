//! Turn and attempt records.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use http::HeaderValue;

use crate::Decision;
use crate::Usage;
pub(crate) use crate::classify::RateLimitHeaders;
use crate::util::log_safe;
use crate::{Cost, StopReason, TurnId, TurnOutcome};
use crate::{FailureClass, Phase};

/// Response header with the number of upstream attempts the turn made.
pub(crate) const ATTEMPTS_HEADER: &str = "x-failover-attempts";
/// Response header with the name of the target that answered.
pub(crate) const TARGET_HEADER: &str = "x-failover-target";
/// Response header with the number of the attempt that served the answer
/// (not always the last one made: a hedge may lose to an earlier attempt).
pub(crate) const SERVED_ATTEMPT_HEADER: &str = "x-failover-served-attempt";
/// Response header with the turn's turn id.
pub const TURN_ID_HEADER: &str = "x-failover-run-id";

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
    pub upstream_model: Arc<str>,
    /// The wire dialect the target speaks ([`Dialect::name`](crate::dialect::Dialect::name)):
    /// the client's own, or the one its request was translated into.
    pub dialect: &'static str,
    /// The model the upstream said answered, when it said.
    pub response_model: Option<String>,
    /// The completion id the upstream gave, when it gave one.
    pub response_id: Option<String>,
    /// The finish reason the upstream gave, when it gave one.
    pub finish_reason: Option<String>,
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
    /// For [`Decision::RetrySame`]: the wait taken before the retry.
    pub retry_wait: Option<Duration>,
    /// The attempt was a hedge: started beside a running attempt that
    /// had not committed in time.
    pub hedged: bool,
    /// For an attempt that raced another: the time from its start until
    /// it committed, or until it lost the race (then it would have taken
    /// at least that).
    pub time_to_commit: Option<Duration>,
}

impl AttemptRecord {
    /// `preamble` or `committed`: where the attempt's failure landed (or,
    /// for an attempt that did not fail, whether it committed).
    pub(crate) fn commit_phase(&self) -> &'static str {
        match (self.phase, self.decision) {
            (Some(Phase::Committed), _) | (None, Decision::Committed) => "committed",
            _ => "preamble",
        }
    }
}

/// The span of attempt `number`: the running attempt's, or a racing one's.
fn take_span(
    running: &mut Option<(u32, tracing::Span)>,
    racing: &mut Vec<(u32, tracing::Span)>,
    number: u32,
) -> Option<tracing::Span> {
    if running.as_ref().is_some_and(|(n, _)| *n == number) {
        return running.take().map(|(_, span)| span);
    }
    let at = racing.iter().position(|(n, _)| *n == number)?;
    Some(racing.swap_remove(at).1)
}

impl TurnInner {
    fn take_span(&mut self, number: u32) -> Option<tracing::Span> {
        take_span(&mut self.attempt_span, &mut self.racing_spans, number)
    }

    /// Attempt `number` runs in `span`; one still running races it.
    fn begin_span(&mut self, number: u32, span: tracing::Span) {
        if let Some(running) = self.attempt_span.replace((number, span)) {
            self.racing_spans.push(running);
        }
    }
}

#[derive(Debug, Default)]
struct TurnInner {
    attempts: Vec<AttemptRecord>,
    winner: Option<Arc<str>>,
    /// The winner's name as a header value, when its target made one.
    winner_value: Option<HeaderValue>,
    /// The attempt number of the winner.
    served: Option<u32>,
    done: bool,
    /// A failed attempt whose decision (retry or reroute) is not yet
    /// certain: it becomes `stop` if the turn ends before the next attempt.
    /// Boxed: a committed stream keeps this record for its life, and it is
    /// empty then.
    held: Option<Box<AttemptRecord>>,
    /// The span of the attempt in progress (or held), by attempt number.
    attempt_span: Option<(u32, tracing::Span)>,
    /// The spans of attempts racing it (hedges), by attempt number.
    racing_spans: Vec<(u32, tracing::Span)>,
    /// The turn's span, closed when the turn is concluded.
    turn_span: Option<tracing::Span>,
    stop_reason: Option<StopReason>,
    outcome: Option<TurnOutcome>,
}

/// A turn's record: its turn id and attempts. Cheap to clone; shared with the
/// stream that is still running.
///
/// Each attempt is logged once, when its decision is final (a committed
/// stream's when it ends), as a `tower_llm_failover::attempt` event; the
/// turn once, when it is over, as a `tower_llm_failover::turn` event with
/// its [`TurnOutcome`] and [`StopReason`].
#[derive(Debug, Clone)]
pub struct TurnRecord {
    turn_id: TurnId,
    started: tokio::time::Instant,
    inner: Arc<Mutex<TurnInner>>,
    /// The failover stack's metric handles, reused turn after turn.
    meters: Option<Arc<crate::observe::Meters>>,
}

impl TurnRecord {
    /// An empty record for `turn_id`, started now.
    pub(crate) fn new(turn_id: TurnId) -> Self {
        Self::started_at(turn_id, tokio::time::Instant::now())
    }

    /// An empty record for `turn_id`, of a turn that started at `started`
    /// (its budget's start: the clock is not read again).
    pub(crate) fn started_at(turn_id: TurnId, started: tokio::time::Instant) -> Self {
        Self {
            turn_id,
            started,
            inner: Arc::default(),
            meters: None,
        }
    }

    /// The record of a turn of a failover stack whose metric handles are
    /// `meters`.
    pub(crate) fn with_meters(mut self, meters: Arc<crate::observe::Meters>) -> Self {
        self.meters = Some(meters);
        self
    }

    fn meters(&self) -> Option<&crate::observe::Meters> {
        self.meters.as_deref()
    }

    /// The turn's turn id.
    pub fn turn_id(&self) -> &TurnId {
        &self.turn_id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TurnInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of the attempts so far.
    pub fn attempts(&self) -> Vec<AttemptRecord> {
        self.lock().attempts.clone()
    }

    /// Whether the turn is over (for a stream: the stream has ended).
    pub fn is_done(&self) -> bool {
        self.lock().done
    }

    /// How the turn ended, once it is over.
    pub fn outcome(&self) -> Option<TurnOutcome> {
        self.lock().outcome
    }

    /// Why the turn stopped, once it is over and if it stopped.
    pub fn stop_reason(&self) -> Option<StopReason> {
        let inner = self.lock();
        if inner.done { inner.stop_reason } else { None }
    }

    /// The span the turn's telemetry is recorded on.
    pub(crate) fn set_turn_span(&self, span: tracing::Span) {
        self.lock().turn_span = Some(span);
    }

    /// Attempt `number` begins on `target` with `span`: a held attempt's
    /// decision stands, except that a retry of the same target that went
    /// elsewhere (the target began resting meanwhile) was a reroute. An
    /// attempt still running (a hedge's race) keeps its span.
    pub(crate) fn begin_attempt(&self, number: u32, span: tracing::Span, target: &str) {
        let held = {
            let mut inner = self.lock();
            match inner.held.take() {
                // The first attempt, and a hedge beside a running one
                // (nothing held): one lock, not three.
                None => {
                    inner.begin_span(number, span);
                    return;
                }
                Some(mut held) => {
                    if matches!(held.decision, Decision::RetrySame) && *held.target != *target {
                        held.decision = Decision::Reroute;
                    }
                    held
                }
            }
        };
        self.push(*held);
        self.lock().begin_span(number, span);
    }

    /// Adds a finished attempt's record, logged now.
    pub(crate) fn push(&self, record: AttemptRecord) {
        self.push_answer(record, None);
    }

    /// [`push`](Self::push) for the attempt that answered whole, with its
    /// target's name as a header value, made once by the target (see
    /// [`write_summary_headers`](Self::write_summary_headers)).
    pub(crate) fn push_answer(&self, record: AttemptRecord, name_value: Option<&HeaderValue>) {
        let span = self.lock().take_span(record.attempt);
        emit(&self.turn_id, &record, span.as_ref(), self.meters());
        self.push_quietly(record, name_value);
    }

    /// Keeps a failed attempt's record until its decision is certain: the
    /// next attempt begins ([`begin_attempt`](Self::begin_attempt)), or the
    /// turn ends first and the decision was `stop`.
    pub(crate) fn hold(&self, record: AttemptRecord) {
        let earlier = self.lock().held.replace(Box::new(record));
        if let Some(earlier) = earlier {
            self.push(*earlier);
        }
    }

    /// Adds a committed stream's record, logged once, when the stream ends
    /// ([`finish_last`](Self::finish_last)) with its final figures.
    /// The stream's target's name comes as a header value, as for
    /// [`push_answer`](Self::push_answer).
    pub(crate) fn push_streaming(&self, record: AttemptRecord, name_value: Option<&HeaderValue>) {
        self.push_quietly(record, name_value);
    }

    fn push_quietly(&self, record: AttemptRecord, name_value: Option<&HeaderValue>) {
        let mut inner = self.lock();
        if record.decision == Decision::Committed {
            inner.winner = Some(record.target.clone());
            inner.winner_value = name_value.cloned();
            inner.served = Some(record.attempt);
        }
        // Most turns make one attempt, and a committed stream holds its
        // record for the stream's life: room for one, not the four a
        // first push reserves (about 0.9 KiB per held stream).
        if inner.attempts.capacity() == 0 {
            inner.attempts.reserve_exact(1);
        }
        inner.attempts.push(record);
    }

    /// Updates the committed attempt (a stream's final figures; the
    /// losers of a race are recorded after it), logs it, and concludes
    /// the turn.
    pub(crate) fn finish_committed(&self, update: impl FnOnce(&mut AttemptRecord)) {
        {
            let mut guard = self.lock();
            let inner = &mut *guard;
            let committed = inner
                .attempts
                .iter_mut()
                .rev()
                .find(|a| a.decision == Decision::Committed);
            if let Some(record) = committed {
                let span = take_span(
                    &mut inner.attempt_span,
                    &mut inner.racing_spans,
                    record.attempt,
                );
                update(record);
                emit(&self.turn_id, record, span.as_ref(), self.meters());
            }
        }
        self.conclude();
    }

    /// Notes why the turn is stopping (the first reason given stands).
    pub(crate) fn stop(&self, reason: StopReason) {
        self.lock().stop_reason.get_or_insert(reason);
    }

    /// The turn was dropped before it answered: it stops as cancelled.
    pub(crate) fn cancel(&self) {
        if !self.is_done() {
            self.stop(StopReason::Cancelled);
            self.conclude();
        }
    }

    /// The turn is over: a held attempt is logged with the decision `stop`,
    /// then the turn's line, metrics and span fields. Only the first call
    /// counts.
    pub(crate) fn conclude(&self) {
        let mut inner = self.lock();
        if inner.done {
            return;
        }
        if let Some(mut record) = inner.held.take() {
            // Logged without the lock (the log may read the turn).
            drop(inner);
            record.decision = Decision::Stop;
            self.push(*record);
            inner = self.lock();
        }
        inner.done = true;
        let committed = inner
            .attempts
            .iter()
            .find(|a| a.decision == Decision::Committed);
        let (outcome, reason) = match committed {
            Some(a) if a.class == Some(FailureClass::Cancelled) => {
                (TurnOutcome::EndedAfterCommit, Some(StopReason::Cancelled))
            }
            Some(a) if a.class.is_some() => (
                TurnOutcome::EndedAfterCommit,
                Some(StopReason::StreamFailed),
            ),
            Some(a) if a.attempt <= 1 => (TurnOutcome::FirstTry, None),
            Some(_) => (TurnOutcome::AfterHop, None),
            None => (
                TurnOutcome::StoppedBeforeOutput,
                Some(inner.stop_reason.unwrap_or(StopReason::Exhausted)),
            ),
        };
        let provider = committed.map(|a| Arc::clone(&a.provider));
        let error_type = match committed {
            Some(a) => a.class,
            None => inner.attempts.last().and_then(|a| a.class),
        };
        let attempts = inner.attempts.len();
        inner.outcome = Some(outcome);
        inner.stop_reason = reason;
        let winner = inner.winner.clone();
        let span = inner.turn_span.take();
        let attempt_span = inner.attempt_span.take();
        let racing_spans = std::mem::take(&mut inner.racing_spans);
        drop(inner);
        drop((attempt_span, racing_spans));
        let duration = self.started.elapsed();
        let line = super::TurnLine {
            turn_id: &self.turn_id,
            attempts,
            outcome,
            stop_reason: reason,
            target: winner.as_deref(),
            duration,
        };
        // The process's own writer, if it has one; else the event.
        if !super::line::hand_to_writer(&line) {
            Self::turn_event(&line);
        }
        crate::observe::turn_ended(
            &TurnFacts {
                span: span.as_ref(),
                attempts,
                outcome,
                reason,
                provider: provider.as_deref(),
                error_type,
            },
            self.meters(),
        );
    }

    /// The turn's line as a `tracing` event.
    fn turn_event(line: &super::TurnLine<'_>) {
        let super::TurnLine {
            turn_id,
            attempts,
            outcome,
            stop_reason: reason,
            target: winner,
            duration,
        } = *line;
        tracing::info!(
            target: "tower_llm_failover::turn",
            // A `&str` field, not a format string: a formatter writes it
            // as it is, where `format_args!` goes through `core::fmt`; and
            // first, where a format string's message is.
            message = "turn",
            run_id = %turn_id.logged(),
            attempts,
            outcome = outcome.as_str(),
            stop_reason = reason.map(StopReason::as_str),
            target = winner.map(log_safe).map(tracing::field::display),
            duration_ms = duration.as_millis() as u64,
        );
    }

    /// Writes the summary headers into `headers`: attempt count, winning
    /// target and attempt, turn id. Names are `HeaderName`s made at
    /// compile time and small counts static values (a `&str` name and a
    /// number's value are each copied into a new allocation).
    pub(crate) fn write_summary_headers(&self, headers: &mut http::HeaderMap) {
        use http::HeaderName;
        const ATTEMPTS: HeaderName = HeaderName::from_static(ATTEMPTS_HEADER);
        const TARGET: HeaderName = HeaderName::from_static(TARGET_HEADER);
        const SERVED: HeaderName = HeaderName::from_static(SERVED_ATTEMPT_HEADER);
        const TURN_ID: HeaderName = HeaderName::from_static(TURN_ID_HEADER);
        let inner = self.lock();
        // Room for all four at once: a provider's answer comes with a map
        // sized for its own few headers, which would otherwise grow twice.
        headers.reserve(4);
        let count = inner.attempts.len() + usize::from(inner.held.is_some());
        headers.insert(ATTEMPTS, count_value(count));
        let target = match (&inner.winner_value, &inner.winner) {
            (Some(value), _) => Some(value.clone()),
            (None, Some(winner)) => HeaderValue::from_str(winner).ok(),
            (None, None) => None,
        };
        if let Some(value) = target {
            headers.insert(TARGET, value);
        }
        if let Some(served) = inner.served {
            headers.insert(SERVED, count_value(served as usize));
        }
        if let Ok(value) = HeaderValue::from_bytes(self.turn_id.as_bytes()) {
            headers.insert(TURN_ID, value);
        }
    }
}

/// A count as a header value: static for the counts a turn has.
fn count_value(count: usize) -> HeaderValue {
    const SMALL: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match SMALL.get(count) {
        Some(digits) => HeaderValue::from_static(digits),
        None => HeaderValue::from(count),
    }
}

/// What a concluded turn tells its span and metrics.
pub(crate) struct TurnFacts<'a> {
    pub(crate) span: Option<&'a tracing::Span>,
    pub(crate) attempts: usize,
    pub(crate) outcome: TurnOutcome,
    pub(crate) reason: Option<StopReason>,
    pub(crate) provider: Option<&'a str>,
    pub(crate) error_type: Option<FailureClass>,
}

/// A turn refused before the failover layer ran (by a budget layer, or an
/// admission check such as a tenant ceiling, in front): its one `turn`
/// line and its metrics, with no attempts.
pub(crate) fn refused_turn(turn_id: &TurnId, reason: StopReason) {
    let run = TurnRecord::new(turn_id.clone());
    run.stop(reason);
    run.conclude();
}

/// One tracing event per attempt (a committed stream's when it ends), the
/// same facts on the attempt's span, and the attempt's metrics.
/// The turn id and the model may be the client's, so they are escaped.
///
/// An attempt that went well (committed, no failure after) is logged at
/// DEBUG: the turn's own line says the same at INFO, and a line per
/// request is the largest cost of the default log. Anything that went
/// wrong is an INFO line. `RUST_LOG=tower_llm_failover::attempt=debug`
/// brings back every attempt's line.
fn emit(
    turn_id: &TurnId,
    r: &AttemptRecord,
    span: Option<&tracing::Span>,
    meters: Option<&crate::observe::Meters>,
) {
    macro_rules! attempt_line {
        ($level:expr) => {
            tracing::event!(
                target: "tower_llm_failover::attempt",
                $level,
                run_id = %turn_id.logged(),
                attempt = r.attempt,
                target = %log_safe(&r.target),
                provider = %log_safe(&r.provider),
                upstream_model = %log_safe(&r.upstream_model),
                dialect = r.dialect,
                class = r.class.map(FailureClass::as_str),
                phase = r.phase.map(Phase::as_str),
                status = r.status,
                bytes_flushed = r.bytes_flushed,
                output_events = r.output_events,
                duration_ms = r.duration.as_millis() as u64,
                input_tokens = r.usage.map(|u| u.input_tokens),
                output_tokens = r.usage.map(|u| u.output_tokens),
                cost_usd = r.cost.map(Cost::as_usd),
                estimated = r.estimated,
                decision = r.decision.as_str(),
                "attempt"
            )
        };
    }
    if r.decision == Decision::Committed && r.class.is_none() {
        attempt_line!(tracing::Level::DEBUG);
    } else {
        attempt_line!(tracing::Level::INFO);
    }
    crate::observe::attempt_ended(r, span, meters);
}
