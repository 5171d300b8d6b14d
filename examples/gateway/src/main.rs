//! `tower-llm-gateway`: an OpenAI-compatible LLM gateway on axum with safe
//! failover.
//!
//! ```text
//! cargo run --release -p tower-llm-gateway                      # embedded fake providers
//! cargo run --release -p tower-llm-gateway -- --config gw.toml  # your providers
//! ```
//!
//! Without a config it starts two fake providers on loopback and routes
//! three demo models through them:
//!
//! - `demo-failover`: the primary answers `429 insufficient_quota`; the turn
//!   moves to the backup before any token, and the client never notices.
//! - `demo-cut`: the primary is cut after 5 tokens; the stream ends with a
//!   terminal chunk (`finish_reason: "error"`) and `[DONE]`, nothing spliced.
//! - anything else: primary, then backup, with the client's model.
//!
//! The same fakes speak Anthropic Messages too, behind `/v1/messages`:
//! `claude-demo-failover` (primary 529 `overloaded_error`, backup answers),
//! `claude-demo-cut` (cut after 5 deltas: `event: error`) and `claude-*`.
//! Across dialects: `demo-mixed` (a chat client; the chat primary answers
//! 429, a Messages backup answers, translated) and `claude-demo-mixed` (a
//! Messages client; the Messages primary answers 529, a chat backup
//! answers). And the OpenAI Responses API, behind `/v1/responses`:
//! `responses-demo-failover` (a Responses primary answers 429, the chat
//! backup answers, translated) and `responses-demo-cut` (cut after 5
//! deltas: `response.failed`, then an `error` event).
//!
//! Serves `POST /v1/chat/completions`, `POST /v1/messages` and
//! `POST /v1/responses` (every configured route on all three, a target of
//! another dialect translated),
//! `GET /v1/models`, `GET /healthz`,
//! `GET /v1/health/targets` (every health key: state, streak, last class)
//! and `GET /metrics` (Prometheus text). `[telemetry]` picks the log format
//! (`log_format = "json"`: one JSON line per event) and an
//! `otlp_endpoint` to export spans and metrics to over OTLP/HTTP.
//! SIGINT/SIGTERM stop accepting and let running streams finish within
//! `failover.shutdown_grace_ms`.

use std::time::Duration;

use tower_llm_gateway::app::{self, Config, Gateway};
use tower_llm_gateway::{messages, telemetry};
use tower_llm_testing::upstream::FakeUpstream;

fn usage() -> ! {
    eprintln!("usage: tower-llm-gateway [--config PATH] [--listen ADDR]");
    std::process::exit(2);
}

/// mimalloc: a gateway allocates many small, short-lived blocks per
/// request across worker threads, where glibc's malloc is slow.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The main thread's runtime accepts connections and hands each to a
/// shard ([`app::serve_sharded`]), runs the signal handlers, the embedded
/// fakes and the shared stores' background work; requests are served on
/// the shards' threads.
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (mut config_path, mut listen) = (None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" => config_path = Some(args.next().unwrap_or_else(|| usage())),
            "--listen" => listen = Some(args.next().unwrap_or_else(|| usage())),
            _ => usage(),
        }
    }

    // Embedded fakes live as long as the gateway.
    let mut fakes = Vec::new();
    let mut config = match config_path {
        Some(path) => {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                eprintln!("cannot read {path}: {e}");
                std::process::exit(1)
            });
            Config::from_toml(&text).unwrap_or_else(|e| {
                eprintln!("{path}: {e}");
                std::process::exit(1)
            })
        }
        None => {
            let primary = FakeUpstream::builder("primary")
                .tokens(12)
                .pace(Duration::from_millis(20))
                .start()
                .await
                .unwrap_or_else(|e| {
                    eprintln!("cannot start the fake primary: {e}");
                    std::process::exit(1)
                });
            let backup = FakeUpstream::builder("backup")
                .tokens(12)
                .pace(Duration::from_millis(20))
                .start()
                .await
                .unwrap_or_else(|e| {
                    eprintln!("cannot start the fake backup: {e}");
                    std::process::exit(1)
                });
            let config = demo_config(&primary.base_url(), &backup.base_url());
            fakes.push(primary);
            fakes.push(backup);
            config
        }
    };
    if let Some(listen) = listen {
        config.listen = listen;
    }
    // Log lines are formatted on the request's thread and appended to a
    // buffer that a thread of its own writes out, one write per batch
    // (what gathered in 20 ms): a request never waits on stderr, and the
    // thread is not woken per line. Never lossy. The guard writes what is
    // left at exit.
    let (log_writer, _log_flush) = tower_llm_gateway::log_writer::BatchedWriter::new(
        std::io::stderr(),
        Duration::from_millis(20),
    )
    .unwrap_or_else(|e| {
        eprintln!("cannot start the log writer: {e}");
        std::process::exit(1)
    });
    // Logs, `GET /metrics` and OTLP export, as `[telemetry]` says.
    let telemetry =
        telemetry::Telemetry::install(&config.telemetry, log_writer).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        });
    let gateway = Gateway::from_config(&config)
        .unwrap_or_else(|e| {
            eprintln!("bad config: {e}");
            std::process::exit(1)
        })
        .with_prometheus(telemetry.prometheus.clone());
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .unwrap_or_else(|e| {
            eprintln!("cannot listen on {}: {e}", config.listen);
            std::process::exit(1)
        });
    let running = app::serve_sharded(gateway, listener).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let addr = running.addr;
    println!("gateway ready on http://{addr}");
    if let [primary, backup, ..] = fakes.as_slice() {
        print_demo(addr, primary, backup);
    }

    app::shutdown_signal().await;
    let grace = Duration::from_millis(config.failover.shutdown_grace_ms);
    println!(
        "shutting down: no new connections; running streams have {} ms",
        grace.as_millis()
    );
    if running.shutdown(grace).await {
        println!("all streams finished");
    } else {
        println!("grace period over; remaining streams closed");
    }
    // The OTLP exporters block while they flush.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
}

/// The embedded demo: two fake providers and three routes.
fn demo_config(primary: &str, backup: &str) -> Config {
    let text = format!(
        r#"
listen = "127.0.0.1:8080"

[budget]
deadline_ms = 30000
max_attempts = 4
first_token_timeout_ms = 5000
idle_timeout_ms = 5000

[[providers]]
name = "primary"
base_url = "{primary}"

[[providers]]
name = "backup"
base_url = "{backup}"

# The primary again, behind a credential whose quota is spent: its failures
# cool that credential (account scope), never the primary's other routes.
[[providers]]
name = "primary-billing"
base_url = "{primary}"

[[routes]]
model = "demo-failover"
targets = [
  {{ provider = "primary-billing", model = "primary-model#fault:status=429;error=quota" }},
  {{ provider = "backup", model = "backup-model" }},
]

[[routes]]
model = "demo-cut"
targets = [
  {{ provider = "primary", model = "primary-model#fault:reset_after=5" }},
  {{ provider = "backup", model = "backup-model" }},
]

{messages}
[[routes]]
model = "*"
targets = [{{ provider = "primary" }}, {{ provider = "backup" }}]
"#,
        messages = messages::demo_routes(primary, backup)
    );
    match Config::from_toml(&text) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("demo config: {e}");
            std::process::exit(1)
        }
    }
}

/// What the demo's fake providers are and a curl for each demo route.
fn print_demo(addr: std::net::SocketAddr, primary: &FakeUpstream, backup: &FakeUpstream) {
    println!(
        "fake providers: primary {} and backup {}",
        primary.base_url(),
        backup.base_url()
    );
    println!("a failover the client never sees (primary: 429 insufficient_quota):");
    println!(
        "  curl -sN -i http://{addr}/v1/chat/completions -H 'content-type: application/json' \
         -d '{{\"model\":\"demo-failover\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    );
    println!("the same in Anthropic Messages (primary: 529 overloaded_error):");
    println!(
        "  curl -sN -i http://{addr}/v1/messages -H 'content-type: application/json' \
         -d '{{\"model\":\"claude-demo-failover\",\"max_tokens\":64,\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    );
    println!("across dialects: a chat client served by a Messages backup, and back:");
    println!(
        "  curl -sN -i http://{addr}/v1/chat/completions -H 'content-type: application/json' \
         -d '{{\"model\":\"demo-mixed\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    );
    println!(
        "  curl -sN -i http://{addr}/v1/messages -H 'content-type: application/json' \
         -d '{{\"model\":\"claude-demo-mixed\",\"max_tokens\":64,\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    );
    println!("the Responses API (primary: 429; the chat backup answers, translated):");
    println!(
        "  curl -sN -i http://{addr}/v1/responses -H 'content-type: application/json' \
         -d '{{\"model\":\"responses-demo-failover\",\"stream\":true,\"input\":\"hi\"}}'"
    );
}
