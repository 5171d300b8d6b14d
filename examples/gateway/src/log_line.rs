//! The text log's line format, written for what a line costs: the same
//! line as `tracing-subscriber`'s default (`Full`) format without colours
//! or span context,
//!
//! ```text
//! 2026-12-03T10:10:53.123456Z  INFO tower_llm_failover::turn: turn run_id=7f3a attempts=1 outcome="first_try" duration_ms=2
//! ```
//!
//! with the timestamp's date and time of day formatted once per second
//! per thread, numbers written without `core::fmt`'s padding machinery,
//! and plain strings quoted without an escaping pass. The gateway uses it
//! for text logs that go to a file or a pipe; a terminal, or
//! `log_span_context = true`, gets `tracing-subscriber`'s format.
//!
//! Control characters are escaped wherever they appear in a line (the
//! default format escapes them in the message only): a line is one line.
//!
//! The turn's line, one per request, is not an event at all when this
//! format is the log's and no OTLP layer reads the events: [`TurnLines`],
//! the library's turn-line writer, writes the same bytes from the turn's
//! facts (about 0.5 µs of CPU less per small completion).

use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use tower_llm_failover::observe::{TurnLine, TurnLineWriter, push_log_safe};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The lean text format (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct LineFormat;

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        with_line_buffer(|line| {
            write_line(line, event)?;
            writer.write_str(line)
        })
    }
}

/// Runs `write` on this thread's line buffer, cleared (see [`LINE`]); on a
/// buffer of its own when that one is in use (tracing does not dispatch
/// an event raised inside another's, so a guard against a panic, not a
/// path taken) or gone (the thread is ending).
fn with_line_buffer<R>(mut write: impl FnMut(&mut String) -> R) -> R {
    let kept = LINE.try_with(|line| {
        let mut line = line.try_borrow_mut().ok()?;
        line.clear();
        let out = write(&mut line);
        // A line that grew past what a usual one needs does not keep its
        // memory for the thread's life.
        if line.capacity() > LINE_KEPT {
            *line = String::with_capacity(LINE_KEPT);
        }
        Some(out)
    });
    match kept {
        Ok(Some(out)) => out,
        _ => write(&mut String::new()),
    }
}

/// The library's turn lines written straight into the log (the
/// process's [`TurnLineWriter`], set when the log is this format and
/// nothing else reads the event): the bytes [`LineFormat`] writes for the
/// `tower_llm_failover::turn` event, made from the turn's facts without
/// the event's dispatch and field visits (each `Display` field a pass
/// through `core::fmt`). One line per request: the largest single cost
/// the default log adds.
#[derive(Debug)]
pub struct TurnLines<M> {
    writer: M,
}

impl<M> TurnLines<M> {
    /// Turn lines written to `writer`, the log layer's.
    pub fn new(writer: M) -> Self {
        Self { writer }
    }
}

impl<M> TurnLineWriter for TurnLines<M>
where
    M: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    fn write(&self, line: &TurnLine<'_>) -> bool {
        // Left out where the log filter leaves the event out.
        if !tracing::enabled!(target: "tower_llm_failover::turn", Level::INFO) {
            return true;
        }
        let now = SystemTime::now();
        // Nowhere to report a failing log: as a failing layer's line.
        let _ = with_line_buffer(|text| {
            write_turn_line(text, line, now);
            self.writer.make_writer().write_all(text.as_bytes())
        });
        true
    }
}

/// `line` as [`LineFormat`] writes the turn event, `\n` included.
fn write_turn_line(text: &mut String, line: &TurnLine<'_>, now: SystemTime) {
    // Writing to a `String` does not fail.
    let _ = write_timestamp(text, now);
    text.push_str(level_column(Level::INFO));
    text.push_str("tower_llm_failover::turn: turn run_id=");
    push_log_safe(text, line.turn_id.as_str());
    text.push_str(" attempts=");
    text.push_str(itoa::Buffer::new().format(line.attempts));
    text.push_str(" outcome=\"");
    text.push_str(line.outcome.as_str());
    text.push('"');
    if let Some(reason) = line.stop_reason {
        text.push_str(" stop_reason=\"");
        text.push_str(reason.as_str());
        text.push('"');
    }
    if let Some(target) = line.target {
        text.push_str(" target=");
        push_log_safe(text, target);
    }
    text.push_str(" duration_ms=");
    let millis = u64::try_from(line.duration.as_millis()).unwrap_or(u64::MAX);
    text.push_str(itoa::Buffer::new().format(millis));
    text.push('\n');
}

/// What a thread's line buffer keeps between lines.
const LINE_KEPT: usize = 1024;

thread_local! {
    /// The line being formatted on this thread. The line is written here,
    /// with direct pushes, and handed to the layer's writer in one call:
    /// the writer is a `dyn fmt::Write`, and a line is some fifty small
    /// writes (one indirect call each, out of the cache by the next turn).
    static LINE: std::cell::RefCell<String> = std::cell::RefCell::new(String::with_capacity(LINE_KEPT));
}

/// One event as a line, `\n` included.
fn write_line(line: &mut String, event: &Event<'_>) -> fmt::Result {
    write_timestamp(line, SystemTime::now())?;
    let meta = event.metadata();
    line.push_str(level_column(*meta.level()));
    line.push_str(meta.target());
    line.push(':');
    let mut fields = Fields {
        out: Sanitized(line),
        result: Ok(()),
    };
    event.record(&mut fields);
    fields.result?;
    line.push('\n');
    Ok(())
}

/// The level right-aligned in five columns between single spaces, as the
/// default format writes it.
fn level_column(level: Level) -> &'static str {
    match level {
        Level::TRACE => " TRACE ",
        Level::DEBUG => " DEBUG ",
        Level::INFO => "  INFO ",
        Level::WARN => "  WARN ",
        Level::ERROR => " ERROR ",
    }
}

thread_local! {
    /// The second last formatted on this thread and its
    /// `YYYY-MM-DDTHH:MM:SS`.
    static SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

/// `2026-12-03T10:10:53.123456Z`, UTC with microseconds.
fn write_timestamp(writer: &mut impl fmt::Write, now: SystemTime) -> fmt::Result {
    // A clock before 1970 is written as 1970: the line still goes out.
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let date_time = SECOND.with(|cached| {
        let (second, text) = cached.get();
        if second == secs {
            return text;
        }
        let text = date_time(secs);
        cached.set((secs, text));
        text
    });
    // `.123456Z` after the date and time; one text, checked as UTF-8 once.
    let mut stamp = [0; 27];
    stamp[..19].copy_from_slice(&date_time);
    stamp[19..].copy_from_slice(b".000000Z");
    let mut n = since.subsec_micros();
    for digit in stamp[20..26].iter_mut().rev() {
        *digit = b'0' + (n % 10) as u8;
        n /= 10;
    }
    // ASCII digits and separators.
    writer.write_str(std::str::from_utf8(&stamp).map_err(|_| fmt::Error)?)
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix second (UTC, proleptic Gregorian).
fn date_time(secs: u64) -> [u8; 19] {
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    let mut text = *b"0000-00-00T00:00:00";
    let mut put = |at: usize, width: usize, mut n: u64| {
        for i in (at..at + width).rev() {
            text[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, year % 10_000);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, of_day / 3600);
    put(14, 2, of_day % 3600 / 60);
    put(17, 2, of_day % 60);
    text
}

/// Year, month and day of a count of days since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Writes what it is given with control characters escaped (`\n`,
/// `\u{1b}`), so that no value can end the line or colour a terminal.
struct Sanitized<'a>(&'a mut String);

impl fmt::Write for Sanitized<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(at) = rest.bytes().position(|b| b < 0x20 || b == 0x7f) {
            self.0.push_str(&rest[..at]);
            // A control character is one byte (ASCII).
            let control = char::from(rest.as_bytes()[at]);
            self.0.extend(control.escape_debug());
            rest = &rest[at + 1..];
        }
        self.0.push_str(rest);
        Ok(())
    }
}

/// The event's fields in the order recorded: the message bare, the others
/// as `name=value`, each after a space; strings quoted as `Debug` quotes
/// them.
struct Fields<'a> {
    out: Sanitized<'a>,
    result: fmt::Result,
}

impl Fields<'_> {
    /// ` name=` (` ` alone for the message).
    fn name(&mut self, field: &Field) -> fmt::Result {
        let name = field.name();
        self.out.0.write_char(' ')?;
        if name == "message" {
            return Ok(());
        }
        self.out
            .0
            .write_str(name.strip_prefix("r#").unwrap_or(name))?;
        self.out.0.write_char('=')
    }

    fn put(&mut self, field: &Field, value: impl FnOnce(&mut Self) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self.name(field).and_then(|()| value(self));
        }
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let message = field.name() == "message";
        self.put(field, |f| {
            if message {
                f.out.write_str(value)
            } else if value
                .bytes()
                .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
            {
                // What `Debug` writes for a plain string, without its
                // per-character escaping pass.
                f.out.0.write_char('"')?;
                f.out.0.write_str(value)?;
                f.out.0.write_char('"')
            } else {
                write!(f.out, "{value:?}")
            }
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, |f| {
            f.out.0.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, |f| {
            f.out.0.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, |f| {
            f.out.0.write_str(if value { "true" } else { "false" })
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, |f| write!(f.out, "{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Kept {
        type Writer = Kept;
        fn make_writer(&'a self) -> Kept {
            self.clone()
        }
    }

    impl Kept {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// The events a gateway writes, and values that test the fast paths.
    fn events() {
        let client = "a\"quoted\\ model";
        tracing::info!(
            target: "tower_llm_failover::turn",
            // As the library writes its turn line: the message a `&str`,
            // first.
            message = "turn",
            run_id = %"7f3a-01",
            attempts = 2u64,
            outcome = "after_hop",
            stop_reason = Option::<&str>::None,
            target = %"backup",
            duration_ms = 12u64,
        );
        tracing::warn!(
            target: "tower_llm_failover::attempt",
            delta = -3i64,
            estimated = true,
            model = client,
            cost = 0.25f64,
            listed = ?["a", "b"],
            r#type = "x",
            "attempt {} of {}",
            1,
            2
        );
        tracing::error!("plain");
    }

    /// A line without its timestamp (everything up to the first space).
    fn untimed(line: &str) -> &str {
        line.split_once(' ').unwrap().1
    }

    #[test]
    fn lines_are_the_default_formats_lines() {
        let ours = Kept::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(ours.clone())
            .with_max_level(Level::TRACE)
            .event_format(LineFormat)
            .finish();
        tracing::subscriber::with_default(subscriber, events);
        let theirs = Kept::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(theirs.clone())
            .with_max_level(Level::TRACE)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, events);
        let (ours, theirs) = (ours.text(), theirs.text());
        assert_eq!(ours.lines().count(), 3, "{ours}");
        for (a, b) in ours.lines().zip(theirs.lines()) {
            assert_eq!(untimed(a), untimed(b));
            assert_eq!(a.split_once(' ').unwrap().0.len(), 27, "{a}");
        }
        assert!(ours.contains(r#"model="a\"quoted\\ model""#), "{ours}");
        // A message given as a `&str` field is bare, as a format string's.
        assert!(
            ours.contains("tower_llm_failover::turn: turn run_id=7f3a-01 "),
            "{ours}"
        );
    }

    /// A turn's line made from its facts is the line [`LineFormat`] writes
    /// for the library's turn event (its fields as
    /// `tests/turn_line_writer.rs` of the library pins them), escapes and
    /// absent fields included.
    #[test]
    fn a_turn_line_from_its_facts_is_the_events_line() {
        use tower_llm_failover::{StopReason, TurnId, TurnOutcome};
        // A random id, as the library makes them (hex).
        let hex = tower_llm_failover::budget::TurnLimits::new()
            .start()
            .turn_id()
            .clone();
        let text = TurnId::from("client \"id\"\nINFO forged");
        let cases = [
            (&hex, 1, TurnOutcome::FirstTry, None, Some("primary"), 7),
            (
                &text,
                3,
                TurnOutcome::StoppedBeforeOutput,
                Some(StopReason::Exhausted),
                None,
                1234,
            ),
            (
                &hex,
                2,
                TurnOutcome::AfterHop,
                None,
                Some("back\u{1b}[31mup 'x'"),
                0,
            ),
        ];
        for (id, attempts, outcome, reason, target, ms) in cases {
            let event = Kept::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(event.clone())
                .event_format(LineFormat)
                .finish();
            // The library's event (`TurnRecord::turn_event`), its values
            // escaped as the library escapes them.
            let safe = |value: &str| {
                let mut out = String::new();
                push_log_safe(&mut out, value);
                out
            };
            tracing::subscriber::with_default(subscriber, || {
                tracing::info!(
                    target: "tower_llm_failover::turn",
                    message = "turn",
                    run_id = %safe(id.as_str()),
                    attempts,
                    outcome = outcome.as_str(),
                    stop_reason = reason.map(StopReason::as_str),
                    target = target.map(safe).map(tracing::field::display),
                    duration_ms = ms,
                );
            });
            let line = TurnLine::new(
                id,
                attempts,
                outcome,
                reason,
                target,
                std::time::Duration::from_millis(ms),
            );
            let mut direct = String::new();
            write_turn_line(&mut direct, &line, SystemTime::now());
            let event = event.text();
            assert_eq!(untimed(&direct), untimed(&event));
            assert_eq!(direct.split_once(' ').unwrap().0.len(), 27, "{direct}");
            assert_eq!(direct.lines().count(), 1, "{direct}");
        }
    }

    /// The writer leaves a turn's line out where the log filter would
    /// leave the event out, and writes it (whole, once) where it would not.
    #[test]
    fn turn_lines_follow_the_log_filter() {
        let id = tower_llm_failover::TurnId::from("t-1");
        let line = TurnLine::new(
            &id,
            1,
            tower_llm_failover::TurnOutcome::FirstTry,
            None,
            Some("primary"),
            std::time::Duration::from_millis(3),
        );
        for (filter, written) in [
            ("info", true),
            ("warn", false),
            ("info,tower_llm_failover::turn=off", false),
        ] {
            let kept = Kept::default();
            let lines = TurnLines::new(kept.clone());
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(Kept::default())
                .finish();
            let handled = tracing::subscriber::with_default(subscriber, || lines.write(&line));
            assert!(handled, "{filter}: the event is not made either way");
            let text = kept.text();
            if written {
                assert_eq!(text.lines().count(), 1, "{filter}: {text}");
                assert!(
                    text.ends_with(
                        " INFO tower_llm_failover::turn: turn run_id=t-1 attempts=1 \
                         outcome=\"first_try\" target=primary duration_ms=3\n"
                    ),
                    "{filter}: {text}"
                );
            } else {
                assert_eq!(text, "", "{filter}");
            }
        }
    }

    /// What `log` writes through [`LineFormat`] at the default level.
    fn logged(log: impl FnOnce()) -> String {
        let kept = Kept::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(kept.clone())
            .event_format(LineFormat)
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        kept.text()
    }

    /// A value whose formatting logs a line of its own.
    struct Logs;

    impl fmt::Debug for Logs {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            tracing::info!("inner");
            f.write_str("outer")
        }
    }

    /// tracing does not dispatch an event raised inside another's
    /// dispatch (the inner line is dropped): the outer line is whole, and
    /// the thread's buffer is free for the next.
    #[test]
    fn a_line_logged_while_another_is_formatted_leaves_both_lines_around_it_whole() {
        let text = logged(|| {
            tracing::info!(value = ?Logs, "first");
            tracing::info!("after");
        });
        let lines: Vec<&str> = text.lines().map(untimed).collect();
        assert_eq!(
            lines,
            [
                " INFO tower_llm_gateway::log_line::tests: first value=outer",
                " INFO tower_llm_gateway::log_line::tests: after",
            ],
            "{text}"
        );
    }

    #[test]
    fn a_control_character_cannot_end_a_line_or_colour_a_terminal() {
        let text = logged(|| {
            tracing::info!(model = %"x\ny\u{1b}[31m", "two\nlines");
        });
        assert_eq!(
            untimed(&text),
            " INFO tower_llm_gateway::log_line::tests: two\\nlines model=x\\ny\\u{1b}[31m\n"
        );
    }

    #[test]
    fn timestamps_are_utc_calendar_dates_with_microseconds() {
        let at = |secs: u64, micros: u32| {
            let mut text = String::new();
            write_timestamp(
                &mut text,
                UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros.into()),
            )
            .unwrap();
            text
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(at(1_796_292_653, 123_456), "2026-12-03T10:10:53.123456Z");
        assert_eq!(at(4_107_542_399, 999_999), "2100-02-28T23:59:59.999999Z");
        assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000000Z");
        // The per-second cache gives way to the next second.
        assert_eq!(at(1_796_292_654, 0), "2026-12-03T10:10:54.000000Z");
    }
}
