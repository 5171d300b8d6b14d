use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use tower_service::Service;

use super::ClientId;
use super::future::ResponseFuture;
use super::layer::IdentityLayer;
use crate::FailureClass;
use crate::dialect::{Dialect, ErrorReply};

/// The Anthropic SDK's credential header (the OpenAI SDK's is
/// `authorization`).
static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Service of [`IdentityLayer`].
#[derive(Debug, Clone)]
pub struct Identity<S, D> {
    pub(crate) inner: S,
    pub(crate) layer: IdentityLayer<D>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Missing,
    Unknown,
}

impl<S, D> Identity<S, D> {
    /// The client `headers` name, or why none.
    fn identify(&self, headers: &HeaderMap) -> Result<ClientId, Refusal> {
        let keys = &self.layer.keys;
        let client = if keys.is_empty() {
            ClientId::anonymous()
        } else {
            let presented = presented_key(headers).ok_or(Refusal::Missing)?;
            keys.find(presented).ok_or(Refusal::Unknown)?
        };
        let tenant = self.layer.tenant_header.as_ref().and_then(|name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|t| !t.is_empty() && t.len() <= super::MAX_TENANT_LEN)
        });
        Ok(match tenant {
            Some(tenant) => client.with_tenant(tenant),
            None => client,
        })
    }
}

/// The key a request presents: `Authorization: Bearer <key>` first, then
/// `x-api-key`.
fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    let bearer = headers.get(AUTHORIZATION).and_then(|v| {
        let v = v.as_bytes();
        let scheme = v.get(..7)?;
        scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| v[7..].trim_ascii())
    });
    bearer
        .or_else(|| headers.get(&X_API_KEY).map(|v| v.as_bytes().trim_ascii()))
        .filter(|k| !k.is_empty())
}

/// The dialect's `401`: class `auth`, code `invalid_api_key`.
fn refusal<D: Dialect>(dialect: &D, refusal: Refusal) -> Response<Bytes> {
    let message = match refusal {
        Refusal::Missing => "this gateway needs an API key (Authorization: Bearer, or x-api-key)",
        Refusal::Unknown => "the API key is not valid for this gateway",
    };
    let reply = ErrorReply::coded(FailureClass::Auth, "invalid_api_key", message);
    let mut response = dialect.error_response(StatusCode::UNAUTHORIZED, &reply);
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

impl<S, D, B, ResBody> Service<Request<B>> for Identity<S, D>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    D: Dialect,
{
    type Response = Response<http_body_util::Either<http_body_util::Full<Bytes>, ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        match self.identify(request.headers()) {
            Ok(client) => {
                if !self.layer.keys.is_empty() {
                    let headers = request.headers_mut();
                    headers.remove(AUTHORIZATION);
                    headers.remove(&X_API_KEY);
                }
                if client.is_anonymous() {
                    // No entry at all: `ClientId::of` reads a request
                    // without one as the anonymous client, and a request
                    // of a gateway without keys carries three extensions
                    // after this one, where a fourth grows the map (a
                    // new table and a rehash per request). One set by
                    // an outer layer does not stand.
                    request.extensions_mut().remove::<ClientId>();
                } else {
                    request.extensions_mut().insert(client);
                }
                ResponseFuture::called(self.inner.call(request))
            }
            Err(why) => {
                tracing::debug!(?why, "request refused: no valid client key");
                ResponseFuture::refused(refusal(&self.layer.dialect, why))
            }
        }
    }
}
