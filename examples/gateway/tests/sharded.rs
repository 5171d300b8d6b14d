//! The gateway served thread per core (`app::serve_sharded`): each shard
//! serves its connections with upstream clients of its own, and everything
//! the gateway promises across connections (the in-flight cap, health,
//! shutdown) holds across shards. Loopback only; two shards, and a client
//! connection goes to the shard with the fewest open connections, so two
//! connections open at once are on different shards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;

/// Tests here that count the process's shard threads must not overlap with
/// one another's shards.
static SHARD_THREADS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SMALL: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn config(server: &str, providers: &str, routes: &str) -> app::Config {
    let text = format!(
        r#"
listen = "127.0.0.1:0"

[budget]
deadline_ms = 20000
first_token_timeout_ms = 5000
idle_timeout_ms = 5000

[server]
threads = 2
{server}

{providers}

{routes}
"#
    );
    app::Config::from_toml(&text).unwrap()
}

fn provider(name: &str, upstream: &FakeUpstream) -> String {
    format!(
        "[[providers]]\nname = \"{name}\"\nbase_url = \"{}\"\n",
        upstream.base_url()
    )
}

async fn sharded(config: &app::Config) -> app::Running {
    let gateway = app::Gateway::from_config(config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    app::serve_sharded(gateway, listener).unwrap()
}

/// A client connection of its own (keep-alive), driven on this runtime.
async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// One chat request on `conn`: the status and the whole body.
async fn ask(conn: &mut SendRequest<Full<Bytes>>, body: &'static str) -> (StatusCode, String) {
    let request = Request::post("/v1/chat/completions")
        .header("host", "gw")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), async {
        conn.ready().await.unwrap();
        let response = conn.send_request(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
    .await
    .expect("the gateway answers in time")
}

/// Two client connections open at once, two requests on each, in turn.
async fn two_clients_two_requests_each(running: &app::Running) {
    let mut first = connect(running.addr).await;
    let (status, body) = ask(&mut first, SMALL).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut second = connect(running.addr).await;
    for turn in 0..3 {
        // hyper-util gives an upstream connection back to its pool from a
        // task of its own: let it run before the next request.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let conn = if turn == 1 { &mut first } else { &mut second };
        let (status, body) = ask(conn, SMALL).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

#[tokio::test]
async fn each_shard_reaches_the_upstream_on_connections_of_its_own() {
    let upstream = FakeUpstream::builder("primary")
        .tokens(3)
        .start()
        .await
        .unwrap();
    let config = config("", &provider("primary", &upstream), "");

    // Control: on one runtime, one client pool; the second client's
    // request finds the first one's upstream connection idle.
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let single = app::serve(gateway, listener);
    two_clients_two_requests_each(&single).await;
    assert_eq!(
        upstream.connections(),
        1,
        "one pool: one upstream connection"
    );
    assert!(single.shutdown(Duration::from_secs(5)).await);

    // Sharded: the two clients are on two shards, each with its own pool
    // (its connections registered with its own runtime), and each shard
    // keeps reusing its own.
    upstream.reset_history();
    let before = upstream.connections();
    let _serial = SHARD_THREADS.lock().await;
    let running = sharded(&config).await;
    two_clients_two_requests_each(&running).await;
    assert_eq!(upstream.attempts(), 4);
    assert_eq!(
        upstream.connections() - before,
        2,
        "one upstream connection per shard, reused"
    );
    assert!(running.shutdown(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn the_in_flight_cap_counts_the_requests_of_every_shard() {
    // A slow stream: 40 tokens, 100 ms apart.
    let upstream = FakeUpstream::builder("primary")
        .tokens(40)
        .pace(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let config = config(
        "max_in_flight = 1\nshed_retry_after_s = 3",
        &provider("primary", &upstream),
        "",
    );
    let _serial = SHARD_THREADS.lock().await;
    let running = sharded(&config).await;

    // The stream holds the one slot on the first shard ...
    let mut first = connect(running.addr).await;
    let request = Request::post("/v1/chat/completions")
        .header("host", "gw")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(STREAM.as_bytes())))
        .unwrap();
    first.ready().await.unwrap();
    let stream = tokio::time::timeout(Duration::from_secs(10), first.send_request(request))
        .await
        .expect("the stream's head arrives")
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);

    // ... so a request on the second shard is shed, at once.
    let mut second = connect(running.addr).await;
    let (status, body) = ask(&mut second, SMALL).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("\"overloaded\""), "{body}");
    assert_eq!(
        upstream.attempts(),
        1,
        "only the stream reached the upstream"
    );

    // The stream's end frees the slot for either shard.
    let body = stream.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("data: [DONE]"));
    let (status, body) = ask(&mut second, SMALL).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(running.shutdown(Duration::from_secs(5)).await);
}

#[tokio::test]
async fn a_target_cooled_on_one_shard_is_skipped_on_the_other() {
    let primary = FakeUpstream::builder("primary")
        .tokens(3)
        .start()
        .await
        .unwrap();
    let backup = FakeUpstream::builder("backup")
        .tokens(3)
        .start()
        .await
        .unwrap();
    let providers = format!(
        "{}\n{}",
        provider("primary", &primary),
        provider("backup", &backup)
    );
    let routes = r#"
[[routes]]
model = "m"
targets = [
  { provider = "primary", model = "primary-model#fault:status=429;error=quota" },
  { provider = "backup", model = "backup-model" },
]
"#;
    let config = config("", &providers, routes);
    let _serial = SHARD_THREADS.lock().await;
    let running = sharded(&config).await;

    // First shard: the primary's spent quota cools it; the backup answers.
    let mut first = connect(running.addr).await;
    let (status, body) = ask(&mut first, SMALL).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((primary.attempts(), backup.attempts()), (1, 1));

    // Second shard: the same health store says the primary is cooling.
    let mut second = connect(running.addr).await;
    let (status, body) = ask(&mut second, SMALL).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (primary.attempts(), backup.attempts()),
        (1, 2),
        "the cooled primary is not tried again from the other shard"
    );
    assert!(running.shutdown(Duration::from_secs(5)).await);
}

/// How many of this process's threads are shards, once that is `want`
/// (a new thread names itself once it runs; an ending one takes a moment),
/// or after two seconds.
#[cfg(target_os = "linux")]
async fn shard_threads(want: usize) -> usize {
    let count = || {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        tasks
            .filter_map(Result::ok)
            .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
            .filter(|name| name.starts_with("gateway-shard-"))
            .count()
    };
    let mut seen = count();
    for _ in 0..200 {
        if seen == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        seen = count();
    }
    seen
}

#[tokio::test]
async fn shutdown_lets_a_running_stream_finish_then_stops_the_shards() {
    let upstream = FakeUpstream::builder("primary")
        .tokens(10)
        .pace(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let config = config("", &provider("primary", &upstream), "");
    let _serial = SHARD_THREADS.lock().await;
    let running = sharded(&config).await;
    let addr = running.addr;
    #[cfg(target_os = "linux")]
    assert_eq!(shard_threads(2).await, 2, "two shard threads while serving");

    let mut first = connect(addr).await;
    let stream = tokio::spawn(async move { ask(&mut first, STREAM).await });
    // The stream has started when the upstream has seen it.
    for _ in 0..200 {
        if upstream.attempts() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(upstream.attempts(), 1);

    assert!(
        running.shutdown(Duration::from_secs(10)).await,
        "the stream finishes within the grace period"
    );
    let (status, body) = stream.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.matches("primary-tok").count(), 10, "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");

    // No more connections, and the shards' threads end.
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "new connections are refused"
    );
    #[cfg(target_os = "linux")]
    assert_eq!(
        shard_threads(0).await,
        0,
        "the shard threads end with the gateway"
    );
}
