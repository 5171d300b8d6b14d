use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::dialect::{DefaultDialect, Dialect};
use crate::stream::StreamStateBody;

use crate::BoxError;

pin_project! {
    /// The response body of [`Failover`](super::Failover): a whole JSON body
    /// (a non-streaming answer or an error), or a committed stream: the
    /// [commit machine](crate::stream::commit)'s body that held the preamble back,
    /// releasing it and then the rest of the upstream, so a later failure
    /// ends it cleanly.
    pub struct FailoverBody<B, D: Dialect = DefaultDialect> {
        #[pin]
        kind: Kind<B, D>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B, D: Dialect> {
        Full { bytes: Option<Bytes> },
        Stream { body: Pin<Box<StreamStateBody<B, D>>> },
    }
}

impl<B, D: Dialect> FailoverBody<B, D> {
    pub(crate) fn full(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Full { bytes: Some(bytes) },
        }
    }

    pub(crate) fn stream(body: Pin<Box<StreamStateBody<B, D>>>) -> Self {
        Self {
            kind: Kind::Stream { body },
        }
    }

    /// Whether this is a committed stream (rather than a whole body).
    pub(crate) fn is_stream(&self) -> bool {
        matches!(self.kind, Kind::Stream { .. })
    }
}

impl<B, D: Dialect> std::fmt::Debug for FailoverBody<B, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Full { bytes } => f
                .debug_struct("FailoverBody::Full")
                .field("len", &bytes.as_ref().map(Bytes::len))
                .finish(),
            Kind::Stream { .. } => f.write_str("FailoverBody::Stream"),
        }
    }
}

impl<B, D: Dialect> Body for FailoverBody<B, D>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    D: Dialect,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Full { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            KindProj::Stream { body } => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { bytes } => bytes.is_none(),
            Kind::Stream { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            Kind::Stream { body } => body.size_hint(),
        }
    }
}
