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

#[tokio::test(start_paused = true)]
async fn a_committed_stream_is_logged_once_with_its_final_figures() {
    let captured = Captured::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(captured.clone()))
        .unwrap();
    let primary = FakeProvider::new("primary").always(Reply::status(
        429,
        r#"{"error":{"message":"quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
    ));
    let backup = FakeProvider::new("backup").always(Reply::stream("backup", 6));
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .target(Target::new("backup", backup))
        .build();
    let request = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let response = failover.oneshot(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));

    let lines = captured.0.lock().unwrap().clone();
    assert_eq!(lines.len(), 2, "one line per attempt: {lines:?}");
    assert_eq!(lines[0]["attempt"], "1");
    assert_eq!(lines[0]["decision"], "reroute");
    assert_eq!(lines[1]["attempt"], "2");
    assert_eq!(lines[1]["decision"], "committed");
    // Logged at the end: the output events are the stream's whole count.
    assert_eq!(lines[1]["output_events"], "6");
}
