//! What the gateway stack costs on the wire, measured against a bare
//! pass-through proxy in the same run.
//!
//! One process on loopback runs the fake upstream, a bare hyper
//! pass-through proxy (no inspection; the same upstream client, the same
//! axum server and socket settings), and the gateway's stack in
//! front of the same upstream. Each is driven with the same concurrent load
//! — small non-streaming completions, then 100-token streams — and the
//! bench prints requests per second and p50/p99 latency for each, and the
//! gateway's added latency and throughput as ratios against the bare proxy.
//!
//! `cargo bench -p tower-llm-gateway --bench gateway_overhead` (`-- --seconds N --concurrency C
//! --workload 1|2`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower::ServiceExt;
use tower_llm_client::UpstreamClient;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;

/// A proxy that forwards every request to the upstream and streams the
/// answer back untouched.
async fn bare_proxy(upstream: UpstreamClient) -> SocketAddr {
    use axum::serve::ListenerExt;
    let app = axum::Router::new().fallback(move |request: Request| {
        let upstream = upstream.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            match upstream
                .oneshot(http::Request::from_parts(parts, Full::new(body)))
                .await
            {
                Ok(response) => response.map(Body::new),
                Err(_) => http::Response::builder()
                    .status(502)
                    .body(Body::empty())
                    .unwrap(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

struct Load {
    rps: f64,
    p50: Duration,
    p99: Duration,
    errors: usize,
}

/// `concurrency` workers send `body` to `addr` for `seconds`, each reading
/// the whole answer; latency is request to last byte.
async fn drive(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    body: &Bytes,
    concurrency: usize,
    seconds: f64,
) -> Load {
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let client = client.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0;
                while Instant::now() < until {
                    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
                        .header("content-type", "application/json")
                        .body(Full::new(body.clone()))
                        .unwrap();
                    let sent = Instant::now();
                    let ok = match client.request(request).await {
                        Ok(response) => {
                            let ok = response.status().is_success();
                            response.into_body().collect().await.is_ok() && ok
                        }
                        Err(_) => false,
                    };
                    if ok {
                        latencies.push(sent.elapsed());
                    } else {
                        errors += 1;
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (l, e) = worker.await.unwrap();
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Load {
        rps: latencies.len() as f64 / elapsed,
        p50: at(0.50),
        p99: at(0.99),
        errors,
    }
}

fn arg(name: &str, default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes --bench; other flags are ours.
    let seconds = arg("--seconds", 4.0);
    let concurrency = arg("--concurrency", 16.0) as usize;
    // `--workload 1` or `2` runs one workload only (for profiling).
    let only = arg("--workload", 0.0) as usize;

    let upstream = FakeUpstream::builder("upstream")
        .tokens(100)
        .start()
        .await
        .unwrap();
    let client_for_proxy = UpstreamClient::builder(upstream.base_url())
        .build()
        .unwrap();
    let bare = bare_proxy(client_for_proxy).await;

    let config = app::Config::from_toml(&format!(
        r#"
[[providers]]
name = "upstream"
base_url = "{}"
"#,
        upstream.base_url()
    ))
    .unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = app::serve(gateway, listener);

    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency * 2)
        .build(connector);

    let workloads = [
        (
            "small completion (8 tokens, JSON)",
            r#"{"model":"m#fault:tokens=8","messages":[{"role":"user","content":"hi"}]}"#,
        ),
        (
            "100-token stream (SSE)",
            r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        ),
    ];
    println!(
        "gateway overhead: {concurrency} concurrent clients, {seconds} s per run, loopback, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for (i, (name, body)) in workloads.into_iter().enumerate() {
        if only != 0 && only != i + 1 {
            continue;
        }
        let body = Bytes::from_static(body.as_bytes());
        // Warm both paths (connections, pools, caches).
        drive(&client, bare, &body, concurrency, 0.5).await;
        drive(&client, gateway.addr, &body, concurrency, 0.5).await;
        // Interleave runs so drift hits both alike; keep the best of two.
        let mut bare_runs = Vec::new();
        let mut gateway_runs = Vec::new();
        for _ in 0..2 {
            bare_runs.push(drive(&client, bare, &body, concurrency, seconds / 2.0).await);
            gateway_runs
                .push(drive(&client, gateway.addr, &body, concurrency, seconds / 2.0).await);
        }
        let best = |runs: Vec<Load>| {
            runs.into_iter()
                .max_by(|a, b| a.rps.total_cmp(&b.rps))
                .unwrap()
        };
        let (b, g) = (best(bare_runs), best(gateway_runs));
        println!("\n{name}");
        println!(
            "  {:<22} {:>9} {:>10} {:>10} {:>7}",
            "", "req/s", "p50 µs", "p99 µs", "errors"
        );
        for (label, l) in [("bare pass-through", &b), ("gateway stack", &g)] {
            println!(
                "  {label:<22} {:>9.0} {:>10.0} {:>10.0} {:>7}",
                l.rps,
                micros(l.p50),
                micros(l.p99),
                l.errors
            );
        }
        println!(
            "  added latency: p50 {:+.0} µs, p99 {:+.0} µs; throughput {:.3}x the bare pass-through",
            micros(g.p50) - micros(b.p50),
            micros(g.p99) - micros(b.p99),
            g.rps / b.rps
        );
    }
    gateway.shutdown(Duration::from_secs(1)).await;
}
