//! Per-frame work after commit allocates nothing for frames that need no
//! rewrite (the design's hot-path rule), counted with a counting allocator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use http::Request;
use http_body::Body;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::stream::{StreamState, StreamStateLayer, StreamStatus};
use tower_llm_failover::testing::chunks::{content, done, finish, role};
use tower_llm_failover::testing::{Step, sse_response};

#[tokio::test(flavor = "current_thread")]
async fn zero_allocations_per_frame_after_commit() {
    const FRAMES: usize = 200;
    let mut steps = vec![Step::Data(role("m")), Step::Data(content("m", "first"))];
    steps.extend((0..FRAMES).map(|i| {
        Step::Data(content(
            "m",
            &format!("token {i} with \\\"escapes\\\" and ünïcode"),
        ))
    }));
    steps.push(Step::Data(finish("m", "stop")));
    steps.push(Step::Data(done()));
    let upstream_response = std::sync::Mutex::new(Some(sse_response(steps)));
    let upstream = tower::service_fn(move |_req: Request<()>| {
        let response = upstream_response.lock().unwrap().take().unwrap();
        async move { Ok::<_, Infallible>(response) }
    });
    let response = ServiceBuilder::new()
        .layer(StreamStateLayer::new())
        .service(upstream)
        .oneshot(Request::new(()))
        .await
        .unwrap();
    let state = response.extensions().get::<StreamState>().unwrap().clone();
    let mut body = response.into_body();
    type Body_ = tower_llm_failover::stream::StreamStateBody<
        tower_llm_failover::testing::ScriptedBody,
        tower_llm_failover::dialect::OpenAiChat,
    >;
    let mut cx = Context::from_waker(Waker::noop());
    let mut poll = |body: &mut Body_| match Pin::new(body).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame,
        other => panic!("expected a frame, got {other:?}"),
    };
    // Role chunk and first token: the stream commits; warm-up may allocate.
    poll(&mut body);
    poll(&mut body);
    assert_eq!(state.status(), StreamStatus::Committed);

    let mut frames = Vec::with_capacity(FRAMES);
    let counted = allocation_counter::measure(|| {
        for _ in 0..FRAMES {
            frames.push(poll(&mut body));
        }
    });
    assert_eq!(frames.len(), FRAMES);
    assert_eq!(
        counted.count_total, 0,
        "{} allocations over {FRAMES} committed frames",
        counted.count_total
    );
    assert_eq!(state.output_events(), FRAMES as u64 + 1);
}
