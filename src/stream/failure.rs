//! Turning what went wrong in a stream into the facts a terminal chunk and
//! the stream's record report.

use std::time::Duration;

use bytes::Bytes;

use crate::classify::FailureClass;

/// Longest message a terminal chunk carries, in bytes.
const MAX_MESSAGE: usize = 512;

#[derive(Debug)]
pub(crate) enum FailureKind {
    /// The upstream body returned an error (reset, cut connection).
    Body(String),
    /// An in-band error event.
    InBand { event: Option<Bytes>, data: Bytes },
    /// The stream ended without a finish reason or end marker.
    Truncated { cut_event: bool },
    /// No frame for longer than the idle timeout.
    Idle(Duration),
    /// More malformed chunks than tolerated.
    TooManyMalformed,
    /// A line or event over its cap.
    Oversize(String),
}

pub(crate) struct Described {
    pub(crate) class: FailureClass,
    pub(crate) message: String,
    pub(crate) provider_type: Option<String>,
    pub(crate) provider_code: Option<String>,
}

pub(crate) fn describe(kind: &FailureKind) -> Described {
    let plain = |class, message: String| Described {
        class,
        message: bounded(message),
        provider_type: None,
        provider_code: None,
    };
    match kind {
        FailureKind::Body(error) => plain(
            FailureClass::Connect,
            format!("the upstream stream was cut: {error}"),
        ),
        FailureKind::InBand { event, data } => in_band(event.as_deref(), data),
        FailureKind::Truncated { cut_event } => plain(
            FailureClass::InvalidResponse,
            if *cut_event {
                "the upstream stream ended in the middle of an event".to_owned()
            } else {
                "the upstream stream ended without a finish reason or [DONE]".to_owned()
            },
        ),
        FailureKind::Idle(timeout) => plain(
            FailureClass::Timeout,
            format!(
                "the upstream stream sent nothing for {} ms",
                timeout.as_millis()
            ),
        ),
        FailureKind::TooManyMalformed => plain(
            FailureClass::InvalidResponse,
            "the upstream stream sent too many malformed chunks".to_owned(),
        ),
        FailureKind::Oversize(error) => plain(
            FailureClass::InvalidResponse,
            format!("the upstream stream is malformed: {error}"),
        ),
    }
}

fn in_band(event: Option<&[u8]>, data: &[u8]) -> Described {
    let value: serde_json::Value = serde_json::from_slice(data).unwrap_or_default();
    // OpenAI/vLLM/Gemini/OpenRouter: {"error":{...}}; Anthropic: event:
    // error with {"type":"error","error":{...}}; Ollama: {"error":"text"}.
    let error = value.get("error").unwrap_or(&value);
    let text = |v: Option<&serde_json::Value>| match v {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let message = match error {
        serde_json::Value::String(s) => s.clone(),
        _ => text(error.get("message"))
            .unwrap_or_else(|| "the upstream sent an error event".to_owned()),
    };
    let provider_type = text(error.get("type")).or_else(|| text(error.get("status")));
    let provider_code = text(error.get("code"));
    let _ = event;
    let class = provisional_class(provider_type.as_deref(), provider_code.as_deref());
    Described {
        class,
        message: bounded(message),
        provider_type,
        provider_code,
    }
}

fn bounded(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    message
}

// Replaced by the classifier once it lands.
fn provisional_class(kind: Option<&str>, code: Option<&str>) -> FailureClass {
    let any = |needle: &str| {
        kind.is_some_and(|k| k.contains(needle)) || code.is_some_and(|c| c.contains(needle))
    };
    if any("insufficient_quota") {
        FailureClass::QuotaExhausted
    } else if any("rate_limit") || any("429") || any("RESOURCE_EXHAUSTED") {
        FailureClass::RateLimited
    } else if any("overloaded") || any("UNAVAILABLE") || any("503") {
        FailureClass::Overloaded
    } else {
        FailureClass::ServerError
    }
}
