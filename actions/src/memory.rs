//! The in-memory [`ActionStore`]: bounded, finished records expire.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::digest::ArgumentsDigest;
use super::id::ActionId;
use super::reconcile::Reconciliation;
use super::state::{ActionRecord, ActionState, FenceToken, StateKind, StoredError, Transition};
use super::store::{ActionStore, BoxFuture, Claim, ClaimRequest, Claimed, StoreError};
use crate::time::later;

/// How many attempt ids a record keeps (the most recent ones).
const MAX_ATTEMPTS_RECORDED: usize = 16;

/// An [`ActionStore`] in process memory, for a single gateway replica.
///
/// - **Bounded**: at most [`max_records`](Self::max_records) records. When
///   full, a claim of a new action first drops expired records; if none has
///   expired it fails with [`StoreError::Full`]. Live records (running,
///   unknown, or finished within their time-to-live) are never evicted to make
///   room, because forgetting one would let its effect run a second time.
/// - **Expiry**: a finished record (succeeded or failed) is gone
///   [`ttl`](Self::ttl) after it finished; a later call with its id starts
///   afresh. Running and unknown records never expire: an unknown one waits
///   for reconciliation (or [`remove`](Self::remove) by an operator).
/// - Time is [`tokio::time::Instant`], so tests can pause and advance it.
pub struct MemoryStore {
    max_records: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    records: HashMap<ActionId, Entry>,
    next_sweep: Option<Instant>,
}

struct Entry {
    tool: String,
    /// The digest of the arguments of the claim that made the record.
    arguments: Option<ArgumentsDigest>,
    state: ActionState,
    run: FenceToken,
    attempts: Vec<String>,
    /// Set once finished: when the record expires.
    expires_at: Option<Instant>,
    /// Set while running: until when the owner is trusted.
    lease_until: Option<Instant>,
    /// Created when a duplicate waits on this record; woken on every transition.
    waiters: Option<Arc<Notify>>,
}

impl Entry {
    fn is_live(&self, now: Instant) -> bool {
        self.expires_at.is_none_or(|at| at > now)
    }

    fn note_attempt(&mut self, attempt_id: Option<&str>) {
        let Some(attempt_id) = attempt_id else { return };
        if self.attempts.iter().any(|a| a == attempt_id) {
            return;
        }
        if self.attempts.len() >= MAX_ATTEMPTS_RECORDED {
            self.attempts.remove(0);
        }
        self.attempts.push(attempt_id.to_owned());
    }

    /// Moves to `state`, keeping the expiry and lease bookkeeping right, and
    /// wakes waiting duplicates.
    fn set_state(&mut self, state: ActionState, now: Instant, ttl: Duration) -> Transition {
        let before = self.state.kind();
        self.expires_at = state.is_finished().then(|| later(now, ttl));
        if !matches!(state, ActionState::Running) {
            self.lease_until = None;
        }
        self.state = state;
        if let Some(waiters) = self.waiters.take() {
            waiters.notify_waiters();
        }
        Transition::new(before, self.state.kind(), self.run)
    }

    fn start_run(
        &mut self,
        run: FenceToken,
        lease: Duration,
        now: Instant,
        ttl: Duration,
    ) -> Transition {
        self.run = run;
        self.lease_until = Some(later(now, lease));
        self.set_state(ActionState::Running, now, ttl)
    }

    fn record(&self, action_id: &ActionId) -> ActionRecord {
        ActionRecord::new(
            action_id.clone(),
            self.tool.clone(),
            self.state.clone(),
            self.run,
        )
        .with_attempts(self.attempts.clone())
        .with_arguments_digest(self.arguments)
    }

    /// Whether `request` may act on this record: the same tool, and the
    /// same arguments when both sides know them.
    fn admits(&self, request: &ClaimRequest) -> Result<(), StoreError> {
        if self.tool != request.tool {
            return Err(StoreError::ToolMismatch {
                action_id: request.action_id.clone(),
                recorded: self.tool.clone(),
                requested: request.tool.clone(),
            });
        }
        match (self.arguments, request.arguments) {
            (Some(recorded), Some(requested)) if recorded != requested => {
                Err(StoreError::ArgumentsDiffer {
                    action_id: request.action_id.clone(),
                })
            }
            _ => Ok(()),
        }
    }
}

impl MemoryStore {
    /// Default bound on records.
    pub(crate) const DEFAULT_MAX_RECORDS: usize = 10_000;
    /// Default time-to-live of finished records: 7 days. A resubmission of a
    /// finished action within it is answered from the record; after it, the
    /// effect runs again. Pick [`max_records`](Self::max_records) for the
    /// actions finished in one TTL at peak: live records are never evicted,
    /// so a store too small for its TTL refuses new claims
    /// ([`StoreError::Full`]).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 60 * 60);

    /// A store with `DEFAULT_MAX_RECORDS` and
    /// [`DEFAULT_TTL`](Self::DEFAULT_TTL).
    pub fn new() -> Self {
        Self {
            max_records: Self::DEFAULT_MAX_RECORDS,
            ttl: Self::DEFAULT_TTL,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Sets the bound on records (at least 1).
    pub fn max_records(mut self, max_records: usize) -> Self {
        self.max_records = max_records.max(1);
        self
    }

    /// Sets how long a finished record is kept (the tombstone), and so how
    /// long a duplicate call is answered from it instead of running the
    /// effect again (default [`DEFAULT_TTL`](Self::DEFAULT_TTL), 7 days).
    /// Set it longer than the longest time an application may resubmit an
    /// action. `Duration::MAX` keeps finished records for as long as the
    /// process lives (they still count toward `max_records`).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How many records the store holds now (expired ones not yet dropped
    /// included: this is the memory bound).
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops expired records now and returns how many were dropped.
    /// Claims do this on their own when the store is full and every
    /// quarter time-to-live.
    pub fn purge_expired(&self) -> usize {
        let now = Instant::now();
        let mut inner = self.lock();
        Self::sweep(&mut inner, now)
    }

    /// Forgets an action whatever its state, for an operator who settled an
    /// unknown action by hand. Returns the record it held. A later call with
    /// this id runs the effect afresh.
    pub fn remove(&self, action_id: &ActionId) -> Option<ActionRecord> {
        let entry = self.lock().records.remove(action_id)?;
        if let Some(waiters) = &entry.waiters {
            waiters.notify_waiters();
        }
        Some(entry.record(action_id))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves consistent data
        // (every mutation is a single assignment), so keep going.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sweep(inner: &mut Inner, now: Instant) -> usize {
        let before = inner.records.len();
        inner.records.retain(|_, entry| entry.is_live(now));
        before - inner.records.len()
    }

    fn sweep_if_due(&self, inner: &mut Inner, now: Instant) {
        if inner.next_sweep.is_none_or(|at| at <= now) {
            Self::sweep(inner, now);
            let period = (self.ttl / 4).max(Duration::from_secs(1));
            inner.next_sweep = Some(later(now, period));
        }
    }

    fn claim_locked(
        &self,
        inner: &mut Inner,
        request: &ClaimRequest,
        now: Instant,
    ) -> Result<Claimed, StoreError> {
        self.sweep_if_due(inner, now);
        let ttl = self.ttl;
        let mut next_run = FenceToken::new(1);
        if let Some(entry) = inner.records.get_mut(&request.action_id) {
            if entry.is_live(now) {
                return Self::claim_existing(entry, request, now, ttl);
            }
            next_run = entry.run.next();
            inner.records.remove(&request.action_id);
        }
        if inner.records.len() >= self.max_records && Self::sweep(inner, now) == 0 {
            return Err(StoreError::Full {
                action_id: request.action_id.clone(),
                max_records: self.max_records,
            });
        }
        let mut entry = Entry {
            tool: request.tool.clone(),
            arguments: request.arguments,
            state: ActionState::NotStarted,
            run: next_run,
            attempts: Vec::new(),
            expires_at: None,
            lease_until: None,
            waiters: None,
        };
        entry.note_attempt(request.attempt_id.as_deref());
        let transition = entry.start_run(next_run, request.lease, now, ttl);
        inner.records.insert(request.action_id.clone(), entry);
        Ok(Claimed::changed(
            Claim::Acquired { run: next_run },
            transition,
        ))
    }

    fn claim_existing(
        entry: &mut Entry,
        request: &ClaimRequest,
        now: Instant,
        ttl: Duration,
    ) -> Result<Claimed, StoreError> {
        entry.admits(request)?;
        entry.note_attempt(request.attempt_id.as_deref());
        let run = entry.run;
        Ok(match &entry.state {
            ActionState::Running if entry.lease_until.is_some_and(|until| until <= now) => {
                // The owner vanished without reporting: the effect may have happened.
                let transition = entry.set_state(ActionState::Unknown, now, ttl);
                Claimed::changed(Claim::Unknown { run }, transition)
            }
            ActionState::Running => Claimed::read(Claim::InProgress { run }),
            ActionState::Succeeded { result } => Claimed::read(Claim::Succeeded {
                result: result.clone(),
            }),
            ActionState::Failed {
                error,
                retryable: false,
            } => Claimed::read(Claim::Failed {
                error: error.clone(),
            }),
            ActionState::Failed {
                retryable: true, ..
            }
            | ActionState::NotStarted => {
                let run = run.next();
                let transition = entry.start_run(run, request.lease, now, ttl);
                Claimed::changed(Claim::Acquired { run }, transition)
            }
            ActionState::Unknown => Claimed::read(Claim::Unknown { run }),
        })
    }

    /// Applies a report of run `run`'s outcome.
    fn report(
        &self,
        action_id: &ActionId,
        run: FenceToken,
        attempt_id: Option<&str>,
        state: ActionState,
    ) -> Result<Transition, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let entry = match inner.records.get_mut(action_id) {
            Some(entry) if entry.is_live(now) => entry,
            _ => {
                return Err(StoreError::NotFound {
                    action_id: action_id.clone(),
                });
            }
        };
        let current = entry.state.kind();
        // Only the owner of the current run may report, and only while the
        // outcome is open; a late report on an unknown run is the truth, so take it.
        let open = matches!(current, StateKind::Running | StateKind::Unknown);
        if entry.run != run || !open {
            return Err(StoreError::Conflict {
                action_id: action_id.clone(),
                run,
                current: entry.run,
                found: current,
            });
        }
        entry.note_attempt(attempt_id);
        Ok(entry.set_state(state, now, self.ttl))
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("max_records", &self.max_records)
            .field("ttl", &self.ttl)
            .field("len", &self.len())
            .finish()
    }
}

impl ActionStore for MemoryStore {
    fn claim<'a>(
        &'a self,
        request: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        let now = Instant::now();
        let result = self.claim_locked(&mut self.lock(), request, now);
        Box::pin(std::future::ready(result))
    }

    fn complete<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
        result: Value,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        let result = self.report(
            action_id,
            run,
            attempt_id,
            ActionState::Succeeded { result },
        );
        Box::pin(std::future::ready(result))
    }

    fn fail<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
        error: StoredError,
        retryable: bool,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        let result = self.report(
            action_id,
            run,
            attempt_id,
            ActionState::Failed { error, retryable },
        );
        Box::pin(std::future::ready(result))
    }

    fn mark_unknown<'a>(
        &'a self,
        action_id: &'a ActionId,
        run: FenceToken,
        attempt_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Transition, StoreError>> {
        let result = self.report(action_id, run, attempt_id, ActionState::Unknown);
        Box::pin(std::future::ready(result))
    }

    fn resolve<'a>(
        &'a self,
        request: &'a ClaimRequest,
        run: FenceToken,
        answer: Reconciliation,
    ) -> BoxFuture<'a, Result<Claimed, StoreError>> {
        let now = Instant::now();
        let ttl = self.ttl;
        let mut inner = self.lock();
        let result = match inner.records.get_mut(&request.action_id) {
            Some(entry)
                if entry.is_live(now)
                    && entry.run == run
                    && matches!(entry.state, ActionState::Unknown)
                    && entry.admits(request).is_ok() =>
            {
                entry.note_attempt(request.attempt_id.as_deref());
                match answer {
                    Reconciliation::Succeeded(result) => {
                        let transition = entry.set_state(
                            ActionState::Succeeded {
                                result: result.clone(),
                            },
                            now,
                            ttl,
                        );
                        Ok(Claimed::changed(Claim::Succeeded { result }, transition))
                    }
                    Reconciliation::NotApplied => {
                        let run = run.next();
                        let transition = entry.start_run(run, request.lease, now, ttl);
                        Ok(Claimed::changed(Claim::Acquired { run }, transition))
                    }
                    Reconciliation::StillUnknown => Ok(Claimed::read(Claim::Unknown { run })),
                }
            }
            // Moved on (or gone) meanwhile: answer as a claim would now.
            _ => self.claim_locked(&mut inner, request, now),
        };
        drop(inner);
        Box::pin(std::future::ready(result))
    }

    fn get<'a>(
        &'a self,
        action_id: &'a ActionId,
    ) -> BoxFuture<'a, Result<Option<ActionRecord>, StoreError>> {
        let now = Instant::now();
        let record = self
            .lock()
            .records
            .get(action_id)
            .filter(|entry| entry.is_live(now))
            .map(|entry| entry.record(action_id));
        Box::pin(std::future::ready(Ok(record)))
    }

    fn changed<'a>(&'a self, action_id: &'a ActionId, run: FenceToken) -> BoxFuture<'a, ()> {
        let mut inner = self.lock();
        let Some(entry) = inner.records.get_mut(action_id) else {
            return Box::pin(std::future::ready(()));
        };
        if entry.run != run || !matches!(entry.state, ActionState::Running) {
            return Box::pin(std::future::ready(()));
        }
        let waiters = entry.waiters.get_or_insert_with(Default::default).clone();
        let lease_until = entry.lease_until;
        let mut notified = Box::pin(waiters.notified_owned());
        // Register before the lock is released, so a transition in between
        // still wakes this waiter.
        notified.as_mut().enable();
        drop(inner);
        Box::pin(async move {
            match lease_until {
                // Past the lease a claim turns the record unknown; wake up for it.
                Some(until) => {
                    let _ = tokio::time::timeout_at(until, notified).await;
                }
                None => notified.await,
            }
        })
    }
}
