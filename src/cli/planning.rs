//! From a lab to a concrete plan for this host: what `plan`, `up`, `doctor LAB` and
//! `render` start from.

use super::{Selection, exit, load_or_report};
use iblab_core::caps::HostCaps;
use iblab_core::plan::{Plan, PlanError, Request};
use iblab_lab::PathKind;

/// Load the lab and plan it against a snapshot of this host, taken here: planning itself
/// reads nothing. Soft-RoCE's preflight joins the snapshot only when the lab uses roce.
/// `run`: the id of the run the plan is for (`up`), `None` for a plan only.
pub(super) fn make_plan(
    sel: &Selection,
    caps: &mut HostCaps,
    colour: bool,
    run: Option<&str>,
) -> Result<Plan, i32> {
    if let Some(why) = crate::homes::left_out(&sel.backend) {
        eprintln!("error: {why}");
        return Err(exit::ENVIRONMENT);
    }
    let loaded = load_or_report(&sel.lab, colour)?;
    if loaded.lab.spec.paths.contains(&PathKind::Roce) && caps.preflight.is_empty() {
        *caps = crate::homes::with_preflight(caps.clone(), &sel.backend);
    }
    let req = Request {
        scenario: sel.scenario.clone(),
        backend: sel.backend.clone(),
        paths: sel.paths.clone(),
        hca: sel.hca.clone(),
        run: run.map(str::to_string),
        lang: super::lang(),
    };
    let plan = iblab_core::plan::plan(&loaded, &req, caps, &crate::homes::homes()).map_err(
        |e| match e {
            PlanError::BadInput(m) => {
                eprintln!("error: {m}");
                exit::BAD_INPUT
            }
            PlanError::Environment(m) => {
                eprintln!("error: {m}");
                exit::ENVIRONMENT
            }
        },
    )?;
    #[cfg(feature = "kube")]
    check_placement(&plan)?;
    Ok(plan)
}

#[cfg(feature = "kube")]
/// `--place` names lab nodes of this plan, and only the kube backend places pods.
fn check_placement(plan: &Plan) -> Result<(), i32> {
    let placement = iblab_k8s::settings::get().placement;
    if placement.is_empty() {
        return Ok(());
    }
    if plan.backend != "kube" {
        eprintln!(
            "error: --place puts lab nodes' pods on cluster nodes, which only the kube backend \
             has (this plan is for the {} backend)\n  fix: add --backend kube, or leave --place \
             (and IBLAB_KUBE_PLACE) out",
            plan.backend
        );
        return Err(exit::BAD_INPUT);
    }
    let hosts: Vec<&str> = plan
        .nodes
        .iter()
        .filter(|n| !n.switch)
        .map(|n| n.name.as_str())
        .collect();
    let switches: Vec<&str> = plan
        .nodes
        .iter()
        .filter(|n| n.switch)
        .map(|n| n.name.as_str())
        .collect();
    for node in placement.keys() {
        if !hosts.contains(&node.as_str()) && !switches.contains(&node.as_str()) {
            eprintln!(
                "error: --place {node}=…: lab {} has no node or switch `{node}`\n  fix: place \
                 one of {}",
                plan.lab,
                hosts
                    .iter()
                    .chain(switches.iter())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return Err(exit::BAD_INPUT);
        }
    }
    Ok(())
}
