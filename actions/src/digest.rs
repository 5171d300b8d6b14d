//! The digest of a tool call's arguments: SHA-256 of their canonical JSON.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The SHA-256 digest of a call's arguments in canonical JSON.
///
/// A store keeps it with the claim, so the same action id resubmitted with
/// other arguments is refused ([`StoreError::ArgumentsDiffer`]) instead of
/// answered with the first call's result or run again.
///
/// Canonical JSON here: object keys sorted by their UTF-8 bytes, no
/// whitespace, strings escaped only where JSON requires (`"`, `\` and
/// control characters, as `\uXXXX`), numbers as `serde_json` prints them.
/// So two spellings of the same arguments (keys reordered, other spacing,
/// `\u0041` for `A`) have one digest, whatever order a `serde_json::Map`
/// keeps (with or without its `preserve_order` feature). Numbers are
/// compared as written: `1` and `1.0` differ, and so refuse rather than
/// replay.
///
/// [`StoreError::ArgumentsDiffer`]: super::StoreError::ArgumentsDiffer
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArgumentsDigest([u8; 32]);

impl ArgumentsDigest {
    /// The digest of `arguments`.
    pub fn of(arguments: &Value) -> Self {
        let mut hasher = Hashing(Sha256::new());
        canonical(&mut hasher, arguments);
        Self(hasher.0.finalize().into())
    }

    /// The digest's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Reads a digest from its 64 lowercase or uppercase hex digits, as
    /// [`Display`](fmt::Display) writes it; `None` for anything else.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let hex = hex.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
            let high = char::from(pair[0]).to_digit(16)?;
            let low = char::from(pair[1]).to_digit(16)?;
            // Two hex digits: at most 255.
            *byte = u8::try_from(high * 16 + low).ok()?;
        }
        Some(Self(bytes))
    }
}

impl fmt::Display for ArgumentsDigest {
    /// 64 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for ArgumentsDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ArgumentsDigest({self})")
    }
}

impl Serialize for ArgumentsDigest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ArgumentsDigest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let hex = String::deserialize(deserializer)?;
        Self::from_hex(&hex)
            .ok_or_else(|| serde::de::Error::custom("an arguments digest is 64 hex digits"))
    }
}

/// Feeds the hasher through `fmt::Write`, so numbers need no buffer.
struct Hashing(Sha256);

impl fmt::Write for Hashing {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.update(s.as_bytes());
        Ok(())
    }
}

/// Writes `value` as canonical JSON into the hasher.
fn canonical(out: &mut Hashing, value: &Value) {
    match value {
        Value::Null => out.0.update(b"null"),
        Value::Bool(true) => out.0.update(b"true"),
        Value::Bool(false) => out.0.update(b"false"),
        Value::Number(number) => {
            // Writing into the hasher cannot fail.
            let _ = fmt::Write::write_fmt(out, format_args!("{number}"));
        }
        Value::String(text) => string(out, text),
        Value::Array(items) => {
            out.0.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.0.update(b",");
                }
                canonical(out, item);
            }
            out.0.update(b"]");
        }
        Value::Object(map) => {
            // Sorted here, not by the map: `preserve_order` keeps insertion order.
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.0.update(b"{");
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.0.update(b",");
                }
                string(out, key);
                out.0.update(b":");
                canonical(out, item);
            }
            out.0.update(b"}");
        }
    }
}

/// A JSON string with the minimal escapes, so each string has one form.
fn string(out: &mut Hashing, text: &str) {
    out.0.update(b"\"");
    let mut plain = 0;
    for (i, c) in text.char_indices() {
        let escape: Option<&[u8]> = match c {
            '"' => Some(b"\\\""),
            '\\' => Some(b"\\\\"),
            _ => None,
        };
        // JSON's control characters are U+0000..U+001F (not DEL).
        if escape.is_none() && u32::from(c) >= 0x20 {
            continue;
        }
        out.0.update(&text.as_bytes()[plain..i]);
        match escape {
            Some(escape) => out.0.update(escape),
            None => {
                let _ = fmt::Write::write_fmt(out, format_args!("\\u{:04x}", u32::from(c)));
            }
        }
        plain = i + c.len_utf8();
    }
    out.0.update(&text.as_bytes()[plain..]);
    out.0.update(b"\"");
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn digest(json: &str) -> ArgumentsDigest {
        ArgumentsDigest::of(&serde_json::from_str(json).unwrap_or(Value::Null))
    }

    /// Two spellings of the same arguments have one digest; other
    /// arguments have another.
    #[test]
    fn the_digest_follows_the_arguments_not_their_spelling() {
        let a = digest(r#"{"amount":4200,"currency":"eur","meta":{"b":[1,2],"a":null}}"#);
        let b = digest(
            r#"{ "meta": { "a": null, "b": [1, 2] }, "currency": "\u0065ur", "amount": 4200 }"#,
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            digest(r#"{"amount":4300,"currency":"eur","meta":{"b":[1,2],"a":null}}"#)
        );
        assert_ne!(
            a,
            digest(r#"{"amount":4200,"currency":"eur","meta":{"b":[2,1],"a":null}}"#)
        );
        assert_ne!(digest(r#"{"a":"x\"y"}"#), digest(r#"{"a":"x\\y"}"#));
        assert_ne!(digest(r#"["a,b"]"#), digest(r#"["a","b"]"#));
        assert_ne!(digest("1"), digest("1.0"));
    }

    /// The digest is SHA-256 of the canonical text: pinned, so a change of
    /// canonical form (which would refuse every resubmission across an
    /// upgrade) is seen.
    #[test]
    fn the_canonical_form_is_pinned() {
        let value = json!({ "b": "é\n\u{7f}", "a": [true, false, null, -1.5] });
        let text = "{\"a\":[true,false,null,-1.5],\"b\":\"é\\u000a\u{7f}\"}";
        let expected: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        assert_eq!(ArgumentsDigest::of(&value).as_bytes(), &expected);
    }

    #[test]
    fn hex_round_trips_and_refuses_garbage() {
        let d = digest(r#"{"x":1}"#);
        let hex = d.to_string();
        assert_eq!(hex.len(), 64);
        assert_eq!(ArgumentsDigest::from_hex(&hex), Some(d));
        assert_eq!(ArgumentsDigest::from_hex(&hex.to_uppercase()), Some(d));
        assert_eq!(ArgumentsDigest::from_hex(&hex[1..]), None);
        assert_eq!(ArgumentsDigest::from_hex(&format!("g{}", &hex[1..])), None);
        assert_eq!(ArgumentsDigest::from_hex("é"), None);
    }
}
