//! The output a run's pods send, bounded by construction. Whoever enters a lab pod can
//! write into the output of a command iblab runs there (`/proc/PID/fd/1`), with or without
//! newlines; whatever they write, iblab keeps at most [`STREAM_BYTES`] and [`STREAM_LINES`]
//! of each stream of a background command, at most [`RUN_BYTES`] of all of a run's
//! streams together, and never holds more than [`PENDING`] bytes of a line it has not
//! yet seen the end of. What is dropped is counted, written at the end of the log, and
//! reported to the executor ([`Budget::take_cuts`]), which fails the step it happened in.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// What one stream of a background command may write to its log.
pub const STREAM_BYTES: u64 = iblab_core::command::OUTPUT_CAP as u64;
/// Lines of one stream of a background command kept in its log.
pub const STREAM_LINES: u64 = 200_000;
/// What all of a run's captured streams may keep together (logs and the outputs of its
/// commands): a run's share of the operator's work directory, whatever its pods write.
pub const RUN_BYTES: u64 = 64 << 20;
/// The longest unfinished line held while looking for a marker line (the pid line, the
/// sampler's mark): longer, it is passed on as it is, and is no marker.
pub const PENDING: usize = 64 << 10;

/// A run's allowance for captured output, shared by every command it runs in its pods, and
/// the cuts made since the executor last asked.
#[derive(Debug)]
pub struct Budget {
    left: AtomicU64,
    cuts: Mutex<Vec<String>>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(RUN_BYTES)
    }
}

impl Budget {
    pub fn new(bytes: u64) -> Budget {
        Budget {
            left: AtomicU64::new(bytes),
            cuts: Mutex::new(Vec::new()),
        }
    }

    /// Take up to `want` bytes of the run's allowance; what was granted.
    pub fn take(&self, want: u64) -> u64 {
        let mut granted = 0;
        let _ = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                granted = left.min(want);
                Some(left - granted)
            });
        granted
    }

    /// Say that a stream was cut (`what`: which command's which stream, where).
    pub fn cut(&self, note: String) {
        self.cuts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(note);
    }

    /// The cuts since the last call.
    pub fn take_cuts(&self) -> Vec<String> {
        std::mem::take(&mut *self.cuts.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One stream's share: bytes and lines kept so far, and what was dropped.
#[derive(Debug, Default)]
pub struct Stream {
    bytes: u64,
    lines: u64,
    dropped: u64,
    /// The run's allowance ran out (not the stream's own).
    run_cap: bool,
    /// Its cut was reported.
    reported: bool,
}

impl Stream {
    /// The part of `chunk` this stream may keep, charged to it and to the run.
    pub fn admit<'a>(&mut self, chunk: &'a [u8], run: &Budget) -> &'a [u8] {
        let mut keep = chunk
            .len()
            .min(STREAM_BYTES.saturating_sub(self.bytes) as usize);
        // Up to and including the last line the line cap allows.
        let lines_left = STREAM_LINES.saturating_sub(self.lines) as usize;
        if lines_left == 0 {
            keep = 0;
        } else if let Some((at, _)) = chunk[..keep]
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(lines_left - 1)
        {
            keep = at + 1;
        }
        let granted = run.take(keep as u64) as usize;
        if granted < keep {
            self.run_cap = true;
        }
        let kept = &chunk[..granted];
        self.bytes += granted as u64;
        self.lines += kept.iter().filter(|b| **b == b'\n').count() as u64;
        self.dropped += (chunk.len() - granted) as u64;
        kept
    }

    /// Bytes dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// What cap cut this stream.
    fn cap(&self) -> String {
        if self.run_cap {
            format!("the run's {} MiB of captured output", RUN_BYTES >> 20)
        } else {
            format!(
                "{} MiB or {STREAM_LINES} lines a stream",
                STREAM_BYTES >> 20
            )
        }
    }

    /// The first time this stream drops anything, the note for the executor (`what`: the
    /// command and stream): said at once, while the step that caused it still runs (a
    /// flood can go on draining long after the step gave up waiting for its server).
    pub fn first_cut(&mut self, what: &str) -> Option<String> {
        if self.dropped == 0 || self.reported {
            return None;
        }
        self.reported = true;
        Some(format!(
            "output past the cap: {what} was cut at {} (what came after is counted at the end \
             of its log)",
            self.cap()
        ))
    }

    /// The line that ends a cut log, with all that was dropped; `None` when nothing was.
    pub fn log_tail(&self) -> Option<String> {
        (self.dropped > 0).then(|| {
            format!(
                "\n[iblab: this output was cut at {}; {} more bytes were read and dropped]\n",
                self.cap(),
                self.dropped
            )
        })
    }
}

/// The line that ends an output the run's allowance cut, and the note for the executor
/// (`dropped` bytes of `what`).
pub fn run_cut_note(what: &str, dropped: u64) -> (String, String) {
    let cap = format!("the run's {} MiB of captured output", RUN_BYTES >> 20);
    (
        format!("\n[iblab: this output was cut at {cap}; {dropped} more bytes were dropped]\n"),
        format!("output past the cap: {what} was cut at {cap}, {dropped} bytes dropped"),
    )
}

/// Splits a stream into complete lines for a reader that looks for marker lines, holding
/// at most [`PENDING`] bytes of an unfinished line.
#[derive(Debug, Default)]
pub struct Lines {
    pending: Vec<u8>,
}

/// A piece of a stream: a whole line (with its `\n`), or part of a line too long to be a
/// marker (passed on as it is).
#[derive(Debug, PartialEq)]
pub enum Piece {
    Line(Vec<u8>),
    Part(Vec<u8>),
}

impl Lines {
    /// Feed the next chunk; what can be passed on now.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let mut line = std::mem::take(&mut self.pending);
            line.extend_from_slice(&rest[..=nl]);
            out.push(Piece::Line(line));
            rest = &rest[nl + 1..];
        }
        self.pending.extend_from_slice(rest);
        if self.pending.len() > PENDING {
            out.push(Piece::Part(std::mem::take(&mut self.pending)));
        }
        out
    }

    /// The unfinished line left at the end of the stream.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_keeps_its_bytes_then_drops_and_counts() {
        let run = Budget::new(u64::MAX);
        let mut s = Stream::default();
        let big = vec![b'x'; STREAM_BYTES as usize + 10];
        assert_eq!(s.admit(&big, &run).len(), STREAM_BYTES as usize);
        assert_eq!(s.admit(b"more", &run).len(), 0);
        assert_eq!(s.dropped(), 14);
        let tail = s.log_tail().unwrap();
        assert!(
            tail.contains("8 MiB") && tail.contains("14 more bytes"),
            "{tail}"
        );
        let note = s.first_cut("iperf3 -s on b, stdout").unwrap();
        assert!(
            note.contains("iperf3 -s on b") && note.contains("8 MiB"),
            "{note}"
        );
        assert_eq!(s.first_cut("iperf3 -s on b, stdout"), None, "said once");
    }

    #[test]
    fn a_stream_keeps_whole_lines_up_to_its_line_cap() {
        let run = Budget::new(u64::MAX);
        let mut s = Stream::default();
        let lines = b"y\n".repeat(STREAM_LINES as usize + 5);
        let kept = s.admit(&lines, &run);
        assert_eq!(kept.len(), 2 * STREAM_LINES as usize);
        assert!(kept.ends_with(b"y\n"));
        assert_eq!(s.dropped(), 10);
        // Not even an unfinished line more.
        assert_eq!(s.admit(b"y", &run).len(), 0);
    }

    #[test]
    fn the_runs_allowance_is_shared_and_named_when_it_runs_out() {
        let run = Budget::new(10);
        let (mut a, mut b) = (Stream::default(), Stream::default());
        assert_eq!(a.admit(b"123456", &run), b"123456");
        assert_eq!(b.admit(b"abcdef", &run), b"abcd");
        assert_eq!(a.admit(b"z", &run).len(), 0);
        assert!(b.first_cut("x").unwrap().contains("the run's 64 MiB"));
        assert!(a.log_tail().unwrap().contains("the run's"));
        run.cut("one".into());
        assert_eq!(run.take_cuts(), ["one"]);
        assert!(run.take_cuts().is_empty());
    }

    #[test]
    fn lines_hold_no_more_than_pending() {
        let mut l = Lines::default();
        assert_eq!(
            l.feed(b"a\nb"),
            vec![Piece::Line(b"a\n".to_vec())],
            "an unfinished line waits"
        );
        assert_eq!(l.feed(b"c\n"), vec![Piece::Line(b"bc\n".to_vec())]);
        let long = vec![b'x'; PENDING + 1];
        let out = l.feed(&long);
        assert_eq!(out.len(), 1);
        assert!(matches!(&out[0], Piece::Part(p) if p.len() == PENDING + 1));
        assert_eq!(l.finish(), None);
        l.feed(b"tail");
        assert_eq!(l.finish(), Some(b"tail".to_vec()));
    }
}
