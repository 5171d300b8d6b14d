//! A Responses API client through the failover layer: its lifecycle held
//! until real output, in-band failures rerouted before commit, the
//! `response.failed` terminal after it, turns bound to the provider that
//! holds their state, and provider-hosted tools kept on their provider.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_llm_failover::dialect::{OpenAiChat, OpenAiResponses};
use tower_llm_failover::failover::{Capabilities, Caps, Failover, Target};
use tower_llm_failover::observe::TurnRecord;
use tower_llm_testing::{FakeProvider, Reply, Step};

const TEXT: &str = include_str!("../src/dialect/responses/fixtures/text.sse");
const FAILED_BEFORE_OUTPUT: &str =
    include_str!("../src/dialect/responses/fixtures/failed_before_output.sse");

/// The fixture's events, one frame each, with its response id replaced.
fn frames(wire: &str, id: &str) -> Vec<Step> {
    wire.split_inclusive("\n\n")
        .map(|frame| Step::data(frame.replace("resp_68a1", id)))
        .collect()
}

fn stream(wire: &str, id: &str) -> Reply {
    Reply::Stream(frames(wire, id))
}

fn request(body: Value) -> Request<Full<Bytes>> {
    Request::post("/v1/responses")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn streaming(extra: Value) -> Request<Full<Bytes>> {
    let mut body = json!({"model": "gpt-5", "input": "hi", "stream": true});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    request(body)
}

async fn collect(
    response: http::Response<impl http_body::Body<Data = Bytes, Error: std::fmt::Debug>>,
) -> (u16, TurnRecord, String) {
    let status = response.status().as_u16();
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, run, String::from_utf8(body.to_vec()).unwrap())
}

/// Each event's name and data.
fn events(wire: &str) -> Vec<(String, Value)> {
    wire.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|frame| {
            let name = frame
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or("")
                .to_owned();
            let data = frame
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap();
            (name, serde_json::from_str(data).unwrap())
        })
        .collect()
}

fn responses_failover(
    targets: Vec<Target<FakeProvider>>,
) -> Failover<FakeProvider, OpenAiResponses> {
    let mut builder = Failover::builder().dialect(OpenAiResponses).caps(|c| Caps {
        retries_per_target: 0,
        ..c
    });
    for target in targets {
        builder = builder.target(target);
    }
    builder.build()
}

#[tokio::test(start_paused = true)]
async fn a_429_primary_before_output_is_invisible_one_lifecycle_one_id() {
    let primary = FakeProvider::new("primary").always(Reply::status(429, r#"{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#));
    let backup = FakeProvider::new("backup").always(stream(TEXT, "resp_backup"));
    let failover = responses_failover(vec![
        Target::new("primary", primary.clone()),
        Target::new("backup", backup.clone()),
    ]);
    let (status, run, body) = collect(failover.oneshot(streaming(json!({}))).await.unwrap()).await;
    assert_eq!(status, 200);
    // Exactly the backup's bytes: nothing of the primary's, nothing added.
    assert_eq!(body, TEXT.replace("resp_68a1", "resp_backup"));
    let events = events(&body);
    assert_eq!(
        events
            .iter()
            .filter(|(n, _)| n == "response.created")
            .count(),
        1
    );
    assert_eq!(primary.calls(), 1);
    assert_eq!(primary.seen()[0].uri.path(), "/v1/responses");
    assert_eq!(run.attempts().len(), 2);
    assert_eq!(run.attempts()[1].dialect, "openai-responses");
    assert_eq!(
        run.attempts()[1].response_id.as_deref(),
        Some("resp_backup")
    );
}

#[tokio::test(start_paused = true)]
async fn response_failed_before_output_reroutes_and_its_lifecycle_is_never_seen() {
    let primary = FakeProvider::new("primary").always(stream(FAILED_BEFORE_OUTPUT, "resp_primary"));
    let backup = FakeProvider::new("backup").always(stream(TEXT, "resp_backup"));
    let failover = responses_failover(vec![
        Target::new("primary", primary.clone()),
        Target::new("backup", backup),
    ]);
    let (_, run, body) = collect(failover.oneshot(streaming(json!({}))).await.unwrap()).await;
    assert!(!body.contains("resp_primary"), "{body}");
    assert_eq!(body, TEXT.replace("resp_68a1", "resp_backup"));
    let attempts = run.attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].class.map(|c| c.as_str()), Some("rate_limited"));
}

#[tokio::test(start_paused = true)]
async fn a_cut_after_output_ends_with_response_failed_continuing_the_sequence() {
    // The lifecycle and three deltas, then the connection resets.
    let mut steps = frames(TEXT, "resp_primary");
    steps.truncate(7);
    steps.push(Step::Error("connection reset".to_owned()));
    let primary = FakeProvider::new("primary").always(Reply::Stream(steps));
    let backup = FakeProvider::new("backup").always(stream(TEXT, "resp_backup"));
    let failover = responses_failover(vec![
        Target::new("primary", primary),
        Target::new("backup", backup.clone()),
    ]);
    let (_, run, body) = collect(failover.oneshot(streaming(json!({}))).await.unwrap()).await;
    let events = events(&body);
    let deltas: Vec<&str> = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, ["Hello", "!", " How"]);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[names.len() - 2..], ["response.failed", "error"]);
    let sequence: Vec<u64> = events
        .iter()
        .map(|(_, d)| d["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(sequence, (0..9).collect::<Vec<_>>(), "continued, no gap");
    let failed = &events[7].1["response"];
    assert_eq!(failed["id"], "resp_primary");
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["phase"], "committed");
    assert_eq!(failed["error"]["output_events"], 3);
    assert!(
        events[8].1["error"]["message"].is_string(),
        "what the SDKs raise on"
    );
    assert_eq!(backup.calls(), 0, "never spliced");
    assert_eq!(run.attempts().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_previous_response_id_turn_stays_on_its_provider_and_fails_naming_the_pin() {
    let primary = FakeProvider::new("openai").always(Reply::status(
        500,
        r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#,
    ));
    let backup = FakeProvider::new("azure").always(stream(TEXT, "resp_azure"));
    let chat = FakeProvider::new("chat").always(Reply::stream("chat", 3));
    let failover = responses_failover(vec![
        Target::new("primary", primary.clone()).provider("openai"),
        Target::new("backup", backup.clone()).provider("azure"),
    ]);
    let (status, run, body) = collect(
        failover
            .oneshot(streaming(json!({"previous_response_id": "resp_unknown"})))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body.contains("previous_response_id binds this turn to provider openai"),
        "{body}"
    );
    assert_eq!(primary.calls(), 1);
    assert_eq!(backup.calls(), 0, "no other provider tried");
    assert_eq!(run.attempts().len(), 1);

    // A target of another dialect never holds the state either.
    let failover = Failover::builder()
        .dialect(OpenAiResponses)
        .target(Target::new("chat", chat.clone()).dialect(OpenAiChat))
        .build();
    let (status, _, body) = collect(
        failover
            .oneshot(streaming(json!({"conversation": {"id": "conv_1"}})))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("conversation binds this turn"), "{body}");
    assert_eq!(chat.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_provider_that_answered_is_learned_and_the_next_turn_bound_to_it() {
    let primary = FakeProvider::new("openai")
        .then(Reply::status(429, r#"{"error":{"message":"slow","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#))
        .always(stream(TEXT, "resp_openai"));
    let backup = FakeProvider::new("azure").always(stream(TEXT, "resp_azure"));
    let failover = responses_failover(vec![
        Target::new("primary", primary.clone()).provider("openai"),
        Target::new("backup", backup.clone()).provider("azure"),
    ]);
    // Turn one fails over: the backup's provider now holds resp_azure.
    let (_, _, body) = collect(
        failover
            .clone()
            .oneshot(streaming(json!({})))
            .await
            .unwrap(),
    )
    .await;
    assert!(body.contains("resp_azure"));
    // Turn two continues it: only the backup is eligible, the primary
    // (healthy again) is not tried.
    let (_, run, body) = collect(
        failover
            .clone()
            .oneshot(streaming(json!({"previous_response_id": "resp_azure"})))
            .await
            .unwrap(),
    )
    .await;
    assert!(body.contains("resp_azure"));
    assert_eq!(primary.calls(), 1);
    assert_eq!(backup.calls(), 2);
    assert_eq!(run.attempts()[0].target.as_ref(), "backup");
    // `store: false` teaches nothing: a continuation of that answer is
    // bound to the route's first Responses target.
    let (_, _, _) = collect(
        failover
            .clone()
            .oneshot(streaming(json!({"store": false})))
            .await
            .unwrap(),
    )
    .await;
    let (_, run, _) = collect(
        failover
            .oneshot(streaming(json!({"previous_response_id": "resp_openai"})))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(run.attempts()[0].target.as_ref(), "primary");
}

#[tokio::test(start_paused = true)]
async fn a_hosted_tool_goes_only_where_it_is_hosted() {
    let web = || json!({"tools": [{"type": "web_search"}]});
    let chat = FakeProvider::new("chat").always(Reply::stream("chat", 3));
    let native = FakeProvider::new("native").always(stream(TEXT, "resp_n"));
    let no_hosting = FakeProvider::new("vllm").always(stream(TEXT, "resp_v"));
    let failover = Failover::builder()
        .dialect(OpenAiResponses)
        .target(Target::new("chat", chat.clone()).dialect(OpenAiChat))
        .target(
            Target::new("vllm", no_hosting.clone()).capabilities(Capabilities {
                hosted_tools: Some(Vec::new()),
                ..Capabilities::default()
            }),
        )
        .target(Target::new("native", native.clone()))
        .build();
    let (status, run, _) = collect(failover.clone().oneshot(streaming(web())).await.unwrap()).await;
    assert_eq!(status, 200);
    assert_eq!(
        (chat.calls(), no_hosting.calls(), native.calls()),
        (0, 0, 1)
    );
    assert_eq!(run.attempts()[0].target.as_ref(), "native");

    let only_chat = Failover::builder()
        .dialect(OpenAiResponses)
        .target(Target::new("chat", chat.clone()).dialect(OpenAiChat))
        .target(Target::new("vllm", no_hosting).capabilities(Capabilities {
            hosted_tools: Some(vec!["file_search".to_owned()]),
            ..Capabilities::default()
        }))
        .build();
    let (status, _, body) = collect(only_chat.oneshot(streaming(web())).await.unwrap()).await;
    assert_eq!(status, 400);
    assert!(
        body.contains("chat (openai-chat) cannot run the provider-hosted tool web_search"),
        "{body}"
    );
    assert!(
        body.contains("vllm lacks the hosted tool web_search"),
        "{body}"
    );
    assert_eq!(chat.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_whole_response_is_validated_before_release() {
    let failed = json!({"id": "resp_p", "object": "response", "status": "failed", "output": [],
        "error": {"code": "server_error", "message": "boom"}});
    let ok = json!({"id": "resp_b", "object": "response", "status": "completed", "model": "gpt-5",
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Hi", "annotations": []}]}],
        "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}});
    let primary = FakeProvider::new("primary").always(Reply::Json {
        status: 200,
        headers: Vec::new(),
        body: Bytes::from(failed.to_string()),
    });
    let backup = FakeProvider::new("backup").always(Reply::Json {
        status: 200,
        headers: Vec::new(),
        body: Bytes::from(ok.to_string()),
    });
    let failover = responses_failover(vec![
        Target::new("primary", primary.clone()),
        Target::new("backup", backup),
    ]);
    let (status, run, body) = collect(
        failover
            .oneshot(request(json!({"model": "gpt-5", "input": "hi"})))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), ok);
    let attempts = run.attempts();
    assert_eq!(attempts[0].class.map(|c| c.as_str()), Some("server_error"));
    assert_eq!(attempts[1].response_id.as_deref(), Some("resp_b"));
    assert_eq!(attempts[1].finish_reason.as_deref(), Some("completed"));
}

#[tokio::test(start_paused = true)]
async fn hosted_tools_and_provider_held_state_are_never_hedged() {
    use tower_llm_failover::failover::Hedge;
    let slow = |id: &str| {
        Reply::Delayed(
            std::time::Duration::from_secs(3),
            Box::new(stream(TEXT, id)),
        )
    };
    let primary = FakeProvider::new("primary").always(slow("resp_primary"));
    let backup = FakeProvider::new("backup").always(stream(TEXT, "resp_backup"));
    let failover = Failover::builder()
        .dialect(OpenAiResponses)
        .target(Target::new("primary", primary.clone()).provider("openai"))
        .target(Target::new("backup", backup.clone()).provider("openai"))
        .hedge(Hedge::after(std::time::Duration::from_millis(200)).with_budget_percent(100.0))
        .build();
    for extra in [
        json!({"tools": [{"type": "web_search"}]}),
        json!({"previous_response_id": "resp_earlier"}),
    ] {
        let (status, run, body) = collect(
            failover
                .clone()
                .oneshot(streaming(extra.clone()))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 200, "{extra}: {body}");
        assert!(body.contains("resp_primary"), "{extra}");
        assert_eq!(run.attempts().len(), 1, "{extra}");
    }
    assert_eq!(backup.calls(), 0);
    // A turn with neither is hedged.
    let (_, run, body) = collect(failover.oneshot(streaming(json!({}))).await.unwrap()).await;
    assert!(body.contains("resp_backup"), "{body}");
    assert!(run.attempts().iter().any(|a| a.hedged));
}
