//! The lab's shape as the evidence keeps it: hosts, switches, cables with their names and
//! addresses, where the subnet manager runs; and what a run adds (LIDs, faults). Drawn by
//! the report crate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::{PlannedLink, PlannedNode};
use iblab_lab::StepKind;

/// What a drawing needs to know of a lab.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Topology {
    pub nodes: Vec<TopoNode>,
    pub links: Vec<TopoLink>,
    /// Nodes that run a subnet manager of path ③.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnet_managers: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TopoNode {
    pub name: String,
    pub switch: bool,
    /// `eth0 198.18.0.1/24`, one per addressed interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TopoLink {
    pub name: String,
    /// (node, interface) at each end.
    pub ends: [(String, String); 2],
}

/// What a run adds to the drawing: LIDs the SM gave (path ③) and the faults applied.
#[derive(Debug, Clone, Default)]
pub struct Marks {
    pub lids: BTreeMap<String, u64>,
    /// link name → what was done to it (`loss 1%`, `rate 20mbit`, `down`).
    pub faults: BTreeMap<String, Vec<String>>,
}

/// The LIDs path ③'s port probes saw, the last probe winning (0: none assigned).
pub fn lids(steps: &[crate::evidence::StepRecord]) -> BTreeMap<String, u64> {
    let mut lids = BTreeMap::new();
    for s in steps {
        for (node, p) in s.ports().unwrap_or_default() {
            lids.insert(node, u64::from(p.lid));
        }
    }
    lids
}

impl Marks {
    /// What a run's evidence says: the LIDs its last port probe saw, the faults it applied.
    pub fn from_evidence(e: &crate::evidence::Evidence) -> Marks {
        let mut m = Marks {
            lids: lids(&e.steps),
            ..Marks::default()
        };
        for s in &e.steps {
            if s.kind == StepKind::Fault
                && s.verdict == crate::evidence::Verdict::Pass
                && let Some(done) = s.fault_done()
                && let Some(action) = done.action
            {
                let what = match (done.loss_percent, done.rate_bps) {
                    (Some(p), _) if action == "loss" => format!("loss {p}%"),
                    (_, Some(r)) if action == "rate" => format!("rate {:.0} Mbit/s", r / 1e6),
                    _ => action,
                };
                m.faults.entry(done.link).or_default().push(what);
            }
        }
        m
    }
}

impl Topology {
    /// The drawing of a planned run: its nodes, cables and subnet managers' nodes.
    pub fn of(plan: &crate::plan::Plan) -> Topology {
        let sms: Vec<String> = plan
            .subnet_managers
            .iter()
            .map(|s| s.node.clone())
            .collect();
        Topology::from_plan(&plan.nodes, &plan.links, &sms)
    }

    pub fn from_plan(nodes: &[PlannedNode], links: &[PlannedLink], sms: &[String]) -> Topology {
        Topology {
            nodes: nodes
                .iter()
                .map(|n| TopoNode {
                    name: n.name.clone(),
                    switch: n.switch,
                    addresses: n.addresses(),
                })
                .collect(),
            links: links
                .iter()
                .map(|l| TopoLink {
                    name: l.name.clone(),
                    ends: l.ends.clone(),
                })
                .collect(),
            subnet_managers: sms.to_vec(),
        }
    }
}
