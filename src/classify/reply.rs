//! Final failures as client answers: the status, and the error a
//! [`Dialect`] shapes (OpenAI's `{"error":{...}}`, or another API's).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

use super::Classification;
use super::error::UpstreamError;
use crate::dialect::{Dialect, ErrorReply, client_status};

impl Classification {
    /// The status a gateway answers with when this failure is final (see
    /// [`client_status`] for the mapping).
    pub(crate) fn client_status(&self) -> StatusCode {
        client_status(self.class, self.status)
    }

    /// This failure as a dialect-neutral error answer (message sanitized,
    /// `param` only for request errors).
    pub(crate) fn error_reply(&self) -> ErrorReply<'_> {
        ErrorReply::new(self.class, &self.message)
            .provider_code(self.provider_code.as_deref())
            .param(
                self.param
                    .as_deref()
                    .filter(|_| self.class.is_request_error()),
            )
    }

    /// The status and error body for this failure, shaped by `dialect`
    /// (which may restate the status, see [`Dialect::error_status`]).
    pub fn to_error<D: Dialect>(&self, dialect: &D) -> (StatusCode, Bytes) {
        let body = if self.message.is_empty() {
            let message = format!("upstream failure: {}", self.class);
            let reply = ErrorReply {
                message: &message,
                ..self.error_reply()
            };
            dialect.error_body(&reply)
        } else {
            dialect.error_body(&self.error_reply())
        };
        (dialect.error_status(self.class, self.client_status()), body)
    }
}

impl UpstreamError {
    /// The status and error body a gateway returns when this failure is
    /// final, shaped by `dialect`: the sanitized message, never the raw
    /// provider body.
    pub fn to_error<D: Dialect>(&self, dialect: &D) -> (StatusCode, Bytes) {
        self.classification().to_error(dialect)
    }

    /// [`to_error`](Self::to_error) as a ready response.
    pub fn to_response<D: Dialect>(&self, dialect: &D) -> Response<Full<Bytes>> {
        let (status, body) = self.to_error(dialect);
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(dialect.error_content_type()),
        );
        response
    }
}
