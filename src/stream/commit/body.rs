use crate::classify::Note;
use std::collections::VecDeque;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::Response;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::time::Alarm;

use super::failure::{FailureKind, classify};
use super::state::{StreamFailure, StreamIdentity, StreamState, StreamStatus};
use super::{BoxError, CommitWindow, InspectConfig};
use crate::dialect::foreign::ForeignReader;
use crate::dialect::{ChunkIdentity, ChunkKind, Dialect, ErrorSource, NeutralEvent, TerminalError};
use crate::sse::{SseItem, SseScanner};
use crate::{Phase, classify::Classification};

pin_project! {
    /// A response body run through the commit machine (see the
    /// [module docs](super)).
    ///
    /// Non-SSE bodies pass through untouched. An SSE body is scanned as it
    /// streams: complete events pass through as the original bytes (a frame
    /// holding only complete events is forwarded as the very same `Bytes`),
    /// an incomplete event is held back until its blank line arrives, and a
    /// failure after commit ends the stream with the dialect's terminal
    /// event instead of the upstream's remaining bytes.
    pub struct StreamStateBody<B, D: Dialect> {
        #[pin]
        inner: B,
        // Boxed so the body is `Unpin` whenever the upstream body is.
        idle: Option<Alarm>,
        // When the last upstream frame arrived. The idle timer is re-armed
        // from it only when it fires: resetting a timer on every frame
        // would take the timer wheel's lock per frame.
        last_frame: Instant,
        // The turn's deadline, when the request carried a turn budget.
        deadline: Option<Alarm>,
        // While held back: the first-output deadline, then the end of the
        // commit window's time limit.
        hold_timer: Option<Alarm>,
        // Fires when the gateway's shutdown grace period is over.
        shutdown: Option<crate::shutdown::Ending>,
        // How often the body yielded, since the upstream's last frame, to
        // let the upstream connection's task decode the next one.
        join_yields: u8,
        inspector: Option<Inspector<D>>,
    }
}

impl<B, D: Dialect> std::fmt::Debug for StreamStateBody<B, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamStateBody")
            .field("inspected", &self.inspector.is_some())
            .finish_non_exhaustive()
    }
}

/// Whether a response is a Server-Sent Events stream (`text/event-stream`,
/// in any case, with or without parameters).
pub(crate) fn is_event_stream<B>(response: &Response<B>) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .get(..17)
                .is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
        })
}

/// Hold-back settings: nothing is released before the commit window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    pub(crate) window: CommitWindow,
    /// No model output by then: the attempt failed (and may be rerouted).
    pub(crate) first_output_by: Instant,
    /// Held bytes past this commit what is held, or fail a bare preamble.
    pub(crate) max_held_bytes: u64,
}

/// How a held-back body came out of its hold.
#[derive(Debug)]
pub(crate) enum Release {
    /// The commit window was reached: the held frames go to the client.
    Released,
    /// The attempt failed before anything was released.
    Failed {
        failure: Classification,
        output_events: u64,
    },
}

impl<B, D: Dialect> StreamStateBody<B, D>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    D: Dialect,
{
    /// Wraps a response's body: inspected (and committed at the first
    /// output) when it is an event stream, passed through otherwise.
    pub(crate) fn wrap_response(
        response: Response<B>,
        config: &Arc<InspectConfig<D>>,
        deadline: Option<Instant>,
    ) -> Response<Self> {
        if !is_event_stream(&response) {
            return response.map(|inner| Self {
                inner,
                idle: None,
                last_frame: Instant::now(),
                deadline: None,
                hold_timer: None,
                shutdown: None,
                join_yields: 0,
                inspector: None,
            });
        }
        let (mut parts, inner) = response.into_parts();
        // A terminal event may be added: the length is no longer known.
        parts.headers.remove(CONTENT_LENGTH);
        let state = StreamState::new();
        parts.extensions.insert(state.clone());
        if let Some(at) = deadline {
            // This body ends the stream then, with a terminal event.
            parts.extensions.insert(crate::time::EndsItselfAt(at));
        }
        let body = Self::inspect(inner, config, state, None, false, deadline, None, None);
        Response::from_parts(parts, body)
    }

    /// Inspects a body the caller knows is an event stream, sharing `state`.
    /// `strip_usage` drops usage-only events (the client did not ask for
    /// them). `hold`: release nothing before the commit window. `foreign`:
    /// the stream is of a target's other dialect, read by it and written
    /// in `D`.
    #[allow(clippy::too_many_arguments)] // one call site per kind of stream
    pub(crate) fn inspect(
        inner: B,
        config: &Arc<InspectConfig<D>>,
        state: StreamState,
        provider: Option<Arc<str>>,
        strip_usage: bool,
        deadline: Option<Instant>,
        hold: Option<Hold>,
        foreign: Option<Box<dyn ForeignReader>>,
    ) -> Self {
        let mut inspector = Inspector::new(Arc::clone(config), state);
        inspector.foreign = foreign;
        inspector.strip_usage = strip_usage;
        inspector.provider = provider.or_else(|| config.provider.clone());
        let hold_timer = hold.map(|h| Alarm::at(h.first_output_by));
        inspector.hold = hold.map(|settings| HoldState {
            settings,
            output_bytes: 0,
        });
        Self {
            inner,
            idle: config
                .idle_timeout
                .map(|timeout| Alarm::at(crate::time::later(Instant::now(), timeout))),
            last_frame: Instant::now(),
            deadline: deadline.map(Alarm::at),
            hold_timer,
            shutdown: config
                .shutdown
                .as_ref()
                .map(crate::shutdown::Shutdown::wait),
            join_yields: 0,
            inspector: Some(inspector),
        }
    }

    /// Runs `on_end` once when the body is dropped, with the final snapshot.
    pub(crate) fn on_end(self: Pin<&mut Self>, on_end: OnEnd) {
        if let Some(inspector) = self.project().inspector {
            inspector.on_end = Some(on_end);
        }
    }

    /// When the first model output arrived, if it did.
    pub(crate) fn first_output_at(&self) -> Option<Instant> {
        self.inspector.as_ref().and_then(|i| i.first_output_at)
    }

    /// Drives a held-back body until its commit window is reached or it
    /// fails. Nothing is handed out meanwhile.
    pub(crate) fn poll_release(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Release> {
        let mut this = self;
        loop {
            let Some(inspector) = this.as_mut().project().inspector.as_mut() else {
                return Poll::Ready(Release::Released);
            };
            if let Some((failure, output_events)) = inspector.rejected.take().map(|r| *r) {
                return Poll::Ready(Release::Failed {
                    failure,
                    output_events,
                });
            }
            if inspector.hold.is_none() || inspector.ended {
                return Poll::Ready(Release::Released);
            }
            if this.as_mut().poll_progress(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

/// At most this many frames are joined into one client write.
const MAX_JOINED_FRAMES: usize = 64;

/// How often the body yields for one more upstream frame before the join
/// goes out. Two, because hyper's HTTP/1 server polls a body that returned
/// `Pending` once more within the same task poll (hyper 1's
/// `Dispatcher::poll_loop` checks the write side again after a flush):
/// that second poll comes before the runtime has run any other task, so
/// with one yield the join never waited for the upstream connection (one
/// client write per event, measured).
const MAX_JOIN_YIELDS: u8 = 2;

/// Runs once when an inspected stream's body is dropped.
pub(crate) type OnEnd = Box<dyn FnOnce(&super::StreamSnapshot) + Send + Sync>;

/// What to do with the undecided bytes up to an absolute offset.
#[derive(Debug, Clone, Copy)]
enum Decision {
    Forward(u64),
    Drop(u64),
}

struct Inspector<D: Dialect> {
    config: Arc<InspectConfig<D>>,
    scanner: SseScanner,
    state: StreamState,
    /// Bytes of an incomplete event, not yet forwarded or dropped. They
    /// start at `decided`.
    held: VecDeque<Bytes>,
    /// Input bytes before this offset are forwarded or dropped.
    decided: u64,
    /// Reused for every frame so per-frame work allocates nothing.
    decisions: Vec<Decision>,
    /// What the dialect keeps between this stream's events.
    memo: D::Memo,
    out: VecDeque<Frame<Bytes>>,
    /// Boxed: rare, and large beside the rest of a held stream's state.
    pending_failure: Option<Box<FailureKind>>,
    identity: StreamIdentity,
    output_events: u64,
    /// A finish reason was seen (in any choice): the commit point, even
    /// with no output before it.
    finish_seen: bool,
    /// The answer is whole: a finish reason was seen and the dialect's
    /// memo says no choice is left open (with `n > 1`, every choice that
    /// appeared has finished).
    finished: bool,
    done: bool,
    ended: bool,
    strip_usage: bool,
    on_end: Option<OnEnd>,
    /// The provider classifier overrides match on.
    provider: Option<Arc<str>>,
    /// Set while nothing may be released (before the commit window).
    hold: Option<HoldState>,
    /// A failure before release, for the failover loop to take.
    /// Boxed: rare, and large beside the rest of a held stream's state.
    rejected: Option<Box<(Classification, u64)>>,
    /// When the first model output arrived (held or not).
    first_output_at: Option<Instant>,
    /// Where frames that go out together are joined. Kept so that, once
    /// the previous joined frame was written and dropped, the next join
    /// reuses its allocation.
    joined: BytesMut,
    /// The reader of a target that speaks another dialect than the
    /// client's: events are read by it, and written in `D` with `memo`.
    foreign: Option<Box<dyn ForeignReader>>,
    /// The neutral events of the event being translated (reused).
    neutral: Vec<NeutralEvent>,
    /// What this frame's events were translated into.
    translated: BytesMut,
    /// A translated stream's events held before commit: translated only
    /// when released, so an attempt that fails first costs no translation.
    unreleased: Vec<crate::sse::SseEvent>,
}

#[derive(Debug)]
struct HoldState {
    settings: Hold,
    output_bytes: u64,
}

impl<D: Dialect> Inspector<D> {
    fn new(config: Arc<InspectConfig<D>>, state: StreamState) -> Self {
        let provider = config.provider.clone();
        let scanner = SseScanner::new()
            .max_line_bytes(config.max_line_bytes)
            .max_event_bytes(config.max_event_bytes);
        Self {
            config,
            scanner,
            state,
            held: VecDeque::new(),
            decided: 0,
            // Room for a frame's usual events; a held stream keeps it, so
            // it is small (it grows once if a frame carries more).
            decisions: Vec::with_capacity(2),
            memo: D::Memo::default(),
            out: VecDeque::with_capacity(2),
            pending_failure: None,
            identity: StreamIdentity::default(),
            output_events: 0,
            finish_seen: false,
            finished: false,
            done: false,
            ended: false,
            strip_usage: false,
            on_end: None,
            provider,
            hold: None,
            rejected: None,
            first_output_at: None,
            joined: BytesMut::new(),
            foreign: None,
            neutral: Vec::new(),
            translated: BytesMut::new(),
            unreleased: Vec::new(),
        }
    }

    fn on_data(&mut self, chunk: Bytes) {
        let base = self.scanner.offset();
        let Self {
            config,
            scanner,
            state,
            decisions,
            memo,
            pending_failure,
            identity,
            output_events,
            finish_seen,
            finished,
            done,
            strip_usage,
            hold,
            first_output_at,
            foreign,
            neutral,
            translated,
            unreleased,
            ..
        } = self;
        decisions.clear();
        let mut feed = Feed {
            config,
            state,
            decisions,
            memo,
            pending_failure,
            identity,
            output_events,
            finish_seen,
            finished,
            done,
            strip_usage: *strip_usage,
            hold,
            first_output_at,
            released_after: None,
            foreign,
            neutral,
            translated,
            unreleased,
        };
        scanner.feed(&chunk, |item| feed.item(item));
        let released_after = feed.released_after;
        if let Some(held_events) = released_after {
            // Released in this frame: what was held goes out with it.
            for _ in 0..held_events {
                self.state.add_output_event();
            }
        }
        self.apply_decisions(chunk, base);
        if self.hold.is_none() {
            self.translate_unreleased();
        }
        if !self.translated.is_empty() {
            self.out
                .push_back(Frame::data(self.translated.split().freeze()));
        }
        if self.pending_failure.is_none() && !self.done {
            self.check_hold();
        }
        if self.pending_failure.is_some() {
            self.held.clear();
            self.fail_pending();
        } else if self.done {
            self.held.clear();
            self.release();
            self.state.set_status(StreamStatus::Finished);
            self.end("finished");
        } else if self.finished && self.state.status() != StreamStatus::Finished {
            self.state.set_status(StreamStatus::Finished);
        } else if !self.finished && self.state.status() == StreamStatus::Finished {
            // A choice appeared after the others had finished: open again.
            self.state.set_status(StreamStatus::Committed);
        }
    }

    /// While held back (the window is checked per event, in `on_data`):
    /// releases at the memory cap once output is held; a bare preamble over
    /// the cap fails.
    fn check_hold(&mut self) {
        let Some(hold) = &self.hold else {
            return;
        };
        let queued: u64 = self
            .out
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum::<u64>()
            + self.held.iter().map(|b| b.len() as u64).sum::<u64>()
            + self
                .unreleased
                .iter()
                .map(|e| e.data().len() as u64)
                .sum::<u64>();
        if queued > hold.settings.max_held_bytes {
            if self.output_events > 0 {
                return self.release();
            }
            self.pending_failure = Some(Box::new(FailureKind::HeldOversize));
        }
    }

    /// Ends the hold: what is queued goes to the client, and the output
    /// events held so far count as sent.
    fn release(&mut self) {
        if self.hold.take().is_none() {
            return;
        }
        for _ in 0..self.output_events {
            self.state.add_output_event();
        }
        self.translate_unreleased();
        if !self.translated.is_empty() {
            self.out
                .push_back(Frame::data(self.translated.split().freeze()));
        }
    }

    /// Translates the events a translated stream held before commit, in
    /// order, into `translated`.
    fn translate_unreleased(&mut self) {
        let Some(reader) = self.foreign.as_deref_mut() else {
            return;
        };
        for event in self.unreleased.drain(..) {
            translate(
                &self.config.dialect,
                &mut self.memo,
                reader,
                &mut self.neutral,
                self.strip_usage,
                &event,
                &mut self.translated,
            );
        }
    }

    /// Whether another upstream frame may join the queued ones: data is
    /// queued, nothing ends the queue (trailers, the end of the stream) and
    /// the join stays bounded.
    fn may_join_more(&self) -> bool {
        !self.ended
            && !self.out.is_empty()
            && self.out.len() < MAX_JOINED_FRAMES
            && self.out.back().is_some_and(Frame::is_data)
    }

    /// The next frame for the client. The data frames queued together (a
    /// released preamble, the pieces around a dropped usage event, the
    /// events of one upstream read, the terminal event after the last
    /// pieces) go out as one frame, so the client gets one write per
    /// upstream read. A frame queued alone goes out as it is, the very same
    /// `Bytes`.
    fn next_frame(&mut self) -> Option<Frame<Bytes>> {
        let first = self.out.pop_front()?;
        let ready_data = self.out.iter().take_while(|f| f.is_data()).count();
        if ready_data == 0 || !first.is_data() {
            return Some(first);
        }
        let Ok(first) = first.into_data() else {
            return None; // cannot happen: checked above
        };
        let len = first.len()
            + self
                .out
                .iter()
                .take(ready_data)
                .filter_map(|f| f.data_ref().map(Bytes::len))
                .sum::<usize>();
        // Reuses the last join's allocation once that frame was dropped;
        // rounded up so that joins of slightly different sizes fit in it.
        self.joined
            .reserve(len.checked_next_power_of_two().unwrap_or(len));
        self.joined.extend_from_slice(&first);
        for _ in 0..ready_data {
            if let Some(Ok(data)) = self.out.pop_front().map(Frame::into_data) {
                self.joined.extend_from_slice(&data);
            }
        }
        Some(Frame::data(self.joined.split().freeze()))
    }

    /// Forwards or drops undecided bytes as decided, then holds the rest.
    fn apply_decisions(&mut self, chunk: Bytes, base: u64) {
        let end = base + chunk.len() as u64;
        // Fast path: nothing held, every event in this frame forwarded, and
        // the frame ends on an event boundary: forward the very same bytes.
        if self.held.is_empty()
            && self.decided == base
            && self
                .decisions
                .iter()
                .all(|d| matches!(d, Decision::Forward(_)))
            && matches!(self.decisions.last(), Some(Decision::Forward(upto)) if *upto == end)
        {
            self.decided = end;
            self.out.push_back(Frame::data(chunk));
            return;
        }
        for i in 0..self.decisions.len() {
            let (upto, forward) = match self.decisions[i] {
                Decision::Forward(upto) => (upto, true),
                Decision::Drop(upto) => (upto, false),
            };
            self.advance(&chunk, base, upto, forward);
        }
        if self.pending_failure.is_none() && !self.done && self.decided < end {
            let from = (self.decided.max(base) - base) as usize;
            self.held.push_back(chunk.slice(from..));
        }
    }

    fn advance(&mut self, chunk: &Bytes, base: u64, upto: u64, forward: bool) {
        while self.decided < upto {
            let want = (upto - self.decided) as usize;
            let piece = if let Some(front) = self.held.front_mut() {
                let piece = if front.len() <= want {
                    self.held.pop_front().unwrap_or_default()
                } else {
                    front.split_to(want)
                };
                if piece.is_empty() {
                    continue;
                }
                piece
            } else {
                let start = (self.decided - base) as usize;
                let stop = (upto - base) as usize;
                chunk.slice(start..stop.min(chunk.len()))
            };
            self.decided += piece.len() as u64;
            if forward {
                self.out.push_back(Frame::data(piece));
            }
        }
    }

    fn on_eof(&mut self) {
        let truncated = self.scanner.finish();
        self.held.clear();
        if self.done {
            return self.end("finished");
        }
        if self.finished {
            self.release();
            // Finished without the end marker: the answer is whole.
            let marker = self.end_marker();
            self.out.push_back(Frame::data(marker));
            self.state.set_status(StreamStatus::Finished);
            return self.end("finished, end marker added");
        }
        self.pending_failure = Some(Box::new(FailureKind::Truncated {
            cut_event: truncated.is_some_and(|t| t.had_data),
        }));
        self.fail_pending();
    }

    fn fail(&mut self, kind: FailureKind) {
        if self.ended {
            return;
        }
        self.pending_failure = Some(Box::new(kind));
        self.fail_pending();
    }

    fn fail_pending(&mut self) {
        let Some(kind) = self.pending_failure.take().map(|kind| *kind) else {
            return;
        };
        let queued: u64 = self
            .out
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        let bytes_sent = self.state.bytes_flushed() + queued;
        let phase = if self.output_events > 0 && self.hold.is_none() {
            Phase::Committed
        } else {
            Phase::Preamble
        };
        let classification = classify(
            &kind,
            &self.config.classifier,
            self.provider.as_deref(),
            phase,
        );
        if self.hold.is_some() {
            // Nothing was released: the failover loop may still reroute.
            self.out.clear();
            self.held.clear();
            self.unreleased.clear();
            let failure = StreamFailure {
                class: classification.class,
                phase,
                message: classification.message.clone(),
                provider_code: classification.provider_code.clone(),
                note: classification.note,
                bytes_sent: 0,
                output_events: self.output_events,
            };
            self.state.set_failure(failure, StreamStatus::Failed);
            self.rejected = Some(Box::new((classification, self.output_events)));
            self.ended = true;
            return;
        }
        let failure = StreamFailure {
            class: classification.class,
            phase,
            message: classification.message.clone(),
            provider_code: classification.provider_code.clone(),
            note: classification.note,
            bytes_sent,
            output_events: self.output_events,
        };
        if self.finished {
            // The answer was already whole: close it as finished and keep
            // the failure for the logs only.
            let marker = self.end_marker();
            self.out.push_back(Frame::data(marker));
            self.state.set_failure(failure, StreamStatus::Finished);
            return self.end("finished, then failed");
        }
        // The provider's message and transport chains stay in the log line
        // below and the records: the client gets the class's own message.
        let message = classification.class.client_message();
        let error = TerminalError {
            provider_code: classification.provider_code.clone(),
            bytes_sent,
            output_events: self.output_events,
            ..TerminalError::new(classification.class, phase, message)
        };
        // A translated stream's terminal carries the identity it was
        // written with, in the client's dialect.
        let identity = if self.foreign.is_some() {
            self.config.dialect.encoded_identity(&self.memo)
        } else {
            ChunkIdentity {
                id: self.identity.id.as_deref().map(Into::into),
                model: self.identity.model.as_deref().map(Into::into),
                created: self.identity.created,
            }
        };
        let terminal = self.config.dialect.stream_terminal(
            &self.memo,
            &identity,
            &self.config.finish_reason,
            &error,
            self.config.terminal_mode,
        );
        self.out.push_back(Frame::data(terminal));
        tracing::warn!(
            class = %failure.class,
            phase = %phase,
            bytes_sent,
            output_events = self.output_events,
            message = %failure.message,
            "stream failed; ended with a terminal chunk"
        );
        self.state.set_failure(failure, StreamStatus::Failed);
        self.ended = true;
    }

    /// The end-of-stream frame added after a finished stream that did not
    /// end itself: the dialect's, or a translated stream's end.
    fn end_marker(&mut self) -> Bytes {
        if self.foreign.is_none() {
            return self.config.dialect.done_frame();
        }
        self.config
            .dialect
            .encode_event(&NeutralEvent::End, &mut self.memo, &mut self.translated);
        self.translated.split().freeze()
    }

    fn end(&mut self, how: &'static str) {
        self.ended = true;
        tracing::debug!(
            how,
            output_events = self.output_events,
            bytes_flushed = self.state.bytes_flushed(),
            "stream ended"
        );
    }
}

/// What one frame's events update, borrowed from the inspector while the
/// scanner feeds the frame.
struct Feed<'a, D: Dialect> {
    config: &'a InspectConfig<D>,
    state: &'a StreamState,
    decisions: &'a mut Vec<Decision>,
    memo: &'a mut D::Memo,
    pending_failure: &'a mut Option<Box<FailureKind>>,
    identity: &'a mut StreamIdentity,
    output_events: &'a mut u64,
    finish_seen: &'a mut bool,
    finished: &'a mut bool,
    done: &'a mut bool,
    strip_usage: bool,
    hold: &'a mut Option<HoldState>,
    first_output_at: &'a mut Option<Instant>,
    /// Output events held back until the commit window, released in the
    /// middle of this frame: a failure after them is post-commit.
    released_after: Option<u64>,
    foreign: &'a mut Option<Box<dyn ForeignReader>>,
    neutral: &'a mut Vec<NeutralEvent>,
    translated: &'a mut BytesMut,
    unreleased: &'a mut Vec<crate::sse::SseEvent>,
}

impl<D: Dialect> Feed<'_, D> {
    fn item(&mut self, item: SseItem) {
        if self.pending_failure.is_some() || *self.done {
            return;
        }
        match item {
            SseItem::Event(event) => self.event(&event),
            // Comments and keep-alives: not translated (the translated
            // stream has events of its own).
            SseItem::Skipped { range } if self.foreign.is_some() => {
                self.decisions.push(Decision::Drop(range.end));
            }
            SseItem::Skipped { range } => self.decisions.push(Decision::Forward(range.end)),
            // Data that is not UTF-8 is a malformed event.
            SseItem::Error(error) if !error.is_fatal() => {
                let drop_to = match error {
                    crate::sse::SseError::InvalidUtf8 { range } => Some(range.end),
                    _ => None,
                };
                self.malformed(drop_to);
            }
            SseItem::Error(error) => {
                *self.pending_failure = Some(Box::new(FailureKind::Oversize(error.to_string())));
            }
        }
    }

    fn event(&mut self, event: &crate::sse::SseEvent) {
        let chunk = match self.foreign.as_deref_mut() {
            Some(reader) => reader.inspect(event),
            None => self.config.dialect.inspect(event, self.memo),
        };
        let end = event.range().end;
        update_identity(self.identity, self.state, &chunk.identity);
        if let Some(usage) = chunk.usage {
            self.state.set_usage(usage);
        }
        if let Some(reason) = &chunk.finish_reason
            && !*self.finish_seen
            && chunk.kind != ChunkKind::Error
        {
            *self.finish_seen = true;
            self.state.set_finish_reason(reason);
        }
        // Whole only when no choice is left open: with `n > 1`, one
        // choice's finish says nothing of the others (a bit test per event).
        if *self.finish_seen {
            *self.finished = !match self.foreign.as_deref() {
                Some(reader) => reader.answer_open(),
                None => self.config.dialect.answer_open(self.memo),
            };
        }
        match chunk.kind {
            ChunkKind::Output => {
                *self.output_events += 1;
                if self.first_output_at.is_none() {
                    *self.first_output_at = Some(Instant::now());
                }
                match self.hold {
                    Some(hold) => hold.output_bytes += event.data().len() as u64,
                    None => self.state.add_output_event(),
                }
                self.pass(event, end);
            }
            // Usage was turned on upstream to count spend; the client did
            // not ask for it.
            ChunkKind::Preamble
                if self.foreign.is_none()
                    && self.strip_usage
                    && chunk.usage.is_some()
                    && chunk.finish_reason.is_none() =>
            {
                self.decisions.push(Decision::Drop(end));
            }
            ChunkKind::Preamble => self.pass(event, end),
            // The end marker with no output and no finish reason: an empty
            // answer is not an answer (and before commit, another target
            // may give one).
            ChunkKind::Done if *self.output_events == 0 && !*self.finish_seen => {
                *self.pending_failure = Some(Box::new(FailureKind::Truncated { cut_event: false }));
            }
            ChunkKind::Done => {
                *self.done = true;
                self.pass(event, end);
            }
            ChunkKind::Error => {
                *self.pending_failure = Some(Box::new(FailureKind::InBand {
                    event: event.event().map(Bytes::copy_from_slice),
                    data: event.data().clone(),
                    facts: match self.foreign.as_deref() {
                        Some(reader) => reader.error_facts(event),
                        None => self.config.dialect.error_facts(ErrorSource::Event(event)),
                    },
                }));
            }
            ChunkKind::Malformed => self.malformed(Some(end)),
        }
        // The commit point is an event in stream order: what comes after
        // it, even in the same frame, is committed.
        if let Some(h) = self.hold.as_ref()
            && self.pending_failure.is_none()
            && (*self.finish_seen
                || *self.done
                || h.settings
                    .window
                    .reached(*self.output_events, h.output_bytes))
        {
            *self.hold = None;
            self.released_after = Some(*self.output_events);
        }
    }

    /// One rule in every phase: a malformed event is dropped and counted;
    /// more than the configured number fail the stream.
    /// Passes an event on: its bytes as they came or, from a target of
    /// another dialect, its translation (usage only when the client asked
    /// for it).
    fn pass(&mut self, event: &crate::sse::SseEvent, end: u64) {
        let Some(reader) = self.foreign.as_deref_mut() else {
            self.decisions.push(Decision::Forward(end));
            return;
        };
        self.decisions.push(Decision::Drop(end));
        if self.hold.is_some() {
            // Translated when released (never, if the attempt fails).
            self.unreleased.push(event.clone());
            return;
        }
        for held in self.unreleased.drain(..) {
            translate(
                &self.config.dialect,
                self.memo,
                reader,
                self.neutral,
                self.strip_usage,
                &held,
                self.translated,
            );
        }
        translate(
            &self.config.dialect,
            self.memo,
            reader,
            self.neutral,
            self.strip_usage,
            event,
            self.translated,
        );
    }

    fn malformed(&mut self, drop_to: Option<u64>) {
        if self.state.add_malformed() > self.config.max_malformed {
            *self.pending_failure = Some(Box::new(FailureKind::TooManyMalformed));
        } else if let Some(end) = drop_to {
            self.decisions.push(Decision::Drop(end));
        }
    }
}

/// Writes one event of a target's dialect in the client's: read by the
/// target's dialect into neutral events, written by the client's (usage
/// only when the client asked for it).
fn translate<D: Dialect>(
    dialect: &D,
    memo: &mut D::Memo,
    reader: &mut dyn ForeignReader,
    neutral: &mut Vec<NeutralEvent>,
    strip_usage: bool,
    event: &crate::sse::SseEvent,
    out: &mut BytesMut,
) {
    reader.decode(event, neutral);
    // One allocation for the frame's translation, not one per growth step
    // of the writer (an event's translation is about its own size).
    out.reserve(event.data().len() + 256);
    for each in neutral.drain(..) {
        if strip_usage && matches!(each, NeutralEvent::Usage(_)) {
            continue;
        }
        dialect.encode_event(&each, memo, out);
    }
}

impl<D: Dialect> Drop for Inspector<D> {
    fn drop(&mut self) {
        self.cancel_if_running();
        if let Some(on_end) = self.on_end.take() {
            on_end(&self.state.snapshot());
        }
    }
}

impl<D: Dialect> Inspector<D> {
    fn cancel_if_running(&mut self) {
        if self.state.status().is_terminal() {
            return;
        }
        // The client went away: the upstream body is dropped with us.
        let phase = if self.output_events > 0 && self.hold.is_none() {
            Phase::Committed
        } else {
            Phase::Preamble
        };
        let bytes_sent = self.state.bytes_flushed();
        tracing::info!(bytes_sent, %phase, "client went away; stream cancelled");
        self.state.set_failure(
            StreamFailure {
                class: crate::FailureClass::Cancelled,
                phase,
                message: "the client went away before the stream ended".to_owned(),
                provider_code: None,
                note: Some(Note::Cancelled),
                bytes_sent,
                output_events: self.output_events,
            },
            StreamStatus::Cancelled,
        );
    }
}

/// Copies the identity fields that changed; equal fields cost a comparison.
fn update_identity(local: &mut StreamIdentity, state: &StreamState, seen: &ChunkIdentity<'_>) {
    let mut changed = false;
    if let Some(id) = &seen.id
        && local.id.as_deref() != Some(id.as_ref())
    {
        local.id = Some(id.to_string());
        changed = true;
    }
    if let Some(model) = &seen.model
        && local.model.as_deref() != Some(model.as_ref())
    {
        local.model = Some(model.to_string());
        changed = true;
    }
    if seen.created.is_some() && local.created != seen.created {
        local.created = seen.created;
        changed = true;
    }
    if changed {
        state.set_identity(local.clone());
    }
}

impl<B, D: Dialect> StreamStateBody<B, D>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    D: Dialect,
{
    /// One step: reads one upstream frame, or fires a timer. Pending when
    /// neither is ready. Only called with an inspector.
    fn poll_progress(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let Some(inspector) = this.inspector.as_mut() else {
            return Poll::Ready(());
        };
        let had_output = inspector.output_events > 0;
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(_))) if this.deadline.as_ref().is_some_and(|d| d.is_elapsed()) => {
                inspector.fail(FailureKind::Deadline);
            }
            Poll::Ready(Some(Ok(frame))) => {
                if this.idle.is_some() {
                    *this.last_frame = Instant::now();
                }
                match frame.into_data() {
                    Ok(data) => inspector.on_data(data),
                    // Trailers pass through untouched.
                    Err(frame) => inspector.out.push_back(frame),
                }
            }
            Poll::Ready(Some(Err(error))) => inspector.fail(FailureKind::Body(error.into())),
            Poll::Ready(None) => inspector.on_eof(),
            Poll::Pending => {
                if let Some(shutdown) = this.shutdown.as_mut()
                    && shutdown.poll(cx).is_ready()
                {
                    inspector.fail(FailureKind::Shutdown);
                    return Poll::Ready(());
                }
                if let Some(deadline) = this.deadline.as_mut()
                    && deadline.poll(cx).is_ready()
                {
                    inspector.fail(FailureKind::Deadline);
                    return Poll::Ready(());
                }
                if let Some(timer) = this.hold_timer.as_mut()
                    && inspector.hold.is_some()
                    && timer.poll(cx).is_ready()
                {
                    if inspector.output_events == 0 {
                        inspector.fail(FailureKind::FirstOutput);
                    } else {
                        // The commit window's time limit: release.
                        inspector.release();
                    }
                    return Poll::Ready(());
                }
                if let Some(idle) = this.idle.as_mut()
                    && idle.poll(cx).is_ready()
                {
                    let timeout = inspector.config.idle_timeout.unwrap_or_default();
                    let due = this
                        .last_frame
                        .checked_add(timeout)
                        .unwrap_or(*this.last_frame);
                    if Instant::now() >= due {
                        inspector.fail(FailureKind::Idle(timeout));
                        return Poll::Ready(());
                    }
                    // Frames came since it was armed: wait out the rest.
                    idle.reset(due);
                    if idle.poll(cx).is_ready() {
                        return Poll::Ready(());
                    }
                }
                return Poll::Pending;
            }
        }
        // The first output while held back: the first-output deadline is
        // met, and the commit window's time limit (if any) starts.
        if !had_output && inspector.output_events > 0 {
            let after = inspector
                .hold
                .as_ref()
                .and_then(|h| h.settings.window.after_first_output);
            match after {
                Some(after) => {
                    let at = crate::time::later(Instant::now(), after);
                    match this.hold_timer.as_mut() {
                        Some(timer) => timer.reset(at),
                        None => *this.hold_timer = Some(Alarm::at(at)),
                    }
                }
                None => *this.hold_timer = None,
            }
        }
        // An upstream that never pauses still meets the hold's time limits.
        if inspector.hold.is_some()
            && this
                .hold_timer
                .as_ref()
                .is_some_and(|timer| timer.deadline() <= Instant::now())
        {
            if inspector.output_events == 0 {
                inspector.fail(FailureKind::FirstOutput);
            } else {
                inspector.release();
            }
        }
        Poll::Ready(())
    }
}

impl<B, D: Dialect> Body for StreamStateBody<B, D>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    D: Dialect,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.inspector.is_none() {
            return self
                .project()
                .inner
                .poll_frame(cx)
                .map(|frame| frame.map(|result| result.map_err(Into::into)));
        }
        // A held-back body is released before anything is handed out.
        if let Release::Failed { failure, .. } = std::task::ready!(self.as_mut().poll_release(cx)) {
            return Poll::Ready(Some(Err(failure.to_string().into())));
        }
        loop {
            let this = self.as_mut().project();
            let Some(inspector) = this.inspector.as_mut() else {
                return Poll::Ready(None);
            };
            // Join what the upstream connection has already read: hyper's
            // client hands its body over one chunk at a time, so the events
            // of one socket read arrive as separate frames with the
            // connection's task in between. Yield to let it decode the
            // next; only when yielding brings nothing more does the join go
            // out. Without this, every event costs the client a write.
            if inspector.may_join_more() {
                match self.as_mut().poll_progress(cx) {
                    Poll::Ready(()) => {
                        *self.as_mut().project().join_yields = 0;
                        continue;
                    }
                    Poll::Pending => {
                        let join_yields = self.as_mut().project().join_yields;
                        if *join_yields < MAX_JOIN_YIELDS {
                            *join_yields += 1;
                            // Deferred: tokio wakes the task once the
                            // worker has run its other ready tasks (the
                            // upstream connection's among them, which wakes
                            // this one sooner with the next chunk) and
                            // polled for I/O. A plain self-wake would be
                            // taken for an immediate re-poll by a server
                            // that absorbs self-wakes, as the gateway's
                            // connections do (its `repoll`).
                            let _ = std::pin::pin!(tokio::task::yield_now()).poll(cx);
                            return Poll::Pending;
                        }
                    }
                }
            }
            let this = self.as_mut().project();
            *this.join_yields = 0;
            let Some(inspector) = this.inspector.as_mut() else {
                return Poll::Ready(None);
            };
            if let Some(frame) = inspector.next_frame() {
                if let Some(data) = frame.data_ref() {
                    inspector.state.add_flushed(data.len() as u64);
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            if inspector.ended {
                return Poll::Ready(None);
            }
            std::task::ready!(self.as_mut().poll_progress(cx));
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inspector {
            None => self.inner.is_end_stream(),
            Some(inspector) => inspector.ended && inspector.out.is_empty(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inspector {
            None => self.inner.size_hint(),
            // Frames may be dropped or added: no exact size.
            Some(_) => SizeHint::default(),
        }
    }
}
