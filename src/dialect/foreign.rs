//! A target's dialect when it is not the client's: the [`Dialect`] methods
//! translation needs, behind one object type, so targets of any dialect
//! share one failover service.

use std::any::TypeId;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use super::NeutralRequest;
use super::{AnswerFacts, BodyCheck, Chunk, Dialect, ErrorFacts, ErrorSource, NeutralEvent};
use crate::sse::SseEvent;

/// A target's dialect when it may not be the clients': shared by every
/// clone of the target.
#[derive(Clone)]
pub(crate) struct ForeignDialect(pub(crate) Arc<dyn Foreign>);

impl ForeignDialect {
    pub(crate) fn new<D: Dialect>(dialect: D) -> Self {
        Self(Arc::new(dialect))
    }

    /// Whether this is the dialect `D` (then nothing is translated).
    pub(crate) fn is<D: Dialect>(&self) -> bool {
        self.0.dialect_type() == TypeId::of::<D>()
    }
}

impl std::fmt::Debug for ForeignDialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name())
    }
}

/// A target's dialect, erased.
pub(crate) trait Foreign: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// The dialect's type: a target of the client's own dialect is not
    /// translated.
    fn dialect_type(&self) -> TypeId;
    fn upstream_path(&self) -> Option<&'static str>;
    fn body_from_neutral(&self, request: &NeutralRequest, model: &str) -> Result<Bytes, String>;
    fn upstream_headers(&self, client: &HeaderMap, upstream: &mut HeaderMap);
    /// A reader for one stream of this dialect.
    fn reader(&self) -> Box<dyn ForeignReader>;
    fn check_answer(&self, body: &[u8]) -> (BodyCheck, AnswerFacts);
    fn error_facts(&self, source: ErrorSource<'_>) -> Option<ErrorFacts>;
    fn decode_answer(&self, body: &[u8]) -> Option<Vec<NeutralEvent>>;
}

/// One stream of a target's dialect, read event by event: for the commit
/// machine (what each event is) and for translation (what it says).
pub(crate) trait ForeignReader: Send {
    fn inspect<'a>(&mut self, event: &'a SseEvent) -> Chunk<'a>;
    fn answer_open(&self) -> bool;
    fn error_facts(&self, event: &SseEvent) -> Option<ErrorFacts>;
    fn decode(&mut self, event: &SseEvent, out: &mut Vec<NeutralEvent>);
}

impl<T: Dialect> Foreign for T {
    fn name(&self) -> &'static str {
        Dialect::name(self)
    }

    fn dialect_type(&self) -> TypeId {
        TypeId::of::<T>()
    }

    fn upstream_path(&self) -> Option<&'static str> {
        Dialect::upstream_path(self)
    }

    fn body_from_neutral(&self, request: &NeutralRequest, model: &str) -> Result<Bytes, String> {
        Dialect::body_from_neutral(self, request, model)
    }

    fn upstream_headers(&self, client: &HeaderMap, upstream: &mut HeaderMap) {
        Dialect::upstream_headers(self, client, upstream);
    }

    fn reader(&self) -> Box<dyn ForeignReader> {
        Box::new(Reader {
            dialect: self.clone(),
            inspected: T::Memo::default(),
            decoded: T::Memo::default(),
        })
    }

    fn check_answer(&self, body: &[u8]) -> (BodyCheck, AnswerFacts) {
        Dialect::check_answer(self, body)
    }

    fn error_facts(&self, source: ErrorSource<'_>) -> Option<ErrorFacts> {
        Dialect::error_facts(self, source)
    }

    fn decode_answer(&self, body: &[u8]) -> Option<Vec<NeutralEvent>> {
        Dialect::decode_answer(self, body)
    }
}

/// A stream reader: the dialect and its two memos, one for reading kinds,
/// one for decoding.
struct Reader<T: Dialect> {
    dialect: T,
    inspected: T::Memo,
    decoded: T::Memo,
}

impl<T: Dialect> ForeignReader for Reader<T> {
    fn inspect<'a>(&mut self, event: &'a SseEvent) -> Chunk<'a> {
        self.dialect.inspect(event, &mut self.inspected)
    }

    fn answer_open(&self) -> bool {
        self.dialect.answer_open(&self.inspected)
    }

    fn error_facts(&self, event: &SseEvent) -> Option<ErrorFacts> {
        self.dialect.error_facts(ErrorSource::Event(event))
    }

    fn decode(&mut self, event: &SseEvent, out: &mut Vec<NeutralEvent>) {
        self.dialect.decode_event(event, &mut self.decoded, out);
    }
}
