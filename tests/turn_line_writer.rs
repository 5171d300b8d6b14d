//! A process with a turn-line writer gets each turn's line as facts, in
//! place of the `tower_llm_failover::turn` event; a line the writer
//! declines is the event, as without a writer.
//!
//! Alone in its own test binary: the writer and the subscriber are
//! process-wide.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_failover::observe::{TurnLine, TurnLineWriter, set_turn_line_writer};
use tower_llm_failover::{StopReason, TurnOutcome};
use tower_llm_testing::{FakeProvider, Reply};
use tracing_subscriber::layer::SubscriberExt;

/// What the writer was given: (turn id, attempts, outcome, stop reason,
/// target).
type Facts = (
    String,
    usize,
    TurnOutcome,
    Option<StopReason>,
    Option<String>,
);

/// Keeps every line's facts; declines the turns whose id starts with
/// `declined`.
#[derive(Default)]
struct Kept(Mutex<Vec<Facts>>);

impl TurnLineWriter for Kept {
    fn write(&self, line: &TurnLine<'_>) -> bool {
        let id = line.turn_id.as_str();
        if id.starts_with("declined") {
            return false;
        }
        self.0.lock().unwrap().push((
            id.to_owned(),
            line.attempts,
            line.outcome,
            line.stop_reason,
            line.target.map(str::to_owned),
        ));
        true
    }
}

/// The `tower_llm_failover::turn` events logged, each as its fields
/// `name=value` in order.
#[derive(Clone, Default)]
struct TurnEvents(Arc<Mutex<Vec<Vec<String>>>>);

struct Fields(Vec<String>);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push(format!("{}={value:?}", field.name()));
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={value:?}", field.name()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for TurnEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "tower_llm_failover::turn" {
            let mut fields = Fields(Vec::new());
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
    }
}

#[path = "support/turn_request.rs"]
mod turn_request;
use turn_request::chat;

#[tokio::test(start_paused = true)]
async fn the_writer_gets_each_turns_facts_and_a_declined_line_is_the_event() {
    let events = TurnEvents::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(events.clone()))
        .unwrap();
    let kept = Arc::new(Kept::default());
    assert!(set_turn_line_writer(kept.clone()).is_ok());
    assert!(
        set_turn_line_writer(Arc::new(Kept::default())).is_err(),
        "set once per process"
    );

    let primary = FakeProvider::new("primary").always(Reply::status(
        429,
        r#"{"error":{"message":"quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
    ));
    let backup = FakeProvider::new("backup").always(Reply::completion("backup"));
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .target(Target::new("backup", backup))
        .build();
    for id in ["written", "declined"] {
        let response = failover.clone().oneshot(chat(false, id)).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }

    // The written turn: its facts, and no event.
    let kept = kept.0.lock().unwrap().clone();
    assert_eq!(
        kept,
        [(
            "written".to_owned(),
            2,
            TurnOutcome::AfterHop,
            None,
            Some("backup".to_owned())
        )]
    );
    // The declined one: the event, as without a writer. Its fields, in
    // order, are what a writer writes (the gateway's `TurnLines` writes
    // this line from the facts: change both together).
    assert_eq!(
        *events.0.lock().unwrap(),
        [[
            r#"message="turn""#,
            "run_id=declined",
            // The primary rests after its quota error: the backup first.
            "attempts=1",
            r#"outcome="first_try""#,
            "target=backup",
            "duration_ms=0",
        ]]
    );
}
