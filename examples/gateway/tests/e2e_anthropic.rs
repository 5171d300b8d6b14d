//! The Anthropic Messages dialect end to end over 127.0.0.1: fake upstreams
//! that speak Messages, the gateway's `/v1/messages`, and the
//! official SDKs (Python `anthropic`, npm `@anthropic-ai/sdk`) as clients.
//!
//! `.ci/run` installs both SDKs under `target/sdk/` next to the OpenAI
//! ones. Without them the SDK tests say so loudly and skip, except under
//! `CI=true`, where a missing SDK fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

#[path = "support/sdk.rs"]
mod sdk;
use sdk::Sdk;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tower::ServiceExt;
use tower_llm_client::{Auth, UpstreamClient};
use tower_llm_failover::dialect::AnthropicMessages;
use tower_llm_failover::failover::Caps;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_failover::observe::TurnRecord;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;

const ROUTES: &str = r#"
[[routes]]
model = "msg-failover"
targets = [
  { provider = "primary", model = "primary-model#fault:status=529" },
  { provider = "backup", model = "backup-failover" },
]

[[routes]]
model = "msg-precommit"
targets = [
  { provider = "primary", model = "primary-model#fault:error_after=0" },
  { provider = "backup", model = "backup-precommit" },
]

[[routes]]
model = "msg-postcommit"
targets = [
  { provider = "primary", model = "primary-model#fault:reset_after=40;tokens=60" },
  { provider = "backup", model = "backup-postcommit" },
]

[[routes]]
model = "msg-inband-postcommit"
targets = [
  { provider = "primary", model = "primary-model#fault:error_after=40;tokens=60" },
  { provider = "backup", model = "backup-inband" },
]

[[routes]]
model = "msg-tool-cut"
targets = [
  { provider = "primary", model = "primary-model#fault:reset_after=3" },
  { provider = "backup", model = "backup-tool" },
]

[[routes]]
model = "msg-whole-cut"
targets = [
  { provider = "primary", model = "primary-model#fault:eof_after=1" },
  { provider = "backup", model = "backup-whole" },
]

[[routes]]
model = "msg-total"
targets = [
  { provider = "primary", model = "m#fault:status=529" },
  { provider = "backup", model = "m#fault:status=529" },
]

[[routes]]
model = "msg-cooling"
targets = [
  { provider = "primary", model = "cool-model#fault:status=529;retry_after=30" },
  { provider = "backup", model = "backup-cooling" },
]

[[routes]]
model = "gpt-chat"
targets = [{ provider = "openai", model = "gpt-upstream" }]
"#;

struct Gateway {
    primary: FakeUpstream,
    backup: FakeUpstream,
    /// Held for the chat route's provider to keep serving.
    _openai: FakeUpstream,
    running: app::Running,
}

impl Gateway {
    fn base_url(&self) -> String {
        format!("http://{}", self.running.addr)
    }

    fn backup_saw(&self, model: &str) -> usize {
        self.backup
            .requests()
            .iter()
            .filter(|r| r.model() == Some(model))
            .count()
    }
}

/// A gateway with two Anthropic providers (`primary`, `backup`) and one
/// OpenAI provider, every route sharing its one health registry.
async fn gateway() -> Gateway {
    let primary = FakeUpstream::builder("primary").start().await.unwrap();
    let backup = FakeUpstream::builder("backup").start().await.unwrap();
    let openai = FakeUpstream::builder("openai").start().await.unwrap();
    let config = format!(
        r#"
[failover]
max_retries_per_target = 0

[[providers]]
name = "primary"
base_url = "{}"
dialect = "anthropic"

[[providers]]
name = "backup"
base_url = "{}"
dialect = "anthropic"

[[providers]]
name = "openai"
base_url = "{}"
dialect = "openai"
{ROUTES}"#,
        primary.base_url(),
        backup.base_url(),
        openai.base_url(),
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Gateway {
        primary,
        backup,
        _openai: openai,
        running: app::serve(gateway, listener),
    }
}

// ---- Plain HTTP --------------------------------------------------------------

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    text: String,
}

async fn send(gateway: &Gateway, method: &str, path: &str, body: Option<Value>) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let request = Request::builder()
        .method(method)
        .uri(format!("{}{path}", gateway.base_url()))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), async {
        let response = client.request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (parts, bytes)
    })
    .await
    .expect("the gateway answers in time");
    Reply {
        status: response.0.status,
        headers: response.0.headers,
        text: String::from_utf8(response.1.to_vec()).unwrap(),
    }
}

fn message_request(model: &str, stream: bool) -> Value {
    json!({"model": model, "max_tokens": 64, "stream": stream,
           "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn both_dialects_share_one_gateway_and_one_health_registry() {
    let gateway = gateway().await;
    // The Messages route's primary is overloaded: the backup answers, and
    // (primary, cool-model) cools down in the gateway's one registry.
    let r = send(
        &gateway,
        "POST",
        "/v1/messages",
        Some(message_request("msg-cooling", true)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["x-failover-attempts"], "2");
    assert!(
        r.text
            .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    );
    // The chat route answers chat on the same gateway.
    let chat = json!({"model": "gpt-chat", "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]});
    let r = send(&gateway, "POST", "/v1/chat/completions", Some(chat)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text.ends_with("data: [DONE]\n\n"), "{}", r.text);
    assert!(r.text.contains("openai-tok0"));
    // One registry holds both routes' keys.
    let r = send(&gateway, "GET", "/v1/health/targets", None).await;
    let health: Value = serde_json::from_str(&r.text).unwrap();
    let keys: Vec<(String, String, String)> = health["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let s = |f: &str| k[f].as_str().unwrap_or_default().to_owned();
            (s("provider"), s("model"), s("state"))
        })
        .collect();
    // Each key names its provider's dialect.
    for key in health["data"].as_array().unwrap() {
        let expected = if key["provider"] == "openai" {
            "openai-chat"
        } else {
            "anthropic-messages"
        };
        assert_eq!(key["dialect"], expected, "{key}");
    }
    let cooled = keys
        .iter()
        .find(|(p, m, _)| p == "primary" && m.starts_with("cool-model"))
        .unwrap_or_else(|| panic!("{keys:?}"));
    assert_ne!(cooled.2, "healthy", "{keys:?}");
    assert!(
        keys.iter()
            .any(|(p, m, _)| p == "openai" && m == "gpt-upstream"),
        "{keys:?}"
    );
    assert!(keys.iter().any(|(p, _, _)| p == "backup"), "{keys:?}");
    // The cooled key is skipped on the next Messages turn: one attempt.
    let before = gateway.primary.attempts();
    let r = send(
        &gateway,
        "POST",
        "/v1/messages",
        Some(message_request("msg-cooling", false)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["x-failover-attempts"], "1");
    assert_eq!(gateway.primary.attempts(), before);
    // Each API's path serves every route: the chat route answers a
    // Messages client in Messages, its chat provider's answer translated.
    let r = send(
        &gateway,
        "POST",
        "/v1/messages",
        Some(message_request("gpt-chat", true)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text.starts_with("event: message_start"), "{}", r.text);
    assert!(r.text.contains("openai-tok0"), "{}", r.text);
    assert!(
        r.text
            .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{}",
        r.text
    );
    // An unrouted model is still refused in the client's dialect.
    let r = send(
        &gateway,
        "POST",
        "/v1/messages",
        Some(message_request("no-such-model", true)),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let error: Value = serde_json::from_str(&r.text).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "not_found_error");
    // `/v1/models` lists both.
    let r = send(&gateway, "GET", "/v1/models", None).await;
    assert!(r.text.contains("\"msg-failover\"") && r.text.contains("\"gpt-chat\""));
}

#[tokio::test]
async fn a_whole_message_cut_short_is_not_released() {
    let gateway = gateway().await;
    let r = send(
        &gateway,
        "POST",
        "/v1/messages",
        Some(message_request("msg-whole-cut", false)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let message: Value = serde_json::from_str(&r.text).unwrap();
    assert_eq!(message["type"], "message");
    assert_eq!(message["model"], "backup-whole");
    assert_eq!(message["stop_reason"], "end_turn");
    assert!(!r.text.contains("primary"));
    assert_eq!(r.headers["x-failover-attempts"], "2");
}

#[tokio::test]
async fn every_target_overloaded_is_one_anthropic_error_with_status_529() {
    let gateway = gateway().await;
    let r = send(
        &gateway,
        "POST",
        "/v1/messages",
        Some(message_request("msg-total", true)),
    )
    .await;
    assert_eq!(r.status.as_u16(), 529, "{}", r.text);
    let error: Value = serde_json::from_str(&r.text).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "overloaded_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 attempts")
    );
    // A request the dialect cannot read is refused in Anthropic's shape.
    let r = send(
        &gateway,
        "POST",
        "/v1/messages",
        Some(json!({"model": "msg-total"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_str(&r.text).unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert_eq!(gateway.primary.attempts(), 1);
}

#[test]
fn routes_may_mix_dialects_and_an_unknown_dialect_is_refused() {
    let config = app::Config::from_toml(
        r#"
[[providers]]
name = "claude"
base_url = "http://127.0.0.1:9/v1"
dialect = "anthropic"

[[providers]]
name = "gpt"
base_url = "http://127.0.0.1:9/v1"

[[routes]]
model = "mixed"
targets = [{ provider = "claude" }, { provider = "gpt" }]
"#,
    )
    .unwrap();
    // Served on both endpoints, the other dialect's target translated
    // (tests/e2e_translate.rs serves it).
    assert!(app::Gateway::from_config(&config).is_ok());

    let config = app::Config::from_toml(
        r#"
[[providers]]
name = "odd"
base_url = "http://127.0.0.1:9/v1"
dialect = "gemini"
"#,
    )
    .unwrap();
    let error = app::Gateway::from_config(&config).expect_err("refused");
    assert!(error.contains("unknown dialect"), "{error}");

    // Without routes, each dialect gets its own catch-all route.
    let config = app::Config::from_toml(
        r#"
[[providers]]
name = "claude"
base_url = "http://127.0.0.1:9/v1"
dialect = "anthropic"

[[providers]]
name = "gpt"
base_url = "http://127.0.0.1:9/v1"
"#,
    )
    .unwrap();
    assert!(app::Gateway::from_config(&config).is_ok());
}

// ---- The library, without the gateway ---------------------------------------

async fn through_failover(
    targets: Vec<Target<UpstreamClient>>,
    body: Value,
    headers: &[(&str, &str)],
) -> (StatusCode, String, TurnRecord) {
    let mut builder = Failover::builder().caps(|c| Caps {
        retries_per_target: 0,
        ..c
    });
    for target in targets {
        builder = builder.target(target);
    }
    let failover = builder.dialect(AnthropicMessages).build();
    let mut request = Request::post("/v1/messages");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), async {
        let response = failover.oneshot(request).await.unwrap();
        let status = response.status();
        let run = response.extensions().get::<TurnRecord>().cloned().unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap(), run)
    })
    .await
    .expect("the turn ends in time")
}

#[tokio::test]
async fn anthropic_providers_get_their_own_key_and_never_the_clients_credentials() {
    let upstream = FakeUpstream::builder("claude")
        .api_key("sk-gateway")
        .start()
        .await
        .unwrap();
    let client = UpstreamClient::builder(upstream.base_url())
        .auth(Auth::x_api_key("sk-gateway"))
        .build()
        .unwrap();
    let (status, text, _) = through_failover(
        vec![Target::new("claude", client).model("claude-upstream")],
        message_request("claude-x", true),
        &[
            ("x-api-key", "sk-client-own"),
            ("authorization", "Bearer sk-client-own"),
            // Allow-listed, then one that reaches past the request.
            (
                "anthropic-beta",
                "interleaved-thinking-2025-05-14,files-api-2025-04-14",
            ),
            ("anthropic-dangerous-direct-browser-access", "true"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    let seen = &seen[0];
    assert_eq!(seen.path, "/v1/messages");
    assert_eq!(seen.header("x-api-key"), Some("sk-gateway"));
    assert_eq!(seen.header("authorization"), None);
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    // Betas pass through the header policy's allow-list only.
    assert_eq!(
        seen.header("anthropic-beta"),
        Some("interleaved-thinking-2025-05-14")
    );
    assert_eq!(
        seen.header("anthropic-dangerous-direct-browser-access"),
        None
    );
    assert_eq!(seen.model(), Some("claude-upstream"));
}

#[tokio::test]
async fn records_keep_the_anthropic_rate_limit_headers() {
    let primary = FakeUpstream::start("primary").await;
    let backup = FakeUpstream::start("backup").await;
    let client = |u: &FakeUpstream| UpstreamClient::builder(u.base_url()).build().unwrap();
    let (status, text, run) = through_failover(
        vec![
            Target::new("primary", client(&primary)).model("m#fault:status=429;retry_after=30"),
            Target::new("backup", client(&backup)).model("backup-model"),
        ],
        message_request("claude-x", true),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let attempts = run.attempts();
    assert_eq!(attempts.len(), 2);
    let limited = &attempts[0].rate_limits;
    assert_eq!(
        limited.get("anthropic-ratelimit-requests-remaining"),
        Some("0")
    );
    assert_eq!(
        limited.get("anthropic-ratelimit-requests-limit"),
        Some("50")
    );
    assert_eq!(limited.get("retry-after"), Some("30"));
    assert_eq!(
        attempts[1]
            .rate_limits
            .get("anthropic-ratelimit-requests-remaining"),
        Some("49")
    );
    // The spend counts Anthropic's usage: input from `message_start`,
    // output from `message_delta`.
    let usage = attempts[1].usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (1, 8));
    assert!(!attempts[1].estimated);
}

#[tokio::test]
async fn a_cut_after_output_ends_with_one_error_event_and_nothing_spliced() {
    let primary = FakeUpstream::start("primary").await;
    let backup = FakeUpstream::start("backup").await;
    let client = |u: &FakeUpstream| UpstreamClient::builder(u.base_url()).build().unwrap();
    let (status, text, run) = through_failover(
        vec![
            Target::new("primary", client(&primary)).model("m#fault:error_after=40;tokens=60"),
            Target::new("backup", client(&backup)),
        ],
        message_request("claude-x", true),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text.matches("event: content_block_delta").count(), 40);
    assert!(!text.contains("backup") && !text.contains("message_stop"));
    let tail = text.rsplit("\n\n").nth(1).unwrap();
    let data = tail.strip_prefix("event: error\ndata: ").expect(tail);
    let error: Value = serde_json::from_str(data).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "overloaded_error");
    assert_eq!(error["error"]["phase"], "committed");
    assert_eq!(error["error"]["output_events"], 40);
    let sent_before = text.len() - tail.len() - 2;
    assert_eq!(error["error"]["bytes_sent"], sent_before as u64);
    assert_eq!(backup.attempts(), 0);
    assert_eq!(run.attempts().len(), 1);
}

// ---- The official SDKs -------------------------------------------------------

async fn run(sdk: &Sdk, gateway: &Gateway, model: &str, mode: &str, tools: bool) -> Value {
    let mut command = tokio::process::Command::new(&sdk.program);
    command
        .arg(&sdk.script)
        .args([gateway.base_url().as_str(), model, mode])
        .kill_on_drop(true);
    if tools {
        command.arg("tools");
    }
    if let Some(path) = &sdk.node_path {
        command.env("NODE_PATH", path);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("the SDK client finishes in time")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{} client failed: {stdout}\n{}",
        sdk.name,
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    eprintln!("{} {model} {mode}: {result}", sdk.name);
    result
}

/// The class the SDK raises for an error event on a 200 stream.
fn stream_error_class(sdk: &Sdk) -> &'static str {
    match sdk.name {
        "python" => "APIStatusError",
        _ => "APIError",
    }
}

async fn check_sdk(sdk: Sdk) {
    let gateway = gateway().await;

    // Primary 529 before any output: the backup's whole answer, and the
    // SDK never notices; streamed and not.
    for mode in ["stream", "once"] {
        let r = run(&sdk, &gateway, "msg-failover", mode, false).await;
        assert_eq!(r["ok"], true, "{r}");
        let text = r["text"].as_str().unwrap();
        assert_eq!(text.matches("backup-tok").count(), 8, "{text}");
        assert!(!text.contains("primary"));
        assert_eq!(r["stop_reason"], "end_turn");
        assert_eq!(r["model"], "backup-failover");
    }

    // `overloaded_error` after `message_start`, before any delta: rerouted
    // invisibly.
    let r = run(&sdk, &gateway, "msg-precommit", "stream", false).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["model"], "backup-precommit");
    assert_eq!(r["deltas"], 8);
    assert!(!r["text"].as_str().unwrap().contains("primary"));

    // 40 text deltas, then a reset: exactly those 40, then the SDK raises;
    // nothing from the backup.
    let r = run(&sdk, &gateway, "msg-postcommit", "stream", false).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["deltas"], 40, "{r}");
    let text = r["text"].as_str().unwrap();
    assert_eq!(text.matches("primary-tok").count(), 40, "{text}");
    assert!(!text.contains("backup"));
    assert_eq!(r["error"]["class"], stream_error_class(&sdk), "{r}");
    assert_eq!(r["error"]["phase"], "committed");
    assert_eq!(r["error"]["output_events"], 40);
    assert_eq!(gateway.backup_saw("backup-postcommit"), 0);

    // The provider's own `overloaded_error` after 40 deltas: the same.
    let r = run(&sdk, &gateway, "msg-inband-postcommit", "stream", false).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["deltas"], 40, "{r}");
    assert_eq!(r["error"]["class"], stream_error_class(&sdk), "{r}");
    assert_eq!(r["error"]["type"], "overloaded_error");
    assert_eq!(gateway.backup_saw("backup-inband"), 0);

    // A tool call cut inside its `input_json_delta`s: the SDK raises, and
    // no second tool call appears.
    let r = run(&sdk, &gateway, "msg-tool-cut", "stream", true).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["tool_calls"], 1, "{r}");
    assert_eq!(
        r["partial_json"],
        "{\"q\": \"primary-tok0 primary-tok1 primary-tok2 "
    );
    assert_eq!(r["error"]["class"], stream_error_class(&sdk), "{r}");
    assert_eq!(gateway.backup_saw("backup-tool"), 0);

    // Every target 529: one Anthropic-shaped error with the status the
    // SDK knows as overloaded.
    let r = run(&sdk, &gateway, "msg-total", "stream", false).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"]["status"], 529, "{r}");
    assert_eq!(r["error"]["type"], "overloaded_error");
    assert_eq!(r["error"]["class"], "OverloadedError");
}

#[tokio::test]
async fn the_official_python_anthropic_sdk_reads_every_outcome_cleanly() {
    if let Some(sdk) = sdk::python("ANTHROPIC_SDK_PYTHON", "anthropic", "anthropic_client.py").await
    {
        check_sdk(sdk).await;
    }
}

#[tokio::test]
async fn the_official_node_anthropic_sdk_reads_every_outcome_cleanly() {
    if let Some(sdk) = sdk::node(
        "ANTHROPIC_SDK_NODE_PATH",
        "@anthropic-ai/sdk",
        "anthropic_client.cjs",
    )
    .await
    {
        check_sdk(sdk).await;
    }
}
