//! `UpstreamClient` over real sockets on 127.0.0.1: a tiny hyper server
//! echoes what it received (method, path, headers, body).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_llm_client::{Auth, ClientError, SendError, UpstreamClient};
use tower_llm_failover::{FailureClass, Phase, classify::Classifier, classify::ClassifyLayer};

const RATE_LIMIT: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 199434, Requested 2299. Please try again in 519ms.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;

struct Echo {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    nodelay: Arc<AtomicUsize>,
}

/// Answers every request with a JSON echo of it; `/v1/ratelimit` answers
/// OpenAI's 429 instead.
async fn echo_server() -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let nodelay = Arc::new(AtomicUsize::new(0));
    let (c, n) = (Arc::clone(&connections), Arc::clone(&nodelay));
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            c.fetch_add(1, Ordering::SeqCst);
            stream.set_nodelay(true).unwrap();
            if stream.nodelay().unwrap() {
                n.fetch_add(1, Ordering::SeqCst);
            }
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(echo))
                    .await;
            });
        }
    });
    Echo {
        addr,
        connections,
        nodelay,
    }
}

async fn echo(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    if parts.uri.path() == "/v1/ratelimit" {
        let mut response = Response::new(Full::new(Bytes::from_static(RATE_LIMIT.as_bytes())));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response
            .headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        return Ok(response);
    }
    let mut headers = serde_json::Map::new();
    for name in parts.headers.keys() {
        let values: Vec<Value> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| Value::from(v.to_str().unwrap()))
            .collect();
        headers.insert(name.as_str().to_owned(), Value::Array(values));
    }
    let echo = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.to_string(),
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    });
    Ok(Response::new(Full::new(Bytes::from(echo.to_string()))))
}

/// An upstream written by hand: for each connection (numbered from 0,
/// counted in the returned count) it reads the request, writes
/// `answer(n).0`, holds the connection for `answer(n).1`, then closes it.
async fn scripted_upstream(
    answer: fn(usize) -> (&'static [u8], std::time::Duration),
) -> (u16, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let (bytes, hold) = answer(count.fetch_add(1, Ordering::SeqCst));
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(bytes).await;
                tokio::time::sleep(hold).await;
            });
        }
    });
    (port, accepted)
}

/// A client of `server` with the builder's defaults.
fn client_of(server: &Echo) -> UpstreamClient {
    UpstreamClient::builder(format!("http://127.0.0.1:{}/v1", server.addr.port()))
        .build()
        .unwrap()
}

async fn send(client: &UpstreamClient, request: Request<Full<Bytes>>) -> Value {
    let response = client.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

fn chat(path: &str) -> http::request::Builder {
    Request::post(path).header("content-type", "application/json")
}

fn header<'a>(echo: &'a Value, name: &str) -> Option<Vec<&'a str>> {
    echo["headers"][name]
        .as_array()
        .map(|vs| vs.iter().map(|v| v.as_str().unwrap()).collect())
}

#[tokio::test]
async fn request_paths_join_onto_the_base_url() {
    let server = echo_server().await;
    let port = server.addr.port();
    let body = || Full::new(Bytes::from_static(b"{}"));
    for base in [
        format!("http://127.0.0.1:{port}/v1"),
        format!("http://127.0.0.1:{port}/v1/"),
    ] {
        let client = UpstreamClient::builder(&base).build().unwrap();
        for (path, want) in [
            ("/v1/chat/completions", "/v1/chat/completions"),
            ("/chat/completions", "/v1/chat/completions"),
            (
                "/v1/chat/completions?a=1&b=2",
                "/v1/chat/completions?a=1&b=2",
            ),
            ("/v1/models", "/v1/models"),
        ] {
            let echo = send(&client, chat(path).body(body()).unwrap()).await;
            assert_eq!(echo["path"], want, "base {base}, request {path}");
            assert_eq!(echo["method"], "POST");
            assert_eq!(echo["body"], "{}");
        }
    }

    // A base URL with a path and a query of its own (Azure's api-version).
    let client = UpstreamClient::builder(format!(
        "http://127.0.0.1:{port}/openai/deployments/gpt4o?api-version=2024-06-01"
    ))
    .build()
    .unwrap();
    let echo = send(
        &client,
        chat("/v1/chat/completions?trace=1").body(body()).unwrap(),
    )
    .await;
    assert_eq!(
        echo["path"],
        "/openai/deployments/gpt4o/chat/completions?api-version=2024-06-01&trace=1"
    );
}

#[tokio::test]
async fn the_clients_credentials_are_replaced_by_the_targets() {
    let server = echo_server().await;
    let base = format!("http://127.0.0.1:{}/v1", server.addr.port());
    let client_request = || {
        chat("/v1/chat/completions")
            .header("authorization", "Bearer sk-client-key")
            .header("x-api-key", "client-x-api-key")
            .header("api-key", "client-api-key")
            .header("x-goog-api-key", "client-goog-key")
            .header("proxy-authorization", "Basic Y2xpZW50")
            .header("cookie", "session=client")
            .header("x-tenant-token", "tenant-secret")
            .header("user-agent", "OpenAI/Python 1.99.0")
            .header("openai-beta", "assistants=v2")
            .body(Full::new(Bytes::from_static(br#"{"model":"m"}"#)))
            .unwrap()
    };

    let bearer = UpstreamClient::builder(&base)
        .auth(Auth::bearer("sk-target-key"))
        .strip_header(http::HeaderName::from_static("x-tenant-token"))
        .build()
        .unwrap();
    let echo = send(&bearer, client_request()).await;
    assert_eq!(
        header(&echo, "authorization"),
        Some(vec!["Bearer sk-target-key"])
    );
    for gone in [
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "proxy-authorization",
        "cookie",
        "x-tenant-token",
    ] {
        assert_eq!(header(&echo, gone), None, "{gone} reached the upstream");
    }
    assert_eq!(
        header(&echo, "user-agent"),
        Some(vec!["OpenAI/Python 1.99.0"])
    );
    assert_eq!(header(&echo, "openai-beta"), Some(vec!["assistants=v2"]));
    assert_eq!(
        header(&echo, "content-type"),
        Some(vec!["application/json"])
    );

    // Anthropic-style key: no Authorization at all, the target's x-api-key.
    let anthropic = UpstreamClient::builder(&base)
        .auth(Auth::x_api_key("sk-ant-target"))
        .build()
        .unwrap();
    let echo = send(&anthropic, client_request()).await;
    assert_eq!(header(&echo, "authorization"), None);
    assert_eq!(header(&echo, "x-api-key"), Some(vec!["sk-ant-target"]));
    assert_eq!(header(&echo, "api-key"), None);

    // Azure-style key.
    let azure = UpstreamClient::builder(&base)
        .auth(Auth::api_key("azure-target"))
        .build()
        .unwrap();
    let echo = send(&azure, client_request()).await;
    assert_eq!(header(&echo, "api-key"), Some(vec!["azure-target"]));
    assert_eq!(header(&echo, "authorization"), None);
    assert_eq!(header(&echo, "x-api-key"), None);

    // No credential: the client's is still never forwarded.
    let none = UpstreamClient::builder(&base).build().unwrap();
    let echo = send(&none, client_request()).await;
    assert_eq!(header(&echo, "authorization"), None);
    assert_eq!(header(&echo, "x-api-key"), None);
}

#[tokio::test]
async fn hop_by_hop_headers_are_dropped_and_host_is_the_targets() {
    let server = echo_server().await;
    let port = server.addr.port();
    let client = UpstreamClient::builder(format!("http://127.0.0.1:{port}/v1"))
        .build()
        .unwrap();
    let request = chat("/v1/chat/completions")
        .version(http::Version::HTTP_2) // what the client spoke to the gateway
        .header("host", "gateway.example")
        .header("connection", "keep-alive, x-hop-named")
        .header("x-hop-named", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-connection", "keep-alive")
        .header("te", "trailers")
        .header("trailer", "x-checksum")
        .header("upgrade", "websocket")
        .header("accept-encoding", "gzip, br")
        .header("content-length", "999")
        .header("x-request-id", "abc")
        .body(Full::new(Bytes::from_static(br#"{"model":"m"}"#)))
        .unwrap();
    let echo = send(&client, request).await;
    for gone in [
        "connection",
        "x-hop-named",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "transfer-encoding",
        "accept-encoding",
    ] {
        assert_eq!(header(&echo, gone), None, "{gone} reached the upstream");
    }
    let host = format!("127.0.0.1:{port}");
    assert_eq!(header(&echo, "host"), Some(vec![host.as_str()]));
    // The stale client length is replaced by the body's real one.
    assert_eq!(header(&echo, "content-length"), Some(vec!["13"]));
    assert_eq!(header(&echo, "x-request-id"), Some(vec!["abc"]));
    assert_eq!(echo["version"], "HTTP/1.1");
}

#[tokio::test]
async fn connections_are_pooled_and_set_tcp_nodelay() {
    let server = echo_server().await;
    let client = client_of(&server);
    for _ in 0..5 {
        let echo = send(&client, chat("/v1/models").body(Full::default()).unwrap()).await;
        assert_eq!(echo["path"], "/v1/models");
    }
    // Five sequential requests, one connection: the pool reused it.
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    assert_eq!(server.nodelay.load(Ordering::SeqCst), 1);
}

/// Two requests in flight at once take two connections; both go back to
/// the pool, and the next two reuse them.
#[tokio::test]
async fn requests_in_flight_together_each_take_a_connection_and_all_are_reused() {
    let server = echo_server().await;
    let client = client_of(&server);
    for _ in 0..3 {
        let (a, b) = tokio::join!(
            send(&client, chat("/v1/a").body(Full::default()).unwrap()),
            send(&client, chat("/v1/b").body(Full::default()).unwrap()),
        );
        assert_eq!(
            (a["path"].as_str(), b["path"].as_str()),
            (Some("/v1/a"), Some("/v1/b"))
        );
    }
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);
}

/// A connection is back in the pool as soon as its response body has been
/// read to the end: no task is left waiting to return it, and the next
/// request takes it.
#[tokio::test]
async fn a_connection_is_back_in_the_pool_once_its_body_is_read() {
    let server = echo_server().await;
    let client = client_of(&server);
    let metrics = tokio::runtime::Handle::current().metrics();
    for round in 0..3 {
        send(&client, chat("/v1/models").body(Full::default()).unwrap()).await;
        // The server's accept loop, its connection, and the client's
        // connection: nothing else (a task per request returning its
        // connection would be a fourth).
        assert_eq!(metrics.num_alive_tasks(), 3, "round {round}");
    }
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
}

/// A body read until hyper says it has ended, and dropped without being
/// polled past its end (as a server writing it does), still hands its
/// connection back: the next request takes it.
#[tokio::test]
async fn a_body_dropped_at_its_end_hands_its_connection_back() {
    let server = echo_server().await;
    let client = client_of(&server);
    for round in 0..3 {
        let response = client
            .clone()
            .oneshot(chat("/v1/models").body(Full::default()).unwrap())
            .await
            .unwrap();
        let mut body = response.into_body();
        let mut read = Vec::new();
        while !http_body::Body::is_end_stream(&body) {
            let frame = body.frame().await.unwrap().unwrap();
            read.extend_from_slice(&frame.into_data().unwrap());
        }
        drop(body);
        let echo: Value = serde_json::from_slice(&read).unwrap();
        assert_eq!(echo["path"], "/v1/models", "round {round}");
    }
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
}

/// A response dropped before its body was read leaves its connection out
/// of the list while the rest of the body is still due: the next request
/// goes out on another connection and is answered whole.
#[tokio::test]
async fn a_body_dropped_before_its_end_does_not_lend_its_connection() {
    // The first connection: half the body, then nothing for longer than
    // the test.
    let (port, accepted) = scripted_upstream(|n| match n {
        0 => (
            b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nha",
            std::time::Duration::from_secs(30),
        ),
        _ => (
            b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ndone",
            std::time::Duration::ZERO,
        ),
    })
    .await;
    let client = UpstreamClient::builder(format!("http://127.0.0.1:{port}/v1"))
        .build()
        .unwrap();
    let half = client
        .clone()
        .oneshot(chat("/v1/models").body(Full::default()).unwrap())
        .await
        .unwrap();
    drop(half);
    let whole = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        client
            .clone()
            .oneshot(chat("/v1/models").body(Full::default()).unwrap()),
    )
    .await
    .expect("answered in time")
    .unwrap();
    let body = whole.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"done");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

/// With no idle connection kept, every request connects anew.
#[tokio::test]
async fn no_idle_connection_is_kept_when_the_cap_is_zero() {
    let server = echo_server().await;
    let client = UpstreamClient::builder(format!("http://127.0.0.1:{}/v1", server.addr.port()))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for _ in 0..3 {
        send(&client, chat("/v1/models").body(Full::default()).unwrap()).await;
    }
    assert_eq!(server.connections.load(Ordering::SeqCst), 3);
}

/// A connection idle longer than the idle timeout is not reused.
#[tokio::test]
async fn a_connection_idle_past_the_timeout_is_not_reused() {
    let server = echo_server().await;
    let client = UpstreamClient::builder(format!("http://127.0.0.1:{}/v1", server.addr.port()))
        .pool_idle_timeout(std::time::Duration::from_millis(50))
        .build()
        .unwrap();
    send(&client, chat("/v1/models").body(Full::default()).unwrap()).await;
    send(&client, chat("/v1/models").body(Full::default()).unwrap()).await;
    assert_eq!(
        server.connections.load(Ordering::SeqCst),
        1,
        "reused in time"
    );
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    send(&client, chat("/v1/models").body(Full::default()).unwrap()).await;
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);
}

/// The upstream closes a kept-alive connection while it is idle in the
/// pool: the next request goes out on a new connection and is answered.
#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_not_used() {
    // Kept alive by its answer, then closed without a word.
    let (port, accepted) = scripted_upstream(|_| {
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            std::time::Duration::ZERO,
        )
    })
    .await;
    let client = UpstreamClient::builder(format!("http://127.0.0.1:{port}/v1"))
        .build()
        .unwrap();
    for round in 0..3 {
        let response = client
            .clone()
            .oneshot(chat("/v1/models").body(Full::default()).unwrap())
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
        // The close has arrived by the next round, or arrives as it sends.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

/// The upstream reads the request and closes without a head: the request
/// was sent, so the failure may have reached the provider (never "before
/// send", which would make a reroute look free).
#[tokio::test]
async fn a_request_written_then_cut_before_the_head_may_have_reached_the_provider() {
    use tokio::io::AsyncReadExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = socket.read(&mut buf).await;
    });
    let client = UpstreamClient::builder(format!("http://127.0.0.1:{port}/v1"))
        .build()
        .unwrap();
    let error = client
        .oneshot(
            chat("/v1/chat/completions")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, SendError::Http(_)), "{error:?}");
    assert!(!error.is_connect());
    let c = Classifier::default().classify_transport(Some("primary"), &error, false);
    assert_eq!(
        (c.class, c.phase),
        (FailureClass::Connect, Phase::Head),
        "{c}"
    );
    assert!(c.phase.may_have_reached_provider());
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_failure_before_send() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut client = UpstreamClient::builder(format!("http://127.0.0.1:{port}/v1"))
        .build()
        .unwrap();
    let request = chat("/v1/chat/completions")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    // poll_ready is always ready; the failure comes from the future.
    // The service takes any body type: name it for `ready()`.
    let ready = ServiceExt::<Request<Full<Bytes>>>::ready(&mut client).await;
    let error = ready.unwrap().call(request).await.unwrap_err();
    assert!(error.is_connect());
    // A plain-`http` target is pooled by the client itself: its error
    // says the request was not sent.
    assert!(matches!(error, SendError::NotSent(_)), "{error:?}");
    assert!(error.transport().is_none());

    let c = Classifier::default().classify_transport(Some("primary"), &error, false);
    assert_eq!(c.class, FailureClass::Connect);
    assert_eq!(c.phase, Phase::BeforeSend);
    assert!(!c.phase.may_have_reached_provider());
}

#[tokio::test]
async fn it_sits_under_classify_layer() {
    let server = echo_server().await;
    let base = format!("http://127.0.0.1:{}/v1", server.addr.port());
    let client = UpstreamClient::builder(&base).build().unwrap();
    let service = ServiceBuilder::new()
        .layer(ClassifyLayer::new().provider("primary"))
        .service(client);

    let ok = service
        .clone()
        .oneshot(chat("/v1/chat/completions").body(Full::default()).unwrap())
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);

    let error = service
        .clone()
        .oneshot(chat("/v1/ratelimit").body(Full::default()).unwrap())
        .await
        .unwrap_err();
    assert_eq!(error.classification().class, FailureClass::RateLimited);
    assert_eq!(error.classification().phase, Phase::Head);
    assert_eq!(error.provider(), Some("primary"));

    // A transport failure under the layer keeps its class and phase.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let closed = ServiceBuilder::new()
        .layer(ClassifyLayer::new().provider("down"))
        .service(
            UpstreamClient::builder(format!("http://127.0.0.1:{port}/v1"))
                .build()
                .unwrap(),
        );
    let error = closed
        .oneshot(chat("/v1/chat/completions").body(Full::default()).unwrap())
        .await
        .unwrap_err();
    assert_eq!(error.classification().class, FailureClass::Connect);
    assert_eq!(error.classification().phase, Phase::BeforeSend);
}

#[test]
fn bad_base_urls_fail_to_build() {
    for (url, check) in [
        ("ftp://127.0.0.1/v1", "scheme"),
        ("127.0.0.1:9101/v1", "invalid"),
        ("http://user:sk-secret@127.0.0.1/v1", "credentials"),
    ] {
        let error = UpstreamClient::builder(url).build().unwrap_err();
        let text = error.to_string();
        assert!(!text.contains("sk-secret"), "{text}");
        match check {
            "scheme" => assert!(matches!(error, ClientError::UnsupportedScheme(_))),
            "credentials" => assert!(matches!(error, ClientError::CredentialsInUrl)),
            _ => assert!(
                matches!(
                    error,
                    ClientError::InvalidBaseUrl(_) | ClientError::UnsupportedScheme(_)
                ),
                "{error:?}"
            ),
        }
    }
    let error = UpstreamClient::builder("http://127.0.0.1/v1")
        .auth(Auth::bearer("sk-x\nInjected: 1"))
        .build()
        .unwrap_err();
    assert!(matches!(error, ClientError::InvalidCredential));
}
