//! Money, prices and reported token usage.

use crate::Cost;

/// A target's price per million input (prompt) and output (completion)
/// tokens, the way providers publish it.
///
/// ```
/// use tower_llm_failover::{Cost, budget::Pricing};
///
/// // 2.50 USD per million input tokens, 10 USD per million output tokens.
/// let price = Pricing::per_million_usd(2.50, 10.0);
/// assert_eq!(price.cost(1_000, 500), Cost::from_usd(0.0075));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Pricing {
    /// Price of one million input tokens.
    pub input_per_million: Cost,
    /// Price of one million output tokens.
    pub output_per_million: Cost,
}

impl Pricing {
    /// A price given in USD per million tokens (the providers' price lists;
    /// the fields take [`Cost`]s directly).
    pub fn per_million_usd(input: f64, output: f64) -> Self {
        Self {
            input_per_million: Cost::from_usd(input),
            output_per_million: Cost::from_usd(output),
        }
    }

    /// What `input_tokens` in and `output_tokens` out cost.
    ///
    /// Computed exactly in integers and rounded up to the next nano-USD, so
    /// a ceiling check never under-counts; saturates instead of overflowing.
    pub fn cost(&self, input_tokens: u64, output_tokens: u64) -> Cost {
        // Each product fits a u128; only their sum can overflow.
        let nanos_times_million = (u128::from(input_tokens)
            * u128::from(self.input_per_million.as_nanos()))
        .saturating_add(u128::from(output_tokens) * u128::from(self.output_per_million.as_nanos()));
        let nanos = nanos_times_million.div_ceil(1_000_000);
        Cost::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// Token usage of one finished upstream call, as the provider reported it or
/// as estimated when the provider reported none.
///
/// An inner service puts it in the response extensions; a
/// [`BudgetLayer`](super::BudgetLayer) with a [`Pricing`] then records its cost
/// in the turn's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReportedUsage {
    /// Input (prompt) tokens.
    pub input_tokens: u64,
    /// Output (completion) tokens, reasoning tokens included.
    pub output_tokens: u64,
    /// `true` when the numbers are an estimate (no usage was reported, e.g.
    /// from the prompt size and the output seen).
    pub estimated: bool,
}

impl ReportedUsage {
    /// Usage the provider reported.
    pub const fn reported(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
            estimated: false,
        }
    }

    /// Usage estimated by the gateway.
    pub const fn estimated(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
            estimated: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_usd_rounds_and_clamps() {
        assert_eq!(Cost::from_usd(1.0).as_nanos(), 1_000_000_000);
        assert_eq!(Cost::from_usd(0.000_000_000_4), Cost::ZERO);
        assert_eq!(Cost::from_usd(0.000_000_000_6).as_nanos(), 1);
        assert_eq!(Cost::from_usd(-3.0), Cost::ZERO);
        assert_eq!(Cost::from_usd(f64::NAN), Cost::ZERO);
        assert_eq!(Cost::from_usd(f64::INFINITY), Cost::MAX);
        assert_eq!(Cost::from_usd(1e300), Cost::MAX);
        assert!((Cost::from_usd(3.25).as_usd() - 3.25).abs() < 1e-12);
    }

    #[test]
    fn display() {
        assert_eq!(Cost::ZERO.to_string(), "$0.00");
        assert_eq!(Cost::from_usd(1.5).to_string(), "$1.50");
        assert_eq!(Cost::from_usd(12.0).to_string(), "$12.00");
        assert_eq!(Cost::from_usd(0.000125).to_string(), "$0.000125");
        assert_eq!(Cost::from_nanos(1).to_string(), "$0.000000001");
    }

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Cost::MAX + Cost::from_nanos(1), Cost::MAX);
        assert_eq!(Cost::ZERO.saturating_sub(Cost::from_nanos(1)), Cost::ZERO);
        let total: Cost = [1, 2, 3].into_iter().map(Cost::from_nanos).sum();
        assert_eq!(total.as_nanos(), 6);
    }

    #[test]
    fn pricing_is_exact_and_rounds_up() {
        let p = Pricing::per_million_usd(3.0, 15.0);
        assert_eq!(p.cost(1_000_000, 0), Cost::from_usd(3.0));
        assert_eq!(p.cost(0, 1_000_000), Cost::from_usd(15.0));
        assert_eq!(p.cost(0, 0), Cost::ZERO);
        // 1 token at 3 USD/M = 3000 nano-USD exactly.
        assert_eq!(p.cost(1, 0).as_nanos(), 3_000);
        // A price of 1 nano-USD per million rounds one token up to 1 nano-USD.
        let tiny = Pricing {
            input_per_million: Cost::from_nanos(1),
            output_per_million: Cost::ZERO,
        };
        assert_eq!(tiny.cost(1, 0).as_nanos(), 1);
        assert_eq!(
            Pricing {
                input_per_million: Cost::MAX,
                output_per_million: Cost::MAX,
            }
            .cost(u64::MAX, u64::MAX),
            Cost::MAX
        );
        assert_eq!(p.cost(1_000_000, 1_000_000), Cost::from_usd(18.0));
    }
}
