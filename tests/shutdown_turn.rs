//! A turn that has not answered when the shutdown signal fires (waiting for
//! a response head, or not started yet) answers the dialect's 503 with
//! class `shutdown` at once, instead of being cut with its connection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_llm_failover::dialect::{AnthropicMessages, Dialect};
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_failover::shutdown::Shutdown;
use tower_llm_failover::{StopReason, observe::TurnRecord};

/// An upstream that takes the request and never answers its head; counts
/// calls and says when one arrived.
#[derive(Clone)]
struct Silent {
    calls: Arc<AtomicUsize>,
    called: Arc<Notify>,
}

impl Silent {
    fn new() -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            called: Arc::new(Notify::new()),
        }
    }
}

impl tower::Service<Request<Full<Bytes>>> for Silent {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.called.notify_one();
        Box::pin(std::future::pending())
    }
}

const CHAT: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const MESSAGES: &str =
    r#"{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn post(path: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

/// Status, JSON body and the turn's record of an answer.
async fn read<B>(response: Response<B>) -> (StatusCode, serde_json::Value, TurnRecord)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let status = response.status();
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap(), run)
}

#[tokio::test]
async fn a_turn_waiting_for_a_head_answers_503_shutdown_when_the_signal_fires() {
    let upstream = Silent::new();
    let signal = Shutdown::new();
    let failover = Failover::builder()
        .target(Target::new("primary", upstream.clone()))
        .shutdown(signal.clone())
        .build();
    let turn = tokio::spawn(failover.oneshot(post("/v1/chat/completions", CHAT)));
    // The attempt is out, its head will never come.
    tokio::time::timeout(Duration::from_secs(10), upstream.called.notified())
        .await
        .expect("the attempt reaches the upstream");
    signal.end_streams();
    let response = tokio::time::timeout(Duration::from_secs(10), turn)
        .await
        .expect("the turn answers once the signal fires")
        .unwrap()
        .unwrap();
    let (status, json, run) = read(response).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json["error"]["code"], "shutdown", "{json}");
    assert_eq!(run.stop_reason(), Some(StopReason::Shutdown));
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 1, "never rerouted");
}

#[tokio::test]
async fn a_messages_turn_answers_in_anthropics_shape_and_none_starts_after_the_signal() {
    let upstream = Silent::new();
    let signal = Shutdown::new();
    let failover = Failover::builder()
        .dialect(AnthropicMessages)
        .target(Target::new("primary", upstream.clone()))
        .shutdown(signal.clone())
        .build();
    // Fired before the turn: it answers without trying any target.
    signal.end_streams();
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        failover.oneshot(post("/v1/messages", MESSAGES)),
    )
    .await
    .expect("the turn answers at once")
    .unwrap();
    let (status, json, run) = read(response).await;
    assert_eq!(
        status,
        AnthropicMessages.error_status(
            tower_llm_failover::FailureClass::Shutdown,
            StatusCode::SERVICE_UNAVAILABLE
        )
    );
    assert_eq!(json["type"], "error", "{json}");
    assert_eq!(json["error"]["code"], "shutdown", "{json}");
    assert_eq!(run.stop_reason(), Some(StopReason::Shutdown));
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 0);
}
