//! Retry hints: `retry-after-ms`, `retry-after` (seconds, fractional seconds
//! or an HTTP date), Gemini's `RetryInfo.retryDelay`, "Please retry in 43.7s"
//! in message text, OpenAI's `x-ratelimit-reset-*`, and `x-should-retry`.
//!
//! Every parser is total: garbage, negative, NaN and infinite values give
//! `None`; huge values are capped at [`MAX_RETRY_HINT`].

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::RetryHint;

/// The longest wait a retry hint can carry: one day. Larger values (a
/// `retry-after` years ahead, `1e300`) are capped to it rather than dropped,
/// so they still read as "much longer than any turn budget".
pub(crate) const MAX_RETRY_HINT: Duration = Duration::from_secs(86_400);

/// Seconds as `f64` to a capped `Duration`; `None` for negative or non-finite.
fn secs_to_hint(secs: f64) -> Option<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    if secs >= MAX_RETRY_HINT.as_secs_f64() {
        return Some(MAX_RETRY_HINT);
    }
    Duration::try_from_secs_f64(secs).ok()
}

/// A plain decimal number (`"2"`, `"1.5"`, `".5"`); rejects Rust's extra
/// spellings (`inf`, `NaN`, exponents) so only what a server would send counts.
fn parse_decimal(value: &str) -> Option<f64> {
    let v = value.trim();
    let digits = v.strip_prefix('+').unwrap_or(v);
    let negative = digits.starts_with('-');
    let body = digits.strip_prefix('-').unwrap_or(digits);
    if body.is_empty()
        || !body.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        || body.bytes().filter(|&b| b == b'.').count() > 1
        || body == "."
    {
        return None;
    }
    // Digits only, so an infinity here is an overflow: huge, not garbage.
    let n = body.parse::<f64>().ok()?.min(f64::MAX);
    Some(if negative { -n } else { n })
}

/// `retry-after-ms`: milliseconds, fractions allowed (as the OpenAI and
/// Anthropic SDKs read it).
pub(crate) fn parse_retry_after_ms(value: &str) -> Option<Duration> {
    secs_to_hint(parse_decimal(value)? / 1000.0)
}

/// `retry-after`: delay seconds (fractions allowed, as the SDKs accept) or
/// an HTTP date, measured from `now`. A date in the past means "now"
/// (`Duration::ZERO`); a negative number is garbage (`None`).
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if let Some(secs) = parse_decimal(v) {
        return secs_to_hint(secs);
    }
    let date = httpdate::parse_http_date(v).ok()?;
    match date.duration_since(now) {
        Ok(ahead) => Some(ahead.min(MAX_RETRY_HINT)),
        Err(_) => Some(Duration::ZERO),
    }
}

/// A Go-style duration (`"519ms"`, `"6m0s"`, `"1h2m3.5s"`, `"53.016342224s"`),
/// which also covers protobuf JSON durations (`"53s"`, `"45.83s"`) used by
/// Gemini's `RetryInfo.retryDelay`. A bare `"0"` is zero.
pub(crate) fn parse_go_duration(value: &str) -> Option<Duration> {
    let v = value.trim();
    if v == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = v.strip_prefix('+').unwrap_or(v);
    if rest.is_empty() || rest.starts_with('-') {
        return None;
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let num_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        if num_len == 0 {
            return None;
        }
        let number = parse_decimal(&rest[..num_len])?;
        rest = &rest[num_len..];
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(rest.len(), |(i, _)| i);
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    secs_to_hint(total)
}

/// A wait named in message text: Gemini's "Please retry in 43.7s." and
/// OpenAI's "Please try again in 519ms." (case-insensitive).
pub(crate) fn retry_delay_in_message(message: &str) -> Option<Duration> {
    let lower = message.to_ascii_lowercase();
    for needle in ["retry in ", "try again in "] {
        if let Some(at) = lower.find(needle) {
            let tail = &message[at + needle.len()..];
            let word = tail.split_whitespace().next().unwrap_or("");
            let word = word.trim_end_matches(['.', ',', ';', ')']);
            if let Some(d) = parse_go_duration(word) {
                return Some(d);
            }
        }
    }
    None
}

/// `x-should-retry`: `true`/`false` (case-insensitive); anything else `None`.
pub(crate) fn parse_should_retry(headers: &HeaderMap) -> Option<bool> {
    let v = headers.get("x-should-retry")?.to_str().ok()?.trim();
    if v.eq_ignore_ascii_case("true") {
        Some(true)
    } else if v.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// The hints carried by headers, in the SDKs' order: `retry-after-ms`, then
/// `retry-after`; plus `x-should-retry`.
pub(crate) fn retry_hint_from_headers(headers: &HeaderMap, now: SystemTime) -> RetryHint {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let after = header("retry-after-ms")
        .and_then(parse_retry_after_ms)
        .or_else(|| header("retry-after").and_then(|v| parse_retry_after(v, now)));
    RetryHint {
        after,
        should_retry: parse_should_retry(headers),
    }
}

/// OpenAI's `x-ratelimit-reset-{requests,tokens}` for the limit whose
/// `x-ratelimit-remaining-*` is 0. These say when the bucket is full again,
/// an upper bound on the wait, so they are used only when nothing better was
/// given.
pub(crate) fn ratelimit_reset_hint(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    ["requests", "tokens"]
        .into_iter()
        .filter(|kind| header(&format!("x-ratelimit-remaining-{kind}")).map(str::trim) == Some("0"))
        .filter_map(|kind| header(&format!("x-ratelimit-reset-{kind}")).and_then(parse_go_duration))
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_rejects_rust_only_spellings() {
        for bad in ["inf", "NaN", "1e3", "", ".", "1.2.3", "0x10", "- 1"] {
            assert_eq!(parse_decimal(bad), None, "{bad}");
        }
        assert_eq!(parse_decimal(" 1.5 "), Some(1.5));
        assert_eq!(parse_decimal("-2"), Some(-2.0));
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_go_duration("519ms"), Some(Duration::from_millis(519)));
        assert_eq!(
            parse_go_duration("1h2m3.5s"),
            Some(Duration::from_secs_f64(3723.5))
        );
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        for bad in ["", "s", "5", "5x", "-5s", "5s5", "1..5s"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
        assert_eq!(parse_go_duration("99999999h"), Some(MAX_RETRY_HINT));
    }
}
