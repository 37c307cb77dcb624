//! The way bytes travel on each path, stage by stage (application → syscalls and kernel
//! copies → NIC → switch → NIC → kernel → application), each stage annotated with what
//! the run measured there and its provenance; stages a path skips are marked skipped. In
//! the evidence's language.

use rust_i18n::t;
use serde::Serialize;

use iblab_core::evidence::detail::Exchange;
use iblab_core::evidence::{Evidence, ProvenanceKind, StepRecord, Verdict};
use iblab_lab::names;
use iblab_lab::{Lang, PathKind, StepKind};

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
    /// Whether the path ran: `run`, `carried_nothing` (it ran, no transfer carried a byte:
    /// drawn faded, the reason in `status`), `excluded` (with reason in `status`) or
    /// `absent`.
    pub state: &'static str,
    /// Run, left out (with reason), or absent from the lab, in words.
    pub status: String,
    pub stages: Vec<Stage>,
}

/// The words of `key` in `lang`.
fn w(key: &str, lang: Lang) -> String {
    t!(key, locale = lang.tag()).into_owned()
}

fn stage(label: &str, role: Role, note: String, lang: Lang) -> Stage {
    Stage {
        label: w(&format!("stage.{label}"), lang),
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
                && s.kind == StepKind::Traffic
                && matches!(s.verdict, Verdict::Pass | Verdict::Fail)
        })
        .collect()
}

/// A figure of a path for a stage: from the last passing measurement that has it (a
/// bandwidth test's CPU is not a latency test's), with its provenance.
fn metric(steps: &[&StepRecord], name: &str, lang: Lang) -> Option<String> {
    steps
        .iter()
        .rev()
        .filter(|s| s.verdict == Verdict::Pass)
        .find_map(|s| shown_metric(s, name, lang))
}

/// Every measurement of a figure on a path, by step: `clean 130 Mbit/s (soft) · congested
/// 0 Mbit/s (soft, failed, 0% retained)`, so a collapse is not hidden behind the clean
/// figure; `kept` gives a measurement's retention where it has one.
fn every(
    steps: &[&StepRecord],
    name: &str,
    kept: &dyn Fn(&StepRecord) -> Option<String>,
    lang: Lang,
) -> Option<String> {
    let sep = if lang == Lang::ZhCn { "，" } else { ", " };
    let all: Vec<String> = steps
        .iter()
        .filter_map(|s| {
            let shown = shown_metric(s, name, lang)?;
            let failed = if s.verdict == Verdict::Fail {
                format!("{sep}{}", w("stages.failed", lang))
            } else {
                String::new()
            };
            let kept = kept(s).map_or(String::new(), |k| format!("{sep}{k}"));
            let shown = match shown.rfind(')') {
                Some(i) => format!("{}{failed}{kept}{}", &shown[..i], &shown[i..]),
                None => shown,
            };
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
fn hca_port(e: &Evidence, lang: Lang) -> String {
    let l = lang.tag();
    let probed = e.steps.iter().rev().find_map(|s| {
        s.ports()
            .filter(|p| !p.is_empty())
            .map(|p| (s.id.as_str(), p))
    });
    let Some((id, ports)) = probed else {
        return w("stages.port_not_probed", lang);
    };
    let states: Vec<String> = ports
        .iter()
        .map(|(node, p)| match p.lid {
            0 => t!(
                "stages.port_no_lid",
                locale = l,
                node = node,
                state = p.state
            )
            .into_owned(),
            lid => t!(
                "stages.port_lid",
                locale = l,
                node = node,
                state = p.state,
                lid = lid
            )
            .into_owned(),
        })
        .collect();
    t!(
        "stages.probed",
        locale = l,
        what = states.join("; "),
        probe = id,
        prov = ProvenanceKind::Emulated.word(lang)
    )
    .into_owned()
}

fn shown_metric(s: &StepRecord, name: &str, lang: Lang) -> Option<String> {
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
        prov.word(lang)
    ))
}

/// What the passive side's process spent while its memory was written: its CPU time over
/// the data phase of the last passing bandwidth measurement, with provenance.
fn passive_cpu(steps: &[&StepRecord], lang: Lang) -> String {
    let l = lang.tag();
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
        return w("stages.passive_not_measured", lang);
    };
    let cpu = crate::terminal::fmt_num(cpu);
    if s.exchange().is_some_and(Exchange::polls) {
        return t!("stages.passive_polls", locale = l, cpu = cpu).into_owned();
    }
    let prov = s
        .provenance
        .as_ref()
        .map(|p| p.kind)
        .unwrap_or(ProvenanceKind::Modelled);
    let soft = if prov == ProvenanceKind::Hardware {
        String::new()
    } else {
        w("stages.passive_soft", lang)
    };
    match phase {
        Some(p) => t!(
            "stages.passive_cpu_in",
            locale = l,
            cpu = cpu,
            phase = crate::terminal::fmt_num(p),
            prov = prov.word(lang),
            soft = soft
        )
        .into_owned(),
        None => t!(
            "stages.passive_cpu",
            locale = l,
            cpu = cpu,
            prov = prov.word(lang),
            soft = soft
        )
        .into_owned(),
    }
}

/// What the last `learned` probe on a path saw on the bridges: which hosts each learned by
/// itself, from the run's own facts.
fn learned(e: &Evidence, p: PathKind, lang: Lang) -> String {
    let l = lang.tag();
    let probed = e.steps.iter().rev().find_map(|s| {
        let facts = s.learned()?;
        (s.kind == StepKind::Probe
            && s.verdict == Verdict::Pass
            && (s.path.is_none() || s.path == Some(p)))
        .then_some((s, facts))
    });
    let Some((s, facts)) = probed.filter(|_| e.paths.contains(&p)) else {
        return w("stages.not_probed", lang);
    };
    let switches: Vec<String> = facts
        .switches
        .iter()
        .map(|(sw, f)| {
            let nodes: Vec<&str> = f.nodes.iter().map(String::as_str).collect();
            if nodes.is_empty() {
                t!("stages.learned_none", locale = l, switch = sw).into_owned()
            } else {
                t!(
                    "stages.learned",
                    locale = l,
                    switch = sw,
                    nodes = nodes.join(", ")
                )
                .into_owned()
            }
        })
        .collect();
    t!(
        "stages.probed",
        locale = l,
        what = switches.join("; "),
        probe = s.id,
        prov = ProvenanceKind::Soft.word(lang)
    )
    .into_owned()
}

fn or_dash(v: Option<String>, lang: Lang) -> String {
    v.unwrap_or_else(|| w("stages.not_measured", lang))
}

/// The three paths' stages for a run, in the evidence's language.
pub fn paths(e: &Evidence) -> Vec<PathStages> {
    PathKind::ALL
        .into_iter()
        .map(|p| {
            let (state, status) = path_state(e, p);
            let t = &traffic(e, p)[..];
            let stages = match p {
                PathKind::Tcp => tcp_stages(e, t),
                PathKind::Roce => roce_stages(e, t),
                PathKind::Ib => ib_stages(e, t),
            };
            PathStages {
                path: p,
                mark: p.mark(),
                state,
                status,
                stages,
            }
        })
        .collect()
}

/// Whether a path ran, and in words: run, ran and carried nothing (why), left out (why),
/// or absent from the lab.
fn path_state(e: &Evidence, p: PathKind) -> (&'static str, String) {
    let lang = e.lang;
    let l = lang.tag();
    let graphs = super::graphs::Run {
        paths: &e.paths,
        excluded: &e.excluded_paths,
        steps: &e.steps,
        running: false,
    };
    if let super::graphs::Status::Failed(why) = super::graphs::status(&graphs, p) {
        // It ran and carried nothing (refused, no SM): drawn as not carrying.
        (
            "carried_nothing",
            t!(
                "stages.carried_nothing",
                locale = l,
                why = super::graphs::one_line(&why)
            )
            .into_owned(),
        )
    } else if e.paths.contains(&p) {
        ("run", w("stages.run", lang))
    } else if let Some(why) = e.excluded_paths.get(&p) {
        (
            "excluded",
            t!(
                "stages.not_run",
                locale = l,
                why = iblab_core::evidence::judge::reason(why, lang)
            )
            .into_owned(),
        )
    } else {
        ("absent", w("stages.absent", lang))
    }
}

/// The last stage of every path: the throughput the application saw, each figure with
/// what it kept of its reference under a fault.
fn throughput(e: &Evidence, t: &[&StepRecord]) -> String {
    let lang = e.lang;
    let l = lang.tag();
    let kept = |s: &StepRecord| {
        let p = s.path?;
        super::retention::of(e, &s.id, p).map(|r| {
            t!(
                "retention.kept",
                locale = l,
                share = format!("{:.0}", r.share * 100.0),
                of = r.of_in(lang)
            )
            .into_owned()
        })
    };
    t!(
        "stages.throughput",
        locale = l,
        figures = or_dash(every(t, names::THROUGHPUT_MBPS, &kept, lang), lang)
    )
    .into_owned()
}

/// The peer's CPU on a verbs path: not involved in the transfer, with what it spent.
fn peer_cpu(t: &[&StepRecord], lang: Lang) -> String {
    t!(
        "stages.peer_not_involved",
        locale = lang.tag(),
        cpu = passive_cpu(t, lang)
    )
    .into_owned()
}

/// Path ①: through both kernels' TCP stacks, the NICs and the Ethernet switch.
fn tcp_stages(e: &Evidence, t: &[&StepRecord]) -> Vec<Stage> {
    let lang = e.lang;
    let l = lang.tag();
    // Every backend links its nodes in software (veth, virtio-net, …); an evidence
    // file that does not say how is taken as a real NIC.
    let nic = (!e.nic.is_empty()).then_some(e.nic.as_str());
    let soft = ProvenanceKind::Soft.word(lang);
    let nic_out = nic.map_or(w("stages.ethernet_nic", lang), |n| {
        t!("stages.no_nic", locale = l, nic = n, prov = soft).into_owned()
    });
    let nic_in = nic.map_or(w("stages.ethernet_nic", lang), |n| format!("{n} ({soft})"));
    vec![
        stage(
            "application",
            Role::Active,
            "send(buf) / recv(buf)".into(),
            lang,
        ),
        stage(
            "syscalls",
            Role::Active,
            t!(
                "stages.tcp_syscalls",
                locale = l,
                cpu = or_dash(metric(t, names::SENDER_CPU_PCT, lang), lang)
            )
            .into_owned(),
            lang,
        ),
        stage(
            "kernel_tcp",
            Role::Active,
            t!(
                "stages.tcp_copies",
                locale = l,
                retransmits = or_dash(metric(t, names::RETRANSMITS, lang), lang)
            )
            .into_owned(),
            lang,
        ),
        stage("nic", Role::Active, nic_out, lang),
        stage(
            "ethernet_switch",
            Role::Active,
            t!(
                "stages.floods",
                locale = l,
                learned = learned(e, PathKind::Tcp, lang)
            )
            .into_owned(),
            lang,
        ),
        stage("nic", Role::Active, nic_in, lang),
        stage(
            "kernel_tcp",
            Role::Active,
            t!(
                "stages.tcp_copies_again",
                locale = l,
                cpu = or_dash(metric(t, names::RECEIVER_CPU_PCT, lang), lang)
            )
            .into_owned(),
            lang,
        ),
        stage("application", Role::Active, throughput(e, t), lang),
    ]
}

/// Path ②: verbs past the kernel, RoCEv2 on the Ethernet switch.
fn roce_stages(e: &Evidence, t: &[&StepRecord]) -> Vec<Stage> {
    let lang = e.lang;
    vec![
        stage(
            "application",
            Role::Active,
            w("stages.roce_app", lang),
            lang,
        ),
        stage("verbs", Role::Active, w("stages.roce_verbs", lang), lang),
        stage("kernel", Role::Skipped, w("stages.roce_kernel", lang), lang),
        stage("roce_nic", Role::Active, w("stages.roce_wire", lang), lang),
        stage(
            "ethernet_switch",
            Role::Active,
            t!(
                "stages.roce_switch",
                locale = lang.tag(),
                learned = learned(e, PathKind::Roce, lang)
            )
            .into_owned(),
            lang,
        ),
        stage("roce_nic", Role::Active, w("stages.roce_dma", lang), lang),
        stage("peer_cpu", Role::Skipped, peer_cpu(t, lang), lang),
        stage("application", Role::Active, throughput(e, t), lang),
    ]
}

/// Path ③: verbs past the kernel, the HCAs' ports and the IB switches.
fn ib_stages(e: &Evidence, t: &[&StepRecord]) -> Vec<Stage> {
    let lang = e.lang;
    let l = lang.tag();
    vec![
        stage("application", Role::Active, w("stages.ib_app", lang), lang),
        stage("verbs", Role::Active, w("stages.ib_verbs", lang), lang),
        stage("kernel", Role::Skipped, w("stages.ib_kernel", lang), lang),
        stage("hca", Role::Active, hca_port(e, lang), lang),
        stage(
            "ib_switch",
            Role::Active,
            t!(
                "stages.ib_switch",
                locale = l,
                crossed = or_dash(metric(t, names::SWITCHES_CROSSED, lang), lang)
            )
            .into_owned(),
            lang,
        ),
        stage(
            "hca",
            Role::Active,
            t!(
                "stages.delivered",
                locale = l,
                delivered = or_dash(metric(t, names::DELIVERED, lang), lang)
            )
            .into_owned(),
            lang,
        ),
        stage("peer_cpu", Role::Skipped, peer_cpu(t, lang), lang),
        stage("application", Role::Active, throughput(e, t), lang),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic_stages(backend: &str, nic: &str) -> Vec<String> {
        let mut e: Evidence = iblab_core::testdata::evidence(iblab_core::testdata::TCP_LOSS);
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
        iblab_core::testdata::evidence(iblab_core::testdata::TCP_LOSS)
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
            .find(|s| s.kind == StepKind::Traffic)
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
            .find(|s| s.kind == StepKind::Traffic)
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
        probe.kind = StepKind::Probe;
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
