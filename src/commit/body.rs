use std::collections::VecDeque;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::failure::{FailureKind, classify};
use super::layer::StreamConfig;
use super::state::{StreamFailure, StreamIdentity, StreamPhase, StreamState};
use crate::classify::Phase;
use crate::dialect::{ChunkIdentity, ChunkKind, Dialect, TerminalError};
use crate::sse::{SseItem, SseScanner};

/// Boxed body error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// Response body of [`StreamStateService`](super::StreamStateService).
    ///
    /// Non-SSE bodies pass through untouched. An SSE body is scanned as it
    /// streams: complete events pass through as the original bytes (a frame
    /// holding only complete events is forwarded as the very same `Bytes`),
    /// an incomplete event is held back until its blank line arrives, and a
    /// failure ends the stream with the dialect's terminal chunk instead of
    /// the upstream's remaining bytes.
    pub struct StreamStateBody<B, D> {
        #[pin]
        inner: B,
        // Boxed so the body is `Unpin` whenever the upstream body is.
        idle: Option<Pin<Box<Sleep>>>,
        // When the last upstream frame arrived. The idle timer is re-armed
        // from it only when it fires: resetting a timer on every frame
        // would take the timer wheel's lock per frame.
        last_frame: Instant,
        // The turn's deadline, when the request carried a turn budget.
        deadline: Option<Pin<Box<Sleep>>>,
        inspector: Option<Inspector<D>>,
    }
}

impl<B, D> std::fmt::Debug for StreamStateBody<B, D> {
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

impl<B, D> StreamStateBody<B, D>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    D: Dialect,
{
    pub(crate) fn wrap_response(
        response: Response<B>,
        config: &Arc<StreamConfig<D>>,
        deadline: Option<Instant>,
    ) -> Response<Self> {
        // Not a stream, or one a layer inside already inspects (the
        // failover layer wraps its committed streams itself): leave it be.
        if !is_event_stream(&response) || response.extensions().get::<StreamState>().is_some() {
            return response.map(|inner| Self {
                inner,
                idle: None,
                last_frame: Instant::now(),
                deadline: None,
                inspector: None,
            });
        }
        let (mut parts, inner) = response.into_parts();
        // A terminal chunk may be added: the length is no longer known.
        parts.headers.remove(CONTENT_LENGTH);
        let state = StreamState::new();
        parts.extensions.insert(state.clone());
        let body = Self {
            inner,
            idle: config
                .idle_timeout
                .map(|timeout| Box::pin(tokio::time::sleep(timeout))),
            last_frame: Instant::now(),
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            inspector: Some(Inspector::new(Arc::clone(config), state)),
        };
        Response::from_parts(parts, body)
    }

    /// Wraps a stream body the caller already knows is SSE, sharing `state`.
    /// `strip_usage` drops usage-only chunks (the client did not ask for
    /// them); `on_end` runs once when the body is dropped, with the final
    /// snapshot.
    pub(crate) fn inspect(
        inner: B,
        config: &Arc<StreamConfig<D>>,
        state: StreamState,
        provider: Option<Arc<str>>,
        strip_usage: bool,
        deadline: Option<Instant>,
        on_end: Option<OnEnd>,
    ) -> Self {
        let mut inspector = Inspector::new(Arc::clone(config), state);
        inspector.strip_usage = strip_usage;
        inspector.provider = provider.or_else(|| config.provider.clone());
        inspector.on_end = on_end;
        Self {
            inner,
            idle: config
                .idle_timeout
                .map(|timeout| Box::pin(tokio::time::sleep(timeout))),
            last_frame: Instant::now(),
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            inspector: Some(inspector),
        }
    }
}

/// Runs once when an inspected stream's body is dropped.
pub(crate) type OnEnd = Box<dyn FnOnce(&super::StreamSnapshot) + Send + Sync>;

/// What to do with the undecided bytes up to an absolute offset.
#[derive(Debug, Clone, Copy)]
enum Decision {
    Forward(u64),
    Drop(u64),
}

struct Inspector<D> {
    config: Arc<StreamConfig<D>>,
    scanner: SseScanner,
    state: StreamState,
    /// Bytes of an incomplete event, not yet forwarded or dropped. They
    /// start at `decided`.
    held: VecDeque<Bytes>,
    /// Input bytes before this offset are forwarded or dropped.
    decided: u64,
    /// Reused for every frame so per-frame work allocates nothing.
    decisions: Vec<Decision>,
    out: VecDeque<Frame<Bytes>>,
    pending_failure: Option<FailureKind>,
    identity: StreamIdentity,
    output_events: u64,
    finished: bool,
    done: bool,
    ended: bool,
    strip_usage: bool,
    on_end: Option<OnEnd>,
    /// The provider classifier overrides match on.
    provider: Option<Arc<str>>,
}

impl<D: Dialect> Inspector<D> {
    fn new(config: Arc<StreamConfig<D>>, state: StreamState) -> Self {
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
            decisions: Vec::with_capacity(8),
            out: VecDeque::with_capacity(4),
            pending_failure: None,
            identity: StreamIdentity::default(),
            output_events: 0,
            finished: false,
            done: false,
            ended: false,
            strip_usage: false,
            on_end: None,
            provider,
        }
    }

    fn on_data(&mut self, chunk: Bytes) {
        let base = self.scanner.offset();
        let Self {
            config,
            scanner,
            state,
            decisions,
            pending_failure,
            identity,
            output_events,
            finished,
            done,
            strip_usage,
            ..
        } = self;
        decisions.clear();
        scanner.feed(&chunk, |item| {
            if pending_failure.is_some() || *done {
                return;
            }
            match item {
                SseItem::Event(event) => {
                    let chunk = config.dialect.inspect(&event);
                    update_identity(identity, state, &chunk.identity);
                    if let Some(usage) = chunk.usage {
                        state.set_usage(usage);
                    }
                    if let Some(reason) = &chunk.finish_reason
                        && !*finished
                        && chunk.kind != ChunkKind::Error
                    {
                        *finished = true;
                        state.set_finish_reason(reason);
                    }
                    match chunk.kind {
                        ChunkKind::Output => {
                            *output_events += 1;
                            state.add_output_event();
                            decisions.push(Decision::Forward(event.range().end));
                        }
                        ChunkKind::Preamble
                            if *strip_usage
                                && chunk.usage.is_some()
                                && chunk.finish_reason.is_none() =>
                        {
                            // Usage was turned on upstream to count spend;
                            // the client did not ask for it.
                            decisions.push(Decision::Drop(event.range().end));
                        }
                        ChunkKind::Preamble => {
                            decisions.push(Decision::Forward(event.range().end));
                        }
                        ChunkKind::Done => {
                            *done = true;
                            decisions.push(Decision::Forward(event.range().end));
                        }
                        ChunkKind::Error => {
                            *pending_failure = Some(FailureKind::InBand {
                                event: event.event().map(Bytes::copy_from_slice),
                                data: event.data().clone(),
                            });
                        }
                        ChunkKind::Malformed => {
                            if state.add_malformed() > config.max_malformed {
                                *pending_failure = Some(FailureKind::TooManyMalformed);
                            } else {
                                decisions.push(Decision::Drop(event.range().end));
                            }
                        }
                    }
                }
                SseItem::Skipped { range } => decisions.push(Decision::Forward(range.end)),
                SseItem::Error(error) if !error.is_fatal() => {
                    // Data that is not UTF-8 is a malformed chunk.
                    if state.add_malformed() > config.max_malformed {
                        *pending_failure = Some(FailureKind::TooManyMalformed);
                    } else if let crate::sse::SseError::InvalidUtf8 { range } = error {
                        decisions.push(Decision::Drop(range.end));
                    }
                }
                SseItem::Error(error) => {
                    *pending_failure = Some(FailureKind::Oversize(error.to_string()));
                }
            }
        });
        self.apply_decisions(chunk, base);
        if self.pending_failure.is_some() {
            self.held.clear();
            self.fail_pending();
        } else if self.done {
            self.held.clear();
            self.state.set_phase(StreamPhase::Finished);
            self.end("finished");
        } else if self.finished && self.state.phase() != StreamPhase::Finished {
            self.state.set_phase(StreamPhase::Finished);
        }
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
            // Finished without the end marker: the answer is whole.
            self.out
                .push_back(Frame::data(self.config.dialect.done_frame()));
            self.state.set_phase(StreamPhase::Finished);
            return self.end("finished, end marker added");
        }
        self.pending_failure = Some(FailureKind::Truncated {
            cut_event: truncated.is_some_and(|t| t.had_data),
        });
        self.fail_pending();
    }

    fn fail(&mut self, kind: FailureKind) {
        if self.ended {
            return;
        }
        self.pending_failure = Some(kind);
        self.fail_pending();
    }

    fn fail_pending(&mut self) {
        let Some(kind) = self.pending_failure.take() else {
            return;
        };
        let queued: u64 = self
            .out
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        let bytes_sent = self.state.bytes_flushed() + queued;
        let phase = if self.output_events > 0 {
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
            self.out
                .push_back(Frame::data(self.config.dialect.done_frame()));
            self.state.set_failure(failure, StreamPhase::Finished);
            return self.end("finished, then failed");
        }
        let error = TerminalError {
            message: if classification.message.is_empty() {
                format!("upstream failure: {}", classification.class)
            } else {
                classification.message.clone()
            },
            error_type: classification.openai_type().to_owned(),
            code: classification.openai_code(),
            phase,
            bytes_sent,
            output_events: self.output_events,
        };
        let identity = ChunkIdentity {
            id: self.identity.id.as_deref().map(Into::into),
            model: self.identity.model.as_deref().map(Into::into),
            created: self.identity.created,
        };
        let terminal = self.config.dialect.terminal(
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
        self.state.set_failure(failure, StreamPhase::Failed);
        self.ended = true;
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

impl<D> Drop for Inspector<D> {
    fn drop(&mut self) {
        self.cancel_if_running();
        if let Some(on_end) = self.on_end.take() {
            on_end(&self.state.snapshot());
        }
    }
}

impl<D> Inspector<D> {
    fn cancel_if_running(&mut self) {
        if self.state.phase().is_terminal() {
            return;
        }
        // The client went away: the upstream body is dropped with us.
        let phase = if self.output_events > 0 {
            Phase::Committed
        } else {
            Phase::Preamble
        };
        let bytes_sent = self.state.bytes_flushed();
        tracing::info!(bytes_sent, %phase, "client went away; stream cancelled");
        self.state.set_failure(
            StreamFailure {
                class: crate::classify::FailureClass::Cancelled,
                phase,
                message: "the client went away before the stream ended".to_owned(),
                provider_code: None,
                note: Some("cancelled"),
                bytes_sent,
                output_events: self.output_events,
            },
            StreamPhase::Cancelled,
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

impl<B, D> Body for StreamStateBody<B, D>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    D: Dialect,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let Some(inspector) = this.inspector.as_mut() else {
            return this
                .inner
                .poll_frame(cx)
                .map(|frame| frame.map(|result| result.map_err(Into::into)));
        };
        loop {
            if let Some(frame) = inspector.out.pop_front() {
                if let Some(data) = frame.data_ref() {
                    inspector.state.add_flushed(data.len() as u64);
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            if inspector.ended {
                return Poll::Ready(None);
            }
            match this.inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(_)))
                    if this.deadline.as_ref().is_some_and(|d| d.is_elapsed()) =>
                {
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
                Poll::Ready(Some(Err(error))) => {
                    inspector.fail(FailureKind::Body(error.into()));
                }
                Poll::Ready(None) => inspector.on_eof(),
                Poll::Pending => {
                    if let Some(deadline) = this.deadline.as_mut()
                        && deadline.as_mut().poll(cx).is_ready()
                    {
                        inspector.fail(FailureKind::Deadline);
                        continue;
                    }
                    if let Some(idle) = this.idle.as_mut()
                        && idle.as_mut().poll(cx).is_ready()
                    {
                        let timeout = inspector.config.idle_timeout.unwrap_or_default();
                        let due = this
                            .last_frame
                            .checked_add(timeout)
                            .unwrap_or(*this.last_frame);
                        if Instant::now() >= due {
                            inspector.fail(FailureKind::Idle(timeout));
                            continue;
                        }
                        // Frames came since it was armed: wait out the rest.
                        idle.as_mut().reset(due);
                        if idle.as_mut().poll(cx).is_ready() {
                            continue;
                        }
                    }
                    return Poll::Pending;
                }
            }
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
