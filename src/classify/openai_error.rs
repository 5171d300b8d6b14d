//! OpenAI-shaped error responses for final stops:
//! `{"error":{"message","type","param","code"}}`, the shape the official SDKs
//! raise on.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use serde_json::json;

use super::error::UpstreamError;
use super::{Classification, FailureClass};

impl Classification {
    /// The status a gateway answers with when this failure is final.
    ///
    /// - request errors (`InvalidRequest`, `ContextLengthExceeded`,
    ///   `ContentFiltered`, `PayloadTooLarge`): the provider's own 4xx when
    ///   it gave one that means the same to a client (not 401/402/403/407/
    ///   408/429/499), else 400 (413 for `PayloadTooLarge`);
    /// - `ModelNotFound` 404; `RateLimited` and `QuotaExhausted` 429 (OpenAI
    ///   sends `insufficient_quota` as a 429 too);
    /// - `Auth` and `PermissionDenied` 502: the gateway's credential or
    ///   account failed, not the client's, so a client 401/403 would mislead;
    /// - `Overloaded` 503, `Timeout` 504, `ServerError`, `Connect` and
    ///   `InvalidResponse` 502, `Cancelled` 499.
    pub fn openai_status(&self) -> StatusCode {
        use FailureClass::*;
        let own_4xx = self.status.filter(|s| {
            s.is_client_error() && !matches!(s.as_u16(), 401 | 402 | 403 | 407 | 408 | 429 | 499)
        });
        match self.class {
            InvalidRequest | ContextLengthExceeded | ContentFiltered => {
                own_4xx.unwrap_or(StatusCode::BAD_REQUEST)
            }
            PayloadTooLarge => own_4xx.unwrap_or(StatusCode::PAYLOAD_TOO_LARGE),
            ModelNotFound => StatusCode::NOT_FOUND,
            RateLimited | QuotaExhausted => StatusCode::TOO_MANY_REQUESTS,
            Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Timeout => StatusCode::GATEWAY_TIMEOUT,
            Auth | PermissionDenied | ServerError | Connect | InvalidResponse => {
                StatusCode::BAD_GATEWAY
            }
            Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        }
    }

    /// The OpenAI error `type` for this failure.
    pub fn openai_type(&self) -> &'static str {
        use FailureClass::*;
        match self.class {
            InvalidRequest
            | ContextLengthExceeded
            | ContentFiltered
            | PayloadTooLarge
            | ModelNotFound => "invalid_request_error",
            RateLimited => "rate_limit_error",
            QuotaExhausted => "insufficient_quota",
            _ => "server_error",
        }
    }

    /// The OpenAI error `code`: OpenAI's own codes where one exists
    /// (`context_length_exceeded`, `content_filter`, `model_not_found`,
    /// `rate_limit_exceeded`, `insufficient_quota`), the provider's code for
    /// other invalid requests, else the class name.
    pub fn openai_code(&self) -> String {
        use FailureClass::*;
        match self.class {
            ContextLengthExceeded => "context_length_exceeded".to_owned(),
            ContentFiltered => "content_filter".to_owned(),
            ModelNotFound => "model_not_found".to_owned(),
            RateLimited => "rate_limit_exceeded".to_owned(),
            QuotaExhausted => "insufficient_quota".to_owned(),
            InvalidRequest => self
                .provider_code
                .clone()
                .unwrap_or_else(|| self.class.as_str().to_owned()),
            other => other.as_str().to_owned(),
        }
    }

    /// The status and OpenAI-shaped JSON body for this failure (message
    /// sanitized, `param` only for request errors).
    pub fn to_openai_error(&self) -> (StatusCode, Bytes) {
        let message = if self.message.is_empty() {
            format!("upstream failure: {}", self.class)
        } else {
            self.message.clone()
        };
        let param = if self.class.is_request_error() {
            self.param.clone()
        } else {
            None
        };
        let body = json!({
            "error": {
                "message": message,
                "type": self.openai_type(),
                "param": param,
                "code": self.openai_code(),
            }
        });
        let bytes = serde_json::to_vec(&body).map_or_else(
            |_| Bytes::from_static(br#"{"error":{"message":"upstream failure","type":"server_error","param":null,"code":null}}"#),
            Bytes::from,
        );
        (self.openai_status(), bytes)
    }
}

impl UpstreamError {
    /// The status and OpenAI-shaped error body a gateway returns when this
    /// failure is final: `{"error":{"message","type","param","code"}}` with
    /// the sanitized message (see [`Classification::openai_status`] for the
    /// status mapping). Never the raw provider body.
    pub fn to_openai_error(&self) -> (StatusCode, Bytes) {
        self.classification().to_openai_error()
    }

    /// [`to_openai_error`](Self::to_openai_error) as a ready JSON response.
    pub fn to_openai_response(&self) -> Response<Full<Bytes>> {
        let (status, body) = self.to_openai_error();
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}
