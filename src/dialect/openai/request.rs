//! Chat completion requests: read once, borrowed from the body, and
//! rewritten per target by splicing the raw bytes (no JSON tree is built,
//! cloned or re-serialised per attempt).
//!
//! The fields the gateway decides on must mean to it what they mean to the
//! provider. Pydantic-style providers coerce `"stream": "true"` or `1` to
//! `true`, so a lenient reading here would call a stream a whole answer
//! (and class the SSE that comes back as an invalid response). These
//! fields are therefore read strictly, `null` meaning absent, and any other
//! type is refused with a 400 ([`RequestError::WrongType`], code
//! `invalid_type`, `param` naming the field):
//!
//! | field | must be |
//! |---|---|
//! | `model` | a string (absent or `null`: [`RequestError::MissingModel`]) |
//! | `messages` | an array ([`RequestError::MissingMessages`]) |
//! | `stream` | a boolean |
//! | `stream_options` | an object |
//! | `stream_options.include_usage` | a boolean |
//! | `n` | a positive integer |
//! | `max_tokens`, `max_completion_tokens` | non-negative integers |
//! | `parallel_tool_calls` | a boolean |
//!
//! Other fields pass to the provider untouched and unjudged.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::dialect::raw::{
    first_byte, for_each_element, model_edit, non_empty_array, present, scalars_read_as, span,
    splice, strict_bool, strict_object, strict_str, strict_u64,
};
use crate::dialect::{RequestError, Requirements, ResponseFormat};

/// A parsed chat completion request: the body, and where in it the fields
/// a target rewrites are.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    body: Bytes,
    /// The `model` value, quotes included.
    model: Range<usize>,
    /// The `stream_options` value, when present.
    stream_options: Option<Range<usize>>,
    /// The top-level object's closing brace.
    close: usize,
    stream: bool,
}

impl ChatRequest {
    /// The client's body, as it came (translation parses it again).
    pub(super) fn body(&self) -> &Bytes {
        &self.body
    }
}

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    /// Tallied as the body is read: the prompt is walked once here, not
    /// skipped here and walked again after.
    #[serde(default, deserialize_with = "tally_messages")]
    messages: Option<Tally>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    functions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response_format: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    // `null` is kept as a value (not `None`) so the splice replaces it
    // rather than adding a second `stream_options`.
    #[serde(borrow, default, deserialize_with = "present")]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    parallel_tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    n: Option<&'a RawValue>,
    /// OpenAI's `reasoning_effort` (`"low"`, `"medium"`, `"high"`, ...).
    #[serde(borrow, default)]
    reasoning_effort: Option<&'a RawValue>,
    /// OpenRouter's `reasoning` object (`effort`, `max_tokens`, `enabled`).
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Reasoning<'a> {
    #[serde(borrow, default)]
    effort: Option<Cow<'a, str>>,
    #[serde(default)]
    enabled: Option<bool>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct StreamOptions<'a> {
    #[serde(borrow, default)]
    include_usage: Option<&'a RawValue>,
}

/// Whether the request turns reasoning on: a `reasoning_effort` other than
/// `"none"`, or a `reasoning` object not switched off (`enabled: false`,
/// `effort: "none"`).
fn asks_for_reasoning(effort: Option<&RawValue>, reasoning: Option<&RawValue>) -> bool {
    let on = |effort: &str| !effort.eq_ignore_ascii_case("none");
    let by_effort = effort
        .and_then(|e| serde_json::from_str::<Cow<'_, str>>(e.get()).ok())
        .is_some_and(|e| on(&e));
    let by_object = reasoning
        .filter(|r| first_byte(r) == b'{')
        .and_then(|r| serde_json::from_str::<Reasoning<'_>>(r.get()).ok())
        .is_some_and(|r| r.enabled != Some(false) && r.effort.as_deref().is_none_or(on));
    by_effort || by_object
}

/// Reads a chat completion request.
pub(super) fn read(body: Bytes) -> Result<(Requirements, ChatRequest), RequestError> {
    match super::skim::skim_request(&body) {
        Some(usual) => Ok(read_usual(body, usual)),
        None => read_in_full(body),
    }
}

/// A request of the usual shape, as [`skim_request`](super::skim::skim_request)
/// read it: what [`read_in_full`] makes of the same body.
fn read_usual(body: Bytes, usual: super::skim::RequestSkim) -> (Requirements, ChatRequest) {
    let quoted = usual.model.start + 1..usual.model.end.saturating_sub(1);
    let model = body
        .get(quoted)
        .and_then(|text| std::str::from_utf8(text).ok())
        .unwrap_or_default();
    let requirements = Requirements {
        model: model.to_owned(),
        stream: usual.stream,
        input_tokens: usual.text_bytes.div_ceil(4),
        max_output_tokens: usual.max_output_tokens,
        ..Requirements::default()
    };
    let request = ChatRequest {
        model: usual.model,
        stream_options: None,
        close: closing_brace(&body),
        stream: usual.stream,
        body,
    };
    (requirements, request)
}

/// Where the body's last byte other than whitespace is.
fn closing_brace(body: &[u8]) -> usize {
    body.iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .unwrap_or(0)
}

/// Reads a chat request by serde alone (every request the skimmer does
/// not read, and the reference it is checked against).
pub(super) fn read_in_full(body: Bytes) -> Result<(Requirements, ChatRequest), RequestError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first != Some(b'{') {
        return Err(match serde_json::from_slice::<IgnoredAny>(&body) {
            Ok(_) => RequestError::NotObject,
            Err(e) => RequestError::NotJson(e.to_string()),
        });
    }
    let top: Top<'_> =
        serde_json::from_slice(&body).map_err(|e| RequestError::NotJson(e.to_string()))?;
    let close = closing_brace(&body);
    let messages = top.messages.ok_or(RequestError::MissingMessages)?;
    let model_raw = top
        .model
        .filter(|m| m.get() != "null")
        .ok_or(RequestError::MissingModel)?;
    let model = strict_str(model_raw, "model")?;
    let stream = strict_bool(top.stream, "stream")?.unwrap_or(false);
    let include_usage = match strict_object(top.stream_options, "stream_options")? {
        Some(options) => {
            let options = serde_json::from_str::<StreamOptions<'_>>(options.get())
                .map_err(|e| RequestError::NotJson(e.to_string()))?;
            strict_bool(options.include_usage, "stream_options.include_usage")?.unwrap_or(false)
        }
        None => false,
    };
    strict_u64(top.n, "n", 1)?;
    let max_completion_tokens = strict_u64(top.max_completion_tokens, "max_completion_tokens", 0)?;
    let max_tokens = strict_u64(top.max_tokens, "max_tokens", 0)?;
    let parallel_tool_calls = strict_bool(top.parallel_tool_calls, "parallel_tool_calls")?;
    let Tally {
        text_bytes,
        image_input,
    } = messages;
    let text_bytes = text_bytes + top.tools.map_or(0, |t| t.get().len() as u64);
    let tools = non_empty_array(top.tools) || non_empty_array(top.functions);
    let response_format = top
        .response_format
        .filter(|f| first_byte(f) == b'{')
        .and_then(|f| serde_json::from_str::<Typed<'_>>(f.get()).ok())
        .and_then(|f| match f.kind.as_deref() {
            Some("json_schema") => Some(ResponseFormat::JsonSchema),
            Some("json_object") => Some(ResponseFormat::JsonObject),
            _ => None,
        });
    let max_output_tokens = max_completion_tokens.or(max_tokens);
    let requirements = Requirements {
        model: model.into_owned(),
        tools,
        parallel_tool_calls: tools && parallel_tool_calls == Some(true),
        response_format,
        stream,
        include_usage,
        image_input,
        document_input: false,
        reasoning: asks_for_reasoning(top.reasoning_effort, top.reasoning),
        input_tokens: text_bytes.div_ceil(4),
        max_output_tokens,
        ..Requirements::default()
    };
    let request = ChatRequest {
        model: span(&body, model_raw),
        stream_options: top.stream_options.map(|o| span(&body, o)),
        close,
        stream,
        body: body.clone(),
    };
    Ok((requirements, request))
}

/// What the estimate needs of `messages`: text bytes (plus some framing
/// per message) and whether any message has an image part.
#[derive(Debug, Default)]
struct Tally {
    text_bytes: u64,
    image_input: bool,
}

/// `deserialize_with` for `messages`: each message is read once, as the
/// body is read (its `content` and `tool_calls` borrowed as they stand),
/// and tallied. `None` when `messages` is not an array. No list is built:
/// a list would cost 16 bytes per element of a hostile `[0,0,…]`, far over
/// the request's memory bound.
///
/// A message is read as the derived `Message` read it when it was parsed
/// on its own: keys other than `content` and `tool_calls` are skipped, a
/// repeated one leaves the message counted as framing only, and elements
/// that are not objects count as framing. Read in place, two inputs now
/// fail the request as not JSON where they only went uncounted: a number
/// too large for `f64` (`1e400`) or a string with a lone surrogate escape
/// (`"\ud800"`) as a message (or as `messages`), and such a string as a
/// message's key.
fn tally_messages<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Tally>, D::Error> {
    d.deserialize_any(Messages)
}

/// The `messages` value: an array, or anything else (read as no array).
struct Messages;

impl<'de> Visitor<'de> for Messages {
    type Value = Option<Tally>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the messages")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<Tally>, A::Error> {
        let mut tally = Tally::default();
        while seq.next_element_seed(MessageSeed(&mut tally))?.is_some() {}
        Ok(Some(tally))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Tally>, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    scalars_read_as!(None);
}

/// One message, tallied into the turn's [`Tally`].
struct MessageSeed<'t>(&'t mut Tally);

impl<'de> DeserializeSeed<'de> for MessageSeed<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.0.text_bytes += 16; // role and framing
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessageSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (mut content, mut tool_calls): (Option<&'de RawValue>, Option<&'de RawValue>) =
            (None, None);
        let mut repeated = false;
        while let Some(key) = map.next_key::<MessageKey>()? {
            let slot = match key {
                MessageKey::Content => &mut content,
                MessageKey::ToolCalls => &mut tool_calls,
                MessageKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            let value = map.next_value::<&'de RawValue>()?;
            repeated |= slot.replace(value).is_some();
        }
        if !repeated {
            self.0.message(content, tool_calls);
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
    scalars_read_as!(());
}

/// A message's key: the two the tally reads, or another.
enum MessageKey {
    Content,
    ToolCalls,
    Other,
}

impl<'de> Deserialize<'de> for MessageKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Key;
        impl Visitor<'_> for Key {
            type Value = MessageKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, key: &str) -> Result<MessageKey, E> {
                Ok(match key {
                    "content" => MessageKey::Content,
                    "tool_calls" => MessageKey::ToolCalls,
                    _ => MessageKey::Other,
                })
            }
        }
        d.deserialize_identifier(Key)
    }
}

impl Tally {
    /// Adds a message's `content` and `tool_calls`.
    fn message(&mut self, content: Option<&RawValue>, tool_calls: Option<&RawValue>) {
        match content.map(|c| (first_byte(c), c)) {
            Some((b'"', text)) => self.text_bytes += text.get().len().saturating_sub(2) as u64,
            Some((b'[', parts)) => {
                let _ = for_each_element(parts, |part| {
                    if first_byte(part) != b'{' {
                        return;
                    }
                    let Ok(part) = serde_json::from_str::<Part<'_>>(part.get()) else {
                        return;
                    };
                    if let Some("image_url" | "input_image" | "image") = part.kind.as_deref() {
                        self.image_input = true;
                    }
                    if let Some(text) = part.text.filter(|t| first_byte(t) == b'"') {
                        self.text_bytes += text.get().len().saturating_sub(2) as u64;
                    }
                });
            }
            _ => {}
        }
        if let Some(calls) = tool_calls {
            self.text_bytes += calls.get().len() as u64;
        }
    }
}

/// The body one target receives: `model` spliced in, and for a stream
/// `stream_options.include_usage` turned on, whatever the client sent.
pub(super) fn upstream_body(request: &ChatRequest, model: &str) -> Bytes {
    let body = &request.body;
    // At most two edits, kept on the stack.
    let mut edits: [(Range<usize>, Cow<'_, str>); 2] = Default::default();
    let mut count = 0;
    let mut push = |edit| {
        edits[count] = edit;
        count += 1;
    };
    if let Some(edit) = model_edit(body, &request.model, model) {
        push(edit);
    }
    if request.stream {
        match &request.stream_options {
            Some(range) => {
                let options = body
                    .get(range.clone())
                    .and_then(|raw| {
                        serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(raw)
                            .ok()
                    })
                    .unwrap_or_default();
                let mut options = options;
                options.insert("include_usage".to_owned(), serde_json::Value::Bool(true));
                let json = serde_json::to_string(&options)
                    .unwrap_or_else(|_| r#"{"include_usage":true}"#.to_owned());
                push((range.clone(), Cow::Owned(json)));
            }
            None => push((
                request.close..request.close,
                Cow::Borrowed(r#","stream_options":{"include_usage":true}"#),
            )),
        }
    }
    splice(body, &mut edits[..count])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_json(value: serde_json::Value) -> Result<(Requirements, ChatRequest), RequestError> {
        read(Bytes::from(value.to_string()))
    }

    #[test]
    fn reasoning_effort_or_a_reasoning_object_asks_for_reasoning() {
        let reasoning = |extra: serde_json::Value| {
            let mut body = serde_json::json!({
                "model": "o-x",
                "messages": [{"role": "user", "content": "hi"}]
            });
            if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
                body.extend(extra.clone());
            }
            read_json(body).unwrap().0.reasoning
        };
        assert!(!reasoning(serde_json::json!({})));
        assert!(reasoning(serde_json::json!({"reasoning_effort": "high"})));
        assert!(!reasoning(serde_json::json!({"reasoning_effort": "none"})));
        assert!(!reasoning(serde_json::json!({"reasoning_effort": null})));
        assert!(reasoning(
            serde_json::json!({"reasoning": {"effort": "low"}})
        ));
        assert!(reasoning(
            serde_json::json!({"reasoning": {"max_tokens": 2000}})
        ));
        assert!(!reasoning(
            serde_json::json!({"reasoning": {"enabled": false}})
        ));
        assert!(!reasoning(
            serde_json::json!({"reasoning": {"effort": "none"}})
        ));
    }

    #[test]
    fn reads_what_a_request_needs() {
        let body = serde_json::json!({
            "model": "gpt-x",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": 100,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "parallel_tool_calls": true,
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:..."}}
                ]}
            ]
        });
        let (r, _) = read_json(body).unwrap();
        assert_eq!(r.model, "gpt-x");
        assert!(r.tools && r.parallel_tool_calls && r.stream && r.include_usage && r.image_input);
        assert_eq!(r.response_format, Some(ResponseFormat::JsonSchema));
        assert_eq!(r.max_output_tokens, Some(100));
        assert!(r.input_tokens > 10);
    }

    /// The estimate counts each message's framing (16), string content
    /// and text parts without their quotes, and `tool_calls` raw; anything
    /// else in `messages` is framing only; the tools' text is added.
    #[test]
    fn the_prompt_is_tallied_exactly_as_the_body_is_read() {
        let input = |body: &str| {
            read(Bytes::from(body.to_owned()))
                .map(|(r, _)| (r.input_tokens, r.image_input))
                .map_err(|e| e.to_string())
        };
        // 16 + 4 ("abcd") = 20 bytes: 5 tokens.
        assert_eq!(
            input(r#"{"model":"m","messages":[{"role":"user","content":"abcd"}]}"#),
            Ok((5, false))
        );
        // Escapes count as written: "a\nb" is 4 bytes between the quotes.
        assert_eq!(
            input(r#"{"model":"m","messages":[{"content":"a\nb","role":"user"}]}"#),
            Ok((5, false))
        );
        // 16 + 8 (two parts' text) + 16 + 18 (tool_calls raw) = 58: 15.
        assert_eq!(
            input(
                r#"{"model":"m","messages":[{"content":[{"type":"text","text":"abcd"},{"type":"image_url","text":"efgh"},7]},{"tool_calls":[{"id":"c","x":1}]}]}"#
            ),
            Ok((15, true))
        );
        // Elements that are no message, and a message with a repeated
        // `content`, are framing only: 4 × 16 = 64: 16.
        assert_eq!(
            input(
                r#"{"model":"m","messages":[7,"x",[{"content":"abcd"}],{"content":"ab","content":"cd"}]}"#
            ),
            Ok((16, false))
        );
        // Other keys are skipped whatever they hold; an escaped key is read
        // decoded: 16 + 4 = 20: 5.
        assert_eq!(
            input(
                r#"{"model":"m","messages":[{"name":{"a":[1e400,{"b":null}]},"cont\u0065nt":"abcd"}]}"#
            ),
            Ok((5, false))
        );
        // A lone surrogate inside a value is skipped or borrowed as it
        // stands: 16 + 6 = 22: 6.
        assert_eq!(
            input(r#"{"model":"m","messages":[{"content":"\ud800","x":"\udc00"}]}"#),
            Ok((6, false))
        );
        // `messages` of any other type is no array.
        for messages in [
            "{}",
            r#"{"a":[1]}"#,
            "null",
            "true",
            "3",
            "-2",
            "2.5",
            r#""x""#,
        ] {
            assert_eq!(
                input(&format!(r#"{{"model":"m","messages":{messages}}}"#)),
                Err(RequestError::MissingMessages.to_string()),
                "{messages}"
            );
        }
        // What no longer passes uncounted, read in place: a number past
        // `f64` or a string with a lone surrogate escape as `messages` or
        // as a message, and a lone surrogate in a message's key. (Inside a
        // message's values, skipped or borrowed, both still pass.)
        for body in [
            r#"{"model":"m","messages":1e400}"#,
            r#"{"model":"m","messages":[1e400]}"#,
            r#"{"model":"m","messages":"\ud800"}"#,
            r#"{"model":"m","messages":["\ud800"]}"#,
            r#"{"model":"m","messages":[{"\ud800":1}]}"#,
        ] {
            assert!(
                input(body).is_err_and(|e| e.contains("not valid JSON")),
                "{body}"
            );
        }
    }

    #[test]
    fn rejects_bodies_without_messages_or_model() {
        assert_eq!(
            read_json(serde_json::json!({"model": "m"})).err(),
            Some(RequestError::MissingMessages)
        );
        assert_eq!(
            read_json(serde_json::json!({"messages": []})).err(),
            Some(RequestError::MissingModel)
        );
        assert_eq!(
            read_json(serde_json::json!({"model": null, "messages": []})).err(),
            Some(RequestError::MissingModel)
        );
        assert_eq!(
            read_json(serde_json::json!({"model": 3, "messages": []})).err(),
            Some(RequestError::WrongType {
                field: "model",
                expected: "a string"
            })
        );
        assert_eq!(
            read_json(serde_json::json!([1])).err(),
            Some(RequestError::NotObject)
        );
        assert!(matches!(
            read(Bytes::from_static(b"{\"model\":")),
            Err(RequestError::NotJson(_))
        ));
        // Two `model`s would let the gateway rewrite one and the provider
        // read the other: refused.
        assert!(matches!(
            read(Bytes::from_static(
                br#"{"model":"a","model":"b","messages":[]}"#
            )),
            Err(RequestError::NotJson(_))
        ));
    }

    #[test]
    fn fields_a_lenient_provider_would_coerce_are_refused() {
        let base = || serde_json::json!({"model": "m", "messages": []});
        for (field, value, expected) in [
            ("stream", serde_json::json!(1), "a boolean"),
            ("stream", serde_json::json!(0), "a boolean"),
            ("stream", serde_json::json!("true"), "a boolean"),
            ("stream", serde_json::json!({}), "a boolean"),
            ("stream_options", serde_json::json!("yes"), "an object"),
            ("n", serde_json::json!("2"), "a positive integer"),
            ("n", serde_json::json!(2.0), "a positive integer"),
            ("n", serde_json::json!(0), "a positive integer"),
            ("n", serde_json::json!(-1), "a positive integer"),
            (
                "max_tokens",
                serde_json::json!("100"),
                "a non-negative integer",
            ),
            (
                "max_tokens",
                serde_json::json!(1e2),
                "a non-negative integer",
            ),
            (
                "max_completion_tokens",
                serde_json::json!(-5),
                "a non-negative integer",
            ),
            (
                "max_completion_tokens",
                serde_json::json!(true),
                "a non-negative integer",
            ),
            (
                "parallel_tool_calls",
                serde_json::json!("true"),
                "a boolean",
            ),
            ("model", serde_json::json!({"id": "m"}), "a string"),
        ] {
            let mut body = base();
            body[field] = value.clone();
            let error = read_json(body).err();
            assert_eq!(
                error,
                Some(RequestError::WrongType { field, expected }),
                "{field}: {value}"
            );
            let error = error.unwrap();
            assert_eq!((error.code(), error.param()), ("invalid_type", Some(field)));
        }
        let mut body = base();
        body["stream"] = serde_json::json!(true);
        body["stream_options"] = serde_json::json!({"include_usage": "true"});
        assert_eq!(
            read_json(body).err(),
            Some(RequestError::WrongType {
                field: "stream_options.include_usage",
                expected: "a boolean"
            })
        );
        // `null` means absent; the right types read as ever.
        let mut body = base();
        for field in [
            "stream",
            "stream_options",
            "n",
            "max_tokens",
            "parallel_tool_calls",
        ] {
            body[field] = serde_json::Value::Null;
        }
        let (r, _) = read_json(body).unwrap();
        assert!(!r.stream && !r.include_usage);
        let mut body = base();
        body["stream"] = serde_json::json!(true);
        body["n"] = serde_json::json!(2);
        body["max_completion_tokens"] = serde_json::json!(0);
        body["stream_options"] = serde_json::json!({"include_usage": null});
        let (r, _) = read_json(body).unwrap();
        assert!(r.stream && !r.include_usage);
        assert_eq!(r.max_output_tokens, Some(0));
    }

    #[test]
    fn the_upstream_body_splices_the_model_and_usage_into_the_raw_bytes() {
        let raw = r#" { "messages" : [{"role":"user","content":"hi \"there\""}], "model" : "client-model", "stream" : true , "extra": {"keep": [1, 2]} } "#;
        let (_, request) = read(Bytes::from_static(raw.as_bytes())).unwrap();
        let body = upstream_body(&request, "target \"model\"");
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["model"], "target \"model\"");
        assert_eq!(json["stream_options"]["include_usage"], true);
        assert_eq!(json["extra"]["keep"], serde_json::json!([1, 2]));
        assert_eq!(json["messages"][0]["content"], "hi \"there\"");
        // Everything but the edits is the client's bytes, untouched.
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.starts_with(
            r#" { "messages" : [{"role":"user","content":"hi \"there\""}], "model" : "#
        ));

        // The client's own stream options are kept, usage forced on.
        let raw = r#"{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":1},"messages":[]}"#;
        let (_, request) = read(Bytes::from_static(raw.as_bytes())).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&upstream_body(&request, "t")).unwrap();
        assert_eq!(
            json["stream_options"],
            serde_json::json!({"include_usage": true, "x": 1})
        );

        // `stream_options: null` is replaced, not doubled.
        let raw = r#"{"model":"m","stream":true,"stream_options":null,"messages":[]}"#;
        let (_, request) = read(Bytes::from_static(raw.as_bytes())).unwrap();
        let body = upstream_body(&request, "t");
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"model":"t","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#
        );

        // Not a stream: only the model changes.
        let raw = r#"{"model":"m","messages":[]}"#;
        let (_, request) = read(Bytes::from_static(raw.as_bytes())).unwrap();
        assert_eq!(
            &upstream_body(&request, "t")[..],
            br#"{"model":"t","messages":[]}"#
        );
    }
}
