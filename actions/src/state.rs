//! Action states, records and the transitions between them.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::digest::ArgumentsDigest;
use super::id::ActionId;

/// Where an action stands, with its stored outcome once it has one.
///
/// Serializable so a shared backend can store it as one value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ActionState {
    /// No record: the effect has not been claimed (or its record expired).
    NotStarted,
    /// A caller claimed the action and is applying the effect.
    Running,
    /// The effect was applied; `result` is replayed to every later call.
    Succeeded {
        /// The stored result.
        result: Value,
    },
    /// The effect failed.
    Failed {
        /// The stored error.
        error: StoredError,
        /// Whether the next call may run the effect again.
        retryable: bool,
    },
    /// The executor may or may not have applied the effect (timeout, lost
    /// result). Only reconciliation moves it on; it is never repeated blindly.
    Unknown,
}

impl ActionState {
    /// The state without its payload.
    pub fn kind(&self) -> StateKind {
        match self {
            Self::NotStarted => StateKind::NotStarted,
            Self::Running => StateKind::Running,
            Self::Succeeded { .. } => StateKind::Succeeded,
            Self::Failed { .. } => StateKind::Failed,
            Self::Unknown => StateKind::Unknown,
        }
    }

    /// Whether the action has a stored outcome (succeeded or failed), which is
    /// what makes its record expire after the store's time-to-live.
    pub fn is_finished(&self) -> bool {
        matches!(self, Self::Succeeded { .. } | Self::Failed { .. })
    }
}

impl fmt::Display for ActionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed {
                retryable: true, ..
            } => f.write_str("failed (retryable)"),
            Self::Failed {
                retryable: false, ..
            } => f.write_str("failed (final)"),
            other => f.write_str(other.kind().as_str()),
        }
    }
}

/// [`ActionState`] without its payload, for traces, metrics and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// See [`ActionState::NotStarted`].
    NotStarted,
    /// See [`ActionState::Running`].
    Running,
    /// See [`ActionState::Succeeded`].
    Succeeded,
    /// See [`ActionState::Failed`].
    Failed,
    /// See [`ActionState::Unknown`].
    Unknown,
}

impl StateKind {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotStarted => "not_started",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for StateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An effect's error as stored and replayed.
///
/// Build it with [`StoredError::new`]; more fields may be added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StoredError {
    /// The error's message, as the executor reported it.
    pub message: String,
}

impl StoredError {
    /// A stored error with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl fmt::Display for StoredError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Which run of an action a caller owns: the store increments it on every
/// claim that starts the effect, and refuses transitions that name another run
/// (a fencing token, so a stale owner cannot overwrite a newer outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FenceToken(u64);

impl FenceToken {
    /// The token for run number `run` (the first run is 1).
    pub const fn new(run: u64) -> Self {
        Self(run)
    }

    /// The run number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The token of the following run.
    pub const fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A stored action, as [`ActionStore::get`](super::ActionStore::get) returns it.
///
/// A store builds one with [`ActionRecord::new`] and
/// [`with_attempts`](ActionRecord::with_attempts); more fields may be added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ActionRecord {
    /// The application's id.
    pub action_id: ActionId,
    /// The tool the action was first claimed for.
    pub tool: String,
    /// Current state and stored outcome.
    pub state: ActionState,
    /// The latest run (how many times the effect was started).
    pub run: FenceToken,
    /// Model attempts that proposed or ran this action, oldest first (capped).
    pub attempts: Vec<String>,
    /// The digest of the arguments the action was first claimed with, if
    /// the claim carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<ArgumentsDigest>,
}

impl ActionRecord {
    /// The record of `action_id`, claimed for `tool`, in `state` on run
    /// `run`, with no attempts listed yet.
    pub fn new(
        action_id: impl Into<ActionId>,
        tool: impl Into<String>,
        state: ActionState,
        run: FenceToken,
    ) -> Self {
        Self {
            action_id: action_id.into(),
            tool: tool.into(),
            state,
            run,
            attempts: Vec::new(),
            arguments: None,
        }
    }

    /// Sets the digest of the arguments the action was claimed with.
    pub fn with_arguments_digest(mut self, arguments: Option<ArgumentsDigest>) -> Self {
        self.arguments = arguments;
        self
    }

    /// Replaces the model attempts that proposed or ran this action
    /// (oldest first).
    pub fn with_attempts<I>(mut self, attempts: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.attempts = attempts.into_iter().map(Into::into).collect();
        self
    }
}

/// One state change of an action, as a store reports it.
///
/// A store builds one with [`Transition::new`]; more fields may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transition {
    /// The state before the change.
    pub before: StateKind,
    /// The state after the change.
    pub after: StateKind,
    /// The run the action is on after the change.
    pub run: FenceToken,
}

impl Transition {
    /// A change from `before` to `after`, leaving the action on run `run`.
    pub const fn new(before: StateKind, after: StateKind, run: FenceToken) -> Self {
        Self { before, after, run }
    }
}
