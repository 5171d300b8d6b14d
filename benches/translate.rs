//! What translation costs per event: a 100-token stream through `Failover`,
//! the target speaking the client's dialect (its bytes pass untranslated)
//! against a target of the other dialect (read by its own, written in the
//! client's). Both directions, in one run, best of N; the figures are
//! ratios to the same-dialect path, in-process (a micro-benchmark: no
//! sockets, no scheduler).
//!
//! `cargo bench --bench translate`

use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use tower::ServiceExt;
use tower_llm_failover::dialect::{AnthropicMessages, Dialect, OpenAiChat};
use tower_llm_failover::failover::{BoxUpstream, Failover, Target};

const TOKENS: usize = 100;
const TURNS: usize = 200;

/// A chat stream of `TOKENS` content chunks, one frame per event.
fn chat_stream() -> Vec<Bytes> {
    let chunk = |delta: &str, finish: &str| {
        Bytes::from(format!(
            "data: {{\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-b\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        ))
    };
    let mut frames = vec![chunk("{\"role\":\"assistant\",\"content\":\"\"}", "null")];
    for i in 0..TOKENS {
        frames.push(chunk(&format!("{{\"content\":\"token{i} \"}}"), "null"));
    }
    frames.push(chunk("{}", "\"stop\""));
    frames.push(Bytes::from_static(b"data: {\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-b\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":100,\"total_tokens\":109}}\n\n"));
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    frames
}

/// A Messages stream of `TOKENS` text deltas, one frame per event.
fn messages_stream() -> Vec<Bytes> {
    let event = |name: &str, data: &str| Bytes::from(format!("event: {name}\ndata: {data}\n\n"));
    let mut frames = vec![
        event(
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_b","type":"message","role":"assistant","content":[],"model":"claude-b","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":1}}}"#,
        ),
        event(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
    ];
    for i in 0..TOKENS {
        frames.push(event(
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"token{i} "}}}}"#
            ),
        ));
    }
    frames.push(event(
        "content_block_stop",
        r#"{"type":"content_block_stop","index":0}"#,
    ));
    frames.push(event(
        "message_delta",
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":100}}"#,
    ));
    frames.push(event("message_stop", r#"{"type":"message_stop"}"#));
    frames
}

/// A target named `name` whose upstream answers every request with
/// `frames`, one per body frame.
fn target(name: &str, frames: Vec<Bytes>) -> Target<BoxUpstream> {
    Target::boxed(
        name.to_owned(),
        tower::service_fn(move |_request: Request<Full<Bytes>>| {
            let body: Vec<Result<Frame<Bytes>, Infallible>> =
                frames.iter().cloned().map(|f| Ok(Frame::data(f))).collect();
            let mut response = Response::new(StreamBody::new(futures_util::stream::iter(body)));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
            std::future::ready(Ok::<_, Infallible>(response))
        }),
    )
}

const CHAT_REQUEST: &str =
    r#"{"model":"m","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"hi"}]}"#;
const MESSAGES_REQUEST: &str =
    r#"{"model":"m","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"hi"}]}"#;

/// Best-of-5 time for `TURNS` turns of `failover`, and the bytes of one
/// answer.
async fn time<D: Dialect>(
    failover: &Failover<BoxUpstream, D>,
    path: &str,
    body: &'static str,
) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut size = 0;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..TURNS {
            let request = Request::post(path)
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .unwrap_or_default();
            let Ok(response) = failover.clone().oneshot(request).await;
            let bytes = response
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            size = black_box(bytes.len());
        }
        best = best.min(start.elapsed());
    }
    (best, size)
}

fn per_event(turns: Duration) -> f64 {
    turns.as_secs_f64() * 1e6 / (TURNS * (TOKENS + 5)) as f64
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let chat = chat_stream();
        let messages = messages_stream();

        let chat_native = Failover::builder()
            .target(target("gpt", chat.clone()))
            .build();
        let chat_from_messages = Failover::builder()
            .target(target("claude", messages.clone()).dialect(AnthropicMessages))
            .build();
        let messages_native = Failover::builder()
            .dialect(AnthropicMessages)
            .target(target("claude", messages))
            .build();
        let messages_from_chat = Failover::builder()
            .dialect(AnthropicMessages)
            .target(target("gpt", chat).dialect(OpenAiChat))
            .build();

        let path_chat = "/v1/chat/completions";
        let path_messages = "/v1/messages";
        let (a, a_size) = time(&chat_native, path_chat, CHAT_REQUEST).await;
        let (b, b_size) = time(&chat_from_messages, path_chat, CHAT_REQUEST).await;
        let (c, c_size) = time(&messages_native, path_messages, MESSAGES_REQUEST).await;
        let (d, d_size) = time(&messages_from_chat, path_messages, MESSAGES_REQUEST).await;

        println!("translation, {TOKENS}-token streams, {TURNS} turns, best of 5 (µs per event, whole turn / events):");
        println!(
            "  chat client,     chat target      {:>6.3} µs  ({a_size} bytes)",
            per_event(a)
        );
        println!(
            "  chat client,     Messages target  {:>6.3} µs  ({b_size} bytes)  {:.2}x the same-dialect path",
            per_event(b),
            b.as_secs_f64() / a.as_secs_f64()
        );
        println!(
            "  Messages client, Messages target  {:>6.3} µs  ({c_size} bytes)",
            per_event(c)
        );
        println!(
            "  Messages client, chat target      {:>6.3} µs  ({d_size} bytes)  {:.2}x the same-dialect path",
            per_event(d),
            d.as_secs_f64() / c.as_secs_f64()
        );
    });
}
