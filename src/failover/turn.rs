//! One turn: read the request once, pick eligible targets, and run attempts
//! until one commits or every option is spent.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HOST, PROXY_AUTHORIZATION, RETRY_AFTER,
};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;
use tower_service::Service;

use super::attempt::{self, AttemptPlan, Outcome};
use super::body::FailoverBody;
use super::health::{Admitted, Availability, Scope};
use super::requirements::{RequestError, Requirements};
use super::select::{Candidate, Selector};
use super::service::Shared;
use crate::BoxError;
use crate::budget::{BudgetExhausted, RetryDelay, TurnBudget};
use crate::classify::{Classification, FailureClass, Phase, Recovery};
use crate::dialect::Usage;
use crate::record::{AttemptRecord, Decision, RunRecord};

/// Request headers that carry the client's credentials: never sent upstream.
const CLIENT_CREDENTIALS: [&str; 3] = ["x-api-key", "api-key", "x-goog-api-key"];

pub(crate) async fn run<S, ReqBody, ResBody>(
    shared: Arc<Shared<S>>,
    request: Request<ReqBody>,
) -> Response<FailoverBody<ResBody>>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let budget =
        TurnBudget::from_extensions(&parts.extensions).unwrap_or_else(|| shared.limits.start());
    let run = RunRecord::new(budget.run_id().clone());
    let finish = |response: Response<FailoverBody<ResBody>>| finish(response, &run, &budget);

    // The request is read once, with a cap, and parsed once.
    let bytes = match Limited::new(body, shared.max_request_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return finish(client_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "the request body exceeds the {}-byte limit",
                    shared.max_request_bytes
                ),
                "request_too_large",
            ));
        }
        Err(error) => {
            return finish(client_error(
                StatusCode::BAD_REQUEST,
                &format!("the request body could not be read: {error}"),
                "invalid_body",
            ));
        }
    };
    let json: Value = match serde_json::from_slice(&bytes) {
        Ok(json) => json,
        Err(error) => {
            let e = RequestError::NotJson(error.to_string());
            return finish(client_error(
                StatusCode::BAD_REQUEST,
                &e.to_string(),
                "invalid_json",
            ));
        }
    };
    let requirements = match Requirements::from_request(&json) {
        Ok(r) => r,
        Err(e) => {
            return finish(client_error(
                StatusCode::BAD_REQUEST,
                &e.to_string(),
                "invalid_request",
            ));
        }
    };

    // Eligible targets, ordered by the strategy.
    let output_tokens = requirements
        .max_output_tokens
        .unwrap_or(shared.default_output_tokens);
    let mut excluded: Vec<String> = Vec::new();
    let mut candidates: Vec<Candidate> = Vec::new();
    for (index, target) in shared.targets.iter().enumerate() {
        let missing = target.capabilities.missing(&requirements);
        if missing.is_empty() {
            candidates.push(Candidate {
                index,
                estimated_cost: target.estimate(requirements.prompt_tokens, output_tokens),
                time_to_first_output: shared
                    .health
                    .time_to_first_output(&target.health_key(&requirements.model)),
            });
        } else {
            excluded.push(format!("{} lacks {}", target.name, missing.join(", ")));
        }
    }
    if candidates.is_empty() {
        return finish(client_error(
            StatusCode::BAD_REQUEST,
            &format!(
                "no compatible target for this request: {}",
                excluded.join("; ")
            ),
            "no_compatible_target",
        ));
    }
    shared.strategy.order(&mut candidates);
    let mut queue: VecDeque<usize> = candidates.iter().map(|c| c.index).collect();

    let mut first_failure: Option<(Arc<str>, Classification)> = None;
    let mut resting = Resting::new(shared.refuse_when_cooling);
    let mut retries_here = 0u32;

    loop {
        // The next admissible target: resting targets are skipped, and
        // probed last when nothing else is left.
        let (index, admitted) = loop {
            let Some(&index) = queue.front() else {
                if let Some(index) = resting.probe_soonest() {
                    queue.push_back(index);
                    continue;
                }
                return finish(exhausted(
                    first_failure.as_ref(),
                    &budget,
                    &resting.note(&shared, &excluded),
                    resting.only_probes_tried(),
                ));
            };
            let key = shared.targets[index].health_key(&requirements.model);
            // Healthy, or admitted as the probe after a cooldown.
            match Admitted::new(&shared.health, key, resting.is_forced(index)) {
                Ok(admitted) => break (index, admitted),
                Err(availability) => {
                    resting.skip(index, availability);
                    queue.pop_front();
                    retries_here = 0;
                }
            }
        };
        let target = &shared.targets[index];
        if let Err(error) = target
            .estimate(requirements.prompt_tokens, output_tokens)
            .map_or(Ok(()), |estimate| budget.check_spend(estimate))
        {
            return finish(budget_stop(&error, first_failure.as_ref(), &budget));
        }
        let number = match budget.try_begin_attempt() {
            Ok(number) => number,
            Err(error) => return finish(budget_stop(&error, first_failure.as_ref(), &budget)),
        };
        resting.attempted(index);

        let upstream_model = target.upstream_model(&requirements.model).to_owned();
        let plan = AttemptPlan {
            index,
            number,
            upstream_model: upstream_model.clone(),
            stream: requirements.stream,
            strip_usage: requirements.stream && !requirements.include_usage,
            prompt_tokens: requirements.prompt_tokens,
        };
        let started = std::time::SystemTime::now();
        let attempt_started = tokio::time::Instant::now();
        let request = upstream_request(&parts, &json, &upstream_model, requirements.stream);
        match attempt::run(&shared, plan, request, &budget, &run).await {
            Outcome::Committed {
                response,
                ttft,
                whole,
            } => {
                if whole {
                    admitted.success(ttft);
                } else {
                    admitted.committed(ttft);
                }
                return finish(*response);
            }
            Outcome::Failed {
                failure,
                output_events,
            } => {
                let scope = shared
                    .scopes
                    .scope(failure.class, target.passes_client_model());
                if failure.class == FailureClass::ModelNotFound && scope != Scope::Request {
                    tracing::error!(
                        target = %target.name,
                        upstream_model = %escape_for_log(&upstream_model),
                        "the provider does not know a model the gateway's configuration names: \
                         fix the configuration"
                    );
                }
                // A model the client named and the provider does not know is
                // the client's error: it goes back as the provider's 404.
                let client_named_unknown_model = failure.class == FailureClass::ModelNotFound
                    && scope == Scope::Request
                    && target.passes_client_model();
                let cooldown = admitted.failure(failure.class, scope, failure.retry.after);
                // An attempt that got as far as a stream was processed by
                // the provider: count its estimated cost.
                let (usage, cost) = if failure.phase == Phase::Preamble {
                    let usage = Usage {
                        prompt_tokens: requirements.prompt_tokens,
                        completion_tokens: output_events,
                    };
                    let cost = target.estimate(usage.prompt_tokens, usage.completion_tokens);
                    if let Some(cost) = cost {
                        budget.record_spend(cost, true);
                    }
                    (Some(usage), cost)
                } else {
                    (None, None)
                };
                let mut decision = if client_named_unknown_model {
                    Decision::Stop
                } else {
                    decide(
                        &failure,
                        retries_here,
                        &shared,
                        &budget,
                        cooldown,
                        queue.len() > 1,
                    )
                };
                if decision == Decision::Reroute {
                    queue.pop_front();
                    retries_here = 0;
                    if failure.class == FailureClass::ContextLengthExceeded {
                        keep_larger_windows(&shared, index, &mut queue);
                        resting.forget_all();
                    }
                    if queue.is_empty() && !resting.can_probe() {
                        decision = Decision::Stop;
                    }
                }
                run.push(AttemptRecord {
                    attempt: number,
                    target: Arc::clone(&target.name),
                    provider: Arc::clone(&target.provider),
                    upstream_model,
                    response_model: None,
                    started,
                    duration: attempt_started.elapsed(),
                    class: Some(failure.class),
                    phase: Some(failure.phase),
                    status: failure.status.map(|s| s.as_u16()),
                    // Every failure here is before commit: nothing reached
                    // the client.
                    bytes_flushed: 0,
                    output_events,
                    time_to_first_output: None,
                    estimated: usage.is_some(),
                    usage,
                    cost,
                    message: Some(failure.message.clone()),
                    decision,
                });
                let request_error =
                    failure.recovery == Recovery::Stop || client_named_unknown_model;
                let first = first_failure
                    .get_or_insert_with(|| (Arc::clone(&target.name), failure.clone()));
                match decision {
                    Decision::Stop if request_error => {
                        // A request error: the provider's own message and
                        // status, never sent elsewhere.
                        return finish(classified_error(&failure));
                    }
                    Decision::Stop => {
                        let note = if failure.class == FailureClass::ContextLengthExceeded {
                            "no target with a larger context window remains".to_owned()
                        } else {
                            resting.note(&shared, &excluded)
                        };
                        let first = first.clone();
                        return finish(exhausted(
                            Some(&first),
                            &budget,
                            &note,
                            resting.only_probes_tried(),
                        ));
                    }
                    Decision::RetrySame { after } => {
                        retries_here += 1;
                        tokio::time::sleep(after).await;
                    }
                    Decision::Reroute | Decision::Committed => {}
                }
            }
        }
    }
}

/// Targets a turn skipped because they rest, and the one probe it may send
/// to them when nothing else is left ("never refuse while the turn can
/// still try", Envoy's panic threshold).
#[derive(Debug)]
struct Resting {
    skipped: Vec<(usize, Option<tokio::time::Instant>)>,
    refuse: bool,
    forced: Option<usize>,
    ordinary_attempts: u32,
}

impl Resting {
    fn new(refuse: bool) -> Self {
        Self {
            skipped: Vec::new(),
            refuse,
            forced: None,
            ordinary_attempts: 0,
        }
    }

    fn skip(&mut self, index: usize, availability: Availability) {
        let until = match availability {
            Availability::Cooling(until) => Some(until),
            // A probe is out: its rest is over already.
            _ => None,
        };
        if !self.skipped.iter().any(|(i, _)| *i == index) {
            self.skipped.push((index, until));
        }
    }

    fn can_probe(&self) -> bool {
        !self.refuse && self.forced.is_none() && !self.skipped.is_empty()
    }

    /// The skipped target whose rest ends first, marked as this turn's
    /// forced probe (once per turn).
    fn probe_soonest(&mut self) -> Option<usize> {
        if !self.can_probe() {
            return None;
        }
        let (index, _) = *self.skipped.iter().min_by_key(|(_, until)| *until)?;
        self.forced = Some(index);
        Some(index)
    }

    fn is_forced(&self, index: usize) -> bool {
        self.forced == Some(index)
    }

    fn attempted(&mut self, index: usize) {
        if !self.is_forced(index) {
            self.ordinary_attempts += 1;
        }
    }

    /// Only forced probes were sent: every target was resting.
    fn only_probes_tried(&self) -> bool {
        self.ordinary_attempts == 0 && !self.skipped.is_empty()
    }

    /// After a context-length failure only larger windows help, and a
    /// resting target was not filtered for that.
    fn forget_all(&mut self) {
        self.skipped.clear();
    }

    fn note<S>(&self, shared: &Shared<S>, excluded: &[String]) -> String {
        let mut notes = Vec::new();
        if !self.skipped.is_empty() {
            let names: Vec<&str> = self
                .skipped
                .iter()
                .map(|(i, _)| &*shared.targets[*i].name)
                .collect();
            notes.push(format!("cooling down: {}", names.join(", ")));
        }
        if !excluded.is_empty() {
            notes.push(format!("no compatible backup: {}", excluded.join("; ")));
        }
        notes.join("; ")
    }
}

/// A client-chosen value made safe for one log line.
fn escape_for_log(value: &str) -> String {
    value.escape_debug().collect()
}

/// What to do after a failed attempt, before looking at other targets.
fn decide<S>(
    failure: &Classification,
    retries_here: u32,
    shared: &Shared<S>,
    budget: &TurnBudget,
    cooldown: Option<Duration>,
    others_left: bool,
) -> Decision {
    match failure.recovery {
        Recovery::Stop => Decision::Stop,
        Recovery::Reroute => Decision::Reroute,
        // An overloaded provider with no hint of when it recovers: another
        // provider answers sooner than a backoff on this one.
        Recovery::RetrySame
            if failure.class == FailureClass::Overloaded
                && failure.retry.after.is_none()
                && others_left =>
        {
            Decision::Reroute
        }
        // Our own head and first-output timeouts: a silent upstream is not
        // waited on twice in one turn.
        Recovery::RetrySame if failure.note == Some("gateway_timeout") => Decision::Reroute,
        Recovery::RetrySame if retries_here >= shared.max_retries_per_target => Decision::Reroute,
        Recovery::RetrySame => match budget.retry_delay(retries_here, failure.retry.after) {
            // The failure just cooled the target down for longer than the
            // wait: retrying it would only find it resting.
            RetryDelay::Wait(after) if cooldown.is_some_and(|c| c > after) => Decision::Reroute,
            RetryDelay::Wait(after) => Decision::RetrySame { after },
            // A wait past the deadline or longer than any we honour is not
            // taken: reroute now (or stop if nothing is left).
            RetryDelay::HintTooLong { .. } | RetryDelay::PastDeadline { .. } => Decision::Reroute,
        },
    }
}

/// After a context-length failure, only targets with a larger declared
/// window can help (any declared window, if the failing target declared
/// none).
fn keep_larger_windows<S>(shared: &Shared<S>, failed: usize, queue: &mut VecDeque<usize>) {
    let failed_window = shared.targets[failed].capabilities.context_window;
    queue.retain(
        |&i| match (shared.targets[i].capabilities.context_window, failed_window) {
            (Some(window), Some(failed)) => window > failed,
            (Some(_), None) => true,
            (None, _) => false,
        },
    );
}

/// The request one target receives: the client's, with the target's model,
/// usage turned on for streams (so spend can be counted), and none of the
/// client's credentials or hop-by-hop headers.
fn upstream_request(
    parts: &http::request::Parts,
    json: &Value,
    model: &str,
    stream: bool,
) -> Request<Full<Bytes>> {
    let mut json = json.clone();
    if let Some(object) = json.as_object_mut() {
        object.insert("model".to_owned(), Value::String(model.to_owned()));
    }
    if stream && let Some(object) = json.as_object_mut() {
        // Whatever the client sent as `stream_options`, usage is on upstream.
        let options = object
            .entry("stream_options")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if !options.is_object() {
            *options = Value::Object(serde_json::Map::new());
        }
        if let Some(options) = options.as_object_mut() {
            options.insert("include_usage".to_owned(), Value::Bool(true));
        }
    }
    // Serializing a Value cannot fail.
    let body = Bytes::from(serde_json::to_vec(&json).unwrap_or_default());
    // Headers the client's `Connection` names are hop-by-hop too.
    let named_by_connection: Vec<String> = parts
        .headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut headers = HeaderMap::with_capacity(parts.headers.len());
    for (name, value) in &parts.headers {
        if !forwardable(name) || named_by_connection.iter().any(|n| n == name.as_str()) {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = parts.method.clone();
    // The path only: a client's query string may carry its own credential
    // (`?key=...`), which never goes upstream.
    *request.uri_mut() = parts
        .uri
        .path()
        .parse()
        .unwrap_or_else(|_| http::Uri::from_static("/v1/chat/completions"));
    *request.headers_mut() = headers;
    request
}

fn forwardable(name: &HeaderName) -> bool {
    !(name == AUTHORIZATION
        || name == PROXY_AUTHORIZATION
        || name == COOKIE
        || name == HOST
        || name == CONTENT_LENGTH
        || name == http::header::CONNECTION
        || name == http::header::TRANSFER_ENCODING
        || name == http::header::TE
        || name == http::header::UPGRADE
        || name == http::header::TRAILER
        || name.as_str() == "keep-alive"
        || name.as_str().starts_with("proxy-")
        || CLIENT_CREDENTIALS.contains(&name.as_str()))
}

fn finish<B>(
    mut response: Response<FailoverBody<B>>,
    run: &RunRecord,
    budget: &TurnBudget,
) -> Response<FailoverBody<B>> {
    for (name, value) in run.summary_headers() {
        response.headers_mut().insert(name, value);
    }
    if !response.body().is_stream() {
        run.mark_done();
    }
    response.extensions_mut().insert(run.clone());
    response.extensions_mut().insert(budget.clone());
    response
}

fn json_error<B>(status: StatusCode, body: Bytes) -> Response<FailoverBody<B>> {
    let mut response = Response::new(FailoverBody::full(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error_body(message: &str, error_type: &str, code: &str) -> Bytes {
    let body = serde_json::json!({
        "error": {"message": message, "type": error_type, "param": null, "code": code}
    });
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

fn client_error<B>(status: StatusCode, message: &str, code: &str) -> Response<FailoverBody<B>> {
    json_error(status, error_body(message, "invalid_request_error", code))
}

fn classified_error<B>(failure: &Classification) -> Response<FailoverBody<B>> {
    let (status, body) = failure.to_openai_error();
    with_retry_after(json_error(status, body), failure.retry.after)
}

fn with_retry_after<B>(
    mut response: Response<FailoverBody<B>>,
    after: Option<Duration>,
) -> Response<FailoverBody<B>> {
    if let Some(after) = after {
        let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    response
}

/// The status a spent turn answers with, from its first failure.
fn exhausted_status(class: FailureClass) -> StatusCode {
    match class {
        FailureClass::RateLimited | FailureClass::QuotaExhausted => StatusCode::TOO_MANY_REQUESTS,
        FailureClass::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
        FailureClass::Timeout => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// Every option is spent: one error naming the first failure's cause and
/// the number of attempts.
fn exhausted<B>(
    first: Option<&(Arc<str>, Classification)>,
    budget: &TurnBudget,
    note: &str,
    only_probes: bool,
) -> Response<FailoverBody<B>> {
    let attempts = budget.attempts_used();
    let suffix = if note.is_empty() {
        String::new()
    } else {
        format!(" ({note})")
    };
    let first = match first {
        // Every eligible target was resting and the probe of the soonest
        // one failed too (or the operator asked to refuse at once).
        Some((target, failure)) if only_probes => {
            let body = error_body(
                &format!(
                    "no target is available right now{suffix}; the probe of {target} failed: {}: {}",
                    failure.class, failure.message
                ),
                "server_error",
                "no_available_target",
            );
            return json_error(StatusCode::SERVICE_UNAVAILABLE, body);
        }
        Some(first) => first,
        None => {
            let body = error_body(
                &format!("no target is available right now{suffix}"),
                "server_error",
                "no_available_target",
            );
            return json_error(StatusCode::SERVICE_UNAVAILABLE, body);
        }
    };
    let (target, failure) = first;
    let message = format!(
        "all options spent after {attempts} attempt{}; first failure: {} from {target}: {}{suffix}",
        if attempts == 1 { "" } else { "s" },
        failure.class,
        failure.message,
    );
    let body = error_body(&message, failure.openai_type(), &failure.openai_code());
    // A request error nobody else could take (a context window too small
    // everywhere) keeps its own status; provider trouble maps by class.
    let status = if failure.class.is_request_error() {
        failure.openai_status()
    } else {
        exhausted_status(failure.class)
    };
    with_retry_after(json_error(status, body), failure.retry.after)
}

/// The turn's budget refused another attempt.
fn budget_stop<B>(
    error: &BudgetExhausted,
    first: Option<&(Arc<str>, Classification)>,
    budget: &TurnBudget,
) -> Response<FailoverBody<B>> {
    match (error, first) {
        (BudgetExhausted::Spend { .. }, _) => json_error(
            StatusCode::PAYMENT_REQUIRED,
            error_body(
                &error.to_string(),
                "insufficient_quota",
                "spend_ceiling_reached",
            ),
        ),
        (_, Some(_)) => exhausted(first, budget, &error.to_string(), false),
        (_, None) => json_error(
            StatusCode::GATEWAY_TIMEOUT,
            error_body(&error.to_string(), "server_error", "turn_budget_exhausted"),
        ),
    }
}
