//! The connections of a plain-`http` target, pooled by the client itself.
//!
//! Plain `http` always speaks HTTP/1.1, one request at a time per
//! connection, and a client has one target: its idle connections are one
//! list, with no key to look up. hyper-util's pool, which serves any
//! number of hosts, hashed the (scheme, authority) key with SipHash one
//! byte at a time on every checkout and return, and raced a connect
//! against every checkout: about 8k instructions and 0.8 µs of CPU per
//! small completion in the gateway. `https` and proxied targets stay on
//! hyper-util's client (TLS, ALPN's choice of HTTP/2, CONNECT tunnels).
//!
//! A connection goes back to the list when it is ready for the next
//! request: its response's body, read to its end or dropped, hands it
//! back (at once when hyper has already taken up the next request, as it
//! has on a current-thread runtime; else through a task that waits for
//! it). It is dropped when it is
//! closed, idle longer than the idle timeout, or beyond the idle cap. A
//! request that meets a pooled connection the upstream had closed (the
//! request not written) is sent on another, as hyper-util does; each such
//! connection is dropped, so this ends at a new connection.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::{Request, Response, Uri};
use hyper::client::conn::http1::{self, SendRequest};
use tower_llm_failover::classify::NotSent;
use tower_service::Service;

use super::SendError;
use super::body::{ResponseBody, Returning};
use super::io::CompactConnector;
use super::service::UpstreamBody;

/// A plain-`http` target's idle connections.
pub(crate) struct Http1Pool {
    connector: CompactConnector,
    /// `http://host:port/`: what the connector connects to.
    destination: Uri,
    idle: Mutex<VecDeque<Idle>>,
    max_idle: usize,
    idle_timeout: Option<Duration>,
}

struct Idle {
    sender: SendRequest<UpstreamBody>,
    since: Instant,
}

impl Http1Pool {
    pub(crate) fn new(
        connector: CompactConnector,
        destination: Uri,
        max_idle: usize,
        idle_timeout: Option<Duration>,
    ) -> Arc<Self> {
        Arc::new(Self {
            connector,
            destination,
            idle: Mutex::new(VecDeque::new()),
            max_idle,
            idle_timeout,
        })
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn expired(&self, idle: &Idle, now: Instant) -> bool {
        self.idle_timeout
            .is_some_and(|timeout| now.saturating_duration_since(idle.since) > timeout)
    }

    /// The most recently returned connection still open and in time.
    fn checkout(&self) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle();
        let now = self.idle_timeout.map(|_| Instant::now());
        while let Some(entry) = idle.pop_back() {
            if let Some(now) = now
                && self.expired(&entry, now)
            {
                // The rest were returned earlier still.
                idle.clear();
                return None;
            }
            // A connection is returned only once ready: not ready now
            // means closed since.
            if entry.sender.is_ready() {
                return Some(entry.sender);
            }
        }
        None
    }

    fn put(&self, sender: SendRequest<UpstreamBody>) {
        let now = Instant::now();
        let mut idle = self.idle();
        while idle.front().is_some_and(|oldest| self.expired(oldest, now)) {
            idle.pop_front();
        }
        // At the cap (at least one: `give_back` keeps none at zero), the
        // oldest goes.
        if idle.len() >= self.max_idle {
            idle.pop_front();
        }
        idle.push_back(Idle { sender, since: now });
    }

    /// A new connection, its task spawned on the current runtime.
    async fn connect(&self) -> Result<SendRequest<UpstreamBody>, SendError> {
        let mut connector = self.connector.clone();
        std::future::poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(|e| SendError::NotSent(NotSent::new(e)))?;
        let io = connector
            .call(self.destination.clone())
            .await
            .map_err(|e| SendError::NotSent(NotSent::new(e)))?;
        let (sender, connection) = http1::handshake(io)
            .await
            .map_err(|e| SendError::NotSent(NotSent::new(e)))?;
        // Its errors reach the request in flight, if there is one.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// Takes `sender` back after its response: into the list at once when
    /// it is ready for the next request (its response read to the end),
    /// else once it is (a task waits for it), unless it closes first.
    pub(crate) fn give_back(self: &Arc<Self>, sender: SendRequest<UpstreamBody>) {
        if self.max_idle == 0 || sender.is_closed() {
            return;
        }
        if sender.is_ready() {
            self.put(sender);
            return;
        }
        // Outside a runtime (a response dropped after its runtime ended)
        // nothing could drive the connection again: it is dropped.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let pool = Arc::clone(self);
            let mut sender = sender;
            runtime.spawn(async move {
                if sender.ready().await.is_ok() {
                    pool.put(sender);
                }
            });
        }
    }
}

/// Sends `request` on a pooled or new connection of `pool`.
#[allow(clippy::manual_async_fn, reason = "arguments used in place")]
pub(crate) fn send(
    pool: Arc<Http1Pool>,
    mut request: Request<UpstreamBody>,
) -> impl Future<Output = Result<Response<ResponseBody>, SendError>> {
    // An `async` block, not an `async fn`: an `async fn` copies its
    // arguments into its body's locals at the first poll (the request's
    // 240 bytes) and keeps both in its state.
    async move {
        // HTTP/1.1 to an origin: the request line names the path only.
        if let Some(path) = request.uri().path_and_query().cloned() {
            *request.uri_mut() = Uri::from(path);
        }
        loop {
            let (mut sender, reused) = match pool.checkout() {
                Some(sender) => (sender, true),
                None => {
                    // A connection whose response was just read may be on its
                    // way back (its task not run yet): it goes first.
                    tokio::task::yield_now().await;
                    match pool.checkout() {
                        Some(sender) => (sender, true),
                        None => (pool.connect().await?, false),
                    }
                }
            };
            match sender.try_send_request(request).await {
                Ok(response) => {
                    // The body takes the connection back when it has been read.
                    let returning = Returning::new(pool, sender);
                    return Ok(response.map(|body| ResponseBody::returning(body, returning)));
                }
                Err(mut failed) => match failed.take_message() {
                    // A pooled connection the upstream had closed: the request
                    // never left; on another (this one is dropped, so the loop
                    // ends at a new connection, whose failure is final).
                    Some(unsent) if reused => request = unsent,
                    Some(_) => return Err(SendError::NotSent(NotSent::new(failed.into_error()))),
                    None => return Err(SendError::Http(failed.into_error())),
                },
            }
        }
    }
}
