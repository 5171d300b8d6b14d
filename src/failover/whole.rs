//! A whole body gathered from its frames: a body of one data frame (as a
//! small request or answer arrives) is that frame's `Bytes`, shared, not
//! copied; only a second frame starts a buffer. `collect()` would keep
//! every frame in a list on the heap first.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The data frames of one body so far.
#[derive(Default)]
pub(super) struct Gathered {
    first: Option<Bytes>,
    more: Option<BytesMut>,
}

impl Gathered {
    /// Adds a data frame (an empty one adds nothing).
    pub(super) fn push(&mut self, mut data: impl Buf) {
        let remaining = data.remaining();
        if remaining == 0 {
            return;
        }
        if let Some(more) = &mut self.more {
            more.put(data);
            return;
        }
        match self.first.take() {
            // Zero-copy for `Bytes` (its own `copy_to_bytes` shares).
            None => self.first = Some(data.copy_to_bytes(remaining)),
            Some(first) => {
                let mut more = BytesMut::with_capacity(first.len() + remaining);
                more.extend_from_slice(&first);
                more.put(data);
                self.more = Some(more);
            }
        }
    }

    /// The whole body.
    pub(super) fn into_bytes(self) -> Bytes {
        match (self.more, self.first) {
            (Some(more), _) => more.freeze(),
            (None, Some(first)) => first,
            (None, None) => Bytes::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_frame_is_that_frame_shared() {
        let frame = Bytes::from(vec![b'a'; 64]);
        let mut gathered = Gathered::default();
        gathered.push(frame.clone());
        let whole = gathered.into_bytes();
        assert_eq!(whole, frame);
        assert_eq!(whole.as_ptr(), frame.as_ptr(), "the frame, not a copy");
    }

    #[test]
    fn frames_are_joined_in_order_and_empty_ones_skipped() {
        let mut gathered = Gathered::default();
        for part in ["", "ab", "", "cd", "e", ""] {
            gathered.push(Bytes::from_static(part.as_bytes()));
        }
        assert_eq!(gathered.into_bytes(), "abcde");
        assert_eq!(Gathered::default().into_bytes(), "");
    }

    #[test]
    fn a_buf_of_several_chunks_is_read_whole() {
        let mut gathered = Gathered::default();
        gathered.push(Bytes::from_static(b"x"));
        gathered.push(Buf::chain(&b"yz"[..], &b"w"[..]));
        assert_eq!(gathered.into_bytes(), "xyzw");
    }
}
