use std::ops::Range;

use bytes::{Bytes, BytesMut};

/// Default cap on one line, in bytes.
pub(crate) const DEFAULT_MAX_LINE_BYTES: usize = 1 << 20;
/// Default cap on one event (all its lines and line ends), in bytes.
pub(crate) const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched Server-Sent Event.
///
/// `data` is a slice of the chunk it came from when the event had one `data`
/// line inside one chunk; otherwise it is the joined copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    event: Option<Bytes>,
    data: Bytes,
    id: Option<Bytes>,
    retry: Option<u64>,
    start: u64,
    end: u64,
}

impl SseEvent {
    /// The event type (`event:` field); `None` means the default, `message`.
    pub fn event(&self) -> Option<&[u8]> {
        self.event.as_deref()
    }

    /// Whether the event type is `name` (`message` matches an unnamed event).
    pub fn is_named(&self, name: &str) -> bool {
        match &self.event {
            Some(event) => event.as_ref() == name.as_bytes(),
            None => name == "message",
        }
    }

    /// The event's data, lines joined with `\n`. Always valid UTF-8: an event
    /// whose data is not is reported as [`SseError::InvalidUtf8`] instead.
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// The data as text.
    pub fn data_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.data).ok()
    }

    /// The `id` field set by this event, if any.
    pub fn id(&self) -> Option<&[u8]> {
        self.id.as_deref()
    }

    /// The `retry` field of this event, in milliseconds, if valid.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// The absolute byte range of the stream this event came from, from the
    /// byte after the previous dispatch up to and including its blank line.
    pub fn range(&self) -> Range<u64> {
        self.start..self.end
    }
}

/// What the scanner reports while it is fed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// An event with data was dispatched.
    Event(SseEvent),
    /// A blank line dispatched nothing: the bytes since the previous dispatch
    /// held only comments (keep-alives), non-data fields or nothing at all.
    Skipped {
        /// Absolute byte range of the skipped bytes, blank line included.
        range: Range<u64>,
    },
    /// Malformed input. [`SseError::InvalidUtf8`] covers one event and the
    /// scanner goes on; the size errors are fatal and the scanner stops.
    Error(SseError),
}

/// Scanner failures. Every variant says which bytes it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// An event's data is not valid UTF-8; the event was not dispatched.
    #[error("SSE event at bytes {}..{} has data that is not valid UTF-8", range.start, range.end)]
    InvalidUtf8 {
        /// Absolute byte range of the event.
        range: Range<u64>,
    },
    /// A line grew past the configured cap.
    #[error("SSE line starting at byte {start} exceeds the {limit}-byte line cap")]
    LineTooLong {
        /// Absolute offset where the line starts.
        start: u64,
        /// The configured cap.
        limit: usize,
    },
    /// An event grew past the configured cap.
    #[error("SSE event starting at byte {start} exceeds the {limit}-byte event cap")]
    EventTooLarge {
        /// Absolute offset where the event starts.
        start: u64,
        /// The configured cap.
        limit: usize,
    },
}

impl SseError {
    /// Whether the scanner stops after this error.
    pub(crate) fn is_fatal(&self) -> bool {
        !matches!(self, Self::InvalidUtf8 { .. })
    }
}

/// Bytes left after the last dispatch when the stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncated {
    /// Absolute byte range of the undispatched bytes.
    pub range: Range<u64>,
    /// Whether those bytes held a `data` field (an event was cut, not just a
    /// trailing comment or line).
    pub had_data: bool,
}

/// The `data` buffer of the event being built. One line inside one chunk
/// stays a slice of that chunk; anything else is joined into an owned buffer.
#[derive(Debug, Default)]
enum DataBuf {
    #[default]
    None,
    Slice(Bytes),
    Joined(BytesMut),
}

impl DataBuf {
    fn push_line(&mut self, value: Bytes) {
        *self = match std::mem::take(self) {
            Self::None => Self::Slice(value),
            Self::Slice(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + 1 + value.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(b"\n");
                joined.extend_from_slice(&value);
                Self::Joined(joined)
            }
            Self::Joined(mut joined) => {
                joined.extend_from_slice(b"\n");
                joined.extend_from_slice(&value);
                Self::Joined(joined)
            }
        }
    }

    fn take(&mut self) -> Option<Bytes> {
        match std::mem::take(self) {
            Self::None => None,
            Self::Slice(bytes) => Some(bytes),
            Self::Joined(joined) => Some(joined.freeze()),
        }
    }
}

/// Incremental Server-Sent Events scanner. See the [module docs](crate::sse).
#[derive(Debug)]
pub struct SseScanner {
    max_line: usize,
    max_event: usize,
    /// Absolute offset of the next byte to be fed.
    offset: u64,
    /// Absolute offset where the event being built starts.
    event_start: u64,
    /// The previous chunk ended in CR: an LF opening the next chunk is part
    /// of the same line end.
    pending_cr: bool,
    /// No line has been completed yet: its leading BOM is stripped.
    first_line: bool,
    /// A line that straddles chunks, copied (the only copy on the hot path).
    partial: BytesMut,
    data: DataBuf,
    event: Option<Bytes>,
    id: Option<Bytes>,
    retry: Option<u64>,
    last_event_id: Option<Bytes>,
    failed: bool,
}

impl Default for SseScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl SseScanner {
    /// A scanner with the default caps (1 MiB per line and per event).
    pub fn new() -> Self {
        Self {
            max_line: DEFAULT_MAX_LINE_BYTES,
            max_event: DEFAULT_MAX_EVENT_BYTES,
            offset: 0,
            event_start: 0,
            pending_cr: false,
            first_line: true,
            partial: BytesMut::new(),
            data: DataBuf::None,
            event: None,
            id: None,
            retry: None,
            last_event_id: None,
            failed: false,
        }
    }

    /// Sets the cap on one line, in bytes.
    pub fn max_line_bytes(mut self, limit: usize) -> Self {
        self.max_line = limit;
        self
    }

    /// Sets the cap on one event, in bytes (lines and line ends).
    pub fn max_event_bytes(mut self, limit: usize) -> Self {
        self.max_event = limit;
        self
    }

    /// Total bytes fed so far.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Feeds one chunk, calling `on_item` for each dispatch or error in
    /// stream order. After a fatal error the rest of the input is ignored.
    pub fn feed(&mut self, chunk: &Bytes, mut on_item: impl FnMut(SseItem)) {
        if self.failed {
            return;
        }
        let base = self.offset;
        self.offset += chunk.len() as u64;
        let bytes = chunk.as_ref();
        let mut pos = 0;
        if self.pending_cr {
            self.pending_cr = false;
            if bytes.first() == Some(&b'\n') {
                pos = 1;
                if self.event_start == base {
                    // The CR dispatched an event already; its LF tail is
                    // reported on its own so the ranges still tile the stream.
                    self.event_start = base + 1;
                    on_item(SseItem::Skipped {
                        range: base..base + 1,
                    });
                }
            }
        }
        while pos < bytes.len() {
            let Some(rel) = memchr::memchr2(b'\n', b'\r', &bytes[pos..]) else {
                // The rest is a partial line: carry it over (bounded).
                let line_start = base + pos as u64 - self.partial.len() as u64;
                let tail = &bytes[pos..];
                if self.partial.len() + tail.len() > self.max_line {
                    return self.fail(
                        SseError::LineTooLong {
                            start: line_start,
                            limit: self.max_line,
                        },
                        &mut on_item,
                    );
                }
                if self.offset - self.event_start > self.max_event as u64 {
                    return self.fail(
                        SseError::EventTooLarge {
                            start: self.event_start,
                            limit: self.max_event,
                        },
                        &mut on_item,
                    );
                }
                self.partial.extend_from_slice(tail);
                return;
            };
            let eol = pos + rel;
            let term = if bytes[eol] == b'\r' {
                match bytes.get(eol + 1) {
                    Some(b'\n') => 2,
                    Some(_) => 1,
                    None => {
                        self.pending_cr = true;
                        1
                    }
                }
            } else {
                1
            };
            let line_end = base + (eol + term) as u64;
            if self.partial.is_empty() {
                if eol - pos > self.max_line {
                    return self.fail(
                        SseError::LineTooLong {
                            start: base + pos as u64,
                            limit: self.max_line,
                        },
                        &mut on_item,
                    );
                }
                if !self.line(chunk, pos..eol, line_end, &mut on_item) {
                    return;
                }
            } else {
                let line_start = base + pos as u64 - self.partial.len() as u64;
                if self.partial.len() + (eol - pos) > self.max_line {
                    return self.fail(
                        SseError::LineTooLong {
                            start: line_start,
                            limit: self.max_line,
                        },
                        &mut on_item,
                    );
                }
                self.partial.extend_from_slice(&bytes[pos..eol]);
                let line = self.partial.split().freeze();
                let len = line.len();
                if !self.line(&line, 0..len, line_end, &mut on_item) {
                    return;
                }
            }
            pos = eol + term;
        }
    }

    /// Ends the stream. Returns what was pending after the last dispatch,
    /// which the spec discards: the caller decides whether that is a
    /// truncated event.
    pub fn finish(&mut self) -> Option<Truncated> {
        let had_data = !matches!(self.data, DataBuf::None);
        let range = self.event_start..self.offset;
        self.data = DataBuf::None;
        self.event = None;
        self.id = None;
        self.retry = None;
        self.partial.clear();
        self.event_start = self.offset;
        (!range.is_empty()).then_some(Truncated { range, had_data })
    }

    fn fail(&mut self, error: SseError, on_item: &mut impl FnMut(SseItem)) {
        self.failed = true;
        self.partial = BytesMut::new();
        self.data = DataBuf::None;
        on_item(SseItem::Error(error));
    }

    /// Handles one complete line `source[range]` whose line end finishes at
    /// absolute offset `line_end`. Returns false if the scanner failed.
    fn line(
        &mut self,
        source: &Bytes,
        mut range: Range<usize>,
        line_end: u64,
        on_item: &mut impl FnMut(SseItem),
    ) -> bool {
        if line_end - self.event_start > self.max_event as u64 {
            self.fail(
                SseError::EventTooLarge {
                    start: self.event_start,
                    limit: self.max_event,
                },
                on_item,
            );
            return false;
        }
        if std::mem::take(&mut self.first_line) && source[range.clone()].starts_with(BOM) {
            range.start += BOM.len();
        }
        let line = &source[range.clone()];
        if line.is_empty() {
            self.dispatch(line_end, on_item);
            return true;
        }
        if line[0] == b':' {
            return true; // comment, e.g. a keep-alive
        }
        let (name, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let mut value = range.start + colon + 1;
                if source.get(value) == Some(&b' ') && value < range.end {
                    value += 1;
                }
                (&line[..colon], value..range.end)
            }
            None => (line, range.end..range.end),
        };
        match name {
            b"data" => self.data.push_line(source.slice(value)),
            b"event" => self.event = Some(source.slice(value)),
            b"id" => {
                let id = &source[value.clone()];
                if memchr::memchr(0, id).is_none() {
                    self.id = Some(source.slice(value));
                }
            }
            b"retry" => {
                let digits = &source[value];
                if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
                    // All ASCII digits, so valid UTF-8; overflow is ignored.
                    self.retry = std::str::from_utf8(digits)
                        .ok()
                        .and_then(|d| d.parse().ok());
                }
            }
            _ => {}
        }
        true
    }

    fn dispatch(&mut self, end: u64, on_item: &mut impl FnMut(SseItem)) {
        let start = std::mem::replace(&mut self.event_start, end);
        let id = self.id.take();
        if id.is_some() {
            self.last_event_id.clone_from(&id);
        }
        let retry = self.retry.take();
        let event = self.event.take();
        let Some(data) = self.data.take() else {
            on_item(SseItem::Skipped { range: start..end });
            return;
        };
        if std::str::from_utf8(&data).is_err() {
            on_item(SseItem::Error(SseError::InvalidUtf8 { range: start..end }));
            return;
        }
        on_item(SseItem::Event(SseEvent {
            event,
            data,
            id,
            retry,
            start,
            end,
        }));
    }
}

#[cfg(test)]
impl SseScanner {
    /// The last event id the stream set, as the spec keeps it across events.
    pub(crate) fn last_event_id(&self) -> Option<&[u8]> {
        self.last_event_id.as_deref()
    }

    /// Whether a fatal error stopped the scanner.
    pub(crate) fn is_failed(&self) -> bool {
        self.failed
    }
}
