//! The Responses dialect's mapping to and from the neutral turn model.

use bytes::{Bytes, BytesMut};

use super::ResponsesRequest;
use crate::dialect::{ChunkIdentity, NeutralEvent, NeutralRequest};
use crate::sse::SseEvent;

/// What a Responses stream being read or written keeps between events.
#[derive(Debug, Default)]
pub(super) struct StreamMemo {
    next_sequence: u64,
}

impl StreamMemo {
    /// The identity of the stream written so far.
    pub(super) fn identity(&self) -> ChunkIdentity<'_> {
        ChunkIdentity::default()
    }

    /// The `sequence_number` the next event written gets.
    pub(super) fn next_sequence(&self) -> u64 {
        self.next_sequence
    }
}

pub(super) fn to_neutral(request: &ResponsesRequest) -> Result<NeutralRequest, String> {
    let _ = request.body();
    Err("the openai-responses dialect does not translate yet".to_owned())
}

pub(super) fn body_from_neutral(request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
    let _ = (request, model);
    Err("the openai-responses dialect does not translate yet".to_owned())
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

pub(super) fn encode_answer(events: &[NeutralEvent]) -> Option<Bytes> {
    let _ = events;
    None
}
