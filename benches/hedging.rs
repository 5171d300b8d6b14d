//! Hedging against a provider that is slow for some requests.
//!
//! A fake primary whose time to first output is 100 ms for 90 % of
//! requests and 3 s for 10 % (drawn from a fixed seed, so every policy
//! sees the same requests), a fake backup at 150 ms, 1,000 streamed turns
//! at concurrency 16, with hedging off, a fixed `hedge_after`, and the
//! percentile policy. On paused tokio time with in-process fakes: the
//! times are the fakes' delays plus the gateway's scheduling, exactly,
//! with no machine noise (this is a latency-shape bench, not a speed
//! one). Every response is checked for splices.
//!
//! `cargo bench --bench hedging` (add `-- --budget 15` to change the
//! hedge budget of the hedging runs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_llm_failover::Decision;
use tower_llm_failover::failover::{Failover, Hedge, Target};
use tower_llm_failover::observe::TurnRecord;
use tower_llm_testing::{FakeProvider, Reply};

const TURNS: usize = 1_000;
const CONCURRENCY: usize = 16;
const TOKENS: usize = 20;
const FAST: Duration = Duration::from_millis(100);
const SLOW: Duration = Duration::from_secs(3);
const BACKUP: Duration = Duration::from_millis(150);

fn stream_after(delay: Duration, name: &str) -> Reply {
    Reply::Delayed(delay, Box::new(Reply::stream(name, TOKENS)))
}

/// What one policy's run came to.
struct Run {
    name: String,
    first_bytes: Vec<Duration>,
    extra_attempts: usize,
    hedged_turns: usize,
    lost_races: usize,
    /// Output frames the losers were sent before their connection closed.
    loser_frames: u64,
    /// Prompt tokens of the losers (billed: the provider read the prompt).
    loser_prompt_tokens: u64,
    splices: usize,
    failed: usize,
}

impl Run {
    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.first_bytes.clone();
        sorted.sort_unstable();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }
}

/// Whether `body` is one provider's stream, whole and in order.
fn unspliced(body: &str) -> bool {
    let names = ["primary", "backup"];
    let from: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| body.contains(&format!("{n}-0 ")))
        .collect();
    let [name] = from[..] else {
        return false;
    };
    let other = names.iter().find(|n| **n != name).unwrap();
    let mut at = 0;
    for i in 0..TOKENS {
        match body[at..].find(&format!("{name}-{i} ")) {
            Some(found) => at += found,
            None => return false,
        }
    }
    body.starts_with("data: {") && body.ends_with("data: [DONE]\n\n") && !body.contains(other)
}

async fn run(name: &str, hedge: Option<Hedge>, slow: &[bool]) -> Run {
    let mut primary = FakeProvider::new("primary");
    for &slow in slow {
        primary = primary.then(stream_after(if slow { SLOW } else { FAST }, "primary"));
    }
    let backup = FakeProvider::new("backup").always(stream_after(BACKUP, "backup"));
    let mut builder = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()));
    if let Some(hedge) = hedge {
        builder = builder.hedge(hedge);
    }
    let failover = builder.build();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let failover = failover.clone();
        let next = Arc::clone(&next);
        workers.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while next.fetch_add(1, Ordering::SeqCst) < TURNS {
                seen.push(turn(&failover).await);
            }
            seen
        }));
    }
    let mut result = Run {
        name: name.to_owned(),
        first_bytes: Vec::new(),
        extra_attempts: 0,
        hedged_turns: 0,
        lost_races: 0,
        loser_frames: primary.tally().cut_frames() + backup.tally().cut_frames(),
        loser_prompt_tokens: 0,
        splices: 0,
        failed: 0,
    };
    for worker in workers {
        for (first_byte, body, record, ok) in worker.await.unwrap() {
            result.first_bytes.push(first_byte);
            result.failed += usize::from(!ok);
            result.splices += usize::from(ok && !unspliced(&body));
            let attempts = record.attempts();
            result.extra_attempts += attempts.len().saturating_sub(1);
            result.hedged_turns += usize::from(attempts.iter().any(|a| a.hedged));
            for lost in attempts.iter().filter(|a| a.decision == Decision::LostRace) {
                result.lost_races += 1;
                result.loser_prompt_tokens += lost.usage.map_or(0, |u| u.input_tokens);
            }
        }
    }
    result.loser_frames = primary.tally().cut_frames() + backup.tally().cut_frames();
    result
}

async fn turn(failover: &Failover<FakeProvider>) -> (Duration, String, TurnRecord, bool) {
    let body = r#"{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"Tell me about caching in one paragraph."}]}"#;
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let sent = Instant::now();
    let response = failover.clone().oneshot(request).await.unwrap();
    let ok = response.status() == 200;
    let record = response.extensions().get::<TurnRecord>().unwrap().clone();
    let mut body = response.into_body();
    let mut first_byte = None;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            first_byte.get_or_insert_with(|| sent.elapsed());
            bytes.extend_from_slice(&data);
        }
    }
    (
        first_byte.unwrap_or_else(|| sent.elapsed()),
        String::from_utf8(bytes).unwrap(),
        record,
        ok,
    )
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

fn main() {
    let mut budget = 5.0_f32;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--budget" {
            budget = args.next().and_then(|b| b.parse().ok()).unwrap_or(budget);
        }
    }
    // The same slow requests for every policy.
    let mut rng = fastrand::Rng::with_seed(28);
    let slow: Vec<bool> = (0..TURNS).map(|_| rng.f64() < 0.10).collect();
    let slow_share = slow.iter().filter(|s| **s).count() as f64 / TURNS as f64;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let policies: Vec<(String, Option<Hedge>)> = vec![
        ("off".to_owned(), None),
        (
            format!("hedge_after 200 ms, budget {budget} %"),
            Some(Hedge::after(Duration::from_millis(200)).with_budget_percent(budget)),
        ),
        (
            format!("p95, floor 120 ms, budget {budget} %"),
            Some(Hedge::percentile(95.0, Duration::from_millis(120)).with_budget_percent(budget)),
        ),
        (
            format!("p90, floor 120 ms, budget {budget} %"),
            Some(Hedge::percentile(90.0, Duration::from_millis(120)).with_budget_percent(budget)),
        ),
    ];
    println!(
        "{TURNS} streamed turns at concurrency {CONCURRENCY}; primary {} ms (90 %) / {} ms (10 %: {:.1} % drawn), backup {} ms",
        ms(FAST),
        ms(SLOW),
        slow_share * 100.0,
        ms(BACKUP)
    );
    println!();
    println!(
        "| policy | p50 TTFB | p95 | p99 | extra attempts / turn | turns hedged | races lost | loser frames sent | loser prompt tokens | splices | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut fast_p50 = None;
    for (name, hedge) in policies {
        let r = runtime.block_on(run(&name, hedge, &slow));
        fast_p50.get_or_insert(r.percentile(50.0));
        println!(
            "| {} | {} ms | {} ms | {} ms | {:.3} | {:.1} % | {} | {} | {} | {} | {} |",
            r.name,
            ms(r.percentile(50.0)),
            ms(r.percentile(95.0)),
            ms(r.percentile(99.0)),
            r.extra_attempts as f64 / TURNS as f64,
            r.hedged_turns as f64 * 100.0 / TURNS as f64,
            r.lost_races,
            r.loser_frames,
            r.loser_prompt_tokens,
            r.splices,
            r.failed,
        );
    }
    if let Some(p50) = fast_p50 {
        println!();
        println!(
            "Target: p99 at most 2x the fast path's p50 ({} ms) with the percentile policy; extra attempts at most 12 % of turns; 0 splices.",
            ms(p50 * 2)
        );
    }
}
