//! One log line per attempt: a committed stream is logged once, when it
//! ends, with its final figures.
//!
//! Alone in its own test binary with a global subscriber: tracing caches
//! per-callsite interest, which a thread-local subscriber cannot rely on
//! while other tests run in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_llm_failover::budget::TurnLimits;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_failover::testing::{FakeProvider, Reply};
use tracing_subscriber::layer::SubscriberExt;

type Fields = BTreeMap<&'static str, String>;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<Fields>>>);

struct Visitor(Fields);

impl tracing::field::Visit for Visitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "tower_llm_failover::attempt" {
            let mut visitor = Visitor(Fields::new());
            event.record(&mut visitor);
            self.0.lock().unwrap().push(visitor.0);
        }
    }
}

/// The global capture, installed once for the binary's tests.
fn captured() -> &'static Captured {
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(captured.clone()),
        )
        .unwrap();
        captured
    })
}

/// The attempt lines of one turn.
fn lines_of(run_id: &str) -> Vec<Fields> {
    captured()
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.get("run_id").map(String::as_str) == Some(run_id))
        .cloned()
        .collect()
}

fn chat(stream: bool, run_id: &str) -> Request<Full<Bytes>> {
    let body = format!(
        r#"{{"model":"m","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let mut request = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    request
        .extensions_mut()
        .insert(TurnLimits::new().start_with_run_id(run_id.into()));
    request
}

#[tokio::test(start_paused = true)]
async fn a_committed_stream_is_logged_once_with_its_final_figures() {
    captured();
    let primary = FakeProvider::new("primary").always(Reply::status(
        429,
        r#"{"error":{"message":"quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
    ));
    let backup = FakeProvider::new("backup").always(Reply::stream("backup", 6));
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .target(Target::new("backup", backup))
        .build();
    let response = failover.oneshot(chat(true, "stream-turn")).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));

    let lines = lines_of("stream-turn");
    assert_eq!(lines.len(), 2, "one line per attempt: {lines:?}");
    assert_eq!(lines[0]["attempt"], "1");
    assert_eq!(lines[0]["decision"], "reroute");
    assert_eq!(lines[1]["attempt"], "2");
    assert_eq!(lines[1]["decision"], "committed");
    // Logged at the end: the output events are the stream's whole count.
    assert_eq!(lines[1]["output_events"], "6");
}

#[tokio::test(start_paused = true)]
async fn an_attempt_cut_short_by_a_cancelled_turn_still_leaves_its_line() {
    captured();
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .build();
    // The client gives up after a second, long before any timeout.
    let turn = failover.oneshot(chat(false, "cancelled-turn"));
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(1), turn)
            .await
            .is_err()
    );
    assert_eq!(primary.calls(), 1);
    let lines = lines_of("cancelled-turn");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["class"], "cancelled");
    assert_eq!(lines[0]["decision"], "stop");
    assert_eq!(lines[0]["bytes_flushed"], "0");
}
