use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use tower_service::Service;

use super::body::FailoverBody;
use super::headers::HeaderPolicy;
use super::select::Strategy;
use super::shared::Shared;
use super::target::Target;
use crate::BoxError;
use crate::budget::TurnLimits;
use crate::classify::Classifier;
use crate::dialect::{DefaultDialect, Dialect};
use crate::health::{CooldownPolicy, HealthStore, MemoryHealthStore, ScopeRules};
use crate::stream::CommitWindow;
use crate::stream::StreamPolicy;
use crate::stream::commit::InspectConfig;

/// Zero-token failover across targets: a Tower service for the requests of
/// one wire [`Dialect`] (OpenAI chat completions by default). See the
/// [module docs](super).
///
/// Readiness of the targets is driven inside each call (`oneshot`), as axum
/// expects of services it routes to, so `poll_ready` is always ready. Every
/// outcome is a response (an OpenAI-shaped error when the turn stops), so
/// the error type is [`Infallible`].
pub struct Failover<S, D = DefaultDialect> {
    shared: Arc<Shared<S, D>>,
}

impl<S, D> Clone for Failover<S, D> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, D> std::fmt::Debug for Failover<S, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failover")
            .field(
                "targets",
                &self
                    .shared
                    .targets
                    .iter()
                    .map(|t| &*t.name)
                    .collect::<Vec<_>>(),
            )
            .field("strategy", &self.shared.strategy)
            .finish_non_exhaustive()
    }
}

impl<S> Failover<S> {
    /// Starts building a failover service (OpenAI chat completions; see
    /// [`FailoverBuilder::dialect`]).
    pub fn builder() -> FailoverBuilder<S> {
        FailoverBuilder::new()
    }
}

impl<S, D> Failover<S, D> {
    /// The health registry this service reads and reports to (shared with
    /// every other service built with the same store).
    pub fn health(&self) -> &Arc<dyn HealthStore> {
        &self.shared.health
    }

    /// The index of the target named `name`: its place in the
    /// [`Candidate::index`](super::Candidate::index) a
    /// [`Selector`](super::Selector) sees.
    pub fn target_index(&self, name: &str) -> Option<usize> {
        self.shared.targets.iter().position(|t| &*t.name == name)
    }
}

/// Builds a [`Failover`]. Defaults: configured order, commit on the first
/// output, 10 s head timeout for streams, 60 s head timeout for
/// non-streaming answers, 15 s to the first output, 30 s idle gap between
/// body frames (streams and whole answers), no cap on a whole answer
/// beyond those and the turn's deadline, 2 retries on one target, turn
/// limits of [`TurnLimits::new`] (used when no
/// [`BudgetLayer`](crate::budget::BudgetLayer) set a turn budget), 8 MiB
/// request and 16 MiB response caps, 1 MiB held back, and the header
/// allow-lists of [`HeaderPolicy::new`].
#[derive(Clone)]
pub struct FailoverBuilder<S, D = DefaultDialect> {
    dialect: D,
    targets: Vec<Target<S>>,
    strategy: Strategy,
    classifier: Classifier,
    limits: TurnLimits,
    commit: CommitWindow,
    timeouts: Timeouts,
    headers: HeaderPolicy,
    caps: Caps,
    default_output_tokens: u64,
    stream: StreamPolicy,
    health: Option<Arc<dyn HealthStore>>,
    scopes: ScopeRules,
    refuse_when_cooling: bool,
    shutdown: Option<crate::shutdown::Shutdown>,
    hedge: Option<super::Hedge>,
    metrics_batch: usize,
}

impl<S, D> std::fmt::Debug for FailoverBuilder<S, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailoverBuilder")
            .field("targets", &self.targets.len())
            .finish_non_exhaustive()
    }
}

impl<S> Default for FailoverBuilder<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> FailoverBuilder<S> {
    /// A builder with the defaults and no targets, for OpenAI chat
    /// completions ([`Failover::builder`]).
    pub(crate) fn new() -> Self {
        Self {
            dialect: DefaultDialect::default(),
            targets: Vec::new(),
            strategy: Strategy::Ordered,
            classifier: Classifier::default(),
            limits: TurnLimits::new(),
            commit: CommitWindow::default(),
            timeouts: Timeouts::default(),
            headers: HeaderPolicy::new(),
            caps: Caps::default(),
            default_output_tokens: 512,
            stream: StreamPolicy::new().idle_timeout(Duration::from_secs(30)),
            health: None,
            scopes: ScopeRules::new(),
            refuse_when_cooling: false,
            shutdown: None,
            hedge: None,
            metrics_batch: 1,
        }
    }
}

impl<S, D: Dialect> FailoverBuilder<S, D> {
    /// Serves another wire dialect: its requests, streams, answers and
    /// error shapes. Targets must speak it.
    pub fn dialect<D2: Dialect>(self, dialect: D2) -> FailoverBuilder<S, D2> {
        FailoverBuilder {
            stream: self.stream,
            dialect,
            targets: self.targets,
            strategy: self.strategy,
            classifier: self.classifier,
            limits: self.limits,
            commit: self.commit,
            timeouts: self.timeouts,
            headers: self.headers,
            caps: self.caps,
            default_output_tokens: self.default_output_tokens,
            health: self.health,
            scopes: self.scopes,
            refuse_when_cooling: self.refuse_when_cooling,
            shutdown: self.shutdown,
            hedge: self.hedge,
            metrics_batch: self.metrics_batch,
        }
    }

    /// Adds a target; targets are tried in the order added unless the
    /// strategy says otherwise. Every target has the same service type:
    /// for targets of different types (the `UpstreamClient` and a
    /// `service_fn`, say) use [`Target::boxed`].
    pub fn target(mut self, target: Target<S>) -> Self {
        self.targets.push(target);
        self
    }

    pub(crate) fn with_primary(mut self, target: Target<S>) -> Self {
        self.targets.insert(0, target);
        self
    }

    pub(crate) fn has_health(&self) -> bool {
        self.health.is_some()
    }

    /// The health registry: share one store between every route and
    /// failover of a gateway, so a provider has one health state. Without
    /// one, [`build`](Self::build) makes a [`MemoryHealthStore`] with the
    /// default [`CooldownPolicy`] (a store brings its own:
    /// `MemoryHealthStore::new(policy)` for another).
    pub fn health(mut self, store: Arc<dyn HealthStore>) -> Self {
        self.health = Some(store);
        self
    }

    /// Which scope a failure class is charged to (default [`ScopeRules::new`]).
    pub fn scopes(mut self, rules: ScopeRules) -> Self {
        self.scopes = rules;
        self
    }

    /// When every eligible target is cooling down, refuse the turn at once
    /// with 503 `no_available_target` instead of probing the target whose
    /// cooldown ends first (default `false`: probe, as Envoy's panic
    /// threshold does).
    pub fn refuse_when_cooling(mut self, refuse: bool) -> Self {
        self.refuse_when_cooling = refuse;
        self
    }

    /// The selection strategy.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// The classifier (with its overrides) every target's failures go
    /// through.
    pub fn classifier(mut self, classifier: Classifier) -> Self {
        self.classifier = classifier;
        self
    }

    /// Turn limits used when the request carries no turn budget.
    pub fn limits(mut self, limits: TurnLimits) -> Self {
        self.limits = limits;
        self
    }

    /// How long each part of an attempt may take: `set` gets the current
    /// [`Timeouts`] (the defaults: stream head 10 s, non-streaming head
    /// 60 s, whole answer none, first output 15 s) and returns the new ones
    /// (`|t| Timeouts { head: None, ..t }`).
    pub fn timeouts(mut self, set: impl FnOnce(Timeouts) -> Timeouts) -> Self {
        self.timeouts = set(self.timeouts);
        self
    }

    /// What one turn may take at most: `set` gets the current [`Caps`]
    /// (the defaults: 8 MiB request, 16 MiB response, 1 MiB held back, 2
    /// retries on one target, 5 s same-target wait) and returns the new
    /// ones.
    pub fn caps(mut self, set: impl FnOnce(Caps) -> Caps) -> Self {
        self.caps = set(self.caps);
        self
    }

    /// When a streamed answer is released to the client.
    pub fn commit_window(mut self, window: CommitWindow) -> Self {
        self.commit = window;
        self
    }

    /// Which headers cross the layer, each way (default
    /// [`HeaderPolicy::new`]). Replaces the lists set so far.
    pub fn header_policy(mut self, policy: HeaderPolicy) -> Self {
        self.headers = policy;
        self
    }

    /// Output tokens assumed for spend checks when the request sets no
    /// `max_tokens`.
    pub fn default_output_tokens(mut self, tokens: u64) -> Self {
        self.default_output_tokens = tokens;
        self
    }

    /// How streams are ended and bounded: terminal mode, finish reason,
    /// caps, and the idle timeout, which is also the longest gap inside a
    /// non-streaming body (default 30 s; none: no idle limit).
    pub fn stream_policy(mut self, policy: StreamPolicy) -> Self {
        self.stream = policy;
        self
    }

    /// When `signal` fires: running streams end with the dialect's terminal
    /// event (class `shutdown`; no end marker for dialects whose marker
    /// means success), and a turn that has not answered yet (waiting for a
    /// response head, held back before commit, or in backoff) answers the
    /// dialect's `503` error with class and code `shutdown` at once (it
    /// never reroutes). See [`Shutdown`](crate::shutdown::Shutdown).
    pub fn shutdown(mut self, signal: crate::shutdown::Shutdown) -> Self {
        self.shutdown = Some(signal);
        self
    }

    /// Races a hedge when an attempt is slow to commit ([`Hedge`](super::Hedge));
    /// off by default. Only the first attempt to commit reaches the client:
    /// the others are cancelled, their upstream connections closed.
    pub fn hedge(mut self, policy: super::Hedge) -> Self {
        self.hedge = Some(policy);
        self
    }

    /// Holds up to `batch` clean attempts and first-try turns per target
    /// before their metrics reach the recorder (default 1: each is
    /// reported as it ends). Every thread serving the stack shares its
    /// metric handles, so on several cores each update is a cache line
    /// taken from another core; a batch takes it once. Held figures
    /// reach the recorder when the batch fills, when
    /// [`flush_metrics`](crate::observe::flush_metrics) is called (before a
    /// scrape, and on a timer), and when the stack is dropped. Failures
    /// and reroutes are always reported at once.
    pub fn batch_metrics(mut self, batch: usize) -> Self {
        self.metrics_batch = batch;
        self
    }

    /// Builds the service.
    pub fn build(self) -> Failover<S, D> {
        let classifier = self.classifier;
        let targets: Vec<_> = self
            .targets
            .into_iter()
            .map(|mut t| {
                // A target of the clients' own dialect is not translated.
                if t.dialect.as_ref().is_some_and(|d| d.is::<D>()) {
                    t.dialect = None;
                }
                t.classified(&classifier)
            })
            .collect();
        let mut stream = InspectConfig::new(self.dialect.clone());
        stream.apply(&self.stream);
        stream.classifier = classifier.clone();
        stream.shutdown = self.shutdown.clone();
        let headers = self
            .headers
            .forward_request_headers(self.dialect.forwarded_request_headers());
        let idle = self.stream.idle_timeout.unwrap_or(Duration::MAX);
        let target_count = targets.len();
        Failover {
            shared: Arc::new(Shared {
                dialect: self.dialect,
                health: self
                    .health
                    .unwrap_or_else(|| Arc::new(MemoryHealthStore::new(CooldownPolicy::default()))),
                scopes: self.scopes,
                refuse_when_cooling: self.refuse_when_cooling,
                meters: crate::observe::Meters::new(
                    targets.iter().map(|t| (&t.name, &t.provider)),
                    self.metrics_batch,
                ),
                targets,
                strategy: self.strategy,
                classifier,
                limits: self.limits,
                commit: self.commit,
                timeouts: self.timeouts,
                idle,
                headers,
                max_request_bytes: self.caps.request_bytes,
                max_response_bytes: self.caps.response_bytes,
                max_held_bytes: self.caps.held_bytes,
                max_retries_per_target: self.caps.retries_per_target,
                max_same_target_wait: self.caps.same_target_wait,
                default_output_tokens: self.default_output_tokens,
                stream: Arc::new(stream),
                shutdown: self.shutdown,
                owners: Arc::default(),
                hedging: self
                    .hedge
                    .map(|h| super::hedge::Hedging::new(h, target_count)),
            }),
        }
    }
}

/// How long the failover layer waits for each part of an attempt; set
/// with [`FailoverBuilder::timeouts`]. The gap between body frames is the
/// [`StreamPolicy`]'s idle timeout.
///
/// Plain data: change the fields you need and keep the rest.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::failover::{Failover, Target, Timeouts};
/// # let upstream = tower_llm_testing::FakeProvider::new("primary");
///
/// let failover = Failover::builder()
///     .target(Target::new("primary", upstream))
///     .timeouts(|t| Timeouts {
///         non_streaming_head: Some(Duration::from_secs(90)),
///         first_output: Duration::from_secs(20),
///         ..t
///     })
///     .build();
/// # let _ = failover;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Time allowed for the response head of a streaming request (default
    /// 10 s). The head of a stream is also never waited on past the first
    /// output timeout. `None`: bounded by those and the turn's deadline.
    pub head: Option<Duration>,
    /// Time allowed for the response head of a non-streaming request
    /// (default 60 s, half the default turn deadline): a silent upstream is
    /// rerouted while the turn still has time. A non-streaming head comes
    /// only once the provider has written the whole answer, so raise it (or
    /// stream) for long completions such as reasoning models or a large
    /// `max_tokens`, and keep it well under the turn's deadline so a backup
    /// still has time. `None`: bounded by the
    /// [response timeout](Self::response) and the turn's deadline.
    pub non_streaming_head: Option<Duration>,
    /// Time allowed for a whole non-streaming answer (head and body).
    /// `None` (the default): bounded only by the turn's deadline, the
    /// [head timeout](Self::non_streaming_head) and the
    /// [idle timeout](crate::stream::StreamPolicy::idle_timeout) between
    /// body frames.
    pub response: Option<Duration>,
    /// Time allowed from an attempt's start to its first model output
    /// (default 15 s), for targets that set none of their own
    /// ([`Target::first_output_timeout`](super::Target::first_output_timeout)).
    pub first_output: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            head: Some(Duration::from_secs(10)),
            non_streaming_head: Some(Duration::from_secs(60)),
            response: None,
            first_output: Duration::from_secs(15),
        }
    }
}

/// What the failover layer takes of one turn at most: bytes each way, the
/// held-back preamble, retries on one target and the wait before one; set
/// with [`FailoverBuilder::caps`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Cap on the client's request body (default 8 MiB).
    pub request_bytes: usize,
    /// Cap on a non-streaming upstream body (default 16 MiB).
    pub response_bytes: usize,
    /// Cap on the bytes held back before commit (default 1 MiB).
    pub held_bytes: u64,
    /// Retries on one target (for failures whose recovery is to retry the
    /// same target) before rerouting (default 2).
    pub retries_per_target: u32,
    /// The longest wait before retrying the same target while another
    /// target is left (default 5 s). A longer wait, usually a provider's
    /// `retry-after`, reroutes at once instead: a healthy backup answers
    /// sooner. With no other target left, any wait that fits the turn's
    /// deadline (and the backoff's `max_server_delay`) is taken.
    pub same_target_wait: Duration,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            request_bytes: 8 << 20,
            response_bytes: 16 << 20,
            held_bytes: 1 << 20,
            retries_per_target: 2,
            same_target_wait: Duration::from_secs(5),
        }
    }
}

/// Response future of [`Failover`]. Boxed: a turn awaits the request body,
/// several attempts, backoff sleeps and the held-back preamble, which a
/// hand-written state machine would only make harder to read; one
/// allocation per turn is noise next to the upstream call.
pub struct ResponseFuture<B, D: Dialect = DefaultDialect> {
    inner: BoxTurn<B, D>,
}

/// A turn in progress, boxed.
type BoxTurn<B, D> = Pin<Box<dyn Future<Output = Response<FailoverBody<B, D>>> + Send>>;

impl<B, D: Dialect> std::fmt::Debug for ResponseFuture<B, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failover::ResponseFuture")
    }
}

impl<B, D: Dialect> Future for ResponseFuture<B, D> {
    type Output = Result<Response<FailoverBody<B, D>>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx).map(Ok)
    }
}

impl<S, D, ReqBody, ResBody> Service<Request<ReqBody>> for Failover<S, D>
where
    S: Service<Request<Full<Bytes>>, Response = Response<ResBody>> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    D: Dialect,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
{
    type Response = Response<FailoverBody<ResBody, D>>;
    type Error = Infallible;
    type Future = ResponseFuture<ResBody, D>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The box first, the turn's future (some 1.3 KB; its answer has a
        // box of its own) written into it:
        // `Box::pin` would build it on the stack and copy it in.
        let turn = Box::write(
            Box::new_uninit(),
            super::turn::run(Arc::clone(&self.shared), request),
        );
        ResponseFuture {
            inner: Box::into_pin(turn),
        }
    }
}
