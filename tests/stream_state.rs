//! StreamStateLayer end to end with a scripted upstream: what the client
//! receives byte for byte, and what the stream state records.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use proptest::prelude::*;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::dialect::TerminalMode;
use tower_llm_failover::stream::StreamPolicy;
use tower_llm_failover::stream::{StreamState, StreamStateBody, StreamStateLayer, StreamStatus};
use tower_llm_failover::{FailureClass, Phase};
use tower_llm_testing::chunks::{self, content, done, finish, role};
use tower_llm_testing::{ScriptedBody, Step, json_response, sse_response};

type ClientResponse =
    Response<StreamStateBody<ScriptedBody, tower_llm_failover::dialect::OpenAiChat>>;

async fn call_with(layer: StreamStateLayer, response: Response<ScriptedBody>) -> ClientResponse {
    let cell = std::sync::Mutex::new(Some(response));
    let upstream = tower::service_fn(move |_req: Request<()>| {
        let response = cell.lock().unwrap().take().unwrap();
        async move { Ok::<_, Infallible>(response) }
    });
    ServiceBuilder::new()
        .layer(layer)
        .service(upstream)
        .oneshot(Request::new(()))
        .await
        .unwrap()
}

async fn run(layer: StreamStateLayer, steps: Vec<Step>) -> (Vec<Bytes>, StreamState) {
    let response = call_with(layer, sse_response(steps)).await;
    let state = response.extensions().get::<StreamState>().unwrap().clone();
    let mut body = response.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        frames.push(frame.unwrap().into_data().unwrap());
    }
    (frames, state)
}

fn concat(frames: &[Bytes]) -> Vec<u8> {
    frames.iter().flat_map(|f| f.iter().copied()).collect()
}

fn data(steps: impl IntoIterator<Item = Bytes>) -> Vec<Step> {
    steps.into_iter().map(Step::Data).collect()
}

/// Splits the client's bytes into SSE events and parses every data line.
fn events(bytes: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(bytes).unwrap();
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "ends on an event boundary"
    );
    text.split_terminator("\n\n").map(str::to_owned).collect()
}

fn terminal_json(event: &str) -> serde_json::Value {
    serde_json::from_str(event.strip_prefix("data: ").unwrap()).unwrap()
}

#[tokio::test]
async fn field_report_40_tokens_then_in_band_429_ends_with_one_terminal_chunk() {
    let mut upstream = vec![role("primary-model")];
    upstream.extend((0..40).map(|i| content("primary-model", &format!("tok{i} "))));
    let sent_before: Vec<u8> = concat(&upstream);
    let mut steps = data(upstream);
    steps.push(Step::Data(chunks::rate_limit_error()));
    // Anything after the error must never reach the client.
    steps.push(Step::Data(content("primary-model", "AFTER")));
    steps.push(Step::Data(done()));

    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let bytes = concat(&frames);
    assert!(
        bytes.starts_with(&sent_before),
        "the 40 chunks pass through unchanged"
    );
    let rest = std::str::from_utf8(&bytes[sent_before.len()..]).unwrap();
    let tail = events(rest.as_bytes());
    assert_eq!(tail.len(), 2, "one terminal chunk, then [DONE]: {rest}");
    assert_eq!(tail[1], "data: [DONE]");
    let terminal = terminal_json(&tail[0]);
    assert_eq!(terminal["id"], chunks::ID, "the stream's own identity");
    assert_eq!(terminal["model"], "primary-model");
    assert_eq!(terminal["choices"][0]["finish_reason"], "error");
    assert_eq!(terminal["error"]["code"], "rate_limit_exceeded");
    assert_eq!(terminal["error"]["type"], "rate_limit_error");
    assert_eq!(terminal["error"]["phase"], "committed");
    assert_eq!(terminal["error"]["output_events"], 40);
    assert_eq!(terminal["error"]["bytes_sent"], sent_before.len() as u64);
    assert!(!rest.contains("AFTER"));
    for event in events(&bytes) {
        let payload = event.strip_prefix("data: ").unwrap();
        if payload != "[DONE]" {
            serde_json::from_str::<serde_json::Value>(payload).expect("every data line is JSON");
        }
    }

    let snapshot = state.snapshot();
    assert_eq!(snapshot.status, StreamStatus::Failed);
    assert_eq!(snapshot.output_events, 40);
    assert_eq!(snapshot.bytes_flushed, bytes.len() as u64);
    let failure = snapshot.failure.unwrap();
    assert_eq!(failure.class, FailureClass::RateLimited);
    assert_eq!(failure.phase, Phase::Committed);
    assert_eq!(failure.bytes_sent, sent_before.len() as u64);
    assert_eq!(
        failure.provider_code.as_deref(),
        Some("rate_limit_exceeded")
    );
}

#[tokio::test(start_paused = true)]
async fn healthy_stream_passes_through_unchanged_and_uncopied() {
    // The upstream pauses between frames: each goes out on its own, as the
    // very same bytes.
    let upstream = chunks::full_stream("m", 20);
    let mut steps = Vec::new();
    for frame in &upstream {
        steps.push(Step::Data(frame.clone()));
        steps.push(Step::Wait(Duration::from_millis(5)));
    }
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    assert_eq!(frames.len(), upstream.len());
    for (got, sent) in frames.iter().zip(&upstream) {
        assert_eq!(got, sent);
        assert_eq!(got.as_ptr(), sent.as_ptr(), "the same bytes, not a copy");
    }
    let snapshot = state.snapshot();
    assert_eq!(snapshot.status, StreamStatus::Finished);
    assert_eq!(snapshot.output_events, 20);
    assert_eq!(snapshot.finish_reason.as_deref(), Some("stop"));
    assert_eq!(snapshot.identity.id.as_deref(), Some(chunks::ID));
    assert_eq!(snapshot.identity.model.as_deref(), Some("m"));
    assert!(snapshot.time_to_first_output.is_some());
    assert!(snapshot.failure.is_none());
}

#[tokio::test]
async fn frames_ready_together_go_out_as_one_write() {
    // One upstream read of many events arrives as many ready frames: the
    // client gets them joined, byte for byte, in one frame.
    let upstream = chunks::full_stream("m", 20);
    let (frames, state) = run(StreamStateLayer::new(), data(upstream.clone())).await;
    assert_eq!(frames.len(), 1, "one write for one read");
    assert_eq!(concat(&frames), concat(&upstream));
    assert_eq!(state.snapshot().status, StreamStatus::Finished);
    assert_eq!(
        state.snapshot().bytes_flushed,
        concat(&upstream).len() as u64
    );
}

#[tokio::test]
async fn reset_after_tokens_ends_with_terminal_chunk() {
    let mut steps = data([role("m"), content("m", "a"), content("m", "b")]);
    // Half an event, then the connection is reset.
    steps.push(Step::data(&b"data: {\"choices\":[{\"delta\":{\"cont"[..]));
    steps.push(Step::Error("connection reset by peer".into()));
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 5, "role, two tokens, terminal, [DONE]: {all:?}");
    assert!(
        !all.iter().any(|e| e.contains("cont\"")),
        "the half event is never forwarded"
    );
    let terminal = terminal_json(&all[3]);
    assert_eq!(terminal["error"]["code"], "connect");
    assert_eq!(terminal["error"]["output_events"], 2);
    assert_eq!(all[4], "data: [DONE]");
    assert_eq!(state.status(), StreamStatus::Failed);
}

#[tokio::test(start_paused = true)]
async fn idle_stall_after_tokens_ends_at_the_idle_timeout() {
    let mut steps = data([role("m"), content("m", "a")]);
    steps.push(Step::Stall);
    let started = tokio::time::Instant::now();
    let (frames, state) = run(
        StreamStateLayer::new().policy(StreamPolicy::new().idle_timeout(Duration::from_secs(5))),
        steps,
    )
    .await;
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 4);
    let terminal = terminal_json(&all[2]);
    assert_eq!(terminal["error"]["code"], "timeout");
    assert_eq!(
        state.snapshot().failure.unwrap().class,
        FailureClass::Timeout
    );
}

#[tokio::test(start_paused = true)]
async fn idle_timer_restarts_on_every_frame() {
    let steps = vec![
        Step::Data(role("m")),
        Step::Wait(Duration::from_secs(4)),
        Step::Data(content("m", "a")),
        Step::Wait(Duration::from_secs(4)),
        Step::Data(finish("m", "stop")),
        Step::Data(done()),
    ];
    let (_, state) = run(
        StreamStateLayer::new().policy(StreamPolicy::new().idle_timeout(Duration::from_secs(5))),
        steps,
    )
    .await;
    assert_eq!(state.status(), StreamStatus::Finished);
}

#[tokio::test]
async fn malformed_chunk_is_dropped_and_counted_and_the_stream_goes_on() {
    let bad = Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"\n\n");
    let steps = data([
        role("m"),
        content("m", "a"),
        bad.clone(),
        content("m", "b"),
        finish("m", "stop"),
        done(),
    ]);
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let bytes = concat(&frames);
    let want = concat(&[
        role("m"),
        content("m", "a"),
        content("m", "b"),
        finish("m", "stop"),
        done(),
    ]);
    assert_eq!(bytes, want);
    let snapshot = state.snapshot();
    assert_eq!(snapshot.malformed_dropped, 1);
    assert_eq!(snapshot.status, StreamStatus::Finished);

    // A malformed event inside a frame with good ones: only it is cut out.
    let mixed = Bytes::from([content("m", "a"), bad.clone(), content("m", "b")].concat());
    let (frames, _) = run(
        StreamStateLayer::new(),
        data([role("m"), mixed, finish("m", "stop"), done()]),
    )
    .await;
    assert_eq!(concat(&frames), want);
}

#[tokio::test]
async fn too_many_malformed_chunks_fail_the_stream() {
    let bad = Bytes::from_static(b"data: nope\n\n");
    let steps = data([role("m"), content("m", "a"), bad.clone(), bad.clone(), bad]);
    let (frames, state) = run(
        StreamStateLayer::new().policy(StreamPolicy {
            max_malformed: 2,
            ..StreamPolicy::new()
        }),
        steps,
    )
    .await;
    let all = events(&concat(&frames));
    assert_eq!(terminal_json(&all[2])["error"]["code"], "invalid_response");
    assert_eq!(state.status(), StreamStatus::Failed);
}

#[tokio::test]
async fn finish_without_done_gets_done_appended() {
    let steps = data([role("m"), content("m", "a"), finish("m", "stop")]);
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let all = events(&concat(&frames));
    assert_eq!(all.last().unwrap(), "data: [DONE]");
    assert_eq!(all.len(), 4);
    assert_eq!(state.status(), StreamStatus::Finished);
    assert!(state.snapshot().failure.is_none());
}

#[tokio::test]
async fn end_without_finish_or_done_is_a_truncation() {
    let steps = data([role("m"), content("m", "a")]);
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 4);
    let terminal = terminal_json(&all[2]);
    assert_eq!(terminal["error"]["code"], "invalid_response");
    assert_eq!(
        state.snapshot().failure.unwrap().class,
        FailureClass::InvalidResponse
    );
}

#[tokio::test]
async fn vllm_error_followed_by_done_is_not_success() {
    let vllm = Bytes::from_static(b"data: {\"error\":{\"message\":\"EngineCore encountered an issue\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n");
    let (frames, state) = run(
        StreamStateLayer::new(),
        data([role("m"), content("m", "a"), vllm]),
    )
    .await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 4);
    let terminal = terminal_json(&all[2]);
    assert_eq!(terminal["error"]["type"], "server_error");
    assert_eq!(terminal["error"]["code"], "server_error");
    // The client reads the class's own message; the provider's stays in
    // the stream's record.
    assert_eq!(
        terminal["error"]["message"],
        "the provider failed to answer"
    );
    assert_eq!(
        state.snapshot().failure.unwrap().message,
        "EngineCore encountered an issue"
    );
    assert_eq!(state.status(), StreamStatus::Failed);
}

#[tokio::test]
async fn preamble_failure_alone_is_recorded_as_preamble() {
    let steps = data([role("m"), chunks::rate_limit_error()]);
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 3);
    assert_eq!(terminal_json(&all[1])["error"]["phase"], "preamble");
    let failure = state.snapshot().failure.unwrap();
    assert_eq!(failure.phase, Phase::Preamble);
    assert_eq!(failure.output_events, 0);
}

#[tokio::test]
async fn client_disconnect_drops_upstream_and_records_cancellation() {
    let mut steps = data([role("m"), content("m", "a"), content("m", "b")]);
    steps.push(Step::Stall);
    let upstream = sse_response(steps);
    let upstream_dropped = upstream.body().drop_flag();
    let response = call_with(StreamStateLayer::new(), upstream).await;
    let state = response.extensions().get::<StreamState>().unwrap().clone();
    let mut body = response.into_body();
    // The three events were ready together: they reach the client as one
    // frame before the stall.
    let received = body
        .frame()
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap()
        .len();
    assert_eq!(
        received,
        [role("m"), content("m", "a"), content("m", "b")]
            .concat()
            .len()
    );
    assert_eq!(state.status(), StreamStatus::Committed);
    drop(body);
    assert!(
        upstream_dropped.load(Ordering::SeqCst),
        "upstream released at once"
    );
    let snapshot = state.snapshot();
    assert_eq!(snapshot.status, StreamStatus::Cancelled);
    let failure = snapshot.failure.unwrap();
    assert_eq!(failure.class, FailureClass::Cancelled);
    assert_eq!(failure.bytes_sent, received as u64);
    assert_eq!(failure.phase, Phase::Committed);
}

#[tokio::test]
async fn non_sse_responses_pass_through_untouched() {
    let body = Bytes::from_static(b"{\"choices\":[]}");
    let mut upstream = json_response(200, body.clone());
    upstream
        .headers_mut()
        .insert(http::header::CONTENT_LENGTH, "14".parse().unwrap());
    let response = call_with(StreamStateLayer::new(), upstream).await;
    assert!(response.extensions().get::<StreamState>().is_none());
    assert_eq!(response.headers()[http::header::CONTENT_LENGTH], "14");
    let got = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got, body);
}

#[tokio::test]
async fn sse_response_loses_its_content_length() {
    let mut upstream = sse_response(data(chunks::full_stream("m", 1)));
    upstream
        .headers_mut()
        .insert(http::header::CONTENT_LENGTH, "10".parse().unwrap());
    let response = call_with(StreamStateLayer::new(), upstream).await;
    assert!(
        response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .is_none()
    );
}

#[tokio::test]
async fn terminal_modes() {
    let steps = || data([role("m"), content("m", "a")]);
    let (frames, _) = run(
        StreamStateLayer::new().policy(StreamPolicy {
            terminal_mode: TerminalMode::Finish,
            ..StreamPolicy::new()
        }),
        steps(),
    )
    .await;
    let all = events(&concat(&frames));
    let terminal = terminal_json(&all[2]);
    assert!(terminal.get("error").is_none(), "no key an SDK raises on");
    assert_eq!(terminal["stream_error"]["code"], "invalid_response");
    assert_eq!(all[3], "data: [DONE]");

    let (frames, _) = run(
        StreamStateLayer::new().policy(StreamPolicy {
            terminal_mode: TerminalMode::ErrorEventOnly,
            ..StreamPolicy::new()
        }),
        steps(),
    )
    .await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 3);
    assert!(all[2].starts_with("event: error\ndata: {\"error\":"));

    let (frames, _) = run(
        StreamStateLayer::new().policy(StreamPolicy {
            finish_reason: "length".into(),
            ..StreamPolicy::new()
        }),
        steps(),
    )
    .await;
    let all = events(&concat(&frames));
    assert_eq!(
        terminal_json(&all[2])["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test]
async fn oversized_event_is_a_clear_failure() {
    let huge = Bytes::from(format!("data: {{\"x\":\"{}\"}}\n\n", "a".repeat(4096)));
    let (frames, state) = run(
        StreamStateLayer::new().policy(StreamPolicy {
            max_event_bytes: 1024,
            max_line_bytes: 1024,
            ..StreamPolicy::new()
        }),
        data([role("m"), content("m", "a"), huge]),
    )
    .await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 4);
    let failure = state.snapshot().failure.unwrap();
    assert!(failure.message.contains("1024-byte"), "{}", failure.message);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// However the wire splits a healthy stream, the client receives exactly
    /// the upstream's bytes.
    #[test]
    fn any_chunking_of_a_healthy_stream_passes_through_exactly(
        cuts in proptest::collection::vec(0usize..5000, 0..30)
    ) {
        let wire = concat(&chunks::full_stream("m", 12));
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut steps = Vec::new();
        let mut last = 0;
        for cut in cuts.into_iter().chain([wire.len()]) {
            if cut > last {
                steps.push(Step::data(wire[last..cut].to_vec()));
            }
            last = cut;
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let (frames, state) = runtime.block_on(run(StreamStateLayer::new(), steps));
        prop_assert_eq!(concat(&frames), wire);
        prop_assert_eq!(state.status(), StreamStatus::Finished);
        prop_assert_eq!(state.snapshot().output_events, 12);
    }
}

#[tokio::test]
async fn a_key_echoed_in_an_in_band_error_never_reaches_the_client() {
    let leak = Bytes::from_static(b"data: {\"error\":{\"message\":\"Incorrect API key provided: sk-proj-abcdefghijklmnopqrstuvwxyz0123456789\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":\"invalid_api_key\"}}\n\n");
    let (frames, state) = run(
        StreamStateLayer::new(),
        data([role("m"), content("m", "a"), leak]),
    )
    .await;
    let text = String::from_utf8(concat(&frames)).unwrap();
    assert!(
        !text.contains("abcdefghijklmnopqrstuvwxyz0123456789"),
        "{text}"
    );
    let failure = state.snapshot().failure.unwrap();
    assert_eq!(failure.class, FailureClass::Auth);
    assert!(!format!("{failure:?}").contains("abcdefghijklmnopqrstuvwxyz0123456789"));
}

#[tokio::test(start_paused = true)]
async fn a_huge_idle_timeout_means_no_idle_timeout_not_a_panic() {
    let steps = data([role("m"), content("m", "a"), finish("m", "stop"), done()]);
    let (frames, state) = run(
        StreamStateLayer::new().policy(StreamPolicy::new().idle_timeout(Duration::MAX)),
        steps,
    )
    .await;
    assert_eq!(events(&concat(&frames)).len(), 4);
    assert_eq!(state.status(), StreamStatus::Finished);
}

/// A chunk of choice `index` of an `n > 1` stream.
fn nth(index: u32, delta: &str, finish: Option<&str>) -> Bytes {
    let finish = serde_json::Value::from(finish);
    Bytes::from(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":{index},\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    ))
}

/// `n: 2`: choice 0 finishes, then the upstream resets while choice 1 is
/// mid-answer. The stream is not whole: the client gets the terminal chunk,
/// and the state records a failure, not a finish.
#[tokio::test(start_paused = true)]
async fn n2_one_choice_finished_then_reset_ends_with_a_terminal_chunk() {
    let mut steps = data([
        nth(0, r#"{"role":"assistant","content":""}"#, None),
        nth(1, r#"{"role":"assistant","content":""}"#, None),
        nth(0, r#"{"content":"zero"}"#, None),
        nth(1, r#"{"content":"one, half"}"#, None),
        nth(0, "{}", Some("stop")),
    ]);
    steps.push(Step::Error("connection reset by peer".into()));
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 7, "five chunks, terminal, [DONE]: {all:?}");
    let terminal = terminal_json(&all[5]);
    assert_eq!(terminal["choices"][0]["finish_reason"], "error");
    assert_eq!(terminal["error"]["code"], "connect");
    assert_eq!(all[6], "data: [DONE]");
    assert_eq!(state.status(), StreamStatus::Failed);
    let snapshot = state.snapshot();
    let failure = snapshot.failure.unwrap();
    assert_eq!(failure.phase, Phase::Committed);
    assert_eq!(failure.class, FailureClass::Connect);
    // The finish the stream did see is kept for the record.
    assert_eq!(snapshot.finish_reason.as_deref(), Some("stop"));
}

/// `n: 2` cut without an error: the same (a truncation, not a finish).
#[tokio::test(start_paused = true)]
async fn n2_one_choice_finished_then_eof_is_a_truncation() {
    let steps = data([
        nth(0, r#"{"content":"zero"}"#, None),
        nth(1, r#"{"content":"one"}"#, None),
        nth(0, "{}", Some("stop")),
    ]);
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 5, "{all:?}");
    assert_eq!(terminal_json(&all[3])["error"]["code"], "invalid_response");
    assert_eq!(state.status(), StreamStatus::Failed);
}

/// `n: 2` with every choice finished: whole, so an end without `[DONE]`
/// gets one appended and a later failure is only logged. A choice that
/// appears only after the others finished holds the stream open again.
#[tokio::test(start_paused = true)]
async fn n2_every_choice_finished_is_whole() {
    let steps = data([
        nth(0, r#"{"content":"zero"}"#, None),
        nth(1, r#"{"content":"one"}"#, None),
        nth(1, "{}", Some("length")),
        nth(0, "{}", Some("stop")),
    ]);
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 5, "{all:?}");
    assert_eq!(all[4], "data: [DONE]");
    assert_eq!(state.status(), StreamStatus::Finished);
    assert!(state.snapshot().failure.is_none());

    // Choice 0 streams whole before choice 1 appears, then a reset.
    let mut steps = data([
        nth(0, r#"{"content":"zero"}"#, None),
        nth(0, "{}", Some("stop")),
        nth(1, r#"{"content":"one"}"#, None),
    ]);
    steps.push(Step::Error("connection reset by peer".into()));
    let (frames, state) = run(StreamStateLayer::new(), steps).await;
    let all = events(&concat(&frames));
    assert_eq!(all.len(), 5, "{all:?}");
    assert_eq!(terminal_json(&all[3])["error"]["code"], "connect");
    assert_eq!(state.status(), StreamStatus::Failed);
}
