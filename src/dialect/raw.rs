//! Helpers for reading a JSON request borrowed from its bytes, shared by
//! the dialects that rewrite requests by splicing the raw bytes.

use std::ops::Range;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

/// A field that is present, `null` included.
pub(crate) fn present<'de, D>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// The position of `raw` inside `body` (it was borrowed from it).
pub(crate) fn span(body: &[u8], raw: &RawValue) -> Range<usize> {
    let start = (raw.get().as_ptr() as usize).saturating_sub(body.as_ptr() as usize);
    start..start + raw.get().len()
}

/// The first byte of a raw value: which kind of JSON value it is.
pub(crate) fn first_byte(raw: &RawValue) -> u8 {
    raw.get().as_bytes().first().copied().unwrap_or(b' ')
}

/// Whether a raw value is the literal `true`.
pub(crate) fn is_true(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|r| r.get() == "true")
}

/// Whether a raw value is an array with at least one element.
pub(crate) fn non_empty_array(raw: Option<&RawValue>) -> bool {
    raw.and_then(|r| serde_json::from_str::<Vec<IgnoredAny>>(r.get()).ok())
        .is_some_and(|a| !a.is_empty())
}

/// The body with each range replaced by its text; ranges are spans read
/// from this body and must not overlap.
pub(crate) fn splice(
    body: &[u8],
    mut edits: Vec<(Range<usize>, std::borrow::Cow<'_, str>)>,
) -> Vec<u8> {
    edits.sort_by_key(|(range, _)| range.start);
    let added: usize = edits.iter().map(|(_, text)| text.len()).sum();
    let mut out = Vec::with_capacity(body.len() + added);
    let mut at = 0;
    for (range, text) in &edits {
        if range.start < at || range.end > body.len() {
            continue; // cannot happen for spans read from this body
        }
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(text.as_bytes());
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    out
}

/// The leading byte of a body that is not whitespace.
pub(crate) fn first_non_space(body: &[u8]) -> Option<u8> {
    body.iter().find(|b| !b.is_ascii_whitespace()).copied()
}
