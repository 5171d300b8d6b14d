//! The crate as a library user meets it: an axum app mounts the full stack
//! (`BudgetLayer` → `Failover`) with `route_service`, over two targets of
//! different service types (the real `UpstreamClient` in front of a
//! `FakeUpstream` on loopback, and a `tower::service_fn` closure), with no
//! error mapping, served over real HTTP and driven by a hyper client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;
use tower_llm_client::UpstreamClient;
use tower_llm_failover::BoxError;
use tower_llm_failover::budget::{BudgetLayer, TurnLimits};
use tower_llm_failover::failover::Caps;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_testing::upstream::FakeUpstream;
use tower_llm_testing::{Step, chunks, json_response, sse_response};

const LIMIT: Duration = Duration::from_secs(10);

const BACKUP_COMPLETION: &str = r#"{"id":"c-backup","object":"chat.completion","created":1,"model":"backup-model","choices":[{"index":0,"message":{"role":"assistant","content":"backup answer"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;

/// The gateway under test, the primary behind it, and how often the
/// `service_fn` backup was called.
struct App {
    addr: SocketAddr,
    primary: FakeUpstream,
    backup_calls: Arc<AtomicUsize>,
}

/// What a user writes: two targets of different types, the stack, a router.
/// The backup answers a whole stream or a whole JSON body (`stream`).
async fn start(budget: BudgetLayer, stream: bool) -> App {
    let primary = FakeUpstream::start("primary").await;
    let client = UpstreamClient::builder(primary.base_url()).build().unwrap();
    let backup_calls = Arc::new(AtomicUsize::new(0));
    let calls = Arc::clone(&backup_calls);
    let backup = tower::service_fn(move |_request| {
        calls.fetch_add(1, Ordering::SeqCst);
        let response = if stream {
            sse_response(chunks::full_stream("backup", 3).into_iter().map(Step::Data))
        } else {
            json_response(200, BACKUP_COMPLETION)
        };
        async move { Ok::<_, BoxError>(response) }
    });

    let failover = Failover::builder()
        .target(Target::boxed("primary", client))
        .target(Target::boxed("backup", backup).model("backup-model"))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let stack = ServiceBuilder::new().layer(budget).service(failover);
    let app = axum::Router::new().route_service("/v1/chat/completions", stack);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    App {
        addr,
        primary,
        backup_calls,
    }
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

/// POSTs a chat request for `model` (which may carry a FakeUpstream fault,
/// `gpt-4o#fault:...`) and reads the whole answer, within time.
async fn chat(app: &App, model: &str, stream: bool) -> Reply {
    let body = serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    });
    let request = Request::post(format!("http://{}/v1/chat/completions", app.addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = tokio::time::timeout(LIMIT, client.request(request))
        .await
        .expect("the gateway answers in time")
        .unwrap();
    let (parts, body) = response.into_parts();
    let bytes = tokio::time::timeout(LIMIT, body.collect())
        .await
        .expect("the body ends in time")
        .unwrap()
        .to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

#[tokio::test]
async fn a_429_before_any_output_gets_the_backups_whole_stream() {
    let app = start(BudgetLayer::new(), true).await;
    let reply = chat(&app, "gpt-4o#fault:status=429", true).await;

    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["x-failover-attempts"], "2");
    assert_eq!(reply.headers["x-failover-target"], "backup");
    let expected: Vec<u8> = chunks::full_stream("backup", 3).concat();
    assert_eq!(reply.body.as_bytes(), expected, "the backup's own bytes");
    assert_eq!(app.primary.attempts(), 1);
    assert_eq!(app.backup_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_429_before_any_output_gets_the_backups_whole_json_answer() {
    let app = start(BudgetLayer::new(), false).await;
    let reply = chat(&app, "gpt-4o#fault:status=429", false).await;

    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["x-failover-attempts"], "2");
    assert_eq!(reply.headers["x-failover-target"], "backup");
    assert_eq!(reply.body, BACKUP_COMPLETION);
    assert_eq!(app.primary.attempts(), 1);
    assert_eq!(app.backup_calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_reset_after_commit_ends_with_a_terminal_chunk_and_no_second_voice() {
    let app = start(BudgetLayer::new(), true).await;
    let reply = chat(&app, "gpt-4o#fault:reset_after=3", true).await;

    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["x-failover-attempts"], "1");
    assert_eq!(reply.headers["x-failover-target"], "primary");
    let events: Vec<&str> = reply.body.split_terminator("\n\n").collect();
    // Role chunk, three tokens, the terminal chunk, [DONE].
    assert_eq!(events.len(), 6, "{}", reply.body);
    assert_eq!(reply.body.matches("primary-tok").count(), 3);
    assert!(
        events[4].contains(r#""finish_reason":"error""#),
        "{events:?}"
    );
    assert_eq!(events[5], "data: [DONE]");
    assert!(!reply.body.contains("backup"));
    assert_eq!(app.backup_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_refused_turn_is_still_a_response_the_client_reads() {
    // One attempt allowed: the primary's 429 is the answer.
    let one_attempt = TurnLimits {
        max_attempts: 1,
        ..TurnLimits::new()
    };
    let app = start(BudgetLayer::new().limits(one_attempt), true).await;
    let reply = chat(&app, "gpt-4o#fault:status=429", true).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.headers["x-failover-attempts"], "1");
    let error: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert!(error["error"]["message"].is_string(), "{}", reply.body);
    assert!(error["error"]["type"].is_string(), "{}", reply.body);
    assert_eq!(app.backup_calls.load(Ordering::SeqCst), 0);

    // A deadline shorter than a silent primary: a 504, well before LIMIT.
    let budget = BudgetLayer::new().deadline(Duration::from_millis(300));
    let app = start(budget, true).await;
    let started = std::time::Instant::now();
    let reply = chat(&app, "gpt-4o#fault:no_response", true).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT, "{}", reply.body);
    let error: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert!(error["error"]["message"].is_string(), "{}", reply.body);
    assert_eq!(app.backup_calls.load(Ordering::SeqCst), 0);

    // A turn the budget refuses before any attempt is still a response.
    let app = start(BudgetLayer::new().deadline(Duration::ZERO), true).await;
    let reply = chat(&app, "gpt-4o", true).await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT, "{}", reply.body);
    let error: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert!(error["error"]["message"].is_string(), "{}", reply.body);
    assert_eq!(app.primary.attempts(), 0);
    assert_eq!(app.backup_calls.load(Ordering::SeqCst), 0);
}
