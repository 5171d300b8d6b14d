//! TurnBudget, Backoff and RetryBudget as the failover loop uses them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use super::backoff::Delay;
use crate::{
    Cost, budget::Backoff, budget::BudgetExhausted, budget::RetryBudget, budget::RetryBudgetConfig,
    budget::RetryDelay, budget::TurnLimits,
};
use tokio::time::{Instant, advance};

#[tokio::test(start_paused = true)]
async fn attempts_cap_counts_every_hop() {
    let turn = TurnLimits {
        max_attempts: 3,
        ..TurnLimits::new()
    }
    .start();
    let hop = turn.clone();
    assert_eq!(turn.try_begin_attempt(), Ok(1));
    assert_eq!(hop.try_begin_attempt(), Ok(2));
    assert_eq!(turn.try_begin_attempt(), Ok(3));
    assert_eq!(
        hop.try_begin_attempt(),
        Err(BudgetExhausted::Attempts { used: 3, max: 3 })
    );
    assert_eq!(turn.attempts_used(), 3);
    assert_eq!(
        turn.try_begin_attempt().unwrap_err().to_string(),
        "all 3 attempts of the turn are used"
    );
}

#[tokio::test(start_paused = true)]
async fn spend_ceiling_refuses_the_next_attempt() {
    let turn = TurnLimits {
        spend_ceiling: Some(Cost::from_usd(0.01)),
        ..TurnLimits::new()
    }
    .start();
    assert!(turn.check_spend(Cost::from_usd(0.006)).is_ok());
    turn.record_spend(Cost::from_usd(0.006), false);
    // A partial attempt with missing usage, estimated.
    turn.record_spend(Cost::from_usd(0.001), true);
    assert_eq!(turn.spent(), (Cost::from_usd(0.007), true));
    assert!(turn.check_spend(Cost::from_usd(0.003)).is_ok());
    assert_eq!(
        turn.check_spend(Cost::from_usd(0.004)),
        Err(BudgetExhausted::Spend {
            spent: Cost::from_usd(0.007),
            spent_includes_estimate: true,
            estimated_next: Cost::from_usd(0.004),
            ceiling: Cost::from_usd(0.01),
        })
    );
}

#[tokio::test(start_paused = true)]
async fn backoff_grows_with_jitter_and_honours_hints() {
    let backoff = Backoff::new().jitter_seed(1234);
    let turn = TurnLimits {
        deadline: Duration::from_secs(60),
        backoff: backoff.clone(),
        ..TurnLimits::new()
    }
    .start();
    let mut previous_base = 0.0;
    for retry in 0..6u32 {
        let base = (0.5 * 2f64.powi(retry as i32)).min(8.0);
        assert!(base >= previous_base);
        previous_base = base;
        let wait = turn.retry_delay(retry, None).wait().unwrap().as_secs_f64();
        assert!(
            (base * 0.75..=base).contains(&wait),
            "retry {retry}: {wait}s not in [{}, {base}]",
            base * 0.75
        );
    }
    // Retry-After: 2 s is honoured exactly, whatever the retry index.
    assert_eq!(
        turn.retry_delay(4, Some(Duration::from_secs(2))),
        RetryDelay::Wait(Duration::from_secs(2))
    );
    // Past the 120 s cap on server-directed waits: don't wait for this target.
    assert_eq!(
        turn.retry_delay(0, Some(Duration::from_secs(300))),
        RetryDelay::HintTooLong {
            asked: Duration::from_secs(300),
            max: Duration::from_secs(120)
        }
    );
    assert_eq!(
        backoff.delay(0, Some(Duration::from_secs(300))),
        Delay::HintTooLong {
            asked: Duration::from_secs(300),
            max: Duration::from_secs(120)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_hint_longer_than_the_time_left_is_not_taken() {
    let turn = TurnLimits {
        deadline: Duration::from_secs(10),
        ..TurnLimits::new()
    }
    .start();
    advance(Duration::from_secs(7)).await;
    let hint = Duration::from_secs(5); // within the 120 s cap, but 3 s are left
    assert!(!turn.wait_fits(hint));
    assert!(turn.wait_fits(Duration::from_secs(2)));
    // A wait ending exactly at the deadline leaves no time for the attempt.
    assert!(!turn.wait_fits(Duration::from_secs(3)));
    assert_eq!(
        turn.retry_delay(0, Some(hint)),
        RetryDelay::PastDeadline {
            wait: hint,
            remaining: Duration::from_secs(3)
        }
    );
}

#[tokio::test(start_paused = true)]
async fn deadline_is_shared_by_every_hop() {
    let start = Instant::now();
    let turn = TurnLimits {
        deadline: Duration::from_secs(5),
        ..TurnLimits::new()
    }
    .start();
    let hop = turn.clone();
    advance(Duration::from_secs(3)).await;
    assert_eq!(hop.deadline(), start + Duration::from_secs(5));
    assert_eq!(hop.remaining(), Duration::from_secs(2));
    assert_eq!(turn.remaining(), Duration::from_secs(2));
    advance(Duration::from_secs(2)).await;
    assert!(matches!(
        hop.try_begin_attempt(),
        Err(BudgetExhausted::Deadline { .. })
    ));
}

/// 100 turns against a primary that always fails; each turn would try up to
/// 3 attempts. With 20 % of first attempts as retry budget and no reserve,
/// only 20 extra attempts are ever made.
#[tokio::test(start_paused = true)]
async fn retry_budget_caps_extra_attempts_across_turns() {
    let retry_budget = RetryBudget::new(RetryBudgetConfig {
        min_per_sec: 0,
        retry_percent: 0.2,
        ..RetryBudgetConfig::new()
    })
    .unwrap();
    let limits = TurnLimits {
        max_attempts: 3,
        retry_budget: Some(retry_budget.clone()),
        ..TurnLimits::new()
    };

    let mut upstream_attempts = 0u32;
    let mut refused_by_retry_budget = 0u32;
    for _ in 0..100 {
        let turn = limits.start();
        loop {
            match turn.try_begin_attempt() {
                Ok(_) => upstream_attempts += 1, // the primary fails: try again
                Err(BudgetExhausted::RetryBudget { attempt }) => {
                    assert!(attempt >= 2);
                    refused_by_retry_budget += 1;
                    break;
                }
                Err(BudgetExhausted::Attempts { .. }) => break,
                Err(other) => panic!("unexpected refusal: {other}"),
            }
        }
        // A refused extra attempt does not use up the turn's attempts.
        assert!(turn.attempts_used() <= 3);
    }
    let stats = retry_budget.stats();
    assert_eq!(stats.deposits, 100);
    assert_eq!(stats.granted, 20);
    assert_eq!(upstream_attempts, 120);
    assert_eq!(stats.refused, u64::from(refused_by_retry_budget));
    // Without the retry budget the same outage would have cost 300 attempts.
}

#[tokio::test(start_paused = true)]
async fn retry_budget_reserve_allows_quiet_gateways_to_retry() {
    // tower's default: a reserve of 10 extra attempts per second over 10 s.
    let retry_budget = RetryBudget::new(RetryBudgetConfig::new()).unwrap();
    let turn = TurnLimits {
        max_attempts: 2,
        retry_budget: Some(retry_budget.clone()),
        ..TurnLimits::new()
    }
    .start();
    assert_eq!(turn.try_begin_attempt(), Ok(1));
    assert_eq!(turn.try_begin_attempt(), Ok(2));
    assert_eq!(retry_budget.stats().granted, 1);
}
