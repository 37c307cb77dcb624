//! A step's host-internal counters in its record: per-MiB metrics for both sides of a
//! transfer and the raw counters in its detail.

use super::{Metric, StepRecord};
use crate::counters::ProcessCounters;
use iblab_lab::names;

/// Add both sides' counters of a data transfer to a step: per-MiB metrics (each side
/// normalised by the bytes the tool says it moved) and the raw counters in its detail
/// under `host_counters`.
pub fn record(
    rec: &mut StepRecord,
    sender: Option<ProcessCounters>,
    sender_bytes: u64,
    receiver: Option<ProcessCounters>,
    receiver_bytes: u64,
    note: &str,
) {
    // The receiver's node took the transfer in: its throughput over time, counted from
    // the receiving tool's start (the step's first process).
    rec.series = super::Series::of_receiver(receiver.as_ref());
    let mut detail = serde_json::Map::new();
    let mut scopes = Vec::new();
    for (side, c, bytes) in [
        ("sender", sender, sender_bytes),
        ("receiver", receiver, receiver_bytes),
    ] {
        match c {
            Some(mut c) => {
                // The timeline is the step's series, not repeated here.
                c.received = Vec::new();
                let (counts, phase_bytes) = match &c.data_phase {
                    Some(p) => {
                        rec.metrics.insert(
                            names::counter(side, "data_phase_s"),
                            Metric::new(p.to_s - p.from_s, "s"),
                        );
                        scopes.push(format!(
                            "{side}: data phase {:.2}–{:.2} s after it started, {:.0}% of its traffic",
                            p.from_s,
                            p.to_s,
                            100.0 * p.share()
                        ));
                        (p.counts, (bytes as f64 * p.share()) as u64)
                    }
                    None => {
                        scopes.push(format!(
                            "{side}: whole life (no data phase seen on its node's interfaces)"
                        ));
                        (c.total, bytes)
                    }
                };
                for (name, value, unit) in counts.metrics(side, phase_bytes) {
                    rec.metrics.insert(name, Metric::new(value, unit));
                }
                detail.insert(
                    side.into(),
                    serde_json::json!({
                        "counters": c,
                        "bytes_moved": bytes,
                        "bytes_in_data_phase": phase_bytes,
                    }),
                );
            }
            None => {
                detail.insert(
                    side.into(),
                    serde_json::json!("not readable here (the process was not ours to reap, or it was killed at the deadline)"),
                );
            }
        }
    }
    detail.insert(
        "source".into(),
        "the kernel's accounting of each tool process (/proc/PID/io, stat, status), sampled every 50 ms with its node's interface byte counters (/proc/PID/net/dev) and read once more after it exited, before it was reaped (by iblab on this host, by iblab's agent in a VM, by iblab's shell wrapper in a pod; a container engine's process, not iblab's to reap: its last sample). The figures are those of the data phase: the 50 ms intervals in which the node's interfaces carried at least a tenth of their peak rate, less the first and the last (which also hold the end of setup and the start of teardown), per MiB of the transfer's share in that span; where no data phase was seen, the whole life".into(),
    );
    detail.insert("scope".into(), scopes.join("; ").into());
    detail.insert("note".into(), note.into());
    if let Some(d) = rec.detail.as_object_mut() {
        d.insert("host_counters".into(), serde_json::Value::Object(detail));
    }
}
