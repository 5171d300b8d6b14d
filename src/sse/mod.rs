//! An incremental, zero-copy Server-Sent Events scanner.
//!
//! [`SseScanner`] is fed the response body's `Bytes` chunks exactly as they
//! come off the wire, split anywhere, and reports each dispatched event with
//! the absolute byte range it came from, so a proxy can forward the original
//! bytes untouched and still know where every event begins and ends.
//!
//! It follows the WHATWG event-stream rules (HTML §9.2.5–9.2.6): CR, LF and
//! CRLF line ends (a CR closing one chunk and an LF opening the next are one
//! line end), one leading BOM, comment lines, fields without a colon, one
//! leading space stripped from values, multi-line `data` joined with `\n`,
//! `event` / `id` / `retry`, and dispatch on a blank line. An event still
//! pending at end of stream is not dispatched; [`SseScanner::finish`] reports
//! it as truncated.
//!
//! Why not an existing crate: the SSE crates on crates.io take the body over
//! and hand out owned `String`s; none reports byte ranges or borrows the
//! chunk, which the pass-through (zero-copy) and bounded-memory rules need.
//!
//! Memory is bounded: a line or an event larger than the configured caps
//! (default 1 MiB each) is a [`SseError`], never unbounded growth. Only a
//! line that straddles two chunks, or `data` spread over several lines, is
//! copied; the `data` of a one-line event inside one chunk is a slice of that
//! chunk.
//!
//! ```
//! use bytes::Bytes;
//! use tower_llm_failover::sse::{SseItem, SseScanner};
//!
//! let mut scanner = SseScanner::new();
//! let mut seen = Vec::new();
//! for chunk in ["data: {\"a\"", ":1}\r", "\n\r\n: keep-alive\n\ndata: [DONE]\n\n"] {
//!     scanner.feed(&Bytes::from(chunk), |item| {
//!         if let SseItem::Event(event) = item {
//!             seen.push((event.data_str().unwrap_or_default().to_owned(), event.range()));
//!         }
//!     });
//! }
//! assert_eq!(seen, vec![("{\"a\":1}".to_owned(), 0..17), ("[DONE]".to_owned(), 31..45)]);
//! assert!(scanner.finish().is_none());
//! ```

mod scanner;
#[cfg(test)]
mod scanner_tests;

pub(crate) use scanner::{DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_LINE_BYTES};
pub use scanner::{SseError, SseEvent, SseItem, SseScanner, Truncated};
