//! One turn: read the request once, pick eligible targets, and run attempts
//! until one commits or every option is spent.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::Full;
use tokio::time::Instant;
use tower_service::Service;

use super::attempt::{self, AttemptPlan, Outcome};
use super::body::FailoverBody;
use super::decision::{Step, decide};
use super::later;
use super::ledger::{AttemptStart, Charge, InFlight, Unfinished};
use super::owners::Learn;
use super::race::{self, InSpan, Raced, Running};
use super::reply;
use super::resting::Resting;
use super::select::{Candidate, Selector};
use super::shared::Shared;
use super::target::Target;
use super::translate::{self, Translations};
use super::upstream;
use crate::BoxError;
use crate::classify::Classify;
use crate::health::{Admitted, FailureReport, Scope};
use crate::identity::ClientId;
use crate::observe;
use crate::stream::StreamState;
use crate::{Cost, budget::BudgetExhausted, budget::TurnBudget};
use crate::{Decision, FailureClass, classify::Classification};
use crate::{StopReason, observe::TurnRecord, util::log_safe};
use crate::{
    Usage, dialect::Dialect, dialect::ErrorReply, dialect::ParsedRequest, dialect::Requirements,
};
use smallvec::SmallVec;

pub(crate) async fn run<S, D, ReqBody, ResBody>(
    shared: Arc<Shared<S, D>>,
    request: Request<ReqBody>,
) -> Response<FailoverBody<ResBody, D>>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    D: Dialect,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let budget = TurnBudget::from_extensions(&parts.extensions).unwrap_or_else(|| {
        shared
            .limits
            .start_for(crate::identity::ClientId::of(&parts.extensions))
    });
    let run = TurnRecord::started_at(budget.turn_id().clone(), budget.started())
        .with_meters(Arc::clone(&shared.meters));
    // Dropped before it answers (the client left): the turn still leaves
    // its line, as cancelled.
    let unanswered = Unanswered(&run);
    // Read by a gateway in front already: not parsed again.
    let parsed = match parts.extensions.remove::<ParsedRequest<D::Request>>() {
        Some(parsed) => Ok((parsed.requirements, parsed.request)),
        None => read(&shared, body).await,
    };
    // Read: from here every wait of the turn is bounded by its deadline,
    // but a reservation with a spend store. A budget layer outside need
    // not arm a timer of its own.
    if !budget.reserves_with_ledgers() {
        budget.watch_inside();
    }
    // The span starts once the model is known, so its name is the
    // conventions' `chat {model}` (an OpenTelemetry bridge ignores a name
    // recorded after the span started).
    let model = parsed.as_ref().ok().map(|(r, _)| r.model.as_str());
    let span = observe::turn_span(budget.turn_id().as_str(), model);
    run.set_turn_span(span.clone());
    // Written into its box, not wrapped and moved (see `InSpan`).
    let answering = Box::write(
        Box::new_uninit(),
        answer(&shared, &parts, parsed, &budget, &run),
    );
    let response = InSpan::new(span, Box::into_pin(answering)).await;
    let response = reply::finish(response, &run, &budget);
    std::mem::forget(unanswered);
    response
}

/// A request as read: what it requires and the dialect's parse, or the
/// answer refusing it.
type Read<D, B> = Result<(Requirements, <D as Dialect>::Request), Response<FailoverBody<B, D>>>;

/// Concludes a turn dropped before it answered.
struct Unanswered<'a>(&'a TurnRecord);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The turn's answer to the request as read: attempts, or the refusal of
/// a request that could not be read.
#[allow(clippy::manual_async_fn, reason = "arguments used in place")]
fn answer<S, D, ResBody>(
    shared: &Arc<Shared<S, D>>,
    parts: &http::request::Parts,
    parsed: Read<D, ResBody>,
    budget: &TurnBudget,
    run: &TurnRecord,
) -> impl Future<Output = Response<FailoverBody<ResBody, D>>>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    D: Dialect,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    // An `async` block, not an `async fn`: an `async fn` copies its
    // arguments into its body's locals at the first poll and keeps both in
    // its state (a plan, a response, a parsed request: hundreds of bytes).
    async move {
        match parsed {
            Err(response) => {
                run.stop(StopReason::InvalidRequest);
                response
            }
            Ok((requirements, request)) => {
                // The turn stays here and its run borrows it: an `async fn`
                // taking it by value would hold it twice (its argument, then
                // the body's own), copied at the first poll.
                let mut turn = Turn {
                    shared,
                    parts,
                    budget,
                    run,
                    output_tokens: requirements
                        .max_output_tokens
                        .unwrap_or(shared.default_output_tokens),
                    client_model: Arc::from(requirements.model.as_str()),
                    requirements,
                    request,
                    queue: Queue::default(),
                    excluded: Vec::new(),
                    first_failure: None,
                    resting: Resting::new(shared.refuse_when_cooling),
                    translations: Translations::default(),
                    retries_here: 0,
                    witness: ClientId::of(&parts.extensions).witness(),
                    hedges_left: 0,
                    no_hedge_for: None,
                };
                // Pinned where it is made: `.await` on the future itself
                // would move it (about 1.2 KB) into this block's state.
                let running = std::pin::pin!(turn.run());
                let Some(signal) = shared.shutdown.as_ref() else {
                    return running.await;
                };
                // A turn that has not answered when the gateway stops answers
                // at once, cleanly, rather than being cut with its connection.
                // Nothing was sent to the client yet, so any answer is whole.
                let refuse = || {
                    run.stop(StopReason::Shutdown);
                    reply::error(
                        &shared.dialect,
                        StatusCode::SERVICE_UNAVAILABLE,
                        &ErrorReply::coded(
                            FailureClass::Shutdown,
                            "shutdown",
                            "the gateway is shutting down; retry the request",
                        ),
                    )
                };
                // A turn that starts after the signal tries no target.
                if signal.is_ending() {
                    return refuse();
                }
                let ending = signal.ending();
                // Then the turn first: a poll that finds its answer ready does
                // not look at the signal. (Its wait polled once per task, as a
                // stream's is, saved one poll per turn but moved LTO's inlining
                // of the connection's write path: 11.5k instructions more per
                // 100-token stream.)
                tokio::select! {
                    biased;
                    response = running => response,
                    () = ending => refuse(),
                }
            }
        }
    }
}

/// Reads the request body once, with a cap, and has the dialect parse it
/// once.
async fn read<S, D, ReqBody, ResBody>(shared: &Shared<S, D>, body: ReqBody) -> Read<D, ResBody>
where
    D: Dialect,
    ReqBody: Body,
    ReqBody::Error: Into<BoxError>,
{
    let dialect = &shared.dialect;
    let bytes = match crate::limit::read_whole(body, shared.max_request_bytes).await {
        Ok(bytes) => bytes,
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return Err(reply::client_error(
                dialect,
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "the request body exceeds the {}-byte limit",
                    shared.max_request_bytes
                ),
                "request_too_large",
            ));
        }
        Err(error) => {
            return Err(reply::client_error(
                dialect,
                StatusCode::BAD_REQUEST,
                &format!("the request body could not be read: {error}"),
                "invalid_body",
            ));
        }
    };
    dialect.read_request(bytes).map_err(|error| {
        reply::request_error(dialect, &error.to_string(), error.code(), error.param())
    })
}

/// A turn in progress.
struct Turn<'a, S, D: Dialect> {
    shared: &'a Shared<S, D>,
    parts: &'a http::request::Parts,
    budget: &'a TurnBudget,
    run: &'a TurnRecord,
    requirements: Requirements,
    /// The client's `model`, shared by the turn's health keys and attempt
    /// records (one allocation per turn, not one per use).
    client_model: Arc<str>,
    request: D::Request,
    /// Output tokens assumed for spend checks.
    output_tokens: u64,
    /// Eligible targets still to try, in order.
    queue: Queue,
    /// Why ineligible targets were left out.
    excluded: Vec<String>,
    first_failure: Option<(Arc<str>, Classification)>,
    resting: Resting,
    /// Retries on the target at the front of the queue.
    retries_here: u32,
    /// The client health counts a request-shaped failure once for.
    witness: Option<Arc<str>>,
    /// The request translated for targets of other dialects.
    translations: Translations,
    /// Hedges this turn may still start.
    hedges_left: u32,
    /// The attempt a hedge was refused for (not asked again).
    no_hedge_for: Option<u32>,
}

/// An attempt the budget allowed: its target, number, admission, cost
/// estimate and the instant it began.
type Begun = (usize, u32, Admitted, Cost, Instant);

/// An answer that ends the turn early (boxed: it is the rare path).
type Early<B, D> = Box<Response<FailoverBody<B, D>>>;

/// The attempts of a turn still running, in start order.
type Racing<'a, F> = SmallVec<[Running<'a, F>; 1]>;

/// The targets a turn may still try, in order: kept inline, since a
/// route names a few (a list on the heap cost an allocation per turn).
#[derive(Default)]
struct Queue(SmallVec<[usize; 8]>);

impl Queue {
    fn front(&self) -> Option<&usize> {
        self.0.first()
    }

    fn pop_front(&mut self) -> Option<usize> {
        (!self.0.is_empty()).then(|| self.0.remove(0))
    }

    fn push_back(&mut self, index: usize) {
        self.0.push(index);
    }

    fn get(&self, at: usize) -> Option<&usize> {
        self.0.get(at)
    }

    fn remove(&mut self, at: usize) -> Option<usize> {
        (at < self.0.len()).then(|| self.0.remove(at))
    }

    fn retain(&mut self, mut keep: impl FnMut(&usize) -> bool) {
        self.0.retain(|index| keep(index));
    }

    fn iter(&self) -> std::slice::Iter<'_, usize> {
        self.0.iter()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a failed attempt leads to.
enum Next<R> {
    /// Go on: with the next target, or the attempts still running.
    Continue,
    /// Try the same target again after this wait.
    RetryAfter(std::time::Duration),
    /// The turn ends with this answer.
    Stop(R),
}

impl<'a, S, D, ResBody> Turn<'a, S, D>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    D: Dialect,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    async fn run(&mut self) -> Response<FailoverBody<ResBody, D>> {
        if let Err(response) = self.pick_candidates() {
            return *response;
        }
        self.hedges_left = self.hedges_allowed();
        // Inline: one attempt runs at a time unless a hedge races it.
        let mut running: Racing<'_, _> = SmallVec::new();
        let mut retry_wait = None;
        loop {
            if running.is_empty() {
                if let Some(after) = retry_wait.take() {
                    tokio::time::sleep(after).await;
                }
                let (index, admitted) = match self.next_admitted() {
                    Ok(next) => next,
                    Err(response) => return *response,
                };
                let (number, estimate, clock) = match self.begin_attempt(index).await {
                    Ok(begun) => begun,
                    Err(response) => return *response,
                };
                running.push(self.launch(index, number, admitted, estimate, clock, false));
            }
            let hedge_at = self.hedge_at(&running);
            match race::race(&mut running, hedge_at).await {
                Raced::HedgeDue => {
                    let latest = running.last().map(|r| r.start.number);
                    let target = if self.tools_allow_hedge() {
                        self.hedge_target(&running)
                    } else {
                        None
                    };
                    let hedge = match target {
                        Some((at, admitted)) => {
                            let reserved = Running::reserved(&running);
                            self.begin_hedge(at, admitted, reserved).await
                        }
                        None => None,
                    };
                    match hedge {
                        Some((index, number, admitted, estimate, clock)) => {
                            running
                                .push(self.launch(index, number, admitted, estimate, clock, true));
                        }
                        // Not asked again for this attempt.
                        None => self.no_hedge_for = latest,
                    }
                }
                Raced::Ended(at, outcome) => {
                    let ended = running.remove(at);
                    ended.in_flight.ended();
                    match outcome {
                        Outcome::Committed {
                            response,
                            ttft,
                            whole,
                        } => {
                            if whole {
                                ended.admitted.success(ttft);
                            } else {
                                ended.admitted.committed(ttft);
                            }
                            self.end_race(ended.index, ended.hedged, ended.start, &mut running);
                            return response;
                        }
                        Outcome::Failed {
                            failure,
                            output_events,
                        } => {
                            let attempt = FailedAttempt {
                                index: ended.index,
                                start: ended.start,
                                output_events,
                                hedged: ended.hedged,
                                racing: !running.is_empty(),
                            };
                            match self.on_failure(attempt, ended.admitted, failure) {
                                Next::Stop(response) => return response,
                                Next::Continue => {}
                                Next::RetryAfter(after) => retry_wait = Some(after),
                            }
                        }
                    }
                }
            }
        }
    }

    /// Starts attempt `number` on target `index`, begun at `clock`: its
    /// record and span begin, and its future is returned to be raced.
    fn launch(
        &mut self,
        index: usize,
        number: u32,
        admitted: Admitted,
        estimate: Cost,
        clock: Instant,
        hedged: bool,
    ) -> Running<'a, impl Future<Output = Outcome<ResBody, D>> + use<'a, S, D, ResBody>> {
        let shared: &'a Shared<S, D> = self.shared;
        let (budget, run) = (self.budget, self.run);
        let target = &shared.targets[index];
        let start = AttemptStart {
            number,
            target: Arc::clone(&target.name),
            provider: Arc::clone(&target.provider),
            upstream_model: target.upstream_model_shared(&self.client_model),
            dialect: target.dialect_name(shared.dialect.name()),
            wall: SystemTime::now(),
            clock,
        };
        let foreign = target.dialect.clone();
        let request = upstream::request(
            &shared.dialect,
            &shared.headers,
            self.parts,
            &self.request,
            &start.upstream_model,
            foreign.as_ref().zip(self.translations.body(index)),
        );
        // A whole answer has no stream state: one per attempt would cost an
        // allocation for nothing.
        let state = self.requirements.stream.then(StreamState::new);
        let plan = AttemptPlan {
            index,
            start: start.clone(),
            stream: self.requirements.stream,
            strip_usage: self.requirements.stream && !self.requirements.include_usage,
            input_tokens: self.requirements.input_tokens,
            first_output: target
                .first_output_for(self.requirements.reasoning)
                .unwrap_or(shared.timeouts.first_output),
            witness: self.witness.clone(),
            learn: self.learn(index, foreign.is_none()),
            state: state.clone(),
            foreign,
            hedged,
        };
        let span = observe::attempt_span(
            number,
            &start.target,
            &start.provider,
            &start.upstream_model,
        );
        run.begin_attempt(number, span.clone(), &start.target);
        if hedged {
            observe::hedge(&start.target, "started");
        }
        // A turn dropped mid-attempt still pays for it: the provider
        // goes on generating what it was asked for.
        let unfinished = Unfinished {
            budget,
            pricing: target.pricing,
            input_tokens: self.requirements.input_tokens,
            output_if_cut: self.output_if_cut(),
            state,
        };
        // The box first, then the future written into it: `Box::pin`
        // builds the future (about 2.1 KB) on the stack and copies it.
        let attempt = Box::write(
            Box::new_uninit(),
            attempt::run(shared, plan, request, budget, run),
        );
        Running {
            index,
            in_flight: InFlight::new(run, start.clone(), unfinished),
            start,
            admitted,
            hedged,
            estimate,
            attempt: InSpan::new(span, Box::into_pin(attempt)),
        }
    }

    /// How many hedges this turn may start: none without a policy, and
    /// none for a request whose repeat could have an effect (a provider-
    /// hosted tool, provider-held state; the result of a tool the route
    /// marked as not idempotent is checked when a hedge is first due:
    /// [`tools_allow_hedge`](Self::tools_allow_hedge)).
    fn hedges_allowed(&self) -> u32 {
        let Some(hedging) = self.shared.hedging.as_ref() else {
            return 0;
        };
        let requirements = &self.requirements;
        if !requirements.hosted_tools.is_empty() || requirements.provider_state.is_some() {
            return 0;
        }
        hedging.policy.max_hedges()
    }

    /// Whether the request carries no result of a tool the route marked
    /// as not idempotent. Read from the neutral request the translations
    /// share (made now if no target of another dialect needed it), and
    /// only when a hedge is due and some tool is marked: not on every
    /// turn. When it does carry one, the turn makes no hedge.
    fn tools_allow_hedge(&mut self) -> bool {
        let Some(hedging) = self.shared.hedging.as_ref() else {
            return false;
        };
        let (dialect, request) = (&self.shared.dialect, &self.request);
        let neutral = &mut self.translations.neutral;
        let allowed = hedging.allows_tools(|| {
            neutral
                .get_or_insert_with(|| dialect.to_neutral(request))
                .as_ref()
                .ok()
        });
        if !allowed {
            self.hedges_left = 0;
        }
        allowed
    }

    /// When the next hedge is due: the latest attempt's hedge wait after
    /// its start, while hedges are left, the latest attempt was not
    /// already refused one, and some target is left to race.
    fn hedge_at<F>(&self, running: &[Running<'_, F>]) -> Option<tokio::time::Instant> {
        let hedging = self.shared.hedging.as_ref()?;
        let latest = running.last()?;
        if self.hedges_left == 0 || self.no_hedge_for == Some(latest.start.number) {
            return None;
        }
        if !self
            .queue
            .iter()
            .any(|i| running.iter().all(|r| r.index != *i))
        {
            return None;
        }
        let wait = hedging.wait(latest.index, self.requirements.stream);
        Some(later(latest.start.clock, wait))
    }

    /// The queue position of the next target a hedge may race on: not
    /// running, and healthy (never a probe after a cooldown).
    fn hedge_target<F>(&self, running: &[Running<'_, F>]) -> Option<(usize, Admitted)> {
        let shared = self.shared;
        self.queue.iter().enumerate().find_map(|(at, &index)| {
            if running.iter().any(|r| r.index == index) {
                return None;
            }
            let key = shared.targets[index].health_key(&self.client_model);
            Admitted::new(&shared.health, key, false)
                .ok()
                .filter(|admitted| !admitted.is_probe())
                .map(|admitted| (at, admitted))
        })
    }

    /// Draws a hedge on the target at queue position `at` from the turn's
    /// budget: the deadline and attempts, the spend ceiling with the
    /// running attempts' estimates (`reserved`) and the hedge's own, the
    /// tenant's reservation, and the hedge budget. `None`: the turn goes
    /// on waiting, as without hedging.
    async fn begin_hedge(
        &mut self,
        at: usize,
        admitted: Admitted,
        reserved: Cost,
    ) -> Option<Begun> {
        let shared = self.shared;
        let hedging = shared.hedging.as_ref()?;
        let index = *self.queue.get(at)?;
        let estimate = shared.targets[index]
            .estimate(self.requirements.input_tokens, self.output_tokens)
            .unwrap_or(Cost::ZERO);
        if self
            .budget
            .check_spend(reserved.saturating_add(estimate))
            .is_err()
            || self.budget.check_open().is_err()
            || self.budget.reserve_tenant(estimate).await.is_err()
            || !hedging.policy.budget.withdraw()
        {
            return None;
        }
        let clock = Instant::now();
        let number = self.budget.try_begin_hedge_at(clock).ok()?;
        self.resting.attempted(index);
        self.queue.remove(at);
        self.hedges_left -= 1;
        Some((index, number, admitted, estimate, clock))
    }

    /// Another attempt committed: the ones still running lose the race
    /// (dropped, which closes their upstream connections), and what each
    /// took is learned for the hedge percentile.
    fn end_race<F>(
        &self,
        index: usize,
        hedged: bool,
        start: AttemptStart,
        // Borrowed, not moved in: the list holds an attempt inline.
        running: &mut Racing<'_, F>,
    ) {
        let Some(hedging) = self.shared.hedging.as_ref() else {
            return;
        };
        let stream = self.requirements.stream;
        hedging.observe(index, stream, start.clock.elapsed());
        if hedged {
            observe::hedge(&start.target, "won");
        }
        for loser in running.drain(..) {
            hedging.observe(loser.index, stream, loser.start.clock.elapsed());
            if loser.hedged {
                observe::hedge(&loser.start.target, "lost");
            }
            // The attempt is dropped first: its connection closes before
            // its record is written.
            drop(loser.attempt);
            drop(loser.admitted);
            loser.in_flight.lost_race(loser.hedged, start.number);
        }
    }

    /// Eligible targets, ordered by the strategy.
    fn pick_candidates(&mut self) -> Result<(), Early<ResBody, D>> {
        let shared = self.shared;
        // Inline: a route names a few targets.
        let mut candidates: SmallVec<[Candidate; 8]> = SmallVec::new();
        let bound = self.bound_provider();
        // Apart from `self`, which the loop borrows mutably.
        let client_model = Arc::clone(&self.client_model);
        let latency = |target: &Target<Classify<S>>| {
            shared
                .strategy
                .reads_latency()
                .then(|| {
                    shared
                        .health
                        .time_to_first_output(&target.health_key(&client_model))
                })
                .flatten()
        };
        for (index, target) in shared.targets.iter().enumerate() {
            if let Err(why) = self.binding_allows(target, bound.as_deref()) {
                self.excluded.push(why);
                continue;
            }
            if target.dialect.is_some() {
                match self.translate_for(index) {
                    Ok(()) => candidates.push(Candidate {
                        index,
                        estimated_cost: target
                            .estimate(self.requirements.input_tokens, self.output_tokens),
                        time_to_first_output: latency(target),
                    }),
                    Err(why) => self.excluded.push(why),
                }
                continue;
            }
            let missing = target.capabilities.missing(&self.requirements);
            if missing.is_empty() {
                candidates.push(Candidate {
                    index,
                    estimated_cost: target
                        .estimate(self.requirements.input_tokens, self.output_tokens),
                    time_to_first_output: latency(target),
                });
            } else {
                self.excluded
                    .push(format!("{} lacks {}", target.name, missing.join(", ")));
            }
        }
        if candidates.is_empty() {
            self.run.stop(StopReason::InvalidRequest);
            return Err(Box::new(reply::client_error(
                &shared.dialect,
                StatusCode::BAD_REQUEST,
                &format!(
                    "no compatible target for this request: {}",
                    self.excluded.join("; ")
                ),
                "no_compatible_target",
            )));
        }
        shared.strategy.order(&mut candidates);
        self.queue = Queue(candidates.iter().map(|c| c.index).collect());
        Ok(())
    }

    /// The provider a request that continues provider-held state is bound
    /// to: the one learned to hold it or, for state this process has not
    /// seen, the provider of the route's first target of the clients' own
    /// dialect (no other provider can hold it).
    fn bound_provider(&self) -> Option<Arc<str>> {
        let state = self.requirements.provider_state.as_ref()?;
        self.shared.owners.owner(&state.id).or_else(|| {
            self.shared
                .targets
                .iter()
                .find(|t| t.dialect.is_none())
                .map(|t| Arc::clone(&t.provider))
        })
    }

    /// Whether the request may go to `target` at all: provider-held state
    /// binds it to the provider holding it (`bound`), and a provider-hosted
    /// tool to targets of the clients' dialect. `Err` names why not.
    fn binding_allows(
        &self,
        target: &Target<Classify<S>>,
        bound: Option<&str>,
    ) -> Result<(), String> {
        let dialect = target.dialect_name(self.shared.dialect.name());
        if let Some(state) = &self.requirements.provider_state {
            let holder = bound.unwrap_or("(none of this route's targets)");
            if target.dialect.is_some() || Some(&*target.provider) != bound {
                return Err(format!(
                    "{} ({}, {dialect}): {} binds this turn to provider {holder}",
                    target.name, target.provider, state.field
                ));
            }
        }
        if target.dialect.is_some()
            && let Some(tool) = self.requirements.hosted_tools.first()
        {
            return Err(format!(
                "{} ({dialect}) cannot run the provider-hosted tool {tool}",
                target.name
            ));
        }
        Ok(())
    }

    /// What the answer of target `index` teaches the state owners: only a
    /// target of the clients' own dialect holds state a client can name.
    fn learn(&self, index: usize, native: bool) -> Option<Learn> {
        let requirements = &self.requirements;
        if !native || (!requirements.store && requirements.provider_state.is_none()) {
            return None;
        }
        Some(Learn {
            owners: Arc::clone(&self.shared.owners),
            provider: Arc::clone(&self.shared.targets[index].provider),
            stored: requirements.store,
            state: requirements.provider_state.as_ref().map(|s| s.id.clone()),
        })
    }

    /// Judges target `index` of another dialect and, when it is eligible,
    /// translates the request for it. `Err` says why it is not, by name:
    /// what it lacks, or what its dialect cannot express.
    fn translate_for(&mut self, index: usize) -> Result<(), String> {
        let shared = self.shared;
        let target = &shared.targets[index];
        let Some(foreign) = &target.dialect else {
            return Ok(());
        };
        let dialect = foreign.0.name();
        let missing = target.capabilities.missing(&translate::clipped(
            &self.requirements,
            &target.capabilities,
        ));
        if !missing.is_empty() {
            return Err(format!("{} lacks {}", target.name, missing.join(", ")));
        }
        let neutral = self
            .translations
            .neutral
            .get_or_insert_with(|| shared.dialect.to_neutral(&self.request));
        let neutral = match neutral {
            Ok(neutral) => translate::fit(neutral, &target.capabilities),
            Err(why) => {
                return Err(format!(
                    "{} ({dialect}) cannot be sent this request: {why}",
                    target.name
                ));
            }
        };
        let model = target.upstream_model(&self.requirements.model);
        match foreign.0.body_from_neutral(&neutral, model) {
            Ok(body) => {
                self.translations.keep(index, body, shared.targets.len());
                Ok(())
            }
            Err(why) => Err(format!("{} ({dialect}) cannot express {why}", target.name)),
        }
    }

    /// The next admissible target: resting targets are skipped, and probed
    /// last when nothing else is left.
    fn next_admitted(&mut self) -> Result<(usize, Admitted), Early<ResBody, D>> {
        let shared = self.shared;
        loop {
            let Some(&index) = self.queue.front() else {
                if let Some(index) = self.resting.probe_soonest() {
                    self.queue.push_back(index);
                    continue;
                }
                // Nothing tried but resting targets (or only their probe):
                // nothing was available.
                self.run.stop(
                    if self.first_failure.is_none() || self.resting.only_probes_tried() {
                        StopReason::NoAvailableTarget
                    } else {
                        StopReason::Exhausted
                    },
                );
                return Err(Box::new(reply::exhausted(
                    &shared.dialect,
                    self.first_failure.as_ref(),
                    self.budget,
                    &self.resting.note(&shared.targets, &self.excluded),
                    self.resting.only_probes_tried(),
                )));
            };
            let key = shared.targets[index].health_key(&self.client_model);
            // Healthy, or admitted as the probe after a cooldown.
            match Admitted::new(&shared.health, key, self.resting.is_forced(index)) {
                Ok(admitted) => return Ok((index, admitted)),
                Err(availability) => {
                    self.resting.skip(index, availability);
                    self.queue.pop_front();
                    self.retries_here = 0;
                }
            }
        }
    }

    /// Draws one attempt from the turn's budget: checks the turn's spend
    /// ceiling, then reserves the attempt's estimate with the turn's tenant
    /// (the first reservation is the turn's admission) before anything is
    /// sent. With the attempt's number and estimate comes the instant it
    /// began, read once for the budget and the attempt's record.
    async fn begin_attempt(
        &mut self,
        index: usize,
    ) -> Result<(u32, Cost, Instant), Early<ResBody, D>> {
        let target = &self.shared.targets[index];
        let estimate = target.estimate(self.requirements.input_tokens, self.output_tokens);
        if let Some(estimate) = estimate
            && let Err(refusal) = self.budget.check_spend(estimate)
        {
            return Err(self.refuse(&refusal));
        }
        // Unpriced targets reserve nothing, but the tenant's total must
        // still be below its ceiling.
        if let Err(refusal) = self
            .budget
            .reserve_tenant(estimate.unwrap_or(Cost::ZERO))
            .await
        {
            return Err(self.refuse(&refusal));
        }
        // A reservation left unused (no attempt left) is given back when
        // the turn settles.
        // One clock read for the budget's checks and the attempt's start.
        let clock = Instant::now();
        let number = match self.budget.try_begin_attempt_at(clock) {
            Ok(number) => number,
            Err(refusal) => return Err(self.refuse(&refusal)),
        };
        self.resting.attempted(index);
        // Every first attempt earns hedges a share, as the retry budget.
        if number == 1
            && let Some(hedging) = self.shared.hedging.as_ref()
        {
            hedging.policy.budget.deposit();
        }
        Ok((number, estimate.unwrap_or(Cost::ZERO), clock))
    }

    /// The turn stops, refused by its budget.
    fn refuse(&self, refusal: &BudgetExhausted) -> Early<ResBody, D> {
        self.run.stop(refusal.stop_reason());
        Box::new(reply::budget_stop(
            &self.shared.dialect,
            refusal,
            self.first_failure.as_ref(),
            self.budget,
        ))
    }

    /// Output tokens charged for an attempt cut before its answer came: a
    /// whole answer is being generated all the same, so the request's
    /// `max_tokens` (or the configured default); a stream's output is
    /// counted as it comes.
    fn output_if_cut(&self) -> u64 {
        if self.requirements.stream {
            0
        } else {
            self.output_tokens
        }
    }

    /// What a failed attempt is charged, if anything: prompt tokens plus
    /// the output seen, or plus [`output_if_cut`](Self::output_if_cut) for
    /// a whole answer that timed out. Nothing for an attempt that never
    /// reached the provider, or that the provider refused with an error
    /// status (providers do not bill refused requests).
    fn failed_charge(&self, attempt: &FailedAttempt, failure: &Classification) -> Option<Usage> {
        let refused = failure
            .status
            .is_some_and(|s| s.is_client_error() || s.is_server_error());
        if !failure.phase.may_have_reached_provider() || refused {
            return None;
        }
        let output = if failure.class == FailureClass::Timeout {
            attempt.output_events.max(self.output_if_cut())
        } else {
            attempt.output_events
        };
        Some(Usage::new(self.requirements.input_tokens, output))
    }

    /// Records a failed attempt, updates health, and decides what follows.
    /// While another attempt is still running (a hedge's race), the failed
    /// one is recorded as a reroute and the turn goes on with the others.
    fn on_failure(
        &mut self,
        attempt: FailedAttempt,
        admitted: Admitted,
        failure: Classification,
    ) -> Next<Response<FailoverBody<ResBody, D>>> {
        let shared = self.shared;
        let target = &shared.targets[attempt.index];
        let scope = shared
            .scopes
            .scope(failure.class, failure.note, target.passes_client_model());
        if failure.class == FailureClass::ModelNotFound && scope != Scope::Request {
            tracing::error!(
                target = %log_safe(&target.name),
                upstream_model = %log_safe(&attempt.start.upstream_model),
                "the provider does not know a model the gateway's configuration names: \
                 fix the configuration"
            );
        }
        // A model the client named and the provider does not know is the
        // client's error: it goes back as the provider's 404.
        let client_named_unknown_model = failure.class == FailureClass::ModelNotFound
            && scope == Scope::Request
            && target.passes_client_model();
        let cooldown = admitted.failure(FailureReport {
            retry_after: failure.retry.after,
            witness: self.witness.clone(),
            ..FailureReport::new(failure.class, scope)
        });
        if cooldown.is_some() {
            observe::cooldown_started(&target.provider, scope.as_str());
        }
        // Every attempt the provider processed is paid for: its estimated
        // cost counts.
        let charge = self
            .failed_charge(&attempt, &failure)
            .map(|estimate| Charge::to_turn(self.budget, target.pricing, None, estimate));
        let step = if attempt.racing {
            self.leave(attempt.index, &failure);
            Step::Reroute
        } else if client_named_unknown_model {
            Step::Stop
        } else {
            self.decide(attempt.index, &failure, cooldown)
        };
        // Every failure here is before commit: nothing reached the client
        // (bytes_flushed stays 0).
        let mut record = attempt.start.record(step.decision());
        record.hedged = attempt.hedged;
        if let Step::RetrySame { after } = step {
            record.retry_wait = Some(after);
        }
        record.class = Some(failure.class);
        record.phase = Some(failure.phase);
        record.status = failure.status.map(|s| s.as_u16());
        record.output_events = attempt.output_events;
        record.message = Some(failure.message.clone());
        record.rate_limits = failure.rate_limits.clone();
        if let Some(charge) = charge {
            charge.fill(&mut record);
        }
        let request_error = failure.recovery == Decision::Stop || client_named_unknown_model;
        match step {
            // Certain only once the next attempt begins: the turn may still
            // stop first (spend ceiling, retry budget, nothing admitted).
            Step::RetrySame { .. } | Step::Reroute if !attempt.racing => self.run.hold(record),
            Step::Reroute => self.run.push(record),
            _ => {
                self.run.push(record);
                self.run.stop(if request_error {
                    StopReason::RequestError
                } else {
                    StopReason::Exhausted
                });
            }
        }
        let first = self
            .first_failure
            .get_or_insert_with(|| (Arc::clone(&target.name), failure.clone()))
            .clone();
        match step {
            // A request error: the provider's own message and status, never
            // sent elsewhere.
            Step::Stop if request_error => Next::Stop(reply::classified(&shared.dialect, &failure)),
            Step::Stop => {
                let note = if failure.class == FailureClass::ContextLengthExceeded {
                    "no target with a larger context window remains".to_owned()
                } else {
                    self.resting.note(&shared.targets, &self.excluded)
                };
                Next::Stop(reply::exhausted(
                    &shared.dialect,
                    Some(&first),
                    self.budget,
                    &note,
                    self.resting.only_probes_tried(),
                ))
            }
            Step::RetrySame { after } => {
                self.retries_here += 1;
                Next::RetryAfter(after)
            }
            Step::Reroute => Next::Continue,
        }
    }

    /// The policy's decision, with the queue moved on for a reroute (a
    /// reroute with nothing left, not even a resting target to probe, is a
    /// stop).
    fn decide(
        &mut self,
        index: usize,
        failure: &Classification,
        cooldown: Option<std::time::Duration>,
    ) -> Step {
        // A hedge's target left the queue when the hedge began: it is
        // never retried.
        let at_front = self.queue.front() == Some(&index);
        let others_left = self.queue.iter().any(|&i| i != index);
        let step = decide(
            failure,
            if at_front {
                self.retries_here
            } else {
                self.shared.max_retries_per_target
            },
            self.shared.max_retries_per_target,
            self.budget,
            cooldown,
            others_left.then_some(self.shared.max_same_target_wait),
        );
        if step != Step::Reroute {
            return step;
        }
        self.leave(index, failure);
        if self.queue.is_empty() && !self.resting.can_probe() {
            Step::Stop
        } else {
            Step::Reroute
        }
    }

    /// The turn moves on from target `index` after `failure`.
    fn leave(&mut self, index: usize, failure: &Classification) {
        if self.queue.front() == Some(&index) {
            self.queue.pop_front();
            self.retries_here = 0;
        } else {
            self.queue.retain(|&i| i != index);
        }
        if failure.class == FailureClass::ContextLengthExceeded {
            self.keep_larger_windows(index);
        }
    }

    /// After a context-length failure, only targets with a larger declared
    /// window can help (any declared window, if the failing target
    /// declared none); resting targets were not filtered for that.
    fn keep_larger_windows(&mut self, failed: usize) {
        let targets = &self.shared.targets;
        let failed_window = targets[failed].capabilities.context_window;
        self.queue.retain(
            |&i| match (targets[i].capabilities.context_window, failed_window) {
                (Some(window), Some(failed)) => window > failed,
                (Some(_), None) => true,
                (None, _) => false,
            },
        );
        self.resting.forget_all();
    }
}

/// The facts of one failed attempt, for its record.
struct FailedAttempt {
    index: usize,
    start: AttemptStart,
    output_events: u64,
    /// It was a hedge.
    hedged: bool,
    /// Other attempts are still running.
    racing: bool,
}
