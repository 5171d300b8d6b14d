//! `FakeUpstream` over real HTTP on 127.0.0.1, driven by `UpstreamClient`:
//! healthy answers, every fault, attempt counting, and both ways of choosing
//! a fault (model name, control endpoint).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_llm_client::ResponseBody;
use tower_llm_client::{Auth, UpstreamClient};
use tower_llm_testing::upstream::{ErrorFixture, FakeUpstream, Fault};

/// Bound on any wait that should end at once; only reached on failure.
const PATIENCE: Duration = Duration::from_secs(5);
/// How long "nothing arrives" is watched for. Only ever used after what
/// must arrive has arrived (waited for with `PATIENCE`), to check that
/// nothing more comes: a slow or starved machine can then only make such a
/// check pass for a wrong reason, never fail for a right one.
const QUIET: Duration = Duration::from_millis(60);

fn client(fake: &FakeUpstream) -> UpstreamClient {
    UpstreamClient::builder(fake.base_url()).build().unwrap()
}

async fn call(
    client: &UpstreamClient,
    method: &str,
    path: &str,
    body: Value,
) -> Response<ResponseBody> {
    let body = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    tokio::time::timeout(PATIENCE, client.clone().oneshot(request))
        .await
        .expect("response head in time")
        .unwrap()
}

async fn chat(fake: &FakeUpstream, body: Value) -> Response<ResponseBody> {
    call(&client(fake), "POST", "/v1/chat/completions", body).await
}

fn stream_request(model: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi there"}]})
}

async fn json_body(response: Response<ResponseBody>) -> Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[derive(Debug, PartialEq)]
enum End {
    Clean,
    Error,
    Silent,
    /// `read_events_until` saw what it waited for.
    Enough,
}

/// Reads SSE `data:` payloads until the body ends, fails, or stays silent
/// for `quiet`.
async fn read_events(body: &mut ResponseBody, quiet: Duration) -> (Vec<String>, End) {
    read_events_until(body, quiet, |_| false).await
}

/// Reads SSE `data:` payloads until `enough` holds for those read so far,
/// or the body ends, fails, or stays silent for `quiet`.
async fn read_events_until(
    body: &mut ResponseBody,
    quiet: Duration,
    enough: impl Fn(&[String]) -> bool,
) -> (Vec<String>, End) {
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    let end = loop {
        if enough(&events) {
            break End::Enough;
        }
        match tokio::time::timeout(quiet, body.frame()).await {
            Err(_) => break End::Silent,
            Ok(None) => break End::Clean,
            Ok(Some(Err(_))) => break End::Error,
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    buffer.extend_from_slice(&data);
                }
                while let Some(at) = buffer.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = buffer.drain(..at + 2).collect();
                    let text = String::from_utf8(event).unwrap();
                    for line in text.lines() {
                        if let Some(data) = line.strip_prefix("data: ") {
                            events.push(data.to_owned());
                        }
                    }
                }
            }
        }
    };
    (events, end)
}

fn content(event: &str) -> Option<String> {
    let v: Value = serde_json::from_str(event).ok()?;
    v.pointer("/choices/0/delta/content")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

fn contents(events: &[String]) -> Vec<String> {
    events.iter().filter_map(|e| content(e)).collect()
}

fn tokens(name: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{name}-tok{i} ")).collect()
}

#[tokio::test]
async fn a_healthy_stream_carries_the_name_in_every_token_and_ends_with_done() {
    let fake = FakeUpstream::start("alpha").await;
    let response = chat(&fake, stream_request("gpt-4o")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["x-fake-upstream"], "alpha");
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    assert_eq!(contents(&events), tokens("alpha", 8));
    assert_eq!(events.last().unwrap(), "[DONE]");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(first["model"], "gpt-4o");
    let finish: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    // No usage chunk unless asked for.
    assert!(!events.iter().any(|e| e.contains("\"usage\"")));

    assert_eq!(fake.attempts(), 1);
    let seen = fake.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].model(), Some("gpt-4o"));
    assert_eq!(seen[0].path, "/v1/chat/completions");
}

#[tokio::test]
async fn token_count_pacing_and_usage_are_configurable() {
    let fake = FakeUpstream::builder("beta")
        .tokens(3)
        .pace(Duration::from_millis(1))
        .start()
        .await
        .unwrap();
    let mut request = stream_request("m");
    request["stream_options"] = json!({"include_usage": true});
    let response = chat(&fake, request).await;
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    assert_eq!(contents(&events), tokens("beta", 3));
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(usage["usage"]["prompt_tokens"], 2);
    assert_eq!(events.last().unwrap(), "[DONE]");

    // Per-request settings in the model name.
    let response = chat(&fake, stream_request("m#fault:tokens=40")).await;
    let (events, _) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(contents(&events), tokens("beta", 40));
}

#[tokio::test]
async fn a_non_streamed_answer_is_a_chat_completion_with_usage() {
    let fake = FakeUpstream::builder("gamma")
        .tokens(4)
        .start()
        .await
        .unwrap();
    let response = chat(
        &fake,
        json!({"model": "m", "messages": [{"role": "user", "content": "one two three"}]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body = json_body(response).await;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        tokens("gamma", 4).concat()
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(body["usage"]["completion_tokens"], 4);
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    assert_eq!(body["usage"]["total_tokens"], 7);
}

#[tokio::test]
async fn models_and_unknown_paths() {
    let fake = FakeUpstream::builder("delta")
        .models(["m1", "m2"])
        .start()
        .await
        .unwrap();
    let response = call(&client(&fake), "GET", "/v1/models", Value::Null).await;
    let body = json_body(response).await;
    assert_eq!(body["object"], "list");
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m1", "m2"]);
    assert_eq!(body["data"][0]["owned_by"], "delta");

    let response = call(&client(&fake), "POST", "/v1/embeddings", json!({})).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_body(response).await["error"]["code"], "unknown_url");
    // Neither counts as a chat attempt.
    assert_eq!(fake.attempts(), 0);
}

#[tokio::test]
async fn status_before_body_with_retry_after() {
    let fake = FakeUpstream::start("p").await;
    let response = chat(&fake, stream_request("fault:status=429;retry_after=2")).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(response.headers()["content-type"], "application/json");
    let body = json_body(response).await;
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");

    let response = chat(
        &fake,
        stream_request("fault:status=429;error=quota;retry_after_ms=250"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after-ms"], "250");
    assert!(!response.headers().contains_key("retry-after"));
    assert_eq!(
        json_body(response).await["error"]["code"],
        "insufficient_quota"
    );

    // Default fixtures per status.
    let response = chat(&fake, stream_request("fault:status=503")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = json_body(response).await;
    let expected: Value = serde_json::from_str(ErrorFixture::Overloaded.body()).unwrap();
    assert_eq!(body, expected);

    // A body of its own (set from Rust).
    fake.set_fault_times(
        Fault::Status {
            status: 502,
            retry_after: None,
            retry_after_ms: None,
            error: None,
            body: Some(Value::String("<html>bad gateway</html>".into())),
        },
        1,
    );
    let response = chat(&fake, stream_request("m")).await;
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(response.headers()["content-type"], "text/plain");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"<html>bad gateway</html>");
    assert_eq!(fake.attempts(), 4);
}

#[tokio::test]
async fn in_band_error_after_n_tokens() {
    let fake = FakeUpstream::start("p").await;
    let response = chat(&fake, stream_request("fault:error_after=3")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    assert_eq!(contents(&events), tokens("p", 3));
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "server_error");
    assert!(!events.iter().any(|e| e == "[DONE]"));

    let response = chat(
        &fake,
        stream_request("fault:error_after=0;error=rate_limit"),
    )
    .await;
    let (events, _) = read_events(&mut response.into_body(), PATIENCE).await;
    assert!(contents(&events).is_empty());
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "rate_limit_exceeded");

    // Not streamed: a 200 whose body is an error.
    let response = chat(
        &fake,
        json!({"model": "fault:error_after=2", "messages": []}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(json_body(response).await["error"]["type"], "server_error");
}

#[tokio::test]
async fn reset_after_n_tokens_is_a_body_error_after_n_chunks() {
    let fake = FakeUpstream::start("p").await;
    let response = chat(&fake, stream_request("fault:reset_after=3")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Error);
    assert_eq!(contents(&events), tokens("p", 3));
    assert!(!events.iter().any(|e| e == "[DONE]"));

    // The fake keeps serving on new connections.
    let response = chat(&fake, stream_request("m")).await;
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    assert_eq!(contents(&events), tokens("p", 8));

    // Not streamed: half the JSON, then the reset.
    let response = chat(
        &fake,
        json!({"model": "fault:reset_after=1", "messages": []}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.into_body().collect().await.is_err());
    assert_eq!(fake.attempts(), 3);
}

#[tokio::test]
async fn stall_after_n_tokens_goes_silent() {
    let fake = FakeUpstream::start("p").await;
    let response = chat(&fake, stream_request("fault:stall_after=2")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    // The two tokens, however long the machine takes to deliver them...
    let (events, end) = read_events_until(&mut body, PATIENCE, |e| contents(e).len() >= 2).await;
    assert_eq!(end, End::Enough);
    assert_eq!(contents(&events), tokens("p", 2));
    // ...then silence with the connection open: no finish, no end, no error.
    let (more, end) = read_events(&mut body, QUIET).await;
    assert_eq!((more.len(), end), (0, End::Silent));
    // Still silent on a second look: nothing was on its way.
    let (more, end) = read_events(&mut body, QUIET).await;
    assert_eq!((more.len(), end), (0, End::Silent));
}

#[tokio::test]
async fn eof_after_n_tokens_and_missing_done() {
    let fake = FakeUpstream::start("p").await;
    let response = chat(&fake, stream_request("fault:eof_after=2")).await;
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    assert_eq!(contents(&events), tokens("p", 2));
    assert!(!events.iter().any(|e| e.contains("finish_reason\":\"stop")));
    assert!(!events.iter().any(|e| e == "[DONE]"));

    let mut request = stream_request("fault:no_done");
    request["stream_options"] = json!({"include_usage": true});
    let response = chat(&fake, request).await;
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    assert_eq!(contents(&events), tokens("p", 8));
    assert!(events.iter().any(|e| e.contains("finish_reason\":\"stop")));
    assert!(events.last().unwrap().contains("\"usage\""));
    assert!(!events.iter().any(|e| e == "[DONE]"));
}

#[tokio::test]
async fn malformed_chunk_at_n() {
    let fake = FakeUpstream::start("p").await;
    let response = chat(&fake, stream_request("fault:malformed_at=2")).await;
    let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    // role, tok0, tok1, the broken event, tok2..tok7, finish, [DONE]
    assert!(
        serde_json::from_str::<Value>(&events[3]).is_err(),
        "{}",
        events[3]
    );
    for (i, event) in events.iter().enumerate() {
        if i != 3 && event != "[DONE]" {
            assert!(serde_json::from_str::<Value>(event).is_ok(), "{event}");
        }
    }
    assert_eq!(content(&events[2]).unwrap(), "p-tok1 ");
    assert_eq!(content(&events[4]).unwrap(), "p-tok2 ");
    assert_eq!(contents(&events), tokens("p", 8));
    assert_eq!(events.last().unwrap(), "[DONE]");
}

/// Waits (bounded by `PATIENCE`) until `done` holds.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn no_response_never_answers_the_head() {
    let fake = FakeUpstream::start("p").await;
    let request = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from(
            stream_request("fault:no_response").to_string(),
        )))
        .unwrap();
    let call = tokio::spawn(client(&fake).oneshot(request));
    // The request is read and counted...
    eventually("the fake reads the request", || fake.attempts() == 1).await;
    assert_eq!(fake.requests()[0].model(), Some("fault:no_response"));
    // ...and after that, still no head.
    tokio::time::sleep(QUIET).await;
    assert!(!call.is_finished(), "a head arrived");
    call.abort();
    assert_eq!(fake.attempts(), 1);
}

#[tokio::test]
async fn slow_first_token_delays_the_first_content_chunk() {
    let fake = FakeUpstream::start("p").await;

    // The first content chunk is sent 200 ms after the role chunk, which is
    // sent after our request: it cannot reach us sooner than 200 ms after we
    // sent it, however the machine schedules us (a causal lower bound, not a
    // race against a timer).
    let sent = Instant::now();
    let response = chat(&fake, stream_request("fault:slow_first_token=200")).await;
    let mut body = response.into_body();
    let (events, end) = read_events_until(&mut body, PATIENCE, |e| !contents(e).is_empty()).await;
    let first_content = sent.elapsed();
    assert_eq!(end, End::Enough);
    assert!(content(&events[0]).is_none(), "the role chunk first");
    assert!(
        first_content >= Duration::from_millis(200),
        "first content after {first_content:?}"
    );
    let (rest, end) = read_events(&mut body, PATIENCE).await;
    assert_eq!(end, End::Clean);
    let events = [events, rest].concat();
    assert_eq!(contents(&events), tokens("p", 8));
    assert_eq!(events.last().unwrap(), "[DONE]");

    // The role chunk is not held back with the first token: with a wait far
    // beyond any scheduling delay it still arrives, alone, and then nothing.
    let response = chat(&fake, stream_request("fault:slow_first_token=600000")).await;
    let mut body = response.into_body();
    let (events, end) = read_events_until(&mut body, PATIENCE, |e| !e.is_empty()).await;
    assert_eq!(end, End::Enough);
    assert_eq!(events.len(), 1);
    let role: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
    assert!(content(&events[0]).is_none());
    let (more, end) = read_events(&mut body, QUIET).await;
    assert_eq!((more.len(), end), (0, End::Silent));
}

#[tokio::test]
async fn the_control_endpoint_arms_and_clears_faults() {
    let fake = FakeUpstream::start("p").await;
    // The control paths live at the root, outside /v1.
    let control = UpstreamClient::builder(format!("http://{}", fake.addr()))
        .build()
        .unwrap();

    let response = call(
        &control,
        "POST",
        "/control/fault",
        json!({"fault": "status=500", "times": 2}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(json_body(response).await["fault"]["kind"], "status");
    for _ in 0..2 {
        let response = chat(&fake, stream_request("m")).await;
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
    let response = chat(&fake, stream_request("m")).await;
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);

    let response = call(&control, "GET", "/control/attempts", Value::Null).await;
    assert_eq!(json_body(response).await, json!({"attempts": 3}));

    // Structured form, until cleared.
    let response = call(
        &control,
        "POST",
        "/control/fault",
        json!({"fault": {"kind": "eof_after", "tokens": 1}}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    for _ in 0..3 {
        let response = chat(&fake, stream_request("m")).await;
        let (events, _) = read_events(&mut response.into_body(), PATIENCE).await;
        assert_eq!(contents(&events), tokens("p", 1));
    }
    let response = call(&control, "POST", "/control/fault", json!({"fault": null})).await;
    assert_eq!(response.status(), StatusCode::OK);
    let response = chat(&fake, stream_request("m")).await;
    let (events, _) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(contents(&events), tokens("p", 8));

    // Bad control bodies are refused and change nothing.
    for bad in [
        json!({"fault": "explode"}),
        json!({"fault": {"kind": "nope"}}),
        json!({"fault": "status=500", "extra": 1}),
    ] {
        let response = call(&control, "POST", "/control/fault", bad).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    }
    let response = chat(&fake, stream_request("m")).await;
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);

    let response = call(&control, "POST", "/control/reset", Value::Null).await;
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);
    assert_eq!(fake.attempts(), 0);
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn a_model_name_fault_wins_over_the_armed_one_and_leaves_it_armed() {
    let fake = FakeUpstream::start("p").await;
    fake.set_fault_times(Fault::status(500), 1);
    let response = chat(&fake, stream_request("fault:no_done")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (events, _) = read_events(&mut response.into_body(), PATIENCE).await;
    assert!(!events.iter().any(|e| e == "[DONE]"));
    let response = chat(&fake, stream_request("m")).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    drop(response);
    let response = chat(&fake, stream_request("m")).await;
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);

    // A bad spec in the model name is the caller's mistake: 400.
    let response = chat(&fake, stream_request("fault:status=abc")).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body = json_body(response).await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad fault spec")
    );

    // A fault set from Rust for every request, then cleared.
    fake.set_fault("reset_after=0".parse().unwrap());
    for _ in 0..2 {
        let response = chat(&fake, stream_request("m")).await;
        let (events, end) = read_events(&mut response.into_body(), PATIENCE).await;
        assert_eq!((contents(&events).len(), end), (0, End::Error));
    }
    fake.clear_fault();
    let response = chat(&fake, stream_request("m")).await;
    let (_, end) = read_events(&mut response.into_body(), PATIENCE).await;
    assert_eq!(end, End::Clean);
    assert_eq!(fake.attempts(), 7);
}

#[tokio::test]
async fn the_upstream_sees_the_targets_credential_never_the_clients() {
    let fake = FakeUpstream::builder("keyed")
        .api_key("sk-target")
        .start()
        .await
        .unwrap();
    let request = || {
        Request::post("/v1/chat/completions")
            .header("authorization", "Bearer sk-client")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                stream_request("gpt-4o-mini").to_string(),
            )))
            .unwrap()
    };
    let with_key = UpstreamClient::builder(fake.base_url())
        .auth(Auth::bearer("sk-target"))
        .build()
        .unwrap();
    let response = with_key.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    drop(response);

    let without = client(&fake);
    let response = without.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        json_body(response).await["error"]["code"],
        "invalid_api_key"
    );

    let seen = fake.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].header("authorization"), Some("Bearer sk-target"));
    assert_eq!(seen[1].header("authorization"), None);
    assert!(
        seen.iter()
            .all(|r| r.header("authorization") != Some("Bearer sk-client"))
    );
    assert_eq!(seen[0].body["model"], "gpt-4o-mini");
}

#[tokio::test]
async fn dropping_the_fake_closes_the_port_and_its_connections() {
    let fake = FakeUpstream::start("p").await;
    let addr = fake.addr();
    let response = chat(&fake, stream_request("fault:stall_after=1")).await;
    let mut body = response.into_body();
    let (events, end) = read_events_until(&mut body, PATIENCE, |e| !contents(e).is_empty()).await;
    assert_eq!((contents(&events).len(), end), (1, End::Enough));

    drop(fake);
    // The stalled stream ends (its connection task is gone)...
    let (_, end) = read_events(&mut body, PATIENCE).await;
    assert_ne!(end, End::Silent);
    // ...and the port stops accepting.
    let deadline = Instant::now() + PATIENCE;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "port still open");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
