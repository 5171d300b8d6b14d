//! An API key echoed in a provider's error never reaches the
//! classification's message, its Debug, the error's Debug/Display, or the
//! OpenAI-shaped body returned to the client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{ServiceBuilder, ServiceExt};
use tower_llm_failover::{
    FailureClass, Phase, classify::Classifier, classify::ClassifyLayer, classify::UpstreamError,
};

const OPENAI_KEY: &str = "sk-proj-Zx81kQ2mN4pL7vR3tY6wB9cD0eF5gH1jK";
const ANTHROPIC_KEY: &str = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
const GEMINI_KEY: &str = "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY";
const HEX_KEY: &str = "4f3c2a1b0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b";

async fn through_layer(status: u16, body: String) -> UpstreamError {
    let response = Response::builder()
        .status(status)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let upstream = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let response = response.clone();
        async move { Ok::<_, Infallible>(response) }
    });
    ServiceBuilder::new()
        .layer(ClassifyLayer::new().provider("openai"))
        .service(upstream)
        .oneshot(Request::new(Full::default()))
        .await
        .unwrap_err()
}

fn assert_no_secret(error: &UpstreamError, secret: &str) {
    let c = error.classification();
    // The distinctive tail of the key, so a partial leak fails too.
    let tail = &secret[secret.len() - 12..];
    for (what, text) in [
        ("message", c.message.clone()),
        ("classification Debug", format!("{c:?}")),
        ("classification Display", c.to_string()),
        ("error Debug", format!("{error:?}")),
        ("error Display", error.to_string()),
        (
            "openai body",
            String::from_utf8(
                error
                    .classification()
                    .to_error(&tower_llm_failover::dialect::OpenAiChat)
                    .1
                    .to_vec(),
            )
            .unwrap(),
        ),
    ] {
        assert!(!text.contains(tail), "{what} leaks the key: {text}");
    }
}

#[tokio::test]
async fn echoed_keys_are_redacted_everywhere() {
    let cases = [
        (
            401,
            format!(
                r#"{{"error":{{"message":"Incorrect API key provided: {OPENAI_KEY}. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}}}"#
            ),
            OPENAI_KEY,
            FailureClass::Auth,
        ),
        (
            401,
            format!(
                r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key {ANTHROPIC_KEY}"}}}}"#
            ),
            ANTHROPIC_KEY,
            FailureClass::Auth,
        ),
        (
            400,
            format!(
                r#"{{"error":{{"code":400,"message":"API key not valid: {GEMINI_KEY}. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"API_KEY_INVALID","domain":"googleapis.com"}}]}}}}"#
            ),
            GEMINI_KEY,
            FailureClass::Auth,
        ),
        (
            502,
            format!(
                r#"{{"error":{{"code":502,"message":"Provider returned error: upstream rejected Authorization: Bearer {HEX_KEY}","metadata":{{"provider_name":"together","raw":"key {HEX_KEY}"}}}}}}"#
            ),
            HEX_KEY,
            FailureClass::ServerError,
        ),
        (
            403,
            format!("<html><head><title>Forbidden: key={HEX_KEY}</title></head></html>"),
            HEX_KEY,
            FailureClass::PermissionDenied,
        ),
        (
            400,
            format!(
                r#"{{"error":{{"message":"bad request","type":"invalid_request_error","param":"{OPENAI_KEY}","code":"{OPENAI_KEY}"}}}}"#
            ),
            OPENAI_KEY,
            FailureClass::InvalidRequest,
        ),
    ];
    for (status, body, secret, class) in cases {
        let error = through_layer(status, body).await;
        assert_eq!(error.classification().class, class, "{error}");
        assert_no_secret(&error, secret);
        // The raw body is retained as the provider sent it (documented as unsanitized).
        assert!(
            error
                .body()
                .windows(secret.len())
                .any(|w| w == secret.as_bytes())
        );
    }
}

#[test]
fn the_message_keeps_the_rest() {
    let c = Classifier::new().classify_in_band(
        Some("anthropic"),
        Some("error"),
        format!(r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key {ANTHROPIC_KEY}"}}}}"#).as_bytes(),
        Phase::Preamble,
    );
    assert_eq!(c.message, "invalid x-api-key [REDACTED]");
}

#[test]
fn transport_errors_are_sanitized_too() {
    let io = std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        format!("proxy dropped the request with Authorization: Bearer {OPENAI_KEY}"),
    );
    let c = Classifier::new().classify_transport(None, &io, false);
    assert_eq!(c.class, FailureClass::Connect);
    assert!(!c.message.contains("Zx81kQ2m"), "{}", c.message);
    assert!(!format!("{c:?}").contains("Zx81kQ2m"));

    let error = UpstreamError::new(c).with_source(std::sync::Arc::new(io));
    assert!(!format!("{error:?}").contains("Zx81kQ2m"), "{error:?}");
}
