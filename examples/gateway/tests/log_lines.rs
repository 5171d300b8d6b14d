//! The gateway binary's text log, as `main` sets it up (its writer
//! thread, the default filter with `RUST_LOG` unset), read from the
//! process's stderr: one line per turn and one per attempt that went
//! wrong, each with its run id; no span context before them unless
//! `[telemetry] log_span_context = true`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/process.rs"]
mod process;

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use process::{gateway_binary, spawn_gateway};
use tower_llm_testing::upstream::{FakeUpstream, Fault};

/// The log lines of one turn through a gateway process run with
/// `telemetry` as its `[telemetry]` table: a 500 from the primary, the
/// backup answering. Waits for the turn's line (the writer thread writes
/// after the answer).
async fn lines_of_one_turn(telemetry: &str) -> Option<Vec<String>> {
    let binary = gateway_binary()?;
    let primary = FakeUpstream::builder("primary").start().await.unwrap();
    let backup = FakeUpstream::builder("backup").start().await.unwrap();
    primary.set_fault("status=500".parse::<Fault>().unwrap());
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let scratch = std::env::temp_dir().join(format!("tlf-log-lines-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let (config, stderr) = (scratch.join("gateway.toml"), scratch.join("stderr.log"));
    std::fs::write(
        &config,
        format!(
            "[failover]\nmax_retries_per_target = 0\n\n[telemetry]\n{telemetry}\n\n\
             [[providers]]\nname = \"primary\"\nbase_url = \"{}\"\n\n\
             [[providers]]\nname = \"backup\"\nbase_url = \"{}\"\n",
            primary.base_url(),
            backup.base_url()
        ),
    )
    .unwrap();
    let gateway = spawn_gateway(
        &binary,
        &config,
        &[],
        Stdio::from(std::fs::File::create(&stderr).unwrap()),
    );
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{}/v1/chat/completions", gateway.addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let run_id = response.headers()["x-failover-run-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("backup"),
        "the backup answered"
    );
    let ours = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains(&format!("run_id={run_id}")))
            .map(str::to_owned)
            .collect()
    };
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&stderr).unwrap_or_default();
        if ours(&text)
            .iter()
            .any(|l| l.contains("tower_llm_failover::turn"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(gateway);
    let _ = std::fs::remove_dir_all(&scratch);
    Some(ours(&text))
}

#[tokio::test]
async fn default_lines_carry_their_run_id_and_no_span_context() {
    let Some(ours) = lines_of_one_turn("").await else {
        return;
    };
    // The failed attempt (INFO), and the turn; the clean attempt is DEBUG.
    assert_eq!(ours.len(), 2, "{ours:#?}");
    assert!(
        ours.iter().any(
            |l| l.contains("tower_llm_failover::attempt") && l.contains("decision=\"reroute\"")
        ),
        "{ours:#?}"
    );
    assert!(
        ours.iter()
            .any(|l| l.contains("tower_llm_failover::turn") && l.contains("outcome=\"after_hop\"")),
        "{ours:#?}"
    );
    for line in &ours {
        assert!(
            !line.contains("failover.turn{") && !line.contains("failover.attempt{"),
            "no span context: {line}"
        );
    }
}

#[tokio::test]
async fn span_context_is_printed_when_asked_for() {
    let Some(ours) = lines_of_one_turn("log_span_context = true").await else {
        return;
    };
    let attempt = ours
        .iter()
        .find(|l| l.contains("tower_llm_failover::attempt"))
        .unwrap_or_else(|| panic!("{ours:#?}"));
    // The attempt's line is written inside the turn's span, whose fields
    // come first.
    let (context, _) = attempt.split_once(": tower_llm_failover::attempt").unwrap();
    assert!(context.contains("failover.turn{"), "{attempt}");
    assert!(context.contains("failover.run_id="), "{attempt}");
}
