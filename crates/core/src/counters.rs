//! Host-internal counters of one process, as data: what the kernel's own accounting says, read-class and
//! write-class syscalls and the bytes through them (`/proc/PID/io`), user and system CPU
//! time (`/proc/PID/stat`), context switches (`/proc/PID/status`).
//!
//! A process is sampled every 50 ms while it runs (its accounting and its network
//! namespace's interface byte counters, `/proc/PID/net/dev`) and read once more after it
//! has finished but before it is reaped: its parent waits with
//! `waitid(P_PID, pid, WEXITED | WNOWAIT)` (the zombie keeps its accounting), reads, then
//! reaps. The figures a step reports are those of the data phase: the span in which the
//! node's interfaces carried the transfer (setup and teardown left out, to within one
//! sample), found from the samples; the whole life is kept next to them.
//!
//! What the kernel counts, and so what these figures mean:
//! - `syscr`/`syscw` count read-class (`read`, `readv`, `pread`…) and write-class
//!   (`write`, `writev`, `pwrite`…) system calls through the VFS; `recvmsg`/`sendmsg`
//!   are not counted there. iperf3 moves its data with `read()`/`write()`; on rxe every
//!   verbs post is a `write()` on the uverbs file (the doorbell), so both are seen.
//! - `rchar`/`wchar` are the bytes passed through those calls: for TCP the payload copied
//!   between user space and the kernel.
//! - utime/stime sum every thread of the process (the kernel folds exited threads in);
//!   the context switches of `/proc/PID/status` are those of its main thread only.
//!
//! Sampling a live process is the host's business (`run::counters`); here are the
//! figures, their parsers, the data phase found in a timeline, and how a step records them.

use iblab_lab::names;
use serde::{Deserialize, Serialize};

/// Bytes received and transmitted (an interface's, or a node's summed).
pub use iblab_tools::netdev::Bytes;

/// One process's counters at its end: the whole life, and its data phase where one was
/// seen (see [`Sampler`]); and what its node's interfaces received while it ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessCounters {
    #[serde(flatten)]
    pub total: Counts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_phase: Option<DataPhase>,
    /// The bytes its node's interfaces (all but loopback) had received, at each sample:
    /// `(seconds after the process started, bytes)`, samples of its final network
    /// namespace only. A receiver's throughput over time is read from it ([`received_rate`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub received: Vec<(f64, u64)>,
}

impl std::ops::Deref for ProcessCounters {
    type Target = Counts;
    fn deref(&self) -> &Counts {
        &self.total
    }
}

impl From<Counts> for ProcessCounters {
    fn from(total: Counts) -> Self {
        ProcessCounters {
            total,
            data_phase: None,
            received: Vec::new(),
        }
    }
}

/// The span of a process's life in which its node's interfaces carried its data, and what
/// the process did in it (the difference of two samples of its accounting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DataPhase {
    pub counts: Counts,
    /// Seconds after the process started.
    pub from_s: f64,
    pub to_s: f64,
    /// Bytes the node's interfaces carried (both directions) in the span.
    pub wire_bytes: u64,
    /// … and over the whole life of the process.
    #[serde(default)]
    pub wire_total: u64,
}

impl DataPhase {
    /// The share of the process's traffic inside the span, to scale the bytes a tool says
    /// it moved down to those the span's counters go with.
    pub fn share(&self) -> f64 {
        if self.wire_total == 0 {
            1.0
        } else {
            (self.wire_bytes as f64 / self.wire_total as f64).clamp(0.0, 1.0)
        }
    }
}

/// The kernel's accounting of one process at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Read-class system calls (`syscr`).
    pub read_syscalls: u64,
    /// Write-class system calls (`syscw`).
    pub write_syscalls: u64,
    /// Bytes through the read-class calls (`rchar`).
    pub read_bytes: u64,
    /// Bytes through the write-class calls (`wchar`).
    pub write_bytes: u64,
    /// User CPU time, seconds.
    pub user_cpu_s: f64,
    /// System (kernel) CPU time, seconds.
    pub system_cpu_s: f64,
    pub voluntary_context_switches: u64,
    pub nonvoluntary_context_switches: u64,
}

/// What the texts of `/proc/PID/{io,stat,status}` lack for [`Counts::parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountsError {
    #[error("no `{0}` in the text")]
    NoField(&'static str),
    #[error("a stat line without `(comm)`")]
    NoCommand,
    #[error("no {0} in the stat line")]
    NoStatField(&'static str),
}

/// A sampler that reports in words (the kube backend's) takes the words.
impl From<CountsError> for String {
    fn from(e: CountsError) -> String {
        e.to_string()
    }
}

impl Counts {
    pub fn syscalls(&self) -> u64 {
        self.read_syscalls + self.write_syscalls
    }
    /// Bytes through read and write calls (for TCP: the payload copied to/from user space).
    pub fn copied_bytes(&self) -> u64 {
        self.read_bytes + self.write_bytes
    }
    pub fn cpu_s(&self) -> f64 {
        self.user_cpu_s + self.system_cpu_s
    }
    pub fn context_switches(&self) -> u64 {
        self.voluntary_context_switches + self.nonvoluntary_context_switches
    }

    /// Parse the texts of `/proc/PID/io`, `/proc/PID/stat` and `/proc/PID/status`
    /// (`ticks_per_s`: the clock tick, `sysconf(_SC_CLK_TCK)`).
    pub fn parse(
        io: &str,
        stat: &str,
        status: &str,
        ticks_per_s: f64,
    ) -> Result<Self, CountsError> {
        let field = |text: &str, key: &'static str| -> Result<u64, CountsError> {
            text.lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == key).then(|| v.trim().parse::<u64>().ok())?
                })
                .ok_or(CountsError::NoField(key))
        };
        // The command name is in parentheses and may hold anything: fields start after the
        // last ')'. There, index 0 is field 3 (state); utime is field 14, stime field 15.
        let rest = stat
            .rsplit_once(')')
            .map(|x| x.1)
            .ok_or(CountsError::NoCommand)?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize, name: &'static str| -> Result<f64, CountsError> {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .map(|t| t as f64 / ticks_per_s)
                .ok_or(CountsError::NoStatField(name))
        };
        Ok(Counts {
            read_syscalls: field(io, "syscr")?,
            write_syscalls: field(io, "syscw")?,
            read_bytes: field(io, "rchar")?,
            write_bytes: field(io, "wchar")?,
            user_cpu_s: ticks(11, "utime")?,
            system_cpu_s: ticks(12, "stime")?,
            voluntary_context_switches: field(status, "voluntary_ctxt_switches")?,
            nonvoluntary_context_switches: field(status, "nonvoluntary_ctxt_switches")?,
        })
    }

    /// What happened between `earlier` and `self` (saturating: counters only grow).
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            read_syscalls: self.read_syscalls.saturating_sub(earlier.read_syscalls),
            write_syscalls: self.write_syscalls.saturating_sub(earlier.write_syscalls),
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
            user_cpu_s: (self.user_cpu_s - earlier.user_cpu_s).max(0.0),
            system_cpu_s: (self.system_cpu_s - earlier.system_cpu_s).max(0.0),
            voluntary_context_switches: self
                .voluntary_context_switches
                .saturating_sub(earlier.voluntary_context_switches),
            nonvoluntary_context_switches: self
                .nonvoluntary_context_switches
                .saturating_sub(earlier.nonvoluntary_context_switches),
        }
    }

    /// The counters as `(name, value, unit)` per MiB moved, prefixed by `side`
    /// (`sender`/`receiver`), plus the raw totals.
    pub fn metrics(&self, side: &str, bytes_moved: u64) -> Vec<(String, f64, &'static str)> {
        let mut v = vec![
            (
                names::counter(side, "syscalls"),
                self.syscalls() as f64,
                "count",
            ),
            (names::counter(side, "cpu_user_s"), self.user_cpu_s, "s"),
            (names::counter(side, "cpu_system_s"), self.system_cpu_s, "s"),
            (
                names::counter(side, "context_switches"),
                self.context_switches() as f64,
                "count",
            ),
        ];
        if bytes_moved > 0 {
            let mib = bytes_moved as f64 / (1024.0 * 1024.0);
            v.extend([
                (
                    names::counter(side, "syscalls_per_mib"),
                    self.syscalls() as f64 / mib,
                    "syscalls/MiB",
                ),
                (
                    names::counter(side, "read_syscalls_per_mib"),
                    self.read_syscalls as f64 / mib,
                    "syscalls/MiB",
                ),
                (
                    names::counter(side, "write_syscalls_per_mib"),
                    self.write_syscalls as f64 / mib,
                    "syscalls/MiB",
                ),
                (
                    names::counter(side, "copied_bytes_per_mib"),
                    self.copied_bytes() as f64 / mib,
                    "B/MiB",
                ),
                (
                    names::counter(side, "cpu_s_per_mib"),
                    self.cpu_s() / mib,
                    "s/MiB",
                ),
                (
                    names::counter(side, "context_switches_per_mib"),
                    self.context_switches() as f64 / mib,
                    "switches/MiB",
                ),
            ]);
        }
        v
    }
}

/// Bytes received plus transmitted by every interface but loopback, from the text of
/// `/proc/PID/net/dev` (the interfaces of that process's network namespace).
pub fn wire_bytes(net_dev: &str) -> Option<u64> {
    wire(net_dev).map(|b| b.rx.saturating_add(b.tx))
}

/// Bytes received and transmitted by every interface but loopback, each summed, from the
/// text of `/proc/PID/net/dev`; `None` without such an interface or a readable text.
pub fn wire(net_dev: &str) -> Option<Bytes> {
    let ifaces = iblab_tools::netdev::parse(net_dev)?;
    let mut wire = ifaces.iter().filter(|(name, _)| *name != "lo").peekable();
    wire.peek()?;
    Some(wire.fold(Bytes::default(), |t, (_, b)| Bytes {
        rx: t.rx.saturating_add(b.rx),
        tx: t.tx.saturating_add(b.tx),
    }))
}

/// Throughput over time from a [`ProcessCounters::received`] timeline: one point per
/// interval between two samples, `[seconds at the interval's end, Mbit/s received in
/// it]` (bytes on the wire, headers included). Intervals shorter than 1 ms are merged
/// into the next.
pub fn received_rate(received: &[(f64, u64)]) -> Vec<[f64; 2]> {
    let mut out = Vec::new();
    let Some(mut from) = received.first().copied() else {
        return out;
    };
    for &(t, bytes) in &received[1..] {
        let dt = t - from.0;
        if dt < 1e-3 {
            continue;
        }
        let mbps = bytes.saturating_sub(from.1) as f64 * 8.0 / dt / 1e6;
        out.push([t, mbps]);
        from = (t, bytes);
    }
    out
}

/// One sample of a running process: its accounting and its node's wire bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub t_s: f64,
    pub counts: Counts,
    pub wire_bytes: Option<u64>,
    /// … of which received (`None` where only the sum was read).
    pub rx_bytes: Option<u64>,
    /// The network namespace the wire bytes are of (`ip netns exec` enters it only after
    /// the process has started).
    pub netns: Option<u64>,
}

/// A timeline longer than this is halved (every other sample kept, the interval doubled).
pub const MAX_SAMPLES: usize = 1024;
/// Below this many wire bytes in a process's life there is no data phase to speak of.
const MIN_WIRE_BYTES: u64 = 256 * 1024;

/// `None` without an end or a sample.
pub fn ended(mut samples: Vec<Sample>, t_end: f64, end: Option<Counts>) -> Option<ProcessCounters> {
    let end = end.or_else(|| samples.last().map(|s| s.counts))?;
    let last = samples
        .iter()
        .rev()
        .find(|s| s.wire_bytes.is_some())
        .copied();
    // What was received, as sampled: the end's figure is the last sample's, not a reading.
    let netns = last.and_then(|s| s.netns);
    let received = samples
        .iter()
        .filter(|s| s.netns == netns)
        .filter_map(|s| Some((s.t_s, s.rx_bytes?)))
        .collect();
    samples.push(Sample {
        t_s: t_end,
        counts: end,
        wire_bytes: last.and_then(|s| s.wire_bytes),
        rx_bytes: last.and_then(|s| s.rx_bytes),
        netns,
    });
    Some(ProcessCounters {
        total: end,
        data_phase: data_phase(&samples),
        received,
    })
}

/// The data phase of a sampled process: the intervals in which its node's interfaces
/// carried at least a tenth of their peak rate, from the first to the last, less the
/// first and the last of them (they also hold the end of the setup, such as the
/// handshake just before the data, and the start of the teardown), unless that would
/// leave nothing; what the process did in between. Only samples taken in the process's
/// final network namespace count. `None` when the wire carried too little to tell (under
/// 256 KiB) or there are too few samples.
pub fn data_phase(samples: &[Sample]) -> Option<DataPhase> {
    let netns = samples.iter().rev().find(|s| s.wire_bytes.is_some())?.netns;
    let pts: Vec<(f64, Counts, u64)> = samples
        .iter()
        .filter(|s| s.netns == netns)
        .filter_map(|s| Some((s.t_s, s.counts, s.wire_bytes?)))
        .collect();
    if pts.len() < 3 {
        return None;
    }
    let total = pts.last()?.2.saturating_sub(pts.first()?.2);
    if total < MIN_WIRE_BYTES {
        return None;
    }
    let rates: Vec<f64> = pts
        .windows(2)
        .map(|w| {
            let dt = (w[1].0 - w[0].0).max(1e-6);
            w[1].2.saturating_sub(w[0].2) as f64 / dt
        })
        .collect();
    let peak = rates.iter().cloned().fold(0.0, f64::max);
    let busy = |r: &f64| *r >= 0.1 * peak && *r > 0.0;
    let first = rates.iter().position(busy)?;
    let last = rates.iter().rposition(busy)?;
    let (start, end) = if last >= first + 2 {
        (&pts[first + 1], &pts[last])
    } else {
        (&pts[first], &pts[last + 1])
    };
    Some(DataPhase {
        counts: end.1.since(&start.1),
        from_s: start.0,
        to_s: end.0,
        wire_bytes: end.2.saturating_sub(start.2),
        wire_total: total,
    })
}

/// What a soft fabric's syscall figures mean (rxe's verbs post is a syscall).
pub const RXE_NOTE: &str = "on rxe (soft) a post is a write() syscall; on hardware the doorbell is a memory write and the data path makes no syscall";

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured on this machine from `dd if=/dev/zero of=/dev/null bs=4k` after 0.6 s.
    const DD_IO: &str = "rchar: 5276007232\nwchar: 5276000256\nsyscr: 1288096\nsyscw: 1288086\nread_bytes: 98304\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n";
    const DD_STAT: &str = "13174 (dd) R 13173 13171 9623 0 -1 4194304 136 0 1 0 19 37 0 0 20 0 1 0 487816 3039232 419 18446744073709551615 94685394874368 94685394927897 140732211542320 0 0 0 0 6 512 0 0 0 17 0 0 0 0 0 0 94685394955504 94685394957096 94685421289472 140732211546622 140732211546671 140732211546671 140732211548140 0\n";
    const DD_STATUS: &str = "Name:\tdd\nState:\tR (running)\nThreads:\t1\nvoluntary_ctxt_switches:\t4\nnonvoluntary_ctxt_switches:\t134\n";

    #[test]
    fn parses_captured_proc_texts() {
        let c = Counts::parse(DD_IO, DD_STAT, DD_STATUS, 100.0).unwrap();
        assert_eq!(c.read_syscalls, 1_288_096);
        assert_eq!(c.write_syscalls, 1_288_086);
        assert_eq!(c.read_bytes, 5_276_007_232);
        assert_eq!(c.write_bytes, 5_276_000_256);
        assert!((c.user_cpu_s - 0.19).abs() < 1e-9);
        assert!((c.system_cpu_s - 0.37).abs() < 1e-9);
        assert_eq!(c.context_switches(), 138);
        assert_eq!(c.syscalls(), 2_576_182);
        // A 4 KiB block per call: 256 reads and 256 writes per MiB.
        let m = c.metrics("sender", c.read_bytes);
        let per = |n: &str| m.iter().find(|x| x.0 == n).unwrap().1;
        assert!((per("sender_read_syscalls_per_mib") - 256.0).abs() < 0.1);
        assert!((per("sender_copied_bytes_per_mib") - 2.0 * 1048576.0).abs() < 10.0);
    }

    /// A command name with spaces and parentheses (captured: `/tmp/my (cat) x`; its utime
    /// and stime, 0 and 0 there, edited to 3 and 1 ticks).
    #[test]
    fn command_names_with_parentheses() {
        let stat = "13129 (my (cat) x) R 13125 13125 9623 0 -1 4194304 99 0 0 0 3 1 0 0 20 0 1 0 487648 3133440 380 18446744073709551615 94221452275712 94221452295593 140729517561744 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94221452311600 94221452313216 94222352953344 140729517566471 140729517566503 140729517566503 140729517567976 0";
        let io = "rchar: 6976\nwchar: 0\nsyscr: 10\nsyscw: 0\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n";
        let status =
            "Name:\tmy (cat) x\nvoluntary_ctxt_switches:\t0\nnonvoluntary_ctxt_switches:\t0\n";
        let c = Counts::parse(io, stat, status, 100.0).unwrap();
        assert_eq!(c.syscalls(), 10);
        assert!((c.user_cpu_s - 0.03).abs() < 1e-9);
        assert!((c.system_cpu_s - 0.01).abs() < 1e-9);
        // No bytes moved: totals only, no per-MiB figure.
        assert!(
            c.metrics("receiver", 0)
                .iter()
                .all(|m| !m.0.ends_with("per_mib"))
        );
    }

    #[test]
    fn wire_bytes_leave_out_loopback() {
        assert_eq!(wire_bytes(NET_DEV), Some(1_254_247_504 + 2_038_072));
        assert_eq!(
            wire_bytes("Inter-|\n face |\n    lo: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n"),
            None
        );
        assert_eq!(wire_bytes("garbage"), None);
    }

    fn at(t_s: f64, syscalls: u64, wire: u64) -> Sample {
        Sample {
            t_s,
            counts: Counts {
                read_syscalls: syscalls,
                ..Default::default()
            },
            wire_bytes: Some(wire),
            rx_bytes: Some(wire / 2),
            netns: Some(7),
        }
    }

    /// Setup (40 reads, a few hundred bytes of exchange); a 1 s transfer of 10 MB whose
    /// first 50 ms also hold the handshake's 30 reads and whose last 50 ms the start of
    /// the teardown's 10; 5 reads per 50 ms in between. The data phase is the 18 interior
    /// intervals: their 90 reads, with 90% of the traffic.
    #[test]
    fn the_data_phase_is_where_the_wire_is_busy() {
        let mut v = vec![at(0.0, 0, 0), at(0.05, 20, 300), at(0.10, 40, 600)];
        let mut reads = 40;
        for k in 1..=20 {
            reads += match k {
                1 => 30,
                20 => 10,
                _ => 5,
            };
            v.push(at(0.10 + 0.05 * k as f64, reads, 600 + 500_000 * k));
        }
        let end_wire = 600 + 500_000 * 20;
        v.push(at(1.15, reads + 5, end_wire + 200));
        v.push(at(1.20, reads + 10, end_wire + 400));
        // `ip netns exec` reads the host's counters before it enters the namespace.
        v.insert(
            0,
            Sample {
                netns: Some(1),
                ..at(0.0, 0, 1 << 40)
            },
        );
        let p = data_phase(&v).expect("a data phase");
        assert_eq!(p.counts.read_syscalls, 90);
        assert!(
            (p.from_s - 0.15).abs() < 1e-9 && (p.to_s - 1.05).abs() < 1e-9,
            "{p:?}"
        );
        assert_eq!(p.wire_bytes, 9_000_000);
        assert!((p.share() - 9_000_000.0 / (end_wire + 400) as f64).abs() < 1e-9);
        // A transfer of two intervals is not trimmed to nothing.
        let short = vec![
            at(0.0, 0, 0),
            at(0.05, 3, 400_000),
            at(0.10, 6, 800_000),
            at(0.15, 7, 800_100),
        ];
        let p = data_phase(&short).expect("a short data phase");
        assert_eq!((p.from_s, p.to_s, p.counts.read_syscalls), (0.0, 0.10, 6));
    }

    /// The receiving side's timeline: only the final namespace's samples, and the rate
    /// between each two of them.
    #[test]
    fn what_a_node_received_over_time() {
        let mut v: Vec<Sample> = (0..=10).map(|k| at(k as f64 * 0.05, k, 0)).collect();
        for (k, s) in v.iter_mut().enumerate() {
            // 125,000 bytes received per 50 ms: 20 Mbit/s; none in the last interval.
            s.rx_bytes = Some(125_000 * (k as u64).min(9));
            s.wire_bytes = s.rx_bytes.map(|r| r + 1000);
        }
        v.insert(
            0,
            Sample {
                netns: Some(1),
                rx_bytes: Some(1 << 40),
                ..at(0.0, 0, 1 << 40)
            },
        );
        let c = ended(v, 0.6, None).unwrap();
        assert_eq!(c.received.len(), 11, "the host's sample is left out");
        let r = received_rate(&c.received);
        assert_eq!(r.len(), 10);
        assert!(r[..9].iter().all(|p| (p[1] - 20.0).abs() < 1e-6), "{r:?}");
        assert_eq!(r[9][1], 0.0);
        assert!((r[0][0] - 0.05).abs() < 1e-9);
        // Two samples a microsecond apart make no point of their own.
        assert_eq!(
            received_rate(&[(0.0, 0), (0.0000001, 5), (0.1, 125_000)]),
            vec![[0.1, 10.0]]
        );
        assert!(received_rate(&[]).is_empty());
        assert!(
            received_rate(&[(0.0, 7)]).is_empty(),
            "one sample is no rate"
        );
    }

    #[test]
    fn no_data_phase_without_traffic_or_samples() {
        let idle: Vec<Sample> = (0..10).map(|k| at(k as f64 * 0.05, k, 100 * k)).collect();
        assert_eq!(data_phase(&idle), None);
        assert_eq!(data_phase(&[at(0.0, 0, 0), at(1.0, 9, 1 << 30)]), None);
        let unknown = Sample {
            wire_bytes: None,
            ..at(0.0, 0, 0)
        };
        assert_eq!(data_phase(&[unknown; 5]), None);
    }

    #[test]
    fn truncated_texts_are_errors() {
        assert!(Counts::parse("rchar: 1\n", DD_STAT, DD_STATUS, 100.0).is_err());
        assert!(Counts::parse(DD_IO, "13174 dd R", DD_STATUS, 100.0).is_err());
        assert!(Counts::parse(DD_IO, DD_STAT, "Name:\tdd\n", 100.0).is_err());
    }

    /// Captured on this machine: `/proc/self/net/dev` (loopback, two idle ifb devices, eth0).
    const NET_DEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  126454    2262    0    0    0     0          0         0   126454    2262    0    0    0     0       0          0
  ifb0:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  ifb1:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0: 1254247504   37530    0    0    0     0          0         0  2038072   25857    0    0    0     0       0          0
";
}
