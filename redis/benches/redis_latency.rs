//! On demand (not in CI): the latency Redis adds per action claim and per
//! cooldown transition, on loopback, and that the happy path adds none.
//!
//! ```text
//! cargo bench -p tower-llm-redis --bench redis_latency
//! ```
//!
//! Starts its own `redis-server` on a free loopback port.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

use std::time::{Duration, Instant};

use tower_llm_actions::{ActionStore, ClaimRequest};
use tower_llm_failover::FailureClass;
use tower_llm_failover::{
    health::Admission, health::FailureReport, health::HealthKey, health::HealthStore,
    health::MemoryHealthStore, health::Scope, health::SuccessReport,
};
use tower_llm_redis::{RedisActionStore, RedisHealthStore, connect};

const N: u32 = 2_000;

fn per_op(total: Duration, n: u32) -> String {
    format!("{:.1} µs", total.as_secs_f64() * 1e6 / f64::from(n))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(redis) = redis_server::RedisServer::start("redis_latency").await else {
        return;
    };
    let url = redis.url();

    // Action claims: one script, one round trip each.
    let store = RedisActionStore::new(connect(&url).unwrap());
    let started = Instant::now();
    for i in 0..N {
        let request = ClaimRequest::new(format!("bench-{i}"), "tool", Duration::from_secs(30));
        store.claim(&request).await.unwrap();
    }
    println!(
        "action claim (Redis):        {}",
        per_op(started.elapsed(), N)
    );

    // Cooldown transitions: applied locally, shipped as one script; sync()
    // waits for the round trip (and a refresh).
    let health = RedisHealthStore::builder(connect(&url).unwrap())
        .refresh_every(Duration::from_secs(3600))
        .start()
        .unwrap();
    health.sync().await.unwrap();
    let report = FailureReport {
        retry_after: Some(Duration::from_secs(1)),
        ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
    };
    // On the request path a transition is applied to the local view only.
    let started = Instant::now();
    for i in 0..N {
        health.failure(
            &HealthKey::model("p", format!("m{}", i % 10)),
            report.clone(),
        );
    }
    println!(
        "cooldown transition (request path): {}",
        per_op(started.elapsed(), N)
    );
    health.sync().await.unwrap();
    // Its trip to Redis (one script) and back into a replica's view: ten
    // keys, so the refresh reads a fleet of a realistic size.
    let started = Instant::now();
    for i in 0..N {
        health.failure(
            &HealthKey::model("p", format!("m{}", i % 10)),
            report.clone(),
        );
        health.sync().await.unwrap();
    }
    println!(
        "cooldown transition + sync (background): {}",
        per_op(started.elapsed(), N)
    );

    // The happy path: admit and succeed on a healthy key, on Redis and in
    // memory; and Redis' command count does not move.
    let before = redis.command_calls().await;
    let key = HealthKey::model("healthy", "m");
    let memory = MemoryHealthStore::default();
    for (name, store) in [
        ("happy path (Redis store):    ", &health as &dyn HealthStore),
        ("happy path (memory store):   ", &memory),
    ] {
        let started = Instant::now();
        for _ in 0..N * 50 {
            assert_eq!(store.admit(&key, false), Admission::Open);
            store.success(&key, SuccessReport::Whole { ttft: None });
        }
        println!("{name}{}", per_op(started.elapsed(), N * 50));
    }
    let after = redis.command_calls().await;
    let moved: Vec<_> = after
        .iter()
        .filter(|(name, calls)| name.as_str() != "info" && before.get(*name) != Some(calls))
        .collect();
    println!("Redis commands during the happy path: {moved:?} (expected none)");
}
