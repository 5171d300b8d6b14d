//! The response future of [`UpstreamClient`](super::UpstreamClient).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use super::SendError;
use super::body::ResponseBody;

pin_project! {
    /// Resolves to the upstream's response head, or a [`SendError`].
    pub struct ResponseFuture {
        #[pin]
        kind: Kind,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind {
        Sent { #[pin] inner: hyper_util::client::legacy::ResponseFuture },
        // A plain-`http` target's own pool.
        Pooled { inner: Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, SendError>> + Send>> },
        Rejected { error: Option<SendError> },
    }
}

impl ResponseFuture {
    pub(crate) fn sent(inner: hyper_util::client::legacy::ResponseFuture) -> Self {
        Self {
            kind: Kind::Sent { inner },
        }
    }

    pub(crate) fn pooled(
        inner: Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, SendError>> + Send>>,
    ) -> Self {
        Self {
            kind: Kind::Pooled { inner },
        }
    }

    pub(crate) fn rejected(error: SendError) -> Self {
        Self {
            kind: Kind::Rejected { error: Some(error) },
        }
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<ResponseBody>, SendError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Sent { inner } => inner
                .poll(cx)
                .map_ok(|response| response.map(ResponseBody::new))
                .map_err(SendError::Transport),
            KindProj::Pooled { inner } => inner.as_mut().poll(cx),
            KindProj::Rejected { error } => match error.take() {
                Some(error) => Poll::Ready(Err(error)),
                // Polled after completion: stay pending rather than panic.
                None => Poll::Pending,
            },
        }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Sent { .. } => "sent",
            Kind::Pooled { .. } => "sent",
            Kind::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
