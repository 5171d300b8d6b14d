//! A validating JSON skimmer for `chat.completion.chunk` data.
//!
//! It walks one JSON text once, validates all of it and keeps only what a
//! [`Chunk`](super::Chunk) needs. It accepts and rejects exactly what the
//! serde-derive reading it replaced did (the `oracle` test module keeps that
//! reading as the reference), because a stream's fate hangs on the answer:
//!
//! - The read fields have serde's types: `id`, `model` and `finish_reason`
//!   are strings or null, `created` an integer that fits `i64`, token counts
//!   integers that fit `u64`; `usage`, choices and deltas are objects (or, as
//!   serde reads any struct, arrays of their fields in declaration order);
//!   `choices` is an array or null. A read field given twice is an error.
//! - Strings serde decodes (keys of read objects, the three string fields)
//!   must pair their surrogate escapes; skipped strings need only four hex
//!   digits after `\u`. Control bytes are rejected in every string.
//! - Skipped values may nest without limit, as serde's `ignore_value` allows;
//!   the walk is iterative and only a nesting deeper than 128 levels spills
//!   its bookkeeping to the heap.
//!
//! The text must be valid UTF-8 (the SSE scanner guarantees it for event
//! data); strings that are borrowed are re-checked, so nothing unsound comes
//! of a violation, only an answer that may differ from serde's.

use std::borrow::Cow;

use super::Usage;

/// The text is not JSON, or not a chunk of the expected types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Invalid;

type Result<T> = std::result::Result<T, Invalid>;

/// What a chunk's JSON says, as far as a dialect cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Skim<'a> {
    /// Top-level `id`.
    pub(crate) id: Option<Cow<'a, str>>,
    /// Top-level `model`.
    pub(crate) model: Option<Cow<'a, str>>,
    /// Top-level `created`.
    pub(crate) created: Option<i64>,
    /// Whether top-level `error` is truthy.
    pub(crate) error: bool,
    /// Top-level `usage`, missing counts as zero.
    pub(crate) usage: Option<Usage>,
    /// Whether any choice's delta carries output.
    pub(crate) output: bool,
    /// The first non-null `finish_reason` among the choices.
    pub(crate) finish_reason: Option<Cow<'a, str>>,
}

/// Skims one JSON text. Allocates only to decode an escaped `id`, `model` or
/// kept `finish_reason`, or for skipped values nested over 128 levels deep.
pub(crate) fn skim(text: &[u8]) -> Result<Skim<'_>> {
    let mut skimmer = Skimmer { text, pos: 0 };
    let mut out = Skim::default();
    skimmer.chunk(&mut out)?;
    match skimmer.ws() {
        None => Ok(out),
        Some(_) => Err(Invalid),
    }
}

/// The fields each read struct knows, in declaration order (which is also
/// the order of the array form).
mod field {
    pub(super) const CHUNK: usize = 6;
    pub(super) const ID: usize = 0;
    pub(super) const MODEL: usize = 1;
    pub(super) const CREATED: usize = 2;
    pub(super) const ERROR: usize = 3;
    pub(super) const USAGE: usize = 4;
    pub(super) const CHOICES: usize = 5;

    pub(super) fn chunk(key: &[u8]) -> Option<usize> {
        match key {
            b"id" => Some(ID),
            b"model" => Some(MODEL),
            b"created" => Some(CREATED),
            b"error" => Some(ERROR),
            b"usage" => Some(USAGE),
            b"choices" => Some(CHOICES),
            _ => None,
        }
    }

    pub(super) const USAGE_FIELDS: usize = 2;
    pub(super) const PROMPT_TOKENS: usize = 0;

    pub(super) fn usage(key: &[u8]) -> Option<usize> {
        match key {
            b"prompt_tokens" => Some(PROMPT_TOKENS),
            b"completion_tokens" => Some(1),
            _ => None,
        }
    }

    pub(super) const CHOICE: usize = 2;
    pub(super) const DELTA: usize = 0;

    pub(super) fn choice(key: &[u8]) -> Option<usize> {
        match key {
            b"delta" => Some(DELTA),
            b"finish_reason" => Some(1),
            _ => None,
        }
    }

    pub(super) const DELTA_FIELDS: usize = 5;

    pub(super) fn delta(key: &[u8]) -> Option<usize> {
        match key {
            b"content" => Some(0),
            b"tool_calls" => Some(1),
            b"refusal" => Some(2),
            b"reasoning_content" => Some(3),
            b"reasoning" => Some(4),
            _ => None,
        }
    }

    /// Longer than every field name: a longer escaped key is never a field.
    pub(super) const MAX_LEN: usize = 24;
}

struct Skimmer<'a> {
    text: &'a [u8],
    pos: usize,
}

impl<'a> Skimmer<'a> {
    /// Skips JSON whitespace and peeks at the next byte.
    #[inline]
    fn ws(&mut self) -> Option<u8> {
        while let Some(&byte) = self.text.get(self.pos) {
            if !matches!(byte, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(byte);
            }
            self.pos += 1;
        }
        None
    }

    #[inline]
    fn next(&mut self) -> Result<u8> {
        let byte = *self.text.get(self.pos).ok_or(Invalid)?;
        self.pos += 1;
        Ok(byte)
    }

    /// Expects `byte` after optional whitespace.
    #[inline]
    fn expect(&mut self, byte: u8) -> Result<()> {
        if self.ws() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Invalid)
        }
    }

    #[inline]
    fn literal(&mut self, word: &[u8]) -> Result<()> {
        match self.text.get(self.pos..self.pos + word.len()) {
            Some(found) if found == word => {
                self.pos += word.len();
                Ok(())
            }
            _ => Err(Invalid),
        }
    }

    /// Reads `null` if it comes next (after whitespace).
    #[inline]
    fn null(&mut self) -> Result<bool> {
        if self.ws() == Some(b'n') {
            self.literal(b"null")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn chunk(&mut self, out: &mut Skim<'a>) -> Result<()> {
        self.record::<{ field::CHUNK }>(field::chunk, |s, index| match index {
            field::ID => {
                out.id = s.optional_str()?;
                Ok(())
            }
            field::MODEL => {
                out.model = s.optional_str()?;
                Ok(())
            }
            field::CREATED => {
                out.created = s.optional_i64()?;
                Ok(())
            }
            field::ERROR => {
                out.error = !s.null()? && truthy(s.raw_value()?);
                Ok(())
            }
            field::USAGE => {
                out.usage = s.usage()?;
                Ok(())
            }
            _ => s.choices(out),
        })
    }

    fn usage(&mut self) -> Result<Option<Usage>> {
        if self.null()? {
            return Ok(None);
        }
        let mut usage = Usage::default();
        self.record::<{ field::USAGE_FIELDS }>(field::usage, |s, index| {
            let count = s.optional_u64()?.unwrap_or(0);
            if index == field::PROMPT_TOKENS {
                usage.prompt_tokens = count;
            } else {
                usage.completion_tokens = count;
            }
            Ok(())
        })?;
        Ok(Some(usage))
    }

    fn choices(&mut self, out: &mut Skim<'a>) -> Result<()> {
        if self.null()? {
            return Ok(());
        }
        self.expect(b'[')?;
        if self.ws() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.choice(out)?;
            match self.ws() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(Invalid),
            }
        }
    }

    fn choice(&mut self, out: &mut Skim<'a>) -> Result<()> {
        self.record::<{ field::CHOICE }>(field::choice, |s, index| {
            if index == field::DELTA {
                if !s.null()? {
                    s.record::<{ field::DELTA_FIELDS }>(field::delta, |s, _| {
                        if !s.null()? {
                            // Raw text, as the serde reading compared it:
                            // `" "` or `[ ]` carry output, `""` and `[]` not.
                            let raw = s.raw_value()?;
                            out.output |= !matches!(raw, b"\"\"" | b"[]");
                        }
                        Ok(())
                    })?;
                }
            } else if out.finish_reason.is_none() {
                out.finish_reason = s.optional_str()?;
            } else if !s.null()? {
                // Validated like a kept one, but never decoded.
                s.expect(b'"')?;
                s.string(true)?;
            }
            Ok(())
        })
    }

    /// Reads a struct the way serde's derive does: an object whose known keys
    /// may each appear once (others are skipped), or an array holding at most
    /// `N` fields in declaration order.
    #[inline]
    fn record<const N: usize>(
        &mut self,
        field: impl Fn(&[u8]) -> Option<usize> + Copy,
        mut value: impl FnMut(&mut Self, usize) -> Result<()>,
    ) -> Result<()> {
        match self.ws() {
            Some(b'{') => {
                self.pos += 1;
                if self.ws() == Some(b'}') {
                    self.pos += 1;
                    return Ok(());
                }
                let mut seen = 0u32;
                loop {
                    self.expect(b'"')?;
                    let index = self.key(field)?;
                    self.expect(b':')?;
                    match index {
                        Some(index) => {
                            let bit = 1 << index;
                            if seen & bit != 0 {
                                return Err(Invalid);
                            }
                            seen |= bit;
                            value(self, index)?;
                        }
                        None => self.skip_value()?,
                    }
                    match self.ws() {
                        Some(b',') => self.pos += 1,
                        Some(b'}') => {
                            self.pos += 1;
                            return Ok(());
                        }
                        _ => return Err(Invalid),
                    }
                }
            }
            Some(b'[') => {
                self.pos += 1;
                if self.ws() == Some(b']') {
                    self.pos += 1;
                    return Ok(());
                }
                for index in 0..N {
                    value(self, index)?;
                    match self.ws() {
                        Some(b',') => self.pos += 1,
                        Some(b']') => {
                            self.pos += 1;
                            return Ok(());
                        }
                        _ => return Err(Invalid),
                    }
                }
                // More elements than the struct has fields.
                Err(Invalid)
            }
            _ => Err(Invalid),
        }
    }

    /// Reads a key after its opening quote and names the field it is.
    #[inline]
    fn key(&mut self, field: impl Fn(&[u8]) -> Option<usize>) -> Result<Option<usize>> {
        let start = self.pos;
        let escaped = self.string(true)?;
        let raw = self.text.get(start..self.pos - 1).ok_or(Invalid)?;
        if !escaped {
            return Ok(field(raw));
        }
        // serde matches the decoded key; decode into a small stack buffer.
        let mut buf = [0u8; field::MAX_LEN];
        let mut len = 0;
        let mut fits = true;
        unescape(raw, |bytes| {
            match buf.get_mut(len..len + bytes.len()) {
                Some(slot) if fits => slot.copy_from_slice(bytes),
                _ => fits = false,
            }
            len += bytes.len();
        })?;
        Ok(if fits {
            field(buf.get(..len).ok_or(Invalid)?)
        } else {
            None
        })
    }

    /// A string field serde decodes: null, or a string borrowed unless it has
    /// escapes.
    fn optional_str(&mut self) -> Result<Option<Cow<'a, str>>> {
        if self.null()? {
            return Ok(None);
        }
        self.expect(b'"')?;
        let start = self.pos;
        let escaped = self.string(true)?;
        let raw = self.text.get(start..self.pos - 1).ok_or(Invalid)?;
        if escaped {
            let mut decoded = Vec::with_capacity(raw.len());
            unescape(raw, |bytes| decoded.extend_from_slice(bytes))?;
            Ok(Some(Cow::Owned(
                String::from_utf8(decoded).map_err(|_| Invalid)?,
            )))
        } else {
            Ok(Some(Cow::Borrowed(
                std::str::from_utf8(raw).map_err(|_| Invalid)?,
            )))
        }
    }

    /// An integer the way serde_json reads one into an integer type: the sign
    /// and magnitude of a literal without fraction or exponent that fits `u64`.
    fn integer(&mut self) -> Result<(bool, u64)> {
        let negative = self.ws() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let mut magnitude = match self.next()? {
            b'0' => 0,
            digit @ b'1'..=b'9' => u64::from(digit - b'0'),
            _ => return Err(Invalid),
        };
        if magnitude == 0 {
            if matches!(self.text.get(self.pos), Some(b'0'..=b'9')) {
                return Err(Invalid);
            }
        } else {
            while let Some(&digit @ b'0'..=b'9') = self.text.get(self.pos) {
                self.pos += 1;
                magnitude = magnitude
                    .checked_mul(10)
                    .and_then(|m| m.checked_add(u64::from(digit - b'0')))
                    // serde reads it as a float, which no integer accepts.
                    .ok_or(Invalid)?;
            }
        }
        if matches!(self.text.get(self.pos), Some(b'.' | b'e' | b'E')) {
            return Err(Invalid);
        }
        Ok((negative, magnitude))
    }

    fn optional_i64(&mut self) -> Result<Option<i64>> {
        if self.null()? {
            return Ok(None);
        }
        match self.integer()? {
            (false, magnitude) => i64::try_from(magnitude).map(Some).map_err(|_| Invalid),
            // serde_json reads `-0` as a float.
            (true, 0) => Err(Invalid),
            (true, magnitude) => 0i64
                .checked_sub_unsigned(magnitude)
                .map(Some)
                .ok_or(Invalid),
        }
    }

    fn optional_u64(&mut self) -> Result<Option<u64>> {
        if self.null()? {
            return Ok(None);
        }
        match self.integer()? {
            (false, magnitude) => Ok(Some(magnitude)),
            (true, _) => Err(Invalid),
        }
    }

    /// Skips one value and returns its raw text.
    #[inline]
    fn raw_value(&mut self) -> Result<&'a [u8]> {
        self.ws();
        let start = self.pos;
        self.skip_value()?;
        self.text.get(start..self.pos).ok_or(Invalid)
    }

    /// Skips and validates one value of any kind.
    #[inline]
    fn skip_value(&mut self) -> Result<()> {
        match self.ws() {
            Some(b'"') => {
                self.pos += 1;
                self.string(false).map(drop)
            }
            Some(b'{' | b'[') => self.skip_nested(),
            _ => self.skip_scalar(),
        }
    }

    /// Skips a literal or a number.
    fn skip_scalar(&mut self) -> Result<()> {
        match self.ws() {
            Some(b'n') => self.literal(b"null"),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'-' | b'0'..=b'9') => self.skip_number(),
            _ => Err(Invalid),
        }
    }

    /// Skips a number per the JSON grammar (no range check, like serde's).
    fn skip_number(&mut self) -> Result<()> {
        if self.text.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        match self.next()? {
            b'0' => {
                if matches!(self.text.get(self.pos), Some(b'0'..=b'9')) {
                    return Err(Invalid);
                }
            }
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return Err(Invalid),
        }
        if self.text.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(Invalid);
            }
        }
        if matches!(self.text.get(self.pos), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.text.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(Invalid);
            }
        }
        Ok(())
    }

    /// Skips ASCII digits and counts them.
    #[inline]
    fn digits(&mut self) -> usize {
        let rest = self.text.get(self.pos..).unwrap_or_default();
        let count = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        self.pos += count;
        count
    }

    /// Skips an array or object, iteratively so that no input can exhaust
    /// the call stack.
    fn skip_nested(&mut self) -> Result<()> {
        let mut open = Nesting::default();
        loop {
            // A value is expected here.
            match self.ws() {
                Some(b'[') => {
                    self.pos += 1;
                    if self.ws() == Some(b']') {
                        self.pos += 1;
                    } else {
                        open.push(false);
                        continue;
                    }
                }
                Some(b'{') => {
                    self.pos += 1;
                    if self.ws() == Some(b'}') {
                        self.pos += 1;
                    } else {
                        self.member_key()?;
                        open.push(true);
                        continue;
                    }
                }
                Some(b'"') => {
                    self.pos += 1;
                    self.string(false)?;
                }
                _ => self.skip_scalar()?,
            }
            // A value ended: close what it ends, or go on after a comma.
            loop {
                let Some(object) = open.top() else {
                    return Ok(());
                };
                match self.ws() {
                    Some(b',') => {
                        self.pos += 1;
                        if object {
                            self.member_key()?;
                        }
                        break;
                    }
                    Some(b']') if !object => self.pos += 1,
                    Some(b'}') if object => self.pos += 1,
                    _ => return Err(Invalid),
                }
                open.pop();
            }
        }
    }

    /// Skips `"key":` of a skipped object.
    fn member_key(&mut self) -> Result<()> {
        self.expect(b'"')?;
        self.string(false)?;
        self.expect(b':')
    }

    /// Runs through a string after its opening quote, to just past the
    /// closing one; says whether it had escapes. `strict` rejects unpaired
    /// surrogate escapes, as serde does in strings it decodes.
    #[inline]
    fn string(&mut self, strict: bool) -> Result<bool> {
        let mut escaped = false;
        loop {
            let rest = self.text.get(self.pos..).unwrap_or_default();
            self.pos += find_special(rest).ok_or(Invalid)?;
            match self.next()? {
                b'"' => return Ok(escaped),
                b'\\' => {
                    escaped = true;
                    self.escape(strict)?;
                }
                // A raw control byte.
                _ => return Err(Invalid),
            }
        }
    }

    /// Validates one escape after its backslash.
    fn escape(&mut self, strict: bool) -> Result<()> {
        match self.next()? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(()),
            b'u' => {
                let unit = self.hex4()?;
                if strict {
                    if is_low_surrogate(unit) {
                        return Err(Invalid);
                    }
                    if is_high_surrogate(unit)
                        && (self.next()? != b'\\'
                            || self.next()? != b'u'
                            || !is_low_surrogate(self.hex4()?))
                    {
                        return Err(Invalid);
                    }
                }
                Ok(())
            }
            _ => Err(Invalid),
        }
    }

    fn hex4(&mut self) -> Result<u32> {
        let digits = self.text.get(self.pos..self.pos + 4).ok_or(Invalid)?;
        self.pos += 4;
        hex4(digits)
    }
}

fn hex4(digits: &[u8]) -> Result<u32> {
    digits.iter().try_fold(0, |acc, &digit| {
        let value = char::from(digit).to_digit(16).ok_or(Invalid)?;
        Ok(acc << 4 | value)
    })
}

fn is_high_surrogate(unit: u32) -> bool {
    (0xD800..=0xDBFF).contains(&unit)
}

fn is_low_surrogate(unit: u32) -> bool {
    (0xDC00..=0xDFFF).contains(&unit)
}

/// Whether a raw value is truthy the way the SDKs test `data.get("error")`.
fn truthy(raw: &[u8]) -> bool {
    !matches!(raw, b"null" | b"false" | b"\"\"" | b"0" | b"{}" | b"[]")
}

/// The index of the first quote, backslash or control byte: eight bytes at a
/// time, with the zero-byte trick (a borrow only ever runs upward from a
/// real match, so the lowest flagged byte is exact).
#[inline]
fn find_special(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let found = ((word.wrapping_sub(ONES * 0x20) & !word)
            | (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash))
            & HIGH;
        if found != 0 {
            return Some(offset + found.trailing_zeros() as usize / 8);
        }
        offset += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)
        .map(|at| offset + at)
}

/// Decodes the body of a validated string, handing `push` its pieces.
fn unescape(raw: &[u8], mut push: impl FnMut(&[u8])) -> Result<()> {
    let mut rest = raw;
    while let Some(at) = memchr::memchr(b'\\', rest) {
        push(rest.get(..at).ok_or(Invalid)?);
        let escape = *rest.get(at + 1).ok_or(Invalid)?;
        rest = rest.get(at + 2..).ok_or(Invalid)?;
        let byte = match escape {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => b'\x08',
            b'f' => b'\x0c',
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let mut code = hex4(rest.get(..4).ok_or(Invalid)?)?;
                rest = rest.get(4..).ok_or(Invalid)?;
                if is_high_surrogate(code) {
                    let low = match rest.get(..6) {
                        Some([b'\\', b'u', digits @ ..]) => hex4(digits)?,
                        _ => return Err(Invalid),
                    };
                    if !is_low_surrogate(low) {
                        return Err(Invalid);
                    }
                    rest = rest.get(6..).ok_or(Invalid)?;
                    code = 0x1_0000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                }
                let decoded = char::from_u32(code).ok_or(Invalid)?;
                push(decoded.encode_utf8(&mut [0; 4]).as_bytes());
                continue;
            }
            _ => return Err(Invalid),
        };
        push(&[byte]);
    }
    push(rest);
    Ok(())
}

/// Which open containers are objects, innermost last. 128 levels fit in a
/// word; deeper ones (hostile or absurd input) spill to the heap.
#[derive(Default)]
struct Nesting {
    depth: usize,
    shallow: u128,
    deep: Vec<bool>,
}

impl Nesting {
    fn push(&mut self, object: bool) {
        if self.depth < 128 {
            let bit = 1u128 << self.depth;
            if object {
                self.shallow |= bit;
            } else {
                self.shallow &= !bit;
            }
        } else {
            self.deep.push(object);
        }
        self.depth += 1;
    }

    fn top(&self) -> Option<bool> {
        let level = self.depth.checked_sub(1)?;
        if level < 128 {
            Some(self.shallow >> level & 1 == 1)
        } else {
            self.deep.last().copied()
        }
    }

    fn pop(&mut self) {
        if self.depth > 128 {
            self.deep.pop();
        }
        self.depth = self.depth.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Usage;

    fn ok(text: &str) -> Skim<'_> {
        skim(text.as_bytes()).unwrap_or_else(|_| panic!("rejected {text}"))
    }

    fn rejects(text: &str) {
        assert_eq!(skim(text.as_bytes()), Err(Invalid), "accepted {text}");
    }

    #[test]
    fn reads_a_content_chunk_borrowing_its_strings() {
        let got = ok(
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732968000,"model":"gpt-4o-mini","system_fingerprint":"fp","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}"#,
        );
        assert!(matches!(got.id, Some(Cow::Borrowed("chatcmpl-1"))));
        assert!(matches!(got.model, Some(Cow::Borrowed("gpt-4o-mini"))));
        assert_eq!(got.created, Some(1_732_968_000));
        assert!(got.output);
        assert!(!got.error);
        assert_eq!(got.finish_reason, None);
        assert_eq!(got.usage, None);
    }

    #[test]
    fn decodes_escaped_strings_and_keys() {
        let got = ok(
            r#"{"i\u0064":"a\"b\u00e9\ud83d\ude00","model":"m\/1","choices":[{"finish_reason":"st\u006fp"}]}"#,
        );
        assert!(matches!(got.id.as_ref(), Some(Cow::Owned(id)) if id == "a\"bé😀"));
        assert_eq!(got.model.as_deref(), Some("m/1"));
        assert_eq!(got.finish_reason.as_deref(), Some("stop"));
        // A decoded key longer than any field is just skipped.
        assert_eq!(
            ok(r#"{"\u0069ddddddddddddddddddddddddddddd":1}"#),
            Skim::default()
        );
    }

    #[test]
    fn output_and_error_follow_raw_text() {
        for (text, output) in [
            (r#"{"choices":[{"delta":{"content":""}}]}"#, false),
            (r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#, false),
            (r#"{"choices":[{"delta":{"tool_calls":[ ]}}]}"#, true),
            (r#"{"choices":[{"delta":{"reasoning":0}}]}"#, true),
            (
                r#"{"choices":[{"delta":{"refusal":null}},{"delta":{"content":"x"}}]}"#,
                true,
            ),
            (r#"{"choices":[{"delta":null}]}"#, false),
        ] {
            assert_eq!(ok(text).output, output, "{text}");
        }
        for (text, error) in [
            (r#"{"error":null}"#, false),
            (r#"{"error":false}"#, false),
            (r#"{"error":0}"#, false),
            (r#"{"error":""}"#, false),
            (r#"{"error":{}}"#, false),
            (r#"{"error":[]}"#, false),
            (r#"{"error":{ }}"#, true),
            (r#"{"error":-0}"#, true),
            (r#"{"error":"x"}"#, true),
        ] {
            assert_eq!(ok(text).error, error, "{text}");
        }
    }

    #[test]
    fn keeps_the_first_finish_reason_and_reads_usage() {
        let got = ok(
            r#"{"choices":[{"finish_reason":null},{"finish_reason":"length"},{"finish_reason":"st\u006fp"}],"usage":{"prompt_tokens":3,"total_tokens":9}}"#,
        );
        assert!(matches!(got.finish_reason, Some(Cow::Borrowed("length"))));
        assert_eq!(
            got.usage,
            Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 0
            })
        );
        assert_eq!(ok(r#"{"usage":null}"#).usage, None);
    }

    #[test]
    fn reads_structs_in_array_form_like_serde() {
        let got = ok(r#"["c",null,5,null,[1,2],[[{"content":"x"},"stop"]]]"#);
        assert_eq!(got.id.as_deref(), Some("c"));
        assert_eq!(got.created, Some(5));
        assert_eq!(
            got.usage,
            Some(Usage {
                prompt_tokens: 1,
                completion_tokens: 2
            })
        );
        assert!(got.output);
        assert_eq!(got.finish_reason.as_deref(), Some("stop"));
        assert_eq!(ok("[]"), Skim::default());
        rejects(r#"{"usage":[1,2,3]}"#);
        rejects(r#"["c",null,5,null,null,null,7]"#);
    }

    #[test]
    fn integers_follow_serde_ranges() {
        assert_eq!(
            ok(r#"{"created":-9223372036854775808}"#).created,
            Some(i64::MIN)
        );
        assert_eq!(
            ok(r#"{"created":9223372036854775807}"#).created,
            Some(i64::MAX)
        );
        assert_eq!(
            ok(r#"{"usage":{"completion_tokens":18446744073709551615}}"#).usage,
            Some(Usage {
                prompt_tokens: 0,
                completion_tokens: u64::MAX
            })
        );
        for text in [
            r#"{"created":9223372036854775808}"#,
            r#"{"created":-9223372036854775809}"#,
            r#"{"created":-0}"#,
            r#"{"created":1.0}"#,
            r#"{"created":1e3}"#,
            r#"{"created":01}"#,
            r#"{"created":"1"}"#,
            r#"{"usage":{"prompt_tokens":-1}}"#,
            r#"{"usage":{"prompt_tokens":18446744073709551616}}"#,
        ] {
            rejects(text);
        }
    }

    #[test]
    fn rejects_what_serde_rejects() {
        for text in [
            "",
            " ",
            "null",
            r#"{"id":1}"#,
            r#"{"id":"a","id":"b"}"#,
            r#"{"choices":{}}"#,
            r#"{"choices":[null]}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"x":[1,]}"#,
            r#"{"x":{"a":1,}}"#,
            r#"{"x":1,}"#,
            r#"{"x":01}"#,
            r#"{"x":1.}"#,
            r#"{"x":1e}"#,
            r#"{"x":-}"#,
            r#"{"x":nul}"#,
            r#"{"x":"\x"}"#,
            r#"{"x":"\u12"}"#,
            "{\"x\":\"\u{1}\"}",
            r#"{"id":"\ud800"}"#,
            r#"{"id":"\udc00"}"#,
            r#"{"id":"\ud800\u0041"}"#,
            r#"{"\ud800":1}"#,
            r#"{"x":[}"#,
            r#"{"x":{]}"#,
            r#"{} {}"#,
            r#"{"a" 1}"#,
        ] {
            rejects(text);
        }
        // Skipped strings and keys need only four hex digits after `\u`.
        assert_eq!(ok(r#"{"x":"\ud800","y":{"\udc00":[]}}"#), Skim::default());
    }

    #[test]
    fn deep_nesting_is_bounded_by_nothing_but_the_input() {
        let depth = 10_000;
        let open = "[".repeat(depth);
        rejects(&open);
        rejects(&format!("{{\"x\":{open}"));
        let closed = format!("{{\"x\":{open}{}}}", "]".repeat(depth));
        assert_eq!(ok(&closed), Skim::default());
        let mixed = format!(
            "{{\"x\":{}1{}}}",
            "{\"a\":[".repeat(depth),
            "]}".repeat(depth)
        );
        assert_eq!(ok(&mixed), Skim::default());
        let mismatched = format!("{{\"x\":{open}{}}}", "}".repeat(depth));
        rejects(&mismatched);
    }

    #[test]
    fn finds_special_bytes_at_every_offset() {
        for len in 0..24 {
            for at in 0..len {
                for special in [b'"', b'\\', 0x00, 0x1f] {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = special;
                    if at + 1 < len {
                        bytes[at + 1] = b'"';
                    }
                    assert_eq!(find_special(&bytes), Some(at), "{bytes:?}");
                }
                let mut high = vec![0xC3; len];
                high[at] = 0xA9;
                assert_eq!(find_special(&high), None);
            }
        }
    }
}
