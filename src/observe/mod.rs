//! Observability: one record per turn and per attempt, and the spans and
//! metrics made from them.
//!
//! # Records
//!
//! Every hop of a turn stays visible.
//!
//! A turn has one turn id and one [`AttemptRecord`] per upstream attempt:
//! target, upstream model, start and duration, the class and phase of the
//! failure, the bytes flushed to the client before it (always 0 before
//! commit), output events, usage and cost, and the [`Decision`](crate::Decision) taken.
//! "429 after 0 bytes" and "429 after 40 bytes" are different facts and the
//! records keep them apart.
//!
//! The failover layer puts a [`TurnRecord`] handle in the response
//! extensions. For a stream it is completed when the stream ends, so read it
//! after the body is done (or watch it live).
//!
//! Each turn leaves one line, the `tower_llm_failover::turn` event (INFO),
//! and each attempt one (`tower_llm_failover::attempt`: INFO when
//! something went wrong, else DEBUG). A process that writes its log in a
//! format of its own can take the turn's line as facts instead of the
//! event ([`set_turn_line_writer`]): a line per request is the largest
//! cost of a default log, and most of it is the event's dispatch and field
//! visits.
//!
//! # Telemetry
//!
//! OpenTelemetry GenAI spans through `tracing`, and metrics
//! through the [`metrics`] facade. The library ties in no exporter: the
//! application installs a `tracing` subscriber (with
//! `tracing-opentelemetry` for OTLP) and a `metrics` recorder (Prometheus,
//! OTLP, or both).
//!
//! The names below are the contract: a dashboard can rely on them.
//!
//! ## Spans
//!
//! | span | fields |
//! |---|---|
//! | `failover.turn` (one per turn) | `gen_ai.operation.name` = `chat`, `gen_ai.request.model` (the client's, escaped), `gen_ai.provider.name` (of the target that answered, once one did), `failover.turn_id`, and when the turn ends `failover.attempts`, `failover.outcome`, `failover.stop_reason`, `error.type` |
//! | `failover.attempt` (a child per upstream attempt) | at the start `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model` (the model sent upstream), `failover.target`, `failover.attempt`; when the attempt's decision is final `gen_ai.response.model`, `gen_ai.response.id`, `gen_ai.response.finish_reasons`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `error.type`, `failover.class`, `failover.phase` (`preamble` or `committed`), `failover.bytes_flushed`, `failover.output_events`, `failover.decision`, `failover.cost_usd`, `failover.cost_estimated`, `http.response.status_code` |
//!
//! Both carry `otel.name` = `chat {model}` (the conventions' span name) and
//! the attempt `otel.kind` = `client`, which `tracing-opentelemetry` reads.
//! The turn span starts once the request is read (reading it is not an
//! operation on a model), so its name carries the client's model from the
//! start; a request that cannot be read leaves a turn span named `chat`.
//! A committed stream's attempt span (and its turn's) stays open until the
//! stream ends, so its figures are the final ones; an attempt that is
//! retried or rerouted ends when the next attempt begins, the moment its
//! decision is certain.
//!
//! ## Metrics
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `gen_ai.client.operation.duration` (s) | histogram | `gen_ai.operation.name`, `gen_ai.provider.name`, `failover.target`, `error.type` (failed attempts) |
//! | `gen_ai.client.token.usage` (`{token}`) | histogram | the above and `gen_ai.token.type` (`input`, `output`); reported usage only |
//! | `gen_ai.server.time_to_first_token` (s) | histogram | `gen_ai.operation.name`, `gen_ai.provider.name`, `failover.target` |
//! | `failover.attempts` | counter | `failover.target`, `failover.class` (`none` on success), `failover.phase` (`preamble`, `committed`), `failover.decision` |
//! | `failover.turns` | counter | `failover.outcome` (`first_try`, `after_hop`, `ended_after_commit`, `stopped_before_output`), `failover.stop_reason` |
//! | `failover.terminal_chunks` | counter | `failover.target`, `failover.class` |
//! | `failover.reroutes` | counter | `failover.target` (the one left) |
//! | `failover.cooldowns` | counter | `failover.scope` (`account`, `model`), `gen_ai.provider.name` |
//! | `failover.health.state` | gauge, 1 for the key's state, 0 for the others | `gen_ai.provider.name`, `gen_ai.request.model` (`*` for an account key), `failover.scope`, `failover.state` |
//! | `failover.retry_budget.deposits`, `failover.retry_budget.withdrawals` | counter | `failover.result` (`granted`, `refused`) on withdrawals |
//! | `failover.retry_budget.level` | gauge: extra attempts the budget would grant now (a budget from [`RetryBudget::from_budget`](crate::budget::RetryBudget::from_budget), e.g. the Redis one, cannot say: no gauge) | none |
//! | `failover.bytes_flushed_before_failure` (By) | histogram | `failover.phase`, `failover.target` |
//! | `failover.attempts_per_turn` | histogram | `failover.outcome` |
//!
//! Histograms have bucket boundaries in their own unit,
//! [`HISTOGRAM_BOUNDARIES`]: give them to your exporter.
//!
//! The model is left out of attempt metrics' labels (target and provider
//! names are the operator's, a model may be the client's); health gauges
//! name it, bounded by the health store's key cap. Health and retry-budget
//! figures are read, not pushed: call
//! [`record_health`](crate::health::record_health) and
//! [`RetryBudget::record_metrics`](crate::budget::RetryBudget::record_metrics) before each scrape (or on a timer).
//!
//! A failover stack registers the handles of what nearly every request
//! reports (a clean attempt per target, a first-try turn) once, with the
//! recorder installed when it first reports, and reuses them: install the
//! recorder before the stack serves. A stack built with
//! [`FailoverBuilder::batch_metrics`](crate::failover::FailoverBuilder::batch_metrics)
//! holds those figures and reports them a batch at a time (one cache-line
//! hand-over between cores per batch, not per request); call
//! [`flush_metrics`] before each scrape and on a timer.
//!
//! ## What never appears
//!
//! No credential, header or body: spans, logs, records and labels carry
//! names, classes, counts and the classifier's sanitized messages only.
//! Client-chosen values (model, turn id) are escaped in log lines.

mod line;
mod record;
mod telemetry;

pub use line::{TurnLine, TurnLineWriter, push_log_safe, set_turn_line_writer};

pub(crate) use record::*;
pub use record::{AttemptRecord, TURN_ID_HEADER, TurnRecord};
pub(crate) use telemetry::*;
pub use telemetry::{HISTOGRAM_BOUNDARIES, describe_metrics, flush_metrics};
