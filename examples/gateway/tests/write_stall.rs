//! A client that stops reading cannot hold anything: the library's
//! `WriteStallLimit` alone (in-memory pipes on paused time, and a loopback
//! TCP pair on the wall clock), then the gateway over loopback with
//! two clients that ask for a long stream and never read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::Instant;
use tower_llm_failover::limit::{WriteStallLimit, WriteStalled};
use tower_llm_gateway::app;
use tower_llm_testing::upstream::FakeUpstream;

// ---------------------------------------------------------------- library

/// The error is a `TimedOut` `io::Error` carrying `WriteStalled`.
fn assert_stalled(error: &io::Error, after: Duration) {
    assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
    let stalled = WriteStalled::find_in(error).expect("a WriteStalled inside");
    assert_eq!(stalled.after, after);
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_never_reads_fails_the_write_at_the_stall_timeout() {
    let (near, _far) = tokio::io::duplex(64);
    let mut writer = WriteStallLimit::new(near, Duration::from_secs(1));
    let started = Instant::now();
    // 64 bytes go at once; the rest waits for a reader that never comes.
    let error = writer.write_all(&[b'x'; 4096]).await.unwrap_err();
    assert_stalled(&error, Duration::from_secs(1));
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // Still stalled: the next write fails at once, without another wait.
    let error = writer.write_all(b"more").await.unwrap_err();
    assert_stalled(&error, Duration::from_secs(1));
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_vectored_write_that_never_goes_is_failed_too() {
    let (near, _far) = tokio::io::duplex(64);
    let mut writer = WriteStallLimit::new(near, Duration::from_millis(300));
    assert_eq!(
        writer.is_write_vectored(),
        writer.get_ref().is_write_vectored()
    );
    let started = Instant::now();
    let (a, b) = ([b'a'; 100], [b'b'; 100]);
    let mut written = 0;
    let error = loop {
        let slices = [IoSlice::new(&a), IoSlice::new(&b)];
        match writer.write_vectored(&slices).await {
            Ok(n) => {
                assert!(n > 0);
                written += n;
            }
            Err(error) => break error,
        }
    };
    assert_stalled(&error, Duration::from_millis(300));
    assert_eq!(written, 64, "what the pipe took, then nothing");
    assert_eq!(started.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_that_keeps_reading_is_never_cut() {
    let (near, mut far) = tokio::io::duplex(64);
    let mut writer = WriteStallLimit::new(near, Duration::from_secs(1));
    // 16 bytes every 900 ms: each wait is below the timeout, their sum
    // (about 2 minutes for 2 KiB) far above it.
    let reader = tokio::spawn(async move {
        let mut got = 0;
        let mut buf = [0u8; 16];
        loop {
            tokio::time::sleep(Duration::from_millis(900)).await;
            match far.read(&mut buf).await.unwrap() {
                0 => return got,
                n => got += n,
            }
        }
    });
    let started = Instant::now();
    writer.write_all(&[b'x'; 2048]).await.unwrap();
    writer.flush().await.unwrap();
    assert!(started.elapsed() > Duration::from_secs(60));
    writer.shutdown().await.unwrap();
    drop(writer);
    assert_eq!(reader.await.unwrap(), 2048);
}

#[tokio::test(start_paused = true)]
async fn a_writer_with_nothing_to_write_is_not_stalled() {
    let (near, mut far) = tokio::io::duplex(64);
    let mut writer = WriteStallLimit::new(near, Duration::from_secs(1));
    // The pipe is full, but nobody waits to write: no stall, however long.
    writer.write_all(&[b'x'; 64]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let reader = tokio::spawn(async move {
        // The reader comes back 900 ms after the next write began waiting.
        tokio::time::sleep(Duration::from_millis(900)).await;
        let mut all = Vec::new();
        far.read_to_end(&mut all).await.unwrap();
        all.len()
    });
    writer.write_all(&[b'y'; 64]).await.unwrap();
    writer.shutdown().await.unwrap();
    drop(writer);
    assert_eq!(reader.await.unwrap(), 128);
}

#[tokio::test(start_paused = true)]
async fn a_zero_timeout_is_off() {
    let (near, _far) = tokio::io::duplex(64);
    let mut writer = WriteStallLimit::new(near, Duration::ZERO);
    let waited =
        tokio::time::timeout(Duration::from_secs(3600), writer.write_all(&[b'x'; 4096])).await;
    assert!(waited.is_err(), "the write still waits after an hour");
}

/// The stall begins in a poll whose coop budget is spent (the pipe says
/// `Pending` for that reason): its timer is registered all the same, so
/// the stall still ends in the error instead of a wait for ever.
#[tokio::test(start_paused = true)]
async fn a_stall_begun_with_the_budget_spent_still_fires() {
    let (near, _far) = tokio::io::duplex(64);
    let mut writer = WriteStallLimit::new(near, Duration::from_secs(1));
    writer.write_all(&[b'x'; 64]).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..1_000 {
        tx.send(()).unwrap_or_default();
    }
    std::future::poll_fn(|cx| {
        // Ready items until the budget runs out, then `Pending`.
        while let Poll::Ready(Some(())) = rx.poll_recv(cx) {}
        assert!(!rx.is_empty(), "the budget, not the channel, ran out");
        assert!(Pin::new(&mut writer).poll_write(cx, b"y").is_pending());
        Poll::Ready(())
    })
    .await;
    let written = tokio::time::timeout(Duration::from_secs(60), writer.write_all(b"y")).await;
    let error = written.expect("the stall fired").unwrap_err();
    assert_stalled(&error, Duration::from_secs(1));
}

/// A loopback TCP pair whose reading end takes nothing (real sockets, so
/// the wall clock; the bound is generous).
#[tokio::test]
async fn a_tcp_peer_that_never_reads_fails_the_write_within_the_bound() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let connecting = socket.connect(listener.local_addr().unwrap());
    let (accepted, connected) = tokio::join!(listener.accept(), connecting);
    let (server, _) = accepted.unwrap();
    let _client = connected.unwrap();
    let timeout = Duration::from_millis(300);
    let mut writer = WriteStallLimit::new(server, timeout);
    let chunk = vec![b'x'; 64 * 1024];
    let mut written = 0usize;
    let started = std::time::Instant::now();
    let error = loop {
        // Bounded: the buffers of a loopback pair hold a few MiB at most.
        assert!(written < 256 * 1024 * 1024, "the writes never stalled");
        match tokio::time::timeout(Duration::from_secs(20), writer.write(&chunk)).await {
            Ok(Ok(n)) => written += n,
            Ok(Err(error)) => break error,
            Err(_) => panic!("a stalled write was not failed within 20 s"),
        }
    };
    let elapsed = started.elapsed();
    assert_stalled(&error, timeout);
    assert!(elapsed >= timeout, "{elapsed:?}");
    assert!(elapsed < timeout + Duration::from_secs(10), "{elapsed:?}");
}

// ---------------------------------------------------------------- gateway

const STALL_MS: u64 = 300;

/// The gateway on the caller's runtime, or thread per core (`sharded`, two
/// shards: the two stalled streams are on different shards).
async fn gateway(upstream: &FakeUpstream, sharded: bool) -> app::Running {
    let config = format!(
        r#"
listen = "127.0.0.1:0"

# The turn's own timers end well inside the test's bound: without the
# stall limit they would not free the slots either (nobody polls the body).
[budget]
deadline_ms = 3000
first_token_timeout_ms = 2000
idle_timeout_ms = 2000

[failover]
shutdown_grace_ms = 1000

[server]
max_in_flight = 2
write_stall_timeout_ms = {STALL_MS}
threads = 2

[[providers]]
name = "primary"
base_url = "{base}"
"#,
        base = upstream.base_url()
    );
    let config = app::Config::from_toml(&config).unwrap();
    let gateway = app::Gateway::from_config(&config).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    if sharded {
        app::serve_sharded(gateway, listener).unwrap()
    } else {
        app::serve(gateway, listener)
    }
}

fn chat_request(model: &str, close: bool) -> String {
    let body = format!(
        r#"{{"model":"{model}","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let connection = if close { "connection: close\r\n" } else { "" };
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n{connection}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Asks for a stream far longer than the test (20,000 chunks, each sent
/// as soon as it can be), reads its head and then nothing: a small
/// receive buffer, so the gateway's writes stall soon.
async fn non_reading_stream(addr: std::net::SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut tcp = socket.connect(addr).await.unwrap();
    tcp.write_all(chat_request("m#fault:tokens=20000", false).as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut byte))
            .await
            .expect("the stream's head arrives")
            .unwrap();
        assert_eq!(n, 1, "the stream's head arrives");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    tcp
}

/// One request on a new connection; the whole answer (bounded).
async fn one_answer(addr: std::net::SocketAddr, request: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut out))
        .await
        .expect("the answer ends")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn clients_that_never_read_lose_their_streams_and_free_their_slots() {
    never_reading_clients(false).await;
}

#[tokio::test]
async fn clients_on_shards_that_never_read_lose_their_streams_and_free_their_slots() {
    never_reading_clients(true).await;
}

async fn never_reading_clients(sharded: bool) {
    let upstream = FakeUpstream::start("primary").await;
    let gw = gateway(&upstream, sharded).await;
    let opened = std::time::Instant::now();
    let mut first = non_reading_stream(gw.addr).await;
    let mut second = non_reading_stream(gw.addr).await;
    assert_eq!(upstream.attempts(), 2);

    // Both slots are taken: the next request is shed.
    let shed = one_answer(gw.addr, &chat_request("m", true)).await;
    assert!(shed.starts_with("HTTP/1.1 503"), "{shed}");
    assert_eq!(upstream.attempts(), 2);

    // The gateway's writes stall, and after the stall timeout both streams
    // are dropped: the upstream sees both connections closed.
    let bound = Duration::from_secs(15);
    while upstream.open_connections() > 0 {
        assert!(
            opened.elapsed() < bound,
            "upstream connections still open after {bound:?}: {}",
            upstream.open_connections()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(upstream.connections(), 2, "one per stream");
    assert!(opened.elapsed() >= Duration::from_millis(STALL_MS));

    // Both slots are free: a new request is answered whole.
    let answer = one_answer(gw.addr, &chat_request("m", true)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("primary-tok0 "), "{answer}");
    assert!(answer.contains("data: [DONE]"), "{answer}");
    assert_eq!(upstream.attempts(), 3);

    // The stalled clients' connections were closed by the gateway: what
    // was buffered for them, then the end (never the stream's own end).
    for tcp in [&mut first, &mut second] {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut rest))
            .await
            .expect("the gateway closed the connection");
        // A close with unread bytes on the gateway's side may be a reset.
        if let Err(error) = read {
            assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error}");
        }
        assert!(
            !String::from_utf8_lossy(&rest).contains("data: [DONE]"),
            "the stream was cut, not finished"
        );
    }
}
