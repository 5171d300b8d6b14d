//! The error body as classification sees it: the few fields it reads, and
//! how any body (JSON, HTML, text, nothing) becomes one.
//!
//! JSON bodies are read by the providers' contracts (`contract` module, one
//! file per provider family, which also documents the order in which the
//! shapes are tried). What is left here is the model and the non-JSON
//! fallbacks: HTML pages (their `<title>`), plain text, truncated JSON, or
//! nothing.

use std::time::Duration;

use serde_json::Value;

pub(crate) use super::contract::parse_value;

/// How the error body was recognized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Shape {
    /// No body bytes.
    #[default]
    Empty,
    /// JSON holding an error object a provider contract knows.
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
    /// How the body was recognized.
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

/// The body without a UTF-8 BOM and surrounding ASCII whitespace.
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

/// A body that is not JSON: an HTML page, truncated JSON, or other text.
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
