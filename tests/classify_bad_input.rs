//! Bad input: truncated JSON, a 10 MiB error body, invalid UTF-8, a body
//! that never ends, proxies' HTML pages. None panics; each gets a class.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tower_llm_failover::classify::Note;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{Full, StreamBody};
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::{
    FailureClass, Phase, classify::Classifier, classify::ClassifyLayer,
    classify::DEFAULT_BODY_LIMIT, classify::UpstreamError,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn classify_with<B>(classifier: Classifier, status: u16, body: B) -> UpstreamError
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
{
    let response = Response::builder().status(status).body(body).unwrap();
    let mut slot = Some(response);
    let upstream = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let response = slot.take().expect("called once");
        async move { Ok::<_, Infallible>(response) }
    });
    ServiceBuilder::new()
        .layer(ClassifyLayer::new().classifier(classifier))
        .service(upstream)
        .oneshot(Request::new(Full::default()))
        .await
        .err()
        .expect("a non-success status is an error")
}

async fn classify(status: u16, body: impl Into<Bytes>) -> UpstreamError {
    classify_with(Classifier::new(), status, Full::new(body.into())).await
}

#[tokio::test]
async fn truncated_json_falls_back_to_the_status() {
    let e = classify(
        429,
        &br#"{"error":{"message":"You exceeded your current quota","type":"insuff"#[..],
    )
    .await;
    let c = e.classification();
    assert_eq!((c.class, c.phase), (FailureClass::RateLimited, Phase::Head));
    assert_eq!(c.note, Some(Note::InvalidJsonErrorBody));
    assert_eq!(c.message, "HTTP 429 Too Many Requests");
    assert_eq!(c.provider_code, None);
}

#[tokio::test]
async fn odd_but_valid_json_falls_back_to_the_status() {
    for (body, note) in [
        (&b"\"just a string\""[..], Some(Note::UnknownErrorShape)),
        (b"123", Some(Note::UnknownErrorShape)),
        (b"{}", Some(Note::UnknownErrorShape)),
        (b"[]", Some(Note::UnknownErrorShape)),
        (b"null", Some(Note::UnknownErrorShape)),
        (
            br#"{"error":{"message":42,"code":{"nested":true},"type":[1]}}"#,
            None,
        ),
    ] {
        let e = classify(503, body).await;
        let c = e.classification();
        assert_eq!(
            c.class,
            FailureClass::Overloaded,
            "{}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(c.note, note, "{}", String::from_utf8_lossy(body));
    }
    // Nesting deeper than serde_json's recursion limit.
    let deep = "[".repeat(10_000);
    let e = classify(500, deep).await;
    assert_eq!(e.classification().class, FailureClass::ServerError);
    assert_eq!(e.classification().note, Some(Note::InvalidJsonErrorBody));
}

#[tokio::test]
async fn a_10_mib_body_is_capped() {
    // One huge frame.
    let mut big = br#"{"error":{"message":""#.to_vec();
    big.resize(10 * 1024 * 1024, b'x');
    let e = classify(500, big).await;
    assert_eq!(e.body().len(), DEFAULT_BODY_LIMIT);
    let c = e.classification();
    assert_eq!(c.class, FailureClass::ServerError);
    assert_eq!(c.note, Some(Note::ErrorBodyTooLarge));

    // Many frames: the layer stops pulling once the cap is reached.
    let pulled = Arc::new(AtomicUsize::new(0));
    let counter = pulled.clone();
    let chunks = stream::iter(0..160).map(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'a'; 64 * 1024])))
    });
    let e = classify_with(
        Classifier::new().with_body_limit(100 * 1024),
        502,
        StreamBody::new(chunks),
    )
    .await;
    assert_eq!(e.body().len(), 100 * 1024);
    assert_eq!(e.classification().note, Some(Note::ErrorBodyTooLarge));
    assert_eq!(e.classification().class, FailureClass::ServerError);
    assert_eq!(
        pulled.load(Ordering::SeqCst),
        2,
        "the second 64 KiB frame overflows the cap; no third is pulled"
    );
}

#[tokio::test]
async fn a_body_exactly_at_the_cap_is_whole() {
    let body = vec![b' '; 1024];
    let e = classify_with(
        Classifier::new().with_body_limit(1024),
        500,
        Full::new(Bytes::from(body)),
    )
    .await;
    assert_eq!(e.body().len(), 1024);
    assert_eq!(e.classification().note, Some(Note::EmptyErrorBody));
}

#[tokio::test]
async fn invalid_utf8() {
    // Plain text with invalid bytes: replaced, kept as the message.
    let e = classify(502, &b"bad gateway \xff\xfe from upstream"[..]).await;
    let c = e.classification();
    assert_eq!(c.class, FailureClass::ServerError);
    assert_eq!(c.message, "bad gateway \u{fffd}\u{fffd} from upstream");
    assert_eq!(c.note, Some(Note::TextErrorBody));

    // JSON with an invalid byte inside a string: not JSON, status decides.
    let e = classify(
        401,
        &b"{\"error\":{\"message\":\"bad \xff key\",\"code\":\"invalid_api_key\"}}"[..],
    )
    .await;
    assert_eq!(e.classification().class, FailureClass::Auth);
    assert_eq!(e.classification().note, Some(Note::InvalidJsonErrorBody));

    // In-band and 200 bodies too.
    let classifier = Classifier::new();
    let c = classifier.classify_in_band(None, Some("error"), b"\xff\xfe\xfd", Phase::Preamble);
    assert_eq!(
        (c.class, c.note),
        (FailureClass::ServerError, Some(Note::UnparsedErrorEvent))
    );
    let c = classifier.classify_in_band(
        None,
        None,
        b"{\"error\":{\"message\":\"\xff",
        Phase::Preamble,
    );
    assert_eq!(
        (c.class, c.note),
        (FailureClass::InvalidResponse, Some(Note::NoErrorInEvent))
    );
    let c = classifier
        .validate_body(&tower_llm_failover::dialect::OpenAiChat, None, b"\xff{}")
        .unwrap_err();
    assert_eq!(
        (c.class, c.note),
        (FailureClass::InvalidResponse, Some(Note::InvalidJson))
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_that_never_ends_is_capped_by_time() {
    let started = tokio::time::Instant::now();
    let body = StreamBody::new(stream::pending::<Result<Frame<Bytes>, Infallible>>());
    let e = classify_with(Classifier::new(), 503, body).await;
    let c = e.classification();
    assert_eq!(
        (c.class, c.note),
        (FailureClass::Overloaded, Some(Note::ErrorBodyTimeout))
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "the default body timeout, in paused time"
    );

    // Some bytes, then silence: what arrived is kept and parsed.
    let started = tokio::time::Instant::now();
    let first = Bytes::from_static(br#"{"error":{"code":429,"message":"m","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"PerDayQuota"}]}]}}"#);
    let body = StreamBody::new(
        stream::iter([Ok::<_, Infallible>(Frame::data(first.clone()))]).chain(stream::pending()),
    );
    let e = classify_with(
        Classifier::new().with_body_timeout(Duration::from_secs(2)),
        429,
        body,
    )
    .await;
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(e.body(), &first);
    let c = e.classification();
    assert_eq!(
        (c.class, c.note),
        (FailureClass::QuotaExhausted, Some(Note::ErrorBodyTimeout))
    );
}

/// A body that is always ready with an empty data frame: never pending,
/// never ending.
struct EndlessEmptyFrames;

impl http_body::Body for EndlessEmptyFrames {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(Some(Ok(Frame::data(Bytes::new()))))
    }
}

#[tokio::test]
async fn a_busy_body_that_never_ends_is_capped_by_time() {
    // Real (short) time: a body that is always ready keeps the task busy,
    // which paused time would never advance past.
    let classifier = Classifier::new().with_body_timeout(Duration::from_millis(50));
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        classify_with(classifier, 500, EndlessEmptyFrames),
    )
    .await
    .expect("the body timeout ends the read");
    assert_eq!(e.classification().note, Some(Note::ErrorBodyTimeout));
    assert_eq!(e.classification().class, FailureClass::ServerError);
    assert!(e.body().is_empty());
}

#[tokio::test]
async fn a_body_that_errors() {
    let body = StreamBody::new(stream::iter([
        Ok(Frame::data(Bytes::from_static(b"{\"error\":"))),
        Err::<Frame<Bytes>, BoxError>("connection reset".into()),
    ]));
    let e = classify_with(Classifier::new(), 504, body).await;
    let c = e.classification();
    assert_eq!(
        (c.class, c.note),
        (FailureClass::Timeout, Some(Note::ErrorBodyUnreadable))
    );
    assert_eq!(e.body().as_ref(), b"{\"error\":");
}

const CLOUDFLARE_502: &str = r#"<!DOCTYPE html>
<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> <![endif]-->
<!--[if gt IE 8]><!--> <html class="no-js" lang="en-US"> <!--<![endif]-->
<head>
<title>api.example.com | 502: Bad gateway</title>
<meta charset="UTF-8" />
<meta http-equiv="Content-Type" content="text/html; charset=UTF-8" />
</head>
<body>
<div id="cf-wrapper"><div id="cf-error-details" class="p-0">
<h1 class="inline-block sm:block sm:mb-2 font-light text-60 lg:text-4xl text-black-dark leading-tight mr-2"><span class="inline-block">Bad gateway</span><span class="code-label">Error code 502</span></h1>
<p>The web server reported a bad gateway error.</p>
<span>Cloudflare Ray ID: <strong class="font-semibold">8b1d2c3e4f5a6b7c</strong></span>
</div></div>
</body>
</html>"#;

#[tokio::test]
async fn html_error_pages_from_proxies() {
    let e = classify(502, CLOUDFLARE_502).await;
    let c = e.classification();
    assert_eq!((c.class, c.phase), (FailureClass::ServerError, Phase::Head));
    assert_eq!(c.message, "api.example.com | 502: Bad gateway");
    assert_eq!(c.note, Some(Note::HtmlErrorBody));

    let nginx_503 = "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n<center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n";
    let e = classify(503, nginx_503).await;
    assert_eq!(e.classification().class, FailureClass::Overloaded);
    assert_eq!(
        e.classification().message,
        "503 Service Temporarily Unavailable"
    );

    let cloudflare_524 = "<!DOCTYPE html><html><head><title>api.example.com | 524: A timeout occurred</title></head><body></body></html>";
    assert_eq!(
        classify(524, cloudflare_524).await.classification().class,
        FailureClass::Timeout
    );

    // No title at all: the status line is the message.
    let e = classify(502, "<html><body><h1>Bad Gateway</h1></body></html>").await;
    assert_eq!(e.classification().message, "HTTP 502 Bad Gateway");

    // Envoy's plain-text answer.
    let e = classify(503, "upstream connect error or disconnect/reset before headers. reset reason: connection failure").await;
    assert_eq!(e.classification().class, FailureClass::Overloaded);
    assert_eq!(e.classification().note, Some(Note::TextErrorBody));
}

#[test]
fn in_band_garbage_never_panics() {
    let classifier = Classifier::new();
    let cases: &[(Option<&str>, &[u8], FailureClass)] = &[
        (None, b"", FailureClass::InvalidResponse),
        (None, b"[DONE]", FailureClass::InvalidResponse),
        (None, br#"{"error":"#, FailureClass::InvalidResponse),
        (Some("error"), b"", FailureClass::ServerError),
        (
            Some("error"),
            br#"{"type":"error""#,
            FailureClass::ServerError,
        ),
        (None, br#"{"error":{}}"#, FailureClass::ServerError),
        (
            None,
            br#"{"error":{"type":"invalid_request_error","message":"bad"}}"#,
            FailureClass::InvalidRequest,
        ),
        (
            None,
            br#"{"error":{"code":99999999999999999999999}}"#,
            FailureClass::ServerError,
        ),
        (
            None,
            br#"{"error":{"code":-429}}"#,
            FailureClass::ServerError,
        ),
    ];
    for (event, data, class) in cases {
        let c = classifier.classify_in_band(None, *event, data, Phase::Committed);
        assert_eq!(
            c.class,
            *class,
            "{event:?} {}",
            String::from_utf8_lossy(data)
        );
        assert_eq!(c.phase, Phase::Committed);
    }
}
