//! One log line per attempt, with the decision taken, and one per turn
//! with its outcome and the reason it stopped: a committed stream is logged
//! once, when it ends, with its final figures. The turn's line is INFO; an
//! attempt's is INFO when something went wrong, DEBUG when it went well.
//!
//! Alone in its own test binary with a global subscriber: tracing caches
//! per-callsite interest, which a thread-local subscriber cannot rely on
//! while other tests run in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_llm_failover::budget::TurnLimits;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_testing::{FakeProvider, Reply};
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
        let target = event.metadata().target();
        if target == "tower_llm_failover::attempt" || target == "tower_llm_failover::turn" {
            let mut visitor = Visitor(Fields::new());
            event.record(&mut visitor);
            visitor.0.insert("line", target.to_owned());
            visitor
                .0
                .insert("level", event.metadata().level().to_string());
            self.0.lock().unwrap().push(visitor.0);
        }
    }
}

/// The global capture, installed once for the binary's tests.
fn captured() -> &'static Captured {
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(captured.clone()),
        )
        .unwrap();
        captured
    })
}

/// The attempt lines of one turn.
fn lines_of(turn_id: &str) -> Vec<Fields> {
    all_lines_of(turn_id)
        .into_iter()
        .filter(|l| l["line"] == "tower_llm_failover::attempt")
        .collect()
}

/// The turn lines of one turn (one, when all is well).
fn turn_lines_of(turn_id: &str) -> Vec<Fields> {
    all_lines_of(turn_id)
        .into_iter()
        .filter(|l| l["line"] == "tower_llm_failover::turn")
        .collect()
}

fn all_lines_of(turn_id: &str) -> Vec<Fields> {
    captured()
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.get("run_id").map(String::as_str) == Some(turn_id))
        .cloned()
        .collect()
}

#[path = "support/turn_request.rs"]
mod turn_request;
use turn_request::chat;

#[tokio::test(start_paused = true)]
async fn a_committed_stream_is_logged_once_with_its_final_figures() {
    captured();
    let primary = FakeProvider::new("primary").always(Reply::status(
        429,
        r#"{"error":{"message":"quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
    ));
    let backup = FakeProvider::new("backup").always(Reply::stream("backup", 6));
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .target(Target::new("backup", backup))
        .build();
    let response = failover.oneshot(chat(true, "stream-turn")).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));

    let lines = lines_of("stream-turn");
    assert_eq!(lines.len(), 2, "one line per attempt: {lines:?}");
    assert_eq!(lines[0]["attempt"], "1");
    assert_eq!(lines[0]["decision"], "reroute");
    assert_eq!(lines[1]["attempt"], "2");
    assert_eq!(lines[1]["decision"], "committed");
    // Logged at the end: the output events are the stream's whole count.
    assert_eq!(lines[1]["output_events"], "6");
    // What went wrong is INFO; what went well is DEBUG, the turn's line
    // saying it at INFO.
    assert_eq!(lines[0]["level"], "INFO");
    assert_eq!(lines[1]["level"], "DEBUG");
    let turn = turn_lines_of("stream-turn");
    assert_eq!(turn.len(), 1, "{turn:?}");
    assert_eq!(turn[0]["outcome"], "after_hop");
    assert_eq!(turn[0]["attempts"], "2");
    assert!(!turn[0].contains_key("stop_reason"));
    assert_eq!(turn[0]["level"], "INFO");
    // The turn's line comes after its attempts' lines.
    let all = all_lines_of("stream-turn");
    assert_eq!(all.last().unwrap()["line"], "tower_llm_failover::turn");
}

#[tokio::test(start_paused = true)]
async fn an_attempt_cut_short_by_a_cancelled_turn_still_leaves_its_line() {
    captured();
    let primary = FakeProvider::new("primary").always(Reply::Silent);
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .build();
    // The client gives up after a second, long before any timeout.
    let turn = failover.oneshot(chat(false, "cancelled-turn"));
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(1), turn)
            .await
            .is_err()
    );
    assert_eq!(primary.calls(), 1);
    let lines = lines_of("cancelled-turn");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["class"], "cancelled");
    assert_eq!(lines[0]["decision"], "stop");
    assert_eq!(lines[0]["bytes_flushed"], "0");
    let turn = turn_lines_of("cancelled-turn");
    assert_eq!(turn.len(), 1, "{turn:?}");
    assert_eq!(turn[0]["outcome"], "stopped_before_output");
    assert_eq!(turn[0]["stop_reason"], "cancelled");
}

#[tokio::test(start_paused = true)]
async fn an_attempt_whose_turn_then_stopped_on_the_spend_ceiling_is_logged_as_stop() {
    captured();
    use tower_llm_failover::dialect::{Dialect, OpenAiChat};
    use tower_llm_failover::{Cost, budget::Pricing};
    use tower_llm_testing::{Step, chunks};
    // Rate limited in-band after its role chunk: a failure the provider
    // processed (charged at its estimate), which is retried on the same
    // target after a backoff.
    let primary = FakeProvider::new("primary").always(Reply::Stream(vec![
        Step::Data(chunks::role("primary")),
        Step::Data(chunks::rate_limit_error()),
    ]));
    let failover = Failover::builder()
        .target(
            Target::new("primary", primary.clone()).pricing(Pricing::per_million_usd(1_000.0, 0.0)),
        )
        .build();
    let request = chat(true, "spend-turn");
    let body = request.body().clone().collect().await.unwrap().to_bytes();
    let (requirements, _) = OpenAiChat.read_request(body).unwrap();
    // The first attempt's estimate fits; after it is charged, the next does
    // not.
    let one = Pricing::per_million_usd(1_000.0, 0.0).cost(requirements.input_tokens, 0);
    let ceiling = Cost::from_nanos(one.as_nanos() + one.as_nanos() / 2);
    let mut request = request;
    request.extensions_mut().insert(
        TurnLimits {
            spend_ceiling: Some(ceiling),
            ..TurnLimits::new()
        }
        .start_with_turn_id("spend-turn".into()),
    );
    let response = failover.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 402);
    assert_eq!(primary.calls(), 1);
    let lines = lines_of("spend-turn");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["class"], "rate_limited");
    assert_eq!(
        lines[0]["decision"], "stop",
        "the decision taken: {lines:?}"
    );
    let turn = turn_lines_of("spend-turn");
    assert_eq!(turn.len(), 1, "{turn:?}");
    assert_eq!(turn[0]["outcome"], "stopped_before_output");
    assert_eq!(turn[0]["stop_reason"], "spend_ceiling");
    assert_eq!(turn[0]["attempts"], "1");
}

#[tokio::test(start_paused = true)]
async fn a_turn_refused_before_any_attempt_leaves_a_turn_line() {
    captured();
    use tower::ServiceBuilder;
    use tower_llm_failover::{Cost, budget::BudgetLayer};
    let primary = FakeProvider::new("primary").always(Reply::stream("primary", 2));
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .build();
    let gateway = ServiceBuilder::new()
        .layer(BudgetLayer::new())
        .service(failover);
    let mut request = chat(true, "refused-turn");
    request.extensions_mut().insert(
        TurnLimits {
            spend_ceiling: Some(Cost::ZERO),
            ..TurnLimits::new()
        }
        .start_with_turn_id("refused-turn".into()),
    );
    let response = gateway.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 402);
    assert_eq!(primary.calls(), 0);
    assert!(lines_of("refused-turn").is_empty());
    let turn = turn_lines_of("refused-turn");
    assert_eq!(turn.len(), 1, "{turn:?}");
    assert_eq!(turn[0]["outcome"], "stopped_before_output");
    assert_eq!(turn[0]["stop_reason"], "spend_ceiling");
    assert_eq!(turn[0]["attempts"], "0");
}

#[tokio::test(start_paused = true)]
async fn a_turn_with_every_target_cooling_leaves_a_turn_line() {
    captured();
    let primary = FakeProvider::new("primary").always(Reply::status(
        401,
        r#"{"error":{"message":"bad key","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#,
    ));
    let failover = Failover::builder()
        .target(Target::new("primary", primary.clone()))
        .refuse_when_cooling(true)
        .build();
    // The first turn's auth failure cools the credential at once.
    let first = failover
        .clone()
        .oneshot(chat(false, "cooling-first"))
        .await
        .unwrap();
    // Every option spent: one error naming the first failure.
    assert_eq!(first.status(), 502);
    let turn = turn_lines_of("cooling-first");
    assert_eq!(turn.len(), 1, "{turn:?}");
    assert_eq!(turn[0]["stop_reason"], "exhausted");

    let second = failover
        .oneshot(chat(false, "cooling-second"))
        .await
        .unwrap();
    assert_eq!(second.status(), 503);
    assert_eq!(primary.calls(), 1);
    assert!(lines_of("cooling-second").is_empty());
    let turn = turn_lines_of("cooling-second");
    assert_eq!(turn.len(), 1, "{turn:?}");
    assert_eq!(turn[0]["outcome"], "stopped_before_output");
    assert_eq!(turn[0]["stop_reason"], "no_available_target");
}

#[tokio::test(start_paused = true)]
async fn a_committed_stream_that_failed_after_commit_is_an_info_line() {
    captured();
    let primary = FakeProvider::new("primary").always(Reply::tokens_then(
        "primary",
        3,
        vec![tower_llm_testing::Step::Error(
            "connection reset".to_owned(),
        )],
    ));
    let failover = Failover::builder()
        .target(Target::new("primary", primary))
        .build();
    let response = failover.oneshot(chat(true, "cut-turn")).await.unwrap();
    let _ = response.into_body().collect().await;
    let lines = lines_of("cut-turn");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["decision"], "committed");
    assert!(lines[0].contains_key("class"), "{lines:?}");
    assert_eq!(lines[0]["level"], "INFO", "something went wrong: {lines:?}");
}
