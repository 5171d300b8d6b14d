//! Graceful shutdown of the gateway: by a real SIGTERM to a
//! separate process running the gateway's code (this test binary re-run as
//! a child, with the gateway's own signal handler), and a stream still
//! running when the grace period ends, which must end with the terminal
//! chunk (class `shutdown`) and `[DONE]`, not be cut mid-body.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;

/// Set in the child: the gateway config it serves.
const CHILD_CONFIG: &str = "TOWER_LLM_FAILOVER_SHUTDOWN_CHILD_CONFIG";

fn config(upstream: &FakeUpstream, grace_ms: u64) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"

[budget]
deadline_ms = 60000
first_token_timeout_ms = 5000
idle_timeout_ms = 5000

[failover]
shutdown_grace_ms = {grace_ms}

[server]
shutdown_drain_ms = 5000

[[providers]]
name = "primary"
base_url = "{}"
"#,
        upstream.base_url()
    )
}

const CHAT: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// Opens a streamed chat request and returns the socket after the head.
async fn open_stream(addr: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    tcp
}

/// Reads the rest of the response until the server closes (bounded).
async fn read_all(tcp: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut out))
        .await
        .expect("the stream ends")
        .unwrap();
    String::from_utf8(out).unwrap()
}

/// The SSE events of a chunked HTTP/1.1 answer (chunk-size lines dropped).
fn data_lines(raw: &str) -> Vec<String> {
    raw.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// Kills the child if the test fails before it exits.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

/// The child: the gateway's serving path with its real signal handler.
#[tokio::test]
async fn child_gateway() {
    let Ok(text) = std::env::var(CHILD_CONFIG) else {
        return; // only meaningful as the child of the signal test
    };
    let config = app::Config::from_toml(&text).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // Served as the binary serves: thread per core.
    let running = app::serve_sharded(gateway, listener).unwrap();
    println!("ready {}", running.addr);
    app::shutdown_signal().await;
    println!("shutting down");
    let grace = Duration::from_millis(config.failover.shutdown_grace_ms);
    if running.shutdown(grace).await {
        println!("all streams finished");
    } else {
        println!("grace period over");
    }
}

#[tokio::test]
async fn sigterm_lets_a_running_stream_finish_and_refuses_new_connections() {
    // 20 tokens, 100 ms apart: the stream runs about 2 s.
    let upstream = FakeUpstream::builder("primary")
        .tokens(20)
        .pace(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child_gateway",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_CONFIG, config(&upstream, 20_000))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _guard = KillOnDrop(child.id());
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let next_line = async |lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
                           prefix: &str| {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.recv())
                .await
                .expect("the child prints in time")
                .expect("the child is running");
            // libtest may print the test's name on the same line first.
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].trim().to_owned();
            }
        }
    };
    let addr = next_line(&mut lines, "ready ").await;

    let mut stream = open_stream(&addr).await;
    // The first content token has arrived: the stream is running.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("primary-tok0") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("tokens arrive")
            .unwrap();
        assert!(n > 0, "the stream runs");
        seen.extend_from_slice(&buf[..n]);
    }

    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    next_line(&mut lines, "shutting down").await;

    // New connections are refused while the stream still runs.
    let mut refused = false;
    for _ in 0..200 {
        if TcpStream::connect(&addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "new connections are refused after SIGTERM");

    let rest = read_all(&mut stream).await;
    seen.extend_from_slice(rest.as_bytes());
    let raw = String::from_utf8(seen).unwrap();
    let data = data_lines(&raw);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{raw}");
    assert_eq!(
        raw.matches("primary-tok").count(),
        20,
        "the whole answer: {raw}"
    );
    assert!(!raw.contains("\"error\""), "no terminal error: {raw}");
    for line in &data[..data.len() - 1] {
        serde_json::from_str::<serde_json::Value>(line).expect("every data line is JSON");
    }
    assert_eq!(next_line(&mut lines, "all").await, "streams finished");
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success());
}

#[tokio::test]
async fn a_stream_still_running_when_the_grace_period_ends_gets_the_terminal_chunk() {
    stream_outlives_the_grace_period(false).await;
}

#[tokio::test]
async fn a_stream_on_a_shard_still_running_when_the_grace_period_ends_gets_the_terminal_chunk() {
    stream_outlives_the_grace_period(true).await;
}

/// A stream far longer than the grace period, on the caller's runtime or
/// on a shard (`app::serve_sharded`), ends with the terminal chunk.
async fn stream_outlives_the_grace_period(sharded: bool) {
    // 200 tokens, 50 ms apart: far longer than the grace period.
    let upstream = FakeUpstream::builder("primary")
        .tokens(200)
        .pace(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let config = app::Config::from_toml(&config(&upstream, 300)).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = if sharded {
        app::serve_sharded(gateway, listener).unwrap()
    } else {
        app::serve(gateway, listener)
    };
    let addr = running.addr.to_string();
    let mut stream = open_stream(&addr).await;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("primary-tok0") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    let shutdown = tokio::spawn(running.shutdown(Duration::from_millis(300)));
    let rest = read_all(&mut stream).await;
    seen.extend_from_slice(rest.as_bytes());
    assert!(
        !shutdown.await.unwrap(),
        "the stream outlived the grace period"
    );

    let raw = String::from_utf8(seen).unwrap();
    let data = data_lines(&raw);
    assert!(data.len() >= 3, "{raw}");
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{raw}");
    let terminal: serde_json::Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(
        terminal["choices"][0]["finish_reason"], "error",
        "{terminal}"
    );
    assert_eq!(terminal["error"]["code"], "shutdown", "{terminal}");
    assert_eq!(terminal["error"]["phase"], "committed", "{terminal}");
    // Cut short: fewer than all tokens, every data line JSON, and the
    // chunked body closed properly (the final zero-size chunk).
    assert!(raw.matches("primary-tok").count() < 200);
    for line in &data[..data.len() - 1] {
        serde_json::from_str::<serde_json::Value>(line).expect("every data line is JSON");
    }
    assert!(raw.ends_with("0\r\n\r\n"), "the body ends cleanly: {raw:?}");
}
