//! The gateway against TLS upstreams, over 127.0.0.1: the provider
//! config's TLS and proxy keys, a whole answer and a post-commit failure
//! over HTTPS, and an untrusted upstream rerouted to the backup.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The library's test support (tests/support/), shared by #[path]: each
// includer uses part of it.
#[allow(dead_code, unreachable_pub)]
#[path = "../../../tests/support/tls.rs"]
mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::{Ca, Proxy, ProxyMode, Scratch, server_config, toml_path};
use tower_llm_gateway::app;
use tower_llm_testing::upstream::{FakeUpstream, Fault};

const LIMIT: Duration = Duration::from_secs(20);

/// A gateway over `primary` then `backup`, each provider entry followed by
/// its extra TOML keys.
async fn gateway(
    primary: &FakeUpstream,
    primary_keys: &str,
    backup: &FakeUpstream,
    backup_keys: &str,
) -> app::Running {
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[budget]
deadline_ms = 10000
first_token_timeout_ms = 2000
idle_timeout_ms = 2000

[failover]
max_retries_per_target = 0
shutdown_grace_ms = 5000

[[providers]]
name = "primary"
base_url = "{}"
connect_timeout_ms = 5000
{primary_keys}

[[providers]]
name = "backup"
base_url = "{}"
connect_timeout_ms = 5000
{backup_keys}
"#,
        primary.base_url(),
        backup.base_url()
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    app::serve(gateway, listener)
}

async fn post(gateway: &app::Running) -> (StatusCode, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = serde_json::json!({
        "model": "gpt-4o",
        "stream": true,
        "messages": [{"role": "user", "content": "Tell me about caching."}]
    })
    .to_string();
    let request = Request::post(format!("http://{}/v1/chat/completions", gateway.addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = tokio::time::timeout(LIMIT, client.request(request))
        .await
        .expect("the gateway answers in time")
        .unwrap();
    let status = response.status();
    let bytes = tokio::time::timeout(LIMIT, response.into_body().collect())
        .await
        .expect("the body ends in time")
        .unwrap()
        .to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

fn events(body: &str) -> Vec<&str> {
    body.split_terminator("\n\n").collect()
}

struct Pki {
    dir: Scratch,
    ca: Ca,
    ca_file: String,
}

fn pki() -> Pki {
    let dir = Scratch::new();
    let ca = Ca::new("gateway test CA");
    let ca_file = toml_path(&dir.write("ca.pem", &ca.pem()));
    Pki { dir, ca, ca_file }
}

async fn tls_upstream(
    pki: &Pki,
    name: &str,
    tokens: usize,
    client_ca: Option<&Ca>,
) -> FakeUpstream {
    let leaf = pki.ca.leaf(&["127.0.0.1"], false);
    FakeUpstream::builder(name)
        .tokens(tokens)
        .tls(server_config(&leaf, client_ca, &[]))
        .start()
        .await
        .unwrap()
}

#[tokio::test]
async fn over_tls_a_whole_answer_and_a_post_commit_reset_ending_in_a_terminal_chunk() {
    let pki = pki();
    let primary = tls_upstream(&pki, "primary", 100, None).await;
    let backup = tls_upstream(&pki, "backup", 8, None).await;
    let trust = format!(r#"ca_file = "{}""#, pki.ca_file);
    let gateway = gateway(&primary, &trust, &backup, &trust).await;

    let (status, body) = post(&gateway).await;
    assert_eq!(status, 200);
    assert_eq!(body.matches("primary-tok").count(), 100, "{body}");
    assert!(body.contains("\"finish_reason\":\"stop\""), "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");

    // Five tokens, then the upstream connection is reset: committed, so
    // the stream ends with a terminal chunk and [DONE], no second voice.
    primary.set_fault("reset_after=5".parse::<Fault>().unwrap());
    let (status, body) = post(&gateway).await;
    assert_eq!(status, 200);
    assert_eq!(body.matches("primary-tok").count(), 5, "{body}");
    assert!(!body.contains("backup"), "{body}");
    let all = events(&body);
    assert!(
        all[all.len() - 2].contains("\"finish_reason\":\"error\""),
        "{body}"
    );
    assert_eq!(all[all.len() - 1], "data: [DONE]");
    assert_eq!(backup.attempts(), 0);
}

#[tokio::test]
async fn an_upstream_signed_by_an_unknown_ca_is_rerouted_to_the_backup() {
    let pki = pki();
    let primary = tls_upstream(&pki, "primary", 100, None).await;
    let backup = tls_upstream(&pki, "backup", 8, None).await;
    // Only the backup trusts the test CA.
    let trust = format!(r#"ca_file = "{}""#, pki.ca_file);
    let gateway = gateway(&primary, "", &backup, &trust).await;

    let (status, body) = post(&gateway).await;
    assert_eq!(status, 200);
    assert_eq!(body.matches("backup-tok").count(), 8, "{body}");
    assert!(!body.contains("primary"), "{body}");
    assert_eq!(primary.attempts(), 0);
    assert_eq!(backup.attempts(), 1);
}

#[tokio::test]
async fn provider_keys_for_a_private_ca_only_a_client_certificate_and_a_proxy() {
    let pki = pki();
    let client_ca = Ca::new("client CA");
    let (cert, key) = client_ca.leaf(&["gateway"], true).write(&pki.dir, "client");
    let primary = tls_upstream(&pki, "primary", 8, Some(&client_ca)).await;
    let backup = FakeUpstream::start("backup").await;
    let proxy = Proxy::start(ProxyMode::Tunnel).await;
    let keys = format!(
        r#"ca_file = "{}"
webpki_roots = false
client_cert_file = "{}"
client_key_file = "{}"
proxy_url = "{}"
no_proxy = "other.example""#,
        pki.ca_file,
        toml_path(&cert),
        toml_path(&key),
        proxy.url()
    );
    let gateway = gateway(&primary, &keys, &backup, "").await;

    let (status, body) = post(&gateway).await;
    assert_eq!(status, 200);
    assert_eq!(body.matches("primary-tok").count(), 8, "{body}");
    assert_eq!(backup.attempts(), 0);
    assert_eq!(proxy.connect_count(), 1);
}

#[tokio::test]
async fn inconsistent_connection_keys_are_config_errors() {
    let pki = pki();
    let build = |keys: &str| {
        let text = format!(
            r#"
[[providers]]
name = "p"
base_url = "https://127.0.0.1:9/v1"
{keys}
"#
        );
        app::Gateway::from_config(&app::Config::from_toml(&text).unwrap()).map(|_| ())
    };
    assert!(build(&format!(r#"ca_file = "{}""#, pki.ca_file)).is_ok());
    let error = build(r#"client_cert_file = "c.pem""#).unwrap_err();
    assert!(error.contains("client_key_file"), "{error}");
    let error = build("proxy_url = \"http://127.0.0.1:3128\"\nproxy_from_env = true").unwrap_err();
    assert!(error.contains("exclude"), "{error}");
    let error = build(r#"no_proxy = "localhost""#).unwrap_err();
    assert!(error.contains("proxy_url"), "{error}");
    let error = build(r#"ca_file = "/nonexistent/ca.pem""#).unwrap_err();
    assert!(
        error.contains("provider p") && error.contains("/nonexistent/ca.pem"),
        "{error}"
    );
    let error = build(r#"proxy_url = "socks5://127.0.0.1:1080""#).unwrap_err();
    assert!(error.contains("http"), "{error}");
    assert!(
        app::Config::from_toml("[[providers]]\nname = \"p\"\nbase_url = \"x\"\nca_fle = \"x\"")
            .is_err()
    );
}
