//! Every action transition is a tracing event with the action id, the
//! attempt id and the states before and after.
//!
//! Alone in its own test binary with a global subscriber: tracing caches
//! per-callsite interest, which a thread-local subscriber cannot rely on
//! while other tests run in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt, service_fn};
use tower_llm_actions::{
    ActionExecutorLayer, ActionId, MemoryStore, Reconciliation, ToolCall, reconcile_fn,
};
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
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut visitor = Visitor(BTreeMap::new());
        event.record(&mut visitor);
        self.0.lock().unwrap().push(visitor.0);
    }
}

#[tokio::test(start_paused = true)]
async fn every_transition_is_a_tracing_event_with_ids_and_states() {
    let captured = Captured::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(captured.clone()))
        .unwrap();

    // A payment effect that is applied but whose response is lost.
    let charges: Arc<Mutex<HashMap<ActionId, Value>>> = Arc::default();
    let effects = Arc::new(AtomicUsize::new(0));
    let executor = {
        let charges = Arc::clone(&charges);
        let effects = Arc::clone(&effects);
        service_fn(move |call: ToolCall| {
            effects.fetch_add(1, Ordering::SeqCst);
            charges
                .lock()
                .unwrap()
                .insert(call.action_id.clone(), json!({ "charge": "ch_1" }));
            async { std::future::pending::<Result<Value, BoxError>>().await }
        })
    };
    let lookup = {
        let charges = Arc::clone(&charges);
        reconcile_fn(move |call: ToolCall| {
            let found = charges.lock().unwrap().get(&call.action_id).cloned();
            async move {
                Ok::<_, BoxError>(
                    found.map_or(Reconciliation::NotApplied, Reconciliation::Succeeded),
                )
            }
        })
    };
    let store = Arc::new(MemoryStore::new());
    let mut service = ServiceBuilder::new()
        .layer(
            ActionExecutorLayer::new(store)
                .effect_timeout(Duration::from_secs(5))
                .reconciler(lookup),
        )
        .service(executor);

    let call = |attempt: &str| {
        ToolCall::new("pay-10", "charge_card", json!({ "amount": 1 })).with_attempt_id(attempt)
    };
    let err = service
        .ready()
        .await
        .unwrap()
        .call(call("attempt-1"))
        .await
        .unwrap_err();
    assert!(err.is_unknown());
    let receipt = service
        .ready()
        .await
        .unwrap()
        .call(call("attempt-2"))
        .await
        .unwrap();
    assert_eq!(receipt, json!({ "charge": "ch_1" }));
    assert_eq!(effects.load(Ordering::SeqCst), 1);

    let events = captured.0.lock().unwrap().clone();
    let transitions: Vec<[&str; 5]> = events
        .iter()
        .filter(|e| e.get("message").map(String::as_str) == Some("action transition"))
        .map(|e| {
            [
                e["action_id"].as_str(),
                e["attempt_id"].as_str(),
                e["before"].as_str(),
                e["after"].as_str(),
                e["cause"].as_str(),
            ]
        })
        .collect();
    assert_eq!(
        transitions,
        [
            ["pay-10", "attempt-1", "not_started", "running", "claim"],
            ["pay-10", "attempt-1", "running", "unknown", "timeout"],
            ["pay-10", "attempt-2", "unknown", "succeeded", "reconcile"],
        ]
    );
    // The reconciliation itself is on record too.
    assert!(events.iter().any(|e| e.get("message").map(String::as_str)
        == Some("action reconciled")
        && e.get("answer").map(String::as_str) == Some("succeeded")));
}
