//! Tenant spend through a budget layer and a failover layer, in memory:
//! admission reserves each attempt's estimate, every paid attempt is
//! charged, and the end of the turn settles the tenant's total to what the
//! turn really cost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};
use tower_llm_failover::failover::Caps;
use tower_llm_failover::failover::{Failover, Target, Timeouts};
use tower_llm_failover::identity::ClientId;
use tower_llm_failover::observe::TurnRecord;
use tower_llm_failover::{
    Cost, budget::Budget, budget::BudgetLayer, budget::MemorySpendStore, budget::Pricing,
    budget::Reservation, budget::SpendCheck, budget::SpendError, budget::SpendFuture,
    budget::SpendStore, budget::SpendWindow, budget::TenantSpend, budget::TurnBudget,
};
use tower_llm_failover::{FailureClass, Phase};
use tower_llm_failover::{Usage, dialect::Dialect, dialect::OpenAiChat};
use tower_llm_testing::{FakeProvider, Reply, Step};

/// Output tokens a request asks for at most: what a whole answer cut
/// before its head is charged.
const MAX_TOKENS: u64 = 1000;

/// 2 USD per million input tokens, 1,000 USD per million output tokens: an
/// estimate is dominated by `max_tokens`, a real answer of five tokens
/// costs little.
fn pricing() -> Pricing {
    Pricing::per_million_usd(2.0, 1000.0)
}

fn body(stream: bool) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "model": "gpt-x",
            "stream": stream,
            "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": "Tell me about caching, at length."}],
        })
        .to_string(),
    )
}

/// The prompt tokens the dialect estimates for [`body`].
fn input_tokens() -> u64 {
    let (requirements, _) = OpenAiChat.read_request(body(false)).unwrap();
    assert!(requirements.input_tokens > 0);
    requirements.input_tokens
}

fn request(tenant: &str, stream: bool) -> Request<Full<Bytes>> {
    let mut request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(body(stream)))
        .unwrap();
    request.extensions_mut().insert(ClientId::key(tenant));
    request
}

type Stack = Budget<Failover<FakeProvider>>;

fn stack(spend: &TenantSpend, targets: &[(&str, &FakeProvider)]) -> Stack {
    let mut builder = Failover::builder()
        .timeouts(|t| Timeouts {
            non_streaming_head: Some(Duration::from_secs(5)),
            ..t
        })
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        });
    for (name, provider) in targets {
        builder = builder.target(Target::new(*name, (*provider).clone()).pricing(pricing()));
    }
    BudgetLayer::new()
        .tenant_spend(spend.clone())
        .layer(builder.build())
}

async fn total(store: &MemorySpendStore, tenant: &str) -> Cost {
    store
        .check(tenant, SpendWindow::Day, Cost::MAX)
        .await
        .unwrap()
        .spent
}

/// Lets spawned settlements run (they are spawned when a turn's last
/// handle drops).
async fn settled() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn twenty_concurrent_turns_admit_exactly_the_five_estimates_the_ceiling_covers() {
    let estimate = pricing().cost(input_tokens(), MAX_TOKENS);
    let store = Arc::new(MemorySpendStore::new());
    let ceiling = Cost::from_nanos(estimate.as_nanos() * 5);
    let spend = TenantSpend::new(store.clone(), SpendWindow::Day, ceiling);
    // Every admitted turn is held at the provider until all 20 asked.
    let provider = FakeProvider::new("p").always(Reply::Delayed(
        Duration::from_secs(2),
        Box::new(Reply::completion("p")),
    ));
    let service = stack(&spend, &[("p", &provider)]);
    let turns: Vec<_> = (0..20)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                let response = service.oneshot(request("acme", false)).await.unwrap();
                let status = response.status();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, String::from_utf8(body.to_vec()).unwrap())
            })
        })
        .collect();
    let mut admitted = 0;
    for turn in turns {
        let (status, body) = turn.await.unwrap();
        match status {
            StatusCode::OK => admitted += 1,
            StatusCode::PAYMENT_REQUIRED => {
                assert!(body.contains("tenant_spend_ceiling_reached"), "{body}");
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(admitted, 5, "the ceiling covers five estimates, no more");
    assert_eq!(provider.calls(), 5, "refused turns reach no provider");
    // Each admitted turn used 10 prompt and 5 output tokens (reported):
    // settled, the tenant's total is that, not the estimates.
    settled().await;
    let real = pricing().cost(10, 5);
    assert_eq!(
        total(&store, "acme").await,
        Cost::from_nanos(real.as_nanos() * 5)
    );
    // Settled below the ceiling again: the tenant is admitted again, and
    // another tenant never was held.
    let service = stack(&spend, &[("p", &provider)]);
    let response = service
        .clone()
        .oneshot(request("acme", false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let response = service.oneshot(request("other", false)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_head_timeout_on_a_whole_answer_is_charged_prompt_plus_max_tokens() {
    let store = Arc::new(MemorySpendStore::new());
    let spend = TenantSpend::new(store.clone(), SpendWindow::Day, Cost::from_usd(100.0));
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let backup = FakeProvider::new("backup");
    let service = stack(&spend, &[("primary", &primary), ("backup", &backup)]);
    let response = service.oneshot(request("acme", false)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let budget = TurnBudget::from_extensions(response.extensions()).unwrap();
    response.into_body().collect().await.unwrap();
    let attempts = run.attempts();
    let cut = &attempts[0];
    assert_eq!(
        (cut.class, cut.phase),
        (Some(FailureClass::Timeout), Some(Phase::Head))
    );
    let prompt = input_tokens();
    assert_eq!(cut.usage, Some(Usage::new(prompt, MAX_TOKENS)));
    let charged = pricing().cost(prompt, MAX_TOKENS);
    assert_eq!(cut.cost, Some(charged));
    assert!(cut.estimated, "the charge is marked as an estimate");
    let answered = attempts[1].cost.unwrap();
    assert!(!attempts[1].estimated);
    assert_eq!(budget.spent(), (charged + answered, true));
    // Each attempt reserved its estimate (the store holds both while the
    // turn is not settled); settled, the tenant pays both attempts as
    // charged.
    assert_eq!(
        total(&store, "acme").await,
        Cost::from_nanos(charged.as_nanos() * 2)
    );
    drop(budget);
    settled().await;
    assert_eq!(total(&store, "acme").await, charged + answered);
}

#[tokio::test(start_paused = true)]
async fn refused_and_unsent_requests_are_not_charged() {
    let store = Arc::new(MemorySpendStore::new());
    let spend = TenantSpend::new(store.clone(), SpendWindow::Day, Cost::from_usd(100.0));
    let refused = FakeProvider::new("refused").always(Reply::status(
        500,
        r#"{"error":{"message":"The server had an error.","type":"server_error","param":null,"code":null}}"#,
    ));
    let unreachable = FakeProvider::new("unreachable").always(Reply::Refused);
    let backup = FakeProvider::new("backup");
    let service = stack(
        &spend,
        &[
            ("refused", &refused),
            ("unreachable", &unreachable),
            ("backup", &backup),
        ],
    );
    let response = service.oneshot(request("acme", false)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    response.into_body().collect().await.unwrap();
    let attempts = run.attempts();
    assert_eq!(attempts.len(), 3);
    assert_eq!(attempts[0].status, Some(500));
    assert_eq!(attempts[1].phase, Some(Phase::BeforeSend));
    for failed in &attempts[..2] {
        assert_eq!((failed.cost, failed.usage), (None, None), "{failed:?}");
    }
    settled().await;
    assert_eq!(total(&store, "acme").await, attempts[2].cost.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_client_leaving_mid_stream_is_charged_and_settled() {
    let store = Arc::new(MemorySpendStore::new());
    let spend = TenantSpend::new(store.clone(), SpendWindow::Day, Cost::from_usd(100.0));
    // Five tokens, then the provider keeps the stream open.
    let provider = FakeProvider::new("p").always(Reply::tokens_then("p", 5, vec![Step::Stall]));
    let service = stack(&spend, &[("p", &provider)]);
    let response = service.oneshot(request("acme", true)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let mut body = response.into_body();
    // The client reads a little, then leaves.
    body.frame().await.unwrap().unwrap();
    drop(body);
    settled().await;
    let attempts = run.attempts();
    let left = &attempts[0];
    assert_eq!(left.output_events, 5, "{left:?}");
    assert_eq!(left.usage, Some(Usage::new(input_tokens(), 5)));
    assert!(left.estimated);
    let charged = pricing().cost(input_tokens(), 5);
    assert_eq!(left.cost, Some(charged));
    // Reserved at prompt + max_tokens, settled at what was produced.
    assert_eq!(total(&store, "acme").await, charged);
}

#[tokio::test(start_paused = true)]
async fn a_turn_dropped_mid_attempt_is_charged_its_estimate() {
    let store = Arc::new(MemorySpendStore::new());
    let spend = TenantSpend::new(store.clone(), SpendWindow::Day, Cost::from_usd(100.0));
    let provider = FakeProvider::new("p").always(Reply::Silent);
    let service = stack(&spend, &[("p", &provider)]);
    let turn = tokio::spawn(service.oneshot(request("acme", false)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(provider.calls(), 1);
    // The client leaves before any answer.
    turn.abort();
    assert!(turn.await.unwrap_err().is_cancelled());
    settled().await;
    assert_eq!(
        total(&store, "acme").await,
        pricing().cost(input_tokens(), MAX_TOKENS)
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_without_a_tenant_is_not_metered_unless_one_is_required() {
    let store = Arc::new(Counted::default());
    let spend = TenantSpend::new(store.clone(), SpendWindow::Day, Cost::ZERO);
    let provider = FakeProvider::new("p");
    let mut anonymous = request("ignored", false);
    anonymous.extensions_mut().remove::<ClientId>();
    // A header naming a tenant is not an identity: nothing reads it.
    anonymous
        .headers_mut()
        .insert("x-tenant", http::HeaderValue::from_static("acme"));
    let response = stack(&spend, &[("p", &provider)])
        .oneshot(anonymous)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    settled().await;
    assert_eq!(
        store.writes(),
        0,
        "nothing was written: the store holds no total"
    );
    let mut required = spend;
    required.require_tenant = true;
    let mut anonymous = request("ignored", false);
    anonymous.extensions_mut().remove::<ClientId>();
    let response = stack(&required, &[("p", &provider)])
        .oneshot(anonymous)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(response.headers().contains_key("x-failover-run-id"));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("tenant_required"));
    assert_eq!(provider.calls(), 1);
}

/// A memory store that counts the calls that may write to it (a check
/// writes nothing): a store never written to holds no total.
#[derive(Debug, Default)]
struct Counted {
    inner: MemorySpendStore,
    writes: std::sync::atomic::AtomicUsize,
}

impl Counted {
    fn writes(&self) -> usize {
        self.writes.load(std::sync::atomic::Ordering::Acquire)
    }

    fn count(&self) {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl SpendStore for Counted {
    fn add_and_check<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<SpendCheck, SpendError>> {
        self.count();
        self.inner.add_and_check(tenant, window, amount, ceiling)
    }

    fn check<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<SpendCheck, SpendError>> {
        self.inner.check(tenant, window, ceiling)
    }

    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<Reservation, SpendError>> {
        self.count();
        self.inner.reserve(tenant, window, amount, ceiling)
    }

    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        reserved: Cost,
        actual: Cost,
    ) -> SpendFuture<'a, Result<Cost, SpendError>> {
        self.count();
        self.inner.settle(tenant, window, reserved, actual)
    }
}

/// A store whose settlements fail while `failures` lasts, then go through;
/// with `hang_reservations`, its reservations never answer (a store
/// unreachable without an error: a partitioned Redis).
#[derive(Debug, Default)]
struct Flaky {
    inner: MemorySpendStore,
    failures: std::sync::atomic::AtomicUsize,
    hang_reservations: bool,
}

impl SpendStore for Flaky {
    fn add_and_check<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<SpendCheck, SpendError>> {
        self.inner.add_and_check(tenant, window, amount, ceiling)
    }

    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        amount: Cost,
        ceiling: Cost,
    ) -> SpendFuture<'a, Result<Reservation, SpendError>> {
        if self.hang_reservations {
            return Box::pin(std::future::pending());
        }
        self.inner.reserve(tenant, window, amount, ceiling)
    }

    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        window: SpendWindow,
        reserved: Cost,
        actual: Cost,
    ) -> SpendFuture<'a, Result<Cost, SpendError>> {
        use std::sync::atomic::Ordering;
        let failing = self
            .failures
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Box::pin(std::future::ready(Err(SpendError::Unavailable(
                "the store is down".into(),
            ))));
        }
        self.inner.settle(tenant, window, reserved, actual)
    }
}

#[tokio::test(start_paused = true)]
async fn failing_closed_a_turns_settlement_survives_a_store_outage() {
    let store = Arc::new(Flaky {
        failures: 4.into(),
        ..Flaky::default()
    });
    let spend = TenantSpend::new(store.clone(), SpendWindow::Day, Cost::from_usd(100.0));
    let provider = FakeProvider::new("p");
    let response = stack(&spend, &[("p", &provider)])
        .oneshot(request("acme", false))
        .await
        .unwrap();
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    response.into_body().collect().await.unwrap();
    let real = run.attempts()[0].cost.unwrap();
    // Reserved at the estimate while the settlement waits for the store.
    settled().await;
    let reserved = pricing().cost(input_tokens(), MAX_TOKENS);
    assert_eq!(total(&store.inner, "acme").await, reserved);
    assert_eq!(spend.pending_settlements(), 1);
    // Four failures, then the store takes it: the total is the real cost.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(total(&store.inner, "acme").await, real);
    assert_eq!(spend.pending_settlements(), 0);
}

/// The failover layer bounds its own waits by the turn's deadline but a
/// reservation with a spend store; a turn with a tenant therefore keeps
/// the budget layer's deadline timer, and a store that never answers still
/// ends the turn at its deadline.
#[tokio::test(start_paused = true)]
async fn a_reservation_that_never_answers_ends_at_the_turns_deadline() {
    let store = Flaky {
        hang_reservations: true,
        ..Flaky::default()
    };
    let spend = TenantSpend::new(Arc::new(store), SpendWindow::Day, Cost::from_usd(100.0));
    let provider = FakeProvider::new("p");
    let mut builder = Failover::builder();
    builder = builder.target(Target::new("p", provider.clone()).pricing(pricing()));
    let service = BudgetLayer::new()
        .deadline(Duration::from_secs(3))
        .tenant_spend(spend)
        .layer(builder.build());
    let started = tokio::time::Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(60),
        service.oneshot(request("acme", false)),
    )
    .await
    .expect("the turn ends")
    .unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("turn_deadline_exceeded"), "{body}");
    assert_eq!(provider.calls(), 0, "no attempt was sent");
}
