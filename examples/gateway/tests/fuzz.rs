//! Fuzzing on the stable toolchain (proptest with arbitrary bytes and
//! grammar-shaped inputs): the SSE scanner and commit machine, the JSON
//! skimmer behind the OpenAI dialect, the error-body classifier, the
//! request-requirements reader (and the splice it feeds) and the gateway's
//! TOML config. No input may panic, and memory stays bounded by the input.
//!
//! Bounded in CI (48 cases per property, about 20 s in a debug build); longer on demand:
//!
//! ```text
//! PROPTEST_CASES=100000 cargo test --release -p tower-llm-gateway --test fuzz
//! ```
//!
//! Findings become named regression tests at the end of this file (none
//! so far; the edge cases there were seeded by hand).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use proptest::prelude::*;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::dialect::{ChatMemo, Dialect, ErrorSource, OpenAiChat};
use tower_llm_failover::sse::{SseItem, SseScanner};
use tower_llm_failover::stream::StreamPolicy;
use tower_llm_failover::stream::StreamStateLayer;
use tower_llm_failover::{Phase, classify::Classifier};
use tower_llm_gateway::app;
use tower_llm_testing::{Step, sse_response};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

/// Bytes biased toward what the parsers care about.
fn wire_bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            3 => any::<u8>(),
            1 => Just(b'\n'),
            1 => Just(b'\r'),
            1 => Just(b':'),
            1 => Just(b'"'),
            1 => Just(b'{'),
            1 => Just(b'}'),
            1 => Just(b'\\'),
            1 => Just(0xE2u8),
            1 => Just(0x80u8),
        ],
        0..max,
    )
}

/// JSON-looking text: fragments of the shapes the dialect reads, glued in
/// any order (many invalid, some valid).
fn json_like() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just(
            r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}"#.to_owned()
        ),
        Just(r#"{"error":{"message":"m","type":"t","code":"c"}}"#.to_owned()),
        Just(
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#.to_owned()
        ),
        Just(r#""usage":{"prompt_tokens":1,"completion_tokens":2}"#.to_owned()),
        Just(r#""model":"#.to_owned()),
        Just(r#""\ud800""#.to_owned()),
        Just(r#""\u00e9\n""#.to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just(",".to_owned()),
        Just(":".to_owned()),
        Just("1e999".to_owned()),
        Just("-0".to_owned()),
        Just("null".to_owned()),
        "[a-z\"\\\\{}\\[\\]:, 0-9.é]{0,12}",
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

fn split(data: &[u8], points: &[usize]) -> Vec<Bytes> {
    let mut points: Vec<usize> = points.iter().map(|p| p % (data.len() + 1)).collect();
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    let mut at = 0;
    for p in points.into_iter().chain([data.len()]) {
        if p > at {
            out.push(Bytes::copy_from_slice(&data[at..p]));
            at = p;
        }
    }
    out
}

/// Runs `frames` as an upstream stream through the commit machine and
/// returns what the client receives.
fn through_commit_machine(frames: Vec<Bytes>) -> Vec<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let response = std::sync::Mutex::new(Some(sse_response(
            frames.into_iter().map(Step::Data).collect::<Vec<_>>(),
        )));
        let upstream = tower::service_fn(move |_req: Request<()>| {
            let response = response.lock().unwrap().take().unwrap();
            async move { Ok::<_, Infallible>(response) }
        });
        let response = ServiceBuilder::new()
            .layer(StreamStateLayer::new().policy(StreamPolicy {
                max_line_bytes: 4096,
                max_event_bytes: 8192,
                ..StreamPolicy::new()
            }))
            .service(upstream)
            .oneshot(Request::new(()))
            .await
            .unwrap();
        let mut body = response.into_body();
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        out.extend_from_slice(&data);
                    }
                }
                Err(_) => break,
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// The scanner on arbitrary bytes, split anywhere, with small caps:
    /// no panic, and what it holds never exceeds the caps.
    #[test]
    fn sse_scanner_takes_any_bytes_within_its_caps(
        wire in wire_bytes(2000),
        points in proptest::collection::vec(0usize..2000, 0..16),
    ) {
        let mut scanner = SseScanner::new().max_line_bytes(64).max_event_bytes(128);
        for chunk in split(&wire, &points) {
            scanner.feed(&chunk, |item| {
                if let SseItem::Event(event) = item {
                    assert!(event.data().len() <= 128 + 1, "event over its cap");
                }
            });
        }
        let _ = scanner.finish();
    }

    /// The commit machine (scanner + dialect + terminal events) on any
    /// upstream bytes: no panic, and the client's bytes are bounded by the
    /// upstream's plus one terminal event.
    #[test]
    fn commit_machine_takes_any_upstream_bytes(
        wire in wire_bytes(1500),
        points in proptest::collection::vec(0usize..1500, 0..12),
    ) {
        let out = through_commit_machine(split(&wire, &points));
        prop_assert!(out.len() <= wire.len() + 2048, "{} > {}", out.len(), wire.len());
    }

    /// Chunk-shaped events with JSON-like data: the dialect's skimmer reads
    /// every event without panicking, and a stream of them ends either as
    /// sent or with a terminal event that parses.
    #[test]
    fn skimmer_reads_any_event_data(data in json_like()) {
        let mut wire = Vec::new();
        wire.extend_from_slice(b"data: ");
        wire.extend_from_slice(data.replace(['\n', '\r'], " ").as_bytes());
        wire.extend_from_slice(b"\n\n");
        let wire = Bytes::from(wire);
        let mut scanner = SseScanner::new();
        scanner.feed(&wire, |item| {
            if let SseItem::Event(event) = item {
                let _ = OpenAiChat.inspect(&event, &mut ChatMemo::default());
                let _ = OpenAiChat.error_facts(ErrorSource::Event(&event));
            }
        });
        let out = through_commit_machine(vec![wire]);
        let text = String::from_utf8_lossy(&out);
        for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if line != "[DONE]" && line.contains("\"phase\"") {
                serde_json::from_str::<serde_json::Value>(line).expect("terminal event is JSON");
            }
        }
    }

    /// Whole answers and error bodies: check_body, body_error_facts and
    /// the classifier on arbitrary bytes; messages stay within the cap.
    #[test]
    fn error_body_classifier_takes_any_body(
        body in prop_oneof![wire_bytes(3000), json_like().prop_map(String::into_bytes)],
        status in 100u16..600,
    ) {
        let _ = OpenAiChat.check_answer(&body);
        let _ = OpenAiChat.error_facts(ErrorSource::Body(&body));
        let classifier = Classifier::default();
        let status = StatusCode::from_u16(status).unwrap();
        let head = classifier.classify_head(Some("p"), status, &HeaderMap::new(), &body);
        prop_assert!(head.message.chars().count() <= 1024, "{}", head.message.len());
        let in_band = classifier.classify_in_band(Some("p"), Some("error"), &body, Phase::Committed);
        prop_assert!(in_band.message.chars().count() <= 1024);
        let _ = classifier.validate_body(&OpenAiChat, Some("p"), &body);
    }

    /// The request reader on arbitrary bytes never panics; on JSON-shaped
    /// requests, whatever it accepts splices into JSON that parses, with
    /// the target's model in it.
    #[test]
    fn request_reader_takes_any_body_and_splices_valid_json(
        raw in wire_bytes(2000),
        extra in json_like(),
        model in "[a-zA-Z0-9 ./\"\\\\é-]{0,16}",
        stream in any::<bool>(),
    ) {
        let _ = OpenAiChat.read_request(Bytes::from(raw));
        let body = format!(
            r#"{{"model":"m","stream":{stream},"messages":[{{"role":"user","content":"hi"}}],"x":{}}}"#,
            if serde_json::from_str::<serde_json::Value>(&extra).is_ok() { extra.as_str() } else { "null" }
        );
        if let Ok((requirements, request)) = OpenAiChat.read_request(Bytes::from(body)) {
            prop_assert_eq!(requirements.model.as_str(), "m");
            let spliced = OpenAiChat.upstream_body(&request, &model);
            let json: serde_json::Value = serde_json::from_slice(&spliced)
                .map_err(|e| TestCaseError::fail(format!("splice is not JSON: {e}")))?;
            prop_assert_eq!(json["model"].as_str(), Some(model.as_str()));
        }
    }

    /// The gateway's TOML config: arbitrary text and key=value soup in the
    /// known sections never panic the parser or the gateway's build.
    #[test]
    fn gateway_config_takes_any_toml(
        text in prop_oneof![
            "[ -~\n]{0,400}",
            proptest::collection::vec(
                (
                    prop_oneof![
                        Just("[budget]"), Just("[failover]"), Just("[server]"),
                        Just("[[providers]]"), Just("[[routes]]"), Just(""),
                    ],
                    prop_oneof![
                        Just("deadline_ms"), Just("max_attempts"), Just("strategy"),
                        Just("terminal_mode"), Just("max_connections"), Just("max_in_flight"),
                        Just("header_read_timeout_ms"), Just("name"), Just("base_url"),
                        Just("model"), Just("targets"), Just("retry_percent"),
                        Just("commit_output_events"), Just("body_min_bytes_per_second"),
                    ],
                    prop_oneof![
                        Just("0".to_owned()), Just("-1".to_owned()), Just("18446744073709551615".to_owned()),
                        Just("1e308".to_owned()), Just("\"p\"".to_owned()), Just("\"http://127.0.0.1:1/v1\"".to_owned()),
                        Just("[{ provider = \"p\" }]".to_owned()), Just("true".to_owned()), Just("nan".to_owned()),
                        "\"[ -~]{0,12}\"",
                    ],
                ),
                0..16,
            )
            .prop_map(|lines| lines
                .into_iter()
                .map(|(section, key, value)| format!("{section}\n{key} = {value}\n"))
                .collect::<String>()),
        ],
    ) {
        if let Ok(config) = app::Config::from_toml(&text) {
            // Building needs a runtime only for nothing; it must not panic.
            let _ = app::Gateway::from_config(&config);
        }
    }
}

// ------------------------------------------ regressions and seeded edges

#[test]
fn negative_or_nan_retry_percent_is_a_config_error_not_a_panic() {
    for value in ["-1.0", "nan", "inf", "1e308"] {
        let text = format!(
            "[budget]\nretry_percent = {value}\n[[providers]]\nname = \"p\"\nbase_url = \"http://127.0.0.1:1/v1\"\n"
        );
        if let Ok(config) = app::Config::from_toml(&text) {
            let _ = app::Gateway::from_config(&config);
        }
    }
}
