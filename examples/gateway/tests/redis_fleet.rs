//! Redis for a fleet: every store over `rediss://` (a TLS-only
//! `redis-server` trusting a test CA), over a three-node Redis Cluster
//! (`redis-cli --cluster create`) and over a
//! Sentinel-managed primary, each started by the test on loopback.
//!
//! Without `redis-server`/`redis-cli` these tests skip loudly, except under
//! `CI=true`, where they fail (`.ci/run` installs them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The library's test support (tests/support/), shared by #[path]: each
// includer uses part of it.
#[allow(unreachable_pub)]
#[path = "../../../tests/support/redis_server.rs"]
mod redis_server;
#[allow(dead_code, unreachable_pub)]
#[path = "../../../tests/support/tls.rs"]
mod tls;

use std::fmt::Debug;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use redis_server::RedisServer;
use serde_json::json;
use tower::retry::budget::Budget as _;
use tower_llm_actions::{ActionStore, Claim, ClaimRequest, FenceToken};
use tower_llm_failover::FailureClass;
use tower_llm_failover::limit::{PerMinute, RateDecision, RateLimitStore};
use tower_llm_failover::{
    Cost, budget::RetryBudgetConfig, budget::SpendStore, budget::SpendWindow,
};
use tower_llm_failover::{
    health::Availability, health::FailureReport, health::HealthKey, health::HealthStore,
    health::Scope,
};
use tower_llm_gateway::app;
use tower_llm_redis::{
    RedisActionStore, RedisHealthStore, RedisRateLimits, RedisRetryBudget, RedisSpendStore,
    TlsCertificates, connect, connect_sentinel, connect_tls,
};

/// Runs one operation of each store over connections from `connection`
/// (two replicas where sharing is the point) and asserts the outcomes.
/// `prefix` keeps runs on one server apart.
async fn every_store_works<C, F>(connection: F, prefix: &str)
where
    C: ConnectionLike + Clone + Send + Sync + Debug + 'static,
    F: Fn() -> C,
{
    health_cooldown_reaches_the_other_replica(&connection, prefix).await;
    spend_reserves_up_to_the_ceiling(&connection, prefix).await;
    retry_budget_grants_from_shipped_deposits(&connection, prefix).await;
    action_claim_is_seen_and_replayed(&connection, prefix).await;
    rate_limit_allows_two_a_minute(&connection, prefix).await;
}

/// Health: a cooldown one replica learns is the other's after a sync.
async fn health_cooldown_reaches_the_other_replica<C, F>(connection: &F, prefix: &str)
where
    C: ConnectionLike + Clone + Send + Sync + Debug + 'static,
    F: Fn() -> C,
{
    let health = || {
        RedisHealthStore::builder(connection())
            .prefix(prefix)
            .refresh_every(Duration::from_secs(3600))
            .start()
            .unwrap()
    };
    let (a, b) = (health(), health());
    let key = HealthKey::model("primary", "gpt-x");
    a.failure(
        &key,
        FailureReport {
            retry_after: Some(Duration::from_secs(30)),
            ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
        },
    );
    a.sync().await.unwrap();
    b.sync().await.unwrap();
    assert!(
        matches!(b.availability(&key), Availability::Cooling(_)),
        "the other replica learned the cooldown: {:?}",
        b.availability(&key)
    );
}

/// Spend: reserve to the ceiling, a refusal past it, a settlement.
async fn spend_reserves_up_to_the_ceiling<C, F>(connection: &F, prefix: &str)
where
    C: ConnectionLike + Clone + Send + Sync + Debug + 'static,
    F: Fn() -> C,
{
    let spend = RedisSpendStore::new(connection()).prefix(prefix);
    let ceiling = Cost::from_nanos(100);
    let day = SpendWindow::Day;
    let first = spend
        .reserve("acme", day, Cost::from_nanos(60), ceiling)
        .await
        .unwrap();
    assert!(first.reserved);
    let second = spend
        .reserve("acme", day, Cost::from_nanos(50), ceiling)
        .await
        .unwrap();
    assert!(second.reserved, "60 is below the ceiling");
    assert_eq!(second.spent, Cost::from_nanos(110));
    let third = spend
        .reserve("acme", day, Cost::from_nanos(1), ceiling)
        .await
        .unwrap();
    assert!(!third.reserved, "110 is at the ceiling");
    let settled = spend
        .settle("acme", day, Cost::from_nanos(50), Cost::from_nanos(10))
        .await
        .unwrap();
    assert_eq!(settled, Cost::from_nanos(70));
    let check = spend.check("acme", day, ceiling).await.unwrap();
    assert_eq!(check.spent, Cost::from_nanos(70));
    let other = spend.check("globex", day, ceiling).await.unwrap();
    assert_eq!(other.spent, Cost::ZERO, "a tenant of its own");
}

/// Retry budget: deposits shipped, retries granted from them, no more.
async fn retry_budget_grants_from_shipped_deposits<C, F>(connection: &F, prefix: &str)
where
    C: ConnectionLike + Clone + Send + Sync + Debug + 'static,
    F: Fn() -> C,
{
    let config = RetryBudgetConfig {
        min_per_sec: 0,
        retry_percent: 1.0,
        ..RetryBudgetConfig::new()
    };
    let budget = RedisRetryBudget::builder(connection(), config)
        .prefix(prefix)
        .sync_every(Duration::from_secs(3600))
        .start()
        .unwrap();
    // The turns' deposits and withdrawals are tower's `Budget` calls.
    for _ in 0..4 {
        budget.deposit();
    }
    budget.sync().await.unwrap();
    assert!(budget.is_shared(), "the budget is on Redis");
    let granted = (0..20).filter(|_| budget.withdraw()).count();
    assert!(
        (1..=4).contains(&granted),
        "four deposits fund 1..=4 retries, granted {granted}"
    );
}

/// Action claims: one replica acquires, the other sees it running,
/// then the stored result replays.
async fn action_claim_is_seen_and_replayed<C, F>(connection: &F, prefix: &str)
where
    C: ConnectionLike + Clone + Send + Sync + Debug + 'static,
    F: Fn() -> C,
{
    let (x, y) = (
        RedisActionStore::new(connection()).prefix(prefix),
        RedisActionStore::new(connection()).prefix(prefix),
    );
    let request = ClaimRequest::new("order-1", "send_order", Duration::from_secs(30));
    let claimed = x.claim(&request).await.unwrap();
    let Claim::Acquired { run } = claimed.claim else {
        panic!("the first claim acquires: {:?}", claimed.claim);
    };
    assert_eq!(run, FenceToken::new(1));
    assert!(matches!(
        y.claim(&request).await.unwrap().claim,
        Claim::InProgress { .. }
    ));
    x.complete(&request.action_id, run, None, json!({"ok": true}))
        .await
        .unwrap();
    assert_eq!(
        y.claim(&request).await.unwrap().claim,
        Claim::Succeeded {
            result: json!({"ok": true})
        }
    );
}

/// Rate limits: two a minute, the third waits.
async fn rate_limit_allows_two_a_minute<C, F>(connection: &F, prefix: &str)
where
    C: ConnectionLike + Clone + Send + Sync + Debug + 'static,
    F: Fn() -> C,
{
    let rate = RedisRateLimits::new(connection()).prefix(prefix);
    let per_minute = PerMinute::new(2).unwrap();
    assert_eq!(
        rate.take("key-a", per_minute, 1).await.unwrap(),
        RateDecision::Allowed
    );
    assert_eq!(
        rate.take("key-a", per_minute, 1).await.unwrap(),
        RateDecision::Allowed
    );
    assert!(matches!(
        rate.take("key-a", per_minute, 1).await.unwrap(),
        RateDecision::Limited { .. }
    ));
}

// ------------------------------------------------------------------ TLS

/// A TLS-only server and a certificate for 127.0.0.1 from a test CA.
async fn tls_server(test: &str) -> Option<(RedisServer, tls::Ca)> {
    let ca = tls::Ca::new("redis test CA");
    let leaf = ca.leaf(&["127.0.0.1", "localhost"], false);
    let server = RedisServer::start_tls(test, &leaf.cert_pem, &leaf.key_pem, &ca.pem()).await?;
    Some((server, ca))
}

fn trusting(ca: &tls::Ca) -> TlsCertificates {
    TlsCertificates {
        client_tls: None,
        root_cert: Some(ca.pem().into_bytes()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_works_over_rediss_trusting_the_servers_ca() {
    let Some((server, ca)) = tls_server("every_store_works_over_rediss").await else {
        return;
    };
    assert!(server.url().starts_with("rediss://"));
    let url = server.url();
    every_store_works(|| connect_tls(&url, trusting(&ca)).unwrap(), "tls").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_refuses_a_server_it_does_not_trust() {
    let Some((server, _ca)) = tls_server("rediss_refuses_an_untrusted_server").await else {
        return;
    };
    // The platform's roots do not hold the test CA: the handshake fails,
    // and the store reports Redis unreachable rather than talking in clear.
    let spend = RedisSpendStore::new(connect(&server.url()).unwrap());
    let error = spend
        .check("acme", SpendWindow::Day, Cost::from_nanos(1))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            tower_llm_failover::budget::SpendError::Unavailable(_)
        ),
        "{error:?}"
    );
    // Another CA is no better.
    let other = tls::Ca::new("another CA");
    let spend = RedisSpendStore::new(connect_tls(&server.url(), trusting(&other)).unwrap());
    assert!(
        spend
            .check("acme", SpendWindow::Day, Cost::from_nanos(1))
            .await
            .is_err()
    );
    // Certificate checks cannot be switched off, nor TLS settings dropped.
    assert!(connect(&format!("{}/#insecure", server.url())).is_err());
    let plain = format!("redis://127.0.0.1:{}", server.port);
    assert!(connect_tls(&plain, trusting(&other)).is_err());
}

// -------------------------------------------------------------- cluster

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_works_on_a_three_node_cluster() {
    use tower_llm_redis::connect_cluster;
    let Some(cluster) = redis_server::RedisCluster::start("every_store_works_on_a_cluster").await
    else {
        return;
    };
    let urls = cluster.urls();
    // Any one node is enough to find the others.
    every_store_works(|| connect_cluster(&urls[..1], None).unwrap(), "tlf").await;
    // The stores' keys spread over more than one node: the cluster, not
    // one node of it, held them.
    let mut holding = 0;
    for node in &cluster.nodes {
        let mut c = node
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let keys: i64 = ::redis::cmd("DBSIZE").query_async(&mut c).await.unwrap();
        if keys > 0 {
            holding += 1;
        }
    }
    assert!(holding >= 2, "keys on {holding} node(s) of 3");
}

#[tokio::test]
async fn a_cluster_needs_a_node() {
    let none: [&str; 0] = [];
    assert!(tower_llm_redis::connect_cluster(&none, None).is_err());
}

// ------------------------------------------------------------- sentinel

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_works_on_a_sentinel_managed_primary() {
    let Some(primary) = RedisServer::start("sentinel_primary").await else {
        return;
    };
    let Some(sentinel) =
        RedisServer::start_sentinel("sentinel_primary", &primary, "mymaster").await
    else {
        return;
    };
    let urls = [sentinel.url()];
    every_store_works(|| connect_sentinel(&urls, "mymaster").unwrap(), "tlf").await;
    // The writes landed on the primary the sentinel names.
    let mut c = primary
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: i64 = ::redis::cmd("DBSIZE").query_async(&mut c).await.unwrap();
    assert!(keys > 0, "the primary holds the stores' keys");
}

#[tokio::test]
async fn a_sentinel_for_an_unknown_service_is_an_error_not_a_hang() {
    let Some(primary) = RedisServer::start("sentinel_unknown_service").await else {
        return;
    };
    let Some(sentinel) =
        RedisServer::start_sentinel("sentinel_unknown_service", &primary, "mymaster").await
    else {
        return;
    };
    let spend = RedisSpendStore::new(connect_sentinel(&[sentinel.url()], "other").unwrap());
    let started = std::time::Instant::now();
    let result = spend
        .check("acme", SpendWindow::Day, Cost::from_nanos(1))
        .await;
    assert!(result.is_err(), "no primary named `other`");
    assert!(started.elapsed() < Duration::from_secs(5));
}

// -------------------------------------------------------------- gateway

/// A gateway whose `[state]` is `state`, before one fake provider; posts
/// one turn as tenant `acme` and returns the status.
async fn gateway_turn(state: &str) -> Result<u16, String> {
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower_llm_testing::upstream::FakeUpstream;

    let upstream = FakeUpstream::builder("primary")
        .tokens(4)
        .start()
        .await
        .unwrap();
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[state]
tenant_header = "x-tenant"
tenant_ceiling_usd = 10.0
{state}

[[providers]]
name = "primary"
base_url = "{}"

[[routes]]
model = "*"
targets = [
  {{ provider = "primary", input_per_million = 1000.0, output_per_million = 1000.0 }},
]
"#,
        upstream.base_url()
    );
    let config = app::Config::from_toml(&config).map_err(|e| e.to_string())?;
    let gateway = app::Gateway::from_config(&config).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::serve(gateway, listener);
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = json!({
        "model": "gpt-4o",
        "stream": false,
        "messages": [{"role": "user", "content": "hi"}]
    });
    let request = http::Request::post(format!("http://{}/v1/chat/completions", running.addr))
        .header("content-type", "application/json")
        .header("x-tenant", "acme")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), client.request(request))
        .await
        .expect("the gateway answers in time")
        .unwrap();
    Ok(response.status().as_u16())
}

/// Whether some node among `servers` holds a spend counter of `acme`.
async fn spent_on(servers: &[&RedisServer]) -> bool {
    for server in servers {
        let mut c = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg("{tlf:spend:acme}:*")
            .query_async(&mut c)
            .await
            .unwrap();
        if !keys.is_empty() {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_meters_tenants_on_a_cluster() {
    let Some(cluster) = redis_server::RedisCluster::start("the_gateway_on_a_cluster").await else {
        return;
    };
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let state = format!("redis_cluster_urls = [{}]", urls.join(", "));
    assert_eq!(gateway_turn(&state).await.unwrap(), 200);
    let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
    assert!(spent_on(&nodes).await, "the turn's spend is on the cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_meters_tenants_on_a_sentinel_primary() {
    let Some(primary) = RedisServer::start("the_gateway_on_sentinel").await else {
        return;
    };
    let Some(sentinel) =
        RedisServer::start_sentinel("the_gateway_on_sentinel", &primary, "mymaster").await
    else {
        return;
    };
    let state = format!(
        "redis_sentinel = {{ urls = [{:?}], service = \"mymaster\" }}",
        sentinel.url()
    );
    assert_eq!(gateway_turn(&state).await.unwrap(), 200);
    assert!(
        spent_on(&[&primary]).await,
        "the turn's spend is on the primary"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_trusts_redis_ca_file_for_rediss() {
    let Some((server, ca)) = tls_server("the_gateway_over_rediss").await else {
        return;
    };
    let dir = tls::Scratch::new();
    let ca_file = dir.write("redis-ca.pem", &ca.pem());
    let state = format!(
        "redis_url = {:?}\nredis_ca_file = {:?}",
        server.url(),
        ca_file.to_string_lossy()
    );
    assert_eq!(gateway_turn(&state).await.unwrap(), 200);
    assert!(
        spent_on(&[&server]).await,
        "the turn's spend is on Redis over TLS"
    );
}

#[tokio::test]
async fn the_gateway_takes_one_redis_only() {
    let state = "redis_url = \"redis://127.0.0.1:1\"\n\
                 redis_sentinel = { urls = [\"redis://127.0.0.1:2\"], service = \"m\" }";
    let error = gateway_turn(state).await.unwrap_err();
    assert!(error.contains("one of redis_url"), "{error}");
}
