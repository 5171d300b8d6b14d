//! Soak: fake upstreams inject random faults at random byte offsets while
//! concurrent streaming and non-streaming clients drive the whole gateway
//! over loopback. From the client's bytes alone, each response must
//! be exactly one of:
//!
//! - complete, from one upstream;
//! - one upstream's tokens, then the terminal chunk and `[DONE]`;
//! - a clean error before any output.
//!
//! Every `data:` line must be JSON, and no upstream may see more attempts
//! for one request than the budgets allow, nor the fleet more extra
//! attempts than the retry budget allows. Cooldowns, probes and the retry
//! budget run at their defaults. Half the streams ask for `n = 2`: each
//! choice must be whole, or the stream must end with the terminal chunk.
//! A terminal chunk must carry the stream's own id and the committed
//! phase, and a terminal chunk on an attempt whose upstream had no fault
//! is a violation (a spurious cut). Some clients leave mid-answer and some
//! stop reading; the others must not notice.
//!
//! Faults: status before body, in-band error, reset, stall, malformed
//! chunk, missing `[DONE]`, slow first token, clean EOF. Cut offsets are
//! uniform, inside a UTF-8 sequence (every token carries `é漢🙂`) or exactly
//! at the commit point (the end of the first content event).
//!
//! CI runs until 5,000 faults (16 clients). On demand:
//!
//! ```text
//! SOAK_FAULTS=100000 SOAK_CLIENTS=64 cargo test --release -p tower-llm-gateway --test soak -- --nocapture
//! ```
//!
//! It prints faults by kind, outcomes, splices (must be 0), hung requests
//! (must be 0), RSS and open file descriptors before and after.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
use tower_llm_gateway::app;
use tower_llm_testing::{ScriptedBody, Step};

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
    chunk_of(name, 0, delta, finish)
}

fn chunk_of(name: &str, index: usize, delta: Value, finish: Option<&str>) -> Vec<u8> {
    let event = json!({
        "id": format!("chatcmpl-{name}"),
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {event}\n\n").into_bytes()
}

/// A whole stream of `n` choices (their events interleaved, as OpenAI
/// sends them), and the offset just after its first content event.
fn full_stream_n(name: &str, usage: bool, n: usize) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    for c in 0..n {
        out.extend(chunk_of(
            name,
            c,
            json!({"role": "assistant", "content": ""}),
            None,
        ));
    }
    let mut commit = 0;
    for i in 0..TOKENS {
        for c in 0..n {
            out.extend(chunk_of(name, c, json!({"content": token(name, i)}), None));
            if i == 0 && c == 0 {
                commit = out.len();
            }
        }
    }
    // Choice 0 finishes first: a cut after it leaves the others unfinished.
    for c in 0..n {
        out.extend(chunk_of(name, c, json!({}), Some("stop")));
    }
    if usage {
        let event = json!({"id": format!("chatcmpl-{name}"), "object": "chat.completion.chunk",
            "created": 1, "model": "m", "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": TOKENS + 3}});
        out.extend(format!("data: {event}\n\n").into_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    (out, commit)
}

fn full_stream(name: &str, usage: bool) -> (Vec<u8>, usize) {
    full_stream_n(name, usage, 1)
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

/// (request id, upstream).
type Attempted = (String, &'static str);

#[derive(Default)]
struct Upstreams {
    /// (request id, upstream) → attempts.
    attempts: Mutex<HashMap<(String, &'static str), usize>>,
    /// (request id, upstream) → the fault of each answer, in order (None:
    /// none); the last is the one a committed stream came from.
    faults_seen: Mutex<HashMap<Attempted, Vec<Option<Fault>>>>,
    faults: Mutex<HashMap<(Fault, Option<Offset>), u64>>,
    total_faults: AtomicU64,
}

fn error_json(kind: &str) -> Bytes {
    Bytes::from(json!({"error": {"message": "injected", "type": kind, "code": kind}}).to_string())
}

/// One upstream answer, with a random fault (or none).
fn answer(
    name: &'static str,
    (stream, usage, n): (bool, bool, usize),
    id: &str,
    rng: &mut fastrand::Rng,
    stats: &Upstreams,
) -> Response<ScriptedBody> {
    let fault = pick_fault(rng);
    let content_type = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    stats
        .faults_seen
        .lock()
        .unwrap()
        .entry((id.to_owned(), name))
        .or_default()
        .push(fault);
    let (body, commit) = if stream {
        full_stream_n(name, usage, n)
    } else {
        let body = full_answer(name);
        let half = body.len() / 2;
        (body, half)
    };
    let (steps, status, offset_kind) = fault_steps(name, stream, fault, &body, commit, rng);
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

/// An answer's random fault: none 30 % of the time.
fn pick_fault(rng: &mut fastrand::Rng) -> Option<Fault> {
    match rng.u8(0..100) {
        0..30 => None,
        30..40 => Some(Fault::Status),
        40..50 => Some(Fault::InBandError),
        50..62 => Some(Fault::Reset),
        62..66 => Some(Fault::Stall),
        66..76 => Some(Fault::Malformed),
        76..84 => Some(Fault::MissingDone),
        84..90 => Some(Fault::SlowFirstToken),
        _ => Some(Fault::Eof),
    }
}

/// The steps that play the answer `body` (committed at `commit`) with
/// `fault`, the answer's status, and where a cut fell.
fn fault_steps(
    name: &'static str,
    stream: bool,
    fault: Option<Fault>,
    body: &[u8],
    commit: usize,
    rng: &mut fastrand::Rng,
) -> (Vec<Step>, StatusCode, Option<Offset>) {
    let mut offset_kind = None;
    let mut status = StatusCode::OK;
    let steps: Vec<Step> = match fault {
        None => frames(rng, body),
        Some(Fault::Status) => {
            status = [429u16, 500, 502, 503][rng.usize(0..4)].try_into().unwrap();
            vec![Step::Data(error_json("server_error"))]
        }
        Some(Fault::InBandError) if stream => in_band_error_stream(name, rng),
        Some(Fault::InBandError) => vec![Step::Data(error_json("server_error"))],
        Some(kind @ (Fault::Reset | Fault::Stall | Fault::Eof)) => {
            let (cut, offset) = pick_offset(rng, body, commit);
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
            let (cut, offset) = pick_offset(rng, body, commit);
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
        Some(Fault::MissingDone) => frames(rng, body),
        Some(Fault::SlowFirstToken) => {
            let wait = Duration::from_millis(rng.u64(0..800));
            let mut steps = frames(rng, &body[..commit.saturating_sub(1).max(1)]);
            steps.push(Step::Wait(wait));
            steps.extend(frames(rng, &body[commit.saturating_sub(1).max(1)..]));
            steps
        }
    };
    (steps, status, offset_kind)
}

/// A stream that ends in an in-band error after 0..TOKENS content events
/// (an event boundary).
fn in_band_error_stream(name: &str, rng: &mut fastrand::Rng) -> Vec<Step> {
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
                        let n = json["n"].as_u64().unwrap_or(1) as usize;
                        *stats
                            .attempts
                            .lock()
                            .unwrap()
                            .entry((id.clone(), name))
                            .or_default() += 1;
                        let mut rng = { rng.lock().unwrap().fork() };
                        let shape = (stream, usage, n);
                        Ok::<_, Infallible>(answer(name, shape, &id, &mut rng, &stats))
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

/// What the client's bytes say, or why they break the rule; for a stream
/// also the upstream whose voice it carries.
fn judge(stream: bool, status: StatusCode, body: &[u8]) -> Result<Outcome, String> {
    judge_n(stream, 1, status, body).map(|(outcome, _)| outcome)
}

fn judge_n(
    stream: bool,
    n: usize,
    status: StatusCode,
    body: &[u8],
) -> Result<(Outcome, Option<&'static str>), String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("not UTF-8: {e}"))?;
    if !status.is_success() {
        let json: Value =
            serde_json::from_str(text).map_err(|e| format!("error body not JSON: {e}: {text}"))?;
        if json["error"].is_object() {
            return Ok((Outcome::CleanError, None));
        }
        return Err(format!("error without an error object: {text}"));
    }
    if !stream {
        let json: Value =
            serde_json::from_str(text).map_err(|e| format!("answer not JSON: {e}: {text}"))?;
        let content = json["choices"][0]["message"]["content"]
            .as_str()
            .ok_or_else(|| format!("no content: {text}"))?;
        if let Some(voice) = UPSTREAMS
            .iter()
            .find(|n| content == (0..TOKENS).map(|i| token(n, i)).collect::<String>())
        {
            return Ok((Outcome::Complete, Some(voice)));
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
    let mut contents = vec![String::new(); n];
    let mut finished = vec![false; n];
    let mut terminal: Option<Value> = None;
    let mut ids = std::collections::BTreeSet::new();
    for (i, data) in datas[..datas.len() - 1].iter().enumerate() {
        let json: Value =
            serde_json::from_str(data).map_err(|e| format!("data line not JSON: {e}: {data}"))?;
        if let Some(id) = json["id"].as_str() {
            ids.insert(id.to_owned());
        }
        if json.get("error").is_some() {
            if i != datas.len() - 2 {
                return Err(format!("terminal chunk not last: {text}"));
            }
            terminal = Some(json);
            continue;
        }
        for choice in json["choices"].as_array().into_iter().flatten() {
            let index = choice["index"].as_u64().unwrap_or(0) as usize;
            if index >= n {
                return Err(format!("choice {index} of a stream of {n}: {text}"));
            }
            if choice["finish_reason"] == "stop" {
                finished[index] = true;
            }
            if let Some(c) = choice["delta"]["content"].as_str() {
                contents[index].push_str(c);
            }
        }
    }
    // One voice: every choice's tokens are a prefix of one upstream's
    // answer, the same upstream for all of them.
    let whole = |name: &str| (0..TOKENS).map(|i| token(name, i)).collect::<String>();
    let voice = UPSTREAMS.iter().copied().find(|name| {
        !contents[0].is_empty() && contents.iter().all(|c| whole(name).starts_with(c.as_str()))
    });
    let Some(voice) = voice else {
        return Err(format!("SPLICE or foreign tokens: {contents:?}"));
    };
    // The stream speaks with one identity: the voice's, terminal included.
    let own_id = format!("chatcmpl-{voice}");
    if ids.iter().any(|id| *id != own_id) {
        return Err(format!(
            "foreign identity {ids:?} in {voice}'s stream: {text}"
        ));
    }
    let all_whole = (0..n).all(|c| finished[c] && contents[c] == whole(voice));
    match terminal {
        None if all_whole => Ok((Outcome::Complete, Some(voice))),
        None => Err(format!(
            "neither complete nor ended by a terminal chunk: {text}"
        )),
        Some(chunk) => {
            let error = &chunk["error"];
            if error["phase"] != "committed"
                || !error["type"].is_string()
                || error["message"].as_str().is_none_or(str::is_empty)
            {
                return Err(format!(
                    "terminal chunk without its class and phase: {chunk}"
                ));
            }
            Ok((Outcome::CutWithTerminal, Some(voice)))
        }
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

/// Starts the fake upstreams, each seeded from `seed`; gives back the
/// config's `[[providers]]` for them and their tasks.
async fn start_upstreams(
    stats: &Arc<Upstreams>,
    seed: u64,
) -> (String, Vec<tokio::task::JoinHandle<()>>) {
    let mut providers = String::new();
    let mut tasks = Vec::new();
    for (i, name) in UPSTREAMS.iter().enumerate() {
        let (addr, task) =
            start_upstream(name, Arc::clone(stats), seed.wrapping_add(i as u64)).await;
        tasks.push(task);
        providers.push_str(&format!(
            "[[providers]]\nname = \"{name}\"\nbase_url = \"http://{addr}/v1\"\n\n"
        ));
    }
    (providers, tasks)
}

/// The gateway's config for the soak: tight timeouts and the budgets the
/// checks hold it to, over `providers`.
fn soak_config(providers: &str) -> app::Config {
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

[failover]
max_retries_per_target = {MAX_RETRIES_PER_TARGET}
shutdown_grace_ms = 1000

[server]
max_in_flight = 4096
max_connections = 4096
write_stall_timeout_ms = 500

{providers}
"#
    );
    app::Config::from_toml(&config).unwrap()
}

/// What the clients tally over the run.
#[derive(Default)]
struct Tally {
    /// The next request id (`r0`, `r1`, ...).
    next_id: AtomicU64,
    /// (stream, outcome) → requests.
    outcomes: Mutex<HashMap<(bool, Outcome), u64>>,
    violations: Mutex<Vec<String>>,
    /// Requests without an answer within 20 s.
    hung: AtomicU64,
    /// Clients that left mid-answer or stopped reading.
    left: AtomicU64,
}

/// When the clients stop: at `target_faults` injected faults, or `cap`
/// after `started`.
#[derive(Clone, Copy)]
struct Limits {
    target_faults: u64,
    started: tokio::time::Instant,
    cap: Duration,
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// Client `c`: sends turns until the limits; most read the whole answer
/// and have it judged, some leave early.
async fn run_client(
    c: usize,
    seed: u64,
    url: String,
    stats: Arc<Upstreams>,
    tally: Arc<Tally>,
    limits: Limits,
) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut rng = fastrand::Rng::with_seed(seed ^ (c as u64 + 1) << 32);
    while stats.total_faults.load(Ordering::Relaxed) < limits.target_faults
        && limits.started.elapsed() < limits.cap
    {
        let id = format!("r{}", tally.next_id.fetch_add(1, Ordering::Relaxed));
        let stream = rng.bool();
        let n = if stream && rng.bool() { 2 } else { 1 };
        let body = json!({"model": "m", "stream": stream, "n": n, "user": id,
            "messages": [{"role": "user", "content": "hi"}]});
        let request = Request::post(&url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        // Most clients read the whole answer; some leave after a
        // few frames, some stop reading for longer than the
        // gateway's write-stall timeout.
        let manner = rng.u8(0..100);
        if manner >= 80 {
            leave_early(&client, request, manner, &mut rng, &tally).await;
            continue;
        }
        read_and_judge(&client, request, (&id, stream, n), &stats, &tally).await;
    }
}

/// A client that leaves after a few frames (`manner` 80..90) or stops
/// reading for longer than the write-stall timeout (90..100).
async fn leave_early(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
    manner: u8,
    rng: &mut fastrand::Rng,
    tally: &Tally,
) {
    let frames_read = rng.usize(0..6);
    let pause = Duration::from_millis(rng.u64(600..900));
    let rude = async {
        let Ok(response) = client.request(request).await else {
            return;
        };
        let mut body = response.into_body();
        if manner >= 90 {
            tokio::time::sleep(pause).await;
        } else {
            for _ in 0..frames_read {
                if body.frame().await.is_none() {
                    break;
                }
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(20), rude)
        .await
        .is_err()
    {
        tally.hung.fetch_add(1, Ordering::Relaxed);
    }
    tally.left.fetch_add(1, Ordering::Relaxed);
}

/// Reads the whole answer to turn `id` (a stream of `n` choices or not)
/// and judges it: its outcome tallied, or a violation.
async fn read_and_judge(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
    (id, stream, n): (&str, bool, usize),
    stats: &Upstreams,
    tally: &Tally,
) {
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
            tally.hung.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(error)) => tally
            .violations
            .lock()
            .unwrap()
            .push(format!("{id}: transport: {error}")),
        Ok(Ok((status, body))) => match judge_n(stream, n, status, &body) {
            Ok((outcome, voice)) => {
                // A cut needs a cause: the voice's upstream
                // must have had a fault on its last answer.
                if outcome == Outcome::CutWithTerminal {
                    let fault = voice.and_then(|v| {
                        let seen = stats.faults_seen.lock().unwrap();
                        seen.get(&(id.to_owned(), v))
                            .and_then(|f| f.last().copied())
                    });
                    if fault == Some(None) {
                        tally.violations.lock().unwrap().push(format!(
                            "{id}: SPURIOUS terminal chunk on a healthy upstream: {}",
                            String::from_utf8_lossy(&body)
                        ));
                    }
                }
                *tally
                    .outcomes
                    .lock()
                    .unwrap()
                    .entry((stream, outcome))
                    .or_default() += 1;
            }
            Err(why) => tally
                .violations
                .lock()
                .unwrap()
                .push(format!("{id}: {why}")),
        },
    }
}

/// Attempts per turn (by request id), and the budgets broken: too many
/// attempts on one upstream or in one turn, or more extra attempts over
/// the run (`elapsed`) than the retry budget allows.
fn attempts_over_budget(
    stats: &Upstreams,
    elapsed: Duration,
) -> (HashMap<String, usize>, Vec<String>) {
    let mut over_budget = Vec::new();
    let mut per_request: HashMap<String, usize> = HashMap::new();
    for ((id, name), n) in stats.attempts.lock().unwrap().iter() {
        *per_request.entry(id.clone()).or_default() += n;
        // A turn may come back to a target it skipped as resting for its
        // one forced probe (when nothing else is left): one more.
        if *n > 1 + MAX_RETRIES_PER_TARGET + 1 {
            let seen = stats.faults_seen.lock().unwrap();
            let mut all: Vec<_> = seen.iter().filter(|((i, _), _)| i == id).collect();
            all.sort_by_key(|((_, upstream), _)| *upstream);
            over_budget.push(format!("{id}: {n} attempts on {name}: {all:?}"));
        }
    }
    for (id, n) in &per_request {
        if *n > MAX_ATTEMPTS {
            over_budget.push(format!("{id}: {n} attempts in one turn"));
        }
    }
    // The retry budget at its defaults (20 % of first attempts, a reserve
    // of 10 a second over a 10 s window): the fleet's extra attempts stay
    // within it.
    let first_attempts = per_request.len() as f64;
    let extra_attempts = per_request.values().sum::<usize>() as f64 - first_attempts;
    let allowed_extra = 0.2 * first_attempts + 10.0 * (elapsed.as_secs_f64() + 10.0);
    if extra_attempts > allowed_extra {
        over_budget.push(format!(
            "{extra_attempts} extra attempts for {first_attempts} turns: over the retry budget's {allowed_extra:.0}"
        ));
    }
    (per_request, over_budget)
}

/// Prints the requests sent, the faults by kind and cut offset, and the
/// outcomes.
fn print_faults_and_outcomes(
    stats: &Upstreams,
    tally: &Tally,
    elapsed: Duration,
    total_faults: u64,
) {
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
    let mut outcomes: Vec<_> = tally.outcomes.lock().unwrap().clone().into_iter().collect();
    outcomes.sort();
    println!(
        "soak: {} requests in {:.1} s",
        tally.next_id.load(Ordering::Relaxed),
        elapsed.as_secs_f64()
    );
    println!("soak: faults {total_faults}: {by_kind:?}");
    println!("soak: cut offsets: {by_offset:?}");
    println!("soak: outcomes (stream, outcome): {outcomes:?}");
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
    let (providers, tasks) = start_upstreams(&stats, seed).await;
    let config = soak_config(&providers);
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = app::serve(gateway, listener);
    let url = format!("http://{}/v1/chat/completions", running.addr);

    let (rss_before, fds_before) = (rss_kib(), open_fds());
    let started = tokio::time::Instant::now();
    let limits = Limits {
        target_faults,
        started,
        cap,
    };
    let tally = Arc::new(Tally::default());
    let mut handles = Vec::new();
    for c in 0..clients {
        handles.push(tokio::spawn(run_client(
            c,
            seed,
            url.clone(),
            Arc::clone(&stats),
            Arc::clone(&tally),
            limits,
        )));
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
    let (per_request, over_budget) = attempts_over_budget(&stats, elapsed);

    let violations = tally.violations.lock().unwrap().clone();
    let splices = violations.iter().filter(|v| v.contains("SPLICE")).count();
    let total_faults = stats.total_faults.load(Ordering::Relaxed);
    print_faults_and_outcomes(&stats, &tally, elapsed, total_faults);
    println!(
        "soak: splices {splices}, other violations {}, hung {}, over budget {}, clients that left or stopped reading {}",
        violations.len() - splices,
        tally.hung.load(Ordering::Relaxed),
        over_budget.len(),
        tally.left.load(Ordering::Relaxed)
    );
    println!(
        "soak: attempts {} for {} turns that reached an upstream",
        per_request.values().sum::<usize>(),
        per_request.len()
    );
    println!("soak: RSS {rss_before} KiB -> {rss_after} KiB; open fds {fds_before} -> {fds_after}");
    for line in over_budget.iter().take(5) {
        println!("soak: over budget: {line}");
    }
    assert!(
        violations.is_empty(),
        "{} violations, first: {:#?}",
        violations.len(),
        &violations[..violations.len().min(5)]
    );
    assert_eq!(tally.hung.load(Ordering::Relaxed), 0, "hung requests");
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
    // n = 2: choice 0 whole, choice 1 cut, then [DONE]: a silent truncation.
    let (two, _) = full_stream_n("alpha", false, 2);
    let two = String::from_utf8(two).unwrap();
    assert_eq!(
        judge_n(true, 2, StatusCode::OK, two.as_bytes()).map(|(o, _)| o),
        Ok(Outcome::Complete)
    );
    let cut_at = two
        .find("alpha:5:é漢🙂|\"},\"finish_reason\":null,\"index\":1")
        .unwrap();
    let event_start = two[..cut_at].rfind("data: ").unwrap();
    let mut truncated = two[..event_start].to_owned();
    truncated.push_str(&String::from_utf8(chunk_of("alpha", 0, json!({}), Some("stop"))).unwrap());
    truncated.push_str("data: [DONE]\n\n");
    assert!(judge_n(true, 2, StatusCode::OK, truncated.as_bytes()).is_err());
    // A terminal chunk under another stream's identity, or without its
    // phase, is caught.
    let head =
        String::from_utf8(chunk("alpha", json!({"content": token("alpha", 0)}), None)).unwrap();
    let foreign = format!(
        "{head}data: {}\n\ndata: [DONE]\n\n",
        json!({"id": "chatcmpl-beta", "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}],
            "error": {"message": "m", "type": "server_error", "phase": "committed"}})
    );
    assert!(
        judge(true, StatusCode::OK, foreign.as_bytes())
            .unwrap_err()
            .contains("foreign identity")
    );
    let phaseless = format!(
        "{head}data: {}\n\ndata: [DONE]\n\n",
        json!({"id": "chatcmpl-alpha", "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}],
            "error": {"message": "m", "type": "server_error"}})
    );
    assert!(judge(true, StatusCode::OK, phaseless.as_bytes()).is_err());
}
