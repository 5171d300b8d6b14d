//! Passive health, keyed by what failed and shared by a whole gateway.
//!
//! A failure is charged to the scope its class names (see
//! [`ScopeRules`]): the provider's credential (every model behind it), one
//! upstream model of one provider, or nothing at all when the failure was
//! the request's own. One [`HealthStore`] serves every route and every
//! [`Failover`](super::Failover) of a gateway, so a provider used by two
//! routes has one health state.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::classify::{FailureClass, Note};
use crate::record::log_safe;

/// What a health entry is about: one upstream model of one provider
/// credential, or (with no model) the credential itself.
///
/// The provider is the target's [`provider`](super::Target::provider) name:
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
    model: Option<Arc<str>>,
    client_named: bool,
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
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
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
/// client within the failure window ([`FailureReport::witness`]).
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

/// When a failing key rests, and for how long.
///
/// - **Account scope** cools at once, for the provider's retry hint or
///   `account` (default 5 min).
/// - **Model scope** `ModelNotFound` (a model the operator configured) cools
///   at once like an account failure: it will not fix itself.
/// - **Model scope** with a retry hint (`retry-after`, `retry-after-ms`,
///   Gemini `RetryInfo`) cools at once for the hint.
/// - **Model scope** without a hint cools only once `failure_threshold`
///   failures (default 3) fall inside `failure_window` (default 30 s): one
///   transient failure never cools anything. Timeouts and stream faults
///   count once per client in the window (a client's slow prompts are not
///   the provider's fault; see [`FailureReport::witness`]), every other
///   failure counts each time. The first such cooldown lasts `base`
///   (default 5 s) and each further one in a row doubles it, up to
///   `max_probe_interval` (default 30 s): a recovered provider is probed,
///   and used again, within that long, however long its outage was.
/// - Every cooldown is capped by `max` (default 10 min), hints included:
///   only the provider's own hint or an account failure rests a key past
///   `max_probe_interval`.
///
/// After a cooldown one request probes the key; a success clears it, a
/// failure rests it again (at least `base`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CooldownPolicy {
    /// Cooldown of account-scope failures without a hint.
    pub account: Duration,
    /// Hintless model-scope failures inside the window that start a cooldown.
    pub failure_threshold: u32,
    /// The window those failures are counted in.
    pub failure_window: Duration,
    /// The first model-scope cooldown; doubles for each one in a row.
    pub base: Duration,
    /// The longest cooldown of any kind (hints included).
    pub max: Duration,
    /// The longest rest of a model-scope cooldown without a hint: failed
    /// probes double the rest up to this, no further.
    pub max_probe_interval: Duration,
    /// A probe that has not reported after this long is abandoned, so a
    /// cancelled turn cannot keep a key out forever.
    pub probe_timeout: Duration,
}

impl Default for CooldownPolicy {
    fn default() -> Self {
        Self {
            account: Duration::from_secs(300),
            failure_threshold: 3,
            failure_window: Duration::from_secs(30),
            base: Duration::from_secs(5),
            max: Duration::from_secs(600),
            max_probe_interval: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(30),
        }
    }
}

impl CooldownPolicy {
    /// Sets [`account`](Self::account).
    pub fn account(mut self, cooldown: Duration) -> Self {
        self.account = cooldown;
        self
    }

    /// Sets [`failure_threshold`](Self::failure_threshold) and
    /// [`failure_window`](Self::failure_window).
    pub fn failures_within(mut self, failures: u32, window: Duration) -> Self {
        self.failure_threshold = failures.max(1);
        self.failure_window = window;
        self
    }

    /// Sets [`base`](Self::base).
    pub fn base(mut self, cooldown: Duration) -> Self {
        self.base = cooldown;
        self
    }

    /// Sets [`max`](Self::max).
    pub fn max(mut self, cooldown: Duration) -> Self {
        self.max = cooldown;
        self
    }

    /// Sets [`max_probe_interval`](Self::max_probe_interval).
    pub fn max_probe_interval(mut self, interval: Duration) -> Self {
        self.max_probe_interval = interval;
        self
    }

    /// Sets [`probe_timeout`](Self::probe_timeout).
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// A policy that never cools a model-scope key without a hint.
    pub fn never_repeated(mut self) -> Self {
        self.failure_threshold = u32::MAX;
        self
    }
}

/// Whether a key may take a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// In rotation.
    Healthy,
    /// Resting until this instant.
    Cooling(Instant),
    /// The cooldown is over and no probe is out: the next request probes.
    Probe,
    /// The cooldown is over and a probe is out: wait for its answer.
    Probing,
}

/// A store's answer to [`HealthStore::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Healthy: send.
    Open,
    /// Send as the key's probe; its outcome decides the key's state.
    Probe,
    /// Resting or probed by another request: skip, for now.
    Refused(Availability),
}

/// One failure, as a store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailureReport {
    /// The failure's class.
    pub class: FailureClass,
    /// Where it is charged ([`ScopeRules`]).
    pub scope: Scope,
    /// The provider's retry hint, when it gave one.
    pub retry_after: Option<Duration>,
    /// The request held the probe slot, which it gives back.
    pub was_probe: bool,
    /// The client whose request failed ([`ClientId::witness`]): a timeout
    /// or a stream fault counts toward a cooldown once per client within
    /// the failure window, as it may be the request's doing (a huge prompt,
    /// a long answer) rather than the provider's. `None`, an anonymous
    /// request, counts as a new client each time.
    ///
    /// [`ClientId::witness`]: crate::identity::ClientId::witness
    pub witness: Option<Arc<str>>,
}

impl FailureReport {
    /// A failure of `class` charged to `scope`.
    pub fn new(class: FailureClass, scope: Scope) -> Self {
        Self {
            class,
            scope,
            retry_after: None,
            was_probe: false,
            witness: None,
        }
    }

    /// With the client whose request failed ([`witness`](Self::witness)).
    pub fn witness(mut self, witness: Option<Arc<str>>) -> Self {
        self.witness = witness;
        self
    }

    /// The client this failure counts once for, when its class counts per
    /// client (timeouts and stream faults; the provider's own statements,
    /// such as a status or a reset, count every time).
    pub(crate) fn counted_per_client(&self) -> Option<&Arc<str>> {
        matches!(
            self.class,
            FailureClass::Timeout | FailureClass::InvalidResponse
        )
        .then_some(self.witness.as_ref())
        .flatten()
    }

    /// With the provider's retry hint.
    pub fn retry_after(mut self, after: Option<Duration>) -> Self {
        self.retry_after = after;
        self
    }

    /// Sent as the key's probe.
    pub fn probe(mut self, was_probe: bool) -> Self {
        self.was_probe = was_probe;
        self
    }
}

/// A success, as a store records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SuccessReport {
    /// A stream committed: the key answers (cooldown and probe are over),
    /// but its failure streak ends only when the stream ends whole.
    Committed {
        /// Time to first output.
        ttft: Option<Duration>,
    },
    /// A whole answer arrived (or a committed stream ended whole).
    Whole {
        /// Time to first output, when measured.
        ttft: Option<Duration>,
    },
}

/// The state of one key in a [`HealthSnapshot`] entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyState {
    /// In rotation.
    Healthy,
    /// Resting for this much longer (until about `until`).
    Cooling {
        /// Time left.
        remaining: Duration,
        /// The wall-clock end of the cooldown.
        until: SystemTime,
    },
    /// The cooldown is over; the next request probes.
    Probe,
    /// A probe is out.
    Probing,
}

impl KeyState {
    /// A stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Cooling { .. } => "cooling",
            Self::Probe => "probe",
            Self::Probing => "probing",
        }
    }
}

/// One key of a [`HealthStore::snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthSnapshot {
    /// The key.
    pub key: HealthKey,
    /// Its state now.
    pub state: KeyState,
    /// Failures in a row since the last success.
    pub failure_streak: u32,
    /// Cooldowns in a row since the last success.
    pub cooldowns: u32,
    /// The class of the last failure, if any.
    pub last_class: Option<FailureClass>,
}

/// The health registry of a gateway: one per gateway, shared by every route
/// and [`Failover`](super::Failover).
///
/// Reads are served from a local view. Each state transition (a failure,
/// a cooldown start, a probe claim, a recovery) is one call, so a
/// networked store can make it one atomic round trip; methods are called
/// on the request path and must not block, so such a store applies the
/// transition to its local view at once and ships it in the background.
///
/// [`Availability`] of a model key combines its own state with its
/// account's: a cooling account cools every model behind it.
pub trait HealthStore: Send + Sync + fmt::Debug + 'static {
    /// Whether `key` may take a request now (local read).
    fn availability(&self, key: &HealthKey) -> Availability;

    /// Admits a request to `key` if healthy, or as its probe (decided and
    /// marked in one transition, so two requests never both probe).
    /// `force`: admit as a probe even while the key rests — the turn has
    /// nothing else left to try.
    fn admit(&self, key: &HealthKey, force: bool) -> Admission;

    /// A probe admitted to `key` was abandoned without an outcome.
    fn release_probe(&self, key: &HealthKey);

    /// Records a success.
    fn success(&self, key: &HealthKey, report: SuccessReport);

    /// Records a failure of a request to `key`; returns the cooldown it
    /// started, if any. The failure lands on the key's account for account
    /// scope, on the key for model scope, and nowhere for request scope.
    fn failure(&self, key: &HealthKey, report: FailureReport) -> Option<Duration>;

    /// Smoothed time to first output of `key`'s recent successes.
    fn time_to_first_output(&self, key: &HealthKey) -> Option<Duration>;

    /// Every key the store knows, in key order.
    fn snapshot(&self) -> Vec<HealthSnapshot>;
}

#[derive(Debug, Default, Clone)]
struct Entry {
    cooling_until: Option<Instant>,
    probe_started: Option<Instant>,
    streak: u32,
    cooldowns: u32,
    /// Hintless failures inside the window (at most `failure_threshold`),
    /// each with the client it is counted for (`None`: a client of its own).
    recent: VecDeque<(Instant, Option<Arc<str>>)>,
    last_class: Option<FailureClass>,
    ttft_ewma: Option<Duration>,
    /// The entry's place in the least-recently-used order of client-named
    /// keys; `None` for a key the operator configured (never evicted for
    /// client-named ones).
    lru: Option<u64>,
}

impl Entry {
    fn availability(&self, policy: &CooldownPolicy, now: Instant) -> Availability {
        match self.cooling_until {
            None => Availability::Healthy,
            Some(until) if until > now => Availability::Cooling(until),
            Some(_) => match self.probe_started {
                Some(started) if now.duration_since(started) < policy.probe_timeout => {
                    Availability::Probing
                }
                _ => Availability::Probe,
            },
        }
    }

    fn record_ttft(&mut self, ttft: Option<Duration>) {
        if let Some(ttft) = ttft {
            self.ttft_ewma = Some(match self.ttft_ewma {
                None => ttft,
                Some(old) => (old * 4 + ttft) / 5,
            });
        }
    }

    /// Nothing but defaults (and maybe a latency figure): safe to forget.
    fn is_idle(&self) -> bool {
        self.cooling_until.is_none()
            && self.probe_started.is_none()
            && self.streak == 0
            && self.recent.is_empty()
    }
}

/// The in-memory [`HealthStore`]: the default, for one gateway process.
///
/// Bounded twice:
///
/// - keys of models a client named ([`HealthKey::client_model`]) are kept
///   up to `max_client_named_keys` (default 1,000), the least recently
///   written first out, so a client inventing model names cannot grow the
///   store nor push out a key the operator configured;
/// - past `max_keys` entries in all, idle ones (healthy, no streak) are
///   forgotten first, and a key that still finds no room is treated as
///   healthy rather than growing the map.
#[derive(Debug)]
pub struct MemoryHealthStore {
    entries: Mutex<Entries>,
    policy: CooldownPolicy,
    max_keys: usize,
    max_client_named_keys: usize,
}

/// The entries, and the least-recently-used order of the client-named ones.
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<HealthKey, Entry>,
    /// Client-named keys by their last write (a tick), oldest first.
    lru: BTreeMap<u64, HealthKey>,
    tick: u64,
}

impl Entries {
    fn get(&self, key: &HealthKey) -> Option<&Entry> {
        self.map.get(key)
    }

    fn get_mut(&mut self, key: &HealthKey) -> Option<&mut Entry> {
        self.map.get_mut(key)
    }

    fn contains_key(&self, key: &HealthKey) -> bool {
        self.map.contains_key(key)
    }

    /// Marks `key`'s entry as just written, in the order of client-named
    /// keys; a key the operator configured leaves that order for good.
    fn touch(&mut self, key: &HealthKey) {
        self.tick += 1;
        let tick = self.tick;
        let Some(entry) = self.map.get_mut(key) else {
            return;
        };
        let Some(old) = entry.lru else {
            return;
        };
        let stored = self.lru.remove(&old);
        if key.client_named {
            entry.lru = Some(tick);
            self.lru.insert(tick, stored.unwrap_or_else(|| key.clone()));
        } else {
            entry.lru = None;
        }
    }
}

impl Default for MemoryHealthStore {
    fn default() -> Self {
        Self::new(CooldownPolicy::default())
    }
}

impl MemoryHealthStore {
    /// A store with this cooldown policy, holding up to 10,000 keys, of
    /// which up to 1,000 of models clients named.
    pub fn new(policy: CooldownPolicy) -> Self {
        Self {
            entries: Mutex::new(Entries::default()),
            policy,
            max_keys: 10_000,
            max_client_named_keys: 1_000,
        }
    }

    /// Caps the keys held (at least 16).
    pub fn max_keys(mut self, max: usize) -> Self {
        self.max_keys = max.max(16);
        self
    }

    /// Caps the keys of models clients named (at least 1); past it the
    /// least recently written of them is forgotten.
    pub fn max_client_named_keys(mut self, max: usize) -> Self {
        self.max_client_named_keys = max.max(1);
        self
    }

    /// The cooldown policy.
    pub fn policy(&self) -> &CooldownPolicy {
        &self.policy
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry of `key`, created if there is room, and marked as just
    /// written.
    fn entry<'a>(&self, entries: &'a mut Entries, key: &HealthKey) -> Option<&'a mut Entry> {
        if entries.contains_key(key) {
            entries.touch(key);
            return entries.get_mut(key);
        }
        if key.client_named {
            // Room among the client-named keys: the least recently
            // written goes, whatever its state.
            while entries.lru.len() >= self.max_client_named_keys {
                let Some((_, oldest)) = entries.lru.pop_first() else {
                    break;
                };
                entries.map.remove(&oldest);
            }
        }
        if entries.map.len() >= self.max_keys {
            let Entries { map, lru, .. } = entries;
            map.retain(|_, e| !e.is_idle());
            lru.retain(|_, k| map.contains_key(k));
        }
        if entries.map.len() >= self.max_keys {
            tracing::warn!(key = %log_safe(key), "health store full; key not tracked");
            return None;
        }
        entries.tick += 1;
        let lru = key.client_named.then_some(entries.tick);
        if let Some(tick) = lru {
            entries.lru.insert(tick, key.clone());
        }
        entries.map.insert(
            key.clone(),
            Entry {
                lru,
                ..Entry::default()
            },
        );
        entries.get_mut(key)
    }

    /// The cooldown a failure starts on `entry`, if any.
    fn cooldown(
        &self,
        entry: &mut Entry,
        report: &FailureReport,
        now: Instant,
    ) -> Option<Duration> {
        let policy = &self.policy;
        let cooldown = match (report.scope, report.retry_after) {
            (Scope::Account, hint) => Some(hint.unwrap_or(policy.account)),
            // A configured model the provider does not know stays unknown
            // until the configuration changes.
            (_, hint) if report.class == FailureClass::ModelNotFound => {
                Some(hint.unwrap_or(policy.account))
            }
            (_, Some(hint)) => Some(hint),
            _ => {
                let window_start = now.checked_sub(policy.failure_window);
                entry
                    .recent
                    .retain(|(at, _)| window_start.is_none_or(|start| *at > start));
                // A client already counted in the window adds no count (one
                // client's slow requests are not the provider's outage); its
                // count is only renewed.
                let client = report.counted_per_client();
                if let Some(client) = client {
                    entry.recent.retain(|(_, c)| c.as_ref() != Some(client));
                }
                entry.recent.push_back((now, client.cloned()));
                while entry.recent.len() > policy.failure_threshold as usize {
                    entry.recent.pop_front();
                }
                // Enough failures inside the window, or a failed probe:
                // rest, doubling for each cooldown in a row up to the probe
                // interval, so a recovered provider is found soon.
                if entry.recent.len() >= policy.failure_threshold as usize || report.was_probe {
                    let doublings = entry.cooldowns.min(16);
                    Some(
                        policy
                            .base
                            .saturating_mul(1 << doublings)
                            .min(policy.max_probe_interval),
                    )
                } else {
                    None
                }
            }
        };
        cooldown.map(|c| c.min(policy.max))
    }
}

/// The part of a key's state a fleet of gateways shares, as a shared
/// store ships it between replicas: durations are relative to the moment
/// the state was read, so the clocks of the replicas need not agree.
#[cfg(feature = "redis")]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SharedState {
    /// `Some`: a cooldown was started; it ends after this long (zero: it
    /// is over and the next request probes).
    pub(crate) cooling_left: Option<Duration>,
    /// `Some`: a probe is out for this much longer.
    pub(crate) probe_left: Option<Duration>,
    pub(crate) streak: u32,
    pub(crate) cooldowns: u32,
    pub(crate) last_class: Option<FailureClass>,
}

#[cfg(feature = "redis")]
impl MemoryHealthStore {
    /// Whether `key` or its account holds anything but defaults: a success
    /// on a key without state changes nothing a fleet shares.
    pub(crate) fn has_state(&self, key: &HealthKey) -> bool {
        let map = self.lock();
        let busy = |k: &HealthKey| map.get(k).is_some_and(|e| !e.is_idle());
        busy(key) || (key.model.is_some() && busy(&key.to_account()))
    }

    /// Whether the account of `key` and `key` itself have a probe out.
    pub(crate) fn probing(&self, key: &HealthKey) -> (bool, bool) {
        let map = self.lock();
        let out = |k: &HealthKey| map.get(k).is_some_and(|e| e.probe_started.is_some());
        match key.model {
            Some(_) => (out(&key.to_account()), out(key)),
            None => (out(key), false),
        }
    }

    /// Takes the fleet's state of `key` into the local view (the latency
    /// figure and the local failure window stay local).
    pub(crate) fn adopt(&self, key: &HealthKey, shared: &SharedState) {
        let now = Instant::now();
        let mut map = self.lock();
        let idle =
            shared.cooling_left.is_none() && shared.probe_left.is_none() && shared.streak == 0;
        if idle && !map.contains_key(key) {
            return;
        }
        let probe_timeout = self.policy.probe_timeout;
        let Some(entry) = self.entry(&mut map, key) else {
            return;
        };
        entry.cooling_until = shared.cooling_left.map(|left| super::later(now, left));
        // A probe out for `left` more started `probe_timeout - left` ago.
        entry.probe_started = shared.probe_left.map(|left| {
            let age = probe_timeout.saturating_sub(left);
            now.checked_sub(age).unwrap_or(now)
        });
        entry.streak = shared.streak;
        entry.cooldowns = shared.cooldowns;
        entry.last_class = shared.last_class.or(entry.last_class);
        if shared.cooling_left.is_some() || shared.streak == 0 {
            entry.recent.clear();
        }
    }
}

impl HealthStore for MemoryHealthStore {
    fn availability(&self, key: &HealthKey) -> Availability {
        let now = Instant::now();
        let map = self.lock();
        let of = |k: &HealthKey| {
            map.get(k)
                .map_or(Availability::Healthy, |e| e.availability(&self.policy, now))
        };
        let own = of(key);
        if key.model.is_none() {
            return own;
        }
        combine(of(&key.to_account()), own)
    }

    fn admit(&self, key: &HealthKey, force: bool) -> Admission {
        let now = Instant::now();
        let account = key.to_account();
        let mut map = self.lock();
        let mut probe_keys: [Option<&HealthKey>; 2] = [None, None];
        for (slot, k) in [&account, key].into_iter().enumerate() {
            if slot == 0 && key.model.is_none() {
                continue;
            }
            let availability = map
                .get(k)
                .map_or(Availability::Healthy, |e| e.availability(&self.policy, now));
            match availability {
                Availability::Healthy => {}
                Availability::Probe => probe_keys[slot] = Some(k),
                Availability::Cooling(_) | Availability::Probing if force => {
                    probe_keys[slot] = Some(k)
                }
                refused => return Admission::Refused(refused),
            }
        }
        if probe_keys.iter().all(Option::is_none) {
            return Admission::Open;
        }
        // A forced probe leaves the cooldown as it is: if the probe is never
        // sent (a refused budget, a cancelled turn) nobody else is let in.
        for k in probe_keys.into_iter().flatten() {
            if let Some(entry) = map.get_mut(k) {
                entry.probe_started = Some(now);
            }
        }
        Admission::Probe
    }

    fn release_probe(&self, key: &HealthKey) {
        let mut map = self.lock();
        for k in [key.to_account(), key.clone()] {
            if let Some(entry) = map.get_mut(&k) {
                entry.probe_started = None;
            }
        }
    }

    fn success(&self, key: &HealthKey, report: SuccessReport) {
        let mut map = self.lock();
        let (ttft, whole) = match report {
            SuccessReport::Committed { ttft } => (ttft, false),
            SuccessReport::Whole { ttft } => (ttft, true),
        };
        if key.model.is_some()
            && let Some(account) = map.get_mut(&key.to_account())
        {
            if account.cooling_until.is_some() {
                tracing::info!(key = %log_safe(key.to_account()), "account recovered; back in rotation");
            }
            account.cooling_until = None;
            account.probe_started = None;
            if whole {
                account.streak = 0;
                account.cooldowns = 0;
            }
        }
        // A success with nothing to clear or measure needs no entry.
        if ttft.is_none() && map.get(key).is_none_or(Entry::is_idle) {
            return;
        }
        let Some(entry) = self.entry(&mut map, key) else {
            return;
        };
        if entry.cooling_until.is_some() {
            tracing::info!(key = %log_safe(key), "target recovered; back in rotation");
        }
        entry.cooling_until = None;
        entry.probe_started = None;
        entry.record_ttft(ttft);
        if whole {
            entry.streak = 0;
            entry.cooldowns = 0;
            entry.recent.clear();
        }
    }

    fn failure(&self, key: &HealthKey, report: FailureReport) -> Option<Duration> {
        let now = Instant::now();
        let mut map = self.lock();
        if report.was_probe {
            for k in [key.to_account(), key.clone()] {
                if let Some(entry) = map.get_mut(&k) {
                    entry.probe_started = None;
                }
            }
        }
        let charged = match report.scope {
            Scope::Request => return None,
            Scope::Account => key.to_account(),
            Scope::Model => key.clone(),
        };
        let entry = self.entry(&mut map, &charged)?;
        entry.streak = entry.streak.saturating_add(1);
        entry.last_class = Some(report.class);
        let cooldown = self.cooldown(entry, &report, now);
        if let Some(cooldown) = cooldown {
            let until = super::later(now, cooldown);
            match entry.cooling_until {
                // A failure while the key rests (a request that was in
                // flight, or a turn's forced probe) may lengthen the rest,
                // never shorten it; only a failed probe counts as another
                // cooldown in a row.
                Some(current) if current > now => {
                    entry.cooling_until = Some(current.max(until));
                    if report.was_probe {
                        entry.cooldowns = entry.cooldowns.saturating_add(1);
                    }
                }
                _ => {
                    entry.cooling_until = Some(until);
                    entry.cooldowns = entry.cooldowns.saturating_add(1);
                }
            }
            entry.recent.clear();
            tracing::warn!(
                key = %log_safe(&charged),
                scope = %report.scope,
                class = %report.class,
                cooldown_ms = cooldown.as_millis() as u64,
                "cooling down"
            );
        }
        cooldown
    }

    fn time_to_first_output(&self, key: &HealthKey) -> Option<Duration> {
        self.lock().get(key).and_then(|e| e.ttft_ewma)
    }

    fn snapshot(&self) -> Vec<HealthSnapshot> {
        let now = Instant::now();
        let wall = SystemTime::now();
        let map = self.lock();
        let mut entries: Vec<HealthSnapshot> = map
            .map
            .iter()
            .map(|(key, e)| HealthSnapshot {
                key: key.clone(),
                state: match e.availability(&self.policy, now) {
                    Availability::Healthy => KeyState::Healthy,
                    Availability::Cooling(until) => {
                        let remaining = until.saturating_duration_since(now);
                        KeyState::Cooling {
                            remaining,
                            until: wall.checked_add(remaining).unwrap_or(wall),
                        }
                    }
                    Availability::Probe => KeyState::Probe,
                    Availability::Probing => KeyState::Probing,
                },
                failure_streak: e.streak,
                cooldowns: e.cooldowns,
                last_class: e.last_class,
            })
            .collect();
        drop(map);
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        entries
    }
}

/// The stricter of an account's and a model's availability.
fn combine(account: Availability, model: Availability) -> Availability {
    use Availability::*;
    match (account, model) {
        (Cooling(a), Cooling(m)) => Cooling(a.max(m)),
        (Cooling(a), _) => Cooling(a),
        (_, Cooling(m)) => Cooling(m),
        (Probing, _) | (_, Probing) => Probing,
        (Probe, _) | (_, Probe) => Probe,
        (Healthy, Healthy) => Healthy,
    }
}

/// A request's admission to a key. When it was admitted as the probe and is
/// dropped without reporting (a refused budget, a cancelled turn), the
/// probe slot is given back so the key is not left out.
pub(crate) struct Admitted {
    store: Arc<dyn HealthStore>,
    key: HealthKey,
    probe: bool,
}

impl fmt::Debug for Admitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admitted")
            .field("key", &self.key)
            .field("probe", &self.probe)
            .finish()
    }
}

impl Admitted {
    /// Admits a request to `key`, or says why not.
    pub(crate) fn new(
        store: &Arc<dyn HealthStore>,
        key: HealthKey,
        force: bool,
    ) -> Result<Self, Availability> {
        let probe = match store.admit(&key, force) {
            Admission::Open => false,
            Admission::Probe => true,
            Admission::Refused(availability) => return Err(availability),
        };
        Ok(Self {
            store: Arc::clone(store),
            key,
            probe,
        })
    }

    /// The attempt's whole answer arrived.
    pub(crate) fn success(mut self, ttft: Option<Duration>) {
        self.probe = false;
        self.store.success(&self.key, SuccessReport::Whole { ttft });
    }

    /// The attempt's stream committed.
    pub(crate) fn committed(mut self, ttft: Option<Duration>) {
        self.probe = false;
        self.store
            .success(&self.key, SuccessReport::Committed { ttft });
    }

    /// The attempt failed; returns the cooldown it started, if any.
    pub(crate) fn failure(mut self, report: FailureReport) -> Option<Duration> {
        let was_probe = std::mem::take(&mut self.probe);
        self.store.failure(&self.key, report.probe(was_probe))
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if self.probe {
            self.store.release_probe(&self.key);
        }
    }
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    fn rests(after: u64, scope: Scope) -> FailureReport {
        FailureReport::new(FailureClass::RateLimited, scope)
            .retry_after(Some(Duration::from_secs(after)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_has_state_to_ship_when_it_or_its_account_rests() {
        let model = HealthKey::model("p", "m");
        let store = MemoryHealthStore::default();
        assert!(
            !store.has_state(&model),
            "nothing known: a success ships nothing"
        );
        store.failure(&model, rests(60, Scope::Model));
        assert!(
            store.has_state(&model),
            "the model rests, its account does not"
        );

        let store = MemoryHealthStore::default();
        store.failure(&model, rests(60, Scope::Account));
        assert!(store.has_state(&model), "its account rests");
        assert!(
            !store.has_state(&HealthKey::model("q", "m")),
            "another provider"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_fleet_state_with_anything_in_it_is_adopted_for_a_key_never_seen_here() {
        let store = MemoryHealthStore::default();
        // Each field alone makes a state worth keeping.
        let cooled = HealthKey::model("p", "cooled");
        store.adopt(
            &cooled,
            &SharedState {
                cooling_left: Some(Duration::from_secs(60)),
                ..SharedState::default()
            },
        );
        assert!(
            matches!(store.availability(&cooled), Availability::Cooling(_)),
            "{:?}",
            store.availability(&cooled)
        );
        let failing = HealthKey::model("p", "failing");
        store.adopt(
            &failing,
            &SharedState {
                streak: 2,
                ..SharedState::default()
            },
        );
        // Nothing but defaults: no entry is made for it.
        let idle = HealthKey::model("p", "idle");
        store.adopt(&idle, &SharedState::default());
        let streaks: Vec<_> = store
            .snapshot()
            .into_iter()
            .map(|e| (e.key.upstream_model().unwrap().to_owned(), e.failure_streak))
            .collect();
        assert_eq!(
            streaks,
            [("cooled".to_owned(), 0), ("failing".to_owned(), 2)]
        );
    }
}
