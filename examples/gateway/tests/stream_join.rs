//! The commit body joins the events of one upstream read into few client
//! writes, over real HTTP on both sides: hyper's client hands its body over
//! one chunk at a time, and hyper's server polls a pending body twice per
//! task poll, which together once made the join a no-op (one write per
//! event). Also under the gateway's `Repoll`, which polls a connection
//! that woke itself again at once, and which a plain self-wake in the join
//! would defeat.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_client::UpstreamClient;
use tower_llm_failover::BoxError;
use tower_llm_failover::stream::StreamStateLayer;
use tower_llm_gateway::repoll::Repoll;
use tower_llm_testing::chunks;

const LIMIT: Duration = Duration::from_secs(10);
const TOKENS: usize = 100;

/// An upstream that answers one request with a whole stream, one HTTP chunk
/// per event, in a single write: the gateway reads it all at once.
async fn upstream_in_one_write(events: Vec<Bytes>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        // The request: read up to the end of its head and its short body.
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "request cut short");
            seen.extend_from_slice(&buf[..n]);
        }
        let mut answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_vec();
        for event in &events {
            answer.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
            answer.extend_from_slice(event);
            answer.extend_from_slice(b"\r\n");
        }
        answer.extend_from_slice(b"0\r\n\r\n");
        socket.write_all(&answer).await.unwrap();
        // Keep the connection open until the client is done with it.
        let _ = socket.read(&mut buf).await;
    });
    format!("http://{addr}/v1")
}

/// How the test's server polls each connection.
#[derive(Clone, Copy)]
enum Server {
    /// axum's own `serve`.
    Axum,
    /// hyper's HTTP/1 connection in the gateway's `Repoll`, which polls a
    /// connection that woke itself again at once: the commit body's yield
    /// must still let the upstream connection's task run.
    Repoll,
}

/// Serves `service` on loopback; returns its address.
async fn serve<S>(service: S, server: Server) -> std::net::SocketAddr
where
    S: tower::Service<
            Request<axum::body::Body>,
            Response = Response<axum::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    match server {
        Server::Axum => {
            let app = axum::Router::new().route_service("/v1/chat/completions", service);
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        }
        Server::Repoll => {
            tokio::spawn(async move {
                loop {
                    let (tcp, _) = listener.accept().await.unwrap();
                    let service =
                        hyper_util::service::TowerToHyperService::new(service.clone().map_request(
                            |r: Request<hyper::body::Incoming>| r.map(axum::body::Body::new),
                        ));
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
                    tokio::spawn(Repoll::new(conn));
                }
            });
        }
    }
    addr
}

// One worker: the runtime the gateway ships with, made deterministic.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn events_of_one_upstream_read_go_out_in_few_frames() {
    events_read_at_once_go_out_in_few_frames(Server::Axum).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_join_holds_under_the_gateways_repoll() {
    events_read_at_once_go_out_in_few_frames(Server::Repoll).await;
}

async fn events_read_at_once_go_out_in_few_frames(server: Server) {
    let events = chunks::full_stream("m", TOKENS);
    let base_url = upstream_in_one_write(events.clone()).await;
    let client = UpstreamClient::builder(base_url).build().unwrap();
    let stack = ServiceBuilder::new()
        .layer(StreamStateLayer::new())
        .service(client);

    // Served by hyper's server, with every frame the commit body hands it
    // counted.
    let frames = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&frames);
    let service = tower::service_fn(move |request: Request<axum::body::Body>| {
        let stack = stack.clone();
        let counted = Arc::clone(&counted);
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await?.to_bytes();
            let response = stack
                .oneshot(Request::from_parts(parts, Full::new(body)))
                .await?;
            Ok::<_, BoxError>(response.map(|body| {
                axum::body::Body::new(body.map_frame(move |frame| {
                    counted.fetch_add(1, Ordering::Relaxed);
                    frame
                }))
            }))
        }
    });
    let service =
        service.map_err(|e: BoxError| -> std::convert::Infallible { panic!("stack: {e}") });
    let addr = serve(service, server).await;

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let response: Response<_> = tokio::time::timeout(LIMIT, client.request(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    let received = tokio::time::timeout(LIMIT, response.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();

    let sent: Vec<u8> = events.iter().flat_map(|e| e.iter().copied()).collect();
    assert_eq!(received, sent, "the client gets the upstream's bytes");
    let frames = frames.load(Ordering::Relaxed);
    // 103 events (role, 100 tokens, finish, [DONE]); at most 64 join.
    assert!(
        frames <= 6,
        "{frames} frames for {} events read at once",
        events.len()
    );
}
