//! Memory bounded per request: a 4 MiB request body (an array of 2M small
//! elements, inside `messages` itself and beside it) costs at most about 3x
//! its size at peak, on the chat and the Messages routes, through the whole
//! gateway (hyper server, limits, body read, the dialect's one parse, the
//! spliced upstream body, the upstream client) and back.
//!
//! Counted with a counting global allocator (`allocation-counter`, which
//! counts per thread): client, gateway and upstream all run on one
//! current-thread runtime inside the measurement, so every allocation of
//! the request's path is on this thread. The client's own copy of the
//! body is made before the measurement starts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower_llm_gateway::app;

const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
const MESSAGE: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}"#;

/// An upstream that reads the request body frame by frame without keeping
/// it, then answers a small completion.
async fn discard_upstream() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                    let request_path = request.uri().path().to_owned();
                    let mut body = request.into_body();
                    let mut seen = 0usize;
                    while let Some(Ok(frame)) = body.frame().await {
                        seen += frame.data_ref().map_or(0, Bytes::len);
                    }
                    assert!(seen > 4_000_000, "the whole body reached the upstream");
                    let answer = if request_path.ends_with("/messages") {
                        MESSAGE
                    } else {
                        COMPLETION
                    };
                    let mut response =
                        Response::new(Full::new(Bytes::from_static(answer.as_bytes())));
                    response.headers_mut().insert(
                        "content-type",
                        http::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, Infallible>(response)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, task)
}

/// Where the 2M-element bulk sits in the body.
#[derive(Clone, Copy, Debug)]
enum Bulk {
    /// `"messages": [{…}, 1, 1, …]`: every element is a message the
    /// request reader walks.
    InMessages,
    /// `"messages": [{"role":"user","content":[{…}, 1, 1, …]}]`: every
    /// element is a content part or block.
    InContent,
    /// A field beside `messages` that nothing reads.
    Beside,
}

fn big_body(bulk: Bulk) -> Bytes {
    // 2M elements of `1,`: 4 MB of array.
    let mut body = String::with_capacity(4_100_000);
    body.push_str(r#"{"model":"m","max_tokens":16,"#);
    match bulk {
        Bulk::InMessages => body.push_str(r#""messages":[{"role":"user","content":"hi"}"#),
        Bulk::InContent => {
            body.push_str(r#""messages":[{"role":"user","content":[{"type":"text","text":"hi"}"#)
        }
        Bulk::Beside => {
            body.push_str(r#""messages":[{"role":"user","content":"hi"}],"metadata_blob":["#)
        }
    }
    for i in 0..2_000_000 {
        if i > 0 || !matches!(bulk, Bulk::Beside) {
            body.push(',');
        }
        body.push('1');
    }
    match bulk {
        Bulk::InContent => body.push_str("]}]}"),
        _ => body.push_str("]}"),
    }
    Bytes::from(body)
}

/// Sends `body` to `path` of a gateway whose one provider speaks `dialect`,
/// and asserts the request's whole path peaked at no more than 3x the body.
fn peak_is_at_most_3x(path: &str, dialect: &str, bulk: Bulk) {
    let body = big_body(bulk);
    let size = body.len();
    assert!(size >= 4_000_000);
    assert!(
        serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok(),
        "the body is JSON"
    );
    let mut status = None;
    let info = allocation_counter::measure(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        status = Some(runtime.block_on(async {
            let (upstream, upstream_task) = discard_upstream().await;
            let config = format!(
                r#"
listen = "127.0.0.1:0"
[failover]
max_request_bytes = 8388608
[[providers]]
name = "p"
base_url = "http://{upstream}/v1"
dialect = "{dialect}"
"#
            );
            let config = app::Config::from_toml(&config).unwrap();
            let gateway = app::Gateway::from_config(&config).unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let running = app::serve(gateway, listener);
            let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let request = Request::post(format!("http://{}{path}", running.addr))
                .header("content-type", "application/json")
                .body(Full::new(body.clone()))
                .unwrap();
            let response = client.request(request).await.unwrap();
            let status = response.status();
            let answer = response.into_body().collect().await.unwrap().to_bytes();
            assert!(answer.starts_with(b"{"), "{answer:?}");
            running.shutdown(std::time::Duration::from_secs(5)).await;
            upstream_task.abort();
            status
        }));
    });
    assert_eq!(status, Some(http::StatusCode::OK), "{path} {bulk:?}");
    let ratio = info.bytes_max as f64 / size as f64;
    println!(
        "{path} {bulk:?}: request body {size} bytes; peak {} bytes ({ratio:.2}x); {} allocations",
        info.bytes_max, info.count_total
    );
    assert!(
        info.bytes_max <= 3 * size as u64,
        "{path} {bulk:?}: peak {} bytes is {ratio:.2}x the {size}-byte body",
        info.bytes_max
    );
}

#[test]
fn a_4_mib_body_costs_at_most_3x_its_size_at_peak() {
    peak_is_at_most_3x("/v1/chat/completions", "openai", Bulk::Beside);
}

#[test]
fn a_4_mib_messages_array_costs_at_most_3x_on_the_chat_route() {
    peak_is_at_most_3x("/v1/chat/completions", "openai", Bulk::InMessages);
    peak_is_at_most_3x("/v1/chat/completions", "openai", Bulk::InContent);
}

#[test]
fn a_4_mib_messages_array_costs_at_most_3x_on_the_messages_route() {
    peak_is_at_most_3x("/v1/messages", "anthropic", Bulk::InMessages);
    peak_is_at_most_3x("/v1/messages", "anthropic", Bulk::InContent);
    peak_is_at_most_3x("/v1/messages", "anthropic", Bulk::Beside);
}
