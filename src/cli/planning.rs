//! From a lab to a concrete plan for this host: what `plan`, `up`, `doctor LAB` and
//! `render` start from.

use rust_i18n::t;

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
    if let Some(why) = crate::backends::left_out(&sel.backend) {
        eprintln!("error: {why}");
        return Err(exit::ENVIRONMENT);
    }
    let mut loaded = load_or_report(&sel.lab, colour)?;
    set_params(&mut loaded.lab, &sel.set).map_err(|e| {
        eprintln!("{e}");
        exit::BAD_INPUT
    })?;
    if loaded.lab.spec.paths.contains(&PathKind::Roce) && caps.preflight.is_empty() {
        *caps = crate::backends::with_preflight(caps.clone(), &sel.backend);
    }
    let req = Request {
        scenario: sel.scenario.clone(),
        backend: sel.backend.clone(),
        paths: sel.paths.clone(),
        hca: sel.hca.clone(),
        run: run.map(str::to_string),
        lang: super::lang(),
    };
    let plan = iblab_core::plan::plan(&loaded, &req, caps, &crate::backends::for_planning())
        .map_err(|e| match e {
            PlanError::BadInput(m) => {
                eprintln!("error: {m}");
                exit::BAD_INPUT
            }
            PlanError::Environment(m) => {
                eprintln!("error: {m}");
                exit::ENVIRONMENT
            }
        })?;
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

/// A `--set` the lab cannot take: not `KEY=VALUE`, or a key the lab does not declare.
#[derive(Debug)]
enum BadSet {
    NotKeyValue(String),
    Unknown {
        kv: String,
        lab: String,
        key: String,
        known: Vec<String>,
    },
}

impl std::fmt::Display for BadSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lang = super::lang().tag();
        let text = match self {
            BadSet::NotKeyValue(kv) => t!("set.not_key_value", locale = lang, kv = kv),
            BadSet::Unknown {
                kv,
                lab,
                key,
                known,
            } => t!(
                "set.unknown",
                locale = lang,
                kv = kv,
                lab = lab,
                key = key,
                known = if known.is_empty() {
                    t!("set.none", locale = lang).into_owned()
                } else {
                    known.join(", ")
                }
            ),
        };
        f.write_str(&text)
    }
}

impl std::error::Error for BadSet {}

/// `--set KEY=VALUE`: each names a parameter the lab declares, and its value is taken over
/// the lab's and every scenario's (a number where it reads as one, `true`/`false`, else
/// text). What it sets shows in the plan's and the evidence's `params`.
fn set_params(lab: &mut iblab_lab::Lab, set: &[String]) -> Result<(), BadSet> {
    for kv in set {
        let Some((key, value)) = kv.split_once('=') else {
            return Err(BadSet::NotKeyValue(kv.clone()));
        };
        let key = key.trim();
        if !lab.spec.params.contains_key(key) {
            return Err(BadSet::Unknown {
                kv: kv.clone(),
                lab: lab.metadata.name.clone(),
                key: key.to_string(),
                known: lab.spec.params.keys().cloned().collect(),
            });
        }
        let v = param_value(value.trim());
        lab.spec.params.insert(key.to_string(), v.clone());
        for sc in lab.spec.scenarios.values_mut() {
            if let Some(p) = sc.params.get_mut(key) {
                *p = v.clone();
            }
        }
    }
    Ok(())
}

/// A value given on the command line: an integer, a number, a boolean, else text.
fn param_value(text: &str) -> serde_json::Value {
    if let Ok(i) = text.parse::<i64>() {
        return i.into();
    }
    if let Ok(f) = text.parse::<f64>()
        && f.is_finite()
    {
        return f.into();
    }
    match text {
        "true" => true.into(),
        "false" => false.into(),
        _ => text.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_gives_a_parameter_its_value_over_the_scenarios() {
        let mut lab = iblab_lab::load::resolve("lesson5").unwrap().lab;
        set_params(&mut lab, &["rate_mbit=40".into(), "queue=2mb".into()]).unwrap();
        assert_eq!(lab.spec.params["rate_mbit"], 40);
        assert_eq!(lab.spec.params["queue"], "2mb");
        assert_eq!(
            lab.spec.scenarios["congestion-lossless"].params["queue"], "2mb",
            "over the scenario's own value"
        );
        let e = set_params(&mut lab, &["rate=40".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no parameter `rate`") && e.contains("rate_mbit"),
            "{e}"
        );
        let e = set_params(&mut lab, &["rate_mbit".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected KEY=VALUE"), "{e}");
        assert_eq!(param_value("2.5"), serde_json::json!(2.5));
        assert_eq!(param_value("true"), serde_json::json!(true));
        assert_eq!(param_value("inf"), serde_json::json!("inf"));
    }
}
