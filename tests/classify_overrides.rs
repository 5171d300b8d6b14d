//! User overrides by status, provider code and provider.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::{
    Decision, FailureClass, Phase, classify::Classification, classify::Classifier,
    classify::ClassifyLayer, classify::Override,
};

const QUOTA: &[u8] = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
const BAD: &[u8] = br#"{"error":{"message":"model is loading","type":"invalid_request_error","param":null,"code":null}}"#;

fn head(classifier: &Classifier, provider: &str, status: u16, body: &[u8]) -> Classification {
    classifier.classify_head(
        Some(provider),
        StatusCode::from_u16(status).unwrap(),
        &HeaderMap::new(),
        body,
    )
}

#[test]
fn by_status_and_provider() {
    let classifier = Classifier::new().with_override(
        Override::for_status(StatusCode::BAD_REQUEST)
            .and_provider("local")
            .class(FailureClass::Overloaded),
    );
    let c = head(&classifier, "LOCAL", 400, BAD);
    // The class changes and the recovery follows it.
    assert_eq!(
        (c.class, c.recovery),
        (FailureClass::Overloaded, Decision::RetrySame)
    );
    // Other providers keep the contract's class.
    let c = head(&classifier, "openai", 400, BAD);
    assert_eq!(
        (c.class, c.recovery),
        (FailureClass::InvalidRequest, Decision::Stop)
    );
    // Other statuses too.
    let c = head(&classifier, "local", 422, BAD);
    assert_eq!(c.class, FailureClass::InvalidRequest);
}

#[test]
fn by_provider_code() {
    let classifier = Classifier::new()
        .with_override(Override::for_code("INSUFFICIENT_QUOTA").recovery(Decision::Stop));
    let c = head(&classifier, "openai", 429, QUOTA);
    assert_eq!(
        (c.class, c.recovery),
        (FailureClass::QuotaExhausted, Decision::Stop)
    );

    // Codes are matched against every code-like field: Gemini status strings,
    // Anthropic details, in-band errors.
    let classifier = Classifier::new()
        .with_override(Override::for_code("UNAVAILABLE").class(FailureClass::ServerError));
    let c = classifier.classify_in_band(
        Some("gemini"),
        None,
        br#"{"error":{"code":503,"message":"overloaded","status":"UNAVAILABLE"}}"#,
        Phase::Preamble,
    );
    assert_eq!(c.class, FailureClass::ServerError);
}

#[test]
fn by_provider_and_class() {
    let classifier = Classifier::new().with_override(
        Override::for_provider("slow-cloud")
            .and_class(FailureClass::Timeout)
            .recovery(Decision::Reroute),
    );
    let c = head(&classifier, "slow-cloud", 504, b"");
    assert_eq!(
        (c.class, c.recovery),
        (FailureClass::Timeout, Decision::Reroute)
    );
    let c = head(&classifier, "slow-cloud", 500, b"");
    assert_eq!(
        (c.class, c.recovery),
        (FailureClass::ServerError, Decision::RetrySame)
    );
    let c = head(&classifier, "fast-cloud", 504, b"");
    assert_eq!(c.recovery, Decision::RetrySame);

    // Transport failures and the gateway's own classifications obey the same rules.
    let elapsed = std::io::Error::from(std::io::ErrorKind::TimedOut);
    let c = classifier.classify_transport(Some("slow-cloud"), &elapsed, false);
    assert_eq!(
        (c.class, c.recovery),
        (FailureClass::Timeout, Decision::Reroute)
    );
    let c = classifier.apply_overrides(
        Some("slow-cloud"),
        Classification::timeout(Phase::Head, "the head"),
    );
    assert_eq!(c.recovery, Decision::Reroute);
}

#[test]
fn first_matching_rule_wins_and_recovery_matches_the_final_class() {
    let classifier = Classifier::new()
        .with_override(
            Override::for_status(StatusCode::TOO_MANY_REQUESTS)
                .and_provider("a")
                .class(FailureClass::Overloaded),
        )
        .with_override(
            Override::for_status(StatusCode::TOO_MANY_REQUESTS).class(FailureClass::ServerError),
        )
        .with_override(Override::for_class(FailureClass::Overloaded).recovery(Decision::Reroute));
    let c = head(&classifier, "a", 429, b"");
    assert_eq!(
        (c.class, c.recovery),
        (FailureClass::Overloaded, Decision::Reroute)
    );
    let c = head(&classifier, "b", 429, b"");
    assert_eq!(
        (c.class, c.recovery),
        (FailureClass::ServerError, Decision::RetrySame)
    );
}

#[test]
fn an_explicit_recovery_beats_x_should_retry() {
    let mut headers = HeaderMap::new();
    headers.insert("x-should-retry", "false".parse().unwrap());
    let plain = Classifier::new();
    let c = plain.classify_head(None, StatusCode::INTERNAL_SERVER_ERROR, &headers, b"");
    assert_eq!(c.recovery, Decision::Reroute);
    let forced = Classifier::new().with_override(
        Override::for_status(StatusCode::INTERNAL_SERVER_ERROR).recovery(Decision::RetrySame),
    );
    let c = forced.classify_head(None, StatusCode::INTERNAL_SERVER_ERROR, &headers, b"");
    assert_eq!(c.recovery, Decision::RetrySame);
}

#[tokio::test]
async fn through_the_layer_with_its_provider_name() {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .status(429)
                .body(Full::new(Bytes::from_static(QUOTA)))
                .unwrap(),
        )
    });
    let classifier = Classifier::new().with_override(
        Override::for_provider("openai")
            .and_code("insufficient_quota")
            .class(FailureClass::RateLimited),
    );
    let service = ServiceBuilder::new()
        .layer(
            ClassifyLayer::new()
                .provider("openai")
                .classifier(classifier.clone()),
        )
        .service(upstream);
    let error = service
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap_err();
    assert_eq!(error.classification().class, FailureClass::RateLimited);

    let service = ServiceBuilder::new()
        .layer(
            ClassifyLayer::new()
                .provider("azure")
                .classifier(classifier),
        )
        .service(upstream);
    let error = service
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap_err();
    assert_eq!(error.classification().class, FailureClass::QuotaExhausted);
}
