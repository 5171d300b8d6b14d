//! Money and tokens: what a turn spends.

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign, Sub};

/// Token usage a provider reported, in any dialect's terms: tokens read
/// and tokens written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Usage {
    /// Input tokens (a prompt's, a request's).
    pub input_tokens: u64,
    /// Output tokens (the model's answer, reasoning included).
    pub output_tokens: u64,
    /// Of the input tokens, those read from the provider's prompt cache
    /// (chat completions' `prompt_tokens_details.cached_tokens`, Messages'
    /// `cache_read_input_tokens`); 0 when not reported.
    pub cached_input_tokens: u64,
}

impl Usage {
    /// Usage of `input_tokens` in and `output_tokens` out.
    pub fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
            cached_input_tokens: 0,
        }
    }
}

const NANOS_PER_USD: u64 = 1_000_000_000;

/// An amount of money in nano-USD (10⁻⁹ USD).
///
/// An integer so a turn's spend can be added atomically and compared exactly;
/// a nano-dollar is far below the price of one token at any provider, and a
/// `u64` still holds more than 18 billion USD. Arithmetic saturates.
///
/// ```
/// use tower_llm_failover::Cost;
///
/// let cost = Cost::from_usd(0.0125);
/// assert_eq!(cost.as_nanos(), 12_500_000);
/// assert_eq!(cost.to_string(), "$0.0125");
/// assert_eq!((cost + cost).to_string(), "$0.025");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Cost(u64);

impl Cost {
    /// No money.
    pub const ZERO: Cost = Cost(0);
    /// The largest amount a `Cost` holds.
    pub const MAX: Cost = Cost(u64::MAX);

    /// An amount given in nano-USD.
    pub const fn from_nanos(nanos: u64) -> Self {
        Cost(nanos)
    }

    /// An amount given in USD, rounded to the nearest nano-USD.
    ///
    /// Negative and NaN amounts become zero, amounts too large saturate at
    /// [`Cost::MAX`]: a price read from a config file never panics here.
    pub fn from_usd(usd: f64) -> Self {
        let nanos = (usd * NANOS_PER_USD as f64).round();
        if nanos.is_nan() || nanos <= 0.0 {
            Cost::ZERO
        } else if nanos >= u64::MAX as f64 {
            Cost::MAX
        } else {
            // In range and non-negative: the cast is exact up to f64 precision.
            Cost(nanos as u64)
        }
    }

    /// The amount in nano-USD.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The amount in USD (for display and metrics, not for accounting).
    pub fn as_usd(self) -> f64 {
        self.0 as f64 / NANOS_PER_USD as f64
    }

    /// Whether this is no money at all.
    pub(crate) const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// `self + other`, saturating at [`Cost::MAX`].
    pub(crate) const fn saturating_add(self, other: Cost) -> Cost {
        Cost(self.0.saturating_add(other.0))
    }

    /// `self - other`, saturating at zero.
    pub(crate) const fn saturating_sub(self, other: Cost) -> Cost {
        Cost(self.0.saturating_sub(other.0))
    }
}

impl Add for Cost {
    type Output = Cost;

    /// Saturating addition.
    fn add(self, rhs: Cost) -> Cost {
        self.saturating_add(rhs)
    }
}

impl Sub for Cost {
    type Output = Cost;

    /// Saturating subtraction: never below zero.
    fn sub(self, rhs: Cost) -> Cost {
        self.saturating_sub(rhs)
    }
}

impl AddAssign for Cost {
    fn add_assign(&mut self, rhs: Cost) {
        *self = self.saturating_add(rhs);
    }
}

impl Sum for Cost {
    fn sum<I: Iterator<Item = Cost>>(iter: I) -> Cost {
        iter.fold(Cost::ZERO, Cost::saturating_add)
    }
}

impl fmt::Display for Cost {
    /// `$` followed by the amount in USD with at least two decimals and no
    /// trailing zeros past them: `$0.00`, `$1.50`, `$0.000125`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / NANOS_PER_USD;
        let frac = self.0 % NANOS_PER_USD;
        let digits = format!("{frac:09}");
        let trimmed = digits.trim_end_matches('0');
        let shown = if trimmed.len() < 2 {
            &digits[..2]
        } else {
            trimmed
        };
        write!(f, "${whole}.{shown}")
    }
}
