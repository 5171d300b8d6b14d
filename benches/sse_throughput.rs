//! Throughput of the SSE hot path on a realistic chat stream (one ~200-byte
//! `chat.completion.chunk` event per frame), against a baseline measured in
//! the same run that only finds newlines with memchr over the same bytes.
//!
//! `cargo bench --bench sse_throughput` prints criterion's figures, then a
//! summary with each path's bytes per second and its ratio to the baseline.

use std::convert::Infallible;
use std::future::Future as _;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use http::Response;
use http_body::{Body, Frame};
use tower::{Layer, Service};
use tower_llm_failover::dialect::{ChatMemo, Chunk, ChunkKind, Dialect, OpenAiChat};
use tower_llm_failover::sse::{SseEvent, SseItem, SseScanner};
use tower_llm_failover::stream::StreamStateLayer;

const FRAMES: usize = 5_000;

/// One stream: role chunk, content chunks of about 200 bytes, finish, done.
fn stream() -> Vec<Bytes> {
    let mut frames = Vec::with_capacity(FRAMES + 3);
    let chunk = |delta: &str, finish: &str| {
        Bytes::from(format!(
            "data: {{\"id\":\"chatcmpl-AbCdEfGhIjKlMnOpQrStUvWxYz012\",\"object\":\"chat.completion.chunk\",\"created\":1732968000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
        ))
    };
    frames.push(chunk("{\"role\":\"assistant\",\"content\":\"\"}", "null"));
    for i in 0..FRAMES {
        frames.push(chunk(
            &format!("{{\"content\":\" token{:04}\"}}", i % 10_000),
            "null",
        ));
    }
    frames.push(chunk("{}", "\"stop\""));
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    frames
}

/// Whether an event commits a stream: model output or a finish reason.
fn commits(chunk: &Chunk<'_>) -> bool {
    chunk.kind == ChunkKind::Output || chunk.finish_reason.is_some()
}

fn total_bytes(frames: &[Bytes]) -> u64 {
    frames.iter().map(|f| f.len() as u64).sum()
}

fn baseline_memchr(frames: &[Bytes]) -> usize {
    frames
        .iter()
        .map(|f| memchr::memchr_iter(b'\n', f).count())
        .sum()
}

fn scanner_only(frames: &[Bytes]) -> usize {
    let mut scanner = SseScanner::new();
    let mut events = 0;
    for frame in frames {
        scanner.feed(frame, |item| {
            events += usize::from(matches!(item, SseItem::Event(_)))
        });
    }
    events
}

fn scanner_and_dialect(frames: &[Bytes]) -> usize {
    let mut scanner = SseScanner::new();
    let mut outputs = 0;
    for frame in frames {
        scanner.feed(frame, |item| {
            if let SseItem::Event(event) = item {
                outputs += usize::from(commits(
                    &OpenAiChat.inspect(&event, &mut ChatMemo::default()),
                ));
            }
        });
    }
    outputs
}

/// As [`scanner_and_dialect`], each event read with the stream's memo, as
/// the commit machine reads them.
fn scanner_and_dialect_next(frames: &[Bytes]) -> usize {
    let mut scanner = SseScanner::new();
    let mut memo = ChatMemo::default();
    let mut outputs = 0;
    for frame in frames {
        scanner.feed(frame, |item| {
            if let SseItem::Event(event) = item {
                outputs += usize::from(commits(&OpenAiChat.inspect(&event, &mut memo)));
            }
        });
    }
    outputs
}

/// The stream's events, scanned once, for timing the dialect alone.
fn scanned_events(frames: &[Bytes]) -> Vec<SseEvent> {
    let mut scanner = SseScanner::new();
    let mut events = Vec::with_capacity(frames.len());
    for frame in frames {
        scanner.feed(frame, |item| {
            if let SseItem::Event(event) = item {
                events.push(event);
            }
        });
    }
    events
}

fn dialect_only(events: &[SseEvent]) -> usize {
    events
        .iter()
        .filter(|event| commits(&OpenAiChat.inspect(event, &mut ChatMemo::default())))
        .count()
}

/// A body replaying frames from memory.
struct Replay<'a> {
    frames: std::iter::Cloned<std::slice::Iter<'a, Bytes>>,
}

impl Body for Replay<'_> {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.frames.next().map(|b| Ok(Frame::data(b))))
    }
}

/// The full path a client's bytes take through `StreamStateLayer`.
fn full_layer_path(frames: &[Bytes]) -> u64 {
    let mut service = StreamStateLayer::new().layer(tower::service_fn(|_req: http::Request<()>| {
        let body = Replay {
            frames: frames.iter().cloned(),
        };
        let mut response = Response::new(body);
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        std::future::ready(Ok::<_, Infallible>(response))
    }));
    let mut cx = Context::from_waker(Waker::noop());
    let mut future = service.call(http::Request::new(()));
    let Poll::Ready(Ok(response)) = Pin::new(&mut future).poll(&mut cx) else {
        unreachable!("the replay service is always ready")
    };
    let mut body = response.into_body();
    let mut bytes = 0;
    while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
        bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
    }
    bytes
}

fn bench(c: &mut Criterion, frames: &[Bytes], events: &[SseEvent]) {
    let mut group = c.benchmark_group("sse_hot_path");
    group.throughput(Throughput::Bytes(total_bytes(frames)));
    group.bench_function("baseline_memchr_newlines", |b| {
        b.iter(|| baseline_memchr(black_box(frames)))
    });
    group.bench_function("scanner", |b| b.iter(|| scanner_only(black_box(frames))));
    group.bench_function("scanner_and_dialect", |b| {
        b.iter(|| scanner_and_dialect(black_box(frames)))
    });
    group.bench_function("scanner_and_dialect_next", |b| {
        b.iter(|| scanner_and_dialect_next(black_box(frames)))
    });
    group.bench_function("dialect_only", |b| {
        b.iter(|| dialect_only(black_box(events)))
    });
    group.bench_function("stream_state_layer", |b| {
        b.iter(|| full_layer_path(black_box(frames)))
    });
    group.finish();
}

/// Best-of-N bytes per second, for the summary's ratios.
fn rate(frames: &[Bytes], mut run: impl FnMut(&[Bytes]) -> u64) -> f64 {
    let bytes = total_bytes(frames) as f64;
    let mut best = Duration::MAX;
    for _ in 0..30 {
        let start = Instant::now();
        black_box(run(black_box(frames)));
        best = best.min(start.elapsed());
    }
    bytes / best.as_secs_f64()
}

fn main() {
    let frames = stream();
    let events = scanned_events(&frames);
    let mut criterion = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(3));
    bench(&mut criterion, &frames, &events);
    criterion.final_summary();

    let gib = (1u64 << 30) as f64;
    let baseline = rate(&frames, |f| baseline_memchr(f) as u64);
    println!(
        "\nsummary ({} frames, {} bytes, best of 30):",
        frames.len(),
        total_bytes(&frames)
    );
    println!("  baseline memchr newlines : {:>7.2} GiB/s", baseline / gib);
    for (name, measured) in [
        ("scanner", rate(&frames, |f| scanner_only(f) as u64)),
        (
            "scanner + dialect",
            rate(&frames, |f| scanner_and_dialect(f) as u64),
        ),
        (
            "scanner + dialect (memo)",
            rate(&frames, |f| scanner_and_dialect_next(f) as u64),
        ),
        (
            "dialect alone (events)",
            rate(&frames, |_| dialect_only(&events) as u64),
        ),
        ("StreamStateLayer (full)", rate(&frames, full_layer_path)),
    ] {
        println!(
            "  {name:<25}: {:>7.2} GiB/s   {:.3}x baseline",
            measured / gib,
            measured / baseline
        );
    }
}
