//! A bare HTTP/1.1 pass-through proxy: the baseline that
//! `benches/overhead.sh` measures the gateway against.
//!
//! ```text
//! cargo run --release --example passthrough -- \
//!     --listen 127.0.0.1:9200 --upstream http://127.0.0.1:9101
//! ```
//!
//! Every request is forwarded to the upstream, path and query kept, over a
//! pooled hyper-util client; the response head and body stream back
//! untouched, frame by frame. No parsing, no failover, no middleware: hyper
//! 1 and hyper-util only, with TCP_NODELAY on both sides like the gateway.
//! It prints one ready line and serves until Ctrl-C or SIGTERM.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{HOST, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;

const USAGE: &str = "usage: passthrough [--listen ADDR] [--upstream http://HOST:PORT]";

type Upstream = Client<HttpConnector, Incoming>;
type ProxyBody = Either<Incoming, Full<Bytes>>;

struct Args {
    listen: SocketAddr,
    upstream: Uri,
}

fn parse_args() -> Result<Args, String> {
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 9200));
    let mut upstream = Uri::from_static("http://127.0.0.1:9101");
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_owned());
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--listen" => {
                listen = value
                    .parse()
                    .map_err(|_| format!("--listen {value}: not an address\n{USAGE}"))?;
            }
            "--upstream" => {
                upstream = value
                    .parse()
                    .map_err(|_| format!("--upstream {value}: not a URI\n{USAGE}"))?;
            }
            _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
        }
    }
    if upstream.scheme_str() != Some("http") || upstream.authority().is_none() {
        return Err(format!(
            "--upstream {upstream}: needs http://HOST:PORT\n{USAGE}"
        ));
    }
    Ok(Args { listen, upstream })
}

/// Points the request at the upstream and forwards it; the response comes
/// back as the upstream's own body.
async fn forward(
    client: Upstream,
    upstream: Uri,
    mut request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let mut parts = upstream.into_parts();
    parts.path_and_query = path.parse().ok();
    let Ok(uri) = Uri::from_parts(parts) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    if let Some(authority) = uri.authority()
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        request.headers_mut().insert(HOST, host);
    }
    *request.uri_mut() = uri;
    match client.request(request).await {
        Ok(response) => Ok(response.map(Either::Left)),
        Err(_) => Ok(status(StatusCode::BAD_GATEWAY)),
    }
}

fn status(code: StatusCode) -> Response<ProxyBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    *response.status_mut() = code;
    response
}

/// mimalloc, as in the gateway example (the same allocator on both sides
/// of the comparison). A gateway allocates many small, short-lived blocks per
/// request across worker threads, where glibc's malloc is slow.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // The pool settings of the gateway's own upstream client.
    let client: Upstream = Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .build(connector);

    let listener = match TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    let addr = listener.local_addr().unwrap_or(args.listen);
    println!("passthrough ready on http://{addr} -> {}", args.upstream);

    let accept = async {
        loop {
            let tcp = match listener.accept().await {
                Ok((tcp, _)) => tcp,
                Err(_) => {
                    // Out of file descriptors, most likely: back off.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (client, upstream) = (client.clone(), args.upstream.clone());
            tokio::spawn(async move {
                let service =
                    service_fn(move |request| forward(client.clone(), upstream.clone(), request));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    };
    tokio::select! {
        () = accept => {}
        () = shutdown_signal() => {}
    }
}

async fn shutdown_signal() {
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
