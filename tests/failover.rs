//! The failover loop with scripted fake providers (no network): what the
//! client receives, how many attempts each upstream saw, and the records.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_llm_failover::Decision;
use tower_llm_failover::dialect::{AnthropicMessages, Requirements};
use tower_llm_failover::failover::Caps;
use tower_llm_failover::health::MemoryHealthStore;
use tower_llm_failover::observe::TurnRecord;
use tower_llm_failover::{
    Cost, budget::Pricing, budget::RetryBudget, budget::RetryBudgetConfig, budget::TurnLimits,
};
use tower_llm_failover::{FailureClass, Phase};
use tower_llm_failover::{
    failover::Capabilities, failover::Failover, failover::FailoverBuilder, failover::Strategy,
    failover::Target, failover::Timeouts, health::Availability, health::CooldownPolicy,
    health::HealthKey, stream::CommitWindow,
};
use tower_llm_testing::chunks;
use tower_llm_testing::{FakeProvider, Reply, Step};

const OPENAI_429: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-x on requests per min.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
const ANTHROPIC_429: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#;
const QUOTA_429: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
const BAD_KEY_401: &str = r#"{"error":{"message":"Incorrect API key provided: sk-abc...xyz","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;
const NO_MODEL_404: &str = r#"{"error":{"message":"The model `gpt-x` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;
const INVALID_400: &str = r#"{"error":{"message":"Invalid value for 'temperature': must be between 0 and 2.","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}"#;
const FILTER_400: &str = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#;
const CONTEXT_400: &str = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
const SERVER_500: &str = r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#;

struct Reply_ {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
    run: TurnRecord,
}

fn request(stream: bool, extra: serde_json::Value) -> Request<Full<Bytes>> {
    let mut body = serde_json::json!({
        "model": "gpt-x",
        "stream": stream,
        "messages": [{"role": "user", "content": "Tell me about caching."}],
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            body.insert(k.clone(), v.clone());
        }
    }
    Request::post("/v1/chat/completions")
        .header("authorization", "Bearer client-secret-key")
        .header("x-api-key", "client-other-key")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

async fn send(failover: &Failover<FakeProvider>, request: Request<Full<Bytes>>) -> Reply_ {
    let response = failover.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply_ {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
        run,
    }
}

fn two(primary: &FakeProvider, backup: &FakeProvider) -> FailoverBuilder<FakeProvider> {
    Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()))
}

/// The availability of `provider`'s upstream `model` (every target of the
/// provider sending that model shares its health key).
fn availability(failover: &Failover<FakeProvider>, provider: &str, model: &str) -> Availability {
    failover
        .health()
        .availability(&HealthKey::model(provider, model))
}

fn sse_events(body: &str) -> Vec<&str> {
    body.split_terminator("\n\n").collect()
}

#[tokio::test(start_paused = true)]
async fn rate_limit_status_before_output_is_rerouted_invisibly() {
    // A Retry-After beyond any wait we honour: reroute at once.
    let primary = FakeProvider::new("primary")
        .always(Reply::status(429, OPENAI_429).header("retry-after", "600"));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert!(reply.body.contains("backup-0 "));
    assert!(
        !reply.body.contains("primary"),
        "nothing of the failed attempt"
    );
    assert!(
        reply.body.starts_with("data: {"),
        "the backup's bytes from its first byte"
    );
    assert_eq!(primary.calls(), 1);
    assert_eq!(backup.calls(), 1);
    assert_eq!(reply.headers["x-failover-attempts"], "2");
    assert_eq!(reply.headers["x-failover-target"], "backup");
    let attempts = reply.run.attempts();
    assert_eq!(attempts[0].class, Some(FailureClass::RateLimited));
    assert_eq!(attempts[0].phase, Some(Phase::Head));
    assert_eq!(attempts[0].bytes_flushed, 0);
    assert_eq!(attempts[0].decision, Decision::Reroute);
    assert_eq!(attempts[1].decision, Decision::Committed);
}

#[tokio::test(start_paused = true)]
async fn in_band_rate_limit_after_the_role_chunk_is_rerouted_invisibly() {
    let primary = FakeProvider::new("primary").always(Reply::Stream(vec![
        Step::Data(chunks::role("primary")),
        Step::Data(chunks::keep_alive()),
        Step::Data(chunks::rate_limit_error()),
    ]));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup)
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert!(
        !reply.body.contains("primary"),
        "not even its role chunk: {}",
        reply.body
    );
    assert!(!reply.body.contains("keep-alive"));
    assert_eq!(reply.body.matches("backup-").count(), 8);
    let attempts = reply.run.attempts();
    assert_eq!(attempts[0].phase, Some(Phase::Preamble));
    assert_eq!(attempts[0].bytes_flushed, 0);
}

#[tokio::test(start_paused = true)]
async fn forty_tokens_then_in_band_429_ends_with_a_terminal_chunk_and_never_calls_the_backup() {
    let primary = FakeProvider::new("primary").always(Reply::tokens_then(
        "primary",
        40,
        vec![Step::Data(chunks::rate_limit_error())],
    ));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(backup.calls(), 0, "never splice a second voice");
    let events = sse_events(&reply.body);
    assert_eq!(
        events.len(),
        1 + 40 + 2,
        "role, 40 tokens, terminal, [DONE]"
    );
    assert_eq!(reply.body.matches("primary-").count(), 40);
    let terminal: serde_json::Value =
        serde_json::from_str(events[41].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(terminal["choices"][0]["finish_reason"], "error");
    assert_eq!(terminal["error"]["code"], "rate_limit_exceeded");
    assert_eq!(events[42], "data: [DONE]");

    let sent: usize = events[..41].iter().map(|e| e.len() + 2).sum();
    assert!(reply.run.is_done());
    let attempts = reply.run.attempts();
    assert_eq!(attempts.len(), 1);
    let record = &attempts[0];
    assert_eq!(record.decision, Decision::Committed);
    assert_eq!(record.output_events, 40);
    assert_eq!(record.class, Some(FailureClass::RateLimited));
    assert_eq!(record.phase, Some(Phase::Committed));
    // The bytes of the provider's answer the client got before the failure
    // (the terminal chunk the gateway added is not the provider's).
    assert_eq!(record.bytes_flushed, sent as u64);
}

#[tokio::test(start_paused = true)]
async fn retry_after_two_seconds_is_honoured_on_the_same_target() {
    let primary = FakeProvider::new("primary")
        .then(Reply::status(429, ANTHROPIC_429).header("retry-after", "2"));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(primary.calls(), 2);
    assert_eq!(backup.calls(), 0);
    let seen = primary.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::from_secs(2));
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(reply.run.attempts()[0].decision, Decision::RetrySame);
    assert_eq!(
        reply.run.attempts()[0].retry_wait,
        Some(Duration::from_secs(2))
    );
}

#[tokio::test(start_paused = true)]
async fn a_long_retry_after_reroutes_when_a_backup_is_left_but_is_waited_out_alone() {
    // 30 s is within the deadline and the backoff's maximum, but longer
    // than the same-target wait (5 s by default): the backup answers now.
    let primary = FakeProvider::new("primary")
        .then(Reply::status(429, ANTHROPIC_429).header("retry-after", "30"));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert!(started.elapsed() < Duration::from_millis(10), "no wait");
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
    assert_eq!(reply.run.attempts()[0].decision, Decision::Reroute);

    // Raised above the hint: the same target is retried after 30 s.
    let primary = FakeProvider::new("primary")
        .then(Reply::status(429, ANTHROPIC_429).header("retry-after", "30"));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup)
        .caps(|c| Caps {
            same_target_wait: Duration::from_secs(60),
            ..c
        })
        .build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert!(started.elapsed() >= Duration::from_secs(30));
    assert_eq!((primary.calls(), backup.calls()), (2, 0));
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_finds_its_target_resting_is_recorded_as_a_reroute() {
    // Turn A backs off to retry the primary after a 500; meanwhile turn
    // B's 429 rests the primary for a minute, so A's next attempt goes to
    // the backup: A's first record says what was done (reroute), not what
    // was planned (retry the same target).
    let primary = FakeProvider::new("primary")
        .then(Reply::status(500, SERVER_500))
        .then(Reply::status(429, ANTHROPIC_429).header("retry-after", "60"));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).build();
    let turn_a = {
        let failover = failover.clone();
        tokio::spawn(async move { send(&failover, request(true, serde_json::json!({}))).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(primary.calls(), 1, "A's first attempt came first");
    let reply_b = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply_b.status, 200);
    let reply_a = turn_a.await.unwrap();
    assert_eq!(reply_a.status, 200);
    assert_eq!(primary.calls(), 2, "A's retry never reached the primary");
    let attempts = reply_a.run.attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(&*attempts[0].target, "primary");
    assert_eq!(&*attempts[1].target, "backup");
    assert_eq!(attempts[0].decision, Decision::Reroute);
}

#[tokio::test(start_paused = true)]
async fn retry_after_longer_than_the_time_left_reroutes_or_stops_at_once() {
    let limits = TurnLimits {
        deadline: Duration::from_secs(5),
        ..TurnLimits::new()
    };
    let primary = FakeProvider::new("primary")
        .always(Reply::status(429, ANTHROPIC_429).header("retry-after", "10"));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).limits(limits.clone()).build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert!(started.elapsed() < Duration::from_millis(10), "no sleep");
    assert_eq!(backup.calls(), 1);

    // Alone: stop at once with the original reason.
    let primary = FakeProvider::new("primary")
        .always(Reply::status(429, ANTHROPIC_429).header("retry-after", "10"));
    let alone = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .limits(limits)
        .build();
    let started = Instant::now();
    let reply = send(&alone, request(true, serde_json::json!({}))).await;
    assert!(started.elapsed() < Duration::from_millis(10), "no sleep");
    assert_eq!(reply.status, 429);
    assert_eq!(reply.headers["retry-after"], "10");
    assert!(
        reply.body.contains("rate_limited from primary"),
        "{}",
        reply.body
    );
    assert!(reply.body.contains("after 1 attempt"), "{}", reply.body);
    assert_eq!(primary.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn persistent_429_without_retry_after_backs_off_with_growing_gaps_then_reroutes() {
    let primary = FakeProvider::new("primary").always(Reply::status(429, ANTHROPIC_429));
    let backup = FakeProvider::new("backup");
    // Hintless 429s: three inside the window cool the target down, which
    // the third one (the last retry) does.
    let failover = two(&primary, &backup).build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(primary.calls(), 3, "one attempt and two retries");
    assert_eq!(backup.calls(), 1);
    let seen = primary.seen();
    let first_gap = seen[1].at - seen[0].at;
    let second_gap = seen[2].at - seen[1].at;
    assert!(first_gap >= Duration::from_millis(375) && first_gap <= Duration::from_millis(500));
    assert!(second_gap >= Duration::from_millis(750) && second_gap <= Duration::from_secs(1));
    assert!(second_gap > first_gap, "growing gaps");
}

#[tokio::test(start_paused = true)]
async fn auth_and_an_operator_models_not_found_reroute_and_cool_the_primary_down() {
    for (status, body) in [(401, BAD_KEY_401), (404, NO_MODEL_404)] {
        let primary = FakeProvider::new("primary").always(Reply::status(status, body));
        let backup = FakeProvider::new("backup");
        // The primary's model is the operator's: its 404 is a configuration
        // fault of that (provider, model), not the client's error.
        let failover = Failover::builder()
            .target(Target::new("primary", primary.clone()).model("configured-model"))
            .target(Target::new("backup", backup.clone()))
            .build();
        let reply = send(&failover, request(true, serde_json::json!({}))).await;
        assert_eq!(reply.status, 200, "{status}");
        assert_eq!(primary.calls(), 1, "never retried on the same target");
        assert!(matches!(
            availability(&failover, "primary", "configured-model"),
            Availability::Cooling(_)
        ));
        // The next turn does not touch the cooled-down primary.
        let reply = send(&failover, request(true, serde_json::json!({}))).await;
        assert_eq!(reply.headers["x-failover-attempts"], "1");
        assert_eq!(primary.calls(), 1);
        assert_eq!(backup.calls(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn invalid_request_and_content_filter_return_to_the_client_without_a_second_attempt() {
    for (body, code) in [
        (INVALID_400, "invalid_value"),
        (FILTER_400, "content_filter"),
    ] {
        let primary = FakeProvider::new("primary").always(Reply::status(400, body));
        let backup = FakeProvider::new("backup");
        let failover = two(&primary, &backup).build();
        let reply = send(&failover, request(true, serde_json::json!({}))).await;
        assert_eq!(reply.status, 400);
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(json["error"]["code"], code);
        let provider_message: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            json["error"]["message"],
            provider_message["error"]["message"]
        );
        assert_eq!((primary.calls(), backup.calls()), (1, 0));
        assert_eq!(reply.run.attempts()[0].decision, Decision::Stop);
    }
}

#[tokio::test(start_paused = true)]
async fn context_length_reroutes_only_to_a_larger_window() {
    let primary = FakeProvider::new("primary").always(Reply::status(400, CONTEXT_400));
    let small = FakeProvider::new("small");
    let large = FakeProvider::new("large");
    let failover = Failover::builder()
        .target(
            Target::new("primary", primary.clone()).capabilities(Capabilities {
                context_window: Some(8_192),
                ..Capabilities::default()
            }),
        )
        .target(
            Target::new("small", small.clone()).capabilities(Capabilities {
                context_window: Some(4_096),
                ..Capabilities::default()
            }),
        )
        .target(
            Target::new("large", large.clone()).capabilities(Capabilities {
                context_window: Some(128_000),
                ..Capabilities::default()
            }),
        )
        .build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!((primary.calls(), small.calls(), large.calls()), (1, 0, 1));

    // No larger window anywhere: an explicit stop with the provider's error.
    let primary = FakeProvider::new("primary").always(Reply::status(400, CONTEXT_400));
    let small = FakeProvider::new("small");
    let failover = Failover::builder()
        .target(
            Target::new("primary", primary.clone()).capabilities(Capabilities {
                context_window: Some(8_192),
                ..Capabilities::default()
            }),
        )
        .target(
            Target::new("small", small.clone()).capabilities(Capabilities {
                context_window: Some(4_096),
                ..Capabilities::default()
            }),
        )
        .build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 400);
    assert_eq!(small.calls(), 0);
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(json["error"]["code"], "context_length_exceeded");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no target with a larger context window")
    );
}

#[tokio::test(start_paused = true)]
async fn targets_without_the_tools_a_request_needs_are_never_tried() {
    let tools = serde_json::json!({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]});
    let primary = FakeProvider::new("primary");
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(
            Target::new("primary", primary.clone()).capabilities(Capabilities {
                tools: false,
                ..Capabilities::default()
            }),
        )
        .target(Target::new("backup", backup.clone()))
        .build();
    let reply = send(&failover, request(true, tools.clone())).await;
    assert_eq!(reply.status, 200);
    assert_eq!((primary.calls(), backup.calls()), (0, 1));

    let failover = Failover::builder()
        .target(
            Target::new("primary", primary.clone()).capabilities(Capabilities {
                tools: false,
                ..Capabilities::default()
            }),
        )
        .target(
            Target::new("backup", backup.clone()).capabilities(Capabilities {
                tools: false,
                ..Capabilities::default()
            }),
        )
        .build();
    let reply = send(&failover, request(true, tools)).await;
    assert_eq!(reply.status, 400);
    assert!(reply.body.contains("no_compatible_target"));
    assert!(reply.body.contains("primary lacks tools"), "{}", reply.body);
    assert!(reply.body.contains("backup lacks tools"), "{}", reply.body);
    assert_eq!((primary.calls(), backup.calls()), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn parallel_tool_calls_rule_out_a_target_only_when_the_request_asks_for_them() {
    let tools = serde_json::json!({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]});
    let primary = FakeProvider::new("primary");
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(
            Target::new("primary", primary.clone()).capabilities(Capabilities {
                parallel_tool_calls: false,
                ..Capabilities::default()
            }),
        )
        .target(Target::new("backup", backup.clone()))
        .build();
    // Tools, one call at a time: the primary serves.
    let reply = send(&failover, request(true, tools.clone())).await;
    assert_eq!(reply.headers["x-failover-target"], "primary");
    // Parallel calls asked for: only the backup can serve.
    let mut parallel = tools;
    parallel["parallel_tool_calls"] = serde_json::json!(true);
    let reply = send(&failover, request(true, parallel)).await;
    assert_eq!(reply.headers["x-failover-target"], "backup");
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
}

#[test]
fn a_target_declared_without_reasoning_lacks_it_only_for_a_reasoning_request() {
    let thinking = Requirements {
        reasoning: true,
        ..Requirements::new("m")
    };
    let plain = Capabilities {
        reasoning: false,
        ..Capabilities::default()
    };
    assert_eq!(plain.missing(&thinking), ["reasoning"]);
    assert!(plain.missing(&Requirements::new("m")).is_empty());
    // Declared back on, it serves reasoning requests again.
    let declared = Capabilities {
        reasoning: true,
        ..plain
    };
    assert!(declared.missing(&thinking).is_empty());
}

/// A text-only target lacks image and document input only for requests
/// that carry them (rule 5: only compatible backups, and every other
/// backup stays eligible).
#[test]
fn a_text_only_target_lacks_inputs_only_for_requests_that_carry_them() {
    let text_only = Capabilities {
        image_input: false,
        document_input: false,
        ..Capabilities::default()
    };
    assert!(text_only.missing(&Requirements::new("m")).is_empty());
    assert_eq!(
        text_only.missing(&Requirements {
            image_input: true,
            ..Requirements::new("m")
        }),
        ["image input"]
    );
    assert_eq!(
        text_only.missing(&Requirements {
            document_input: true,
            ..Requirements::new("m")
        }),
        ["document input"]
    );
    assert!(
        Capabilities::default()
            .missing(&Requirements {
                image_input: true,
                document_input: true,
                ..Requirements::new("m")
            })
            .is_empty()
    );
}

#[test]
fn targets_are_found_by_name() {
    let failover = two(&FakeProvider::new("primary"), &FakeProvider::new("backup")).build();
    assert_eq!(failover.target_index("primary"), Some(0));
    assert_eq!(failover.target_index("backup"), Some(1));
    assert_eq!(failover.target_index("elsewhere"), None);
}

#[tokio::test(start_paused = true)]
async fn primary_failure_with_an_incompatible_backup_stops_explicitly() {
    let tools = serde_json::json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]});
    let primary = FakeProvider::new("primary").always(Reply::status(401, BAD_KEY_401));
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(
            Target::new("backup", backup.clone()).capabilities(Capabilities {
                tools: false,
                ..Capabilities::default()
            }),
        )
        .build();
    let reply = send(&failover, request(true, tools)).await;
    assert_eq!(reply.status, 502);
    assert!(
        reply
            .body
            .contains("no compatible backup: backup lacks tools"),
        "{}",
        reply.body
    );
    assert_eq!(backup.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_silent_primary_is_rerouted_at_its_head_timeout_and_not_retried() {
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup)
        .timeouts(|t| Timeouts {
            head: Some(Duration::from_secs(2)),
            ..t
        })
        .build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
    let attempts = reply.run.attempts();
    assert_eq!(attempts[0].class, Some(FailureClass::Timeout));
    assert_eq!(attempts[0].phase, Some(Phase::Head));
    assert_eq!(attempts[0].decision, Decision::Reroute);
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_token_is_rerouted_within_the_first_output_timeout() {
    let primary = FakeProvider::new("primary").always(Reply::Stream(vec![
        Step::Data(chunks::role("primary")),
        Step::Wait(Duration::from_secs(60)),
        Step::Data(chunks::content("primary", "late")),
    ]));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup)
        .timeouts(|t| Timeouts {
            first_output: Duration::from_secs(3),
            ..t
        })
        .build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert!(!reply.body.contains("primary"));
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn the_turn_never_exceeds_its_deadline() {
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let backup = FakeProvider::new("backup").always(Reply::Silent);
    let failover = two(&primary, &backup)
        .timeouts(|t| Timeouts {
            head: Some(Duration::from_secs(30)),
            ..t
        })
        .limits(TurnLimits {
            deadline: Duration::from_secs(5),
            ..TurnLimits::new()
        })
        .build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert!(started.elapsed() <= Duration::from_secs(5));
    assert_eq!(reply.status, 504);
    assert!(
        reply.body.contains("timeout from primary"),
        "{}",
        reply.body
    );
}

#[tokio::test(start_paused = true)]
async fn a_spent_ceiling_stops_the_turn_before_another_attempt() {
    // Each attempt that reaches the stream is charged (estimated) at a
    // price that makes the first one use the ceiling up.
    let price = Pricing::per_million_usd(100_000.0, 100_000.0);
    let primary = FakeProvider::new("primary").always(Reply::tokens_then(
        "primary",
        0,
        vec![Step::Data(chunks::rate_limit_error())],
    ));
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()).pricing(price))
        .target(Target::new("backup", backup.clone()).pricing(price))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .default_output_tokens(0)
        .limits(TurnLimits {
            spend_ceiling: Some(Cost::from_usd(1.0)),
            ..TurnLimits::new()
        })
        .build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 402);
    assert!(
        reply.body.contains("spend_ceiling_reached"),
        "{}",
        reply.body
    );
    assert!(reply.body.contains("spend ceiling"), "{}", reply.body);
    assert_eq!((primary.calls(), backup.calls()), (1, 0));
    assert!(reply.run.attempts()[0].estimated);
}

#[tokio::test(start_paused = true)]
async fn a_primary_that_recovers_gets_traffic_back_after_a_probe() {
    let primary = FakeProvider::new("primary").always(Reply::Refused);
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup)
        .health(Arc::new(MemoryHealthStore::new(CooldownPolicy {
            base: Duration::from_secs(5),
            ..CooldownPolicy::default()
        })))
        .build();
    let mut winners = Vec::new();
    for turn in 0..20 {
        if turn == 10 {
            primary.set_always(Reply::stream("primary", 8));
            tokio::time::sleep(Duration::from_secs(6)).await;
        }
        let reply = send(&failover, request(true, serde_json::json!({}))).await;
        assert_eq!(reply.status, 200);
        winners.push(
            reply.headers["x-failover-target"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        if turn == 9 {
            assert_eq!(
                primary.calls(),
                3,
                "cooled down after three refusals inside the window, then skipped"
            );
        }
    }
    assert!(winners[..10].iter().all(|w| w == "backup"), "{winners:?}");
    assert!(winners[10..].iter().all(|w| w == "primary"), "{winners:?}");
    assert_eq!(
        availability(&failover, "primary", "gpt-x"),
        Availability::Healthy
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_turns_against_a_failing_primary_stay_within_the_retry_budget() {
    let retry_budget = RetryBudget::new(RetryBudgetConfig {
        ttl: Duration::from_secs(10),
        min_per_sec: 0,
        retry_percent: 0.2,
    })
    .unwrap();
    let primary = FakeProvider::new("primary").always(Reply::status(500, SERVER_500));
    let backup = FakeProvider::new("backup").always(Reply::status(500, SERVER_500));
    // Cooldowns would also stop the storm; switch them off to see the
    // retry budget alone hold it.
    let failover = two(&primary, &backup)
        .limits(TurnLimits {
            retry_budget: Some(retry_budget),
            ..TurnLimits::new()
        })
        .health(Arc::new(MemoryHealthStore::new(CooldownPolicy {
            failure_threshold: u32::MAX,
            ..CooldownPolicy::default()
        })))
        .build();
    let turns: Vec<_> = (0..100)
        .map(|_| {
            let failover = failover.clone();
            tokio::spawn(
                async move { send(&failover, request(false, serde_json::json!({}))).await },
            )
        })
        .collect();
    let mut statuses = Vec::new();
    for turn in turns {
        let reply = turn.await.unwrap();
        // A turn the retry budget stopped says so (503), not a generic 502.
        if reply.status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(
                reply.body.contains("retry_budget_exhausted"),
                "{}",
                reply.body
            );
        }
        statuses.push(reply.status);
    }
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::BAD_GATEWAY || *s == StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert!(refused >= 80, "{refused} turns refused by the retry budget");
    let upstream_attempts = primary.calls() + backup.calls();
    // 100 first attempts, and extra attempts capped at 20 % of them.
    assert!(upstream_attempts >= 100);
    assert!(upstream_attempts <= 120, "{upstream_attempts} attempts");
}

#[tokio::test(start_paused = true)]
async fn cheapest_healthy_picks_by_price_and_skips_cooled_down_targets() {
    let dear = FakeProvider::new("dear");
    let cheap = FakeProvider::new("cheap").then(Reply::status(401, BAD_KEY_401));
    let middle = FakeProvider::new("middle");
    let failover = Failover::builder()
        .target(Target::new("dear", dear.clone()).pricing(Pricing::per_million_usd(10.0, 30.0)))
        .target(Target::new("cheap", cheap.clone()).pricing(Pricing::per_million_usd(0.1, 0.4)))
        .target(Target::new("middle", middle.clone()).pricing(Pricing::per_million_usd(1.0, 2.0)))
        .strategy(Strategy::CheapestHealthy)
        .build();
    // The cheapest fails with a bad key: rerouted to the next cheapest.
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.headers["x-failover-target"], "middle");
    assert_eq!((cheap.calls(), middle.calls(), dear.calls()), (1, 1, 0));
    // While it cools down it is skipped entirely.
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.headers["x-failover-target"], "middle");
    assert_eq!(reply.headers["x-failover-attempts"], "1");
    assert_eq!(cheap.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cut_inside_the_commit_window_is_rerouted_invisibly() {
    let primary = FakeProvider::new("primary").always(Reply::tokens_then(
        "primary",
        40,
        vec![Step::Error("connection reset".into())],
    ));
    let backup = FakeProvider::new("backup").always(Reply::stream("backup", 100));
    let failover = two(&primary, &backup)
        .commit_window(CommitWindow {
            output_events: Some(64),
            ..CommitWindow::default()
        })
        .build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert!(!reply.body.contains("primary"), "only the backup's answer");
    assert_eq!(reply.body.matches("backup-").count(), 100);
    assert!(reply.body.ends_with("data: [DONE]\n\n"));
    assert!(!reply.body.contains("\"error\""));
    assert_eq!(reply.run.attempts()[0].output_events, 40);
    assert_eq!(reply.run.attempts()[0].bytes_flushed, 0);
}

#[tokio::test(start_paused = true)]
async fn a_cut_after_the_commit_window_ends_with_a_terminal_chunk() {
    let primary = FakeProvider::new("primary").always(Reply::tokens_then(
        "primary",
        80,
        vec![Step::Error("connection reset".into())],
    ));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup)
        .commit_window(CommitWindow {
            output_events: Some(64),
            ..CommitWindow::default()
        })
        .build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.body.matches("primary-").count(), 80);
    assert_eq!(backup.calls(), 0);
    let events = sse_events(&reply.body);
    assert!(events[events.len() - 2].contains("\"finish_reason\":\"error\""));
    assert_eq!(events[events.len() - 1], "data: [DONE]");
}

#[tokio::test(start_paused = true)]
async fn upstream_requests_carry_the_targets_model_usage_on_and_no_client_credentials() {
    let primary = FakeProvider::new("primary").always(Reply::Stream(
        [
            chunks::role("up-model"),
            chunks::content("up-model", "hi"),
            chunks::finish("up-model", "stop"),
            chunks::usage("up-model", 12, 1),
            chunks::done(),
        ]
        .into_iter()
        .map(Step::Data)
        .collect(),
    ));
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(
            Target::new("primary", primary.clone())
                .model("up-model")
                .pricing(Pricing::per_million_usd(1.0, 2.0)),
        )
        .target(Target::new("backup", backup))
        .build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    let seen = &primary.seen()[0];
    assert_eq!(seen.body["model"], "up-model");
    assert_eq!(seen.body["stream_options"]["include_usage"], true);
    assert!(seen.headers.get("authorization").is_none());
    assert!(seen.headers.get("x-api-key").is_none());
    // The client did not ask for usage: the usage chunk is removed again.
    assert!(!reply.body.contains("\"usage\""), "{}", reply.body);
    assert!(
        reply.body.contains("\"model\":\"up-model\""),
        "the answering model's own name"
    );
    assert!(reply.body.ends_with("data: [DONE]\n\n"));
    // And counted: the record has the reported usage and its cost.
    let record = &reply.run.attempts()[0];
    assert_eq!(record.usage.unwrap().input_tokens, 12);
    assert!(!record.estimated);
    assert_eq!(
        record.cost,
        Some(Pricing::per_million_usd(1.0, 2.0).cost(12, 1))
    );

    // A client that asked for usage keeps it.
    let reply = send(
        &failover,
        request(
            true,
            serde_json::json!({"stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert!(reply.body.contains("\"usage\""));
}

#[tokio::test(start_paused = true)]
async fn non_streaming_invalid_answers_are_rerouted() {
    for bad in [
        Reply::status(200, r#"{"id":"x","choices":[{"message":{"content":"cut"#),
        Reply::status(
            200,
            r#"[{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}]"#,
        ),
        Reply::status(200, r#"{"id":"x","object":"chat.completion"}"#),
    ] {
        let primary = FakeProvider::new("primary").always(bad);
        let backup = FakeProvider::new("backup");
        let failover = two(&primary, &backup)
            .caps(|c| Caps {
                retries_per_target: 0,
                ..c
            })
            .build();
        let reply = send(&failover, request(false, serde_json::json!({}))).await;
        assert_eq!(reply.status, 200);
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(json["model"], "backup");
        assert_eq!(backup.calls(), 1);
        assert_eq!(
            reply.headers["content-length"],
            reply.body.len().to_string()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn when_every_option_is_spent_the_error_names_the_first_cause_and_the_attempts() {
    let primary = FakeProvider::new("primary").always(Reply::status(429, QUOTA_429));
    let backup = FakeProvider::new("backup").always(Reply::status(500, SERVER_500));
    let failover = two(&primary, &backup).build();
    let reply = send(&failover, request(false, serde_json::json!({}))).await;
    assert_eq!(reply.status, 429, "the first failure's status");
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    let message = json["error"]["message"].as_str().unwrap();
    // The primary is rerouted at once; the backup is retried twice, and its
    // third 500 inside the window cools it down, which ends the turn.
    assert!(message.contains("after 4 attempts"), "{message}");
    assert!(
        message.contains("quota_exhausted from primary"),
        "{message}"
    );
    assert_eq!(json["error"]["code"], "insufficient_quota");
    assert_eq!(reply.headers["x-failover-attempts"], "4");
    assert_eq!((primary.calls(), backup.calls()), (1, 3));
}

#[tokio::test(start_paused = true)]
async fn bad_request_bodies_never_reach_an_upstream() {
    let primary = FakeProvider::new("primary");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .caps(|c| Caps {
            request_bytes: 1024,
            ..c
        })
        .build();
    for (body, status, code) in [
        ("not json".to_owned(), 400, "invalid_json"),
        (r#"{"model":"m"}"#.to_owned(), 400, "invalid_request"),
        (
            format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
                "a".repeat(2000)
            ),
            413,
            "request_too_large",
        ),
    ] {
        let request = Request::post("/v1/chat/completions")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let reply = send(&failover, request).await;
        assert_eq!(reply.status, status);
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(json["error"]["code"], code);
    }
    assert_eq!(primary.calls(), 0);
}

/// `"stream": "true"` is a stream to a provider that coerces it and a whole
/// answer to a strict reader: such fields are refused before any upstream
/// sees them, in the client's dialect, naming the field.
#[tokio::test(start_paused = true)]
async fn fields_a_provider_would_coerce_are_refused_in_the_clients_dialect() {
    let chat = FakeProvider::new("chat");
    let chat_failover = Failover::builder()
        .target(Target::new("chat", chat.clone()))
        .build();
    let messages = FakeProvider::new("messages");
    let messages_failover = Failover::builder()
        .dialect(AnthropicMessages)
        .target(Target::new("messages", messages.clone()))
        .build();
    let chat_cases = [
        (r#""stream":"true""#, "stream"),
        (r#""stream":1"#, "stream"),
        (
            r#""stream":true,"stream_options":{"include_usage":1}"#,
            "stream_options.include_usage",
        ),
        (r#""n":"2""#, "n"),
        (r#""n":0"#, "n"),
        (r#""max_tokens":10.0"#, "max_tokens"),
        (r#""max_completion_tokens":-1"#, "max_completion_tokens"),
    ];
    for (extra, field) in chat_cases {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],{extra}}}"#);
        let request = Request::post("/v1/chat/completions")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let reply = send(&chat_failover, request).await;
        assert_eq!(reply.status, 400, "{extra}");
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
        assert_eq!(json["error"]["code"], "invalid_type", "{json}");
        assert_eq!(json["error"]["param"], field, "{json}");
        assert!(
            json["error"]["message"].as_str().unwrap().contains(field),
            "{json}"
        );
    }
    let messages_cases = [
        (r#""stream":"true""#, "stream"),
        (r#""stream":1"#, "stream"),
        (r#""max_tokens":"5""#, "max_tokens"),
        (r#""model":7"#, "model"),
    ];
    for (extra, field) in messages_cases {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],{extra}}}"#);
        // Every case names a model and `max_tokens` unless it is the field at fault.
        let body = match field {
            "model" => body.replacen('{', r#"{"max_tokens":5,"#, 1),
            "max_tokens" => body.replacen('{', r#"{"model":"m","#, 1),
            _ => body.replacen('{', r#"{"model":"m","max_tokens":5,"#, 1),
        };
        let request = Request::post("/v1/messages")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = messages_failover.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), 400, "{extra}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        // Anthropic's shape: a top-level `type: error`.
        assert_eq!(json["type"], "error", "{json}");
        assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
        assert_eq!(json["error"]["code"], "invalid_type", "{json}");
        assert!(
            json["error"]["message"].as_str().unwrap().contains(field),
            "{json}"
        );
    }
    assert_eq!((chat.calls(), messages.calls()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_bad_request_body_is_answered_with_its_own_error_type_in_the_clients_dialect() {
    let primary = FakeProvider::new("primary");
    let failover = Failover::builder()
        .dialect(AnthropicMessages)
        .target(Target::new("primary", primary.clone()))
        .caps(|c| Caps {
            request_bytes: 1024,
            ..c
        })
        .build();
    for (body, status, error_type) in [
        ("not json".to_owned(), 400, "invalid_request_error"),
        ("x".repeat(2000), 413, "request_too_large"),
    ] {
        let request = Request::post("/v1/messages")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = failover.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), status);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"]["type"], error_type, "{json}");
    }
    assert_eq!(primary.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn lowest_latency_measures_unknown_targets_then_prefers_the_fastest() {
    let slow = FakeProvider::new("slow").always(Reply::Stream(vec![
        Step::Data(chunks::role("slow")),
        Step::Wait(Duration::from_millis(800)),
        Step::Data(chunks::content("slow", "a")),
        Step::Data(chunks::finish("slow", "stop")),
        Step::Data(chunks::done()),
    ]));
    let fast = FakeProvider::new("fast");
    let failover = Failover::builder()
        .target(Target::new("slow", slow.clone()))
        .target(Target::new("fast", fast.clone()))
        .strategy(Strategy::LowestLatency)
        .build();
    let mut winners = Vec::new();
    for _ in 0..4 {
        let reply = send(&failover, request(true, serde_json::json!({}))).await;
        winners.push(
            reply.headers["x-failover-target"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    // Unmeasured targets go first (in configured order), then the fastest.
    assert_eq!(winners, ["slow", "fast", "fast", "fast"]);
    assert_eq!((slow.calls(), fast.calls()), (1, 3));
}

#[tokio::test(start_paused = true)]
async fn a_custom_selector_orders_the_candidates() {
    let a = FakeProvider::new("a");
    let b = FakeProvider::new("b");
    let failover = Failover::builder()
        .target(Target::new("a", a.clone()))
        .target(Target::new("b", b.clone()))
        .strategy(Strategy::Custom(std::sync::Arc::new(
            |candidates: &mut [tower_llm_failover::failover::Candidate]| candidates.reverse(),
        )))
        .build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.headers["x-failover-target"], "b");
    assert_eq!((a.calls(), b.calls()), (0, 1));
}

/// A custom selector is given each target's time to first output (the
/// built-in orders that do not read it are not: it is a health store
/// lookup per candidate).
#[tokio::test(start_paused = true)]
async fn a_custom_selector_sees_the_measured_time_to_first_output() {
    let a = FakeProvider::new("a");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = std::sync::Arc::clone(&seen);
    let failover = Failover::builder()
        .target(Target::new("a", a.clone()))
        .strategy(Strategy::Custom(std::sync::Arc::new(
            move |candidates: &mut [tower_llm_failover::failover::Candidate]| {
                let mut seen = record.lock().unwrap();
                seen.extend(candidates.iter().map(|c| c.time_to_first_output.is_some()));
            },
        )))
        .build();
    for _ in 0..2 {
        let reply = send(&failover, request(true, serde_json::json!({}))).await;
        assert_eq!(reply.status, 200);
    }
    // Unmeasured before the first turn; measured by it.
    assert_eq!(*seen.lock().unwrap(), [false, true]);
}

#[tokio::test(start_paused = true)]
async fn when_every_eligible_target_cools_down_and_the_operator_says_refuse_the_turn_is_refused_at_once()
 {
    let a = FakeProvider::new("a").always(Reply::status(401, BAD_KEY_401));
    let failover = Failover::builder()
        .target(Target::new("a", a.clone()))
        .refuse_when_cooling(true)
        .build();
    let first = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(first.status, 502);
    let second = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(second.status, 503);
    assert!(
        second.body.contains("no_available_target"),
        "{}",
        second.body
    );
    assert!(second.body.contains("cooling down: a"), "{}", second.body);
    assert_eq!(a.calls(), 1, "a cooled-down target is not hammered");
}

#[tokio::test(start_paused = true)]
async fn when_every_eligible_target_cools_down_the_probe_that_fails_answers_503() {
    let a = FakeProvider::new("a").always(Reply::status(401, BAD_KEY_401));
    let failover = Failover::builder()
        .target(Target::new("a", a.clone()))
        .build();
    let first = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(first.status, 502);
    // Every target rests, the turn has budget: the soonest is probed.
    let second = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(a.calls(), 2, "one probe, not a retry storm");
    assert_eq!(second.status, 503);
    assert!(
        second.body.contains("no_available_target"),
        "{}",
        second.body
    );
    assert!(
        second.body.contains("the probe of a failed"),
        "{}",
        second.body
    );
    assert!(matches!(
        availability(&failover, "a", "gpt-x"),
        Availability::Cooling(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn when_every_target_is_overloaded_the_turn_answers_503() {
    let overloaded = Reply::status(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    );
    let primary = FakeProvider::new("primary").always(overloaded.clone());
    let backup = FakeProvider::new("backup").always(overloaded);
    let failover = two(&primary, &backup)
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let reply = send(&failover, request(false, serde_json::json!({}))).await;
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(
        reply
            .body
            .contains("after 2 attempts; first failure: overloaded from primary"),
        "{}",
        reply.body
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_after_an_ordinary_attempt_reports_the_options_spent() {
    let primary = FakeProvider::new("primary").always(Reply::status(401, BAD_KEY_401));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup)
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    // The primary's key fails: it rests, the backup serves.
    let first = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(first.headers["x-failover-target"], "backup");
    // Next turn the backup fails and the resting primary is probed: an
    // ordinary attempt was made, so this is not "no target available".
    backup.set_always(Reply::status(500, SERVER_500));
    let second = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!((primary.calls(), backup.calls()), (2, 2));
    assert_eq!(second.status, 502, "{}", second.body);
    assert!(
        second.body.contains(
            "all options spent after 2 attempts; first failure: server_error from backup"
        ),
        "{}",
        second.body
    );
    assert!(
        !second.body.contains("no_available_target"),
        "{}",
        second.body
    );
}

#[tokio::test(start_paused = true)]
async fn hintless_429s_in_a_row_cool_the_target_down_and_reroute() {
    let primary = FakeProvider::new("primary").always(Reply::status(429, ANTHROPIC_429));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!((primary.calls(), backup.calls()), (3, 1));
    let attempts = reply.run.attempts();
    assert!(matches!(attempts[0].decision, Decision::RetrySame));
    assert!(matches!(attempts[1].decision, Decision::RetrySame));
    assert_eq!(
        attempts[2].decision,
        Decision::Reroute,
        "third failure inside the window: cooling"
    );
    assert!(matches!(
        availability(&failover, "primary", "gpt-x"),
        Availability::Cooling(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn overload_reroutes_at_once_instead_of_waiting_on_a_resting_target() {
    let primary = FakeProvider::new("primary").always(Reply::status(
        529,
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    ));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no sleep before the reroute"
    );
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
    assert_eq!(reply.run.attempts()[0].decision, Decision::Reroute);
}

#[tokio::test(start_paused = true)]
async fn a_silent_head_is_bounded_by_the_first_output_timeout_even_without_a_head_timeout() {
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup)
        .timeouts(|t| Timeouts { head: None, ..t })
        .timeouts(|t| Timeouts {
            first_output: Duration::from_secs(3),
            ..t
        })
        .build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_long_non_streaming_answer_is_not_cut_by_the_stream_head_timeout() {
    let primary = FakeProvider::new("primary").always(Reply::Delayed(
        Duration::from_secs(40),
        Box::new(Reply::completion("primary")),
    ));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).build();
    let reply = send(&failover, request(false, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert!(reply.body.contains("answer from primary"));
    assert_eq!(backup.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn failures_after_commit_count_against_the_target_health() {
    let primary = FakeProvider::new("primary").always(Reply::tokens_then(
        "primary",
        1,
        vec![Step::Error("connection reset".into())],
    ));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup).build();
    let mut winners = Vec::new();
    for _ in 0..4 {
        let reply = send(&failover, request(true, serde_json::json!({}))).await;
        winners.push(
            reply.headers["x-failover-target"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    // Three cut streams inside the window cool the primary down: the
    // fourth turn goes to the backup.
    assert_eq!(winners, ["primary", "primary", "primary", "backup"]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_probe_gives_its_slot_back() {
    let primary = FakeProvider::new("primary").always(Reply::status(401, BAD_KEY_401));
    let backup = FakeProvider::new("backup");
    let failover = two(&primary, &backup)
        .health(Arc::new(MemoryHealthStore::new(CooldownPolicy {
            account: Duration::from_secs(10),
            ..CooldownPolicy::default()
        })))
        .build();
    send(&failover, request(true, serde_json::json!({}))).await;
    assert!(matches!(
        availability(&failover, "primary", "gpt-x"),
        Availability::Cooling(_)
    ));
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(
        availability(&failover, "primary", "gpt-x"),
        Availability::Probe
    );
    // The probe goes to a primary that never answers; the client gives up.
    primary.set_always(Reply::Silent);
    let turn = send(&failover, request(true, serde_json::json!({})));
    assert!(
        tokio::time::timeout(Duration::from_secs(1), turn)
            .await
            .is_err()
    );
    // The abandoned probe does not keep the target out.
    assert_eq!(
        availability(&failover, "primary", "gpt-x"),
        Availability::Probe
    );
}

#[tokio::test(start_paused = true)]
async fn hostile_request_fields_are_handled_not_panicked_on() {
    let primary = FakeProvider::new("primary");
    let failover = Failover::builder()
        .target(
            Target::new("primary", primary.clone()).capabilities(Capabilities {
                context_window: Some(8_000),
                ..Capabilities::default()
            }),
        )
        .build();
    // `stream_options` of the wrong type: refused before any upstream (a
    // lenient provider and the gateway could read it differently).
    let reply = send(
        &failover,
        request(true, serde_json::json!({"stream_options": 1})),
    )
    .await;
    assert_eq!(reply.status, 400);
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(json["error"]["code"], "invalid_type");
    assert_eq!(json["error"]["param"], "stream_options");
    assert_eq!(primary.calls(), 0);
    // A max_tokens that would overflow the window check.
    let reply = send(
        &failover,
        request(true, serde_json::json!({"max_tokens": u64::MAX})),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert!(reply.body.contains("context window"), "{}", reply.body);
}

#[tokio::test(start_paused = true)]
async fn the_clients_query_string_never_goes_upstream() {
    let primary = FakeProvider::new("primary");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .build();
    let request = Request::post("/v1/chat/completions?key=client-secret")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    send(&failover, request).await;
    assert_eq!(primary.seen()[0].uri, "/v1/chat/completions");
}

#[tokio::test(start_paused = true)]
async fn headers_named_by_connection_are_hop_by_hop_and_dropped() {
    let primary = FakeProvider::new("primary");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .build();
    let request = Request::post("/v1/chat/completions")
        .header("connection", "x-hop-secret")
        .header("x-hop-secret", "1")
        .header("x-request-id", "kept")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    send(&failover, request).await;
    let seen = &primary.seen()[0].headers;
    assert!(seen.get("x-hop-secret").is_none());
    assert!(seen.get("connection").is_none());
    assert_eq!(seen["x-request-id"], "kept");
}

#[tokio::test(start_paused = true)]
async fn an_event_stream_content_type_is_recognised_in_any_case() {
    let sse: Vec<u8> = chunks::full_stream("primary", 3).concat();
    let primary = FakeProvider::new("primary").always(
        Reply::status(200, std::str::from_utf8(&sse).unwrap())
            .header("content-type", "Text/Event-Stream; charset=utf-8"),
    );
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .build();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body.matches("primary-").count(), 3);
    assert!(reply.body.ends_with("data: [DONE]\n\n"));
    assert_eq!(primary.calls(), 1, "streamed through, not rerouted");
}

#[tokio::test(start_paused = true)]
async fn a_request_a_gateway_already_read_is_not_parsed_again() {
    use tower_llm_failover::dialect::{Dialect, OpenAiChat, ParsedRequest};
    let primary = FakeProvider::new("primary");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .build();
    // What the gateway read, in the extensions; the body it forwards is not
    // read again (here it is not even JSON).
    let (requirements, chat) = OpenAiChat
        .read_request(Bytes::from_static(
            br#"{"model":"read-once","stream":false,"messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap();
    let mut request = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from_static(b"not json")))
        .unwrap();
    request.extensions_mut().insert(ParsedRequest {
        requirements,
        request: chat,
    });
    let reply = send(&failover, request).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(primary.seen()[0].body["model"], "read-once");
}

#[tokio::test(start_paused = true)]
async fn frames_ready_together_reach_the_client_as_one_write() {
    // Role chunk and first token in separate upstream frames: held back
    // until the token commits, then released together.
    let primary = FakeProvider::new("primary").always(Reply::Stream(vec![
        Step::Data(chunks::role("primary")),
        Step::Data(chunks::content("primary", "hello")),
        Step::Wait(Duration::from_millis(10)),
        // One upstream read with a token, the usage chunk the client did not
        // ask for, and the end.
        Step::Data(Bytes::from(
            [
                chunks::content("primary", " world"),
                chunks::usage("primary", 10, 2),
                chunks::finish("primary", "stop"),
                chunks::done(),
            ]
            .concat(),
        )),
    ]));
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .build();
    let response = failover
        .oneshot(request(true, serde_json::json!({})))
        .await
        .unwrap();
    let mut body = response.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        frames.push(frame.unwrap().into_data().unwrap());
    }
    let text: Vec<String> = frames
        .iter()
        .map(|f| String::from_utf8(f.to_vec()).unwrap())
        .collect();
    assert_eq!(frames.len(), 2, "one write per upstream read: {text:?}");
    assert_eq!(sse_events(&text[0]).len(), 2, "preamble and token together");
    assert!(text[0].contains("hello"));
    // The usage chunk is gone without an empty write; the rest is one frame.
    assert!(!text[1].contains("\"usage\""), "{}", text[1]);
    assert!(text[1].contains(" world") && text[1].ends_with("data: [DONE]\n\n"));
}

#[tokio::test(start_paused = true)]
async fn an_empty_stream_that_ends_with_done_is_rerouted_not_committed() {
    let primary = FakeProvider::new("primary").always(Reply::Stream(vec![
        Step::Data(chunks::role("primary")),
        Step::Data(chunks::done()),
    ]));
    let backup = FakeProvider::new("backup");
    let reply = send(
        &two(&primary, &backup).build(),
        request(true, serde_json::json!({})),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["x-failover-target"], "backup");
    assert!(!reply.body.contains("primary"), "{}", reply.body);
    assert_eq!(
        reply.run.attempts()[0].class,
        Some(FailureClass::InvalidResponse)
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_answered_with_whole_json_is_rerouted() {
    let primary = FakeProvider::new("primary").always(Reply::completion("primary"));
    let backup = FakeProvider::new("backup");
    let reply = send(
        &two(&primary, &backup).build(),
        request(true, serde_json::json!({})),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    assert_eq!(reply.headers["x-failover-target"], "backup");
    assert!(reply.body.ends_with("data: [DONE]\n\n"), "{}", reply.body);
}

#[tokio::test(start_paused = true)]
async fn the_default_idle_timeout_ends_a_stalled_committed_stream() {
    let primary =
        FakeProvider::new("primary").always(Reply::tokens_then("primary", 2, vec![Step::Stall]));
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .build();
    let started = Instant::now();
    let reply = send(&failover, request(true, serde_json::json!({}))).await;
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(30),
        "the 30 s default"
    );
    assert!(
        reply.body.contains(r#""finish_reason":"error""#),
        "{}",
        reply.body
    );
    assert!(reply.body.ends_with("data: [DONE]\n\n"));
}

/// A forced probe is one try, never followed by retries on the same
/// target: the turn may have spent that target's retries before it came
/// to rest, and a probe's failure says the rest goes on.
#[tokio::test(start_paused = true)]
async fn a_forced_probe_is_never_retried() {
    // The first turn cools the target for 60 s (a rate limit with a hint).
    let a = FakeProvider::new("a")
        .then(Reply::status(429, OPENAI_429).header("retry-after", "60"))
        .always(Reply::status(500, SERVER_500));
    let failover = Failover::builder()
        .target(Target::new("a", a.clone()))
        .caps(|c| Caps {
            retries_per_target: 2,
            ..c
        })
        .build();
    let first = send(&failover, request(false, serde_json::json!({}))).await;
    assert_ne!(first.status, 200, "{}", first.body);
    let calls = a.calls();
    assert!(matches!(
        availability(&failover, "a", "gpt-x"),
        Availability::Cooling(_)
    ));
    // Nothing else is left: the resting target is probed once, its 500 is
    // not retried although two retries per target are allowed.
    let second = send(&failover, request(false, serde_json::json!({}))).await;
    assert_ne!(second.status, 200, "{}", second.body);
    assert_eq!(a.calls(), calls + 1, "one probe, no retries");
}
