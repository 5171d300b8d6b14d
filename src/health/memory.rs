//! The in-memory store: one process's view, and the local view a shared
//! backend keeps beside its shared state.

use super::{
    Admission, Availability, CooldownPolicy, FailureReport, HealthKey, HealthSnapshot, HealthStore,
    KeyState, Scope, SuccessReport,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::FailureClass;
use crate::util::log_safe;

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
    /// [`availability`](Self::availability) with the clock read only for
    /// a key that cooled (once for all the keys sharing `now`): a healthy
    /// key, the usual one, is admitted without a clock read.
    fn availability_lazily(
        &self,
        policy: &CooldownPolicy,
        now: &mut Option<Instant>,
    ) -> Availability {
        if self.cooling_until.is_none() {
            return Availability::Healthy;
        }
        self.availability(policy, *now.get_or_insert_with(Instant::now))
    }

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
    // foldhash, not SipHash: every turn looks keys up three or four times
    // (2 µs of a small completion with SipHash); its per-process random
    // seed still keeps client-named model names from being chosen to
    // collide, and client-named keys are capped besides.
    map: HashMap<HealthKey, Entry, foldhash::fast::RandomState>,
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
    /// Says whether there is an entry.
    fn touch(&mut self, key: &HealthKey) -> bool {
        let Entries { map, lru, tick } = self;
        let Some(entry) = map.get_mut(key) else {
            return false;
        };
        mark(entry, key, lru, tick);
        true
    }
}

/// A success clears `entry`'s cooldown and probe; a whole answer also
/// its streak of failures.
fn succeeded(entry: &mut Entry, key: &HealthKey, ttft: Option<Duration>, whole: bool) {
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

/// Marks `entry` (of `key`) as just written in the order `lru` of
/// client-named keys, whose newest position is `tick`.
fn mark(entry: &mut Entry, key: &HealthKey, lru: &mut BTreeMap<u64, HealthKey>, tick: &mut u64) {
    let Some(old) = entry.lru else {
        return;
    };
    // Positions are handed out in order and only to client-named keys:
    // the newest position is the last one handed out, and a key already
    // there stays (a gateway serving one model marks the same key every
    // turn).
    if key.client_named && old == *tick {
        return;
    }
    let stored = lru.remove(&old);
    if key.client_named {
        *tick += 1;
        entry.lru = Some(*tick);
        lru.insert(*tick, stored.unwrap_or_else(|| key.clone()));
    } else {
        entry.lru = None;
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
        // One lookup to find and mark it, one to lend it (the borrow
        // checker does not let the first one's reference out on this path).
        if entries.touch(key) {
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
        let lru = key.client_named.then(|| {
            entries.tick += 1;
            entries.tick
        });
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
///
/// A shared backend reads it from its store and gives it to its local view
/// with [`MemoryHealthStore::adopt`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FleetState {
    /// `Some`: a cooldown was started; it ends after this long (zero: it
    /// is over and the next request probes).
    pub cooling_left: Option<Duration>,
    /// `Some`: a probe is out for this much longer.
    pub probe_left: Option<Duration>,
    /// Failures in a row.
    pub streak: u32,
    /// Cooldowns in a row (the doubling's exponent).
    pub cooldowns: u32,
    /// The class of the last failure.
    pub last_class: Option<FailureClass>,
}

/// What a shared backend needs of its local view.
impl MemoryHealthStore {
    /// Whether `key` or its account holds anything but defaults: a success
    /// on a key without state changes nothing a fleet shares.
    pub fn has_state(&self, key: &HealthKey) -> bool {
        let map = self.lock();
        let busy = |k: &HealthKey| map.get(k).is_some_and(|e| !e.is_idle());
        busy(key) || (key.model.is_some() && busy(&key.to_account()))
    }

    /// Whether the account of `key` and `key` itself have a probe out.
    pub fn probing(&self, key: &HealthKey) -> (bool, bool) {
        let map = self.lock();
        let out = |k: &HealthKey| map.get(k).is_some_and(|e| e.probe_started.is_some());
        match key.model {
            Some(_) => (out(&key.to_account()), out(key)),
            None => (out(key), false),
        }
    }

    /// Takes the fleet's state of `key` into the local view (the latency
    /// figure and the local failure window stay local).
    pub fn adopt(&self, key: &HealthKey, shared: &FleetState) {
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
        entry.cooling_until = shared
            .cooling_left
            .map(|left| crate::time::later(now, left));
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
        let mut now = None;
        let map = self.lock();
        let mut of = |k: &HealthKey| {
            map.get(k).map_or(Availability::Healthy, |e| {
                e.availability_lazily(&self.policy, &mut now)
            })
        };
        let own = of(key);
        if key.model.is_none() {
            return own;
        }
        combine(of(&key.to_account()), own)
    }

    fn admit(&self, key: &HealthKey, force: bool) -> Admission {
        let mut now = None;
        let account = key.to_account();
        let mut map = self.lock();
        let mut probe_keys: [Option<&HealthKey>; 2] = [None, None];
        for (slot, k) in [&account, key].into_iter().enumerate() {
            if slot == 0 && key.model.is_none() {
                continue;
            }
            let availability = map.get(k).map_or(Availability::Healthy, |e| {
                e.availability_lazily(&self.policy, &mut now)
            });
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
        let now = *now.get_or_insert_with(Instant::now);
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
        // A success with nothing to clear or measure needs no entry, nor
        // a new place in the order of client-named keys. One lookup for a
        // key that has an entry: every turn's success comes here.
        let Entries {
            map: held,
            lru,
            tick,
        } = &mut *map;
        match held.get_mut(key) {
            Some(entry) if ttft.is_none() && entry.is_idle() => {}
            Some(entry) => {
                mark(entry, key, lru, tick);
                succeeded(entry, key, ttft, whole);
            }
            None if ttft.is_none() => {}
            None => {
                if let Some(entry) = self.entry(&mut map, key) {
                    succeeded(entry, key, ttft, whole);
                }
            }
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
            let until = crate::time::later(now, cooldown);
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

    /// Admitted as the probe after a cooldown.
    pub(crate) fn is_probe(&self) -> bool {
        self.probe
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
        self.store.failure(
            &self.key,
            FailureReport {
                was_probe,
                ..report
            },
        )
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if self.probe {
            self.store.release_probe(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rests(after: u64, scope: Scope) -> FailureReport {
        FailureReport {
            retry_after: Some(Duration::from_secs(after)),
            ..FailureReport::new(FailureClass::RateLimited, scope)
        }
    }

    /// The order of client-named keys follows their writes, successes
    /// included: a key written again while it is the newest stays so, one
    /// written again after others moves to the newest place, and the
    /// oldest is the one forgotten.
    #[tokio::test(start_paused = true)]
    async fn client_named_keys_are_forgotten_least_recently_written_first() {
        let store = MemoryHealthStore::default().max_client_named_keys(2);
        let [a, b, c] = ["a", "b", "c"].map(|m| HealthKey::client_model("p", m));
        let failed = FailureReport::new(FailureClass::ServerError, Scope::Model);
        let answered = || SuccessReport::Whole {
            ttft: Some(Duration::from_millis(5)),
        };
        let kept = |store: &MemoryHealthStore| {
            let mut models: Vec<String> = store
                .snapshot()
                .into_iter()
                .map(|e| e.key.to_string())
                .collect();
            models.sort();
            models
        };
        store.failure(&a, failed.clone());
        store.failure(&b, failed.clone());
        // `b` is the newest; written again, it stays the newest.
        store.success(&b, answered());
        store.success(&b, answered());
        // `a` written again: now `b` is the oldest.
        store.success(&a, answered());
        store.success(&a, answered());
        store.failure(&c, failed.clone());
        assert_eq!(kept(&store), [a.to_string(), c.to_string()]);
        // `c` is the newest, `a` the oldest.
        store.success(&c, answered());
        store.failure(&b, failed);
        assert_eq!(kept(&store), [b.to_string(), c.to_string()]);
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
            &FleetState {
                cooling_left: Some(Duration::from_secs(60)),
                ..FleetState::default()
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
            &FleetState {
                streak: 2,
                ..FleetState::default()
            },
        );
        // Nothing but defaults: no entry is made for it.
        let idle = HealthKey::model("p", "idle");
        store.adopt(&idle, &FleetState::default());
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
