//! One upstream attempt: send, classify, and hold the answer back until it
//! commits (or fails, which the turn may still reroute invisibly).

use crate::classify::Note;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_service::Service;

use super::body::FailoverBody;
use super::decision::Decision;
use super::health::{FailureReport, SuccessReport};
use super::later;
use super::shared::Shared;
use crate::BoxError;
use crate::budget::{Cost, TurnBudget};
use crate::classify::{Classification, Classify, Phase};
use crate::commit::{CommitBody, Hold, OnEnd, Release, StreamState};
use crate::dialect::{Dialect, Usage};
use crate::record::{AttemptRecord, RunRecord};

/// What an attempt came to.
pub(crate) enum Outcome<B, D> {
    /// The answer was released to the client.
    Committed {
        // Boxed: a response is far larger than a failure.
        response: Box<Response<FailoverBody<B, D>>>,
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
    pub(crate) number: u32,
    pub(crate) upstream_model: String,
    pub(crate) stream: bool,
    pub(crate) strip_usage: bool,
    pub(crate) prompt_tokens: u64,
}

pub(crate) async fn run<S, D, B>(
    shared: &Shared<S, D>,
    plan: AttemptPlan,
    request: Request<Full<Bytes>>,
    budget: &TurnBudget,
    run: &RunRecord,
) -> Outcome<B, D>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    D: Dialect,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let target = &shared.targets[plan.index];
    let started = Instant::now();
    let started_wall = SystemTime::now();
    let provider = Some(&*target.provider);

    // The response head, within the turn's deadline and: for a stream, the
    // head timeout and the first output timeout (no output can come before
    // the head); for a whole answer, the response timeout.
    let limit = if plan.stream {
        Some(
            shared
                .timeouts
                .head
                .map_or(shared.timeouts.first_output, |h| {
                    h.min(shared.timeouts.first_output)
                }),
        )
    } else {
        shared.timeouts.response
    };
    let head_deadline = limit.map_or(budget.deadline(), |limit| {
        later(started, limit).min(budget.deadline())
    });
    let service: Classify<S> = target.service.clone();
    let head = tokio::time::timeout_at(head_deadline, service.oneshot(request)).await;
    let response = match head {
        Err(_) => {
            // A silent upstream: never waited on again within this turn.
            return failed(
                Classification::timeout(Phase::Head, "the response head")
                    .with_recovery(crate::classify::Recovery::Reroute),
                0,
            );
        }
        Ok(Err(error)) => return failed(error.into_classification(), 0),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    if plan.stream && crate::commit::is_event_stream(&response) {
        return hold_until_commit(shared, plan, budget, run, response, started, started_wall).await;
    }

    // A whole body: received with a cap, validated, then released.
    let (mut parts, body) = response.into_parts();
    let collected = tokio::time::timeout_at(
        head_deadline,
        Limited::new(body, shared.max_response_bytes).collect(),
    )
    .await;
    let bytes = match collected {
        Err(_) => {
            return failed(
                Classification::timeout(Phase::Preamble, "the response body"),
                0,
            );
        }
        Ok(Err(error)) => {
            let failure = if error.is::<http_body_util::LengthLimitError>() {
                Classification::oversize(Phase::Preamble, "response body")
            } else {
                shared
                    .classifier
                    .classify_transport(provider, error.as_ref(), true)
            };
            return failed(failure, 0);
        }
        Ok(Ok(collected)) => collected.to_bytes(),
    };
    let (usage, response_model) =
        match shared
            .classifier
            .validate_body(&shared.dialect, provider, &bytes)
        {
            Ok(read) => read,
            Err(failure) => return failed(failure.with_status(status), 0),
        };
    let (usage, estimated) = match usage {
        Some(usage) => (usage, false),
        None => (
            Usage {
                prompt_tokens: plan.prompt_tokens,
                completion_tokens: (bytes.len() as u64).div_ceil(4),
            },
            true,
        ),
    };
    let cost = target
        .pricing
        .map(|p| p.cost(usage.prompt_tokens, usage.completion_tokens));
    if let Some(cost) = cost {
        budget.record_spend(cost, estimated);
    }
    run.push(AttemptRecord {
        attempt: plan.number,
        target: Arc::clone(&target.name),
        provider: Arc::clone(&target.provider),
        upstream_model: plan.upstream_model,
        response_model,
        started: started_wall,
        duration: started.elapsed(),
        class: None,
        phase: None,
        status: Some(status.as_u16()),
        bytes_flushed: bytes.len() as u64,
        output_events: 0,
        time_to_first_output: None,
        usage: Some(usage),
        cost,
        estimated,
        message: None,
        decision: Decision::Committed,
    });
    parts.headers.remove(TRANSFER_ENCODING);
    parts
        .headers
        .insert(CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    Outcome::Committed {
        response: Box::new(Response::from_parts(parts, FailoverBody::full(bytes))),
        whole: true,
        ttft: Some(started.elapsed()),
    }
}

fn failed<B, D>(failure: Classification, output_events: u64) -> Outcome<B, D> {
    Outcome::Failed {
        failure,
        output_events,
    }
}

/// Holds a streamed answer back in the commit machine until the commit
/// window is reached (release the response) or the attempt fails.
async fn hold_until_commit<S, D, B>(
    shared: &Shared<S, D>,
    plan: AttemptPlan,
    budget: &TurnBudget,
    run: &RunRecord,
    response: Response<B>,
    started: Instant,
    started_wall: SystemTime,
) -> Outcome<B, D>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    D: Dialect,
{
    let target = &shared.targets[plan.index];
    let (mut parts, body) = response.into_parts();
    let state = StreamState::new();
    let hold = Hold {
        window: shared.commit,
        first_output_by: later(started, shared.timeouts.first_output).min(budget.deadline()),
        max_held_bytes: shared.max_held_bytes,
    };
    let mut body = Box::pin(CommitBody::inspect(
        body,
        &shared.stream,
        state.clone(),
        Some(Arc::clone(&target.provider)),
        plan.strip_usage,
        Some(budget.deadline()),
        Some(hold),
    ));
    match std::future::poll_fn(|cx| body.as_mut().poll_release(cx)).await {
        Release::Released => {}
        Release::Failed {
            failure,
            output_events,
        } => return failed(failure, output_events),
    }
    let first_output = body.first_output_at();
    let output_events = state.output_events();

    // Commit: the held bytes and the rest of the upstream go to the client,
    // through the stream inspector that ends a later failure cleanly.
    let ttft = first_output.map(|f| f.saturating_duration_since(started));
    run.push(AttemptRecord {
        attempt: plan.number,
        target: Arc::clone(&target.name),
        provider: Arc::clone(&target.provider),
        upstream_model: plan.upstream_model.clone(),
        response_model: None,
        started: started_wall,
        duration: started.elapsed(),
        class: None,
        phase: None,
        status: Some(StatusCode::OK.as_u16()),
        bytes_flushed: 0,
        output_events,
        time_to_first_output: ttft,
        usage: None,
        cost: None,
        estimated: false,
        message: None,
        decision: Decision::Committed,
    });
    let on_end = {
        let run = run.clone();
        let health = Arc::clone(&shared.health);
        let key = target.health_key(&plan.upstream_model);
        let scopes = shared.scopes.clone();
        let client_named = target.passes_client_model();
        let budget = budget.clone();
        let pricing = target.pricing;
        let prompt_tokens = plan.prompt_tokens;
        Box::new(move |snapshot: &crate::commit::StreamSnapshot| {
            let (usage, estimated) = match snapshot.usage {
                Some(usage) => (usage, false),
                // No usage reported: one output event is about one token.
                None => (
                    Usage {
                        prompt_tokens,
                        completion_tokens: snapshot.output_events,
                    },
                    true,
                ),
            };
            let cost: Option<Cost> =
                pricing.map(|p| p.cost(usage.prompt_tokens, usage.completion_tokens));
            if let Some(cost) = cost {
                budget.record_spend(cost, estimated);
            }
            // A provider that fails after commit is unwell all the same
            // (not when the client left or the turn's deadline passed).
            match &snapshot.failure {
                None => health.success(&key, SuccessReport::Whole { ttft: None }),
                Some(failure)
                    if failure.class != crate::classify::FailureClass::Cancelled
                        && failure.note != Some(Note::TurnDeadline) =>
                {
                    let scope = scopes.scope(failure.class, client_named);
                    health.failure(&key, FailureReport::new(failure.class, scope));
                }
                Some(_) => {}
            }
            run.finish_last(|record| {
                record.duration = started.elapsed();
                // Bytes of the provider's answer the client got: without the
                // terminal chunk the stream inspector added after a failure.
                record.bytes_flushed = snapshot
                    .failure
                    .as_ref()
                    .map_or(snapshot.bytes_flushed, |f| f.bytes_sent);
                record.output_events = snapshot.output_events;
                record.usage = Some(usage);
                record.cost = cost;
                record.estimated = estimated;
                record.response_model.clone_from(&snapshot.identity.model);
                if let Some(failure) = &snapshot.failure {
                    record.class = Some(failure.class);
                    record.phase = Some(failure.phase);
                    record.message = Some(failure.message.clone());
                }
            });
        }) as OnEnd
    };
    parts.headers.remove(CONTENT_LENGTH);
    parts.extensions.insert(state);
    body.as_mut().on_end(on_end);
    Outcome::Committed {
        response: Box::new(Response::from_parts(parts, FailoverBody::stream(body))),
        whole: false,
        ttft,
    }
}
