//! How long a key rests after failures.

use std::time::Duration;

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
///   the provider's fault; see the report's witness), every other
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
