//! Clients cannot spend each other's share: the identity layer names the
//! client (a tenant header only when trusted), one client's failing
//! requests spend its own retry share and leave the fleet's reroutes to
//! another, health gauges label only configured models.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::budget::{RetryBudget, RetryBudgetConfig, TurnLimits};
use tower_llm_failover::failover::Caps;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_failover::health::{CooldownPolicy, MemoryHealthStore};
use tower_llm_failover::identity::{ApiKeys, ClientId, IdentityLayer};
use tower_llm_testing::{FakeProvider, Reply};

const SERVER_500: &str = r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#;

fn chat() -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"gpt-x","stream":false,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap()
}

/// What the service behind the identity layer saw of each request.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<ClientId>>>, Arc<Mutex<Vec<bool>>>);

async fn through(layer: IdentityLayer, headers: &[(&str, &str)]) -> (StatusCode, Seen) {
    let seen = Seen::default();
    let inner = {
        let seen = seen.clone();
        tower::service_fn(move |request: Request<Full<Bytes>>| {
            let seen = seen.clone();
            async move {
                seen.0
                    .lock()
                    .unwrap()
                    .push(ClientId::of(request.extensions()));
                let credential = request.headers().contains_key("authorization");
                seen.1.lock().unwrap().push(credential);
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
            }
        })
    };
    let mut request = chat();
    for (name, value) in headers {
        request.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let response = ServiceBuilder::new()
        .layer(layer)
        .service(inner)
        .oneshot(request)
        .await
        .unwrap();
    (response.status(), seen)
}

#[tokio::test]
async fn a_tenant_header_is_read_only_when_trusted() {
    let keys = ApiKeys::new().key(ClientId::key("ci").with_tenant("acme"), "sk-ci");
    let asked = [("authorization", "Bearer sk-ci"), ("x-tenant", "victim")];
    let (status, seen) = through(IdentityLayer::new(keys.clone()), &asked).await;
    assert_eq!(status, StatusCode::OK);
    let client = seen.0.lock().unwrap()[0].clone();
    assert_eq!(
        (client.key_name(), client.tenant()),
        (Some("ci"), Some("acme")),
        "an untrusted header changes nothing"
    );
    let trusted = IdentityLayer::new(keys).trust_tenant_header("x-tenant".parse().unwrap());
    let (_, seen) = through(trusted, &asked).await;
    assert_eq!(seen.0.lock().unwrap()[0].tenant(), Some("victim"));
    assert_eq!(*seen.1.lock().unwrap(), [false], "the key is not passed on");
    // Without keys: the anonymous client, whatever it presents.
    let (status, seen) = through(IdentityLayer::new(ApiKeys::new()), &asked).await;
    assert_eq!(status, StatusCode::OK);
    assert!(seen.0.lock().unwrap()[0].key_name().is_none());
    assert_eq!(
        *seen.1.lock().unwrap(),
        [true],
        "without keys, headers are the header policy's"
    );
    // With keys, a wrong one never reaches the service.
    let keys = ApiKeys::new().key(ClientId::key("ci"), "sk-ci");
    let (status, seen) = through(
        IdentityLayer::new(keys),
        &[("authorization", "Bearer sk-other")],
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(seen.0.lock().unwrap().is_empty());
}

/// The anonymous client is no entry in the extensions (`ClientId::of`
/// reads it as anonymous; an entry would make a gateway's request map grow
/// per request), and one an outer layer set does not stand; a named client
/// is an entry.
#[tokio::test]
async fn the_anonymous_client_is_no_entry_and_a_named_one_is() {
    let entries = |keys: ApiKeys, header: Option<&'static str>| async move {
        let inner = tower::service_fn(|request: Request<Full<Bytes>>| async move {
            let entry = request.extensions().get::<ClientId>().cloned();
            let read = ClientId::of(request.extensions());
            let seen = format!(
                "{:?}|{:?}",
                entry.map(|c| c.key_name().map(str::to_owned)),
                read.key_name()
            );
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(seen))))
        });
        let mut request = chat();
        request
            .extensions_mut()
            .insert(ClientId::key("set-outside"));
        if let Some(value) = header {
            request
                .headers_mut()
                .insert("authorization", value.parse().unwrap());
        }
        let response = ServiceBuilder::new()
            .layer(IdentityLayer::new(keys))
            .service(inner)
            .oneshot(request)
            .await
            .unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    };
    assert_eq!(entries(ApiKeys::new(), None).await, "None|None");
    let keys = ApiKeys::new().key(ClientId::key("ci"), "sk-ci");
    assert_eq!(
        entries(keys, Some("Bearer sk-ci")).await,
        r#"Some(Some("ci"))|Some("ci")"#
    );
}

#[tokio::test(start_paused = true)]
async fn one_clients_failures_spend_its_own_retry_share_not_anothers() {
    // Fleet: 20 extra attempts in reserve; each client's share: 10.
    let fleet = RetryBudgetConfig {
        ttl: Duration::from_secs(10),
        min_per_sec: 2,
        retry_percent: 0.0,
    };
    let share = RetryBudgetConfig {
        min_per_sec: 1,
        ..fleet
    };
    let retry_budget = RetryBudget::new(fleet)
        .unwrap()
        .with_client_shares(share, 100)
        .unwrap();
    let primary = FakeProvider::new("primary").always(Reply::status(500, SERVER_500));
    let backup = FakeProvider::new("backup");
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .limits(TurnLimits {
            retry_budget: Some(retry_budget.clone()),
            ..TurnLimits::new()
        })
        .health(Arc::new(MemoryHealthStore::new(CooldownPolicy {
            failure_threshold: u32::MAX,
            ..CooldownPolicy::default()
        })))
        .build();
    let send = |client: ClientId| {
        let failover = failover.clone();
        async move {
            let mut request = chat();
            request.extensions_mut().insert(client);
            let response = failover.oneshot(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let a = ClientId::key("a");
    let mut rerouted = 0;
    for _ in 0..15 {
        let (status, body) = send(a.clone()).await;
        if status == StatusCode::OK {
            rerouted += 1;
        } else {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
            assert!(body.contains("retry_budget_exhausted"), "{body}");
        }
    }
    assert_eq!(rerouted, 10, "client a's reroutes end with its share");
    // Client b's reroute still happens: the fleet kept the rest.
    let (status, body) = send(ClientId::key("b")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(backup.calls(), 11);
    assert_eq!(retry_budget.level(), Some(9.0));
}

#[test]
fn health_gauges_label_only_configured_models() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tower_llm_failover::FailureClass;
    use tower_llm_failover::{
        health::FailureReport, health::HealthKey, health::HealthStore, health::MemoryHealthStore,
        health::Scope,
    };
    let store = MemoryHealthStore::new(CooldownPolicy {
        failure_threshold: 1,
        failure_window: Duration::from_secs(30),
        ..CooldownPolicy::default()
    });
    let _rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = _rt.enter();
    let fail = |model: &str| {
        store.failure(
            &HealthKey::model("p", model),
            FailureReport::new(FailureClass::ServerError, Scope::Model),
        );
    };
    fail("gpt-4o");
    for i in 0..50 {
        fail(&format!("invented-{i}"));
    }
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tower_llm_failover::health::record_health_labelled(&store, &|m| m == "gpt-4o");
    });
    let mut models = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let labels: Vec<_> = key
            .key()
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        let model = labels
            .iter()
            .find(|(k, _)| k == "gen_ai.request.model")
            .unwrap()
            .1
            .clone();
        let state = labels
            .iter()
            .find(|(k, _)| k == "failover.state")
            .unwrap()
            .1
            .clone();
        if let DebugValue::Gauge(v) = value {
            models.insert((model, state), v.into_inner());
        }
    }
    let names: std::collections::BTreeSet<_> = models.keys().map(|(m, _)| m.clone()).collect();
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["gpt-4o".to_owned(), "other".to_owned()],
        "no invented name is a label value"
    );
    assert_eq!(models[&("other".to_owned(), "cooling".to_owned())], 50.0);
    assert_eq!(models[&("gpt-4o".to_owned(), "cooling".to_owned())], 1.0);
}
