//! Scriptable fake LLM providers for tests and demos.
//!
//! - [`FakeProvider`]: an in-process Tower service that answers each attempt
//!   from a script of [`Reply`]s and remembers what it was sent.
//! - [`upstream::FakeUpstream`]: a fake provider served over real HTTP on
//!   loopback (plain, or TLS with HTTP/2 by ALPN) that speaks OpenAI chat
//!   completions (`/v1/chat/completions`), Anthropic Messages
//!   (`/v1/messages`, see [`messages`]) and the OpenAI Responses API
//!   (`/v1/responses`, see [`responses`]), with faults chosen per request.
//! - [`ScriptedBody`] plays a list of [`Step`]s as a response body: data
//!   frames, waits, a stall, an error (a reset), or the end.
//! - [`chunks`] writes OpenAI chat-chunk SSE events for those scripts.
//! - [`Tally`] counts a fake's answers still open, cut by the caller, and
//!   the frames they sent (a cancelled attempt shows as cut).
//!
//! A test-only companion of `tower-llm-failover`: it depends on none of
//! that crate's types (fakes speak HTTP, bytes and JSON), so any stack can
//! use it from a dev-dependency:
//!
//! ```toml
//! [dev-dependencies]
//! tower-llm-testing = "0.1"
//! ```
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use http::Request;
//! use http_body_util::{BodyExt, Full};
//! use tower::ServiceExt;
//! use tower_llm_testing::{FakeProvider, Reply, Step, chunks};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The first attempt is rate limited in-band after the role chunk; later
//! // attempts get the default healthy stream.
//! let provider = FakeProvider::new("primary").then(Reply::Stream(vec![
//!     Step::Data(chunks::role("primary")),
//!     Step::Data(chunks::rate_limit_error()),
//! ]));
//! let request = || {
//!     Request::post("/v1/chat/completions")
//!         .body(Full::new(Bytes::from_static(br#"{"model":"m","stream":true}"#)))
//!         .unwrap()
//! };
//!
//! let first = provider.clone().oneshot(request()).await.unwrap();
//! let text = first.into_body().collect().await.unwrap().to_bytes();
//! assert!(text.ends_with(&chunks::rate_limit_error()));
//!
//! let second = provider.clone().oneshot(request()).await.unwrap();
//! let text = second.into_body().collect().await.unwrap().to_bytes();
//! assert!(text.ends_with(&chunks::done()));
//! assert_eq!(provider.calls(), 2);
//! assert_eq!(provider.seen()[0].body["model"], "m");
//! # }
//! ```

pub mod chunks;
pub mod messages;
pub mod provider;
pub mod responses;
pub mod upstream;

pub use provider::{FakeProvider, Reply, SeenRequest};

use std::collections::VecDeque;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame};
use tokio::time::Sleep;

/// Runs `future` to its end on this thread, polling it with a no-op
/// waker: for a future that never waits (a stack over in-process fakes
/// whose answers are ready at once), where a runtime's scheduling would
/// blur what an allocation count or a CPU bench measures. A future that
/// does wait is polled again at once, in a busy loop.
///
/// ```
/// assert_eq!(tower_llm_testing::run_ready(async { 1 + 1 }), 2);
/// ```
pub fn run_ready<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

/// One step of a scripted body.
#[derive(Debug, Clone)]
pub enum Step {
    /// A data frame.
    Data(Bytes),
    /// Wait this long before the next step.
    Wait(Duration),
    /// Never produce anything again (a silent upstream).
    Stall,
    /// Fail the body with an I/O error carrying this message (a reset).
    Error(String),
}

impl Step {
    /// A data frame from anything that becomes `Bytes`.
    pub fn data(bytes: impl Into<Bytes>) -> Self {
        Self::Data(bytes.into())
    }
}

/// What a fake's answers came to: how many are still open (a response
/// head awaited, or a body not yet dropped), how many were dropped before
/// their end (cut by the caller), and the data frames they delivered.
/// Shared by the clones of a [`FakeProvider`].
#[derive(Debug, Default)]
pub struct Tally {
    open: AtomicUsize,
    cut: AtomicUsize,
    frames: AtomicU64,
    cut_frames: AtomicU64,
}

impl Tally {
    /// Answers still open: a request whose response or body the caller
    /// still holds.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Answers dropped before their end (before the head, or with steps
    /// left in the body): the caller closed the connection.
    pub fn cut(&self) -> usize {
        self.cut.load(Ordering::SeqCst)
    }

    /// Data frames delivered, by every answer.
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::SeqCst)
    }

    /// Data frames delivered by answers that were then cut: what the
    /// caller was sent before it closed the connection.
    pub fn cut_frames(&self) -> u64 {
        self.cut_frames.load(Ordering::SeqCst)
    }
}

/// One answer counted in a [`Tally`] until it ends or is dropped.
#[derive(Debug)]
struct Ticket {
    tally: Arc<Tally>,
    ended: bool,
    frames: u64,
}

impl Ticket {
    fn new(tally: Arc<Tally>) -> Self {
        tally.open.fetch_add(1, Ordering::SeqCst);
        Self {
            tally,
            ended: false,
            frames: 0,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.tally.open.fetch_sub(1, Ordering::SeqCst);
        if !self.ended {
            self.tally.cut.fetch_add(1, Ordering::SeqCst);
            self.tally
                .cut_frames
                .fetch_add(self.frames, Ordering::SeqCst);
        }
    }
}

/// A response body that plays [`Step`]s, then ends.
pub struct ScriptedBody {
    steps: VecDeque<Step>,
    sleep: Option<Pin<Box<Sleep>>>,
    dropped: Arc<AtomicBool>,
    ticket: Option<Ticket>,
}

impl std::fmt::Debug for ScriptedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedBody")
            .field("steps_left", &self.steps.len())
            .finish()
    }
}

impl ScriptedBody {
    /// A body playing `steps`.
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            steps: steps.into_iter().collect(),
            sleep: None,
            dropped: Arc::new(AtomicBool::new(false)),
            ticket: None,
        }
    }

    /// A flag that turns true when the body is dropped, so tests can check
    /// that the upstream was released.
    pub fn drop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.dropped)
    }
}

impl Drop for ScriptedBody {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

impl Body for ScriptedBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.steps.pop_front() {
                None => {
                    if let Some(ticket) = self.ticket.as_mut() {
                        ticket.ended = true;
                    }
                    return Poll::Ready(None);
                }
                Some(Step::Data(bytes)) => {
                    let last = self.steps.is_empty();
                    if let Some(ticket) = self.ticket.as_mut() {
                        ticket.tally.frames.fetch_add(1, Ordering::SeqCst);
                        ticket.frames += 1;
                        // Everything was sent: reading on would only see
                        // the end.
                        ticket.ended |= last;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Some(Step::Wait(duration)) => {
                    self.sleep = Some(Box::pin(tokio::time::sleep(duration)));
                }
                Some(Step::Stall) => {
                    self.steps.push_front(Step::Stall);
                    return Poll::Pending;
                }
                Some(Step::Error(message)) => {
                    self.steps.clear();
                    if let Some(ticket) = self.ticket.as_mut() {
                        ticket.ended = true;
                    }
                    return Poll::Ready(Some(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        message,
                    ))));
                }
            }
        }
    }
}

/// A `200 text/event-stream` response playing `steps`.
pub fn sse_response(steps: impl IntoIterator<Item = Step>) -> Response<ScriptedBody> {
    let mut response = Response::new(ScriptedBody::new(steps));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

/// A JSON response with this status and body.
pub fn json_response(status: u16, body: impl Into<Bytes>) -> Response<ScriptedBody> {
    let mut response = Response::new(ScriptedBody::new([Step::Data(body.into())]));
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}
