//! Hedged attempts: when the running attempt is slow to commit, race one
//! more target, and let the first to commit win.
//!
//! Safe only because nothing reaches the client before commit: racing
//! attempts are all held, and the first to reach its commit point is the
//! one whose bytes are released. The others are dropped at once, which
//! closes their upstream connections.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::budget::{RetryBudget, RetryBudgetConfig};
use crate::dialect::{Message, NeutralRequest, Part};

/// When a hedge starts: how long the running attempt may go without
/// committing first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HedgeAfter {
    /// A fixed wait from the attempt's start.
    Fixed(Duration),
    /// A percentile of the target's recent time to commit, never below
    /// `floor`.
    Percentile {
        /// The percentile, within 1 ..= 99.9.
        percentile: f64,
        /// The shortest wait; also the wait until the target has
        /// 20 samples.
        floor: Duration,
    },
}

/// Samples a target needs before its percentile is used (until then the
/// floor is).
pub(crate) const MIN_SAMPLES: usize = 20;

/// The samples kept per target (the most recent).
const WINDOW: usize = 128;

/// A hedge policy ([`FailoverBuilder::hedge`](super::FailoverBuilder::hedge)):
/// off unless given. A hedge is an attempt like any other: it counts
/// toward the turn's attempts and deadline, and its estimated cost is
/// reserved under the turn's spend ceiling while it runs.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_failover::failover::Hedge;
///
/// let fixed = Hedge::after(Duration::from_millis(400));
/// let adaptive = Hedge::percentile(95.0, Duration::from_millis(250))
///     .with_budget_percent(5.0)
///     .with_unhedgeable_tools(["send_email"]);
/// assert_eq!(adaptive.max_hedges(), 1);
/// # let _ = fixed;
/// ```
#[derive(Debug, Clone)]
pub struct Hedge {
    after: HedgeAfter,
    max_hedges: u32,
    pub(crate) budget: RetryBudget,
    unhedgeable_tools: Vec<String>,
}

impl Hedge {
    /// Hedge an attempt that has not committed `after` its start.
    pub fn after(after: Duration) -> Self {
        Self::new(HedgeAfter::Fixed(after))
    }

    /// Hedge an attempt that has not committed within `percentile` (1 ..=
    /// 99.9, clamped) of its target's recent times to commit, and never
    /// sooner than `floor`.
    pub fn percentile(percentile: f64, floor: Duration) -> Self {
        let percentile = if percentile.is_nan() {
            95.0
        } else {
            percentile.clamp(1.0, 99.9)
        };
        Self::new(HedgeAfter::Percentile { percentile, floor })
    }

    fn new(after: HedgeAfter) -> Self {
        Self {
            after,
            max_hedges: 1,
            budget: budget_of(5.0),
            unhedgeable_tools: Vec::new(),
        }
    }

    /// At most this many hedges per turn (default 1).
    pub fn with_max_hedges(mut self, max: u32) -> Self {
        self.max_hedges = max;
        self
    }

    /// Hedges may be at most `percent` of first attempts over the last
    /// ten seconds (default 5; clamped to 0 ..= 100,000: above 100, more
    /// than one hedge per first attempt, for `max_hedges` above 1). When
    /// the budget is spent, a slow attempt is waited on, as without
    /// hedging.
    pub fn with_budget_percent(mut self, percent: f32) -> Self {
        self.budget = budget_of(percent);
        self
    }

    /// Draws hedges from `budget` instead (one shared by a fleet, say):
    /// every first attempt deposits, every hedge withdraws.
    pub fn with_budget(mut self, budget: RetryBudget) -> Self {
        self.budget = budget;
        self
    }

    /// A request that carries the result of a call to one of these tools
    /// is never hedged (the tools a route marks as not idempotent).
    pub fn with_unhedgeable_tools<I, T>(mut self, tools: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.unhedgeable_tools = tools.into_iter().map(Into::into).collect();
        self
    }

    /// The most hedges per turn.
    pub fn max_hedges(&self) -> u32 {
        self.max_hedges
    }
}

/// A budget granting `percent` % of first attempts, with no reserve: a
/// hedge is earned by traffic, never by a quiet gateway.
fn budget_of(percent: f32) -> RetryBudget {
    let percent = if percent.is_nan() {
        5.0
    } else {
        percent.clamp(0.0, 100_000.0)
    };
    let config = RetryBudgetConfig {
        ttl: Duration::from_secs(10),
        min_per_sec: 0,
        retry_percent: percent / 100.0,
    };
    // The settings above are always in range; a refusal would mean no
    // hedges at all, the safe side.
    RetryBudget::new(config).unwrap_or_else(|_| RetryBudget::from_budget(NoHedges))
}

/// A budget that grants nothing.
struct NoHedges;

impl tower::retry::budget::Budget for NoHedges {
    fn deposit(&self) {}
    fn withdraw(&self) -> bool {
        false
    }
}

/// A policy in use: the settings and each target's recent times to
/// commit.
#[derive(Debug)]
pub(crate) struct Hedging {
    pub(crate) policy: Hedge,
    /// Per target index (each stream and whole answer apart: their times
    /// differ by the length of the answer).
    windows: Vec<[Mutex<Window>; 2]>,
}

impl Hedging {
    pub(crate) fn new(policy: Hedge, targets: usize) -> Self {
        Self {
            policy,
            windows: (0..targets).map(|_| Default::default()).collect(),
        }
    }

    /// How long an attempt on `target` may run uncommitted before a hedge.
    pub(crate) fn wait(&self, target: usize, stream: bool) -> Duration {
        match self.policy.after {
            HedgeAfter::Fixed(after) => after,
            HedgeAfter::Percentile { percentile, floor } => self
                .window(target, stream)
                .and_then(|w| lock(w).percentile(percentile))
                .map_or(floor, |p| p.max(floor)),
        }
    }

    /// An attempt on `target` committed after `took`, or lost a race
    /// after `took` (then its time to commit was at least that: counting
    /// it keeps the percentile from learning only the fast answers).
    pub(crate) fn observe(&self, target: usize, stream: bool, took: Duration) {
        if let HedgeAfter::Percentile { .. } = self.policy.after
            && let Some(window) = self.window(target, stream)
        {
            lock(window).push(took);
        }
    }

    fn window(&self, target: usize, stream: bool) -> Option<&Mutex<Window>> {
        self.windows.get(target).map(|w| &w[usize::from(stream)])
    }

    /// Whether `request` may be hedged: not when it returns the result of
    /// a tool the route marked as not idempotent (or when it cannot be
    /// read for tools, and any are marked).
    /// `request` is asked for only when some tool is marked.
    pub(crate) fn allows_tools<'r>(
        &self,
        request: impl FnOnce() -> Option<&'r NeutralRequest>,
    ) -> bool {
        let tools = &self.policy.unhedgeable_tools;
        if tools.is_empty() {
            return true;
        }
        let Some(request) = request() else {
            return false;
        };
        !tool_results(request).any(|name| tools.iter().any(|t| t == name))
    }
}

/// The names of the tools whose results `request` carries (each result
/// names its call; the call, in an earlier assistant message, names the
/// tool). A result whose call is not in the request is named `""`.
fn tool_results(request: &NeutralRequest) -> impl Iterator<Item = &str> {
    request.messages.iter().filter_map(move |message| {
        let Message::Tool { call_id, .. } = message else {
            return None;
        };
        let name = request
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::Assistant(parts) => Some(parts),
                _ => None,
            })
            .flatten()
            .find_map(|part| match part {
                Part::ToolCall { id, name, .. } if id == call_id => Some(name.as_str()),
                _ => None,
            });
        Some(name.unwrap_or(""))
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The most recent times to commit of one target, in microseconds, and
/// the percentile last computed from them (recomputed every eighth
/// sample: a turn reads it, and sorting on every read would cost more
/// than the hedge saves).
#[derive(Debug)]
struct Window {
    samples: [u32; WINDOW],
    len: usize,
    next: usize,
    since_sorted: usize,
    cached: Option<(f64, Duration)>,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            samples: [0; WINDOW],
            len: 0,
            next: 0,
            since_sorted: 0,
            cached: None,
        }
    }
}

impl Window {
    fn push(&mut self, took: Duration) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        self.samples[self.next] = micros;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
        self.since_sorted += 1;
    }

    fn percentile(&mut self, percentile: f64) -> Option<Duration> {
        if self.len < MIN_SAMPLES {
            return None;
        }
        match self.cached {
            Some((p, value)) if p == percentile && self.since_sorted < 8 => return Some(value),
            _ => {}
        }
        let mut sorted = self.samples;
        let sorted = &mut sorted[..self.len];
        sorted.sort_unstable();
        // Nearest rank.
        let rank = ((percentile / 100.0) * self.len as f64).ceil() as usize;
        let value = Duration::from_micros(u64::from(sorted[rank.clamp(1, self.len) - 1]));
        self.cached = Some((percentile, value));
        self.since_sorted = 0;
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_percentile_waits_for_enough_samples_and_keeps_its_floor() {
        let hedging = Hedging::new(Hedge::percentile(90.0, ms(50)), 1);
        for _ in 0..MIN_SAMPLES - 1 {
            hedging.observe(0, true, ms(400));
        }
        assert_eq!(hedging.wait(0, true), ms(50), "too few samples: the floor");
        hedging.observe(0, true, ms(400));
        assert_eq!(hedging.wait(0, true), ms(400));
        assert_eq!(hedging.wait(0, false), ms(50), "whole answers apart");
        let low = Hedging::new(Hedge::percentile(90.0, ms(50)), 1);
        for _ in 0..MIN_SAMPLES {
            low.observe(0, true, ms(10));
        }
        assert_eq!(low.wait(0, true), ms(50), "never below the floor");
    }

    #[test]
    fn the_percentile_is_the_nearest_rank_of_recent_samples() {
        let hedging = Hedging::new(Hedge::percentile(90.0, ms(1)), 1);
        // 90 fast, 10 slow: p90 is the 90th sample, fast.
        for i in 0..100 {
            hedging.observe(0, true, if i % 10 == 0 { ms(3000) } else { ms(100) });
        }
        assert_eq!(hedging.wait(0, true), ms(100));
        let p95 = Hedging::new(Hedge::percentile(95.0, ms(1)), 1);
        for i in 0..100 {
            p95.observe(0, true, if i % 10 == 0 { ms(3000) } else { ms(100) });
        }
        assert_eq!(p95.wait(0, true), ms(3000));
        // Only the last 128 count.
        for _ in 0..WINDOW {
            p95.observe(0, true, ms(120));
        }
        assert_eq!(p95.wait(0, true), ms(120));
    }

    #[test]
    fn a_fixed_wait_is_what_was_set() {
        let hedging = Hedging::new(Hedge::after(ms(400)), 2);
        hedging.observe(1, true, ms(5));
        assert_eq!(hedging.wait(1, true), ms(400));
        assert_eq!(hedging.wait(7, true), ms(400), "any index");
    }

    fn with_tool_result(tool: &str) -> NeutralRequest {
        NeutralRequest {
            messages: vec![
                Message::User(vec![Part::Text("pay it".into())]),
                Message::Assistant(vec![Part::ToolCall {
                    id: "call_1".into(),
                    name: tool.into(),
                    arguments: "{}".into(),
                }]),
                Message::Tool {
                    call_id: "call_1".into(),
                    content: vec![Part::Text("done".into())],
                    is_error: false,
                },
            ],
            ..NeutralRequest::default()
        }
    }

    #[test]
    fn a_result_of_an_unhedgeable_tool_is_never_hedged() {
        let hedging = Hedging::new(
            Hedge::after(ms(1)).with_unhedgeable_tools(["charge_card"]),
            1,
        );
        let (paying, asking) = (
            with_tool_result("charge_card"),
            with_tool_result("get_weather"),
        );
        assert!(!hedging.allows_tools(|| Some(&paying)));
        assert!(hedging.allows_tools(|| Some(&asking)));
        let none = NeutralRequest::default();
        assert!(hedging.allows_tools(|| Some(&none)));
        assert!(!hedging.allows_tools(|| None), "unreadable: not hedged");
        let open = Hedging::new(Hedge::after(ms(1)), 1);
        assert!(
            open.allows_tools(|| panic!("no tools marked: the request is not read")),
            "no tools marked"
        );
    }
}
