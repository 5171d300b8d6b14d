//! Which of the client's headers travel upstream.

use http::HeaderMap;
use http::header::{self, HeaderName, HeaderValue};
use smallvec::SmallVec;

/// Hop-by-hop headers (RFC 9110 §7.6.1, plus the legacy `keep-alive` and
/// `proxy-connection`): they describe the client's connection, not ours.
pub(crate) const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Credentials a client may send to the gateway; none of them is ever
/// forwarded (the target gets its own from [`Auth`](super::Auth)).
pub(crate) const CREDENTIALS: [HeaderName; 6] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-goog-api-key"),
];

/// Rewrites the client's headers for the upstream:
/// - drops hop-by-hop headers and any header the `Connection` header names;
/// - drops every client credential and the configured extras;
/// - drops the client's `host`: `host` is the upstream's, given here for a
///   plain `http` endpoint (made once) and otherwise set by hyper-util from
///   the upstream URI for HTTP/1.1 (HTTP/2 carries `:authority`);
/// - drops `accept-encoding`, so the upstream answers uncompressed bytes the
///   gateway can read (SSE scanning, error bodies);
/// - drops `content-length` when the body knows its exact length and the
///   header does not state it, once (hyper then sets the right one; a
///   rewritten body may differ from the client's). One that states it is
///   kept: hyper sends it as it would its own, and removing it only to
///   have hyper add it back costs two lookups per request;
/// - sets the target's credential.
pub(crate) fn prepare(
    headers: &mut HeaderMap,
    extra: &[HeaderName],
    credential: Option<&(HeaderName, HeaderValue)>,
    host: Option<&HeaderValue>,
    body_length: Option<u64>,
) {
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    // One pass over the few headers present, then a removal for each one
    // dropped: removing every listed name (eighteen lookups, each hashing
    // the name) cost more than the rest of preparing the request.
    let mut digits = itoa::Buffer::new();
    let length = body_length.map(|length| digits.format(length).as_bytes());
    let mut lengths = 0;
    let mut dropped: SmallVec<[HeaderName; 4]> = SmallVec::new();
    for (name, value) in headers.iter() {
        let drop = HOP_BY_HOP.contains(name)
            || CREDENTIALS.contains(name)
            || extra.contains(name)
            || *name == header::HOST
            || *name == header::ACCEPT_ENCODING
            || (*name == header::CONTENT_LENGTH
                && length.is_some_and(|length| {
                    lengths += 1;
                    lengths > 1 || value.as_bytes() != length
                }));
        // A name's values come together: one removal takes them all.
        if drop && dropped.last() != Some(name) {
            dropped.push(name.clone());
        }
    }
    for name in dropped {
        headers.remove(name);
    }
    if let Some((name, value)) = credential {
        headers.insert(name.clone(), value.clone());
    }
    if let Some(host) = host {
        headers.insert(header::HOST, host.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("authorization", "Bearer sk-client"),
            ("x-api-key", "client-key"),
            ("api-key", "client-key"),
            ("x-goog-api-key", "client-key"),
            ("proxy-authorization", "Basic abc"),
            ("cookie", "session=1"),
            ("connection", "keep-alive, x-custom-hop"),
            ("x-custom-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("proxy-connection", "keep-alive"),
            ("host", "gateway.local"),
            ("accept-encoding", "gzip"),
            ("content-length", "12"),
            ("content-type", "application/json"),
            ("user-agent", "OpenAI/Python 1.0"),
            ("x-team-secret", "t"),
            ("openai-beta", "assistants=v2"),
        ] {
            h.append(name, HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn drops_hop_by_hop_and_credentials_keeps_the_rest() {
        let mut h = client_headers();
        let own = (
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-target"),
        );
        prepare(
            &mut h,
            &[HeaderName::from_static("x-team-secret")],
            Some(&own),
            None,
            Some(7),
        );
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["authorization", "content-type", "openai-beta", "user-agent"]
        );
        assert_eq!(h[header::AUTHORIZATION], "Bearer sk-target");
        assert_eq!(h.get_all(header::AUTHORIZATION).iter().count(), 1);
    }

    #[test]
    fn content_length_stays_when_the_body_length_is_unknown() {
        let mut h = client_headers();
        prepare(&mut h, &[], None, None, None);
        assert_eq!(h[header::CONTENT_LENGTH], "12");
        assert!(!h.contains_key(header::AUTHORIZATION));
    }

    /// A known body length: a `content-length` stating it stays (once);
    /// another value, or the header twice, goes for hyper to set.
    #[test]
    fn content_length_stays_only_when_it_states_the_body_length() {
        let mut h = client_headers();
        prepare(&mut h, &[], None, None, Some(12));
        assert_eq!(h[header::CONTENT_LENGTH], "12");
        let mut h = client_headers();
        prepare(&mut h, &[], None, None, Some(13));
        assert!(!h.contains_key(header::CONTENT_LENGTH));
        let mut h = client_headers();
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        prepare(&mut h, &[], None, None, Some(12));
        assert!(!h.contains_key(header::CONTENT_LENGTH));
    }
}
