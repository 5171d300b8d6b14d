//! The SSE scanner against the WHATWG event-stream rules, and its invariance
//! under every way the wire can split a stream into chunks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::sse::{SseError, SseItem, SseScanner, Truncated};
use bytes::Bytes;
use proptest::prelude::*;

/// (event type, data, id, retry, range) of each dispatched event, plus the
/// skipped ranges, the errors and what `finish` reported.
/// (event type, data, id, retry, range) of one dispatched event.
type EventFacts = (
    Option<String>,
    String,
    Option<String>,
    Option<u64>,
    (u64, u64),
);

#[derive(Debug, Default, PartialEq)]
struct Scan {
    events: Vec<EventFacts>,
    skipped: Vec<(u64, u64)>,
    errors: Vec<SseError>,
    truncated: Option<Truncated>,
}

fn scan_chunks(scanner: &mut SseScanner, chunks: &[&[u8]]) -> Scan {
    let mut scan = Scan::default();
    for chunk in chunks {
        scanner.feed(&Bytes::copy_from_slice(chunk), |item| match item {
            SseItem::Event(e) => scan.events.push((
                e.event().map(|t| String::from_utf8_lossy(t).into_owned()),
                e.data_str().unwrap().to_owned(),
                e.id().map(|t| String::from_utf8_lossy(t).into_owned()),
                e.retry(),
                (e.range().start, e.range().end),
            )),
            SseItem::Skipped { range } => scan.skipped.push((range.start, range.end)),
            SseItem::Error(error) => scan.errors.push(error),
        });
    }
    scan.truncated = scanner.finish();
    scan
}

fn scan(wire: &[u8]) -> Scan {
    scan_chunks(&mut SseScanner::new(), &[wire])
}

fn datas(wire: &[u8]) -> Vec<String> {
    scan(wire).events.into_iter().map(|e| e.1).collect()
}

#[test]
fn whatwg_cases() {
    // (wire, the data of each dispatched event)
    let cases: &[(&[u8], &[&str])] = &[
        (b"data: a\n\n", &["a"]),
        (b"data:a\n\n", &["a"]),
        (b"data:  a\n\n", &[" a"]), // only one leading space is stripped
        (b"data: a\r\n\r\n", &["a"]),
        (b"data: a\r\rdata: b\r\r", &["a", "b"]),
        (b"data: a\ndata: b\n\n", &["a\nb"]),
        (b"data\n\n", &[""]), // a field without a colon has an empty value
        (b"data:\ndata\n\n", &["\n"]), // two empty data lines join to one newline
        (b": comment\n\n", &[]), // comments dispatch nothing
        (b": keep-alive\ndata: x\n\n", &["x"]),
        (b"event: e\n\n", &[]),                   // no data, nothing fired
        (b"\xEF\xBB\xBFdata: bom\n\n", &["bom"]), // one leading BOM stripped
        (b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n", &[]), // a second BOM makes an unknown field
        (b"Data: x\n\n", &[]),                    // field names are case-sensitive
        (b"data: x\n\ndata: y", &["x"]),          // pending event at EOF is not dispatched
        (b"foo: bar\ndata: z\n\n", &["z"]),       // unknown fields ignored
        (b"data: a:b\n\n", &["a:b"]),             // only the first colon splits
    ];
    for (wire, want) in cases {
        assert_eq!(datas(wire), *want, "{:?}", String::from_utf8_lossy(wire));
    }
}

#[test]
fn event_id_and_retry_fields() {
    let s = scan(
        b"event: delta\nid: 7\nretry: 1500\ndata: x\n\ndata: y\n\nid: a\0b\nretry: 1x\ndata: z\n\n",
    );
    assert_eq!(s.events[0].0.as_deref(), Some("delta"));
    assert_eq!(s.events[0].2.as_deref(), Some("7"));
    assert_eq!(s.events[0].3, Some(1500));
    assert_eq!(s.events[1].0, None, "event type resets after dispatch");
    assert_eq!(
        s.events[1].2, None,
        "the id field belongs to the event that set it"
    );
    assert_eq!(s.events[2].2, None, "an id with NUL is ignored");
    assert_eq!(
        s.events[2].3, None,
        "a retry that is not all digits is ignored"
    );

    let mut scanner = SseScanner::new();
    scan_chunks(&mut scanner, &[b"id: 7\ndata: x\n\ndata: y\n\n"]);
    assert_eq!(
        scanner.last_event_id(),
        Some(&b"7"[..]),
        "last event id persists"
    );
}

#[test]
fn cr_at_chunk_end_and_lf_at_next_start_is_one_line_end() {
    let s = scan_chunks(
        &mut SseScanner::new(),
        &[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"],
    );
    assert_eq!(s.events.len(), 1);
    assert_eq!(s.events[0].1, "a\nb");
    // The event is dispatched at the CR, without waiting for the next chunk;
    // the LF that follows is reported as its own skipped byte.
    assert_eq!(s.events[0].4, (0, 19));
    assert_eq!(s.skipped, vec![(19, 20)]);
    assert!(s.truncated.is_none());
}

#[test]
fn ranges_partition_the_stream() {
    let wire = b": hi\n\ndata: a\n\nevent: x\n\ndata: b\n\ndata: c";
    let s = scan(wire);
    assert_eq!(s.skipped, vec![(0, 6), (15, 25)]);
    assert_eq!(
        s.events.iter().map(|e| e.4).collect::<Vec<_>>(),
        vec![(6, 15), (25, 34)]
    );
    assert_eq!(
        s.truncated,
        Some(Truncated {
            range: 34..41,
            had_data: false, // the line was never completed, so no data field was read
        })
    );
    let s = scan(b"data: a\n");
    assert_eq!(
        s.truncated,
        Some(Truncated {
            range: 0..8,
            had_data: true
        })
    );
}

#[test]
fn one_line_event_data_is_a_slice_of_the_chunk() {
    let chunk = Bytes::from_static(b"data: {\"x\":1}\n\n");
    let mut data_ptr = None;
    SseScanner::new().feed(&chunk, |item| {
        if let SseItem::Event(e) = item {
            data_ptr = Some(e.data().as_ptr());
        }
    });
    assert_eq!(data_ptr, Some(chunk[6..].as_ptr()), "no copy of the data");
}

#[test]
fn invalid_utf8_data_is_an_error_item_and_scanning_goes_on() {
    let s = scan(b"data: \xFF\xFE\n\ndata: ok\n\n");
    assert_eq!(s.errors, vec![SseError::InvalidUtf8 { range: 0..10 }]);
    assert_eq!(s.events.len(), 1);
    assert_eq!(s.events[0].1, "ok");
}

#[test]
fn oversized_line_and_event_are_clear_errors() {
    let mut scanner = SseScanner::new().max_line_bytes(16);
    let s = scan_chunks(
        &mut scanner,
        &[b"data: 0123456789", b"0123456789\n\ndata: x\n\n"],
    );
    assert_eq!(
        s.errors,
        vec![SseError::LineTooLong {
            start: 0,
            limit: 16
        }]
    );
    assert!(s.events.is_empty(), "nothing after a fatal error");
    assert!(scanner.is_failed());
    assert!(s.errors[0].to_string().contains("16-byte line cap"));

    let mut scanner = SseScanner::new().max_event_bytes(20);
    let s = scan_chunks(
        &mut scanner,
        &[b"data: a\n\ndata: 0123\ndata: 4567\ndata: 89\n\n"],
    );
    assert_eq!(s.events.len(), 1);
    assert_eq!(
        s.errors,
        vec![SseError::EventTooLarge {
            start: 9,
            limit: 20
        }]
    );

    // A line that never ends is capped while it is still partial.
    let mut scanner = SseScanner::new().max_line_bytes(1024);
    let big = vec![b'a'; 600];
    let s = scan_chunks(&mut scanner, &[&big, &big, &big]);
    assert_eq!(s.errors.len(), 1);
    assert!(matches!(s.errors[0], SseError::LineTooLong { .. }));
}

/// What must not depend on how the stream was split: every event but its
/// exact range (a CR closing a chunk dispatches at once, and the LF that may
/// follow is then reported apart), every error, and whether data was cut.
fn split_invariant(scan: &Scan) -> impl PartialEq + std::fmt::Debug + use<> {
    let events: Vec<_> = scan
        .events
        .iter()
        .map(|(t, d, i, r, _range)| (t.clone(), d.clone(), i.clone(), *r))
        .collect();
    let errors: Vec<String> = scan
        .errors
        .iter()
        .map(std::mem::discriminant)
        .map(|d| format!("{d:?}"))
        .collect();
    (events, errors, scan.truncated.as_ref().map(|t| t.had_data))
}

/// Checks that the ranges a scan reported tile `wire` exactly, so a proxy
/// forwarding each range's bytes forwards the input unchanged.
fn assert_tiles(scan: &Scan, wire: &[u8]) {
    let mut ranges: Vec<(u64, u64)> = scan.events.iter().map(|e| e.4).collect();
    ranges.extend(scan.skipped.iter().copied());
    if let Some(t) = &scan.truncated {
        ranges.push((t.range.start, t.range.end));
    }
    ranges.sort_unstable();
    let mut rebuilt = Vec::new();
    let mut next = 0;
    for (start, end) in ranges {
        assert_eq!(start, next, "ranges leave a gap or overlap");
        rebuilt.extend_from_slice(&wire[start as usize..end as usize]);
        next = end;
    }
    assert_eq!(rebuilt, wire);
}

/// A realistic mixed stream: CRLF and CR ends, comments, multi-line data,
/// multi-byte UTF-8, a BOM, ids, and a truncated tail.
fn corpus() -> Vec<u8> {
    let mut wire = b"\xEF\xBB\xBF: keep-alive\r\n\r\n".to_vec();
    wire.extend_from_slice(
        "data: {\"choices\":[{\"delta\":{\"content\":\"héllo → wörld 🚀\"}}]}\r\n\r\n".as_bytes(),
    );
    wire.extend_from_slice(b"event: error\rid: 42\rdata: line one\rdata: line two\r\r");
    wire.extend_from_slice("data:日本語\n\n: OPENROUTER PROCESSING\n\ndata\n\n".as_bytes());
    wire.extend_from_slice(b"retry: 100\ndata: [DONE]\n\ndata: trailing");
    wire
}

fn split_at_points(wire: &[u8], points: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = points.iter().map(|p| p % (wire.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut chunks = Vec::new();
    let mut last = 0;
    for cut in cuts {
        chunks.push(wire[last..cut].to_vec());
        last = cut;
    }
    chunks.push(wire[last..].to_vec());
    chunks
}

#[test]
fn every_two_way_split_gives_the_same_events() {
    let wire = corpus();
    let whole = scan(&wire);
    assert_eq!(whole.events.len(), 5);
    assert_eq!(whole.events[1].1, "line one\nline two");
    assert_eq!(whole.events[2].1, "日本語");
    for cut in 0..=wire.len() {
        let parts = [&wire[..cut], &wire[cut..]];
        let split = scan_chunks(&mut SseScanner::new(), &parts);
        assert_eq!(
            split_invariant(&split),
            split_invariant(&whole),
            "split at {cut}"
        );
        assert_tiles(&split, &wire);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_split_gives_the_same_events_and_covers_every_byte(
        points in proptest::collection::vec(0usize..10_000, 0..24)
    ) {
        let wire = corpus();
        let whole = scan(&wire);
        let chunks = split_at_points(&wire, &points);
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let split = scan_chunks(&mut SseScanner::new(), &refs);
        prop_assert_eq!(split_invariant(&split), split_invariant(&whole));
        assert_tiles(&split, &wire);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_split_invariant(
        wire in proptest::collection::vec(
            prop_oneof![Just(b'\n'), Just(b'\r'), Just(b':'), Just(b' '), Just(0xFFu8), Just(b'd'), any::<u8>()],
            0..300,
        ),
        points in proptest::collection::vec(0usize..400, 0..8),
    ) {
        let whole = scan(&wire);
        let chunks = split_at_points(&wire, &points);
        let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let split = scan_chunks(&mut SseScanner::new(), &refs);
        prop_assert_eq!(split_invariant(&split), split_invariant(&whole));
        assert_tiles(&split, &wire);
    }
}
