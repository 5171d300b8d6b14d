//! Per-frame work after commit allocates nothing for frames that need no
//! rewrite (the design's hot-path rule), counted with a counting allocator:
//! neither when each upstream frame goes out on its own (a paced upstream),
//! nor when the frames of one upstream read are joined into one client
//! write (the join reuses its buffer once the last write was dropped).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::dialect::OpenAiChat;
use tower_llm_failover::stream::{StreamState, StreamStateBody, StreamStateLayer, StreamStatus};
use tower_llm_testing::chunks::{content, done, finish, role};

const FRAMES: usize = 200;

/// An upstream body: `Some` frames are ready at once; `None` is a pause the
/// upstream connection has not decoded past yet (pending for three polls:
/// across the commit machine's two yields, as a real paced upstream is).
struct Upstream {
    steps: VecDeque<Option<Bytes>>,
    pauses: u8,
}

impl Body for Upstream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.steps.front() {
            None => Poll::Ready(None),
            Some(None) => {
                self.pauses += 1;
                if self.pauses == 3 {
                    self.pauses = 0;
                    self.steps.pop_front();
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Some(Some(_)) => {
                let frame = self.steps.pop_front().flatten().unwrap();
                Poll::Ready(Some(Ok(Frame::data(frame))))
            }
        }
    }
}

fn token(i: usize) -> Bytes {
    content("m", &format!("token {i} with \\\"escapes\\\" and ünïcode"))
}

async fn committed(
    steps: Vec<Option<Bytes>>,
) -> (StreamStateBody<Upstream, OpenAiChat>, StreamState) {
    let upstream_response = std::sync::Mutex::new(Some(
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Upstream {
                steps: steps.into(),
                pauses: 0,
            })
            .unwrap(),
    ));
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
    (response.into_body(), state)
}

/// The next frame, polled with a no-op waker as often as it is pending.
fn next(body: &mut StreamStateBody<Upstream, OpenAiChat>) -> Option<Bytes> {
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        match Pin::new(&mut *body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => return Some(frame.into_data().unwrap()),
            Poll::Ready(Some(Err(error))) => panic!("stream failed: {error}"),
            Poll::Ready(None) => return None,
            Poll::Pending => {}
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn zero_allocations_per_frame_when_each_frame_goes_out_alone() {
    let mut steps = vec![Some(role("m")), None, Some(content("m", "first")), None];
    let tokens: Vec<Bytes> = (0..FRAMES).map(token).collect();
    for t in &tokens {
        steps.push(Some(t.clone()));
        steps.push(None);
    }
    steps.push(Some(finish("m", "stop")));
    steps.push(Some(done()));
    let (mut body, state) = committed(steps).await;
    // Role chunk and first token: the stream commits; warm-up may allocate.
    next(&mut body).unwrap();
    next(&mut body).unwrap();
    assert_eq!(state.status(), StreamStatus::Committed);

    // The commit machine's yields are deferred wake-ups, which the runtime
    // keeps in a list until it next parks: let it park between windows of
    // frames, as a server's task does between writes. The first window
    // sizes that list and is not counted.
    const WINDOW: usize = 10;
    let mut frames = Vec::with_capacity(FRAMES);
    let mut allocations = 0;
    for window in 0..FRAMES / WINDOW {
        let counted = allocation_counter::measure(|| {
            for _ in 0..WINDOW {
                frames.push(next(&mut body).unwrap());
            }
        });
        if window > 0 {
            allocations += counted.count_total;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(frames.len(), FRAMES);
    for (got, sent) in frames.iter().zip(&tokens) {
        assert_eq!(got.as_ptr(), sent.as_ptr(), "the same bytes, not a copy");
    }
    assert_eq!(
        allocations, 0,
        "{allocations} allocations over {FRAMES} committed frames"
    );
    assert_eq!(state.snapshot().output_events, FRAMES as u64 + 1);
}

#[tokio::test(flavor = "current_thread")]
async fn zero_allocations_per_frame_when_frames_are_joined() {
    let tokens: Vec<Bytes> = (0..FRAMES).map(token).collect();
    let mut steps = vec![Some(role("m")), Some(content("m", "first")), None];
    steps.extend(tokens.iter().cloned().map(Some));
    // The finish chunk records its reason (one allocation per stream): it
    // comes after a pause, outside the counted part.
    steps.push(None);
    steps.push(Some(finish("m", "stop")));
    steps.push(Some(done()));
    let (mut body, state) = committed(steps).await;
    // Ready together: the role chunk and the first token go out as one.
    let warm_up = next(&mut body).unwrap();
    assert_eq!(warm_up, [role("m"), content("m", "first")].concat());
    assert_eq!(state.status(), StreamStatus::Committed);

    drop(warm_up);
    let expected: Vec<u8> = tokens.concat();
    // The first join of many frames sizes the queue and the join buffer.
    let first = next(&mut body).unwrap();
    assert_eq!(first, expected[..first.len()]);
    let mut received = first.len();
    drop(first);
    let mut writes = 1;
    let counted = allocation_counter::measure(|| {
        while received < expected.len() {
            // Dropped at once, as the server drops a frame it has written.
            let frame = next(&mut body).unwrap();
            assert_eq!(frame, expected[received..received + frame.len()]);
            received += frame.len();
            writes += 1;
        }
    });
    assert_eq!(received, expected.len(), "the tokens and nothing else");
    assert!(
        writes <= FRAMES.div_ceil(64) + 1,
        "{writes} client writes for {FRAMES} frames ready together"
    );
    assert!(writes > 1, "the joins after the first one were counted");
    assert_eq!(
        counted.count_total, 0,
        "{} allocations over the joined frames after the first join",
        counted.count_total
    );
    let rest: Vec<u8> = std::iter::from_fn(|| next(&mut body)).flatten().collect();
    assert_eq!(rest, [finish("m", "stop"), done()].concat());
    assert_eq!(state.status(), StreamStatus::Finished);
}
