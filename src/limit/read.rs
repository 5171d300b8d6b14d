//! A body read whole: a body of one data frame (as a small request or
//! answer arrives) is that frame's `Bytes`, shared, not copied. A body of
//! more frames keeps them, shared, and joins them once at the end into a
//! buffer of the exact size: at its peak it holds twice its size, as
//! `collect()` does, not the three times a growing buffer can while it
//! moves to a larger one.

use bytes::{Buf, Bytes, BytesMut};
use http_body::Body;
use http_body_util::{BodyExt, Limited};

use crate::BoxError;

/// Reads `body` whole, at most `max_bytes` of it, as
/// `axum::body::to_bytes` does; trailers are dropped.
///
/// A body of one data frame (a small request, as hyper hands one over) is
/// that frame's `Bytes`, shared, not copied, and no list of frames is kept
/// on the heap: two allocations and about a thousand instructions fewer
/// per request than collecting it.
///
/// # Errors
///
/// The body's own error (a [`ReadLimitError`](super::ReadLimitError) from
/// a [`ReadLimitLayer`](super::ReadLimitLayer) among them, findable with
/// [`ReadLimitError::find_in`](super::ReadLimitError::find_in)), or an
/// [`http_body_util::LengthLimitError`] once the body passes `max_bytes`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use tower_llm_failover::limit::read_whole;
///
/// let body = Full::new(Bytes::from_static(b"{\"model\":\"m\"}"));
/// assert_eq!(read_whole(body, 1024).await.unwrap(), "{\"model\":\"m\"}");
///
/// let error = read_whole(Full::new(Bytes::from(vec![b' '; 2048])), 1024)
///     .await
///     .unwrap_err();
/// assert!(error.is::<http_body_util::LengthLimitError>());
/// # }
/// ```
pub async fn read_whole<B>(body: B, max_bytes: usize) -> Result<Bytes, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(Limited::new(body, max_bytes));
    let mut gathered = Gathered::default();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            gathered.push(data);
        }
    }
    Ok(gathered.into_bytes())
}

/// The data frames of one body so far.
#[derive(Default)]
pub(crate) struct Gathered {
    first: Option<Bytes>,
    /// The frames after the first (no allocation for a one-frame body).
    more: Vec<Bytes>,
    len: usize,
}

impl Gathered {
    /// Adds a data frame (an empty one adds nothing).
    pub(crate) fn push(&mut self, mut data: impl Buf) {
        let remaining = data.remaining();
        if remaining == 0 {
            return;
        }
        // Zero-copy for `Bytes` (its own `copy_to_bytes` shares).
        let frame = data.copy_to_bytes(remaining);
        self.len += remaining;
        if self.first.is_none() {
            self.first = Some(frame);
        } else {
            self.more.push(frame);
        }
    }

    /// The whole body.
    pub(crate) fn into_bytes(self) -> Bytes {
        let Some(first) = self.first else {
            return Bytes::new();
        };
        if self.more.is_empty() {
            return first;
        }
        let mut whole = BytesMut::with_capacity(self.len);
        whole.extend_from_slice(&first);
        for frame in &self.more {
            whole.extend_from_slice(frame);
        }
        whole.freeze()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body::Frame;
    use http_body_util::StreamBody;

    use super::*;

    fn frames(parts: &[&'static str]) -> impl Body<Data = Bytes, Error = Infallible> {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = parts
            .iter()
            .map(|part| Ok(Frame::data(Bytes::from_static(part.as_bytes()))))
            .chain([Ok(Frame::trailers(http::HeaderMap::new()))])
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn one_frame_is_shared_and_frames_are_joined_in_order() {
        let frame = Bytes::from(vec![b'a'; 64]);
        let whole = read_whole(http_body_util::Full::new(frame.clone()), 64)
            .await
            .unwrap();
        assert_eq!(whole.as_ptr(), frame.as_ptr(), "the frame, not a copy");
        let whole = read_whole(frames(&["ab", "", "cd", "e"]), 5).await.unwrap();
        assert_eq!(whole, "abcde", "in order, trailers dropped");
        assert_eq!(read_whole(frames(&[]), 5).await.unwrap(), "");
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_a_length_limit_error() {
        let error = read_whole(frames(&["ab", "cd", "e"]), 4).await.unwrap_err();
        assert!(error.is::<http_body_util::LengthLimitError>(), "{error}");
    }

    #[tokio::test]
    async fn the_body_error_comes_through() {
        let failing = StreamBody::new(futures_util::stream::iter([Err::<Frame<Bytes>, _>(
            std::io::Error::other("reset"),
        )]));
        let error = read_whole(failing, 16).await.unwrap_err();
        assert!(error.is::<std::io::Error>(), "{error}");
    }

    #[test]
    fn a_buf_of_several_chunks_is_read_whole() {
        let mut gathered = Gathered::default();
        gathered.push(Bytes::from_static(b"x"));
        gathered.push(Buf::chain(&b"yz"[..], &b"w"[..]));
        assert_eq!(gathered.into_bytes(), "xyzw");
    }
}
