//! A scriptable fake provider: a Tower service that answers each attempt
//! from a script and remembers what it was sent.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use tower_service::Service;

use super::chunks;
use super::{ScriptedBody, Step, Tally, Ticket, json_response, sse_response};

/// How the fake answers one attempt.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A `200 text/event-stream` response playing these steps.
    Stream(Vec<Step>),
    /// A JSON response with this status, extra headers and body.
    Json {
        /// The status.
        status: u16,
        /// Extra headers (e.g. `retry-after`).
        headers: Vec<(&'static str, String)>,
        /// The body.
        body: Bytes,
    },
    /// A transport error before any response (connection refused).
    Refused,
    /// Never answer (no response head).
    Silent,
    /// Wait, then answer.
    Delayed(Duration, Box<Reply>),
}

impl Reply {
    /// A healthy stream: role, `tokens` content chunks carrying `name`,
    /// finish, usage when `usage` is set, `[DONE]`.
    pub fn stream(name: &str, tokens: usize) -> Self {
        Self::Stream(
            chunks::full_stream(name, tokens)
                .into_iter()
                .map(Step::Data)
                .collect(),
        )
    }

    /// A stream of `tokens` content chunks, then `then`.
    pub fn tokens_then(name: &str, tokens: usize, then: Vec<Step>) -> Self {
        let mut steps = vec![Step::Data(chunks::role(name))];
        steps.extend(
            (0..tokens).map(|i| Step::Data(chunks::content(name, &format!("{name}-{i} ")))),
        );
        steps.extend(then);
        Self::Stream(steps)
    }

    /// A whole non-streaming completion whose text carries `name`.
    pub fn completion(name: &str) -> Self {
        let body = serde_json::json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("answer from {name}")}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        });
        Self::Json {
            status: 200,
            headers: Vec::new(),
            body: Bytes::from(body.to_string()),
        }
    }

    /// An error response with this status and body.
    pub fn status(status: u16, body: &str) -> Self {
        Self::Json {
            status,
            headers: Vec::new(),
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    /// Adds a header to a JSON reply.
    pub fn header(mut self, name: &'static str, value: &str) -> Self {
        if let Self::Json { headers, .. } = &mut self {
            headers.push((name, value.to_owned()));
        }
        self
    }
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// The request URI (path and query).
    pub uri: http::Uri,
    /// The request headers.
    pub headers: HeaderMap,
    /// The JSON body (`Null` when it was not JSON).
    pub body: serde_json::Value,
    /// When it arrived (tokio time, so paused-time tests can measure gaps).
    pub at: tokio::time::Instant,
}

#[derive(Debug)]
struct Inner {
    name: String,
    script: Mutex<VecDeque<Reply>>,
    otherwise: Mutex<Reply>,
    calls: AtomicUsize,
    seen: Mutex<Vec<SeenRequest>>,
    tally: Arc<Tally>,
}

/// A scriptable fake provider. Clones share the script and the counters.
#[derive(Debug, Clone)]
pub struct FakeProvider {
    inner: Arc<Inner>,
}

impl FakeProvider {
    /// A provider that answers every attempt with a healthy 8-token stream
    /// (or completion, for non-streaming requests) carrying `name`.
    pub fn new(name: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                script: Mutex::new(VecDeque::new()),
                otherwise: Mutex::new(Reply::stream(name, 8)),
                calls: AtomicUsize::new(0),
                seen: Mutex::new(Vec::new()),
                tally: Arc::default(),
            }),
        }
    }

    /// Answers the next unscripted attempt with `reply` (queued in order).
    pub fn then(self, reply: Reply) -> Self {
        lock(&self.inner.script).push_back(reply);
        self
    }

    /// Answers every attempt after the script with `reply`.
    pub fn always(self, reply: Reply) -> Self {
        *lock(&self.inner.otherwise) = reply;
        self
    }

    /// Replaces the answer for attempts after the script (e.g. recovery).
    pub fn set_always(&self, reply: Reply) {
        *lock(&self.inner.otherwise) = reply;
    }

    /// Attempts received.
    pub fn calls(&self) -> usize {
        self.inner.calls.load(Ordering::SeqCst)
    }

    /// What its answers came to: open, cut by the caller, frames sent.
    /// A hedge's loser shows as cut, and no longer open.
    pub fn tally(&self) -> &Tally {
        &self.inner.tally
    }

    /// The requests received.
    pub fn seen(&self) -> Vec<SeenRequest> {
        lock(&self.inner.seen).clone()
    }

    fn next_reply(&self, stream: bool) -> Reply {
        if let Some(reply) = lock(&self.inner.script).pop_front() {
            return reply;
        }
        match lock(&self.inner.otherwise).clone() {
            // A healthy default answers in the shape that was asked for.
            Reply::Stream(_) if !stream => Reply::completion(&self.inner.name),
            reply => reply,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn respond(
    reply: Reply,
) -> Pin<Box<dyn Future<Output = Result<Response<ScriptedBody>, std::io::Error>> + Send>> {
    Box::pin(async move {
        match reply {
            Reply::Stream(steps) => Ok(sse_response(steps)),
            Reply::Json {
                status,
                headers,
                body,
            } => {
                let mut response = json_response(status, body);
                for (name, value) in headers {
                    if let Ok(value) = HeaderValue::from_str(&value) {
                        response.headers_mut().insert(name, value);
                    }
                }
                Ok(response)
            }
            Reply::Refused => Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            )),
            Reply::Silent => std::future::pending().await,
            Reply::Delayed(wait, reply) => {
                tokio::time::sleep(wait).await;
                respond(*reply).await
            }
        }
    })
}

impl Service<Request<Full<Bytes>>> for FakeProvider {
    type Response = Response<ScriptedBody>;
    type Error = std::io::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Response<ScriptedBody>, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        self.inner.calls.fetch_add(1, Ordering::SeqCst);
        let this = self.clone();
        // Counted open until the body ends or is dropped (or, before the
        // head, until this future is).
        let ticket = Ticket::new(Arc::clone(&self.inner.tally));
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(never) => match never {},
            };
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            let stream = body.get("stream").and_then(serde_json::Value::as_bool) == Some(true);
            lock(&this.inner.seen).push(SeenRequest {
                uri: parts.uri,
                headers: parts.headers,
                body,
                at: tokio::time::Instant::now(),
            });
            let mut ticket = ticket;
            match respond(this.next_reply(stream)).await {
                Ok(mut response) => {
                    response.body_mut().ticket = Some(ticket);
                    Ok(response)
                }
                Err(refused) => {
                    // Refused: an end, not a cut.
                    ticket.ended = true;
                    Err(refused)
                }
            }
        })
    }
}
