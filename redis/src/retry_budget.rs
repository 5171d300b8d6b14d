//! [`RedisRetryBudget`]: one retry budget for the whole fleet.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::{RedisError, Script};
use tokio::sync::{Notify, mpsc, oneshot};
use tower::retry::budget::{Budget as TowerBudget, TpsBudget};

use super::{DEFAULT_PREFIX, is_unavailable, millis};
use tower_llm_failover::budget::{RetryBudget, RetryBudgetConfig, RetryBudgetConfigError};

/// A retry budget shared by every replica: tower's `TpsBudget` (deposits
/// and withdrawals in ten time slots per `ttl`, plus a reserve of
/// `min_per_sec × ttl`) kept in Redis and updated by one script.
///
/// The request path never waits for Redis: each replica holds a small
/// *lease* of withdrawals the shared budget already granted
/// (`lease`, default 2) and its deposits
/// not yet shipped; a background task ships the deposits and tops the lease
/// up every `sync_every` (default
/// 50 ms), and at once when a withdrawal finds the lease empty.
///
/// Each exchange also brings back the shared budget's *level* (the
/// withdrawals it would still grant). A burst larger than the lease (an
/// incident: every in-flight turn wants to reroute at once) does not wait
/// for the next top-up: while the last known level is above
/// `lease × 4`, a withdrawal that finds the lease empty is granted from a
/// local *allowance* of half the level above that floor, and debited from
/// the shared budget at the next exchange (started at once). One replica
/// alone never passes the shared budget this way; replicas drawing on the
/// same level at the same moment may together pass it by what they drew
/// within one exchange (a round trip). Once the level is down to the
/// floor, only the lease grants, so the budget's last withdrawals are
/// handed out one exchange at a time, fleet-wide.
///
/// Redis unreachable, answering with an error (LOADING, OOM, READONLY…)
/// or not yet asked (right after start): withdrawals
/// fall back to a local `TpsBudget` of the same settings (fed the same
/// deposits), so retries stay capped per replica; what it granted is
/// debited from the shared budget once Redis answers, so the fleet's total
/// comes back within the shared budget. Deposits of a failed exchange are
/// not shipped again (the fallback counted them): after an outage the
/// shared budget is not credited with the whole outage's first attempts
/// at once.
///
/// Use it through [`RetryBudget`]: [`into_retry_budget`](Self::into_retry_budget).
pub struct RedisRetryBudget {
    shared: Arc<Shared>,
    wake: mpsc::Sender<Wake>,
}

struct Shared {
    lease: AtomicU64,
    /// The shared budget's level at the last exchange, in withdrawals.
    level: AtomicU64,
    /// Withdrawals granted past the lease (from the allowance) since the
    /// last exchange, debited from the shared budget at the next one.
    overdraft: AtomicU64,
    pending: AtomicU64,
    /// Withdrawals the local fallback granted, debited from the shared
    /// budget at the next exchange.
    local_grants: AtomicU64,
    reachable: AtomicBool,
    fallback: TpsBudget,
    want: u64,
    notify: Notify,
}

enum Wake {
    Sync(oneshot::Sender<Result<(), RedisError>>),
}

/// Settings of a [`RedisRetryBudget`] beyond the [`RetryBudgetConfig`].
#[derive(Debug, Clone)]
pub struct RedisRetryBudgetBuilder<C> {
    connection: C,
    config: RetryBudgetConfig,
    prefix: String,
    lease: u64,
    sync_every: Duration,
}

impl RedisRetryBudget {
    /// A builder over `connection` with `config` (the same on every
    /// replica).
    pub fn builder<C>(connection: C, config: RetryBudgetConfig) -> RedisRetryBudgetBuilder<C>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        RedisRetryBudgetBuilder {
            connection,
            config,
            prefix: DEFAULT_PREFIX.to_owned(),
            lease: 2,
            sync_every: Duration::from_millis(50),
        }
    }

    /// Asks Redis now (even with nothing to ship) and waits until the
    /// deposits made so far were shipped and the lease was topped up; the
    /// error when Redis could not be reached or answered with an error.
    pub async fn sync(&self) -> Result<(), RedisError> {
        let (tx, rx) = oneshot::channel();
        if self.wake.send(Wake::Sync(tx)).await.is_err() {
            return Ok(());
        }
        rx.await.unwrap_or(Ok(()))
    }

    /// Whether the last exchange with Redis succeeded.
    pub fn is_shared(&self) -> bool {
        self.shared.reachable.load(Ordering::Acquire)
    }

    /// As a [`RetryBudget`] for [`TurnLimits`](tower_llm_failover::budget::TurnLimits);
    /// keep a clone of `self` (it is cheap) for [`sync`](Self::sync).
    pub fn into_retry_budget(self) -> RetryBudget {
        RetryBudget::from_budget(self)
    }
}

impl Clone for RedisRetryBudget {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            wake: self.wake.clone(),
        }
    }
}

impl<C> RedisRetryBudgetBuilder<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The key prefix (default [`DEFAULT_PREFIX`]).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Withdrawals held ready on this replica (at least 1).
    pub fn lease(mut self, lease: u64) -> Self {
        self.lease = lease.max(1);
        self
    }

    /// How often deposits are shipped and the lease topped up.
    pub fn sync_every(mut self, every: Duration) -> Self {
        self.sync_every = every.max(Duration::from_millis(1));
        self
    }

    /// Starts the budget and its background task (needs a Tokio runtime).
    pub fn start(self) -> Result<RedisRetryBudget, RetryBudgetConfigError> {
        self.config.validate()?;
        let (ttl, min_per_sec, percent) = self.config.parts();
        let shared = Arc::new(Shared {
            lease: AtomicU64::new(0),
            level: AtomicU64::new(0),
            overdraft: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            local_grants: AtomicU64::new(0),
            // Local until Redis first answered: a replica that just
            // started still retries (capped by its own budget).
            reachable: AtomicBool::new(false),
            fallback: TpsBudget::new(ttl, min_per_sec, percent),
            want: self.lease,
            notify: Notify::new(),
        });
        let (tx, rx) = mpsc::channel(16);
        let worker = Worker {
            connection: self.connection,
            shared: Arc::clone(&shared),
            key: format!("{{{}:retry}}:slots", self.prefix),
            script: Script::new(include_str!("retry_budget.lua")),
            ttl_ms: millis(ttl),
            percent_milli: (f64::from(percent) * 1000.0).round() as u64,
            reserve_milli: u64::from(min_per_sec)
                .saturating_mul(ttl.as_secs())
                .saturating_mul(1000),
            // The script's slot: deposits and withdrawals age per slot, so
            // the level is re-read at least that often.
            stale_after: ttl / 10,
            last_exchange: None,
        };
        tokio::spawn(worker.run(rx, self.sync_every));
        Ok(RedisRetryBudget { shared, wake: tx })
    }
}

impl TowerBudget for RedisRetryBudget {
    fn deposit(&self) {
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        self.shared.fallback.deposit();
    }

    fn withdraw(&self) -> bool {
        let shared = &self.shared;
        if !shared.reachable.load(Ordering::Acquire) {
            let granted = shared.fallback.withdraw();
            if granted {
                shared.local_grants.fetch_add(1, Ordering::AcqRel);
            }
            return granted;
        }
        let leased = shared
            .lease
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if leased {
            if shared.lease.load(Ordering::Acquire) == 0 {
                shared.notify.notify_one();
            }
            return true;
        }
        // The lease is empty: a burst. Draw on the allowance while the
        // shared level is well above the floor, and ship the debit now.
        let allowance = shared.allowance();
        let drawn = shared
            .overdraft
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < allowance).then_some(n + 1)
            })
            .is_ok();
        shared.notify.notify_one();
        drawn
    }
}

/// Above `lease × MARGIN` withdrawals, the shared level is high enough for
/// a burst to draw on it between exchanges.
const MARGIN: u64 = 4;

impl Shared {
    /// Withdrawals past the lease this replica may grant before the next
    /// exchange: half the last known level above the floor. Half, because
    /// an exchange in flight debits the grants made before it while the
    /// level it answers does not yet know those made during it.
    fn allowance(&self) -> u64 {
        let floor = self.want.saturating_mul(MARGIN);
        self.level.load(Ordering::Acquire).saturating_sub(floor) / 2
    }
}

impl fmt::Debug for RedisRetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRetryBudget")
            .field("lease", &self.shared.lease.load(Ordering::Relaxed))
            .field("pending", &self.shared.pending.load(Ordering::Relaxed))
            .field("level", &self.shared.level.load(Ordering::Relaxed))
            .field("shared", &self.is_shared())
            .finish_non_exhaustive()
    }
}

struct Worker<C> {
    connection: C,
    shared: Arc<Shared>,
    key: String,
    script: Script,
    ttl_ms: u64,
    percent_milli: u64,
    reserve_milli: u64,
    stale_after: Duration,
    last_exchange: Option<tokio::time::Instant>,
}

impl<C> Worker<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn run(mut self, mut rx: mpsc::Receiver<Wake>, every: Duration) {
        // Ask Redis at once, then once per period: no tick is left over to
        // land after a caller's sync.
        let _ = self.exchange(false).await;
        let mut tick =
            tokio::time::interval_at(crate::later(tokio::time::Instant::now(), every), every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let shared = Arc::clone(&self.shared);
        loop {
            tokio::select! {
                wake = rx.recv() => match wake {
                    None => return,
                    Some(Wake::Sync(done)) => {
                        let _ = done.send(self.exchange(true).await);
                    }
                },
                () = shared.notify.notified() => {
                    let _ = self.exchange(false).await;
                }
                _ = tick.tick() => {
                    let _ = self.exchange(false).await;
                }
            }
        }
    }

    /// Ships the pending deposits and tops the lease up, in one script;
    /// with nothing to ship or top up and a fresh level, only when `force`d.
    async fn exchange(&mut self, force: bool) -> Result<(), RedisError> {
        let shared = Arc::clone(&self.shared);
        let deposits = shared.pending.swap(0, Ordering::AcqRel);
        let debit = shared
            .local_grants
            .swap(0, Ordering::AcqRel)
            .saturating_add(shared.overdraft.swap(0, Ordering::AcqRel));
        let want = shared
            .want
            .saturating_sub(shared.lease.load(Ordering::Acquire));
        let fresh = self
            .last_exchange
            .is_some_and(|at| at.elapsed() < self.stale_after);
        if deposits == 0 && want == 0 && debit == 0 && fresh && !force {
            return Ok(());
        }
        let mut connection = self.connection.clone();
        let reply = self
            .script
            .key(&self.key)
            .arg(deposits)
            .arg(want)
            .arg(self.ttl_ms)
            .arg(self.percent_milli)
            .arg(self.reserve_milli)
            .arg(debit)
            .invoke_async::<(u64, u64)>(&mut connection)
            .await;
        match reply {
            Ok((granted, level)) => {
                self.last_exchange = Some(tokio::time::Instant::now());
                shared.lease.fetch_add(granted, Ordering::AcqRel);
                shared.level.store(level, Ordering::Release);
                if !shared.reachable.swap(true, Ordering::AcqRel) {
                    tracing::info!("Redis reachable: the retry budget is shared");
                }
                Ok(())
            }
            Err(error) => {
                // The debit counts again next time; the deposits do not:
                // the local fallback already counted them, and crediting an
                // outage's worth of deposits at once on reconnect would fund
                // a retry storm with first attempts made long ago.
                shared.local_grants.fetch_add(debit, Ordering::AcqRel);
                // Any failed exchange falls back, not only an unreachable
                // Redis: an error answer (LOADING, OOM, READONLY, a failed
                // script) would otherwise leave an empty lease that refuses
                // every retry.
                if shared.reachable.swap(false, Ordering::AcqRel) {
                    if is_unavailable(&error) {
                        tracing::warn!(%error, "Redis unreachable: the retry budget is local");
                    } else {
                        tracing::error!(%error, "Redis retry budget script failed: the retry budget is local");
                    }
                }
                Err(error)
            }
        }
    }
}
