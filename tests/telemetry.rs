//! Telemetry of turns: GenAI spans (captured by a test subscriber),
//! metrics (captured by a test recorder), and no secret anywhere.
//!
//! Alone in its own test binary with a global subscriber and a global
//! recorder: tracing caches per-callsite interest, and the `metrics` macros
//! read the global recorder. Each test uses its own target names and run
//! ids, so tests running in parallel never read each other's figures.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower::ServiceExt;
use tower_llm_client::{Auth, UpstreamClient};
use tower_llm_failover::budget::TurnLimits;
use tower_llm_failover::failover::Caps;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_failover::{StopReason, TurnOutcome, observe::TurnRecord};
use tower_llm_testing::{FakeProvider, Reply, Step};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};

type Fields = BTreeMap<String, String>;

/// A span as the subscriber saw it: name, parent, every field recorded.
#[derive(Debug, Clone, Default)]
struct CapturedSpan {
    name: String,
    parent: Option<u64>,
    id: u64,
    fields: Fields,
    closed: bool,
}

#[derive(Default)]
struct Capture {
    spans: Mutex<HashMap<u64, CapturedSpan>>,
    /// Every event, as text: what a log would show.
    events: Mutex<Vec<String>>,
}

struct Visitor<'a>(&'a mut Fields);

impl tracing::field::Visit for Visitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

#[derive(Clone)]
struct Layer(Arc<Capture>);

impl<S> tracing_subscriber::Layer<S> for Layer
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut span = CapturedSpan {
            name: attrs.metadata().name().to_owned(),
            id: id.into_u64(),
            parent: ctx.span_scope(id).and_then(|mut scope| {
                scope.next();
                scope.next().map(|parent| parent.id().into_u64())
            }),
            ..CapturedSpan::default()
        };
        attrs.record(&mut Visitor(&mut span.fields));
        self.0.spans.lock().unwrap().insert(id.into_u64(), span);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(span) = self.0.spans.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Visitor(&mut span.fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(span) = self.0.spans.lock().unwrap().get_mut(&id.into_u64()) {
            span.closed = true;
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        self.0
            .events
            .lock()
            .unwrap()
            .push(format!("{} {fields:?}", event.metadata().target()));
    }
}

struct Globals {
    capture: Arc<Capture>,
    metrics: Snapshotter,
    /// Every value a snapshot took: a snapshot resets counters, and tests
    /// in parallel take them.
    /// (key, counter value or histogram samples or 0, the value as text).
    taken: Mutex<Vec<(CompositeKey, u64, String)>>,
}

/// Everything recorded so far.
fn metrics_so_far() -> Vec<(CompositeKey, u64, String)> {
    let globals = globals();
    let mut taken = globals.taken.lock().unwrap();
    taken.extend(
        globals
            .metrics
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let text = format!("{value:?}");
                // A counter's value, or how many samples a histogram took.
                let count = match &value {
                    DebugValue::Counter(n) => *n,
                    DebugValue::Histogram(samples) => samples.len() as u64,
                    DebugValue::Gauge(_) => 0,
                };
                (key, count, text)
            }),
    );
    taken.clone()
}

fn globals() -> &'static Globals {
    static GLOBALS: OnceLock<Globals> = OnceLock::new();
    GLOBALS.get_or_init(|| {
        let capture = Arc::new(Capture::default());
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(Layer(capture.clone())),
        )
        .unwrap();
        let recorder = DebuggingRecorder::new();
        let metrics = recorder.snapshotter();
        recorder.install().unwrap();
        Globals {
            capture,
            metrics,
            taken: Mutex::default(),
        }
    })
}

/// The closed spans of the turn with `turn_id`: the turn, then its attempts
/// in order.
fn spans_of(turn_id: &str) -> (CapturedSpan, Vec<CapturedSpan>) {
    let spans = globals().capture.spans.lock().unwrap();
    let turn = spans
        .values()
        .find(|s| {
            s.name == "failover.turn"
                && s.fields.get("failover.run_id").map(String::as_str) == Some(turn_id)
        })
        .cloned()
        .expect("the turn's span");
    let mut attempts: Vec<CapturedSpan> = spans
        .values()
        .filter(|s| s.parent == Some(turn.id) && s.name == "failover.attempt")
        .cloned()
        .collect();
    attempts.sort_by_key(|s| s.fields["failover.attempt"].clone());
    (turn, attempts)
}

/// Counter values (or histogram samples) whose labels include every pair
/// of `with`.
fn counter(name: &str, with: &[(&str, &str)]) -> u64 {
    metrics_so_far()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == name)
        .filter(|(key, ..)| {
            with.iter().all(|(k, v)| {
                key.key()
                    .labels()
                    .any(|label| label.key() == *k && label.value() == *v)
            })
        })
        .map(|(_, count, _)| count)
        .sum()
}

#[path = "support/turn_request.rs"]
mod turn_request;
use turn_request::chat;

async fn read<B>(response: Response<B>) -> (TurnRecord, String)
where
    B: http_body::Body,
    B::Error: fmt::Debug,
{
    let run = response.extensions().get::<TurnRecord>().unwrap().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (run, String::from_utf8(body.to_vec()).unwrap())
}

const RATE_LIMITED: &str = r#"{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}"#;

#[tokio::test(start_paused = true)]
async fn a_turn_with_one_reroute_has_a_turn_span_and_two_attempt_spans() {
    globals();
    let primary = FakeProvider::new("span-primary").always(Reply::status(429, RATE_LIMITED));
    let backup = FakeProvider::new("span-backup").always(Reply::stream("backup-model", 4));
    let failover = Failover::builder()
        .target(Target::new("span-primary", primary).provider("prov-a"))
        .target(
            Target::new("span-backup", backup)
                .provider("prov-b")
                .model("backup-model"),
        )
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let response = failover.oneshot(chat(true, "span-turn")).await.unwrap();
    let (run, body) = read(response).await;
    assert!(body.ends_with("data: [DONE]\n\n"));
    assert_eq!(run.outcome(), Some(TurnOutcome::AfterHop));

    let (turn, attempts) = spans_of("span-turn");
    assert!(turn.closed, "the turn span ends with the stream");
    let f = &turn.fields;
    assert_eq!(f["gen_ai.operation.name"], "chat");
    assert_eq!(f["gen_ai.request.model"], "m");
    assert_eq!(f["otel.name"], "chat m");
    assert_eq!(f["gen_ai.provider.name"], "prov-b");
    assert_eq!(f["failover.outcome"], "after_hop");
    assert_eq!(f["failover.attempts"], "2");

    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    let failed = &attempts[0].fields;
    assert!(attempts[0].closed);
    assert_eq!(failed["gen_ai.operation.name"], "chat");
    assert_eq!(failed["gen_ai.provider.name"], "prov-a");
    assert_eq!(failed["gen_ai.request.model"], "m");
    assert_eq!(failed["failover.target"], "span-primary");
    assert_eq!(failed["failover.class"], "rate_limited");
    assert_eq!(failed["error.type"], "rate_limited");
    assert_eq!(failed["failover.phase"], "preamble");
    assert_eq!(failed["failover.bytes_flushed"], "0");
    assert_eq!(failed["failover.output_events"], "0");
    assert_eq!(failed["failover.decision"], "reroute");
    assert_eq!(failed["http.response.status_code"], "429");
    assert!(!failed.contains_key("gen_ai.response.model"));

    let won = &attempts[1].fields;
    assert!(attempts[1].closed);
    assert_eq!(won["failover.target"], "span-backup");
    assert_eq!(won["gen_ai.provider.name"], "prov-b");
    assert_eq!(won["gen_ai.request.model"], "backup-model");
    assert_eq!(won["otel.name"], "chat backup-model");
    assert_eq!(won["gen_ai.response.model"], "backup-model");
    assert!(won.contains_key("gen_ai.response.id"));
    assert_eq!(won["gen_ai.response.finish_reasons"], "stop");
    assert_eq!(won["failover.phase"], "committed");
    assert_eq!(won["failover.decision"], "committed");
    assert_eq!(won["failover.output_events"], "4");
    assert_eq!(
        won["failover.bytes_flushed"],
        run.attempts()[1].bytes_flushed.to_string()
    );
    assert!(run.attempts()[1].bytes_flushed > 0);
    assert!(!won.contains_key("error.type"));
}

/// A target's service runs within its attempt's span (a span it starts
/// is the attempt's child), for a failed attempt and for the one that
/// answered.
#[tokio::test(start_paused = true)]
async fn a_targets_service_runs_within_its_attempts_span() {
    globals();
    // Each call starts a span named after its target, then answers.
    fn traced(
        target: &'static str,
        provider: FakeProvider,
    ) -> Target<
        impl tower::Service<
            Request<Full<Bytes>>,
            Response = Response<tower_llm_testing::ScriptedBody>,
            Error = std::io::Error,
            Future: Send,
        > + Clone
        + Send
        + 'static,
    > {
        let service = tower::service_fn(move |request| {
            let provider = provider.clone();
            async move {
                drop(tracing::info_span!("inspan.upstream_call", target));
                provider.oneshot(request).await
            }
        });
        Target::new(target, service)
    }
    let primary = FakeProvider::new("inspan-primary").always(Reply::status(429, RATE_LIMITED));
    let backup = FakeProvider::new("inspan-backup").always(Reply::completion("inspan-model"));
    let failover = Failover::builder()
        .target(traced("inspan-primary", primary))
        .target(traced("inspan-backup", backup))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let response = failover.oneshot(chat(false, "inspan-turn")).await.unwrap();
    let (run, _) = read(response).await;
    assert_eq!(run.outcome(), Some(TurnOutcome::AfterHop));
    let (_, attempts) = spans_of("inspan-turn");
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    let spans = globals().capture.spans.lock().unwrap();
    for attempt in &attempts {
        let target = &attempt.fields["failover.target"];
        let calls: Vec<&CapturedSpan> = spans
            .values()
            .filter(|s| s.name == "inspan.upstream_call" && s.fields["target"] == *target)
            .collect();
        assert_eq!(calls.len(), 1, "{calls:#?}");
        assert_eq!(calls[0].parent, Some(attempt.id), "{target}: {calls:#?}");
    }
}

/// An attempt dropped before it answered (here with its turn: the client
/// left) is dropped within its span: what its service does as it is
/// dropped is the attempt's child.
#[tokio::test(start_paused = true)]
async fn an_attempt_dropped_unanswered_is_dropped_within_its_span() {
    globals();
    /// Starts a span as it is dropped.
    struct SpanOnDrop;
    impl Drop for SpanOnDrop {
        fn drop(&mut self) {
            drop(tracing::info_span!("dropspan.upstream_dropped"));
        }
    }
    let silent = tower::service_fn(|_request: Request<Full<Bytes>>| async move {
        let _guard = SpanOnDrop;
        std::future::pending::<Result<Response<tower_llm_testing::ScriptedBody>, std::io::Error>>()
            .await
    });
    let failover = Failover::builder()
        .target(Target::new("dropspan-silent", silent))
        .build();
    let turn = failover.oneshot(chat(false, "dropspan-turn"));
    // The client leaves while the attempt waits for its head.
    let left = tokio::time::timeout(std::time::Duration::from_millis(10), turn).await;
    assert!(left.is_err(), "the silent target never answered");
    let (_, attempts) = spans_of("dropspan-turn");
    assert_eq!(attempts.len(), 1, "{attempts:#?}");
    let spans = globals().capture.spans.lock().unwrap();
    let dropped: Vec<&CapturedSpan> = spans
        .values()
        .filter(|s| s.name == "dropspan.upstream_dropped")
        .collect();
    assert_eq!(dropped.len(), 1, "{dropped:#?}");
    assert_eq!(dropped[0].parent, Some(attempts[0].id), "{dropped:#?}");
}

#[tokio::test(start_paused = true)]
async fn failures_before_and_after_commit_land_under_different_phases() {
    globals();
    let before = FakeProvider::new("phase-before").always(Reply::status(429, RATE_LIMITED));
    let after = FakeProvider::new("phase-after").always(Reply::tokens_then(
        "phase-after",
        3,
        vec![Step::Error("connection reset".into())],
    ));
    let failover = Failover::builder()
        .target(Target::new("phase-before", before))
        .target(Target::new("phase-after", after))
        .caps(|c| Caps {
            retries_per_target: 0,
            ..c
        })
        .build();
    let response = failover.oneshot(chat(true, "phase-turn")).await.unwrap();
    let (run, body) = read(response).await;
    assert!(body.contains("\"finish_reason\":\"error\""), "{body}");
    assert_eq!(run.outcome(), Some(TurnOutcome::EndedAfterCommit));
    assert_eq!(run.stop_reason(), Some(StopReason::StreamFailed));

    let pre = [
        ("failover.target", "phase-before"),
        ("failover.phase", "preamble"),
        ("failover.class", "rate_limited"),
        ("failover.decision", "reroute"),
    ];
    assert_eq!(counter("failover.attempts", &pre), 1);
    let post = [
        ("failover.target", "phase-after"),
        ("failover.phase", "committed"),
        ("failover.decision", "committed"),
    ];
    assert_eq!(counter("failover.attempts", &post), 1);
    // Neither under the other's phase.
    assert_eq!(
        counter(
            "failover.attempts",
            &[
                ("failover.target", "phase-before"),
                ("failover.phase", "committed")
            ]
        ),
        0
    );
    assert_eq!(
        counter(
            "failover.attempts",
            &[
                ("failover.target", "phase-after"),
                ("failover.phase", "preamble")
            ]
        ),
        0
    );
    assert_eq!(
        counter(
            "failover.terminal_chunks",
            &[("failover.target", "phase-after")]
        ),
        1
    );
    assert_eq!(
        counter("failover.reroutes", &[("failover.target", "phase-before")]),
        1
    );
    assert!(
        counter(
            "failover.turns",
            &[
                ("failover.outcome", "ended_after_commit"),
                ("failover.stop_reason", "stream_failed")
            ]
        ) >= 1
    );
}

/// A fake provider that echoes the key it was sent in its 401, as OpenAI
/// does (there masked; here whole, the worst case).
async fn echoing_provider() -> std::net::SocketAddr {
    let app = axum::Router::new().fallback(|headers: http::HeaderMap| async move {
        let key = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim_start_matches("Bearer ")
            .to_owned();
        (
            http::StatusCode::UNAUTHORIZED,
            [("content-type", "application/json")],
            format!(
                r#"{{"error":{{"message":"Incorrect API key provided: {key}. You can find your API key at the dashboard.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}}}"#
            ),
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn a_provider_key_echoed_in_an_error_appears_nowhere() {
    globals();
    const SECRET: &str = "sk-proj-TOPSECRET0123456789abcdefABCDEF";
    let addr = echoing_provider().await;
    let client = UpstreamClient::builder(format!("http://{addr}"))
        .auth(Auth::bearer(SECRET))
        .build()
        .unwrap();
    let backup = FakeProvider::new("redact-backup").always(Reply::completion("redact-backup"));
    let failover = Failover::builder()
        .target(Target::boxed("redact-primary", client))
        .target(Target::boxed("redact-backup", backup))
        .build();
    let response = failover.oneshot(chat(false, "redact-turn")).await.unwrap();
    let (run, body) = read(response).await;
    assert!(body.contains("answer from redact-backup"), "{body}");
    let records = run.attempts();
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[0].class.map(|c| c.as_str()),
        Some("auth"),
        "{records:?}"
    );

    let (turn, attempts) = spans_of("redact-turn");
    assert_eq!(attempts.len(), 2);
    let spans = format!("{turn:?} {attempts:?}");
    let events = globals().capture.events.lock().unwrap().join("\n");
    assert!(events.contains("redact-turn"), "the turn was logged");
    let metrics = format!("{:?}", metrics_so_far());
    assert!(metrics.contains("redact-primary"));
    for (what, text) in [
        ("spans", spans),
        ("logs", events),
        ("records", format!("{records:?}")),
        ("metrics", metrics),
        ("response", body),
    ] {
        // Not even the distinctive middle of the key.
        assert!(!text.contains("TOPSECRET"), "the key leaked into {what}");
    }
}

/// A whole answer's id and finish reason land on its attempt span and in
/// its record, in either dialect.
#[tokio::test(start_paused = true)]
async fn whole_answers_record_their_id_and_finish_reason() {
    use tower_llm_failover::dialect::AnthropicMessages;
    globals();
    // OpenAI chat: the first choice's finish reason.
    let provider = FakeProvider::new("whole-openai").always(Reply::status(
        200,
        r#"{"id":"chatcmpl-whole-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"length"},{"index":1,"message":{"role":"assistant","content":"ho"},"finish_reason":"stop"}]}"#,
    ));
    let failover = Failover::builder()
        .target(Target::new("whole-openai", provider))
        .build();
    let response = failover
        .oneshot(chat(false, "whole-openai-turn"))
        .await
        .unwrap();
    let (run, body) = read(response).await;
    assert!(body.contains("chatcmpl-whole-1"), "{body}");
    let record = &run.attempts()[0];
    assert_eq!(record.response_id.as_deref(), Some("chatcmpl-whole-1"));
    assert_eq!(record.finish_reason.as_deref(), Some("length"));
    let (_, attempts) = spans_of("whole-openai-turn");
    let f = &attempts[0].fields;
    assert_eq!(f["gen_ai.response.id"], "chatcmpl-whole-1");
    assert_eq!(f["gen_ai.response.finish_reasons"], "length");
    assert_eq!(f["failover.decision"], "committed");

    // Anthropic Messages: the stop reason.
    let provider = FakeProvider::new("whole-messages").always(Reply::status(
        200,
        r#"{"id":"msg_whole_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"hi"}],"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}"#,
    ));
    let failover = Failover::builder()
        .target(Target::new("whole-messages", provider))
        .dialect(AnthropicMessages)
        .build();
    let mut request = Request::post("/v1/messages")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"claude-x","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    request
        .extensions_mut()
        .insert(TurnLimits::new().start_with_turn_id("whole-messages-turn".into()));
    let response = failover.oneshot(request).await.unwrap();
    let (run, body) = read(response).await;
    assert!(body.contains("msg_whole_1"), "{body}");
    assert_eq!(
        run.attempts()[0].response_id.as_deref(),
        Some("msg_whole_1")
    );
    let (turn, attempts) = spans_of("whole-messages-turn");
    assert_eq!(turn.fields["otel.name"], "chat claude-x");
    let f = &attempts[0].fields;
    assert_eq!(f["gen_ai.response.id"], "msg_whole_1");
    assert_eq!(f["gen_ai.response.finish_reasons"], "max_tokens");
    assert_eq!(f["gen_ai.response.model"], "claude-x");
}

/// The samples a histogram took under labels including every pair of
/// `with` (taken counts a histogram's samples as `counter` counts).
fn samples(name: &str, with: &[(&str, &str)]) -> u64 {
    counter(name, with)
}

/// A stack registers the handles of a clean attempt and a first-try turn
/// once and reuses them: every turn still counts, under the same labels a
/// failure's metrics carry.
#[tokio::test(start_paused = true)]
async fn clean_turns_on_one_stack_are_each_counted() {
    globals();
    let provider = FakeProvider::new("cache-target");
    let failover = Failover::builder()
        .target(Target::new("cache-target", provider).provider("cache-provider"))
        .build();
    let first_try = [
        ("failover.outcome", "first_try"),
        ("failover.stop_reason", "none"),
    ];
    let turns_before = counter("failover.turns", &first_try);
    for (i, stream) in [false, true, false].into_iter().enumerate() {
        let response = failover
            .clone()
            .oneshot(chat(stream, &format!("cache-turn-{i}")))
            .await
            .unwrap();
        let (run, body) = read(response).await;
        assert!(body.contains("cache-target"), "{body}");
        assert_eq!(run.outcome(), Some(TurnOutcome::FirstTry));
    }
    let clean = [
        ("failover.target", "cache-target"),
        ("failover.class", "none"),
        ("failover.phase", "committed"),
        ("failover.decision", "committed"),
    ];
    assert_eq!(counter("failover.attempts", &clean), 3);
    let operation = [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "cache-provider"),
        ("failover.target", "cache-target"),
    ];
    assert_eq!(samples("gen_ai.client.operation.duration", &operation), 3);
    // A first output is timed on the stream only.
    assert_eq!(samples("gen_ai.server.time_to_first_token", &operation), 1);
    // The two whole answers report usage; the stream's was not asked for.
    let input = [
        ("failover.target", "cache-target"),
        ("gen_ai.token.type", "input"),
    ];
    let output = [
        ("failover.target", "cache-target"),
        ("gen_ai.token.type", "output"),
    ];
    assert!(samples("gen_ai.client.token.usage", &input) >= 2);
    assert_eq!(
        samples("gen_ai.client.token.usage", &input),
        samples("gen_ai.client.token.usage", &output)
    );
    // No failure was recorded under this target.
    assert_eq!(
        samples(
            "failover.bytes_flushed_before_failure",
            &[("failover.target", "cache-target")]
        ),
        0
    );
    // Other tests' turns count under the same key meanwhile: at least ours.
    assert!(counter("failover.turns", &first_try) - turns_before >= 3);
}

/// A stack that batches its metrics holds clean attempts until the batch
/// fills, until `flush_metrics`, or until it is dropped: every attempt
/// is counted once, with all its samples, and none is lost.
#[tokio::test(start_paused = true)]
async fn a_batched_stack_reports_each_batch_whole_and_what_it_holds_when_asked_or_dropped() {
    globals();
    let provider = FakeProvider::new("batch-target");
    let failover = Failover::builder()
        .target(Target::new("batch-target", provider).provider("batch-provider"))
        .batch_metrics(3)
        .build();
    let clean = [
        ("failover.target", "batch-target"),
        ("failover.class", "none"),
        ("failover.decision", "committed"),
    ];
    let operation = [("failover.target", "batch-target")];
    let first_output = ("gen_ai.server.time_to_first_token", &operation);
    let turn = |i: usize| {
        let failover = failover.clone();
        async move {
            // Every other turn streams: a first output is timed on those.
            let response = failover
                .oneshot(chat(i % 2 == 1, &format!("batch-turn-{i}")))
                .await
                .unwrap();
            let (run, body) = read(response).await;
            assert!(body.contains("batch-target"), "{body}");
            assert_eq!(run.outcome(), Some(TurnOutcome::FirstTry));
        }
    };
    turn(0).await;
    turn(1).await;
    // Held: nothing has reached the recorder.
    assert_eq!(counter("failover.attempts", &clean), 0);
    assert_eq!(samples("gen_ai.client.operation.duration", &operation), 0);
    turn(2).await;
    // The third fills the batch: all three, with their samples.
    assert_eq!(counter("failover.attempts", &clean), 3);
    assert_eq!(samples("gen_ai.client.operation.duration", &operation), 3);
    assert_eq!(samples(first_output.0, first_output.1), 1);
    turn(3).await;
    assert_eq!(counter("failover.attempts", &clean), 3);
    // Asked for: what is held goes out now.
    tower_llm_failover::observe::flush_metrics();
    assert_eq!(counter("failover.attempts", &clean), 4);
    assert_eq!(samples("gen_ai.client.operation.duration", &operation), 4);
    assert_eq!(samples(first_output.0, first_output.1), 2);
    // Asked again with nothing held: nothing counted twice.
    tower_llm_failover::observe::flush_metrics();
    assert_eq!(counter("failover.attempts", &clean), 4);
    turn(4).await;
    assert_eq!(counter("failover.attempts", &clean), 4);
    // Dropped: the stack reports what it held.
    drop(failover);
    assert_eq!(counter("failover.attempts", &clean), 5);
    assert_eq!(samples("gen_ai.client.operation.duration", &operation), 5);
}

/// Names of the histograms `describe_metrics` describes.
#[derive(Default)]
struct Described(Mutex<Vec<String>>);

impl metrics::Recorder for Described {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        key: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
        self.0.lock().unwrap().push(key.as_str().to_owned());
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[test]
fn every_histogram_described_has_ascending_boundaries_and_no_other_has_any() {
    use tower_llm_failover::observe::{HISTOGRAM_BOUNDARIES, describe_metrics};
    let described = Described::default();
    metrics::with_local_recorder(&described, describe_metrics);
    let mut described = described.0.into_inner().unwrap();
    described.sort();
    let mut bounded: Vec<String> = HISTOGRAM_BOUNDARIES
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect();
    bounded.sort();
    assert_eq!(described, bounded);
    for (name, bounds) in HISTOGRAM_BOUNDARIES {
        assert!(!bounds.is_empty(), "{name}");
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{name}: {bounds:?}");
    }
}
