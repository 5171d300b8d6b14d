//! Client-chosen text in log lines: a model name with a newline and an
//! escape sequence is logged escaped, so a client cannot forge a log line.
//!
//! One test in its own binary: it installs the process-wide subscriber
//! (tracing caches per-callsite interest, which a thread-local subscriber
//! cannot rely on while other tests run on other threads), and no other
//! test here can have installed one first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_llm_failover::failover::Caps;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_testing::{FakeProvider, Reply};

const FORGING_MODEL: &str = "evil\nINFO tower_llm_failover: FORGED \u{1b}[31mred";

struct Answer {
    status: StatusCode,
    body: String,
}

async fn send(failover: &Failover<FakeProvider>, model: &str) -> Answer {
    let body = serde_json::json!({
        "model": model,
        "stream": false,
        "messages": [{"role": "user", "content": "hi"}],
    });
    let request = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = failover.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_model_name_with_a_newline_and_an_escape_is_logged_escaped() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        // DEBUG: the clean commit's attempt line is a DEBUG line.
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    if let Err(error) = tracing::subscriber::set_global_default(subscriber) {
        panic!("this binary's one test could not install its subscriber: {error}");
    }

    // The target passes the client's model upstream, so the attempt
    // record's `upstream_model` is the client's text.
    let primary = FakeProvider::new("primary").then(Reply::status(
        500,
        r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#,
    ));
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let answer = send(&failover, FORGING_MODEL).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let attempt_lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("upstream_model=evil"))
        .collect();
    assert_eq!(attempt_lines.len(), 2, "{log}");
    for line in &attempt_lines {
        assert!(
            line.contains(r"upstream_model=evil\nINFO tower_llm_failover: FORGED \u{1b}[31mred"),
            "{line}"
        );
    }
    assert!(!log.contains('\u{1b}'), "an escape reached the log: {log}");
    assert!(
        !log.lines()
            .any(|line| line.starts_with("INFO tower_llm_failover: FORGED")),
        "a forged line: {log}"
    );
}
