use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_service::Service;

use super::body::{InFlightBody, ReadLimitBody};
use super::{ReadLimits, shed_answer};
use crate::dialect::Dialect;

/// Service of [`ReadLimitLayer`](super::ReadLimitLayer).
#[derive(Debug, Clone)]
pub struct ReadLimit<S> {
    inner: S,
    limits: ReadLimits,
}

impl<S> ReadLimit<S> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: S, limits: ReadLimits) -> Self {
        Self { inner, limits }
    }
}

impl<S, B> Service<Request<B>> for ReadLimit<S>
where
    S: Service<Request<ReadLimitBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let limits = self.limits;
        self.inner
            .call(request.map(|body| ReadLimitBody::new(body, limits)))
    }
}

/// Service of [`InFlightLimitLayer`](super::InFlightLimitLayer).
#[derive(Debug, Clone)]
pub struct InFlightLimit<S, D> {
    inner: S,
    slots: Arc<Semaphore>,
    dialect: D,
    retry_after: Duration,
}

impl<S, D> InFlightLimit<S, D> {
    pub(crate) fn new(inner: S, slots: Arc<Semaphore>, dialect: D, retry_after: Duration) -> Self {
        Self {
            inner,
            slots,
            dialect,
            retry_after,
        }
    }
}

impl<S, D, ReqBody, ResBody> Service<Request<ReqBody>> for InFlightLimit<S, D>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    D: Dialect,
{
    type Response = Response<InFlightBody<ResBody>>;
    type Error = S::Error;
    type Future = InFlightFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Honest: ready when the inner service is. A request over the
        // limit is still accepted here and shed in `call`, so nothing waits.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => InFlightFuture {
                kind: Kind::Admitted {
                    future: self.inner.call(request),
                    permit: Some(permit),
                },
            },
            Err(_) => {
                tracing::warn!("in-flight limit reached; request shed with 503");
                InFlightFuture {
                    kind: Kind::Shed {
                        response: Some(shed_answer(&self.dialect, self.retry_after)),
                    },
                }
            }
        }
    }
}

pin_project! {
    /// Response future of [`InFlightLimit`].
    pub struct InFlightFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        // The inner service's future, holding the slot.
        Admitted {
            #[pin]
            future: F,
            permit: Option<OwnedSemaphorePermit>,
        },
        // Shed: the 503 is ready.
        Shed {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F> std::fmt::Debug for InFlightFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            Kind::Admitted { .. } => f.write_str("InFlightFuture::Admitted"),
            Kind::Shed { .. } => f.write_str("InFlightFuture::Shed"),
        }
    }
}

impl<F, B, E> Future for InFlightFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<InFlightBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Admitted { future, permit } => {
                let response = std::task::ready!(future.poll(cx))?;
                let permit = permit.take();
                Poll::Ready(Ok(response.map(|body| InFlightBody::admitted(body, permit))))
            }
            KindProj::Shed { response } => match response.take() {
                Some(response) => {
                    Poll::Ready(Ok(response.map(|body| InFlightBody::shed(Some(body)))))
                }
                // Polled after completion: a caller bug, answered with an
                // empty 503 rather than a panic.
                None => {
                    let mut response = Response::new(InFlightBody::shed(None));
                    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                    Poll::Ready(Ok(response))
                }
            },
        }
    }
}
