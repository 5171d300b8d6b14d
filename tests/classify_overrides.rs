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
    let classifier = Classifier::new().with_override(Override {
        when_status: Some(StatusCode::BAD_REQUEST),
        when_provider: Some("local".into()),
        class: Some(FailureClass::Overloaded),
        ..Override::default()
    });
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
    let classifier = Classifier::new().with_override(Override {
        when_code: Some("INSUFFICIENT_QUOTA".into()),
        recovery: Some(Decision::Stop),
        ..Override::default()
    });
    let c = head(&classifier, "openai", 429, QUOTA);
    assert_eq!(
        (c.class, c.recovery),
        (FailureClass::QuotaExhausted, Decision::Stop)
    );

    // Codes are matched against every code-like field: Gemini status strings,
    // Anthropic details, in-band errors.
    let classifier = Classifier::new().with_override(Override {
        when_code: Some("UNAVAILABLE".into()),
        class: Some(FailureClass::ServerError),
        ..Override::default()
    });
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
    let classifier = Classifier::new().with_override(Override {
        when_provider: Some("slow-cloud".into()),
        when_class: Some(FailureClass::Timeout),
        recovery: Some(Decision::Reroute),
        ..Override::default()
    });
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
        .with_override(Override {
            when_status: Some(StatusCode::TOO_MANY_REQUESTS),
            when_provider: Some("a".into()),
            class: Some(FailureClass::Overloaded),
            ..Override::default()
        })
        .with_override(Override {
            when_status: Some(StatusCode::TOO_MANY_REQUESTS),
            class: Some(FailureClass::ServerError),
            ..Override::default()
        })
        .with_override(Override {
            when_class: Some(FailureClass::Overloaded),
            recovery: Some(Decision::Reroute),
            ..Override::default()
        });
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
    let forced = Classifier::new().with_override(Override {
        when_status: Some(StatusCode::INTERNAL_SERVER_ERROR),
        recovery: Some(Decision::RetrySame),
        ..Override::default()
    });
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
    let classifier = Classifier::new().with_override(Override {
        when_provider: Some("openai".into()),
        when_code: Some("insufficient_quota".into()),
        class: Some(FailureClass::RateLimited),
        ..Override::default()
    });
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
