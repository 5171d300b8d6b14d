use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::future::ResponseFuture;
use crate::TurnDeadline;
use crate::dialect::Dialect;
use crate::{stream::commit::BoxError, stream::commit::InspectConfig};

/// The service [`StreamStateLayer`](super::StreamStateLayer) produces.
#[derive(Debug, Clone)]
pub struct StreamStateService<S, D> {
    inner: S,
    config: Arc<InspectConfig<D>>,
}

impl<S, D> StreamStateService<S, D> {
    pub(crate) fn new(inner: S, config: Arc<InspectConfig<D>>) -> Self {
        Self { inner, config }
    }

    crate::util::inner_service_accessors!();
}

impl<S, D, ReqBody, ResBody> Service<Request<ReqBody>> for StreamStateService<S, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Into<BoxError>,
    D: Dialect,
{
    type Response = Response<super::StreamStateBody<ResBody, D>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, D>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // A turn deadline set outside (the budget layer publishes it): this
        // inspector ends the stream then with a terminal chunk.
        let deadline = request.extensions().get::<TurnDeadline>().map(|d| d.at);
        ResponseFuture::new(self.inner.call(request), Arc::clone(&self.config), deadline)
    }
}
