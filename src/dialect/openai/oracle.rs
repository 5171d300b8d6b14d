//! The serde-derive reading of chunk data that the skimmer replaced, kept
//! verbatim as the reference the differential tests compare against.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::{Usage, dialect::Chunk, dialect::ChunkIdentity, dialect::ChunkKind};

/// The fields of a chunk this dialect reads; everything else is skipped
/// without allocating.
#[derive(Deserialize)]
struct RawChunk<'a> {
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<i64>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<RawUsage>,
    #[serde(borrow, default)]
    choices: Choices<'a>,
}

#[derive(Deserialize)]
struct RawUsage {
    #[serde(default, rename = "prompt_tokens")]
    input_tokens: Option<u64>,
    #[serde(default, rename = "completion_tokens")]
    output_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(borrow, default)]
    delta: Option<RawDelta<'a>>,
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    finish_reason: Option<Cow<'a, str>>,
}

/// serde borrows a bare `Cow<str>` field but always allocates for an
/// `Option<Cow<str>>`; this borrows whenever the string has no escapes.
fn borrowed_str<'de: 'a, 'a, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Borrowed<'a>>::deserialize(deserializer)?.map(|b| b.0))
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    refusal: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
}

impl RawDelta<'_> {
    fn has_output(&self) -> bool {
        // A raw JSON value carries output unless it is null, an empty string
        // or an empty array. Comparing raw text avoids decoding escapes.
        let carries = |value: Option<&RawValue>| {
            value.is_some_and(|v| !matches!(v.get().trim(), "null" | "\"\"" | "[]"))
        };
        carries(self.content)
            || carries(self.tool_calls)
            || carries(self.refusal)
            || carries(self.reasoning_content)
            || carries(self.reasoning)
    }
}

/// A summary of `choices`, read element by element so no `Vec` is built.
#[derive(Default)]
struct Choices<'a> {
    output: bool,
    finish_reason: Option<Cow<'a, str>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Choices<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ChoicesVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for ChoicesVisitor<'a> {
            type Value = Choices<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of choices or null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Choices::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Choices::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_seq(self)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut choices = Choices::default();
                while let Some(choice) = seq.next_element::<RawChoice<'de>>()? {
                    choices.output |= choice.delta.as_ref().is_some_and(RawDelta::has_output);
                    if choices.finish_reason.is_none() {
                        choices.finish_reason = choice.finish_reason;
                    }
                }
                Ok(choices)
            }
        }
        deserializer.deserialize_option(ChoicesVisitor(std::marker::PhantomData))
    }
}

/// Whether a raw JSON value is truthy the way the SDKs test `data.get("error")`.
fn truthy(value: &RawValue) -> bool {
    !matches!(
        value.get().trim(),
        "null" | "false" | "\"\"" | "0" | "{}" | "[]"
    )
}

/// What `OpenAiChat::inspect` answered for a `message`/`error` event's data
/// before the skimmer.
pub(super) fn read_chunk(error_event: bool, data: &[u8]) -> Chunk<'_> {
    let raw: RawChunk<'_> = match serde_json::from_slice(data) {
        Ok(raw) => raw,
        Err(_) if error_event => return Chunk::of(ChunkKind::Error),
        Err(_) => return Chunk::of(ChunkKind::Malformed),
    };
    let kind = if error_event || raw.error.is_some_and(truthy) {
        ChunkKind::Error
    } else if raw.choices.output {
        ChunkKind::Output
    } else {
        ChunkKind::Preamble
    };
    Chunk {
        kind,
        finish_reason: raw.choices.finish_reason,
        usage: raw
            .usage
            .map(|u| Usage::new(u.input_tokens.unwrap_or(0), u.output_tokens.unwrap_or(0))),
        identity: ChunkIdentity {
            id: raw.id,
            model: raw.model,
            created: raw.created,
        },
    }
}
