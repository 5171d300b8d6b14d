//! Serving the gateway: hyper-util's server with a timer, so that a slow or
//! greedy client cannot hold what other clients need.
//!
//! - **HTTP/1.1 only**: the gateway serves plain TCP, and every limit here
//!   is one of HTTP/1's (the header-read timeout applies to HTTP/1
//!   only; an idle HTTP/2 connection would keep its connection slot for
//!   ever). A client that opens with the HTTP/2 preface (h2c prior
//!   knowledge) is refused and closed. Put HTTP/2 and TLS in front, in a
//!   proxy that terminates them.
//! - **Header-read timeout**: a connection that sends nothing, trickles its
//!   request head or idles between requests is closed after
//!   `header_read_timeout_ms`, counted from its start or the end of its
//!   last answer ([`head_timeout`](crate::head_timeout): one alarm per
//!   connection, where hyper's own arms a timer per request; the wait for
//!   a connection's first byte is timed here too).
//! - **Request body**: read within `body_read_timeout_ms` and, after
//!   `body_min_rate_grace_ms`, at `body_min_bytes_per_second` on average
//!   (the library's [`ReadLimitLayer`]); a body that breaks either is
//!   answered `408`.
//! - **Write stall**: a connection that takes no bytes for
//!   `write_stall_timeout_ms` while the gateway has bytes for it (a client
//!   that asked for a stream and stopped reading) is closed (the library's
//!   [`WriteStallLimit`] around every accepted socket; 0: off). hyper stops
//!   polling a response body once the socket and the connection's 64 KiB
//!   write buffer are full, so no timer inside the body (turn deadline,
//!   idle, shutdown) would ever run: the stream's upstream connection and
//!   its in-flight slot would be held for ever.
//!   Closing the connection drops the response: the upstream connection is
//!   closed, the slot freed and the turn ends as cancelled.
//! - **Connection cap**: connection `max_connections + 1` is answered `503`
//!   with `retry-after` and closed (a few such answers at a time; beyond
//!   them it is closed at once).
//! - **In-flight cap**: model request `max_in_flight + 1` (`POST
//!   /v1/chat/completions` and `/v1/messages`, counted together) is shed
//!   with `retry-after` in the route's dialect (OpenAI's `503`, Anthropic's
//!   `529 overloaded_error`), never queued (the library's
//!   [`InFlightLimitLayer`]; a stream counts until its body ends). Health,
//!   models and metrics are never shed: an orchestrator probing a saturated
//!   gateway must not restart it.
//! - **Graceful shutdown**: [`Running::shutdown`] stops accepting (new
//!   connections are refused), lets running responses finish within the
//!   grace period, then ends the streams still running with the dialect's
//!   terminal event, class `shutdown` (a terminal chunk and `[DONE]` on
//!   chat; `event: error`, with no end marker, on Messages; the library's
//!   [`Shutdown`] signal), and closes what is left after a short drain.
//!   A turn still waiting for a response head or in backoff answers the
//!   dialect's `503` (class and code `shutdown`) at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::drain::Drain;
use crate::front::Front;
use crate::head_timeout::head_limit;
use crate::repoll::Repoll;
use http::header::{CONNECTION, HeaderValue};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinSet;
use tower::ServiceBuilder;
use tower_llm_failover::dialect::{AnthropicMessages, OpenAiChat, OpenAiResponses};
use tower_llm_failover::limit::{
    InFlightLimitLayer, ReadLimitLayer, ReadLimits, WriteStallLimit, WriteStalled, shed_response,
};
use tower_llm_failover::shutdown::Shutdown;

/// `[server]`: connection and request limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// A request head (and the first byte of a connection, and the gap
    /// between two requests on one connection) must arrive within this.
    pub header_read_timeout_ms: u64,
    /// A whole request body must arrive within this.
    pub body_read_timeout_ms: u64,
    /// After the grace period a body must average at least this (0: off).
    pub body_min_bytes_per_second: u64,
    /// How long a body is read before `body_min_bytes_per_second` applies.
    pub body_min_rate_grace_ms: u64,
    /// Open client connections; the next one is answered 503 and closed.
    pub max_connections: usize,
    /// Requests in flight (a stream until its end); the next is shed.
    pub max_in_flight: usize,
    /// The `retry-after` of a shed answer, in seconds.
    pub shed_retry_after_s: u64,
    /// A connection that takes no bytes for this long while there are
    /// bytes for it is closed (0: off).
    pub write_stall_timeout_ms: u64,
    /// After the grace period, how long the streams just ended get to
    /// write their terminal event before their connections are closed.
    pub shutdown_drain_ms: u64,
    /// The shards [`crate::app::serve_sharded`] serves on, each a thread
    /// with a single-threaded runtime and upstream clients of its own
    /// (0: one per core the process may use).
    pub threads: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            body_min_bytes_per_second: 1024,
            body_min_rate_grace_ms: 5_000,
            max_connections: 4096,
            max_in_flight: 1024,
            shed_retry_after_s: 1,
            write_stall_timeout_ms: 30_000,
            shutdown_drain_ms: 2_000,
            threads: 0,
        }
    }
}

/// The in-flight cap of the model routes: one layer per endpoint, each
/// shedding in its endpoint's dialect, all sharing one count.
#[derive(Clone)]
pub(crate) struct InFlightCaps {
    /// For `POST /v1/chat/completions`.
    pub(crate) chat: InFlightLimitLayer<OpenAiChat>,
    /// For `POST /v1/messages`.
    pub(crate) messages: InFlightLimitLayer<AnthropicMessages>,
    /// For `POST /v1/responses`.
    pub(crate) responses: InFlightLimitLayer<OpenAiResponses>,
}

impl InFlightCaps {
    /// `max_in_flight` model requests at once, over both endpoints.
    pub(crate) fn new(config: &ServerConfig) -> Self {
        let chat = InFlightLimitLayer::new(config.max_in_flight)
            .retry_after(Duration::from_secs(config.shed_retry_after_s))
            .dialect(OpenAiChat);
        // `dialect` keeps the layer's semaphore: one count for both.
        let messages = chat.clone().dialect(AnthropicMessages);
        let responses = chat.clone().dialect(OpenAiResponses);
        Self {
            chat,
            messages,
            responses,
        }
    }
}

/// How often the [`timer_floor`] ticks: below every per-request timer
/// (header read, response head, body idle, turn deadline: seconds).
const TIMER_FLOOR: Duration = Duration::from_millis(250);

/// Keeps a timer armed within [`TIMER_FLOOR`] for the life of the server.
///
/// Tokio wakes the worker parked on its timer driver whenever a timer is
/// registered to fire before the driver's next wake. Every request arms a
/// few timers seconds out, and on a runtime whose other timers are further
/// away each of them is the earliest: a wake-up of the other worker per
/// timer (an eventfd write, an epoll return, a context switch), about two
/// per small completion (found with `gdb` on `mio`'s waker, called from the
/// time driver's `reregister`). With this tick armed, request timers are
/// never the earliest; it costs four wake-ups a second.
async fn timer_floor() {
    let mut tick = tokio::time::interval(TIMER_FLOOR);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Over-cap connections answered 503 at once; beyond these they are closed
/// without an answer, so a flood costs a bounded number of tasks.
const MAX_SHED_CONNECTIONS: usize = 64;

/// The most a served connection buffers for writing (beyond the socket's
/// own buffer), and about the largest request head it reads (hyper
/// checks between reads).
const SERVER_BUFFER: usize = 64 * 1024;

/// A gateway serving on a bound listener, stopped by `shutdown`.
#[derive(Debug)]
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    streams: Shutdown,
    drain: Duration,
    task: tokio::task::JoinHandle<()>,
    /// The shards' threads, stopped when this is dropped (none when the
    /// gateway serves on the caller's runtime).
    _shards: ShardThreads,
}

impl Running {
    /// Stops accepting (new connections are refused) and waits up to
    /// `grace` for running responses. Streams still running then end with
    /// the dialect's terminal event (class `shutdown`); turns still waiting
    /// for a response head or in backoff answer the dialect's `503`.
    /// Returns whether every response finished within `grace`.
    pub async fn shutdown(mut self, grace: Duration) -> bool {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(grace, &mut self.task).await.is_ok() {
            return true;
        }
        tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "shutdown grace period over; ending the running streams"
        );
        self.streams.end_streams();
        if tokio::time::timeout(self.drain, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        false
    }
}

/// Where a connection is served: on the accepting runtime, or on a shard
/// (a single-threaded runtime on a thread of its own, with upstream
/// clients of its own).
pub(crate) struct Place {
    /// The shard's runtime; `None`: the accepting one.
    pub(crate) runtime: Option<Handle>,
    /// The front service of this place's gateway (its upstream clients).
    pub(crate) front: Front,
}

/// Shard threads: each runs its runtime until this is dropped.
#[derive(Debug, Default)]
pub(crate) struct ShardThreads {
    stops: Vec<oneshot::Sender<()>>,
}

impl ShardThreads {
    /// Starts `count` shard threads, each with a single-threaded runtime;
    /// returns them and their runtimes' handles.
    pub(crate) fn start(count: usize) -> std::io::Result<(Self, Vec<Handle>)> {
        let mut threads = Self::default();
        let mut handles = Vec::with_capacity(count);
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("gateway-shard-{index}"))
                .spawn(move || {
                    // A dropped sender stops it as well as a sent stop.
                    runtime.block_on(async move {
                        let _ = stopped.await;
                    });
                    // Its connection tasks are gone with the serving task;
                    // a blocking task left (a DNS lookup) is not waited for.
                    runtime.shutdown_background();
                })?;
            threads.stops.push(stop);
        }
        Ok((threads, handles))
    }
}

/// Serves `front` on `listener` under `config`'s limits, on the caller's
/// runtime; `streams` is the signal the gateway's failover layers end their
/// streams on.
pub(crate) fn serve(
    front: Front,
    listener: TcpListener,
    config: &ServerConfig,
    streams: Shutdown,
) -> Running {
    let here = Place {
        runtime: None,
        front,
    };
    serve_on(
        vec![here],
        ShardThreads::default(),
        listener,
        config,
        streams,
    )
}

/// Serves on `places`: the caller's runtime accepts, and each connection
/// goes to the place with the fewest open connections, where it is served
/// to its end (its socket registered with that runtime, its upstream
/// connections that place's).
pub(crate) fn serve_on(
    places: Vec<Place>,
    shards: ShardThreads,
    listener: TcpListener,
    config: &ServerConfig,
    streams: Shutdown,
) -> Running {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
    let header_timeout = Duration::from_millis(config.header_read_timeout_ms);
    let write_stall = Duration::from_millis(config.write_stall_timeout_ms);
    let retry_after = Duration::from_secs(config.shed_retry_after_s);
    let limits = ReadLimits {
        timeout: Some(Duration::from_millis(config.body_read_timeout_ms)),
        min_bytes_per_second: Some(config.body_min_bytes_per_second),
        grace: Duration::from_millis(config.body_min_rate_grace_ms),
    };
    // The in-flight cap is not here but on the model routes (see
    // `InFlightCaps`): health and metrics must answer at saturation.
    let places: Vec<_> = places
        .into_iter()
        .map(|place| {
            let service = ServiceBuilder::new()
                .layer(ReadLimitLayer::new(limits))
                .service(place.front);
            (place.runtime, service, Arc::new(AtomicUsize::new(0)))
        })
        .collect();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Kept by each connection instead (`head_timeout`): hyper's arms a
        // timer for every request head.
        .header_read_timeout(None::<Duration>)
        // Answers are copied into the connection's one write buffer, not
        // queued beside the head for a vectored write: they are small (a
        // completion, an event), and hyper's queue costs more per write
        // than the copy (about 0.25 µs of CPU per small completion,
        // measured; a stream's events gain a little too).
        .writev(false)
        // With writes copied, this bounds what a client that stops
        // reading makes the connection hold (hyper's default, about
        // 400 KiB, would be per stalled stream). A request head is read
        // into the same bound (answered 431 once past it).
        .max_buf_size(SERVER_BUFFER);
    let builder = Arc::new(builder);
    let connections = Arc::new(Semaphore::new(config.max_connections));
    let shed = Arc::new(Semaphore::new(MAX_SHED_CONNECTIONS));
    let (stop, mut stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        // End with the serving task (they are aborted on drop below): the
        // floor of every runtime that serves connections.
        let _floors: Vec<AbortOnDrop> = places
            .iter()
            .map(|(runtime, _, _)| match runtime {
                Some(runtime) => AbortOnDrop(runtime.spawn(timer_floor())),
                None => AbortOnDrop(tokio::spawn(timer_floor())),
            })
            .collect();
        let drain = Drain::new();
        // Dropped with this task: a connection left after the drain is
        // closed by the abort.
        let mut tasks = JoinSet::new();
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                accepted = listener.accept() => {
                    let Ok((tcp, _peer)) = accepted else {
                        // Out of fds, say: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    // A stream is many small writes: without this, delayed
                    // ACKs hold each one's tail for ~40 ms.
                    let _ = tcp.set_nodelay(true);
                    if let Ok(permit) = Arc::clone(&connections).try_acquire_owned() {
                        // The place with the fewest open connections (the
                        // first of those tied).
                        let Some((runtime, service, open)) = places
                            .iter()
                            .min_by_key(|(_, _, open)| open.load(Ordering::Relaxed))
                        else {
                            continue;
                        };
                        let open = OpenConnection::new(Arc::clone(open));
                        let connection = Connection {
                            service: service.clone(),
                            builder: Arc::clone(&builder),
                            drain: drain.clone(),
                            header_timeout,
                            write_stall,
                            permit,
                            open,
                        };
                        connection.spawn(tcp, runtime.as_ref(), &mut tasks);
                    } else if let Ok(permit) = Arc::clone(&shed).try_acquire_owned() {
                        tracing::warn!("connection limit reached; connection answered 503");
                        tasks.spawn(shed_connection(tcp, header_timeout, retry_after, permit));
                    } else {
                        drop(tcp);
                    }
                }
            }
        }
        // New connections are refused from here on.
        drop(listener);
        drain.start();
        while tasks.join_next().await.is_some() {}
    });
    Running {
        addr,
        stop: Some(stop),
        streams,
        drain: Duration::from_millis(config.shutdown_drain_ms),
        task,
        _shards: shards,
    }
}

/// A place's count of open connections, one while this lives.
struct OpenConnection(Arc<AtomicUsize>);

impl OpenConnection {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Waits for a connection's first byte (or its end) within `timeout`.
async fn first_byte(tcp: &TcpStream, timeout: Duration) -> bool {
    // `peek` waits for data; readiness alone can be reported spuriously.
    let mut byte = [0u8; 1];
    matches!(tokio::time::timeout(timeout, tcp.peek(&mut byte)).await, Ok(Ok(n)) if n > 0)
}

/// An accepted connection, with what serving it takes.
struct Connection<S> {
    service: S,
    builder: Arc<http1::Builder>,
    drain: Drain,
    header_timeout: Duration,
    write_stall: Duration,
    permit: OwnedSemaphorePermit,
    open: OpenConnection,
}

impl<S> Connection<S>
where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<crate::front::FrontBody>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    /// Serves the connection to its end on `runtime` (`None`: this one).
    fn spawn(self, tcp: TcpStream, runtime: Option<&Handle>, tasks: &mut JoinSet<()>) {
        let Some(runtime) = runtime else {
            tasks.spawn(self.serve(tcp));
            return;
        };
        // Registered again with the shard's own driver, so that its
        // readiness wakes the shard's thread and no other.
        let Ok(tcp) = tcp.into_std() else { return };
        tasks.spawn_on(
            async move {
                if let Ok(tcp) = TcpStream::from_std(tcp) {
                    self.serve(tcp).await;
                }
            },
            runtime,
        );
    }

    /// Serves the connection to its end.
    async fn serve(self, tcp: TcpStream) {
        let Self {
            service,
            builder,
            drain,
            header_timeout,
            write_stall,
            permit,
            open,
        } = self;
        let accepted = std::time::Instant::now();
        // A connection that never sends its first byte is closed at the
        // header timeout (no read is made before a first byte).
        if !first_byte(&tcp, header_timeout).await {
            return;
        }
        // HTTP/1 only: the HTTP/2 preface is a parse error, and hyper
        // closes. Wrapped after the peek above, which needs the bare socket.
        let (io, service) = head_limit(
            WriteStallLimit::new(tcp, write_stall),
            service,
            accepted,
            header_timeout,
        );
        let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
        // Reading a request body wakes this very task: poll it again here
        // rather than yield it to another worker (see `repoll`).
        if let Err(error) = Repoll::new(drain.watch(conn)).await {
            if WriteStalled::find_in(&error).is_some() {
                tracing::info!(
                    write_stall_timeout_ms = write_stall.as_millis() as u64,
                    "client took no bytes for the write stall timeout; connection closed"
                );
            } else {
                tracing::debug!(%error, "client connection ended with an error");
            }
        }
        drop((permit, open));
    }
}

/// Answers one request on a connection over the cap with 503 and closes it.
async fn shed_connection(
    tcp: TcpStream,
    header_timeout: Duration,
    retry_after: Duration,
    permit: OwnedSemaphorePermit,
) {
    let budget = header_timeout.min(Duration::from_secs(5));
    if !first_byte(&tcp, budget).await {
        return;
    }
    let service = hyper::service::service_fn(move |request: http::Request<_>| async move {
        // In the dialect of the endpoint asked for.
        let mut response = match request.uri().path() {
            "/v1/messages" => shed_response(&AnthropicMessages, retry_after),
            "/v1/responses" => shed_response(&OpenAiResponses, retry_after),
            _ => shed_response(&OpenAiChat, retry_after),
        };
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        Ok::<_, std::convert::Infallible>(response)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(budget)
        .keep_alive(false)
        .serve_connection(TokioIo::new(tcp), service);
    let _ = tokio::time::timeout(budget * 2, conn).await;
    drop(permit);
}

/// Resolves at SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
