//! The layers stacked as a gateway stacks them: StreamStateLayer outside,
//! BudgetLayer, then the failover service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::FailureClass;
use tower_llm_failover::budget::{BudgetLayer, TurnBudget};
use tower_llm_failover::failover::{Failover, Target, Timeouts};
use tower_llm_failover::observe::TurnRecord;
use tower_llm_failover::stream::StreamPolicy;
use tower_llm_failover::stream::{StreamState, StreamStateLayer, StreamStatus};
use tower_llm_testing::{FakeProvider, Reply, Step, chunks, sse_response};

fn request() -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_turn_deadline_ends_a_committed_stream_with_a_terminal_chunk() {
    let primary =
        FakeProvider::new("primary").always(Reply::tokens_then("primary", 3, vec![Step::Stall]));
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()))
        .stream_policy(StreamPolicy::new().idle_timeout(Duration::from_secs(600)))
        .build();
    let service = ServiceBuilder::new()
        .layer(StreamStateLayer::new())
        .layer(BudgetLayer::new().deadline(Duration::from_secs(5)))
        .service(failover);
    let started = Instant::now();
    let response = service.oneshot(request()).await.unwrap();
    let state = response.extensions().get::<StreamState>().unwrap().clone();
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let budget = response.extensions().get::<TurnBudget>().unwrap().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&body).unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(text.matches("primary-").count(), 3);
    assert!(text.contains("\"finish_reason\":\"error\""), "{text}");
    assert!(text.contains("\"code\":\"timeout\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert_eq!(state.status(), StreamStatus::Failed);
    assert_eq!(backup.calls(), 0);
    // One budget for the turn: the failover drew its attempt from it.
    assert_eq!(budget.attempts_used(), 1);
    assert_eq!(run.turn_id(), budget.turn_id());
    let record = &run.attempts()[0];
    assert_eq!(record.class, Some(FailureClass::Timeout));
    // The terminal chunk is the event that carries the error's finish.
    let error_at = text.find("\"finish_reason\":\"error\"").unwrap();
    let terminal_at = text[..error_at].rfind("data: ").unwrap();
    assert_eq!(
        record.bytes_flushed, terminal_at as u64,
        "the provider's bytes the client got"
    );
}

#[tokio::test(start_paused = true)]
async fn silent_targets_end_the_turn_at_its_deadline_with_an_openai_error() {
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let backup = FakeProvider::new("backup").always(Reply::Silent);
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .target(Target::new("backup", backup))
        .timeouts(|t| Timeouts {
            head: Some(Duration::from_secs(3)),
            ..t
        })
        .build();
    let service = ServiceBuilder::new()
        .layer(StreamStateLayer::new())
        .layer(BudgetLayer::new().deadline(Duration::from_secs(4)))
        .service(failover);
    let started = Instant::now();
    let response = service.oneshot(request()).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(4));
    assert_eq!(response.status(), 504);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("first failure: timeout from primary")
    );
}

#[tokio::test(start_paused = true)]
async fn stream_layer_alone_ends_a_stream_at_a_budget_deadline_inside_it() {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, std::convert::Infallible>(sse_response([
            Step::Data(chunks::role("m")),
            Step::Data(chunks::content("m", "a")),
            Step::Stall,
        ]))
    });
    let service = ServiceBuilder::new()
        .layer(StreamStateLayer::new())
        .layer(BudgetLayer::new().deadline(Duration::from_secs(2)))
        .service(upstream);
    let response: Response<_> = service.oneshot(request()).await.unwrap();
    let state = response.extensions().get::<StreamState>().unwrap().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&body).unwrap();
    assert!(text.contains("\"code\":\"timeout\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert_eq!(
        state.snapshot().failure.unwrap().class,
        FailureClass::Timeout
    );
}

/// The budget layer and the commit machine inside it once armed timers for
/// the same instant; on a multi-threaded runtime the outer one could fire
/// first and cut the body with a bare error (hyper then aborts the chunked
/// body: no terminal chunk, no `[DONE]`). With the commit machine inside,
/// it alone owns the deadline: every stream cut by the turn's deadline ends
/// with the terminal chunk and `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_cut_at_the_turn_deadline_always_ends_with_its_terminal_chunk() {
    const ROUNDS: usize = 50;
    const STREAMS: usize = 64;
    let primary =
        FakeProvider::new("primary").always(Reply::tokens_then("primary", 2, vec![Step::Stall]));
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .stream_policy(StreamPolicy::new().idle_timeout(Duration::from_secs(600)))
        .build();
    let service = ServiceBuilder::new()
        .layer(BudgetLayer::new().deadline(Duration::from_millis(DEADLINE_MS)))
        .service(failover);
    let mut committed = 0;
    for round in 0..ROUNDS {
        let streams: Vec<_> = (0..STREAMS)
            .map(|_| {
                let service = service.clone();
                tokio::spawn(async move {
                    let response = service.oneshot(request()).await.unwrap();
                    let status = response.status();
                    let state = response.extensions().get::<StreamState>().cloned();
                    let body = response.into_body().collect().await;
                    (
                        status,
                        body.map(|b| b.to_bytes()),
                        state.map(|s| s.status()),
                    )
                })
            })
            .collect();
        for stream in streams {
            let (status, body, state) = tokio::time::timeout(Duration::from_secs(10), stream)
                .await
                .expect("the stream ended within its bound")
                .unwrap();
            let body = body.unwrap_or_else(|error| {
                panic!("round {round}: the body was cut without a terminal chunk: {error}")
            });
            let text = std::str::from_utf8(&body).unwrap();
            let Some(state) = state else {
                // A loaded machine can pass the deadline before the first
                // output: then nothing was committed and the turn's answer
                // is a whole error (not what this test races): the timeout,
                // or, while the timed-out target cools down and another
                // turn holds its probe, no target available.
                assert!(status == 504 || status == 503, "{status}: {text}");
                assert!(
                    text.contains("deadline") || text.contains("timeout"),
                    "{text}"
                );
                continue;
            };
            committed += 1;
            assert_eq!(text.matches("primary-").count(), 2, "{text}");
            assert!(text.contains("\"finish_reason\":\"error\""), "{text}");
            assert!(text.contains("\"code\":\"timeout\""), "{text}");
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            assert_eq!(state, StreamStatus::Failed);
        }
    }
    // The race is only run by streams that committed (on an idle machine,
    // all of them): at least a round's worth must have.
    assert!(
        committed >= STREAMS,
        "{committed} of {} streams committed before the deadline",
        ROUNDS * STREAMS
    );
}

/// Long enough for 64 streams to commit on a loaded 2-core machine, short
/// enough for 50 rounds to take a few seconds.
const DEADLINE_MS: u64 = 60;

/// The budget layer outside the stream layer: the turn's deadline reaches
/// the stream layer as the `TurnDeadline` request extension, so the stream
/// ends itself at the deadline with its terminal chunk and `[DONE]`, and the
/// budget body, told so, does not cut it with a bare error.
#[tokio::test(start_paused = true)]
async fn a_budget_outside_the_stream_layer_hands_it_the_deadline() {
    let upstream = tower::service_fn(|request: Request<Full<Bytes>>| async move {
        assert!(
            request
                .extensions()
                .get::<tower_llm_failover::TurnDeadline>()
                .is_some(),
            "the budget layer publishes the deadline"
        );
        Ok::<_, std::convert::Infallible>(sse_response([
            Step::Data(chunks::role("m")),
            Step::Data(chunks::content("m", "a")),
            Step::Stall,
        ]))
    });
    let service = ServiceBuilder::new()
        .layer(BudgetLayer::new().deadline(Duration::from_secs(2)))
        .layer(StreamStateLayer::new())
        .service(upstream);
    let started = Instant::now();
    let response: Response<_> = service.oneshot(request()).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&body).unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert!(text.contains("\"finish_reason\":\"error\""), "{text}");
    assert!(text.contains("\"code\":\"timeout\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

/// The failover layer says it watches the turn's deadline only once it
/// has read the request: a body that never ends is cut by the budget
/// layer's own timer, at the deadline.
#[tokio::test(start_paused = true)]
async fn a_request_body_that_never_ends_is_answered_at_the_turn_deadline() {
    let provider = FakeProvider::new("primary");
    let failover = Failover::builder()
        .target(Target::new("primary", provider.clone()))
        .build();
    let service = ServiceBuilder::new()
        .layer(BudgetLayer::new().deadline(Duration::from_secs(3)))
        .service(failover);
    // The start of a body, then nothing.
    let frames = futures_util::StreamExt::chain(
        futures_util::stream::iter([Ok::<_, std::convert::Infallible>(http_body::Frame::data(
            Bytes::from_static(br#"{"model":"gpt-x","#),
        ))]),
        futures_util::stream::pending(),
    );
    let request = Request::post("/v1/chat/completions")
        .body(http_body_util::StreamBody::new(frames))
        .unwrap();
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(60), service.oneshot(request))
        .await
        .expect("the turn is answered")
        .unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(response.status(), 504);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("turn_deadline_exceeded"), "{body}");
    assert_eq!(provider.calls(), 0, "nothing was sent upstream");
}
