//! `ClassifyLayer` as a service: pass-through of successes, readiness
//! errors, nested layers, and the OpenAI-shaped error for final stops.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_llm_failover::{
    Decision, FailureClass, Phase, classify::Classification, classify::Classify,
    classify::ClassifyLayer, classify::UpstreamError,
};

/// A body that counts how often it is polled.
struct Counted {
    data: Option<Bytes>,
    polls: Arc<AtomicUsize>,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        Poll::Ready(self.data.take().map(|d| Ok(Frame::data(d))))
    }
}

#[tokio::test]
async fn success_passes_through_untouched() {
    for status in [200u16, 201, 204] {
        let polls = Arc::new(AtomicUsize::new(0));
        let payload = Bytes::from_static(b"data: {\"choices\":[]}\n\n");
        let (polls2, payload2) = (polls.clone(), payload.clone());
        let upstream = tower::service_fn(move |_req: Request<Full<Bytes>>| {
            let body = Counted {
                data: Some(payload2.clone()),
                polls: polls2.clone(),
            };
            async move {
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(status)
                        .header("x-request-id", "req_1")
                        .body(body)
                        .unwrap(),
                )
            }
        });
        let service = ServiceBuilder::new()
            .layer(ClassifyLayer::new())
            .service(upstream);
        let response = service
            .oneshot(Request::new(Full::default()))
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(response.headers()["x-request-id"], "req_1");
        assert_eq!(
            polls.load(Ordering::SeqCst),
            0,
            "the layer never reads a success body"
        );
        let frame = response.into_body().frame().await.unwrap().unwrap();
        let data = frame.into_data().unwrap();
        assert_eq!(data.as_ptr(), payload.as_ptr(), "same bytes, not a copy");
    }
}

#[tokio::test]
async fn redirects_are_not_success() {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .status(302)
                .header("location", "/elsewhere")
                .body(Full::<Bytes>::default())
                .unwrap(),
        )
    });
    let error = ServiceBuilder::new()
        .layer(ClassifyLayer::new())
        .service(upstream)
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap_err();
    assert_eq!(
        (error.classification().class, error.classification().phase),
        (FailureClass::InvalidResponse, Phase::Head)
    );
}

/// A service that is never ready: its pool is closed.
#[derive(Clone)]
struct Closed;

impl Service<Request<Full<Bytes>>> for Closed {
    type Response = Response<Full<Bytes>>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Err(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))
    }
    fn call(&mut self, _req: Request<Full<Bytes>>) -> Self::Future {
        std::future::ready(Err(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )))
    }
}

#[tokio::test]
async fn readiness_errors_are_before_send() {
    let mut service = Classify::new(Closed).provider("down");
    let error = service.ready().await.err().unwrap();
    assert_eq!(
        (error.classification().class, error.classification().phase),
        (FailureClass::Connect, Phase::BeforeSend)
    );
    assert_eq!(error.provider(), Some("down"));
    // The same error from `call` may have reached the provider.
    let error = service
        .call(Request::new(Full::default()))
        .await
        .unwrap_err();
    assert_eq!(
        (error.classification().class, error.classification().phase),
        (FailureClass::Connect, Phase::Head)
    );
}

#[tokio::test]
async fn nested_layers_keep_the_inner_classification() {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .status(529)
                .body(Full::<Bytes>::default())
                .unwrap(),
        )
    });
    let service = ServiceBuilder::new()
        .layer(ClassifyLayer::new().provider("outer"))
        .layer(ClassifyLayer::new().provider("anthropic"))
        .service(upstream);
    let error = service
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap_err();
    assert_eq!(error.classification().class, FailureClass::Overloaded);
    assert_eq!(error.provider(), Some("anthropic"));
}

#[tokio::test]
async fn inner_errors_keep_their_source() {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Err::<Response<Full<Bytes>>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
    });
    let error = ServiceBuilder::new()
        .layer(ClassifyLayer::new())
        .service(upstream)
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap_err();
    assert_eq!(error.classification().phase, Phase::BeforeSend);
    let source = std::error::Error::source(&error).unwrap();
    assert_eq!(
        source.downcast_ref::<std::io::Error>().unwrap().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
}

fn openai_json(c: Classification) -> (StatusCode, serde_json::Value) {
    let (status, body) = UpstreamError::new(c)
        .classification()
        .to_error(&tower_llm_failover::dialect::OpenAiChat);
    (status, serde_json::from_slice(&body).unwrap())
}

#[test]
fn openai_error_shape_and_status() {
    let classifier = tower_llm_failover::classify::Classifier::new();
    let headers = http::HeaderMap::new();

    // A request error keeps the provider's own status, message and param.
    let c = classifier.classify_head(
        Some("deepseek"),
        StatusCode::UNPROCESSABLE_ENTITY,
        &headers,
        br#"{"error":{"message":"Invalid parameters","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}"#,
    );
    let (status, json) = openai_json(c);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        json,
        serde_json::json!({"error":{"message":"Invalid parameters","type":"invalid_request_error","param":"temperature","code":"invalid_value"}})
    );

    // Context length: OpenAI's own code.
    let c = classifier.classify_head(
        None,
        StatusCode::BAD_REQUEST,
        &headers,
        br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 205351 tokens > 200000 maximum"}}"#,
    );
    let (status, json) = openai_json(c);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json["error"]["code"], "context_length_exceeded");
    assert_eq!(
        json["error"]["message"],
        "prompt is too long: 205351 tokens > 200000 maximum"
    );

    // TPM-too-large arrived as a 429 but is a payload problem: 413, not 429.
    let c = Classification::new(FailureClass::PayloadTooLarge, Phase::Head)
        .with_status(StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(openai_json(c).0, StatusCode::PAYLOAD_TOO_LARGE);

    let cases = [
        (
            FailureClass::RateLimited,
            429,
            "rate_limit_error",
            "rate_limit_exceeded",
        ),
        (
            FailureClass::QuotaExhausted,
            429,
            "insufficient_quota",
            "insufficient_quota",
        ),
        (FailureClass::Overloaded, 503, "server_error", "overloaded"),
        (
            FailureClass::ServerError,
            502,
            "server_error",
            "server_error",
        ),
        (FailureClass::Timeout, 504, "server_error", "timeout"),
        (FailureClass::Connect, 502, "server_error", "connect"),
        (FailureClass::Auth, 502, "server_error", "auth"),
        (
            FailureClass::PermissionDenied,
            502,
            "server_error",
            "permission_denied",
        ),
        (
            FailureClass::ModelNotFound,
            404,
            "invalid_request_error",
            "model_not_found",
        ),
        (
            FailureClass::ContentFiltered,
            400,
            "invalid_request_error",
            "content_filter",
        ),
        (
            FailureClass::InvalidResponse,
            502,
            "server_error",
            "invalid_response",
        ),
        (FailureClass::Cancelled, 499, "server_error", "cancelled"),
    ];
    for (class, status, ty, code) in cases {
        let (s, json) = openai_json(
            Classification::new(class, Phase::Head).with_status(StatusCode::from_u16(529).unwrap()),
        );
        assert_eq!(s.as_u16(), status, "{class}");
        assert_eq!(json["error"]["type"], ty, "{class}");
        assert_eq!(json["error"]["code"], code, "{class}");
        assert_eq!(json["error"]["param"], serde_json::Value::Null, "{class}");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains(class.as_str()),
            "{class}"
        );
    }

    let response = UpstreamError::new(Classification::new(FailureClass::Timeout, Phase::Head))
        .to_response(&tower_llm_failover::dialect::OpenAiChat);
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(response.headers()["content-type"], "application/json");
}

#[test]
fn default_recovery_table() {
    use FailureClass::*;
    for class in FailureClass::ALL {
        let expected = match class {
            InvalidRequest | ContentFiltered | Cancelled | Shutdown => Decision::Stop,
            RateLimited | Overloaded | ServerError | Timeout | Connect => Decision::RetrySame,
            _ => Decision::Reroute,
        };
        assert_eq!(class.default_recovery(), expected, "{class}");
        assert_eq!(Classification::new(class, Phase::Head).recovery, expected);
    }
}

#[test]
fn display_and_debug() {
    let c = Classification::new(FailureClass::RateLimited, Phase::Head)
        .with_status(StatusCode::TOO_MANY_REQUESTS)
        .with_provider_code("rate_limit_exceeded")
        .with_message("slow down");
    let e = UpstreamError::new(c)
        .with_provider(Some("openai".into()))
        .with_body(Bytes::from_static(b"{}"));
    assert_eq!(
        e.to_string(),
        "upstream openai failed: rate_limited at head (HTTP 429) [rate_limit_exceeded]: slow down"
    );
    let debug = format!("{e:?}");
    assert!(debug.contains("body: <2 bytes>"), "{debug}");
}

#[cfg(feature = "tower-http")]
mod tower_http_adapter {
    use super::*;
    use tower_http::classify::{ClassifiedResponse, ClassifyResponse};
    use tower_llm_failover::classify::TowerHttpClassifier;

    #[test]
    fn status_based_and_ready_at_the_head() {
        let ok = Response::builder().status(200).body(()).unwrap();
        assert!(matches!(
            TowerHttpClassifier::new().classify_response(&ok),
            ClassifiedResponse::Ready(Ok(()))
        ));
        let limited = Response::builder()
            .status(429)
            .header("retry-after", "4")
            .body(())
            .unwrap();
        match TowerHttpClassifier::new().classify_response(&limited) {
            ClassifiedResponse::Ready(Err(c)) => {
                assert_eq!(
                    (c.class, c.retry.after),
                    (
                        FailureClass::RateLimited,
                        Some(std::time::Duration::from_secs(4))
                    )
                );
            }
            _ => panic!("expected a ready failure"),
        }
    }

    #[test]
    fn errors_keep_their_classification() {
        let upstream = UpstreamError::new(Classification::new(
            FailureClass::QuotaExhausted,
            Phase::Head,
        ));
        let c = TowerHttpClassifier::new().classify_error(&upstream);
        assert_eq!(c.class, FailureClass::QuotaExhausted);
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let c = TowerHttpClassifier::new().classify_error(&io);
        assert_eq!(
            (c.class, c.phase),
            (FailureClass::Connect, Phase::BeforeSend)
        );
        let boxed: Box<dyn std::error::Error + Send + Sync> =
            Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(
            TowerHttpClassifier::new().classify_error(&boxed).class,
            FailureClass::Timeout
        );
        assert_eq!(
            TowerHttpClassifier::new().classify_error(&"weird").class,
            FailureClass::Connect
        );
    }
}

#[test]
fn thread_safe_and_cheap_to_share() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<UpstreamError>();
    assert_send_sync::<tower_llm_failover::classify::Classifier>();
    assert_send_sync::<ClassifyLayer>();
    assert_send_sync::<Classification>();
    fn assert_send<T: Send>(_: &T) {}
    let service = Classify::new(tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
    }));
    let future = service.clone().oneshot(Request::new(Full::default()));
    assert_send(&future);
}
