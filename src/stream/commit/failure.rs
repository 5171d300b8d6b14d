//! Turning what went wrong in a stream into a [`Classification`], which the
//! terminal chunk and the stream's record report.

use crate::classify::Note;
use std::time::Duration;

use bytes::Bytes;

use crate::DeadlineExceeded;
use crate::{Phase, classify::Classification, classify::Classifier};

#[derive(Debug)]
pub(crate) enum FailureKind {
    /// The upstream body returned an error (reset, cut connection, or a
    /// deadline error of a budget layer inside).
    Body(super::BoxError),
    /// The turn's deadline passed mid-stream.
    Deadline,
    /// An in-band error event.
    InBand {
        event: Option<Bytes>,
        data: Bytes,
        /// What the dialect read of it, when it reads its own errors.
        facts: Option<crate::dialect::ErrorFacts>,
    },
    /// The stream ended without a finish reason or end marker.
    Truncated { cut_event: bool },
    /// No frame for longer than the idle timeout.
    Idle(Duration),
    /// More malformed chunks than tolerated.
    TooManyMalformed,
    /// A line or event over its cap.
    Oversize(String),
    /// No model output before the first-output deadline (held back).
    FirstOutput,
    /// A held-back preamble, with no output yet, over its memory cap.
    HeldOversize,
    /// The gateway's shutdown grace period is over.
    Shutdown,
}

pub(crate) fn classify(
    kind: &FailureKind,
    classifier: &Classifier,
    provider: Option<&str>,
    phase: Phase,
) -> Classification {
    let classification = match kind {
        FailureKind::InBand {
            facts: Some(facts), ..
        } => return classifier.classify_error_facts(provider, facts, phase),
        FailureKind::InBand { event, data, .. } => {
            let event = event.as_deref().and_then(|e| std::str::from_utf8(e).ok());
            return classifier.classify_in_band(provider, event, data, phase);
        }
        FailureKind::Body(error) => {
            if let Some(deadline) = DeadlineExceeded::find_in(error.as_ref()) {
                return deadline.classification().with_phase(phase);
            }
            // After the head: the connection was cut mid-stream.
            classifier
                .classify_transport(provider, error.as_ref(), true)
                .with_phase(phase)
        }
        FailureKind::Deadline => Classification::timeout(phase, "the rest of the stream")
            .with_message("the turn's deadline passed mid-stream")
            .with_recovery(crate::Decision::Stop)
            .with_note(Note::TurnDeadline),
        FailureKind::Truncated { cut_event: true } => Classification::truncated(phase)
            .with_message("the upstream stream ended in the middle of an event"),
        FailureKind::Truncated { cut_event: false } => Classification::truncated(phase)
            .with_message("the upstream stream ended without a finish reason or [DONE]"),
        FailureKind::Idle(timeout) => Classification::timeout(
            phase,
            &format!("the next chunk (idle for {} ms)", timeout.as_millis()),
        ),
        FailureKind::TooManyMalformed => {
            Classification::malformed_chunk(phase, "more malformed chunks than tolerated")
        }
        FailureKind::Oversize(error) => Classification::oversize(phase, "event")
            .with_message(format!("the upstream stream is malformed: {error}")),
        // A silent upstream is never waited on twice within one turn.
        FailureKind::FirstOutput => Classification::timeout(phase, "the first output")
            .with_recovery(crate::Decision::Reroute),
        FailureKind::HeldOversize => Classification::oversize(phase, "held-back preamble"),
        FailureKind::Shutdown => Classification::new(crate::FailureClass::Shutdown, phase)
            .with_message("the gateway is shutting down"),
    };
    classifier.apply_overrides(provider, classification)
}
