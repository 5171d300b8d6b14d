//! A Redis rate limit is one allowance across replicas.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_rate_limit_is_one_allowance_across_replicas() {
    use tower_llm_failover::limit::{PerMinute, RateDecision, RateLimitStore};
    use tower_llm_redis::{RedisRateLimits, connect};
    let Some(redis) = redis_server::RedisServer::start("a_redis_rate_limit_is_one_allowance").await
    else {
        return;
    };
    let a = RedisRateLimits::new(connect(&redis.url()).unwrap());
    let b = RedisRateLimits::new(connect(&redis.url()).unwrap());
    let rate = PerMinute::new(4).unwrap();
    let mut allowed = 0;
    for i in 0..10 {
        let store = if i % 2 == 0 { &a } else { &b };
        match store.take("rpm:team-a", rate, 1).await.unwrap() {
            RateDecision::Allowed => allowed += 1,
            RateDecision::Limited { retry_after } => {
                assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(15));
            }
        }
    }
    assert_eq!(allowed, 4, "both replicas drew on one allowance");
    // Another bucket is its own.
    assert_eq!(
        a.take("rpm:team-b", rate, 1).await.unwrap(),
        RateDecision::Allowed
    );
}
