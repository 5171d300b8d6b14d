use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body_util::{Either, Full};
use pin_project_lite::pin_project;

pin_project! {
    /// Future of [`Identity`](super::Identity): the inner service's answer,
    /// or the refusal written at once.
    #[project = Projected]
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProjected]
    enum State<F> {
        Called { #[pin] future: F },
        Refused { response: Option<Response<Bytes>> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(future: F) -> Self {
        Self {
            state: State::Called { future },
        }
    }

    pub(crate) fn refused(response: Response<Bytes>) -> Self {
        Self {
            state: State::Refused {
                response: Some(response),
            },
        }
    }
}

impl<F: std::fmt::Debug> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Either<Full<Bytes>, B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProjected::Called { future } => future
                .poll(cx)
                .map(|r| r.map(|response| response.map(Either::Right))),
            StateProjected::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response.map(|b| Either::Left(Full::new(b))))),
                // Polled again after it answered: nothing more to give.
                None => Poll::Pending,
            },
        }
    }
}
