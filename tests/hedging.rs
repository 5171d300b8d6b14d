//! Hedged attempts on paused time with fake providers: a slow attempt
//! races a hedge, exactly one commits, the loser is cancelled and never
//! seen, and the budgets hold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_llm_failover::Decision;
use tower_llm_failover::failover::{Caps, Failover, FailoverBuilder, Hedge, Target};
use tower_llm_failover::health::{Availability, CooldownPolicy, HealthKey, MemoryHealthStore};
use tower_llm_failover::observe::{AttemptRecord, TurnRecord};
use tower_llm_failover::{Cost, budget::Pricing, budget::TurnLimits};
use tower_llm_testing::{FakeProvider, Reply, Step, chunks};

const SERVER_500: &str = r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#;

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: String,
    attempts: Vec<AttemptRecord>,
    /// When the first body byte reached the client, from the send.
    first_byte: Duration,
}

fn request(extra: serde_json::Value) -> Request<Full<Bytes>> {
    let mut body = serde_json::json!({
        "model": "gpt-x",
        "stream": true,
        "messages": [{"role": "user", "content": "Tell me about caching."}],
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            body.insert(k.clone(), v.clone());
        }
    }
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

async fn send(failover: &Failover<FakeProvider>, request: Request<Full<Bytes>>) -> Answer {
    let sent = Instant::now();
    let response = failover.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let run = response.extensions().get::<TurnRecord>().cloned();
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    let mut first_byte = None;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            first_byte.get_or_insert_with(|| sent.elapsed());
            bytes.extend_from_slice(&data);
        }
    }
    Answer {
        status,
        headers,
        body: String::from_utf8(bytes).unwrap(),
        attempts: run.map(|r| r.attempts()).unwrap_or_default(),
        first_byte: first_byte.unwrap_or_default(),
    }
}

/// A stream whose head comes after `delay`, then eight tokens naming it.
fn after(delay_ms: u64, name: &str) -> Reply {
    Reply::Delayed(
        Duration::from_millis(delay_ms),
        Box::new(Reply::stream(name, 8)),
    )
}

fn two(
    primary: &FakeProvider,
    backup: &FakeProvider,
    hedge: Hedge,
) -> FailoverBuilder<FakeProvider> {
    Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()))
        .hedge(hedge)
}

/// Hedges at 400 ms, from a budget that grants one per first attempt.
fn at_400ms() -> Hedge {
    Hedge::after(Duration::from_millis(400)).with_budget_percent(100.0)
}

fn availability(failover: &Failover<FakeProvider>, provider: &str) -> Availability {
    failover
        .health()
        .availability(&HealthKey::model(provider, "gpt-x"))
}

fn decisions(answer: &Answer) -> Vec<(u32, &str, Decision, bool)> {
    let mut seen: Vec<_> = answer
        .attempts
        .iter()
        .map(|a| (a.attempt, &*a.target, a.decision, a.hedged))
        .collect();
    seen.sort_by_key(|d| d.0);
    seen
}

#[tokio::test(start_paused = true)]
async fn a_slow_primary_loses_to_the_hedge_and_is_cancelled() {
    let primary = FakeProvider::new("primary").always(after(3_000, "primary"));
    let backup = FakeProvider::new("backup").always(after(150, "backup"));
    let failover = two(&primary, &backup, at_400ms()).build();
    let answer = send(&failover, request(serde_json::json!({}))).await;
    assert_eq!(answer.status, 200);
    // The backup's stream whole, from its first byte, and nothing else.
    assert!(answer.body.starts_with("data: {"), "{}", answer.body);
    assert!(answer.body.contains("backup-7 "), "{}", answer.body);
    assert!(!answer.body.contains("primary"), "{}", answer.body);
    assert_eq!(answer.first_byte, Duration::from_millis(550));
    // The primary's request was sent, then dropped before its head came:
    // its connection closed, no frame of it ever read.
    assert_eq!((primary.calls(), backup.calls()), (1, 1));
    assert_eq!(primary.tally().cut(), 1);
    assert_eq!(primary.tally().open(), 0);
    assert_eq!(primary.tally().frames(), 0);
    assert_eq!(backup.tally().cut(), 0);
    assert_eq!(
        decisions(&answer),
        [
            (1, "primary", Decision::LostRace, false),
            (2, "backup", Decision::Committed, true),
        ]
    );
    let lost = answer.attempts.iter().find(|a| a.attempt == 1).unwrap();
    assert_eq!(lost.time_to_commit, Some(Duration::from_millis(550)));
    assert_eq!(lost.bytes_flushed, 0);
    assert_eq!(lost.class, None, "losing is not a failure");
    let won = answer.attempts.iter().find(|a| a.attempt == 2).unwrap();
    assert_eq!(won.time_to_commit, Some(Duration::from_millis(150)));
    assert_eq!(answer.headers["x-failover-attempts"], "2");
    assert_eq!(answer.headers["x-failover-target"], "backup");
    assert_eq!(answer.headers["x-failover-served-attempt"], "2");
    // Being slower is not a failure: the primary is not cooled.
    assert_eq!(availability(&failover, "primary"), Availability::Healthy);
}

#[tokio::test(start_paused = true)]
async fn a_primary_that_commits_before_the_hedge_is_due_is_never_hedged() {
    for delay in [399, 400] {
        let primary = FakeProvider::new("primary").always(after(delay, "primary"));
        let backup = FakeProvider::new("backup");
        let failover = two(&primary, &backup, at_400ms()).build();
        let answer = send(&failover, request(serde_json::json!({}))).await;
        assert!(answer.body.contains("primary-7 "), "{}", answer.body);
        // At the very instant the hedge is due, the attempt is polled
        // first: it commits, and no hedge starts.
        assert_eq!(backup.calls(), 0, "commit at {delay} ms");
        assert_eq!(answer.headers["x-failover-attempts"], "1");
        assert_eq!(answer.headers["x-failover-served-attempt"], "1");
        assert_eq!(
            decisions(&answer),
            [(1, "primary", Decision::Committed, false)]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn two_attempts_ready_in_the_same_poll_have_exactly_one_winner() {
    // Hedge at 100 ms; both heads and first chunks come at 500 ms.
    let primary = FakeProvider::new("primary").always(after(500, "primary"));
    let backup = FakeProvider::new("backup").always(after(400, "backup"));
    let hedge = Hedge::after(Duration::from_millis(100)).with_budget_percent(100.0);
    let failover = two(&primary, &backup, hedge).build();
    let answer = send(&failover, request(serde_json::json!({}))).await;
    // The attempt that started first wins the tie; the other is dropped
    // without a byte of it reaching the client.
    assert!(answer.body.contains("primary-7 "), "{}", answer.body);
    assert!(!answer.body.contains("backup"), "{}", answer.body);
    assert_eq!(answer.first_byte, Duration::from_millis(500));
    let committed = answer
        .attempts
        .iter()
        .filter(|a| a.decision == Decision::Committed)
        .count();
    assert_eq!(committed, 1);
    assert_eq!(
        decisions(&answer),
        [
            (1, "primary", Decision::Committed, false),
            (2, "backup", Decision::LostRace, true),
        ]
    );
    assert_eq!(backup.tally().cut(), 1);
    assert_eq!(backup.tally().open(), 0);
    assert_eq!(answer.headers["x-failover-served-attempt"], "1");
}

#[tokio::test(start_paused = true)]
async fn a_loser_cut_after_its_head_is_closed_and_its_held_bytes_dropped() {
    // The primary's head and role chunk come at once (held: no output),
    // then nothing for 3 s; the hedge commits first.
    let primary = FakeProvider::new("primary").always(Reply::Stream(vec![
        Step::Data(chunks::role("primary")),
        Step::Wait(Duration::from_secs(3)),
        Step::Data(chunks::content("primary", "late ")),
        Step::Data(chunks::done()),
    ]));
    let backup = FakeProvider::new("backup").always(after(100, "backup"));
    let failover = two(&primary, &backup, at_400ms()).build();
    let answer = send(&failover, request(serde_json::json!({}))).await;
    assert!(answer.body.contains("backup-0 "), "{}", answer.body);
    assert!(!answer.body.contains("primary"), "held preamble dropped");
    assert_eq!(primary.tally().frames(), 1, "only its role chunk was read");
    assert_eq!(primary.tally().cut_frames(), 1);
    assert_eq!(primary.tally().cut(), 1);
    assert_eq!(primary.tally().open(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_budget_that_is_spent_means_no_hedge() {
    // Half a hedge per first attempt: the first turn has earned none, the
    // second one, and the third none again.
    let primary = FakeProvider::new("primary").always(after(3_000, "primary"));
    let backup = FakeProvider::new("backup").always(after(150, "backup"));
    let hedge = Hedge::after(Duration::from_millis(400)).with_budget_percent(50.0);
    let failover = two(&primary, &backup, hedge).build();
    let mut served = Vec::new();
    for _ in 0..3 {
        let answer = send(&failover, request(serde_json::json!({}))).await;
        served.push((
            answer.headers["x-failover-target"]
                .to_str()
                .unwrap()
                .to_owned(),
            answer.first_byte,
        ));
    }
    assert_eq!(
        served,
        [
            ("primary".to_owned(), Duration::from_secs(3)),
            ("backup".to_owned(), Duration::from_millis(550)),
            ("primary".to_owned(), Duration::from_secs(3)),
        ]
    );
    assert_eq!(backup.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_spend_ceiling_reached_by_reservation_means_no_hedge() {
    // Each attempt is estimated at about $1; the ceiling of $1.50 holds
    // one, not two at once.
    let price = Pricing::per_million_usd(1_000.0, 1_000.0);
    let primary = FakeProvider::new("primary").always(after(3_000, "primary"));
    let backup = FakeProvider::new("backup").always(after(150, "backup"));
    let build = |ceiling: f64| {
        Failover::builder()
            .target(Target::new("primary", primary.clone()).pricing(price))
            .target(Target::new("backup", backup.clone()).pricing(price))
            .default_output_tokens(1_000)
            .limits(TurnLimits {
                spend_ceiling: Some(Cost::from_usd(ceiling)),
                ..TurnLimits::new()
            })
            .hedge(at_400ms())
            .build()
    };
    let answer = send(&build(1.5), request(serde_json::json!({}))).await;
    assert_eq!(answer.headers["x-failover-target"], "primary");
    assert_eq!(answer.first_byte, Duration::from_secs(3));
    assert_eq!(backup.calls(), 0);
    // With room for both, the same turn is hedged.
    let answer = send(&build(2.5), request(serde_json::json!({}))).await;
    assert_eq!(answer.headers["x-failover-target"], "backup");
    assert_eq!(backup.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_counts_toward_the_turns_attempts() {
    let primary = FakeProvider::new("primary").always(after(3_000, "primary"));
    let backup = FakeProvider::new("backup").always(after(150, "backup"));
    let failover = two(&primary, &backup, at_400ms())
        .limits(TurnLimits {
            max_attempts: 1,
            ..TurnLimits::new()
        })
        .build();
    let answer = send(&failover, request(serde_json::json!({}))).await;
    assert_eq!(answer.headers["x-failover-target"], "primary");
    assert_eq!(backup.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_losers_failure_is_recorded_and_judged_as_usual_and_a_loss_never_cools() {
    // The hedge fails (a 500) while the slow primary runs on: the failure
    // is recorded as a reroute and counted against the backup's health;
    // the primary then commits.
    let primary = FakeProvider::new("primary").always(after(1_000, "primary"));
    let backup = FakeProvider::new("backup").always(Reply::Delayed(
        Duration::from_millis(50),
        Box::new(Reply::status(500, SERVER_500)),
    ));
    let failover = two(&primary, &backup, at_400ms())
        .health(Arc::new(MemoryHealthStore::new(CooldownPolicy {
            failure_threshold: 1,
            ..CooldownPolicy::default()
        })))
        .build();
    let answer = send(&failover, request(serde_json::json!({}))).await;
    assert!(answer.body.contains("primary-7 "), "{}", answer.body);
    assert_eq!(answer.first_byte, Duration::from_secs(1));
    let hedge = answer.attempts.iter().find(|a| a.attempt == 2).unwrap();
    assert_eq!(hedge.decision, Decision::Reroute);
    assert!(hedge.hedged);
    assert_eq!(hedge.status, Some(500));
    assert!(hedge.class.is_some());
    assert_ne!(availability(&failover, "backup"), Availability::Healthy);

    // A primary that loses race after race is never cooled for it.
    let primary = FakeProvider::new("primary").always(after(3_000, "primary"));
    let backup = FakeProvider::new("backup").always(after(150, "backup"));
    let failover = two(&primary, &backup, at_400ms())
        .health(Arc::new(MemoryHealthStore::new(CooldownPolicy {
            failure_threshold: 1,
            ..CooldownPolicy::default()
        })))
        .build();
    for _ in 0..5 {
        let answer = send(&failover, request(serde_json::json!({}))).await;
        assert_eq!(answer.headers["x-failover-target"], "backup");
    }
    assert_eq!(primary.calls(), 5, "still tried first every turn");
    assert_eq!(primary.tally().cut(), 5);
    assert_eq!(availability(&failover, "primary"), Availability::Healthy);
}

#[tokio::test(start_paused = true)]
async fn when_every_racer_fails_the_turn_fails_over_as_without_hedging() {
    let primary = FakeProvider::new("primary").always(Reply::Delayed(
        Duration::from_millis(600),
        Box::new(Reply::status(500, SERVER_500)),
    ));
    let backup = FakeProvider::new("backup").always(Reply::Delayed(
        Duration::from_millis(100),
        Box::new(Reply::status(500, SERVER_500)),
    ));
    let third = FakeProvider::new("third");
    let failover = two(&primary, &backup, at_400ms())
        .target(Target::new("third", third.clone()))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let answer = send(&failover, request(serde_json::json!({}))).await;
    assert_eq!(answer.status, 200, "{} {:#?}", answer.body, answer.attempts);
    assert!(answer.body.contains("third-7 "), "{}", answer.body);
    assert_eq!(third.calls(), 1);
    assert_eq!(answer.headers["x-failover-served-attempt"], "3");
    let seen: Vec<_> = decisions(&answer)
        .into_iter()
        .map(|(n, t, d, _)| (n, t, d))
        .collect();
    assert_eq!(
        seen,
        [
            (1, "primary", Decision::Reroute),
            (2, "backup", Decision::Reroute),
            (3, "third", Decision::Committed),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn requests_that_could_repeat_an_effect_are_never_hedged() {
    let primary = FakeProvider::new("primary").always(after(3_000, "primary"));
    let backup = FakeProvider::new("backup").always(after(150, "backup"));
    let hedge = at_400ms().with_unhedgeable_tools(["charge_card"]);
    let failover = two(&primary, &backup, hedge).build();
    let with_result = |tool: &str| {
        request(serde_json::json!({
            "messages": [
                {"role": "user", "content": "Pay the invoice."},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "paid"},
            ],
            "tools": [{"type": "function", "function": {"name": tool, "parameters": {"type": "object"}}}],
        }))
    };
    let answer = send(&failover, with_result("charge_card")).await;
    assert_eq!(answer.headers["x-failover-target"], "primary");
    assert_eq!(backup.calls(), 0);
    // Another tool's result is hedged as usual.
    let answer = send(&failover, with_result("get_weather")).await;
    assert_eq!(answer.headers["x-failover-target"], "backup");
    assert_eq!(backup.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_percentile_policy_hedges_what_is_slower_than_usual() {
    // Twenty turns at 100 ms teach the primary's p90; a 3 s turn is then
    // hedged at 100 ms, never below the 80 ms floor.
    let primary = FakeProvider::new("primary").always(after(100, "primary"));
    let backup = FakeProvider::new("backup").always(after(150, "backup"));
    let hedge = Hedge::percentile(90.0, Duration::from_millis(80)).with_budget_percent(100.0);
    let failover = two(&primary, &backup, hedge).build();
    for _ in 0..20 {
        let answer = send(&failover, request(serde_json::json!({}))).await;
        assert_eq!(answer.headers["x-failover-target"], "primary");
    }
    // Before 20 samples the floor (80 ms) applied, and every turn was
    // raced by a hedge that lost.
    assert_eq!(backup.calls(), 20);
    assert_eq!(backup.tally().cut(), 20);
    primary.set_always(after(3_000, "primary"));
    let answer = send(&failover, request(serde_json::json!({}))).await;
    assert_eq!(answer.headers["x-failover-target"], "backup");
    // p90 of the primary's times: 100 ms, plus the backup's 150 ms.
    assert_eq!(answer.first_byte, Duration::from_millis(250));
}

#[test]
fn hedges_are_counted_started_won_and_lost() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            // Won: the slow primary loses to the hedge. Lost: the hedge
            // loses to the primary.
            let primary = FakeProvider::new("primary")
                .then(after(3_000, "primary"))
                .always(after(500, "primary"));
            let backup = FakeProvider::new("backup")
                .then(after(150, "backup"))
                .always(after(1_000, "backup"));
            let failover = two(&primary, &backup, at_400ms()).build();
            for _ in 0..2 {
                send(&failover, request(serde_json::json!({}))).await;
            }
        });
    });
    // A snapshot resets the counters: take one.
    let snapshot = snapshotter.snapshot().into_vec();
    let hedges = |result: &str| -> u64 {
        snapshot
            .iter()
            .filter(|(key, ..)| key.key().name() == "failover.hedges")
            .filter(|(key, ..)| {
                key.key()
                    .labels()
                    .any(|l| l.key() == "failover.result" && l.value() == result)
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    };
    assert_eq!(
        (hedges("started"), hedges("won"), hedges("lost")),
        (2, 1, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn max_hedges_bounds_the_racers_of_one_turn() {
    let slow = || after(3_000, "slow");
    let primary = FakeProvider::new("primary").always(slow());
    let second = FakeProvider::new("second").always(slow());
    let third = FakeProvider::new("third").always(after(100, "third"));
    let build = |max: u32| {
        Failover::builder()
            .target(Target::new("primary", primary.clone()))
            .target(Target::new("second", second.clone()))
            .target(Target::new("third", third.clone()))
            .hedge(at_400ms().with_max_hedges(max).with_budget_percent(200.0))
            .build()
    };
    // Two hedges: the second starts 400 ms after the first, and wins.
    let answer = send(&build(2), request(serde_json::json!({}))).await;
    assert_eq!(answer.headers["x-failover-target"], "third");
    assert_eq!(answer.first_byte, Duration::from_millis(900));
    assert_eq!(
        decisions(&answer),
        [
            (1, "primary", Decision::LostRace, false),
            (2, "second", Decision::LostRace, true),
            (3, "third", Decision::Committed, true),
        ]
    );
    assert_eq!((primary.tally().open(), second.tally().open()), (0, 0));
    // One hedge: the third target is never asked.
    let answer = send(&build(1), request(serde_json::json!({}))).await;
    assert_eq!(answer.first_byte, Duration::from_secs(3));
    assert_eq!(third.calls(), 1);
}
