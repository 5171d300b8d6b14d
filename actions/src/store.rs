//! The `ActionStore` trait: atomic claims and transitions.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;

use super::digest::ArgumentsDigest;
use super::id::ActionId;
use super::reconcile::Reconciliation;
use super::state::{ActionRecord, ActionState, FenceToken, StateKind, StoredError, Transition};

/// A boxed, `Send` future, so [`ActionStore`] and
/// [`Reconciler`](super::Reconciler) stay object safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A type-erased error.
pub(crate) use tower::BoxError;

/// What a caller asks the store for when it wants to run an action.
///
/// Build it with [`ClaimRequest::new`] and
/// [`with_attempt_id`](ClaimRequest::with_attempt_id); more fields may be added.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The action.
    pub action_id: ActionId,
    /// The model attempt asking, for the record.
    pub attempt_id: Option<String>,
    /// The tool; a record claimed for another tool is a
    /// [`StoreError::ToolMismatch`].
    pub tool: String,
    /// How long a `running` claim is trusted. A claim that finds a running
    /// record past its lease turns it `unknown`: its owner vanished, and the
    /// effect may or may not have been applied.
    pub lease: Duration,
    /// The digest of the call's arguments. A store keeps the first claim's
    /// and refuses a later claim with another
    /// ([`StoreError::ArgumentsDiffer`]). `None` (and a record claimed
    /// without one) checks nothing.
    pub arguments: Option<ArgumentsDigest>,
}

impl ClaimRequest {
    /// A claim of `action_id` for `tool`, trusting a `running` claim for
    /// `lease`, with no attempt id.
    pub fn new(action_id: impl Into<ActionId>, tool: impl Into<String>, lease: Duration) -> Self {
        Self {
            action_id: action_id.into(),
            attempt_id: None,
            tool: tool.into(),
            lease,
            arguments: None,
        }
    }

    /// Binds the claim to these arguments (their [`ArgumentsDigest`]).
    pub fn with_arguments(mut self, arguments: &Value) -> Self {
        self.arguments = Some(ArgumentsDigest::of(arguments));
        self
    }

    /// Records which model attempt asks.
    pub fn with_attempt_id(mut self, attempt_id: impl Into<String>) -> Self {
        self.attempt_id = Some(attempt_id.into());
        self
    }
}

/// What a claim (or a resolution) found or made.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// This caller owns run `run` and must apply the effect now, then report
    /// it with `complete`, `fail` or `mark_unknown`.
    Acquired {
        /// The run this caller owns.
        run: FenceToken,
    },
    /// Another caller is applying the effect.
    InProgress {
        /// The run in progress.
        run: FenceToken,
    },
    /// The effect was applied; here is the stored result.
    Succeeded {
        /// The stored result.
        result: Value,
    },
    /// The effect failed for good; here is the stored error.
    Failed {
        /// The stored error.
        error: StoredError,
    },
    /// The effect may or may not have been applied; reconcile before anything else.
    Unknown {
        /// The run whose outcome is unknown.
        run: FenceToken,
    },
}

impl Claim {
    /// The state this claim reports.
    pub fn kind(&self) -> StateKind {
        match self {
            Self::Acquired { .. } | Self::InProgress { .. } => StateKind::Running,
            Self::Succeeded { .. } => StateKind::Succeeded,
            Self::Failed { .. } => StateKind::Failed,
            Self::Unknown { .. } => StateKind::Unknown,
        }
    }
}

/// A [`Claim`] and the transition it made, if any.
///
/// Build it with [`Claimed::read`] or [`Claimed::changed`]; more fields may
/// be added.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Claimed {
    /// What the caller got.
    pub claim: Claim,
    /// The state change the claim caused (`None` when it only read).
    pub transition: Option<Transition>,
}

impl Claimed {
    /// A claim that changed nothing.
    pub fn read(claim: Claim) -> Self {
        Self {
            claim,
            transition: None,
        }
    }

    /// A claim that made `transition`.
    pub fn changed(claim: Claim, transition: Transition) -> Self {
        Self {
            claim,
            transition: Some(transition),
        }
    }
}

/// Errors of an [`ActionStore`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store holds its maximum number of records and none has expired.
    /// Live records (running, unknown, or finished within their time-to-live)
    /// are never evicted to make room: that would let an effect run twice.
    #[error(
        "action store is full ({max_records} live records); refusing to claim new action `{action_id}`"
    )]
    Full {
        /// The action that could not be claimed.
        action_id: ActionId,
        /// The store's bound.
        max_records: usize,
    },
    /// The action id was first claimed for another tool.
    #[error("action `{action_id}` was claimed for tool `{recorded}`, not `{requested}`")]
    ToolMismatch {
        /// The action.
        action_id: ActionId,
        /// The tool on record.
        recorded: String,
        /// The tool of this call.
        requested: String,
    },
    /// The action id was first claimed with other arguments (another
    /// [`ArgumentsDigest`]). The same id must name the same effect: the
    /// call is neither answered with the stored result nor run.
    #[error("action `{action_id}` was claimed with other arguments; refusing to replay or run it")]
    ArgumentsDiffer {
        /// The action.
        action_id: ActionId,
    },
    /// A transition named a run the action is no longer on, or a state it is
    /// no longer in.
    #[error("action `{action_id}` is {found} (run {current}); transition for run {run} refused")]
    Conflict {
        /// The action.
        action_id: ActionId,
        /// The run the transition named.
        run: FenceToken,
        /// The action's current run.
        current: FenceToken,
        /// The action's current state.
        found: StateKind,
    },
    /// A transition named an action the store has no record of.
    #[error("no record of action `{action_id}`")]
    NotFound {
        /// The action.
        action_id: ActionId,
    },
    /// A shared store wrote the change on its primary, but fewer replicas
    /// than configured acknowledged it in time (Redis `WAIT`; see
    /// `RedisActionStore::wait_for_replicas`). Fails closed: after a claim,
    /// the run was given back and no effect ran; the same call may be made
    /// again.
    #[error(
        "action `{action_id}`: {acknowledged} of {wanted} replicas acknowledged the write in time; failing closed"
    )]
    NotReplicated {
        /// The action.
        action_id: ActionId,
        /// How many replicas acknowledged.
        acknowledged: u32,
        /// How many were asked for.
        wanted: u32,
    },
    /// The backend failed (encoding, a script error, ...).
    #[error("action store backend failed: {0}")]
    Backend(#[source] BoxError),
    /// The backend could not be reached (a shared store such as Redis is
    /// down or cut off). Nothing was claimed or stored: the executor fails
    /// closed and runs no effect.
    #[error("action store unavailable: {0}")]
    Unavailable(#[source] BoxError),
}

/// Where actions are claimed and their outcomes stored.
///
/// Every method is one atomic step, so a shared backend (Redis, with one
/// script per method) can implement each with one round trip. Methods return
/// boxed futures so the trait is usable as `Arc<dyn ActionStore>`.
///
/// The transitions:
///
/// | from | `claim` | `complete` / `fail` / `mark_unknown` (same run) | `resolve` (same run) |
/// |---|---|---|---|
/// | no record | → running (run 1), `Acquired` | `NotFound` | `NotFound` |
/// | running | `InProgress`; past its lease → unknown | → succeeded / failed / unknown | read |
/// | succeeded | `Succeeded` (replay) | `Conflict` | read |
/// | failed, retryable | → running (next run), `Acquired` | `Conflict` | read |
/// | failed, final | `Failed` (replay) | `Conflict` | read |
/// | unknown | `Unknown` | `complete`/`fail` accepted (late truth); `mark_unknown` no-op | succeeded → succeeded; not applied → running (next run), `Acquired` |
///
/// Callers trace the [`Transition`]s the methods report; the executor layer does.
pub trait ActionStore: fmt::Debug + Send + Sync + 'static {
    /// Claims the action: only one caller gets [`Claim::Acquired`] for a
    /// fresh (or retryable) action; others see it running, its stored
    /// outcome, or unknown.
    fn claim<'a>(&'a self, request: &'a ClaimRequest)
    -> BoxFuture<'a, Result<Claimed, StoreError>>;

    /// Stores the result of run `run`: running (or unknown) → succeeded.
    fn complete<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
        result: Value,
    ) -> BoxFuture<'a, Result<Transition, StoreError>>;

    /// Stores the error of run `run`: running (or unknown) → failed.
    fn fail<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
        error: StoredError,
        retryable: bool,
    ) -> BoxFuture<'a, Result<Transition, StoreError>>;

    /// Records that run `run` may or may not have applied the effect:
    /// running → unknown.
    fn mark_unknown<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Transition, StoreError>>;

    /// Acts on a reconciler's answer about unknown run `run`:
    /// [`Reconciliation::Succeeded`] stores the result,
    /// [`Reconciliation::NotApplied`] claims the next run for this caller,
    /// [`Reconciliation::StillUnknown`] changes nothing. If the action moved
    /// on meanwhile (another caller resolved it), behaves as
    /// [`claim`](Self::claim) would now.
    fn resolve<'a>(
        &'a self,
        request: &'a ClaimRequest,
        run: FenceToken,
        answer: Reconciliation,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>>;

    /// The action's record, if the store has one.
    fn get<'a>(
        &'a self,
        action_id: &'a ActionId,
    ) -> BoxFuture<'a, Result<Option<ActionRecord>, StoreError>>;

    /// The action's state ([`ActionState::NotStarted`] without a record).
    fn state<'a>(
        &'a self,
        action_id: &'a ActionId,
    ) -> BoxFuture<'a, Result<ActionState, StoreError>> {
        Box::pin(async move {
            Ok(self
                .get(action_id)
                .await?
                .map_or(ActionState::NotStarted, |record| record.state))
        })
    }

    /// Resolves when the action may have left running run `run`, so a waiting
    /// duplicate can claim again. Spurious wake-ups are fine; callers bound
    /// the wait. The default polls every 20 ms; stores that can notify
    /// (the in-memory one, Redis pub/sub) should override it.
    fn changed<'a>(&'a self, action_id: &'a ActionId, run: FenceToken) -> BoxFuture<'a, ()> {
        let _ = (action_id, run);
        Box::pin(tokio::time::sleep(Duration::from_millis(20)))
    }
}

impl<T: ActionStore + ?Sized> ActionStore for std::sync::Arc<T> {
    fn claim<'a>(
        &'a self,
        request: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        (**self).claim(request)
    }
    fn complete<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
        result: Value,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        (**self).complete(action_id, run, attempt_id, result)
    }
    fn fail<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
        error: StoredError,
        retryable: bool,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        (**self).fail(action_id, run, attempt_id, error, retryable)
    }
    fn mark_unknown<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        (**self).mark_unknown(action_id, run, attempt_id)
    }
    fn resolve<'a>(
        &'a self,
        request: &'a ClaimRequest,
        run: FenceToken,
        answer: Reconciliation,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        (**self).resolve(request, run, answer)
    }
    fn get<'a>(
        &'a self,
        action_id: &'a ActionId,
    ) -> BoxFuture<'a, Result<Option<ActionRecord>, StoreError>> {
        (**self).get(action_id)
    }
    fn state<'a>(
        &'a self,
        action_id: &'a ActionId,
    ) -> BoxFuture<'a, Result<ActionState, StoreError>> {
        (**self).state(action_id)
    }
    fn changed<'a>(&'a self, action_id: &'a ActionId, run: FenceToken) -> BoxFuture<'a, ()> {
        (**self).changed(action_id, run)
    }
}
