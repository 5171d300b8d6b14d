//! Helpers for reading a JSON request borrowed from its bytes, shared by
//! the dialects that rewrite requests by splicing the raw bytes.

use std::ops::Range;

use std::fmt;

use bytes::Bytes;
use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
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

/// A boolean field the gateway reads as the provider will: absent or
/// `null` is `None`; anything but `true` or `false` is refused, since a
/// lenient provider reads `1` or `"true"` as true where a strict reading
/// sees no boolean at all.
pub(crate) fn strict_bool(
    raw: Option<&RawValue>,
    field: &'static str,
) -> Result<Option<bool>, super::RequestError> {
    match raw.map(RawValue::get) {
        None | Some("null") => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(_) => Err(super::RequestError::WrongType {
            field,
            expected: "a boolean",
        }),
    }
}

/// An integer field the gateway reads as the provider will: absent or
/// `null` is `None`; a number with a fraction or an exponent (`2.0`,
/// `1e3`), a string or a value below `min` is refused.
pub(crate) fn strict_u64(
    raw: Option<&RawValue>,
    field: &'static str,
    min: u64,
) -> Result<Option<u64>, super::RequestError> {
    let Some(raw) = raw.filter(|r| r.get() != "null") else {
        return Ok(None);
    };
    let expected = if min == 0 {
        "a non-negative integer"
    } else {
        "a positive integer"
    };
    match serde_json::from_str::<u64>(raw.get()) {
        Ok(value) if value >= min => Ok(Some(value)),
        _ => Err(super::RequestError::WrongType { field, expected }),
    }
}

/// A field that must be an object when given (`null` reads as absent).
pub(crate) fn strict_object<'a>(
    raw: Option<&'a RawValue>,
    field: &'static str,
) -> Result<Option<&'a RawValue>, super::RequestError> {
    match raw {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) if first_byte(r) == b'{' => Ok(Some(r)),
        Some(_) => Err(super::RequestError::WrongType {
            field,
            expected: "an object",
        }),
    }
}

/// A field that must be a string (the caller handles absent and `null`).
pub(crate) fn strict_str<'a>(
    raw: &'a RawValue,
    field: &'static str,
) -> Result<std::borrow::Cow<'a, str>, super::RequestError> {
    serde_json::from_str(raw.get()).map_err(|_| super::RequestError::WrongType {
        field,
        expected: "a string",
    })
}

/// Whether a raw value is an array with at least one element.
pub(crate) fn non_empty_array(raw: Option<&RawValue>) -> bool {
    raw.and_then(|r| serde_json::from_str::<Vec<IgnoredAny>>(r.get()).ok())
        .is_some_and(|a| !a.is_empty())
}

/// The edit that puts `model` in place of the `model` value at `range`
/// (quotes included), or `None` when the body already says exactly that:
/// a pass-through target sends the client's own bytes. A model that JSON
/// needs no escapes for replaces what is between the quotes, borrowed;
/// only one that does is serialized.
pub(crate) fn model_edit<'m>(
    body: &[u8],
    range: &Range<usize>,
    model: &'m str,
) -> Option<(Range<usize>, std::borrow::Cow<'m, str>)> {
    let plain = model.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\');
    let raw = body.get(range.clone()).unwrap_or_default();
    if plain && raw.len() >= 2 && raw[0] == b'"' && raw[raw.len() - 1] == b'"' {
        let inner = range.start + 1..range.end - 1;
        if &raw[1..raw.len() - 1] == model.as_bytes() {
            return None;
        }
        return Some((inner, std::borrow::Cow::Borrowed(model)));
    }
    let json = serde_json::to_string(model).unwrap_or_else(|_| "\"\"".to_owned());
    Some((range.clone(), std::borrow::Cow::Owned(json)))
}

/// The body with each range replaced by its text; ranges are spans read
/// from this body and must not overlap. No edits: the body itself, shared.
/// The new body is allocated once, at its exact length (a `Vec` with room
/// to spare would cost `Bytes` a second allocation).
pub(crate) fn splice(
    body: &Bytes,
    edits: &mut [(Range<usize>, std::borrow::Cow<'_, str>)],
) -> Bytes {
    if edits.is_empty() {
        return body.clone();
    }
    // Unstable: never allocates, and ranges do not tie.
    edits.sort_unstable_by_key(|(range, _)| range.start);
    let added: usize = edits.iter().map(|(_, text)| text.len()).sum();
    let removed: usize = edits
        .iter()
        .filter(|(range, _)| range.start <= range.end && range.end <= body.len())
        .map(|(range, _)| range.len())
        .sum();
    let mut out = Vec::with_capacity((body.len() + added).saturating_sub(removed));
    let mut at = 0;
    for (range, text) in edits.iter() {
        if range.start < at || range.end > body.len() {
            continue; // cannot happen for spans read from this body
        }
        out.extend_from_slice(&body[at..range.start]);
        out.extend_from_slice(text.as_bytes());
        at = range.end;
    }
    out.extend_from_slice(&body[at..]);
    Bytes::from(out)
}

/// The leading byte of a body that is not whitespace.
pub(crate) fn first_non_space(body: &[u8]) -> Option<u8> {
    body.iter().find(|b| !b.is_ascii_whitespace()).copied()
}

/// Calls `each` on every element of the raw JSON array `raw`, in order,
/// reading one element at a time: no list of elements is built, so a
/// request of millions of tiny elements costs nothing per element.
/// Fails when `raw` is not an array.
pub(crate) fn for_each_element<'a>(
    raw: &'a RawValue,
    each: impl FnMut(&'a RawValue),
) -> Result<(), serde_json::Error> {
    struct Elements<F>(F);
    impl<'de, F: FnMut(&'de RawValue)> Visitor<'de> for Elements<F> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
            while let Some(element) = seq.next_element::<&'de RawValue>()? {
                (self.0)(element);
            }
            Ok(())
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    deserializer.deserialize_seq(Elements(each))?;
    deserializer.end()
}

/// A visitor's arms for JSON scalars (and null), all read as `$value`.
macro_rules! scalars_read_as {
    ($value:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}
pub(crate) use scalars_read_as;

/// What reads a request's list (`messages`) one element at a time, as
/// [`read_elements`] walks it.
pub(crate) trait ReadsElements: Default {
    /// Takes one element (any JSON value).
    fn element(&mut self, raw: &RawValue);
}

/// `deserialize_with` for a request's list, read element by element while
/// the body is read: the list is walked once there, not skipped as a raw
/// value and walked again after. `None` when the value is not an array.
/// No list of elements is built (see [`for_each_element`]). A value of any
/// other type is read only to be passed over; one number fails where a raw
/// skip did not, one too large for `f64` (`1e400`): the body is then
/// refused as not JSON rather than for that field.
pub(crate) fn read_elements<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: ReadsElements,
{
    struct List<T>(std::marker::PhantomData<T>);
    impl<'de, T: ReadsElements> Visitor<'de> for List<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<T>, A::Error> {
            let mut elements = T::default();
            while let Some(element) = seq.next_element::<&'de RawValue>()? {
                elements.element(element);
            }
            Ok(Some(elements))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Option<T>, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        scalars_read_as!(None);
    }
    d.deserialize_any(List(std::marker::PhantomData))
}

/// A request body's top-level object: not JSON, or JSON but not an
/// object, is refused as such.
pub(crate) fn request_object<'a, T: Deserialize<'a>>(
    body: &'a [u8],
) -> Result<T, super::RequestError> {
    if first_non_space(body) != Some(b'{') {
        return Err(match serde_json::from_slice::<IgnoredAny>(body) {
            Ok(_) => super::RequestError::NotObject,
            Err(e) => super::RequestError::NotJson(e.to_string()),
        });
    }
    serde_json::from_slice(body).map_err(|e| super::RequestError::NotJson(e.to_string()))
}

/// Reads a `content`-like value for a request's estimate: a string's
/// length is returned; each object of a list (up to `depth` 4) goes to
/// `object`, one at a time (a collected list would cost 16 bytes per
/// element of a hostile `[0,0,…]`).
pub(crate) fn walk_content<'a>(
    raw: &'a RawValue,
    depth: u8,
    mut object: impl FnMut(&'a RawValue),
) -> u64 {
    match first_byte(raw) {
        b'"' => raw.get().len().saturating_sub(2) as u64,
        b'[' if depth < 4 => {
            let _ = for_each_element(raw, |element| {
                if first_byte(element) == b'{' {
                    object(element);
                }
            });
            0
        }
        _ => 0,
    }
}

/// Why a whole answer is not a JSON object, if it is not: `what` names the
/// body in the message ("the completion body", "the message body").
pub(crate) fn not_an_object(body: &[u8], what: &str) -> Option<(super::BodyFault, String)> {
    if first_non_space(body) == Some(b'{') {
        return None;
    }
    Some(match serde_json::from_slice::<IgnoredAny>(body) {
        Ok(_) => (
            super::BodyFault::UnexpectedJson,
            format!("{what} is not a JSON object"),
        ),
        Err(e) => (
            super::BodyFault::NotJson,
            format!("{what} is not valid JSON: {e}"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body with its `model` replaced as an upstream body does it.
    fn with_model(body: &'static str, model: &str) -> (Bytes, bool) {
        let body = Bytes::from_static(body.as_bytes());
        let top: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&body).unwrap();
        assert!(top.contains_key("model"));
        #[derive(serde::Deserialize)]
        struct Top<'a> {
            #[serde(borrow)]
            model: &'a RawValue,
        }
        let top: Top<'_> = serde_json::from_slice(&body).unwrap();
        let range = span(&body, top.model);
        match model_edit(&body, &range, model) {
            None => (body.clone(), false),
            Some(edit) => (splice(&body, &mut [edit]), true),
        }
    }

    #[test]
    fn the_model_is_spliced_only_where_it_differs() {
        // The client's own model: the body is sent as it came, shared.
        let (body, edited) = with_model(r#"{"model":"gpt-4o","x":1}"#, "gpt-4o");
        assert!(!edited);
        assert_eq!(body, r#"{"model":"gpt-4o","x":1}"#);
        // Another plain model: between the quotes.
        let (body, edited) = with_model(r#"{"model" : "gpt-4o", "x":1}"#, "backup-model");
        assert!(edited);
        assert_eq!(body, r#"{"model" : "backup-model", "x":1}"#);
        // A model JSON must escape, and a client's escaped spelling.
        let (body, _) = with_model(r#"{"model":"m","x":1}"#, "a\"b\\c\n");
        assert_eq!(body, r#"{"model":"a\"b\\c\n","x":1}"#);
        let (body, edited) = with_model(r#"{"model":"gpt\u002d4","x":1}"#, "gpt-4");
        assert!(edited, "the same model spelled otherwise is rewritten");
        assert_eq!(body, r#"{"model":"gpt-4","x":1}"#);
        // Not a string (refused before this by the dialects; still JSON).
        let (body, _) = with_model(r#"{"model":7,"x":1}"#, "m");
        assert_eq!(body, r#"{"model":"m","x":1}"#);
        // Non-ASCII needs no escape.
        let (body, _) = with_model(r#"{"model":"m"}"#, "modèle");
        assert_eq!(body, r#"{"model":"modèle"}"#);
    }

    #[test]
    fn elements_are_visited_in_order_borrowed_from_the_array() {
        let raw: &RawValue = serde_json::from_str(r#"[1, "two", {"three": [3]}, []]"#).unwrap();
        let mut seen = Vec::new();
        for_each_element(raw, |e| seen.push(e.get())).unwrap();
        assert_eq!(seen, ["1", "\"two\"", r#"{"three": [3]}"#, "[]"]);
        let inside = raw.get().as_ptr() as usize..raw.get().as_ptr() as usize + raw.get().len();
        assert!(
            inside.contains(&(seen[2].as_ptr() as usize)),
            "borrowed, not copied"
        );

        let not_array: &RawValue = serde_json::from_str(r#"{"a": 1}"#).unwrap();
        assert!(for_each_element(not_array, |_| {}).is_err());
    }
}
