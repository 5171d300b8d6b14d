//! Which headers cross the gateway, each way: an allow-list for the
//! client's request headers (to the provider) and one for the provider's
//! response headers (to the client). See [`HeaderPolicy`].

use http::header::{CONNECTION, CONTENT_LENGTH};
use http::{HeaderMap, HeaderName, HeaderValue};
use smallvec::SmallVec;

/// Client request headers that reach the provider by default.
///
/// - `accept`, `content-type`: what the body is and what the client reads
///   (the gateway sets `content-type: application/json` itself);
/// - `x-request-id`, `traceparent`, `tracestate`: the client's request id
///   and W3C trace context, so one request can be followed end to end;
/// - and the headers the route's dialect names
///   ([`Dialect::forwarded_request_headers`](crate::dialect::Dialect::forwarded_request_headers)):
///   for Anthropic Messages `anthropic-version` and `anthropic-beta`, the
///   shape of the request, which the provider needs to read it.
///
/// Not forwarded by default: `user-agent` (the gateway is the provider's
/// client), `accept-encoding` (the gateway reads the answer, so it takes
/// it uncompressed), SDK telemetry such as `x-stainless-*`, and every
/// other custom header.
pub(crate) const DEFAULT_REQUEST_HEADERS: [&str; 5] = [
    "accept",
    "content-type",
    "x-request-id",
    "traceparent",
    "tracestate",
];

/// The `anthropic-beta` values that reach the provider by default; any
/// other beta a client names is dropped (and the header with it when none
/// is left).
///
/// Each of these changes only the shape or length of the answer the
/// client asked for. Left out on purpose, because they reach past the
/// request: `files-api-*` (the operator's stored files), `mcp-client-*`
/// (the provider fetches URLs the client chose), `code-execution-*` (runs
/// code on the operator's account), `context-1m-*` (a pricing tier the
/// gateway's spend figures do not model), and every beta not listed.
/// An operator adds more with [`HeaderPolicy::allow_anthropic_betas`].
pub const DEFAULT_ANTHROPIC_BETAS: [&str; 7] = [
    "interleaved-thinking-2025-05-14",
    "fine-grained-tool-streaming-2025-05-14",
    "token-efficient-tools-2025-02-19",
    "output-128k-2025-02-19",
    "prompt-caching-2024-07-31",
    "extended-cache-ttl-2025-04-11",
    "context-management-2025-06-27",
];

/// Provider response headers that reach the client by default (a name
/// ending in `*` is a prefix).
///
/// - `content-type`, `cache-control`: what the answer is and how it may be
///   cached;
/// - `x-request-id` (OpenAI) and `request-id` (Anthropic): the provider's
///   id of the request, which its support asks for;
/// - `x-ratelimit-*`, `anthropic-ratelimit-*`, `retry-after`,
///   `retry-after-ms`: rate-limit state under the provider's own names, which
///   the official SDKs read to pace themselves.
///
/// Not forwarded by default: `set-cookie`, `openai-organization`,
/// `openai-project`, `openai-version`, `openai-processing-ms` (the
/// provider's account and internals: the gateway reports its own timing in
/// its records), debug and tracing headers of the provider's
/// infrastructure, and anything else. The failover layer's own
/// `x-failover-*` headers are added after this filter.
pub(crate) const DEFAULT_RESPONSE_HEADERS: [&str; 8] = [
    "content-type",
    "cache-control",
    "x-request-id",
    "request-id",
    "x-ratelimit-*",
    "anthropic-ratelimit-*",
    "retry-after",
    "retry-after-ms",
];

/// Headers that carry a credential or choose whose account pays: they
/// pass only when the operator names them exactly, never by a `*` prefix.
const SENSITIVE: [&str; 8] = [
    "authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "openai-organization",
    "openai-project",
];

/// Hop-by-hop headers (RFC 9110 §7.6.1), and the framing headers the
/// gateway writes itself: never forwarded either way, whatever the lists
/// say. Headers a `Connection` header names are hop-by-hop too.
const NEVER: [&str; 9] = [
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "proxy-connection",
];

/// Which headers cross the failover layer, each way.
///
/// Both directions are allow-lists: a header passes only when a list
/// names it (the lists below by default). A name ending in `*` is a prefix (`x-ratelimit-*`). Names
/// are case-insensitive.
///
/// Three rules hold whatever the lists say:
///
/// - hop-by-hop headers (`connection`, `keep-alive`, `te`, `trailer`,
///   `transfer-encoding`, `upgrade`, `proxy-*` (`proxy-authorization`
///   included), and any header a
///   `Connection` header names), `host` and `content-length` are never
///   forwarded, either way;
/// - credential and account headers (`authorization`, `cookie`, `set-cookie`, `x-api-key`, `api-key`,
///   `x-goog-api-key`, `openai-organization`, `openai-project`) pass only
///   when named exactly, never through a prefix;
/// - the target's own credential is set by its client
///   (`tower_llm_client::UpstreamClient`), not by this
///   policy.
///
/// ```
/// use tower_llm_failover::failover::{Failover, HeaderPolicy, Target};
/// # let upstream = tower_llm_testing::FakeProvider::new("primary");
///
/// // On top of the defaults: the client's `openai-organization` (named
/// // exactly, as a credential header must be) and every `x-tenant-*`
/// // header go to the provider; the provider's `openai-processing-ms`
/// // comes back. `openai-project` and `set-cookie` still do not pass.
/// let policy = HeaderPolicy::new()
///     .forward_request_headers(["openai-organization", "x-tenant-*"])
///     .forward_response_headers(["openai-processing-ms"]);
/// let failover = Failover::builder()
///     .target(Target::new("primary", upstream))
///     .header_policy(policy)
///     .build();
/// # let _ = failover;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderPolicy {
    request: AllowList,
    response: AllowList,
    /// The `anthropic-beta` values a forwarded header may carry.
    betas: Vec<Box<str>>,
}

/// A request header whose comma-separated values pass one by one.
const ANTHROPIC_BETA: &str = "anthropic-beta";

impl Default for HeaderPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderPolicy {
    /// The default lists (see the type's docs).
    pub fn new() -> Self {
        Self::empty()
            .forward_request_headers(DEFAULT_REQUEST_HEADERS)
            .forward_response_headers(DEFAULT_RESPONSE_HEADERS)
            .allow_anthropic_betas(DEFAULT_ANTHROPIC_BETAS)
    }

    /// Empty lists: no header crosses but those named later (and those the
    /// gateway writes itself, such as `content-type` on a request).
    pub fn empty() -> Self {
        Self {
            request: AllowList::default(),
            response: AllowList::default(),
            betas: Vec::new(),
        }
    }

    /// Adds `anthropic-beta` values a client may ask the provider for
    /// (exact names; the header itself must be forwarded too, as it is by
    /// default). See [`DEFAULT_ANTHROPIC_BETAS`] for what is allowed
    /// unless added here, and why.
    pub fn allow_anthropic_betas<I>(mut self, betas: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        add(&mut self.betas, betas);
        self
    }

    /// Whether an `anthropic-beta` value reaches the provider.
    pub(crate) fn allows_anthropic_beta(&self, beta: &str) -> bool {
        let beta = beta.trim().to_ascii_lowercase();
        self.betas.iter().any(|b| **b == *beta)
    }

    /// Adds client request headers that reach the provider.
    pub fn forward_request_headers<I>(mut self, names: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.request.add(names);
        self
    }

    /// Adds provider response headers that reach the client.
    pub fn forward_response_headers<I>(mut self, names: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.response.add(names);
        self
    }

    /// Copies the client's headers this policy forwards into `upstream`.
    pub(crate) fn copy_request(&self, client: &HeaderMap, upstream: &mut HeaderMap) {
        let named = named_by_connection(client);
        for (name, value) in client {
            if !passes(&self.request, name, &named) {
                continue;
            }
            if name.as_str() == ANTHROPIC_BETA {
                if let Some(kept) = self.kept_betas(value) {
                    upstream.append(name.clone(), kept);
                }
                continue;
            }
            upstream.append(name.clone(), value.clone());
        }
    }

    /// The allowed betas of one `anthropic-beta` value, or `None` when
    /// none is (the value as it came when every one is).
    fn kept_betas(&self, value: &HeaderValue) -> Option<HeaderValue> {
        let text = value.to_str().ok()?;
        let betas: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .collect();
        let kept: Vec<&str> = betas
            .iter()
            .copied()
            .filter(|b| self.allows_anthropic_beta(b))
            .collect();
        if kept.len() < betas.len() {
            tracing::debug!(
                asked = %crate::util::log_safe(text),
                "anthropic-beta values outside the allow-list dropped"
            );
        }
        match kept.len() {
            0 => None,
            n if n == betas.len() => Some(value.clone()),
            _ => HeaderValue::from_str(&kept.join(",")).ok(),
        }
    }

    /// Drops the provider's headers this policy does not forward. For a
    /// whole answer of `body_length` bytes, a `content-length` (given once)
    /// that states that length stays, and the gateway's own is set
    /// otherwise: a provider's whole answer passed on as it came keeps its
    /// header rather than losing it and getting the same one back (a
    /// lookup, a removal and an insertion per turn).
    pub(crate) fn filter_response(&self, headers: &mut HeaderMap, body_length: Option<usize>) {
        let named = named_by_connection(headers);
        let mut digits = itoa::Buffer::new();
        let length = body_length.map(|length| digits.format(length).as_bytes());
        let mut lengths = 0;
        // Inline: a provider's answer always carries a few framing headers
        // to drop (`content-length`, `connection`), and a list on the heap
        // would cost an allocation per turn.
        let mut dropped: SmallVec<[HeaderName; 6]> = SmallVec::new();
        for (name, value) in headers.iter() {
            let drop = if *name == CONTENT_LENGTH {
                lengths += 1;
                length.is_none_or(|length| lengths > 1 || value.as_bytes() != length)
            } else {
                !passes(&self.response, name, &named)
            };
            // A name's values come together: one removal takes them all.
            if drop && dropped.last() != Some(name) {
                dropped.push(name.clone());
            }
        }
        let kept = lengths == 1 && !dropped.contains(&CONTENT_LENGTH);
        for name in dropped {
            headers.remove(name);
        }
        if let Some(length) = body_length.filter(|_| !kept) {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
        }
    }
}

/// The `content-length` for a body of `length` bytes: the value `stated`
/// (the client's, for the upstream request) when it says the same, shared
/// rather than written again, else a new one. (A whole answer's is kept
/// in place by [`HeaderPolicy::filter_response`].)
pub(crate) fn content_length(stated: Option<&HeaderValue>, length: usize) -> HeaderValue {
    let mut digits = itoa::Buffer::new();
    let text = digits.format(length);
    match stated {
        Some(value) if value.as_bytes() == text.as_bytes() => value.clone(),
        _ => HeaderValue::from(length),
    }
}

fn add<I>(list: &mut Vec<Box<str>>, names: I)
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    for name in names {
        let name = name.as_ref().trim().to_ascii_lowercase();
        if !name.is_empty() && !list.iter().any(|n| **n == *name) {
            list.push(name.into());
        }
    }
}

/// Whether `name` (lowercase) passes `list`, hop-by-hop rules first.
/// One direction's allow-list: the names as configured, and the same split
/// for the check each header of each turn makes (an exact name is one
/// comparison of header names, which for the standard names `http` knows
/// is one of small numbers; the never-forwarded and sensitive names are
/// looked at only when a `prefix-*` entry matches).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct AllowList {
    /// As configured: lowercase, trimmed, without repeats.
    entries: Vec<Box<str>>,
    /// The exact names that can pass (a never-forwarded name cannot, nor
    /// one that is not a header name).
    exact: Vec<HeaderName>,
    /// The prefixes of the `prefix-*` entries.
    prefixes: Vec<Box<str>>,
}

impl AllowList {
    fn add<I>(&mut self, names: I)
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        add(&mut self.entries, names);
        self.exact.clear();
        self.prefixes.clear();
        for entry in &self.entries {
            match entry.strip_suffix('*') {
                Some(prefix) => self.prefixes.push(prefix.into()),
                None if never(entry) => {}
                None => self
                    .exact
                    .extend(HeaderName::from_bytes(entry.as_bytes()).ok()),
            }
        }
    }

    /// Whether a header of this name passes: named exactly, or under a
    /// prefix and neither never forwarded nor sensitive.
    fn allows(&self, name: &HeaderName) -> bool {
        if self.exact.contains(name) {
            return true;
        }
        let name = name.as_str();
        self.prefixes
            .iter()
            .any(|prefix| name.starts_with(&**prefix))
            && !never(name)
            && !SENSITIVE.contains(&name)
    }
}

/// Hop-by-hop and framing headers: never forwarded, whatever the list.
fn never(name: &str) -> bool {
    NEVER.contains(&name) || name.starts_with("proxy-")
}

fn passes(list: &AllowList, name: &HeaderName, named: &[String]) -> bool {
    list.allows(name) && !named.iter().any(|n| n == name.as_str())
}

/// The headers a `Connection` header names: hop-by-hop as well.
fn named_by_connection(headers: &HeaderMap) -> Vec<String> {
    // Most messages have no `Connection` header: a look at each name (a
    // comparison of small numbers for the standard ones) is cheaper than
    // the lookup.
    if !headers.keys().any(|name| *name == CONNECTION) {
        return Vec::new();
    }
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect()
}

#[cfg(test)]
impl HeaderPolicy {
    /// Whether a client request header of this name reaches the provider
    /// (when no `Connection` header names it; before the route's dialect
    /// adds its own).
    pub(crate) fn forwards_request_header(&self, name: &str) -> bool {
        HeaderName::from_bytes(name.as_bytes()).is_ok_and(|name| self.request.allows(&name))
    }

    /// Whether a provider response header of this name reaches the client
    /// (when no `Connection` header names it).
    pub(crate) fn forwards_response_header(&self, name: &str) -> bool {
        HeaderName::from_bytes(name.as_bytes()).is_ok_and(|name| self.response.allows(&name))
    }

    /// The client request headers that reach the provider, as configured.
    pub(crate) fn request_headers(&self) -> impl Iterator<Item = &str> {
        self.request.entries.iter().map(|n| &**n)
    }

    /// The provider response headers that reach the client, as configured.
    pub(crate) fn response_headers(&self) -> impl Iterator<Item = &str> {
        self.response.entries.iter().map(|n| &**n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole answer's `content-length` stays when it states the body's
    /// length (once), and is the body's length otherwise; a stream's goes.
    #[test]
    fn a_whole_answer_keeps_a_content_length_that_states_its_length() {
        let policy = HeaderPolicy::new();
        let answer = |lengths: &[&'static str]| {
            let mut headers = HeaderMap::new();
            headers.insert("content-type", HeaderValue::from_static("application/json"));
            headers.insert(
                "date",
                HeaderValue::from_static("Fri, 04 Dec 2026 21:00:00 GMT"),
            );
            for length in lengths {
                headers.append(CONTENT_LENGTH, HeaderValue::from_static(length));
            }
            headers
        };
        let lengths = |headers: &HeaderMap| -> Vec<String> {
            headers
                .get_all(CONTENT_LENGTH)
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect()
        };
        for (given, body, sent) in [
            (&["12"][..], Some(12), &["12"][..]),
            (&["13"][..], Some(12), &["12"][..]),
            (&["12", "12"][..], Some(12), &["12"][..]),
            (&[][..], Some(12), &["12"][..]),
            (&["12"][..], None, &[][..]),
        ] {
            let mut headers = answer(given);
            policy.filter_response(&mut headers, body);
            assert_eq!(lengths(&headers), sent, "{given:?} {body:?}");
            assert!(headers.get("date").is_none());
            assert_eq!(headers["content-type"], "application/json");
        }
    }

    #[test]
    fn content_length_is_the_stated_value_only_when_it_says_the_same() {
        let stated = HeaderValue::from_static("12");
        assert_eq!(content_length(Some(&stated), 12), "12");
        assert_eq!(content_length(Some(&stated), 13), "13");
        // Same number, other spelling: written again.
        let padded = HeaderValue::from_static("012");
        assert_eq!(content_length(Some(&padded), 12), "12");
        assert_eq!(content_length(None, 0), "0");
        assert_eq!(
            content_length(None, usize::MAX),
            usize::MAX.to_string().as_str()
        );
    }

    /// What the type docs' example configures.
    #[test]
    fn named_and_prefixed_headers_pass_on_top_of_the_defaults() {
        let policy = HeaderPolicy::new()
            .forward_request_headers(["openai-organization", "x-tenant-*"])
            .forward_response_headers(["openai-processing-ms"]);
        assert!(policy.forwards_request_header("OpenAI-Organization"));
        assert!(policy.forwards_request_header("x-tenant-id"));
        assert!(!policy.forwards_request_header("openai-project"));
        assert!(policy.forwards_response_header("openai-processing-ms"));
        assert!(policy.forwards_response_header("x-ratelimit-remaining-requests"));
        assert!(!policy.forwards_response_header("set-cookie"));
    }

    #[test]
    fn the_configured_lists_read_back_lowercase_once_each_in_order() {
        let policy = HeaderPolicy::empty()
            .forward_request_headers(["X-Tenant-*", "OpenAI-Organization", "x-tenant-*"])
            .forward_response_headers(["OpenAI-Processing-Ms"]);
        assert_eq!(
            policy.request_headers().collect::<Vec<_>>(),
            ["x-tenant-*", "openai-organization"]
        );
        assert_eq!(
            policy.response_headers().collect::<Vec<_>>(),
            ["openai-processing-ms"]
        );
    }

    #[test]
    fn hop_by_hop_never_passes_even_when_named() {
        let policy = HeaderPolicy::empty()
            .forward_request_headers([
                "connection",
                "te",
                "proxy-authorization",
                "proxy-*",
                "x-*",
                "*",
            ])
            .forward_response_headers(["transfer-encoding", "keep-alive", "*"]);
        for name in [
            "connection",
            "te",
            "proxy-connection",
            "proxy-authorization",
            "host",
            "content-length",
        ] {
            assert!(!policy.forwards_request_header(name), "{name}");
        }
        for name in ["transfer-encoding", "keep-alive", "upgrade", "trailer"] {
            assert!(!policy.forwards_response_header(name), "{name}");
        }
    }

    #[test]
    fn credentials_pass_only_when_named_exactly() {
        let wide = HeaderPolicy::new().forward_request_headers(["*", "x-*", "openai-*"]);
        for name in SENSITIVE {
            assert!(!wide.forwards_request_header(name), "{name}");
        }
        assert!(wide.forwards_request_header("x-custom"));
        let named = HeaderPolicy::new().forward_request_headers(["X-Api-Key"]);
        assert!(named.forwards_request_header("x-api-key"));
    }

    #[test]
    fn anthropic_betas_pass_only_from_the_allow_list() {
        let mut client = HeaderMap::new();
        client.append(
            "anthropic-beta",
            "interleaved-thinking-2025-05-14, files-api-2025-04-14"
                .parse()
                .unwrap(),
        );
        client.append("anthropic-beta", "mcp-client-2025-04-04".parse().unwrap());
        client.append("anthropic-beta", "output-128k-2025-02-19".parse().unwrap());
        // The Messages dialect names the header; its values are filtered.
        let messages = || HeaderPolicy::new().forward_request_headers(["anthropic-beta"]);
        let mut upstream = HeaderMap::new();
        messages().copy_request(&client, &mut upstream);
        let sent: Vec<_> = upstream.get_all("anthropic-beta").iter().collect();
        assert_eq!(
            sent,
            ["interleaved-thinking-2025-05-14", "output-128k-2025-02-19"]
        );
        // An operator may allow more; a policy that does not forward the
        // header sends none.
        let mut upstream = HeaderMap::new();
        messages()
            .allow_anthropic_betas(["files-api-2025-04-14"])
            .copy_request(&client, &mut upstream);
        let sent: Vec<_> = upstream.get_all("anthropic-beta").iter().collect();
        assert_eq!(
            sent,
            [
                "interleaved-thinking-2025-05-14, files-api-2025-04-14",
                "output-128k-2025-02-19"
            ]
        );
        let mut upstream = HeaderMap::new();
        HeaderPolicy::empty().copy_request(&client, &mut upstream);
        assert!(upstream.get("anthropic-beta").is_none());
    }

    #[test]
    fn headers_named_by_connection_are_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", "x-request-id".parse().unwrap());
        headers.insert("x-request-id", "r".parse().unwrap());
        headers.insert("content-type", "application/json".parse().unwrap());
        HeaderPolicy::new().filter_response(&mut headers, None);
        assert!(headers.get("x-request-id").is_none());
        assert!(headers.get("connection").is_none());
        assert_eq!(headers["content-type"], "application/json");
    }
}
