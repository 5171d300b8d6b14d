//! `UpstreamClient` over TLS, end to end on 127.0.0.1: a test CA made with
//! rcgen, the fake upstream serving HTTPS (tokio-rustls), HTTP/2 by ALPN
//! and the HTTP/1.1 fallback, client certificates, a CONNECT proxy, and
//! the classification of each way a connection check fails.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

#[path = "../../tests/support/tls.rs"]
mod support;

use std::time::Duration;
use tower_llm_failover::classify::Note;

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body_util::{BodyExt as _, Full};
use support::{Ca, Proxy, ProxyMode, Scratch, server_config};
use tower::ServiceExt as _;
use tower_llm_client::ResponseBody;
use tower_llm_client::{SendError, UpstreamClient, UpstreamClientBuilder};
use tower_llm_failover::{FailureClass, Phase, classify::Classification, classify::Classifier};
use tower_llm_testing::upstream::FakeUpstream;

/// Every wait in this file is bounded by this.
const LIMIT: Duration = Duration::from_secs(10);

fn chat() -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"fake-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap()
}

async fn send(client: &UpstreamClient) -> Result<Response<ResponseBody>, SendError> {
    tokio::time::timeout(LIMIT, client.clone().oneshot(chat()))
        .await
        .expect("the client answers in time")
}

/// The whole streamed answer as text.
async fn read_all(response: Response<ResponseBody>) -> String {
    let bytes = tokio::time::timeout(LIMIT, response.into_body().collect())
        .await
        .expect("the body ends in time")
        .unwrap()
        .to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn assert_whole_answer(body: &str, name: &str) {
    assert_eq!(body.matches(&format!("{name}-tok")).count(), 8, "{body}");
    assert!(body.contains("\"finish_reason\":\"stop\""), "{body}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
}

fn classify(error: &SendError) -> Classification {
    Classifier::default().classify_transport(Some("tls"), error, false)
}

/// A CA, a 127.0.0.1 server certificate, and the CA file.
struct Pki {
    dir: Scratch,
    ca: Ca,
    ca_file: std::path::PathBuf,
}

fn pki() -> Pki {
    let dir = Scratch::new();
    let ca = Ca::new("tower-llm-failover test CA");
    let ca_file = dir.write("ca.pem", &ca.pem());
    Pki { dir, ca, ca_file }
}

async fn tls_upstream(pki: &Pki, names: &[&str], alpn: &[&[u8]]) -> FakeUpstream {
    let leaf = pki.ca.leaf(names, false);
    FakeUpstream::builder("tls")
        .tls(server_config(&leaf, None, alpn))
        .start()
        .await
        .unwrap()
}

fn builder(upstream: &FakeUpstream) -> UpstreamClientBuilder {
    UpstreamClient::builder(upstream.base_url()).connect_timeout(LIMIT)
}

#[tokio::test]
async fn a_private_ca_file_streams_a_whole_answer_over_http2() {
    let pki = pki();
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[]).await;
    assert!(upstream.base_url().starts_with("https://127.0.0.1:"));

    // Added to the webpki roots (the default) ...
    let client = builder(&upstream).ca_file(&pki.ca_file).build().unwrap();
    let response = send(&client).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), Version::HTTP_2);
    assert_whole_answer(&read_all(response).await, "tls");

    // ... or replacing them.
    let client = builder(&upstream)
        .webpki_roots(false)
        .ca_file(&pki.ca_file)
        .build()
        .unwrap();
    let response = send(&client).await.unwrap();
    assert_eq!(response.version(), Version::HTTP_2);
    assert_whole_answer(&read_all(response).await, "tls");
}

#[tokio::test]
async fn http1_is_the_fallback_when_either_side_does_not_offer_h2() {
    let pki = pki();
    // The server offers only http/1.1.
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[b"http/1.1"]).await;
    let client = builder(&upstream).ca_file(&pki.ca_file).build().unwrap();
    let response = send(&client).await.unwrap();
    assert_eq!(response.version(), Version::HTTP_11);
    assert_whole_answer(&read_all(response).await, "tls");

    // The client turns HTTP/2 off against a server offering both.
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[]).await;
    let client = builder(&upstream)
        .ca_file(&pki.ca_file)
        .http2(false)
        .build()
        .unwrap();
    let response = send(&client).await.unwrap();
    assert_eq!(response.version(), Version::HTTP_11);
    assert_whole_answer(&read_all(response).await, "tls");
}

#[tokio::test]
async fn concurrent_streams_share_one_http2_connection() {
    let pki = pki();
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[]).await;
    let client = builder(&upstream).ca_file(&pki.ca_file).build().unwrap();
    // The first request opens the connection and learns h2 by ALPN ...
    assert_whole_answer(&read_all(send(&client).await.unwrap()).await, "tls");
    // ... and eight concurrent streams then ride on it.
    let streams = (0..8).map(|_| {
        let client = client.clone();
        async move {
            let response = send(&client).await.unwrap();
            assert_eq!(response.version(), Version::HTTP_2);
            read_all(response).await
        }
    });
    for body in futures_util::future::join_all(streams).await {
        assert_whole_answer(&body, "tls");
    }
    assert_eq!(upstream.attempts(), 9);
    assert_eq!(upstream.connections(), 1);
}

#[tokio::test]
async fn without_the_ca_the_attempt_fails_as_connect_with_an_unknown_ca_message() {
    let pki = pki();
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[]).await;
    let client = builder(&upstream).build().unwrap();
    let error = send(&client).await.unwrap_err();
    assert!(error.is_connect());
    let c = classify(&error);
    assert_eq!(
        (c.class, c.phase),
        (FailureClass::Connect, Phase::BeforeSend)
    );
    assert_eq!(c.note, Some(Note::TlsUnknownCa));
    assert!(c.message.contains("unknown CA"), "{}", c.message);
    assert_eq!(upstream.attempts(), 0);
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    let pki = pki();
    let upstream = tls_upstream(&pki, &["other.example"], &[]).await;
    let client = builder(&upstream).ca_file(&pki.ca_file).build().unwrap();
    let error = send(&client).await.unwrap_err();
    let c = classify(&error);
    assert_eq!(
        (c.class, c.phase),
        (FailureClass::Connect, Phase::BeforeSend)
    );
    assert_eq!(c.note, Some(Note::TlsNameMismatch));
    assert!(
        c.message.contains("does not match the host name"),
        "{}",
        c.message
    );
    assert_eq!(upstream.attempts(), 0);
}

/// mTLS, once per HTTP version: the server's refusal comes at a different
/// moment (after the client's handshake for TLS 1.3, while hyper reads
/// the answer or the HTTP/2 preface).
async fn mtls(alpn: &[&[u8]], http2: bool) {
    let pki = pki();
    let client_ca = Ca::new("client CA");
    let leaf = pki.ca.leaf(&["127.0.0.1"], false);
    let upstream = FakeUpstream::builder("mtls")
        .tls(server_config(&leaf, Some(&client_ca), alpn))
        .start()
        .await
        .unwrap();

    let (cert, key) = client_ca.leaf(&["gateway"], true).write(&pki.dir, "client");
    let client = builder(&upstream)
        .ca_file(&pki.ca_file)
        .client_cert_files(&cert, &key)
        .http2(http2)
        .build()
        .unwrap();
    let response = send(&client).await.unwrap();
    assert_whole_answer(&read_all(response).await, "mtls");
    assert_eq!(upstream.attempts(), 1);

    let without = builder(&upstream)
        .ca_file(&pki.ca_file)
        .http2(http2)
        .build()
        .unwrap();
    let error = send(&without).await.unwrap_err();
    let c = classify(&error);

    assert_eq!(
        (c.class, c.phase),
        (FailureClass::Connect, Phase::BeforeSend)
    );
    assert_eq!(c.note, Some(Note::TlsClientCertificateRequired), "{c:?}");
    assert!(c.message.contains("client certificate"), "{}", c.message);

    // A certificate from a CA the server does not trust is rejected too.
    let stranger = Ca::new("stranger");
    let (cert, key) = stranger
        .leaf(&["gateway"], true)
        .write(&pki.dir, "stranger");
    let wrong = builder(&upstream)
        .ca_file(&pki.ca_file)
        .client_cert_files(&cert, &key)
        .http2(http2)
        .build()
        .unwrap();
    let c = classify(&send(&wrong).await.unwrap_err());
    assert_eq!(
        (c.class, c.phase),
        (FailureClass::Connect, Phase::BeforeSend)
    );
    assert_eq!(c.note, Some(Note::TlsClientCertificateRejected), "{c:?}");
    assert_eq!(upstream.attempts(), 1);
}

#[tokio::test]
async fn mtls_over_http2() {
    mtls(&[], true).await;
}

#[tokio::test]
async fn mtls_over_http1() {
    mtls(&[b"http/1.1"], false).await;
}

#[tokio::test]
async fn unreadable_trust_files_fail_the_build_with_the_path() {
    let pki = pki();
    let not_pem = pki.dir.write("not.pem", "hello");
    let error = UpstreamClient::builder("https://127.0.0.1:9/v1")
        .ca_file(&not_pem)
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("not.pem"), "{error}");

    let (cert, _key) = pki.ca.leaf(&["gateway"], true).write(&pki.dir, "c");
    let error = UpstreamClient::builder("https://127.0.0.1:9/v1")
        .client_cert_files(&cert, pki.dir.write("empty.key", ""))
        .build()
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("empty.key"), "{text}");
    // A key from another certificate does not fit.
    let (_, other_key) = pki.ca.leaf(&["other"], true).write(&pki.dir, "o");
    let error = UpstreamClient::builder("https://127.0.0.1:9/v1")
        .client_cert_files(&cert, &other_key)
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("o.key"), "{error}");
}

#[tokio::test]
async fn through_a_connect_proxy_one_connect_per_pooled_connection() {
    let pki = pki();
    let proxy = Proxy::start(ProxyMode::Tunnel).await;

    // HTTP/2: one connection, so one CONNECT, for every stream.
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[]).await;
    let client = builder(&upstream)
        .ca_file(&pki.ca_file)
        .proxy(proxy.url())
        .build()
        .unwrap();
    assert_whole_answer(&read_all(send(&client).await.unwrap()).await, "tls");
    let streams = (0..6).map(|_| {
        let client = client.clone();
        async move { read_all(send(&client).await.unwrap()).await }
    });
    for body in futures_util::future::join_all(streams).await {
        assert_whole_answer(&body, "tls");
    }
    assert_eq!(proxy.connect_count(), 1);
    assert_eq!(upstream.connections(), 1);
    assert_eq!(
        proxy.connects.lock().unwrap()[0],
        upstream.addr().to_string()
    );

    // HTTP/1.1: concurrent requests need several connections, and each
    // one is exactly one CONNECT; a sequential one reuses a pooled one.
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[b"http/1.1"]).await;
    let before = proxy.connect_count();
    let client = builder(&upstream)
        .ca_file(&pki.ca_file)
        .proxy(proxy.url())
        .build()
        .unwrap();
    let streams = (0..3).map(|_| {
        let client = client.clone();
        async move { read_all(send(&client).await.unwrap()).await }
    });
    for body in futures_util::future::join_all(streams).await {
        assert_whole_answer(&body, "tls");
    }
    assert_whole_answer(&read_all(send(&client).await.unwrap()).await, "tls");
    assert_eq!(upstream.attempts(), 4);
    let connects = proxy.connect_count() - before;
    assert_eq!(connects, upstream.connections());
    assert!((1..=3).contains(&connects), "{connects}");
}

#[tokio::test]
async fn a_plain_http_target_is_tunnelled_too_and_no_proxy_bypasses() {
    let proxy = Proxy::start(ProxyMode::Tunnel).await;
    let upstream = FakeUpstream::start("plain").await;
    let client = builder(&upstream).proxy(proxy.url()).build().unwrap();
    assert_whole_answer(&read_all(send(&client).await.unwrap()).await, "plain");
    assert_eq!(proxy.connect_count(), 1);
    assert_eq!(
        proxy.connects.lock().unwrap()[0],
        upstream.addr().to_string()
    );

    let direct = builder(&upstream)
        .proxy(proxy.url())
        .no_proxy("localhost, 127.0.0.0/8")
        .build()
        .unwrap();
    assert_whole_answer(&read_all(send(&direct).await.unwrap()).await, "plain");
    assert_eq!(proxy.connect_count(), 1);
}

#[tokio::test]
async fn proxy_refusals_are_classified_and_credentials_stay_out_of_errors() {
    let pki = pki();
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[]).await;

    let refusing = Proxy::start(ProxyMode::Refuse).await;
    let url = format!("http://gw:s3cr3t-pw@{}", refusing.addr);
    let client = builder(&upstream)
        .ca_file(&pki.ca_file)
        .proxy(&url)
        .build()
        .unwrap();
    let error = send(&client).await.unwrap_err();
    let c = classify(&error);
    assert_eq!(
        (c.class, c.phase),
        (FailureClass::Connect, Phase::BeforeSend)
    );
    assert_eq!(c.note, Some(Note::ProxyRefused));
    assert!(c.message.contains("refused"), "{}", c.message);
    // The credentials went to the proxy, as Basic, and nowhere else.
    assert_eq!(
        refusing.auth.lock().unwrap().as_slice(),
        ["Basic Z3c6czNjcjN0LXB3"]
    );
    for text in [
        c.message.clone(),
        format!("{error:?}"),
        format!("{client:?}"),
        format!("{:?}", builder(&upstream).proxy(&url)),
    ] {
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(!text.contains("Z3c6czNjcjN0LXB3"), "{text}");
    }

    let asking = Proxy::start(ProxyMode::AuthRequired).await;
    let client = builder(&upstream)
        .ca_file(&pki.ca_file)
        .proxy(asking.url())
        .build()
        .unwrap();
    let c = classify(&send(&client).await.unwrap_err());
    assert_eq!(
        (c.class, c.phase),
        (FailureClass::Connect, Phase::BeforeSend)
    );
    assert_eq!(c.note, Some(Note::ProxyAuthRequired));
    assert!(c.message.contains("407"), "{}", c.message);

    // Nobody listens on the proxy port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = builder(&upstream)
        .ca_file(&pki.ca_file)
        .proxy(format!("http://127.0.0.1:{port}"))
        .build()
        .unwrap();
    let c = classify(&send(&client).await.unwrap_err());
    assert_eq!(
        (c.class, c.phase),
        (FailureClass::Connect, Phase::BeforeSend)
    );
    assert_eq!(c.note, Some(Note::ProxyUnreachable));
    assert_eq!(upstream.attempts(), 0);
}

#[test]
fn bad_proxy_urls_fail_the_build() {
    for url in ["socks5://127.0.0.1:1080", "https://127.0.0.1:443", "nope"] {
        assert!(
            UpstreamClient::builder("https://api.example/v1")
                .proxy(url)
                .build()
                .is_err(),
            "{url}"
        );
    }
}

/// Set (to the upstream's base URL) in the child processes of the
/// environment tests.
const CHILD_MARK: &str = "TOWER_LLM_FAILOVER_ENV_CHILD";

/// The child half of the environment tests: builds a client in a process
/// whose environment the parent chose (a test cannot set variables in its
/// own process), and streams one answer. A no-op in a normal run.
#[tokio::test]
async fn env_child() {
    let Some(base_url) = std::env::var_os(CHILD_MARK) else {
        return;
    };
    let builder = UpstreamClient::builder(base_url.into_string().unwrap()).connect_timeout(LIMIT);
    let builder = match std::env::var_os("TOWER_LLM_FAILOVER_CA_FILE") {
        // Proxy from the environment, test CA from a file.
        Some(ca_file) => builder.ca_file(ca_file).proxy_from_env(),
        // Only the platform's store, which SSL_CERT_FILE points at.
        None => builder.webpki_roots(false).native_roots(true),
    };
    let client = builder.build().unwrap();
    assert_whole_answer(&read_all(send(&client).await.unwrap()).await, "tls");
}

/// Runs `env_child` with `vars` set and every proxy variable cleared.
fn run_child(
    base_url: String,
    vars: Vec<(&'static str, String)>,
) -> tokio::task::JoinHandle<std::process::Output> {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args(["env_child", "--exact", "--test-threads=1"])
        .env(CHILD_MARK, base_url);
    for var in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
        "REQUEST_METHOD",
        "TOWER_LLM_FAILOVER_CA_FILE",
    ] {
        child.env_remove(var);
    }
    child.envs(vars);
    tokio::task::spawn_blocking(move || child.output().unwrap())
}

#[tokio::test]
async fn native_roots_trust_the_platform_store() {
    let pki = pki();
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[]).await;
    let ca_file = pki.ca_file.display().to_string();
    let child = run_child(
        upstream.base_url(),
        vec![("SSL_CERT_FILE", ca_file), ("SSL_CERT_DIR", String::new())],
    );
    let output = tokio::time::timeout(Duration::from_secs(60), child)
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(upstream.attempts(), 1);
}

#[tokio::test]
async fn proxy_from_env_follows_https_proxy_and_no_proxy() {
    let pki = pki();
    let upstream = tls_upstream(&pki, &["127.0.0.1"], &[]).await;
    let proxy = Proxy::start(ProxyMode::Tunnel).await;
    let ca_file = pki.ca_file.display().to_string();
    let run = |no_proxy: &str| {
        run_child(
            upstream.base_url(),
            vec![
                ("TOWER_LLM_FAILOVER_CA_FILE", ca_file.clone()),
                ("HTTPS_PROXY", proxy.url()),
                ("NO_PROXY", no_proxy.to_owned()),
            ],
        )
    };
    let output = tokio::time::timeout(Duration::from_secs(60), run(""))
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(proxy.connect_count(), 1);
    assert_eq!(upstream.attempts(), 1);

    let output = tokio::time::timeout(Duration::from_secs(60), run("127.0.0.1"))
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(proxy.connect_count(), 1, "NO_PROXY bypasses the proxy");
    assert_eq!(upstream.attempts(), 2);
}
