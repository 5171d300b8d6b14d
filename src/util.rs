//! Small helpers every layer uses.

use std::error::Error as StdError;
use std::fmt;

/// A value made safe for one log line: its [`Display`](fmt::Display) text
/// with control characters (newlines, ANSI escapes), quotes and
/// backslashes escaped as Rust's [`char::escape_debug`] does, so a
/// client-chosen value (a model name, an id) can never forge a line or
/// restyle a terminal. A value longer than [`LOG_SAFE_MAX_CHARS`]
/// characters is cut there and marked `…`, so a client cannot inflate
/// every line and span either. Nothing is allocated.
pub(crate) fn log_safe<T: fmt::Display>(value: T) -> LogSafe<T> {
    LogSafe(value)
}

/// A value escaped for a log line: see [`log_safe`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogSafe<T>(T);

/// The most characters of a value [`log_safe`] writes (before escaping).
pub(crate) const LOG_SAFE_MAX_CHARS: usize = 256;

impl<T: fmt::Display> fmt::Display for LogSafe<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        let mut escaping = Escaping {
            out: f,
            left: LOG_SAFE_MAX_CHARS,
            cut: false,
        };
        write!(escaping, "{}", self.0)?;
        if escaping.cut {
            escaping.out.write_char('…')?;
        }
        Ok(())
    }
}

/// Whether `escape_debug` leaves this byte as it is: printable ASCII but
/// the backslash and the quotes.
pub(crate) fn left_alone(byte: u8) -> bool {
    (0x20..0x7f).contains(&byte) && !matches!(byte, b'\\' | b'\'' | b'"')
}

/// Writes through to a formatter, escaping as it goes, up to `left`
/// characters of the value.
struct Escaping<'a, 'b> {
    out: &'a mut fmt::Formatter<'b>,
    left: usize,
    cut: bool,
}

impl fmt::Write for Escaping<'_, '_> {
    fn write_str(&mut self, mut s: &str) -> fmt::Result {
        while !s.is_empty() {
            if self.left == 0 {
                self.cut = true;
                return Ok(());
            }
            // A run of printable ASCII that `escape_debug` leaves alone
            // goes out in one write (ids and names are all such runs):
            // char by char cost a log line more than its formatting.
            let run = s
                .bytes()
                .take(self.left)
                .take_while(|&b| left_alone(b))
                .count();
            if run > 0 {
                self.out.write_str(&s[..run])?;
                self.left -= run;
                s = &s[run..];
                continue;
            }
            let mut chars = s.chars();
            if let Some(c) = chars.next() {
                self.left -= 1;
                for e in c.escape_debug() {
                    self.out.write_char(e)?;
                }
            }
            s = chars.as_str();
        }
        Ok(())
    }
}

/// The first `T` in an error or its chain of sources.
pub(crate) fn find_in_chain<'a, T: StdError + 'static>(
    error: &'a (dyn StdError + 'static),
) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(found) = error.downcast_ref::<T>() {
            return Some(found);
        }
        current = error.source();
    }
    None
}

/// `get_ref`, `get_mut` and `into_inner` of a middleware service whose
/// wrapped service is its `inner` field of type `S` (tower-http's
/// `define_inner_service_accessors`).
macro_rules! inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// Consumes `self`, returning the inner service.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}
pub(crate) use inner_service_accessors;

#[cfg(test)]
mod tests {
    use super::*;

    const FORGING_MODEL: &str = "evil\nINFO tower_llm_failover: FORGED \u{1b}[31mred";

    #[test]
    fn log_safe_escapes_control_characters() {
        let safe = log_safe(FORGING_MODEL).to_string();
        assert_eq!(safe, r"evil\nINFO tower_llm_failover: FORGED \u{1b}[31mred");
        assert!(!safe.chars().any(char::is_control));
        assert_eq!(log_safe("gpt-4o-mini").to_string(), "gpt-4o-mini");
    }

    #[test]
    fn log_safe_writes_what_escape_debug_writes_run_or_not() {
        for value in [
            "plain ascii run",
            "quotes \" and ' and \\ back",
            "tab\there, del\u{7f}, nul\0",
            "ünïcode and \u{301} combining, and 🦀",
            "",
        ] {
            let expected: String = value.chars().flat_map(char::escape_debug).collect();
            assert_eq!(log_safe(value).to_string(), expected, "{value:?}");
        }
        // A cut in the middle of a run, and right after an escaped char.
        let run = format!("{}\n{}", "a".repeat(LOG_SAFE_MAX_CHARS - 1), "b".repeat(10));
        assert_eq!(
            log_safe(&run).to_string(),
            format!("{}\\n…", "a".repeat(LOG_SAFE_MAX_CHARS - 1))
        );
    }

    #[test]
    fn log_safe_cuts_a_long_value() {
        let exact = "m".repeat(LOG_SAFE_MAX_CHARS);
        assert_eq!(log_safe(&exact).to_string(), exact, "not cut at the limit");
        let long = format!("{exact}\nFORGED{}", "x".repeat(100_000));
        let safe = log_safe(&long).to_string();
        assert_eq!(safe, format!("{exact}…"));
    }
}
