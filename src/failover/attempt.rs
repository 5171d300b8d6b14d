//! One upstream attempt: send, classify, and hold the answer back until it
//! commits (or fails, which the turn may still reroute invisibly).

use crate::classify::Note;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_service::Service;

use super::body::FailoverBody;
use super::later;
use super::ledger::{AttemptStart, Charge};
use super::shared::Shared;
use crate::BoxError;
use crate::Decision;
use crate::budget::TurnBudget;
use crate::dialect::ErrorSource;
use crate::dialect::foreign::ForeignDialect;
use crate::health::{FailureReport, SuccessReport};
use crate::limit::Gathered;
use crate::observe::TurnRecord;
use crate::{
    FailureClass, Phase, classify::Classification, classify::Classify, classify::RateLimitHeaders,
};
use crate::{Usage, dialect::Dialect};
use crate::{
    stream::StreamSnapshot, stream::StreamState, stream::StreamStateBody, stream::StreamStatus,
    stream::commit::Hold, stream::commit::OnEnd, stream::commit::Release,
};

/// What an attempt came to.
pub(crate) enum Outcome<B, D: Dialect> {
    /// The answer was released to the client.
    Committed {
        // Not boxed: an outcome lives in the attempt's own (boxed) future,
        // and a box here cost an allocation per turn.
        response: Response<FailoverBody<B, D>>,
        /// The whole answer is in hand (not a stream still running).
        whole: bool,
        /// Time from the attempt's start to its first output.
        ttft: Option<Duration>,
    },
    /// The attempt failed before anything reached the client.
    Failed {
        failure: Classification,
        /// Output events seen (and held back) before the failure.
        output_events: u64,
    },
}

/// Everything an attempt needs besides the shared configuration.
pub(crate) struct AttemptPlan {
    pub(crate) index: usize,
    pub(crate) start: AttemptStart,
    pub(crate) stream: bool,
    pub(crate) strip_usage: bool,
    pub(crate) input_tokens: u64,
    /// The first-output timeout of this request on this target.
    pub(crate) first_output: Duration,
    /// The client a failure is counted for ([`FailureReport::witness`]).
    pub(crate) witness: Option<Arc<str>>,
    /// The stream's state, shared with the turn (the output seen if the
    /// turn is dropped mid-attempt); none for a whole answer.
    pub(crate) state: Option<StreamState>,
    /// The target's dialect when it is not the client's.
    pub(crate) foreign: Option<ForeignDialect>,
    /// What a committed answer teaches the state owners, when it may.
    pub(crate) learn: Option<super::owners::Learn>,
    /// The attempt is a hedge.
    pub(crate) hedged: bool,
}

/// When a wait must end, and whether that is the turn's deadline (the
/// turn's remaining time, not a timeout of the provider's, limited it).
#[derive(Debug, Clone, Copy)]
struct Until {
    at: Instant,
    turn_deadline: bool,
}

impl Until {
    /// The wait `limit` from `start`, or the turn's deadline if sooner.
    fn within(start: Instant, limit: Option<Duration>, budget: &TurnBudget) -> Self {
        let deadline = budget.deadline();
        match limit {
            Some(limit) if later(start, limit) < deadline => Self {
                at: later(start, limit),
                turn_deadline: false,
            },
            _ => Self {
                at: deadline,
                turn_deadline: true,
            },
        }
    }

    /// A timeout of this wait: the turn's own when its deadline was the
    /// limit (then it says nothing about the provider).
    fn timed_out(self, timeout: Classification) -> Classification {
        if self.turn_deadline {
            timeout.with_note(crate::classify::Note::TurnDeadline)
        } else {
            timeout
        }
    }
}

#[allow(clippy::manual_async_fn, reason = "arguments used in place")]
pub(crate) fn run<S, D, B>(
    shared: &Shared<S, D>,
    plan: AttemptPlan,
    request: Request<Full<Bytes>>,
    budget: &TurnBudget,
    run: &TurnRecord,
) -> impl Future<Output = Outcome<B, D>>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    D: Dialect,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    // An `async` block, not an `async fn`: an `async fn` copies its
    // arguments into its body's locals at the first poll and keeps both in
    // its state (a plan, a response, a parsed request: hundreds of bytes).
    async move {
        let target = &shared.targets[plan.index];
        let head_deadline = head_deadline(shared, &plan, budget);
        let service: Classify<S> = target.service.clone();
        // Each large future pinned where it is made: `.await` on the future
        // itself would move it into this block's state first.
        let head = std::pin::pin!(tokio::time::timeout_at(
            head_deadline.at,
            service.oneshot(request)
        ))
        .await;
        let response = match head {
            Err(_) => {
                // A silent upstream: never waited on again within this turn.
                return failed(
                    head_deadline.timed_out(
                        Classification::timeout(Phase::Head, "the response head")
                            .with_recovery(crate::Decision::Reroute),
                    ),
                    0,
                );
            }
            Ok(Err(error)) => return failed(error.into_classification(), 0),
            Ok(Ok(response)) => response,
        };
        match (
            plan.stream,
            crate::stream::commit::is_event_stream(&response),
        ) {
            (true, true) => {
                std::pin::pin!(hold_until_commit(shared, plan, budget, run, response)).await
            }
            (false, _) => std::pin::pin!(receive_whole(shared, plan, budget, run, response)).await,
            // A client reading a stream cannot read a whole JSON body: the
            // provider broke the contract, another may keep it.
            (true, false) => failed(
                Classification::new(FailureClass::InvalidResponse, Phase::Head)
                    .with_status(response.status())
                    .with_message("a streaming request was answered without an event stream"),
                0,
            ),
        }
    }
}

/// When the response head must have come: within the turn's deadline and,
/// for a stream, the head timeout and the first-output timeout (no output
/// can come before the head); for a whole answer, its head timeout and the
/// response timeout.
fn head_deadline<S, D>(shared: &Shared<S, D>, plan: &AttemptPlan, budget: &TurnBudget) -> Until {
    let timeouts = &shared.timeouts;
    let limit = if plan.stream {
        Some(
            timeouts
                .head
                .map_or(plan.first_output, |h| h.min(plan.first_output)),
        )
    } else {
        shortest(timeouts.non_streaming_head, timeouts.response)
    };
    Until::within(plan.start.clock, limit, budget)
}

fn shortest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// When a whole answer must be in hand: the response timeout from the
/// attempt's start, within the turn's deadline.
fn whole_deadline<S, D>(shared: &Shared<S, D>, plan: &AttemptPlan, budget: &TurnBudget) -> Until {
    Until::within(plan.start.clock, shared.timeouts.response, budget)
}

/// Why a whole body was not received.
enum NotReceived {
    /// The response timeout (or the turn's deadline) passed.
    TimedOut,
    /// No frame came within the idle timeout.
    Stalled,
    /// The body failed or passed its cap.
    Failed(BoxError),
}

/// Receives a whole body under a size cap, a deadline, and an idle limit
/// between frames.
async fn collect_whole<B>(
    body: B,
    limit: usize,
    deadline: Instant,
    idle: Duration,
) -> Result<Bytes, NotReceived>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(Limited::new(body, limit));
    let mut gathered = Gathered::default();
    loop {
        // A frame in hand already (a small answer's, read with its head,
        // and its end) is taken without a timer: a timer is a clock read,
        // and a wheel entry made and cleared. A frame in hand is taken
        // before the timer is looked at either way (`timeout_at` polls
        // its future first).
        let ready = std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await;
        let frame = match ready {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                let gap_ends = later(Instant::now(), idle);
                match tokio::time::timeout_at(gap_ends.min(deadline), body.frame()).await {
                    Ok(frame) => frame,
                    Err(_) if deadline <= gap_ends => return Err(NotReceived::TimedOut),
                    Err(_) => return Err(NotReceived::Stalled),
                }
            }
        };
        match frame {
            None => break,
            Some(Err(error)) => return Err(NotReceived::Failed(error)),
            Some(Ok(frame)) => {
                // Trailers carry nothing a whole answer needs.
                if let Ok(data) = frame.into_data() {
                    gathered.push(data);
                }
            }
        }
    }
    Ok(gathered.into_bytes())
}

/// A whole body: received with a cap, a deadline and an idle limit,
/// checked by the dialect, then released.
#[allow(clippy::manual_async_fn, reason = "arguments used in place")]
fn receive_whole<S, D, B>(
    shared: &Shared<S, D>,
    plan: AttemptPlan,
    budget: &TurnBudget,
    run: &TurnRecord,
    response: Response<B>,
) -> impl Future<Output = Outcome<B, D>>
where
    D: Dialect,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    // An `async` block: arguments used in place (see `run`).
    async move {
        let target = &shared.targets[plan.index];
        let provider = Some(&*target.provider);
        let status = response.status();
        let (mut parts, body) = response.into_parts();
        let until = whole_deadline(shared, &plan, budget);
        let collected = collect_whole(body, shared.max_response_bytes, until.at, shared.idle).await;
        let bytes = match collected {
            Err(NotReceived::TimedOut) => {
                return failed(
                    until.timed_out(Classification::timeout(
                        Phase::Preamble,
                        "the response body",
                    )),
                    0,
                );
            }
            Err(NotReceived::Stalled) => {
                // A body gone silent: never waited on again within this turn.
                return failed(
                    Classification::timeout(Phase::Preamble, "the next frame of the response body")
                        .with_recovery(crate::Decision::Reroute),
                    0,
                );
            }
            Err(NotReceived::Failed(error)) => {
                let failure = if error.is::<http_body_util::LengthLimitError>() {
                    Classification::oversize(Phase::Preamble, "response body")
                } else {
                    shared
                        .classifier
                        .classify_transport(provider, error.as_ref(), true)
                };
                return failed(failure, 0);
            }
            Ok(bytes) => bytes,
        };
        let validated = match &plan.foreign {
            None => shared
                .classifier
                .validate_answer(&shared.dialect, provider, &bytes),
            Some(foreign) => shared.classifier.validate_checked(
                foreign.0.check_answer(&bytes),
                || foreign.0.error_facts(ErrorSource::Body(&bytes)),
                provider,
                &bytes,
            ),
        };
        let (usage, response_model, facts) = match validated {
            Ok(read) => read,
            Err(failure) => return failed(failure.with_status(status), 0),
        };
        // From a target of another dialect: the answer in the client's.
        let bytes = match &plan.foreign {
            None => bytes,
            Some(foreign) => match foreign
                .0
                .decode_answer(&bytes)
                .and_then(|events| shared.dialect.encode_answer(&events))
            {
                Some(translated) => translated,
                None => {
                    return failed(
                        Classification::new(FailureClass::InvalidResponse, Phase::Preamble)
                            .with_status(status)
                            .with_message(format!(
                                "the {} answer could not be translated for this client",
                                foreign.0.name()
                            )),
                        0,
                    );
                }
            },
        };
        // No usage reported: about four bytes of answer per token.
        let estimate = Usage::new(plan.input_tokens, (bytes.len() as u64).div_ceil(4));
        let charge = Charge::to_turn(budget, target.pricing, usage, estimate);
        let mut record = plan.start.record(Decision::Committed);
        record.hedged = plan.hedged;
        record.time_to_commit = Some(record.duration);
        // The answer is whole as the record is made: its duration is the time
        // to it (no second clock read).
        let ttft = record.duration;
        record.response_model = response_model;
        if let Some(learn) = &plan.learn {
            learn.answer(facts.id.as_deref());
        }
        record.response_id = facts.id;
        record.finish_reason = facts.finish_reason;
        record.status = Some(status.as_u16());
        record.bytes_flushed = bytes.len() as u64;
        record.rate_limits = RateLimitHeaders::from_headers(&parts.headers);
        charge.fill(&mut record);
        run.push_answer(record, target.name_value.as_ref());
        shared
            .headers
            .filter_response(&mut parts.headers, Some(bytes.len()));
        Outcome::Committed {
            response: Response::from_parts(parts, FailoverBody::full(bytes)),
            whole: true,
            ttft: Some(ttft),
        }
    }
}

fn failed<B, D: Dialect>(failure: Classification, output_events: u64) -> Outcome<B, D> {
    Outcome::Failed {
        failure,
        output_events,
    }
}

/// Holds a streamed answer back in the commit machine until the commit
/// window is reached (release the response) or the attempt fails.
#[allow(clippy::manual_async_fn, reason = "arguments used in place")]
fn hold_until_commit<S, D, B>(
    shared: &Shared<S, D>,
    plan: AttemptPlan,
    budget: &TurnBudget,
    run: &TurnRecord,
    response: Response<B>,
) -> impl Future<Output = Outcome<B, D>>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    D: Dialect,
{
    // An `async` block: arguments used in place (see `run`).
    async move {
        let target = &shared.targets[plan.index];
        let (mut parts, body) = response.into_parts();
        // Always given for a stream; a fresh one would only go unread.
        let state = plan.state.clone().unwrap_or_else(StreamState::new);
        let hold = Hold {
            window: shared.commit,
            first_output_by: later(plan.start.clock, plan.first_output).min(budget.deadline()),
            max_held_bytes: shared.max_held_bytes,
        };
        let mut body = Box::pin(StreamStateBody::inspect(
            body,
            &shared.stream,
            state.clone(),
            Some(Arc::clone(&target.provider)),
            plan.strip_usage,
            Some(budget.deadline()),
            Some(hold),
            plan.foreign.as_ref().map(|f| f.0.reader()),
        ));
        match std::future::poll_fn(|cx| body.as_mut().poll_release(cx)).await {
            Release::Released => {}
            Release::Failed {
                failure,
                output_events,
            } => return failed(failure, output_events),
        }
        // Commit: the held frames and the rest of the upstream go to the
        // client through the same body, which ends a later failure cleanly.
        let ttft = body
            .first_output_at()
            .map(|f| f.saturating_duration_since(plan.start.clock));
        let mut record = plan.start.record(Decision::Committed);
        record.hedged = plan.hedged;
        record.time_to_commit = Some(record.duration);
        record.status = Some(StatusCode::OK.as_u16());
        record.output_events = state.output_events();
        record.time_to_first_output = ttft;
        record.rate_limits = RateLimitHeaders::from_headers(&parts.headers);
        run.push_streaming(record, shared.targets[plan.index].name_value.as_ref());
        body.as_mut()
            .on_end(on_stream_end(shared, &plan, budget, run));
        shared.headers.filter_response(&mut parts.headers, None);
        parts.extensions.insert(state);
        // The commit machine ends the stream at the turn's deadline with a
        // terminal event; a budget layer outside leaves the cut to it.
        parts
            .extensions
            .insert(crate::time::EndsItselfAt(budget.deadline()));
        Outcome::Committed {
            response: Response::from_parts(parts, FailoverBody::stream(body)),
            whole: false,
            ttft,
        }
    }
}

/// What happens when a committed stream ends: its spend is charged, its
/// target's health learns the outcome, and its record is completed.
fn on_stream_end<S, D>(
    shared: &Shared<S, D>,
    plan: &AttemptPlan,
    budget: &TurnBudget,
    run: &TurnRecord,
) -> OnEnd {
    let target = &shared.targets[plan.index];
    let run = run.clone();
    let health = Arc::clone(&shared.health);
    let key = target.health_key(&plan.start.upstream_model);
    let scopes = shared.scopes.clone();
    let client_named = target.passes_client_model();
    let budget = budget.clone();
    let pricing = target.pricing;
    let input_tokens = plan.input_tokens;
    let witness = plan.witness.clone();
    let started = plan.start.clock;
    let target_name = Arc::clone(&target.name);
    let learn = plan.learn.clone();
    Box::new(move |snapshot: &StreamSnapshot| {
        if let Some(learn) = &learn
            && snapshot.failure.is_none()
        {
            learn.answer(snapshot.identity.id.as_deref());
        }
        // No usage reported: one output event is about one token.
        let estimate = Usage::new(input_tokens, snapshot.output_events);
        let charge = Charge::to_turn(&budget, pricing, snapshot.usage, estimate);
        // A provider that fails after commit is unwell all the same (not
        // when the client left or the turn's deadline passed).
        match &snapshot.failure {
            None => health.success(&key, SuccessReport::Whole { ttft: None }),
            Some(failure)
                if failure.class != FailureClass::Cancelled
                    && failure.note != Some(Note::TurnDeadline) =>
            {
                let scope = scopes.scope(failure.class, failure.note, client_named);
                let report = FailureReport {
                    witness: witness.clone(),
                    ..FailureReport::new(failure.class, scope)
                };
                if health.failure(&key, report).is_some() {
                    crate::observe::cooldown_started(key.provider(), scope.as_str());
                }
            }
            Some(_) => {}
        }
        if snapshot.status == StreamStatus::Failed
            && let Some(failure) = &snapshot.failure
        {
            crate::observe::terminal_chunk_sent(&target_name, failure.class.as_str());
        }
        run.finish_committed(|record| {
            record.duration = started.elapsed();
            // Bytes of the provider's answer the client got: without the
            // terminal event the commit machine added after a failure.
            record.bytes_flushed = snapshot
                .failure
                .as_ref()
                .map_or(snapshot.bytes_flushed, |f| f.bytes_sent);
            record.output_events = snapshot.output_events;
            charge.fill(record);
            record.response_model.clone_from(&snapshot.identity.model);
            record.response_id.clone_from(&snapshot.identity.id);
            record.finish_reason.clone_from(&snapshot.finish_reason);
            if let Some(failure) = &snapshot.failure {
                record.class = Some(failure.class);
                record.phase = Some(failure.phase);
                record.message = Some(failure.message.clone());
            }
        });
    })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body::Frame;
    use http_body_util::{Empty, StreamBody};

    use super::*;

    fn frames(
        parts: &[&'static str],
    ) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
        let frames: Vec<_> = parts
            .iter()
            .map(|part| Ok(Frame::data(Bytes::from_static(part.as_bytes()))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    async fn collect<B>(body: B) -> Bytes
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let deadline = Instant::now() + Duration::from_secs(60);
        match collect_whole(body, 1 << 20, deadline, Duration::from_secs(30)).await {
            Ok(whole) => whole,
            Err(_) => panic!("the whole body was not received"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_whole_answer_in_several_frames_is_joined_in_order() {
        let answer = collect(frames(&[
            r#"{"object":"#,
            r#""chat.completion","#,
            r#""choices":[]}"#,
        ]))
        .await;
        assert_eq!(&answer[..], br#"{"object":"chat.completion","choices":[]}"#);
        // One frame is handed on as it came.
        assert_eq!(&collect(frames(&["{}"])).await[..], b"{}");
    }

    /// One frame, then nothing: the body neither ends nor fails.
    fn one_frame_then_silence() -> impl Body<Data = Bytes, Error = Infallible> {
        let first = futures_util::stream::iter([Ok(Frame::data(Bytes::from_static(b"{")))]);
        StreamBody::new(futures_util::StreamExt::chain(
            first,
            futures_util::stream::pending(),
        ))
    }

    /// A frame in hand is taken at once; a silent body is still timed:
    /// stalled at the idle limit, timed out at the deadline when that comes
    /// first.
    #[tokio::test(start_paused = true)]
    async fn a_silent_whole_body_stalls_at_the_idle_limit_or_times_out_at_the_deadline() {
        let start = Instant::now();
        let far = start + Duration::from_secs(60);
        let idle = Duration::from_secs(5);
        let outcome = collect_whole(one_frame_then_silence(), 1 << 20, far, idle).await;
        assert!(matches!(outcome, Err(NotReceived::Stalled)));
        assert_eq!(start.elapsed(), idle);

        let start = Instant::now();
        let near = start + Duration::from_secs(2);
        let outcome = collect_whole(one_frame_then_silence(), 1 << 20, near, idle).await;
        assert!(matches!(outcome, Err(NotReceived::TimedOut)));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_whole_answer_is_empty_bytes() {
        // The dialect's check then refuses it; receiving it must not fail.
        assert!(collect(Empty::<Bytes>::new()).await.is_empty());
    }
}
