//! Spans and metrics (see the module docs of `observe`).

use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

/// Span names (the `tracing` span name; `otel.name` carries the
/// conventions' `chat {model}`).
pub(crate) mod span {
    /// One client turn: every attempt is its child.
    pub(crate) const TURN: &str = "failover.turn";
    /// One upstream attempt of a turn.
    pub(crate) const ATTEMPT: &str = "failover.attempt";
    /// The conventions' operation name for chat completions.
    pub(crate) const OPERATION_CHAT: &str = "chat";
}

/// Attribute (span field and metric label) names.
pub(crate) mod attr {
    /// `gen_ai.operation.name`.
    pub(crate) const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
    /// `gen_ai.provider.name`.
    pub(crate) const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
    /// `gen_ai.request.model`.
    pub(crate) const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
    /// `gen_ai.response.model`.
    pub(crate) const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
    /// `gen_ai.response.id`.
    pub(crate) const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
    /// `gen_ai.response.finish_reasons`.
    pub(crate) const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    /// `gen_ai.usage.input_tokens`.
    pub(crate) const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    /// `gen_ai.usage.output_tokens`.
    pub(crate) const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// `gen_ai.token.type` (`input` or `output`).
    pub(crate) const GEN_AI_TOKEN_TYPE: &str = "gen_ai.token.type";
    /// `error.type`: the failure class.
    pub(crate) const ERROR_TYPE: &str = "error.type";
    /// `http.response.status_code` of the upstream.
    pub(crate) const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
    /// The span name an OpenTelemetry bridge exports.
    pub(crate) const OTEL_NAME: &str = "otel.name";
    /// The span kind an OpenTelemetry bridge exports.
    pub(crate) const OTEL_KIND: &str = "otel.kind";
    /// The turn's turn id.
    pub(crate) const FAILOVER_RUN_ID: &str = "failover.run_id";
    /// The attempt's 1-based number.
    pub(crate) const FAILOVER_ATTEMPT: &str = "failover.attempt";
    /// Attempts a turn made.
    pub(crate) const FAILOVER_ATTEMPTS: &str = "failover.attempts";
    /// The target's name.
    pub(crate) const FAILOVER_TARGET: &str = "failover.target";
    /// The failure class (`none` in labels for a success).
    pub(crate) const FAILOVER_CLASS: &str = "failover.class";
    /// Where a failure landed: `preamble` (nothing reached the client) or
    /// `committed`.
    pub(crate) const FAILOVER_PHASE: &str = "failover.phase";
    /// Bytes of the attempt's answer flushed to the client.
    pub(crate) const FAILOVER_BYTES_FLUSHED: &str = "failover.bytes_flushed";
    /// Model output events seen.
    pub(crate) const FAILOVER_OUTPUT_EVENTS: &str = "failover.output_events";
    /// The decision taken after the attempt.
    pub(crate) const FAILOVER_DECISION: &str = "failover.decision";
    /// The attempt's cost in US dollars.
    pub(crate) const FAILOVER_COST_USD: &str = "failover.cost_usd";
    /// Whether the attempt's cost is an estimate (no usage reported: an
    /// attempt cut short, a head timeout, a cancelled turn).
    pub(crate) const FAILOVER_COST_ESTIMATED: &str = "failover.cost_estimated";
    /// How a turn ended.
    pub(crate) const FAILOVER_OUTCOME: &str = "failover.outcome";
    /// Why a turn stopped (`none` in labels when it did not).
    pub(crate) const FAILOVER_STOP_REASON: &str = "failover.stop_reason";
    /// A health scope (`account`, `model`).
    pub(crate) const FAILOVER_SCOPE: &str = "failover.scope";
    /// A health key's state.
    pub(crate) const FAILOVER_STATE: &str = "failover.state";
    /// A retry-budget withdrawal's result.
    pub(crate) const FAILOVER_RESULT: &str = "failover.result";
}

/// Metric names.
pub(crate) mod metric {
    /// Convention histogram: an attempt's duration, in seconds.
    pub(crate) const OPERATION_DURATION: &str = "gen_ai.client.operation.duration";
    /// Convention histogram: tokens used, by `gen_ai.token.type`.
    pub(crate) const TOKEN_USAGE: &str = "gen_ai.client.token.usage";
    /// Convention histogram: time to the first output, in seconds.
    pub(crate) const TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
    /// Counter: attempts by target, class, phase and decision.
    pub(crate) const ATTEMPTS: &str = "failover.attempts";
    /// Counter: turns by outcome and stop reason.
    pub(crate) const TURNS: &str = "failover.turns";
    /// Counter: committed streams ended with a terminal chunk.
    pub(crate) const TERMINAL_CHUNKS: &str = "failover.terminal_chunks";
    /// Counter: reroutes away from a target.
    pub(crate) const REROUTES: &str = "failover.reroutes";
    /// Counter: cooldowns started, by scope.
    pub(crate) const COOLDOWNS: &str = "failover.cooldowns";
    /// Counter: hedged attempts, by target and result.
    pub(crate) const HEDGES: &str = "failover.hedges";
    /// Gauge: each health key's state (1 for its state, 0 for the others).
    pub(crate) const HEALTH_STATE: &str = "failover.health.state";
    /// Counter: first attempts deposited in the retry budget.
    pub(crate) const RETRY_BUDGET_DEPOSITS: &str = "failover.retry_budget.deposits";
    /// Counter: extra attempts asked of the retry budget, by result.
    pub(crate) const RETRY_BUDGET_WITHDRAWALS: &str = "failover.retry_budget.withdrawals";
    /// Gauge: extra attempts the retry budget would grant now.
    pub(crate) const RETRY_BUDGET_LEVEL: &str = "failover.retry_budget.level";
    /// Histogram: bytes of an attempt flushed to the client before it
    /// failed (0 before commit).
    pub(crate) const BYTES_FLUSHED_BEFORE_FAILURE: &str = "failover.bytes_flushed_before_failure";
    /// Histogram: attempts a turn made.
    pub(crate) const ATTEMPTS_PER_TURN: &str = "failover.attempts_per_turn";
}

/// Bucket boundaries for every histogram this crate records, by metric
/// name: the OpenTelemetry GenAI conventions' advisory boundaries for
/// theirs, and ours sized for what they count. Give them to the exporter
/// (`PrometheusBuilder::set_buckets_for_metric`, an OpenTelemetry
/// histogram's `with_boundaries`): the exporters' defaults are summaries
/// (quantiles that cannot be summed over gateway instances, and a sketch
/// update per sample) or boundaries made for milliseconds.
pub const HISTOGRAM_BOUNDARIES: &[(&str, &[f64])] = &[
    (
        metric::OPERATION_DURATION,
        &[
            0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
        ],
    ),
    (
        metric::TOKEN_USAGE,
        &[
            1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
            4194304.0, 16777216.0, 67108864.0,
        ],
    ),
    (
        metric::TIME_TO_FIRST_TOKEN,
        &[
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0,
        ],
    ),
    // 0 is its own bucket: a failure before commit flushed nothing.
    (
        metric::BYTES_FLUSHED_BEFORE_FAILURE,
        &[
            0.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
        ],
    ),
    (
        metric::ATTEMPTS_PER_TURN,
        &[1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 16.0],
    ),
];

/// Describes every metric (units and help text) to the installed
/// recorder; call once after installing it.
pub fn describe_metrics() {
    use metrics::Unit;
    metrics::describe_histogram!(
        metric::OPERATION_DURATION,
        Unit::Seconds,
        "Duration of upstream attempts."
    );
    metrics::describe_histogram!(
        metric::TOKEN_USAGE,
        Unit::Count,
        "Tokens used by upstream attempts, as reported."
    );
    metrics::describe_histogram!(
        metric::TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Time from an attempt's start to its first output."
    );
    metrics::describe_counter!(
        metric::ATTEMPTS,
        "Upstream attempts by target, class, phase and decision."
    );
    metrics::describe_counter!(metric::TURNS, "Turns by outcome and stop reason.");
    metrics::describe_counter!(
        metric::TERMINAL_CHUNKS,
        "Committed streams ended with a terminal chunk."
    );
    metrics::describe_counter!(metric::REROUTES, "Reroutes away from a target.");
    metrics::describe_counter!(metric::COOLDOWNS, "Cooldowns started, by scope.");
    metrics::describe_counter!(
        metric::HEDGES,
        "Hedged attempts, by target and result (started, won, lost)."
    );
    metrics::describe_gauge!(
        metric::HEALTH_STATE,
        "Health key state: 1 for the current state, 0 for the others."
    );
    metrics::describe_counter!(
        metric::RETRY_BUDGET_DEPOSITS,
        "First attempts deposited in the retry budget."
    );
    metrics::describe_counter!(
        metric::RETRY_BUDGET_WITHDRAWALS,
        "Extra attempts asked of the retry budget, by result."
    );
    metrics::describe_gauge!(
        metric::RETRY_BUDGET_LEVEL,
        "Extra attempts the retry budget would grant now."
    );
    metrics::describe_histogram!(
        metric::BYTES_FLUSHED_BEFORE_FAILURE,
        Unit::Bytes,
        "Bytes of an attempt flushed to the client before it failed."
    );
    metrics::describe_histogram!(
        metric::ATTEMPTS_PER_TURN,
        Unit::Count,
        "Upstream attempts per turn."
    );
}

/// A cooldown started on a key of `provider`, charged to `scope`.
pub(crate) fn cooldown_started(provider: &str, scope: &'static str) {
    metrics::counter!(
        metric::COOLDOWNS,
        attr::FAILOVER_SCOPE => scope,
        attr::GEN_AI_PROVIDER_NAME => provider.to_owned(),
    )
    .increment(1);
}

/// A committed stream was ended with a terminal chunk.
/// A hedge `result`: `started`, `won` (it committed) or `lost` (another
/// attempt committed first).
pub(crate) fn hedge(target: &str, result: &'static str) {
    metrics::counter!(
        metric::HEDGES,
        attr::FAILOVER_TARGET => target.to_owned(),
        attr::FAILOVER_RESULT => result,
    )
    .increment(1);
}

pub(crate) fn terminal_chunk_sent(target: &str, class: &'static str) {
    metrics::counter!(
        metric::TERMINAL_CHUNKS,
        attr::FAILOVER_TARGET => target.to_owned(),
        attr::FAILOVER_CLASS => class,
    )
    .increment(1);
}

/// The span of a turn, started once the request is read: `model` is the
/// client's (`None` when the request could not be read; the span is then
/// named `chat`). Fields known later are recorded by [`turn_ended`].
pub(crate) fn turn_span(turn_id: &str, model: Option<&str>) -> tracing::Span {
    // The name and fields are built (escaped, allocated) only when a
    // subscriber takes the span (not, say, a log that keeps no span
    // context): nothing per request otherwise.
    if !tracing::span_enabled!(target: "tower_llm_failover::turn", tracing::Level::INFO) {
        return tracing::Span::none();
    }
    let model = model.map(|m| crate::util::log_safe(m).to_string());
    // Named at creation: an OpenTelemetry bridge fixes a span's name when
    // it starts it, on first entry.
    let name = match &model {
        Some(model) => format!("{} {model}", span::OPERATION_CHAT),
        None => span::OPERATION_CHAT.to_owned(),
    };
    tracing::info_span!(
        target: "tower_llm_failover::turn",
        span::TURN,
        { attr::OTEL_NAME } = %name,
        { attr::GEN_AI_OPERATION_NAME } = span::OPERATION_CHAT,
        { attr::GEN_AI_REQUEST_MODEL } = model.as_deref(),
        { attr::GEN_AI_PROVIDER_NAME } = tracing::field::Empty,
        { attr::FAILOVER_RUN_ID } = %crate::util::log_safe(turn_id),
        { attr::FAILOVER_ATTEMPTS } = tracing::field::Empty,
        { attr::FAILOVER_OUTCOME } = tracing::field::Empty,
        { attr::FAILOVER_STOP_REASON } = tracing::field::Empty,
        { attr::ERROR_TYPE } = tracing::field::Empty,
    )
}

/// The span of one attempt, a child of the current (turn) span. Fields
/// known later are recorded by [`attempt_ended`].
pub(crate) fn attempt_span(
    attempt: u32,
    target: &str,
    provider: &str,
    upstream_model: &str,
) -> tracing::Span {
    if !tracing::span_enabled!(target: "tower_llm_failover::attempt", tracing::Level::INFO) {
        return tracing::Span::none();
    }
    let model = crate::util::log_safe(upstream_model).to_string();
    tracing::info_span!(
        target: "tower_llm_failover::attempt",
        span::ATTEMPT,
        { attr::OTEL_NAME } = %format_args!("{} {model}", span::OPERATION_CHAT),
        { attr::OTEL_KIND } = "client",
        { attr::GEN_AI_OPERATION_NAME } = span::OPERATION_CHAT,
        { attr::GEN_AI_PROVIDER_NAME } = %crate::util::log_safe(provider),
        { attr::GEN_AI_REQUEST_MODEL } = %model,
        { attr::FAILOVER_TARGET } = %crate::util::log_safe(target),
        { attr::FAILOVER_ATTEMPT } = i64::from(attempt),
        { attr::GEN_AI_RESPONSE_MODEL } = tracing::field::Empty,
        { attr::GEN_AI_RESPONSE_ID } = tracing::field::Empty,
        { attr::GEN_AI_RESPONSE_FINISH_REASONS } = tracing::field::Empty,
        { attr::GEN_AI_USAGE_INPUT_TOKENS } = tracing::field::Empty,
        { attr::GEN_AI_USAGE_OUTPUT_TOKENS } = tracing::field::Empty,
        { attr::ERROR_TYPE } = tracing::field::Empty,
        { attr::HTTP_RESPONSE_STATUS_CODE } = tracing::field::Empty,
        { attr::FAILOVER_CLASS } = tracing::field::Empty,
        { attr::FAILOVER_PHASE } = tracing::field::Empty,
        { attr::FAILOVER_BYTES_FLUSHED } = tracing::field::Empty,
        { attr::FAILOVER_OUTPUT_EVENTS } = tracing::field::Empty,
        { attr::FAILOVER_DECISION } = tracing::field::Empty,
        { attr::FAILOVER_COST_USD } = tracing::field::Empty,
        { attr::FAILOVER_COST_ESTIMATED } = tracing::field::Empty,
    )
}

/// The metric handles one failover stack keeps for what nearly every
/// request ends with: an attempt that committed without a failure, and a
/// turn answered at its first try. Building and looking up the same keys
/// on every request cost about a sixth of the gateway's instructions per
/// small completion; these are registered once, on first use, with the
/// recorder installed then (so a stack keeps reporting to the recorder it
/// first reported to: install the recorder before serving). Other outcomes
/// register their keys as they occur, with the same labels.
///
/// With a batch above one ([`FailoverBuilder::batch_metrics`]), those
/// figures are held here and handed to the recorder `batch` at a time:
/// every handle is shared by every thread that reports, and on two cores
/// each of a small completion's seven updates took its cache lines from
/// the other core (batched, about 0.3 µs of CPU less per small completion
/// in the gateway on two cores; see `docs/performance.md`).
///
/// [`FailoverBuilder::batch_metrics`]: crate::failover::FailoverBuilder::batch_metrics
pub(crate) struct Meters {
    targets: Vec<TargetMeters>,
    first_try: OnceLock<TurnHandles>,
    batch: usize,
}

struct TargetMeters {
    target: Arc<str>,
    provider: Arc<str>,
    committed: OnceLock<CommittedHandles>,
}

/// An attempt that committed with no failure.
struct CommittedHandles {
    attempts: metrics::Counter,
    /// Duration, time to first output, input and output tokens: the
    /// order of [`samples_of`].
    histograms: [metrics::Histogram; 4],
    /// What is held for the recorder (batched stacks only).
    held: Option<Mutex<HeldAttempts>>,
}

/// Clean attempts' figures not yet handed to the recorder.
struct HeldAttempts {
    count: u64,
    /// One list per histogram, in the same order.
    samples: [Vec<f64>; 4],
}

/// A clean attempt's samples, one per histogram of [`CommittedHandles`]
/// (`None`: that histogram takes none from it).
fn samples_of(r: &crate::observe::AttemptRecord) -> [Option<f64>; 4] {
    let usage = r.usage.filter(|_| !r.estimated);
    [
        Some(r.duration.as_secs_f64()),
        r.time_to_first_output.map(|t| t.as_secs_f64()),
        usage.map(|u| u.input_tokens as f64),
        usage.map(|u| u.output_tokens as f64),
    ]
}

/// A turn answered at its first try.
struct TurnHandles {
    turns: metrics::Counter,
    attempts: metrics::Histogram,
    /// Each held turn's attempt count (batched stacks only).
    held: Option<Mutex<Vec<f64>>>,
}

/// Samples a batch holds, made once with room for the whole batch.
fn held_samples(batch: usize) -> Vec<f64> {
    Vec::with_capacity(batch)
}

fn lock<T>(held: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding figures leaves them usable.
    held.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Meters {
    /// Handles for the targets named by these (name, provider) pairs; an
    /// attempt record finds its target's by the very same name `Arc`.
    /// `batch` figures are held before they reach the recorder (one or
    /// zero: none held). A batched stack is listed for
    /// [`flush_metrics`].
    pub(crate) fn new<'a>(
        targets: impl IntoIterator<Item = (&'a Arc<str>, &'a Arc<str>)>,
        batch: usize,
    ) -> Arc<Self> {
        let meters = Arc::new(Self {
            targets: targets
                .into_iter()
                .map(|(target, provider)| TargetMeters {
                    target: Arc::clone(target),
                    provider: Arc::clone(provider),
                    committed: OnceLock::new(),
                })
                .collect(),
            first_try: OnceLock::new(),
            batch: batch.max(1),
        });
        if meters.batch > 1 {
            BatchedStacks::list(&meters);
        }
        meters
    }

    /// The handles of the target a record names (its very name and
    /// provider `Arc`s: two targets sharing a name `Arc` still differ).
    fn target(&self, name: &Arc<str>, provider: &Arc<str>) -> Option<&TargetMeters> {
        self.targets
            .iter()
            .find(|t| Arc::ptr_eq(&t.target, name) && Arc::ptr_eq(&t.provider, provider))
    }

    /// Hands every held figure to the recorder.
    fn flush(&self) {
        for target in &self.targets {
            if let Some(handles) = target.committed.get()
                && let Some(held) = &handles.held
            {
                handles.hand_over(&mut lock(held));
            }
        }
        if let Some(handles) = self.first_try.get()
            && let Some(held) = &handles.held
        {
            handles.hand_over(&mut lock(held));
        }
    }
}

impl Drop for Meters {
    fn drop(&mut self) {
        // A stack dropped between batches still reports what it served.
        self.flush();
    }
}

impl std::fmt::Debug for Meters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meters")
            .field("targets", &self.targets.len())
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl TargetMeters {
    fn committed(&self, batch: usize) -> &CommittedHandles {
        self.committed.get_or_init(|| {
            let labels = operation_labels(&self.provider, &self.target);
            CommittedHandles {
                attempts: attempt_counter(&self.target, "none", "committed", "committed"),
                histograms: [
                    duration_histogram(labels.clone()),
                    metrics::histogram!(metric::TIME_TO_FIRST_TOKEN, labels.clone()),
                    token_histogram(labels.clone(), "input"),
                    token_histogram(labels, "output"),
                ],
                held: (batch > 1).then(|| {
                    Mutex::new(HeldAttempts {
                        count: 0,
                        samples: std::array::from_fn(|_| held_samples(batch)),
                    })
                }),
            }
        })
    }
}

impl CommittedHandles {
    /// Records one clean attempt, or holds it when the stack batches.
    fn record(&self, r: &crate::observe::AttemptRecord, batch: usize) {
        let samples = samples_of(r);
        let Some(held) = &self.held else {
            self.attempts.increment(1);
            for (histogram, sample) in self.histograms.iter().zip(samples) {
                if let Some(sample) = sample {
                    histogram.record(sample);
                }
            }
            return;
        };
        let mut held = lock(held);
        held.count += 1;
        for (kept, sample) in held.samples.iter_mut().zip(samples) {
            kept.extend(sample);
        }
        if held.count >= batch as u64 {
            self.hand_over(&mut held);
        }
    }

    fn hand_over(&self, held: &mut HeldAttempts) {
        if held.count > 0 {
            self.attempts.increment(held.count);
            held.count = 0;
        }
        for (histogram, kept) in self.histograms.iter().zip(&mut held.samples) {
            for sample in kept.drain(..) {
                histogram.record(sample);
            }
        }
    }
}

impl TurnHandles {
    /// Records one first-try turn, or holds it when the stack batches.
    fn record(&self, attempts: usize, batch: usize) {
        let Some(held) = &self.held else {
            self.turns.increment(1);
            self.attempts.record(attempts as f64);
            return;
        };
        let mut held = lock(held);
        held.push(attempts as f64);
        if held.len() >= batch {
            self.hand_over(&mut held);
        }
    }

    fn hand_over(&self, held: &mut Vec<f64>) {
        if held.is_empty() {
            return;
        }
        self.turns.increment(held.len() as u64);
        for sample in held.drain(..) {
            self.attempts.record(sample);
        }
    }
}

/// Every failover stack that holds figures, for [`flush_metrics`].
struct BatchedStacks;

static BATCHED: Mutex<Vec<Weak<Meters>>> = Mutex::new(Vec::new());

impl BatchedStacks {
    fn list(meters: &Arc<Meters>) {
        let mut stacks = lock(&BATCHED);
        // Stacks come and go (tests build thousands): the dropped ones
        // are cleared before the list grows.
        if stacks.len() == stacks.capacity() {
            stacks.retain(|stack| stack.strong_count() > 0);
        }
        stacks.push(Arc::downgrade(meters));
    }
}

/// Hands every figure a failover stack holds to the metrics recorder.
///
/// A stack built with [`FailoverBuilder::batch_metrics`] above one holds
/// up to that many clean attempts and first-try turns per target before it
/// reports them; call this before a scrape and on a timer (the gateway
/// does both, every second), so that what a recorder shows is at most that
/// old. A stack that is dropped reports what it held. Stacks that do not
/// batch hold nothing.
///
/// [`FailoverBuilder::batch_metrics`]: crate::failover::FailoverBuilder::batch_metrics
pub fn flush_metrics() {
    // Taken out of the list first: a stack's last reference may go here,
    // and its drop reports too.
    let stacks: Vec<Arc<Meters>> = lock(&BATCHED).iter().filter_map(Weak::upgrade).collect();
    for stack in stacks {
        stack.flush();
    }
}

fn attempt_counter(
    target: &Arc<str>,
    class: &'static str,
    phase: &'static str,
    decision: &'static str,
) -> metrics::Counter {
    metrics::counter!(
        metric::ATTEMPTS,
        attr::FAILOVER_TARGET => metrics::SharedString::from(Arc::clone(target)),
        attr::FAILOVER_CLASS => class,
        attr::FAILOVER_PHASE => phase,
        attr::FAILOVER_DECISION => decision,
    )
}

/// The labels of the operation's duration, tokens and first output.
fn operation_labels(provider: &Arc<str>, target: &Arc<str>) -> Vec<metrics::Label> {
    vec![
        metrics::Label::new(attr::GEN_AI_OPERATION_NAME, span::OPERATION_CHAT),
        metrics::Label::new(attr::GEN_AI_PROVIDER_NAME, Arc::clone(provider)),
        metrics::Label::new(attr::FAILOVER_TARGET, Arc::clone(target)),
    ]
}

fn duration_histogram(labels: Vec<metrics::Label>) -> metrics::Histogram {
    metrics::histogram!(metric::OPERATION_DURATION, labels)
}

fn token_histogram(mut labels: Vec<metrics::Label>, kind: &'static str) -> metrics::Histogram {
    labels.push(metrics::Label::new(attr::GEN_AI_TOKEN_TYPE, kind));
    metrics::histogram!(metric::TOKEN_USAGE, labels)
}

fn turn_counter(outcome: &'static str, reason: &'static str) -> metrics::Counter {
    metrics::counter!(
        metric::TURNS,
        attr::FAILOVER_OUTCOME => outcome,
        attr::FAILOVER_STOP_REASON => reason,
    )
}

fn turn_attempts_histogram(outcome: &'static str) -> metrics::Histogram {
    metrics::histogram!(metric::ATTEMPTS_PER_TURN, attr::FAILOVER_OUTCOME => outcome)
}

/// An attempt's decision is final: its span's fields and its metrics
/// (through `meters`' handles when it committed cleanly).
pub(crate) fn attempt_ended(
    r: &crate::observe::AttemptRecord,
    span: Option<&tracing::Span>,
    meters: Option<&Meters>,
) {
    use crate::util::log_safe;
    let phase = r.commit_phase();
    // A disabled span (its level filtered out) records nothing: the
    // escaped copies would be made for nobody.
    if let Some(span) = span.filter(|span| !span.is_disabled()) {
        if let Some(model) = &r.response_model {
            span.record(attr::GEN_AI_RESPONSE_MODEL, log_safe(model).to_string());
        }
        if let Some(id) = &r.response_id {
            span.record(attr::GEN_AI_RESPONSE_ID, log_safe(id).to_string());
        }
        if let Some(reason) = &r.finish_reason {
            span.record(
                attr::GEN_AI_RESPONSE_FINISH_REASONS,
                log_safe(reason).to_string(),
            );
        }
        if let Some(usage) = r.usage.filter(|_| !r.estimated) {
            span.record(attr::GEN_AI_USAGE_INPUT_TOKENS, int(usage.input_tokens));
            span.record(attr::GEN_AI_USAGE_OUTPUT_TOKENS, int(usage.output_tokens));
        }
        if let Some(status) = r.status {
            span.record(attr::HTTP_RESPONSE_STATUS_CODE, i64::from(status));
        }
        if let Some(class) = r.class {
            span.record(attr::ERROR_TYPE, class.as_str());
            span.record(attr::FAILOVER_CLASS, class.as_str());
        }
        span.record(attr::FAILOVER_PHASE, phase);
        span.record(attr::FAILOVER_BYTES_FLUSHED, int(r.bytes_flushed));
        span.record(attr::FAILOVER_OUTPUT_EVENTS, int(r.output_events));
        span.record(attr::FAILOVER_DECISION, r.decision.as_str());
        if let Some(cost) = r.cost {
            span.record(attr::FAILOVER_COST_USD, cost.as_usd());
            span.record(attr::FAILOVER_COST_ESTIMATED, r.estimated);
        }
    }

    let usage = r.usage.filter(|_| !r.estimated);
    let clean = r.class.is_none() && r.decision == crate::Decision::Committed;
    if let Some(meters) = meters.filter(|_| clean)
        && let Some(target) = meters.target(&r.target, &r.provider)
    {
        target.committed(meters.batch).record(r, meters.batch);
        return;
    }

    let class = r.class.map_or("none", |c| c.as_str());
    attempt_counter(&r.target, class, phase, r.decision.as_str()).increment(1);
    if r.decision == crate::Decision::Reroute {
        metrics::counter!(
            metric::REROUTES,
            attr::FAILOVER_TARGET => metrics::SharedString::from(Arc::clone(&r.target)),
        )
        .increment(1);
    }
    let mut labels = operation_labels(&r.provider, &r.target);
    if let Some(ttft) = r.time_to_first_output {
        metrics::histogram!(metric::TIME_TO_FIRST_TOKEN, labels.clone()).record(ttft.as_secs_f64());
    }
    if let Some(usage) = usage {
        token_histogram(labels.clone(), "input").record(usage.input_tokens as f64);
        token_histogram(labels.clone(), "output").record(usage.output_tokens as f64);
    }
    if let Some(class) = r.class {
        labels.push(metrics::Label::new(attr::ERROR_TYPE, class.as_str()));
        metrics::histogram!(
            metric::BYTES_FLUSHED_BEFORE_FAILURE,
            attr::FAILOVER_PHASE => phase,
            attr::FAILOVER_TARGET => metrics::SharedString::from(Arc::clone(&r.target)),
        )
        .record(r.bytes_flushed as f64);
    }
    duration_histogram(labels).record(r.duration.as_secs_f64());
}

/// A turn is over: its span's fields and its metrics (through `meters`'
/// handles when it answered at its first try).
pub(crate) fn turn_ended(facts: &crate::observe::TurnFacts<'_>, meters: Option<&Meters>) {
    if let Some(span) = facts.span.filter(|span| !span.is_disabled()) {
        span.record(attr::FAILOVER_ATTEMPTS, int(facts.attempts as u64));
        span.record(attr::FAILOVER_OUTCOME, facts.outcome.as_str());
        if let Some(reason) = facts.reason {
            span.record(attr::FAILOVER_STOP_REASON, reason.as_str());
        }
        if let Some(provider) = facts.provider {
            span.record(
                attr::GEN_AI_PROVIDER_NAME,
                crate::util::log_safe(provider).to_string(),
            );
        }
        if let Some(class) = facts.error_type {
            span.record(attr::ERROR_TYPE, class.as_str());
        }
    }
    let outcome = facts.outcome.as_str();
    let reason = facts.reason.map_or("none", |r| r.as_str());
    let first_try = facts.outcome == crate::TurnOutcome::FirstTry && facts.reason.is_none();
    if let Some(meters) = meters.filter(|_| first_try) {
        let handles = meters.first_try.get_or_init(|| TurnHandles {
            turns: turn_counter(outcome, reason),
            attempts: turn_attempts_histogram(outcome),
            held: (meters.batch > 1).then(|| Mutex::new(held_samples(meters.batch))),
        });
        handles.record(facts.attempts, meters.batch);
        return;
    }
    turn_counter(outcome, reason).increment(1);
    turn_attempts_histogram(outcome).record(facts.attempts as f64);
}

/// A count as a span field: `i64`, which OpenTelemetry exports as an
/// integer (`u64` goes out as text).
fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
