//! The provider's rate-limit headers, kept for the records.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};

/// Most headers kept from one response.
const MAX_HEADERS: usize = 32;
/// Longest value kept; a longer one is no rate-limit figure.
const MAX_VALUE_BYTES: usize = 256;

/// The rate-limit headers of one provider response, as the provider sent
/// them: every header whose name contains `ratelimit` (`x-ratelimit-*`,
/// `anthropic-ratelimit-*`, the IETF draft's `ratelimit-*`), and
/// `retry-after` / `retry-after-ms`. At most 32 headers of at most 256
/// bytes each; they name limits, never a credential.
///
/// ```
/// use http::HeaderMap;
/// use tower_llm_failover::classify::RateLimitHeaders;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("anthropic-ratelimit-requests-remaining", "0".parse().unwrap());
/// headers.insert("retry-after", "12".parse().unwrap());
/// headers.insert("x-api-key", "sk-secret".parse().unwrap());
/// let kept = RateLimitHeaders::from_headers(&headers);
/// assert_eq!(kept.get("anthropic-ratelimit-requests-remaining"), Some("0"));
/// assert_eq!(kept.get("retry-after"), Some("12"));
/// assert_eq!(kept.iter().count(), 2);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
// One pointer wide, and shared by clones: a classification stays small.
pub struct RateLimitHeaders(Option<Arc<Vec<(HeaderName, HeaderValue)>>>);

impl RateLimitHeaders {
    /// The rate-limit headers among `headers`.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let kept: Vec<_> = headers
            .iter()
            .filter(|(name, value)| {
                let name = name.as_str();
                (names_a_rate_limit(name) || name == "retry-after" || name == "retry-after-ms")
                    && value.len() <= MAX_VALUE_BYTES
            })
            .take(MAX_HEADERS)
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        Self((!kept.is_empty()).then(|| Arc::new(kept)))
    }

    /// The first value of `name` (case-insensitive), when it is text.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.all()
            .iter()
            .find(|(n, _)| n.as_str().eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.to_str().ok())
    }

    /// Every kept header, in the response's order.
    pub fn iter(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        self.all().iter().map(|(n, v)| (n, v))
    }

    fn all(&self) -> &[(HeaderName, HeaderValue)] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }
}

/// Whether a header name contains `ratelimit`. Every name of every
/// response is checked: the word is compared only where an `r` stands,
/// where `str::contains` would set up a two-way search per name.
fn names_a_rate_limit(name: &str) -> bool {
    const WORD: &[u8] = b"ratelimit";
    name.as_bytes()
        .windows(WORD.len())
        .any(|window| window.first() == Some(&b'r') && window == WORD)
}

#[cfg(test)]
mod tests {
    use super::names_a_rate_limit;

    #[test]
    fn a_rate_limit_name_is_found_wherever_the_word_is() {
        for name in [
            "ratelimit",
            "x-ratelimit-remaining-requests",
            "anthropic-ratelimit-tokens-reset",
            "ratelimit-policy",
            "x-rratelimit",
            "tt-ratelimit",
        ] {
            assert!(names_a_rate_limit(name), "{name}");
        }
        for name in [
            "",
            "t",
            "content-type",
            "ratelimi",
            "atelimit",
            "x-rate-limit",
            "retry-after",
            "ratelimiT",
        ] {
            assert!(!names_a_rate_limit(name), "{name}");
        }
    }
}
