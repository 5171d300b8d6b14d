//! Errors of the budget layer, its response future and its body.

use std::error::Error as StdError;

use super::turn::BudgetExhausted;

impl BudgetExhausted {
    /// Find a `BudgetExhausted` in an error or its chain of sources.
    pub fn find_in<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a BudgetExhausted> {
        crate::util::find_in_chain(error)
    }
}
