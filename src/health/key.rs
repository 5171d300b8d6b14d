//! What a health entry is about, and which failures count against it.

use std::fmt;
use std::sync::Arc;

use crate::FailureClass;
use crate::classify::Note;

/// What a health entry is about: one upstream model of one provider
/// credential, or (with no model) the credential itself.
///
/// The provider is the target's [`provider`](crate::failover::Target::provider) name:
/// one provider name stands for one credential.
///
/// A key made by [`client_model`](Self::client_model) is marked as naming a
/// model the client chose (a pass-through target): stores keep only so many
/// of those, least recently used first out, so a client inventing model
/// names cannot grow them. The mark is not part of the key's identity: two
/// keys of the same provider and model are equal whoever named the model.
#[derive(Debug, Clone)]
pub struct HealthKey {
    provider: Arc<str>,
    pub(super) model: Option<Arc<str>>,
    pub(super) client_named: bool,
}

impl PartialEq for HealthKey {
    fn eq(&self, other: &Self) -> bool {
        self.provider == other.provider && self.model == other.model
    }
}

impl Eq for HealthKey {}

impl std::hash::Hash for HealthKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.provider.hash(state);
        self.model.hash(state);
    }
}

impl PartialOrd for HealthKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for HealthKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.provider, &self.model).cmp(&(&other.provider, &other.model))
    }
}

impl HealthKey {
    /// The key of `model` as served by `provider`, a model the operator
    /// configured.
    pub fn model(provider: impl Into<Arc<str>>, model: impl Into<Arc<str>>) -> Self {
        Self {
            provider: provider.into(),
            model: Some(model.into()),
            client_named: false,
        }
    }

    /// The key of `model` as served by `provider`, a model the client named
    /// (sent upstream by a pass-through target).
    pub fn client_model(provider: impl Into<Arc<str>>, model: impl Into<Arc<str>>) -> Self {
        Self {
            client_named: true,
            ..Self::model(provider, model)
        }
    }

    /// The key of `provider`'s credential: account-scope failures land here.
    pub fn account(provider: impl Into<Arc<str>>) -> Self {
        Self {
            provider: provider.into(),
            model: None,
            client_named: false,
        }
    }

    /// Whether the model is one a client named rather than the operator.
    pub fn is_client_named(&self) -> bool {
        self.client_named
    }

    /// The provider (credential) name.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The upstream model; `None` for the account key.
    pub fn upstream_model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The account key of this key's provider.
    pub fn to_account(&self) -> Self {
        Self::account(Arc::clone(&self.provider))
    }

    /// The scope this key stands for.
    pub fn scope(&self) -> Scope {
        if self.model.is_some() {
            Scope::Model
        } else {
            Scope::Account
        }
    }
}

impl fmt::Display for HealthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.model {
            Some(model) => write!(f, "{}/{model}", self.provider),
            None => write!(f, "{}/*", self.provider),
        }
    }
}

/// How far a failure reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// Every model behind the provider's credential.
    Account,
    /// That (provider, upstream model) only.
    Model,
    /// Nothing: the failure was the request's own.
    Request,
}

impl Scope {
    /// A stable snake_case name (what `Display` writes).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Account => "account",
            Self::Model => "model",
            Self::Request => "request",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which [`Scope`] each failure is charged to: a failure cools a provider
/// only for what it says about the provider.
///
/// | scope | failures |
/// |---|---|
/// | account | `QuotaExhausted` (quota, billing), `Auth`, `PermissionDenied` — of a model the operator configured |
/// | model | `RateLimited`, `Overloaded`, `ServerError`, `Timeout`, `Connect`, `InvalidResponse` (stream faults), `ModelNotFound` for a model the **operator** configured (a configuration fault, logged as an error), and a per-model quota (Gemini's `…PerModel…` quota ids) or `PermissionDenied` (403) for a model the **client** named |
/// | request | `InvalidRequest`, `ContentFiltered`, `ContextLengthExceeded`, `PayloadTooLarge`, `Cancelled`, `Shutdown`, `ModelNotFound` for a model the **client** named, a `Timeout` the turn's own deadline caused, and an answer over the gateway's own size caps |
///
/// A model name chosen by a client can never cool down anything but itself:
/// a pass-through target's `model_not_found` is the client's error and goes
/// back to it, and its per-model quota or 403 cools that model, not the
/// credential. Override any class with [`ScopeRules::set`]; a failure the
/// gateway's own limits made (the turn's deadline, a size cap) stays at
/// request scope whatever the overrides, as it says nothing of the
/// provider.
///
/// Timeouts and stream faults at model scope are further counted once per
/// client within the failure window (the report's witness).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeRules {
    overrides: Vec<(FailureClass, Scope)>,
}

impl ScopeRules {
    /// The default table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Charges `class` to `scope`, whoever named the model.
    pub fn set(mut self, class: FailureClass, scope: Scope) -> Self {
        self.overrides.retain(|(c, _)| *c != class);
        self.overrides.push((class, scope));
        self
    }

    /// The scope of a failure of `class`. `note` is how it was reached
    /// ([`Classification::note`](crate::classify::Classification::note)),
    /// which says whose it was: [`Note::TurnDeadline`] (the turn's own
    /// deadline limited the wait), [`Note::Oversize`] (a size cap of ours),
    /// [`Note::PerModelQuota`] (the provider's quota is one model's).
    /// `client_named_model`: the upstream model is the one the client asked
    /// for (a pass-through target), not one the operator configured.
    pub fn scope(
        &self,
        class: FailureClass,
        note: Option<Note>,
        client_named_model: bool,
    ) -> Scope {
        use FailureClass::*;
        match (class, note) {
            // Our own limits: the turn ran out of time, or the answer
            // outgrew a cap of ours. Nothing about the provider.
            (Timeout, Some(Note::TurnDeadline)) | (InvalidResponse, Some(Note::Oversize)) => {
                return Scope::Request;
            }
            _ => {}
        }
        if let Some((_, scope)) = self.overrides.iter().find(|(c, _)| *c == class) {
            return *scope;
        }
        let per_model_quota = note == Some(Note::PerModelQuota);
        match class {
            // A client's model: its quota or its refusal is that model's,
            // never the whole credential's.
            QuotaExhausted if client_named_model && per_model_quota => Scope::Model,
            PermissionDenied if client_named_model => Scope::Model,
            QuotaExhausted | Auth | PermissionDenied => Scope::Account,
            ModelNotFound if client_named_model => Scope::Request,
            ModelNotFound | RateLimited | Overloaded | ServerError | Timeout | Connect
            | InvalidResponse => Scope::Model,
            _ => Scope::Request,
        }
    }
}
