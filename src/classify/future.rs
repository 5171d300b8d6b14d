use crate::classify::Note;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use http::{HeaderMap, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::service::{BoxError, transport_error};
use super::{Classifier, UpstreamError};

/// Frames read per poll before yielding, so a body that is always ready
/// (endless empty frames) cannot hog the executor; the deadline still ends it.
const FRAMES_PER_POLL: usize = 64;

pin_project! {
    /// Response future of [`Classify`](super::Classify).
    ///
    /// # Panics
    ///
    /// When polled again after it completed, like most futures.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
        classifier: Classifier,
        provider: Option<Arc<str>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Waiting { #[pin] future: F },
        // Boxed: the success path's future stays small.
        Reading { #[pin] body: B, read: Box<ReadState> },
        Done,
    }
}

struct ReadState {
    status: StatusCode,
    headers: HeaderMap,
    buf: BytesMut,
    deadline: Pin<Box<Sleep>>,
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn new(future: F, classifier: Classifier, provider: Option<Arc<str>>) -> Self {
        Self {
            state: State::Waiting { future },
            classifier,
            provider,
        }
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Reading { .. } => "reading_error_body",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Body,
    B::Data: Buf,
{
    type Output = Result<Response<B>, UpstreamError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { future } => {
                    let result = ready!(future.poll(cx));
                    let response = match result {
                        Ok(response) => response,
                        Err(e) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(transport_error(
                                this.classifier,
                                this.provider,
                                e.into(),
                                None,
                            )));
                        }
                    };
                    if response.status().is_success() {
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(response));
                    }
                    let (parts, body) = response.into_parts();
                    let read = Box::new(ReadState {
                        status: parts.status,
                        headers: parts.headers,
                        buf: BytesMut::new(),
                        deadline: Box::pin(tokio::time::sleep(this.classifier.body_timeout())),
                    });
                    this.state.set(State::Reading { body, read });
                }
                StateProj::Reading { body, read } => {
                    let note = ready!(poll_read(body, read, this.classifier.body_limit(), cx));
                    let status = read.status;
                    let headers = std::mem::take(&mut read.headers);
                    let retained = std::mem::take(&mut read.buf).freeze();
                    this.state.set(State::Done);
                    let mut c = this.classifier.classify_head(
                        this.provider.as_deref(),
                        status,
                        &headers,
                        &retained,
                    );
                    if let Some(note) = note {
                        c.note = Some(note);
                    }
                    return Poll::Ready(Err(UpstreamError::new(c)
                        .with_provider(this.provider.clone())
                        .with_body(retained)));
                }
                StateProj::Done => panic!("classify::ResponseFuture polled after completion"),
            }
        }
    }
}

/// Reads the error body into `read.buf` up to `limit` bytes. Ready with
/// `None` at its end, or with a note when it was cut short.
fn poll_read<B>(
    mut body: Pin<&mut B>,
    read: &mut ReadState,
    limit: usize,
    cx: &mut Context<'_>,
) -> Poll<Option<Note>>
where
    B: Body,
    B::Data: Buf,
{
    for _ in 0..FRAMES_PER_POLL {
        match body.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let Ok(mut data) = frame.into_data() else {
                    continue; // trailers: nothing to classify from
                };
                while data.has_remaining() {
                    let room = limit.saturating_sub(read.buf.len());
                    if room == 0 {
                        return Poll::Ready(Some(Note::ErrorBodyTooLarge));
                    }
                    let chunk = data.chunk();
                    let n = chunk.len().min(room);
                    read.buf.extend_from_slice(&chunk[..n]);
                    data.advance(n);
                }
            }
            Poll::Ready(Some(Err(_))) => return Poll::Ready(Some(Note::ErrorBodyUnreadable)),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {
                return match read.deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Note::ErrorBodyTimeout)),
                    Poll::Pending => Poll::Pending,
                };
            }
        }
    }
    if read.deadline.as_mut().poll(cx).is_ready() {
        return Poll::Ready(Some(Note::ErrorBodyTimeout));
    }
    cx.waker().wake_by_ref();
    Poll::Pending
}
