//! The OpenAI Responses API end to end over 127.0.0.1, with the official
//! SDKs (Python `openai`: `client.responses.create(stream=True)` and
//! `client.responses.stream(...)`; npm `openai`: the same two) as clients
//! of the gateway's `POST /v1/responses`:
//!
//! - a 429 primary before any output: the backup's whole answer, and the
//!   SDK never notices (one `response.created`, one id);
//! - 40 text deltas, then a reset: the SDK yields exactly those deltas,
//!   then raises;
//! - a function call cut inside its arguments: raised, no second call;
//! - a Responses client served by a chat target and by a Messages target;
//! - a `previous_response_id` turn whose provider fails: an error naming
//!   the pin, and no other provider tried.
//!
//! Two fake servers (`primary`, `backup`) each speak chat completions,
//! Messages and Responses; the config declares them once per dialect.
//! `.ci/run` installs the SDKs under `target/sdk/`. Without them these
//! tests say so loudly and skip, except under `CI=true`, where a missing
//! SDK fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/sdk.rs"]
mod sdk;
use sdk::Sdk;

use serde_json::Value;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::{DEFAULT_TOKENS, FakeUpstream};

/// Each route's failing target has a model name of its own, so one route's
/// failures never cool another route's health key. Each SDK gets its own
/// routes (`{sdk}` is replaced), so the two tests' counts stay apart.
const ROUTES: &str = r#"
# The Responses primary is rate limited (429); the Responses backup answers.
[[routes]]
model = "{sdk}-429"
targets = [
  { provider = "resp-primary", model = "{sdk}-p429#fault:status=429" },
  { provider = "resp-backup", model = "{sdk}-backup" },
]

# 40 text deltas of 60, then a reset.
[[routes]]
model = "{sdk}-reset40"
targets = [
  { provider = "resp-primary", model = "{sdk}-p-reset40#fault:reset_after=40;tokens=60" },
  { provider = "resp-backup", model = "{sdk}-backup-after-reset" },
]

# A function call cut inside its arguments.
[[routes]]
model = "{sdk}-tool-cut"
targets = [
  { provider = "resp-primary", model = "{sdk}-p-tool-cut#fault:reset_after=3" },
  { provider = "resp-backup", model = "{sdk}-backup-after-tool-cut" },
]

# Served by a chat target, and by a Messages target, translated.
[[routes]]
model = "{sdk}-chat"
targets = [{ provider = "chat-backup", model = "{sdk}-backup-chat" }]

[[routes]]
model = "{sdk}-msg"
targets = [{ provider = "msg-backup", model = "{sdk}-backup-msg" }]

# The Responses primary fails (500); a continuation may go nowhere else.
[[routes]]
model = "{sdk}-pinned"
targets = [
  { provider = "resp-primary", model = "{sdk}-p-pinned#fault:status=500" },
  { provider = "resp-backup", model = "{sdk}-backup-pinned" },
  { provider = "chat-backup", model = "{sdk}-chat-pinned" },
]
"#;

struct Gateway {
    primary: FakeUpstream,
    backup: FakeUpstream,
    running: app::Running,
    sdk: &'static str,
}

impl Gateway {
    fn seen(upstream: &FakeUpstream, model: &str) -> usize {
        upstream
            .requests()
            .iter()
            .filter(|r| r.model() == Some(model))
            .count()
    }

    fn primary_saw(&self, model: &str) -> usize {
        Self::seen(&self.primary, &format!("{}-{model}", self.sdk))
    }

    fn backup_saw(&self, model: &str) -> usize {
        Self::seen(&self.backup, &format!("{}-{model}", self.sdk))
    }

    async fn run(&self, sdk: &Sdk, route: &str, mode: &str, extra: &[&str]) -> Value {
        let base_url = format!("http://{}/v1", self.running.addr);
        let route = format!("{}-{route}", self.sdk);
        let mut args = vec![route.as_str(), mode];
        args.extend_from_slice(extra);
        sdk::run_json(sdk, &base_url, &args).await
    }
}

async fn gateway(sdk: &'static str) -> Gateway {
    let primary = FakeUpstream::builder("primary").start().await.unwrap();
    let backup = FakeUpstream::builder("backup").start().await.unwrap();
    let config = format!(
        r#"
[failover]
max_retries_per_target = 0

[[providers]]
name = "resp-primary"
base_url = "{primary}"
dialect = "openai-responses"

[[providers]]
name = "resp-backup"
base_url = "{backup}"
dialect = "openai-responses"

[[providers]]
name = "chat-backup"
base_url = "{backup}"

[[providers]]
name = "msg-backup"
base_url = "{backup}"
dialect = "anthropic"
{routes}"#,
        primary = primary.base_url(),
        backup = backup.base_url(),
        routes = ROUTES.replace("{sdk}", sdk),
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Gateway {
        primary,
        backup,
        running: app::serve(gateway, listener),
        sdk,
    }
}

/// The text of a fake's whole answer: `"{name}-tok{i} "` for each token.
fn answer_text(name: &str, tokens: usize) -> String {
    (0..tokens).map(|i| format!("{name}-tok{i} ")).collect()
}

/// The backup's whole answer through a 429 primary, in every mode: one
/// lifecycle, one id, the text as the backup wrote it.
async fn failover_before_output(sdk: &Sdk, gateway: &Gateway) {
    for mode in ["create-stream", "helper", "once"] {
        let r = gateway.run(sdk, "429", mode, &[]).await;
        assert_eq!(r["ok"], true, "{mode}: {r}");
        assert_eq!(
            r["text"],
            answer_text("backup", DEFAULT_TOKENS),
            "{mode}: {r}"
        );
        assert_eq!(r["status"], "completed", "{mode}: {r}");
        assert_eq!(r["usage"]["output_tokens"], DEFAULT_TOKENS, "{mode}: {r}");
        if mode != "once" {
            let events = r["events"].as_array().unwrap();
            let created = events.iter().filter(|e| *e == "response.created").count();
            assert_eq!(created, 1, "one lifecycle: {r}");
            assert_eq!(r["ids"].as_array().unwrap().len(), 1, "{r}");
            let sequence: Vec<u64> = r["sequence"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap())
                .collect();
            assert_eq!(
                sequence,
                (0..sequence.len() as u64).collect::<Vec<_>>(),
                "{r}"
            );
        }
    }
    // Cooling may spare the primary a later turn; it never serves one.
    assert!(gateway.primary_saw("p429#fault:status=429") >= 1);
    assert_eq!(gateway.backup_saw("backup"), 3);
}

/// 40 deltas, then the primary's connection resets: exactly those deltas,
/// then the SDK raises on the gateway's terminal events.
async fn reset_after_forty(sdk: &Sdk, gateway: &Gateway) {
    for mode in ["create-stream", "helper"] {
        let r = gateway.run(sdk, "reset40", mode, &[]).await;
        assert_eq!(r["ok"], false, "{mode}: raised: {r}");
        let deltas = r["deltas"].as_array().unwrap();
        assert_eq!(deltas.len(), 40, "{mode}: {r}");
        let text: String = deltas.iter().map(|d| d.as_str().unwrap()).collect();
        assert_eq!(
            text,
            answer_text("primary", 40),
            "{mode}: nothing spliced: {r}"
        );
        assert_eq!(r["error"]["class"], "APIError", "{mode}: {r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty(), "{mode}: {r}");
        let events = r["events"].as_array().unwrap();
        assert_eq!(events.last().unwrap(), "response.failed", "{mode}: {r}");
        assert_eq!(r["status"], "failed", "{mode}: {r}");
        assert_eq!(r["ids"].as_array().unwrap().len(), 1, "{mode}: {r}");
    }
    assert_eq!(gateway.backup_saw("backup-after-reset"), 0, "never spliced");
}

/// A function call cut inside its arguments: raised, and no second call.
async fn tool_call_cut(sdk: &Sdk, gateway: &Gateway) {
    let r = gateway.run(sdk, "tool-cut", "tools-helper", &[]).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"]["class"], "APIError", "{r}");
    assert!(
        r["argument_deltas"].as_u64().unwrap() >= 1,
        "cut inside: {r}"
    );
    assert_eq!(r["calls"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(gateway.primary_saw("p-tool-cut#fault:reset_after=3"), 1);
    assert_eq!(
        gateway.backup_saw("backup-after-tool-cut"),
        0,
        "no second call"
    );
}

/// A Responses client served by a chat target and by a Messages target.
async fn translated_targets(sdk: &Sdk, gateway: &Gateway) {
    for (route, backup_model) in [("chat", "backup-chat"), ("msg", "backup-msg")] {
        for mode in ["create-stream", "helper", "once"] {
            let r = gateway.run(sdk, route, mode, &[]).await;
            assert_eq!(r["ok"], true, "{route} {mode}: {r}");
            assert_eq!(
                r["text"],
                answer_text("backup", DEFAULT_TOKENS),
                "{route} {mode}: {r}"
            );
            assert_eq!(r["status"], "completed", "{route} {mode}: {r}");
            assert_eq!(
                r["usage"]["output_tokens"], DEFAULT_TOKENS,
                "{route} {mode}: {r}"
            );
            if mode != "once" {
                let ids = r["ids"].as_array().unwrap();
                assert_eq!(ids.len(), 1, "{r}");
                assert!(ids[0].as_str().unwrap().starts_with("resp_"), "{r}");
            }
        }
        let r = gateway.run(sdk, route, "tools-helper", &[]).await;
        assert_eq!(r["ok"], true, "{route} tools: {r}");
        let calls = r["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{route}: {r}");
        assert_eq!(calls[0]["name"], "get_weather", "{r}");
        assert!(
            calls[0]["call_id"].as_str().unwrap().starts_with("call_"),
            "{r}"
        );
        assert_eq!(gateway.backup_saw(backup_model), 4, "{route}");
    }
}

/// A continuation of state the failing provider holds goes nowhere else.
async fn pinned_turn(sdk: &Sdk, gateway: &Gateway) {
    let r = gateway
        .run(sdk, "pinned", "previous", &["resp_held_by_primary"])
        .await;
    assert_eq!(r["ok"], false, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("previous_response_id binds this turn to provider resp-primary"),
        "{r}"
    );
    assert_eq!(r["error"]["status"], 502, "{r}");
    assert_eq!(gateway.primary_saw("p-pinned#fault:status=500"), 1);
    assert_eq!(gateway.backup_saw("backup-pinned"), 0, "no other provider");
    assert_eq!(gateway.backup_saw("chat-pinned"), 0, "no other dialect");
}

async fn check(sdk: Sdk, name: &'static str) {
    let gateway = gateway(name).await;
    failover_before_output(&sdk, &gateway).await;
    reset_after_forty(&sdk, &gateway).await;
    tool_call_cut(&sdk, &gateway).await;
    translated_targets(&sdk, &gateway).await;
    pinned_turn(&sdk, &gateway).await;
}

#[tokio::test]
async fn the_python_openai_sdk_speaks_responses_through_the_gateway() {
    if let Some(sdk) = sdk::python("OPENAI_SDK_PYTHON", "openai", "responses_openai.py").await {
        check(sdk, "py").await;
    }
}

#[tokio::test]
async fn the_node_openai_sdk_speaks_responses_through_the_gateway() {
    if let Some(sdk) = sdk::node("OPENAI_SDK_NODE_PATH", "openai", "responses_openai.cjs").await {
        check(sdk, "node").await;
    }
}

/// The embedded demo's Responses routes (`messages::demo_routes`), as
/// `cargo run -p tower-llm-gateway` serves them: a 429 Responses primary
/// the client never sees, and a cut that ends in a raised error.
#[tokio::test]
async fn the_demo_routes_answer_a_responses_client() {
    let Some(sdk) = sdk::python("OPENAI_SDK_PYTHON", "openai", "responses_openai.py").await else {
        return;
    };
    let primary = FakeUpstream::builder("primary").start().await.unwrap();
    let backup = FakeUpstream::builder("backup").start().await.unwrap();
    let config = format!(
        r#"
[[providers]]
name = "primary"
base_url = "{primary}"

[[providers]]
name = "backup"
base_url = "{backup}"

[[providers]]
name = "primary-billing"
base_url = "{primary}"
{demo}"#,
        primary = primary.base_url(),
        backup = backup.base_url(),
        demo = tower_llm_gateway::messages::demo_routes(&primary.base_url(), &backup.base_url()),
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::serve(gateway, listener);
    let base_url = format!("http://{}/v1", running.addr);

    let r = sdk::run_json(
        &sdk,
        &base_url,
        &["responses-demo-failover", "create-stream"],
    )
    .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["text"], answer_text("backup", DEFAULT_TOKENS), "{r}");
    let events = r["events"].as_array().unwrap();
    assert_eq!(
        events.iter().filter(|e| *e == "response.created").count(),
        1,
        "{r}"
    );
    assert!(r["ids"][0].as_str().unwrap().starts_with("resp_"), "{r}");

    let r = sdk::run_json(&sdk, &base_url, &["responses-demo-cut", "create-stream"]).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["deltas"].as_array().unwrap().len(), 5, "{r}");
    assert_eq!(r["error"]["class"], "APIError", "{r}");
}

/// One raw HTTP/1.1 exchange with `connection: close`: the whole answer.
async fn raw_post(addr: std::net::SocketAddr, path: &str, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(20),
        tcp.read_to_string(&mut answer),
    )
    .await
    .expect("the gateway answers in time")
    .unwrap();
    answer
}

/// The gateway's own answers on `/v1/responses`, without an SDK: a
/// provider's `hosted_tools` and the `responses` dialect alias are read
/// from the config, and refusals have OpenAI's shape.
#[tokio::test]
async fn hosted_tools_and_refusals_on_the_responses_endpoint() {
    let upstream = FakeUpstream::builder("primary").start().await.unwrap();
    let config = format!(
        r#"
[[providers]]
name = "vllm"
base_url = "{base}"
dialect = "responses"

[[routes]]
model = "local"
targets = [{{ provider = "vllm", hosted_tools = ["file_search"] }}]
"#,
        base = upstream.base_url(),
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::serve(gateway, listener);

    let answer = raw_post(
        running.addr,
        "/v1/responses",
        r#"{"model":"local","input":"hi","tools":[{"type":"web_search"}]}"#,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("vllm lacks the hosted tool web_search"),
        "{answer}"
    );
    assert!(
        answer.contains(r#""code":"no_compatible_target""#),
        "{answer}"
    );
    assert_eq!(upstream.attempts(), 0, "never sent");

    // The tool it hosts goes through, to its Responses path.
    let answer = raw_post(
        running.addr,
        "/v1/responses",
        r#"{"model":"local","input":"hi","tools":[{"type":"file_search","vector_store_ids":["vs_1"]}]}"#,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""object":"response""#), "{answer}");
    assert_eq!(upstream.requests()[0].path, "/v1/responses");

    let answer = raw_post(
        running.addr,
        "/v1/responses",
        r#"{"model":"other","input":"hi"}"#,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(answer.contains(r#"{"error":{"#), "OpenAI's shape: {answer}");
    assert!(answer.contains("no openai-responses route"), "{answer}");
}
