//! The request one target receives: the dialect's body for the target's
//! model, and none of the client's credentials or hop-by-hop headers.

use bytes::Bytes;
use http::header::{
    AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HOST, PROXY_AUTHORIZATION, TE,
    TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use http_body_util::Full;

use crate::dialect::Dialect;

/// Request headers that carry the client's credentials: never sent upstream.
const CLIENT_CREDENTIALS: [&str; 3] = ["x-api-key", "api-key", "x-goog-api-key"];

/// The request for one target: the dialect's upstream body for `model`,
/// the client's method and path, and the client's headers less credentials
/// and hop-by-hop ones.
pub(super) fn request<D: Dialect>(
    dialect: &D,
    parts: &http::request::Parts,
    request: &D::Request,
    model: &str,
) -> Request<Full<Bytes>> {
    let body = dialect.upstream_body(request, model);
    // Headers the client's `Connection` names are hop-by-hop too.
    let named_by_connection: Vec<String> = parts
        .headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut headers = HeaderMap::with_capacity(parts.headers.len());
    for (name, value) in &parts.headers {
        if !forwardable(name) || named_by_connection.iter().any(|n| n == name.as_str()) {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    dialect.upstream_headers(&parts.headers, &mut headers);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    let mut upstream = Request::new(Full::new(body));
    *upstream.method_mut() = parts.method.clone();
    // The path only: a client's query string may carry its own credential
    // (`?key=...`), which never goes upstream.
    *upstream.uri_mut() = parts
        .uri
        .path()
        .parse()
        .unwrap_or_else(|_| http::Uri::from_static("/"));
    *upstream.headers_mut() = headers;
    upstream
}

fn forwardable(name: &HeaderName) -> bool {
    !(name == AUTHORIZATION
        || name == PROXY_AUTHORIZATION
        || name == COOKIE
        || name == HOST
        || name == CONTENT_LENGTH
        || name == CONNECTION
        || name == TRANSFER_ENCODING
        || name == TE
        || name == UPGRADE
        || name == TRAILER
        || name.as_str() == "keep-alive"
        || name.as_str().starts_with("proxy-")
        || CLIENT_CREDENTIALS.contains(&name.as_str()))
}
