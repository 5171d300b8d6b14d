//! Hardening (issue #13): which headers cross the failover layer each way,
//! timeouts that reroute a silent non-streaming upstream while the turn
//! still has time, and logs a client cannot forge.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_llm_failover::FailureClass;
use tower_llm_failover::failover::{Failover, HeaderPolicy, Target, Timeouts};
use tower_llm_failover::observe::TurnRecord;
use tower_llm_failover::stream::StreamPolicy;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;
use tower_llm_testing::{
    FakeProvider, Reply, ScriptedBody, Step, chunks, json_response, sse_response,
};

fn request(model: &str, stream: bool) -> Request<Full<Bytes>> {
    let body = serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "Tell me about caching."}],
    });
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
    run: TurnRecord,
}

async fn send<S>(failover: &Failover<S>, request: Request<Full<Bytes>>) -> Answer
where
    Failover<S>: Service<
            Request<Full<Bytes>>,
            Response = Response<
                tower_llm_failover::failover::FailoverBody<
                    ScriptedBody,
                    tower_llm_failover::dialect::OpenAiChat,
                >,
            >,
            Error = Infallible,
        > + Clone,
{
    let response = failover.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
        run,
    }
}

/// An upstream whose every answer `make` builds, counting its calls.
#[derive(Clone)]
struct Upstream {
    make: Arc<dyn Fn() -> Response<ScriptedBody> + Send + Sync>,
    calls: Arc<AtomicUsize>,
}

impl Upstream {
    fn new(make: impl Fn() -> Response<ScriptedBody> + Send + Sync + 'static) -> Self {
        Self {
            make: Arc::new(make),
            calls: Arc::default(),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<Request<Full<Bytes>>> for Upstream {
    type Response = Response<ScriptedBody>;
    type Error = Infallible;
    type Future = Ready<Result<Response<ScriptedBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<Full<Bytes>>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok((self.make)()))
    }
}

fn completion(name: &str) -> String {
    serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("answer from {name}")}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
    .to_string()
}

// ---------------------------------------------------------------------------
// Response headers: an allow-list reaches the client.

/// What a chatty provider sends besides its answer.
fn with_provider_headers(mut response: Response<ScriptedBody>) -> Response<ScriptedBody> {
    let headers = response.headers_mut();
    for (name, value) in [
        ("set-cookie", "__cf_bm=secret; path=/"),
        ("openai-organization", "org-gateway-owner"),
        ("openai-project", "proj-gateway"),
        ("x-debug-upstream-host", "10.0.3.7"),
        ("x-envoy-upstream-service-time", "812"),
        ("openai-processing-ms", "812"),
        ("x-failover-target", "forged"),
        ("keep-alive", "timeout=5"),
        ("connection", "x-ratelimit-limit-tokens"),
        ("x-ratelimit-limit-tokens", "hop-by-hop by connection"),
        ("x-ratelimit-remaining-requests", "59"),
        ("anthropic-ratelimit-requests-remaining", "49"),
        ("retry-after-ms", "20"),
        ("x-request-id", "req_provider_123"),
        ("cache-control", "no-cache"),
    ] {
        headers.insert(name, value.parse().unwrap());
    }
    response
}

fn assert_filtered(answer: &Answer, stream: bool) {
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    for gone in [
        "set-cookie",
        "openai-organization",
        "openai-project",
        "x-debug-upstream-host",
        "x-envoy-upstream-service-time",
        "openai-processing-ms",
        "keep-alive",
        "connection",
        "x-ratelimit-limit-tokens",
    ] {
        assert!(
            answer.headers.get(gone).is_none(),
            "{gone} reached the client (stream: {stream})"
        );
    }
    for (kept, value) in [
        ("x-ratelimit-remaining-requests", "59"),
        ("anthropic-ratelimit-requests-remaining", "49"),
        ("retry-after-ms", "20"),
        ("x-request-id", "req_provider_123"),
        ("cache-control", "no-cache"),
    ] {
        assert_eq!(
            answer.headers.get(kept).map(|v| v.to_str().unwrap()),
            Some(value),
            "{kept} (stream: {stream})"
        );
    }
    // The layer's own headers come after the filter, and win.
    assert_eq!(answer.headers["x-failover-target"], "primary");
    assert_eq!(answer.headers["x-failover-attempts"], "1");
}

#[tokio::test(start_paused = true)]
async fn only_allowed_provider_headers_reach_the_client_on_a_stream() {
    let upstream = Upstream::new(|| {
        with_provider_headers(sse_response(
            chunks::full_stream("primary", 3)
                .into_iter()
                .map(Step::Data),
        ))
    });
    let failover = Failover::builder()
        .target(Target::new("primary", upstream))
        .build();
    let answer = send(&failover, request("gpt-x", true)).await;
    assert_eq!(answer.headers["content-type"], "text/event-stream");
    assert!(answer.body.contains("primary-0"), "{}", answer.body);
    assert_filtered(&answer, true);
}

#[tokio::test(start_paused = true)]
async fn only_allowed_provider_headers_reach_the_client_on_a_json_answer() {
    let upstream =
        Upstream::new(|| with_provider_headers(json_response(200, completion("primary"))));
    let failover = Failover::builder()
        .target(Target::new("primary", upstream))
        .build();
    let answer = send(&failover, request("gpt-x", false)).await;
    assert_eq!(answer.headers["content-type"], "application/json");
    assert_eq!(
        answer.headers["content-length"],
        answer.body.len().to_string()
    );
    assert_filtered(&answer, false);
}

#[tokio::test(start_paused = true)]
async fn an_operator_can_forward_more_provider_headers() {
    for stream in [true, false] {
        let upstream = Upstream::new(move || {
            with_provider_headers(if stream {
                sse_response(
                    chunks::full_stream("primary", 2)
                        .into_iter()
                        .map(Step::Data),
                )
            } else {
                json_response(200, completion("primary"))
            })
        });
        let failover = Failover::builder()
            .target(Target::new("primary", upstream))
            .header_policy(
                HeaderPolicy::new().forward_response_headers(["openai-processing-ms", "x-debug-*"]),
            )
            .build();
        let answer = send(&failover, request("gpt-x", stream)).await;
        assert_eq!(answer.headers["openai-processing-ms"], "812");
        assert_eq!(answer.headers["x-debug-upstream-host"], "10.0.3.7");
        // Still not named: still dropped.
        assert!(answer.headers.get("set-cookie").is_none());
        assert!(answer.headers.get("openai-organization").is_none());
    }
}

// ---------------------------------------------------------------------------
// Request headers: an allow-list reaches the provider.

fn with_client_headers(mut request: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    for (name, value) in [
        ("openai-organization", "org-client-chosen"),
        ("openai-project", "proj-client-chosen"),
        ("x-custom", "custom"),
        ("x-api-key", "client-key"),
        ("authorization", "Bearer client-key"),
        ("cookie", "session=client"),
        ("user-agent", "OpenAI/Python 1.99.0"),
        ("accept", "application/json"),
        ("x-request-id", "req-client-7"),
        ("keep-alive", "timeout=5"),
    ] {
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    request
}

#[tokio::test(start_paused = true)]
async fn client_account_and_custom_headers_never_reach_the_provider_by_default() {
    for stream in [true, false] {
        let provider = FakeProvider::new("primary");
        let failover = Failover::builder()
            .target(Target::new("primary", provider.clone()))
            .build();
        let answer = send(&failover, with_client_headers(request("gpt-x", stream))).await;
        assert_eq!(answer.status, StatusCode::OK);
        let seen = &provider.seen()[0].headers;
        for gone in [
            "openai-organization",
            "openai-project",
            "x-custom",
            "x-api-key",
            "authorization",
            "cookie",
            "user-agent",
            "keep-alive",
        ] {
            assert!(seen.get(gone).is_none(), "{gone} reached the provider");
        }
        assert_eq!(seen["x-request-id"], "req-client-7");
        assert_eq!(seen["accept"], "application/json");
        assert_eq!(seen["content-type"], "application/json");
    }
}

#[tokio::test(start_paused = true)]
async fn client_headers_the_operator_names_reach_the_provider() {
    for stream in [true, false] {
        let provider = FakeProvider::new("primary");
        let failover = Failover::builder()
            .target(Target::new("primary", provider.clone()))
            .header_policy(HeaderPolicy::new().forward_request_headers([
                "openai-organization",
                "OpenAI-Project",
                "x-*",
            ]))
            .build();
        let answer = send(&failover, with_client_headers(request("gpt-x", stream))).await;
        assert_eq!(answer.status, StatusCode::OK);
        let seen = &provider.seen()[0].headers;
        assert_eq!(seen["openai-organization"], "org-client-chosen");
        assert_eq!(seen["openai-project"], "proj-client-chosen");
        assert_eq!(seen["x-custom"], "custom");
        // A prefix never lets a credential through: only its exact name.
        assert!(seen.get("x-api-key").is_none());
        assert!(seen.get("authorization").is_none());
    }
}

// ---------------------------------------------------------------------------
// Non-streaming timeouts.

#[tokio::test(start_paused = true)]
async fn a_silent_non_streaming_primary_is_rerouted_at_the_default_head_timeout() {
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()))
        .build();
    let started = Instant::now();
    let answer = send(&failover, request("gpt-x", false)).await;
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert!(
        answer.body.contains("answer from backup"),
        "{}",
        answer.body
    );
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
    let attempts = answer.run.attempts();
    assert_eq!(attempts[0].class, Some(FailureClass::Timeout));
}

#[tokio::test(start_paused = true)]
async fn the_non_streaming_head_timeout_is_configurable() {
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()))
        .timeouts(|t| Timeouts {
            non_streaming_head: Some(Duration::from_secs(4)),
            ..t
        })
        .build();
    let started = Instant::now();
    let answer = send(&failover, request("gpt-x", false)).await;
    assert_eq!(started.elapsed(), Duration::from_secs(4));
    assert!(
        answer.body.contains("answer from backup"),
        "{}",
        answer.body
    );
    // A slow head within the timeout is waited for.
    let slow = FakeProvider::new("slow").always(Reply::Delayed(
        Duration::from_secs(3),
        Box::new(Reply::completion("slow")),
    ));
    let failover = Failover::builder()
        .target(Target::new("slow", slow.clone()))
        .timeouts(|t| Timeouts {
            non_streaming_head: Some(Duration::from_secs(4)),
            ..t
        })
        .build();
    let answer = send(&failover, request("gpt-x", false)).await;
    assert!(answer.body.contains("answer from slow"), "{}", answer.body);
    assert_eq!(slow.calls(), 1);
}

/// A whole answer whose body sends `first`, waits `pause`, sends a bit
/// more, then goes silent.
fn stalling_answer(pause: Duration) -> Response<ScriptedBody> {
    let body = completion("primary");
    let (first, rest) = body.split_at(20);
    let mut response = json_response(200, "");
    *response.body_mut() = ScriptedBody::new([
        Step::data(first.to_owned()),
        Step::Wait(pause),
        Step::data(rest[..10].to_owned()),
        Step::Stall,
    ]);
    response
}

#[tokio::test(start_paused = true)]
async fn a_non_streaming_body_that_stalls_is_rerouted_at_the_idle_timeout() {
    let primary = Upstream::new(|| stalling_answer(Duration::from_secs(1)));
    let backup = Upstream::new(|| json_response(200, completion("backup")));
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()))
        .stream_policy(StreamPolicy::new().idle_timeout(Duration::from_secs(2)))
        .build();
    let started = Instant::now();
    let answer = send(&failover, request("gpt-x", false)).await;
    // One second of progress, then the two-second gap that ends it.
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert!(
        answer.body.contains("answer from backup"),
        "{}",
        answer.body
    );
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
    let attempts = answer.run.attempts();
    assert_eq!(attempts[0].class, Some(FailureClass::Timeout));
    assert_eq!(attempts[0].bytes_flushed, 0);
}

#[tokio::test(start_paused = true)]
async fn the_response_timeout_still_caps_a_whole_answer() {
    // Steady progress (never idle) that would never end: the response
    // timeout stops it, as before.
    let primary = Upstream::new(|| {
        let mut response = json_response(200, "");
        let steps = (0..1000).flat_map(|_| [Step::data("  "), Step::Wait(Duration::from_secs(1))]);
        *response.body_mut() = ScriptedBody::new(steps);
        response
    });
    let backup = Upstream::new(|| json_response(200, completion("backup")));
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()))
        .stream_policy(StreamPolicy::new().idle_timeout(Duration::from_secs(2)))
        .timeouts(|t| Timeouts {
            response: Some(Duration::from_secs(7)),
            ..t
        })
        .build();
    let started = Instant::now();
    let answer = send(&failover, request("gpt-x", false)).await;
    assert_eq!(started.elapsed(), Duration::from_secs(7));
    assert!(
        answer.body.contains("answer from backup"),
        "{}",
        answer.body
    );
}

// ---------------------------------------------------------------------------
// The gateway's `[failover]` header lists, over loopback.

async fn gateway(failover: &str, upstream: &FakeUpstream) -> app::Running {
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[budget]
deadline_ms = 10000

[failover]
max_retries_per_target = 0
shutdown_grace_ms = 5000
{failover}

[[providers]]
name = "primary"
base_url = "{}"
"#,
        upstream.base_url()
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    app::serve(gateway, listener)
}

async fn post_with_client_headers(gateway: &app::Running) -> StatusCode {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = serde_json::json!({
        "model": "gpt-x", "stream": false,
        "messages": [{"role": "user", "content": "hi"}],
    });
    let request = Request::post(format!("http://{}/v1/chat/completions", gateway.addr))
        .header("content-type", "application/json")
        .header("openai-organization", "org-client-chosen")
        .header("openai-project", "proj-client-chosen")
        .header("x-custom", "custom")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), client.request(request))
        .await
        .expect("the gateway answers in time")
        .unwrap();
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

#[tokio::test]
async fn the_gateway_forwards_the_client_headers_its_config_names() {
    let upstream = FakeUpstream::builder("primary")
        .tokens(4)
        .start()
        .await
        .unwrap();

    let defaults = gateway("", &upstream).await;
    assert_eq!(post_with_client_headers(&defaults).await, StatusCode::OK);
    let seen = upstream.requests().pop().unwrap();
    assert_eq!(seen.header("openai-organization"), None);
    assert_eq!(seen.header("openai-project"), None);
    assert_eq!(seen.header("x-custom"), None);

    let named = gateway(
        r#"forward_request_headers = ["openai-organization", "x-custom"]"#,
        &upstream,
    )
    .await;
    assert_eq!(post_with_client_headers(&named).await, StatusCode::OK);
    let seen = upstream.requests().pop().unwrap();
    assert_eq!(
        seen.header("openai-organization"),
        Some("org-client-chosen")
    );
    assert_eq!(seen.header("x-custom"), Some("custom"));
    assert_eq!(seen.header("openai-project"), None);
}
