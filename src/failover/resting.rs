//! The targets a turn skipped because they rest, and the one probe it may
//! send to them when nothing else is left.

use super::target::Target;
use crate::health::Availability;

/// Targets a turn skipped because they rest, and the one probe it may send
/// to them when nothing else is left ("never refuse while the turn can
/// still try", Envoy's panic threshold).
#[derive(Debug)]
pub(super) struct Resting {
    skipped: Vec<(usize, Option<tokio::time::Instant>)>,
    refuse: bool,
    forced: Option<usize>,
    ordinary_attempts: u32,
}

impl Resting {
    pub(super) fn new(refuse: bool) -> Self {
        Self {
            skipped: Vec::new(),
            refuse,
            forced: None,
            ordinary_attempts: 0,
        }
    }

    pub(super) fn skip(&mut self, index: usize, availability: Availability) {
        let until = match availability {
            Availability::Cooling(until) => Some(until),
            // A probe is out: its rest is over already.
            _ => None,
        };
        if !self.skipped.iter().any(|(i, _)| *i == index) {
            self.skipped.push((index, until));
        }
    }

    pub(super) fn can_probe(&self) -> bool {
        !self.refuse && self.forced.is_none() && !self.skipped.is_empty()
    }

    /// The skipped target whose rest ends first, marked as this turn's
    /// forced probe (once per turn).
    pub(super) fn probe_soonest(&mut self) -> Option<usize> {
        if !self.can_probe() {
            return None;
        }
        let (index, _) = *self.skipped.iter().min_by_key(|(_, until)| *until)?;
        self.forced = Some(index);
        Some(index)
    }

    pub(super) fn is_forced(&self, index: usize) -> bool {
        self.forced == Some(index)
    }

    pub(super) fn attempted(&mut self, index: usize) {
        if !self.is_forced(index) {
            self.ordinary_attempts += 1;
        }
    }

    /// Only forced probes were sent: every target was resting.
    pub(super) fn only_probes_tried(&self) -> bool {
        self.ordinary_attempts == 0 && !self.skipped.is_empty()
    }

    /// After a context-length failure only larger windows help, and a
    /// resting target was not filtered for that.
    pub(super) fn forget_all(&mut self) {
        self.skipped.clear();
    }

    pub(super) fn note<T>(&self, targets: &[Target<T>], excluded: &[String]) -> String {
        let mut notes = Vec::new();
        if !self.skipped.is_empty() {
            let names: Vec<&str> = self
                .skipped
                .iter()
                .map(|(i, _)| &*targets[*i].name)
                .collect();
            notes.push(format!("cooling down: {}", names.join(", ")));
        }
        if !excluded.is_empty() {
            notes.push(format!("no compatible backup: {}", excluded.join("; ")));
        }
        notes.join("; ")
    }
}
