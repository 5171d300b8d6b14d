//! What a client is told about a provider's failure: a short, stable
//! message of the failure's class. The provider's own message (account and
//! project ids), and a transport error's chain (a proxy's address), stay
//! in the turn's records; none of it reaches the client's bytes, neither
//! in an "all options spent" answer nor in a terminal chunk.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_llm_failover::failover::Caps;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_failover::observe::TurnRecord;
use tower_llm_testing::{FakeProvider, Reply, Step};

const LEAKY_500: &str = r#"{"error":{"message":"Internal error for org-Ab12Cd34 in proj_Zz9Yy8 via 10.20.30.40:3128","type":"server_error","param":null,"code":null}}"#;

fn request(stream: bool) -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from(format!(
            r#"{{"model":"gpt-x","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
        ))))
        .unwrap()
}

fn leaks(text: &str) -> bool {
    ["org-Ab12Cd34", "proj_Zz9Yy8", "10.20.30.40"]
        .iter()
        .any(|secret| text.contains(secret))
}

#[tokio::test(start_paused = true)]
async fn an_all_options_spent_answer_names_the_class_not_the_providers_words() {
    let primary = FakeProvider::new("primary").always(Reply::status(500, LEAKY_500));
    let backup = FakeProvider::new("backup").always(Reply::status(500, LEAKY_500));
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .target(Target::new("backup", backup))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let response = failover.oneshot(request(false)).await.unwrap();
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(!leaks(&text), "{text}");
    assert!(
        text.contains("first failure: server_error from primary: the provider failed to answer"),
        "{text}"
    );
    // The detail is kept where the operator reads it.
    let attempts = run.attempts();
    assert!(
        attempts
            .iter()
            .any(|a| a.message.as_deref().is_some_and(leaks)),
        "{attempts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_terminal_chunk_carries_the_class_message_only() {
    let in_band = Bytes::from(format!("data: {LEAKY_500}\n\n"));
    let primary = FakeProvider::new("primary").always(Reply::tokens_then(
        "primary",
        2,
        vec![Step::Data(in_band)],
    ));
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .build();
    let response = failover.oneshot(request(true)).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(
        text.contains("primary-1"),
        "committed before the failure: {text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!leaks(&text), "{text}");
    assert!(text.contains("the provider failed to answer"), "{text}");
}
