use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::StreamStateBody;
use crate::dialect::Dialect;
use crate::{stream::commit::BoxError, stream::commit::InspectConfig};

pin_project! {
    /// Response future of [`StreamStateService`](super::StreamStateService).
    pub struct ResponseFuture<F, D> {
        #[pin]
        inner: F,
        config: Arc<InspectConfig<D>>,
        deadline: Option<Instant>,
    }
}

impl<F, D> ResponseFuture<F, D> {
    pub(crate) fn new(inner: F, config: Arc<InspectConfig<D>>, deadline: Option<Instant>) -> Self {
        Self {
            inner,
            config,
            deadline,
        }
    }
}

impl<F: std::fmt::Debug, D> std::fmt::Debug for ResponseFuture<F, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<F, D, B, E> Future for ResponseFuture<F, D>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    D: Dialect,
{
    type Output = Result<Response<StreamStateBody<B, D>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        Poll::Ready(Ok(StreamStateBody::wrap_response(
            response,
            this.config,
            *this.deadline,
        )))
    }
}
