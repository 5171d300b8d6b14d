//! Translation to and from the neutral model: Messages.

use bytes::{Bytes, BytesMut};

use super::MessagesRequest;
use crate::dialect::{ChunkIdentity, NeutralEvent, NeutralRequest};
use crate::sse::SseEvent;

/// What translation keeps of one stream, read or written.
#[derive(Debug, Default)]
pub(super) struct StreamMemo {}

impl StreamMemo {
    /// The identity of the stream written so far, in this dialect's form.
    pub(super) fn identity(&self) -> ChunkIdentity<'_> {
        ChunkIdentity::default()
    }
}

pub(super) fn to_neutral(request: &MessagesRequest) -> Result<NeutralRequest, String> {
    let _ = request;
    Err("not yet".to_owned())
}

pub(super) fn from_neutral(request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
    let _ = (request, model);
    Err("not yet".to_owned())
}

pub(super) fn decode_event(event: &SseEvent, memo: &mut StreamMemo, out: &mut Vec<NeutralEvent>) {
    let _ = (event, memo, out);
}

pub(super) fn encode_event(event: &NeutralEvent, memo: &mut StreamMemo, out: &mut BytesMut) {
    let _ = (event, memo, out);
}

pub(super) fn decode_answer(body: &[u8]) -> Option<Vec<NeutralEvent>> {
    let _ = body;
    None
}

pub(super) fn encode_answer(events: &[NeutralEvent]) -> Bytes {
    let _ = events;
    Bytes::new()
}
