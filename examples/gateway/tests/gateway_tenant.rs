//! The gateway's tenant checks in memory, over 127.0.0.1: a turn
//! refused by the tenant ceiling, or for naming no tenant when one is
//! required (`[state] require_tenant`), reaches no provider and still
//! leaves its one `turn` line, under the turn id the response names.
//!
//! One test in its own binary: it installs the process-wide subscriber
//! (tracing caches per-callsite interest, which a thread-local subscriber
//! cannot rely on while other tests run in parallel).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_llm_failover::observe::TURN_ID_HEADER;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;
use tracing_subscriber::layer::SubscriberExt;

type Fields = BTreeMap<&'static str, String>;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<Fields>>>);

struct Visitor(Fields);

impl tracing::field::Visit for Visitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "tower_llm_failover::turn" {
            let mut visitor = Visitor(Fields::new());
            event.record(&mut visitor);
            self.0.lock().unwrap().push(visitor.0);
        }
    }
}

struct Reply {
    status: StatusCode,
    turn_id: String,
    body: String,
}

async fn post(addr: std::net::SocketAddr, tenant: Option<&str>) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json");
    if let Some(tenant) = tenant {
        request = request.header("x-tenant", tenant);
    }
    let body = r#"{"model":"gpt-4o","stream":false,"messages":[{"role":"user","content":"hi"}]}"#;
    let response = client
        .request(request.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let turn_id = response
        .headers()
        .get(TURN_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        turn_id,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_refusals_reach_no_provider_and_leave_a_turn_line() {
    let captured = Captured::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(captured.clone()))
        .unwrap();
    let primary = FakeUpstream::builder("primary")
        .tokens(4)
        .start()
        .await
        .unwrap();
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[state]
tenant_header = "x-tenant"
tenant_ceiling_usd = 0.0
require_tenant = true

[[providers]]
name = "primary"
base_url = "{}"
"#,
        primary.base_url()
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::serve(gateway, listener);

    let turn_line = |turn_id: &str| -> Vec<Fields> {
        captured
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.get("run_id").map(String::as_str) == Some(turn_id))
            .cloned()
            .collect()
    };
    for (tenant, status, code, reason) in [
        (
            Some("acme"),
            StatusCode::PAYMENT_REQUIRED,
            "tenant_spend_ceiling_reached",
            "tenant_ceiling",
        ),
        (
            None,
            StatusCode::BAD_REQUEST,
            "tenant_required",
            "tenant_required",
        ),
    ] {
        let reply = post(running.addr, tenant).await;
        assert_eq!(reply.status, status, "{}", reply.body);
        assert!(reply.body.contains(code), "{}", reply.body);
        assert!(!reply.turn_id.is_empty(), "the response names its run");
        let lines = turn_line(&reply.turn_id);
        assert_eq!(lines.len(), 1, "one turn line: {lines:?}");
        assert_eq!(lines[0]["outcome"], "stopped_before_output");
        assert_eq!(lines[0]["stop_reason"], reason);
        assert_eq!(lines[0]["attempts"], "0");
    }
    assert!(
        primary.requests().is_empty(),
        "refused turns reach no provider"
    );
}
