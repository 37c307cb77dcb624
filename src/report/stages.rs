//! The way bytes travel on each path, stage by stage (application → syscalls and kernel
//! copies → NIC → switch → NIC → kernel → application), each stage annotated with what
//! the run measured there and its provenance; stages a path skips are marked skipped.

use serde::Serialize;

use crate::evidence::{Evidence, ProvenanceKind, StepRecord, Verdict};
use crate::lab::PathKind;

/// How a stage takes part on a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The path goes through it.
    Active,
    /// The path bypasses it (kernel bypass, no peer CPU for one-sided operations).
    Skipped,
}

#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    pub label: String,
    pub role: Role,
    /// What was measured or what this stage does here, with provenance.
    pub note: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PathStages {
    pub path: PathKind,
    pub mark: &'static str,
    /// Run, left out (with reason), or absent from the lab.
    pub status: String,
    pub stages: Vec<Stage>,
}

fn stage(label: &str, role: Role, note: String) -> Stage {
    Stage {
        label: label.into(),
        role,
        note,
    }
}

/// The last passing traffic instance on a path: its metrics annotate the stages.
fn traffic(e: &Evidence, p: PathKind) -> Option<&StepRecord> {
    e.steps
        .iter()
        .rev()
        .find(|s| s.path == Some(p) && s.kind == "traffic" && s.verdict == Verdict::Pass)
}

fn metric(s: Option<&StepRecord>, name: &str) -> Option<String> {
    let s = s?;
    let m = s.metrics.get(name)?;
    let prov = s
        .provenance
        .as_ref()
        .map(|p| p.kind)
        .unwrap_or(ProvenanceKind::Modelled);
    Some(format!(
        "{} {} ({})",
        crate::report::terminal::fmt_num(m.value),
        m.unit,
        format!("{prov:?}").to_lowercase()
    ))
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "not measured in this run".into())
}

/// The three paths' stages for a run.
pub fn paths(e: &Evidence) -> Vec<PathStages> {
    PathKind::ALL
        .into_iter()
        .map(|p| {
            let status = if e.paths.contains(&p) {
                "run".to_string()
            } else if let Some(why) = e.excluded_paths.get(&p) {
                format!("not run: {why}")
            } else {
                "not part of this lab".to_string()
            };
            let t = traffic(e, p);
            // Every backend links its nodes in software (veth, virtio-net, …); an evidence
            // file that does not say how is taken as a real NIC.
            let nic = (!e.nic.is_empty()).then_some(e.nic.as_str());
            let stages = match p {
                PathKind::Tcp => vec![
                    stage("application", Role::Active, "send(buf) / recv(buf)".into()),
                    stage("syscalls", Role::Active, format!("a syscall per send and per recv · sender CPU {}", or_dash(metric(t, "sender_cpu_pct")))),
                    stage("kernel TCP/IP", Role::Active, format!("copies the payload; retransmits {}", or_dash(metric(t, "retransmits")))),
                    stage("NIC", Role::Active, nic.map_or("Ethernet NIC".into(), |n| format!("{n}: no NIC (soft)"))),
                    stage("Ethernet switch", Role::Active, "floods, then learns MACs".into()),
                    stage("NIC", Role::Active, nic.map_or("Ethernet NIC".into(), |n| format!("{n} (soft)"))),
                    stage("kernel TCP/IP", Role::Active, format!("copies again; receiver CPU {}", or_dash(metric(t, "receiver_cpu_pct")))),
                    stage("application", Role::Active, format!("throughput {}", or_dash(metric(t, "throughput_mbps")))),
                ],
                PathKind::Roce => vec![
                    stage("application", Role::Active, "ibv_post_send on registered memory".into()),
                    stage("verbs", Role::Active, "no syscall on the data path with an HCA; rxe (soft) rings its doorbell with write()".into()),
                    stage("kernel", Role::Skipped, "kernel bypass on hardware; with rxe (soft) the kernel does the transport".into()),
                    stage("RoCE NIC", Role::Active, "IB transport in UDP/IP, port 4791".into()),
                    stage("Ethernet switch", Role::Active, "lossless only if PFC/ECN are configured".into()),
                    stage("RoCE NIC", Role::Active, "DMA into the peer's registered memory".into()),
                    stage("peer CPU", Role::Skipped, "not involved in one-sided WRITE/READ".into()),
                    stage("application", Role::Active, format!("throughput {}", or_dash(metric(t, "throughput_mbps").or_else(|| metric(t, "bandwidth_gbps"))))),
                ],
                PathKind::Ib => vec![
                    stage("application", Role::Active, "the very same verbs as ②".into()),
                    stage("verbs", Role::Active, "no syscall on the data path".into()),
                    stage("kernel", Role::Skipped, "kernel bypass".into()),
                    stage("HCA", Role::Active, "port ACTIVE with a LID the SM assigned".into()),
                    stage("IB switch", Role::Active, format!("forwards by the LFT the SM wrote; credit-based, no congestion drops · switches crossed {}", or_dash(metric(t, "switches_crossed")))),
                    stage("HCA", Role::Active, format!("delivered {}", or_dash(metric(t, "delivered")))),
                    stage("peer CPU", Role::Skipped, "not involved in one-sided WRITE/READ".into()),
                    stage("application", Role::Active, format!("throughput {}", or_dash(metric(t, "throughput_mbps").or_else(|| metric(t, "bandwidth_gbps"))))),
                ],
            };
            PathStages { path: p, mark: p.mark(), status, stages }
        })
        .collect()
}
