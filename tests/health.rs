//! Health keyed by what failed, shared by every route: one model's failure
//! never cools another, one request never locks a route, and a turn probes
//! rather than refuse while it can still try.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use tower::{Service, ServiceExt};
use tower_llm_failover::FailureClass;
use tower_llm_failover::failover::Caps;
use tower_llm_failover::stream::StreamPolicy;
use tower_llm_failover::{
    failover::Failover, failover::FailoverBuilder, failover::Target, failover::Timeouts,
    health::Availability, health::CooldownPolicy, health::FailureReport, health::HealthKey,
    health::HealthStore, health::KeyState, health::MemoryHealthStore, health::Scope,
    health::ScopeRules, health::SuccessReport,
};
use tower_llm_testing::{FakeProvider, Reply, ScriptedBody, Step};

const RATE_429: &str = r#"{"error":{"message":"Rate limit reached for requests","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
const QUOTA_429: &str = r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
const SERVER_500: &str = r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#;
const FILTER_400: &str = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400}}"#;
const NO_MODEL_404: &str = r#"{"error":{"message":"The model `nope` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#;

/// One upstream provider serving several models: each model has a fake of
/// its own, so a test can script per model and count per model.
#[derive(Clone)]
struct Models {
    models: Arc<HashMap<&'static str, FakeProvider>>,
}

impl Models {
    fn new(models: &[(&'static str, FakeProvider)]) -> Self {
        Self {
            models: Arc::new(models.iter().cloned().collect()),
        }
    }

    fn calls(&self, model: &str) -> usize {
        self.models[model].calls()
    }
}

impl Service<Request<Full<Bytes>>> for Models {
    type Response = Response<ScriptedBody>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let models = Arc::clone(&self.models);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let model = json["model"].as_str().unwrap_or_default().to_owned();
            let provider = models
                .get(model.as_str())
                .unwrap_or_else(|| panic!("no fake for model {model}"))
                .clone();
            provider
                .oneshot(Request::from_parts(parts, Full::new(bytes)))
                .await
        })
    }
}

struct Answer {
    status: StatusCode,
    target: String,
    body: String,
}

fn chat(model: &str, stream: bool) -> Request<Full<Bytes>> {
    let body = serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    });
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

async fn send(failover: &Failover<Models>, model: &str, stream: bool) -> Answer {
    let response = failover.clone().oneshot(chat(model, stream)).await.unwrap();
    let status = response.status();
    let target = response
        .headers()
        .get("x-failover-target")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        target,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// A pass-through primary and a backup with a fixed model, as a gateway's
/// `*` route: one store, never rebuilt between cases.
fn route(primary: &Models, backup: &Models, store: &Arc<MemoryHealthStore>) -> Failover<Models> {
    builder(store)
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("backup", backup.clone()).model("backup-model"))
        .build()
}

fn builder(store: &Arc<MemoryHealthStore>) -> FailoverBuilder<Models> {
    Failover::builder()
        .health(store.clone())
        .stream_policy(StreamPolicy::new().idle_timeout(Duration::from_secs(2)))
}

fn cooling_keys(store: &MemoryHealthStore) -> Vec<String> {
    store
        .snapshot()
        .into_iter()
        .filter(|e| matches!(e.state, KeyState::Cooling { .. }))
        .map(|e| e.key.to_string())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn one_models_failures_never_cool_another_and_request_errors_go_back_to_the_client() {
    let primary = Models::new(&[
        (
            "a",
            FakeProvider::new("a").always(Reply::status(429, RATE_429)),
        ),
        (
            "b",
            FakeProvider::new("b").then(Reply::status(500, SERVER_500)),
        ),
        ("c", FakeProvider::new("c").then(Reply::Refused)),
        (
            "d",
            FakeProvider::new("d").then(Reply::tokens_then("d", 3, vec![Step::Stall])),
        ),
        (
            "e",
            FakeProvider::new("e").always(Reply::status(400, FILTER_400)),
        ),
    ]);
    let backup = Models::new(&[("backup-model", FakeProvider::new("backup"))]);
    let store = Arc::new(MemoryHealthStore::default());
    let failover = route(&primary, &backup, &store);

    // A: persistent 429s: retried, then cooled, then the backup answers.
    let a = send(&failover, "a", true).await;
    assert_eq!((a.status, a.target.as_str()), (StatusCode::OK, "backup"));
    assert_eq!(primary.calls("a"), 3);
    let backup_calls = backup.calls("backup-model");

    // B: one 500, then the primary answers its retry.
    let b = send(&failover, "b", true).await;
    assert_eq!((b.status, b.target.as_str()), (StatusCode::OK, "primary"));
    assert_eq!(primary.calls("b"), 2, "B reached the primary first");

    // C: refused before headers once, then the primary answers.
    let c = send(&failover, "c", true).await;
    assert_eq!((c.status, c.target.as_str()), (StatusCode::OK, "primary"));
    assert_eq!(primary.calls("c"), 2, "C reached the primary first");

    // D: a stall after three tokens ends with a terminal chunk, from the
    // primary.
    let d = send(&failover, "d", true).await;
    assert_eq!((d.status, d.target.as_str()), (StatusCode::OK, "primary"));
    assert!(d.body.contains("d-2 "), "{}", d.body);
    assert!(d.body.contains(r#""finish_reason":"error""#), "{}", d.body);
    assert!(!d.body.contains("backup"), "nothing spliced: {}", d.body);
    assert_eq!(primary.calls("d"), 1, "D reached the primary first");

    // E: a content filter is the client's: the 400 goes back, no backup.
    let e = send(&failover, "e", true).await;
    assert_eq!(e.status, StatusCode::BAD_REQUEST, "{}", e.body);
    assert!(e.body.contains("content_filter"), "{}", e.body);
    assert_eq!(primary.calls("e"), 1, "E reached the primary first");

    assert_eq!(
        backup.calls("backup-model"),
        backup_calls,
        "the backup answered only A"
    );
    assert_eq!(cooling_keys(&store), ["primary/a"], "only model A cools");
}

#[tokio::test(start_paused = true)]
async fn a_model_the_client_named_and_the_provider_does_not_know_is_a_404_for_that_client_only() {
    let primary = Models::new(&[
        (
            "nope",
            FakeProvider::new("nope").always(Reply::status(404, NO_MODEL_404)),
        ),
        ("gpt-x", FakeProvider::new("gpt-x")),
    ]);
    let backup = Models::new(&[("backup-model", FakeProvider::new("backup"))]);
    let store = Arc::new(MemoryHealthStore::default());
    let failover = route(&primary, &backup, &store);

    let unknown = send(&failover, "nope", true).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.body);
    assert!(unknown.body.contains("model_not_found"), "{}", unknown.body);
    assert!(unknown.body.contains("`nope`"), "the provider's message");
    assert_eq!(
        backup.calls("backup-model"),
        0,
        "never another model's answer"
    );
    assert!(cooling_keys(&store).is_empty(), "{:?}", store.snapshot());

    let valid = send(&failover, "gpt-x", true).await;
    assert_eq!(
        (valid.status, valid.target.as_str()),
        (StatusCode::OK, "primary")
    );
    assert_eq!(primary.calls("gpt-x"), 1);
}

#[tokio::test(start_paused = true)]
async fn an_account_failure_cools_every_model_of_that_credential_and_no_other_provider() {
    let primary = Models::new(&[
        (
            "a",
            FakeProvider::new("a").always(Reply::status(429, QUOTA_429)),
        ),
        ("b", FakeProvider::new("b")),
    ]);
    let other = Models::new(&[
        ("a", FakeProvider::new("other-a")),
        ("b", FakeProvider::new("other-b")),
    ]);
    let store = Arc::new(MemoryHealthStore::default());
    // Two pass-through providers.
    let failover = builder(&store)
        .target(Target::new("primary", primary.clone()))
        .target(Target::new("other", other.clone()))
        .build();

    let a = send(&failover, "a", true).await;
    assert_eq!((a.status, a.target.as_str()), (StatusCode::OK, "other"));
    assert_eq!(primary.calls("a"), 1, "quota is never retried in place");

    // Model B on the same credential: not tried, the account rests.
    let b = send(&failover, "b", true).await;
    assert_eq!((b.status, b.target.as_str()), (StatusCode::OK, "other"));
    assert_eq!(primary.calls("b"), 0);
    assert!(matches!(
        store.availability(&HealthKey::model("primary", "b")),
        Availability::Cooling(_)
    ));
    for model in ["a", "b"] {
        assert_eq!(
            store.availability(&HealthKey::model("other", model)),
            Availability::Healthy
        );
    }
    assert_eq!(cooling_keys(&store), ["primary/*"]);
}

#[tokio::test(start_paused = true)]
async fn two_routes_that_share_a_provider_share_its_health() {
    let primary = Models::new(&[(
        "shared-model",
        FakeProvider::new("shared")
            .then(Reply::status(429, RATE_429).header("retry-after", "200"))
            .always(Reply::stream("shared", 4)),
    )]);
    let backup = Models::new(&[("backup-model", FakeProvider::new("backup"))]);
    let store = Arc::new(MemoryHealthStore::default());
    let route = |client_model: &str| {
        let _ = client_model;
        builder(&store)
            .target(Target::new("primary", primary.clone()).model("shared-model"))
            .target(Target::new("backup", backup.clone()).model("backup-model"))
            .build()
    };
    let (fast, smart) = (route("fast"), route("smart"));

    // A hinted 429 through one route cools the key at once...
    let first = send(&fast, "fast", true).await;
    assert_eq!(first.target, "backup");
    // ...and the other route sees it: it goes straight to the backup.
    let second = send(&smart, "smart", true).await;
    assert_eq!(second.target, "backup");
    assert_eq!(primary.calls("shared-model"), 1);
    assert_eq!(
        smart
            .health()
            .availability(&HealthKey::model("primary", "shared-model")),
        fast.health()
            .availability(&HealthKey::model("primary", "shared-model")),
    );
}

#[tokio::test(start_paused = true)]
async fn when_every_target_rests_the_soonest_is_probed_and_its_success_clears_it() {
    let hinted = |secs: &str| Reply::status(429, RATE_429).header("retry-after", secs);
    let a = Models::new(&[(
        "gpt-x",
        FakeProvider::new("a")
            .then(hinted("200"))
            .then(hinted("200"))
            .always(Reply::stream("a", 4)),
    )]);
    let b = Models::new(&[("gpt-x", FakeProvider::new("b").always(hinted("400")))]);
    let store = Arc::new(MemoryHealthStore::default());
    let failover = builder(&store)
        .target(Target::new("a", a.clone()))
        .target(Target::new("b", b.clone()))
        .build();

    // Both fail with hints too long to wait for: the turn is spent.
    let first = send(&failover, "gpt-x", true).await;
    assert_eq!(
        first.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        first.body
    );
    assert_eq!((a.calls("gpt-x"), b.calls("gpt-x")), (1, 1));

    // Both rest now. The next turn probes a (it rests least); that probe
    // fails too, and only then is the answer 503.
    let probe_failed = send(&failover, "gpt-x", true).await;
    assert_eq!(
        probe_failed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        probe_failed.body
    );
    assert!(
        probe_failed.body.contains("no_available_target"),
        "{}",
        probe_failed.body
    );
    assert_eq!((a.calls("gpt-x"), b.calls("gpt-x")), (2, 1));

    // Every target rests and the turn has budget: a is probed, answers, and
    // its cooldown is cleared; b is left alone.
    let second = send(&failover, "gpt-x", true).await;
    assert_eq!(
        (second.status, second.target.as_str()),
        (StatusCode::OK, "a")
    );
    assert_eq!((a.calls("gpt-x"), b.calls("gpt-x")), (3, 1));
    assert_eq!(
        store.availability(&HealthKey::model("a", "gpt-x")),
        Availability::Healthy
    );
    assert!(matches!(
        store.availability(&HealthKey::model("b", "gpt-x")),
        Availability::Cooling(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn one_transient_failure_cools_nothing_but_three_inside_the_window_do() {
    let store = MemoryHealthStore::new(CooldownPolicy {
        failure_threshold: 3,
        failure_window: Duration::from_secs(30),
        ..CooldownPolicy::default()
    });
    let key = HealthKey::model("p", "m");
    let report = FailureReport::new(FailureClass::ServerError, Scope::Model);
    assert_eq!(store.failure(&key, report.clone()), None);
    tokio::time::advance(Duration::from_secs(31)).await;
    // The first fell out of the window.
    assert_eq!(store.failure(&key, report.clone()), None);
    assert_eq!(store.failure(&key, report.clone()), None);
    assert_eq!(store.availability(&key), Availability::Healthy);
    assert_eq!(
        store.failure(&key, report.clone()),
        Some(Duration::from_secs(5))
    );
    assert!(matches!(store.availability(&key), Availability::Cooling(_)));
    // A hint cools at once, capped by the policy's maximum.
    let hinted = HealthKey::model("p", "hinted");
    let capped = store.failure(
        &hinted,
        FailureReport {
            retry_after: Some(Duration::from_secs(3600)),
            ..report.clone()
        },
    );
    assert_eq!(capped, Some(Duration::from_secs(600)));
}

#[test]
fn scope_rules_follow_the_table_and_take_overrides() {
    let rules = ScopeRules::new();
    assert_eq!(
        rules.scope(FailureClass::QuotaExhausted, None, true),
        Scope::Account
    );
    assert_eq!(rules.scope(FailureClass::Auth, None, false), Scope::Account);
    assert_eq!(
        rules.scope(FailureClass::RateLimited, None, true),
        Scope::Model
    );
    assert_eq!(
        rules.scope(FailureClass::InvalidResponse, None, true),
        Scope::Model
    );
    assert_eq!(
        rules.scope(FailureClass::ModelNotFound, None, true),
        Scope::Request
    );
    assert_eq!(
        rules.scope(FailureClass::ModelNotFound, None, false),
        Scope::Model
    );
    assert_eq!(
        rules.scope(FailureClass::ContentFiltered, None, false),
        Scope::Request
    );
    assert_eq!(
        rules.scope(FailureClass::ContextLengthExceeded, None, false),
        Scope::Request
    );
    let rules = rules.set(FailureClass::RateLimited, Scope::Account);
    assert_eq!(
        rules.scope(FailureClass::RateLimited, None, true),
        Scope::Account
    );
}

/// What a key's state is, minus the clock.
fn states(store: &MemoryHealthStore) -> HashMap<HealthKey, (&'static str, u32, u32)> {
    store
        .snapshot()
        .into_iter()
        .map(|e| (e.key, (e.state.as_str(), e.failure_streak, e.cooldowns)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// No failure changes the state of a key outside its scope.
    #[test]
    fn no_failure_reaches_outside_its_scope(
        failures in proptest::collection::vec(
            (0..2usize, 0..3usize, 0..FailureClass::ALL.len(), any::<bool>(), proptest::option::of(1..900u64)),
            1..40,
        )
    ) {
        let store = MemoryHealthStore::default();
        let rules = ScopeRules::new();
        let providers = ["p0", "p1"];
        let models = ["m0", "m1", "m2"];
        for (provider, model, class, client_named, hint) in failures {
            let key = HealthKey::model(providers[provider], models[model]);
            let class = FailureClass::ALL[class];
            let scope = rules.scope(class, None, client_named);
            let before = states(&store);
            store.failure(
                &key,
                FailureReport {
                    retry_after: hint.map(Duration::from_secs),
                    ..FailureReport::new(class, scope)
                },
            );
            let after = states(&store);
            let mut keys: Vec<&HealthKey> = before.keys().chain(after.keys()).collect();
            keys.dedup();
            for other in keys {
                if before.get(other) == after.get(other) {
                    continue;
                }
                let allowed = match scope {
                    Scope::Request => false,
                    Scope::Model => *other == key,
                    Scope::Account => *other == key.to_account(),
                    _ => false,
                };
                prop_assert!(
                    allowed,
                    "{class} ({scope}) on {key} changed {other}: {:?} -> {:?}",
                    before.get(other),
                    after.get(other)
                );
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn failures_in_flight_during_a_cooldown_never_shorten_it_or_count_as_new_ones() {
    let store = MemoryHealthStore::default();
    let key = HealthKey::model("p", "m");
    let report = FailureReport::new(FailureClass::ServerError, Scope::Model);
    // A long cooldown from a hint...
    assert_eq!(
        store.failure(
            &key,
            FailureReport {
                retry_after: Some(Duration::from_secs(80)),
                ..report.clone()
            }
        ),
        Some(Duration::from_secs(80))
    );
    // ...then the failures of requests that were already in flight.
    for _ in 0..10 {
        store.failure(&key, report.clone());
        store.failure(
            &key,
            FailureReport {
                retry_after: Some(Duration::from_secs(1)),
                ..report.clone()
            },
        );
    }
    tokio::time::advance(Duration::from_secs(79)).await;
    assert!(
        matches!(store.availability(&key), Availability::Cooling(_)),
        "still resting after 79 s"
    );
    let entry = store.snapshot().into_iter().find(|e| e.key == key).unwrap();
    assert_eq!(entry.cooldowns, 1, "one cooldown, not eleven");
}

#[tokio::test(start_paused = true)]
async fn a_forced_probe_that_is_never_sent_leaves_the_cooldown_in_place() {
    let store = MemoryHealthStore::default();
    let key = HealthKey::model("p", "m");
    store.failure(
        &key,
        FailureReport {
            retry_after: Some(Duration::from_secs(60)),
            ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
        },
    );
    assert_eq!(
        store.admit(&key, true),
        tower_llm_failover::health::Admission::Probe
    );
    // The turn's budget refuses the attempt: the probe slot is given back.
    store.release_probe(&key);
    assert!(
        matches!(store.availability(&key), Availability::Cooling(_)),
        "{:?}",
        store.availability(&key)
    );
    assert!(matches!(
        store.admit(&key, false),
        tower_llm_failover::health::Admission::Refused(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_failed_forced_probe_never_shortens_the_rest_it_probed() {
    let store = MemoryHealthStore::default();
    let key = HealthKey::model("p", "m");
    store.failure(
        &key,
        FailureReport {
            retry_after: Some(Duration::from_secs(300)),
            ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
        },
    );
    // Every target rests; a turn probes this one early, and it fails again.
    assert_eq!(
        store.admit(&key, true),
        tower_llm_failover::health::Admission::Probe
    );
    store.failure(
        &key,
        FailureReport {
            was_probe: true,
            ..FailureReport::new(FailureClass::ServerError, Scope::Model)
        },
    );
    tokio::time::advance(Duration::from_secs(299)).await;
    assert!(
        matches!(store.availability(&key), Availability::Cooling(_)),
        "the 300 s rest stands: {:?}",
        store.availability(&key)
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(store.availability(&key), Availability::Probe);
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_never_reports_is_abandoned_exactly_at_the_probe_timeout() {
    let store = MemoryHealthStore::new(CooldownPolicy {
        probe_timeout: Duration::from_secs(7),
        ..CooldownPolicy::default()
    });
    assert_eq!(store.policy().probe_timeout, Duration::from_secs(7));
    let key = HealthKey::model("p", "m");
    store.failure(
        &key,
        FailureReport {
            retry_after: Some(Duration::from_secs(10)),
            ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
        },
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        store.admit(&key, false),
        tower_llm_failover::health::Admission::Probe
    );
    // The probe's turn is lost without a report: the key waits for it...
    tokio::time::advance(Duration::from_secs(6)).await;
    assert_eq!(store.availability(&key), Availability::Probing);
    assert!(matches!(
        store.admit(&key, false),
        tower_llm_failover::health::Admission::Refused(Availability::Probing)
    ));
    // ...until the probe timeout has passed, then the next request probes.
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(store.availability(&key), Availability::Probe);
}

#[tokio::test(start_paused = true)]
async fn a_probes_success_without_a_first_output_figure_still_clears_the_rest() {
    let store = MemoryHealthStore::default();
    let key = HealthKey::model("p", "m");
    store.failure(
        &key,
        FailureReport {
            retry_after: Some(Duration::from_secs(10)),
            ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
        },
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        store.admit(&key, false),
        tower_llm_failover::health::Admission::Probe
    );
    // A whole answer may carry no time to first output.
    store.success(&key, SuccessReport::Whole { ttft: None });
    assert_eq!(store.availability(&key), Availability::Healthy);
    let entry = store.snapshot().into_iter().find(|e| e.key == key).unwrap();
    assert_eq!(entry.state, KeyState::Healthy);
    assert_eq!(entry.failure_streak, 0, "a whole success ends the streak");
}

// ---- Health that only the provider can cool -------------------------------

use tower_llm_failover::budget::TurnLimits;
use tower_llm_failover::identity::ClientId;
use tower_llm_failover::{Phase, classify::Classification, classify::Note};
use tower_llm_testing::chunks;

/// A primary that fails as scripted and a backup that answers; three
/// hintless failures in 30 s cool the primary (the default policy), and a
/// failing attempt is never retried on the same target.
fn pair(primary: &FakeProvider, store: &Arc<MemoryHealthStore>) -> Failover<Models> {
    builder(store)
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .target(Target::new("primary", Models::new(&[("gpt-x", primary.clone())])).model("gpt-x"))
        .target(
            Target::new(
                "backup",
                Models::new(&[(
                    "backup-model",
                    FakeProvider::new("backup").always(Reply::stream("backup", 2)),
                )]),
            )
            .model("backup-model"),
        )
        .build()
}

fn keyed(request: Request<Full<Bytes>>, key: Option<&str>) -> Request<Full<Bytes>> {
    let mut request = request;
    if let Some(key) = key {
        request.extensions_mut().insert(ClientId::key(key));
    }
    request
}

async fn send_as(failover: &Failover<Models>, request: Request<Full<Bytes>>) -> Answer {
    let response = failover.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let target = response
        .headers()
        .get("x-failover-target")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        target,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_timeout_the_turns_own_deadline_caused_cools_nothing() {
    let store = Arc::new(MemoryHealthStore::default());
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    // The turn's 2 s are what limit the wait for the head (its own timeout
    // is 60 s): five such timeouts say nothing about the provider.
    let failover = builder(&store)
        .limits(TurnLimits {
            deadline: Duration::from_secs(2),
            ..TurnLimits::new()
        })
        .target(Target::new("primary", Models::new(&[("gpt-x", primary.clone())])).model("gpt-x"))
        .build();
    for _ in 0..5 {
        let answer = send(&failover, "gpt-x", false).await;
        assert_ne!(answer.status, StatusCode::OK);
    }
    assert_eq!(primary.calls(), 5, "every request tried the primary");
    assert!(
        cooling_keys(&store).is_empty(),
        "{:?}",
        cooling_keys(&store)
    );

    // The provider's own head timeout (1 s, well inside the turn's 30 s)
    // does count: three cool the model.
    let store = Arc::new(MemoryHealthStore::default());
    let failover = builder(&store)
        .limits(TurnLimits {
            deadline: Duration::from_secs(30),
            ..TurnLimits::new()
        })
        .timeouts(|t| Timeouts {
            non_streaming_head: Some(Duration::from_secs(1)),
            ..t
        })
        .target(Target::new("primary", Models::new(&[("gpt-x", primary.clone())])).model("gpt-x"))
        .build();
    for _ in 0..3 {
        send(&failover, "gpt-x", false).await;
    }
    assert_eq!(cooling_keys(&store), ["primary/gpt-x"]);
}

#[tokio::test(start_paused = true)]
async fn an_answer_over_our_own_size_cap_is_the_requests_and_cools_nothing() {
    let store = Arc::new(MemoryHealthStore::default());
    let primary = FakeProvider::new("primary").always(Reply::completion("primary"));
    let failover = builder(&store)
        .caps(|c| Caps {
            response_bytes: 64,
            ..c
        })
        .target(Target::new("primary", Models::new(&[("gpt-x", primary.clone())])).model("gpt-x"))
        .build();
    for _ in 0..5 {
        let answer = send(&failover, "gpt-x", false).await;
        assert_ne!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    assert_eq!(primary.calls(), 5);
    assert!(
        cooling_keys(&store).is_empty(),
        "{:?}",
        cooling_keys(&store)
    );
}

const GEMINI_PER_MODEL_429: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}]}}"#;
const GEMINI_PER_PROJECT_429: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerDayPerProject-FreeTier"}]}]}}"#;
const DENIED_403: &str = r#"{"error":{"message":"You do not have access to this model.","type":"permission_error","param":null,"code":"permission_denied"}}"#;

#[tokio::test(start_paused = true)]
async fn a_client_named_models_per_model_quota_or_403_cools_that_model_never_the_credential() {
    let store = Arc::new(MemoryHealthStore::default());
    let quota = FakeProvider::new("quota").always(Reply::status(429, GEMINI_PER_MODEL_429));
    let denied = FakeProvider::new("denied").always(Reply::status(403, DENIED_403));
    let fine = FakeProvider::new("fine").always(Reply::completion("fine"));
    let primary = Models::new(&[
        ("quota-model", quota),
        ("denied-model", denied),
        ("fine-model", fine),
    ]);
    let backup = Models::new(&[(
        "backup-model",
        FakeProvider::new("backup").always(Reply::completion("backup")),
    )]);
    let failover = route(&primary, &backup, &store);
    for model in ["quota-model", "denied-model"] {
        let answer = send(&failover, model, false).await;
        assert_eq!(answer.target, "backup", "{model}: {}", answer.body);
    }
    // The credential still serves its other models.
    let answer = send(&failover, "fine-model", false).await;
    assert_eq!(
        (answer.status, answer.target.as_str()),
        (StatusCode::OK, "primary")
    );
    let snapshot = store.snapshot();
    assert!(
        snapshot
            .iter()
            .all(|e| e.key != HealthKey::account("primary")),
        "the account was charged: {snapshot:?}"
    );
    let charged: Vec<(String, u32)> = snapshot
        .iter()
        .filter(|e| e.failure_streak > 0)
        .map(|e| (e.key.to_string(), e.failure_streak))
        .collect();
    assert_eq!(
        charged,
        [
            ("primary/denied-model".to_owned(), 1),
            ("primary/quota-model".to_owned(), 1)
        ]
    );

    // A per-project quota is still the credential's.
    let store = Arc::new(MemoryHealthStore::default());
    let project = FakeProvider::new("project").always(Reply::status(429, GEMINI_PER_PROJECT_429));
    let fine = FakeProvider::new("fine").always(Reply::completion("fine"));
    let primary = Models::new(&[("any-model", project), ("fine-model", fine)]);
    let failover = route(&primary, &backup, &store);
    send(&failover, "any-model", false).await;
    assert_eq!(send(&failover, "fine-model", false).await.target, "backup");
    assert_eq!(cooling_keys(&store), ["primary/*"]);
}

#[test]
fn scope_rules_read_whose_failure_it_was() {
    let rules = ScopeRules::new();
    use FailureClass::*;
    // Our own limits: request scope, whatever the overrides say.
    assert_eq!(
        rules.scope(Timeout, Some(Note::TurnDeadline), false),
        Scope::Request
    );
    assert_eq!(
        rules.scope(Timeout, Some(Note::GatewayTimeout), false),
        Scope::Model
    );
    assert_eq!(
        rules.scope(InvalidResponse, Some(Note::Oversize), true),
        Scope::Request
    );
    assert_eq!(
        rules.scope(InvalidResponse, Some(Note::TruncatedStream), true),
        Scope::Model
    );
    let strict = rules.clone().set(Timeout, Scope::Account);
    assert_eq!(
        strict.scope(Timeout, Some(Note::TurnDeadline), false),
        Scope::Request
    );
    // A client-named model's own quota and refusal are that model's.
    assert_eq!(
        rules.scope(QuotaExhausted, Some(Note::PerModelQuota), true),
        Scope::Model
    );
    assert_eq!(
        rules.scope(QuotaExhausted, Some(Note::PerModelQuota), false),
        Scope::Account
    );
    assert_eq!(rules.scope(QuotaExhausted, None, true), Scope::Account);
    assert_eq!(rules.scope(PermissionDenied, None, true), Scope::Model);
    assert_eq!(rules.scope(PermissionDenied, None, false), Scope::Account);
    // The classifier notes a per-model quota.
    let c = tower_llm_failover::classify::Classifier::default().classify_head(
        Some("gemini"),
        StatusCode::TOO_MANY_REQUESTS,
        &http::HeaderMap::new(),
        GEMINI_PER_MODEL_429.as_bytes(),
    );
    assert_eq!(
        (c.class, c.note),
        (QuotaExhausted, Some(Note::PerModelQuota))
    );
    let _ = Classification::new(Timeout, Phase::Head);
}

#[tokio::test(start_paused = true)]
async fn timeouts_count_once_per_client_and_provider_statements_every_time() {
    // A primary whose head never comes: each stream times out at the head
    // timeout (10 s), the backup answers.
    let store = Arc::new(MemoryHealthStore::default());
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let failover = pair(&primary, &store);
    for _ in 0..5 {
        let answer = send_as(&failover, keyed(chat("gpt-x", true), Some("key-a"))).await;
        assert_eq!(answer.target, "backup");
    }
    assert_eq!(
        primary.calls(),
        5,
        "the primary was tried each time: never cooled"
    );
    assert!(
        cooling_keys(&store).is_empty(),
        "{:?}",
        cooling_keys(&store)
    );
    // Key B's request right after goes to the primary still.
    send_as(&failover, keyed(chat("gpt-x", true), Some("key-b"))).await;
    assert_eq!(primary.calls(), 6);
    assert!(cooling_keys(&store).is_empty());
    // A third client: three clients inside the window cool the model.
    send_as(&failover, keyed(chat("gpt-x", true), Some("key-c"))).await;
    assert_eq!(cooling_keys(&store), ["primary/gpt-x"]);

    // Anonymous requests each count as a client of their own (as before keys).
    let store = Arc::new(MemoryHealthStore::default());
    let failover = pair(&primary, &store);
    for _ in 0..3 {
        send_as(&failover, keyed(chat("gpt-x", true), None)).await;
    }
    assert_eq!(cooling_keys(&store), ["primary/gpt-x"]);

    // A provider's 5xx counts every time, whoever asked.
    let store = Arc::new(MemoryHealthStore::default());
    let failing = FakeProvider::new("failing").always(Reply::status(500, SERVER_500));
    let failover = pair(&failing, &store);
    for _ in 0..3 {
        send_as(&failover, keyed(chat("gpt-x", true), Some("key-a"))).await;
    }
    assert_eq!(cooling_keys(&store), ["primary/gpt-x"]);
}

#[tokio::test(start_paused = true)]
async fn stream_faults_count_once_per_client() {
    let store = Arc::new(MemoryHealthStore::default());
    // A stream that ends without its terminator, before any output.
    let primary =
        FakeProvider::new("primary").always(Reply::Stream(vec![Step::data(chunks::role("p"))]));
    let failover = pair(&primary, &store);
    for _ in 0..5 {
        assert_eq!(
            send_as(&failover, keyed(chat("gpt-x", true), Some("key-a")))
                .await
                .target,
            "backup"
        );
    }
    assert_eq!(primary.calls(), 5);
    assert!(
        cooling_keys(&store).is_empty(),
        "{:?}",
        cooling_keys(&store)
    );
    for key in ["key-b", "key-c"] {
        send_as(&failover, keyed(chat("gpt-x", true), Some(key))).await;
    }
    assert_eq!(cooling_keys(&store), ["primary/gpt-x"]);
}

fn reasoning_chat(model: &str) -> Request<Full<Bytes>> {
    let body = serde_json::json!({
        "model": model,
        "stream": true,
        "reasoning_effort": "high",
        "messages": [{"role": "user", "content": "think"}],
    });
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_target_waits_its_own_first_output_timeout_and_longer_for_reasoning() {
    // The primary's first output comes after 20 s (its head at once).
    let mut steps = vec![
        Step::data(chunks::role("slow")),
        Step::Wait(Duration::from_secs(20)),
    ];
    steps.extend(
        chunks::full_stream("slow", 2)
            .into_iter()
            .skip(1)
            .map(Step::Data),
    );
    let slow = FakeProvider::new("slow").always(Reply::Stream(steps));
    let backup = Models::new(&[(
        "backup-model",
        FakeProvider::new("backup").always(Reply::stream("backup", 2)),
    )]);
    let store = Arc::new(MemoryHealthStore::default());
    let failover = builder(&store)
        .stream_policy(StreamPolicy::new().idle_timeout(Duration::from_secs(60)))
        .timeouts(|t| Timeouts {
            first_output: Duration::from_secs(40),
            ..t
        })
        .target(
            Target::new("primary", Models::new(&[("gpt-x", slow.clone())]))
                .model("gpt-x")
                .first_output_timeout(Duration::from_secs(5))
                .reasoning_first_output_timeout(Duration::from_secs(45)),
        )
        .target(Target::new("backup", backup.clone()).model("backup-model"))
        .build();
    // Its own 5 s, not the builder's 40 s: the backup answers.
    assert_eq!(send(&failover, "gpt-x", true).await.target, "backup");
    // A reasoning request waits the reasoning timeout: the primary answers.
    let answer = send_as(&failover, reasoning_chat("gpt-x")).await;
    assert_eq!(
        (answer.status, answer.target.as_str()),
        (StatusCode::OK, "primary"),
        "{}",
        answer.body
    );
    // A target that sets none waits the builder's default (40 s).
    let failover = builder(&store)
        .stream_policy(StreamPolicy::new().idle_timeout(Duration::from_secs(60)))
        .timeouts(|t| Timeouts {
            first_output: Duration::from_secs(40),
            ..t
        })
        .target(Target::new("primary", Models::new(&[("gpt-x", slow.clone())])).model("gpt-x"))
        .target(Target::new("backup", backup).model("backup-model"))
        .build();
    assert_eq!(send(&failover, "gpt-x", true).await.target, "primary");
}

#[tokio::test(start_paused = true)]
async fn a_recovered_primary_is_used_again_within_the_probe_interval_after_a_60_s_outage() {
    let store = Arc::new(MemoryHealthStore::default());
    let primary = FakeProvider::new("primary").always(Reply::status(500, SERVER_500));
    let failover = pair(&primary, &store);
    let start = tokio::time::Instant::now();
    let key = HealthKey::model("primary", "gpt-x");
    // A request every 6 s through a 60 s outage: the backup answers.
    let mut longest_rest = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(60) {
        let answer = send(&failover, "gpt-x", true).await;
        assert_eq!(answer.target, "backup");
        if let Some(KeyState::Cooling { remaining, .. }) = store
            .snapshot()
            .into_iter()
            .find(|e| e.key == key)
            .map(|e| e.state)
        {
            longest_rest = longest_rest.max(remaining);
        }
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    assert!(
        primary.calls() >= 6,
        "the primary was probed through the outage"
    );
    assert!(
        longest_rest <= Duration::from_secs(30),
        "a hintless rest of {longest_rest:?}"
    );
    // Decision at 60 s; the first request at recovery + 30 s goes to it.
    primary.set_always(Reply::stream("primary", 2));
    tokio::time::sleep_until(start + Duration::from_secs(90)).await;
    let answer = send(&failover, "gpt-x", true).await;
    assert_eq!(
        (answer.status, answer.target.as_str()),
        (StatusCode::OK, "primary")
    );

    // A provider's own hint may rest it longer (up to `max`).
    let store = MemoryHealthStore::default();
    let report = FailureReport {
        retry_after: Some(Duration::from_secs(120)),
        ..FailureReport::new(FailureClass::RateLimited, Scope::Model)
    };
    assert_eq!(store.failure(&key, report), Some(Duration::from_secs(120)));
    // And the cap is the operator's to set.
    let store = MemoryHealthStore::new(CooldownPolicy {
        max_probe_interval: Duration::from_secs(7),
        ..CooldownPolicy::default()
    });
    let hintless = FailureReport::new(FailureClass::ServerError, Scope::Model);
    for _ in 0..2 {
        store.failure(&key, hintless.clone());
    }
    assert_eq!(
        store.failure(&key, hintless.clone()),
        Some(Duration::from_secs(5))
    );
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(
        store.failure(
            &key,
            FailureReport {
                was_probe: true,
                ..hintless
            },
        ),
        Some(Duration::from_secs(7))
    );
}

#[tokio::test(start_paused = true)]
async fn client_named_health_entries_stay_at_the_cap_after_10000_invented_models() {
    let store = MemoryHealthStore::default().max_client_named_keys(100);
    let hintless = FailureReport::new(FailureClass::ServerError, Scope::Model);
    // Keys the operator configured, with state.
    let configured: Vec<HealthKey> = (0..5)
        .map(|i| HealthKey::model("p", format!("configured-{i}")))
        .collect();
    for key in &configured {
        store.failure(key, hintless.clone());
    }
    for i in 0..10_000 {
        store.failure(
            &HealthKey::client_model("p", format!("invented-{i}")),
            hintless.clone(),
        );
    }
    let snapshot = store.snapshot();
    assert_eq!(
        snapshot.len(),
        105,
        "100 client-named keys and the 5 configured ones"
    );
    for key in &configured {
        assert!(snapshot.iter().any(|e| e.key == *key), "{key} was evicted");
    }
    // Least recently written first out: the newest 100 remain.
    assert!(
        snapshot
            .iter()
            .any(|e| e.key == HealthKey::model("p", "invented-9999"))
    );
    assert!(
        snapshot
            .iter()
            .any(|e| e.key == HealthKey::model("p", "invented-9900"))
    );
    assert!(
        !snapshot
            .iter()
            .any(|e| e.key == HealthKey::model("p", "invented-9899"))
    );
}
