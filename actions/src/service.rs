//! `ActionExecutor`: the idempotent executor service.

use std::sync::Arc;
use std::task::{Context, Poll};

use serde_json::Value;
use tokio::time::Instant;
use tower_service::Service;

use super::digest::ArgumentsDigest;
use super::disposition::{ClassifyEffectError, Disposition, FinalOnError};
use super::error::{ActionError, UnknownReason};
use super::future::ResponseFuture;
use super::id::{ActionId, ToolCall};
use super::layer::{ActionExecutorLayer, Config};
use super::reconcile::Reconciliation;
use super::state::{FenceToken, StoredError, Transition};
use super::store::{ActionStore, BoxError, Claim, ClaimRequest, Claimed};
use crate::telemetry::{attr, metric};
// Saturating time arithmetic, so a configured `Duration::MAX` never panics.
use crate::time::later;

/// How many times one call may consult the reconciler: a second unknown
/// after a resolution means another caller's run is unknown too; stop there.
const MAX_RECONCILIATIONS: usize = 2;

/// Runs an effect-performing service `S` at most once per action id; built by
/// [`ActionExecutorLayer`]. See the [crate docs](crate).
#[derive(Clone)]
pub struct ActionExecutor<S, C = FinalOnError> {
    inner: S,
    config: Arc<Config>,
    classify: C,
}

impl<S: std::fmt::Debug, C> std::fmt::Debug for ActionExecutor<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActionExecutor")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .field("classify", &std::any::type_name::<C>())
            .finish()
    }
}

impl<S, C> ActionExecutor<S, C> {
    pub(crate) fn new(inner: S, config: Arc<Config>, classify: C) -> Self {
        Self {
            inner,
            config,
            classify,
        }
    }

    /// A layer recording actions in `store`; shorthand for
    /// [`ActionExecutorLayer::new`].
    pub fn layer(store: Arc<dyn ActionStore>) -> ActionExecutorLayer {
        ActionExecutorLayer::new(store)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, C> Service<ToolCall> for ActionExecutor<S, C>
where
    S: Service<ToolCall, Response = Value> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    C: ClassifyEffectError<S::Error> + Clone + Send + Sync + 'static,
{
    type Response = Value;
    type Error = ActionError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| ActionError::Inner(e.into()))
    }

    fn call(&mut self, call: ToolCall) -> Self::Future {
        // The service polled ready is the one that runs the effect.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        let classify = self.classify.clone();
        ResponseFuture::new(Box::pin(execute(config, inner, classify, call)))
    }
}

async fn execute<S, C>(
    config: Arc<Config>,
    inner: S,
    classify: C,
    call: ToolCall,
) -> Result<Value, ActionError>
where
    S: Service<ToolCall, Response = Value> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    C: ClassifyEffectError<S::Error> + Send + Sync + 'static,
{
    // Before any claim: a call that can never be valid must leave no record.
    if let Some(schemas) = &config.schemas {
        schemas.validate(&call)?;
    }
    let request = ClaimRequest {
        action_id: call.action_id.clone(),
        attempt_id: call.attempt_id.clone(),
        tool: call.tool.clone(),
        lease: config.lease(),
        // The same id with other arguments is another effect: refused.
        arguments: Some(ArgumentsDigest::of(&call.arguments)),
    };
    let store = &*config.store;
    let wait_until = later(Instant::now(), config.in_progress_wait);
    let mut reconciliations = 0;
    let mut claimed = store.claim(&request).await?;
    let mut cause = "claim";
    loop {
        trace_claim(&request, &claimed, cause);
        match claimed.claim {
            Claim::Acquired { run } => {
                return run_effect(&config, inner, &classify, call, &request, run).await;
            }
            Claim::Succeeded { result } => {
                if claimed.transition.is_none() {
                    count_replay("succeeded");
                }
                return Ok(result);
            }
            Claim::Failed { error } => {
                if claimed.transition.is_none() {
                    count_replay("failed");
                }
                return Err(ActionError::Failed {
                    action_id: request.action_id,
                    error,
                    retryable: false,
                });
            }
            Claim::InProgress { run } => {
                if Instant::now() >= wait_until {
                    return Err(ActionError::InProgress {
                        action_id: request.action_id,
                    });
                }
                let _ = tokio::time::timeout_at(wait_until, store.changed(&request.action_id, run))
                    .await;
                claimed = store.claim(&request).await?;
                cause = "claim";
            }
            Claim::Unknown { run } => {
                let Some(reconciler) = &config.reconciler else {
                    return Err(needs_reconciliation(
                        request.action_id,
                        UnknownReason::NoReconciler,
                    ));
                };
                if reconciliations >= MAX_RECONCILIATIONS {
                    return Err(needs_reconciliation(
                        request.action_id,
                        UnknownReason::StillUnknown,
                    ));
                }
                reconciliations += 1;
                let answer = match reconciler.reconcile(&call).await {
                    Ok(answer) => answer,
                    Err(source) => {
                        count_reconciliation("error");
                        return Err(ActionError::Reconcile {
                            action_id: request.action_id,
                            source,
                        });
                    }
                };
                count_reconciliation(reconciliation_name(&answer));
                tracing::info!(
                    action_id = %Escaped(request.action_id.as_str()),
                    tenant = %Escaped(request.action_id.tenant().unwrap_or("")),
                    attempt_id = %Escaped(request.attempt_id.as_deref().unwrap_or("")),
                    run = run.get(),
                    answer = reconciliation_name(&answer),
                    "action reconciled"
                );
                if answer == Reconciliation::StillUnknown {
                    return Err(needs_reconciliation(
                        request.action_id,
                        UnknownReason::StillUnknown,
                    ));
                }
                claimed = store.resolve(&request, run, answer).await?;
                cause = "reconcile";
            }
        }
    }
}

/// Runs the effect for the claimed run `run` and stores its outcome.
///
/// Whatever the store says afterwards, the caller gets what the effect did:
/// a store failure here is logged, and the record converges through the
/// claim's lease (running past its lease turns unknown).
async fn run_effect<S, C>(
    config: &Config,
    mut inner: S,
    classify: &C,
    call: ToolCall,
    request: &ClaimRequest,
    run: FenceToken,
) -> Result<Value, ActionError>
where
    S: Service<ToolCall, Response = Value>,
    S::Error: Into<BoxError>,
    C: ClassifyEffectError<S::Error>,
{
    let store = &*config.store;
    let action_id = &request.action_id;
    let attempt_id = request.attempt_id.as_deref();
    let mut guard = RunGuard {
        store: Arc::clone(&config.store),
        request: Some(request.clone()),
        run,
    };
    // Settle the executor's error inside this block: it need not be `Send`,
    // so it must not live across the store's awaits below.
    let outcome = match tokio::time::timeout(config.effect_timeout, inner.call(call)).await {
        Ok(Ok(result)) => Effect::Applied(result),
        Ok(Err(error)) => settle(classify, error),
        Err(_elapsed) => Effect::TimedOut,
    };
    guard.disarm();
    match outcome {
        Effect::Applied(result) => {
            let stored = store
                .complete(action_id, run, attempt_id, result.clone())
                .await;
            report(request, stored, "complete");
            Ok(result)
        }
        Effect::Failed { error, retryable } => {
            let stored = store
                .fail(action_id, run, attempt_id, error.clone(), retryable)
                .await;
            report(request, stored, "fail");
            Err(ActionError::Failed {
                action_id: action_id.clone(),
                error,
                retryable,
            })
        }
        Effect::Ambiguous(message) => {
            let stored = store.mark_unknown(action_id, run, attempt_id).await;
            report(request, stored, "effect_error");
            Err(needs_reconciliation(
                action_id.clone(),
                UnknownReason::EffectError(message),
            ))
        }
        Effect::TimedOut => {
            let stored = store.mark_unknown(action_id, run, attempt_id).await;
            report(request, stored, "timeout");
            Err(needs_reconciliation(
                action_id.clone(),
                UnknownReason::TimedOut(config.effect_timeout),
            ))
        }
    }
}

/// What one run of the effect came to.
enum Effect {
    Applied(Value),
    Failed { error: StoredError, retryable: bool },
    Ambiguous(String),
    TimedOut,
}

fn settle<E, C>(classify: &C, error: E) -> Effect
where
    E: Into<BoxError>,
    C: ClassifyEffectError<E>,
{
    let disposition = classify.classify(&error);
    let message = Into::<BoxError>::into(error).to_string();
    match disposition {
        Disposition::Retryable => Effect::Failed {
            error: StoredError::new(message),
            retryable: true,
        },
        Disposition::Final => Effect::Failed {
            error: StoredError::new(message),
            retryable: false,
        },
        Disposition::Unknown => Effect::Ambiguous(message),
    }
}

fn needs_reconciliation(action_id: ActionId, reason: UnknownReason) -> ActionError {
    ActionError::NeedsReconciliation { action_id, reason }
}

fn reconciliation_name(answer: &Reconciliation) -> &'static str {
    match answer {
        Reconciliation::Succeeded(_) => "succeeded",
        Reconciliation::NotApplied => "not_applied",
        Reconciliation::StillUnknown => "still_unknown",
    }
}

fn trace_claim(request: &ClaimRequest, claimed: &Claimed, cause: &'static str) {
    match &claimed.transition {
        Some(transition) => trace_transition(request, transition, cause),
        None => tracing::debug!(
            action_id = %Escaped(request.action_id.as_str()),
            tenant = %Escaped(request.action_id.tenant().unwrap_or("")),
            attempt_id = %Escaped(request.attempt_id.as_deref().unwrap_or("")),
            tool = %Escaped(&request.tool),
            state = claimed.claim.kind().as_str(),
            cause,
            "action answered from store"
        ),
    }
}

/// Every state change of an action is one event with its id, the attempt,
/// and the states before and after.
fn trace_transition(request: &ClaimRequest, transition: &Transition, cause: &'static str) {
    tracing::info!(
        action_id = %Escaped(request.action_id.as_str()),
        tenant = %Escaped(request.action_id.tenant().unwrap_or("")),
        attempt_id = %Escaped(request.attempt_id.as_deref().unwrap_or("")),
        tool = %Escaped(&request.tool),
        run = transition.run.get(),
        before = transition.before.as_str(),
        after = transition.after.as_str(),
        cause,
        "action transition"
    );
    metrics::counter!(
        metric::ACTIONS,
        attr::FAILOVER_ACTION_STATE => transition.after.as_str(),
        attr::FAILOVER_ACTION_CAUSE => cause,
    )
    .increment(1);
}

/// A call answered from the stored record, the effect not run.
fn count_replay(state: &'static str) {
    metrics::counter!(metric::ACTION_REPLAYS, attr::FAILOVER_ACTION_STATE => state).increment(1);
}

fn count_reconciliation(answer: &'static str) {
    metrics::counter!(
        metric::ACTION_RECONCILIATIONS,
        attr::FAILOVER_ACTION_ANSWER => answer,
    )
    .increment(1);
}

fn report(
    request: &ClaimRequest,
    stored: Result<Transition, super::StoreError>,
    cause: &'static str,
) {
    match stored {
        Ok(transition) => trace_transition(request, &transition, cause),
        Err(error) => tracing::error!(
            action_id = %Escaped(request.action_id.as_str()),
            tenant = %Escaped(request.action_id.tenant().unwrap_or("")),
            attempt_id = %Escaped(request.attempt_id.as_deref().unwrap_or("")),
            tool = %Escaped(&request.tool),
            cause,
            %error,
            "action outcome could not be stored; the record turns unknown when its lease ends"
        ),
    }
}

/// Marks the run unknown if the effect's future is dropped before it
/// answered (the caller went away): the effect may be applied by then.
struct RunGuard {
    store: Arc<dyn ActionStore>,
    request: Option<ClaimRequest>,
    run: FenceToken,
}

impl RunGuard {
    fn disarm(&mut self) {
        self.request = None;
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        let store = Arc::clone(&self.store);
        let run = self.run;
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let stored = store
                        .mark_unknown(&request.action_id, run, request.attempt_id.as_deref())
                        .await;
                    report(&request, stored, "dropped");
                });
            }
            Err(_) => tracing::warn!(
                action_id = %Escaped(request.action_id.as_str()),
                tenant = %Escaped(request.action_id.tenant().unwrap_or("")),
                "effect dropped outside a runtime; the record turns unknown when its lease ends"
            ),
        }
    }
}

/// An application-chosen value (an id, a tool name) made safe for one log
/// line: control characters, quotes and backslashes escaped as
/// [`char::escape_debug`] does, so it cannot forge a line. (The same rule
/// as `observe::log_safe`; kept here, since `action` imports nothing of the
/// rest of the crate but the telemetry names.)
struct Escaped<'a>(&'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        self.0
            .chars()
            .flat_map(char::escape_debug)
            .try_for_each(|c| f.write_char(c))
    }
}
