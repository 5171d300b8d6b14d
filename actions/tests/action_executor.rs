//! The idempotent executor layer against a fake payment system that counts
//! the effects it applies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt, service_fn};
use tower_llm_actions::{
    ActionError, ActionExecutorLayer, ActionId, ActionState, ActionStore, ArgumentsDigest,
    BoxFuture, Disposition, MemoryStore, Reconciler, Reconciliation, StoreError, ToolCall,
    ToolSchemas, UnknownReason, reconcile_fn,
};

/// What the fake payment system does with the next call.
#[derive(Debug, Clone, Copy)]
enum Script {
    /// Charge and answer.
    Apply,
    /// Charge, then never answer: the response is lost.
    ApplyThenHang,
    /// Never get to charging, never answer.
    Hang,
    /// Take this long, then charge and answer.
    ApplyAfter(Duration),
    /// Refuse without charging.
    Refuse { retryable: bool },
    /// Fail in a way that leaves open whether the charge happened (it did).
    ApplyThenAmbiguousError,
}

#[derive(Debug)]
struct PaymentError {
    message: &'static str,
    retryable: bool,
    ambiguous: bool,
}

impl fmt::Display for PaymentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message)
    }
}

impl std::error::Error for PaymentError {}

fn classify(error: &PaymentError) -> Disposition {
    if error.ambiguous {
        Disposition::Unknown
    } else if error.retryable {
        Disposition::Retryable
    } else {
        Disposition::Final
    }
}

/// The external system: charges keyed by action id, and counters.
#[derive(Debug, Default)]
struct Payments {
    charges: Mutex<HashMap<ActionId, Value>>,
    /// Charges applied: the number the tests are about.
    effects: AtomicUsize,
    /// Calls that reached the executor at all.
    calls: AtomicUsize,
    script: Mutex<VecDeque<Script>>,
}

impl Payments {
    fn scripted(script: impl IntoIterator<Item = Script>) -> Arc<Self> {
        let payments = Self::default();
        payments.script.lock().unwrap().extend(script);
        Arc::new(payments)
    }

    fn effects(&self) -> usize {
        self.effects.load(Ordering::SeqCst)
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn charge(&self, call: &ToolCall) -> Value {
        self.effects.fetch_add(1, Ordering::SeqCst);
        let receipt = json!({
            "charge": format!("ch_{}", call.action_id),
            "amount": call.arguments["amount"],
        });
        self.charges
            .lock()
            .unwrap()
            .insert(call.action_id.clone(), receipt.clone());
        receipt
    }

    async fn execute(&self, call: ToolCall) -> Result<Value, PaymentError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let next = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Script::Apply);
        match next {
            Script::Apply => Ok(self.charge(&call)),
            Script::ApplyThenHang => {
                self.charge(&call);
                std::future::pending().await
            }
            Script::Hang => std::future::pending().await,
            Script::ApplyAfter(delay) => {
                tokio::time::sleep(delay).await;
                Ok(self.charge(&call))
            }
            Script::Refuse { retryable } => Err(PaymentError {
                message: if retryable {
                    "processor busy"
                } else {
                    "card blocked"
                },
                retryable,
                ambiguous: false,
            }),
            Script::ApplyThenAmbiguousError => {
                self.charge(&call);
                Err(PaymentError {
                    message: "connection reset after sending",
                    retryable: false,
                    ambiguous: true,
                })
            }
        }
    }
}

/// Asks the payment system whether a charge exists for the action id.
#[derive(Debug)]
struct LookupCharge {
    payments: Arc<Payments>,
    asked: AtomicUsize,
}

impl Reconciler for LookupCharge {
    fn reconcile<'a>(
        &'a self,
        call: &'a ToolCall,
    ) -> BoxFuture<'a, Result<Reconciliation, BoxError>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let found = self
            .payments
            .charges
            .lock()
            .unwrap()
            .get(&call.action_id)
            .cloned();
        Box::pin(async move {
            Ok(match found {
                Some(receipt) => Reconciliation::Succeeded(receipt),
                None => Reconciliation::NotApplied,
            })
        })
    }
}

type Executor = tower::util::BoxCloneService<ToolCall, Value, ActionError>;

fn executor_with(payments: &Arc<Payments>, layer: ActionExecutorLayer) -> Executor {
    let payments = Arc::clone(payments);
    let service = ServiceBuilder::new()
        .layer(layer.classify_errors(classify))
        .service(service_fn(move |call: ToolCall| {
            let payments = Arc::clone(&payments);
            async move { payments.execute(call).await }
        }));
    tower::util::BoxCloneService::new(service)
}

fn charge(action_id: &str, attempt_id: &str) -> ToolCall {
    ToolCall::new(
        action_id,
        "charge_card",
        json!({ "amount": 4200, "currency": "eur" }),
    )
    .with_attempt_id(attempt_id)
}

async fn submit(executor: &mut Executor, call: ToolCall) -> Result<Value, ActionError> {
    executor.ready().await?.call(call).await
}

const TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test(start_paused = true)]
async fn ambiguity_with_reconciler_returns_the_stored_result_with_one_effect() {
    let payments = Payments::scripted([Script::ApplyThenHang]);
    let store = Arc::new(MemoryStore::new());
    let reconciler = Arc::new(LookupCharge {
        payments: Arc::clone(&payments),
        asked: AtomicUsize::new(0),
    });
    let layer = ActionExecutorLayer::new(store.clone())
        .effect_timeout(TIMEOUT)
        .reconciler(Arc::clone(&reconciler));
    let mut executor = executor_with(&payments, layer);
    let id = ActionId::from("pay-847");

    // The executor applies the charge, the response is lost, the call times out.
    let err = submit(&mut executor, charge("pay-847", "attempt-1"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ActionError::NeedsReconciliation { reason: UnknownReason::TimedOut(t), .. } if t == TIMEOUT),
        "{err}"
    );
    assert_eq!(store.state(&id).await.unwrap(), ActionState::Unknown);
    assert_eq!(payments.effects(), 1);

    // A second attempt with the same action id asks the payment system, which
    // has the charge: its receipt is stored and returned.
    let receipt = submit(&mut executor, charge("pay-847", "attempt-2"))
        .await
        .unwrap();
    assert_eq!(receipt, json!({ "charge": "ch_pay-847", "amount": 4200 }));
    assert_eq!(
        store.state(&id).await.unwrap(),
        ActionState::Succeeded {
            result: receipt.clone()
        }
    );
    // Later calls replay it without asking again.
    let again = submit(&mut executor, charge("pay-847", "attempt-3"))
        .await
        .unwrap();
    assert_eq!(again, receipt);

    assert_eq!(payments.effects(), 1, "exactly one charge");
    assert_eq!(payments.calls(), 1, "the executor ran once");
    assert_eq!(reconciler.asked.load(Ordering::SeqCst), 1);
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(record.attempts, ["attempt-1", "attempt-2", "attempt-3"]);
}

#[tokio::test(start_paused = true)]
async fn ambiguity_without_reconciler_stays_unknown_with_one_effect() {
    let payments = Payments::scripted([Script::ApplyThenHang]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(
        &payments,
        ActionExecutorLayer::new(store.clone()).effect_timeout(TIMEOUT),
    );

    let err = submit(&mut executor, charge("pay-847", "attempt-1"))
        .await
        .unwrap_err();
    assert!(err.is_unknown(), "{err}");
    for attempt in ["attempt-2", "attempt-3"] {
        let err = submit(&mut executor, charge("pay-847", attempt))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ActionError::NeedsReconciliation { reason: UnknownReason::NoReconciler, ref action_id }
                    if action_id.as_str() == "pay-847"
            ),
            "{err}"
        );
    }
    // Time passing does not make it safe to repeat either.
    tokio::time::advance(Duration::from_secs(24 * 3600)).await;
    assert!(
        submit(&mut executor, charge("pay-847", "attempt-4"))
            .await
            .unwrap_err()
            .is_unknown()
    );
    assert_eq!(
        store.state(&"pay-847".into()).await.unwrap(),
        ActionState::Unknown
    );
    assert_eq!(payments.effects(), 1, "exactly one charge");
    assert_eq!(payments.calls(), 1, "never a blind repeat");
}

#[tokio::test(start_paused = true)]
async fn an_effect_the_reconciler_finds_not_applied_runs_exactly_once() {
    // The first call hangs before charging; the reconciler finds nothing.
    let payments = Payments::scripted([Script::Hang]);
    let store = Arc::new(MemoryStore::new());
    let reconciler = LookupCharge {
        payments: Arc::clone(&payments),
        asked: AtomicUsize::new(0),
    };
    let mut executor = executor_with(
        &payments,
        ActionExecutorLayer::new(store.clone())
            .effect_timeout(TIMEOUT)
            .reconciler(reconciler),
    );
    assert!(
        submit(&mut executor, charge("pay-1", "a1"))
            .await
            .unwrap_err()
            .is_unknown()
    );
    assert_eq!(payments.effects(), 0);

    let receipt = submit(&mut executor, charge("pay-1", "a2")).await.unwrap();
    assert_eq!(receipt["charge"], "ch_pay-1");
    let record = store.get(&"pay-1".into()).await.unwrap().unwrap();
    assert_eq!(record.run.get(), 2);
    assert_eq!(
        submit(&mut executor, charge("pay-1", "a3")).await.unwrap(),
        receipt
    );
    assert_eq!(payments.effects(), 1);
    assert_eq!(payments.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_reconciler_that_cannot_tell_leaves_the_action_unknown() {
    let payments = Payments::scripted([Script::ApplyThenHang]);
    let store = Arc::new(MemoryStore::new());
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let mut executor = executor_with(
        &payments,
        ActionExecutorLayer::new(store.clone())
            .effect_timeout(TIMEOUT)
            .reconciler(reconcile_fn(move |_call| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, BoxError>(Reconciliation::StillUnknown) }
            })),
    );
    submit(&mut executor, charge("pay-2", "a1"))
        .await
        .unwrap_err();
    let err = submit(&mut executor, charge("pay-2", "a2"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ActionError::NeedsReconciliation {
                reason: UnknownReason::StillUnknown,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.state(&"pay-2".into()).await.unwrap(),
        ActionState::Unknown
    );
    assert_eq!(payments.effects(), 1);
    assert_eq!(payments.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_ambiguous_executor_error_turns_the_action_unknown() {
    let payments = Payments::scripted([Script::ApplyThenAmbiguousError]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(&payments, ActionExecutorLayer::new(store.clone()));
    let err = submit(&mut executor, charge("pay-3", "a1"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ActionError::NeedsReconciliation { reason: UnknownReason::EffectError(ref m), .. }
            if m == "connection reset after sending"),
        "{err}"
    );
    assert!(
        submit(&mut executor, charge("pay-3", "a2"))
            .await
            .unwrap_err()
            .is_unknown()
    );
    assert_eq!(
        store.state(&"pay-3".into()).await.unwrap(),
        ActionState::Unknown
    );
    assert_eq!(payments.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropping_the_running_effect_leaves_it_unknown() {
    let payments = Payments::scripted([Script::ApplyThenHang]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(
        &payments,
        ActionExecutorLayer::new(store.clone()).effect_timeout(Duration::from_secs(3600)),
    );
    let pending = tokio::spawn({
        let mut executor = executor.clone();
        async move { submit(&mut executor, charge("pay-4", "a1")).await }
    });
    while payments.effects() == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        store.state(&"pay-4".into()).await.unwrap(),
        ActionState::Running
    );
    // The client goes away: the turn's future is dropped mid-effect.
    pending.abort();
    assert!(pending.await.unwrap_err().is_cancelled());
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        store.state(&"pay-4".into()).await.unwrap(),
        ActionState::Unknown
    );
    assert!(
        submit(&mut executor, charge("pay-4", "a2"))
            .await
            .unwrap_err()
            .is_unknown()
    );
    assert_eq!(payments.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn duplicate_proposals_from_two_model_attempts_apply_once() {
    let payments = Payments::scripted([]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(&payments, ActionExecutorLayer::new(store.clone()));

    // The primary model proposed the call and it ran; then the primary's
    // stream was cut and the backup model proposes the same call, with its own
    // tool_call id and its arguments written differently.
    let primary = ToolCall::from_openai(
        "order-847/charge",
        &json!({ "id": "call_primary", "type": "function", "function": {
            "name": "charge_card", "arguments": "{\"amount\":4200,\"currency\":\"eur\"}" } }),
    )
    .unwrap()
    .with_attempt_id("turn-1/primary");
    let backup = ToolCall::from_openai(
        "order-847/charge",
        &json!({ "id": "toolu_backup", "type": "function", "function": {
            "name": "charge_card", "arguments": "{ \"currency\": \"eur\", \"amount\": 4200 }" } }),
    )
    .unwrap()
    .with_attempt_id("turn-1/backup");

    let first = submit(&mut executor, primary).await.unwrap();
    let second = submit(&mut executor, backup).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(payments.effects(), 1);
    assert_eq!(payments.calls(), 1);
    let record = store
        .get(&"order-847/charge".into())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.attempts, ["turn-1/primary", "turn-1/backup"]);
}

#[tokio::test(start_paused = true)]
async fn a_concurrent_duplicate_waits_for_the_first_and_gets_its_result() {
    let payments = Payments::scripted([Script::ApplyAfter(Duration::from_secs(2))]);
    let store = Arc::new(MemoryStore::new());
    let executor = executor_with(
        &payments,
        ActionExecutorLayer::new(store.clone()).in_progress_wait(Duration::from_secs(10)),
    );
    let mut primary = executor.clone();
    let mut backup = executor.clone();
    let (a, b) = tokio::join!(
        submit(&mut primary, charge("pay-5", "primary")),
        submit(&mut backup, charge("pay-5", "backup")),
    );
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(payments.effects(), 1);
    assert_eq!(payments.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_concurrent_duplicate_past_its_wait_gets_in_progress() {
    let payments = Payments::scripted([Script::ApplyAfter(Duration::from_secs(20))]);
    let store = Arc::new(MemoryStore::new());
    let layer = ActionExecutorLayer::new(store.clone()).in_progress_wait(Duration::from_secs(1));
    let executor = executor_with(&payments, layer);
    let mut primary = executor.clone();
    let mut backup = executor.clone();
    let (a, b) = tokio::join!(submit(&mut primary, charge("pay-6", "primary")), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        submit(&mut backup, charge("pay-6", "backup")).await
    },);
    assert_eq!(a.unwrap()["charge"], "ch_pay-6");
    let err = b.unwrap_err();
    assert!(
        matches!(err, ActionError::InProgress { ref action_id } if action_id.as_str() == "pay-6"),
        "{err}"
    );
    assert!(err.is_retryable());
    assert_eq!(payments.effects(), 1);
    assert_eq!(payments.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_submissions_over_fifty_ids_apply_fifty_effects() {
    let payments = Payments::scripted(
        // Give every first run a little latency so duplicates overlap it.
        std::iter::repeat_n(Script::ApplyAfter(Duration::from_millis(5)), 50),
    );
    let store = Arc::new(MemoryStore::new());
    // Half the callers wait for the running call, half answer at once.
    let patient = executor_with(
        &payments,
        ActionExecutorLayer::new(store.clone()).in_progress_wait(Duration::from_secs(30)),
    );
    let impatient = executor_with(
        &payments,
        ActionExecutorLayer::new(store.clone()).in_progress_wait(Duration::ZERO),
    );
    let mut tasks = Vec::new();
    for i in 0..1_000usize {
        let mut executor = if i % 2 == 0 {
            patient.clone()
        } else {
            impatient.clone()
        };
        tasks.push(tokio::spawn(async move {
            let id = format!("pay-{}", i % 50);
            let result = submit(&mut executor, charge(&id, &format!("attempt-{i}"))).await;
            (id, i % 2 == 0, result)
        }));
    }
    let mut answered = 0;
    let mut in_progress = 0;
    for task in tasks {
        let (id, patient, result) = task.await.unwrap();
        match result {
            Ok(receipt) => {
                assert_eq!(
                    receipt,
                    json!({ "charge": format!("ch_{id}"), "amount": 4200 })
                );
                answered += 1;
            }
            Err(ActionError::InProgress { action_id }) => {
                assert!(!patient, "a patient caller of {id} got in-progress");
                assert_eq!(action_id.as_str(), id);
                in_progress += 1;
            }
            Err(other) => panic!("{id}: unexpected {other}"),
        }
    }
    assert_eq!(answered + in_progress, 1_000);
    assert!(
        answered >= 500,
        "every patient caller gets the stored result"
    );
    assert_eq!(payments.effects(), 50, "exactly one effect per action id");
    assert_eq!(payments.calls(), 50);
    assert_eq!(payments.charges.lock().unwrap().len(), 50);
    for i in 0..50 {
        let record = store
            .get(&format!("pay-{i}").into())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.run.get(), 1);
        assert!(matches!(record.state, ActionState::Succeeded { .. }));
    }
}

#[tokio::test(start_paused = true)]
async fn a_retryable_failure_runs_again_on_the_next_call() {
    let payments = Payments::scripted([Script::Refuse { retryable: true }, Script::Apply]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(&payments, ActionExecutorLayer::new(store.clone()));

    let err = submit(&mut executor, charge("pay-7", "a1"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ActionError::Failed { retryable: true, ref error, .. } if error.message == "processor busy"),
        "{err}"
    );
    assert!(matches!(
        store.state(&"pay-7".into()).await.unwrap(),
        ActionState::Failed {
            retryable: true,
            ..
        }
    ));
    let receipt = submit(&mut executor, charge("pay-7", "a2")).await.unwrap();
    assert_eq!(receipt["charge"], "ch_pay-7");
    assert_eq!(
        submit(&mut executor, charge("pay-7", "a3")).await.unwrap(),
        receipt
    );
    assert_eq!(
        payments.calls(),
        2,
        "ran again once after the retryable failure"
    );
    assert_eq!(payments.effects(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_final_failure_returns_the_stored_error() {
    let payments = Payments::scripted([Script::Refuse { retryable: false }]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(&payments, ActionExecutorLayer::new(store.clone()));
    for attempt in ["a1", "a2", "a3"] {
        let err = submit(&mut executor, charge("pay-8", attempt))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ActionError::Failed { retryable: false, ref error, .. } if error.message == "card blocked"),
            "{err}"
        );
        assert!(!err.is_retryable());
    }
    assert_eq!(payments.calls(), 1, "a final failure never runs again");
    assert_eq!(payments.effects(), 0);
}

fn chat_request_tools() -> Value {
    json!({
        "model": "gpt-4o",
        "messages": [],
        "tools": [{
            "type": "function",
            "function": {
                "name": "charge_card",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "amount": { "type": "integer", "minimum": 1 },
                        "currency": { "type": "string", "enum": ["eur", "usd"] },
                        "card": { "$ref": "#/$defs/card" }
                    },
                    "required": ["amount", "currency"],
                    "additionalProperties": false,
                    "$defs": { "card": { "type": "object", "properties": { "last4": { "type": "string", "pattern": "^[0-9]{4}$" } } } }
                }
            }
        }]
    })
}

#[tokio::test(start_paused = true)]
async fn invalid_arguments_are_rejected_before_the_executor_sees_them() {
    let payments = Payments::scripted([]);
    let store = Arc::new(MemoryStore::new());
    let schemas = ToolSchemas::from_request(&chat_request_tools()).unwrap();
    let mut executor = executor_with(
        &payments,
        ActionExecutorLayer::new(store.clone()).schemas(schemas),
    );

    let cases = [
        (json!({ "amount": "4200", "currency": "eur" }), "/amount"),
        (json!({ "amount": 0, "currency": "eur" }), "/amount"),
        (json!({ "amount": 4200 }), "/currency"),
        (json!({ "amount": 4200, "currency": "gbp" }), "/currency"),
        (
            json!({ "amount": 1, "currency": "eur", "card": { "last4": "12a4" } }),
            "/card/last4",
        ),
        (json!([4200, "eur"]), ""),
    ];
    for (n, (arguments, expected_path)) in cases.into_iter().enumerate() {
        let call = ToolCall::new(format!("bad-{n}"), "charge_card", arguments.clone());
        let err = submit(&mut executor, call).await.unwrap_err();
        match err {
            ActionError::InvalidArguments {
                tool,
                path,
                message,
            } => {
                assert_eq!(tool, "charge_card");
                assert_eq!(path, expected_path, "{arguments}: {message}");
                assert!(!message.is_empty());
            }
            other => panic!("{arguments}: expected invalid arguments, got {other}"),
        }
        assert_eq!(
            store.state(&format!("bad-{n}").into()).await.unwrap(),
            ActionState::NotStarted,
            "no claim for invalid arguments"
        );
    }
    let err = submit(&mut executor, ToolCall::new("x", "refund", json!({})))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ActionError::UnknownTool { ref tool } if tool == "refund"),
        "{err}"
    );
    assert_eq!(payments.calls(), 0, "the executor saw nothing");
    assert!(store.is_empty());

    // A valid call goes through.
    let ok = ToolCall::new(
        "good",
        "charge_card",
        json!({ "amount": 5, "currency": "usd", "card": { "last4": "4242" } }),
    );
    assert!(submit(&mut executor, ok).await.is_ok());
    assert_eq!(payments.effects(), 1);
}

#[test]
fn schemas_with_remote_refs_are_refused_not_fetched() {
    for target in [
        "https://example.com/schemas/charge.json",
        "http://127.0.0.1:9/schema.json",
        "file:///etc/passwd",
    ] {
        let schema = json!({ "type": "object", "properties": { "card": { "$ref": target } } });
        let err = ToolSchemas::new()
            .with_tool("charge_card", &schema)
            .unwrap_err();
        assert_eq!(err.tool, "charge_card");
        assert!(!err.message.is_empty(), "{target}");
    }
    // Malformed tool lists are errors too, not panics.
    assert!(
        ToolSchemas::from_request(&json!({ "tools": [{ "type": "function", "function": {} }] }))
            .is_err()
    );
    assert!(
        ToolSchemas::from_request(
            &json!({ "tools": [{ "function": { "name": "f", "parameters": { "type": 7 } } }] })
        )
        .is_err()
    );
    // A function without parameters takes any object.
    let schemas =
        ToolSchemas::from_request(&json!([{ "type": "function", "function": { "name": "ping" } }]))
            .unwrap();
    assert!(schemas.contains("ping"));
    assert!(
        schemas
            .validate(&ToolCall::new("p", "ping", json!({})))
            .is_ok()
    );
    assert!(
        schemas
            .validate(&ToolCall::new("p", "ping", json!("x")))
            .is_err()
    );
}

#[test]
fn openai_tool_calls_parse_and_bad_ones_are_typed_errors() {
    let call = ToolCall::from_openai(
        "a-1",
        &json!({ "id": "call_1", "type": "function", "function": { "name": "f", "arguments": "{\"x\":1}" } }),
    )
    .unwrap();
    assert_eq!(
        (call.tool.as_str(), &call.arguments),
        ("f", &json!({ "x": 1 }))
    );
    assert_eq!(call.action_id.as_str(), "a-1");
    assert_eq!(call.attempt_id, None);
    let empty = ToolCall::from_openai(
        "a-2",
        &json!({ "function": { "name": "f", "arguments": "" } }),
    )
    .unwrap();
    assert_eq!(empty.arguments, json!({}));
    assert!(matches!(
        ToolCall::from_openai(
            "a-3",
            &json!({ "function": { "name": "f", "arguments": "{\"x\":" } })
        ),
        Err(ActionError::InvalidArguments { .. })
    ));
    assert!(matches!(
        ToolCall::from_openai("a-4", &json!({ "function": { "arguments": "{}" } })),
        Err(ActionError::InvalidArguments { ref path, .. }) if path == "/function/name"
    ));
}

#[tokio::test(start_paused = true)]
async fn an_action_id_reused_for_another_tool_is_refused() {
    let payments = Payments::scripted([]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(&payments, ActionExecutorLayer::new(store.clone()));
    submit(&mut executor, charge("pay-9", "a1")).await.unwrap();
    let err = submit(&mut executor, ToolCall::new("pay-9", "refund", json!({})))
        .await
        .unwrap_err();
    assert!(matches!(err, ActionError::Store(_)), "{err}");
    assert_eq!(err.action_id().map(ActionId::as_str), Some("pay-9"));
    assert_eq!(payments.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_store_refuses_new_actions_without_running_them() {
    let payments = Payments::scripted([]);
    let store = Arc::new(
        MemoryStore::new()
            .max_records(3)
            .ttl(Duration::from_secs(60)),
    );
    let mut executor = executor_with(&payments, ActionExecutorLayer::new(store.clone()));
    for i in 0..3 {
        submit(&mut executor, charge(&format!("pay-{i}"), "a"))
            .await
            .unwrap();
    }
    let err = submit(&mut executor, charge("pay-3", "a"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ActionError::Store(StoreError::Full { .. })),
        "{err}"
    );
    assert_eq!(payments.calls(), 3);
    // Replays still work while full, and expiry makes room.
    assert!(submit(&mut executor, charge("pay-0", "b")).await.is_ok());
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(submit(&mut executor, charge("pay-3", "a")).await.is_ok());
    assert_eq!(payments.calls(), 4);
    assert!(store.len() <= 3);
}

/// Every action duration configured as `Duration::MAX` reads as "very
/// long": nothing panics, a duplicate waits for the running effect, the
/// effect runs once, and its record still answers ten years later.
#[tokio::test(start_paused = true)]
async fn duration_max_in_every_setting_means_very_long_not_a_panic() {
    let payments = Payments::scripted([Script::ApplyAfter(Duration::from_secs(60))]);
    let store = Arc::new(MemoryStore::new().ttl(Duration::MAX));
    let layer = ActionExecutorLayer::new(store.clone())
        .effect_timeout(Duration::MAX)
        .in_progress_wait(Duration::MAX)
        .lease_grace(Duration::MAX);
    let executor = executor_with(&payments, layer);
    let mut primary = executor.clone();
    let mut backup = executor.clone();
    let (a, b) = tokio::join!(submit(&mut primary, charge("pay-max", "primary")), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        submit(&mut backup, charge("pay-max", "backup")).await
    });
    let first = a.unwrap();
    assert_eq!(b.unwrap(), first, "the duplicate waited and got the result");
    assert_eq!(payments.effects(), 1);

    tokio::time::advance(Duration::from_secs(10 * 365 * 86_400)).await;
    let mut late = executor.clone();
    assert_eq!(
        submit(&mut late, charge("pay-max", "late")).await.unwrap(),
        first
    );
    assert_eq!(store.purge_expired(), 0, "the record has not expired");
    assert_eq!(payments.effects(), 1);
    assert_eq!(payments.calls(), 1);
}

/// By default a finished action answers resubmissions for 7 days: one six
/// days late is replayed, not charged again. Past the TTL the record is
/// gone and the id starts afresh (documented).
#[tokio::test(start_paused = true)]
async fn a_late_resubmission_within_the_default_seven_days_is_replayed() {
    assert_eq!(MemoryStore::DEFAULT_TTL, Duration::from_secs(7 * 86_400));
    let payments = Payments::scripted([]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(&payments, ActionExecutorLayer::new(store.clone()));
    let first = submit(&mut executor, charge("pay-late", "a1"))
        .await
        .unwrap();

    tokio::time::advance(Duration::from_secs(7 * 86_400 - 60)).await;
    let late = submit(&mut executor, charge("pay-late", "a2"))
        .await
        .unwrap();
    assert_eq!(late, first);
    assert_eq!(payments.effects(), 1, "a week-old resubmission is a replay");

    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(store.get(&"pay-late".into()).await.unwrap().is_none());
}

/// The same action id with other arguments is another effect under a
/// reused id: refused with a typed error naming the id, neither answered
/// with the first result nor run; the record keeps the first call's
/// result and digest. The same arguments spelled otherwise still replay.
#[tokio::test(start_paused = true)]
async fn the_same_id_with_other_arguments_is_refused_not_replayed() {
    let payments = Payments::scripted([]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(&payments, ActionExecutorLayer::new(store.clone()));
    let first = submit(&mut executor, charge("pay-args", "a1"))
        .await
        .unwrap();

    let other = ToolCall::new(
        "pay-args",
        "charge_card",
        json!({ "amount": 999_999, "currency": "eur" }),
    );
    let err = submit(&mut executor, other).await.unwrap_err();
    assert!(
        matches!(
            err,
            ActionError::Store(StoreError::ArgumentsDiffer { ref action_id })
                if action_id.as_str() == "pay-args"
        ),
        "{err}"
    );
    assert_eq!(err.action_id().map(ActionId::as_str), Some("pay-args"));
    assert!(!err.is_retryable());
    assert_eq!(payments.calls(), 1, "never run");

    let respelled = ToolCall::new(
        "pay-args",
        "charge_card",
        json!({ "currency": "eur", "amount": 4200 }),
    );
    assert_eq!(submit(&mut executor, respelled).await.unwrap(), first);
    assert_eq!(payments.effects(), 1);
    let record = store.get(&"pay-args".into()).await.unwrap().unwrap();
    assert_eq!(record.state, ActionState::Succeeded { result: first });
    assert_eq!(
        record.arguments,
        Some(ArgumentsDigest::of(
            &json!({ "amount": 4200, "currency": "eur" })
        ))
    );
}

/// A duplicate with other arguments is refused at once while the first
/// runs (it does not wait for a result that is not its own), and after a
/// retryable failure it does not get the next run either.
#[tokio::test(start_paused = true)]
async fn other_arguments_are_refused_while_running_and_after_a_retryable_failure() {
    let payments = Payments::scripted([
        Script::ApplyAfter(Duration::from_secs(2)),
        Script::Refuse { retryable: true },
    ]);
    let store = Arc::new(MemoryStore::new());
    let executor = executor_with(
        &payments,
        ActionExecutorLayer::new(store.clone()).in_progress_wait(Duration::from_secs(10)),
    );
    let (mut a, mut b) = (executor.clone(), executor.clone());
    let other = || ToolCall::new("pay-run", "charge_card", json!({ "amount": 1 }));
    let (first, second) = tokio::join!(submit(&mut a, charge("pay-run", "a")), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = tokio::time::Instant::now();
        let answer = submit(&mut b, other()).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "refused without waiting");
        answer
    });
    assert!(first.is_ok());
    assert!(matches!(
        second,
        Err(ActionError::Store(StoreError::ArgumentsDiffer { .. }))
    ));

    let mut c = executor.clone();
    let failed = submit(&mut c, charge("pay-retry", "a")).await.unwrap_err();
    assert!(failed.is_retryable());
    assert!(matches!(
        submit(
            &mut c,
            ToolCall::new("pay-retry", "charge_card", json!({ "amount": 1 }))
        )
        .await,
        Err(ActionError::Store(StoreError::ArgumentsDiffer { .. }))
    ));
    assert_eq!(payments.calls(), 2, "the refused calls never ran");
    assert!(submit(&mut c, charge("pay-retry", "b")).await.is_ok());
    assert_eq!(payments.effects(), 2);
}

/// Two tenants whose models both call their first tool `call_0` hold two
/// actions: each effect runs once per tenant, each tenant gets its own
/// result (also on resubmission), and an id without a tenant is a third.
#[tokio::test(start_paused = true)]
async fn two_tenants_with_the_same_action_id_each_run_once_with_their_own_result() {
    let payments = Payments::scripted([]);
    let store = Arc::new(MemoryStore::new());
    let mut executor = executor_with(&payments, ActionExecutorLayer::new(store.clone()));
    let call = |tenant: &str, amount: u64| {
        ToolCall::new("call_0", "charge_card", json!({ "amount": amount }))
            .with_tenant(tenant)
            .with_attempt_id(format!("{tenant}/attempt"))
    };
    let acme = submit(&mut executor, call("acme", 100)).await.unwrap();
    let globex = submit(&mut executor, call("globex", 200)).await.unwrap();
    assert_eq!(acme["amount"], 100);
    assert_eq!(globex["amount"], 200);
    assert_eq!(payments.effects(), 2, "one effect per tenant");

    assert_eq!(
        submit(&mut executor, call("acme", 100)).await.unwrap(),
        acme
    );
    assert_eq!(
        submit(&mut executor, call("globex", 200)).await.unwrap(),
        globex
    );
    assert_eq!(
        payments.effects(),
        2,
        "each resubmission is its tenant's replay"
    );

    // No tenant ("" too) is a namespace of its own.
    let plain = ToolCall::new("call_0", "charge_card", json!({ "amount": 300 })).with_tenant("");
    assert_eq!(plain.action_id.tenant(), None);
    assert_eq!(submit(&mut executor, plain).await.unwrap()["amount"], 300);
    assert_eq!(payments.effects(), 3);

    let acme_id = ActionId::new("call_0").with_tenant("acme");
    let record = store.get(&acme_id).await.unwrap().unwrap();
    assert_eq!(record.action_id, acme_id);
    assert_eq!(record.state, ActionState::Succeeded { result: acme });
    assert_eq!(record.attempts, ["acme/attempt"]);
    assert_eq!(store.len(), 3);
}
