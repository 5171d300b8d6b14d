//! The configurable classifier and its entry points.

use crate::classify::Note;
use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::body::{self, ErrorBody, Shape};
use super::retry_after::{ratelimit_reset_hint, retry_delay_in_message, retry_hint_from_headers};
use super::sanitize::sanitize_code;
use super::{Classification, Override, RetryHint, rules, transport};
use crate::{Decision, FailureClass, Phase};

/// The default cap on an error body read by [`ClassifyLayer`](super::ClassifyLayer): 64 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// The default time allowed to read an error body after its head: 10 s.
pub(crate) const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The default longest wait a `RetrySame` keeps: 120 s, openai-python's
/// `MAX_RETRY_AFTER_DELAY` (a provider asking for longer is not retried).
pub(crate) const DEFAULT_MAX_RETRY_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
struct Config {
    overrides: Vec<Override>,
    body_limit: usize,
    body_timeout: Duration,
    max_retry_wait: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            overrides: Vec::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_retry_wait: Some(DEFAULT_MAX_RETRY_WAIT),
        }
    }
}

/// Classifies upstream failures by the providers' contracts, with user
/// overrides. Cheap to clone (one `Arc`).
///
/// Every entry point ends the same way:
/// 1. the contract gives a class ([`FailureClass`]) and its
///    [`default_recovery`](FailureClass::default_recovery);
/// 2. the first matching [`Override`] that sets a class replaces it (and the
///    recovery becomes the new class's default);
/// 3. a `RetrySame` becomes `Reroute` when the provider said
///    `x-should-retry: false`, or asked to wait longer than
///    [`with_max_retry_wait`](Self::with_max_retry_wait) (default 120 s). An
///    `x-should-retry: true` is kept in the hint but never turns a reroute or
///    a stop into a retry: the contract's class decides that;
/// 4. the first matching [`Override`] that sets a recovery has the last word.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    config: Arc<Config>,
}

impl Classifier {
    /// A classifier with the defaults: 64 KiB body cap, 10 s body read
    /// timeout, 120 s longest kept retry wait, no overrides.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an override rule (see [`Override`] for the order rules apply in).
    pub fn with_override(mut self, rule: Override) -> Self {
        Arc::make_mut(&mut self.config).overrides.push(rule);
        self
    }

    /// Sets the cap on an error body read by the layer (default 64 KiB).
    /// Bodies past the cap are classified from what was read, noted
    /// `Note::ErrorBodyTooLarge`.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).body_limit = bytes;
        self
    }

    /// Sets the time allowed to read a whole error body after its head
    /// (default 10 s). A slower body is classified from what was read,
    /// noted `Note::ErrorBodyTimeout`.
    pub fn with_body_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).body_timeout = timeout;
        self
    }

    /// Sets the longest retry wait a `RetrySame` keeps; `None` keeps any.
    pub fn with_max_retry_wait(mut self, wait: Option<Duration>) -> Self {
        Arc::make_mut(&mut self.config).max_retry_wait = wait;
        self
    }

    /// The error body cap.
    pub(crate) fn body_limit(&self) -> usize {
        self.config.body_limit
    }

    /// The error body read timeout.
    pub(crate) fn body_timeout(&self) -> Duration {
        self.config.body_timeout
    }

    /// Classifies a non-success response head with its (capped) error body.
    /// Phase [`Phase::Head`].
    ///
    /// Retry hints: `retry-after-ms`, then `retry-after` (seconds or HTTP
    /// date), then Gemini's `RetryInfo.retryDelay`, then a wait named in the
    /// message ("Please retry in 43.7s"), then, for rate limits only,
    /// OpenAI's `x-ratelimit-reset-*` of the exhausted limit.
    ///
    /// Meant for non-success statuses; a 2xx/3xx handed in is an
    /// `InvalidResponse`.
    pub fn classify_head(
        &self,
        provider: Option<&str>,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Classification {
        let body = &body[..body.len().min(self.config.body_limit)];
        let parsed = body::parse_error_body(body);
        let mut retry = retry_hint_from_headers(headers, SystemTime::now());
        let class = rules::class_of(Some(status.as_u16()), &parsed, retry.after.is_some());
        if retry.after.is_none() {
            retry.after = body_retry_hint(&parsed).or_else(|| {
                (class == FailureClass::RateLimited)
                    .then(|| ratelimit_reset_hint(headers))
                    .flatten()
            });
        }
        let mut c = Classification::new(class, Phase::Head)
            .with_status(status)
            .with_retry(retry)
            .with_message(head_message(status, &parsed));
        c.note = body_note(&parsed);
        fill_details(&mut c, &parsed);
        c.rate_limits = super::RateLimitHeaders::from_headers(headers);
        self.finish(provider, c, &parsed.codes())
    }

    /// Classifies an in-stream error event as the stream dialect hands it
    /// over: the SSE event name (if any) and its raw `data` payload. Phase is
    /// the caller's ([`Phase::Preamble`] or [`Phase::Committed`]).
    ///
    /// Understood: `{"error": {...}}` (OpenAI, vLLM, Gemini native SSE),
    /// OpenRouter's chunk with a top-level `error` and
    /// `finish_reason: "error"`, Anthropic `event: error` with
    /// `{"type":"error","error":{...}}`, Ollama's `{"error": "text"}`, and a
    /// content-filter finish (`finish_reason: "content_filter"`, Gemini
    /// `SAFETY`-like `finishReason`, `promptFeedback.blockReason`). The class
    /// comes from the inner code/type/status; the numeric `code` of vLLM,
    /// Gemini and OpenRouter counts as the status (and is reported in
    /// `status`). An error with nothing recognizable is a `ServerError`;
    /// data with no error at all is an `InvalidResponse`.
    pub fn classify_in_band(
        &self,
        provider: Option<&str>,
        event: Option<&str>,
        data: &[u8],
        phase: Phase,
    ) -> Classification {
        let data = &data[..data.len().min(self.config.body_limit)];
        let parsed = body::parse_error_body(data);
        let error_event = event == Some("error");
        let c = if parsed.found() {
            self.in_band_error(&parsed, phase)
        } else if let Some(reason) = &parsed.filter_finish {
            Classification::content_filtered(phase, reason)
        } else if error_event {
            Classification::new(FailureClass::ServerError, phase)
                .with_message(
                    parsed
                        .message
                        .as_deref()
                        .unwrap_or("unparseable error event"),
                )
                .with_note(Note::UnparsedErrorEvent)
        } else {
            Classification::new(FailureClass::InvalidResponse, phase)
                .with_message("the event carries no error")
                .with_note(Note::NoErrorInEvent)
        };
        self.finish(provider, c, &parsed.codes())
    }

    /// Classifies an error a dialect read itself ([`ErrorFacts`]): its
    /// type, code and status go through the same contract rules and
    /// overrides as a provider's error body; its retry hint is kept.
    ///
    /// [`ErrorFacts`]: crate::dialect::ErrorFacts
    pub(crate) fn classify_error_facts(
        &self,
        provider: Option<&str>,
        facts: &crate::dialect::ErrorFacts,
        phase: Phase,
    ) -> Classification {
        let parsed = ErrorBody {
            shape: Shape::Error,
            message: facts.message.clone(),
            kind: facts.kind.clone(),
            code: facts.code.clone(),
            code_num: facts.status.map(i64::from),
            retry_delay: facts.retry_after,
            ..ErrorBody::default()
        };
        let c = self.in_band_error(&parsed, phase);
        self.finish(provider, c, &parsed.codes())
    }

    /// Classifies a transport error from the upstream client by walking its
    /// `source()` chain (including errors wrapped inside `std::io::Error`):
    ///
    /// - an [`UpstreamError`](super::UpstreamError) already in the chain
    ///   keeps its classification;
    /// - `tokio::time::error::Elapsed`, `io::ErrorKind::TimedOut`, hyper's
    ///   timeouts: `Timeout`;
    /// - hyper-util's connect errors (DNS, TCP, TLS; feature `hyper`), and
    ///   io `ConnectionRefused`, `NotFound` (DNS), `AddrNotAvailable`,
    ///   `HostUnreachable`, `NetworkUnreachable`, `NetworkDown`: `Connect` in
    ///   [`Phase::BeforeSend`] (the request never left);
    /// - io `ConnectionReset`, `ConnectionAborted`, `UnexpectedEof`,
    ///   `BrokenPipe`, hyper's incomplete message, closed or canceled
    ///   connections, and anything unrecognized: `Connect` in
    ///   [`Phase::Head`], or [`Phase::Preamble`] when `head_received` (the
    ///   request may have reached the provider). A caller that has already
    ///   committed sets [`Phase::Committed`] with
    ///   [`Classification::with_phase`];
    /// - hyper parse errors and io `InvalidData` after the connection was
    ///   made: `InvalidResponse`; hyper user errors (our own request):
    ///   `InvalidRequest`.
    ///
    /// Unknown error types whose text says "timed out"/"timeout" are
    /// `Timeout`. Own timeouts, cancellation and truncation have their own
    /// constructors: [`Classification::timeout`],
    /// [`Classification::cancelled`], [`Classification::truncated`].
    pub fn classify_transport(
        &self,
        provider: Option<&str>,
        error: &(dyn Error + 'static),
        head_received: bool,
    ) -> Classification {
        let c = transport::classify(error, head_received);
        let code = c.provider_code.clone();
        let codes: Vec<&str> = code.as_deref().into_iter().collect();
        self.finish(provider, c, &codes)
    }

    /// Checks a whole non-streaming answer with `dialect`: its usage and
    /// answering model when valid; otherwise the provider's error it
    /// carries (an error on a 200, e.g. Gemini's array-wrapped error), or
    /// `InvalidResponse` noting what is wrong. Phase
    /// [`Preamble`](Phase::Preamble): nothing has reached the client.
    pub fn validate_body<D: crate::dialect::Dialect>(
        &self,
        dialect: &D,
        provider: Option<&str>,
        body: &[u8],
    ) -> Result<(Option<crate::Usage>, Option<String>), Classification> {
        self.validate_answer(dialect, provider, body)
            .map(|(usage, model, _)| (usage, model))
    }

    /// [`validate_body`](Self::validate_body), with what identifies a
    /// valid answer ([`Dialect::check_answer`](crate::dialect::Dialect::check_answer)).
    pub(crate) fn validate_answer<D: crate::dialect::Dialect>(
        &self,
        dialect: &D,
        provider: Option<&str>,
        body: &[u8],
    ) -> Result<
        (
            Option<crate::Usage>,
            Option<String>,
            crate::dialect::AnswerFacts,
        ),
        Classification,
    > {
        self.validate_checked(
            dialect.check_answer(body),
            || dialect.error_facts(crate::dialect::ErrorSource::Body(body)),
            provider,
            body,
        )
    }

    /// [`validate_answer`](Self::validate_answer) with the dialect's
    /// reading done: its check of `body`, and what its error says.
    pub(crate) fn validate_checked(
        &self,
        check: (crate::dialect::BodyCheck, crate::dialect::AnswerFacts),
        error_facts: impl FnOnce() -> Option<crate::dialect::ErrorFacts>,
        provider: Option<&str>,
        body: &[u8],
    ) -> Result<
        (
            Option<crate::Usage>,
            Option<String>,
            crate::dialect::AnswerFacts,
        ),
        Classification,
    > {
        use crate::dialect::BodyCheck;
        let (fault, message) = match check {
            (BodyCheck::Valid { usage, model }, facts) => return Ok((usage, model, facts)),
            (BodyCheck::Invalid { fault, message }, _) => (fault, message),
        };
        if let Some(facts) = error_facts() {
            return Err(self
                .classify_error_facts(provider, &facts, Phase::Preamble)
                .with_note(Note::ErrorOn200));
        }
        if let Some(error) = self.error_in_body(provider, body) {
            return Err(error);
        }
        let c = Classification::new(FailureClass::InvalidResponse, Phase::Preamble)
            .with_message(message)
            .with_note(match fault {
                crate::dialect::BodyFault::NotJson => Note::InvalidJson,
                crate::dialect::BodyFault::UnexpectedJson => Note::UnexpectedJson,
                _ => Note::NoAnswer,
            });
        Err(self.finish(provider, c, &[]))
    }

    /// A provider's error carried by a success body: an `error` object, or
    /// one wrapped in an array.
    fn error_in_body(&self, provider: Option<&str>, body: &[u8]) -> Option<Classification> {
        #[derive(Deserialize)]
        struct Probe<'a> {
            #[serde(borrow, default)]
            error: Option<&'a RawValue>,
        }
        let raw: &RawValue = serde_json::from_slice(body).ok()?;
        let text = raw.get();
        let has_error = if text.starts_with('[') {
            true
        } else {
            serde_json::from_str::<Probe<'_>>(text)
                .ok()
                .and_then(|p| p.error)
                .is_some_and(|e| e.get() != "null")
        };
        if !has_error {
            return None;
        }
        let parsed = serde_json::from_str::<serde_json::Value>(text)
            .map(|v| body::parse_value(&v))
            .ok()?;
        parsed
            .found()
            .then(|| self.completion_error(provider, &parsed))
    }

    /// Applies this classifier's overrides and recovery adjustments to a
    /// classification built elsewhere (e.g. with [`Classification::timeout`]),
    /// matching provider codes against its `provider_code`.
    pub fn apply_overrides(
        &self,
        provider: Option<&str>,
        classification: Classification,
    ) -> Classification {
        let code = classification.provider_code.clone();
        let codes: Vec<&str> = code.as_deref().into_iter().collect();
        self.finish(provider, classification, &codes)
    }

    fn in_band_error(&self, parsed: &ErrorBody, phase: Phase) -> Classification {
        let class = rules::class_of(None, parsed, false);
        let retry = RetryHint {
            after: body_retry_hint(parsed),
            should_retry: None,
        };
        let message = parsed
            .message
            .clone()
            .unwrap_or_else(|| "an error occurred during streaming".to_owned());
        let mut c = Classification::new(class, phase)
            .with_retry(retry)
            .with_message(message);
        if let Some(status) = parsed
            .named_status()
            .and_then(|s| StatusCode::from_u16(s).ok())
        {
            c.status = Some(status);
        }
        fill_details(&mut c, parsed);
        c
    }

    fn completion_error(&self, provider: Option<&str>, parsed: &ErrorBody) -> Classification {
        let c = self
            .in_band_error(parsed, Phase::Preamble)
            .with_note(Note::ErrorOn200);
        self.finish(provider, c, &parsed.codes())
    }

    /// Overrides and recovery adjustments, in the order documented on
    /// [`Classifier`].
    fn finish(
        &self,
        provider: Option<&str>,
        mut c: Classification,
        codes: &[&str],
    ) -> Classification {
        let rules = &self.config.overrides;
        let contract_class = c.class;
        if let Some(class) = rules
            .iter()
            .filter(|r| r.matches(provider, c.status, codes, contract_class))
            .find_map(Override::new_class)
        {
            c = c.with_class(class);
        }
        if c.recovery == Decision::RetrySame {
            let too_long = matches!(
                (c.retry.after, self.config.max_retry_wait),
                (Some(after), Some(max)) if after > max
            );
            if c.retry.should_retry == Some(false) || too_long {
                c.recovery = Decision::Reroute;
            }
        }
        if let Some(recovery) = rules
            .iter()
            .filter(|r| r.matches(provider, c.status, codes, c.class))
            .find_map(Override::new_recovery)
        {
            c.recovery = recovery;
        }
        c
    }
}

fn body_retry_hint(parsed: &ErrorBody) -> Option<Duration> {
    parsed
        .retry_delay
        .or_else(|| parsed.message.as_deref().and_then(retry_delay_in_message))
}

fn fill_details(c: &mut Classification, parsed: &ErrorBody) {
    c.provider_code = parsed.provider_code().as_deref().and_then(sanitize_code);
    c.param = parsed.param.as_deref().and_then(sanitize_code);
    // Whose quota it is decides what cools: one model's, or the
    // credential's (see `failover::ScopeRules`).
    if parsed.quota_ids.iter().any(|id| id.contains("PerModel")) {
        c.note = Some(Note::PerModelQuota);
    }
}

fn head_message(status: StatusCode, parsed: &ErrorBody) -> String {
    match &parsed.message {
        Some(m) if !m.trim().is_empty() => m.clone(),
        _ => format!(
            "HTTP {} {}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("error")
        ),
    }
}

fn body_note(parsed: &ErrorBody) -> Option<Note> {
    match parsed.shape {
        Shape::Error => None,
        Shape::Empty => Some(Note::EmptyErrorBody),
        Shape::Html => Some(Note::HtmlErrorBody),
        Shape::BrokenJson => Some(Note::InvalidJsonErrorBody),
        Shape::Text => Some(Note::TextErrorBody),
        Shape::OtherJson => Some(Note::UnknownErrorShape),
    }
}
