//! End to end over 127.0.0.1: fake upstreams and the gateway run
//! in-process on free ports, and a real HTTP client checks what it receives
//! and how many attempts each upstream saw.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::{FakeUpstream, Fault};

/// A gateway in front of `primary` and `backup`, with `extra` TOML appended
/// to `[budget]` and `[failover]` sections given as text.
struct Setup {
    primary: FakeUpstream,
    backup: FakeUpstream,
    gateway: app::Running,
}

async fn setup(budget: &str, failover: &str, routes: &str) -> Setup {
    // The primary has a long answer to cut; the backup a short whole one.
    let primary = FakeUpstream::builder("primary")
        .tokens(100)
        .start()
        .await
        .unwrap();
    let backup = FakeUpstream::builder("backup")
        .tokens(8)
        .start()
        .await
        .unwrap();
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[budget]
deadline_ms = 10000
first_token_timeout_ms = 2000
idle_timeout_ms = 2000
{budget}

[failover]
max_retries_per_target = 0
shutdown_grace_ms = 5000
{failover}

[[providers]]
name = "primary"
base_url = "{}"

[[providers]]
name = "backup"
base_url = "{}"
{routes}
"#,
        primary.base_url(),
        backup.base_url()
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = app::serve(gateway, listener);
    Setup {
        primary,
        backup,
        gateway,
    }
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

async fn post(setup: &Setup, body: &str) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{}/v1/chat/completions", setup.gateway.addr))
        .header("content-type", "application/json")
        .header("authorization", "Bearer client-secret-never-forwarded")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), client.request(request))
        .await
        .expect("the gateway answers in time")
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
        .await
        .expect("the body ends in time")
        .unwrap()
        .to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

fn chat(model: &str, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "Tell me about caching."}]
    })
    .to_string()
}

fn events(body: &str) -> Vec<&str> {
    body.split_terminator("\n\n").collect()
}

/// Every `data:` payload parses as JSON (or is `[DONE]`).
fn assert_clean_sse(body: &str) {
    for event in events(body) {
        let data = event
            .strip_prefix("data: ")
            .expect("one data line per event");
        if data != "[DONE]" {
            serde_json::from_str::<serde_json::Value>(data).expect("every data line is JSON");
        }
    }
}

#[tokio::test]
async fn rate_limit_before_any_output_is_rerouted_and_the_client_sees_one_voice() {
    let s = setup("", "", "").await;
    s.primary
        .set_fault("status=429;error=quota".parse::<Fault>().unwrap());
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body.matches("backup-tok").count(), 8);
    assert!(!reply.body.contains("primary"), "{}", reply.body);
    assert!(reply.body.ends_with("data: [DONE]\n\n"));
    assert_clean_sse(&reply.body);
    assert_eq!((s.primary.attempts(), s.backup.attempts()), (1, 1));
    assert_eq!(reply.headers["x-failover-attempts"], "2");
    assert_eq!(reply.headers["x-failover-target"], "backup");
}

#[tokio::test]
async fn in_band_error_after_the_role_chunk_is_rerouted_invisibly() {
    let s = setup("", "", "").await;
    s.primary
        .set_fault("error_after=0;error=rate_limit".parse::<Fault>().unwrap());
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert_eq!(reply.status, 200);
    assert!(!reply.body.contains("primary"), "{}", reply.body);
    assert_eq!(reply.body.matches("backup-tok").count(), 8);
    assert_eq!(s.backup.attempts(), 1);
}

#[tokio::test]
async fn forty_tokens_then_an_in_band_429_ends_with_a_terminal_chunk() {
    let s = setup("", "", "").await;
    s.primary
        .set_fault("error_after=40;error=rate_limit".parse::<Fault>().unwrap());
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body.matches("primary-tok").count(), 40);
    assert!(!reply.body.contains("backup"));
    assert_eq!(s.backup.attempts(), 0, "never a second voice after commit");
    let all = events(&reply.body);
    assert_eq!(all.len(), 1 + 40 + 2);
    let terminal: serde_json::Value =
        serde_json::from_str(all[41].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(terminal["choices"][0]["finish_reason"], "error");
    assert_eq!(terminal["error"]["code"], "rate_limit_exceeded");
    assert_eq!(terminal["error"]["output_events"], 40);
    assert_eq!(all[42], "data: [DONE]");
    assert_clean_sse(&reply.body);
}

#[tokio::test]
async fn a_reset_after_tokens_ends_with_a_terminal_chunk() {
    let s = setup("", "", "").await;
    s.primary
        .set_fault("reset_after=5".parse::<Fault>().unwrap());
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert_eq!(reply.body.matches("primary-tok").count(), 5);
    let all = events(&reply.body);
    assert!(all[all.len() - 2].contains("\"finish_reason\":\"error\""));
    assert_eq!(all[all.len() - 1], "data: [DONE]");
    assert_eq!(s.backup.attempts(), 0);
    assert_clean_sse(&reply.body);
}

#[tokio::test]
async fn a_silent_primary_is_rerouted_at_the_head_timeout() {
    let s = setup("head_timeout_ms = 300", "", "").await;
    s.primary.set_fault(Fault::NoResponse);
    let started = std::time::Instant::now();
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert_eq!(reply.status, 200);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!((s.primary.attempts(), s.backup.attempts()), (1, 1));
    assert!(!reply.body.contains("primary"));
}

#[tokio::test]
async fn a_silent_primary_is_rerouted_at_the_first_token_timeout_by_default() {
    // No head timeout configured: the first token timeout bounds the head.
    let s = setup("", "", "").await;
    s.primary.set_fault(Fault::NoResponse);
    let started = std::time::Instant::now();
    let reply = post(&s, &chat("gpt-4o", true)).await;
    let elapsed = started.elapsed();
    assert_eq!(reply.status, 200);
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    assert_eq!((s.primary.attempts(), s.backup.attempts()), (1, 1));
}

#[tokio::test]
async fn a_slow_first_token_is_rerouted_within_the_first_token_timeout() {
    let s = setup("", "", "").await;
    s.primary
        .set_fault("slow_first_token=5000".parse::<Fault>().unwrap());
    let started = std::time::Instant::now();
    let reply = post(&s, &chat("gpt-4o", true)).await;
    let elapsed = started.elapsed();
    assert_eq!(reply.status, 200);
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    assert!(!reply.body.contains("primary"));
    assert_eq!(reply.body.matches("backup-tok").count(), 8);
}

#[tokio::test]
async fn non_streaming_requests_fail_over_too() {
    let s = setup("", "", "").await;
    s.primary.set_fault("status=401".parse::<Fault>().unwrap());
    let reply = post(&s, &chat("gpt-4o", false)).await;
    assert_eq!(reply.status, 200);
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert!(
        json["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("backup-tok0")
    );
    assert_eq!(json["usage"]["completion_tokens"], 8);
    assert_eq!((s.primary.attempts(), s.backup.attempts()), (1, 1));
}

#[tokio::test]
async fn a_cut_inside_the_commit_window_is_rerouted_and_a_cut_after_it_is_not() {
    let s = setup("", "commit_output_events = 64", "").await;
    s.primary
        .set_fault("reset_after=40".parse::<Fault>().unwrap());
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert!(
        !reply.body.contains("primary"),
        "the cut primary never reached the client"
    );
    assert_eq!(reply.body.matches("backup-tok").count(), 8);
    assert!(reply.body.ends_with("data: [DONE]\n\n"));

    let s = setup("", "commit_output_events = 64", "").await;
    s.primary
        .set_fault("reset_after=80".parse::<Fault>().unwrap());
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert_eq!(reply.body.matches("primary-tok").count(), 80);
    assert_eq!(s.backup.attempts(), 0);
    assert!(reply.body.contains("\"finish_reason\":\"error\""));
}

#[tokio::test]
async fn every_option_spent_gives_one_openai_error() {
    let s = setup("", "", "").await;
    s.primary.set_fault("status=503".parse::<Fault>().unwrap());
    s.backup.set_fault("status=500".parse::<Fault>().unwrap());
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert_eq!(reply.status, 503);
    let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("overloaded from primary"), "{message}");
    assert!(message.contains("2 attempts"), "{message}");
}

#[tokio::test]
async fn bad_requests_never_reach_an_upstream() {
    let s = setup("", "max_request_bytes = 2048", "").await;
    for (body, status) in [
        ("not json".to_owned(), 400),
        (r#"{"model":"gpt-4o"}"#.to_owned(), 400),
        (r#"{"messages":[]}"#.to_owned(), 400),
        (chat(&"x".repeat(4096), true), 413),
    ] {
        let reply = post(&s, &body).await;
        assert_eq!(reply.status, status, "{body:.40}");
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert!(json["error"]["message"].is_string());
    }
    assert_eq!(s.primary.attempts() + s.backup.attempts(), 0);
}

/// The model paths are served past axum's router for `POST` only: any
/// other method there is still `405` with `allow: POST`, a near path is
/// still `404`, and neither reaches an upstream.
#[tokio::test]
async fn only_a_post_on_a_model_path_reaches_a_model_route() {
    let s = setup("", "", "").await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let send = |method: &str, path: &str| {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", s.gateway.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(chat("primary", false))))
            .unwrap();
        let response = client.request(request);
        async move {
            let response = tokio::time::timeout(Duration::from_secs(20), response)
                .await
                .expect("the gateway answers in time")
                .unwrap();
            let allow = response.headers().get("allow").cloned();
            (response.status(), allow)
        }
    };
    for path in ["/v1/chat/completions", "/v1/messages", "/v1/responses"] {
        for method in ["GET", "PUT", "DELETE"] {
            let (status, allow) = send(method, path).await;
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert_eq!(allow.unwrap(), "POST", "{method} {path}");
        }
        let (status, _) = send("POST", &format!("{path}/")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "POST {path}/");
        let (status, _) = send("POST", &path.to_uppercase()).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "POST {}",
            path.to_uppercase()
        );
    }
    assert_eq!(s.primary.attempts() + s.backup.attempts(), 0);
    // And a POST there is a turn.
    let reply = post(&s, &chat("primary", false)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(s.primary.attempts(), 1);
}

#[tokio::test]
async fn the_client_credential_and_model_are_replaced_per_target() {
    let routes = r#"
[[routes]]
model = "gpt-*"
targets = [
  { provider = "primary" },
  { provider = "backup", model = "backup-model", context_window = 200000, tools = true },
]
"#;
    let s = setup("", "", routes).await;
    s.primary
        .set_fault("status=429;error=quota".parse::<Fault>().unwrap());
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert_eq!(reply.status, 200);
    let primary_seen = &s.primary.requests()[0];
    let backup_seen = &s.backup.requests()[0];
    assert_eq!(primary_seen.model(), Some("gpt-4o"));
    assert_eq!(backup_seen.model(), Some("backup-model"));
    assert!(backup_seen.header("authorization").is_none());
    assert!(primary_seen.header("authorization").is_none());
    assert!(
        reply.body.contains("\"model\":\"backup-model\""),
        "the answering model's own name"
    );
    // An unrouted model is a 404, before any upstream.
    let reply = post(&s, &chat("claude-x", true)).await;
    assert_eq!(reply.status, 404);
}

#[tokio::test]
async fn models_lists_names_a_client_can_ask_for_and_a_pattern_is_refused() {
    let routes = r#"
[[routes]]
model = "gpt-*"
models = ["gpt-4o", "gpt-4o-mini"]
targets = [{ provider = "primary" }]

[[routes]]
model = "claude-x"
targets = [{ provider = "backup" }]

[[routes]]
model = "other-*"
targets = [{ provider = "backup" }]
"#;
    let s = setup("", "", routes).await;
    let models = get_json(&s, "/v1/models").await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["gpt-4o", "gpt-4o-mini", "claude-x"], "no patterns");
    assert_eq!(get_json(&s, "/healthz").await["status"], "ok");

    // The literal pattern is not a model: refused before any upstream.
    let reply = post(&s, &chat("gpt-*", true)).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.contains("invalid_model"), "{}", reply.body);
    assert_eq!((s.primary.attempts(), s.backup.attempts()), (0, 0));
    // A listed name is served.
    let reply = post(&s, &chat("gpt-4o", true)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(s.primary.attempts(), 1);
}

#[tokio::test]
async fn shutdown_lets_a_running_stream_finish() {
    let s = setup("", "", "").await;
    let addr = s.gateway.addr;
    let Setup {
        primary,
        backup,
        gateway,
    } = s;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat(
            "gpt-4o#fault:tokens=20;pace_ms=25",
            true,
        ))))
        .unwrap();
    let response = client.request(request).await.unwrap();
    // The stream is running; stop the gateway now.
    let shutdown = tokio::spawn(gateway.shutdown(Duration::from_secs(5)));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&body).unwrap();
    assert_eq!(text.matches("primary-tok").count(), 20, "the whole answer");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert!(shutdown.await.unwrap(), "finished within the grace period");
    // And it no longer accepts.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    drop((primary, backup));
}

#[test]
fn route_patterns_match_models_without_splitting_characters() {
    use app::pattern_matches;
    assert!(pattern_matches("gpt-*", "gpt-4o"));
    assert!(pattern_matches("*", "anything"));
    assert!(pattern_matches("*-mini", "gpt-4o-mini"));
    assert!(pattern_matches("a*b*c", "a-x-b-y-c"));
    assert!(!pattern_matches("a*b*c", "a-x-c"));
    assert!(!pattern_matches("gpt-*", "claude"));
    assert!(
        !pattern_matches("ab*ba", "aba"),
        "prefix and suffix may not overlap"
    );
    assert!(
        !pattern_matches("*-mini", "ab€€"),
        "no slicing inside a character"
    );
    assert!(pattern_matches("€*€", "€x€"));
}

/// A glob of `*` only, by backtracking: what a route pattern means.
fn glob(pattern: &[u8], model: &[u8]) -> bool {
    match pattern.split_first() {
        None => model.is_empty(),
        Some((b'*', rest)) => (0..=model.len()).any(|at| glob(rest, &model[at..])),
        Some((byte, rest)) => model.first() == Some(byte) && glob(rest, &model[1..]),
    }
}

proptest::proptest! {
    #[test]
    fn route_patterns_match_as_globs(pattern in "[ab*€]{0,7}", model in "[ab€]{0,7}") {
        proptest::prop_assert_eq!(
            app::pattern_matches(&pattern, &model),
            glob(pattern.as_bytes(), model.as_bytes()),
            "pattern {:?}, model {:?}", pattern, model
        );
    }
}

async fn get_json(setup: &Setup, path: &str) -> serde_json::Value {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .get(
            format!("http://{}{path}", setup.gateway.addr)
                .parse()
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn two_routes_share_one_health_registry_and_it_is_served_as_json() {
    let routes = r#"
[[routes]]
model = "fast"
targets = [
  { provider = "primary", model = "shared#fault:status=429;retry_after=200" },
  { provider = "backup", model = "backup-model" },
]

[[routes]]
model = "smart"
targets = [
  { provider = "primary", model = "shared#fault:status=429;retry_after=200" },
  { provider = "backup", model = "backup-model" },
]
"#;
    let s = setup("", "", routes).await;
    let fast = post(&s, &chat("fast", true)).await;
    assert_eq!(fast.headers["x-failover-target"], "backup/backup-model");
    assert_eq!(s.primary.attempts(), 1);
    // The other route learned the cooldown: straight to the backup.
    let smart = post(&s, &chat("smart", true)).await;
    assert_eq!(smart.status, 200);
    assert_eq!(smart.headers["x-failover-target"], "backup/backup-model");
    assert_eq!(smart.headers["x-failover-attempts"], "1");
    assert_eq!(s.primary.attempts(), 1, "the primary is not touched again");

    let health = get_json(&s, "/v1/health/targets").await;
    let keys = health["data"].as_array().unwrap();
    let primary: Vec<_> = keys.iter().filter(|k| k["provider"] == "primary").collect();
    assert_eq!(primary.len(), 1, "{health}");
    assert_eq!(primary[0]["state"], "cooling", "{health}");
    assert_eq!(primary[0]["scope"], "model");
    assert_eq!(primary[0]["last_class"], "rate_limited");
    assert_eq!(primary[0]["failure_streak"], 1);
    let remaining = primary[0]["cooling_remaining_ms"].as_u64().unwrap();
    assert!(remaining > 190_000 && remaining <= 200_000, "{remaining}");
    assert!(
        keys.iter()
            .filter(|k| k["provider"] == "backup")
            .all(|k| k["state"] == "healthy"),
        "{health}"
    );
}

#[tokio::test]
async fn a_model_the_client_named_that_the_provider_does_not_know_is_a_404_not_a_reroute() {
    let routes = r#"
[[routes]]
model = "*"
targets = [{ provider = "primary" }, { provider = "backup", model = "backup-model" }]
"#;
    let s = setup("", "", routes).await;
    let unknown = post(&s, &chat("nope#fault:status=404", true)).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(unknown.body.contains("model_not_found"), "{}", unknown.body);
    assert_eq!(s.backup.attempts(), 0, "never another model's answer");
    // Nothing cooled: the next valid request reaches the primary.
    let valid = post(&s, &chat("gpt-x", true)).await;
    assert_eq!(valid.status, 200);
    assert_eq!(valid.headers["x-failover-target"], "primary");
    assert_eq!(s.primary.attempts(), 2);
}

#[tokio::test]
async fn a_route_hedges_a_slow_primary_and_closes_the_losers_connection() {
    let routes = r#"
[[routes]]
model = "gpt-*"
hedge_after_ms = 300
hedge_budget_percent = 100
targets = [{ provider = "primary" }, { provider = "backup" }]
"#;
    let s = setup("", "", routes).await;
    // The role chunk at once (held), the first output only after 5 s.
    s.primary
        .set_fault("slow_first_token=5000".parse::<Fault>().unwrap());
    let started = std::time::Instant::now();
    let reply = post(&s, &chat("gpt-4o", true)).await;
    let elapsed = started.elapsed();
    assert_eq!(reply.status, 200);
    // Served by the hedge, long before the 2 s first-output timeout.
    assert!(elapsed < Duration::from_millis(1_500), "{elapsed:?}");
    assert_eq!(reply.body.matches("backup-tok").count(), 8);
    assert!(!reply.body.contains("primary"), "{}", reply.body);
    assert_eq!(reply.headers["x-failover-attempts"], "2");
    assert_eq!(reply.headers["x-failover-target"], "backup");
    assert_eq!(reply.headers["x-failover-served-attempt"], "2");
    assert_eq!((s.primary.attempts(), s.backup.attempts()), (1, 1));
    // The loser's connection was closed: the provider stops generating.
    let closed = async {
        while s.primary.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3), closed)
        .await
        .expect("the primary's connection is closed");
}

#[test]
fn hedge_settings_that_do_not_make_a_policy_are_refused_at_start() {
    for (settings, why) in [
        (
            "hedge_after_ms = 300\nhedge_after_percentile = 95",
            "not both",
        ),
        ("hedge_after_percentile = 100", "within 1 and 99.9"),
        ("hedge_budget_percent = 5", "need hedge_after_ms"),
        (
            "hedge_after_ms = 300\nhedge_after_floor_ms = 100",
            "goes with hedge_after_percentile",
        ),
    ] {
        let config = format!(
            r#"
listen = "127.0.0.1:0"

[[providers]]
name = "primary"
base_url = "http://127.0.0.1:9/v1"

[[routes]]
model = "gpt-*"
{settings}
targets = [{{ provider = "primary" }}]
"#
        );
        let config = app::Config::from_toml(&config).unwrap();
        let Err(error) = app::Gateway::from_config(&config) else {
            panic!("{settings}: accepted");
        };
        assert!(error.to_string().contains(why), "{settings}: {error}");
    }
}
