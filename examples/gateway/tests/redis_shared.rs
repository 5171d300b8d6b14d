//! Shared state on a real `redis-server` (started by each test on a free
//! loopback port in a temporary directory): two replicas share one claim
//! per action, one cooldown, one tenant ceiling and one retry budget; Redis
//! killed mid-run and restarted; two gateway processes end to end.
//!
//! Without `redis-server` these tests skip loudly, except under `CI=true`,
//! where they fail (`.ci/run` installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The library's test support (tests/support/), shared by #[path]: each
// includer uses part of it.
#[path = "support/process.rs"]
mod process;
#[allow(unreachable_pub)]
#[path = "../../../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use process::{gateway_binary, spawn_gateway};
use redis_server::RedisServer;
use serde_json::{Value, json};
use std::process::Stdio;
use tower::retry::budget::Budget as _;
use tower::{BoxError, Service, ServiceExt};
use tower_llm_actions::{
    ActionError, ActionExecutorLayer, ActionId, ActionState, ActionStore, ArgumentsDigest, Claim,
    ClaimRequest, Reconciliation, StoreError, ToolCall,
};
use tower_llm_failover::FailureClass;
use tower_llm_failover::identity::ClientId;
use tower_llm_failover::{
    Cost, budget::RetryBudgetConfig, budget::SpendStore, budget::SpendWindow,
    budget::TenantRefusal, budget::TenantSpend,
};
use tower_llm_failover::{
    failover::Failover, failover::Target, health::Admission, health::Availability,
    health::CooldownPolicy, health::FailureReport, health::HealthKey, health::HealthStore,
    health::Scope,
};
use tower_llm_gateway::app;
use tower_llm_redis::{
    RedisActionStore, RedisHealthStore, RedisRetryBudget, RedisSpendStore, connect,
};
use tower_llm_testing::FakeProvider;
use tower_llm_testing::upstream::{FakeUpstream, Fault};

/// A bounded wait for something another replica learns in the background
/// (200 × 25 ms); the assertion is on the outcome, not on the time.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never happened: {what}");
}

// ---------------------------------------------------------------- actions

/// One replica's executor: its own connection, the shared Redis.
fn executor(
    url: &str,
    effects: Arc<AtomicUsize>,
) -> impl Service<ToolCall, Response = Value, Error = ActionError, Future: Send> + Clone + use<> {
    let store: Arc<dyn ActionStore> = Arc::new(RedisActionStore::new(connect(url).unwrap()));
    tower::ServiceBuilder::new()
        .layer(
            ActionExecutorLayer::new(store)
                .in_progress_wait(Duration::from_secs(10))
                .effect_timeout(Duration::from_secs(10)),
        )
        .service_fn(move |call: ToolCall| {
            let effects = Arc::clone(&effects);
            async move {
                effects.fetch_add(1, Ordering::SeqCst);
                // Long enough for duplicates to arrive while it runs.
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, BoxError>(json!({ "order": call.action_id.as_str() }))
            }
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_run_each_action_once_across_500_submissions() {
    let Some(redis) = RedisServer::start("two_replicas_run_each_action_once").await else {
        return;
    };
    let effects = Arc::new(AtomicUsize::new(0));
    let a = executor(&redis.url(), Arc::clone(&effects));
    let b = executor(&redis.url(), Arc::clone(&effects));
    let calls: Vec<_> = (0..500)
        .map(|i| {
            let mut replica = if i % 2 == 0 { a.clone() } else { b.clone() };
            let call = ToolCall::new(format!("order-{}", i % 20), "send_order", json!({}))
                .with_attempt_id(format!("attempt-{i}"));
            tokio::spawn(async move { replica.ready().await?.call(call).await })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    assert_eq!(
        effects.load(Ordering::SeqCst),
        20,
        "exactly one effect per action id"
    );
    for (i, answer) in answers.iter().enumerate() {
        let value = answer
            .as_ref()
            .expect("every submission gets the stored result");
        assert_eq!(value["order"], format!("order-{}", i % 20));
    }
}

/// A plain connection for looking at what the stores wrote.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn pttl(url: &str, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut raw(url).await)
        .await
        .unwrap()
}

/// Finished records keep 7 days by default, so a late resubmission is a
/// replay; a TTL and a lease of `Duration::MAX` mean "very long" (capped at
/// 100 years for Redis), not a script error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_action_records_keep_a_week_and_duration_max_is_very_long() {
    let Some(redis) = RedisServer::start("redis_action_records_keep_a_week").await else {
        return;
    };
    let url = redis.url();
    let store = RedisActionStore::new(connect(&url).unwrap());
    let request = ClaimRequest::new("week", "send_order", Duration::from_secs(30));
    let Claim::Acquired { run } = store.claim(&request).await.unwrap().claim else {
        panic!("fresh action")
    };
    store
        .complete(&"week".into(), run, None, json!({"ok": 1}))
        .await
        .unwrap();
    let left = pttl(&url, "{tlf:action:week}").await;
    let week = 7 * 86_400 * 1000;
    assert!(left > week - 60_000 && left <= week, "{left} ms");

    let forever = RedisActionStore::new(connect(&url).unwrap()).ttl(Duration::MAX);
    let request = ClaimRequest::new("forever", "send_order", Duration::MAX);
    let Claim::Acquired { run } = forever.claim(&request).await.unwrap().claim else {
        panic!("fresh action")
    };
    assert_eq!(
        forever.claim(&request).await.unwrap().claim,
        Claim::InProgress { run },
        "a lease of Duration::MAX is trusted"
    );
    forever
        .complete(&"forever".into(), run, None, json!({"ok": 2}))
        .await
        .unwrap();
    assert_eq!(
        forever.claim(&request).await.unwrap().claim,
        Claim::Succeeded {
            result: json!({"ok": 2})
        }
    );
    let left = pttl(&url, "{tlf:action:forever}").await;
    assert!(left > 99 * 365 * 86_400 * 1000, "{left} ms");
}

/// On Redis too the same action id with other arguments is refused,
/// never replayed or run, while the same arguments spelled otherwise
/// replay; the record keeps the first call's digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_the_same_action_id_with_other_arguments() {
    let Some(redis) = RedisServer::start("redis_refuses_other_arguments").await else {
        return;
    };
    let effects = Arc::new(AtomicUsize::new(0));
    let mut a = executor(&redis.url(), Arc::clone(&effects));
    let mut b = executor(&redis.url(), Arc::clone(&effects));
    let call = |args: Value| ToolCall::new("order-args", "send_order", args);
    let first = a
        .ready()
        .await
        .unwrap()
        .call(call(json!({ "sku": "A", "qty": 1 })))
        .await
        .unwrap();
    let again = b
        .ready()
        .await
        .unwrap()
        .call(call(json!({ "qty": 1, "sku": "A" })))
        .await
        .unwrap();
    assert_eq!(again, first);
    let err = b
        .ready()
        .await
        .unwrap()
        .call(call(json!({ "sku": "A", "qty": 2 })))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ActionError::Store(StoreError::ArgumentsDiffer { ref action_id })
                if action_id.as_str() == "order-args"
        ),
        "{err}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 1);

    let store = RedisActionStore::new(connect(&redis.url()).unwrap());
    let record = store.get(&"order-args".into()).await.unwrap().unwrap();
    assert_eq!(
        record.arguments,
        Some(ArgumentsDigest::of(&json!({ "sku": "A", "qty": 1 })))
    );
    assert_eq!(record.state, ActionState::Succeeded { result: first });

    // A resolution with other arguments is refused as well.
    let mine = ClaimRequest::new("order-unknown", "send_order", Duration::from_secs(30))
        .with_arguments(&json!({ "qty": 1 }));
    let theirs = ClaimRequest::new("order-unknown", "send_order", Duration::from_secs(30))
        .with_arguments(&json!({ "qty": 5 }));
    let Claim::Acquired { run } = store.claim(&mine).await.unwrap().claim else {
        panic!("fresh action")
    };
    store
        .mark_unknown(&"order-unknown".into(), run, None)
        .await
        .unwrap();
    assert!(matches!(
        store
            .resolve(&theirs, run, Reconciliation::NotApplied)
            .await,
        Err(StoreError::ArgumentsDiffer { .. })
    ));
    assert_eq!(
        store.state(&"order-unknown".into()).await.unwrap(),
        ActionState::Unknown
    );
}

/// Two tenants' `call_0` on Redis are two records under two keys: each
/// effect runs once per tenant and each tenant replays its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_two_tenants_actions_with_one_id_apart() {
    let Some(redis) = RedisServer::start("redis_keeps_two_tenants_apart").await else {
        return;
    };
    let effects = Arc::new(AtomicUsize::new(0));
    let store: Arc<dyn ActionStore> =
        Arc::new(RedisActionStore::new(connect(&redis.url()).unwrap()));
    let counted = Arc::clone(&effects);
    let mut executor = tower::ServiceBuilder::new()
        .layer(ActionExecutorLayer::new(Arc::clone(&store)))
        .service_fn(move |call: ToolCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            let tenant = call.action_id.tenant().unwrap_or("").to_owned();
            async move { Ok::<_, BoxError>(json!({ "for": tenant })) }
        });
    let call = |tenant: &str| ToolCall::new("call_0", "send_order", json!({})).with_tenant(tenant);
    for _ in 0..2 {
        for tenant in ["acme", "globex"] {
            let answer = executor
                .ready()
                .await
                .unwrap()
                .call(call(tenant))
                .await
                .unwrap();
            assert_eq!(answer, json!({ "for": tenant }));
        }
    }
    assert_eq!(effects.load(Ordering::SeqCst), 2, "one effect per tenant");
    let acme = store
        .get(&ActionId::new("call_0").with_tenant("acme"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(acme.action_id.tenant(), Some("acme"));
    assert!(store.get(&"call_0".into()).await.unwrap().is_none());
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*action*")
        .query_async(&mut raw(&redis.url()).await)
        .await
        .unwrap();
    let mut records: Vec<_> = keys
        .into_iter()
        .filter(|k| !k.ends_with(":attempts"))
        .collect();
    records.sort();
    assert_eq!(
        records,
        [
            "{tlf:taction:4:acme:call_0}",
            "{tlf:taction:6:globex:call_0}"
        ]
    );
}

/// `WAIT 1` with no replica: the claim fails closed (typed, no effect
/// runs) and is given back; with a replica attached, the same call runs
/// once and the replica holds the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_no_replica_acknowledged_fails_closed_until_one_does() {
    let Some(primary) = RedisServer::start("a_claim_no_replica_acknowledged").await else {
        return;
    };
    let effects = Arc::new(AtomicUsize::new(0));
    let store: Arc<dyn ActionStore> = Arc::new(
        RedisActionStore::new(connect(&primary.url()).unwrap())
            .wait_for_replicas(1, Duration::from_millis(100)),
    );
    let counted = Arc::clone(&effects);
    let mut executor = tower::ServiceBuilder::new()
        .layer(ActionExecutorLayer::new(Arc::clone(&store)))
        .service_fn(move |_call: ToolCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(json!({ "order": "placed" })) }
        });
    let call = || ToolCall::new("order-wait", "send_order", json!({ "sku": "A" }));

    let err = executor
        .ready()
        .await
        .unwrap()
        .call(call())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ActionError::Store(StoreError::NotReplicated {
                ref action_id,
                acknowledged: 0,
                wanted: 1,
            }) if action_id.as_str() == "order-wait"
        ),
        "{err}"
    );
    assert!(err.is_store_unavailable());
    assert_eq!(
        effects.load(Ordering::SeqCst),
        0,
        "no effect without replicas"
    );
    // The run was given back: retryable, so the next claim may run it.
    let plain = RedisActionStore::new(connect(&primary.url()).unwrap());
    let record = plain.get(&"order-wait".into()).await.unwrap().unwrap();
    assert!(
        matches!(
            record.state,
            ActionState::Failed {
                retryable: true,
                ..
            }
        ),
        "{record:?}"
    );

    // Redis waits 5 s by default before a diskless full sync, to batch
    // replicas: no wait here, so the replica is in sync at once.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg("0")
        .query_async(&mut raw(&primary.url()).await)
        .await
        .unwrap();
    let Some(replica) =
        RedisServer::start_replica_of("a_claim_no_replica_acknowledged", &primary).await
    else {
        return;
    };
    eventually("the replica is in sync", || async {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut raw(&primary.url()).await)
            .await
            .unwrap();
        info.contains("state=online")
    })
    .await;
    // The same claim through a store that waits long enough for a replica
    // on a busy machine: 100 ms (right for the failing half above) is
    // shorter than a loaded 2-core runner may take to acknowledge.
    let store: Arc<dyn ActionStore> = Arc::new(
        RedisActionStore::new(connect(&primary.url()).unwrap())
            .wait_for_replicas(1, Duration::from_secs(5)),
    );
    let counted = Arc::clone(&effects);
    let mut executor = tower::ServiceBuilder::new()
        .layer(ActionExecutorLayer::new(store))
        .service_fn(move |_call: ToolCall| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(json!({ "order": "placed" })) }
        });
    let answer = executor.ready().await.unwrap().call(call()).await.unwrap();
    assert_eq!(answer, json!({ "order": "placed" }));
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    // The result was acknowledged by the replica before the call returned.
    let kind: Option<String> = redis::cmd("HGET")
        .arg("{tlf:action:order-wait}")
        .arg("kind")
        .query_async(&mut raw(&replica.url()).await)
        .await
        .unwrap();
    assert_eq!(kind.as_deref(), Some("succeeded"));
    // A replay is answered, and runs nothing.
    let again = executor.ready().await.unwrap().call(call()).await.unwrap();
    assert_eq!(again, answer);
    assert_eq!(effects.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------- gateways

struct Fleet {
    primary: FakeUpstream,
    backup: FakeUpstream,
    a: app::Running,
    b: app::Running,
}

/// Two gateway replicas (each its own stores and connections) sharing one
/// Redis, in front of the same two fake providers.
async fn fleet(redis: &RedisServer, budget: &str, failover: &str, state: &str) -> Fleet {
    let primary = FakeUpstream::builder("primary")
        .tokens(4)
        .start()
        .await
        .unwrap();
    let backup = FakeUpstream::builder("backup")
        .tokens(4)
        .start()
        .await
        .unwrap();
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[budget]
deadline_ms = 10000
first_token_timeout_ms = 5000
idle_timeout_ms = 5000
{budget}

[failover]
max_retries_per_target = 0
{failover}

[state]
redis_url = "{}"
health_refresh_ms = 20
{state}

[[providers]]
name = "primary"
base_url = "{}"

[[providers]]
name = "backup"
base_url = "{}"

[[routes]]
model = "*"
targets = [
  {{ provider = "primary", input_per_million = 1000.0, output_per_million = 1000.0 }},
  {{ provider = "backup", input_per_million = 1000.0, output_per_million = 1000.0 }},
]
"#,
        redis.url(),
        primary.base_url(),
        backup.base_url()
    );
    let config = app::Config::from_toml(&config).unwrap();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let gateway = app::Gateway::from_config(&config).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        replicas.push(app::serve(gateway, listener));
    }
    let b = replicas.pop().unwrap();
    let a = replicas.pop().unwrap();
    Fleet {
        primary,
        backup,
        a,
        b,
    }
}

struct Reply {
    status: StatusCode,
    body: String,
}

async fn post_to(addr: std::net::SocketAddr, tenant: Option<&str>) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = json!({
        "model": "gpt-4o",
        "stream": false,
        "messages": [{"role": "user", "content": "hi"}]
    });
    let mut request = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json");
    if let Some(tenant) = tenant {
        request = request.header("x-tenant", tenant);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), client.request(request))
        .await
        .expect("the gateway answers in time")
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn get_json(addr: std::net::SocketAddr, path: &str) -> Value {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .request(
            Request::get(format!("http://{addr}{path}"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// Whether the replica at `addr` sees `provider`'s key cooling.
async fn cooling(addr: std::net::SocketAddr, provider: &str) -> bool {
    let view = get_json(addr, "/v1/health/targets").await;
    view["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["provider"] == provider && k["state"] == "cooling")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_seen_by_replica_a_steers_replica_b_to_the_backup() {
    let Some(redis) = RedisServer::start("a_429_seen_by_replica_a_steers_replica_b").await else {
        return;
    };
    let f = fleet(&redis, "", "", "").await;
    f.primary
        .set_fault_times("status=429;retry_after=30".parse::<Fault>().unwrap(), 1);
    let reply = post_to(f.a.addr, None).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(f.primary.requests().len(), 1);
    // B learns A's cooldown through Redis, not by trying the primary.
    eventually("replica B sees the primary cooling", || {
        cooling(f.b.addr, "primary")
    })
    .await;
    let reply = post_to(f.b.addr, None).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("backup"), "{}", reply.body);
    assert_eq!(f.primary.requests().len(), 1, "B never touched the primary");
    assert_eq!(f.backup.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_ceiling_stops_turns_on_both_replicas() {
    let Some(redis) = RedisServer::start("a_tenant_ceiling_stops_turns_on_both").await else {
        return;
    };
    // Every turn costs more than the ceiling (1000 $/M tokens).
    let state = "tenant_header = \"x-tenant\"\ntenant_ceiling_usd = 0.001\n";
    let f = fleet(&redis, "", "", state).await;
    let first = post_to(f.a.addr, Some("acme")).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    // The turn's cost is added once its body is done, in the background:
    // wait for it to land, so no later acme turn can slip in before it.
    let client = ::redis::Client::open(redis.url()).unwrap();
    let admin = client.get_multiplexed_async_connection().await.unwrap();
    eventually("acme's spend is recorded", || {
        let mut admin = admin.clone();
        async move {
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg("{tlf:spend:acme}:*")
                .query_async(&mut admin)
                .await
                .unwrap();
            !keys.is_empty()
        }
    })
    .await;
    for (replica, other) in [(f.a.addr, "globex-a"), (f.b.addr, "globex-b")] {
        eventually("the tenant is refused", || async move {
            post_to(replica, Some("acme")).await.status == StatusCode::PAYMENT_REQUIRED
        })
        .await;
        let refused = post_to(replica, Some("acme")).await;
        assert!(
            refused.body.contains("tenant_spend_ceiling_reached"),
            "{}",
            refused.body
        );
        // Another tenant is not held by acme's spend.
        assert_eq!(post_to(replica, Some(other)).await.status, 200);
    }
    let upstream = f.primary.requests().len() + f.backup.requests().len();
    assert_eq!(upstream, 3, "refused turns reach no provider");
}

/// The total Redis holds for `tenant` today (nano-USD), 0 without a key.
async fn spend_total(redis: &RedisServer, tenant: &str) -> u64 {
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("{{tlf:spend:{tenant}}}:d:*"))
        .query_async(&mut admin)
        .await
        .unwrap();
    let Some(key) = keys.first() else {
        return 0;
    };
    ::redis::cmd("GET")
        .arg(key)
        .query_async::<Option<u64>>(&mut admin)
        .await
        .unwrap()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_reservations_on_two_replicas_take_exactly_five_estimates() {
    let Some(redis) = RedisServer::start("twenty_concurrent_reservations").await else {
        return;
    };
    let replica = || {
        let store: Arc<dyn SpendStore> =
            Arc::new(RedisSpendStore::new(connect(&redis.url()).unwrap()));
        TenantSpend::new(store, SpendWindow::Day, Cost::from_usd(5.0))
    };
    let (a, b) = (replica(), replica());
    let estimate = Cost::from_usd(1.0);
    let reservations: Vec<_> = (0..20)
        .map(|i| {
            let spend = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { spend.reserve("acme", estimate).await })
        })
        .collect();
    let mut reserved = 0;
    for reservation in reservations {
        match reservation.await.unwrap() {
            Ok(amount) => {
                assert_eq!(amount, estimate);
                reserved += 1;
            }
            Err(TenantRefusal::Ceiling { .. }) => {}
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(reserved, 5, "the ceiling covers five estimates, no more");
    assert_eq!(
        spend_total(&redis, "acme").await,
        Cost::from_usd(5.0).as_nanos()
    );
    // Each turn really cost a quarter of its estimate: settled, the total
    // is the real cost, and the tenant is admitted again.
    for spend in [&a, &b, &a, &b, &a] {
        spend
            .settle("acme", estimate, Cost::from_usd(0.25))
            .await
            .unwrap();
    }
    assert_eq!(
        spend_total(&redis, "acme").await,
        Cost::from_usd(1.25).as_nanos()
    );
    assert!(b.reserve("acme", estimate).await.is_ok());
    // A refund past zero stops at zero.
    let total = a
        .settle("acme", Cost::from_usd(100.0), Cost::ZERO)
        .await
        .unwrap();
    assert_eq!(total, Cost::ZERO);
    // A refused reservation of a tenant that never spent writes no key.
    let closed = TenantSpend::new(
        Arc::new(RedisSpendStore::new(connect(&redis.url()).unwrap())),
        SpendWindow::Day,
        Cost::ZERO,
    );
    assert!(matches!(
        closed.reserve("nobody", estimate).await,
        Err(TenantRefusal::Ceiling { .. })
    ));
    assert_eq!(spend_total(&redis, "nobody").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_turns_on_two_replicas_admit_exactly_five_estimates() {
    let Some(redis) = RedisServer::start("twenty_concurrent_turns_on_two_replicas").await else {
        return;
    };
    // Admitted turns are held at the provider (a slow head) while the
    // others ask; each estimate is prompt + max_tokens at 1000 $/M.
    let body = json!({
        "model": "gpt-4o#fault:slow_first_token=1500",
        "stream": false,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}]
    })
    .to_string();
    let (requirements, _) = tower_llm_failover::dialect::Dialect::read_request(
        &tower_llm_failover::dialect::OpenAiChat,
        Bytes::from(body.clone()),
    )
    .unwrap();
    let price = tower_llm_failover::budget::Pricing::per_million_usd(1000.0, 1000.0);
    let estimate = price.cost(requirements.input_tokens, 100);
    let ceiling = estimate.as_usd() * 5.0;
    let state = format!("tenant_header = \"x-tenant\"\ntenant_ceiling_usd = {ceiling}\n");
    let f = fleet(&redis, "", "", &state).await;
    let turns: Vec<_> = (0..20)
        .map(|i| {
            let addr = if i % 2 == 0 { f.a.addr } else { f.b.addr };
            let body = body.clone();
            tokio::spawn(async move {
                let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
                let request = Request::post(format!("http://{addr}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .header("x-tenant", "acme")
                    .body(Full::new(Bytes::from(body)))
                    .unwrap();
                let response = client.request(request).await.unwrap();
                let status = response.status();
                let bytes = response.into_body().collect().await.unwrap().to_bytes();
                (status, serde_json::from_slice::<Value>(&bytes).unwrap())
            })
        })
        .collect();
    let mut real = 0;
    let mut admitted = 0;
    for turn in turns {
        let (status, body) = turn.await.unwrap();
        match status {
            StatusCode::OK => {
                admitted += 1;
                let usage = &body["usage"];
                real += price
                    .cost(
                        usage["prompt_tokens"].as_u64().unwrap(),
                        usage["completion_tokens"].as_u64().unwrap(),
                    )
                    .as_nanos();
            }
            StatusCode::PAYMENT_REQUIRED => {
                assert_eq!(body["error"]["code"], "tenant_spend_ceiling_reached");
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(admitted, 5, "the ceiling covers five estimates, no more");
    assert_eq!(f.primary.requests().len() + f.backup.requests().len(), 5);
    // Settled (in the background once each body is done): the tenant's
    // total is what the five turns really cost.
    eventually("the turns are settled", || async {
        spend_total(&redis, "acme").await == real
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_outage_stays_within_the_shared_retry_budget() {
    let Some(redis) = RedisServer::start("a_persistent_outage_stays_within_the_budget").await
    else {
        return;
    };
    // No reserve: only 20 % of first attempts may be retried, fleet-wide;
    // cooldowns off, so the budget alone holds the storm.
    let budget = "retry_min_per_sec = 0\nretry_percent = 0.2\nmax_attempts = 2\n";
    let failover = "cooldown_failures = 1000000\n";
    let f = fleet(&redis, budget, failover, "").await;
    f.primary.set_fault("status=500".parse::<Fault>().unwrap());
    f.backup.set_fault("status=500".parse::<Fault>().unwrap());
    let turns: Vec<_> = (0..100)
        .map(|i| {
            let addr = if i % 2 == 0 { f.a.addr } else { f.b.addr };
            tokio::spawn(async move { post_to(addr, None).await })
        })
        .collect();
    let mut refused = 0;
    for turn in turns {
        let reply = turn.await.unwrap();
        if reply.status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(
                reply.body.contains("retry_budget_exhausted"),
                "{}",
                reply.body
            );
            refused += 1;
        } else {
            assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.body);
        }
    }
    let attempts = f.primary.requests().len() + f.backup.requests().len();
    assert!(attempts >= 100, "{attempts}");
    assert!(
        attempts <= 120,
        "{attempts} attempts: more than 100 + 20 % across both"
    );
    assert!(
        refused >= 80,
        "{refused} turns refused by the shared budget"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_the_lease_reroutes_while_the_shared_budget_is_high() {
    let Some(redis) = RedisServer::start("a_burst_larger_than_the_lease_reroutes").await else {
        return;
    };
    // A reserve of 20/s over 10 s: the fleet may make 200 extra attempts,
    // far more than this burst needs. Cooldowns off, so every turn tries
    // the failing primary first and needs the budget to reach the backup.
    let budget = "retry_min_per_sec = 20\nretry_percent = 0.2\nmax_attempts = 2\n";
    let failover = "cooldown_failures = 1000000\n";
    let f = fleet(&redis, budget, failover, "").await;
    f.primary.set_fault("status=500".parse::<Fault>().unwrap());
    // One warm-up turn: the replica has asked Redis once (its lease and the
    // shared level are known), as in any running gateway.
    let warm = post_to(f.a.addr, None).await;
    assert_eq!(warm.status, StatusCode::OK, "{}", warm.body);
    let turns: Vec<_> = (0..50)
        .map(|_| {
            let addr = f.a.addr;
            tokio::spawn(async move { post_to(addr, None).await })
        })
        .collect();
    for turn in turns {
        let reply = turn.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert!(reply.body.contains("backup"), "{}", reply.body);
    }
    assert_eq!(f.primary.requests().len(), 51);
    assert_eq!(f.backup.requests().len(), 51, "every turn rerouted");
}

/// A replica's shared retry budget alone, shipping only when asked. Its
/// deposits and withdrawals are tower's `Budget` calls, as the turns make
/// them through the `RetryBudget` it becomes.
fn shared_budget(url: &str, config: RetryBudgetConfig) -> RedisRetryBudget {
    RedisRetryBudget::builder(connect(url).unwrap(), config)
        .sync_every(Duration::from_secs(3600))
        .start()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposits_made_during_an_outage_are_not_credited_at_once_on_reconnect() {
    let Some(mut redis) = RedisServer::start("deposits_made_during_an_outage").await else {
        return;
    };
    // No reserve: only deposits fund withdrawals.
    let config = RetryBudgetConfig {
        min_per_sec: 0,
        retry_percent: 0.2,
        ..RetryBudgetConfig::new()
    };
    let budget = shared_budget(&redis.url(), config);
    budget.sync().await.unwrap();
    assert!(budget.is_shared());
    redis.kill();
    // A long outage's first attempts (the local fallback counts them).
    for _ in 0..1000 {
        budget.deposit();
    }
    assert!(budget.sync().await.is_err(), "Redis is down");
    redis.restart().await;
    eventually("the budget reaches Redis again", || async {
        budget.sync().await.is_ok()
    })
    .await;
    assert!(budget.is_shared());
    // 1000 old deposits credited at once would fund 200 retries now.
    let granted = (0..50).filter(|_| budget.withdraw()).count();
    assert_eq!(granted, 0, "the outage's deposits funded a retry storm");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_error_answer_falls_back_to_the_local_budget() {
    let Some(redis) = RedisServer::start("a_redis_error_answer_falls_back").await else {
        return;
    };
    // Each first attempt earns one retry; no reserve.
    let config = RetryBudgetConfig {
        min_per_sec: 0,
        retry_percent: 1.0,
        ..RetryBudgetConfig::new()
    };
    let budget = shared_budget(&redis.url(), config);
    budget.sync().await.unwrap();
    assert!(budget.is_shared());
    // Redis answers, but with an error (OOM) to every script.
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut admin)
        .await
        .unwrap();
    for _ in 0..5 {
        budget.deposit();
    }
    let error = budget.sync().await.unwrap_err();
    assert!(!error.is_io_error(), "an answer, not an outage: {error}");
    assert!(
        !budget.is_shared(),
        "an error answer switches to the fallback"
    );
    let granted = (0..5).filter(|_| budget.withdraw()).count();
    assert_eq!(granted, 5, "the local budget grants what deposits earned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replicas_probe_claim_keeps_the_first() {
    let Some(redis) = RedisServer::start("a_second_replicas_probe_claim").await else {
        return;
    };
    let start = || {
        RedisHealthStore::builder(connect(&redis.url()).unwrap())
            .refresh_every(Duration::from_secs(3600))
            .start()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let key = HealthKey::model("primary", "gpt-x");
    let report = FailureReport {
        retry_after: Some(Duration::from_millis(30)),
        ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
    };
    a.failure(&key, report);
    a.sync().await.unwrap();
    b.sync().await.unwrap();
    assert!(matches!(b.availability(&key), Availability::Cooling(_)));
    // Both views see the cooldown end; neither knows of the other's probe.
    eventually("the cooldown ends", || async {
        a.availability(&key) == Availability::Probe && b.availability(&key) == Availability::Probe
    })
    .await;
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let entry = "{tlf:health}:k:m:7:primarygpt-x";
    let claim = |admin: &mut ::redis::aio::MultiplexedConnection| {
        let mut admin = admin.clone();
        async move {
            ::redis::cmd("HGET")
                .arg(entry)
                .arg("probe")
                .query_async::<Option<String>>(&mut admin)
                .await
                .unwrap()
        }
    };
    assert_eq!(a.admit(&key, false), Admission::Probe);
    a.sync().await.unwrap();
    let first = claim(&mut admin).await;
    assert!(first.is_some(), "A's probe is claimed in Redis");
    // B probes too (it has not learned A's claim), a little later.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(b.admit(&key, false), Admission::Probe);
    b.sync().await.unwrap();
    assert_eq!(
        claim(&mut admin).await,
        first,
        "B's claim replaced or lengthened A's live claim"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitting_a_tenant_writes_nothing_to_redis() {
    let Some(redis) = RedisServer::start("admitting_a_tenant_writes_nothing").await else {
        return;
    };
    let store: Arc<dyn SpendStore> = Arc::new(RedisSpendStore::new(connect(&redis.url()).unwrap()));
    let ceiling = Cost::from_usd(1.0);
    let tenant = TenantSpend::new(Arc::clone(&store), SpendWindow::Day, ceiling);
    let client = ::redis::Client::open(redis.url()).unwrap();
    let admin = client.get_multiplexed_async_connection().await.unwrap();
    let keys = |admin: &::redis::aio::MultiplexedConnection| {
        let mut admin = admin.clone();
        async move {
            ::redis::cmd("DBSIZE")
                .query_async::<u64>(&mut admin)
                .await
                .unwrap()
        }
    };
    // Every distinct tenant a client names is admitted...
    for i in 0..20 {
        let client = ClientId::anonymous().with_tenant(format!("made-up-{i}"));
        assert!(tenant.admit(&client).await.unwrap().is_some());
    }
    // ...and leaves no key behind.
    assert_eq!(keys(&admin).await, 0, "admission wrote keys");
    // Spend added to the store writes the tenant's counter, which
    // admission reads.
    store
        .add_and_check("acme", SpendWindow::Day, Cost::from_usd(2.0), ceiling)
        .await
        .unwrap();
    assert_eq!(keys(&admin).await, 1);
    assert!(matches!(
        tenant.admit(&ClientId::key("acme")).await,
        Err(TenantRefusal::Ceiling { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spend_store_outage_answers_503_without_redis_details() {
    let Some(mut redis) = RedisServer::start("a_spend_store_outage_answers_503").await else {
        return;
    };
    let state = "tenant_header = \"x-tenant\"\ntenant_ceiling_usd = 10.0\n";
    let f = fleet(&redis, "", "", state).await;
    let reply = post_to(f.a.addr, Some("acme")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    redis.kill();
    let reply = post_to(f.a.addr, Some("acme")).await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.body
    );
    assert!(
        reply.body.contains("spend_store_unavailable"),
        "{}",
        reply.body
    );
    // Redis' own error text (addresses, errno) stays in the log.
    let message = serde_json::from_str::<Value>(&reply.body).unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        message,
        "the tenant's spend could not be checked; try again later"
    );
}

/// A connection whose commands wait at a gate the test opens one command
/// at a time (or for good), so the order of a replica's Redis calls can be
/// set without timing.
#[derive(Clone)]
struct Gated {
    inner: ::redis::aio::ConnectionManager,
    gate: Arc<Gate>,
}

struct Gate {
    closed: std::sync::atomic::AtomicBool,
    waiting: AtomicUsize,
    permits: tokio::sync::Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            closed: std::sync::atomic::AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            permits: tokio::sync::Semaphore::new(0),
        }
    }
}

impl Gate {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
    fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
        self.permits.add_permits(1000);
    }
    fn let_one_through(&self) {
        self.permits.add_permits(1);
    }
    async fn pass(&self) {
        if self.closed.load(Ordering::SeqCst) {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            self.permits.acquire().await.unwrap().forget();
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl ::redis::aio::ConnectionLike for Gated {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, ::redis::Value> {
        Box::pin(async move {
            self.gate.pass().await;
            self.inner.req_packed_command(cmd).await
        })
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
        Box::pin(async move {
            self.gate.pass().await;
            self.inner
                .req_packed_commands(pipeline, offset, count)
                .await
        })
    }
    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_answered_before_a_queued_transition_keeps_the_newer_local_state() {
    let Some(redis) = RedisServer::start("a_refresh_answered_before_a_queued_transition").await
    else {
        return;
    };
    let a = RedisHealthStore::builder(connect(&redis.url()).unwrap())
        .refresh_every(Duration::from_secs(3600))
        .start()
        .unwrap();
    let gate = Arc::new(Gate::default());
    let b = RedisHealthStore::builder(Gated {
        inner: connect(&redis.url()).unwrap(),
        gate: Arc::clone(&gate),
    })
    .refresh_every(Duration::from_millis(10))
    .start()
    .unwrap();
    // The fleet knows the key with state but no cooldown (one hintless
    // failure), and so does B. Both scripts are loaded.
    let key = HealthKey::model("primary", "gpt-x");
    a.failure(
        &key,
        FailureReport::new(FailureClass::ServerError, Scope::Model),
    );
    a.sync().await.unwrap();
    b.sync().await.unwrap();
    assert_eq!(b.availability(&key), Availability::Healthy);
    // B's next refresh waits at the gate; the fleet's version moves on, so
    // it will bring the whole view (the key still without a cooldown).
    gate.close();
    eventually("B's refresh waits", || async {
        gate.waiting.load(Ordering::SeqCst) == 1
    })
    .await;
    let other = HealthKey::model("backup", "gpt-x");
    a.failure(
        &other,
        FailureReport::new(FailureClass::ServerError, Scope::Model),
    );
    a.sync().await.unwrap();
    // Meanwhile B learns a cooldown itself; its transition is queued.
    let rate_limited = FailureReport {
        retry_after: Some(Duration::from_secs(60)),
        ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
    };
    assert!(b.failure(&key, rate_limited).is_some());
    let refreshed = b.stats().refreshed;
    // The refresh goes through (its calls one at a time, however many);
    // the transition then waits at the gate.
    eventually("B's refresh is answered", || async {
        // A call waits and cannot pass, and the refresh is not done: the
        // call is the refresh's (it counts itself done before the worker
        // takes the transition), so let it through.
        let stuck =
            gate.waiting.load(Ordering::SeqCst) == 1 && gate.permits.available_permits() == 0;
        if b.stats().refreshed > refreshed {
            return stuck;
        }
        if stuck {
            gate.let_one_through();
        }
        false
    })
    .await;
    assert!(
        matches!(b.availability(&key), Availability::Cooling(_)),
        "the older fleet state cleared B's newer cooldown: {:?}",
        b.availability(&key)
    );
    gate.open();
    b.sync().await.unwrap();
    assert!(matches!(b.availability(&key), Availability::Cooling(_)));
    a.sync().await.unwrap();
    eventually("A learns B's cooldown", || async {
        let _ = a.sync().await;
        matches!(a.availability(&key), Availability::Cooling(_))
    })
    .await;
}

/// The process-wide metrics recorder of this test binary (counters are
/// told apart by a provider name no other test uses).
fn metrics() -> &'static metrics_util::debugging::Snapshotter {
    static METRICS: std::sync::OnceLock<metrics_util::debugging::Snapshotter> =
        std::sync::OnceLock::new();
    METRICS.get_or_init(|| {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap();
        snapshotter
    })
}

fn cooldowns_of(provider: &str) -> u64 {
    metrics()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.key().name() == "failover.cooldowns"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "gen_ai.provider.name" && l.value() == provider)
        })
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            other => panic!("{other:?}"),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooldown_the_fleet_starts_is_counted() {
    let Some(redis) = RedisServer::start("a_cooldown_the_fleet_starts_is_counted").await else {
        return;
    };
    metrics();
    let policy = CooldownPolicy {
        failure_threshold: 2,
        ..CooldownPolicy::default()
    };
    let start = || {
        RedisHealthStore::builder(connect(&redis.url()).unwrap())
            .policy(policy.clone())
            .refresh_every(Duration::from_secs(3600))
            .start()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let key = HealthKey::model("fleet-counted", "gpt-x");
    let hintless = FailureReport::new(FailureClass::ServerError, Scope::Model);
    // One failure on each replica: neither reaches the threshold of 2
    // alone, the fleet does.
    assert_eq!(a.failure(&key, hintless.clone()), None);
    a.sync().await.unwrap();
    assert_eq!(b.failure(&key, hintless), None);
    b.sync().await.unwrap();
    assert!(matches!(b.availability(&key), Availability::Cooling(_)));
    assert_eq!(
        cooldowns_of("fleet-counted"),
        1,
        "the fleet's cooldown is counted once"
    );
}

// ---------------------------------------------------------------- happy path

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_happy_path_makes_no_redis_round_trip() {
    let Some(redis) = RedisServer::start("the_happy_path_makes_no_redis_round_trip").await else {
        return;
    };
    let health = RedisHealthStore::builder(connect(&redis.url()).unwrap())
        .refresh_every(Duration::from_secs(3600))
        .start()
        .unwrap();
    health.sync().await.unwrap();
    let health = Arc::new(health);
    let provider = FakeProvider::new("primary");
    let failover = Failover::builder()
        .target(Target::new("primary", provider.clone()))
        .health(health.clone())
        .build();
    let before = redis.command_calls().await;
    for _ in 0..50 {
        let request = Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                json!({"model": "gpt-x", "stream": true,
                       "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
            )))
            .unwrap();
        let response = failover.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }
    let after = redis.command_calls().await;
    let mut changed: Vec<_> = after
        .iter()
        .filter(|(name, calls)| name.as_str() != "info" && before.get(*name) != Some(calls))
        .collect();
    changed.sort();
    assert!(changed.is_empty(), "happy turns reached Redis: {changed:?}");
    assert_eq!(provider.calls(), 50);
    assert_eq!(health.stats().shipped, 0);
}

// ---------------------------------------------------------------- outage

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_run_then_restarted() {
    let Some(mut redis) = RedisServer::start("redis_killed_mid_run_then_restarted").await else {
        return;
    };
    let url = redis.url();
    let effects = Arc::new(AtomicUsize::new(0));
    let mut exec = executor(&url, Arc::clone(&effects));
    let start = |url: &str| {
        RedisHealthStore::builder(connect(url).unwrap())
            .refresh_every(Duration::from_millis(20))
            .start()
            .unwrap()
    };
    let (a, b) = (start(&url), start(&url));
    let spend_store: Arc<dyn SpendStore> = Arc::new(RedisSpendStore::new(connect(&url).unwrap()));
    let tenant = TenantSpend::new(spend_store, SpendWindow::Day, Cost::from_usd(10.0));
    let acme = ClientId::key("acme");

    // Before: everything works.
    let call = |id: &str| ToolCall::new(id, "send_order", json!({}));
    exec.ready()
        .await
        .unwrap()
        .call(call("before"))
        .await
        .unwrap();
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    let admitted = tenant.admit(&acme).await;
    assert!(admitted.is_ok(), "{admitted:?}");

    redis.kill();

    // No effect runs without a claim, and the error says why.
    let err = exec
        .ready()
        .await
        .unwrap()
        .call(call("during"))
        .await
        .unwrap_err();
    assert!(err.is_store_unavailable(), "{err}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    // Spend fails closed by default, with a typed error...
    assert!(matches!(
        tenant.admit(&acme).await,
        Err(TenantRefusal::Store(
            tower_llm_failover::budget::SpendError::Unavailable(_)
        ))
    ));
    // ...or open when configured.
    let mut open = tenant.clone();
    open.fail_open = true;
    assert!(open.admit(&acme).await.is_ok());
    // Health keeps serving from the local view: A's own failure cools the
    // key on A, and admissions are answered.
    let key = HealthKey::model("primary", "gpt-x");
    let report = FailureReport {
        retry_after: Some(Duration::from_secs(60)),
        ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
    };
    assert_eq!(
        a.failure(&key, report.clone()),
        Some(Duration::from_secs(60))
    );
    assert!(matches!(a.availability(&key), Availability::Cooling(_)));
    assert!(a.sync().await.is_err(), "Redis is down");
    assert_eq!(b.availability(&key), Availability::Healthy);

    redis.restart().await;

    // Both recover without being rebuilt: the executor claims again...
    eventually("the executor reaches Redis again", || {
        let mut exec = exec.clone();
        async move {
            exec.ready()
                .await
                .unwrap()
                .call(call("after"))
                .await
                .is_ok()
        }
    })
    .await;
    assert_eq!(effects.load(Ordering::SeqCst), 2);
    eventually("spend checks work again", || async {
        tenant.admit(&acme).await.is_ok()
    })
    .await;
    // ...and a transition shipped now reaches the other replica.
    let other = HealthKey::model("backup", "gpt-x");
    eventually("A ships again", || async { a.sync().await.is_ok() }).await;
    a.failure(&other, report);
    a.sync().await.unwrap();
    eventually("B learns A's cooldown", || async {
        let _ = b.sync().await;
        matches!(b.availability(&other), Availability::Cooling(_))
    })
    .await;
}

// ---------------------------------------------------------------- processes

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_share_a_cooldown() {
    let Some(redis) = RedisServer::start("two_gateway_processes_share_a_cooldown").await else {
        return;
    };
    let Some(binary) = gateway_binary() else {
        return;
    };
    let primary = FakeUpstream::builder("primary")
        .tokens(4)
        .start()
        .await
        .unwrap();
    let backup = FakeUpstream::builder("backup")
        .tokens(4)
        .start()
        .await
        .unwrap();
    let config = format!(
        r#"
[failover]
max_retries_per_target = 0

[state]
redis_url = "{}"
health_refresh_ms = 20

[[providers]]
name = "primary"
base_url = "{}"

[[providers]]
name = "backup"
base_url = "{}"
"#,
        redis.url(),
        primary.base_url(),
        backup.base_url()
    );
    let path = std::env::temp_dir().join(format!(
        "tlf-gateway-{}-{}.toml",
        std::process::id(),
        redis.port
    ));
    std::fs::write(&path, config).unwrap();
    let a = spawn_gateway(&binary, &path, &[("RUST_LOG", "warn")], Stdio::null());
    let b = spawn_gateway(&binary, &path, &[("RUST_LOG", "warn")], Stdio::null());
    let _ = std::fs::remove_file(&path);

    primary.set_fault_times("status=429;retry_after=30".parse::<Fault>().unwrap(), 1);
    let reply = post_to(a.addr, None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(primary.requests().len(), 1);
    eventually("process B sees the primary cooling", || {
        cooling(b.addr, "primary")
    })
    .await;
    let reply = post_to(b.addr, None).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body.contains("backup"), "{}", reply.body);
    assert_eq!(
        primary.requests().len(),
        1,
        "process B never touched the primary"
    );
}

// ------------------------------------------------- health only providers cool

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_count_once_per_client_across_the_fleet() {
    let Some(redis) = RedisServer::start("timeouts_count_once_per_client_across_the_fleet").await
    else {
        return;
    };
    let start = || {
        RedisHealthStore::builder(connect(&redis.url()).unwrap())
            .refresh_every(Duration::from_secs(3600))
            .start()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let timeout = |who: &str| FailureReport {
        witness: Some(who.into()),
        ..FailureReport::new(FailureClass::Timeout, Scope::Model)
    };
    // One key's timeouts on both replicas: one count, nothing cools.
    let key = HealthKey::model("per-client", "gpt-x");
    for replica in [&a, &b, &a, &b, &a] {
        replica.failure(&key, timeout("key-a"));
        replica.sync().await.unwrap();
    }
    assert_eq!(a.availability(&key), Availability::Healthy);
    assert_eq!(b.availability(&key), Availability::Healthy);
    // Two more clients, one on each replica: the fleet counts three.
    a.failure(&key, timeout("key-b"));
    a.sync().await.unwrap();
    b.failure(&key, timeout("key-c"));
    b.sync().await.unwrap();
    assert!(matches!(b.availability(&key), Availability::Cooling(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_index_of_client_named_keys_stays_at_the_cap() {
    let Some(redis) =
        RedisServer::start("the_redis_index_of_client_named_keys_stays_at_the_cap").await
    else {
        return;
    };
    let start = || {
        RedisHealthStore::builder(connect(&redis.url()).unwrap())
            .refresh_every(Duration::from_secs(3600))
            .max_client_named_keys(50)
            .start()
            .unwrap()
    };
    let a = start();
    let hintless = FailureReport::new(FailureClass::ServerError, Scope::Model);
    let configured = HealthKey::model("p", "configured");
    a.failure(&configured, hintless.clone());
    for i in 0..10_000 {
        a.failure(
            &HealthKey::client_model("p", format!("invented-{i}")),
            hintless.clone(),
        );
        if i % 1000 == 999 {
            a.sync().await.unwrap();
        }
    }
    a.sync().await.unwrap();
    assert_eq!(a.stats().dropped, 0);
    assert_eq!(
        a.snapshot().len(),
        51,
        "the local view: 50 and the configured key"
    );
    // Redis's index holds the cap, and a new replica reads only that.
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let indexed: usize = ::redis::cmd("ZCARD")
        .arg("{tlf:health}:client_keys")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(indexed, 50);
    let b = start();
    b.sync().await.unwrap();
    let seen = b.snapshot();
    assert_eq!(seen.len(), 51, "{}", seen.len());
    assert!(seen.iter().any(|e| e.key == configured));
    assert!(
        seen.iter()
            .any(|e| e.key == HealthKey::model("p", "invented-9999"))
    );
    assert!(
        seen.iter()
            .filter(|e| e.key != configured)
            .all(|e| e.key.is_client_named())
    );
}

/// Two gateway processes with client keys: each reads the key from its
/// environment (`key_env`), a request without it is refused 401, and the
/// key's `requests_per_minute` is one allowance across both processes
/// (counted on Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_share_a_keys_rate_limit() {
    let Some(redis) = RedisServer::start("two_gateway_processes_share_a_keys_rate_limit").await
    else {
        return;
    };
    let Some(binary) = gateway_binary() else {
        return;
    };
    let primary = FakeUpstream::builder("primary")
        .tokens(2)
        .start()
        .await
        .unwrap();
    let config = format!(
        r#"
[state]
redis_url = "{}"

[[providers]]
name = "primary"
base_url = "{}"

[[keys]]
name = "team-a"
key_env = "TLF_TEST_TEAM_A_KEY"
requests_per_minute = 3
"#,
        redis.url(),
        primary.base_url(),
    );
    let path = std::env::temp_dir().join(format!(
        "tlf-gateway-keys-{}-{}.toml",
        std::process::id(),
        redis.port
    ));
    std::fs::write(&path, config).unwrap();
    let env = [
        ("TLF_TEST_TEAM_A_KEY", "sk-from-the-environment"),
        ("RUST_LOG", "warn"),
    ];
    let a = spawn_gateway(&binary, &path, &env, Stdio::null());
    let b = spawn_gateway(&binary, &path, &env, Stdio::null());
    let _ = std::fs::remove_file(&path);

    let ask = |addr: std::net::SocketAddr, key: Option<&'static str>| async move {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut request = Request::post(format!("http://{addr}/v1/chat/completions"));
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        let body =
            r#"{"model":"gpt-4o","stream":false,"messages":[{"role":"user","content":"hi"}]}"#;
        let response = tokio::time::timeout(
            Duration::from_secs(20),
            client.request(request.body(Full::new(Bytes::from(body))).unwrap()),
        )
        .await
        .expect("the gateway answers in time")
        .unwrap();
        let status = response.status();
        let retry_after = response.headers().contains_key("retry-after");
        response.into_body().collect().await.unwrap();
        (status, retry_after)
    };
    assert_eq!(ask(a.addr, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        ask(b.addr, Some("sk-wrong")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let key = Some("sk-from-the-environment");
    let mut statuses = Vec::new();
    for addr in [a.addr, b.addr, a.addr, b.addr] {
        statuses.push(ask(addr, key).await);
    }
    assert_eq!(
        statuses,
        [
            (StatusCode::OK, false),
            (StatusCode::OK, false),
            (StatusCode::OK, false),
            (StatusCode::TOO_MANY_REQUESTS, true),
        ],
        "three a minute across both processes"
    );
    assert_eq!(primary.requests().len(), 3);
}
