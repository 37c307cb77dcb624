//! `fault`: loss, a rate limit, an outage on a link, or clearing them (counting drops).

use serde_json::json;

use super::{StepCtx, blank};
use iblab_backend::EnvError;
use iblab_core::command::Cmd;
use iblab_core::evidence::{Metric, Provenance, ProvenanceKind, StepRecord, Verdict};
use iblab_core::fault::{self, LossMechanism, Shaping};
use iblab_core::plan::{Fault, PlannedStep};
use iblab_fabric::Fabric;
use iblab_lab::FaultAction;
use iblab_lab::names;

/// Every command a fault of this kind can run on a node, built by the builders [`run`]
/// calls (with a stand-in interface, under either loss mechanism: a guest kernel may use
/// another than the plan's). What the run's program list reads.
pub fn commands(action: FaultAction) -> Vec<Cmd> {
    let iface = "eth0";
    let shaped = |mech| {
        let s = Shaping {
            loss_percent: Some(1.0),
            rate: Some((1_000_000, 65536)),
        };
        fault::apply(iface, &s, mech)
    };
    let mechs = [
        fault::LossMechanism::Netem,
        fault::LossMechanism::NftRandomDrop,
    ];
    match action {
        FaultAction::MadErrors => vec![],
        FaultAction::Count => fault::count(iface),
        FaultAction::Down => fault::set_link(iface, false),
        FaultAction::Up => fault::set_link(iface, true),
        FaultAction::Loss | FaultAction::Rate => fault::counters(iface)
            .into_iter()
            .chain(mechs.into_iter().flat_map(shaped))
            .collect(),
        FaultAction::Clear => fault::read_count(iface)
            .into_iter()
            .chain(fault::counters(iface))
            .chain(fault::clear(iface))
            .collect(),
    }
}

pub async fn run(
    step: &PlannedStep,
    fault: &Fault,
    ctx: &mut StepCtx<'_>,
    fabrics: &[Box<dyn Fabric>],
    at: f64,
) -> Result<StepRecord, EnvError> {
    let Fault {
        link,
        action,
        targets,
        loss_percent,
        rate_bps,
        queue_bytes,
    } = fault;
    let mut rec = blank(step, at);
    let plan_mech = ctx.plan.loss_mechanism;
    let mut mechs: Vec<(&str, LossMechanism)> = Vec::new();
    let mut applied = Vec::new();
    let mut dropped = 0u64;
    let mut counted: Option<(u64, u64)> = None;
    for (node, iface) in targets {
        // A guest kernel may offer another mechanism than the host's (vm backend).
        let mech = ctx.backend.loss_mechanism(node, plan_mech);
        mechs.push((node, mech));
        let key = (node.clone(), iface.clone());
        let cmds: Vec<Cmd> = match action {
            FaultAction::MadErrors => vec![],
            FaultAction::Count => fault::count(iface),
            FaultAction::Down => fault::set_link(iface, false),
            FaultAction::Up => fault::set_link(iface, true),
            FaultAction::Loss | FaultAction::Rate => {
                super::harvest_drops(ctx, node, iface).await?;
                let s = ctx.shaping.entry(key).or_default();
                if *action == FaultAction::Loss {
                    s.loss_percent = *loss_percent;
                } else {
                    s.rate = rate_bps.map(|r| (r, queue_bytes.unwrap_or(65536)));
                }
                fault::apply(iface, s, mech)
            }
            FaultAction::Clear => {
                let rc = fault::read_count(iface);
                let listed = ctx.backend.exec(node, &rc[0], step.timeout).await?;
                if listed.success() {
                    let (roce, tcp) = fault::counts_from(&listed.stdout);
                    counted = Some((
                        counted.map(|c| c.0).unwrap_or(0) + roce,
                        counted.map(|c| c.1).unwrap_or(0) + tcp,
                    ));
                    ctx.backend.exec(node, &rc[1], step.timeout).await?;
                }
                super::harvest_drops(ctx, node, iface).await?;
                dropped += ctx.drops.remove(&key).unwrap_or(0);
                ctx.shaping.insert(key, Shaping::default());
                fault::clear(iface)
            }
        };
        for c in &cmds {
            let out = ctx.backend.exec(node, c, step.timeout).await?;
            applied.push(json!({"node": node, "command": c.argv, "exit_code": out.exit_code}));
            if !out.success() && !c.may_fail {
                rec.verdict = Verdict::Fail;
                rec.reason = Some(format!(
                    "`{}` on {node} failed: {}",
                    c.argv.join(" "),
                    out.stderr.trim()
                ));
            }
        }
    }
    // The same cable carries every path: let each fabric apply its side (ibsim Unlink, …).
    for f in fabrics {
        applied.extend(f.link_fault(link, *action, *loss_percent, ctx).await?);
    }
    if *action == FaultAction::Clear {
        if let Some((roce, tcp)) = counted {
            rec.metrics.insert(
                names::ROCEV2_PACKETS.into(),
                Metric::new(roce as f64, "packets (UDP to 4791)"),
            );
            rec.metrics.insert(
                names::TCP_PACKETS.into(),
                Metric::new(tcp as f64, "packets"),
            );
        }
        rec.metrics.insert(
            names::DROPPED_PACKETS.into(),
            Metric::new(dropped as f64, "packets"),
        );
        rec.provenance = Some(Provenance {
            kind: ProvenanceKind::Soft,
            source: "kernel drop counters (tc / nftables) on veth links".into(),
        });
    }
    rec.detail = json!({
        "link": link,
        "action": action.as_str(),
        "loss_percent": loss_percent,
        "rate_bps": rate_bps,
        "queue_bytes": queue_bytes,
        "mechanism": if *action == FaultAction::Loss { mechanisms(&mechs) } else { None },
        "commands": applied,
    });
    Ok(rec)
}

/// The loss mechanism a fault used: one, or each node's where nodes' kernels differ (pods
/// on cluster nodes of different kernels).
fn mechanisms(used: &[(&str, LossMechanism)]) -> Option<String> {
    let first = used.first()?.1;
    if used.iter().all(|(_, m)| *m == first) {
        return Some(first.describe().to_string());
    }
    Some(
        used.iter()
            .map(|(n, m)| format!("{n}: {}", m.describe()))
            .collect::<Vec<_>>()
            .join("; "),
    )
}
