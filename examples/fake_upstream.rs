//! A fake provider on 127.0.0.1 that speaks OpenAI chat completions and
//! Anthropic Messages, for demos and manual tests of a gateway.
//!
//! ```text
//! cargo run --example fake_upstream --features testing -- \
//!     --port 9101 --name primary --tokens 8 --pace-ms 20 [--fault SPEC] [--api-key KEY]
//! ```
//!
//! It prints one ready line with its base URL and serves until Ctrl-C:
//! `POST /v1/chat/completions` and `POST /v1/messages` (streamed or not,
//! with the same faults; Messages checks `--api-key` as `x-api-key`),
//! `GET /v1/models`, and the
//! control endpoints `POST /control/fault`, `GET /control/attempts`,
//! `POST /control/reset`. Every token reads `"{name}-tok{i} "`.
//!
//! Faults are picked per request by the model name, or armed over HTTP:
//!
//! ```text
//! curl -N localhost:9101/v1/chat/completions -H 'content-type: application/json' \
//!   -d '{"model":"fault:reset_after=3","stream":true,"messages":[{"role":"user","content":"hi"}]}'
//! curl -N localhost:9101/v1/messages -H 'content-type: application/json' \
//!   -d '{"model":"fault:error_after=0","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
//! curl localhost:9101/control/fault -d '{"fault":"status=429;retry_after=2","times":2}'
//! ```
//!
//! `--fault SPEC` arms a fault for every request from the start (a flaky
//! provider). The spec syntax is documented on
//! `tower_llm_testing::upstream`.

use std::time::Duration;

use tower_llm_testing::upstream::{DEFAULT_TOKENS, FakeUpstream, Fault};

const USAGE: &str = "usage: fake_upstream [--port N] [--name NAME] [--tokens N] [--pace-ms MS] [--fault SPEC] [--api-key KEY]";

struct Args {
    port: u16,
    name: String,
    tokens: usize,
    pace_ms: u64,
    fault: Option<Fault>,
    api_key: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 9101,
        name: "fake".to_owned(),
        tokens: DEFAULT_TOKENS,
        pace_ms: 0,
        fault: None,
        api_key: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_owned());
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let bad = |what: &str| format!("{flag} {value}: {what}\n{USAGE}");
        match flag.as_str() {
            "--port" => args.port = value.parse().map_err(|_| bad("not a port"))?,
            "--name" => args.name = value,
            "--tokens" => args.tokens = value.parse().map_err(|_| bad("not a number"))?,
            "--pace-ms" => args.pace_ms = value.parse().map_err(|_| bad("not a number"))?,
            "--fault" => args.fault = Some(value.parse().map_err(|e: String| bad(&e))?),
            "--api-key" => args.api_key = Some(value),
            _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let mut builder = FakeUpstream::builder(args.name)
        .port(args.port)
        .tokens(args.tokens)
        .pace(Duration::from_millis(args.pace_ms));
    if let Some(fault) = args.fault {
        builder = builder.fault(fault);
    }
    if let Some(key) = args.api_key {
        builder = builder.api_key(key);
    }
    let fake = match builder.start().await {
        Ok(fake) => fake,
        Err(e) => {
            eprintln!("cannot bind 127.0.0.1:{}: {e}", args.port);
            std::process::exit(1);
        }
    };
    println!(
        "fake upstream {:?} ready: base_url {} ({} tokens, {} ms pace)",
        fake.name(),
        fake.base_url(),
        args.tokens,
        args.pace_ms
    );
    if tokio::signal::ctrl_c().await.is_err() {
        eprintln!("cannot listen for Ctrl-C; stopping");
    }
    println!(
        "fake upstream {:?} stopping after {} attempts",
        fake.name(),
        fake.attempts()
    );
}
