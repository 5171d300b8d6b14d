//! Soak: fake upstreams inject random faults at random byte offsets while
//! concurrent streaming and non-streaming clients drive the whole gateway
//! example over loopback. From the client's bytes alone, each response must
//! be exactly one of:
//!
//! - complete, from one upstream;
//! - one upstream's tokens, then the terminal chunk and `[DONE]`;
//! - a clean error before any output.
//!
//! Every `data:` line must be JSON, and no upstream may see more attempts
//! for one request than the budgets allow.
//!
//! Faults: status before body, in-band error, reset, stall, malformed
//! chunk, missing `[DONE]`, slow first token, clean EOF. Cut offsets are
//! uniform, inside a UTF-8 sequence (every token carries `é漢🙂`) or exactly
//! at the commit point (the end of the first content event).
//!
//! CI runs until 5,000 faults (16 clients). On demand:
//!
//! ```text
//! SOAK_FAULTS=100000 SOAK_CLIENTS=64 cargo test --release --all-features --test soak -- --nocapture
//! ```
//!
//! It prints faults by kind, outcomes, splices (must be 0), hung requests
//! (must be 0), RSS and open file descriptors before and after.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

#[path = "../examples/gateway/app.rs"]
mod app;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tower_llm_failover::testing::{ScriptedBody, Step};

const TOKENS: usize = 8;
const UPSTREAMS: [&str; 3] = ["alpha", "beta", "gamma"];
const MAX_ATTEMPTS: usize = 4;
const MAX_RETRIES_PER_TARGET: usize = 1;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    Status,
    InBandError,
    Reset,
    Stall,
    Malformed,
    MissingDone,
    SlowFirstToken,
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Offset {
    Uniform,
    InsideUtf8,
    CommitPoint,
}

fn token(name: &str, i: usize) -> String {
    format!("{name}:{i}:é漢🙂|")
}

fn chunk(name: &str, delta: Value, finish: Option<&str>) -> Vec<u8> {
    let event = json!({
        "id": format!("chatcmpl-{name}"),
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {event}\n\n").into_bytes()
}

/// A whole stream, and the offset just after its first content event.
fn full_stream(name: &str, usage: bool) -> (Vec<u8>, usize) {
    let mut out = chunk(name, json!({"role": "assistant", "content": ""}), None);
    let mut commit = 0;
    for i in 0..TOKENS {
        out.extend(chunk(name, json!({"content": token(name, i)}), None));
        if i == 0 {
            commit = out.len();
        }
    }
    out.extend(chunk(name, json!({}), Some("stop")));
    if usage {
        let event = json!({"id": format!("chatcmpl-{name}"), "object": "chat.completion.chunk",
            "created": 1, "model": "m", "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": TOKENS + 3}});
        out.extend(format!("data: {event}\n\n").into_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    (out, commit)
}

fn full_answer(name: &str) -> Vec<u8> {
    let content: String = (0..TOKENS).map(|i| token(name, i)).collect();
    json!({
        "id": format!("chatcmpl-{name}"), "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": TOKENS + 3},
    })
    .to_string()
    .into_bytes()
}

/// The steps that play `bytes[..cut]` in a few random frames.
fn frames(rng: &mut fastrand::Rng, bytes: &[u8]) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let n = rng.usize(1..=(bytes.len() - at).min(700));
        steps.push(Step::Data(Bytes::copy_from_slice(&bytes[at..at + n])));
        at += n;
    }
    steps
}

fn pick_offset(rng: &mut fastrand::Rng, bytes: &[u8], commit: usize) -> (usize, Offset) {
    match rng.u8(0..3) {
        0 => (rng.usize(0..bytes.len()), Offset::Uniform),
        1 => {
            // A UTF-8 continuation byte: the cut splits a character.
            let inside: Vec<usize> = bytes
                .iter()
                .enumerate()
                .filter(|(_, b)| (**b & 0xC0) == 0x80)
                .map(|(i, _)| i)
                .collect();
            if inside.is_empty() {
                (rng.usize(0..bytes.len()), Offset::Uniform)
            } else {
                (inside[rng.usize(0..inside.len())], Offset::InsideUtf8)
            }
        }
        _ => (commit.min(bytes.len()), Offset::CommitPoint),
    }
}

#[derive(Default)]
struct Upstreams {
    /// (request id, upstream) → attempts.
    attempts: Mutex<HashMap<(String, &'static str), usize>>,
    faults: Mutex<HashMap<(Fault, Option<Offset>), u64>>,
    total_faults: AtomicU64,
}

fn error_json(kind: &str) -> Bytes {
    Bytes::from(json!({"error": {"message": "injected", "type": kind, "code": kind}}).to_string())
}

/// One upstream answer, with a random fault (or none).
fn answer(
    name: &'static str,
    stream: bool,
    usage: bool,
    rng: &mut fastrand::Rng,
    stats: &Upstreams,
) -> Response<ScriptedBody> {
    let fault = match rng.u8(0..100) {
        0..30 => None,
        30..40 => Some(Fault::Status),
        40..50 => Some(Fault::InBandError),
        50..62 => Some(Fault::Reset),
        62..66 => Some(Fault::Stall),
        66..76 => Some(Fault::Malformed),
        76..84 => Some(Fault::MissingDone),
        84..90 => Some(Fault::SlowFirstToken),
        _ => Some(Fault::Eof),
    };
    let content_type = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let (body, commit) = if stream {
        full_stream(name, usage)
    } else {
        let body = full_answer(name);
        let half = body.len() / 2;
        (body, half)
    };
    let mut offset_kind = None;
    let mut status = StatusCode::OK;
    let steps: Vec<Step> = match fault {
        None => frames(rng, &body),
        Some(Fault::Status) => {
            status = [429u16, 500, 502, 503][rng.usize(0..4)].try_into().unwrap();
            vec![Step::Data(error_json("server_error"))]
        }
        Some(Fault::InBandError) if stream => {
            // After 0..TOKENS content events (an event boundary).
            let mut prefix = chunk(name, json!({"role": "assistant", "content": ""}), None);
            let n = rng.usize(0..TOKENS);
            for i in 0..n {
                prefix.extend(chunk(name, json!({"content": token(name, i)}), None));
            }
            prefix.extend(
                format!(
                    "data: {}\n\n",
                    json!({"error": {"message": "injected", "type": "server_error", "code": null}})
                )
                .into_bytes(),
            );
            frames(rng, &prefix)
        }
        Some(Fault::InBandError) => vec![Step::Data(error_json("server_error"))],
        Some(kind @ (Fault::Reset | Fault::Stall | Fault::Eof)) => {
            let (cut, offset) = pick_offset(rng, &body, commit);
            offset_kind = Some(offset);
            let mut steps = frames(rng, &body[..cut]);
            match kind {
                Fault::Reset => steps.push(Step::Error("injected reset".to_owned())),
                Fault::Stall => steps.push(Step::Stall),
                _ => {}
            }
            steps
        }
        Some(Fault::Malformed) if stream => {
            let (cut, offset) = pick_offset(rng, &body, commit);
            offset_kind = Some(offset);
            // At the next event boundary at or after the cut.
            let at = body[cut..]
                .windows(2)
                .position(|w| w == b"\n\n")
                .map_or(body.len(), |p| cut + p + 2);
            let mut wire = body[..at].to_vec();
            wire.extend_from_slice(b"data: {\"choices\":[{\"delta\":{\"content\":\"tru\n\n");
            wire.extend_from_slice(&body[at..]);
            frames(rng, &wire)
        }
        Some(Fault::Malformed) => vec![Step::Data(Bytes::from_static(b"<html>oops</html>"))],
        Some(Fault::MissingDone) if stream => {
            let end = body.len() - b"data: [DONE]\n\n".len();
            frames(rng, &body[..end])
        }
        Some(Fault::MissingDone) => frames(rng, &body),
        Some(Fault::SlowFirstToken) => {
            let wait = Duration::from_millis(rng.u64(0..800));
            let mut steps = frames(rng, &body[..commit.saturating_sub(1).max(1)]);
            steps.push(Step::Wait(wait));
            steps.extend(frames(rng, &body[commit.saturating_sub(1).max(1)..]));
            steps
        }
    };
    if let Some(fault) = fault {
        *stats
            .faults
            .lock()
            .unwrap()
            .entry((fault, offset_kind))
            .or_default() += 1;
        stats.total_faults.fetch_add(1, Ordering::Relaxed);
    }
    let mut response = Response::new(ScriptedBody::new(steps));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static(if status.is_success() {
            content_type
        } else {
            "application/json"
        }),
    );
    response
}

async fn start_upstream(
    name: &'static str,
    stats: Arc<Upstreams>,
    seed: u64,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rng = Arc::new(Mutex::new(fastrand::Rng::with_seed(seed)));
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let _ = tcp.set_nodelay(true);
            let (stats, rng) = (Arc::clone(&stats), Arc::clone(&rng));
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let (stats, rng) = (Arc::clone(&stats), Arc::clone(&rng));
                    async move {
                        let body = request.into_body().collect().await.map(|c| c.to_bytes());
                        let json: Value = body
                            .ok()
                            .and_then(|b| serde_json::from_slice(&b).ok())
                            .unwrap_or(Value::Null);
                        let id = json["user"].as_str().unwrap_or("?").to_owned();
                        let stream = json["stream"].as_bool().unwrap_or(false);
                        let usage = json["stream_options"]["include_usage"]
                            .as_bool()
                            .unwrap_or(false);
                        *stats
                            .attempts
                            .lock()
                            .unwrap()
                            .entry((id, name))
                            .or_default() += 1;
                        let mut rng = { rng.lock().unwrap().fork() };
                        Ok::<_, Infallible>(answer(name, stream, usage, &mut rng, &stats))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, task)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Outcome {
    Complete,
    CutWithTerminal,
    CleanError,
}

/// What the client's bytes say, or why they break the rule.
fn judge(stream: bool, status: StatusCode, body: &[u8]) -> Result<Outcome, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("not UTF-8: {e}"))?;
    if !status.is_success() {
        let json: Value =
            serde_json::from_str(text).map_err(|e| format!("error body not JSON: {e}: {text}"))?;
        if json["error"].is_object() {
            return Ok(Outcome::CleanError);
        }
        return Err(format!("error without an error object: {text}"));
    }
    if !stream {
        let json: Value =
            serde_json::from_str(text).map_err(|e| format!("answer not JSON: {e}: {text}"))?;
        let content = json["choices"][0]["message"]["content"]
            .as_str()
            .ok_or_else(|| format!("no content: {text}"))?;
        if UPSTREAMS
            .iter()
            .any(|n| content == (0..TOKENS).map(|i| token(n, i)).collect::<String>())
        {
            return Ok(Outcome::Complete);
        }
        return Err(format!("not one upstream's whole answer: {content}"));
    }
    let mut datas = Vec::new();
    for event in text.split_terminator("\n\n") {
        let data = event
            .strip_prefix("data: ")
            .ok_or_else(|| format!("event without data: {event:?}"))?;
        datas.push(data);
    }
    if datas.last() != Some(&"[DONE]") {
        return Err(format!("no [DONE] at the end: {text}"));
    }
    let mut content = String::new();
    let mut terminal = false;
    let mut finished = false;
    for (i, data) in datas[..datas.len() - 1].iter().enumerate() {
        let json: Value =
            serde_json::from_str(data).map_err(|e| format!("data line not JSON: {e}: {data}"))?;
        if json.get("error").is_some() {
            if i != datas.len() - 2 {
                return Err(format!("terminal chunk not last: {text}"));
            }
            terminal = true;
        }
        if json["choices"][0]["finish_reason"] == "stop" {
            finished = true;
        }
        if let Some(c) = json["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
    }
    // One voice: the tokens are a prefix of one upstream's answer.
    let voice = UPSTREAMS.iter().find(|n| {
        let whole: String = (0..TOKENS).map(|i| token(n, i)).collect();
        !content.is_empty() && whole.starts_with(&content)
    });
    let Some(voice) = voice else {
        return Err(format!("SPLICE or foreign tokens: {content:?}"));
    };
    let whole: String = (0..TOKENS).map(|i| token(voice, i)).collect();
    match (terminal, finished && content == whole) {
        (false, true) => Ok(Outcome::Complete),
        (true, _) => Ok(Outcome::CutWithTerminal),
        (false, false) => Err(format!(
            "neither complete nor ended by a terminal chunk: {text}"
        )),
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_no_splice_no_hang_within_budgets() {
    let target_faults = env_usize("SOAK_FAULTS", 5000) as u64;
    let clients = env_usize("SOAK_CLIENTS", 16);
    let cap = Duration::from_secs(env_usize("SOAK_MAX_SECONDS", 240) as u64);
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("soak: seed {seed}, {clients} clients, until {target_faults} faults");

    let stats = Arc::new(Upstreams::default());
    let mut providers = String::new();
    let mut tasks = Vec::new();
    for (i, name) in UPSTREAMS.iter().enumerate() {
        let (addr, task) =
            start_upstream(name, Arc::clone(&stats), seed.wrapping_add(i as u64)).await;
        tasks.push(task);
        providers.push_str(&format!(
            "[[providers]]\nname = \"{name}\"\nbase_url = \"http://{addr}/v1\"\n\n"
        ));
    }
    let config = format!(
        r#"
listen = "127.0.0.1:0"

[budget]
deadline_ms = 6000
max_attempts = {MAX_ATTEMPTS}
first_token_timeout_ms = 400
idle_timeout_ms = 300
head_timeout_ms = 1000
non_streaming_head_timeout_ms = 1000
retry_percent = 1000.0

[failover]
max_retries_per_target = {MAX_RETRIES_PER_TARGET}
cooldown_failures = 1000000000
shutdown_grace_ms = 1000

[server]
max_in_flight = 4096
max_connections = 4096

{providers}
"#
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::serve(gateway, listener);
    let url = format!("http://{}/v1/chat/completions", running.addr);

    let (rss_before, fds_before) = (rss_kib(), open_fds());
    let started = tokio::time::Instant::now();
    let next_id = Arc::new(AtomicU64::new(0));
    let outcomes: Arc<Mutex<HashMap<(bool, Outcome), u64>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let hung = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for c in 0..clients {
        let (stats, next_id, outcomes, violations, hung, url) = (
            Arc::clone(&stats),
            Arc::clone(&next_id),
            Arc::clone(&outcomes),
            Arc::clone(&violations),
            Arc::clone(&hung),
            url.clone(),
        );
        handles.push(tokio::spawn(async move {
            let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let mut rng = fastrand::Rng::with_seed(seed ^ (c as u64 + 1) << 32);
            while stats.total_faults.load(Ordering::Relaxed) < target_faults
                && started.elapsed() < cap
            {
                let id = format!("r{}", next_id.fetch_add(1, Ordering::Relaxed));
                let stream = rng.bool();
                let body = json!({"model": "m", "stream": stream, "user": id,
                    "messages": [{"role": "user", "content": "hi"}]});
                let request = Request::post(&url)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.to_string())))
                    .unwrap();
                let exchange = async {
                    let response = client.request(request).await.map_err(|e| e.to_string())?;
                    let status = response.status();
                    let body = response
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| format!("client body error: {e}"))?
                        .to_bytes();
                    Ok::<_, String>((status, body))
                };
                match tokio::time::timeout(Duration::from_secs(20), exchange).await {
                    Err(_) => {
                        hung.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Err(error)) => violations
                        .lock()
                        .unwrap()
                        .push(format!("{id}: transport: {error}")),
                    Ok(Ok((status, body))) => match judge(stream, status, &body) {
                        Ok(outcome) => {
                            *outcomes
                                .lock()
                                .unwrap()
                                .entry((stream, outcome))
                                .or_default() += 1;
                        }
                        Err(why) => violations.lock().unwrap().push(format!("{id}: {why}")),
                    },
                }
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    let elapsed = started.elapsed();
    running.shutdown(Duration::from_secs(2)).await;
    for task in tasks {
        task.abort();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (rss_after, fds_after) = (rss_kib(), open_fds());

    // Budgets: per request, attempts overall and per upstream.
    let mut over_budget = Vec::new();
    let mut per_request: HashMap<String, usize> = HashMap::new();
    for ((id, name), n) in stats.attempts.lock().unwrap().iter() {
        *per_request.entry(id.clone()).or_default() += n;
        if *n > 1 + MAX_RETRIES_PER_TARGET {
            over_budget.push(format!("{id}: {n} attempts on {name}"));
        }
    }
    for (id, n) in &per_request {
        if *n > MAX_ATTEMPTS {
            over_budget.push(format!("{id}: {n} attempts in one turn"));
        }
    }

    let faults = stats.faults.lock().unwrap().clone();
    let mut by_kind: HashMap<Fault, u64> = HashMap::new();
    let mut by_offset: HashMap<Offset, u64> = HashMap::new();
    for ((kind, offset), n) in &faults {
        *by_kind.entry(*kind).or_default() += n;
        if let Some(offset) = offset {
            *by_offset.entry(*offset).or_default() += n;
        }
    }
    let mut by_kind: Vec<_> = by_kind.into_iter().collect();
    by_kind.sort();
    let mut by_offset: Vec<_> = by_offset.into_iter().collect();
    by_offset.sort();
    let mut outcomes: Vec<_> = outcomes.lock().unwrap().clone().into_iter().collect();
    outcomes.sort();
    let violations = violations.lock().unwrap().clone();
    let splices = violations.iter().filter(|v| v.contains("SPLICE")).count();
    let total_faults = stats.total_faults.load(Ordering::Relaxed);
    println!(
        "soak: {} requests in {:.1} s",
        next_id.load(Ordering::Relaxed),
        elapsed.as_secs_f64()
    );
    println!("soak: faults {total_faults}: {by_kind:?}");
    println!("soak: cut offsets: {by_offset:?}");
    println!("soak: outcomes (stream, outcome): {outcomes:?}");
    println!(
        "soak: splices {splices}, other violations {}, hung {}, over budget {}",
        violations.len() - splices,
        hung.load(Ordering::Relaxed),
        over_budget.len()
    );
    println!("soak: RSS {rss_before} KiB -> {rss_after} KiB; open fds {fds_before} -> {fds_after}");
    assert!(
        violations.is_empty(),
        "{} violations, first: {:#?}",
        violations.len(),
        &violations[..violations.len().min(5)]
    );
    assert_eq!(hung.load(Ordering::Relaxed), 0, "hung requests");
    assert!(over_budget.is_empty(), "{over_budget:#?}");
    assert!(
        total_faults >= target_faults,
        "only {total_faults} faults within {} s",
        cap.as_secs()
    );
    // Connections are closed once the gateway stopped: nothing leaked.
    assert!(
        fds_after <= fds_before + 8,
        "fds {fds_before} -> {fds_after}"
    );
}

/// The judge itself: a spliced answer, a cut without its terminal chunk and
/// a line that is not JSON are each caught.
#[test]
fn the_judge_catches_splices_cuts_and_broken_lines() {
    let (alpha, _) = full_stream("alpha", false);
    let alpha = String::from_utf8(alpha).unwrap();
    assert_eq!(
        judge(true, StatusCode::OK, alpha.as_bytes()),
        Ok(Outcome::Complete)
    );
    // alpha's first token, then beta's second: a splice.
    let spliced = format!(
        "{}{}{}data: [DONE]\n\n",
        String::from_utf8(chunk("alpha", json!({"content": token("alpha", 0)}), None)).unwrap(),
        String::from_utf8(chunk("beta", json!({"content": token("beta", 1)}), None)).unwrap(),
        String::from_utf8(chunk("beta", json!({}), Some("stop"))).unwrap(),
    );
    assert!(
        judge(true, StatusCode::OK, spliced.as_bytes())
            .unwrap_err()
            .contains("SPLICE")
    );
    // Cut after two tokens with no terminal chunk.
    let cut = format!(
        "{}{}data: [DONE]\n\n",
        String::from_utf8(chunk("alpha", json!({"content": token("alpha", 0)}), None)).unwrap(),
        String::from_utf8(chunk("alpha", json!({"content": token("alpha", 1)}), None)).unwrap(),
    );
    assert!(judge(true, StatusCode::OK, cut.as_bytes()).is_err());
    assert!(
        judge(
            true,
            StatusCode::OK,
            b"data: {\"choices\":[\n\ndata: [DONE]\n\n"
        )
        .is_err()
    );
    assert_eq!(
        judge(
            false,
            StatusCode::BAD_GATEWAY,
            br#"{"error":{"message":"x"}}"#
        ),
        Ok(Outcome::CleanError)
    );
}
