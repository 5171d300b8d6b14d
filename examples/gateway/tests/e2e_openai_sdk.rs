//! The official OpenAI SDKs (Python `openai`, npm `openai`) as clients of
//! the gateway over 127.0.0.1. `.ci/run` installs both under
//! `target/sdk/`. Without them these tests say so loudly and skip, except
//! under `CI=true`, where a missing SDK fails the test: a CI run that
//! skipped them would report `ok` for something it never checked.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

#[path = "support/sdk.rs"]
mod sdk;
use sdk::Sdk;

use serde_json::Value;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;

const ROUTES: &str = r#"
[[routes]]
model = "sdk-failover"
targets = [
  { provider = "primary-billing", model = "primary-model#fault:status=429;error=quota" },
  { provider = "backup", model = "backup-failover" },
]

[[routes]]
model = "sdk-precommit"
targets = [
  { provider = "primary", model = "primary-model#fault:error_after=0;error=rate_limit" },
  { provider = "backup", model = "backup-precommit" },
]

[[routes]]
model = "sdk-postcommit"
targets = [
  { provider = "primary", model = "primary-model#fault:error_after=40;error=rate_limit;tokens=60" },
  { provider = "backup", model = "backup-postcommit" },
]

[[routes]]
model = "sdk-total"
targets = [
  { provider = "primary", model = "m#fault:status=503" },
  { provider = "backup", model = "m#fault:status=500" },
]
"#;

struct Gateway {
    primary: FakeUpstream,
    backup: FakeUpstream,
    running: app::Running,
}

impl Gateway {
    fn base_url(&self) -> String {
        format!("http://{}/v1", self.running.addr)
    }

    fn backup_saw(&self, model: &str) -> usize {
        self.backup
            .requests()
            .iter()
            .filter(|r| r.model() == Some(model))
            .count()
    }
}

async fn gateway() -> Gateway {
    let primary = FakeUpstream::builder("primary").start().await.unwrap();
    let backup = FakeUpstream::builder("backup").start().await.unwrap();
    let config = format!(
        r#"
[failover]
max_retries_per_target = 0

[[providers]]
name = "primary"
base_url = "{primary}"

# The same upstream behind another credential: its quota failure cools that
# credential only (account scope), not the routes below.
[[providers]]
name = "primary-billing"
base_url = "{primary}"

[[providers]]
name = "backup"
base_url = "{}"
{ROUTES}"#,
        backup.base_url(),
        primary = primary.base_url(),
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

async fn run(sdk: &Sdk, gateway: &Gateway, model: &str, mode: &str) -> Value {
    let mut command = tokio::process::Command::new(&sdk.program);
    command
        .arg(&sdk.script)
        .args([gateway.base_url().as_str(), model, mode])
        .kill_on_drop(true);
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

async fn check_sdk(sdk: Sdk) {
    let gateway = gateway().await;

    // A full answer through failover, streamed and not.
    for mode in ["stream", "once"] {
        let r = run(&sdk, &gateway, "sdk-failover", mode).await;
        assert_eq!(r["ok"], true, "{r}");
        let text = r["text"].as_str().unwrap();
        assert_eq!(text.matches("backup-tok").count(), 8, "{text}");
        assert!(!text.contains("primary"));
        assert_eq!(r["finish_reason"], "stop");
        assert_eq!(
            r["model"], "backup-failover",
            "the answering model's own name"
        );
    }

    // A failure before commit that the SDK never notices.
    let r = run(&sdk, &gateway, "sdk-precommit", "stream").await;
    assert_eq!(r["ok"], true, "{r}");
    assert!(!r["text"].as_str().unwrap().contains("primary"));
    assert_eq!(r["text"].as_str().unwrap().matches("backup-tok").count(), 8);

    // A failure after 40 tokens: the SDK raises an API error with the 40
    // tokens already received and nothing from the backup.
    let r = run(&sdk, &gateway, "sdk-postcommit", "stream").await;
    assert_eq!(r["ok"], false, "{r}");
    let text = r["text"].as_str().unwrap();
    assert_eq!(text.matches("primary-tok").count(), 40, "{text}");
    assert!(!text.contains("backup"));
    assert_eq!(r["error"]["class"], "APIError");
    assert_eq!(r["error"]["code"], "rate_limit_exceeded");
    assert_eq!(gateway.backup_saw("backup-postcommit"), 0);

    // Every option spent: one OpenAI-shaped error the SDK raises on.
    let r = run(&sdk, &gateway, "sdk-total", "stream").await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"]["status"], 503);
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("overloaded from primary"), "{message}");
    assert!(message.contains("2 attempts"), "{message}");

    drop(gateway.primary);
}

#[tokio::test]
async fn the_official_python_sdk_reads_every_outcome_cleanly() {
    if let Some(sdk) = sdk::python("OPENAI_SDK_PYTHON", "openai", "openai_client.py").await {
        check_sdk(sdk).await;
    }
}

#[tokio::test]
async fn the_official_node_sdk_reads_every_outcome_cleanly() {
    if let Some(sdk) = sdk::node("OPENAI_SDK_NODE_PATH", "openai", "openai_client.cjs").await {
        check_sdk(sdk).await;
    }
}
