//! [`FakeUpstream`]: a fake LLM provider served over real HTTP/1.1 on
//! loopback, speaking OpenAI chat completions, Anthropic Messages and the
//! OpenAI Responses API, with faults chosen per request.
//!
//! # Endpoints
//!
//! - `POST /v1/chat/completions`: a streamed answer (`"stream": true`: a
//!   role chunk, N content chunks, a finish chunk, a usage chunk when
//!   `stream_options.include_usage` is true, `data: [DONE]`) or a JSON
//!   `chat.completion` with `usage`. Token `i` reads `"{name}-tok{i} "`, so a
//!   spliced answer shows both names. With a non-empty `tools` in the
//!   request the answer is one tool call instead of text: streamed, the
//!   role chunk, a chunk opening `tool_calls[0]` (`id` `"call_fake"`,
//!   [`chunks::TOOL_CALL_ID`]; `type`
//!   `function`; the function [`TOOL_NAME`](crate::messages::TOOL_NAME),
//!   as on Messages, with empty `arguments`), then argument pieces that
//!   join into `{"q": "<tokens>"}` (an opening piece, one piece per token,
//!   a closing piece), `finish_reason` `tool_calls`, the usage chunk when
//!   asked for and `[DONE]`; whole, a `message` with `content: null` and
//!   that `tool_calls` entry, `finish_reason` `tool_calls`. The faults
//!   apply as to text (the opening chunk names the tool, so it is output:
//!   a cut after 0 tokens comes before it). Counted in
//!   [`FakeUpstream::attempts`] and recorded in [`FakeUpstream::requests`],
//!   whatever the outcome.
//! - `POST /v1/messages`: the same in Anthropic's Messages API, with the
//!   same faults: a stream of `message_start`, an empty text block, `ping`,
//!   N `text_delta`s, `message_delta` (`end_turn`) and `message_stop`, or a
//!   JSON `message`; with `tools` in the request, a `tool_use` block whose
//!   input comes as `input_json_delta`s (one per token). Errors are
//!   Anthropic's (`{"type":"error","error":{...}}`, 529 `overloaded_error`,
//!   `anthropic-ratelimit-*` headers on every answer); an in-band error
//!   (`error_after=N`) is `event: error` with `overloaded_error` by default,
//!   so `error_after=0` fails after `message_start`, before any output. See
//!   the [`messages` module](crate::messages).
//! - `POST /v1/responses`: the same in OpenAI's Responses API, with the
//!   same faults: a stream of `response.created`, `response.in_progress`,
//!   a message item and its empty `output_text` part, N
//!   `response.output_text.delta`s, the `.done` events and
//!   `response.completed` (with `usage`), each event's data carrying its
//!   `type` and a `sequence_number` from 0; or the JSON response object.
//!   With a function tool in the request, a `function_call` item whose
//!   arguments come as `response.function_call_arguments.delta`s. Errors
//!   before the body are chat's (bodies and headers); an in-band error
//!   (`error_after=N`) is `response.failed` (`server_error` by default), so
//!   `error_after=0` fails before any output. See the [`responses`
//!   module](crate::responses).
//! - `GET /v1/models`: the configured model ids.
//! - `POST /control/fault`: arms a fault (JSON below); `GET /control/attempts`
//!   answers `{"attempts": N}`; `POST /control/reset` zeroes the attempt
//!   count and the recorded requests.
//!
//! # Choosing a fault
//!
//! A fault is written as `;`-separated items: one fault item plus its
//! options, and optionally the per-request settings `tokens=N` (content
//! chunks in the answer) and `pace_ms=MS` (wait between chunks).
//!
//! | spec | what the client gets |
//! |---|---|
//! | `status=429` | that status before any body, JSON error body: the OpenAI fixture for the status ([`ErrorFixture::for_status`]) |
//! | `status=429;retry_after=2` | plus `retry-after: 2` (`retry_after_ms=500` adds `retry-after-ms: 500`) |
//! | `status=429;error=quota` | with another fixture's body ([`ErrorFixture`] names) |
//! | `error_after=3` | role chunk, 3 tokens, then OpenAI's in-band `data: {"error":...}` event (server_error; `error=NAME` picks another), end of body, no `[DONE]` |
//! | `reset_after=3` | role chunk, 3 tokens, then the connection is reset (RST, no terminating chunk) |
//! | `stall_after=3` | role chunk, 3 tokens, then silence (the connection stays open) |
//! | `eof_after=3` | role chunk, 3 tokens, then a clean end of body: no finish, no `[DONE]` |
//! | `malformed_at=3` | token 3 is preceded by a truncated-JSON `data:` event; the stream then goes on normally |
//! | `no_done` | the whole answer, finish and usage included, without `data: [DONE]` |
//! | `no_response` | the request is read and never answered |
//! | `slow_first_token=200` | the role chunk, then 200 ms before the first content chunk |
//! | `refusal` | the model declines: [`REFUSAL`] in `refusal` deltas (piece by piece), `finish_reason` `stop` ([`Fault::Refusal`] for the other wires) |
//!
//! Without `"stream": true` the answer is one JSON body: `status` and
//! `no_response` are the same; `slow_first_token` delays the head;
//! `refusal` answers `content: null` and `refusal` [`REFUSAL`];
//! `error_after` answers 200 with an `{"error":...}` body; `reset_after`,
//! `stall_after`, `eof_after` and `malformed_at` send the first half of the
//! completion JSON and then reset, stall or end; `no_done` changes nothing.
//! A non-streamed answer is held for `tokens × pace` before it is sent.
//!
//! Per request, a fault is picked by the **model name**: a model containing
//! `fault:` uses the spec after it (`"model": "fault:status=503"`,
//! `"model": "gpt-4o#fault:reset_after=5;tokens=40"`); a bad spec answers
//! 400. Otherwise the **armed fault** applies, set from Rust
//! ([`FakeUpstream::set_fault`], [`FakeUpstream::set_fault_times`]) or over
//! HTTP:
//!
//! ```text
//! POST /control/fault  {"fault": "status=429;retry_after=2", "times": 2}
//! POST /control/fault  {"fault": {"kind": "reset_after", "tokens": 3}}
//! POST /control/fault  {"fault": null}
//! ```
//!
//! `fault` is a spec string or a [`Fault`] as JSON (tagged by `kind`);
//! `times` arms it for the next K requests, on any of the three APIs
//! (omitted: every request
//! until replaced); `null` clears it. A model-name fault wins over the
//! armed one and does not use it up.
//!
//! # TLS
//!
//! [`FakeUpstreamBuilder::tls`] serves HTTPS instead, with the rustls
//! server config given (certificates, client certificate checks): HTTP/2
//! when the client picks `h2` by ALPN, HTTP/1.1 otherwise. The base URL is
//! then `https://127.0.0.1:PORT/v1`, so the certificate needs the IP
//! address `127.0.0.1` among its subject alternative names.
//! [`FakeUpstream::connections`] counts accepted connections (whatever
//! became of their handshake), to check connection reuse;
//! [`FakeUpstream::open_connections`] those still open.
//!
//! # Example
//!
//! ```
//! use tower_llm_testing::upstream::{Fault, FakeUpstream};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let primary = FakeUpstream::start("primary").await;
//! assert!(primary.base_url().starts_with("http://127.0.0.1:"));
//! assert!(primary.base_url().ends_with("/v1"));
//!
//! // The next two chat requests fail with a 429 and Retry-After: 2.
//! primary.set_fault_times("status=429;retry_after=2".parse().unwrap(), 2);
//! assert_eq!(primary.attempts(), 0);
//! # }
//! ```

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use super::chunks;
use super::messages;
use super::responses;
use super::{ScriptedBody, Step};

/// Content chunks in an answer unless configured otherwise.
pub const DEFAULT_TOKENS: usize = 8;

/// Largest request body read; larger ones get a 413.
const MAX_REQUEST_BODY: usize = 16 * 1024 * 1024;

/// An OpenAI error body the fake answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorFixture {
    /// 429 `rate_limit_exceeded` (retry the same provider).
    RateLimit,
    /// 429 `insufficient_quota` (go elsewhere).
    Quota,
    /// 400 `context_length_exceeded`.
    ContextLength,
    /// 400 `invalid_request_error` with no code.
    BadRequest,
    /// 401 `invalid_api_key`.
    InvalidKey,
    /// 403 unsupported country.
    Forbidden,
    /// 404 `model_not_found`.
    ModelNotFound,
    /// 500 `server_error` (also OpenAI's mid-stream error).
    ServerError,
    /// 503 overloaded (529 `overloaded_error` on `/v1/messages`).
    Overloaded,
    /// 413 request too large.
    RequestTooLarge,
}

impl ErrorFixture {
    /// The fixture a status answers with by default.
    pub fn for_status(status: u16) -> Self {
        match status {
            401 => Self::InvalidKey,
            403 => Self::Forbidden,
            404 => Self::ModelNotFound,
            413 => Self::RequestTooLarge,
            429 => Self::RateLimit,
            503 | 529 => Self::Overloaded,
            500..=599 => Self::ServerError,
            _ => Self::BadRequest,
        }
    }

    /// The JSON body, `{"error":{...}}`, in OpenAI's shape (`/v1/messages`
    /// answers Anthropic's `{"type":"error","error":{...}}` instead).
    pub fn body(self) -> &'static str {
        match self {
            Self::RateLimit => {
                r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 199434, Requested 2299. Please try again in 519ms. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#
            }
            Self::Quota => {
                r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#
            }
            Self::ContextLength => {
                r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#
            }
            Self::BadRequest => {
                r#"{"error":{"message":"Invalid request (fake upstream).","type":"invalid_request_error","param":null,"code":null}}"#
            }
            Self::InvalidKey => {
                r#"{"error":{"message":"Incorrect API key provided: sk-fake***. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#
            }
            Self::Forbidden => {
                r#"{"error":{"message":"Country, region, or territory not supported","type":"request_forbidden","param":null,"code":"unsupported_country_region_territory"}}"#
            }
            Self::ModelNotFound => {
                r#"{"error":{"message":"The model `gpt-x` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#
            }
            Self::ServerError => {
                r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#
            }
            Self::Overloaded => {
                r#"{"error":{"message":"The engine is currently overloaded, please try again later.","type":"server_error","param":null,"code":"server_is_overloaded"}}"#
            }
            Self::RequestTooLarge => {
                r#"{"error":{"message":"Request too large (fake upstream).","type":"invalid_request_error","param":null,"code":"request_too_large"}}"#
            }
        }
    }
}

impl FromStr for ErrorFixture {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        serde_json::from_value(Value::String(s.to_owned()))
            .map_err(|_| format!("unknown error fixture {s:?}"))
    }
}

/// What goes wrong with a request (chat completions, Messages or
/// Responses; the fault is the same, each wire says it its own way). See the [module
/// docs](self) for the spec syntax ([`FromStr`]) and the JSON form (tagged
/// by `kind`, e.g. `{"kind":"reset_after","tokens":3}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Fault {
    /// This status before any body.
    Status {
        /// The HTTP status.
        status: u16,
        /// A `retry-after` header value (seconds or an HTTP date).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after: Option<String>,
        /// A `retry-after-ms` header value.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
        /// The fixture for the body (default: [`ErrorFixture::for_status`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorFixture>,
        /// A body of its own: a JSON string is sent as its raw text (an
        /// HTML 502 page), any other value as JSON. Wins over `error`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<Value>,
    },
    /// `tokens` content chunks, then an in-band `data: {"error":...}` event.
    ErrorAfter {
        /// Content chunks before the error.
        tokens: usize,
        /// The error (default [`ErrorFixture::ServerError`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorFixture>,
    },
    /// `tokens` content chunks, then a connection reset.
    ResetAfter {
        /// Content chunks before the reset.
        tokens: usize,
    },
    /// `tokens` content chunks, then nothing, forever.
    StallAfter {
        /// Content chunks before the stall.
        tokens: usize,
    },
    /// `tokens` content chunks, then a clean end of body (no finish chunk,
    /// no `[DONE]`).
    EofAfter {
        /// Content chunks before the end.
        tokens: usize,
    },
    /// A truncated-JSON event before content chunk `tokens`.
    MalformedAt {
        /// Good content chunks before the malformed one.
        tokens: usize,
    },
    /// The whole answer without `data: [DONE]`.
    MissingDone,
    /// The request is read and never answered.
    NoResponse,
    /// A delay before the first content chunk (before the head when not
    /// streaming).
    SlowFirstToken {
        /// The delay in milliseconds.
        delay_ms: u64,
    },
    /// The model refuses: the answer is [`REFUSAL`], piece by piece (one
    /// piece per word, paced like tokens), instead of text or a tool
    /// call, and the stream ends normally. Chat completions: deltas
    /// `{"refusal": piece}` after the role chunk, `finish_reason` `stop`
    /// (whole: `message.content` `null`, `message.refusal` the text).
    /// Messages: `text_delta`s of the text and `stop_reason` `refusal`.
    /// Responses: a message whose content part is a `refusal`
    /// (`response.refusal.delta`s, `response.refusal.done`).
    Refusal,
}

/// The text of a [`Fault::Refusal`] answer, on every wire.
pub const REFUSAL: &str = "I can't help with that.";

/// The pieces a refusal streams in: [`REFUSAL`] word by word, each with
/// the space after it.
pub(crate) fn refusal_pieces() -> impl Iterator<Item = &'static str> {
    REFUSAL.split_inclusive(' ')
}

impl Fault {
    /// After how many tokens a mid-stream fault cuts the stream (error,
    /// reset, stall or EOF); `None` for the others.
    pub(crate) fn cut_after(&self) -> Option<usize> {
        match self {
            Fault::ErrorAfter { tokens: n, .. }
            | Fault::ResetAfter { tokens: n }
            | Fault::StallAfter { tokens: n }
            | Fault::EofAfter { tokens: n } => Some(*n),
            _ => None,
        }
    }

    /// The token a `MalformedAt` fault replaces with a malformed event.
    pub(crate) fn malformed_at(&self) -> Option<usize> {
        match self {
            Fault::MalformedAt { tokens: n } => Some(*n),
            _ => None,
        }
    }

    /// `status` before any body, with the fixture for the status.
    pub fn status(status: u16) -> Self {
        Self::Status {
            status,
            retry_after: None,
            retry_after_ms: None,
            error: None,
            body: None,
        }
    }

    /// `status` with `retry-after: secs`.
    pub fn status_retry_after(status: u16, secs: u64) -> Self {
        Self::Status {
            status,
            retry_after: Some(secs.to_string()),
            retry_after_ms: None,
            error: None,
            body: None,
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    /// Parses the spec syntax of the [module docs](self), without the
    /// per-request `tokens`/`pace_ms` settings.
    fn from_str(s: &str) -> Result<Self, String> {
        let spec = Spec::parse(s)?;
        if spec.tokens.is_some() || spec.pace.is_some() {
            return Err("tokens= and pace_ms= are per-request settings, not faults".to_owned());
        }
        spec.fault.ok_or_else(|| format!("no fault in {s:?}"))
    }
}

/// A parsed spec: a fault and the per-request settings.
#[derive(Debug, Clone, Default, PartialEq)]
struct Spec {
    fault: Option<Fault>,
    tokens: Option<usize>,
    pace: Option<Duration>,
}

/// A spec item's number, or an error naming the item.
fn spec_number<T: FromStr>(key: &str, value: Option<&str>) -> Result<T, String> {
    let value = value.ok_or_else(|| format!("{key} needs a value ({key}=N)"))?;
    value
        .trim()
        .parse()
        .map_err(|_| format!("{key}={value}: not a number"))
}

/// The `retry_after`, `retry_after_ms` and `error` items of a spec: they
/// refine its fault, so they are attached once every item is read.
#[derive(Default)]
struct FaultDetails {
    retry_after: Option<String>,
    retry_after_ms: Option<u64>,
    error: Option<ErrorFixture>,
}

impl FaultDetails {
    /// Attaches the details to the fault they go with: all three to a
    /// `status=`, `error=` alone to an `error_after=`; an error for any
    /// other pairing.
    fn attach(self, fault: &mut Option<Fault>) -> Result<(), String> {
        match fault {
            Some(Fault::Status {
                retry_after: ra,
                retry_after_ms: ra_ms,
                error: e,
                ..
            }) => {
                *ra = self.retry_after;
                *ra_ms = self.retry_after_ms;
                *e = self.error;
            }
            Some(Fault::ErrorAfter { error: e, .. })
                if self.retry_after.is_none() && self.retry_after_ms.is_none() =>
            {
                *e = self.error;
            }
            _ if self.retry_after.is_some()
                || self.retry_after_ms.is_some()
                || self.error.is_some() =>
            {
                return Err(
                    "retry_after/retry_after_ms go with status=, error= with status= or error_after="
                        .to_owned(),
                );
            }
            _ => {}
        }
        Ok(())
    }
}

impl Spec {
    fn parse(s: &str) -> Result<Self, String> {
        let mut spec = Self::default();
        let mut details = FaultDetails::default();
        for item in s.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (item, None),
            };
            if spec.read_setting(key, value, &mut details)? {
                continue;
            }
            let fault = parse_fault(key, value)?;
            if spec.fault.replace(fault).is_some() {
                return Err(format!("more than one fault in {s:?}"));
            }
        }
        details.attach(&mut spec.fault)?;
        Ok(spec)
    }

    /// Reads an item that is not a fault itself: a per-request setting
    /// (`tokens`, `pace_ms`) or a detail of the fault. False when `key`
    /// is none of them.
    fn read_setting(
        &mut self,
        key: &str,
        value: Option<&str>,
        details: &mut FaultDetails,
    ) -> Result<bool, String> {
        match key {
            "tokens" => self.tokens = Some(spec_number(key, value)?),
            "pace_ms" => self.pace = Some(Duration::from_millis(spec_number(key, value)?)),
            "retry_after" => {
                details.retry_after = Some(
                    value
                        .filter(|v| !v.is_empty())
                        .ok_or("retry_after needs a value")?
                        .to_owned(),
                );
            }
            "retry_after_ms" => details.retry_after_ms = Some(spec_number(key, value)?),
            "error" => details.error = Some(value.ok_or("error needs a fixture name")?.parse()?),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// The fault a spec item names (`status=`, `error_after=`, ...).
fn parse_fault(key: &str, value: Option<&str>) -> Result<Fault, String> {
    Ok(match key {
        "status" => {
            let status: u16 = spec_number(key, value)?;
            if StatusCode::from_u16(status).is_err() {
                return Err(format!("status={status}: not an HTTP status"));
            }
            Fault::status(status)
        }
        "error_after" => Fault::ErrorAfter {
            tokens: spec_number(key, value)?,
            error: None,
        },
        "reset_after" => Fault::ResetAfter {
            tokens: spec_number(key, value)?,
        },
        "stall_after" => Fault::StallAfter {
            tokens: spec_number(key, value)?,
        },
        "eof_after" => Fault::EofAfter {
            tokens: spec_number(key, value)?,
        },
        "malformed_at" => Fault::MalformedAt {
            tokens: spec_number(key, value)?,
        },
        "no_done" | "missing_done" => Fault::MissingDone,
        "no_response" => Fault::NoResponse,
        "refusal" => Fault::Refusal,
        "slow_first_token" => Fault::SlowFirstToken {
            delay_ms: spec_number(key, value)?,
        },
        other => return Err(format!("unknown fault item {other:?}")),
    })
}

/// A chat completion, Messages or Responses request the fake received.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SeenRequest {
    /// The method.
    pub method: Method,
    /// The path and query.
    pub path: String,
    /// Every header as received.
    pub headers: HeaderMap,
    /// The body as JSON (`Value::Null` when it was not JSON).
    pub body: Value,
}

impl SeenRequest {
    /// The body's `model`.
    pub fn model(&self) -> Option<&str> {
        self.body.get("model").and_then(Value::as_str)
    }

    /// A header's value, when present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A fault armed for the next `remaining` requests (`None`: all).
#[derive(Debug, Clone)]
struct Armed {
    spec: Spec,
    remaining: Option<u32>,
}

struct State {
    name: Arc<str>,
    tokens: usize,
    pace: Duration,
    api_key: Option<String>,
    models: Vec<String>,
    attempts: AtomicUsize,
    /// Accepted TCP connections.
    connections: AtomicUsize,
    /// Accepted TCP connections not yet ended.
    open: Arc<AtomicUsize>,
    requests: Mutex<Vec<SeenRequest>>,
    armed: Mutex<Option<Armed>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not take the fake down with it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    fn arm(&self, spec: Option<Spec>, times: Option<u32>) {
        *lock(&self.armed) = match (spec, times) {
            (None, _) | (_, Some(0)) => None,
            (Some(spec), remaining) => Some(Armed { spec, remaining }),
        };
    }

    fn take_armed(&self) -> Spec {
        let mut armed = lock(&self.armed);
        let Some(a) = armed.as_mut() else {
            return Spec::default();
        };
        let spec = a.spec.clone();
        if let Some(n) = a.remaining.as_mut() {
            *n = n.saturating_sub(1);
            if *n == 0 {
                *armed = None;
            }
        }
        spec
    }
}

/// Builds a [`FakeUpstream`]; start with [`FakeUpstream::builder`].
#[derive(Debug, Clone)]
pub struct FakeUpstreamBuilder {
    name: String,
    port: u16,
    tokens: usize,
    pace: Duration,
    fault: Option<Fault>,
    api_key: Option<String>,
    models: Vec<String>,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl FakeUpstreamBuilder {
    /// Serves HTTPS with this rustls server config (see [TLS](self#tls)).
    /// When the config offers no ALPN protocol, the fake offers `h2` and
    /// `http/1.1`; set `alpn_protocols` to `[b"http/1.1"]` for an
    /// HTTP/1.1-only server.
    pub fn tls(mut self, config: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// The loopback port (default 0: a free one).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Content chunks per answer (default [`DEFAULT_TOKENS`]).
    pub fn tokens(mut self, tokens: usize) -> Self {
        self.tokens = tokens;
        self
    }

    /// Wait between content chunks (default none).
    pub fn pace(mut self, pace: Duration) -> Self {
        self.pace = pace;
        self
    }

    /// A fault armed for every request from the start (a flaky provider).
    pub fn fault(mut self, fault: Fault) -> Self {
        self.fault = Some(fault);
        self
    }

    /// Require `Authorization: Bearer <key>` on chat and Responses
    /// requests (`x-api-key: <key>` on Messages); others get a 401
    /// (OpenAI's `invalid_api_key`, Anthropic's `authentication_error`).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The ids `GET /v1/models` lists (default `["fake-model"]`).
    pub fn models<I, S>(mut self, models: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// Binds `127.0.0.1:port` and starts serving on the current Tokio
    /// runtime.
    pub async fn start(self) -> io::Result<FakeUpstream> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, self.port)).await?;
        let addr = listener.local_addr()?;
        let tls = self.tls.map(|config| {
            let mut config = Arc::unwrap_or_clone(config);
            if config.alpn_protocols.is_empty() {
                config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            }
            TlsAcceptor::from(Arc::new(config))
        });
        let scheme = if tls.is_some() { "https" } else { "http" };
        let state = Arc::new(State {
            name: self.name.into(),
            tokens: self.tokens,
            pace: self.pace,
            api_key: self.api_key,
            models: self.models,
            attempts: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            open: Arc::new(AtomicUsize::new(0)),
            requests: Mutex::new(Vec::new()),
            armed: Mutex::new(None),
        });
        state.arm(
            self.fault.map(|fault| Spec {
                fault: Some(fault),
                ..Spec::default()
            }),
            None,
        );
        let (shutdown, watch) = watch::channel(());
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&state), watch, tls));
        Ok(FakeUpstream {
            addr,
            scheme,
            state,
            _shutdown: shutdown,
            accept,
        })
    }
}

/// An OpenAI-compatible fake provider on `127.0.0.1`; see the [module
/// docs](self). Dropping it closes the listener and every connection.
pub struct FakeUpstream {
    addr: SocketAddr,
    scheme: &'static str,
    state: Arc<State>,
    /// Dropped with the fake: every connection task watches it and ends.
    _shutdown: watch::Sender<()>,
    accept: JoinHandle<()>,
}

impl FakeUpstream {
    /// Starts a fake named `name` on a free loopback port, with the
    /// defaults ([`DEFAULT_TOKENS`] tokens, no pacing, no fault).
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound (use
    /// [`builder`](Self::builder)`(..).start()` for the `io::Error`).
    pub async fn start(name: impl Into<String>) -> Self {
        match Self::builder(name).start().await {
            Ok(fake) => fake,
            Err(e) => panic!("FakeUpstream: cannot bind 127.0.0.1: {e}"),
        }
    }

    /// A builder for a fake named `name`.
    pub fn builder(name: impl Into<String>) -> FakeUpstreamBuilder {
        FakeUpstreamBuilder {
            name: name.into(),
            port: 0,
            tokens: DEFAULT_TOKENS,
            pace: Duration::ZERO,
            fault: None,
            api_key: None,
            models: vec!["fake-model".to_owned()],
            tls: None,
        }
    }

    /// The provider name carried in every token.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/v1` (`https://` when serving TLS), the base
    /// URL an OpenAI client takes.
    pub fn base_url(&self) -> String {
        format!("{}://{}/v1", self.scheme, self.addr)
    }

    /// TCP connections accepted so far (a TLS handshake may still have
    /// failed on them).
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// TCP connections open now: accepted and not yet ended (the client
    /// closed or reset it, or the fake closed it). A client that drops a
    /// streamed answer midway closes its connection, so this tells a test
    /// that the stream was let go.
    pub fn open_connections(&self) -> usize {
        self.state.open.load(Ordering::SeqCst)
    }

    /// Chat completion, Messages and Responses requests seen so far,
    /// whatever their outcome.
    pub fn attempts(&self) -> usize {
        self.state.attempts.load(Ordering::SeqCst)
    }

    /// The chat completion, Messages and Responses requests seen so far,
    /// oldest first.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.state.requests).clone()
    }

    /// Arms `fault` for every following request until replaced.
    pub fn set_fault(&self, fault: Fault) {
        self.state.arm(
            Some(Spec {
                fault: Some(fault),
                ..Spec::default()
            }),
            None,
        );
    }

    /// Arms `fault` for the next `times` requests.
    pub fn set_fault_times(&self, fault: Fault, times: u32) {
        self.state.arm(
            Some(Spec {
                fault: Some(fault),
                ..Spec::default()
            }),
            Some(times),
        );
    }

    /// Disarms the fault.
    pub fn clear_fault(&self) {
        self.state.arm(None, None);
    }

    /// Zeroes the attempt count and forgets the recorded requests.
    pub fn reset_history(&self) {
        self.state.attempts.store(0, Ordering::SeqCst);
        lock(&self.state.requests).clear();
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl fmt::Debug for FakeUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeUpstream")
            .field("name", &self.state.name)
            .field("addr", &self.addr)
            .field("scheme", &self.scheme)
            .field("attempts", &self.attempts())
            .finish_non_exhaustive()
    }
}

/// The longest a TLS handshake may take before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    shutdown: watch::Receiver<()>,
    tls: Option<TlsAcceptor>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of file descriptors and the like: back off, go on.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        state.connections.fetch_add(1, Ordering::SeqCst);
        let open = OpenConnection::count(&state.open);
        // Many small writes per stream: no Nagle delay on our side either.
        let _ = stream.set_nodelay(true);
        let reset = Arc::new(AtomicBool::new(false));
        let io = ConnIo {
            stream,
            reset: Arc::clone(&reset),
        };
        let state = Arc::clone(&state);
        let mut shutdown = shutdown.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            // Counted open until this task ends, however it ends.
            let _open = open;
            let serving = async move {
                match tls {
                    None => serve(TokioIo::new(io), state, reset, false).await,
                    Some(acceptor) => {
                        let handshake =
                            tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(io));
                        // A failed handshake (the client distrusts us, or
                        // we it) just ends the connection.
                        let Ok(Ok(stream)) = handshake.await else {
                            return;
                        };
                        let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                        serve(TokioIo::new(stream), state, reset, h2).await;
                    }
                }
            };
            tokio::select! {
                _ = serving => {}
                _ = shutdown.changed() => {}
            }
        });
    }
}

/// Serves one connection, HTTP/1.1 or HTTP/2, until it ends.
async fn serve<I>(io: I, state: Arc<State>, reset: Arc<AtomicBool>, h2: bool)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let state = Arc::clone(&state);
        let reset = Arc::clone(&reset);
        async move { Ok::<_, Infallible>(handle(&state, reset, request).await) }
    });
    if h2 {
        let _ = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(io, service)
            .await;
    } else {
        let _ = http1::Builder::new()
            .timer(TokioTimer::new())
            .serve_connection(io, service)
            .await;
    }
}

/// One open connection in [`State::open`], counted until dropped.
struct OpenConnection(Arc<AtomicUsize>);

impl OpenConnection {
    fn count(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(open))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The accepted socket; after a reset fault it is closed with an RST
/// (linger zero) instead of a FIN.
struct ConnIo {
    stream: TcpStream,
    reset: Arc<AtomicBool>,
}

impl Drop for ConnIo {
    fn drop(&mut self) {
        if self.reset.load(Ordering::SeqCst) {
            // Linger zero never blocks: the close sends RST at once.
            #[allow(deprecated)]
            let _ = self.stream.set_linger(Some(Duration::ZERO));
        }
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.reset.load(Ordering::SeqCst) {
            // No FIN before the RST.
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The response body: a script, optionally ending in a connection reset.
struct FakeBody {
    inner: ScriptedBody,
    /// Set: after the script, reset the connection.
    reset: Option<Arc<AtomicBool>>,
    yielded: bool,
}

impl FakeBody {
    fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            inner: ScriptedBody::new(steps),
            reset: None,
            yielded: false,
        }
    }
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) if self.reset.is_some() => {
                if !self.yielded {
                    // Pending once so hyper flushes the chunks it holds:
                    // the client must get all N before the reset.
                    self.yielded = true;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                if let Some(flag) = self.reset.take() {
                    flag.store(true, Ordering::SeqCst);
                }
                Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "fake upstream: reset fault",
                ))))
            }
            other => other,
        }
    }
}

impl fmt::Debug for FakeBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeBody")
            .field("reset", &self.reset.is_some())
            .finish()
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: FakeBody) -> Response<FakeBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json(status: StatusCode, body: impl Into<Bytes>) -> Response<FakeBody> {
    respond(
        status,
        "application/json",
        FakeBody::new([Step::Data(body.into())]),
    )
}

fn openai_error(
    status: StatusCode,
    message: &str,
    kind: &str,
    code: Option<&str>,
) -> Response<FakeBody> {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    json(status, body.to_string())
}

async fn handle(
    state: &State,
    reset: Arc<AtomicBool>,
    request: Request<Incoming>,
) -> Response<FakeBody> {
    let path = request.uri().path();
    match (request.method(), path) {
        (&Method::POST, "/v1/chat/completions") => chat(state, reset, request, Wire::Chat).await,
        (&Method::POST, "/v1/messages") => chat(state, reset, request, Wire::Messages).await,
        (&Method::POST, "/v1/responses") => chat(state, reset, request, Wire::Responses).await,
        (&Method::GET, "/v1/models") => {
            let data: Vec<Value> = state
                .models
                .iter()
                .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": &*state.name}))
                .collect();
            json(
                StatusCode::OK,
                json!({"object": "list", "data": data}).to_string(),
            )
        }
        (&Method::POST, "/control/fault") => control_fault(state, request).await,
        (&Method::GET, "/control/attempts") => json(
            StatusCode::OK,
            json!({"attempts": state.attempts.load(Ordering::SeqCst)}).to_string(),
        ),
        (&Method::POST, "/control/reset") => {
            state.attempts.store(0, Ordering::SeqCst);
            lock(&state.requests).clear();
            json(StatusCode::OK, r#"{"ok":true}"#)
        }
        _ => {
            let message = format!("Unknown request URL: {} {path}.", request.method());
            openai_error(
                StatusCode::NOT_FOUND,
                &message,
                "invalid_request_error",
                Some("unknown_url"),
            )
        }
    }
}

/// The request body, or the 413 to answer when it is too large or broken.
async fn read_body(body: Incoming) -> Result<Bytes, Box<Response<FakeBody>>> {
    match Limited::new(body, MAX_REQUEST_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(_) => Err(Box::new(openai_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request body too large or unreadable (fake upstream).",
            "invalid_request_error",
            None,
        ))),
    }
}

async fn control_fault(state: &State, request: Request<Incoming>) -> Response<FakeBody> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum FaultInput {
        Spec(String),
        Fault(Fault),
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Control {
        #[serde(default)]
        fault: Option<FaultInput>,
        #[serde(default)]
        times: Option<u32>,
    }
    let bytes = match read_body(request.into_body()).await {
        Ok(bytes) => bytes,
        Err(response) => return *response,
    };
    let bad = |message: String| {
        openai_error(
            StatusCode::BAD_REQUEST,
            &message,
            "invalid_request_error",
            None,
        )
    };
    let control: Control = match serde_json::from_slice(&bytes) {
        Ok(control) => control,
        Err(e) => return bad(format!("bad control body: {e}")),
    };
    let spec = match control.fault {
        None => None,
        Some(FaultInput::Spec(text)) => match Spec::parse(&text) {
            Ok(spec) => Some(spec),
            Err(e) => return bad(format!("bad fault spec: {e}")),
        },
        Some(FaultInput::Fault(fault)) => Some(Spec {
            fault: Some(fault),
            ..Spec::default()
        }),
    };
    let fault = spec.as_ref().and_then(|s| s.fault.clone());
    state.arm(spec, control.times);
    json(
        StatusCode::OK,
        json!({"ok": true, "fault": fault, "times": control.times}).to_string(),
    )
}

/// What one chat request asked for.
struct Ask {
    model: String,
    stream: bool,
    include_usage: bool,
    /// The request has a non-empty `tools`: the answer is one tool call.
    tools: bool,
    input_tokens: u64,
}

impl Ask {
    /// The request's fields, or why it is a 400.
    fn read(body: &Value) -> Result<Self, &'static str> {
        let Some(model) = body.get("model").and_then(Value::as_str) else {
            return Err("you must provide a model parameter");
        };
        let words: usize = body
            .get("messages")
            .and_then(Value::as_array)
            .map(|messages| {
                messages
                    .iter()
                    .filter_map(|m| m.get("content").and_then(Value::as_str))
                    .map(|c| c.split_whitespace().count())
                    .sum()
            })
            .unwrap_or(0);
        Ok(Self {
            model: model.to_owned(),
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true),
            tools: body
                .get("tools")
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty()),
            input_tokens: u64::try_from(words.max(1)).unwrap_or(u64::MAX),
        })
    }
}

/// The API a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/messages`.
    Messages,
    /// `/v1/responses`: OpenAI's errors and headers, as on chat.
    Responses,
}

impl Wire {
    /// A 4xx error in this API's shape.
    fn error(self, status: StatusCode, message: &str) -> Response<FakeBody> {
        match self {
            Self::Chat | Self::Responses => {
                openai_error(status, message, "invalid_request_error", None)
            }
            Self::Messages => {
                let kind = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    "request_too_large"
                } else {
                    "invalid_request_error"
                };
                json(status, messages::error_json(kind, message))
            }
        }
    }
}

/// What a request asked for, in any of the APIs.
enum Asked {
    Chat(Ask),
    Messages(messages::MessagesAsk),
    Responses(responses::ResponsesAsk),
}

impl Asked {
    fn model(&self) -> &str {
        match self {
            Self::Chat(ask) => &ask.model,
            Self::Messages(ask) => &ask.model,
            Self::Responses(ask) => &ask.model,
        }
    }

    fn stream(&self) -> bool {
        match self {
            Self::Chat(ask) => ask.stream,
            Self::Messages(ask) => ask.stream,
            Self::Responses(ask) => ask.stream,
        }
    }
}

/// Answers a chat completion, Messages or Responses request: records it, checks its
/// key and body, then plays the fault its model name (or the armed spec)
/// names, or a normal answer.
async fn chat(
    state: &State,
    reset: Arc<AtomicBool>,
    request: Request<Incoming>,
    wire: Wire,
) -> Response<FakeBody> {
    state.attempts.fetch_add(1, Ordering::SeqCst);
    let (headers, body) = match record_request(state, request).await {
        Ok(seen) => seen,
        Err(response) => return *response,
    };
    if let Some(refusal) = refuse_wrong_key(state, wire, &headers) {
        return refusal;
    }
    let (ask, spec) = match read_ask(state, wire, &body) {
        Ok(read) => read,
        Err(response) => return *response,
    };
    let tokens = spec.tokens.unwrap_or(state.tokens);
    let pace = spec.pace.unwrap_or(state.pace);
    let fault = spec.fault;

    match &fault {
        Some(Fault::Status {
            status,
            retry_after,
            retry_after_ms,
            error,
            body,
        }) => {
            return status_response(
                wire,
                *status,
                retry_after.as_deref(),
                *retry_after_ms,
                *error,
                body.as_ref(),
            );
        }
        Some(Fault::NoResponse) => std::future::pending::<()>().await,
        _ => {}
    }

    let (steps, then_reset) = answer_steps(state, &ask, tokens, pace, fault.as_ref()).await;
    let mut body = FakeBody::new(steps);
    if then_reset {
        body.reset = Some(reset);
    }
    answer_response(state, wire, ask.stream(), body)
}

/// Reads a request's body and records the request in [`State::requests`];
/// gives back its headers and its body as JSON (`Value::Null` when it is
/// not JSON), or the error answer when the body could not be read.
async fn record_request(
    state: &State,
    request: Request<Incoming>,
) -> Result<(HeaderMap, Value), Box<Response<FakeBody>>> {
    let (parts, body) = request.into_parts();
    let bytes = read_body(body).await?;
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    lock(&state.requests).push(SeenRequest {
        method: parts.method.clone(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    Ok((parts.headers, body))
}

/// The 401 answer when the fake wants an API key and the request does not
/// carry it (`authorization: Bearer` for Chat and Responses, `x-api-key`
/// for Messages).
fn refuse_wrong_key(state: &State, wire: Wire, headers: &HeaderMap) -> Option<Response<FakeBody>> {
    let key = state.api_key.as_ref()?;
    let (header, expected) = match wire {
        Wire::Chat | Wire::Responses => (
            http::header::AUTHORIZATION.as_str(),
            format!("Bearer {key}"),
        ),
        Wire::Messages => ("x-api-key", key.clone()),
    };
    let given = headers.get(header).and_then(|v| v.to_str().ok());
    (given != Some(expected.as_str())).then(|| {
        json(
            StatusCode::UNAUTHORIZED,
            fixture_body(wire, ErrorFixture::InvalidKey),
        )
    })
}

/// What the request asks for and the fault spec that applies to it: the
/// one in its model name (`...fault:<spec>`), else the armed one. A 400 in
/// the API's shape when the body is not JSON, not a request, or its spec
/// does not parse.
fn read_ask(
    state: &State,
    wire: Wire,
    body: &Value,
) -> Result<(Asked, Spec), Box<Response<FakeBody>>> {
    if body.is_null() {
        return Err(Box::new(wire.error(
            StatusCode::BAD_REQUEST,
            "We could not parse the JSON body of your request.",
        )));
    }
    let bad = |message: &str| Box::new(wire.error(StatusCode::BAD_REQUEST, message));
    let ask = match wire {
        Wire::Chat => Ask::read(body).map(Asked::Chat).map_err(bad)?,
        Wire::Messages => messages::MessagesAsk::read(body)
            .map(Asked::Messages)
            .map_err(bad)?,
        Wire::Responses => responses::ResponsesAsk::read(body)
            .map(Asked::Responses)
            .map_err(|error| Box::new(json(StatusCode::BAD_REQUEST, error)))?,
    };
    let spec = match ask.model().split_once("fault:") {
        Some((_, text)) => Spec::parse(text).map_err(|e| {
            Box::new(wire.error(
                StatusCode::BAD_REQUEST,
                &format!("fake upstream: bad fault spec in model name: {e}"),
            ))
        })?,
        None => state.take_armed(),
    };
    Ok((ask, spec))
}

/// The answer's body as steps, and whether to reset the connection after
/// them: a stream paced token by token, or a whole body sent after the
/// time the stream would have taken (plus any first-token delay).
async fn answer_steps(
    state: &State,
    ask: &Asked,
    tokens: usize,
    pace: Duration,
    fault: Option<&Fault>,
) -> (VecDeque<Step>, bool) {
    if ask.stream() {
        return match ask {
            Asked::Chat(ask) => stream_steps(&state.name, ask, tokens, pace, fault),
            Asked::Messages(ask) => messages::stream_steps(&state.name, ask, tokens, pace, fault),
            Asked::Responses(ask) => responses::stream_steps(&state.name, ask, tokens, pace, fault),
        };
    }
    let hold = pace.saturating_mul(u32::try_from(tokens).unwrap_or(u32::MAX))
        + match fault {
            Some(Fault::SlowFirstToken { delay_ms }) => Duration::from_millis(*delay_ms),
            _ => Duration::ZERO,
        };
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
    match ask {
        Asked::Chat(ask) => completion_steps(&state.name, ask, tokens, fault),
        Asked::Messages(ask) => messages::message_steps(&state.name, ask, tokens, fault),
        Asked::Responses(ask) => responses::response_steps(&state.name, ask, tokens, fault),
    }
}

/// The 200 answer around `body`: an event stream or JSON, named by
/// `x-fake-upstream`, with Anthropic's rate-limit headers on Messages.
fn answer_response(state: &State, wire: Wire, stream: bool, body: FakeBody) -> Response<FakeBody> {
    let mut response = if stream {
        let mut r = respond(StatusCode::OK, "text/event-stream", body);
        r.headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    } else {
        respond(StatusCode::OK, "application/json", body)
    };
    if let Ok(name) = HeaderValue::from_str(&state.name) {
        response.headers_mut().insert("x-fake-upstream", name);
    }
    if wire == Wire::Messages {
        add_ratelimit_headers(&mut response, 49);
    }
    response
}

/// Anthropic's rate-limit headers, as a Messages answer carries them.
fn add_ratelimit_headers(response: &mut Response<FakeBody>, remaining: u32) {
    for (name, value) in messages::ratelimit_headers(remaining) {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
}

/// A fixture's body in the shape of the request's API.
fn fixture_body(wire: Wire, fixture: ErrorFixture) -> Bytes {
    match wire {
        Wire::Chat | Wire::Responses => Bytes::from_static(fixture.body().as_bytes()),
        Wire::Messages => Bytes::from(messages::error_body(fixture)),
    }
}

fn status_response(
    wire: Wire,
    status: u16,
    retry_after: Option<&str>,
    retry_after_ms: Option<u64>,
    error: Option<ErrorFixture>,
    body: Option<&Value>,
) -> Response<FakeBody> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let (content_type, bytes) = match body {
        Some(Value::String(text)) => ("text/plain", Bytes::from(text.clone())),
        Some(value) => ("application/json", Bytes::from(value.to_string())),
        None => (
            "application/json",
            fixture_body(
                wire,
                error.unwrap_or_else(|| ErrorFixture::for_status(status.as_u16())),
            ),
        ),
    };
    let mut response = respond(status, content_type, FakeBody::new([Step::Data(bytes)]));
    if wire == Wire::Messages {
        let remaining = if status == StatusCode::TOO_MANY_REQUESTS {
            0
        } else {
            49
        };
        add_ratelimit_headers(&mut response, remaining);
    }
    if let Some(value) = retry_after.and_then(|v| HeaderValue::from_str(v).ok()) {
        response.headers_mut().insert("retry-after", value);
    }
    if let Some(ms) = retry_after_ms {
        response
            .headers_mut()
            .insert("retry-after-ms", HeaderValue::from(ms));
    }
    response
}

fn token_text(name: &str, i: usize) -> String {
    format!("{name}-tok{i} ")
}

/// The first piece of a fake tool call's arguments, before the tokens (the
/// Messages and Responses fakes' arguments open the same way).
pub(crate) const TOOL_ARGUMENTS_OPEN: &str = "{\"q\": \"";

/// The last piece, after the tokens.
pub(crate) const TOOL_ARGUMENTS_CLOSE: &str = "\"}";

fn malformed(name: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"{}\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{name}-brok\n\n",
        chunks::ID
    ))
}

/// The SSE script for a streamed answer, and whether it ends in a reset.
fn stream_steps(
    name: &str,
    ask: &Ask,
    tokens: usize,
    pace: Duration,
    fault: Option<&Fault>,
) -> (VecDeque<Step>, bool) {
    if fault == Some(&Fault::Refusal) {
        return (refusal_stream_steps(ask, pace), false);
    }
    let model = ask.model.as_str();
    let cut = fault.and_then(Fault::cut_after);
    let malformed_at = fault.and_then(Fault::malformed_at);
    let mut steps = VecDeque::with_capacity(tokens * 2 + 8);
    steps.push_back(Step::Data(chunks::role(model)));
    // A tool call's first chunk names the tool: it is output, so a fault
    // before any token comes first (the in-band error before output).
    if ask.tools && cut != Some(0) {
        steps.push_back(Step::Data(chunks::tool_call_start(
            model,
            0,
            chunks::TOOL_CALL_ID,
            messages::TOOL_NAME,
        )));
        steps.push_back(Step::Data(chunks::tool_call_arguments(
            model,
            0,
            TOOL_ARGUMENTS_OPEN,
        )));
    }
    for i in 0..tokens {
        if cut == Some(i) {
            break;
        }
        if i == 0 {
            if let Some(Fault::SlowFirstToken { delay_ms }) = fault {
                steps.push_back(Step::Wait(Duration::from_millis(*delay_ms)));
            }
        } else if !pace.is_zero() {
            steps.push_back(Step::Wait(pace));
        }
        if malformed_at == Some(i) {
            steps.push_back(Step::Data(malformed(name)));
        }
        let token = token_text(name, i);
        steps.push_back(Step::Data(if ask.tools {
            chunks::tool_call_arguments(model, 0, &token)
        } else {
            chunks::content(model, &token)
        }));
    }
    match fault {
        Some(Fault::ErrorAfter { error, .. }) => {
            let error = error.unwrap_or(ErrorFixture::ServerError);
            steps.push_back(Step::Data(Bytes::from(format!(
                "data: {}\n\n",
                error.body()
            ))));
            return (steps, false);
        }
        Some(Fault::ResetAfter { .. }) => return (steps, true),
        Some(Fault::StallAfter { .. }) => {
            steps.push_back(Step::Stall);
            return (steps, false);
        }
        Some(Fault::EofAfter { .. }) => return (steps, false),
        _ => {}
    }
    if malformed_at.is_some_and(|n| n >= tokens) {
        steps.push_back(Step::Data(malformed(name)));
    }
    if ask.tools {
        steps.push_back(Step::Data(chunks::tool_call_arguments(
            model,
            0,
            TOOL_ARGUMENTS_CLOSE,
        )));
    }
    let finish = if ask.tools { "tool_calls" } else { "stop" };
    steps.push_back(Step::Data(chunks::finish(model, finish)));
    if ask.include_usage {
        steps.push_back(Step::Data(chunks::usage(
            model,
            ask.input_tokens,
            u64::try_from(tokens).unwrap_or(u64::MAX),
        )));
    }
    if !matches!(fault, Some(Fault::MissingDone)) {
        steps.push_back(Step::Data(chunks::done()));
    }
    (steps, false)
}

/// A streamed refusal: the role chunk, one `refusal` delta per piece of
/// [`REFUSAL`], finish `stop`, the usage chunk when asked for, `[DONE]`.
fn refusal_stream_steps(ask: &Ask, pace: Duration) -> VecDeque<Step> {
    let model = ask.model.as_str();
    let mut steps = VecDeque::from([Step::Data(chunks::role(model))]);
    for (i, piece) in refusal_pieces().enumerate() {
        if i > 0 && !pace.is_zero() {
            steps.push_back(Step::Wait(pace));
        }
        steps.push_back(Step::Data(chunks::refusal(model, piece)));
    }
    steps.push_back(Step::Data(chunks::finish(model, "stop")));
    if ask.include_usage {
        let pieces = u64::try_from(refusal_pieces().count()).unwrap_or(u64::MAX);
        steps.push_back(Step::Data(chunks::usage(model, ask.input_tokens, pieces)));
    }
    steps.push_back(Step::Data(chunks::done()));
    steps
}

/// The JSON script for a non-streamed answer, and whether it ends in a
/// reset.
fn completion_steps(
    name: &str,
    ask: &Ask,
    tokens: usize,
    fault: Option<&Fault>,
) -> (VecDeque<Step>, bool) {
    let text: String = (0..tokens).map(|i| token_text(name, i)).collect();
    let mut output_tokens = u64::try_from(tokens).unwrap_or(u64::MAX);
    let (message, finish_reason) = if fault == Some(&Fault::Refusal) {
        output_tokens = u64::try_from(refusal_pieces().count()).unwrap_or(u64::MAX);
        (
            json!({"role": "assistant", "content": null, "refusal": REFUSAL}),
            "stop",
        )
    } else if ask.tools {
        let arguments = format!("{TOOL_ARGUMENTS_OPEN}{text}{TOOL_ARGUMENTS_CLOSE}");
        (
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": chunks::TOOL_CALL_ID, "type": "function",
                 "function": {"name": messages::TOOL_NAME, "arguments": arguments}}]}),
            "tool_calls",
        )
    } else {
        (json!({"role": "assistant", "content": text}), "stop")
    };
    let full = Bytes::from(
        json!({
            "id": chunks::ID, "object": "chat.completion", "created": 1, "model": ask.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": ask.input_tokens, "completion_tokens": output_tokens,
                      "total_tokens": ask.input_tokens.saturating_add(output_tokens)}
        })
        .to_string(),
    );
    let half = full.slice(..full.len() / 2);
    let mut steps = VecDeque::with_capacity(2);
    match fault {
        Some(Fault::ErrorAfter { error, .. }) => {
            let error = error.unwrap_or(ErrorFixture::ServerError);
            steps.push_back(Step::Data(Bytes::from_static(error.body().as_bytes())));
        }
        Some(Fault::ResetAfter { .. }) => {
            steps.push_back(Step::Data(half));
            return (steps, true);
        }
        Some(Fault::StallAfter { .. }) => {
            steps.push_back(Step::Data(half));
            steps.push_back(Step::Stall);
        }
        Some(Fault::EofAfter { .. } | Fault::MalformedAt { .. }) => {
            steps.push_back(Step::Data(half));
        }
        _ => steps.push_back(Step::Data(full)),
    }
    (steps, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_syntax() {
        assert_eq!(
            "status=429;retry_after=2".parse::<Fault>().unwrap(),
            Fault::Status {
                status: 429,
                retry_after: Some("2".into()),
                retry_after_ms: None,
                error: None,
                body: None
            }
        );
        assert_eq!(
            " status = 429 ; error = quota ; retry_after_ms=500 "
                .parse::<Fault>()
                .unwrap(),
            Fault::Status {
                status: 429,
                retry_after: None,
                retry_after_ms: Some(500),
                error: Some(ErrorFixture::Quota),
                body: None
            }
        );
        assert_eq!(
            "error_after=3;error=rate_limit".parse::<Fault>().unwrap(),
            Fault::ErrorAfter {
                tokens: 3,
                error: Some(ErrorFixture::RateLimit)
            }
        );
        assert_eq!(
            "reset_after=0".parse::<Fault>().unwrap(),
            Fault::ResetAfter { tokens: 0 }
        );
        assert_eq!(
            "stall_after=2".parse::<Fault>().unwrap(),
            Fault::StallAfter { tokens: 2 }
        );
        assert_eq!(
            "eof_after=2".parse::<Fault>().unwrap(),
            Fault::EofAfter { tokens: 2 }
        );
        assert_eq!(
            "malformed_at=1".parse::<Fault>().unwrap(),
            Fault::MalformedAt { tokens: 1 }
        );
        assert_eq!("no_done".parse::<Fault>().unwrap(), Fault::MissingDone);
        assert_eq!("missing_done".parse::<Fault>().unwrap(), Fault::MissingDone);
        assert_eq!("no_response".parse::<Fault>().unwrap(), Fault::NoResponse);
        assert_eq!("refusal".parse::<Fault>().unwrap(), Fault::Refusal);
        assert_eq!(
            "slow_first_token=150".parse::<Fault>().unwrap(),
            Fault::SlowFirstToken { delay_ms: 150 }
        );
        let spec = Spec::parse("reset_after=40;tokens=80;pace_ms=5").unwrap();
        assert_eq!(spec.fault, Some(Fault::ResetAfter { tokens: 40 }));
        assert_eq!(spec.tokens, Some(80));
        assert_eq!(spec.pace, Some(Duration::from_millis(5)));
        assert_eq!(Spec::parse("tokens=3").unwrap().fault, None);
    }

    #[test]
    fn bad_specs_are_explained() {
        for (spec, needle) in [
            ("status=abc", "not a number"),
            ("status=99", "not an HTTP status"),
            ("status=429;reset_after=1", "more than one fault"),
            ("explode", "unknown fault item"),
            ("reset_after=1;retry_after=2", "retry_after"),
            ("status=500;error=nope", "unknown error fixture"),
            ("reset_after", "needs a value"),
            ("", "no fault"),
            ("tokens=3", "per-request"),
        ] {
            let err = spec.parse::<Fault>().unwrap_err();
            assert!(err.contains(needle), "{spec:?}: {err}");
        }
    }

    #[test]
    fn faults_round_trip_as_json() {
        for fault in [
            Fault::status_retry_after(429, 2),
            Fault::ErrorAfter {
                tokens: 1,
                error: None,
            },
            Fault::ResetAfter { tokens: 3 },
            Fault::MissingDone,
            Fault::NoResponse,
            Fault::SlowFirstToken { delay_ms: 5 },
            Fault::Refusal,
        ] {
            let text = serde_json::to_string(&fault).unwrap();
            assert_eq!(serde_json::from_str::<Fault>(&text).unwrap(), fault);
        }
        assert_eq!(
            serde_json::to_value(Fault::ResetAfter { tokens: 3 }).unwrap(),
            json!({"kind": "reset_after", "tokens": 3})
        );
    }

    #[test]
    fn fixtures_are_openai_errors_and_match_their_status() {
        for status in [400, 401, 403, 404, 429, 500, 502, 503] {
            let fixture = ErrorFixture::for_status(status);
            let body: Value = serde_json::from_str(fixture.body()).unwrap();
            assert!(body["error"]["message"].is_string(), "{status}");
        }
        assert_eq!(ErrorFixture::for_status(429), ErrorFixture::RateLimit);
        assert_eq!(
            "quota".parse::<ErrorFixture>().unwrap(),
            ErrorFixture::Quota
        );
    }

    fn tool_ask(stream: bool) -> Ask {
        Ask {
            model: "m".into(),
            stream,
            include_usage: true,
            tools: true,
            input_tokens: 3,
        }
    }

    /// The JSON of each `data:` event of a script (`[DONE]` and malformed
    /// events as `Null`).
    fn data_events(steps: &VecDeque<Step>) -> Vec<Value> {
        steps
            .iter()
            .filter_map(|step| match step {
                Step::Data(bytes) => Some(bytes),
                _ => None,
            })
            .map(|bytes| {
                let text = String::from_utf8_lossy(bytes);
                let data = text.trim_end().strip_prefix("data: ").unwrap_or_default();
                serde_json::from_str(data).unwrap_or(Value::Null)
            })
            .collect()
    }

    #[test]
    fn a_chat_request_with_tools_streams_one_tool_call() {
        let (steps, reset) = stream_steps("p", &tool_ask(true), 3, Duration::ZERO, None);
        assert!(!reset);
        let events = data_events(&steps);
        let delta = |i: usize| &events[i]["choices"][0]["delta"];
        assert_eq!(delta(0)["role"], "assistant");
        assert_eq!(
            delta(1)["tool_calls"],
            json!([{"index": 0, "id": "call_fake", "type": "function",
                    "function": {"name": crate::messages::TOOL_NAME, "arguments": ""}}])
        );
        // The opening piece, one per token, the closing piece.
        let pieces: Vec<&str> = (2..7)
            .map(|i| {
                assert_eq!(delta(i)["tool_calls"][0]["index"], 0);
                assert!(delta(i)["tool_calls"][0].get("id").is_none());
                delta(i)["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        let arguments: Value = serde_json::from_str(&pieces.concat()).unwrap();
        assert_eq!(arguments, json!({"q": "p-tok0 p-tok1 p-tok2 "}));
        assert_eq!(events[7]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(events[8]["usage"]["completion_tokens"], 3);
        assert_eq!(events[9], Value::Null, "[DONE]");
        assert_eq!(events.len(), 10);
        assert!(
            !events
                .iter()
                .any(|e| e["choices"][0]["delta"]["content"].as_str() > Some(""))
        );
    }

    #[test]
    fn a_tool_call_is_cut_like_text() {
        // Cut before any token: before the tool is named.
        let fault = Fault::ErrorAfter {
            tokens: 0,
            error: None,
        };
        let (steps, _) = stream_steps("p", &tool_ask(true), 3, Duration::ZERO, Some(&fault));
        let events = data_events(&steps);
        assert_eq!(events.len(), 2, "{events:?}");
        assert!(events[1]["error"].is_object());
        // Reset after 2 tokens: the opening chunk, the opening piece and 2
        // token pieces, then the reset; no finish.
        let fault = Fault::ResetAfter { tokens: 2 };
        let (steps, reset) = stream_steps("p", &tool_ask(true), 3, Duration::ZERO, Some(&fault));
        assert!(reset);
        let events = data_events(&steps);
        assert_eq!(events.len(), 5, "{events:?}");
        assert!(
            events
                .iter()
                .all(|e| e["choices"][0]["finish_reason"].is_null())
        );
    }

    #[test]
    fn a_whole_chat_answer_to_tools_is_a_tool_call() {
        let (steps, _) = completion_steps("p", &tool_ask(false), 2, None);
        let body = &whole_body(&steps);
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["role"], "assistant");
        assert_eq!(choice["message"]["content"], Value::Null);
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["id"], "call_fake");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], crate::messages::TOOL_NAME);
        let arguments: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments, json!({"q": "p-tok0 p-tok1 "}));
        assert_eq!(body["usage"]["completion_tokens"], 2);
        // Without tools the answer is text.
        let text = Ask {
            tools: false,
            ..tool_ask(false)
        };
        let (steps, _) = completion_steps("p", &text, 2, None);
        let body = whole_body(&steps);
        assert_eq!(body["choices"][0]["message"]["content"], "p-tok0 p-tok1 ");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
    }

    fn whole_body(steps: &VecDeque<Step>) -> Value {
        match steps.front() {
            Some(Step::Data(bytes)) => serde_json::from_slice(bytes).unwrap(),
            _ => Value::Null,
        }
    }

    #[test]
    fn armed_faults_are_used_up() {
        let state = State {
            name: "p".into(),
            tokens: 1,
            pace: Duration::ZERO,
            api_key: None,
            models: vec![],
            attempts: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            open: Arc::new(AtomicUsize::new(0)),
            requests: Mutex::new(vec![]),
            armed: Mutex::new(None),
        };
        let spec = Spec {
            fault: Some(Fault::MissingDone),
            ..Spec::default()
        };
        state.arm(Some(spec.clone()), Some(2));
        assert_eq!(state.take_armed(), spec);
        assert_eq!(state.take_armed(), spec);
        assert_eq!(state.take_armed(), Spec::default());
        state.arm(Some(spec.clone()), None);
        for _ in 0..5 {
            assert_eq!(state.take_armed(), spec);
        }
        state.arm(Some(spec), Some(0));
        assert_eq!(state.take_armed(), Spec::default());
    }
}
