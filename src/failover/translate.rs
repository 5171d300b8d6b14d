//! Targets of another dialect than the clients': the client's request read
//! once into the neutral model, fitted to each such target, and written in
//! its dialect when the turn picks its targets.

use bytes::Bytes;

use super::target::Capabilities;
use crate::dialect::{Message, NeutralRequest, Part, Requirements};

/// The neutral request fitted to one target: the output limit defaulted
/// (a Messages target needs one) and clipped to the target's maximum
/// rather than refused, and, for a target without reasoning, the
/// reasoning history it cannot take removed.
pub(super) fn fit(request: &NeutralRequest, capabilities: &Capabilities) -> NeutralRequest {
    let mut fitted = request.clone();
    fitted.max_output_tokens = clip(
        fitted
            .max_output_tokens
            .or(capabilities.default_output_tokens),
        capabilities.max_output_tokens,
    );
    if !capabilities.reasoning {
        fitted.reasoning_effort = None;
        fitted.thinking_budget = None;
        for message in &mut fitted.messages {
            if let Message::Assistant(parts) = message {
                parts.retain(|p| !matches!(p, Part::Thinking { .. } | Part::RedactedThinking(_)));
            }
        }
    }
    fitted
}

/// The requirements a translated target is judged by: its output limit
/// clipped, not refused.
pub(super) fn clipped(requirements: &Requirements, capabilities: &Capabilities) -> Requirements {
    Requirements {
        max_output_tokens: clip(
            requirements.max_output_tokens,
            capabilities.max_output_tokens,
        ),
        ..requirements.clone()
    }
}

fn clip(asked: Option<u64>, limit: Option<u64>) -> Option<u64> {
    match (asked, limit) {
        (Some(asked), Some(limit)) => Some(asked.min(limit)),
        (asked, _) => asked,
    }
}

/// What a turn keeps for its targets of other dialects: the neutral
/// request (read once, when the first such target is judged) and each
/// one's translated body.
#[derive(Default)]
pub(super) struct Translations {
    pub(super) neutral: Option<Result<NeutralRequest, String>>,
    pub(super) bodies: Vec<Option<Bytes>>,
}

impl Translations {
    /// The body translated for target `index`, if it is one.
    pub(super) fn body(&self, index: usize) -> Option<&Bytes> {
        self.bodies.get(index).and_then(Option::as_ref)
    }

    pub(super) fn keep(&mut self, index: usize, body: Bytes, targets: usize) {
        if self.bodies.len() < targets {
            self.bodies.resize(targets, None);
        }
        if let Some(slot) = self.bodies.get_mut(index) {
            *slot = Some(body);
        }
    }
}
