//! A validating JSON skimmer for `chat.completion.chunk` data.
//!
//! It walks one JSON text once, validates all of it and keeps only what a
//! [`Chunk`](crate::dialect::Chunk) needs. It accepts and rejects exactly what the
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
//!
//! Speed comes from doing less, not from cleverness: strings are run through
//! eight bytes at a time, finding quotes, backslashes and control bytes in one
//! pass (as serde_json's own scanner does; `memchr2` would need a second pass
//! for control bytes, and its call costs more than most keys are long); keys
//! under eight bytes are matched as one word; the common path is inlined into
//! [`skim`] so the position stays in a register.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::ops::Range;

use crate::Usage;

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
    /// Which choices the chunk carries, and which of them it finishes.
    pub(crate) choices: ChoiceSet,
}

/// The most choices tracked one by one: OpenAI's own limit on `n`. Two
/// words per stream, whatever the input.
pub(crate) const MAX_TRACKED_CHOICES: u64 = 128;

/// Choices by index (a choice without a readable `index` is known by its
/// position in `choices`): which appeared and which finished. An index at
/// or past [`MAX_TRACKED_CHOICES`] is not tracked one by one; once one
/// appeared, a stream holds open until its end marker, since no finish
/// reason can be known to be its last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ChoiceSet {
    appeared: u128,
    finished: u128,
    untracked: bool,
}

impl ChoiceSet {
    /// Notes a choice, finished or not.
    #[inline(always)]
    fn note(&mut self, index: u64, finished: bool) {
        if index < MAX_TRACKED_CHOICES {
            let bit = 1u128 << index;
            self.appeared |= bit;
            if finished {
                self.finished |= bit;
            }
        } else {
            self.untracked = true;
        }
    }

    /// Adds what a later chunk says; a finished choice stays finished.
    #[inline(always)]
    pub(crate) fn add(&mut self, chunk: ChoiceSet) {
        self.appeared |= chunk.appeared;
        self.finished |= chunk.finished;
        self.untracked |= chunk.untracked;
    }

    /// Whether a choice that appeared has not finished (or one is not
    /// tracked): the answer is not whole yet.
    #[inline(always)]
    pub(crate) fn open(&self) -> bool {
        self.untracked || self.appeared & !self.finished != 0
    }
}

/// Skims one JSON text. Allocates only to decode an escaped `id`, `model` or
/// kept `finish_reason`, or for skipped values nested over 128 levels deep.
/// The stream reads resume after a shared prefix; this whole read is the
/// reference the tests compare them with.
#[cfg(test)]
pub(crate) fn skim(text: &[u8]) -> Result<Skim<'_>> {
    let mut skimmer = Skimmer::new(text, 0);
    let mut out = Skim::default();
    let mut fields = skimmer.open::<ChunkFields>()?;
    skimmer.chunk_fields(&mut fields, &mut out, &mut None)?;
    skimmer.end(out)
}

/// The longest prefix a [`ChunkPrefix`] keeps: a chunk's fields before
/// `choices` are its id, model, timestamps and fingerprint, well under this.
const MAX_PREFIX_LEN: usize = 512;

/// What [`skim_next`] keeps of a stream's last valid chunk: its text up to
/// the value of the top-level `choices`, and what that text said.
///
/// The chunks of one stream repeat their id, object, created, model and
/// fingerprint byte for byte, and most providers write them before
/// `choices`. A chunk that starts with the same bytes leaves the skimmer in
/// the same state at the same offset (the walk is a function of the bytes
/// read), so the skim resumes there: the repeated text is compared, not
/// walked again, and nothing it accepts or rejects changes.
#[derive(Debug, Default)]
pub(crate) struct ChunkPrefix {
    /// The prefix (empty until a chunk was read whole, then at most
    /// `MAX_PREFIX_LEN`), then the template's bytes: one allocation per
    /// stream for both.
    text: Vec<u8>,
    /// The prefix's length in `text`.
    len: usize,
    /// The top-level fields seen in `text` (`choices` among them).
    seen: u32,
    /// Whether `text` set a truthy `error`.
    error: bool,
    /// The `usage` `text` gave, if any.
    usage: Option<Usage>,
    /// The last chunk after the prefix, but for the string that carried
    /// its output.
    template: Template,
}

/// The longest head plus tail a [`Template`] keeps (a usual chunk's are
/// 60 to 100 bytes).
const MAX_TEMPLATE_LEN: usize = 160;

/// Templates missed in a row after which a stream stops keeping them: its
/// chunks differ in more than one string (a per-chunk `obfuscation`
/// field, say), and keeping each would only cost.
const TEMPLATE_MISSES: u8 = 8;

/// A stream's chunks after their shared prefix mostly differ only in the
/// text of one string: `[{"index":0,"delta":{"content":"` and
/// `"},"finish_reason":null}]}` stay, the token between them changes. The
/// walk is a function of the bytes read, and a valid skipped string leaves
/// it where it was whatever the string says; so a chunk made of the same
/// head, any valid non-empty string and the same tail reads as the chunk
/// the template was taken from. Its output is the same (a non-empty
/// string is output); a template is only taken from a chunk whose read
/// kept no text of its own (no finish reason, no identity after the
/// prefix), so nothing read borrows from the template's chunk.
#[derive(Debug, Default)]
struct Template {
    /// The head's length, up to and with the string's opening quote; the
    /// tail (from its closing quote to the end of the chunk) follows it.
    /// Both are kept in [`ChunkPrefix::text`] after the prefix; no tail
    /// means no template.
    head_len: usize,
    tail_len: usize,
    /// The read of the chunk it was taken from.
    error: bool,
    usage: Option<Usage>,
    choices: ChoiceSet,
    /// Chunks in a row that did not fit.
    misses: u8,
}

impl Template {
    /// The read of `text` (whose prefix ends at `from`) when it fits the
    /// template kept in `bytes`.
    #[inline]
    fn read<'t>(&self, bytes: &[u8], text: &'t [u8], from: usize) -> Option<Skim<'t>> {
        let head = bytes.get(..self.head_len)?;
        let tail = bytes.get(self.head_len..self.head_len + self.tail_len)?;
        if !text.get(from..)?.starts_with(head) {
            return None;
        }
        let open = from + head.len();
        let mut skimmer = Skimmer::new(text, open);
        skimmer.string(false).ok()?;
        // The closing quote is the tail's first byte; an empty string
        // carries no output.
        let closing = skimmer.pos - 1;
        if closing == open || text.get(closing..)? != tail {
            return None;
        }
        Some(Skim {
            error: self.error,
            usage: self.usage,
            output: true,
            choices: self.choices,
            ..Skim::default()
        })
    }
}

impl ChunkPrefix {
    /// Whether a template is kept.
    #[cfg(test)]
    pub(crate) fn has_template(&self) -> bool {
        self.template.tail_len > 0
    }

    /// Takes `text` as the template when its read (`out`, resumed after
    /// the prefix) qualifies; `at` is where its output string lies.
    fn keep_template(&mut self, text: &[u8], out: &Skim<'_>, at: Option<(usize, usize)>) {
        let Some((open, end)) = at else {
            return;
        };
        let qualifies = out.output
            && out.finish_reason.is_none()
            && out.id.is_none()
            && out.model.is_none()
            && out.created.is_none();
        let (Some(head), Some(tail)) = (text.get(self.len..=open), text.get(end - 1..)) else {
            return;
        };
        if !qualifies
            || head.len() + tail.len() > MAX_TEMPLATE_LEN
            || self.template.misses >= TEMPLATE_MISSES
        {
            return;
        }
        self.text.truncate(self.len);
        self.text.extend_from_slice(head);
        self.text.extend_from_slice(tail);
        self.template = Template {
            head_len: head.len(),
            tail_len: tail.len(),
            error: out.error,
            usage: out.usage,
            choices: out.choices,
            misses: self.template.misses,
        };
    }
}

/// Where a chunk's `choices` value starts, and what came before it.
#[derive(Clone, Copy)]
struct Mark {
    at: usize,
    seen: u32,
    error: bool,
    usage: Option<Usage>,
}

/// Skims one chunk of a stream as [`skim`] does (the same acceptance, the
/// same finish reason, usage, error and output), given the stream's
/// `prefix`. When the chunk starts with the prefix of the last valid chunk,
/// its `id`, `model` and `created` are those of that chunk and read as
/// `None` here (the caller already has them).
pub(crate) fn skim_next<'t>(text: &'t [u8], prefix: &mut ChunkPrefix) -> Result<Skim<'t>> {
    let (kept, template) = prefix.text.split_at(prefix.len.min(prefix.text.len()));
    if !kept.is_empty() && text.starts_with(kept) {
        if prefix.template.tail_len > 0 {
            if let Some(out) = prefix.template.read(template, text, prefix.len) {
                prefix.template.misses = 0;
                return Ok(out);
            }
            prefix.template.misses += 1;
            if prefix.template.misses >= TEMPLATE_MISSES {
                prefix.template.tail_len = 0;
            }
        }
        let mut skimmer = Skimmer::new(text, prefix.len);
        let mut out = Skim {
            error: prefix.error,
            usage: prefix.usage,
            ..Skim::default()
        };
        // The state `open` and `next` left when they returned `choices`.
        let mut fields = Record::<ChunkFields> {
            object: true,
            done: false,
            started: true,
            seen: prefix.seen,
            fields: PhantomData,
        };
        skimmer.choices(&mut out)?;
        skimmer.chunk_fields(&mut fields, &mut out, &mut None)?;
        let out = skimmer.end(out)?;
        prefix.keep_template(text, &out, skimmer.output_at);
        return Ok(out);
    }
    let mut skimmer = Skimmer::new(text, 0);
    let mut out = Skim::default();
    let mut mark = None;
    let mut fields = skimmer.open::<ChunkFields>()?;
    skimmer.chunk_fields(&mut fields, &mut out, &mut mark)?;
    let out = skimmer.end(out)?;
    // Kept only from a valid chunk: the caller has its identity.
    if let Some(mark) = mark
        && let Some(kept) = text.get(..mark.at)
    {
        prefix.text.clear();
        // Room for a template too, in the same allocation.
        prefix.text.reserve(kept.len() + MAX_TEMPLATE_LEN);
        prefix.text.extend_from_slice(kept);
        prefix.len = kept.len();
        prefix.template = Template::default();
        prefix.seen = mark.seen;
        prefix.error = mark.error;
        prefix.usage = mark.usage;
    } else {
        // A valid chunk with no prefix to keep (no `choices`, or one far
        // in, or the array form) gave the caller its identity: the next
        // chunk must not read as having the older prefix's.
        prefix.text.clear();
        prefix.len = 0;
        prefix.template = Template::default();
    }
    Ok(out)
}

/// The fields a read struct knows, numbered in declaration order (which is
/// also the order of its array form).
trait Fields {
    /// How many fields the struct has.
    const COUNT: usize;

    /// The field a key names, if any.
    fn named(key: &[u8]) -> Option<usize>;

    /// The field a key shorter than eight bytes names, given as [`word`].
    fn short(key: u64) -> Option<usize>;

    /// Fields (as bits) that serde's reading does not know: read in the
    /// object form only (numbered from `COUNT` on), and never refused for
    /// repeating, so that reading them changes nothing serde accepts.
    const EXTRA: u32 = 0;
}

/// Up to eight bytes of a key as a little-endian word, zero-padded. Keys hold
/// no NUL bytes (control bytes are invalid in strings), so a word names one
/// key of fewer than eight bytes.
const fn word(key: &[u8]) -> u64 {
    let mut out = 0;
    let mut i = 0;
    while i < key.len() && i < 8 {
        out |= (key[i] as u64) << (8 * i);
        i += 1;
    }
    out
}

/// Names a key through [`Fields::short`] when it is short enough.
fn short_named<F: Fields>(key: &[u8]) -> Option<usize> {
    if key.len() < 8 {
        F::short(word(key))
    } else {
        None
    }
}

/// A decoded escaped key longer than this is no field.
const MAX_FIELD_LEN: usize = 24;

struct ChunkFields;

impl ChunkFields {
    const ID: usize = 0;
    const MODEL: usize = 1;
    const CREATED: usize = 2;
    const ERROR: usize = 3;
    const USAGE: usize = 4;
}

impl Fields for ChunkFields {
    const COUNT: usize = 6;

    fn named(key: &[u8]) -> Option<usize> {
        short_named::<Self>(key)
    }

    #[inline]
    fn short(key: u64) -> Option<usize> {
        const ID: u64 = word(b"id");
        const MODEL: u64 = word(b"model");
        const CREATED: u64 = word(b"created");
        const ERROR: u64 = word(b"error");
        const USAGE: u64 = word(b"usage");
        const CHOICES: u64 = word(b"choices");
        match key {
            ID => Some(Self::ID),
            MODEL => Some(Self::MODEL),
            CREATED => Some(Self::CREATED),
            ERROR => Some(Self::ERROR),
            USAGE => Some(Self::USAGE),
            CHOICES => Some(5),
            _ => None,
        }
    }
}

struct UsageFields;

impl UsageFields {
    const PROMPT_TOKENS: usize = 0;
}

impl Fields for UsageFields {
    const COUNT: usize = 2;

    fn named(key: &[u8]) -> Option<usize> {
        match key {
            b"prompt_tokens" => Some(Self::PROMPT_TOKENS),
            b"completion_tokens" => Some(1),
            _ => None,
        }
    }

    #[inline]
    fn short(_: u64) -> Option<usize> {
        None
    }
}

struct ChoiceFields;

impl ChoiceFields {
    const DELTA: usize = 0;
    const FINISH_REASON: usize = 1;
    /// Not one of serde's fields: read leniently (see [`Fields::EXTRA`]).
    const INDEX: usize = 2;
}

impl Fields for ChoiceFields {
    const COUNT: usize = 2;
    const EXTRA: u32 = 1 << Self::INDEX;

    fn named(key: &[u8]) -> Option<usize> {
        match key {
            b"finish_reason" => Some(Self::FINISH_REASON),
            _ => short_named::<Self>(key),
        }
    }

    #[inline]
    fn short(key: u64) -> Option<usize> {
        const DELTA: u64 = word(b"delta");
        const INDEX: u64 = word(b"index");
        match key {
            DELTA => Some(Self::DELTA),
            INDEX => Some(Self::INDEX),
            _ => None,
        }
    }
}

/// A choice's `index` when it is a plain non-negative integer literal.
#[inline(always)]
fn index_of(raw: &[u8]) -> Option<u64> {
    if raw.is_empty() || raw.len() > 19 || (raw.len() > 1 && raw[0] == b'0') {
        return None;
    }
    raw.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0'))
    })
}

struct DeltaFields;

impl Fields for DeltaFields {
    const COUNT: usize = 5;

    fn named(key: &[u8]) -> Option<usize> {
        match key {
            b"tool_calls" => Some(1),
            b"reasoning_content" => Some(3),
            b"reasoning" => Some(4),
            _ => short_named::<Self>(key),
        }
    }

    #[inline]
    fn short(key: u64) -> Option<usize> {
        const CONTENT: u64 = word(b"content");
        const REFUSAL: u64 = word(b"refusal");
        match key {
            CONTENT => Some(0),
            REFUSAL => Some(2),
            _ => None,
        }
    }
}

/// What a whole `chat.completion` says, as the answer check keeps it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct CompletionSkim<'a> {
    /// Top-level `id`, when it is a string.
    pub(crate) id: Option<&'a str>,
    /// Top-level `model`.
    pub(crate) model: Option<&'a str>,
    /// Top-level `usage`.
    pub(crate) usage: Option<Usage>,
    /// The first choice's `finish_reason`.
    pub(crate) finish_reason: Option<&'a str>,
}

/// Reads a whole completion of the shape providers write, or says `None`
/// for anything else: text that is not UTF-8, not JSON or not an answer, and
/// JSON whose reading takes serde's exact rules (a kept string with
/// escapes, a repeated or array-form field, a `choices` that does not start
/// with an object, a `finish_reason` or token count of another type). The
/// caller then reads the body with serde, so an answer read here is one
/// serde accepts with the same facts, and every other body is judged by
/// serde alone (`differential` checks both on generated and mutated
/// completions).
pub(crate) fn skim_completion(text: &[u8]) -> Option<CompletionSkim<'_>> {
    // With the whole text valid UTF-8, no key or skipped value can fail
    // serde's reading on that account, and a string kept is cut from it
    // (at its quotes) rather than checked again.
    let whole = std::str::from_utf8(text).ok()?;
    Skimmer::new(text, 0).completion(whole).ok()
}

/// What the request read needs of a chat request of the usual shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestSkim {
    /// The `model` string, quotes included (its text has no escapes).
    pub(crate) model: Range<usize>,
    /// `stream` (`false` when absent or `null`).
    pub(crate) stream: bool,
    /// The prompt's size as the estimate counts it: 16 per message, and
    /// the raw length of each message's string `content` and `tool_calls`.
    pub(crate) text_bytes: u64,
    /// `max_completion_tokens`, or else `max_tokens`.
    pub(crate) max_output_tokens: Option<u64>,
}

/// The top-level fields of a chat request other than `model`, `messages`,
/// `stream`, `max_tokens` and `max_completion_tokens` that its reading
/// judges: a request with one of them is read by serde.
const JUDGED_REQUEST_FIELDS: [&[u8]; 8] = [
    b"tools",
    b"functions",
    b"response_format",
    b"stream_options",
    b"parallel_tool_calls",
    b"n",
    b"reasoning_effort",
    b"reasoning",
];

/// Reads a chat request of the usual shape, or says `None` for anything
/// else: text that is not UTF-8 or not JSON, a key with escapes, a
/// repeated field, a `model` that is not a string without escapes, a
/// `stream` that is not `true`, `false` or `null`, a `max_tokens` or
/// `max_completion_tokens` that is not `null` or an integer `u64` holds, a
/// `messages` that is not an array of objects, a message whose `content`
/// is an array, and any other field the request read judges
/// ([`JUDGED_REQUEST_FIELDS`]).
/// Other fields (`temperature`, `user`, ...) are skipped and validated as
/// serde skips them. The caller then reads the body with serde, so a
/// request read here is one serde reads the same (`differential` checks
/// both on generated and mutated requests); serde's reading of the usual
/// request was about 3,000 instructions.
pub(crate) fn skim_request(text: &[u8]) -> Option<RequestSkim> {
    // The whole text valid UTF-8: no key or skipped value can fail serde's
    // reading on that account.
    std::str::from_utf8(text).ok()?;
    let mut s = Skimmer::new(text, 0);
    s.expect(b'{').ok()?;
    let (mut model, mut stream, mut text_bytes) = (None, None, None);
    // Each `Some` once read: `Some(None)` for `null`.
    let (mut max_tokens, mut max_completion_tokens) = (None, None);
    loop {
        let key = s.plain_key()?;
        match key {
            b"model" if model.is_none() => {
                if s.ws()? != b'"' {
                    return None;
                }
                let start = s.pos;
                s.pos += 1;
                if s.string(false).ok()? {
                    return None;
                }
                model = Some(start..s.pos);
            }
            b"stream" if stream.is_none() => {
                let value = match s.ws()? {
                    b't' => s.literal(b"true").map(|()| true),
                    b'f' => s.literal(b"false").map(|()| false),
                    b'n' => s.literal(b"null").map(|()| false),
                    _ => return None,
                };
                stream = Some(value.ok()?);
            }
            b"messages" if text_bytes.is_none() => text_bytes = Some(s.messages()?),
            b"max_tokens" if max_tokens.is_none() => max_tokens = Some(s.optional_u64().ok()?),
            b"max_completion_tokens" if max_completion_tokens.is_none() => {
                max_completion_tokens = Some(s.optional_u64().ok()?);
            }
            b"model" | b"stream" | b"messages" | b"max_tokens" | b"max_completion_tokens" => {
                return None;
            }
            judged if JUDGED_REQUEST_FIELDS.contains(&judged) => return None,
            _ => s.skip_value().ok()?,
        }
        if !s.more(b'}')? {
            break;
        }
    }
    // Nothing but whitespace after the object.
    if s.ws().is_some() {
        return None;
    }
    Some(RequestSkim {
        model: model?,
        stream: stream.unwrap_or(false),
        text_bytes: text_bytes?,
        max_output_tokens: max_completion_tokens.flatten().or(max_tokens.flatten()),
    })
}

impl<'a> Skimmer<'a> {
    /// `"key":` (after whitespace) of a key without escapes; `None` for
    /// one with escapes (serde would decode it) or no key at all.
    fn plain_key(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"').ok()?;
        let start = self.pos;
        if self.string(false).ok()? {
            return None;
        }
        let key = self.text.get(start..self.pos - 1)?;
        self.expect(b':').ok()?;
        Some(key)
    }

    /// A request's `messages`, tallied as [`RequestSkim::text_bytes`]
    /// says; `None` past what [`skim_request`] reads.
    fn messages(&mut self) -> Option<u64> {
        self.expect(b'[').ok()?;
        let mut text_bytes = 0u64;
        if self.ws()? == b']' {
            self.pos += 1;
            return Some(0);
        }
        loop {
            text_bytes += 16;
            self.expect(b'{').ok()?;
            let (mut content, mut tool_calls, mut repeated) = (None, None, false);
            if self.ws()? == b'}' {
                self.pos += 1;
            } else {
                loop {
                    match self.plain_key()? {
                        b"content" => {
                            let raw = self.raw_value().ok()?;
                            let counted = match raw.first() {
                                Some(b'"') => raw.len() as u64 - 2,
                                Some(b'[') => return None,
                                _ => 0,
                            };
                            repeated |= content.replace(counted).is_some();
                        }
                        b"tool_calls" => {
                            let raw = self.raw_value().ok()?;
                            repeated |= tool_calls.replace(raw.len() as u64).is_some();
                        }
                        _ => self.skip_value().ok()?,
                    }
                    if !self.more(b'}')? {
                        break;
                    }
                }
            }
            // A message with a repeated field counts as framing only.
            if !repeated {
                text_bytes += content.unwrap_or(0) + tool_calls.unwrap_or(0);
            }
            if !self.more(b']')? {
                return Some(text_bytes);
            }
        }
    }

    /// After a member or an element: `Some(true)` past a comma (another
    /// comes), `Some(false)` past `close`, `None` for anything else.
    fn more(&mut self, close: u8) -> Option<bool> {
        let next = self.ws()?;
        if next != b',' && next != close {
            return None;
        }
        self.pos += 1;
        Some(next == b',')
    }
}

/// A whole answer's first choice: only its `finish_reason` is read.
struct FirstChoiceFields;

impl Fields for FirstChoiceFields {
    const COUNT: usize = 1;

    fn named(key: &[u8]) -> Option<usize> {
        (key == b"finish_reason").then_some(0)
    }

    #[inline]
    fn short(_: u64) -> Option<usize> {
        None
    }
}

impl<'a> Skimmer<'a> {
    /// A whole completion, `whole` its text; see [`skim_completion`].
    fn completion(&mut self, whole: &'a str) -> Result<CompletionSkim<'a>> {
        let mut out = CompletionSkim::default();
        let mut answered = false;
        // A chunk's fields: a completion's and `created`, which serde's
        // reading of a completion does not know and only skips (a repeated
        // one, refused here, goes to serde).
        let mut fields = self.open::<ChunkFields>()?;
        if !fields.object {
            return Err(Invalid);
        }
        while let Some(index) = fields.next(self)? {
            match index {
                ChunkFields::ID => {
                    // Any value is allowed; only a string names the answer.
                    out.id = match self.ws() {
                        Some(b'"') => Some(self.plain_str(whole)?),
                        _ => {
                            self.skip_value()?;
                            None
                        }
                    };
                }
                ChunkFields::MODEL => {
                    out.model = if self.null()? {
                        None
                    } else {
                        Some(self.plain_str(whole)?)
                    };
                }
                ChunkFields::CREATED => self.skip_value()?,
                // Any error but `null` makes this no answer: serde's to say.
                ChunkFields::ERROR if !self.null()? => return Err(Invalid),
                ChunkFields::ERROR => {}
                ChunkFields::USAGE => out.usage = self.whole_usage()?,
                _ => {
                    out.finish_reason = self.first_reason(whole)?;
                    answered = true;
                }
            }
        }
        match self.ws() {
            None if answered => Ok(out),
            _ => Err(Invalid),
        }
    }

    /// A string the check keeps: borrowed from `whole` (the text, valid
    /// UTF-8), so one without escapes.
    #[inline(always)]
    fn plain_str(&mut self, whole: &'a str) -> Result<&'a str> {
        self.expect(b'"')?;
        let start = self.pos;
        if self.string(true)? {
            return Err(Invalid);
        }
        // Cut at ASCII quotes: always on a character boundary.
        whole.get(start..self.pos - 1).ok_or(Invalid)
    }

    /// A whole answer's `usage`: null, or an object of plain counts.
    fn whole_usage(&mut self) -> Result<Option<Usage>> {
        if self.null()? {
            return Ok(None);
        }
        let mut fields = self.open::<UsageFields>()?;
        if !fields.object {
            return Err(Invalid);
        }
        let (mut input, mut output) = (0, 0);
        while let Some(index) = fields.next(self)? {
            let count = match self.integer()? {
                (false, count) => count,
                (true, _) => return Err(Invalid),
            };
            if index == UsageFields::PROMPT_TOKENS {
                input = count;
            } else {
                output = count;
            }
        }
        Ok(Some(Usage::new(input, output)))
    }

    /// `choices`: a list that starts with an object, whose `finish_reason`
    /// is read; the other choices are only skipped.
    fn first_reason(&mut self, whole: &'a str) -> Result<Option<&'a str>> {
        self.expect(b'[')?;
        let mut fields = self.open::<FirstChoiceFields>()?;
        if !fields.object {
            return Err(Invalid);
        }
        let mut reason = None;
        while fields.next(self)?.is_some() {
            reason = if self.null()? {
                None
            } else {
                Some(self.plain_str(whole)?)
            };
        }
        loop {
            match self.ws() {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_value()?;
                }
                Some(b']') => {
                    self.pos += 1;
                    return Ok(reason);
                }
                _ => return Err(Invalid),
            }
        }
    }
}

/// A position in one JSON text. Everything on the common path is inlined
/// into [`skim`] and the out-of-line helpers take and return the position by
/// value, so the position lives in a register rather than memory.
struct Skimmer<'a> {
    text: &'a [u8],
    pos: usize,
    /// Where the first string that carried output lies (from its opening
    /// quote to past its closing one): what a [`Template`] varies.
    output_at: Option<(usize, usize)>,
}

impl<'a> Skimmer<'a> {
    #[inline(always)]
    fn new(text: &'a [u8], pos: usize) -> Self {
        Self {
            text,
            pos,
            output_at: None,
        }
    }

    /// Skips JSON whitespace and peeks at the next byte.
    #[inline(always)]
    fn ws(&mut self) -> Option<u8> {
        while let Some(&byte) = self.text.get(self.pos) {
            if !matches!(byte, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(byte);
            }
            self.pos += 1;
        }
        None
    }

    /// Expects `byte` after optional whitespace.
    #[inline(always)]
    fn expect(&mut self, byte: u8) -> Result<()> {
        if self.ws() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Invalid)
        }
    }

    #[inline(always)]
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
    #[inline(always)]
    fn null(&mut self) -> Result<bool> {
        if self.ws() == Some(b'n') {
            self.literal(b"null")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Reads the top-level fields of a chunk, from wherever `fields` is.
    /// When `mark` is given and empty, the object form's `choices` marks
    /// where a [`ChunkPrefix`] may end.
    #[inline(always)]
    fn chunk_fields(
        &mut self,
        fields: &mut Record<ChunkFields>,
        out: &mut Skim<'a>,
        mark: &mut Option<Mark>,
    ) -> Result<()> {
        while let Some(index) = fields.next(self)? {
            match index {
                ChunkFields::ID => out.id = self.optional_str()?,
                ChunkFields::MODEL => out.model = self.optional_str()?,
                ChunkFields::CREATED => out.created = self.optional_i64()?,
                ChunkFields::ERROR => out.error = !self.null()? && truthy(self.raw_value()?),
                ChunkFields::USAGE => out.usage = self.usage()?,
                _ => {
                    if fields.object && mark.is_none() && self.pos <= MAX_PREFIX_LEN {
                        *mark = Some(Mark {
                            at: self.pos,
                            seen: fields.seen,
                            error: out.error,
                            usage: out.usage,
                        });
                    }
                    self.choices(out)?
                }
            }
        }
        Ok(())
    }

    /// Ends a chunk: nothing but whitespace may follow it.
    #[inline(always)]
    fn end(&mut self, out: Skim<'a>) -> Result<Skim<'a>> {
        match self.ws() {
            None => Ok(out),
            Some(_) => Err(Invalid),
        }
    }

    #[inline(always)]
    fn usage(&mut self) -> Result<Option<Usage>> {
        if self.null()? {
            return Ok(None);
        }
        let mut usage = Usage::default();
        let mut fields = self.open::<UsageFields>()?;
        while let Some(index) = fields.next(self)? {
            let count = self.optional_u64()?.unwrap_or(0);
            if index == UsageFields::PROMPT_TOKENS {
                usage.input_tokens = count;
            } else {
                usage.output_tokens = count;
            }
        }
        Ok(Some(usage))
    }

    #[inline(always)]
    fn choices(&mut self, out: &mut Skim<'a>) -> Result<()> {
        if self.null()? {
            return Ok(());
        }
        self.expect(b'[')?;
        if self.ws() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        let mut position = 0;
        loop {
            self.choice(out, position)?;
            position += 1;
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

    /// Reads the choice at `position` in `choices`.
    #[inline(always)]
    fn choice(&mut self, out: &mut Skim<'a>, position: u64) -> Result<()> {
        let mut fields = self.open::<ChoiceFields>()?;
        let mut choice_index = None;
        let mut finishes = false;
        while let Some(index) = fields.next(self)? {
            if index == ChoiceFields::INDEX {
                // Any value serde would skip is valid here; only a plain
                // integer names the choice (a repeat: the last one).
                choice_index = index_of(self.raw_value()?);
            } else if index == ChoiceFields::DELTA {
                if !self.null()? {
                    let mut fields = self.open::<DeltaFields>()?;
                    while fields.next(self)?.is_some() {
                        if !self.null()? {
                            // Raw text, as the serde reading compared it:
                            // `" "` or `[ ]` carry output, `""` and `[]` not.
                            let raw = self.raw_value()?;
                            let carries = !matches!(raw, b"\"\"" | b"[]");
                            if carries && self.output_at.is_none() && raw.first() == Some(&b'"') {
                                self.output_at = Some((self.pos - raw.len(), self.pos));
                            }
                            out.output |= carries;
                        }
                    }
                }
            } else if out.finish_reason.is_none() {
                out.finish_reason = self.optional_str()?;
                finishes = out.finish_reason.is_some();
            } else if !self.null()? {
                // Validated like a kept one, but never decoded.
                self.expect(b'"')?;
                self.string(true)?;
                finishes = true;
            }
        }
        out.choices.note(choice_index.unwrap_or(position), finishes);
        Ok(())
    }

    /// Opens a struct, read the way serde's derive reads one: an object
    /// whose known keys may each appear once (others are skipped), or an
    /// array of at most `F::COUNT` fields in declaration order.
    #[inline(always)]
    fn open<F: Fields>(&mut self) -> Result<Record<F>> {
        let object = match self.ws() {
            Some(b'{') => true,
            Some(b'[') => false,
            _ => return Err(Invalid),
        };
        self.pos += 1;
        let done = self.ws() == Some(if object { b'}' } else { b']' });
        if done {
            self.pos += 1;
        }
        Ok(Record {
            object,
            done,
            started: false,
            seen: 0,
            fields: PhantomData,
        })
    }

    /// Reads a key after its opening quote and names the field it is.
    #[inline(always)]
    fn key<F: Fields>(&mut self) -> Result<Option<usize>> {
        if let Some(key) = self.short_string() {
            return Ok(F::short(key));
        }
        let start = self.pos;
        let escaped = self.string(true)?;
        let raw = self.text.get(start..self.pos - 1).ok_or(Invalid)?;
        if escaped {
            escaped_key::<F>(raw)
        } else {
            Ok(F::named(raw))
        }
    }

    /// A string field serde decodes: null, or a string borrowed unless it has
    /// escapes.
    #[inline(always)]
    fn optional_str(&mut self) -> Result<Option<Cow<'a, str>>> {
        if self.null()? {
            return Ok(None);
        }
        self.expect(b'"')?;
        let start = self.pos;
        let escaped = self.string(true)?;
        let raw = self.text.get(start..self.pos - 1).ok_or(Invalid)?;
        if escaped {
            decoded(raw).map(Some)
        } else {
            Ok(Some(Cow::Borrowed(
                std::str::from_utf8(raw).map_err(|_| Invalid)?,
            )))
        }
    }

    /// An integer the way serde_json reads one into an integer type: the sign
    /// and magnitude of a literal without fraction or exponent that fits `u64`.
    #[inline(always)]
    fn integer(&mut self) -> Result<(bool, u64)> {
        let negative = self.ws() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let mut magnitude = match self.text.get(self.pos) {
            Some(b'0') => 0,
            Some(&digit @ b'1'..=b'9') => u64::from(digit - b'0'),
            _ => return Err(Invalid),
        };
        self.pos += 1;
        while let Some(&digit @ b'0'..=b'9') = self.text.get(self.pos) {
            if magnitude == 0 {
                // A leading zero.
                return Err(Invalid);
            }
            // More than `u64` holds: serde reads a float, which no integer
            // type accepts.
            magnitude = magnitude
                .checked_mul(10)
                .and_then(|m| m.checked_add(u64::from(digit - b'0')))
                .ok_or(Invalid)?;
            self.pos += 1;
        }
        if matches!(self.text.get(self.pos), Some(b'.' | b'e' | b'E')) {
            return Err(Invalid);
        }
        Ok((negative, magnitude))
    }

    #[inline(always)]
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

    #[inline(always)]
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
    #[inline(always)]
    fn raw_value(&mut self) -> Result<&'a [u8]> {
        self.ws();
        let start = self.pos;
        self.skip_value()?;
        self.text.get(start..self.pos).ok_or(Invalid)
    }

    /// Skips and validates one value of any kind.
    #[inline(always)]
    fn skip_value(&mut self) -> Result<()> {
        match self.ws() {
            Some(b'"') => {
                self.pos += 1;
                self.string(false).map(drop)
            }
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => {
                self.pos = skip_number(self.text, self.pos)?;
                Ok(())
            }
            _ => {
                self.pos = skip_value(self.text, self.pos)?;
                Ok(())
            }
        }
    }

    /// Runs through a string after its opening quote, to just past the
    /// closing one; says whether it had escapes. `strict` rejects unpaired
    /// surrogate escapes, as serde does in strings it decodes.
    #[inline(always)]
    fn string(&mut self, strict: bool) -> Result<bool> {
        // Plain text eight bytes at a time; escapes, control bytes and the
        // last few bytes of the text go the long way.
        while let Some(next) = self.text.get(self.pos..self.pos + 8) {
            let mut word = [0; 8];
            word.copy_from_slice(next);
            let word = u64::from_le_bytes(word);
            let found = special_bytes(word);
            if found == 0 {
                self.pos += 8;
                continue;
            }
            let len = found.trailing_zeros() / 8;
            if (word >> (8 * len)) as u8 == b'"' {
                self.pos += len as usize + 1;
                return Ok(false);
            }
            break;
        }
        let (end, escaped) = long_string(self.text, self.pos, strict)?;
        self.pos = end;
        Ok(escaped)
    }

    /// Passes a string that closes within the next eight bytes, without
    /// escapes, and returns its bytes as a [`word`]; most keys are such.
    #[inline(always)]
    fn short_string(&mut self) -> Option<u64> {
        let next: [u8; 8] = self.text.get(self.pos..self.pos + 8)?.try_into().ok()?;
        let next = u64::from_le_bytes(next);
        let found = special_bytes(next);
        if found == 0 {
            return None;
        }
        let len = found.trailing_zeros() / 8;
        if (next >> (8 * len)) as u8 != b'"' {
            return None;
        }
        self.pos += len as usize + 1;
        Some(next & ((1 << (8 * len)) - 1))
    }
}

/// An open struct being read field by field; see [`Skimmer::open`].
struct Record<F> {
    object: bool,
    done: bool,
    started: bool,
    /// Fields seen so far (object form) or given so far (array form).
    seen: u32,
    fields: PhantomData<F>,
}

impl<F: Fields> Record<F> {
    /// The next field the struct gives, its value up next; `None` once the
    /// struct has ended. Skips unknown keys; rejects repeated ones.
    #[inline(always)]
    fn next(&mut self, s: &mut Skimmer<'_>) -> Result<Option<usize>> {
        if self.done {
            return Ok(None);
        }
        loop {
            if self.started {
                match s.ws() {
                    Some(b',') => s.pos += 1,
                    Some(b'}') if self.object => {
                        s.pos += 1;
                        self.done = true;
                        return Ok(None);
                    }
                    Some(b']') if !self.object => {
                        s.pos += 1;
                        self.done = true;
                        return Ok(None);
                    }
                    _ => return Err(Invalid),
                }
            }
            self.started = true;
            if !self.object {
                // The array form: fields in order, no more than the struct has.
                let index = self.seen as usize;
                if index == F::COUNT {
                    return Err(Invalid);
                }
                self.seen += 1;
                return Ok(Some(index));
            }
            s.expect(b'"')?;
            let key = s.key::<F>()?;
            s.expect(b':')?;
            if let Some(index) = key {
                let bit = 1 << index;
                if self.seen & bit & !F::EXTRA != 0 {
                    return Err(Invalid);
                }
                self.seen |= bit;
                return Ok(Some(index));
            }
            s.skip_value()?;
        }
    }
}

/// Names the field an escaped key is: serde matches the decoded key.
#[cold]
fn escaped_key<F: Fields>(raw: &[u8]) -> Result<Option<usize>> {
    // Decode into a small stack buffer; a longer key is no field.
    let mut buf = [0u8; MAX_FIELD_LEN];
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
        F::named(buf.get(..len).ok_or(Invalid)?)
    } else {
        None
    })
}

/// Decodes the body of a validated string with escapes.
#[cold]
fn decoded<'a>(raw: &[u8]) -> Result<Cow<'a, str>> {
    let mut decoded = Vec::with_capacity(raw.len());
    unescape(raw, |bytes| decoded.extend_from_slice(bytes))?;
    String::from_utf8(decoded)
        .map(Cow::Owned)
        .map_err(|_| Invalid)
}

/// Skips and validates one value at `pos` (after whitespace), returning the
/// position past it. Arrays and objects are walked iteratively, so no input
/// can exhaust the call stack.
fn skip_value(text: &[u8], pos: usize) -> Result<usize> {
    let mut s = Skimmer::new(text, pos);
    let mut open = Nesting::default();
    loop {
        // A value is expected here.
        match s.ws() {
            Some(b'[') => {
                s.pos += 1;
                if s.ws() == Some(b']') {
                    s.pos += 1;
                } else {
                    open.push(false);
                    continue;
                }
            }
            Some(b'{') => {
                s.pos += 1;
                if s.ws() == Some(b'}') {
                    s.pos += 1;
                } else {
                    s.member_key()?;
                    open.push(true);
                    continue;
                }
            }
            Some(b'"') => {
                s.pos += 1;
                s.string(false)?;
            }
            Some(b'n') => s.literal(b"null")?,
            Some(b't') => s.literal(b"true")?,
            Some(b'f') => s.literal(b"false")?,
            Some(b'-' | b'0'..=b'9') => s.pos = skip_number(text, s.pos)?,
            _ => return Err(Invalid),
        }
        // A value ended: close what it ends, or go on after a comma.
        loop {
            let Some(object) = open.top() else {
                return Ok(s.pos);
            };
            match s.ws() {
                Some(b',') => {
                    s.pos += 1;
                    if object {
                        s.member_key()?;
                    }
                    break;
                }
                Some(b']') if !object => s.pos += 1,
                Some(b'}') if object => s.pos += 1,
                _ => return Err(Invalid),
            }
            open.pop();
        }
    }
}

impl Skimmer<'_> {
    /// Skips `"key":` of a skipped object.
    #[inline(always)]
    fn member_key(&mut self) -> Result<()> {
        self.expect(b'"')?;
        self.string(false)?;
        self.expect(b':')
    }
}

/// Skips a number per the JSON grammar (no range check, like serde's
/// `ignore_value`), returning the position past it.
fn skip_number(text: &[u8], mut pos: usize) -> Result<usize> {
    let digits = |pos: usize| {
        text.get(pos..)
            .unwrap_or_default()
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    if text.get(pos) == Some(&b'-') {
        pos += 1;
    }
    match text.get(pos) {
        Some(b'0') => {
            pos += 1;
            if matches!(text.get(pos), Some(b'0'..=b'9')) {
                return Err(Invalid);
            }
        }
        Some(b'1'..=b'9') => pos += digits(pos),
        _ => return Err(Invalid),
    }
    if text.get(pos) == Some(&b'.') {
        pos += 1;
        match digits(pos) {
            0 => return Err(Invalid),
            count => pos += count,
        }
    }
    if matches!(text.get(pos), Some(b'e' | b'E')) {
        pos += 1;
        if matches!(text.get(pos), Some(b'+' | b'-')) {
            pos += 1;
        }
        match digits(pos) {
            0 => return Err(Invalid),
            count => pos += count,
        }
    }
    Ok(pos)
}

/// Runs through a string from `pos` (after its opening quote): `(end,
/// escaped)`, `end` past the closing quote.
fn long_string(text: &[u8], mut pos: usize, strict: bool) -> Result<(usize, bool)> {
    let mut escaped = false;
    loop {
        pos += find_special(text.get(pos..).unwrap_or_default()).ok_or(Invalid)?;
        match text.get(pos) {
            Some(b'"') => return Ok((pos + 1, escaped)),
            Some(b'\\') => {
                escaped = true;
                pos = escape(text, pos + 1, strict)?;
            }
            // A raw control byte.
            _ => return Err(Invalid),
        }
    }
}

/// Validates one escape after its backslash, returning the position past it.
fn escape(text: &[u8], pos: usize, strict: bool) -> Result<usize> {
    let hex = |pos: usize| hex4(text.get(pos..pos + 4).ok_or(Invalid)?);
    match text.get(pos) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(pos + 1),
        Some(b'u') => {
            let unit = hex(pos + 1)?;
            if !strict || !is_surrogate(unit) {
                return Ok(pos + 5);
            }
            // A high surrogate must be followed by an escaped low one.
            if is_low_surrogate(unit)
                || text.get(pos + 5..pos + 7) != Some(b"\\u")
                || !is_low_surrogate(hex(pos + 7)?)
            {
                return Err(Invalid);
            }
            Ok(pos + 11)
        }
        _ => Err(Invalid),
    }
}

fn hex4(digits: &[u8]) -> Result<u32> {
    digits.iter().try_fold(0, |acc, &digit| {
        let value = char::from(digit).to_digit(16).ok_or(Invalid)?;
        Ok(acc << 4 | value)
    })
}

fn is_surrogate(unit: u32) -> bool {
    (0xD800..=0xDFFF).contains(&unit)
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

/// Flags (with its high bit) each quote, backslash or control byte of eight
/// bytes read little-endian, by the zero-byte trick: a borrow only ever runs
/// upward from a real match, so the lowest flag is exact.
#[inline(always)]
fn special_bytes(word: u64) -> u64 {
    const ONES: u64 = u64::MAX / 255;
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    ((word.wrapping_sub(ONES * 0x20) & !word)
        | (quote.wrapping_sub(ONES) & !quote)
        | (backslash.wrapping_sub(ONES) & !backslash))
        & (ONES << 7)
}

/// The index of the first quote, backslash or control byte.
#[inline]
fn find_special(bytes: &[u8]) -> Option<usize> {
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let found = special_bytes(u64::from_le_bytes(word));
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
    use crate::Usage;

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

    const CONTENT: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732968000,"model":"gpt-4o-mini","system_fingerprint":"fp","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}"#;
    const FINISH: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732968000,"model":"gpt-4o-mini","system_fingerprint":"fp","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}"#;
    const USAGE: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732968000,"model":"gpt-4o-mini","system_fingerprint":"fp","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}"#;

    #[test]
    fn a_repeated_prefix_is_compared_not_walked() {
        let mut prefix = ChunkPrefix::default();
        // The first chunk is read whole and keeps its text up to `choices`.
        let first = skim_next(CONTENT.as_bytes(), &mut prefix).unwrap();
        assert_eq!(first, ok(CONTENT));
        let kept = CONTENT.find("[{").unwrap();
        assert_eq!(prefix.text, CONTENT.as_bytes()[..kept]);
        // The next ones resume there: what follows is read as before, the
        // identity the caller already has is not read again.
        let finish = skim_next(FINISH.as_bytes(), &mut prefix).unwrap();
        assert_eq!(finish.finish_reason.as_deref(), Some("stop"));
        assert!(!finish.output);
        assert_eq!(
            (finish.id, finish.model, finish.created),
            (None, None, None)
        );
        let usage = skim_next(USAGE.as_bytes(), &mut prefix).unwrap();
        assert_eq!(usage.usage, Some(Usage::new(9, 2)));
        let content = skim_next(CONTENT.as_bytes(), &mut prefix).unwrap();
        assert!(content.output);
    }

    #[test]
    fn after_the_prefix_a_chunk_is_checked_as_ever() {
        let mut prefix = ChunkPrefix::default();
        skim_next(CONTENT.as_bytes(), &mut prefix).unwrap();
        let kept = prefix.text.clone();
        for broken in [
            // Cut short, trailing text, a repeated read field, a wrong
            // type, a bad escape.
            CONTENT[..CONTENT.len() - 1].to_owned(),
            format!("{CONTENT} x"),
            CONTENT.replace("]}", r#"],"id":"again"}"#),
            CONTENT.replace(r#""finish_reason":null"#, r#""finish_reason":7"#),
            CONTENT.replace(r#"{"content":" tok"}"#, r#"{"content":" tok\x"}"#),
        ] {
            assert!(broken.as_bytes().starts_with(&kept));
            assert_eq!(
                skim_next(broken.as_bytes(), &mut prefix),
                Err(Invalid),
                "{broken}"
            );
            assert_eq!(skim(broken.as_bytes()), Err(Invalid), "{broken}");
        }
        // A rejected chunk leaves the prefix as it was.
        assert_eq!(prefix.text, kept);
    }

    #[test]
    fn a_changed_prefix_is_read_whole_and_kept() {
        let mut prefix = ChunkPrefix::default();
        skim_next(CONTENT.as_bytes(), &mut prefix).unwrap();
        let other = CONTENT.replace("chatcmpl-1", "chatcmpl-2");
        let read = skim_next(other.as_bytes(), &mut prefix).unwrap();
        assert_eq!(read.id.as_deref(), Some("chatcmpl-2"));
        assert!(prefix.text.starts_with(br#"{"id":"chatcmpl-2""#));
        // An invalid first chunk keeps nothing; nor do the array form and
        // a prefix over the bound.
        let mut prefix = ChunkPrefix::default();
        assert!(skim_next(br#"{"id":"x","choices":[}"#, &mut prefix).is_err());
        assert!(prefix.text.is_empty());
        skim_next(br#"["x","m",1,null,null,[]]"#, &mut prefix).unwrap();
        assert!(prefix.text.is_empty());
        let long = format!(r#"{{"id":"{}","choices":[]}}"#, "x".repeat(MAX_PREFIX_LEN));
        skim_next(long.as_bytes(), &mut prefix).unwrap();
        assert!(prefix.text.is_empty());
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
        assert_eq!(got.usage, Some(Usage::new(3, 0)));
        assert_eq!(ok(r#"{"usage":null}"#).usage, None);
    }

    #[test]
    fn tracks_each_choice_by_index() {
        let mut stream = ChoiceSet::default();
        for (text, open) in [
            (r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#, true),
            (r#"{"choices":[{"index":1,"delta":{"content":"b"}}]}"#, true),
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                true,
            ),
            // A choice's finish stays; its later chunks reopen nothing.
            (r#"{"choices":[{"index":0,"delta":{}}]}"#, true),
            (
                r#"{"choices":[{"delta":{},"finish_reason":"length","index":1}]}"#,
                false,
            ),
        ] {
            stream.add(ok(text).choices);
            assert_eq!(stream.open(), open, "{text}");
        }
        // Several choices in one chunk; the finish reason read is still
        // the first, and every finish counts.
        let got = ok(
            r#"{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason":"length"}]}"#,
        );
        assert_eq!(got.finish_reason.as_deref(), Some("stop"));
        assert!(!got.choices.open());
        let got = ok(
            r#"{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"delta":{"content":"x"}}]}"#,
        );
        assert!(got.choices.open());
        // No readable index: known by position (so `n = 1` works as ever).
        assert!(
            !ok(r#"{"choices":[{"finish_reason":"stop"}]}"#)
                .choices
                .open()
        );
        assert!(
            !ok(r#"{"choices":[{"index":"0","finish_reason":"stop"}]}"#)
                .choices
                .open()
        );
        assert!(!ok(r#"["c",null,5,null,null,[[{},"stop"]]]"#).choices.open());
        // Past the bound a choice is not tracked: open until `[DONE]`.
        assert!(
            ok(r#"{"choices":[{"index":128,"finish_reason":"stop"}]}"#)
                .choices
                .open()
        );
        assert!(
            !ok(r#"{"choices":[{"index":127,"finish_reason":"stop"}]}"#)
                .choices
                .open()
        );
        // Reading `index` changes nothing serde accepts: any value, repeats.
        for text in [
            r#"{"choices":[{"index":1.5,"index":[1,{}],"index":null}]}"#,
            r#"{"choices":[{"index":-1,"finish_reason":null}]}"#,
            r#"{"choices":[{"index":99999999999999999999999}]}"#,
        ] {
            ok(text);
        }
        rejects(r#"{"choices":[{"index":01}]}"#);
        rejects(r#"["c",null,5,null,null,[[{},"stop",0]]]"#);
        assert_eq!(index_of(b"18446744073709551615"), None);
        assert_eq!(
            index_of(b"1844674407370955161"),
            Some(1_844_674_407_370_955_161)
        );
    }

    #[test]
    fn reads_structs_in_array_form_like_serde() {
        let got = ok(r#"["c",null,5,null,[1,2],[[{"content":"x"},"stop"]]]"#);
        assert_eq!(got.id.as_deref(), Some("c"));
        assert_eq!(got.created, Some(5));
        assert_eq!(got.usage, Some(Usage::new(1, 2)));
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
            Some(Usage::new(0, u64::MAX))
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
    fn field_names_match_by_word_and_by_name() {
        fn check<F: Fields>(names: &[&str]) {
            assert_eq!(F::COUNT, names.len());
            for (index, name) in names.iter().enumerate() {
                assert_eq!(F::named(name.as_bytes()), Some(index), "{name}");
                if name.len() < 8 {
                    assert_eq!(F::short(word(name.as_bytes())), Some(index), "{name}");
                }
                let longer = format!("{name}s");
                for miss in [&name[1..], &name[..name.len() - 1], longer.as_str()] {
                    assert_eq!(F::named(miss.as_bytes()), None, "{miss}");
                    if miss.len() < 8 {
                        assert_eq!(F::short(word(miss.as_bytes())), None, "{miss}");
                    }
                }
            }
        }
        check::<ChunkFields>(&["id", "model", "created", "error", "usage", "choices"]);
        check::<UsageFields>(&["prompt_tokens", "completion_tokens"]);
        check::<ChoiceFields>(&["delta", "finish_reason"]);
        check::<DeltaFields>(&[
            "content",
            "tool_calls",
            "refusal",
            "reasoning_content",
            "reasoning",
        ]);
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
