//! The gateway's default text log over 127.0.0.1: one line per turn (and
//! one per attempt that went wrong), each carrying its run id, and no span
//! context before them (`[telemetry] log_span_context` is off by default:
//! the log layer is never told of spans, so it keeps none of their fields).
//!
//! One test in its own binary: it installs the process-wide subscriber.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_llm_gateway::{app, telemetry::Telemetry};
use tower_llm_testing::upstream::{FakeUpstream, Fault};

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

#[tokio::test]
async fn default_text_lines_carry_their_run_id_and_no_span_context() {
    let primary = FakeUpstream::builder("primary").start().await.unwrap();
    let backup = FakeUpstream::builder("backup").start().await.unwrap();
    primary.set_fault("status=500".parse::<Fault>().unwrap());
    let config = app::Config::from_toml(&format!(
        r#"
listen = "127.0.0.1:0"

[failover]
max_retries_per_target = 0

[[providers]]
name = "primary"
base_url = "{}"

[[providers]]
name = "backup"
base_url = "{}"
"#,
        primary.base_url(),
        backup.base_url()
    ))
    .unwrap();
    let logs = Logs::default();
    let _telemetry = Telemetry::install(&config.telemetry, logs.clone()).unwrap();
    let gateway = app::serve(app::Gateway::from_config(&config).unwrap(), {
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()
    });
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{}/v1/chat/completions", gateway.addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let run_id = response.headers()["x-failover-run-id"]
        .to_str()
        .unwrap()
        .to_owned();
    response.into_body().collect().await.unwrap();
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&format!("run_id={run_id}")))
        .collect();
    // The failed attempt (INFO), and the turn; the clean attempt is DEBUG.
    assert_eq!(ours.len(), 2, "{text}");
    assert!(
        ours.iter().any(|l| l.contains("decision=\"reroute\"")),
        "{text}"
    );
    assert!(
        ours.iter().any(|l| l.contains("outcome=\"after_hop\"")),
        "{text}"
    );
    for line in &ours {
        assert!(
            !line.contains("failover.turn{") && !line.contains("failover.attempt{"),
            "no span context: {line}"
        );
    }
}
