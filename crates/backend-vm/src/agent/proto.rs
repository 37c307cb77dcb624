//! The agent protocol: one JSON object per line in each direction over the VM's
//! virtio-serial port. Requests carry an id; the answer to a request carries the same id.

use serde::{Deserialize, Serialize};

use iblab_core::counters::ProcessCounters;
#[cfg(test)]
use iblab_core::counters::{Counts, DataPhase};

/// The port's name inside the guest (`/sys/class/virtio-ports/*/name`).
pub const PORT_NAME: &str = "iblab.agent";

/// A request, with the id its answer will carry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Request {
    pub id: u64,
    #[serde(flatten)]
    pub op: Op,
}

/// What the host asks of the guest. Programs are argument vectors: no shell anywhere.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Op {
    /// Run to completion; killed (with its process group) at the deadline.
    Run {
        argv: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stdin: Option<String>,
        timeout_ms: u64,
        /// The node: the guest network namespace to run in (none: the guest's initial one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        netns: Option<String>,
    },
    /// Run to completion with its output sent as it comes ([`Body::Output`], under this
    /// request's id), then [`Body::Exited`]; killed (with its process group) at the
    /// deadline or when cancelled. `iblab exec` and `iblab shell` into a kept VM.
    Exec {
        argv: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stdin: Option<String>,
        timeout_ms: u64,
        /// The node's guest network namespace, as for `Run`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        netns: Option<String>,
    },
    /// Kill what the `Exec` request with id `of` runs (its user pressed Ctrl-C).
    Cancel { of: u64 },
    /// Start in the background; its output is kept until it is stopped.
    Spawn {
        argv: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        netns: Option<String>,
    },
    /// Make the guest this run's machine, after its boot or its restore from the
    /// booted-guest snapshot (which every run restores alike): the host's clock, a new RNG
    /// state from the host's seed, the run's identity (hostname, `/run/iblab/run`).
    Refresh {
        run: String,
        hostname: String,
        /// The host's wall clock: seconds and nanoseconds since the epoch.
        unix_s: i64,
        unix_ns: u32,
        /// Random bytes from the host, hex: mixed into the guest's pool before it reseeds.
        seed: String,
    },
    /// Stop a background process (after letting it end on its own for `grace_ms`:
    /// SIGTERM, then SIGKILL) and return its output and counters.
    Stop {
        handle: u64,
        #[serde(default)]
        grace_ms: u64,
    },
}

/// An answer (id 0: the unsolicited hello when the agent is ready).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Response {
    pub id: u64,
    #[serde(flatten)]
    pub body: Body,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Body {
    /// The agent is up: the guest's uptime then, and what it loaded.
    Hello {
        uptime_s: f64,
        kernel: String,
        modules_loaded: usize,
        /// How long loading them took, in seconds.
        #[serde(default)]
        modules_s: f64,
        #[serde(default)]
        problems: Vec<String>,
    },
    Done {
        exit_code: Option<i32>,
        stdout: String,
        stderr: String,
        duration_s: f64,
        timed_out: bool,
        /// The process's accounting at its end (read before it was reaped).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        counters: Option<ProcessCounters>,
    },
    /// Output of an `Exec` as it comes: `stream` is `stdout` or `stderr`.
    Output {
        stream: String,
        data: String,
    },
    /// The end of an `Exec`: its exit code, or the signal that ended it.
    Exited {
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        timed_out: bool,
    },
    /// Answer to `Cancel`: whether there was something to kill.
    Cancelled {
        found: bool,
    },
    Spawned {
        handle: u64,
    },
    Stopped {
        exit_code: Option<i32>,
        output: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        counters: Option<ProcessCounters>,
    },
    /// Answer to `Refresh`.
    Refreshed {
        uptime_s: f64,
        /// How far the guest's clock was from the host's before it was set, in seconds
        /// (a restored guest's clock is the snapshot's).
        clock_was_off_s: f64,
        /// Whether the kernel's RNG was reseeded from the new seed.
        reseeded: bool,
        #[serde(default)]
        problems: Vec<String>,
    },
    Error {
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_one_line() {
        let r = Request {
            id: 7,
            op: Op::Run {
                argv: vec!["ib_write_bw".into(), "-x".into(), "1".into()],
                stdin: None,
                timeout_ms: 5000,
                netns: Some("a".into()),
            },
        };
        let line = serde_json::to_string(&r).unwrap();
        assert!(!line.contains('\n'));
        assert!(line.contains("\"op\":\"run\""), "{line}");
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
        let a = Response {
            id: 7,
            body: Body::Stopped {
                exit_code: Some(0),
                output: "multi\nline".into(),
                counters: Some(ProcessCounters {
                    total: Counts {
                        read_syscalls: 12,
                        user_cpu_s: 0.25,
                        ..Default::default()
                    },
                    data_phase: Some(DataPhase {
                        from_s: 0.5,
                        to_s: 2.5,
                        wire_bytes: 1 << 20,
                        ..Default::default()
                    }),
                    // What the node received, sample by sample: the step's throughput
                    // over time crosses the port with the counters.
                    received: vec![(0.05, 1_000), (0.1, 126_000)],
                }),
            },
        };
        let line = serde_json::to_string(&a).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), a);
    }
}
