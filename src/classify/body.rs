//! Error-body parsing: every shape in the provider reference, reduced to the
//! few fields classification reads.
//!
//! Shapes handled (the first that matches wins):
//! - a JSON **array** (Gemini's OpenAI-compatible endpoint): the first
//!   element is unwrapped, as python-genai does;
//! - `{"error": {...}}`: OpenAI, Azure (`innererror`), Gemini native
//!   (`status`, `details[]`), OpenRouter (`metadata`), vLLM (numeric `code`),
//!   Ollama's OpenAI-compatible errors; `code` may be a string, a number or
//!   null;
//! - `{"type": "error", "error": {...}}`: Anthropic (`error.details` too);
//! - `{"error": "text"}`: Ollama native NDJSON;
//! - a flat `{"object": "error", "message", "type", "code"}` (vLLM legacy)
//!   or any object with `message` and `code`/`type`;
//! - `{"detail": ...}`: FastAPI defaults in front of self-hosted servers;
//! - anything else: HTML pages (their `<title>`), plain text, or nothing.

use std::time::Duration;

use serde_json::{Map, Value};

use super::retry_after::parse_go_duration;

/// How the error body was recognized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Shape {
    /// No body bytes.
    #[default]
    Empty,
    /// JSON holding an error object this module knows.
    Error,
    /// Valid JSON, but no error object in it.
    OtherJson,
    /// An HTML page (typically a proxy's or CDN's error page).
    Html,
    /// Text that looks like JSON but does not parse (truncated, corrupt).
    BrokenJson,
    /// Other text.
    Text,
}

/// The fields of a provider error body that classification reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct ErrorBody {
    pub(crate) shape: Shape,
    /// `error.message` (or the Ollama error string, or the HTML title /
    /// plain text for non-JSON bodies).
    pub(crate) message: Option<String>,
    /// `error.type`.
    pub(crate) kind: Option<String>,
    /// `error.code` when it is a non-numeric string.
    pub(crate) code: Option<String>,
    /// `error.code` when it is a number (or a numeric string).
    pub(crate) code_num: Option<i64>,
    /// Gemini's `error.status` (`RESOURCE_EXHAUSTED`, ...).
    pub(crate) status: Option<String>,
    /// `error.param`.
    pub(crate) param: Option<String>,
    /// Azure `error.innererror.code`.
    pub(crate) inner_code: Option<String>,
    /// Anthropic `error.details.error_code`.
    pub(crate) detail_code: Option<String>,
    /// Gemini `google.rpc.ErrorInfo.reason`s.
    pub(crate) reasons: Vec<String>,
    /// Gemini `google.rpc.QuotaFailure.violations[].quotaId`s.
    pub(crate) quota_ids: Vec<String>,
    /// Gemini `google.rpc.RetryInfo.retryDelay`.
    pub(crate) retry_delay: Option<Duration>,
    /// OpenRouter moderation: `metadata.reasons` or `metadata.flagged_input`.
    pub(crate) moderation: bool,
    /// OpenRouter `metadata.error_type` (3rd-party reports; read if present).
    pub(crate) metadata_error_type: Option<String>,
    /// A content-filter finish on an in-band chunk that carried no error:
    /// `choices[0].finish_reason`, Gemini `candidates[0].finishReason`,
    /// `promptFeedback.blockReason`.
    pub(crate) filter_finish: Option<String>,
}

impl ErrorBody {
    /// Whether an error object was found.
    pub(crate) fn found(&self) -> bool {
        self.shape == Shape::Error
    }

    /// Every code-like string the body carried, for overrides by provider
    /// code.
    pub(crate) fn codes(&self) -> Vec<&str> {
        let mut out: Vec<&str> = [
            &self.code,
            &self.kind,
            &self.status,
            &self.detail_code,
            &self.inner_code,
            &self.metadata_error_type,
        ]
        .into_iter()
        .filter_map(|s| s.as_deref())
        .collect();
        out.extend(self.reasons.iter().map(String::as_str));
        out
    }

    /// The provider code a classification reports: the most specific one.
    pub(crate) fn provider_code(&self) -> Option<String> {
        self.detail_code
            .clone()
            .or_else(|| self.code.clone())
            .or_else(|| self.reasons.first().cloned())
            .or_else(|| self.status.clone())
            .or_else(|| self.kind.clone())
            .or_else(|| self.code_num.map(|n| n.to_string()))
    }

    /// The HTTP status an error body names in its `code` (vLLM, Gemini,
    /// OpenRouter), if it is one.
    pub(crate) fn named_status(&self) -> Option<u16> {
        self.code_num
            .filter(|n| (100..=599).contains(n))
            .and_then(|n| u16::try_from(n).ok())
    }
}

/// Parses an error body of any shape; never fails.
pub(crate) fn parse_error_body(bytes: &[u8]) -> ErrorBody {
    let trimmed = trim(bytes);
    if trimmed.is_empty() {
        return ErrorBody::default();
    }
    match serde_json::from_slice::<Value>(trimmed) {
        Ok(value) => parse_value(&value),
        Err(_) => parse_text(trimmed),
    }
}

/// Parses an already-decoded JSON value.
pub(crate) fn parse_value(value: &Value) -> ErrorBody {
    let mut out = ErrorBody {
        shape: Shape::OtherJson,
        ..ErrorBody::default()
    };
    match value {
        // Gemini's OpenAI-compatible endpoint wraps the error in an array.
        Value::Array(items) => {
            if let Some(first) = items.iter().find(|v| v.is_object()) {
                return parse_value(first);
            }
        }
        Value::Object(obj) => parse_object(obj, &mut out),
        Value::String(s) => {
            out.message = Some(s.clone());
        }
        _ => {}
    }
    out
}

fn parse_object(obj: &Map<String, Value>, out: &mut ErrorBody) {
    match obj.get("error") {
        Some(Value::Object(err)) => {
            out.shape = Shape::Error;
            fill_from_error(err, out);
        }
        Some(Value::String(s)) => {
            // Ollama native: {"error": "..."}.
            out.shape = Shape::Error;
            out.message = Some(s.clone());
        }
        _ => {
            let flat = obj.get("object").and_then(Value::as_str) == Some("error")
                || (obj.get("message").is_some_and(Value::is_string)
                    && (obj.contains_key("code") || obj.contains_key("type")));
            if flat {
                // vLLM legacy flat shape.
                out.shape = Shape::Error;
                fill_from_error(obj, out);
            } else if let Some(detail) = obj.get("detail") {
                out.shape = Shape::Error;
                out.message = Some(match detail {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
            }
        }
    }
    out.filter_finish = filter_finish(obj);
}

fn str_field(obj: &Map<String, Value>, key: &str) -> Option<String> {
    obj.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn fill_from_error(err: &Map<String, Value>, out: &mut ErrorBody) {
    out.message = str_field(err, "message");
    out.kind = str_field(err, "type");
    out.status = str_field(err, "status");
    out.param = str_field(err, "param");
    match err.get("code") {
        Some(Value::String(s)) => {
            let s = s.trim();
            if let Ok(n) = s.parse::<i64>() {
                out.code_num = Some(n);
            } else if !s.is_empty() {
                out.code = Some(s.to_owned());
            }
        }
        Some(Value::Number(n)) => {
            out.code_num = n.as_i64().or_else(|| n.as_f64().map(|f| f as i64));
        }
        _ => {}
    }
    if let Some(inner) = err.get("innererror").and_then(Value::as_object) {
        out.inner_code = str_field(inner, "code");
    }
    match err.get("details") {
        // Anthropic: error.details.error_code.
        Some(Value::Object(details)) => {
            out.detail_code = str_field(details, "error_code");
        }
        // Gemini: google.rpc detail messages.
        Some(Value::Array(details)) => {
            for detail in details.iter().filter_map(Value::as_object) {
                let ty = detail.get("@type").and_then(Value::as_str).unwrap_or("");
                if ty.ends_with("google.rpc.RetryInfo") {
                    out.retry_delay = detail
                        .get("retryDelay")
                        .and_then(Value::as_str)
                        .and_then(parse_go_duration);
                } else if ty.ends_with("google.rpc.QuotaFailure") {
                    let violations = detail.get("violations").and_then(Value::as_array);
                    for v in violations
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_object)
                    {
                        if let Some(id) = str_field(v, "quotaId") {
                            out.quota_ids.push(id);
                        }
                    }
                } else if ty.ends_with("google.rpc.ErrorInfo")
                    && let Some(reason) = str_field(detail, "reason")
                {
                    out.reasons.push(reason);
                }
            }
        }
        _ => {}
    }
    if let Some(meta) = err.get("metadata").and_then(Value::as_object) {
        out.moderation = meta.contains_key("reasons") || meta.contains_key("flagged_input");
        out.metadata_error_type = str_field(meta, "error_type");
    }
}

/// Gemini finish reasons that mean the content filter stopped the answer.
const GEMINI_FILTER_REASONS: &[&str] = &[
    "SAFETY",
    "RECITATION",
    "BLOCKLIST",
    "PROHIBITED_CONTENT",
    "SPII",
    "IMAGE_SAFETY",
    "IMAGE_PROHIBITED_CONTENT",
    "IMAGE_RECITATION",
];

fn filter_finish(obj: &Map<String, Value>) -> Option<String> {
    let first = |key: &str| {
        obj.get(key)
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_object)
    };
    if let Some(reason) = first("choices").and_then(|c| str_field(c, "finish_reason"))
        && reason == "content_filter"
    {
        return Some(reason);
    }
    if let Some(reason) = first("candidates").and_then(|c| str_field(c, "finishReason"))
        && GEMINI_FILTER_REASONS.contains(&reason.as_str())
    {
        return Some(reason);
    }
    obj.get("promptFeedback")
        .and_then(Value::as_object)
        .and_then(|f| str_field(f, "blockReason"))
}

fn trim(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &bytes[start..end]
}

fn parse_text(bytes: &[u8]) -> ErrorBody {
    let text = String::from_utf8_lossy(bytes);
    let head = text.trim_start();
    let lower_head = head.get(..64).unwrap_or(head).to_ascii_lowercase();
    let html_start = ["<!doctype html", "<html", "<head", "<body", "<?xml"];
    // Any markup page: starts with a tag and closes one somewhere.
    if html_start.iter().any(|p| lower_head.starts_with(p))
        || (head.starts_with('<') && head.contains("</"))
    {
        return ErrorBody {
            shape: Shape::Html,
            message: html_title(&text),
            ..ErrorBody::default()
        };
    }
    if head.starts_with('{') || head.starts_with('[') {
        // Truncated or corrupt JSON: its raw text makes a poor message.
        return ErrorBody {
            shape: Shape::BrokenJson,
            ..ErrorBody::default()
        };
    }
    ErrorBody {
        shape: Shape::Text,
        message: Some(text.into_owned()),
        ..ErrorBody::default()
    }
}

/// The text of an HTML page's `<title>`, tags and entities left as they are.
fn html_title(html: &str) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let open = lower.find("<title")?;
    let start = open + lower[open..].find('>')? + 1;
    let end = start + lower[start..].find("</title")?;
    let title = html.get(start..end)?.trim();
    (!title.is_empty()).then(|| title.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shape_with_tolerant_code() {
        let b = parse_error_body(br#"{"error":{"message":"m","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#);
        assert!(b.found());
        assert_eq!(b.code.as_deref(), Some("rate_limit_exceeded"));
        assert_eq!(b.kind.as_deref(), Some("tokens"));
        let b = parse_error_body(
            br#"{"error":{"message":"m","type":"BadRequestError","param":null,"code":400}}"#,
        );
        assert_eq!((b.code.as_deref(), b.code_num), (None, Some(400)));
        let b = parse_error_body(br#"{"error":{"message":"m","code":"429"}}"#);
        assert_eq!(b.named_status(), Some(429));
        let b = parse_error_body(br#"{"error":{"message":"m","code":null}}"#);
        assert_eq!((b.code.as_deref(), b.code_num), (None, None));
    }

    #[test]
    fn gemini_details() {
        let b = parse_error_body(br#"{"error":{"code":429,"message":"x","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"53s"}]}}"#);
        assert_eq!(b.status.as_deref(), Some("RESOURCE_EXHAUSTED"));
        assert_eq!(
            b.quota_ids,
            ["GenerateRequestsPerDayPerProjectPerModel-FreeTier"]
        );
        assert_eq!(b.retry_delay, Some(Duration::from_secs(53)));
    }

    #[test]
    fn text_html_and_broken_json() {
        let b = parse_error_body(
            b"<html><head><title>502 Bad Gateway</title></head><body></body></html>",
        );
        assert_eq!(
            (b.shape, b.message.as_deref()),
            (Shape::Html, Some("502 Bad Gateway"))
        );
        let b = parse_error_body(br#"{"error":{"message":"cut"#);
        assert_eq!((b.shape, b.message), (Shape::BrokenJson, None));
        let b = parse_error_body(b"upstream connect error or disconnect/reset before headers");
        assert_eq!(b.shape, Shape::Text);
        assert_eq!(parse_error_body(b" \r\n").shape, Shape::Empty);
    }
}
