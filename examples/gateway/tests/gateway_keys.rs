//! The gateway's client keys over 127.0.0.1: a model request needs a key
//! (401 in each dialect otherwise), a key is limited to its models, its
//! requests per minute and its in-flight slots without touching another
//! key, the key never reaches a provider, and the operator endpoints need
//! the admin key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;

struct Reply {
    status: StatusCode,
    retry_after: Option<String>,
    body: String,
}

async fn send(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = match &body {
        Some(_) => Request::post(format!("http://{addr}{path}")),
        None => Request::get(format!("http://{addr}{path}")),
    }
    .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .expect("answered in time")
        .unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        retry_after,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn chat(model: &str) -> Option<String> {
    Some(format!(
        r#"{{"model":"{model}","stream":false,"messages":[{{"role":"user","content":"hi"}}]}}"#
    ))
}

async fn gateway(extra: &str) -> (FakeUpstream, FakeUpstream, app::Running) {
    gateway_paced(extra, 3, Duration::ZERO).await
}

async fn gateway_paced(
    extra: &str,
    tokens: usize,
    pace: Duration,
) -> (FakeUpstream, FakeUpstream, app::Running) {
    let primary = FakeUpstream::builder("primary")
        .tokens(tokens)
        .pace(pace)
        .start()
        .await
        .unwrap();
    let claude = FakeUpstream::builder("claude")
        .tokens(3)
        .start()
        .await
        .unwrap();
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[[providers]]
name = "primary"
base_url = "{}"

[[providers]]
name = "claude"
base_url = "{}"
dialect = "anthropic"

[[routes]]
model = "gpt-*"
models = ["gpt-4o", "gpt-secret"]
targets = [{{ provider = "primary" }}]

[[routes]]
model = "claude-*"
targets = [{{ provider = "claude" }}]

[admin]
key_sha256 = "{admin}"

[[keys]]
name = "team-a"
key_sha256 = "{a}"
models = ["gpt-4o", "claude-*"]
{extra}

[[keys]]
name = "team-b"
key_sha256 = "{b}"
hide_unlisted_models = true
models = ["gpt-4o", "claude-*"]
"#,
        primary.base_url(),
        claude.base_url(),
        admin = sha256_hex("sk-admin"),
        a = sha256_hex("sk-team-a"),
        b = sha256_hex("sk-team-b"),
    );
    (primary, claude, serve(&config).await)
}

/// The gateway of `config` (TOML), serving on a free loopback port.
async fn serve(config: &str) -> app::Running {
    let config = app::Config::from_toml(config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    app::serve(gateway, listener)
}

fn sha256_hex(secret: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

const A: (&str, &str) = ("authorization", "Bearer sk-team-a");
const B: (&str, &str) = ("x-api-key", "sk-team-b");

#[tokio::test]
async fn a_model_request_needs_a_known_key_and_the_key_stays_here() {
    let (primary, _claude, running) = gateway("").await;
    let addr = running.addr;
    // No key, or an unknown one: 401 in the chat dialect.
    for headers in [vec![], vec![("authorization", "Bearer sk-wrong")]] {
        let reply = send(addr, "/v1/chat/completions", &headers, chat("gpt-4o")).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(json["error"]["code"], "invalid_api_key", "{}", reply.body);
    }
    // ... and in the Messages dialect.
    let messages = Some(
        r#"{"model":"claude-x","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#
            .to_owned(),
    );
    let reply = send(
        addr,
        "/v1/messages",
        &[("x-api-key", "sk-nope")],
        messages.clone(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(json["type"], "error", "{}", reply.body);
    assert_eq!(json["error"]["code"], "invalid_api_key", "{}", reply.body);
    assert!(
        primary.requests().is_empty(),
        "refused requests reach no provider"
    );

    // A known key is answered, by either header, and never forwarded.
    let reply = send(addr, "/v1/chat/completions", &[A], chat("gpt-4o")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reply = send(addr, "/v1/chat/completions", &[B], chat("gpt-4o")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reply = send(addr, "/v1/messages", &[A], messages).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    for seen in primary.requests() {
        assert_eq!(seen.header("authorization"), None);
        assert_eq!(seen.header("x-api-key"), None);
    }
    running.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_key_is_held_to_its_models() {
    let (primary, _claude, running) = gateway("").await;
    let addr = running.addr;
    let reply = send(addr, "/v1/chat/completions", &[A], chat("gpt-secret")).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    assert!(reply.body.contains("model_not_allowed"), "{}", reply.body);
    // A key that may not learn the model exists gets a 404.
    let reply = send(addr, "/v1/chat/completions", &[B], chat("gpt-secret")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);
    assert!(reply.body.contains("model_not_found"), "{}", reply.body);
    assert!(primary.requests().is_empty());
    // The model list shows a key only its own models.
    let reply = send(addr, "/v1/models", &[A], None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body.contains("gpt-4o") && !reply.body.contains("gpt-secret"));
    let reply = send(addr, "/v1/models", &[], None).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    running.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn requests_per_minute_limit_one_key_and_not_another() {
    let (primary, _claude, running) = gateway("requests_per_minute = 2").await;
    let addr = running.addr;
    for _ in 0..2 {
        let reply = send(addr, "/v1/chat/completions", &[A], chat("gpt-4o")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    }
    let reply = send(addr, "/v1/chat/completions", &[A], chat("gpt-4o")).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    assert!(reply.body.contains("rate_limit_exceeded"), "{}", reply.body);
    let seconds: u64 = reply.retry_after.expect("retry-after").parse().unwrap();
    assert!((1..=30).contains(&seconds), "{seconds}");
    // Another key is unaffected.
    let reply = send(addr, "/v1/chat/completions", &[B], chat("gpt-4o")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(primary.requests().len(), 3);
    running.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_key_at_its_in_flight_cap_is_refused_and_another_is_not() {
    // A slow stream holds team-a's one slot.
    let (_primary, _claude, running) =
        gateway_paced("max_in_flight = 1", 10, Duration::from_millis(100)).await;
    let addr = running.addr;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let held = client
        .request(
            Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("authorization", "Bearer sk-team-a")
                .body(Full::new(Bytes::from(
                    r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
                )))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let reply = send(addr, "/v1/chat/completions", &[A], chat("gpt-4o")).await;
    assert_eq!(
        reply.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        reply.body
    );
    assert!(
        reply.body.contains("in_flight_limit_exceeded"),
        "{}",
        reply.body
    );
    assert_eq!(reply.retry_after.as_deref(), Some("1"));
    let reply = send(addr, "/v1/chat/completions", &[B], chat("gpt-4o")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    // The stream's end frees the slot.
    held.into_body().collect().await.unwrap();
    let reply = send(addr, "/v1/chat/completions", &[A], chat("gpt-4o")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    running.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn operator_endpoints_need_the_admin_key() {
    let (_primary, _claude, running) = gateway("").await;
    let addr = running.addr;
    for headers in [vec![], vec![A]] {
        let reply = send(addr, "/v1/health/targets", &headers, None).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
        let reply = send(addr, "/metrics", &headers, None).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
    }
    let admin = [("authorization", "Bearer sk-admin")];
    let reply = send(addr, "/v1/health/targets", &admin, None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    // Liveness stays open for orchestrators.
    assert_eq!(
        send(addr, "/healthz", &[], None).await.status,
        StatusCode::OK
    );
    running.shutdown(Duration::from_secs(1)).await;
}

/// Health that only the provider can cool, over loopback: one key's
/// requests that time out at first output (a slow prompt of its own) cool
/// nothing for the others; the same timeouts from three different keys do.
#[tokio::test]
async fn one_keys_slow_requests_never_cool_the_model_for_the_others() {
    let primary = FakeUpstream::builder("primary")
        .tokens(2)
        .start()
        .await
        .unwrap();
    let backup = FakeUpstream::builder("backup")
        .tokens(2)
        .start()
        .await
        .unwrap();
    let keys: String = ["a", "b", "c", "d"]
        .iter()
        .map(|k| {
            format!(
                "[[keys]]\nname = \"{k}\"\nkey_sha256 = \"{}\"\n",
                sha256_hex(&format!("sk-{k}"))
            )
        })
        .collect();
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[budget]
first_token_timeout_ms = 300
max_attempts = 2

[failover]
max_retries_per_target = 0

[[providers]]
name = "primary"
base_url = "{}"

[[providers]]
name = "backup"
base_url = "{}"

[[routes]]
model = "gpt-4o"
targets = [{{ provider = "primary" }}, {{ provider = "backup" }}]

{keys}
"#,
        primary.base_url(),
        backup.base_url(),
    );
    let running = serve(&config).await;
    let addr = running.addr;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    // Which target answered a streamed request of `key`.
    let answered_by = |key: &'static str| {
        let client = client.clone();
        async move {
            let response = client
                .request(
                    Request::post(format!("http://{addr}/v1/chat/completions"))
                        .header("authorization", format!("Bearer sk-{key}"))
                        .body(Full::new(Bytes::from(
                            r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
                        )))
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let target = response.headers()["x-failover-target"]
                .to_str()
                .unwrap()
                .to_owned();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert!(body.ends_with(b"data: [DONE]\n\n"));
            target
        }
    };
    let slow = || {
        "slow_first_token=2000"
            .parse::<tower_llm_testing::upstream::Fault>()
            .unwrap()
    };
    // Key a: five requests the primary is slow to answer; each moves on.
    primary.set_fault_times(slow(), 5);
    for _ in 0..5 {
        assert_eq!(answered_by("a").await, "backup");
    }
    // Key b's ordinary request right after still goes to the primary.
    assert_eq!(answered_by("b").await, "primary");
    // The same timeouts from three different keys: the model cools.
    primary.set_fault_times(slow(), 3);
    for key in ["b", "c", "d"] {
        assert_eq!(answered_by(key).await, "backup");
    }
    assert_eq!(answered_by("a").await, "backup", "the primary rests");
    running.shutdown(Duration::from_secs(1)).await;
}

/// A key's own daily spend ceiling: its turns are admitted while its
/// spend (reserved, then settled to the real cost) is below it, then
/// refused 402; another key is unaffected.
#[tokio::test]
async fn a_keys_own_spend_ceiling_stops_it_and_no_other_key() {
    let primary = FakeUpstream::builder("primary")
        .tokens(3)
        .start()
        .await
        .unwrap();
    // $1 a token; the fake reports 1 prompt and 3 completion tokens, so
    // every turn really costs $4.
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[[providers]]
name = "primary"
base_url = "{}"

[[routes]]
model = "gpt-4o"
targets = [{{ provider = "primary", input_per_million = 1000000.0, output_per_million = 1000000.0 }}]

[[keys]]
name = "a"
key_sha256 = "{}"
spend_usd_per_day = 10.0

[[keys]]
name = "b"
key_sha256 = "{}"
"#,
        primary.base_url(),
        sha256_hex("sk-a"),
        sha256_hex("sk-b"),
    );
    let running = serve(&config).await;
    let addr = running.addr;
    let body = || {
        Some(
            r#"{"model":"gpt-4o","max_tokens":4,"stream":false,"messages":[{"role":"user","content":"hi"}]}"#
                .to_owned(),
        )
    };
    let key_a = [("authorization", "Bearer sk-a")];
    let mut admitted = 0;
    let refusal = loop {
        let reply = send(addr, "/v1/chat/completions", &key_a, body()).await;
        if reply.status != StatusCode::OK {
            break reply;
        }
        admitted += 1;
        assert!(admitted < 10, "the ceiling never stopped key a");
        // The turn settles to its real cost in the background once its
        // body is done.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // $0, $4 and $8 are below $10; $12 is not.
    assert_eq!(admitted, 3);
    assert_eq!(
        refusal.status,
        StatusCode::PAYMENT_REQUIRED,
        "{}",
        refusal.body
    );
    assert!(
        refusal.body.contains("tenant_spend_ceiling_reached"),
        "{}",
        refusal.body
    );
    assert_eq!(
        primary.requests().len(),
        3,
        "the refused turn reached no provider"
    );
    let reply = send(
        addr,
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-b")],
        body(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    running.shutdown(Duration::from_secs(1)).await;
}
