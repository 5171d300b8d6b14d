//! Where the log is the lean line format and no OTLP endpoint is set, the
//! gateway's telemetry sets the library's turn-line writer: a turn's line
//! is written from its facts (`log_line::TurnLines`), not dispatched as a
//! `tracing` event, and reaches the log as the event's line would.
//!
//! Alone in its own test binary: the subscriber and the turn-line writer
//! are process-wide.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_failover::observe::{TurnLine, TurnLineWriter, set_turn_line_writer};
use tower_llm_gateway::log_writer::BatchedWriter;
use tower_llm_gateway::telemetry::{Telemetry, TelemetryConfig};
use tower_llm_testing::{FakeProvider, Reply};

/// A writer that declines every line.
struct Declines;

impl TurnLineWriter for Declines {
    fn write(&self, _: &TurnLine<'_>) -> bool {
        false
    }
}

#[tokio::test(start_paused = true)]
async fn the_line_format_writes_the_turn_line_from_its_facts() {
    let path = std::env::temp_dir().join(format!("tlf-turn-lines-{}.log", std::process::id()));
    let (writer, flush) = BatchedWriter::new(
        std::fs::File::create(&path).unwrap(),
        Duration::from_millis(1),
    )
    .unwrap();
    let _telemetry = Telemetry::install(&TelemetryConfig::default(), writer).unwrap();
    // A terminal gets tracing-subscriber's coloured format, and the event.
    let terminal = std::io::stderr().is_terminal();
    assert_eq!(
        set_turn_line_writer(Arc::new(Declines)).is_err(),
        !terminal,
        "install sets the writer exactly where the log is the line format"
    );

    let provider = FakeProvider::new("primary").always(Reply::completion("primary"));
    let failover = Failover::builder()
        .target(Target::new("primary", provider))
        .build();
    let request = Request::post("/v1/chat/completions")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let response = failover.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    // Writes what the writer thread holds.
    drop(flush);

    let log = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    if terminal {
        eprintln!(
            "SKIPPED the line's bytes: stderr is a terminal, so the log is not the line format"
        );
        return;
    }
    let turns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("tower_llm_failover::turn"))
        .collect();
    assert_eq!(turns.len(), 1, "{log}");
    let (stamp, rest) = turns[0].split_once(' ').unwrap();
    assert_eq!(stamp.len(), 27, "{log}");
    assert!(
        rest.starts_with(" INFO tower_llm_failover::turn: turn run_id="),
        "{log}"
    );
    assert!(
        rest.ends_with(" attempts=1 outcome=\"first_try\" target=primary duration_ms=0"),
        "{log}"
    );
}
