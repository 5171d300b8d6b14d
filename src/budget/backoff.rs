//! Backoff between attempts on the same target.

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Exponential backoff with jitter between attempts on the same target,
/// honouring the provider's own retry hint. The failover layer takes it
/// from the turn's [`TurnLimits`](super::TurnLimits).
///
/// Defaults follow the official OpenAI SDKs: 0.5 s before the first retry,
/// doubling per retry, capped at 8 s, each delay multiplied by a jitter
/// factor drawn from `[0.75, 1]`. A provider hint (`retry-after-ms`,
/// `retry-after`, Gemini `RetryInfo.retryDelay`) replaces the computed
/// delay, without jitter, when it is at most
/// [`max_server_delay`](Backoff::max_server_delay) (120 s by default); past
/// that the hint means "this target will not serve you soon" and the
/// failover layer reroutes instead of sleeping. A hint of zero is taken as
/// no hint (as the OpenAI SDKs do), so a `retry-after: 0` never turns into
/// a tight loop.
///
/// Plain data but for the jitter source: start from [`Backoff::new`] and
/// set the fields you need. Cloning shares the jitter source.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::budget::{Backoff, TurnLimits};
///
/// let mut backoff = Backoff::new().jitter_seed(7);
/// backoff.initial = Duration::from_millis(200);
/// backoff.max = Duration::from_secs(2);
/// let limits = TurnLimits { backoff, ..TurnLimits::new() };
/// # let _ = limits;
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    /// The delay before the first retry (default 0.5 s).
    pub initial: Duration,
    /// The growth factor per retry (default 2). Values below 1 (and NaN)
    /// are taken as 1: a backoff never shrinks.
    pub multiplier: f64,
    /// The cap on computed delays (default 8 s; provider hints have their
    /// own cap, [`max_server_delay`](Self::max_server_delay)).
    pub max: Duration,
    /// The jitter fraction `j` (default 0.25): each computed delay is
    /// multiplied by a factor drawn from `[1 - j, 1]`. Taken within
    /// `[0, 1]`; NaN means no jitter.
    pub jitter: f64,
    /// The longest provider-directed wait that is honoured (default 120 s);
    /// a longer hint reroutes (or, with no other target left, stops the
    /// turn with the original failure).
    pub max_server_delay: Duration,
    rng: Jitter,
}

#[derive(Debug, Clone)]
enum Jitter {
    /// fastrand's thread-local generator.
    Thread,
    /// A seeded generator shared by clones, for reproducible tests.
    Seeded(Arc<Mutex<fastrand::Rng>>),
}

impl Jitter {
    fn unit(&self) -> f64 {
        match self {
            Jitter::Thread => fastrand::f64(),
            // A poisoned lock still holds a usable generator.
            Jitter::Seeded(rng) => match rng.lock() {
                Ok(mut rng) => rng.f64(),
                Err(poisoned) => poisoned.into_inner().f64(),
            },
        }
    }
}

/// What [`Backoff::delay`] advises before the next attempt on the same target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delay {
    /// Wait this long, then try the same target again.
    Wait(Duration),
    /// The provider asked for a wait longer than the configured maximum
    /// server-directed delay: don't wait for this target, reroute (or stop
    /// with the original failure when no other target is eligible).
    HintTooLong {
        /// The wait the provider asked for.
        asked: Duration,
        /// The configured maximum.
        max: Duration,
    },
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// The OpenAI-SDK defaults: 0.5 s initial, ×2, 8 s cap, jitter factor in
    /// `[0.75, 1]`, hints honoured up to 120 s.
    pub fn new() -> Self {
        Self {
            initial: Duration::from_millis(500),
            multiplier: 2.0,
            max: Duration::from_secs(8),
            jitter: 0.25,
            max_server_delay: Duration::from_secs(120),
            rng: Jitter::Thread,
        }
    }

    /// Draw jitter from a generator seeded with `seed` (shared by clones),
    /// so tests see the same delays on every run.
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.rng = Jitter::Seeded(Arc::new(Mutex::new(fastrand::Rng::with_seed(seed))));
        self
    }

    /// The delay before retry number `retry_index + 1` on the same target
    /// (`retry_index` 0 is the first retry), given the provider's hint if any.
    ///
    /// A hint of zero is treated as no hint (as the OpenAI SDKs do), so a
    /// `retry-after: 0` never turns into a tight loop.
    pub(crate) fn delay(&self, retry_index: u32, hint: Option<Duration>) -> Delay {
        match hint {
            Some(asked) if asked > self.max_server_delay => Delay::HintTooLong {
                asked,
                max: self.max_server_delay,
            },
            Some(asked) if !asked.is_zero() => Delay::Wait(asked),
            _ => Delay::Wait(self.computed(retry_index)),
        }
    }

    /// The jittered exponential delay, ignoring hints.
    fn computed(&self, retry_index: u32) -> Duration {
        // powi past 2^64 is already far beyond any cap; bound the exponent so
        // the float stays finite.
        let exponent = i32::try_from(retry_index.min(64)).unwrap_or(64);
        // Below 1 (or NaN) a backoff would shrink: taken as 1.
        let multiplier = if self.multiplier >= 1.0 {
            self.multiplier
        } else {
            1.0
        };
        let jitter = if self.jitter.is_nan() {
            0.0
        } else {
            self.jitter.clamp(0.0, 1.0)
        };
        let base =
            (self.initial.as_secs_f64() * multiplier.powi(exponent)).min(self.max.as_secs_f64());
        let factor = 1.0 - self.rng.unit() * jitter;
        Duration::try_from_secs_f64(base * factor).unwrap_or(self.max)
    }
}

#[cfg(test)]
impl Delay {
    /// The wait, unless the advice is not to wait for this target.
    pub(crate) fn wait(self) -> Option<Duration> {
        match self {
            Delay::Wait(d) => Some(d),
            Delay::HintTooLong { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_and_caps_within_jitter_bounds() {
        let b = Backoff::new().jitter_seed(42);
        for round in 0..50 {
            for i in 0..10u32 {
                let base = (0.5 * 2f64.powi(i as i32)).min(8.0);
                let d = b.delay(i, None).wait().unwrap().as_secs_f64();
                assert!(
                    d >= base * 0.75 - 1e-9 && d <= base + 1e-9,
                    "round {round} retry {i}: {d} outside [{}, {base}]",
                    base * 0.75
                );
            }
        }
    }

    #[test]
    fn seeded_jitter_is_reproducible() {
        let a = Backoff::new().jitter_seed(9);
        let b = Backoff::new().jitter_seed(9);
        let xs: Vec<_> = (0..8).map(|i| a.delay(i, None)).collect();
        let ys: Vec<_> = (0..8).map(|i| b.delay(i, None)).collect();
        assert_eq!(xs, ys);
    }

    #[test]
    fn no_jitter_is_exact() {
        let b = Backoff {
            jitter: 0.0,
            ..Backoff::new()
        };
        let got: Vec<_> = (0..6).map(|i| b.delay(i, None).wait().unwrap()).collect();
        let want: Vec<_> = [500, 1000, 2000, 4000, 8000, 8000]
            .into_iter()
            .map(Duration::from_millis)
            .collect();
        assert_eq!(got, want);
        // Huge retry indexes stay at the cap.
        assert_eq!(b.delay(u32::MAX, None), Delay::Wait(Duration::from_secs(8)));
    }

    #[test]
    fn the_multiplier_sets_the_growth_and_below_one_never_shrinks_a_delay() {
        let exact = |b: Backoff| -> Vec<Duration> {
            (0..3).map(|i| b.delay(i, None).wait().unwrap()).collect()
        };
        let tripled = Backoff {
            jitter: 0.0,
            multiplier: 3.0,
            ..Backoff::new()
        };
        assert_eq!(exact(tripled), [500, 1500, 4500].map(Duration::from_millis));
        // 0.5 is taken as 1: each retry waits the initial delay, no less.
        let halved = Backoff {
            jitter: 0.0,
            multiplier: 0.5,
            ..Backoff::new()
        };
        assert_eq!(exact(halved), [500, 500, 500].map(Duration::from_millis));
    }

    #[test]
    fn hints() {
        let b = Backoff {
            max_server_delay: Duration::from_secs(60),
            ..Backoff::new()
        };
        assert_eq!(
            b.delay(5, Some(Duration::from_millis(1500))),
            Delay::Wait(Duration::from_millis(1500))
        );
        assert_eq!(
            b.delay(0, Some(Duration::from_secs(60))),
            Delay::Wait(Duration::from_secs(60))
        );
        assert_eq!(
            b.delay(0, Some(Duration::from_secs(61))),
            Delay::HintTooLong {
                asked: Duration::from_secs(61),
                max: Duration::from_secs(60)
            }
        );
        let zero = b.delay(0, Some(Duration::ZERO)).wait().unwrap();
        assert!(zero >= Duration::from_millis(375));
    }

    #[test]
    fn bad_settings_are_sanitized() {
        let b = Backoff {
            multiplier: f64::NAN,
            jitter: f64::NAN,
            initial: Duration::from_secs(1),
            ..Backoff::new()
        };
        assert_eq!(b.delay(3, None), Delay::Wait(Duration::from_secs(1)));
        let b = Backoff {
            multiplier: 1e308,
            jitter: 5.0,
            ..Backoff::new().jitter_seed(1)
        };
        let d = b.delay(64, None).wait().unwrap();
        assert!(d <= Duration::from_secs(8));
    }
}
