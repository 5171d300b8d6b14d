//! Bounded, credential-free messages.
//!
//! Providers echo what they were sent: OpenAI's "Incorrect API key provided:
//! sk-...", proxies that dump the `Authorization` header, Gemini URLs with
//! `?key=AIza...`. Everything that reaches a [`Classification`] message, a log
//! line or the client goes through [`sanitize_message`] first.
//!
//! [`Classification`]: super::Classification

/// The longest message a classification keeps, in characters.
pub(crate) const MAX_MESSAGE_CHARS: usize = 512;

/// What a redacted credential is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// The longest provider code kept, in characters.
const MAX_CODE_CHARS: usize = 128;

/// How much of the raw text is looked at (bytes). Output is at most
/// `MAX_MESSAGE_CHARS` characters, so this only bounds work; the cut is made
/// at whitespace so no token is split before redaction.
const MAX_SCAN_BYTES: usize = 8 * 1024;

/// Credential prefixes that are redacted wherever a token starts with them
/// (OpenAI/Anthropic/DeepSeek `sk-`, Groq `gsk_`, xAI, Google `AIza`,
/// Hugging Face, Replicate, GitHub, GitLab, Fireworks, Perplexity, NVIDIA,
/// Cerebras).
const PREFIXES: &[&str] = &[
    "sk-",
    "sk_",
    "gsk_",
    "xai-",
    "AIza",
    "hf_",
    "r8_",
    "ghp_",
    "gho_",
    "ghs_",
    "github_pat_",
    "glpat-",
    "fw_",
    "pplx-",
    "nvapi-",
    "csk-",
];

/// Words after which the next few tokens are suspected credentials.
/// A word counts when it ends with one (`api-key`, `access_token`), so
/// "tokens" in "205351 tokens > 200000 maximum" does not.
const KEYWORDS: &[&str] = &[
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "credentials",
    "authorization",
];

fn is_keyword(lower: &str) -> bool {
    KEYWORDS.iter().any(|k| lower.ends_with(k))
}

/// How many tokens after a keyword are checked.
const KEYWORD_WINDOW: u8 = 3;

/// A run of letters and digits this long (with both) is taken for a key
/// (hex and base64 keys of Azure, Mistral, Together...). Anthropic request
/// ids (`req_` + 24) stay readable.
const LONG_RUN: usize = 28;

/// Sanitizes a provider- or transport-supplied message for logs, metrics and
/// clients:
///
/// - credentials are replaced by `[REDACTED]`: tokens starting with a known
///   key prefix (`sk-`, `sk-ant-`, `gsk_`, `AIza`, `hf_`, ...), the token after
///   `Bearer`/`Basic`, the value of `key=`/`token=`-style pairs, key-looking
///   tokens (letters and digits, 12+ chars) within three words after "key",
///   "token", "secret", "password" or "authorization", and any token holding
///   a run of 28+ letters and digits that mixes both;
/// - control characters become spaces and whitespace runs collapse to one;
/// - the result is at most [`MAX_MESSAGE_CHARS`] characters, cut on a
///   character boundary with a trailing `…` when cut.
///
/// Redaction happens before the cut, so a key on the boundary cannot leave a
/// readable prefix behind.
pub(crate) fn sanitize_message(raw: &str) -> String {
    let scanned = scan_prefix(raw);
    let redacted = redact(scanned);
    let collapsed = collapse_whitespace(&redacted);
    bound_chars(collapsed, MAX_MESSAGE_CHARS)
}

/// Sanitizes a provider code: trimmed, redacted, at most 128 characters;
/// `None` when empty.
pub(crate) fn sanitize_code(raw: &str) -> Option<String> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return None;
    }
    let clean = bound_chars(
        collapse_whitespace(&redact(scan_prefix(trimmed))),
        MAX_CODE_CHARS,
    );
    if clean.is_empty() { None } else { Some(clean) }
}

fn scan_prefix(raw: &str) -> &str {
    if raw.len() <= MAX_SCAN_BYTES {
        return raw;
    }
    let mut end = MAX_SCAN_BYTES;
    while !raw.is_char_boundary(end) {
        end -= 1;
    }
    let head = &raw[..end];
    // Cut at whitespace so a key straddling the cut is not half-kept.
    match head.rfind(|c: char| c.is_whitespace()) {
        Some(ws) if ws > 0 => &head[..ws],
        _ => head,
    }
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'+' | b'/' | b'=' | b'.' | b'*' | b'~')
}

fn redact(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut window: u8 = 0;
    let mut prev_auth_scheme = false;
    while i < bytes.len() {
        if !is_token_byte(bytes[i]) {
            // Copy the non-token run verbatim (token bytes are ASCII, so the
            // run boundaries are char boundaries).
            let start = i;
            while i < bytes.len() && !is_token_byte(bytes[i]) {
                i += 1;
            }
            out.push_str(&text[start..i]);
            continue;
        }
        let start = i;
        while i < bytes.len() && is_token_byte(bytes[i]) {
            i += 1;
        }
        let token = &text[start..i];
        let core = token.trim_end_matches('.');
        let trailing = &token[core.len()..];
        let lower = core.to_ascii_lowercase();

        if let Some(kept) = redact_pair(core, &lower) {
            out.push_str(&kept);
            out.push_str(trailing);
        } else if looks_secret(core, prev_auth_scheme, window > 0) {
            out.push_str(REDACTED);
            out.push_str(trailing);
        } else {
            out.push_str(token);
        }

        prev_auth_scheme = lower == "bearer" || lower == "basic";
        if is_keyword(&lower) {
            window = KEYWORD_WINDOW;
        } else {
            window = window.saturating_sub(1);
        }
    }
    out
}

/// `key=VALUE`, `api_key=VALUE`, `access_token=VALUE`: keep the name.
fn redact_pair(core: &str, lower: &str) -> Option<String> {
    let eq = lower.find('=')?;
    let name = &lower[..eq];
    let value = &core[eq + 1..];
    if value.trim_matches('=').is_empty() || !is_keyword(name) {
        return None;
    }
    Some(format!("{}={REDACTED}", &core[..eq]))
}

fn looks_secret(core: &str, after_auth_scheme: bool, in_keyword_window: bool) -> bool {
    if core.is_empty() {
        return false;
    }
    if after_auth_scheme && core.len() >= 8 {
        return true;
    }
    if PREFIXES
        .iter()
        .any(|p| core.starts_with(p) && core.len() >= p.len() + 6)
    {
        return true;
    }
    if core.starts_with("AKIA")
        && core.len() >= 16
        && core
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    {
        return true;
    }
    let has_digit = core.bytes().any(|b| b.is_ascii_digit());
    let has_alpha = core.bytes().any(|b| b.is_ascii_alphabetic());
    if in_keyword_window && core.len() >= 12 && ((has_digit && has_alpha) || core.contains("***")) {
        return true;
    }
    has_long_mixed_run(core)
}

fn has_long_mixed_run(core: &str) -> bool {
    core.split(|c: char| !c.is_ascii_alphanumeric()).any(|run| {
        run.len() >= LONG_RUN
            && run.bytes().any(|b| b.is_ascii_digit())
            && run.bytes().any(|b| b.is_ascii_alphabetic())
    })
}

fn collapse_whitespace(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pending_space = false;
    for c in text.chars() {
        if c.is_whitespace() || c.is_control() {
            pending_space = !out.is_empty();
        } else {
            if pending_space {
                out.push(' ');
                pending_space = false;
            }
            out.push(c);
        }
    }
    out
}

fn bound_chars(text: String, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text,
        Some(_) => {
            // Keep max-1 chars and mark the cut.
            let cut = text
                .char_indices()
                .nth(max.saturating_sub(1))
                .map_or(text.len(), |(i, _)| i);
            let mut out = text[..cut].to_owned();
            out.push('…');
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_known_prefixes() {
        let m = sanitize_message(
            "Incorrect API key provided: sk-proj-AbCdEf0123456789xyz. You can find your API key at https://platform.openai.com/account/api-keys.",
        );
        assert!(!m.contains("AbCdEf0123456789"), "{m}");
        assert!(m.contains("[REDACTED]."), "{m}");
        assert!(
            m.contains("https://platform.openai.com/account/api-keys"),
            "{m}"
        );

        for key in [
            "sk-ant-api03-abcdefABCDEF0123456789",
            "gsk_abcdefghijklmnop1234",
            "AIzaSyA1b2C3d4E5f6G7h8I9j0KLMNOPQRSTU",
            "hf_abcdefghijklmnopqrstu",
            "xai-0123456789abcdefABCDEF",
        ] {
            let m = sanitize_message(&format!("bad credential {key} here"));
            assert_eq!(m, "bad credential [REDACTED] here");
        }
    }

    #[test]
    fn redacts_bearer_pairs_and_keyword_windows() {
        assert_eq!(
            sanitize_message("Authorization: Bearer abc.def-ghi_123456"),
            "Authorization: Bearer [REDACTED]"
        );
        assert_eq!(
            sanitize_message("GET /v1beta/models?key=AIzaXYZ&alt=sse failed"),
            "GET /v1beta/models?key=[REDACTED]&alt=sse failed"
        );
        assert_eq!(
            sanitize_message("invalid api key: 0a1b2c3d4e5f6a7b"),
            "invalid api key: [REDACTED]"
        );
        // A long hex key with no keyword around it.
        let hex = "0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(sanitize_message(&format!("x {hex} y")), "x [REDACTED] y");
    }

    #[test]
    fn keeps_ordinary_provider_text() {
        let text = "Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 199434, Requested 2299. Please try again in 519ms.";
        assert_eq!(sanitize_message(text), text);
        let anthropic =
            "prompt is too long: 205351 tokens > 200000 maximum (req_011CSHoEeqs5C35K2UUqR7Fy)";
        assert_eq!(sanitize_message(anthropic), anthropic);
        let gemini = "Quota exceeded for metric generativelanguage.googleapis.com/generate_content_free_tier_requests, model gemini-2.0-flash-lite";
        assert_eq!(sanitize_message(gemini), gemini);
    }

    #[test]
    fn bounds_on_char_boundary_and_collapses_controls() {
        let long = "é".repeat(2000);
        let m = sanitize_message(&long);
        assert_eq!(m.chars().count(), MAX_MESSAGE_CHARS);
        assert!(m.ends_with('…'));
        assert_eq!(sanitize_message("a\n\r\tb\u{0}  c "), "a b c");
        assert_eq!(sanitize_message(""), "");
    }

    #[test]
    fn key_across_the_scan_cut_is_not_leaked() {
        let key = "sk-ant-api03-SECRETSECRET0123456789";
        let text = format!("{}{key} tail", " ".repeat(MAX_SCAN_BYTES - 10));
        let m = sanitize_message(&text);
        assert!(!m.contains("SECRET"), "{m}");
        assert!(!m.contains("sk-ant"), "{m}");
    }

    #[test]
    fn codes_are_trimmed_and_bounded() {
        assert_eq!(sanitize_code("  "), None);
        assert_eq!(
            sanitize_code(" rate_limit_exceeded ").as_deref(),
            Some("rate_limit_exceeded")
        );
        assert_eq!(
            sanitize_code(&"x".repeat(500)).map(|c| c.chars().count()),
            Some(128)
        );
    }
}
