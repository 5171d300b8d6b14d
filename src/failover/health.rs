use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::classify::{Classification, FailureClass};

/// How long a failing target rests before it gets traffic again.
///
/// A failure that says the target is unwell puts it in cooldown: a rate
/// limit that came with a retry hint (for the hinted time), an exhausted
/// quota, auth, permission and model-not-found failures (long), overload
/// (short, or the hint), and server errors, timeouts, connect failures and
/// invalid responses once they repeat (doubling from `repeated_base`).
/// After the cooldown one request probes the target; it takes full traffic
/// again only when the probe succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CooldownPolicy {
    /// Quota, auth, permission and model-not-found failures.
    pub account: Duration,
    /// Overload without a retry hint.
    pub overloaded: Duration,
    /// Consecutive transient failures before a cooldown.
    pub repeated_threshold: u32,
    /// The first cooldown after repeated transient failures.
    pub repeated_base: Duration,
    /// The longest cooldown of any kind (hints included).
    pub max: Duration,
    /// A probe that has not reported after this long is abandoned, so a
    /// cancelled turn cannot keep a target out forever.
    pub probe_timeout: Duration,
}

impl Default for CooldownPolicy {
    fn default() -> Self {
        Self {
            account: Duration::from_secs(300),
            overloaded: Duration::from_secs(5),
            repeated_threshold: 2,
            repeated_base: Duration::from_secs(5),
            max: Duration::from_secs(600),
            probe_timeout: Duration::from_secs(30),
        }
    }
}

impl CooldownPolicy {
    /// The cooldown a failure earns, given the consecutive failures so far
    /// (this one included). `None`: the target stays in rotation.
    pub fn cooldown(&self, failure: &Classification, consecutive: u32) -> Option<Duration> {
        use FailureClass::*;
        let hint = failure.retry.after;
        let cooldown = match failure.class {
            RateLimited if hint.is_some() => hint,
            QuotaExhausted | Auth | PermissionDenied | ModelNotFound => Some(self.account),
            Overloaded => Some(hint.unwrap_or(self.overloaded)),
            // A rate limit without a hint, repeated, is a target to rest too.
            RateLimited | ServerError | Timeout | Connect | InvalidResponse
                if consecutive >= self.repeated_threshold =>
            {
                let doublings = (consecutive - self.repeated_threshold).min(16);
                Some(self.repeated_base.saturating_mul(1 << doublings))
            }
            _ => None,
        };
        cooldown.map(|c| c.min(self.max))
    }
}

/// Whether a target may take a request now.
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

#[derive(Debug, Default)]
struct TargetHealth {
    cooling_until: Option<Instant>,
    probe_started: Option<Instant>,
    consecutive_failures: u32,
    ttft_ewma: Option<Duration>,
}

impl TargetHealth {
    fn record_ttft(&mut self, ttft: Option<Duration>) {
        if let Some(ttft) = ttft {
            self.ttft_ewma = Some(match self.ttft_ewma {
                None => ttft,
                Some(old) => (old * 4 + ttft) / 5,
            });
        }
    }
}

/// Passive health of every target of one failover layer, shared by all
/// requests through it.
#[derive(Debug)]
pub struct Health {
    targets: Vec<Mutex<TargetHealth>>,
    policy: CooldownPolicy,
}

/// A request's admission to a target. When it was admitted as the probe
/// and is dropped without reporting (a refused budget, a cancelled turn),
/// the probe slot is given back so the target is not left out.
#[derive(Debug)]
pub(crate) struct Admitted {
    health: Arc<Health>,
    index: usize,
    probe: bool,
}

impl Admitted {
    /// The attempt's whole answer arrived.
    pub(crate) fn success(mut self, ttft: Option<Duration>) {
        self.probe = false;
        self.health.on_success(self.index, ttft);
    }

    /// The attempt's stream committed: the target answers (cooldown and
    /// probe are over), but its failure streak ends only when the stream
    /// ends whole ([`Health::on_stream_end`]).
    pub(crate) fn committed(mut self, ttft: Option<Duration>) {
        self.probe = false;
        if let Some(mut health) = self.health.lock(self.index) {
            health.cooling_until = None;
            health.probe_started = None;
            health.record_ttft(ttft);
        }
    }

    /// The attempt failed; returns the cooldown it started, if any.
    pub(crate) fn failure(mut self, failure: &Classification) -> Option<Duration> {
        let was_probe = std::mem::take(&mut self.probe);
        self.health.on_failure(self.index, failure, was_probe)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if self.probe
            && let Some(mut health) = self.health.lock(self.index)
        {
            health.probe_started = None;
        }
    }
}

impl Health {
    pub(crate) fn new(targets: usize, policy: CooldownPolicy) -> Self {
        Self {
            targets: (0..targets).map(|_| Mutex::default()).collect(),
            policy,
        }
    }

    fn lock(&self, index: usize) -> Option<std::sync::MutexGuard<'_, TargetHealth>> {
        self.targets
            .get(index)
            .map(|m| m.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The target's availability now.
    pub fn availability(&self, index: usize) -> Availability {
        match self.lock(index) {
            Some(health) => self.availability_of(&health),
            None => Availability::Healthy,
        }
    }

    fn availability_of(&self, health: &TargetHealth) -> Availability {
        let now = Instant::now();
        match health.cooling_until {
            None => Availability::Healthy,
            Some(until) if until > now => Availability::Cooling(until),
            Some(_) => match health.probe_started {
                Some(started) if now.duration_since(started) < self.policy.probe_timeout => {
                    Availability::Probing
                }
                _ => Availability::Probe,
            },
        }
    }

    /// Smoothed time to first output of recent successes.
    pub fn time_to_first_output(&self, index: usize) -> Option<Duration> {
        self.lock(index).and_then(|h| h.ttft_ewma)
    }

    /// Admits a request if the target is healthy, or as its probe. Decided
    /// and marked under one lock, so two turns never both become the probe.
    pub(crate) fn admit(self: &Arc<Self>, index: usize) -> Option<Admitted> {
        let mut health = self.lock(index)?;
        let probe = match self.availability_of(&health) {
            Availability::Healthy => false,
            Availability::Probe => {
                health.probe_started = Some(Instant::now());
                true
            }
            Availability::Cooling(_) | Availability::Probing => return None,
        };
        drop(health);
        Some(Admitted {
            health: Arc::clone(self),
            index,
            probe,
        })
    }

    pub(crate) fn on_success(&self, index: usize, ttft: Option<Duration>) {
        let Some(mut health) = self.lock(index) else {
            return;
        };
        if health.cooling_until.is_some() {
            tracing::info!(target_index = index, "target recovered; back in rotation");
        }
        health.cooling_until = None;
        health.probe_started = None;
        health.consecutive_failures = 0;
        health.record_ttft(ttft);
    }

    /// A committed stream ended: whole (`None`) or with a failure.
    pub(crate) fn on_stream_end(&self, index: usize, failure: Option<&Classification>) {
        match failure {
            None => {
                if let Some(mut health) = self.lock(index) {
                    health.consecutive_failures = 0;
                }
            }
            Some(failure) => {
                self.on_failure(index, failure, false);
            }
        }
    }

    /// Records a failure; returns the cooldown it started, if any.
    /// `was_probe`: this request held the probe slot, which it gives back.
    pub(crate) fn on_failure(
        &self,
        index: usize,
        failure: &Classification,
        was_probe: bool,
    ) -> Option<Duration> {
        let mut health = self.lock(index)?;
        if was_probe {
            health.probe_started = None;
        }
        if failure.class.is_request_error() || failure.class == FailureClass::Cancelled {
            // Says nothing about the target.
            return None;
        }
        health.consecutive_failures = health.consecutive_failures.saturating_add(1);
        let was_cooling = health.cooling_until.is_some();
        let cooldown = self
            .policy
            .cooldown(failure, health.consecutive_failures)
            // A failed probe rests again for at least the base time.
            .or(was_cooling.then_some(self.policy.repeated_base));
        if let Some(cooldown) = cooldown {
            health.cooling_until = Some(super::later(Instant::now(), cooldown));
            tracing::warn!(
                target_index = index,
                class = %failure.class,
                cooldown_ms = cooldown.as_millis() as u64,
                "target cooling down"
            );
        }
        cooldown
    }
}
