//! Tool actions counted by state: started, completed, failed, replayed,
//! unknown and reconciled, captured by a test recorder.
//!
//! The recorder is local to this test's thread (`with_local_recorder`
//! around a current-thread runtime, whose spawned tasks run on that thread
//! too), so nothing else in the binary can add to its figures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use serde_json::{Value, json};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt, service_fn};
use tower_llm_actions::{
    ActionError, ActionExecutorLayer, Disposition, MemoryStore, Reconciliation, ToolCall,
    reconcile_fn,
};

type Executor = tower::util::BoxCloneService<ToolCall, Value, ActionError>;

/// The effect, per action id: `ok-*` applies; `*slow` outlives the effect
/// timeout; `ambiguous` fails ambiguously the first time, then applies;
/// `final` fails for good.
fn executor() -> Executor {
    let runs: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let effect = service_fn(move |call: ToolCall| {
        let runs = Arc::clone(&runs);
        async move {
            let id = call.action_id.as_str().to_owned();
            let run = {
                let mut runs = runs.lock().unwrap();
                let run = runs.entry(id.clone()).or_default();
                *run += 1;
                *run
            };
            match id.as_str() {
                slow if slow.ends_with("slow") => {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(json!({"applied": id}))
                }
                "ambiguous" if run == 1 => Err::<Value, BoxError>("connection reset".into()),
                "final" => Err("card declined".into()),
                _ => Ok(json!({"applied": id})),
            }
        }
    });
    // `slow` was applied after all; `ambiguous` was not; anything else
    // cannot be looked up.
    let reconciler = reconcile_fn(|call: ToolCall| async move {
        match call.action_id.as_str() {
            "slow" => Ok(Reconciliation::Succeeded(json!({"applied": "slow"}))),
            "ambiguous" => Ok(Reconciliation::NotApplied),
            _ => Err::<_, BoxError>("lookup failed".into()),
        }
    });
    let layer = ActionExecutorLayer::new(Arc::new(MemoryStore::new()))
        .effect_timeout(Duration::from_secs(1))
        .reconciler(reconciler)
        .classify_errors(|e: &BoxError| {
            if e.to_string() == "card declined" {
                Disposition::Final
            } else {
                Disposition::Unknown
            }
        });
    tower::util::BoxCloneService::new(ServiceBuilder::new().layer(layer).service(effect))
}

async fn submit(executor: &mut Executor, id: &str) -> Result<Value, ActionError> {
    let call = ToolCall::new(id, "charge_card", json!({"amount": 1}));
    executor.ready().await?.call(call).await
}

/// Counter values by (name, sorted labels).
type Counters = HashMap<(String, Vec<(String, String)>), u64>;

fn counters(recorder: &DebuggingRecorder) -> Counters {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                return None;
            };
            let mut labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            Some(((key.key().name().to_owned(), labels), n))
        })
        .collect()
}

fn get(counters: &Counters, name: &str, labels: &[(&str, &str)]) -> u64 {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    counters
        .get(&(name.to_owned(), labels))
        .copied()
        .unwrap_or(0)
}

#[test]
fn actions_are_counted_by_state_including_unknown_and_reconciled() {
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let mut executor = executor();
            // Applied, then replayed.
            submit(&mut executor, "ok-1").await.unwrap();
            submit(&mut executor, "ok-1").await.unwrap();
            // Timed out: unknown; then reconciled as applied.
            let first = submit(&mut executor, "slow").await.unwrap_err();
            assert!(matches!(first, ActionError::NeedsReconciliation { .. }));
            assert_eq!(
                submit(&mut executor, "slow").await.unwrap(),
                json!({"applied": "slow"})
            );
            // An ambiguous error: unknown; reconciled as not applied, so it
            // runs again and applies.
            submit(&mut executor, "ambiguous").await.unwrap_err();
            submit(&mut executor, "ambiguous").await.unwrap();
            // A final failure, then its error replayed.
            submit(&mut executor, "final").await.unwrap_err();
            submit(&mut executor, "final").await.unwrap_err();
            // Timed out, and the reconciler fails: it stays unknown.
            submit(&mut executor, "broken-slow").await.unwrap_err();
            let again = submit(&mut executor, "broken-slow").await.unwrap_err();
            assert!(matches!(again, ActionError::Reconcile { .. }), "{again:?}");
        });
    });

    let c = counters(&recorder);
    let state = "failover.action.state";
    let cause = "failover.action.cause";
    let actions = |s: &str, why: &str| get(&c, "failover.actions", &[(state, s), (cause, why)]);
    // Started: every claim that ran the effect (ok-1, slow, ambiguous,
    // final, broken-slow), and the reconciled re-run of `ambiguous`.
    assert_eq!(actions("running", "claim"), 5, "{c:#?}");
    assert_eq!(actions("running", "reconcile"), 1, "{c:#?}");
    assert_eq!(actions("succeeded", "complete"), 2, "{c:#?}");
    assert_eq!(actions("succeeded", "reconcile"), 1, "{c:#?}");
    assert_eq!(actions("unknown", "timeout"), 2, "{c:#?}");
    assert_eq!(actions("unknown", "effect_error"), 1, "{c:#?}");
    assert_eq!(actions("failed", "fail"), 1, "{c:#?}");
    let replays = |s: &str| get(&c, "failover.action.replays", &[(state, s)]);
    assert_eq!(replays("succeeded"), 1, "{c:#?}");
    assert_eq!(replays("failed"), 1, "{c:#?}");
    let answers = |a: &str| {
        get(
            &c,
            "failover.action.reconciliations",
            &[("failover.action.answer", a)],
        )
    };
    assert_eq!(answers("succeeded"), 1, "{c:#?}");
    assert_eq!(answers("not_applied"), 1, "{c:#?}");
    assert_eq!(answers("error"), 1, "{c:#?}");
    // Nothing else was counted.
    let total: u64 = c
        .iter()
        .filter(|((name, _), _)| name == "failover.actions")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(total, 13, "{c:#?}");
}
