//! Final failures as client answers: the status, and the error a
//! [`Dialect`] shapes (OpenAI's `{"error":{...}}`, or another API's).

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;

use super::Classification;
use super::error::UpstreamError;
use crate::FailureClass;
use crate::dialect::{Dialect, ErrorReply};

impl Classification {
    /// The status a gateway answers with when this failure is final (see
    /// [`client_status`] for the mapping).
    pub(crate) fn client_status(&self) -> StatusCode {
        client_status(self.class, self.status)
    }

    /// This failure as a dialect-neutral error answer (message sanitized,
    /// `param` only for request errors).
    pub(crate) fn error_reply(&self) -> ErrorReply<'_> {
        ErrorReply {
            provider_code: self.provider_code.as_deref(),
            param: self
                .param
                .as_deref()
                .filter(|_| self.class.is_request_error()),
            ..ErrorReply::new(self.class, &self.message)
        }
    }

    /// The status and error body for this failure, shaped by `dialect`
    /// (which may restate the status, see [`Dialect::error_status`]).
    pub fn to_error<D: Dialect>(&self, dialect: &D) -> (StatusCode, Bytes) {
        let (parts, body) = self.answer(dialect).into_parts();
        (parts.status, body)
    }

    /// The whole answer: [`Dialect::error_response`] with this failure's
    /// status and reply (a failure with no message says its class).
    fn answer<D: Dialect>(&self, dialect: &D) -> Response<Bytes> {
        if self.message.is_empty() {
            let message = format!("upstream failure: {}", self.class);
            let reply = ErrorReply {
                message: &message,
                ..self.error_reply()
            };
            dialect.error_response(self.client_status(), &reply)
        } else {
            dialect.error_response(self.client_status(), &self.error_reply())
        }
    }
}

impl UpstreamError {
    /// The response a gateway returns when this failure is final, shaped by
    /// `dialect` with its content type: the sanitized message, never the
    /// raw provider body ([`Classification::to_error`] gives the status and
    /// body alone).
    pub fn to_response<D: Dialect>(&self, dialect: &D) -> Response<Full<Bytes>> {
        self.classification().answer(dialect).map(Full::new)
    }
}

/// The status a client is answered with when a failure of `class` is final
/// and the provider's own `status` (if any) says no more.
///
/// Request errors keep the provider's 4xx when it means the same to a
/// client (not 401/402/403/407/408/429/499), else 400 (413 for payload too
/// large); an unknown model is 404; rate limits and spent quota 429; auth
/// and permission failures 502 (the gateway's credential failed, not the
/// client's); overload and shutdown 503; timeouts 504; other provider trouble 502; a
/// cancelled request 499.
fn client_status(class: FailureClass, status: Option<StatusCode>) -> StatusCode {
    use FailureClass::*;
    let own_4xx = status.filter(|s| {
        s.is_client_error() && !matches!(s.as_u16(), 401 | 402 | 403 | 407 | 408 | 429 | 499)
    });
    match class {
        InvalidRequest | ContextLengthExceeded | ContentFiltered => {
            own_4xx.unwrap_or(StatusCode::BAD_REQUEST)
        }
        PayloadTooLarge => own_4xx.unwrap_or(StatusCode::PAYLOAD_TOO_LARGE),
        ModelNotFound => StatusCode::NOT_FOUND,
        RateLimited | QuotaExhausted => StatusCode::TOO_MANY_REQUESTS,
        Overloaded | Shutdown => StatusCode::SERVICE_UNAVAILABLE,
        Timeout => StatusCode::GATEWAY_TIMEOUT,
        Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        _ => StatusCode::BAD_GATEWAY,
    }
}
