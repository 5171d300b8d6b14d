//! Guards against mutations an audit found no test would catch (issue 13):
//! the bytes recorded for a committed attempt, the context-window
//! pre-filter at its boundary, and the client credentials the failover
//! layer must never send upstream. Each test asserts what the client
//! received, which upstream was called, and what the records say.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_llm_failover::Decision;
use tower_llm_failover::dialect::{Dialect, OpenAiChat};
use tower_llm_failover::failover::Caps;
use tower_llm_failover::failover::{Capabilities, Failover, Target};
use tower_llm_failover::observe::TurnRecord;
use tower_llm_testing::{FakeProvider, Reply};

const SERVER_500: &str = r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#;

struct Answer {
    status: StatusCode,
    body: Bytes,
    run: TurnRecord,
}

fn chat_body(stream: bool) -> Value {
    json!({
        "model": "gpt-x",
        "stream": stream,
        "messages": [{"role": "user", "content": "Tell me about caching."}],
    })
}

fn post(body: &Value) -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// Sends one request and reads the whole body; the records are read after
/// the body has ended, when the committed attempt's figures are final.
async fn send(failover: &Failover<FakeProvider>, request: Request<Full<Bytes>>) -> Answer {
    let response = failover.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer { status, body, run }
}

// ---------------------------------------------------------------------------
// (a) bytes_flushed of a committed attempt is what the client received.

#[tokio::test(start_paused = true)]
async fn a_clean_stream_records_every_byte_the_client_received() {
    let primary = FakeProvider::new("primary");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .build();
    let answer = send(&failover, post(&chat_body(true))).await;
    assert_eq!(answer.status, StatusCode::OK);
    let text = std::str::from_utf8(&answer.body).unwrap();
    assert_eq!(text.matches("primary-").count(), 8, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");

    assert!(answer.run.is_done());
    let attempts = answer.run.attempts();
    assert_eq!(attempts.len(), 1);
    let record = &attempts[0];
    assert_eq!(record.decision, Decision::Committed);
    assert_eq!(record.class, None, "a clean stream");
    assert!(!answer.body.is_empty());
    assert_eq!(
        record.bytes_flushed,
        answer.body.len() as u64,
        "the recorded figure is the exact byte count the client received"
    );
}

#[tokio::test(start_paused = true)]
async fn a_non_streamed_answer_records_every_byte_the_client_received() {
    let primary = FakeProvider::new("primary");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .build();
    let answer = send(&failover, post(&chat_body(false))).await;
    assert_eq!(answer.status, StatusCode::OK);
    let completion: Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(completion["object"], "chat.completion", "{completion}");

    let attempts = answer.run.attempts();
    assert_eq!(attempts.len(), 1);
    let record = &attempts[0];
    assert_eq!(record.decision, Decision::Committed);
    assert!(!answer.body.is_empty());
    assert_eq!(record.bytes_flushed, answer.body.len() as u64);
}

#[tokio::test(start_paused = true)]
async fn after_a_reroute_only_the_answering_attempt_records_bytes() {
    for stream in [true, false] {
        let primary = FakeProvider::new("primary").always(Reply::status(500, SERVER_500));
        let backup = FakeProvider::new("backup");
        let failover = Failover::builder()
            .target(Target::new("primary", primary.clone()))
            .target(Target::new("backup", backup.clone()))
            .caps(|c| Caps {
                retries_per_target: 0,
                ..c
            })
            .build();
        let answer = send(&failover, post(&chat_body(stream))).await;
        assert_eq!(answer.status, StatusCode::OK, "stream: {stream}");
        let text = std::str::from_utf8(&answer.body).unwrap();
        assert!(!text.contains("primary"), "{text}");
        assert!(text.contains("backup"), "{text}");
        assert_eq!((primary.calls(), backup.calls()), (1, 1));

        let attempts = answer.run.attempts();
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[0].decision, Decision::Reroute);
        assert_eq!(
            attempts[0].bytes_flushed, 0,
            "nothing of it reached the client"
        );
        assert_eq!(attempts[1].decision, Decision::Committed);
        assert_eq!(
            attempts[1].bytes_flushed,
            answer.body.len() as u64,
            "stream: {stream}"
        );
    }
}

// ---------------------------------------------------------------------------
// (b) the context-window pre-filter, on both sides of its boundary.

/// The request used for the window tests, and the tokens it needs (the
/// crate's own estimate of the prompt plus `max_tokens`).
fn window_request() -> (Value, u64) {
    let mut body = chat_body(true);
    body["max_tokens"] = json!(100);
    let (requirements, _) = OpenAiChat
        .read_request(bytes::Bytes::from(body.to_string()))
        .unwrap();
    let needed = requirements.input_tokens + requirements.max_output_tokens.unwrap();
    assert!(needed > 100, "the prompt counts too: {requirements:?}");
    (body, needed)
}

fn windowed(name: &str, provider: &FakeProvider, window: u64) -> Target<FakeProvider> {
    Target::new(name.to_owned(), provider.clone()).capabilities(Capabilities {
        context_window: Some(window),
        ..Capabilities::default()
    })
}

#[tokio::test(start_paused = true)]
async fn a_request_that_fits_the_window_exactly_or_with_room_is_served() {
    let (body, needed) = window_request();
    for window in [needed, needed + 1, needed * 4] {
        let only = FakeProvider::new("only");
        let failover = Failover::builder()
            .target(windowed("only", &only, window))
            .build();
        let answer = send(&failover, post(&body)).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "needs {needed} tokens, window {window}: {:?}",
            answer.body
        );
        assert_eq!(only.calls(), 1, "window {window}");
        assert_eq!(
            std::str::from_utf8(&answer.body)
                .unwrap()
                .matches("only-")
                .count(),
            8
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_over_the_window_skips_that_target() {
    let (body, needed) = window_request();

    // One token over: the small target is never called, the larger serves.
    let small = FakeProvider::new("small");
    let large = FakeProvider::new("large");
    let failover = Failover::builder()
        .target(windowed("small", &small, needed - 1))
        .target(windowed("large", &large, needed))
        .build();
    let answer = send(&failover, post(&body)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!((small.calls(), large.calls()), (0, 1));
    let text = std::str::from_utf8(&answer.body).unwrap();
    assert!(!text.contains("small"), "{text}");
    assert_eq!(text.matches("large-").count(), 8);
    let attempts = answer.run.attempts();
    assert_eq!(attempts.len(), 1, "the filtered target costs no attempt");
    assert_eq!(&*attempts[0].target, "large");

    // No target is large enough: an explicit stop, nothing sent upstream.
    let small = FakeProvider::new("small");
    let failover = Failover::builder()
        .target(windowed("small", &small, needed - 1))
        .build();
    let answer = send(&failover, post(&body)).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(small.calls(), 0);
    let error: Value = serde_json::from_slice(&answer.body).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("context window"), "{message}");
    assert!(
        message.contains(&format!("{needed} tokens")),
        "names what was needed: {message}"
    );
}

// ---------------------------------------------------------------------------
// (c) the client's credentials never reach a provider.

const CLIENT_CREDENTIALS: [(&str, &str); 5] = [
    ("authorization", "Bearer client-bearer-key"),
    ("x-api-key", "client-anthropic-key"),
    ("api-key", "client-azure-key"),
    ("x-goog-api-key", "client-gemini-key"),
    ("proxy-authorization", "Basic client-proxy-key"),
];

fn with_client_credentials(body: &Value) -> Request<Full<Bytes>> {
    let mut request = post(body);
    for (name, value) in CLIENT_CREDENTIALS {
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    request
        .headers_mut()
        .insert("x-request-id", "kept".parse().unwrap());
    request
}

#[tokio::test(start_paused = true)]
async fn no_provider_ever_sees_the_clients_credentials() {
    for stream in [true, false] {
        // A failed first attempt, so the request rebuilt for the reroute is
        // checked as well as the first.
        let primary = FakeProvider::new("primary").always(Reply::status(500, SERVER_500));
        let backup = FakeProvider::new("backup");
        let failover = Failover::builder()
            .target(Target::new("primary", primary.clone()))
            .target(Target::new("backup", backup.clone()))
            .caps(|c| Caps {
                retries_per_target: 0,
                ..c
            })
            .build();
        let answer = send(&failover, with_client_credentials(&chat_body(stream))).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!((primary.calls(), backup.calls()), (1, 1));

        let seen: Vec<_> = primary.seen().into_iter().chain(backup.seen()).collect();
        assert_eq!(seen.len(), 2);
        for request in &seen {
            for (name, value) in CLIENT_CREDENTIALS {
                assert!(
                    request.headers.get(name).is_none(),
                    "{name} reached the provider (stream: {stream})"
                );
                assert!(
                    !request
                        .headers
                        .values()
                        .any(|v| v.as_bytes() == value.as_bytes()),
                    "the client's {name} value reached the provider under another name"
                );
            }
            // Not a provider that sees no headers at all: the rest passes.
            assert_eq!(request.headers["x-request-id"], "kept");
            assert_eq!(request.headers["content-type"], "application/json");
            assert_eq!(request.body["model"], "gpt-x");
        }
    }
}
