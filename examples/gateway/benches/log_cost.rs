//! What the default log costs a turn, in process (a micro-benchmark: the
//! figures of record come from `benches/overhead.sh` and
//! `benches/callgrind.sh`, separate processes; this one isolates the log,
//! which those can only see as a difference within their noise).
//!
//! Small non-streaming turns through `Failover` with an in-process
//! upstream, one after another on one thread, under three subscribers,
//! interleaved over rounds:
//! - `warn`: the gateway's log layer with `RUST_LOG=warn` (no line; the
//!   baseline);
//! - `shipped`: the gateway's log layer as shipped (the default filter,
//!   the lean line format, the batching writer), one `turn` line per turn;
//! - `before`: what shipped before issue 29's log work ended:
//!   `tracing-subscriber`'s default format through `tracing-appender`'s
//!   non-blocking writer over a 64 KiB `BufWriter`;
//! - the lean line through `tracing-appender`'s writer, to tell the
//!   format's share from the writer's.
//!
//! The sink is `io::sink()`: what writing to stderr costs the kernel is
//! left out of every row alike. CPU time is the process's (user + system,
//! every thread: the writer threads' work counts), over the turns and the
//! writer's final flush.
//!
//! `cargo bench -p tower-llm-gateway --bench log_cost [-- TURNS ROUNDS]`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_llm_failover::failover::{Failover, Target};
use tower_llm_gateway::log_writer::BatchedWriter;
use tower_llm_gateway::telemetry::{TelemetryConfig, log_layer};
use tower_llm_testing::run_ready;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there."},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#;
const REQUEST: &str = r#"{"model":"m","messages":[{"role":"user","content":"Say hello."}]}"#;

/// User + system CPU time of the whole process.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name (which may hold spaces), from 3 on.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// CPU time per turn of `turns` turns under `subscriber`; `flush` ends
/// the writer (counted).
fn run<S: tracing::Subscriber + Send + Sync + 'static>(
    turns: u32,
    subscriber: S,
    flush: impl FnOnce(),
) -> Duration {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(COMPLETION.as_bytes())))
                .unwrap(),
        )
    });
    let failover = Failover::builder()
        .target(Target::new("primary", upstream))
        .build();
    let start = process_cpu();
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..turns {
            let request = Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(REQUEST.as_bytes())))
                .unwrap();
            let failover = failover.clone();
            let bytes = run_ready(async move {
                let response = failover.oneshot(request).await.unwrap();
                response.into_body().collect().await.unwrap().to_bytes()
            });
            assert!(!bytes.is_empty());
        }
    });
    flush();
    (process_cpu() - start) / turns
}

const DEFAULT_FILTER: &str = "info,tower_llm_failover=info";

/// Turns under the gateway's log layer behind `filter`, writing through
/// `writer`; dropping `guard` ends the writer (counted).
fn gateway_layer<W, G>(turns: u32, (writer, guard): (W, G), filter: &str) -> Duration
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = log_layer(
        &TelemetryConfig::default(),
        writer,
        EnvFilter::new(filter),
        false,
    )
    .unwrap();
    run(turns, tracing_subscriber::registry().with(layer), || {
        drop(guard)
    })
}

/// The gateway's writer, as `main` starts it, over a sink.
fn batched() -> (
    BatchedWriter<std::io::Sink>,
    tower_llm_gateway::log_writer::FlushGuard<std::io::Sink>,
) {
    BatchedWriter::new(std::io::sink(), Duration::from_millis(20)).unwrap()
}

/// The writer the gateway used before, as it was set up, over a sink.
fn appender() -> (
    tracing_appender::non_blocking::NonBlocking,
    tracing_appender::non_blocking::WorkerGuard,
) {
    tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::sink(),
        ))
}

/// What shipped before: the default format without colours through the
/// appender's writer, spans filtered out as the gateway does.
fn before(turns: u32) -> Duration {
    use tracing_subscriber::Layer as _;
    let (writer, guard) = appender();
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(false)
        .with_filter(tracing_subscriber::filter::FilterExt::and(
            EnvFilter::new(DEFAULT_FILTER),
            tracing_subscriber::filter::filter_fn(|meta| !meta.is_span())
                .with_max_level_hint(tracing_subscriber::filter::LevelFilter::TRACE),
        ));
    run(turns, tracing_subscriber::registry().with(layer), || {
        drop(guard)
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.parse::<u32>().expect("TURNS ROUNDS"));
    let turns = args.next().unwrap_or(100_000);
    let rounds = args.next().unwrap_or(5);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    gateway_layer(turns / 10, batched(), DEFAULT_FILTER);
    let (mut w, mut s, mut l, mut b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        w.push(gateway_layer(turns, batched(), "warn"));
        s.push(gateway_layer(turns, batched(), DEFAULT_FILTER));
        // The lean line through the appender: the format's and the
        // writer's shares apart.
        l.push(gateway_layer(turns, appender(), DEFAULT_FILTER));
        b.push(before(turns));
    }
    let (w, s, l, b) = (median(w), median(s), median(l), median(b));
    let ns = |d: Duration| d.as_nanos();
    println!("{turns} small turns through Failover per run, {rounds} interleaved rounds, medians;");
    println!("CPU time per turn (process, every thread), the log's cost against `warn`:");
    println!("  warn (no line)                        {:>7} ns", ns(w));
    println!(
        "  shipped (lean line, batching writer)  {:>7} ns   log {:>6} ns  ({:.2}x warn)",
        ns(s),
        ns(s).saturating_sub(ns(w)),
        s.as_secs_f64() / w.as_secs_f64()
    );
    println!(
        "  lean line, appender's writer         {:>7} ns   log {:>6} ns  ({:.2}x warn)",
        ns(l),
        ns(l).saturating_sub(ns(w)),
        l.as_secs_f64() / w.as_secs_f64()
    );
    println!(
        "  before (default format, appender)    {:>7} ns   log {:>6} ns  ({:.2}x warn)",
        ns(b),
        ns(b).saturating_sub(ns(w)),
        b.as_secs_f64() / w.as_secs_f64()
    );
    let (log, target) = (ns(s).saturating_sub(ns(w)), 2_000);
    println!(
        "issue 29's target, one log line per turn at most 2 µs of CPU: {log} ns: {}",
        if log <= target { "met" } else { "missed" }
    );
}
