//! The body of an upstream response: hyper's, and for a connection the
//! client pools itself, the way back to the pool.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use pin_project_lite::pin_project;

use super::pool::Http1Pool;
use super::service::UpstreamBody;

pin_project! {
    /// The body of an [`UpstreamClient`](crate::UpstreamClient)'s
    /// response: hyper's [`Incoming`] as received, frame for frame.
    ///
    /// On a plain-`http` target's connection it also carries the
    /// connection back to the client's pool once it has been read to its
    /// end (or is dropped): the connection is reused as soon as it is
    /// ready, without a task of its own per request.
    pub struct ResponseBody {
        #[pin]
        inner: Incoming,
        returning: Option<Returning>,
    }

    impl PinnedDrop for ResponseBody {
        fn drop(this: Pin<&mut Self>) {
            // Not read to its end (or read and never polled past it, as a
            // server writing it stops at `is_end_stream`): the pool takes it
            // back if and when the connection is ready.
            if let Some(returning) = this.project().returning.take() {
                returning.give_back();
            }
        }
    }
}

/// A pooled connection on its way back to its pool.
pub(crate) struct Returning {
    pool: Arc<Http1Pool>,
    sender: SendRequest<UpstreamBody>,
}

impl Returning {
    pub(crate) fn new(pool: Arc<Http1Pool>, sender: SendRequest<UpstreamBody>) -> Self {
        Self { pool, sender }
    }

    fn give_back(self) {
        self.pool.give_back(self.sender);
    }
}

impl ResponseBody {
    /// A body whose connection is someone else's (hyper-util's pool).
    pub(crate) fn new(inner: Incoming) -> Self {
        Self {
            inner,
            returning: None,
        }
    }

    /// A body whose connection goes back to the client's pool.
    pub(crate) fn returning(inner: Incoming, returning: Returning) -> Self {
        Self {
            inner,
            returning: Some(returning),
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = this.inner.poll_frame(cx);
        // The end as hyper reports it: on a current-thread runtime the
        // connection's task has already taken up the next request by then,
        // so the connection is back in the list before the caller's next
        // request looks for one.
        if let Poll::Ready(None) = frame
            && let Some(returning) = this.returning.take()
        {
            returning.give_back();
        }
        frame
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("inner", &self.inner)
            .field("pooled", &self.returning.is_some())
            .finish()
    }
}
