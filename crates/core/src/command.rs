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
