//! The records and the spend of attempts, built in one place each.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use crate::Decision;
use crate::Usage;
use crate::stream::StreamState;
use crate::{Cost, budget::Pricing, budget::TurnBudget};
use crate::{FailureClass, Phase};
use crate::{observe::AttemptRecord, observe::TurnRecord};

/// Who made an attempt and when: what every record of it starts from.
#[derive(Debug, Clone)]
pub(super) struct AttemptStart {
    pub(super) number: u32,
    pub(super) target: Arc<str>,
    pub(super) provider: Arc<str>,
    pub(super) upstream_model: Arc<str>,
    /// The target's dialect's name.
    pub(super) dialect: &'static str,
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
            upstream_model: Arc::clone(&self.upstream_model),
            dialect: self.dialect,
            response_model: None,
            response_id: None,
            finish_reason: None,
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
            rate_limits: Default::default(),
            decision,
            retry_wait: None,
            hedged: false,
            time_to_commit: None,
        }
    }
}

/// An attempt in flight. If the turn is dropped before the attempt ends
/// (the client left, an outer layer answered first), the attempt still
/// leaves its record: cancelled, in the preamble, nothing flushed, and
/// charged an estimate (the provider goes on with a request it took).
pub(super) struct InFlight<'a> {
    run: &'a TurnRecord,
    start: Option<AttemptStart>,
    unfinished: Unfinished<'a>,
}

/// What a cancelled attempt is charged from.
pub(super) struct Unfinished<'a> {
    pub(super) budget: &'a TurnBudget,
    pub(super) pricing: Option<Pricing>,
    pub(super) input_tokens: u64,
    /// Output assumed for an answer cut before it came (a whole answer's
    /// `max_tokens`; zero for a stream, whose output is counted).
    pub(super) output_if_cut: u64,
    /// The attempt's stream, for the output seen so far (none for a whole
    /// answer, which has no output until it is received).
    pub(super) state: Option<StreamState>,
}

impl<'a> InFlight<'a> {
    pub(super) fn new(
        run: &'a TurnRecord,
        start: AttemptStart,
        unfinished: Unfinished<'a>,
    ) -> Self {
        Self {
            run,
            start: Some(start),
            unfinished,
        }
    }

    /// The attempt ended; its own record says how.
    pub(super) fn ended(mut self) {
        self.start = None;
    }

    /// Another attempt committed first: this one is dropped (its upstream
    /// connection closed) and recorded as having lost the race, charged
    /// like a cancelled attempt for what the provider had begun.
    pub(super) fn lost_race(mut self, hedged: bool, winner: u32) {
        if let Some(start) = self.start.take() {
            let mut record = self.unfinished.record(&start, Decision::LostRace);
            record.hedged = hedged;
            record.time_to_commit = Some(record.duration);
            record.message = Some(format!("attempt {winner} committed first"));
            self.run.push(record);
        }
    }
}

impl Unfinished<'_> {
    /// The record of an attempt that did not end by itself, with its
    /// estimated charge.
    fn record(&self, start: &AttemptStart, decision: Decision) -> AttemptRecord {
        let output_events = self.state.as_ref().map_or(0, StreamState::output_events);
        // Whether the request got out is not known here: a cancelled
        // attempt is assumed to have reached the provider.
        let estimate = Usage::new(self.input_tokens, output_events.max(self.output_if_cut));
        let charge = Charge::to_turn(self.budget, self.pricing, None, estimate);
        let mut record = start.record(decision);
        record.output_events = output_events;
        charge.fill(&mut record);
        record
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(start) = self.start.take() {
            let mut record = self.unfinished.record(&start, Decision::Stop);
            record.class = Some(FailureClass::Cancelled);
            record.phase = Some(Phase::Preamble);
            record.message = Some("the turn was cancelled before this attempt ended".to_owned());
            self.run.push(record);
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
        let cost = pricing.map(|p| p.cost(usage.input_tokens, usage.output_tokens));
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
