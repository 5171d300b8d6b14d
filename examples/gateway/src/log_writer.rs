//! The gateway's log writer: a line is appended to a shared buffer on the
//! thread that logged it, and a thread of its own writes the buffer out
//! in one write per batch, a batch being what gathered for
//! [`BatchedWriter::interval`] after its first line (less when the buffer
//! passes its high-water mark).
//!
//! Not `tracing-appender`'s non-blocking writer, which this replaced: it
//! copies every line into a new `Vec`, sends it down a channel, and its
//! thread, parked on that channel, is woken for nearly every line of a
//! gateway that is not saturated (a futex call, a context switch and a
//! `write` per line). Here a line costs a lock and a copy. After a batch
//! the thread looks for lines at its interval for [`LINGER`] intervals
//! before it parks, so a line that comes within them wakes nobody; only
//! the first line after a quiet spell does.
//!
//! Why the linger: a turn's line is written before its answer's last
//! bytes go out, and on this project's 2-core VM the wake-up it caused
//! (the thread parked between two streams of a lightly loaded gateway)
//! delayed the end of each stream by about 0.1 ms (a paced stream at one
//! connection, as shipped against `RUST_LOG=warn`).
//!
//! Never lossy: a line waits for room when the buffer is at its ceiling
//! (the sink is slower than the log), and after [`FlushGuard`] is dropped
//! lines are written straight to the sink.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes gathered before the writing thread is woken early.
const HIGH_WATER: usize = 64 * 1024;
/// Bytes at which a line waits for the writing thread (lossless).
const CEILING: usize = 1024 * 1024;
/// Intervals the writing thread keeps looking for lines after a batch
/// before it parks (one second at the gateway's 20 ms).
pub const LINGER: u32 = 50;

/// What the writing thread is doing, so that a line wakes it only when it
/// waits for that line (a `Condvar` notification is a system call even
/// when nobody waits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flusher {
    /// Parked until the first line of a batch wakes it.
    Idle,
    /// Looks for lines at each interval, unwoken: after a batch, for
    /// [`LINGER`] intervals.
    Lingering,
    /// Lets a batch gather; woken early by the high-water mark.
    Gathering,
    /// Woken, or writing a batch.
    Busy,
}

#[derive(Debug)]
struct State {
    buffer: Vec<u8>,
    flusher: Flusher,
    /// The guard was dropped: the thread writes what is left and ends.
    closing: bool,
    /// The thread has ended: lines go straight to the sink.
    closed: bool,
    /// Times a line woke the writing thread.
    wakes: u64,
}

struct Shared<W> {
    state: Mutex<State>,
    /// The writing thread waits here.
    wake: Condvar,
    /// Lines waiting for room wait here.
    room: Condvar,
    sink: Mutex<W>,
    interval: Duration,
}

impl<W> Shared<W> {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the buffer whole: go on.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sink(&self) -> MutexGuard<'_, W> {
        self.sink.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writing thread waits one interval (less if woken) as `flusher`.
    fn wait_interval<'a>(
        &self,
        mut state: MutexGuard<'a, State>,
        flusher: Flusher,
    ) -> MutexGuard<'a, State> {
        state.flusher = flusher;
        self.wake
            .wait_timeout(state, self.interval)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }
}

/// A `MakeWriter` for the log layer that batches lines for a sink
/// (stderr in the gateway). Cheap to clone.
pub struct BatchedWriter<W> {
    shared: Arc<Shared<W>>,
}

impl<W> Clone for BatchedWriter<W> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<W> std::fmt::Debug for BatchedWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchedWriter")
            .field("interval", &self.shared.interval)
            .finish_non_exhaustive()
    }
}

/// Writes what is left and stops the writing thread when dropped; later
/// lines go straight to the sink.
#[must_use = "dropping the guard stops the batching"]
pub struct FlushGuard<W: Write + Send + 'static> {
    shared: Arc<Shared<W>>,
    thread: Option<JoinHandle<()>>,
}

impl<W: Write + Send + 'static> std::fmt::Debug for FlushGuard<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlushGuard").finish_non_exhaustive()
    }
}

impl<W: Write + Send + 'static> BatchedWriter<W> {
    /// Starts the writing thread (`gateway-log`) for `sink`. A batch
    /// gathers for `interval` after its first line.
    pub fn new(sink: W, interval: Duration) -> io::Result<(Self, FlushGuard<W>)> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                buffer: Vec::with_capacity(HIGH_WATER),
                flusher: Flusher::Busy,
                closing: false,
                closed: false,
                wakes: 0,
            }),
            wake: Condvar::new(),
            room: Condvar::new(),
            sink: Mutex::new(sink),
            interval,
        });
        let thread = std::thread::Builder::new()
            .name("gateway-log".to_owned())
            .spawn({
                let shared = Arc::clone(&shared);
                move || write_batches(&shared)
            })?;
        Ok((
            Self {
                shared: Arc::clone(&shared),
            },
            FlushGuard {
                shared,
                thread: Some(thread),
            },
        ))
    }

    /// How long a batch gathers after its first line.
    pub fn interval(&self) -> Duration {
        self.shared.interval
    }

    /// Times a line has woken the writing thread so far.
    pub fn wakes(&self) -> u64 {
        self.shared.state().wakes
    }

    fn append(&self, line: &[u8]) -> io::Result<()> {
        let shared = &*self.shared;
        let mut state = shared.state();
        // Lossless: wait for the writing thread rather than drop a line.
        while !state.closed && !state.buffer.is_empty() && state.buffer.len() + line.len() > CEILING
        {
            if state.flusher != Flusher::Busy {
                state.flusher = Flusher::Busy;
                shared.wake.notify_one();
            }
            state = shared
                .room
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if state.closed {
            drop(state);
            let mut sink = shared.sink();
            sink.write_all(line)?;
            return sink.flush();
        }
        state.buffer.extend_from_slice(line);
        let wake = match state.flusher {
            Flusher::Idle => true,
            Flusher::Lingering | Flusher::Gathering => state.buffer.len() >= HIGH_WATER,
            Flusher::Busy => false,
        };
        if wake {
            state.flusher = Flusher::Busy;
            state.wakes += 1;
            drop(state);
            shared.wake.notify_one();
        }
        Ok(())
    }
}

/// The writing thread: looks for lines at each interval for a while after
/// a batch, then waits for a first line; lets the batch gather, takes the
/// buffer (leaving its spare in its place) and writes it.
fn write_batches<W: Write>(shared: &Shared<W>) {
    let mut spare = Vec::with_capacity(HIGH_WATER);
    let mut state = shared.state();
    loop {
        // Lines found at a look go out at once: none waited more than an
        // interval for it.
        let mut lingered = 0;
        while state.buffer.is_empty() && !state.closing && lingered < LINGER {
            state = shared.wait_interval(state, Flusher::Lingering);
            lingered += 1;
        }
        let gathered = !state.buffer.is_empty() && lingered > 0;
        while state.buffer.is_empty() && !state.closing {
            state.flusher = Flusher::Idle;
            state = shared
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if state.buffer.is_empty() {
            break;
        }
        if !gathered && !state.closing && state.buffer.len() < HIGH_WATER {
            state = shared.wait_interval(state, Flusher::Gathering);
        }
        state.flusher = Flusher::Busy;
        std::mem::swap(&mut state.buffer, &mut spare);
        drop(state);
        shared.room.notify_all();
        {
            let mut sink = shared.sink();
            // Nowhere to report a failing stderr: the batch is dropped.
            let _ = sink.write_all(&spare).and_then(|()| sink.flush());
        }
        spare.clear();
        // A burst that grew the buffer does not keep its memory.
        if spare.capacity() > 4 * HIGH_WATER {
            spare = Vec::with_capacity(HIGH_WATER);
        }
        state = shared.state();
    }
    state.closed = true;
    drop(state);
    shared.room.notify_all();
}

impl<W: Write + Send + 'static> Drop for FlushGuard<W> {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.closing = true;
        state.flusher = Flusher::Busy;
        drop(state);
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // The thread is gone (even if it panicked): later lines go to the
        // sink directly.
        let mut state = self.shared.state();
        state.closed = true;
        let left = std::mem::take(&mut state.buffer);
        drop(state);
        self.shared.room.notify_all();
        if !left.is_empty() {
            let mut sink = self.shared.sink();
            let _ = sink.write_all(&left).and_then(|()| sink.flush());
        }
    }
}

/// One line's writer, as the log layer asks for per event.
#[derive(Debug)]
pub struct LineWriter<'a, W>(&'a BatchedWriter<W>);

impl<W: Write + Send + 'static> Write for LineWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.append(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.append(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a, W: Write + Send + 'static> tracing_subscriber::fmt::MakeWriter<'a> for BatchedWriter<W> {
    type Writer = LineWriter<'a, W>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(self)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    /// A sink that keeps what it was given and counts its writes.
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Kept {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut kept = self.0.lock().unwrap();
            kept.0.extend_from_slice(buf);
            kept.1 += 1;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Kept {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().0.clone()).unwrap()
        }
        fn writes(&self) -> usize {
            self.0.lock().unwrap().1
        }
    }

    fn line(writer: &BatchedWriter<Kept>, text: &str) {
        writer.make_writer().write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn a_batch_is_one_write() {
        let sink = Kept::default();
        // An interval no test run reaches: the batch goes out at the drop.
        let (writer, guard) = BatchedWriter::new(sink.clone(), Duration::from_secs(600)).unwrap();
        for i in 0..100 {
            line(&writer, &format!("line {i}\n"));
        }
        assert_eq!(sink.writes(), 0, "nothing is written before the interval");
        drop(guard);
        assert_eq!(sink.writes(), 1, "the hundred lines went out in one write");
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(sink.text(), expected);
    }

    #[test]
    fn a_batch_goes_out_when_its_interval_has_passed() {
        let sink = Kept::default();
        let (writer, _guard) = BatchedWriter::new(sink.clone(), Duration::from_millis(20)).unwrap();
        line(&writer, "one\n");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sink.writes() == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            sink.text(),
            "one\n",
            "written without a drop or another line"
        );
    }

    /// Waits (bounded) until `done` holds.
    fn eventually(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn lines_within_the_linger_wake_nobody_and_the_first_after_it_wakes_once() {
        let sink = Kept::default();
        let (writer, _guard) = BatchedWriter::new(sink.clone(), Duration::from_millis(5)).unwrap();
        let mut expected = String::new();
        for i in 0..5 {
            let text = format!("line {i}\n");
            line(&writer, &text);
            expected.push_str(&text);
            eventually("written at the next look", || sink.text() == expected);
        }
        assert_eq!(writer.wakes(), 0, "the thread lingered: no line woke it");
        // Parked once the linger has passed with no line.
        eventually("parked", || writer.shared.state().flusher == Flusher::Idle);
        line(&writer, "after\n");
        expected.push_str("after\n");
        eventually("written after its wake", || sink.text() == expected);
        assert_eq!(writer.wakes(), 1, "the first line after the linger woke it");
    }

    #[test]
    fn lines_of_many_threads_are_all_kept_whole_and_in_each_threads_order() {
        let sink = Kept::default();
        let (writer, guard) = BatchedWriter::new(sink.clone(), Duration::from_millis(1)).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    // Enough to pass the ceiling many times over.
                    let pad = "x".repeat(200);
                    for i in 0..20_000 {
                        line(&writer, &format!("{t} {i} {pad}\n"));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        drop(guard);
        let text = sink.text();
        let mut next = [0usize; 4];
        for l in text.lines() {
            let mut parts = l.split(' ');
            let t: usize = parts.next().unwrap().parse().unwrap();
            let i: usize = parts.next().unwrap().parse().unwrap();
            assert_eq!(parts.next().map(str::len), Some(200), "a whole line");
            assert_eq!(i, next[t], "thread {t}'s lines in order, none lost");
            next[t] += 1;
        }
        assert_eq!(next, [20_000; 4]);
        assert!(sink.writes() < 40_000, "batched: {} writes", sink.writes());
    }

    #[test]
    fn dropping_the_guard_writes_what_is_left_and_later_lines_go_straight_out() {
        let sink = Kept::default();
        let (writer, guard) = BatchedWriter::new(sink.clone(), Duration::from_secs(3600)).unwrap();
        line(&writer, "before\n");
        drop(guard);
        assert_eq!(
            sink.text(),
            "before\n",
            "flushed at once, not after the hour"
        );
        line(&writer, "after\n");
        assert_eq!(sink.text(), "before\nafter\n");
    }
}
