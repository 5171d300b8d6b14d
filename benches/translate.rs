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
use tower_llm_failover::dialect::{AnthropicMessages, Dialect, OpenAiChat, OpenAiResponses};
use tower_llm_failover::failover::{BoxUpstream, Failover, Target};

/// Two stream lengths: the difference of their turn times is the cost
/// of the events alone (a turn's own costs, the request's translation
/// included, cancel out).
const SHORT: usize = 100;
const LONG: usize = 500;
const TURNS: usize = 100;

/// A chat stream of `tokens` content chunks, one frame per event.
fn chat_stream(tokens: usize) -> Vec<Bytes> {
    let chunk = |delta: &str, finish: &str| {
        Bytes::from(format!(
            "data: {{\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-b\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        ))
    };
    let mut frames = vec![chunk("{\"role\":\"assistant\",\"content\":\"\"}", "null")];
    for i in 0..tokens {
        frames.push(chunk(&format!("{{\"content\":\"token{i} \"}}"), "null"));
    }
    frames.push(chunk("{}", "\"stop\""));
    frames.push(Bytes::from_static(b"data: {\"id\":\"chatcmpl-b\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-b\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":100,\"total_tokens\":109}}\n\n"));
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    frames
}

/// A Messages stream of `tokens` text deltas, one frame per event.
fn messages_stream(tokens: usize) -> Vec<Bytes> {
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
    for i in 0..tokens {
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

/// Best-of-5 time for `TURNS` turns of `failover`.
async fn time<D: Dialect>(
    failover: &Failover<BoxUpstream, D>,
    path: &str,
    body: &'static str,
) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        run_turns(failover.clone(), path, body).await;
        best = best.min(start.elapsed());
    }
    best
}

/// The four paths for streams of `tokens` tokens: chat native, chat from
/// Messages, Messages native, Messages from chat; each the best-of-5 time
/// of `TURNS` turns.
async fn four(tokens: usize) -> [Duration; 4] {
    let chat = chat_stream(tokens);
    let messages = messages_stream(tokens);
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
    let (chat_path, messages_path) = ("/v1/chat/completions", "/v1/messages");
    [
        time(&chat_native, chat_path, CHAT_REQUEST).await,
        time(&chat_from_messages, chat_path, CHAT_REQUEST).await,
        time(&messages_native, messages_path, MESSAGES_REQUEST).await,
        time(&messages_from_chat, messages_path, MESSAGES_REQUEST).await,
    ]
}

/// Per-event costs of the pieces, on a Messages stream's events: the
/// reading the commit machine does anyway, the decoding, the encoding.
fn pieces() {
    use tower_llm_failover::dialect::{ChatMemo, MessagesMemo, NeutralEvent};
    use tower_llm_failover::sse::{SseItem, SseScanner};
    let mut events = Vec::new();
    for frame in messages_stream(SHORT) {
        SseScanner::new().feed(&frame, |item| {
            if let SseItem::Event(event) = item {
                events.push(event);
            }
        });
    }
    let best = |run: &mut dyn FnMut() -> usize| {
        let mut best = Duration::MAX;
        for _ in 0..20 {
            let start = Instant::now();
            for _ in 0..50 {
                black_box(run());
            }
            best = best.min(start.elapsed());
        }
        best.as_secs_f64() * 1e6 / (50 * events.len()) as f64
    };
    let inspect = best(&mut || {
        let mut memo = MessagesMemo::default();
        events
            .iter()
            .map(|e| AnthropicMessages.inspect(e, &mut memo).kind as usize)
            .sum()
    });
    let decode = best(&mut || {
        let mut memo = MessagesMemo::default();
        let mut out: Vec<NeutralEvent> = Vec::new();
        let mut n = 0;
        for e in &events {
            AnthropicMessages.decode_event(e, &mut memo, &mut out);
            n += out.len();
            out.clear();
        }
        n
    });
    let mut neutral = Vec::new();
    let mut memo = MessagesMemo::default();
    for e in &events {
        AnthropicMessages.decode_event(e, &mut memo, &mut neutral);
    }
    let encode = best(&mut || {
        let mut memo = ChatMemo::default();
        let mut out = bytes::BytesMut::new();
        for n in &neutral {
            OpenAiChat.encode_event(n, &mut memo, &mut out);
        }
        out.len()
    });
    println!(
        "pieces, per Messages event: inspect {inspect:.3} µs, decode {decode:.3} µs, chat encode {encode:.3} µs"
    );
}

/// `TURNS` turns of `failover`, each answer read whole.
async fn run_turns<D: Dialect>(failover: Failover<BoxUpstream, D>, url: &str, body: &'static str) {
    for _ in 0..TURNS {
        let request = Request::post(url)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap_or_default();
        let Ok(response) = failover.clone().oneshot(request).await;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        // A refusal or a failed stream would measure the wrong path.
        assert!(
            status == 200 && bytes.windows(7).any(|w| w == b"token0 "),
            "{status}: {}",
            String::from_utf8_lossy(&bytes)
        );
        black_box(bytes);
    }
}

/// A Responses stream of `tokens` text deltas, one frame per event: the
/// lifecycle of `src/dialect/responses/fixtures/text.sse` around them,
/// its sequence numbers continued.
fn responses_stream(tokens: usize) -> Vec<Bytes> {
    let fixture = include_str!("../src/dialect/responses/fixtures/text.sse");
    let events: Vec<&str> = fixture.split_inclusive("\n\n").collect();
    let deltas = events
        .iter()
        .filter(|e| e.starts_with("event: response.output_text.delta"))
        .count();
    let mut frames: Vec<Bytes> = events[..4]
        .iter()
        .map(|e| Bytes::copy_from_slice(e.as_bytes()))
        .collect();
    for i in 0..tokens {
        frames.push(Bytes::from(format!(
            "event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"sequence_number\":{},\"item_id\":\"msg_68a1\",\"output_index\":0,\"content_index\":0,\"delta\":\"token{i} \",\"logprobs\":[],\"obfuscation\":\"x\"}}\n\n",
            4 + i
        )));
    }
    for (n, event) in events[4 + deltas..].iter().enumerate() {
        let was = format!("\"sequence_number\":{}", 4 + deltas + n);
        let now = format!("\"sequence_number\":{}", 4 + tokens + n);
        frames.push(Bytes::from(event.replace(&was, &now)));
    }
    frames
}

const RESPONSES_REQUEST: &str =
    r#"{"model":"m","stream":true,"max_output_tokens":256,"input":"hi"}"#;

/// `TRANSLATE_PATH=i TRANSLATE_TOKENS=n`: only path `i` (0 chat native,
/// 1 chat from Messages, 2 Messages native, 3 Messages from chat, 4
/// Responses native, 5 Responses from chat, 6 chat from Responses),
/// `TURNS` turns of `n`-token streams, once: for an instruction counter
/// (`valgrind --tool=callgrind`), exact where timings are noisy.
fn one_path(path: usize, tokens: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let chat = chat_stream(tokens);
        let messages = messages_stream(tokens);
        let responses = responses_stream(tokens);
        let (chats, claude, openai) = ("/v1/chat/completions", "/v1/messages", "/v1/responses");
        match path {
            0 => {
                let f = Failover::builder().target(target("gpt", chat)).build();
                run_turns(f, chats, CHAT_REQUEST).await;
            }
            1 => {
                let f = Failover::builder()
                    .target(target("claude", messages).dialect(AnthropicMessages))
                    .build();
                run_turns(f, chats, CHAT_REQUEST).await;
            }
            2 => {
                let f = Failover::builder()
                    .dialect(AnthropicMessages)
                    .target(target("claude", messages))
                    .build();
                run_turns(f, claude, MESSAGES_REQUEST).await;
            }
            3 => {
                let f = Failover::builder()
                    .dialect(AnthropicMessages)
                    .target(target("gpt", chat).dialect(OpenAiChat))
                    .build();
                run_turns(f, claude, MESSAGES_REQUEST).await;
            }
            4 => {
                let f = Failover::builder()
                    .dialect(OpenAiResponses)
                    .target(target("gpt", responses))
                    .build();
                run_turns(f, openai, RESPONSES_REQUEST).await;
            }
            5 => {
                let f = Failover::builder()
                    .dialect(OpenAiResponses)
                    .target(target("gpt", chat).dialect(OpenAiChat))
                    .build();
                run_turns(f, openai, RESPONSES_REQUEST).await;
            }
            _ => {
                let f = Failover::builder()
                    .target(target("gpt", responses).dialect(OpenAiResponses))
                    .build();
                run_turns(f, chats, CHAT_REQUEST).await;
            }
        }
    });
}

fn main() {
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    if let (Some(path), Some(tokens)) = (env("TRANSLATE_PATH"), env("TRANSLATE_TOKENS")) {
        return one_path(path, tokens);
    }
    pieces();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let short = four(SHORT).await;
        let long = four(LONG).await;
        // Per event: the long stream's extra time over its extra events.
        let per_event = |i: usize| {
            long[i].saturating_sub(short[i]).as_secs_f64() * 1e6 / (TURNS * (LONG - SHORT)) as f64
        };
        let per_turn = |i: usize| short[i].as_secs_f64() * 1e6 / TURNS as f64;
        println!(
            "translation through Failover, {SHORT}- and {LONG}-token streams, {TURNS} turns each, best of 5:"
        );
        let rows = [
            ("chat client,     chat target    ", None),
            ("chat client,     Messages target", Some(0)),
            ("Messages client, Messages target", None),
            ("Messages client, chat target    ", Some(2)),
        ];
        for (i, (name, baseline)) in rows.iter().enumerate() {
            let ratio = baseline.map_or(String::new(), |b| {
                format!("  {:.2}x the same-dialect path per event", per_event(i) / per_event(b))
            });
            println!(
                "  {name}  {:>6.3} µs per event, {:>7.1} µs per {SHORT}-token turn{ratio}",
                per_event(i),
                per_turn(i)
            );
        }
    });
}
