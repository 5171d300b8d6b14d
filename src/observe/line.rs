//! A turn's line written by the process's own log writer, not through
//! `tracing`: see [`set_turn_line_writer`].

use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::{StopReason, TurnId, TurnOutcome};

/// A turn's line as facts: what the `tower_llm_failover::turn` event
/// carries, for a [`TurnLineWriter`] that formats it itself.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct TurnLine<'a> {
    /// The turn's id (the event's `run_id`); may be the client's: write it
    /// with [`push_log_safe`].
    pub turn_id: &'a TurnId,
    /// Attempts the turn made.
    pub attempts: usize,
    /// How the turn ended.
    pub outcome: TurnOutcome,
    /// Why it stopped without a whole answer, if it did.
    pub stop_reason: Option<StopReason>,
    /// The target that answered, if one did (the operator's name): write
    /// it with [`push_log_safe`].
    pub target: Option<&'a str>,
    /// How long the turn took.
    pub duration: Duration,
}

impl<'a> TurnLine<'a> {
    /// A line of these facts (for a writer's tests: the library makes the
    /// lines it hands over).
    pub fn new(
        turn_id: &'a TurnId,
        attempts: usize,
        outcome: TurnOutcome,
        stop_reason: Option<StopReason>,
        target: Option<&'a str>,
        duration: Duration,
    ) -> Self {
        Self {
            turn_id,
            attempts,
            outcome,
            stop_reason,
            target,
            duration,
        }
    }
}

/// Writes turn lines in place of the `tower_llm_failover::turn` tracing
/// event: for a process whose log format is its own, where a line made
/// from the facts costs a fraction of an event's dispatch and field
/// visits (see [`set_turn_line_writer`]).
pub trait TurnLineWriter: Send + Sync + 'static {
    /// Writes `line` (or leaves it out when the process's log filter
    /// would), returning `true`; `false` has the line logged as the
    /// tracing event, as without a writer.
    fn write(&self, line: &TurnLine<'_>) -> bool;
}

static WRITER: OnceLock<Arc<dyn TurnLineWriter>> = OnceLock::new();

/// Sets the process's turn-line writer, once (like a `tracing` subscriber
/// or a `metrics` recorder: the turn line is the process's log). From
/// then on a turn's line goes to `writer` instead of being a `tracing`
/// event; the writer must honour the log filter and format the line as
/// the subscriber would have. Set it only where no other subscriber
/// layer needs the event (an OpenTelemetry layer records it on the
/// turn's span). Returns the writer back when one is already set.
pub fn set_turn_line_writer(
    writer: Arc<dyn TurnLineWriter>,
) -> Result<(), Arc<dyn TurnLineWriter>> {
    WRITER.set(writer)
}

/// Hands `line` to the process's writer: `false` when there is none or it
/// declined.
pub(crate) fn hand_to_writer(line: &TurnLine<'_>) -> bool {
    WRITER.get().is_some_and(|writer| writer.write(line))
}

/// Appends `value` to `out` as the turn event writes its client-chosen
/// and named values (`run_id`, `target`): control characters, quotes and
/// backslashes escaped as [`char::escape_debug`] does, cut at 256
/// characters and marked `…`.
pub fn push_log_safe(out: &mut String, value: &str) {
    // Such bytes are ASCII: one character each.
    let plain = value.len() <= crate::util::LOG_SAFE_MAX_CHARS
        && value.bytes().all(crate::util::left_alone);
    if plain {
        out.push_str(value);
    } else {
        // Writing to a `String` does not fail.
        let _ = write!(out, "{}", crate::util::log_safe(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_log_safe_writes_what_the_event_writes() {
        let long = "a".repeat(300);
        for value in [
            "primary",
            "7f3a-01",
            "",
            "evil\nINFO forged \u{1b}[31m",
            "quote \" and ' and \\",
            "ünïcode",
            long.as_str(),
        ] {
            let mut out = String::from("x=");
            push_log_safe(&mut out, value);
            assert_eq!(
                out,
                format!("x={}", crate::util::log_safe(value)),
                "{value:?}"
            );
        }
    }
}
