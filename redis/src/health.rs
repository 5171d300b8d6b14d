//! [`RedisHealthStore`]: a local health view, shared through Redis.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{RedisError, Script};
use tokio::sync::{mpsc, oneshot};

use super::{DEFAULT_PREFIX, is_unavailable, millis};
use tower_llm_failover::FailureClass;
use tower_llm_failover::health::FleetState;
use tower_llm_failover::{
    health::Admission, health::Availability, health::CooldownPolicy, health::FailureReport,
    health::HealthKey, health::HealthSnapshot, health::HealthStore, health::MemoryHealthStore,
    health::Scope, health::SuccessReport,
};

/// Transitions waiting to be shipped; past this, new ones are applied
/// locally only (and counted in [`RedisHealthStats::dropped`]).
const QUEUE: usize = 4096;

/// A [`HealthStore`] shared by every replica of a gateway through Redis.
///
/// - **Reads and admissions are local**: a [`MemoryHealthStore`] with the
///   same [`CooldownPolicy`] answers them, so the happy path of a request
///   (a healthy key admitted, a success on a key without state) makes no
///   round trip at all.
/// - **Each transition** (a failure, a cooldown start, a probe claim, a
///   recovery, a probe given back) is applied to the local view at once and
///   shipped in the background as **one Lua script**: one atomic round
///   trip, which applies the same policy fleet-wide (the hintless failures
///   of every replica count toward one threshold) and answers with the
///   fleet's state of the key, which the local view adopts.
/// - **Replicas learn** each other's transitions by a versioned refresh
///   every [`refresh_every`](RedisHealthStoreBuilder::refresh_every)
///   (default 250 ms): one script call that returns only a version number
///   when nothing changed, and when it did, a second that reads the entries
///   (each script declares every key it touches, as Redis Cluster needs).
/// - **Redis unreachable**: the local view keeps serving (this replica's
///   own failures still cool its keys); shipping errors are counted and
///   logged; the connection reconnects on its own and the next refresh
///   brings the fleet's view back.
///
/// Probes are claimed locally first (the request does not wait for Redis),
/// then fleet-wide by a compare-and-set that keeps a live claim. A replica
/// that learned another's claim (by a refresh or a transition's reply) does
/// not probe; but replicas that have not learned it yet may each send one
/// probe: with N replicas, a recovering key may get up to N probes within
/// one [`refresh_every`](RedisHealthStoreBuilder::refresh_every), one per
/// replica, never more per replica.
///
/// All keys share the hash tag `{<prefix>:health}` (one cluster slot; the
/// health state of a gateway is small).
pub struct RedisHealthStore {
    local: Arc<MemoryHealthStore>,
    ops: mpsc::Sender<Command>,
    stats: Arc<Stats>,
    pending: Arc<Pending>,
}

/// Keys with a transition queued or in flight: the local view is newer than
/// Redis for them, so a refresh must not adopt the fleet's (older) state.
#[derive(Debug, Default)]
struct Pending(std::sync::Mutex<HashMap<HealthKey, usize>>);

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<HealthKey, usize>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The keys a transition of `key` touches: the key and its account.
    fn touched(key: &HealthKey) -> [HealthKey; 2] {
        [key.clone(), key.to_account()]
    }

    fn add(&self, key: &HealthKey) {
        let mut map = self.lock();
        for k in Self::touched(key) {
            *map.entry(k).or_default() += 1;
        }
    }

    fn remove(&self, key: &HealthKey) {
        let mut map = self.lock();
        for k in Self::touched(key) {
            if let Some(n) = map.get_mut(&k) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(&k);
                }
            }
        }
    }

    fn contains(&self, key: &HealthKey) -> bool {
        self.lock().contains_key(key)
    }
}

/// Counts of a [`RedisHealthStore`]'s traffic since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisHealthStats {
    /// Transitions shipped to Redis.
    pub shipped: u64,
    /// Transitions Redis could not take (unreachable or an error).
    pub failed: u64,
    /// Transitions applied locally only because the queue was full.
    pub dropped: u64,
    /// Refreshes that brought a changed fleet view.
    pub refreshed: u64,
    /// Refreshes that failed.
    pub refresh_failed: u64,
}

#[derive(Debug, Default)]
struct Stats {
    shipped: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    refreshed: AtomicU64,
    refresh_failed: AtomicU64,
}

/// Builds a [`RedisHealthStore`].
#[derive(Debug)]
pub struct RedisHealthStoreBuilder<C> {
    connection: C,
    policy: CooldownPolicy,
    prefix: String,
    refresh_every: Duration,
    keep: Duration,
    max_keys: usize,
    max_client_named_keys: usize,
}

impl<C> RedisHealthStoreBuilder<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The cooldown policy (the same on every replica).
    pub fn policy(mut self, policy: CooldownPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The key prefix (default [`DEFAULT_PREFIX`]).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How often the fleet's view is fetched (at least 10 ms).
    pub fn refresh_every(mut self, every: Duration) -> Self {
        self.refresh_every = every.max(Duration::from_millis(10));
        self
    }

    /// How long Redis keeps an entry nobody touched after its cooldown
    /// ended (default 1 h).
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }

    /// Caps the keys of the local view (see [`MemoryHealthStore::max_keys`]).
    pub fn max_keys(mut self, max: usize) -> Self {
        self.max_keys = max;
        self
    }

    /// Caps the keys of models clients named (default 1,000, at least 1),
    /// in the local view (see
    /// [`MemoryHealthStore::max_client_named_keys`]) and in Redis's index,
    /// the least recently written first out: a client inventing model
    /// names grows neither, and every refresh reads a bounded index.
    pub fn max_client_named_keys(mut self, max: usize) -> Self {
        self.max_client_named_keys = max.max(1);
        self
    }

    /// Starts the store and its background task (needs a Tokio runtime).
    pub fn start(self) -> Result<RedisHealthStore, RuntimeMissing> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| RuntimeMissing)?;
        let local = Arc::new(
            MemoryHealthStore::new(self.policy.clone())
                .max_keys(self.max_keys)
                .max_client_named_keys(self.max_client_named_keys),
        );
        let (tx, rx) = mpsc::channel(QUEUE);
        let stats = Arc::new(Stats::default());
        let pending = Arc::new(Pending::default());
        let worker = Worker {
            pending: Arc::clone(&pending),
            connection: self.connection,
            local: Arc::clone(&local),
            stats: Arc::clone(&stats),
            keys: Keys::new(&self.prefix),
            policy: self.policy,
            keep: self.keep,
            max_client_named_keys: self.max_client_named_keys,
            version: String::new(),
            transition: Script::new(include_str!("health.lua")),
            refresh: Script::new(include_str!("health_refresh.lua")),
            entries: Script::new(include_str!("health_entries.lua")),
            warned: false,
        };
        handle.spawn(worker.run(rx, self.refresh_every));
        Ok(RedisHealthStore {
            local,
            ops: tx,
            stats,
            pending,
        })
    }
}

/// [`RedisHealthStoreBuilder::start`] was called outside a Tokio runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the Redis health store needs a Tokio runtime to start its background task")]
pub struct RuntimeMissing;

impl RedisHealthStore {
    /// A builder over `connection` with the default policy, a 250 ms
    /// refresh and the default prefix.
    pub fn builder<C>(connection: C) -> RedisHealthStoreBuilder<C>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        RedisHealthStoreBuilder {
            connection,
            policy: CooldownPolicy::default(),
            prefix: DEFAULT_PREFIX.to_owned(),
            refresh_every: Duration::from_millis(250),
            keep: Duration::from_secs(3600),
            max_keys: 10_000,
            max_client_named_keys: 1_000,
        }
    }

    /// The local view (the state this replica answers from).
    pub fn local(&self) -> &MemoryHealthStore {
        &self.local
    }

    /// Counts of shipped, failed and dropped transitions and of refreshes.
    pub fn stats(&self) -> RedisHealthStats {
        let s = &self.stats;
        RedisHealthStats {
            shipped: s.shipped.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            refreshed: s.refreshed.load(Ordering::Relaxed),
            refresh_failed: s.refresh_failed.load(Ordering::Relaxed),
        }
    }

    /// Waits until every transition queued so far was shipped (or failed)
    /// and a refresh ran; returns the refresh's error, if Redis was not
    /// reachable. For tests, shutdown and operators; requests never wait.
    pub async fn sync(&self) -> Result<(), RedisError> {
        let (tx, rx) = oneshot::channel();
        if self.ops.send(Command::Sync(tx)).await.is_err() {
            return Ok(());
        }
        rx.await.unwrap_or(Ok(()))
    }

    fn ship(&self, key: &HealthKey, op: Op) {
        let command = Command::Transition {
            key: key.clone(),
            op,
        };
        // Marked before it is queued, so a refresh answered meanwhile
        // leaves this key's newer local state alone.
        self.pending.add(key);
        if self.ops.try_send(command).is_err() {
            self.pending.remove(key);
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for RedisHealthStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisHealthStore")
            .field("policy", self.local.policy())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl HealthStore for RedisHealthStore {
    fn availability(&self, key: &HealthKey) -> Availability {
        self.local.availability(key)
    }

    fn admit(&self, key: &HealthKey, force: bool) -> Admission {
        let admission = self.local.admit(key, force);
        if admission == Admission::Probe {
            // The keys the admission marked as probed: the account, the
            // model, or both.
            let (account, model) = self.local.probing(key);
            self.ship(key, Op::Probe { account, model });
        }
        admission
    }

    fn release_probe(&self, key: &HealthKey) {
        self.local.release_probe(key);
        self.ship(key, Op::Release);
    }

    fn success(&self, key: &HealthKey, report: SuccessReport) {
        // The happy path: nothing to clear anywhere, so nothing to ship.
        let transition = self.local.has_state(key);
        self.local.success(key, report);
        if transition {
            let whole = matches!(report, SuccessReport::Whole { .. });
            self.ship(key, Op::Success { whole });
        }
    }

    fn failure(&self, key: &HealthKey, report: FailureReport) -> Option<Duration> {
        let cooldown = self.local.failure(key, report.clone());
        if report.scope != Scope::Request || report.was_probe {
            self.ship(
                key,
                Op::Failure {
                    report,
                    cooled_locally: cooldown.is_some(),
                },
            );
        }
        cooldown
    }

    fn time_to_first_output(&self, key: &HealthKey) -> Option<Duration> {
        self.local.time_to_first_output(key)
    }

    fn snapshot(&self) -> Vec<HealthSnapshot> {
        self.local.snapshot()
    }
}

enum Command {
    Transition { key: HealthKey, op: Op },
    Sync(oneshot::Sender<Result<(), RedisError>>),
}

#[derive(Debug, Clone)]
enum Op {
    /// `cooled_locally`: the local view started (and the caller counted) a
    /// cooldown for it.
    Failure {
        report: FailureReport,
        cooled_locally: bool,
    },
    Success {
        whole: bool,
    },
    Probe {
        account: bool,
        model: bool,
    },
    Release,
}

/// Key names; every key carries the hash tag `{<prefix>:health}`.
struct Keys {
    /// Sorted set of the keys the operator configured (and accounts), by
    /// last write.
    index: String,
    /// Sorted set of the keys of models clients named, by last write;
    /// capped, the oldest first out.
    client_index: String,
    version: String,
    entry_prefix: String,
}

impl Keys {
    fn new(prefix: &str) -> Self {
        let tag = format!("{{{prefix}:health}}");
        Self {
            // Sorted sets, under names of their own: the set the index
            // once was keeps its name and is never read again.
            index: format!("{tag}:keys"),
            client_index: format!("{tag}:client_keys"),
            version: format!("{tag}:version"),
            entry_prefix: format!("{tag}:k:"),
        }
    }

    fn entry(&self, member: &str) -> String {
        format!("{}{member}", self.entry_prefix)
    }
}

/// A health key as one string: `a:<len>:<provider>` or
/// `m:<len>:<provider><model>` (length-prefixed: names may hold anything).
fn member(key: &HealthKey) -> String {
    let provider = key.provider();
    match key.upstream_model() {
        Some(model) => format!("m:{}:{provider}{model}", provider.len()),
        None => format!("a:{}:{provider}", provider.len()),
    }
}

/// A client's name as Lua reads it whatever it holds: hex.
fn hex(name: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(name.len() * 2);
    for byte in name.bytes() {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// `key` marked as client-named when `client` says it is.
fn marked(key: HealthKey, client: bool) -> HealthKey {
    match key.upstream_model() {
        Some(model) if client => HealthKey::client_model(key.provider(), model),
        _ => key,
    }
}

fn parse_member(member: &str) -> Option<HealthKey> {
    let (kind, rest) = member.split_once(':')?;
    let (len, rest) = rest.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let provider = rest.get(..len)?;
    let model = rest.get(len..)?;
    match kind {
        "a" if model.is_empty() => Some(HealthKey::account(provider)),
        "m" => Some(HealthKey::model(provider, model)),
        _ => None,
    }
}

/// One entry of a script's reply: member, then five state fields.
fn parse_state(fields: &[String]) -> Option<(HealthKey, FleetState)> {
    let [member, left, probe_left, streak, cooldowns, class] = fields else {
        return None;
    };
    let ms = |s: &String| -> Option<Option<Duration>> {
        let v: i64 = s.parse().ok()?;
        Some(u64::try_from(v).ok().map(Duration::from_millis))
    };
    // Field by field: the state is `#[non_exhaustive]`, so a backend
    // outside the library builds it from `Default`.
    let mut state = FleetState::default();
    state.cooling_left = ms(left)?;
    state.probe_left = ms(probe_left)?;
    state.streak = streak.parse().ok()?;
    state.cooldowns = cooldowns.parse().ok()?;
    state.last_class = FailureClass::ALL.into_iter().find(|c| c.as_str() == class);
    Some((parse_member(member)?, state))
}

/// A changed fleet view: its version, its entries' fields, and which keys
/// are of models clients named.
type Fetched = (String, Vec<String>, HashSet<HealthKey>);

struct Worker<C> {
    connection: C,
    pending: Arc<Pending>,
    local: Arc<MemoryHealthStore>,
    stats: Arc<Stats>,
    keys: Keys,
    policy: CooldownPolicy,
    keep: Duration,
    max_client_named_keys: usize,
    /// The fleet version the local view last adopted.
    version: String,
    transition: Script,
    refresh: Script,
    entries: Script,
    /// An outage is logged once, when it starts.
    warned: bool,
}

impl<C> Worker<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn run(mut self, mut rx: mpsc::Receiver<Command>, every: Duration) {
        // The fleet's view first, then one refresh per period: no tick is
        // left over to land after a caller's sync.
        let _ = self.refresh().await;
        let mut tick =
            tokio::time::interval_at(crate::later(tokio::time::Instant::now(), every), every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                // Transitions first: a refresh must not undo a local
                // transition that was not shipped yet.
                biased;
                command = rx.recv() => match command {
                    None => return,
                    Some(Command::Transition { key, op }) => {
                        self.transition(&key, &op).await;
                        self.pending.remove(&key);
                    }
                    Some(Command::Sync(done)) => {
                        let _ = done.send(self.refresh().await);
                    }
                },
                _ = tick.tick() => {
                    let _ = self.refresh().await;
                }
            }
        }
    }

    fn outage(&mut self, error: &RedisError, what: &str) {
        if is_unavailable(error) {
            if !self.warned {
                tracing::warn!(%error, "Redis unreachable: health serves from the local view ({what})");
                self.warned = true;
            }
        } else {
            tracing::error!(%error, "Redis health script failed ({what})");
        }
    }

    fn recovered(&mut self) {
        if std::mem::take(&mut self.warned) {
            tracing::info!("Redis reachable again: health is shared");
        }
    }

    async fn transition(&mut self, key: &HealthKey, op: &Op) {
        let account = key.to_account();
        let (account_member, model_member) = (member(&account), member(key));
        let mut invocation = self.transition.prepare_invoke();
        invocation
            .key(&self.keys.index)
            .key(&self.keys.version)
            .key(self.keys.entry(&account_member))
            .key(self.keys.entry(&model_member))
            .key(&self.keys.client_index);
        let name = match op {
            Op::Failure { .. } => "failure",
            Op::Success { whole: true } => "whole",
            Op::Success { whole: false } => "committed",
            Op::Probe { .. } => "probe",
            Op::Release => "release",
        };
        invocation.arg(name).arg(&account_member).arg(&model_member);
        let mut charged_scope = "none";
        match op {
            Op::Failure { report, .. } => {
                let charged = match report.scope {
                    Scope::Account => "account",
                    Scope::Model if key.upstream_model().is_some() => "model",
                    Scope::Model => "account",
                    _ => "none",
                };
                charged_scope = charged;
                let p = &self.policy;
                invocation
                    .arg(charged)
                    .arg(report.class.as_str())
                    .arg(report.retry_after.map_or(-1, |d| millis(d) as i64))
                    .arg(u8::from(report.was_probe))
                    .arg(u8::from(report.class == FailureClass::ModelNotFound))
                    .arg(millis(p.account))
                    .arg(p.failure_threshold)
                    .arg(millis(p.failure_window))
                    .arg(millis(p.base))
                    .arg(millis(p.max))
                    .arg(millis(p.max_probe_interval))
                    .arg(
                        report
                            .counted_per_client()
                            .map_or_else(String::new, |c| hex(c)),
                    );
            }
            Op::Probe { account, model } => {
                invocation
                    .arg(millis(self.policy.probe_timeout))
                    .arg(u8::from(*account))
                    .arg(u8::from(*model));
            }
            Op::Success { .. } | Op::Release => {}
        }
        invocation
            .arg(u8::from(key.is_client_named()))
            .arg(self.max_client_named_keys)
            .arg(millis(self.keep.max(self.policy.failure_window)));
        let mut connection = self.connection.clone();
        match invocation
            .invoke_async::<Vec<String>>(&mut connection)
            .await
        {
            Ok(reply) => {
                self.stats.shipped.fetch_add(1, Ordering::Relaxed);
                self.recovered();
                // A cooldown the fleet started (its failures together
                // reached the threshold) that the local view did not: count
                // it, as the caller counts local ones.
                let fleet_cooldown = reply
                    .get(1)
                    .and_then(|ms| ms.parse::<i64>().ok())
                    .is_some_and(|ms| ms >= 0);
                if fleet_cooldown
                    && matches!(
                        op,
                        Op::Failure {
                            cooled_locally: false,
                            ..
                        }
                    )
                    && charged_scope != "none"
                {
                    tower_llm_failover::health::record_cooldown(key.provider(), charged_scope);
                }
                // The fleet's state of the touched keys (after the version
                // and the cooldown).
                for fields in reply.get(2..).unwrap_or_default().chunks(6) {
                    if let Some((touched, state)) = parse_state(fields) {
                        let client = touched == *key && key.is_client_named();
                        self.local.adopt(&marked(touched, client), &state);
                    }
                }
            }
            Err(error) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                self.outage(&error, "transition applied locally only");
            }
        }
    }

    /// Fetches the fleet's view when its version moved: one call when it
    /// did not; when it did, a second that reads the entries it named
    /// (every key a script touches is declared, as Redis Cluster needs).
    async fn refresh(&mut self) -> Result<(), RedisError> {
        let reply = self.fetch().await;
        let (version, entries, clients) = match reply {
            Ok(Some(view)) => view,
            Ok(None) => {
                self.recovered();
                return Ok(());
            }
            Err(error) => {
                self.stats.refresh_failed.fetch_add(1, Ordering::Relaxed);
                self.outage(&error, "refresh");
                return Err(error);
            }
        };
        self.recovered();
        let mut seen: HashMap<HealthKey, FleetState> = HashMap::new();
        for fields in entries.chunks(6) {
            if let Some((key, state)) = parse_state(fields) {
                // Configured first: a key also named by a client stays one
                // the operator configured.
                let client = clients.contains(&key) && !seen.contains_key(&key);
                seen.insert(marked(key, client), state);
            }
        }
        for (key, state) in &seen {
            // A transition of this key is queued or in flight: the local
            // view is newer; the transition's reply brings the fleet's.
            if self.pending.contains(key) {
                continue;
            }
            self.local.adopt(key, state);
        }
        self.version = version;
        self.stats.refreshed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The fleet's version, entries and client-named keys, or `None` when
    /// the version is the one the local view adopted.
    async fn fetch(&self) -> Result<Option<Fetched>, RedisError> {
        let mut connection = self.connection.clone();
        let reply = self
            .refresh
            .key(&self.keys.index)
            .key(&self.keys.client_index)
            .key(&self.keys.version)
            .arg(&self.version)
            .invoke_async::<Vec<String>>(&mut connection)
            .await?;
        let Some((version, rest)) = reply.split_first() else {
            return Ok(None);
        };
        if *version == self.version {
            return Ok(None);
        }
        // {version, configured count, configured..., client-named...}
        let Some((configured, members)) = rest.split_first() else {
            return Ok(Some((version.clone(), Vec::new(), HashSet::new())));
        };
        let configured = configured.parse::<usize>().unwrap_or(members.len());
        let clients: HashSet<HealthKey> = members
            .get(configured..)
            .unwrap_or_default()
            .iter()
            .filter_map(|m| parse_member(m))
            .collect();
        if members.is_empty() {
            return Ok(Some((version.clone(), Vec::new(), clients)));
        }
        let mut invocation = self.entries.prepare_invoke();
        invocation
            .key(&self.keys.index)
            .key(&self.keys.client_index);
        for member in members {
            invocation.key(self.keys.entry(member)).arg(member);
        }
        let entries = invocation
            .invoke_async::<Vec<String>>(&mut connection)
            .await?;
        Ok(Some((version.clone(), entries, clients)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip_whatever_the_names_hold() {
        for key in [
            HealthKey::account("openai"),
            HealthKey::model("openai", "gpt-4o"),
            HealthKey::model("a:b/c", "m:1:x"),
            HealthKey::model("p", ""),
        ] {
            assert_eq!(parse_member(&member(&key)), Some(key));
        }
        assert_eq!(parse_member("a:3:abcd"), None);
        assert_eq!(parse_member("m:9:ab"), None);
    }
}
