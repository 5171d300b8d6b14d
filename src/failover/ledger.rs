//! The records and the spend of attempts, built in one place each.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use super::decision::Decision;
use crate::budget::{Cost, Pricing, TurnBudget};
use crate::dialect::Usage;
use crate::record::AttemptRecord;

/// Who made an attempt and when: what every record of it starts from.
#[derive(Debug, Clone)]
pub(super) struct AttemptStart {
    pub(super) number: u32,
    pub(super) target: Arc<str>,
    pub(super) provider: Arc<str>,
    pub(super) upstream_model: String,
    pub(super) wall: SystemTime,
    pub(super) clock: Instant,
}

impl AttemptStart {
    /// The attempt's record so far: who, when, how long, and `decision`;
    /// everything else empty for the caller to fill.
    pub(super) fn record(&self, decision: Decision) -> AttemptRecord {
        AttemptRecord {
            attempt: self.number,
            target: Arc::clone(&self.target),
            provider: Arc::clone(&self.provider),
            upstream_model: self.upstream_model.clone(),
            response_model: None,
            started: self.wall,
            duration: self.clock.elapsed(),
            class: None,
            phase: None,
            status: None,
            bytes_flushed: 0,
            output_events: 0,
            time_to_first_output: None,
            usage: None,
            cost: None,
            estimated: false,
            message: None,
            decision,
        }
    }
}

/// What an attempt used and cost, as charged to its turn.
#[derive(Debug, Clone, Copy)]
pub(super) struct Charge {
    pub(super) usage: Usage,
    pub(super) cost: Option<Cost>,
    pub(super) estimated: bool,
}

impl Charge {
    /// Charges the turn for an attempt: the usage the provider reported,
    /// or `estimate` (marked as such) when it reported none, at the
    /// target's price.
    pub(super) fn to_turn(
        budget: &TurnBudget,
        pricing: Option<Pricing>,
        reported: Option<Usage>,
        estimate: Usage,
    ) -> Self {
        let (usage, estimated) = match reported {
            Some(usage) => (usage, false),
            None => (estimate, true),
        };
        let cost = pricing.map(|p| p.cost(usage.prompt_tokens, usage.completion_tokens));
        if let Some(cost) = cost {
            budget.record_spend(cost, estimated);
        }
        Self {
            usage,
            cost,
            estimated,
        }
    }

    /// Fills a record's usage, cost and estimate flag.
    pub(super) fn fill(&self, record: &mut AttemptRecord) {
        record.usage = Some(self.usage);
        record.cost = self.cost;
        record.estimated = self.estimated;
    }
}
