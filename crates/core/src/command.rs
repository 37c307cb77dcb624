//! A command as iblab hands it to a node or a host, and what it left behind when it ended.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::counters::ProcessCounters;

/// One command to run in a node, with optional standard input.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cmd {
    pub argv: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Failure is expected and harmless (removing what may not be there).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub may_fail: bool,
}

impl Cmd {
    pub fn new(argv: &[&str]) -> Cmd {
        Cmd {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdin: None,
            may_fail: false,
        }
    }
    pub fn may_fail(mut self) -> Cmd {
        self.may_fail = true;
        self
    }
}

/// How much of each output stream (stdout, stderr) of one command iblab keeps: far more
/// than any tool it drives prints for a lab (iperf3's JSON for an hour of one stream is
/// ~5 MiB), and a bound on what a command that floods its output (a tool replaced by a
/// student in a pod they can enter) can make iblab hold. The rest is read and dropped,
/// and the kept text ends with a line that says so.
pub const OUTPUT_CAP: usize = 8 << 20;

/// One output stream as it is read, kept up to [`OUTPUT_CAP`] bytes.
#[derive(Debug, Default)]
pub struct Capture {
    kept: Vec<u8>,
    dropped: u64,
}

impl Capture {
    /// Take the next piece the stream gave.
    pub fn push(&mut self, bytes: &[u8]) {
        let room = OUTPUT_CAP.saturating_sub(self.kept.len());
        let take = room.min(bytes.len());
        self.kept.extend_from_slice(&bytes[..take]);
        self.dropped += (bytes.len() - take) as u64;
    }
    /// Bytes past the cap that were dropped.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
    /// The text kept, with a last line naming the cap and what was dropped, if any was.
    pub fn text(self) -> String {
        let mut t = String::from_utf8_lossy(&self.kept).into_owned();
        if self.dropped > 0 {
            t.push_str(&cut_note(self.dropped));
        }
        t
    }
}

/// The line that ends an output cut at [`OUTPUT_CAP`].
fn cut_note(dropped: u64) -> String {
    format!(
        "\n{CUT_NOTE_START}{} MiB; {dropped} more bytes were read and dropped]\n",
        OUTPUT_CAP >> 20
    )
}
const CUT_NOTE_START: &str = "[iblab: this output was cut at ";

/// The bytes dropped from an output that [`Capture`] cut, read from its last line (`None`:
/// it was not cut).
pub fn cut_bytes(text: &str) -> Option<u64> {
    let last = text.trim_end().rsplit('\n').next()?;
    let rest = last.strip_prefix(CUT_NOTE_START)?;
    let (_, dropped) = rest.split_once("; ")?;
    dropped.split(' ').next()?.parse().ok()
}

/// What a finished command left behind.
#[derive(Debug, Clone, Serialize)]
pub struct ExecOutput {
    /// Exit code; `None` when killed by a signal or at the deadline.
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub duration: Duration,
    pub timed_out: bool,
    /// The kernel's accounting of the process at its end (read before it was reaped);
    /// `None` where the platform does not let us read it (killed at the deadline, run by a
    /// container engine).
    pub counters: Option<ProcessCounters>,
}

impl ExecOutput {
    /// A command that ended with `code` having printed `stderr` only: what a parser of a
    /// tool's refusal reads (tests on captured output).
    pub fn exited(code: i32, stderr: &str) -> ExecOutput {
        ExecOutput {
            exit_code: Some(code),
            stdout: String::new(),
            stderr: stderr.into(),
            duration: Duration::ZERO,
            timed_out: false,
            counters: None,
        }
    }

    /// A command killed at its deadline: no output kept, no exit code, no counters.
    pub fn killed_at_deadline(timeout: Duration, started: Instant) -> ExecOutput {
        ExecOutput {
            exit_code: None,
            stdout: String::new(),
            stderr: format!(
                "killed after {:.1}s: deadline reached",
                timeout.as_secs_f64()
            ),
            duration: started.elapsed(),
            timed_out: true,
            counters: None,
        }
    }

    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

#[cfg(test)]
mod capture_tests {
    use super::*;

    #[test]
    fn a_flood_is_kept_to_the_cap_and_says_so() {
        let mut c = Capture::default();
        let piece = vec![b'y'; 1 << 20];
        for _ in 0..10 {
            c.push(&piece);
        }
        assert_eq!(c.dropped(), 2 << 20);
        let t = c.text();
        assert!(t.len() < OUTPUT_CAP + 200);
        assert!(
            t.ends_with("2097152 more bytes were read and dropped]\n"),
            "{}",
            &t[t.len() - 120..]
        );
        assert_eq!(cut_bytes(&t), Some(2 << 20), "the cut is read back");
        let mut small = Capture::default();
        small.push(b"hello");
        assert_eq!(small.text(), "hello");
        assert_eq!(cut_bytes("hello"), None);
        assert_eq!(cut_bytes(""), None);
        assert_eq!(
            cut_bytes("[iblab: this output was cut at 8 MiB; x more"),
            None
        );
    }
}
