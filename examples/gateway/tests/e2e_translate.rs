//! Routes that mix OpenAI-chat and Anthropic-Messages targets, end to end
//! over 127.0.0.1, with the official SDKs (Python `openai` and `anthropic`,
//! npm `openai` and `@anthropic-ai/sdk`) as clients: each client reads the
//! other dialect's answer translated into its own (text, stop reasons,
//! usage, ids, streamed tool calls, errors), a tool call's id survives an
//! agent loop that crosses dialects, and what a target's dialect cannot
//! express is refused by name.
//!
//! Two fake servers (`primary`, `backup`) each answer both
//! `/v1/chat/completions` and `/v1/messages`; the config declares each
//! twice, once as a chat provider and once with `dialect = "anthropic"`.
//! `.ci/run` installs the SDKs under `target/sdk/`. Without them these
//! tests say so loudly and skip, except under `CI=true`, where a missing
//! SDK fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/sdk.rs"]
mod sdk;
use sdk::Sdk;

use serde_json::{Value, json};
use tower_llm_gateway::app;
use tower_llm_testing::upstream::{DEFAULT_TOKENS, FakeUpstream};

/// Each route's failing target has a model name of its own, so one route's
/// failures never cool another route's health key.
const ROUTES: &str = r#"
# The Messages primary is overloaded (529) before any output; the chat
# backup answers.
[[routes]]
model = "x-msg529-chat"
targets = [
  { provider = "msg-primary", model = "p-msg529#fault:status=529" },
  { provider = "chat-backup", model = "backup-chat" },
]

# The chat primary is rate limited (429); the Messages backup answers.
[[routes]]
model = "x-chat429-msg"
targets = [
  { provider = "chat-primary", model = "p-chat429#fault:status=429" },
  { provider = "msg-backup", model = "backup-msg" },
]

# One text delta from the Messages primary, then a reset.
[[routes]]
model = "x-msg-reset"
targets = [
  { provider = "msg-primary", model = "p-msg-reset#fault:reset_after=1" },
  { provider = "chat-backup", model = "backup-after-msg-reset" },
]

# One content chunk from the chat primary, then a reset.
[[routes]]
model = "x-chat-reset"
targets = [
  { provider = "chat-primary", model = "p-chat-reset#fault:reset_after=1" },
  { provider = "msg-backup", model = "backup-after-chat-reset" },
]

# The agent loop, a chat target first: turn 1 here ...
[[routes]]
model = "x-agent-chat"
targets = [{ provider = "chat-primary", model = "agent-chat" }]

# ... turn 2 here: the chat target fails, the Messages target answers.
[[routes]]
model = "x-agent-chat-then-msg"
targets = [
  { provider = "chat-primary", model = "p-agent-chat503#fault:status=503" },
  { provider = "msg-backup", model = "agent-msg-turn2" },
]

# The agent loop, a Messages target first: turn 1 here ...
[[routes]]
model = "x-agent-msg"
targets = [{ provider = "msg-primary", model = "agent-msg" }]

# ... turn 2 here: the Messages target fails, the chat target answers.
[[routes]]
model = "x-agent-msg-then-chat"
targets = [
  { provider = "msg-primary", model = "p-agent-msg529#fault:status=529" },
  { provider = "chat-backup", model = "agent-chat-turn2" },
]

# n = 2: the chat primary fails, and the Messages backup cannot say n > 1.
[[routes]]
model = "x-n2"
targets = [
  { provider = "chat-primary", model = "p-n2#fault:status=503" },
  { provider = "msg-backup", model = "backup-n2" },
]
"#;

struct Gateway {
    primary: FakeUpstream,
    backup: FakeUpstream,
    running: app::Running,
}

impl Gateway {
    /// The requests a fake was sent for `model`, in order.
    fn seen(upstream: &FakeUpstream, model: &str) -> Vec<Value> {
        upstream
            .requests()
            .into_iter()
            .filter(|r| r.model() == Some(model))
            .map(|r| r.body)
            .collect()
    }

    /// The last request the backup was sent for `model`, once the client
    /// read `r` without an error.
    fn backup_last(&self, model: &str, r: &Value) -> Value {
        assert_eq!(r["ok"], true, "{r}");
        Self::seen(&self.backup, model)
            .pop()
            .unwrap_or_else(|| panic!("the backup saw no request for {model}: {r}"))
    }

    fn backup_saw(&self, model: &str) -> usize {
        Self::seen(&self.backup, model).len()
    }

    fn primary_saw(&self, model: &str) -> usize {
        Self::seen(&self.primary, model).len()
    }
}

/// One gateway over two fakes, each declared as a chat provider and as a
/// Messages provider.
async fn gateway() -> Gateway {
    let primary = FakeUpstream::builder("primary").start().await.unwrap();
    let backup = FakeUpstream::builder("backup").start().await.unwrap();
    let config = format!(
        r#"
[failover]
max_retries_per_target = 0

[[providers]]
name = "chat-primary"
base_url = "{primary}"

[[providers]]
name = "msg-primary"
base_url = "{primary}"
dialect = "anthropic"

[[providers]]
name = "chat-backup"
base_url = "{backup}"

[[providers]]
name = "msg-backup"
base_url = "{backup}"
dialect = "anthropic"
{ROUTES}"#,
        primary = primary.base_url(),
        backup = backup.base_url(),
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Gateway {
        primary,
        backup,
        running: app::serve(gateway, listener),
    }
}

/// Which API a client script speaks: the OpenAI SDKs take the base URL
/// with `/v1`, the Anthropic ones without.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Api {
    OpenAi,
    Anthropic,
}

/// Runs the client script once (60 s at most) and reads its JSON line.
async fn run(sdk: &Sdk, api: Api, gateway: &Gateway, args: &[&str]) -> Value {
    let base_url = match api {
        Api::OpenAi => format!("http://{}/v1", gateway.running.addr),
        Api::Anthropic => format!("http://{}", gateway.running.addr),
    };
    sdk::run_json(sdk, &base_url, args).await
}

/// The text of a fake's whole answer: `"{name}-tok{i} "` for each token.
fn answer_text(name: &str) -> String {
    (0..DEFAULT_TOKENS)
        .map(|i| format!("{name}-tok{i} "))
        .collect()
}

/// The input tokens a fake reports for a request it was sent: the words
/// of the messages' string contents, at least 1 (both fakes count so).
fn fake_input_tokens(body: &Value) -> u64 {
    let words: usize = body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .filter_map(|m| m["content"].as_str())
                .map(|c| c.split_whitespace().count())
                .sum()
        })
        .unwrap_or(0);
    u64::try_from(words.max(1)).unwrap()
}

fn output_tokens() -> u64 {
    u64::try_from(DEFAULT_TOKENS).unwrap()
}

/// The one tool call a fake answers a request with tools by, as a client
/// of `api` sees it.
fn expected_tool_call(api: Api, backup: &str) -> Value {
    let id = match api {
        Api::OpenAi => "call_fake",
        Api::Anthropic => "toolu_fake",
    };
    json!({"id": id, "name": "get_weather", "arguments": {"q": answer_text(backup)}})
}

/// A tool call as the script reported it, without the fields only one
/// script reports.
fn tool_call(r: &Value) -> Value {
    let calls = r["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "one tool call: {r}");
    let call = &calls[0];
    json!({"id": call["id"], "name": call["name"], "arguments": call["arguments"]})
}

// ---- OpenAI SDK clients ------------------------------------------------------

/// The whole of a text answer an OpenAI client read from `backup_model`
/// (the fake named `backup`), translated or not.
fn check_openai_answer(r: &Value, mode: &str, backup_model: &str, seen: &Value) {
    assert_eq!(r["ok"], true, "{mode}: {r}");
    assert_eq!(r["text"], answer_text("backup"), "{mode}: {r}");
    assert_eq!(r["finish_reason"], "stop", "{mode}: {r}");
    assert_eq!(r["model"], backup_model, "{mode}: {r}");
    let id = r["id"].as_str().unwrap_or_default();
    assert!(id.starts_with("chatcmpl-"), "{mode}: id {id}: {r}");
    assert_eq!(r["ids"].as_array().map(Vec::len), Some(1), "one id: {r}");
    let object = if mode == "stream" {
        "chat.completion.chunk"
    } else {
        "chat.completion"
    };
    assert_eq!(r["object"], object, "{mode}: {r}");
    let input = fake_input_tokens(seen);
    assert_eq!(
        r["usage"],
        json!({"prompt_tokens": input, "completion_tokens": output_tokens(),
               "total_tokens": input + output_tokens()}),
        "{mode}: usage as the fake reported it: {r}"
    );
}

async fn openai_text_answers(sdk: &Sdk, gateway: &Gateway) {
    for mode in ["stream", "once"] {
        // The Messages primary is overloaded before output: the chat
        // backup's answer, as it came.
        let r = run(sdk, Api::OpenAi, gateway, &["x-msg529-chat", mode]).await;
        let seen = gateway.backup_last("backup-chat", &r);
        check_openai_answer(&r, mode, "backup-chat", &seen);
        assert_eq!(r["id"], "chatcmpl-test", "{r}");

        // The chat primary is rate limited: the Messages backup's answer,
        // translated.
        let r = run(sdk, Api::OpenAi, gateway, &["x-chat429-msg", mode]).await;
        let seen = gateway.backup_last("backup-msg", &r);
        assert!(seen["max_tokens"].is_u64(), "a Messages request: {seen}");
        check_openai_answer(&r, mode, "backup-msg", &seen);
    }
    assert!(gateway.primary_saw("p-msg529#fault:status=529") >= 1);
    assert!(gateway.primary_saw("p-chat429#fault:status=429") >= 1);
}

async fn openai_tool_calls(sdk: &Sdk, gateway: &Gateway) {
    // The Messages backup's tool_use, read as a chat tool call.
    for mode in ["tools-stream", "tools-once"] {
        let r = run(sdk, Api::OpenAi, gateway, &["x-chat429-msg", mode]).await;
        assert_eq!(r["ok"], true, "{mode}: {r}");
        assert_eq!(
            tool_call(&r),
            expected_tool_call(Api::OpenAi, "backup"),
            "{mode}: {r}"
        );
        assert_eq!(r["tool_calls"][0]["type"], "function", "{r}");
        assert_eq!(r["finish_reason"], "tool_calls", "{mode}: {r}");
        assert_eq!(r["text"], "", "{mode}: no text: {r}");
        let id = r["id"].as_str().unwrap_or_default();
        assert!(id.starts_with("chatcmpl-"), "{mode}: {r}");
        assert_eq!(r["ids"].as_array().map(Vec::len), Some(1), "one id: {r}");
        let seen = gateway.backup_last("backup-msg", &r);
        assert_eq!(seen["tools"][0]["name"], "get_weather", "{seen}");
        let input = fake_input_tokens(&seen);
        assert_eq!(r["usage"]["prompt_tokens"], input, "{mode}: {r}");
        assert_eq!(r["usage"]["completion_tokens"], output_tokens(), "{r}");
        if mode == "tools-stream" {
            assert!(r["argument_deltas"].as_u64() > Some(1), "streamed: {r}");
        }
    }
}

async fn openai_cut_after_output(sdk: &Sdk, gateway: &Gateway) {
    // One text delta from the Messages primary, then a reset: exactly that
    // delta, then an error; nothing from the backup.
    let r = run(sdk, Api::OpenAi, gateway, &["x-msg-reset", "stream"]).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["text"], "primary-tok0 ", "{r}");
    assert_eq!(r["deltas"], 1, "{r}");
    assert_eq!(r["error"]["class"], "APIError", "{r}");
    assert!(r["error"]["message"].is_string(), "{r}");
    let id = r["id"].as_str().unwrap_or_default();
    assert!(id.starts_with("chatcmpl-"), "{r}");
    assert_eq!(gateway.backup_saw("backup-after-msg-reset"), 0);
}

async fn openai_agent_loop(sdk: &Sdk, gateway: &Gateway) {
    let r = run(
        sdk,
        Api::OpenAi,
        gateway,
        &["x-agent-chat", "agent", "x-agent-chat-then-msg"],
    )
    .await;
    let first = &r["turn1"];
    assert_eq!(first["ok"], true, "{r}");
    assert_eq!(
        tool_call(first),
        expected_tool_call(Api::OpenAi, "primary"),
        "turn 1, from the chat target: {r}"
    );
    assert_eq!(first["finish_reason"], "tool_calls", "{r}");
    let second = &r["turn2"];
    assert_eq!(second["ok"], true, "{r}");
    assert_eq!(second["finish_reason"], "tool_calls", "{r}");
    assert_eq!(
        tool_call(second),
        expected_tool_call(Api::OpenAi, "backup"),
        "turn 2, from the Messages target: {r}"
    );
    assert!(gateway.primary_saw("p-agent-chat503#fault:status=503") >= 1);
    // The Messages target got the history with the chat id translated,
    // call and result alike.
    let seen = gateway.backup_last("agent-msg-turn2", &r);
    let blocks: Vec<&Value> = seen["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .collect();
    let tool_use = blocks
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block: {seen}"));
    let tool_result = blocks
        .iter()
        .find(|b| b["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool_result block: {seen}"));
    assert_eq!(tool_use["id"], "toolu_fake", "{seen}");
    assert_eq!(tool_result["tool_use_id"], tool_use["id"], "{seen}");
    assert_eq!(tool_use["name"], "get_weather", "{seen}");
    assert_eq!(
        tool_use["input"],
        json!({"q": answer_text("primary")}),
        "{seen}"
    );
}

async fn openai_n2(sdk: &Sdk, gateway: &Gateway) {
    let r = run(sdk, Api::OpenAi, gateway, &["x-n2", "n2"]).await;
    assert_eq!(r["ok"], false, "{r}");
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("msg-backup/backup-n2 (anthropic-messages) cannot express n > 1"),
        "the refusal names the backup and n > 1: {r}"
    );
    assert!(r["error"]["status"].is_u64(), "an HTTP error: {r}");
    assert_eq!(gateway.backup_saw("backup-n2"), 0);
}

async fn check_openai(sdk: Sdk) {
    let gateway = gateway().await;
    openai_text_answers(&sdk, &gateway).await;
    openai_tool_calls(&sdk, &gateway).await;
    openai_cut_after_output(&sdk, &gateway).await;
    openai_agent_loop(&sdk, &gateway).await;
    openai_n2(&sdk, &gateway).await;
}

// ---- Anthropic SDK clients ---------------------------------------------------

/// The whole of a text answer an Anthropic client read from
/// `backup_model`, translated or not.
fn check_anthropic_answer(r: &Value, mode: &str, backup_model: &str, seen: &Value) {
    assert_eq!(r["ok"], true, "{mode}: {r}");
    assert_eq!(r["text"], answer_text("backup"), "{mode}: {r}");
    assert_eq!(r["stop_reason"], "end_turn", "{mode}: {r}");
    assert_eq!(r["model"], backup_model, "{mode}: {r}");
    let id = r["id"].as_str().unwrap_or_default();
    assert!(id.starts_with("msg_"), "{mode}: id {id}: {r}");
    if mode == "stream" {
        assert_eq!(r["stopped"], true, "message_stop: {r}");
    } else {
        assert_eq!(r["type"], "message", "{r}");
        assert_eq!(r["role"], "assistant", "{r}");
    }
    assert_eq!(
        r["usage"],
        json!({"input_tokens": fake_input_tokens(seen), "output_tokens": output_tokens()}),
        "{mode}: usage as the fake reported it: {r}"
    );
}

async fn anthropic_text_answers(sdk: &Sdk, gateway: &Gateway) {
    for mode in ["stream", "once"] {
        // The chat primary is rate limited: the Messages backup's answer,
        // as it came.
        let r = run(sdk, Api::Anthropic, gateway, &["x-chat429-msg", mode]).await;
        let seen = gateway.backup_last("backup-msg", &r);
        check_anthropic_answer(&r, mode, "backup-msg", &seen);
        assert_eq!(r["id"], "msg_fake", "{r}");

        // The Messages primary is overloaded: the chat backup's answer,
        // translated.
        let r = run(sdk, Api::Anthropic, gateway, &["x-msg529-chat", mode]).await;
        let seen = gateway.backup_last("backup-chat", &r);
        check_anthropic_answer(&r, mode, "backup-chat", &seen);
    }
}

async fn anthropic_tool_calls(sdk: &Sdk, gateway: &Gateway) {
    // The chat backup's tool call, read as a tool_use block.
    for mode in ["tools-stream", "tools-once"] {
        let r = run(sdk, Api::Anthropic, gateway, &["x-msg529-chat", mode]).await;
        assert_eq!(r["ok"], true, "{mode}: {r}");
        assert_eq!(
            tool_call(&r),
            expected_tool_call(Api::Anthropic, "backup"),
            "{mode}: {r}"
        );
        assert_eq!(r["stop_reason"], "tool_use", "{mode}: {r}");
        assert_eq!(r["text"], "", "{mode}: no text: {r}");
        let id = r["id"].as_str().unwrap_or_default();
        assert!(id.starts_with("msg_"), "{mode}: {r}");
        let seen = gateway.backup_last("backup-chat", &r);
        assert_eq!(
            seen["tools"][0]["function"]["name"], "get_weather",
            "{seen}"
        );
        assert_eq!(
            r["usage"],
            json!({"input_tokens": fake_input_tokens(&seen), "output_tokens": output_tokens()}),
            "{mode}: {r}"
        );
        if mode == "tools-stream" {
            assert!(r["argument_deltas"].as_u64() > Some(1), "streamed: {r}");
        }
    }
}

async fn anthropic_cut_after_output(sdk: &Sdk, gateway: &Gateway) {
    // One content chunk from the chat primary, then a reset: exactly that
    // text, then an error; nothing from the backup.
    let r = run(sdk, Api::Anthropic, gateway, &["x-chat-reset", "stream"]).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["text"], "primary-tok0 ", "{r}");
    assert_eq!(r["deltas"], 1, "{r}");
    assert!(r["error"]["class"].is_string(), "{r}");
    assert!(r["stopped"].is_null(), "no message_stop: {r}");
    assert_eq!(gateway.backup_saw("backup-after-chat-reset"), 0);
}

async fn anthropic_agent_loop(sdk: &Sdk, gateway: &Gateway) {
    let r = run(
        sdk,
        Api::Anthropic,
        gateway,
        &["x-agent-msg", "agent", "x-agent-msg-then-chat"],
    )
    .await;
    let first = &r["turn1"];
    assert_eq!(first["ok"], true, "{r}");
    assert_eq!(
        tool_call(first),
        expected_tool_call(Api::Anthropic, "primary"),
        "turn 1, from the Messages target: {r}"
    );
    assert_eq!(first["stop_reason"], "tool_use", "{r}");
    let second = &r["turn2"];
    assert_eq!(second["ok"], true, "{r}");
    assert_eq!(second["stop_reason"], "tool_use", "{r}");
    assert_eq!(
        tool_call(second),
        expected_tool_call(Api::Anthropic, "backup"),
        "turn 2, from the chat target: {r}"
    );
    assert!(gateway.primary_saw("p-agent-msg529#fault:status=529") >= 1);
    // The chat target got the history with the Messages id translated,
    // call and result alike.
    let seen = gateway.backup_last("agent-chat-turn2", &r);
    let messages = seen["messages"].as_array().unwrap();
    let assistant = messages
        .iter()
        .find(|m| m["role"] == "assistant")
        .unwrap_or_else(|| panic!("no assistant message: {seen}"));
    let tool = messages
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("no tool message: {seen}"));
    let call = &assistant["tool_calls"][0];
    assert_eq!(call["id"], "call_fake", "{seen}");
    assert_eq!(tool["tool_call_id"], call["id"], "{seen}");
    assert_eq!(call["function"]["name"], "get_weather", "{seen}");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("arguments are JSON text ({e}): {seen}"));
    assert_eq!(arguments, json!({"q": answer_text("primary")}), "{seen}");
}

async fn check_anthropic(sdk: Sdk) {
    let gateway = gateway().await;
    anthropic_text_answers(&sdk, &gateway).await;
    anthropic_tool_calls(&sdk, &gateway).await;
    anthropic_cut_after_output(&sdk, &gateway).await;
    anthropic_agent_loop(&sdk, &gateway).await;
}

#[tokio::test]
async fn the_python_openai_sdk_reads_messages_targets_translated() {
    if let Some(sdk) = sdk::python("OPENAI_SDK_PYTHON", "openai", "translate_openai.py").await {
        check_openai(sdk).await;
    }
}

#[tokio::test]
async fn the_node_openai_sdk_reads_messages_targets_translated() {
    if let Some(sdk) = sdk::node("OPENAI_SDK_NODE_PATH", "openai", "translate_openai.cjs").await {
        check_openai(sdk).await;
    }
}

#[tokio::test]
async fn the_python_anthropic_sdk_reads_chat_targets_translated() {
    if let Some(sdk) = sdk::python(
        "ANTHROPIC_SDK_PYTHON",
        "anthropic",
        "translate_anthropic.py",
    )
    .await
    {
        check_anthropic(sdk).await;
    }
}

#[tokio::test]
async fn the_node_anthropic_sdk_reads_chat_targets_translated() {
    if let Some(sdk) = sdk::node(
        "ANTHROPIC_SDK_NODE_PATH",
        "@anthropic-ai/sdk",
        "translate_anthropic.cjs",
    )
    .await
    {
        check_anthropic(sdk).await;
    }
}
