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
#[derive(Clone)]
pub struct HealthKey {
    provider: Arc<str>,
    pub(super) model: Option<Arc<str>>,
    pub(super) client_named: bool,
    /// The provider and model hashed once, when the key is made: a turn
    /// looks its keys up four or five times. Seeded per process, so that
    /// client-named models cannot be chosen to collide.
    digest: u64,
    /// The same for this key's account key ([`to_account`](Self::to_account)).
    account_digest: u64,
}

/// The provider and model, hashed with a per-process random seed.
fn digest(provider: &str, model: Option<&str>) -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    SEED.get_or_init(foldhash::fast::RandomState::default)
        .hash_one((provider, model))
}

impl fmt::Debug for HealthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthKey")
            .field("provider", &self.provider)
            .field("model", &self.model)
            .field("client_named", &self.client_named)
            .finish_non_exhaustive()
    }
}

impl PartialEq for HealthKey {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest && self.provider == other.provider && self.model == other.model
    }
}

impl Eq for HealthKey {}

impl std::hash::Hash for HealthKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Equal keys have equal digests: the digest is the hash.
        state.write_u64(self.digest);
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
        let (provider, model) = (provider.into(), model.into());
        Self {
            digest: digest(&provider, Some(&model)),
            account_digest: digest(&provider, None),
            provider,
            model: Some(model),
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
        let provider = provider.into();
        let digest = digest(&provider, None);
        Self {
            provider,
            model: None,
            client_named: false,
            digest,
            account_digest: digest,
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
        Self {
            provider: Arc::clone(&self.provider),
            model: None,
            client_named: false,
            digest: self.account_digest,
            account_digest: self.account_digest,
        }
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    use super::HealthKey;

    /// Keys made any way are equal, and hash alike, exactly when their
    /// provider and model are: the digest made with the key stands for
    /// them.
    #[test]
    fn keys_are_equal_and_hash_alike_by_provider_and_model_alone() {
        let hasher = std::collections::hash_map::RandomState::new();
        let same = [
            HealthKey::model("p", "m"),
            HealthKey::client_model("p", String::from("m")),
        ];
        assert_eq!(same[0], same[1]);
        assert_eq!(hasher.hash_one(&same[0]), hasher.hash_one(&same[1]));
        assert_eq!(same[0].to_account(), HealthKey::account("p"));
        assert_eq!(
            hasher.hash_one(same[1].to_account()),
            hasher.hash_one(HealthKey::account("p"))
        );
        for other in [
            HealthKey::model("p", "n"),
            HealthKey::model("q", "m"),
            HealthKey::account("p"),
            // The provider and model do not run together.
            HealthKey::model("pm", ""),
        ] {
            assert_ne!(same[0], other, "{other}");
        }
        let mut map = HashMap::new();
        map.insert(HealthKey::model("p", "m"), 1);
        map.insert(HealthKey::account("p"), 2);
        assert_eq!(map.get(&HealthKey::client_model("p", "m")), Some(&1));
        assert_eq!(map.get(&same[0].to_account()), Some(&2));
        assert_eq!(map.get(&HealthKey::model("p", "n")), None);
    }
}
