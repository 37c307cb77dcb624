//! The way bytes travel on each path, stage by stage (application → syscalls and kernel
//! copies → NIC → switch → NIC → kernel → application), each stage annotated with what
//! the run measured there and its provenance; stages a path skips are marked skipped.

use serde::Serialize;

use crate::evidence::names;
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
                    stage("syscalls", Role::Active, format!("a syscall per send and per recv · sender CPU {}", or_dash(metric(t, names::SENDER_CPU_PCT)))),
                    stage("kernel TCP/IP", Role::Active, format!("copies the payload; retransmits {}", or_dash(metric(t, names::RETRANSMITS)))),
                    stage("NIC", Role::Active, nic.map_or("Ethernet NIC".into(), |n| format!("{n}: no NIC (soft)"))),
                    stage("Ethernet switch", Role::Active, "floods, then learns MACs".into()),
                    stage("NIC", Role::Active, nic.map_or("Ethernet NIC".into(), |n| format!("{n} (soft)"))),
                    stage("kernel TCP/IP", Role::Active, format!("copies again; receiver CPU {}", or_dash(metric(t, names::RECEIVER_CPU_PCT)))),
                    stage("application", Role::Active, format!("throughput {}", or_dash(metric(t, names::THROUGHPUT_MBPS)))),
                ],
                PathKind::Roce => vec![
                    stage("application", Role::Active, "ibv_post_send on registered memory".into()),
                    stage("verbs", Role::Active, "no syscall on the data path with an HCA; rxe (soft) rings its doorbell with write()".into()),
                    stage("kernel", Role::Skipped, "kernel bypass on hardware; with rxe (soft) the kernel does the transport".into()),
                    stage("RoCE NIC", Role::Active, "IB transport in UDP/IP, port 4791".into()),
                    stage("Ethernet switch", Role::Active, "lossless only if PFC/ECN are configured".into()),
                    stage("RoCE NIC", Role::Active, "DMA into the peer's registered memory".into()),
                    stage("peer CPU", Role::Skipped, "not involved in one-sided WRITE/READ".into()),
                    stage("application", Role::Active, format!("throughput {}", or_dash(metric(t, names::THROUGHPUT_MBPS).or_else(|| metric(t, "bandwidth_gbps"))))),
                ],
                PathKind::Ib => vec![
                    stage("application", Role::Active, "the very same verbs as ②".into()),
                    stage("verbs", Role::Active, "no syscall on the data path".into()),
                    stage("kernel", Role::Skipped, "kernel bypass".into()),
                    stage("HCA", Role::Active, "port ACTIVE with a LID the SM assigned".into()),
                    stage("IB switch", Role::Active, format!("forwards by the LFT the SM wrote; credit-based, no congestion drops · switches crossed {}", or_dash(metric(t, names::SWITCHES_CROSSED)))),
                    stage("HCA", Role::Active, format!("delivered {}", or_dash(metric(t, names::DELIVERED)))),
                    stage("peer CPU", Role::Skipped, "not involved in one-sided WRITE/READ".into()),
                    stage("application", Role::Active, format!("throughput {}", or_dash(metric(t, names::THROUGHPUT_MBPS).or_else(|| metric(t, "bandwidth_gbps"))))),
                ],
            };
            PathStages { path: p, mark: p.mark(), status, stages }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic_stages(backend: &str, nic: &str) -> Vec<String> {
        let mut e: Evidence =
            serde_json::from_str(include_str!("../../tests/fixtures/evidence/tcp-loss.json"))
                .unwrap();
        e.backend = backend.into();
        e.nic = nic.into();
        paths(&e)
            .into_iter()
            .find(|p| p.path == PathKind::Tcp)
            .unwrap()
            .stages
            .into_iter()
            .filter(|s| s.label == "NIC")
            .map(|s| s.note)
            .collect()
    }

    /// No backend has a NIC under path ①: the diagram says what the link is made of.
    #[test]
    fn the_nic_stage_says_what_the_backend_links_with() {
        for (backend, nic) in [("local", "veth"), ("docker", "veth"), ("vm", "virtio-net")] {
            let notes = nic_stages(backend, nic);
            assert_eq!(notes.len(), 2);
            assert!(
                notes.iter().all(|n| n.contains(nic) && n.contains("soft")),
                "{backend}: {notes:?}"
            );
            assert!(
                !notes.iter().any(|n| n.contains("Ethernet NIC")),
                "{backend}"
            );
        }
    }
}
