//! The request one target receives: the dialect's body for the target's
//! model, and only the client headers the [`HeaderPolicy`] forwards (never
//! credentials or hop-by-hop ones unless named, see its docs).

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::Full;

use super::headers::{HeaderPolicy, content_length};
use crate::dialect::Dialect;
use crate::dialect::foreign::ForeignDialect;

/// Room in an upstream request's header map: what the policy forwards by
/// default that clients send (`accept`, a request id, trace context), the
/// content type and length, the credential the client service adds and a
/// dialect's own. Not the client's header count: most of a client's
/// headers stay behind, and hyper keeps the map of a connection's last
/// request (its cached headers) for as long as the connection lives, so an
/// idle stream would hold room it never used (1.2 KiB instead of 0.6 for a
/// map sized for seven). A request with more grows the map once.
const UPSTREAM_HEADERS: usize = 6;

/// The request for one target: the dialect's upstream body for `model`,
/// the client's method and path, and the client's headers the policy
/// forwards. For a target of another dialect (`translated`: its dialect and
/// the body translated for it), that body, its dialect's path and headers,
/// and none of the client dialect's own headers (an Anthropic beta means
/// nothing to a chat provider; such hints are advisory).
pub(super) fn request<D: Dialect>(
    dialect: &D,
    policy: &HeaderPolicy,
    parts: &http::request::Parts,
    request: &D::Request,
    model: &str,
    translated: Option<(&ForeignDialect, &Bytes)>,
) -> Request<Full<Bytes>> {
    let mut headers = HeaderMap::with_capacity(UPSTREAM_HEADERS);
    policy.copy_request(&parts.headers, &mut headers);
    let (body, path) = match translated {
        None => {
            dialect.upstream_headers(&parts.headers, &mut headers);
            (dialect.upstream_body(request, model), None)
        }
        Some((foreign, body)) => {
            for name in dialect.forwarded_request_headers() {
                headers.remove(*name);
            }
            foreign.0.upstream_headers(&parts.headers, &mut headers);
            (body.clone(), foreign.0.upstream_path())
        }
    };
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let length = content_length(parts.headers.get(CONTENT_LENGTH), body.len());
    headers.insert(CONTENT_LENGTH, length);
    let mut upstream = Request::new(Full::new(body));
    *upstream.method_mut() = parts.method.clone();
    // The path only: a client's query string may carry its own credential
    // (`?key=...`), which never goes upstream.
    *upstream.uri_mut() = match path {
        // Not `from_static`, which panics on a dialect's bad path.
        Some(path) => http::Uri::from_maybe_shared(Bytes::from_static(path.as_bytes()))
            .unwrap_or_else(|_| http::Uri::from_static("/")),
        // A client's path alone is its URI, shared rather than parsed again.
        None if parts.uri.query().is_none() && parts.uri.authority().is_none() => parts.uri.clone(),
        None => parts
            .uri
            .path()
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("/")),
    };
    *upstream.headers_mut() = headers;
    upstream
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::dialect::DefaultDialect;
    use http_body::Body as _;

    /// The client's stated length goes on when the body is its own bytes;
    /// a body the target's model made longer gets its own length.
    #[test]
    fn content_length_is_the_clients_for_its_own_body_and_new_for_an_edited_one() {
        let body =
            Bytes::from_static(br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#);
        // The default dialect reads the body the way its clients write it.
        let dialect = DefaultDialect::default();
        let (_, parsed) = dialect.read_request(body.clone()).unwrap();
        let (parts, ()) = Request::post("/v1/chat/completions")
            .header("content-length", body.len())
            .body(())
            .unwrap()
            .into_parts();
        let policy = HeaderPolicy::new();

        let same = request(&dialect, &policy, &parts, &parsed, "m", None);
        assert_eq!(same.body().size_hint().exact(), Some(body.len() as u64));
        assert_eq!(same.headers()[CONTENT_LENGTH], body.len().to_string());

        let edited = request(&dialect, &policy, &parts, &parsed, "a-longer-model", None);
        let length = edited.body().size_hint().exact().unwrap();
        assert_eq!(
            length,
            body.len() as u64 + "a-longer-model".len() as u64 - 1
        );
        assert_eq!(edited.headers()[CONTENT_LENGTH], length.to_string());
        assert_eq!(edited.headers().get_all(CONTENT_LENGTH).iter().count(), 1);
    }
}
