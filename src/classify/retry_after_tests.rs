//! Retry-hint parsing: seconds, fractional seconds, HTTP dates,
//! `retry-after-ms`, Gemini `retryDelay`, message text, `x-should-retry`;
//! garbage, negative, NaN and huge values.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::retry_after::{
    MAX_RETRY_HINT, parse_go_duration, parse_retry_after, parse_retry_after_ms, parse_should_retry,
    retry_delay_in_message, retry_hint_from_headers,
};
use crate::classify::Classifier;
use crate::{Decision, FailureClass};
use http::{HeaderMap, HeaderValue, StatusCode};

fn now() -> SystemTime {
    // Whole seconds: HTTP dates have no fractions.
    UNIX_EPOCH + Duration::from_secs(1_760_000_000)
}

#[test]
fn seconds_and_fractions() {
    assert_eq!(
        parse_retry_after("120", now()),
        Some(Duration::from_secs(120))
    );
    assert_eq!(parse_retry_after(" 0 ", now()), Some(Duration::ZERO));
    assert_eq!(
        parse_retry_after("1.5", now()),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(
        parse_retry_after("0.25", now()),
        Some(Duration::from_millis(250))
    );
    assert_eq!(parse_retry_after("+3", now()), Some(Duration::from_secs(3)));
}

#[test]
fn http_dates() {
    let later = httpdate::fmt_http_date(now() + Duration::from_secs(30));
    assert_eq!(
        parse_retry_after(&later, now()),
        Some(Duration::from_secs(30))
    );
    // A date already past means "retry now".
    let earlier = httpdate::fmt_http_date(now() - Duration::from_secs(30));
    assert_eq!(parse_retry_after(&earlier, now()), Some(Duration::ZERO));
    // The obsolete RFC 850 and asctime forms are HTTP dates too.
    assert_eq!(
        parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now()),
        Some(Duration::ZERO)
    );
    assert_eq!(
        parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now()),
        Some(MAX_RETRY_HINT)
    );
}

#[test]
fn milliseconds() {
    assert_eq!(
        parse_retry_after_ms("250"),
        Some(Duration::from_millis(250))
    );
    assert_eq!(
        parse_retry_after_ms("12.5"),
        Some(Duration::from_micros(12_500))
    );
    assert_eq!(parse_retry_after_ms("-1"), None);
    assert_eq!(parse_retry_after_ms("ms"), None);
}

#[test]
fn garbage_negative_nan_and_huge() {
    for bad in [
        "",
        "soon",
        "NaN",
        "nan",
        "inf",
        "-inf",
        "infinity",
        "1e3",
        "0x10",
        "1,5",
        "١٢",
        "5 s",
        "-5",
        "-0.5",
        "Mon, 99 Foo 2024",
    ] {
        assert_eq!(parse_retry_after(bad, now()), None, "retry-after {bad:?}");
        assert_eq!(parse_retry_after_ms(bad), None, "retry-after-ms {bad:?}");
    }
    assert_eq!(
        parse_retry_after("99999999999999999999999", now()),
        Some(MAX_RETRY_HINT)
    );
    assert_eq!(
        parse_retry_after(&"9".repeat(400), now()),
        Some(MAX_RETRY_HINT)
    );
    assert_eq!(parse_retry_after_ms("1000000000000"), Some(MAX_RETRY_HINT));
}

#[test]
fn header_order_and_should_retry() {
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", HeaderValue::from_static("9"));
    headers.insert("retry-after-ms", HeaderValue::from_static("1500"));
    headers.insert("x-should-retry", HeaderValue::from_static("TRUE"));
    let hint = retry_hint_from_headers(&headers, now());
    assert_eq!(hint.after, Some(Duration::from_millis(1500)));
    assert_eq!(hint.should_retry, Some(true));

    // A garbage retry-after-ms falls back to retry-after.
    headers.insert("retry-after-ms", HeaderValue::from_static("later"));
    assert_eq!(
        retry_hint_from_headers(&headers, now()).after,
        Some(Duration::from_secs(9))
    );

    headers.insert("x-should-retry", HeaderValue::from_static("false"));
    assert_eq!(parse_should_retry(&headers), Some(false));
    headers.insert("x-should-retry", HeaderValue::from_static("maybe"));
    assert_eq!(parse_should_retry(&headers), None);

    // A non-ASCII header value is ignored, not a panic.
    let mut headers = HeaderMap::new();
    headers.insert(
        "retry-after",
        HeaderValue::from_bytes(b"\xff\xfe5").unwrap(),
    );
    assert_eq!(retry_hint_from_headers(&headers, now()).after, None);
}

#[test]
fn gemini_retry_delays_and_message_text() {
    assert_eq!(parse_go_duration("53s"), Some(Duration::from_secs(53)));
    assert_eq!(
        parse_go_duration("45.83s"),
        Some(Duration::from_millis(45_830))
    );
    assert_eq!(parse_go_duration("-5s"), None);
    assert_eq!(parse_go_duration("soon"), None);
    assert_eq!(
        retry_delay_in_message("You exceeded your current quota... Please retry in 53.016342224s."),
        Some(Duration::from_nanos(53_016_342_224))
    );
    assert_eq!(
        retry_delay_in_message("Rate limit reached ... Please try again in 519ms. Visit ..."),
        Some(Duration::from_millis(519))
    );
    assert_eq!(
        retry_delay_in_message("Please try again in 6m0s."),
        Some(Duration::from_secs(360))
    );
    assert_eq!(retry_delay_in_message("Please retry in a moment."), None);
    assert_eq!(retry_delay_in_message("Please retry in "), None);
}

fn classify_429(headers: &[(&str, &str)], body: &str) -> crate::classify::Classification {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    Classifier::new().classify_head(None, StatusCode::TOO_MANY_REQUESTS, &map, body.as_bytes())
}

#[test]
fn through_the_classifier() {
    // Headers beat the body.
    let c = classify_429(
        &[("retry-after", "2")],
        r#"{"error":{"code":429,"message":"Please retry in 43.7s.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"53s"}]}}"#,
    );
    assert_eq!(c.retry.after, Some(Duration::from_secs(2)));

    // RetryInfo beats the message text.
    let c = classify_429(
        &[],
        r#"{"error":{"code":429,"message":"Please retry in 43.7s.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"53s"}]}}"#,
    );
    assert_eq!(c.retry.after, Some(Duration::from_secs(53)));

    // A garbage retryDelay falls back to the message.
    let c = classify_429(
        &[],
        r#"{"error":{"code":429,"message":"Please retry in 43.7s.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"NaNs"}]}}"#,
    );
    assert_eq!(c.retry.after, Some(Duration::from_millis(43_700)));

    // Garbage everywhere: still a rate limit, no hint.
    let c = classify_429(
        &[("retry-after", "whenever"), ("retry-after-ms", "-3")],
        "{}",
    );
    assert_eq!(
        (c.class, c.retry.after, c.recovery),
        (FailureClass::RateLimited, None, Decision::RetrySame)
    );

    // Huge: capped, and longer than the default 120 s wait → reroute.
    let c = classify_429(
        &[
            ("retry-after", "1e999999"),
            ("retry-after-ms", "99999999999999999"),
        ],
        "",
    );
    assert_eq!(
        (c.retry.after, c.recovery),
        (Some(MAX_RETRY_HINT), Decision::Reroute)
    );

    // With the cap lifted, the same hint keeps the retry.
    let mut map = HeaderMap::new();
    map.insert("retry-after", HeaderValue::from_static("600"));
    let c = Classifier::new().with_max_retry_wait(None).classify_head(
        None,
        StatusCode::TOO_MANY_REQUESTS,
        &map,
        b"",
    );
    assert_eq!(
        (c.retry.after, c.recovery),
        (Some(Duration::from_secs(600)), Decision::RetrySame)
    );
}
