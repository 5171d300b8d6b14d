//! The gateway's telemetry end to end over 127.0.0.1: scripted
//! failovers, then `GET /metrics` scraped and checked (and validated by
//! `promtool check metrics` when it is installed: `.ci/run` installs it),
//! one JSON log line per attempt, and spans and metrics exported over
//! OTLP/HTTP to an in-test receiver that decodes the protobuf.
//!
//! One test in its own binary: it installs the process-wide subscriber and
//! metrics recorder, as the gateway's `main` does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;

/// What the OTLP receiver got.
#[derive(Default)]
struct Received {
    traces: Vec<ExportTraceServiceRequest>,
    metrics: Vec<ExportMetricsServiceRequest>,
}

/// An OTLP/HTTP receiver on loopback decoding protobuf bodies.
async fn otlp_receiver() -> (String, Arc<Mutex<Received>>) {
    use axum::extract::State;
    let received = Arc::new(Mutex::new(Received::default()));
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(
                |State(r): State<Arc<Mutex<Received>>>, body: Bytes| async move {
                    let request = ExportTraceServiceRequest::decode(body).unwrap();
                    r.lock().unwrap().traces.push(request);
                    StatusCode::OK
                },
            ),
        )
        .route(
            "/v1/metrics",
            axum::routing::post(
                |State(r): State<Arc<Mutex<Received>>>, body: Bytes| async move {
                    let request = ExportMetricsServiceRequest::decode(body).unwrap();
                    r.lock().unwrap().metrics.push(request);
                    StatusCode::OK
                },
            ),
        )
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), received)
}

/// Log lines written by the subscriber, for the test to read.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

async fn chat(addr: std::net::SocketAddr, model: &str) -> (StatusCode, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = format!(
        r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let request = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .get(format!("http://{addr}{path}").parse().unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// The value of the sample of `name` whose labels include every `with`.
fn sample(text: &str, name: &str, with: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| {
            with.iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .reduce(|a, b| a + b)
}

fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn string(span: &Span, key: &str) -> Option<String> {
    match attribute(span, key) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match attribute(span, key) {
        Some(Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}

/// `promtool check metrics` on the scrape: skipped with a loud warning
/// locally when promtool is missing, a failure under CI.
fn promtool_check(text: &str) {
    let ci = std::env::var("CI")
        .map(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1"))
        .unwrap_or(false);
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => {
            assert!(
                !ci,
                "promtool is needed under CI=true (Debian package prometheus): {error}"
            );
            eprintln!(
                "!!! WARNING: promtool not found ({error}): `promtool check metrics` SKIPPED"
            );
            return;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    // promtool exits 0 for valid text; lint warnings (e.g. on names) are
    // printed but only errors fail.
    assert!(
        output.status.success(),
        "promtool check metrics failed:\n{}\n{}\n{text}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The gateway config: OTLP export to `otlp`, JSON logs, and two routes
/// whose first target fails (a quota error before any token; a reset
/// after 5 tokens) with `backup` behind it.
fn telemetry_config(otlp: &str, primary: &FakeUpstream, backup: &FakeUpstream) -> app::Config {
    app::Config::from_toml(&format!(
        r#"
listen = "127.0.0.1:0"

[budget]
deadline_ms = 10000
first_token_timeout_ms = 2000
idle_timeout_ms = 2000

[failover]
max_retries_per_target = 0

[telemetry]
log_format = "json"
otlp_endpoint = "{otlp}"
otlp_metrics_interval_ms = 600000

[[providers]]
name = "primary"
base_url = "{primary}"

[[providers]]
name = "primary-billing"
base_url = "{primary}"

[[providers]]
name = "backup"
base_url = "{backup}"

[[routes]]
model = "demo-failover"
targets = [
  {{ provider = "primary-billing", model = "primary-model#fault:status=429;error=quota" }},
  {{ provider = "backup", model = "backup-model" }},
]

[[routes]]
model = "demo-cut"
targets = [
  {{ provider = "primary", model = "primary-model#fault:reset_after=5" }},
  {{ provider = "backup", model = "backup-model" }},
]
"#,
        primary = primary.base_url(),
        backup = backup.base_url(),
    ))
    .unwrap()
}

/// The scrape counts each attempt, turn, terminal chunk and reroute where
/// it landed.
fn check_attempt_and_turn_metrics(text: &str, billing: &str, cut: &str) {
    assert_eq!(
        sample(
            text,
            "failover_attempts_total",
            &[
                ("failover_target", billing),
                ("failover_phase", "preamble"),
                ("failover_class", "quota_exhausted"),
                ("failover_decision", "reroute"),
            ]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            text,
            "failover_attempts_total",
            &[
                ("failover_target", cut),
                ("failover_phase", "committed"),
                ("failover_decision", "committed"),
            ]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            text,
            "failover_attempts_total",
            &[("failover_target", cut), ("failover_class", "none")]
        ),
        None,
        "the cut attempt failed: {text}"
    );
    for (outcome, count) in [
        ("after_hop", 1.0),
        ("first_try", 1.0),
        ("ended_after_commit", 1.0),
    ] {
        assert_eq!(
            sample(
                text,
                "failover_turns_total",
                &[("failover_outcome", outcome)]
            ),
            Some(count),
            "{outcome}: {text}"
        );
    }
    assert_eq!(
        sample(
            text,
            "failover_terminal_chunks_total",
            &[("failover_target", cut)]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            text,
            "failover_reroutes_total",
            &[("failover_target", billing)]
        ),
        Some(1.0),
        "{text}"
    );
}

/// The scrape shows the spent credential cooling, the retry budget and the
/// convention histograms, and passes `promtool check metrics`.
fn check_health_budget_and_histograms(text: &str, billing: &str) {
    assert_eq!(
        sample(
            text,
            "failover_cooldowns_total",
            &[
                ("failover_scope", "account"),
                ("gen_ai_provider_name", "primary-billing")
            ]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            text,
            "failover_health_state",
            &[
                ("gen_ai_provider_name", "primary-billing"),
                ("failover_scope", "account"),
                ("failover_state", "cooling"),
            ]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(text, "failover_retry_budget_deposits_total", &[]),
        Some(3.0),
        "{text}"
    );
    // The default budget: a reserve of 10/s for 10 s (100 extra attempts),
    // plus a fifth per first attempt, less the two hops (deposits may
    // have expired by the scrape, never the reserve).
    let level = sample(text, "failover_retry_budget_level", &[]).expect(text);
    assert!((98.0..=100.0).contains(&level), "{level}: {text}");
    // Histograms, not summaries: buckets summed over instances, with the
    // library's boundaries.
    for name in [
        "gen_ai_client_operation_duration",
        "gen_ai_server_time_to_first_token",
        "gen_ai_client_token_usage",
        "failover_attempts_per_turn",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} histogram")),
            "{name}: {text}"
        );
    }
    assert!(!text.contains("quantile="), "{text}");
    assert!(
        sample(
            text,
            "gen_ai_client_operation_duration_bucket",
            &[("le", "0.01")]
        )
        .is_some(),
        "{text}"
    );
    assert_eq!(
        sample(text, "failover_attempts_per_turn_bucket", &[("le", "+Inf")]),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(
            text,
            "gen_ai_client_operation_duration_count",
            &[
                ("failover_target", billing),
                ("error_type", "quota_exhausted")
            ]
        ),
        Some(1.0),
        "{text}"
    );
    assert!(text.contains("gen_ai_server_time_to_first_token"), "{text}");
    assert_eq!(
        sample(text, "failover_attempts_per_turn_count", &[]),
        Some(3.0),
        "{text}"
    );
    promtool_check(text);
}

/// One JSON line per turn (3), and per attempt that went wrong (2: the
/// reroute and the cut; the two clean commits are DEBUG lines, below the
/// default filter).
fn check_log_lines(logs: &Logs, cut: &str) {
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let of = |target: &str| {
        lines
            .iter()
            .filter(|l| l["target"] == target)
            .cloned()
            .collect::<Vec<_>>()
    };
    let attempts = of("tower_llm_failover::attempt");
    assert_eq!(attempts.len(), 2, "{logs}");
    assert!(attempts.iter().all(|l| l["level"] == "INFO"), "{logs}");
    assert_eq!(attempts[0]["fields"]["decision"], "reroute");
    assert_eq!(attempts[0]["fields"]["bytes_flushed"], 0);
    let cut_line = attempts
        .iter()
        .find(|l| l["fields"]["target"] == cut)
        .unwrap();
    assert_eq!(cut_line["fields"]["phase"], "committed");
    assert!(cut_line["fields"]["bytes_flushed"].as_u64().unwrap() > 0);
    assert_eq!(of("tower_llm_failover::turn").len(), 3, "{logs}");
}

/// The OTLP attempt spans carry the failure and the commit, as children
/// of their turn's span.
fn check_spans(received: &Received, billing: &str, cut: &str) {
    let spans: Vec<&Span> = received
        .traces
        .iter()
        .flat_map(|r| &r.resource_spans)
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .collect();
    let failed = spans
        .iter()
        .find(|s| string(s, "failover.target").as_deref() == Some(billing))
        .unwrap_or_else(|| panic!("no attempt span of {billing}: {spans:#?}"));
    assert_eq!(
        failed.name,
        "chat primary-model#fault:status=429;error=quota"
    );
    assert_eq!(
        string(failed, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(
        string(failed, "gen_ai.provider.name").as_deref(),
        Some("primary-billing")
    );
    assert_eq!(
        string(failed, "failover.phase").as_deref(),
        Some("preamble")
    );
    assert_eq!(
        int(failed, "failover.bytes_flushed"),
        Some(0),
        "{:?}",
        failed.attributes
    );
    assert_eq!(
        string(failed, "failover.decision").as_deref(),
        Some("reroute")
    );
    assert_eq!(
        string(failed, "error.type").as_deref(),
        Some("quota_exhausted")
    );
    let committed = spans
        .iter()
        .find(|s| string(s, "failover.target").as_deref() == Some(cut))
        .unwrap();
    assert_eq!(
        string(committed, "failover.phase").as_deref(),
        Some("committed")
    );
    assert!(int(committed, "failover.bytes_flushed").unwrap() > 0);
    // Attempt spans are children of their turn's span.
    let turn = spans
        .iter()
        .find(|s| s.span_id == failed.parent_span_id)
        .unwrap();
    assert_eq!(
        string(turn, "failover.outcome").as_deref(),
        Some("after_hop")
    );
    // The conventions' name, with the client's model: the turn span
    // starts once the request is read.
    assert_eq!(turn.name, "chat demo-failover");
    assert_eq!(
        string(turn, "gen_ai.request.model").as_deref(),
        Some("demo-failover")
    );
}

/// The OTLP metrics export carries the attempt, turn and duration metrics.
fn check_otlp_metric_names(received: &Received) {
    let metric_names: Vec<&str> = received
        .metrics
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| m.name.as_str())
        .collect();
    for name in [
        "failover.attempts",
        "failover.turns",
        "gen_ai.client.operation.duration",
    ] {
        assert!(metric_names.contains(&name), "{name}: {metric_names:?}");
    }
    // Histograms carry the library's boundaries, not the SDK's (made for
    // milliseconds).
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;
    let duration_bounds: Vec<&Vec<f64>> = received
        .metrics
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == "gen_ai.client.operation.duration")
        .filter_map(|m| match &m.data {
            Some(Data::Histogram(h)) => Some(h),
            _ => None,
        })
        .flat_map(|h| &h.data_points)
        .map(|p| &p.explicit_bounds)
        .collect();
    let (_, expected) = tower_llm_failover::observe::HISTOGRAM_BOUNDARIES
        .iter()
        .find(|(name, _)| *name == "gen_ai.client.operation.duration")
        .unwrap();
    assert!(!duration_bounds.is_empty());
    for bounds in duration_bounds {
        assert_eq!(bounds.as_slice(), *expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_logs_and_otlp_tell_where_each_failure_landed() {
    let (otlp, received) = otlp_receiver().await;
    let primary = FakeUpstream::builder("primary")
        .tokens(12)
        .start()
        .await
        .unwrap();
    let backup = FakeUpstream::builder("backup")
        .tokens(6)
        .start()
        .await
        .unwrap();
    let config = telemetry_config(&otlp, &primary, &backup);
    let logs = Logs::default();
    let telemetry =
        tower_llm_gateway::telemetry::Telemetry::install(&config.telemetry, logs.clone()).unwrap();
    let gateway = app::Gateway::from_config(&config)
        .unwrap()
        .with_prometheus(telemetry.prometheus.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::serve(gateway, listener);
    let addr = running.addr;

    // 1: the quota error before any token, then the backup (after a hop).
    // 2: the spent credential rests: the backup answers first.
    // 3: cut after 5 tokens: committed, then ended with a terminal chunk.
    for model in ["demo-failover", "demo-failover", "demo-cut"] {
        let (status, body) = chat(addr, model).await;
        assert_eq!(status, StatusCode::OK, "{model}: {body}");
        assert!(body.ends_with("data: [DONE]\n\n"), "{model}: {body}");
    }

    // The route stacks hold clean attempts and first-try turns
    // (`METRICS_BATCH`): the scrape hands them to the recorder first (the
    // second turn is the first try counted below).
    let text = get(addr, "/metrics").await;
    let billing = "primary-billing/primary-model#fault:status=429;error=quota";
    let cut = "primary/primary-model#fault:reset_after=5";
    check_attempt_and_turn_metrics(&text, billing, cut);
    check_health_budget_and_histograms(&text, billing);
    check_log_lines(&logs, cut);

    // OTLP: every buffered span and metric pushed now.
    let flush = tokio::task::spawn_blocking(move || {
        let flushed = telemetry.flush();
        (telemetry, flushed)
    })
    .await
    .unwrap();
    flush.1.unwrap();
    let received = std::mem::take(&mut *received.lock().unwrap());
    check_spans(&received, billing, cut);
    check_otlp_metric_names(&received);
    drop(received);

    // With no scrape asking, the telemetry's tick hands held figures to
    // the recorder within `UPKEEP_EVERY`.
    let prometheus = flush.0.prometheus.clone();
    let (status, body) = chat(addr, "demo-failover").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first_try = [("failover_outcome", "first_try")];
    let deadline = tokio::time::Instant::now() + 5 * tower_llm_gateway::telemetry::UPKEEP_EVERY;
    loop {
        let text = prometheus.render();
        if sample(&text, "failover_turns_total", &first_try) == Some(2.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tick handed the first-try turn over: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = tokio::task::spawn_blocking(move || flush.0.shutdown()).await;
    running.shutdown(std::time::Duration::from_secs(5)).await;
}
