//! The in-memory action store: atomic claims, transitions, expiry and bound.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tower_llm_actions::{
    ActionRecord, ActionState, ActionStore, Claim, ClaimRequest, Claimed, FenceToken, MemoryStore,
    Reconciliation, StateKind, StoreError, StoredError, Transition,
};

const LEASE: Duration = Duration::from_secs(30);

fn request(id: &str) -> ClaimRequest {
    ClaimRequest::new(id, "charge", LEASE).with_attempt_id("attempt-1")
}

async fn acquire(store: &MemoryStore, id: &str) -> FenceToken {
    match store.claim(&request(id)).await.unwrap().claim {
        Claim::Acquired { run } => run,
        other => panic!("expected to acquire {id}, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn only_the_first_claim_acquires_and_others_see_running() {
    let store = MemoryStore::new();
    let first = store.claim(&request("a")).await.unwrap();
    assert_eq!(
        first.claim,
        Claim::Acquired {
            run: FenceToken::new(1)
        }
    );
    let t = first.transition.unwrap();
    assert_eq!(
        (t.before, t.after),
        (StateKind::NotStarted, StateKind::Running)
    );

    let second = store.claim(&request("a")).await.unwrap();
    assert_eq!(
        second.claim,
        Claim::InProgress {
            run: FenceToken::new(1)
        }
    );
    assert!(second.transition.is_none());

    let t = store
        .complete(&"a".into(), FenceToken::new(1), None, json!({"ok": true}))
        .await
        .unwrap();
    assert_eq!(
        (t.before, t.after),
        (StateKind::Running, StateKind::Succeeded)
    );
    assert_eq!(
        store.claim(&request("a")).await.unwrap().claim,
        Claim::Succeeded {
            result: json!({"ok": true})
        }
    );
}

#[tokio::test(start_paused = true)]
async fn records_keep_every_attempt_that_touched_them() {
    let store = MemoryStore::new();
    acquire(&store, "a").await;
    let mut backup = request("a");
    backup.attempt_id = Some("attempt-2".to_owned());
    store.claim(&backup).await.unwrap();
    let record = store.get(&"a".into()).await.unwrap().unwrap();
    assert_eq!(record.attempts, vec!["attempt-1", "attempt-2"]);
    assert_eq!(record.run, FenceToken::new(1));
    assert_eq!(record.state, ActionState::Running);
}

#[tokio::test(start_paused = true)]
async fn transitions_name_their_run_and_stale_runs_are_refused() {
    let store = MemoryStore::new();
    let run = acquire(&store, "a").await;
    store
        .fail(
            &"a".into(),
            run,
            None,
            StoredError::new("declined for now"),
            true,
        )
        .await
        .unwrap();
    // A retryable failure: the next claim starts run 2.
    let run2 = acquire(&store, "a").await;
    assert_eq!(run2, FenceToken::new(2));
    // The owner of run 1 cannot report over run 2.
    let err = store
        .complete(&"a".into(), run, None, json!(1))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::Conflict { found: StateKind::Running, run: r, current: c, .. }
            if r == FenceToken::new(1) && c == FenceToken::new(2)
    ));
    assert_eq!(
        err.to_string(),
        "action `a` is running (run 2); transition for run 1 refused"
    );
    // Nor can anyone report twice.
    store
        .complete(&"a".into(), run2, None, json!(2))
        .await
        .unwrap();
    assert!(matches!(
        store
            .fail(&"a".into(), run2, None, StoredError::new("x"), false)
            .await,
        Err(StoreError::Conflict {
            found: StateKind::Succeeded,
            ..
        })
    ));
    assert!(matches!(
        store.mark_unknown(&"missing".into(), run2, None).await,
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn a_state_reads_as_its_kind_and_a_failure_says_whether_it_may_run_again() {
    let failed = |retryable| ActionState::Failed {
        error: StoredError::new("declined"),
        retryable,
    };
    assert_eq!(failed(true).to_string(), "failed (retryable)");
    assert_eq!(failed(false).to_string(), "failed (final)");
    let others = [
        ActionState::NotStarted,
        ActionState::Running,
        ActionState::Succeeded { result: json!(1) },
        ActionState::Unknown,
    ];
    assert_eq!(
        others.map(|state| state.to_string()),
        ["not_started", "running", "succeeded", "unknown"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_final_failure_is_replayed() {
    let store = MemoryStore::new();
    let run = acquire(&store, "a").await;
    store
        .fail(
            &"a".into(),
            run,
            None,
            StoredError::new("card blocked"),
            false,
        )
        .await
        .unwrap();
    assert_eq!(
        store.claim(&request("a")).await.unwrap().claim,
        Claim::Failed {
            error: StoredError::new("card blocked")
        }
    );
}

#[tokio::test(start_paused = true)]
async fn an_action_id_belongs_to_one_tool() {
    let store = MemoryStore::new();
    acquire(&store, "a").await;
    let mut other = request("a");
    other.tool = "refund".to_owned();
    assert!(matches!(
        store.claim(&other).await,
        Err(StoreError::ToolMismatch { ref recorded, ref requested, .. })
            if recorded == "charge" && requested == "refund"
    ));
}

#[tokio::test(start_paused = true)]
async fn a_running_claim_past_its_lease_turns_unknown_not_free() {
    let store = MemoryStore::new();
    acquire(&store, "a").await;
    // The owner vanishes without reporting.
    tokio::time::advance(LEASE + Duration::from_secs(1)).await;
    let claimed = store.claim(&request("a")).await.unwrap();
    assert_eq!(
        claimed.claim,
        Claim::Unknown {
            run: FenceToken::new(1)
        }
    );
    let t = claimed.transition.unwrap();
    assert_eq!(
        (t.before, t.after),
        (StateKind::Running, StateKind::Unknown)
    );
    // And it stays unknown: nobody acquires it.
    assert_eq!(
        store.claim(&request("a")).await.unwrap().claim,
        Claim::Unknown {
            run: FenceToken::new(1)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn resolution_moves_unknown_on_exactly_once() {
    let store = MemoryStore::new();
    let run = acquire(&store, "a").await;
    store.mark_unknown(&"a".into(), run, None).await.unwrap();

    // Still unknown changes nothing.
    let still = store
        .resolve(&request("a"), run, Reconciliation::StillUnknown)
        .await
        .unwrap();
    assert_eq!(still.claim, Claim::Unknown { run });
    assert!(still.transition.is_none());

    // Two callers both hear "not applied": only the first runs it.
    let first = store
        .resolve(&request("a"), run, Reconciliation::NotApplied)
        .await
        .unwrap();
    assert_eq!(
        first.claim,
        Claim::Acquired {
            run: FenceToken::new(2)
        }
    );
    let second = store
        .resolve(&request("a"), run, Reconciliation::NotApplied)
        .await
        .unwrap();
    assert_eq!(
        second.claim,
        Claim::InProgress {
            run: FenceToken::new(2)
        }
    );

    // Unknown resolved as succeeded stores the reconciled result.
    let run = acquire(&store, "b").await;
    store.mark_unknown(&"b".into(), run, None).await.unwrap();
    let done = store
        .resolve(
            &request("b"),
            run,
            Reconciliation::Succeeded(json!({"charge": "ch_1"})),
        )
        .await
        .unwrap();
    assert_eq!(
        done.claim,
        Claim::Succeeded {
            result: json!({"charge": "ch_1"})
        }
    );
    assert_eq!(
        store.state(&"b".into()).await.unwrap(),
        ActionState::Succeeded {
            result: json!({"charge": "ch_1"})
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_report_on_an_unknown_run_is_taken_as_the_truth() {
    let store = MemoryStore::new();
    let run = acquire(&store, "a").await;
    store.mark_unknown(&"a".into(), run, None).await.unwrap();
    store
        .complete(&"a".into(), run, None, json!("late"))
        .await
        .unwrap();
    assert_eq!(
        store.state(&"a".into()).await.unwrap(),
        ActionState::Succeeded {
            result: json!("late")
        }
    );
}

#[tokio::test(start_paused = true)]
async fn finished_records_expire_after_their_ttl() {
    let ttl = Duration::from_secs(60);
    let store = MemoryStore::new().ttl(ttl);
    let run = acquire(&store, "a").await;
    store
        .complete(&"a".into(), run, None, json!(1))
        .await
        .unwrap();

    tokio::time::advance(ttl - Duration::from_secs(1)).await;
    assert!(store.get(&"a".into()).await.unwrap().is_some());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(store.get(&"a".into()).await.unwrap().is_none());
    assert_eq!(
        store.state(&"a".into()).await.unwrap(),
        ActionState::NotStarted
    );
    assert_eq!(store.purge_expired(), 1);
    assert!(store.is_empty());
    // A new claim starts afresh.
    assert_eq!(acquire(&store, "a").await, FenceToken::new(1));
}

#[tokio::test(start_paused = true)]
async fn running_and_unknown_records_never_expire_or_get_evicted() {
    let ttl = Duration::from_secs(60);
    let store = MemoryStore::new().ttl(ttl).max_records(2);
    acquire(&store, "running").await;
    let run = acquire(&store, "unknown").await;
    store
        .mark_unknown(&"unknown".into(), run, None)
        .await
        .unwrap();

    tokio::time::advance(ttl * 100).await;
    assert_eq!(store.purge_expired(), 0);
    // Full of live records: a new action is refused, nothing is evicted.
    assert!(matches!(
        store.claim(&request("new")).await,
        Err(StoreError::Full { max_records: 2, ref action_id }) if action_id.as_str() == "new"
    ));
    assert_eq!(
        store.state(&"unknown".into()).await.unwrap(),
        ActionState::Unknown
    );
    // The running one is past its lease by now: unknown, still not evicted.
    assert!(matches!(
        store.claim(&request("running")).await.unwrap().claim,
        Claim::Unknown { .. }
    ));
    assert_eq!(store.len(), 2);

    // An operator settles one by hand, which frees a slot.
    let removed = store.remove(&"unknown".into()).unwrap();
    assert_eq!(removed.state, ActionState::Unknown);
    acquire(&store, "new").await;
}

#[tokio::test(start_paused = true)]
async fn the_store_stays_bounded_under_a_long_run() {
    let ttl = Duration::from_secs(60);
    let max = 100;
    let store = MemoryStore::new().ttl(ttl).max_records(max);
    let total = 20_000u32;
    let mut refused = 0u32;
    let mut peak = 0;
    // One action per 500 ms of simulated time: 120 finish per TTL, more than
    // the bound, so some are refused until older ones expire.
    for i in 0..total {
        let id = format!("action-{i}");
        match store.claim(&request(&id)).await {
            Ok(claimed) => {
                let Claim::Acquired { run } = claimed.claim else {
                    panic!("fresh id {id} not acquired");
                };
                store
                    .complete(&id.as_str().into(), run, None, json!(i))
                    .await
                    .unwrap();
            }
            Err(StoreError::Full { .. }) => refused += 1,
            Err(other) => panic!("unexpected {other}"),
        }
        peak = peak.max(store.len());
        assert!(
            store.len() <= max,
            "store grew past its bound: {}",
            store.len()
        );
        tokio::time::advance(Duration::from_millis(500)).await;
    }
    assert_eq!(peak, max);
    assert!(refused > 0, "the bound was never reached");
    // Expiry kept it serving: most actions were accepted.
    assert!(refused < total / 4, "refused {refused}");
    // The oldest records are long gone; the newest is still answered.
    assert!(store.get(&"action-0".into()).await.unwrap().is_none());
    assert_eq!(
        store.state(&"action-19999".into()).await.unwrap(),
        ActionState::Succeeded {
            result: json!(19_999)
        }
    );
    tokio::time::advance(ttl).await;
    store.purge_expired();
    assert!(store.is_empty());
}

#[tokio::test(start_paused = true)]
async fn waiters_wake_on_the_transition() {
    let store = Arc::new(MemoryStore::new());
    let run = acquire(&store, "a").await;
    let waiter = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store.changed(&"a".into(), run).await;
            store.state(&"a".into()).await.unwrap()
        })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    store
        .complete(&"a".into(), run, None, json!("done"))
        .await
        .unwrap();
    assert_eq!(
        waiter.await.unwrap(),
        ActionState::Succeeded {
            result: json!("done")
        }
    );
    // Not running on that run any more: returns at once.
    store.changed(&"a".into(), run).await;
}

/// The records are `#[non_exhaustive]`: a store outside the crate builds the
/// same values through the public constructors.
#[tokio::test(start_paused = true)]
async fn public_constructors_build_what_the_store_reports() {
    let store = MemoryStore::new();
    let claimed = store.claim(&request("a")).await.unwrap();
    let run = FenceToken::new(1);
    assert_eq!(
        claimed,
        Claimed::changed(
            Claim::Acquired { run },
            Transition::new(StateKind::NotStarted, StateKind::Running, run),
        )
    );
    let record = store.get(&"a".into()).await.unwrap().unwrap();
    assert_eq!(
        record,
        ActionRecord::new("a", "charge", ActionState::Running, run).with_attempts(["attempt-1"])
    );
    assert_eq!(
        request("a"),
        ClaimRequest::new("a", "charge", LEASE).with_attempt_id("attempt-1")
    );
    assert_eq!(StoredError::new("declined").message, "declined");
}

/// A lease and a time-to-live of `Duration::MAX` mean "very long": no
/// panic, a running claim stays trusted and a finished record stays.
#[tokio::test(start_paused = true)]
async fn duration_max_lease_and_ttl_mean_very_long() {
    let store = MemoryStore::new().ttl(Duration::MAX);
    let forever = ClaimRequest::new("a", "charge", Duration::MAX);
    assert_eq!(
        store.claim(&forever).await.unwrap().claim,
        Claim::Acquired {
            run: FenceToken::new(1)
        }
    );
    tokio::time::advance(Duration::from_secs(10 * 365 * 86_400)).await;
    assert_eq!(
        store.claim(&forever).await.unwrap().claim,
        Claim::InProgress {
            run: FenceToken::new(1)
        },
        "still trusted, not unknown"
    );
    store
        .complete(&"a".into(), FenceToken::new(1), None, json!(1))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(10 * 365 * 86_400)).await;
    assert_eq!(store.purge_expired(), 0);
    assert_eq!(
        store.claim(&forever).await.unwrap().claim,
        Claim::Succeeded { result: json!(1) }
    );
}

/// A claim carrying an arguments digest binds the record to it: a claim
/// with another digest is refused (and changes nothing), the same digest
/// or none is answered as before, and a resolution with other arguments
/// is refused too.
#[tokio::test(start_paused = true)]
async fn a_record_is_bound_to_the_arguments_it_was_claimed_with() {
    let store = MemoryStore::new();
    let first = request("a").with_arguments(&json!({ "amount": 1, "to": "x" }));
    let other = request("a").with_arguments(&json!({ "amount": 2, "to": "x" }));
    let Claim::Acquired { run } = store.claim(&first).await.unwrap().claim else {
        panic!("fresh")
    };
    assert!(matches!(
        store.claim(&other).await,
        Err(StoreError::ArgumentsDiffer { ref action_id }) if action_id.as_str() == "a"
    ));
    assert_eq!(
        store.claim(&first).await.unwrap().claim,
        Claim::InProgress { run }
    );
    store.mark_unknown(&"a".into(), run, None).await.unwrap();
    assert!(matches!(
        store.resolve(&other, run, Reconciliation::NotApplied).await,
        Err(StoreError::ArgumentsDiffer { .. })
    ));
    assert_eq!(
        store.state(&"a".into()).await.unwrap(),
        ActionState::Unknown
    );
    let record = store.get(&"a".into()).await.unwrap().unwrap();
    assert_eq!(record.arguments, first.arguments);
    assert_eq!(record.attempts, ["attempt-1"]);
    // A claim without a digest checks nothing (a store used directly).
    assert_eq!(
        store.claim(&request("a")).await.unwrap().claim,
        Claim::Unknown { run }
    );
}
