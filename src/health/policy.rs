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
///
/// Plain data: set the fields you need and take the rest from `Default`.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::health::{CooldownPolicy, MemoryHealthStore};
///
/// // Five hintless failures within a minute cool a model; a model-scope
/// // rest never passes 20 s.
/// let policy = CooldownPolicy {
///     failure_threshold: 5,
///     failure_window: Duration::from_secs(60),
///     max_probe_interval: Duration::from_secs(20),
///     ..CooldownPolicy::default()
/// };
/// let store = MemoryHealthStore::new(policy);
/// # let _ = store;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CooldownPolicy {
    /// Cooldown of account-scope failures without a hint.
    pub account: Duration,
    /// Hintless model-scope failures inside the window that start a
    /// cooldown (0 acts as 1; `u32::MAX`: such failures never cool a key).
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
