//! The executor layer's error.

use std::fmt;
use std::time::Duration;

use super::id::ActionId;
use super::state::StoredError;
use super::store::{BoxError, StoreError};

/// Why an action's outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownReason {
    /// The effect did not answer within the layer's effect timeout.
    TimedOut(Duration),
    /// The executor reported an error that leaves the outcome open (see
    /// [`Disposition::Unknown`](super::Disposition::Unknown)).
    EffectError(String),
    /// The action was already unknown and no reconciler is configured.
    NoReconciler,
    /// The reconciler could not tell.
    StillUnknown,
}

impl fmt::Display for UnknownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TimedOut(after) => write!(f, "the effect timed out after {after:?}"),
            Self::EffectError(message) => write!(f, "the executor failed ambiguously: {message}"),
            Self::NoReconciler => f.write_str("no reconciler is configured"),
            Self::StillUnknown => f.write_str("the reconciler could not tell"),
        }
    }
}

/// Errors of the [`ActionExecutor`](super::ActionExecutor).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActionError {
    /// The arguments do not match the tool's JSON Schema; nothing was claimed.
    #[error("invalid arguments for tool `{tool}` at `{path}`: {message}")]
    InvalidArguments {
        /// The tool.
        tool: String,
        /// JSON pointer of the failing field in the arguments (`""` is the root).
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// Schemas are configured but none for this tool; nothing was claimed.
    #[error("no schema for tool `{tool}`; refusing to run it")]
    UnknownTool {
        /// The tool.
        tool: String,
    },
    /// Another caller is applying the effect and did not finish within the
    /// layer's in-progress wait. The effect was not run by this call.
    #[error("action `{action_id}` is in progress elsewhere")]
    InProgress {
        /// The action.
        action_id: ActionId,
    },
    /// The effect may or may not have been applied; the action stays unknown
    /// until reconciled and is not repeated.
    #[error("action `{action_id}` needs reconciliation: {reason}")]
    NeedsReconciliation {
        /// The action.
        action_id: ActionId,
        /// Why it is unknown.
        reason: UnknownReason,
    },
    /// The effect failed; this is the stored error.
    #[error("action `{action_id}` failed ({}): {error}", if *.retryable { "retryable" } else { "final" })]
    Failed {
        /// The action.
        action_id: ActionId,
        /// The stored error.
        error: StoredError,
        /// Whether the next call with this action id runs the effect again.
        retryable: bool,
    },
    /// The reconciler itself failed; the action stays unknown.
    #[error("reconciling action `{action_id}` failed: {source}")]
    Reconcile {
        /// The action.
        action_id: ActionId,
        /// The reconciler's error.
        #[source]
        source: BoxError,
    },
    /// The action store failed or refused the claim.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The executor service failed before it was called (`poll_ready`).
    #[error("executor not ready: {0}")]
    Inner(#[source] BoxError),
}

impl ActionError {
    /// The action this error is about, when it has one.
    pub fn action_id(&self) -> Option<&ActionId> {
        match self {
            Self::InProgress { action_id }
            | Self::NeedsReconciliation { action_id, .. }
            | Self::Failed { action_id, .. }
            | Self::Reconcile { action_id, .. } => Some(action_id),
            Self::Store(
                StoreError::Full { action_id, .. }
                | StoreError::ToolMismatch { action_id, .. }
                | StoreError::ArgumentsDiffer { action_id }
                | StoreError::NotReplicated { action_id, .. }
                | StoreError::Conflict { action_id, .. }
                | StoreError::NotFound { action_id },
            ) => Some(action_id),
            _ => None,
        }
    }

    /// Whether calling again with the same action id may run the effect:
    /// a retryable failure, or an in-progress answer (the other caller may fail).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Failed {
                retryable: true,
                ..
            } | Self::InProgress { .. }
        )
    }

    /// Whether the action store could not be reached, or could not
    /// replicate the claim to the replicas it must
    /// ([`StoreError::NotReplicated`]): nothing ran, and the same call may
    /// be made again once the store is back.
    pub fn is_store_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Store(StoreError::Unavailable(_) | StoreError::NotReplicated { .. })
        )
    }

    /// Whether the action's outcome is unknown (it needs reconciliation).
    pub fn is_unknown(&self) -> bool {
        matches!(
            self,
            Self::NeedsReconciliation { .. } | Self::Reconcile { .. }
        )
    }
}
