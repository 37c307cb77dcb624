//! The way bytes travel on each path, stage by stage (application → syscalls and kernel
//! copies → NIC → switch → NIC → kernel → application), each stage annotated with what
//! the run measured there and its provenance; stages a path skips are marked skipped.

use serde::Serialize;

use iblab_core::evidence::{Evidence, ProvenanceKind, StepRecord, Verdict};
use iblab_lab::PathKind;
use iblab_lab::names;

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

/// A path's traffic instances that measured something (passed, or failed with figures:
/// a collapse measures 0).
fn traffic(e: &Evidence, p: PathKind) -> Vec<&StepRecord> {
    e.steps
        .iter()
        .filter(|s| {
            s.path == Some(p)
                && s.kind == "traffic"
                && matches!(s.verdict, Verdict::Pass | Verdict::Fail)
        })
        .collect()
}

/// A figure of a path for a stage: from the last passing measurement that has it (a
/// bandwidth test's CPU is not a latency test's), with its provenance.
fn metric(steps: &[&StepRecord], name: &str) -> Option<String> {
    steps
        .iter()
        .rev()
        .filter(|s| s.verdict == Verdict::Pass)
        .find_map(|s| shown_metric(s, name))
}

/// Every measurement of a figure on a path, by step: `clean 130 Mbit/s (soft) · congested
/// 0 Mbit/s (soft, failed, 0% retained)`, so a collapse is not hidden behind the clean
/// figure; `kept` gives a measurement's retention where it has one.
fn every(
    steps: &[&StepRecord],
    name: &str,
    kept: &dyn Fn(&StepRecord) -> Option<String>,
) -> Option<String> {
    let all: Vec<String> = steps
        .iter()
        .filter_map(|s| {
            let shown = shown_metric(s, name)?;
            let failed = if s.verdict == Verdict::Fail {
                ", failed"
            } else {
                ""
            };
            let kept = kept(s).map_or(String::new(), |k| format!(", {k}"));
            let shown = shown.replacen(')', &format!("{failed}{kept})"), 1);
            Some(if steps.len() > 1 {
                format!("{} {shown}", s.id)
            } else {
                shown
            })
        })
        .collect();
    (!all.is_empty()).then(|| all.join(" · "))
}

/// What the last port probe of path ③ saw on a node's HCA, from the run's own facts.
fn hca_port(e: &Evidence) -> String {
    let probed = e.steps.iter().rev().find_map(|s| {
        s.detail["facts"]["ports"]
            .as_object()
            .filter(|p| !p.is_empty())
            .map(|p| (s.id.as_str(), p))
    });
    let Some((id, ports)) = probed else {
        return "port state not probed in this run".into();
    };
    let states: Vec<String> = ports
        .iter()
        .map(|(node, p)| {
            let state = p["state"].as_str().unwrap_or("?");
            match p["lid"].as_u64() {
                Some(0) | None => format!("{node}: {state}, no LID (nobody assigned one)"),
                Some(lid) => format!("{node}: {state}, LID {lid} from the SM"),
            }
        })
        .collect();
    format!("{} (probe `{id}`, emulated)", states.join("; "))
}

fn shown_metric(s: &StepRecord, name: &str) -> Option<String> {
    let m = s.metrics.get(name)?;
    let prov = s
        .provenance
        .as_ref()
        .map(|p| p.kind)
        .unwrap_or(ProvenanceKind::Modelled);
    Some(format!(
        "{} {} ({})",
        crate::terminal::fmt_num(m.value),
        m.unit,
        format!("{prov:?}").to_lowercase()
    ))
}

/// What the passive side's process spent while its memory was written: its CPU time over
/// the data phase of the last passing bandwidth measurement, with provenance.
fn passive_cpu(steps: &[&StepRecord]) -> String {
    let side = |s: &StepRecord, suffix: &str| {
        s.metrics
            .get(&names::counter("receiver", suffix))
            .map(|m| m.value)
    };
    let found = steps
        .iter()
        .rev()
        .filter(|s| s.verdict == Verdict::Pass)
        .find_map(|s| {
            let cpu = side(s, "cpu_user_s")? + side(s, "cpu_system_s")?;
            Some((s, cpu, side(s, "data_phase_s")))
        });
    let Some((s, cpu, phase)) = found else {
        return "the passive side's CPU not measured in this run".into();
    };
    if s.detail["exchange"]
        .as_str()
        .is_some_and(|x| x.starts_with("RDMA CM"))
    {
        return format!(
            "the passive side's CPU time ({} s) is perftest's own polling in its RDMA CM mode, not the transfer's (a step with `exchange: tcp` measures it)",
            crate::terminal::fmt_num(cpu)
        );
    }
    let prov = s
        .provenance
        .as_ref()
        .map(|p| p.kind)
        .unwrap_or(ProvenanceKind::Modelled);
    let during = phase.map_or(String::new(), |p| {
        format!(" in the {} s transfer", crate::terminal::fmt_num(p))
    });
    let soft = if prov == ProvenanceKind::Hardware {
        ""
    } else {
        "; rxe's transport work runs in the node's kernel, charged to no process"
    };
    format!(
        "the passive side's process got {} s of CPU{during} ({}{soft})",
        crate::terminal::fmt_num(cpu),
        format!("{prov:?}").to_lowercase()
    )
}

/// What the last `learned` probe on a path saw on the bridges: which hosts each learned by
/// itself, from the run's own facts.
fn learned(e: &Evidence, p: PathKind) -> String {
    let probed = e.steps.iter().rev().find(|s| {
        s.kind == "probe"
            && s.verdict == Verdict::Pass
            && s.detail["facts"]["nodes_learned"].is_array()
            && (s.path.is_none() || s.path == Some(p))
            && s.detail["facts"]["switches"].is_object()
    });
    let Some(s) = probed.filter(|_| e.paths.contains(&p)) else {
        return "not probed in this run".into();
    };
    let switches: Vec<String> = s.detail["facts"]["switches"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(sw, f)| {
            let nodes: Vec<&str> = f["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str())
                .collect();
            if nodes.is_empty() {
                format!("{sw} learned no host")
            } else {
                format!("{sw} learned {} by itself", nodes.join(", "))
            }
        })
        .collect();
    format!("{} (probe `{}`, soft)", switches.join("; "), s.id)
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "not measured in this run".into())
}

/// The three paths' stages for a run.
pub fn paths(e: &Evidence) -> Vec<PathStages> {
    PathKind::ALL
        .into_iter()
        .map(|p| {
            let graphs = super::graphs::Run {
                paths: &e.paths,
                excluded: &e.excluded_paths,
                steps: &e.steps,
                running: false,
            };
            let status = if let super::graphs::Status::Failed(why) =
                super::graphs::status(&graphs, p)
            {
                // It ran and carried nothing (refused, no SM): drawn as not carrying.
                format!("carried nothing: {}", super::graphs::one_line(&why))
            } else if e.paths.contains(&p) {
                "run".to_string()
            } else if let Some(why) = e.excluded_paths.get(&p) {
                format!("not run: {why}")
            } else {
                "not part of this lab".to_string()
            };
            let t = &traffic(e, p)[..];
            let kept = |s: &StepRecord| {
                super::retention::of(e, &s.id, p)
                    .map(|r| format!("{:.0}% retained {}", r.share * 100.0, r.of()))
            };
            // Every backend links its nodes in software (veth, virtio-net, …); an evidence
            // file that does not say how is taken as a real NIC.
            let nic = (!e.nic.is_empty()).then_some(e.nic.as_str());
            let stages = match p {
                PathKind::Tcp => vec![
                    stage("application", Role::Active, "send(buf) / recv(buf)".into()),
                    stage("syscalls", Role::Active, format!("a syscall per send and per recv · sender CPU {}", or_dash(metric(t, names::SENDER_CPU_PCT)))),
                    stage("kernel TCP/IP", Role::Active, format!("copies the payload; retransmits {}", or_dash(metric(t, names::RETRANSMITS)))),
                    stage("NIC", Role::Active, nic.map_or("Ethernet NIC".into(), |n| format!("{n}: no NIC (soft)"))),
                    stage("Ethernet switch", Role::Active, format!("floods, then learns MACs: {}", learned(e, p))),
                    stage("NIC", Role::Active, nic.map_or("Ethernet NIC".into(), |n| format!("{n} (soft)"))),
                    stage("kernel TCP/IP", Role::Active, format!("copies again; receiver CPU {}", or_dash(metric(t, names::RECEIVER_CPU_PCT)))),
                    stage("application", Role::Active, format!("throughput {}", or_dash(every(t, names::THROUGHPUT_MBPS, &kept)))),
                ],
                PathKind::Roce => vec![
                    stage("application", Role::Active, "ibv_post_send on registered memory".into()),
                    stage("verbs", Role::Active, "no syscall on the data path with an HCA; rxe (soft) rings its doorbell with write()".into()),
                    stage("kernel", Role::Skipped, "kernel bypass on hardware; with rxe (soft) the kernel does the transport".into()),
                    stage("RoCE NIC", Role::Active, "IB transport in UDP/IP, port 4791".into()),
                    stage("Ethernet switch", Role::Active, format!("lossless only if PFC/ECN are configured; floods, then learns MACs: {}", learned(e, p))),
                    stage("RoCE NIC", Role::Active, "DMA into the peer's registered memory".into()),
                    stage("peer CPU", Role::Skipped, format!("not involved in one-sided WRITE/READ: {}", passive_cpu(t))),
                    stage("application", Role::Active, format!("throughput {}", or_dash(every(t, names::THROUGHPUT_MBPS, &kept)))),
                ],
                PathKind::Ib => vec![
                    stage("application", Role::Active, "the very same verbs as ②".into()),
                    stage("verbs", Role::Active, "no syscall on the data path".into()),
                    stage("kernel", Role::Skipped, "kernel bypass".into()),
                    stage("HCA", Role::Active, hca_port(e)),
                    stage("IB switch", Role::Active, format!("forwards by the LFT the SM wrote; credit-based, no congestion drops · switches crossed {}", or_dash(metric(t, names::SWITCHES_CROSSED)))),
                    stage("HCA", Role::Active, format!("delivered {}", or_dash(metric(t, names::DELIVERED)))),
                    stage("peer CPU", Role::Skipped, format!("not involved in one-sided WRITE/READ: {}", passive_cpu(t))),
                    stage("application", Role::Active, format!("throughput {}", or_dash(every(t, names::THROUGHPUT_MBPS, &kept)))),
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
        let mut e: Evidence = serde_json::from_str(include_str!(
            "../../../tests/fixtures/evidence/tcp-loss.json"
        ))
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

    fn fixture() -> Evidence {
        serde_json::from_str(include_str!(
            "../../../tests/fixtures/evidence/tcp-loss.json"
        ))
        .unwrap()
    }

    fn notes(e: &Evidence, p: PathKind) -> Vec<(String, String)> {
        paths(e)
            .into_iter()
            .find(|x| x.path == p)
            .unwrap()
            .stages
            .into_iter()
            .map(|s| (s.label, s.note))
            .collect()
    }

    /// Annotations come from what the run measured: every throughput of the path (a
    /// collapse is not hidden behind the clean figure), and the sender's CPU from the
    /// bandwidth test even when a latency test came last.
    #[test]
    fn stages_show_what_this_run_measured() {
        let mut e = fixture();
        let n = notes(&e, PathKind::Tcp);
        let app = &n.last().unwrap().1;
        assert!(app.contains("clean") && app.contains("lossy"), "{app}");
        assert!(app.contains("% retained of clean"), "{app}");
        assert!(!n.iter().any(|(_, t)| t.contains("not measured")), "{n:?}");
        // A later step without CPU figures does not hide the earlier ones.
        let mut latency = e
            .steps
            .iter()
            .find(|s| s.kind == "traffic")
            .unwrap()
            .clone();
        latency.id = "latency".into();
        latency.metrics.clear();
        e.steps.push(latency);
        let n = notes(&e, PathKind::Tcp);
        assert!(
            n[1].1.contains("sender CPU") && !n[1].1.contains("not measured"),
            "{n:?}"
        );
        // A failed (collapsed) measurement says so.
        let lossy = e.steps.iter_mut().find(|s| s.id == "lossy").unwrap();
        lossy.verdict = Verdict::Fail;
        let app = notes(&e, PathKind::Tcp).last().unwrap().1.clone();
        assert!(app.contains("failed"), "{app}");
    }

    /// The peer-CPU stage of ② reads the passive side's CPU time from the run.
    #[test]
    fn the_peer_cpu_stage_reads_the_passive_side() {
        let mut e = fixture();
        let peer = |e: &Evidence| notes(e, PathKind::Roce)[6].1.clone();
        assert!(peer(&e).contains("not measured"), "{}", peer(&e));
        let mut bw = e
            .steps
            .iter()
            .find(|s| s.kind == "traffic")
            .unwrap()
            .clone();
        bw.path = Some(PathKind::Roce);
        for (k, v) in [
            ("receiver_cpu_user_s", 0.0),
            ("receiver_cpu_system_s", 0.01),
            ("receiver_data_phase_s", 2.5),
        ] {
            bw.metrics
                .insert(k.into(), iblab_core::evidence::Metric::new(v, "s"));
        }
        e.steps.push(bw);
        let note = peer(&e);
        assert!(
            note.contains("0.010 s of CPU in the 2.50 s transfer") && note.contains("soft"),
            "{note}"
        );
        // A passive side that polled (perftest -R) is not shown as the transfer's CPU.
        let last = e.steps.last_mut().unwrap();
        last.detail = serde_json::json!({"exchange": "RDMA CM (-R): the passive side busy-polls"});
        let note = peer(&e);
        assert!(
            note.contains("polling") && !note.contains("of CPU in the"),
            "{note}"
        );
    }

    /// The Ethernet switch stage tells what the bridge learned, when a probe looked.
    #[test]
    fn the_switch_stage_reads_what_the_bridge_learned() {
        let mut e = fixture();
        let sw = |e: &Evidence| notes(e, PathKind::Tcp)[4].1.clone();
        assert!(sw(&e).contains("not probed"), "{}", sw(&e));
        let mut probe = e.steps[0].clone();
        probe.id = "learned".into();
        probe.kind = "probe".into();
        probe.verdict = Verdict::Pass;
        probe.detail = serde_json::json!({"facts": {
            "switches": {"sw1": {"nodes": ["a", "b"], "learned": []}},
            "nodes_learned": ["a", "b"],
        }});
        e.steps.push(probe);
        let note = sw(&e);
        assert!(note.contains("sw1 learned a, b by itself"), "{note}");
    }

    /// ③'s HCA stage tells what the port probe saw: INIT and no LID without an SM.
    #[test]
    fn the_hca_stage_reads_the_port_probe() {
        let mut e = fixture();
        assert!(notes(&e, PathKind::Ib)[3].1.contains("not probed"));
        let mut probe = e.steps[0].clone();
        probe.id = "ports".into();
        probe.detail =
            serde_json::json!({"facts": {"ports": {"a": {"state": "Initialize", "lid": 0}}}});
        e.steps.push(probe);
        let hca = notes(&e, PathKind::Ib)[3].1.clone();
        assert!(
            hca.contains("Initialize") && hca.contains("no LID"),
            "{hca}"
        );
        assert!(!hca.contains("ACTIVE"), "{hca}");
    }
}
